// compcntr:wait -- waiting for counters: wait, wait_since, poll_any, pollable fds.
//
// Purpose: runtimes spend their life waiting for a counter to reach a threshold. These calls
// answer as fast as the hardware allows when the answer is near and burn no CPU when it is far:
// (1) hot poll with `pause` for wait_options::spin (default 5 us), (2) compcntr::backoff (longer
// pauses, then yields, ~5-10 us), (3) register in the slot's `watch` word, re-check, FUTEX_WAIT.
// spin == 0 sleeps at once; spin_forever never sleeps. A wait's drive function
// (wait_options::drive) runs before every check and the waiter then sleeps at most
// drive_interval at a time; counters that need device progress (hardware-backed, or a device
// with progress sources) sleep at most 1 ms.
// Full reference: docs/wait.md.
//
// Requirements: the counters stay alive during the call (destroying one something waits on is
// undefined, as in verbs). Any number of threads may wait on, poll, arm and update the same
// counters at once.
// Guarantees: reached means value >= threshold as plain unsigned numbers (verbs, fi_cntr_wait;
// not wrap-aware: docs/wait.md says why); io_error when the error count differs from its sample
// at the wait's start (wait_since: from the caller's), the threshold winning at the same check;
// timed_out never early; poll_any is fair (each thread resumes its scan after its last answer).
// Memory ordering: success and io_error are acquire (the updater's earlier writes are visible).
// No lost wake-up: a sleeper's seq_cst RMW on `watch` before its re-check pairs with the
// updater's seq_cst RMW on the value before its load of `watch` (compcntr:slot). arm_fd is a
// seq_cst RMW + fence (with a threshold too: it then re-checks the condition): any later update
// signals the fd (a threshold arm: any later update that meets it); readiness orders nothing.
//
// Example:
//     std::thread t([&] { c.add(4); });
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

/// A wait's drive function: called by a waiting thread between checks, to drive progress
/// compcntr cannot see (the application's own CQ, a CQ bridge: compcntr_fi_bridge_progress).
/// It may update counters, but must not wait on the same counters, and must not throw (the
/// waits are noexcept). The C API calls it compcntr_progress_fn.
using wait_drive_fn = void (*)(void* ctx);
/// The former names of wait_drive_fn (until 0.2).
using wait_hook_fn [[deprecated("use compcntr::wait_drive_fn")]] = wait_drive_fn;
using progress_fn [[deprecated("use compcntr::wait_drive_fn")]] = wait_drive_fn;

/// wait_options::spin value: poll forever, never sleep (lowest latency, burns a core).
inline constexpr std::chrono::nanoseconds spin_forever = std::chrono::nanoseconds::max();
/// Default hot-poll time: about 15 cross-core round trips (310-320 ns each, the performance spec's reference):
/// an answer that is that close is caught at the cache-line transfer latency. With the backoff
/// stage after it (5-10 us) a waiter busy-waits ~10-15 us before it sleeps: about one futex
/// sleep + wake-up (see compcntr:backoff for why that is the right amount).
inline constexpr std::chrono::nanoseconds default_spin = std::chrono::microseconds(5);
/// Default longest sleep of a waiter that has a drive function; also the longest sleep of a
/// waiter on a hardware-backed counter or a device with progress sources, whatever its
/// drive_interval: 1 ms. A completion waits at most that long in an emulated backend's queue, and a waiter that
/// wakes 1000 times per second (a few us each) uses well under 1% of a core, against P6's budget
/// of 5%. libfabric's util wait uses 50 ms slices; this is finer.
inline constexpr std::chrono::microseconds default_drive_interval = std::chrono::milliseconds(1);
/// The former names of default_drive_interval (until 0.2).
[[deprecated("use compcntr::default_drive_interval")]] inline constexpr std::chrono::microseconds
    default_hook_interval = default_drive_interval;
[[deprecated("use compcntr::default_drive_interval")]] inline constexpr std::chrono::microseconds
    default_progress_interval = default_drive_interval;
/// timeout value: wait forever (any negative timeout does).
inline constexpr std::chrono::milliseconds wait_forever{-1};

/// How a wait or poll spends its time. Aggregate: `wait_options{.spin = 0ns, .drive = f}`.
/// (drive, drive_ctx, drive_interval were called hook, hook_ctx, hook_interval in 0.1.0, and
/// progress, progress_ctx, progress_interval before issue 13; renamed without aliases: a field
/// cannot be aliased without making designated initializers warn. The C struct
/// compcntr_wait_attr keeps the names progress, progress_ctx, progress_interval_us.)
struct wait_options {
  /// Hot-poll time before backing off and then sleeping; 0: sleep as soon as a check fails;
  /// spin_forever: never sleep. See the file comment.
  std::chrono::nanoseconds spin = default_spin;
  /// The wait's drive function: called before every check and between sleeps; nullptr: none.
  wait_drive_fn drive = nullptr;
  /// Passed to `drive`.
  void* drive_ctx = nullptr;
  /// Longest single sleep when `drive` is set (must be > 0); hardware-backed counters and
  /// devices with progress sources sleep at most min(this, 1 ms). Ignored otherwise: the waiter
  /// then sleeps until woken or timed out.
  std::chrono::microseconds drive_interval = default_drive_interval;
};

/// Outcome of poll_any: `status` is std::errc{} (counter `index` reached its threshold),
/// io_error (counter `index`'s error count changed), timed_out, invalid_argument or
/// not_enough_memory (`index` is then 0).
struct poll_result {
  std::errc status;
  std::size_t index;
};

} // namespace compcntr

namespace compcntr::detail {

/// A list of slots poll_any scans, independent of how the caller stores its counters.
struct slot_list {
  const void* base;
  std::size_t size;
  slot* (*at)(const void* base, std::size_t i) noexcept; ///< nullptr: not a live counter
};

/// One sleeping poll_any call. Internal.
struct poll_waiter {
  std::atomic<std::uint32_t> seq{0}; ///< futex word; bumped by every update it watches
  std::atomic<std::uint32_t> sleeping{0}; ///< 1 while (about to be) in FUTEX_WAIT
};

/// A poll_waiter's registration on one slot (an entry of the slot_ext's list). Internal.
struct poll_link {
  poll_waiter* waiter = nullptr;
  slot* s = nullptr;
  poll_link* prev = nullptr;
  poll_link* next = nullptr;
  bool linked = false;
};

/// What a single-counter wait waits for: done when ((value - base) & mask) >= need, i.e. the
/// counter moved at least `need` past `base` modulo mask + 1 (mask = the counter's max_value,
/// 2^k - 1), even if it wrapped on the way; fails with io_error when the error count differs
/// from `errors_seen`. compcntr::wait is base 0, mask all ones, need = threshold, errors
/// sampled at the start (`sample_errors`: a hardware mirror is refreshed first, so its catch-up
/// does not count as "during the wait"). The credit tracker counts modulo the counter's range:
/// need <= mask / 2 keeps "moved backwards" (a set() below base) apart from "moved forwards",
/// but a move backwards also ends the wait (the caller re-checks).
struct wait_goal {
  std::uint64_t base = 0;
  std::uint64_t need = 0;
  std::uint64_t mask = ~std::uint64_t{0};
  std::uint64_t errors_seen = 0;
  bool sample_errors = true;
};
/// The slow path of every single-counter wait (compcntr::wait, wait_since, the credit
/// tracker): the three phases of the file comment in one call (src/core/wait/wait.cpp).
std::errc wait_slot(slot& s, const wait_goal& goal, std::int64_t timeout_ms,
                    const wait_options& opts) noexcept;
/// wait() of a 2-stripe counter (every shared counter): a spin waiter's first block of polls in
/// a function of a small frame, whose exit is short (bench P18: the answer usually arrives
/// within it, and what runs between the poll that sees it and the caller's next update is a
/// ping-pong's latency); then wait_slot with the error count it sampled.
std::errc wait_two_stripes(slot& s, std::uint64_t threshold, std::int64_t timeout_ms,
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
/// destroyed; nothing may wait on or poll the counter then. The counter is gone, so nothing can
/// create a block now (that needs a live counter): a plain acquire load finds the common "none"
/// without a call or a locked exchange (bench P7).
void free_slot_ext_slow(slot& s) noexcept;
inline void free_slot_ext(slot& s) noexcept {
  if (s.ext.load(std::memory_order_acquire) != nullptr) [[unlikely]]
    free_slot_ext_slow(s);
}
/// The slot's pollable fd, created on first use (compcntr::pollable_fd).
int slot_fd(slot& s, std::error_code& ec) noexcept;
/// compcntr::arm_fd on a slot.
void arm_slot_fd(slot& s, std::error_code& ec) noexcept;
/// compcntr::arm_fd with a threshold on a slot.
void arm_slot_fd_threshold(slot& s, std::uint64_t threshold, std::error_code& ec) noexcept;

} // namespace compcntr::detail

export namespace compcntr {

/// Waits until `c.value() >= threshold` (std::errc{}), the error count changes during the wait
/// (io_error), or `timeout` passes (timed_out; elapsed time >= timeout). timeout < 0: forever;
/// 0: check once (after one drive call if a drive function is set). An empty counter is
/// invalid_argument. Memory ordering: acquire on success and io_error (file comment).
inline std::errc wait(counter_view c, std::uint64_t threshold, std::chrono::milliseconds timeout,
                      const wait_options& opts) noexcept {
  detail::slot* s = c.native_slot();
  if (s == nullptr) [[unlikely]]
    return detail::wait_on_empty();
  // Already there: one acquire load, no clock, no progress call (values only grow, except by
  // set(), so a stale hardware mirror that already shows the threshold is right too). The slot's
  // own word, not load_value(): a striped counter's is 0 for its whole life (everything is in
  // its stripes), so it passes here only for threshold 0, which any sum reaches; otherwise
  // wait_slot sums the stripes. Saves the stripes test on the satisfied path (bench P11).
  if (s->value.load(std::memory_order_acquire) >= threshold) return std::errc{};
  if ((s->stripes & detail::two_stripes_tag) != 0) [[unlikely]]
    return detail::wait_two_stripes(*s, threshold, timeout.count(), opts);
  return detail::wait_slot(*s, {.need = threshold}, timeout.count(), opts);
}

/// wait() against an error count the caller already read: io_error as soon as a check sees the
/// error count differ from `errors_seen` (the first check included), instead of "changed since
/// this call began". A caller that reads the counter, decides what to wait for, and then waits
/// (a loop over wait(), a credit tracker) has a window between its read and wait()'s own sample
/// in which an error change would go unseen; passing the count it read closes that window.
/// Otherwise as wait(): reaching the threshold wins over an error change seen at the same check,
/// an already-reached threshold costs one acquire load. Memory ordering: as wait().
inline std::errc wait_since(counter_view c, std::uint64_t threshold, std::uint64_t errors_seen,
                            std::chrono::milliseconds timeout,
                            const wait_options& opts = {}) noexcept {
  detail::slot* s = c.native_slot();
  if (s == nullptr) [[unlikely]]
    return detail::wait_on_empty();
  if (s->value.load(std::memory_order_acquire) >= threshold) return std::errc{}; // as wait()
  return detail::wait_slot(*s,
                           {.need = threshold, .errors_seen = errors_seen, .sample_errors = false},
                           timeout.count(), opts);
}

/// wait() with default options (5 us hot poll, back off, then sleep; no drive function).
/// The reached-threshold test comes before the options exist: built first, their stores stayed
/// in a caller's loop of satisfied waits (bench P11: 1.5x a read; the test alone is a read).
inline std::errc wait(counter_view c, std::uint64_t threshold,
                      std::chrono::milliseconds timeout) noexcept {
  if (const detail::slot* s = c.native_slot();
      s != nullptr && s->value.load(std::memory_order_acquire) >= threshold) [[likely]]
    return std::errc{}; // as in wait() above (a striped counter's own word is 0)
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
/// poll_any over views (counters reached through counter_refs, device::resolve, ...; an empty
/// view is invalid_argument).
poll_result poll_any(std::span<const counter_view> counters,
                     std::span<const std::uint64_t> thresholds, std::chrono::milliseconds timeout,
                     const wait_options& opts = {}) noexcept;
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
int pollable_fd(counter_view c, std::error_code& ec) noexcept;

/// Arms the counter's fd (pollable_fd() must have been called: else EINVAL): the next update of
/// the value or the error count after arm_fd makes the fd readable (POLLIN / EPOLLIN), once;
/// later updates cost nothing until the next arm_fd. Arming first drains an earlier readiness,
/// so the fd is not readable right after arm_fd unless an update raced with it. The pattern
/// (as fi_trywait): arm_fd, then check the counter, and only if it is not done, epoll_wait.
/// Readiness means "look at the counter"; it may be spurious (a racing update), never missed.
/// Memory ordering: seq_cst RMW + seq_cst fence (file comment).
void arm_fd(counter_view c, std::error_code& ec) noexcept;

/// Arms the counter's fd for a threshold (pollable_fd() first, else EINVAL): the fd becomes
/// readable once the completion count is >= `threshold` (plain unsigned compare, as wait), or
/// once the error count differs from its value at the arm -- not on the updates before that,
/// which leave it armed. An epoll-driven progress engine wakes once per batch instead of once
/// per completion. If the threshold is already reached (or an error raced with the arm), the
/// arm itself makes the fd readable: arm, then epoll_wait, never misses. One-shot like arm_fd
/// (the update that meets the condition disarms; re-arm to wait again); arming drains an
/// earlier readiness; a later arm_fd or arm_fd(threshold) replaces the condition. Readiness may
/// be spurious (a re-arm racing with an update), never missed; read the counter after it.
/// Cost: nothing while not armed; while armed below the threshold every update of the counter
/// takes the watcher path (a call re-reading watch, the armed condition and the values: ~55
/// instructions, no RMW, no syscall). Arm from one
/// thread at a time per counter. Memory ordering: as arm_fd (the condition is re-checked with
/// seq_cst loads after the arming RMW and fence).
void arm_fd(counter_view c, std::uint64_t threshold, std::error_code& ec) noexcept;

} // namespace compcntr
