// Striped counters (counter_options::stripes): creation rules, exactness at quiescence under
// many updating threads (a stress test meant for ThreadSanitizer too), set/add_error semantics,
// and that waits (spinning and asleep), poll_any, pollable fds, QP attach, handles and async
// queries behave on a striped counter as on a plain one.
#include <doctest/doctest.h>

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "blocked.hpp"
#include "fake_device.hpp"
#include "qp_fixture.hpp"
#include "support.hpp"

using namespace std::chrono_literals;
using compcntr::counter_options;
using compcntr::counter_type;
using test_support::open_soft;

namespace {

compcntr::counter make_striped(compcntr::device& dev, std::uint32_t stripes,
                               counter_type t = counter_type::wrs) {
  std::error_code ec;
  auto c = dev.create_counter(counter_options{.type = t, .stripes = stripes}, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(c);
  return c;
}

unsigned configured_cpus_pow2() {
  const long n = ::sysconf(_SC_NPROCESSORS_CONF);
  unsigned p = 1;
  while (p < static_cast<unsigned>(n < 1 ? 1 : n > 256 ? 256 : n)) p <<= 1;
  return p;
}

/// Pins the calling thread to the k-th CPU it may use (no-op with one CPU).
void pin_to(int k) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() < 2) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[static_cast<std::size_t>(k) % cpus.size()], &one);
  pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

} // namespace

TEST_CASE("striped: stripe counts, rounding, limits; plain counters have one") {
  auto dev = open_soft();
  std::error_code ec;
  auto plain = test_support::make_counter(dev);
  CHECK(plain.stripes() == 1);
  CHECK(make_striped(dev, 0).stripes() == 1);  // 0 and 1: a plain counter
  CHECK(make_striped(dev, 1).stripes() == 1);
  CHECK(make_striped(dev, 2).stripes() == 2);
  CHECK(make_striped(dev, 3).stripes() == 4);
  CHECK(make_striped(dev, 256).stripes() == 256);
  CHECK(make_striped(dev, compcntr::stripes_per_cpu).stripes() == configured_cpus_pow2());
  const std::uint32_t live = dev.live_counters();
  auto bad = dev.create_counter(counter_options{.stripes = 257}, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(bad);
  CHECK(std::string(compcntr::last_error_message()).find("257 stripes") != std::string::npos);
  CHECK(dev.live_counters() == live);  // a refused create changes nothing
}

// 2 stripes are told by a tag bit in the slot's stripes word (no count load on a read), 4 by the
// four-at-a-time loop once, 8 by it twice: each sums every stripe, and set() replaces the sum.
TEST_CASE("striped: 2, 4 and 8 stripes each sum every stripe (reads, errors, set)") {
  auto dev = open_soft();
  for (std::uint32_t n : {2u, 4u, 8u}) {
    CAPTURE(n);
    auto c = make_striped(dev, n);
    REQUIRE(c.stripes() == n);
    // One thread per CPU it may run on, pinned in turn, so updates land on different stripes
    // where CPUs allow; the sum is exact whichever stripes they hit.
    std::uint64_t want = 0;
    for (std::uint32_t k = 0; k < 2 * n; ++k) {
      std::thread t([&, k] {
        pin_to(static_cast<int>(k));
        c.add(k + 1);
        c.add_error(1);
      });
      t.join();
      want += k + 1;
    }
    CHECK(c.value() == want);
    CHECK(c.errors() == 2 * n);
    CHECK(compcntr::wait(c, want, 0ms) == std::errc{});
    CHECK(compcntr::wait(c, want + 1, 0ms) == std::errc::timed_out);
    c.set(5);
    CHECK(c.value() == 5);
    c.add(1);
    CHECK(c.value() == 6);
    CHECK(c.native_slot()->value.load() == 0);
  }
}

TEST_CASE("striped: a device whose counters are native refuses (ENOTSUP), changing nothing") {
  auto st = std::make_shared<fake::stats>();
  auto dev = fake::open(st);
  REQUIRE(dev);
  std::error_code ec;
  auto c = dev.create_counter(counter_options{.stripes = 4}, ec);
  CHECK(ec == std::errc::not_supported);
  CHECK_FALSE(c);
  CHECK(dev.live_counters() == 0);
  CHECK(st->bound.load() == 0);  // bound, then unbound again
}

TEST_CASE("striped: exact at quiescence under many updating threads (stress)") {
  auto dev = open_soft();
  auto c = make_striped(dev, compcntr::stripes_per_cpu);
  auto b = make_striped(dev, 8, counter_type::bytes);
  constexpr int threads = 6;
  constexpr std::uint64_t per_thread = 40'000;
  std::atomic<bool> go{false};
  std::atomic<int> done{0};
  std::uint64_t seen_max = 0;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      pin_to(t);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::uint64_t i = 0; i < per_thread; ++i) {
        c.add(1);
        b.add(3);
        if ((i & 7) == 0) c.add_error(1);
      }
      done.fetch_add(1, std::memory_order_release);
    });
  go.store(true, std::memory_order_release);
  // A reader meanwhile: values never go backwards and never exceed what was added.
  bool monotone = true;
  while (done.load(std::memory_order_acquire) < threads) {
    const std::uint64_t v = c.value();
    if (v < seen_max || v > threads * per_thread) monotone = false;
    seen_max = v;
  }
  for (auto& t : ts) t.join();
  CHECK(monotone);
  CHECK(c.value() == threads * per_thread);
  CHECK(c.errors() == threads * (per_thread / 8));
  CHECK(b.value() == 3 * threads * per_thread);
  CHECK(b.errors() == 0);
  // Several stripes took updates (the threads ran on different CPUs), whenever two CPUs exist.
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) >= 2 &&
      c.stripes() >= 2) {
    int used = 0;
    const compcntr::plugin::slot& s = *c.native_slot();
    for (std::uint32_t i = 0; i <= s.stripe_mask(); ++i)
      used += s.stripe_array()[i].value.load() != 0;
    CHECK(used >= 2);
  }
}

TEST_CASE("striped: set and set_error replace the sum; increments after it add up") {
  auto dev = open_soft();
  auto c = make_striped(dev, 4);
  for (int i = 0; i < 10; ++i) c.add(5);
  c.add_error(2);
  CHECK(c.value() == 50);
  c.set(7);
  CHECK(c.value() == 7);
  c.add(1);
  CHECK(c.value() == 8);
  c.set(0);
  CHECK(c.value() == 0);
  c.set_error(100);
  CHECK(c.errors() == 100);
  c.add_error(1);
  CHECK(c.errors() == 101);
  // Wrap: past UINT64_MAX to small values, as a plain counter.
  c.set(UINT64_MAX);
  c.add(2);
  CHECK(c.value() == 1);
  // A striped counter's own slot words stay 0: everything is in the stripes.
  CHECK(c.native_slot()->value.load() == 0);
  CHECK(c.native_slot()->errors.load() == 0);
}

TEST_CASE("striped: waits return as on a plain counter: spinning, asleep (woken), EIO, timeout") {
  auto dev = open_soft();
  auto c = make_striped(dev, compcntr::stripes_per_cpu);
  // Reached already; timeout 0 when not reached.
  c.add(3);
  CHECK(compcntr::wait(c, 3, 0ms) == std::errc{});
  CHECK(compcntr::wait(c, 4, 0ms) == std::errc::timed_out);
  CHECK(compcntr::wait(c, 1, 0ms) == std::errc{});  // the slot's own word is 0, the sum is 3
  CHECK(compcntr::wait(c, 0, 0ms) == std::errc{});
  CHECK(compcntr::wait_since(c, 3, c.errors(), 0ms) == std::errc{});
  CHECK(compcntr::wait_since(c, 4, c.errors(), 0ms) == std::errc::timed_out);
  // A forced-sleep waiter, asleep in the kernel before the update, is woken by a striped add.
  // A lost wake-up would end the wait only at its 20 s timeout (the final re-check then sees
  // the value): it must end long before.
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    std::atomic<pid_t> tid{0};
    std::errc got{};
    const std::uint64_t goal = c.value() + 2;
    std::thread w([&] {
      tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
      got = compcntr::wait(c, goal, 20s, compcntr::wait_options{.spin = 0ns});
    });
    REQUIRE(eventually_blocked(tid));
    c.add(1);  // not enough: the waiter goes back to sleep
    REQUIRE(eventually_blocked(tid));
    c.add(1);
    w.join();
    CHECK(got == std::errc{});
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  }
  // Spin-only waiter released by another thread's add.
  {
    std::errc got{};
    const std::uint64_t goal = c.value() + 1;
    std::thread w([&] {
      got = compcntr::wait(c, goal, 20s, compcntr::wait_options{.spin = compcntr::spin_forever});
    });
    c.add(1);
    w.join();
    CHECK(got == std::errc{});
  }
  // An error change during a sleeping wait: EIO.
  {
    std::atomic<pid_t> tid{0};
    std::errc got{};
    std::thread w([&] {
      tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
      got = compcntr::wait(c, UINT64_MAX, 20s, compcntr::wait_options{.spin = 0ns});
    });
    REQUIRE(eventually_blocked(tid));
    c.add_error(1);
    w.join();
    CHECK(got == std::errc::io_error);
  }
}

// A 2-stripe counter (every striped counter on a 2-CPU node, and every shared counter) has a hot
// poll of its own that reads both stripes (src/core/wait/wait.cpp, two_stripes): a spinning
// waiter must see an add on either stripe (the adding thread moves between the first two
// allowed CPUs, so both stripes are written), and an error change on either.
TEST_CASE("striped: a 2-stripe counter's spinning waiter sees adds and errors on both stripes") {
  auto dev = open_soft();
  auto c = make_striped(dev, 2);
  REQUIRE(c.stripes() == 2);
  const compcntr::wait_options spin{.spin = compcntr::spin_forever};
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  REQUIRE(::sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  std::vector<int> cpus;
  for (int i = 0; i < CPU_SETSIZE && cpus.size() < 2; ++i)
    if (CPU_ISSET(i, &allowed)) cpus.push_back(i);
  auto pin = [&](std::size_t k) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[k % cpus.size()], &one);
    REQUIRE(::pthread_setaffinity_np(::pthread_self(), sizeof one, &one) == 0);
  };
  for (std::uint64_t round = 0; round < 400; ++round) {
    const std::uint64_t goal = c.value() + 1;
    std::atomic<bool> started{false};
    std::errc got = std::errc::invalid_argument;
    std::thread w([&] {
      started.store(true);
      got = compcntr::wait(c, goal, 20s, spin);
    });
    while (!started.load()) std::this_thread::yield();
    std::thread adder([&] {
      pin(round);
      if (round % 2 == 0)
        c.add(1);
      else
        c.add(2);
    });
    adder.join();
    w.join();
    REQUIRE(got == std::errc{});
  }
  CHECK(c.value() == 600);  // 200 x 1 + 200 x 2: nothing lost on either stripe
  for (std::size_t k = 0; k < 2; ++k) {
    std::atomic<bool> started{false};
    std::errc got{};
    std::thread w([&] {
      started.store(true);
      got = compcntr::wait(c, UINT64_MAX, 20s, spin);
    });
    while (!started.load()) std::this_thread::yield();
    std::thread adder([&] {
      pin(k);
      c.add_error(1);
    });
    adder.join();
    w.join();
    CHECK(got == std::errc::io_error);
  }
  CHECK(c.errors() == 2);
  CHECK(c.value() == 600);
  // A stale error count is seen at the first check, before any poll.
  CHECK(compcntr::wait_since(c, UINT64_MAX, 0, 20s, spin) == std::errc::io_error);
}

TEST_CASE("striped: poll_any and the pollable fd see striped updates") {
  auto dev = open_soft();
  auto plain = test_support::make_counter(dev);
  auto s = make_striped(dev, 2);
  std::vector<const compcntr::counter*> cs{&plain, &s};
  const std::uint64_t th[] = {1, 2};
  std::atomic<pid_t> tid{0};
  compcntr::poll_result r{};
  std::thread p([&] {
    tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
    r = compcntr::poll_any(std::span<const compcntr::counter* const>(cs), th, 20s,
                           compcntr::wait_options{.spin = 0ns});
  });
  REQUIRE(eventually_blocked(tid));
  s.add(1);
  REQUIRE(eventually_blocked(tid));  // 1 < 2: still asleep
  s.add(1);
  p.join();
  CHECK(r.status == std::errc{});
  CHECK(r.index == 1);

  std::error_code ec;
  const int fd = compcntr::pollable_fd(s, ec);
  REQUIRE_FALSE(ec);
  compcntr::arm_fd(s, ec);
  REQUIRE_FALSE(ec);
  pollfd pfd{fd, POLLIN, 0};
  CHECK(::poll(&pfd, 1, 0) == 0);  // armed, nothing happened yet
  std::thread u([&] { s.add(1); });
  u.join();
  CHECK(::poll(&pfd, 1, 20000) == 1);
  CHECK((pfd.revents & POLLIN) != 0);
  CHECK(s.value() == 3);
}

TEST_CASE("striped: QP completions count into a striped counter exactly (WRS and BYTES)") {
  auto dev = open_soft();
  auto sends = make_striped(dev, 4);
  auto bytes = make_striped(dev, 4, counter_type::bytes);
  auto a = qpt::make_qp(dev), b = qpt::make_qp(dev);
  qpt::attach(a, sends, static_cast<std::uint32_t>(compcntr::attach_op::send));
  qpt::attach(b, bytes, static_cast<std::uint32_t>(compcntr::attach_op::recv));
  qpt::to_init(a);
  qpt::to_init(b);
  qpt::connect(a, b);
  qpt::buffer src(dev, 64, qpt::all_access), dst(dev, 64 * 10, qpt::all_access);
  std::error_code ec;
  for (int i = 0; i < 10; ++i) {
    b.post_recv(static_cast<std::uint64_t>(i), dst.data() + 64 * i, 64, dst.lkey(), ec);
    REQUIRE_FALSE(ec);
    a.post_send(static_cast<std::uint64_t>(i), src.data(), 24, src.lkey(), ec);
    REQUIRE_FALSE(ec);
  }
  CHECK(sends.value() == 10);
  CHECK(bytes.value() == 240);
  // Attached: destroy is EBUSY and the counter stays usable.
  sends.destroy(ec);
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(sends.value() == 10);
}

TEST_CASE("striped: handles, resolve and asynchronous queries give the sum") {
  auto dev = open_soft();
  auto c = make_striped(dev, 8);
  for (int i = 0; i < 9; ++i) c.add(1);
  c.add_error(4);
  std::error_code ec;
  auto r = dev.resolve(c.id(), ec);
  REQUIRE_FALSE(ec);
  CHECK(r.value() == 9);
  CHECK(r.errors() == 4);
  r.add(1);
  CHECK(c.value() == 10);
  r.reset();
  auto cmd = compcntr::cmd_completion::create(dev, ec);
  REQUIRE_FALSE(ec);
  REQUIRE_FALSE(cmd.query(c, 77));
  const compcntr::query_response resp = cmd.get(ec);
  REQUIRE_FALSE(ec);
  CHECK(resp.wr_id == 77);
  CHECK(resp.values.completions == 10);
  CHECK(resp.values.errors == 4);
  // Destroyed: the handle is stale, and the stripes are freed (ASan: no leak).
  const auto h = c.id();
  c.destroy(ec);
  REQUIRE_FALSE(ec);
  auto gone = dev.resolve(h, ec);
  CHECK(ec.value() == ESTALE);
  CHECK_FALSE(gone);
}

// Review of issues 11 + 12 (merged separately): an fd armed for a threshold must see a striped
// counter's value and errors, which live in its stripes (the slot's own words stay 0). The
// threshold condition read the slot's words directly: never reached, never readable.
TEST_CASE("striped: the pollable fd armed for a threshold sees the stripes' sum") {
  auto dev = open_soft();
  auto s = make_striped(dev, 4);
  std::error_code ec;
  const int fd = compcntr::pollable_fd(s, ec);
  REQUIRE_FALSE(ec);
  auto readable = [fd] {
    pollfd pfd{fd, POLLIN, 0};
    return ::poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN) != 0;
  };
  compcntr::arm_fd(s, 3, ec);
  REQUIRE_FALSE(ec);
  CHECK_FALSE(readable());
  s.add(1);
  s.add(1);
  CHECK_FALSE(readable());                 // 2 < 3: still armed
  std::thread u([&] { s.add(1); });        // from another thread (likely another stripe)
  u.join();
  CHECK(s.value() == 3);
  CHECK(readable());                       // 3 >= 3
  // Already reached at the arm: readable at once.
  compcntr::arm_fd(s, 2, ec);
  REQUIRE_FALSE(ec);
  CHECK(readable());
  // An error (counted in a stripe) is news at any value; one from before the arm is not.
  s.add_error(1);
  compcntr::arm_fd(s, 1000, ec);
  REQUIRE_FALSE(ec);
  CHECK_FALSE(readable());
  s.add(1);
  CHECK_FALSE(readable());
  s.add_error(1);
  CHECK(readable());
}

// The issue-11 layers over a striped counter: the completion tracker and an adopted credit
// tracker count the stripes' sum (completions from several threads), and a quiet asleep on it
// is woken by the stripe update that completes its target.
TEST_CASE("striped: completion tracker and adopted credits over a striped counter") {
  auto dev = open_soft();
  auto s = make_striped(dev, 4);
  std::error_code ec;
  auto tr = compcntr::completion_tracker::create(dev, s, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(tr.issue(4) == std::errc{});
  std::atomic<pid_t> tid{0};
  std::atomic<int> rc{-1};
  std::thread q([&] {
    tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
    rc = static_cast<int>(tr.quiet(compcntr::wait_forever, compcntr::wait_options{.spin = 0ns}));
  });
  REQUIRE(eventually_blocked(tid));
  std::thread a([&] {
    s.add(1);
    s.add_error(1);
  });
  a.join();
  s.add(1);
  REQUIRE(eventually_blocked(tid));   // 3 of 4: still asleep
  CHECK(rc.load() == -1);
  s.add(1);
  q.join();
  CHECK(rc.load() == static_cast<int>(std::errc::io_error));   // all 4 over, one failed
  CHECK(tr.completed() == 4);

  auto s2 = make_striped(dev, 2);
  compcntr::counter* peers[] = {&s2};
  const std::uint64_t w[] = {2};
  auto cr = compcntr::credit_tracker::adopt(dev, peers, w, ec);
  REQUIRE_FALSE(ec);
  CHECK(cr.acquire(0, 2, 0ms) == std::errc{});
  CHECK(cr.try_acquire(0, 1) == std::errc::timed_out);
  std::thread c([&] { s2.add(1); });
  c.join();
  CHECK(cr.try_acquire(0, 1) == std::errc{});
  CHECK(cr.outstanding(0) == 2);
}
