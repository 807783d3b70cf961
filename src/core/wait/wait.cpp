// compcntr::wait: wait_slot, the slow path of every single-counter wait (compcntr::wait,
// wait_since, the credit tracker): the spin waiter's fast entry, the hot poll block, the sleep on
// the slot's own futex word, and the waits on shared counters (compcntr:shared). The phase engine
// it runs: the internal partition compcntr:wait_impl (src/core/wait/wait_impl.cppm); poll_any:
// poll.cpp. See modules/core/wait.cppm for the contract.
module;
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <system_error>
#include <utility>
#include "core/wait/futex.hpp"
module compcntr;
import :wait_impl;

namespace compcntr::detail {
namespace {

// One block of clock_stride hot polls of a counter whose checks need nothing but loads: `pause`,
// then test()'s two seq_cst reads (value first, so a reached threshold wins over an error) and
// compares. The one hot poll loop: the spin waiter's fast entry and the engine's poll(n) both run
// it. `Words` reads the counter: one word each (a plain counter) or the sum of two stripes (a
// 2-stripe counter: striped on a 2-CPU node, and every shared counter). Plain (base 0, full
// mask: the common threshold) compares without the subtraction. Unrolled by a fold over the poll
// index (a `#pragma unroll` loop in an inlined function was not: +1.3 instructions per poll,
// bench/opcount.sh wait_poll), the bounds in registers across the block.
//
// The words and bounds by value, the poll an always-inlined lambda (a GNU attribute after its
// parameter list; `[[gnu::always_inline]]` there is clang's attribute of the closure type,
// ignored with a warning, and left the 2-stripe block reloading its words from the stack after
// every seq_cst load): the block keeps them in registers, 7 instructions per poll of a plain
// counter.
template <bool Plain, class Words, std::size_t... K>
[[gnu::always_inline]] inline outcome hot_block_of(Words w, std::uint64_t base, std::uint64_t mask,
                                                   std::uint64_t goal, std::uint64_t err0,
                                                   std::index_sequence<K...>) noexcept {
  outcome r = pending;
  auto once = [&]() __attribute__((always_inline)) noexcept {
    cpu_relax();
    const std::uint64_t v = w.value();
    if ((Plain ? v : (v - base) & mask) >= goal) [[unlikely]] {
      r = {true, std::errc{}, 0};
      return true;
    }
    if (w.errors() != err0) [[unlikely]] {
      r = {true, std::errc::io_error, 0};
      return true;
    }
    return false;
  };
  static_cast<void>(((static_cast<void>(K), once()) || ...));
  return r;
}

// The counter's words as a hot block reads them (seq_cst loads, as slot::value_seq_cst).
struct one_word {
  const std::atomic<std::uint64_t>* v;
  const std::atomic<std::uint64_t>* e;
  [[gnu::always_inline]] inline std::uint64_t value() const noexcept {
    return v->load(std::memory_order_seq_cst);
  }
  [[gnu::always_inline]] inline std::uint64_t errors() const noexcept {
    return e->load(std::memory_order_seq_cst);
  }
};
struct two_stripes {
  const stripe* st;
  [[gnu::always_inline]] inline std::uint64_t value() const noexcept {
    return st[0].value.load(std::memory_order_seq_cst) +
           st[1].value.load(std::memory_order_seq_cst);
  }
  [[gnu::always_inline]] inline std::uint64_t errors() const noexcept {
    return st[0].errors.load(std::memory_order_seq_cst) +
           st[1].errors.load(std::memory_order_seq_cst);
  }
};

template <bool Plain, class Words>
[[gnu::always_inline]] inline outcome hot_block(Words w, std::uint64_t base, std::uint64_t mask,
                                                std::uint64_t goal, std::uint64_t err0) noexcept {
  return hot_block_of<Plain>(w, base, mask, goal, err0, std::make_index_sequence<clock_stride>{});
}

// The stripes of a 2-stripe counter whose updates all go to them (striped_counter_ops and
// shared_counter_ops: no refresh, nothing native), or nullptr: such a counter's hot poll reads
// the two stripes' lines and nothing else.
inline const stripe* hot_two_stripes(const slot& s) noexcept {
  if ((s.stripes & two_stripes_tag) == 0 || s.hw->refresh != nullptr) return nullptr;
  return s.stripe_array();
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
// the segment's sleeper count (seq_cst RMW; and in this process's share of it), re-test (seq_cst loads of the cell), sleep on the
// word with a non-private futex, at most shared_sleep_slice; then sweep dead peers if due, so a
// forever-wait on a counter whose creator died ends (shared_check: EIO).
template <class Test>
outcome shared_sleep(const slot& s, Test& test, nanoseconds rel) noexcept {
  const shared_wait_words w = shared_words(s);
  const std::uint32_t seq = w.word->load(std::memory_order_acquire);
  shared_sleeper_enter(w);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const outcome r = shared_check(s, test);
  if (!r.done) futex::wait_shared(*w.word, seq, capped(rel, nanoseconds(shared_sleep_slice), true));
  shared_sleeper_leave(w);
  if (!r.done) shared_sweep_if_due(s);
  return r;
}

} // namespace

std::errc wait_on_empty() noexcept {
  return std::errc(fail(EINVAL, "wait: the counter is empty (moved from or destroyed)").value());
}

std::errc wait_two_stripes(slot& s, std::uint64_t need, std::int64_t timeout_ms,
                           const wait_options& o) noexcept {
  const stripe* const two = hot_two_stripes(s);
  if (two == nullptr) return wait_slot(s, {.need = need}, timeout_ms, o);
  // The error count now, as wait_slot would sample it; passed on, so an error change between
  // here and the engine is seen (errors_seen).
  const two_stripes w{two};
  const std::uint64_t err0 = w.errors();
  if (o.spin > nanoseconds::zero() && timeout_ms != 0 && o.drive == nullptr &&
      s.dev->progress_sources().empty()) [[likely]] {
    if (w.value() >= need) return std::errc{};
    if (const outcome r = hot_block<true>(w, 0, ~std::uint64_t{0}, need, err0); r.done) return r.ec;
  }
  return wait_slot(s, {.need = need, .errors_seen = err0, .sample_errors = false}, timeout_ms, o);
}

std::errc wait_slot(slot& s, const wait_goal& g, std::int64_t timeout_ms,
                    const wait_options& o) noexcept {
  void (*const refresh)(slot&) noexcept = s.hw != nullptr ? s.hw->refresh : nullptr;
  std::uint64_t err0 = g.errors_seen;
  if (g.sample_errors) {
    if (refresh != nullptr) refresh(s); // so a stale mirror's catch-up is not "during the wait"
    err0 = s.errors_seq_cst();
  }
  const std::uint64_t base = g.base, need = g.need, mask = g.mask;

  // Fast entry of a spin waiter on a plain software counter (bench P4): nothing to drive (no
  // drive; no hw table, so neither refreshed nor striped; no device progress source), a plain
  // threshold. One block of clock_stride polls right away, before the engine below sets up its
  // checks, deadline and spin budget (~160 instructions): an answer already on its way (a
  // ping-pong at cache-line latency, ~35 ns per half on an idle machine) is seen without that
  // entry. The engine then runs as if called after this block: its deadline and budget count
  // from there (at most ~0.5 us later, never earlier: a timed-out wait still lasted >= timeout).
  // Checks as test(): seq_cst loads, value first, so a reached threshold wins over an error.
  if (o.spin > nanoseconds::zero() && timeout_ms != 0 && o.drive == nullptr && s.hw == nullptr &&
      base == 0 && mask == ~std::uint64_t{0} && s.dev->progress_sources().empty()) [[likely]] {
    if (s.value.load(std::memory_order_seq_cst) >= need) return std::errc{};
    if (s.errors.load(std::memory_order_seq_cst) != err0) return std::errc::io_error;
    if (const outcome r =
            hot_block<true>(one_word{&s.value, &s.errors}, 0, ~std::uint64_t{0}, need, err0);
        r.done)
      return r.ec;
  }
  // The same for a 2-stripe counter (P18: every shared counter is one): a spin waiter's first
  // block reads the two stripes at once. A shared counter's "creator died" check (EIO) is for a
  // wait that is not done: the engine makes it.
  const stripe* const two = s.hw != nullptr ? hot_two_stripes(s) : nullptr;
  if (two != nullptr && o.spin > nanoseconds::zero() && timeout_ms != 0 && o.drive == nullptr &&
      s.dev->progress_sources().empty()) {
    const two_stripes w{two};
    if (((w.value() - base) & mask) >= need) return std::errc{};
    if (w.errors() != err0) return std::errc::io_error;
    if (const outcome r = hot_block<false>(w, base, mask, need, err0); r.done) return r.ec;
  }

  auto test = [&]() noexcept -> outcome {
    if (((s.value_seq_cst() - base) & mask) >= need) return {true, std::errc{}, 0};
    if (s.errors_seq_cst() != err0) return {true, std::errc::io_error, 0};
    return pending;
  };
  // The device's own progress sources (emulated verbs CQs) are driven like a drive function: a
  // waiter on a counter fed by a wrapped ibv_qp needs no drive of its own. One relaxed load
  // when none.
  device_core& dev = *s.dev;
  const bool shared = is_shared(s);
  auto check = [&]() noexcept -> outcome {
    if (o.drive) o.drive(o.drive_ctx);
    dev.progress();
    if (refresh) refresh(s);
    if (shared) [[unlikely]]
      return shared_check(s, test);
    return test();
  };
  // The hot poll. With nothing to drive (no drive, no refresh, no progress source: the software
  // counter case) a poll is `pause`, two loads of the counter's line and two compares (callgrind:
  // bench/opcount.sh wait_poll), as close to a raw spin loop as the EIO check allows; the plain
  // threshold (base 0, full mask) has its own loop without the subtraction. Whether there is
  // something to drive is looked at again for every block of polls (a device may gain progress
  // sources while a waiter spins), one relaxed load per block.
  auto poll = [&](unsigned n) noexcept -> outcome {
    if (o.drive != nullptr || refresh != nullptr || !dev.progress_sources().empty() ||
        n != clock_stride) [[unlikely]]
      return poll_with(check, n);
    if (s.striped()) [[unlikely]] {
      // A 2-stripe counter (every shared one): a block of hot polls over its two stripes, then
      // the shared counter's EIO check once per block instead of after every poll.
      if (two == nullptr) return poll_with(check, n);
      const outcome r = hot_block<false>(two_stripes{two}, base, mask, need, err0);
      if (!r.done && shared && shared_creator_died(s)) return {true, std::errc::io_error, 0};
      return r;
    }
    if (base == 0 && mask == ~std::uint64_t{0})
      return hot_block<true>(one_word{&s.value, &s.errors}, 0, mask, need, err0);
    return hot_block<false>(one_word{&s.value, &s.errors}, base, mask, need, err0);
  };
  auto sleep = [&](nanoseconds rel, nanoseconds slice) noexcept -> outcome {
    if (shared) [[unlikely]]
      return shared_sleep(s, test, sleep_cap(rel, slice, o.drive != nullptr, false));
    // Sequence first (acquire), then register (seq_cst RMW), then re-test (seq_cst loads): an
    // update the re-test misses sees the registration and bumps wake_seq after this read, so
    // FUTEX_WAIT either finds the word changed or is woken (compcntr:slot, compcntr:wait).
    const std::uint32_t seq = s.wake_seq.load(std::memory_order_acquire);
    s.watch.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst); // registration before the checks below
    const outcome r = test();
    if (!r.done)
      futex::wait(s.wake_seq, seq,
                  sleep_cap(rel, slice, o.drive != nullptr, slot_needs_progress(s)));
    s.watch.fetch_sub(1, std::memory_order_seq_cst);
    return r;
  };
  return run_phases(timeout_ms, o, check, poll, sleep).ec;
}

} // namespace compcntr::detail
