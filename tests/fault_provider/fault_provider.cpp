// The fault-injecting libfabric provider of the test suite (issue 22): a hook provider
// (libcompcntrfault-fi.so, provider name ofi_hook_compcntr_fault) that makes chosen libfabric
// calls fail on purpose. Not installed; tests/fault_provider/README.md says how to use it.
//
//   FI_PROVIDER_PATH=<this dir>:<hook dir> FI_HOOK='compcntr_fault;compcntr' program ...
//
// libfabric 1.17 installs the hooks of FI_HOOK (';'-separated) in order, each over the fabric
// the previous one returned (src/fabric.c, ofi_hook_install), so 'compcntr_fault;compcntr'
// puts this provider between the real provider and the compcntr hook: every call the hook (or
// the application) makes to the provider passes here first.
//
// Faults (COMPCNTR_FAULT, rules separated by ','):
//   SITE:N:CODE                    the N-th call of SITE in the process fails with CODE
//   SITE:random:SEED:PERMILLE:CODE each call of SITE fails with probability PERMILLE/1000
//                                  (a xorshift stream seeded with SEED and the site)
// CODE: EAGAIN ENOMEM EIO EINVAL EBUSY ENOSYS ETIMEDOUT ECANCELED (the call returns -FI_CODE
// without reaching the provider); EAVAIL / ETRUNC on cq_read, cq_readfrom, cq_sread (the call
// returns -FI_EAVAIL and the CQ's next fi_cq_readerr returns a made-up error entry: err FI_EIO
// or FI_ETRUNC, no context, olen 1 for ETRUNC) and EAVAIL on cntr_wait (-FI_EAVAIL); 'short' on
// cntr_read / cntr_readerr (that read returns the value minus one: a provider read that lags);
// 'lag' on the same sites (from that call on, in every counter, the first two reads after the
// value changed still return the value read before: each update is seen two reads late, after
// the provider's own signals of it, e.g. sockets' wait-set byte or fi_poll event);
// 'wrap32' on cntr_open (the counter opened is one a provider keeps in 32 bits, as sockets does:
// reads, set and seterr values and wait thresholds are taken mod 2^32; a set of 2^32 + 1 reads 1);
// 'shutdown' on eq_read / eq_sread (that read returns a made-up FI_SHUTDOWN event for the last
// endpoint bound to the EQ and still open, as if its peer had gone away; the provider knows
// nothing of it and its connection stays up; not injected where no endpoint is bound).
// The EQ sites (eq_open, eq_read, eq_sread) and the connection sites of FI_EP_MSG (passive_ep,
// listen, connect, accept) take the plain codes too.
//
// COMPCNTR_FAULT_PROV=NAME[,NAME...]: install only on fabrics of these providers (e.g. ofi_rxm:
// not on the tcp fabric rxm opens beneath itself, whose calls are libfabric-internal); default all.
//
// Report (COMPCNTR_FAULT_REPORT=FILE, appended; default stderr), at exit, one write per process:
//   compcntr-fault pid=P site=NAME calls=N          every site called at least once
//   compcntr-fault pid=P injected site=NAME call=N code=CODE
//
// How it sits on objects: like the compcntr hook (fabric_integration/hook/patch.hpp and its users) it keeps
// the provider's objects and points their ops tables at copies with a few entries replaced.
// Unlike it, a wrapper cannot find the provider's table through the object (a hook above may
// have replaced the table pointer again), so each object's record is found by its fid in a
// registry. Records are never freed (an address reused by a new object gets a new record; a hook
// above caches copies of our tables by address, which must not change meaning).
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_prov.h>

#include <fcntl.h>
#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// ---- sites ------------------------------------------------------------------------------------

// The list, not laid out by clang-format (it does not lay it out the same way twice).
// clang-format off
#define FAULT_SITES(X) \
  X(domain) X(endpoint) X(cq_open) X(cntr_open) X(av_open) X(mr_reg) X(mr_regv) X(mr_regattr) \
  X(av_insert) X(ep_bind) X(enable) X(recv) X(recvv) X(recvmsg) X(send) X(sendv) X(sendmsg) \
  X(inject) X(senddata) X(injectdata) X(trecv) X(trecvmsg) X(tsend) X(tsendmsg) X(tinject) \
  X(read) X(readmsg) X(write) X(writemsg) X(inject_write) X(cq_read) X(cq_readfrom) \
  X(cq_readerr) X(cq_sread) X(cntr_read) X(cntr_readerr) X(cntr_wait) X(eq_open) X(eq_read) \
  X(eq_sread) X(passive_ep) X(listen) X(connect) X(accept)
// clang-format on

enum site : int {
#define X(n) s_##n,
  FAULT_SITES(X)
#undef X
      n_sites
};
const char* const site_names[n_sites] = {
#define X(n) #n,
    FAULT_SITES(X)
#undef X
};

// ---- codes ------------------------------------------------------------------------------------

enum special : int { c_plain = 0, c_short = 1, c_wrap32 = 2, c_lag = 3, c_shutdown = 4 };
struct code_name {
  const char* name;
  int err; // FI_E* (positive), 0 for the value faults
  int special; // c_short / c_wrap32 / c_lag / c_shutdown
};
const code_name codes[] = {
    {"EAGAIN", FI_EAGAIN, c_plain},
    {"ENOMEM", FI_ENOMEM, c_plain},
    {"EIO", FI_EIO, c_plain},
    {"EINVAL", FI_EINVAL, c_plain},
    {"EBUSY", FI_EBUSY, c_plain},
    {"ENOSYS", FI_ENOSYS, c_plain},
    {"ETIMEDOUT", FI_ETIMEDOUT, c_plain},
    {"ECANCELED", FI_ECANCELED, c_plain},
    {"EAVAIL", FI_EAVAIL, c_plain},
    {"ETRUNC", FI_ETRUNC, c_plain},
    {"short", 0, c_short},
    {"lag", 0, c_lag},
    {"wrap32", 0, c_wrap32},
    {"shutdown", 0, c_shutdown},
};

struct rule {
  int site = -1;
  long nth = 0; // > 0: that call; 0: random
  std::uint64_t rng = 0;
  int permille = 0;
  int code = 0; // index into codes
};

constexpr int max_rules = 16;
rule g_rules[max_rules];
int g_nrules = 0;
std::atomic<long> g_calls[n_sites];
std::string g_report_path;
std::string g_provs; // COMPCNTR_FAULT_PROV, with ',' around each name

struct injection {
  int site;
  long call;
  int code;
};
constexpr int max_injections = 64;
injection g_inj[max_injections];
std::atomic<int> g_ninj{0};

std::mutex g_rng_mu;

// The fault for this call of `s`: an index into codes, or -1. A `shutdown` rule applies only
// where the caller can make the event up (shutdown_ok: an EQ read with an endpoint bound to the
// EQ and room for an fi_eq_cm_entry); elsewhere its call passes through and nothing is injected.
int fault_at(site s, bool shutdown_ok = false) noexcept {
  const long n = g_calls[s].fetch_add(1, std::memory_order_relaxed) + 1;
  for (int i = 0; i < g_nrules; ++i) {
    rule& r = g_rules[i];
    if (r.site != s) continue;
    if (codes[r.code].special == c_shutdown && !shutdown_ok) continue;
    bool hit = false;
    if (r.nth > 0) {
      hit = n == r.nth;
    } else {
      std::lock_guard lk(g_rng_mu);
      r.rng ^= r.rng << 13;
      r.rng ^= r.rng >> 7;
      r.rng ^= r.rng << 17;
      hit = static_cast<int>(r.rng % 1000) < r.permille;
    }
    if (!hit) continue;
    const int k = g_ninj.fetch_add(1, std::memory_order_relaxed);
    if (k < max_injections) g_inj[k] = {s, n, r.code};
    return r.code;
  }
  return -1;
}

bool parse_rule(const std::string& text, rule& r) {
  std::vector<std::string> f;
  std::size_t b = 0;
  for (;;) {
    const std::size_t e = text.find(':', b);
    f.push_back(text.substr(b, e == std::string::npos ? e : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  if (f.size() != 3 && f.size() != 5) return false;
  for (int s = 0; s < n_sites; ++s)
    if (f[0] == site_names[s]) r.site = s;
  r.code = -1;
  for (int c = 0; c < static_cast<int>(sizeof codes / sizeof codes[0]); ++c)
    if (strcasecmp(f.back().c_str(), codes[c].name) == 0) r.code = c;
  if (r.site < 0 || r.code < 0) return false;
  char* end = nullptr;
  if (f.size() == 3) {
    r.nth = std::strtol(f[1].c_str(), &end, 10);
    return *end == '\0' && r.nth > 0;
  }
  if (f[1] != "random") return false;
  const std::uint64_t seed = std::strtoull(f[2].c_str(), &end, 10);
  if (*end != '\0') return false;
  r.permille = static_cast<int>(std::strtol(f[3].c_str(), &end, 10));
  if (*end != '\0' || r.permille < 0 || r.permille > 1000) return false;
  r.rng = (seed ^ (0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(r.site + 1))) | 1;
  return true;
}

void read_config() {
  if (const char* p = std::getenv("COMPCNTR_FAULT_REPORT")) g_report_path = p;
  if (const char* p = std::getenv("COMPCNTR_FAULT_PROV"); p && *p)
    g_provs = std::string(",") + p + ",";
  const char* v = std::getenv("COMPCNTR_FAULT");
  if (!v || !*v) return;
  std::string all(v);
  std::size_t b = 0;
  while (b <= all.size()) {
    std::size_t e = all.find(',', b);
    if (e == std::string::npos) e = all.size();
    const std::string one = all.substr(b, e - b);
    rule r;
    if (!one.empty()) {
      if (g_nrules < max_rules && parse_rule(one, r))
        g_rules[g_nrules++] = r;
      else
        std::fprintf(stderr,
                     "compcntr-fault: rule '%s' ignored (SITE:N:CODE or "
                     "SITE:random:SEED:PERMILLE:CODE expected)\n",
                     one.c_str());
    }
    b = e + 1;
  }
}

std::atomic<bool> g_reported{false};
void write_report() noexcept {
  if (g_reported.exchange(true)) return;
  std::string out;
  char line[256];
  const int pid = static_cast<int>(getpid());
  for (int s = 0; s < n_sites; ++s) {
    const long n = g_calls[s].load();
    if (n == 0) continue;
    std::snprintf(line, sizeof line, "compcntr-fault pid=%d site=%s calls=%ld\n", pid,
                  site_names[s], n);
    out += line;
  }
  const int ni = std::min(g_ninj.load(), max_injections);
  for (int i = 0; i < ni; ++i) {
    std::snprintf(line, sizeof line, "compcntr-fault pid=%d injected site=%s call=%ld code=%s\n",
                  pid, site_names[g_inj[i].site], g_inj[i].call, codes[g_inj[i].code].name);
    out += line;
  }
  if (out.empty()) return;
  int fd = 2;
  if (!g_report_path.empty())
    fd = ::open(g_report_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  // One write(2) with O_APPEND: the reports of a program's processes never interleave.
  [[maybe_unused]] const ssize_t w = ::write(fd, out.data(), out.size());
  if (fd != 2) ::close(fd);
}

// ---- the registry of hooked objects ----------------------------------------------------------

struct rec {
  // the provider's tables, and our copies (object's table pointers point at the copies)
  const fi_ops* fid_orig = nullptr;
  fi_ops fid_copy{};
  const fi_ops_fabric* fabric_orig = nullptr;
  fi_ops_fabric fabric_copy{};
  const fi_ops_domain* dom_orig = nullptr;
  fi_ops_domain dom_copy{};
  const fi_ops_mr* mr_orig = nullptr;
  fi_ops_mr mr_copy{};
  const fi_ops_msg* msg_orig = nullptr;
  fi_ops_msg msg_copy{};
  const fi_ops_tagged* tagged_orig = nullptr;
  fi_ops_tagged tagged_copy{};
  const fi_ops_rma* rma_orig = nullptr;
  fi_ops_rma rma_copy{};
  const fi_ops_cq* cq_orig = nullptr;
  fi_ops_cq cq_copy{};
  const fi_ops_cntr* cntr_orig = nullptr;
  fi_ops_cntr cntr_copy{};
  const fi_ops_av* av_orig = nullptr;
  fi_ops_av av_copy{};
  const fi_ops_eq* eq_orig = nullptr;
  fi_ops_eq eq_copy{};
  const fi_ops_cm* cm_orig = nullptr; // endpoint or passive endpoint
  fi_ops_cm cm_copy{};
  // EQ: the endpoints bound to it and still open, in binding order (under g_eq_mu); a made-up
  // FI_SHUTDOWN names the last one
  std::vector<fid*> eq_eps;
  std::atomic<int> fake_err{0}; // CQ: a made-up error entry is pending (its err)
  bool wrap32 = false; // counter: kept in 32 bits, as sockets' are
  // counter, 'lag': the values last returned by read / readerr, and how many reads saw a newer
  // one (the third returns it)
  std::atomic<std::uint64_t> shown[2] = {0, 0};
  std::atomic<int> behind[2] = {0, 0};
};

std::mutex g_reg_mu;
std::mutex g_eq_mu; // every record's eq_eps
std::unordered_map<const fid*, rec*>& registry() {
  static auto* m = new std::unordered_map<const fid*, rec*>; // never destroyed
  return *m;
}
std::vector<rec*>& all_recs() { // every record ever made (reachable: not a leak)
  static auto* v = new std::vector<rec*>;
  return *v;
}

rec* find(const fid* f) noexcept {
  std::lock_guard lk(g_reg_mu);
  auto it = registry().find(f);
  return it == registry().end() ? nullptr : it->second;
}

rec* new_rec(const fid* f) noexcept {
  try {
    auto* r = new rec;
    std::lock_guard lk(g_reg_mu);
    all_recs().push_back(r);
    registry()[f] = r;
    return r;
  } catch (...) {
    return nullptr;
  }
}

// Copies `*slot` into `copy` (at most its size), points the object at the copy, records the
// original; `fill` replaces entries within the copied size.
template <class Ops, class Fill>
void patch(Ops*& slot, const Ops*& orig, Ops& copy, Fill fill) {
  if (slot == nullptr) return;
  orig = slot;
  const std::size_t size = slot->size < sizeof(Ops) ? slot->size : sizeof(Ops);
  std::memcpy(&copy, slot, size);
  copy.size = size;
  fill(copy, size);
  slot = &copy;
}
#define HAS(T, field, size) (offsetof(T, field) + sizeof(static_cast<T*>(nullptr)->field) <= (size))
#define WRAP(T, t, field, fn, size) \
  if (HAS(T, field, size) && t.field) t.field = fn

// A fault's return value: -FI_CODE (the value faults do not apply to int calls: no fault).
int err_of(int code) noexcept { return codes[code].err ? -codes[code].err : 0; }

// Sites that return int/ssize_t: the fault's error, or the provider's call.
#define INJECT(s) \
  if (const int c_ = fault_at(s); c_ >= 0 && err_of(c_)) return err_of(c_)

// ---- counters ---------------------------------------------------------------------------------

constexpr std::uint64_t k_mask32 = 0xffffffffu;

std::atomic<bool> g_lag[2]; // 'lag' in force for cntr_read [0] / cntr_readerr [1]

// What read (k 0) or readerr (k 1) returns, given the provider's value v and this call's fault.
std::uint64_t read_value(rec* r, int k, std::uint64_t v, int f) noexcept {
  if (r->wrap32) v &= k_mask32;
  if (f >= 0 && codes[f].special == c_lag) g_lag[k].store(true);
  if (g_lag[k].load()) {
    // The first two reads of a new value return the old one; the third returns the new one.
    const std::uint64_t old = r->shown[k].load();
    if (old != v) {
      if (r->behind[k].fetch_add(1) < 2) {
        v = old;
      } else {
        r->behind[k].store(0);
        r->shown[k].store(v);
      }
    }
  }
  if (f >= 0 && codes[f].special == c_short && v > 0) --v;
  return v;
}

uint64_t cntr_read(fid_cntr* c) {
  rec* r = find(&c->fid);
  const int f = fault_at(s_cntr_read);
  return read_value(r, 0, r->cntr_orig->read(c), f);
}
uint64_t cntr_readerr(fid_cntr* c) {
  rec* r = find(&c->fid);
  const int f = fault_at(s_cntr_readerr);
  return read_value(r, 1, r->cntr_orig->readerr(c), f);
}
int cntr_wait(fid_cntr* c, uint64_t threshold, int timeout) {
  rec* r = find(&c->fid);
  INJECT(s_cntr_wait);
  if (r->wrap32) threshold &= k_mask32;
  return r->cntr_orig->wait(c, threshold, timeout);
}

int cntr_set(fid_cntr* c, uint64_t value) {
  rec* r = find(&c->fid);
  return r->cntr_orig->set(c, r->wrap32 ? value & k_mask32 : value);
}
int cntr_seterr(fid_cntr* c, uint64_t value) {
  rec* r = find(&c->fid);
  return r->cntr_orig->seterr(c, r->wrap32 ? value & k_mask32 : value);
}

// ---- CQs --------------------------------------------------------------------------------------

// A fault of a CQ read: EAVAIL / ETRUNC leave a made-up error entry for the next readerr.
ssize_t cq_fault(rec* r, int c) noexcept {
  if (codes[c].err == FI_EAVAIL || codes[c].err == FI_ETRUNC) {
    r->fake_err.store(codes[c].err == FI_ETRUNC ? FI_ETRUNC : FI_EIO);
    return -FI_EAVAIL;
  }
  return err_of(c);
}
ssize_t cq_read(fid_cq* cq, void* buf, size_t count) {
  rec* r = find(&cq->fid);
  if (const int c = fault_at(s_cq_read); c >= 0 && cq_fault(r, c)) return cq_fault(r, c);
  return r->cq_orig->read(cq, buf, count);
}
ssize_t cq_readfrom(fid_cq* cq, void* buf, size_t count, fi_addr_t* src) {
  rec* r = find(&cq->fid);
  if (const int c = fault_at(s_cq_readfrom); c >= 0 && cq_fault(r, c)) return cq_fault(r, c);
  return r->cq_orig->readfrom(cq, buf, count, src);
}
ssize_t cq_sread(fid_cq* cq, void* buf, size_t count, const void* cond, int timeout) {
  rec* r = find(&cq->fid);
  if (const int c = fault_at(s_cq_sread); c >= 0 && cq_fault(r, c)) return cq_fault(r, c);
  return r->cq_orig->sread(cq, buf, count, cond, timeout);
}
ssize_t cq_readerr(fid_cq* cq, fi_cq_err_entry* buf, uint64_t flags) {
  rec* r = find(&cq->fid);
  INJECT(s_cq_readerr);
  if (const int e = r->fake_err.exchange(0); e != 0) {
    // Only the fields of the 1.0 entry and err_data_size (1.5) are written: the caller's
    // struct is at least that large.
    buf->op_context = nullptr;
    buf->flags = FI_RECV | FI_MSG;
    buf->len = 0;
    buf->buf = nullptr;
    buf->data = 0;
    buf->tag = 0;
    buf->olen = e == FI_ETRUNC ? 1 : 0;
    buf->err = e;
    buf->prov_errno = -e;
    buf->err_data = nullptr;
    buf->err_data_size = 0;
    return 1;
  }
  return r->cq_orig->readerr(cq, buf, flags);
}

// ---- endpoints --------------------------------------------------------------------------------

int ep_bind(fid* f, fid* bfid, uint64_t flags) {
  rec* r = find(f);
  INJECT(s_ep_bind);
  const int ret = r->fid_orig->bind(f, bfid, flags);
  if (ret == 0 && bfid != nullptr && bfid->fclass == FI_CLASS_EQ)
    if (rec* q = find(bfid)) { // an EQ of a fabric of ours
      std::lock_guard lk(g_eq_mu);
      try {
        q->eq_eps.push_back(f);
      } catch (...) {
      }
    }
  return ret;
}
int ep_close(fid* f) {
  rec* r = find(f);
  const int ret = r->fid_orig->close(f);
  if (ret == 0) { // no longer a candidate for a made-up FI_SHUTDOWN
    std::lock_guard lk(g_eq_mu);
    std::lock_guard lk2(g_reg_mu);
    for (rec* q : all_recs()) std::erase(q->eq_eps, f);
  }
  return ret;
}
int ep_control(fid* f, int command, void* arg) {
  rec* r = find(f);
  if (command == FI_ENABLE) INJECT(s_enable);
  const int ret = r->fid_orig->control(f, command, arg);
  // An alias endpoint (fi_ep_alias) may share the endpoint's ops tables, ours (sockets' does):
  // its calls then reach our wrappers with the alias's fid, which must find the endpoint's record.
  if (command == FI_ALIAS && ret == 0 && arg != nullptr) {
    const auto* al = static_cast<const struct fi_alias*>(arg);
    if (al->fid != nullptr && *al->fid != nullptr) {
      try {
        std::lock_guard lk(g_reg_mu);
        registry()[*al->fid] = r;
      } catch (...) {
      }
    }
  }
  return ret;
}

#define EP_CALL(table, s, fn, ...) \
  rec* r = find(&ep->fid);         \
  INJECT(s);                       \
  return r->table->fn(ep, __VA_ARGS__)

ssize_t m_recv(fid_ep* ep, void* b, size_t l, void* d, fi_addr_t a, void* c) {
  EP_CALL(msg_orig, s_recv, recv, b, l, d, a, c);
}
ssize_t m_recvv(fid_ep* ep, const iovec* v, void** d, size_t n, fi_addr_t a, void* c) {
  EP_CALL(msg_orig, s_recvv, recvv, v, d, n, a, c);
}
ssize_t m_recvmsg(fid_ep* ep, const fi_msg* m, uint64_t f) {
  EP_CALL(msg_orig, s_recvmsg, recvmsg, m, f);
}
ssize_t m_send(fid_ep* ep, const void* b, size_t l, void* d, fi_addr_t a, void* c) {
  EP_CALL(msg_orig, s_send, send, b, l, d, a, c);
}
ssize_t m_sendv(fid_ep* ep, const iovec* v, void** d, size_t n, fi_addr_t a, void* c) {
  EP_CALL(msg_orig, s_sendv, sendv, v, d, n, a, c);
}
ssize_t m_sendmsg(fid_ep* ep, const fi_msg* m, uint64_t f) {
  EP_CALL(msg_orig, s_sendmsg, sendmsg, m, f);
}
ssize_t m_inject(fid_ep* ep, const void* b, size_t l, fi_addr_t a) {
  EP_CALL(msg_orig, s_inject, inject, b, l, a);
}
ssize_t m_senddata(fid_ep* ep, const void* b, size_t l, void* d, uint64_t data, fi_addr_t a,
                   void* c) {
  EP_CALL(msg_orig, s_senddata, senddata, b, l, d, data, a, c);
}
ssize_t m_injectdata(fid_ep* ep, const void* b, size_t l, uint64_t data, fi_addr_t a) {
  EP_CALL(msg_orig, s_injectdata, injectdata, b, l, data, a);
}
ssize_t t_recv(fid_ep* ep, void* b, size_t l, void* d, fi_addr_t a, uint64_t t, uint64_t i,
               void* c) {
  EP_CALL(tagged_orig, s_trecv, recv, b, l, d, a, t, i, c);
}
ssize_t t_recvmsg(fid_ep* ep, const fi_msg_tagged* m, uint64_t f) {
  EP_CALL(tagged_orig, s_trecvmsg, recvmsg, m, f);
}
ssize_t t_send(fid_ep* ep, const void* b, size_t l, void* d, fi_addr_t a, uint64_t t, void* c) {
  EP_CALL(tagged_orig, s_tsend, send, b, l, d, a, t, c);
}
ssize_t t_sendmsg(fid_ep* ep, const fi_msg_tagged* m, uint64_t f) {
  EP_CALL(tagged_orig, s_tsendmsg, sendmsg, m, f);
}
ssize_t t_inject(fid_ep* ep, const void* b, size_t l, fi_addr_t a, uint64_t t) {
  EP_CALL(tagged_orig, s_tinject, inject, b, l, a, t);
}
ssize_t r_read(fid_ep* ep, void* b, size_t l, void* d, fi_addr_t a, uint64_t ad, uint64_t k,
               void* c) {
  EP_CALL(rma_orig, s_read, read, b, l, d, a, ad, k, c);
}
ssize_t r_readmsg(fid_ep* ep, const fi_msg_rma* m, uint64_t f) {
  EP_CALL(rma_orig, s_readmsg, readmsg, m, f);
}
ssize_t r_write(fid_ep* ep, const void* b, size_t l, void* d, fi_addr_t a, uint64_t ad, uint64_t k,
                void* c) {
  EP_CALL(rma_orig, s_write, write, b, l, d, a, ad, k, c);
}
ssize_t r_writemsg(fid_ep* ep, const fi_msg_rma* m, uint64_t f) {
  EP_CALL(rma_orig, s_writemsg, writemsg, m, f);
}
ssize_t r_inject(fid_ep* ep, const void* b, size_t l, fi_addr_t a, uint64_t ad, uint64_t k) {
  EP_CALL(rma_orig, s_inject_write, inject, b, l, a, ad, k);
}

// ---- connection management (FI_EP_MSG) --------------------------------------------------------

int cm_connect(fid_ep* ep, const void* addr, const void* param, size_t paramlen) {
  rec* r = find(&ep->fid);
  INJECT(s_connect);
  return r->cm_orig->connect(ep, addr, param, paramlen);
}
int cm_accept(fid_ep* ep, const void* param, size_t paramlen) {
  rec* r = find(&ep->fid);
  INJECT(s_accept);
  return r->cm_orig->accept(ep, param, paramlen);
}
int cm_listen(fid_pep* pep) {
  rec* r = find(&pep->fid);
  INJECT(s_listen);
  return r->cm_orig->listen(pep);
}

void install_ep(fid_ep* ep) {
  rec* r = new_rec(&ep->fid);
  if (!r) return;
  patch(ep->fid.ops, r->fid_orig, r->fid_copy, [](fi_ops& t, std::size_t size) {
    WRAP(fi_ops, t, close, ep_close, size);
    WRAP(fi_ops, t, bind, ep_bind, size);
    WRAP(fi_ops, t, control, ep_control, size);
  });
  patch(ep->cm, r->cm_orig, r->cm_copy, [](fi_ops_cm& t, std::size_t size) {
    WRAP(fi_ops_cm, t, connect, cm_connect, size);
    WRAP(fi_ops_cm, t, accept, cm_accept, size);
  });
  patch(ep->msg, r->msg_orig, r->msg_copy, [](fi_ops_msg& t, std::size_t size) {
    WRAP(fi_ops_msg, t, recv, m_recv, size);
    WRAP(fi_ops_msg, t, recvv, m_recvv, size);
    WRAP(fi_ops_msg, t, recvmsg, m_recvmsg, size);
    WRAP(fi_ops_msg, t, send, m_send, size);
    WRAP(fi_ops_msg, t, sendv, m_sendv, size);
    WRAP(fi_ops_msg, t, sendmsg, m_sendmsg, size);
    WRAP(fi_ops_msg, t, inject, m_inject, size);
    WRAP(fi_ops_msg, t, senddata, m_senddata, size);
    WRAP(fi_ops_msg, t, injectdata, m_injectdata, size);
  });
  patch(ep->tagged, r->tagged_orig, r->tagged_copy, [](fi_ops_tagged& t, std::size_t size) {
    WRAP(fi_ops_tagged, t, recv, t_recv, size);
    WRAP(fi_ops_tagged, t, recvmsg, t_recvmsg, size);
    WRAP(fi_ops_tagged, t, send, t_send, size);
    WRAP(fi_ops_tagged, t, sendmsg, t_sendmsg, size);
    WRAP(fi_ops_tagged, t, inject, t_inject, size);
  });
  patch(ep->rma, r->rma_orig, r->rma_copy, [](fi_ops_rma& t, std::size_t size) {
    WRAP(fi_ops_rma, t, read, r_read, size);
    WRAP(fi_ops_rma, t, readmsg, r_readmsg, size);
    WRAP(fi_ops_rma, t, write, r_write, size);
    WRAP(fi_ops_rma, t, writemsg, r_writemsg, size);
    WRAP(fi_ops_rma, t, inject, r_inject, size);
  });
}

// ---- AV, MR -----------------------------------------------------------------------------------

int av_insert(fid_av* av, const void* addr, size_t count, fi_addr_t* fi_addr, uint64_t flags,
              void* context) {
  rec* r = find(&av->fid);
  INJECT(s_av_insert);
  return r->av_orig->insert(av, addr, count, fi_addr, flags, context);
}

int mr_reg(fid* f, const void* buf, size_t len, uint64_t access, uint64_t offset,
           uint64_t requested_key, uint64_t flags, fid_mr** mr, void* context) {
  rec* r = find(f);
  INJECT(s_mr_reg);
  return r->mr_orig->reg(f, buf, len, access, offset, requested_key, flags, mr, context);
}
int mr_regv(fid* f, const iovec* iov, size_t count, uint64_t access, uint64_t offset,
            uint64_t requested_key, uint64_t flags, fid_mr** mr, void* context) {
  rec* r = find(f);
  INJECT(s_mr_regv);
  return r->mr_orig->regv(f, iov, count, access, offset, requested_key, flags, mr, context);
}
int mr_regattr(fid* f, const fi_mr_attr* attr, uint64_t flags, fid_mr** mr) {
  rec* r = find(f);
  INJECT(s_mr_regattr);
  return r->mr_orig->regattr(f, attr, flags, mr);
}

// ---- domains ----------------------------------------------------------------------------------

int d_cq_open(fid_domain* d, fi_cq_attr* attr, fid_cq** cq, void* context) {
  rec* r = find(&d->fid);
  INJECT(s_cq_open);
  const int ret = r->dom_orig->cq_open(d, attr, cq, context);
  if (ret != 0) return ret;
  if (rec* c = new_rec(&(*cq)->fid))
    patch((*cq)->ops, c->cq_orig, c->cq_copy, [](fi_ops_cq& t, std::size_t size) {
      WRAP(fi_ops_cq, t, read, cq_read, size);
      WRAP(fi_ops_cq, t, readfrom, cq_readfrom, size);
      WRAP(fi_ops_cq, t, readerr, cq_readerr, size);
      WRAP(fi_ops_cq, t, sread, cq_sread, size);
    });
  return 0;
}
int d_cntr_open(fid_domain* d, fi_cntr_attr* attr, fid_cntr** cntr, void* context) {
  rec* r = find(&d->fid);
  const int f = fault_at(s_cntr_open);
  if (f >= 0 && err_of(f)) return err_of(f);
  const int ret = r->dom_orig->cntr_open(d, attr, cntr, context);
  if (ret != 0) return ret;
  if (rec* c = new_rec(&(*cntr)->fid)) {
    c->wrap32 = f >= 0 && codes[f].special == c_wrap32;
    patch((*cntr)->ops, c->cntr_orig, c->cntr_copy, [](fi_ops_cntr& t, std::size_t size) {
      WRAP(fi_ops_cntr, t, read, cntr_read, size);
      WRAP(fi_ops_cntr, t, readerr, cntr_readerr, size);
      WRAP(fi_ops_cntr, t, wait, cntr_wait, size);
      WRAP(fi_ops_cntr, t, set, cntr_set, size);
      WRAP(fi_ops_cntr, t, seterr, cntr_seterr, size);
    });
  }
  return 0;
}
int d_av_open(fid_domain* d, fi_av_attr* attr, fid_av** av, void* context) {
  rec* r = find(&d->fid);
  INJECT(s_av_open);
  const int ret = r->dom_orig->av_open(d, attr, av, context);
  if (ret != 0) return ret;
  if (rec* c = new_rec(&(*av)->fid))
    patch((*av)->ops, c->av_orig, c->av_copy,
          [](fi_ops_av& t, std::size_t size) { WRAP(fi_ops_av, t, insert, av_insert, size); });
  return 0;
}
int d_endpoint(fid_domain* d, fi_info* info, fid_ep** ep, void* context) {
  rec* r = find(&d->fid);
  INJECT(s_endpoint);
  const int ret = r->dom_orig->endpoint(d, info, ep, context);
  if (ret == 0) install_ep(*ep);
  return ret;
}
int d_endpoint2(fid_domain* d, fi_info* info, fid_ep** ep, uint64_t flags, void* context) {
  rec* r = find(&d->fid);
  INJECT(s_endpoint);
  const int ret = r->dom_orig->endpoint2(d, info, ep, flags, context);
  if (ret == 0) install_ep(*ep);
  return ret;
}

void install_domain(fid_domain* d) {
  rec* r = new_rec(&d->fid);
  if (!r) return;
  patch(d->ops, r->dom_orig, r->dom_copy, [](fi_ops_domain& t, std::size_t size) {
    WRAP(fi_ops_domain, t, cq_open, d_cq_open, size);
    WRAP(fi_ops_domain, t, cntr_open, d_cntr_open, size);
    WRAP(fi_ops_domain, t, av_open, d_av_open, size);
    WRAP(fi_ops_domain, t, endpoint, d_endpoint, size);
    WRAP(fi_ops_domain, t, endpoint2, d_endpoint2, size);
  });
  patch(d->mr, r->mr_orig, r->mr_copy, [](fi_ops_mr& t, std::size_t size) {
    WRAP(fi_ops_mr, t, reg, mr_reg, size);
    WRAP(fi_ops_mr, t, regv, mr_regv, size);
    WRAP(fi_ops_mr, t, regattr, mr_regattr, size);
  });
}

int f_domain(fid_fabric* f, fi_info* info, fid_domain** d, void* context) {
  rec* r = find(&f->fid);
  INJECT(s_domain);
  const int ret = r->fabric_orig->domain(f, info, d, context);
  if (ret == 0) install_domain(*d);
  return ret;
}
int f_domain2(fid_fabric* f, fi_info* info, fid_domain** d, uint64_t flags, void* context) {
  rec* r = find(&f->fid);
  INJECT(s_domain);
  const int ret = r->fabric_orig->domain2(f, info, d, flags, context);
  if (ret == 0) install_domain(*d);
  return ret;
}

// ---- EQs, passive endpoints ------------------------------------------------------------------

// A made-up FI_SHUTDOWN for the last endpoint bound to the EQ that is still open, as if its peer
// had gone away (the provider knows nothing of it): event FI_SHUTDOWN, an fi_eq_cm_entry with
// fid = that endpoint and info NULL (fi_eq(3)'s FI_SHUTDOWN entry; it has no context field).
// shutdown_target: that endpoint, or nullptr when the fault cannot apply (no endpoint bound,
// no room for the entry: the call then passes through).
fid* shutdown_target(rec* r, size_t len) noexcept {
  if (len < sizeof(fi_eq_cm_entry)) return nullptr;
  std::lock_guard lk(g_eq_mu);
  return r->eq_eps.empty() ? nullptr : r->eq_eps.back();
}
ssize_t made_up_shutdown(fid* ep, uint32_t* event, void* buf) noexcept {
  if (event) *event = FI_SHUTDOWN;
  auto* e = static_cast<fi_eq_cm_entry*>(buf);
  e->fid = ep;
  e->info = nullptr;
  return static_cast<ssize_t>(sizeof(fi_eq_cm_entry));
}
ssize_t eq_read(fid_eq* eq, uint32_t* event, void* buf, size_t len, uint64_t flags) {
  rec* r = find(&eq->fid);
  fid* target = shutdown_target(r, len);
  if (const int c = fault_at(s_eq_read, target != nullptr); c >= 0) {
    if (codes[c].special == c_shutdown) return made_up_shutdown(target, event, buf);
    if (err_of(c)) return err_of(c);
  }
  return r->eq_orig->read(eq, event, buf, len, flags);
}
ssize_t eq_sread(fid_eq* eq, uint32_t* event, void* buf, size_t len, int timeout, uint64_t flags) {
  rec* r = find(&eq->fid);
  fid* target = shutdown_target(r, len);
  if (const int c = fault_at(s_eq_sread, target != nullptr); c >= 0) {
    if (codes[c].special == c_shutdown) return made_up_shutdown(target, event, buf);
    if (err_of(c)) return err_of(c);
  }
  return r->eq_orig->sread(eq, event, buf, len, timeout, flags);
}

int f_eq_open(fid_fabric* f, fi_eq_attr* attr, fid_eq** eq, void* context) {
  rec* r = find(&f->fid);
  INJECT(s_eq_open);
  const int ret = r->fabric_orig->eq_open(f, attr, eq, context);
  if (ret != 0) return ret;
  if (rec* q = new_rec(&(*eq)->fid))
    patch((*eq)->ops, q->eq_orig, q->eq_copy, [](fi_ops_eq& t, std::size_t size) {
      WRAP(fi_ops_eq, t, read, eq_read, size);
      WRAP(fi_ops_eq, t, sread, eq_sread, size);
    });
  return 0;
}
int f_passive_ep(fid_fabric* f, fi_info* info, fid_pep** pep, void* context) {
  rec* r = find(&f->fid);
  INJECT(s_passive_ep);
  const int ret = r->fabric_orig->passive_ep(f, info, pep, context);
  if (ret != 0) return ret;
  if (rec* p = new_rec(&(*pep)->fid))
    patch((*pep)->cm, p->cm_orig, p->cm_copy,
          [](fi_ops_cm& t, std::size_t size) { WRAP(fi_ops_cm, t, listen, cm_listen, size); });
  return 0;
}

int install_fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  fid_fabric* f = attr->fabric;
  const auto* prov = static_cast<const fi_provider*>(context); // the hooked provider
  if (!g_provs.empty() && (!prov || !prov->name ||
                           g_provs.find(std::string(",") + prov->name + ",") == std::string::npos))
    return -FI_ENOSYS; // not ours to hook: libfabric goes on with the next hook
  rec* r = new_rec(&f->fid);
  if (!r) return -FI_ENOMEM;
  patch(f->ops, r->fabric_orig, r->fabric_copy, [](fi_ops_fabric& t, std::size_t size) {
    WRAP(fi_ops_fabric, t, domain, f_domain, size);
    WRAP(fi_ops_fabric, t, domain2, f_domain2, size);
    WRAP(fi_ops_fabric, t, passive_ep, f_passive_ep, size);
    WRAP(fi_ops_fabric, t, eq_open, f_eq_open, size);
  });
  *fabric = f;
  return 0;
}

void cleanup() { write_report(); }

fi_provider g_prov = {
    .version = FI_VERSION(0, 1),
    .fi_version = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION),
    .context = {},
    .name = "ofi_hook_compcntr_fault",
    .getinfo = nullptr, // NULL getinfo: a hook provider
    .fabric = install_fabric,
    .cleanup = cleanup,
};

struct at_unload {
  ~at_unload() { write_report(); }
} g_at_unload;

} // namespace

extern "C" __attribute__((visibility("default"))) fi_provider* fi_prov_ini(void) {
  read_config();
  return &g_prov;
}
