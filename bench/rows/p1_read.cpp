// P1: counter read (the completion value).
// Target: within 1.5x of a raw atomic load; >= 50x faster than fi_cntr_read of a counter bound to
// a tcp;ofi_rxm endpoint. Also shown (no target): fi_cntr_read with no endpoint bound, and
// endpoint-bound on udp;ofi_rxd and shm -- the other references of the spec table.
//
// What is timed: n back-to-back reads whose results are consumed (bench::keep), i.e. read
// throughput on a counter nobody else writes (its line stays in L1, as for a poller between
// completions). compcntr::counter::value() is an acquire load through the handle's slot pointer;
// the reference is std::atomic<uint64_t>::load(acquire) on a 128-byte aligned atomic.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include "../fabric.hpp"
#include "../harness.hpp"

import compcntr;

#include "common.hpp"

namespace {

using bench::rows::padded_atomic;

// The timed loops take the counter / the atomic by reference, as application code holding a
// counter (or an atomic) in some object does; noinline keeps each loop's code independent of
// the harness around it.
__attribute__((noinline)) void read_loop(const compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(c.value());
}
__attribute__((noinline)) void load_loop(const std::atomic<std::uint64_t>& a, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(a.load(std::memory_order_acquire));
}

void run(bench::context& ctx) {
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter c;
  if (!ec) c = dev.create_counter(compcntr::counter_type::wrs, ec);
  const std::string cc_name = "compcntr::counter::value()";
  bench::variant cc =
      ec ? bench::unavailable_variant(
               cc_name, "soft device/counter: " + std::string(compcntr::last_error_message()))
         : bench::timed(cc_name, [&c](std::uint64_t n) { read_loop(c, n); });
  if (c) c.add(42);
  auto raw = std::make_unique<padded_atomic>();
  raw->v.store(42);
  bench::escape(raw.get());

  using bench::fabric::which;
  auto r = ctx.measure({
      cc,
      bench::timed("std::atomic<uint64_t>::load(acquire)",
                   [a = &raw->v](std::uint64_t n) { load_loop(*a, n); }),
      bench::fabric::read_variant("fi_cntr_read, tcp;ofi_rxm, endpoint bound", "tcp;ofi_rxm",
                                  which::bound),
      bench::fabric::read_variant("fi_cntr_read, tcp;ofi_rxm, no endpoint bound", "tcp;ofi_rxm",
                                  which::unbound),
      bench::fabric::read_variant("fi_cntr_read, udp;ofi_rxd, endpoint bound", "udp;ofi_rxd",
                                  which::bound),
      bench::fabric::read_variant("fi_cntr_read, shm, endpoint bound", "shm", which::bound),
  });
  ctx.add(bench::compare("P1", "read: value() vs atomic load(acquire)", r[0], r[1],
                         bench::goal::ratio_at_most, 1.5));
  ctx.add(bench::compare("P1", "read: value() vs fi_cntr_read tcp;ofi_rxm bound", r[0], r[2],
                         bench::goal::speedup_at_least, 50));
  ctx.add(bench::compare("P1", "read: value() vs fi_cntr_read no ep bound", r[0], r[3]));
  ctx.add(bench::compare("P1", "read: value() vs fi_cntr_read udp;ofi_rxd bound", r[0], r[4]));
  ctx.add(bench::compare("P1", "read: value() vs fi_cntr_read shm bound", r[0], r[5]));
}

} // namespace

COMPCNTR_BENCH_ROW("P1", "counter read vs raw atomic load and libfabric fi_cntr_read", run);
