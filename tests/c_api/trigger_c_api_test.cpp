// The C API of triggered operations (include/compcntr/trigger.h): every call's results and errno
// values, the built-in counter actions, deferred progress and the service thread, the trigger
// on a QP's completions (a chain of transfers without the caller: the software device's
// triggered work requests are actions that post).
#include <compcntr/compcntr.h>
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "c_support.hpp"

using c_support::has;
using c_support::make_cc;

namespace {

struct record {
  std::vector<std::pair<int, int>> calls;  // (tag, status)
};
struct tagged {
  record* r;
  int tag;
};
void note(void* ctx, int status) {
  auto* t = static_cast<tagged*>(ctx);
  t->r->calls.emplace_back(t->tag, status);
}
using calls = std::vector<std::pair<int, int>>;

} // namespace

TEST_CASE("arm, fire, state, threshold; cancel and EALREADY") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_comp_cntr* cc = make_cc(dev);
  record r;
  tagged a{&r, 1}, b{&r, 2};
  compcntr_trigger* ta = compcntr_trigger_arm(cc, 2, note, &a, COMPCNTR_TRIGGER_INLINE);
  compcntr_trigger* tb = compcntr_trigger_arm(cc, 1, note, &b, COMPCNTR_TRIGGER_INLINE);
  REQUIRE(ta);
  REQUIRE(tb);
  CHECK(compcntr_trigger_state(ta) == 0);
  CHECK(compcntr_trigger_threshold(ta) == 2);
  CHECK(compcntr_inc_comp_cntr(cc, 2) == 0);  // the inline fast path reaches the watcher path
  CHECK(r.calls == calls{{2, 0}, {1, 0}});
  CHECK(compcntr_trigger_state(ta) == 1);
  CHECK(compcntr_trigger_cancel(ta) == EALREADY);
  CHECK(has("already fired"));

  tagged c{&r, 3};
  compcntr_trigger* tc = compcntr_trigger_arm(cc, 10, note, &c, COMPCNTR_TRIGGER_INLINE);
  REQUIRE(tc);
  CHECK(compcntr_trigger_cancel(tc) == 0);
  CHECK(r.calls.back() == std::pair{3, ECANCELED});
  CHECK(compcntr_trigger_state(tc) == 2);
  CHECK(compcntr_trigger_destroy(ta) == 0);
  CHECK(compcntr_trigger_destroy(tb) == 0);
  CHECK(compcntr_trigger_destroy(tc) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("argument errors are EINVAL and arm nothing") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_comp_cntr* cc = make_cc(dev);
  record r;
  tagged a{&r, 1};
  errno = 0;
  CHECK(compcntr_trigger_arm(nullptr, 1, note, &a, COMPCNTR_TRIGGER_INLINE) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("cc is NULL"));
  errno = 0;
  CHECK(compcntr_trigger_arm(cc, 1, nullptr, &a, COMPCNTR_TRIGGER_INLINE) == nullptr);
  CHECK(errno == EINVAL);
  for (uint32_t flags : {0u, 3u, 4u}) {
    errno = 0;
    CHECK(compcntr_trigger_arm(cc, 1, note, &a, flags) == nullptr);
    CHECK(errno == EINVAL);
    CHECK(has("exactly one of COMPCNTR_TRIGGER_INLINE"));
  }
  errno = 0;
  CHECK(compcntr_trigger_arm_add(cc, 1, nullptr, 1) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(compcntr_trigger_arm_set(nullptr, 1, cc, 1) == nullptr);
  CHECK(compcntr_trigger_cancel(nullptr) == EINVAL);
  CHECK(compcntr_trigger_destroy(nullptr) == EINVAL);
  CHECK(compcntr_trigger_state(nullptr) == -EINVAL);
  errno = 0;
  CHECK(compcntr_trigger_threshold(nullptr) == 0);
  CHECK(errno == EINVAL);
  CHECK(compcntr_trigger_flush(nullptr) == -EINVAL);
  CHECK(compcntr_trigger_progress(nullptr) == -EINVAL);
  CHECK(compcntr_trigger_service_start(nullptr) == EINVAL);
  CHECK(compcntr_trigger_service_stop(nullptr) == EINVAL);
  CHECK(compcntr_inc_comp_cntr(cc, 5) == 0);
  CHECK(r.calls.empty());  // nothing was armed
  CHECK(compcntr_trigger_flush(cc) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("arm_add / arm_set hold their target; flush; progress; destroy with armed triggers") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_comp_cntr* src = make_cc(dev);
  compcntr_comp_cntr* dst = make_cc(dev);
  compcntr_trigger* add = compcntr_trigger_arm_add(src, 3, dst, 7);
  compcntr_trigger* set = compcntr_trigger_arm_set(src, 5, dst, 1000);
  REQUIRE(add);
  REQUIRE(set);
  CHECK(compcntr_destroy_comp_cntr(dst) == EBUSY);  // held by the triggers
  uint64_t v = 0;
  compcntr_inc_comp_cntr(src, 3);
  compcntr_read_comp_cntr(dst, &v);
  CHECK(v == 7);
  compcntr_set_comp_cntr(src, 5);
  compcntr_read_comp_cntr(dst, &v);
  CHECK(v == 1000);

  record r;
  tagged d1{&r, 1}, d2{&r, 2}, i9{&r, 9};
  compcntr_trigger* t1 = compcntr_trigger_arm(src, 6, note, &d1, COMPCNTR_TRIGGER_DEFERRED);
  compcntr_trigger* t2 = compcntr_trigger_arm(src, 100, note, &d2, COMPCNTR_TRIGGER_DEFERRED);
  compcntr_trigger* t9 = compcntr_trigger_arm(src, 200, note, &i9, COMPCNTR_TRIGGER_INLINE);
  REQUIRE(t1);
  REQUIRE(t2);
  REQUIRE(t9);
  compcntr_inc_comp_cntr(src, 1);  // t1 due, not run
  CHECK(r.calls.empty());
  CHECK(compcntr_trigger_progress(dev) == 1);
  CHECK(r.calls == calls{{1, 0}});
  CHECK(compcntr_trigger_progress(dev) == 0);
  CHECK(compcntr_trigger_flush(src) == 2);  // t2 (100) and t9 (200)
  CHECK(r.calls == calls{{1, 0}, {2, ECANCELED}, {9, ECANCELED}});  // threshold order

  tagged late{&r, 50};
  compcntr_trigger* t50 = compcntr_trigger_arm(src, 50, note, &late, COMPCNTR_TRIGGER_INLINE);
  REQUIRE(t50);
  CHECK(compcntr_destroy_comp_cntr(src) == 0);  // cancels t50
  CHECK(r.calls.back() == std::pair{50, ECANCELED});
  CHECK(compcntr_trigger_state(t50) == 2);
  for (compcntr_trigger* t : {add, set, t1, t2, t9, t50}) CHECK(compcntr_trigger_destroy(t) == 0);
  CHECK(compcntr_destroy_comp_cntr(dst) == 0);  // released by the triggers' destroy
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("chains: a counter's own update inside its batch is looked at before the other "
          "counters the batch updated") {
  // Found by fuzz_fi_ofi (corpus/fi_ofi/divergence-self-chain-order): an action that updated
  // its own counter put it behind the other counters its batch updated, so their deferred
  // actions were queued first; the model (and another thread's update) look again at once.
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_comp_cntr* c = make_cc(dev);
  compcntr_comp_cntr* d = make_cc(dev);
  compcntr_comp_cntr* e = make_cc(dev);
  record r;
  tagged at2{&r, 1}, at3{&r, 2}, bd{&r, 3}, be{&r, 4};
  // At 1 on c: add 1 to c (its own), set d to 5, add 1 to c again, set e to 5.
  compcntr_trigger* self1 = compcntr_trigger_arm_add(c, 1, c, 1);
  compcntr_trigger* setd = compcntr_trigger_arm_set(c, 1, d, 5);
  compcntr_trigger* self2 = compcntr_trigger_arm_add(c, 1, c, 1);
  compcntr_trigger* sete = compcntr_trigger_arm_set(c, 1, e, 5);
  compcntr_trigger* tc2 = compcntr_trigger_arm(c, 2, note, &at2, COMPCNTR_TRIGGER_DEFERRED);
  compcntr_trigger* tc3 = compcntr_trigger_arm(c, 3, note, &at3, COMPCNTR_TRIGGER_DEFERRED);
  compcntr_trigger* td = compcntr_trigger_arm(d, 1, note, &bd, COMPCNTR_TRIGGER_DEFERRED);
  compcntr_trigger* te = compcntr_trigger_arm(e, 1, note, &be, COMPCNTR_TRIGGER_DEFERRED);
  for (compcntr_trigger* t : {self1, setd, self2, sete, tc2, tc3, td, te}) REQUIRE(t);
  CHECK(compcntr_inc_comp_cntr(c, 1) == 0);
  uint64_t v = 0;
  compcntr_read_comp_cntr(c, &v);
  CHECK(v == 3);
  CHECK(r.calls.empty());  // deferred: queued, not run
  CHECK(compcntr_trigger_progress(dev) == 4);
  // c's own (threshold order), then the other counters, the last updated first (a stack).
  CHECK(r.calls == calls{{1, 0}, {2, 0}, {4, 0}, {3, 0}});
  for (compcntr_trigger* t : {self1, setd, self2, sete, tc2, tc3, td, te})
    CHECK(compcntr_trigger_destroy(t) == 0);
  for (compcntr_comp_cntr* x : {c, d, e}) CHECK(compcntr_destroy_comp_cntr(x) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

namespace {
// Two connected QPs of dev (RESET -> INIT -> connected), with counters attached first:
// {counter, op bits} for each side.
using attachments = std::vector<std::pair<compcntr_comp_cntr*, uint32_t>>;
std::pair<compcntr_qp*, compcntr_qp*> connected_qps(compcntr_device* dev, const attachments& on_a,
                                                    const attachments& on_b) {
  compcntr_qp* a = compcntr_create_qp(dev);
  compcntr_qp* b = compcntr_create_qp(dev);
  REQUIRE(a);
  REQUIRE(b);
  for (auto [qp, list] : {std::pair{a, &on_a}, std::pair{b, &on_b}})
    for (auto [cc, ops] : *list) {
      compcntr_qp_attach_comp_cntr_attr at{0, ops};
      REQUIRE(compcntr_qp_attach_comp_cntr(qp, cc, &at) == 0);
    }
  REQUIRE(compcntr_modify_qp(a, COMPCNTR_QPS_INIT) == 0);
  REQUIRE(compcntr_modify_qp(b, COMPCNTR_QPS_INIT) == 0);
  REQUIRE(compcntr_connect_qp(a, b) == 0);
  return {a, b};
}

// A triggered work request: when the send counter reaches the threshold, post the next send.
struct chain_link {
  compcntr_qp* qp;
  const char* buf;
  uint32_t lkey;
  int posted;
};
void post_next(void* ctx, int status) {
  auto* l = static_cast<chain_link*>(ctx);
  if (status != 0) return;
  if (compcntr_post_send(l->qp, 99, l->buf, 8, l->lkey) == 0) ++l->posted;
}
} // namespace

TEST_CASE("triggered work requests on the software device: a chain of sends without the caller") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_comp_cntr* sends = make_cc(dev);
  compcntr_comp_cntr* recvs = make_cc(dev);
  auto [a, b] = connected_qps(dev, {{sends, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND}},
                              {{recvs, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RECV}});
  static char out[8] = "payload", in[4][8];
  compcntr_mr* mo = compcntr_reg_mr(dev, out, sizeof out, COMPCNTR_ACCESS_LOCAL_WRITE);
  compcntr_mr* mi = compcntr_reg_mr(dev, in, sizeof in, COMPCNTR_ACCESS_LOCAL_WRITE);
  REQUIRE(mo);
  REQUIRE(mi);
  for (int i = 0; i < 4; ++i) REQUIRE(compcntr_post_recv(b, i, in[i], 8, mi->lkey) == 0);
  // Sends 2, 3 and 4 are posted by deferred triggers on the send counter at 1, 2 and 3.
  chain_link link{a, out, mo->lkey, 0};
  std::vector<compcntr_trigger*> ts;
  for (uint64_t th = 1; th <= 3; ++th) {
    compcntr_trigger* t =
        compcntr_trigger_arm(sends, th, post_next, &link, COMPCNTR_TRIGGER_DEFERRED);
    REQUIRE(t);
    ts.push_back(t);
  }
  REQUIRE(compcntr_trigger_service_start(dev) == 0);
  REQUIRE(compcntr_post_send(a, 1, out, 8, mo->lkey) == 0);  // the caller posts only the first
  CHECK(compcntr_wait_comp_cntr(recvs, 4, 10000) == 0);    // the service thread posts the rest
  CHECK(compcntr_trigger_service_stop(dev) == 0);
  uint64_t v = 0;
  compcntr_read_comp_cntr(sends, &v);
  CHECK(v == 4);
  CHECK(link.posted == 3);
  CHECK(std::memcmp(in[3], "payload", 8) == 0);
  for (compcntr_trigger* t : ts) CHECK(compcntr_trigger_destroy(t) == 0);
  CHECK(compcntr_destroy_qp(a) == 0);
  CHECK(compcntr_destroy_qp(b) == 0);
  CHECK(compcntr_dereg_mr(mo) == 0);
  CHECK(compcntr_dereg_mr(mi) == 0);
  CHECK(compcntr_destroy_comp_cntr(sends) == 0);
  CHECK(compcntr_destroy_comp_cntr(recvs) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

namespace {
// A triggered RDMA transfer: when the counter reaches its threshold, post one write (or read) of
// block `i` of 8 bytes. `rkey` may be wrong on purpose (the failing link).
struct rdma_link {
  compcntr_qp* qp;
  bool read;
  char* local;
  uint32_t lkey;
  uint64_t remote;
  uint32_t rkey;
  int i;
  int rc = -1;
};
void post_rdma(void* ctx, int status) {
  auto* l = static_cast<rdma_link*>(ctx);
  if (status != 0) {
    l->rc = status;
    return;
  }
  char* loc = l->local + 8 * l->i;
  const uint64_t rem = l->remote + 8 * static_cast<uint64_t>(l->i);
  l->rc = l->read ? compcntr_post_rdma_read(l->qp, 100 + l->i, loc, 8, l->lkey, rem, l->rkey)
                  : compcntr_post_rdma_write(l->qp, 200 + l->i, loc, 8, l->lkey, rem, l->rkey);
}
} // namespace

TEST_CASE("triggered RDMA writes and reads on the software device: chains, and a failing link") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_comp_cntr* writes = make_cc(dev);
  compcntr_comp_cntr* reads = make_cc(dev);
  compcntr_comp_cntr* remote_writes = make_cc(dev);
  auto [a, b] = connected_qps(dev,
                              {{writes, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE},
                               {reads, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_READ}},
                              {{remote_writes, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE}});
  static char src[4][8] = {"block-0", "block-1", "block-2", "block-3"};
  static char target[4][8], back[4][8];
  compcntr_mr* ms = compcntr_reg_mr(dev, src, sizeof src, COMPCNTR_ACCESS_LOCAL_WRITE);
  compcntr_mr* mb = compcntr_reg_mr(dev, back, sizeof back, COMPCNTR_ACCESS_LOCAL_WRITE);
  compcntr_mr* mt = compcntr_reg_mr(
      dev, target, sizeof target,
      COMPCNTR_ACCESS_LOCAL_WRITE | COMPCNTR_ACCESS_REMOTE_WRITE | COMPCNTR_ACCESS_REMOTE_READ);
  REQUIRE(ms);
  REQUIRE(mb);
  REQUIRE(mt);
  const uint64_t taddr = reinterpret_cast<uintptr_t>(target);

  // Writes 1..3 are posted by deferred triggers on the write counter at 1, 2 and 3 (armed in
  // reverse order: they still run in threshold order); when the fourth write completes, a
  // trigger at 4 starts the read chain (reads 1..3 triggered by the read counter at 1..3).
  std::vector<rdma_link> wl, rl;
  wl.reserve(4);
  rl.reserve(4);
  for (int i = 0; i < 4; ++i) {
    wl.push_back(rdma_link{a, false, &src[0][0], ms->lkey, taddr, mt->rkey, i});
    rl.push_back(rdma_link{a, true, &back[0][0], mb->lkey, taddr, mt->rkey, i});
  }
  std::vector<compcntr_trigger*> ts;
  for (int th = 3; th >= 1; --th) {
    ts.push_back(compcntr_trigger_arm(writes, th, post_rdma, &wl[th], COMPCNTR_TRIGGER_DEFERRED));
    ts.push_back(compcntr_trigger_arm(reads, th, post_rdma, &rl[th], COMPCNTR_TRIGGER_DEFERRED));
  }
  ts.push_back(compcntr_trigger_arm(writes, 4, post_rdma, &rl[0], COMPCNTR_TRIGGER_DEFERRED));
  for (compcntr_trigger* t : ts) REQUIRE(t);
  REQUIRE(compcntr_trigger_service_start(dev) == 0);
  // The caller posts only the first write; the service thread posts the other seven transfers.
  REQUIRE(compcntr_post_rdma_write(a, 200, src[0], 8, ms->lkey, taddr, mt->rkey) == 0);
  CHECK(compcntr_wait_comp_cntr(reads, 4, 10000) == 0);
  uint64_t v = 0, e = 0;
  compcntr_read_comp_cntr(writes, &v);
  CHECK(v == 4);
  compcntr_read_comp_cntr(remote_writes, &v);
  CHECK(v == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(std::memcmp(target[i], src[i], 8) == 0);
    CHECK(std::memcmp(back[i], src[i], 8) == 0);
  }

  // A failing link: a triggered write with a wrong rkey is accepted, completes in error (the
  // write counter's error count; the QP goes to ERR, as in verbs) and moves no byte; the trigger
  // armed behind it on the same counter stays armed until its own threshold, which a transfer
  // of a second QP pair counting into the same counter reaches.
  auto [c, d] = connected_qps(dev, {{writes, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE}}, {});
  rdma_link bad{a, false, &src[0][0], ms->lkey, taddr, mt->rkey + 1000, 0};
  rdma_link after{c, false, &src[0][0], ms->lkey, taddr, mt->rkey, 1};
  std::memset(target, 0, sizeof target);
  compcntr_trigger* tbad =
      compcntr_trigger_arm(writes, 5, post_rdma, &bad, COMPCNTR_TRIGGER_DEFERRED);
  compcntr_trigger* tafter =
      compcntr_trigger_arm(writes, 6, post_rdma, &after, COMPCNTR_TRIGGER_DEFERRED);
  REQUIRE(tbad);
  REQUIRE(tafter);
  REQUIRE(compcntr_post_rdma_write(a, 201, src[2], 8, ms->lkey, taddr + 16, mt->rkey) == 0);
  // The fifth write completes: `bad` is posted, and its completion is an error.
  CHECK(compcntr_wait_comp_cntr_since(writes, UINT64_MAX, 0, 10000, nullptr) == EIO);
  uint64_t err = 0;
  compcntr_read_err_comp_cntr(writes, &err);
  CHECK(err == 1);
  compcntr_read_comp_cntr(writes, &v);
  CHECK(v == 5);  // an error completion does not move the value
  CHECK(compcntr_trigger_state(tbad) == 1);
  CHECK(compcntr_trigger_state(tafter) == 0);  // still armed: 6 not reached
  CHECK(after.rc == -1);
  static const char zero[8] = {};
  CHECK(std::memcmp(target[0], zero, 8) == 0);  // bad moved nothing
  CHECK(std::memcmp(target[2], src[2], 8) == 0);
  REQUIRE(compcntr_post_rdma_write(c, 202, src[3], 8, ms->lkey, taddr + 24, mt->rkey) == 0);
  CHECK(compcntr_wait_comp_cntr(writes, 7, 10000) == 0);  // the sixth, then `after`'s
  CHECK(std::memcmp(target[1], src[1], 8) == 0);
  CHECK(std::memcmp(target[3], src[3], 8) == 0);
  compcntr_read_err_comp_cntr(writes, &e);
  CHECK(e == 1);
  CHECK(compcntr_trigger_service_stop(dev) == 0);
  // The actions' return codes, read once the service thread is joined (an action stores its
  // post's result after the post, whose completion may already have ended the waits above).
  for (int i = 1; i < 4; ++i) {
    CHECK(wl[static_cast<std::size_t>(i)].rc == 0);
    CHECK(rl[static_cast<std::size_t>(i)].rc == 0);
  }
  CHECK(rl[0].rc == 0);
  CHECK(bad.rc == 0);  // accepted by the post; the failure is the completion's
  CHECK(after.rc == 0);
  CHECK(compcntr_destroy_qp(c) == 0);
  CHECK(compcntr_destroy_qp(d) == 0);

  ts.push_back(tbad);
  ts.push_back(tafter);
  for (compcntr_trigger* t : ts) CHECK(compcntr_trigger_destroy(t) == 0);
  CHECK(compcntr_destroy_qp(a) == 0);
  CHECK(compcntr_destroy_qp(b) == 0);
  for (compcntr_mr* m : {ms, mb, mt}) CHECK(compcntr_dereg_mr(m) == 0);
  for (compcntr_comp_cntr* c : {writes, reads, remote_writes})
    CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("closing a device with armed triggers is EBUSY and changes nothing; the service thread "
          "ends with it") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_comp_cntr* cc = make_cc(dev);
  record r;
  tagged a{&r, 1}, d{&r, 2};
  compcntr_trigger* ti = compcntr_trigger_arm(cc, 5, note, &a, COMPCNTR_TRIGGER_INLINE);
  compcntr_trigger* td = compcntr_trigger_arm(cc, 5, note, &d, COMPCNTR_TRIGGER_DEFERRED);
  REQUIRE(ti);
  REQUIRE(td);
  REQUIRE(compcntr_trigger_service_start(dev) == 0);
  CHECK(compcntr_close_device(dev) == EBUSY);  // its counter lives
  CHECK(has("still has"));
  CHECK(r.calls.empty());  // nothing cancelled, nothing run
  CHECK(compcntr_trigger_state(ti) == 0);
  CHECK(compcntr_trigger_state(td) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);  // cancels both, in threshold then arming order
  CHECK(r.calls == calls{{1, ECANCELED}, {2, ECANCELED}});
  // The service thread still runs: closing the device stops it (no hang, no leak under ASan).
  CHECK(compcntr_close_device(dev) == 0);
  CHECK(compcntr_trigger_destroy(ti) == 0);  // the handles outlive the device
  CHECK(compcntr_trigger_destroy(td) == 0);
}
