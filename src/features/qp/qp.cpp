// QPs (compcntr:qp): the attach rules shared by every kind of QP, QP lifetime, the public qp
// methods, and the device calls that make QPs and memory regions.
module;
#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <utility>
#include <vector>
module compcntr;

namespace compcntr {

namespace detail {

std::uint32_t next_qp_num() noexcept {
  // Process-wide, never 0 (0 reads as "no QP" in messages). Relaxed: only uniqueness matters.
  static std::atomic<std::uint32_t> next{1};
  std::uint32_t n = next.fetch_add(1, std::memory_order_relaxed);
  while (n == 0) n = next.fetch_add(1, std::memory_order_relaxed);
  return n;
}

qp_impl::qp_impl(device_core& dev, std::uint32_t qp_num, qp_state initial) noexcept
    : state_(initial), dev_(&dev), qp_num_(qp_num) {
  dev.retain();
}

qp_impl::~qp_impl() = default;

std::size_t qp_impl::attached_counters() const noexcept {
  std::lock_guard<std::mutex> g(ctl_);
  return attached_.size();
}

std::error_code qp_impl::attach(slot& s, const attach_options& o) noexcept {
  if (o.comp_mask != 0)
    return fail(EINVAL, "qp_attach_comp_cntr: comp_mask must be 0 (got 0x%x)", o.comp_mask);
  if (o.op_mask == 0) return fail(EINVAL, "qp_attach_comp_cntr: op_mask is empty");
  const std::uint32_t supported = supported_ops();
  if (const std::uint32_t bad = o.op_mask & ~supported)
    return fail(
        ENOTSUP,
        "qp_attach_comp_cntr: op bit(s) 0x%x not supported on QP %u (supported_qp_attach_ops"
        " 0x%x)",
        bad, qp_num_, supported);
  if (s.dev != dev_)
    return fail(EINVAL, "qp_attach_comp_cntr: counter %u belongs to another device than QP %u",
                s.index, qp_num_);

  std::lock_guard<std::mutex> g(ctl_);
  const qp_state st = state();
  if (st != qp_state::reset && st != qp_state::init)
    return fail(EINVAL, "qp_attach_comp_cntr: QP %u is in %s; attach needs RESET or INIT", qp_num_,
                qp_state_name(st));
  std::uint32_t busy = 0;
  for (unsigned i = 0; i < attach_op_count; ++i)
    if ((o.op_mask >> i & 1u) && served_[i].load(std::memory_order_relaxed) != nullptr)
      busy |= 1u << i;
  if (busy) {
    const slot* holder = served_[std::countr_zero(busy)].load(std::memory_order_relaxed);
    return fail(EBUSY, "qp_attach_comp_cntr: op bit(s) 0x%x of QP %u already counted by counter %u",
                busy, qp_num_, holder->index);
  }

  const bool have = std::find(attached_.begin(), attached_.end(), &s) != attached_.end();
  if (!have) {
    try {
      attached_.reserve(attached_.size() + 1);
    } catch (...) {
      return fail(ENOMEM, "qp_attach_comp_cntr: out of memory");
    }
    // Take a reference unless the counter is already gone: counter::destroy() CASes refs 1 -> 0,
    // so either this sees refs >= 1 and destroy() then fails with EBUSY, or destroy() won and
    // this sees 0 (compcntr:lifetime).
    if (!take_counter_ref(s))
      return fail(EINVAL, "qp_attach_comp_cntr: counter %u is being destroyed", s.index);
  }
  if (auto e = on_attach(s, o.op_mask)) {
    if (!have) unref_counter_slot(s);
    return e;
  }
  if (!have) attached_.push_back(&s); // capacity reserved above: cannot throw
  for (unsigned i = 0; i < attach_op_count; ++i)
    if (o.op_mask >> i & 1u) served_[i].store(&s, std::memory_order_release);
  // A waiter asleep on the counter may not know it now depends on this QP's progress source
  // (a wrapped verbs QP's CQ is drained by waiters): wake it so it re-decides (compcntr:slot).
  s.kick();
  return {};
}

std::error_code qp_impl::connect(qp_impl&) noexcept {
  return fail(ENOTSUP, "connect_qp: QP %u is a wrapped verbs QP; connect the ibv_qp yourself",
              qp_num_);
}

std::error_code qp_impl::post_recv(std::uint64_t, void*, std::size_t, std::uint32_t) noexcept {
  return fail(ENOTSUP, "post_recv: QP %u is a wrapped verbs QP; post on the ibv_qp", qp_num_);
}
std::error_code qp_impl::post_send(std::uint64_t, const void*, std::size_t,
                                   std::uint32_t) noexcept {
  return fail(ENOTSUP, "post_send: QP %u is a wrapped verbs QP; post on the ibv_qp", qp_num_);
}
std::error_code qp_impl::post_rdma_write(std::uint64_t, const void*, std::size_t, std::uint32_t,
                                         std::uint64_t, std::uint32_t) noexcept {
  return fail(ENOTSUP, "post_rdma_write: QP %u is a wrapped verbs QP; post on the ibv_qp", qp_num_);
}
std::error_code qp_impl::post_rdma_read(std::uint64_t, void*, std::size_t, std::uint32_t,
                                        std::uint64_t, std::uint32_t) noexcept {
  return fail(ENOTSUP, "post_rdma_read: QP %u is a wrapped verbs QP; post on the ibv_qp", qp_num_);
}

void qp_impl::destroy() noexcept {
  shutdown(); // from here on nobody completes into this QP's counters
  std::vector<slot*> refs;
  {
    std::lock_guard<std::mutex> g(ctl_);
    refs.swap(attached_);
  }
  for (slot* s : refs) unref_counter_slot(*s);
  device_core* dev = dev_;
  delete this;
  dev->release();
}

} // namespace detail

// ---- compcntr::qp ----

namespace {
bool empty_qp(const detail::qp_impl* q, const char* call, std::error_code& ec) noexcept {
  if (q) return false;
  detail::fail_into(ec, EINVAL, "%s: qp is empty", call);
  return true;
}
void assign(std::error_code& ec, std::error_code e) noexcept {
  if (e)
    ec = e;
  else
    ec.clear();
}
} // namespace

void qp::modify(qp_state to, std::error_code& ec) noexcept {
  if (empty_qp(q_, "modify_qp", ec)) return;
  assign(ec, q_->modify(to));
}

void qp::connect(qp& peer, std::error_code& ec) noexcept {
  if (empty_qp(q_, "connect_qp", ec)) return;
  if (!peer.q_) {
    detail::fail_into(ec, EINVAL, "connect_qp: peer qp is empty");
    return;
  }
  assign(ec, q_->connect(*peer.q_));
}

void qp::attach(counter_view c, const attach_options& opts, std::error_code& ec) noexcept {
  if (empty_qp(q_, "qp_attach_comp_cntr", ec)) return;
  if (!c) {
    detail::fail_into(ec, EINVAL, "qp_attach_comp_cntr: counter is empty");
    return;
  }
  assign(ec, q_->attach(*c.native_slot(), opts));
}

void qp::post_recv(std::uint64_t wr_id, void* addr, std::size_t len, std::uint32_t lkey,
                   std::error_code& ec) noexcept {
  if (empty_qp(q_, "post_recv", ec)) return;
  assign(ec, q_->post_recv(wr_id, addr, len, lkey));
}

void qp::post_send(std::uint64_t wr_id, const void* addr, std::size_t len, std::uint32_t lkey,
                   std::error_code& ec) noexcept {
  if (empty_qp(q_, "post_send", ec)) return;
  assign(ec, q_->post_send(wr_id, addr, len, lkey));
}

void qp::post_rdma_write(std::uint64_t wr_id, const void* addr, std::size_t len, std::uint32_t lkey,
                         std::uint64_t remote_addr, std::uint32_t rkey,
                         std::error_code& ec) noexcept {
  if (empty_qp(q_, "post_rdma_write", ec)) return;
  assign(ec, q_->post_rdma_write(wr_id, addr, len, lkey, remote_addr, rkey));
}

void qp::post_rdma_read(std::uint64_t wr_id, void* addr, std::size_t len, std::uint32_t lkey,
                        std::uint64_t remote_addr, std::uint32_t rkey,
                        std::error_code& ec) noexcept {
  if (empty_qp(q_, "post_rdma_read", ec)) return;
  assign(ec, q_->post_rdma_read(wr_id, addr, len, lkey, remote_addr, rkey));
}

void qp::destroy(std::error_code& ec) noexcept {
  if (empty_qp(q_, "destroy_qp", ec)) return;
  reset();
  ec.clear();
}

// ---- device: QPs and memory regions ----

qp device::create_qp(std::error_code& ec) noexcept {
  detail::qp_capability* cap = core_->be().qps();
  if (cap == nullptr) {
    detail::fail_into(ec, ENOTSUP,
                      "create_qp: device '%.*s' has no software QPs; wrap your own "
                      "ibv_qp (wrap_verbs_qp)",
                      static_cast<int>(name().size()), name().data());
    return {};
  }
  detail::qp_impl* q = cap->create_qp(*core_, ec);
  if (!q) return {};
  ec.clear();
  return qp(q);
}

memory_region device::reg_mr(void* addr, std::size_t length, std::uint32_t access,
                             std::error_code& ec) noexcept {
  detail::qp_capability* cap = core_->be().qps();
  if (cap == nullptr) {
    detail::fail_into(ec, ENOTSUP,
                      "reg_mr: device '%.*s' has no software memory registration; "
                      "use ibv_reg_mr",
                      static_cast<int>(name().size()), name().data());
    return {};
  }
  detail::mr_impl* m = cap->reg_mr(*core_, addr, length, access, ec);
  if (!m) return {};
  ec.clear();
  return memory_region(m);
}

qp device::wrap_verbs_qp(ibv_qp* vqp, const verbs_qp_options& opts, std::error_code& ec) noexcept {
  detail::qp_impl* q = detail::wrap_verbs_qp(*core_, vqp, opts, ec);
  if (!q) return {};
  ec.clear();
  return qp(q);
}

} // namespace compcntr
