// P9: the CQ bridge on real tcp;ofi_rxm loopback traffic, 100,000 messages.
// Target: counts equal the provider's own fi_cntr exactly; message rate >= 0.95x of the same
// traffic counted by the provider's counter.
//
// Two endpoints A -> B of one tcp;ofi_rxm domain on 127.0.0.1, 16-byte messages, at most 64 in
// flight (B posts the receive, A the send; both loops are the same code, only the way
// completions are counted differs):
//   * reference: libfabric's own counters, A's bound FI_SEND and B's FI_RECV, the CQs bound with
//     FI_SELECTIVE_COMPLETION and no operation asking for an entry -- what an application using
//     provider counters does. Completions are seen through fi_cntr_read (which runs the
//     endpoint's progress, as fi_cntr(3) counters do).
//   * compcntr: every operation makes a CQ entry (no selective completion); a bridge per CQ
//     (open_ex with the format: batched fi_cq_read) counts them into compcntr counters, read
//     with value(). The provider's counters are bound to these endpoints as well, and after
//     every sample both are compared: the exactness line is the largest difference seen.
//   * info: the same with bridges opened without the format (one entry per fi_cq_read).
// Timed with the thread's CPU time (data progress is manual: all work, kernel loopback
// included, runs in this thread). A sample is 100,000 messages (2,000 with --smoke).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>

#include "../harness.hpp"

#if COMPCNTR_BENCH_HAVE_FABRIC
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#endif

import compcntr;

#if COMPCNTR_BENCH_HAVE_FABRIC
#include <compcntr/fabric.hpp>
#endif

namespace {

constexpr std::uint64_t full_count = 100'000;
constexpr std::uint64_t smoke_count = 2'000;
constexpr std::uint64_t window = 64;
constexpr std::size_t msg_len = 16;

#if COMPCNTR_BENCH_HAVE_FABRIC

enum class kind { provider_counters, bridge_batched, bridge_prefix };

// One tcp;ofi_rxm loopback pair set up for one kind of counting.
struct pair_env {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq[2] = {};
  fid_ep* ep[2] = {};
  fid_cntr* sendc = nullptr;  // on A, FI_SEND
  fid_cntr* recvc = nullptr;  // on B, FI_RECV
  fi_addr_t addr[2] = {};
  char buf[2][4096] = {};
  compcntr::device dev;
  compcntr::counter sent, recvd;
  compcntr_fi_bridge* br[2] = {};
  std::uint64_t max_diff = 0;  // largest |bridge - provider| seen after a sample

  ~pair_env() {
    for (auto* b : br)
      if (b) compcntr_fi_bridge_close(b);
    for (auto* e : ep)
      if (e) fi_close(&e->fid);
    if (sendc) fi_close(&sendc->fid);
    if (recvc) fi_close(&recvc->fid);
    for (auto* c : cq)
      if (c) fi_close(&c->fid);
    if (av) fi_close(&av->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
  }

  static std::unique_ptr<pair_env> open(kind k, std::string& why) {
    auto e = std::make_unique<pair_env>();
    fi_info* hints = fi_allocinfo();
    if (!hints) return why = "fi_allocinfo failed", nullptr;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
    int ret = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, FI_SOURCE, hints, &e->info);
    fi_freeinfo(hints);
    if (ret) {
      e->info = nullptr;
      return why = std::string("fi_getinfo(tcp;ofi_rxm, 127.0.0.1): ") + fi_strerror(-ret), nullptr;
    }
    if (e->info->domain_attr->mr_mode & FI_MR_LOCAL)
      return why = "tcp;ofi_rxm asks for FI_MR_LOCAL (not expected with libfabric 1.17)", nullptr;
    auto err = [&why](const char* call, int r) {
      why = std::string(call) + ": " + fi_strerror(-r);
      return nullptr;
    };
    if ((ret = fi_fabric(e->info->fabric_attr, &e->fabric, nullptr))) return err("fi_fabric", ret);
    if ((ret = fi_domain(e->fabric, e->info, &e->domain, nullptr))) return err("fi_domain", ret);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((ret = fi_av_open(e->domain, &av_attr, &e->av, nullptr))) return err("fi_av_open", ret);
    fi_cntr_attr ca{};
    ca.events = FI_CNTR_EVENTS_COMP;
    ca.wait_obj = FI_WAIT_NONE;
    if ((ret = fi_cntr_open(e->domain, &ca, &e->sendc, nullptr))) return err("fi_cntr_open", ret);
    if ((ret = fi_cntr_open(e->domain, &ca, &e->recvc, nullptr))) return err("fi_cntr_open", ret);
    const bool selective = k == kind::provider_counters;
    for (int s = 0; s < 2; ++s) {
      fi_cq_attr cq_attr{};
      cq_attr.format = FI_CQ_FORMAT_MSG;
      cq_attr.size = 1024;
      if ((ret = fi_cq_open(e->domain, &cq_attr, &e->cq[s], nullptr)))
        return err("fi_cq_open", ret);
      if ((ret = fi_endpoint(e->domain, e->info, &e->ep[s], nullptr)))
        return err("fi_endpoint", ret);
      if ((ret = fi_ep_bind(e->ep[s], &e->av->fid, 0))) return err("fi_ep_bind(av)", ret);
      if ((ret = fi_ep_bind(e->ep[s], &e->cq[s]->fid,
                            FI_TRANSMIT | FI_RECV | (selective ? FI_SELECTIVE_COMPLETION : 0))))
        return err("fi_ep_bind(cq)", ret);
      if ((ret = fi_ep_bind(e->ep[s], s == 0 ? &e->sendc->fid : &e->recvc->fid,
                            s == 0 ? FI_SEND : FI_RECV)))
        return err("fi_ep_bind(cntr)", ret);
      if ((ret = fi_enable(e->ep[s]))) return err("fi_enable", ret);
    }
    for (int s = 0; s < 2; ++s) {
      char name[256];
      std::size_t len = sizeof name;
      if ((ret = fi_getname(&e->ep[s]->fid, name, &len))) return err("fi_getname", ret);
      if (fi_av_insert(e->av, name, 1, &e->addr[s], 0, nullptr) != 1)
        return why = "fi_av_insert failed", nullptr;
    }
    if (k != kind::provider_counters) {
      std::error_code ec;
      e->dev = compcntr::device::open("soft", ec);
      if (!ec) e->sent = e->dev.create_counter(compcntr::counter_type::wrs, ec);
      if (!ec) e->recvd = e->dev.create_counter(compcntr::counter_type::wrs, ec);
      if (ec) return why = "compcntr: " + std::string(compcntr::last_error_message()), nullptr;
      compcntr_fi_bridge_attr a{};
      a.comp_mask = COMPCNTR_FI_BRIDGE_ATTR_FORMAT;
      a.format = FI_CQ_FORMAT_MSG;
      for (int s = 0; s < 2; ++s) {
        e->br[s] = k == kind::bridge_batched ? compcntr_fi_bridge_open_ex(e->cq[s], &a)
                                             : compcntr_fi_bridge_open(e->cq[s]);
        if (!e->br[s]) return why = compcntr_fi_last_error(), nullptr;
      }
      if (compcntr::fabric::bind(e->br[0], e->dev, e->sent, FI_SEND) ||
          compcntr::fabric::bind(e->br[1], e->dev, e->recvd, FI_RECV))
        return why = compcntr_fi_last_error(), nullptr;
    }
    return e;
  }
};

// The traffic loop, shared by every kind: `progress()` drives the endpoints and returns the
// messages sent and received so far (relative to the counters' values at the start).
template <class Progress>
void run_traffic(pair_env& e, std::uint64_t n, Progress progress) {
  std::uint64_t posted = 0, sent = 0, received = 0;
  fi_context ctx[2];  // FI_CONTEXT mode: unused by rxm for these calls, passed anyway
  while (sent < n || received < n) {
    while (posted < n && posted - received < window) {
      if (fi_recv(e.ep[1], e.buf[1], msg_len, nullptr, e.addr[0], &ctx[1]) == -FI_EAGAIN) break;
      while (fi_send(e.ep[0], e.buf[0], msg_len, nullptr, e.addr[1], &ctx[0]) == -FI_EAGAIN)
        progress(sent, received);
      ++posted;
    }
    progress(sent, received);
  }
}

bench::variant provider_variant(const std::string& name, pair_env* e) {
  return bench::timed(name, [e](std::uint64_t n) {
    const std::uint64_t s0 = fi_cntr_read(e->sendc), r0 = fi_cntr_read(e->recvc);
    run_traffic(*e, n, [&](std::uint64_t& s, std::uint64_t& r) {
      s = fi_cntr_read(e->sendc) - s0;
      r = fi_cntr_read(e->recvc) - r0;
    });
  });
}

bench::variant bridge_variant(const std::string& name, pair_env* e) {
  return bench::timed(name, [e](std::uint64_t n) {
    const std::uint64_t s0 = e->sent.value(), r0 = e->recvd.value();
    run_traffic(*e, n, [&](std::uint64_t& s, std::uint64_t& r) {
      compcntr_fi_bridge_progress(e->br[0]);
      compcntr_fi_bridge_progress(e->br[1]);
      s = e->sent.value() - s0;
      r = e->recvd.value() - r0;
    });
    // Exactness (outside the loop, counted in the sample but once per 100,000 messages): the
    // provider's counters saw the same traffic. Its counters and CQ entries are written in
    // the same completion step, and the loop ended when the bridge had every entry.
    auto diff = [](std::uint64_t a, std::uint64_t b) { return a > b ? a - b : b - a; };
    const std::uint64_t d = diff(fi_cntr_read(e->sendc), e->sent.value()) +
                            diff(fi_cntr_read(e->recvc), e->recvd.value());
    if (d > e->max_diff) e->max_diff = d;
  });
}

void run(bench::context& ctx) {
  const std::uint64_t count = ctx.opt.smoke ? smoke_count : full_count;
  std::string why_ref, why_cc, why_prefix;
  auto ref = pair_env::open(kind::provider_counters, why_ref);
  auto cc = pair_env::open(kind::bridge_batched, why_cc);
  auto prefix = pair_env::open(kind::bridge_prefix, why_prefix);
  const std::string m = count == full_count ? "100,000" : std::to_string(count);
  const std::string ref_name = "tcp;ofi_rxm, provider fi_cntr (selective completion)";
  const std::string cc_name = "tcp;ofi_rxm, CQ bridge -> compcntr counters";
  const std::string prefix_name = "tcp;ofi_rxm, CQ bridge without the format (1 entry/read)";
  std::vector<bench::variant> vs = {
      cc ? bridge_variant(cc_name, cc.get()) : bench::unavailable_variant(cc_name, why_cc),
      ref ? provider_variant(ref_name, ref.get()) : bench::unavailable_variant(ref_name, why_ref),
      prefix ? bridge_variant(prefix_name, prefix.get())
             : bench::unavailable_variant(prefix_name, why_prefix),
  };
  for (auto& v : vs) {
    v.fixed_n = count;
    v.unit = "ns/msg";
  }
  auto r = ctx.measure(std::move(vs));
  ctx.add(bench::compare("P9", "bridge: message rate vs provider fi_cntr (" + m + " msgs)", r[0],
                         r[1], bench::goal::speedup_at_least, 0.95,
                         "ratio = bridge msg rate / provider-counter msg rate"));
  ctx.add(bench::compare("P9", "bridge without CQ format vs provider fi_cntr", r[2], r[1]));
  // Exactness: the largest |bridge count - provider count| (send + receive) after any sample.
  bench::result exact;
  exact.name = "max |bridge - provider fi_cntr| after a sample (send+recv)";
  exact.unit = "msgs";
  if (cc && prefix) {
    exact.n = count;
    exact.st = bench::summarize(std::vector<double>(
        r[0].st.samples.size(), static_cast<double>(cc->max_diff + prefix->max_diff)));
  } else {
    exact.available = false;
    exact.why = cc ? why_prefix : why_cc;
  }
  ctx.add(bench::absolute("P9", "bridge: counts equal the provider's fi_cntr exactly", exact,
                          bench::goal::value_at_most, 0));
}

#else  // built without libfabric

void run(bench::context& ctx) {
  const std::string why = "built without libfabric (not found when meson configured the build)";
  ctx.add(bench::compare("P9", "bridge: message rate vs provider fi_cntr",
                         bench::result::unavailable("CQ bridge", why, "ns/msg"),
                         bench::result::unavailable("provider fi_cntr", why, "ns/msg"),
                         bench::goal::speedup_at_least, 0.95));
}

#endif

} // namespace

COMPCNTR_BENCH_ROW("P9", "CQ bridge on tcp;ofi_rxm loopback traffic vs the provider's own counters",
                   run);
