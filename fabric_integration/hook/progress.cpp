// The hook's optional progress thread (COMPCNTR_FI_PROGRESS_THREAD=1, docs/hook.md).
//
// It pulls every hook counter of the domains opened FI_THREAD_SAFE (the hook asks for it when
// the thread is on: the thread drives endpoints while the application uses them) in rounds, so
// that fi_cntr_read and fi_cntr_readerr are loads and fi_cntr_wait sleeps until the thread's
// update wakes it. Busy rounds follow each other at once; after 10 ms without any change the
// thread sleeps COMPCNTR_FI_PROGRESS_IDLE_US (1000) between rounds, so an idle process costs a
// wake-up per millisecond, and the first completion after idling is seen up to that late.
//
// Lifetime: started by the first hooked fabric, stopped (joined) by the earliest of an atexit
// handler (which runs before libfabric's destructor tears providers down), libfabric's cleanup
// of the hook, or the module's destructor.
#include "hook.hpp"

#include <rdma/providers/fi_log.h>

#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <thread>

namespace compcntr_hook {
namespace {

std::mutex thread_mu;
std::thread* worker = nullptr;  // under thread_mu
std::atomic<bool> stop{false};

std::shared_mutex g_control;

void run() noexcept {
  using clock = std::chrono::steady_clock;
  auto last_change = clock::now();
  const timespec idle{0, static_cast<long>(cfg().progress_idle_us) * 1000};
  while (!stop.load(std::memory_order_acquire)) {
    bool changed;
    {
      std::shared_lock lk(g_control);
      changed = progress_all();
    }
    if (changed) {
      last_change = clock::now();
      continue;
    }
    if (clock::now() - last_change < std::chrono::milliseconds(10)) sched_yield();
    else nanosleep(&idle, nullptr);
  }
}

void stop_at_exit() { progress_thread_stop(); }

}  // namespace

void progress_thread_start() noexcept {
  std::lock_guard lk(thread_mu);
  if (worker != nullptr || !cfg().progress_thread) return;
  stop.store(false, std::memory_order_relaxed);
  try {
    worker = new std::thread(run);
  } catch (...) {
    worker = nullptr;
    FI_WARN(&self(), FI_LOG_CORE, "cannot start the progress thread: counters use caller progress\n");
    return;
  }
  static const bool registered = std::atexit(stop_at_exit) == 0;
  (void)registered;
}

std::shared_mutex& control_lock() noexcept { return g_control; }

control_guard::control_guard() noexcept {
  if (!cfg().progress_thread) return;
  g_control.lock();
  held_ = true;
}
control_guard::~control_guard() {
  if (held_) g_control.unlock();
}

bool progress_thread_running() noexcept {
  std::lock_guard lk(thread_mu);
  return worker != nullptr;
}

void progress_thread_stop() noexcept {
  std::thread* t = nullptr;
  {
    std::lock_guard lk(thread_mu);
    t = worker;
    worker = nullptr;
  }
  if (t == nullptr) return;
  stop.store(true, std::memory_order_release);
  if (t->get_id() == std::this_thread::get_id()) {
    t->detach();  // exit() called on the progress thread itself (a crash handler): cannot join
  } else {
    t->join();
  }
  delete t;
}

}  // namespace compcntr_hook
