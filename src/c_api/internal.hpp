// Shared internals of the C API translation units (src/c_api/*.cpp).
// Include after `import compcntr;` and <compcntr/compcntr.h>.
#ifndef COMPCNTR_SRC_C_API_INTERNAL_HPP
#define COMPCNTR_SRC_C_API_INTERNAL_HPP

#include <cerrno>
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

/// For constructors: sets errno from `ec` and returns NULL.
template <class T>
T* fail_null(std::error_code ec) noexcept {
  errno = ec.value();
  return nullptr;
}

}  // namespace compcntr::c_api

#endif
