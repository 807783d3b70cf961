// The C API of credit tracking (include/compcntr/credits.h) over compcntr::credit_tracker.
//
// Ownership: the tracker creates one real C counter (c_counter, as compcntr_create_comp_cntr
// makes) per peer and owns it; compcntr_credits_counter hands out its public struct. The
// C++ tracker adopts the counters (it reads and waits on them, release adds to them). To keep
// compcntr_destroy_comp_cntr on such a pointer from freeing a counter the tracker still uses,
// the tracker also holds a counter_ref on each: destroy then sees a reference besides the
// owner's and answers EBUSY, the counter staying usable. compcntr_credits_destroy drops the
// refs and destroys the counters (reset(): one still attached to a live QP lives on until that
// QP goes).
#include <compcntr/compcntr.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <system_error>

import compcntr;

#include "internal.hpp"

using namespace compcntr::c_api;
using compcntr::detail::fail;

struct compcntr_credits {
  compcntr::credit_tracker cxx;  // emptied first by the destructor: it stops using the counters
  std::uint32_t npeers = 0;
  std::unique_ptr<c_counter*[]> counters;        // owned, one per peer
  std::unique_ptr<compcntr::counter_ref[]> pins;  // keep destroy_comp_cntr EBUSY

  ~compcntr_credits() {
    cxx = compcntr::credit_tracker{};  // stops using the counters first
    for (std::uint32_t i = 0; i < npeers; ++i) {
      if (pins) pins[i].reset();
      if (counters && counters[i]) {
        counters[i]->cxx.reset();  // attached to a live QP: the slot lives on with the QP
        delete counters[i];
      }
    }
  }
};

namespace {

int bad_cr(const char* call) noexcept { return null_arg(call, "cr"); }

int acquire_impl(const char* call, compcntr_credits* cr, std::uint32_t peer, std::uint64_t n,
                 int timeout_ms, const compcntr_wait_attr* attr) noexcept {
  if (!cr) return bad_cr(call);
  compcntr::wait_options o;
  if (const int err = wait_attr_options(call, attr, o)) return err;
  return static_cast<int>(cr->cxx.acquire(peer, n, std::chrono::milliseconds(timeout_ms), o));
}

int flush_impl(const char* call, compcntr_credits* cr, std::uint32_t peer, int timeout_ms,
               const compcntr_wait_attr* attr) noexcept {
  if (!cr) return bad_cr(call);
  compcntr::wait_options o;
  if (const int err = wait_attr_options(call, attr, o)) return err;
  return static_cast<int>(cr->cxx.flush(peer, std::chrono::milliseconds(timeout_ms), o));
}

int peer_range(const char* call, const compcntr_credits* cr, std::uint32_t peer) noexcept {
  return fail(EINVAL, "%s: peer %u out of range (%u peers)", call, peer, cr->npeers).value();
}

}  // namespace

extern "C" {

struct compcntr_credits* compcntr_credits_create(struct compcntr_device* dev, uint32_t npeers,
                                                 uint64_t credits_per_peer) {
  if (!dev) return fail_null<compcntr_credits>(fail(EINVAL, "credits_create: dev is NULL"));
  std::unique_ptr<compcntr_credits> cr(new (std::nothrow) compcntr_credits{});
  if (!cr) return fail_null<compcntr_credits>(fail(ENOMEM, "credits_create: out of memory"));
  std::error_code ec;
  if (compcntr::detail::check_credit_shape("credits_create", dev->dev, npeers, credits_per_peer,
                                           ec) == 0)
    return fail_null<compcntr_credits>(ec);
  const compcntr::counter_caps caps = dev->dev.caps();
  const std::uint32_t room =
      caps.max_counters - std::min(caps.max_counters, dev->dev.live_counters());
  if (npeers > room)
    return fail_null<compcntr_credits>(fail(ENOMEM, "credits_create: %u peers need %u counters, "
                                            "the device has room for %u more", npeers, npeers,
                                            room));
  cr->counters.reset(new (std::nothrow) c_counter*[npeers]());
  cr->pins.reset(new (std::nothrow) compcntr::counter_ref[npeers]);
  std::unique_ptr<compcntr::counter*[]> cxx(new (std::nothrow) compcntr::counter*[npeers]);
  if (!cr->counters || !cr->pins || !cxx)
    return fail_null<compcntr_credits>(
        fail(ENOMEM, "credits_create: out of memory for %u peers", npeers));
  cr->npeers = npeers;  // from here on the destructor cleans up whatever exists
  // Undoes everything before setting errno (a destructor must not clobber it).
  auto undo = [&](std::error_code e) {
    cr.reset();
    return fail_null<compcntr_credits>(e);
  };
  for (std::uint32_t i = 0; i < npeers; ++i) {
    auto* c = new (std::nothrow) c_counter{};
    if (!c) return undo(fail(ENOMEM, "credits_create: out of memory"));
    cr->counters[i] = c;
    c->cxx = dev->dev.create_counter(compcntr::counter_type::wrs, ec);
    if (ec) return undo(ec);
    c->pub.context = dev;
    c->pub.handle = c->cxx.index();
    cr->pins[i] = dev->dev.resolve(c->cxx.id(), ec);
    if (ec) return undo(ec);
    cxx[i] = &c->cxx;
  }
  cr->cxx = compcntr::credit_tracker::adopt(dev->dev, {cxx.get(), npeers}, credits_per_peer, ec);
  if (ec) return undo(ec);
  return cr.release();
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
  return static_cast<int>(cr->cxx.release(peer, n));
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
  return static_cast<int>(cr->cxx.outstanding(peer, *outstanding));
}

struct compcntr_comp_cntr* compcntr_credits_counter(struct compcntr_credits* cr, uint32_t peer) {
  if (!cr) return fail_null<compcntr_comp_cntr>(fail(EINVAL, "credits_counter: cr is NULL"));
  if (peer >= cr->npeers)
    return fail_null<compcntr_comp_cntr>(std::error_code(peer_range("credits_counter", cr, peer),
                                                         std::generic_category()));
  return &cr->counters[peer]->pub;
}

int compcntr_credits_destroy(struct compcntr_credits* cr) {
  if (!cr) return bad_cr("credits_destroy");
  delete cr;
  return 0;
}

}  // extern "C"
