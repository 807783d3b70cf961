// The verbs side without RDMA hardware: absent devices, and wrapped ibv_qps counted by draining
// their CQs (emulation). The CQs here are fakes: ibv_cq_ex's extended polling API is a table of
// function pointers (ibv_start_poll & co. are inline calls through it), so a test can implement
// it and feed exact completion streams. Native attach (rdma-core 65+) cannot run here.
#include <doctest/doctest.h>

#include "compcntr_config.h"

#if COMPCNTR_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

#include <atomic>
#include <chrono>
#include <span>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include <compcntr/verbs.h>

#include "qp_fixture.hpp"

using namespace qpt;

namespace {
std::string msg() { return std::string(compcntr::last_error_message()); }
}  // namespace

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

namespace {

struct entry {
  std::uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  std::uint32_t byte_len;
  std::uint32_t qp_num;
};

/// An ibv_cq_ex whose completions come from a queue the test fills.
struct fake_cq : ibv_cq_ex {
  std::mutex mu;  // producers (tests) vs the polling thread
  std::deque<entry> pending;
  entry cur{};
  int starts = 0, ends = 0, byte_len_reads = 0, qp_num_reads = 0;

  /// with_byte_len / with_qp_num: as if created with IBV_WC_EX_WITH_BYTE_LEN / _QP_NUM; without
  /// them the read functions are NULL, so reading them would crash the test.
  explicit fake_cq(bool with_byte_len = true, bool with_qp_num = true) : ibv_cq_ex{} {
    start_poll = [](ibv_cq_ex* c, ibv_poll_cq_attr*) -> int {
      auto* f = static_cast<fake_cq*>(c);
      f->mu.lock();  // held until end_poll, as a real CQ lock would be
      if (!f->load()) {
        f->mu.unlock();
        return ENOENT;
      }
      ++f->starts;
      return 0;
    };
    next_poll = [](ibv_cq_ex* c) -> int { return static_cast<fake_cq*>(c)->load() ? 0 : ENOENT; };
    end_poll = [](ibv_cq_ex* c) {
      auto* f = static_cast<fake_cq*>(c);
      ++f->ends;
      f->mu.unlock();
    };
    read_opcode = [](ibv_cq_ex* c) { return static_cast<fake_cq*>(c)->cur.opcode; };
    if (with_byte_len)
      read_byte_len = [](ibv_cq_ex* c) {
        auto* f = static_cast<fake_cq*>(c);
        ++f->byte_len_reads;
        return f->cur.byte_len;
      };
    if (with_qp_num)
      read_qp_num = [](ibv_cq_ex* c) {
        auto* f = static_cast<fake_cq*>(c);
        ++f->qp_num_reads;
        return f->cur.qp_num;
      };
  }
  bool load() {
    if (pending.empty()) return false;
    cur = pending.front();
    pending.pop_front();
    wr_id = cur.wr_id;
    status = cur.status;
    return true;
  }
  void push(entry e) {
    std::lock_guard<std::mutex> g(mu);
    pending.push_back(e);
  }
  void ok(ibv_wc_opcode op, std::uint32_t len = 0, std::uint64_t wr_id = 0, std::uint32_t qpn = 0) {
    push({wr_id, IBV_WC_SUCCESS, op, len, qpn});
  }
  void error(std::uint64_t wr_id = 0, std::uint32_t qpn = 0,
             ibv_wc_status st = IBV_WC_WR_FLUSH_ERR) {
    // The opcode of an error completion is undefined in verbs: give it a misleading one.
    push({wr_id, st, IBV_WC_RDMA_WRITE, 0xdead, qpn});
  }
};

struct fake_qp : ibv_qp {
  explicit fake_qp(std::uint32_t num, ibv_qp_state st = IBV_QPS_INIT) : ibv_qp{} {
    qp_num = num;
    state = st;
    qp_type = IBV_QPT_RC;
  }
};

compcntr::qp wrap(compcntr::device& dev, ibv_qp* q, compcntr::verbs_qp_options o) {
  std::error_code ec;
  auto w = dev.wrap_verbs_qp(q, o, ec);
  REQUIRE_FALSE(ec);
  return w;
}

compcntr::verbs_qp_options on(fake_cq& send, fake_cq* recv = nullptr) {
  compcntr::verbs_qp_options o;
  o.send_cq = &send;
  o.recv_cq = recv;
  return o;
}

std::uint32_t bits(attach_op a) { return static_cast<std::uint32_t>(a); }

}  // namespace

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

TEST_CASE("error completions: receive CQ -> RECV, wr_info names the op, else the lowest attached op") {
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
  compcntr::detail::slot* orphan;
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

TEST_CASE("C: compcntr_wrap_ibv_qp and compcntr_progress") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  fake_cq cq;
  fake_qp vq(81);
  compcntr_verbs_qp_attr attr{};
  attr.send_cq = &cq;
  errno = 0;
  CHECK(compcntr_wrap_ibv_qp(nullptr, &vq, &attr) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_wrap_ibv_qp(dev, nullptr, &attr) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_wrap_ibv_qp(dev, &vq, nullptr) == nullptr);
  CHECK(errno == EINVAL);
  attr.send_cq = nullptr;
  errno = 0;
  CHECK(compcntr_wrap_ibv_qp(dev, &vq, &attr) == nullptr);
  CHECK(errno == EINVAL);
  attr.send_cq = &cq;
  compcntr_qp* q = compcntr_wrap_ibv_qp(dev, &vq, &attr);
  REQUIRE(q);
  compcntr_comp_cntr_init_attr ca{};
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &ca);
  REQUIRE(cc);
  compcntr_qp_attach_comp_cntr_attr aa{0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RECV};
  CHECK(compcntr_qp_attach_comp_cntr(q, cc, &aa) == 0);
  aa.op_mask = COMPCNTR_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE;
  CHECK(compcntr_qp_attach_comp_cntr(q, cc, &aa) == ENOTSUP);
  CHECK(compcntr_post_send(q, 1, &vq, 1, 1) == ENOTSUP);
  cq.ok(IBV_WC_RECV, 5);
  cq.ok(IBV_WC_RECV, 5);
  std::size_t n = 0;
  CHECK(compcntr_progress(nullptr, &n) == EINVAL);
  CHECK(compcntr_progress(dev, &n) == 0);
  CHECK(n == 2);
  CHECK(compcntr_progress(dev, nullptr) == 0);
  std::uint64_t v = 0;
  CHECK(compcntr_read_comp_cntr(cc, &v) == 0);
  CHECK(v == 2);
  CHECK(compcntr_destroy_comp_cntr(cc) == EBUSY);
  CHECK(compcntr_destroy_qp(q) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

#endif  // COMPCNTR_HAVE_VERBS

TEST_CASE("wait and poll_any drive the device's progress: no hook needed for a wrapped QP's CQ") {
  using namespace std::chrono_literals;
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(31);
  auto w = wrap(dev, &vq, on(cq));
  auto sends = make_counter(dev), recvs = make_counter(dev);
  attach(w, sends, bits(attach_op::send));

  // Already in the CQ when the wait starts: the wait's first check drains it.
  cq.ok(IBV_WC_SEND, 8);
  CHECK(compcntr::wait(sends, 1, 0ms) == std::errc{});
  CHECK(sends.value() == 1);

  // Arrives while the waiter sleeps (forced-sleep mode, no hook): its bounded sleep slices
  // keep draining the CQ, so the completion ends the wait.
  // The producer pushes only once the waiter is registered as a sleeper on the counter: with
  // nothing driving the CQ the wait would then sleep until its timeout.
  const auto* slot = sends.native_slot();
  std::thread producer([&] {
    while ((slot->watch.load() & compcntr::detail::watch_sleepers_mask) == 0)
      std::this_thread::yield();
    cq.ok(IBV_WC_SEND, 8);
  });
  CHECK(compcntr::wait(sends, 2, 10s, compcntr::wait_options{.spin = 0ns}) == std::errc{});
  producer.join();
  CHECK(sends.value() == 2);

  // poll_any over counters of that device drives it too; an error completion is EIO.
  std::vector<const compcntr::counter*> list{&recvs, &sends};
  const std::uint64_t thresholds[] = {1, 100};
  cq.error(0, 31);
  const auto r = compcntr::poll_any(std::span<const compcntr::counter* const>(list),
                                    std::span<const std::uint64_t>(thresholds), 10s);
  CHECK(r.status == std::errc::io_error);
  CHECK(r.index == 1);
  CHECK(sends.errors() == 1);
}

// Review finding (2026-11-30): whether a waiter must wake up to drive progress was decided once,
// when it started. A waiter asleep before its counter was attached to a wrapped QP (whose CQ
// only waiters drain) slept until its timeout, or forever. Now attach wakes the counter's
// sleepers (slot::kick) and they decide again after registering. Each wait below has a 20 s
// timeout; without the fix it lasts all of it, so 10 s is a generous failure bound.
TEST_CASE("a waiter asleep before its counter was attached to a wrapped QP drives that QP's CQ") {
  using namespace std::chrono_literals;
  auto dev = open_soft();
  auto sends = make_counter(dev), recvs = make_counter(dev);
  const auto* s_slot = sends.native_slot();
  const auto* r_slot = recvs.native_slot();

  std::atomic<int> wait_result{-1};
  std::atomic<long long> wait_ms{-1};
  std::thread waiter([&] {
    const auto t0 = std::chrono::steady_clock::now();
    wait_result = static_cast<int>(compcntr::wait(sends, 1, 20s, compcntr::wait_options{.spin = 0ns}));
    wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - t0).count();
  });
  std::atomic<int> poll_status{-1};
  std::atomic<long long> poll_ms{-1};
  std::thread poller([&] {
    const compcntr::counter* list[] = {&recvs};
    const std::uint64_t thresholds[] = {1};
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = compcntr::poll_any(std::span<const compcntr::counter* const>(list),
                                      std::span<const std::uint64_t>(thresholds), 20s,
                                      compcntr::wait_options{.spin = 0ns});
    poll_status = static_cast<int>(r.status);
    poll_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - t0).count();
  });
  // Both asleep in the kernel (registered) before the QP exists.
  while ((s_slot->watch.load() & compcntr::detail::watch_sleepers_mask) == 0 ||
         (r_slot->watch.load() & compcntr::detail::watch_pollers) == 0)
    std::this_thread::yield();

  fake_cq cq;
  fake_qp vq(41);
  auto w = wrap(dev, &vq, on(cq));
  attach(w, sends, bits(attach_op::send));
  attach(w, recvs, bits(attach_op::recv));
  cq.ok(IBV_WC_SEND, 8);
  cq.ok(IBV_WC_RECV, 8, 0, 41);
  waiter.join();
  poller.join();
  CHECK(wait_result.load() == 0);
  CHECK(wait_ms.load() < 10'000);
  CHECK(poll_status.load() == 0);
  CHECK(poll_ms.load() < 10'000);
  CHECK(sends.value() == 1);
  CHECK(recvs.value() == 1);
}

// Review findings (2026-11-30) on the CQ emulation.
TEST_CASE("completions left in a CQ by a destroyed wrapper are not charged to the next one") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp a(61), b(62);
  auto wa = wrap(dev, &a, on(cq));
  auto ca = make_counter(dev);
  attach(wa, ca, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 61);
  cq.ok(IBV_WC_SEND, 0, 0, 61);
  wa.reset();                        // A's two completions were still in the CQ: dropped
  CHECK(ca.value() == 0);
  cq.ok(IBV_WC_SEND, 0, 0, 61);      // one of A's, arriving late
  auto wb = wrap(dev, &b, on(cq));
  auto cb = make_counter(dev);
  attach(wb, cb, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 62);
  dev.progress();
  CHECK(cb.value() == 1);            // B's own completion only (the late one is routed by qp_num)
  CHECK(ca.value() == 0);
  {
    std::lock_guard g(cq.mu);
    CHECK(cq.pending.empty());
  }
}

TEST_CASE("a CQ is drained by one device, an ibv_qp is wrapped once in the process") {
  auto d1 = open_soft(), d2 = open_soft();
  fake_cq cq, other;
  fake_qp a(71), b(72);
  auto wa = wrap(d1, &a, on(cq));
  std::error_code ec;
  auto again = d2.wrap_verbs_qp(&a, on(other), ec);   // the same ibv_qp on another device
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(!again);
  auto wb = d2.wrap_verbs_qp(&b, on(cq), ec);         // another QP on the CQ d1 drains
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(!wb);
  CHECK(std::string(compcntr::last_error_message()).find("another compcntr device") != std::string::npos);
  // Refused: nothing registered on d2, d1 unchanged.
  auto ca = make_counter(d1);
  attach(wa, ca, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 71);
  CHECK(d2.progress() == 0);
  CHECK(d1.progress() == 1);
  CHECK(ca.value() == 1);
  // Once d1 lets go of the CQ, d2 may drain it.
  wa.reset();
  wb = wrap(d2, &b, on(cq));
  auto cb = make_counter(d2);
  attach(wb, cb, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 72);
  CHECK(d2.progress() == 1);
  CHECK(cb.value() == 1);
}

TEST_CASE("an error on a CQ without the QP's receives is never a RECV error") {
  auto dev = open_soft();
  fake_cq scq, rcq;
  fake_qp vq(81);
  auto w = wrap(dev, &vq, on(scq, &rcq));
  auto r = make_counter(dev), wr = make_counter(dev);
  attach(w, r, bits(attach_op::recv));
  attach(w, wr, bits(attach_op::rdma_write));
  scq.error();                       // a failed RDMA write on the send CQ, no wr_info
  rcq.error();                       // a failed receive on the receive CQ
  dev.progress();
  CHECK(r.errors() == 1);
  CHECK(wr.errors() == 1);
}

TEST_CASE("sharing a CQ that cannot read qp_num is refused and changes nothing") {
  auto dev = open_soft();
  fake_cq cq(true, false);           // created without IBV_WC_EX_WITH_QP_NUM
  fake_qp a(91), b(92);
  auto wa = wrap(dev, &a, on(cq));
  std::error_code ec;
  auto wb = dev.wrap_verbs_qp(&b, on(cq), ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(!wb);
  auto ca = make_counter(dev);
  attach(wa, ca, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 0);
  CHECK(dev.progress() == 1);        // still A's CQ alone: no qp_num read (it would crash)
  CHECK(ca.value() == 1);
  wb = dev.wrap_verbs_qp(&b, on(cq), ec);   // b was not left half-registered
  CHECK(ec == std::errc::invalid_argument);
}

// Second review (2026-11-30) of the fixes above.
TEST_CASE("a refused wrap leaves the application's other CQ untouched") {
  auto dev = open_soft();
  fake_cq as, x;
  fake_cq y(true, false);            // receive CQ without qp_num: cannot be shared
  fake_qp a(101), b(102);
  auto wa = wrap(dev, &a, on(as, &y));
  x.ok(IBV_WC_SEND, 0, 0, 7);        // an entry of some QP of the application's, on X
  std::error_code ec;
  auto wb = dev.wrap_verbs_qp(&b, on(x, &y), ec);   // X is new, Y would be shared: refused
  CHECK(ec == std::errc::invalid_argument);
  CHECK(!wb);
  std::lock_guard g(x.mu);
  CHECK(x.pending.size() == 1);      // not drained by the refused wrap's cleanup
}

TEST_CASE("a hook paced slowly does not slow down driving the device's CQs") {
  using namespace std::chrono_literals;
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(111);
  auto w = wrap(dev, &vq, on(cq));
  auto c = make_counter(dev);
  attach(w, c, bits(attach_op::send));
  std::atomic<int> rc{-1};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    compcntr::wait_options o{.spin = 0ns};
    o.progress = [](void*) noexcept {};
    o.progress_interval = 10s;       // the hook wants 10 s slices; the CQ still needs 1 ms ones
    rc = static_cast<int>(compcntr::wait(c, 1, 20s, o));
  });
  while ((c.native_slot()->watch.load() & compcntr::detail::watch_sleepers_mask) == 0)
    std::this_thread::yield();
  cq.ok(IBV_WC_SEND, 8);
  waiter.join();
  CHECK(rc.load() == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}
