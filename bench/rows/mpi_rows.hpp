// The MPI rows' common part (P15, P19): run bench/runtime/compcntr_runtime_bench through mpirun
// with 2 ranks on this host and turn its "sample <name> <values...>" and "info key=value" lines
// into table results.
#ifndef COMPCNTR_BENCH_ROWS_MPI_ROWS_HPP
#define COMPCNTR_BENCH_ROWS_MPI_ROWS_HPP

#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../harness.hpp"

namespace bench::mpi_rows {

struct mpi_run {
  std::map<std::string, std::vector<double>> samples;
  std::map<std::string, std::string> info;
  std::string why; ///< non-empty: the run failed, and how
};

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

#if defined(COMPCNTR_BENCH_RUNTIME_PROG) && !defined(COMPCNTR_BENCH_SANITIZED)
// Runs the MPI program through mpirun with `mpi_args` before -np and `args` after the program,
// with this thread's CPU affinity widened to every allowed CPU first (the bench pins itself to
// one CPU; the ranks would inherit that).
inline mpi_run run_mpi(const std::vector<std::string>& mpi_args,
                       const std::vector<std::string>& args) {
  mpi_run out;
  std::string cmd = quote(COMPCNTR_BENCH_MPIRUN);
  if (::geteuid() == 0) cmd += " --allow-run-as-root";
  cmd += " --oversubscribe --bind-to none";
  for (const auto& a : mpi_args) cmd += " " + quote(a);
  cmd += " -np 2 " + quote(COMPCNTR_BENCH_RUNTIME_PROG);
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " 2>&1";
  cpu_set_t saved, all;
  ::sched_getaffinity(0, sizeof saved, &saved);
  CPU_ZERO(&all);
  for (int c : bench::allowed_cpus()) CPU_SET(c, &all);
  ::sched_setaffinity(0, sizeof all, &all);
  ::setenv("OMPI_MCA_btl_base_warn_component_unused", "0", 1);
  std::FILE* p = ::popen(cmd.c_str(), "r");
  std::string text;
  if (p) {
    char line[8192];
    while (std::fgets(line, sizeof line, p)) {
      text += line;
      std::istringstream in(line);
      std::string kind, name;
      in >> kind >> name;
      if (kind == "sample") {
        double v;
        while (in >> v) out.samples[name].push_back(v);
      } else if (kind == "info") {
        const auto eq = name.find('=');
        if (eq != std::string::npos) out.info[name.substr(0, eq)] = name.substr(eq + 1);
      }
    }
  }
  const int st = p ? ::pclose(p) : -1;
  ::sched_setaffinity(0, sizeof saved, &saved);
  if (st != 0) {
    // The program's own words, shortened: what failed and where.
    std::string tail = text.size() > 600 ? text.substr(text.size() - 600) : text;
    for (char& c : tail)
      if (c == '\n') c = ' ';
    out.why = "mpirun exited with status " + std::to_string(st) + ": " + tail;
  }
  return out;
}
#endif

inline bench::result make(const mpi_run& r, const std::string& key, const std::string& name,
                          const std::string& unit, std::uint64_t n, const std::string& clock,
                          std::size_t reps) {
  if (!r.why.empty()) return bench::result::unavailable(name, r.why, unit);
  auto it = r.samples.find(key);
  if (it == r.samples.end() || it->second.size() != reps)
    return bench::result::unavailable(
        name, "the MPI program printed no (or too few) '" + key + "' samples", unit);
  bench::result x;
  x.name = name;
  x.unit = unit;
  x.n = n;
  x.st = bench::summarize(it->second);
  x.notes["clock"] = clock;
  for (const auto& [k, v] : r.info) x.notes[k] = v;
  return x;
}

} // namespace bench::mpi_rows

#endif
