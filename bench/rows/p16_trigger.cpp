// P16: a triggered counter add, from the add() that reaches the threshold to the action visible in
// another thread, vs a thread that waits on the counter and does the add itself.
// Target: <= 1.0x (../shared/spec/performance.md).
//
// The measured quantity, both sides (pingpong.hpp, free-running, two pinned threads, round i):
//   * triggered (compcntr): a symmetric ping-pong in which every hop is a triggered add. A adds 1
//     to cA; the trigger armed on cA at threshold i runs inline in A and adds 1 to tB; B waits
//     until tB >= i, then adds 1 to cB, whose trigger adds 1 to tA; A waits until tA >= i. A
//     round is two add-to-visible latencies (A's add to B seeing tB, B's add to A seeing tA):
//     reported per latency, the round's time / 2.
//   * reference: A adds 1 to c; B, which waits on c, sees it and adds 1 to target itself; the
//     add is visible in another thread when A, waiting on target, sees it. A round is one such
//     latency. The waiting thread must see the crossing before it can act, and its add must
//     reach another thread: two line transfers where the trigger's inline action needs one.
// Information lines (the round-trip shape of earlier snapshots, where both variants carry the
// same two transfers and only the firing's cost differs):
//   * triggered round trip: A: c += 1 (the trigger adds 1 to `target` inline), waits until
//     back >= i;  B: waits until target >= i, then back += 1;
//   * waiter round trip: A: c += 1, waits until back >= i;  B: waits until c >= i, adds 1 to
//     `target` itself, then back += 1;
//   * the floor of the triggered shape: as the triggered round trip but A adds to `target`
//     itself (no trigger): the triggered round trip's excess over it is the firing's latency in
//     A's path (the watch word's test, the list's lock, the node's unlink, the add's application).
// Every wait is compcntr::wait with spin_forever (the hot poll). Triggers for thresholds
// 1..pre_armed are armed before each sample (not timed); a sample runs at most pre_armed rounds.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "../harness.hpp"
#include "pingpong.hpp"

import compcntr;

namespace {

using namespace std::chrono_literals;
constexpr auto wait_timeout = 2000ms;
const compcntr::wait_options spin_opts{.spin = compcntr::spin_forever};
// Triggers armed before each sample, and so the most rounds a sample runs (2 ms at >= 245 ns per
// round trip; shorter samples where round trips are faster). Not more: the triggers a sample
// fires must be the cache-warm ones, as for a runtime that arms a window ahead. 2^17 (~19 MB of
// nodes, arming them evicts the first ones from L2) added 10-15% to the triggered variant.
constexpr std::uint64_t pre_armed = 1u << 13;
constexpr std::uint64_t unstick_amount = std::uint64_t{1} << 40;

std::string wait_on(const compcntr::counter& c, std::uint64_t i) {
  const std::errc e = compcntr::wait(c, i, wait_timeout, spin_opts);
  if (e == std::errc{}) [[likely]]
    return {};
  return "compcntr::wait: " + std::make_error_code(e).message();
}

struct counters {
  compcntr::counter c, target, back;  // the round-trip shapes and the reference
  compcntr::counter ca, cb, ta, tb;   // the symmetric triggered ping-pong
  std::vector<compcntr::trigger> armed;
  void zero() {
    for (compcntr::counter* x : {&c, &target, &back, &ca, &cb, &ta, &tb}) x->set(0);
  }
  void unstick() {
    for (compcntr::counter* x : {&target, &back, &ta, &tb, &c, &ca, &cb}) x->add(unstick_amount);
  }
  // Triggers for thresholds 1..pre_armed on `on`, each adding 1 to `to`.
  void arm(compcntr::counter& on, compcntr::counter& to, std::error_code& e) {
    for (std::uint64_t t = 1; t <= pre_armed && !e; ++t)
      armed.push_back(compcntr::trigger::arm_add(on, t, to, 1, e));
  }
};

using member = compcntr::counter counters::*;

// One variant: A adds 1 to a_add (one or two counters, in order) and waits on a_wait; B waits on
// b_wait and adds 1 to b_add. `arm`: 0 none, 1 the round-trip triggers (c -> target), 2 the
// symmetric ones (cA -> tB, cB -> tA).
struct shape {
  const char* name;
  member a_add[2];
  member a_wait;
  member b_wait;
  member b_add[2];
  int arm;
  double events_per_round;
  const char* unit;
};

const shape shapes[] = {
    {"triggered add (inline trigger on cA adds to tB, visible in B; and back)",
     {&counters::ca, nullptr},
     &counters::ta,
     &counters::tb,
     {&counters::cb, nullptr},
     2,
     2,
     "ns/add-to-visible"},
    {"waiter adds (B waits on c, adds to target; visible in A)",
     {&counters::c, nullptr},
     &counters::target,
     &counters::c,
     {&counters::target, nullptr},
     0,
     1,
     "ns/add-to-visible"},
    {"round trip: triggered add, B answers on back",
     {&counters::c, nullptr},
     &counters::back,
     &counters::target,
     {&counters::back, nullptr},
     1,
     1,
     "ns/round trip"},
    {"round trip: B waits on c, adds to target, answers",
     {&counters::c, nullptr},
     &counters::back,
     &counters::c,
     {&counters::target, &counters::back},
     0,
     1,
     "ns/round trip"},
    {"round trip: A adds to c and to target itself",
     {&counters::c, &counters::target},
     &counters::back,
     &counters::target,
     {&counters::back, nullptr},
     0,
     1,
     "ns/round trip"},
};

void add_each(counters& k, const member (&m)[2]) {
  (k.*m[0]).add(1);
  if (m[1] != nullptr) (k.*m[1]).add(1);
}

void run(bench::context& ctx) {
  namespace pp = bench::pingpong;
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  auto k = std::make_shared<counters>();
  for (compcntr::counter* x : {&k->c, &k->target, &k->back, &k->ca, &k->cb, &k->ta, &k->tb})
    if (!ec) *x = dev.create_counter(compcntr::counter_type::wrs, ec);
  std::vector<std::shared_ptr<pp::tally>> tallies;
  std::vector<bench::variant> vs;
  for (const shape& sh : shapes) {
    tallies.push_back(std::make_shared<pp::tally>());
    if (ec) {
      vs.push_back(
          bench::unavailable_variant(sh.name, std::string(compcntr::last_error_message())));
      vs.back().unit = sh.unit;
      continue;
    }
    pp::spec s;
    s.name = sh.name;
    s.events_per_round = sh.events_per_round;
    s.unit = sh.unit;
    s.initiator = [k, &sh](pp::control& ctl) {
      // Before round 1: the responder reads the limit after that round's update.
      if (ctl.limit.load() > pre_armed) ctl.limit.store(pre_armed);
      return pp::free_initiator(
          ctl, [&] { add_each(*k, sh.a_add); },
          [&](std::uint64_t i) { return wait_on((*k).*sh.a_wait, i); });
    };
    s.responder = [k, &sh](pp::control& ctl) {
      return pp::free_responder(
          ctl, [&] { add_each(*k, sh.b_add); },
          [&](std::uint64_t i) { return wait_on((*k).*sh.b_wait, i); });
    };
    s.reset = [k, &sh] {
      k->armed.clear();
      k->zero();
      std::error_code e;
      k->armed.reserve(2 * pre_armed);
      if (sh.arm == 2) {
        k->arm(k->ca, k->tb, e);
        k->arm(k->cb, k->ta, e);
      } else if (sh.arm == 1) {
        k->arm(k->c, k->target, e);
      }
    };
    s.unstick = [k] { k->unstick(); };
    s.sample_ms = 2;
    s.max_retries = 5;
    vs.push_back(pp::make(ctx, std::move(s), tallies.back()));
  }
  auto r = ctx.measure(std::move(vs));
  for (std::size_t i = 0; i < r.size(); ++i) pp::finish(r[i], *tallies[i]);
  k->armed.clear();
  ctx.add(bench::compare("P16", "triggered counter add vs waiter doing the add", r[0], r[1],
                         bench::goal::ratio_at_most, 1.0,
                         r[0].available ? pp::describe("triggered", *tallies[0]) : ""));
  ctx.add(bench::compare("P16", "round trip: triggered add vs the waiter adding and answering",
                         r[2], r[3]));
  ctx.add(bench::compare("P16", "round trip: triggered add vs the crossing thread adding itself",
                         r[2], r[4]));
}

} // namespace

COMPCNTR_BENCH_ROW("P16", "triggered counter add vs a waiter doing the add", run);
