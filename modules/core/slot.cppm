// compcntr:slot -- one counter's memory, and every memory-ordering rule of the library.
//
// Purpose: the slot is the "mirror" of a completion counter: the single place where readers,
// waiters and pollers look. Software completions are atomic RMWs on it; native hardware counters
// are DMA-written into it by the device (EFA) or refreshed into it by the backend (slot::hw).
// Layout (one 128-byte block, compcntr:cache_padded says why 128):
//   line 0: value, errors, wake_seq, type, backend_data -- written by updates, polled by waiters
//   line 1: watch, pins, hw, generation, refs, ext, owner, pool links -- read by updates, rarely
//           written (who holds a slot and when it is freed: compcntr:lifetime)
// Requirements: a slot is used only while its counter lives (or a pin holds it bound).
// Guarantees: two slots never share a 128-byte block (no false sharing between counters); an
// update with nobody watching costs its RMW plus one load; add() never loses an increment;
// set() replaces the value (increments racing with it may be lost: verbs rule).
// Memory ordering:
//   * updates are seq_cst RMWs/stores on the value, then a seq_cst load of `watch`; a waiter
//     publishes itself in `watch` with a seq_cst RMW, then re-reads the value (seq_cst). In the
//     single total order of seq_cst operations either the updater sees the waiter (and wakes
//     it) or the waiter sees the update (and does not sleep): no lost wake-up. On x86-64 this
//     costs nothing over release/acquire (`lock xadd`, plain `mov`).
//   * an update releases: what the updater wrote before add() is visible to a thread whose
//     value()/errors() (acquire) returns the updated value or a later one.
//   * the same Dekker pairing covers poll_any (watch_pollers) and armed fds (watch_fd_armed):
//     notify_slow() (src/core/slot.cpp) wakes futex sleepers, signals the armed fd once and
//     bumps the futex word of every registered poll_any.
//
// Example (what compcntr::counter does; the library's layers use slots directly):
//     slot.add(1);                                    // completion: seq_cst RMW + load of watch
//     std::uint64_t v = slot.load_value();            // reader: one acquire load
module;
#include <atomic>
#include <cstddef>
#include <cstdint>
export module compcntr:slot;
import :cache_padded;
import :types;

export namespace compcntr::detail {

struct slot;
class device_core;

/// Native (hardware-backed) counter operations. nullptr in slot::hw means "software counter":
/// the slot itself is the counter and every operation is an atomic on it.
struct hw_counter_ops {
  void (*add)(slot&, std::uint64_t) noexcept;
  void (*add_error)(slot&, std::uint64_t) noexcept;
  void (*set)(slot&, std::uint64_t) noexcept;
  void (*set_error)(slot&, std::uint64_t) noexcept;
  /// Brings value/errors up to date for backends whose device does not write into the slot.
  void (*refresh)(slot&) noexcept;
};

/// Bits of slot::watch: who must hear about an update.
inline constexpr std::uint32_t watch_sleepers_mask = 0x00ffffffu;  ///< waiters asleep in futex
inline constexpr std::uint32_t watch_fd_armed = 1u << 24;           ///< a pollable fd is armed
inline constexpr std::uint32_t watch_hook = 1u << 25;               ///< an update hook is armed
inline constexpr std::uint32_t watch_pollers = 1u << 26;            ///< poll_any sleepers in ext

/// Extension block for rarely used per-counter features, allocated on demand (first pollable_fd
/// or first poll_any that sleeps on the counter) and freed when the counter is destroyed: the
/// counter's eventfd and the list of sleeping poll_any calls. Defined in src/core/wait/ext.cpp, the
/// only place that touches its members; the hot path never does (watch says when it must).
struct slot_ext;

struct alignas(false_sharing_range) slot {
  // ---- line 0: the values (written by every update, polled by waiters), and two fields that
  // are fixed for the counter's life (written only when the pool hands the slot out).
  std::atomic<std::uint64_t> value{0};      ///< completion count
  std::atomic<std::uint64_t> errors{0};     ///< error count
  std::atomic<std::uint32_t> wake_seq{0};   ///< futex word: bumped when sleepers must wake
  counter_type type = counter_type::wrs;    ///< read by completions right before their RMW
  void* backend_data = nullptr;             ///< native counter object of the backend, if any

  // ---- line 1: read by every update (hw before its RMW, watch after it), written rarely:
  // waiters registering, create/destroy, attach, in-flight queries. Keeping `watch` and `hw` off
  // line 0 matters when another core polls the value: an updater that loads from the line its
  // RMW just wrote, while the poller is fetching that line, pays for the line a second time
  // (bench P4: 1.7-2.4x a raw spin ping-pong with them on line 0, 1.02-1.16x here).
  alignas(cache_line_size)
  std::atomic<std::uint32_t> watch{0};      ///< sleepers | watch_fd_armed | watch_hook | pollers
  /// Transient holds that keep the slot bound while the counter may already be destroyed
  /// (in-flight async queries, refreshers); never make destroy EBUSY. compcntr:lifetime.
  std::atomic<std::uint32_t> pins{0};
  const hw_counter_ops* hw = nullptr;       ///< nullptr: software counter (read before the RMW)
  /// Bumped when the slot is freed (compcntr:lifetime): a counter_id taken from one owner
  /// never matches a later owner. 64 bits, so it cannot wrap while an id is kept (2^32 reuses
  /// of one slot take minutes in a create/destroy loop; 2^64 take millennia).
  std::atomic<std::uint64_t> generation{0};
  std::atomic<std::uint32_t> next_free{0};  ///< pool free-list link (slot index + 1, 0 = end)
  std::atomic<std::uint32_t> refs{0};       ///< owner + holders (compcntr:lifetime)
  std::atomic<slot_ext*> ext{nullptr};      ///< optional features (see slot_ext)
  // Fixed for the counter's life, kept here rather than on line 0 so that destroying a counter
  // touches line 1 only (refs, pins, ext, owner, pool links). Measured: no change in bench P7
  // on this machine (the adjacent-line prefetcher brings line 0 along anyway); kept because it
  // leaves line 0 to the values and what completions read with them.
  device_core* owner = nullptr;             ///< device whose counter this is
  std::uint32_t index = 0;                  ///< position in the pool, fixed for the slot's life
  /// OS index of the NUMA node the pool assigned this slot's arena to, fixed for the slot's
  /// life (memory really lives there when slot_pool::memory_bound()).
  std::int32_t numa_node = 0;

  // ---- hot operations (inline: one atomic each on the software path) ----

  /// Completion count. Memory ordering: acquire.
  inline std::uint64_t load_value() const noexcept { return value.load(std::memory_order_acquire); }
  /// Error count. Memory ordering: acquire.
  inline std::uint64_t load_errors() const noexcept { return errors.load(std::memory_order_acquire); }

  /// value += n (wrapping at 2^64). Memory ordering: seq_cst RMW (see file comment).
  inline void add(std::uint64_t n) noexcept {
    if (hw != nullptr) [[unlikely]] return hw->add(*this, n);
    value.fetch_add(n, std::memory_order_seq_cst);
    notify();
  }
  /// errors += n. Memory ordering: as add().
  inline void add_error(std::uint64_t n) noexcept {
    if (hw != nullptr) [[unlikely]] return hw->add_error(*this, n);
    errors.fetch_add(n, std::memory_order_seq_cst);
    notify();
  }
  /// value = v. Memory ordering: seq_cst store; concurrent add()s may be lost (verbs rule).
  inline void set(std::uint64_t v) noexcept {
    if (hw != nullptr) [[unlikely]] return hw->set(*this, v);
    value.store(v, std::memory_order_seq_cst);
    notify();
  }
  /// errors = v. Memory ordering: as set().
  inline void set_error(std::uint64_t v) noexcept {
    if (hw != nullptr) [[unlikely]] return hw->set_error(*this, v);
    errors.store(v, std::memory_order_seq_cst);
    notify();
  }

  /// After an update: wake sleepers / signal armed fds, but only if someone is watching.
  /// The common case is one seq_cst load (a plain mov on x86-64) of a word on the same line.
  inline void notify() noexcept {
    if (watch.load(std::memory_order_seq_cst) != 0) [[unlikely]] notify_slow();
  }
  void notify_slow() noexcept;  // src/core/slot.cpp
  /// Wakes the counter's sleeping waiters and poll_any calls although its values did not change,
  /// so they re-decide how to sleep: called when the counter starts depending on a device
  /// progress source (attached to a QP whose completions must be driven), which a waiter that
  /// went to sleep before cannot know. Does not signal an armed fd (nothing changed for it).
  /// Memory ordering: a seq_cst fence, then the seq_cst load of `watch`: pairs with a waiter's
  /// registration RMW + fence before it looks at the device's progress sources, so either the
  /// waiter sees the new source or this sees the waiter. One fence and one load if nobody waits.
  void kick() noexcept;  // src/core/slot.cpp
};

static_assert(sizeof(slot) == false_sharing_range, "a slot is exactly one padded block");
static_assert(offsetof(slot, watch) == cache_line_size, "watch and hw live on line 1");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

}  // namespace compcntr::detail
