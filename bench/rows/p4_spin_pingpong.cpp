// P4: spin-mode wait ping-pong round trip between two threads on two counters.
// Target: within 1.25x of a raw spin ping-pong on two padded atomics; >= 1.5x faster than a
// fi_cntr_wait ping-pong on libfabric's shm provider. Also shown (no target): the same
// fi_cntr_wait ping-pong on tcp;ofi_rxm and udp;ofi_rxd (the spec's 0.6 / 29 / 57 us).
//
// What is timed (pingpong.hpp): thread A pinned to the first CPU, B to the second; round i is
//   A: ping += 1, then wait until pong >= i;    B: wait until ping >= i, then pong += 1.
// One sample = n rounds, value = wall time / n (one round trip). Every variant runs the same loop
// (pingpong.hpp: per round two relaxed loads of an L1-resident control line, a clock read every
// 64 rounds) around its own update of the peer's word and wait on its own word.
//   * compcntr: two counters of one software device (two pool slots, 128 B apart or more);
//     add(1) and compcntr::wait(c, i, 2 s, wait_options{.spin = spin_forever}) -- the hot poll
//     (check, pause, check, ...), never sleeping; the 2 s timeout makes it read the clock every
//     16 polls.
//   * raw: two std::atomic<uint64_t> on their own 128-byte blocks; fetch_add(1) and a
//     `while (load(acquire) < i) pause` loop with the same 16-poll clock check for the timeout.
//   * libfabric: two endpoints of the provider, each with its own FI_WAIT_UNSPEC counter bound to
//     it; fi_cntr_add(peer, 1) and fi_cntr_wait(own, i, 2000 ms) (see fabric.hpp).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "../fabric.hpp"
#include "../harness.hpp"
#include "pingpong.hpp"

import compcntr;

namespace {

using namespace std::chrono_literals;
constexpr auto wait_timeout = 2000ms;

struct alignas(128) padded_atomic {
  std::atomic<std::uint64_t> v{0};
};

const compcntr::wait_options spin_opts{.spin = compcntr::spin_forever};

// The variants' operations, inlined into the shared loops of pingpong.hpp.
struct cc_ops {
  static void update(compcntr::counter& c) noexcept { c.add(1); }
  static std::string wait(compcntr::counter& c, std::uint64_t i) {
    const std::errc e = compcntr::wait(c, i, wait_timeout, spin_opts);
    if (e == std::errc{}) [[likely]] return {};
    return "compcntr::wait: " + std::make_error_code(e).message();
  }
};
/// The raw reference: fetch_add, and a `pause` poll that reads the clock every 16 polls for its
/// timeout (what compcntr's hot poll does when the wait has a timeout).
struct raw_ops {
  static void update(std::atomic<std::uint64_t>& a) noexcept { a.fetch_add(1); }
  static std::string wait(const std::atomic<std::uint64_t>& a, std::uint64_t i) {
    if (a.load(std::memory_order_acquire) >= i) return {};
    const auto end = std::chrono::steady_clock::now() + wait_timeout;
    for (unsigned k = 1;; ++k) {
      __builtin_ia32_pause();
      if (a.load(std::memory_order_acquire) >= i) return {};
      if (k % 16 == 0 && std::chrono::steady_clock::now() >= end) return "raw spin: timed out";
    }
  }
};
/// Diagnosis reference: raw atomics accessed the way slot::add touches its hot line -- a load
/// of a word of the line (slot::hw) before the RMW, and one after it (slot::watch, notify()).
/// When the peer is polling the line, the load before the RMW costs a second coherence
/// transaction (the line arrives shared, then must be upgraded for the RMW).
struct alignas(128) slot_like {
  std::atomic<std::uint64_t> value{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint32_t> wake_seq{0}, watch{0};
  std::atomic<const void*> hw{nullptr};
};
struct slot_like_ops {
  static void update(slot_like& s) noexcept {
    if (s.hw.load(std::memory_order_relaxed) != nullptr) [[unlikely]] std::abort();
    s.value.fetch_add(1);
    if (s.watch.load() != 0) [[unlikely]] std::abort();
  }
  static std::string wait(slot_like& s, std::uint64_t i) { return raw_ops::wait(s.value, i); }
};
struct fi_ops {
  static void update(fid_cntr& c) noexcept { bench::fabric::cntr_add(&c, 1); }
  static std::string wait(fid_cntr& c, std::uint64_t i) {
    const int ret = bench::fabric::cntr_wait(&c, i, static_cast<int>(wait_timeout.count()));
    if (ret == 0) [[likely]] return {};
    return bench::fabric::error_text("fi_cntr_wait", ret);
  }
};

constexpr std::uint64_t unstick_amount = std::uint64_t{1} << 40;

/// The fi_cntr_wait ping-pong of `provider` (two endpoints, a bound counter each).
bench::variant fabric_pingpong(const bench::context& ctx, const std::string& label,
                               const std::string& provider, std::shared_ptr<bench::pingpong::tally> t) {
  std::string why;
  const auto* p = bench::fabric::get_wait_pair(provider, why);
  if (!p) return bench::unavailable_variant(label, why);
  bench::pingpong::spec s;
  s.name = label;
  fid_cntr* ping = p->b;  // the responder's counter: the initiator adds, the responder waits
  fid_cntr* pong = p->a;
  bench::pingpong::set_sides(s, ping, pong, fi_ops::update, fi_ops::wait);
  s.reset = [ping, pong] {
    bench::fabric::cntr_set(ping, 0);
    bench::fabric::cntr_set(pong, 0);
  };
  s.unstick = [ping, pong] {
    bench::fabric::cntr_add(ping, unstick_amount);
    bench::fabric::cntr_add(pong, unstick_amount);
  };
  // Microseconds to hundreds of them per round trip: longer samples, fewer re-runs.
  s.sample_ms = 10;
  s.max_retries = 5;
  s.smoke_rounds = 16;
  auto v = bench::pingpong::make(ctx, std::move(s), std::move(t));
  bench::fabric::describe(v, *p);
  return v;
}

std::string slot_pattern_note(double slowdown) {
  char buf[300];
  std::snprintf(buf, sizeof buf, "raw atomics touched like slot::add touches its hot line (a load "
                "of slot::hw before the RMW, of slot::watch after it) are %.2fx the plain raw "
                "round trip in this run: the cost of that access pattern alone", slowdown);
  return buf;
}

void run(bench::context& ctx) {
  namespace pp = bench::pingpong;
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  compcntr::counter ping, pong;  // ping: A adds, B waits; pong: B adds, A waits
  if (!ec) ping = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (!ec) pong = dev.create_counter(compcntr::counter_type::wrs, ec);
  std::vector<std::shared_ptr<pp::tally>> tallies;
  auto tally = [&] { return tallies.emplace_back(std::make_shared<pp::tally>()); };
  std::vector<bench::variant> vs;

  const std::string cc_name = "compcntr::wait spin_forever, two pool counters";
  if (ec) {
    tally();
    vs.push_back(bench::unavailable_variant(
        cc_name, "soft device/counter: " + std::string(compcntr::last_error_message())));
  } else {
    pp::spec s;
    s.name = cc_name;
    pp::set_sides(s, &ping, &pong, cc_ops::update, cc_ops::wait);
    s.reset = [&] {
      ping.set(0);
      pong.set(0);
    };
    s.unstick = [&] {
      ping.add(unstick_amount);
      pong.add(unstick_amount);
    };
    s.sample_ms = 2;  // short: a sample no other process interrupts is likely (as P3)
    vs.push_back(pp::make(ctx, std::move(s), tally()));
    vs.back().notes["wait"] = "wait_options{.spin = spin_forever}, timeout 2 s";
  }

  auto raw = std::make_unique<padded_atomic[]>(2);  // [0] ping, [1] pong: exactly 128 B apart
  {
    pp::spec s;
    s.name = "raw spin, two 128-byte-padded std::atomic";
    auto* pi = &raw[0].v;
    auto* po = &raw[1].v;
    pp::set_sides(s, pi, po, raw_ops::update, raw_ops::wait);
    s.reset = [pi, po] {
      pi->store(0);
      po->store(0);
    };
    s.unstick = [pi, po] {
      pi->fetch_add(unstick_amount);
      po->fetch_add(unstick_amount);
    };
    s.sample_ms = 2;
    vs.push_back(pp::make(ctx, std::move(s), tally()));
  }
  auto like = std::make_unique<slot_like[]>(2);
  {
    pp::spec s;
    s.name = "raw spin, slot's access pattern (load hw, RMW, load watch)";
    auto* pi = &like[0];
    auto* po = &like[1];
    pp::set_sides(s, pi, po, slot_like_ops::update, slot_like_ops::wait);
    s.reset = [pi, po] {
      pi->value.store(0);
      po->value.store(0);
    };
    s.unstick = [pi, po] {
      pi->value.fetch_add(unstick_amount);
      po->value.fetch_add(unstick_amount);
    };
    s.sample_ms = 2;
    vs.push_back(pp::make(ctx, std::move(s), tally()));
  }
  vs.push_back(fabric_pingpong(ctx, "fi_cntr_wait ping-pong, shm", "shm", tally()));
  vs.push_back(fabric_pingpong(ctx, "fi_cntr_wait ping-pong, tcp;ofi_rxm", "tcp;ofi_rxm", tally()));
  vs.push_back(fabric_pingpong(ctx, "fi_cntr_wait ping-pong, udp;ofi_rxd", "udp;ofi_rxd", tally()));

  auto r = ctx.measure(std::move(vs));
  for (std::size_t i = 0; i < r.size(); ++i) pp::finish(r[i], *tallies[i]);
  auto note = [&](std::size_t i, const char* who) {
    return r[i].available ? pp::describe(who, *tallies[i]) : std::string();
  };
  ctx.add(bench::compare("P4", "spin wait ping-pong vs raw spin ping-pong", r[0], r[1],
                         bench::goal::ratio_at_most, 1.25,
                         note(0, "compcntr") + (r[1].available ? " | " + note(1, "raw spin") : "")));
  ctx.add(bench::compare("P4", "spin wait ping-pong vs raw, slot access pattern", r[0], r[2],
                         bench::goal::info, 0,
                         r[2].available && r[1].available && r[1].st.median > 0
                             ? slot_pattern_note(r[2].st.median / r[1].st.median)
                             : std::string()));
  ctx.add(bench::compare("P4", "spin wait ping-pong vs fi_cntr_wait shm", r[0], r[3],
                         bench::goal::speedup_at_least, 1.5, note(3, "fi_cntr_wait shm")));
  ctx.add(bench::compare("P4", "spin wait ping-pong vs fi_cntr_wait tcp;ofi_rxm", r[0], r[4],
                         bench::goal::info, 0, note(4, "fi_cntr_wait tcp;ofi_rxm")));
  ctx.add(bench::compare("P4", "spin wait ping-pong vs fi_cntr_wait udp;ofi_rxd", r[0], r[5],
                         bench::goal::info, 0, note(5, "fi_cntr_wait udp;ofi_rxd")));
}

}  // namespace

COMPCNTR_BENCH_ROW("P4", "spin-mode wait ping-pong vs raw spin and fi_cntr_wait ping-pongs", run);
