// P2: software increment, one thread.
// Target: within 1.15x of raw fetch_add; faster than libfabric's fi_cntr_add (tcp;ofi_rxm
// counter bound to an endpoint). fi_cntr_add on udp;ofi_rxd and shm counters is shown (no target).
//
// What is timed: n back-to-back counter::add(1) on the software device, one thread, nobody else
// touching the line. The reference is std::atomic<uint64_t>::fetch_add(1) with the default
// (seq_cst) order on a 128-byte aligned atomic -- the same `lock xadd` on x86-64.
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
using bench::rows::add_loop;
using bench::rows::fetch_add_loop;

void run(bench::context& ctx) {
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter c;
  if (!ec) c = dev.create_counter(compcntr::counter_type::wrs, ec);
  const std::string cc_name = "compcntr::counter::add(1)";
  bench::variant cc =
      ec ? bench::unavailable_variant(
               cc_name, "soft device/counter: " + std::string(compcntr::last_error_message()))
         : bench::timed(cc_name, [&c](std::uint64_t n) { add_loop(c, n); });
  auto raw = std::make_unique<padded_atomic>();
  bench::escape(raw.get());

  using bench::fabric::which;
  auto r = ctx.measure({
      cc,
      bench::timed("std::atomic<uint64_t>::fetch_add(1)",
                   [a = &raw->v](std::uint64_t n) { fetch_add_loop(*a, n); }),
      bench::fabric::add_variant("fi_cntr_add, tcp;ofi_rxm, endpoint bound", "tcp;ofi_rxm",
                                 which::bound),
      bench::fabric::add_variant("fi_cntr_add, udp;ofi_rxd, endpoint bound", "udp;ofi_rxd",
                                 which::bound),
      bench::fabric::add_variant("fi_cntr_add, shm, endpoint bound", "shm", which::bound),
  });
  bench::keep(raw->v.load());
  if (c) bench::keep(c.value());
  ctx.add(bench::compare("P2", "increment: add(1) vs atomic fetch_add", r[0], r[1],
                         bench::goal::ratio_at_most, 1.15));
  ctx.add(bench::compare("P2", "increment: add(1) vs fi_cntr_add tcp;ofi_rxm", r[0], r[2],
                         bench::goal::speedup_above, 1));
  ctx.add(bench::compare("P2", "increment: add(1) vs fi_cntr_add udp;ofi_rxd", r[0], r[3]));
  ctx.add(bench::compare("P2", "increment: add(1) vs fi_cntr_add shm", r[0], r[4]));
}

} // namespace

COMPCNTR_BENCH_ROW("P2", "software increment, one thread, vs raw fetch_add and fi_cntr_add", run);
