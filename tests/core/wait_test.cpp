// compcntr::wait and compcntr::backoff (import compcntr;): results, timing bounds, wake-ups
// from other threads, error wake-ups, drive functions, hardware refresh, idle CPU, and a
// 100,000-round ping-pong that fails on any lost wake-up.
module;
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include "wait_util.hpp"

module compcntr;  // a white-box test: a unit of the module (it reads compcntr::detail)

#include "support.hpp"

using test_support::make_counter;
using test_support::open_soft;

using namespace std::chrono_literals;
using test_util::eventually;

namespace {

std::uint32_t sleepers(const compcntr::counter& c) {
  return c.native_slot()->watch.load() & compcntr::detail::watch_sleepers_mask;
}

compcntr::wait_options with_spin(std::chrono::nanoseconds spin) {
  compcntr::wait_options o;
  o.spin = spin;
  return o;
}

// The three ways a wait can spend its time.
struct mode {
  const char* name;
  std::chrono::nanoseconds spin;
};
constexpr mode modes[] = {{"default", compcntr::default_spin},
                          {"forced sleep", std::chrono::nanoseconds::zero()},
                          {"spin only", compcntr::spin_forever}};

// Signals that the waiter is inside its wait (drive functions run after the error sample).
void mark_inside(void* flag) { static_cast<std::atomic<bool>*>(flag)->store(true); }

} // namespace

TEST_CASE("backoff: pauses, then yields, then says block") {
  compcntr::backoff b;
  for (std::uint32_t i = 0; i <= compcntr::backoff::yield_limit; ++i) {
    CHECK_FALSE(b.is_completed());
    CHECK(b.step() == i);
    b.snooze();
  }
  CHECK(b.is_completed());
  b.snooze();
  CHECK(b.is_completed());
  CHECK(b.step() == compcntr::backoff::yield_limit + 1);
  b.reset();
  CHECK_FALSE(b.is_completed());
  for (int i = 0; i < 20; ++i) b.spin();  // spin() saturates and never completes
  CHECK(b.step() == compcntr::backoff::spin_limit + 1);
  CHECK_FALSE(b.is_completed());
}

TEST_CASE("wait: already satisfied, test once, thresholds compare as unsigned >=") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  CHECK(compcntr::wait(c, 0, 0ms) == std::errc{});  // 0 >= 0
  c.add(5);
  for (const mode& m : modes) {
    CAPTURE(m.name);
    const auto o = with_spin(m.spin);
    CHECK(compcntr::wait(c, 5, 0ms, o) == std::errc{});
    CHECK(compcntr::wait(c, 4, compcntr::wait_forever, o) == std::errc{});
    CHECK(compcntr::wait(c, 6, 0ms, o) == std::errc::timed_out);
  }
  // No wrap-around arithmetic: a threshold far "ahead" is not reached, one behind is.
  c.set(UINT64_MAX - 1);
  CHECK(compcntr::wait(c, UINT64_MAX, 0ms) == std::errc::timed_out);
  CHECK(compcntr::wait(c, 1, 0ms) == std::errc{});
  c.add(1);
  CHECK(compcntr::wait(c, UINT64_MAX, 0ms) == std::errc{});
  c.add(1);  // wraps to 0: the threshold UINT64_MAX is no longer reached
  CHECK(c.value() == 0);
  CHECK(compcntr::wait(c, UINT64_MAX, 0ms) == std::errc::timed_out);
  compcntr::counter empty;
  CHECK(compcntr::wait(empty, 1, 0ms) == std::errc::invalid_argument);
}

TEST_CASE("wait: errors before the wait do not count, errors during it are EIO") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  c.set_error(3);
  CHECK(compcntr::wait(c, 1, 0ms) == std::errc::timed_out);
  CHECK(compcntr::wait(c, 1, 20ms) == std::errc::timed_out);
  c.add(1);
  c.add_error(1);
  CHECK(compcntr::wait(c, 1, 0ms) == std::errc{});  // reaching the threshold wins

  for (const mode& m : modes) {
    CAPTURE(m.name);
    std::atomic<bool> inside{false};
    compcntr::wait_options o = with_spin(m.spin);
    o.drive = mark_inside;
    o.drive_ctx = &inside;
    std::atomic<int> result{-1};
    std::thread waiter([&] { result = static_cast<int>(compcntr::wait(c, 100, 30s, o)); });
    REQUIRE(eventually([&] { return inside.load(); }));
    c.add_error(1);
    waiter.join();
    CHECK(result.load() == static_cast<int>(std::errc::io_error));
  }
  // set_error to the same value is no change; to another value is.
  std::atomic<int> result{-1};
  std::thread waiter(
      [&] { result = static_cast<int>(compcntr::wait(c, 100, 30s, with_spin(0ns))); });
  REQUIRE(eventually([&] { return sleepers(c) == 1; }));
  c.set_error(c.errors() + 7);
  waiter.join();
  CHECK(result.load() == static_cast<int>(std::errc::io_error));
}

TEST_CASE("wait_since: errors compared with the caller's count, from the first check on") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  const std::uint64_t seen = c.errors();
  c.add_error(1);  // after the caller's read, before its wait: wait() cannot see this change
  CHECK(compcntr::wait(c, 1, 0ms) == std::errc::timed_out);
  CHECK(compcntr::wait_since(c, 1, seen, 0ms) == std::errc::io_error);
  CHECK(compcntr::wait_since(c, 1, seen, 30s) == std::errc::io_error);  // no sleep
  CHECK(compcntr::wait_since(c, 1, c.errors(), 0ms) == std::errc::timed_out);
  c.add(1);
  CHECK(compcntr::wait_since(c, 1, seen, 0ms) == std::errc{});  // the threshold wins
  compcntr::counter empty;
  CHECK(compcntr::wait_since(empty, 1, 0, 0ms) == std::errc::invalid_argument);

  // Asleep, then woken by an error change.
  std::atomic<int> result{-1};
  std::thread waiter([&] {
    result = static_cast<int>(compcntr::wait_since(c, 100, c.errors(), 30s, with_spin(0ns)));
  });
  REQUIRE(eventually([&] { return sleepers(c) == 1; }));
  c.add_error(1);
  waiter.join();
  CHECK(result.load() == static_cast<int>(std::errc::io_error));
}

TEST_CASE("wait: woken by another thread's increments, in every mode") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  std::uint64_t target = 0;
  for (const mode& m : modes) {
    CAPTURE(m.name);
    target += 3;
    std::atomic<bool> inside{false};
    compcntr::wait_options o = with_spin(m.spin);
    o.drive = mark_inside;
    o.drive_ctx = &inside;
    std::atomic<int> result{-1};
    std::atomic<std::uint64_t> seen{0};
    std::thread waiter([&] {
      result = static_cast<int>(compcntr::wait(c, target, 30s, o));
      seen = c.value();
    });
    REQUIRE(eventually([&] { return inside.load(); }));
    c.add(1);
    c.add(2);
    waiter.join();
    CHECK(result.load() == 0);
    CHECK(seen.load() == target);
  }
  // A sleeper stays asleep through increments below its threshold, then wakes on the last one.
  std::atomic<int> result{-1};
  std::thread waiter(
      [&] { result = static_cast<int>(compcntr::wait(c, target + 2, 30s, with_spin(0ns))); });
  REQUIRE(eventually([&] { return sleepers(c) == 1; }));
  c.add(1);
  REQUIRE(eventually([&] { return sleepers(c) == 1; }));
  CHECK(result.load() == -1);
  c.add(1);
  waiter.join();
  CHECK(result.load() == 0);
  CHECK(sleepers(c) == 0);
}

TEST_CASE("wait: many sleepers on one counter all wake") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  constexpr int n = 4;
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int i = 1; i <= n; ++i)
    ts.emplace_back([&, i] { ok += compcntr::wait(c, i, 30s, with_spin(0ns)) == std::errc{}; });
  REQUIRE(eventually([&] { return sleepers(c) == n; }));
  for (int i = 0; i < n; ++i) c.add(1);
  for (auto& t : ts) t.join();
  CHECK(ok.load() == n);
  CHECK(c.native_slot()->watch.load() == 0);
}

TEST_CASE("wait: timeouts are never early and not much late") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  for (const mode& m : modes) {
    CAPTURE(m.name);
    const auto o = with_spin(m.spin);
    auto t0 = test_util::clock_type::now();
    CHECK(compcntr::wait(c, 1, 0ms, o) == std::errc::timed_out);
    CHECK(test_util::clock_type::now() - t0 < 1s);
    t0 = test_util::clock_type::now();
    CHECK(compcntr::wait(c, 1, 80ms, o) == std::errc::timed_out);
    const auto elapsed = test_util::clock_type::now() - t0;
    CHECK(elapsed >= 80ms);
    CHECK(elapsed < 80ms + 2s);  // generous: shared 2-core CI machines, sanitizers
    CHECK(sleepers(c) == 0);
  }
}

TEST_CASE("wait: drive functions run before the first check and between bounded sleeps") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  struct ctx_t {
    compcntr::counter* c;
    int calls = 0;
    int complete_at = 0;
  };
  auto drive = [](void* p) {
    auto* x = static_cast<ctx_t*>(p);
    if (++x->calls == x->complete_at) x->c->add(1);
  };
  // Test once: the drive function runs once, before the check.
  ctx_t once{&c, 0, 1};
  compcntr::wait_options o;
  o.drive = drive;
  o.drive_ctx = &once;
  CHECK(compcntr::wait(c, 1, 0ms, o) == std::errc{});
  CHECK(once.calls == 1);

  // Forced sleep, nobody else touches the counter: only the drive function can complete it, so
  // the waiter must keep waking up to call it (1 ms slices here).
  for (const mode& m : modes) {
    CAPTURE(m.name);
    ctx_t x{&c, 0, 25};
    o = with_spin(m.spin);
    o.drive = drive;
    o.drive_ctx = &x;
    o.drive_interval = 1ms;
    const std::uint64_t before = c.value();
    CHECK(compcntr::wait(c, before + 1, 30s, o) == std::errc{});
    CHECK(x.calls == 25);
  }
}

namespace {
// A fake hardware-backed counter: the "device" holds the truth, refresh() copies it into the
// slot (the mirror) without notify(), as a device that is only polled would.
std::atomic<std::uint64_t> hw_value{0}, hw_errors{0};
std::atomic<int> hw_refreshes{0};
void hw_add(compcntr::plugin::slot&, std::uint64_t n) noexcept { hw_value += n; }
void hw_add_error(compcntr::plugin::slot&, std::uint64_t n) noexcept { hw_errors += n; }
void hw_set(compcntr::plugin::slot&, std::uint64_t v) noexcept { hw_value = v; }
void hw_set_error(compcntr::plugin::slot&, std::uint64_t v) noexcept { hw_errors = v; }
void hw_refresh(compcntr::plugin::slot& s) noexcept {
  ++hw_refreshes;
  s.value.store(hw_value.load());
  s.errors.store(hw_errors.load());
}
constexpr compcntr::plugin::hw_counter_ops fake_hw{hw_add, hw_add_error, hw_set, hw_set_error,
                                                   hw_refresh};
} // namespace

TEST_CASE("wait: hardware-backed counters are refreshed while waiting, even when asleep") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  compcntr::plugin::slot& s = *c.native_slot();
  s.hw = &fake_hw;
  hw_errors = 4; // before the wait, not yet in the mirror: must not count as "during"
  CHECK(compcntr::wait(c, 1, 0ms) == std::errc::timed_out);
  CHECK(s.errors.load() == 4);

  for (const mode& m : modes) {
    CAPTURE(m.name);
    hw_refreshes = 0;
    const std::uint64_t target = hw_value.load() + 1;
    std::atomic<int> result{-1};
    compcntr::wait_options o = with_spin(m.spin);
    o.drive_interval = 1ms;
    std::thread waiter([&] { result = static_cast<int>(compcntr::wait(c, target, 30s, o)); });
    REQUIRE(eventually([&] { return hw_refreshes.load() >= 3; }));
    c.add(1); // the device counts; nothing notifies: only refresh can see it
    waiter.join();
    CHECK(result.load() == 0);
  }
  std::atomic<int> result{-1};
  std::thread waiter(
      [&] { result = static_cast<int>(compcntr::wait(c, UINT64_MAX, 30s, with_spin(0ns))); });
  REQUIRE(eventually([&] { return sleepers(c) == 1; }));
  c.add_error(1);
  waiter.join();
  CHECK(result.load() == static_cast<int>(std::errc::io_error));
  s.hw = nullptr;
}

TEST_CASE("wait: an idle waiter sleeps (thread CPU time a small fraction of wall time)") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  struct run {
    double wall_ms, cpu_ms;
    int result;
  };
  auto idle_wait = [&](const compcntr::wait_options& o) {
    run r{};
    std::thread t([&] {
      const auto cpu0 = test_util::thread_cpu();
      const auto t0 = test_util::clock_type::now();
      r.result = static_cast<int>(compcntr::wait(c, 1, 300ms, o));
      r.wall_ms = test_util::ms(test_util::clock_type::now() - t0);
      r.cpu_ms = test_util::ms(test_util::thread_cpu() - cpu0);
    });
    t.join();
    return r;
  };
  const run plain = idle_wait(compcntr::wait_options{});
  CAPTURE(plain.cpu_ms);
  CAPTURE(plain.wall_ms);
  CHECK(plain.result == static_cast<int>(std::errc::timed_out));
  CHECK(plain.wall_ms >= 300);
  CHECK(plain.cpu_ms < 0.05 * plain.wall_ms); // P6's budget: < 5% of a core

  // With a drive function the waiter wakes every 1 ms; it must still be mostly asleep.
  compcntr::wait_options o;
  int calls = 0;
  o.drive = [](void* p) { ++*static_cast<int*>(p); };
  o.drive_ctx = &calls;
  const run driven = idle_wait(o);
  CAPTURE(driven.cpu_ms);
  CAPTURE(calls);
  CHECK(driven.result == static_cast<int>(std::errc::timed_out));
  CHECK(calls >= 50); // ~300 slices of 1 ms; far fewer would mean sleeps longer than a slice
  CHECK(driven.cpu_ms < 0.25 * driven.wall_ms);
}

TEST_CASE("wait: 100,000-round ping-pong loses no wake-up") {
  // main sends a token on `ping`, the other thread waits for it and answers on `pong`. A lost
  // wake-up is a failure after 10 s, never a hang. The races worth hitting are
  // short: between a sleeper's re-check and its registration, between its registration and the
  // kernel's futex queue. On a VM a FUTEX_WAKE is so slow that an unaimed ping-pong almost never
  // lands there, so main aims (round i, by i % 4):
  //   0: waits 0-1023 pauses (~0-35 us), then sends; the receiver uses the default options;
  //   1: spins until the receiver has registered as a sleeper (forced sleep), then sends after
  //      0-15 pauses: into the registration -> futex window;
  //   2: sends 0-63 pauses after the previous answer: into the receiver's path from its fast
  //      check to the futex (re-check -> registration included); forced sleep;
  //   3: as 1, with the receiver on default options (it registers after spinning).
  // main waits for each answer hot-polling for 50 us, so it is usually running, watching, when
  // the receiver comes back around.
  // A lost wake-up does not always end in a timeout: the waiter's last check at its deadline
  // finds the (long since updated) value and succeeds. So a wait is also a failure when it
  // lasted its whole timeout (10 s; every answer here comes within microseconds).
  constexpr auto lost = 10s;
  auto timed_wait = [&](compcntr::counter& c, std::uint64_t i, const compcntr::wait_options& o) {
    const auto t0 = test_util::clock_type::now();
    return compcntr::wait(c, i, lost, o) == std::errc{} && test_util::clock_type::now() - t0 < lost;
  };
  auto dev = open_soft();
  auto ping = make_counter(dev);
  auto pong = make_counter(dev);
  constexpr std::uint64_t rounds = 100'000;
  auto receiver_opts = [](std::uint64_t i) {
    return with_spin(i % 2 == 0 || i % 4 == 3 ? compcntr::default_spin : 0ns);
  };
  auto pauses = [](std::uint64_t& x, std::uint64_t mask) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; // xorshift64
    for (std::uint64_t k = x & mask; k > 0; --k) compcntr::cpu_relax();
  };
  std::atomic<std::uint64_t> fail_ping{0}, fail_pong{0};
  std::thread other([&] {
    for (std::uint64_t i = 1; i <= rounds; ++i) {
      if (!timed_wait(ping, i, receiver_opts(i))) {
        fail_ping = i;
        break;
      }
      pong.add(1);
    }
  });
  const compcntr::wait_options main_opts = with_spin(50us);
  std::uint64_t x = 0x2545f4914f6cdd1du;
  std::uint64_t registered_seen = 0; // aimed rounds in which the receiver went to sleep
  for (std::uint64_t i = 1; i <= rounds; ++i) {
    if (i % 4 == 1 || i % 4 == 3) {
      // Spin tightly (the window is a few hundred ns), but briefly: if the receiver is not
      // running, spinning would keep it off a shared 2-core machine; yield then.
      const auto guard = test_util::clock_type::now() + 30s;
      for (unsigned k = 0; sleepers(ping) == 0; ++k) {
        if (k < 1024) {
          compcntr::cpu_relax();
        } else {
          ::sched_yield();
          if (test_util::clock_type::now() > guard) break;
        }
      }
      registered_seen += sleepers(ping) != 0;
      pauses(x, 15);
    } else {
      pauses(x, i % 4 == 0 ? 1023 : 63);
    }
    ping.add(1);
    if (!timed_wait(pong, i, main_opts)) {
      fail_pong = i;
      break;
    }
  }
  other.join();
  // The sleep path was really taken: in every aimed round the receiver registered as a sleeper
  // (whether it then blocked or found the futex word already bumped is the race being aimed at).
  CHECK(registered_seen == rounds / 2);
  CHECK(fail_ping.load() == 0);
  CHECK(fail_pong.load() == 0);
  CHECK(ping.value() == rounds);
  CHECK(pong.value() == rounds);
  CHECK(ping.native_slot()->watch.load() == 0);
  CHECK(pong.native_slot()->watch.load() == 0);
}

TEST_CASE("wait_options: an aggregate with designated initializers (docs/wait.md example)") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  struct queue {
    compcntr::counter* c;
    int drained = 0;
  } cq{&c};
  const compcntr::wait_options o{.drive =
                                     [](void* q) {
                                       auto* x = static_cast<queue*>(q);
                                       if (++x->drained == 3) x->c->add(1);
                                     },
                                 .drive_ctx = &cq,
                                 .drive_interval = 200us};
  CHECK(o.spin == compcntr::default_spin);
  const compcntr::counter* one[] = {&c};
  const std::uint64_t th[] = {1};
  const auto r = compcntr::poll_any(std::span<const compcntr::counter* const>(one), th,
                                    compcntr::wait_forever, o);
  CHECK(r.status == std::errc{});
  CHECK(r.index == 0);
  CHECK(cq.drained == 3);
}
