// compcntr_bench output: table, JSON, SVG (see output.hpp).
#include "output.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <sstream>

#ifndef COMPCNTR_BENCH_VERSION
#define COMPCNTR_BENCH_VERSION "unknown"
#endif
#ifndef COMPCNTR_BENCH_BUILD
#define COMPCNTR_BENCH_BUILD "unknown"
#endif

namespace bench {

namespace {

std::string first_line_of(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0)
      if (auto c = line.find(':'); c != std::string::npos) return line.substr(c + 2);
  return "unknown";
}

std::string num(double v, int prec = 4) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", prec, v);
  return buf;
}

/// A value with 3 significant digits but no exponent for the usual ranges.
std::string human(double v) {
  char buf[64];
  // Above 100: an integer prints as one, anything else with one decimal (128.2 B/counter must
  // not print as the 128 B target it fails).
  if (v >= 100 && std::fabs(v - std::round(v)) < 0.0005)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (v >= 100)
    std::snprintf(buf, sizeof buf, "%.1f", v);
  else if (v >= 10)
    std::snprintf(buf, sizeof buf, "%.1f", v);
  else if (v >= 1)
    std::snprintf(buf, sizeof buf, "%.2f", v);
  else
    std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

/// "median unit ±spread%" where spread = (max - min) / 2 / median.
std::string cell(const result& r) {
  if (r.name.empty()) return "-";
  if (!r.available) return "unavailable";
  std::string s = human(r.st.median) + " " + r.unit;
  if (r.st.samples.size() > 1 && r.st.median > 0) {
    const double spread = (r.st.max - r.st.min) / 2 / r.st.median * 100;
    s += " ±" + (spread < 10 ? num(spread, 2) : human(spread)) + "%";
  }
  return s;
}

std::string ratio_cell(const check& c) {
  if (c.ratio_kind.empty()) return "-";
  std::string s = human(c.ratio) + " " + c.ratio_kind;
  if (c.ratio_min != c.ratio_max) s += " [" + human(c.ratio_min) + "-" + human(c.ratio_max) + "]";
  return s;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (ch < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          o += buf;
        } else {
          o += static_cast<char>(ch);
        }
    }
  }
  return o + "\"";
}

std::string xml(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

void json_result(std::ostream& o, const result& r) {
  if (r.name.empty()) {
    o << "null";
    return;
  }
  o << "{\"name\": " << json_str(r.name) << ", \"unit\": " << json_str(r.unit)
    << ", \"available\": " << (r.available ? "true" : "false");
  if (!r.available) o << ", \"why\": " << json_str(r.why);
  if (r.available) {
    o << ", \"n_per_sample\": " << r.n << ", \"median\": " << num(r.st.median, 6)
      << ", \"q1\": " << num(r.st.q1, 6) << ", \"q3\": " << num(r.st.q3, 6)
      << ", \"min\": " << num(r.st.min, 6) << ", \"max\": " << num(r.st.max, 6)
      << ", \"samples\": [";
    for (std::size_t i = 0; i < r.st.samples.size(); ++i)
      o << (i ? ", " : "") << num(r.st.samples[i], 6);
    o << "]";
  }
  if (!r.notes.empty()) {
    o << ", \"notes\": {";
    bool first = true;
    for (const auto& [k, v] : r.notes) {
      o << (first ? "" : ", ") << json_str(k) << ": " << json_str(v);
      first = false;
    }
    o << "}";
  }
  o << "}";
}

} // namespace

run_info collect_run_info(const options& opt) {
  run_info info;
  info.version = COMPCNTR_BENCH_VERSION;
  info.build = COMPCNTR_BENCH_BUILD;
#ifdef __clang_version__
  info.compiler = std::string("clang ") + __clang_version__;
#else
  info.compiler = __VERSION__;
#endif
  char buf[64];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  info.date = buf;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  info.host = host;
  info.cpu_model = cpu_model();
  utsname u{};
  if (uname(&u) == 0) info.kernel = std::string(u.sysname) + " " + u.release;
  info.cpus = allowed_cpus();
  info.loadavg_start = first_line_of("/proc/loadavg");
  info.opt = opt;
  return info;
}

void print_table(std::FILE* f, const run_info& info, const std::vector<check>& lines) {
  std::fprintf(f, "compcntr_bench %s (%s) on %s, %zu CPU(s), %s\n", info.version.c_str(),
               info.build.c_str(), info.cpu_model.c_str(), info.cpus.size(), info.date.c_str());
  std::fprintf(f,
               "median of %d samples of ~%g ms each, ± = half the min-max spread; "
               "load average at start: %s\n\n",
               info.opt.reps, info.opt.sample_ms, info.loadavg_start.c_str());
  const char* hdr = "%-4s %-50s %-22s %-22s %-26s %-13s %s\n";
  std::fprintf(f, hdr, "row", "measure", "compcntr", "reference", "ratio [paired range]", "target",
               "result");
  for (const auto& c : lines)
    std::fprintf(f, hdr, c.row.c_str(), c.measure.c_str(), cell(c.cc).c_str(), cell(c.ref).c_str(),
                 ratio_cell(c).c_str(), c.target_text.c_str(), c.verdict.c_str());
  bool any = false;
  for (const auto& c : lines) {
    for (const result* r : {&c.cc, &c.ref}) {
      if (r->name.empty() || r->available) continue;
      if (!any) std::fprintf(f, "\n");
      any = true;
      std::fprintf(f, "%s: %s unavailable: %s\n", c.row.c_str(), r->name.c_str(), r->why.c_str());
    }
    if (!c.note.empty()) {
      if (!any) std::fprintf(f, "\n");
      any = true;
      std::fprintf(f, "%s: %s\n", c.row.c_str(), c.note.c_str());
    }
  }
  int pass = 0, fail = 0;
  for (const auto& c : lines) {
    pass += c.verdict == "PASS";
    fail += c.verdict == "FAIL";
  }
  std::fprintf(f, "\n%d PASS, %d FAIL (%.1f s; load average at end: %s)\n", pass, fail,
               info.seconds, info.loadavg_end.c_str());
}

bool write_json(const std::string& path, const run_info& info, const std::vector<check>& lines) {
  std::ostringstream o;
  o << "{\n  \"program\": " << json_str(info.program)
    << ",\n  \"version\": " << json_str(info.version) << ",\n  \"build\": " << json_str(info.build)
    << ",\n  \"compiler\": " << json_str(info.compiler) << ",\n  \"date\": " << json_str(info.date)
    << ",\n  \"machine\": {\"host\": " << json_str(info.host)
    << ", \"cpu\": " << json_str(info.cpu_model) << ", \"kernel\": " << json_str(info.kernel)
    << ", \"cpus\": [";
  for (std::size_t i = 0; i < info.cpus.size(); ++i) o << (i ? ", " : "") << info.cpus[i];
  o << "], \"loadavg_start\": " << json_str(info.loadavg_start)
    << ", \"loadavg_end\": " << json_str(info.loadavg_end)
    << "},\n  \"options\": {\"reps\": " << info.opt.reps
    << ", \"sample_ms\": " << num(info.opt.sample_ms)
    << ", \"smoke\": " << (info.opt.smoke ? "true" : "false")
    << ", \"pin\": " << (info.opt.pin ? "true" : "false")
    << "},\n  \"seconds\": " << num(info.seconds) << ",\n  \"lines\": [";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& c = lines[i];
    o << (i ? ",\n" : "\n") << "    {\"row\": " << json_str(c.row)
      << ", \"measure\": " << json_str(c.measure) << ",\n     \"compcntr\": ";
    json_result(o, c.cc);
    o << ",\n     \"reference\": ";
    json_result(o, c.ref);
    o << ",\n     \"ratio\": " << (c.ratio_kind.empty() ? "null" : num(c.ratio, 6))
      << ", \"ratio_kind\": " << json_str(c.ratio_kind)
      << ", \"ratio_min\": " << (c.ratio_kind.empty() ? "null" : num(c.ratio_min, 6))
      << ", \"ratio_max\": " << (c.ratio_kind.empty() ? "null" : num(c.ratio_max, 6))
      << ", \"target\": " << json_str(c.target_text) << ", \"verdict\": " << json_str(c.verdict);
    if (!c.note.empty()) o << ", \"note\": " << json_str(c.note);
    o << "}";
  }
  o << "\n  ]\n}\n";
  std::ofstream f(path);
  f << o.str();
  return static_cast<bool>(f);
}

bool write_svg(const std::string& path, const run_info& info, const std::vector<check>& lines) {
  // Layout: label | log-scale bars (compcntr blue, reference grey, whiskers = min..max) | verdict.
  constexpr double label_w = 390, plot_w = 470, verdict_w = 320, line_h = 36, top = 78;
  const double width = label_w + plot_w + verdict_w + 20;
  const double height = top + line_h * static_cast<double>(lines.size()) + 40;
  // The value compcntr's median must not exceed for the line to pass (drawn as a red tick).
  auto threshold = [](const check& c) -> double {
    if (c.verdict != "PASS" && c.verdict != "FAIL") return 0;
    switch (c.g) {
      case goal::ratio_at_most: return c.ref.st.median * c.target;
      case goal::speedup_at_least:
      case goal::speedup_above: return c.ref.st.median / c.target;
      case goal::value_at_most: return c.target;
      case goal::info: return 0;
    }
    return 0;
  };
  double lo = 1e300, hi = 0;
  for (const auto& c : lines) {
    for (const result* r : {&c.cc, &c.ref})
      if (!r->name.empty() && r->available && r->st.max > 0) {
        lo = std::min(lo, r->st.min);
        hi = std::max(hi, r->st.max);
      }
    if (const double t = threshold(c); t > 0) lo = std::min(lo, t), hi = std::max(hi, t);
  }
  if (hi == 0) lo = 1, hi = 10;
  const double dlo = std::floor(std::log10(lo)), dhi = std::max(dlo + 1, std::ceil(std::log10(hi)));
  auto x = [&](double v) {
    return label_w + plot_w * (std::log10(std::max(v, std::pow(10.0, dlo))) - dlo) / (dhi - dlo);
  };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">compcntr_bench "
    << xml(info.version)
    << ": compcntr (blue) vs reference (grey), log scale, whiskers = min..max</text>\n"
    << "<text x=\"10\" y=\"38\">"
    << xml(info.date + ", " + info.cpu_model + ", " + std::to_string(info.cpus.size()) +
           " CPU(s), " + info.build + ", median of " + std::to_string(info.opt.reps) +
           " samples, load avg at start " + info.loadavg_start)
    << "</text>\n";
  for (double d = dlo; d <= dhi; d += 1) {
    const double gx = x(std::pow(10.0, d));
    o << "<line x1=\"" << gx << "\" y1=\"" << top - 8 << "\" x2=\"" << gx << "\" y2=\""
      << height - 30 << "\" stroke=\"#ddd\"/>\n<text x=\"" << gx << "\" y=\"" << top - 12
      << "\" text-anchor=\"middle\" fill=\"#555\">" << num(std::pow(10.0, d)) << "</text>\n";
  }
  o << "<text x=\"" << label_w + plot_w + 24 << "\" y=\"" << top - 12
    << "\" fill=\"#555\">ratio [paired range], target, result</text>\n";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& c = lines[i];
    const double y = top + line_h * static_cast<double>(i);
    if (i % 2)
      o << "<rect x=\"0\" y=\"" << y << "\" width=\"" << width << "\" height=\"" << line_h
        << "\" fill=\"#f6f6f6\"/>\n";
    o << "<text x=\"10\" y=\"" << y + 22 << "\"><tspan font-weight=\"bold\">" << xml(c.row)
      << "</tspan> " << xml(c.measure) << "</text>\n";
    int k = 0;
    for (const result* r : {&c.cc, &c.ref}) {
      const double by = y + 5 + 13 * k++;
      if (r->name.empty()) continue;
      const char* fill = r == &c.cc ? "#3b6fb6" : "#9a9a9a";
      if (!r->available) {
        o << "<text x=\"" << label_w + 4 << "\" y=\"" << by + 10
          << "\" fill=\"#999\" font-size=\"10\">" << xml(r->name + ": unavailable") << "</text>\n";
        continue;
      }
      const double bx = x(r->st.median);
      o << "<rect x=\"" << label_w << "\" y=\"" << by << "\" width=\""
        << std::max(1.0, bx - label_w) << "\" height=\"11\" fill=\"" << fill << "\"><title>"
        << xml(r->name + ": " + cell(*r)) << "</title></rect>\n";
      const double x0 = x(r->st.min), x1 = x(r->st.max);
      o << "<line x1=\"" << x0 << "\" y1=\"" << by + 5.5 << "\" x2=\"" << x1 << "\" y2=\""
        << by + 5.5 << "\" stroke=\"black\"/>\n<line x1=\"" << x0 << "\" y1=\"" << by + 2
        << "\" x2=\"" << x0 << "\" y2=\"" << by + 9 << "\" stroke=\"black\"/>\n<line x1=\"" << x1
        << "\" y1=\"" << by + 2 << "\" x2=\"" << x1 << "\" y2=\"" << by + 9
        << "\" stroke=\"black\"/>\n";
      const std::string label = human(r->st.median) + " " + r->unit;
      if (x1 + 80 < label_w + plot_w) // right of the whisker, else inside the bar's left end
        o << "<text x=\"" << x1 + 4 << "\" y=\"" << by + 10 << "\" font-size=\"10\">" << xml(label)
          << "</text>\n";
      else
        o << "<text x=\"" << label_w + 4 << "\" y=\"" << by + 9.5
          << "\" font-size=\"10\" fill=\"white\">" << xml(label) << "</text>\n";
    }
    if (const double t = threshold(c); t > 0) {
      const double tx = x(t);
      o << "<line x1=\"" << tx << "\" y1=\"" << y + 2 << "\" x2=\"" << tx << "\" y2=\"" << y + 18
        << "\" stroke=\"#cf222e\" stroke-width=\"2\"><title>target: compcntr at most "
        << xml(human(t) + " " + c.cc.unit) << "</title></line>\n";
    }
    const char* color = c.verdict == "PASS" ? "#1a7f37" : c.verdict == "FAIL" ? "#cf222e" : "#777";
    const std::string rc = ratio_cell(c);
    o << "<text x=\"" << label_w + plot_w + 24 << "\" y=\"" << y + 22 << "\">"
      << xml((rc == "-" ? "" : rc + "  ") + (c.target_text == "-" ? "" : c.target_text))
      << " <tspan font-weight=\"bold\" fill=\"" << color << "\">" << xml(c.verdict)
      << "</tspan></text>\n";
  }
  o << "<text x=\"10\" y=\"" << height - 12
    << "\" fill=\"#555\" font-size=\"11\">units per line: "
       "as labelled (ns per operation, B per counter); red tick: where compcntr's median must "
       "stay left of to pass; ratio cc/ref: lower is better, ref/cc: higher is "
       "better</text>\n</svg>\n";
  std::ofstream f(path);
  f << o.str();
  return static_cast<bool>(f);
}

} // namespace bench
