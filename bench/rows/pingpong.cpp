// Two-thread ping-pong runner (see pingpong.hpp).
#include "pingpong.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace bench::pingpong {

namespace {

inline void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// The calling thread's run-queue delay so far (ns): the second field of
/// /proc/thread-self/schedstat. -1 if unreadable (kernel without sched_info).
double run_delay_ns() noexcept {
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  const ssize_t got = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (got <= 0) return -1;
  buf[got] = 0;
  char* p = buf;
  std::strtoull(p, &p, 10);  // time on the CPU
  char* q = p;
  const unsigned long long delay = std::strtoull(p, &q, 10);
  return q == p ? -1 : static_cast<double>(delay);
}

struct thread_sample {
  steady::time_point start{}, end{};
  double cpu = 0;       ///< thread CPU time of the loop
  double delay = 0;     ///< run-queue delay around the loop (-1: unknown)
  long vcsw = 0;        ///< voluntary context switches around the loop
  long ivcsw = 0;       ///< involuntary ones
  std::string why;      ///< the side's failure
};

struct attempt {
  double value = 0; ///< ns for n rounds (wall or summed wake latencies), scaled if cut short
  double wall = 0; ///< ns
  double delay_frac = 0; ///< larger thread's run-queue delay / wall
  long vcsw = 0, ivcsw = 0;
  std::uint64_t rounds = 0;
  bool schedstat = true;
  std::string why;
};

/// One sample: both sides, n rounds (fewer if the budget runs out), watchdog armed.
attempt run_once(const context& ctx, const spec& s, std::uint64_t n, double budget_ns) {
  if (s.reset) s.reset();
  auto ctl = std::make_unique<control>(); // 128-byte aligned, own lines
  ctl->limit.store(n);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  thread_sample sa, sb;

  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  // Generous: far above any legitimate sample (which the budget ends after budget_ns); the
  // sides' own waits time out after 2 s.
  const auto start = steady::now();
  const auto deadline = start + std::chrono::seconds(5) +
                        std::chrono::nanoseconds(static_cast<std::int64_t>(2 * budget_ns));
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lk(m);
    if (cv.wait_until(lk, deadline, [&] { return done; })) return;
    ctl->abort.store(true);
    while (!done) {
      lk.unlock();
      if (s.unstick) s.unstick();
      lk.lock();
      cv.wait_for(lk, std::chrono::milliseconds(10), [&] { return done; });
    }
  });

  auto body = [&](const side& f, thread_sample& ts, bool responder) {
    rusage r0{}, r1{};
    const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
    ts.delay = run_delay_ns();
    getrusage(RUSAGE_THREAD, &r0);
    if (responder) {
      ctl->responder_tid = tid;
      ready.store(1, std::memory_order_release);
      while (!go.load(std::memory_order_acquire)) relax();
    } else {
      ctl->initiator_tid = tid;
      while (ready.load(std::memory_order_acquire) == 0) relax();
      ctl->budget_end =
          steady::now() + std::chrono::nanoseconds(static_cast<std::int64_t>(budget_ns));
      go.store(true, std::memory_order_release);
    }
    ts.start = steady::now();
    const double c0 = thread_cpu_ns();
    ts.why = f(*ctl);
    ts.cpu = thread_cpu_ns() - c0;
    ts.end = steady::now();
    if (!ts.why.empty()) { // free the peer now rather than at its own timeout
      ctl->abort.store(true);
      if (s.unstick) s.unstick();
    }
    getrusage(RUSAGE_THREAD, &r1);
    const double d1 = run_delay_ns();
    ts.delay = (ts.delay < 0 || d1 < 0) ? -1 : d1 - ts.delay;
    ts.vcsw = r1.ru_nvcsw - r0.ru_nvcsw;
    ts.ivcsw = r1.ru_nivcsw - r0.ru_nivcsw;
  };
  std::thread tb([&] {
    pin_to(ctx.opt, 1);
    body(s.responder, sb, true);
  });
  pin_to(ctx.opt, 0);
  body(s.initiator, sa, false);
  tb.join();
  {
    std::lock_guard<std::mutex> lk(m);
    done = true;
  }
  cv.notify_one();
  watchdog.join();

  attempt a;
  a.wall = std::chrono::duration<double, std::nano>(std::max(sa.end, sb.end) -
                                                    std::min(sa.start, sb.start))
               .count();
  a.schedstat = sa.delay >= 0 && sb.delay >= 0;
  a.delay_frac = a.schedstat && a.wall > 0 ? std::max(sa.delay, sb.delay) / a.wall : 0;
  a.vcsw = sa.vcsw + sb.vcsw;
  a.ivcsw = sa.ivcsw + sb.ivcsw;
  // The root cause first: a side that stopped because its peer aborted says only "aborted".
  auto cause = [](const std::string& w) { return !w.empty() && w != "aborted"; };
  a.why =
      cause(sa.why)   ? "initiator: " + sa.why
      : cause(sb.why) ? "responder: " + sb.why
      : !sa.why.empty() || !sb.why.empty()
          ? "aborted by the watchdog after " +
                std::to_string(
                    std::chrono::duration_cast<std::chrono::seconds>(deadline - start).count()) +
                " s"
          : "";
  // unstick makes waits return and the sides then see abort, so a watchdog abort always shows
  // as a side's failure; never let a sample that was cut short that way count.
  if (a.why.empty() && ctl->abort.load()) a.why = "aborted by the watchdog";
  a.rounds = ctl->rounds;
  if (a.why.empty() && a.rounds == 0) a.why = "no round completed";
  if (a.why.empty()) {
    const double timed = s.how == timing::wall ? a.wall : ctl->latency_ns[0] + ctl->latency_ns[1];
    a.value = timed * static_cast<double>(n) / static_cast<double>(a.rounds);
  }
  return a;
}

} // namespace

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch())
      .count();
}

bool wait_until_asleep(pid_t tid, std::chrono::milliseconds timeout) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const auto end = steady::now() + timeout;
  bool asleep = false;
  char buf[512];
  for (;;) {
    // "tid (comm) S ...": the state follows the last ')'. Each pread at offset 0 regenerates it.
    const ssize_t got = ::pread(fd, buf, sizeof buf - 1, 0);
    if (got <= 0) break;
    buf[got] = 0;
    const char* p = std::strrchr(buf, ')');
    if (p != nullptr && p[1] == ' ' && p[2] == 'S') {
      asleep = true;
      break;
    }
    if (steady::now() >= end) break;
  }
  ::close(fd);
  return asleep;
}

variant make(const context& ctx, spec s, std::shared_ptr<tally> t) {
  variant v;
  v.name = s.name;
  v.unit = s.unit;
  v.events_per_op = s.events_per_round;
  v.sample_ms = s.sample_ms;
  if (allowed_cpus().size() < 2) {
    v.unavailable = "needs 2 CPUs, this process may use " + std::to_string(allowed_cpus().size());
    return v;
  }
  if (ctx.opt.smoke) v.fixed_n = s.smoke_rounds;
  v.notes["clock"] = s.how == timing::wall
                         ? "wall time, first start to last end of the two pinned threads"
                         : "sum of the two update-to-return times per round, each waiter asleep";
  v.run = [&ctx, s = std::move(s), t](std::uint64_t n) -> double {
    if (!t->failure.empty()) return 1e9; // failed before: do not wait again
    ++t->samples;
    const auto t0 = steady::now();
    struct add_time {
      tally& t;
      steady::time_point t0;
      ~add_time() { t.seconds += ns_since(t0) / 1e9; }
    } timer{*t, t0};
    const double sample_ns =
        (s.sample_ms > 0 ? std::min(s.sample_ms, ctx.opt.sample_ms) : ctx.opt.sample_ms) * 1e6;
    // --smoke: fixed small rounds; the budget only keeps a pathological sample short.
    const double budget_ns = ctx.opt.smoke ? 2e9 : s.budget_factor * sample_ns;
    attempt best = run_once(ctx, s, n, budget_ns);
    const int retries = ctx.opt.smoke ? 0 : s.max_retries;
    for (int k = 0;
         best.why.empty() && best.schedstat && best.delay_frac > s.max_delay && k < retries; ++k) {
      ++t->retries;
      attempt again = run_once(ctx, s, n, budget_ns);
      if (!again.why.empty() || again.delay_frac < best.delay_frac) best = std::move(again);
    }
    if (!best.why.empty()) {
      t->failure = best.why;
      return 1e9;
    }
    if (!best.schedstat) t->schedstat = false;
    if (best.schedstat && best.delay_frac > s.max_delay) ++t->delayed;
    if (best.rounds < n) ++t->cut_short;
    t->rounds += best.rounds;
    t->sleeps += static_cast<std::uint64_t>(std::max(0L, best.vcsw));
    t->preempted += static_cast<std::uint64_t>(std::max(0L, best.ivcsw));
    t->delay_frac_sum += best.delay_frac;
    return best.value;
  };
  return v;
}

double sleeps_per_wait(const tally& t) {
  return t.rounds ? static_cast<double>(t.sleeps) / (2.0 * static_cast<double>(t.rounds)) : 0;
}

void finish(result& r, const tally& t) {
  if (!t.failure.empty() && r.available) {
    result u = result::unavailable(r.name, "stuck or failed: " + t.failure, r.unit);
    u.notes = r.notes;
    r = std::move(u);
  }
  char buf[64];
  auto put = [&](const char* key, double v) {
    std::snprintf(buf, sizeof buf, "%.4g", v);
    r.notes[key] = buf;
  };
  put("sleeps_per_wait", sleeps_per_wait(t));
  put("involuntary_switches_per_round",
      t.rounds ? static_cast<double>(t.preempted) / static_cast<double>(t.rounds) : 0);
  put("samples", static_cast<double>(t.samples));
  put("reruns", static_cast<double>(t.retries));
  put("kept_over_delay_limit", static_cast<double>(t.delayed));
  put("seconds", t.seconds);
  put("cut_short", static_cast<double>(t.cut_short));
  put("mean_run_queue_delay_fraction",
      t.samples ? t.delay_frac_sum / static_cast<double>(t.samples) : 0);
  if (!t.schedstat) r.notes["run_queue_check"] = "off: /proc/thread-self/schedstat unreadable";
}

std::string describe(const std::string& who, const tally& t) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s: %.0f%% of waits slept in the kernel (%.2f voluntary switches per round trip); "
                "%llu samples, %llu re-run (a thread sat in a run queue), %llu kept over the "
                "limit, %llu cut short; %.1f s",
                who.c_str(), 100 * sleeps_per_wait(t),
                t.rounds ? static_cast<double>(t.sleeps) / static_cast<double>(t.rounds) : 0.0,
                static_cast<unsigned long long>(t.samples),
                static_cast<unsigned long long>(t.retries),
                static_cast<unsigned long long>(t.delayed),
                static_cast<unsigned long long>(t.cut_short), t.seconds);
  return buf;
}

} // namespace bench::pingpong
