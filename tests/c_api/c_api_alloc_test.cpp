// Regression tests of issue 15's defects 1 and 2, which need allocation failures: linked with
// the fault shim (tests/fault/shim.cpp). Each point runs in a forked child, so the defect (a
// std::terminate) is reported as a failed check rather than killing the suite.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

#include "shim.hpp"

namespace {

// Runs f in a child; the child's exit status (a signal counts as 128 + signal).
template <class F>
int in_child(F f) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) _exit(f());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

long count_points(void (*call)(compcntr_device*), compcntr_device* d) {
  call(d);  // warm-up
  fault::arm(fault::mode::count, 0, fault::alloc);
  call(d);
  return fault::disarm();
}

} // namespace

// Defect 1: an allocation failing inside the software QP's construction (its two queues)
// escaped a noexcept constructor as std::bad_alloc: std::terminate.
TEST_CASE("defect 1: create_qp under allocation failure is NULL + ENOMEM, never std::terminate") {
  compcntr_device* d = compcntr_open_device("soft");
  REQUIRE(d != nullptr);
  const long n =
      count_points([](compcntr_device* dev) { compcntr_destroy_qp(compcntr_create_qp(dev)); }, d);
  REQUIRE(n >= 3);  // the C wrapper, the QP, its queues
  for (long k = 1; k <= n; ++k)
    for (fault::mode m : {fault::mode::once, fault::mode::from}) {
      CAPTURE(k);
      CAPTURE(m == fault::mode::once);
      const int status = in_child([&] {
        fault::arm(m, k, fault::alloc);
        compcntr_qp* q = compcntr_create_qp(d);
        const int e = errno;
        fault::disarm();
        if (q) return compcntr_destroy_qp(q) == 0 ? 0 : 2;
        if (e != ENOMEM) return 3;
        // Nothing changed: no device reference left behind, and the next create works.
        compcntr_qp* again = compcntr_create_qp(d);
        if (!again || compcntr_destroy_qp(again) != 0) return 4;
        return compcntr_close_device(d) == 0 ? 0 : 5;
      });
      CHECK(status == 0);  // 134: SIGABRT (std::terminate); 5: a leaked device reference
    }
  CHECK(compcntr_close_device(d) == 0);
}

// Defect 2: a late allocation failure while opening (the pool's per-node tables) left a device
// with max_counters 0 whose every create was ENOMEM: the open must fail with ENOMEM instead.
TEST_CASE(
    "defect 2: open_device under allocation failure fails with ENOMEM or gives a working device") {
  const long n = [] {
    compcntr_close_device(compcntr_open_device("soft"));
    fault::arm(fault::mode::count, 0, fault::alloc);
    compcntr_device* d = compcntr_open_device("soft");
    const long pts = fault::disarm();
    compcntr_close_device(d);
    return pts;
  }();
  REQUIRE(n >= 4);
  int zero_capacity = 0;
  for (long k = 1; k <= n; ++k)
    for (fault::mode m : {fault::mode::once, fault::mode::from}) {
      CAPTURE(k);
      fault::arm(m, k, fault::alloc);
      compcntr_device* d = compcntr_open_device("soft");
      const int e = errno;
      fault::disarm();
      if (!d) {
        CHECK(e == ENOMEM);
        continue;
      }
      compcntr_comp_cntr_caps caps{};
      CHECK(compcntr_query_comp_cntr_caps(d, &caps) == 0);
      zero_capacity += caps.max_counters == 0;
      CHECK(caps.max_counters == 1048576u);
      compcntr_comp_cntr_init_attr a{};
      compcntr_comp_cntr* c = compcntr_create_comp_cntr(d, &a);
      CHECK(c != nullptr);
      if (c) compcntr_destroy_comp_cntr(c);
      CHECK(compcntr_close_device(d) == 0);
    }
  CHECK(zero_capacity == 0);
}
