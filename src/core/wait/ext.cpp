// The slot extension block: a counter's pollable fd and the poll_any calls asleep on it.
//
// Allocated on first need (pollable_fd, or a poll_any that goes to sleep on the counter),
// published in slot::ext with a CAS, freed when the counter is destroyed. The increment path
// only comes here when slot::watch says so (watch_fd_armed, watch_pollers). An fd armed for a
// threshold keeps watch_fd_armed set until an update meets the threshold (or moves the error
// count): the updates before that come here, re-read the condition and the values, and leave
// (~55 instructions more than an unwatched update; no RMW, no syscall).
module;
#include <sys/eventfd.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <system_error>
#include "core/wait/futex.hpp"
module compcntr;

namespace compcntr::detail {

struct slot_ext {
  /// Guards `pollers` (and fd creation). Held by an updater only while a poll_any sleeps on
  /// the counter, for as long as it takes to bump (and maybe FUTEX_WAKE) each poller.
  std::mutex mu;
  poll_link* pollers = nullptr;            ///< doubly linked list of registered poll_any calls
  std::atomic<int> fd{-1};                 ///< eventfd, -1 until pollable_fd()
  std::atomic<bool> fd_signaled{false};    ///< written since the last arm drained it
  /// Signals between winning the armed bit and recording fd_signaled (signal_fd): an arm that
  /// sees one in flight drains the fd, whether or not its write has landed yet.
  std::atomic<std::uint32_t> fd_writing{0};
  /// Threshold arming (arm_fd(c, threshold)): while fd_thresholded, an update signals the fd
  /// only once value >= fd_threshold or errors != fd_err0. Written by the arming thread before
  /// its watch RMW, read by updaters after their watch load (seq_cst both: ordered).
  std::atomic<bool> fd_thresholded{false};
  std::atomic<std::uint64_t> fd_threshold{0};
  std::atomic<std::uint64_t> fd_err0{0};
  /// A shared counter's plain arm (compcntr:shared): the value at the arm. Another process's
  /// update is heard by this process's fd watcher, which signals once the value or the error
  /// count differs from the arm's (fd_value0, fd_err0); this process's own updates signal as
  /// for a private counter. Written before the arming RMW, read after a load of the bit.
  std::atomic<std::uint64_t> fd_value0{0};
  std::atomic<std::uint32_t> fd_silent0{0}; ///< and the cell's silent_updates (its sets)
  /// The counter's triggers (compcntr:trigger), created by the first arm; this block holds a
  /// reference on it, dropped when the block is freed.
  std::atomic<trigger_list*> triggers{nullptr};
};

namespace {

slot_ext* ensure_ext(slot& s) noexcept {
  slot_ext* e = s.ext.load(std::memory_order_acquire);
  if (e != nullptr) return e;
  auto* fresh = new (std::nothrow) slot_ext;
  if (fresh == nullptr) return nullptr;
  // Release publishes the constructed block; a loser deletes its copy and uses the winner's.
  if (s.ext.compare_exchange_strong(e, fresh, std::memory_order_acq_rel, std::memory_order_acquire))
    return fresh;
  delete fresh;
  return e;
}

} // namespace

bool register_poller(poll_link& l) noexcept {
  slot_ext* e = ensure_ext(*l.s);
  if (e == nullptr) return false;
  std::lock_guard lock(e->mu);
  l.prev = nullptr;
  l.next = e->pollers;
  if (l.next != nullptr) l.next->prev = &l;
  e->pollers = &l;
  l.linked = true;
  // Memory ordering: seq_cst RMW, the poller's half of the Dekker pairing with notify()
  // (compcntr:slot). Done on every registration, not only the first, so each poller's own
  // RMW precedes its re-check.
  l.s->watch.fetch_or(watch_pollers, std::memory_order_seq_cst);
  return true;
}

void unregister_poller(poll_link& l) noexcept {
  slot_ext* e = l.s->ext.load(std::memory_order_acquire);
  std::lock_guard lock(e->mu);
  if (l.prev != nullptr)
    l.prev->next = l.next;
  else
    e->pollers = l.next;
  if (l.next != nullptr) l.next->prev = l.prev;
  l.prev = l.next = nullptr;
  l.linked = false;
  // Under the lock, so it cannot race with a registration setting the bit again.
  if (e->pollers == nullptr) l.s->watch.fetch_and(~watch_pollers, std::memory_order_seq_cst);
}

namespace {

// Whether an update must signal the armed fd: always for a plain arm; for a threshold arm once
// the value reached the threshold or the error count moved since the arm (seq_cst loads: they
// follow the caller's watch load or the arm's fence in the single total order).
bool fd_condition(const slot& s, const slot_ext& e) noexcept {
  if (!e.fd_thresholded.load(std::memory_order_seq_cst)) return true;
  // value_seq_cst/errors_seq_cst: a striped counter's values are the sums of its stripes (its
  // slot's own words stay 0), as every waiter reads them.
  return s.value_seq_cst() >= e.fd_threshold.load(std::memory_order_relaxed) ||
         s.errors_seq_cst() != e.fd_err0.load(std::memory_order_relaxed);
}

// Disarms and makes the fd readable, if this caller is the one that clears the armed bit.
// One-shot: only the update that clears the bit writes, later ones pay nothing.
// The arm's drain (drain_fd) must never miss readiness that is not this arm's: the signal is
// counted in flight (fd_writing) before its write and recorded (fd_signaled) after it, and an
// arm drains when either says so. An arm that runs while the write has landed but is not yet
// recorded drains it (a signaller preempted there once made an epoll loop see the fd readable
// after every fresh arm, thousands of times in a row: issue 22); one that runs before the write
// lands drains nothing, and that readiness is the one spurious wake-up the next arm removes
// (fd_signaled is set by then, or the write is still in flight).
void signal_fd(slot& s, slot_ext& e) noexcept {
  if ((s.watch.fetch_and(~watch_fd_armed, std::memory_order_acq_rel) & watch_fd_armed) == 0) return;
  e.fd_writing.fetch_add(1, std::memory_order_seq_cst);
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n =
      ::write(e.fd.load(std::memory_order_acquire), &one, sizeof one);
  e.fd_signaled.store(true, std::memory_order_seq_cst);
  e.fd_writing.fetch_sub(1, std::memory_order_seq_cst);
}

// The arms' drain of earlier readiness: a read (non-blocking eventfd) only when a signal was
// recorded since the last drain or is in flight now; no syscall otherwise. Memory ordering:
// seq_cst exchange then seq_cst load, against signal_fd's seq_cst increment, store, decrement:
// an arm that misses the record (exchange before the store) sees the signal in flight.
void drain_fd(slot_ext& e, int fd) noexcept {
  const bool recorded = e.fd_signaled.exchange(false, std::memory_order_seq_cst);
  if (recorded || e.fd_writing.load(std::memory_order_seq_cst) != 0) {
    std::uint64_t v;
    [[maybe_unused]] const ssize_t n = ::read(fd, &v, sizeof v);
  }
}

} // namespace

void notify_ext(slot& s, std::uint32_t w) noexcept {
  slot_ext* e = s.ext.load(std::memory_order_acquire);
  if (e == nullptr) return;
  // A threshold arm below its threshold stays armed: this update pays the condition's loads only.
  if ((w & watch_fd_armed) != 0 && fd_condition(s, *e)) signal_fd(s, *e);
  if ((w & watch_pollers) != 0) {
    std::lock_guard lock(e->mu);
    for (poll_link* l = e->pollers; l != nullptr; l = l->next) {
      poll_waiter& pw = *l->waiter;
      // Dekker with the poller: bump, then look whether it sleeps (seq_cst both).
      pw.seq.fetch_add(1, std::memory_order_seq_cst);
      if (pw.sleeping.load(std::memory_order_seq_cst) != 0) futex::wake(pw.seq, 1);
    }
  }
}

void free_slot_ext_slow(slot& s) noexcept {
  slot_ext* e = s.ext.exchange(nullptr, std::memory_order_acq_rel);
  if (e == nullptr) return;
  const int fd = e->fd.load(std::memory_order_relaxed);
  if (fd >= 0) ::close(fd);
  if (trigger_list* l = e->triggers.load(std::memory_order_acquire)) release_trigger_list(l);
  delete e;
}

std::atomic<trigger_list*>* slot_trigger_cell(slot& s, bool create) noexcept {
  slot_ext* e = create ? ensure_ext(s) : s.ext.load(std::memory_order_acquire);
  return e != nullptr ? &e->triggers : nullptr;
}

int slot_fd(slot& s, std::error_code& ec) noexcept {
  // A shared counter's fd is the same eventfd; other processes' updates reach it through the
  // segment's fd watcher, registered by the arms (compcntr:shared, docs/shared.md).
  slot_ext* e = ensure_ext(s);
  if (e == nullptr) {
    fail_into(ec, ENOMEM, "get_fd: out of memory for counter %u's extension block", s.index);
    return -1;
  }
  int fd = e->fd.load(std::memory_order_acquire);
  if (fd < 0) {
    std::lock_guard lock(e->mu);
    fd = e->fd.load(std::memory_order_relaxed);
    if (fd < 0) {
      fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (fd < 0) {
        const int err = errno;
        fail_into(ec, err, "get_fd: eventfd() failed for counter %u: %s", s.index,
                  std::strerror(err));
        return -1;
      }
      e->fd.store(fd, std::memory_order_release);
    }
  }
  ec.clear();
  return fd;
}

namespace {

// The common start of both arms: the extension block with its fd, or null and EINVAL.
slot_ext* arm_prepare(slot& s, const char* call, std::error_code& ec) noexcept {
  slot_ext* e = s.ext.load(std::memory_order_acquire);
  const int fd = e != nullptr ? e->fd.load(std::memory_order_acquire) : -1;
  if (fd < 0) {
    fail_into(ec, EINVAL,
              "%s: counter %u has no pollable fd yet (get it first: "
              "compcntr_comp_cntr_get_fd / compcntr::pollable_fd)",
              call, s.index);
    return nullptr;
  }
  return e;
}

} // namespace

void arm_slot_fd_threshold(slot& s, std::uint64_t threshold, std::error_code& ec) noexcept {
  slot_ext* e = arm_prepare(s, "arm_fd_threshold", ec);
  if (e == nullptr) return;
  const bool shared = is_shared(s);
  if (shared) [[unlikely]]
    if (auto err = shared_watch_fd(s, "arm_fd_threshold")) { // refused: nothing armed
      ec = err;
      return;
    }
  drain_fd(*e, e->fd.load(std::memory_order_acquire));
  // The condition first, then the arming RMW: an updater that sees the bit sees the condition.
  e->fd_threshold.store(threshold, std::memory_order_relaxed);
  e->fd_err0.store(s.errors_seq_cst(), std::memory_order_relaxed);
  e->fd_thresholded.store(true, std::memory_order_seq_cst);
  s.watch.fetch_or(watch_fd_armed, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Dekker with the updaters (compcntr:slot): an update this arm's bit did not reach is seen
  // by this check. Already there (or an error since the sample): readable now, disarmed.
  if (fd_condition(s, *e)) signal_fd(s, *e);
  if (shared) [[unlikely]]
    shared_watch_kick(s); // after the arming RMW: a parked watcher registers and scans
  ec.clear();
}

void arm_slot_fd(slot& s, std::error_code& ec) noexcept {
  slot_ext* e = arm_prepare(s, "arm_fd", ec);
  if (e == nullptr) return;
  const bool shared = is_shared(s);
  if (shared) [[unlikely]] {
    if (auto err = shared_watch_fd(s, "arm_fd")) { // refused: nothing armed
      ec = err;
      return;
    }
    // The baseline the watcher compares with, before the arming RMW (seq_cst loads): an
    // update after these loads changes what the watcher's scan reads.
    e->fd_value0.store(s.value_seq_cst(), std::memory_order_relaxed);
    e->fd_err0.store(s.errors_seq_cst(), std::memory_order_relaxed);
    e->fd_silent0.store(shared_silent_updates(s), std::memory_order_relaxed);
  }
  e->fd_thresholded.store(false, std::memory_order_seq_cst);
  // Drain the previous readiness (only if a signal was recorded or is in flight: no syscall
  // otherwise).
  drain_fd(*e, e->fd.load(std::memory_order_acquire));
  // Memory ordering: seq_cst RMW (seen by every later update's watch load), then a seq_cst
  // fence so that the caller's following acquire load of the counter is ordered after it
  // (an update this arm does not hear about is visible to that load).
  s.watch.fetch_or(watch_fd_armed, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (shared) [[unlikely]]
    shared_watch_kick(s);
  ec.clear();
}

bool shared_fd_check(slot& s, bool creator_dead) noexcept {
  slot_ext* e = s.ext.load(std::memory_order_acquire);
  if (e == nullptr || e->fd.load(std::memory_order_acquire) < 0) return false;
  // The bit first (seq_cst): the arm's condition fields, written before its RMW, are visible.
  if ((s.watch.load(std::memory_order_seq_cst) & watch_fd_armed) == 0) return false;
  bool due = creator_dead;
  if (!due) {
    if (e->fd_thresholded.load(std::memory_order_seq_cst))
      due = fd_condition(s, *e);
    else
      due = s.value_seq_cst() != e->fd_value0.load(std::memory_order_relaxed) ||
            s.errors_seq_cst() != e->fd_err0.load(std::memory_order_relaxed) ||
            shared_silent_updates(s) != e->fd_silent0.load(std::memory_order_relaxed);
  }
  if (!due) return true;
  signal_fd(s, *e); // one-shot: whoever clears the bit (this or a local update) writes
  return false;
}

} // namespace compcntr::detail

namespace compcntr {

int pollable_fd(counter_view c, std::error_code& ec) noexcept {
  if (!c) {
    detail::fail_into(ec, EINVAL, "get_fd: the counter is empty (moved from or destroyed)");
    return -1;
  }
  return detail::slot_fd(*c.native_slot(), ec);
}

void arm_fd(counter_view c, std::error_code& ec) noexcept {
  if (!c) {
    detail::fail_into(ec, EINVAL, "arm_fd: the counter is empty (moved from or destroyed)");
    return;
  }
  detail::arm_slot_fd(*c.native_slot(), ec);
}

void arm_fd(counter_view c, std::uint64_t threshold, std::error_code& ec) noexcept {
  if (!c) {
    detail::fail_into(ec, EINVAL,
                      "arm_fd_threshold: the counter is empty (moved from or destroyed)");
    return;
  }
  detail::arm_slot_fd_threshold(*c.native_slot(), threshold, ec);
}

} // namespace compcntr
