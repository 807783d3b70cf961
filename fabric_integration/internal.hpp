// Internals shared by the fi_cntr adapter (adapter.cpp) and the CQ bridge (bridge.cpp).
//
// Layering: this library is built only on compcntr's public C API (<compcntr/compcntr.h>) and
// libfabric's headers, as a provider would be. Nothing here reaches into compcntr's internals.
//
// How the two halves meet: an adapter counter is an ordinary compcntr counter wrapped in a
// struct fid_cntr. When such a counter is bound to a bridge (compcntr_fi_bridge_bind takes a
// plain compcntr_comp_cntr*), the bridge finds its adapter in the registry below, marks it busy
// (fi_close is then -FI_EBUSY) and adds itself to the adapter's progress sources, so that
// fi_cntr_read / fi_cntr_wait on the adapter drive the CQ, as a provider's counter drives its
// endpoints.
#ifndef COMPCNTR_FABRIC_INTERNAL_HPP
#define COMPCNTR_FABRIC_INTERNAL_HPP

#include <compcntr/fabric.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

namespace compcntr_fabric {

/// Records "<formatted sentence>" as this thread's compcntr_fi_last_error() and returns `err`
/// (a positive errno value; callers negate it for -FI_E* returns).
int fail(int err, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

/// The integer stored in a libfabric enum field. C callers may store any int there (a C enum
/// holds any value of its type); loading a value outside a C++ enum's range is undefined, so
/// attribute fields are read as their integer.
template <class E>
inline int raw_enum(const E& e) noexcept {
  static_assert(sizeof(E) == sizeof(int), "libfabric enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

/// One adapter counter: a struct fid_cntr (first member, so fid_cntr* and adapter* convert)
/// served by a compcntr counter it owns.
struct adapter {
  fid_cntr cntr{};
  compcntr_comp_cntr* cc = nullptr;
  fi_wait_obj wait_obj = FI_WAIT_NONE;
  int fd = -1;  ///< FI_WAIT_FD: the counter's pollable fd (owned by the compcntr counter)

  /// Bridges this counter is bound to, with the number of bindings each holds. `sources_n`
  /// mirrors sources.size() for the read path: one relaxed load decides whether read/wait need
  /// to drive anything (a bind racing with a read may be noticed one call late; the counts are
  /// never wrong, only the moment the CQ is next drained).
  std::shared_mutex mu;
  std::vector<std::pair<compcntr_fi_bridge*, int>> sources;
  std::atomic<std::uint32_t> sources_n{0};
  /// Bindings held by bridges (under the registry lock): fi_close is -FI_EBUSY while > 0.
  std::uint32_t bindings = 0;

  /// compcntr_fi_trywait's snapshot: the values it last returned on. Relaxed: one thread per
  /// counter uses trywait (documented), the atomics only keep concurrent misuse defined.
  std::atomic<std::uint64_t> seen_value{0};
  std::atomic<std::uint64_t> seen_errors{0};

  /// Drives the progress of every bridge this counter is bound to (no-op if none).
  void drive() noexcept;
};

/// The adapter whose counter is `cc`, or nullptr. Must be called with registry_lock() held.
adapter* find_adapter(compcntr_comp_cntr* cc) noexcept;
/// The lock guarding the registry and every adapter's `bindings`.
std::mutex& registry_lock() noexcept;

/// Adds / removes one binding of bridge `br` on adapter `a` (registry lock held by the caller).
/// add_binding returns false (nothing changed) when memory runs out.
bool add_binding(adapter& a, compcntr_fi_bridge* br) noexcept;
void remove_binding(adapter& a, compcntr_fi_bridge* br) noexcept;

}  // namespace compcntr_fabric

#endif
