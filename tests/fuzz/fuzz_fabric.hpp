// Shared pieces of the libfabric-layer fuzz harnesses (issue 22): fuzz_fi_adapter.cpp (the
// fi_cntr adapter, CQ bridges and mirrors), fuzz_fi_hook.cpp (FI_HOOK=compcntr) and
// fuzz_fi_ofi.cpp (the layered provider ofi_compcntr).
//
// The provider underneath is shm. Measured on this machine (libfabric 1.17): an fi_cntr_read of
// a shm counter bound to an endpoint costs ~15 ns against ~570 ns on tcp;ofi_rxm (whose progress
// is an epoll system call), fi_enable ~3-30 ms against ~100-200 ms, and it runs in one process
// with no connection to set up and no thread of its own. What shm lacks (counters on FI_WAIT_FD
// or wait sets, a timeout in its own fi_cntr_wait) is then outside the hook and layer harnesses;
// the adapter's FI_WAIT_FD counters are compcntr's and are fuzzed there.
//
// One process holds one "world", opened once in LLVMFuzzerInitialize: fabric, domain, AV and two
// enabled endpoints A and B on one CQ each, A sending to B, with a counter bound to A (FI_SEND)
// and one to B (FI_RECV). B always has receives posted (64-byte buffers); every message fits
// shm's inject path, so a send completes in fi_send and B's receive in B's next progress. Each
// input starts from the same state: CQs drained, the two counters set to 0.
#ifndef COMPCNTR_TESTS_FUZZ_FABRIC_HPP
#define COMPCNTR_TESTS_FUZZ_FABRIC_HPP

#include "fuzz_common.hpp"

#include <compcntr/fabric.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace fuzz::fab {

/// "-FI_EINVAL (Invalid argument)" style, for traces and mismatch messages.
inline std::string fi_name(long r) {
  char b[96];
  if (r >= 0)
    std::snprintf(b, sizeof b, "%ld", r);
  else
    std::snprintf(b, sizeof b, "-%ld (%s)", -r, fi_strerror(static_cast<int>(-r)));
  return b;
}

/// A libfabric-style return value (0 or -FI_E*; counts for bridge progress) against the model's.
inline void expect_fi(const char* file, int line, const char* call, long got, long want) {
  if (got != want)
    mismatch(file, line, call, "returned %s, model says %s", fi_name(got).c_str(),
             fi_name(want).c_str());
}
#define FUZZ_FI(call, got, want) ::fuzz::fab::expect_fi(__FILE__, __LINE__, call, (got), (want))

/// A compcntr-convention return (0 or a positive errno) of the fabric library, against the model.
inline void expect_err(const char* file, int line, const char* call, int got, int want) {
  if (got != want)
    mismatch(file, line, call, "returned %d (%s), model says %d (%s); compcntr_fi_last_error '%s'",
             got, std::strerror(got), want, std::strerror(want), compcntr_fi_last_error());
}
#define FUZZ_ERR(call, got, want) ::fuzz::fab::expect_err(__FILE__, __LINE__, call, (got), (want))

[[noreturn]] inline void setup_failed(const char* what, long r) {
  std::fprintf(stderr, "fuzz: world set-up failed: %s: %s\n", what, fi_name(r).c_str());
  std::abort();
}

struct side {
  fid_ep* ep = nullptr;
  fid_cq* cq = nullptr;
  fi_addr_t addr = FI_ADDR_UNSPEC;
};

constexpr std::size_t msg_max = 64;     ///< receive buffers; a longer message truncates
constexpr std::size_t n_recv = 512;     ///< receive slots of B (each one posted at most once)
constexpr std::size_t cq_size = 8192;   ///< both CQs (an input posts at most a few hundred)

/// The world every input of a harness shares (see the file comment).
struct world {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  side a, b;
  fid_cntr* a_send = nullptr;  ///< bound to A with FI_SEND
  fid_cntr* b_recv = nullptr;  ///< bound to B with FI_RECV
  std::size_t posted = 0;      ///< receives of B posted and not yet matched
  std::size_t next_slot = 0;
  std::vector<fi_context> rctx = std::vector<fi_context>(n_recv);
  std::vector<char> rbuf = std::vector<char>(n_recv * msg_max);
  char sbuf[256] = {};
  std::vector<fi_context> sctx = std::vector<fi_context>(64);

  /// hints: FI_EP_RDM, FI_MSG | FI_TAGGED | extra_caps, on provider `prov`. `observers`: open
  /// and bind the two counters (FI_WAIT_UNSPEC).
  void open(const char* prov, std::uint64_t extra_caps, bool observers) {
    // shm names an endpoint's region /dev/shm/<pid>:<n>:<m>. A harness process that stopped at a
    // disagreement (abort) leaves its regions; a later process with the same pid then finds its
    // name taken (fi_enable: -FI_EBUSY). Regions named after this process's pid are stale.
    if (DIR* d = opendir("/dev/shm")) {
      const std::string mine = std::to_string(getpid()) + ":";
      while (dirent* e = readdir(d))
        if (std::strncmp(e->d_name, mine.c_str(), mine.size()) == 0)
          unlink((std::string("/dev/shm/") + e->d_name).c_str());
      closedir(d);
    }
    fi_info* hints = fi_allocinfo();
    if (!hints) setup_failed("fi_allocinfo", -FI_ENOMEM);
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_TAGGED | extra_caps;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(prov);
    int r = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info);
    fi_freeinfo(hints);
    if (r) setup_failed("fi_getinfo", r);
    if ((r = fi_fabric(info->fabric_attr, &fabric, nullptr))) setup_failed("fi_fabric", r);
    if ((r = fi_domain(fabric, info, &domain, nullptr))) setup_failed("fi_domain", r);
    fi_av_attr aa{};
    aa.type = FI_AV_TABLE;
    if ((r = fi_av_open(domain, &aa, &av, nullptr))) setup_failed("fi_av_open", r);
    if (observers) {
      fi_cntr_attr ca{};
      ca.events = FI_CNTR_EVENTS_COMP;
      ca.wait_obj = FI_WAIT_UNSPEC;
      if ((r = fi_cntr_open(domain, &ca, &a_send, nullptr))) setup_failed("fi_cntr_open", r);
      if ((r = fi_cntr_open(domain, &ca, &b_recv, nullptr))) setup_failed("fi_cntr_open", r);
    }
    open_side(a, a_send, FI_SEND);
    open_side(b, b_recv, FI_RECV);
    // shm's first send to a peer maps the peer's region and answers -FI_EAGAIN until both sides
    // progressed: warm the pair up here, so that no input meets that.
    post_recvs(8);
    for (int i = 0; i < 8; ++i) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (;;) {
        r = static_cast<int>(fi_send(a.ep, sbuf, 8, nullptr, b.addr, &sctx[0]));
        if (r == 0) {
          --posted;
          break;
        }
        if (r != -FI_EAGAIN || std::chrono::steady_clock::now() > end)
          setup_failed("fi_send (warm-up)", r);
        progress_raw();
      }
    }
    std::size_t got = 0;
    for (int i = 0; i < 1000 && got < 8; ++i) got += progress_raw();
    if (got != 8) setup_failed("warm-up receives", -FI_EOTHER);
    progress_raw();
    // Every input starts with both counters at 0 (inputs end the same way).
    for (fid_cntr* c : {a_send, b_recv})
      if (c) fi_cntr_set(c, 0), fi_cntr_seterr(c, 0);
  }

  void open_side(side& s, fid_cntr* c, std::uint64_t cflag) {
    fi_cq_attr ca{};
    ca.format = FI_CQ_FORMAT_TAGGED;
    ca.size = cq_size;
    int r;
    if ((r = fi_cq_open(domain, &ca, &s.cq, nullptr))) setup_failed("fi_cq_open", r);
    if ((r = fi_endpoint(domain, info, &s.ep, nullptr))) setup_failed("fi_endpoint", r);
    if ((r = fi_ep_bind(s.ep, &av->fid, 0))) setup_failed("fi_ep_bind(av)", r);
    if ((r = fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV))) setup_failed("bind(cq)", r);
    if (c && (r = fi_ep_bind(s.ep, &c->fid, cflag))) setup_failed("fi_ep_bind(cntr)", r);
    if ((r = fi_enable(s.ep))) setup_failed("fi_enable", r);
    char name[256];
    std::size_t len = sizeof name;
    if ((r = fi_getname(&s.ep->fid, name, &len))) setup_failed("fi_getname", r);
    if (fi_av_insert(av, name, 1, &s.addr, 0, nullptr) != 1) setup_failed("fi_av_insert", -1);
  }

  /// Reads both CQs (drives both endpoints' progress); returns how many entries B's held. Only
  /// for set-up and between inputs: entries are dropped.
  std::size_t progress_raw() {
    std::size_t got = 0;
    fi_cq_tagged_entry e[64];
    for (side* s : {&a, &b}) {
      for (;;) {
        const ssize_t n = fi_cq_read(s->cq, e, 64);
        if (n > 0) {
          if (s == &b) got += static_cast<std::size_t>(n);
          continue;
        }
        if (n == -FI_EAVAIL) {
          fi_cq_err_entry ee{};
          if (fi_cq_readerr(s->cq, &ee, 0) == 1) {
            if (s == &b) ++got;
            continue;
          }
        }
        break;
      }
    }
    return got;
  }

  /// Posts receives on B until `want` are posted and not claimed by a send (64-byte buffers).
  void post_recvs(std::size_t want) {
    while (posted < want) {
      const std::size_t i = next_slot++ % n_recv;
      const ssize_t r = fi_recv(b.ep, &rbuf[i * msg_max], msg_max, nullptr, a.addr, &rctx[i]);
      if (r) setup_failed("fi_recv", r);
      ++posted;
    }
  }

  /// n sends of len bytes from A to B (receives posted first). -FI_EAGAIN is a defect here (the
  /// queues are far from full): it is returned to the caller, which reports it.
  ssize_t send(int n, std::size_t len) {
    post_recvs(static_cast<std::size_t>(n) + 1);
    for (int i = 0; i < n; ++i) {
      const ssize_t r = fi_send(a.ep, sbuf, len, nullptr, b.addr, &sctx[i % sctx.size()]);
      if (r) return r;
      --posted; // matched when B progresses (every send finds a receive)
    }
    return 0;
  }

  void close() {
    for (side* s : {&a, &b}) {
      if (s->ep) fi_close(&s->ep->fid), s->ep = nullptr;
      if (s->cq) fi_close(&s->cq->fid), s->cq = nullptr;
    }
    for (fid_cntr** c : {&a_send, &b_recv})
      if (*c) fi_close(&(*c)->fid), *c = nullptr;
    if (av) fi_close(&av->fid), av = nullptr;
    if (domain) fi_close(&domain->fid), domain = nullptr;
    if (fabric) fi_close(&fabric->fid), fabric = nullptr;
    if (info) fi_freeinfo(info), info = nullptr;
  }
};

/// A wait timeout: 0 (check once) mostly, 1 or 2 ms otherwise (a wait that times out sleeps that
/// long: on 2 shared CPUs the executions per second are made of them).
inline int small_timeout(FuzzedDataProvider& in) {
  const int t = in.ConsumeIntegralInRange<int>(0, 7);
  return t <= 5 ? 0 : t - 5;
}

/// fi_cntr_attr from raw bits: a valid attribute most of the time, any event / wait object /
/// flags value otherwise. `wait_range` bounds the raw wait object (libfabric 1.17 crashes on
/// some values it does not check: callers say which).
struct raw_attr {
  int events = FI_CNTR_EVENTS_COMP;
  int wait_obj = FI_WAIT_NONE;
  std::uint64_t flags = 0;
  bool null_attr = false;
  bool wait_set = false; ///< a non-NULL wait_set (never a real one: FI_WAIT_SET is refused)
  fi_cntr_attr get() const {
    fi_cntr_attr a{};
    std::memcpy(&a.events, &events, sizeof events);
    std::memcpy(&a.wait_obj, &wait_obj, sizeof wait_obj);
    a.flags = flags;
    a.wait_set = wait_set ? reinterpret_cast<fid_wait*>(std::uintptr_t{0x1000}) : nullptr;
    return a;
  }
};

} // namespace fuzz::fab

#endif
