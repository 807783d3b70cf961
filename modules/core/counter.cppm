// compcntr:counter -- the completion counter, a move-only owner of one pool slot.
//
// Purpose: count finished operations in aggregate: a completion count and an error count, two
// independent unsigned 64-bit values that start at 0 and wrap at the device's max_value
// (UINT64_MAX for software counters).
//
// Requirements: created by compcntr::device::create_counter. Not copyable; moving leaves the
// source empty (operator bool is false) and every operation on an empty counter is undefined.
// Guarantees:
//   * add()/add_error() never lose an update, from any number of threads.
//   * value()/errors() are one acquire load of the slot (the "mirror"); on the software device an
//     update is visible to them as soon as the updating call returns.
//   * set()/set_error() replace a value; increments racing with them may be lost (verbs rule).
//   * the destructor destroys the counter; if a QP still counts into it the slot stays alive
//     until the last such QP is destroyed (C++ RAII cannot fail). destroy(ec) is the checked form:
//     EBUSY while attached, and the counter stays usable.
// Memory ordering: see compcntr:slot. Updates are seq_cst RMWs (release semantics for what the
// updater wrote before), reads are acquire.
//
// Example:
//     std::error_code ec;
//     auto dev = compcntr::device::open("soft", ec);
//     auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
//     c.add(3);  c.add_error(1);
//     assert(c.value() == 3 && c.errors() == 1);
module;
#include <atomic>
#include <cstdint>
#include <system_error>
#include <utility>
export module compcntr:counter;
import :slot;
import :lifetime;
import :types;
import :error;

export namespace compcntr {

class device;

class counter {
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

  inline explicit operator bool() const noexcept { return s_ != nullptr; }

  /// Completion count (acquire load).
  inline std::uint64_t value() const noexcept { return s_->load_value(); }
  /// Error count (acquire load).
  inline std::uint64_t errors() const noexcept { return s_->load_errors(); }
  /// Completion count += n, wrapping past max_value.
  inline void add(std::uint64_t n = 1) noexcept { s_->add(n); }
  /// Error count += n, wrapping past max_value.
  inline void add_error(std::uint64_t n = 1) noexcept { s_->add_error(n); }
  /// Completion count = v.
  inline void set(std::uint64_t v) noexcept { s_->set(v); }
  /// Error count = v.
  inline void set_error(std::uint64_t v) noexcept { s_->set_error(v); }

  inline counter_type type() const noexcept { return s_->type; }
  /// NUMA node whose memory holds this counter's slot.
  inline int numa_node() const noexcept { return s_->numa_node; }
  /// Index of the counter's slot in its device's pool (the verbs `handle`).
  inline std::uint32_t index() const noexcept { return s_->index; }
  /// A name for this counter that can outlive it: device::resolve() turns it back into access
  /// to this counter while it lives, and reports ESTALE once it is destroyed (even after its
  /// slot went to a new counter). Memory ordering: relaxed load of the slot's generation, which
  /// only changes when the slot is released (never while this counter owns it).
  inline counter_handle handle() const noexcept {
    return {s_->generation.load(std::memory_order_relaxed), s_->index};
  }

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
  inline detail::slot* native_slot() const noexcept { return s_; }

 private:
  friend class device;
  inline explicit counter(detail::slot* s) noexcept : s_(s) {}
  detail::slot* s_ = nullptr;
};

}  // namespace compcntr
