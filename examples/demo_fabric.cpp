// ./dev demo, libfabric part: compcntr counters on real libfabric loopback traffic
// (tcp;ofi_rxm on 127.0.0.1), side by side with the provider's own counters.
#include <compcntr/fabric.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <time.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <system_error>

import compcntr;

#include <compcntr/fabric.hpp>

namespace {

using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t0) {
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// Two tcp;ofi_rxm endpoints A and B with a CQ each (an entry for every operation) and the
// provider's own counters: A counts FI_SEND and FI_WRITE, B FI_RECV and FI_REMOTE_WRITE.
struct loopback {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq[2] = {};
  fid_ep* ep[2] = {};
  fid_cntr* prov[4] = {};  // A send, A write, B recv, B remote write
  fid_mr* mr = nullptr;
  fi_addr_t addr[2] = {};
  std::uint64_t key = 0;
  static constexpr std::size_t buf_size = 1 << 20;
  char* buf = nullptr;  // A sends from the first half, B receives into / is written in the second
  std::deque<fi_context> ctxs;
  std::string error;

  ~loopback() {
    for (auto* e : ep)
      if (e) fi_close(&e->fid);
    if (mr) fi_close(&mr->fid);
    for (auto* c : prov)
      if (c) fi_close(&c->fid);
    for (auto* c : cq)
      if (c) fi_close(&c->fid);
    if (av) fi_close(&av->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
    std::free(buf);
  }

  bool fail(const char* call, int r) {
    error = std::string(call) + ": " + fi_strerror(r < 0 ? -r : r);
    return false;
  }

  bool open() {
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
    int r = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, FI_SOURCE, hints, &info);
    fi_freeinfo(hints);
    if (r) {
      info = nullptr;
      return fail("fi_getinfo(tcp;ofi_rxm, 127.0.0.1)", r);
    }
    if ((r = fi_fabric(info->fabric_attr, &fabric, nullptr))) return fail("fi_fabric", r);
    if ((r = fi_domain(fabric, info, &domain, nullptr))) return fail("fi_domain", r);
    fi_av_attr aa{};
    aa.type = FI_AV_TABLE;
    if ((r = fi_av_open(domain, &aa, &av, nullptr))) return fail("fi_av_open", r);
    const std::uint64_t what[4] = {FI_SEND, FI_WRITE, FI_RECV, FI_REMOTE_WRITE};
    for (int i = 0; i < 4; ++i) {
      fi_cntr_attr ca{};
      if ((r = fi_cntr_open(domain, &ca, &prov[i], nullptr))) return fail("fi_cntr_open", r);
    }
    for (int s = 0; s < 2; ++s) {
      fi_cq_attr qa{};
      qa.format = FI_CQ_FORMAT_MSG;
      qa.size = 1024;
      if ((r = fi_cq_open(domain, &qa, &cq[s], nullptr))) return fail("fi_cq_open", r);
      if ((r = fi_endpoint(domain, info, &ep[s], nullptr))) return fail("fi_endpoint", r);
      if ((r = fi_ep_bind(ep[s], &av->fid, 0))) return fail("fi_ep_bind", r);
      if ((r = fi_ep_bind(ep[s], &cq[s]->fid, FI_TRANSMIT | FI_RECV))) return fail("fi_ep_bind", r);
      for (int i = 2 * s; i < 2 * s + 2; ++i)
        if ((r = fi_ep_bind(ep[s], &prov[i]->fid, what[i]))) return fail("fi_ep_bind(cntr)", r);
      if ((r = fi_enable(ep[s]))) return fail("fi_enable", r);
    }
    if (posix_memalign(reinterpret_cast<void**>(&buf), 4096, buf_size))
      return fail("posix_memalign", ENOMEM);
    std::memset(buf, 'x', buf_size);
    if ((r = fi_mr_reg(domain, buf, buf_size, FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE, 0, 1,
                       0, &mr, nullptr)))
      return fail("fi_mr_reg", r);
    key = fi_mr_key(mr);
    for (int s = 0; s < 2; ++s) {
      char name[256];
      std::size_t len = sizeof name;
      if ((r = fi_getname(&ep[s]->fid, name, &len))) return fail("fi_getname", r);
      if (fi_av_insert(av, name, 1, &addr[s], 0, nullptr) != 1) return fail("fi_av_insert", EINVAL);
    }
    return true;
  }
  std::uint64_t remote(std::size_t off) const {
    return ((info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<std::uint64_t>(buf)
                                                           : 0) +
           off;
  }
};

struct both_bridges {
  compcntr_fi_bridge* a;
  compcntr_fi_bridge* b;
};
void drive_both(void* ctx) {
  auto* p = static_cast<both_bridges*>(ctx);
  compcntr_fi_bridge_progress(p->a);
  compcntr_fi_bridge_progress(p->b);
}

} // namespace

void fabric_demo() {
  std::printf("\n== libfabric: counters on real tcp;ofi_rxm loopback traffic (127.0.0.1)\n");
  loopback lb;
  if (!lb.open()) {
    std::printf("  skipped: %s\n", lb.error.c_str());
    return;
  }
  std::printf(
      "  provider %s, fabric %s, two RDM endpoints A -> B, one CQ each (an entry per operation)\n",
      lb.info->fabric_attr->prov_name, lb.info->fabric_attr->name);

  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  // A's sends: an fi_cntr served by compcntr (what a provider would hand out), used through
  // libfabric's fi_cntr_read / fi_cntr_wait.
  fi_cntr_attr attr{};
  attr.events = FI_CNTR_EVENTS_COMP;
  attr.wait_obj = FI_WAIT_UNSPEC;
  fid_cntr* sent = nullptr;
  compcntr_device* cdev = compcntr_open_device("soft");
  if (compcntr_fi_cntr_open(cdev, &attr, &sent, nullptr)) return;
  auto writes = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto recv_bytes = dev.create_counter(compcntr::counter_type::bytes, ec);
  auto remote_writes = dev.create_counter(compcntr::counter_type::wrs, ec);
  compcntr_fi_bridge_attr ba{};
  ba.comp_mask = COMPCNTR_FI_BRIDGE_ATTR_FORMAT;
  ba.format = FI_CQ_FORMAT_MSG;
  both_bridges br{compcntr_fi_bridge_open_ex(lb.cq[0], &ba),
                  compcntr_fi_bridge_open_ex(lb.cq[1], &ba)};
  compcntr_fi_bridge_bind(br.a, compcntr_fi_cntr_comp_cntr(sent), FI_SEND);
  compcntr::fabric::bind(br.a, dev, writes, FI_WRITE);
  compcntr::fabric::bind(br.b, dev, recv_bytes, FI_RECV);
  compcntr::fabric::bind(br.b, dev, remote_writes, FI_REMOTE_WRITE);
  std::printf("  bridges: A's CQ -> {FI_SEND: adapter fid_cntr, FI_WRITE: counter};"
              " B's CQ -> {FI_RECV: BYTES counter, FI_REMOTE_WRITE: counter}\n");

  // Traffic: 20,000 messages of 1..256 bytes, then 2,000 RMA writes with remote CQ data.
  constexpr std::uint64_t msgs = 20000, rmas = 2000, window = 64;
  std::uint64_t msg_bytes = 0, rma_bytes = 0, posted = 0;
  const auto t0 = clk::now();
  const double cpu0 = thread_cpu_ms();
  auto received = [&] {  // messages B's bridge has read (its only entries in this phase)
    compcntr_fi_bridge_stats st{};
    compcntr_fi_bridge_query_stats(br.b, &st);
    return st.entries;
  };
  while (posted < msgs) {
    while (posted < msgs && posted - received() < window) {
      const std::size_t len = 1 + posted % 256;
      if (fi_recv(lb.ep[1], lb.buf + 524288 + 256 * (posted % 1024), 256, nullptr, lb.addr[0],
                  &lb.ctxs.emplace_back()) == -FI_EAGAIN)
        break;
      while (fi_send(lb.ep[0], lb.buf, len, nullptr, lb.addr[1], &lb.ctxs.emplace_back()) ==
             -FI_EAGAIN)
        drive_both(&br);
      msg_bytes += len;
      ++posted;
    }
    drive_both(&br);
  }
  for (std::uint64_t i = 0; i < rmas; ++i) {
    const std::size_t len = 64 + i % 64;
    while (fi_writedata(lb.ep[0], lb.buf, len, nullptr, i, lb.addr[1],
                        lb.remote(262144 + 128 * (i % 512)), lb.key,
                        &lb.ctxs.emplace_back()) == -FI_EAGAIN)
      drive_both(&br);
    rma_bytes += len;
  }
  // Wait for everything: B's counters with a compcntr wait whose drive function drives both
  // CQs, then A's sends with fi_cntr_wait on the adapter (it drives the bridge it is bound to).
  const compcntr::wait_options drive{.drive = drive_both, .drive_ctx = &br};
  using namespace std::chrono_literals;
  const bool got_recv = compcntr::wait(recv_bytes, msg_bytes, 10s, drive) == std::errc{};
  const bool got_rw = compcntr::wait(remote_writes, rmas, 10s, drive) == std::errc{};
  const auto tw = clk::now();
  const int wait_rc = fi_cntr_wait(sent, msgs, 10000);
  const double wait_ms = ms_since(tw);
  const bool got_w =
      compcntr::wait(writes, rmas, 10s, compcntr::fabric::progress_options(br.a)) == std::errc{};
  const double total_ms = ms_since(t0), cpu_ms = thread_cpu_ms() - cpu0;

  const double ops = static_cast<double>(msgs + rmas);
  std::printf("  %" PRIu64 " messages (1..256 B) and %" PRIu64
              " RMA writes with CQ data: %.1f ms, %.2f us per operation"
              " (this thread's CPU: %.2f us; the machine is shared)\n",
              msgs, rmas, total_ms, total_ms * 1000.0 / ops, cpu_ms * 1000.0 / ops);
  std::printf("    %-34s %-22s %s\n", "", "provider's fi_cntr", "compcntr (bridged)");
  std::printf("    %-34s %-22" PRIu64 " %" PRIu64 "   <- fi_cntr_read(adapter)\n",
              "A: messages sent", fi_cntr_read(lb.prov[0]), fi_cntr_read(sent));
  std::printf("    %-34s %-22" PRIu64 " %" PRIu64 " bytes (sent %" PRIu64 ")\n",
              "B: messages received", fi_cntr_read(lb.prov[2]), recv_bytes.value(), msg_bytes);
  std::printf("    %-34s %-22" PRIu64 " %" PRIu64 "\n", "A: RMA writes completed",
              fi_cntr_read(lb.prov[1]), writes.value());
  std::printf("    %-34s %-22" PRIu64 " %" PRIu64 " (%" PRIu64
              " bytes written: not countable from the CQ,\n"
              "    %-34s %-22s tcp;ofi_rxm reports len 0 for them)\n",
              "B: remote writes (CQ data)", fi_cntr_read(lb.prov[3]), remote_writes.value(),
              rma_bytes, "", "");
  std::printf("  fi_cntr_wait(adapter, %" PRIu64
              ", 10000 ms) -> %d (%s) after %.2f ms; waits ok: %s\n",
              msgs, wait_rc, wait_rc ? fi_strerror(-wait_rc) : "success", wait_ms,
              got_recv && got_rw && got_w ? "yes" : "NO");

  // An error completion: 64 bytes into an 8-byte receive buffer.
  const std::uint64_t prov_err0 = fi_cntr_readerr(lb.prov[2]);
  fi_recv(lb.ep[1], lb.buf + 524288, 8, nullptr, lb.addr[0], &lb.ctxs.emplace_back());
  while (fi_send(lb.ep[0], lb.buf, 64, nullptr, lb.addr[1], &lb.ctxs.emplace_back()) == -FI_EAGAIN)
    drive_both(&br);
  const auto failed =
      compcntr::wait(recv_bytes, UINT64_MAX, 5s, drive);  // returns when the error count moves
  std::printf(
      "  a 64-byte message into an 8-byte receive: wait -> %s; B receive errors: provider %" PRIu64
      ", compcntr %" PRIu64 "\n",
      failed == std::errc::io_error ? "EIO (error count changed, libfabric's -FI_EAVAIL)" : "?",
      fi_cntr_readerr(lb.prov[2]) - prov_err0, recv_bytes.errors());

  compcntr_fi_bridge_stats sa{}, sb{};
  compcntr_fi_bridge_query_stats(br.a, &sa);
  compcntr_fi_bridge_query_stats(br.b, &sb);
  std::printf("  bridges read %" PRIu64 " + %" PRIu64 " CQ entries (%" PRIu64
              " in error); fi_close(adapter) while bound -> %s\n",
              sa.entries + sa.errors, sb.entries + sb.errors, sa.errors + sb.errors,
              fi_close(&sent->fid) == -FI_EBUSY ? "-FI_EBUSY" : "?");
  compcntr_fi_bridge_close(br.a);
  compcntr_fi_bridge_close(br.b);
  fi_close(&sent->fid);
  compcntr_close_device(cdev);
}
