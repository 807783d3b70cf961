// Counter ids (compcntr::counter_id, device::resolve, compcntr:counter_ref): ESTALE after destroy
// even once the slot is reused, a counter_ref outliving its owner, and the races of resolve.
module;
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

module compcntr;  // a white-box test: a unit of the module (it reads compcntr::detail)

#include "support.hpp"

using test_support::make_counter;
using test_support::open_soft;

using compcntr::detail::pool_config;
using compcntr::detail::slot;
using compcntr::detail::slot_pool;

namespace {

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != hay.npos;
}

} // namespace

TEST_CASE(
    "counter ids: resolve a live counter, ESTALE after destroy even once the slot is reused") {
  auto dev = open_soft();
  std::error_code ec;
  auto c = dev.create_counter(compcntr::counter_type::bytes, ec);
  REQUIRE_FALSE(ec);
  const compcntr::counter_id h = c.id();
  CHECK(h.index == c.index());
  {
    auto r = dev.resolve(h, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(r);
    CHECK(r.index() == c.index());
    CHECK(r.type() == compcntr::counter_type::bytes);
    CHECK(r.id() == h);
    r.add(5);
    CHECK(c.value() == 5);
    // A referenced counter cannot be destroyed by destroy(ec): EBUSY, nothing changes.
    c.destroy(ec);
    CHECK(ec == std::errc::device_or_resource_busy);
    CHECK(contains(compcntr::last_error_message(), "counter_ref"));
    REQUIRE(c);
    c.add(1);
    CHECK(r.value() == 6);
  }
  c.destroy(ec);
  CHECK_FALSE(ec);
  CHECK(dev.live_counters() == 0);
  auto stale = dev.resolve(h, ec);
  CHECK(ec.value() == ESTALE);
  CHECK_FALSE(stale);
  CHECK(contains(compcntr::last_error_message(), "stale"));
  // The slot goes to the next counter (LIFO free list): the old handle still cannot reach it.
  auto next = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE_FALSE(ec);
  CHECK(next.index() == h.index);
  CHECK_FALSE(next.id() == h);
  auto again = dev.resolve(h, ec);
  CHECK(ec.value() == ESTALE);
  CHECK_FALSE(again);
  CHECK(next.value() == 0);
  auto fresh = dev.resolve(next.id(), ec);
  CHECK_FALSE(ec);
  CHECK(fresh);
  // Handles that name no slot at all.
  CHECK_FALSE(dev.resolve(compcntr::counter_id{}, ec));
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(dev.resolve({.generation = 0, .index = 123456789}, ec));
  CHECK(ec == std::errc::invalid_argument);
}

TEST_CASE(
    "counter ids: a counter_ref outlives its owner's reset(); the last holder frees the slot") {
  auto dev = open_soft();
  std::error_code ec;
  auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
  const auto h = c.id();
  auto r = dev.resolve(h, ec);
  REQUIRE(r);
  c.reset();  // the owner lets go; the ref keeps the counter
  CHECK(dev.live_counters() == 1);
  r.add(2);
  CHECK(r.value() == 2);
  auto r2 = dev.resolve(h, ec);  // still live: a second reference
  CHECK_FALSE(ec);
  auto moved = std::move(r);
  CHECK_FALSE(r);
  moved.reset();
  CHECK(dev.live_counters() == 1);
  r2.reset();
  CHECK(dev.live_counters() == 0);
  CHECK_FALSE(dev.resolve(h, ec));
  CHECK(ec.value() == ESTALE);
}

TEST_CASE("counter ids under races: a stale id never reaches the slot's new owners") {
  auto dev = open_soft();
  std::error_code ec;
  auto first = dev.create_counter(compcntr::counter_type::wrs, ec);
  const auto h = first.id();
  first.reset();
  std::atomic<bool> done{false};
  std::atomic<long> wrongly_resolved{0}, resolves{0};
  std::thread prober([&] {
    while (!done.load()) {
      std::error_code e;
      if (auto r = dev.resolve(h, e)) {
        ++wrongly_resolved;
        r.add(1000);  // would show up in a new owner's value
      }
      ++resolves;
    }
  });
  while (resolves.load() == 0) std::this_thread::yield();  // the prober runs during the churn
  int reused = 0, dirty = 0;
  for (int i = 0; i < 20000; ++i) {
    std::error_code e;
    auto c = dev.create_counter(compcntr::counter_type::wrs, e);
    if (e) {
      ++dirty;
      continue;
    }
    reused += c.index() == h.index;
    c.add(1);
    if (c.value() != 1) ++dirty;
    c.reset();
  }
  done = true;
  prober.join();
  CHECK(wrongly_resolved.load() == 0);
  CHECK(dirty == 0);
  CHECK(reused > 0);
  CHECK(resolves.load() > 0);
  CHECK(dev.live_counters() == 0);
}

TEST_CASE("counter ids under races: resolve racing with the owner's destruction") {
  auto dev = open_soft();
  for (int round = 0; round < 100; ++round) {
    std::error_code ec;
    auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
    REQUIRE_FALSE(ec);
    const auto h = c.id();
    std::atomic<long> counted{0};
    std::atomic<bool> go{false};
    std::atomic<int> bad{0};
    std::thread user([&] {
      go = true;
      for (;;) {
        std::error_code e;
        auto r = dev.resolve(h, e);
        if (!r) {
          if (e.value() != ESTALE) ++bad;
          return;
        }
        r.add(1);
        ++counted;
      }
    });
    while (!go.load()) std::this_thread::yield();
    while (counted.load() < round % 3) std::this_thread::yield();  // vary the overlap
    // Destroy while the user resolves: either refused (a ref is held) or done; reset() always is.
    std::error_code e;
    c.destroy(e);
    if (e) {
      CHECK(e == std::errc::device_or_resource_busy);
      c.reset();
    }
    user.join();
    CHECK(bad.load() == 0);
    CHECK(dev.live_counters() == 0); // freed exactly once, by the last holder
  }
}
