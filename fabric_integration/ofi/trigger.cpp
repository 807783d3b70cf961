// ofi_compcntr's armed operations: an FI_TRIGGER data call or an FI_QUEUE_WORK item is copied
// (the application's message, iovecs and descriptors may be gone when it fires), armed as a
// compcntr trigger (COMPCNTR_TRIGGER_DEFERRED) on the compcntr counter behind the triggering
// counter, and posted to the provider below from a progress call (cntr.cpp) once due -- in the
// order compcntr makes them due: per counter, threshold order, equal thresholds in arming order.
// Posting (post.cpp) and the item (trigger_item.hpp) are apart.
#include "trigger_item.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace compcntr_ofi {

namespace {

template <class T>
std::vector<T> copy(const T* p, std::size_t n) {
  return p && n ? std::vector<T>(p, p + n) : std::vector<T>(n);
}

// The action of every armed item: runs in compcntr_trigger_progress (a progress call of ours,
// never the provider's own callbacks), under mu(). Due items are posted in this order.
void fire(void* ctx, int status) {
  auto* it = static_cast<item*>(ctx);
  std::lock_guard lk(mu());
  if (status != 0) { // cancelled (flush, cancel, the counter destroyed)
    it->state = s_done;
    return;
  }
  it->state = s_due;
  try {
    it->dom->ready.push_back(it);
  } catch (...) {
    FI_WARN(&compcntr_hook::self(), FI_LOG_EP_DATA,
            "out of memory: a due triggered operation is dropped\n");
    it->state = s_done;
  }
}

hook_cntr* hook_of(fid_cntr* c) noexcept {
  return c ? compcntr_hook::as_hook_cntr(&c->fid) : nullptr;
}

// Arms `it` on counter c at threshold; takes ownership of it.
int arm(item* it, fid_cntr* c, std::uint64_t threshold) {
  hook_cntr* h = hook_of(c);
  if (h == nullptr || it->dom == nullptr) {
    delete it;
    return -FI_EINVAL;
  }
  it->trig_cntr = h;
  std::lock_guard lk(mu());
  try {
    it->dom->items.push_back(it);
  } catch (...) {
    delete it;
    return -FI_ENOMEM;
  }
  active().fetch_add(1, std::memory_order_acq_rel);
  it->trig = compcntr_trigger_arm(compcntr_hook::comp_of(h), threshold, fire, it,
                                  COMPCNTR_TRIGGER_DEFERRED);
  if (it->trig == nullptr) {
    const int e = errno;
    it->dom->items.pop_back();
    active().fetch_sub(1, std::memory_order_acq_rel);
    delete it;
    return e == ENOMEM ? -FI_ENOMEM : -FI_EINVAL;
  }
  return 0;
}

domain_st* dom_of_ep(fid_ep* ep) noexcept {
  std::lock_guard lk(mu());
  ep_st* e = find_ep(base_ep(ep));
  return e ? e->dom : nullptr;
}

int check_ctx(const fi_triggered_context* tc) noexcept {
  if (tc == nullptr) return -FI_EINVAL;
  if (raw_enum(tc->event_type) != FI_TRIGGER_THRESHOLD) return -FI_ENOSYS;
  if (hook_of(tc->trigger.threshold.cntr) == nullptr) return -FI_EINVAL;
  return 0;
}

void fill_msg(item* it, const iovec* iov, void** desc, std::size_t n) {
  it->iov = copy(iov, n);
  it->desc = copy(desc, n);
}
// An fi_msg / fi_msg_tagged copied into an item (FI_TRIGGER posts and deferred work alike).
void fill_msg_item(item* it, const fi_msg& m, bool recv) {
  it->kind = recv ? k_recv : k_send;
  fill_msg(it, m.msg_iov, m.desc, m.iov_count);
  it->addr = m.addr;
  it->context = m.context;
  it->data = m.data;
}
void fill_tagged_item(item* it, const fi_msg_tagged& m, bool recv) {
  it->kind = recv ? k_trecv : k_tsend;
  fill_msg(it, m.msg_iov, m.desc, m.iov_count);
  it->addr = m.addr;
  it->context = m.context;
  it->data = m.data;
  it->tag = m.tag;
  it->ignore = m.ignore;
}

} // namespace

// Finished: the trigger destroyed, the item freed (under mu(); never inside fire()).
void finish(item* it) noexcept {
  if (it->state == s_inflight) inflight_remove(it);
  it->dom->items.remove(it);
  if (it->trig) compcntr_trigger_destroy(it->trig);
  active().fetch_sub(1, std::memory_order_acq_rel);
  delete it;
}

ssize_t arm_msg(fid_ep* ep, const fi_msg* msg, const fi_msg_tagged* tmsg, std::uint64_t flags,
                bool recv, const fi_triggered_context* tc) {
  if (const int r = check_ctx(tc)) return r;
  auto* it = new (std::nothrow) item;
  if (it == nullptr) return -FI_ENOMEM;
  try {
    if (tmsg)
      fill_tagged_item(it, *tmsg, recv);
    else
      fill_msg_item(it, *msg, recv);
  } catch (...) {
    delete it;
    return -FI_ENOMEM;
  }
  it->ep = base_ep(ep);
  it->dom = dom_of_ep(ep);
  it->flags = flags;
  return arm(it, tc->trigger.threshold.cntr, tc->trigger.threshold.threshold);
}

namespace {
void fill_rma_item(item* it, const fi_msg_rma* msg, bool write) {
  it->kind = write ? k_write : k_read;
  fill_msg(it, msg->msg_iov, msg->desc, msg->iov_count);
  it->riov = copy(msg->rma_iov, msg->rma_iov_count);
  it->addr = msg->addr;
  it->context = msg->context;
  it->data = msg->data;
}
void fill_atomic_item(item* it, const fi_msg_atomic* msg, const fi_ioc* comparev,
                      void** compare_desc, size_t compare_count, fi_ioc* resultv,
                      void** result_desc, size_t result_count, int kind) {
  it->kind = k_atomic;
  it->atomic_kind = kind;
  it->ioc = copy(msg->msg_iov, msg->iov_count);
  it->desc = copy(msg->desc, msg->iov_count);
  it->rioc = copy(msg->rma_iov, msg->rma_iov_count);
  it->addr = msg->addr;
  it->dt = raw_enum(msg->datatype); // passed on as the application gave them
  it->op = raw_enum(msg->op);
  it->context = msg->context;
  it->data = msg->data;
  if (kind >= 1) {
    it->res = copy(resultv, result_count);
    it->res_desc = copy(result_desc, result_count);
  }
  if (kind == 2) {
    it->cmp = copy(comparev, compare_count);
    it->cmp_desc = copy(compare_desc, compare_count);
  }
}
} // namespace

ssize_t arm_rma(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags, bool write,
                const fi_triggered_context* tc) {
  if (const int r = check_ctx(tc)) return r;
  auto* it = new (std::nothrow) item;
  if (it == nullptr) return -FI_ENOMEM;
  try {
    fill_rma_item(it, msg, write);
  } catch (...) {
    delete it;
    return -FI_ENOMEM;
  }
  it->ep = base_ep(ep);
  it->dom = dom_of_ep(ep);
  it->flags = flags;
  return arm(it, tc->trigger.threshold.cntr, tc->trigger.threshold.threshold);
}

ssize_t arm_atomic(fid_ep* ep, const fi_msg_atomic* msg, const fi_ioc* comparev,
                   void** compare_desc, size_t compare_count, fi_ioc* resultv, void** result_desc,
                   size_t result_count, std::uint64_t flags, int kind,
                   const fi_triggered_context* tc) {
  if (const int r = check_ctx(tc)) return r;
  auto* it = new (std::nothrow) item;
  if (it == nullptr) return -FI_ENOMEM;
  try {
    fill_atomic_item(it, msg, comparev, compare_desc, compare_count, resultv, result_desc,
                     result_count, kind);
  } catch (...) {
    delete it;
    return -FI_ENOMEM;
  }
  it->ep = base_ep(ep);
  it->dom = dom_of_ep(ep);
  it->flags = flags;
  return arm(it, tc->trigger.threshold.cntr, tc->trigger.threshold.threshold);
}

int queue_work(domain_st* ds, const fi_deferred_work* w) {
  if (hook_of(w->triggering_cntr) == nullptr) return -FI_EINVAL;
  if (w->completion_cntr != nullptr && hook_of(w->completion_cntr) == nullptr) return -FI_EINVAL;
  auto* it = new (std::nothrow) item;
  if (it == nullptr) return -FI_ENOMEM;
  it->dom = ds;
  it->work = w;
  it->completion = w->completion_cntr;
  fid_ep* ep = nullptr;
  try {
    switch (raw_enum(w->op_type)) {
      case FI_OP_RECV:
      case FI_OP_SEND: {
        const fi_op_msg* o = w->op.msg;
        if (o == nullptr) throw -FI_EINVAL;
        fill_msg_item(it, o->msg, w->op_type == FI_OP_RECV);
        it->flags = o->flags;
        ep = o->ep;
        break;
      }
      case FI_OP_TRECV:
      case FI_OP_TSEND: {
        const fi_op_tagged* o = w->op.tagged;
        if (o == nullptr) throw -FI_EINVAL;
        fill_tagged_item(it, o->msg, w->op_type == FI_OP_TRECV);
        it->flags = o->flags;
        ep = o->ep;
        break;
      }
      case FI_OP_READ:
      case FI_OP_WRITE: {
        const fi_op_rma* o = w->op.rma;
        if (o == nullptr) throw -FI_EINVAL;
        fill_rma_item(it, &o->msg, w->op_type == FI_OP_WRITE);
        it->flags = o->flags;
        ep = o->ep;
        break;
      }
      case FI_OP_ATOMIC: {
        const fi_op_atomic* o = w->op.atomic;
        if (o == nullptr) throw -FI_EINVAL;
        fill_atomic_item(it, &o->msg, nullptr, nullptr, 0, nullptr, nullptr, 0, 0);
        it->flags = o->flags;
        ep = o->ep;
        break;
      }
      case FI_OP_FETCH_ATOMIC: {
        const fi_op_fetch_atomic* o = w->op.fetch_atomic;
        if (o == nullptr) throw -FI_EINVAL;
        fill_atomic_item(it, &o->msg, nullptr, nullptr, 0, o->fetch.msg_iov, o->fetch.desc,
                         o->fetch.iov_count, 1);
        it->flags = o->flags;
        ep = o->ep;
        break;
      }
      case FI_OP_COMPARE_ATOMIC: {
        const fi_op_compare_atomic* o = w->op.compare_atomic;
        if (o == nullptr) throw -FI_EINVAL;
        fill_atomic_item(it, &o->msg, o->compare.msg_iov, o->compare.desc, o->compare.iov_count,
                         o->fetch.msg_iov, o->fetch.desc, o->fetch.iov_count, 2);
        it->flags = o->flags;
        ep = o->ep;
        break;
      }
      case FI_OP_CNTR_SET:
      case FI_OP_CNTR_ADD: {
        const fi_op_cntr* o = w->op.cntr;
        if (o == nullptr || hook_of(o->cntr) == nullptr) throw -FI_EINVAL;
        it->kind = w->op_type == FI_OP_CNTR_ADD ? k_cntr_add : k_cntr_set;
        it->target = o->cntr;
        it->value = o->value;
        break;
      }
      default: throw -FI_ENOSYS;
    }
  } catch (int e) {
    delete it;
    return e;
  } catch (...) {
    delete it;
    return -FI_ENOMEM;
  }
  if (ep != nullptr) {
    it->ep = base_ep(ep);
    if (dom_of_ep(ep) != ds) { // an endpoint of another domain, or not one of ours
      delete it;
      return -FI_EINVAL;
    }
  }
  it->flags &= ~FI_TRIGGER;
  return arm(it, w->triggering_cntr, w->threshold);
}

int cancel_work(domain_st* ds, const fi_deferred_work* w) {
  std::lock_guard lk(mu());
  int found = 0, cancelled = 0;
  for (auto i = ds->items.begin(); i != ds->items.end();) {
    item* it = *i++;
    if (it->work != w) continue;
    ++found;
    if (it->state == s_armed) {
      if (compcntr_trigger_cancel(it->trig) == 0) ++cancelled; // fire() ran with ECANCELED
    } else if (it->state == s_due) {
      ds->ready.erase(std::find(ds->ready.begin(), ds->ready.end(), it));
      it->state = s_done;
      ++cancelled;
    }
    if (it->state == s_done) finish(it);
  }
  if (found == 0) return -FI_ENOENT;
  return cancelled ? 0 : -FI_EALREADY;
}

int flush_work(domain_st* ds) {
  std::lock_guard lk(mu());
  for (auto i = ds->items.begin(); i != ds->items.end();) {
    item* it = *i++;
    if (it->state == s_armed) compcntr_trigger_cancel(it->trig);
    if (it->state == s_due) it->state = s_done;
    if (it->state == s_done) finish(it);
  }
  ds->ready.clear();
  return 0;
}

void drop_items(domain_st* ds, fid_ep* ep) noexcept {
  std::lock_guard lk(mu());
  for (domain_st* d : domains()) {
    if (ds != nullptr && d != ds) continue;
    for (auto i = d->items.begin(); i != d->items.end();) {
      item* it = *i++;
      if (ep != nullptr && it->ep != ep) continue;
      if (it->state == s_armed) compcntr_trigger_cancel(it->trig);
      if (it->state == s_due) {
        d->ready.erase(std::find(d->ready.begin(), d->ready.end(), it));
        it->state = s_done;
      }
      // in flight: its completion will not come (the endpoint or domain closes)
      finish(it);
    }
  }
}

// A counter armed work would still write (post: fi_cntr_add/set of the target, the completion
// counter's count) must outlive that work: its fi_close is -FI_EBUSY meanwhile, as compcntr
// refuses to destroy a trigger's target and libfabric a counter bound to an endpoint (issue 22,
// fuzz_fi_ofi: the work posted to the freed counter). Its triggering counter may close: that
// cancels the work (compcntr cancels the counter's triggers), which then never runs.
int cntr_closing(fid_cntr* c) noexcept {
  std::lock_guard lk(mu());
  for (domain_st* d : domains())
    for (item* it : d->items)
      if (it->state != s_done && (it->target == c || it->completion == c)) return -FI_EBUSY;
  return 0;
}

void armed_counters(std::vector<hook_cntr*>& out, const hook_cntr* pulled) noexcept {
  std::lock_guard lk(mu());
  out.clear();
  auto add = [&](hook_cntr* h) noexcept {
    if (h == nullptr || std::find(out.begin(), out.end(), h) != out.end()) return;
    try {
      out.push_back(h);
    } catch (...) {
    }
  };
  for (domain_st* d : domains()) {
    if (d->items.empty()) continue;
    for (item* it : d->items)
      if (it->state == s_armed) add(it->trig_cntr);
    // A triggering counter no endpoint is bound to (fabtests' test counter, a counter only
    // fi_cntr_add moves) drives no endpoint when pulled: one counter bound to each endpoint of
    // the domain is pulled too, so the provider moves the data that makes the triggers due. One
    // is enough (a provider read progresses the endpoints the counter is bound to), and none
    // where a counter pulled anyway (a triggering one, or the caller's `pulled`) is bound: on
    // tcp;ofi_rxm each provider read is a progress call with poll system calls (P17 (b)).
    for (ep_st* e : eps_of(d)) {
      hook_cntr* first = nullptr;
      bool covered = false;
      for (fid_cntr* c : {e->cntr_send, e->cntr_recv, e->cntr_write, e->cntr_read, e->cntr_rwrite,
                          e->cntr_rread}) {
        hook_cntr* h = c != nullptr ? hook_of(c) : nullptr;
        if (h == nullptr) continue;
        if (h == pulled || std::find(out.begin(), out.end(), h) != out.end()) {
          covered = true;
          break;
        }
        if (first == nullptr) first = h;
      }
      if (!covered) add(first);
    }
  }
}

} // namespace compcntr_ofi
