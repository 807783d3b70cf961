// Shared devices: opening and closing a segment (the file comment of the internal partition
// compcntr:shared_impl, src/core/shared/segment_impl.cppm, states what a segment guarantees).
// Holds shared_segment::open (name and mode checks, shm_open, the exclusive flock, stale
// replacement), validate (owner, mode, size, then header: before any byte past it is read),
// initialise, register_self (a process table entry) and close (the last one out unlinks).
module;
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include "core/shared/layout.hpp"
module compcntr;
import :shared_impl;

namespace compcntr::detail {

namespace {

constexpr std::size_t max_name = 200;

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

} // namespace

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
// `blank`: set (with success) when the header was never written: magic 0 and state
// "initializing" (initialise writes the magic after every other field of the header, and the
// state "ready" after the magic), which under the flock means that its creator died after
// sizing the file and before writing the header: not corrupt, never initialised.
std::error_code shared_segment::validate(const struct stat& st, bool& blank) noexcept {
  blank = false;
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
  if (h.magic == 0 && h.state.load(std::memory_order_acquire) == shm::seg_initializing) {
    blank = true;
    return {};
  }
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
// write the header with its magic last, register, and publish state = ready. A creator killed
// at any point leaves a file that the next opener (which gets the flock when it dies) finds of
// size 0, blank (magic 0: validate), or in state "initializing": it re-initialises each of them.
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
  // The magic after every other field (the fence orders the compiler's stores and the CPU's):
  // a header with the magic is complete but for the state.
  std::atomic_thread_fence(std::memory_order_release);
  h.magic = shm::magic;
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
    bool blank = false;
    if (auto e = validate(st, blank)) return done(e);
    if (blank) {  // its creator died before writing the header (we hold its flock)
      if (!create)
        return done(fail(ENOENT,
                         "open_shared_device: '%s' was never initialised (its creator died "
                         "before writing its header); open with COMPCNTR_SHARED_CREATE to "
                         "replace it",
                         dev_name.c_str()));
      return done(initialise(mode));
    }
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

} // namespace compcntr::detail
