// ofi_compcntr's endpoints: the records (binds, default flags), the FI_TRIGGER data calls and the
// FI_RMA_EVENT emulation on writes. fi_ep_alias where the provider below has none: alias.cpp.
#include "ofi.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <new>
#include <unordered_map>

namespace compcntr_ofi {

void fill_domain_layer(compcntr_hook::layer_ops& l) noexcept; // domain.cpp
fi_info* lower_info(const fi_info* info);                      // provider.cpp

namespace {

std::unordered_map<fid_ep*, ep_st*>& eps() noexcept {
  static auto* m = new std::unordered_map<fid_ep*, ep_st*>;
  return *m;
}
// Whether any domain emulates FI_RMA_EVENT (the writes of every other program pay one load).
std::atomic<int> g_emulating{0};

// ---- layer_ops: endpoints ----------------------------------------------------------------------

void ep_opened(fid_ep* ep, fid_domain* d, const fi_info* info) {
  domain_st* ds = find_domain(d);
  if (ds == nullptr) return;
  auto* e = new (std::nothrow) ep_st;
  if (e == nullptr) return;
  e->ep = ep;
  e->dom = ds;
  if (info && info->tx_attr) e->tx_op_flags = info->tx_attr->op_flags;
  if (info && info->rx_attr) e->rx_op_flags = info->rx_attr->op_flags;
  std::lock_guard lk(mu());
  try {
    eps()[ep] = e;
    if (ds->emulate_rma_event) {
      g_emulating.fetch_add(1, std::memory_order_relaxed);
      rma_ep_opened(e, info);
    }
  } catch (...) {
    delete e;
  }
}

void ep_bound(fid_ep* ep, fid* bfid, std::uint64_t flags) {
  std::lock_guard lk(mu());
  ep_st* e = find_ep(ep);
  if (e == nullptr || bfid == nullptr) return;
  if (bfid->fclass == FI_CLASS_CQ) {
    auto* cq = reinterpret_cast<fid_cq*>(bfid);
    const bool sel = (flags & FI_SELECTIVE_COMPLETION) != 0;
    if (flags & FI_TRANSMIT) e->tx_cq = cq, e->tx_selective = sel;
    if (flags & FI_RECV) e->rx_cq = cq, e->rx_selective = sel;
  } else if (bfid->fclass == FI_CLASS_CNTR) {
    auto* c = reinterpret_cast<fid_cntr*>(bfid);
    if (flags & FI_SEND) e->cntr_send = c;
    if (flags & FI_RECV) e->cntr_recv = c;
    if (flags & FI_WRITE) e->cntr_write = c;
    if (flags & FI_READ) e->cntr_read = c;
    if (flags & FI_REMOTE_WRITE) e->cntr_rwrite = c;
    if (flags & FI_REMOTE_READ) e->cntr_rread = c;
  } else if (bfid->fclass == FI_CLASS_AV) {
    e->av = reinterpret_cast<fid_av*>(bfid);
  }
}

void ep_closing(fid_ep* ep) {
  drop_items(nullptr, ep);
  std::lock_guard lk(mu());
  auto it = eps().find(ep);
  if (it == eps().end()) return;
  if (it->second->dom->emulate_rma_event) g_emulating.fetch_sub(1, std::memory_order_relaxed);
  rma_ep_closing(it->second);
  delete it->second;
  eps().erase(it);
}

int ep_control_refused(fid* f, int command, void* arg, int r) {
  if (command == FI_ALIAS && (r == -FI_ENOSYS || r == -FI_EOPNOTSUPP || r == -FI_EINVAL) &&
      find_ep(reinterpret_cast<fid_ep*>(f)) != nullptr)
    return make_alias(reinterpret_cast<fid_ep*>(f), static_cast<struct fi_alias*>(arg));
  return r;
}

const fi_triggered_context* trig_ctx(void* context) noexcept {
  return static_cast<const fi_triggered_context*>(context);
}

ssize_t l_sendmsg(fid_ep* ep, const fi_msg* msg, std::uint64_t flags, bool tagged,
                  const fi_msg_tagged* tmsg) {
  if ((tagged ? (const void*)tmsg : (const void*)msg) == nullptr) return -FI_EINVAL;
  void* ctx = tagged ? tmsg->context : msg->context;
  return arm_msg(ep, msg, tmsg, flags & ~FI_TRIGGER, false, trig_ctx(ctx));
}
ssize_t l_recvmsg(fid_ep* ep, const fi_msg* msg, std::uint64_t flags, bool tagged,
                  const fi_msg_tagged* tmsg) {
  if ((tagged ? (const void*)tmsg : (const void*)msg) == nullptr) return -FI_EINVAL;
  void* ctx = tagged ? tmsg->context : msg->context;
  return arm_msg(ep, msg, tmsg, flags & ~FI_TRIGGER, true, trig_ctx(ctx));
}
ssize_t l_rmamsg(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags, bool write) {
  if (msg == nullptr) return -FI_EINVAL;
  if (flags == ~std::uint64_t{0} || !(flags & FI_TRIGGER)) { // an emulating endpoint's write
    std::uint64_t f = flags;
    if (flags == ~std::uint64_t{0}) {
      std::lock_guard lk(mu());
      ep_st* e = find_ep(ep);
      f = e ? e->tx_op_flags & (FI_COMPLETION | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE |
                                FI_DELIVERY_COMPLETE | FI_FENCE)
            : 0;
    }
    return write ? post_writemsg(ep, msg, f) : post_readmsg(ep, msg, f);
  }
  return arm_rma(ep, msg, flags & ~FI_TRIGGER, write, trig_ctx(msg->context));
}
ssize_t l_atomicmsg(fid_ep* ep, const fi_msg_atomic* msg, const fi_ioc* comparev,
                    void** compare_desc, size_t compare_count, fi_ioc* resultv, void** result_desc,
                    size_t result_count, std::uint64_t flags, int kind) {
  if (msg == nullptr) return -FI_EINVAL;
  return arm_atomic(ep, msg, comparev, compare_desc, compare_count, resultv, result_desc,
                    result_count, flags & ~FI_TRIGGER, kind, trig_ctx(msg->context));
}
int l_cntr_closing(fid_cntr* c) {
  const int r = cntr_closing(c);
  if (r == 0) rma_cntr_closed(c);
  return r;
}
bool l_emulates(fid_ep* ep) {
  if (g_emulating.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard lk(mu());
  ep_st* e = find_ep(ep);
  return e != nullptr && e->dom->emulate_rma_event;
}

} // namespace

ep_st* find_ep(fid_ep* ep) noexcept {
  std::lock_guard lk(mu());
  auto it = eps().find(ep);
  return it == eps().end() ? nullptr : it->second;
}

std::vector<ep_st*> eps_of(domain_st* d) noexcept {
  std::vector<ep_st*> v;
  std::lock_guard lk(mu());
  for (auto& [ep, e] : eps())
    if (e->dom == d) {
      try {
        v.push_back(e);
      } catch (...) {
      }
    }
  return v;
}

using compcntr_hook::orig_of;

ssize_t post_sendmsg(fid_ep* ep, const fi_msg* msg, std::uint64_t flags) noexcept {
  return orig_of(ep->msg)->sendmsg(ep, msg, flags);
}
ssize_t post_recvmsg(fid_ep* ep, const fi_msg* msg, std::uint64_t flags) noexcept {
  return orig_of(ep->msg)->recvmsg(ep, msg, flags);
}
ssize_t post_tsendmsg(fid_ep* ep, const fi_msg_tagged* msg, std::uint64_t flags) noexcept {
  return orig_of(ep->tagged)->sendmsg(ep, msg, flags);
}
ssize_t post_trecvmsg(fid_ep* ep, const fi_msg_tagged* msg, std::uint64_t flags) noexcept {
  return orig_of(ep->tagged)->recvmsg(ep, msg, flags);
}
// A write on an endpoint whose domain emulates FI_RMA_EVENT carries rma_event_data(its first
// key) as remote CQ data (unless it has data of its own): the target's provider counts it on its
// FI_REMOTE_WRITE counter, and the target's layer drops its CQ entry (cq.cpp), counting the
// counters bound to the memory region of that key (rma_event.cpp).
ssize_t post_writemsg(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags) noexcept {
  if (!(flags & FI_REMOTE_CQ_DATA) && l_emulates(ep)) {
    fi_msg_rma m = *msg;
    m.data = rma_event_data(msg->rma_iov_count > 0 && msg->rma_iov ? msg->rma_iov[0].key : 0);
    return orig_of(ep->rma)->writemsg(ep, &m, flags | FI_REMOTE_CQ_DATA);
  }
  return orig_of(ep->rma)->writemsg(ep, msg, flags);
}
// A read on such an endpoint is followed to its completion, which sends the target the
// notification its FI_REMOTE_READ counter counts (rma_event.cpp).
ssize_t post_readmsg(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags) noexcept {
  if (l_emulates(ep)) return read_counted(ep, msg, flags);
  return orig_of(ep->rma)->readmsg(ep, msg, flags);
}
ssize_t post_atomicmsg(fid_ep* ep, const fi_msg_atomic* msg, const fi_ioc* comparev,
                       void** compare_desc, size_t compare_count, fi_ioc* resultv,
                       void** result_desc, size_t result_count, std::uint64_t flags,
                       int kind) noexcept {
  const fi_ops_atomic* o = orig_of(ep->atomic);
  if (kind == 0) return o->writemsg(ep, msg, flags);
  if (kind == 1) return o->readwritemsg(ep, msg, resultv, result_desc, result_count, flags);
  return o->compwritemsg(ep, msg, comparev, compare_desc, compare_count, resultv, result_desc,
                         result_count, flags);
}

void fill_layer(compcntr_hook::layer_ops& l) noexcept {
  l.lower_info = lower_info;
  fill_domain_layer(l);
  l.ep_opened = ep_opened;
  l.ep_bound = ep_bound;
  l.ep_closing = ep_closing;
  l.ep_control_refused = ep_control_refused;
  l.sendmsg = l_sendmsg;
  l.recvmsg = l_recvmsg;
  l.rmamsg = l_rmamsg;
  l.atomicmsg = l_atomicmsg;
  l.emulates_rma_event = l_emulates;
  l.mr_opened = rma_mr_opened;
  l.mr_closing = rma_mr_closing;
  l.mr_bind = rma_mr_bind;
  l.cntr_closing = l_cntr_closing;
  l.progress = progress;
  l.busy = busy;
}

} // namespace compcntr_ofi
