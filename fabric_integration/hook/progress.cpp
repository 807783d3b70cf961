// The hook's optional progress thread (COMPCNTR_FI_PROGRESS_THREAD=1, docs/hook.md).
//
// It pulls every hook counter of the domains opened FI_THREAD_SAFE (the hook asks for it when
// the thread is on: the thread drives endpoints while the application uses them) in rounds, so
// that fi_cntr_read and fi_cntr_readerr are loads (every 256th also pulls, hook_cntr.cpp);
// fi_cntr_wait drives the provider itself either way. Busy rounds follow each other at once; after 10 ms without any change the
// thread sleeps COMPCNTR_FI_PROGRESS_IDLE_US (1000) between rounds, so an idle process costs a
// wake-up per millisecond, and the first completion after idling is seen up to that late.
// While application threads drive progress themselves (waiters, spinning readers, fi_poll:
// caller_pulls() moves) the thread also sleeps between rounds: on a machine with few CPUs a busy
// thread beside a driving application only delays it (a scheduling round per message). While
// waiters and fi_poll keep driving, those sleeps double, from COMPCNTR_FI_PROGRESS_IDLE_US up to
// k_backoff_max times it (32 ms by default; fi_cntr_read then pulls as with caller progress, so
// no read is that late), and fall back to the idle sleep at the first round after which no
// waiter pulled (spinning readers alone keep the idle sleep): even a thread that only wakes up every millisecond and does
// nothing cost SOS's streaming shmem_int_p + shmem_quiet 1.12x (14.3 -> 16.2 us, 2 CPUs, each PE
// bound to one by mpiexec: the wake-ups preempt the PE on its core), its rounds nothing more
// measurable. These sleeps end at once when the thread is stopped.
//
// Lifetime: started by the first hooked fabric, stopped by the earliest of an atexit handler
// (which runs before libfabric's destructor tears providers down), libfabric's cleanup of the
// hook, or the module's destructor. Stopping never waits for ever: exit() may be called while
// the exiting thread holds a provider lock (a signal handler calling exit() during fi_poll, seen
// with fabtests) that the thread is blocked on inside a round; joining it then deadlocks the
// exit. So the stopper waits at most k_stop_wait for the thread to leave its loop; if it does not,
// the thread is abandoned (detached) and the module pinned in memory (RTLD_NODELETE), so that
// libfabric's dlclose cannot unmap code the blocked thread will return to.
#include "hook.hpp"

#include <rdma/providers/fi_log.h>

#include <dlfcn.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <thread>

namespace compcntr_hook {
namespace {

std::mutex thread_mu;
std::thread* worker = nullptr; // under thread_mu
std::atomic<bool> stop{false};
std::atomic<bool> abandoned{false}; // a stop gave up on the thread (see the top)

// The thread's "I have left the loop" (stop waits on it, bounded). Never destroyed, like
// g_control: an abandoned thread may still use them while the process's static objects die.
std::mutex& done_mu = *new std::mutex;
std::condition_variable& done_cv = *new std::condition_variable;
bool done = false; // under done_mu

// How long a stop waits for the thread's current round: a round takes microseconds (one
// fi_cntr_read per counter) plus at most one idle sleep; one still running after this is
// blocked on a lock the stopping (exiting) thread holds.
constexpr std::chrono::milliseconds k_stop_wait{200};

// The longest sleep between rounds while the application drives progress itself, in idle
// sleeps (see the top).
constexpr long k_backoff_max = 32;

// The backoff sleep: interrupted by progress_thread_stop (stop_cv), never longer than asked.
std::mutex& stop_mu = *new std::mutex;
std::condition_variable& stop_cv = *new std::condition_variable;
void backoff_sleep(std::chrono::nanoseconds d) noexcept {
  std::unique_lock lk(stop_mu);
  stop_cv.wait_for(lk, d, [] { return stop.load(std::memory_order_acquire); });
}

std::shared_mutex& g_control = *new std::shared_mutex;

void run() noexcept {
  using clock = std::chrono::steady_clock;
  auto last_change = clock::now();
  // COMPCNTR_FI_PROGRESS_IDLE_US goes up to 10^6: a whole second is tv_sec (tv_nsec must stay
  // below 10^9, or nanosleep fails with EINVAL at once and the thread never sleeps).
  const long idle_ns = static_cast<long>(cfg().progress_idle_us) * 1000;
  const timespec idle{idle_ns / 1'000'000'000, idle_ns % 1'000'000'000};
  std::uint64_t callers = caller_pulls(), waiters = waiter_pulls();
  long backoff = 1; // the next sleep while waiters drive, in idle sleeps
  while (!stop.load(std::memory_order_acquire)) {
    bool changed;
    {
      std::shared_lock lk(g_control);
      changed = progress_all();
    }
    const std::uint64_t now_callers = caller_pulls(), now_waiters = waiter_pulls();
    if (now_waiters != waiters) {
      // The application waits (or polls) and drives progress itself: stay out of its way,
      // longer each round it goes on; meanwhile reads pull themselves (hook_cntr.hpp).
      callers = now_callers;
      waiters = now_waiters;
      if (backoff == 1) {
        nanosleep(&idle, nullptr);
      } else {
        set_thread_backed_off(true);
        backoff_sleep(std::chrono::nanoseconds(idle_ns) * backoff);
      }
      if (backoff < k_backoff_max) backoff *= 2;
      continue;
    }
    if (backoff != 1) {
      backoff = 1;
      set_thread_backed_off(false);
    }
    if (now_callers != callers) { // spinning readers drive: one idle sleep between rounds
      callers = now_callers;
      nanosleep(&idle, nullptr);
      continue;
    }
    if (changed) {
      last_change = clock::now();
      continue;
    }
    if (clock::now() - last_change < std::chrono::milliseconds(10))
      sched_yield();
    else
      nanosleep(&idle, nullptr);
  }
  {
    std::lock_guard lk(done_mu);
    done = true;
  }
  done_cv.notify_all();
}

// Keeps this module mapped until the process ends (an abandoned thread may still run its code).
void pin_module() noexcept {
  Dl_info di{};
  if (dladdr(reinterpret_cast<void*>(&pin_module), &di) == 0 || di.dli_fname == nullptr) return;
  if (dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == nullptr)
    FI_WARN(&self(), FI_LOG_CORE, "cannot pin the hook module: %s\n", dlerror());
}

void stop_at_exit() { progress_thread_stop(); }

} // namespace

void progress_thread_start() noexcept {
  std::lock_guard lk(thread_mu);
  if (worker != nullptr || !cfg().progress_thread) return;
  stop.store(false, std::memory_order_relaxed);
  {
    std::lock_guard dl(done_mu);
    done = false;
  }
  try {
    worker = new std::thread(run);
  } catch (...) {
    worker = nullptr;
    FI_WARN(&self(), FI_LOG_CORE,
            "cannot start the progress thread: counters use caller progress\n");
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

bool progress_thread_abandoned() noexcept { return abandoned.load(std::memory_order_acquire); }

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
  {
    std::lock_guard lk(stop_mu); // a backoff sleep checks stop under it: no lost wake-up
    stop.store(true, std::memory_order_release);
  }
  stop_cv.notify_all();
  if (t->get_id() == std::this_thread::get_id()) {
    t->detach(); // exit() called on the progress thread itself (a crash handler): cannot join
    delete t;
    return;
  }
  bool left;
  {
    std::unique_lock lk(done_mu);
    left = done_cv.wait_for(lk, k_stop_wait, [] { return done; });
  }
  if (left) {
    t->join();
  } else {
    FI_WARN(&self(), FI_LOG_CORE,
            "progress thread still inside a provider call after %lld ms (a lock held by the "
            "stopping thread?): left running\n",
            static_cast<long long>(k_stop_wait.count()));
    pin_module();
    abandoned.store(true, std::memory_order_release);
    t->detach();
  }
  delete t;
}

} // namespace compcntr_hook
