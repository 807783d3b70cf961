// The compcntr hook machinery shared by the hook provider (main.cpp) and the layered provider
// ofi_compcntr (../ofi/): the settings read from the environment, the statistics line, and the
// records of the fabrics and domains it was installed on. The installation itself is one unit
// per libfabric class (fabric.cpp, domain.cpp, ep.cpp, ep_data.cpp, mr.cpp, poll.cpp), counters
// are hook_cntr.cpp, the optional progress thread progress.cpp (hook.hpp: the design).
#include "hook.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <fcntl.h>
#include <sched.h>
#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>

namespace compcntr_hook {
namespace {

// ---- settings --------------------------------------------------------------------------------

config g_cfg;

bool env_true(const char* name) noexcept {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  return !(std::strcmp(v, "0") == 0 || strcasecmp(v, "no") == 0 || strcasecmp(v, "false") == 0 ||
           strcasecmp(v, "off") == 0);
}

std::int64_t env_int(const char* name, std::int64_t dflt, std::int64_t lo,
                     std::int64_t hi) noexcept {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    FI_WARN(&self(), FI_LOG_CORE, "%s=%s ignored (an integer %" PRId64 "..%" PRId64 " expected)\n",
            name, v, lo, hi);
    return dflt;
  }
  return x;
}

// Whether this process may run on exactly one CPU of the several the machine has online (a
// launcher pinned it: mpiexec binds each rank to a core by default for up to 2 ranks).
bool pinned_to_one_cpu() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return false;
  return CPU_COUNT(&set) == 1 && sysconf(_SC_NPROCESSORS_ONLN) > 1;
}

} // namespace

void read_config() noexcept {
  g_cfg.progress_thread = env_true("COMPCNTR_FI_PROGRESS_THREAD");
  // Caller progress chosen automatically where the thread loses (docs/hook.md, "Progress
  // thread"): with the process pinned to one CPU, SOS's latencies on 2 CPUs were 1.35x
  // (ping-pong) and 1.3-1.5x (shmem_int_p + shmem_quiet) with the thread against 1.0-1.1x hooked
  // without it (issue 23).
  if (const char* v = std::getenv("COMPCNTR_FI_PROGRESS_THREAD");
      g_cfg.progress_thread && strcasecmp(v, "always") != 0 && pinned_to_one_cpu()) {
    g_cfg.progress_thread = false;
    g_cfg.progress_thread_declined = true;
    FI_INFO(&self(), FI_LOG_CORE,
            "COMPCNTR_FI_PROGRESS_THREAD=%s declined: the process is pinned to one CPU "
            "(caller progress; =always starts the thread anyway)\n",
            std::getenv("COMPCNTR_FI_PROGRESS_THREAD"));
  }
  g_cfg.wait_spin_ns = env_int("COMPCNTR_FI_WAIT_SPIN_US", 100, 0, 10'000'000) * 1000;
  g_cfg.fd_wait_spin_ns = std::getenv("COMPCNTR_FI_WAIT_SPIN_US") ? g_cfg.wait_spin_ns : 0;
  g_cfg.progress_idle_us =
      static_cast<std::uint32_t>(env_int("COMPCNTR_FI_PROGRESS_IDLE_US", 1000, 1, 1'000'000));
  if (const char* p = std::getenv(module().stats_env)) {
    try {
      g_cfg.stats_path = p;
    } catch (...) {
    }
  }
}

namespace {

// ---- statistics ------------------------------------------------------------------------------

statistics g_stats;
std::atomic<bool> g_stats_written{false};

// ---- fabric / domain records ------------------------------------------------------------------

std::mutex g_objects_mu;
std::unordered_map<fid_fabric*, std::unique_ptr<fabric_state>>& fabrics() noexcept {
  static auto* m = new std::unordered_map<fid_fabric*, std::unique_ptr<fabric_state>>; // never
  return *m; // destroyed: libfabric's destructor may close objects after ours ran
}
std::unordered_map<fid_domain*, std::unique_ptr<domain_state>>& domains() noexcept {
  static auto* m = new std::unordered_map<fid_domain*, std::unique_ptr<domain_state>>;
  return *m;
}
std::string g_providers; // "tcp;ofi_rxm,shm": every provider hooked (under g_objects_mu)

// libfabric may never call cleanup (a process that never initialised it, an exit path that
// skips destructors of libfabric first): the stats line is then written here.
struct at_unload {
  ~at_unload() {
    progress_thread_stop();
    write_stats();
  }
} g_at_unload;

} // namespace

const config& cfg() noexcept { return g_cfg; }
statistics& stats() noexcept { return g_stats; }

void write_stats() noexcept {
  if (g_cfg.stats_path.empty() || g_stats_written.exchange(true)) return;
  std::uint64_t reads = g_stats.reads.load(), readerrs = g_stats.readerrs.load(),
                waits = g_stats.waits.load();
  const bool live_counted = sum_live_counts(reads, readerrs, waits);
  std::string provs;
  {
    std::lock_guard lk(g_objects_mu);
    try {
      provs = g_providers.empty() ? "-" : g_providers;
    } catch (...) {
    }
  }
  char line[1024];
  const int n = std::snprintf(
      line, sizeof line,
      "%s pid=%d fabrics=%" PRIu64 " domains=%" PRIu64 " cntr_open=%" PRIu64 " cntr_served=%" PRIu64
      " cntr_bound=%" PRIu64 " cntr_reads=%" PRIu64 " cntr_readerrs=%" PRIu64 " cntr_waits=%" PRIu64
      " cntr_closed=%" PRIu64 " cntr_open_refused=%" PRIu64 " trywaits=%" PRIu64
      " triggers_translated=%" PRIu64 " work_translated=%" PRIu64
      " progress_thread=%s providers=%s%s\n",
      module().stats_prefix, static_cast<int>(getpid()), g_stats.fabrics.load(),
      g_stats.domains.load(), g_stats.cntr_open.load(), g_stats.cntr_served.load(),
      g_stats.cntr_bound.load(), reads, readerrs, waits, g_stats.cntr_closed.load(),
      g_stats.cntr_open_refused.load(), g_stats.trywaits.load(), g_stats.triggers_translated.load(),
      g_stats.work_translated.load(),
      g_cfg.progress_thread ? "1" : (g_cfg.progress_thread_declined ? "pinned" : "0"),
      provs.c_str(), live_counted ? "" : " live_counts=skipped");
  if (n <= 0) return;
  // One write(2) of the whole line with O_APPEND: lines of concurrent processes never interleave.
  const int fd = ::open(g_cfg.stats_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "%s: cannot open %s=%s: %s\n", module().stats_prefix, module().stats_env,
                 g_cfg.stats_path.c_str(), std::strerror(errno));
    return;
  }
  const std::size_t len =
      static_cast<std::size_t>(n) < sizeof line ? static_cast<std::size_t>(n) : sizeof line - 1;
  if (::write(fd, line, len) < 0)
    std::fprintf(stderr, "%s: cannot write %s: %s\n", module().stats_prefix,
                 g_cfg.stats_path.c_str(), std::strerror(errno));
  ::close(fd);
}

compcntr_device* device() noexcept {
  // Opened once, kept for the life of the process (counters may be closed after any static
  // destructor of ours ran).
  static compcntr_device* dev = [] {
    compcntr_device* d = compcntr_open_device("soft");
    if (d == nullptr)
      FI_WARN(&self(), FI_LOG_CNTR, "compcntr_open_device(soft): %s\n",
              compcntr_last_error_message());
    return d;
  }();
  return dev;
}

fabric_state* find_fabric(fid_fabric* f) noexcept {
  std::lock_guard lk(g_objects_mu);
  auto it = fabrics().find(f);
  return it == fabrics().end() ? nullptr : it->second.get();
}

domain_state* find_domain(fid_domain* d) noexcept {
  std::lock_guard lk(g_objects_mu);
  auto it = domains().find(d);
  return it == domains().end() ? nullptr : it->second.get();
}

bool add_fabric(std::unique_ptr<fabric_state> fs) noexcept {
  std::lock_guard lk(g_objects_mu);
  try {
    if (g_providers.find(fs->prov_name) == std::string::npos)
      g_providers += (g_providers.empty() ? "" : ",") + fs->prov_name;
    fid_fabric* f = fs->fabric;
    fabrics()[f] = std::move(fs);
  } catch (...) {
    return false;
  }
  return true;
}
void forget_fabric(fid_fabric* f) noexcept {
  std::lock_guard lk(g_objects_mu);
  fabrics().erase(f);
}
bool add_domain(std::unique_ptr<domain_state> ds) noexcept {
  std::lock_guard lk(g_objects_mu);
  try {
    fid_domain* d = ds->domain;
    domains()[d] = std::move(ds);
  } catch (...) {
    return false;
  }
  return true;
}
void forget_domain(fid_domain* d) noexcept {
  std::lock_guard lk(g_objects_mu);
  domains().erase(d);
}

} // namespace compcntr_hook
