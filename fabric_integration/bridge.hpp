// The CQ bridge's internals shared by its two units: bridge.cpp (open, bind, stats, close,
// compcntr::fabric::bind) and bridge_progress.cpp (draining the CQ into the bound counters):
// the completion classes, the binding of a counter to classes, and struct compcntr_fi_bridge.
// Include after `import compcntr;` (a binding may hold a compcntr::counter_ref).
#ifndef COMPCNTR_FABRIC_BRIDGE_HPP
#define COMPCNTR_FABRIC_BRIDGE_HPP

#include <compcntr/fabric.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "internal.hpp"

namespace compcntr_fabric {

// Completion classes, in the order entries are matched (first match wins).
enum cls : int { remote_write, remote_read, read, write, send, recv, n_classes };
inline constexpr std::uint64_t class_flag[n_classes] = {FI_REMOTE_WRITE, FI_REMOTE_READ, FI_READ,
                                                        FI_WRITE,        FI_SEND,        FI_RECV};

inline int classify(std::uint64_t flags) noexcept {
  for (int c = 0; c < n_classes; ++c)
    if (flags & class_flag[c]) return c;
  return n_classes;
}

inline constexpr std::size_t batch =
    64;  // entries per fi_cq_read with a known format (3 KiB TAGGED)
inline constexpr std::size_t default_max_entries = 1024;

// A counter bound to some classes of a bridge: a C counter (the application keeps it alive), or
// a C++ counter reached through a counter_ref the binding holds (which keeps it alive).
struct binding {
  compcntr_comp_cntr* cc = nullptr;
  compcntr::counter_ref ref;
  bool bytes = false;
  adapter* owner = nullptr;  // the adapter counter cc belongs to, or nullptr

  void add(std::uint64_t n) noexcept {
    if (cc)
      compcntr_inc_comp_cntr(cc, n);
    else
      ref.add(n);
  }
  void add_error(std::uint64_t n) noexcept {
    if (cc)
      compcntr_inc_err_comp_cntr(cc, n);
    else
      ref.add_error(n);
  }
};

} // namespace compcntr_fabric

struct compcntr_fi_bridge {
  fid_cq* cq = nullptr;
  std::size_t stride = 0;  // 0: format unknown (one entry per read, prefix only)
  std::size_t max_entries = compcntr_fabric::default_max_entries;

  // One binding per class; published with release, read with acquire by progress.
  std::atomic<const compcntr_fabric::binding*> table[compcntr_fabric::n_classes] = {};

  // The drain try-lock: one thread reads the CQ at a time (fi_cq_read + fi_cq_readerr must
  // not interleave, and CQs of FI_THREAD_DOMAIN domains are not thread-safe). acquire on
  // entry / release on exit order each drain's buffer use and statistics after the previous.
  std::atomic<bool> draining{false};
  std::atomic<bool> context_format{false};  // a CONTEXT entry was seen: refuse to read more

  // Statistics, updated by the draining thread only (relaxed; read by query_stats).
  std::atomic<std::uint64_t> entries{0}, errors{0}, unclassified{0}, unbound{0};

  std::mutex bind_mu;                            // serialises bind and close
  std::vector<std::unique_ptr<compcntr_fabric::binding>> owned;   // every binding made, for close

  alignas(64) unsigned char buf[compcntr_fabric::batch * sizeof(fi_cq_tagged_entry)];
};

#endif
