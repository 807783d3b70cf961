// compcntr:qp -- queue pairs, and attaching counters to them (where completions come from).
//
// Purpose: a QP is where work requests complete; counters attached to it count those
// completions, per operation type. Two kinds: software loopback QPs (device "soft",
// device::create_qp) that really move bytes between registered buffers and really complete or
// fail; and wrapped verbs QPs (device::wrap_verbs_qp), the application's own ibv_qp, counted
// natively (rdma-core 65+) or by draining its CQ in device progress (docs/verbs.md). Full rules,
// including the loopback data path table: docs/qp.md.
//
// Requirements: attach only in RESET or INIT; a counter of the QP's device. Any QP call may come
// from any thread, concurrently, except destroying a QP while another thread still uses it.
// Guarantees (attach: verbs ibv_qp_attach_comp_cntr, exactly): comp_mask != 0 or an empty mask
// is EINVAL, bits the QP cannot count ENOTSUP, another device's counter EINVAL, an op already
// served EBUSY; a refused attach changes nothing. At most one counter per op per QP; one counter
// may serve many QPs. No detach: attachments end with the QP, which holds a reference to each
// counter (compcntr:lifetime). Local ops count what this side initiated (success: +1 or +length,
// failure: errors +1); REMOTE_* count the peer's successful accesses. A completion is visible in
// its counters when the call that completed it returns; an error completion moves the QP to ERR
// and flushes its outstanding work (verbs rule).
// Memory ordering: a completion's counter update is a seq_cst RMW made after the bytes were
// copied, so a reader that sees the new value (acquire) sees the bytes. The per-op attach table
// is written (release) only in RESET/INIT and read (acquire) by completions.
//
// Example:
//     a.attach(sent, compcntr::attach_op::send, ec);          // a in RESET
//     a.modify(compcntr::qp_state::init, ec);  b.modify(compcntr::qp_state::init, ec);
//     a.connect(b, ec);                                        // both RTS
//     b.post_recv(1, rbuf, 64, rmr.lkey(), ec);
//     a.post_send(2, sbuf, 64, smr.lkey(), ec);                 // sent.value() == 1 now
module;
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>
export module compcntr:qp;
import :types;
import :mr;
import :slot;
import :backend;
import :counter;
import :error;

// The verbs objects a wrapped QP refers to (rdma-core's <infiniband/verbs.h> defines them).
// Declared here, attached to the global module, so the interface needs no verbs header.
export extern "C++" {
  struct ibv_qp;
  struct ibv_cq_ex;
}

export namespace compcntr {

/// QP states (verbs IBV_QPS_*, reduced to what the software device uses; same values as
/// COMPCNTR_QPS_*).
enum class qp_state : std::uint32_t { reset = 0, init = 1, rts = 2, err = 3 };

/// "RESET", "INIT", "RTS", "ERR" (for messages).
inline const char* qp_state_name(qp_state s) noexcept {
  switch (s) {
    case qp_state::reset: return "RESET";
    case qp_state::init: return "INIT";
    case qp_state::rts: return "RTS";
    case qp_state::err: return "ERR";
  }
  return "an unknown state";
}

/// Combines attach_op bits: `attach_op::send | attach_op::recv`.
constexpr std::uint32_t operator|(attach_op a, attach_op b) noexcept {
  return static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b);
}
constexpr std::uint32_t operator|(std::uint32_t a, attach_op b) noexcept {
  return a | static_cast<std::uint32_t>(b);
}

/// Attach attributes (verbs ibv_qp_attach_comp_cntr_attr).
struct attach_options {
  std::uint32_t comp_mask = 0;  ///< must be 0
  std::uint32_t op_mask = 0;    ///< attach_op bits, not empty
};

/// How compcntr counts a wrapped ibv_qp when the device has no native counters (emulation).
/// Layout-compatible with struct compcntr_verbs_qp_attr (C).
struct verbs_qp_options {
  std::uint32_t comp_mask = 0;  ///< must be 0
  /// The CQ the QP's send-queue completions go to (created with ibv_create_cq_ex). Required for
  /// emulation; ignored with native counters. compcntr drains it in progress(): the application
  /// must not poll it itself.
  ibv_cq_ex* send_cq = nullptr;
  /// The CQ of its receive completions; nullptr = send_cq.
  ibv_cq_ex* recv_cq = nullptr;
  /// Optional: describes a work request of this QP from its wr_id: the attach_op bit it is
  /// (SEND, RECV, RDMA_READ or RDMA_WRITE) and its length. Return 0 if known. Used for error
  /// completions (verbs leaves their opcode undefined) and for the length of SEND/RDMA_WRITE
  /// completions (providers need not report it). See docs/verbs.md for what happens without it.
  int (*wr_info)(void* ctx, std::uint64_t wr_id, std::uint32_t* op,
                 std::uint64_t* length) = nullptr;
  void* wr_info_ctx = nullptr;
};

class device;

class qp;

} // namespace compcntr

namespace compcntr::detail {

inline constexpr unsigned attach_op_count = 6;  ///< attach_op bits 0..5

/// A QP as the backends implement it. Internal: use compcntr::qp.
class qp_impl {
 public:
  qp_impl(const qp_impl&) = delete;
  qp_impl& operator=(const qp_impl&) = delete;

  inline device_core& device() const noexcept { return *dev_; }
  inline std::uint32_t qp_num() const noexcept { return qp_num_; }
  /// Current state. Memory ordering: acquire (pairs with the release store of a transition).
  virtual qp_state state() const noexcept { return state_.load(std::memory_order_acquire); }
  /// attach_op bits this QP can count.
  virtual std::uint32_t supported_ops() const noexcept = 0;

  /// Validates and records an attachment (rules in the file comment). Defined in src/features/qp/qp.cpp.
  std::error_code attach(slot& s, const attach_options& opts) noexcept;

  virtual std::error_code modify(qp_state to) noexcept = 0;
  virtual std::error_code connect(qp_impl& peer) noexcept;
  virtual std::error_code post_recv(std::uint64_t wr_id, void* addr, std::size_t len,
                                    std::uint32_t lkey) noexcept;
  virtual std::error_code post_send(std::uint64_t wr_id, const void* addr, std::size_t len,
                                    std::uint32_t lkey) noexcept;
  virtual std::error_code post_rdma_write(std::uint64_t wr_id, const void* addr, std::size_t len,
                                          std::uint32_t lkey, std::uint64_t remote_addr,
                                          std::uint32_t rkey) noexcept;
  virtual std::error_code post_rdma_read(std::uint64_t wr_id, void* addr, std::size_t len,
                                         std::uint32_t lkey, std::uint64_t remote_addr,
                                         std::uint32_t rkey) noexcept;

  /// Ends the QP: stops its completions (shutdown()), drops its attachments (a counter whose
  /// owner is gone is freed with its last attachment), releases the device, frees this.
  void destroy() noexcept;

  /// The counter serving `op` on this QP, or nullptr. Memory ordering: acquire (pairs with the
  /// release store in attach()).
  inline slot* served(attach_op op) const noexcept {
    return served_[std::countr_zero(static_cast<std::uint32_t>(op))].load(
        std::memory_order_acquire);
  }
  /// One completion of `op` on this QP: success adds 1 (WRS) or `bytes` (BYTES) to the counter
  /// serving `op`, failure adds 1 to its error count. No counter: nothing happens.
  inline void complete(attach_op op, bool ok, std::uint64_t bytes) const noexcept {
    slot* s = served(op);
    if (s == nullptr) return;
    if (ok)
      s->add(s->type == counter_type::bytes ? bytes : 1);
    else
      s->add_error(1);
  }
  /// Counters this QP holds a reference to (one per distinct counter).
  std::size_t attached_counters() const noexcept;
  /// Why the most recent error completion of this QP failed ("" if none; static text).
  virtual const char* last_completion_error() const noexcept { return ""; }

 protected:
  /// Takes a reference to `dev`.
  qp_impl(device_core& dev, std::uint32_t qp_num, qp_state initial) noexcept;
  virtual ~qp_impl();
  /// Stops every completion into this QP's counters; after it returns no thread calls
  /// complete() on this QP any more. Called once, by destroy().
  virtual void shutdown() noexcept {}
  /// Programs native hardware for a validated attachment (nothing for software counting).
  virtual std::error_code on_attach(slot&, std::uint32_t /*op_mask*/) noexcept { return {}; }

  mutable std::mutex ctl_; ///< control path: transitions, connect, attach
  std::atomic<qp_state> state_;

 private:
  device_core* dev_;
  std::uint32_t qp_num_;
  std::atomic<slot*> served_[attach_op_count] = {};
  std::vector<slot*> attached_; ///< guarded by ctl_; one counter reference each
};

/// Optional capability of a backend (backend::qps()): QPs and memory registrations made by
/// compcntr (the software device's loopback QPs).
class qp_capability {
 public:
  /// A new QP in RESET (it holds a reference to `dev`); nullptr + ec (ENOMEM).
  virtual qp_impl* create_qp(device_core& dev, std::error_code& ec) noexcept = 0;
  /// Registers [addr, addr+length) with `access` (compcntr::access bits); nullptr + ec.
  virtual mr_impl* reg_mr(device_core& dev, void* addr, std::size_t length, std::uint32_t access,
                          std::error_code& ec) noexcept = 0;

 protected:
  ~qp_capability() = default;
};

/// Optional capability of a backend (backend::native_attach()): the device's counters are
/// native hardware counters that an ibv_qp of its context is attached to with
/// ibv_qp_attach_comp_cntr. Without it, wrapped verbs QPs are counted by draining their CQs.
class native_attach_capability {
 public:
  /// The device's ibv_context (as void*).
  virtual void* native_context() const noexcept = 0;
  /// Programs the hardware so native counter `s` counts `op_mask` of `ibv_qp` (a struct ibv_qp*).
  virtual std::error_code attach(void* ibv_qp, slot& s, std::uint32_t op_mask) noexcept = 0;

 protected:
  ~native_attach_capability() = default;
};

/// A QP number unique in the process (never 0).
std::uint32_t next_qp_num() noexcept;

/// Wraps an application's ibv_qp (compcntr::device::wrap_verbs_qp). Defined in src/integrations/verbs/.
qp_impl* wrap_verbs_qp(device_core& dev, ibv_qp* vqp, const verbs_qp_options& opts,
                       std::error_code& ec) noexcept;

} // namespace compcntr::detail

export namespace compcntr {

/// A queue pair (see the file comment). Move-only RAII: the destructor destroys the QP.
class qp {
 public:
  qp() noexcept = default;
  inline qp(qp&& o) noexcept : q_(std::exchange(o.q_, nullptr)) {}
  inline qp& operator=(qp&& o) noexcept {
    if (this != &o) {
      reset();
      q_ = std::exchange(o.q_, nullptr);
    }
    return *this;
  }
  qp(const qp&) = delete;
  qp& operator=(const qp&) = delete;
  ~qp() { reset(); }

  inline explicit operator bool() const noexcept { return q_ != nullptr; }
  /// Current state; qp_state::err for an empty qp.
  inline qp_state state() const noexcept { return q_ ? q_->state() : qp_state::err; }
  /// Number of the QP (the ibv_qp's qp_num for a wrapped QP).
  inline std::uint32_t qp_num() const noexcept { return q_ ? q_->qp_num() : 0; }
  /// Why this QP's most recent error completion failed, e.g. "region lacks remote_write
  /// access" ("" if none; software QPs only). For diagnostics: not synchronised with counters.
  inline std::string_view last_completion_error() const noexcept {
    return q_ ? q_->last_completion_error() : "";
  }

  /// RESET -> INIT, any -> ERR (flushes outstanding work in error). INIT -> RTS happens through
  /// connect() on the software device. Other transitions: EINVAL.
  void modify(qp_state to, std::error_code& ec) noexcept;
  /// Software device: pairs this QP with `peer` (another INIT QP of the same device); both
  /// move to RTS. EINVAL otherwise (same QP, other device, wrong state); ENOTSUP for verbs QPs.
  void connect(qp& peer, std::error_code& ec) noexcept;
  /// Attaches `c` for the attach_op bits of `opts.op_mask` (rules in the file comment).
  void attach(counter_view c, const attach_options& opts, std::error_code& ec) noexcept;
  inline void attach(counter_view c, std::uint32_t op_mask, std::error_code& ec) noexcept {
    attach(c, attach_options{.comp_mask = 0, .op_mask = op_mask}, ec);
  }
  inline void attach(counter_view c, attach_op op, std::error_code& ec) noexcept {
    attach(c, static_cast<std::uint32_t>(op), ec);
  }

  /// Posts a receive of up to `len` bytes into [addr, addr+len) (registered with local_write,
  /// `lkey`). Needs RTS. NULL addr with len > 0: EINVAL.
  void post_recv(std::uint64_t wr_id, void* addr, std::size_t len, std::uint32_t lkey,
                 std::error_code& ec) noexcept;
  /// Sends [addr, addr+len) (registered, `lkey`) to the peer's next receive. Needs RTS.
  void post_send(std::uint64_t wr_id, const void* addr, std::size_t len, std::uint32_t lkey,
                 std::error_code& ec) noexcept;
  /// Writes [addr, addr+len) into the peer's memory at remote_addr (registered there with
  /// remote_write, `rkey`). Needs RTS.
  void post_rdma_write(std::uint64_t wr_id, const void* addr, std::size_t len, std::uint32_t lkey,
                       std::uint64_t remote_addr, std::uint32_t rkey, std::error_code& ec) noexcept;
  /// Reads `len` bytes of the peer's memory at remote_addr (remote_read, `rkey`) into
  /// [addr, addr+len) (local_write, `lkey`). Needs RTS.
  void post_rdma_read(std::uint64_t wr_id, void* addr, std::size_t len, std::uint32_t lkey,
                      std::uint64_t remote_addr, std::uint32_t rkey, std::error_code& ec) noexcept;

  /// Destroys the QP now (ends its attachments). EINVAL on an empty qp.
  void destroy(std::error_code& ec) noexcept;
  /// Destroys the QP if non-empty.
  inline void reset() noexcept {
    if (detail::qp_impl* q = std::exchange(q_, nullptr)) q->destroy();
  }

  inline detail::qp_impl* native_impl() const noexcept { return q_; }

 private:
  friend class device;
  inline explicit qp(detail::qp_impl* q) noexcept : q_(q) {}
  detail::qp_impl* q_ = nullptr;
};

} // namespace compcntr
