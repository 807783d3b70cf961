// The C API of the polling helpers (include/compcntr/wait.h) over compcntr:wait.
module;
#include <compcntr/compcntr.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <type_traits>

module compcntr;

import :c_api;

using namespace compcntr::c_api;

namespace {

int wait_impl(const char* call, compcntr_comp_cntr* cc, std::uint64_t threshold, int timeout_ms,
              const compcntr_wait_attr* attr) noexcept {
  if (!cc) return null_arg(call, "cc");
  compcntr::wait_options o;
  if (const int err = wait_attr_options(call, attr, o)) return err;
  return static_cast<int>(
      compcntr::wait(impl(cc)->cxx, threshold, std::chrono::milliseconds(timeout_ms), o));
}

int poll_impl(const char* call, compcntr_comp_cntr* const* ccs, const std::uint64_t* thresholds,
              std::size_t n, int timeout_ms, std::size_t* which,
              const compcntr_wait_attr* attr) noexcept {
  if (!ccs) return null_arg(call, "ccs");
  if (!thresholds) return null_arg(call, "thresholds");
  if (!which) return null_arg(call, "which");
  compcntr::wait_options o;
  if (const int err = wait_attr_options(call, attr, o)) return err;
  const compcntr::detail::slot_list list{
      ccs, n, [](const void* base, std::size_t i) noexcept -> compcntr::detail::slot* {
        compcntr_comp_cntr* cc = static_cast<compcntr_comp_cntr* const*>(base)[i];
        return cc != nullptr ? impl(cc)->cxx.native_slot() : nullptr;
      }};
  const compcntr::poll_result r = compcntr::detail::poll_slots(list, thresholds, timeout_ms, o);
  if (r.status == std::errc{} || r.status == std::errc::io_error) *which = r.index;
  return static_cast<int>(r.status);
}

} // namespace

extern "C" {

int compcntr_wait_comp_cntr(struct compcntr_comp_cntr* cc, uint64_t threshold, int timeout_ms) {
  return wait_impl("wait_comp_cntr", cc, threshold, timeout_ms, nullptr);
}

int compcntr_wait_comp_cntr_ex(struct compcntr_comp_cntr* cc, uint64_t threshold, int timeout_ms,
                               const struct compcntr_wait_attr* attr) {
  return wait_impl("wait_comp_cntr_ex", cc, threshold, timeout_ms, attr);
}

int compcntr_wait_comp_cntr_since(struct compcntr_comp_cntr* cc, uint64_t threshold,
                                  uint64_t errors_seen, int timeout_ms,
                                  const struct compcntr_wait_attr* attr) {
  if (!cc) return null_arg("wait_comp_cntr_since", "cc");
  compcntr::wait_options o;
  if (const int err = wait_attr_options("wait_comp_cntr_since", attr, o)) return err;
  return static_cast<int>(compcntr::wait_since(impl(cc)->cxx, threshold, errors_seen,
                                               std::chrono::milliseconds(timeout_ms), o));
}

int compcntr_poll_comp_cntrs(struct compcntr_comp_cntr* const* ccs, const uint64_t* thresholds,
                             size_t n, int timeout_ms, size_t* which) {
  return poll_impl("poll_comp_cntrs", ccs, thresholds, n, timeout_ms, which, nullptr);
}

int compcntr_poll_comp_cntrs_ex(struct compcntr_comp_cntr* const* ccs, const uint64_t* thresholds,
                                size_t n, int timeout_ms, size_t* which,
                                const struct compcntr_wait_attr* attr) {
  return poll_impl("poll_comp_cntrs_ex", ccs, thresholds, n, timeout_ms, which, attr);
}

int compcntr_comp_cntr_get_fd(struct compcntr_comp_cntr* cc, int* fd) {
  if (!cc) return null_arg("comp_cntr_get_fd", "cc");
  if (!fd) return null_arg("comp_cntr_get_fd", "fd");
  std::error_code ec;
  const int f = compcntr::pollable_fd(impl(cc)->cxx, ec);
  if (ec) return ec.value();
  *fd = f;
  return 0;
}

int compcntr_comp_cntr_arm_fd(struct compcntr_comp_cntr* cc) {
  if (!cc) return null_arg("comp_cntr_arm_fd", "cc");
  std::error_code ec;
  compcntr::arm_fd(impl(cc)->cxx, ec);
  return ec.value();
}

int compcntr_comp_cntr_arm_fd_threshold(struct compcntr_comp_cntr* cc, uint64_t threshold) {
  if (!cc) return null_arg("comp_cntr_arm_fd_threshold", "cc");
  std::error_code ec;
  compcntr::arm_fd(impl(cc)->cxx, threshold, ec);
  return ec.value();
}

}  // extern "C"
