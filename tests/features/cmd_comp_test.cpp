// The C API of asynchronous command completion (compcntr/cmd_comp.h): every rule, exact errno.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "blocked.hpp"

namespace {

struct soft_device {
  compcntr_device* dev = compcntr_open_device("soft");
  soft_device() { REQUIRE(dev != nullptr); }
  ~soft_device() { CHECK(compcntr_close_device(dev) == 0); }
};

compcntr_comp_cntr* create_counter(compcntr_device* dev,
                                   compcntr_comp_cntr_type type = COMPCNTR_COMP_CNTR_TYPE_WRS) {
  compcntr_comp_cntr_init_attr a{};
  a.type = type;
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &a);
  REQUIRE(cc != nullptr);
  return cc;
}

compcntr_devx_cmd_comp* create_cmd(compcntr_device* dev) {
  compcntr_devx_cmd_comp* cmd = compcntr_devx_create_cmd_comp(dev);
  REQUIRE(cmd != nullptr);
  return cmd;
}

/// One response in the C layout: compcntr_devx_async_cmd_hdr followed by its out_data.
struct response {
  std::uint64_t wr_id;
  compcntr_comp_cntr_values values;
};
static_assert(sizeof(response) == COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN);

compcntr_devx_async_cmd_hdr* hdr(response& r) {
  return reinterpret_cast<compcntr_devx_async_cmd_hdr*>(&r);
}

int get(compcntr_devx_cmd_comp* cmd, response& r, size_t len = sizeof(response)) {
  return compcntr_devx_get_async_cmd_comp(cmd, hdr(r), len);
}

/// Readable now? (poll with timeout 0)
bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  const int n = ::poll(&p, 1, 0);
  REQUIRE(n >= 0);
  return n == 1 && (p.revents & POLLIN);
}

/// Waits for readability; the timeout only guards against a hang.
bool becomes_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 30000) == 1;
}

void set_nonblocking(int fd, bool on) {
  const int fl = ::fcntl(fd, F_GETFL);
  REQUIRE(fl >= 0);
  REQUIRE(::fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK)) == 0);
}

std::string last_message() { return compcntr_last_error_message(); }

} // namespace

TEST_CASE("NULL arguments are EINVAL, never a crash") {
  soft_device d;
  errno = 0;
  CHECK(compcntr_devx_create_cmd_comp(nullptr) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  compcntr_devx_destroy_cmd_comp(nullptr);
  CHECK(errno == EINVAL);
  CHECK(last_message().find("cmd_comp is NULL") != std::string::npos);

  compcntr_devx_cmd_comp* cmd = create_cmd(d.dev);
  compcntr_comp_cntr* cc = create_counter(d.dev);
  response r{};
  CHECK(compcntr_devx_get_async_cmd_comp(nullptr, hdr(r), sizeof r) == EINVAL);
  CHECK(compcntr_devx_get_async_cmd_comp(cmd, nullptr, sizeof r) == EINVAL);
  CHECK(compcntr_query_comp_cntr_async(nullptr, 1, cmd) == EINVAL);
  CHECK(compcntr_query_comp_cntr_async(cc, 1, nullptr) == EINVAL);
  set_nonblocking(cmd->fd, true);
  CHECK(get(cmd, r) == EAGAIN);  // the refused calls queued nothing
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("a query is answered with its wr_id and the counter's values") {
  soft_device d;
  compcntr_devx_cmd_comp* cmd = create_cmd(d.dev);
  compcntr_comp_cntr* wrs = create_counter(d.dev);
  compcntr_comp_cntr* bytes = create_counter(d.dev, COMPCNTR_COMP_CNTR_TYPE_BYTES);
  REQUIRE(compcntr_inc_comp_cntr(wrs, 5) == 0);
  REQUIRE(compcntr_inc_err_comp_cntr(wrs, 2) == 0);
  REQUIRE(compcntr_inc_comp_cntr(bytes, 4096) == 0);

  REQUIRE(compcntr_query_comp_cntr_async(wrs, 77, cmd) == 0);
  response r{};
  REQUIRE(get(cmd, r) == 0);  // blocks until the engine answers
  CHECK(r.wr_id == 77);
  CHECK(r.values.comp == 5);
  CHECK(r.values.err == 2);

  REQUIRE(compcntr_query_comp_cntr_async(bytes, UINT64_MAX, cmd) == 0);
  REQUIRE(get(cmd, r) == 0);
  CHECK(r.wr_id == UINT64_MAX);
  CHECK(r.values.comp == 4096);
  CHECK(r.values.err == 0);

  // A larger buffer is fine; only the response's 24 bytes are written.
  REQUIRE(compcntr_query_comp_cntr_async(wrs, 78, cmd) == 0);
  unsigned char big[64];
  std::memset(big, 0xab, sizeof big);
  REQUIRE(compcntr_devx_get_async_cmd_comp(cmd, reinterpret_cast<compcntr_devx_async_cmd_hdr*>(big),
                                           sizeof big) == 0);
  std::uint64_t words[3];
  std::memcpy(words, big, sizeof words);
  CHECK(words[0] == 78);
  CHECK(words[1] == 5);
  CHECK(words[2] == 2);
  for (size_t i = 24; i < sizeof big; ++i) CHECK(big[i] == 0xab);

  CHECK(compcntr_destroy_comp_cntr(wrs) == 0);
  CHECK(compcntr_destroy_comp_cntr(bytes) == 0);
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("the fd is real and polls readable exactly while a response is queued") {
  soft_device d;
  compcntr_devx_cmd_comp* cmd = create_cmd(d.dev);
  compcntr_comp_cntr* cc = create_counter(d.dev);
  CHECK(::fcntl(cmd->fd, F_GETFD) >= 0);
  CHECK((::fcntl(cmd->fd, F_GETFD) & FD_CLOEXEC) != 0);
  CHECK_FALSE(readable(cmd->fd));

  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;  // level-triggered
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, cmd->fd, &ev) == 0);
  epoll_event out{};
  CHECK(::epoll_wait(ep, &out, 1, 0) == 0);

  for (int round = 0; round < 3; ++round) {
    REQUIRE(compcntr_query_comp_cntr_async(cc, 1, cmd) == 0);
    REQUIRE(compcntr_query_comp_cntr_async(cc, 2, cmd) == 0);
    response r{};
    // Collect the first (blocking), then wait for the second to be queued.
    REQUIRE(get(cmd, r) == 0);
    CHECK(r.wr_id == 1);
    REQUIRE(becomes_readable(cmd->fd));
    CHECK(::epoll_wait(ep, &out, 1, 0) == 1);
    // A refused get (ENOSPC) leaves the response and the fd as they are.
    CHECK(get(cmd, r, sizeof r - 1) == ENOSPC);
    CHECK(readable(cmd->fd));
    CHECK(::epoll_wait(ep, &out, 1, 0) == 1);
    REQUIRE(get(cmd, r) == 0);
    CHECK(r.wr_id == 2);
    CHECK_FALSE(readable(cmd->fd));
    CHECK(::epoll_wait(ep, &out, 1, 0) == 0);
  }
  ::close(ep);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("buffer sizes: EINVAL below the header, ENOSPC below header + data (response kept)") {
  soft_device d;
  compcntr_devx_cmd_comp* cmd = create_cmd(d.dev);
  compcntr_comp_cntr* cc = create_counter(d.dev);
  response r{};
  // Below the header: EINVAL at once, even with nothing queued and a blocking fd.
  for (size_t len = 0; len < sizeof(compcntr_devx_async_cmd_hdr); ++len)
    CHECK(get(cmd, r, len) == EINVAL);
  CHECK(last_message().find("header") != std::string::npos);

  REQUIRE(compcntr_inc_comp_cntr(cc, 9) == 0);
  REQUIRE(compcntr_query_comp_cntr_async(cc, 5, cmd) == 0);
  REQUIRE(becomes_readable(cmd->fd));
  for (size_t len = sizeof(compcntr_devx_async_cmd_hdr); len < sizeof(response); ++len) {
    r.wr_id = 0;
    CHECK(get(cmd, r, len) == ENOSPC);
    CHECK(r.wr_id == 0);  // nothing written
  }
  CHECK(last_message().find("stays queued") != std::string::npos);
  CHECK(readable(cmd->fd));
  REQUIRE(get(cmd, r) == 0);
  CHECK(r.wr_id == 5);
  CHECK(r.values.comp == 9);

  // With nothing queued, a too-small buffer behaves like any get: EAGAIN on an O_NONBLOCK fd.
  set_nonblocking(cmd->fd, true);
  CHECK(get(cmd, r, sizeof r - 1) == EAGAIN);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("empty queue: EAGAIN when the application set O_NONBLOCK, read at call time") {
  soft_device d;
  compcntr_devx_cmd_comp* cmd = create_cmd(d.dev);
  compcntr_comp_cntr* cc = create_counter(d.dev);
  response r{};
  set_nonblocking(cmd->fd, true);
  CHECK(get(cmd, r) == EAGAIN);
  CHECK(last_message().find("O_NONBLOCK") != std::string::npos);
  REQUIRE(compcntr_query_comp_cntr_async(cc, 3, cmd) == 0);
  REQUIRE(becomes_readable(cmd->fd));
  CHECK(get(cmd, r) == 0);
  CHECK(get(cmd, r) == EAGAIN);
  // Clearing the flag makes the next empty get block again (woken by the next response).
  set_nonblocking(cmd->fd, false);
  REQUIRE(compcntr_query_comp_cntr_async(cc, 4, cmd) == 0);
  CHECK(get(cmd, r) == 0);
  CHECK(r.wr_id == 4);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("a blocked get is woken by the response") {
  soft_device d;
  compcntr_devx_cmd_comp* cmd = create_cmd(d.dev);
  compcntr_comp_cntr* cc = create_counter(d.dev);
  REQUIRE(compcntr_inc_comp_cntr(cc, 11) == 0);
  std::atomic<pid_t> tid{0};
  response r{};
  int rc = -1;
  std::thread consumer([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    rc = get(cmd, r);
  });
  // The consumer really sleeps in the kernel before the query is issued.
  REQUIRE(eventually_blocked(tid));
  REQUIRE(compcntr_query_comp_cntr_async(cc, 99, cmd) == 0);
  consumer.join();
  CHECK(rc == 0);
  CHECK(r.wr_id == 99);
  CHECK(r.values.comp == 11);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("back-pressure: EAGAIN beyond 1 MiB outstanding, nothing dropped, each answered once") {
  soft_device d;
  compcntr_devx_cmd_comp* cmd = create_cmd(d.dev);
  compcntr_comp_cntr* cc = create_counter(d.dev);
  constexpr std::uint64_t limit = (1u << 20) / sizeof(compcntr_comp_cntr_values);  // 65,536
  for (std::uint64_t i = 0; i < limit; ++i)
    REQUIRE(compcntr_query_comp_cntr_async(cc, i, cmd) == 0);
  CHECK(compcntr_query_comp_cntr_async(cc, limit, cmd) == EAGAIN);
  CHECK(last_message().find("1 MiB") != std::string::npos);
  response r{};
  REQUIRE(get(cmd, r) == 0);  // one collected: room for exactly one more
  CHECK(compcntr_query_comp_cntr_async(cc, limit, cmd) == 0);
  CHECK(compcntr_query_comp_cntr_async(cc, limit + 1, cmd) == EAGAIN);

  std::vector<int> seen(limit + 2, 0);
  seen[r.wr_id]++;
  for (std::uint64_t i = 0; i < limit; ++i) {
    REQUIRE(get(cmd, r) == 0);
    REQUIRE(r.wr_id <= limit);
    seen[r.wr_id]++;
  }
  for (std::uint64_t i = 0; i <= limit; ++i) REQUIRE(seen[i] == 1);
  CHECK(seen[limit + 1] == 0);  // the refused query was never answered
  set_nonblocking(cmd->fd, true);
  CHECK(get(cmd, r) == EAGAIN);
  CHECK_FALSE(readable(cmd->fd));
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("destroy discards queued responses and closes the fd; the device can close") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_devx_cmd_comp* cmd = create_cmd(dev);
  compcntr_comp_cntr* cc = create_counter(dev);
  CHECK(compcntr_close_device(dev) == EBUSY);  // the cmd_comp (and counter) live
  for (int i = 0; i < 100; ++i) REQUIRE(compcntr_query_comp_cntr_async(cc, i, cmd) == 0);
  REQUIRE(becomes_readable(cmd->fd));
  const int fd = cmd->fd;
  compcntr_devx_destroy_cmd_comp(cmd);
  errno = 0;
  CHECK(::fcntl(fd, F_GETFD) == -1);
  CHECK(errno == EBADF);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("a counter of another device is EINVAL") {
  soft_device a, b;
  compcntr_devx_cmd_comp* cmd = create_cmd(a.dev);
  compcntr_comp_cntr* other = create_counter(b.dev);
  CHECK(compcntr_query_comp_cntr_async(other, 1, cmd) == EINVAL);
  CHECK(last_message().find("another device") != std::string::npos);
  CHECK(compcntr_destroy_comp_cntr(other) == 0);
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("destroying a counter with queries in flight succeeds; the queries are answered") {
  soft_device d;
  compcntr_devx_cmd_comp* cmd = create_cmd(d.dev);
  for (int round = 0; round < 20; ++round) {
    compcntr_comp_cntr* cc = create_counter(d.dev);
    REQUIRE(compcntr_inc_comp_cntr(cc, 42) == 0);
    for (int i = 0; i < 500; ++i) REQUIRE(compcntr_query_comp_cntr_async(cc, i, cmd) == 0);
    REQUIRE(compcntr_destroy_comp_cntr(cc) == 0);  // never EBUSY because of a query
    for (int i = 0; i < 500; ++i) {
      response r{};
      REQUIRE(get(cmd, r) == 0);
      CHECK(r.wr_id == static_cast<std::uint64_t>(i));  // one issuer: FIFO
      CHECK(r.values.comp == 42);
    }
  }
  compcntr_devx_destroy_cmd_comp(cmd);
}

TEST_CASE("destroying a cmd_comp with queries in flight (AddressSanitizer checks the engine)") {
  for (int round = 0; round < 30; ++round) {
    compcntr_device* dev = compcntr_open_device("soft");
    REQUIRE(dev);
    compcntr_devx_cmd_comp* cmd = create_cmd(dev);
    std::vector<compcntr_comp_cntr*> ccs;
    for (int c = 0; c < 8; ++c) ccs.push_back(create_counter(dev));
    for (int i = 0; i < 4000; ++i)
      REQUIRE(compcntr_query_comp_cntr_async(ccs[i % ccs.size()], i, cmd) == 0);
    // Half the rounds destroy the counters first, half the cmd_comp first.
    if (round % 2)
      for (auto* cc : ccs) REQUIRE(compcntr_destroy_comp_cntr(cc) == 0);
    compcntr_devx_destroy_cmd_comp(cmd);
    if (round % 2 == 0)
      for (auto* cc : ccs) REQUIRE(compcntr_destroy_comp_cntr(cc) == 0);
    REQUIRE(compcntr_close_device(dev) == 0);  // nothing of the cmd_comp holds the device
  }
}
