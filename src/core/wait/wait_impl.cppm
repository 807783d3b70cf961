// compcntr:wait_impl -- internal partition of the waits (src/core/wait/): the phase engine that
// compcntr::wait (wait.cpp) and compcntr::poll_any (poll.cpp) both run -- hot poll, backoff,
// futex sleep -- with its deadline, its outcome type and the sleep-length rules. Not installed,
// not imported by the primary unit: only the implementation units of src/core/wait/ import it
// (modules/meson.build, internal_units). See modules/core/wait.cppm for the contract.
// Everything here is a template or inline (in a named module an in-class member function is not
// implicitly inline: they are marked), so the engine is still compiled into each wait loop.
module;
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <system_error>
module compcntr:wait_impl;
import :slot;
import :backoff;
import :backend;
import :wait;

namespace compcntr::detail {

using clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

// Timeouts longer than this (~34.8 years) are "forever": start + timeout in steady_clock's
// int64 nanoseconds would overflow not far beyond (292 years minus the clock's epoch offset).
inline constexpr std::int64_t max_finite_timeout_ms = std::int64_t{1} << 40;
// Spin budgets above this count as spin_forever, for the same reason.
inline constexpr nanoseconds max_finite_spin = std::chrono::hours(24 * 365);
// Hot-phase polls between two clock reads. steady_clock::now() costs ~30 ns here (vDSO, TSC)
// and one poll about one `pause` (28-36 ns): a read every 16 polls adds < 7% to a poll and
// overshoots the spin budget or the deadline by at most ~0.5 us. With a drive function (whose
// cost is unknown) the clock is read after every poll.
inline constexpr unsigned clock_stride = 16;

// What one check found. `done` false: keep waiting.
struct outcome {
  bool done;
  std::errc ec;
  std::size_t index;
};
inline constexpr outcome pending{false, std::errc{}, 0};
inline constexpr outcome timed_out{true, std::errc::timed_out, 0};

// The caller's timeout, started lazily: the clock is first read only when needed, so a wait
// answered within its first polls (or a spin-only wait without timeout) reads no clock at all.
// The start is taken at or after the wait's real start, so the deadline is never early.
class deadline {
 public:
  inline explicit deadline(std::int64_t ms) noexcept
      : ms_(ms), forever_(ms < 0 || ms > max_finite_timeout_ms) {}
  inline bool forever() const noexcept { return forever_; }
  inline bool started() const noexcept { return started_; }
  inline void start(clock::time_point now) noexcept {
    started_ = true;
    if (!forever_) at_ = now + std::chrono::milliseconds(ms_);
  }
  inline bool passed(clock::time_point now) const noexcept { return !forever_ && now >= at_; }
  // Length of the next sleep: until the deadline, and at most `cap` if cap >= 0; -1: no limit.
  inline nanoseconds next_sleep(clock::time_point now, nanoseconds cap) const noexcept {
    if (forever_) return cap;
    const nanoseconds left = at_ - now;
    return cap.count() >= 0 && cap < left ? cap : left;
  }

 private:
  std::int64_t ms_;
  bool forever_;
  bool started_ = false;
  clock::time_point at_ = clock::time_point::max();
};

// The three phases of every wait (modules/core/wait.cppm, file comment).
//   check(): drive function + hardware refresh + test; the first call happens before any clock
//            read, so an answer found there costs no time stamp.
//   sleep(rel, slice): register as a sleeper, re-test, futex-wait at most rel (< 0: until the
//            deadline-free wake-up), or at most `slice` if the wait needs progress driven
//            (drive function, hardware counter, device progress sources), deregister; returns
//            the re-test's outcome. Whether progress is needed is decided after registering,
//            not once per wait: a device may gain progress sources while the waiter sleeps
//            (a QP wrapped and attached later), and the attach wakes registered sleepers
//            (slot::kick) so they re-decide.
//   poll(n): n hot polls (`pause`, check) or fewer if one finds the wait done; the engine calls it
//            in blocks of `stride` polls between clock reads. A caller whose checks need nothing
//            but loads (no drive, no device progress, no refresh) runs its own tight loop here:
//            the hot poll is what a spin waiter's latency is made of (bench P4).
template <class Check, class Poll, class Sleep>
outcome run_phases(std::int64_t timeout_ms, const wait_options& o, Check&& check, Poll&& poll,
                   Sleep&& sleep) noexcept {
  outcome r = check();
  if (r.done) return r;
  if (timeout_ms == 0) return timed_out;
  deadline dl(timeout_ms);

  if (o.spin > nanoseconds::zero()) {
    // 1. hot: one pause between checks, in blocks of `stride` polls. The clock is read after
    // each block, the first time after `stride` polls (the spin budget and the timeout count
    // from there: at most ~0.5 us late), and never in spin-only mode without a timeout.
    const bool spin_always = o.spin >= max_finite_spin;
    const bool need_clock = !spin_always || !dl.forever();
    clock::time_point spin_end = clock::time_point::max();
    const unsigned stride = o.drive != nullptr ? 1 : clock_stride;
    for (;;) {
      if ((r = poll(stride)).done) return r;
      if (need_clock) {
        const clock::time_point now = clock::now();
        if (!dl.started()) {
          dl.start(now);
          if (!spin_always) spin_end = now + o.spin;
        }
        if (dl.passed(now)) return timed_out;
        if (now >= spin_end) break;
      }
    }
    // 2. backoff: longer pauses, then yields, until blocking is the better deal.
    backoff b;
    while (!b.is_completed()) {
      b.snooze();
      if ((r = check()).done) return r;
      if (dl.passed(clock::now())) return timed_out;
    }
  }

  // 3. sleep in the kernel. One clock read per sleep: the one that starts a lazy deadline is
  // also the first sleep's "now" (a forced-sleep wait reads the clock once before it sleeps).
  clock::time_point now = clock::now();
  if (!dl.started()) dl.start(now);
  const nanoseconds slice = o.drive_interval > std::chrono::microseconds::zero()
                                ? nanoseconds(o.drive_interval)
                                : nanoseconds(default_drive_interval);
  for (;;) {
    if (dl.passed(now)) return timed_out;
    if ((r = sleep(dl.next_sleep(now, nanoseconds(-1)), slice)).done) return r;
    if ((r = check()).done) return r;
    now = clock::now();
  }
}

// poll(n) for callers without a loop of their own: n times `pause`, check().
template <class Check>
outcome poll_with(Check& check, unsigned n) noexcept {
  for (unsigned k = 0; k < n; ++k) {
    cpu_relax();
    if (const outcome r = check(); r.done) return r;
  }
  return pending;
}

// A sleep of at most `rel` (< 0: no limit), shortened to `slice` when progress must be driven.
inline nanoseconds capped(nanoseconds rel, nanoseconds slice, bool needs_progress) noexcept {
  return needs_progress && (rel.count() < 0 || rel > slice) ? slice : rel;
}

// The longest sleep of a waiter: `slice` (opts.drive_interval) for its own drive function; the
// device's progress sources and hardware-backed counters are driven at least every 1 ms
// (default_drive_interval) whatever the drive_interval, so a caller pacing a cheap or idle
// drive function slowly (the fi_cntr adapter with nothing bound: 50 ms) does not slow them down.
inline nanoseconds sleep_cap(nanoseconds rel, nanoseconds slice, bool drive, bool device) noexcept {
  rel = capped(rel, slice, drive);
  return capped(rel, std::min(slice, nanoseconds(default_drive_interval)), device);
}

// Whether the counter's updates bypass its slot's words (a native counter the device updates, or
// one refreshed from it): striped counters are not that (their updates wake waiters as a plain
// counter's do).
inline bool hardware_backed(const slot& s) noexcept { return s.hw != nullptr && !s.striped(); }

// Whether a waiter on `s` must wake up to drive progress (besides a drive function of its own): the
// counter is hardware-backed or its device has progress sources (emulated CQs). Called after
// the waiter registered (seq_cst RMW on watch): pairs with slot::kick()'s fence, so either
// this sees a source added before the kick or the kick sees the registration.
inline bool slot_needs_progress(const slot& s) noexcept {
  return hardware_backed(s) || !s.dev->progress_sources().empty();
}

} // namespace compcntr::detail
