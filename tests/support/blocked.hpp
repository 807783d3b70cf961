// eventually_blocked(tid): true once thread `tid` of this process sleeps in the kernel (state S
// in /proc/self/task/<tid>/stat), e.g. blocked in poll() inside a blocking get. A condition
// check with a generous deadline, not a sleep: it lets a test issue a wake-up only after the
// waiter is really blocked, so the blocking path is what gets exercised.
#ifndef COMPCNTR_TESTS_BLOCKED_HPP
#define COMPCNTR_TESTS_BLOCKED_HPP

#include <sys/types.h>
#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

inline char thread_state(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(f, line);
  const auto paren = line.rfind(')');  // the command name may contain spaces
  return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
}

inline bool eventually_blocked(const std::atomic<pid_t>& tid,
                               std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const pid_t t = tid.load();
    if (t != 0 && thread_state(t) == 'S') return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
}

#endif
