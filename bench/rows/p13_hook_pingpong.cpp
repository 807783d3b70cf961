// P13: counter ping-pong through the hook provider (FI_HOOK=compcntr) on tcp;ofi_rxm and shm.
// Target: <= 1.0x the latency of the same program without the hook.
//
// The program is the fi_rdm_cntr_pingpong pattern (fabtests): two processes, one RDM endpoint
// each on 127.0.0.1 (shm: this host), CQs bound with FI_SELECTIVE_COMPLETION and no operation
// asking for an entry, a send and a receive counter per endpoint; 64-byte messages. Each side
// keeps one receive posted; the client sends and waits for its receive counter to reach i, the
// server waits for i, reposts and replies. Two ways to wait, as applications do:
//   * wait: fi_cntr_wait(rx, i, 10 s);
//   * read: while (fi_cntr_read(rx) < i) {} (polling, each read runs the provider's progress).
// The client is pinned to the first CPU, the server to the second. Result: the one-way latency,
// wall time of a sample / (2 x round trips). Each configuration runs in fresh processes
// (hook_common.hpp): without the hook, and with it (caller progress). The progress thread is
// not a P13 configuration: on a 2-CPU machine two ping-pong processes with a progress thread
// each would oversubscribe the CPUs.

#include <chrono>
#include <cstdint>
#include <cstdio>
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
#endif

namespace {

using bench::hook::config;

#if COMPCNTR_BENCH_HAVE_FABRIC

constexpr std::size_t msg = 64;

struct side {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  fid_cntr* tx = nullptr;
  fid_cntr* rx = nullptr;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  alignas(64) char buf[2][msg];
  fi_context ctx[2];

  ~side() {
    if (ep) fi_close(&ep->fid);
    if (mr) fi_close(&mr->fid);
    if (tx) fi_close(&tx->fid);
    if (rx) fi_close(&rx->fid);
    if (cq) fi_close(&cq->fid);
    if (av) fi_close(&av->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
  }
};

std::string fail(const char* call, int r) { return bench::fi_pair::fail(call, r, fi_strerror); }

// Opens one side; the counters use FI_WAIT_UNSPEC (fi_cntr_wait needs a wait object).
std::string open_side(side& s, const std::string& prov) {
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG;
  hints->mode = FI_CONTEXT;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(prov.c_str());
  const bool ip = prov != "shm";
  int r = fi_getinfo(FI_VERSION(1, 17), ip ? "127.0.0.1" : nullptr, nullptr, ip ? FI_SOURCE : 0,
                     hints, &s.info);
  fi_freeinfo(hints);
  if (r) return s.info = nullptr, fail("fi_getinfo", r);
  if ((r = fi_fabric(s.info->fabric_attr, &s.fabric, nullptr))) return fail("fi_fabric", r);
  if ((r = fi_domain(s.fabric, s.info, &s.domain, nullptr))) return fail("fi_domain", r);
  fi_av_attr aa{};
  aa.type = FI_AV_TABLE;
  if ((r = fi_av_open(s.domain, &aa, &s.av, nullptr))) return fail("fi_av_open", r);
  fi_cq_attr ca{};
  ca.format = FI_CQ_FORMAT_CONTEXT;
  if ((r = fi_cq_open(s.domain, &ca, &s.cq, nullptr))) return fail("fi_cq_open", r);
  if ((r = fi_endpoint(s.domain, s.info, &s.ep, nullptr))) return fail("fi_endpoint", r);
  fi_cntr_attr cn{};
  cn.events = FI_CNTR_EVENTS_COMP;
  cn.wait_obj = FI_WAIT_UNSPEC;
  if ((r = fi_cntr_open(s.domain, &cn, &s.tx, nullptr))) return fail("fi_cntr_open", r);
  if ((r = fi_cntr_open(s.domain, &cn, &s.rx, nullptr))) return fail("fi_cntr_open", r);
  if ((r = fi_ep_bind(s.ep, &s.av->fid, 0))) return fail("fi_ep_bind(av)", r);
  if ((r = fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION)))
    return fail("fi_ep_bind(cq)", r);
  if ((r = fi_ep_bind(s.ep, &s.tx->fid, FI_SEND))) return fail("fi_ep_bind(tx)", r);
  if ((r = fi_ep_bind(s.ep, &s.rx->fid, FI_RECV))) return fail("fi_ep_bind(rx)", r);
  if ((r = fi_enable(s.ep))) return fail("fi_enable", r);
  if ((r = fi_mr_reg(s.domain, s.buf, sizeof s.buf, FI_SEND | FI_RECV, 0, 0, 0, &s.mr, nullptr)))
    return fail("fi_mr_reg", r);
  s.desc = fi_mr_desc(s.mr);
  return {};
}

// The ping-pong loop of one side: `count` round trips starting after `done` earlier ones.
// Returns false on a libfabric error or a 10 s stall.
bool loop(side& s, bool client, bool polling, std::uint64_t done, std::uint64_t count) {
  for (std::uint64_t i = done + 1; i <= done + count; ++i) {
    auto send = [&] {
      ssize_t r;
      while ((r = fi_send(s.ep, s.buf[0], msg, s.desc, s.peer, &s.ctx[0])) == -FI_EAGAIN)
        fi_cntr_read(s.tx);
      return r == 0;
    };
    auto wait_rx = [&] {
      if (!polling) return fi_cntr_wait(s.rx, i, 10'000) == 0;
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (std::uint64_t polls = 1; fi_cntr_read(s.rx) < i; ++polls)
        if (polls % 4096 == 0 && std::chrono::steady_clock::now() > end) return false;
      return true;
    };
    auto repost = [&] {
      ssize_t r;
      while ((r = fi_recv(s.ep, s.buf[1], msg, s.desc, FI_ADDR_UNSPEC, &s.ctx[1])) == -FI_EAGAIN)
        fi_cntr_read(s.rx);
      return r == 0;
    };
    if (client) {
      if (!send() || !wait_rx() || !repost()) return false;
    } else {
      if (!wait_rx() || !repost() || !send()) return false;
    }
  }
  return true;
}

/// argv: provider, wait|read, round trips per sample, samples. Prints served, n, s0.. (ns one-way).
int probe(const std::vector<std::string>& args) {
  if (args.size() < 4) return std::printf("error=usage: provider wait|read iters samples\n"), 2;
  const std::string prov = args[0];
  const bool polling = args[1] == "read";
  const std::uint64_t iters = std::stoull(args[2]);
  const int samples = std::stoi(args[3]);
  const std::uint64_t warm = iters / 4 + 10;
  bench::fi_pair::process pp;
  if (const char* e = pp.start()) return std::printf("error=%s\n", e), 1;
  const bool client = pp.client;
  int status = 0;
  {
    side s;
    std::string why = open_side(s, prov);
    bench::fi_pair::hello<bench::fi_pair::nothing> mine, theirs;
    bool ok = bench::fi_pair::meet(pp, s.ep, s.av, &s.peer, mine, theirs, why, prov);
    ok = pp.handshake(ok && fi_recv(s.ep, s.buf[1], msg, s.desc, FI_ADDR_UNSPEC, &s.ctx[1]) == 0);
    std::uint64_t done = 0;
    const auto out = bench::fi_pair::sample(
        [&](std::uint64_t n) {
          const bool r = loop(s, client, polling, done, n);
          done += n;
          return r;
        },
        warm, iters, samples, 2.0 * static_cast<double>(iters), ok);
    // Both sides finish before either closes (a closed peer could stall the other's last reply).
    status = bench::fi_pair::end_rounds(
        pp, ok, iters, why, "the ping-pong stalled or failed", out,
        [&] { std::printf("served=%d\n", compcntr_fi_cntr_comp_cntr(s.rx) != nullptr ? 1 : 0); });
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
  if (bench::allowed_cpus().size() < 2) {
    for (const char* prov : {"tcp;ofi_rxm", "shm"})
      ctx.add(
          bench::compare("P13", std::string("counter ping-pong (") + prov + ")",
                         bench::result::unavailable("hook", "needs 2 CPUs", "ns one-way"),
                         bench::result::unavailable("libfabric", "needs 2 CPUs", "ns one-way")));
    return;
  }
  const int rounds = ctx.opt.smoke ? 1 : 3;
  const int samples = ctx.opt.smoke ? 1 : 3;
  for (const std::string prov : {"tcp;ofi_rxm", "shm"}) {
    // About 0.1-0.5 s per sample on an idle 2-CPU VM (tcp ~15-30 us, shm ~1-5 us one-way).
    const std::uint64_t iters = ctx.opt.smoke ? 50 : (prov == "shm" ? 20'000 : 1'000);
    for (const std::string mode : {"wait", "read"}) {
      const std::vector<config> cs = {config::plain, config::hook};
      const std::string what = mode == "wait" ? "fi_cntr_wait" : "fi_cntr_read polling";
      std::vector<std::string> names;
      for (config c : cs)
        names.push_back("ping-pong 64 B, " + what + " (" + prov + ", " +
                        bench::hook::config_name(c) + ")");
      auto r = bench::hook::collect(ctx, cs, names, "p13-pingpong",
                                    {prov, mode, std::to_string(iters), std::to_string(samples)},
                                    rounds, "ns one-way");
      ctx.add(bench::compare("P13",
                             "counter ping-pong, " + what + " (" + prov + "): hook vs libfabric",
                             r[1], r[0], bench::goal::ratio_at_most, 1.0));
    }
  }
}

} // namespace

COMPCNTR_BENCH_ROW("P13", "counter ping-pong through the hook provider, vs libfabric alone", run);
COMPCNTR_BENCH_PROBE("p13-pingpong", probe);
