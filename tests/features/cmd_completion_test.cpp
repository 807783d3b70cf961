// The C++ cmd_completion: typed and batched get, exact fd readiness, asynchronous answers,
// many producers with one consumer under stress (run under TSan by CI), destroy races.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "support.hpp"

using test_support::make_counter;
using test_support::open_soft;

#include "blocked.hpp"
#include "fake_device.hpp"

namespace {

compcntr::cmd_completion make_cmd(compcntr::device& dev) {
  std::error_code ec;
  auto cmd = compcntr::cmd_completion::create(dev, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(cmd);
  return cmd;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CMD_TEST_TSAN 1
#endif
#endif
#ifdef CMD_TEST_TSAN
constexpr int stress_scale = 2;  // TSan is ~10x slower: keep the suite well under 30 s
#else
constexpr int stress_scale = 1;
#endif

} // namespace

TEST_CASE("create needs a device; a moved-from cmd_completion is empty") {
  std::error_code ec;
  compcntr::device none;
  auto bad = compcntr::cmd_completion::create(none, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(bad);

  auto dev = open_soft();
  auto a = make_cmd(dev);
  const int fd = a.fd();
  compcntr::cmd_completion b = std::move(a);
  CHECK_FALSE(a);
  CHECK(b.fd() == fd);
  b.reset();
  CHECK_FALSE(b);
  dev.close(ec);
  CHECK_FALSE(ec);
}

TEST_CASE("typed get, batched query and get; readiness tracks the queue exactly") {
  auto dev = open_soft();
  auto cmd = make_cmd(dev);
  auto c = make_counter(dev);
  c.add(7);
  c.add_error(3);
  constexpr std::size_t n = 100;
  std::vector<compcntr::query_request> reqs;
  for (std::size_t i = 0; i < n; ++i) reqs.push_back({&c, 1000 + i});
  std::error_code ec;
  REQUIRE(cmd.query(reqs, ec) == n);
  REQUIRE_FALSE(ec);
  REQUIRE(eventually([&] { return cmd.queued() == n; }));
  CHECK(readable(cmd.fd()));

  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, cmd.fd(), &ev) == 0);

  std::vector<compcntr::query_response> out(30);
  std::size_t next = 1000;
  while (cmd.queued() > 0) {
    const std::size_t got = cmd.get(out, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(got == std::min<std::size_t>(30, n - (next - 1000)));
    for (std::size_t i = 0; i < got; ++i) {
      CHECK(out[i].wr_id == next++);  // one issuer: FIFO
      CHECK(out[i].values.completions == 7);
      CHECK(out[i].values.errors == 3);
    }
    const bool left = cmd.queued() > 0;
    CHECK(readable(cmd.fd()) == left);
    epoll_event e{};
    CHECK(::epoll_wait(ep, &e, 1, 0) == (left ? 1 : 0));
  }
  CHECK(next == 1000 + n);
  ::close(ep);

  // The typed single get.
  REQUIRE_FALSE(cmd.query(c, 5));
  compcntr::query_response r = cmd.get(ec);
  REQUIRE_FALSE(ec);
  CHECK(r.wr_id == 5);
  CHECK(r.values.completions == 7);

  // try_get never blocks, whatever the fd's flags.
  CHECK(cmd.try_get(out, ec) == 0);
  CHECK_FALSE(ec);

  // Errors of a batch: an empty counter stops it after the valid prefix.
  compcntr::counter empty;
  std::vector<compcntr::query_request> mixed{{&c, 1}, {&empty, 2}, {&c, 3}};
  CHECK(cmd.query(mixed, ec) == 1);
  CHECK(ec == std::errc::invalid_argument);
  r = cmd.get(ec);
  CHECK(r.wr_id == 1);
}

TEST_CASE("answers come from the device's engine thread, never the issuing call") {
  auto st = std::make_shared<fake::stats>();
  auto dev = fake::open(st);
  REQUIRE(dev);
  auto c = make_counter(dev);
  auto cmd = make_cmd(dev);
  c.add(4);  // goes to the fake device, not the slot
  CHECK(c.value() == 0);
  std::error_code ec;
  REQUIRE_FALSE(cmd.query(c, 1));
  auto r = cmd.get(ec);
  REQUIRE_FALSE(ec);
  CHECK(r.values.completions == 4);  // the device's value, through backend::query_values
  std::lock_guard lock(st->mu);
  REQUIRE(st->answering_threads.size() == 1);
  CHECK(*st->answering_threads.begin() != std::this_thread::get_id());
}

TEST_CASE("a blocked typed get is woken by the response") {
  auto dev = open_soft();
  auto cmd = make_cmd(dev);
  auto c = make_counter(dev);
  std::atomic<pid_t> tid{0};
  compcntr::query_response r;
  std::error_code ec;
  std::thread consumer([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    r = cmd.get(ec);
  });
  REQUIRE(eventually_blocked(tid));
  REQUIRE_FALSE(cmd.query(c, 31));
  consumer.join();
  CHECK_FALSE(ec);
  CHECK(r.wr_id == 31);
}

TEST_CASE("many producers, one consumer: every wr_id answered exactly once, after its issue") {
  auto dev = open_soft();
  auto cmd = make_cmd(dev);
  constexpr int producers = 4;
  const int per_producer = 40000 / stress_scale;
  std::vector<compcntr::counter> counters;
  for (int p = 0; p < producers; ++p) counters.push_back(make_counter(dev));

  std::atomic<int> refused{0};
  std::atomic<int> wrong_errors{0};  // asserted on the main thread
  std::atomic<bool> abort_test{false};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      // wr_id = producer << 32 | sequence. The producer's counter equals sequence + 1 when the
      // query is issued, so the answer (read later) must be at least that.
      std::vector<compcntr::query_request> batch;
      for (int i = 0; i < per_producer && !abort_test;) {
        counters[p].add(1);
        const std::uint64_t id = (std::uint64_t(p) << 32) | std::uint32_t(i);
        if (i % 3 == 0) { // mix single queries and small batches
          std::error_code e = cmd.query(counters[p], id);
          if (e) {
            if (e != std::errc::resource_unavailable_try_again) ++wrong_errors;
            counters[p].add(-1ull); // undo: the query will be retried
            ++refused;
            std::this_thread::yield();
            continue;
          }
          ++i;
        } else {
          batch.clear();
          batch.push_back({&counters[p], id});
          std::error_code e;
          if (cmd.query(batch, e) != 1) {
            if (e != std::errc::resource_unavailable_try_again) ++wrong_errors;
            counters[p].add(-1ull);
            ++refused;
            std::this_thread::yield();
            continue;
          }
          ++i;
        }
      }
    });
  }
  const std::size_t total = std::size_t(producers) * per_producer;
  std::vector<std::vector<std::uint8_t>> seen(producers,
                                              std::vector<std::uint8_t>(per_producer, 0));
  std::vector<std::int64_t> last(producers, -1);
  std::vector<compcntr::query_response> out(256);
  std::size_t got = 0;
  bool ok = true;
  while (got < total) {
    std::error_code ec;
    const std::size_t n = cmd.try_get(out, ec);
    REQUIRE_FALSE(ec);
    if (n == 0) {
      pollfd pf{cmd.fd(), POLLIN, 0};
      if (::poll(&pf, 1, 30000) == 0) { // guard only: a lost response would hang here
        abort_test = true;
        break;
      }
      continue;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const auto p = static_cast<int>(out[i].wr_id >> 32);
      const auto seq = static_cast<std::uint32_t>(out[i].wr_id);
      if (p >= producers || seq >= std::uint32_t(per_producer) || seen[p][seq]++ != 0) ok = false;
      // Answered after issue: the counter had reached seq + 1 when the query was accepted.
      if (out[i].values.completions < seq + 1u) ok = false;
      // Per-producer FIFO.
      if (std::int64_t(seq) <= last[p]) ok = false;
      last[p] = seq;
    }
    got += n;
  }
  for (auto& t : threads) t.join();
  REQUIRE_FALSE(abort_test);
  CHECK(wrong_errors == 0);
  CHECK(ok);
  CHECK(got == total);
  for (int p = 0; p < producers; ++p)
    for (int i = 0; i < per_producer; ++i) REQUIRE(seen[p][i] == 1);
  CHECK(cmd.queued() == 0);
  CHECK_FALSE(readable(cmd.fd()));
  MESSAGE("queries refused by back-pressure and retried: " << refused.load());
}

TEST_CASE("destroy while the engine answers, repeatedly (ASan/TSan check the hand-over)") {
  for (int round = 0; round < 40 / stress_scale; ++round) {
    auto dev = open_soft();
    auto c = make_counter(dev);
    auto cmd = make_cmd(dev);
    std::vector<compcntr::query_request> reqs(3000, compcntr::query_request{&c, 0});
    for (std::size_t i = 0; i < reqs.size(); ++i) reqs[i].wr_id = i;
    std::error_code ec;
    REQUIRE(cmd.query(reqs, ec) == reqs.size());
    if (round % 3 == 1) { // let part of it be answered and queued first
      CHECK(cmd.get(ec).wr_id == 0);
      REQUIRE_FALSE(ec);
    }
    if (round % 3 == 2) c.reset(); // the counter goes first: its slot waits for the queries
    cmd.reset();
    c.reset();
    CHECK(dev.live_counters() == 0);
    dev.close(ec);
    CHECK_FALSE(ec); // no hold of the cmd_comp survives its destruction
  }
}

TEST_CASE("a device dropped before its last cmd_comp dies with it (engine stops cleanly)") {
  compcntr::cmd_completion cmd;
  compcntr::counter c;
  {
    auto dev = open_soft();
    c = make_counter(dev);
    cmd = make_cmd(dev);
  } // the handle's reference is gone; the counter and cmd_comp keep the device alive
  REQUIRE_FALSE(cmd.query(c, 8));
  std::error_code ec;
  CHECK(cmd.get(ec).wr_id == 8);
  REQUIRE_FALSE(cmd.query(c, 9));
  c.reset();
  cmd.reset(); // last object: the device and its engine go here (or on the engine thread)
}
