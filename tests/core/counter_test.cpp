// The C++ API of counters and devices (import compcntr;).
module;
#include <doctest/doctest.h>

#include "compcntr_config.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>
#if COMPCNTR_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

module compcntr;  // a white-box test: a unit of the module (it reads compcntr::detail)

#include "support.hpp"

using test_support::make_counter;
using test_support::open_soft;

namespace {

// Sets an environment variable for one scope.
struct scoped_env {
  std::string name;
  scoped_env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~scoped_env() { ::unsetenv(name.c_str()); }
};

int verbs_device_count() {
#if COMPCNTR_HAVE_VERBS
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return 0;
  ibv_free_device_list(list);
  return n;
#else
  return 0;
#endif
}

} // namespace

TEST_CASE("devices: soft, auto and unknown names") {
  std::error_code ec;
  auto soft = compcntr::device::open("soft", ec);
  CHECK_FALSE(ec);
  CHECK(soft.name() == "soft");

  auto autodev = compcntr::device::open("auto", ec);
  REQUIRE_FALSE(ec);
  if (verbs_device_count() == 0) CHECK(autodev.name() == "soft");
  auto empty = compcntr::device::open("", ec);
  REQUIRE_FALSE(ec);
  CHECK(empty.name() == autodev.name());

  auto none = compcntr::device::open("mlx5_does_not_exist", ec);
  CHECK(ec == std::errc::no_such_device);
  CHECK_FALSE(none);
  CHECK(std::string(compcntr::last_error_message()).find("mlx5_does_not_exist") !=
        std::string::npos);
}

TEST_CASE("caps of the software device") {
  auto dev = open_soft();
  const auto caps = dev.caps();
  CHECK(caps.max_value == UINT64_MAX);
  CHECK(caps.max_counters == compcntr::detail::default_max_counters);
  CHECK(caps.max_counters >= 1048576u);
  CHECK(caps.supported_qp_attach_ops == 0x3fu);
}

TEST_CASE("a new counter reads 0 and keeps its two values independent") {
  auto dev = open_soft();
  for (auto type : {compcntr::counter_type::wrs, compcntr::counter_type::bytes}) {
    auto c = make_counter(dev, type);
    CHECK(c.type() == type);
    CHECK(c.value() == 0);
    CHECK(c.errors() == 0);
    c.add(5);
    CHECK(c.value() == 5);
    CHECK(c.errors() == 0);
    c.add_error(2);
    CHECK(c.value() == 5);
    CHECK(c.errors() == 2);
    c.add();
    c.add_error();
    CHECK(c.value() == 6);
    CHECK(c.errors() == 3);
    c.set(100);
    CHECK(c.value() == 100);
    CHECK(c.errors() == 3);
    c.set_error(7);
    CHECK(c.value() == 100);
    CHECK(c.errors() == 7);
    c.set(0);
    c.set_error(0);
    CHECK(c.value() == 0);
    CHECK(c.errors() == 0);
  }
}

TEST_CASE("values wrap to 0 past max_value") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  c.set(UINT64_MAX);
  c.add(1);
  CHECK(c.value() == 0);
  c.set(UINT64_MAX - 1);
  c.add(5);
  CHECK(c.value() == 3);
  c.set_error(UINT64_MAX);
  c.add_error(2);
  CHECK(c.errors() == 1);
}

TEST_CASE("unknown counter type is EINVAL, a NUMA node that does not exist is EINVAL") {
  auto dev = open_soft();
  std::error_code ec;
  auto bad = dev.create_counter(static_cast<compcntr::counter_type>(2), ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(bad);
  CHECK(dev.live_counters() == 0);

  auto far = dev.create_counter({.type = compcntr::counter_type::wrs, .numa_node = 4096}, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(far);
  CHECK(dev.live_counters() == 0);

  auto node0 = dev.create_counter({.type = compcntr::counter_type::wrs, .numa_node = 0}, ec);
  CHECK_FALSE(ec);
  CHECK(node0.numa_node() == 0);
}

TEST_CASE("many counters are independent and never share a 128-byte block") {
  auto dev = open_soft();
  constexpr int n = 10000;
  std::vector<compcntr::counter> cs;
  cs.reserve(n);
  std::set<std::uintptr_t> blocks;
  for (int i = 0; i < n; ++i) {
    cs.push_back(make_counter(dev));
    auto addr = reinterpret_cast<std::uintptr_t>(cs.back().native_slot());
    CHECK(addr % 128 == 0);
    blocks.insert(addr / 128);
  }
  CHECK(blocks.size() == n);
  for (int i = 0; i < n; ++i) cs[i].add(static_cast<std::uint64_t>(i));
  for (int i = 0; i < n; ++i) cs[i].add_error(static_cast<std::uint64_t>(2 * i));
  bool all = true;
  for (int i = 0; i < n; ++i)
    all = all && cs[i].value() == static_cast<std::uint64_t>(i) && cs[i].errors() == 2u * i;
  CHECK(all);
  CHECK(dev.live_counters() == n);
  cs.clear();
  CHECK(dev.live_counters() == 0);
}

TEST_CASE("concurrent increments from several threads lose nothing") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  constexpr int threads = 4;
  constexpr std::uint64_t per_thread = 200000;
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      for (std::uint64_t i = 0; i < per_thread; ++i) {
        c.add(t + 1);
        if (i % 4 == 0) c.add_error(1);
      }
    });
  for (auto& t : ts) t.join();
  CHECK(c.value() == per_thread * (1 + 2 + 3 + 4));
  CHECK(c.errors() == threads * (per_thread / 4));
}

TEST_CASE("capacity: COMPCNTR_MAX_COUNTERS, ENOMEM changes nothing, destroy frees a place") {
  scoped_env env("COMPCNTR_MAX_COUNTERS", "4");
  auto dev = open_soft();
  CHECK(dev.caps().max_counters == 4);
  std::vector<compcntr::counter> cs;
  for (int i = 0; i < 4; ++i) {
    cs.push_back(make_counter(dev));
    cs.back().add(10 + i);
  }
  std::error_code ec;
  auto fifth = dev.create_counter(compcntr::counter_type::wrs, ec);
  CHECK(ec == std::errc::not_enough_memory);
  CHECK_FALSE(fifth);
  CHECK(std::string(compcntr::last_error_message()).find("COMPCNTR_MAX_COUNTERS") !=
        std::string::npos);
  CHECK(dev.live_counters() == 4);
  for (int i = 0; i < 4; ++i) CHECK(cs[i].value() == 10u + i);

  cs[1].destroy(ec);
  CHECK_FALSE(ec);
  CHECK_FALSE(cs[1]);
  auto again = dev.create_counter(compcntr::counter_type::bytes, ec);
  REQUIRE_FALSE(ec);
  CHECK(again.value() == 0);  // a reused slot starts at 0
  CHECK(again.errors() == 0);
  CHECK(again.type() == compcntr::counter_type::bytes);
}

TEST_CASE("COMPCNTR_MAX_COUNTERS that is not a positive number is EINVAL at open") {
  for (const char* bad : {"0", "abc", "-5", "12x", "99999999999"}) {
    scoped_env env("COMPCNTR_MAX_COUNTERS", bad);
    std::error_code ec;
    auto dev = compcntr::device::open("soft", ec);
    CHECK_MESSAGE(ec == std::errc::invalid_argument, bad);
    CHECK_FALSE(dev);
  }
}

TEST_CASE("close refuses with EBUSY while counters live; the device outlives its handle") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  std::error_code ec;
  dev.close(ec);
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(dev);  // still open and usable
  auto c2 = make_counter(dev);
  c2.reset();
  c.add(3);

  {
    // Dropping the handle while a counter lives keeps the device alive for the counter.
    auto dev2 = open_soft();
    auto orphan = make_counter(dev2);
    dev2 = compcntr::device{};
    orphan.add(9);
    CHECK(orphan.value() == 9);
  }

  c.reset();
  dev.close(ec);
  CHECK_FALSE(ec);
  CHECK_FALSE(dev);
}

TEST_CASE("moving a counter transfers ownership") {
  auto dev = open_soft();
  auto a = make_counter(dev);
  a.add(4);
  compcntr::counter b = std::move(a);
  CHECK_FALSE(a);
  CHECK(b.value() == 4);
  compcntr::counter c;
  c = std::move(b);
  CHECK(c.value() == 4);
  CHECK(dev.live_counters() == 1);
  c = make_counter(dev);  // the old one is destroyed by the assignment
  CHECK(dev.live_counters() == 1);
  CHECK(c.value() == 0);
}

TEST_CASE("slot layout: one 128-byte block, hot values on the first line") {
  CHECK(sizeof(compcntr::plugin::slot) == 128);
  CHECK(alignof(compcntr::plugin::slot) == 128);
  CHECK(compcntr::false_sharing_range == 128);
}

namespace {
// A backend whose bind_counter can fail, and can play a stale-handle resolver's reference CAS
// (resolve_counter_slot step 2) at the moment the new counter is being bound.
struct flaky_backend final : compcntr::plugin::backend {
  bool fail_bind = false;
  compcntr::plugin::slot* resolver_target = nullptr;  // take a resolver reference on this slot
  std::string_view name() const noexcept override { return "flaky"; }
  compcntr::counter_caps caps() const noexcept override {
    return {.max_value = UINT64_MAX, .max_counters = 0, .supported_qp_attach_ops = 0};
  }
  std::error_code bind_counter(compcntr::plugin::slot& s) noexcept override {
    if (!fail_bind) return {};
    std::uint32_t r = s.refs.load();
    if (&s == resolver_target && r == 1) s.refs.compare_exchange_strong(r, r + 1);
    return std::make_error_code(std::errc::not_enough_memory);
  }
};
} // namespace

TEST_CASE("a failed bind changes nothing: the slot goes back, the device is not held") {
  auto be = std::make_unique<flaky_backend>();
  flaky_backend* fb = be.get();
  std::error_code ec;
  auto dev = compcntr::device::from_backend(std::move(be), ec);
  REQUIRE(!ec);
  fb->fail_bind = true;
  auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
  CHECK(ec == std::errc::not_enough_memory);
  CHECK(!c);
  CHECK(dev.live_counters() == 0);
  fb->fail_bind = false;
  auto ok = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE(!ec);
  CHECK(ok.value() == 0);
  CHECK(dev.live_counters() == 1);
  ok.reset();
  dev.close(ec);
  CHECK(!ec);  // no device reference leaked by the failed create
}

// Review finding (2026-11-30): a failed bind used to push the slot straight back to the pool
// even when a resolver of a stale handle had taken a reference on it in the meantime; that
// resolver's later unref then freed the slot under its next owner, and the slot was handed
// out twice. The interleaving is replayed deterministically: resolver step 1 (generation
// matches), the counter destroyed, a create whose bind fails after the resolver's CAS (step 2),
// a new owner, then the resolver's step 3 (generation differs: drop its reference).
TEST_CASE("a failed bind with a stale resolver's reference never frees the slot's next owner") {
  auto be = std::make_unique<flaky_backend>();
  flaky_backend* fb = be.get();
  std::error_code ec;
  auto dev = compcntr::device::from_backend(std::move(be), ec);
  REQUIRE(!ec);
  auto c1 = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE(!ec);
  const compcntr::counter_id h = c1.id();
  compcntr::plugin::slot* s = c1.native_slot();
  REQUIRE(s->generation.load() == h.generation);  // resolver step 1
  c1.reset();
  fb->fail_bind = true;
  fb->resolver_target = s;
  auto failed = dev.create_counter(compcntr::counter_type::wrs, ec);
  CHECK(ec == std::errc::not_enough_memory);
  CHECK(!failed);
  CHECK(s->refs.load() == 1);  // the resolver's reference: the slot is not free yet
  // Resolver step 3: the generation moved on, so it drops what it took; that is the last
  // reference, and the slot returns to the pool now.
  // One release so far (c1's): the failed create did not give the slot back.
  REQUIRE(s->generation.load() == h.generation + 1);
  compcntr::detail::unref_counter_slot(*s);
  CHECK(dev.live_counters() == 0);
  fb->fail_bind = false;
  auto c3 = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE(!ec);
  auto c4 = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE(!ec);
  CHECK(c3.native_slot() != c4.native_slot());
  CHECK(dev.live_counters() == 2);
  CHECK(c3.native_slot()->refs.load() == 1);
  CHECK(c4.native_slot()->refs.load() == 1);
  c3.reset();
  c4.reset();
  dev.close(ec);
  CHECK(!ec);
}
