// The slot pool (compcntr:pool): exact capacity, arena growth and failure, borrowing across
// nodes, and stress on the pool and on a device's create/destroy path.
module;
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

std::atomic<bool> arena_alloc_fails{false};

bool inject_arena_failure() noexcept { return arena_alloc_fails.load(); }

} // namespace

TEST_CASE(
    "capacity: exact under concurrent creation, ENOMEM changes nothing, recovery reuses arenas") {
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

TEST_CASE("a failed arena allocation is ENOMEM, consumes nothing, and the next call succeeds") {
  slot_pool pool(
      pool_config{.capacity = 64, .arena_slots = 32, .fail_arena_alloc = inject_arena_failure});
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
  slot_pool pool(pool_config{.capacity = 8,
                             .synthetic = "numa:2 pu:1",
                             .current_cpu = fake_current_cpu,
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

TEST_CASE(
    "stress (pool, 4 synthetic nodes): unique slots, fresh slots read 0, capacity never exceeded") {
  constexpr std::uint32_t capacity = 256;
  slot_pool pool(pool_config{.capacity = capacity,
                             .synthetic = "pack:2 numa:2 core:2 pu:1",
                             .current_cpu = fake_current_cpu,
                             .arena_slots = 16});
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
          if (s->value.load() != static_cast<std::uint64_t>(t) + 1 || s->errors.load() != 1)
            ++dirty;
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
  MESSAGE("allocated " << allocated.load() << ", refused " << refused.load() << ", arenas "
                       << pool.arenas());
}

TEST_CASE("stress (device): creators and destroyers while others increment a shared counter") {
  auto dev = open_soft();
  std::error_code ec;
  auto shared = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE_FALSE(ec);
  constexpr int creators = 3, incrementers = 2;
  constexpr int rounds = 1000, batch = 100;  // 300,000 counters created and destroyed
  constexpr int increments = 100000;
  const std::uint32_t index_space =
      dev.core()->pool().arena_budget() * dev.core()->pool().arena_slots();
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
          auto c = dev.create_counter(
              i % 2 ? compcntr::counter_type::bytes : compcntr::counter_type::wrs, e);
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

TEST_CASE("stress (pool): holds (8-byte RMWs on the count) racing with fused pops and pushes lose "
          "nothing") {
  // Node 0 of a one-node pool takes and returns slots with one 16-byte CAS over {free list,
  // holds | live}; hold()/unhold() are 8-byte RMWs on the count half of the same word. Neither
  // may lose the other's update: at the end holds and live are exactly what the threads left.
  slot_pool pool(pool_config{.capacity = 64, .synthetic = "numa:1 pu:2", .arena_slots = 32});
  constexpr int allocators = 2, holders = 2, rounds = 20000;
  std::atomic<int> dirty{0}, failures{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < allocators; ++t)
    ts.emplace_back([&] {
      while (!go.load()) {
      }
      slot* held[8];
      for (int r = 0; r < rounds; ++r) {
        const int n = 1 + r % 8;
        for (int i = 0; i < n; ++i) {
          std::error_code ec;
          held[i] = pool.allocate(-1, ec);
          if (!held[i]) {
            ++failures;
            return;
          }
          if (held[i]->refs.load() != 1 || held[i]->value.load() != 0) ++dirty;
          held[i]->value.store(1);
        }
        for (int i = 0; i < n; ++i) {
          held[i]->refs.store(0);
          if (pool.release(*held[i])) ++failures;  // holds remain: never "the last"
        }
      }
    });
  for (int t = 0; t < holders; ++t)
    ts.emplace_back([&, t] {
      while (!go.load()) {
      }
      for (int r = 0; r < rounds; ++r) {
        pool.hold();
        pool.hold();
        if (pool.unhold()) ++failures;  // the thread still holds one
        if (r % 2 == t) continue;       // keep some: t == 0 keeps the odd rounds', 1 the even
        if (pool.unhold()) ++failures;  // the main thread's hold remains
      }
    });
  pool.hold();  // the main thread's: no release or unhold of the others can be the last
  go.store(true);
  for (auto& t : ts) t.join();
  CHECK(dirty.load() == 0);
  CHECK(failures.load() == 0);
  CHECK(pool.live() == 0);
  CHECK(pool.holds() == 1u + rounds);  // each holder kept rounds / 2
  std::uint32_t h = 0, l = 0;
  CHECK_FALSE(pool.unhold_if_last(h, l));
  CHECK(h == 1u + rounds);
  CHECK(l == 0);
}

TEST_CASE("stress (device): the last of concurrent destroyers after the handle is gone frees the "
          "device once") {
  // The device's handle and its counters count in the word a counter's destroy returns its slot
  // with: whichever destroy sees nothing left deletes the device (AddressSanitizer: exactly once,
  // nothing leaked).
  for (int round = 0; round < 200; ++round) {
    auto dev = open_soft();
    constexpr int threads = 2, per_thread = 64;
    std::vector<std::vector<compcntr::counter>> owned(threads);
    for (int t = 0; t < threads; ++t)
      for (int i = 0; i < per_thread; ++i) owned[t].push_back(make_counter(dev));
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        while (!go.load()) {
        }
        for (auto& c : owned[t]) c.reset();
      });
    {
      compcntr::device gone = std::move(dev); // drops the handle's hold while destroys run
      go.store(true);
    }
    for (auto& t : ts) t.join();
  }
}
