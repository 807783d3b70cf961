// The NUMA-aware slot pool (compcntr:pool): placement on synthetic, XML and real topologies, a
// thread bound to a node, and the C API's NUMA comp_mask bit / compcntr_comp_cntr_numa_node.
module;
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

module compcntr;  // a white-box test: a unit of the module (it reads compcntr::detail)

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

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != hay.npos;
}

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
    if (pthread_getaffinity_np(pthread_self(), sizeof old, &old) != 0 || !CPU_ISSET(cpu, &old))
      return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    ok = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
  }
  ~scoped_pin() {
    if (ok) pthread_setaffinity_np(pthread_self(), sizeof old, &old);
  }
};

} // namespace

TEST_CASE("synthetic 2-node topology: the calling thread's CPU picks the node; explicit and "
          "invalid nodes") {
  slot_pool pool(pool_config{
      .capacity = 1000, .synthetic = "numa:2 core:2 pu:1", .current_cpu = fake_current_cpu});
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
  slot_pool pool(pool_config{.capacity = 1 << 16,
                             .synthetic = "pack:2 numa:2 core:2 pu:1",
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
  slot_pool pool(
      pool_config{.capacity = 1000, .xml_file = xml.c_str(), .current_cpu = fake_current_cpu});
  REQUIRE(pool.numa_nodes() == 3);
  CHECK(pool.numa_node_id(0) == 0);
  CHECK(pool.numa_node_id(1) == 2);
  CHECK(pool.numa_node_id(2) == 5);
  CHECK_FALSE(pool.binding_supported());
  for (int cpu = 0; cpu < 4; ++cpu) { // CPUs 0-1: node 0, CPUs 2-3: node 2; never the memory node 5
    fake_cpu = cpu;
    CHECK(pool.current_numa_node() == (cpu < 2 ? 0 : 2));
    slot* s = take(pool, -1);
    CHECK(s->numa_node == (cpu < 2 ? 0 : 2));
    pool.release(*s);
  }
  slot* mem = take(pool, 5); // explicit: the memory-only node
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
    auto other =
        dev.create_counter({.type = compcntr::counter_type::wrs, .numa_node = 1 - cpu}, ec);
    REQUIRE_FALSE(ec);
    CHECK(other.numa_node() == 1 - cpu);
  }
  if (tested < 2)
    MESSAGE("only " << tested << " of CPUs 0,1 usable: real-binding placement partly untested");
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

TEST_CASE(
    "real machine: a slot's memory is on the node the pool claimed (hwloc_get_area_memlocation)") {
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
    c.add(1); // first touch by its user (the arena was also touched when it was built)
    REQUIRE(hwloc_get_area_memlocation(topo, c.native_slot(), sizeof(slot), where,
                                       HWLOC_MEMBIND_BYNODESET) == 0);
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
    hwloc_obj_t pu =
        hwloc_get_pu_obj_by_os_index(topo, static_cast<unsigned>(hwloc_bitmap_first(cpu)));
    REQUIRE(pu);
    hwloc_obj_t local =
        hwloc_get_next_obj_covering_cpuset_by_type(topo, pu->cpuset, HWLOC_OBJ_NUMANODE, nullptr);
    REQUIRE(local);
    std::error_code ec;
    auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
    REQUIRE_FALSE(ec);
    CHECK(c.numa_node() == static_cast<int>(local->os_index));
    c.add(1);
    REQUIRE(hwloc_get_area_memlocation(topo, c.native_slot(), sizeof(slot), where,
                                       HWLOC_MEMBIND_BYNODESET) == 0);
    CHECK(hwloc_bitmap_isset(where, local->os_index));
    hwloc_bitmap_free(cpu);
  }
  hwloc_bitmap_free(where);
  hwloc_topology_destroy(topo);
}

// ---- one topology per process and source (issue 22) ----

TEST_CASE("pools of one topology source share one hwloc topology, loaded once per process") {
  // Before issue 22 every pool (every device open) loaded its own topology: each pool had a
  // topology of its own, so these pointers differed.
  void* first = nullptr;
  {
    slot_pool a(pool_config{.capacity = 10, .synthetic = "numa:2 core:1 pu:1"});
    first = a.hwloc_topology();
    REQUIRE(first != nullptr);
    slot_pool b(pool_config{.capacity = 10, .synthetic = "numa:2 core:1 pu:1"});
    CHECK(b.hwloc_topology() == first);
    CHECK(b.numa_nodes() == 2);
    CHECK(contains(b.status(), "synthetic topology 'numa:2 core:1 pu:1'"));
  }
  // Both pools gone: the topology stays for the next pool of that source.
  slot_pool c(pool_config{.capacity = 10, .synthetic = "numa:2 core:1 pu:1"});
  CHECK(c.hwloc_topology() == first);
  // Another source is another topology, and so is the same description through HWLOC_SYNTHETIC
  // (its status names the variable).
  slot_pool d(pool_config{.capacity = 10, .synthetic = "numa:3 core:1 pu:1"});
  CHECK(d.hwloc_topology() != first);
  CHECK(d.numa_nodes() == 3);
  scoped_env env("HWLOC_SYNTHETIC", "numa:2 core:1 pu:1");
  scoped_env no_xml("HWLOC_XMLFILE", nullptr);
  slot_pool e(pool_config{.capacity = 10});
  CHECK(e.hwloc_topology() != first);
  CHECK(e.numa_nodes() == 2);
  CHECK(contains(e.status(), "(HWLOC_SYNTHETIC)"));
  slot_pool f(pool_config{.capacity = 10});
  CHECK(f.hwloc_topology() == e.hwloc_topology());
}

TEST_CASE("this machine's topology is shared by every device of the process") {
  scoped_env no_syn("HWLOC_SYNTHETIC", nullptr);
  scoped_env no_xml("HWLOC_XMLFILE", nullptr);
  slot_pool a(pool_config{.capacity = 10});
  slot_pool b(pool_config{.capacity = 10});
  REQUIRE(a.hwloc_topology() != nullptr);
  CHECK(a.hwloc_topology() == b.hwloc_topology());
  CHECK(a.numa_nodes() == b.numa_nodes());
  // Devices opened and closed one after the other keep working on it.
  for (int i = 0; i < 3; ++i) {
    auto dev = open_soft();
    auto c = make_counter(dev);
    c.add(2);
    CHECK(c.value() == 2);
  }
}

TEST_CASE("pools of a new source created concurrently load it once and all share it") {
  constexpr int n = 8;
  std::vector<std::unique_ptr<slot_pool>> pools(n);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < n) std::this_thread::yield(); // start together
      pools[static_cast<std::size_t>(i)] = std::make_unique<slot_pool>(
          pool_config{.capacity = 100, .synthetic = "pack:2 numa:1 core:3 pu:1"});
      fake_cpu = 3 * (i % 2); // a CPU of package i % 2
      std::error_code ec;
      slot* s = pools[static_cast<std::size_t>(i)]->allocate(-1, ec);
      if (s)
        pools[static_cast<std::size_t>(i)]->release(*s);
      else
        ready.fetch_add(1000); // reported below (no REQUIRE off the main thread)
    });
  for (auto& t : threads) t.join();
  CHECK(ready.load() == n); // every thread allocated from its pool
  for (int i = 1; i < n; ++i)
    CHECK(pools[static_cast<std::size_t>(i)]->hwloc_topology() == pools[0]->hwloc_topology());
  CHECK(pools[0]->numa_nodes() == 2);
}

TEST_CASE("a topology that failed to load is not kept: the next pool of that source tries again") {
  char dir[] = "/tmp/compcntr_topo_XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/later.xml";
  {
    slot_pool a(pool_config{.capacity = 10, .xml_file = path.c_str()});
    CHECK(a.hwloc_topology() == nullptr);
    CHECK(a.numa_nodes() == 1);
    CHECK(contains(a.status(), "later.xml"));
  }
  // The file appears: the same source now loads (a kept failure would still say one node).
  const std::string src = topology_file("topology-3node.xml");
  std::FILE* in = std::fopen(src.c_str(), "rb");
  std::FILE* out = std::fopen(path.c_str(), "wb");
  REQUIRE(in != nullptr);
  REQUIRE(out != nullptr);
  char buf[4096];
  for (std::size_t k; (k = std::fread(buf, 1, sizeof buf, in)) > 0;) std::fwrite(buf, 1, k, out);
  std::fclose(in);
  std::fclose(out);
  slot_pool b(pool_config{.capacity = 10, .xml_file = path.c_str()});
  CHECK(b.hwloc_topology() != nullptr);
  CHECK(b.numa_nodes() == 3);
  std::remove(path.c_str());
  ::rmdir(dir);
}
