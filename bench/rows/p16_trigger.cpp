// P16: a triggered counter add vs a thread that waits on the counter and does the add itself.
// Target: <= 1.0x.
//
// What is timed (pingpong.hpp, free-running, two pinned threads; round i):
//   * triggered: A: c += 1 (the trigger armed on c at threshold i runs inline in A and adds 1 to
//     `target`), then A waits until back >= i;  B: waits until target >= i, then back += 1.
//   * reference: A: c += 1, then waits until back >= i;  B: waits until c >= i, adds 1 to
//     `target` itself, then back += 1.
//   * info, the floor of the triggered shape: A: c += 1, then target += 1 itself (no trigger),
//     then waits until back >= i;  B: as in the triggered variant. The triggered variant's
//     excess over it is the firing's latency in A's path (the watch word's test, the list's
//     lock, the node's unlink, the action's call).
// Both round trips carry two cache-line transfers (A -> B, B -> A); the difference is who does
// the add to target and at what cost: the trigger's firing (the counter's trigger lock, the
// pop, the action's call) in A's path, versus B's plain add after its wait. Every wait is
// compcntr::wait with spin_forever (the hot poll). Triggers for thresholds 1..pre_armed are
// armed before each sample (not timed); a sample runs at most pre_armed rounds.
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
  compcntr::counter c, target, back;
  std::vector<compcntr::trigger> armed;
  void zero() {
    c.set(0);
    target.set(0);
    back.set(0);
  }
  void unstick() {
    target.add(unstick_amount);
    back.add(unstick_amount);
    c.add(unstick_amount);
  }
};

void run(bench::context& ctx) {
  namespace pp = bench::pingpong;
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  auto k = std::make_shared<counters>();
  if (!ec) k->c = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (!ec) k->target = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (!ec) k->back = dev.create_counter(compcntr::counter_type::wrs, ec);
  std::vector<std::shared_ptr<pp::tally>> tallies;
  std::vector<bench::variant> vs;
  auto cap = [](pp::control& ctl) {  // before round 1: the responder reads it after that update
    if (ctl.limit.load() > pre_armed) ctl.limit.store(pre_armed);
  };
  for (int variant : {0, 1, 2}) {
    const bool triggered = variant == 0, by_hand = variant == 2;
    tallies.push_back(std::make_shared<pp::tally>());
    const std::string name = triggered ? "triggered add (inline trigger on c adds to target)"
                             : by_hand ? "A adds to c and to target itself (no trigger)"
                                       : "waiter adds (B waits on c, adds to target itself)";
    if (ec) {
      vs.push_back(bench::unavailable_variant(name, std::string(compcntr::last_error_message())));
      continue;
    }
    pp::spec s;
    s.name = name;
    s.initiator = [k, cap, by_hand](pp::control& ctl) {
      cap(ctl);
      return pp::free_initiator(
          ctl,
          [&] {
            k->c.add(1);
            if (by_hand) k->target.add(1);
          },
          [&](std::uint64_t i) { return wait_on(k->back, i); });
    };
    if (triggered || by_hand)
      s.responder = [k](pp::control& ctl) {
        return pp::free_responder(
            ctl, [&] { k->back.add(1); }, [&](std::uint64_t i) { return wait_on(k->target, i); });
      };
    else
      s.responder = [k](pp::control& ctl) {
        return pp::free_responder(
            ctl,
            [&] {
              k->target.add(1);
              k->back.add(1);
            },
            [&](std::uint64_t i) { return wait_on(k->c, i); });
      };
    s.reset = [k, triggered] {
      k->armed.clear();
      k->zero();
      if (!triggered) return;
      std::error_code e;
      k->armed.reserve(pre_armed);
      for (std::uint64_t t = 1; t <= pre_armed && !e; ++t)
        k->armed.push_back(compcntr::trigger::arm_add(k->c, t, k->target, 1, e));
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
  ctx.add(bench::compare("P16", "triggered counter add vs the crossing thread adding itself", r[0],
                         r[2]));
}

} // namespace

COMPCNTR_BENCH_ROW("P16", "triggered counter add vs a waiter doing the add", run);
