// The fault suite (issue 15): every allocation and fd-creation point of every C API family made
// to fail, once and from then on (sweep.hpp), plus a low RLIMIT_NOFILE and hwloc failures.
// Each family runs in its own child process; the figures (scenarios, points, runs, distinct
// call sites) are printed at the end and quoted in docs/status.md.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>
#if __has_include(<compcntr/tracker.h>)
#include <compcntr/tracker.h>
#define COMPCNTR_FAULT_TRACKER 1
#endif
#if COMPCNTR_FAULT_FABRIC
#include <compcntr/fabric.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#endif

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>

#include <cstdint>
#include <vector>

#include "shim.hpp"
#include "sweep.hpp"

using fault::attempt_result;
using fault::mode;

namespace {

fault::totals grand;

void add(const fault::totals& t) {
  grand.scenarios += t.scenarios;
  grand.points += t.points;
  grand.runs += t.runs;
  grand.refused += t.refused;
  grand.absorbed += t.absorbed;
  grand.hwloc_aborts += t.hwloc_aborts;
  grand.failures += t.failures;
  grand.sites = std::max(grand.sites, t.sites);  // per process: the largest family's
}

compcntr_device* open_soft(const char* max_counters = nullptr) {
  if (max_counters)
    setenv("COMPCNTR_MAX_COUNTERS", max_counters, 1);
  else
    unsetenv("COMPCNTR_MAX_COUNTERS");
  compcntr_device* d = compcntr_open_device("soft");
  unsetenv("COMPCNTR_MAX_COUNTERS");
  FCHECK(d != nullptr, "open_device without faults: %s", compcntr_last_error_message());
  if (!d) fault::finish_family();
  return d;
}

compcntr_comp_cntr* counter(compcntr_device* d,
                            compcntr_comp_cntr_type t = COMPCNTR_COMP_CNTR_TYPE_WRS) {
  compcntr_comp_cntr_init_attr a{};
  a.type = t;
  compcntr_comp_cntr* c = compcntr_create_comp_cntr(d, &a);
  FCHECK(c != nullptr, "create_comp_cntr without faults: %s", compcntr_last_error_message());
  if (!c) fault::finish_family();
  return c;
}

std::uint64_t value(compcntr_comp_cntr* c) {
  std::uint64_t v = ~0ull;
  FCHECK(compcntr_read_comp_cntr(c, &v) == 0, "read");
  return v;
}

/// A counter on `d` works: inc, read, destroy.
void counter_works(compcntr_device* d) {
  compcntr_comp_cntr_init_attr a{};
  compcntr_comp_cntr* c = compcntr_create_comp_cntr(d, &a);
  FCHECK(c != nullptr, "a counter on the device: %s", compcntr_last_error_message());
  if (!c) return;
  FCHECK(compcntr_inc_comp_cntr(c, 3) == 0 && value(c) == 3, "a counter counts");
  FCHECK(compcntr_destroy_comp_cntr(c) == 0, "destroy");
}

void close_clean(compcntr_device* d) {
  const int r = compcntr_close_device(d);
  FCHECK(r == 0, "close_device = %d (%s): a failed call left a reference behind", r,
         compcntr_last_error_message());
}

// ---- device open ----

attempt_result open_attempt(mode m, long k, unsigned kinds) {
  fault::arm(m, k, kinds);
  compcntr_device* d = compcntr_open_device("soft");
  const int e = errno;
  const long pts = fault::disarm();
  if (d) {
    compcntr_comp_cntr_caps caps{};
    FCHECK(compcntr_query_comp_cntr_caps(d, &caps) == 0 && caps.max_counters == 1048576u,
           "an opened device has the default capacity (max_counters %u)", caps.max_counters);
    counter_works(d);  // and it works once the fault is gone
    close_clean(d);
  } else {
    FCHECK(fault::failed() > 0, "open_device failed without a fault: %s",
           compcntr_last_error_message());
    FCHECK(e == ENOMEM, "open_device: errno %d (%s), documented: ENOMEM", e, std::strerror(e));
    FCHECK(compcntr_last_error_message()[0] != '\0', "a message names the cause");
  }
  compcntr_device* again = open_soft();
  counter_works(again);
  close_clean(again);
  return {pts, d == nullptr};
}

// The first open of a process loads the hwloc topology; later opens share it (issue 22), so the
// in-process sweeps below reach hwloc only through their first call. This sweep makes each
// point of the first open fail in a fresh child process whose first open it is (the count pass
// too), so the topology load stays swept: hwloc failures degrade to one unbound node, and with
// malloc failing hwloc may abort inside its load (counted, as in sweep_malloc).
void sweep_first_open(const char* name, unsigned kinds) {
  fault::current() = name;
  int p[2];
  FCHECK(pipe(p) == 0, "pipe");
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    long n = open_attempt(mode::count, 0, kinds).points;
    _exit(write(p[1], &n, sizeof n) == sizeof n ? 0 : 1);
  }
  close(p[1]);
  long n = -1;
  const bool got = read(p[0], &n, sizeof n) == sizeof n;
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  FCHECK(got && WIFEXITED(status) && WEXITSTATUS(status) == 0, "count pass of the first open");
  if (!got) return;
  long aborts = 0;
  for (long k = 1; k <= n; ++k)
    for (mode m : {mode::once, mode::from}) {
      const int r = fault::isolated([&] { open_attempt(m, k, kinds); });
      ++fault::tally().runs;
      if (r == 2 && (kinds & fault::malloc_)) {
        ++aborts;
      } else if (r != 0) {
        ++fault::tally().failures;
        std::fprintf(stderr, "fault: FAILED [%s] point %ld failing (%s): %s\n", name, k,
                     m == mode::once ? "once" : "from then on", r == 1 ? "check failed" : "crash");
      }
    }
  ++fault::tally().scenarios;
  fault::tally().points += n;
  fault::tally().hwloc_aborts += aborts;
  std::printf("fault:   %-62s %3ld point(s), each in a fresh process; hwloc aborted at %ld of "
              "%ld runs\n",
              name, n, aborts, 2 * n);
  std::fflush(stdout);
}

void family_device() {
  // First, while no open has loaded the topology in this process (the children inherit that).
  sweep_first_open("first open_device(\"soft\") of a process",
                   fault::alloc | fault::fd | fault::hwloc);
  if (fault::malloc_available())
    sweep_first_open("first open_device(\"soft\") of a process [malloc]", fault::malloc_);
  fault::sweep("open_device(\"soft\")", fault::alloc | fault::fd | fault::hwloc, open_attempt);
  fault::sweep_malloc("open_device(\"soft\") [malloc, hwloc included]", open_attempt);
  // hwloc cannot read its topology: the device opens with one node and unbound memory.
  for (const char* var : {"HWLOC_XMLFILE", "HWLOC_SYNTHETIC"}) {
    fault::current() = var;
    setenv(var, var[6] == 'X' ? "/nonexistent/topology.xml" : "not a topology", 1);
    compcntr_device* d = compcntr_open_device("soft");
    FCHECK(d != nullptr, "open_device with %s invalid: %s", var, compcntr_last_error_message());
    if (d) {
      counter_works(d);
      close_clean(d);
    }
    unsetenv(var);
    ++fault::tally().scenarios;
  }
}

// ---- counters and arenas ----

void family_counters() {
  {
    // Room for exactly one more counter: a failed create must leave it.
    compcntr_device* d = open_soft("4");
    compcntr_comp_cntr* held[3];
    for (auto& c : held) c = counter(d);
    fault::sweep(
        "create_comp_cntr (pool with room for one)", fault::all & ~fault::malloc_,
        [&](mode m, long k, unsigned kinds) -> attempt_result {
          compcntr_comp_cntr_init_attr a{};
          fault::arm(m, k, kinds);
          compcntr_comp_cntr* c = compcntr_create_comp_cntr(d, &a);
          const int e = errno;
          const long pts = fault::disarm();
          if (!c) {
            FCHECK(fault::failed() > 0 && e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
            c = compcntr_create_comp_cntr(d, &a);  // the room is still there
            FCHECK(c != nullptr, "the failed create took the last room: %s",
                   compcntr_last_error_message());
          }
          compcntr_comp_cntr* extra = compcntr_create_comp_cntr(d, &a);
          FCHECK(extra == nullptr && errno == ENOMEM, "the pool holds 4, not more");
          if (extra) compcntr_destroy_comp_cntr(extra);
          if (c) {
            FCHECK(value(c) == 0 && compcntr_inc_comp_cntr(c, 1) == 0 && value(c) == 1, "works");
            FCHECK(compcntr_destroy_comp_cntr(c) == 0, "destroy");
          }
          return {pts, false};
        });
    for (auto* c : held) compcntr_destroy_comp_cntr(c);
    close_clean(d);
  }
  // A striped counter allocates its stripes (128 bytes each) beside the slot: ENOMEM leaves the
  // pool's room (one left) and the counter is exact once made.
  for (std::uint32_t stripes :
       {4u, static_cast<std::uint32_t>(COMPCNTR_COMP_CNTR_STRIPES_PER_CPU)}) {
    compcntr_device* d = open_soft("2");
    compcntr_comp_cntr* held = counter(d);
    fault::sweep(
        stripes == 4 ? "create_comp_cntr (striped, 4 stripes; room for one)"
                     : "create_comp_cntr (striped, per CPU; room for one)",
        fault::all & ~fault::malloc_, [&](mode m, long k, unsigned kinds) -> attempt_result {
          compcntr_comp_cntr_init_attr a{};
          a.comp_mask = COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES;
          a.stripes = stripes;
          fault::arm(m, k, kinds);
          compcntr_comp_cntr* c = compcntr_create_comp_cntr(d, &a);
          const int e = errno;
          const long pts = fault::disarm();
          const bool refused = c == nullptr;
          if (!c) {
            FCHECK(fault::failed() > 0 && e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
            c = compcntr_create_comp_cntr(d, &a);  // the room is still there
            FCHECK(c != nullptr, "the failed create took the last room: %s",
                   compcntr_last_error_message());
          }
          if (c) {
            FCHECK(value(c) == 0 && compcntr_inc_comp_cntr(c, 7) == 0 &&
                       compcntr_inc_comp_cntr(c, 1) == 0 && value(c) == 8,
                   "a striped counter counts");
            FCHECK(compcntr_destroy_comp_cntr(c) == 0, "destroy");
          }
          return {pts, refused};
        });
    compcntr_destroy_comp_cntr(held);
    close_clean(d);
  }
  // The first counter of a device allocates its first arena (hwloc_alloc_membind); the
  // 4097th the second (arenas of 4096 slots).
  for (int before : {0, 4096}) {
    fault::sweep(before ? "create_comp_cntr (second arena)" : "create_comp_cntr (first arena)",
                 fault::all & ~fault::malloc_,
                 [&](mode m, long k, unsigned kinds) -> attempt_result {
                   compcntr_device* d = open_soft();
                   std::vector<compcntr_comp_cntr*> held;
                   for (int i = 0; i < before; ++i) held.push_back(counter(d));
                   compcntr_comp_cntr_init_attr a{};
                   fault::arm(m, k, kinds);
                   compcntr_comp_cntr* c = compcntr_create_comp_cntr(d, &a);
                   const int e = errno;
                   const long pts = fault::disarm();
                   if (!c) FCHECK(e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
                   const bool refused = c == nullptr;
                   if (!c) c = counter(d);  // normal operation once the fault is gone
                   FCHECK(value(c) == 0, "a new counter starts at 0");
                   held.push_back(c);
                   for (auto* x : held) FCHECK(compcntr_destroy_comp_cntr(x) == 0, "destroy");
                   close_clean(d);
                   return {pts, refused};
                 });
  }
  // Hot paths reach no allocation and no fd creation.
  compcntr_device* d = open_soft();
  compcntr_comp_cntr* c = counter(d);
  compcntr_comp_cntr* cs[32];
  std::uint64_t th[32];
  for (int i = 0; i < 32; ++i) {
    cs[i] = c;
    th[i] = ~0ull;
  }
  fault::no_points("inc/set/read/get_type/numa_node", [&] {
    compcntr_inc_comp_cntr(c, 1);
    compcntr_inc_err_comp_cntr(c, 1);
    compcntr_set_comp_cntr(c, 5);
    std::uint64_t v;
    compcntr_read_comp_cntr(c, &v);
    compcntr_read_err_comp_cntr(c, &v);
    compcntr_comp_cntr_type t;
    compcntr_comp_cntr_get_type(c, &t);
    compcntr_comp_cntr_numa_node(c);
  });
  fault::no_points("wait_comp_cntr (satisfied, test once, 2 ms timeout)", [&] {
    FCHECK(compcntr_wait_comp_cntr(c, 1, 0) == 0, "satisfied");
    FCHECK(compcntr_wait_comp_cntr(c, ~0ull, 0) == ETIMEDOUT, "test once");
    FCHECK(compcntr_wait_comp_cntr(c, ~0ull, 2) == ETIMEDOUT, "2 ms");
  });
  fault::no_points("poll_comp_cntrs (32 counters, test once)", [&] {
    std::size_t w;
    FCHECK(compcntr_poll_comp_cntrs(cs, th, 32, 0, &w) == ETIMEDOUT, "poll");
  });
  {
    compcntr_comp_cntr* two[2] = {counter(d), counter(d)};
    int i = 0;
    fault::no_points("destroy_comp_cntr", [&] { compcntr_destroy_comp_cntr(two[i++]); });
  }
  compcntr_destroy_comp_cntr(c);
  close_clean(d);
}

// ---- pollable fds and polls with per-call state ----

void family_fds() {
  compcntr_device* d = open_soft();
  fault::sweep(
      "comp_cntr_get_fd (first call: extension block + eventfd)", fault::all & ~fault::malloc_,
      [&](mode m, long k, unsigned kinds) -> attempt_result {
        compcntr_comp_cntr* c = counter(d);
        compcntr_inc_comp_cntr(c, 7);
        int fd = -5;
        fault::arm(m, k, kinds);
        const int r = compcntr_comp_cntr_get_fd(c, &fd);
        const long pts = fault::disarm();
        if (r != 0) {
          FCHECK(fault::one_of(r, {EMFILE, ENFILE, ENOMEM}), "get_fd = %d (%s)", r,
                 std::strerror(r));
          FCHECK(fd == -5, "*fd untouched on failure");
          FCHECK(value(c) == 7, "the counter is intact");
          FCHECK(compcntr_comp_cntr_arm_fd(c) == EINVAL, "no fd exists after a failed get_fd");
          FCHECK(compcntr_comp_cntr_get_fd(c, &fd) == 0, "get_fd works once the fault is gone");
        }
        FCHECK(fcntl(fd, F_GETFD) != -1, "a real fd");
        FCHECK(compcntr_comp_cntr_arm_fd(c) == 0 && compcntr_inc_comp_cntr(c, 1) == 0, "arm");
        pollfd p{fd, POLLIN, 0};
        FCHECK(poll(&p, 1, 1000) == 1, "the armed fd signals an update");
        FCHECK(compcntr_destroy_comp_cntr(c) == 0, "destroy");
        FCHECK(fcntl(fd, F_GETFD) == -1, "destroy closed the fd");
        return {pts, r != 0};
      });
  {
    compcntr_comp_cntr* c = counter(d);
    int fd;
    compcntr_comp_cntr_get_fd(c, &fd);
    fault::no_points("comp_cntr_arm_fd, comp_cntr_get_fd (again)", [&] {
      FCHECK(compcntr_comp_cntr_arm_fd(c) == 0, "arm");
      int again;
      FCHECK(compcntr_comp_cntr_get_fd(c, &again) == 0 && again == fd, "same fd");
    });
    compcntr_destroy_comp_cntr(c);
  }
  // More than 32 counters: the call's state is on the heap (ENOMEM, documented).
  std::vector<compcntr_comp_cntr*> cs;
  std::vector<std::uint64_t> th(40, 1);
  for (int i = 0; i < 40; ++i) cs.push_back(counter(d));
  for (int timeout : {0, 2}) {
    fault::sweep(
        timeout ? "poll_comp_cntrs (40 counters, 2 ms: sleeping registration)"
                : "poll_comp_cntrs (40 counters, test once)",
        fault::all & ~fault::malloc_, [&](mode m, long k, unsigned kinds) -> attempt_result {
          std::size_t which = 77;
          fault::arm(m, k, kinds);
          const int r = compcntr_poll_comp_cntrs(cs.data(), th.data(), cs.size(), timeout, &which);
          const long pts = fault::disarm();
          FCHECK(r == ETIMEDOUT || (r == ENOMEM && fault::failed() > 0), "poll = %d (%s)", r,
                 std::strerror(r));
          FCHECK(which == 77, "*which untouched");
          compcntr_inc_comp_cntr(cs[39], 1);
          FCHECK(compcntr_poll_comp_cntrs(cs.data(), th.data(), cs.size(), timeout, &which) == 0 &&
                     which == 39,
                 "poll works once the fault is gone");
          compcntr_set_comp_cntr(cs[39], 0);
          return {pts, r == ENOMEM};
        });
  }
  // A sleeping 3-counter poll registers on each counter's extension block; without memory it
  // polls in slices: the result is the same.
  fault::sweep("poll_comp_cntrs (3 counters, 2 ms: sleeping registration)",
               fault::all & ~fault::malloc_, [&](mode m, long k, unsigned kinds) -> attempt_result {
                 compcntr_comp_cntr* fresh[3] = {counter(d), counter(d), counter(d)};
                 std::uint64_t t3[3] = {1, 1, 1};
                 std::size_t which = 77;
                 fault::arm(m, k, kinds);
                 const int r = compcntr_poll_comp_cntrs(fresh, t3, 3, 2, &which);
                 const long pts = fault::disarm();
                 FCHECK(r == ETIMEDOUT, "poll = %d (%s): waiting has no failure mode", r,
                        std::strerror(r));
                 for (auto* c : fresh) compcntr_destroy_comp_cntr(c);
                 return {pts, false};
               });
  for (auto* c : cs) compcntr_destroy_comp_cntr(c);
  close_clean(d);
}

// ---- cmd_comp ----

std::uint64_t collect(compcntr_devx_cmd_comp* q, std::uint64_t* wr_id) {
  std::uint8_t buf[COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN];
  auto* h = reinterpret_cast<compcntr_devx_async_cmd_hdr*>(buf);
  const int r = compcntr_devx_get_async_cmd_comp(q, h, sizeof buf);  // blocking
  FCHECK(r == 0, "get_async_cmd_comp = %d", r);
  compcntr_comp_cntr_values v;
  std::memcpy(&v, buf + 8, sizeof v);
  *wr_id = h->wr_id;
  return v.comp;
}

void family_cmd_comp() {
  // On a fresh device the first cmd_comp starts the engine (thread, eventfd).
  for (bool fresh : {true, false}) {
    compcntr_device* keep = fresh ? nullptr : open_soft();
    compcntr_devx_cmd_comp* first = fresh ? nullptr : compcntr_devx_create_cmd_comp(keep);
    fault::sweep(fresh ? "devx_create_cmd_comp (first: starts the engine)"
                       : "devx_create_cmd_comp (engine running)",
                 fault::all & ~fault::malloc_,
                 [&](mode m, long k, unsigned kinds) -> attempt_result {
                   compcntr_device* d = fresh ? open_soft() : keep;
                   compcntr_comp_cntr* c = counter(d);
                   compcntr_inc_comp_cntr(c, 9);
                   fault::arm(m, k, kinds);
                   compcntr_devx_cmd_comp* q = compcntr_devx_create_cmd_comp(d);
                   const int e = errno;
                   const long pts = fault::disarm();
                   const bool refused = q == nullptr;
                   if (!q) {
                     FCHECK(fault::one_of(e, {ENOMEM, EMFILE, ENFILE}), "errno %d (%s)", e,
                            std::strerror(e));
                     q = compcntr_devx_create_cmd_comp(d);
                     FCHECK(q != nullptr, "create works once the fault is gone: %s",
                            compcntr_last_error_message());
                   }
                   if (q) {
                     FCHECK(compcntr_query_comp_cntr_async(c, 5, q) == 0, "query");
                     std::uint64_t wr = 0;
                     FCHECK(collect(q, &wr) == 9 && wr == 5, "answered");
                     compcntr_devx_destroy_cmd_comp(q);
                   }
                   compcntr_destroy_comp_cntr(c);
                   if (fresh) close_clean(d);
                   return {pts, refused};
                 });
    if (first) compcntr_devx_destroy_cmd_comp(first);
    if (keep) close_clean(keep);
  }
  compcntr_device* d = open_soft();
  compcntr_comp_cntr* c = counter(d);
  compcntr_devx_cmd_comp* q = compcntr_devx_create_cmd_comp(d);
  std::uint64_t next = 100;
  fault::sweep("query_comp_cntr_async", fault::all & ~fault::malloc_,
               [&](mode m, long k, unsigned kinds) -> attempt_result {
                 compcntr_set_comp_cntr(c, next);
                 fault::arm(m, k, kinds);
                 const int r = compcntr_query_comp_cntr_async(c, next, q);
                 const long pts = fault::disarm();
                 FCHECK(r == 0 || (fault::failed() > 0 && fault::one_of(r, {ENOMEM, EAGAIN})),
                        "query = %d (%s)", r, std::strerror(r));
                 if (r != 0) {
                   // Nothing was queued: the next answer is the next accepted query's.
                   FCHECK(compcntr_query_comp_cntr_async(c, next + 1, q) == 0,
                          "query works once the fault is gone");
                 }
                 std::uint64_t wr = 0;
                 collect(q, &wr);
                 FCHECK(wr == (r == 0 ? next : next + 1),
                        "the answer belongs to the accepted query (wr_id %llu)",
                        static_cast<unsigned long long>(wr));
                 next += 10;
                 return {pts, r != 0};
               });
  for (int i = 0; i < 2; ++i) {
    // A queued response popped with the shim counting (warm-up, then the counted call).
    FCHECK(compcntr_query_comp_cntr_async(c, 1, q) == 0, "query");
    pollfd p{q->fd, POLLIN, 0};
    FCHECK(poll(&p, 1, 5000) == 1, "answered");
    std::uint8_t buf[24];
    fault::arm(mode::count);
    FCHECK(compcntr_devx_get_async_cmd_comp(q, reinterpret_cast<compcntr_devx_async_cmd_hdr*>(buf),
                                            sizeof buf) == 0,
           "get");
    const long n = fault::disarm();
    FCHECK(i == 0 || n == 0, "get_async_cmd_comp reached %ld point(s)", n);
  }
  compcntr_devx_destroy_cmd_comp(q);
  compcntr_destroy_comp_cntr(c);
  close_clean(d);
}

// ---- credits ----

void family_credits() {
  compcntr_device* d = open_soft("5");
  compcntr_comp_cntr* held[2] = {counter(d), counter(d)}; // room for exactly 3 more
  fault::sweep("credits_create (3 peers, room for 3 counters)", fault::all & ~fault::malloc_,
               [&](mode m, long k, unsigned kinds) -> attempt_result {
                 fault::arm(m, k, kinds);
                 compcntr_credits* cr = compcntr_credits_create(d, 3, 4);
                 const int e = errno;
                 const long pts = fault::disarm();
                 const bool refused = cr == nullptr;
                 if (!cr) {
                   FCHECK(fault::failed() > 0 && e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
                   cr = compcntr_credits_create(d, 3, 4); // the room is still there
                   FCHECK(cr != nullptr, "credits_create once the fault is gone: %s",
                          compcntr_last_error_message());
                 }
                 if (cr) {
                   FCHECK(compcntr_credits_acquire(cr, 2, 4, 0) == 0 &&
                              compcntr_credits_acquire(cr, 2, 1, 0) == ETIMEDOUT,
                          "credits work");
                   compcntr_comp_cntr_init_attr a{};
                   FCHECK(compcntr_create_comp_cntr(d, &a) == nullptr && errno == ENOMEM,
                          "the pool is full");
                   FCHECK(compcntr_credits_destroy(cr) == 0, "destroy");
                 }
                 return {pts, refused};
               });
  fault::sweep("credits_create_per_peer (3 peers, room for 3 counters)",
               fault::all & ~fault::malloc_, [&](mode m, long k, unsigned kinds) -> attempt_result {
                 const std::uint64_t windows[3] = {1, 4, 2};
                 fault::arm(m, k, kinds);
                 compcntr_credits* cr = compcntr_credits_create_per_peer(d, 3, windows);
                 const int e = errno;
                 const long pts = fault::disarm();
                 const bool refused = cr == nullptr;
                 if (!cr) {
                   FCHECK(fault::failed() > 0 && e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
                   cr = compcntr_credits_create_per_peer(d, 3, windows);
                   FCHECK(cr != nullptr, "create_per_peer once the fault is gone: %s",
                          compcntr_last_error_message());
                 }
                 if (cr) {
                   std::uint64_t w = 0;
                   FCHECK(compcntr_credits_window(cr, 1, &w) == 0 && w == 4, "window of peer 1");
                   FCHECK(compcntr_credits_acquire(cr, 0, 1, 0) == 0 &&
                              compcntr_credits_acquire(cr, 0, 1, 0) == ETIMEDOUT,
                          "peer 0 has one credit");
                   compcntr_comp_cntr_init_attr a{};
                   FCHECK(compcntr_create_comp_cntr(d, &a) == nullptr && errno == ENOMEM,
                          "the pool is full");
                   FCHECK(compcntr_credits_destroy(cr) == 0, "destroy");
                 }
                 return {pts, refused};
               });
  {
    // Adopt the two held counters (with counts on them: issued starts there): a refused adopt
    // holds no reference (destroy of the counters is not EBUSY afterwards).
    compcntr_inc_comp_cntr(held[0], 3);
    compcntr_inc_err_comp_cntr(held[1], 1);
    fault::sweep(
        "credits_adopt (2 of the caller's counters)", fault::all & ~fault::malloc_,
        [&](mode m, long k, unsigned kinds) -> attempt_result {
          const std::uint64_t windows[2] = {2, 5};
          fault::arm(m, k, kinds);
          compcntr_credits* cr = compcntr_credits_adopt(d, held, 2, windows);
          const int e = errno;
          const long pts = fault::disarm();
          const bool refused = cr == nullptr;
          if (!cr) {
            FCHECK(fault::failed() > 0 && e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
            FCHECK(compcntr_comp_cntr_set_owner(held[0], "probe") == 0 &&
                       compcntr_comp_cntr_set_owner(held[0], nullptr) == 0,
                   "a refused adopt left no owner");
            cr = compcntr_credits_adopt(d, held, 2, windows);
            FCHECK(cr != nullptr, "adopt once the fault is gone: %s",
                   compcntr_last_error_message());
          }
          if (cr) {
            std::uint64_t o = 9;
            FCHECK(compcntr_credits_outstanding(cr, 0, &o) == 0 && o == 0,
                   "nothing outstanding at adopt");
            FCHECK(compcntr_credits_acquire(cr, 1, 5, 0) == 0 &&
                       compcntr_credits_release(cr, 1, 5) == 0,
                   "adopted credits work");
            FCHECK(compcntr_destroy_comp_cntr(held[0]) == EBUSY, "an adopted counter is EBUSY");
            FCHECK(compcntr_credits_destroy(cr) == 0, "destroy");
          }
          return {pts, refused};
        });
  }
  compcntr_credits* cr = compcntr_credits_create(d, 2, 8);
  compcntr_comp_cntr* pc = compcntr_credits_counter(cr, 1);
  fault::no_points("credits acquire/release/flush/outstanding/counter", [&] {
    std::uint64_t o;
    FCHECK(compcntr_credits_acquire(cr, 1, 3, 0) == 0, "acquire");
    FCHECK(compcntr_credits_release(cr, 1, 1) == 0, "release");
    FCHECK(compcntr_credits_outstanding(cr, 1, &o) == 0, "outstanding");
    compcntr_inc_comp_cntr(pc, 2);
    FCHECK(compcntr_credits_flush(cr, 1, 0) == 0, "flush");
    FCHECK(compcntr_destroy_comp_cntr(pc) == EBUSY, "tracker counters are EBUSY");
  });
  FCHECK(compcntr_credits_destroy(cr) == 0, "destroy");
  for (auto* c : held) compcntr_destroy_comp_cntr(c);
  close_clean(d);
}

// ---- completion tracker ----

#if COMPCNTR_FAULT_TRACKER
void family_tracker() {
  compcntr_device* d = open_soft();
  compcntr_comp_cntr* c = counter(d);
  compcntr_inc_comp_cntr(c, 3);
  fault::sweep(
      "tracker_create", fault::all & ~fault::malloc_,
      [&](mode m, long k, unsigned kinds) -> attempt_result {
        fault::arm(m, k, kinds);
        compcntr_tracker* t = compcntr_tracker_create(c);
        const int e = errno;
        const long pts = fault::disarm();
        const bool refused = t == nullptr;
        if (!t) {
          FCHECK(fault::failed() > 0 && e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
          // Nothing changed: the counter is not held (nor its values moved) ...
          compcntr_comp_cntr* probe = counter(d);
          FCHECK(compcntr_destroy_comp_cntr(probe) == 0, "destroy");
          FCHECK(value(c) == 3, "the counter is untouched");
          t = compcntr_tracker_create(c); // ... and a tracker can be made once the fault is gone
          FCHECK(t != nullptr, "tracker_create once the fault is gone: %s",
                 compcntr_last_error_message());
        }
        if (t) {
          FCHECK(compcntr_destroy_comp_cntr(c) == EBUSY, "the tracker holds its counter");
          FCHECK(compcntr_tracker_issue(t, 2) == 0 && compcntr_tracker_quiet(t, 0) == ETIMEDOUT,
                 "issue, quiet");
          FCHECK(compcntr_tracker_destroy(t) == 0, "destroy");
        }
        return {pts, refused};
      });
  compcntr_tracker* t = compcntr_tracker_create(c);
  fault::no_points("tracker issue/issued/completed/quiet", [&] {
    compcntr_tracker_issue(t, 1);
    compcntr_tracker_issued(t);
    compcntr_tracker_completed(t);
    compcntr_inc_comp_cntr(c, 1);
    FCHECK(compcntr_tracker_quiet(t, 0) == 0, "quiet");
    FCHECK(compcntr_tracker_quiet(t, 2) == 0, "quiet with a timeout");
  });
  FCHECK(compcntr_tracker_destroy(t) == 0, "destroy");
  FCHECK(compcntr_destroy_comp_cntr(c) == 0, "destroy the counter after its tracker");
  close_clean(d);
}
#endif

// ---- QPs and MRs ----

struct pair {
  compcntr_qp *a, *b;
  compcntr_comp_cntr *send, *recv;
};

pair make_pair(compcntr_device* d) {
  pair p{compcntr_create_qp(d), compcntr_create_qp(d), counter(d), counter(d)};
  FCHECK(p.a && p.b, "create_qp without faults");
  compcntr_qp_attach_comp_cntr_attr at{0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND};
  FCHECK(compcntr_qp_attach_comp_cntr(p.a, p.send, &at) == 0, "attach");
  at.op_mask = COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RECV;
  FCHECK(compcntr_qp_attach_comp_cntr(p.b, p.recv, &at) == 0, "attach");
  FCHECK(compcntr_modify_qp(p.a, COMPCNTR_QPS_INIT) == 0 &&
             compcntr_modify_qp(p.b, COMPCNTR_QPS_INIT) == 0,
         "INIT");
  FCHECK(compcntr_connect_qp(p.a, p.b) == 0, "connect");
  return p;
}

void drop_pair(pair& p) {
  FCHECK(compcntr_destroy_qp(p.a) == 0 && compcntr_destroy_qp(p.b) == 0, "destroy_qp");
  FCHECK(compcntr_destroy_comp_cntr(p.send) == 0 && compcntr_destroy_comp_cntr(p.recv) == 0,
         "destroy");
}

void family_qp() {
  compcntr_device* d = open_soft();
  char src[64] = "payload", dst[64] = {};
  compcntr_mr* smr = compcntr_reg_mr(d, src, sizeof src, 0);
  compcntr_mr* dmr = compcntr_reg_mr(d, dst, sizeof dst, COMPCNTR_ACCESS_LOCAL_WRITE);
  fault::sweep("create_qp", fault::all & ~fault::malloc_,
               [&](mode m, long k, unsigned kinds) -> attempt_result {
                 fault::arm(m, k, kinds);
                 compcntr_qp* q = compcntr_create_qp(d);
                 const int e = errno;
                 const long pts = fault::disarm();
                 const bool refused = q == nullptr;
                 if (!q) {
                   FCHECK(fault::failed() > 0 && e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
                   q = compcntr_create_qp(d);
                 }
                 FCHECK(q && compcntr_qp_state(q) == COMPCNTR_QPS_RESET &&
                            compcntr_modify_qp(q, COMPCNTR_QPS_INIT) == 0,
                        "a QP works once the fault is gone");
                 if (q) compcntr_destroy_qp(q);
                 return {pts, refused};
               });
  fault::sweep("reg_mr", fault::all & ~fault::malloc_,
               [&](mode m, long k, unsigned kinds) -> attempt_result {
                 fault::arm(m, k, kinds);
                 compcntr_mr* mr = compcntr_reg_mr(d, dst, 8, COMPCNTR_ACCESS_LOCAL_WRITE);
                 const int e = errno;
                 const long pts = fault::disarm();
                 const bool refused = mr == nullptr;
                 if (!mr) {
                   FCHECK(fault::failed() > 0 && e == ENOMEM, "errno %d (%s)", e, std::strerror(e));
                   mr = compcntr_reg_mr(d, dst, 8, COMPCNTR_ACCESS_LOCAL_WRITE);
                 }
                 FCHECK(mr && mr->lkey != 0, "reg_mr works once the fault is gone");
                 if (mr) compcntr_dereg_mr(mr);
                 return {pts, refused};
               });
  fault::sweep("connect_qp", fault::all & ~fault::malloc_,
               [&](mode m, long k, unsigned kinds) -> attempt_result {
                 compcntr_qp *a = compcntr_create_qp(d), *b = compcntr_create_qp(d);
                 compcntr_modify_qp(a, COMPCNTR_QPS_INIT);
                 compcntr_modify_qp(b, COMPCNTR_QPS_INIT);
                 fault::arm(m, k, kinds);
                 const int r = compcntr_connect_qp(a, b);
                 const long pts = fault::disarm();
                 if (r != 0) {
                   FCHECK(r == ENOMEM, "connect = %d (%s)", r, std::strerror(r));
                   FCHECK(compcntr_qp_state(a) == COMPCNTR_QPS_INIT &&
                              compcntr_qp_state(b) == COMPCNTR_QPS_INIT,
                          "both stay INIT");
                   FCHECK(compcntr_connect_qp(a, b) == 0, "connect once the fault is gone");
                 }
                 FCHECK(compcntr_qp_state(a) == COMPCNTR_QPS_RTS, "RTS");
                 compcntr_destroy_qp(a);
                 compcntr_destroy_qp(b);
                 return {pts, r != 0};
               });
  fault::sweep("qp_attach_comp_cntr", fault::all & ~fault::malloc_,
               [&](mode m, long k, unsigned kinds) -> attempt_result {
                 compcntr_qp* q = compcntr_create_qp(d);
                 compcntr_comp_cntr* c = counter(d);
                 compcntr_qp_attach_comp_cntr_attr at{0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND};
                 fault::arm(m, k, kinds);
                 const int r = compcntr_qp_attach_comp_cntr(q, c, &at);
                 const long pts = fault::disarm();
                 if (r != 0) {
                   FCHECK(r == ENOMEM, "attach = %d (%s)", r, std::strerror(r));
                   FCHECK(compcntr_qp_attach_comp_cntr(q, c, &at) == 0,
                          "nothing was attached: attach again works");
                 }
                 FCHECK(compcntr_destroy_comp_cntr(c) == EBUSY, "attached now");
                 compcntr_destroy_qp(q);
                 FCHECK(compcntr_destroy_comp_cntr(c) == 0, "destroy after the QP");
                 return {pts, r != 0};
               });
  // Posts that queue (nothing to match yet) allocate queue space now and then (a deque grows
  // by blocks): `before` posts are queued first so that the swept post is one that allocates.
  for (bool recv_first : {true, false}) {
    char many[64][64];
    compcntr_mr* mmr = compcntr_reg_mr(d, many, sizeof many, COMPCNTR_ACCESS_LOCAL_WRITE);
    auto post = [&](pair& p, int i) {
      return recv_first
                 ? compcntr_post_recv(p.b, static_cast<std::uint64_t>(i), many[i], 64, mmr->lkey)
                 : compcntr_post_send(p.a, static_cast<std::uint64_t>(i), src, 8, smr->lkey);
    };
    int before = -1; // the first queue length at which one more post allocates
    for (int b = 0; b < 63 && before < 0; ++b) {
      pair p = make_pair(d);
      for (int i = 0; i < b; ++i) post(p, i);
      fault::arm(mode::count, 0, fault::all & ~fault::malloc_);
      post(p, b);
      if (fault::disarm() > 0) before = b;
      drop_pair(p);
    }
    FCHECK(before >= 0, "no queued post allocates within 63 posts");
    if (before < 0) before = 0;
    fault::sweep(
        recv_first ? "post_recv (queued, the queue grows)" : "post_send (queued, the queue grows)",
        fault::all & ~fault::malloc_, [&](mode m, long k, unsigned kinds) -> attempt_result {
          pair p = make_pair(d);
          for (int i = 0; i < before; ++i) post(p, i);
          fault::arm(m, k, kinds);
          const int r = post(p, before);
          const long pts = fault::disarm();
          if (r != 0) {
            FCHECK(r == ENOMEM, "post = %d (%s)", r, std::strerror(r));
            FCHECK(value(p.send) == 0 && value(p.recv) == 0, "no completion");
            FCHECK(compcntr_qp_state(p.a) == COMPCNTR_QPS_RTS &&
                       compcntr_qp_state(p.b) == COMPCNTR_QPS_RTS,
                   "both stay RTS");
            FCHECK(post(p, before) == 0, "the post works once the fault is gone");
          }
          // Match everything queued: exactly before + 1 messages move.
          for (int i = 0; i <= before; ++i)
            FCHECK((recv_first ? compcntr_post_send(p.a, 100, src, 8, smr->lkey)
                               : compcntr_post_recv(p.b, 100, many[i], 64, mmr->lkey)) == 0,
                   "the matching post");
          const auto n = static_cast<std::uint64_t>(before + 1);
          FCHECK(value(p.send) == n && value(p.recv) == n,
                 "exactly %llu messages moved (%llu/%llu)", static_cast<unsigned long long>(n),
                 static_cast<unsigned long long>(value(p.send)),
                 static_cast<unsigned long long>(value(p.recv)));
          FCHECK(std::memcmp(many[before], "payload", 8) == 0, "the last message's bytes");
          std::memset(many, 0, sizeof many);
          drop_pair(p);
          return {pts, r != 0};
        });
    compcntr_dereg_mr(mmr);
  }
  {
    pair p = make_pair(d);
    fault::no_points("post_send matched, post_rdma_write, modify_qp(ERR), destroy_qp", [&] {
      compcntr_post_recv(p.b, 1, dst, sizeof dst, dmr->lkey); // queued during the warm-up only
      compcntr_post_send(p.a, 2, src, 8, smr->lkey);
    });
    drop_pair(p);
  }
  compcntr_dereg_mr(smr);
  compcntr_dereg_mr(dmr);
  close_clean(d);
}

// ---- low RLIMIT_NOFILE ----

void family_rlimit() {
  fault::current() = "RLIMIT_NOFILE at the current fd count";
  compcntr_device* d = open_soft();
  compcntr_comp_cntr* c = counter(d);
  // The device's engine thread starts now, with fds to spare: under ASan, starting a thread
  // with none left aborts in the sanitizer itself (pthread_getattr_np reads /proc/self/maps),
  // and UBSan's first vptr check of a class opens a pipe. What fails below is the cmd_comp's
  // own eventfd. One query answered proves the thread has run (its first checks included)
  // before the limit drops: creating the cmd_comp only starts it (a CI run lost that race).
  {
    compcntr_devx_cmd_comp* wq = compcntr_devx_create_cmd_comp(d);
    FCHECK(wq != nullptr, "create_cmd_comp with fds to spare");
    if (wq) {
      std::uint64_t id = 0;
      FCHECK(compcntr_query_comp_cntr_async(c, 7, wq) == 0, "query_comp_cntr_async");
      FCHECK(collect(wq, &id) == 0 && id == 7, "the engine answered");
      compcntr_devx_destroy_cmd_comp(wq);
    }
  }
#if COMPCNTR_FAULT_FABRIC
  // The adapter's classes once with fds to spare (the sanitizers' first checks of a class).
  fi_cntr_attr fa{};
  fa.events = FI_CNTR_EVENTS_COMP;
  fa.wait_obj = FI_WAIT_FD;
  fid_cntr* warm = nullptr;
  FCHECK(compcntr_fi_cntr_open(d, &fa, &warm, nullptr) == 0, "adapter FI_WAIT_FD with fds");
  if (warm) fi_close(&warm->fid);
#endif
  rlimit old{};
  getrlimit(RLIMIT_NOFILE, &old);
  int lowest_free = 0;
  while (fcntl(lowest_free, F_GETFD) != -1) ++lowest_free;
  rlimit low = old;
  low.rlim_cur =
      static_cast<rlim_t>(lowest_free); // a new fd gets the lowest free number: none left
  FCHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "setrlimit");
  int fd = -1;
  int r = compcntr_comp_cntr_get_fd(c, &fd);
  FCHECK(r == EMFILE, "get_fd = %d (%s), documented EMFILE", r, std::strerror(r));
  FCHECK(compcntr_comp_cntr_arm_fd(c) == EINVAL, "no fd after the failure");
  compcntr_devx_cmd_comp* q = compcntr_devx_create_cmd_comp(d);
  const int e = errno;
  FCHECK(q == nullptr && e == EMFILE, "create_cmd_comp: %p errno %d (%s)", static_cast<void*>(q), e,
         std::strerror(e));
  FCHECK(compcntr_comp_cntr_arm_fd_threshold(c, 1) == EINVAL, "no fd to arm for a threshold");
  {
    // A striped counter needs no fd.
    compcntr_comp_cntr_init_attr sa{};
    sa.comp_mask = COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES;
    sa.stripes = COMPCNTR_COMP_CNTR_STRIPES_PER_CPU;
    compcntr_comp_cntr* sc = compcntr_create_comp_cntr(d, &sa);
    FCHECK(sc != nullptr, "a striped counter without fds: %s", compcntr_last_error_message());
    if (sc) {
      FCHECK(compcntr_inc_comp_cntr(sc, 4) == 0 && value(sc) == 4, "it counts");
      FCHECK(compcntr_comp_cntr_get_fd(sc, &fd) == EMFILE, "its fd is EMFILE");
      FCHECK(compcntr_destroy_comp_cntr(sc) == 0, "destroy");
    }
  }
#if COMPCNTR_FAULT_FABRIC
  {
    // The adapter: FI_WAIT_FD needs the counter's eventfd (-FI_EMFILE, *cntr untouched);
    // FI_WAIT_UNSPEC does not.
    fid_cntr* cn = reinterpret_cast<fid_cntr*>(0x1);
    const int ra = compcntr_fi_cntr_open(d, &fa, &cn, nullptr);
    FCHECK(ra == -FI_EMFILE && cn == reinterpret_cast<fid_cntr*>(0x1),
           "adapter FI_WAIT_FD without fds = %d (%s)", ra, fi_strerror(-ra));
    fi_cntr_attr ua = fa;
    ua.wait_obj = FI_WAIT_UNSPEC;
    cn = nullptr;
    const int ru = compcntr_fi_cntr_open(d, &ua, &cn, nullptr);
    FCHECK(ru == 0, "adapter FI_WAIT_UNSPEC without fds = %d (%s)", ru, fi_strerror(-ru));
    if (cn) {
      FCHECK(fi_cntr_add(cn, 1) == 0 && fi_cntr_read(cn) == 1, "it counts");
      FCHECK(fi_close(&cn->fid) == 0, "fi_close");
    }
  }
#endif
  // A device opened without fds (hwloc cannot read sysfs either). Not under the sanitizers:
  // UBSan's vptr check of a new object and ASan's report path need fds themselves (a pipe,
  // /proc/self/maps) and abort in the runtime; the normal build runs it.
  if (!FAULT_LSAN) {
    compcntr_device* d2 = compcntr_open_device("soft");
    FCHECK(d2 != nullptr || errno == ENOMEM || errno == EMFILE, "open_device without fds: %s",
           compcntr_last_error_message());
    if (d2) {
      counter_works(d2);
      close_clean(d2);
    }
  }
  FCHECK(compcntr_inc_comp_cntr(c, 2) == 0 && value(c) == 2, "counters do not need fds");
  FCHECK(setrlimit(RLIMIT_NOFILE, &old) == 0, "setrlimit");
  FCHECK(compcntr_comp_cntr_get_fd(c, &fd) == 0, "get_fd with fds back");
  q = compcntr_devx_create_cmd_comp(d);
  FCHECK(q != nullptr, "create_cmd_comp with fds back");
  if (q) compcntr_devx_destroy_cmd_comp(q);
#if COMPCNTR_FAULT_FABRIC
  fid_cntr* back = nullptr;
  FCHECK(compcntr_fi_cntr_open(d, &fa, &back, nullptr) == 0, "adapter FI_WAIT_FD with fds back");
  if (back) fi_close(&back->fid);
#endif
  compcntr_destroy_comp_cntr(c);
  close_clean(d);
  fault::tally().scenarios += 1;
}

// ---- libfabric adapter and bridge ----

#if COMPCNTR_FAULT_FABRIC
void family_fabric() {
  compcntr_device* d = open_soft();
  for (fi_wait_obj w : {FI_WAIT_UNSPEC, FI_WAIT_FD}) {
    fault::sweep(w == FI_WAIT_FD ? "compcntr_fi_cntr_open (FI_WAIT_FD)"
                                 : "compcntr_fi_cntr_open (FI_WAIT_UNSPEC)",
                 fault::all & ~fault::malloc_,
                 [&](mode m, long k, unsigned kinds) -> attempt_result {
                   fi_cntr_attr attr{};
                   attr.events = FI_CNTR_EVENTS_COMP;
                   attr.wait_obj = w;
                   fid_cntr* cn = reinterpret_cast<fid_cntr*>(0x1);
                   fault::arm(m, k, kinds);
                   const int r = compcntr_fi_cntr_open(d, &attr, &cn, nullptr);
                   const long pts = fault::disarm();
                   if (r != 0) {
                     FCHECK(fault::one_of(-r, {FI_ENOMEM, FI_EMFILE, ENFILE}),
                            "fi_cntr_open = %d (%s)", r, fi_strerror(-r));
                     FCHECK(cn == reinterpret_cast<fid_cntr*>(0x1), "*cntr not written on error");
                     FCHECK(compcntr_fi_cntr_open(d, &attr, &cn, nullptr) == 0,
                            "works once the fault is gone");
                   }
                   FCHECK(fi_cntr_add(cn, 2) == 0 && fi_cntr_read(cn) == 2, "the adapter counts");
                   FCHECK(fi_close(&cn->fid) == 0, "fi_close");
                   return {pts, r != 0};
                 });
  }
  // A bridge needs a real CQ: the udp provider's (no endpoint needed to open one).
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG;
  hints->fabric_attr->prov_name = strdup("udp;ofi_rxd");
  fi_info* info = nullptr;
  fid_fabric* fab = nullptr;
  fid_domain* dom = nullptr;
  fid_cq* cq = nullptr;
  fi_cq_attr cqa{};
  cqa.format = FI_CQ_FORMAT_DATA;
  cqa.size = 64;
  if (fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &info) == 0 &&
      fi_fabric(info->fabric_attr, &fab, nullptr) == 0 &&
      fi_domain(fab, info, &dom, nullptr) == 0 && fi_cq_open(dom, &cqa, &cq, nullptr) == 0) {
    compcntr_comp_cntr* c = counter(d);
    fault::sweep("compcntr_fi_bridge_open + bind + progress + close", fault::all & ~fault::malloc_,
                 [&](mode m, long k, unsigned kinds) -> attempt_result {
                   fault::arm(m, k, kinds);
                   compcntr_fi_bridge* br = compcntr_fi_bridge_open(cq);
                   const int e = br ? 0 : errno;
                   int b = br ? compcntr_fi_bridge_bind(br, c, FI_RECV) : 0;
                   const ssize_t pr = br ? compcntr_fi_bridge_progress(br) : 0;
                   const long pts = fault::disarm();
                   if (!br) {
                     FCHECK(e == ENOMEM, "bridge_open errno %d (%s)", e, std::strerror(e));
                     br = compcntr_fi_bridge_open(cq);
                     FCHECK(br != nullptr, "bridge_open once the fault is gone");
                   }
                   if (b != 0) {
                     FCHECK(b == ENOMEM, "bridge_bind = %d (%s)", b, std::strerror(b));
                     b = compcntr_fi_bridge_bind(br, c, FI_RECV);
                   }
                   FCHECK(b == 0, "bind works once the fault is gone");
                   FCHECK(pr == 0 || pr == -FI_EAGAIN, "progress on an empty CQ = %zd", pr);
                   FCHECK(compcntr_fi_bridge_close(br) == 0, "bridge_close");
                   return {pts, e == ENOMEM || b != 0};
                 });
    compcntr_destroy_comp_cntr(c);
  } else {
    std::printf("fault:   bridge scenarios skipped: no udp;ofi_rxd CQ here\n");
  }
  // The provider-counter mirror over a real provider counter (udp;ofi_rxd's util counter).
  fid_cntr* pc = nullptr;
  fi_cntr_attr pca{};
  pca.events = FI_CNTR_EVENTS_COMP;
  pca.wait_obj = FI_WAIT_NONE;
  if (dom && fi_cntr_open(dom, &pca, &pc, nullptr) == 0) {
    compcntr_comp_cntr* c = counter(d);
    for (bool ex : {false, true})
      fault::sweep(
          ex ? "compcntr_fi_mirror_open_ex + progress + close"
             : "compcntr_fi_mirror_open + progress + close",
          fault::all & ~fault::malloc_, [&](mode m, long k, unsigned kinds) -> attempt_result {
            const std::uint64_t before = value(c);
            FCHECK(fi_cntr_add(pc, 5) == 0, "provider fi_cntr_add"); // before open: the baseline
            compcntr_fi_mirror_attr ma{};
            ma.comp_mask = COMPCNTR_FI_MIRROR_ATTR_VALUE_BITS;
            ma.value_bits = 64;
            fault::arm(m, k, kinds);
            compcntr_fi_mirror* mi =
                ex ? compcntr_fi_mirror_open_ex(pc, c, &ma) : compcntr_fi_mirror_open(pc, c);
            const int e = mi ? 0 : errno;
            const int pr = mi ? compcntr_fi_mirror_progress(mi) : 0;
            const long pts = fault::disarm();
            FCHECK(value(c) == before, "open + progress add nothing the provider had at open");
            if (!mi) {
              FCHECK(e == ENOMEM, "mirror_open errno %d (%s), documented: ENOMEM", e,
                     std::strerror(e));
              FCHECK(compcntr_fi_last_error()[0] != '\0', "a message names the cause");
              mi = ex ? compcntr_fi_mirror_open_ex(pc, c, &ma) : compcntr_fi_mirror_open(pc, c);
              FCHECK(mi != nullptr, "mirror_open once the fault is gone");
              if (!mi) return {pts, true};
            }
            FCHECK(pr == 0, "mirror_progress = %d", pr);
            FCHECK(fi_cntr_add(pc, 3) == 0 && compcntr_fi_mirror_progress(mi) == 0 &&
                       value(c) == before + 3,
                   "the mirror carries the provider's gain (value %llu, expected %llu)",
                   static_cast<unsigned long long>(value(c)),
                   static_cast<unsigned long long>(before + 3));
            FCHECK(compcntr_fi_mirror_close(mi) == 0, "mirror_close");
            return {pts, e != 0};
          });
    compcntr_fi_mirror* mi = compcntr_fi_mirror_open(pc, c);
    FCHECK(mi != nullptr, "mirror_open");
    if (mi) {
      fault::no_points("compcntr_fi_mirror_progress (nothing new, a gain)", [&] {
        FCHECK(compcntr_fi_mirror_progress(mi) == 0, "progress");
        FCHECK(fi_cntr_add(pc, 1) == 0 && compcntr_fi_mirror_progress(mi) == 0,
               "progress after a gain");
      });
      compcntr_fi_mirror_close(mi);
    }
    fi_close(&pc->fid);
    compcntr_destroy_comp_cntr(c);
  } else {
    std::printf("fault:   mirror scenarios skipped: no udp;ofi_rxd counter here\n");
  }
  if (cq) fi_close(&cq->fid);
  if (dom) fi_close(&dom->fid);
  if (fab) fi_close(&fab->fid);
  if (info) fi_freeinfo(info);
  fi_freeinfo(hints);
  close_clean(d);
}
#endif

#ifdef COMPCNTR_FAULT_HOOK_DIR
// ---- the hook provider (FI_HOOK=compcntr): libfabric loads libcompcntr-fi.so in this child ----
// Its allocations are the program's operator new (interposed as for the library), its fds
// eventfd/epoll_create1 (and the provider's own: the fd kind fails those too). Documented
// behaviour (docs/hook.md): an object the hook cannot serve is left to the provider (unhooked,
// still working), or the call fails with the errno that stopped it; never a crash or a leak.
void family_hook() {
  setenv("FI_PROVIDER_PATH", COMPCNTR_FAULT_HOOK_DIR, 1);
  setenv("FI_HOOK", "compcntr", 1);
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG;
  hints->fabric_attr->prov_name = strdup("udp;ofi_rxd");
  fi_info* info = nullptr;
  fid_fabric* fab = nullptr;
  if (fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &info) != 0 ||
      fi_fabric(info->fabric_attr, &fab, nullptr) != 0) {
    std::printf("fault:   hook scenarios skipped: no udp;ofi_rxd fabric here\n");
    if (info) fi_freeinfo(info);
    fi_freeinfo(hints);
    return;
  }
  // A counter opened on `dom` works (hooked or the provider's own) and closes.
  auto cntr_works = [&](fid_domain* dom, fi_wait_obj w, bool want_hooked) {
    fi_cntr_attr a{};
    a.events = FI_CNTR_EVENTS_COMP;
    a.wait_obj = w;
    fid_cntr* cn = nullptr;
    const int r = fi_cntr_open(dom, &a, &cn, nullptr);
    FCHECK(r == 0, "fi_cntr_open without faults = %d (%s)", r, fi_strerror(-r));
    if (r != 0) return;
    if (want_hooked)
      FCHECK(compcntr_fi_cntr_comp_cntr(cn) != nullptr, "the hook serves the counter");
    FCHECK(fi_cntr_add(cn, 2) == 0 && fi_cntr_read(cn) == 2, "a counter counts");
    FCHECK(fi_close(&cn->fid) == 0, "fi_close of the counter");
  };
  fault::sweep("fi_domain under the hook", fault::all & ~fault::malloc_,
               [&](mode m, long k, unsigned kinds) -> attempt_result {
                 fid_domain* dom = reinterpret_cast<fid_domain*>(0x1);
                 fault::arm(m, k, kinds);
                 const int r = fi_domain(fab, info, &dom, nullptr);
                 const long pts = fault::disarm();
                 if (r != 0) {
                   FCHECK(fault::one_of(-r, {FI_ENOMEM, FI_EMFILE, ENFILE}), "fi_domain = %d (%s)",
                          r, fi_strerror(-r));
                   FCHECK(fi_domain(fab, info, &dom, nullptr) == 0,
                          "fi_domain once the fault is gone");
                 }
                 // A domain the hook could not wrap is the provider's: its counters are the
                 // provider's then, so only the counting is asked of it.
                 cntr_works(dom, FI_WAIT_UNSPEC, r != 0 || fault::failed() == 0);
                 FCHECK(fi_close(&dom->fid) == 0, "fi_close of the domain");
                 return {pts, r != 0};
               });
  fid_domain* dom = nullptr;
  if (fi_domain(fab, info, &dom, nullptr) == 0) {
    cntr_works(dom, FI_WAIT_UNSPEC, true);
    for (fi_wait_obj w : {FI_WAIT_UNSPEC, FI_WAIT_FD, FI_WAIT_NONE}) {
      const char* name = w == FI_WAIT_FD     ? "fi_cntr_open under the hook (FI_WAIT_FD)"
                         : w == FI_WAIT_NONE ? "fi_cntr_open under the hook (FI_WAIT_NONE)"
                                             : "fi_cntr_open under the hook (FI_WAIT_UNSPEC)";
      fault::sweep(name, fault::all & ~fault::malloc_,
                   [&](mode m, long k, unsigned kinds) -> attempt_result {
                     fi_cntr_attr a{};
                     a.events = FI_CNTR_EVENTS_COMP;
                     a.wait_obj = w;
                     fid_cntr* cn = reinterpret_cast<fid_cntr*>(0x1);
                     fault::arm(m, k, kinds);
                     const int r = fi_cntr_open(dom, &a, &cn, nullptr);
                     const long pts = fault::disarm();
                     if (r != 0) {
                       FCHECK(fault::one_of(-r, {FI_ENOMEM, FI_EMFILE, ENFILE}),
                              "fi_cntr_open = %d (%s)", r, fi_strerror(-r));
                       FCHECK(cn == reinterpret_cast<fid_cntr*>(0x1), "*cntr not written on error");
                       const int r2 = fi_cntr_open(dom, &a, &cn, nullptr);
                       FCHECK(r2 == 0, "fi_cntr_open once the fault is gone = %d", r2);
                       if (r2 != 0) return {pts, true};
                       FCHECK(compcntr_fi_cntr_comp_cntr(cn) != nullptr,
                              "hooked again once the fault is gone");
                     }
                     // Hooked, or left to the provider: it counts, waits and closes either way.
                     FCHECK(fi_cntr_add(cn, 2) == 0 && fi_cntr_read(cn) == 2, "the counter counts");
                     if (w != FI_WAIT_NONE)
                       FCHECK(fi_cntr_wait(cn, 2, 0) == 0, "fi_cntr_wait at the threshold");
                     FCHECK(fi_close(&cn->fid) == 0, "fi_close");
                     return {pts, r != 0};
                   });
    }
    cntr_works(dom, FI_WAIT_UNSPEC, true); // nothing a fault did stays behind
    fi_close(&dom->fid);
  } else {
    FCHECK(false, "fi_domain under the hook without faults");
  }
  fi_close(&fab->fid);
  fi_freeinfo(info);
  fi_freeinfo(hints);
}
#endif

void check_family(const char* name, void (*fn)()) {
  const fault::totals t = fault::run_family(name, fn);
  add(t);
  std::printf("fault: family %s: %ld scenarios, %ld injection points, %ld runs with a fault, %ld "
              "failures\n",
              name, t.scenarios, t.points, t.runs, t.failures);
  std::fflush(stdout);
  CHECK_MESSAGE(t.failures == 0, name << ": " << t.failures << " failure(s), see the log");
}

} // namespace

TEST_CASE("fault: device open (allocation, fd, hwloc; malloc without ASan)") {
  check_family("device", family_device);
}
TEST_CASE("fault: counters and arena growth") { check_family("counters", family_counters); }
TEST_CASE("fault: pollable fds and polls") { check_family("fds", family_fds); }
TEST_CASE("fault: cmd_comp") { check_family("cmd_comp", family_cmd_comp); }
TEST_CASE("fault: credits") { check_family("credits", family_credits); }
#if COMPCNTR_FAULT_TRACKER
TEST_CASE("fault: completion tracker") { check_family("tracker", family_tracker); }
#endif
TEST_CASE("fault: QPs and MRs") { check_family("qp", family_qp); }
TEST_CASE("fault: low RLIMIT_NOFILE") { check_family("rlimit", family_rlimit); }
#if COMPCNTR_FAULT_FABRIC
TEST_CASE("fault: libfabric adapter, bridge and mirror") { check_family("fabric", family_fabric); }
#endif
#ifdef COMPCNTR_FAULT_HOOK_DIR
TEST_CASE("fault: the hook provider (FI_HOOK=compcntr)") { check_family("hook", family_hook); }
#endif
TEST_CASE("fault: totals") {
  std::printf(
      "fault: %ld scenarios, %ld injection points, %ld runs with a fault (%ld refused with a "
      "documented errno, %ld absorbed), up to %ld distinct call sites per family, %ld hwloc "
      "aborts (malloc sweeps), %ld failures\n",
      grand.scenarios, grand.points, grand.runs, grand.refused, grand.absorbed, grand.sites,
      grand.hwloc_aborts, grand.failures);
  CHECK(grand.failures == 0);
}
