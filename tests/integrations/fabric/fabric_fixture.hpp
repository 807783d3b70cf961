// Real libfabric loopback for the fabric tests: one provider, one domain, one AV, two RDM
// endpoints A and B in this process (127.0.0.1 for the IP providers), each with its own CQ
// (every operation produces an entry: no FI_SELECTIVE_COMPLETION) and, optionally, six of
// libfabric's own counters bound one per class (FI_SEND, FI_RECV, FI_READ, FI_WRITE,
// FI_REMOTE_READ, FI_REMOTE_WRITE), plus a 64 KiB registered buffer each.
//
// env::open returns nullptr with the reason when the provider cannot be opened here; the tests
// print that reason and skip only then.
#ifndef COMPCNTR_TESTS_FABRIC_FIXTURE_HPP
#define COMPCNTR_TESTS_FABRIC_FIXTURE_HPP

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>

namespace fabtest {

enum cls : int { c_send, c_recv, c_read, c_write, c_rread, c_rwrite, n_cls };
inline constexpr std::uint64_t cls_flag[n_cls] = {FI_SEND,  FI_RECV,        FI_READ,
                                                  FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE};
inline constexpr const char* cls_name[n_cls] = {"send",  "recv",        "read",
                                                "write", "remote read", "remote write"};

inline constexpr std::size_t buf_size = 1 << 16;

struct endpoint {
  fid_ep* ep = nullptr;
  fid_cq* cq = nullptr;
  fid_cntr* cntr[n_cls] = {};  ///< libfabric's own counters (when requested)
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  std::uint64_t key = 0;
  fi_addr_t addr = FI_ADDR_UNSPEC;  ///< this endpoint in the shared AV
  char* buf = nullptr;              ///< buf_size bytes, registered

  std::uint64_t value(int c) { return fi_cntr_read(cntr[c]); }
  std::uint64_t errors(int c) { return fi_cntr_readerr(cntr[c]); }
};

struct options {
  fi_cq_format format = FI_CQ_FORMAT_DATA;
  bool provider_counters = true;
  std::size_t cq_size = 1024;
};

class env {
 public:
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  endpoint a, b;
  std::string provider;

  env() = default;
  env(const env&) = delete;
  env& operator=(const env&) = delete;
  ~env() {
    for (endpoint* e : {&a, &b}) {
      if (e->ep) fi_close(&e->ep->fid);
      if (e->mr) fi_close(&e->mr->fid);
      for (auto* c : e->cntr)
        if (c) fi_close(&c->fid);
      if (e->cq) fi_close(&e->cq->fid);
      std::free(e->buf);
    }
    if (av) fi_close(&av->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
  }

  /// The remote address of `offset` in `target`'s buffer (virtual address or offset, per mr_mode).
  std::uint64_t remote(const endpoint& target, std::size_t offset) const {
    const bool virt = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    return (virt ? reinterpret_cast<std::uint64_t>(target.buf) : 0) + offset;
  }

  /// A fresh operation context (FI_CONTEXT mode), valid until the env is destroyed.
  fi_context* ctx() { return &ctxs_.emplace_back(); }

  static std::unique_ptr<env> open(const std::string& prov, const options& o, std::string& why) {
    auto e = std::make_unique<env>();
    fi_info* hints = fi_allocinfo();
    if (!hints) return why = "fi_allocinfo failed", nullptr;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(prov.c_str());
    const bool ip = prov != "shm";
    int ret = fi_getinfo(FI_VERSION(1, 17), ip ? "127.0.0.1" : nullptr, nullptr, ip ? FI_SOURCE : 0,
                         hints, &e->info);
    fi_freeinfo(hints);
    if (ret) {
      e->info = nullptr;
      return why = "fi_getinfo(" + prov + ", FI_EP_RDM" + (ip ? ", 127.0.0.1" : "") +
                   "): " + fi_strerror(-ret),
             nullptr;
    }
    e->provider = e->info->fabric_attr->prov_name ? e->info->fabric_attr->prov_name : prov;
    auto err = [&why](const char* call, int r) {
      why = std::string(call) + ": " + fi_strerror(r < 0 ? -r : r);
      return nullptr;
    };
    if ((ret = fi_fabric(e->info->fabric_attr, &e->fabric, nullptr))) return err("fi_fabric", ret);
    if ((ret = fi_domain(e->fabric, e->info, &e->domain, nullptr))) return err("fi_domain", ret);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((ret = fi_av_open(e->domain, &av_attr, &e->av, nullptr))) return err("fi_av_open", ret);
    static std::uint64_t next_key = 1; // requested keys must differ within a domain
    for (endpoint* s : {&e->a, &e->b}) {
      fi_cq_attr cq_attr{};
      cq_attr.format = o.format;
      cq_attr.size = o.cq_size;
      if ((ret = fi_cq_open(e->domain, &cq_attr, &s->cq, nullptr))) return err("fi_cq_open", ret);
      if ((ret = fi_endpoint(e->domain, e->info, &s->ep, nullptr))) return err("fi_endpoint", ret);
      if ((ret = fi_ep_bind(s->ep, &e->av->fid, 0))) return err("fi_ep_bind(av)", ret);
      if ((ret = fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV)))
        return err("fi_ep_bind(cq)", ret);
      if (o.provider_counters)
        for (int c = 0; c < n_cls; ++c) {
          fi_cntr_attr ca{};
          ca.events = FI_CNTR_EVENTS_COMP;
          ca.wait_obj = FI_WAIT_NONE;
          if ((ret = fi_cntr_open(e->domain, &ca, &s->cntr[c], nullptr)))
            return err("fi_cntr_open", ret);
          if ((ret = fi_ep_bind(s->ep, &s->cntr[c]->fid, cls_flag[c])))
            return err("fi_ep_bind(cntr)", ret);
        }
      if ((ret = fi_enable(s->ep))) return err("fi_enable", ret);
      if (posix_memalign(reinterpret_cast<void**>(&s->buf), 4096, buf_size))
        return why = "posix_memalign", nullptr;
      std::memset(s->buf, 0, buf_size);
      if ((ret =
               fi_mr_reg(e->domain, s->buf, buf_size,
                         FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE,
                         0, next_key++, 0, &s->mr, nullptr)))
        return err("fi_mr_reg", ret);
      s->desc = fi_mr_desc(s->mr);
      s->key = fi_mr_key(s->mr);
    }
    for (endpoint* s : {&e->a, &e->b}) {
      char name[256];
      std::size_t len = sizeof name;
      if ((ret = fi_getname(&s->ep->fid, name, &len))) return err("fi_getname", ret);
      if (fi_av_insert(e->av, name, 1, &s->addr, 0, nullptr) != 1)
        return why = "fi_av_insert failed", nullptr;
    }
    return e;
  }

 private:
  std::deque<fi_context> ctxs_;
};

/// Calls `op` until it stops returning -FI_EAGAIN, calling `pump` between tries; fails (returns
/// the last value) after `limit`. Returns op's final result.
template <class Op, class Pump>
ssize_t post(Op op, Pump pump, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  ssize_t r;
  while ((r = op()) == -FI_EAGAIN && std::chrono::steady_clock::now() < deadline) pump();
  return r;
}

/// Calls `pump` until `done()` holds; false if `limit` passed first (a failure guard, never a
/// synchronisation: the tests wait for conditions, not for time).
template <class Done, class Pump>
bool until(Done done, Pump pump, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    pump();
  }
  return true;
}

} // namespace fabtest

#endif
