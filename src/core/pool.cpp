// Slot pool (compcntr:pool): per-node tagged Treiber stacks of slot indices and bump words over
// arenas created on demand. The hwloc calls live in src/core/numa_topology.cpp.
//
// Design.
//   * topology: an hwloc topology loaded once per pool (the real machine, honouring hwloc's own
//     HWLOC_SYNTHETIC / HWLOC_XMLFILE variables, or a synthetic description / XML file given in
//     pool_config). Nodes are named by their OS index (the kernel's node number, as in numactl,
//     /sys/devices/system/node and hwloc_get_area_memlocation).
//   * arenas: blocks of arena_slots() slots, each allocated for one node with
//     hwloc_alloc_membind(nodeset, HWLOC_MEMBIND_BIND) and grown on demand. A slot's index is
//     arena * arena_slots() + position; arenas are never freed before the pool dies, so a slot
//     pointer or index stays dereferenceable (a stale one is recognised by its generation).
//     A slot is constructed when first handed out, so an arena's pages become resident only as
//     its slots are used: resident pool memory is 128 B per slot ever used (plus at most one
//     partly used page per node), not per slot reserved.
//   * per node: a tagged index stack of free slot indices (src/core/tagged_index_stack.hpp; node
//     0's shares its CAS with the pool's counts, cas_pair, when the pool is fused) and a bump word (arena + 1) << 32 | next position for never-used slots of the
//     node's current arena.
//
// Placement: allocate(-1) uses the node local to the CPU the calling thread runs on (of the
// NUMA nodes whose cpuset holds that CPU, the one with the smallest cpuset: a package's DRAM
// rather than a CPU-less memory node attached to the whole machine; CPUs the topology does not
// know go to the first node); allocate(n) uses OS node n, EINVAL if the topology has no node
// n. The CPU comes from the kernel's rseq area (what glibc's sched_getcpu() and
// hwloc_get_last_cpu_location(HWLOC_CPUBIND_THREAD) return on Linux, read in ~0.2 ns;
// sched_getcpu() itself is the fallback), or from pool_config::current_cpu. It is read
// on every allocation, never cached: it costs less than a cache lookup and is never stale after a
// thread re-binds itself. A one-node topology skips it entirely.
//
// When the chosen node has no free slot: (1) take a never-used slot of its current arena, (2)
// grow it by one arena if the arena budget allows, (3) otherwise take a free slot of another node
// (the slot reports its real node through slot::numa_node; so does compcntr_comp_cntr_numa_node).
// The arena budget is ceil(capacity / arena_slots) + nodes - 1 arenas: every node can get an
// arena of its own, and the address space reserved never exceeds that budget times
// arena_slots * 128 bytes, i.e. less than (capacity + nodes * arena_slots) * 128 bytes (resident
// memory follows the slots really used, see "arenas" above). Step (3) only happens once that
// budget is spent; it always finds a slot because the budget covers `capacity` slots.
//
// Memory binding: arenas are bound with hwloc when the topology is the running system and the
// OS supports binding. On synthetic or XML topologies (or if binding is refused) arenas are plain
// page-aligned memory; the pool reports that through memory_bound() / status(), and the slots
// still report the node they were assigned to (placement logic is the same, memory is not moved).
module;
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#if defined(__x86_64__)
#include <cpuid.h>

#include "core/tagged_index_stack.hpp"
#endif
module compcntr;

namespace compcntr::detail {

namespace {

std::uint32_t round_up_pow2(std::uint32_t v) noexcept {
  std::uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

} // namespace

// Whether cas_pair is lock-free here: cmpxchg16b (CPUID.01H:ECX bit 13, absent only on the
// first x86-64 CPUs), or a target whose compiler inlines 16-byte atomics.
bool have_cas_pair() noexcept {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_CMPXCHG16B) != 0;
#elif defined(__aarch64__)
  return __atomic_always_lock_free(16, 0);
#else
  return false;
#endif
}

slot_pool::slot_pool(std::uint32_t capacity) noexcept
    : slot_pool(pool_config{.capacity = capacity}) {}

slot_pool::slot_pool(const pool_config& cfg) noexcept
    : capacity_(cfg.capacity > max_capacity ? max_capacity : cfg.capacity),
      current_cpu_(cfg.current_cpu),
      fail_arena_alloc_(cfg.fail_arena_alloc) {
  static_assert(sizeof(top_pair) == 16 && alignof(top_pair) == 16 && offsetof(top_pair, count) == 8,
                "cas_pair treats top_pair as one 16-byte word: list low, count high");
  fused_ = have_cas_pair();
  topo_ = load_numa_topology(cfg);
  const int topo_nodes = numa_topology_nodes(topo_);
  node_count_ = topo_nodes > 0 ? topo_nodes : 1;
  binding_supported_ = numa_topology_can_bind(topo_);

  // Arena size: the configured one, else 4096 slots, less for small pools (never below one
  // 4 KiB page: memory is bound per page).
  constexpr std::uint32_t page_slots = 4096 / sizeof(slot);
  std::uint32_t want = cfg.arena_slots;
  if (want == 0) want = capacity_ < page_slots ? page_slots : capacity_;
  if (want > default_arena_slots) want = default_arena_slots;
  arena_slots_ = round_up_pow2(want);
  arena_shift_ = 0;
  while ((1u << arena_shift_) < arena_slots_) ++arena_shift_;

  // Budget: capacity_ slots, plus room for every other node to own one arena; indices must stay
  // below 2^32 - 1 (a free-list link is index + 1).
  std::uint64_t budget = capacity_ == 0
                             ? 0
                             : (std::uint64_t{capacity_} + arena_slots_ - 1) / arena_slots_ +
                                   static_cast<std::uint64_t>(node_count_ - 1);
  const std::uint64_t index_limit = 0xffffffffull / arena_slots_;
  if (budget > index_limit) budget = index_limit; // still >= ceil(capacity_ / arena_slots_)
  arena_budget_ = static_cast<std::uint32_t>(budget);

  nodes_.reset(new (std::nothrow) node_state[static_cast<std::size_t>(node_count_)]);
  arenas_.reset(new (std::nothrow) arena_entry[arena_budget_ ? arena_budget_ : 1]);
  int max_os = 0;
  for (int i = 0; i < topo_nodes; ++i)
    if (numa_topology_node_os_index(topo_, i) > max_os)
      max_os = numa_topology_node_os_index(topo_, i);
  os_to_dense_.reset(new (std::nothrow) std::int16_t[static_cast<std::size_t>(max_os) + 1]);
  const int max_cpu = numa_topology_max_cpu(topo_);
  cpu_to_dense_.reset(new (std::nothrow)
                          std::int16_t[static_cast<std::size_t>(max_cpu < 0 ? 0 : max_cpu) + 1]);
  if (!nodes_ || !arenas_ || !os_to_dense_ || !cpu_to_dense_) {
    // Out of memory at device open: a pool that refuses every allocation (ENOMEM).
    if (!nodes_) nodes_.reset(new (std::nothrow) node_state[1]);
    if (nodes_) nodes_[0].head = &top_->list;
    node_count_ = 1;
    capacity_ = arena_budget_ = 0;
    os_to_dense_size_ = cpu_to_dense_size_ = 0;
    return;
  }
  nodes_[0].head = &top_->list;
  for (int i = 1; i < node_count_; ++i) nodes_[i].head = &*nodes_[i].own_head;
  os_to_dense_size_ = max_os + 1;
  for (int i = 0; i < os_to_dense_size_; ++i) os_to_dense_[i] = -1;
  if (topo_nodes == 0) {
    os_to_dense_[0] = 0; // hwloc failed: one node, called 0
    nodes_[0].os_index = 0;
  }
  for (int i = 0; i < topo_nodes; ++i) {
    nodes_[i].os_index = numa_topology_node_os_index(topo_, i);
    os_to_dense_[nodes_[i].os_index] = static_cast<std::int16_t>(i);
  }
  cpu_to_dense_size_ = max_cpu + 1;
  for (int c = 0; c < cpu_to_dense_size_; ++c) {
    const int d = numa_topology_node_of_cpu(topo_, c);
    cpu_to_dense_[c] = static_cast<std::int16_t>(d < 0 ? 0 : d); // CPU without a node: node 0
  }
}

slot_pool::~slot_pool() {
  const std::uint32_t used = arenas_used_.load(std::memory_order_acquire);
  const std::size_t bytes = std::size_t{arena_slots_} * sizeof(slot);
  static_assert(std::is_trivially_destructible_v<slot>,
                "arenas are freed without destructor calls");
  for (std::uint32_t a = 0; a < used; ++a)
    numa_topology_free(topo_, arenas_[a].base.load(std::memory_order_relaxed), bytes);
  destroy_numa_topology(topo_);
}

int slot_pool::current_dense_node() const noexcept {
  if (node_count_ == 1) return 0;
  const int cpu = current_cpu_ ? current_cpu_() : real_current_cpu();
  if (cpu < 0 || cpu >= cpu_to_dense_size_) return 0; // a CPU the topology does not know
  return cpu_to_dense_[cpu];
}

void* slot_pool::hwloc_topology() const noexcept { return numa_topology_hwloc(topo_); }

std::string slot_pool::status() const {
  std::lock_guard lock(grow_);
  const std::uint32_t used = arenas_used_.load(std::memory_order_relaxed);
  const std::uint32_t unbound = unbound_arenas_.load(std::memory_order_relaxed);
  std::string s = numa_topology_describe(topo_);
  s += "; " + std::to_string(used) + " arena(s) of " + std::to_string(arena_slots_) + " slots";
  if (binding_supported_ && unbound != 0)
    s += ", " + std::to_string(unbound) + " of them not bound (the OS refused the binding)";
  return s;
}

bool slot_pool::reserve() noexcept {
  // A CAS loop rather than fetch_add + undo: a transient over-count by a refused caller could
  // otherwise refuse another caller while fewer than capacity_ slots are live. The holds in the
  // high half are carried along unchanged.
  std::uint64_t w = top_->count.load(std::memory_order_relaxed);
  do {
    if (static_cast<std::uint32_t>(w) >= capacity_) return false;
  } while (!top_->count.compare_exchange_weak(w, w + 1, std::memory_order_relaxed,
                                              std::memory_order_relaxed));
  return true;
}

// A node's free list is a tagged index stack (src/core/tagged_index_stack.hpp: ABA, ordering)
// linked through slot::next_free; safe on a slot popped and reused meanwhile because arenas are
// never freed.
slot* slot_pool::pop_free(node_state& n) noexcept {
  auto link = [this](std::uint32_t i) noexcept -> std::atomic<std::uint32_t>& {
    return find(i)->next_free;
  };
  // The next pop will chase `next`: start its two cache misses now (a cold free list is a linked
  // list through 128 MB for a million counters; each hop is a dependent DRAM load).
  auto prefetch_next = [this](std::uint32_t next) noexcept {
    if (const slot* n2 = next != 0 ? find(next - 1) : nullptr) {
      __builtin_prefetch(n2, 1, 3);
      __builtin_prefetch(reinterpret_cast<const char*>(n2) + cache_line_size, 1, 3);
    }
  };
  const std::uint32_t top = tagged_pop(*n.head, link, prefetch_next);
  return top != 0 ? find(top - 1) : nullptr;
}

void slot_pool::push_free(node_state& n, slot& s) noexcept {
  tagged_push(*n.head, s.index,
              [&s](std::uint32_t) noexcept -> std::atomic<std::uint32_t>& { return s.next_free; });
}

slot* slot_pool::bump_slot(node_state& n, std::uint64_t& seen) noexcept {
  // Look before the fetch_add: an exhausted word is not incremented further, so its position
  // field exceeds arena_slots_ by at most the number of threads racing here (no overflow into
  // the arena field, however long the budget stays spent).
  std::uint64_t w = n.bump->load(std::memory_order_acquire);
  seen = w;
  if (hi_of(w) == 0 || lo_of(w) >= arena_slots_) return nullptr;
  w = n.bump->fetch_add(1, std::memory_order_acquire);
  seen = w;
  if (lo_of(w) >= arena_slots_) return nullptr;
  // The acquire above pairs with grow()'s release store of this word: the arena is visible.
  const std::uint32_t a = hi_of(w) - 1;
  return construct_slot(arenas_[a].base.load(std::memory_order_relaxed) + lo_of(w),
                        a * arena_slots_ + lo_of(w), arenas_[a].node);
}

slot* slot_pool::construct_slot(void* where, std::uint32_t index, int node) noexcept {
  slot* s = new (where) slot;
  s->index = index;
  s->numa_node = nodes_[node].os_index; // fixed for the slot's life
  return s;
}

slot_pool::grow_result slot_pool::grow(int node, std::uint64_t seen, slot*& out) noexcept {
  node_state& n = nodes_[node];
  std::lock_guard lock(grow_);
  // The arena field of a bump word only changes under grow_, so this is exact.
  if (hi_of(n.bump->load(std::memory_order_relaxed)) != hi_of(seen)) return grow_result::retry;
  const std::uint32_t a = arenas_used_.load(std::memory_order_relaxed);
  if (a >= arena_budget_) return grow_result::no_budget;
  if (fail_arena_alloc_ && fail_arena_alloc_()) return grow_result::no_memory;
  const std::size_t bytes = std::size_t{arena_slots_} * sizeof(slot);
  bool bound = false;
  void* mem = numa_topology_alloc(topo_, node, bytes, bound);
  if (!mem) return grow_result::no_memory; // nothing consumed: the next call tries again
  // Slots are constructed one by one as bump_slot() hands them out, not here: an arena's pages
  // are only touched (and resident) once used, so resident memory is 128 B per slot ever used,
  // and the critical section stays short.
  slot* base = construct_slot(mem, a * arena_slots_, node);
  if (!bound) unbound_arenas_.fetch_add(1, std::memory_order_relaxed);
  arenas_[a].node = node;
  arenas_[a].base.store(base, std::memory_order_release);
  arenas_used_.store(a + 1, std::memory_order_release);
  // Publish the arena to bump_slot(): position 0 is ours. fetch_adds racing on the exhausted
  // old word all fail (position >= arena_slots_) and are overwritten here.
  n.bump->store(pack(a + 1, 1), std::memory_order_release);
  out = base;
  return grow_result::grown;
}

slot* slot_pool::take(int node, std::error_code& ec) noexcept {
  node_state& n = nodes_[node];
  grow_result g;
  for (;;) {
    if (slot* s = pop_free(n)) return s;
    std::uint64_t seen = 0;
    if (slot* s = bump_slot(n, seen)) return s;
    slot* s = nullptr;
    g = grow(node, seen, s);
    if (g == grow_result::grown) return s;
    if (g != grow_result::retry) break;
  }
  // The node cannot grow: take a free or never-used slot of any node, nearest-numbered first.
  for (;;) {
    for (int k = 1; k <= node_count_; ++k) {
      node_state& o = nodes_[(node + k) % node_count_];
      if (slot* s = pop_free(o)) return s;
      std::uint64_t seen = 0;
      if (slot* s = bump_slot(o, seen)) return s;
    }
    if (g == grow_result::no_memory) {
      fail_into(ec, ENOMEM,
                "out of memory for a new arena of %u counter slots (%zu bytes) on NUMA node %d",
                arena_slots_, std::size_t{arena_slots_} * sizeof(slot), nodes_[node].os_index);
      return nullptr;
    }
    // no_budget: the arenas hold >= capacity_ slots and our reservation guarantees one of them
    // is free or never used; another thread took the one we were about to see. Look again
    // (lock-free: we only loop because other allocations complete).
  }
}

[[gnu::noinline, gnu::cold]] slot* slot_pool::fail_node(int numa_node,
                                                        std::error_code& ec) noexcept {
  char list[128];
  int len = 0;
  for (int i = 0; i < node_count_ && len < 100; ++i)
    len += std::snprintf(list + len, sizeof list - static_cast<std::size_t>(len), "%s%d",
                         i ? "," : "", nodes_[i].os_index);
  fail_into(ec, EINVAL, "NUMA node %d does not exist (this device's topology has node(s) %s)",
            numa_node, list);
  return nullptr;
}

// Every case but a free slot of node 0 on a fused pool: reserve (exact capacity), then a free,
// never-used or new-arena slot of `node` or, once the arena budget is spent, of any node.
slot* slot_pool::reserve_and_take(int node, std::error_code& ec) noexcept {
  if (!reserve()) {
    fail_into(ec, ENOMEM,
              "counter pool is full: %u counters live (max_counters; set "
              "COMPCNTR_MAX_COUNTERS before opening the device to change it)",
              capacity_);
    return nullptr;
  }
  slot* s = take(node, ec);
  if (!s) {
    top_->count.fetch_sub(1, std::memory_order_relaxed);
    return nullptr;
  }
  reset_slot(*s);
  return s;
}

slot* slot_pool::allocate_general(int numa_node, std::error_code& ec) noexcept {
  int node = 0;
  if (numa_node >= 0) {
    if ((node = dense_node(numa_node)) < 0) [[unlikely]]
      return fail_node(numa_node, ec);
  } else {
    node = current_dense_node();
  }
  if (node == 0 && fused_) [[likely]] {
    if (slot* s = pop_counted()) {
      reset_slot(*s);
      return s;
    }
  }
  return reserve_and_take(node, ec);
}

bool slot_pool::release_general(slot& s) noexcept {
  // arenas_[..].node was written before the arena was published, which happens-before this
  // slot was handed out and therefore before its release.
  const int node = arenas_[s.index >> arena_shift_].node;
  if (node == 0 && fused_) [[likely]]
    return push_uncounted(s);
  push_free(nodes_[node], s);
  return top_->count.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

} // namespace compcntr::detail
