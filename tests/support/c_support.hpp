// Helpers the C API suites share (they use the C API only): the last error message, a search
// in it, the calling thread's id, and a counter on a device that fails the test case when it
// cannot be made. Include after <compcntr/compcntr.h> and <doctest/doctest.h>.
#ifndef COMPCNTR_TESTS_C_SUPPORT_HPP
#define COMPCNTR_TESTS_C_SUPPORT_HPP

#include <sys/syscall.h>
#include <unistd.h>
#include <string>

namespace c_support {

inline std::string msg() { return compcntr_last_error_message(); }
inline bool has(const char* what) { return msg().find(what) != std::string::npos; }
inline pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

inline compcntr_comp_cntr* make_cc(compcntr_device* dev,
                                   compcntr_comp_cntr_type type = COMPCNTR_COMP_CNTR_TYPE_WRS) {
  compcntr_comp_cntr_init_attr a{};
  a.type = type;
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &a);
  REQUIRE(cc != nullptr);
  return cc;
}

} // namespace c_support

#endif
