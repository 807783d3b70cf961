// compcntr_bench output: the printed table, the JSON file and the SVG plot.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "harness.hpp"

namespace bench {

/// Facts about one run, printed above the table and stored in the JSON.
struct run_info {
  std::string program = "compcntr_bench";
  std::string version;      ///< compcntr version (meson project version)
  std::string build;        ///< meson buildtype and optimisation level
  std::string compiler;
  std::string date;         ///< UTC, ISO 8601
  std::string host;
  std::string cpu_model;
  std::string kernel;
  std::vector<int> cpus;    ///< allowed CPUs (threads are pinned to the first two)
  std::string loadavg_start, loadavg_end;  ///< /proc/loadavg: how busy the shared machine was
  double seconds = 0;       ///< wall time of the whole run
  options opt;
};

run_info collect_run_info(const options& opt);
void print_table(std::FILE* f, const run_info& info, const std::vector<check>& lines);
bool write_json(const std::string& path, const run_info& info, const std::vector<check>& lines);
bool write_svg(const std::string& path, const run_info& info, const std::vector<check>& lines);

} // namespace bench
