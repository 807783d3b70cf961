// compcntr_bench harness: the row registry, the measurement loop and the report types.
//
// Purpose: every performance target ("P1", "P2", ..., "C1": bench/README.md, "The rows") is a
// *row*: one source file under bench/rows/ that registers itself with COMPCNTR_BENCH_ROW and,
// when run, measures compcntr and its references side by side and adds table lines (`check`s)
// to the report. The harness (this file, harness.cpp, output.cpp, main.cpp) knows nothing about
// any row: adding P4 is one new file plus one line in bench/rows/meson.build.
//
// How a row measures (see context::measure):
//   * a `variant` is one thing being timed (compcntr's call or a reference). Its run(n) performs n
//     operations and returns the elapsed nanoseconds; the variant times itself so that multi-thread
//     variants can leave thread start-up out. One-thread variants (timed()) count the thread's
//     CPU time, so time spent descheduled on the shared machine is not charged to them;
//     two-thread variants (two_threads()) count each thread's CPU time and re-run samples in
//     which the two threads did not really run at the same time.
//   * measure() calibrates n per variant so one sample lasts about --sample-ms (this is also the
//     warm-up), runs one more discarded sample, then takes --reps samples of every variant
//     *interleaved* (rep 1 of A, B, C, rep 2 of B, C, A, ...): drift of a shared, noisy machine hits
//     all variants alike, and sample i of A and of B are neighbours in time (paired ratios).
//   * results are ns per operation (or whatever unit the row gives): median, quartiles, min, max.
//
// Example (a whole row):
//     void run(bench::context& ctx) {
//       std::atomic<std::uint64_t> a{0};
//       auto r = ctx.measure({bench::timed("load", [&](std::uint64_t n) {
//         for (std::uint64_t i = 0; i < n; ++i) bench::keep(a.load(std::memory_order_acquire));
//       })});
//       ctx.add(bench::absolute("P0", "raw load", r[0]));
//     }
//     COMPCNTR_BENCH_ROW("P0", "example", run);
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace bench {

// ---- keeping the optimiser honest ----

/// Makes `v` "used": the compiler must compute it, but no store or load is added (register
/// operand). The way to consume a value read in a timed loop.
inline void keep(std::uint64_t v) noexcept { asm volatile("" : : "r"(v)); }
/// Makes the object at `p` "used and possibly modified" by unknown code.
inline void escape(const void* p) noexcept { asm volatile("" : : "g"(p) : "memory"); }
/// Compiler barrier: memory may have been read or written by unknown code.
inline void clobber() noexcept { asm volatile("" : : : "memory"); }

using steady = std::chrono::steady_clock;
inline double ns_since(steady::time_point t0) noexcept {
  return std::chrono::duration<double, std::nano>(steady::now() - t0).count();
}
/// CPU time of the calling thread (user + system, page faults included), in ns. Single-thread
/// variants are timed with it: on a shared machine, wall time would also count the time the
/// thread sat descheduled while another process ran.
inline double thread_cpu_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// ---- options and machine ----

struct options {
  int reps = 21; ///< samples per variant (median of these is reported)
  double sample_ms = 25; ///< target duration of one sample
  bool smoke = false; ///< every row tiny: checks that the program works, not timings
  bool pin = true; ///< pin threads to the allowed CPUs
  std::string out; ///< directory for compcntr_bench.json / .svg ("" = none)
  std::vector<std::string> rows; ///< selected row ids (empty = all)
  std::string self; ///< path of this program (for probes run in a fresh process)
};

/// CPUs this process may run on (sched_getaffinity), in increasing order.
const std::vector<int>& allowed_cpus();
/// Pins the calling thread to allowed_cpus()[k % size] (no-op with --no-pin). Returns the CPU.
int pin_to(const options& opt, int k);

// ---- statistics ----

struct stats {
  std::vector<double> samples;
  double median = 0, q1 = 0, q3 = 0, min = 0, max = 0;
};
stats summarize(std::vector<double> samples);

/// One measured quantity: compcntr's or a reference's.
struct result {
  std::string name; ///< what was measured, e.g. "fi_cntr_read (tcp;ofi_rxm, bound)"
  std::string unit = "ns/op";
  bool available = true;
  std::string why; ///< reason when !available
  std::uint64_t n = 0; ///< operations per sample
  stats st;
  std::map<std::string, std::string> notes; ///< extra facts for the JSON (provider info, ...)

  static result unavailable(std::string name, std::string why, std::string unit = "ns/op") {
    result r;
    r.name = std::move(name);
    r.unit = std::move(unit);
    r.available = false;
    r.why = std::move(why);
    return r;
  }
};

// ---- what is timed ----

struct variant {
  std::string name;
  /// Performs n operations and returns the elapsed nanoseconds.
  std::function<double(std::uint64_t n)> run;
  /// Non-empty: cannot be measured here (e.g. provider missing); this is the reason.
  std::string unavailable;
  /// Non-zero: always n = fixed_n (no calibration), e.g. P7's 1,000,000 counters.
  std::uint64_t fixed_n = 0;
  /// Non-zero: this variant's samples last about min(sample_ms, --sample-ms) ms.
  double sample_ms = 0;
  std::string unit = "ns/op";
  /// Timed events per operation: a sample's value is run(n) / (n x events_per_op) (P16's
  /// symmetric ping-pong: two add-to-visible latencies per round). Calibration uses run(n).
  double events_per_op = 1;
  std::map<std::string, std::string> notes;
};

/// A one-thread variant: body(n) is timed with the thread's CPU time (see thread_cpu_ns).
template <class Body>
variant timed(std::string name, Body body) {
  variant v;
  v.name = std::move(name);
  v.run = [body = std::move(body)](std::uint64_t n) mutable {
    const double t0 = thread_cpu_ns();
    body(n);
    return thread_cpu_ns() - t0;
  };
  v.notes["clock"] = "thread CPU time";
  return v;
}
/// A variant timed with wall-clock time (steady_clock), e.g. when other threads do the work.
template <class Body>
variant timed_wall(std::string name, Body body) {
  variant v;
  v.name = std::move(name);
  v.run = [body = std::move(body)](std::uint64_t n) mutable {
    const auto t0 = steady::now();
    body(n);
    return ns_since(t0);
  };
  v.notes["clock"] = "wall time";
  return v;
}

inline variant unavailable_variant(std::string name, std::string why) {
  variant v;
  v.name = std::move(name);
  v.unavailable = std::move(why);
  return v;
}

// ---- table lines ----

/// How a line is judged.
enum class goal {
  info, ///< no target: ratio ref/cc shown for information
  ratio_at_most, ///< "within Nx of ref":        cc / ref <= target
  speedup_at_least, ///< ">= Nx faster than ref":   ref / cc >= target
  speedup_above, ///< "faster than ref":          ref / cc >  target
  value_at_most, ///< absolute:                   cc <= target (no reference)
};

struct check {
  std::string row; ///< "P1"
  std::string measure; ///< what this line compares
  result cc; ///< compcntr
  result ref; ///< reference (name empty: none)
  goal g = goal::info;
  double target = 0;
  std::string note; ///< one short remark printed under the table (optional)

  // Filled by the report:
  double ratio = 0, ratio_min = 0, ratio_max = 0; ///< of medians; range of paired samples
  std::string ratio_kind; ///< "cc/ref", "ref/cc" or ""
  std::string verdict; ///< PASS, FAIL, info, n/a
  std::string target_text;
};

/// Computes ratio, verdict and target text of `c` from its results.
void judge(check& c);

/// A line comparing compcntr with a reference (goal::info: shown without a target).
inline check compare(std::string row, std::string measure, result cc, result ref,
                     goal g = goal::info, double target = 0, std::string note = {}) {
  check c;
  c.row = std::move(row);
  c.measure = std::move(measure);
  c.cc = std::move(cc);
  c.ref = std::move(ref);
  c.g = g;
  c.target = target;
  c.note = std::move(note);
  return c;
}
/// A line judging compcntr's value alone (goal::value_at_most or goal::info).
inline check absolute(std::string row, std::string measure, result cc, goal g = goal::info,
                      double target = 0, std::string note = {}) {
  return compare(std::move(row), std::move(measure), std::move(cc), result{}, g, target,
                 std::move(note));
}

// ---- what a row sees ----

class context {
 public:
  explicit context(const options& o) : opt(o) {}
  const options& opt;

  /// Calibrates, warms up and samples every variant, interleaved (see file comment).
  std::vector<result> measure(std::vector<variant> vs) const;

  /// Runs a(n) on the first allowed CPU and b(n) on the second at the same time, both released
  /// by one spin barrier, and returns the mean of the two threads' CPU times (ns) for their n
  /// operations. A sample counts only if the threads really ran together: each thread's CPU time
  /// must cover >= min_overlap of the window from the first start to the last finish; otherwise
  /// (another process took one of the CPUs meanwhile) it is re-run, up to max_retries times,
  /// keeping the best. pair_stats counts this. Short samples (variant::sample_ms) make a clean
  /// sample likely on a busy machine. With a single allowed CPU both threads share it (the row
  /// should mark itself unavailable instead).
  double two_threads(std::uint64_t n, const std::function<void(std::uint64_t)>& a,
                     const std::function<void(std::uint64_t)>& b) const;
  static constexpr double min_overlap = 0.9;
  static constexpr int max_retries = 50;
  struct pair_counts {
    std::uint64_t samples = 0; ///< two_threads() calls
    std::uint64_t retries = 0; ///< re-runs because the overlap was too small
    std::uint64_t low_overlap = 0; ///< samples kept although still below min_overlap
  };
  mutable pair_counts pair_stats;

  /// Runs this program's probe `name` in a fresh process (`self --probe name args...`) and returns
  /// its "key=value" output lines. On failure, returns {} and sets why.
  std::map<std::string, std::string> run_probe(const std::string& name,
                                               const std::vector<std::string>& args,
                                               std::string& why) const;

  void add(check c) { lines.push_back(std::move(c)); }
  std::vector<check> lines;
};

// ---- registry ----

struct row_info {
  const char* id; ///< "P1"
  const char* title; ///< one line
  void (*run)(context&);
};
bool register_row(row_info r);
/// All registered rows, in natural id order (P1, P2, ..., P10).
std::vector<row_info> registered_rows();

/// A probe: code a row runs in a fresh process (e.g. to read a clean VmRSS). It prints
/// "key=value" lines on stdout and returns the exit status.
struct probe_info {
  const char* name;
  int (*run)(const std::vector<std::string>& args);
};
bool register_probe(probe_info p);
const probe_info* find_probe(const std::string& name);

/// VmRSS of this process in bytes (from /proc/self/status), or 0 if unreadable.
std::uint64_t rss_bytes();

} // namespace bench

#define COMPCNTR_BENCH_CAT2(a, b) a##b
#define COMPCNTR_BENCH_CAT(a, b) COMPCNTR_BENCH_CAT2(a, b)
/// Registers a row at static-initialisation time (rows are linked into the program directly).
#define COMPCNTR_BENCH_ROW(id, title, fn)                                                  \
  [[maybe_unused]] static const bool COMPCNTR_BENCH_CAT(bench_row_registered_, __LINE__) = \
      ::bench::register_row(::bench::row_info{id, title, fn})
#define COMPCNTR_BENCH_PROBE(name, fn)                                                       \
  [[maybe_unused]] static const bool COMPCNTR_BENCH_CAT(bench_probe_registered_, __LINE__) = \
      ::bench::register_probe(::bench::probe_info{name, fn})
