// compcntr:mr -- registered memory: the buffers a QP may read and write.
//
// Purpose: a memory region names [addr, addr + length) of the application's memory with two
// keys, as in verbs: the lkey lets this side's work requests use the buffer (send source, receive
// target, RDMA-read target), the rkey lets the peer's RDMA writes and reads reach it.
//
// Requirements: created by compcntr::device::reg_mr (software device; a verbs device answers
// ENOTSUP: register with ibv_reg_mr on your own protection domain). Move-only; an empty region
// (default-constructed or moved from) may only be destroyed, assigned or tested with bool.
// The buffer must stay valid until the region is deregistered.
// Guarantees:
//   * access rights are enforced on every operation: a receive or RDMA-read target needs
//     access::local_write, an incoming RDMA write needs access::remote_write, an incoming RDMA
//     read needs access::remote_read. A violation completes the operation in error and moves no
//     byte (see compcntr:qp).
//   * keys are never 0; lkey != rkey (an lkey passed as an rkey or the reverse is a key error).
//   * deregistration waits for a copy in progress from or into the region, so once dereg()
//     returns no compcntr call touches the buffer again. A receive still posted on a region that
//     was deregistered completes in error when a send reaches it.
//   * the region holds a reference to its device (close is EBUSY while it lives).
//   * regions may be registered and deregistered from any thread, concurrently with traffic on
//     any QP.
// Memory ordering: deregistration takes the device's registration lock exclusively, copies take
// it shared, so a copy either finished before dereg() returns or never starts.
//
// Example:
//     std::vector<char> buf(4096);
//     auto mr = dev.reg_mr(buf.data(), buf.size(),
//                          compcntr::access::local_write | compcntr::access::remote_write, ec);
//     qp.post_recv(1, buf.data(), buf.size(), mr.lkey(), ec);
module;
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <system_error>
#include <utility>
export module compcntr:mr;
import :backend;
import :error;

export namespace compcntr {

/// Access rights of a memory region (verbs IBV_ACCESS_*; same values as COMPCNTR_ACCESS_*).
namespace access {
inline constexpr std::uint32_t local_write = 1u << 0;   ///< receive / RDMA-read target
inline constexpr std::uint32_t remote_write = 1u << 1;  ///< target of the peer's RDMA writes
inline constexpr std::uint32_t remote_read = 1u << 2;   ///< source of the peer's RDMA reads
inline constexpr std::uint32_t all = local_write | remote_write | remote_read;
} // namespace access

} // namespace compcntr

namespace compcntr::detail {

/// A registration as the backend keeps it. Internal: use compcntr::memory_region.
class mr_impl {
 public:
  void* addr = nullptr;
  std::size_t length = 0;
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  std::uint32_t access = 0;

  /// Removes the registration (waiting for copies in progress), releases the device, frees this.
  virtual void dereg() noexcept = 0;

 protected:
  mr_impl() = default;
  virtual ~mr_impl() = default;
};

} // namespace compcntr::detail

export namespace compcntr {

class device;

class memory_region {
 public:
  memory_region() noexcept = default;
  inline memory_region(memory_region&& o) noexcept : m_(std::exchange(o.m_, nullptr)) {}
  inline memory_region& operator=(memory_region&& o) noexcept {
    if (this != &o) {
      reset();
      m_ = std::exchange(o.m_, nullptr);
    }
    return *this;
  }
  memory_region(const memory_region&) = delete;
  memory_region& operator=(const memory_region&) = delete;
  ~memory_region() { reset(); }

  inline explicit operator bool() const noexcept { return m_ != nullptr; }
  inline void* addr() const noexcept { return m_->addr; }
  inline std::size_t length() const noexcept { return m_->length; }
  inline std::uint32_t lkey() const noexcept { return m_->lkey; }
  inline std::uint32_t rkey() const noexcept { return m_->rkey; }
  inline std::uint32_t access() const noexcept { return m_->access; }

  /// Deregisters now (always succeeds on a non-empty region; EINVAL on an empty one).
  inline void dereg(std::error_code& ec) noexcept {
    if (!m_) {
      detail::fail_into(ec, EINVAL, "dereg_mr: memory region is empty");
      return;
    }
    reset();
    ec.clear();
  }
  /// Deregisters if non-empty.
  inline void reset() noexcept {
    if (detail::mr_impl* m = std::exchange(m_, nullptr)) m->dereg();
  }

 private:
  friend class device;
  inline explicit memory_region(detail::mr_impl* m) noexcept : m_(m) {}
  detail::mr_impl* m_ = nullptr;
};

} // namespace compcntr
