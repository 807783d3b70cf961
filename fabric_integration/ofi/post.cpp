// ofi_compcntr: posting due armed operations to the provider below (in the order compcntr made
// them due) and accounting for their completions (cq.cpp hands them here). Arming: trigger.cpp.
#include "trigger_item.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <algorithm>
#include <cstring>

namespace compcntr_ofi {

fid_cq* cq_of(item* it, ep_st* e) noexcept {
  return (it->kind == k_recv || it->kind == k_trecv) ? e->rx_cq : e->tx_cq;
}

namespace {

fid_cntr* cntr_of(item* it, ep_st* e) noexcept {
  switch (it->kind) {
    case k_send:
    case k_tsend: return e->cntr_send;
    case k_recv:
    case k_trecv: return e->cntr_recv;
    case k_write:
    case k_atomic: return e->cntr_write;
    case k_read: return e->cntr_read;
    default: return nullptr;
  }
}
bool app_wants_entry(item* it, ep_st* e) noexcept {
  const bool rx = it->kind == k_recv || it->kind == k_trecv;
  return !(rx ? e->rx_selective : e->tx_selective) || (it->flags & FI_COMPLETION);
}

} // namespace

// Posts one due item. -FI_EAGAIN: try again at the next progress call (nothing changed).
ssize_t post(item* it) noexcept {
  if (it->kind == k_cntr_add || it->kind == k_cntr_set) {
    const int r = it->kind == k_cntr_add ? fi_cntr_add(it->target, it->value)
                                         : fi_cntr_set(it->target, it->value);
    if (r == 0 && it->completion) fi_cntr_add(it->completion, 1);
    it->state = s_done;
    return r == -FI_EAGAIN ? 0 : r;
  }
  ep_st* e = find_ep(it->ep);
  // Deferred work with a completion counter is posted with the item as its context and
  // FI_COMPLETION: its completion entry (cq.cpp) counts the counter and goes on to the
  // application with the application's context, if it asked for one.
  fid_cq* const ecq = e != nullptr ? cq_of(it, e) : nullptr;
  const bool track = it->completion != nullptr && ecq != nullptr;
  // Room for the error entry of a refusal, and the item known as a context, before the
  // provider sees the operation: neither can fail after it (-FI_EAGAIN: nothing posted).
  if (ecq != nullptr && !cq_reserve_error(ecq)) return -FI_EAGAIN;
  if (track && !inflight_add(it)) {
    cq_unreserve_error(ecq);
    return -FI_EAGAIN;
  }
  void* ctx = track ? static_cast<void*>(it) : it->context;
  const std::uint64_t flags = track ? (it->flags | FI_COMPLETION) : it->flags;
  ssize_t r;
  switch (it->kind) {
    case k_send:
    case k_recv: {
      fi_msg m{it->iov.data(), it->desc.data(), it->iov.size(), it->addr, ctx, it->data};
      r = it->kind == k_send ? post_sendmsg(it->ep, &m, flags) : post_recvmsg(it->ep, &m, flags);
      break;
    }
    case k_tsend:
    case k_trecv: {
      fi_msg_tagged m{
          it->iov.data(), it->desc.data(), it->iov.size(), it->addr, it->tag, it->ignore, ctx,
          it->data};
      r = it->kind == k_tsend ? post_tsendmsg(it->ep, &m, flags) : post_trecvmsg(it->ep, &m, flags);
      break;
    }
    case k_write:
    case k_read: {
      fi_msg_rma m{it->iov.data(),
                   it->desc.data(),
                   it->iov.size(),
                   it->addr,
                   it->riov.data(),
                   it->riov.size(),
                   ctx,
                   it->data};
      r = it->kind == k_write ? post_writemsg(it->ep, &m, flags) : post_readmsg(it->ep, &m, flags);
      break;
    }
    default: {
      fi_msg_atomic m{it->ioc.data(),  it->desc.data(), it->ioc.size(), it->addr, it->rioc.data(),
                      it->rioc.size(), fi_datatype{},   fi_op{},        ctx,      it->data};
      std::memcpy(&m.datatype, &it->dt, sizeof m.datatype);
      std::memcpy(&m.op, &it->op, sizeof m.op);
      r = post_atomicmsg(it->ep, &m, it->cmp.data(), it->cmp_desc.data(), it->cmp.size(),
                         it->res.data(), it->res_desc.data(), it->res.size(), flags,
                         it->atomic_kind);
      break;
    }
  }
  if (r != 0 && track) inflight_remove(it);
  if (r == 0 || r == -FI_EAGAIN) {
    if (ecq != nullptr) cq_unreserve_error(ecq);
  }
  if (r == -FI_EAGAIN) return r;
  if (r != 0) {
    // The provider refused the operation: it completes with an error entry on the
    // endpoint's CQ (as the provider reports errors: the application's context, -r as err)
    // and an error on the endpoint's counter of that kind and on the completion counter.
    FI_WARN(&compcntr_hook::self(), FI_LOG_EP_DATA,
            "a triggered operation was refused by the provider below: %s\n",
            fi_strerror(static_cast<int>(-r)));
    if (ecq != nullptr) cq_push_error(ecq, it->context, 0, static_cast<int>(-r));
    if (e != nullptr)
      if (fid_cntr* c = cntr_of(it, e)) fi_cntr_adderr(c, 1);
    if (it->completion) fi_cntr_adderr(it->completion, 1);
    it->state = s_done;
    return 0;
  }
  if (track) {
    it->state = s_inflight;
  } else {
    if (it->completion) fi_cntr_add(it->completion, 1); // no CQ to see the completion on
    it->state = s_done;
  }
  return 0;
}

void post_ready() noexcept {
  std::lock_guard lk(mu());
  for (domain_st* d : domains()) {
    while (!d->ready.empty()) {
      item* it = d->ready.front();
      if (post(it) == -FI_EAGAIN) break; // keeps the order: the rest waits behind it
      d->ready.pop_front();
      if (it->state == s_done) finish(it);
    }
  }
}

void inflight_cqs(std::vector<fid_cq*>& out) noexcept {
  std::lock_guard lk(mu());
  out.clear();
  for (domain_st* d : domains())
    for (item* it : d->items)
      if (it->state == s_inflight)
        if (ep_st* e = find_ep(it->ep))
          if (fid_cq* cq = cq_of(it, e); cq && std::find(out.begin(), out.end(), cq) == out.end()) {
            try {
              out.push_back(cq);
            } catch (...) {
            }
          }
}

void* item_completed(item* it, bool error, bool* app_wants) noexcept {
  std::lock_guard lk(mu());
  void* ctx = it->context;
  ep_st* e = find_ep(it->ep);
  *app_wants = e == nullptr || app_wants_entry(it, e) || error;
  if (it->completion) {
    if (error)
      fi_cntr_adderr(it->completion, 1);
    else
      fi_cntr_add(it->completion, 1);
  }
  it->state = s_done;
  finish(it);
  return ctx;
}

} // namespace compcntr_ofi
