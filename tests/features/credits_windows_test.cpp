// compcntr::credit_tracker with a window per peer (create/adopt with a span of windows):
// exact admission per peer, validation naming the peer, the largest window as
// credits_per_peer(), and a multi-threaded run over peers of different windows that checks with
// an independent in-flight count per peer that no peer ever exceeds its own window.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "support.hpp"

using test_support::make_counter;
using test_support::open_soft;
using namespace std::chrono_literals;
using compcntr::credit_tracker;
using std::errc;

namespace {
std::string msg() { return std::string(compcntr::last_error_message()); }
} // namespace

TEST_CASE("credits windows: each peer admits exactly its own window") {
  auto dev = open_soft();
  std::error_code ec;
  const std::array<std::uint64_t, 4> w{3, 1, 8, 2};
  auto tr = credit_tracker::create(dev, w, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(tr);
  CHECK(tr.peers() == 4);
  CHECK(tr.credits_per_peer() == 8);  // the largest
  for (std::uint32_t p = 0; p < 4; ++p) {
    CHECK(tr.window(p) == w[p]);
    CHECK(tr.acquire(p, w[p], 0ms) == errc{});
    CHECK(tr.try_acquire(p, 1) == errc::timed_out);
    CHECK(tr.outstanding(p) == w[p]);
  }
  CHECK(tr.acquire(1, 2, 0ms) == errc::invalid_argument);   // above peer 1's window
  CHECK(msg().find("peer 1's window") != std::string::npos);
  CHECK(tr.release(3, 3) == errc::invalid_argument);
  CHECK(tr.release(2, 5) == errc{});
  CHECK(tr.acquire(2, 5, 0ms) == errc{});
  CHECK(tr.flush(1, 0ms) == errc::timed_out);
  // A uniform tracker: window(p) == credits_per_peer().
  auto u = credit_tracker::create(dev, 2, 5, ec);
  REQUIRE_FALSE(ec);
  CHECK(u.window(0) == 5);
  CHECK(u.window(1) == 5);
  CHECK(u.credits_per_peer() == 5);
}

TEST_CASE("credits windows: validation names the peer and creates nothing") {
  auto dev = open_soft();
  std::error_code ec;
  const std::uint32_t live = dev.live_counters();
  const std::array<std::uint64_t, 3> zero{1, 2, 0};
  auto t = credit_tracker::create(dev, zero, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("the window of peer 2 is 0") != std::string::npos);
  CHECK_FALSE(t);
  const std::array<std::uint64_t, 2> huge{(UINT64_MAX >> 2) + 2, 1};  // above 2^62
  t = credit_tracker::create(dev, huge, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("the window of peer 0") != std::string::npos);
  t = credit_tracker::create(dev, std::span<const std::uint64_t>{}, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(dev.live_counters() == live);  // nothing created by the refusals

  auto a = make_counter(dev), b = make_counter(dev);
  std::vector<compcntr::counter*> cs{&a, &b};
  const std::array<std::uint64_t, 1> one{1};
  t = credit_tracker::adopt(dev, cs, one, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("2 counters but 1 windows") != std::string::npos);
  const std::array<std::uint64_t, 2> two{4, 1};
  a.add(7);
  t = credit_tracker::adopt(dev, cs, two, ec);
  REQUIRE_FALSE(ec);
  CHECK(t.issued(0) == 7);
  CHECK(t.window(0) == 4);
  CHECK(t.window(1) == 1);
  CHECK(t.acquire(1, 1, 0ms) == errc{});
  CHECK(t.try_acquire(1, 1) == errc::timed_out);
  b.add(1);
  CHECK(t.try_acquire(1, 1) == errc{});
}

TEST_CASE("credits windows: stress: no peer ever exceeds its own window") {
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  constexpr int rounds = 5000;
#else
  constexpr int rounds = 20000;
#endif
#else
  constexpr int rounds = 20000;
#endif
  auto dev = open_soft();
  std::error_code ec;
  const std::array<std::uint64_t, 3> w{1, 3, 6};
  auto tr = credit_tracker::create(dev, w, ec);
  REQUIRE_FALSE(ec);
  std::array<std::atomic<std::int64_t>, 3> inflight{}, pending{};
  std::atomic<int> violations{0}, bad{0}, done{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        const std::uint32_t p = static_cast<std::uint32_t>((i + t) % 3);
        if (tr.acquire(p, 1, compcntr::wait_forever) != errc{}) {
          ++bad;
          break;
        }
        if (inflight[p].fetch_add(1) + 1 > static_cast<std::int64_t>(w[p])) ++violations;
        pending[p].fetch_add(1);
      }
      ++done;
    });
  std::thread completer([&] {
    for (;;) {
      bool any = false;
      for (std::uint32_t p = 0; p < 3; ++p) {
        std::int64_t n = pending[p].load();
        if (n > 0 && pending[p].compare_exchange_weak(n, n - 1)) {
          any = true;
          if (inflight[p].fetch_sub(1) < 1) ++violations;
          compcntr::plugin::slot* s = tr.peer_counter(p).native_slot();
          s->add(1);  // the operation to p completed
        }
      }
      if (!any) {
        if (done.load() == 2 && pending[0] == 0 && pending[1] == 0 && pending[2] == 0) break;
        std::this_thread::yield();
      }
    }
  });
  for (auto& t : ts) t.join();
  completer.join();
  CHECK(violations.load() == 0);
  CHECK(bad.load() == 0);
  std::uint64_t total = 0;
  for (std::uint32_t p = 0; p < 3; ++p) {
    CHECK(tr.outstanding(p) == 0);
    total += tr.issued(p);
  }
  CHECK(total == 2u * rounds);
}

// Review of issue 11: adopt() must refuse what it cannot track. A counter of another device
// (whose range may differ from the mask the tracker computes, and whose device's progress
// sources the tracker's waits would not drive) and the same counter for two peers (one peer's
// completions would then return the other's credits: over-subscription) are EINVAL, name their
// cause, and leave nothing behind (no reference: the counters can be destroyed).
TEST_CASE("credits adopt: a counter of another device, or one counter for two peers, is EINVAL") {
  auto dev = open_soft();
  auto other = open_soft();
  std::error_code ec;
  auto a = make_counter(dev), b = make_counter(dev);
  auto foreign = make_counter(other);
  const std::array<std::uint64_t, 2> two{2, 2};

  std::vector<compcntr::counter*> with_foreign{&a, &foreign};
  auto t = credit_tracker::adopt(dev, with_foreign, two, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(t);
  CHECK(msg().find("counter 1 belongs to another device") != std::string::npos);
  t = credit_tracker::adopt(dev, with_foreign, 2, ec);   // the uniform-window form too
  CHECK(ec == std::errc::invalid_argument);
  const std::array<compcntr::counter_view, 2> views_foreign{a.view(), foreign.view()};
  t = credit_tracker::adopt(dev, views_foreign, two, ec);
  CHECK(ec == std::errc::invalid_argument);

  std::vector<compcntr::counter*> twice{&a, &a};
  t = credit_tracker::adopt(dev, twice, two, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(t);
  CHECK(msg().find("counters 0 and 1 are the same counter") != std::string::npos);
  const std::array<compcntr::counter_view, 3> views_twice{b.view(), a.view(), b.view()};
  t = credit_tracker::adopt(dev, views_twice, 1, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("counters 0 and 2 are the same counter") != std::string::npos);

  // What a shared counter would have allowed: peer 1's completion admitting peer 0 again.
  std::vector<compcntr::counter*> good{&a, &b};
  t = credit_tracker::adopt(dev, good, two, ec);
  REQUIRE_FALSE(ec);
  CHECK(t.acquire(0, 2, 0ms) == errc{});
  b.add(1);                                     // a completion of peer 1's counter
  CHECK(t.try_acquire(0, 1) == errc::timed_out);  // returns no credit of peer 0
  t = credit_tracker{};

  // The refusals held nothing.
  a.destroy(ec);
  CHECK_FALSE(ec);
  foreign.destroy(ec);
  CHECK_FALSE(ec);
}
