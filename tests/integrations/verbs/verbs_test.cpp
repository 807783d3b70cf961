// The verbs side without RDMA hardware: absent devices, and wrapped ibv_qps counted by draining
// their CQs (emulation): argument rules, state, opcode and length accounting, error routing, the
// per-call drain limit, threads. The CQs are fakes (tests/support/fake_verbs.hpp). Native attach
// (rdma-core 65+) cannot run here.
#include <doctest/doctest.h>

#include "compcntr_config.h"

#if COMPCNTR_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include <compcntr/verbs.h>

#include "qp_fixture.hpp"
#if COMPCNTR_HAVE_VERBS
#include "fake_verbs.hpp"
#endif

using namespace qpt;
#if COMPCNTR_HAVE_VERBS
using namespace fake_verbs;
#endif

namespace {
std::string msg() { return std::string(compcntr::last_error_message()); }
} // namespace

TEST_CASE("verbs devices: none here, every name is ENODEV with a message, auto is soft") {
  std::error_code ec;
  auto d = compcntr::device::open("mlx5_0", ec);
  CHECK(ec == std::errc::no_such_device);
  CHECK_FALSE(d);
  CHECK(msg().find("mlx5_0") != std::string::npos);
  auto efa = compcntr::device::open("rdmap0s6", ec);
  CHECK(ec == std::errc::no_such_device);
  auto a = compcntr::device::open("auto", ec);
  REQUIRE_FALSE(ec);
#if COMPCNTR_HAVE_VERBS
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list) ibv_free_device_list(list);
  if (n == 0) CHECK(a.name() == "soft");
#endif
  // The software device can make QPs; a wrapped verbs QP cannot post (checked below).
  auto q = a.create_qp(ec);
  CHECK_FALSE(ec);
}

#if COMPCNTR_HAVE_VERBS

TEST_CASE("wrap_verbs_qp: argument rules") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(11);
  std::error_code ec;
  auto w = dev.wrap_verbs_qp(nullptr, on(cq), ec);
  CHECK(ec == std::errc::invalid_argument);
  compcntr::verbs_qp_options o = on(cq);
  o.comp_mask = 1;
  w = dev.wrap_verbs_qp(&vq, o, ec);
  CHECK(ec == std::errc::invalid_argument);
  w = dev.wrap_verbs_qp(&vq, compcntr::verbs_qp_options{}, ec);  // no CQ to drain
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("send_cq") != std::string::npos);
  CHECK_FALSE(w);

  auto first = wrap(dev, &vq, on(cq));
  CHECK(first.qp_num() == 11);
  fake_cq other;
  w = dev.wrap_verbs_qp(&vq, on(other), ec);  // counting it twice would double every count
  CHECK(ec == std::errc::device_or_resource_busy);
  dev.close(ec);
  CHECK(ec == std::errc::device_or_resource_busy);  // the wrapper holds the device
  first.reset();
  auto again = wrap(dev, &vq, on(other));
  CHECK(again);
}

TEST_CASE("wrapped QP: state from the ibv_qp, no posting/connect/modify, emulated ops only") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(12, IBV_QPS_RESET);
  auto w = wrap(dev, &vq, on(cq));
  auto peer = make_qp(dev);
  std::error_code ec;
  CHECK(w.state() == qp_state::reset);
  vq.state = IBV_QPS_RTR;
  CHECK(w.state() == qp_state::rts);
  vq.state = IBV_QPS_SQE;
  CHECK(w.state() == qp_state::err);
  vq.state = IBV_QPS_INIT;
  CHECK(w.state() == qp_state::init);

  w.modify(qp_state::err, ec);
  CHECK(ec == std::errc::not_supported);
  CHECK(msg().find("ibv_modify_qp") != std::string::npos);
  to_init(peer);
  w.connect(peer, ec);
  CHECK(ec == std::errc::not_supported);
  peer.connect(w, ec);  // a software QP cannot pair with a verbs QP
  CHECK(ec == std::errc::invalid_argument);
  unsigned char b[8];
  w.post_send(1, b, 8, 1, ec);
  CHECK(ec == std::errc::not_supported);
  w.post_recv(1, b, 8, 1, ec);
  CHECK(ec == std::errc::not_supported);
  w.post_rdma_write(1, b, 8, 1, 0, 2, ec);
  CHECK(ec == std::errc::not_supported);
  w.post_rdma_read(1, b, 8, 1, 0, 2, ec);
  CHECK(ec == std::errc::not_supported);

  // Incoming RDMA makes no CQ entry on the target: REMOTE_* cannot be emulated.
  auto c = make_counter(dev);
  w.attach(c, bits(attach_op::remote_rdma_write), ec);
  CHECK(ec == std::errc::not_supported);
  w.attach(c, bits(attach_op::remote_rdma_read) | bits(attach_op::send), ec);
  CHECK(ec == std::errc::not_supported);
  w.attach(c, 0x17, ec);  // SEND, RECV, RDMA_READ, RDMA_WRITE
  CHECK_FALSE(ec);
  auto c2 = make_counter(dev);
  w.attach(c2, bits(attach_op::send), ec);
  CHECK(ec == std::errc::device_or_resource_busy);
  vq.state = IBV_QPS_RTS;  // the ibv_qp moved on: attaching is over
  w.attach(c2, bits(attach_op::send), ec);
  CHECK(ec == std::errc::invalid_argument);
}

TEST_CASE("progress drains the CQ: each opcode to its op, WRS +1, BYTES +length") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(21);
  auto w = wrap(dev, &vq, on(cq));
  auto sends = make_counter(dev), recv_bytes = make_counter(dev, counter_type::bytes);
  auto writes = make_counter(dev), read_bytes = make_counter(dev, counter_type::bytes);
  attach(w, sends, bits(attach_op::send));
  attach(w, recv_bytes, bits(attach_op::recv));
  attach(w, writes, bits(attach_op::rdma_write));
  attach(w, read_bytes, bits(attach_op::rdma_read));

  CHECK(dev.progress() == 0);
  CHECK(cq.starts == 0);
  CHECK(cq.ends == 0);  // end_poll only after a successful start_poll
  cq.ok(IBV_WC_SEND, 100);
  cq.ok(IBV_WC_SEND, 200);
  cq.ok(IBV_WC_RECV, 64);
  cq.ok(IBV_WC_RECV_RDMA_WITH_IMM, 16);  // consumed a receive: RECV
  cq.ok(IBV_WC_RDMA_WRITE, 4096);
  cq.ok(IBV_WC_RDMA_READ, 512);
  cq.ok(IBV_WC_FETCH_ADD, 8);  // not an attach op: consumed, counted nowhere
  cq.ok(IBV_WC_BIND_MW);
  CHECK(sends.value() == 0);  // nothing counts before progress
  CHECK(dev.progress() == 8);
  CHECK(cq.starts == 1);
  CHECK(cq.ends == 1);
  CHECK(sends.value() == 2);
  CHECK(recv_bytes.value() == 80);
  CHECK(writes.value() == 1);
  CHECK(read_bytes.value() == 512);
  CHECK(cq.qp_num_reads == 0);  // one wrapped QP on this CQ: no need for qp_num
  CHECK(cq.byte_len_reads == 3);  // only for the BYTES counters (RECV x2, RDMA_READ)
  for (auto* c : {&sends, &recv_bytes, &writes, &read_bytes}) CHECK(c->errors() == 0);
  CHECK(dev.progress() == 0);
  CHECK(compcntr::progress(sends) == 0);  // the counter-based entry point drives the same device
  cq.ok(IBV_WC_SEND);
  CHECK(compcntr::progress(sends) == 1);
  CHECK(sends.value() == 3);
}

TEST_CASE("a CQ created without byte_len / qp_num is never asked for them when not needed") {
  auto dev = open_soft();
  fake_cq cq(false, false);  // reading either would call a NULL function pointer
  fake_qp vq(22);
  auto w = wrap(dev, &vq, on(cq));
  auto all = make_counter(dev);  // WRS
  attach(w, all, 0x17);
  for (auto op : {IBV_WC_SEND, IBV_WC_RECV, IBV_WC_RDMA_READ, IBV_WC_RDMA_WRITE}) cq.ok(op, 1);
  cq.error();
  CHECK(dev.progress() == 5);
  CHECK(all.value() == 4);
  CHECK(all.errors() == 1);
}

TEST_CASE("send-queue lengths come from wr_info when given, else from byte_len") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(23);
  auto o = on(cq);
  static std::uint64_t asked = 0;
  o.wr_info = [](void* ctx, std::uint64_t wr_id, std::uint32_t* op, std::uint64_t* len) -> int {
    ++asked;
    if (wr_id == 0) return -1;  // unknown request: fall back to byte_len
    *op = static_cast<std::uint32_t>(compcntr::attach_op::send);
    *len = wr_id * *static_cast<std::uint64_t*>(ctx);
    return 0;
  };
  std::uint64_t scale = 10;
  o.wr_info_ctx = &scale;
  auto w = wrap(dev, &vq, o);
  auto bytes = make_counter(dev, counter_type::bytes);
  attach(w, bytes, bits(attach_op::send) | bits(attach_op::rdma_write));
  cq.ok(IBV_WC_SEND, 0, 3);         // provider reports 0: wr_info says 30
  cq.ok(IBV_WC_RDMA_WRITE, 0, 5);   // 50
  cq.ok(IBV_WC_SEND, 7, 0);         // wr_info does not know it: byte_len 7
  CHECK(dev.progress() == 3);
  CHECK(bytes.value() == 87);
  CHECK(asked == 3);
}

TEST_CASE(
    "error completions: receive CQ -> RECV, wr_info names the op, else the lowest attached op") {
  auto dev = open_soft();
  std::error_code ec;

  SUBCASE("separate receive CQ") {
    fake_cq scq, rcq;
    fake_qp vq(31);
    auto w = wrap(dev, &vq, on(scq, &rcq));
    auto s = make_counter(dev), r = make_counter(dev);
    attach(w, s, bits(attach_op::send));
    attach(w, r, bits(attach_op::recv));
    rcq.error();
    rcq.error();
    scq.error();
    rcq.ok(IBV_WC_RECV, 4);
    CHECK(dev.progress() == 4);
    CHECK(r.errors() == 2);
    CHECK(r.value() == 1);
    CHECK(s.errors() == 1);  // send CQ, no wr_info: lowest attached op is SEND
  }
  SUBCASE("shared CQ with wr_info") {
    fake_cq cq;
    fake_qp vq(32);
    auto o = on(cq);
    o.wr_info = [](void*, std::uint64_t wr_id, std::uint32_t* op, std::uint64_t* len) -> int {
      *len = 0;
      *op = static_cast<std::uint32_t>(wr_id);  // the test encodes the op in the wr_id
      return wr_id == 0 ? -1 : 0;
    };
    auto w = wrap(dev, &vq, o);
    auto s = make_counter(dev), r = make_counter(dev), rd = make_counter(dev);
    attach(w, s, bits(attach_op::send));
    attach(w, r, bits(attach_op::recv));
    attach(w, rd, bits(attach_op::rdma_read));
    cq.error(bits(attach_op::recv));
    cq.error(bits(attach_op::rdma_read));
    cq.error(bits(attach_op::rdma_read));
    cq.error(0);                              // unknown: lowest attached (SEND)
    cq.error(bits(attach_op::remote_rdma_read));  // not a local op: ignored, lowest attached
    cq.error(0x3);                            // not a single bit: lowest attached
    CHECK(dev.progress() == 6);
    CHECK(r.errors() == 1);
    CHECK(rd.errors() == 2);
    CHECK(s.errors() == 3);
  }
  SUBCASE("no counter for any local op: errors are consumed and counted nowhere") {
    fake_cq cq;
    fake_qp vq(33);
    auto w = wrap(dev, &vq, on(cq));
    cq.error();
    CHECK(dev.progress() == 1);
  }
  SUBCASE("lowest attached op when SEND has no counter") {
    fake_cq cq;
    fake_qp vq(34);
    auto w = wrap(dev, &vq, on(cq));
    auto rd = make_counter(dev), wr = make_counter(dev);
    attach(w, rd, bits(attach_op::rdma_read));
    attach(w, wr, bits(attach_op::rdma_write));
    cq.error();
    CHECK(dev.progress() == 1);
    CHECK(rd.errors() == 1);
    CHECK(wr.errors() == 0);
  }
}

TEST_CASE("a CQ shared by wrapped QPs routes by qp_num; unknown QPs' entries are dropped") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp q1(41), q2(42);
  auto w1 = wrap(dev, &q1, on(cq));
  auto w2 = wrap(dev, &q2, on(cq));
  auto c1 = make_counter(dev), c2 = make_counter(dev);
  attach(w1, c1, bits(attach_op::send));
  attach(w2, c2, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 41);
  cq.ok(IBV_WC_SEND, 0, 0, 42);
  cq.ok(IBV_WC_SEND, 0, 0, 42);
  cq.ok(IBV_WC_SEND, 0, 0, 99);  // not wrapped
  CHECK(dev.progress() == 4);
  CHECK(c1.value() == 1);
  CHECK(c2.value() == 2);
  CHECK(cq.qp_num_reads == 4);
  w2.reset();  // its entries are dropped from now on (the CQ stays routed by qp_num)
  cq.ok(IBV_WC_SEND, 0, 0, 42);
  cq.ok(IBV_WC_SEND, 0, 0, 41);
  CHECK(dev.progress() == 2);
  CHECK(c1.value() == 2);
  CHECK(c2.value() == 2);
  w1.reset();  // the last user of the CQ: it is no longer drained at all
  cq.ok(IBV_WC_SEND, 0, 0, 41);
  CHECK(dev.progress() == 0);
  CHECK(cq.pending.size() == 1);
}

TEST_CASE("one progress call drains at most 1024 entries per CQ") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(51);
  auto w = wrap(dev, &vq, on(cq));
  auto c = make_counter(dev);
  attach(w, c, bits(attach_op::recv));
  for (int i = 0; i < 1500; ++i) cq.ok(IBV_WC_RECV, 1);
  CHECK(dev.progress() == 1024);
  CHECK(dev.progress() == 476);
  CHECK(c.value() == 1500);
}

TEST_CASE("counter destroyed while attached to a wrapped QP: still counted, freed with the QP") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(61);
  auto w = wrap(dev, &vq, on(cq));
  compcntr::plugin::slot* orphan;
  {
    auto c = make_counter(dev);
    attach(w, c, bits(attach_op::send));
    std::error_code ec;
    c.destroy(ec);
    CHECK(ec == std::errc::device_or_resource_busy);
    orphan = c.native_slot();
  }
  cq.ok(IBV_WC_SEND);
  CHECK(dev.progress() == 1);
  CHECK(orphan->load_value() == 1);
  CHECK(dev.live_counters() == 1);
  w.reset();
  CHECK(dev.live_counters() == 0);
  std::error_code ec;
  dev.close(ec);
  CHECK_FALSE(ec);
}

TEST_CASE("progress from several threads while completions arrive: exact totals") {
  constexpr int n = 20000;
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(71);
  auto w = wrap(dev, &vq, on(cq));
  auto c = make_counter(dev, counter_type::bytes);
  attach(w, c, bits(attach_op::recv));
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> consumed{0};
  std::atomic<int> running{0};
  std::vector<std::thread> pollers;
  for (int t = 0; t < 2; ++t)
    pollers.emplace_back([&] {
      ++running;
      while (!done.load()) consumed += dev.progress();
    });
  while (running.load() < 2) std::this_thread::yield();
  for (int i = 0; i < n; ++i) {
    cq.ok(IBV_WC_RECV, 3);
    if (i % 64 == 0) std::this_thread::yield();  // let the pollers interleave with the producer
  }
  done = true;
  for (auto& t : pollers) t.join();
  while (const std::size_t k = dev.progress()) consumed += k;
  CHECK(consumed.load() == n);
  CHECK(c.value() == 3u * n);
}

#endif  // COMPCNTR_HAVE_VERBS
