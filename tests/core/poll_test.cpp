// compcntr::poll_any and pollable fds (import compcntr;): index correctness, fairness, EINVAL,
// error wake-ups, sleeping on many counters, a poll ping-pong, and fd readiness through epoll.
module;
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/epoll.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
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

std::vector<compcntr::counter> make_n(compcntr::device& dev, std::size_t n) {
  std::vector<compcntr::counter> v;
  for (std::size_t i = 0; i < n; ++i) {
    std::error_code ec;
    v.push_back(dev.create_counter(compcntr::counter_type::wrs, ec));
    REQUIRE_FALSE(ec);
  }
  return v;
}

bool has_poller(const compcntr::counter& c) {
  return (c.native_slot()->watch.load() & compcntr::detail::watch_pollers) != 0;
}

compcntr::wait_options forced_sleep() {
  compcntr::wait_options o;
  o.spin = std::chrono::nanoseconds::zero();
  return o;
}

// Number of events epoll reports right now (timeout 0) or within `ms`.
int ready(int ep, int ms = 0) {
  epoll_event ev[4];
  return ::epoll_wait(ep, ev, 4, ms);
}

} // namespace

TEST_CASE("poll_any: the index of the counter that is ready, EIO with the index, timeouts") {
  auto dev = open_soft();
  auto cs = make_n(dev, 4);
  std::vector<std::uint64_t> th{3, 3, 3, 3};
  auto r = compcntr::poll_any(cs, th, 0ms);
  CHECK(r.status == std::errc::timed_out);
  cs[2].add(3);
  r = compcntr::poll_any(cs, th, 0ms);
  CHECK(r.status == std::errc{});
  CHECK(r.index == 2);
  th[2] = 4;
  cs[1].add_error(1);  // before the call: does not count
  CHECK(compcntr::poll_any(cs, th, 0ms).status == std::errc::timed_out);
  const auto t0 = test_util::clock_type::now();
  CHECK(compcntr::poll_any(cs, th, 60ms).status == std::errc::timed_out);
  CHECK(test_util::clock_type::now() - t0 >= 60ms);

  // Pointer form, with the same counter twice.
  std::vector<const compcntr::counter*> ptrs{&cs[0], &cs[3], &cs[3]};
  std::vector<std::uint64_t> th3{1, 5, 0};
  r = compcntr::poll_any(std::span<const compcntr::counter* const>(ptrs), th3, 0ms);
  CHECK(r.status == std::errc{});
  CHECK(r.index == 2);

  // An error during the call: EIO and the index of the counter it happened on.
  std::atomic<int> status{-1};
  std::atomic<std::size_t> index{99};
  std::thread poller([&] {
    const auto res = compcntr::poll_any(cs, th, 30s, forced_sleep());
    status = static_cast<int>(res.status);
    index = res.index;
  });
  REQUIRE(eventually([&] { return has_poller(cs[0]) && has_poller(cs[3]); }));
  cs[3].add_error(2);
  poller.join();
  CHECK(status.load() == static_cast<int>(std::errc::io_error));
  CHECK(index.load() == 3);
  for (auto& c : cs) CHECK(c.native_slot()->watch.load() == 0);
}

TEST_CASE("poll_any: invalid arguments") {
  auto dev = open_soft();
  auto cs = make_n(dev, 2);
  std::vector<std::uint64_t> th{1, 1};
  CHECK(compcntr::poll_any(std::span<const compcntr::counter>{}, {}, 0ms).status ==
        std::errc::invalid_argument);
  CHECK(compcntr::poll_any(cs, std::span<const std::uint64_t>(th).first(1), 0ms).status ==
        std::errc::invalid_argument);
  std::vector<const compcntr::counter*> ptrs{&cs[0], nullptr};
  CHECK(compcntr::poll_any(std::span<const compcntr::counter* const>(ptrs), th, 0ms).status ==
        std::errc::invalid_argument);
  CHECK(std::string(compcntr::last_error_message()).find("counter 1") != std::string::npos);
  cs[1].reset();
  CHECK(compcntr::poll_any(cs, th, 0ms).status == std::errc::invalid_argument);
}

TEST_CASE("poll_any: fair, ready counters are returned in turn") {
  auto dev = open_soft();
  auto cs = make_n(dev, 5);
  std::vector<std::uint64_t> th(5, 1);
  for (auto& c : cs) c.add(1);
  std::vector<int> hits(5, 0);
  std::size_t prev = compcntr::poll_any(cs, th, 0ms).index;
  for (int k = 0; k < 50; ++k) {
    const auto r = compcntr::poll_any(cs, th, 0ms);
    REQUIRE(r.status == std::errc{});
    CHECK(r.index == (prev + 1) % 5);  // round robin
    prev = r.index;
    ++hits[r.index];
  }
  for (int h : hits) CHECK(h == 10);

  // Only 1 and 3 ready: they alternate, neither starves.
  cs[0].set(0);
  cs[2].set(0);
  cs[4].set(0);
  int ones = 0, threes = 0;
  for (int k = 0; k < 40; ++k) {
    const auto r = compcntr::poll_any(cs, th, 0ms);
    REQUIRE(r.status == std::errc{});
    REQUIRE((r.index == 1 || r.index == 3));
    (r.index == 1 ? ones : threes)++;
  }
  CHECK(ones == 20);
  CHECK(threes == 20);
}

TEST_CASE("poll_any: a sleeping poller is woken by any of its counters, in every mode") {
  auto dev = open_soft();
  auto cs = make_n(dev, 3);
  const std::chrono::nanoseconds spins[] = {
      compcntr::default_spin, std::chrono::nanoseconds::zero(), compcntr::spin_forever};
  for (std::size_t round = 0; round < 6; ++round) {
    const std::size_t target = round % 3;
    CAPTURE(round);
    std::vector<std::uint64_t> th;
    for (auto& c : cs) th.push_back(c.value() + 1);
    std::atomic<bool> inside{false};
    compcntr::wait_options o;
    o.spin = spins[round / 2];
    o.drive = [](void* p) { static_cast<std::atomic<bool>*>(p)->store(true); };
    o.drive_ctx = &inside;
    std::atomic<int> status{-1};
    std::atomic<std::size_t> index{99};
    std::thread poller([&] {
      const auto r = compcntr::poll_any(cs, th, 30s, o);
      status = static_cast<int>(r.status);
      index = r.index;
    });
    REQUIRE(eventually([&] { return inside.load(); }));
    cs[target].add(1);
    poller.join();
    CHECK(status.load() == 0);
    CHECK(index.load() == target);
  }
  // Forced sleep, no drive function: the poller is registered on every counter before it sleeps.
  std::vector<std::uint64_t> th;
  for (auto& c : cs) th.push_back(c.value() + 2);
  std::atomic<std::size_t> index{99};
  std::thread poller([&] { index = compcntr::poll_any(cs, th, 30s, forced_sleep()).index; });
  REQUIRE(eventually([&] { return has_poller(cs[0]) && has_poller(cs[1]) && has_poller(cs[2]); }));
  cs[1].add(1);  // below its threshold: the poller goes back to sleep
  REQUIRE(eventually([&] { return has_poller(cs[0]) && has_poller(cs[1]) && has_poller(cs[2]); }));
  cs[1].add(1);
  poller.join();
  CHECK(index.load() == 1);
  for (auto& c : cs) CHECK(c.native_slot()->watch.load() == 0);
}

TEST_CASE("poll_any: more counters than the on-stack state, and pollers beside waiters") {
  auto dev = open_soft();
  auto cs = make_n(dev, 100);
  std::vector<std::uint64_t> th(100, 1);
  std::atomic<std::size_t> idx[2] = {99, 99};
  std::atomic<int> waited{-1};
  std::vector<std::thread> ts;
  for (int p = 0; p < 2; ++p)
    ts.emplace_back([&, p] { idx[p] = compcntr::poll_any(cs, th, 30s, forced_sleep()).index; });
  ts.emplace_back(
      [&] { waited = static_cast<int>(compcntr::wait(cs[77], 1, 30s, forced_sleep())); });
  REQUIRE(eventually([&] {
    return has_poller(cs[0]) && has_poller(cs[99]) &&
           (cs[77].native_slot()->watch.load() & compcntr::detail::watch_sleepers_mask) == 1;
  }));
  cs[77].add(1);
  for (auto& t : ts) t.join();
  CHECK(idx[0].load() == 77);
  CHECK(idx[1].load() == 77);
  CHECK(waited.load() == 0);
}

TEST_CASE("poll_any: drive functions keep running while the poller sleeps") {
  auto dev = open_soft();
  auto cs = make_n(dev, 2);
  struct ctx_t {
    compcntr::counter* c;
    int calls = 0;
  } x{&cs[1], 0};
  compcntr::wait_options o = forced_sleep();
  o.drive = [](void* p) {
    auto* x = static_cast<ctx_t*>(p);
    if (++x->calls == 20) x->c->add(1);
  };
  o.drive_ctx = &x;
  o.drive_interval = 1ms;
  std::vector<std::uint64_t> th{1, 1};
  const auto r = compcntr::poll_any(cs, th, 30s, o);
  CHECK(r.status == std::errc{});
  CHECK(r.index == 1);
  CHECK(x.calls == 20);
}

TEST_CASE("poll_any: 20,000-round ping-pong through polls loses no wake-up") {
  // As the wait ping-pong (wait_test.cpp): main sends on left[k], k = i / 4 % 16, the other thread
  // polls all 16 of `left` (threshold 1 on that counter, unreachable on the others), consumes
  // the token with set(0) and answers on right[k]. main aims its sends (0-15 pauses after the
  // event); the poller registers on its counters in index order, one lock each:
  //   odd rounds: once the poller is registered on all of them (the window between the
  //               registrations and the futex);
  //   2 mod 4:    once it is registered on left[0] (for most k: while it is registering);
  //   0 mod 4:    after a 0-1023-pause jitter, the poller on default options.
  // Forced sleep except in rounds 0 mod 4. A poll that lasts its whole timeout counts as a lost
  // wake-up even if its last check succeeds.
  auto dev = open_soft();
  constexpr std::size_t n = 16;
  auto left = make_n(dev, n);
  auto right = make_n(dev, n);
  constexpr std::uint64_t rounds = 20'000;
  constexpr auto lost = 10s;
  auto thresholds = [](std::size_t k) {
    std::vector<std::uint64_t> th(n, UINT64_MAX);
    th[k] = 1;
    return th;
  };
  auto timed_poll = [&](const std::vector<compcntr::counter>& cs, std::size_t k,
                        const compcntr::wait_options& o) {
    const auto t0 = test_util::clock_type::now();
    const auto r = compcntr::poll_any(cs, thresholds(k), lost, o);
    return r.status == std::errc{} && r.index == k && test_util::clock_type::now() - t0 < lost;
  };
  auto pauses = [](std::uint64_t& x, std::uint64_t mask) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; // xorshift64
    for (std::uint64_t k = x & mask; k > 0; --k) compcntr::cpu_relax();
  };
  std::atomic<std::uint64_t> fail_a{0}, fail_b{0};
  std::thread other([&] {
    for (std::uint64_t i = 1; i <= rounds; ++i) {
      const std::size_t k = (i / 4) % n;
      compcntr::wait_options o = forced_sleep();
      if (i % 4 == 0) o.spin = compcntr::default_spin;
      if (!timed_poll(left, k, o)) {
        fail_a = i;
        break;
      }
      left[k].set(0); // consume
      right[k].add(1);
    }
  });
  compcntr::wait_options main_opts;
  main_opts.spin = 50us;
  std::uint64_t x = 0x2545f4914f6cdd1du;
  std::uint64_t registered_seen = 0; // aimed rounds in which the poller went to sleep
  for (std::uint64_t i = 1; i <= rounds; ++i) {
    const std::size_t k = (i / 4) % n;
    if (i % 4 != 0) {
      auto registered = [&] { return has_poller(left[i % 4 == 2 ? 0 : n - 1]); };
      const auto guard = test_util::clock_type::now() + 30s;
      for (unsigned spins = 0; !registered(); ++spins) {
        if (spins < 1024) {
          compcntr::cpu_relax();
        } else {
          ::sched_yield();
          if (test_util::clock_type::now() > guard) break;
        }
      }
      registered_seen += registered();
      pauses(x, 15);
    } else {
      pauses(x, 1023);
    }
    left[k].add(1);
    if (!timed_poll(right, k, main_opts)) {
      fail_b = i;
      break;
    }
    right[k].set(0);
  }
  other.join();
  CHECK(registered_seen == rounds / 4 * 3); // the sleep path was taken in every aimed round
  CHECK(fail_a.load() == 0);
  CHECK(fail_b.load() == 0);
}

TEST_CASE("pollable fd: readable only after a change once armed, through epoll") {
  auto dev = open_soft();
  auto cs = make_n(dev, 1);
  auto& c = cs[0];
  std::error_code ec;
  compcntr::arm_fd(c, ec); // no fd yet
  CHECK(ec == std::errc::invalid_argument);
  const int fd = compcntr::pollable_fd(c, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(fd >= 0);
  CHECK(compcntr::pollable_fd(c, ec) == fd);
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
  CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);

  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);

  CHECK(ready(ep) == 0);
  c.add(1); // not armed: nothing, and the increment did not even look at the fd
  CHECK(ready(ep) == 0);
  CHECK(c.native_slot()->watch.load() == 0);

  compcntr::arm_fd(c, ec);
  REQUIRE_FALSE(ec);
  CHECK(c.native_slot()->watch.load() == compcntr::detail::watch_fd_armed);
  CHECK(ready(ep) == 0); // armed, no change yet
  c.add(1);
  CHECK(ready(ep) == 1);
  CHECK(c.native_slot()->watch.load() == 0); // one-shot: later updates pay nothing
  c.add(1);
  CHECK(ready(ep) == 1); // stays readable until re-armed

  compcntr::arm_fd(c, ec); // drains
  CHECK(ready(ep) == 0);
  c.add_error(1); // errors count as changes too
  CHECK(ready(ep) == 1);
  compcntr::arm_fd(c, ec);
  CHECK(ready(ep) == 0);
  c.set(0);
  CHECK(ready(ep) == 1);

  // A thread blocked in epoll_wait is woken by another thread's increment.
  compcntr::arm_fd(c, ec);
  REQUIRE(ready(ep) == 0);
  std::atomic<int> got{-1};
  std::thread t([&] { got = ready(ep, 30'000); });
  c.add(5);
  t.join();
  CHECK(got.load() == 1);

  ::close(ep);
  cs.clear(); // destroying the counter closes its fd
  CHECK(::fcntl(fd, F_GETFD) == -1);
  CHECK(errno == EBADF);
}
