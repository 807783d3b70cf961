// Triggered operations (compcntr:trigger): arming. Holds arm_trigger (the counter's list
// created on first use, the insert in (threshold, arming order), the Dekker re-check that fires
// a threshold already reached), arm_counter_trigger (arm_add / arm_set), a trigger's state
// queries, and the public compcntr::trigger::arm* calls. The objects: compcntr:trigger_impl
// (src/core/trigger/trigger_impl.cppm); firing and cancellation: trigger.cpp.
module;
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <new>
#include <system_error>
#include "core/wait/futex_mutex.hpp"  // trigger_list::mu (locked here)
module compcntr;
import :trigger_impl;

namespace compcntr::detail {

namespace {

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

// arm_trigger with the node's counter operation (op_call for a caller's action): set before the
// node is published, since it may fire before arming returns.
trigger_node* arm_node(slot& s, std::uint64_t threshold, trigger_action fn, void* ctx,
                       void (*dispose)(void*), std::uint32_t mode, slot* target,
                       std::uint32_t counter_op, std::uint64_t operand,
                       std::error_code& ec) noexcept;

} // namespace

trigger_node* arm_trigger(slot& s, std::uint64_t threshold, trigger_action fn, void* ctx,
                          void (*dispose)(void*), std::uint32_t mode, slot* target,
                          std::error_code& ec) noexcept {
  return arm_node(s, threshold, fn, ctx, dispose, mode, target, op_call, 0, ec);
}

namespace {

trigger_node* arm_node(slot& s, std::uint64_t threshold, trigger_action fn, void* ctx,
                       void (*dispose)(void*), std::uint32_t mode, slot* target,
                       std::uint32_t counter_op, std::uint64_t operand,
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
  if (mode == trigger_deferred && (q = ensure_queue(*s.dev)) == nullptr)
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
  n->operand = operand;
  n->counter_op = counter_op;
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

} // namespace

trigger_node* arm_counter_trigger(slot& s, std::uint64_t threshold, slot& target,
                                  std::uint64_t operand, bool set, std::error_code& ec) noexcept {
  if (!take_counter_ref(target)) {
    fail_into(ec, EINVAL, "trigger_arm_%s: the target counter %u is being destroyed",
              set ? "set" : "add", target.index);
    return nullptr;
  }
  // The node itself holds the target (a reference it owns) and the operand; the firing code
  // applies them (trigger.cpp, fire_node). `fn` is never called for such a node but must
  // not be null: a cancellation calls it with ECANCELED, as for every node.
  auto nothing = [](void*, int) {};
  return arm_node(s, threshold, +nothing, nullptr, nullptr, trigger_inline, &target,
                  set ? op_set : op_add, operand, ec);
}

int trigger_node_state(const trigger_node& n) noexcept {
  switch (n.st.load(std::memory_order_acquire)) {
    case st_fired: return trigger_state_fired;
    case st_cancelled: return trigger_state_cancelled;
    default: return trigger_state_armed;
  }
}

std::uint64_t trigger_node_threshold(const trigger_node& n) noexcept { return n.threshold; }

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
