// Helpers every suite shares: a software device and counters on it, failing the test case (not
// returning empty objects) when they cannot be made. Include after `import compcntr;` and
// <doctest/doctest.h>.
#ifndef COMPCNTR_TESTS_SUPPORT_HPP
#define COMPCNTR_TESTS_SUPPORT_HPP

#include <system_error>

namespace test_support {

inline compcntr::device open_soft() {
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  REQUIRE_FALSE(ec);
  REQUIRE(dev);
  return dev;
}

inline compcntr::counter make_counter(compcntr::device& dev,
                                      compcntr::counter_type t = compcntr::counter_type::wrs) {
  std::error_code ec;
  auto c = dev.create_counter(t, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(c);
  return c;
}

} // namespace test_support

#endif
