// The C API of the polling helpers (compcntr/wait.h through compcntr/compcntr.h): errno rules,
// options, `which`, and the fd calls.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>

#include <poll.h>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>
#include <thread>

#include "wait_util.hpp"

namespace {

struct fixture {
  compcntr_device* dev = compcntr_open_device("soft");
  compcntr_comp_cntr* cc[3] = {};
  fixture() {
    REQUIRE(dev != nullptr);
    compcntr_comp_cntr_init_attr a{};
    for (auto& c : cc) {
      c = compcntr_create_comp_cntr(dev, &a);
      REQUIRE(c != nullptr);
    }
  }
  ~fixture() {
    for (auto* c : cc) CHECK(compcntr_destroy_comp_cntr(c) == 0);
    CHECK(compcntr_close_device(dev) == 0);
  }
};

std::string last_message() { return compcntr_last_error_message(); }

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

} // namespace

TEST_CASE("C wait: results and EINVAL") {
  fixture f;
  CHECK(compcntr_wait_comp_cntr(nullptr, 1, 0) == EINVAL);
  CHECK(last_message().find("cc is NULL") != std::string::npos);
  CHECK(compcntr_wait_comp_cntr(f.cc[0], 1, 0) == ETIMEDOUT);
  CHECK(compcntr_wait_comp_cntr(f.cc[0], 1, 30) == ETIMEDOUT);
  REQUIRE(compcntr_inc_comp_cntr(f.cc[0], 2) == 0);
  CHECK(compcntr_wait_comp_cntr(f.cc[0], 2, 0) == 0);
  CHECK(compcntr_wait_comp_cntr(f.cc[0], 2, -1) == 0);

  // EIO: an error during a forever wait, from another thread. Errors before the waiter takes
  // its sample do not count (by design), so keep adding until the waiter reports.
  std::atomic<int> rc{-1};
  std::thread t([&] { rc = compcntr_wait_comp_cntr(f.cc[1], 10, -1); });
  REQUIRE(test_util::eventually([&] {
    compcntr_inc_err_comp_cntr(f.cc[1], 1);
    return rc.load() != -1;
  }));
  t.join();
  CHECK(rc.load() == EIO);
}

TEST_CASE("C wait_ex: options and their validation") {
  fixture f;
  compcntr_wait_attr a{};
  CHECK(compcntr_wait_comp_cntr_ex(f.cc[0], 1, 0, &a) == ETIMEDOUT);  // zeroed: defaults
  CHECK(compcntr_wait_comp_cntr_ex(f.cc[0], 1, 0, nullptr) == ETIMEDOUT);
  a.comp_mask = 1u << 7;
  CHECK(compcntr_wait_comp_cntr_ex(f.cc[0], 1, 0, &a) == EINVAL);
  CHECK(last_message().find("comp_mask") != std::string::npos);
  a.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
  a.spin_ns = -5;
  CHECK(compcntr_wait_comp_cntr_ex(f.cc[0], 1, 0, &a) == EINVAL);
  a.comp_mask = COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;
  a.progress_interval_us = 0;
  CHECK(compcntr_wait_comp_cntr_ex(f.cc[0], 1, 0, &a) == EINVAL);

  // Forced sleep + a drive function that completes the counter on its 10th call.
  struct ctx_t {
    compcntr_comp_cntr* cc;
    int calls;
  } x{f.cc[0], 0};
  a.comp_mask = COMPCNTR_WAIT_ATTR_SPIN | COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;
  a.spin_ns = 0;
  a.progress_interval_us = 500;
  a.progress = [](void* p) {
    auto* x = static_cast<ctx_t*>(p);
    if (++x->calls == 10) compcntr_inc_comp_cntr(x->cc, 1);
  };
  a.progress_ctx = &x;
  CHECK(compcntr_wait_comp_cntr_ex(f.cc[0], 1, 30000, &a) == 0);
  CHECK(x.calls == 10);

  a.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
  a.spin_ns = COMPCNTR_WAIT_SPIN_FOREVER;
  a.progress = nullptr;
  CHECK(compcntr_wait_comp_cntr_ex(f.cc[0], 2, 20, &a) == ETIMEDOUT);
}

TEST_CASE("C poll: which, EIO, ETIMEDOUT and EINVAL") {
  fixture f;
  uint64_t th[3] = {1, 1, 1};
  size_t which = 42;
  CHECK(compcntr_poll_comp_cntrs(f.cc, th, 3, 0, &which) == ETIMEDOUT);
  CHECK(which == 42);  // unchanged
  compcntr_inc_comp_cntr(f.cc[2], 1);
  CHECK(compcntr_poll_comp_cntrs(f.cc, th, 3, -1, &which) == 0);
  CHECK(which == 2);
  th[2] = 5;

  std::atomic<int> rc{-1};
  std::thread t([&] { rc = compcntr_poll_comp_cntrs(f.cc, th, 3, 30000, &which); });
  REQUIRE(test_util::eventually([&] {
    compcntr_inc_err_comp_cntr(f.cc[1], 1);  // repeated until the poller has its sample
    return rc.load() != -1;
  }));
  t.join();
  CHECK(rc.load() == EIO);
  CHECK(which == 1);

  CHECK(compcntr_poll_comp_cntrs(nullptr, th, 3, 0, &which) == EINVAL);
  CHECK(compcntr_poll_comp_cntrs(f.cc, nullptr, 3, 0, &which) == EINVAL);
  CHECK(compcntr_poll_comp_cntrs(f.cc, th, 3, 0, nullptr) == EINVAL);
  CHECK(compcntr_poll_comp_cntrs(f.cc, th, 0, 0, &which) == EINVAL);
  CHECK(last_message().find("n == 0") != std::string::npos);
  compcntr_comp_cntr* holes[2] = {f.cc[0], nullptr};
  CHECK(compcntr_poll_comp_cntrs(holes, th, 2, 0, &which) == EINVAL);
  compcntr_wait_attr a{};
  a.comp_mask = 1u << 9;
  CHECK(compcntr_poll_comp_cntrs_ex(f.cc, th, 3, 0, &which, &a) == EINVAL);
  a.comp_mask = 0;
  th[0] = 0;
  CHECK(compcntr_poll_comp_cntrs_ex(f.cc, th, 3, 0, &which, &a) == 0);
  CHECK(which == 0);
}

TEST_CASE("C fd: get, arm, readiness, EINVAL") {
  fixture f;
  int fd = -7;
  CHECK(compcntr_comp_cntr_get_fd(nullptr, &fd) == EINVAL);
  CHECK(compcntr_comp_cntr_get_fd(f.cc[0], nullptr) == EINVAL);
  CHECK(compcntr_comp_cntr_arm_fd(nullptr) == EINVAL);
  CHECK(compcntr_comp_cntr_arm_fd(f.cc[0]) == EINVAL);  // no fd yet
  CHECK(last_message().find("get_fd") != std::string::npos);
  REQUIRE(compcntr_comp_cntr_get_fd(f.cc[0], &fd) == 0);
  REQUIRE(fd >= 0);
  int again = -1;
  CHECK(compcntr_comp_cntr_get_fd(f.cc[0], &again) == 0);
  CHECK(again == fd);
  CHECK_FALSE(readable(fd));
  CHECK(compcntr_comp_cntr_arm_fd(f.cc[0]) == 0);
  CHECK_FALSE(readable(fd));
  compcntr_inc_comp_cntr(f.cc[0], 1);
  CHECK(readable(fd));
  CHECK(compcntr_comp_cntr_arm_fd(f.cc[0]) == 0);
  CHECK_FALSE(readable(fd));
  compcntr_set_err_comp_cntr(f.cc[0], 9);
  CHECK(readable(fd));
}
