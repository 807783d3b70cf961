// P13/P17: the two-process scaffolding of a libfabric probe (not a row). The probe forks before
// any libfabric call (each process initialises its own libfabric and providers), the parent is
// the client, pinned to the first allowed CPU, the child the server on the second; the two talk
// over a socketpair for what a real job's launcher would exchange (endpoint names, MR keys) and
// for the handshakes that keep either side from closing while the other still needs it.
//
//   bench::fi_pair::process p;
//   if (const char* e = p.start()) return std::printf("error=%s\n", e), 1;
//   { ... open, p.exchange(...), p.handshake(ok), rounds ..., p.handshake(ok) ...
//     if (p.client) { print what the row reads } }
//   return p.finish(status);
#pragma once

#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../harness.hpp"

#if COMPCNTR_BENCH_HAVE_FABRIC
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#endif

namespace bench::fi_pair {

/// "call: the provider's message" for a libfabric return code (either sign).
inline std::string fail(const char* call, int r, const char* (*strerror_fn)(int)) {
  return std::string(call) + ": " + strerror_fn(r < 0 ? -r : r);
}

class process {
 public:
  bool client = false;
  int fd = -1;

  /// Forks and pins. nullptr, or what failed (the probe's "error=" line).
  const char* start() {
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) return "socketpair";
    std::fflush(stdout);
    pid_ = fork();
    if (pid_ < 0) return "fork";
    client = pid_ != 0;
    fd = client ? sp[0] : sp[1];
    close(client ? sp[1] : sp[0]);
    const auto& cpus = bench::allowed_cpus();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[static_cast<std::size_t>(client ? 0 : 1) % cpus.size()], &set);
    sched_setaffinity(0, sizeof set, &set);
    return nullptr;
  }

  /// Sends `n` bytes of `out` and receives `n` bytes into `in` (both sides call it alike).
  bool exchange(const void* out, void* in, std::size_t n) const {
    return xfer(const_cast<void*>(out), n, true) && xfer(in, n, false);
  }

  /// Both sides say whether they are fine; true when both are.
  bool handshake(bool ok) const {
    char go = ok ? 1 : 0, peer = 0;
    return exchange(&go, &peer, 1) && ok && peer != 0;
  }

  /// Ends the probe: the server exits with `status`; the client reaps it and returns the
  /// probe's exit code (non-zero if either failed).
  int finish(int status) {
    close(fd);
    if (!client) _exit(status);
    int cs = 0;
    waitpid(pid_, &cs, 0);
    std::fflush(stdout);
    return status != 0 ? status : (WIFEXITED(cs) && WEXITSTATUS(cs) == 0 ? 0 : 1);
  }

  /// The client's sample lines ("s0=...", read by hook_common.hpp's samples()).
  static void print_samples(const std::vector<double>& v) {
    for (std::size_t k = 0; k < v.size(); ++k) std::printf("s%zu=%.2f\n", k, v[k]);
  }

 private:
  bool xfer(void* p, std::size_t n, bool out) const {
    auto* c = static_cast<char*>(p);
    while (n) {
      const ssize_t k = out ? write(fd, c, n) : read(fd, c, n);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<std::size_t>(k);
    }
    return true;
  }
  pid_t pid_ = -1;
};

/// Times `samples` samples of `iters` rounds after `warm` rounds: run(n) runs n rounds (false:
/// failed or stalled, which ends it with ok = false). Each sample is its wall time in ns divided
/// by `per_sample`.
template <class Run>
std::vector<double> sample(Run run, std::uint64_t warm, std::uint64_t iters, int samples,
                           double per_sample, bool& ok) {
  std::vector<double> out;
  if (ok) ok = run(warm);
  for (int k = 0; ok && k < samples; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    ok = run(iters);
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    out.push_back(ns / per_sample);
  }
  return out;
}

/// The client's last lines: the samples, or "error=" with `why` (or `stalled` when empty).
inline int report(bool both_ok, const std::string& why, const char* stalled,
                  const std::vector<double>& samples) {
  if (!both_ok) {
    std::printf("error=%s\n", why.empty() ? stalled : why.c_str());
    return 1;
  }
  process::print_samples(samples);
  return 0;
}

/// The end of a probe's rounds, both sides: they say whether they are fine (neither closes while
/// the other still needs it); the client prints its own lines (`client_lines()`), "n=" and
/// report()'s; the status to pass to process::finish.
template <class Lines>
int end_rounds(const process& pp, bool ok, std::uint64_t n, const std::string& why,
               const char* stalled, const std::vector<double>& samples, Lines client_lines) {
  const bool both = pp.handshake(ok);
  if (!pp.client) return ok ? 0 : 1;
  client_lines();
  std::printf("n=%llu\n", static_cast<unsigned long long>(n));
  return report(both, why, stalled, samples);
}

#if COMPCNTR_BENCH_HAVE_FABRIC
/// What the two sides exchange first: the endpoint's name (len 0: this side failed) and `Extra`
/// (e.g. an RMA target).
template <class Extra>
struct hello {
  std::uint64_t len = 0;
  char name[256] = {};
  Extra extra{};
};
struct nothing {};

/// Exchanges hellos (`mine.name` filled from `ep` here when `why` is empty) and inserts the
/// peer into `av`. false with `why` set when either side failed.
template <class Extra>
bool meet(const process& pp, fid_ep* ep, fid_av* av, fi_addr_t* peer, hello<Extra>& mine,
          hello<Extra>& theirs, std::string& why, const std::string& prov) {
  if (why.empty()) {
    std::size_t len = sizeof mine.name;
    if (const int r = fi_getname(&ep->fid, mine.name, &len))
      why = fail("fi_getname", r, fi_strerror);
    else
      mine.len = len;
  }
  if (!pp.exchange(&mine, &theirs, sizeof mine) || !mine.len || !theirs.len) {
    if (why.empty()) why = "the peer failed to open " + prov;
    return false;
  }
  if (fi_av_insert(av, theirs.name, 1, peer, 0, nullptr) != 1) {
    why = "fi_av_insert failed";
    return false;
  }
  return true;
}
#endif

} // namespace bench::fi_pair
