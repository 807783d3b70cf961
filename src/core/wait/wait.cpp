// compcntr::wait and compcntr::poll_any: one phase engine (hot poll, backoff, futex sleep) run
// over a single slot or over a list of slots. See modules/core/wait.cppm for the contract.
module;
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <system_error>
#include <utility>
#include "core/wait/futex.hpp"
module compcntr;

namespace compcntr::detail {
namespace {

using clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

// Timeouts longer than this (~34.8 years) are "forever": start + timeout in steady_clock's
// int64 nanoseconds would overflow not far beyond (292 years minus the clock's epoch offset).
constexpr std::int64_t max_finite_timeout_ms = std::int64_t{1} << 40;
// Spin budgets above this count as spin_forever, for the same reason.
constexpr nanoseconds max_finite_spin = std::chrono::hours(24 * 365);
// Hot-phase polls between two clock reads. steady_clock::now() costs ~30 ns here (vDSO, TSC)
// and one poll about one `pause` (28-36 ns): a read every 16 polls adds < 7% to a poll and
// overshoots the spin budget or the deadline by at most ~0.5 us. With a progress hook (whose
// cost is unknown) the clock is read after every poll.
constexpr unsigned clock_stride = 16;

// What one check found. `done` false: keep waiting.
struct outcome {
  bool done;
  std::errc ec;
  std::size_t index;
};
constexpr outcome pending{false, std::errc{}, 0};
constexpr outcome timed_out{true, std::errc::timed_out, 0};

// The caller's timeout, started lazily: the clock is first read only when needed, so a wait
// answered within its first polls (or a spin-only wait without timeout) reads no clock at all.
// The start is taken at or after the wait's real start, so the deadline is never early.
class deadline {
 public:
  explicit deadline(std::int64_t ms) noexcept
      : ms_(ms), forever_(ms < 0 || ms > max_finite_timeout_ms) {}
  bool forever() const noexcept { return forever_; }
  bool started() const noexcept { return started_; }
  void start(clock::time_point now) noexcept {
    started_ = true;
    if (!forever_) at_ = now + std::chrono::milliseconds(ms_);
  }
  bool passed(clock::time_point now) const noexcept { return !forever_ && now >= at_; }
  // Length of the next sleep: until the deadline, and at most `cap` if cap >= 0; -1: no limit.
  nanoseconds next_sleep(clock::time_point now, nanoseconds cap) const noexcept {
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
//   check(): progress hook + hardware refresh + test; the first call happens before any clock
//            read, so an answer found there costs no time stamp.
//   sleep(rel, slice): register as a sleeper, re-test, futex-wait at most rel (< 0: until the
//            deadline-free wake-up), or at most `slice` if the wait needs progress driven
//            (progress hook, hardware counter, device progress sources), deregister; returns
//            the re-test's outcome. Whether progress is needed is decided after registering,
//            not once per wait: a device may gain progress sources while the waiter sleeps
//            (a QP wrapped and attached later), and the attach wakes registered sleepers
//            (slot::kick) so they re-decide.
//   poll(n): n hot polls (`pause`, check) or fewer if one finds the wait done; the engine calls it
//            in blocks of `stride` polls between clock reads. A caller whose checks need nothing
//            but loads (no hook, no device progress, no refresh) runs its own tight loop here:
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
    const unsigned stride = o.hook != nullptr ? 1 : clock_stride;
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
  const nanoseconds slice = o.hook_interval > std::chrono::microseconds::zero()
                                ? nanoseconds(o.hook_interval)
                                : nanoseconds(default_hook_interval);
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

// One block of clock_stride hot polls of a counter whose checks need nothing but loads: `pause`,
// then test()'s two seq_cst loads (value first, so a reached threshold wins over an error) and
// compares. The one hot poll loop: the spin waiter's fast entry and the engine's poll(n) both run
// it. Plain (base 0, full mask: the common threshold) compares without the subtraction. Unrolled
// by a fold over the poll index (a `#pragma unroll` loop in an inlined function was not: +1.3
// instructions per poll, bench/opcount.sh wait_poll), the bounds in registers across the block.
template <bool Plain, std::size_t... K>
[[gnu::always_inline]] inline outcome hot_block_of(const std::atomic<std::uint64_t>& value,
                                                   const std::atomic<std::uint64_t>& errors,
                                                   std::uint64_t base, std::uint64_t mask,
                                                   std::uint64_t goal, std::uint64_t err0,
                                                   std::index_sequence<K...>) noexcept {
  outcome r = pending;
  auto once = [&]() noexcept [[gnu::always_inline]] {
    cpu_relax();
    const std::uint64_t v = value.load(std::memory_order_seq_cst);
    if ((Plain ? v : (v - base) & mask) >= goal) [[unlikely]] {
      r = {true, std::errc{}, 0};
      return true;
    }
    if (errors.load(std::memory_order_seq_cst) != err0) [[unlikely]] {
      r = {true, std::errc::io_error, 0};
      return true;
    }
    return false;
  };
  ((static_cast<void>(K), once()) || ...);
  return r;
}

template <bool Plain>
[[gnu::always_inline]] inline outcome hot_block(const std::atomic<std::uint64_t>& value,
                                                const std::atomic<std::uint64_t>& errors,
                                                std::uint64_t base, std::uint64_t mask,
                                                std::uint64_t goal, std::uint64_t err0) noexcept {
  return hot_block_of<Plain>(value, errors, base, mask, goal, err0,
                             std::make_index_sequence<clock_stride>{});
}

// A sleep of at most `rel` (< 0: no limit), shortened to `slice` when progress must be driven.
nanoseconds capped(nanoseconds rel, nanoseconds slice, bool needs_progress) noexcept {
  return needs_progress && (rel.count() < 0 || rel > slice) ? slice : rel;
}

// The longest sleep of a waiter: `slice` (opts.hook_interval) for its own hook; the device's
// progress sources and hardware-backed counters are driven at least every 1 ms
// (default_hook_interval) whatever the hook's interval, so a caller pacing a cheap or
// idle hook slowly (the fi_cntr adapter with nothing bound: 50 ms) does not slow them down.
nanoseconds sleep_cap(nanoseconds rel, nanoseconds slice, bool hook, bool device) noexcept {
  rel = capped(rel, slice, hook);
  return capped(rel, std::min(slice, nanoseconds(default_hook_interval)), device);
}

// Whether the counter's updates bypass its slot's words (a native counter the device updates, or
// one refreshed from it): striped counters are not that (their updates wake waiters as a plain
// counter's do).
bool hardware_backed(const slot& s) noexcept { return s.hw != nullptr && !s.striped(); }

// Whether a waiter on `s` must wake up to drive progress (besides a hook of its own): the
// counter is hardware-backed or its device has progress sources (emulated CQs). Called after
// the waiter registered (seq_cst RMW on watch): pairs with slot::kick()'s fence, so either
// this sees a source added before the kick or the kick sees the registration.
bool slot_needs_progress(const slot& s) noexcept {
  return hardware_backed(s) || !s.owner->progress_sources().empty();
}

// A waiter on a shared counter (compcntr:shared): test(), and EIO once the counter's creator
// died while this process held it (nobody is left to count into it as its owner).
template <class Test>
outcome shared_check(const slot& s, Test& test) noexcept {
  const outcome r = test();
  if (!r.done && shared_creator_died(s)) return {true, std::errc::io_error, 0};
  return r;
}

// The sleep of a waiter on a shared counter: the Dekker pairing of compcntr:slot on the
// segment's words (compcntr:shared, file comment): read the futex word (acquire), register in
// the segment's sleeper count (seq_cst RMW), re-test (seq_cst loads of the cell), sleep on the
// word with a non-private futex, at most shared_sleep_slice; then sweep dead peers if due, so a
// forever-wait on a counter whose creator died ends (shared_check: EIO).
template <class Test>
outcome shared_sleep(const slot& s, Test& test, nanoseconds rel) noexcept {
  const shared_wait_words w = shared_words(s);
  const std::uint32_t seq = w.word->load(std::memory_order_acquire);
  w.sleepers->fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const outcome r = shared_check(s, test);
  if (!r.done) futex::wait_shared(*w.word, seq, capped(rel, nanoseconds(shared_sleep_slice), true));
  w.sleepers->fetch_sub(1, std::memory_order_seq_cst);
  if (!r.done) shared_sweep_if_due(s);
  return r;
}

// Where each thread's next poll_any scan starts: just after the index it last returned.
thread_local std::size_t poll_cursor = 0;

// Per-counter state of one poll_any call. Up to small_poll of them live on the stack.
struct poll_entry {
  slot* s = nullptr;
  std::uint64_t err0 = 0;
  poll_link link;
};
constexpr std::size_t small_poll = 32;

}  // namespace

std::errc wait_on_empty() noexcept {
  return std::errc(fail(EINVAL, "wait: the counter is empty (moved from or destroyed)").value());
}

std::errc wait_slot(slot& s, const wait_goal& g, std::int64_t timeout_ms,
                    const wait_options& o) noexcept {
  void (*const refresh)(slot&) noexcept = s.hw != nullptr ? s.hw->refresh : nullptr;
  std::uint64_t err0 = g.errors_seen;
  if (g.sample_errors) {
    if (refresh != nullptr) refresh(s);  // so a stale mirror's catch-up is not "during the wait"
    err0 = s.errors_seq_cst();
  }
  const std::uint64_t base = g.base, need = g.need, mask = g.mask;

  // Fast entry of a spin waiter on a plain software counter (bench P4): nothing to drive (no
  // hook; no hw table, so neither refreshed nor striped; no device progress source), a plain
  // threshold. One block of clock_stride polls right away, before the engine below sets up its
  // checks, deadline and spin budget (~160 instructions): an answer already on its way (a
  // ping-pong at cache-line latency, ~35 ns per half on an idle machine) is seen without that
  // entry. The engine then runs as if called after this block: its deadline and budget count
  // from there (at most ~0.5 us later, never earlier: a timed-out wait still lasted >= timeout).
  // Checks as test(): seq_cst loads, value first, so a reached threshold wins over an error.
  if (o.spin > nanoseconds::zero() && timeout_ms != 0 && o.hook == nullptr && s.hw == nullptr &&
      base == 0 && mask == ~std::uint64_t{0} && s.owner->progress_sources().empty()) [[likely]] {
    if (s.value.load(std::memory_order_seq_cst) >= need) return std::errc{};
    if (s.errors.load(std::memory_order_seq_cst) != err0) return std::errc::io_error;
    if (const outcome r = hot_block<true>(s.value, s.errors, 0, ~std::uint64_t{0}, need, err0);
        r.done)
      return r.ec;
  }

  auto test = [&]() noexcept -> outcome {
    if (((s.value_seq_cst() - base) & mask) >= need) return {true, std::errc{}, 0};
    if (s.errors_seq_cst() != err0) return {true, std::errc::io_error, 0};
    return pending;
  };
  // The device's own progress sources (emulated verbs CQs) are driven like a hook: a waiter on
  // a counter fed by a wrapped ibv_qp needs no hook of its own. One relaxed load when none.
  device_core& dev = *s.owner;
  const bool shared = is_shared(s);
  auto check = [&]() noexcept -> outcome {
    if (o.hook) o.hook(o.hook_ctx);
    dev.progress();
    if (refresh) refresh(s);
    if (shared) [[unlikely]]
      return shared_check(s, test);
    return test();
  };
  // The hot poll. With nothing to drive (no hook, no refresh, no progress source: the software
  // counter case) a poll is `pause`, two loads of the counter's line and two compares (callgrind:
  // bench/opcount.sh wait_poll), as close to a raw spin loop as the EIO check allows; the plain
  // threshold (base 0, full mask) has its own loop without the subtraction. Whether there is
  // something to drive is looked at again for every block of polls (a device may gain progress
  // sources while a waiter spins), one relaxed load per block.
  auto poll = [&](unsigned n) noexcept -> outcome {
    if (o.hook != nullptr || refresh != nullptr || s.striped() || !dev.progress_sources().empty() ||
        n != clock_stride) [[unlikely]]
      return poll_with(check, n);
    if (base == 0 && mask == ~std::uint64_t{0})
      return hot_block<true>(s.value, s.errors, 0, mask, need, err0);
    return hot_block<false>(s.value, s.errors, base, mask, need, err0);
  };
  auto sleep = [&](nanoseconds rel, nanoseconds slice) noexcept -> outcome {
    if (shared) [[unlikely]]
      return shared_sleep(s, test, sleep_cap(rel, slice, o.hook != nullptr, false));
    // Sequence first (acquire), then register (seq_cst RMW), then re-test (seq_cst loads): an
    // update the re-test misses sees the registration and bumps wake_seq after this read, so
    // FUTEX_WAIT either finds the word changed or is woken (compcntr:slot, compcntr:wait).
    const std::uint32_t seq = s.wake_seq.load(std::memory_order_acquire);
    s.watch.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst); // registration before the checks below
    const outcome r = test();
    if (!r.done)
      futex::wait(s.wake_seq, seq,
                  sleep_cap(rel, slice, o.hook != nullptr, slot_needs_progress(s)));
    s.watch.fetch_sub(1, std::memory_order_seq_cst);
    return r;
  };
  return run_phases(timeout_ms, o, check, poll, sleep).ec;
}

poll_result poll_slots(const slot_list& list, const std::uint64_t* thresholds,
                       std::int64_t timeout_ms, const wait_options& o) noexcept {
  const std::size_t n = list.size;
  if (n == 0) return {std::errc(fail(EINVAL, "poll: no counters to poll (n == 0)").value()), 0};
  if (thresholds == nullptr)
    return {std::errc(fail(EINVAL, "poll: thresholds is NULL").value()), 0};
  bool any_hw = false;
  for (std::size_t i = 0; i < n; ++i) {
    const slot* s = list.at(list.base, i);
    if (s == nullptr)
      return {std::errc(fail(EINVAL, "poll: counter %zu is NULL or empty", i).value()), 0};
    // A shared counter's updates in other processes do not reach this process's poll
    // registrations: sleep in slices (1 ms), as for a hardware-backed counter.
    any_hw |= hardware_backed(*s) || !s->owner->progress_sources().empty() || is_shared(*s);
  }
  const std::size_t start = poll_cursor % n;

  // Something already ready: no allocation, no error samples, no clock.
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = start + k < n ? start + k : start + k - n;
    if (list.at(list.base, i)->load_value() >= thresholds[i]) {
      poll_cursor = i + 1;
      return {std::errc{}, i};
    }
  }

  poll_entry small[small_poll];
  std::unique_ptr<poll_entry[]> big;
  poll_entry* e = small;
  if (n > small_poll) {
    big.reset(new (std::nothrow) poll_entry[n]);
    if (!big)
      return {std::errc(fail(ENOMEM, "poll: out of memory for %zu counters' state", n).value()), 0};
    e = big.get();
  }
  for (std::size_t i = 0; i < n; ++i) {
    e[i].s = list.at(list.base, i);
    if (e[i].s->hw != nullptr && e[i].s->hw->refresh != nullptr) e[i].s->hw->refresh(*e[i].s);
    e[i].err0 = e[i].s->errors_seq_cst();
  }

  auto test = [&]() noexcept -> outcome {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = start + k < n ? start + k : start + k - n;
      const slot& s = *e[i].s;
      if (s.value_seq_cst() >= thresholds[i]) return {true, std::errc{}, i};
      if (s.errors_seq_cst() != e[i].err0) return {true, std::errc::io_error, i};
    }
    return pending;
  };
  auto check = [&]() noexcept -> outcome {
    if (o.hook) o.hook(o.hook_ctx);
    if (any_hw)
      for (std::size_t i = 0; i < n; ++i) {
        // Each device's progress sources once per check (consecutive counters usually share one).
        if (i == 0 || e[i].s->owner != e[i - 1].s->owner) e[i].s->owner->progress();
        if (e[i].s->hw != nullptr && e[i].s->hw->refresh != nullptr) e[i].s->hw->refresh(*e[i].s);
      }
    return test();
  };
  // One futex word for the whole call (w.seq), registered in every slot's extension block:
  // an update of any of them bumps it (compcntr:wait, file comment).
  poll_waiter w;
  auto sleep = [&](nanoseconds rel, nanoseconds slice) noexcept -> outcome {
    const std::uint32_t seq = w.seq.load(std::memory_order_acquire);
    bool all_registered = true;
    for (std::size_t i = 0; i < n; ++i) {
      e[i].link.waiter = &w;
      e[i].link.s = e[i].s;
      all_registered &= register_poller(e[i].link);
    }
    // After registering (see slot_needs_progress): a device that gained progress sources since
    // the call began is driven by check() from now on.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!any_hw)
      for (std::size_t i = 0; i < n && !any_hw; ++i) any_hw = slot_needs_progress(*e[i].s);
    const outcome r = test();
    if (!r.done) {
      // A slot without an extension block (no memory) cannot wake us: poll it in slices.
      if (!all_registered) rel = capped(rel, nanoseconds(default_hook_interval), true);
      rel = sleep_cap(rel, slice, o.hook != nullptr, any_hw);
      // Dekker with notify_ext(): it bumps seq, then loads sleeping; we store sleeping, then
      // load seq. One of the two sees the other, so a bump we miss here comes with a wake.
      w.sleeping.store(1, std::memory_order_seq_cst);
      if (w.seq.load(std::memory_order_seq_cst) == seq) futex::wait(w.seq, seq, rel);
      w.sleeping.store(0, std::memory_order_relaxed);
    }
    for (std::size_t i = 0; i < n; ++i)
      if (e[i].link.linked) unregister_poller(e[i].link);
    return r;
  };
  const outcome r = run_phases(
      timeout_ms, o, check, [&](unsigned k) noexcept { return poll_with(check, k); }, sleep);
  if (r.ec == std::errc{}) poll_cursor = r.index + 1;
  return {r.ec, r.ec == std::errc::timed_out ? 0 : r.index};
}

} // namespace compcntr::detail

namespace compcntr {

namespace {
poll_result length_mismatch(std::size_t counters, std::size_t thresholds) noexcept {
  return {std::errc(detail::fail(EINVAL, "poll_any: %zu counters but %zu thresholds", counters,
                                 thresholds)
                        .value()),
          0};
}
} // namespace

poll_result poll_any(std::span<const counter> counters, std::span<const std::uint64_t> thresholds,
                     std::chrono::milliseconds timeout, const wait_options& opts) noexcept {
  if (counters.size() != thresholds.size())
    return length_mismatch(counters.size(), thresholds.size());
  const detail::slot_list list{counters.data(), counters.size(),
                               [](const void* base, std::size_t i) noexcept -> detail::slot* {
                                 return static_cast<const counter*>(base)[i].native_slot();
                               }};
  return detail::poll_slots(list, thresholds.data(), timeout.count(), opts);
}

poll_result poll_any(std::span<const counter_view> counters,
                     std::span<const std::uint64_t> thresholds, std::chrono::milliseconds timeout,
                     const wait_options& opts) noexcept {
  if (counters.size() != thresholds.size())
    return length_mismatch(counters.size(), thresholds.size());
  const detail::slot_list list{counters.data(), counters.size(),
                               [](const void* base, std::size_t i) noexcept -> detail::slot* {
                                 return static_cast<const counter_view*>(base)[i].native_slot();
                               }};
  return detail::poll_slots(list, thresholds.data(), timeout.count(), opts);
}

poll_result poll_any(std::span<const counter* const> counters,
                     std::span<const std::uint64_t> thresholds, std::chrono::milliseconds timeout,
                     const wait_options& opts) noexcept {
  if (counters.size() != thresholds.size())
    return length_mismatch(counters.size(), thresholds.size());
  const detail::slot_list list{counters.data(), counters.size(),
                               [](const void* base, std::size_t i) noexcept -> detail::slot* {
                                 const counter* c = static_cast<const counter* const*>(base)[i];
                                 return c != nullptr ? c->native_slot() : nullptr;
                               }};
  return detail::poll_slots(list, thresholds.data(), timeout.count(), opts);
}

} // namespace compcntr
