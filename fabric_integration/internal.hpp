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

#include "cntr_base.hpp"

namespace compcntr_fabric {

/// Records "<formatted sentence>" as this thread's compcntr_fi_last_error() and returns `err`
/// (a positive errno value; callers negate it for -FI_E* returns).
int fail(int err, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

/// One adapter counter: a fid_cntr served by a compcntr counter it owns (cntr_base.hpp: the
/// header, the ops table, waits and trywait shared with the hook's counters). What it adds:
/// progress is the CQ bridges the counter is bound to.
struct adapter : cntr_base {
  /// Bridges this counter is bound to, with the number of bindings each holds. `sources_n`
  /// mirrors sources.size() for the read path: one relaxed load decides whether read/wait need
  /// to drive anything (a bind racing with a read may be noticed one call late; the counts are
  /// never wrong, only the moment the CQ is next drained).
  std::shared_mutex mu;
  std::vector<std::pair<compcntr_fi_bridge*, int>> sources;
  std::atomic<std::uint32_t> sources_n{0};
  /// Bindings held by bridges (under the registry lock): fi_close is -FI_EBUSY while > 0.
  std::uint32_t bindings = 0;

  /// Drives the progress of every bridge this counter is bound to (no-op if none).
  void run_bridges() noexcept;

  // cntr_base's class interface (cntr_base.hpp). With no bridge bound, drive is one relaxed
  // load (no lock), so a read is that load plus compcntr's acquire load.
  static void drive(adapter& a, bool) noexcept {
    if (a.sources_n.load(std::memory_order_relaxed) != 0) a.run_bridges();
  }
  static int update(adapter& a, update_op op, std::uint64_t v) noexcept {
    return a.update_cc(op, v);
  }
  static int wait(adapter& a, std::uint64_t threshold, int timeout) noexcept;
  static void after(adapter&) noexcept {}
};

/// The adapter whose counter is `cc`, or nullptr. Must be called with registry_lock() held.
adapter* find_adapter(compcntr_comp_cntr* cc) noexcept;
/// The lock guarding the registry and every adapter's `bindings`.
std::mutex& registry_lock() noexcept;

/// Adds / removes one binding of bridge `br` on adapter `a` (registry lock held by the caller).
/// add_binding returns false (nothing changed) when memory runs out.
bool add_binding(adapter& a, compcntr_fi_bridge* br) noexcept;
void remove_binding(adapter& a, compcntr_fi_bridge* br) noexcept;

} // namespace compcntr_fabric

#endif
