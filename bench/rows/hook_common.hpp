// P13/P14 (the hook provider, FI_HOOK=compcntr): what both rows share. Not a row.
//
// The hook is process-wide (libfabric reads FI_HOOK once, when it initialises), so each
// configuration runs in a fresh process: this program's probe, started with the environment of
// the configuration -- without the hook (libfabric alone), with it (caller progress), with it
// and its progress thread. The rows alternate the configurations (plain, hook, thread, plain,
// ...) so drift of the shared machine hits all alike, and pool each configuration's samples.
#pragma once

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "../harness.hpp"

#ifndef COMPCNTR_BENCH_HOOK_DIR
#define COMPCNTR_BENCH_HOOK_DIR ""
#endif

namespace bench::hook {

enum class config { plain, hook, thread };

inline const char* config_name(config c) {
  switch (c) {
    case config::plain: return "libfabric alone";
    case config::hook: return "hook, caller progress";
    case config::thread: return "hook, progress thread";
  }
  return "?";
}

/// Runs probe `name` in a fresh process with the environment of `c`. Sets why on failure.
inline std::map<std::string, std::string> run(const context& ctx, config c, const std::string& name,
                                              const std::vector<std::string>& args,
                                              std::string& why) {
  const std::string dir = COMPCNTR_BENCH_HOOK_DIR;
  if (c != config::plain && dir.empty()) {
    why = "built without the hook provider";
    return {};
  }
  // The child inherits this process's environment; libfabric in this process read its own long
  // ago, so changing it here affects only the child.
  if (c == config::plain) {
    unsetenv("FI_HOOK");
  } else {
    setenv("FI_HOOK", "compcntr", 1);
    setenv("FI_PROVIDER_PATH", dir.c_str(), 1);
  }
  if (c == config::thread)
    setenv("COMPCNTR_FI_PROGRESS_THREAD", "always", 1);  // the probe pins itself: "1" declines
  else
    unsetenv("COMPCNTR_FI_PROGRESS_THREAD");
  auto kv = ctx.run_probe(name, args, why);
  unsetenv("FI_HOOK");
  unsetenv("FI_PROVIDER_PATH");
  unsetenv("COMPCNTR_FI_PROGRESS_THREAD");
  if (!kv.empty() && c != config::plain && kv["served"] != "1") {
    why = "the hook did not serve the probe's counters (served=" + kv["served"] + ")";
    kv.clear();
  }
  if (!kv.empty() && c == config::plain && kv["served"] != "0") {
    why = "compcntr served a counter without the hook";
    kv.clear();
  }
  return kv;
}

/// The "s0=", "s1=", ... samples of a probe's output.
inline std::vector<double> samples(const std::map<std::string, std::string>& kv) {
  std::vector<double> v;
  for (int i = 0;; ++i) {
    auto it = kv.find("s" + std::to_string(i));
    if (it == kv.end()) break;
    v.push_back(std::stod(it->second));
  }
  return v;
}

/// Collects `rounds` probe runs per configuration, alternating, into one result each.
inline std::vector<result> collect(const context& ctx, const std::vector<config>& cs,
                                   const std::vector<std::string>& names, const std::string& probe,
                                   const std::vector<std::string>& args, int rounds,
                                   const std::string& unit) {
  std::vector<std::vector<double>> all(cs.size());
  std::vector<result> out(cs.size());
  for (std::size_t k = 0; k < cs.size(); ++k) {
    out[k].name = names[k];
    out[k].unit = unit;
  }
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < cs.size(); ++k) {
      if (!out[k].available) continue;
      std::string why;
      auto kv = run(ctx, cs[k], probe, args, why);
      if (kv.empty()) {
        out[k] = result::unavailable(names[k], why, unit);
        continue;
      }
      for (double s : samples(kv)) all[k].push_back(s);
      for (auto& [key, val] : kv)
        if (key.empty() || key[0] != 's' ||
            key.find_first_not_of("0123456789", 1) != std::string::npos)
          out[k].notes[key] = val;
      if (auto it = kv.find("n"); it != kv.end()) out[k].n = std::stoull(it->second);
    }
  for (std::size_t k = 0; k < cs.size(); ++k)
    if (out[k].available) out[k].st = summarize(all[k]);
  return out;
}

} // namespace bench::hook
