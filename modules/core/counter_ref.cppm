// compcntr:counter_ref -- access to a counter through a kept counter_id, and its race semantics.
//
// Purpose: runtimes keep counters in tables (per request, per peer, per window) and look them up
// later, possibly after the counter was destroyed and its slot given to a new counter. A
// compcntr::counter_id (counter::id()) names one counter, not one slot: it carries the slot's
// generation, bumped whenever the slot is freed. device::resolve(id, ec) checks it and returns a
// counter_ref: a counted reference that keeps the counter (and its device) alive while held.
//
// Requirements: resolve with the device whose counter produced the id. Move-only.
// Guarantees (race semantics; the full statement, with its one narrow window, is in
// docs/pool.md "Race semantics"):
//   * resolve() is linearised at its CAS on the slot's reference count: if the counter's last
//     reference was dropped before, the result is ESTALE whatever the slot holds now; otherwise
//     the ref keeps the counter alive until dropped (the owner's destroy(ec) is EBUSY meanwhile,
//     its reset() leaves the slot to the last holder).
//   * an operation through a counter_ref never touches another counter: an id of a destroyed
//     counter is rejected before any write, even when its slot already belongs to a new counter.
//   * the generation is 64 bits: an id never wrongly matches a later owner in practice.
// Memory ordering: resolve() is an acquire load of the generation, an acq_rel CAS on refs (pairs
// with reset_slot's release store, so the generation bump of an earlier free is visible), and
// an acquire re-load of the generation (compcntr:lifetime). Dropping the ref is an acq_rel
// decrement. Operations through the ref are those of compcntr:slot.
//
// Example:
//     compcntr::counter_id id = c.id();
//     if (auto r = dev.resolve(id, ec)) r.add(1);         // the counter lives: counted
//     c.reset();                                           // destroyed
//     auto r2 = dev.resolve(id, ec);                       // empty, ec == ESTALE
module;
#include <atomic>
#include <cstdint>
#include <system_error>
#include <utility>
export module compcntr:counter_ref;
import :slot;
import :lifetime;
import :pool;
import :types;
import :counter;

export namespace compcntr {

class device;

/// A counted reference to a live counter, obtained from device::resolve(). Empty when
/// default-constructed, moved from, or after reset(); operations on an empty ref are undefined.
class counter_ref : public detail::counter_surface<counter_ref> {
 public:
  counter_ref() noexcept = default;
  inline counter_ref(counter_ref&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  inline counter_ref& operator=(counter_ref&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  counter_ref(const counter_ref&) = delete;
  counter_ref& operator=(const counter_ref&) = delete;
  inline ~counter_ref() { reset(); }

  /// value(), add(), id(), ...: the counter operations (compcntr:counter), shared.
  /// A non-owning view of the referenced counter (valid while this ref is held).
  inline operator counter_view() const noexcept { return counter_view(s_); }
  inline counter_view view() const noexcept { return counter_view(s_); }

  /// Drops the reference; if the counter's owner destroyed it meanwhile, this destroys it.
  inline void reset() noexcept {
    if (detail::slot* s = std::exchange(s_, nullptr)) detail::unref_counter_slot(*s);
  }

  inline plugin::slot* native_slot() const noexcept { return s_; }
  /// Gives the reference up without dropping it (the ref is empty after): the caller drops it
  /// later with detail::unref_counter_slot (the C API's compcntr_comp_cntr_release does).
  inline detail::slot* release() noexcept { return std::exchange(s_, nullptr); }

 private:
  friend class device;
  inline explicit counter_ref(detail::slot* s) noexcept : s_(s) {}
  detail::slot* s_ = nullptr;
};

} // namespace compcntr
