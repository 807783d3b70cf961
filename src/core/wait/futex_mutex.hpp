// futex_mutex: a process-private mutex on one futex word, for locks held for a few instructions
// on a hot path (the per-counter trigger lock: src/core/trigger/). Include in the global module
// fragment.
//
// Purpose: std::mutex's lock and unlock are calls into libc (pthread_mutex_lock/unlock, ~53
// instructions together on glibc 2.36, callgrind); this one is inline: a CAS to lock, an
// exchange to unlock (the same two RMWs), a futex call only when a thread sleeps on it.
// Requirements: lock() and unlock() pair in one thread (BasicLockable: std::lock_guard,
// std::unique_lock); not recursive; not for memory shared between processes.
// Guarantees: mutual exclusion; lock() is acquire, unlock() is release (what one holder did is
// visible to the next); a waiter spins briefly, then sleeps in the kernel (no busy wait under
// long holds); no lost wake-up (below).
// Protocol (Drepper, "Futexes Are Tricky", mutex 3): the word is 0 free, 1 held, 2 held with
// possible sleepers. lock: CAS 0 -> 1; else exchange(2) until it returns 0, sleeping while the
// word is 2 (FUTEX_WAIT checks that in the kernel, so a release between the exchange and the
// sleep makes the sleep return at once). unlock: exchange(0); a 2 means someone may sleep:
// wake one. A thread that acquires by exchange(2) leaves 2 behind, so its unlock wakes the next
// sleeper too: never a sleeper left behind, at worst one futex call more than needed.
//
// Example:
//     compcntr::futex_mutex mu;
//     { std::lock_guard lk(mu); /* a few list operations */ }
#ifndef COMPCNTR_SRC_WAIT_FUTEX_MUTEX_HPP
#define COMPCNTR_SRC_WAIT_FUTEX_MUTEX_HPP

#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/wait/futex.hpp"

namespace compcntr {

class futex_mutex {
 public:
  futex_mutex() noexcept = default;
  futex_mutex(const futex_mutex&) = delete;
  futex_mutex& operator=(const futex_mutex&) = delete;

  void lock() noexcept {
    std::uint32_t c = 0;
    if (word_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed))
        [[likely]]
      return;
    lock_slow();
  }
  bool try_lock() noexcept {
    std::uint32_t c = 0;
    return word_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (word_.exchange(0, std::memory_order_release) == 2) [[unlikely]]
      futex::wake(word_, 1);
  }

 private:
  // Spins this many reads before sleeping: the trigger lock's holders run a few list operations
  // (~100 ns), so a short spin usually sees it free without a syscall; 64 pauses are ~1-3 us.
  static constexpr int spin_reads = 64;

  [[gnu::noinline]] void lock_slow() noexcept {
    for (int i = 0; i < spin_reads; ++i) {
#if defined(__x86_64__) || defined(__i386__)  // compcntr::cpu_relax (compcntr:backoff)
      __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
      __asm__ __volatile__("yield" ::: "memory");
#endif
      std::uint32_t c = word_.load(std::memory_order_relaxed);
      if (c == 0 &&
          word_.compare_exchange_weak(c, 1, std::memory_order_acquire, std::memory_order_relaxed))
        return;
      if (c == 2) break;  // others sleep already: join them
    }
    while (word_.exchange(2, std::memory_order_acquire) != 0)
      futex::wait(word_, 2, std::chrono::nanoseconds(-1));
  }

  std::atomic<std::uint32_t> word_{0};
};

} // namespace compcntr

#endif
