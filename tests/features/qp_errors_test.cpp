// Software loopback QPs in error: length and key errors, remote access violations, the move to ERR
// and its flush, peers that enter ERR or are destroyed (verbs rules, exact counts).
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

TEST_CASE("send longer than the receive buffer: error on both sides, no byte written, both ERR") {
  pair p;
  buffer src(p.dev, 128, 0), dst(p.dev, 128, local_write, 0x5A);
  src.pattern(1);
  std::error_code ec;
  p.b.post_recv(1, dst.data(), 64, dst.lkey(), ec);
  p.b.post_recv(2, dst.data() + 64, 64, dst.lkey(), ec);  // flushed when b enters ERR
  p.a.post_send(3, src.data(), 65, src.lkey(), ec);
  REQUIRE_FALSE(ec);  // the post was accepted; the operation failed
  CHECK(dst.all(0x5A));
  CHECK(p.on_a(attach_op::send).value() == 0);
  CHECK(p.on_a(attach_op::send).errors() == 1);
  CHECK(p.on_b(attach_op::recv).value() == 0);
  CHECK(p.on_b(attach_op::recv).errors() == 2);  // the failed receive + the flushed one
  CHECK(p.a.state() == qp_state::err);
  CHECK(p.b.state() == qp_state::err);
  CHECK(std::string(p.a.last_completion_error()) == "message longer than the receive buffer");
  p.a.post_send(4, src.data(), 1, src.lkey(), ec);  // later posts: EINVAL (ERR)
  CHECK(ec == std::errc::invalid_argument);
}

TEST_CASE("waiting send longer than the receive posted later: both sides fail in post_recv") {
  pair p;
  buffer src(p.dev, 128, 0), dst(p.dev, 128, local_write, 0x5A);
  std::error_code ec;
  p.a.post_send(1, src.data(), 100, src.lkey(), ec);
  p.a.post_send(2, src.data(), 10, src.lkey(), ec);  // flushed when a enters ERR
  p.b.post_recv(3, dst.data(), 99, dst.lkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(dst.all(0x5A));
  CHECK(p.on_a(attach_op::send).errors() == 2);
  CHECK(p.on_b(attach_op::recv).errors() == 1);
  CHECK(p.on_a(attach_op::send).value() == 0);
  CHECK(p.a.state() == qp_state::err);
  CHECK(p.b.state() == qp_state::err);
}

TEST_CASE("local key errors fail the initiator only, move no byte, target untouched") {
  pair p;
  buffer src(p.dev, 64, 0), dst(p.dev, 64, local_write, 0x77), ro(p.dev, 64, 0, 0x66);
  src.pattern(9);
  std::error_code ec;

  SUBCASE("send with an unknown lkey") {
    p.b.post_recv(1, dst.data(), 64, dst.lkey(), ec);
    p.a.post_send(2, src.data(), 8, 0xdead0000u, ec);
    REQUIRE_FALSE(ec);
    CHECK(p.on_a(attach_op::send).errors() == 1);
    CHECK(std::string(p.a.last_completion_error()) == "lkey is not registered");
    CHECK(p.a.state() == qp_state::err);
    CHECK(p.b.state() == qp_state::rts);
    CHECK(p.on_b(attach_op::recv).value() + p.on_b(attach_op::recv).errors() == 0);
    // b's receive is still posted: a new QP cannot reach it, but b can still flush it.
    p.b.modify(qp_state::err, ec);
    CHECK(p.on_b(attach_op::recv).errors() == 1);
    CHECK(dst.all(0x77));
  }
  SUBCASE("send with the rkey in place of the lkey") {
    p.a.post_send(2, src.data(), 8, src.rkey(), ec);
    CHECK(p.on_a(attach_op::send).errors() == 1);
    CHECK(std::string(p.a.last_completion_error()) == "an rkey was given where an lkey is needed");
  }
  SUBCASE("send range outside its registration") {
    p.b.post_recv(1, dst.data(), 64, dst.lkey(), ec);
    p.a.post_send(2, src.data() + 60, 8, src.lkey(), ec);
    CHECK(p.on_a(attach_op::send).errors() == 1);
    CHECK(std::string(p.a.last_completion_error()) == "range lies outside the registered region");
    CHECK(p.on_b(attach_op::recv).errors() == 0);
    CHECK(dst.all(0x77));
  }
  SUBCASE("receive into a region without local_write") {
    p.b.post_recv(1, ro.data(), 64, ro.lkey(), ec);
    REQUIRE_FALSE(ec);
    CHECK(p.on_b(attach_op::recv).errors() == 1);
    CHECK(std::string(p.b.last_completion_error()) == "region lacks local_write access");
    CHECK(p.b.state() == qp_state::err);
    CHECK(p.a.state() == qp_state::rts);
    // a's send now targets a peer in ERR: it fails on a, b's counters do not move.
    p.a.post_send(2, src.data(), 8, src.lkey(), ec);
    CHECK(p.on_a(attach_op::send).errors() == 1);
    CHECK(std::string(p.a.last_completion_error()) == "peer QP is in ERR");
    CHECK(p.on_b(attach_op::recv).errors() == 1);
    CHECK(ro.all(0x66));
  }
  SUBCASE("RDMA read into a local region without local_write") {
    buffer remote(p.dev, 64, all_access, 0x31);
    p.a.post_rdma_read(1, ro.data(), 8, ro.lkey(), remote.addr(), remote.rkey(), ec);
    CHECK(p.on_a(attach_op::rdma_read).errors() == 1);
    CHECK(p.on_b(attach_op::remote_rdma_read).value() +
              p.on_b(attach_op::remote_rdma_read).errors() ==
          0);
    CHECK(ro.all(0x66));
  }
  CHECK(pair::sum(p.wrs_a) + pair::sum(p.wrs_b) == 0);
}

TEST_CASE("remote access violations fail the initiator, move no byte, leave the target untouched") {
  struct expect {
    const char* what;
    bool write;
    const char* why;
  };
  const expect cases[] = {
      {"write, unknown rkey", true, "rkey is not registered"},
      {"write, lkey as rkey", true, "an lkey was given where an rkey is needed"},
      {"write, no remote_write", true, "region lacks remote_write access"},
      {"write, past the end", true, "range lies outside the registered region"},
      {"write, before the start", true, "range lies outside the registered region"},
      {"read, no remote_read", false, "region lacks remote_read access"},
      {"read, past the end", false, "range lies outside the registered region"},
      {"read, address 0", false, "range lies outside the registered region"},
  };
  int i = 0;
  for (const expect& e : cases) {
    CAPTURE(e.what);
    pair q;  // a fresh pair per case: the error moves the initiator to ERR
    buffer l(q.dev, 64, local_write);
    buffer w(q.dev, 64, rw, 0x02);                          // no remote_read
    buffer r(q.dev, 64, local_write | remote_read, 0x03);  // no remote_write
    l.pattern(50);
    std::uint64_t addr = 0;
    std::uint32_t rkey = 0;
    switch (i++) {
      case 0:
        addr = w.addr();
        rkey = 0xbad1u;
        break;
      case 1:
        addr = w.addr();
        rkey = w.lkey();
        break;
      case 2:
        addr = r.addr();
        rkey = r.rkey();
        break;
      case 3:
        addr = w.addr(60);
        rkey = w.rkey();
        break;
      case 4:
        addr = w.addr() - 1;
        rkey = w.rkey();
        break;
      case 5:
        addr = w.addr();
        rkey = w.rkey();
        break;
      case 6:
        addr = r.addr(1);
        rkey = r.rkey();
        break;
      case 7:
        addr = 0;
        rkey = r.rkey();
        break;
    }
    std::error_code ec;
    if (e.write)
      q.a.post_rdma_write(1, l.data(), 8, l.lkey(), addr, rkey, ec);
    else
      q.a.post_rdma_read(1, l.data(), 64, l.lkey(), addr, rkey, ec);
    REQUIRE_FALSE(ec);
    CHECK(std::string(q.a.last_completion_error()) == e.why);
    CHECK(q.on_a(e.write ? attach_op::rdma_write : attach_op::rdma_read).errors() == 1);
    CHECK(pair::sum(q.wrs_a) == 0);
    CHECK(pair::sum(q.wrs_b) + pair::sum_err(q.wrs_b) == 0);  // target untouched
    CHECK(q.b.state() == qp_state::rts);
    CHECK(q.a.state() == qp_state::err);
    CHECK(w.all(0x02));
    CHECK(r.all(0x03));
    for (std::size_t k = 0; k < 64; ++k) REQUIRE(l.bytes[k] == static_cast<unsigned char>(50 + k));
  }
}

TEST_CASE("an error completion moves the QP to ERR and flushes its waiting work in error") {
  pair p;
  buffer src(p.dev, 64, 0), dst(p.dev, 256, local_write);
  std::error_code ec;
  // a: two receives waiting (from b), then a failing RDMA write.
  p.a.post_recv(1, dst.data(), 64, dst.lkey(), ec);
  p.a.post_recv(2, dst.data() + 64, 64, dst.lkey(), ec);
  p.a.post_rdma_write(3, src.data(), 8, src.lkey(), 0, 0x1234, ec);
  REQUIRE_FALSE(ec);
  CHECK(p.a.state() == qp_state::err);
  CHECK(p.on_a(attach_op::rdma_write).errors() == 1);
  CHECK(p.on_a(attach_op::recv).errors() == 2);
  CHECK(p.b.state() == qp_state::rts);
  // b's later send towards a fails on b (target in ERR), and moves b to ERR.
  p.b.post_send(4, src.data(), 8, src.lkey(), ec);
  CHECK(p.on_b(attach_op::send).errors() == 1);
  CHECK(p.b.state() == qp_state::err);
  CHECK(pair::sum(p.wrs_a) + pair::sum(p.wrs_b) == 0);
}

TEST_CASE("sends waiting on a peer that enters ERR fail, and move their QP to ERR") {
  pair p;
  buffer src(p.dev, 64, 0), dst(p.dev, 64, local_write);
  std::error_code ec;
  p.a.post_send(1, src.data(), 8, src.lkey(), ec);
  p.a.post_send(2, src.data(), 8, src.lkey(), ec);
  p.a.post_recv(3, dst.data(), 64, dst.lkey(), ec);
  p.b.modify(qp_state::err, ec);
  REQUIRE_FALSE(ec);
  CHECK(p.on_a(attach_op::send).errors() == 2);
  CHECK(p.on_a(attach_op::recv).errors() == 1);  // a entered ERR: its receive is flushed too
  CHECK(p.a.state() == qp_state::err);
  CHECK(std::string(p.a.last_completion_error()) ==
        "peer QP entered ERR with sends waiting for it");
}

TEST_CASE("modify(ERR) flushes posted receives and waiting sends; the peer is not touched") {
  pair p;
  buffer src(p.dev, 64, 0), dst(p.dev, 64, local_write);
  std::error_code ec;
  p.b.post_recv(1, dst.data(), 64, dst.lkey(), ec);
  p.b.post_recv(2, dst.data(), 64, dst.lkey(), ec);
  p.b.post_recv(3, dst.data(), 64, dst.lkey(), ec);
  p.b.modify(qp_state::err, ec);
  CHECK(p.on_b(attach_op::recv).errors() == 3);
  CHECK(p.a.state() == qp_state::rts);
  CHECK(pair::sum_err(p.wrs_a) == 0);
}

TEST_CASE("destroying a QP completes nothing; the peer's waiting sends fail, later ones too") {
  pair p;
  buffer src(p.dev, 64, 0), dst(p.dev, 64, local_write);
  std::error_code ec;
  p.b.post_recv(1, dst.data(), 64, dst.lkey(), ec);  // on b: vanishes with b
  p.a.post_recv(2, dst.data(), 64, dst.lkey(), ec);
  auto& b_recv = p.on_b(attach_op::recv);
  const auto b_recv_before = b_recv.value() + b_recv.errors();
  p.b.reset();
  CHECK(b_recv.value() + b_recv.errors() == b_recv_before);  // no completion for b's receive
  CHECK(p.a.state() == qp_state::rts);  // a had no send waiting for b
  p.a.post_send(3, src.data(), 8, src.lkey(), ec);
  REQUIRE_FALSE(ec);
  CHECK(p.on_a(attach_op::send).errors() == 1);
  CHECK(std::string(p.a.last_completion_error()) == "peer QP was destroyed");
  CHECK(p.on_a(attach_op::recv).errors() == 1);  // a entered ERR: its receive flushed
  CHECK(p.a.state() == qp_state::err);

  pair q;
  q.a.post_send(1, src.data(), 8, src.lkey(), ec);  // waits for q.b
  q.b.reset();
  CHECK(q.on_a(attach_op::send).errors() == 1);
  CHECK(q.a.state() == qp_state::err);
}

TEST_CASE("RDMA towards a destroyed or failed peer fails on the initiator") {
  pair p;
  buffer l(p.dev, 64, local_write), r(p.dev, 64, all_access);
  std::error_code ec;
  p.b.modify(qp_state::err, ec);
  p.a.post_rdma_write(1, l.data(), 8, l.lkey(), r.addr(), r.rkey(), ec);
  CHECK(p.on_a(attach_op::rdma_write).errors() == 1);
  CHECK(p.on_b(attach_op::remote_rdma_write).value() == 0);
  pair q;
  q.b.reset();
  q.a.post_rdma_read(1, l.data(), 8, l.lkey(), r.addr(), r.rkey(), ec);
  CHECK(q.on_a(attach_op::rdma_read).errors() == 1);
}
