// compcntr:trigger_impl -- internal partition of the triggered operations (src/core/trigger/):
// the objects their units share (trigger_list, trigger_node, trigger_queue) and the small
// helpers every unit uses on them. Not installed, not imported by the primary unit: only the
// implementation units of src/core/trigger/ import it (modules/meson.build, internal_units).
// Semantics and memory ordering: the file comment of modules/core/trigger.cppm; the table of
// guarantees: docs/trigger.md.
//
// The objects:
//   trigger_list  one per counter that ever had a trigger, found through the slot's extension
//                 block (slot_trigger_cell). Holds the armed triggers sorted by (threshold, arming
//                 sequence) in a doubly linked list under `mu` (a futex_mutex), and `next`,
//                 the lowest armed threshold, which an update compares without the lock. Reference-counted (the
//                 extension block + one per trigger node), so a trigger handle can always lock
//                 its list, even after its counter is gone.
//   trigger_node  one armed action. State machine (st):
//                   armed --due, inline--> running --fn(0) returned (arm_add / arm_set:
//                                  the op applied)--> fired
//                   armed --due, deferred--> queued --popped by progress--> running --> fired
//                   armed|queued --cancel / flush / counter destroyed--> cancelling
//                                  --fn(ECANCELED) returned--> cancelled
//                 armed -> * only under the list's lock; queued -> running / cancelling by CAS
//                 (the progress pop holds the queue's lock). Whoever wins runs fn (or applies
//                 counter_op), exactly once.
//   trigger_queue the device's due deferred actions, FIFO, a device_service (created at the first
//                 deferred arm, so firing never allocates), with an optional service thread.
//
//
// The units (this partition holds what they share):
//   trigger.cpp  firing (combined per counter, chains trampolined) and cancellation
//   arm.cpp      arming (the list created on first use, the sorted insert) and compcntr::trigger
//   queue.cpp    the device's deferred queue: running due actions, the service thread
module;
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <thread>
#include "core/wait/futex.hpp"
#include "core/wait/futex_mutex.hpp"
module compcntr:trigger_impl;
import :slot;
import :backend;
import :trigger;

namespace compcntr::detail {

inline constexpr std::uint32_t st_armed = 0, st_queued = 1, st_running = 2, st_fired = 3,
                               st_cancelling = 4, st_cancelled = 5;
/// trigger_list::fire: nobody fires; a thread fires; it fires and must look once more before it
/// stops (an update found it firing); a bit: the counter's destroy waits for fire_idle, notify.
inline constexpr std::uint32_t fire_idle = 0, fire_running = 1, fire_again = 2, fire_waited = 4;
inline constexpr std::uint64_t none_armed = std::numeric_limits<std::uint64_t>::max();

struct trigger_queue;

struct trigger_list {
  /// Held for a few list operations on the fire path: inline (core/wait/futex_mutex.hpp), not
  /// std::mutex's two libc calls.
  futex_mutex mu;
  trigger_node* head = nullptr; ///< armed, sorted by (threshold, seq)
  trigger_node* tail = nullptr;
  /// head's threshold (none_armed when empty: then watch_triggers is clear as well, and a
  /// value of UINT64_MAX that passes the test finds nothing under the lock). seq_cst.
  std::atomic<std::uint64_t> next{none_armed};
  std::uint64_t seq = 0; ///< arming order
  bool dead = false; ///< the counter's last reference is gone: nothing fires any more
  /// Who runs this counter's due inline triggers (fire_idle / fire_running / fire_again; the
  /// protocol: trigger.cpp's fire_list). Moved from idle only under `mu`; the firing thread
  /// leaves with one CAS, without the lock. end_slot_triggers waits for fire_idle.
  std::atomic<std::uint32_t> fire{0};
  /// Deferred actions of this counter running now; end_slot_triggers waits for 0. Waited on
  /// with atomic wait/notify.
  std::atomic<std::uint32_t> busy{0};
  std::atomic<std::uint32_t> refs{1}; ///< the extension block + one per node
  std::atomic<bool> pending{false}; ///< on some thread's pending list (chains)
  trigger_list* pending_next = nullptr;
  slot* s = nullptr; ///< valid while !dead (checked under mu)
};

/// trigger_node::counter_op: what an arm_add / arm_set node does to `target` when it fires
/// (applied by the firing code itself: no action call, no context block); op_call: call `fn`.
inline constexpr std::uint32_t op_call = 0, op_add = 1, op_set = 2;

struct trigger_node {
  std::atomic<std::uint32_t> st{st_armed};
  std::uint32_t mode = trigger_inline;
  std::uint64_t threshold = 0;
  std::uint64_t seq = 0;
  trigger_action fn = nullptr; ///< op_call: the action; op_add / op_set: a no-op, called only
      ///< with ECANCELED (cancellation runs every node's fn)
  void* ctx = nullptr;
  void (*dispose)(void*) = nullptr;
  slot* target = nullptr; ///< a counter reference the node owns (arm_add/arm_set), or null
  std::uint64_t operand = 0; ///< op_add / op_set: the amount added or the value set
  trigger_list* list = nullptr;
  trigger_queue* queue = nullptr; ///< deferred nodes: their device's queue
  trigger_node* prev = nullptr; ///< in list (armed) or queue (queued)
  trigger_node* next = nullptr;
  std::uint32_t counter_op = op_call;
  bool in_queue = false; ///< under the queue's lock
};

// ---- small helpers ----

inline void list_unref(trigger_list* l) noexcept {
  if (l->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete l;
}

// The final state after fn returned; wakes a destroy waiting for it.
inline void finish_node(trigger_node& n, std::uint32_t final_state) noexcept {
  n.st.store(final_state, std::memory_order_release);
  n.st.notify_all();
}

// A decrement to 1 notifies too, not only the one to 0: a destroy from inside one of the
// counter's own deferred actions waits for busy to fall to 1 (its own), not 0. notify_all costs
// a load when nobody waits (libstdc++ counts waiters).
inline void busy_done(trigger_list& l) noexcept {
  if (l.busy.fetch_sub(1, std::memory_order_acq_rel) <= 2) l.busy.notify_all();
}

// Unlinks an armed node (list lock held); keeps `next` and watch_triggers right.
inline void unlink_armed(trigger_list& l, trigger_node& n) noexcept {
  (n.prev ? n.prev->next : l.head) = n.next;
  (n.next ? n.next->prev : l.tail) = n.prev;
  n.prev = n.next = nullptr;
}
inline void publish_next(trigger_list& l) noexcept {
  if (l.head == nullptr) {
    if (l.next.load(std::memory_order_relaxed) == none_armed) return;
    l.next.store(none_armed, std::memory_order_seq_cst);
    if (!l.dead) l.s->watch.fetch_and(~watch_triggers, std::memory_order_seq_cst);
  } else if (const std::uint64_t t = l.head->threshold;
             l.next.load(std::memory_order_relaxed) != t) {
    // Only the lock holder writes `next`, so the relaxed load is exact; unchanged: no store.
    // A lower `next` (a new head armed below) is arm_trigger's seq_cst store and re-check. Here
    // `next` only rises (the head fired or was cancelled): release is enough (a plain store on
    // x86-64, not a locked xchg). An updater that still reads the older, lower value takes the
    // lock for nothing; one that reads this value and is at or above it fires; so no update that
    // makes the head due goes unseen (docs/trigger.md, memory ordering).
    l.next.store(t, std::memory_order_release);
  }
}

/// Runs n's action with `status`, recording it as this thread's running action (trigger.cpp).
void run_action(trigger_list& l, trigger_node& n, int status) noexcept;

// ---- the device's deferred queue ----

inline constexpr int queue_service_key = 0;

struct trigger_queue final : device_service {
  inline trigger_queue() noexcept : device_service(&queue_service_key) {}
  std::mutex mu;
  trigger_node* head = nullptr;
  trigger_node* tail = nullptr;
  std::atomic<std::uint32_t> count{0}; ///< queued nodes (relaxed hint: progress's fast exit)
  /// The service thread sleeps on `wake` (private futex) while nothing is queued.
  std::atomic<std::uint32_t> wake{0};
  std::atomic<std::uint32_t> sleeping{0};
  std::atomic<bool> stopping{false};
  std::mutex thread_mu; ///< start/stop
  std::thread thread;
  device_core* dev = nullptr;

  // Queue lock held.
  inline void push_locked(trigger_node& n) noexcept {
    n.prev = tail;
    n.next = nullptr;
    (tail ? tail->next : head) = &n;
    tail = &n;
    n.in_queue = true;
    count.fetch_add(1, std::memory_order_relaxed);
  }
  inline void unlink_locked(trigger_node& n) noexcept {
    (n.prev ? n.prev->next : head) = n.next;
    (n.next ? n.next->prev : tail) = n.prev;
    n.prev = n.next = nullptr;
    n.in_queue = false;
    count.fetch_sub(1, std::memory_order_relaxed);
  }
  // After pushes: wake the service thread if it sleeps. Memory ordering: seq_cst bump then
  // seq_cst load of `sleeping`, against the thread's seq_cst store of `sleeping` then its
  // re-check of `count` under the lock (Dekker): it either sees the work or is woken.
  inline void kick() noexcept {
    wake.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_seq_cst) != 0) futex::wake(wake, 1);
  }
  void serve() noexcept;
  inline void join_thread() noexcept {
    stopping.store(true, std::memory_order_seq_cst);
    wake.fetch_add(1, std::memory_order_seq_cst);
    futex::wake(wake);
    if (thread.get_id() == std::this_thread::get_id())
      thread.detach(); // the device's last object went inside one of its own actions
    else
      thread.join();
  }
  inline void stop() noexcept override {
    {
      std::lock_guard lk(thread_mu);
      if (thread.joinable()) join_thread();
    }
    delete this;
  }
};

/// The device's queue, or nullptr if no deferred trigger was ever armed on it.
inline trigger_queue* find_queue(device_core& dev) noexcept {
  return static_cast<trigger_queue*>(dev.find_service(&queue_service_key));
}
/// The device's queue, created and attached as a device service on first use; nullptr: ENOMEM
/// (queue.cpp).
trigger_queue* ensure_queue(device_core& dev) noexcept;

} // namespace compcntr::detail
