// The software device's loopback QPs: real byte movement, real completions, real errors.
//
// Rules (the contract is in modules/features/qp.cppm and docs/qp.md; this is how they are met):
//   * Two connected QPs share one soft_link whose mutex serialises everything that touches the
//     pair's queues: posts on either side, modify(ERR), destroy. Different pairs never share a
//     lock; the device's registration lock is taken shared (see soft_memory.cpp).
//   * A receive waits in the receiver's recvs_; a send that finds no receive waits in the
//     sender's sends_. At most one of (R.recvs_, S.sends_) is non-empty for a pair direction, so
//     each post matches at most one waiting request, oldest first.
//   * Validation happens before any byte moves: lkey / rkey / range / access rights. A failure
//     completes the initiator's request in error and moves its QP to ERR (fail_qp), which flushes
//     its waiting requests in error, and fails the peer's sends waiting on it (their QP goes to
//     ERR too: a send that can never be received fails, as on an RC connection).
//   * Counters are updated after the copy, before the posting call returns.
module;
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <system_error>
module compcntr;

#include "features/soft/soft.hpp"

namespace compcntr::detail {

namespace {

struct recv_wr {
  std::uint64_t wr_id;
  void* addr;
  std::size_t len;
  std::uint32_t lkey;
};

struct send_wr {
  std::uint64_t wr_id;
  const void* addr;
  std::size_t len;
  std::uint32_t lkey;
};

/// What two connected QPs share. Freed by the second of them to be destroyed.
struct soft_link {
  std::mutex mu;
  std::atomic<int> refs{2};
};

/// Holds the device's registrations shared for the duration of one operation.
class memory_read_guard {
 public:
  explicit memory_read_guard(soft_memory& m) noexcept : m_(m) { soft_memory_lock_shared(m_); }
  ~memory_read_guard() { soft_memory_unlock_shared(m_); }
  memory_read_guard(const memory_read_guard&) = delete;
  memory_read_guard& operator=(const memory_read_guard&) = delete;

 private:
  soft_memory& m_;
};

class soft_qp final : public qp_impl {
 public:
  /// May throw std::bad_alloc: libstdc++'s deque allocates in its default constructor
  /// (make_soft_qp turns that into ENOMEM).
  soft_qp(device_core& dev, soft_memory& mem)
      : qp_impl(dev, next_qp_num(), qp_state::reset), mem_(mem) {}

  std::uint32_t supported_ops() const noexcept override { return all_attach_ops; }
  std::error_code modify(qp_state to) noexcept override;
  std::error_code connect(qp_impl& peer) noexcept override;
  std::error_code post_recv(std::uint64_t wr_id, void* addr, std::size_t len,
                            std::uint32_t lkey) noexcept override;
  std::error_code post_send(std::uint64_t wr_id, const void* addr, std::size_t len,
                            std::uint32_t lkey) noexcept override;
  std::error_code post_rdma_write(std::uint64_t wr_id, const void* addr, std::size_t len,
                                  std::uint32_t lkey, std::uint64_t remote_addr,
                                  std::uint32_t rkey) noexcept override;
  std::error_code post_rdma_read(std::uint64_t wr_id, void* addr, std::size_t len,
                                 std::uint32_t lkey, std::uint64_t remote_addr,
                                 std::uint32_t rkey) noexcept override;
  const char* last_completion_error() const noexcept override {
    return last_error_.load(std::memory_order_relaxed);
  }

 private:
  enum class delivery { done, receive_not_consumed };

  void shutdown() noexcept override;

  /// Entry checks of every post: arguments, then RTS. On success the caller locks the link.
  std::error_code check_post(const char* call, const void* addr, std::size_t len) noexcept;
  /// True if [addr, addr+len) is registered under lkey with `need`; else false and *why names
  /// the violation. A zero-length range touches no byte and is always valid.
  bool local(std::uint32_t lkey, const void* addr, std::size_t len, std::uint32_t need,
             const char** why) noexcept;
  /// Fails one request this QP initiated and moves the QP to ERR. Under the link mutex.
  void fail_request(attach_op op, const char* why) noexcept;
  /// Moves `q` to ERR, flushing its waiting requests in error; fails the peer's sends waiting on
  /// it (which moves the peer to ERR). Under the link mutex.
  static void fail_qp(soft_qp& q) noexcept;
  /// RDMA write (local -> remote) or read (remote -> local): validation, copy, completions.
  std::error_code rdma(attach_op op, void* local_addr, std::size_t len, std::uint32_t lkey,
                       std::uint64_t remote_addr, std::uint32_t rkey) noexcept;
  /// Delivers send `s` of `sender` into receive `r` of `receiver`. Under the link mutex and the
  /// registration read lock.
  delivery deliver(soft_qp& sender, const send_wr& s, soft_qp& receiver, const recv_wr& r) noexcept;

  soft_memory& mem_;
  soft_link* link_ = nullptr;    ///< set by connect() before the RTS release store; then fixed
  soft_qp* peer_ = nullptr;      ///< guarded by link_->mu; nullptr once the peer is destroyed
  std::deque<recv_wr> recvs_;    ///< guarded by link_->mu
  std::deque<send_wr> sends_;    ///< guarded by link_->mu
  std::atomic<const char*> last_error_{""};
};

std::error_code soft_qp::modify(qp_state to) noexcept {
  std::lock_guard<std::mutex> g(ctl_);
  const qp_state from = state_.load(std::memory_order_relaxed);
  switch (to) {
    case qp_state::err:
      if (link_) {
        std::lock_guard<std::mutex> l(link_->mu);
        last_error_.store("modify_qp(ERR) flushed the request", std::memory_order_relaxed);
        fail_qp(*this);
      } else {
        state_.store(qp_state::err, std::memory_order_release);  // never connected: nothing waits
      }
      return {};
    case qp_state::init:
      if (from == qp_state::reset) {
        state_.store(qp_state::init, std::memory_order_release);
        return {};
      }
      break;
    case qp_state::rts:
      if (from == qp_state::init)
        return fail(EINVAL,
                    "modify_qp: QP %u: on the software device INIT -> RTS happens by "
                    "connect_qp (it pairs the QP with its peer)",
                    qp_num());
      break;
    case qp_state::reset: break;
    default: return fail(EINVAL, "modify_qp: unknown state %u", static_cast<unsigned>(to));
  }
  return fail(EINVAL,
              "modify_qp: QP %u cannot go from %s to %s (allowed: RESET -> INIT, "
              "INIT -> RTS by connect_qp, any -> ERR)",
              qp_num(), qp_state_name(from), qp_state_name(to));
}

std::error_code soft_qp::connect(qp_impl& peer_impl) noexcept {
  auto* p = dynamic_cast<soft_qp*>(&peer_impl);
  if (!p) return fail(EINVAL, "connect_qp: peer QP %u is not a software QP", peer_impl.qp_num());
  if (p == this) return fail(EINVAL, "connect_qp: QP %u cannot be connected to itself", qp_num());
  if (&p->device() != &device())
    return fail(EINVAL, "connect_qp: QPs %u and %u belong to different devices", qp_num(),
                p->qp_num());
  std::scoped_lock lk(ctl_, p->ctl_);
  const qp_state a = state_.load(std::memory_order_relaxed);
  const qp_state b = p->state_.load(std::memory_order_relaxed);
  if (a != qp_state::init || b != qp_state::init)
    return fail(EINVAL, "connect_qp: both QPs must be in INIT (QP %u is %s, QP %u is %s)", qp_num(),
                qp_state_name(a), p->qp_num(), qp_state_name(b));
  auto* l = new (std::nothrow) soft_link;
  if (!l) return fail(ENOMEM, "connect_qp: out of memory");
  link_ = p->link_ = l;
  peer_ = p;
  p->peer_ = this;
  // Release: a thread that sees RTS (acquire in check_post) sees link_ and peer_.
  state_.store(qp_state::rts, std::memory_order_release);
  p->state_.store(qp_state::rts, std::memory_order_release);
  return {};
}

void soft_qp::shutdown() noexcept {
  soft_link* l;
  {
    std::lock_guard<std::mutex> g(ctl_);
    l = link_;
  }
  if (!l) return;
  {
    std::lock_guard<std::mutex> g(l->mu);
    state_.store(qp_state::err, std::memory_order_release);
    if (soft_qp* p = peer_) {
      p->peer_ = nullptr;
      peer_ = nullptr;
      if (!p->sends_.empty()) {  // they can never be received now
        p->last_error_.store("peer QP was destroyed", std::memory_order_relaxed);
        fail_qp(*p);
      }
    }
    recvs_.clear();  // destroyed: no completions (verbs: the QP's CQ entries are gone)
    sends_.clear();
  }
  if (l->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete l;
}

std::error_code soft_qp::check_post(const char* call, const void* addr, std::size_t len) noexcept {
  if (addr == nullptr && len != 0) return fail(EINVAL, "%s: addr is NULL (len %zu)", call, len);
  const qp_state s = state();
  if (s != qp_state::rts)
    return fail(EINVAL, "%s: QP %u is in %s; posting needs RTS", call, qp_num(), qp_state_name(s));
  return {};
}

bool soft_qp::local(std::uint32_t lkey, const void* addr, std::size_t len, std::uint32_t need,
                    const char** why) noexcept {
  if (len == 0) return true;  // zero-length: no byte is touched, no key is checked (as verbs)
  return soft_memory_resolve(mem_, lkey, false, reinterpret_cast<std::uintptr_t>(addr), len, need,
                             why) != nullptr;
}

void soft_qp::fail_request(attach_op op, const char* why) noexcept {
  last_error_.store(why, std::memory_order_relaxed);
  complete(op, false, 0);
  fail_qp(*this);
}

void soft_qp::fail_qp(soft_qp& q) noexcept {
  if (q.state_.load(std::memory_order_relaxed) == qp_state::err) return;
  q.state_.store(qp_state::err, std::memory_order_release);
  for (std::size_t i = q.recvs_.size(); i > 0; --i) q.complete(attach_op::recv, false, 0);
  for (std::size_t i = q.sends_.size(); i > 0; --i) q.complete(attach_op::send, false, 0);
  q.recvs_.clear();
  q.sends_.clear();
  if (soft_qp* p = q.peer_; p && !p->sends_.empty()) {
    p->last_error_.store("peer QP entered ERR with sends waiting for it",
                         std::memory_order_relaxed);
    fail_qp(*p);
  }
}

soft_qp::delivery soft_qp::deliver(soft_qp& sender, const send_wr& s, soft_qp& receiver,
                                   const recv_wr& r) noexcept {
  const char* why = nullptr;
  // The send's buffer may have been deregistered while it waited: a local error of the sender.
  if (!sender.local(s.lkey, s.addr, s.len, 0, &why)) {
    sender.fail_request(attach_op::send, why);
    return delivery::receive_not_consumed;
  }
  const bool dst_ok =
      receiver.local(r.lkey, r.addr, s.len <= r.len ? s.len : r.len, access::local_write, &why);
  if (!dst_ok || s.len > r.len) {
    // The receiver cannot take the message: both requests fail, both QPs enter ERR.
    if (s.len > r.len) why = "message longer than the receive buffer";
    receiver.last_error_.store(why, std::memory_order_relaxed);
    sender.last_error_.store(why, std::memory_order_relaxed);
    receiver.complete(attach_op::recv, false, 0);
    sender.complete(attach_op::send, false, 0);
    fail_qp(receiver);
    fail_qp(sender);
    return delivery::done;
  }
  if (s.len != 0) std::memmove(r.addr, s.addr, s.len);
  sender.complete(attach_op::send, true, s.len);
  receiver.complete(attach_op::recv, true, s.len);
  return delivery::done;
}

std::error_code soft_qp::post_recv(std::uint64_t wr_id, void* addr, std::size_t len,
                                   std::uint32_t lkey) noexcept {
  if (auto e = check_post("post_recv", addr, len)) return e;
  std::lock_guard<std::mutex> g(link_->mu);
  if (auto e = check_post("post_recv", addr, len)) return e;  // may have entered ERR meanwhile
  memory_read_guard mem(mem_);
  const char* why = nullptr;
  if (!local(lkey, addr, len, access::local_write, &why)) {
    fail_request(attach_op::recv, why);
    return {};
  }
  const recv_wr r{wr_id, addr, len, lkey};
  if (soft_qp* p = peer_; p && !p->sends_.empty()) {
    const send_wr s = p->sends_.front();
    p->sends_.pop_front();
    if (deliver(*p, s, *this, r) == delivery::done) return {};
    // The waiting send failed on its side (its QP is in ERR, its other sends flushed): this
    // receive stays posted, or is flushed if the failure reached this QP too.
    if (state_.load(std::memory_order_relaxed) != qp_state::rts) {
      complete(attach_op::recv, false, 0);
      return {};
    }
  }
  try {
    recvs_.push_back(r);
  } catch (...) {
    return fail(ENOMEM, "post_recv: out of memory");
  }
  return {};
}

std::error_code soft_qp::post_send(std::uint64_t wr_id, const void* addr, std::size_t len,
                                   std::uint32_t lkey) noexcept {
  if (auto e = check_post("post_send", addr, len)) return e;
  std::lock_guard<std::mutex> g(link_->mu);
  if (auto e = check_post("post_send", addr, len)) return e;
  memory_read_guard mem(mem_);
  const char* why = nullptr;
  if (!local(lkey, addr, len, 0, &why)) {
    fail_request(attach_op::send, why);
    return {};
  }
  soft_qp* p = peer_;
  if (!p || p->state() != qp_state::rts) {
    fail_request(attach_op::send, p ? "peer QP is in ERR" : "peer QP was destroyed");
    return {};
  }
  const send_wr s{wr_id, addr, len, lkey};
  if (!p->recvs_.empty()) {
    const recv_wr r = p->recvs_.front();
    p->recvs_.pop_front();
    deliver(*this, s, *p, r);  // s was validated above: the receive is always consumed
    return {};
  }
  try {
    sends_.push_back(s);
  } catch (...) {
    return fail(ENOMEM, "post_send: out of memory");
  }
  return {};
}

std::error_code soft_qp::post_rdma_write(std::uint64_t, const void* addr, std::size_t len,
                                         std::uint32_t lkey, std::uint64_t remote_addr,
                                         std::uint32_t rkey) noexcept {
  // The local buffer is only read: const_cast is safe (rdma() never writes it for a write).
  return rdma(attach_op::rdma_write, const_cast<void*>(addr), len, lkey, remote_addr, rkey);
}

std::error_code soft_qp::post_rdma_read(std::uint64_t, void* addr, std::size_t len,
                                        std::uint32_t lkey, std::uint64_t remote_addr,
                                        std::uint32_t rkey) noexcept {
  return rdma(attach_op::rdma_read, addr, len, lkey, remote_addr, rkey);
}

std::error_code soft_qp::rdma(attach_op op, void* local_addr, std::size_t len, std::uint32_t lkey,
                              std::uint64_t remote_addr, std::uint32_t rkey) noexcept {
  const bool write = op == attach_op::rdma_write;
  const char* call = write ? "post_rdma_write" : "post_rdma_read";
  if (auto e = check_post(call, local_addr, len)) return e;
  std::lock_guard<std::mutex> g(link_->mu);
  if (auto e = check_post(call, local_addr, len)) return e;
  memory_read_guard mem(mem_);
  const char* why = nullptr;
  soft_qp* p = peer_;
  void* remote = nullptr;
  // A write reads the local buffer and needs REMOTE_WRITE on the target; a read writes the
  // local buffer (LOCAL_WRITE) and needs REMOTE_READ.
  if (local(lkey, local_addr, len, write ? 0 : access::local_write, &why)) {
    if (!p || p->state() != qp_state::rts)
      why = p ? "peer QP is in ERR" : "peer QP was destroyed";
    else if (len != 0)
      remote = soft_memory_resolve(mem_, rkey, true, remote_addr, len,
                                   write ? access::remote_write : access::remote_read, &why);
  }
  if (why) {
    fail_request(op, why);  // the target's counters are untouched
    return {};
  }
  if (len != 0) {
    if (write)
      std::memmove(remote, local_addr, len);
    else
      std::memmove(local_addr, remote, len);
  }
  complete(op, true, len);
  p->complete(write ? attach_op::remote_rdma_write : attach_op::remote_rdma_read, true, len);
  return {};
}

} // namespace

qp_impl* make_soft_qp(device_core& dev, soft_memory& mem, std::error_code& ec) noexcept {
  // The memory first, then the object: a std::bad_alloc from the queues' construction (issue
  // 15, defect 1: it used to escape a noexcept constructor, std::terminate) comes after the
  // qp_impl base took its device reference, which ~qp_impl does not drop: undo it here.
  constexpr bool over_aligned = alignof(soft_qp) > __STDCPP_DEFAULT_NEW_ALIGNMENT__;
  void* raw = over_aligned ? ::operator new(sizeof(soft_qp), std::align_val_t(alignof(soft_qp)),
                                            std::nothrow)
                           : ::operator new(sizeof(soft_qp), std::nothrow);
  if (!raw) {
    fail_into(ec, ENOMEM, "create_qp: out of memory");
    return nullptr;
  }
  try {
    return new (raw) soft_qp(dev, mem);
  } catch (...) {  // std::bad_alloc: the base was constructed (and its destructor has run)
    if (over_aligned)
      ::operator delete(raw, std::align_val_t(alignof(soft_qp)));
    else
      ::operator delete(raw);
    dev.release();
    fail_into(ec, ENOMEM, "create_qp: out of memory for the QP's queues");
    return nullptr;
  }
}

} // namespace compcntr::detail
