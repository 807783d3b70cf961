// Shared internals of the C API translation units (src/c_api/*.cpp).
// Include after `import compcntr;` and <compcntr/compcntr.h>.
#ifndef COMPCNTR_SRC_C_API_INTERNAL_HPP
#define COMPCNTR_SRC_C_API_INTERNAL_HPP

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <type_traits>

struct compcntr_device {
  compcntr::device dev;
  std::string name;
};

namespace compcntr::c_api {

// A C counter: the public verbs-shaped struct first (so the two pointers convert), then the
// C++ owner of the slot. Heap-allocated, so a use after destroy is a heap-use-after-free that
// AddressSanitizer reports.
struct c_counter {
  compcntr_comp_cntr pub;
  compcntr::counter cxx;
};
static_assert(std::is_standard_layout_v<c_counter>);

inline c_counter* impl(compcntr_comp_cntr* cc) noexcept { return reinterpret_cast<c_counter*>(cc); }

}  // namespace compcntr::c_api

// A C QP: the C++ owner (heap-allocated, so use after destroy is caught by AddressSanitizer).
struct compcntr_qp {
  compcntr::qp cxx;
};

namespace compcntr::c_api {

/// EINVAL with the message "<call>: <what> is NULL".
inline int null_arg(const char* call, const char* what) noexcept {
  return compcntr::detail::fail(EINVAL, "%s: %s is NULL", call, what).value();
}

/// struct compcntr_wait_attr (NULL: defaults) -> wait_options; 0 or EINVAL with a message
/// naming `call` and the field. Shared by the wait and credit C calls.
inline int wait_attr_options(const char* call, const compcntr_wait_attr* attr,
                             compcntr::wait_options& o) noexcept {
  using compcntr::detail::fail;
  constexpr std::uint32_t known = COMPCNTR_WAIT_ATTR_SPIN | COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;
  if (attr == nullptr) return 0;
  if ((attr->comp_mask & ~known) != 0)
    return fail(EINVAL, "%s: unknown comp_mask bit(s) 0x%x in the wait attributes", call,
                attr->comp_mask & ~known).value();
  if ((attr->comp_mask & COMPCNTR_WAIT_ATTR_SPIN) != 0) {
    if (attr->spin_ns < 0)
      return fail(EINVAL, "%s: spin_ns must be >= 0 (got %lld)", call,
                  static_cast<long long>(attr->spin_ns)).value();
    o.spin = attr->spin_ns == COMPCNTR_WAIT_SPIN_FOREVER ? compcntr::spin_forever
                                                         : std::chrono::nanoseconds(attr->spin_ns);
  }
  if ((attr->comp_mask & COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL) != 0) {
    if (attr->progress_interval_us == 0)
      return fail(EINVAL, "%s: progress_interval_us must be > 0", call).value();
    o.hook_interval = std::chrono::microseconds(attr->progress_interval_us);
  }
  o.hook = attr->progress;
  o.hook_ctx = attr->progress_ctx;
  return 0;
}

/// For constructors: sets errno from `ec` and returns NULL.
template <class T>
T* fail_null(std::error_code ec) noexcept {
  errno = ec.value();
  return nullptr;
}

}  // namespace compcntr::c_api

#endif
