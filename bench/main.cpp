// compcntr_bench: the performance targets (bench/README.md lists them), measured side by side
// with their references in one run. See bench/README.md for how to run and read it.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fabric.hpp"
#include "harness.hpp"
#include "output.hpp"

#ifndef COMPCNTR_BENCH_DEFAULT_OUT
#define COMPCNTR_BENCH_DEFAULT_OUT "bench-results"
#endif

namespace {

void usage(std::FILE* f) {
  std::fprintf(
      f, "usage: compcntr_bench [options]\n"
         "  --rows P1,P3     run only these rows (default: all; see --list)\n"
         "  --reps N         samples per measured variant (default 21; the median is reported)\n"
         "  --sample-ms X    target length of one sample in ms (default 25)\n"
         "  --out DIR        write DIR/compcntr_bench.json and DIR/compcntr_bench.svg\n"
         "                   (default " COMPCNTR_BENCH_DEFAULT_OUT ")\n"
         "  --no-out         write no files\n"
         "  --smoke          every row tiny (reps 2, 1 ms samples, small counts): checks that the\n"
         "                   program works; its numbers mean nothing\n"
         "  --no-pin         do not pin threads to CPUs\n"
         "  --list           list the rows and exit\n");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const auto end = std::min(s.find(sep, start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool make_dirs(const std::string& dir) {
  std::string cur;
  for (const auto& part : split(dir, '/')) {
    cur += (cur.empty() && dir[0] != '/') ? part : "/" + part;
    if (mkdir(cur.c_str(), 0777) != 0 && errno != EEXIST) return false;
  }
  return true;
}

std::string self_path(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) return std::string(buf, static_cast<std::size_t>(n));
  return argv0;
}

} // namespace

int main(int argc, char** argv) {
  bench::options opt;
  opt.out = COMPCNTR_BENCH_DEFAULT_OUT;
  opt.self = self_path(argv[0]);
  bool reps_given = false, sample_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "compcntr_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--probe") {  // internal: a row's measurement in a fresh process
      const std::string name = value();
      const auto* p = bench::find_probe(name);
      if (!p) return std::fprintf(stderr, "compcntr_bench: no probe '%s'\n", name.c_str()), 2;
      return p->run(std::vector<std::string>(argv + i + 1, argv + argc));
    } else if (a == "--rows") {
      opt.rows = split(value(), ',');
    } else if (a == "--reps") {
      opt.reps = std::atoi(value().c_str());
      reps_given = true;
      if (opt.reps < 1) return std::fprintf(stderr, "compcntr_bench: --reps must be >= 1\n"), 2;
    } else if (a == "--sample-ms") {
      opt.sample_ms = std::atof(value().c_str());
      sample_given = true;
      if (!(opt.sample_ms > 0))
        return std::fprintf(stderr, "compcntr_bench: --sample-ms must be > 0\n"), 2;
    } else if (a == "--out") {
      opt.out = value();
    } else if (a == "--no-out") {
      opt.out.clear();
    } else if (a == "--smoke") {
      opt.smoke = true;
    } else if (a == "--no-pin") {
      opt.pin = false;
    } else if (a == "--list") {
      for (const auto& r : bench::registered_rows()) std::printf("%-4s %s\n", r.id, r.title);
      return 0;
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "compcntr_bench: unknown option '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (opt.smoke) {
    if (!reps_given) opt.reps = 2;
    if (!sample_given) opt.sample_ms = 1;
  }

  std::vector<bench::row_info> rows;
  for (const auto& r : bench::registered_rows())
    if (opt.rows.empty() || std::find(opt.rows.begin(), opt.rows.end(), r.id) != opt.rows.end())
      rows.push_back(r);
  for (const auto& want : opt.rows)
    if (std::none_of(rows.begin(), rows.end(), [&](const auto& r) { return want == r.id; }))
      return std::fprintf(stderr, "compcntr_bench: no row '%s' (see --list)\n", want.c_str()), 2;

  bench::run_info info = bench::collect_run_info(opt);
  bench::pin_to(opt, 0);  // single-thread rows run on the first allowed CPU
  bench::context ctx(opt);
  const auto t0 = bench::steady::now();
  for (const auto& r : rows) {
    std::fprintf(stderr, "compcntr_bench: %s %s ...\n", r.id, r.title);
    r.run(ctx);
  }
  bench::fabric::close_all();
  info.seconds = bench::ns_since(t0) / 1e9;
  info.loadavg_end = [] {
    std::FILE* f = std::fopen("/proc/loadavg", "r");
    char buf[128] = {};
    if (f) {
      if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
      std::fclose(f);
    }
    std::string s = buf;
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }();
  for (auto& c : ctx.lines) bench::judge(c);

  std::printf("\n");
  bench::print_table(stdout, info, ctx.lines);
  if (!opt.out.empty()) {
    if (!make_dirs(opt.out))
      return std::fprintf(stderr, "compcntr_bench: cannot create %s: %s\n", opt.out.c_str(),
                          std::strerror(errno)),
             1;
    const std::string json = opt.out + "/compcntr_bench.json",
                      svg = opt.out + "/compcntr_bench.svg";
    if (!bench::write_json(json, info, ctx.lines) || !bench::write_svg(svg, info, ctx.lines))
      return std::fprintf(stderr, "compcntr_bench: cannot write into %s\n", opt.out.c_str()), 1;
    std::printf("wrote %s and %s\n", json.c_str(), svg.c_str());
  }
  return 0;
}
