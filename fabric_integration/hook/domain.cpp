// The hook on domains: endpoint, endpoint2, scalable_ep, srx_ctx (install on the endpoints),
// poll_open (on poll sets), cntr_open (hook counters, hook_cntr.cpp), the MR calls (mr.cpp),
// fid close (records) and control (FI_QUEUE_WORK: the work's counters translated); for
// ofi_compcntr also cq_open. thread_safe_info: what a domain or endpoint of the progress thread
// is opened with.
#include "patch.hpp"

#include <rdma/fi_trigger.h>

#include <cstdint>

namespace compcntr_hook {
using namespace patching;
namespace {

// fi_control(domain, FI_QUEUE_WORK, work): the triggering and completion counters are
// translated for the call (the provider copies them into work->context: sockets). The counter
// of an FI_OP_CNTR_ADD/SET work item is left alone: the provider applies it later through
// fi_cntr_add/fi_cntr_set, which a hook counter serves.
class work_swap {
 public:
  explicit work_swap(fi_deferred_work* w) noexcept : w_(w) {
    if (w_ == nullptr) return;
    trig_ = w_->triggering_cntr;
    comp_ = w_->completion_cntr;
    bool any = false;
    if (trig_ != nullptr)
      if (hook_cntr* h = as_hook_cntr(&trig_->fid)) w_->triggering_cntr = hidden_of(h), any = true;
    if (comp_ != nullptr)
      if (hook_cntr* h = as_hook_cntr(&comp_->fid)) w_->completion_cntr = hidden_of(h), any = true;
    if (any) stats().work_translated.fetch_add(1, std::memory_order_relaxed);
  }
  ~work_swap() {
    if (w_ == nullptr) return;
    w_->triggering_cntr = trig_;
    w_->completion_cntr = comp_;
  }
  work_swap(const work_swap&) = delete;
  work_swap& operator=(const work_swap&) = delete;

 private:
  fi_deferred_work* w_;
  fid_cntr* trig_ = nullptr;
  fid_cntr* comp_ = nullptr;
};

fid_domain* dom_of(fid* f) noexcept { return reinterpret_cast<fid_domain*>(f); }

int dom_close(fid* f) {
  if (const layer_ops* l = layer()) l->domain_closing(dom_of(f));
  const int r = orig_of(f->ops)->close(f);
  if (r == 0) forget_domain(dom_of(f));
  return r;
}
int dom_control(fid* f, int command, void* arg) {
  const fi_ops* orig = orig_of(f->ops);
  if (const layer_ops* l = layer()) return l->domain_control(f, command, arg, orig);
  if (command == FI_QUEUE_WORK && arg != nullptr) {
    work_swap s(static_cast<fi_deferred_work*>(arg));
    return orig->control(f, command, arg);
  }
  return orig->control(f, command, arg);
}
void fill_domain_fid(fi_ops& t, std::size_t size) {
  if (HOOK_HAS(fi_ops, close, size) && t.close) t.close = dom_close;
  if (HOOK_HAS(fi_ops, control, size) && t.control) t.control = dom_control;
}

bool trig_tx(const fi_info* info) noexcept {
  return info && info->tx_attr && (info->tx_attr->op_flags & FI_TRIGGER);
}
bool trig_rx(const fi_info* info) noexcept {
  return info && info->rx_attr && (info->rx_attr->op_flags & FI_TRIGGER);
}

void ep_opened(fid_ep* ep, fid_domain* d, const fi_info* info) noexcept {
  if (const layer_ops* l = layer()) l->ep_opened(ep, d, info);
}

int dom_endpoint(fid_domain* d, fi_info* app_info, fid_ep** ep, void* context) {
  lower_info_t low;
  fi_info* info = low.get(app_info);
  fi_info* safe = thread_safe_info(info);
  int r = orig_of(d->ops)->endpoint(d, safe ? safe : info, ep, context);
  if (r != 0 && safe != nullptr) r = orig_of(d->ops)->endpoint(d, info, ep, context);
  fi_freeinfo(safe);
  if (r == 0 && ep && *ep)
    install_ep(*ep, trig_tx(info), trig_rx(info)), ep_opened(*ep, d, app_info);
  return r;
}
int dom_endpoint2(fid_domain* d, fi_info* app_info, fid_ep** ep, std::uint64_t flags,
                  void* context) {
  lower_info_t low;
  fi_info* info = low.get(app_info);
  fi_info* safe = thread_safe_info(info);
  int r = orig_of(d->ops)->endpoint2(d, safe ? safe : info, ep, flags, context);
  if (r != 0 && safe != nullptr) r = orig_of(d->ops)->endpoint2(d, info, ep, flags, context);
  fi_freeinfo(safe);
  if (r == 0 && ep && *ep)
    install_ep(*ep, trig_tx(info), trig_rx(info)), ep_opened(*ep, d, app_info);
  return r;
}
int dom_scalable_ep(fid_domain* d, fi_info* app_info, fid_ep** sep, void* context) {
  lower_info_t low;
  fi_info* info = low.get(app_info);
  const int r = orig_of(d->ops)->scalable_ep(d, info, sep, context);
  if (r == 0 && sep && *sep) install_ep(*sep, trig_tx(info), trig_rx(info));
  return r;
}
int dom_srx_ctx(fid_domain* d, fi_rx_attr* attr, fid_ep** rx, void* context) {
  const int r = orig_of(d->ops)->srx_ctx(d, attr, rx, context);
  if (r == 0 && rx && *rx) install_ep(*rx, false, attr && (attr->op_flags & FI_TRIGGER));
  return r;
}
int dom_poll_open(fid_domain* d, fi_poll_attr* attr, fid_poll** p) {
  const int r = orig_of(d->ops)->poll_open(d, attr, p);
  if (r == 0 && p && *p) install_poll(*p);
  return r;
}
int dom_cntr_open(fid_domain* d, fi_cntr_attr* attr, fid_cntr** cntr, void* context) {
  return cntr_open(d, attr, cntr, context);
}
int dom_cq_open(fid_domain* d, fi_cq_attr* attr, fid_cq** cq, void* context) {
  return layer()->cq_open(d, attr, cq, context, orig_of(d->ops));
}
void fill_domain(fi_ops_domain& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_domain, endpoint, size) && t.endpoint) t.endpoint = dom_endpoint;
  if (HOOK_HAS(fi_ops_domain, scalable_ep, size) && t.scalable_ep) t.scalable_ep = dom_scalable_ep;
  if (HOOK_HAS(fi_ops_domain, cntr_open, size) && t.cntr_open) t.cntr_open = dom_cntr_open;
  if (HOOK_HAS(fi_ops_domain, poll_open, size) && t.poll_open) t.poll_open = dom_poll_open;
  if (HOOK_HAS(fi_ops_domain, srx_ctx, size) && t.srx_ctx) t.srx_ctx = dom_srx_ctx;
  if (HOOK_HAS(fi_ops_domain, endpoint2, size) && t.endpoint2) t.endpoint2 = dom_endpoint2;
  if (layer() && HOOK_HAS(fi_ops_domain, cq_open, size) && t.cq_open) t.cq_open = dom_cq_open;
}

} // namespace

// Endpoints of a domain with the progress thread need FI_THREAD_SAFE (the thread drives them
// while the application calls them); install_domain records whether the domain got it.
fi_info* thread_safe_info(const fi_info* info) noexcept {
  if (!cfg().progress_thread || info == nullptr || info->domain_attr == nullptr ||
      info->domain_attr->threading == FI_THREAD_SAFE)
    return nullptr;
  fi_info* dup = fi_dupinfo(info);
  if (dup != nullptr) dup->domain_attr->threading = FI_THREAD_SAFE;
  return dup;
}

void install_domain(fid_domain* d, fabric_state* fs) noexcept {
  auto ds = std::unique_ptr<domain_state>(new (std::nothrow) domain_state);
  if (!ds) {
    FI_WARN(&self(), FI_LOG_DOMAIN, "out of memory: domain left unhooked\n");
    return;
  }
  ds->domain = d;
  ds->fabric = fs;
  fi_ops_domain* ops = patch<fi_ops_domain, k_domain>(d->ops, fill_domain);
  fi_ops* fid_ops = patch<fi_ops, k_domain_fid>(d->fid.ops, fill_domain_fid);
  fi_ops_mr* mr = d->mr ? patch_mr_ops(d->mr) : nullptr;
  if (ops == nullptr || fid_ops == nullptr || (d->mr && mr == nullptr)) {
    FI_WARN(&self(), FI_LOG_DOMAIN, "out of memory: domain left unhooked\n");
    return;
  }
  ds->orig = orig_of(ops);
  if (!add_domain(std::move(ds))) {
    FI_WARN(&self(), FI_LOG_DOMAIN, "out of memory: domain left unhooked\n");
    return;
  }
  d->ops = ops;
  d->fid.ops = fid_ops;
  if (mr) d->mr = mr;
  stats().domains.fetch_add(1, std::memory_order_relaxed);
}

} // namespace compcntr_hook
