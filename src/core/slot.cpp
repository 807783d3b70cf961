// The slow half of slot::notify(): runs only when someone watches the counter.
module;
#include <atomic>
#include <cstdint>
#include "core/wait/futex.hpp"
module compcntr;

// slot is compcntr::plugin's (the backend interface); everything it calls is compcntr::detail's.
namespace compcntr::plugin {

using namespace compcntr::detail;

void slot::notify_slow() noexcept {
  const std::uint32_t w = watch.load(std::memory_order_seq_cst);
  if ((w & watch_shared) != 0) notify_shared(*this); // waiters of every process (compcntr:shared)
  if ((w & watch_sleepers_mask) != 0) {
    // Bump the futex word first, so a waiter that has read the old sequence but not yet
    // entered the kernel finds it changed and returns at once (FUTEX_WAIT's value check).
    wake_seq.fetch_add(1, std::memory_order_release);
    futex::wake(wake_seq);
  }
  if ((w & (watch_fd_armed | watch_pollers)) != 0) notify_ext(*this, w);
  // Last: inline trigger actions may take a while, waiters are woken first.
  if ((w & watch_triggers) != 0) fire_slot_triggers(*this);
}

void slot::kick() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const std::uint32_t w = watch.load(std::memory_order_seq_cst);
  if ((w & watch_sleepers_mask) != 0) {
    wake_seq.fetch_add(1, std::memory_order_release);
    futex::wake(wake_seq);
  }
  if ((w & watch_pollers) != 0) notify_ext(*this, watch_pollers);
}

} // namespace compcntr::plugin
