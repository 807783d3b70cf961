// Triggered operations (compcntr:trigger): the device's deferred queue. Holds finding and
// creating a device's queue (a device_service), popping and running its due actions
// (run_device_triggers: device::run_deferred_triggers) and the optional service thread that
// runs them (start/stop_trigger_service). The objects: compcntr:trigger_impl
// (src/core/trigger/trigger_impl.cppm).
module;
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include "core/wait/futex.hpp"
module compcntr;
import :trigger_impl;

namespace compcntr::detail {

namespace {

// Whether this thread runs deferred actions now (the service thread, or a run_device_triggers
// call): a deferred action that calls run_device_triggers runs nothing nested.
thread_local bool tl_in_progress = false;

} // namespace

trigger_queue* ensure_queue(device_core& dev) noexcept {
  if (trigger_queue* q = find_queue(dev)) return q;
  auto* mine = new (std::nothrow) trigger_queue;
  if (mine == nullptr) return nullptr;
  mine->dev = &dev;
  device_service* winner = dev.add_service(*mine);
  if (winner != mine) delete mine; // never attached: nothing to stop
  return static_cast<trigger_queue*>(winner);
}

namespace {

// Pops and runs one due deferred action of q; false when none is left.
bool run_one(trigger_queue& q) noexcept {
  trigger_node* n;
  {
    std::lock_guard lk(q.mu);
    for (;;) {
      n = q.head;
      if (n == nullptr) return false;
      q.unlink_locked(*n);
      std::uint32_t want = st_queued;
      // A canceller CASes queued -> cancelling first and unlinks after (then finds it gone):
      // the node is the canceller's now, don't touch it again.
      if (n->st.compare_exchange_strong(want, st_running, std::memory_order_acq_rel)) break;
    }
    n->list->busy.fetch_add(1, std::memory_order_acq_rel); // under q.mu: end_* scans after it
  }
  trigger_list& l = *n->list;
  run_action(l, *n, 0);
  finish_node(*n, st_fired);
  busy_done(l);
  return true;
}

} // namespace

void trigger_queue::serve() noexcept {
  tl_in_progress = true;
  while (!stopping.load(std::memory_order_seq_cst)) {
    if (run_one(*this)) continue;
    const std::uint32_t seen = wake.load(std::memory_order_seq_cst);
    sleeping.store(1, std::memory_order_seq_cst);
    if (count.load(std::memory_order_seq_cst) == 0 && !stopping.load(std::memory_order_seq_cst))
      futex::wait(wake, seen, std::chrono::nanoseconds(-1));
    sleeping.store(0, std::memory_order_seq_cst);
  }
}

std::size_t run_device_triggers(device_core& dev) noexcept {
  trigger_queue* q = find_queue(dev);
  if (q == nullptr || q->count.load(std::memory_order_relaxed) == 0 || tl_in_progress) return 0;
  tl_in_progress = true;
  std::size_t ran = 0;
  while (run_one(*q)) ++ran;
  tl_in_progress = false;
  return ran;
}

std::error_code start_trigger_service(device_core& dev) noexcept {
  trigger_queue* q = ensure_queue(dev);
  if (q == nullptr) return fail(ENOMEM, "trigger_service_start: out of memory");
  std::lock_guard lk(q->thread_mu);
  if (q->thread.joinable())
    return fail(EALREADY, "trigger_service_start: the device's trigger service already runs");
  q->stopping.store(false, std::memory_order_seq_cst);
  try {
    q->thread = std::thread([q] { q->serve(); });
  } catch (...) {
    return fail(EAGAIN, "trigger_service_start: cannot create the service thread");
  }
  return {};
}

std::error_code stop_trigger_service(device_core& dev) noexcept {
  trigger_queue* q = find_queue(dev);
  if (q == nullptr) return fail(EALREADY, "trigger_service_stop: no trigger service runs");
  std::lock_guard lk(q->thread_mu);
  if (!q->thread.joinable()) return fail(EALREADY, "trigger_service_stop: no trigger service runs");
  q->join_thread();
  return {};
}

} // namespace compcntr::detail
