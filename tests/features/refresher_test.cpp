// The mirror refresher on a fake device whose counter values live in the device, not the slots.
#include <doctest/doctest.h>

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "fake_device.hpp"

namespace {

struct fake_setup {
  std::shared_ptr<fake::stats> st = std::make_shared<fake::stats>();
  compcntr::device dev = fake::open(st);
  fake_setup() { REQUIRE(dev); }

  compcntr::counter counter() {
    std::error_code ec;
    auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
    REQUIRE_FALSE(ec);
    return c;
  }
  compcntr::mirror_refresher refresher(std::chrono::nanoseconds interval = {}) {
    std::error_code ec;
    auto r = compcntr::mirror_refresher::create(dev, ec, interval);
    REQUIRE_FALSE(ec);
    REQUIRE(r);
    return r;
  }
};

/// Drives refresh() until two more rounds have completed: the second one was issued after
/// this call started, so every device update made before the call is in the mirrors.
bool refresh_fully(compcntr::mirror_refresher& r) {
  const std::uint64_t goal = r.rounds() + 2;
  return eventually([&] {
    r.refresh();
    return r.rounds() >= goal;
  });
}

} // namespace

TEST_CASE("mirrors of device-held counters follow the device through batched queries") {
  fake_setup f;
  auto r = f.refresher();
  std::vector<compcntr::counter> cs;
  for (int i = 0; i < 200; ++i) cs.push_back(f.counter());
  for (int i = 0; i < 200; ++i) {
    cs[i].add(i + 1);        // goes to the device
    cs[i].add_error(i % 3);
    CHECK(cs[i].value() == 0);  // the mirror has not been refreshed
    REQUIRE_FALSE(r.watch(cs[i]));
  }
  CHECK(r.watched() == 200);
  REQUIRE(refresh_fully(r));
  for (int i = 0; i < 200; ++i) {
    CHECK(cs[i].value() == std::uint64_t(i + 1));
    CHECK(cs[i].errors() == std::uint64_t(i % 3));
  }
  // Batched: the engine answers up to 64 queries per device command.
  const std::uint64_t queried = f.st->queried.load(), calls = f.st->query_calls.load();
  CHECK(queried >= 2 * 200);
  CHECK(calls * 32 <= queried);
  MESSAGE(queried << " queries answered in " << calls << " device commands");

  // Later device updates reach the mirrors in later rounds.
  cs[5].set(1000);
  cs[6].set_error(77);
  REQUIRE(refresh_fully(r));
  CHECK(cs[5].value() == 1000);
  CHECK(cs[6].errors() == 77);
}

TEST_CASE("an epoll loop on the refresher's fd drives it") {
  fake_setup f;
  auto r = f.refresher();
  auto c = f.counter();
  REQUIRE_FALSE(r.watch(c));
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, r.fd(), &ev) == 0);
  r.refresh();  // starts the first round
  c.add(12);
  int wakeups = 0;
  while (c.value() != 12 && wakeups < 1000) {
    epoll_event out{};
    REQUIRE(::epoll_wait(ep, &out, 1, 30000) == 1);  // the timeout only guards against a hang
    ++wakeups;
    r.refresh();
  }
  CHECK(c.value() == 12);
  CHECK(wakeups >= 1);
  ::close(ep);
}

TEST_CASE("watch and unwatch errors") {
  fake_setup f;
  auto r = f.refresher();
  auto c = f.counter();
  CHECK_FALSE(r.watch(c));
  CHECK(r.watch(c) == std::errc::file_exists);
  compcntr::counter empty;
  CHECK(r.watch(empty) == std::errc::invalid_argument);

  std::error_code ec;
  auto soft = compcntr::device::open("soft", ec);
  auto sc = soft.create_counter(compcntr::counter_type::wrs, ec);
  CHECK(r.watch(sc) == std::errc::invalid_argument);  // another device
  auto soft_r = compcntr::mirror_refresher::create(soft, ec);
  REQUIRE_FALSE(ec);
  CHECK(soft_r.watch(sc) == std::errc::invalid_argument);  // a software counter
  CHECK(std::string(compcntr::last_error_message()).find("software counter") != std::string::npos);

  CHECK_FALSE(r.unwatch(c));
  CHECK(r.unwatch(c) == std::errc::no_such_file_or_directory);
  CHECK(r.watched() == 0);
}

TEST_CASE("a watched counter can be destroyed; its slot is let go at the next round") {
  fake_setup f;
  auto r = f.refresher();
  auto keep = f.counter();
  auto gone = f.counter();
  REQUIRE_FALSE(r.watch(keep));
  REQUIRE_FALSE(r.watch(gone));
  REQUIRE(refresh_fully(r));
  std::error_code ec;
  gone.destroy(ec);  // never EBUSY because of the refresher
  CHECK_FALSE(ec);
  keep.add(3);
  REQUIRE(refresh_fully(r));
  CHECK(keep.value() == 3);
  CHECK(r.watched() == 1);
  CHECK(f.dev.live_counters() == 1);
  CHECK(f.st->bound == 1);  // the device counter was unbound once the refresher let go
}

TEST_CASE("unwatch mid-round ignores the late answer; reset releases everything") {
  fake_setup f;
  auto r = f.refresher();
  auto c = f.counter();
  c.add(5);
  REQUIRE_FALSE(r.watch(c));
  r.refresh();            // round in flight for c
  REQUIRE_FALSE(r.unwatch(c));
  REQUIRE(eventually([&] {
    r.refresh();
    return r.rounds() >= 1;
  }));
  CHECK(c.value() == 0);  // the answer arrived for an unwatched counter: not stored
  REQUIRE_FALSE(r.watch(c));
  r.refresh();
  c.reset();
  r.reset();               // discards the round in flight, lets the destroyed counter go
  CHECK(f.dev.live_counters() == 0);
  std::error_code ec;
  f.dev.close(ec);
  CHECK_FALSE(ec);
}

TEST_CASE("refresh from many threads at once (drive functions of several waiters)") {
  fake_setup f;
  auto r = f.refresher();
  std::vector<compcntr::counter> cs;
  for (int i = 0; i < 16; ++i) {
    cs.push_back(f.counter());
    REQUIRE_FALSE(r.watch(cs.back()));
  }
  std::atomic<bool> done{false};
  std::vector<std::thread> drivers;
  for (int t = 0; t < 3; ++t)
    drivers.emplace_back([&] {
      while (!done) compcntr::mirror_refresher::refresh_drive(&r);
    });
  for (int k = 0; k < 2000; ++k) cs[k % 16].add(1);
  // Each mirror reaches its device value while other threads drive the refresher.
  const bool all = eventually([&] {
    for (auto& c : cs)
      if (c.value() != 125) return false;
    return true;
  });
  done = true;
  for (auto& t : drivers) t.join();
  CHECK(all);
}

TEST_CASE("min_interval paces the rounds") {
  fake_setup f;
  auto r = f.refresher(std::chrono::hours(1));
  auto c = f.counter();
  REQUIRE_FALSE(r.watch(c));
  REQUIRE(eventually([&] {
    r.refresh();
    return r.rounds() >= 1;
  }));
  const std::uint64_t queried = f.st->queried.load();
  for (int i = 0; i < 100; ++i) r.refresh();
  CHECK(r.rounds() == 1);
  CHECK(f.st->queried.load() == queried);  // no new round within the hour
}
