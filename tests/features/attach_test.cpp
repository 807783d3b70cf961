// Attaching counters to QPs: the whole verbs rule matrix, sharing, and destroy ordering.
#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "qp_fixture.hpp"

using namespace qpt;

namespace {

std::string msg() { return std::string(compcntr::last_error_message()); }

std::error_code try_attach(compcntr::qp& q, const compcntr::counter& c, std::uint32_t mask,
                           std::uint32_t comp_mask = 0) {
  std::error_code ec;
  q.attach(c, compcntr::attach_options{.comp_mask = comp_mask, .op_mask = mask}, ec);
  return ec;
}

/// Which of the 6 ops of `q` count into `c`: probe by traffic would disturb the QP, so use the
/// internal table (the public behaviour is covered by the traffic tests).
std::uint32_t served_by(compcntr::qp& q, const compcntr::counter& c) {
  std::uint32_t m = 0;
  for (unsigned i = 0; i < 6; ++i)
    if (q.native_impl()->served(static_cast<attach_op>(1u << i)) == c.native_slot()) m |= 1u << i;
  return m;
}

} // namespace

TEST_CASE("attach: comp_mask and op_mask validation") {
  auto dev = open_soft();
  auto q = make_qp(dev);
  auto c = make_counter(dev);
  CHECK(try_attach(q, c, 1, 1) == std::errc::invalid_argument);
  CHECK(msg().find("comp_mask") != std::string::npos);
  CHECK(try_attach(q, c, 0) == std::errc::invalid_argument);
  CHECK(msg().find("op_mask is empty") != std::string::npos);
  // Bits outside supported_qp_attach_ops (0x3f on the software device): ENOTSUP.
  CHECK(dev.caps().supported_qp_attach_ops == 0x3f);
  CHECK(try_attach(q, c, 0x40) == std::errc::not_supported);
  CHECK(try_attach(q, c, 0x1 | 0x80000000u) == std::errc::not_supported);
  CHECK(msg().find("0x80000000") != std::string::npos);
  CHECK(served_by(q, c) == 0);  // nothing was attached by the refused calls
  CHECK(q.native_impl()->attached_counters() == 0);
  CHECK(try_attach(q, c, 0x3f) == std::error_code{});
  CHECK(served_by(q, c) == 0x3f);
  compcntr::counter empty;
  CHECK(try_attach(q, empty, 1) == std::errc::invalid_argument);
  compcntr::qp none;
  CHECK(try_attach(none, c, 1) == std::errc::invalid_argument);
}

TEST_CASE("attach: allowed in RESET and INIT only") {
  auto dev = open_soft();
  auto a = make_qp(dev), b = make_qp(dev);
  auto c1 = make_counter(dev), c2 = make_counter(dev), c3 = make_counter(dev);
  CHECK(try_attach(a, c1, 0x1) == std::error_code{});  // RESET
  to_init(a);
  CHECK(try_attach(a, c2, 0x2) == std::error_code{});  // INIT
  to_init(b);
  connect(a, b);
  CHECK(try_attach(a, c3, 0x4) == std::errc::invalid_argument);  // RTS
  CHECK(msg().find("RTS") != std::string::npos);
  std::error_code ec;
  a.modify(qp_state::err, ec);
  CHECK(try_attach(a, c3, 0x4) == std::errc::invalid_argument);  // ERR
  auto n = make_qp(dev);
  n.modify(qp_state::err, ec);
  CHECK(try_attach(n, c3, 0x4) == std::errc::invalid_argument);
  CHECK(served_by(a, c3) == 0);
}

TEST_CASE("attach: an op already served is EBUSY and the whole request is refused") {
  auto dev = open_soft();
  auto q = make_qp(dev);
  auto c1 = make_counter(dev), c2 = make_counter(dev);
  REQUIRE(try_attach(q, c1, 0x1 | 0x4) == std::error_code{});
  CHECK(try_attach(q, c2, 0x4) == std::errc::device_or_resource_busy);
  CHECK(try_attach(q, c2, 0x2 | 0x4 | 0x8) ==
        std::errc::device_or_resource_busy);  // partial overlap
  CHECK(msg().find("0x4") != std::string::npos);
  CHECK(served_by(q, c2) == 0);  // not even the free bits 0x2 and 0x8
  CHECK(try_attach(q, c1, 0x1) == std::errc::device_or_resource_busy);  // same counter, same op
  // Disjoint masks: another counter, or the same counter again.
  CHECK(try_attach(q, c2, 0x2 | 0x8) == std::error_code{});
  CHECK(try_attach(q, c1, 0x10) == std::error_code{});
  CHECK(served_by(q, c1) == (0x1 | 0x4 | 0x10));
  CHECK(served_by(q, c2) == (0x2 | 0x8));
  CHECK(q.native_impl()->attached_counters() == 2);  // one reference per distinct counter
  CHECK(try_attach(q, c2, 0x20) == std::error_code{});
  CHECK(try_attach(q, c1, 0x3f) == std::errc::device_or_resource_busy);
}

TEST_CASE("attach: a counter of another device is EINVAL") {
  auto d1 = open_soft(), d2 = open_soft();
  auto q = make_qp(d1);
  auto c = make_counter(d2);
  CHECK(try_attach(q, c, 0x1) == std::errc::invalid_argument);
  CHECK(msg().find("another device") != std::string::npos);
}

TEST_CASE("one counter serves many QPs and accumulates across them") {
  auto dev = open_soft();
  auto sends = make_counter(dev), bytes = make_counter(dev, counter_type::bytes);
  constexpr int pairs = 4;
  std::vector<compcntr::qp> qs;
  for (int i = 0; i < 2 * pairs; ++i) qs.push_back(make_qp(dev));
  for (int i = 0; i < pairs; ++i) {
    attach(qs[2 * i], sends, static_cast<std::uint32_t>(attach_op::send));
    attach(qs[2 * i + 1], bytes, static_cast<std::uint32_t>(attach_op::recv));
    to_init(qs[2 * i]);
    to_init(qs[2 * i + 1]);
    connect(qs[2 * i], qs[2 * i + 1]);
  }
  buffer src(dev, 64, 0), dst(dev, 64, compcntr::access::local_write);
  std::error_code ec;
  for (int i = 0; i < pairs; ++i)
    for (int k = 0; k <= i; ++k) {
      qs[2 * i + 1].post_recv(0, dst.data(), 64, dst.lkey(), ec);
      qs[2 * i].post_send(0, src.data(), 10 + i, src.lkey(), ec);
    }
  CHECK(sends.value() == 1 + 2 + 3 + 4);
  CHECK(bytes.value() == 1 * 10 + 2 * 11 + 3 * 12 + 4 * 13);
}

TEST_CASE("destroying an attached counter is EBUSY and leaves it usable; after the QP it works") {
  auto dev = open_soft();
  auto q1 = make_qp(dev), q2 = make_qp(dev);
  auto c = make_counter(dev);
  attach(q1, c, 0x1);
  attach(q2, c, 0x2);
  std::error_code ec;
  c.destroy(ec);
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(msg().find("attached") != std::string::npos);
  REQUIRE(c);
  c.add(5);  // still usable
  CHECK(c.value() == 5);
  q1.reset();
  c.destroy(ec);  // still attached to q2
  CHECK(ec == std::errc::device_or_resource_busy);
  q2.reset();
  c.destroy(ec);
  CHECK_FALSE(ec);
  CHECK_FALSE(c);
  CHECK(dev.live_counters() == 0);
  dev.close(ec);
  CHECK_FALSE(ec);
}

TEST_CASE("RAII counter destroyed while attached: the QP keeps counting into it until destroyed") {
  auto dev = open_soft();
  auto a = make_qp(dev), b = make_qp(dev);
  auto watch = make_counter(dev);
  compcntr::plugin::slot* orphan = nullptr;
  {
    auto c = make_counter(dev);
    attach(a, c, static_cast<std::uint32_t>(attach_op::send));
    orphan = c.native_slot();
  }  // the owner is gone; the slot is not
  CHECK(dev.live_counters() == 2);
  attach(b, watch, static_cast<std::uint32_t>(attach_op::recv));
  to_init(a);
  to_init(b);
  connect(a, b);
  buffer src(dev, 8, 0), dst(dev, 8, compcntr::access::local_write);
  std::error_code ec;
  b.post_recv(0, dst.data(), 8, dst.lkey(), ec);
  a.post_send(0, src.data(), 8, src.lkey(), ec);
  CHECK(watch.value() == 1);
  CHECK(orphan->load_value() == 1);  // the orphaned counter still counts (and is still alive)
  std::error_code busy;
  dev.close(busy);
  CHECK(busy == std::errc::device_or_resource_busy);
  a.reset();  // drops the last reference: the slot returns to the pool (ASan: no leak)
  CHECK(dev.live_counters() == 1);
}

TEST_CASE("destroy ordering: QP before counter, counter handle before QP, device last") {
  auto dev = open_soft();
  std::error_code ec;
  {
    auto q = make_qp(dev);
    auto c = make_counter(dev);
    attach(q, c, 0x3f);
    q.reset();
    c.destroy(ec);
    CHECK_FALSE(ec);
  }
  {
    auto c = make_counter(dev);
    auto q = make_qp(dev);
    attach(q, c, 0x3f);
  }  // q destroyed first (declared last), then c
  {
    auto q = make_qp(dev);
    auto c = make_counter(dev);
    attach(q, c, 0x3f);
  }  // c's handle goes first (RAII), the slot lives until q goes
  CHECK(dev.live_counters() == 0);
  dev.close(ec);
  CHECK_FALSE(ec);
}

TEST_CASE("attach racing with counter::destroy: exactly one of them wins, every time") {
  // Thread A destroys the counter (refs 1 -> 0 CAS), thread B attaches it through the QP's
  // internal interface with the slot it looked up before (the public handle is not shared
  // across threads: that would be a race on the handle itself). Either the attach wins (and the
  // destroy is EBUSY) or the destroy wins (and the attach is refused): never both, never neither.
  auto dev = open_soft();
  constexpr int rounds = 2000;
  int attach_won = 0, destroy_won = 0;
  std::barrier sync(2);
  for (int i = 0; i < rounds; ++i) {
    auto q = make_qp(dev);
    auto c = make_counter(dev);
    compcntr::plugin::slot* s = c.native_slot();
    std::error_code destroy_ec, attach_ec;
    std::thread t([&] {
      sync.arrive_and_wait();
      for (int k = 0; k < i % 4; ++k) std::this_thread::yield(); // vary who goes first
      attach_ec =
          q.native_impl()->attach(*s, compcntr::attach_options{.comp_mask = 0, .op_mask = 1});
    });
    sync.arrive_and_wait();
    for (int k = 0; k < (i / 4) % 4; ++k) std::this_thread::yield();
    c.destroy(destroy_ec);
    t.join();
    if (!attach_ec) {
      REQUIRE(destroy_ec == std::errc::device_or_resource_busy);
      ++attach_won;
    } else {
      REQUIRE_FALSE(destroy_ec);
      REQUIRE(attach_ec == std::errc::invalid_argument);
      ++destroy_won;
    }
  }
  CHECK(attach_won + destroy_won == rounds);
  CHECK(dev.live_counters() == 0); // every slot went back (the attached ones with their QP)
  MESSAGE("attach won " << attach_won << " times, destroy won " << destroy_won << " times");
}
