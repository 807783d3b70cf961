// Two-thread ping-pong variants for rows P4 and P5.
//
// Purpose: a ping-pong is two loops on two pinned threads on two words (counters, atomics,
// libfabric counters). The initiator (first allowed CPU) runs round i as "update the responder's
// word, then wait until my word reaches i"; the responder (second CPU) mirrors it: "wait until
// my word reaches i, then update the initiator's". Two ways to time it:
//   * free-running (timing::wall): a sample is n rounds; its value is the wall time from the
//     first thread's start to the last thread's end, / n: one round trip. Whether a waiter
//     sleeps depends on the race between going to sleep and the peer's answer.
//   * gated (timing::wake_latency): before each update the sender waits until the receiver is
//     asleep in the kernel (its /proc/thread-self/.../stat state is 'S'), then notes the time
//     and updates; the receiver notes the time its wait returned. The value is the sum of the
//     two update-to-return times of a round: a round trip in which every waiter was asleep, by
//     construction (the gate's own polling is not timed).
//
// Why not context::two_threads (P3): it times CPU time and accepts a sample when both threads'
// CPU time covers the window, right for threads that never stop running. A waiter that sleeps
// has CPU time far below its wall time by design. This runner reads each thread's run-queue
// delay (time runnable but not running: /proc/thread-self/schedstat, the kernel's sched_info)
// and re-runs a sample when a thread waited in a run queue for more than `max_delay` of the
// window (10% for spinning variants: the same 90% rule as two_threads), up to max_retries
// times, keeping the least delayed; not in --smoke. It counts each thread's voluntary context
// switches (getrusage RUSAGE_THREAD: the thread blocked in the kernel -- futex, epoll, poll; a
// sched_yield is not one), so the table can say which fraction of the waits really slept.
//
// Bounded: every wait of a side has a timeout, except where the API has none
// (std::atomic::wait): a watchdog thread (asleep) sets the abort flag and calls `unstick` every
// 10 ms once the sample's deadline has passed, until both sides return. A side that fails also
// aborts and unsticks its peer. A failed variant is reported unavailable with the reason
// (finish()), and its later samples return at once. A sample also ends early, at a round
// boundary both sides agree on, once it has run for budget_factor x its planned length (the
// machine got slower than at calibration, e.g. a yielding reference on a loaded machine): its
// time is then scaled to n rounds.
//
// Every loop (free_initiator ... gated_responder below) is shared by all variants, so each pays
// the same per-round bookkeeping: two relaxed loads of this sample's control line and, every 64
// rounds, one clock read by the initiator.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "../harness.hpp"

namespace bench::pingpong {

/// Shared by the two sides of one sample (one line read by both, written rarely).
struct alignas(128) control {
  std::atomic<std::uint64_t> limit{0};   ///< last round to run (lowered when the budget is spent)
  std::atomic<bool> abort{false};        ///< stop now (a side failed, or the watchdog fired)
  steady::time_point budget_end{};       ///< the initiator lowers `limit` after this
  pid_t initiator_tid = 0, responder_tid = 0;
  alignas(128) std::atomic<std::int64_t> sent_at[2] = {};  ///< gated: ns stamp of the last update
  double latency_ns[2] = {0, 0};         ///< gated: sum of update-to-return times, per receiver
  std::uint64_t rounds = 0;              ///< rounds completed (written by the initiator)
};

/// One side: runs rounds 1..limit. Returns "" when done, else why it stopped.
using side = std::function<std::string(control& ctl)>;

enum class timing { wall, wake_latency };

struct spec {
  std::string name;
  side initiator;
  side responder;
  std::function<void()> reset;    ///< before every sample, threads joined: words back to 0
  std::function<void()> unstick;  ///< makes every wait of both sides return (after abort)
  timing how = timing::wall;
  double sample_ms = 5;           ///< length of one sample (ms; capped by --sample-ms)
  double max_delay = 0.10;        ///< accepted run-queue delay per thread, fraction of window
  int max_retries = 20;           ///< re-runs of a delayed sample (0 in --smoke)
  double budget_factor = 4;       ///< a sample stops after this x its planned length
  std::uint64_t smoke_rounds = 64;  ///< --smoke: fixed rounds per sample
  /// The timed event is a fraction of a round: a round carries this many of them (P16's
  /// symmetric triggered ping-pong: two add-to-visible latencies per round), and the variant
  /// reports ns per event in `unit` (variant::events_per_op).
  double events_per_round = 1;
  std::string unit = "ns/round trip";
};

/// What happened over all samples of one variant (calibration included).
struct tally {
  std::uint64_t samples = 0;     ///< samples taken (each possibly re-run)
  std::uint64_t retries = 0;     ///< re-runs because a thread sat in a run queue too long
  std::uint64_t delayed = 0;     ///< samples kept although still over max_delay
  std::uint64_t cut_short = 0;   ///< kept samples that hit the time budget
  std::uint64_t rounds = 0;      ///< rounds of the kept samples
  std::uint64_t sleeps = 0;      ///< voluntary context switches of both threads (kept samples)
  std::uint64_t preempted = 0;   ///< involuntary context switches of both threads (kept samples)
  double delay_frac_sum = 0;     ///< sum over kept samples of the larger thread's delay fraction
  double seconds = 0;            ///< wall time spent in this variant's samples, re-runs included
  bool schedstat = true;         ///< false: /proc/thread-self/schedstat unreadable, no check
  std::string failure;           ///< non-empty: a wait failed or got stuck; results are void
};

/// A harness variant running `s` (unit `s.unit`, per round by default). `t` collects the tally.
variant make(const context& ctx, spec s, std::shared_ptr<tally> t);

/// After measure(): marks `r` unavailable if the variant failed, and stores the tally in its
/// notes (sleeps per wait, re-runs).
void finish(result& r, const tally& t);

/// One line for the notes under the table: which fraction of waits slept, re-runs, time.
std::string describe(const std::string& who, const tally& t);

/// Sleeps per wait: voluntary context switches / (2 waits per round trip).
double sleeps_per_wait(const tally& t);

// ---- the loops (templates: each variant's update and wait are inlined into them) ----

/// Waits until thread `tid` of this process is asleep (state 'S') or `timeout` passes.
bool wait_until_asleep(pid_t tid, std::chrono::milliseconds timeout);
std::int64_t now_ns() noexcept;

inline bool budget_spent(control& ctl, std::uint64_t i) noexcept {
  if ((i & 63) != 0 || steady::now() < ctl.budget_end) return false;
  if (i < ctl.limit.load(std::memory_order_relaxed)) ctl.limit.store(i, std::memory_order_relaxed);
  return true;
}

/// `update()` adds 1 to the peer's word; `wait(i)` returns "" once the own word is >= i, else
/// why it failed (timed out).
template <class Update, class Wait>
std::string free_initiator(control& ctl, Update&& update, Wait&& wait) {
  for (std::uint64_t i = 1;; ++i) {
    // Round i runs only if the initiator decided so before its update of round i: the responder
    // sees the same limit, because it reads it after its wait saw that update.
    if (i > ctl.limit.load(std::memory_order_relaxed)) return ctl.rounds = i - 1, std::string();
    if (ctl.abort.load(std::memory_order_relaxed)) [[unlikely]]
      return "aborted";
    budget_spent(ctl, i);
    update();
    if (std::string why = wait(i); !why.empty()) [[unlikely]]
      return why + " in round " + std::to_string(i);
  }
}
template <class Update, class Wait>
std::string free_responder(control& ctl, Update&& update, Wait&& wait) {
  for (std::uint64_t i = 1;; ++i) {
    if (i > ctl.limit.load(std::memory_order_relaxed)) return {};
    if (ctl.abort.load(std::memory_order_relaxed)) [[unlikely]]
      return "aborted";
    if (std::string why = wait(i); !why.empty()) [[unlikely]]
      return why + " in round " + std::to_string(i);
    update();
  }
}

/// Gated loops: the sender updates only once the receiver sleeps in the kernel.
template <class Update, class Wait>
std::string gated_initiator(control& ctl, Update&& update, Wait&& wait) {
  for (std::uint64_t i = 1;; ++i) {
    if (i > ctl.limit.load(std::memory_order_relaxed)) return ctl.rounds = i - 1, std::string();
    if (ctl.abort.load(std::memory_order_relaxed)) [[unlikely]]
      return "aborted";
    budget_spent(ctl, i);
    if (!wait_until_asleep(ctl.responder_tid, std::chrono::milliseconds(2000))) [[unlikely]]
      return "the responder did not fall asleep within 2 s in round " + std::to_string(i);
    ctl.sent_at[0].store(now_ns(), std::memory_order_relaxed);
    update();
    if (std::string why = wait(i); !why.empty()) [[unlikely]]
      return why + " in round " + std::to_string(i);
    ctl.latency_ns[0] +=
        static_cast<double>(now_ns() - ctl.sent_at[1].load(std::memory_order_relaxed));
  }
}
template <class Update, class Wait>
std::string gated_responder(control& ctl, Update&& update, Wait&& wait) {
  for (std::uint64_t i = 1;; ++i) {
    if (i > ctl.limit.load(std::memory_order_relaxed)) return {};
    if (ctl.abort.load(std::memory_order_relaxed)) [[unlikely]]
      return "aborted";
    if (std::string why = wait(i); !why.empty()) [[unlikely]]
      return why + " in round " + std::to_string(i);
    ctl.latency_ns[1] +=
        static_cast<double>(now_ns() - ctl.sent_at[0].load(std::memory_order_relaxed));
    if (!wait_until_asleep(ctl.initiator_tid, std::chrono::milliseconds(2000))) [[unlikely]]
      return "the initiator did not fall asleep within 2 s in round " + std::to_string(i);
    ctl.sent_at[1].store(now_ns(), std::memory_order_relaxed);
    update();
  }
}

/// Both sides of a ping-pong on (ping, pong) words: the initiator updates ping and waits on pong.
/// `update(word)` and `wait(word, i)` are the variant's operations.
template <class Word, class Update, class Wait>
void set_sides(spec& s, Word* ping, Word* pong, Update update, Wait wait) {
  if (s.how == timing::wall) {
    s.initiator = [=](control& c) {
      return free_initiator(
          c, [&] { update(*ping); }, [&](std::uint64_t i) { return wait(*pong, i); });
    };
    s.responder = [=](control& c) {
      return free_responder(
          c, [&] { update(*pong); }, [&](std::uint64_t i) { return wait(*ping, i); });
    };
  } else {
    s.initiator = [=](control& c) {
      return gated_initiator(
          c, [&] { update(*ping); }, [&](std::uint64_t i) { return wait(*pong, i); });
    };
    s.responder = [=](control& c) {
      return gated_responder(
          c, [&] { update(*pong); }, [&](std::uint64_t i) { return wait(*ping, i); });
    };
  }
}

} // namespace bench::pingpong
