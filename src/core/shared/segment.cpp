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
// Example: see compcntr:shared.
module;
#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sched.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>
#include "core/shared/layout.hpp"
#include "core/wait/futex.hpp"
module compcntr;

namespace compcntr::detail {

static_assert(sizeof(shm::half) == sizeof(stripe) && alignof(shm::half) == alignof(stripe) &&
                  offsetof(shm::half, value) == offsetof(stripe, value) &&
                  offsetof(shm::half, errors) == offsetof(stripe, errors),
              "a cell half is read as a stripe");

namespace {

constexpr std::size_t max_name = 200;
constexpr std::uint64_t start_mask = (std::uint64_t{1} << (64 - shm::start_shift)) - 1;

// Field 22 (start time) of /proc/<pid>/stat; false if the process does not exist or is a zombie
// (dead, not yet reaped: it holds nothing any more). The command name (field 2) may contain
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
  int field = 2;
  const char* tok = nullptr;
  while (*p != '\0' && field < 22) {
    while (*p == ' ') ++p;
    tok = p;
    ++field;
    if (field == 3 && (*tok == 'Z' || *tok == 'X')) return false;
    while (*p != ' ' && *p != '\0') ++p;
  }
  if (field != 22 || tok == nullptr) return false;
  std::uint64_t v = 0;
  for (const char* q = tok; *q >= '0' && *q <= '9'; ++q)
    v = v * 10 + static_cast<unsigned>(*q - '0');
  start = v & start_mask;
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

bool valid_name(std::string_view n) noexcept {
  if (n.empty() || n.size() > max_name) return false;
  for (char c : n)
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  return true;
}

bool in_group(gid_t g) noexcept {
  if (::getegid() == g) return true;
  gid_t groups[256];
  const int n = ::getgroups(256, groups);
  for (int i = 0; i < n; ++i)
    if (groups[i] == g) return true;
  return false;
}

void flock_retry(int fd, int op) noexcept {
  while (::flock(fd, op) != 0 && errno == EINTR) {
  }
}

}  // namespace

struct shared_segment {
  struct local {
    slot* s = nullptr;  ///< the newest local slot bound to the cell
    std::uint32_t count = 0;  ///< local slots bound to it (2 while one dies and one is made)
    std::atomic<std::uint64_t> gen{0};  ///< the cell's generation when bound
  };

  std::string name;      ///< NAME
  std::string dev_name;  ///< "shm:NAME"
  std::string shm_name;  ///< "/compcntr.NAME"
  int fd = -1;
  void* base = nullptr;
  std::size_t size = 0;
  shm::header* hdr = nullptr;
  shm::cell* cells = nullptr;
  shm::record* records = nullptr;
  std::uint32_t cell_count = 0;  ///< validated at open; never re-read from the segment
  std::uint32_t me = 0;          ///< our process entry
  std::uint64_t my_word = 0;
  std::mutex mu;  ///< locals
  std::unique_ptr<local[]> locals;
  std::atomic<std::int64_t> next_sweep_ns{0};
  pid_t opener_pid = 0;  ///< the process that opened it (a forked child is another one)

  // ---- the fd watcher (docs/shared.md, "Pollable fds"): one thread of this process, started
  // by the first arm of a shared counter's fd, joined at close. While an fd is armed it sleeps
  // on the segment's wake word as a waiter does (counted in `sleepers`), so every process's
  // update wakes it; it then checks the registered slots and signals the fds that are due.
  std::mutex watch_mu;  ///< guards the members below; never held while taking `mu`
  std::condition_variable watch_cv;  ///< the parked watcher (nothing armed) waits here
  std::vector<slot*> watched;  ///< slots whose fd was armed once, until they are unbound
  bool watch_stop = false;  ///< close: the watcher returns
  bool watch_pending = false;  ///< an arm since the watcher's last scan
  std::thread* watcher = nullptr;  ///< nullptr until the first arm

  ~shared_segment() { close(); }

  std::uint64_t bit() const noexcept { return std::uint64_t{1} << me; }

  std::error_code open(std::string_view nm, std::uint32_t flags, std::uint32_t mode) noexcept;
  std::error_code attach_map(std::size_t bytes) noexcept;
  std::error_code validate(const struct stat& st) noexcept;
  std::error_code initialise(std::uint32_t mode) noexcept;
  std::error_code register_self() noexcept;
  void close() noexcept;
  void unmap() noexcept {
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
  bool free_cell(std::uint32_t i, std::uint64_t seen) noexcept;
  void release_cell(std::uint32_t i) noexcept;
  void bind(slot& s, std::uint32_t i) noexcept;
  std::uint32_t cell_of(const slot& s) const noexcept {
    const auto off = reinterpret_cast<std::uintptr_t>(s.stripe_array()) -
                     reinterpret_cast<std::uintptr_t>(cells);
    return static_cast<std::uint32_t>(off / sizeof(shm::cell));
  }
  void wake_all() noexcept {
    hdr->wake_seq.fetch_add(1, std::memory_order_release);
    futex::wake_shared(hdr->wake_seq);
  }
};

std::error_code shared_segment::attach_map(std::size_t bytes) noexcept {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return fail(errno, "open_shared_device: mmap of %zu bytes of '%s' failed: %s", bytes,
                dev_name.c_str(), std::strerror(errno));
  base = p;
  size = bytes;
  hdr = static_cast<shm::header*>(p);
  return {};
}

// Checks what the file is before touching anything past its header: owner, mode, size (fstat),
// then magic, version and layout. Leaves the mapping of exactly st_size bytes on success.
std::error_code shared_segment::validate(const struct stat& st) noexcept {
  const char* n = dev_name.c_str();
  if (st.st_uid != ::geteuid()) {
    if ((st.st_mode & 0060) != 0060 || !in_group(st.st_gid))
      return fail(EACCES,
                  "open_shared_device: '%s' (/dev/shm%s) belongs to uid %u, not to this "
                  "process's uid %u, and does not grant read-write access to a group of this "
                  "process; refusing it (create your own, or ask its owner for mode 0660)",
                  n, shm_name.c_str(), static_cast<unsigned>(st.st_uid),
                  static_cast<unsigned>(::geteuid()));
  }
  if ((st.st_mode & 0007) != 0)
    return fail(EACCES,
                "open_shared_device: '%s' (/dev/shm%s) has mode 0%o, open to every user; "
                "refusing it (remove it: a compcntr segment is 0600 or 0660)",
                n, shm_name.c_str(), static_cast<unsigned>(st.st_mode & 0777));
  if (st.st_size < static_cast<off_t>(shm::page))
    return fail(EBADMSG,
                "open_shared_device: '%s' (/dev/shm%s) is truncated: %lld bytes, less than "
                "its %zu-byte header; remove it",
                n, shm_name.c_str(), static_cast<long long>(st.st_size), shm::page);
  if (auto e = attach_map(static_cast<std::size_t>(st.st_size))) return e;
  const shm::header& h = *hdr;
  if (h.magic != shm::magic)
    return fail(EBADMSG,
                "open_shared_device: '%s' (/dev/shm%s) is not a compcntr segment (bad magic "
                "0x%016llx); remove it",
                n, shm_name.c_str(), static_cast<unsigned long long>(h.magic));
  if (h.version != shm::version)
    return fail(EINVAL,
                "open_shared_device: '%s' has layout version %u, this library uses version %u "
                "(processes of one job must use the same compcntr)",
                n, h.version, shm::version);
  const std::uint32_t cells_n = h.cell_count;
  if (h.header_size != sizeof(shm::header) || h.max_procs != shm::max_procs || cells_n == 0 ||
      cells_n > shm::max_cells || h.cells_offset != shm::cells_offset() ||
      h.records_offset != shm::records_offset(cells_n) || h.total_size != shm::total_size(cells_n))
    return fail(EBADMSG,
                "open_shared_device: '%s' (/dev/shm%s) has a corrupt header (sizes or offsets "
                "do not match %u counters); remove it",
                n, shm_name.c_str(), cells_n);
  if (h.total_size != static_cast<std::uint64_t>(st.st_size))
    return fail(EBADMSG,
                "open_shared_device: '%s' (/dev/shm%s) is %lld bytes, its header says %llu "
                "(truncated or corrupt); remove it",
                n, shm_name.c_str(), static_cast<long long>(st.st_size),
                static_cast<unsigned long long>(h.total_size));
  if (h.creator_uid != static_cast<std::uint32_t>(st.st_uid))
    return fail(EBADMSG,
                "open_shared_device: '%s' says it was created by uid %u but the file belongs to "
                "uid %u (corrupt); remove it",
                n, h.creator_uid, static_cast<unsigned>(st.st_uid));
  cell_count = cells_n;
  cells = reinterpret_cast<shm::cell*>(static_cast<char*>(base) + shm::cells_offset());
  records = reinterpret_cast<shm::record*>(static_cast<char*>(base) + shm::records_offset(cells_n));
  return {};
}

// Under the exclusive flock, on a file nobody else uses: zero it (ftruncate to 0 and back),
// write the header, register, and publish state = ready last.
std::error_code shared_segment::initialise(std::uint32_t mode) noexcept {
  unmap();
  const std::size_t bytes = shm::total_size(shm::default_cells);
  if (::ftruncate(fd, 0) != 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    return fail(errno, "open_shared_device: cannot size '%s' to %zu bytes: %s", dev_name.c_str(),
                bytes, std::strerror(errno));
  if (::fchmod(fd, mode) != 0 && errno != EPERM)  // EPERM: not ours (a group segment)
    return fail(errno, "open_shared_device: fchmod(0%o) of '%s' failed: %s", mode, dev_name.c_str(),
                std::strerror(errno));
  if (auto e = attach_map(bytes)) return e;
  shm::header& h = *hdr;
  h.state.store(shm::seg_initializing, std::memory_order_relaxed);
  h.magic = shm::magic;
  h.version = shm::version;
  h.header_size = sizeof(shm::header);
  h.cell_count = shm::default_cells;
  h.max_procs = shm::max_procs;
  h.cells_offset = shm::cells_offset();
  h.records_offset = shm::records_offset(shm::default_cells);
  h.total_size = bytes;
  // The file's owner (a group member may re-initialise a stale group segment it did not create).
  struct stat st{};
  h.creator_uid = ::fstat(fd, &st) == 0 ? static_cast<std::uint32_t>(st.st_uid)
                                        : static_cast<std::uint32_t>(::geteuid());
  cell_count = shm::default_cells;
  cells = reinterpret_cast<shm::cell*>(static_cast<char*>(base) + shm::cells_offset());
  records =
      reinterpret_cast<shm::record*>(static_cast<char*>(base) + shm::records_offset(cell_count));
  me = 0;
  h.procs[0].store(my_word, std::memory_order_relaxed);
  h.state.store(shm::seg_ready, std::memory_order_release);
  return {};
}

std::error_code shared_segment::register_self() noexcept {
  for (int round = 0; round < 2; ++round) {
    for (std::uint32_t j = 0; j < shm::max_procs; ++j) {
      std::uint64_t w = 0;
      if (hdr->procs[j].compare_exchange_strong(w, my_word, std::memory_order_acq_rel)) {
        me = j;
        return {};
      }
    }
    // Full: entries of dead processes become free once swept (we are not registered yet, so
    // sweep as entry max_procs: a bit no cell can have).
    me = shm::max_procs;
    sweep();
  }
  return fail(EUSERS,
              "open_shared_device: '%s' is open in %u live processes already, its limit; close "
              "it in one of them",
              dev_name.c_str(), shm::max_procs);
}

std::error_code shared_segment::open(std::string_view nm, std::uint32_t flags,
                                     std::uint32_t mode) noexcept {
  if (!valid_name(nm))
    return fail(EINVAL,
                "open_shared_device: name '%.*s' is not 1 to %zu characters of [A-Za-z0-9._-]",
                static_cast<int>(std::min<std::size_t>(nm.size(), 256)), nm.data(), max_name);
  if ((flags & ~(shared_create | shared_excl)) != 0)
    return fail(EINVAL,
                "open_shared_device: unknown flag bit(s) 0x%x (COMPCNTR_SHARED_CREATE, "
                "COMPCNTR_SHARED_EXCL)",
                flags & ~(shared_create | shared_excl));
  if (mode == 0) mode = 0600;
  if ((mode & ~0777u) != 0 || (mode & 0007) != 0 || (mode & 0600) != 0600)
    return fail(EINVAL,
                "open_shared_device: mode 0%o: the owner needs read-write (0600), a group may "
                "be given access (0660), other users never",
                mode);
  try {
    name.assign(nm);
    dev_name = "shm:" + name;
    shm_name = "/compcntr." + name;
  } catch (...) {
    return fail(ENOMEM, "open_shared_device: out of memory");
  }
  // Peers tell a live process from a dead one by its /proc start time: without it, this
  // process would look dead to them and its counters would be reclaimed under it.
  if (std::uint64_t start = 0; !process_start(static_cast<std::uint32_t>(::getpid()), start))
    return fail(ENOTSUP,
                "open_shared_device: /proc/%d/stat is unreadable; shared devices identify "
                "processes by pid and start time and need /proc (mount it)",
                static_cast<int>(::getpid()));
  my_word = self_word();
  opener_pid = ::getpid();
  const bool create = (flags & shared_create) != 0, excl = (flags & shared_excl) != 0;
  for (int attempt = 0; attempt < 64; ++attempt) {
    bool created = false;  // by our shm_open (the flock decides who initialises)
    if (create) {
      fd = ::shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
      if (fd >= 0)
        created = true;
      else if (errno != EEXIST)
        return fail(errno, "open_shared_device: cannot create '%s' (/dev/shm%s): %s",
                    dev_name.c_str(), shm_name.c_str(), std::strerror(errno));
    }
    if (!created) {
      fd = ::shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) {
        const int err = errno;
        if (err == ENOENT && create) continue;  // unlinked since our create attempt
        if (err == ENOENT)
          return fail(ENOENT,
                      "open_shared_device: no shared device '%s' (/dev/shm%s); create it with "
                      "COMPCNTR_SHARED_CREATE (\"shm:NAME\" does)",
                      dev_name.c_str(), shm_name.c_str());
        if (err == EACCES)
          return fail(EACCES,
                      "open_shared_device: '%s' (/dev/shm%s) belongs to another user and does "
                      "not grant this process access",
                      dev_name.c_str(), shm_name.c_str());
        return fail(err, "open_shared_device: cannot open '%s': %s", dev_name.c_str(),
                    std::strerror(err));
      }
    }
    flock_retry(fd, LOCK_EX);  // opens, re-initialisations and closes are serialised
    struct stat st{};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fd = -1;
      return fail(err, "open_shared_device: fstat of '%s' failed: %s", dev_name.c_str(),
                  std::strerror(err));
    }
    auto retry = [&] {
      unmap();
      ::close(fd);  // drops the flock
      fd = -1;
    };
    auto done = [&](std::error_code e) {
      if (e) {
        unmap();
        ::close(fd);
        fd = -1;
      } else {
        flock_retry(fd, LOCK_UN);
      }
      return e;
    };
    if (st.st_nlink == 0) {  // its last process closed and unlinked it meanwhile
      retry();
      continue;
    }
    // Size 0: created by us, or by a creator that died before sizing it (it would still hold
    // the flock if it were alive and initialising). A live creator that has not taken the
    // flock yet when another opener initialises it finds the size set and validates instead.
    if (st.st_size == 0) {
      if (!create) {
        retry();
        if (attempt < 8) {
          ::sched_yield();
          continue;
        }
        return fail(ENOENT,
                    "open_shared_device: '%s' exists but was never initialised (its creator "
                    "died, or is still creating it); open with COMPCNTR_SHARED_CREATE to "
                    "replace it",
                    dev_name.c_str());
      }
      return done(initialise(mode));
    }
    if (auto e = validate(st)) return done(e);
    const std::uint32_t state = hdr->state.load(std::memory_order_acquire);
    // Retired and still linked: its last process could not unlink it (a retiring close holds
    // the flock until it has unlinked, and we hold it now), so nobody uses it: stale.
    // Initialising: its initialiser died holding the flock.
    bool stale = state == shm::seg_initializing || state == shm::seg_retired;
    if (!stale && state != shm::seg_ready)
      return done(fail(EBADMSG, "open_shared_device: '%s' has a corrupt state word (%u); remove it",
                       dev_name.c_str(), state));
    if (!stale) {
      bool any_alive = false;
      for (std::uint32_t j = 0; j < shm::max_procs && !any_alive; ++j)
        any_alive = proc_alive(hdr->procs[j].load(std::memory_order_acquire));
      stale = !any_alive;
    }
    if (stale) {
      if (!create)
        return done(fail(ENOENT,
                         "open_shared_device: '%s' is stale (every process that used it is "
                         "gone); open with COMPCNTR_SHARED_CREATE to replace it",
                         dev_name.c_str()));
      return done(initialise(mode));
    }
    if (excl)
      return done(fail(EEXIST,
                       "open_shared_device: '%s' exists and is in use (COMPCNTR_SHARED_EXCL)",
                       dev_name.c_str()));
    if (auto e = register_self()) return done(e);
    sweep();
    return done({});
  }
  return fail(EAGAIN, "open_shared_device: '%s' kept being removed and re-created while opening",
              dev_name.c_str());
}

void shared_segment::close() noexcept {
  if (fd < 0) return;
  stop_watcher();
  flock_retry(fd, LOCK_EX);
  if (hdr != nullptr) {
    std::uint64_t w = my_word;
    if (me < shm::max_procs)
      hdr->procs[me].compare_exchange_strong(w, 0, std::memory_order_acq_rel);
    bool others = false;
    for (std::uint32_t j = 0; j < shm::max_procs && !others; ++j)
      others = proc_alive(hdr->procs[j].load(std::memory_order_acquire));
    if (!others) {
      // The last one out: retire and unlink, if the name is still this file (not a newer one).
      hdr->state.store(shm::seg_retired, std::memory_order_release);
      const int cur = ::shm_open(shm_name.c_str(), O_RDONLY | O_CLOEXEC, 0);
      struct stat a{}, b{};
      if (cur >= 0) {
        if (::fstat(cur, &a) == 0 && ::fstat(fd, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev)
          ::shm_unlink(shm_name.c_str());
        ::close(cur);
      }
    }
  }
  unmap();
  ::close(fd); // drops the flock
  fd = -1;
}

// ---- cells --------------------------------------------------------------------------------

// Frees cell i whose ctl we read as `seen` and may change: mark it being freed by us (so a
// sweep finishes the job if we die), bump the generation, store it free. false if ctl changed.
bool shared_segment::free_cell(std::uint32_t i, std::uint64_t seen) noexcept {
  shm::record& r = records[i];
  const std::uint64_t mark = shm::make_ctl(shm::cell_freeing, me < shm::max_procs ? bit() : 0);
  if (!r.ctl.compare_exchange_strong(seen, mark, std::memory_order_acq_rel)) return false;
  r.generation.fetch_add(1, std::memory_order_release);
  r.ctl.store(0, std::memory_order_release);
  return true;
}

// Our process lets go of cell i (its last local slot is gone). Called with `mu` held.
void shared_segment::release_cell(std::uint32_t i) noexcept {
  shm::record& r = records[i];
  const std::uint64_t b = bit();
  std::uint64_t c = r.ctl.load(std::memory_order_acquire);
  for (;;) {
    if ((c & b) == 0) return; // not ours (scribbled): nothing to give back
    const std::uint64_t st = shm::cell_state(c), rest = c & shm::holders_mask & ~b;
    std::uint64_t next_state = st;
    if (st == shm::cell_live && r.creator.load(std::memory_order_relaxed) == me)
      next_state = shm::cell_orphan; // the creator destroyed it: no new resolves
    if (rest == 0 && (st == shm::cell_live || st == shm::cell_orphan || st == shm::cell_dead)) {
      if (free_cell(i, c)) return; // we were its last holder
      c = r.ctl.load(std::memory_order_acquire);
      continue;
    }
    if (r.ctl.compare_exchange_weak(c, shm::make_ctl(next_state, rest), std::memory_order_acq_rel,
                                    std::memory_order_acquire))
      return;
  }
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
    std::uint64_t expect = w;
    hdr->procs[j].compare_exchange_strong(expect, 0, std::memory_order_acq_rel);
  }
  std::uint64_t mine = my_word;
  lock.compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
  if (woke) wake_all(); // forever-waiters on a dead creator's counters: re-check, EIO
  return found;
}

void shared_segment::bind(slot& s, std::uint32_t i) noexcept {
  s.backend_data = this;
  s.stripes = reinterpret_cast<std::uintptr_t>(&cells[i]) + two_stripes_tag;
  s.stripe_mask_ = 1;
  s.cpu_offset = rseq_cpu_offset();
  s.hw = &shared_counter_ops;
  s.watch.fetch_or(watch_shared, std::memory_order_relaxed); // published with the counter
}

// ---- the counter operations (compcntr:shared) -----------------------------------------------

namespace {

void shared_add(slot& s, std::uint64_t n) noexcept { s.add(n); }
void shared_add_error(slot& s, std::uint64_t n) noexcept { s.add_error(n); }
// As a striped counter's set: half 0 = v - half 1, one seq_cst store, then notify.
void shared_set(slot& s, std::uint64_t v) noexcept {
  stripe* st = s.stripe_array();
  st[0].value.store(v - st[1].value.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  s.notify();
}
void shared_set_error(slot& s, std::uint64_t v) noexcept {
  stripe* st = s.stripe_array();
  st[0].errors.store(v - st[1].errors.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  s.notify();
}

shared_segment& seg_of(const slot& s) noexcept {
  return *static_cast<shared_segment*>(s.backend_data);
}

class shared_backend final : public backend {
 public:
  std::string_view name() const noexcept override { return seg_.dev_name; }
  counter_caps caps() const noexcept override {
    return counter_caps{UINT64_MAX, seg_.cell_count, 0};
  }
  std::error_code bind_counter(slot& s) noexcept override;
  void unbind_counter(slot& s) noexcept override;
  bool binds_counters() const noexcept override { return true; }
  shared_segment* shared() noexcept override { return &seg_; }
  shared_segment seg_;
};

std::error_code shared_backend::bind_counter(slot& s) noexcept {
  shared_segment& g = seg_;
  const std::uint32_t n = g.cell_count;
  const std::uint32_t start = g.hdr->alloc_hint.load(std::memory_order_relaxed) % n;
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint32_t i = start + k < n ? start + k : start + k - n;
    shm::record& r = g.records[i];
    std::uint64_t c = r.ctl.load(std::memory_order_relaxed);
    if (c != 0) continue;
    if (!r.ctl.compare_exchange_strong(c, shm::make_ctl(shm::cell_creating, g.bit()),
                                       std::memory_order_acquire))
      continue;
    g.hdr->alloc_hint.store(i + 1, std::memory_order_relaxed);
    shm::cell& cell = g.cells[i];
    for (shm::half& h : cell.h) {
      h.value.store(0, std::memory_order_relaxed);
      h.errors.store(0, std::memory_order_relaxed);
    }
    r.type.store(static_cast<std::uint32_t>(s.type), std::memory_order_relaxed);
    r.creator.store(g.me, std::memory_order_relaxed);
    const std::uint64_t gen = r.generation.load(std::memory_order_acquire);
    r.ctl.store(shm::make_ctl(shm::cell_live, g.bit()), std::memory_order_release);
    {
      std::lock_guard lock(g.mu);
      shared_segment::local& l = g.locals[i];
      l.s = &s;
      ++l.count;
      l.gen.store(gen, std::memory_order_relaxed);
    }
    g.bind(s, i);
    return {};
  }
  return fail(ENOMEM,
              "create_comp_cntr: the shared device '%s' has all its %u counters in use (by "
              "the processes that opened it)",
              g.dev_name.c_str(), n);
}

void shared_backend::unbind_counter(slot& s) noexcept {
  if (!is_shared(s) || s.backend_data != &seg_) return; // never bound (a failed create/resolve)
  shared_segment& g = seg_;
  const std::uint32_t i = g.cell_of(s);
  {
    // Before the slot's stripes (and then its extension block) go: the watcher only touches
    // registered slots, under watch_mu.
    std::lock_guard wl(g.watch_mu);
    g.watched.erase(std::remove(g.watched.begin(), g.watched.end(), &s), g.watched.end());
  }
  s.watch.fetch_and(~watch_shared, std::memory_order_relaxed);
  s.stripes = 0;
  s.stripe_mask_ = 0;
  s.hw = nullptr;
  s.backend_data = nullptr;
  std::lock_guard lock(g.mu);
  shared_segment::local& l = g.locals[i];
  if (l.s == &s) l.s = nullptr;
  if (l.count > 0 && --l.count == 0) g.release_cell(i);
}

} // namespace

const hw_counter_ops shared_counter_ops = {shared_add, shared_add_error, shared_set,
                                           shared_set_error, nullptr};

void notify_shared(slot& s) noexcept {
  shm::header& h = *seg_of(s).hdr;
  if (h.sleepers.load(std::memory_order_seq_cst) != 0) {
    // Bump first: a waiter between its read of the word and FUTEX_WAIT finds it changed.
    h.wake_seq.fetch_add(1, std::memory_order_release);
    futex::wake_shared(h.wake_seq);
  }
}

counter_id shared_counter_id(const slot& s) noexcept {
  const shared_segment& g = seg_of(s);
  const std::uint32_t i = g.cell_of(s);
  return {g.locals[i].gen.load(std::memory_order_relaxed), i};
}

shared_wait_words shared_words(const slot& s) noexcept {
  shm::header& h = *seg_of(s).hdr;
  return {&h.wake_seq, &h.sleepers};
}

bool shared_creator_died(const slot& s) noexcept {
  const shared_segment& g = seg_of(s);
  return shm::cell_state(g.records[g.cell_of(s)].ctl.load(std::memory_order_acquire)) ==
         shm::cell_dead;
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

// ---- the fd watcher (docs/shared.md, "Pollable fds") ---------------------------------------

// The watcher thread. Memory ordering (the waiter's side of compcntr:shared's Dekker pairing,
// as shared_sleep in src/core/wait/wait.cpp): read wake_seq (acquire), register in `sleepers`
// (seq_cst RMW + fence), then scan (seq_cst loads of every armed cell), then FUTEX_WAIT on
// wake_seq. An update in any process after the registration sees sleepers != 0 and bumps and
// wakes; one before it is seen by the scan. An arm made while the watcher is registered is
// covered by the same argument (its baseline or threshold is read by the next scan); one made
// while it is parked (no fd armed, not a sleeper: updaters pay nothing) wakes it through
// watch_pending / watch_cv, and it registers before it scans. Each sleep is at most
// shared_sleep_slice (250 ms): an updater that died between its RMW and its wake, or a
// scribbled sleeper count, delays a signal by at most that; between sleeps it sweeps if due,
// so a creator's death is found (its armed fds are then signalled: a wait says EIO).
void shared_segment::watch_loop() noexcept {
  ::pthread_setname_np(::pthread_self(), "compcntr-shfd");
  std::vector<trigger_list*> due; // trigger lists found due by a scan (referenced)
  std::unique_lock lock(watch_mu);
  std::uint32_t armed = 0;
  for (;;) {
    if (watch_stop) return;
    if (armed == 0 && !watch_pending) {
      watch_cv.wait(lock);
      continue;
    }
    watch_pending = false;
    lock.unlock();
    const std::uint32_t seq = hdr->wake_seq.load(std::memory_order_acquire);
    hdr->sleepers.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    lock.lock();
    try {
      due.reserve(watched.size()); // no allocation under the scan
    } catch (...) {
      due.clear(); // no memory: triggers wait for a later round (fds are signalled anyway)
    }
    armed = watch_scan(due);
    const bool again = watch_pending || watch_stop;
    lock.unlock();
    // Triggers fire with nothing locked: an action may arm, destroy or update counters. Their
    // lists are referenced, and a list whose counter was destroyed meanwhile fires nothing.
    for (trigger_list* l : due) shared_fire_triggers(l);
    due.clear();
    if (armed != 0 && !again)
      futex::wait_shared(hdr->wake_seq, seq, std::chrono::nanoseconds(shared_sleep_slice));
    hdr->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (armed != 0) sweep_if_due();
    lock.lock();
  }
}

// Under watch_mu: every registered slot's fd that is due is signalled; returns how many stay
// armed. A slot is registered from before its first arm until its unbind (which takes watch_mu
// to leave the list before its stripes and extension block go).
std::uint32_t shared_segment::watch_scan(std::vector<trigger_list*>& due) noexcept {
  std::uint32_t armed = 0;
  for (slot* s : watched) {
    const std::uint32_t i = cell_of(*s);
    const bool dead =
        i < cell_count &&
        shm::cell_state(records[i].ctl.load(std::memory_order_acquire)) == shm::cell_dead;
    armed += shared_fd_check(*s, dead) ? 1 : 0;
    if ((s->watch.load(std::memory_order_seq_cst) & watch_triggers) != 0) {
      ++armed;
      if (due.size() < due.capacity())
        if (trigger_list* l = shared_due_triggers(*s)) due.push_back(l);
    }
  }
  return armed;
}

// At close (no counter of the device is left, so nothing is armed): the watcher returns and is
// joined. In a child forked after the open the thread is the parent's: there is none to join
// here, its handle is left alone (as the cmd_comp engine's, docs/devices.md FORK).
void shared_segment::stop_watcher() noexcept {
  if (watcher == nullptr) return;
  if (::getpid() != opener_pid) {
    watcher = nullptr; // the parent's thread: not ours to join or delete
    return;
  }
  {
    std::lock_guard lock(watch_mu);
    watch_stop = true;
  }
  watch_cv.notify_all();
  wake_all(); // ends its FUTEX_WAIT now (other processes' sleepers re-check once)
  watcher->join();
  delete watcher;
  watcher = nullptr;
}

std::error_code shared_watch_fd(slot& s, const char* call) noexcept {
  shared_segment& g = seg_of(s);
  if (::getpid() != g.opener_pid)
    return fail(EOWNERDEAD,
                "%s: counter %u is on shared device '%s', opened by process %d before "
                "fork(); its watcher (a thread of that process) does not exist in this child "
                "(pid %d): open the device in the child (docs/devices.md, FORK)",
                call, s.index, g.dev_name.c_str(), static_cast<int>(g.opener_pid),
                static_cast<int>(::getpid()));
  std::lock_guard lock(g.watch_mu);
  if (std::find(g.watched.begin(), g.watched.end(), &s) != g.watched.end()) return {};
  try {
    g.watched.reserve(g.watched.size() + 1);
  } catch (...) {
    return fail(ENOMEM, "%s: out of memory registering counter %u with the watcher of '%s'", call,
                s.index, g.dev_name.c_str());
  }
  if (g.watcher == nullptr) {
    try {
      g.watcher = new std::thread([&g] { g.watch_loop(); });
    } catch (const std::system_error& err) {
      return fail(err.code().value() ? err.code().value() : EAGAIN,
                  "%s: cannot start the watcher thread of shared device '%s' (%s)", call,
                  g.dev_name.c_str(), err.what());
    } catch (...) {
      return fail(ENOMEM, "%s: out of memory starting the watcher thread of '%s'", call,
                  g.dev_name.c_str());
    }
  }
  g.watched.push_back(&s); // capacity reserved: no throw
  return {};
}

void shared_watch_kick(slot& s) noexcept {
  shared_segment& g = seg_of(s);
  {
    std::lock_guard lock(g.watch_mu);
    g.watch_pending = true;
  }
  g.watch_cv.notify_one();
}

std::unique_ptr<backend> open_shared_backend(std::string_view name, std::uint32_t flags,
                                             std::uint32_t mode, std::error_code& ec) noexcept {
  std::unique_ptr<shared_backend> be(new (std::nothrow) shared_backend);
  if (!be) {
    fail_into(ec, ENOMEM, "open_shared_device: out of memory");
    return nullptr;
  }
  if (auto e = be->seg_.open(name, flags, mode)) {
    ec = e;
    return nullptr;
  }
  be->seg_.locals.reset(new (std::nothrow) shared_segment::local[be->seg_.cell_count]);
  if (!be->seg_.locals) {
    fail_into(ec, ENOMEM, "open_shared_device: out of memory for %u counters' local state",
              be->seg_.cell_count);
    return nullptr;
  }
  ec.clear();
  return be;
}

slot* resolve_shared_slot(device_core& dev, counter_id id, std::error_code& ec) noexcept {
  shared_segment& g = *dev.shared();
  const char* n = g.dev_name.c_str();
  const unsigned long long idgen = id.generation;
  if (id.index >= g.cell_count) {
    fail_into(ec, ENOENT,
              "resolve: counter id {index %u, generation %llu} names no counter of '%s' (it "
              "has %u)",
              id.index, idgen, n, g.cell_count);
    return nullptr;
  }
  const std::uint32_t i = id.index;
  shm::record& r = g.records[i];
  auto stale = [&] {
    fail_into(ec, ESTALE,
              "resolve: counter id {index %u, generation %llu} of '%s' is stale: its counter "
              "was destroyed (the cell is at generation %llu)",
              i, idgen, n,
              static_cast<unsigned long long>(r.generation.load(std::memory_order_relaxed)));
    return static_cast<slot*>(nullptr);
  };
  auto gone = [&](std::uint64_t st) {
    fail_into(ec, ENOENT,
              "resolve: counter id {index %u, generation %llu} of '%s' names no live counter "
              "(%s)",
              i, idgen, n,
              st == shm::cell_dead     ? "its creator died"
              : st == shm::cell_orphan ? "its creator destroyed it"
                                       : "it was never created or is being created");
    return static_cast<slot*>(nullptr);
  };
  if (r.generation.load(std::memory_order_acquire) != id.generation) return stale();
  std::lock_guard lock(g.mu);
  shared_segment::local& l = g.locals[i];
  // Resolvable only while its creator holds it (a holder's own slot does not revive it).
  if (const std::uint64_t st = shm::cell_state(r.ctl.load(std::memory_order_acquire));
      st != shm::cell_live)
    return gone(st);
  if (l.count > 0 && l.s != nullptr && l.gen.load(std::memory_order_relaxed) == id.generation &&
      take_counter_ref(*l.s)) {
    ec.clear();
    return l.s; // this process's slot of the counter (its creator's, or a resolved one)
  }
  // A new local slot (before taking the cell: a refused allocation changes nothing).
  slot* s = dev.pool().allocate(-1, ec);
  if (s == nullptr) return nullptr;
  reset_field(s->owner, &dev);
  auto undo = [&](slot* res) {
    unref_counter_slot(*s); // never bound: straight back to the pool
    return res;
  };
  std::uint64_t c = r.ctl.load(std::memory_order_acquire);
  if (l.count == 0) {
    for (;;) {
      if (shm::cell_state(c) != shm::cell_live) return undo(gone(shm::cell_state(c)));
      if (r.ctl.compare_exchange_weak(c, c | g.bit(), std::memory_order_acq_rel,
                                      std::memory_order_acquire))
        break;
    }
    // Recycled between the generation check and the CAS: the bit is on a newer counter.
    if (r.generation.load(std::memory_order_acquire) != id.generation) {
      g.release_cell(i);
      return undo(stale());
    }
  } else if (shm::cell_state(c) != shm::cell_live) {
    return undo(gone(shm::cell_state(c)));
  }
  const std::uint32_t type = r.type.load(std::memory_order_relaxed);
  if (type > static_cast<std::uint32_t>(counter_type::bytes)) {
    if (l.count == 0) g.release_cell(i);
    fail_into(ec, EBADMSG, "resolve: counter %u of '%s' has a corrupt type (%u) in the segment", i,
              n, type);
    return undo(nullptr);
  }
  s->type = static_cast<counter_type>(type);
  l.s = s;
  ++l.count;
  l.gen.store(id.generation, std::memory_order_relaxed);
  g.bind(*s, i);
  ec.clear();
  return s;
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
