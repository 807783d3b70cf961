// compcntr_bench: libfabric references (see fabric.hpp).
#include "fabric.hpp"

#include <cstring>
#include <map>
#include <memory>

#if COMPCNTR_BENCH_HAVE_FABRIC
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#endif

namespace bench::fabric {

bool built_with_libfabric() noexcept { return COMPCNTR_BENCH_HAVE_FABRIC != 0; }

#if COMPCNTR_BENCH_HAVE_FABRIC

namespace {

struct env : handles {
  ~env() {
    // Endpoint first, then what it was bound to, then the domain and fabric (fi_close order).
    if (ep) fi_close(&ep->fid);
    if (bound) fi_close(&bound->fid);
    if (unbound) fi_close(&unbound->fid);
    if (cq) fi_close(&cq->fid);
    if (av) fi_close(&av->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
  }
};

std::string err(const char* call, int ret) {
  return std::string(call) + ": " + fi_strerror(ret < 0 ? -ret : ret) + " (" + std::to_string(ret) +
         ")";
}

/// Opens the counter with a wait object when the provider allows one (fi_cntr_wait needs it; it
/// is what an application waiting on the counter would open), else without.
int open_cntr(fid_domain* domain, fid_cntr** c, std::string& wait_obj) {
  fi_cntr_attr attr{};
  attr.events = FI_CNTR_EVENTS_COMP;
  attr.wait_obj = FI_WAIT_UNSPEC;
  int ret = fi_cntr_open(domain, &attr, c, nullptr);
  wait_obj = "FI_WAIT_UNSPEC";
  if (ret) {
    attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cntr_open(domain, &attr, c, nullptr);
    wait_obj = "FI_WAIT_NONE";
  }
  return ret;
}

std::unique_ptr<env> open_env(const std::string& provider, std::string& why) {
  auto e = std::make_unique<env>();
  fi_info* hints = fi_allocinfo();
  if (!hints) {
    why = "fi_allocinfo failed";
    return nullptr;
  }
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG;
  hints->mode = FI_CONTEXT;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  const bool ip = provider != "shm";
  int ret = fi_getinfo(FI_VERSION(1, 17), ip ? "127.0.0.1" : nullptr, nullptr, ip ? FI_SOURCE : 0,
                       hints, &e->info);
  fi_freeinfo(hints);
  if (ret) {
    why = "fi_getinfo(" + provider + ", FI_EP_RDM" + (ip ? ", 127.0.0.1" : "") +
          "): " + fi_strerror(-ret);
    e->info = nullptr;
    return nullptr;
  }
  e->provider = e->info->fabric_attr->prov_name ? e->info->fabric_attr->prov_name : provider;
  if ((ret = fi_fabric(e->info->fabric_attr, &e->fabric, nullptr)))
    return why = err("fi_fabric", ret), nullptr;
  if ((ret = fi_domain(e->fabric, e->info, &e->domain, nullptr)))
    return why = err("fi_domain", ret), nullptr;
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if ((ret = fi_av_open(e->domain, &av_attr, &e->av, nullptr)))
    return why = err("fi_av_open", ret), nullptr;
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.size = 128;
  if ((ret = fi_cq_open(e->domain, &cq_attr, &e->cq, nullptr)))
    return why = err("fi_cq_open", ret), nullptr;
  if ((ret = open_cntr(e->domain, &e->bound, e->wait_obj)))
    return why = err("fi_cntr_open", ret), nullptr;
  std::string unused;
  if ((ret = open_cntr(e->domain, &e->unbound, unused)))
    return why = err("fi_cntr_open", ret), nullptr;
  if ((ret = fi_endpoint(e->domain, e->info, &e->ep, nullptr)))
    return why = err("fi_endpoint", ret), nullptr;
  if ((ret = fi_ep_bind(e->ep, &e->av->fid, 0))) return why = err("fi_ep_bind(av)", ret), nullptr;
  if ((ret = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV)))
    return why = err("fi_ep_bind(cq)", ret), nullptr;
  if ((ret = fi_ep_bind(e->ep, &e->bound->fid, FI_SEND | FI_RECV)))
    return why = err("fi_ep_bind(cntr, FI_SEND | FI_RECV)", ret), nullptr;
  if ((ret = fi_enable(e->ep))) return why = err("fi_enable", ret), nullptr;
  return e;
}

struct cache_entry {
  std::unique_ptr<env> e;
  std::string why;
};
std::map<std::string, cache_entry>& cache() {
  static std::map<std::string, cache_entry> c;
  return c;
}

/// One endpoint of a wait_pair with everything bound to it.
struct side_objs {
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_cntr* cntr = nullptr;
  fid_ep* ep = nullptr;
  void close() {
    if (ep) fi_close(&ep->fid);
    if (cntr) fi_close(&cntr->fid);
    if (cq) fi_close(&cq->fid);
    if (av) fi_close(&av->fid);
    *this = side_objs{};
  }
};

struct pair_env : wait_pair {
  side_objs s1, s2;
  ~pair_env() {
    s1.close();
    s2.close();
  }
};

std::string open_side(const handles& h, side_objs& s) {
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  int ret;
  if ((ret = fi_av_open(h.domain, &av_attr, &s.av, nullptr))) return err("fi_av_open", ret);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.size = 128;
  if ((ret = fi_cq_open(h.domain, &cq_attr, &s.cq, nullptr))) return err("fi_cq_open", ret);
  fi_cntr_attr attr{};
  attr.events = FI_CNTR_EVENTS_COMP;
  attr.wait_obj = FI_WAIT_UNSPEC;  // fi_cntr_wait needs a wait object
  if ((ret = fi_cntr_open(h.domain, &attr, &s.cntr, nullptr)))
    return err("fi_cntr_open(FI_WAIT_UNSPEC)", ret);
  if ((ret = fi_endpoint(h.domain, h.info, &s.ep, nullptr))) return err("fi_endpoint", ret);
  if ((ret = fi_ep_bind(s.ep, &s.av->fid, 0))) return err("fi_ep_bind(av)", ret);
  if ((ret = fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV)))
    return err("fi_ep_bind(cq)", ret);
  if ((ret = fi_ep_bind(s.ep, &s.cntr->fid, FI_SEND | FI_RECV)))
    return err("fi_ep_bind(cntr, FI_SEND | FI_RECV)", ret);
  if ((ret = fi_enable(s.ep))) return err("fi_enable", ret);
  return {};
}

std::unique_ptr<pair_env> open_pair(const std::string& provider, std::string& why) {
  const handles* h = get(provider, why);
  if (!h) return nullptr;
  auto p = std::make_unique<pair_env>();
  if (!(why = open_side(*h, p->s1)).empty() || !(why = open_side(*h, p->s2)).empty())
    return nullptr;
  p->a = p->s1.cntr;
  p->b = p->s2.cntr;
  p->provider = h->provider;
  p->wait_obj = "FI_WAIT_UNSPEC";
  return p;
}

struct pair_entry {
  std::unique_ptr<pair_env> p;
  std::string why;
};
std::map<std::string, pair_entry>& pair_cache() {
  static std::map<std::string, pair_entry> c;
  return c;
}

fid_cntr* pick(const handles* h, which w) { return w == which::bound ? h->bound : h->unbound; }

void describe(variant& v, const handles* h) {
  v.notes["provider"] = h->provider;
  v.notes["fabric"] = h->info->fabric_attr->name ? h->info->fabric_attr->name : "";
  v.notes["domain"] = h->info->domain_attr->name ? h->info->domain_attr->name : "";
  v.notes["wait_obj"] = h->wait_obj;
  v.notes["libfabric"] =
      std::to_string(FI_MAJOR(fi_version())) + "." + std::to_string(FI_MINOR(fi_version()));
}

// The timed loops: exactly the application's call (fi_cntr_read/fi_cntr_add are libfabric's
// static inline wrappers around the provider's ops table), result consumed.
__attribute__((noinline)) void loop_read(fid_cntr* c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) keep(fi_cntr_read(c));
}
__attribute__((noinline)) void loop_add(fid_cntr* c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) keep(static_cast<std::uint64_t>(fi_cntr_add(c, 1)));
}

} // namespace

const handles* get(const std::string& provider, std::string& why) {
  auto& c = cache();
  auto it = c.find(provider);
  if (it == c.end()) {
    cache_entry entry;
    entry.e = open_env(provider, entry.why);
    it = c.emplace(provider, std::move(entry)).first;
  }
  why = it->second.why;
  return it->second.e.get();
}

void close_all() {
  pair_cache().clear();  // endpoints of the pairs live on the cached domains
  cache().clear();
}

const wait_pair* get_wait_pair(const std::string& provider, std::string& why) {
  auto& c = pair_cache();
  auto it = c.find(provider);
  if (it == c.end()) {
    pair_entry entry;
    entry.p = open_pair(provider, entry.why);
    it = c.emplace(provider, std::move(entry)).first;
  }
  why = it->second.why;
  return it->second.p.get();
}

int cntr_set(fid_cntr* c, std::uint64_t v) { return fi_cntr_set(c, v); }
int cntr_add(fid_cntr* c, std::uint64_t v) { return fi_cntr_add(c, v); }
std::uint64_t cntr_read(fid_cntr* c) { return fi_cntr_read(c); }
int cntr_wait(fid_cntr* c, std::uint64_t threshold, int timeout_ms) {
  return fi_cntr_wait(c, threshold, timeout_ms);
}
std::string error_text(const char* call, int ret) { return err(call, ret); }

void describe(variant& v, const wait_pair& p) {
  v.notes["provider"] = p.provider;
  v.notes["wait_obj"] = p.wait_obj;
  v.notes["setup"] = "two endpoints, each with its own counter bound (FI_SEND | FI_RECV)";
  v.notes["libfabric"] =
      std::to_string(FI_MAJOR(fi_version())) + "." + std::to_string(FI_MINOR(fi_version()));
}

variant read_variant(const std::string& label, const std::string& provider, which w) {
  std::string why;
  const handles* h = get(provider, why);
  if (!h) return unavailable_variant(label, why);
  fid_cntr* cntr = pick(h, w);
  variant v = timed(label, [cntr](std::uint64_t n) { loop_read(cntr, n); });
  describe(v, h);
  return v;
}

variant add_variant(const std::string& label, const std::string& provider, which w) {
  std::string why;
  const handles* h = get(provider, why);
  if (!h) return unavailable_variant(label, why);
  fid_cntr* cntr = pick(h, w);
  variant v = timed(label, [cntr](std::uint64_t n) { loop_add(cntr, n); });
  describe(v, h);
  return v;
}

#else  // built without libfabric

const handles* get(const std::string&, std::string& why) {
  why = "built without libfabric (not found when meson configured the build)";
  return nullptr;
}
void close_all() {}
variant read_variant(const std::string& label, const std::string& provider, which) {
  std::string why;
  get(provider, why);
  return unavailable_variant(label, why);
}
variant add_variant(const std::string& label, const std::string& provider, which) {
  std::string why;
  get(provider, why);
  return unavailable_variant(label, why);
}
const wait_pair* get_wait_pair(const std::string& provider, std::string& why) {
  get(provider, why);
  return nullptr;
}
int cntr_set(fid_cntr*, std::uint64_t) { return -38; }
int cntr_add(fid_cntr*, std::uint64_t) { return -38; }
std::uint64_t cntr_read(fid_cntr*) { return 0; }
int cntr_wait(fid_cntr*, std::uint64_t, int) { return -38; }
std::string error_text(const char* call, int ret) {
  return std::string(call) + ": built without libfabric (" + std::to_string(ret) + ")";
}
void describe(variant&, const wait_pair&) {}

#endif

} // namespace bench::fabric
