// Triggered operations (compcntr:trigger, src/core/trigger/trigger.cpp): each case of the
// semantics table of docs/trigger.md asserted exactly, then races under stress (TSan in CI).
#include <doctest/doctest.h>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

import compcntr;

#include "support.hpp"

using compcntr::trigger;
using compcntr::trigger_mode;
using compcntr::trigger_state;
using namespace std::chrono_literals;

namespace {

constexpr auto ealready = std::errc::connection_already_in_progress;

// What an action saw: each call appends (tag, status) under a lock.
struct action_log {
  std::mutex mu;
  std::vector<std::pair<int, int>> calls;
  void add(int tag, int status) {
    std::lock_guard lk(mu);
    calls.emplace_back(tag, status);
  }
  std::vector<std::pair<int, int>> get() {
    std::lock_guard lk(mu);
    return calls;
  }
};

trigger arm_logged(compcntr::counter_view c, std::uint64_t threshold, action_log& l, int tag,
                   trigger_mode mode = trigger_mode::immediate) {
  std::error_code ec;
  auto t = trigger::arm(c, threshold, mode, [&l, tag](int status) { l.add(tag, status); }, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(t);
  return t;
}

using calls = std::vector<std::pair<int, int>>;

} // namespace

TEST_CASE("a trigger runs exactly once, when the completion value reaches its threshold") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  action_log l;
  auto t = arm_logged(c, 3, l, 1);
  CHECK(t.state() == trigger_state::armed);
  CHECK(t.threshold() == 3);
  c.add(1);
  c.add(1);
  CHECK(l.get().empty());
  c.add(1);  // reaches 3: runs before add() returns
  CHECK(l.get() == calls{{1, 0}});
  CHECK(t.state() == trigger_state::fired);
  c.add(5);
  c.set(0);
  c.add(10);
  CHECK(l.get() == calls{{1, 0}});  // never again
  CHECK(t.cancel() == ealready);
}

TEST_CASE("due triggers run in threshold order, equal thresholds in arming order") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  action_log l;
  std::vector<trigger> ts;
  // Armed out of order: 30, 10 (a), 20, 10 (b), 40, 5.
  const std::pair<std::uint64_t, int> order[] = {{30, 30}, {10, 10}, {20, 20},
                                                 {10, 11}, {40, 40}, {5, 5}};
  for (auto [th, tag] : order) ts.push_back(arm_logged(c, th, l, tag));
  c.add(25);  // one update crosses 5, 10, 10, 20
  CHECK(l.get() == calls{{5, 0}, {10, 0}, {11, 0}, {20, 0}});
  c.add(100);
  CHECK(l.get() == calls{{5, 0}, {10, 0}, {11, 0}, {20, 0}, {30, 0}, {40, 0}});
}

TEST_CASE("an already reached threshold fires at arm: inline before arm returns") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  c.add(7);
  action_log l;
  auto t = arm_logged(c, 7, l, 1);
  CHECK(l.get() == calls{{1, 0}});
  CHECK(t.state() == trigger_state::fired);
  auto t0 = arm_logged(c, 0, l, 2);  // threshold 0 is always reached
  CHECK(l.get() == calls{{1, 0}, {2, 0}});
}

TEST_CASE("64-bit thresholds; a wrap leaves the value compared as it is") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  action_log l;
  auto top = arm_logged(c, max, l, 1);
  auto high = arm_logged(c, std::uint64_t{1} << 40, l, 2);
  c.set((std::uint64_t{1} << 40) - 1);
  CHECK(l.get().empty());
  c.add(1);  // 2^40: a threshold above 32 bits is compared in full
  CHECK(l.get() == calls{{2, 0}});
  c.set(max - 1);
  CHECK(l.get() == calls{{2, 0}});
  c.add(1);  // UINT64_MAX itself is reachable
  CHECK(l.get() == calls{{2, 0}, {1, 0}});

  // A wrap passes over a threshold without reaching it as a value: stays armed.
  action_log w;
  c.set(max - 1);
  auto wrapped = arm_logged(c, max, w, 3);
  c.add(2);  // max - 1 + 2 wraps to 0
  CHECK(c.value() == 0);
  CHECK(w.get().empty());
  CHECK(wrapped.state() == trigger_state::armed);
  c.set(max);
  CHECK(w.get() == calls{{3, 0}});
}

TEST_CASE("error completions fire nothing; set() below leaves armed, at or above fires") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  action_log l;
  auto a = arm_logged(c, 10, l, 10);
  auto b = arm_logged(c, 20, l, 20);
  c.add_error(1000);
  c.set_error(5);
  CHECK(l.get().empty());
  CHECK(c.errors() == 5);
  c.set(9);
  CHECK(l.get().empty());
  c.set(10);
  CHECK(l.get() == calls{{10, 0}});
  c.set(0);  // below b: still armed
  CHECK(b.state() == trigger_state::armed);
  c.set(25);
  CHECK(l.get() == calls{{10, 0}, {20, 0}});
}

TEST_CASE("cancel: the action gets ECANCELED before cancel returns; then EALREADY") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  action_log l;
  auto t = arm_logged(c, 5, l, 1);
  auto u = arm_logged(c, 6, l, 2);
  CHECK(t.cancel() == std::errc{});
  CHECK(l.get() == calls{{1, ECANCELED}});
  CHECK(t.state() == trigger_state::cancelled);
  CHECK(t.cancel() == ealready);
  c.add(10);  // a cancelled trigger never fires; the other one does
  CHECK(l.get() == calls{{1, ECANCELED}, {2, 0}});
  CHECK(u.cancel() == ealready);
}

TEST_CASE("flush cancels every trigger not fired, and counts them") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  action_log l;
  auto a = arm_logged(c, 1, l, 1);
  auto b = arm_logged(c, 3, l, 3);
  auto d = arm_logged(c, 2, l, 2, trigger_mode::deferred);
  auto e = arm_logged(c, 9, l, 9, trigger_mode::deferred);
  c.add(2);  // a fires inline; d becomes due (queued, not run)
  CHECK(l.get() == calls{{1, 0}});
  CHECK(compcntr::flush_triggers(c) == 3);  // b, e armed; d due but not run
  CHECK(l.get() == calls{{1, 0}, {3, ECANCELED}, {9, ECANCELED}, {2, ECANCELED}});
  CHECK(compcntr::run_deferred_triggers(dev) == 0);
  CHECK(compcntr::flush_triggers(c) == 0);
  CHECK(d.state() == trigger_state::cancelled);
  CHECK(a.state() == trigger_state::fired);
}

TEST_CASE("deferred triggers run in progress, in the order they became due") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  auto c2 = test_support::make_counter(dev);
  action_log l;
  auto t3 = arm_logged(c, 3, l, 3, trigger_mode::deferred);
  auto t1 = arm_logged(c, 1, l, 1, trigger_mode::deferred);
  auto x = arm_logged(c2, 1, l, 100, trigger_mode::deferred);
  CHECK(compcntr::run_deferred_triggers(dev) == 0);
  c.add(5);
  c2.add(1);
  CHECK(l.get().empty());  // due, not run
  CHECK(t1.state() == trigger_state::armed);
  CHECK(compcntr::run_deferred_triggers(dev) == 3);
  CHECK(l.get() == calls{{1, 0}, {3, 0}, {100, 0}});
  CHECK(t3.state() == trigger_state::fired);

  // A due deferred trigger can still be cancelled; progress then skips it.
  action_log m;
  auto y = arm_logged(c, 6, m, 6, trigger_mode::deferred);
  c.add(1);
  CHECK(y.cancel() == std::errc{});
  CHECK(m.get() == calls{{6, ECANCELED}});
  CHECK(compcntr::run_deferred_triggers(dev) == 0);
}

TEST_CASE("arm_add and arm_set: counter actions, chains with bounded stack depth") {
  auto dev = test_support::open_soft();
  auto a = test_support::make_counter(dev);
  auto b = test_support::make_counter(dev);
  std::error_code ec;
  auto add = trigger::arm_add(a, 2, b, 5, ec);
  REQUIRE_FALSE(ec);
  auto set = trigger::arm_set(a, 4, b, 100, ec);
  REQUIRE_FALSE(ec);
  a.add(2);
  CHECK(b.value() == 5);
  a.add(2);
  CHECK(b.value() == 100);
  CHECK(add.state() == trigger_state::fired);
  CHECK(set.state() == trigger_state::fired);

  // The trigger holds the target: its destroy is EBUSY until the trigger goes.
  b.destroy(ec);
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(b);
  add.reset();
  set.reset();
  b.destroy(ec);
  CHECK_FALSE(ec);

  // A chain of 20,000 counters, each adding 1 to the next at 1: one update runs the whole chain
  // before it returns. Recursion would need a stack frame per link (several MB); the
  // trampoline needs one.
  constexpr int links = 20000;
  std::vector<compcntr::counter> cs;
  std::vector<trigger> ts;
  cs.reserve(links + 1);
  ts.reserve(links);
  for (int i = 0; i <= links; ++i) cs.push_back(test_support::make_counter(dev));
  for (int i = 0; i < links; ++i) {
    ts.push_back(trigger::arm_add(cs[i], 1, cs[i + 1], 1, ec));
    REQUIRE_FALSE(ec);
  }
  // On a thread with a 256 KiB stack: the trampolined chain needs a few frames; a recursive one
  // would need 20,000 (and crash here: checked by disabling the trampoline).
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, 256 * 1024) == 0);
  pthread_t th;
  auto body = [](void* p) -> void* {
    static_cast<compcntr::counter*>(p)->add(1);
    return nullptr;
  };
  REQUIRE(pthread_create(&th, &attr, body, &cs[0]) == 0);
  REQUIRE(pthread_join(th, nullptr) == 0);
  pthread_attr_destroy(&attr);
  CHECK(cs[links].value() == 1);
  for (auto& t : ts) CHECK(t.state() == trigger_state::fired);
}

// arm_add / arm_set carry their operation in the trigger (no action call): a cancel, a flush or
// the counter's destroy must leave the target exactly as it was and say "cancelled".
TEST_CASE("arm_add and arm_set cancelled, flushed or destroyed with their counter change nothing") {
  auto dev = test_support::open_soft();
  auto a = test_support::make_counter(dev);
  auto b = test_support::make_counter(dev);
  std::error_code ec;
  b.set(40);
  auto add1 = trigger::arm_add(a, 1, b, 5, ec);
  REQUIRE_FALSE(ec);
  CHECK(add1.cancel() == std::errc{});
  CHECK(add1.cancel() == ealready);
  auto add2 = trigger::arm_add(a, 2, b, 7, ec);
  auto set2 = trigger::arm_set(a, 2, b, 1000, ec);
  REQUIRE_FALSE(ec);
  CHECK(compcntr::flush_triggers(a) == 2);
  auto set3 = trigger::arm_set(a, 3, b, 2000, ec);
  REQUIRE_FALSE(ec);
  a.destroy(ec);
  REQUIRE_FALSE(ec);
  for (const trigger* t : {&add1, &add2, &set2, &set3})
    CHECK(t->state() == trigger_state::cancelled);
  CHECK(b.value() == 40);
  CHECK(b.errors() == 0);
}

TEST_CASE("destroying a counter cancels its triggers; nothing runs after") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  action_log l;
  auto a = arm_logged(c, 5, l, 1);
  auto b = arm_logged(c, 2, l, 2, trigger_mode::deferred);
  auto d = arm_logged(c, 1, l, 3, trigger_mode::deferred);
  c.add(1);  // d due (queued), a and b armed
  std::error_code ec;
  c.destroy(ec);
  REQUIRE_FALSE(ec);
  CHECK(l.get() == calls{{2, ECANCELED}, {1, ECANCELED}, {3, ECANCELED}});
  CHECK(a.state() == trigger_state::cancelled);
  CHECK(d.state() == trigger_state::cancelled);
  CHECK(compcntr::run_deferred_triggers(dev) == 0);
  CHECK(a.cancel() == ealready);
  // The handles outlive the counter; the slot's next owner has no triggers.
  auto c2 = test_support::make_counter(dev);
  c2.add(10);
  CHECK(l.get().size() == 3);
}

TEST_CASE("an action may destroy its counter; a trigger's own destroy is refused inside it") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  std::error_code ec;
  action_log l;
  auto later = arm_logged(c, 2, l, 2);
  trigger self;
  std::error_code self_ec;
  self = trigger::arm(
      c, 1, trigger_mode::immediate,
      [&](int status) {
        if (status != 0) return;
        self.destroy(self_ec);  // refused: it would free the running action
        std::error_code e;
        c.destroy(e);  // allowed: cancels `later` (status ECANCELED), returns without waiting
        CHECK_FALSE(e);
      },
      ec);
  REQUIRE_FALSE(ec);
  compcntr::counter_view v = c;  // c is empty after its destroy inside the action
  v.add(1);
  CHECK(self_ec == std::errc::resource_deadlock_would_occur);
  CHECK(self.state() == trigger_state::fired);
  CHECK(l.get() == calls{{2, ECANCELED}});
  CHECK_FALSE(c);
}

TEST_CASE("argument errors: EINVAL, nothing armed") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  std::error_code ec;
  auto t = trigger::arm(c, 1, nullptr, nullptr, trigger_mode::immediate, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(t);
  auto u = trigger::arm(c, 1, [](void*, int) {}, nullptr, static_cast<trigger_mode>(3), ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(u);
  auto w = trigger::arm_add(compcntr::counter_view{}, 1, c, 1, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(w);
  c.add(5);  // nothing was armed: nothing to fire
  CHECK(compcntr::flush_triggers(c) == 0);
}

TEST_CASE("the service thread runs deferred actions as they become due") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  auto done = test_support::make_counter(dev);
  CHECK_FALSE(compcntr::start_trigger_service(dev));
  CHECK(compcntr::start_trigger_service(dev) == std::errc::connection_already_in_progress);
  std::error_code ec;
  std::vector<trigger> ts;
  compcntr::counter_view dv = done;
  for (int i = 1; i <= 50; ++i) {
    ts.push_back(trigger::arm(
        c, static_cast<std::uint64_t>(i), trigger_mode::deferred,
        [dv](int status) {
          if (status == 0) dv.add(1);
        },
        ec));
    REQUIRE_FALSE(ec);
  }
  for (int i = 0; i < 50; ++i) c.add(1);
  CHECK(compcntr::wait(done, 50, 10s) == std::errc{});  // no progress call from this thread
  CHECK(done.value() == 50);
  CHECK_FALSE(compcntr::stop_trigger_service(dev));
  CHECK(compcntr::stop_trigger_service(dev) == std::errc::connection_already_in_progress);
  ts.clear();
}

TEST_CASE("an update that finds another thread firing leaves the trigger it made due to it") {
  // fire_list's hand-off (src/core/trigger/trigger.cpp): A's add runs `first`, whose action
  // returns only once B's add has returned; B's add makes `second` due, finds A firing and
  // returns without running it; A must then look again and run `second` before its own add
  // returns. Without the look-again step `second` stays armed with the value at 2.
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  std::atomic<bool> in_first{false}, b_returned{false};
  std::atomic<std::thread::id> second_ran_on{};
  std::error_code ec;
  auto first = trigger::arm(
      c, 1, trigger_mode::immediate,
      [&](int status) {
        REQUIRE(status == 0);
        in_first.store(true);
        while (!b_returned.load()) std::this_thread::yield();
      },
      ec);
  REQUIRE_FALSE(ec);
  auto second = trigger::arm(
      c, 2, trigger_mode::immediate,
      [&](int status) {
        REQUIRE(status == 0);
        second_ran_on.store(std::this_thread::get_id());
      },
      ec);
  REQUIRE_FALSE(ec);
  compcntr::counter_view v = c;
  std::thread::id a_id;
  std::thread a([&] {
    a_id = std::this_thread::get_id();
    v.add(1);
  });
  while (!in_first.load()) std::this_thread::yield(); // A runs `first` (its state: not yet fired)
  std::thread b([&] {
    v.add(1); // the value is 2: `second` is due, A fires
    CHECK(second.state() == trigger_state::armed); // A is still inside `first`
    b_returned.store(true);
  });
  b.join();
  a.join();
  CHECK(c.value() == 2);
  CHECK(first.state() == trigger_state::fired);
  CHECK(second.state() == trigger_state::fired);
  CHECK(second_ran_on.load() == a_id); // in the thread already firing, before its add returned
}

TEST_CASE("an inline action fired inside a deferred action of its counter may destroy it") {
  // Regression: the destroy waited for the counter's running deferred actions but for one it ran
  // *directly* inside; here it runs inside an inline action that an update made from inside the
  // deferred one fired, and waited for itself forever (busy never fell). Run in a thread so that
  // the old code fails the check instead of hanging the suite.
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  compcntr::counter_view v = c;
  std::error_code ec, destroy_ec;
  action_log l;
  auto inner = trigger::arm(
      c, 2, trigger_mode::immediate,
      [&](int status) {
        l.add(2, status);
        if (status == 0) c.destroy(destroy_ec);  // the counter of the deferred action around it
      },
      ec);
  REQUIRE_FALSE(ec);
  auto outer = trigger::arm(
      c, 1, trigger_mode::deferred,
      [&](int status) {
        l.add(1, status);
        if (status == 0) v.add(1);  // value 2: `inner` fires here, inline
      },
      ec);
  REQUIRE_FALSE(ec);
  v.add(1);  // `outer` due
  std::atomic<bool> done{false};
  std::thread t([&] {
    CHECK(compcntr::run_deferred_triggers(dev) == 1);
    done.store(true);
  });
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (!done.load() && std::chrono::steady_clock::now() < end) std::this_thread::yield();
  if (!done.load()) t.detach();  // stuck for good: report, don't hang
  REQUIRE_MESSAGE(done.load(), "the destroy inside the nested inline action never returned");
  t.join();
  CHECK_FALSE(destroy_ec);
  CHECK(l.get() == calls{{1, 0}, {2, 0}});
  CHECK(outer.state() == trigger_state::fired);
  CHECK(inner.state() == trigger_state::fired);
  CHECK_FALSE(c);
}

TEST_CASE("stress: pre-armed triggers fire once each, in threshold order, under racing adds") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  constexpr int threads = 4, per_thread = 5000, armed = 400;
  std::vector<std::uint64_t> fired;
  std::mutex mu;
  std::error_code ec;
  std::vector<trigger> ts;
  std::mt19937_64 rng(42);
  std::vector<std::uint64_t> ths;
  for (int i = 0; i < armed; ++i) ths.push_back(1 + rng() % (threads * per_thread));
  for (std::uint64_t th : ths) {
    ts.push_back(trigger::arm(
        c, th, trigger_mode::immediate,
        [&, th](int status) {
          REQUIRE(status == 0);
          std::lock_guard lk(mu);
          fired.push_back(th);
        },
        ec));
    REQUIRE_FALSE(ec);
  }
  std::vector<std::thread> ws;
  for (int t = 0; t < threads; ++t)
    ws.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) c.add(1);
    });
  for (auto& w : ws) w.join();
  CHECK(c.value() == threads * per_thread);
  REQUIRE(fired.size() == armed);
  std::vector<std::uint64_t> sorted = ths;
  std::sort(sorted.begin(), sorted.end());
  CHECK(fired == sorted); // threshold order across the racing updaters
  for (auto& t : ts) CHECK(t.state() == trigger_state::fired);
}

TEST_CASE("stress: arming, cancelling and updating race; every action runs exactly once") {
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  constexpr int updaters = 2, per_updater = 20000, armers = 2, per_armer = 1500;
  constexpr std::uint64_t total = updaters * per_updater;
  struct slot_state {
    std::atomic<int> runs{0};
    std::atomic<int> status{-1};
  };
  std::vector<slot_state> st(armers * per_armer);
  std::vector<std::vector<trigger>> held(armers);
  std::atomic<int> cancelled_ok{0};
  std::vector<std::thread> ws;
  for (int u = 0; u < updaters; ++u)
    ws.emplace_back([&] {
      for (int i = 0; i < per_updater; ++i) c.add(1);
    });
  for (int a = 0; a < armers; ++a)
    ws.emplace_back([&, a] {
      std::mt19937_64 rng(a + 1);
      for (int i = 0; i < per_armer; ++i) {
        slot_state* s = &st[a * per_armer + i];
        const std::uint64_t th = rng() % (total + 1);
        const auto mode = (i % 3 == 0) ? trigger_mode::deferred : trigger_mode::immediate;
        std::error_code ec;
        auto t = trigger::arm(
            c, th, mode,
            [s](int status) {
              s->runs.fetch_add(1);
              s->status.store(status);
            },
            ec);
        REQUIRE_FALSE(ec);
        if (i % 4 == 0 && t.cancel() == std::errc{}) {
          cancelled_ok.fetch_add(1);
          REQUIRE(s->runs.load() == 1); // ran with ECANCELED before cancel returned
          REQUIRE(s->status.load() == ECANCELED);
        }
        if (i % 50 == 0) compcntr::run_deferred_triggers(dev);
        held[a].push_back(std::move(t));
      }
    });
  for (auto& w : ws) w.join();
  REQUIRE(c.value() == total);
  compcntr::run_deferred_triggers(dev); // every threshold <= total is due: run the rest
  int fired = 0, cancelled = 0;
  for (auto& s : st) {
    CHECK(s.runs.load() == 1);
    if (s.status.load() == 0) ++fired;
    if (s.status.load() == ECANCELED) ++cancelled;
  }
  CHECK(cancelled == cancelled_ok.load());
  CHECK(fired + cancelled == armers * per_armer);
  held.clear();
}

TEST_CASE("stress: flush races with the updates that fire; each action runs exactly once") {
  auto dev = test_support::open_soft();
  for (int round = 0; round < 100; ++round) {
    auto c = test_support::make_counter(dev);
    constexpr int n = 64;
    std::atomic<int> runs[n];
    std::atomic<int> fired{0}, cancelled{0};
    std::vector<trigger> ts;
    std::error_code ec;
    for (int i = 0; i < n; ++i) {
      runs[i].store(0);
      ts.push_back(trigger::arm(
          c, static_cast<std::uint64_t>(i + 1),
          i % 2 ? trigger_mode::immediate : trigger_mode::deferred,
          [&, i](int status) {
            runs[i].fetch_add(1);
            (status == 0 ? fired : cancelled).fetch_add(1);
          },
          ec));
      REQUIRE_FALSE(ec);
    }
    std::atomic<bool> go{false};
    std::thread updater([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < n; ++i) c.add(1);
    });
    std::thread progress([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < 50; ++i) compcntr::run_deferred_triggers(dev);
    });
    go.store(true);
    const std::size_t flushed = compcntr::flush_triggers(c);
    updater.join();
    progress.join();
    compcntr::run_deferred_triggers(dev);
    CHECK(static_cast<std::size_t>(cancelled.load()) == flushed);
    CHECK(fired.load() + cancelled.load() == n);
    for (auto& r : runs) CHECK(r.load() == 1);
    ts.clear();
  }
}

namespace {
// Whether thread `tid` of this process sleeps in the kernel (state 'S' in its stat file).
bool asleep(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", static_cast<int>(tid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* close_paren = std::strrchr(buf, ')');
  return n > 0 && close_paren != nullptr && close_paren[1] == ' ' && close_paren[2] == 'S';
}
} // namespace

TEST_CASE("a destroy from inside a deferred action waits for another thread's inline action") {
  // Regression: the destroy waits for the counter's other running actions (busy > its own 1),
  // and was only notified when busy reached 0: the inline action's end (2 -> 1) never woke it.
  auto dev = test_support::open_soft();
  auto c = test_support::make_counter(dev);
  std::atomic<pid_t> destroyer{0};
  std::atomic<bool> inline_done{false};
  std::error_code ec, destroy_ec;
  auto slow = trigger::arm(
      c, 1, trigger_mode::immediate,
      [&](int status) {
        if (status != 0) return;
        // Return only once the destroyer sleeps in its wait for this action (bounded: 5 s).
        while (destroyer.load() == 0) std::this_thread::yield();
        const auto end = std::chrono::steady_clock::now() + 5s;
        while (!asleep(destroyer.load()) && std::chrono::steady_clock::now() < end)
          std::this_thread::yield();
        inline_done.store(true);
      },
      ec);
  REQUIRE_FALSE(ec);
  auto killer = trigger::arm(
      c, 1, trigger_mode::deferred,
      [&](int status) {
        if (status != 0) return;
        destroyer.store(static_cast<pid_t>(::syscall(SYS_gettid)));
        c.destroy(destroy_ec); // returns once the inline action above has returned
        CHECK(inline_done.load());
      },
      ec);
  REQUIRE_FALSE(ec);
  compcntr::counter_view v = c;
  std::thread updater([v] { v.add(1); }); // runs `slow` inline; `killer` is queued
  while (killer.state() == trigger_state::armed && compcntr::run_deferred_triggers(dev) == 0)
    std::this_thread::yield();
  updater.join();
  CHECK_FALSE(destroy_ec);
  CHECK(slow.state() == trigger_state::fired);
  CHECK(killer.state() == trigger_state::fired);
}
