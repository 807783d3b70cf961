// false_sharing_probe: does a counter 64 bytes away from another one slow it down, compared with
// 128 bytes away? The measurement behind compcntr::false_sharing_range (modules/core/cache_padded.cppm).
//
// Two threads, pinned to CPUs 0 and 1, each do a locked increment (std::atomic fetch_add, seq_cst;
// `lock inc` or `lock xadd`) on their own 8-byte counter. Layouts (byte offsets of the two from a
// 4096-byte aligned base):
//   same-word     0 / 0       one shared counter (true sharing, the worst case)
//   8             0 / 8       same 64-byte line (false sharing)
//   64-in-pair    0 / 64      adjacent lines of ONE 128-byte aligned pair (what an adjacent-line
//                             prefetcher couples)
//   64-across     64 / 128    adjacent lines in two different 128-byte pairs
//   128           0 / 128     the pool's stride
//   256           0 / 256
// Each repetition runs every layout once, in a rotated order (so slow phases of a shared machine
// hit every layout alike); the report is median [min..max] ns per increment per thread.
// Interference only shows while both threads really run at the same time, so a run counts only
// if each thread got >= 90% of its wall time as CPU time (CLOCK_THREAD_CPUTIME_ID); runs that
// were time-sliced with other processes are discarded and repeated (at most 10x the asked
// repetitions), and the report says how many were discarded.
//
// Build and run (not part of the library build; optimised, no sanitizer):
//     clang++-19 -std=c++20 -O2 -pthread tools/false_sharing_probe.cpp -o /tmp/fsp
//     /tmp/fsp [increments_per_thread=20000000] [repetitions=9]
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

namespace {

struct layout {
  const char* name;
  std::size_t a, b; // byte offsets of the two counters
};
constexpr layout layouts[] = {
    {"same-word", 0, 0},    {"8", 0, 8},     {"64-in-pair", 0, 64},
    {"64-across", 64, 128}, {"128", 0, 128}, {"256", 0, 256},
};
constexpr int n_layouts = sizeof layouts / sizeof layouts[0];

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
    std::fprintf(stderr, "cannot pin to CPU %d\n", cpu);
    std::exit(1);
  }
}

double thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// One run: the mean ns per increment over both threads, or a negative value if a thread got
// less than 90% of its wall time on a CPU (the two did not really run concurrently).
double run(char* base, const layout& l, std::uint64_t n) {
  auto* ca = reinterpret_cast<std::atomic<std::uint64_t>*>(base + l.a);
  auto* cb = reinterpret_cast<std::atomic<std::uint64_t>*>(base + l.b);
  ca->store(0);
  cb->store(0);
  std::atomic<int> ready{0};
  double ns[2], busy[2];
  auto body = [&](int id, std::atomic<std::uint64_t>* c) {
    pin(id);
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    const double c0 = thread_cpu_ns();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t i = 0; i < n; ++i) c->fetch_add(1);
    const auto t1 = std::chrono::steady_clock::now();
    const double wall = std::chrono::duration<double, std::nano>(t1 - t0).count();
    ns[id] = wall / static_cast<double>(n);
    busy[id] = (thread_cpu_ns() - c0) / wall;
  };
  std::thread t1(body, 1, cb);
  body(0, ca);
  t1.join();
  const std::uint64_t expect = l.a == l.b ? 2 * n : n;
  if (ca->load() != expect || cb->load() != expect) {
    std::fprintf(stderr, "lost increments in layout %s\n", l.name);
    std::exit(1);
  }
  if (busy[0] < 0.9 || busy[1] < 0.9) return -1;
  return (ns[0] + ns[1]) / 2;
}

} // namespace

int main(int argc, char** argv) {
  const std::uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : 20'000'000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 9;
  char* base = static_cast<char*>(std::aligned_alloc(4096, 4096));
  std::vector<double> results[n_layouts];
  int discarded[n_layouts] = {};
  for (int r = 0; r < 10 * reps; ++r) {
    bool all_done = true;
    for (int k = 0; k < n_layouts; ++k) {
      const int i = (k + r) % n_layouts;
      if (static_cast<int>(results[i].size()) >= reps) continue;
      all_done = false;
      const double v = run(base, layouts[i], n);
      if (v < 0)
        ++discarded[i];
      else
        results[i].push_back(v);
    }
    if (all_done) break;
  }
  std::printf("%-11s %9s %9s %9s %6s  (ns per increment per thread, %llu incs per run)\n", "layout",
              "median", "min", "max", "runs", static_cast<unsigned long long>(n));
  for (int i = 0; i < n_layouts; ++i) {
    auto& v = results[i];
    std::sort(v.begin(), v.end());
    if (v.empty()) {
      std::printf("%-11s   no run with both threads on a CPU (%d discarded)\n", layouts[i].name,
                  discarded[i]);
      continue;
    }
    std::printf("%-11s %9.2f %9.2f %9.2f %3zu/%-3d\n", layouts[i].name, v[v.size() / 2], v.front(),
                v.back(), v.size(), static_cast<int>(v.size()) + discarded[i]);
  }
  std::free(base);
}
