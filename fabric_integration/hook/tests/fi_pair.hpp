// Two RDM endpoints of one provider in one process (127.0.0.1 for the IP providers), for the
// hook and mirror tests: each endpoint has its own CQ (optionally FI_SELECTIVE_COMPLETION) and
// a 64 KiB registered buffer; the test binds whatever counters it wants in `setup`, before
// fi_enable. Written only against libfabric's public API, like an application: the same code
// runs with and without FI_HOOK=compcntr.
#ifndef COMPCNTR_HOOK_TESTS_FI_PAIR_HPP
#define COMPCNTR_HOOK_TESTS_FI_PAIR_HPP

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fipair {

inline constexpr std::size_t buf_size = 1 << 16;

/// The providers every hook test covers, in the names fi_getinfo takes.
inline const std::vector<std::string>& providers() {
  static const std::vector<std::string> p = {"tcp;ofi_rxm", "udp;ofi_rxd", "shm", "sockets"};
  return p;
}

inline bool hooked() {
  const char* h = std::getenv("FI_HOOK");
  return h != nullptr && std::strstr(h, "compcntr") != nullptr;
}

struct side {
  fid_ep* ep = nullptr;
  fid_cq* cq = nullptr;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  std::uint64_t key = 0;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  char* buf = nullptr;
};

struct options {
  bool selective = false;      ///< FI_SELECTIVE_COMPLETION on both CQ bindings
  bool rma_event = false;      ///< ask for FI_RMA_EVENT (skip if the provider lacks it)
  bool trigger = false;        ///< ask for FI_TRIGGER
  bool thread_safe = false;    ///< FI_THREAD_SAFE domain
  std::uint64_t extra_caps = 0;
};

class pair {
 public:
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  side a, b;
  std::string provider;
  std::vector<fid_cntr*> cntrs;  ///< opened through open_cntr, closed after the endpoints

  pair() = default;
  pair(const pair&) = delete;
  pair& operator=(const pair&) = delete;
  ~pair() { close_all(); }

  void close_all() {
    for (side* s : {&a, &b}) {
      if (s->ep) fi_close(&s->ep->fid), s->ep = nullptr;
      if (s->mr) fi_close(&s->mr->fid), s->mr = nullptr;
      if (s->cq) fi_close(&s->cq->fid), s->cq = nullptr;
      std::free(s->buf);
      s->buf = nullptr;
    }
    for (fid_cntr* c : cntrs)
      if (c) fi_close(&c->fid);
    cntrs.clear();
    if (av) fi_close(&av->fid), av = nullptr;
    if (domain) fi_close(&domain->fid), domain = nullptr;
    if (fabric) fi_close(&fabric->fid), fabric = nullptr;
    if (info) fi_freeinfo(info), info = nullptr;
  }

  std::uint64_t remote(const side& target, std::size_t offset) const {
    const bool virt = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    return (virt ? reinterpret_cast<std::uint64_t>(target.buf) : 0) + offset;
  }
  fi_context* ctx() { return &ctxs_.emplace_back(); }
  fi_triggered_context* tctx() { return &tctxs_.emplace_back(); }

  /// A counter of this domain (closed with the pair). 0 or the provider's error.
  int open_cntr(fid_cntr** c, fi_wait_obj wait = FI_WAIT_NONE, void* context = nullptr) {
    fi_cntr_attr ca{};
    ca.events = FI_CNTR_EVENTS_COMP;
    ca.wait_obj = wait;
    const int r = fi_cntr_open(domain, &ca, c, context);
    if (r == 0) cntrs.push_back(*c);
    return r;
  }
  /// Closes a counter opened with open_cntr now (and forgets it).
  int close_cntr(fid_cntr* c) {
    const int r = fi_close(&c->fid);
    if (r == 0)
      for (auto& x : cntrs)
        if (x == c) x = nullptr;
    return r;
  }

  /// Opens the pair. `setup(pair&)` runs after the endpoints are bound to AV and CQ and before
  /// fi_enable (bind counters there; return non-zero to fail). nullptr + why if unavailable.
  static std::unique_ptr<pair> open(const std::string& prov, const options& o, std::string& why,
                                    const std::function<int(pair&)>& setup = {}) {
    auto p = std::make_unique<pair>();
    fi_info* hints = fi_allocinfo();
    if (!hints) return why = "fi_allocinfo failed", nullptr;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_RMA | o.extra_caps | (o.rma_event ? FI_RMA_EVENT : 0) |
                  (o.trigger ? FI_TRIGGER : 0);
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    if (o.thread_safe) hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->fabric_attr->prov_name = strdup(prov.c_str());
    const bool ip = prov.rfind("shm", 0) != 0;  // "shm", "shm;ofi_compcntr": no address
    int ret = fi_getinfo(FI_VERSION(1, 17), ip ? "127.0.0.1" : nullptr, nullptr, ip ? FI_SOURCE : 0,
                         hints, &p->info);
    fi_freeinfo(hints);
    if (ret) {
      p->info = nullptr;
      return why = "fi_getinfo(" + prov + "): " + fi_strerror(-ret), nullptr;
    }
    p->provider = prov;
    auto err = [&why](const char* call, int r) {
      why = std::string(call) + ": " + fi_strerror(r < 0 ? -r : r);
      return nullptr;
    };
    if ((ret = fi_fabric(p->info->fabric_attr, &p->fabric, nullptr))) return err("fi_fabric", ret);
    if ((ret = fi_domain(p->fabric, p->info, &p->domain, nullptr))) return err("fi_domain", ret);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((ret = fi_av_open(p->domain, &av_attr, &p->av, nullptr))) return err("fi_av_open", ret);
    static std::uint64_t next_key = 1;
    for (side* s : {&p->a, &p->b}) {
      fi_cq_attr cq_attr{};
      cq_attr.format = FI_CQ_FORMAT_DATA;
      cq_attr.size = 1024;
      if ((ret = fi_cq_open(p->domain, &cq_attr, &s->cq, nullptr))) return err("fi_cq_open", ret);
      if ((ret = fi_endpoint(p->domain, p->info, &s->ep, nullptr))) return err("fi_endpoint", ret);
      if ((ret = fi_ep_bind(s->ep, &p->av->fid, 0))) return err("fi_ep_bind(av)", ret);
      if ((ret = fi_ep_bind(s->ep, &s->cq->fid,
                            FI_TRANSMIT | FI_RECV | (o.selective ? FI_SELECTIVE_COMPLETION : 0))))
        return err("fi_ep_bind(cq)", ret);
      if (posix_memalign(reinterpret_cast<void**>(&s->buf), 4096, buf_size))
        return why = "posix_memalign", nullptr;
      std::memset(s->buf, 0, buf_size);
      if ((ret =
               fi_mr_reg(p->domain, s->buf, buf_size,
                         FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE,
                         0, next_key++, 0, &s->mr, nullptr)))
        return err("fi_mr_reg", ret);
      s->desc = fi_mr_desc(s->mr);
      s->key = fi_mr_key(s->mr);
    }
    if (setup)
      if ((ret = setup(*p))) return err("setup", ret);
    for (side* s : {&p->a, &p->b})
      if ((ret = fi_enable(s->ep))) return err("fi_enable", ret);
    for (side* s : {&p->a, &p->b}) {
      char name[256];
      std::size_t len = sizeof name;
      if ((ret = fi_getname(&s->ep->fid, name, &len))) return err("fi_getname", ret);
      if ((ret = fi_av_insert(p->av, name, 1, &s->addr, 0, nullptr)) != 1)
        return err("fi_av_insert", ret);
    }
    return p;
  }

  /// Drives both CQs once (entries are discarded; error entries are read and discarded).
  void drive() {
    fi_cq_data_entry e[16];
    for (side* s : {&a, &b}) {
      const ssize_t n = fi_cq_read(s->cq, e, 16);
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry ee{};
        fi_cq_readerr(s->cq, &ee, 0);
      }
    }
  }

  /// Spins (driving both CQs) until pred() or `ms` pass. Returns pred().
  template <class P>
  bool until(P pred, int ms = 5000) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return pred();
      drive();
    }
    return true;
  }

  /// Posts, retrying on -FI_EAGAIN while driving progress.
  template <class F>
  ssize_t post(F f) {
    for (int i = 0; i < 1'000'000; ++i) {
      const ssize_t r = f();
      if (r != -FI_EAGAIN) return r;
      drive();
    }
    return -FI_EAGAIN;
  }

 private:
  std::deque<fi_context> ctxs_;
  std::deque<fi_triggered_context> tctxs_;
};

} // namespace fipair

#endif
