// compcntr:pool -- where slots live: NUMA-aware arenas and lock-free per-node free lists.
//
// Purpose: hand out and take back 128-byte counter slots, placed on a NUMA node,
// without a lock on the create/destroy path. Knows nothing about devices or waiting. Design
// (arenas, per-node Treiber stacks and bump words, placement and fallback, arena budget):
// src/core/pool.cpp; the hwloc side: src/core/numa_topology.cpp; users' view: docs/pool.md.
//
// Requirements: a slot is released exactly once, by the owner that allocated it.
// Guarantees:
//   * allocate() and release() are lock-free: a handful of atomic RMWs. Creating an arena takes
//     a mutex, once per arena_slots() slots of a node.
//   * allocate(-1) places the slot on the node of the calling thread's CPU, allocate(n) on OS
//     node n (EINVAL if the topology has none); a full node falls back to another one, and the
//     slot reports its real node (slot::numa_node).
//   * a slot handed out is reset (reset_slot, compcntr:lifetime); its generation is left alone.
//   * capacity is exact: at most capacity() slots are live at once; one more is ENOMEM and
//     changes nothing. A failed arena allocation consumes nothing (ENOMEM; the next call retries).
//   * arenas are never freed before the pool dies: a slot pointer or index stays dereferenceable.
// Memory ordering: taking a free slot acquires what its previous owner published by release()
// (release CAS on the node's free list); details at allocate() and release().
//
// Example (internal; devices own a pool):
//     compcntr::detail::slot_pool pool(compcntr::detail::pool_config{
//         .capacity = 1000, .synthetic = "pack:2 numa:1 core:2 pu:1"});
//     std::error_code ec;
//     compcntr::detail::slot* s = pool.allocate(1, ec);   // on node 1
//     pool.release(*s);
module;
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#include <sanitizer/tsan_interface.h>
#define COMPCNTR_POOL_TSAN 1
#endif
#endif
export module compcntr:pool;
import :cache_padded;
import :lifetime;
import :slot;

namespace compcntr::detail {

/// How a slot_pool finds its topology and the calling thread's CPU (tests inject both).
struct pool_config {
  /// Maximum live slots (the device's max_counters), clamped to slot_pool::max_capacity.
  std::uint32_t capacity = 1u << 20;
  /// An hwloc synthetic description ("pack:2 numa:1 core:4 pu:1"); nullptr: not used.
  const char* synthetic = nullptr;
  /// An hwloc XML topology file; nullptr: not used. Ignored if `synthetic` is set.
  const char* xml_file = nullptr;
  /// The OS index of the PU the calling thread runs on; nullptr: the real one (rseq).
  int (*current_cpu)() noexcept = nullptr;
  /// Slots per arena (rounded up to a power of two, at most 4096); 0: automatic (4096, or
  /// less for small capacities, down to one 4 KiB page of slots).
  std::uint32_t arena_slots = 0;
  /// Fault injection for tests: called before each arena allocation; true simulates ENOMEM.
  bool (*fail_arena_alloc)() noexcept = nullptr;
};

/// The hwloc side of a pool (topology, node sets, arena memory). Defined in src/core/numa_topology.cpp.
struct numa_topology;

} // namespace compcntr::detail

// Internal to the library (module linkage, not exported): the hwloc calls of src/core/numa_topology.cpp.
namespace compcntr::detail {
/// OS index of the CPU the calling thread runs on (rseq cpu_id, else sched_getcpu()).
int real_current_cpu() noexcept;
/// The topology described by cfg (nullptr only when out of memory). Never fails otherwise:
/// if hwloc cannot load it, the result has no hwloc topology and describes why. Loaded once per
/// process and source (this machine, a synthetic description, an XML file) and shared by every
/// pool of that source; a failed load is not kept (the next call tries again).
numa_topology* load_numa_topology(const pool_config& cfg) noexcept;
/// Releases a pool's topology: destroys one that failed to load; a shared one stays.
void destroy_numa_topology(numa_topology* t) noexcept;
/// NUMA nodes (0 if hwloc failed), and the OS index of dense node `dense`.
int numa_topology_nodes(const numa_topology* t) noexcept;
int numa_topology_node_os_index(const numa_topology* t, int dense) noexcept;
/// Highest PU OS index of the topology (-1 if none), and the dense node local to PU `cpu` (-1).
int numa_topology_max_cpu(const numa_topology* t) noexcept;
int numa_topology_node_of_cpu(const numa_topology* t, int cpu) noexcept;
bool numa_topology_can_bind(const numa_topology* t) noexcept;
std::string numa_topology_describe(const numa_topology* t);
/// Page-aligned memory for an arena of dense node `dense`; `bound` tells whether the OS bound it.
void* numa_topology_alloc(numa_topology* t, int dense, std::size_t bytes, bool& bound) noexcept;
void numa_topology_free(numa_topology* t, void* p, std::size_t bytes) noexcept;
void* numa_topology_hwloc(const numa_topology* t) noexcept;

// The halves of a pool word (free-list head: tag | index + 1; counts: holds | live).
constexpr std::uint64_t pack(std::uint32_t hi, std::uint32_t lo) noexcept {
  return (std::uint64_t{hi} << 32) | lo;
}
constexpr std::uint32_t lo_of(std::uint64_t w) noexcept { return static_cast<std::uint32_t>(w); }
constexpr std::uint32_t hi_of(std::uint64_t w) noexcept {
  return static_cast<std::uint32_t>(w >> 32);
}

// The 16-byte CAS of slot_pool::top_pair: {lo, hi} -> {new_lo, new_hi} if the 16 bytes at `p`
// still hold {lo, hi}; else false with {lo, hi} = what they hold. A full barrier (lock prefix),
// so it is as strong as the acq_rel CAS the callers document.
//   x86-64: cmpxchg16b in inline asm. Clang lowers a 16-byte __atomic CAS to a libatomic call
//     unless the whole translation unit has -mcx16, and the module interface units cannot get it
//     (importers would need it too). ThreadSanitizer does not see the asm: a release before and
//     an acquire after, on each of the two words, tell it what the CAS synchronises (every other
//     access to these words is atomic; the annotations can only add edges the CPU also has).
//   elsewhere: the compiler's 16-byte atomic (AArch64: ldaxp/stlxp or casp, inline).
[[gnu::always_inline]] inline bool cas_pair(void* p, std::uint64_t& lo, std::uint64_t& hi,
                                            std::uint64_t new_lo, std::uint64_t new_hi) noexcept {
#if defined(__x86_64__)
#ifdef COMPCNTR_POOL_TSAN
  __tsan_release(p); // both words: an RMW of the pair is one of each (8-byte atomics use either)
  __tsan_release(static_cast<char*>(p) + 8);
#endif
  bool ok;
  asm volatile("lock cmpxchg16b %1"
               : "=@ccz"(ok), "+m"(*static_cast<unsigned __int128*>(p)), "+a"(lo), "+d"(hi)
               : "b"(new_lo), "c"(new_hi)
               : "memory");
#ifdef COMPCNTR_POOL_TSAN
  __tsan_acquire(p); // a failed CAS read both words too (acquire on failure, as the callers')
  __tsan_acquire(static_cast<char*>(p) + 8);
#endif
  return ok;
#else
  unsigned __int128 expected = static_cast<unsigned __int128>(hi) << 64 | lo;
  const unsigned __int128 desired = static_cast<unsigned __int128>(new_hi) << 64 | new_lo;
  const bool ok = __atomic_compare_exchange_n(static_cast<unsigned __int128*>(p), &expected,
                                              desired, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  lo = static_cast<std::uint64_t>(expected);
  hi = static_cast<std::uint64_t>(expected >> 64);
  return ok;
#endif
}

/// Whether cas_pair is lock-free on this CPU (src/core/pool.cpp).
bool have_cas_pair() noexcept;
} // namespace compcntr::detail

namespace compcntr::detail {

class slot_pool {
 public:
  /// Default slots per arena: 4096 x 128 B = 512 KiB, large enough to amortise hwloc allocation
  /// and binding (one mmap + mbind per arena), small enough that an idle node pins little.
  static constexpr std::uint32_t default_arena_slots = 4096;
  /// Hard upper bound on capacity (index space; a free-list link is index + 1 in 32 bits).
  static constexpr std::uint32_t max_capacity = 0xfffff000u;

  /// A pool over the real machine's topology (or HWLOC_SYNTHETIC / HWLOC_XMLFILE if set).
  explicit slot_pool(std::uint32_t capacity) noexcept;
  explicit slot_pool(const pool_config& config) noexcept;
  ~slot_pool();
  slot_pool(const slot_pool&) = delete;
  slot_pool& operator=(const slot_pool&) = delete;

  /// A reset slot (refs == 1), or nullptr with ec set: EINVAL (numa_node >= 0 is not a node of
  /// the topology), ENOMEM (capacity() slots live, or no memory for a new arena). `numa_node`
  /// < 0 means the node of the calling thread's CPU.
  /// Memory ordering: the reservation is a relaxed CAS on the live count; taking a free slot is
  /// an acquire CAS on the node's free-list head (pairs with release()'s release CAS, so the
  /// previous owner's writes, including its generation bump, happen-before the new owner's use);
  /// taking a never-used slot is an acquire fetch_add on the node's bump word (pairs with the
  /// release store that published the arena). The slot is then reset with relaxed stores
  /// except refs (release: see reset_slot) and handed to the caller.
  [[gnu::always_inline]] inline slot* allocate(int numa_node, std::error_code& ec) noexcept {
    if (numa_node < 0 && node_count_ == 1 && fused_) [[likely]] {
      if (slot* s = pop_counted()) {
        reset_slot(*s);
        return s;
      }
    }
    return allocate_general(numa_node, ec);
  }

  /// Returns `s` to its node's free list (the generation bump before it is compcntr:lifetime's).
  /// True if that was the last live slot and no hold is left (the owner may delete the pool
  /// now; the pool touches nothing after the decrement).
  /// Memory ordering: a release CAS pushing the slot (publishes every write of the owner, the
  /// generation bump included, to the next allocate() of the slot), then an acq_rel decrement
  /// of the live count; on node 0 of a fused pool both are one full-barrier 16-byte CAS.
  [[gnu::always_inline]] inline bool release(slot& s) noexcept {
    if (node_count_ == 1 && fused_) [[likely]]
      return push_uncounted(s);
    return release_general(s);
  }

  /// The slot at `index` (live or not), or nullptr if no arena holds that index.
  /// Memory ordering: acquire load of the arena pointer.
  inline slot* find(std::uint32_t index) const noexcept {
    const std::uint32_t a = index >> arena_shift_;
    if (a >= arena_budget_) return nullptr;
    slot* base = arenas_[a].base.load(std::memory_order_acquire);
    return base ? base + (index & (arena_slots_ - 1)) : nullptr;
  }

  // (Member functions defined in a class of a named module are not implicitly inline in C++20:
  // the hot ones say `inline` so importers can inline them.)
  inline std::uint32_t capacity() const noexcept { return capacity_; }
  /// Slots live or being created (relaxed snapshot).
  inline std::uint32_t live() const noexcept {
    return static_cast<std::uint32_t>(top_->count.load(std::memory_order_relaxed));
  }

  // The pool's live-slot count shares one word with a count of "holds" its owner keeps on it
  // (high 32 bits: a device's handle and its objects other than counters), so the owner learns
  // with the RMW that releases a slot whether nothing at all is left; and that word sits beside
  // node 0's free-list head, so one 16-byte CAS takes a free slot and counts it (top_pair): one
  // locked instruction per create and per destroy for the slot, the capacity and the owner's
  // lifetime (P7).
  /// One more hold. Memory ordering: relaxed (the caller already holds one or owns the pool).
  inline void hold() noexcept { top_->count.fetch_add(hold_unit, std::memory_order_relaxed); }
  /// Drops a hold; true if no hold and no live slot remain (the owner may delete the pool).
  /// Memory ordering: acq_rel (the last one sees every write made under every hold and slot).
  inline bool unhold() noexcept {
    return top_->count.fetch_sub(hold_unit, std::memory_order_acq_rel) == hold_unit;
  }
  /// Drops the caller's hold if it is the only thing left (one hold, no live slot): true. Else
  /// false and nothing changes; `holds` and `live` then say what remains. Memory ordering: as
  /// unhold() on success.
  inline bool unhold_if_last(std::uint32_t& holds, std::uint32_t& live_slots) noexcept {
    std::uint64_t expected = hold_unit;
    if (top_->count.compare_exchange_strong(expected, 0, std::memory_order_acq_rel,
                                            std::memory_order_acquire))
      return true;
    holds = static_cast<std::uint32_t>(expected >> 32);
    live_slots = static_cast<std::uint32_t>(expected);
    return false;
  }
  inline std::uint32_t holds() const noexcept {
    return static_cast<std::uint32_t>(top_->count.load(std::memory_order_acquire) >> 32);
  }

  /// Number of NUMA nodes, and the OS index of the i-th (0 <= i < numa_nodes(), ascending).
  inline int numa_nodes() const noexcept { return node_count_; }
  inline int numa_node_id(int i) const noexcept { return nodes_[i].os_index; }
  /// Whether OS node `os_index` exists in the topology.
  inline bool has_numa_node(int os_index) const noexcept { return dense_node(os_index) >= 0; }
  /// The node allocate(-1) would pick for the calling thread now (OS index).
  inline int current_numa_node() const noexcept { return nodes_[current_dense_node()].os_index; }

  /// Slots per arena (a power of two), arenas created so far, and the bytes they hold.
  inline std::uint32_t arena_slots() const noexcept { return arena_slots_; }
  inline std::uint32_t arenas() const noexcept {
    return arenas_used_.load(std::memory_order_acquire);
  }
  inline std::size_t arena_bytes() const noexcept {
    return std::size_t{arenas()} * arena_slots_ * sizeof(slot);
  }
  /// Most arenas this pool will ever create (see the file comment).
  inline std::uint32_t arena_budget() const noexcept { return arena_budget_; }
  /// True while every arena created so far is really bound to its node (false on synthetic or
  /// XML topologies, or when the OS refused a binding). status() says why.
  inline bool memory_bound() const noexcept {
    return unbound_arenas_.load(std::memory_order_acquire) == 0 && binding_supported_;
  }
  /// Whether the topology can bind memory at all (it is this system and hwloc supports binding).
  inline bool binding_supported() const noexcept { return binding_supported_; }
  /// A sentence describing the topology and binding state (for logs and error reports).
  std::string status() const;
  /// The hwloc_topology_t of the pool (nullptr if hwloc failed; the pool then has one node and
  /// plain memory). For diagnostics and tests: do not modify it.
  void* hwloc_topology() const noexcept;

 private:
  struct arena_entry {
    std::atomic<slot*> base{nullptr};
    int node = 0; ///< dense node index; written before `base` is published
  };
  /// Per node: the free-list head and the bump word on lines of their own.
  struct node_state {
    /// The node's free list, tag << 32 | (index + 1), 0 = empty: &own_head, or for node 0
    /// &top_->list (beside the pool's counts).
    std::atomic<std::uint64_t>* head = nullptr;
    cache_padded<std::atomic<std::uint64_t>> own_head;
    cache_padded<std::atomic<std::uint64_t>> bump; ///< (arena + 1) << 32 | next position
    int os_index = 0;
  };
  /// Node 0's free-list head and the pool's counts, adjacent and 16-byte aligned, so that one
  /// 16-byte CAS (cmpxchg16b) pops a slot and counts it, or pushes it back and uncounts it
  /// (fused_). The words are also used alone: 8-byte CASes on `list` (pops for other nodes'
  /// threads once node 0 is the fallback) and 8-byte RMWs on `count` (holds, reservations on
  /// the general path) are atomic with respect to the 16-byte ones on the same line.
  struct alignas(16) top_pair {
    std::atomic<std::uint64_t> list{0}; ///< node 0's free list (see node_state::head)
    std::atomic<std::uint64_t> count{0}; ///< holds << 32 | slots live or being created
  };
  enum class grow_result { grown, retry, no_budget, no_memory };

  inline int dense_node(int os_index) const noexcept {
    if (os_index < 0 || os_index >= os_to_dense_size_) return -1;
    return os_to_dense_[os_index];
  }
  int current_dense_node() const noexcept;
  bool reserve() noexcept;
  // Node 0's free list with the count, in one 16-byte CAS (fused_): a slot, counted, or nullptr
  // when the list is empty or the pool looks full (allocate_general decides exactly). The two
  // 8-byte loads may tear; they only seed the CAS, which compares all 16 bytes and on failure
  // returns a consistent pair. Memory ordering: acquire load of the head (the link read),
  // full-barrier CAS (acquires the releaser's writes, as pop_free's acquire CAS).
  inline slot* pop_counted() noexcept {
    std::uint64_t lo = top_->list.load(std::memory_order_acquire);
    std::uint64_t hi = top_->count.load(std::memory_order_relaxed);
    for (;;) {
      if (lo_of(lo) == 0 || lo_of(hi) >= capacity_) return nullptr;
      slot* s = find(lo_of(lo) - 1);
      // Safe on a slot popped meanwhile: as pop_free (arenas are never freed; the tag fails the CAS).
      const std::uint32_t next = s->next_free.load(std::memory_order_relaxed);
      if (cas_pair(&*top_, lo, hi, pack(hi_of(lo) + 1, next), hi + 1)) return s;
    }
  }

  // A slot of node 0 back on its list and uncounted, in one 16-byte CAS (fused_). True if that
  // left no live slot and no hold. Memory ordering: full-barrier CAS (releases the owner's
  // writes to the next pop, and the last one acquires every earlier release: acq_rel).
  inline bool push_uncounted(slot& s) noexcept {
    std::uint64_t lo = top_->list.load(std::memory_order_relaxed);
    std::uint64_t hi = top_->count.load(std::memory_order_relaxed);
    do {
      s.next_free.store(lo_of(lo), std::memory_order_relaxed);
    } while (!cas_pair(&*top_, lo, hi, pack(hi_of(lo) + 1, s.index + 1), hi - 1));
    return hi == 1; // hi is what the CAS replaced: this slot the only thing counted
  }

  slot* allocate_general(int numa_node, std::error_code& ec) noexcept;
  slot* reserve_and_take(int node, std::error_code& ec) noexcept;
  bool release_general(slot& s) noexcept;
  slot* fail_node(int numa_node, std::error_code& ec) noexcept;
  slot* take(int node, std::error_code& ec) noexcept;
  slot* pop_free(node_state& n) noexcept;
  void push_free(node_state& n, slot& s) noexcept;
  slot* bump_slot(node_state& n, std::uint64_t& seen) noexcept;
  grow_result grow(int node, std::uint64_t seen, slot*& out) noexcept;
  slot* construct_slot(void* where, std::uint32_t index, int node) noexcept;

  std::uint32_t capacity_ = 0;
  std::uint32_t arena_slots_ = default_arena_slots;
  std::uint32_t arena_shift_ = 12;
  std::uint32_t arena_budget_ = 0;
  int node_count_ = 1;
  bool binding_supported_ = false;
  int (*current_cpu_)() noexcept = nullptr;
  bool (*fail_arena_alloc_)() noexcept = nullptr;
  std::unique_ptr<node_state[]> nodes_;
  std::unique_ptr<std::int16_t[]> cpu_to_dense_; ///< PU OS index -> dense node
  int cpu_to_dense_size_ = 0;
  std::unique_ptr<std::int16_t[]> os_to_dense_; ///< node OS index -> dense node, -1: none
  int os_to_dense_size_ = 0;
  std::unique_ptr<arena_entry[]> arenas_; ///< arena_budget_ entries
  numa_topology* topo_ = nullptr;
  static constexpr std::uint64_t hold_unit = std::uint64_t{1} << 32;
  /// Node 0's free list and holds << 32 | slots live or being created (see hold(), top_pair).
  cache_padded<top_pair> top_;
  /// Whether node 0's pops and pushes use the 16-byte CAS on top_ (the CPU has one: cmpxchg16b
  /// on x86-64); else they are an 8-byte CAS on the list plus an RMW on the count.
  bool fused_ = false;
  std::atomic<std::uint32_t> arenas_used_{0}; ///< written under grow_
  std::atomic<std::uint32_t> unbound_arenas_{0};
  mutable std::mutex grow_; ///< arena creation (and status()) only
};

} // namespace compcntr::detail
