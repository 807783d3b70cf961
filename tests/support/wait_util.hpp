// Helpers shared by the wait/poll suites: condition waits with a failure deadline (never a
// sleep used as synchronisation) and thread CPU time.
#ifndef COMPCNTR_TESTS_WAIT_UTIL_HPP
#define COMPCNTR_TESTS_WAIT_UTIL_HPP

#include <sched.h>
#include <chrono>
#include <ctime>

namespace test_util {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

/// Polls `cond` (yielding between polls) until it holds; false if `guard` passes first. The
/// guard only turns a hang into a failure: tests never rely on its length.
template <class F>
bool eventually(F&& cond, std::chrono::milliseconds guard = 30s) {
  const auto end = clock_type::now() + guard;
  while (!cond()) {
    if (clock_type::now() > end) return false;
    ::sched_yield();
  }
  return true;
}

/// CPU time consumed by the calling thread.
inline std::chrono::nanoseconds thread_cpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

inline double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

} // namespace test_util

#endif
