// Triggered operations (compcntr:trigger): firing and cancellation. The objects and their state
// machine: the internal partition compcntr:trigger_impl (src/core/trigger/trigger_impl.cppm);
// semantics and memory ordering: the file comment of modules/core/trigger.cppm; the table of
// guarantees: docs/trigger.md. Arming is in arm.cpp, the deferred queue in queue.cpp.
//
// Firing is combined per counter: one thread at a time runs a counter's due triggers (`fire`),
// a thread that finds it busy leaves `fire_again` and the firing thread looks once more before it
// stops; so due triggers run in threshold order even when several threads cross thresholds at
// once. Chains are trampolined: an update made inside an action does not fire its counter's
// triggers recursively but puts the counter on the thread's pending list, which the outermost
// firing drains before it returns (stack depth 1 whatever the chain's length); an update of the
// counter whose batch runs makes that batch look again first, as another thread's update would.
module;
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include "core/wait/futex_mutex.hpp"  // trigger_list::mu (locked here)
module compcntr;
import :trigger_impl;

namespace compcntr::detail {

namespace {

// What this thread is doing with triggers, in one thread_local (one TLS lookup per fire: in a
// shared library each function's first thread_local access is a __tls_get_addr call).
struct thread_state {
  // The list and node of the action this thread runs now (an action runs no other action
  // nested: chains are trampolined, deferred progress does not nest), for end_slot_triggers and
  // destroy_trigger called from inside an action.
  trigger_list* running = nullptr;
  const trigger_node* running_node = nullptr;
  // The list whose deferred action (counted in its busy) this thread runs, or nullptr: an
  // inline action fired inside it may destroy that counter (end_slot_triggers).
  trigger_list* serving = nullptr;
  unsigned depth = 0;               // > 0 while inside fire_list (chains)
  trigger_list* pending = nullptr;  // counters updated inside actions
  // The list whose batch this thread's fire_list runs now: an action's update of that same
  // counter makes the batch look again when it ends (fire_again), as another thread's would,
  // before the counters on `pending`.
  trigger_list* firing = nullptr;
};
thread_local thread_state tl;

inline void run_action_in(thread_state& t, trigger_list& l, trigger_node& n, int status) noexcept {
  trigger_list* const saved = t.running;
  const trigger_node* const saved_node = t.running_node;
  t.running = &l;
  t.running_node = &n;
  if (n.mode == trigger_deferred && status == 0) [[unlikely]] {  // queue.cpp's run_one
    trigger_list* const saved_serving = t.serving;
    t.serving = &l;
    n.fn(n.ctx, status);
    t.serving = saved_serving;
  } else {
    n.fn(n.ctx, status);
  }
  t.running = saved;
  t.running_node = saved_node;
}

// An arm_add / arm_set node's effect (counter_op != op_call), applied without the action call or
// the running-action record: the update runs no caller code (a trigger it makes due on `target`
// is trampolined, fire_slot_triggers; a backend's hw_counter_ops add/set, the one foreign code it
// can reach, must not destroy counters).
[[gnu::always_inline]] inline void apply_counter_op(const trigger_node& n) noexcept {
  if (n.counter_op == op_add) [[likely]]
    n.target->add(n.operand);
  else
    n.target->set(n.operand);
}

// A due inline node: its counter op, or a caller's action through run_action_in.
[[gnu::always_inline]] inline void fire_node(thread_state& t, trigger_list& l,
                                             trigger_node& n) noexcept {
  if (n.counter_op != op_call) [[likely]]
    apply_counter_op(n);
  else
    run_action_in(t, l, n, 0);
}

} // namespace

void run_action(trigger_list& l, trigger_node& n, int status) noexcept {
  if (n.counter_op != op_call) {  // cancellation (ECANCELED: nothing to do); never deferred
    if (status == 0) apply_counter_op(n);
    return;
  }
  run_action_in(tl, l, n, status);
}

namespace {

// ---- firing ----

// Runs the due triggers of l, combined (see the file comment). Called with nothing locked.
//
// The protocol of l.fire: only a holder of l.mu moves it from fire_idle (to fire_running: this
// thread fires) or from fire_running to fire_again (an update found another thread firing: it
// must look once more); the firing thread runs the batch without the lock and leaves with one
// CAS fire_running -> fire_idle, or, finding fire_again, takes the lock and looks again. So a
// single due trigger costs the lock's two RMWs, the action and that CAS (no second lock round),
// and every update that makes a trigger due either finds nobody firing and fires, or leaves
// fire_again, which the firing thread sees before it stops (both sides are RMWs on l.fire or
// under l.mu: one order). The batch's last node is marked fired only after the CAS: until then
// it holds a reference on l, so l outlives the thread's last use of it even when an action
// destroyed the counter (its destroy does not wait for the batch it runs inside of). A
// destroyer that waits for the firing thread says so (fire_waited), and only then is it
// notified: the common exit is the CAS alone.
void fire_list(thread_state& t, trigger_list& l) noexcept {
  std::unique_lock lk(l.mu);
  if (l.dead) return;
  // seq_cst: the Dekker re-check against updates (compcntr:trigger's memory ordering).
  std::uint64_t v = l.s->value_seq_cst();
  if (l.fire.load(std::memory_order_relaxed) != fire_idle) {
    std::uint32_t f = fire_running;
    if (l.fire.compare_exchange_strong(f, fire_again, std::memory_order_relaxed)) return;
    if (f == fire_again) return;  // already told
    // fire_idle: the firing thread left between the load and the CAS: fire here.
  }
  if (l.head == nullptr || l.head->threshold > v) return;  // nothing due (a stale `next`)
  l.fire.store(fire_running, std::memory_order_relaxed);
  trigger_list* const outer_firing = t.firing;
  t.firing = &l;
  trigger_node* last = nullptr;  // the batch's last node, finished after the CAS (above)
  for (;;) {
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
    lk.unlock();
    if (q != nullptr) q->kick();
    if (batch != nullptr) {
      if (last != nullptr) finish_node(*last, st_fired);  // l is held by this batch's nodes
      for (trigger_node* n = batch; n != nullptr;) {
        trigger_node* const next = n->next;
        n->next = nullptr;
        fire_node(t, l, *n);
        if (next == nullptr) {
          last = n;
          break;
        }
        finish_node(*n, st_fired);  // n may be freed from here on
        n = next;
      }
    }
    // release: what the actions did happens before a destroyer's acquire of fire_idle.
    std::uint32_t f = fire_running;
    if (l.fire.compare_exchange_strong(f, fire_idle, std::memory_order_release,
                                       std::memory_order_relaxed))
      break;
    if ((f & fire_again) == 0) {  // fire_running | fire_waited: a destroyer waits for this
      l.fire.store(fire_idle, std::memory_order_release);
      l.fire.notify_all();
      break;
    }
    lk.lock();  // fire_again: an update found this thread firing; look once more
    if (l.dead) {  // destroyed (maybe by one of its own actions, which cancelled the rest)
      l.fire.store(fire_idle, std::memory_order_release);
      lk.unlock();
      l.fire.notify_all();
      break;
    }
    // Not dead, under the lock: no destroyer has set fire_waited (it does after `dead`).
    l.fire.store(fire_running, std::memory_order_relaxed);
    v = l.s->value_seq_cst();
  }
  t.firing = outer_firing;
  if (last != nullptr) finish_node(*last, st_fired);
}

// Takes a reference on l and puts it on this thread's pending list (chains).
void defer_to_pending(thread_state& t, trigger_list& l) noexcept {
  if (l.pending.exchange(true, std::memory_order_seq_cst)) return; // someone will look
  l.refs.fetch_add(1, std::memory_order_relaxed);
  l.pending_next = t.pending;
  t.pending = &l;
}

void drain_pending(thread_state& t) noexcept {
  while (trigger_list* l = t.pending) {
    t.pending = l->pending_next;
    l->pending_next = nullptr;
    // Cleared before looking (seq_cst): an update after this either finds it clear and
    // queues the list again, or happened before the value fire_list reads.
    l->pending.store(false, std::memory_order_seq_cst);
    fire_list(t, *l);
    list_unref(l);
  }
}

trigger_list* list_of(slot& s) noexcept {
  std::atomic<trigger_list*>* cell = slot_trigger_cell(s, false);
  return cell != nullptr ? cell->load(std::memory_order_acquire) : nullptr;
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
  thread_state& t = tl;
  if (t.depth > 0) { // inside an action: trampoline (bounded stack depth)
    // The counter whose batch this thread runs: fire_list only leaves fire_again (it fires
    // nothing nested), so the batch looks again as soon as it ends. Others: pending, run after
    // the batch in the reverse order of their first update (a stack).
    if (t.firing == l)
      fire_list(t, *l);
    else
      defer_to_pending(t, *l);
    return;
  }
  ++t.depth;
  fire_list(t, *l);
  drain_pending(t);
  --t.depth;
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
  if (tl.running_node == n)
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

std::size_t flush_slot_triggers(slot& s) noexcept {
  trigger_list* l = list_of(s);
  if (l == nullptr) return 0;
  return cancel_all(*l, find_queue(*s.dev), false);
}

void end_slot_triggers(slot& s) noexcept {
  trigger_list* l = list_of(s);
  if (l == nullptr) return;
  cancel_all(*l, find_queue(*s.dev), true);
  // Nothing of this counter runs after its destroy returns: wait for its running actions (but
  // for one this thread is inside of: the destroy came from it). A node of l in st_running that
  // this thread runs is either its inline batch (this thread holds l.fire) or a deferred action
  // (counted in busy); a cancelled action (st_cancelling) is neither.
  const thread_state& t = tl;
  const trigger_node* const mine =
      t.running == l && t.running_node->st.load(std::memory_order_relaxed) == st_running
          ? t.running_node
          : nullptr;
  // The firing thread notifies only when told (fire_waited; set after `dead`, so no new firing
  // starts and the bit is not lost to fire_list's plain stores, which happen only when !dead).
  if (mine == nullptr || mine->mode != trigger_inline)
    for (std::uint32_t f = l->fire.fetch_or(fire_waited, std::memory_order_acq_rel);
         (f & ~fire_waited) != fire_idle; f = l->fire.load(std::memory_order_acquire))
      l->fire.wait(f, std::memory_order_acquire);
  // This thread's own deferred action of l, if it runs inside one (directly, or an inline action
  // of l fired by an update inside it): counted in busy, not waited for.
  const std::uint32_t self = t.serving == l ? 1 : 0;
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
  thread_state& t = tl;
  ++t.depth;
  fire_list(t, *l); // nothing if the counter is gone (dead, checked under its lock)
  drain_pending(t);
  --t.depth;
  list_unref(l);
}

} // namespace compcntr::detail
