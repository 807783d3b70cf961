// The C API of the polling helpers (include/compcntr/wait.h) over compcntr:wait.
#include <compcntr/compcntr.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <system_error>

import compcntr;

#include "internal.hpp"

using namespace compcntr::c_api;

namespace {

constexpr std::uint32_t known_wait_attr_bits =
    COMPCNTR_WAIT_ATTR_SPIN | COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;

// attr -> options; 0 or EINVAL (with a message naming `call` and the field).
int to_options(const char* call, const compcntr_wait_attr* attr, compcntr::wait_options& o) noexcept {
  using compcntr::detail::fail;
  if (attr == nullptr) return 0;
  if ((attr->comp_mask & ~known_wait_attr_bits) != 0)
    return fail(EINVAL, "%s: unknown comp_mask bit(s) 0x%x in the wait attributes", call,
                attr->comp_mask & ~known_wait_attr_bits).value();
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
    o.progress_interval = std::chrono::microseconds(attr->progress_interval_us);
  }
  o.progress = attr->progress;
  o.progress_ctx = attr->progress_ctx;
  return 0;
}

int wait_impl(const char* call, compcntr_comp_cntr* cc, std::uint64_t threshold, int timeout_ms,
              const compcntr_wait_attr* attr) noexcept {
  if (!cc) return null_arg(call, "cc");
  compcntr::wait_options o;
  if (const int err = to_options(call, attr, o)) return err;
  return static_cast<int>(
      compcntr::wait(impl(cc)->cxx, threshold, std::chrono::milliseconds(timeout_ms), o));
}

int poll_impl(const char* call, compcntr_comp_cntr* const* ccs, const std::uint64_t* thresholds,
              std::size_t n, int timeout_ms, std::size_t* which, const compcntr_wait_attr* attr) noexcept {
  if (!ccs) return null_arg(call, "ccs");
  if (!thresholds) return null_arg(call, "thresholds");
  if (!which) return null_arg(call, "which");
  compcntr::wait_options o;
  if (const int err = to_options(call, attr, o)) return err;
  const compcntr::detail::slot_list list{
      ccs, n, [](const void* base, std::size_t i) noexcept -> compcntr::detail::slot* {
        compcntr_comp_cntr* cc = static_cast<compcntr_comp_cntr* const*>(base)[i];
        return cc != nullptr ? impl(cc)->cxx.native_slot() : nullptr;
      }};
  const compcntr::poll_result r = compcntr::detail::poll_slots(list, thresholds, timeout_ms, o);
  if (r.status == std::errc{} || r.status == std::errc::io_error) *which = r.index;
  return static_cast<int>(r.status);
}

}  // namespace

extern "C" {

int compcntr_wait_comp_cntr(struct compcntr_comp_cntr* cc, uint64_t threshold, int timeout_ms) {
  return wait_impl("wait_comp_cntr", cc, threshold, timeout_ms, nullptr);
}

int compcntr_wait_comp_cntr_ex(struct compcntr_comp_cntr* cc, uint64_t threshold, int timeout_ms,
                               const struct compcntr_wait_attr* attr) {
  return wait_impl("wait_comp_cntr_ex", cc, threshold, timeout_ms, attr);
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

}  // extern "C"
