// P20: an OpenSHMEM runtime's puts through the hook provider (FI_HOOK=compcntr) on tcp;ofi_rxm
// over 127.0.0.1, without the runtime (issue 23: Sandia OpenSHMEM 1.5.3's OFI transport).
// Targets: latency lines <= 1.05x the same program without the hook; bandwidth >= 0.95x.
//
// Each process opens what SOS opens per PE (docs/hook.md, "Real runtimes"): one domain asking
// for FI_RMA | FI_ATOMIC, FI_PROGRESS_AUTO, FI_THREAD_DOMAIN, FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
// FI_MR_PROV_KEY and default transmit flags FI_DELIVERY_COMPLETE; a *context* endpoint with a
// put counter (FI_WAIT_UNSPEC) bound FI_WRITE, a get counter bound FI_READ and a CQ bound
// FI_SELECTIVE_COMPLETION | FI_TRANSMIT | FI_RECV; a *target* endpoint (no transmit flags) with
// its own CQ and the registered "symmetric heap" (FI_REMOTE_READ | FI_REMOTE_WRITE); one AV
// holding the peer's target endpoint. A put of a scalar is fi_inject_write from the context
// endpoint to the peer's target endpoint (SOS's put_scalar; -FI_EAGAIN is retried after an
// fi_cq_read of the context CQ, as SOS drains its CQ), a larger put is fi_write (SOS's
// put_large), and shmem_quiet is fi_cntr_wait(put counter, puts issued, -1) (SOS's poll limit
// is 0: nothing else; untimed, the probe's alarm() bounds a stall). Nobody reads the target
// endpoint's CQ: with automatic progress rxm's own thread lands the data. Three patterns, the
// client pinned to the first CPU, the server to the second (mpiexec's binding of two PEs):
//   * put + quiet: shmem_int_p + shmem_quiet in a loop (SOS's shmem_latency_put_perf's
//     "shmem_int_p" part: issue 23's 1.11x); the time per put. With a burst of 32 puts per quiet
//     too (info): the time per put.
//   * ping-pong: the client puts i into the server's flag word and quiets, then polls its own
//     flag word until it holds i; the server polls, then puts i back and quiets. One-way time
//     (a round trip / 2, as SOS's perf tests print it).
//   * bandwidth: 16 fi_writes of 64 KiB, then quiet; ns per 64 KiB (the ratio is the rate's).
// While the client streams, the server polls a flag word of its heap for the end (as a PE
// waiting in a barrier spins on memory), and the client's last put sets it. Each configuration
// runs in fresh processes (hook_common.hpp): without the hook, with it (caller progress), with
// its progress thread (=always: the probe pins; information only, docs/hook.md says why).
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../harness.hpp"
#include "fi_process_pair.hpp"
#include "hook_common.hpp"

#if COMPCNTR_BENCH_HAVE_FABRIC
#include <compcntr/fabric.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#endif

namespace {

using bench::hook::config;

#if COMPCNTR_BENCH_HAVE_FABRIC

constexpr std::size_t k_big = 64 * 1024; // bandwidth: bytes per fi_write
constexpr int k_window = 16; // bandwidth: writes per quiet
constexpr int k_burst = 32; // put + quiet, burst line: puts per quiet
constexpr std::size_t k_data = 4096; // heap offset of the data area (flag words before it)
constexpr std::size_t k_heap = k_data + k_big * k_window;
constexpr std::uint64_t k_done = ~std::uint64_t{0}; // the server's flag word: stop
constexpr unsigned ctx_alarm_s = 300; // a probe's whole life (about 1-3 s)

struct side {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cntr* put = nullptr;
  fid_cntr* get = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr; // the context endpoint
  fid_cq* tcq = nullptr;
  fid_ep* tep = nullptr; // the target endpoint
  fid_mr* mr = nullptr; // the heap
  fid_mr* smr = nullptr; // the source of large puts
  void* sdesc = nullptr;
  char* heap = nullptr;
  char* src = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  std::uint64_t peer_base = 0, peer_key = 0;
  std::uint64_t issued = 0; // puts issued (SOS's pending_put_cntr)

  ~side() {
    if (ep) fi_close(&ep->fid);
    if (tep) fi_close(&tep->fid);
    if (mr) fi_close(&mr->fid);
    if (smr) fi_close(&smr->fid);
    if (put) fi_close(&put->fid);
    if (get) fi_close(&get->fid);
    if (cq) fi_close(&cq->fid);
    if (tcq) fi_close(&tcq->fid);
    if (av) fi_close(&av->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
    std::free(heap);
    std::free(src);
  }
};

struct target {
  std::uint64_t base = 0, key = 0;
};

std::string fail(const char* call, int r) { return bench::fi_pair::fail(call, r, fi_strerror); }

std::string open_side(side& s, const std::string& prov) {
  s.heap = static_cast<char*>(std::aligned_alloc(4096, k_heap));
  s.src = static_cast<char*>(std::aligned_alloc(4096, k_big));
  if (!s.heap || !s.src) return "out of memory";
  std::memset(s.heap, 0, k_heap);
  std::memset(s.src, 1, k_big);
  fi_info* hints = fi_allocinfo();
  hints->caps = FI_RMA | FI_ATOMIC;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->data_progress = FI_PROGRESS_AUTO;
  hints->domain_attr->resource_mgmt = FI_RM_ENABLED;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->mr_key_size = 1;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->tx_attr->inject_size = 16;
  hints->fabric_attr->prov_name = strdup(prov.c_str());
  int r = fi_getinfo(FI_VERSION(1, 5), "127.0.0.1", nullptr, FI_SOURCE, hints, &s.info);
  fi_freeinfo(hints);
  if (r) return s.info = nullptr, fail("fi_getinfo", r);
  if ((r = fi_fabric(s.info->fabric_attr, &s.fabric, nullptr))) return fail("fi_fabric", r);
  if ((r = fi_domain(s.fabric, s.info, &s.domain, nullptr))) return fail("fi_domain", r);
  fi_av_attr aa{};
  aa.type = FI_AV_TABLE;
  if ((r = fi_av_open(s.domain, &aa, &s.av, nullptr))) return fail("fi_av_open", r);

  // The target endpoint (SOS's target_ep_init): remote access, no transmit flags, a CQ.
  fi_info* ti = fi_dupinfo(s.info);
  if (!ti) return "fi_dupinfo failed";
  ti->caps = FI_RMA | FI_ATOMIC | FI_REMOTE_READ | FI_REMOTE_WRITE;
  ti->tx_attr->op_flags = 0;
  ti->mode = 0;
  ti->tx_attr->mode = 0;
  ti->rx_attr->mode = 0;
  ti->tx_attr->caps = FI_RMA | FI_ATOMIC;
  ti->rx_attr->caps = ti->caps;
  r = fi_endpoint(s.domain, ti, &s.tep, nullptr);
  fi_freeinfo(ti);
  if (r) return fail("fi_endpoint(target)", r);
  if ((r = fi_ep_bind(s.tep, &s.av->fid, 0))) return fail("fi_ep_bind(target, av)", r);
  fi_cq_attr tca{};
  if ((r = fi_cq_open(s.domain, &tca, &s.tcq, nullptr))) return fail("fi_cq_open(target)", r);
  if ((r = fi_ep_bind(s.tep, &s.tcq->fid, FI_TRANSMIT | FI_RECV)))
    return fail("fi_ep_bind(target, cq)", r);
  if ((r = fi_enable(s.tep))) return fail("fi_enable(target)", r);
  if ((r = fi_mr_reg(s.domain, s.heap, k_heap, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &s.mr,
                     nullptr)))
    return fail("fi_mr_reg(heap)", r);

  // The context endpoint (SOS's ctx_init + bind_enable_ep_resources).
  fi_cntr_attr ca{};
  ca.events = FI_CNTR_EVENTS_COMP;
  ca.wait_obj = FI_WAIT_UNSPEC;
  if ((r = fi_cntr_open(s.domain, &ca, &s.put, nullptr))) return fail("fi_cntr_open(put)", r);
  if ((r = fi_cntr_open(s.domain, &ca, &s.get, nullptr))) return fail("fi_cntr_open(get)", r);
  fi_cq_attr cqa{};
  cqa.format = FI_CQ_FORMAT_CONTEXT;
  if ((r = fi_cq_open(s.domain, &cqa, &s.cq, nullptr))) return fail("fi_cq_open", r);
  s.info->caps = FI_RMA | FI_WRITE | FI_READ | FI_ATOMIC | FI_RECV;
  s.info->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  s.info->mode = 0;
  s.info->tx_attr->mode = 0;
  s.info->rx_attr->mode = 0;
  s.info->tx_attr->caps = s.info->caps;
  s.info->rx_attr->caps = FI_RECV;
  if ((r = fi_endpoint(s.domain, s.info, &s.ep, nullptr))) return fail("fi_endpoint", r);
  if ((r = fi_ep_bind(s.ep, &s.put->fid, FI_WRITE))) return fail("fi_ep_bind(put)", r);
  if ((r = fi_ep_bind(s.ep, &s.get->fid, FI_READ))) return fail("fi_ep_bind(get)", r);
  if ((r = fi_ep_bind(s.ep, &s.cq->fid, FI_SELECTIVE_COMPLETION | FI_TRANSMIT | FI_RECV)))
    return fail("fi_ep_bind(cq)", r);
  if ((r = fi_ep_bind(s.ep, &s.av->fid, 0))) return fail("fi_ep_bind(av)", r);
  if ((r = fi_enable(s.ep))) return fail("fi_enable", r);
  // Key 1: a provider without FI_MR_PROV_KEY takes the requested keys (SOS: heap and data
  // differ).
  if ((r = fi_mr_reg(s.domain, s.src, k_big, FI_WRITE | FI_READ, 0, 1, 0, &s.smr, nullptr)))
    return fail("fi_mr_reg(source)", r);
  s.sdesc = fi_mr_desc(s.smr);
  return {};
}

using clock_type = std::chrono::steady_clock;

std::string g_err; // what failed first (the client's "error=" line)
bool failed(const char* call, ssize_t r) {
  if (g_err.empty()) g_err = fail(call, static_cast<int>(r));
  return false;
}

// -FI_EAGAIN: drive the context endpoint through its CQ (SOS's try_again drains it), for up to
// 10 s.
template <class Post>
bool post(side& s, Post p) {
  ssize_t r = p();
  if (r == 0) return true;
  const auto end = clock_type::now() + std::chrono::seconds(10);
  fi_cq_entry e;
  while (r == -FI_EAGAIN) {
    fi_cq_read(s.cq, &e, 1);
    if (clock_type::now() > end) return failed("post: -FI_EAGAIN for 10 s", r);
    r = p();
  }
  return r == 0 || failed("post", r);
}

// shmem_int_p / shmem_long_p of `v` at the peer's heap offset `off`.
bool put_scalar(side& s, std::size_t off, std::uint64_t v) {
  ++s.issued;
  return post(s, [&] {
    return fi_inject_write(s.ep, &v, sizeof v, s.peer, s.peer_base + off, s.peer_key);
  });
}

// SOS's put_large: one fi_write of `n` bytes (the endpoint's FI_DELIVERY_COMPLETE applies).
bool put_large(side& s, std::size_t off, std::size_t n) {
  ++s.issued;
  return post(s, [&] {
    return fi_write(s.ep, s.src, n, s.sdesc, s.peer, s.peer_base + off, s.peer_key, nullptr);
  });
}

// shmem_quiet (poll limit 0): wait for the put counter to reach the puts issued.
// Untimed, as SOS's: libfabric's util wait then reads no clock (a timed one reads it once per
// call, ~0.1 us here, 1% of a put + quiet). The probe's alarm() bounds a stall instead.
bool quiet(side& s) {
  const int r = fi_cntr_wait(s.put, s.issued, -1);
  return r == 0 || failed("fi_cntr_wait(put)", r);
}

std::uint64_t flag(const side& s) {
  return __atomic_load_n(reinterpret_cast<const std::uint64_t*>(s.heap), __ATOMIC_ACQUIRE);
}

// shmem_wait_until(flag, >=, v) of SOS with automatic progress: poll memory, pause between polls.
bool wait_flag(const side& s, std::uint64_t v) {
  const auto end = clock_type::now() + std::chrono::seconds(10);
  for (std::uint64_t polls = 1; flag(s) < v; ++polls) {
    __builtin_ia32_pause();
    if (polls % 4096 == 0 && clock_type::now() > end) {
      if (g_err.empty()) g_err = "no answer in memory for 10 s";
      return false;
    }
  }
  return true;
}

/// argv: provider, put|burst|pingpong|bw, iterations per sample, samples. Prints served, n,
/// s0.. (ns per put / one-way / per write).
int probe(const std::vector<std::string>& args) {
  if (args.size() < 4) return std::printf("error=usage: provider mode iters samples\n"), 2;
  const std::string prov = args[0], mode = args[1];
  const std::uint64_t iters = std::stoull(args[2]);
  const int samples = std::stoi(args[3]);
  const std::uint64_t warm = iters / 4 + 10;
  bench::fi_pair::process pp;
  if (const char* e = pp.start()) return std::printf("error=%s\n", e), 1;
  const bool client = pp.client;
  // A stalled quiet (untimed) ends the probe, reported as failed by the row: never a hang. Both
  // processes (an alarm is not inherited across fork).
  alarm(ctx_alarm_s);
  int status = 0;
  {
    side s;
    std::string why = open_side(s, prov);
    bench::fi_pair::hello<target> mine, theirs;
    if (why.empty()) {
      // Remote addresses are virtual with FI_MR_VIRT_ADDR, offsets into the region without it
      // (tcp;ofi_rxm clears every mr_mode bit asked for).
      if (s.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
        mine.extra.base = reinterpret_cast<std::uintptr_t>(s.heap);
      mine.extra.key = fi_mr_key(s.mr);
    }
    bool ok = bench::fi_pair::meet(pp, s.tep, s.av, &s.peer, mine, theirs, why, prov);
    s.peer_base = theirs.extra.base;
    s.peer_key = theirs.extra.key;
    ok = pp.handshake(ok);
    double per = 1;
    std::uint64_t round = 0; // ping-pong rounds so far
    auto client_run = [&](std::uint64_t n) -> bool {
      if (mode == "put") {
        for (std::uint64_t i = 0; i < n; ++i)
          if (!put_scalar(s, k_data + 8 * (i % 64), i) || !quiet(s)) return false;
      } else if (mode == "burst") {
        for (std::uint64_t i = 0; i < n; ++i) {
          for (int k = 0; k < k_burst; ++k)
            if (!put_scalar(s, k_data + 8 * static_cast<std::size_t>(k), i)) return false;
          if (!quiet(s)) return false;
        }
      } else if (mode == "bw") {
        for (std::uint64_t i = 0; i < n; ++i) {
          for (int k = 0; k < k_window; ++k)
            if (!put_large(s, k_data + k_big * static_cast<std::size_t>(k), k_big)) return false;
          if (!quiet(s)) return false;
        }
      } else { // pingpong
        for (std::uint64_t i = 0; i < n; ++i) {
          ++round;
          if (!put_scalar(s, 0, round) || !quiet(s) || !wait_flag(s, round)) return false;
        }
      }
      return true;
    };
    if (mode == "burst") per = k_burst;
    if (mode == "bw") per = k_window;
    if (mode == "pingpong") per = 2;
    std::vector<double> out;
    if (client) {
      out = bench::fi_pair::sample(client_run, warm, iters, samples,
                                   per * static_cast<double>(iters), ok);
      // The server's end: its flag word (after a ping-pong it holds the last round).
      if (ok) ok = put_scalar(s, 0, k_done) && quiet(s);
    } else if (ok) {
      if (mode == "pingpong") {
        const std::uint64_t total = warm + iters * static_cast<std::uint64_t>(samples);
        for (std::uint64_t i = 1; ok && i <= total; ++i)
          ok = wait_flag(s, i) && put_scalar(s, 0, i) && quiet(s);
      }
      // The client's samples may take long on a loaded machine: wait up to 10 s per sample.
      for (int k = 0; ok && flag(s) != k_done && k < samples + 2; ++k) wait_flag(s, k_done);
      ok = ok && flag(s) == k_done;
      if (!ok && why.empty()) why = "the server saw no end";
    }
    if (why.empty()) why = g_err;
    status = bench::fi_pair::end_rounds(
        pp, ok, iters, why, "the pattern stalled or failed", out,
        [&] { std::printf("served=%d\n", compcntr_fi_cntr_comp_cntr(s.put) != nullptr ? 1 : 0); });
  }
  return pp.finish(status);
}

#else
int probe(const std::vector<std::string>&) {
  std::printf("error=built without libfabric\n");
  return 1;
}
#endif

void run(bench::context& ctx) {
  const std::string prov = "tcp;ofi_rxm";
  struct line {
    const char* mode;
    const char* what;
    std::uint64_t iters; // per sample: ~0.1-0.3 s on an idle 2-CPU VM
    const char* unit;
    bench::goal g;
    double target;
  };
  const line lines[] = {
      {"put", "shmem_int_p + quiet: fi_inject_write 8 B + fi_cntr_wait(put)", 10'000, "ns/put",
       bench::goal::ratio_at_most, 1.05},
      {"burst", "32 x fi_inject_write 8 B + fi_cntr_wait(put)", 500, "ns/put", bench::goal::info,
       0},
      {"pingpong", "ping-pong: put + quiet each way, the peer polls memory", 1'000, "ns one-way",
       bench::goal::ratio_at_most, 1.05},
      {"bw", "bandwidth: 16 x fi_write 64 KiB + fi_cntr_wait(put)", 100, "ns/64 KiB",
       bench::goal::speedup_at_least, 0.95},
  };
  if (bench::allowed_cpus().size() < 2) {
    for (const line& l : lines)
      ctx.add(bench::compare("P20", std::string(l.what) + " (" + prov + ")",
                             bench::result::unavailable("hook", "needs 2 CPUs", l.unit),
                             bench::result::unavailable("libfabric", "needs 2 CPUs", l.unit)));
    return;
  }
  const int rounds = ctx.opt.smoke ? 1 : 3;
  const int samples = ctx.opt.smoke ? 2 : 3; // smoke: --smoke's 2 reps (bench_smoke)
  for (const line& l : lines) {
    const std::vector<config> cs = {config::plain, config::hook, config::thread};
    std::vector<std::string> names;
    for (config c : cs)
      names.push_back(std::string(l.what) + " (" + prov + ", " + bench::hook::config_name(c) + ")");
    const std::uint64_t iters = ctx.opt.smoke ? 20 : l.iters;
    auto r = bench::hook::collect(ctx, cs, names, "p20-shmem",
                                  {prov, l.mode, std::to_string(iters), std::to_string(samples)},
                                  rounds, l.unit);
    const std::string m = std::string(l.what) + " (" + prov + ")";
    const char* note = l.g == bench::goal::speedup_at_least
                           ? "ratio = rate with the hook / rate without (time per write inverted)"
                           : "";
    ctx.add(bench::compare("P20", m + ": hook vs libfabric", r[1], r[0], l.g, l.target, note));
    ctx.add(bench::compare("P20", m + ": progress thread vs libfabric", r[2], r[0],
                           bench::goal::info, 0));
  }
}

} // namespace

COMPCNTR_BENCH_ROW("P20", "an OpenSHMEM runtime's puts through the hook provider (SOS's pattern)",
                   run);
COMPCNTR_BENCH_PROBE("p20-shmem", probe);
