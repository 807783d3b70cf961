// Wrapped verbs QPs: the application's own ibv_qp counted by compcntr counters.
//
// Native mode (the device's counters are ibv_comp_cntr objects): attach is
// ibv_qp_attach_comp_cntr, the hardware counts, nothing here runs on the data path.
//
// Emulation (any other device, including "soft"): each CQ the wrapped QPs complete into becomes a
// progress source of the device. progress() drains it with the extended polling API
// (ibv_start_poll / ibv_next_poll / ibv_end_poll) and adds every completion to the counter the
// QP's attach table names, with the software device's rules: success adds 1 (WRS) or the length
// (BYTES), an error adds 1 to the error count.
//   * opcode -> op: IBV_WC_SEND -> SEND, IBV_WC_RDMA_WRITE -> RDMA_WRITE, IBV_WC_RDMA_READ ->
//     RDMA_READ, IBV_WC_RECV and IBV_WC_RECV_RDMA_WITH_IMM (it consumed a receive) -> RECV;
//     other opcodes (atomics, memory windows, ...) are consumed and counted nowhere.
//   * length: receives use the CQE's byte_len; SEND / RDMA_WRITE / RDMA_READ use the wr_info
//     callback's length when given, else byte_len (which providers need not fill for
//     send-queue completions). byte_len is read only when a BYTES counter needs it.
//   * errors: verbs leaves the opcode of an error completion undefined. An error from a CQ that
//     carries only the QP's receives is a RECV error; otherwise wr_info names the op; without
//     it, the error goes to the counter of the lowest attached local op bit
//     (SEND, RECV, RDMA_READ, RDMA_WRITE in that order).
//   * a CQ shared by several wrapped QPs must be created with IBV_WC_EX_WITH_QP_NUM (the QP is
//     told by the CQE's qp_num, from the moment a second wrapped QP uses the CQ on); a CQ that
//     only ever had one wrapped QP is taken to carry only its completions.
//     Completions of QPs compcntr does not know (e.g. destroyed wrappers) are consumed and
//     dropped: a CQ given to compcntr is compcntr's to drain. When the last wrapped QP of a CQ
//     is destroyed, what the CQ holds is drained and dropped; completions of those QPs that
//     arrive later are told apart by a later wrapper on that CQ (on the same device), which
//     routes by qp_num (when the CQ can read it) instead of taking everything to be its own.
//   * one owner per ibv_qp and per CQ in the process: an ibv_qp is wrapped once (on any
//     device), and a CQ is drained by one device (wrapping a QP whose CQ another device drains
//     is EBUSY), so one thread at a time polls it under that device's registry lock.
module;
#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include "compcntr_config.h"
#if COMPCNTR_HAVE_VERBS
#include <infiniband/verbs.h>
#endif
module compcntr;

namespace compcntr::detail {

#if COMPCNTR_HAVE_VERBS

namespace {

constexpr std::uint32_t bit(attach_op op) noexcept { return static_cast<std::uint32_t>(op); }
constexpr std::uint32_t local_ops = bit(attach_op::send) | bit(attach_op::recv) |
                                    bit(attach_op::rdma_read) | bit(attach_op::rdma_write);

/// Completions drained per source and progress() call: bounds the time one call spends when
/// completions keep arriving (the rest waits for the next call).
constexpr std::size_t max_batch = 1024;

class verbs_qp;

/// Who drains which CQ and which ibv_qps are wrapped, across every device of the process.
/// Guarded by `mu`; taken after a device's registry lock (wrap, shutdown), never before it.
struct wrap_table {
  std::mutex mu;
  std::unordered_map<const ibv_cq_ex*, const device_core*> cq_owner;  ///< device draining it
  std::unordered_set<const ibv_qp*> qps;                               ///< wrapped ibv_qps
};
wrap_table& wraps() noexcept {
  // Made on first use and never destroyed: a wrapper destroyed during static destruction (an
  // atexit handler, a static object) still finds it.
  static wrap_table* const t = new wrap_table;
  return *t;
}

/// One CQ drained for the wrapped QPs that complete into it.
class cq_source final : public progress_source {
 public:
  struct user {
    verbs_qp* qp;
    bool sends;  ///< the QP's send-queue completions come here
    bool recvs;  ///< its receive completions come here
  };
  explicit cq_source(ibv_cq_ex* cq) noexcept : cq(cq) {}
  std::size_t poll() noexcept override;
  /// Consumes and drops everything the CQ holds now (its last wrapped QP is going: what is left
  /// belongs to nobody compcntr knows, and must not be charged to a later wrapper).
  void discard() noexcept;

  ibv_cq_ex* const cq;
  std::vector<user> users;  ///< guarded by the device's progress registry lock
  /// Once two wrapped QPs used this CQ, entries are routed by qp_num for good (even when one
  /// user is left: the CQ may still carry the others' completions).
  bool shared = false;      ///< guarded by the device's progress registry lock

 private:
  void consume() noexcept;
};

class verbs_qp final : public qp_impl {
 public:
  verbs_qp(device_core& dev, ibv_qp* q, const verbs_qp_options& o, bool native) noexcept
      : qp_impl(dev, q->qp_num, qp_state::reset), q_(q), opts_(o), native_(native) {}

  qp_state state() const noexcept override {
    switch (q_->state) {
      case IBV_QPS_RESET: return qp_state::reset;
      case IBV_QPS_INIT: return qp_state::init;
      case IBV_QPS_RTR:
      case IBV_QPS_RTS:
      case IBV_QPS_SQD: return qp_state::rts;
      default: return qp_state::err;
    }
  }
  std::uint32_t supported_ops() const noexcept override {
    return native_ ? device().be().caps().supported_qp_attach_ops : local_ops;
  }
  std::error_code modify(qp_state) noexcept override {
    return fail(ENOTSUP, "modify_qp: QP %u is a wrapped verbs QP; modify it with ibv_modify_qp",
                qp_num());
  }

  ibv_qp* verbs() const noexcept { return q_; }

  /// One completion drained from `src`.
  void on_completion(const cq_source::user& u, ibv_cq_ex* cq) const noexcept {
    const std::uint64_t wr_id = cq->wr_id;
    if (cq->status != IBV_WC_SUCCESS) {
      if (const std::uint32_t op = error_op(u, wr_id))
        complete(static_cast<attach_op>(op), false, 0);
      return;
    }
    attach_op op;
    switch (ibv_wc_read_opcode(cq)) {
      case IBV_WC_SEND: op = attach_op::send; break;
      case IBV_WC_RDMA_WRITE: op = attach_op::rdma_write; break;
      case IBV_WC_RDMA_READ: op = attach_op::rdma_read; break;
      case IBV_WC_RECV:
      case IBV_WC_RECV_RDMA_WITH_IMM: op = attach_op::recv; break;
      default: return;  // not an attach op
    }
    const slot* s = served(op);
    if (s == nullptr) return;
    std::uint64_t len = 0;
    if (s->type == counter_type::bytes) {
      std::uint32_t described_op = 0;
      if (op == attach_op::recv || !opts_.wr_info ||
          opts_.wr_info(opts_.wr_info_ctx, wr_id, &described_op, &len) != 0)
        len = ibv_wc_read_byte_len(cq);
    }
    complete(op, true, len);
  }

 private:
  std::uint32_t error_op(const cq_source::user& u, std::uint64_t wr_id) const noexcept {
    if (u.recvs && !u.sends) return bit(attach_op::recv);
    // The ops this CQ can carry for the QP: a CQ without its receives never holds a RECV.
    const std::uint32_t possible = u.recvs ? local_ops : local_ops & ~bit(attach_op::recv);
    if (opts_.wr_info) {
      std::uint32_t op = 0;
      std::uint64_t len = 0;
      if (opts_.wr_info(opts_.wr_info_ctx, wr_id, &op, &len) == 0 && std::has_single_bit(op) &&
          (op & possible) != 0)
        return op;
    }
    for (attach_op op :
         {attach_op::send, attach_op::recv, attach_op::rdma_read, attach_op::rdma_write})
      if ((bit(op) & possible) != 0 && served(op) != nullptr) return bit(op);
    return 0;
  }

  std::error_code on_attach(slot& s, std::uint32_t op_mask) noexcept override {
    if (!native_) return {};
    return device().be().native_attach()->attach(q_, s, op_mask);
  }

  void shutdown() noexcept override {
    if (native_) return;
    progress_registry& reg = device().progress_sources();
    auto lk = reg.lock();  // waits for a progress() in flight: afterwards nothing polls for us
    std::vector<progress_source*> gone;
    for (progress_source* p : reg.sources_locked()) {
      auto* src = dynamic_cast<cq_source*>(p);
      if (!src) continue;
      std::erase_if(src->users, [this](const cq_source::user& u) { return u.qp == this; });
      if (src->users.empty()) gone.push_back(src);
    }
    for (progress_source* p : gone) {
      // What the CQ holds now is dropped; completions still in flight for the QPs that used it
      // may arrive later: a later wrapper on it (on this device) routes by qp_num (add_user).
      // Not after a refused wrap: a source it made never served anyone, and the CQ is still
      // the application's.
      if (wrapped_) {
        static_cast<cq_source*>(p)->discard();
        reg.retire_locked(static_cast<cq_source*>(p)->cq);
      }
      reg.remove_locked(*p);
      delete p;
    }
    // This device no longer drains a CQ none of its sources uses (also after a wrap that failed
    // half-way).
    wrap_table& t = wraps();
    std::lock_guard g(t.mu);
    t.qps.erase(q_);
    for (ibv_cq_ex* cq : {opts_.send_cq, opts_.recv_cq ? opts_.recv_cq : opts_.send_cq}) {
      bool used = false;
      for (progress_source* p : reg.sources_locked())
        if (auto* src = dynamic_cast<cq_source*>(p); src && src->cq == cq) used = true;
      auto it = t.cq_owner.find(cq);
      if (!used && it != t.cq_owner.end() && it->second == &device()) t.cq_owner.erase(it);
    }
  }

  ibv_qp* q_;
  verbs_qp_options opts_;
  bool native_;

 public:
  /// Set once wrap_verbs_qp succeeded (under the registry lock): shutdown() then owns the CQs.
  bool wrapped_ = false;
};

void cq_source::consume() noexcept {
  const user* u = nullptr;
  if (!shared) {
    u = &users.front();
  } else {
    const std::uint32_t qpn = ibv_wc_read_qp_num(cq);
    for (const user& x : users)
      if (x.qp->verbs()->qp_num == qpn) u = &x;
  }
  if (u) u->qp->on_completion(*u, cq);
}

void cq_source::discard() noexcept {
  ibv_poll_cq_attr attr{};
  if (ibv_start_poll(cq, &attr) != 0) return;
  while (ibv_next_poll(cq) == 0) {
  }
  ibv_end_poll(cq);
}

std::size_t cq_source::poll() noexcept {
  ibv_poll_cq_attr attr{};
  if (ibv_start_poll(cq, &attr) != 0) return 0; // ENOENT: nothing there (or a CQ error)
  std::size_t n = 0;
  do {
    consume();
    ++n;
  } while (n < max_batch && ibv_next_poll(cq) == 0);
  ibv_end_poll(cq);
  return n;
}

/// Registers `q` with the source of `cq` (made if needed). Under the registry lock.
std::error_code add_user(progress_registry& reg, ibv_cq_ex* cq, const cq_source::user& u) noexcept {
  cq_source* src = nullptr;
  for (progress_source* p : reg.sources_locked())
    if (auto* s = dynamic_cast<cq_source*>(p); s && s->cq == cq) src = s;
  const bool fresh = src == nullptr;
  if (!fresh && !src->shared && cq->read_qp_num == nullptr)
    return fail(EINVAL,
                "wrap_verbs_qp: ibv_qp %u would share a CQ with another wrapped QP, but "
                "the CQ was not created with IBV_WC_EX_WITH_QP_NUM (its entries could not be "
                "told apart)",
                u.qp->verbs()->qp_num);
  if (fresh) {
    src = new (std::nothrow) cq_source(cq);
    if (!src) return fail(ENOMEM, "wrap_verbs_qp: out of memory");
    // Leftovers of earlier wrapped QPs are told apart by qp_num when the CQ can read it;
    // without it they are taken to be this QP's (the application drained the CQ, or accepts).
    src->shared = reg.retired_locked(cq) && cq->read_qp_num != nullptr;
  }
  try {
    src->users.push_back(u);
  } catch (...) {
    if (fresh) delete src;
    return fail(ENOMEM, "wrap_verbs_qp: out of memory");
  }
  if (src->users.size() > 1) src->shared = true;
  if (fresh) {
    if (auto e = reg.add_locked(*src)) {
      delete src;
      return e;
    }
  }
  return {};
}

} // namespace

qp_impl* wrap_verbs_qp(device_core& dev, ibv_qp* vqp, const verbs_qp_options& opts,
                       std::error_code& ec) noexcept {
  if (!vqp) return fail_into(ec, EINVAL, "wrap_verbs_qp: ibv_qp is NULL"), nullptr;
  if (opts.comp_mask != 0)
    return fail_into(ec, EINVAL, "wrap_verbs_qp: comp_mask must be 0 (got 0x%x)", opts.comp_mask),
           nullptr;
  if (native_attach_capability* native = dev.be().native_attach()) {
    if (vqp->context != native->native_context())
      return fail_into(ec, EINVAL, "wrap_verbs_qp: ibv_qp %u belongs to another device context",
                       vqp->qp_num),
             nullptr;
    auto* q = new (std::nothrow) verbs_qp(dev, vqp, opts, true);
    if (!q) fail_into(ec, ENOMEM, "wrap_verbs_qp: out of memory");
    return q;
  }

  if (!opts.send_cq)
    return fail_into(ec, EINVAL, "wrap_verbs_qp: send_cq is NULL (emulation drains the QP's CQs)"),
           nullptr;
  ibv_cq_ex* recv_cq = opts.recv_cq ? opts.recv_cq : opts.send_cq;
  progress_registry& reg = dev.progress_sources();
  auto lk = reg.lock();
  wrap_table& t = wraps();
  std::unique_lock glk(t.mu);
  if (t.qps.contains(vqp))
    return fail_into(ec, EBUSY,
                     "wrap_verbs_qp: ibv_qp %u is already wrapped (on this or another "
                     "compcntr device)",
                     vqp->qp_num),
           nullptr;
  ibv_cq_ex* const cqs[2] = {opts.send_cq, recv_cq};
  for (int i = 0; i < 2; ++i)
    if (auto it = t.cq_owner.find(cqs[i]); it != t.cq_owner.end() && it->second != &dev)
      return fail_into(ec, EBUSY,
                       "wrap_verbs_qp: ibv_qp %u's %s CQ is drained by another compcntr "
                       "device (a CQ is drained by one device)",
                       vqp->qp_num, i == 0 ? "send" : "receive"),
             nullptr;
  auto* q = new (std::nothrow) verbs_qp(dev, vqp, opts, false);
  if (!q) return fail_into(ec, ENOMEM, "wrap_verbs_qp: out of memory"), nullptr;
  std::error_code e;
  try {
    t.qps.insert(vqp);
    for (ibv_cq_ex* cq : cqs) t.cq_owner[cq] = &dev;
  } catch (...) {
    e = fail(ENOMEM, "wrap_verbs_qp: out of memory");
  }
  if (!e) e = add_user(reg, opts.send_cq, {q, true, recv_cq == opts.send_cq});
  if (!e && recv_cq != opts.send_cq) e = add_user(reg, recv_cq, {q, false, true});
  if (!e) q->wrapped_ = true;
  glk.unlock();
  lk.unlock();
  if (e) {
    q->destroy(); // unregisters what was registered
    ec = e;
    return nullptr;
  }
  return q;
}

#else // built without libibverbs

qp_impl* wrap_verbs_qp(device_core&, ibv_qp*, const verbs_qp_options&,
                       std::error_code& ec) noexcept {
  fail_into(ec, ENOTSUP, "wrap_verbs_qp: compcntr was built without libibverbs");
  return nullptr;
}

#endif

} // namespace compcntr::detail
