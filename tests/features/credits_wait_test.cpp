// The credit tracker (compcntr:credits) waiting: sleeping acquirers woken by completions, timeouts,
// error completions and EIO, the largest timeouts, drive functions, and the over-subscription
// stress.
#include <doctest/doctest.h>

#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "blocked.hpp"
#include "wait_util.hpp"

import compcntr;

#include "support.hpp"

using test_support::make_counter;
using test_support::open_soft;

using namespace std::chrono_literals;
using compcntr::credit_tracker;
using std::errc;

namespace {

pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// A tracker over counters the test owns (so it can complete operations with add/add_error).
struct adopted {
  compcntr::device dev = open_soft();
  std::vector<compcntr::counter> c;
  credit_tracker tr;
  adopted(std::uint32_t npeers, std::uint64_t credits) {
    std::vector<compcntr::counter*> p;
    for (std::uint32_t i = 0; i < npeers; ++i) c.push_back(make_counter(dev));
    for (auto& x : c) p.push_back(&x);
    std::error_code ec;
    tr = credit_tracker::adopt(dev, p, credits, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(tr);
  }
};

compcntr::wait_options sleep_at_once() { return compcntr::wait_options{.spin = 0ns}; }

// Runs `f` in a thread that records its tid first; join() returns f's result.
struct waiter {
  std::atomic<pid_t> tid{0};
  std::atomic<int> rc{-1};
  std::thread t;
  template <class F>
  explicit waiter(F f)
      : t([this, f] {
          tid = this_tid();
          rc = static_cast<int>(f());
        }) {}
  bool blocked() { return eventually_blocked(tid); }
  int join() {
    t.join();
    return rc.load();
  }
};

struct drive_state {
  compcntr::counter* c;
  std::atomic<int> calls{0};
};

void complete_one(void* ctx) { // a "network progress" function that completes an operation
  auto* h = static_cast<drive_state*>(ctx);
  h->calls.fetch_add(1);
  h->c->add(1);
}

} // namespace

TEST_CASE("credits: a sleeping acquire is woken by a completion from another thread") {
  adopted a(1, 2);
  auto& tr = a.tr;
  REQUIRE(tr.acquire(0, 2, 0ms) == errc{});
  waiter w([&] { return tr.acquire(0, 1, compcntr::wait_forever, sleep_at_once()); });
  REQUIRE(w.blocked()); // really asleep in the kernel
  CHECK(tr.issued(0) == 2);
  a.c[0].add(1);
  CHECK(w.join() == 0);
  CHECK(tr.issued(0) == 3);
  CHECK(tr.outstanding(0) == 2);

  // The same with the default spin-then-sleep and a finite timeout.
  waiter w2([&] { return tr.acquire(0, 2, 60s); });
  REQUIRE(w2.blocked());
  a.c[0].add(1); // one back: 1 + 2 > 2, still waiting
  REQUIRE(w2.blocked());
  CHECK(w2.rc.load() == -1);
  a.c[0].add(1);
  CHECK(w2.join() == 0);
  CHECK(tr.outstanding(0) == 2);
}

TEST_CASE("credits: several sleeping acquirers, completions admit exactly as many") {
  adopted a(1, 3);
  auto& tr = a.tr;
  REQUIRE(tr.acquire(0, 3, 0ms) == errc{});
  std::vector<std::unique_ptr<waiter>> ws;
  for (int i = 0; i < 3; ++i)
    ws.push_back(
        std::make_unique<waiter>([&] { return tr.acquire(0, 1, compcntr::wait_forever); }));
  for (auto& w : ws) REQUIRE(w->blocked());
  a.c[0].add(2); // two credits: two of three waiters get in, the third keeps waiting
  auto admitted = [&] {
    int n = 0;
    for (auto& w : ws) n += w->rc.load() == 0;
    return n;
  };
  REQUIRE(test_util::eventually([&] { return admitted() == 2; }));
  CHECK(tr.issued(0) == 5);
  for (auto& w : ws)
    if (w->rc.load() != 0) REQUIRE(w->blocked()); // the third went back to sleep
  CHECK(admitted() == 2);
  a.c[0].add(1);
  for (auto& w : ws) CHECK(w->join() == 0);
  CHECK(tr.issued(0) == 6);
  CHECK(tr.outstanding(0) == 3);
}

TEST_CASE("credits: timeouts are never early and take nothing") {
  adopted a(1, 1);
  auto& tr = a.tr;
  REQUIRE(tr.acquire(0, 1, 0ms) == errc{});
  CHECK(tr.try_acquire(0, 1) == errc::timed_out);
  for (auto t : {1ms, 25ms}) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(tr.acquire(0, 1, t) == errc::timed_out);
    CHECK(std::chrono::steady_clock::now() - t0 >= t);
  }
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(tr.flush(0, 20ms) == errc::timed_out);
  CHECK(std::chrono::steady_clock::now() - t0 >= 20ms);
  CHECK(tr.issued(0) == 1);

  // A credit that comes back during a finite wait is taken.
  waiter w([&] { return tr.acquire(0, 1, 60s); });
  REQUIRE(w.blocked());
  a.c[0].add(1);
  CHECK(w.join() == 0);
}

TEST_CASE("credits: errors return credits; EIO when they change without admitting") {
  adopted a(1, 2);
  auto& tr = a.tr;
  auto& c = a.c[0];
  REQUIRE(tr.acquire(0, 2, 0ms) == errc{});
  c.add_error(1); // an operation failed: it is over
  CHECK(tr.completed(0) == 1);
  CHECK(tr.outstanding(0) == 1);
  CHECK(tr.try_acquire(0, 1) == errc{}); // its credit is free again

  // An error during the wait that admits the waiter: success wins.
  waiter w1([&] { return tr.acquire(0, 1, compcntr::wait_forever, sleep_at_once()); });
  REQUIRE(w1.blocked());
  c.add_error(1);
  CHECK(w1.join() == 0);
  CHECK(tr.issued(0) == 4);

  // An error during the wait that does not admit it: EIO, nothing taken.
  waiter w2([&] { return tr.acquire(0, 2, compcntr::wait_forever, sleep_at_once()); });
  REQUIRE(w2.blocked());
  c.add_error(1); // outstanding 1: 1 + 2 > 2
  CHECK(w2.join() == EIO);
  CHECK(tr.issued(0) == 4);
  CHECK(tr.outstanding(0) == 1);

  // Errors before the call are not "during" it.
  REQUIRE(tr.try_acquire(0, 1) == errc{}); // full again
  CHECK(tr.acquire(0, 1, 15ms) == errc::timed_out);
  // A decreasing error count (set_error) is a change as well.
  waiter w3([&] { return tr.acquire(0, 1, compcntr::wait_forever, sleep_at_once()); });
  REQUIRE(w3.blocked());
  c.set_error(0); // issued 5, completed 0: 5 > 2, not admitted
  CHECK(w3.join() == EIO);
  CHECK(tr.issued(0) == 5);
}

// Review finding (2026-11-30): a finite timeout too large for steady_clock's nanoseconds
// overflowed and timed out at once. Above 2^40 ms it is forever, as in compcntr::wait.
TEST_CASE("credits: the largest finite timeouts wait (they are forever)") {
  adopted a(1, 1);
  REQUIRE(a.tr.acquire(0, 1, 0ms) == errc{});
  waiter w([&] { return a.tr.acquire(0, 1, std::chrono::milliseconds::max(), sleep_at_once()); });
  REQUIRE(w.blocked());
  a.c[0].add(1);
  CHECK(w.join() == 0);
  waiter f([&] { return a.tr.flush(0, std::chrono::milliseconds::max(), sleep_at_once()); });
  REQUIRE(f.blocked());
  a.c[0].add(1);
  CHECK(f.join() == 0);
}

TEST_CASE("credits: a drive function drives completions while acquire waits") {
  adopted a(1, 2);
  auto& tr = a.tr;
  REQUIRE(tr.acquire(0, 2, 0ms) == errc{});
  drive_state h{&a.c[0]};
  const compcntr::wait_options o{.drive = complete_one, .drive_ctx = &h};
  CHECK(tr.acquire(0, 2, compcntr::wait_forever, o) == errc{}); // no other thread at all
  CHECK(h.calls.load() == 2);
  // timeout 0: one check after one progress call.
  h.calls = 0;
  CHECK(tr.acquire(0, 1, 0ms, o) == errc{});
  CHECK(h.calls.load() == 1);
  CHECK(tr.outstanding(0) == 2);
  CHECK(tr.flush(0, compcntr::wait_forever, o) == errc{});
}

TEST_CASE("credits: stress: acquirers, a completer and releasers on one peer never exceed "
          "credits_per_peer in flight") {
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  constexpr int rounds = 10000;
#else
  constexpr int rounds = 20000;
#endif
#else
  constexpr int rounds = 20000;
#endif
  static_assert(rounds % 2 == 0);
  constexpr std::uint64_t K = 4;
  constexpr int acquirers = 3;
  adopted a(1, K);
  auto& tr = a.tr;
  auto& c = a.c[0];

  std::atomic<std::int64_t> inflight{0}; // independent of the tracker
  std::atomic<std::int64_t> max_seen{0};
  std::atomic<int> violations{0};
  std::atomic<std::int64_t> pending{0}; // operations handed to the completer
  std::atomic<int> finished{0};
  std::atomic<std::uint64_t> taken{0}, released{0}, completed_ok{0}, completed_err{0};
  std::atomic<int> eio{0}, bad_rc{0};

  std::vector<std::thread> ts;
  for (int t = 0; t < acquirers; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        const std::uint64_t n = 1 + static_cast<std::uint64_t>((i + t) % 2);
        // Thread 0 blocks (spin 5 us, then sleep), thread 1 spins longer (200 us), thread 2
        // polls with try_acquire: sleepers woken together and pollers race for one credit.
        errc r;
        for (;;) {
          if (t == 0)
            r = tr.acquire(0, n, compcntr::wait_forever);
          else if (t == 1)
            r = tr.acquire(0, n, compcntr::wait_forever, {.spin = 200us});
          else if ((r = tr.try_acquire(0, n)) == errc::timed_out) {
            std::this_thread::yield();
            continue;
          }
          if (r != errc::io_error) break;
          ++eio;
        }
        if (r != errc{}) {
          ++bad_rc;
          break;
        }
        taken += n;
        const std::int64_t now =
            inflight.fetch_add(static_cast<std::int64_t>(n)) + static_cast<std::int64_t>(n);
        if (now > static_cast<std::int64_t>(K)) ++violations;
        std::int64_t m = max_seen.load();
        while (now > m && !max_seen.compare_exchange_weak(m, now)) {
        }
        if (i % 5 == 4) { // cancelled before posting: give the credits back
          inflight.fetch_sub(static_cast<std::int64_t>(n));
          if (tr.release(0, n) != errc{}) ++bad_rc;
          released += n;
        } else {
          pending.fetch_add(static_cast<std::int64_t>(n));
        }
      }
      ++finished;
    });
  std::thread completer([&] {
    for (std::uint64_t k = 0;;) {
      std::int64_t p = pending.load();
      if (p == 0) {
        if (finished.load() == acquirers && pending.load() == 0) break;
        std::this_thread::yield();
        continue;
      }
      if (!pending.compare_exchange_weak(p, p - 1)) continue;
      if (inflight.fetch_sub(1) < 1) ++violations; // completing something not in flight
      if (++k % 7 == 0) {
        c.add_error(1);
        ++completed_err;
      } else {
        c.add(1);
        ++completed_ok;
      }
    }
  });
  for (auto& t : ts) t.join();
  completer.join();

  CHECK(violations.load() == 0);
  CHECK(bad_rc.load() == 0);
  CHECK(max_seen.load() <= static_cast<std::int64_t>(K));
  CHECK(inflight.load() == 0);
  const std::uint64_t total = taken.load();
  CHECK(total == static_cast<std::uint64_t>(acquirers) * (rounds / 2) * 3); // n = 1, 2, 1, ...
  CHECK(tr.issued(0) == total);
  CHECK(c.value() == completed_ok.load() + released.load());
  CHECK(c.errors() == completed_err.load());
  CHECK(tr.completed(0) == total);
  CHECK(tr.outstanding(0) == 0);
  MESSAGE("in flight at most " << max_seen.load() << ", " << eio.load() << " EIO retries");
}
