// Pieces shared by several rows: the padded raw atomic every reference uses, and the timed
// increment loops of P2, P3 and P10 (one definition, so the rows time the same code).
// Include after `import compcntr;`.
#pragma once

#include <atomic>
#include <cstdint>

namespace bench::rows {

/// A raw atomic alone in a 128-byte block (the false-sharing range, compcntr:cache_padded), as
/// the spec's "hand-padded" references are.
struct alignas(128) padded_atomic {
  std::atomic<std::uint64_t> v{0};
};

// The timed loops take the counter / the atomic by reference, as application code holding a
// counter (or an atomic) in some object does; noinline keeps each loop's code independent of
// the harness around it.
__attribute__((noinline)) inline void add_loop(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add(1);
}
__attribute__((noinline)) inline void fetch_add_loop(std::atomic<std::uint64_t>& a,
                                                     std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) a.fetch_add(1);
}

} // namespace bench::rows
