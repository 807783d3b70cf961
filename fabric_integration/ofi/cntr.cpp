// ofi_compcntr's progress: what the application's counter calls (fi_cntr_read, readerr, wait,
// add, set: the hook machinery calls layer_ops::progress) and CQ reads (cq.cpp) drive, as the
// provider below's own progress is driven by them (FI_PROGRESS_MANUAL). One round:
//   1. the triggering counters of armed operations are pulled from their provider counters
//      (a counter nobody reads still makes its triggers due: fabtests wait on another counter);
//   2. compcntr_trigger_progress runs the due actions (trigger.cpp's fire: queue in order);
//   3. the due operations are posted to the provider below, in order (-FI_EAGAIN: the rest
//      waits for the next round);
//   4. the CQs where posted deferred work completes are drained (its completion counters).
// Before them, while the FI_RMA_EVENT emulation has work (rma_event.cpp), its round: reads'
// notifications posted, the CQs where followed reads complete and MR-counted writes arrive
// drained.
// All of it in the calling thread, outside the provider's own calls: an action never runs from
// inside a provider callback. Nested calls (a completion counter's fi_cntr_add) return at once;
// a second thread finding a round running leaves it to that thread.
#include "ofi.hpp"

namespace compcntr_ofi {

namespace {
thread_local int t_depth = 0;
}

in_layer::in_layer() noexcept : nested_(t_depth++ > 0) {}
in_layer::~in_layer() { --t_depth; }

void progress(const compcntr_hook::hook_cntr* pulled) noexcept {
  const bool rma = rma_active().load(std::memory_order_acquire) != 0;
  if (!rma && active().load(std::memory_order_acquire) == 0) return;
  in_layer g;
  if (g.nested()) return;
  std::unique_lock lk(mu(), std::try_to_lock);
  if (!lk.owns_lock()) return;
  if (rma) rma_round(); // FI_RMA_EVENT emulation: notifications of reads, MR counters
  if (active().load(std::memory_order_acquire) == 0) return;
  static thread_local std::vector<hook_cntr*> counters;
  static thread_local std::vector<fid_cq*> cqs;
  armed_counters(counters, pulled);
  for (hook_cntr* h : counters)
    if (h != pulled) compcntr_hook::pull(h);  // the caller's counter is fresh
  compcntr_trigger_progress(compcntr_hook::device());
  post_ready();
  inflight_cqs(cqs);
  for (fid_cq* cq : cqs) cq_drain(cq);
}

bool busy() noexcept {
  if (active().load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lk(mu());
  for (domain_st* d : domains())
    if (!d->ready.empty()) return true;
  return false;
}

} // namespace compcntr_ofi
