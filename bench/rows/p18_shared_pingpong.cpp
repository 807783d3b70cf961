// P18: cross-process ping-pong on two counters of a shared device (docs/shared.md), spinning and
// sleeping, vs the same loop on raw process-shared atomics and a raw shared-futex ping-pong.
// Targets (issue 21): spin <= 1.15x the raw atomics; sleeping <= 1.05x the raw futex and faster
// than libfabric shm's fi_cntr_wait ping-pong (P13's probe without the hook: 64-byte messages,
// send and receive counters, fi_cntr_wait on the receive counter; its one-way figure doubled).
//
// The two sides, one process each (fork per sample; the child pinned to the second allowed CPU,
// the parent to the first). Parent: ping += 1, wait pong >= i; child: wait ping >= i, pong += 1.
//   * compcntr: two counters of shared device "shm:p18-<pid>" created by the parent; the child
//     opens the device itself and resolves both ids (a device must not be used across fork),
//     then signals ready. Spin: compcntr::wait(.spin = spin_forever); sleep: .spin = 0ns (the
//     forced sleep of P5: registration in the segment's sleeper count, non-private FUTEX_WAIT).
//   * raw: two std::atomic<uint64_t> in a MAP_SHARED anonymous mapping (inherited by the child),
//     256 bytes apart as compcntr's cells are. Spin: `while (load(acquire) < i) pause`; sleep:
//     fetch_add then an unconditional FUTEX_WAKE(1) (non-private) on the word's low half, and
//     `while ((v = load) < i) FUTEX_WAIT(low half, v)`: the least a cross-process sleeping
//     ping-pong can do.
// Timing: wall time of the parent's n round trips, from the child's ready signal (its fork and
// device open are not timed) to the last answer; ns per round trip. Free-running (nothing
// forces the sleeping variants to sleep every round: the note says so).
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>

#include "../harness.hpp"
#include "hook_common.hpp"

import compcntr;

namespace {

using namespace std::chrono_literals;

struct alignas(256) raw_shared {
  std::atomic<std::uint64_t> ping{0};
  char pad[256 - sizeof(std::atomic<std::uint64_t>)];
  std::atomic<std::uint64_t> pong{0};
  char pad2[256 - sizeof(std::atomic<std::uint64_t>)];
  std::atomic<std::uint32_t> ready{0};
};
static_assert(std::endian::native == std::endian::little, "the futex word is a word's low half");

std::uint32_t* low(std::atomic<std::uint64_t>& a) noexcept {
  return reinterpret_cast<std::uint32_t*>(&a);
}
void raw_wake(std::atomic<std::uint64_t>& a) noexcept {
  ::syscall(SYS_futex, low(a), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}
void raw_sleep_until(std::atomic<std::uint64_t>& a, std::uint64_t i) noexcept {
  const timespec two_s{2, 0};  // a failure guard
  for (std::uint64_t v; (v = a.load(std::memory_order_acquire)) < i;)
    ::syscall(SYS_futex, low(a), FUTEX_WAIT, static_cast<std::uint32_t>(v), &two_s, nullptr, 0);
}
void raw_spin_until(std::atomic<std::uint64_t>& a, std::uint64_t i) noexcept {
  while (a.load(std::memory_order_acquire) < i) compcntr::cpu_relax();
}

enum class kind { cc_spin, raw_spin, cc_sleep, raw_sleep, cc_default, cc_value_spin };

struct shared_state {
  std::string name;
  compcntr::device dev;
  compcntr::counter ping, pong;
  raw_shared* raw = nullptr;
};

// One sample: fork the answering side, wait for its ready signal, time n round trips.
double sample(const bench::context& ctx, shared_state& st, kind k, std::uint64_t n) {
  raw_shared& r = *st.raw;
  r.ready.store(0);
  const bool cc = k == kind::cc_spin || k == kind::cc_sleep || k == kind::cc_default ||
                  k == kind::cc_value_spin;
  if (cc) {
    st.ping.set(0);
    st.pong.set(0);
  } else {
    r.ping.store(0);
    r.pong.store(0);
  }
  const compcntr::counter_id ping_id = st.ping.id(), pong_id = st.pong.id();
  compcntr::wait_options opts{.spin = k == kind::cc_spin ? compcntr::spin_forever : 0ns};
  if (k == kind::cc_default) opts = compcntr::wait_options{};  // spin 5 us, then sleep
  const pid_t pid = ::fork();
  if (pid == 0) {
    bench::pin_to(ctx.opt, 1);
    if (cc) {
      std::error_code ec;
      auto dev = compcntr::device::open_shared(st.name, 0, 0, ec);
      auto ping = dev ? dev.resolve(ping_id, ec) : compcntr::counter_ref{};
      auto pong = dev ? dev.resolve(pong_id, ec) : compcntr::counter_ref{};
      if (ec) ::_exit(2);
      r.ready.store(1);
      for (std::uint64_t i = 1; i <= n; ++i) {
        if (k == kind::cc_value_spin) {
          while (ping.value() < i) compcntr::cpu_relax();
        } else if (compcntr::wait(ping, i, 2000ms, opts) != std::errc{}) {
          ::_exit(3);
        }
        pong.add(1);
      }
      ::_exit(0);
    }
    r.ready.store(1);
    for (std::uint64_t i = 1; i <= n; ++i) {
      if (k == kind::raw_spin) {
        raw_spin_until(r.ping, i);
        r.pong.fetch_add(1);
      } else {
        raw_sleep_until(r.ping, i);
        r.pong.fetch_add(1);
        raw_wake(r.pong);
      }
    }
    ::_exit(0);
  }
  bench::pin_to(ctx.opt, 0);
  while (r.ready.load() == 0) ::sched_yield();
  const auto t0 = bench::steady::now();
  for (std::uint64_t i = 1; i <= n; ++i) {
    switch (k) {
      case kind::cc_spin:
      case kind::cc_sleep:
      case kind::cc_default:
        st.ping.add(1);
        if (compcntr::wait(st.pong, i, 2000ms, opts) != std::errc{}) i = n;  // child gone
        break;
      case kind::cc_value_spin:
        st.ping.add(1);
        while (st.pong.value() < i) compcntr::cpu_relax();
        break;
      case kind::raw_spin:
        r.ping.fetch_add(1);
        raw_spin_until(r.pong, i);
        break;
      case kind::raw_sleep:
        r.ping.fetch_add(1);
        raw_wake(r.ping);
        raw_sleep_until(r.pong, i);
        break;
    }
  }
  const double ns = bench::ns_since(t0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return ns;
}

void run(bench::context& ctx) {
  std::vector<bench::variant> vs;
  const char* names[] = {"shared counters, compcntr::wait spin_forever",
                         "raw process-shared atomics, spin",
                         "shared counters, compcntr::wait .spin = 0ns",
                         "raw shared FUTEX_WAIT/FUTEX_WAKE",
                         "shared counters, compcntr::wait default options (spin 5 us, then sleep)",
                         "shared counters, add() + a value() spin loop"};
  shared_state st;
  st.name = "p18-" + std::to_string(::getpid());
  std::error_code ec;
  std::string why;
  if (bench::allowed_cpus().size() < 2) why = "needs two allowed CPUs";
  if (why.empty())
    st.dev = compcntr::device::open_shared(st.name, compcntr::shared_create, 0600, ec);
  if (why.empty() && !ec) st.ping = st.dev.create_counter(compcntr::counter_type::wrs, ec);
  if (why.empty() && !ec) st.pong = st.dev.create_counter(compcntr::counter_type::wrs, ec);
  if (why.empty() && ec) why = "shared device: " + std::string(compcntr::last_error_message());
  void* m = why.empty() ? ::mmap(nullptr, sizeof(raw_shared), PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0)
                        : MAP_FAILED;
  if (why.empty() && m == MAP_FAILED) why = "mmap of the shared raw words failed";
  if (m != MAP_FAILED) st.raw = new (m) raw_shared;
  for (int k = 0; k < 6; ++k) {
    if (!why.empty()) {
      vs.push_back(bench::unavailable_variant(names[k], why));
      continue;
    }
    bench::variant v;  // timed inside the sample (timed_wall would count the fork too)
    v.name = names[k];
    v.run = [&ctx, &st, k](std::uint64_t n) { return sample(ctx, st, static_cast<kind>(k), n); };
    v.notes["clock"] = "wall time of the parent's round trips (fork and open not timed)";
    v.sample_ms = 10;
    vs.push_back(std::move(v));
  }
  auto r = ctx.measure(std::move(vs));
  ctx.add(bench::compare(
      "P18", "cross-process spin ping-pong: shared counters vs raw shared atomics", r[0], r[1],
      bench::goal::ratio_at_most, 1.15, "two processes, one CPU each; round trip"));
  ctx.add(bench::compare("P18",
                         "cross-process spin ping-pong: shared counters, add() + value() loop vs "
                         "raw shared atomics",
                         r[5], r[1]));
  ctx.add(bench::compare("P18",
                         "cross-process sleeping ping-pong: shared counters vs raw shared futex",
                         r[2], r[3], bench::goal::ratio_at_most, 1.05,
                         "free-running: a waiter answered before FUTEX_WAIT does not sleep"));
  // The same round trip through libfabric shm (P13's probe, no hook, in fresh processes):
  // fi_send + fi_cntr_wait(rx) each way. Its figures are one-way; a round trip is two. Each
  // library's blocking wait as a user calls it: shm's fi_cntr_wait never sleeps (libfabric
  // 1.17's yield wait: sched_yield until the value), compcntr's default wait spins 5 us and
  // then sleeps in the kernel (r[4]); the forced-sleep variant beside it for information.
  if (why.empty()) {
    const std::uint64_t iters = ctx.opt.smoke ? 50 : 20'000;
    const int rounds = ctx.opt.smoke ? 1 : 3, samples = ctx.opt.smoke ? 1 : 3;
    auto fi = bench::hook::collect(
        ctx, {bench::hook::config::plain}, {"libfabric shm, 64 B send + fi_cntr_wait each way"},
        "p13-pingpong", {"shm", "wait", std::to_string(iters), std::to_string(samples)}, rounds,
        "ns/op")[0];
    if (fi.available) {
      for (double& x : fi.st.samples) x *= 2;
      fi.st = bench::summarize(std::move(fi.st.samples));
      fi.notes["clock"] = "wall time; P13's one-way figure x 2 (a round trip)";
    }
    ctx.add(bench::compare("P18",
                           "cross-process blocking-wait ping-pong: shared counters (default wait) "
                           "vs libfabric shm fi_cntr_wait",
                           r[4], fi, bench::goal::speedup_above, 1.0,
                           "faster than shm's counter ping-pong (issue 21); shm carries 64 B and "
                           "yields instead of sleeping"));
    ctx.add(bench::compare("P18",
                           "cross-process ping-pong: shared counters (forced sleep) vs libfabric "
                           "shm fi_cntr_wait",
                           r[2], fi));
  }
  st.ping.reset();
  st.pong.reset();
  st.dev = compcntr::device{};  // the last process out unlinks the segment
  if (m != MAP_FAILED) ::munmap(m, sizeof(raw_shared));
}

} // namespace

COMPCNTR_BENCH_ROW("P18",
                   "cross-process ping-pong on shared counters vs raw shared atomics and futex",
                   run);
