// The C API's inline fast paths (<compcntr/compcntr.h>), driven from a C translation unit
// (c_fast_path.c): same results and errors as the exported functions, updates made inline wake
// sleeping waiters and armed fds, striped and attached counters, the C counter living in its
// slot, and (AddressSanitizer builds) a use after destroy being reported.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

import compcntr;

#include "blocked.hpp"
#include "c_fast_path.h"

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool asan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool asan = true;
#else
constexpr bool asan = false;
#endif
#else
constexpr bool asan = false;
#endif

struct soft_device {
  compcntr_device* dev = compcntr_open_device("soft");
  soft_device() { REQUIRE(dev); }
  ~soft_device() { CHECK(compcntr_close_device(dev) == 0); }
};

compcntr_comp_cntr* create(compcntr_device* dev, std::uint32_t stripes = 0) {
  compcntr_comp_cntr_init_attr a{};
  if (stripes) {
    a.comp_mask = COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES;
    a.stripes = stripes;
  }
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &a);
  REQUIRE(cc);
  return cc;
}

std::uint64_t read(compcntr_comp_cntr* cc) {
  std::uint64_t v = 0xdeadbeef;
  REQUIRE(cfp_read(cc, &v) == 0);
  return v;
}
std::uint64_t read_err(compcntr_comp_cntr* cc) {
  std::uint64_t v = 0xdeadbeef;
  REQUIRE(cfp_read_err(cc, &v) == 0);
  return v;
}

} // namespace

TEST_CASE("C fast paths: compiled in for C, and the exported functions are still there") {
  CHECK(cfp_inline_enabled() == 1);
  for (const char* name :
       {"compcntr_read_comp_cntr", "compcntr_read_err_comp_cntr", "compcntr_inc_comp_cntr",
        "compcntr_inc_err_comp_cntr", "compcntr_set_comp_cntr", "compcntr_set_err_comp_cntr",
        "compcntr_wait_comp_cntr", "compcntr_priv_notify_slow"})
    CHECK_MESSAGE(dlsym(RTLD_DEFAULT, name) != nullptr, name);
}

TEST_CASE("C fast paths: values, wrap and errors agree with the exported calls") {
  soft_device d;
  compcntr_comp_cntr* cc = create(d.dev);
  CHECK(read(cc) == 0);
  CHECK(cfp_inc(cc, 5) == 0);
  CHECK(cfp_exported_inc(cc, 2) == 0);
  std::uint64_t v = 0;
  CHECK(cfp_exported_read(cc, &v) == 0);
  CHECK(v == 7);
  CHECK(read(cc) == 7);
  CHECK(cfp_inc_err(cc, 3) == 0);
  CHECK(read_err(cc) == 3);
  CHECK(cfp_set(cc, UINT64_MAX) == 0);
  CHECK(cfp_inc(cc, 2) == 0);
  CHECK(read(cc) == 1);  // wrapped
  CHECK(cfp_set_err(cc, 40) == 0);
  CHECK(read_err(cc) == 40);
  CHECK(cfp_wait(cc, 1, 0) == 0);            // reached: inline
  CHECK(cfp_wait(cc, 2, 0) == ETIMEDOUT);    // not reached: the exported call, timeout 0
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

TEST_CASE("C fast paths: NULL arguments are EINVAL with a message, and change nothing") {
  soft_device d;
  compcntr_comp_cntr* cc = create(d.dev);
  REQUIRE(cfp_inc(cc, 9) == 0);
  std::uint64_t v = 123;
  CHECK(cfp_read(nullptr, &v) == EINVAL);
  CHECK(std::string(compcntr_last_error_message()).find("cc is NULL") != std::string::npos);
  CHECK(v == 123);
  CHECK(cfp_read(cc, nullptr) == EINVAL);
  CHECK(std::string(compcntr_last_error_message()).find("value is NULL") != std::string::npos);
  CHECK(cfp_read_err(nullptr, &v) == EINVAL);
  CHECK(cfp_inc(nullptr, 1) == EINVAL);
  CHECK(cfp_inc_err(nullptr, 1) == EINVAL);
  CHECK(cfp_set(nullptr, 1) == EINVAL);
  CHECK(cfp_set_err(nullptr, 1) == EINVAL);
  CHECK(cfp_wait(nullptr, 0, 0) == EINVAL);
  CHECK(v == 123);
  CHECK(read(cc) == 9);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

TEST_CASE("C fast paths: an inline update wakes a sleeping waiter and makes an armed fd readable") {
  soft_device d;
  compcntr_comp_cntr* cc = create(d.dev);
  // Waiter asleep in the kernel (spin 0) before the inline increment. A lost wake-up would
  // surface only at the wait's 20 s timeout (whose final re-check then sees the value): the
  // wait must end long before that.
  using clk = std::chrono::steady_clock;
  for (int round = 1; round <= 3; ++round) {
    std::atomic<pid_t> tid{0};
    int got = -1;
    const auto t0 = clk::now();
    std::thread w([&] {
      tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
      compcntr_wait_attr attr{};
      attr.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
      attr.spin_ns = 0;
      got = compcntr_wait_comp_cntr_ex(cc, static_cast<std::uint64_t>(round), 20000, &attr);
    });
    REQUIRE(eventually_blocked(tid));
    if (round == 2) {
      CHECK(cfp_set(cc, 2) == 0);  // set wakes too
    } else {
      CHECK(cfp_inc(cc, 1) == 0);
    }
    w.join();
    CHECK(got == 0);
    CHECK(clk::now() - t0 < std::chrono::seconds(10));
  }
  // Errors: an inline inc_err ends a sleeping wait with EIO.
  {
    std::atomic<pid_t> tid{0};
    int got = -1;
    std::thread w([&] {
      tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
      compcntr_wait_attr attr{};
      attr.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
      attr.spin_ns = 0;
      got = compcntr_wait_comp_cntr_ex(cc, UINT64_MAX, 20000, &attr);
    });
    REQUIRE(eventually_blocked(tid));
    CHECK(cfp_inc_err(cc, 1) == 0);
    w.join();
    CHECK(got == EIO);
  }
  int fd = -1;
  REQUIRE(compcntr_comp_cntr_get_fd(cc, &fd) == 0);
  REQUIRE(compcntr_comp_cntr_arm_fd(cc) == 0);
  pollfd p{fd, POLLIN, 0};
  CHECK(::poll(&p, 1, 0) == 0);
  CHECK(cfp_inc(cc, 1) == 0);
  CHECK(::poll(&p, 1, 20000) == 1);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

TEST_CASE("C fast paths: striped C counters (the exported path) sum their stripes") {
  soft_device d;
  compcntr_comp_cntr* cc = create(d.dev, COMPCNTR_COMP_CNTR_STRIPES_PER_CPU);
  compcntr_comp_cntr* four = create(d.dev, 4);
  std::vector<std::thread> ts;
  std::atomic<int> failed{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      int bad = 0;
      for (int i = 0; i < 10'000; ++i) bad += (cfp_inc(cc, 1) != 0) + (cfp_inc(four, 2) != 0);
      bad += cfp_inc_err(four, 1) != 0;
      failed += bad;
    });
  for (auto& t : ts) t.join();
  CHECK(failed.load() == 0);
  CHECK(read(cc) == 40'000);
  CHECK(read(four) == 80'000);
  CHECK(read_err(four) == 4);
  CHECK(cfp_wait(four, 80'000, 0) == 0);
  CHECK(cfp_wait(four, 80'001, 0) == ETIMEDOUT);
  CHECK(cfp_wait(four, 1, 0) == 0);  // the slot's own word is 0: the inline test must not decide
  CHECK(cfp_wait(four, 0, 0) == 0);
  CHECK(cfp_set(four, 5) == 0);
  CHECK(read(four) == 5);
  compcntr_comp_cntr_init_attr bad{};
  bad.comp_mask = COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES;
  bad.stripes = 1000;
  errno = 0;
  CHECK(compcntr_create_comp_cntr(d.dev, &bad) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_destroy_comp_cntr(four) == 0);
}

TEST_CASE("C fast paths: EBUSY on an attached counter leaves it usable inline") {
  soft_device d;
  compcntr_comp_cntr* cc = create(d.dev);
  compcntr_qp* qp = compcntr_create_qp(d.dev);
  REQUIRE(qp);
  compcntr_qp_attach_comp_cntr_attr at{0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND};
  REQUIRE(compcntr_qp_attach_comp_cntr(qp, cc, &at) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == EBUSY);
  CHECK(cfp_inc(cc, 4) == 0);
  CHECK(read(cc) == 4);
  CHECK(compcntr_destroy_qp(qp) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

TEST_CASE("C fast paths: the C counter lives in its slot (<= 128 B per counter), reused cleanly") {
  soft_device d;
  std::vector<compcntr_comp_cntr*> v;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 500; ++i) v.push_back(create(d.dev));
    for (compcntr_comp_cntr* cc : v) {
      CHECK(cc->context == d.dev);
      CHECK(read(cc) == 0);  // a recycled slot starts at 0
      CHECK(read_err(cc) == 0);
      if (!asan) CHECK(cfp_offset_in_slot(cc) == offsetof(compcntr::plugin::slot, c_api));
      REQUIRE(cfp_inc(cc, static_cast<std::uint64_t>(round) + 1) == 0);
      REQUIRE(cfp_inc_err(cc, 1) == 0);
    }
    // Handles are the slots' indices, distinct while live.
    for (std::size_t i = 1; i < v.size(); ++i) CHECK(v[i]->handle != v[i - 1]->handle);
    for (compcntr_comp_cntr* cc : v) CHECK(compcntr_destroy_comp_cntr(cc) == 0);
    v.clear();
  }
}

TEST_CASE("C fast paths: a use after destroy is reported by AddressSanitizer (ASan builds)") {
  if (!asan) return;  // nothing can detect it in the slot-resident layout (docs/counters.md)
  char path[] = "/tmp/compcntr_uaf_XXXXXX";
  const int out = ::mkstemp(path);
  REQUIRE(out >= 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out, 2);
    compcntr_device* dev = compcntr_open_device("soft");
    const int r = dev ? cfp_use_after_destroy(dev) : -1;
    std::_Exit(r == 0 ? 0 : 3);  // reached only if ASan did not stop the process
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  ::close(out);
  ::unlink(path);
  CHECK_FALSE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK_MESSAGE(text.str().find("heap-use-after-free") != std::string::npos, text.str());
}
