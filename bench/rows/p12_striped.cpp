// P12: one logical counter updated by two threads: a striped counter (per-CPU stripes).
// Targets (performance.md): two threads incrementing one striped counter >= 0.9x the rate of two
// threads on two hand-padded raw atomics (what the machine allows when nothing is shared); a
// read of the striped counter <= stripes x one raw atomic load.
//
// What is timed:
//   * updates: P3's two-thread runner (bench::context::two_threads: thread A on the first CPU,
//     B on the second, released by one spin barrier, mean thread CPU time per increment,
//     samples where the two did not overlap re-run). compcntr: both threads add(1) to the same
//     striped counter. References: two 128-byte-padded raw atomics, one each (the target);
//     both threads on one shared raw atomic and on one plain (unstriped) compcntr counter (info:
//     what sharing one line costs, the case striping exists for).
//   * read: n back-to-back value() calls on the striped counter (one thread, thread CPU time),
//     against `stripes` x the time of one raw atomic load(acquire) (P1's loop), and, for
//     information, one pass summing `stripes` padded raw atomics.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "../harness.hpp"

import compcntr;

#include "common.hpp"

namespace {

using bench::rows::padded_atomic;
using bench::rows::add_loop;
using bench::rows::fetch_add_loop;

__attribute__((noinline)) void load_loop(const std::atomic<std::uint64_t>& a, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(a.load(std::memory_order_acquire));
}
__attribute__((noinline)) void read_loop(const compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(c.value());
}
__attribute__((noinline)) void sum_loop(const padded_atomic* a, std::uint32_t k, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t s = 0;
    for (std::uint32_t j = 0; j < k; ++j) s += a[j].v.load(std::memory_order_acquire);
    bench::keep(s);
  }
}

/// `r` with every sample (and statistic) multiplied by k: "k x one load".
bench::result scaled(bench::result r, double k, std::string name) {
  r.name = std::move(name);
  for (double& x : r.st.samples) x *= k;
  r.st.median *= k;
  r.st.q1 *= k;
  r.st.q3 *= k;
  r.st.min *= k;
  r.st.max *= k;
  return r;
}

void run(bench::context& ctx) {
  const bool two_cpus = bench::allowed_cpus().size() >= 2;
  const std::string why_cpus =
      "needs 2 CPUs, this process may use " + std::to_string(bench::allowed_cpus().size());
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter plain, striped;
  if (!ec) plain = dev.create_counter(compcntr::counter_type::wrs, ec);
  const std::string why_dev =
      ec ? "soft device/counter: " + std::string(compcntr::last_error_message()) : "";
  if (!ec)
    striped =
        dev.create_counter(compcntr::counter_options{.stripes = compcntr::stripes_per_cpu}, ec);
  const std::string why_striped =
      ec ? "striped counter: " + std::string(compcntr::last_error_message()) : "";
  // One stripe per CPU the system is configured for (rounded up to a power of two).
  const std::uint32_t stripes = striped ? striped.stripes() : 1;

  auto pair = [&](std::string name, auto fa, auto fb) {
    if (!two_cpus) return bench::unavailable_variant(std::move(name), why_cpus);
    bench::variant v;
    v.name = std::move(name);
    v.run = [&ctx, fa, fb](std::uint64_t n) { return ctx.two_threads(n, fa, fb); };
    v.notes["clock"] = "mean thread CPU time of the two threads";
    v.sample_ms = 2;
    return v;
  };
  // What each thread added to the striped counter over all samples (a thread's own variable,
  // read after the threads were joined).
  std::uint64_t added_a = 0, added_b = 0;
  auto padded = std::make_unique<padded_atomic[]>(2);
  auto shared = std::make_unique<padded_atomic>();
  const auto before = ctx.pair_stats;
  auto r = ctx.measure({
      why_striped.empty()
          ? pair(
                "two threads, one striped compcntr counter, add(1)",
                [&](std::uint64_t n) {
                  add_loop(striped, n);
                  added_a += n;
                },
                [&](std::uint64_t n) {
                  add_loop(striped, n);
                  added_b += n;
                })
          : bench::unavailable_variant("two threads, one striped compcntr counter", why_striped),
      pair(
          "two threads, two 128-byte-padded std::atomic, fetch_add(1)",
          [p = &padded[0].v](std::uint64_t n) { fetch_add_loop(*p, n); },
          [p = &padded[1].v](std::uint64_t n) { fetch_add_loop(*p, n); }),
      pair(
          "two threads, one shared std::atomic, fetch_add(1)",
          [p = &shared->v](std::uint64_t n) { fetch_add_loop(*p, n); },
          [p = &shared->v](std::uint64_t n) { fetch_add_loop(*p, n); }),
      why_dev.empty()
          ? pair(
                "two threads, one plain compcntr counter, add(1)",
                [&](std::uint64_t n) { add_loop(plain, n); },
                [&](std::uint64_t n) { add_loop(plain, n); })
          : bench::unavailable_variant("two threads, one plain compcntr counter", why_dev),
  });
  for (auto& x : r) x.unit = "ns/inc";
  const auto& after = ctx.pair_stats;
  char overlap[200];
  std::snprintf(overlap, sizeof overlap,
                "%llu two-thread samples took %llu re-runs; %llu kept below %.0f%% overlap",
                static_cast<unsigned long long>(after.samples - before.samples),
                static_cast<unsigned long long>(after.retries - before.retries),
                static_cast<unsigned long long>(after.low_overlap - before.low_overlap),
                bench::context::min_overlap * 100);

  auto raw = std::make_unique<padded_atomic[]>(stripes);
  // Exactness at quiescence, checked once (tests/core/striped_test.cpp checks it under TSan): both
  // threads' increments of every sample are in the striped counter.
  const bool exact = !striped || striped.value() == added_a + added_b;
  auto rr = ctx.measure({
      why_striped.empty()
          ? bench::timed("striped counter value()", [&](std::uint64_t n) { read_loop(striped, n); })
          : bench::unavailable_variant("striped counter value()", why_striped),
      bench::timed("std::atomic<uint64_t>::load(acquire)",
                   [a = &raw[0].v](std::uint64_t n) { load_loop(*a, n); }),
      bench::timed("sum of " + std::to_string(stripes) + " padded std::atomic loads",
                   [a = raw.get(), stripes](std::uint64_t n) { sum_loop(a, stripes, n); }),
  });
  const std::string k = std::to_string(stripes);
  const bench::result k_loads =
      rr[1].available ? scaled(rr[1], stripes, k + " x std::atomic load(acquire)") : rr[1];

  using bench::goal;
  ctx.add(bench::compare("P12", "2 threads, 1 striped counter vs 2 padded atomics", r[0], r[1],
                         goal::speedup_at_least, 0.9, overlap));
  if (!exact)
    ctx.add(bench::absolute("P12", "striped counter lost increments",
                            bench::result::unavailable(
                                "striped counter", "value() " + std::to_string(striped.value()) +
                                                       " != " + std::to_string(added_a + added_b) +
                                                       " increments made")));
  ctx.add(bench::compare("P12", "2 threads, 1 striped counter vs 1 shared atomic", r[0], r[2]));
  ctx.add(bench::compare("P12", "2 threads, 1 striped counter vs 1 plain counter", r[0], r[3]));
  ctx.add(bench::compare("P12", "striped read vs " + k + " x a raw load", rr[0], k_loads,
                         goal::ratio_at_most, 1.0, "stripes = " + k));
  ctx.add(bench::compare("P12", "striped read vs sum of " + k + " raw loads", rr[0], rr[2]));
}

} // namespace

COMPCNTR_BENCH_ROW("P12",
                   "one striped counter, two threads, vs padded raw atomics; striped read cost",
                   run);
