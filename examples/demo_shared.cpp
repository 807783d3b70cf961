// ./dev demo, shared part: counters shared by two processes of this node (docs/shared.md). The
// parent creates counters on a shared device, sends their ids to a forked child through a pipe;
// the child opens the device itself (a device must not be used across fork), resolves the ids,
// and then: adds to a counter the parent sleeps on, plays ping-pong on two counters, and dies
// (SIGKILL) holding a counter the parent waits on.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <system_error>
#include <thread>

import compcntr;

namespace {

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

void section(const char* title) { std::printf("\n== %s\n", title); }

double us_since(clk::time_point t0) {
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
}

// The pipe between the two processes: fixed-size messages (ids, a timing).
struct pipe_pair {
  int fd[2] = {-1, -1};
  bool open() { return ::pipe(fd) == 0; }
  template <class T>
  void send(const T& v) const {
    if (::write(fd[1], &v, sizeof v) != static_cast<ssize_t>(sizeof v)) ::_exit(9);
  }
  template <class T>
  bool recv(T& v) const {
    return ::read(fd[0], &v, sizeof v) == static_cast<ssize_t>(sizeof v);
  }
  ~pipe_pair() {
    if (fd[0] >= 0) ::close(fd[0]);
    if (fd[1] >= 0) ::close(fd[1]);
  }
};

constexpr std::uint64_t adds = 1'000'000;  // the child's add(1) calls on `work`
constexpr std::uint64_t rounds = 1000;     // ping-pong round trips per variant

const compcntr::wait_options forced_sleep{.spin = 0ns};  // no polling: straight to the kernel

// The child: everything it does comes from the ids it reads from `to_child`.
[[noreturn]] void child(const std::string& name, const pipe_pair& to_child,
                        const pipe_pair& to_parent) {
  std::error_code ec;
  auto dev = compcntr::device::open_shared(name, 0, 0, ec);  // opens it, does not create
  compcntr::counter_id ids[3];
  for (auto& id : ids)
    if (!to_child.recv(id)) ::_exit(2);
  auto work = dev ? dev.resolve(ids[0], ec) : compcntr::counter_ref{};
  auto ping = dev ? dev.resolve(ids[1], ec) : compcntr::counter_ref{};
  auto pong = dev ? dev.resolve(ids[2], ec) : compcntr::counter_ref{};
  if (ec) ::_exit(3);
  // 1. adds: half while nobody waits, half while the parent sleeps in wait()
  double add_us[2] = {0, 0};
  for (int h = 0; h < 2; ++h) {
    if (h == 1) {  // the parent is about to wait: give it time to fall asleep
      char go = 0;
      if (!to_child.recv(go)) ::_exit(6);
      std::this_thread::sleep_for(20ms);
    }
    const auto t0 = clk::now();
    for (std::uint64_t i = 0; i < adds / 2; ++i) work.add(1);
    add_us[h] = us_since(t0);
    to_parent.send(add_us);
  }
  // 2. ping-pong: default wait options, then forced sleep
  for (int v = 0; v < 2; ++v)
    for (std::uint64_t i = 1; i <= rounds; ++i) {
      const std::uint64_t want = v * rounds + i;
      if ((v == 0 ? compcntr::wait(ping, want, 5000ms)
                  : compcntr::wait(ping, want, 5000ms, forced_sleep)) != std::errc{})
        ::_exit(4);
      pong.add(1);
    }
  // 3. a counter of its own, held by the parent too, then wait to be killed
  auto mine = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (ec) ::_exit(5);
  mine.add(7);
  to_parent.send(mine.id());
  for (;;) ::pause();
}

} // namespace

void shared_demo() {
  section("shared counters: two processes of this node, counters on one shm: device");
  std::error_code ec;
  const std::string name = "demo-" + std::to_string(::getpid());
  const std::string file = "/dev/shm/compcntr." + name;
  auto dev = compcntr::device::open_shared(name, compcntr::shared_create | compcntr::shared_excl,
                                           0600, ec);
  if (ec) {
    std::printf("  open_shared(\"%s\") -> %s: %s (skipped)\n", name.c_str(), ec.message().c_str(),
                compcntr::last_error_message().data());
    return;
  }
  struct stat st{};
  ::stat(file.c_str(), &st);
  std::printf("  open(\"shm:%s\"): segment %s, %.0f KiB, mode %04o (this user only)\n",
              name.c_str(), file.c_str(), st.st_size / 1024.0, st.st_mode & 07777u);
  auto work = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto ping = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto pong = dev.create_counter(compcntr::counter_type::wrs, ec);
  pipe_pair to_child, to_parent;
  if (ec || !to_child.open() || !to_parent.open()) {
    std::printf("  set-up failed: %s\n", compcntr::last_error_message().data());
    return;
  }
  std::fflush(nullptr);  // the child must not print the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid == 0) child(name, to_child, to_parent);
  for (const auto& c : {&work, &ping, &pong}) to_child.send(c->id());
  const compcntr::counter_id wid = work.id();
  std::printf("  child %d opened it and resolved 3 counters by their ids (e.g. {generation %" PRIu64
              ", index %u}, sent through a pipe)\n",
              static_cast<int>(pid), wid.generation, wid.index);

  // 1. The child adds: half while this process only reads the pipe, half while it sleeps in
  // wait() for the total.
  double add_us[2];
  to_parent.recv(add_us);  // the first half is done
  const std::uint64_t half = work.value();
  to_child.send('g');
  const std::errc r = compcntr::wait(work, adds, 10000ms);
  to_parent.recv(add_us);
  std::printf("  child: %" PRIu64
              " x add(1) while nobody waits: %.1f ns per add (value here: %" PRIu64 ")\n",
              adds / 2, add_us[0] * 1e3 / (adds / 2), half);
  std::printf("  child: %" PRIu64 " more while this process sleeps in wait(counter, %" PRIu64
              "): %.1f ns per add\n    (while a process sleeps on the segment, every update is a "
              "FUTEX_WAKE and the sleeper"
              " re-checks: one wake word per segment, docs/shared.md NOTES)\n",
              adds / 2, adds, add_us[1] * 1e3 / (adds / 2));
  std::printf("    wait -> %s, final value %" PRIu64 " (expected %" PRIu64
              ": no update lost across processes)\n",
              r == std::errc{} ? "ok" : "FAILED", work.value(), adds);

  // 2. Ping-pong: this process adds to ping and waits on pong; the child mirrors it.
  for (int v = 0; v < 2; ++v) {
    const auto p0 = clk::now();
    bool ok = true;
    for (std::uint64_t i = 1; i <= rounds && ok; ++i) {
      ping.add(1);
      const std::uint64_t want = v * rounds + i;
      ok = (v == 0 ? compcntr::wait(pong, want, 5000ms)
                   : compcntr::wait(pong, want, 5000ms, forced_sleep)) == std::errc{};
    }
    std::printf("  ping-pong across the processes, %" PRIu64 " round trips, %s: %.1f us per round"
                " trip%s\n",
                rounds,
                v == 0 ? "default waits (poll 5 us, back off, sleep)"
                       : "waiter always asleep in the kernel",
                us_since(p0) / rounds, ok ? "" : " (FAILED: a wait timed out)");
  }

  // 3. Peer death: the child's own counter, resolved here; SIGKILL while this process waits.
  compcntr::counter_id tid{};
  to_parent.recv(tid);
  auto theirs = dev.resolve(tid, ec);
  if (theirs) {
    std::thread killer([pid] {
      std::this_thread::sleep_for(100ms);
      ::kill(pid, SIGKILL);
    });
    const auto k0 = clk::now();
    const std::errc r = compcntr::wait(theirs, 8, 10000ms);  // the child would have added 1
    const double waited = us_since(k0) / 1e6;
    killer.join();
    std::printf("  the child created a counter (value %" PRIu64 "), this process waits on it; the "
                "child is SIGKILLed 0.1 s in:\n    wait -> %s after %.2f s (its creator's death"
                " found by the waiter's sweep); its value %" PRIu64 " stays readable\n",
                theirs.value(), r == std::errc::io_error ? "EIO" : "unexpected", waited,
                theirs.value());
    const bool resolved = static_cast<bool>(dev.resolve(tid, ec));
    std::printf("    resolve of its id now -> %s; this process's counters unchanged: work %" PRIu64
                "\n",
                resolved ? "ok (unexpected)" : ec.message().c_str(), work.value());
    ec.clear();
  } else {
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  theirs = {};
  work.reset();
  ping.reset();
  pong.reset();
  dev.close(ec);
  std::printf("  closed by its last process: %s %s\n", file.c_str(),
              ::stat(file.c_str(), &st) != 0 ? "removed" : "still there (unexpected)");
}
