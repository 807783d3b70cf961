// C1: the credit tracker (docs/credits.md) beside what a runtime would write without it.
// No performance target (bench/README.md): every line is information (goal::info), so a reader can see what
// thread-safe admission costs over the MPICH-style single-threaded pattern, and over the same
// algorithm on raw atomics.
//
// What is timed:
//   * one thread, uncontended: n pairs of "take one credit, complete it". compcntr:
//     credit_tracker::try_acquire(0, 1) then counter::add(1) on the peer's counter (what the
//     device does when the operation completes). References on 128-byte padded raw atomics:
//       - the tracker's algorithm by hand: acquire-load completed, load issued, CAS issued,
//         fetch_add completed (the same atomics, none of the API);
//       - the MPICH pattern: a plain (non-atomic) issued count compared with the completion
//         counter, as a runtime that admits from one thread only writes it.
//   * two threads, pipelined: thread A takes n credits one at a time (4 credits per peer, a
//     blocking acquire that spins, never sleeps); thread B completes each one as soon as it is
//     issued. ns per credit per thread (mean thread CPU time; both threads spin). The reference
//     runs the same protocol on raw atomics (A: check and CAS issued; B: wait for issued, then
//     fetch_add completed).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include "../harness.hpp"

import compcntr;

#include "common.hpp"

namespace {

using bench::rows::padded_atomic;

constexpr std::uint64_t credits = 4;

/// The tracker's fast path by hand, on two padded atomics.
struct raw_credits {
  padded_atomic issued, completed;
  inline bool try_take() noexcept {
    const std::uint64_t done = completed.v.load(std::memory_order_acquire);
    std::uint64_t i = issued.v.load(std::memory_order_relaxed);
    for (;;) {
      if (i - done + 1 > credits) return false;
      if (issued.v.compare_exchange_weak(i, i + 1, std::memory_order_relaxed)) return true;
    }
  }
};

__attribute__((noinline)) void tracker_pairs(compcntr::credit_tracker& tr, compcntr::counter& c,
                                             std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (tr.try_acquire(0, 1) != std::errc{}) [[unlikely]]
      return; // cannot happen: 1 in flight
    c.add(1);
  }
}
__attribute__((noinline)) void raw_pairs(raw_credits& r, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (!r.try_take()) [[unlikely]]
      return;
    r.completed.v.fetch_add(1);
  }
}
/// MPICH style: the issued count is the runtime's own plain variable (one admitting thread).
__attribute__((noinline)) void mpich_pairs(std::uint64_t& issued, std::atomic<std::uint64_t>& done,
                                           std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (issued - done.load(std::memory_order_acquire) + 1 > credits) [[unlikely]]
      return;
    ++issued;
    done.fetch_add(1);
  }
}

/// Spins until `a` >= target (the completer's side of the two-thread variants).
inline void spin_until(const std::atomic<std::uint64_t>& a, std::uint64_t target) noexcept {
  while (a.load(std::memory_order_acquire) < target) __builtin_ia32_pause();
}

void run(bench::context& ctx) {
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter c;
  if (!ec) c = dev.create_counter(compcntr::counter_type::wrs, ec);
  compcntr::counter* peers[] = {&c};
  compcntr::credit_tracker tr;
  if (!ec) tr = compcntr::credit_tracker::adopt(dev, peers, credits, ec);
  const std::string why =
      ec ? "soft device/counter/tracker: " + std::string(compcntr::last_error_message()) : "";
  auto raw = std::make_unique<raw_credits>();
  auto mpich_done = std::make_unique<padded_atomic>();
  std::uint64_t mpich_issued = 0;
  bench::escape(raw.get());
  bench::escape(mpich_done.get());

  const std::string one_name = "try_acquire(1) + add(1), one thread";
  auto one = why.empty() ? bench::timed(one_name, [&](std::uint64_t n) { tracker_pairs(tr, c, n); })
                         : bench::unavailable_variant(one_name, why);

  // Two threads: A acquires (blocking, spin only), B completes what A issued.
  const bool two_cpus = bench::allowed_cpus().size() >= 2;
  auto pair = [&](std::string name, auto fa, auto fb) {
    if (!two_cpus) return bench::unavailable_variant(std::move(name), "needs 2 CPUs");
    bench::variant v;
    v.name = std::move(name);
    v.run = [&ctx, fa, fb](std::uint64_t n) { return ctx.two_threads(n, fa, fb); };
    v.notes["clock"] = "mean thread CPU time of the two threads";
    v.sample_ms = 2;
    return v;
  };
  const compcntr::wait_options spin{.spin = compcntr::spin_forever};
  const std::string two_name = "acquire(1) + completer thread, 4 credits, spin";
  bench::variant two =
      !why.empty() ? bench::unavailable_variant(two_name, why)
                   : pair(
                         two_name,
                         [&](std::uint64_t n) {
                           for (std::uint64_t i = 0; i < n; ++i)
                             if (tr.acquire(0, 1, compcntr::wait_forever, spin) != std::errc{})
                               return;
                         },
                         [&](std::uint64_t n) {
                           // Complete exactly what this sample's acquirer issues, as soon as it is issued.
                           const std::uint64_t base = c.value();
                           for (std::uint64_t i = 1; i <= n; ++i) {
                             while (tr.issued(0) - base < i) __builtin_ia32_pause();
                             c.add(1);
                           }
                         });
  auto r = ctx.measure({
      one,
      bench::timed("raw atomics, same algorithm, one thread",
                   [&](std::uint64_t n) { raw_pairs(*raw, n); }),
      bench::timed("MPICH pattern: plain issued count + atomic completions, one thread",
                   [&](std::uint64_t n) { mpich_pairs(mpich_issued, mpich_done->v, n); }),
      two,
      pair(
          "raw atomics, same protocol, completer thread",
          [&](std::uint64_t n) {
            for (std::uint64_t i = 0; i < n; ++i)
              while (!raw->try_take()) __builtin_ia32_pause();
          },
          [&](std::uint64_t n) {
            const std::uint64_t base = raw->completed.v.load(std::memory_order_relaxed);
            for (std::uint64_t i = 1; i <= n; ++i) {
              spin_until(raw->issued.v, base + i);
              raw->completed.v.fetch_add(1);
            }
          }),
  });
  for (auto& x : r) x.unit = "ns/credit";
  bench::keep(mpich_issued);
  ctx.add(bench::compare("C1", "credits, 1 thread: tracker vs same algorithm on raw atomics", r[0],
                         r[1]));
  ctx.add(
      bench::compare("C1", "credits, 1 thread: tracker vs MPICH plain issued count", r[0], r[2]));
  ctx.add(bench::compare("C1", "credits, 2 threads: tracker vs raw atomics", r[3], r[4]));
}

} // namespace

COMPCNTR_BENCH_ROW("C1",
                   "credit tracker (no spec target): admission + completion vs raw atomics "
                   "and the MPICH pattern",
                   run);
