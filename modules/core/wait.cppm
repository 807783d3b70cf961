// compcntr:wait -- waiting for counters: wait, poll_any, pollable fds, progress hooks.
//
// Purpose: runtimes spend their life waiting for a counter to reach a threshold. These calls
// answer as fast as the hardware allows when the answer is near (they poll), and burn no CPU
// when it is far (they sleep in the kernel on the slot's futex word).
//
// How a wait proceeds (wait_options::spin decides the first two phases):
//   1. hot:     check, `pause`, check, ... for `spin` (default 5 us). Lowest latency.
//   2. backoff: compcntr::backoff::snooze() between checks: longer and longer pauses, then a few
//               sched_yield()s (about 5-10 us more, see compcntr:backoff).
//   3. sleep:   register in the slot's `watch` word, re-check, FUTEX_WAIT on `wake_seq`.
//   spin == 0 skips 1 and 2 (every wait that is not already satisfied sleeps: the "forced
//   sleep" mode); spin == spin_forever never leaves 1 (the "spin only" mode: never sleeps).
// A progress hook is called before every check of every phase, and a waiter with a hook sleeps
// at most progress_interval at a time, so it never stops driving progress. A waiter on a
// hardware-backed counter (whose device writes do not wake anyone) or on a counter whose device
// has progress sources (emulated verbs CQs, driven with no hook needed) sleeps at most
// min(progress_interval, 1 ms). Whether to slice is decided at each sleep, after registering:
// attaching a counter to a QP wakes its sleepers so they decide again (slot::kick).
//
// Threshold comparison: a counter has reached `threshold` when `value >= threshold`, compared as
// plain unsigned 64-bit numbers (verbs, fi_cntr_wait and PtlCTWait semantics). This is NOT
// wrap-aware: a counter that passes the threshold and then wraps past max_value before the
// waiter looks has not "reached" it. Serial-number comparison (RFC 1982: (int64_t)(value -
// threshold) >= 0) would survive wrap, but would call every threshold more than 2^63 ahead
// "already reached" (wait(c, UINT64_MAX, t), the usual way to wait for errors only, would return
// at once). At 64 bits wrap needs 2^64 increments (584 years at 10^9 per second) or a set()
// near max_value, so >= is the right trade; a runtime using set() near the top of the range
// must compute its thresholds with that in mind.
//
// Errors: the error count is sampled when the wait begins; the wait fails with EIO
// (std::errc::io_error, libfabric's -FI_EAVAIL) when it differs from that sample at a check.
// A change before the wait began does not count. Reaching the threshold wins over an error
// change seen at the same check (the order fi_cntr_wait uses).
//
// Memory ordering (Abseil style, for every operation of this file):
//   * wait / poll_any success or EIO: acquire. Everything the thread that made the counter reach
//     the threshold (or changed its error count) wrote before its add()/set() is visible after
//     the call returns. The checks are seq_cst loads (a plain load on x86-64).
//   * No lost wake-up: a sleeper increments slot::watch (seq_cst RMW) and then re-checks (seq_cst
//     loads); an updater changes the value (seq_cst RMW or store) and then loads watch (seq_cst).
//     In the single total order of seq_cst operations one of them sees the other (the Dekker
//     argument of compcntr:slot). The futex word (wake_seq) is read before the re-check and
//     bumped by the updater before FUTEX_WAKE, so a waiter between its re-check and the kernel
//     finds it changed. Every happens-before edge goes through the C++ atomics, never through
//     the futex syscall alone, so ThreadSanitizer (which does not model futexes) sees them.
//   * arm_fd: a seq_cst RMW of slot::watch followed by a seq_cst fence. Any update that comes
//     after it in the total order makes the fd readable; an update before it is visible to a
//     read of the counter made after arm_fd returns. fd readiness itself orders nothing: read
//     the counter (acquire) after the fd reports readable.
//   * progress hooks run in the waiting thread, with no compcntr lock held and the waiter not
//     registered as a sleeper (a hook's own increments cost no wake-up syscall).
//
// Requirements: the counters stay alive during the call (destroying a counter something waits
// on, or polls on, is undefined, as in verbs). Any number of threads may wait on, poll on, arm
// and update the same counters at once.
//
// Example:
//     std::error_code ec;
//     auto dev = compcntr::device::open("soft", ec);
//     auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
//     std::thread t([&] { c.add(4); });
//     using namespace std::chrono_literals;
//     if (compcntr::wait(c, 4, 1s) == std::errc{}) { /* 4 completions */ }
//     t.join();
module;
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>
export module compcntr:wait;
import :slot;
import :counter;
import :backoff;

export namespace compcntr {

/// A progress function: called by a waiting thread between checks (an emulated backend drains
/// its completion queue here). It may update counters, but must not wait on the same counters,
/// and must not throw (the waits are noexcept).
using progress_fn = void (*)(void* ctx);

/// wait_options::spin value: poll forever, never sleep (lowest latency, burns a core).
inline constexpr std::chrono::nanoseconds spin_forever = std::chrono::nanoseconds::max();
/// Default hot-poll time: about 15 cross-core round trips (310-320 ns each, performance.md):
/// an answer that is that close is caught at the cache-line transfer latency. With the backoff
/// stage after it (5-10 us) a waiter busy-waits ~10-15 us before it sleeps: about one futex
/// sleep + wake-up (see compcntr:backoff for why that is the right amount).
inline constexpr std::chrono::nanoseconds default_spin = std::chrono::microseconds(5);
/// Default longest sleep of a waiter that has a progress hook (or waits on a hardware-backed
/// counter): 1 ms. A completion waits at most that long in an emulated backend's queue, and a
/// waiter that wakes 1000 times per second (a few us each) uses well under 1% of a core,
/// against P6's budget of 5%. libfabric's util wait uses 50 ms slices; this is finer.
inline constexpr std::chrono::microseconds default_progress_interval = std::chrono::milliseconds(1);
/// timeout value: wait forever (any negative timeout does).
inline constexpr std::chrono::milliseconds wait_forever{-1};

/// How a wait or poll spends its time. Aggregate: `wait_options{.spin = 0ns}`.
struct wait_options {
  /// Hot-poll time before backing off and then sleeping; 0: sleep as soon as a check fails;
  /// spin_forever: never sleep. See the file comment.
  std::chrono::nanoseconds spin = default_spin;
  /// Called before every check and between sleeps; nullptr: none.
  progress_fn progress = nullptr;
  /// Passed to `progress`.
  void* progress_ctx = nullptr;
  /// Longest single sleep when `progress` is set (must be > 0); hardware-backed counters and
  /// devices with progress sources sleep at most min(this, 1 ms). Ignored otherwise: the waiter
  /// then sleeps until woken or timed out.
  std::chrono::microseconds progress_interval = default_progress_interval;
};

/// Outcome of poll_any: `status` is std::errc{} (counter `index` reached its threshold),
/// io_error (counter `index`'s error count changed), timed_out, invalid_argument or
/// not_enough_memory (`index` is then 0).
struct poll_result {
  std::errc status;
  std::size_t index;
};

}  // namespace compcntr

export namespace compcntr::detail {

/// A list of slots poll_any scans, independent of how the caller stores its counters.
struct slot_list {
  const void* base;
  std::size_t size;
  slot* (*at)(const void* base, std::size_t i) noexcept;  ///< nullptr: not a live counter
};

/// One sleeping poll_any call. Internal.
struct poll_waiter {
  std::atomic<std::uint32_t> seq{0};       ///< futex word; bumped by every update it watches
  std::atomic<std::uint32_t> sleeping{0};  ///< 1 while (about to be) in FUTEX_WAIT
};

/// A poll_waiter's registration on one slot (an entry of the slot_ext's list). Internal.
struct poll_link {
  poll_waiter* waiter = nullptr;
  slot* s = nullptr;
  poll_link* prev = nullptr;
  poll_link* next = nullptr;
  bool linked = false;
};

/// Slow path of compcntr::wait (src/core/wait/wait.cpp).
std::errc wait_slow(slot& s, std::uint64_t threshold, std::int64_t timeout_ms,
                    const wait_options& opts) noexcept;
/// Slow path of compcntr::wait_since: as wait_slow, with the error baseline given.
std::errc wait_slow_since(slot& s, std::uint64_t threshold, std::uint64_t errors_seen,
                          std::int64_t timeout_ms, const wait_options& opts) noexcept;
/// wait_slow_since with a wrap-aware goal: done when ((value - base) & mask) >= need, i.e. the
/// counter moved at least `need` past `base` modulo mask + 1 (mask = the counter's max_value,
/// 2^k - 1), even if it wrapped on the way. For callers that count modulo the counter's range
/// (the credit tracker); need <= mask / 2 keeps "moved backwards" (a set() below base) apart
/// from "moved forwards", but a move backwards also ends the wait (the caller re-checks).
/// wait_slow_since is this with base 0, mask all ones, need = threshold.
std::errc wait_slow_distance(slot& s, std::uint64_t base, std::uint64_t need, std::uint64_t mask,
                             std::uint64_t errors_seen, std::int64_t timeout_ms,
                             const wait_options& opts) noexcept;
/// compcntr::poll_any over any list of slots (src/core/wait/poll.cpp).
poll_result poll_slots(const slot_list& slots, const std::uint64_t* thresholds,
                       std::int64_t timeout_ms, const wait_options& opts) noexcept;
/// Records "wait: counter is empty" and returns invalid_argument.
std::errc wait_on_empty() noexcept;

/// Adds `l` (waiter and s set) to its slot's poller list and sets watch_pollers. False (and
/// `l` stays unlinked) if the slot's extension block cannot be allocated. (src/core/wait/ext.cpp)
bool register_poller(poll_link& l) noexcept;
/// Removes a linked `l`; clears watch_pollers when the list becomes empty.
void unregister_poller(poll_link& l) noexcept;
/// The part of slot::notify_slow for fds and pollers (`w`: the watch word it loaded).
void notify_ext(slot& s, std::uint32_t w) noexcept;
/// Closes the counter's fd and frees its extension block. Called when the counter is
/// destroyed; nothing may wait on or poll the counter then.
void free_slot_ext(slot& s) noexcept;
/// The slot's pollable fd, created on first use (compcntr::pollable_fd).
int slot_fd(slot& s, std::error_code& ec) noexcept;
/// compcntr::arm_fd on a slot.
void arm_slot_fd(slot& s, std::error_code& ec) noexcept;

}  // namespace compcntr::detail

export namespace compcntr {

/// Waits until `c.value() >= threshold` (std::errc{}), the error count changes during the wait
/// (io_error), or `timeout` passes (timed_out; elapsed time >= timeout). timeout < 0: forever;
/// 0: check once (after one progress call if a hook is set). An empty counter is
/// invalid_argument. Memory ordering: acquire on success and io_error (file comment).
inline std::errc wait(const counter& c, std::uint64_t threshold, std::chrono::milliseconds timeout,
                      const wait_options& opts) noexcept {
  detail::slot* s = c.native_slot();
  if (s == nullptr) [[unlikely]] return detail::wait_on_empty();
  // Already there: one acquire load, no clock, no progress call (values only grow, except by
  // set(), so a stale hardware mirror that already shows the threshold is right too).
  if (s->load_value() >= threshold) return std::errc{};
  return detail::wait_slow(*s, threshold, timeout.count(), opts);
}

/// wait() against an error count the caller already read: io_error as soon as a check sees the
/// error count differ from `errors_seen` (the first check included), instead of "changed since
/// this call began". A caller that reads the counter, decides what to wait for, and then waits
/// (a loop over wait(), a credit tracker) has a window between its read and wait()'s own sample
/// in which an error change would go unseen; passing the count it read closes that window.
/// Otherwise as wait(): reaching the threshold wins over an error change seen at the same check,
/// an already-reached threshold costs one acquire load. Memory ordering: as wait().
inline std::errc wait_since(const counter& c, std::uint64_t threshold, std::uint64_t errors_seen,
                            std::chrono::milliseconds timeout,
                            const wait_options& opts = {}) noexcept {
  detail::slot* s = c.native_slot();
  if (s == nullptr) [[unlikely]] return detail::wait_on_empty();
  if (s->load_value() >= threshold) return std::errc{};
  return detail::wait_slow_since(*s, threshold, errors_seen, timeout.count(), opts);
}

/// wait() with default options (5 us hot poll, back off, then sleep; no progress hook).
inline std::errc wait(const counter& c, std::uint64_t threshold,
                      std::chrono::milliseconds timeout) noexcept {
  return wait(c, threshold, timeout, wait_options{});
}

/// Waits until one of `counters` reaches its threshold (`thresholds[i]`, same length) and
/// returns its index; or the error count of one changes during the call (io_error + its
/// index); or `timeout` passes (timed_out). Model: Portals 4 PtlCTPoll. Fair: each call starts
/// its scan just after the index the calling thread's previous successful poll_any returned,
/// so counters that stay ready are returned in turn (none starves). The same counter may
/// appear twice. invalid_argument: empty list, different lengths, or an empty counter.
/// not_enough_memory: no memory for the per-call error samples (more than 32 counters).
/// Memory ordering: as wait() for the counter returned.
poll_result poll_any(std::span<const counter> counters, std::span<const std::uint64_t> thresholds,
                     std::chrono::milliseconds timeout, const wait_options& opts = {}) noexcept;
/// poll_any over counters held elsewhere (a null pointer is invalid_argument).
poll_result poll_any(std::span<const counter* const> counters,
                     std::span<const std::uint64_t> thresholds, std::chrono::milliseconds timeout,
                     const wait_options& opts = {}) noexcept;

/// The counter's pollable file descriptor (an eventfd, non-blocking, close-on-exec), created on
/// the first call; later calls return the same fd. The counter owns it: it is closed when the
/// counter's slot is released (at destroy; for a C++ counter dropped while a QP still counts
/// into it, when that QP is destroyed). Do not close it yourself. Creating it costs the increment path
/// nothing; only arm_fd() does, until the next update. -1 and ec on failure (EMFILE, ENFILE,
/// ENOMEM from eventfd; EINVAL for an empty counter).
int pollable_fd(const counter& c, std::error_code& ec) noexcept;

/// Arms the counter's fd (pollable_fd() must have been called: else EINVAL): the next update of
/// the value or the error count after arm_fd makes the fd readable (POLLIN / EPOLLIN), once;
/// later updates cost nothing until the next arm_fd. Arming first drains an earlier readiness,
/// so the fd is not readable right after arm_fd unless an update raced with it. The pattern
/// (as fi_trywait): arm_fd, then check the counter, and only if it is not done, epoll_wait.
/// Readiness means "look at the counter"; it may be spurious (a racing update), never missed.
/// Memory ordering: seq_cst RMW + seq_cst fence (file comment).
void arm_fd(const counter& c, std::error_code& ec) noexcept;

}  // namespace compcntr
