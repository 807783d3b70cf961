// The bytes of a shared device's segment (docs/shared.md): a header page with the process table
// and the wake-up word, a table of counter cells (the values) and a table of cell records (who
// holds each cell). Plain C++ (no module), so the tests can scribble over exact fields.
//
// Purpose: one definition of the layout, for src/core/shared/ and tests/shared/.
// Requirements: everything here is untrusted when read: a process of the same user may have
// written anything. Readers never follow a value read from the segment as a pointer; they
// bounds-check every index (process index < max_procs, cell index < cell_count) and use the
// sizes they validated at open (kept in process memory), never the header's fields afterwards.
// Guarantees: fixed sizes and offsets (static_asserts); a version number that changes with them.
// Memory ordering: the atomics are lock-free and address-free (the same physical word in every
// process); their orderings are stated where they are used (src/core/shared/).
#ifndef COMPCNTR_SRC_CORE_SHARED_LAYOUT_HPP
#define COMPCNTR_SRC_CORE_SHARED_LAYOUT_HPP

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace compcntr::shm {

inline constexpr std::uint64_t magic = 0x31564853524e5443ull;  // "CTNRSHV1", little-endian
inline constexpr std::uint32_t version = 2;  // 2: per-process sleeper shares
/// Processes that may have the segment open at once (one holder bit each in a cell's ctl word).
inline constexpr std::uint32_t max_procs = 56;
/// Counter cells of a segment this library creates.
inline constexpr std::uint32_t default_cells = 4096;
/// Most cells a segment may declare (bigger is refused as corrupt).
inline constexpr std::uint32_t max_cells = 1u << 20;

/// header::state.
inline constexpr std::uint32_t seg_initializing = 0;  ///< being written by its creator
inline constexpr std::uint32_t seg_ready = 1;         ///< usable
inline constexpr std::uint32_t seg_retired = 2;       ///< its last process closed it; unlinked

/// A process table entry: 0 = free, else used_bit | pid << 1 | start_time << 23, where start
/// time is field 22 of /proc/<pid>/stat (clock ticks since boot, 41 bits kept).
inline constexpr std::uint64_t proc_used = 1;
inline constexpr std::uint32_t pid_bits = 22;  // PID_MAX_LIMIT is 2^22
inline constexpr std::uint64_t pid_mask = (std::uint64_t{1} << pid_bits) - 1;
inline constexpr unsigned start_shift = 1 + pid_bits;
inline constexpr std::uint64_t proc_word(std::uint32_t pid, std::uint64_t start) noexcept {
  return proc_used | (std::uint64_t{pid} & pid_mask) << 1 | start << start_shift;
}
inline constexpr std::uint32_t proc_pid(std::uint64_t w) noexcept {
  return static_cast<std::uint32_t>((w >> 1) & pid_mask);
}
inline constexpr std::uint64_t proc_start(std::uint64_t w) noexcept { return w >> start_shift; }

struct alignas(128) header {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t header_size;   ///< sizeof(header)
  std::uint32_t cell_count;
  std::uint32_t max_procs;     ///< shm::max_procs
  std::uint64_t cells_offset;  ///< of the cell table (cell_count cells)
  std::uint64_t records_offset;  ///< of the record table (cell_count records)
  std::uint64_t total_size;    ///< the file's size
  std::uint32_t creator_uid;   ///< effective uid of the process that initialised it
  std::atomic<std::uint32_t> state;  ///< seg_*
  /// Proc word of the process sweeping dead processes now, 0 when none (stolen from a dead one).
  std::atomic<std::uint64_t> sweep_lock;
  /// Where the next create starts looking for a free cell (a hint: any value is safe).
  std::atomic<std::uint32_t> alloc_hint;
  // ---- its own line pair: touched by every update of a shared counter (sleepers) and by waiters
  alignas(128) std::atomic<std::uint32_t> wake_seq; ///< futex word (non-private FUTEX_WAIT)
  std::atomic<std::uint32_t> sleepers; ///< waiters of every process asleep on wake_seq
  alignas(128) std::atomic<std::uint64_t> procs[shm::max_procs];
  /// Each process entry's share of `sleepers` (its waiters and fd watcher asleep now), so the
  /// sweep can take a dead process's share back out (src/core/shared/sweep.cpp). Touched only
  /// on the way into and out of a sleep.
  alignas(128) std::atomic<std::uint32_t> proc_sleepers[shm::max_procs];
};

/// One half of a cell: the layout of compcntr::detail::stripe (checked in the library).
struct alignas(128) half {
  std::atomic<std::uint64_t> value;
  std::atomic<std::uint64_t> errors;
};
/// A counter's values: value = half[0].value + half[1].value (the same for errors), read as a
/// 2-stripe counter; an increment adds to the half of the caller's CPU parity.
struct cell {
  half h[2];
};

/// record::ctl: holder bits (bit p: process entry p holds the cell) | state << state_shift.
inline constexpr unsigned state_shift = 56;
inline constexpr std::uint64_t holders_mask = (std::uint64_t{1} << state_shift) - 1;
inline constexpr std::uint64_t cell_free = 0; ///< no counter (ctl == 0)
inline constexpr std::uint64_t cell_creating = 1; ///< its creator is initialising it
inline constexpr std::uint64_t cell_live = 2; ///< resolvable; `creator` holds it
inline constexpr std::uint64_t cell_orphan = 3; ///< destroyed by its creator, still held
inline constexpr std::uint64_t cell_dead = 4; ///< its creator died; still held (waits: EIO)
inline constexpr std::uint64_t cell_freeing = 5; ///< being freed by the holder bit's process
inline constexpr std::uint64_t cell_state(std::uint64_t ctl) noexcept { return ctl >> state_shift; }
inline constexpr std::uint64_t make_ctl(std::uint64_t state, std::uint64_t holders) noexcept {
  return state << state_shift | (holders & holders_mask);
}

/// Who holds a cell and which counter it is (64 bytes; written at create, destroy and death).
struct alignas(64) record {
  std::atomic<std::uint64_t> ctl;
  std::atomic<std::uint64_t> generation; ///< bumped when the cell is freed (counter_id)
  std::atomic<std::uint32_t> type; ///< counter_type
  std::atomic<std::uint32_t> creator; ///< process entry of its creator
  /// Bumped by every set and set_error (which may leave the value and error count as they
  /// were), so that another process's plain-armed fd hears them too.
  std::atomic<std::uint32_t> silent_updates;
};

inline constexpr std::size_t page = 4096;
inline constexpr std::size_t round_page(std::size_t n) noexcept {
  return (n + page - 1) / page * page;
}
inline constexpr std::size_t cells_offset() noexcept { return round_page(sizeof(header)); }
inline constexpr std::size_t records_offset(std::uint32_t cells) noexcept {
  return cells_offset() + round_page(std::size_t{cells} * sizeof(cell));
}
inline constexpr std::size_t total_size(std::uint32_t cells) noexcept {
  return records_offset(cells) + round_page(std::size_t{cells} * sizeof(record));
}

static_assert(sizeof(half) == 128 && sizeof(cell) == 256 && sizeof(record) == 64);
static_assert(sizeof(header) <= page, "the header fits its page");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "process-shared atomics must be lock-free (address-free)");

} // namespace compcntr::shm

#endif
