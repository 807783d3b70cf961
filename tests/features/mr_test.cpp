// Memory registration on the software device (compcntr:mr): argument rules, keys, lifetime, and
// deregistered keys at post time and when a waiting request is matched.
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

TEST_CASE("reg_mr: argument rules, keys, and the registration's lifetime") {
  auto dev = open_soft();
  std::vector<unsigned char> mem(128);
  std::error_code ec;
  auto bad = [&](void* a, std::size_t n, std::uint32_t acc) {
    auto m = dev.reg_mr(a, n, acc, ec);
    CHECK(ec == std::errc::invalid_argument);
    CHECK_FALSE(m);
  };
  bad(nullptr, 8, 0);
  bad(mem.data(), 0, 0);
  bad(mem.data(), 8, 8);                // unknown bit (verbs' REMOTE_ATOMIC is not supported)
  bad(mem.data(), 8, remote_write);     // remote_write needs local_write (verbs rule)
  bad(reinterpret_cast<void*>(~std::uintptr_t{0} - 4), 8, 0);  // wraps around
  CHECK(msg().find("wraps") != std::string::npos);

  auto m1 = dev.reg_mr(mem.data(), 64, all_access, ec);
  REQUIRE_FALSE(ec);
  auto m2 = dev.reg_mr(mem.data(), 128, 0, ec);  // the same memory twice is fine
  REQUIRE_FALSE(ec);
  CHECK(m1.addr() == mem.data());
  CHECK(m1.length() == 64);
  CHECK(m1.access() == all_access);
  CHECK(m1.lkey() != 0);
  CHECK(m1.rkey() != 0);
  CHECK(m1.lkey() != m1.rkey());
  CHECK(m1.lkey() != m2.lkey());
  CHECK(m1.rkey() != m2.rkey());

  dev.close(ec);  // regions hold the device
  CHECK(ec == std::errc::device_or_resource_busy);
  m1.dereg(ec);
  CHECK_FALSE(ec);
  CHECK_FALSE(m1);
  m1.dereg(ec);
  CHECK(ec == std::errc::invalid_argument);
  auto moved = std::move(m2);
  CHECK_FALSE(m2);
  moved.reset();
  auto q = dev.create_qp(ec);
  dev.close(ec);  // QPs hold the device too
  CHECK(ec == std::errc::device_or_resource_busy);
  q.reset();
  dev.close(ec);
  CHECK_FALSE(ec);
}

TEST_CASE("a deregistered key fails: at post time, and for a waiting request when it is matched") {
  pair p;
  buffer src(p.dev, 64, 0), dst(p.dev, 64, local_write, 0x44);
  src.pattern(1);
  std::error_code ec;
  SUBCASE("waiting receive whose region was deregistered: both sides fail, nothing written") {
    p.b.post_recv(1, dst.data(), 64, dst.lkey(), ec);
    dst.mr.reset();
    p.a.post_send(2, src.data(), 8, src.lkey(), ec);
    CHECK(p.on_a(attach_op::send).errors() == 1);
    CHECK(p.on_b(attach_op::recv).errors() == 1);
    CHECK(std::string(p.b.last_completion_error()) == "lkey is not registered");
    CHECK(dst.all(0x44));
    CHECK(p.a.state() == qp_state::err);
    CHECK(p.b.state() == qp_state::err);
  }
  SUBCASE("waiting send whose region was deregistered: the sender fails, the receive stays") {
    p.a.post_send(1, src.data(), 8, src.lkey(), ec);
    src.mr.reset();
    p.b.post_recv(2, dst.data(), 64, dst.lkey(), ec);
    REQUIRE_FALSE(ec);
    CHECK(p.on_a(attach_op::send).errors() == 1);
    CHECK(p.a.state() == qp_state::err);
    CHECK(p.b.state() == qp_state::rts);
    CHECK(p.on_b(attach_op::recv).errors() == 0);
    CHECK(dst.all(0x44));
    p.b.modify(qp_state::err, ec);  // the receive was still posted
    CHECK(p.on_b(attach_op::recv).errors() == 1);
  }
}
