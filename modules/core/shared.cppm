// compcntr:shared -- counters shared by the processes of a node: the entry points the core calls.
//
// Purpose: a shared device ("shm:NAME", device::open_shared) keeps its counters' values in a
// POSIX shared-memory segment that every process of the user (or of a group, by mode) opens by
// name (docs/shared.md). The slot of a counter stays process-local: a shared counter is a slot
// that points at its cell in the segment the way a striped counter points at its stripes (a
// cell is two 128-byte halves, read as a 2-stripe counter: value = half 0 + half 1), with
// slot::hw = &shared_counter_ops and the permanent bit watch_shared in slot::watch, so every
// update reaches slot::notify_slow, which calls notify_shared(): the segment's wake word and a
// non-private FUTEX_WAKE when its sleeper count says a waiter (of any process) sleeps.
// Requirements: the functions below take slots of a shared device only (is_shared()).
// Guarantees: no pointer read from the segment is ever followed; private counters pay nothing
// (their slots never have watch_shared; their add/read/create paths do not test it).
// Memory ordering (the cross-process form of compcntr:slot's Dekker pairing): an update is a
//   seq_cst RMW on its cell half, then the seq_cst load of the slot's `watch` (always non-zero
//   here), then a seq_cst load of the segment's `sleepers`; a waiter reads `wake_seq`, then
//   increments `sleepers` (seq_cst RMW), then re-reads the cell (seq_cst) and FUTEX_WAITs on
//   `wake_seq`. Seq_cst atomics on shared memory are ordered across processes as across
//   threads (same physical words; lock-free atomics are address-free), so no wake-up is lost.
//
// Example:
//     auto dev = compcntr::device::open("shm:job42", ec);      // creates or opens, owner-only
//     auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
//     send_to_peer(c.id());                                     // another process:
//     auto r = peer_dev.resolve(id, ec); r.add(1);              // counted in c, woken waiters
module;
#include <atomic>
#include <chrono>
#include <cstdint>
#include <system_error>
export module compcntr:shared;
import :slot;
import :types;

export namespace compcntr {

/// device::open_shared flags (C: COMPCNTR_SHARED_CREATE, COMPCNTR_SHARED_EXCL).
inline constexpr std::uint32_t shared_create = 1u << 0;  ///< create the segment if absent
inline constexpr std::uint32_t shared_excl = 1u << 1;    ///< with create: EEXIST if it is in use

} // namespace compcntr

namespace compcntr::detail {

/// Bit of slot::watch, set for the whole life of a shared counter's binding: every update goes
/// to notify_slow (which calls notify_shared). Not a count; never cleared by waiters.
inline constexpr std::uint32_t watch_shared = 1u << 27;

/// The process-local state of one opened segment (src/core/shared/segment_impl.cppm).
struct shared_segment;

/// The hardware-ops table of shared counters: set/set_error on the cell halves (add and
/// add_error are the inline 2-stripe path of slot::hw_add); no refresh (the cell is the value).
extern const hw_counter_ops shared_counter_ops;

/// Whether `s` is bound to a cell of a shared segment. Relaxed load: the bit is written before
/// the counter is handed out and cleared after its last reference is gone.
inline bool is_shared(const slot& s) noexcept {
  return (s.watch.load(std::memory_order_relaxed) & watch_shared) != 0;
}

/// notify_slow's part for shared counters: wakes the sleepers of every process (see above).
void notify_shared(slot& s) noexcept;

/// The node-wide id of a shared counter: {generation of its cell, cell index}.
counter_id shared_counter_id(const slot& s) noexcept;

/// The futex word and sleeper count a waiter on `s` uses (in the segment), and this process's
/// share of the count.
struct shared_wait_words {
  std::atomic<std::uint32_t>* word;
  std::atomic<std::uint32_t>* sleepers;
  std::atomic<std::uint32_t>* share;
};
/// A sleeper registers in the segment's count (seq_cst: the Dekker pairing above), then in
/// this process's share (relaxed: bookkeeping; the sweep reads a dead process's share with an
/// RMW, which sees the last value), and leaves in the opposite order: a process killed in
/// between leaves the count above the shares, never below (a needless wake, never a lost one).
inline void shared_sleeper_enter(const shared_wait_words& w) noexcept {
  w.sleepers->fetch_add(1, std::memory_order_seq_cst);
  w.share->fetch_add(1, std::memory_order_relaxed);
}
inline void shared_sleeper_leave(const shared_wait_words& w) noexcept {
  w.share->fetch_sub(1, std::memory_order_relaxed);
  w.sleepers->fetch_sub(1, std::memory_order_seq_cst);
}
shared_wait_words shared_words(const slot& s) noexcept;
/// The cell's count of sets (set, set_error: they may change nothing), seq_cst.
std::uint32_t shared_silent_updates(const slot& s) noexcept;
/// Whether the counter's creator died while others held it (a wait then ends with EIO).
bool shared_creator_died(const slot& s) noexcept;
/// Sweeps dead processes out of the segment unless this process did within the last second.
void shared_sweep_if_due(const slot& s) noexcept;
/// Pollable fds and triggers of shared counters (docs/shared.md, "Pollable fds", "Triggers"):
/// before an arm on `s` (`call` names it in errors), registers `s` with its segment's watcher (a
/// thread of this process, started by the first arm, that sleeps on the segment's wake word as
/// a waiter does and signals the armed fds, and fires the triggers, whose condition another
/// process's update met). EOWNERDEAD in a child forked after the device was opened (the watcher
/// is a thread of the parent), ENOMEM / EAGAIN when it cannot be started: nothing changed then.
/// Idempotent: a slot stays registered until it is unbound.
std::error_code shared_watch_fd(slot& s, const char* call) noexcept;
/// After the arm's RMW of watch_fd_armed: wakes the watcher if it is parked (nothing armed).
void shared_watch_kick(slot& s) noexcept;
/// The watcher's check of one registered slot (src/core/wait/ext.cpp): signals its fd if it is
/// armed and its condition holds (or `creator_dead`). Returns whether it is still armed.
bool shared_fd_check(slot& s, bool creator_dead) noexcept;
/// Longest sleep of a waiter on a shared counter: between two sleeps it re-checks, and sweeps
/// (shared_sweep_if_due), so a dead peer or a scribbled sleeper count delays it at most this.
inline constexpr std::chrono::milliseconds shared_sleep_slice{250};

} // namespace compcntr::detail
