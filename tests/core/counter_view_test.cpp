// compcntr::counter_view: one counter surface. A counter reached through device::resolve (a
// counter_ref) or held as a plain view can be used by every entry point: wait, wait_since,
// poll_any, pollable_fd / arm_fd, qp::attach, cmd_completion::query, credit_tracker::adopt,
// progress. Exact values and errno values throughout.
#include <doctest/doctest.h>

#include <poll.h>
#include <unistd.h>
#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "qp_fixture.hpp"

using namespace std::chrono_literals;
using test_support::make_counter;
using test_support::open_soft;

namespace {
// The view of a counter reached only through its handle, as a runtime's table would hold it.
compcntr::counter_ref resolved(compcntr::device& dev, const compcntr::counter& c) {
  std::error_code ec;
  auto r = dev.resolve(c.id(), ec);
  REQUIRE_FALSE(ec);
  REQUIRE(r);
  return r;
}
} // namespace

TEST_CASE("counter, counter_ref and counter_view share one surface over one slot") {
  auto dev = open_soft();
  auto c = make_counter(dev, compcntr::counter_type::bytes);
  auto r = resolved(dev, c);
  const compcntr::counter_view vc = c, vr = r;
  CHECK(vc == vr);
  CHECK(vc.native_slot() == c.native_slot());
  vc.add(5);
  r.add_error(2);
  vr.add(1);
  CHECK(c.value() == 6);
  CHECK(r.value() == 6);
  CHECK(vc.errors() == 2);
  CHECK(vr.type() == compcntr::counter_type::bytes);
  CHECK(vr.index() == c.index());
  CHECK(vr.id() == c.id());
  CHECK(vr.numa_node() == c.numa_node());
  vr.set(40);
  vc.set_error(0);
  CHECK(c.value() == 40);
  CHECK(c.errors() == 0);

  compcntr::counter empty;
  const compcntr::counter_view ve = empty;
  CHECK_FALSE(ve);
  CHECK(ve == compcntr::counter_view{});
  CHECK(vc != ve);
}

TEST_CASE("wait and wait_since on a resolved counter") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  auto r = resolved(dev, c);
  std::thread t([&] { c.add(3); });
  CHECK(compcntr::wait(r, 3, 10s) == std::errc{});
  t.join();
  CHECK(compcntr::wait(r.view(), 4, 0ms) == std::errc::timed_out);
  c.add_error(1);
  // The error count the caller saw (0) differs from the counter's (1): io_error at once.
  CHECK(compcntr::wait_since(r, 4, 0, 0ms) == std::errc::io_error);
  CHECK(compcntr::wait_since(r, 4, 1, 0ms) == std::errc::timed_out);
  CHECK(compcntr::wait(compcntr::counter_view{}, 1, 0ms) == std::errc::invalid_argument);
}

TEST_CASE("poll_any over views") {
  auto dev = open_soft();
  auto a = make_counter(dev), b = make_counter(dev), c = make_counter(dev);
  auto rb = resolved(dev, b);
  const std::array<compcntr::counter_view, 3> views{a, rb, c};
  const std::array<std::uint64_t, 3> thresholds{1, 2, 1};
  b.add(2);
  compcntr::poll_result p =
      compcntr::poll_any(std::span<const compcntr::counter_view>(views), thresholds, 0ms);
  CHECK(p.status == std::errc{});
  CHECK(p.index == 1);
  c.add_error(1);
  b.set(0);
  p = compcntr::poll_any(std::span<const compcntr::counter_view>(views), thresholds, 0ms);
  CHECK(p.status == std::errc::timed_out);  // an error change before the call does not count
  const std::array<compcntr::counter_view, 2> with_empty{a, compcntr::counter_view{}};
  p = compcntr::poll_any(std::span<const compcntr::counter_view>(with_empty),
                         std::span<const std::uint64_t>(thresholds.data(), 2), 0ms);
  CHECK(p.status == std::errc::invalid_argument);
}

TEST_CASE("pollable_fd and arm_fd through a view") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  auto r = resolved(dev, c);
  std::error_code ec;
  const int fd = compcntr::pollable_fd(r, ec);
  REQUIRE_FALSE(ec);
  CHECK(compcntr::pollable_fd(c, ec) == fd);  // one fd per counter, whichever surface asks
  compcntr::arm_fd(r.view(), ec);
  REQUIRE_FALSE(ec);
  pollfd p{fd, POLLIN, 0};
  CHECK(::poll(&p, 1, 0) == 0);
  c.add(1);
  CHECK(::poll(&p, 1, 0) == 1);
  compcntr::arm_fd(compcntr::counter_view{}, ec);
  CHECK(ec == std::errc::invalid_argument);
}

TEST_CASE("qp::attach a resolved counter: it counts, and holds the counter like any attach") {
  compcntr::device dev = open_soft();
  compcntr::qp a = qpt::make_qp(dev), b = qpt::make_qp(dev);
  auto sent = make_counter(dev);
  auto r = resolved(dev, sent);
  std::error_code ec;
  a.attach(r, compcntr::attach_op::send, ec);
  REQUIRE_FALSE(ec);
  r.reset();  // the attachment holds its own reference
  qpt::to_init(a);
  qpt::to_init(b);
  qpt::connect(a, b);
  qpt::buffer src(dev, 64, qpt::rw, 7), dst(dev, 64, qpt::rw);
  b.post_recv(1, dst.data(), 64, dst.lkey(), ec);
  REQUIRE_FALSE(ec);
  a.post_send(2, src.data(), 64, src.lkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(sent.value() == 1);
  CHECK(dst.all(7));
  sent.destroy(ec);
  CHECK(ec == std::errc::device_or_resource_busy);  // attached: EBUSY, still usable
  CHECK(sent.value() == 1);
  a.attach(compcntr::counter_view{}, compcntr::attach_op::recv, ec);
  CHECK(ec == std::errc::invalid_argument);
}

TEST_CASE("cmd_completion::query a view, alone and in a batch") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  c.add(9);
  auto r = resolved(dev, c);
  std::error_code ec;
  auto cmd = compcntr::cmd_completion::create(dev, ec);
  REQUIRE_FALSE(ec);
  REQUIRE_FALSE(cmd.query(r, 11));
  compcntr::query_response resp = cmd.get(ec);
  REQUIRE_FALSE(ec);
  CHECK(resp.wr_id == 11);
  CHECK(resp.values.completions == 9);
  const std::vector<compcntr::query_request> reqs{
      {r.view(), 12}, {&c, 13}, {compcntr::counter_view{}, 14}};
  CHECK(cmd.query(reqs, ec) == 2);
  CHECK(ec == std::errc::invalid_argument);
  std::array<compcntr::query_response, 2> out{};
  std::size_t got = 0;
  while (got < 2) {
    got += cmd.get(std::span(out.data() + got, 2 - got), ec);
    REQUIRE_FALSE(ec);
  }
  CHECK(out[0].wr_id + out[1].wr_id == 25);
  CHECK(out[0].values.completions == 9);
  CHECK(out[1].values.completions == 9);
}

TEST_CASE("credit_tracker::adopt views; progress through a view") {
  auto dev = open_soft();
  auto c0 = make_counter(dev), c1 = make_counter(dev);
  c1.add(5);  // counted before adoption: not outstanding
  auto r1 = resolved(dev, c1);
  const std::array<compcntr::counter_view, 2> peers{c0, r1};
  std::error_code ec;
  auto tr = compcntr::credit_tracker::adopt(dev, peers, 2, ec);
  REQUIRE_FALSE(ec);
  CHECK(tr.peer_counter(1) == r1.view());
  CHECK(tr.issued(1) == 5);
  CHECK(tr.acquire(1, 2, 0ms) == std::errc{});
  CHECK(tr.acquire(1, 1, 0ms) == std::errc::timed_out);
  c1.add(1);
  CHECK(tr.acquire(1, 1, 0ms) == std::errc{});
  const std::array<compcntr::counter_view, 1> bad{compcntr::counter_view{}};
  auto none = compcntr::credit_tracker::adopt(dev, bad, 2, ec);
  CHECK_FALSE(none);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(compcntr::progress(r1) == 0);  // the software device has nothing to drain
}
