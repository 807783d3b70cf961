// Fake verbs objects for the verbs suites: an ibv_cq_ex whose completions come from a queue the
// test fills (ibv_cq_ex's extended polling API is a table of function pointers, so a test can
// implement it and feed exact completion streams), a bare ibv_qp, and wrapping helpers.
// Include after <infiniband/verbs.h>, `import compcntr;` and "qp_fixture.hpp" (doctest).
#ifndef COMPCNTR_TESTS_FAKE_VERBS_HPP
#define COMPCNTR_TESTS_FAKE_VERBS_HPP

#include <cstdint>
#include <deque>
#include <mutex>
#include <system_error>

namespace fake_verbs {

using qpt::attach_op;

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

inline compcntr::qp wrap(compcntr::device& dev, ibv_qp* q, compcntr::verbs_qp_options o) {
  std::error_code ec;
  auto w = dev.wrap_verbs_qp(q, o, ec);
  REQUIRE_FALSE(ec);
  return w;
}

inline compcntr::verbs_qp_options on(fake_cq& send, fake_cq* recv = nullptr) {
  compcntr::verbs_qp_options o;
  o.send_cq = &send;
  o.recv_cq = recv;
  return o;
}

inline std::uint32_t bits(attach_op a) { return static_cast<std::uint32_t>(a); }

} // namespace fake_verbs

#endif
