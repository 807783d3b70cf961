// compcntr:counter_ref -- access to a counter through a kept handle, and its race semantics.
//
// Purpose: runtimes keep counters in tables (per request, per peer, per window) and look them up
// later, possibly after the counter was destroyed and its slot given to a new counter. A
// compcntr::counter_handle (counter::handle()) names one counter, not one slot: it carries the
// slot's generation, which the pool bumps on every release. device::resolve(handle, ec) checks
// it and returns a counter_ref, a reference that keeps the counter alive while it is held.
//
// Requirements: resolve with the device whose counter produced the handle (a handle of another
// device's counter names an unrelated slot). A counter_ref is move-only; while it lives, it keeps
// its counter, and through it the device, alive.
// Guarantees (race semantics):
//   * resolve() is linearised at its CAS on the slot's reference count. If the counter's last
//     reference was dropped before that point (destroy(), reset(), end of a counter_ref), the
//     result is ESTALE, whatever the slot holds now. Otherwise the counter_ref holds a reference:
//     the counter stays alive and keeps its slot until the counter_ref is dropped, even if its
//     owner destroys it meanwhile (the owner's destroy(ec) is EBUSY while a counter_ref or a QP
//     attachment holds it; its reset() / destructor leave the slot to the last holder).
//   * an operation through a counter_ref never touches another counter: a handle of a destroyed
//     counter is rejected before any write, even when its slot already belongs to a new counter.
//   * one narrow window, stated honestly: resolve() reads the generation, CASes the reference
//     count, then re-reads the generation. If the handle is stale and the slot is released and
//     handed to a new counter exactly between the first read and the CAS, resolve() holds a
//     reference to the NEW counter for the few nanoseconds until its second read rejects it. It
//     never reads or writes the new counter's values, but a destroy(ec) of the new counter in
//     that window returns EBUSY (its reset() is unaffected: the reference is dropped by resolve,
//     which then finishes the destruction). A stale handle resolved after its counter's
//     destruction is complete is rejected by the first read, without touching the slot's
//     reference count.
//   * the generation is 64 bits: a handle never wrongly matches a later owner in practice.
// Memory ordering: resolve(): acquire load of the generation, acquire CAS on refs (pairs with the
// release store of refs = 1 when the slot was handed to its current owner, so the generation
// bump of any earlier release is visible), acquire re-load of the generation. Operations through
// the ref are those of compcntr:slot. Dropping the ref is an acq_rel decrement of refs.
//
// Example:
//     auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
//     compcntr::counter_handle h = c.handle();
//     if (auto r = dev.resolve(h, ec)) r.add(1);          // the counter lives: counted
//     c.reset();                                           // destroyed
//     auto r2 = dev.resolve(h, ec);                        // empty, ec == ESTALE
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
class counter_ref {
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

  inline explicit operator bool() const noexcept { return s_ != nullptr; }

  /// As the counter operations of the same name (compcntr:counter, compcntr:slot). Explicitly
  /// `inline`: member functions of a named module are not implicitly inline in C++20.
  inline std::uint64_t value() const noexcept { return s_->load_value(); }
  inline std::uint64_t errors() const noexcept { return s_->load_errors(); }
  inline void add(std::uint64_t n = 1) noexcept { s_->add(n); }
  inline void add_error(std::uint64_t n = 1) noexcept { s_->add_error(n); }
  inline void set(std::uint64_t v) noexcept { s_->set(v); }
  inline void set_error(std::uint64_t v) noexcept { s_->set_error(v); }
  inline counter_type type() const noexcept { return s_->type; }
  inline int numa_node() const noexcept { return s_->numa_node; }
  inline std::uint32_t index() const noexcept { return s_->index; }
  inline counter_handle handle() const noexcept {
    return {s_->generation.load(std::memory_order_relaxed), s_->index};
  }

  /// Drops the reference; if the counter's owner destroyed it meanwhile, this destroys it.
  inline void reset() noexcept {
    if (detail::slot* s = std::exchange(s_, nullptr)) detail::unref_counter_slot(*s);
  }

  inline detail::slot* native_slot() const noexcept { return s_; }

 private:
  friend class device;
  inline explicit counter_ref(detail::slot* s) noexcept : s_(s) {}
  detail::slot* s_ = nullptr;
};

}  // namespace compcntr
