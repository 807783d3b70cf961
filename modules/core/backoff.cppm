// compcntr:backoff -- how a thread waits without a kernel: pause, then yield, then "block now".
//
// Purpose: the busy half of every compcntr wait. A waiter that expects its answer soon polls;
// one that has polled for a while gets out of the way of the thread it waits for (yield); one
// that has waited longer than a sleep/wake costs should sleep in the kernel. backoff walks a
// thread through the first two stages and says when the third is due (is_completed()).
// Model: crossbeam-utils' Backoff, whose step limits it keeps: spin_limit = 6 (a step spins
// 2^step `pause`s; 127 in all, ~4-5 us), yield_limit = 10 (steps 7..10 yield once each). So a
// waiter reaching is_completed() has busy-waited ~5-10 us, about one futex sleep + wake-up;
// spinning as long as blocking would cost, then blocking, never costs more than twice the better
// choice (Karlin et al., SODA 1990). Measurements: bench/README.md, "Measurements the code quotes".
//
// Requirements: one backoff per waiting thread and wait (not thread-safe, no shared state).
// Guarantees: spin() never yields or blocks; snooze() never blocks; is_completed() becomes true
// after exactly yield_limit + 1 snooze() calls and stays true until reset().
// Memory ordering: none (no memory is touched; pause is not a fence).
//
// Example (block_until(ready) stands for whatever blocking primitive the caller has):
//     compcntr::backoff b;
//     while (!ready.load(std::memory_order_acquire)) {
//       if (b.is_completed()) block_until(ready);
//       else b.snooze();
//     }
module;
#include <sched.h>
#include <cstdint>
export module compcntr:backoff;

export namespace compcntr {

/// A spin-wait hint to the CPU: `pause` on x86 (saves power, frees the sibling hyper-thread,
/// avoids the memory-order machine clear when the awaited store arrives), `yield` on AArch64,
/// nothing elsewhere. Memory ordering: none.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

/// Exponential backoff for spin loops (see the file comment for the constants).
class backoff {
 public:
  /// Steps that pause (2^step pauses each); later steps yield.
  static constexpr std::uint32_t spin_limit = 6;
  /// After this step, is_completed(): the caller should block instead.
  static constexpr std::uint32_t yield_limit = 10;

  /// Starts over (after progress was made).
  inline void reset() noexcept { step_ = 0; }

  /// Backs off in a lock-free retry loop (a failed CAS): 2^min(step, spin_limit) pauses. Never
  /// yields: the other thread is running and about to finish.
  inline void spin() noexcept {
    const std::uint32_t s = step_ < spin_limit ? step_ : spin_limit;
    for (std::uint32_t i = 0; i < (1u << s); ++i) cpu_relax();
    if (step_ <= spin_limit) ++step_;
  }

  /// Backs off while waiting for another thread: 2^step pauses up to spin_limit, then one
  /// sched_yield() per call.
  inline void snooze() noexcept {
    if (step_ <= spin_limit) {
      for (std::uint32_t i = 0; i < (1u << step_); ++i) cpu_relax();
    } else {
      ::sched_yield();
    }
    if (step_ <= yield_limit) ++step_;
  }

  /// True once snoozing has lasted long enough that blocking is the better choice.
  inline bool is_completed() const noexcept { return step_ > yield_limit; }

  /// Current step (0 .. yield_limit + 1).
  inline std::uint32_t step() const noexcept { return step_; }

 private:
  std::uint32_t step_ = 0;
};

} // namespace compcntr
