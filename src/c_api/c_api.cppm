// compcntr:c_api -- what the C API's units share (src/c_api/*.cpp): the C objects behind the
// handles of <compcntr/compcntr.h>, the C counter's layout, argument checks.
//
// An internal partition (modules/meson.build, internal_units): the C API's units are
// implementation units of module compcntr, so they reach compcntr::detail, which importers of
// `import compcntr;` cannot name; this partition is never exported, installed or imported by
// the primary unit.
module;
#include <compcntr/compcntr.h>
#include <compcntr/wait.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <type_traits>
module compcntr:c_api;
import :error;
import :types;
import :slot;
import :counter;
import :device;
import :wait;
import :qp;

namespace compcntr::c_api {

// The C handles of <compcntr/compcntr.h> are incomplete structs of the global module (the header
// is included in the global module fragment), and a definition in this module may not complete
// them: each is the object below behind a reinterpret_cast (impl()/pub()).

/// struct compcntr_device.
struct device_obj {
  compcntr::device dev;
  std::string name;
};
inline device_obj* impl(compcntr_device* d) noexcept { return reinterpret_cast<device_obj*>(d); }
inline const device_obj* impl(const compcntr_device* d) noexcept {
  return reinterpret_cast<const device_obj*>(d);
}
inline compcntr_device* pub(device_obj* d) noexcept {
  return reinterpret_cast<compcntr_device*>(d);
}

// A C counter: the public struct compcntr_comp_cntr {context, handle, reserved_, slot_}, with
// the C++ owner of the slot where the header has `slot_` (a compcntr::counter is exactly one
// slot pointer), so the inline fast paths of <compcntr/compcntr.h> read the slot pointer the C++
// owner holds. Where it lives (make_c_counter):
//   * normally in the spare bytes of its own slot (slot::c_api, on line 1, the line every update
//     reads anyway): a C counter costs 128 bytes, as a C++ one. A use after destroy then touches
//     a free (or reused) pool slot, which nothing can detect;
//   * in AddressSanitizer builds of the library on the heap, so a use after destroy is a
//     heap-use-after-free ASan reports (tests/c_api/c_fast_path_test.cpp checks that it does).
// The inline fast paths follow `slot_` either way, so user code compiled with or without ASan
// works with either library build.
struct c_counter {
  compcntr_device* context;
  std::uint32_t handle;
  /// The public struct's reserved_ word: the code of the object that owns the counter
  /// (compcntr_comp_cntr_set_owner: a libfabric adapter fid_cntr), 0 when none. While set,
  /// destroy is EBUSY and names the owner (owner_name()). The inline fast paths never read it.
  std::atomic<std::uint32_t> owner{0};
  compcntr::counter cxx;
};
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
static_assert(std::is_standard_layout_v<c_counter> && std::is_standard_layout_v<compcntr::counter>);
static_assert(sizeof(c_counter) == sizeof(compcntr_comp_cntr) &&
                  offsetof(c_counter, context) == offsetof(compcntr_comp_cntr, context) &&
                  offsetof(c_counter, handle) == offsetof(compcntr_comp_cntr, handle) &&
                  offsetof(c_counter, owner) == offsetof(compcntr_comp_cntr, reserved_) &&
                  offsetof(c_counter, cxx) == offsetof(compcntr_comp_cntr, slot_) &&
                  sizeof(compcntr::counter) == sizeof(compcntr_comp_cntr::slot_),
              "c_counter must have the layout of struct compcntr_comp_cntr");

inline c_counter* impl(compcntr_comp_cntr* cc) noexcept { return reinterpret_cast<c_counter*>(cc); }
inline compcntr_comp_cntr* pub(c_counter* c) noexcept {
  return reinterpret_cast<compcntr_comp_cntr*>(c);
}

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool c_counters_on_heap = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool c_counters_on_heap = true;
#else
inline constexpr bool c_counters_on_heap = false;
#endif
#else
inline constexpr bool c_counters_on_heap = false;
#endif

/// The C counter owning `c` (a live counter of `dev`), or nullptr (ENOMEM: heap mode only; `c`
/// is then destroyed).
c_counter* make_c_counter(compcntr_device* dev, compcntr::counter&& c) noexcept;
/// The checked destroy (compcntr_destroy_comp_cntr): EBUSY and nothing changes while anyone
/// besides the owner holds the counter; else the counter and its C object are gone.
int destroy_c_counter(c_counter* c) noexcept;
/// The RAII drop: the owner's reference goes; a counter still attached lives on with its QP.
void drop_c_counter(c_counter* c) noexcept;

} // namespace compcntr::c_api

namespace compcntr::c_api {

/// struct compcntr_qp: the C++ owner (heap-allocated, so use after destroy is caught by
/// AddressSanitizer).
struct qp_obj {
  compcntr::qp cxx;
};
inline qp_obj* impl(compcntr_qp* q) noexcept { return reinterpret_cast<qp_obj*>(q); }
inline const qp_obj* impl(const compcntr_qp* q) noexcept {
  return reinterpret_cast<const qp_obj*>(q);
}
inline compcntr_qp* pub(qp_obj* q) noexcept { return reinterpret_cast<compcntr_qp*>(q); }

/// EINVAL with the message "<call>: <what> is NULL".
inline int null_arg(const char* call, const char* what) noexcept {
  return detail::fail(EINVAL, "%s: %s is NULL", call, what).value();
}

/// struct compcntr_wait_attr (NULL: defaults) -> wait_options; 0 or EINVAL with a message
/// naming `call` and the field. Shared by the wait and credit C calls.
inline int wait_attr_options(const char* call, const compcntr_wait_attr* attr,
                             compcntr::wait_options& o) noexcept {
  using detail::fail;
  constexpr std::uint32_t known = COMPCNTR_WAIT_ATTR_SPIN | COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;
  if (attr == nullptr) return 0;
  if ((attr->comp_mask & ~known) != 0)
    return fail(EINVAL, "%s: unknown comp_mask bit(s) 0x%x in the wait attributes", call,
                attr->comp_mask & ~known)
        .value();
  if ((attr->comp_mask & COMPCNTR_WAIT_ATTR_SPIN) != 0) {
    if (attr->spin_ns < 0)
      return fail(EINVAL, "%s: spin_ns must be >= 0 (got %lld)", call,
                  static_cast<long long>(attr->spin_ns))
          .value();
    o.spin = attr->spin_ns == COMPCNTR_WAIT_SPIN_FOREVER ? compcntr::spin_forever
                                                         : std::chrono::nanoseconds(attr->spin_ns);
  }
  if ((attr->comp_mask & COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL) != 0) {
    if (attr->progress_interval_us == 0)
      return fail(EINVAL, "%s: progress_interval_us must be > 0", call).value();
    o.drive_interval = std::chrono::microseconds(attr->progress_interval_us);
  }
  o.drive = attr->progress;
  o.drive_ctx = attr->progress_ctx;
  return 0;
}

/// For constructors: sets errno from `ec` and returns NULL.
template <class T>
T* fail_null(std::error_code ec) noexcept {
  errno = ec.value();
  return nullptr;
}

} // namespace compcntr::c_api
