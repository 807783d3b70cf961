// Shared devices: peer death. Holds the process identity a process table entry records (pid
// and /proc start time), the sweep that reclaims what dead processes held (reclaim_cell: holder
// bits, half-done creations and frees, counters whose creator died), and its triggers: on open,
// in sleeping waits at most once a second (sweep_if_due), and device::sweep. The guarantees:
// the file comment of compcntr:shared_impl (src/core/shared/segment_impl.cppm).
module;
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <system_error>
#include "core/shared/layout.hpp"
module compcntr;
import :shared_impl;

namespace compcntr::detail {

namespace {

constexpr std::uint64_t start_mask = (std::uint64_t{1} << (64 - shm::start_shift)) - 1;

} // namespace

// Field 22 (start time) of /proc/<pid>/stat; false if the process does not exist or has ended:
// state X (dead), or state Z (a zombie: exited, not yet reaped; it has no mappings and never
// touches the segment again) with one thread (field 20). A pid in state Z with more threads is
// a thread group leader whose own thread exited while its other threads run (pthread_exit in
// main): that process is alive and keeps its mappings. The command name (field 2) may contain
// spaces and parentheses: fields are counted after its last ')'.
bool process_start(std::uint32_t pid, std::uint64_t& start) noexcept {
  if (pid == 0 || pid > shm::pid_mask) return false;
  char path[40];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = static_cast<const char*>(::memrchr(buf, ')', static_cast<std::size_t>(n)));
  if (p == nullptr) return false;
  ++p;                                                     // " S ppid ..." : fields 3..
  auto number = [](const char* q) {
    std::uint64_t v = 0;
    for (; *q >= '0' && *q <= '9'; ++q) v = v * 10 + static_cast<unsigned>(*q - '0');
    return v;
  };
  int field = 2;
  const char* tok = nullptr;
  bool zombie = false;
  while (*p != '\0' && field < 22) {
    while (*p == ' ') ++p;
    tok = p;
    ++field;
    if (field == 3) {
      if (*tok == 'X') return false;
      zombie = *tok == 'Z';
    }
    if (field == 20 && zombie && number(tok) <= 1) return false;
    while (*p != ' ' && *p != '\0') ++p;
  }
  if (field != 22 || tok == nullptr) return false;
  start = number(tok) & start_mask;
  return true;
}

bool proc_alive(std::uint64_t w) noexcept {
  if ((w & shm::proc_used) == 0) return false;
  std::uint64_t start = 0;
  return process_start(shm::proc_pid(w), start) && start == shm::proc_start(w);
}

std::uint64_t self_word() noexcept {
  std::uint64_t start = 0;
  const auto pid = static_cast<std::uint32_t>(::getpid());
  process_start(pid, start);  // checked by open(): /proc is readable
  return shm::proc_word(pid, start);
}

// Clears dead process entry `dead`'s hold on cell i. Returns true if it held it. `woke`: a
// counter was marked dead (its waiters must re-check).
bool shared_segment::reclaim_cell(std::uint32_t i, std::uint32_t dead, bool& woke) noexcept {
  shm::record& r = records[i];
  const std::uint64_t b = std::uint64_t{1} << dead;
  std::uint64_t c = r.ctl.load(std::memory_order_acquire);
  for (int tries = 0; tries < 1000; ++tries) {
    if ((c & b) == 0) return false;
    const std::uint64_t st = shm::cell_state(c), rest = c & shm::holders_mask & ~b;
    if (st == shm::cell_creating || st == shm::cell_freeing || rest == 0) {
      // Died initialising or freeing it, or was its last holder: free it (a generation bump
      // the dead process may have made already costs nothing: ids are stale either way).
      if (free_cell(i, c)) return true;
      c = r.ctl.load(std::memory_order_acquire);
      continue;
    }
    std::uint64_t next_state = st;
    if (st == shm::cell_live && r.creator.load(std::memory_order_relaxed) == dead)
      next_state = shm::cell_dead;
    if (r.ctl.compare_exchange_weak(c, shm::make_ctl(next_state, rest), std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      woke |= next_state == shm::cell_dead;
      return true;
    }
  }
  return true;
}

// Takes dead process entry `dead`'s share out of the segment's sleeper count (before its entry
// is freed: a process that takes the entry next starts from 0). exchange: a sweeper that dies
// after it leaves the count high (a needless wake), and no share is taken out twice. Saturating:
// a scribbled share cannot wrap the count (a count too low delays a wake by at most the sleep
// slice, as any scribbled count does).
void shared_segment::take_sleepers(std::uint32_t dead) noexcept {
  const std::uint32_t share = hdr->proc_sleepers[dead].exchange(0, std::memory_order_acq_rel);
  if (share == 0) return;
  std::uint32_t cur = hdr->sleepers.load(std::memory_order_relaxed);
  while (!hdr->sleepers.compare_exchange_weak(
      cur, cur > share ? cur - share : 0, std::memory_order_seq_cst, std::memory_order_relaxed)) {
  }
}

// One sweep: under the segment's sweep lock (held by a live process at a time; a dead holder's
// lock is stolen), every entry of a dead process is reclaimed cell by cell, then freed.
std::uint32_t shared_segment::sweep() noexcept {
  std::atomic<std::uint64_t>& lock = hdr->sweep_lock;
  std::uint64_t cur = 0;
  if (!lock.compare_exchange_strong(cur, my_word, std::memory_order_acq_rel)) {
    if (cur == my_word || proc_alive(cur)) return 0; // a live process is sweeping
    if (!lock.compare_exchange_strong(cur, my_word, std::memory_order_acq_rel)) return 0;
  }
  std::uint32_t found = 0;
  bool woke = false;
  for (std::uint32_t j = 0; j < shm::max_procs; ++j) {
    if (j == me) continue;
    const std::uint64_t w = hdr->procs[j].load(std::memory_order_acquire);
    if (w == 0 || w == my_word || proc_alive(w)) continue;
    ++found;
    for (std::uint32_t i = 0; i < cell_count; ++i) reclaim_cell(i, j, woke);
    take_sleepers(j);
    std::uint64_t expect = w;
    hdr->procs[j].compare_exchange_strong(expect, 0, std::memory_order_acq_rel);
  }
  std::uint64_t mine = my_word;
  lock.compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
  if (woke) wake_all(); // forever-waiters on a dead creator's counters: re-check, EIO
  return found;
}

void shared_sweep_if_due(const slot& s) noexcept { seg_of(s).sweep_if_due(); }

void shared_segment::sweep_if_due() noexcept {
  shared_segment& g = *this;
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  std::int64_t due = g.next_sweep_ns.load(std::memory_order_relaxed);
  if (now < due) return;
  if (!g.next_sweep_ns.compare_exchange_strong(due, now + 1'000'000'000, std::memory_order_relaxed))
    return;
  g.sweep();
}

std::error_code sweep_shared(device_core& dev, std::uint32_t& reclaimed) noexcept {
  reclaimed = 0;
  if (dev.shared() == nullptr)
    return fail(EINVAL, "sweep: device '%.*s' is not a shared device",
                static_cast<int>(dev.be().name().size()), dev.be().name().data());
  reclaimed = dev.shared()->sweep();
  return {};
}

} // namespace compcntr::detail
