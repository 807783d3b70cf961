// Linux futex calls on a std::atomic<std::uint32_t>, for the implementation units of the wait
// layer (include in the global module fragment). The futex only blocks and wakes: every
// ordering the callers rely on comes from their C++ atomics (see compcntr:wait).
#ifndef COMPCNTR_SRC_WAIT_FUTEX_HPP
#define COMPCNTR_SRC_WAIT_FUTEX_HPP

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace compcntr::futex {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "the futex word must be a plain 32-bit word");

inline std::uint32_t* addr(std::atomic<std::uint32_t>& word) noexcept {
  return reinterpret_cast<std::uint32_t*>(&word);
}

/// FUTEX_WAIT with `op` (private or not) for at most `rel` (negative: no limit).
inline void wait_op(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                    std::chrono::nanoseconds rel, int op) noexcept {
  timespec ts{};
  timespec* tsp = nullptr;
  if (rel.count() >= 0) {
    ts.tv_sec = static_cast<time_t>(rel.count() / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(rel.count() % 1'000'000'000);
    tsp = &ts;
  }
  ::syscall(SYS_futex, addr(word), op, expected, tsp, nullptr, 0);
}

/// Sleeps while `word` == `expected`, for at most `rel` (negative: no limit). Returns on a wake,
/// when the word already differs (EAGAIN), on timeout and on signals: callers re-check.
inline void wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                 std::chrono::nanoseconds rel) noexcept {
  wait_op(word, expected, rel, FUTEX_WAIT_PRIVATE);
}

/// Wakes up to `n` threads sleeping in wait() on `word`.
inline void wake(std::atomic<std::uint32_t>& word, int n = INT_MAX) noexcept {
  ::syscall(SYS_futex, addr(word), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}

/// wait() on a word in memory shared between processes (a non-private futex: the kernel keys
/// it by the physical page, so a waker in another process that maps the page finds it).
inline void wait_shared(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                        std::chrono::nanoseconds rel) noexcept {
  wait_op(word, expected, rel, FUTEX_WAIT);
}

/// wake() of waiters of every process sleeping in wait_shared() on `word`.
inline void wake_shared(std::atomic<std::uint32_t>& word, int n = INT_MAX) noexcept {
  ::syscall(SYS_futex, addr(word), FUTEX_WAKE, n, nullptr, nullptr, 0);
}

} // namespace compcntr::futex

#endif
