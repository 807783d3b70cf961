// Helpers of the shared-device suites (tests/shared/): unique segment names removed on every
// exit path, forked children with exact exit codes, pipes to sequence processes, and a view of
// a segment's bytes (src/core/shared/layout.hpp) to watch and scribble over it.
#ifndef COMPCNTR_TESTS_SHARED_SUPPORT_HPP
#define COMPCNTR_TESTS_SHARED_SUPPORT_HPP

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "core/shared/layout.hpp"

namespace shared_test {

namespace shm = compcntr::shm;

/// A segment name unique to this process and call; the segment is unlinked when it goes.
struct seg_name {
  std::string name;  ///< NAME ("shm:" + name opens it)
  std::string path;  ///< shm_open path
  explicit seg_name(const char* what) {
    static int n = 0;
    name = std::string("t") + std::to_string(::getpid()) + "-" + what + "-" + std::to_string(++n);
    path = "/compcntr." + name;
    ::shm_unlink(path.c_str());
  }
  ~seg_name() { ::shm_unlink(path.c_str()); }
  std::string dev() const { return "shm:" + name; }
};

/// A child's check: exits with the line number (mod 200, + 20) on failure, so the parent's
/// assertion names the failing line.
#define CHILD_CHECK(cond)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "child %d: %s:%d: %s failed\n", static_cast<int>(::getpid()), __FILE__, \
                   __LINE__, #cond);                                                               \
      ::_exit(20 + __LINE__ % 200);                                                                \
    }                                                                                              \
  } while (0)

/// Runs fn() in a child process, which exits 0 when fn returns.
template <class Fn>
pid_t spawn(Fn&& fn) {
  std::fflush(nullptr);  // the child must not flush the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid == 0) {
    fn();
    ::_exit(0);
  }
  return pid;
}

/// The child's exit status: its exit code, or 1000 + signal number if a signal ended it.
inline int reap(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return 1000 + WTERMSIG(st);
}

/// A pipe carrying fixed-size messages between a parent and its children.
struct channel {
  int fd[2] = {-1, -1};
  channel() {
    if (::pipe(fd) != 0) std::abort();
  }
  ~channel() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  template <class T>
  void send(const T& v) const {
    if (::write(fd[1], &v, sizeof v) != static_cast<ssize_t>(sizeof v)) std::abort();
  }
  template <class T>
  bool recv(T& v) const {
    char* p = reinterpret_cast<char*>(&v);
    std::size_t got = 0;
    while (got < sizeof v) {
      const ssize_t n = ::read(fd[0], p + got, sizeof v - got);
      if (n <= 0) return false;
      got += static_cast<std::size_t>(n);
    }
    return true;
  }
};

/// The segment's bytes, mapped separately (as a scribbling peer would).
struct seg_view {
  int fd = -1;
  void* base = nullptr;
  std::size_t size = 0;
  explicit seg_view(const seg_name& n) {
    fd = ::shm_open(n.path.c_str(), O_RDWR, 0);
    struct stat st{};
    if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size == 0) return;
    size = static_cast<std::size_t>(st.st_size);
    base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) base = nullptr;
  }
  ~seg_view() {
    if (base) ::munmap(base, size);
    if (fd >= 0) ::close(fd);
  }
  explicit operator bool() const { return base != nullptr; }
  shm::header& hdr() const { return *static_cast<shm::header*>(base); }
  shm::record& rec(std::uint32_t i) const {
    return reinterpret_cast<shm::record*>(static_cast<char*>(base) +
                                          shm::records_offset(hdr().cell_count))[i];
  }
  shm::cell& cell(std::uint32_t i) const {
    return reinterpret_cast<shm::cell*>(static_cast<char*>(base) + shm::cells_offset())[i];
  }
  /// The sum of every process entry's share of the sleeper count.
  std::uint64_t sleeper_shares() const {
    std::uint64_t n = 0;
    for (const auto& v : hdr().proc_sleepers) n += v.load(std::memory_order_acquire);
    return n;
  }
  /// Cells whose record is not free (held by some process).
  std::uint32_t cells_in_use() const {
    std::uint32_t n = 0;
    for (std::uint32_t i = 0; i < hdr().cell_count; ++i)
      n += rec(i).ctl.load(std::memory_order_acquire) != 0;
    return n;
  }
  std::uint32_t procs_in_use() const {
    std::uint32_t n = 0;
    for (auto& p : hdr().procs) n += p.load(std::memory_order_acquire) != 0;
    return n;
  }
};

/// Field 3 (state) of /proc/<pid>/stat: 'R', 'S', 'Z' (a zombie: exited, not yet reaped; also
/// a thread group leader whose thread exited while other threads of its process run), ...; 0
/// if there is no such process. The command name (field 2) may hold spaces: read after its ')'.
inline char proc_state(pid_t pid) {
  char path[40], buf[512];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t k = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (k <= 0) return 0;
  buf[k] = '\0';
  const char* p = std::strrchr(buf, ')');
  return p != nullptr && p[1] == ' ' ? p[2] : 0;
}

/// The process table entry of process `pid` in a segment (shm::max_procs if it has none).
inline std::uint32_t proc_entry(const seg_view& v, pid_t pid) {
  for (std::uint32_t j = 0; j < shm::max_procs; ++j) {
    const std::uint64_t w = v.hdr().procs[j].load(std::memory_order_acquire);
    if (w != 0 && shm::proc_pid(w) == static_cast<std::uint32_t>(pid)) return j;
  }
  return shm::max_procs;
}

/// Entries of a /proc/self directory ("fd", "task"): open fds, threads.
inline int proc_self_entries(const char* what) {
  const std::string dir = std::string("/proc/self/") + what;
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

/// Threads of this process named `comm` (/proc/self/task/*/comm; the shared device's fd watcher
/// is "compcntr-shfd"). Counted by name, not as a total of tasks: a sanitizer runtime's
/// background thread, or another thread ending on its own schedule, would change a total while
/// the watcher under test does not (seen under TSan on a loaded machine: 3 == 4). Checked with
/// eventually(): the watcher names itself once it runs, and a joined thread's /proc entry goes
/// a moment after pthread_join returns (the kernel wakes the joiner before it reaps the task).
inline int threads_named(const char* comm) {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
      char buf[32] = {};
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue; // the thread ended meanwhile
      const ssize_t k = ::read(fd, buf, sizeof buf - 1);
      ::close(fd);
      if (k > 0 && buf[k - 1] == '\n') buf[k - 1] = '\0';
      n += std::strcmp(buf, comm) == 0;
    }
    ::closedir(d);
  }
  return n;
}
inline int watcher_threads() { return threads_named("compcntr-shfd"); }

/// Waits (yielding, bounded by `max_spins` yields) until pred() holds; false on give-up.
template <class Pred>
bool eventually(Pred&& pred, long max_spins = 20'000'000) {
  for (long k = 0; k < max_spins; ++k) {
    if (pred()) return true;
    ::sched_yield();
  }
  return false;
}

} // namespace shared_test

#endif
