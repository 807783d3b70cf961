// P11: the C API's data path, from a C translation unit compiled as a user compiles it.
// Targets (performance.md): C read, inc and inc_err within 1.1x of the C++ calls (value(),
// add(1), add_error(1)) and of raw atomics (C11 atomic_load(acquire), atomic_fetch_add); a C
// wait whose threshold is already reached within 1.2x of a C read.
//
// What is timed: the loops of rows/p11_c_loops.c -- a C file (C11, the C compiler, only
// <compcntr/compcntr.h>, linked against the shared libcompcntr like any C program) -- n
// back-to-back calls on one counter of the software device, one thread, thread CPU time, every
// return value checked as careful C code does. The C++ side runs the same loops in C++ over
// `import compcntr;` (P1/P2's loops), the raw side the same loops in C over a 128-byte aligned
// _Atomic uint64_t. All interleaved in one measure() (see README: paired samples).
#include <compcntr/compcntr.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include "../harness.hpp"

import compcntr;

#include "common.hpp"
#include "p11_c_loops.h"

namespace {

using bench::rows::padded_atomic;
using namespace std::chrono_literals;

__attribute__((noinline)) void cxx_read(const compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(c.value());
}
__attribute__((noinline)) void cxx_add(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add(1);
}
__attribute__((noinline)) void cxx_add_error(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add_error(1);
}
__attribute__((noinline)) void cxx_wait_satisfied(const compcntr::counter& c,
                                                  std::uint64_t threshold, std::uint64_t n,
                                                  std::uint64_t& failures) {
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    if (compcntr::wait(c, threshold, 1000ms) != std::errc{}) ++bad;
  failures += bad;
}

void run(bench::context& ctx) {
  std::string why;
  compcntr_device* cdev = compcntr_open_device("soft");
  compcntr_comp_cntr* cc = nullptr;
  if (!cdev) {
    why = "compcntr_open_device(soft): " + std::string(compcntr_last_error_message());
  } else {
    compcntr_comp_cntr_init_attr attr{};
    cc = compcntr_create_comp_cntr(cdev, &attr);
    if (!cc) why = "compcntr_create_comp_cntr: " + std::string(compcntr_last_error_message());
  }
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter c;
  if (!ec) c = dev.create_counter(compcntr::counter_type::wrs, ec);
  const std::string cxx_why =
      ec ? "soft device/counter: " + std::string(compcntr::last_error_message()) : "";
  // A reached threshold for the waits: both counters start above it and only grow.
  constexpr std::uint64_t threshold = 1;
  if (cc) compcntr_set_comp_cntr(cc, 42);
  if (c) c.set(42);
  auto raw_load = std::make_unique<padded_atomic>();
  auto raw_add = std::make_unique<padded_atomic>();
  raw_load->v.store(42);

  std::uint64_t failures = 0;  // non-zero returns inside the timed loops
  auto c_variant = [&](std::string name, auto body) {
    return cc ? bench::timed(std::move(name), body)
              : bench::unavailable_variant(std::move(name), why);
  };
  auto cxx_variant = [&](std::string name, auto body) {
    return c ? bench::timed(std::move(name), body)
             : bench::unavailable_variant(std::move(name), cxx_why);
  };
  auto r = ctx.measure({
      c_variant("C compcntr_read_comp_cntr",
                [&](std::uint64_t n) { p11_c_read(cc, n, &failures); }),
      cxx_variant("C++ counter::value()", [&](std::uint64_t n) { cxx_read(c, n); }),
      bench::timed("C atomic_load_explicit(acquire)",
                   [a = &raw_load->v](std::uint64_t n) { p11_c_raw_load(a, n); }),
      c_variant("C compcntr_inc_comp_cntr(1)",
                [&](std::uint64_t n) { p11_c_inc(cc, n, &failures); }),
      cxx_variant("C++ counter::add(1)", [&](std::uint64_t n) { cxx_add(c, n); }),
      bench::timed("C atomic_fetch_add(1)",
                   [a = &raw_add->v](std::uint64_t n) { p11_c_raw_fetch_add(a, n); }),
      c_variant("C compcntr_inc_err_comp_cntr(1)",
                [&](std::uint64_t n) { p11_c_inc_err(cc, n, &failures); }),
      cxx_variant("C++ counter::add_error(1)", [&](std::uint64_t n) { cxx_add_error(c, n); }),
      c_variant("C compcntr_wait_comp_cntr, threshold reached",
                [&](std::uint64_t n) { p11_c_wait_satisfied(cc, threshold, n, &failures); }),
      cxx_variant("C++ compcntr::wait, threshold reached",
                  [&](std::uint64_t n) { cxx_wait_satisfied(c, threshold, n, failures); }),
  });
  if (failures != 0) {
    const std::string f = std::to_string(failures) + " calls in the timed loops returned an error";
    for (auto& x : r) x = bench::result::unavailable(x.name, f, x.unit);
  }
  if (cc) compcntr_destroy_comp_cntr(cc);
  if (cdev) compcntr_close_device(cdev);

  using bench::goal;
  ctx.add(bench::compare("P11", "C read vs C++ value()", r[0], r[1], goal::ratio_at_most, 1.1));
  ctx.add(bench::compare("P11", "C read vs raw atomic load", r[0], r[2], goal::ratio_at_most, 1.1));
  ctx.add(bench::compare("P11", "C inc vs C++ add(1)", r[3], r[4], goal::ratio_at_most, 1.1));
  ctx.add(bench::compare("P11", "C inc vs raw fetch_add", r[3], r[5], goal::ratio_at_most, 1.1));
  ctx.add(
      bench::compare("P11", "C inc_err vs C++ add_error(1)", r[6], r[7], goal::ratio_at_most, 1.1));
  ctx.add(
      bench::compare("P11", "C inc_err vs raw fetch_add", r[6], r[5], goal::ratio_at_most, 1.1));
  ctx.add(bench::compare("P11", "C wait, reached threshold, vs C read", r[8], r[0],
                         goal::ratio_at_most, 1.2));
  ctx.add(bench::compare("P11", "C wait, reached threshold, vs C++ wait", r[8], r[9]));
}

} // namespace

COMPCNTR_BENCH_ROW(
    "P11",
    "C API from a C translation unit: read, inc, inc_err, satisfied wait vs C++ and raw atomics",
    run);
