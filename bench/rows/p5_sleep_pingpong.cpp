// P5: blocking wait ping-pong round trip, the waiter asleep in the kernel every round.
// Targets (gated timing, below): <= 1.05x a raw FUTEX_WAIT/FUTEX_WAKE ping-pong on the same two
// counters' words (the limit: two kernel wake-ups per round trip, nothing else), and <= 1.0x a
// C++20 std::atomic<uint64_t>::wait/notify ping-pong (libstdc++ 12).
//
// The two sides (pingpong.hpp; threads pinned to the two CPUs, A: ping += 1, wait pong >= i;
// B: wait ping >= i, pong += 1):
//   * compcntr: add(1) and compcntr::wait(c, i, 2 s, wait_options{.spin = 0ns}): the forced-
//     sleep mode -- a wait not satisfied at its first check registers in the slot's watch word
//     and calls FUTEX_WAIT at once; add() sees the registration and calls FUTEX_WAKE.
//   * raw futex (the limit): on the same two slots' value words, fetch_add(1) then an
//     unconditional FUTEX_WAKE_PRIVATE(1) on the word's low 32 bits; the wait is
//     `while ((v = load(acquire)) < i) FUTEX_WAIT_PRIVATE(low 32 bits, (uint32_t)v, 2 s)`. No
//     watcher bookkeeping and no spinning: the least code a sleeping ping-pong can run. Same
//     memory as compcntr on purpose (see P4: line transfers cost what the memory makes them).
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
//     a round. Every waiter of every variant sleeps every round, by construction, and what is
//     compared is exactly "wake a sleeping waiter and get it back to its caller": the update
//     (RMW + FUTEX_WAKE), the kernel's wake-up, and the waiter's way out of its wait.
//   * info line, free-running: the plain ping-pong, wall time / rounds. Nothing forces a sleep:
//     when the answer comes before a waiter reaches FUTEX_WAIT (or the futex word changed before
//     it got there) it does not sleep, and libstdc++'s spin-then-yield catches quick answers. The
//     note says which fraction of the waits really blocked (voluntary context switches).
// Fairness: the same loop, pinning and update-then-wait structure for all three; the 2 s
// timeouts are failure guards only (libstdc++ has no timed wait: a watchdog bounds it).
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

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
    if (e == std::errc{}) [[likely]]
      return {};
    return "compcntr::wait: " + std::make_error_code(e).message();
  }
};
struct std_ops {
  static void update(std::atomic<std::uint64_t>& a) noexcept {
    a.fetch_add(1);
    a.notify_one();
  }
  static std::string wait(const std::atomic<std::uint64_t>& a, std::uint64_t i) {
    for (std::uint64_t v; (v = a.load(std::memory_order_acquire)) < i;)
      a.wait(v, std::memory_order_acquire);
    return {};
  }
};

/// The limit: a raw futex ping-pong on a 64-bit word whose low half is the futex word (x86-64
/// and AArch64 are little-endian: the low 32 bits sit at the word's address).
struct futex_ops {
  static std::uint32_t* low(const std::atomic<std::uint64_t>& a) noexcept {
    return const_cast<std::uint32_t*>(reinterpret_cast<const std::uint32_t*>(&a));
  }
  static void update(std::atomic<std::uint64_t>& a) noexcept {
    a.fetch_add(1);
    ::syscall(SYS_futex, low(a), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }
  static std::string wait(const std::atomic<std::uint64_t>& a, std::uint64_t i) {
    const timespec two_s{2, 0};  // a failure guard, as compcntr's 2 s timeout
    for (std::uint64_t v; (v = a.load(std::memory_order_acquire)) < i;) {
      if (::syscall(SYS_futex, low(a), FUTEX_WAIT_PRIVATE, static_cast<std::uint32_t>(v), &two_s,
                    nullptr, 0) != 0 &&
          errno == ETIMEDOUT)
        return "FUTEX_WAIT: timed out";
    }
    return {};
  }
};
static_assert(std::endian::native == std::endian::little, "futex_ops uses the low half of a word");

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
  const std::string why =
      ec ? "soft device/counter: " + std::string(compcntr::last_error_message()) : "";
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
      vs.push_back(
          pp::make(ctx, std::move(s), tallies.emplace_back(std::make_shared<pp::tally>())));
      vs.back().notes["wait"] = "wait_options{.spin = 0ns}, timeout 2 s";
    }
    // The limit: raw futex calls on the same two slots' value words.
    const std::string fx_name = "raw FUTEX_WAIT/FUTEX_WAKE, same two slots" + suffix;
    if (!why.empty()) {
      tallies.push_back(std::make_shared<pp::tally>());
      vs.push_back(bench::unavailable_variant(fx_name, why));
    } else {
      pp::spec s;
      s.name = fx_name;
      s.how = how;
      auto* pi = &ping.native_slot()->value;
      auto* po = &pong.native_slot()->value;
      pp::set_sides(s, pi, po, futex_ops::update, futex_ops::wait);
      s.reset = [&] {
        ping.set(0);
        pong.set(0);
      };
      s.unstick = [pi, po] {
        pi->fetch_add(unstick_amount);
        po->fetch_add(unstick_amount);
        ::syscall(SYS_futex, futex_ops::low(*pi), FUTEX_WAKE_PRIVATE, 1 << 30, nullptr, nullptr, 0);
        ::syscall(SYS_futex, futex_ops::low(*po), FUTEX_WAKE_PRIVATE, 1 << 30, nullptr, nullptr, 0);
      };
      s.sample_ms = 4;
      s.max_retries = 8;
      s.budget_factor = 3;
      s.smoke_rounds = 16;
      vs.push_back(
          pp::make(ctx, std::move(s), tallies.emplace_back(std::make_shared<pp::tally>())));
      vs.back().notes["wait"] = "FUTEX_WAIT_PRIVATE on the value word's low half, timeout 2 s";
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
  auto note = [&](std::size_t a, std::size_t b, const char* who) {
    std::string n = r[a].available ? pp::describe("compcntr", *tallies[a]) : "";
    if (r[b].available) n += (n.empty() ? "" : " | ") + pp::describe(who, *tallies[b]);
    return n;
  };
  // r: [0] compcntr gated, [1] raw futex gated, [2] atomic::wait gated, [3..5] free-running.
  ctx.add(bench::compare("P5", "sleeping wait round trip vs raw futex, same slots", r[0], r[1],
                         bench::goal::ratio_at_most, 1.05, note(0, 1, "raw futex")));
  ctx.add(bench::compare("P5", "sleeping wait round trip vs atomic::wait/notify", r[0], r[2],
                         bench::goal::ratio_at_most, 1.0, note(0, 2, "atomic::wait")));
  ctx.add(bench::compare("P5", "free-running forced-sleep vs raw futex", r[3], r[4],
                         bench::goal::info, 0, note(3, 4, "raw futex")));
  ctx.add(bench::compare("P5", "free-running forced-sleep vs atomic::wait/notify", r[3], r[5],
                         bench::goal::info, 0, note(3, 5, "atomic::wait")));
}

} // namespace

COMPCNTR_BENCH_ROW(
    "P5", "blocking (forced-sleep) wait ping-pong vs raw futex and C++20 atomic wait/notify", run);
