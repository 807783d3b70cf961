// What C runtimes needed that only C++ had (issue 11): compcntr_wait_comp_cntr_since, the credit
// tracker's adopt/issued/completed/window calls and per-peer windows
// (compcntr_credits_create_per_peer, compcntr_credits_adopt). Exact values and errno codes;
// wake-ups from another thread checked to be asleep in the kernel first.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>

#include <poll.h>
#include <sys/epoll.h>

#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
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

struct device_fixture {
  compcntr_device* dev = compcntr_open_device("soft");
  device_fixture() { REQUIRE(dev != nullptr); }
  ~device_fixture() { CHECK(compcntr_close_device(dev) == 0); }
};

uint64_t get(int (*f)(compcntr_credits*, uint32_t, uint64_t*), compcntr_credits* cr, uint32_t p) {
  uint64_t v = 12345;
  REQUIRE(f(cr, p, &v) == 0);
  return v;
}

} // namespace

TEST_CASE("C wait_since: EIO against the caller's error baseline, the first check included") {
  device_fixture f;
  compcntr_comp_cntr* cc = make_cc(f.dev);
  compcntr_inc_err_comp_cntr(cc, 1);   // an error before the call...
  // ...counts when the caller's baseline predates it (plain wait would not see it).
  CHECK(compcntr_wait_comp_cntr_since(cc, 1, 0, 0, nullptr) == EIO);
  CHECK(compcntr_wait_comp_cntr_since(cc, 1, 0, -1, nullptr) == EIO);
  CHECK(compcntr_wait_comp_cntr(cc, 1, 0) == ETIMEDOUT);
  // With the current baseline: a timeout, never early.
  CHECK(compcntr_wait_comp_cntr_since(cc, 1, 1, 0, nullptr) == ETIMEDOUT);
  CHECK(compcntr_wait_comp_cntr_since(cc, 1, 1, 15, nullptr) == ETIMEDOUT);
  // Reaching the threshold wins over a differing error count.
  compcntr_inc_comp_cntr(cc, 1);
  CHECK(compcntr_wait_comp_cntr_since(cc, 1, 0, 0, nullptr) == 0);
  CHECK(compcntr_wait_comp_cntr_since(cc, 1, 7, -1, nullptr) == 0);

  // Woken from another thread: by a completion (0) and by an error (EIO).
  for (int by_error = 0; by_error < 2; ++by_error) {
    uint64_t v = 0, e = 0;
    compcntr_read_comp_cntr(cc, &v);
    compcntr_read_err_comp_cntr(cc, &e);
    std::atomic<pid_t> tid{0};
    std::atomic<int> rc{-1};
    std::thread w([&] {
      tid = this_tid();
      compcntr_wait_attr a{};
      a.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
      a.spin_ns = 0;
      rc = compcntr_wait_comp_cntr_since(cc, v + 1, e, -1, &a);
    });
    REQUIRE(eventually_blocked(tid));
    if (by_error)
      compcntr_inc_err_comp_cntr(cc, 1);
    else
      compcntr_inc_comp_cntr(cc, 1);
    w.join();
    CHECK(rc.load() == (by_error ? EIO : 0));
  }

  // A drive function runs (timeout 0: once after the failed first check) and may complete it.
  struct st {
    compcntr_comp_cntr* cc;
    int calls;
  } s{cc, 0};
  compcntr_wait_attr a{};
  a.progress = [](void* p) {
    auto* x = static_cast<st*>(p);
    if (++x->calls == 2) compcntr_inc_comp_cntr(x->cc, 1);
  };
  a.progress_ctx = &s;
  uint64_t v = 0, e = 0;
  compcntr_read_comp_cntr(cc, &v);
  compcntr_read_err_comp_cntr(cc, &e);
  CHECK(compcntr_wait_comp_cntr_since(cc, v + 1, e, 0, &a) == ETIMEDOUT);
  CHECK(s.calls == 1);
  CHECK(compcntr_wait_comp_cntr_since(cc, v + 1, e, -1, &a) == 0);
  CHECK(s.calls == 2);

  // Bad input.
  CHECK(compcntr_wait_comp_cntr_since(nullptr, 1, 0, 0, nullptr) == EINVAL);
  CHECK(has("wait_comp_cntr_since: cc is NULL"));
  compcntr_wait_attr bad{};
  bad.comp_mask = COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;
  bad.progress_interval_us = 0;
  CHECK(compcntr_wait_comp_cntr_since(cc, UINT64_MAX, e, 0, &bad) == EINVAL);
  CHECK(has("wait_comp_cntr_since: progress_interval_us must be > 0"));
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

TEST_CASE("C credits: per-peer windows admit exactly each peer's window") {
  device_fixture f;
  const uint64_t windows[3] = {1, 4, 2};
  compcntr_credits* cr = compcntr_credits_create_per_peer(f.dev, 3, windows);
  REQUIRE(cr != nullptr);
  for (uint32_t p = 0; p < 3; ++p) {
    CHECK(get(compcntr_credits_window, cr, p) == windows[p]);
    for (uint64_t k = 0; k < windows[p]; ++k) CHECK(compcntr_credits_acquire(cr, p, 1, 0) == 0);
    CHECK(compcntr_credits_acquire(cr, p, 1, 0) == ETIMEDOUT);
    CHECK(get(compcntr_credits_issued, cr, p) == windows[p]);
    CHECK(get(compcntr_credits_completed, cr, p) == 0);
  }
  // n above the peer's own window is EINVAL, naming the window; within another peer's it is not.
  CHECK(compcntr_credits_acquire(cr, 0, 2, 0) == EINVAL);
  CHECK(has("peer 0's window"));
  CHECK(compcntr_credits_release(cr, 0, 2) == EINVAL);
  CHECK(compcntr_credits_release(cr, 1, 3) == 0);        // 4 outstanding on peer 1: fine
  CHECK(get(compcntr_credits_completed, cr, 1) == 3);
  CHECK(compcntr_credits_acquire(cr, 1, 3, 0) == 0);
  // A completion frees exactly one credit of that peer only.
  compcntr_inc_comp_cntr(compcntr_credits_counter(cr, 2), 1);
  CHECK(compcntr_credits_acquire(cr, 0, 1, 0) == ETIMEDOUT);
  CHECK(compcntr_credits_acquire(cr, 2, 1, 0) == 0);
  CHECK(compcntr_credits_acquire(cr, 2, 1, 0) == ETIMEDOUT);
  uint64_t o = 0;
  CHECK(compcntr_credits_outstanding(cr, 2, &o) == 0);
  CHECK(o == 2);
  CHECK(compcntr_credits_destroy(cr) == 0);
}

TEST_CASE("C credits: create_per_peer and adopt validate, NULL + errno, nothing left behind") {
  device_fixture f;
  const uint64_t ok[2] = {2, 3};
  const uint64_t zero[2] = {2, 0};
  const uint64_t huge[2] = {(UINT64_MAX >> 2) + 2, 1};  /* above 2^62 */
  errno = 0;
  CHECK(compcntr_credits_create_per_peer(nullptr, 2, ok) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_credits_create_per_peer(f.dev, 2, nullptr) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("windows is NULL"));
  errno = 0;
  CHECK(compcntr_credits_create_per_peer(f.dev, 0, ok) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_credits_create_per_peer(f.dev, 2, zero) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("the window of peer 1 is 0"));
  errno = 0;
  CHECK(compcntr_credits_create_per_peer(f.dev, 2, huge) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("the window of peer 0"));

  compcntr_comp_cntr* a = make_cc(f.dev);
  compcntr_comp_cntr* b = make_cc(f.dev);
  compcntr_comp_cntr* bytes = make_cc(f.dev, COMPCNTR_COMP_CNTR_TYPE_BYTES);
  compcntr_device* other = compcntr_open_device("soft");
  REQUIRE(other != nullptr);
  compcntr_comp_cntr* foreign = make_cc(other);
  compcntr_comp_cntr* good[2] = {a, b};
  compcntr_comp_cntr* with_null[2] = {a, nullptr};
  compcntr_comp_cntr* with_bytes[2] = {a, bytes};
  compcntr_comp_cntr* with_foreign[2] = {a, foreign};
  errno = 0;
  CHECK(compcntr_credits_adopt(nullptr, good, 2, ok) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_credits_adopt(f.dev, nullptr, 2, ok) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("ccs is NULL"));
  errno = 0;
  CHECK(compcntr_credits_adopt(f.dev, good, 2, nullptr) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_credits_adopt(f.dev, with_null, 2, ok) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("ccs[1] is NULL"));
  errno = 0;
  CHECK(compcntr_credits_adopt(f.dev, with_bytes, 2, ok) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("counts bytes"));
  errno = 0;
  CHECK(compcntr_credits_adopt(f.dev, with_foreign, 2, ok) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("ccs[1] belongs to another device"));
  errno = 0;
  CHECK(compcntr_credits_adopt(f.dev, good, 2, zero) == nullptr);
  CHECK(errno == EINVAL);
  // The refused calls hold nothing: every counter can be destroyed, the devices closed.
  CHECK(compcntr_destroy_comp_cntr(a) == 0);
  CHECK(compcntr_destroy_comp_cntr(b) == 0);
  CHECK(compcntr_destroy_comp_cntr(bytes) == 0);
  CHECK(compcntr_destroy_comp_cntr(foreign) == 0);
  CHECK(compcntr_close_device(other) == 0);

  // Accessors reject bad input.
  compcntr_credits* cr = compcntr_credits_create(f.dev, 1, 1);
  REQUIRE(cr != nullptr);
  uint64_t v = 0;
  CHECK(compcntr_credits_issued(nullptr, 0, &v) == EINVAL);
  CHECK(compcntr_credits_completed(cr, 0, nullptr) == EINVAL);
  CHECK(compcntr_credits_window(cr, 1, &v) == EINVAL);
  CHECK(has("credits_window: peer 1 out of range (1 peers)"));
  CHECK(compcntr_credits_window(cr, 0, &v) == 0);
  CHECK(v == 1);
  CHECK(compcntr_credits_destroy(cr) == 0);
}

TEST_CASE("C credits: adopt tracks the caller's counters, holds them, and leaves them") {
  device_fixture f;
  compcntr_comp_cntr* a = make_cc(f.dev);
  compcntr_comp_cntr* b = make_cc(f.dev);
  compcntr_inc_comp_cntr(a, 10);   // counted before: not outstanding
  compcntr_inc_err_comp_cntr(a, 2);
  compcntr_comp_cntr* ccs[2] = {a, b};
  const uint64_t windows[2] = {2, 1};
  compcntr_credits* cr = compcntr_credits_adopt(f.dev, ccs, 2, windows);
  REQUIRE(cr != nullptr);
  CHECK(compcntr_credits_counter(cr, 0) == a);
  CHECK(compcntr_credits_counter(cr, 1) == b);
  CHECK(get(compcntr_credits_issued, cr, 0) == 12);
  CHECK(get(compcntr_credits_completed, cr, 0) == 12);
  CHECK(compcntr_credits_acquire(cr, 0, 2, 0) == 0);
  CHECK(compcntr_credits_acquire(cr, 0, 1, 0) == ETIMEDOUT);
  CHECK(get(compcntr_credits_issued, cr, 0) == 14);
  // Held: the caller cannot destroy them while the tracker lives.
  CHECK(compcntr_destroy_comp_cntr(a) == EBUSY);
  CHECK(compcntr_close_device(f.dev) == EBUSY);

  // A blocked acquire on peer 0 is woken by a completion counted in the caller's counter.
  std::atomic<pid_t> tid{0};
  std::atomic<int> rc{-1};
  std::thread w([&] {
    tid = this_tid();
    rc = compcntr_credits_acquire(cr, 0, 1, -1);
  });
  REQUIRE(eventually_blocked(tid));
  compcntr_inc_err_comp_cntr(a, 1);  // a failed operation returns its credit too
  w.join();
  CHECK(rc.load() == 0);
  CHECK(get(compcntr_credits_completed, cr, 0) == 13);

  CHECK(compcntr_credits_acquire(cr, 1, 1, 0) == 0);
  CHECK(compcntr_credits_acquire(cr, 1, 1, 0) == ETIMEDOUT);
  CHECK(compcntr_credits_flush(cr, 1, 0) == ETIMEDOUT);
  compcntr_inc_comp_cntr(b, 1);
  CHECK(compcntr_credits_flush(cr, 1, 0) == 0);

  CHECK(compcntr_credits_destroy(cr) == 0);
  // The counters are the caller's again: readable, then destroyable.
  uint64_t v = 0;
  CHECK(compcntr_read_comp_cntr(a, &v) == 0);
  CHECK(v == 10);
  CHECK(compcntr_destroy_comp_cntr(a) == 0);
  CHECK(compcntr_destroy_comp_cntr(b) == 0);
}

// ---- the pollable fd armed for a threshold -------------------------------------------------

namespace {

template <class F>
bool test_wait(F cond) {   // a condition with a failure deadline, never a sleep
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!cond())
    if (std::chrono::steady_clock::now() > end) return false;
  return true;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

} // namespace

TEST_CASE("C fd threshold: readable once the value reaches N, not on the updates before") {
  device_fixture f;
  compcntr_comp_cntr* cc = make_cc(f.dev);
  CHECK(compcntr_comp_cntr_arm_fd_threshold(nullptr, 1) == EINVAL);
  CHECK(compcntr_comp_cntr_arm_fd_threshold(cc, 1) == EINVAL);   // no fd yet
  CHECK(has("arm_fd_threshold: counter"));
  int fd = -1;
  REQUIRE(compcntr_comp_cntr_get_fd(cc, &fd) == 0);

  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, 5) == 0);
  CHECK_FALSE(readable(fd));
  for (int i = 1; i <= 4; ++i) {
    compcntr_inc_comp_cntr(cc, 1);
    CHECK_FALSE(readable(fd));                                     // below 5: still armed
  }
  compcntr_inc_comp_cntr(cc, 1);                                   // 5: readable
  CHECK(readable(fd));
  compcntr_inc_comp_cntr(cc, 1);                                   // disarmed: nothing more
  CHECK(readable(fd));

  // Re-arming drains; a jump over the threshold counts; set() too.
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, 100) == 0);
  CHECK_FALSE(readable(fd));
  compcntr_inc_comp_cntr(cc, 50);
  CHECK_FALSE(readable(fd));
  compcntr_inc_comp_cntr(cc, 60);
  CHECK(readable(fd));
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, 200) == 0);
  compcntr_set_comp_cntr(cc, 150);
  CHECK_FALSE(readable(fd));
  compcntr_set_comp_cntr(cc, 250);
  CHECK(readable(fd));

  // Already reached at the arm: readable at once (arm, then epoll, never misses).
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, 7) == 0);
  CHECK(readable(fd));

  // An error is news at any value: readable.
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, 1000) == 0);
  CHECK_FALSE(readable(fd));
  compcntr_inc_err_comp_cntr(cc, 1);
  CHECK(readable(fd));

  // A plain arm replaces a threshold arm: the next update signals.
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, 1000) == 0);
  REQUIRE(compcntr_comp_cntr_arm_fd(cc) == 0);
  CHECK_FALSE(readable(fd));
  compcntr_inc_comp_cntr(cc, 1);
  CHECK(readable(fd));
  // ...and a threshold arm replaces a plain one.
  REQUIRE(compcntr_comp_cntr_arm_fd(cc) == 0);
  uint64_t v = 0;
  compcntr_read_comp_cntr(cc, &v);
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, v + 2) == 0);
  compcntr_inc_comp_cntr(cc, 1);
  CHECK_FALSE(readable(fd));
  compcntr_inc_comp_cntr(cc, 1);
  CHECK(readable(fd));
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

TEST_CASE("C fd threshold: an epoll loop wakes once per batch, never misses one") {
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  constexpr uint64_t batches = 50;
#else
  constexpr uint64_t batches = 200;
#endif
#else
  constexpr uint64_t batches = 200;
#endif
  constexpr uint64_t batch = 64;
  device_fixture f;
  compcntr_comp_cntr* cc = make_cc(f.dev);
  int fd = -1;
  REQUIRE(compcntr_comp_cntr_get_fd(cc, &fd) == 0);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
  std::atomic<int> lost{0};
  std::atomic<pid_t> tid{0};
  std::atomic<uint64_t> armed_for{0};   // the goal the consumer armed and is about to block on
  uint64_t wakeups = 0, no_wait = 0, spurious = 0;
  // The producer adds each batch one increment at a time, but only once the consumer is armed
  // for it and asleep in epoll_wait: every batch is ended by a real wake-up of a blocked thread.
  std::thread producer([&] {
    for (uint64_t b = 1; b <= batches && lost.load() == 0; ++b) {
      if (!test_wait([&] { return armed_for.load() == b * batch; }) || !eventually_blocked(tid)) {
        ++lost;
        break;
      }
      for (uint64_t i = 0; i < batch; ++i) compcntr_inc_comp_cntr(cc, 1);
    }
  });
  tid = this_tid();
  for (uint64_t goal = batch; goal <= batches * batch && lost.load() == 0; goal += batch) {
    // The fi_trywait pattern: arm, check, and only then block. Readiness may be spurious (a
    // signal racing with the re-arm's drain): look at the counter, read the fd, wait again.
    for (;;) {
      REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, goal) == 0);
      uint64_t v = 0;
      compcntr_read_comp_cntr(cc, &v);
      if (v >= goal) {
        ++no_wait;
        break;
      }
      armed_for = goal;
      epoll_event out{};
      if (::epoll_wait(ep, &out, 1, 10000) != 1) {   // a generous guard, not a sleep
        ++lost;                                        // the threshold's wake-up never came
        break;
      }
      uint64_t drained;
      [[maybe_unused]] const ssize_t r = ::read(fd, &drained, sizeof drained);
      compcntr_read_comp_cntr(cc, &v);
      if (v >= goal) {
        ++wakeups;
        break;
      }
      ++spurious;
    }
  }
  producer.join();
  ::close(ep);
  CHECK(lost.load() == 0);
  CHECK(wakeups == batches);   // one wake-up per batch of 64 increments, never one per update
  CHECK(no_wait == 0);
  CHECK(spurious <= batches);
  uint64_t v = 0;
  compcntr_read_comp_cntr(cc, &v);
  CHECK(v == batches * batch);
  MESSAGE("batches: " << wakeups << " woken, " << spurious << " spurious wake-ups");
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

// Review of issue 11: the same counter for two peers would let one peer's completions return
// the other's credits (over-subscription of the receiver's buffers). EINVAL, named, nothing held.
TEST_CASE("C credits: adopt refuses the same counter for two peers") {
  device_fixture f;
  compcntr_comp_cntr* a = make_cc(f.dev);
  compcntr_comp_cntr* b = make_cc(f.dev);
  const uint64_t windows[3] = {1, 1, 1};
  compcntr_comp_cntr* twice[3] = {a, b, a};
  errno = 0;
  CHECK(compcntr_credits_adopt(f.dev, twice, 3, windows) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(has("counters 0 and 2 are the same counter"));
  CHECK(compcntr_destroy_comp_cntr(a) == 0);   // the refused adopt holds nothing
  CHECK(compcntr_destroy_comp_cntr(b) == 0);
}

// Review of issue 11: the batch test above never lets an update race with the arm (the producer
// waits until the consumer sleeps). Here two producers increment without pause while the
// consumer re-arms for goals just ahead of the value, so arms race with updates on both sides
// of the arming RMW, and the consumer alternates between draining the fd itself and leaving it
// to the next arm. Readiness may be spurious, never missed: an epoll_wait that times out is a
// lost wake-up. Every third arm is followed by epoll_wait without a check of the counter: the
// arm's own re-check must make the fd readable when the goal was already reached.
TEST_CASE("C fd threshold: stress: re-arms racing with concurrent updaters never miss") {
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  constexpr uint64_t per = 20000;
#else
  constexpr uint64_t per = 200000;
#endif
#else
  constexpr uint64_t per = 200000;
#endif
  constexpr int producers = 2;
  constexpr uint64_t total = per * producers;
  device_fixture f;
  compcntr_comp_cntr* cc = make_cc(f.dev);
  int fd = -1;
  REQUIRE(compcntr_comp_cntr_get_fd(cc, &fd) == 0);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
  std::atomic<bool> go{false};
  std::vector<std::thread> ps;
  for (int t = 0; t < producers; ++t)
    ps.emplace_back([&] {
      while (!go.load()) {
      }
      for (uint64_t i = 1; i <= per; ++i) {
        compcntr_inc_comp_cntr(cc, 1);
        if (i % 512 == 0) std::this_thread::yield();   // let the consumer in mid-stream
      }
    });
  uint64_t v = 0, arms = 0, blocked = 0, at_once = 0, spurious = 0, lost = 0;
  go = true;
  for (uint64_t k = 0; v < total; ++k) {
    const uint64_t goal = std::min<uint64_t>(total, v + 1 + (k * 37) % 97);
    REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, goal) == 0);
    ++arms;
    // Every third arm goes straight to epoll_wait (the arm itself must make the fd readable if
    // the goal was reached before it); the others check the counter first (fi_trywait style).
    if (k % 3 != 0) {
      compcntr_read_comp_cntr(cc, &v);
      if (v >= goal) {
        ++at_once;
        continue;
      }
    }
    epoll_event out{};
    if (::epoll_wait(ep, &out, 1, 10000) != 1) {   // a guard, not a sleep: never missed
      ++lost;
      break;
    }
    ++blocked;
    if (k % 2 == 0) {   // half the time the consumer drains, half the time the next arm does
      uint64_t drained;
      [[maybe_unused]] const ssize_t r = ::read(fd, &drained, sizeof drained);
    }
    compcntr_read_comp_cntr(cc, &v);
    if (v < goal) ++spurious;
  }
  for (auto& t : ps) t.join();
  ::close(ep);
  CHECK(lost == 0);
  compcntr_read_comp_cntr(cc, &v);
  CHECK(v == total);
  MESSAGE("threshold arms: " << arms << ", woken " << blocked << " (" << spurious
                             << " spurious), reached at the arm " << at_once);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

// An error is news for a threshold arm at any value: error producers racing with re-arms whose
// threshold is never reached wake the consumer every time (an error after the arm's sample).
TEST_CASE("C fd threshold: stress: errors racing with re-arms wake an unreachable threshold") {
  constexpr int rounds = 2000;
  device_fixture f;
  compcntr_comp_cntr* cc = make_cc(f.dev);
  int fd = -1;
  REQUIRE(compcntr_comp_cntr_get_fd(cc, &fd) == 0);
  std::atomic<int> armed{0};
  std::atomic<bool> stop{false};
  // The producer adds one error per round, as soon as the consumer armed for that round (the
  // error may land before, during or after the consumer's poll: any of them must be seen).
  std::thread producer([&] {
    for (int r = 1; r <= rounds && !stop.load(); ++r) {
      while (armed.load() < r && !stop.load()) {
      }
      compcntr_inc_err_comp_cntr(cc, 1);
      compcntr_inc_comp_cntr(cc, 1);   // a completion too: below the threshold, no wake alone
    }
  });
  int lost = 0;
  for (int r = 1; r <= rounds; ++r) {
    REQUIRE(compcntr_comp_cntr_arm_fd_threshold(cc, UINT64_MAX) == 0);
    armed = r;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) {
      ++lost;
      break;
    }
    uint64_t e = 0;
    // Readable for this round's error (or spuriously: then the error is already there or the
    // next poll sees it, because the arm sampled the error count before the producer's add).
    while (compcntr_read_err_comp_cntr(cc, &e) == 0 && e < static_cast<uint64_t>(r)) {
      uint64_t drained;
      [[maybe_unused]] const ssize_t n = ::read(fd, &drained, sizeof drained);
      if (::poll(&p, 1, 10000) != 1) {
        ++lost;
        break;
      }
    }
    if (lost) break;
  }
  stop = true;
  producer.join();
  CHECK(lost == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}
