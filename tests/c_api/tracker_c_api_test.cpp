// The C API of completion tracking (compcntr/tracker.h through compcntr/compcntr.h): errno
// rules, the counter kept alive (EBUSY), issue/quiet, ETIMEDOUT, timeout 0, EIO exactly once,
// quiet_ex with a drive function, RDMA writes over loopback QPs, wrap-around, and C threads
// issuing while others quiet (ThreadSanitizer in CI).
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>
#include <compcntr/tracker.h>   // also reachable alone

#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "blocked.hpp"
#include "c_support.hpp"

namespace {

using c_support::has;
using c_support::msg;
using c_support::this_tid;
using c_support::make_cc;

struct fixture {
  compcntr_device* dev = compcntr_open_device("soft");
  compcntr_comp_cntr* cc = nullptr;
  compcntr_tracker* t = nullptr;
  fixture() {
    REQUIRE(dev != nullptr);
    cc = make_cc(dev);
    t = compcntr_tracker_create(cc);
    REQUIRE(t != nullptr);
  }
  ~fixture() {
    if (t) CHECK(compcntr_tracker_destroy(t) == 0);
    CHECK(compcntr_destroy_comp_cntr(cc) == 0);
    CHECK(compcntr_close_device(dev) == 0);
  }
};

} // namespace

TEST_CASE("C tracker: NULL arguments and bad input are EINVAL, named, and change nothing") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev != nullptr);
  errno = 0;
  CHECK(compcntr_tracker_create(nullptr) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("tracker_create: completions is NULL"));
  compcntr_comp_cntr* bytes = make_cc(dev, COMPCNTR_COMP_CNTR_TYPE_BYTES);
  errno = 0;
  CHECK(compcntr_tracker_create(bytes) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("counts bytes"));
  CHECK(compcntr_destroy_comp_cntr(bytes) == 0);   // the refused create holds nothing

  CHECK(compcntr_tracker_issue(nullptr, 1) == EINVAL);
  CHECK(has("tracker_issue: t is NULL"));
  errno = 0;
  CHECK(compcntr_tracker_issued(nullptr) == 0);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_tracker_completed(nullptr) == 0);
  CHECK(errno == EINVAL);
  CHECK(compcntr_tracker_quiet(nullptr, 0) == EINVAL);
  CHECK(compcntr_tracker_quiet_ex(nullptr, 0, nullptr) == EINVAL);
  CHECK(compcntr_tracker_destroy(nullptr) == EINVAL);
  CHECK(has("tracker_destroy: t is NULL"));

  compcntr_comp_cntr* cc = make_cc(dev);
  compcntr_tracker* t = compcntr_tracker_create(cc);
  REQUIRE(t != nullptr);
  CHECK(compcntr_tracker_issue(t, (UINT64_MAX >> 2) + 2) == EINVAL);  // above 2^62
  CHECK(has("quarter of the counter range"));
  CHECK(compcntr_tracker_issued(t) == 0);
  compcntr_wait_attr bad{};
  bad.comp_mask = 1u << 7;
  CHECK(compcntr_tracker_quiet_ex(t, 0, &bad) == EINVAL);
  CHECK(has("tracker_quiet_ex: unknown comp_mask"));
  bad.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
  bad.spin_ns = -1;
  CHECK(compcntr_tracker_quiet_ex(t, 0, &bad) == EINVAL);
  CHECK(compcntr_tracker_destroy(t) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("C tracker: the counter is EBUSY while a tracker holds it, and stays usable") {
  fixture f;
  CHECK(compcntr_destroy_comp_cntr(f.cc) == EBUSY);
  CHECK(has("completion tracker"));
  CHECK(compcntr_close_device(f.dev) == EBUSY);
  CHECK(compcntr_tracker_issue(f.t, 1) == 0);
  CHECK(compcntr_inc_comp_cntr(f.cc, 1) == 0);
  CHECK(compcntr_tracker_quiet(f.t, 0) == 0);
  CHECK(compcntr_tracker_destroy(f.t) == 0);
  f.t = nullptr;
  // The fixture destroys the counter and closes the device: both succeed now.
}

TEST_CASE("C tracker: baseline, issue, quiet, ETIMEDOUT, timeout 0") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev != nullptr);
  compcntr_comp_cntr* cc = make_cc(dev);
  compcntr_inc_comp_cntr(cc, 10);
  compcntr_inc_err_comp_cntr(cc, 3);
  compcntr_tracker* t = compcntr_tracker_create(cc);
  REQUIRE(t != nullptr);
  CHECK(compcntr_tracker_issued(t) == 0);
  CHECK(compcntr_tracker_completed(t) == 0);
  CHECK(compcntr_tracker_quiet(t, 0) == 0);       // earlier errors are not reported

  CHECK(compcntr_tracker_issue(t, 4) == 0);
  CHECK(compcntr_tracker_issue(t, 0) == 0);
  CHECK(compcntr_tracker_issued(t) == 4);
  CHECK(compcntr_tracker_quiet(t, 0) == ETIMEDOUT);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(compcntr_tracker_quiet(t, 25) == ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(25));
  compcntr_inc_comp_cntr(cc, 3);
  CHECK(compcntr_tracker_completed(t) == 3);
  CHECK(compcntr_tracker_quiet(t, 0) == ETIMEDOUT);
  compcntr_inc_comp_cntr(cc, 1);
  CHECK(compcntr_tracker_quiet(t, 0) == 0);
  CHECK(compcntr_tracker_quiet(t, -1) == 0);
  CHECK(compcntr_tracker_destroy(t) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("C tracker: EIO exactly once per error growth, after everything is accounted for") {
  fixture f;
  compcntr_tracker_issue(f.t, 2);
  compcntr_inc_err_comp_cntr(f.cc, 1);
  CHECK(compcntr_tracker_quiet(f.t, 0) == ETIMEDOUT);   // one still in flight: no EIO yet
  CHECK(compcntr_tracker_quiet(f.t, 5) == ETIMEDOUT);
  compcntr_inc_comp_cntr(f.cc, 1);
  CHECK(compcntr_tracker_quiet(f.t, -1) == EIO);
  CHECK(compcntr_tracker_quiet(f.t, -1) == 0);
  CHECK(compcntr_tracker_quiet(f.t, 0) == 0);
  compcntr_tracker_issue(f.t, 1);
  compcntr_inc_err_comp_cntr(f.cc, 1);                  // the only one failed: done, EIO once
  CHECK(compcntr_tracker_quiet(f.t, 0) == EIO);
  CHECK(compcntr_tracker_quiet(f.t, 0) == 0);
}

TEST_CASE("C tracker: a blocked quiet is woken by the last completion") {
  fixture f;
  compcntr_tracker_issue(f.t, 2);
  std::atomic<pid_t> tid{0};
  std::atomic<int> rc{-1};
  std::thread w([&] {
    tid = this_tid();
    compcntr_wait_attr a{};
    a.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
    a.spin_ns = 0;                                      // sleep at once
    rc = compcntr_tracker_quiet_ex(f.t, -1, &a);
  });
  REQUIRE(eventually_blocked(tid));
  compcntr_inc_comp_cntr(f.cc, 1);
  REQUIRE(eventually_blocked(tid));
  CHECK(rc.load() == -1);
  compcntr_inc_comp_cntr(f.cc, 1);
  w.join();
  CHECK(rc.load() == 0);
}

TEST_CASE("C tracker: quiet_ex calls its drive function; timeout 0 calls it once") {
  fixture f;
  struct st {
    compcntr_comp_cntr* cc;
    int calls;
    int complete_every;
  } s{f.cc, 0, 0};
  compcntr_wait_attr a{};
  a.progress = [](void* p) {
    auto* x = static_cast<st*>(p);
    ++x->calls;
    if (x->complete_every != 0 && x->calls % x->complete_every == 0)
      compcntr_inc_comp_cntr(x->cc, 1);
  };
  a.progress_ctx = &s;
  compcntr_tracker_issue(f.t, 1);
  CHECK(compcntr_tracker_quiet_ex(f.t, 0, &a) == ETIMEDOUT);
  CHECK(s.calls == 1);
  s.calls = 0;
  s.complete_every = 4;
  compcntr_tracker_issue(f.t, 9);                      // 10 outstanding
  CHECK(compcntr_tracker_quiet_ex(f.t, -1, &a) == 0);
  CHECK(s.calls == 40);
  CHECK(compcntr_tracker_completed(f.t) == 10);
}

TEST_CASE("C tracker: RDMA writes over loopback QPs; a failed write is EIO once") {
  fixture f;
  compcntr_qp* a = compcntr_create_qp(f.dev);
  compcntr_qp* b = compcntr_create_qp(f.dev);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  compcntr_qp_attach_comp_cntr_attr at{0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE};
  REQUIRE(compcntr_qp_attach_comp_cntr(a, f.cc, &at) == 0);
  REQUIRE(compcntr_modify_qp(a, COMPCNTR_QPS_INIT) == 0);
  REQUIRE(compcntr_modify_qp(b, COMPCNTR_QPS_INIT) == 0);
  REQUIRE(compcntr_connect_qp(a, b) == 0);
  std::vector<char> src(1024, 'r'), win(1024, '.');
  compcntr_mr* smr = compcntr_reg_mr(f.dev, src.data(), src.size(), 0);
  compcntr_mr* wmr = compcntr_reg_mr(f.dev, win.data(), win.size(),
                                     COMPCNTR_ACCESS_LOCAL_WRITE | COMPCNTR_ACCESS_REMOTE_WRITE);
  REQUIRE(smr != nullptr);
  REQUIRE(wmr != nullptr);
  const auto raddr = reinterpret_cast<std::uint64_t>(win.data());
  for (int i = 0; i < 16; ++i) {
    REQUIRE(compcntr_tracker_issue(f.t, 1) == 0);
    REQUIRE(compcntr_post_rdma_write(a, i, src.data(), 64, smr->lkey, raddr + 64 * i, wmr->rkey) ==
            0);
  }
  CHECK(compcntr_tracker_quiet(f.t, 1000) == 0);
  CHECK(win[1023] == 'r');
  compcntr_tracker_issue(f.t, 1);
  REQUIRE(compcntr_post_rdma_write(a, 99, src.data(), 64, smr->lkey, raddr + 2048, wmr->rkey) == 0);
  CHECK(compcntr_tracker_quiet(f.t, 1000) == EIO);   // out of range: completed in error
  CHECK(compcntr_tracker_quiet(f.t, 1000) == 0);
  CHECK(compcntr_destroy_qp(a) == 0);
  CHECK(compcntr_destroy_qp(b) == 0);
  CHECK(compcntr_dereg_mr(smr) == 0);
  CHECK(compcntr_dereg_mr(wmr) == 0);
}

TEST_CASE("C tracker: wrap-around past 2^64") {
  fixture f;
  CHECK(compcntr_tracker_destroy(f.t) == 0);
  compcntr_set_comp_cntr(f.cc, UINT64_MAX);
  f.t = compcntr_tracker_create(f.cc);
  REQUIRE(f.t != nullptr);
  compcntr_tracker_issue(f.t, 3);
  compcntr_inc_comp_cntr(f.cc, 2);                    // UINT64_MAX -> 1
  CHECK(compcntr_tracker_quiet(f.t, 0) == ETIMEDOUT);
  compcntr_inc_comp_cntr(f.cc, 1);
  CHECK(compcntr_tracker_quiet(f.t, 0) == 0);
  CHECK(compcntr_tracker_completed(f.t) == 3);
}

TEST_CASE("C tracker: threads issuing while others quiet (exact totals, never early)") {
  fixture f;
  constexpr int issuers = 2;
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  constexpr int per = 10000;
#else
  constexpr int per = 40000;
#endif
#else
  constexpr int per = 40000;
#endif
  std::atomic<std::uint64_t> posted{0};
  std::atomic<int> done{0}, early{0}, bad{0}, quiets{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < issuers; ++i)
    ts.emplace_back([&] {
      for (int k = 0; k < per; ++k) {
        if (compcntr_tracker_issue(f.t, 1) != 0) ++bad;
        posted.fetch_add(1, std::memory_order_release);
        if (k % 2000 == 1999) {   // one more quiet finishes mid-stream (real overlap)
          const int q0 = quiets.load();
          const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while (quiets.load() == q0)
            if (std::chrono::steady_clock::now() > end) {
              ++bad;
              break;
            }
        }
      }
      ++done;
    });
  std::thread completer([&] {
    for (std::uint64_t k = 0;;) {
      if (k == posted.load(std::memory_order_acquire)) {
        if (done.load() == issuers && k == posted.load()) break;
        std::this_thread::yield();
        continue;
      }
      ++k;
      compcntr_inc_comp_cntr(f.cc, 1);
    }
  });
  std::thread quieter([&] {
    while (done.load() < issuers) {
      const std::uint64_t lower = posted.load(std::memory_order_acquire);
      if (compcntr_tracker_quiet(f.t, -1) != 0) ++bad;
      ++quiets;
      std::uint64_t v = 0;
      compcntr_read_comp_cntr(f.cc, &v);
      if (v < lower) ++early;
    }
  });
  for (auto& t : ts) t.join();
  completer.join();
  quieter.join();
  CHECK(bad.load() == 0);
  CHECK(early.load() == 0);
  CHECK(quiets.load() >= per / 2000);   // each issuer waited for a new one per 2000
  CHECK(compcntr_tracker_issued(f.t) == std::uint64_t{issuers} * per);
  CHECK(compcntr_tracker_completed(f.t) == std::uint64_t{issuers} * per);
  CHECK(compcntr_tracker_quiet(f.t, 0) == 0);
}
