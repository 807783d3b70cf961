// P3: two threads, each incrementing its own counter.
// Targets: >= 0.9x the rate of two hand-padded raw atomics; against two adjacent unpadded
// atomics (false sharing), >= 0.85x of the same run's padded/adjacent ratio: padding cannot give
// more than the machine allows (3-10x on the VMs measured so far), so the target is a fraction
// of what two hand-padded atomics gain over adjacent ones in this very run. Also shown (no
// target): both threads on one shared atomic.
//
// What is timed: thread A pinned to the first CPU, thread B to the second, released together by a
// spin barrier; each does n increments on its own counter; a sample is the two threads' mean CPU
// time / n, i.e. ns per increment per thread (samples where the threads did not overlap are re-run,
// see bench::context::two_threads). The pool counters are two counters created one
// after the other from one software device, as a runtime would (one per thread).
#include <atomic>
#include <cstdint>
#include <cstdio>
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

struct unpadded_pair {
  alignas(128) std::atomic<std::uint64_t> a{0};
  std::atomic<std::uint64_t> b{0}; // 8 bytes after a: same cache line
};

// Each thread's loop: bench::rows::add_loop / fetch_add_loop (common.hpp), as in P2.

void run(bench::context& ctx) {
  const bool two_cpus = bench::allowed_cpus().size() >= 2;
  const std::string why_cpus =
      "needs 2 CPUs, this process may use " + std::to_string(bench::allowed_cpus().size());
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter c0, c1;
  if (!ec) c0 = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (!ec) c1 = dev.create_counter(compcntr::counter_type::wrs, ec);
  const std::string cc_name = "two threads, two compcntr pool counters, add(1)";
  auto pair = [&](std::string name, auto fa, auto fb) {
    if (!two_cpus) return bench::unavailable_variant(std::move(name), why_cpus);
    bench::variant v;
    v.name = std::move(name);
    v.run = [&ctx, fa, fb](std::uint64_t n) { return ctx.two_threads(n, fa, fb); };
    v.notes["clock"] = "mean thread CPU time of the two threads";
    v.sample_ms = 2; // short: a sample where no other process interrupts either thread is likely
    return v;
  };
  bench::variant cc =
      ec ? bench::unavailable_variant(
               cc_name, "soft device/counter: " + std::string(compcntr::last_error_message()))
         : pair(
               cc_name, [&c0](std::uint64_t n) { add_loop(c0, n); },
               [&c1](std::uint64_t n) { add_loop(c1, n); });
  auto padded = std::make_unique<padded_atomic[]>(2); // hand-padded: exactly 128 bytes apart
  auto adj = std::make_unique<unpadded_pair>();
  auto shared = std::make_unique<padded_atomic>();
  const auto before = ctx.pair_stats;
  auto r = ctx.measure({
      cc,
      pair(
          "two threads, two 128-byte-padded std::atomic, fetch_add(1)",
          [p = &padded[0].v](std::uint64_t n) { fetch_add_loop(*p, n); },
          [p = &padded[1].v](std::uint64_t n) { fetch_add_loop(*p, n); }),
      pair(
          "two threads, two adjacent unpadded std::atomic, fetch_add(1)",
          [p = &adj->a](std::uint64_t n) { fetch_add_loop(*p, n); },
          [p = &adj->b](std::uint64_t n) { fetch_add_loop(*p, n); }),
      pair(
          "two threads, one shared std::atomic, fetch_add(1)",
          [p = &shared->v](std::uint64_t n) { fetch_add_loop(*p, n); },
          [p = &shared->v](std::uint64_t n) { fetch_add_loop(*p, n); }),
  });
  for (auto& x : r) x.unit = "ns/inc";
  const auto& after = ctx.pair_stats;
  char overlap[200];
  std::snprintf(overlap, sizeof overlap,
                "%llu two-thread samples took %llu re-runs (another "
                "process kept a thread off its CPU); %llu kept below %.0f%% overlap",
                static_cast<unsigned long long>(after.samples - before.samples),
                static_cast<unsigned long long>(after.retries - before.retries),
                static_cast<unsigned long long>(after.low_overlap - before.low_overlap),
                bench::context::min_overlap * 100);
  ctx.add(bench::compare("P3", "2 threads: 2 pool counters vs 2 padded atomics", r[0], r[1],
                         bench::goal::speedup_at_least, 0.9, overlap));
  // How much padding alone can gain here: two padded raw atomics over two adjacent ones. The
  // target is 0.85x of that ceiling (performance.md); unmeasurable ceiling: the line is n/a.
  constexpr double share_of_ceiling = 0.85;
  double target = 0;
  std::string ceiling;
  if (r[1].available && r[2].available && r[1].st.median > 0) {
    char buf[200];
    const double most = r[2].st.median / r[1].st.median;
    target = share_of_ceiling * most;
    std::snprintf(buf, sizeof buf,
                  "in this run 2 padded raw atomics were %.2fx faster than 2 "
                  "adjacent ones (the most padding can give here); target %.2f x that = %.2fx",
                  most, share_of_ceiling, target);
    ceiling = buf;
  }
  ctx.add(bench::compare(
      "P3", "2 threads: 2 pool counters vs 2 adjacent atomics", r[0],
      target > 0
          ? r[2]
          : bench::result::unavailable(
                r[2].name, "no ceiling: padded or adjacent reference unavailable", r[2].unit),
      bench::goal::speedup_at_least, target, ceiling));
  ctx.add(bench::compare("P3", "2 threads: 2 pool counters vs 1 shared atomic", r[0], r[3]));
}

} // namespace

COMPCNTR_BENCH_ROW("P3", "two threads, two pool counters, vs padded and unpadded raw atomics", run);
