// P6: an idle waiter -- the counter completes 50 ms after the wait begins.
// Target: the waiter uses < 5% of one core (its thread CPU time / its wall time).
//
// What is measured: a waiter thread pinned to the second CPU calls compcntr::wait(c, v + 1, 2 s)
// with default options (5 us hot poll, backoff with a few yields, then FUTEX_WAIT); the main
// thread (first CPU) sleeps 50 ms from the moment the waiter is about to wait, then adds 1. One
// sample = 100 x the waiter's CPU time (CLOCK_THREAD_CPUTIME_ID, user + system) over its wall time
// from just before the call to just after it returned, in % of one core. No fresh process is
// needed: the CPU clock is the waiter thread's own. The waiter is a new thread per sample, so its
// CPU time also holds that thread's first touches of its stack (an upper bound for the wait).
// References (info only): fi_cntr_wait(c, v + 1, 2000 ms) on a FI_WAIT_UNSPEC counter bound to a
// tcp;ofi_rxm endpoint (util wait: sleeps in 50 ms slices, drives progress between them) and on
// shm (whose wait object FI_WAIT_UNSPEC resolves to a sched_yield loop), the main thread
// completing it with fi_cntr_add after the same 50 ms.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../fabric.hpp"
#include "../harness.hpp"

import compcntr;

namespace {

using namespace std::chrono_literals;

struct idle_tally {
  std::vector<double> cpu_us, wall_ms;
  std::string failure;
};

/// One sample: `wait_fn` on a pinned waiter thread, `complete` from this thread `delay` after
/// the waiter is about to wait. Returns the waiter's CPU time / wall time in %.
double idle_sample(const bench::context& ctx, std::chrono::microseconds delay,
                   const std::function<std::string()>& wait_fn,
                   const std::function<void()>& complete, idle_tally& t) {
  if (!t.failure.empty()) return 0;
  std::atomic<bool> about_to_wait{false};
  double cpu = 0, wall = 0;
  std::string why;
  std::thread w([&] {
    bench::pin_to(ctx.opt, 1);
    about_to_wait.store(true, std::memory_order_release);
    const auto t0 = bench::steady::now();
    const double c0 = bench::thread_cpu_ns();
    why = wait_fn();
    cpu = bench::thread_cpu_ns() - c0;
    wall = bench::ns_since(t0);
  });
  while (!about_to_wait.load(std::memory_order_acquire)) std::this_thread::yield();
  std::this_thread::sleep_for(delay);
  complete();
  w.join();
  if (!why.empty()) {
    t.failure = why;
    return 0;
  }
  t.cpu_us.push_back(cpu / 1e3);
  t.wall_ms.push_back(wall / 1e6);
  return wall > 0 ? 100 * cpu / wall : 0;
}

bench::variant idle_variant(const bench::context& ctx, std::string name,
                            std::chrono::microseconds delay, std::function<std::string()> wait_fn,
                            std::function<void()> complete, std::shared_ptr<idle_tally> t) {
  bench::variant v;
  v.name = std::move(name);
  v.unit = "% of a core";
  v.fixed_n = 1;  // one wait per sample; run() returns the percentage itself
  v.notes["clock"] = "waiter's thread CPU time / its wall time";
  v.run = [&ctx, delay, wait_fn = std::move(wait_fn), complete = std::move(complete),
           t](std::uint64_t) { return idle_sample(ctx, delay, wait_fn, complete, *t); };
  return v;
}

double median(std::vector<double> v) {
  return v.empty() ? 0 : bench::summarize(std::move(v)).median;
}

void finish(bench::result& r, const idle_tally& t) {
  if (!t.failure.empty()) {
    r = bench::result::unavailable(r.name, "waiter failed: " + t.failure, r.unit);
    return;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", median(t.cpu_us));
  r.notes["waiter_cpu_us_median"] = buf;
  std::snprintf(buf, sizeof buf, "%.2f", median(t.wall_ms));
  r.notes["waiter_wall_ms_median"] = buf;
}

std::string describe(const char* who, const bench::result& r) {
  if (!r.available) return "";
  return std::string(who) + ": waiter CPU " + r.notes.at("waiter_cpu_us_median") + " us over " +
         r.notes.at("waiter_wall_ms_median") + " ms (medians)";
}

bench::variant fabric_idle(const bench::context& ctx, const std::string& label,
                           const std::string& provider, std::chrono::microseconds delay,
                           std::shared_ptr<idle_tally> t) {
  std::string why;
  const auto* p = bench::fabric::get_wait_pair(provider, why);
  if (!p) return bench::unavailable_variant(label, why);
  fid_cntr* c = p->a;
  auto v = idle_variant(
      ctx, label, delay,
      [c]() -> std::string {
        const int ret = bench::fabric::cntr_wait(c, bench::fabric::cntr_read(c) + 1, 2000);
        return ret ? bench::fabric::error_text("fi_cntr_wait", ret) : "";
      },
      [c] { bench::fabric::cntr_add(c, 1); }, std::move(t));
  bench::fabric::describe(v, *p);
  return v;
}

void run(bench::context& ctx) {
  const auto delay =
      ctx.opt.smoke ? std::chrono::microseconds(2000) : std::chrono::microseconds(50000);
  const std::string ms = ctx.opt.smoke ? "2 ms" : "50 ms";
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter c;
  if (!ec) c = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto t_cc = std::make_shared<idle_tally>(), t_tcp = std::make_shared<idle_tally>(),
       t_shm = std::make_shared<idle_tally>();
  const bool two_cpus = bench::allowed_cpus().size() >= 2;
  const std::string cc_name = "compcntr::wait, default options, idle " + ms;
  std::vector<bench::variant> vs;
  if (ec) {
    vs.push_back(bench::unavailable_variant(
        cc_name, "soft device/counter: " + std::string(compcntr::last_error_message())));
  } else if (!two_cpus) {
    vs.push_back(bench::unavailable_variant(cc_name, "needs 2 CPUs, this process may use 1"));
  } else {
    vs.push_back(idle_variant(
        ctx, cc_name, delay,
        [&c]() -> std::string {
          const auto e = compcntr::wait(c, c.value() + 1, 2000ms);
          return e == std::errc{} ? "" : "compcntr::wait: " + std::make_error_code(e).message();
        },
        [&c] { c.add(1); }, t_cc));
  }
  vs.push_back(
      fabric_idle(ctx, "fi_cntr_wait, tcp;ofi_rxm bound, idle " + ms, "tcp;ofi_rxm", delay, t_tcp));
  vs.push_back(fabric_idle(ctx, "fi_cntr_wait, shm bound, idle " + ms, "shm", delay, t_shm));
  auto r = ctx.measure(std::move(vs));
  finish(r[0], *t_cc);
  finish(r[1], *t_tcp);
  finish(r[2], *t_shm);
  ctx.add(bench::absolute("P6", "idle waiter CPU, completes after " + ms, r[0],
                          bench::goal::value_at_most, 5, describe("compcntr", r[0])));
  ctx.add(bench::compare("P6", "idle waiter vs fi_cntr_wait tcp;ofi_rxm", r[0], r[1],
                         bench::goal::info, 0, describe("fi_cntr_wait tcp;ofi_rxm", r[1])));
  ctx.add(bench::compare("P6", "idle waiter vs fi_cntr_wait shm", r[0], r[2], bench::goal::info, 0,
                         describe("fi_cntr_wait shm", r[2])));
}

} // namespace

COMPCNTR_BENCH_ROW("P6", "idle waiter: CPU time while the counter completes after 50 ms", run);
