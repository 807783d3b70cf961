// compcntr:shared_impl -- internal partition of the shared devices (src/core/shared/): the
// process-local state of one opened segment (struct shared_segment) and the helpers its units
// share. Not installed, not imported by the primary unit: only the implementation units of
// src/core/shared/ import it (modules/meson.build, internal_units).
//
// Shared devices (compcntr:shared, docs/shared.md): the segment (open, validation, stale
// replacement, the process table and its sweep) and the backend whose counters live in it.
//
// Purpose: counters that the processes of one user on one node create, find by counter_id,
// update and wait on, each through a process-local slot bound to a cell of the segment.
// Requirements: the segment is untrusted input (any process of the user may write anything
// into it): every index read from it is checked against the sizes validated at open, which this
// process keeps in its own memory; no value read from it is used as a pointer or a size.
// Guarantees:
//   * open: owner-only (0600) unless mode says 0660; the file's owner, mode, size, magic,
//     version and layout are checked before any byte past the header is read (no SIGBUS from a
//     file truncated before open); a segment whose processes are all dead, or whose creator
//     died while initialising it, is re-initialised in place under an exclusive flock, never
//     reused half-initialised; the last process to close a segment unlinks its name.
//   * counters: a cell's holders are bits of its record's ctl word, one per process entry (a
//     process holds a cell once, however many local references it has); a cell is freed (its
//     generation bumped) when its last holder lets go; the creator's destroy ends its name
//     (resolve: ENOENT) at once, holders keep using it until they release it.
//   * peer death: a process is identified by pid and start time (/proc/<pid>/stat field 22);
//     a sweep (on open, in sleeping waits every second, device::sweep) clears a dead process's
//     holder bits everywhere, frees what only it held, finishes what it left half-done (cell
//     claimed but not initialised, cell being freed) and marks counters it created that others
//     still hold as dead (their waits end with EIO), then frees its process entry.
// Memory ordering: cell values and the wake-up words: compcntr:shared. ctl transitions are CAS
// (acq_rel); a create publishes the zeroed values, type and creator with its release store of
// ctl = live; a resolver's acquire CAS on ctl sees them; the generation is bumped (release)
// before a freed cell's ctl is stored 0 (release), and a resolver re-reads it (acquire) after
// its CAS, so a cell recycled under it is detected (the scheme of compcntr:lifetime).
//
// The units (this partition holds what they share):
//   segment.cpp  open (validation, stale replacement, initialisation, registration) and close
//   sweep.cpp    process identity (pid + start time), the sweep of dead processes
//   cells.cpp    cell ownership, the counter operations, the backend, resolve, the core's entry points
//   watcher.cpp  the fd watcher thread (pollable fds and triggers of shared counters)
module;
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>
#include "core/shared/layout.hpp"
#include "core/wait/futex.hpp"
module compcntr:shared_impl;
import :slot;
import :shared;
import :trigger;

namespace compcntr::detail {

struct shared_segment {
  struct local {
    slot* s = nullptr; ///< the newest local slot bound to the cell
    std::uint32_t count = 0; ///< local slots bound to it (2 while one dies and one is made)
    std::atomic<std::uint64_t> gen{0}; ///< the cell's generation when bound
  };

  std::string name; ///< NAME
  std::string dev_name; ///< "shm:NAME"
  std::string shm_name; ///< "/compcntr.NAME"
  int fd = -1;
  void* base = nullptr;
  std::size_t size = 0;
  shm::header* hdr = nullptr;
  shm::cell* cells = nullptr;
  shm::record* records = nullptr;
  std::uint32_t cell_count = 0; ///< validated at open; never re-read from the segment
  std::uint32_t me = 0; ///< our process entry
  std::uint64_t my_word = 0;
  std::mutex mu; ///< locals
  std::unique_ptr<local[]> locals;
  std::atomic<std::int64_t> next_sweep_ns{0};
  pid_t opener_pid = 0; ///< the process that opened it (a forked child is another one)

  // ---- the fd watcher (docs/shared.md, "Pollable fds"): one thread of this process, started
  // by the first arm of a shared counter's fd, joined at close. While an fd is armed it sleeps
  // on the segment's wake word as a waiter does (counted in `sleepers`), so every process's
  // update wakes it; it then checks the registered slots and signals the fds that are due.
  std::mutex watch_mu; ///< guards the members below; never held while taking `mu`
  std::condition_variable watch_cv; ///< the parked watcher (nothing armed) waits here
  std::vector<slot*> watched; ///< slots whose fd was armed once, until they are unbound
  bool watch_stop = false; ///< close: the watcher returns
  bool watch_pending = false; ///< an arm since the watcher's last scan
  std::thread* watcher = nullptr; ///< nullptr until the first arm

  inline ~shared_segment() { close(); }

  inline std::uint64_t bit() const noexcept { return std::uint64_t{1} << me; }

  std::error_code open(std::string_view nm, std::uint32_t flags, std::uint32_t mode) noexcept;
  std::error_code attach_map(std::size_t bytes) noexcept;
  std::error_code validate(const struct stat& st, bool& blank) noexcept;
  std::error_code initialise(std::uint32_t mode) noexcept;
  std::error_code register_self() noexcept;
  void close() noexcept;
  inline void unmap() noexcept {
    if (base != nullptr) ::munmap(base, size);
    base = nullptr;
    hdr = nullptr;
  }

  std::uint32_t sweep() noexcept;
  void sweep_if_due() noexcept;
  void watch_loop() noexcept;
  std::uint32_t watch_scan(std::vector<trigger_list*>& due) noexcept;
  void stop_watcher() noexcept;
  bool reclaim_cell(std::uint32_t i, std::uint32_t dead, bool& woke) noexcept;
  void take_sleepers(std::uint32_t dead) noexcept;
  bool free_cell(std::uint32_t i, std::uint64_t seen) noexcept;
  void release_cell(std::uint32_t i) noexcept;
  void bind(slot& s, std::uint32_t i) noexcept;
  inline std::uint32_t cell_of(const slot& s) const noexcept {
    const auto off = reinterpret_cast<std::uintptr_t>(s.stripe_array()) -
                     reinterpret_cast<std::uintptr_t>(cells);
    return static_cast<std::uint32_t>(off / sizeof(shm::cell));
  }
  inline void wake_all() noexcept {
    hdr->wake_seq.fetch_add(1, std::memory_order_release);
    futex::wake_shared(hdr->wake_seq);
  }
};

/// The segment of a slot bound to a cell (its backend_data).
inline shared_segment& seg_of(const slot& s) noexcept {
  return *static_cast<shared_segment*>(s.backend_data);
}

/// Process identity (sweep.cpp). Field 22 (start time) of /proc/<pid>/stat; false if the
/// process does not exist or has ended (state X, or a zombie: state Z with no thread left;
/// a leader in state Z whose other threads run is alive).
bool process_start(std::uint32_t pid, std::uint64_t& start) noexcept;
/// Whether process table entry `w` names a live process.
bool proc_alive(std::uint64_t w) noexcept;
/// This process's process table entry.
std::uint64_t self_word() noexcept;

} // namespace compcntr::detail
