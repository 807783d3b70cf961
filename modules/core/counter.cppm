// compcntr:counter -- the completion counter (owner of one pool slot) and counter_view.
//
// Purpose: count finished operations in aggregate: a completion count and an error count, two
// independent unsigned 64-bit values that start at 0 and wrap at the device's max_value
// (UINT64_MAX for software counters). One surface, three ways to hold it: `counter` owns the
// slot, `counter_ref` (compcntr:counter_ref) keeps a resolved counter alive, `counter_view`
// only names it. Their operations are defined once (detail::counter_surface); every entry point
// that uses a counter takes a counter_view, to which the other two convert implicitly.
//
// Requirements: created by compcntr::device::create_counter. A counter is not copyable; moving
// leaves the source empty (operator bool false) and every operation on an empty one is
// undefined. A view must not outlive the counter it names.
// Guarantees:
//   * add()/add_error() never lose an update, from any number of threads.
//   * value()/errors() are one acquire load of the slot; on the software device an
//     update is visible to them as soon as the updating call returns.
//   * set()/set_error() replace a value; increments racing with them may be lost (verbs rule).
//   * the destructor destroys the counter; if a holder (QP attachment, counter_ref, bridge)
//     still has it, the slot lives on until the last one lets go (C++ RAII cannot fail).
//     destroy(ec) is the checked form: EBUSY while held, and the counter stays usable.
// Memory ordering: see compcntr:slot. Updates are seq_cst RMWs (release semantics for what the
// updater wrote before), reads are acquire. Operations are const (as std::atomic_ref's): a
// view or a const reference updates the counter it names.
//
// Example:
//     std::error_code ec;
//     auto dev = compcntr::device::open("soft", ec);
//     auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
//     c.add(3);  c.add_error(1);
//     compcntr::counter_view v = c;                         // what wait(), attach() ... take
//     assert(v.value() == 3 && v.errors() == 1);
module;
#include <atomic>
#include <cstdint>
#include <system_error>
#include <utility>
export module compcntr:counter;
import :slot;
import :lifetime;
import :shared;
import :types;
import :error;

namespace compcntr::detail {

/// The operations every counter type offers, defined once: counter (owner), counter_ref (counted
/// reference) and counter_view (no ownership) derive from it. `Self` provides native_slot().
/// Every operation on an empty object (operator bool false) is undefined, except operator bool.
template <class Self>
class counter_surface {
 public:
  inline explicit operator bool() const noexcept { return s() != nullptr; }

  /// Completion count (acquire load).
  inline std::uint64_t value() const noexcept { return s()->load_value(); }
  /// Error count (acquire load).
  inline std::uint64_t errors() const noexcept { return s()->load_errors(); }
  /// Completion count += n, wrapping past max_value.
  inline void add(std::uint64_t n = 1) const noexcept { s()->add(n); }
  /// Error count += n, wrapping past max_value.
  inline void add_error(std::uint64_t n = 1) const noexcept { s()->add_error(n); }
  /// Completion count = v.
  inline void set(std::uint64_t v) const noexcept { s()->set(v); }
  /// Error count = v.
  inline void set_error(std::uint64_t v) const noexcept { s()->set_error(v); }

  inline counter_type type() const noexcept { return s()->type; }
  /// Stripes of a striped counter (counter_options::stripes), 1 for a plain counter.
  inline std::uint32_t stripes() const noexcept { return s()->stripe_mask() + 1; }
  /// NUMA node whose memory holds this counter's slot.
  inline int numa_node() const noexcept { return s()->numa_node; }
  /// Index of the counter's slot in its device's pool (the C struct's `handle` field).
  inline std::uint32_t index() const noexcept { return s()->index; }
  /// A name for this counter that can outlive it: device::resolve() turns it back into access
  /// to this counter while it lives, and reports ESTALE once it is destroyed (even after its
  /// slot went to a new counter). Memory ordering: relaxed load of the slot's generation, which
  /// only changes when the slot is freed (never while the counter lives). A shared counter's
  /// id names its cell in the segment (compcntr:shared): it resolves in every process.
  inline counter_id id() const noexcept {
    if (detail::is_shared(*s())) [[unlikely]]
      return detail::shared_counter_id(*s());
    return {s()->generation.load(std::memory_order_relaxed), s()->index};
  }
  /// The former name of id() (until 0.2; "handle" is the C struct's slot index).
  [[deprecated("use id()")]] inline counter_id handle() const noexcept { return id(); }

 protected:
  counter_surface() noexcept = default;
  ~counter_surface() = default;

 private:
  inline slot* s() const noexcept { return static_cast<const Self*>(this)->native_slot(); }
};

} // namespace compcntr::detail

export namespace compcntr {

class device;

/// A non-owning view of a live counter: what every entry point that only uses a counter takes
/// (wait, poll_any, pollable_fd, qp::attach, cmd_completion::query, ...). A counter and a
/// counter_ref convert to it implicitly. Copyable, one pointer; it does not keep the counter
/// alive: the counter must outlive every use of the view (as with a reference). Empty when
/// default-constructed or made from an empty counter.
class counter_view : public detail::counter_surface<counter_view> {
 public:
  constexpr counter_view() noexcept = default;
  /// A view of the counter in `s` (for the library's layers and adapters).
  inline explicit counter_view(detail::slot* s) noexcept : s_(s) {}

  inline plugin::slot* native_slot() const noexcept { return s_; }
  /// Two views are equal when they name the same counter (or are both empty).
  friend bool operator==(counter_view a, counter_view b) noexcept { return a.s_ == b.s_; }

 private:
  detail::slot* s_ = nullptr;
};

namespace detail {
struct counter_access;
}

/// The completion counter (see the file comment). Move-only owner of its slot.
class counter : public detail::counter_surface<counter> {
 public:
  counter() noexcept = default;
  inline counter(counter&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  inline counter& operator=(counter&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  counter(const counter&) = delete;
  counter& operator=(const counter&) = delete;
  inline ~counter() { reset(); }

  /// A non-owning view of this counter (empty if this counter is).
  inline operator counter_view() const noexcept { return counter_view(s_); }
  inline counter_view view() const noexcept { return counter_view(s_); }

  /// Destroys the counter now. EBUSY (and the counter stays usable) while a QP counts into it,
  /// a counter_ref holds it, or a bridge is bound to it (compcntr:lifetime).
  inline void destroy(std::error_code& ec) noexcept {
    if (auto e = detail::destroy_counter_slot(*s_)) {
      ec = e;
      return;
    }
    s_ = nullptr;
    ec.clear();
  }
  /// Destroys the counter; a still-attached slot lives on until its last holder lets go.
  inline void reset() noexcept {
    if (detail::slot* s = std::exchange(s_, nullptr)) detail::unref_counter_slot(*s);
  }

  /// The slot (for the library's other layers: waits, QPs, adapters).
  inline plugin::slot* native_slot() const noexcept { return s_; }

 private:
  friend class device;
  friend struct detail::counter_access;
  inline explicit counter(detail::slot* s) noexcept : s_(s) {}
  detail::slot* s_ = nullptr;
};

namespace detail {
/// For the C API: a counter object over a reference the caller holds on `s` (it becomes the
/// object's; the C API's resolved references are counter objects, refused by destroy).
struct counter_access {
  static inline counter adopt(slot* s) noexcept { return counter(s); }
};
} // namespace detail

} // namespace compcntr
