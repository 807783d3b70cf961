// ./dev demo, runtime part: waiting on counters, asynchronous queries, credits.
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

namespace {

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

void section(const char* title) { std::printf("\n== %s\n", title); }

double thread_cpu_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

const char* errc_name(std::errc e) {
  if (e == std::errc{}) return "ok";
  if (e == std::errc::timed_out) return "ETIMEDOUT";
  if (e == std::errc::io_error) return "EIO (error count changed)";
  return "another error";
}

void waiting(compcntr::device& dev) {
  section("waiting: spin, then sleep in the kernel; errors wake waiters");
  std::error_code ec;
  auto done = dev.create_counter(compcntr::counter_type::wrs, ec);

  // A waiter whose answer is 50 ms away: it spins ~10 us, then sleeps on the slot's futex word.
  double cpu = 0;
  std::errc r{};
  const auto t0 = clk::now();
  std::thread waiter([&] {
    const double c0 = thread_cpu_us();
    r = compcntr::wait(done, 1000, 5s);
    cpu = thread_cpu_us() - c0;
  });
  while (clk::now() - t0 < 50ms) std::this_thread::yield();  // the "network" takes 50 ms
  done.add(1000);
  waiter.join();
  const double wall = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
  std::printf("  wait(counter, 1000, 5 s) -> %s after %.1f ms; the waiter used %.0f us of CPU "
              "(%.2f%% of a core)\n",
              errc_name(r), wall / 1e3, cpu, 100 * cpu / wall);

  // wait_since counts errors from the caller's baseline: the failure is seen whether it lands
  // before the waiter sleeps or after.
  const std::uint64_t errors_seen = done.errors();
  std::thread failer([&] { done.add_error(); });  // an operation fails while someone waits
  r = compcntr::wait_since(done, 2000, errors_seen, 5s, compcntr::wait_options{.spin = 0ns});
  failer.join();
  std::printf("  wait_since(counter, 2000, errors seen, 5 s) while an operation fails -> %s\n",
              errc_name(r));
  std::printf("  wait(counter, 2000, 0 ms) (test once) -> %s\n",
              errc_name(compcntr::wait(done, 2000, 0ms)));

  // poll_any: 8 counters, one per peer; return whichever is ready, fairly.
  std::vector<compcntr::counter> peers;
  for (int i = 0; i < 8; ++i) peers.push_back(dev.create_counter(compcntr::counter_type::wrs, ec));
  const std::uint64_t thresholds[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  peers[2].add();
  peers[6].add();
  std::printf("  poll_any over 8 counters, peers 2 and 6 ready: returns");
  for (int k = 0; k < 4; ++k) {
    auto p = compcntr::poll_any(std::span<const compcntr::counter>(peers), thresholds, 1s);
    std::printf(" %zu", p.index);
  }
  std::printf(" (rotating start: no ready counter starves)\n");

  // A pollable fd in an epoll loop; nothing is paid on increments until it is armed.
  const int fd = compcntr::pollable_fd(peers[0], ec);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  compcntr::arm_fd(peers[0], ec);
  const int before = ::epoll_wait(ep, &ev, 1, 0);
  peers[0].add(5);
  const int after = ::epoll_wait(ep, &ev, 1, 1000);
  std::printf("  epoll on the counter's fd: armed and idle -> %d ready; after add(5) -> %d ready, "
              "value %" PRIu64 "\n",
              before, after, peers[0].value());
  ::close(ep);
}

void async_queries(compcntr::device& dev) {
  section("asynchronous counter queries (DEVX-style cmd_comp, answered by the device's engine)");
  std::error_code ec;
  auto cmd = compcntr::cmd_completion::create(dev, ec);
  std::vector<compcntr::counter> cs;
  for (int i = 0; i < 64; ++i) {
    cs.push_back(dev.create_counter(compcntr::counter_type::wrs, ec));
    cs.back().add(static_cast<std::uint64_t>(i));
  }
  constexpr std::size_t batch = 256, total = 400 * batch;
  std::vector<compcntr::query_request> reqs(batch);
  std::vector<compcntr::query_response> out(batch);
  std::size_t answered = 0, right = 0;
  const auto t0 = clk::now();
  for (std::size_t issued = 0; issued < total; issued += batch) {
    for (std::size_t i = 0; i < batch; ++i) reqs[i] = {&cs[(issued + i) % 64], issued + i};
    const std::size_t n = cmd.query(reqs, ec);
    for (std::size_t got = 0; got < n;) {
      const std::size_t k = cmd.get(std::span(out.data() + got, n - got), ec);
      for (std::size_t j = got; j < got + k; ++j)
        right += out[j].values.completions == out[j].wr_id % 64;
      got += k;
    }
    answered += n;
  }
  const double s = std::chrono::duration<double>(clk::now() - t0).count();
  std::printf("  %zu queries in batches of %zu: %zu answered, %zu with the right value, "
              "%.2f M responses/s\n",
              total, batch, answered, right, answered / s / 1e6);
  unsigned char small[16];
  cmd.query(cs[3], 42);
  const int rc = cmd.get_raw(small, sizeof small);
  pollfd pfd{cmd.fd(), POLLIN, 0};
  const bool readable = ::poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN);
  std::printf("  a 16-byte buffer for a 24-byte response -> %s; still queued: %zu; fd readable: "
              "%s\n",
              rc == ENOSPC ? "ENOSPC (nothing lost)" : "unexpected", cmd.queued(),
              readable ? "yes" : "no");
  auto last = cmd.get(ec);
  std::printf("  then get() -> wr_id %" PRIu64 ", completions %" PRIu64 "\n", last.wr_id,
              last.values.completions);
}

void credits(compcntr::device& dev) {
  section("credit-based flow control (MPI runtime pattern): 4 credits per peer");
  std::error_code ec;
  // One completion counter per peer (attach it to a QP or a libfabric bridge in a real runtime).
  auto c0 = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto c1 = dev.create_counter(compcntr::counter_type::wrs, ec);
  compcntr::counter* counters[] = {&c0, &c1};
  auto cr = compcntr::credit_tracker::adopt(dev, counters, 4, ec);
  constexpr int ops = 20000;
  std::atomic<int> in_flight{0}, max_in_flight{0};
  std::atomic<bool> stop{false};
  // The "network": completes whatever is in flight, returning credits through the counter.
  std::thread network([&] {
    while (!stop.load()) {
      if (in_flight.load() > 0) {
        in_flight.fetch_sub(1);
        c1.add();  // a completion of an operation to peer 1
      } else {
        std::this_thread::yield();
      }
    }
  });
  const auto t0 = clk::now();
  int blocked = 0;
  for (int i = 0; i < ops; ++i) {
    if (cr.try_acquire(1, 1) != std::errc{}) {
      ++blocked;
      cr.acquire(1, 1, 5s);  // out of credits: wait for a completion
    }
    const int now = in_flight.fetch_add(1) + 1;
    int m = max_in_flight.load();
    while (now > m && !max_in_flight.compare_exchange_weak(m, now)) {
    }
  }
  cr.flush(1, 5s);  // everything issued has completed
  stop = true;
  network.join();
  const double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
  std::printf("  %d operations to peer 1 in %.1f ms: at most %d in flight (4 credits), %d "
              "acquisitions had to wait\n",
              ops, ms, max_in_flight.load(), blocked);
  std::printf("  peer 0 untouched: try_acquire(0, 5) -> %s (n > credits_per_peer)\n",
              cr.try_acquire(0, 5) == std::errc::invalid_argument ? "EINVAL" : "?");
}

} // namespace

void runtime_demo(compcntr::device& dev) {
  waiting(dev);
  async_queries(dev);
  credits(dev);
}
