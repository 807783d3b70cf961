// P5: blocking wait ping-pong round trip, the waiter asleep in the kernel every round.
// Target: <= 0.7x the round trip of a C++20 std::atomic<uint64_t>::wait/notify ping-pong
// (libstdc++ 12).
//
// The two sides (pingpong.hpp; threads pinned to the two CPUs, A: ping += 1, wait pong >= i;
// B: wait ping >= i, pong += 1):
//   * compcntr: add(1) and compcntr::wait(c, i, 2 s, wait_options{.spin = 0ns}): the forced-
//     sleep mode -- a wait not satisfied at its first check registers in the slot's watch word
//     and calls FUTEX_WAIT at once; add() sees the registration and calls FUTEX_WAKE.
//   * reference: std::atomic<uint64_t> fetch_add(1) + notify_one(), and
//     `while ((v = load(acquire)) < i) wait(v, acquire)`. libstdc++ 12 keys 64-bit atomics to a
//     16-entry table of proxy futex words ((address >> 2) % 16); it spins 12 `pause`s and 4
//     sched_yield()s before FUTEX_WAIT, and notify skips the syscall when the proxy has no
//     waiter. The two atomics sit on different proxies (offsets 0 and 136 of one block), so each
//     waiter has its own futex word as each compcntr counter does: the reference is not slowed
//     by sharing one.
//
// Two timings (pingpong.hpp):
//   * target line, gated: each update is made only once the receiving thread is asleep in the
//     kernel (its /proc state is 'S'); the value is the sum of the two update-to-return times of
//     a round. Every waiter of both variants sleeps every round, by construction, and what is
//     compared is exactly "wake a sleeping waiter and get it back to its caller": the update
//     (RMW + FUTEX_WAKE), the kernel's wake-up, and the waiter's way out of its wait.
//   * info line, free-running: the plain ping-pong, wall time / rounds. Nothing forces a sleep:
//     when the answer comes before a waiter reaches FUTEX_WAIT (or the futex word changed before
//     it got there) it does not sleep, and libstdc++'s spin-then-yield catches quick answers. The
//     note says which fraction of the waits really blocked (voluntary context switches).
// Fairness: the same loop, pinning and update-then-wait structure for both; compcntr's 2 s
// timeout is a failure guard only (libstdc++ has no timed wait: a watchdog bounds it).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "../harness.hpp"
#include "pingpong.hpp"

import compcntr;

namespace {

using namespace std::chrono_literals;
constexpr auto wait_timeout = 2000ms;
constexpr std::uint64_t unstick_amount = std::uint64_t{1} << 40;

const compcntr::wait_options sleep_opts{.spin = 0ns};

struct cc_ops {
  static void update(compcntr::counter& c) noexcept { c.add(1); }
  static std::string wait(compcntr::counter& c, std::uint64_t i) {
    const std::errc e = compcntr::wait(c, i, wait_timeout, sleep_opts);
    if (e == std::errc{}) [[likely]] return {};
    return "compcntr::wait: " + std::make_error_code(e).message();
  }
};
struct std_ops {
  static void update(std::atomic<std::uint64_t>& a) noexcept {
    a.fetch_add(1);
    a.notify_one();
  }
  static std::string wait(const std::atomic<std::uint64_t>& a, std::uint64_t i) {
    for (std::uint64_t v; (v = a.load(std::memory_order_acquire)) < i;) a.wait(v, std::memory_order_acquire);
    return {};
  }
};

/// Two atomics on different libstdc++ proxy futex words and different 128-byte blocks.
struct alignas(256) std_pair {
  std::atomic<std::uint64_t> ping{0};
  char pad[136 - sizeof(std::atomic<std::uint64_t>)];
  std::atomic<std::uint64_t> pong{0};
};
static_assert(offsetof(std_pair, pong) == 136);
constexpr std::size_t proxy_of(std::size_t addr) { return (addr >> 2) % 16; }  // libstdc++ 12
static_assert(proxy_of(0) != proxy_of(136), "the two atomics must use different proxy words");

void run(bench::context& ctx) {
  namespace pp = bench::pingpong;
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter ping, pong;
  if (!ec) ping = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (!ec) pong = dev.create_counter(compcntr::counter_type::wrs, ec);
  const std::string why = ec ? "soft device/counter: " + std::string(compcntr::last_error_message()) : "";
  auto pair = std::make_unique<std_pair>();

  std::vector<std::shared_ptr<pp::tally>> tallies;
  std::vector<bench::variant> vs;
  for (pp::timing how : {pp::timing::wake_latency, pp::timing::wall}) {
    const bool gated = how == pp::timing::wake_latency;
    const std::string suffix = gated ? ", gated (waiter asleep)" : ", free-running";
    const std::string cc_name = "compcntr::wait .spin = 0ns" + suffix;
    if (!why.empty()) {
      tallies.push_back(std::make_shared<pp::tally>());
      vs.push_back(bench::unavailable_variant(cc_name, why));
    } else {
      pp::spec s;
      s.name = cc_name;
      s.how = how;
      pp::set_sides(s, &ping, &pong, cc_ops::update, cc_ops::wait);
      s.reset = [&] {
        ping.set(0);
        pong.set(0);
      };
      s.unstick = [&] {
        ping.add(unstick_amount);
        pong.add(unstick_amount);
      };
      s.sample_ms = 4;
      s.max_retries = 8;
      s.budget_factor = 3;
      s.smoke_rounds = 16;
      vs.push_back(pp::make(ctx, std::move(s), tallies.emplace_back(std::make_shared<pp::tally>())));
      vs.back().notes["wait"] = "wait_options{.spin = 0ns}, timeout 2 s";
    }
    pp::spec s;
    s.name = "std::atomic<uint64_t>::wait/notify_one" + suffix;
    s.how = how;
    auto* pi = &pair->ping;
    auto* po = &pair->pong;
    pp::set_sides(s, pi, po, std_ops::update, std_ops::wait);
    s.reset = [pi, po] {
      pi->store(0);
      po->store(0);
    };
    s.unstick = [pi, po] {
      pi->fetch_add(unstick_amount);
      pi->notify_all();
      po->fetch_add(unstick_amount);
      po->notify_all();
    };
    s.sample_ms = 4;
    s.max_retries = 8;
    s.budget_factor = 3;
    s.smoke_rounds = 16;
    vs.push_back(pp::make(ctx, std::move(s), tallies.emplace_back(std::make_shared<pp::tally>())));
  }

  auto r = ctx.measure(std::move(vs));
  for (std::size_t i = 0; i < r.size(); ++i) pp::finish(r[i], *tallies[i]);
  auto note = [&](std::size_t a, std::size_t b) {
    std::string n = r[a].available ? pp::describe("compcntr", *tallies[a]) : "";
    if (r[b].available) n += (n.empty() ? "" : " | ") + pp::describe("atomic::wait", *tallies[b]);
    return n;
  };
  ctx.add(bench::compare("P5", "sleeping wait round trip vs atomic::wait/notify", r[0], r[1],
                         bench::goal::ratio_at_most, 0.7, note(0, 1)));
  ctx.add(bench::compare("P5", "free-running forced-sleep vs atomic::wait/notify", r[2], r[3],
                         bench::goal::info, 0, note(2, 3)));
}

}  // namespace

COMPCNTR_BENCH_ROW("P5", "blocking (forced-sleep) wait ping-pong vs C++20 atomic wait/notify", run);
