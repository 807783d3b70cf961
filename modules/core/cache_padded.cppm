// compcntr:cache_padded -- padding against false sharing.
//
// Purpose: keep two independently written words off the same unit of coherence traffic.
// Requirements: T is an object type.
// Guarantees: two cache_padded objects never share a 128-byte aligned block.
// Why 128 and not 64: an x86-64 cache line is 64 bytes, but Intel's L2 "spatial" (adjacent-line)
// prefetcher fetches lines in 128-byte aligned pairs, so two hot words 64 bytes apart can still
// drag each other's line around on Intel parts (Intel 64 and IA-32 Optimization Reference Manual,
// "Data prefetching"; folly's hardware_destructive_interference_size and crossbeam's CachePadded
// use 128 on x86-64 for this reason). On this project's AMD EPYC VMs 64 B already removes all
// interference (measurements: bench/README.md, "Measurements the code quotes"); 128 costs nothing
// where it matters, since a pool slot needs a second line for its cold metadata anyway.
// Memory ordering: none (layout only).
//
// Example:
//     compcntr::cache_padded<std::atomic<std::uint64_t>> hits[2];   // one per thread
//     hits[0]->fetch_add(1);
module;
#include <cstddef>
#include <utility>
export module compcntr:cache_padded;

export namespace compcntr {

/// Bytes in one cache line (coherence granule) on the targets compcntr supports.
inline constexpr std::size_t cache_line_size = 64;

/// Distance at which two written objects no longer interfere (see the file comment).
inline constexpr std::size_t false_sharing_range = 128;

/// A T aligned and padded to false_sharing_range bytes (see the file comment).
template <class T>
struct alignas(false_sharing_range) cache_padded {
  T value{};

  cache_padded() = default;
  template <class... Args>
  explicit cache_padded(std::in_place_t, Args&&... args) : value(std::forward<Args>(args)...) {}

  inline T& operator*() noexcept { return value; }
  inline const T& operator*() const noexcept { return value; }
  inline T* operator->() noexcept { return &value; }
  inline const T* operator->() const noexcept { return &value; }
};

} // namespace compcntr
