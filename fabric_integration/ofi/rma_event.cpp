// ofi_compcntr's FI_RMA_EVENT emulation beyond writes, over providers without it (tcp;ofi_rxm):
// remote reads, and counters bound to memory regions. docs/ofi_compcntr.md, "FI_RMA_EVENT over
// tcp", says what is counted when, and what it costs.
//
// Remote reads. Nothing of a read reaches the target's counters on tcp, so the initiator tells
// the target, after the read completed (the data has left the target): a one-byte FI_ATOMIC_READ
// (a fetch atomic that changes nothing) at the read's first remote address and key, sent from a
// hidden endpoint of the layer bound to the application's AV. rxm counts a fetch atomic on the
// target's FI_REMOTE_READ counter only (rxm_handle_atomic_req: no CQ entry, no other counter),
// and the hidden endpoint has no counter of the application's: the read is counted exactly once,
// on the target's FI_REMOTE_READ counter, and nothing else moves on either side. To see the
// completion, the read is posted with a context of the layer (a note) and FI_COMPLETION; the
// entry goes on to the application with its own context if it asked for one (cq.cpp's keep).
// A read on a layer endpoint without a TX CQ, an AV or an RDM type (plain tcp) is not followed.
//
// Memory-region counters. fi_mr_bind(mr, cntr, FI_REMOTE_WRITE) on an emulating domain is
// the layer's (rxm has no MR binding): every write of a layer endpoint carries its first key's
// low 32 bits in its remote CQ data (ep.cpp), and the target's layer, dropping that CQ entry,
// counts the counters bound to the MR of that key. While such a binding exists, progress drains
// the RX CQs of the domain's endpoints (a counter wait sees the write without a CQ read by the
// application). FI_REMOTE_READ bindings stay -FI_ENOSYS (the atomic leaves no entry to see).
#include "ofi.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <new>
#include <unordered_set>

namespace compcntr_ofi {

fi_info* lower_info(const fi_info* info); // provider.cpp

namespace {

using compcntr_hook::orig_of;

// A read the layer follows, then its notification. Owned by the set it is in (reads(), due(),
// sent()) and freed when it leaves the last one: its read's CQ entry (read_completed), its
// notification's completion (reap), its endpoint's close (due and sent ones), or the close of
// the CQ its read completes on (rma_cq_closed: a read whose entry never came).
struct note {
  ep_st* e = nullptr;  // nullptr once its endpoint closed
  fid_cq* cq = nullptr; // where its read completes (the endpoint's TX CQ when posted)
  void* ctx = nullptr; // the context the read was posted with
  bool wants = false;  // the application gets the read's completion entry
  fi_addr_t dest = 0;
  std::uint64_t addr = 0, key = 0;
  std::uint8_t result = 0; // the byte the notification fetches
};

std::atomic<long> g_active{0};
std::unordered_set<note*>& reads() noexcept { // posted, completion not seen (under mu())
  static auto* s = new std::unordered_set<note*>;
  return *s;
}
std::deque<note*>& due() noexcept { // completed reads whose notification is to be posted
  static auto* d = new std::deque<note*>;
  return *d;
}
std::unordered_set<note*>& sent() noexcept { // notifications posted, completion not reaped
  static auto* s = new std::unordered_set<note*>;
  return *s;
}

// How long the posting of notifications may wait in total for an endpoint's first connection to
// a target (rxm answers -FI_EAGAIN while it connects; the target accepts in its own progress).
constexpr std::chrono::milliseconds k_connect_budget{5000};

void drop(note* n) noexcept {
  delete n;
  g_active.fetch_sub(1, std::memory_order_release);
}

// The hidden endpoint of `e`: the provider's own endpoint and CQ on the application's domain,
// bound to the application's AV (under mu()). 0 or -FI_E*.
int open_hidden(ep_st* e) noexcept {
  if (e->hidden) return 0;
  compcntr_hook::domain_state* hs = compcntr_hook::find_domain(e->dom->d);
  if (hs == nullptr || hs->orig == nullptr || e->hidden_info == nullptr || e->av == nullptr)
    return -FI_EINVAL;
  fi_cq_attr a{};
  a.size = 64;
  a.format = FI_CQ_FORMAT_CONTEXT;
  a.wait_obj = FI_WAIT_NONE;
  fid_cq* cq = nullptr;
  int r = hs->orig->cq_open(e->dom->d, &a, &cq, nullptr);
  if (r != 0) return r;
  fid_ep* ep = nullptr;
  r = hs->orig->endpoint(e->dom->d, e->hidden_info, &ep, nullptr);
  if (r == 0) r = fi_ep_bind(ep, &e->av->fid, 0);
  if (r == 0) r = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
  if (r == 0) r = fi_enable(ep);
  if (r != 0) {
    FI_WARN(&compcntr_hook::self(), FI_LOG_EP_CTRL,
            "no endpoint for remote-read notifications: %s\n", fi_strerror(-r));
    if (ep) fi_close(&ep->fid);
    fi_close(&cq->fid);
    return r;
  }
  e->hidden = ep;
  e->hidden_cq = cq;
  return 0;
}

// The notification of a completed read: a one-byte FI_ATOMIC_READ at its first remote address.
ssize_t post_note(note* n) noexcept {
  ep_st* e = n->e;
  if (const int r = open_hidden(e); r != 0) return r;
  fi_ioc ioc{&n->result, 1}; // not read for FI_ATOMIC_READ
  fi_rma_ioc rioc{n->addr, 1, n->key};
  fi_ioc res{&n->result, 1};
  void* res_desc[1] = {nullptr};
  fi_msg_atomic m{};
  m.msg_iov = &ioc;
  m.desc = nullptr;
  m.iov_count = 1;
  m.addr = n->dest;
  m.rma_iov = &rioc;
  m.rma_iov_count = 1;
  m.datatype = FI_UINT8;
  m.op = FI_ATOMIC_READ;
  m.context = n;
  return fi_fetch_atomicmsg(e->hidden, &m, &res, res_desc, 1, FI_COMPLETION);
}

// The completions of `e`'s notifications (under mu()). A failed one is a read the target does
// not count: said in the log.
void reap(ep_st* e) noexcept {
  if (e->hidden_cq == nullptr) return;
  for (;;) {
    fi_cq_entry ent[8];
    const ssize_t r = fi_cq_read(e->hidden_cq, ent, 8);
    if (r > 0) {
      for (ssize_t i = 0; i < r; ++i) {
        auto* n = static_cast<note*>(ent[i].op_context);
        if (sent().erase(n)) drop(n);
      }
      if (r == 8) continue;
      return;
    }
    if (r == -FI_EAVAIL) {
      fi_cq_err_entry ee{};
      if (fi_cq_readerr(e->hidden_cq, &ee, 0) <= 0) return;
      FI_WARN(&compcntr_hook::self(), FI_LOG_EP_DATA,
              "remote-read notification failed (%s): the target does not count that read\n",
              fi_strerror(ee.err));
      auto* n = static_cast<note*>(ee.op_context);
      if (sent().erase(n)) drop(n);
      continue;
    }
    return;
  }
}

} // namespace

std::atomic<long>& rma_active() noexcept { return g_active; }

ssize_t read_counted(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags) noexcept {
  const fi_ops_rma* o = orig_of(ep->rma);
  std::lock_guard lk(mu());
  ep_st* e = find_ep(ep);
  if (e == nullptr || e->av == nullptr || e->hidden_info == nullptr || e->tx_cq == nullptr ||
      msg->rma_iov_count == 0 || msg->rma_iov == nullptr)
    return o->readmsg(ep, msg, flags);
  auto* n = new (std::nothrow) note;
  if (n == nullptr) return -FI_ENOMEM;
  n->e = e;
  n->cq = e->tx_cq;
  n->ctx = msg->context;
  n->wants = !e->tx_selective || (flags & FI_COMPLETION);
  n->dest = msg->addr;
  n->addr = msg->rma_iov[0].addr;
  n->key = msg->rma_iov[0].key;
  try {
    reads().insert(n);
  } catch (...) {
    delete n;
    return -FI_ENOMEM;
  }
  fi_msg_rma m = *msg;
  m.context = n;
  const ssize_t r = o->readmsg(ep, &m, flags | FI_COMPLETION);
  if (r != 0) {
    reads().erase(n);
    delete n;
    return r;
  }
  ++e->reads;
  g_active.fetch_add(1, std::memory_order_release);
  return 0;
}

bool read_completed(fi_cq_tagged_entry& ent, bool error, bool* wants) noexcept {
  auto* n = static_cast<note*>(ent.op_context);
  if (reads().erase(n) == 0) return false;
  ent.op_context = n->ctx;
  *wants = n->wants || error;
  if (n->e == nullptr) { // its endpoint closed: counted off then
    delete n;
    return true;
  }
  --n->e->reads;
  if (error) {
    drop(n);
    return true;
  }
  try {
    due().push_back(n);
  } catch (...) {
    FI_WARN(&compcntr_hook::self(), FI_LOG_EP_DATA,
            "out of memory: the target does not count a remote read\n");
    drop(n);
  }
  return true;
}

void rma_post_due() noexcept {
  std::lock_guard lk(mu());
  using clock = std::chrono::steady_clock;
  while (!due().empty()) {
    note* n = due().front();
    try {
      sent().reserve(sent().size() + 1);
    } catch (...) {
      return; // the next round tries again
    }
    const ssize_t r = post_note(n);
    if (r == 0) {
      due().pop_front();
      sent().insert(n);
      continue;
    }
    if (r == -FI_EAGAIN) {
      // rxm connects the hidden endpoint on its first post: the notification waits for the
      // connection here (the target accepts in its progress), within k_connect_budget per
      // endpoint; afterwards -FI_EAGAIN leaves it to the next round.
      // The target may be an endpoint of this process (of this domain): its progress too.
      if (n->e->connect_wait >= k_connect_budget) return;
      const auto t0 = clock::now();
      reap(n->e);
      for (ep_st* o : eps_of(n->e->dom)) {
        if (o->rx_cq) cq_drain(o->rx_cq);
        if (o->tx_cq && o->tx_cq != o->rx_cq) cq_drain(o->tx_cq);
      }
      n->e->connect_wait += clock::now() - t0;
      continue;
    }
    FI_WARN(&compcntr_hook::self(), FI_LOG_EP_DATA,
            "remote-read notification refused (%s): the target does not count that read\n",
            fi_strerror(static_cast<int>(-r)));
    due().pop_front();
    drop(n);
  }
}

void rma_round() noexcept {
  std::lock_guard lk(mu());
  static thread_local std::vector<fid_cq*> cqs;
  cqs.clear();
  auto add = [](fid_cq* cq) noexcept {
    if (cq == nullptr || std::find(cqs.begin(), cqs.end(), cq) != cqs.end()) return;
    try {
      cqs.push_back(cq);
    } catch (...) {
    }
  };
  for (domain_st* d : domains()) {
    if (!d->emulate_rma_event) continue;
    bool mr_counted = false;
    for (const mr_rec& m : d->mrs) mr_counted = mr_counted || !m.rwrite.empty();
    for (ep_st* e : eps_of(d)) {
      if (e->reads > 0) add(e->tx_cq);  // followed reads complete there
      if (mr_counted) add(e->rx_cq);    // MR-counted writes arrive there
    }
  }
  for (fid_cq* cq : cqs) cq_drain(cq);
  rma_post_due();
  if (!sent().empty())
    for (domain_st* d : domains())
      if (d->emulate_rma_event)
        for (ep_st* e : eps_of(d))
          if (e->hidden) reap(e);
}

void rma_ep_opened(ep_st* e, const fi_info* info) noexcept {
  if (info == nullptr || info->ep_attr == nullptr || info->ep_attr->type != FI_EP_RDM) return;
  fi_info* low = lower_info(info);
  if (low == nullptr) return;
  low->caps |= FI_ATOMIC;
  if (low->tx_attr) low->tx_attr->caps |= FI_ATOMIC;
  // its own port (the application's endpoint may listen on a fixed one)
  if (low->src_addr && low->src_addrlen >= sizeof(sockaddr_in) &&
      static_cast<sockaddr*>(low->src_addr)->sa_family == AF_INET) {
    static_cast<sockaddr_in*>(low->src_addr)->sin_port = 0;
  } else if (low->src_addr && low->src_addrlen >= sizeof(sockaddr_in6) &&
             static_cast<sockaddr*>(low->src_addr)->sa_family == AF_INET6) {
    static_cast<sockaddr_in6*>(low->src_addr)->sin6_port = 0;
  } else {
    free(low->src_addr);
    low->src_addr = nullptr;
    low->src_addrlen = 0;
  }
  e->hidden_info = low;
}

void rma_ep_closing(ep_st* e) noexcept {
  std::lock_guard lk(mu());
  for (note* n : reads())
    if (n->e == e) {
      // its entry may still come (keep restores its context then); if none does, the note
      // goes when its CQ closes (rma_cq_closed)
      n->e = nullptr;
      g_active.fetch_sub(1, std::memory_order_release);
    }
  for (auto it = due().begin(); it != due().end();)
    if ((*it)->e == e) {
      drop(*it);
      it = due().erase(it);
    } else {
      ++it;
    }
  if (e->hidden) fi_close(&e->hidden->fid);
  if (e->hidden_cq) fi_close(&e->hidden_cq->fid);
  for (auto it = sent().begin(); it != sent().end();)
    if ((*it)->e == e) {
      drop(*it);
      it = sent().erase(it);
    } else {
      ++it;
    }
  e->hidden = nullptr;
  e->hidden_cq = nullptr;
  fi_freeinfo(e->hidden_info);
  e->hidden_info = nullptr;
}

void rma_cq_closed(fid_cq* cq) noexcept {
  std::lock_guard lk(mu());
  for (auto it = reads().begin(); it != reads().end();) {
    note* n = *it;
    if (n->cq != cq) {
      ++it;
      continue;
    }
    it = reads().erase(it);
    if (n->e != nullptr) { // a provider that let a bound CQ close: the read is not counted
      --n->e->reads;
      drop(n);
    } else {
      delete n; // counted off when its endpoint closed
    }
  }
}

// ---- memory-region counters -------------------------------------------------------------------

void remote_write_seen(domain_st* d, std::uint64_t data) noexcept {
  const std::uint64_t k = data & 0xffffffffULL;
  for (mr_rec& m : d->mrs)
    if (!m.rwrite.empty() && (fi_mr_key(m.mr) & 0xffffffffULL) == k)
      for (fid_cntr* c : m.rwrite) fi_cntr_add(c, 1);
}

void rma_mr_opened(fid_domain* d, fid_mr* mr) {
  domain_st* ds = find_domain(d);
  if (ds == nullptr || !ds->emulate_rma_event) return;
  std::lock_guard lk(mu());
  try {
    ds->mrs.push_back(mr_rec{mr, {}});
  } catch (...) { // its counters bind as the provider says (-FI_ENOSYS)
  }
}

void rma_mr_closing(fid_mr* mr) {
  std::lock_guard lk(mu());
  for (domain_st* d : domains())
    for (auto it = d->mrs.begin(); it != d->mrs.end(); ++it)
      if (it->mr == mr) {
        g_active.fetch_sub(static_cast<long>(it->rwrite.size()), std::memory_order_release);
        d->mrs.erase(it);
        return;
      }
}

bool rma_mr_bind(fid_mr* mr, fid_cntr* c, std::uint64_t flags, int* r) {
  std::lock_guard lk(mu());
  for (domain_st* d : domains())
    for (mr_rec& m : d->mrs) {
      if (m.mr != mr) continue;
      if (flags != FI_REMOTE_WRITE) return false; // the provider's answer
      if (std::find(m.rwrite.begin(), m.rwrite.end(), c) != m.rwrite.end()) {
        *r = 0;
        return true;
      }
      try {
        m.rwrite.push_back(c);
      } catch (...) {
        *r = -FI_ENOMEM;
        return true;
      }
      g_active.fetch_add(1, std::memory_order_release);
      *r = 0;
      return true;
    }
  return false;
}

void rma_cntr_closed(fid_cntr* c) noexcept {
  std::lock_guard lk(mu());
  for (domain_st* d : domains())
    for (mr_rec& m : d->mrs) {
      auto it = std::find(m.rwrite.begin(), m.rwrite.end(), c);
      if (it != m.rwrite.end()) {
        m.rwrite.erase(it);
        g_active.fetch_sub(1, std::memory_order_release);
      }
    }
}

} // namespace compcntr_ofi
