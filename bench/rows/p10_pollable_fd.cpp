// P10: increment while a pollable fd exists but nobody is armed on it.
// Target: within 1.15x of P2 (counter::add(1) on a counter without an fd).
//
// What is timed: the loop of P2 (n back-to-back counter::add(1), one thread, thread CPU time) on
// a counter whose pollable fd was created once with compcntr::pollable_fd() and never armed,
// side by side with the same loop on a counter of the same device that has no fd. Shown without
// a target: std::atomic<uint64_t>::fetch_add(1), as in P2. An fd that is not armed leaves the
// slot's watch word 0, so add() should stay one locked RMW plus one load of that word.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

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
  compcntr::counter with_fd, plain;
  if (!ec) with_fd = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (!ec) plain = dev.create_counter(compcntr::counter_type::wrs, ec);
  std::string why = ec ? "soft device/counter: " + std::string(compcntr::last_error_message()) : "";
  int fd = -1;
  if (why.empty()) {
    fd = compcntr::pollable_fd(with_fd, ec);
    if (fd < 0 || ec) why = "pollable_fd: " + std::string(compcntr::last_error_message());
  }
  const std::string cc_name = "counter::add(1), pollable fd created, not armed";
  const std::string p2_name = "counter::add(1), no fd (P2)";
  bench::variant cc = !why.empty()
                          ? bench::unavailable_variant(cc_name, why)
                          : bench::timed(cc_name, [&](std::uint64_t n) { add_loop(with_fd, n); });
  bench::variant p2 = !why.empty()
                          ? bench::unavailable_variant(p2_name, why)
                          : bench::timed(p2_name, [&](std::uint64_t n) { add_loop(plain, n); });
  if (fd >= 0) cc.notes["fd"] = std::to_string(fd);
  auto raw = std::make_unique<padded_atomic>();
  bench::escape(raw.get());
  auto r = ctx.measure({
      cc,
      p2,
      bench::timed("std::atomic<uint64_t>::fetch_add(1)",
                   [a = &raw->v](std::uint64_t n) { fetch_add_loop(*a, n); }),
  });
  ctx.add(bench::compare("P10", "add(1) with an unarmed pollable fd vs P2 add(1)", r[0], r[1],
                         bench::goal::ratio_at_most, 1.15));
  ctx.add(bench::compare("P10", "add(1) with an unarmed pollable fd vs fetch_add", r[0], r[2]));
}

} // namespace

COMPCNTR_BENCH_ROW("P10", "increment with a pollable fd nobody armed, vs P2's plain add", run);
