// P17: ofi_compcntr (the layered provider, docs/ofi_compcntr.md) on tcp;ofi_rxm.
// Targets: (b) a triggered RMA write through the layer <= 1.1x the application waiting on the
// counter and posting the write itself (on tcp;ofi_rxm alone); (c) a plain ping-pong of a
// program that asks for FI_TRIGGER but sends plainly, through the layer, <= 1.05x the same
// program on the provider below. sockets' own triggers: an information line.
//
// Two processes (fork, as P13), one RDM endpoint each on 127.0.0.1, client pinned to the first
// CPU, server to the second; names, MR keys and addresses exchanged over a socketpair.
//   (b) round i: the server sends an 8-byte message; the client's receive counter reaches i;
//       an 8-byte RMA write of i lands in the server's buffer, which the server polls (each
//       poll a fi_cntr_read of its counter: tcp's progress). Then the client reposts its
//       receive and the server sends message i + 1.
//         * triggered: the write was armed before (fi_writemsg with FI_TRIGGER, threshold i on
//           the receive counter); the client polls fi_cntr_read(rx) until i, and the read that
//           sees i also runs the layer's round, which posts the write.
//         * by hand (the reference): the client polls fi_cntr_read(rx) until i, then fi_write.
//       Result: ns per round trip (a message and a write).
//   (c) the fi_rdm_pingpong pattern: 64-byte fi_send / fi_recv, completions read by polling
//       fi_cq_read; the client sends and waits for its send and receive entries, the server
//       waits for its receive, reposts and replies. Result: ns one-way.
// The layer is loaded by FI_PROVIDER_PATH=<its build dir> in the probe's process only.

#include <atomic>
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
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_trigger.h>
#endif

#ifndef COMPCNTR_BENCH_OFI_DIR
#define COMPCNTR_BENCH_OFI_DIR ""
#endif

namespace {

#if COMPCNTR_BENCH_HAVE_FABRIC

constexpr std::size_t msg = 64;
constexpr std::uint64_t k_requested_key =
    0x17; // the key asked for where keys are not the provider's

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
  // [0] send, [1] receive, [2] the write's source, [3] the write's target (remote access)
  alignas(64) char buf[4][msg];
  fi_context ctx[2];
  fi_triggered_context tctx;
  std::uint64_t sends = 0, recvs = 0; ///< (c): completions seen

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

// counters: the (b) form (selective CQ, counters); otherwise (c): CQ entries for everything.
std::string open_side(side& s, const std::string& prov, std::uint64_t caps, bool counters) {
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = caps;
  hints->mode = FI_CONTEXT;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(prov.c_str());
  int r = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, FI_SOURCE, hints, &s.info);
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
  if ((r = fi_ep_bind(s.ep, &s.av->fid, 0))) return fail("fi_ep_bind(av)", r);
  const std::uint64_t sel = counters ? FI_SELECTIVE_COMPLETION : 0;
  if ((r = fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV | sel)))
    return fail("fi_ep_bind(cq)", r);
  if (counters) {
    fi_cntr_attr cn{};
    cn.events = FI_CNTR_EVENTS_COMP;
    cn.wait_obj = FI_WAIT_UNSPEC;
    if ((r = fi_cntr_open(s.domain, &cn, &s.tx, nullptr))) return fail("fi_cntr_open", r);
    if ((r = fi_cntr_open(s.domain, &cn, &s.rx, nullptr))) return fail("fi_cntr_open", r);
    if ((r = fi_ep_bind(s.ep, &s.tx->fid, FI_SEND | FI_WRITE))) return fail("fi_ep_bind(tx)", r);
    if ((r = fi_ep_bind(s.ep, &s.rx->fid, FI_RECV))) return fail("fi_ep_bind(rx)", r);
  }
  if ((r = fi_enable(s.ep))) return fail("fi_enable", r);
  const std::uint64_t access = FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE;
  if ((r = fi_mr_reg(s.domain, s.buf, sizeof s.buf, access, 0, k_requested_key, 0, &s.mr, nullptr)))
    return fail("fi_mr_reg", r);
  s.desc = fi_mr_desc(s.mr);
  return {};
}

struct remote {
  std::uint64_t addr = 0; ///< the peer's write target as this side addresses it
  std::uint64_t key = 0;
};

enum class mode { triggered, by_hand, pingpong };

using clk = std::chrono::steady_clock;
constexpr auto stall = std::chrono::seconds(10);

// One round of progress: a counter read ((b)), or a CQ read whose entries are counted ((c)).
void drive(side& s) {
  if (s.rx) {
    fi_cntr_read(s.rx);
    return;
  }
  fi_cq_entry e[4];
  const ssize_t r = fi_cq_read(s.cq, e, 4);
  for (ssize_t k = 0; k < r; ++k) (e[k].op_context == &s.ctx[0] ? s.sends : s.recvs) += 1;
}

template <class F>
bool post(side& s, F f) {
  ssize_t r;
  const auto end = clk::now() + stall;
  while ((r = f()) == -FI_EAGAIN) {
    drive(s);
    if (clk::now() > end) return false;
  }
  return r == 0;
}

bool recv(side& s) {
  return post(s, [&] { return fi_recv(s.ep, s.buf[1], msg, s.desc, FI_ADDR_UNSPEC, &s.ctx[1]); });
}

// The write's source for round i, holding i: two slots by parity, so arming round i + 1 never
// rewrites the bytes of write i, which may still be in flight (round i + 2 is armed only after
// the server saw write i land and sent message i + 1).
char* source(side& s, std::uint64_t i) {
  char* p = s.buf[2] + (i % 2) * sizeof i;
  std::memcpy(p, &i, sizeof i);
  return p;
}

bool arm_write(side& s, const remote& peer, std::uint64_t i) {
  s.tctx.event_type = FI_TRIGGER_THRESHOLD;
  s.tctx.trigger.threshold.cntr = s.rx;
  s.tctx.trigger.threshold.threshold = i;
  iovec iov{source(s, i), sizeof i};
  fi_rma_iov riov{peer.addr, sizeof i, peer.key};
  fi_msg_rma m{&iov, &s.desc, 1, s.peer, &riov, 1, &s.tctx, 0};
  return post(s, [&] { return fi_writemsg(s.ep, &m, FI_TRIGGER); });
}

// (b), one side, rounds done+1 .. done+count.
bool rounds_b(side& s, const remote& peer, bool client, mode m, std::uint64_t done,
              std::uint64_t count) {
  for (std::uint64_t i = done + 1; i <= done + count; ++i) {
    const auto end = clk::now() + stall;
    if (client) {
      if (m == mode::triggered && !arm_write(s, peer, i)) return false;
      for (std::uint64_t polls = 1; fi_cntr_read(s.rx) < i; ++polls)
        if (polls % 4096 == 0 && clk::now() > end) return false;
      if (m == mode::by_hand) {
        char* src = source(s, i);
        if (!post(s, [&] {
              return fi_write(s.ep, src, sizeof i, s.desc, s.peer, peer.addr, peer.key, &s.ctx[0]);
            }))
          return false;
      }
      if (!recv(s)) return false;
    } else {
      std::memcpy(s.buf[0], &i, sizeof i);
      if (!post(s, [&] { return fi_send(s.ep, s.buf[0], sizeof i, s.desc, s.peer, &s.ctx[0]); }))
        return false;
      std::atomic_ref<std::uint64_t> landed(*reinterpret_cast<std::uint64_t*>(s.buf[3]));
      for (std::uint64_t polls = 1; landed.load(std::memory_order_acquire) != i; ++polls) {
        fi_cntr_read(s.rx); // tcp's progress: the write lands inside it
        if (polls % 4096 == 0 && clk::now() > end) return false;
      }
    }
  }
  return true;
}

// (c): reads completion entries until `sends` sends and `recvs` receives completed in all
// (told apart by their contexts; errors end it).
bool reap(side& s, std::uint64_t sends, std::uint64_t recvs) {
  const auto end = clk::now() + stall;
  fi_cq_entry e[4];
  for (std::uint64_t polls = 1; s.sends < sends || s.recvs < recvs; ++polls) {
    const ssize_t r = fi_cq_read(s.cq, e, 4);
    for (ssize_t k = 0; k < r; ++k) (e[k].op_context == &s.ctx[0] ? s.sends : s.recvs) += 1;
    if (r < 0 && r != -FI_EAGAIN) return false;
    if (polls % 4096 == 0 && clk::now() > end) return false;
  }
  return true;
}

// (c), one side: rounds done+1 .. done+count.
bool rounds_c(side& s, bool client, std::uint64_t done, std::uint64_t count) {
  for (std::uint64_t i = done + 1; i <= done + count; ++i) {
    auto send = [&] {
      return post(s, [&] { return fi_send(s.ep, s.buf[0], msg, s.desc, s.peer, &s.ctx[0]); });
    };
    if (client) {
      if (!send() || !reap(s, i, i) || !recv(s)) return false;
    } else {
      if (!reap(s, i - 1, i) || !recv(s) || !send()) return false;
    }
  }
  return true;
}

/// argv: provider, triggered|by_hand|pingpong, rounds per sample, samples.
/// Prints layered (1 when the endpoint is ofi_compcntr's), n, s0.. (ns per round trip for (b),
/// one-way for (c)).
int probe(const std::vector<std::string>& args) {
  if (args.size() < 4) return std::printf("error=usage: provider mode iters samples\n"), 2;
  const std::string prov = args[0];
  const mode m = args[1] == "triggered" ? mode::triggered
                 : args[1] == "by_hand" ? mode::by_hand
                                        : mode::pingpong;
  const std::uint64_t iters = std::stoull(args[2]);
  const int samples = std::stoi(args[3]);
  const std::uint64_t warm = iters / 4 + 10;
  // (b) triggered asks for FI_TRIGGER; (c) asks for it on both sides of the comparison when the
  // provider is the layer's (the program "asks for triggers but sends plainly").
  const bool layered = prov.find("ofi_compcntr") != std::string::npos;
  std::uint64_t caps = FI_MSG;
  if (m != mode::pingpong) caps |= FI_RMA;
  if (m == mode::triggered || (m == mode::pingpong && layered)) caps |= FI_TRIGGER;
  bench::fi_pair::process pp;
  if (const char* e = pp.start()) return std::printf("error=%s\n", e), 1;
  const bool client = pp.client;
  int status = 0;
  {
    side s;
    std::string why = open_side(s, prov, caps, m != mode::pingpong);
    // Name and this side's write target as the peer addresses it.
    bench::fi_pair::hello<remote> mine, theirs;
    if (why.empty()) {
      const bool virt = (s.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
      mine.extra.addr = virt ? reinterpret_cast<std::uint64_t>(s.buf[3]) : 3 * msg;
      mine.extra.key = fi_mr_key(s.mr);
    }
    bool ok = bench::fi_pair::meet(pp, s.ep, s.av, &s.peer, mine, theirs, why, prov);
    ok = pp.handshake(ok && recv(s));
    std::uint64_t done = 0;
    const auto out = bench::fi_pair::sample(
        [&](std::uint64_t n) {
          const bool r = m == mode::pingpong ? rounds_c(s, client, done, n)
                                             : rounds_b(s, theirs.extra, client, m, done, n);
          done += n;
          return r;
        },
        warm, iters, samples, (m == mode::pingpong ? 2.0 : 1.0) * static_cast<double>(iters), ok);
    status =
        bench::fi_pair::end_rounds(pp, ok, iters, why, "the rounds stalled or failed", out, [&] {
          const char* pn = s.info && s.info->fabric_attr ? s.info->fabric_attr->prov_name : "";
          std::printf("layered=%d\n", std::strstr(pn, "ofi_compcntr") != nullptr ? 1 : 0);
          std::printf("provider=%s\n", pn);
        });
  }
  return pp.finish(status);
}

#else
int probe(const std::vector<std::string>&) {
  std::printf("error=built without libfabric\n");
  return 1;
}
#endif

struct config {
  std::string name;     ///< the line's name
  std::string provider; ///< fi_getinfo's prov_name
  std::string mode;     ///< the probe's mode
  std::uint64_t iters;  ///< rounds per sample
  std::string skip{};   ///< not run, and why (empty: run)
};

// Runs every configuration `rounds` times, alternating, in fresh processes (FI_PROVIDER_PATH
// holds the layer only for a provider name that ends in ofi_compcntr).
std::vector<bench::result> collect(const bench::context& ctx, const std::vector<config>& cs,
                                   int samples, int rounds, const std::string& unit) {
  std::vector<std::vector<double>> all(cs.size());
  std::vector<bench::result> out(cs.size());
  const std::string dir = COMPCNTR_BENCH_OFI_DIR;
  for (std::size_t k = 0; k < cs.size(); ++k) out[k].name = cs[k].name, out[k].unit = unit;
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < cs.size(); ++k) {
      if (!out[k].available) continue;
      if (!cs[k].skip.empty()) {
        out[k] = bench::result::unavailable(cs[k].name, cs[k].skip, unit);
        continue;
      }
      const bool layered = cs[k].provider.find("ofi_compcntr") != std::string::npos;
      if (layered && dir.empty()) {
        out[k] = bench::result::unavailable(cs[k].name, "built without ofi_compcntr", unit);
        continue;
      }
      unsetenv("FI_HOOK");
      if (layered) setenv("FI_PROVIDER_PATH", dir.c_str(), 1);
      std::string why;
      auto kv = ctx.run_probe(
          "p17-ofi",
          {cs[k].provider, cs[k].mode, std::to_string(cs[k].iters), std::to_string(samples)}, why);
      unsetenv("FI_PROVIDER_PATH");
      if (!kv.empty() && kv["layered"] != (layered ? "1" : "0")) {
        why = "the endpoint's provider is " + kv["provider"] + ", not the one asked for";
        kv.clear();
      }
      if (kv.empty()) {
        out[k] = bench::result::unavailable(cs[k].name, why, unit);
        continue;
      }
      for (double v : bench::hook::samples(kv)) all[k].push_back(v);
      out[k].notes["provider"] = kv["provider"];
      if (auto it = kv.find("n"); it != kv.end()) out[k].n = std::stoull(it->second);
    }
  for (std::size_t k = 0; k < cs.size(); ++k)
    if (out[k].available) out[k].st = bench::summarize(all[k]);
  return out;
}

void run(bench::context& ctx) {
  const std::string b = "(b) a message, then an 8-byte RMA write back";
  const std::string c = "(c) ping-pong 64 B, fi_cq_read polling";
  if (bench::allowed_cpus().size() < 2) {
    for (const std::string& what : {b, c})
      ctx.add(bench::compare("P17", what,
                             bench::result::unavailable("ofi_compcntr", "needs 2 CPUs", "ns"),
                             bench::result::unavailable("reference", "needs 2 CPUs", "ns")));
    return;
  }
  const int rounds = ctx.opt.smoke ? 1 : 3;
  const int samples = ctx.opt.smoke ? 2 : 3; // smoke: reps (2) samples, as bench_smoke checks
  // About 0.1-0.3 s per sample on an idle 2-CPU VM (tcp: ~20-60 us per round trip); sockets'
  // triggers fire from its progress thread, which sleeps between polls (~10-25 ms a round).
  const std::uint64_t iters = ctx.opt.smoke ? 30 : 2'000;
  const std::uint64_t sockets_iters = ctx.opt.smoke ? 3 : 20;
#ifdef COMPCNTR_BENCH_SANITIZED
  // sockets fires its triggers from its own progress thread inside the uninstrumented
  // libfabric: ThreadSanitizer reports that thread's accesses as races in the probe.
  const std::string sockets_skip = std::string("sanitizer build (") + COMPCNTR_BENCH_SANITIZED +
                                   "): sockets' progress thread is not instrumented";
#else
  const std::string sockets_skip;
#endif
  {
    auto r = collect(
        ctx,
        {{"triggered write (tcp;ofi_rxm;ofi_compcntr)", "tcp;ofi_rxm;ofi_compcntr", "triggered",
          iters},
         {"wait on the counter, then fi_write (tcp;ofi_rxm)", "tcp;ofi_rxm", "by_hand", iters},
         {"triggered write (sockets' own triggers)", "sockets", "triggered", sockets_iters,
          sockets_skip}},
        samples, rounds, "ns per round trip");
    ctx.add(bench::compare("P17", b + ": triggered through ofi_compcntr vs by hand", r[0], r[1],
                           bench::goal::ratio_at_most, 1.1));
    ctx.add(bench::compare("P17", b + ": triggered through ofi_compcntr vs sockets' own triggers",
                           r[0], r[2], bench::goal::info));
  }
  {
    auto r = collect(ctx,
                     {{"asks FI_TRIGGER, sends plainly (tcp;ofi_rxm;ofi_compcntr)",
                       "tcp;ofi_rxm;ofi_compcntr", "pingpong", iters},
                      {"the same program on tcp;ofi_rxm", "tcp;ofi_rxm", "pingpong", iters}},
                     samples, rounds, "ns one-way");
    ctx.add(bench::compare("P17", c + ": through ofi_compcntr vs the provider below", r[0], r[1],
                           bench::goal::ratio_at_most, 1.05));
  }
}

} // namespace

COMPCNTR_BENCH_ROW("P17",
                   "ofi_compcntr: a triggered RMA write and the plain path through the layer", run);
COMPCNTR_BENCH_PROBE("p17-ofi", probe);
