// compcntr:trigger -- triggered operations: an action that runs once a counter reaches a value.
//
// Purpose: "when this counter reaches N, do that" (fi_trigger(3) FI_TRIGGER_THRESHOLD, Portals 4
// triggered operations): chains of counter updates without the caller (arm_add/arm_set), and
// network operations posted when their inputs are complete (deferred actions, ofi_compcntr).
//
// Requirements: the counter outlives arm(); a trigger's action must not destroy its own
// trigger (destroy waits for a running action); actions run with no compcntr lock held, so they
// may update counters (chains), arm and cancel other triggers, and destroy counters.
// Guarantees (docs/trigger.md has the table):
//   * the action runs exactly once: status 0 once the completion value was seen >= threshold
//     (unsigned 64-bit), or ECANCELED when cancelled, flushed, or its counter destroyed first;
//   * per counter, due triggers run in threshold order, equal thresholds in arming order, however
//     they were armed; error completions fire nothing (they do not move the completion value);
//     set() at or above a threshold fires it, below leaves it armed; thresholds are values, not
//     distances (an add that wraps past max_value does not fire what it passed over);
//   * trigger_mode::immediate: in the thread of an update that made it due (or the thread
//     already running that counter's due triggers), before that update call returns; a chain
//     (an action updating a counter with triggers) runs iteratively: bounded stack depth;
//   * trigger_mode::deferred: queued on the device when due, run by run_deferred_triggers() or
//     the device's trigger service thread;
//   * destroying a counter cancels its triggers (ECANCELED) and waits for its running actions:
//     nothing of that counter's runs after the destroy returns (unless the destroy runs inside
//     one of them);
//   * a counter with no armed trigger pays nothing: triggers ride on slot::watch
//     (watch_triggers), which an update reads anyway.
// Memory ordering: an update is a seq_cst RMW followed by a seq_cst load of `watch`; arming
// inserts under the counter's trigger lock, publishes the lowest threshold (seq_cst store), sets
// watch_triggers (seq_cst RMW) and re-reads the value (seq_cst): the Dekker pairing of
// compcntr:slot, so either the update sees the trigger or the arm sees the update. The thread
// that fires read the value >= threshold with a seq_cst load, so what the updater wrote before
// the update that made a trigger due is visible to the action. Cancel/fire/destroy decide under
// the counter's trigger lock (armed triggers) or by a CAS on the trigger's state (due deferred
// triggers): exactly one of them wins.
//
// Example:
//     std::error_code ec;
//     auto t = compcntr::trigger::arm_add(inputs, 4, ready, 1, ec);   // ready += 1 at inputs == 4
//     for (int i = 0; i < 4; ++i) inputs.add(1);                       // the 4th add runs it
//     assert(ready.value() == 1 && t.state() == compcntr::trigger_state::fired);
module;
#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>
export module compcntr:trigger;
import :slot;
import :backend;
import :counter;
import :device;
import :error;

namespace compcntr::detail {

struct trigger_node;  // src/core/trigger/trigger.cpp
/// An action: ctx, and 0 (reached) or ECANCELED.
using trigger_action = void (*)(void* ctx, int status);
/// Values of compcntr_trigger_state / trigger_state.
inline constexpr int trigger_state_armed = 0, trigger_state_fired = 1, trigger_state_cancelled = 2;
/// Modes (the C flags' values).
inline constexpr std::uint32_t trigger_inline = 1, trigger_deferred = 2;

/// Arms `fn(ctx, .)` on `s` at `threshold`. `dispose(ctx)` (if set) runs when the trigger is
/// destroyed; `target` (if set) is a counter reference the trigger owns from now on, dropped
/// at destroy (also on failure). nullptr and ec on failure (EINVAL, ENOMEM).
trigger_node* arm_trigger(slot& s, std::uint64_t threshold, trigger_action fn, void* ctx,
                          void (*dispose)(void*), std::uint32_t mode, slot* target,
                          std::error_code& ec) noexcept;
/// arm_add / arm_set: target += / = operand when due (inline). Takes a reference on target.
trigger_node* arm_counter_trigger(slot& s, std::uint64_t threshold, slot& target,
                                  std::uint64_t operand, bool set, std::error_code& ec) noexcept;
/// 0 (cancelled: fn ran with ECANCELED) or EALREADY.
int cancel_trigger(trigger_node& t) noexcept;
/// Cancels if not fired, waits for a running action, frees: 0; EDEADLK (nothing changes) from
/// inside the trigger's own action.
int destroy_trigger(trigger_node* t) noexcept;
int trigger_node_state(const trigger_node& t) noexcept;
std::uint64_t trigger_node_threshold(const trigger_node& t) noexcept;
/// Cancels every trigger of `s` that has not fired; how many.
std::size_t flush_slot_triggers(slot& s) noexcept;
/// slot::notify_slow when watch_triggers is set: runs or queues what is due.
void fire_slot_triggers(slot& s) noexcept;
/// The free path (refs 0): cancels every trigger of `s`, waits for its running actions.
void end_slot_triggers(slot& s) noexcept;
struct trigger_list;
/// The extension block's reference on the counter's trigger list, dropped when it is freed.
void release_trigger_list(trigger_list* l) noexcept;
/// For the fd watcher of a shared device (compcntr:shared), with `s` registered (alive): its
/// trigger list with a reference taken when an armed threshold is reached, else nullptr.
trigger_list* shared_due_triggers(slot& s) noexcept;
/// Fires what is due on a list from shared_due_triggers (inline actions on the calling thread,
/// deferred ones queued), nothing locked by the caller; drops the reference.
void shared_fire_triggers(trigger_list* l) noexcept;
/// The cell of the slot's extension block that holds its trigger list; with `create`, the block
/// is allocated if missing (nullptr: ENOMEM); without, nullptr when there is no block.
/// (src/core/wait/ext.cpp)
std::atomic<trigger_list*>* slot_trigger_cell(slot& s, bool create) noexcept;
/// Runs the due deferred actions of `dev`; how many ran.
std::size_t run_device_triggers(device_core& dev) noexcept;
std::error_code start_trigger_service(device_core& dev) noexcept;
std::error_code stop_trigger_service(device_core& dev) noexcept;

} // namespace compcntr::detail

export namespace compcntr {

/// Where a trigger's action runs (the file comment).
enum class trigger_mode : std::uint32_t {
  immediate = detail::trigger_inline,  ///< in the updating thread (C: COMPCNTR_TRIGGER_INLINE)
  deferred = detail::trigger_deferred,  ///< by run_deferred_triggers() / the service thread
};
/// What became of a trigger's action.
enum class trigger_state : int {
  armed = detail::trigger_state_armed,          ///< not run yet
  fired = detail::trigger_state_fired,          ///< ran with status 0
  cancelled = detail::trigger_state_cancelled,  ///< ran with ECANCELED
};

/// One armed action (see the file comment). Move-only owner: the destructor is destroy().
class trigger {
 public:
  trigger() noexcept = default;
  inline trigger(trigger&& o) noexcept : n_(std::exchange(o.n_, nullptr)) {}
  inline trigger& operator=(trigger&& o) noexcept {
    if (this != &o) {
      reset();
      n_ = std::exchange(o.n_, nullptr);
    }
    return *this;
  }
  trigger(const trigger&) = delete;
  trigger& operator=(const trigger&) = delete;
  inline ~trigger() { reset(); }

  /// Arms fn(ctx, status) on c at threshold. A threshold already reached fires at once, as the
  /// mode says (immediate: before arm returns). Empty trigger + ec on failure: EINVAL (empty
  /// counter, null fn, unknown mode), ENOMEM.
  static trigger arm(counter_view c, std::uint64_t threshold, detail::trigger_action fn, void* ctx,
                     trigger_mode mode, std::error_code& ec) noexcept;
  /// The same with a callable f(int status), kept until the trigger is destroyed.
  template <class F>
    requires std::is_invocable_v<F&, int>
  static trigger arm(counter_view c, std::uint64_t threshold, trigger_mode mode, F f,
                     std::error_code& ec) noexcept {
    auto* held = new (std::nothrow) F(std::move(f));
    if (held == nullptr) {
      detail::fail_into(ec, ENOMEM, "trigger_arm: out of memory for the action");
      return {};
    }
    return arm_held(c, threshold, mode, held, ec);
  }
  /// target += n when c reaches threshold (fi_trigger FI_OP_CNTR_ADD), inline. The trigger
  /// holds a reference on target until destroyed (target.destroy() is EBUSY until then).
  static trigger arm_add(counter_view c, std::uint64_t threshold, counter_view target,
                         std::uint64_t n, std::error_code& ec) noexcept;
  /// target = v when c reaches threshold (FI_OP_CNTR_SET), inline; as arm_add.
  static trigger arm_set(counter_view c, std::uint64_t threshold, counter_view target,
                         std::uint64_t v, std::error_code& ec) noexcept;

  inline explicit operator bool() const noexcept { return n_ != nullptr; }
  /// {} (cancelled: the action ran with ECANCELED before this returned) or
  /// std::errc::connection_already_in_progress (EALREADY: it fired, is firing, or was
  /// cancelled before).
  inline std::errc cancel() noexcept { return static_cast<std::errc>(detail::cancel_trigger(*n_)); }
  inline trigger_state state() const noexcept {
    return static_cast<trigger_state>(detail::trigger_node_state(*n_));
  }
  inline std::uint64_t threshold() const noexcept { return detail::trigger_node_threshold(*n_); }
  /// Cancels the action if it has not run, waits for it if it runs now, frees the trigger.
  /// Not from inside the trigger's own action: that is refused (EDEADLK through destroy(ec))
  /// and reset() then leaves the trigger allocated (a leak rather than a freed running action).
  inline void reset() noexcept {
    if (detail::trigger_node* n = std::exchange(n_, nullptr)) (void)detail::destroy_trigger(n);
  }
  /// The checked reset(): EDEADLK (and this trigger still owns it) from inside its own action.
  inline void destroy(std::error_code& ec) noexcept {
    ec.clear();
    if (n_ == nullptr) return;
    if (int e = detail::destroy_trigger(n_)) {
      ec.assign(e, std::generic_category());
      return;
    }
    n_ = nullptr;
  }
  inline detail::trigger_node* native() const noexcept { return n_; }
  /// Takes ownership of a node armed through the detail functions (the C API).
  static inline trigger adopt(detail::trigger_node* n) noexcept { return trigger(n); }
  /// Gives the node up (the C API keeps it).
  inline detail::trigger_node* release() noexcept { return std::exchange(n_, nullptr); }

 private:
  inline explicit trigger(detail::trigger_node* n) noexcept : n_(n) {}
  template <class F>
  static trigger arm_held(counter_view c, std::uint64_t threshold, trigger_mode mode, F* held,
                          std::error_code& ec) noexcept {
    auto run = [](void* p, int status) { (*static_cast<F*>(p))(status); };
    auto dispose = [](void* p) { delete static_cast<F*>(p); };
    if (!c) {
      delete held;
      detail::fail_into(ec, EINVAL, "trigger_arm: the counter is empty (moved from or destroyed)");
      return {};
    }
    detail::trigger_node* n = detail::arm_trigger(*c.native_slot(), threshold, run, held, dispose,
                                                  static_cast<std::uint32_t>(mode), nullptr, ec);
    if (n == nullptr) delete held;
    return trigger(n);
  }
  detail::trigger_node* n_ = nullptr;
};

/// Cancels every trigger of c that has not fired (each action gets ECANCELED before this
/// returns); how many. c must not be empty.
inline std::size_t flush_triggers(counter_view c) noexcept {
  return detail::flush_slot_triggers(*c.native_slot());
}
/// Runs the due deferred actions of dev (in the order they became due); how many ran.
/// Thread-safe; 0 from inside an action (no nesting).
inline std::size_t run_deferred_triggers(device& dev) noexcept {
  return detail::run_device_triggers(*dev.core());
}
/// Starts a thread of dev that runs its deferred actions as they become due (asleep while
/// none is); stopped by stop_trigger_service or when the device closes. EALREADY if running.
inline std::error_code start_trigger_service(device& dev) noexcept {
  return detail::start_trigger_service(*dev.core());
}
/// EALREADY if not running. Waits for the thread to end (not from inside an action).
inline std::error_code stop_trigger_service(device& dev) noexcept {
  return detail::stop_trigger_service(*dev.core());
}

} // namespace compcntr
