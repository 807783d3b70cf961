// Shared devices: the fd watcher (docs/shared.md, "Pollable fds", "Triggers"). One thread of
// the process that opened the segment, started by the first arm of a shared counter's fd or
// trigger (shared_watch_fd), joined at close (stop_watcher): it sleeps on the segment's wake
// word as a waiter does, so another process's update wakes it, and signals the armed fds and
// fires the triggers whose condition that update met. The segment: compcntr:shared_impl
// (src/core/shared/segment_impl.cppm).
module;
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>
#include "core/shared/layout.hpp"
#include "core/wait/futex.hpp"
module compcntr;
import :shared_impl;

namespace compcntr::detail {

// The watcher thread. Memory ordering (the waiter's side of compcntr:shared's Dekker pairing,
// as shared_sleep in src/core/wait/wait.cpp): read wake_seq (acquire), register in `sleepers`
// (seq_cst RMW + fence), then scan (seq_cst loads of every armed cell), then FUTEX_WAIT on
// wake_seq. An update in any process after the registration sees sleepers != 0 and bumps and
// wakes; one before it is seen by the scan. An arm made while the watcher is registered is
// covered by the same argument (its baseline or threshold is read by the next scan); one made
// while it is parked (no fd armed, not a sleeper: updaters pay nothing) wakes it through
// watch_pending / watch_cv, and it registers before it scans. Each sleep is at most
// shared_sleep_slice (250 ms): an updater that died between its RMW and its wake, or a
// scribbled sleeper count, delays a signal by at most that; between sleeps it sweeps if due,
// so a creator's death is found (its armed fds are then signalled: a wait says EIO).
void shared_segment::watch_loop() noexcept {
  ::pthread_setname_np(::pthread_self(), "compcntr-shfd");
  std::vector<trigger_list*> due; // trigger lists found due by a scan (referenced)
  std::unique_lock lock(watch_mu);
  std::uint32_t armed = 0;
  const shared_wait_words w{&hdr->wake_seq, &hdr->sleepers, &hdr->proc_sleepers[me]};
  for (;;) {
    if (watch_stop) return;
    if (armed == 0 && !watch_pending) {
      watch_cv.wait(lock);
      continue;
    }
    watch_pending = false;
    lock.unlock();
    const std::uint32_t seq = hdr->wake_seq.load(std::memory_order_acquire);
    shared_sleeper_enter(w);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    lock.lock();
    try {
      due.reserve(watched.size()); // no allocation under the scan
    } catch (...) {
      due.clear(); // no memory: triggers wait for a later round (fds are signalled anyway)
    }
    armed = watch_scan(due);
    const bool again = watch_pending || watch_stop;
    lock.unlock();
    // Triggers fire with nothing locked: an action may arm, destroy or update counters. Their
    // lists are referenced, and a list whose counter was destroyed meanwhile fires nothing.
    for (trigger_list* l : due) shared_fire_triggers(l);
    due.clear();
    if (armed != 0 && !again)
      futex::wait_shared(hdr->wake_seq, seq, std::chrono::nanoseconds(shared_sleep_slice));
    shared_sleeper_leave(w);
    if (armed != 0) sweep_if_due();
    lock.lock();
  }
}

// Under watch_mu: every registered slot's fd that is due is signalled; returns how many stay
// armed. A slot is registered from before its first arm until its unbind (which takes watch_mu
// to leave the list before its stripes and extension block go).
std::uint32_t shared_segment::watch_scan(std::vector<trigger_list*>& due) noexcept {
  std::uint32_t armed = 0;
  for (slot* s : watched) {
    const std::uint32_t i = cell_of(*s);
    const bool dead =
        i < cell_count &&
        shm::cell_state(records[i].ctl.load(std::memory_order_acquire)) == shm::cell_dead;
    armed += shared_fd_check(*s, dead) ? 1 : 0;
    if ((s->watch.load(std::memory_order_seq_cst) & watch_triggers) != 0) {
      ++armed;
      if (due.size() < due.capacity())
        if (trigger_list* l = shared_due_triggers(*s)) due.push_back(l);
    }
  }
  return armed;
}

// At close (no counter of the device is left, so nothing is armed): the watcher returns and is
// joined. In a child forked after the open the thread is the parent's: there is none to join
// here, its handle is left alone (as the cmd_comp engine's, docs/devices.md FORK).
void shared_segment::stop_watcher() noexcept {
  if (watcher == nullptr) return;
  if (::getpid() != opener_pid) {
    watcher = nullptr; // the parent's thread: not ours to join or delete
    return;
  }
  {
    std::lock_guard lock(watch_mu);
    watch_stop = true;
  }
  watch_cv.notify_all();
  wake_all(); // ends its FUTEX_WAIT now (other processes' sleepers re-check once)
  watcher->join();
  delete watcher;
  watcher = nullptr;
}

std::error_code shared_watch_fd(slot& s, const char* call) noexcept {
  shared_segment& g = seg_of(s);
  if (::getpid() != g.opener_pid)
    return fail(EOWNERDEAD,
                "%s: counter %u is on shared device '%s', opened by process %d before "
                "fork(); its watcher (a thread of that process) does not exist in this child "
                "(pid %d): open the device in the child (docs/devices.md, FORK)",
                call, s.index, g.dev_name.c_str(), static_cast<int>(g.opener_pid),
                static_cast<int>(::getpid()));
  std::lock_guard lock(g.watch_mu);
  if (std::find(g.watched.begin(), g.watched.end(), &s) != g.watched.end()) return {};
  try {
    g.watched.reserve(g.watched.size() + 1);
  } catch (...) {
    return fail(ENOMEM, "%s: out of memory registering counter %u with the watcher of '%s'", call,
                s.index, g.dev_name.c_str());
  }
  if (g.watcher == nullptr) {
    try {
      g.watcher = new std::thread([&g] { g.watch_loop(); });
    } catch (const std::system_error& err) {
      return fail(err.code().value() ? err.code().value() : EAGAIN,
                  "%s: cannot start the watcher thread of shared device '%s' (%s)", call,
                  g.dev_name.c_str(), err.what());
    } catch (...) {
      return fail(ENOMEM, "%s: out of memory starting the watcher thread of '%s'", call,
                  g.dev_name.c_str());
    }
  }
  g.watched.push_back(&s); // capacity reserved: no throw
  return {};
}

void shared_watch_kick(slot& s) noexcept {
  shared_segment& g = seg_of(s);
  {
    std::lock_guard lock(g.watch_mu);
    g.watch_pending = true;
  }
  g.watch_cv.notify_one();
}

} // namespace compcntr::detail
