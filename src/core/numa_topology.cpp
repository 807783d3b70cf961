// The hwloc side of the slot pool (compcntr:pool): loading the topology, mapping CPUs to NUMA
// nodes, allocating and freeing arena memory bound to a node, and reading the current CPU.
//
// Loaded once per process (issue 22): every device open used to load the topology (~5 ms of
// CPU on a 2-vCPU VM, and hwloc 2.9 can crash inside its load under malloc failure). Now the
// first open of each topology source (this machine, a synthetic description, an XML file, as
// named by the pool_config or HWLOC_SYNTHETIC / HWLOC_XMLFILE at that open) loads it, under a
// mutex, and every later pool with the same source shares it. Shared topologies are never
// destroyed (they stay reachable from the cache, so LeakSanitizer does not count them); a load
// that failed is not cached (the next open tries again: the failure may have been ENOMEM).
// Sharing is safe: after the load nothing modifies a topology; pools only query it and call
// hwloc's (de)allocation and membind queries, which read it (hwloc's thread-safety rule for
// read-only use). The membind query that fills hwloc's lazily cached sysfs state runs inside the
// load, under the mutex.
module;
#include <hwloc.h>
// LeakSanitizer's root regions for the arenas (numa_topology_alloc).
#if defined(__SANITIZE_ADDRESS__)
#define COMPCNTR_LSAN_ROOTS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COMPCNTR_LSAN_ROOTS 1
#endif
#endif
#ifdef COMPCNTR_LSAN_ROOTS
#include <sanitizer/lsan_interface.h>
#endif
#include <sched.h>
#if __has_include(<sys/rseq.h>)
#include <sys/rseq.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>
module compcntr;

namespace compcntr::detail {

struct numa_topology {
  hwloc_topology_t topo = nullptr;     ///< nullptr if hwloc failed (one node, plain memory)
  std::vector<hwloc_obj_t> nodes;      ///< NUMA node objects, dense index = position
  bool can_bind = false;               ///< this system, and hwloc can bind area memory here
  std::string source;                  ///< "this machine", "synthetic '...'", "XML file '...'"
  std::string problem;                 ///< why hwloc or binding failed, empty if it did not
  std::string key;                     ///< the cache key of its source
  bool shared = false;                 ///< in the process-wide cache: never destroyed
  numa_topology* next = nullptr;       ///< the next cached topology
};

namespace {

std::string sprintf_string(const char* fmt, const char* a, int err) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, a, std::strerror(err));
  return buf;
}

// The node local to a CPU: among the NUMA nodes whose cpuset holds the CPU, the one with the
// smallest cpuset (the most local one: a package's node rather than a CPU-less memory node
// attached to the whole machine); ties go to the lowest OS index. This reads only the nodes'
// cpusets, so it does not depend on which intermediate levels the topology keeps.
int local_node_of(const std::vector<hwloc_obj_t>& nodes, unsigned cpu) noexcept {
  int best = -1;
  int best_weight = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (!nodes[i]->cpuset || !hwloc_bitmap_isset(nodes[i]->cpuset, cpu)) continue;
    const int w = hwloc_bitmap_weight(nodes[i]->cpuset);
    if (best < 0 || w < best_weight) {
      best = static_cast<int>(i);
      best_weight = w;
    }
  }
  return best;
}

} // namespace

int real_current_cpu() noexcept {
#if __has_include(<sys/rseq.h>) && defined(RSEQ_SIG)
  // glibc >= 2.35 registers rseq for every thread; the kernel keeps cpu_id (offset 4) current
  // on every return to user space. This is what sched_getcpu() reads in that case, without the
  // call. -1 / -2 mean "not registered": fall back to the call.
  if (__rseq_size >= 8) {
    const auto* area = reinterpret_cast<const volatile struct rseq*>(
        static_cast<const char*>(__builtin_thread_pointer()) + __rseq_offset);
    const int cpu = static_cast<int>(area->cpu_id);
    if (cpu >= 0) return cpu;
  }
#endif
  return sched_getcpu();
}

namespace {

// The process-wide cache (a list: a process sees one or a few sources) and its lock, both
// constant-initialised and trivially destructible (a pool may outlive static destructors).
constinit std::mutex cache_mu;
numa_topology* cache_head = nullptr;  // under cache_mu

// Loads a topology for t (its source and key set); see load_numa_topology.
void load_into(numa_topology*& t, const pool_config& cfg);

} // namespace

numa_topology* load_numa_topology(const pool_config& cfg) noexcept {
  auto* t = new (std::nothrow) numa_topology;
  if (!t) return nullptr;
  try {
    // The source, and the cache key that names it (the same words without the origin).
    if (cfg.synthetic) {
      t->source = std::string("synthetic topology '") + cfg.synthetic + "'";
      t->key = std::string("S:") + cfg.synthetic;
    } else if (cfg.xml_file) {
      t->source = std::string("XML topology '") + cfg.xml_file + "'";
      t->key = std::string("X:") + cfg.xml_file;
    } else if (const char* s = std::getenv("HWLOC_SYNTHETIC"); s && *s) {
      t->source = std::string("synthetic topology '") + s + "' (HWLOC_SYNTHETIC)";
      t->key = std::string("ES:") + s;
    } else if (const char* x = std::getenv("HWLOC_XMLFILE"); x && *x) {
      t->source = std::string("XML topology '") + x + "' (HWLOC_XMLFILE)";
      t->key = std::string("EX:") + x;
    } else {
      t->source = "this machine";
      t->key = "M";
    }
  } catch (...) {  // std::bad_alloc from a string
    delete t;
    return nullptr;
  }
  std::lock_guard lock(cache_mu);
  for (numa_topology* c = cache_head; c; c = c->next)
    if (c->key == t->key) {
      delete t;
      return c;
    }
  load_into(t, cfg);
  if (t == nullptr || t->topo == nullptr) return t;  // not cached: the next open tries again
  t->shared = true;
  t->next = cache_head;
  cache_head = t;
  return t;
}

namespace {

void load_into(numa_topology*& t, const pool_config& cfg) {
  try {
    hwloc_topology_t topo = nullptr;
    if (hwloc_topology_init(&topo) != 0) {
      t->problem = sprintf_string("hwloc_topology_init failed%s: %s", "", errno);
      return;
    }
    // Only PUs, NUMA nodes and the nodes' cpusets matter here, but no type filter is set: a NUMA
    // node's cpuset is the one of the object it hangs from, so dropping packages / groups / caches
    // would widen it to the machine. hwloc's x86 backend (cpuid on every PU, each a VM exit
    // under a hypervisor) adds nothing NUMA-related on Linux: skipping it saves ~1/3 of the
    // ~5 ms of CPU time a load costs on this 2-vCPU VM. I/O discovery is off by default.
    hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
    // Each failure destroys the topology before building its message: the message may throw
    // std::bad_alloc, and the catch below only frees what t owns (the fault suite found the
    // leak: a failed load followed by an allocation failure).
    if (cfg.synthetic && hwloc_topology_set_synthetic(topo, cfg.synthetic) != 0) {
      const int err = errno;
      hwloc_topology_destroy(topo);
      t->problem =
          sprintf_string("hwloc rejected the synthetic description '%s': %s", cfg.synthetic, err);
      return;
    }
    if (!cfg.synthetic && cfg.xml_file && hwloc_topology_set_xml(topo, cfg.xml_file) != 0) {
      const int err = errno;
      hwloc_topology_destroy(topo);
      t->problem = sprintf_string("hwloc cannot read the XML topology '%s': %s", cfg.xml_file, err);
      return;
    }
    if (hwloc_topology_load(topo) != 0) {
      const int err = errno;
      hwloc_topology_destroy(topo);
      t->problem = sprintf_string("hwloc_topology_load failed%s: %s", "", err);
      return;
    }
    t->topo = topo;
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n;
         n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n))
      t->nodes.push_back(n);
    std::sort(t->nodes.begin(), t->nodes.end(),
              [](hwloc_obj_t a, hwloc_obj_t b) { return a->os_index < b->os_index; });
    const hwloc_topology_support* sup = hwloc_topology_get_support(topo);
    t->can_bind = hwloc_topology_is_thissystem(topo) && sup->membind->alloc_membind &&
                  sup->membind->bind_membind;
    if (t->can_bind) {
      // hwloc reads the kernel's possible-node count from sysfs on its first membind query and
      // caches it (through a 4 KiB heap buffer that stays resident). Do it now, so it belongs to
      // opening the device rather than to the first counter (and to no counter's memory).
      hwloc_nodeset_t set = hwloc_bitmap_alloc();
      hwloc_membind_policy_t policy;
      if (set)
        hwloc_get_membind(topo, set, &policy, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
      hwloc_bitmap_free(set);
    }
    if (!hwloc_topology_is_thissystem(topo))
      t->problem = t->source + " is not this system: arenas are not bound to their nodes";
    else if (!t->can_bind)
      t->problem = "hwloc cannot bind memory on this system: arenas are not bound to their nodes";
  } catch (...) { // std::bad_alloc from a string or vector
    if (t->topo) hwloc_topology_destroy(t->topo);
    delete t;
    t = nullptr;
  }
}

} // namespace

void destroy_numa_topology(numa_topology* t) noexcept {
  if (!t || t->shared) return; // a shared topology stays for the life of the process
  if (t->topo) hwloc_topology_destroy(t->topo);
  delete t;
}

int numa_topology_nodes(const numa_topology* t) noexcept {
  return t && !t->nodes.empty() ? static_cast<int>(t->nodes.size()) : 0;
}

int numa_topology_node_os_index(const numa_topology* t, int dense) noexcept {
  return static_cast<int>(t->nodes[static_cast<std::size_t>(dense)]->os_index);
}

int numa_topology_max_cpu(const numa_topology* t) noexcept {
  if (!t || !t->topo) return -1;
  return hwloc_bitmap_last(hwloc_topology_get_topology_cpuset(t->topo));
}

int numa_topology_node_of_cpu(const numa_topology* t, int cpu) noexcept {
  if (!t || !t->topo || cpu < 0) return -1;
  return local_node_of(t->nodes, static_cast<unsigned>(cpu));
}

bool numa_topology_can_bind(const numa_topology* t) noexcept { return t && t->topo && t->can_bind; }

std::string numa_topology_describe(const numa_topology* t) {
  if (!t) return "no topology (out of memory): one node, unbound memory";
  std::string s = t->source;
  if (!t->topo) return s + ": " + t->problem + "; using one node and unbound memory";
  s += ": " + std::to_string(t->nodes.size()) + " NUMA node(s) (";
  for (std::size_t i = 0; i < t->nodes.size(); ++i)
    s += (i ? "," : "") + std::to_string(t->nodes[i]->os_index);
  s += ")";
  if (!t->problem.empty()) s += "; " + t->problem;
  return s;
}

namespace {

// Under LeakSanitizer the arenas are root regions: a bound arena is mmap'd (hwloc), and LSan
// scans only the heap, stacks and globals, so the blocks a live counter's slot points to (its
// extension block: fds, pollers, triggers) looked leaked at the exit of a program that had not
// destroyed its counters (found by the runtime fault sweep under ASan, issue 22).

void* lsan_root(void* p, std::size_t bytes) noexcept {
#ifdef COMPCNTR_LSAN_ROOTS
  if (p) __lsan_register_root_region(p, bytes);
#else
  (void)bytes;
#endif
  return p;
}
void lsan_unroot(void* p, std::size_t bytes) noexcept {
#ifdef COMPCNTR_LSAN_ROOTS
  __lsan_unregister_root_region(p, bytes);
#else
  (void)p;
  (void)bytes;
#endif
}

} // namespace

void* numa_topology_alloc(numa_topology* t, int dense, std::size_t bytes, bool& bound) noexcept {
  bound = false;
  if (!t || !t->topo) return lsan_root(std::aligned_alloc(4096, bytes), bytes); // 4096 | bytes
  if (!t->can_bind) return lsan_root(hwloc_alloc(t->topo, bytes), bytes); // page-aligned, unbound
  hwloc_obj_t node = t->nodes[static_cast<std::size_t>(dense)];
  // BIND without STRICT: Linux MPOL_PREFERRED, i.e. pages come from the node while it has free
  // memory and from another node rather than failing (a counter must never SIGBUS).
  void* p = hwloc_alloc_membind(t->topo, bytes, node->nodeset, HWLOC_MEMBIND_BIND,
                                HWLOC_MEMBIND_BYNODESET);
  if (!p) return nullptr;
  lsan_root(p, bytes);
  // Without STRICT, hwloc does not say whether the binding took: ask the kernel about the first
  // page (one get_mempolicy call per arena).
  hwloc_nodeset_t got = hwloc_bitmap_alloc();
  hwloc_membind_policy_t policy;
  if (got && hwloc_get_area_membind(t->topo, p, 1, got, &policy, HWLOC_MEMBIND_BYNODESET) == 0)
    bound = policy == HWLOC_MEMBIND_BIND && hwloc_bitmap_isequal(got, node->nodeset);
  hwloc_bitmap_free(got);
  return p;
}

void numa_topology_free(numa_topology* t, void* p, std::size_t bytes) noexcept {
  if (!p) return;
  lsan_unroot(p, bytes);
  if (!t || !t->topo)
    std::free(p);
  else
    hwloc_free(t->topo, p, bytes);
}

void* numa_topology_hwloc(const numa_topology* t) noexcept { return t ? t->topo : nullptr; }

} // namespace compcntr::detail
