// Triggered operations (compcntr:trigger): per-counter trigger lists, firing, cancellation, the
// device's deferred queue and its service thread. Semantics and memory ordering: the file
// comment of modules/core/trigger.cppm; the table of guarantees: docs/trigger.md.
//
// The objects:
//   trigger_list  one per counter that ever had a trigger, found through the slot's extension
//                 block (slot_trigger_cell). Holds the armed triggers sorted by (threshold, arming
//                 sequence) in a doubly linked list under `mu`, and `next`, the lowest armed
//                 threshold, which an update compares without the lock. Reference-counted (the
//                 extension block + one per trigger node), so a trigger handle can always lock
//                 its list, even after its counter is gone.
//   trigger_node  one armed action. State machine (st):
//                   armed --due, inline--> running --fn(0) returned--> fired
//                   armed --due, deferred--> queued --popped by progress--> running --> fired
//                   armed|queued --cancel / flush / counter destroyed--> cancelling
//                                  --fn(ECANCELED) returned--> cancelled
//                 armed -> * only under the list's lock; queued -> running / cancelling by CAS
//                 (the progress pop holds the queue's lock). Whoever wins runs fn, exactly once.
//   trigger_queue the device's due deferred actions, FIFO, a device_service (created at the first
//                 deferred arm, so firing never allocates), with an optional service thread.
//
// Firing is combined per counter: one thread at a time runs a counter's due triggers (`firing`),
// a thread that finds it busy leaves `again` and the firing thread looks once more before it
// stops; so due triggers run in threshold order even when several threads cross thresholds at
// once. Chains are trampolined: an update made inside an action does not fire its counter's
// triggers recursively but puts the counter on the thread's pending list, which the outermost
// firing drains before it returns (stack depth 1 whatever the chain's length).
module;
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include "core/wait/futex.hpp"
module compcntr;

namespace compcntr::detail {

namespace {

constexpr std::uint32_t st_armed = 0, st_queued = 1, st_running = 2, st_fired = 3,
                        st_cancelling = 4, st_cancelled = 5;
constexpr std::uint64_t none_armed = std::numeric_limits<std::uint64_t>::max();

struct trigger_queue;

}  // namespace

struct trigger_list {
  std::mutex mu;
  trigger_node* head = nullptr;  ///< armed, sorted by (threshold, seq)
  trigger_node* tail = nullptr;
  /// head's threshold (none_armed when empty: then watch_triggers is clear as well, and a
  /// value of UINT64_MAX that passes the test finds nothing under the lock). seq_cst.
  std::atomic<std::uint64_t> next{none_armed};
  std::uint64_t seq = 0;  ///< arming order
  bool firing = false;    ///< a thread is running this counter's due triggers
  bool again = false;     ///< look again before firing stops
  bool dead = false;      ///< the counter's last reference is gone: nothing fires any more
  /// Actions of this counter running now (the firing batch counts one, each running deferred
  /// action one); end_slot_triggers waits for 0. Waited on with atomic wait/notify.
  std::atomic<std::uint32_t> busy{0};
  std::atomic<std::uint32_t> refs{1};  ///< the extension block + one per node
  std::atomic<bool> pending{false};    ///< on some thread's pending list (chains)
  trigger_list* pending_next = nullptr;
  slot* s = nullptr;  ///< valid while !dead (checked under mu)
};

struct trigger_node {
  std::atomic<std::uint32_t> st{st_armed};
  std::uint32_t mode = trigger_inline;
  std::uint64_t threshold = 0;
  std::uint64_t seq = 0;
  trigger_action fn = nullptr;
  void* ctx = nullptr;
  void (*dispose)(void*) = nullptr;
  slot* target = nullptr;  ///< a counter reference the node owns (arm_add/arm_set), or null
  trigger_list* list = nullptr;
  trigger_queue* queue = nullptr;  ///< deferred nodes: their device's queue
  trigger_node* prev = nullptr;    ///< in list (armed) or queue (queued)
  trigger_node* next = nullptr;
  bool in_queue = false;  ///< under the queue's lock
};

namespace {

// ---- small helpers ----

void list_unref(trigger_list* l) noexcept {
  if (l->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete l;
}

// The final state after fn returned; wakes a destroy waiting for it.
void finish_node(trigger_node& n, std::uint32_t final_state) noexcept {
  n.st.store(final_state, std::memory_order_release);
  n.st.notify_all();
}

// A decrement to 1 notifies too, not only the one to 0: a destroy from inside one of the
// counter's own actions waits for busy to fall to 1 (its own), not 0. notify_all costs a load when nobody
// waits (libstdc++ counts waiters).
void busy_done(trigger_list& l) noexcept {
  if (l.busy.fetch_sub(1, std::memory_order_acq_rel) <= 2) l.busy.notify_all();
}

// The list the calling thread runs an action of now (an action runs no other action nested:
// chains are trampolined, deferred progress does not nest), for end_slot_triggers and
// destroy_trigger called from inside an action.
thread_local trigger_list* tl_running = nullptr;
thread_local const trigger_node* tl_running_node = nullptr;
thread_local unsigned tl_depth = 0; // > 0 while inside fire_list (chains)
thread_local trigger_list* tl_pending = nullptr; // counters updated inside actions
thread_local bool tl_in_progress = false;

void run_action(trigger_list& l, trigger_node& n, int status) noexcept {
  trigger_list* const saved = tl_running;
  const trigger_node* const saved_node = tl_running_node;
  tl_running = &l;
  tl_running_node = &n;
  n.fn(n.ctx, status);
  tl_running = saved;
  tl_running_node = saved_node;
}

// Unlinks an armed node (list lock held); keeps `next` and watch_triggers right.
void unlink_armed(trigger_list& l, trigger_node& n) noexcept {
  (n.prev ? n.prev->next : l.head) = n.next;
  (n.next ? n.next->prev : l.tail) = n.prev;
  n.prev = n.next = nullptr;
}
void publish_next(trigger_list& l) noexcept {
  if (l.head == nullptr) {
    if (l.next.load(std::memory_order_relaxed) == none_armed) return;
    l.next.store(none_armed, std::memory_order_seq_cst);
    if (!l.dead) l.s->watch.fetch_and(~watch_triggers, std::memory_order_seq_cst);
  } else if (l.next.load(std::memory_order_relaxed) != l.head->threshold) {
    // Unchanged (a firing that found nothing more due): no store (a seq_cst store is a locked
    // xchg on x86-64). Only the lock holder writes `next`, so the relaxed load is exact.
    l.next.store(l.head->threshold, std::memory_order_seq_cst);
  }
}

// ---- the device's deferred queue ----

constexpr int queue_service_key = 0;

struct trigger_queue final : device_service {
  trigger_queue() noexcept : device_service(&queue_service_key) {}
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
  void push_locked(trigger_node& n) noexcept {
    n.prev = tail;
    n.next = nullptr;
    (tail ? tail->next : head) = &n;
    tail = &n;
    n.in_queue = true;
    count.fetch_add(1, std::memory_order_relaxed);
  }
  void unlink_locked(trigger_node& n) noexcept {
    (n.prev ? n.prev->next : head) = n.next;
    (n.next ? n.next->prev : tail) = n.prev;
    n.prev = n.next = nullptr;
    n.in_queue = false;
    count.fetch_sub(1, std::memory_order_relaxed);
  }
  // After pushes: wake the service thread if it sleeps. Memory ordering: seq_cst bump then
  // seq_cst load of `sleeping`, against the thread's seq_cst store of `sleeping` then its
  // re-check of `count` under the lock (Dekker): it either sees the work or is woken.
  void kick() noexcept {
    wake.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_seq_cst) != 0) futex::wake(wake, 1);
  }
  void serve() noexcept;
  void join_thread() noexcept {
    stopping.store(true, std::memory_order_seq_cst);
    wake.fetch_add(1, std::memory_order_seq_cst);
    futex::wake(wake);
    if (thread.get_id() == std::this_thread::get_id())
      thread.detach(); // the device's last object went inside one of its own actions
    else
      thread.join();
  }
  void stop() noexcept override {
    {
      std::lock_guard lk(thread_mu);
      if (thread.joinable()) join_thread();
    }
    delete this;
  }
};

trigger_queue* find_queue(device_core& dev) noexcept {
  return static_cast<trigger_queue*>(dev.find_service(&queue_service_key));
}
trigger_queue* ensure_queue(device_core& dev) noexcept {
  if (trigger_queue* q = find_queue(dev)) return q;
  auto* mine = new (std::nothrow) trigger_queue;
  if (mine == nullptr) return nullptr;
  mine->dev = &dev;
  device_service* winner = dev.add_service(*mine);
  if (winner != mine) delete mine; // never attached: nothing to stop
  return static_cast<trigger_queue*>(winner);
}

// Pops and runs one due deferred action of q; false when none is left.
bool run_one(trigger_queue& q) noexcept {
  trigger_node* n;
  {
    std::lock_guard lk(q.mu);
    for (;;) {
      n = q.head;
      if (n == nullptr) return false;
      q.unlink_locked(*n);
      std::uint32_t want = st_queued;
      // A canceller CASes queued -> cancelling first and unlinks after (then finds it gone):
      // the node is the canceller's now, don't touch it again.
      if (n->st.compare_exchange_strong(want, st_running, std::memory_order_acq_rel)) break;
    }
    n->list->busy.fetch_add(1, std::memory_order_acq_rel); // under q.mu: end_* scans after it
  }
  trigger_list& l = *n->list;
  run_action(l, *n, 0);
  finish_node(*n, st_fired);
  busy_done(l);
  return true;
}

void trigger_queue::serve() noexcept {
  tl_in_progress = true;
  while (!stopping.load(std::memory_order_seq_cst)) {
    if (run_one(*this)) continue;
    const std::uint32_t seen = wake.load(std::memory_order_seq_cst);
    sleeping.store(1, std::memory_order_seq_cst);
    if (count.load(std::memory_order_seq_cst) == 0 && !stopping.load(std::memory_order_seq_cst))
      futex::wait(wake, seen, std::chrono::nanoseconds(-1));
    sleeping.store(0, std::memory_order_seq_cst);
  }
}

// ---- firing ----

// Runs the due triggers of l, combined (see the file comment). Called with nothing locked.
void fire_list(trigger_list& l) noexcept {
  std::unique_lock lk(l.mu);
  if (l.dead) return;
  if (l.firing) {
    l.again = true;
    return;
  }
  l.firing = true;
  l.busy.fetch_add(1, std::memory_order_acq_rel);
  for (;;) {
    l.again = false;
    // seq_cst: the Dekker re-check against updates (compcntr:trigger's memory ordering).
    const std::uint64_t v = l.s->value_seq_cst();
    trigger_node* batch = nullptr;
    trigger_node* batch_tail = nullptr;
    trigger_queue* q = nullptr;
    while (l.head != nullptr && l.head->threshold <= v) {
      trigger_node* n = l.head;
      unlink_armed(l, *n);
      if (n->mode == trigger_deferred) {
        // Queued under both locks (list, then queue): a canceller that sees `queued` finds
        // it in the queue or finds it taken by progress.
        std::lock_guard qk(n->queue->mu);
        n->st.store(st_queued, std::memory_order_release);
        n->queue->push_locked(*n);
        q = n->queue;
      } else {
        n->st.store(st_running, std::memory_order_relaxed);
        (batch_tail ? batch_tail->next : batch) = n;
        batch_tail = n;
      }
    }
    publish_next(l);
    if (batch == nullptr && !l.again) {
      l.firing = false;
      lk.unlock();
      if (q != nullptr) q->kick();
      busy_done(l);
      return;
    }
    lk.unlock();
    if (q != nullptr) q->kick();
    for (trigger_node* n = batch; n != nullptr;) {
      trigger_node* const next = n->next;
      n->next = nullptr;
      run_action(l, *n, 0);
      finish_node(*n, st_fired); // n may be freed from here on
      n = next;
    }
    lk.lock();
    if (l.dead) { // destroyed by one of its own actions: the destroyer cancelled the rest
      l.firing = false;
      lk.unlock();
      busy_done(l);
      return;
    }
  }
}

// Takes a reference on l and puts it on this thread's pending list (chains).
void defer_to_pending(trigger_list& l) noexcept {
  if (l.pending.exchange(true, std::memory_order_seq_cst)) return; // someone will look
  l.refs.fetch_add(1, std::memory_order_relaxed);
  l.pending_next = tl_pending;
  tl_pending = &l;
}

void drain_pending() noexcept {
  while (trigger_list* l = tl_pending) {
    tl_pending = l->pending_next;
    l->pending_next = nullptr;
    // Cleared before looking (seq_cst): an update after this either finds it clear and
    // queues the list again, or happened before the value fire_list reads.
    l->pending.store(false, std::memory_order_seq_cst);
    fire_list(*l);
    list_unref(l);
  }
}

trigger_list* list_of(slot& s) noexcept {
  std::atomic<trigger_list*>* cell = slot_trigger_cell(s, false);
  return cell != nullptr ? cell->load(std::memory_order_acquire) : nullptr;
}

// The counter's list, created on first use (the counter is live: the caller holds it).
trigger_list* ensure_list(slot& s) noexcept {
  std::atomic<trigger_list*>* cell = slot_trigger_cell(s, true);
  if (cell == nullptr) return nullptr;
  trigger_list* l = cell->load(std::memory_order_acquire);
  if (l != nullptr) return l;
  auto* fresh = new (std::nothrow) trigger_list;
  if (fresh == nullptr) return nullptr;
  fresh->s = &s;
  if (cell->compare_exchange_strong(l, fresh, std::memory_order_acq_rel, std::memory_order_acquire))
    return fresh;
  delete fresh;
  return l;
}

// Cancels every node of l that has not fired: armed ones (in threshold order) and, if `q`,
// its due deferred ones; runs their actions with ECANCELED. `mark_dead`: the counter is gone.
std::size_t cancel_all(trigger_list& l, trigger_queue* q, bool mark_dead) noexcept {
  trigger_node* chain = nullptr;
  trigger_node* chain_tail = nullptr;
  auto take = [&](trigger_node* n) {
    n->next = nullptr;
    (chain_tail ? chain_tail->next : chain) = n;
    chain_tail = n;
  };
  {
    std::lock_guard lk(l.mu);
    while (trigger_node* n = l.head) {
      unlink_armed(l, *n);
      n->st.store(st_cancelling, std::memory_order_relaxed);
      take(n);
    }
    if (mark_dead) {
      // watch_triggers off first (the slot is still the counter's: dead is set under mu).
      l.s->watch.fetch_and(~watch_triggers, std::memory_order_seq_cst);
      l.dead = true;
    }
    publish_next(l);
  }
  if (q != nullptr) {
    std::lock_guard qk(q->mu);
    for (trigger_node* n = q->head; n != nullptr;) {
      trigger_node* const next = n->next;
      std::uint32_t want = st_queued;
      if (n->list == &l &&
          n->st.compare_exchange_strong(want, st_cancelling, std::memory_order_acq_rel)) {
        q->unlink_locked(*n);
        take(n);
      }
      n = next;
    }
  }
  std::size_t count = 0;
  for (trigger_node* n = chain; n != nullptr; ++count) {
    trigger_node* const next = n->next;
    n->next = nullptr;
    run_action(l, *n, ECANCELED);
    finish_node(*n, st_cancelled);
    n = next;
  }
  return count;
}

} // namespace

void fire_slot_triggers(slot& s) noexcept {
  trigger_list* l = list_of(s);
  if (l == nullptr) return;
  // The lock-free test: below the lowest armed threshold (the common update of a counter with
  // triggers armed ahead) costs two loads.
  if (s.value_seq_cst() < l->next.load(std::memory_order_seq_cst)) return;
  if (tl_depth > 0) { // inside an action: trampoline (bounded stack depth)
    defer_to_pending(*l);
    return;
  }
  ++tl_depth;
  fire_list(*l);
  drain_pending();
  --tl_depth;
}

trigger_node* arm_trigger(slot& s, std::uint64_t threshold, trigger_action fn, void* ctx,
                          void (*dispose)(void*), std::uint32_t mode, slot* target,
                          std::error_code& ec) noexcept {
  auto refuse = [&](int err, const char* why) -> trigger_node* {
    if (target != nullptr) unref_counter_slot(*target);
    fail_into(ec, err, "trigger_arm: %s", why);
    return nullptr;
  };
  if (fn == nullptr) return refuse(EINVAL, "the action is NULL");
  if (mode != trigger_inline && mode != trigger_deferred)
    return refuse(EINVAL, "flags must be exactly one of COMPCNTR_TRIGGER_INLINE and "
                          "COMPCNTR_TRIGGER_DEFERRED (trigger_mode::immediate / deferred)");
  // A shared counter's updates in other processes reach its triggers through the device's
  // watcher (compcntr:shared): registered first, so a refusal (fork child) arms nothing.
  const bool shared = is_shared(s);
  if (shared) [[unlikely]]
    if (auto err = shared_watch_fd(s, "trigger_arm")) {
      if (target != nullptr) unref_counter_slot(*target);
      ec = err;
      return nullptr;
    }
  trigger_queue* q = nullptr;
  if (mode == trigger_deferred && (q = ensure_queue(*s.owner)) == nullptr)
    return refuse(ENOMEM, "out of memory for the device's deferred queue");
  trigger_list* l = ensure_list(s);
  if (l == nullptr) return refuse(ENOMEM, "out of memory for the counter's trigger list");
  auto* n = new (std::nothrow) trigger_node;
  if (n == nullptr) return refuse(ENOMEM, "out of memory for the trigger");
  n->mode = mode;
  n->threshold = threshold;
  n->fn = fn;
  n->ctx = ctx;
  n->dispose = dispose;
  n->target = target;
  n->list = l;
  n->queue = q;
  l->refs.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lk(l->mu);
    n->seq = l->seq++;
    // After every node with threshold <= this one (equal thresholds: arming order). Walk from
    // the tail: thresholds armed in increasing order (the usual chain) insert in O(1).
    trigger_node* after = l->tail;
    while (after != nullptr && after->threshold > threshold) after = after->prev;
    n->prev = after;
    n->next = after ? after->next : l->head;
    (n->next ? n->next->prev : l->tail) = n;
    (after ? after->next : l->head) = n;
    l->next.store(l->head->threshold, std::memory_order_seq_cst);
    if ((s.watch.load(std::memory_order_relaxed) & watch_triggers) == 0)
      s.watch.fetch_or(watch_triggers, std::memory_order_seq_cst);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Dekker with the updates (compcntr:trigger): an update that missed this arm is seen here.
  // Already reached: fire now (inline: in this thread, before arm returns).
  if (s.value_seq_cst() >= threshold) fire_slot_triggers(s);
  if (shared) [[unlikely]]
    shared_watch_kick(s); // after watch_triggers is set: a parked watcher registers and scans
  ec.clear();
  return n;
}

trigger_node* arm_counter_trigger(slot& s, std::uint64_t threshold, slot& target,
                                  std::uint64_t operand, bool set, std::error_code& ec) noexcept {
  if (!take_counter_ref(target)) {
    fail_into(ec, EINVAL, "trigger_arm_%s: the target counter %u is being destroyed",
              set ? "set" : "add", target.index);
    return nullptr;
  }
  // The action's context: the target and the operand, allocated before arming (the trigger
  // may fire inside arm_trigger, so its context must be complete first); freed at destroy.
  struct holder {
    slot* target;
    std::uint64_t operand;
  };
  auto* h = new (std::nothrow) holder{&target, operand};
  if (h == nullptr) {
    unref_counter_slot(target);
    fail_into(ec, ENOMEM, "trigger_arm_%s: out of memory", set ? "set" : "add");
    return nullptr;
  }
  auto run_add = [](void* p, int status) {
    if (status == 0) static_cast<holder*>(p)->target->add(static_cast<holder*>(p)->operand);
  };
  auto run_set = [](void* p, int status) {
    if (status == 0) static_cast<holder*>(p)->target->set(static_cast<holder*>(p)->operand);
  };
  auto dispose = [](void* p) { delete static_cast<holder*>(p); };
  trigger_node* n =
      arm_trigger(s, threshold, set ? +run_set : +run_add, h, dispose, trigger_inline, &target, ec);
  if (n == nullptr) delete h; // arm_trigger dropped the target reference
  return n;
}

int cancel_trigger(trigger_node& n) noexcept {
  std::uint32_t st = n.st.load(std::memory_order_acquire);
  if (st == st_armed) {
    trigger_list& l = *n.list;
    bool won = false;
    {
      std::lock_guard lk(l.mu);
      if (n.st.load(std::memory_order_relaxed) == st_armed) {
        unlink_armed(l, n);
        n.st.store(st_cancelling, std::memory_order_relaxed);
        publish_next(l);
        won = true;
      }
    }
    if (won) {
      run_action(l, n, ECANCELED);
      finish_node(n, st_cancelled);
      return 0;
    }
    st = n.st.load(std::memory_order_acquire);
  }
  if (st == st_queued &&
      n.st.compare_exchange_strong(st, st_cancelling, std::memory_order_acq_rel)) {
    {
      std::lock_guard qk(n.queue->mu);
      if (n.in_queue) n.queue->unlink_locked(n);
    }
    run_action(*n.list, n, ECANCELED);
    finish_node(n, st_cancelled);
    return 0;
  }
  return EALREADY;
}

int destroy_trigger(trigger_node* n) noexcept {
  // From inside its own action: refused (it would free the node under the running action).
  if (tl_running_node == n)
    return fail(EDEADLK, "trigger_destroy: called from the trigger's own action (destroy it after "
                         "the action returned)")
        .value();
  cancel_trigger(*n);
  // Wait for a running action (fired or cancelled by another thread) to return.
  {
    for (std::uint32_t st = n->st.load(std::memory_order_acquire);
         st != st_fired && st != st_cancelled; st = n->st.load(std::memory_order_acquire))
      n->st.wait(st, std::memory_order_acquire);
  }
  if (n->dispose != nullptr) n->dispose(n->ctx);
  if (n->target != nullptr) unref_counter_slot(*n->target);
  list_unref(n->list);
  delete n;
  return 0;
}

int trigger_node_state(const trigger_node& n) noexcept {
  switch (n.st.load(std::memory_order_acquire)) {
    case st_fired: return trigger_state_fired;
    case st_cancelled: return trigger_state_cancelled;
    default: return trigger_state_armed;
  }
}

std::uint64_t trigger_node_threshold(const trigger_node& n) noexcept { return n.threshold; }

std::size_t flush_slot_triggers(slot& s) noexcept {
  trigger_list* l = list_of(s);
  if (l == nullptr) return 0;
  return cancel_all(*l, find_queue(*s.owner), false);
}

void end_slot_triggers(slot& s) noexcept {
  trigger_list* l = list_of(s);
  if (l == nullptr) return;
  cancel_all(*l, find_queue(*s.owner), true);
  // Nothing of this counter runs after its destroy returns: wait for its running actions (but
  // for one this thread is inside of: the destroy came from it).
  const std::uint32_t self = tl_running == l ? 1 : 0;
  for (std::uint32_t b = l->busy.load(std::memory_order_acquire); b > self;
       b = l->busy.load(std::memory_order_acquire))
    l->busy.wait(b, std::memory_order_acquire);
}

void release_trigger_list(trigger_list* l) noexcept { list_unref(l); }

trigger_list* shared_due_triggers(slot& s) noexcept {
  trigger_list* l = list_of(s);
  if (l == nullptr) return nullptr;
  // The watcher's scan: seq_cst loads after its registration in the segment's sleeper count
  // (compcntr:shared), as fire_slot_triggers' test after an update.
  if (s.value_seq_cst() < l->next.load(std::memory_order_seq_cst)) return nullptr;
  l->refs.fetch_add(1, std::memory_order_relaxed); // the caller holds the slot: l is alive
  return l;
}

void shared_fire_triggers(trigger_list* l) noexcept {
  ++tl_depth;
  fire_list(*l); // nothing if the counter is gone (dead, checked under its lock)
  drain_pending();
  --tl_depth;
  list_unref(l);
}

std::size_t run_device_triggers(device_core& dev) noexcept {
  trigger_queue* q = find_queue(dev);
  if (q == nullptr || q->count.load(std::memory_order_relaxed) == 0 || tl_in_progress) return 0;
  tl_in_progress = true;
  std::size_t ran = 0;
  while (run_one(*q)) ++ran;
  tl_in_progress = false;
  return ran;
}

std::error_code start_trigger_service(device_core& dev) noexcept {
  trigger_queue* q = ensure_queue(dev);
  if (q == nullptr) return fail(ENOMEM, "trigger_service_start: out of memory");
  std::lock_guard lk(q->thread_mu);
  if (q->thread.joinable())
    return fail(EALREADY, "trigger_service_start: the device's trigger service already runs");
  q->stopping.store(false, std::memory_order_seq_cst);
  try {
    q->thread = std::thread([q] { q->serve(); });
  } catch (...) {
    return fail(EAGAIN, "trigger_service_start: cannot create the service thread");
  }
  return {};
}

std::error_code stop_trigger_service(device_core& dev) noexcept {
  trigger_queue* q = find_queue(dev);
  if (q == nullptr) return fail(EALREADY, "trigger_service_stop: no trigger service runs");
  std::lock_guard lk(q->thread_mu);
  if (!q->thread.joinable()) return fail(EALREADY, "trigger_service_stop: no trigger service runs");
  q->join_thread();
  return {};
}

} // namespace compcntr::detail

namespace compcntr {

trigger trigger::arm(counter_view c, std::uint64_t threshold, detail::trigger_action fn, void* ctx,
                     trigger_mode mode, std::error_code& ec) noexcept {
  if (!c) {
    detail::fail_into(ec, EINVAL, "trigger_arm: the counter is empty (moved from or destroyed)");
    return {};
  }
  return trigger(detail::arm_trigger(*c.native_slot(), threshold, fn, ctx, nullptr,
                                     static_cast<std::uint32_t>(mode), nullptr, ec));
}

trigger trigger::arm_add(counter_view c, std::uint64_t threshold, counter_view target,
                         std::uint64_t n, std::error_code& ec) noexcept {
  if (!c || !target) {
    detail::fail_into(ec, EINVAL, "trigger_arm_add: the %s counter is empty",
                      !c ? "triggering" : "target");
    return {};
  }
  return trigger(detail::arm_counter_trigger(*c.native_slot(), threshold, *target.native_slot(), n,
                                             false, ec));
}

trigger trigger::arm_set(counter_view c, std::uint64_t threshold, counter_view target,
                         std::uint64_t v, std::error_code& ec) noexcept {
  if (!c || !target) {
    detail::fail_into(ec, EINVAL, "trigger_arm_set: the %s counter is empty",
                      !c ? "triggering" : "target");
    return {};
  }
  return trigger(
      detail::arm_counter_trigger(*c.native_slot(), threshold, *target.native_slot(), v, true, ec));
}

} // namespace compcntr
