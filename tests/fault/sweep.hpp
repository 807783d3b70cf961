// The sweep engine of the fault suite: each scenario is one C API call made from a prepared
// state; the sweep makes it once with the shim counting the points it reaches (N), then 2N more
// times: failing point k only ("once"), and failing point k and every later one ("from"), for
// k = 1..N. The scenario itself checks, each time: the call either succeeded (and what it made
// works) or failed with a documented errno; a failed call changed nothing; once the fault is
// gone the same call works. Every family of scenarios runs in a child process (a crash is then
// one failed test case, not a dead suite) and, under AddressSanitizer, ends with a leak check.
#ifndef COMPCNTR_TESTS_FAULT_SWEEP_HPP
#define COMPCNTR_TESTS_FAULT_SWEEP_HPP

#include "shim.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include <execinfo.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/lsan_interface.h>
#define FAULT_LSAN 1
#endif
#endif
#ifndef FAULT_LSAN
#define FAULT_LSAN 0
#endif

namespace fault {

/// What a family reports to the parent (through a pipe).
struct totals {
  long scenarios = 0;
  long points = 0;       ///< injection points reached by the clean calls (sum of N)
  long runs = 0;         ///< calls made with a fault (2N per scenario)
  long refused = 0;      ///< of those, calls that failed with a documented errno
  long absorbed = 0;     ///< of those, calls that succeeded anyway (the failure had a fallback)
  long hwloc_aborts = 0; ///< malloc sweeps: points at which hwloc aborted the process
  long failures = 0;
  long sites = 0;
};

inline totals& tally() {
  static totals t;
  return t;
}
inline const char*& current() {
  static const char* c = "";
  return c;
}

#define FCHECK(cond, ...)                                                                  \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      ++::fault::tally().failures;                                                         \
      std::fprintf(stderr, "fault: FAILED [%s] %s:%d: %s: ", ::fault::current(), __FILE__, \
                   __LINE__, #cond);                                                       \
      std::fprintf(stderr, __VA_ARGS__);                                                   \
      std::fputc('\n', stderr);                                                            \
    }                                                                                      \
  } while (0)

inline bool one_of(int e, std::initializer_list<int> l) {
  for (int x : l)
    if (x == e) return true;
  return false;
}

/// The outcome of one attempt, for the tallies: the scenario says whether its call failed.
struct attempt_result {
  long points;   ///< points reached while armed
  bool refused;  ///< the call failed (with a documented errno: checked by the scenario)
};

/// Runs `attempt(mode, k, kinds)` as described in the file comment.
template <class F>
void sweep(const char* name, unsigned kinds, F attempt) {
  current() = name;
  attempt(mode::off, 0, kinds);  // warm-up: lazy statics, thread-locals, caches
  const long n = attempt(mode::count, 0, kinds).points;
  for (long k = 1; k <= n; ++k)
    for (mode m : {mode::once, mode::from}) {
      const attempt_result r = attempt(m, k, kinds);
      ++tally().runs;
      if (r.refused)
        ++tally().refused;
      else
        ++tally().absorbed;
    }
  ++tally().scenarios;
  tally().points += n;
  std::printf("fault:   %-62s %3ld point(s)\n", name, n);
  std::fflush(stdout);
}

/// A scenario that must reach no injection point at all (hot paths: no allocation, no fd).
template <class F>
void no_points(const char* name, F call) {
  current() = name;
  call();  // warm-up
  arm(mode::count, 0, all);
  call();
  const long n = disarm();
  FCHECK(n == 0, "%ld allocation/fd point(s) reached", n);
  ++tally().scenarios;
  std::printf("fault:   %-62s   0 points (checked)\n", name);
  std::fflush(stdout);
}

/// Runs one attempt in a forked child, for points where a dependency may abort (hwloc under
/// malloc failures). Returns 0 ok, 1 check failure, 2 abort inside hwloc_topology_load, 3 any
/// other crash.
template <class F>
int isolated(F attempt_fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    struct sigaction sa{};
    sa.sa_handler = [](int) {
      if (inside_hwloc_load()) _exit(42);
      // Not hwloc: say where (glibc's backtrace is safe enough in a dying child).
      void* frames[32];
      const int n = backtrace(frames, 32);
      backtrace_symbols_fd(frames, n, 2);
      _exit(43);
    };
    for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
    const long before = tally().failures;
    attempt_fn();
    _exit(tally().failures != before ? 1 : 0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) {
    switch (WEXITSTATUS(status)) {
      case 0: return 0;
      case 42: return 2;
      case 43: return 3;
      default: return 1;
    }
  }
  return 3;
}

/// The malloc-kind sweep of a scenario, each faulty attempt in its own process (hwloc's and
/// libc's internal allocations fail too; hwloc may abort). Aborts inside hwloc_topology_load
/// are counted (a dependency's limit, docs/reliability.md); any other crash is a failure.
template <class F>
void sweep_malloc(const char* name, F attempt) {
  if (!malloc_available()) return;
  current() = name;
  attempt(mode::off, 0, malloc_);
  const long n = attempt(mode::count, 0, malloc_).points;
  long aborts = 0;
  for (long k = 1; k <= n; ++k)
    for (mode m : {mode::once, mode::from}) {
      const int r = isolated([&] { attempt(m, k, malloc_); });
      ++tally().runs;
      if (r == 2) {
        ++aborts;
      } else if (r == 3) {
        ++tally().failures;
        std::fprintf(
            stderr, "fault: FAILED [%s] crashed outside hwloc with malloc point %ld failing (%s)\n",
            name, k, m == mode::once ? "once" : "from then on");
      } else if (r == 1) {
        ++tally().failures;
        std::fprintf(stderr, "fault: FAILED [%s] check failed with malloc point %ld failing (%s)\n",
                     name, k, m == mode::once ? "once" : "from then on");
      }
    }
  ++tally().scenarios;
  tally().points += n;
  tally().hwloc_aborts += aborts;
  std::printf("fault:   %-62s %3ld malloc point(s), hwloc aborted at %ld of %ld runs\n", name, n,
              aborts, 2 * n);
  std::fflush(stdout);
}

inline int& report_fd() {
  static int fd = -1;
  return fd;
}

/// Ends a family's child process: reports its totals to the parent and exits (1 on failures).
[[noreturn]] inline void finish_family() {
  tally().sites = static_cast<long>(distinct_sites());
  if (write(report_fd(), &tally(), sizeof(totals)) != static_cast<ssize_t>(sizeof(totals)))
    _exit(3);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(tally().failures ? 1 : 0);
}

/// Runs `family` in a child process; returns its totals (failures > 0 if it crashed or leaked).
template <class F>
totals run_family(const char* family, F fn) {
  int p[2];
  if (pipe(p) != 0) std::abort();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    report_fd() = p[1];
    // The test framework's crash handlers stay in the parent: a crash here is the parent's
    // report (signal and name), with the default core-dump behaviour.
    for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, SIG_DFL);
    std::printf("fault: family %s\n", family);
    fn();
#if FAULT_LSAN
    if (__lsan_do_recoverable_leak_check() != 0) {
      ++tally().failures;
      std::fprintf(stderr, "fault: FAILED [%s] LeakSanitizer found leaks (report above)\n", family);
    }
#endif
    finish_family();
  }
  close(p[1]);
  totals t;
  const bool got = read(p[0], &t, sizeof t) == static_cast<ssize_t>(sizeof t);
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!got) {
    t = totals{};
    t.failures = 1;
    if (WIFSIGNALED(status))
      std::fprintf(stderr, "fault: family %s died of signal %d (%s)\n", family, WTERMSIG(status),
                   strsignal(WTERMSIG(status)));
    else
      std::fprintf(stderr, "fault: family %s exited with %d before reporting\n", family,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  return t;
}

} // namespace fault

#endif
