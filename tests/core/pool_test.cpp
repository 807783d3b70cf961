// The NUMA-aware slot pool (compcntr:pool), counter handles (compcntr:counter_ref) and
// compcntr_comp_cntr_numa_node: placement on synthetic / XML / real topologies, capacity,
// arena growth and failure, stress, stale handles.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "support.hpp"

using test_support::make_counter;
using test_support::open_soft;

using compcntr::detail::pool_config;
using compcntr::detail::slot;
using compcntr::detail::slot_pool;

namespace {

// The "CPU the calling thread runs on" for pools on synthetic topologies: each thread sets it.
thread_local int fake_cpu = 0;
int fake_current_cpu() noexcept { return fake_cpu; }

std::string topology_file(const char* name) { return std::string(COMPCNTR_TESTS_DIR) + "/" + name; }

bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != hay.npos; }

slot* take(slot_pool& p, int node) {
  std::error_code ec;
  slot* s = p.allocate(node, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(s != nullptr);
  return s;
}

// Sets (or unsets, with v == nullptr) an environment variable for one scope.
struct scoped_env {
  std::string name;
  std::string old;
  bool had;
  scoped_env(const char* n, const char* v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (v)
      ::setenv(n, v, 1);
    else
      ::unsetenv(n);
  }
  ~scoped_env() {
    if (had)
      ::setenv(name.c_str(), old.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

// Pins the calling thread to `cpu` for one scope (restores the previous mask).
struct scoped_pin {
  cpu_set_t old;
  bool ok = false;
  explicit scoped_pin(int cpu) {
    if (pthread_getaffinity_np(pthread_self(), sizeof old, &old) != 0 || !CPU_ISSET(cpu, &old)) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    ok = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
  }
  ~scoped_pin() {
    if (ok) pthread_setaffinity_np(pthread_self(), sizeof old, &old);
  }
};


}  // namespace

TEST_CASE("synthetic 2-node topology: the calling thread's CPU picks the node; explicit and invalid nodes") {
  slot_pool pool(pool_config{.capacity = 1000, .synthetic = "numa:2 core:2 pu:1",
                             .current_cpu = fake_current_cpu});
  REQUIRE(pool.numa_nodes() == 2);
  CHECK(pool.numa_node_id(0) == 0);
  CHECK(pool.numa_node_id(1) == 1);
  CHECK(pool.has_numa_node(1));
  CHECK_FALSE(pool.has_numa_node(2));
  CHECK_FALSE(pool.has_numa_node(-1));
  // A synthetic topology is not this machine: no binding, and the pool says so.
  CHECK_FALSE(pool.binding_supported());
  CHECK_FALSE(pool.memory_bound());
  CHECK(contains(pool.status(), "not this system"));
  CHECK(contains(pool.status(), "2 NUMA node(s) (0,1)"));

  std::vector<slot*> got;
  for (int cpu = 0; cpu < 4; ++cpu) {  // PUs 0,1 on node 0; PUs 2,3 on node 1
    fake_cpu = cpu;
    CHECK(pool.current_numa_node() == cpu / 2);
    slot* s = take(pool, -1);
    CHECK(s->numa_node == cpu / 2);
    got.push_back(s);
  }
  // Another thread "bound" to PU 3 gets node 1, whatever this thread does.
  fake_cpu = 0;
  int other = -1;
  std::thread([&] {
    fake_cpu = 3;
    std::error_code ec;
    slot* s = pool.allocate(-1, ec);
    other = s ? s->numa_node : -2;
    if (s) pool.release(*s);
  }).join();
  CHECK(other == 1);
  // Explicit nodes override the thread's node.
  slot* s1 = take(pool, 1);
  CHECK(s1->numa_node == 1);
  got.push_back(s1);
  // One arena per node, and each node's slots come from its own arena.
  CHECK(pool.arenas() == 2);
  CHECK(pool.arena_slots() == 1024);  // capacity 1000 rounded up to a power of two
  CHECK(got[0]->index / pool.arena_slots() != got[2]->index / pool.arena_slots());
  CHECK(got[0]->index / pool.arena_slots() == got[1]->index / pool.arena_slots());

  const auto live = pool.live();
  for (int bad : {2, 3, 64, 1 << 20}) {
    std::error_code ec;
    CHECK(pool.allocate(bad, ec) == nullptr);
    CHECK(ec == std::errc::invalid_argument);
    const std::string msg(compcntr::last_error_message());
    CHECK(contains(msg, "NUMA node " + std::to_string(bad) + " does not exist"));
    CHECK(contains(msg, "0,1"));
  }
  CHECK(pool.live() == live);  // refused calls change nothing
  for (slot* s : got) pool.release(*s);
  CHECK(pool.live() == 0);
}

TEST_CASE("synthetic 4-node topology: every node reachable by CPU and explicitly") {
  slot_pool pool(pool_config{.capacity = 1 << 16, .synthetic = "pack:2 numa:2 core:2 pu:1",
                             .current_cpu = fake_current_cpu});
  REQUIRE(pool.numa_nodes() == 4);
  CHECK(pool.arena_slots() == slot_pool::default_arena_slots);
  CHECK(pool.arena_budget() == 16 + 3);
  std::vector<slot*> got;
  for (int cpu = 0; cpu < 8; ++cpu) {  // node = PU / 2
    fake_cpu = cpu;
    CHECK(pool.current_numa_node() == cpu / 2);
    slot* s = take(pool, -1);
    CHECK(s->numa_node == cpu / 2);
    got.push_back(s);
  }
  fake_cpu = 0;
  for (int node = 0; node < 4; ++node) {
    slot* s = take(pool, node);
    CHECK(s->numa_node == node);
    got.push_back(s);
  }
  CHECK(pool.arenas() == 4);
  CHECK(pool.arena_bytes() == 4u * slot_pool::default_arena_slots * 128u);
  fake_cpu = 1000;  // a CPU the topology does not know: the first node
  CHECK(pool.current_numa_node() == 0);
  std::error_code ec;
  CHECK(pool.allocate(4, ec) == nullptr);
  CHECK(ec == std::errc::invalid_argument);
  for (slot* s : got) pool.release(*s);
  CHECK(pool.live() == 0);
}

TEST_CASE("XML topology: node OS indexes with gaps and a CPU-less memory node") {
  const std::string xml = topology_file("topology-3node.xml");
  slot_pool pool(pool_config{.capacity = 1000, .xml_file = xml.c_str(), .current_cpu = fake_current_cpu});
  REQUIRE(pool.numa_nodes() == 3);
  CHECK(pool.numa_node_id(0) == 0);
  CHECK(pool.numa_node_id(1) == 2);
  CHECK(pool.numa_node_id(2) == 5);
  CHECK_FALSE(pool.binding_supported());
  for (int cpu = 0; cpu < 4; ++cpu) {  // CPUs 0-1: node 0, CPUs 2-3: node 2; never the memory node 5
    fake_cpu = cpu;
    CHECK(pool.current_numa_node() == (cpu < 2 ? 0 : 2));
    slot* s = take(pool, -1);
    CHECK(s->numa_node == (cpu < 2 ? 0 : 2));
    pool.release(*s);
  }
  slot* mem = take(pool, 5);  // explicit: the memory-only node
  CHECK(mem->numa_node == 5);
  pool.release(*mem);
  for (int bad : {1, 3, 4, 6}) {
    std::error_code ec;
    CHECK(pool.allocate(bad, ec) == nullptr);
    CHECK(ec == std::errc::invalid_argument);
    CHECK(contains(compcntr::last_error_message(), "0,2,5"));
  }
  CHECK(pool.live() == 0);
}

TEST_CASE("a topology hwloc cannot load degrades to one unbound node and says why") {
  const std::string missing = topology_file("no-such-topology.xml");
  slot_pool pool(pool_config{.capacity = 10, .xml_file = missing.c_str()});
  CHECK(pool.numa_nodes() == 1);
  CHECK(pool.numa_node_id(0) == 0);
  CHECK_FALSE(pool.memory_bound());
  CHECK(contains(pool.status(), "no-such-topology.xml"));
  slot* s = take(pool, -1);
  CHECK(s->numa_node == 0);
  pool.release(*s);
}

TEST_CASE("a thread bound to a node's CPU gets that node (device, HWLOC_SYNTHETIC, real binding)") {
  // Two synthetic nodes of one PU each: real CPU k is PU k of node k, so binding the thread for
  // real (sched_setaffinity) moves its counters between nodes.
  scoped_env env("HWLOC_SYNTHETIC", "numa:2 pu:1");
  scoped_env no_xml("HWLOC_XMLFILE", nullptr);
  auto dev = open_soft();
  REQUIRE(dev.core()->pool().numa_nodes() == 2);
  int tested = 0;
  for (int cpu = 0; cpu < 2; ++cpu) {
    scoped_pin pin(cpu);
    if (!pin.ok) continue;
    ++tested;
    std::error_code ec;
    auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
    REQUIRE_FALSE(ec);
    CHECK(c.numa_node() == cpu);
    // Explicit nodes through the C++ options.
    auto other = dev.create_counter({.type = compcntr::counter_type::wrs, .numa_node = 1 - cpu}, ec);
    REQUIRE_FALSE(ec);
    CHECK(other.numa_node() == 1 - cpu);
  }
  if (tested < 2) MESSAGE("only " << tested << " of CPUs 0,1 usable: real-binding placement partly untested");
  CHECK(tested >= 1);
  std::error_code ec;
  auto bad = dev.create_counter({.type = compcntr::counter_type::wrs, .numa_node = 2}, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(bad);
  CHECK(dev.live_counters() == 0);
}

TEST_CASE("C API: the NUMA comp_mask bit, compcntr_comp_cntr_numa_node, invalid nodes") {
  scoped_env env("HWLOC_SYNTHETIC", "pack:2 numa:2 core:2 pu:1");
  scoped_env no_xml("HWLOC_XMLFILE", nullptr);
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  std::vector<compcntr_comp_cntr*> cs;
  for (int node = 0; node < 4; ++node) {
    compcntr_comp_cntr_init_attr a{};
    a.comp_mask = COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE;
    a.numa_node = node;
    compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &a);
    REQUIRE(cc);
    CHECK(compcntr_comp_cntr_numa_node(cc) == node);
    cs.push_back(cc);
  }
  // Without the bit numa_node is ignored: the node of this thread's CPU (0 or 1 here: PUs 0-1
  // are node 0, PUs 2-3 node 1, and the real machine has CPUs 0 and 1).
  compcntr_comp_cntr_init_attr a{};
  a.numa_node = 3;
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &a);
  REQUIRE(cc);
  CHECK(compcntr_comp_cntr_numa_node(cc) == 0);
  cs.push_back(cc);
  for (int bad : {4, 100, -1}) {
    a.comp_mask = COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE;
    a.numa_node = bad;
    errno = 0;
    CHECK(compcntr_create_comp_cntr(dev, &a) == nullptr);
    CHECK(errno == EINVAL);
    CHECK(contains(compcntr_last_error_message(), "NUMA node"));
  }
  CHECK(compcntr_comp_cntr_numa_node(nullptr) == -EINVAL);
  CHECK(contains(compcntr_last_error_message(), "cc is NULL"));
  for (auto* c : cs) CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("real machine: a slot's memory is on the node the pool claimed (hwloc_get_area_memlocation)") {
  scoped_env no_syn("HWLOC_SYNTHETIC", nullptr);
  scoped_env no_xml("HWLOC_XMLFILE", nullptr);
  auto dev = open_soft();
  const slot_pool& pool = dev.core()->pool();
  hwloc_topology_t topo;
  REQUIRE(hwloc_topology_init(&topo) == 0);
  REQUIRE(hwloc_topology_load(topo) == 0);
  REQUIRE(pool.numa_nodes() == hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE));
  // Linux + hwloc can bind here; if this machine's kernel refused, the pool must say so.
  CHECK(pool.binding_supported());
  hwloc_nodeset_t where = hwloc_bitmap_alloc();
  std::vector<compcntr::counter> keep;
  for (int i = 0; i < pool.numa_nodes(); ++i) {
    const int node = pool.numa_node_id(i);
    std::error_code ec;
    auto c = dev.create_counter({.type = compcntr::counter_type::wrs, .numa_node = node}, ec);
    REQUIRE_FALSE(ec);
    CHECK(c.numa_node() == node);
    c.add(1);  // first touch by its user (the arena was also touched when it was built)
    REQUIRE(hwloc_get_area_memlocation(topo, c.native_slot(), sizeof(slot), where, HWLOC_MEMBIND_BYNODESET) == 0);
    CHECK(hwloc_bitmap_weight(where) == 1);
    CHECK(hwloc_bitmap_isset(where, static_cast<unsigned>(node)));
    keep.push_back(std::move(c));
  }
  CHECK(pool.memory_bound());
  // Default placement: the node hwloc names for the CPU this thread runs on.
  {
    scoped_pin pin(0);
    hwloc_cpuset_t cpu = hwloc_bitmap_alloc();
    REQUIRE(hwloc_get_last_cpu_location(topo, cpu, HWLOC_CPUBIND_THREAD) == 0);
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(topo, static_cast<unsigned>(hwloc_bitmap_first(cpu)));
    REQUIRE(pu);
    hwloc_obj_t local = hwloc_get_next_obj_covering_cpuset_by_type(topo, pu->cpuset, HWLOC_OBJ_NUMANODE, nullptr);
    REQUIRE(local);
    std::error_code ec;
    auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
    REQUIRE_FALSE(ec);
    CHECK(c.numa_node() == static_cast<int>(local->os_index));
    c.add(1);
    REQUIRE(hwloc_get_area_memlocation(topo, c.native_slot(), sizeof(slot), where, HWLOC_MEMBIND_BYNODESET) == 0);
    CHECK(hwloc_bitmap_isset(where, local->os_index));
    hwloc_bitmap_free(cpu);
  }
  hwloc_bitmap_free(where);
  hwloc_topology_destroy(topo);
}

TEST_CASE("capacity: exact under concurrent creation, ENOMEM changes nothing, recovery reuses arenas") {
  scoped_env env("COMPCNTR_MAX_COUNTERS", "1000");
  auto dev = open_soft();
  CHECK(dev.caps().max_counters == 1000);
  constexpr int threads = 4;
  std::vector<std::vector<compcntr::counter>> owned(threads);
  std::atomic<int> enomem{0}, other_errors{0};
  auto fill = [&](int t) {
    for (;;) {
      std::error_code ec;
      auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
      if (ec == std::errc::not_enough_memory) {
        ++enomem;
        return;
      }
      if (ec || !c) {
        ++other_errors;
        return;
      }
      owned[t].push_back(std::move(c));
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(fill, t);
  for (auto& t : ts) t.join();
  ts.clear();
  std::size_t total = 0;
  for (auto& v : owned) total += v.size();
  CHECK(total == 1000);  // not one more, not one less
  CHECK(enomem.load() == threads);
  CHECK(other_errors.load() == 0);
  CHECK(dev.live_counters() == 1000);
  const auto arenas = dev.core()->pool().arenas();
  std::error_code ec;
  auto extra = dev.create_counter(compcntr::counter_type::wrs, ec);
  CHECK(ec == std::errc::not_enough_memory);
  CHECK(contains(compcntr::last_error_message(), "COMPCNTR_MAX_COUNTERS"));
  CHECK_FALSE(extra);
  CHECK(dev.live_counters() == 1000);
  // Destroy everything concurrently, then fill again: same arenas, every counter reads 0.
  for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { owned[t].clear(); });
  for (auto& t : ts) t.join();
  ts.clear();
  CHECK(dev.live_counters() == 0);
  for (int t = 0; t < threads; ++t) ts.emplace_back(fill, t);
  for (auto& t : ts) t.join();
  total = 0;
  bool zero = true;
  for (auto& v : owned) {
    total += v.size();
    for (auto& c : v) zero = zero && c.value() == 0 && c.errors() == 0;
  }
  CHECK(total == 1000);
  CHECK(zero);
  CHECK(dev.core()->pool().arenas() == arenas);
}

namespace {
std::atomic<bool> arena_alloc_fails{false};
bool inject_arena_failure() noexcept { return arena_alloc_fails.load(); }
}  // namespace

TEST_CASE("a failed arena allocation is ENOMEM, consumes nothing, and the next call succeeds") {
  slot_pool pool(pool_config{.capacity = 64, .arena_slots = 32, .fail_arena_alloc = inject_arena_failure});
  arena_alloc_fails = true;
  std::error_code ec;
  CHECK(pool.allocate(-1, ec) == nullptr);
  CHECK(ec == std::errc::not_enough_memory);
  CHECK(contains(compcntr::last_error_message(), "out of memory for a new arena"));
  CHECK(pool.live() == 0);
  CHECK(pool.arenas() == 0);
  arena_alloc_fails = false;
  std::vector<slot*> got;
  for (std::uint32_t i = 0; i < 32; ++i) {
    got.push_back(take(pool, -1));
    CHECK(got.back()->index == i);  // no index was lost by the failure
  }
  arena_alloc_fails = true;  // the first arena is full: the second cannot be made
  CHECK(pool.allocate(-1, ec) == nullptr);
  CHECK(ec == std::errc::not_enough_memory);
  CHECK(pool.live() == 32);
  arena_alloc_fails = false;
  got.push_back(take(pool, -1));
  CHECK(got.back()->index == 32);
  CHECK(pool.arenas() == 2);
  for (slot* s : got) pool.release(*s);
  CHECK(pool.live() == 0);
}

TEST_CASE("once the arena budget is spent, a node borrows free slots of another node") {
  // 2 nodes, capacity 8, arenas of 4: budget = 8/4 + (2 - 1) = 3 arenas.
  slot_pool pool(pool_config{.capacity = 8, .synthetic = "numa:2 pu:1", .current_cpu = fake_current_cpu,
                             .arena_slots = 4});
  REQUIRE(pool.arena_budget() == 3);
  std::vector<slot*> got;
  for (int i = 0; i < 8; ++i) got.push_back(take(pool, 1));  // node 1 gets two arenas
  CHECK(pool.arenas() == 2);
  for (slot* s : got) CHECK(s->numa_node == 1);
  for (slot* s : got) pool.release(*s);
  got.clear();
  for (int i = 0; i < 8; ++i) got.push_back(take(pool, 0));  // one arena for node 0, then borrow
  CHECK(pool.arenas() == 3);
  const auto on0 = std::count_if(got.begin(), got.end(), [](slot* s) { return s->numa_node == 0; });
  CHECK(on0 == 4);
  CHECK(got.size() - on0 == 4);
  std::error_code ec;
  CHECK(pool.allocate(0, ec) == nullptr);
  CHECK(ec == std::errc::not_enough_memory);
  for (slot* s : got) pool.release(*s);
  CHECK(pool.live() == 0);
  CHECK(pool.arena_bytes() == 3u * 4u * 128u);  // memory bound: budget x arena
}

TEST_CASE("stress (pool, 4 synthetic nodes): unique slots, fresh slots read 0, capacity never exceeded") {
  constexpr std::uint32_t capacity = 256;
  slot_pool pool(pool_config{.capacity = capacity, .synthetic = "pack:2 numa:2 core:2 pu:1",
                             .current_cpu = fake_current_cpu, .arena_slots = 16});
  constexpr int threads = 4;
  constexpr int rounds = 150;
  constexpr int batch = 300;  // > capacity: every thread reaches ENOMEM in every round
  const std::uint32_t index_space = pool.arena_budget() * pool.arena_slots();
  std::unique_ptr<std::atomic<int>[]> owner(new std::atomic<int>[index_space]);
  for (std::uint32_t i = 0; i < index_space; ++i) owner[i] = -1;
  std::atomic<int> duplicates{0}, dirty{0}, over_capacity{0}, bad_errors{0};
  std::atomic<long> allocated{0}, refused{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      fake_cpu = 2 * t;  // nodes 0..3
      std::vector<slot*> mine;
      for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < batch; ++i) {
          std::error_code ec;
          slot* s = pool.allocate((r + i) % 3 == 0 ? (t + i) % 4 : -1, ec);
          if (!s) {
            if (ec != std::errc::not_enough_memory) ++bad_errors;
            ++refused;
            continue;
          }
          ++allocated;
          if (pool.live() > capacity) ++over_capacity;
          int expected = -1;
          if (!owner[s->index].compare_exchange_strong(expected, t)) ++duplicates;
          if (s->value.load() != 0 || s->errors.load() != 0 || s->refs.load() != 1) ++dirty;
          s->value.fetch_add(static_cast<std::uint64_t>(t) + 1);
          s->errors.fetch_add(1);
          mine.push_back(s);
        }
        for (slot* s : mine) {
          if (s->value.load() != static_cast<std::uint64_t>(t) + 1 || s->errors.load() != 1) ++dirty;
          s->refs.store(0);
          owner[s->index].store(-1);
          pool.release(*s);
        }
        mine.clear();
      }
    });
  for (auto& t : ts) t.join();
  CHECK(duplicates.load() == 0);
  CHECK(dirty.load() == 0);
  CHECK(over_capacity.load() == 0);
  CHECK(bad_errors.load() == 0);
  CHECK(allocated.load() + refused.load() == long{threads} * rounds * batch);
  CHECK(refused.load() > 0);  // the test did reach capacity
  CHECK(pool.live() == 0);
  CHECK(pool.arenas() <= pool.arena_budget());
  MESSAGE("allocated " << allocated.load() << ", refused " << refused.load() << ", arenas " << pool.arenas());
}

TEST_CASE("stress (device): creators and destroyers while others increment a shared counter") {
  auto dev = open_soft();
  std::error_code ec;
  auto shared = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE_FALSE(ec);
  constexpr int creators = 3, incrementers = 2;
  constexpr int rounds = 1000, batch = 100;  // 300,000 counters created and destroyed
  constexpr int increments = 100000;
  const std::uint32_t index_space = dev.core()->pool().arena_budget() * dev.core()->pool().arena_slots();
  std::unique_ptr<std::atomic<bool>[]> taken(new std::atomic<bool>[index_space]);
  for (std::uint32_t i = 0; i < index_space; ++i) taken[i] = false;
  std::atomic<int> duplicates{0}, dirty{0}, failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < creators; ++t)
    ts.emplace_back([&, t] {
      std::vector<compcntr::counter> mine;
      mine.reserve(batch);
      for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < batch; ++i) {
          std::error_code e;
          auto c = dev.create_counter(i % 2 ? compcntr::counter_type::bytes : compcntr::counter_type::wrs, e);
          if (e || !c) {
            ++failures;
            continue;
          }
          if (taken[c.index()].exchange(true)) ++duplicates;
          if (c.value() != 0 || c.errors() != 0) ++dirty;
          c.add(static_cast<std::uint64_t>(i) + 1);
          c.add_error(static_cast<std::uint64_t>(t));
          mine.push_back(std::move(c));
        }
        for (std::size_t i = 0; i < mine.size(); ++i) {
          auto& c = mine[i];
          if (c.value() != i + 1 || c.errors() != static_cast<std::uint64_t>(t)) ++dirty;
          taken[c.index()] = false;
          if (i % 2) {
            std::error_code e;
            c.destroy(e);
            if (e) ++failures;
          } else {
            c.reset();
          }
        }
        mine.clear();
      }
    });
  for (int t = 0; t < incrementers; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < increments; ++i) shared.add(1);
    });
  for (auto& t : ts) t.join();
  CHECK(duplicates.load() == 0);
  CHECK(dirty.load() == 0);
  CHECK(failures.load() == 0);
  CHECK(shared.value() == std::uint64_t{incrementers} * increments);
  CHECK(dev.live_counters() == 1);
}

TEST_CASE("handles: resolve a live counter, ESTALE after destroy even once the slot is reused") {
  auto dev = open_soft();
  std::error_code ec;
  auto c = dev.create_counter(compcntr::counter_type::bytes, ec);
  REQUIRE_FALSE(ec);
  const compcntr::counter_handle h = c.handle();
  CHECK(h.index == c.index());
  {
    auto r = dev.resolve(h, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(r);
    CHECK(r.index() == c.index());
    CHECK(r.type() == compcntr::counter_type::bytes);
    CHECK(r.handle() == h);
    r.add(5);
    CHECK(c.value() == 5);
    // A referenced counter cannot be destroyed by destroy(ec): EBUSY, nothing changes.
    c.destroy(ec);
    CHECK(ec == std::errc::device_or_resource_busy);
    CHECK(contains(compcntr::last_error_message(), "counter_ref"));
    REQUIRE(c);
    c.add(1);
    CHECK(r.value() == 6);
  }
  c.destroy(ec);
  CHECK_FALSE(ec);
  CHECK(dev.live_counters() == 0);
  auto stale = dev.resolve(h, ec);
  CHECK(ec.value() == ESTALE);
  CHECK_FALSE(stale);
  CHECK(contains(compcntr::last_error_message(), "stale"));
  // The slot goes to the next counter (LIFO free list): the old handle still cannot reach it.
  auto next = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE_FALSE(ec);
  CHECK(next.index() == h.index);
  CHECK_FALSE(next.handle() == h);
  auto again = dev.resolve(h, ec);
  CHECK(ec.value() == ESTALE);
  CHECK_FALSE(again);
  CHECK(next.value() == 0);
  auto fresh = dev.resolve(next.handle(), ec);
  CHECK_FALSE(ec);
  CHECK(fresh);
  // Handles that name no slot at all.
  CHECK_FALSE(dev.resolve(compcntr::counter_handle{}, ec));
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(dev.resolve({.generation = 0, .index = 123456789}, ec));
  CHECK(ec == std::errc::invalid_argument);
}

TEST_CASE("handles: a counter_ref outlives its owner's reset(); the last holder frees the slot") {
  auto dev = open_soft();
  std::error_code ec;
  auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
  const auto h = c.handle();
  auto r = dev.resolve(h, ec);
  REQUIRE(r);
  c.reset();  // the owner lets go; the ref keeps the counter
  CHECK(dev.live_counters() == 1);
  r.add(2);
  CHECK(r.value() == 2);
  auto r2 = dev.resolve(h, ec);  // still live: a second reference
  CHECK_FALSE(ec);
  auto moved = std::move(r);
  CHECK_FALSE(r);
  moved.reset();
  CHECK(dev.live_counters() == 1);
  r2.reset();
  CHECK(dev.live_counters() == 0);
  CHECK_FALSE(dev.resolve(h, ec));
  CHECK(ec.value() == ESTALE);
}

TEST_CASE("handles under races: a stale handle never reaches the slot's new owners") {
  auto dev = open_soft();
  std::error_code ec;
  auto first = dev.create_counter(compcntr::counter_type::wrs, ec);
  const auto h = first.handle();
  first.reset();
  std::atomic<bool> done{false};
  std::atomic<long> wrongly_resolved{0}, resolves{0};
  std::thread prober([&] {
    while (!done.load()) {
      std::error_code e;
      if (auto r = dev.resolve(h, e)) {
        ++wrongly_resolved;
        r.add(1000);  // would show up in a new owner's value
      }
      ++resolves;
    }
  });
  while (resolves.load() == 0) std::this_thread::yield();  // the prober runs during the churn
  int reused = 0, dirty = 0;
  for (int i = 0; i < 20000; ++i) {
    std::error_code e;
    auto c = dev.create_counter(compcntr::counter_type::wrs, e);
    if (e) {
      ++dirty;
      continue;
    }
    reused += c.index() == h.index;
    c.add(1);
    if (c.value() != 1) ++dirty;
    c.reset();
  }
  done = true;
  prober.join();
  CHECK(wrongly_resolved.load() == 0);
  CHECK(dirty == 0);
  CHECK(reused > 0);
  CHECK(resolves.load() > 0);
  CHECK(dev.live_counters() == 0);
}

TEST_CASE("handles under races: resolve racing with the owner's destruction") {
  auto dev = open_soft();
  for (int round = 0; round < 100; ++round) {
    std::error_code ec;
    auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
    REQUIRE_FALSE(ec);
    const auto h = c.handle();
    std::atomic<long> counted{0};
    std::atomic<bool> go{false};
    std::atomic<int> bad{0};
    std::thread user([&] {
      go = true;
      for (;;) {
        std::error_code e;
        auto r = dev.resolve(h, e);
        if (!r) {
          if (e.value() != ESTALE) ++bad;
          return;
        }
        r.add(1);
        ++counted;
      }
    });
    while (!go.load()) std::this_thread::yield();
    while (counted.load() < round % 3) std::this_thread::yield();  // vary the overlap
    // Destroy while the user resolves: either refused (a ref is held) or done; reset() always is.
    std::error_code e;
    c.destroy(e);
    if (e) {
      CHECK(e == std::errc::device_or_resource_busy);
      c.reset();
    }
    user.join();
    CHECK(bad.load() == 0);
    CHECK(dev.live_counters() == 0);  // freed exactly once, by the last holder
  }
}
