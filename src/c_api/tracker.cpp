// The C API of completion tracking (include/compcntr/tracker.h) over compcntr::completion_tracker.
//
// The C++ tracker holds a counter_ref on the caller's counter, so compcntr_destroy_comp_cntr on
// it is EBUSY while the tracker lives (the counter stays usable), as for a credit tracker.
module;
#include <compcntr/compcntr.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>

module compcntr;

import :c_api;

using namespace compcntr::c_api;
using compcntr::detail::fail;

/// struct compcntr_tracker.
struct tracker_obj {
  compcntr::completion_tracker cxx;
};
inline tracker_obj* impl(compcntr_tracker* t) noexcept { return reinterpret_cast<tracker_obj*>(t); }
inline const tracker_obj* impl(const compcntr_tracker* t) noexcept {
  return reinterpret_cast<const tracker_obj*>(t);
}

namespace {

int quiet_impl(const char* call, compcntr_tracker* t, int timeout_ms,
               const compcntr_wait_attr* attr) noexcept {
  if (!t) return null_arg(call, "t");
  compcntr::wait_options o;
  if (const int err = wait_attr_options(call, attr, o)) return err;
  return static_cast<int>(impl(t)->cxx.quiet(std::chrono::milliseconds(timeout_ms), o));
}

} // namespace

extern "C" {

struct compcntr_tracker* compcntr_tracker_create(struct compcntr_comp_cntr* completions) {
  if (!completions)
    return fail_null<compcntr_tracker>(fail(EINVAL, "tracker_create: completions is NULL"));
  if (!completions->context)
    return fail_null<compcntr_tracker>(
        fail(EINVAL, "tracker_create: the counter has no device (context is NULL)"));
  auto* obj = new (std::nothrow) tracker_obj{};
  if (!obj) return fail_null<compcntr_tracker>(fail(ENOMEM, "tracker_create: out of memory"));
  std::error_code ec;
  obj->cxx = compcntr::completion_tracker::create(impl(completions->context)->dev,
                                                  impl(completions)->cxx, ec);
  if (ec) {
    delete obj;
    return fail_null<compcntr_tracker>(ec);
  }
  return reinterpret_cast<compcntr_tracker*>(obj);
}

int compcntr_tracker_issue(struct compcntr_tracker* t, uint64_t n) {
  if (!t) return null_arg("tracker_issue", "t");
  return static_cast<int>(impl(t)->cxx.issue(n));
}

uint64_t compcntr_tracker_issued(const struct compcntr_tracker* t) {
  if (!t) {
    errno = null_arg("tracker_issued", "t");
    return 0;
  }
  return impl(t)->cxx.issued();
}

uint64_t compcntr_tracker_completed(const struct compcntr_tracker* t) {
  if (!t) {
    errno = null_arg("tracker_completed", "t");
    return 0;
  }
  return impl(t)->cxx.completed();
}

int compcntr_tracker_quiet(struct compcntr_tracker* t, int timeout_ms) {
  return quiet_impl("tracker_quiet", t, timeout_ms, nullptr);
}

int compcntr_tracker_quiet_ex(struct compcntr_tracker* t, int timeout_ms,
                              const struct compcntr_wait_attr* attr) {
  return quiet_impl("tracker_quiet_ex", t, timeout_ms, attr);
}

int compcntr_tracker_destroy(struct compcntr_tracker* t) {
  if (!t) return null_arg("tracker_destroy", "t");
  delete impl(t);
  return 0;
}

}  // extern "C"
