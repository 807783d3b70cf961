// compcntr_bench harness: registry, pinning, statistics, sampling, probes (see harness.hpp).
#include "harness.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace bench {

// ---- CPUs ----

const std::vector<int>& allowed_cpus() {
  static const std::vector<int> cpus = [] {
    std::vector<int> v;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) v.push_back(c);
    if (v.empty()) v.push_back(0);
    return v;
  }();
  return cpus;
}

int pin_to(const options& opt, int k) {
  const auto& cpus = allowed_cpus();
  const int cpu = cpus[static_cast<std::size_t>(k) % cpus.size()];
  if (!opt.pin) return -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) return -1;
  return cpu;
}

namespace {
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
} // namespace

// ---- statistics ----

namespace {
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = static_cast<std::size_t>(std::ceil(pos));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}
} // namespace

stats summarize(std::vector<double> samples) {
  stats s;
  s.samples = samples;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.median = quantile(samples, 0.5);
  s.q1 = quantile(samples, 0.25);
  s.q3 = quantile(samples, 0.75);
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

// ---- judging a line ----

void judge(check& c) {
  const bool has_ref = !c.ref.name.empty();
  const bool ok = c.cc.available && (!has_ref || c.ref.available);
  char buf[64];
  auto fmt = [&](const char* f, double v) {
    std::snprintf(buf, sizeof buf, f, v);
    return std::string(buf);
  };
  switch (c.g) {
    case goal::info: c.target_text = "-"; break;
    case goal::ratio_at_most: c.target_text = fmt("<= %.4gx", c.target); break;
    case goal::speedup_at_least: c.target_text = fmt(">= %.4gx", c.target); break;
    case goal::speedup_above: c.target_text = fmt("> %.4gx", c.target); break;
    case goal::value_at_most: c.target_text = fmt("<= %.4g ", c.target) + c.cc.unit; break;
  }
  if (!ok || (c.g != goal::value_at_most && !has_ref && c.g != goal::info)) {
    c.verdict = "n/a";
    return;
  }
  if (has_ref) {
    const bool cc_over_ref = c.g == goal::ratio_at_most;
    c.ratio_kind = cc_over_ref ? "cc/ref" : "ref/cc";
    auto r = [&](double cc, double ref) { return cc_over_ref ? cc / ref : ref / cc; };
    c.ratio = r(c.cc.st.median, c.ref.st.median);
    const auto& a = c.cc.st.samples;
    const auto& b = c.ref.st.samples;
    if (a.size() == b.size() && !a.empty()) {  // paired by repetition (interleaved sampling)
      c.ratio_min = c.ratio_max = r(a[0], b[0]);
      for (std::size_t i = 1; i < a.size(); ++i) {
        c.ratio_min = std::min(c.ratio_min, r(a[i], b[i]));
        c.ratio_max = std::max(c.ratio_max, r(a[i], b[i]));
      }
    } else {
      c.ratio_min = c.ratio_max = c.ratio;
    }
  }
  switch (c.g) {
    case goal::info: c.verdict = "info"; break;
    case goal::ratio_at_most: c.verdict = c.ratio <= c.target ? "PASS" : "FAIL"; break;
    case goal::speedup_at_least: c.verdict = c.ratio >= c.target ? "PASS" : "FAIL"; break;
    case goal::speedup_above: c.verdict = c.ratio > c.target ? "PASS" : "FAIL"; break;
    case goal::value_at_most: c.verdict = c.cc.st.median <= c.target ? "PASS" : "FAIL"; break;
  }
}

// ---- sampling ----

std::vector<result> context::measure(std::vector<variant> vs) const {
  std::vector<result> out(vs.size());
  std::vector<std::uint64_t> n(vs.size(), 0);
  std::vector<std::vector<double>> samples(vs.size());
  std::vector<std::size_t> live;
  for (std::size_t i = 0; i < vs.size(); ++i) {
    out[i].name = vs[i].name;
    out[i].unit = vs[i].unit;
    out[i].notes = vs[i].notes;
    if (!vs[i].unavailable.empty() || !vs[i].run) {
      out[i].available = false;
      out[i].why = vs[i].unavailable.empty() ? "no implementation" : vs[i].unavailable;
      continue;
    }
    live.push_back(i);
  }
  // Calibration doubles as warm-up: grow n until a sample is long enough to time well, then
  // scale to the requested sample length and run one more (discarded) sample at that size.
  for (std::size_t i : live) {
    const double sample_ns =
        (vs[i].sample_ms > 0 ? std::min(vs[i].sample_ms, opt.sample_ms) : opt.sample_ms) * 1e6;
    if (vs[i].fixed_n) {
      n[i] = vs[i].fixed_n;
    } else {
      std::uint64_t k = 16;
      double t = vs[i].run(k);
      while (t < sample_ns / 8 && k < (std::uint64_t{1} << 40)) {
        const double grow = t > 0 ? std::clamp(sample_ns / 8 / t, 2.0, 64.0) : 64.0;
        k = static_cast<std::uint64_t>(static_cast<double>(k) * grow);
        t = vs[i].run(k);
      }
      n[i] = std::max<std::uint64_t>(
          1, static_cast<std::uint64_t>(static_cast<double>(k) * sample_ns / std::max(t, 1.0)));
    }
    vs[i].run(n[i]);
  }
  const int reps = std::max(1, opt.reps);
  for (int r = 0; r < reps; ++r) {
    for (std::size_t j = 0; j < live.size(); ++j) {  // rotate the order every repetition
      const std::size_t i = live[(j + static_cast<std::size_t>(r)) % live.size()];
      samples[i].push_back(vs[i].run(n[i]) / (static_cast<double>(n[i]) * vs[i].events_per_op));
    }
  }
  for (std::size_t i : live) {
    out[i].n = n[i];
    out[i].st = summarize(samples[i]);
  }
  return out;
}

double context::two_threads(std::uint64_t n, const std::function<void(std::uint64_t)>& a,
                            const std::function<void(std::uint64_t)>& b) const {
  struct span {
    steady::time_point start, end;
    double cpu = 0;  // thread CPU time of the loop
  };
  auto once = [&] {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    span sa, sb;
    auto body = [&go](const std::function<void(std::uint64_t)>& f, std::uint64_t k, span& s) {
      while (!go.load(std::memory_order_acquire)) cpu_relax();
      s.start = steady::now();
      const double c0 = thread_cpu_ns();
      f(k);
      s.cpu = thread_cpu_ns() - c0;
      s.end = steady::now();
    };
    std::thread tb([&] {
      pin_to(opt, 1);
      ready.fetch_add(1, std::memory_order_release);
      body(b, n, sb);
    });
    pin_to(opt, 0);
    while (ready.load(std::memory_order_acquire) == 0) cpu_relax();
    go.store(true, std::memory_order_release);
    body(a, n, sa);
    tb.join();
    const double window = std::chrono::duration<double, std::nano>(std::max(sa.end, sb.end) -
                                                                   std::min(sa.start, sb.start))
                              .count();
    // Both threads on their CPUs for most of the window: each one's CPU time covers it.
    return std::make_pair((sa.cpu + sb.cpu) / 2,
                          window > 0 ? std::min(sa.cpu, sb.cpu) / window : 0.0);
  };
  ++pair_stats.samples;
  auto best = once();
  const int retries = opt.smoke ? 0 : max_retries;  // --smoke checks the program, not timings
  for (int retry = 0; best.second < min_overlap && retry < retries; ++retry) {
    ++pair_stats.retries;
    auto again = once();
    if (again.second > best.second) best = again;
  }
  if (best.second < min_overlap) ++pair_stats.low_overlap;
  return best.first;
}

// ---- probes in a fresh process ----

std::map<std::string, std::string> context::run_probe(const std::string& name,
                                                      const std::vector<std::string>& args,
                                                      std::string& why) const {
  std::map<std::string, std::string> kv;
  int fds[2];
  if (pipe(fds) != 0) {
    why = std::string("pipe: ") + std::strerror(errno);
    return kv;
  }
  std::vector<std::string> argv_s{opt.self, "--probe", name};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  // A probe inherits the spawning thread's CPU affinity, and the rows pin this thread: the
  // probe gets every CPU this process started with (allowed_cpus), so that a two-process probe
  // (P13) really runs on two CPUs (it ran both processes on CPU 0 before).
  cpu_set_t mine, all;
  CPU_ZERO(&all);
  for (const int c : allowed_cpus()) CPU_SET(c, &all);
  const bool restore = pthread_getaffinity_np(pthread_self(), sizeof mine, &mine) == 0 &&
                       pthread_setaffinity_np(pthread_self(), sizeof all, &all) == 0;
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, opt.self.c_str(), &fa, nullptr, argv.data(), environ);
  if (restore) pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    why = "spawning " + opt.self + ": " + std::strerror(rc);
    return kv;
  }
  std::string text;
  char buf[4096];
  for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) != 0;) {
    if (got < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buf, static_cast<std::size_t>(got));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (auto eq = line.find('='); eq != std::string::npos)
      kv[line.substr(0, eq)] = line.substr(eq + 1);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    why = "probe '" + name + "' failed (status " + std::to_string(status) + ")";
    if (auto e = kv.find("error"); e != kv.end()) why += ": " + e->second;
    kv.clear();
  }
  return kv;
}

// Resident memory, exact: /proc/self/smaps_rollup's "Rss:" walks the page tables (VmRSS, the
// fallback, is the kernel's per-CPU approximation since Linux 6.2). Read with read(2) into a
// buffer on the stack: an ifstream's heap buffer made the measurement itself touch a heap page
// between two calls (P7's "1M counters" read 128.004 B/counter: one page over the 31,250 pages
// of slots, which smaps shows exactly).
std::uint64_t rss_bytes() {
  auto field = [](const char* path, const char* key) -> std::uint64_t {
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[4096];
    std::size_t len = 0;
    for (ssize_t n; len + 1 < sizeof buf && (n = ::read(fd, buf + len, sizeof buf - 1 - len)) > 0;)
      len += static_cast<std::size_t>(n);
    ::close(fd);
    buf[len] = '\0';
    const std::size_t k = std::strlen(key);
    for (const char* line = buf; *line != '\0';) {
      if (std::strncmp(line, key, k) == 0) return std::strtoull(line + k, nullptr, 10) * 1024;
      const char* nl = std::strchr(line, '\n');
      if (nl == nullptr) break;
      line = nl + 1;
    }
    return 0;
  };
  if (const std::uint64_t r = field("/proc/self/smaps_rollup", "Rss:")) return r;
  return field("/proc/self/status", "VmRSS:");
}

// ---- registry ----

namespace {
std::vector<row_info>& row_list() {
  static std::vector<row_info> rows;
  return rows;
}
std::vector<probe_info>& probe_list() {
  static std::vector<probe_info> probes;
  return probes;
}
/// "P10" after "P9": compare the letter prefix, then the number.
bool natural_less(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    std::size_t i = 0;
    while (i < s.size() && !std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return std::make_pair(s.substr(0, i), i < s.size() ? std::stol(s.substr(i)) : -1L);
  };
  return split(a) < split(b);
}
} // namespace

bool register_row(row_info r) {
  row_list().push_back(r);
  return true;
}

std::vector<row_info> registered_rows() {
  auto rows = row_list();
  std::sort(rows.begin(), rows.end(),
            [](const row_info& a, const row_info& b) { return natural_less(a.id, b.id); });
  return rows;
}

bool register_probe(probe_info p) {
  probe_list().push_back(p);
  return true;
}

const probe_info* find_probe(const std::string& name) {
  for (const auto& p : probe_list())
    if (name == p.name) return &p;
  return nullptr;
}

} // namespace bench
