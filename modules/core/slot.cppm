// compcntr:slot -- one counter's memory, and every memory-ordering rule of the library.
//
// Purpose: the slot is a completion counter's memory: the single place where readers, waiters
// and pollers look. Software completions are atomic RMWs on it (the slot is the counter); for a
// native hardware counter it is the counter's mirror, DMA-written by the device (EFA) or
// refreshed by the backend (slot::hw).
// Layout (one 128-byte block, compcntr:cache_padded says why 128):
//   line 0: value, errors, wake_seq, type, backend_data, stripes, owner, index, numa_node --
//           written by updates of a plain counter, polled by waiters; the rest fixed for life
//   line 1: watch, pins, hw, generation, refs, ext, pool link, the C API's counter object --
//           read by updates, rarely written (who holds a slot, when it is freed: lifetime)
// Striped counters keep their values in per-CPU stripes (struct stripe) the slot points at.
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
//   * the same Dekker pairing covers poll_any (watch_pollers), armed fds (watch_fd_armed) and
//     armed triggers (watch_triggers): notify_slow() (src/core/slot.cpp) wakes futex sleepers,
//     signals the armed fd once, bumps the futex word of every registered poll_any and runs or
//     queues the triggers that are due (compcntr:trigger).
//
// Example (what compcntr::counter does; the library's layers use slots directly):
//     slot.add(1);                                    // completion: seq_cst RMW + load of watch
//     std::uint64_t v = slot.load_value();            // reader: one acquire load
module;
#include <sched.h>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <system_error>
#if __has_include(<sys/rseq.h>)
#include <sys/rseq.h>
#endif
export module compcntr:slot;
import :cache_padded;
import :types;

// The backend plug-in interface (compcntr::plugin: slot, hw_counter_ops here, backend in
// compcntr:backend) is what `import compcntr;` exports beyond the public API, for out-of-tree
// backends (device::from_backend). Everything in compcntr::detail has module linkage: units of
// the module see it, importers cannot name it (tests/core/no_detail_test.py checks).
export namespace compcntr::plugin {

struct slot;

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

} // namespace compcntr::plugin

namespace compcntr::detail {

using plugin::hw_counter_ops;
using plugin::slot;
class device_core;

/// Bits of slot::watch: who must hear about an update.
inline constexpr std::uint32_t watch_sleepers_mask = 0x00ffffffu;  ///< waiters asleep in futex
inline constexpr std::uint32_t watch_fd_armed = 1u << 24;           ///< a pollable fd is armed
inline constexpr std::uint32_t watch_triggers = 1u << 25;           ///< triggers are armed
inline constexpr std::uint32_t watch_pollers = 1u << 26;            ///< poll_any sleepers in ext
// 1u << 27: watch_shared (compcntr:shared), permanent on a shared counter's slot.

/// Extension block for rarely used per-counter features, allocated on demand (first pollable_fd
/// or first poll_any that sleeps on the counter) and freed when the counter is destroyed: the
/// counter's eventfd and the list of sleeping poll_any calls. Defined in src/core/wait/ext.cpp, the
/// only place that touches its members; the hot path never does (watch says when it must).
struct slot_ext;

/// One stripe of a striped counter: its share of the completion and error counts, alone in a
/// 128-byte block so that stripes updated from different CPUs never share a line. A striped
/// counter's value is the sum of its stripes' (its slot's own value and errors stay 0).
struct alignas(false_sharing_range) stripe {
  std::atomic<std::uint64_t> value{0};
  std::atomic<std::uint64_t> errors{0};
};

/// The hardware-ops table of striped counters (src/core/striped.cpp): set, set_error (the slow
/// updates; add and add_error are inline in slot). slot::hw points at it for every striped
/// counter, so every update path that routes non-plain counters through `hw` (QP completions,
/// the C API, adapters) reaches the stripes.
extern const hw_counter_ops striped_counter_ops;

/// Most stripes a striped counter may have (counter_options::stripes).
inline constexpr std::uint32_t max_stripes = 256;
/// Bit 0 of slot::stripes: set when the counter has exactly 2 stripes (see slot::stripes).
inline constexpr std::uintptr_t two_stripes_tag = 1;
/// The stripes a request for `requested` gets: 1 for 0 or 1 (a plain counter), the number of
/// CPUs the system is configured for rounded up to a power of two (at most max_stripes) for
/// stripes_per_cpu, else `requested` rounded up to a power of two; 0 if above max_stripes.
std::uint32_t stripe_count_slow(std::uint32_t requested) noexcept;
inline std::uint32_t stripe_count(std::uint32_t requested) noexcept {
  return requested <= 1 ? 1 : stripe_count_slow(requested);
}
/// Gives the plain software counter on `s` n stripes (a power of two): ENOTSUP if the backend
/// bound it to a native counter (s.hw set), ENOMEM. src/core/striped.cpp.
std::error_code make_striped(slot& s, std::uint32_t n) noexcept;
/// Frees a striped counter's stripes (nothing for a plain counter); when the slot is freed.
void free_stripes(slot& s) noexcept;

/// Where the calling thread's CPU number is, for choosing a stripe: the offset of the kernel's
/// rseq cpu_id from the thread pointer (glibc >= 2.35 registers rseq for every thread and the
/// kernel keeps cpu_id current on every return to user space), or no_rseq where rseq is not
/// registered (then sched_getcpu()). A process-wide constant; striped counters keep a copy in
/// their slot (slot::cpu_offset) so an update finds its stripe with loads of one line plus one
/// TLS load, no GOT indirection.
inline constexpr std::int32_t no_rseq = INT32_MIN;
inline std::int32_t rseq_cpu_offset() noexcept {
#if __has_include(<sys/rseq.h>) && defined(RSEQ_SIG)
  if (__rseq_size >= 8)
    return static_cast<std::int32_t>(__rseq_offset + offsetof(struct rseq, cpu_id));
#endif
  return no_rseq;
}
/// The CPU the calling thread runs on, given rseq_cpu_offset(). Only a hint: the thread may
/// move right after (an update then lands on another CPU's stripe, still atomically).
[[gnu::always_inline]] inline unsigned current_cpu_hint(std::int32_t cpu_offset) noexcept {
  if (cpu_offset != no_rseq) [[likely]] {
    const int cpu = *reinterpret_cast<const volatile std::int32_t*>(
        static_cast<const char*>(__builtin_thread_pointer()) + cpu_offset);
    if (cpu >= 0) [[likely]]
      return static_cast<unsigned>(cpu);
  }
  const int cpu = ::sched_getcpu();
  return cpu >= 0 ? static_cast<unsigned>(cpu) : 0u;
}

} // namespace compcntr::detail

export namespace compcntr::plugin {

/// One counter's memory (see the file comment). A backend reads and writes the fields its
/// bind_counter/unbind_counter documentation names (backend_data, hw, value, errors).
struct alignas(false_sharing_range) slot {
  // ---- line 0: the values (written by every update of a plain counter, polled by waiters),
  // and fields fixed for the counter's life (written only when the pool hands the slot out):
  // readers, pollers and completions read them together with the values.
  std::atomic<std::uint64_t> value{0}; ///< completion count (0 in a striped counter)
  std::atomic<std::uint64_t> errors{0}; ///< error count (0 in a striped counter)
  std::atomic<std::uint32_t> wake_seq{0}; ///< futex word: bumped when sleepers must wake
  counter_type type = counter_type::wrs; ///< read by completions right before their RMW
  void* backend_data = nullptr; ///< native counter object of the backend, if any
  /// Striped counters: the address of their stripes (stripe_mask + 1 of them, a power of two),
  /// plus 1 when there are exactly two (bit 0 is free: stripes are 128-byte aligned), so a read
  /// of the common 2-stripe counter needs no load of the count: two loads at displacements -1
  /// and 127 of this word (bench P12: 4 loads per read instead of 5). 0: a plain counter. Read
  /// by every read (value()/errors() sum the stripes when it is set); stripe_array() untags it.
  std::uintptr_t stripes = 0;
  detail::device_core* dev =
      nullptr; ///< the device whose counter this is (its pool holds the slot)
  std::uint32_t index = 0; ///< position in the pool, fixed for the slot's life
  /// OS index of the NUMA node the pool assigned this slot's arena to, fixed for the slot's
  /// life (memory really lives there when slot_pool::memory_bound()).
  std::int32_t numa_node = 0;
  std::uint32_t stripe_mask_ = 0; ///< stripes - 1 (striped counters); stripe_mask()
  std::int32_t cpu_offset = detail::no_rseq; ///< rseq_cpu_offset() (striped counters)

  // ---- line 1: read by every update (hw before its RMW, watch after it), written rarely:
  // waiters registering, create/destroy, attach, in-flight queries. Keeping `watch` and `hw` off
  // line 0 matters when another core polls the value: an updater that loads from the line its
  // RMW just wrote, while the poller is fetching that line, pays for the line a second time
  // (bench P4: 1.7-2.4x a raw spin ping-pong with them on line 0, 1.02-1.16x here).
  alignas(cache_line_size) std::atomic<std::uint32_t> watch{
      0}; ///< sleepers | watch_fd_armed | watch_triggers | pollers
  /// Transient holds that keep the slot bound while the counter may already be destroyed
  /// (in-flight async queries, refreshers); never make destroy EBUSY. compcntr:lifetime.
  std::atomic<std::uint32_t> pins{0};
  const hw_counter_ops* hw = nullptr; ///< nullptr: plain software counter (read before the RMW)
  /// Bumped when the slot is freed (compcntr:lifetime): a counter_id taken from one owner
  /// never matches a later owner. 64 bits, so it cannot wrap while an id is kept (2^32 reuses
  /// of one slot take minutes in a create/destroy loop; 2^64 take millennia).
  std::atomic<std::uint64_t> generation{0};
  std::atomic<std::uint32_t> next_free{0}; ///< pool free-list link (slot index + 1, 0 = end)
  std::atomic<std::uint32_t> refs{0}; ///< owner + holders (compcntr:lifetime)
  std::atomic<detail::slot_ext*> ext{nullptr}; ///< optional features (see slot_ext)
  /// The C API's counter object (struct compcntr_comp_cntr and what it owns) lives here, on the
  /// line every update reads anyway, so a C counter costs no memory besides its slot and the
  /// inline C fast paths (include/compcntr/compcntr.h) load the slot pointer from a line that
  /// stays shared. Owned by src/c_api (its layout is checked there); untouched by the core.
  alignas(8) unsigned char c_api[24];

  // ---- hot operations (inline: one atomic each on the software path) ----

  /// Completion count. Memory ordering: acquire. A striped counter's is the sum of its stripes,
  /// each read with an acquire load: not a snapshot of one instant, but never below
  /// the value when the call began nor above the value when it returned (every word only grows
  /// between set()s), exact once updates have stopped.
  inline std::uint64_t load_value() const noexcept {
    if (stripes != 0) [[unlikely]]
      return sum_stripes<&detail::stripe::value>(std::memory_order_acquire);
    return value.load(std::memory_order_acquire);
  }
  /// Error count. Memory ordering: acquire (striped: as load_value()).
  inline std::uint64_t load_errors() const noexcept {
    if (stripes != 0) [[unlikely]]
      return sum_stripes<&detail::stripe::errors>(std::memory_order_acquire);
    return errors.load(std::memory_order_acquire);
  }
  /// The same with seq_cst loads: what waiters re-check after registering in `watch` (the
  /// Dekker pairing of the file comment needs seq_cst loads of every word an update writes).
  inline std::uint64_t value_seq_cst() const noexcept {
    if (stripes != 0) [[unlikely]]
      return sum_stripes<&detail::stripe::value>(std::memory_order_seq_cst);
    return value.load(std::memory_order_seq_cst);
  }
  inline std::uint64_t errors_seq_cst() const noexcept {
    if (stripes != 0) [[unlikely]]
      return sum_stripes<&detail::stripe::errors>(std::memory_order_seq_cst);
    return errors.load(std::memory_order_seq_cst);
  }

  /// value += n (wrapping at 2^64). Memory ordering: seq_cst RMW (see file comment).
  inline void add(std::uint64_t n) noexcept {
    if (hw != nullptr) [[unlikely]]
      return hw_add(n);
    value.fetch_add(n, std::memory_order_seq_cst);
    notify();
  }
  /// errors += n. Memory ordering: as add().
  inline void add_error(std::uint64_t n) noexcept {
    if (hw != nullptr) [[unlikely]]
      return hw_add_error(n);
    errors.fetch_add(n, std::memory_order_seq_cst);
    notify();
  }
  /// value = v. Memory ordering: seq_cst store; concurrent add()s may be lost (verbs rule).
  inline void set(std::uint64_t v) noexcept {
    if (hw != nullptr) [[unlikely]]
      return hw->set(*this, v);
    value.store(v, std::memory_order_seq_cst);
    notify();
  }
  /// errors = v. Memory ordering: as set().
  inline void set_error(std::uint64_t v) noexcept {
    if (hw != nullptr) [[unlikely]]
      return hw->set_error(*this, v);
    errors.store(v, std::memory_order_seq_cst);
    notify();
  }

  /// The stripe of the CPU the caller runs on (striped counters only).
  [[gnu::always_inline]] inline detail::stripe& stripe_here() const noexcept {
    return stripe_array()[detail::current_cpu_hint(cpu_offset) & stripe_mask()];
  }
  /// Whether this is a striped counter, its stripes and their number - 1 (striped only).
  inline bool striped() const noexcept { return stripes != 0; }
  inline detail::stripe* stripe_array() const noexcept {
    return reinterpret_cast<detail::stripe*>(stripes & ~std::uintptr_t{detail::two_stripes_tag});
  }
  inline std::uint32_t stripe_mask() const noexcept { return stripe_mask_; }

  /// After an update: wake sleepers / signal armed fds, but only if someone is watching.
  /// The common case is one seq_cst load (a plain mov on x86-64) of a word on the same line.
  inline void notify() noexcept {
    if (watch.load(std::memory_order_seq_cst) != 0) [[unlikely]]
      notify_slow();
  }
  void notify_slow() noexcept; // src/core/slot.cpp
  /// Wakes the counter's sleeping waiters and poll_any calls although its values did not change,
  /// so they re-decide how to sleep: called when the counter starts depending on a device
  /// progress source (attached to a QP whose completions must be driven), which a waiter that
  /// went to sleep before cannot know. Does not signal an armed fd (nothing changed for it).
  /// Memory ordering: a seq_cst fence, then the seq_cst load of `watch`: pairs with a waiter's
  /// registration RMW + fence before it looks at the device's progress sources, so either the
  /// waiter sees the new source or this sees the waiter. One fence and one load if nobody waits.
  void kick() noexcept; // src/core/slot.cpp

 private:
  // Native counters go through their table; striped counters add to the caller's CPU's stripe
  // (one RMW on a line no other CPU writes) and then look at `watch` as a plain update does.
  [[gnu::always_inline]] inline void hw_add(std::uint64_t n) noexcept {
    if (stripes == 0) return hw->add(*this, n);
    stripe_here().value.fetch_add(n, std::memory_order_seq_cst);
    notify();
  }
  [[gnu::always_inline]] inline void hw_add_error(std::uint64_t n) noexcept {
    if (stripes == 0) return hw->add_error(*this, n);
    stripe_here().errors.fetch_add(n, std::memory_order_seq_cst);
    notify();
  }
  // The sum of the stripes (a power of two, at least 2): two of them straight (told by the tag
  // bit of `stripes`, no load of the count), more four at a time with no remainder. A read of a
  // 2-stripe counter is then two loads and an add.
  template <std::atomic<std::uint64_t> detail::stripe::* Word>
  [[gnu::always_inline]] inline std::uint64_t sum_stripes(std::memory_order mo) const noexcept {
    const std::uintptr_t w = stripes;
    if (w & detail::two_stripes_tag) [[likely]] { // falls through: no taken branch more than before
      const detail::stripe* st =
          reinterpret_cast<const detail::stripe*>(w - detail::two_stripes_tag);
      return (st[0].*Word).load(mo) + (st[1].*Word).load(mo);
    }
    const detail::stripe* st = reinterpret_cast<const detail::stripe*>(w);
    std::uint64_t v = 0;
    for (const detail::stripe* end = st + stripe_mask_ + 1; st != end; st += 4)
      v += (st[0].*Word).load(mo) + (st[1].*Word).load(mo) + (st[2].*Word).load(mo) +
           (st[3].*Word).load(mo);
    return v;
  }
};

static_assert(sizeof(slot) == false_sharing_range, "a slot is exactly one padded block");
static_assert(offsetof(slot, watch) == cache_line_size, "watch and hw live on line 1");
static_assert(offsetof(slot, stripes) < cache_line_size,
              "stripes is read with the values (line 0)");
static_assert(offsetof(slot, c_api) + sizeof(slot::c_api) == sizeof(slot),
              "the C object ends line 1");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

} // namespace compcntr::plugin
