// compcntr libfabric integration, C++ half: bind a compcntr::counter to a CQ bridge and wait on
// it while the waiter drives the CQ. Library libcompcntr-fabric (pkg-config compcntr-fabric);
// reference docs/fabric.md. Everything of <compcntr/fabric.h> is usable from C++ as well.
//
// Example:
//     import compcntr;
//     #include <compcntr/fabric.hpp>
//     auto recvd = dev.create_counter(compcntr::counter_type::wrs, ec);
//     compcntr_fi_bridge* br = compcntr_fi_bridge_open(cq);
//     compcntr::fabric::bind(br, dev, recvd, FI_RECV);          // the bridge keeps it alive
//     ... post receives ...
//     compcntr::wait(recvd, n, 1s, compcntr::fabric::progress_options(br));  // drives the CQ
//     compcntr_fi_bridge_close(br);
#ifndef COMPCNTR_FABRIC_HPP
#define COMPCNTR_FABRIC_HPP

#include <compcntr/fabric.h>

#include <cstdint>

import compcntr;

namespace compcntr::fabric {

/// compcntr_fi_bridge_bind for a C++ counter, reached through `ref`: the bridge holds the
/// reference until it is closed, so the counter stays alive while bound (its owner's
/// destroy(ec) is EBUSY meanwhile; its reset() leaves the slot to the bridge). Returns 0 or the
/// errno values of compcntr_fi_bridge_bind (EINVAL also for an empty ref).
int bind(compcntr_fi_bridge* br, compcntr::counter_ref ref, std::uint64_t flags) noexcept;

/// bind() through dev.resolve(c.id()). EINVAL for an empty counter or one that is not
/// `dev`'s.
int bind(compcntr_fi_bridge* br, const compcntr::device& dev, compcntr::counter_view c,
         std::uint64_t flags) noexcept;

/// `o` with `br` as its drive function: a compcntr::wait / poll_any with these options drains
/// the bridge's CQ before every check (and sleeps at most o.drive_interval at a time).
inline compcntr::wait_options progress_options(compcntr_fi_bridge* br,
                                               compcntr::wait_options o = {}) noexcept {
  o.drive = compcntr_fi_bridge_progress_fn;
  o.drive_ctx = br;
  return o;
}

} // namespace compcntr::fabric

#endif
