// The compcntr module: lock-free completion counters for HPC runtimes.
//
//     import compcntr;
//     std::error_code ec;
//     auto dev = compcntr::device::open("soft", ec);
//     auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
//     c.add();
//
// Partitions, bottom up (a unit imports only units listed before it; docs/architecture.md):
//   core (modules/core/): cache_padded, error, types, backoff, slot (memory ordering), lifetime
//     (refs, pins, generation, the free path), pool (where slots live), backend (the device
//     seam and the device core), counter (counter, counter_view), counter_ref (resolved ids),
//     device, wait (wait, poll_any, pollable fds), trigger (actions at a threshold);
//   features (modules/features/): mr (registered memory), qp (queue pairs, attach), cmd_comp
//     (asynchronous command completion), refresher (mirrors of device-held counters), credits
//     (per-peer credit tracking for MPI runtimes), tracker (issued vs completed one-sided
//     operations: quiet).
module;
#include <string_view>
export module compcntr;
export import :cache_padded;
export import :error;
export import :types;
export import :backoff;
export import :slot;
export import :lifetime;
export import :pool;
export import :shared;
export import :backend;
export import :counter;
export import :counter_ref;
export import :device;
export import :wait;
export import :trigger;
export import :mr;
export import :qp;
export import :cmd_comp;
export import :refresher;
export import :credits;
export import :tracker;

export namespace compcntr {

/// The version of the compcntr library the program runs with, e.g. "0.1.0": the project
/// version of meson.build, the same string as compcntr_version() and COMPCNTR_VERSION_STRING
/// (<compcntr/version.h>, the headers' version). A static string (NUL-terminated).
std::string_view version() noexcept;

} // namespace compcntr
