// compcntr:device -- an opened device (software or RDMA), the factory of counters.
//
// Purpose: one object per opened device; counters, QPs, memory regions and command completions
// are created from it. The device core behind it (compcntr:backend) is what every layer shares.
// Requirements: move-only. Creating objects from one device in many threads at once is allowed.
// Guarantees:
//   * open("soft") always works; open("auto") (or an empty name) picks a native RDMA device that
//     opens, else "soft"; any other name is a verbs device name, ENODEV if absent.
//   * the device outlives every object created from it: the device object's destructor
//     releases its reference and the device is freed with its last object. close(ec) is the
//     checked form: EBUSY while objects live, and the device object stays valid.
//   * create_counter: EINVAL (unknown type or node), ENOTSUP (type), ENOMEM (max_counters
//     live); a refused create changes nothing.
// Memory ordering: objects of the device hold references (relaxed increment, acq_rel release:
// the last releaser sees every holder's writes before the device is freed).
//
// Example:
//     std::error_code ec;
//     auto dev = compcntr::device::open("auto", ec);        // "soft" on a machine without RDMA
//     auto c = dev.create_counter(compcntr::counter_type::bytes, ec);
module;
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <system_error>
#include <utility>
export module compcntr:device;
import :counter;
import :counter_ref;
import :backend;
import :types;
import :error;

// The verbs QP a device wraps (rdma-core's <infiniband/verbs.h> defines it; global module).
export extern "C++" { struct ibv_qp; }

export namespace compcntr {

// Made by a device, defined by the features built on the core (compcntr:qp, compcntr:mr): the
// device only names them, so the core imports no feature.
class qp;
class memory_region;
struct verbs_qp_options;

class device {
 public:
  device() noexcept = default;
  inline device(device&& o) noexcept : core_(std::exchange(o.core_, nullptr)) {}
  inline device& operator=(device&& o) noexcept {
    if (this != &o) {
      if (core_) core_->release();
      core_ = std::exchange(o.core_, nullptr);
    }
    return *this;
  }
  device(const device&) = delete;
  device& operator=(const device&) = delete;
  ~device() {
    if (core_) core_->release();
  }

  /// Opens `name`: "soft", "auto" / "" (native if one works, else soft), or a verbs device name.
  /// On failure returns an empty device and sets ec (ENODEV: no such device).
  static device open(std::string_view name, std::error_code& ec) noexcept;
  /// Opens or creates the shared device NAME (docs/shared.md; open("shm:NAME") is
  /// open_shared(NAME, shared_create, 0600)): flags shared_create (create if absent; a stale
  /// segment, whose processes are all gone, is replaced), shared_excl (with create: EEXIST if
  /// a live segment exists); mode 0600 or 0660 (group access; 0 means 0600). Errors: EINVAL
  /// (name not [A-Za-z0-9._-]{1,200}, unknown flag, bad mode), ENOENT (absent, no create),
  /// EEXIST, EACCES (another user's segment), EBADMSG (corrupt or truncated segment), EUSERS
  /// (its process table is full of live processes), ENOMEM, and the errno of shm_open/mmap.
  static device open_shared(std::string_view name, std::uint32_t flags, std::uint32_t mode,
                            std::error_code& ec) noexcept;
  /// Opens a device served by a backend built outside the library (tests' fake devices, out-of-
  /// tree backends). Takes ownership of `be`; the pool capacity follows COMPCNTR_MAX_COUNTERS.
  /// On failure returns an empty device and sets ec (EINVAL: `be` is null).
  static device from_backend(std::unique_ptr<plugin::backend> be, std::error_code& ec) noexcept;

  inline explicit operator bool() const noexcept { return core_ != nullptr; }
  inline std::string_view name() const noexcept { return core_->be().name(); }
  /// max_value, max_counters and supported_qp_attach_ops of this device.
  counter_caps caps() const noexcept;

  /// Creates a counter; on failure returns an empty counter and sets ec:
  /// EINVAL (unknown type, numa_node that does not exist), ENOTSUP (type not supported by the
  /// device), ENOMEM (max_counters live counters already).
  counter create_counter(const counter_options& opts, std::error_code& ec) noexcept;
  inline counter create_counter(counter_type type, std::error_code& ec) noexcept {
    return create_counter(counter_options{.type = type}, ec);
  }

  /// The live counter `h` names (counter::id()), as a counted reference that keeps it alive
  /// (race semantics: compcntr:counter_ref). On failure an empty ref and ec: ESTALE (the
  /// id's counter was destroyed, even if its slot now holds another counter), EINVAL (`h`
  /// names no slot of this device). On a shared device `h` is a shared counter's id from any
  /// process: ENOENT (no live counter: never created, destroyed, or its creator died), ESTALE
  /// (the id's generation is gone: its cell was freed).
  inline counter_ref resolve(counter_id h, std::error_code& ec) const noexcept {
    if (core_->shared() != nullptr) [[unlikely]]
      return counter_ref(detail::resolve_shared_slot(*core_, h, ec));
    return counter_ref(detail::resolve_counter_slot(core_->pool(), h, ec));
  }

  /// A new QP in RESET (software device). ENOTSUP on a verbs device (wrap your own ibv_qp with
  /// wrap_verbs_qp), ENOMEM.
  qp create_qp(std::error_code& ec) noexcept;
  /// Registers [addr, addr+length) with compcntr::access bits (software device). EINVAL: addr
  /// NULL, length 0, range wrapping the address space, unknown access bits, or remote_write
  /// without local_write (verbs rule). ENOTSUP on a verbs device.
  memory_region reg_mr(void* addr, std::size_t length, std::uint32_t access,
                       std::error_code& ec) noexcept;
  /// Counts the application's own ibv_qp with this device's counters (docs/verbs.md): native
  /// hardware attach where the device has native counters (the QP must belong to this device's
  /// context), else emulation by draining opts.send_cq/recv_cq in progress() (any device,
  /// including "soft"). The qp wrapper does not own the ibv_qp. EINVAL: NULL ibv_qp, comp_mask
  /// != 0, no send_cq for emulation, QP of another context.
  qp wrap_verbs_qp(ibv_qp* vqp, const verbs_qp_options& opts, std::error_code& ec) noexcept;

  /// Drains this device's pending completions that no compcntr call delivers by itself (the
  /// CQs of wrapped verbs QPs under emulation) into their counters; returns how many were
  /// consumed. Cheap (one relaxed load, returns 0) on a device with nothing to drain, such as
  /// the software device whose completions happen inside the posting calls. Thread-safe; a
  /// thread that finds another one progressing returns 0 at once.
  inline std::size_t progress() noexcept { return core_->progress(); }

  /// Shared devices: reclaims what dead processes held in the segment (docs/shared.md, "Peer
  /// death"); returns how many dead processes were found. Runs by itself on open and every
  /// second in sleeping waits. EINVAL (0) on a private device.
  inline std::uint32_t sweep(std::error_code& ec) noexcept {
    std::uint32_t n = 0;
    ec = detail::sweep_shared(*core_, n);
    return n;
  }

  /// Closes the device now: EBUSY (and nothing changes) while objects of it live.
  void close(std::error_code& ec) noexcept;

  /// Live counters of this device.
  inline std::uint32_t live_counters() const noexcept { return core_->pool().live(); }

  inline detail::device_core* core() const noexcept { return core_; }

 private:
  inline explicit device(detail::device_core* c) noexcept : core_(c) {}
  counter create_counter_general(const counter_options& opts, std::error_code& ec) noexcept;
  detail::device_core* core_ = nullptr;
};

/// device::progress() of the device that feeds `c`: the entry point for waiters and pollers
/// that must drive emulated completions while they spin. 0 and cheap when that device needs no
/// progress. `c` must not be empty.
inline std::size_t progress(counter_view c) noexcept { return c.native_slot()->dev->progress(); }

} // namespace compcntr
