// The compcntr module: lock-free completion counters for HPC runtimes.
//
//     import compcntr;
//     std::error_code ec;
//     auto dev = compcntr::device::open("soft", ec);
//     auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
//     c.add();
//
// Partitions, bottom up: cache_padded, error, types, backoff (spin, yield, block), slot (memory
// ordering), pool (where slots live), backend (device interface), counter, counter_ref
// (handles), mr (registered memory), qp (queue pairs, attach), device, wait (wait, poll_any,
// pollable fds), cmd_comp (asynchronous command completion), refresher (mirrors of
// device-held counters), credits (per-peer credit tracking for MPI runtimes). See
// docs/architecture.md.
export module compcntr;
export import :cache_padded;
export import :error;
export import :types;
export import :backoff;
export import :slot;
export import :lifetime;
export import :pool;
export import :backend;
export import :counter;
export import :counter_ref;
export import :device;
export import :wait;
export import :mr;
export import :qp;
export import :cmd_comp;
export import :refresher;
export import :credits;
