// P7: pool create+destroy of 1,000,000 counters in one thread, and memory per live counter.
// Target: <= 60 ns per create+destroy pair; <= 128 B of memory per live counter.
//
// Written against the public C++ API only (device::open, device::create_counter, counter::reset),
// so it measures whatever pool implementation is behind it.
//
// Time, two ways (both judged against 60 ns):
//   * warm pool: one device for the whole row; a sample creates 1,000,000 counters (all live at
//     once), then destroys them in creation order. After the warm-up sample every slot is a
//     recycled one: this is the steady state of a runtime that creates and destroys counters.
//   * fresh device: a new device per sample (open/close not timed), so the sample includes the
//     pool growing its arenas and the kernel faulting their pages in on first touch.
//   * shown without target: create one counter and destroy it, repeatedly (free-list hot path).
// Memory: in a fresh process (probe "p7-memory", so nothing earlier in this run lends it pages),
// VmRSS after opening the device and pre-faulting the vector of handles, then VmRSS with 1,000,000
// live counters; (after - before) / 1,000,000. The handles (8 B each, the application's storage)
// are not counted; the pool's slots and any per-counter bookkeeping are.
#include <cstdint>
#include <cstdio>
#include <string>
#include <system_error>
#include <vector>

#include "../harness.hpp"

import compcntr;

namespace {

constexpr std::uint64_t full_count = 1'000'000;   // the spec's number
constexpr std::uint64_t smoke_count = 10'000;

std::string why_failed(const char* what) {
  return std::string(what) + ": " + std::string(compcntr::last_error_message());
}

/// Creates n counters into v[0..n), then destroys them in order. False (and why) on failure.
bool create_destroy_all(compcntr::device& dev, std::vector<compcntr::counter>& v, std::uint64_t n,
                        std::string& why) {
  std::error_code ec;
  bool ok = true;
  for (std::uint64_t i = 0; i < n; ++i) {
    v[i] = dev.create_counter(compcntr::counter_type::wrs, ec);
    if (ec) [[unlikely]] {
      if (ok) why = why_failed("create_counter");
      ok = false;
    }
  }
  for (std::uint64_t i = 0; i < n; ++i) v[i].reset();
  return ok;
}

void run(bench::context& ctx) {
  const std::uint64_t count = ctx.opt.smoke ? smoke_count : full_count;
  std::vector<compcntr::counter> handles(count);
  std::string fail;   // first failure inside a timed sample, if any
  std::error_code ec;
  auto warm_dev = compcntr::device::open("soft", ec);
  const std::string open_why = ec ? why_failed("open soft device") : "";

  bench::variant warm, fresh, single;
  if (!open_why.empty()) {
    warm = bench::unavailable_variant("create+destroy, warm pool", open_why);
    fresh = bench::unavailable_variant("create+destroy, fresh device", open_why);
    single = bench::unavailable_variant("create+destroy one at a time", open_why);
  } else {
    warm = bench::timed("create " + std::to_string(count) + " then destroy all, warm pool",
                        [&](std::uint64_t n) { create_destroy_all(warm_dev, handles, n, fail); });
    fresh.name = "create " + std::to_string(count) + " then destroy all, fresh device";
    fresh.run = [&](std::uint64_t n) {
      std::error_code e;
      auto dev = compcntr::device::open("soft", e);
      if (e) {
        fail = why_failed("open soft device");
        return 0.0;
      }
      const double t0 = bench::thread_cpu_ns();
      create_destroy_all(dev, handles, n, fail);
      const double t = bench::thread_cpu_ns() - t0;
      dev.close(e);
      return t;
    };
    single = bench::timed("create+destroy one at a time (free-list hot path)", [&](std::uint64_t n) {
      std::error_code e;
      for (std::uint64_t i = 0; i < n; ++i) {
        auto c = warm_dev.create_counter(compcntr::counter_type::wrs, e);
        bench::escape(&c);
      }
    });
    fresh.notes["clock"] = "thread CPU time";
    warm.fixed_n = fresh.fixed_n = count;
  }
  warm.unit = fresh.unit = single.unit = "ns/pair";
  auto r = ctx.measure({warm, fresh, single});
  if (!fail.empty())
    for (int i : {0, 1}) r[static_cast<std::size_t>(i)] =
        bench::result::unavailable(r[static_cast<std::size_t>(i)].name, fail, "ns/pair");

  // Memory, in fresh processes.
  bench::result mem;
  mem.name = "VmRSS growth per live counter, " + std::to_string(count) + " live";
  mem.unit = "B/counter";
  mem.n = count;
  std::vector<double> per;
  const int probes = ctx.opt.smoke ? 1 : 3;
  for (int i = 0; i < probes && mem.available; ++i) {
    std::string why;
    auto kv = ctx.run_probe("p7-memory", {std::to_string(count)}, why);
    if (kv.empty()) {
      mem = bench::result::unavailable(mem.name, why, mem.unit);
      break;
    }
    per.push_back(std::stod(kv["bytes_per_counter"]));
    mem.notes = kv;
  }
  if (mem.available) mem.st = bench::summarize(per);

  const std::string m = count == full_count ? "1M" : std::to_string(count);
  ctx.add(bench::absolute("P7", "pool: create+destroy " + m + ", warm pool",
                         r[0], bench::goal::value_at_most, 60));
  ctx.add(bench::absolute("P7", "pool: create+destroy " + m + ", fresh device",
                         r[1], bench::goal::value_at_most, 60));
  ctx.add(bench::absolute("P7", "pool: create+destroy one at a time", r[2]));
  ctx.add(bench::absolute("P7", "pool: memory per live counter (VmRSS, " + m + ")",
                         mem, bench::goal::value_at_most, 128));
}

/// argv: count. Prints rss_before, rss_after, bytes_per_counter, count.
int probe_memory(const std::vector<std::string>& args) {
  const std::uint64_t count = args.empty() ? full_count : std::stoull(args[0]);
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  if (ec) {
    std::printf("error=%s\n", why_failed("open soft device").c_str());
    return 1;
  }
  std::vector<compcntr::counter> v(count);  // value-initialised: the handles' pages are resident
  const std::uint64_t before = bench::rss_bytes();
  for (std::uint64_t i = 0; i < count; ++i) {
    v[i] = dev.create_counter(compcntr::counter_type::wrs, ec);
    if (ec) {
      std::printf("error=%s (after %llu counters)\n", why_failed("create_counter").c_str(),
                  static_cast<unsigned long long>(i));
      return 1;
    }
  }
  const std::uint64_t after = bench::rss_bytes();
  std::printf("count=%llu\nrss_before=%llu\nrss_after=%llu\nbytes_per_counter=%.3f\n",
              static_cast<unsigned long long>(count), static_cast<unsigned long long>(before),
              static_cast<unsigned long long>(after),
              (static_cast<double>(after) - static_cast<double>(before)) / static_cast<double>(count));
  return 0;
}

}  // namespace

COMPCNTR_BENCH_ROW("P7", "pool create+destroy of 1M counters, memory per live counter", run);
COMPCNTR_BENCH_PROBE("p7-memory", probe_memory);
