// The C API of triggered operations (include/compcntr/trigger.h) over compcntr:trigger.
//
// struct compcntr_trigger is the library's trigger node itself (no wrapper): the handle is the
// node, valid from arm until compcntr_trigger_destroy.
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
using compcntr::detail::fail;

namespace {

compcntr::detail::trigger_node* node(compcntr_trigger* t) noexcept {
  return reinterpret_cast<compcntr::detail::trigger_node*>(t);
}
const compcntr::detail::trigger_node* node(const compcntr_trigger* t) noexcept {
  return reinterpret_cast<const compcntr::detail::trigger_node*>(t);
}
compcntr_trigger* handle(compcntr::detail::trigger_node* n) noexcept {
  return reinterpret_cast<compcntr_trigger*>(n);
}
compcntr::detail::slot* slot_of(compcntr_comp_cntr* cc) noexcept {
  return impl(cc)->cxx.native_slot();
}

compcntr_trigger* arm_counter(const char* call, compcntr_comp_cntr* cc, uint64_t threshold,
                              compcntr_comp_cntr* target, uint64_t operand, bool set) noexcept {
  if (!cc) return fail_null<compcntr_trigger>(fail(EINVAL, "%s: cc is NULL", call));
  if (!target) return fail_null<compcntr_trigger>(fail(EINVAL, "%s: target is NULL", call));
  std::error_code ec;
  auto* n = compcntr::detail::arm_counter_trigger(*slot_of(cc), threshold, *slot_of(target),
                                                  operand, set, ec);
  return n ? handle(n) : fail_null<compcntr_trigger>(ec);
}

} // namespace

extern "C" {

struct compcntr_trigger* compcntr_trigger_arm(struct compcntr_comp_cntr* cc, uint64_t threshold,
                                              compcntr_trigger_fn fn, void* ctx, uint32_t flags) {
  if (!cc) return fail_null<compcntr_trigger>(fail(EINVAL, "trigger_arm: cc is NULL"));
  if (!fn) return fail_null<compcntr_trigger>(fail(EINVAL, "trigger_arm: fn is NULL"));
  std::error_code ec;
  auto* n =
      compcntr::detail::arm_trigger(*slot_of(cc), threshold, fn, ctx, nullptr, flags, nullptr, ec);
  return n ? handle(n) : fail_null<compcntr_trigger>(ec);
}

struct compcntr_trigger* compcntr_trigger_arm_add(struct compcntr_comp_cntr* cc, uint64_t threshold,
                                                  struct compcntr_comp_cntr* target, uint64_t n) {
  return arm_counter("trigger_arm_add", cc, threshold, target, n, false);
}

struct compcntr_trigger* compcntr_trigger_arm_set(struct compcntr_comp_cntr* cc, uint64_t threshold,
                                                  struct compcntr_comp_cntr* target, uint64_t v) {
  return arm_counter("trigger_arm_set", cc, threshold, target, v, true);
}

int compcntr_trigger_cancel(struct compcntr_trigger* t) {
  if (!t) return null_arg("trigger_cancel", "t");
  const int e = compcntr::detail::cancel_trigger(*node(t));
  if (e != 0)
    return fail(e, "trigger_cancel: the trigger already fired, is firing or was cancelled").value();
  return 0;
}

int compcntr_trigger_destroy(struct compcntr_trigger* t) {
  if (!t) return null_arg("trigger_destroy", "t");
  return compcntr::detail::destroy_trigger(node(t));
}

int compcntr_trigger_state(const struct compcntr_trigger* t) {
  if (!t) return -null_arg("trigger_state", "t");
  return compcntr::detail::trigger_node_state(*node(t));
}

uint64_t compcntr_trigger_threshold(const struct compcntr_trigger* t) {
  if (!t) {
    errno = null_arg("trigger_threshold", "t");
    return 0;
  }
  return compcntr::detail::trigger_node_threshold(*node(t));
}

int compcntr_trigger_flush(struct compcntr_comp_cntr* cc) {
  if (!cc) return -null_arg("trigger_flush", "cc");
  return static_cast<int>(compcntr::detail::flush_slot_triggers(*slot_of(cc)));
}

int compcntr_trigger_progress(struct compcntr_device* dev) {
  if (!dev) return -null_arg("trigger_progress", "dev");
  return static_cast<int>(compcntr::detail::run_device_triggers(*impl(dev)->dev.core()));
}

int compcntr_trigger_service_start(struct compcntr_device* dev) {
  if (!dev) return null_arg("trigger_service_start", "dev");
  return compcntr::detail::start_trigger_service(*impl(dev)->dev.core()).value();
}

int compcntr_trigger_service_stop(struct compcntr_device* dev) {
  if (!dev) return null_arg("trigger_service_stop", "dev");
  return compcntr::detail::stop_trigger_service(*impl(dev)->dev.core()).value();
}

}  // extern "C"
