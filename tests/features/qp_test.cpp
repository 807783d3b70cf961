// Software loopback QPs (compcntr:qp on device "soft"): states, connect, posting rules, send/receive
// matching in both orders, WRS against BYTES counting, RDMA write and read, release semantics.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "qp_fixture.hpp"

using namespace qpt;
using compcntr::access::local_write;
using compcntr::access::remote_read;
using compcntr::access::remote_write;

namespace {

std::string msg() { return std::string(compcntr::last_error_message()); }

} // namespace

TEST_CASE("QP states: RESET -> INIT -> RTS by connect, any -> ERR, nothing else") {
  auto dev = open_soft();
  auto a = make_qp(dev), b = make_qp(dev);
  std::error_code ec;
  CHECK(a.qp_num() != 0);
  CHECK(a.qp_num() != b.qp_num());

  a.modify(qp_state::rts, ec); // RESET -> RTS
  CHECK(ec == std::errc::invalid_argument);
  CHECK(a.state() == qp_state::reset);
  a.modify(qp_state::reset, ec);
  CHECK(ec == std::errc::invalid_argument);
  a.modify(static_cast<qp_state>(7), ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("unknown state") != std::string::npos);

  to_init(a);
  a.modify(qp_state::init, ec); // INIT -> INIT is not a transition
  CHECK(ec == std::errc::invalid_argument);
  a.modify(qp_state::rts, ec); // the software device reaches RTS through connect
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("connect_qp") != std::string::npos);
  CHECK(a.state() == qp_state::init);

  a.connect(b, ec); // b is still in RESET
  CHECK(ec == std::errc::invalid_argument);
  CHECK(a.state() == qp_state::init);
  CHECK(b.state() == qp_state::reset);
  a.connect(a, ec);
  CHECK(ec == std::errc::invalid_argument);
  to_init(b);
  connect(a, b);
  a.connect(b, ec); // already connected (RTS)
  CHECK(ec == std::errc::invalid_argument);
  a.modify(qp_state::init, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(a.state() == qp_state::rts);

  a.modify(qp_state::err, ec);
  CHECK_FALSE(ec);
  CHECK(a.state() == qp_state::err);
  CHECK(b.state() == qp_state::rts); // the peer notices only when it talks to a
  a.modify(qp_state::err, ec); // ERR -> ERR is allowed (any -> ERR)
  CHECK_FALSE(ec);
  a.modify(qp_state::init, ec);
  CHECK(ec == std::errc::invalid_argument);

  auto c = make_qp(dev); // never connected: any -> ERR still works
  c.modify(qp_state::err, ec);
  CHECK_FALSE(ec);
  CHECK(c.state() == qp_state::err);
}

TEST_CASE("connect needs two QPs of one device") {
  auto d1 = open_soft(), d2 = open_soft();
  auto a = make_qp(d1), b = make_qp(d2);
  to_init(a);
  to_init(b);
  std::error_code ec;
  a.connect(b, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("different devices") != std::string::npos);
  CHECK(a.state() == qp_state::init);
  compcntr::qp empty;
  a.connect(empty, ec);
  CHECK(ec == std::errc::invalid_argument);
  empty.connect(a, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(empty.state() == qp_state::err);
}

TEST_CASE("posting needs RTS: EINVAL in RESET, INIT and ERR, and nothing happens") {
  auto dev = open_soft();
  auto a = make_qp(dev), b = make_qp(dev);
  auto sends = make_counter(dev), recvs = make_counter(dev);
  attach(a, sends, compcntr::attach_op::send | attach_op::rdma_write | attach_op::rdma_read);
  attach(a, recvs, static_cast<std::uint32_t>(attach_op::recv));
  buffer buf(dev, 64, all_access, 0x11);
  std::error_code ec;
  auto try_all = [&](compcntr::qp& q) {
    q.post_recv(1, buf.data(), 8, buf.lkey(), ec);
    CHECK(ec == std::errc::invalid_argument);
    q.post_send(2, buf.data(), 8, buf.lkey(), ec);
    CHECK(ec == std::errc::invalid_argument);
    q.post_rdma_write(3, buf.data(), 8, buf.lkey(), buf.addr(), buf.rkey(), ec);
    CHECK(ec == std::errc::invalid_argument);
    q.post_rdma_read(4, buf.data(), 8, buf.lkey(), buf.addr(), buf.rkey(), ec);
    CHECK(ec == std::errc::invalid_argument);
    CHECK(msg().find("posting needs RTS") != std::string::npos);
  };
  try_all(a); // RESET
  to_init(a);
  try_all(a); // INIT
  to_init(b);
  connect(a, b);
  a.modify(qp_state::err, ec);
  try_all(a); // ERR
  CHECK(sends.value() == 0);
  CHECK(sends.errors() == 0);
  CHECK(recvs.value() == 0);
  CHECK(recvs.errors() == 0);
  CHECK(buf.all(0x11));
  compcntr::qp empty;
  empty.post_send(1, buf.data(), 8, buf.lkey(), ec);
  CHECK(ec == std::errc::invalid_argument);
}

TEST_CASE("NULL address with a length is EINVAL and changes nothing; zero length needs no buffer") {
  pair p;
  std::error_code ec;
  p.b.post_recv(1, nullptr, 16, 0, ec);
  CHECK(ec == std::errc::invalid_argument);
  p.a.post_send(1, nullptr, 16, 0, ec);
  CHECK(ec == std::errc::invalid_argument);
  p.a.post_rdma_write(1, nullptr, 16, 0, 0, 0, ec);
  CHECK(ec == std::errc::invalid_argument);
  p.a.post_rdma_read(1, nullptr, 16, 0, 0, 0, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(pair::sum(p.wrs_a) + pair::sum(p.wrs_b) + pair::sum_err(p.wrs_a) + pair::sum_err(p.wrs_b) ==
        0);
  CHECK(p.a.state() == qp_state::rts);

  // Zero-length operations touch no byte: no key is checked (as verbs), they complete.
  p.b.post_recv(2, nullptr, 0, 0, ec);
  REQUIRE_FALSE(ec);
  p.a.post_send(3, nullptr, 0, 0, ec);
  REQUIRE_FALSE(ec);
  p.a.post_rdma_write(4, nullptr, 0, 0, 0, 0, ec);
  REQUIRE_FALSE(ec);
  p.a.post_rdma_read(5, nullptr, 0, 0, 0, 0, ec);
  REQUIRE_FALSE(ec);
  CHECK(p.on_a(attach_op::send).value() == 1);
  CHECK(p.on_b(attach_op::recv).value() == 1);
  CHECK(p.on_a(attach_op::rdma_write).value() == 1);
  CHECK(p.on_b(attach_op::remote_rdma_write).value() == 1);
  CHECK(p.on_a(attach_op::rdma_read).value() == 1);
  CHECK(p.on_b(attach_op::remote_rdma_read).value() == 1);
  CHECK(pair::sum_err(p.wrs_a) + pair::sum_err(p.wrs_b) == 0);
}

TEST_CASE("send meets a receive posted first: both complete at once, bytes exact") {
  pair p;
  buffer src(p.dev, 256, 0), dst(p.dev, 256, local_write, 0xEE);
  src.pattern(3);
  std::error_code ec;
  p.b.post_recv(10, dst.data(), 200, dst.lkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(p.on_b(attach_op::recv).value() == 0); // nothing completed yet
  p.a.post_send(11, src.data() + 5, 100, src.lkey(), ec);
  REQUIRE_FALSE(ec);
  // Visible when the completing call returns.
  CHECK(p.on_a(attach_op::send).value() == 1);
  CHECK(p.on_b(attach_op::recv).value() == 1);
  CHECK(std::memcmp(dst.data(), src.data() + 5, 100) == 0);
  CHECK(dst.all(0xEE, 100)); // nothing past the message
  CHECK(pair::sum(p.wrs_a) == 1);
  CHECK(pair::sum(p.wrs_b) == 1);
  CHECK(pair::sum_err(p.wrs_a) + pair::sum_err(p.wrs_b) == 0);
}

TEST_CASE("send posted before the receive waits, and completes on both sides in post_recv") {
  pair p;
  buffer src(p.dev, 64, 0), dst(p.dev, 64, local_write);
  src.pattern(40);
  std::error_code ec;
  p.a.post_send(1, src.data(), 64, src.lkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(p.on_a(attach_op::send).value() == 0); // no receive yet: not complete
  CHECK(dst.all(0));
  p.b.post_recv(2, dst.data(), 64, dst.lkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(p.on_a(attach_op::send).value() == 1);
  CHECK(p.on_b(attach_op::recv).value() == 1);
  CHECK(std::memcmp(dst.data(), src.data(), 64) == 0);
}

TEST_CASE("queued sends and receives match in order, both directions independent") {
  pair p;
  buffer src(p.dev, 4 * 32, 0), dst(p.dev, 4 * 32, local_write);
  buffer src2(p.dev, 32, 0), dst2(p.dev, 32, local_write);
  src.pattern(0);
  src2.pattern(200);
  std::error_code ec;
  for (int i = 0; i < 4; ++i) {
    p.a.post_send(i, src.data() + 32 * i, 32, src.lkey(), ec);
    REQUIRE_FALSE(ec);
  }
  p.b.post_send(9, src2.data(), 32, src2.lkey(), ec); // the other direction
  REQUIRE_FALSE(ec);
  p.a.post_recv(9, dst2.data(), 32, dst2.lkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(std::memcmp(dst2.data(), src2.data(), 32) == 0);
  CHECK(p.on_b(attach_op::send).value() == 1);
  CHECK(p.on_a(attach_op::recv).value() == 1);
  CHECK(p.on_a(attach_op::send).value() == 0);
  // Receives into reversed slots: the i-th receive gets the i-th send.
  for (int i = 0; i < 4; ++i) {
    p.b.post_recv(i, dst.data() + 32 * (3 - i), 32, dst.lkey(), ec);
    REQUIRE_FALSE(ec);
    CHECK(p.on_a(attach_op::send).value() == static_cast<std::uint64_t>(i + 1));
    CHECK(std::memcmp(dst.data() + 32 * (3 - i), src.data() + 32 * i, 32) == 0);
  }
  CHECK(p.on_b(attach_op::recv).value() == 4);
}

TEST_CASE("WRS vs BYTES: +1 per request against +length; the receive counts the message length") {
  auto dev = open_soft();
  auto a = make_qp(dev), b = make_qp(dev);
  auto wrs_send = make_counter(dev), bytes_send = make_counter(dev, counter_type::bytes);
  auto wrs_recv = make_counter(dev), bytes_recv = make_counter(dev, counter_type::bytes);
  auto bytes_rw = make_counter(dev, counter_type::bytes),
       bytes_remote = make_counter(dev, counter_type::bytes);
  attach(a, bytes_send, static_cast<std::uint32_t>(attach_op::send));
  attach(b, bytes_recv, static_cast<std::uint32_t>(attach_op::recv));
  attach(a, bytes_rw, attach_op::rdma_write | attach_op::rdma_read);
  attach(b, bytes_remote, attach_op::remote_rdma_write | attach_op::remote_rdma_read);
  auto c = make_qp(dev), d = make_qp(dev);
  attach(c, wrs_send, static_cast<std::uint32_t>(attach_op::send));
  attach(d, wrs_recv, static_cast<std::uint32_t>(attach_op::recv));
  for (auto* q : {&a, &b, &c, &d}) to_init(*q);
  connect(a, b);
  connect(c, d);
  buffer src(dev, 1000, 0), dst(dev, 1000, all_access);
  src.pattern(7);
  std::error_code ec;
  const std::size_t lens[] = {1, 10, 100, 999};
  std::uint64_t total = 0;
  for (std::size_t len : lens) {
    b.post_recv(0, dst.data(), 1000, dst.lkey(), ec); // bigger buffer than the message
    a.post_send(0, src.data(), len, src.lkey(), ec);
    d.post_recv(0, dst.data(), 1000, dst.lkey(), ec);
    c.post_send(0, src.data(), len, src.lkey(), ec);
    REQUIRE_FALSE(ec);
    total += len;
  }
  CHECK(bytes_send.value() == total);
  CHECK(bytes_recv.value() == total);
  CHECK(wrs_send.value() == 4);
  CHECK(wrs_recv.value() == 4);
  a.post_rdma_write(0, src.data(), 300, src.lkey(), dst.addr(100), dst.rkey(), ec);
  a.post_rdma_read(0, src.data(), 50, src.lkey(), dst.addr(0), dst.rkey(),
                   ec); // src lacks local_write
  CHECK(bytes_rw.value() == 300);
  CHECK(bytes_rw.errors() == 1); // errors count requests, not bytes
  CHECK(bytes_remote.value() == 300);
  CHECK(bytes_remote.errors() == 0);
}

TEST_CASE("RDMA write and read move exact bytes and count on both sides") {
  pair p;
  buffer local(p.dev, 512, local_write, 0), remote(p.dev, 512, all_access, 0xAB);
  local.pattern(17);
  std::error_code ec;
  p.a.post_rdma_write(1, local.data() + 3, 200, local.lkey(), remote.addr(50), remote.rkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(std::memcmp(remote.data() + 50, local.data() + 3, 200) == 0);
  CHECK(remote.all(0xAB, 0, 50));
  CHECK(remote.all(0xAB, 250));
  CHECK(p.on_a(attach_op::rdma_write).value() == 1);
  CHECK(p.on_b(attach_op::remote_rdma_write).value() == 1);

  remote.pattern(99);
  std::vector<unsigned char> before = local.bytes;
  p.a.post_rdma_read(2, local.data() + 100, 64, local.lkey(), remote.addr(400), remote.rkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(std::memcmp(local.data() + 100, remote.data() + 400, 64) == 0);
  CHECK(std::memcmp(local.data(), before.data(), 100) == 0);
  CHECK(std::memcmp(local.data() + 164, before.data() + 164, 512 - 164) == 0);
  CHECK(p.on_a(attach_op::rdma_read).value() == 1);
  CHECK(p.on_b(attach_op::remote_rdma_read).value() == 1);

  // The target side initiates too: its local ops and a's remote ops.
  p.b.post_rdma_write(3, remote.data(), 16, remote.lkey(), local.addr(0), local.rkey(), ec);
  CHECK(p.on_b(attach_op::rdma_write).errors() == 1); // local lacks remote_write
  CHECK(p.on_a(attach_op::remote_rdma_write).value() +
            p.on_a(attach_op::remote_rdma_write).errors() ==
        0);
  CHECK(pair::sum_err(p.wrs_a) == 0);
}

TEST_CASE("completions update counters with release semantics: data visible after the count") {
  // Single-threaded ordering is trivially fine; this checks the documented contract from another
  // thread: once the receiver's counter shows the completion, the bytes are there.
  pair p;
  buffer src(p.dev, 4096, 0), dst(p.dev, 4096, local_write);
  src.pattern(5);
  std::error_code ec;
  p.b.post_recv(1, dst.data(), 4096, dst.lkey(), ec);
  std::atomic<bool> ok{false};
  std::thread reader([&] {
    while (p.on_b(attach_op::recv).value() == 0) std::this_thread::yield();
    ok = std::memcmp(dst.data(), src.data(), 4096) == 0;
  });
  p.a.post_send(2, src.data(), 4096, src.lkey(), ec);
  reader.join();
  CHECK(ok.load());
}
