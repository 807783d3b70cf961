// The C API of credit tracking (compcntr/credits.h through compcntr/compcntr.h): errno rules,
// the tracker-owned C counters (real counters, EBUSY on destroy), QP attach and destroy
// ordering, drive functions, EIO/timeouts, and a multi-threaded run over two peers.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>

#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "blocked.hpp"
#include "c_support.hpp"
#include "wait_util.hpp"

namespace {

using c_support::has;
using c_support::msg;
using c_support::this_tid;

struct fixture {
  compcntr_device* dev = compcntr_open_device("soft");
  compcntr_credits* cr = nullptr;
  fixture(uint32_t npeers, uint64_t credits) {
    REQUIRE(dev != nullptr);
    cr = compcntr_credits_create(dev, npeers, credits);
    REQUIRE(cr != nullptr);
  }
  ~fixture() {
    if (cr) CHECK(compcntr_credits_destroy(cr) == 0);
    CHECK(compcntr_close_device(dev) == 0);
  }
  uint64_t outstanding(uint32_t peer) {
    uint64_t o = 0;
    REQUIRE(compcntr_credits_outstanding(cr, peer, &o) == 0);
    return o;
  }
};

} // namespace

TEST_CASE("C credits: create validates, NULL + errno") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev != nullptr);
  errno = 0;
  CHECK(compcntr_credits_create(nullptr, 1, 1) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("dev is NULL"));
  errno = 0;
  CHECK(compcntr_credits_create(dev, 0, 1) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("credits_create: npeers must be > 0"));
  errno = 0;
  CHECK(compcntr_credits_create(dev, 1, 0) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_credits_create(dev, 1, (UINT64_MAX >> 2) + 2) == nullptr);  // above 2^62
  CHECK(errno == EINVAL);
  CHECK(has("quarter"));
  errno = 0;
  CHECK(compcntr_credits_create(dev, UINT32_MAX, 1) == nullptr);
  CHECK(errno == ENOMEM);
  CHECK(has("room for"));
  CHECK(compcntr_close_device(dev) == 0);  // nothing left behind by the refused calls
}

TEST_CASE("C credits: admission, release, outstanding; bad input changes nothing") {
  fixture f(2, 3);
  CHECK(compcntr_credits_acquire(f.cr, 0, 2, 0) == 0);
  CHECK(compcntr_credits_acquire(f.cr, 0, 1, -1) == 0);
  CHECK(compcntr_credits_acquire(f.cr, 0, 1, 0) == ETIMEDOUT);
  CHECK(compcntr_credits_acquire(f.cr, 0, 1, 10) == ETIMEDOUT);
  CHECK(f.outstanding(0) == 3);
  CHECK(f.outstanding(1) == 0);

  CHECK(compcntr_credits_acquire(nullptr, 0, 1, 0) == EINVAL);
  CHECK(has("cr is NULL"));
  CHECK(compcntr_credits_acquire(f.cr, 2, 1, 0) == EINVAL);
  CHECK(has("peer 2 out of range"));
  CHECK(compcntr_credits_acquire(f.cr, 1, 0, 0) == EINVAL);
  CHECK(compcntr_credits_acquire(f.cr, 1, 4, -1) == EINVAL);
  CHECK(compcntr_credits_release(nullptr, 0, 1) == EINVAL);
  CHECK(compcntr_credits_release(f.cr, 2, 1) == EINVAL);
  CHECK(compcntr_credits_release(f.cr, 0, 0) == EINVAL);
  CHECK(compcntr_credits_release(f.cr, 1, 1) == EINVAL);  // nothing outstanding on peer 1
  CHECK(has("only 0 outstanding"));
  CHECK(compcntr_credits_flush(nullptr, 0, 0) == EINVAL);
  CHECK(compcntr_credits_flush(f.cr, 2, 0) == EINVAL);
  uint64_t o = 5;
  CHECK(compcntr_credits_outstanding(nullptr, 0, &o) == EINVAL);
  CHECK(compcntr_credits_outstanding(f.cr, 0, nullptr) == EINVAL);
  CHECK(compcntr_credits_outstanding(f.cr, 9, &o) == EINVAL);
  CHECK(o == 5);
  CHECK(compcntr_credits_destroy(nullptr) == EINVAL);
  errno = 0;
  CHECK(compcntr_credits_counter(nullptr, 0) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_credits_counter(f.cr, 2) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(f.outstanding(0) == 3);   // none of the above changed anything
  CHECK(f.outstanding(1) == 0);

  CHECK(compcntr_credits_release(f.cr, 0, 4) == EINVAL);
  CHECK(compcntr_credits_release(f.cr, 0, 2) == 0);
  CHECK(f.outstanding(0) == 1);
  uint64_t v = 0;
  CHECK(compcntr_read_comp_cntr(compcntr_credits_counter(f.cr, 0), &v) == 0);
  CHECK(v == 2);                  // released credits are software completions
  CHECK(compcntr_credits_flush(f.cr, 0, 0) == ETIMEDOUT);
  CHECK(compcntr_credits_release(f.cr, 0, 1) == 0);
  CHECK(compcntr_credits_flush(f.cr, 0, 0) == 0);

  // Inconsistent counts: a completion that took no credit.
  compcntr_comp_cntr* c1 = compcntr_credits_counter(f.cr, 1);
  CHECK(compcntr_inc_comp_cntr(c1, 1) == 0);
  CHECK(compcntr_credits_acquire(f.cr, 1, 1, -1) == EOVERFLOW);
  CHECK(compcntr_credits_release(f.cr, 1, 1) == EOVERFLOW);
  o = 5;
  CHECK(compcntr_credits_outstanding(f.cr, 1, &o) == EOVERFLOW);
  CHECK(o == 5);
}

TEST_CASE("C credits: the counters are real C counters owned by the tracker") {
  fixture f(2, 2);
  compcntr_comp_cntr* c0 = compcntr_credits_counter(f.cr, 0);
  compcntr_comp_cntr* c1 = compcntr_credits_counter(f.cr, 1);
  REQUIRE(c0 != nullptr);
  REQUIRE(c1 != nullptr);
  CHECK(c0 != c1);
  CHECK(compcntr_credits_counter(f.cr, 0) == c0);  // the same object every time
  CHECK(c0->context == f.dev);

  CHECK(compcntr_destroy_comp_cntr(c0) == EBUSY);  // the tracker owns it
  CHECK(has("credit tracker"));
  CHECK(compcntr_close_device(f.dev) == EBUSY);    // its counters keep the device open

  REQUIRE(compcntr_credits_acquire(f.cr, 0, 2, 0) == 0);
  CHECK(compcntr_inc_comp_cntr(c0, 1) == 0);       // still usable: a completion
  CHECK(f.outstanding(0) == 1);
  CHECK(compcntr_wait_comp_cntr(c0, 1, 0) == 0);
  CHECK(compcntr_inc_err_comp_cntr(c0, 1) == 0);   // errors return credits too
  CHECK(f.outstanding(0) == 0);
  int fd = -1;
  CHECK(compcntr_comp_cntr_get_fd(c0, &fd) == 0);
  CHECK(fd >= 0);
}

namespace {
struct drive_ctx_t {
  compcntr_comp_cntr* cc;
  std::atomic<int> calls{0};
};
void progress_completes(void* p) {
  auto* h = static_cast<drive_ctx_t*>(p);
  ++h->calls;
  compcntr_inc_comp_cntr(h->cc, 1);
}
} // namespace

TEST_CASE("C credits: _ex calls take wait options and validate them") {
  fixture f(1, 1);
  REQUIRE(compcntr_credits_acquire(f.cr, 0, 1, 0) == 0);
  compcntr_wait_attr a{};
  a.comp_mask = 1u << 9;
  CHECK(compcntr_credits_acquire_ex(f.cr, 0, 1, 0, &a) == EINVAL);
  CHECK(has("credits_acquire_ex: unknown comp_mask"));
  CHECK(compcntr_credits_flush_ex(f.cr, 0, 0, &a) == EINVAL);
  CHECK(f.outstanding(0) == 1);
  drive_ctx_t h{compcntr_credits_counter(f.cr, 0)};
  a = {};
  a.progress = progress_completes;
  a.progress_ctx = &h;
  CHECK(compcntr_credits_acquire_ex(f.cr, 0, 1, -1, &a) == 0);  // the drive function completes it
  CHECK(h.calls.load() == 1);
  CHECK(compcntr_credits_flush_ex(f.cr, 0, -1, &a) == 0);
  CHECK(compcntr_credits_acquire_ex(f.cr, 0, 1, 0, nullptr) == 0);
}

TEST_CASE("C credits: a blocked acquire is woken by a QP send completion; EIO on a failed one") {
  fixture f(1, 1);
  compcntr_qp* tx = compcntr_create_qp(f.dev);
  compcntr_qp* rx = compcntr_create_qp(f.dev);
  REQUIRE(tx != nullptr);
  REQUIRE(rx != nullptr);
  compcntr_qp_attach_comp_cntr_attr at{0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND};
  REQUIRE(compcntr_qp_attach_comp_cntr(tx, compcntr_credits_counter(f.cr, 0), &at) == 0);
  REQUIRE(compcntr_modify_qp(tx, COMPCNTR_QPS_INIT) == 0);
  REQUIRE(compcntr_modify_qp(rx, COMPCNTR_QPS_INIT) == 0);
  REQUIRE(compcntr_connect_qp(tx, rx) == 0);
  char sbuf[16] = "payload", rbuf[16] = {};
  compcntr_mr* smr = compcntr_reg_mr(f.dev, sbuf, sizeof sbuf, 0);
  compcntr_mr* rmr = compcntr_reg_mr(f.dev, rbuf, sizeof rbuf, COMPCNTR_ACCESS_LOCAL_WRITE);
  REQUIRE(smr != nullptr);
  REQUIRE(rmr != nullptr);

  REQUIRE(compcntr_credits_acquire(f.cr, 0, 1, 0) == 0);
  REQUIRE(compcntr_post_send(tx, 1, sbuf, sizeof sbuf, smr->lkey) == 0);  // waits for a receive
  std::atomic<pid_t> tid{0};
  std::atomic<int> rc{-1};
  std::thread t([&] {
    tid = this_tid();
    rc = compcntr_credits_acquire(f.cr, 0, 1, -1);
  });
  REQUIRE(eventually_blocked(tid));
  REQUIRE(compcntr_post_recv(rx, 1, rbuf, sizeof rbuf, rmr->lkey) == 0);  // the send completes
  t.join();
  CHECK(rc.load() == 0);
  CHECK(std::string(rbuf) == "payload");

  // Send 2 is in flight; a waiter for a credit sees it fail (the peer goes to ERR): EIO or,
  // since the failure returns the credit, success. Here the failed send frees the only credit.
  REQUIRE(compcntr_post_send(tx, 2, sbuf, sizeof sbuf, smr->lkey) == 0);
  tid = 0;
  std::thread t2([&] {
    tid = this_tid();
    rc = compcntr_credits_acquire(f.cr, 0, 1, -1);
  });
  REQUIRE(eventually_blocked(tid));
  REQUIRE(compcntr_modify_qp(rx, COMPCNTR_QPS_ERR) == 0);  // flushes: send 2 completes in error
  t2.join();
  CHECK(rc.load() == 0);
  uint64_t e = 0;
  CHECK(compcntr_read_err_comp_cntr(compcntr_credits_counter(f.cr, 0), &e) == 0);
  CHECK(e == 1);

  // Destroying the tracker while its counter is attached to a live QP: allowed, the QP keeps
  // the counter's slot until it goes (no leak under ASan, the device closes afterwards).
  CHECK(compcntr_credits_destroy(f.cr) == 0);
  f.cr = nullptr;
  CHECK(compcntr_close_device(f.dev) == EBUSY);  // QPs, MRs and the orphaned slot
  CHECK(compcntr_dereg_mr(smr) == 0);
  CHECK(compcntr_dereg_mr(rmr) == 0);
  CHECK(compcntr_destroy_qp(tx) == 0);
  CHECK(compcntr_destroy_qp(rx) == 0);
}

TEST_CASE("C credits: EIO when a waiting acquire sees errors that do not admit it") {
  fixture f(1, 2);
  compcntr_comp_cntr* c = compcntr_credits_counter(f.cr, 0);
  REQUIRE(compcntr_credits_acquire(f.cr, 0, 2, 0) == 0);
  std::atomic<pid_t> tid{0};
  std::atomic<int> rc{-1};
  std::thread t([&] {
    tid = this_tid();
    rc = compcntr_credits_acquire(f.cr, 0, 2, -1);
  });
  REQUIRE(eventually_blocked(tid));
  CHECK(compcntr_inc_err_comp_cntr(c, 1) == 0);
  t.join();
  CHECK(rc.load() == EIO);
  CHECK(f.outstanding(0) == 1);
  CHECK(compcntr_credits_acquire(f.cr, 0, 1, 0) == 0);
}

TEST_CASE("C credits: two peers, two acquirers each, one completer: exact totals") {
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  constexpr int rounds = 3000;
#else
  constexpr int rounds = 10000;
#endif
#else
  constexpr int rounds = 10000;
#endif
  constexpr uint64_t K = 3;
  fixture f(2, K);
  compcntr_comp_cntr* cc[2] = {compcntr_credits_counter(f.cr, 0),
                               compcntr_credits_counter(f.cr, 1)};
  std::atomic<int64_t> inflight[2] = {0, 0};
  std::atomic<int64_t> pending[2] = {0, 0};
  std::atomic<int> violations{0}, bad{0}, finished{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      const uint32_t peer = static_cast<uint32_t>(t % 2);
      for (int i = 0; i < rounds; ++i) {
        if (compcntr_credits_acquire(f.cr, peer, 1, -1) != 0) {
          ++bad;
          break;
        }
        if (inflight[peer].fetch_add(1) + 1 > static_cast<int64_t>(K)) ++violations;
        ++pending[peer];
      }
      ++finished;
    });
  std::thread completer([&] {
    for (;;) {
      bool any = false;
      for (uint32_t p = 0; p < 2; ++p) {
        int64_t n = pending[p].load();
        if (n > 0 && pending[p].compare_exchange_weak(n, n - 1)) {
          any = true;
          inflight[p].fetch_sub(1);
          compcntr_inc_comp_cntr(cc[p], 1);
        }
      }
      if (!any) {
        if (finished.load() == 4 && pending[0].load() == 0 && pending[1].load() == 0) break;
        std::this_thread::yield();
      }
    }
  });
  for (auto& t : ts) t.join();
  completer.join();
  CHECK(violations.load() == 0);
  CHECK(bad.load() == 0);
  for (uint32_t p = 0; p < 2; ++p) {
    uint64_t v = 0;
    CHECK(compcntr_read_comp_cntr(cc[p], &v) == 0);
    CHECK(v == 2u * rounds);
    CHECK(f.outstanding(p) == 0);
  }
}
