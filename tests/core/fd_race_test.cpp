// A counter's pollable fd when an update's signal and an arm_fd interleave (src/core/wait/ext.cpp,
// notify_ext and arm_slot_fd). Its own executable: it replaces the C library's write() for the
// whole program, to stop an updater exactly inside the signalling write.
//
// Review finding (2026-11-30): the updater marked the fd signalled before writing it. An arm
// between the two cleared the mark and drained nothing; the write then landed, and with the mark
// gone no later arm ever drained the fd: it stayed readable, and an arm -> read -> epoll_wait
// loop would spin at 100% CPU until some later update. Now the write comes first.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <system_error>
#include <thread>

import compcntr;

#include "support.hpp"

namespace {
std::atomic<int> hold_fd{-1};            // write()s to this fd wait for release_write
std::atomic<bool> in_write{false};
std::atomic<bool> release_write{false};
}  // namespace

// Every write() of the program (the library's eventfd signal included) comes here. Writes to
// hold_fd announce themselves and wait; all others go straight to the kernel.
extern "C" ssize_t write(int fd, const void* buf, size_t n) {
  if (fd >= 0 && fd == hold_fd.load()) {
    in_write.store(true);
    while (!release_write.load()) sched_yield();
  }
  return ::syscall(SYS_write, fd, buf, n);
}

TEST_CASE("arm_fd racing with an update's signal leaves at most one spurious readiness") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  std::error_code ec;
  const int fd = compcntr::pollable_fd(c, ec);
  REQUIRE(!ec);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
  auto ready = [&] {
    epoll_event e[1];
    return ::epoll_wait(ep, e, 1, 0);
  };

  compcntr::arm_fd(c, ec);  // A1
  REQUIRE(!ec);
  hold_fd.store(fd);
  std::thread updater([&] { c.add(1); });  // clears the armed bit, then stops in write()
  while (!in_write.load()) sched_yield();
  compcntr::arm_fd(c, ec);  // A2: between the update's signal and its bookkeeping
  REQUIRE(!ec);
  release_write.store(true);
  updater.join();
  hold_fd.store(-1);
  CHECK(c.value() == 1);

  // The update's readiness may survive A2 (it raced with it): one arm later it must be gone,
  // and it must stay gone while nothing changes.
  compcntr::arm_fd(c, ec);  // A3 drains it
  REQUIRE(!ec);
  for (int i = 0; i < 3; ++i) {
    CHECK(ready() == 0);
    compcntr::arm_fd(c, ec);
    REQUIRE(!ec);
  }
  // And the fd still works: the next update makes it readable.
  c.add(1);
  CHECK(ready() == 1);
  ::close(ep);
}
