// The C API of credit tracking (include/compcntr/credits.h) over compcntr::credit_tracker.
//
// Ownership: the tracker creates one real C counter (c_counter, as compcntr_create_comp_cntr
// makes: make_c_counter) per peer and owns it; compcntr_credits_counter hands out its public struct. An adopted
// tracker (compcntr_credits_adopt) holds the caller's counters the same way but never frees them. The
// C++ tracker adopts the counters (it reads and waits on them, release adds to them). To keep
// compcntr_destroy_comp_cntr on such a pointer from freeing a counter the tracker still uses,
// the tracker also holds a counter_ref on each: destroy then sees a reference besides the
// owner's and answers EBUSY, the counter staying usable. compcntr_credits_destroy drops the
// refs and destroys the counters (reset(): one still attached to a live QP lives on until that
// QP goes).
module;
#include <compcntr/compcntr.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>

module compcntr;

import :c_api;

using namespace compcntr::c_api;
using compcntr::detail::fail;

struct credits_obj {
  compcntr::credit_tracker cxx; // emptied first by the destructor: it stops using the counters
  std::uint32_t npeers = 0;
  std::unique_ptr<c_counter*[]> counters; // one per peer; owned unless adopted
  std::unique_ptr<compcntr::counter_ref[]> pins; // keep destroy_comp_cntr EBUSY
  bool owns = true; // false: adopted, the caller's counters

  ~credits_obj() {
    cxx = compcntr::credit_tracker{}; // stops using the counters first
    for (std::uint32_t i = 0; i < npeers; ++i) {
      if (pins) pins[i].reset();
      if (owns && counters && counters[i])
        drop_c_counter(counters[i]); // attached to a live QP: the slot lives on with the QP
    }
  }
};
inline credits_obj* impl(compcntr_credits* p) noexcept { return reinterpret_cast<credits_obj*>(p); }
inline const credits_obj* impl(const compcntr_credits* p) noexcept {
  return reinterpret_cast<const credits_obj*>(p);
}
inline compcntr_credits* pub(credits_obj* p) noexcept {
  return reinterpret_cast<compcntr_credits*>(p);
}

namespace {

int bad_cr(const char* call) noexcept { return null_arg(call, "cr"); }

int acquire_impl(const char* call, compcntr_credits* cr, std::uint32_t peer, std::uint64_t n,
                 int timeout_ms, const compcntr_wait_attr* attr) noexcept {
  if (!cr) return bad_cr(call);
  compcntr::wait_options o;
  if (const int err = wait_attr_options(call, attr, o)) return err;
  return static_cast<int>(impl(cr)->cxx.acquire(peer, n, std::chrono::milliseconds(timeout_ms), o));
}

int flush_impl(const char* call, compcntr_credits* cr, std::uint32_t peer, int timeout_ms,
               const compcntr_wait_attr* attr) noexcept {
  if (!cr) return bad_cr(call);
  compcntr::wait_options o;
  if (const int err = wait_attr_options(call, attr, o)) return err;
  return static_cast<int>(impl(cr)->cxx.flush(peer, std::chrono::milliseconds(timeout_ms), o));
}

int peer_range(const char* call, const compcntr_credits* cr, std::uint32_t peer) noexcept {
  return fail(EINVAL, "%s: peer %u out of range (%u peers)", call, peer, impl(cr)->npeers).value();
}

// create and create_per_peer: windows == nullptr means credits_per_peer for every peer.
compcntr_credits* create_impl(compcntr_device* dev, std::uint32_t npeers,
                              std::uint64_t credits_per_peer, const std::uint64_t* windows) {
  std::unique_ptr<credits_obj> obj(new (std::nothrow) credits_obj{});
  if (!obj) return fail_null<compcntr_credits>(fail(ENOMEM, "credits_create: out of memory"));
  std::error_code ec;
  if ((windows == nullptr ? compcntr::detail::check_credit_shape("credits_create", impl(dev)->dev,
                                                                 npeers, credits_per_peer, ec)
                          : compcntr::detail::check_credit_windows("credits_create", impl(dev)->dev,
                                                                   {windows, npeers}, ec)) == 0)
    return fail_null<compcntr_credits>(ec);
  const compcntr::counter_caps caps = impl(dev)->dev.caps();
  const std::uint32_t room =
      caps.max_counters - std::min(caps.max_counters, impl(dev)->dev.live_counters());
  if (npeers > room)
    return fail_null<compcntr_credits>(fail(ENOMEM,
                                            "credits_create: %u peers need %u counters, "
                                            "the device has room for %u more",
                                            npeers, npeers, room));
  obj->counters.reset(new (std::nothrow) c_counter*[npeers]());
  obj->pins.reset(new (std::nothrow) compcntr::counter_ref[npeers]);
  std::unique_ptr<compcntr::counter*[]> cxx(new (std::nothrow) compcntr::counter*[npeers]);
  if (!obj->counters || !obj->pins || !cxx)
    return fail_null<compcntr_credits>(
        fail(ENOMEM, "credits_create: out of memory for %u peers", npeers));
  obj->npeers = npeers; // from here on the destructor cleans up whatever exists
  // Undoes everything before setting errno (a destructor must not clobber it).
  auto undo = [&](std::error_code e) {
    obj.reset();
    return fail_null<compcntr_credits>(e);
  };
  for (std::uint32_t i = 0; i < npeers; ++i) {
    compcntr::counter cxx_counter = impl(dev)->dev.create_counter(compcntr::counter_type::wrs, ec);
    if (ec) return undo(ec);
    c_counter* c = make_c_counter(dev, std::move(cxx_counter));
    if (!c) return undo(fail(ENOMEM, "credits_create: out of memory"));
    obj->counters[i] = c;
    obj->pins[i] = impl(dev)->dev.resolve(c->cxx.id(), ec);
    if (ec) return undo(ec);
    cxx[i] = &c->cxx;
  }
  if (windows == nullptr)
    obj->cxx =
        compcntr::credit_tracker::adopt(impl(dev)->dev, {cxx.get(), npeers}, credits_per_peer, ec);
  else
    obj->cxx =
        compcntr::credit_tracker::adopt(impl(dev)->dev, {cxx.get(), npeers}, {windows, npeers}, ec);
  if (ec) return undo(ec);
  return pub(obj.release());
}

// One of issued/completed/window for peer.
template <class F>
int peer_count(const char* call, compcntr_credits* cr, std::uint32_t peer, std::uint64_t* out,
               const char* what, F get) noexcept {
  if (!cr) return bad_cr(call);
  if (!out) return null_arg(call, what);
  if (peer >= impl(cr)->npeers) return peer_range(call, cr, peer);
  *out = get(impl(cr)->cxx, peer);
  return 0;
}

} // namespace

extern "C" {

struct compcntr_credits* compcntr_credits_create(struct compcntr_device* dev, uint32_t npeers,
                                                 uint64_t credits_per_peer) {
  if (!dev) return fail_null<compcntr_credits>(fail(EINVAL, "credits_create: dev is NULL"));
  return create_impl(dev, npeers, credits_per_peer, nullptr);
}

struct compcntr_credits* compcntr_credits_create_per_peer(struct compcntr_device* dev,
                                                          uint32_t npeers,
                                                          const uint64_t* windows) {
  if (!dev)
    return fail_null<compcntr_credits>(fail(EINVAL, "credits_create_per_peer: dev is NULL"));
  if (!windows)
    return fail_null<compcntr_credits>(fail(EINVAL, "credits_create_per_peer: windows is NULL"));
  return create_impl(dev, npeers, 0, windows);
}

struct compcntr_credits* compcntr_credits_adopt(struct compcntr_device* dev,
                                                struct compcntr_comp_cntr* const* ccs,
                                                uint32_t npeers, const uint64_t* windows) {
  if (!dev) return fail_null<compcntr_credits>(fail(EINVAL, "credits_adopt: dev is NULL"));
  if (!ccs) return fail_null<compcntr_credits>(fail(EINVAL, "credits_adopt: ccs is NULL"));
  if (!windows) return fail_null<compcntr_credits>(fail(EINVAL, "credits_adopt: windows is NULL"));
  std::error_code ec;
  if (compcntr::detail::check_credit_windows("credits_adopt", impl(dev)->dev, {windows, npeers},
                                             ec) == 0)
    return fail_null<compcntr_credits>(ec);
  for (std::uint32_t i = 0; i < npeers; ++i) {
    if (!ccs[i])
      return fail_null<compcntr_credits>(fail(EINVAL, "credits_adopt: ccs[%u] is NULL", i));
    if (ccs[i]->context != dev)
      return fail_null<compcntr_credits>(
          fail(EINVAL, "credits_adopt: ccs[%u] belongs to another device", i));
  }
  std::unique_ptr<credits_obj> obj(new (std::nothrow) credits_obj{});
  if (!obj) return fail_null<compcntr_credits>(fail(ENOMEM, "credits_adopt: out of memory"));
  obj->owns = false;
  obj->counters.reset(new (std::nothrow) c_counter*[npeers]());
  obj->pins.reset(new (std::nothrow) compcntr::counter_ref[npeers]);
  std::unique_ptr<compcntr::counter*[]> cxx(new (std::nothrow) compcntr::counter*[npeers]);
  if (!obj->counters || !obj->pins || !cxx)
    return fail_null<compcntr_credits>(
        fail(ENOMEM, "credits_adopt: out of memory for %u peers", npeers));
  obj->npeers = npeers;
  auto undo = [&](std::error_code e) {
    obj.reset(); // drops the references taken so far; the counters stay the caller's
    return fail_null<compcntr_credits>(e);
  };
  for (std::uint32_t i = 0; i < npeers; ++i) {
    c_counter* c = impl(ccs[i]);
    obj->counters[i] = c;
    cxx[i] = &c->cxx;
  }
  // Type checks (BYTES) before any reference is taken: a refused adopt holds nothing.
  obj->cxx =
      compcntr::credit_tracker::adopt(impl(dev)->dev, {cxx.get(), npeers}, {windows, npeers}, ec);
  if (ec) return undo(ec);
  for (std::uint32_t i = 0; i < npeers; ++i) {
    obj->pins[i] = impl(dev)->dev.resolve(obj->counters[i]->cxx.id(), ec);
    if (ec) return undo(ec);
  }
  return pub(obj.release());
}

int compcntr_credits_issued(struct compcntr_credits* cr, uint32_t peer, uint64_t* issued) {
  return peer_count("credits_issued", cr, peer, issued, "issued",
                    [](const compcntr::credit_tracker& t, std::uint32_t p) { return t.issued(p); });
}

int compcntr_credits_completed(struct compcntr_credits* cr, uint32_t peer, uint64_t* completed) {
  return peer_count(
      "credits_completed", cr, peer, completed, "completed",
      [](const compcntr::credit_tracker& t, std::uint32_t p) { return t.completed(p); });
}

int compcntr_credits_window(struct compcntr_credits* cr, uint32_t peer, uint64_t* window) {
  return peer_count("credits_window", cr, peer, window, "window",
                    [](const compcntr::credit_tracker& t, std::uint32_t p) { return t.window(p); });
}

int compcntr_credits_acquire(struct compcntr_credits* cr, uint32_t peer, uint64_t n,
                             int timeout_ms) {
  return acquire_impl("credits_acquire", cr, peer, n, timeout_ms, nullptr);
}

int compcntr_credits_acquire_ex(struct compcntr_credits* cr, uint32_t peer, uint64_t n,
                                int timeout_ms, const struct compcntr_wait_attr* attr) {
  return acquire_impl("credits_acquire_ex", cr, peer, n, timeout_ms, attr);
}

int compcntr_credits_release(struct compcntr_credits* cr, uint32_t peer, uint64_t n) {
  if (!cr) return bad_cr("credits_release");
  return static_cast<int>(impl(cr)->cxx.release(peer, n));
}

int compcntr_credits_flush(struct compcntr_credits* cr, uint32_t peer, int timeout_ms) {
  return flush_impl("credits_flush", cr, peer, timeout_ms, nullptr);
}

int compcntr_credits_flush_ex(struct compcntr_credits* cr, uint32_t peer, int timeout_ms,
                              const struct compcntr_wait_attr* attr) {
  return flush_impl("credits_flush_ex", cr, peer, timeout_ms, attr);
}

int compcntr_credits_outstanding(struct compcntr_credits* cr, uint32_t peer,
                                 uint64_t* outstanding) {
  if (!cr) return bad_cr("credits_outstanding");
  if (!outstanding) return null_arg("credits_outstanding", "outstanding");
  return static_cast<int>(impl(cr)->cxx.outstanding(peer, *outstanding));
}

struct compcntr_comp_cntr* compcntr_credits_counter(struct compcntr_credits* cr, uint32_t peer) {
  if (!cr) return fail_null<compcntr_comp_cntr>(fail(EINVAL, "credits_counter: cr is NULL"));
  if (peer >= impl(cr)->npeers)
    return fail_null<compcntr_comp_cntr>(
        std::error_code(peer_range("credits_counter", cr, peer), std::generic_category()));
  return pub(impl(cr)->counters[peer]);
}

int compcntr_credits_destroy(struct compcntr_credits* cr) {
  if (!cr) return bad_cr("credits_destroy");
  delete impl(cr);
  return 0;
}

} // extern "C"
