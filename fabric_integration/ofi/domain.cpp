// ofi_compcntr's domains: the records, fi_control's deferred work (FI_QUEUE_WORK,
// FI_CANCEL_WORK, FI_FLUSH_WORK; trigger.cpp does the work) and the close.
#include "ofi.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <algorithm>
#include <new>

namespace compcntr_ofi {

bool emulates_rma_event(const fi_info* info) noexcept; // provider.cpp

std::recursive_mutex& mu() noexcept {
  static auto* m = new std::recursive_mutex; // never destroyed: objects may outlive statics
  return *m;
}
std::atomic<long>& active() noexcept {
  static std::atomic<long> n{0};
  return n;
}
std::vector<domain_st*>& domains() noexcept {
  static auto* v = new std::vector<domain_st*>;
  return *v;
}

domain_st* find_domain(fid_domain* d) noexcept {
  std::lock_guard lk(mu());
  for (domain_st* ds : domains())
    if (ds->d == d) return ds;
  return nullptr;
}

namespace {

void domain_opened(fid_domain* d, const fi_info* info) {
  auto* ds = new (std::nothrow) domain_st;
  if (ds == nullptr) {
    FI_WARN(&compcntr_hook::self(), FI_LOG_DOMAIN,
            "out of memory: domain without triggered operations\n");
    return;
  }
  ds->d = d;
  ds->emulate_rma_event = emulates_rma_event(info);
  std::lock_guard lk(mu());
  try {
    domains().push_back(ds);
  } catch (...) {
    delete ds;
  }
}

void domain_closing(fid_domain* d) {
  std::lock_guard lk(mu());
  auto& v = domains();
  auto it = std::find_if(v.begin(), v.end(), [d](domain_st* s) { return s->d == d; });
  if (it == v.end()) return;
  domain_st* ds = *it;
  // Armed work of a domain being closed is cancelled; a refused close (-FI_EBUSY: endpoints
  // still open) leaves the domain without it, as fi_close of the domain would have with the
  // provider's own triggers (sockets frees them).
  drop_items(ds, nullptr);
  v.erase(it);
  delete ds;
}

int domain_control(fid* f, int command, void* arg, const fi_ops* orig) {
  domain_st* ds = find_domain(reinterpret_cast<fid_domain*>(f));
  if (ds == nullptr) return orig->control(f, command, arg);
  switch (command) {
    case FI_QUEUE_WORK:
      if (arg == nullptr) return -FI_EINVAL;
      return queue_work(ds, static_cast<const fi_deferred_work*>(arg));
    case FI_CANCEL_WORK:
      if (arg == nullptr) return -FI_EINVAL;
      return cancel_work(ds, static_cast<const fi_deferred_work*>(arg));
    case FI_FLUSH_WORK: return flush_work(ds);
    default: return orig->control(f, command, arg);
  }
}

} // namespace

void fill_domain_layer(compcntr_hook::layer_ops& l) noexcept {
  l.domain_opened = domain_opened;
  l.domain_closing = domain_closing;
  l.domain_control = domain_control;
  l.cq_open = cq_open;
}

} // namespace compcntr_ofi
