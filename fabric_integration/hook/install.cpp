// The hook's installation in place on fabrics, domains, endpoints, memory regions and poll sets
// (hook.hpp says why in place): the patched ops tables and the wrappers in them. The provider
// entry point and records are provider.cpp, counters hook_cntr.cpp.
#include "hook.hpp"

#include "../cntr_base.hpp"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_trigger.h>
#include <rdma/providers/fi_log.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace compcntr_hook {
namespace {
// ---- patched ops tables ----------------------------------------------------------------------

// Whether `field` lies inside a table of `size` bytes (older providers have shorter tables).
#define HOOK_HAS(T, field, size) \
  (offsetof(T, field) + sizeof(static_cast<T*>(nullptr)->field) <= (size))

enum kind : int {
  k_fabric,
  k_fabric_fid,
  k_domain,
  k_domain_fid,
  k_mr_ops,
  k_mr_fid,
  k_ep_fid,
  k_ep_ops,
  k_msg,
  k_rma,
  k_tagged,
  k_atomic,
  k_poll,
  k_msg_t,
  k_rma_t,
  k_tagged_t,
  k_atomic_t,
};

/// The patched copy of `orig` for kind K (made once per provider table; tables live forever).
/// `fill(copy, size)` replaces entries. A table that already is one of our copies is returned
/// unchanged, so installing twice is harmless. nullptr (and nothing changes) without memory.
// Every table the hook made, by address, with the provider table it copies (a table of one
// kind is never made from a table of another: base_of() first goes back to the provider's).
std::mutex g_tables_mu;
std::unordered_map<const void*, const void*>& our_tables() noexcept {
  static auto* m = new std::unordered_map<const void*, const void*>;
  return *m;
}
template <class Ops>
Ops* base_of(Ops* t) noexcept {
  std::lock_guard lk(g_tables_mu);
  auto it = our_tables().find(t);
  return it == our_tables().end() ? t : static_cast<Ops*>(const_cast<void*>(it->second));
}

template <class Ops, int K>
Ops* patch(Ops* orig, void (*fill)(Ops&, std::size_t)) noexcept {
  struct cache_t {
    std::mutex mu;
    std::vector<patched<Ops>*> tables;
  };
  static cache_t* cache = new cache_t; // never destroyed (objects may outlive static destruction)
  if (orig == nullptr) return nullptr;
  orig = base_of(orig); // a table of ours of another kind: start from the provider's
  std::lock_guard lk(cache->mu);
  for (patched<Ops>* p : cache->tables) {
    if (&p->ops == orig) return orig;
    if (p->orig == orig) return &p->ops;
  }
  auto* p = new (std::nothrow) patched<Ops>;
  if (p == nullptr) return nullptr;
  std::memset(&p->ops, 0, sizeof p->ops);
  const std::size_t size = orig->size < sizeof(Ops) ? orig->size : sizeof(Ops);
  std::memcpy(&p->ops, orig, size);
  p->ops.size = size;
  p->orig = orig;
  fill(p->ops, size);
  try {
    cache->tables.push_back(p);
    std::lock_guard lk2(g_tables_mu);
    our_tables()[&p->ops] = orig;
  } catch (...) {
    delete p;
    return nullptr;
  }
  return &p->ops;
}

template <class Ops, int K>
void install(Ops*& slot, void (*fill)(Ops&, std::size_t)) noexcept {
  if (slot == nullptr) return;
  if (Ops* t = patch<Ops, K>(slot, fill))
    slot = t;
  else
    FI_WARN(&self(), FI_LOG_CORE, "out of memory: an object is left unhooked\n");
}

// ---- triggered operations and deferred work ---------------------------------------------------

// FI_TRIGGER data calls carry a struct fi_triggered_context as their context. When its
// threshold counter is a hook counter, the provider must see its hidden counter instead (a
// provider such as sockets reads it as its own counter type). The hidden counter is written into
// the application's context and stays there: sockets reads the context again when the operation
// fires (an endpoint whose default flags hold FI_TRIGGER re-queues the operation through it), so
// restoring the application's pointer after the call would hand sockets the hook's counter then.
// Both counters stand for the same count (the hook keeps the hidden counter equal to the
// application's), so the application loses nothing; it must only not expect its pointer back in
// the context (fi_trigger(3) says nothing of the provider leaving it alone).
class trigger_swap {
 public:
  trigger_swap(const void* context, std::uint64_t flags) noexcept {
    if (!(flags & FI_TRIGGER) || context == nullptr) return;
    auto* t = static_cast<fi_triggered_context*>(const_cast<void*>(context));
    // event_type read as its integer: a C caller may store any value (a C++ load of one outside
    // the enum's range is undefined).
    const int event = compcntr_fabric::raw_enum(t->event_type);
    if (event != FI_TRIGGER_THRESHOLD || t->trigger.threshold.cntr == nullptr) return;
    hook_cntr* h = as_hook_cntr(&t->trigger.threshold.cntr->fid);
    if (h == nullptr) return;
    t->trigger.threshold.cntr = hidden_of(h);
    stats().triggers_translated.fetch_add(1, std::memory_order_relaxed);
  }
  trigger_swap(const trigger_swap&) = delete;
  trigger_swap& operator=(const trigger_swap&) = delete;
};

// fi_control(domain, FI_QUEUE_WORK, work): the triggering and completion counters are
// translated for the call (the provider copies them into work->context: sockets). The counter
// of an FI_OP_CNTR_ADD/SET work item is left alone: the provider applies it later through
// fi_cntr_add/fi_cntr_set, which a hook counter serves.
class work_swap {
 public:
  explicit work_swap(fi_deferred_work* w) noexcept : w_(w) {
    if (w_ == nullptr) return;
    trig_ = w_->triggering_cntr;
    comp_ = w_->completion_cntr;
    bool any = false;
    if (trig_ != nullptr)
      if (hook_cntr* h = as_hook_cntr(&trig_->fid)) w_->triggering_cntr = hidden_of(h), any = true;
    if (comp_ != nullptr)
      if (hook_cntr* h = as_hook_cntr(&comp_->fid)) w_->completion_cntr = hidden_of(h), any = true;
    if (any) stats().work_translated.fetch_add(1, std::memory_order_relaxed);
  }
  ~work_swap() {
    if (w_ == nullptr) return;
    w_->triggering_cntr = trig_;
    w_->completion_cntr = comp_;
  }
  work_swap(const work_swap&) = delete;
  work_swap& operator=(const work_swap&) = delete;

 private:
  fi_deferred_work* w_;
  fid_cntr* trig_ = nullptr;
  fid_cntr* comp_ = nullptr;
};

// ---- endpoints -------------------------------------------------------------------------------

std::mutex g_ep_mu; // the endpoint records below (control path only)

// FI_TRIGGER among an endpoint's default flags: transmit side, receive side (under g_ep_mu).
struct trig_state {
  bool tx = false, rx = false;
};
std::unordered_map<fid*, trig_state>& ep_trig() noexcept {
  static auto* m = new std::unordered_map<fid*, trig_state>;
  return *m;
}
bool trigger_default(fid* ep) noexcept {
  std::lock_guard lk(g_ep_mu);
  auto it = ep_trig().find(ep);
  return it != ep_trig().end() && (it->second.tx || it->second.rx);
}
void set_trigger_default(fid* ep, bool tx, bool rx) noexcept {
  std::lock_guard lk(g_ep_mu);
  try {
    if (tx || rx)
      ep_trig()[ep] = {tx, rx};
    else
      ep_trig().erase(ep);
  } catch (...) {
  }
}
void fill_ep_data(fid_ep* ep, bool trigger_default) noexcept;

fid_ep* ep_of(fid* f) noexcept { return reinterpret_cast<fid_ep*>(f); } // fid is the first member

// Endpoints enabled so far, and the hook counters bound to each endpoint before its fi_enable
// (see pending_add). Control path only.
std::unordered_map<fid*, bool>& ep_enabled() noexcept {
  static auto* m = new std::unordered_map<fid*, bool>;
  return *m;
}
/// Endpoints with a hook counter bound: only their enable and close exclude the progress thread
/// (control_guard). Objects a utility provider opens for itself (rxm's tcp endpoints: rxm opens
/// its core fabric with fi_fabric, so the hook is installed there too) never get a hook counter
/// (rxm's pass-through mode, off by default, would be the exception), and their binds, enables and
/// closes -- made by rxm's threads under rxm's locks -- never wait for the progress thread, which
/// itself may wait for those locks.
std::unordered_map<fid*, bool>& ep_has_cntr() noexcept {
  static auto* m = new std::unordered_map<fid*, bool>;
  return *m;
}
bool has_hook_cntr(fid* ep) noexcept {
  std::lock_guard lk(g_ep_mu);
  auto it = ep_has_cntr().find(ep);
  return it != ep_has_cntr().end() && it->second;
}
class ep_guard { // control_guard for endpoints with hook counters
 public:
  explicit ep_guard(bool needed) noexcept {
    if (needed) g_.emplace();
  }

 private:
  std::optional<control_guard> g_;
};

std::unordered_multimap<fid*, hook_cntr*>& ep_pending() noexcept {
  static auto* m = new std::unordered_multimap<fid*, hook_cntr*>;
  return *m;
}
void release_pending(fid* ep) noexcept {
  std::lock_guard lk(g_ep_mu);
  auto range = ep_pending().equal_range(ep);
  for (auto it = range.first; it != range.second; ++it) pending_add(it->second, -1);
  ep_pending().erase(ep);
}

int ep_bind(fid* f, fid* bfid, std::uint64_t flags) {
  const fi_ops* orig = orig_of(f->ops);
  if (hook_cntr* h = as_hook_cntr(bfid)) {
    control_guard g;
    fid_cntr* hidden = hidden_of(h);
    if (hidden == nullptr) return -FI_EINVAL;
    const int r = orig->bind(f, &hidden->fid, flags);
    if (r != 0) {
      // A refused bind may still have linked the endpoint into the provider's counter (util's
      // duplicate-binding check runs after the link): after that endpoint closes, progressing the
      // counter would walk a freed endpoint -- as it would without the hook, if the application
      // read it. The progress thread leaves such a counter to the application's calls for good.
      pending_add(h, 1);
    } else {
      note_bound(h);
      if (const layer_ops* l = layer()) l->ep_bound(ep_of(f), bfid, flags);
      std::lock_guard lk(g_ep_mu);
      try {
        ep_has_cntr()[f] = true;
      } catch (...) {
      }
      if (!ep_enabled()[f]) {
        try {
          ep_pending().emplace(f, h);
          pending_add(h, 1);
        } catch (...) { // no memory for the record: the thread may drive it early (as before)
        }
      }
    }
    return r;
  }
  const int r = orig->bind(f, bfid, flags);
  if (r == 0)
    if (const layer_ops* l = layer()) l->ep_bound(ep_of(f), bfid, flags);
  return r;
}

void fill_ep_data(fid_ep* ep) noexcept;

int ep_close(fid* f) {
  if (const layer_ops* l = layer()) l->ep_closing(ep_of(f));
  ep_guard g(has_hook_cntr(f));
  const int r = orig_of(f->ops)->close(f);
  if (r == 0) {
    release_pending(f);
    std::lock_guard lk(g_ep_mu);
    ep_enabled().erase(f);
    ep_has_cntr().erase(f);
    ep_trig().erase(f);
  }
  return r;
}

int ep_control(fid* f, int command, void* arg) {
  const fi_ops* orig = orig_of(f->ops);
  ep_guard g(has_hook_cntr(f));
  int r = orig->control(f, command, arg);
  if (r != 0)
    if (const layer_ops* l = layer()) return l->ep_control_refused(f, command, arg, r);
  if (r == 0 &&
      (f->fclass == FI_CLASS_EP || f->fclass == FI_CLASS_SEP || f->fclass == FI_CLASS_TX_CTX ||
       f->fclass == FI_CLASS_RX_CTX || f->fclass == FI_CLASS_SRX_CTX)) {
    if (command == FI_ENABLE) {
      fill_ep_data(ep_of(f)); // a provider may choose its data-path tables when enabling
      {
        std::lock_guard lk(g_ep_mu);
        try {
          ep_enabled()[f] = true;
        } catch (...) {
        }
      }
      release_pending(f);
    } else if (command == FI_ALIAS && arg != nullptr) {
      auto* alias = static_cast<struct fi_alias*>(arg);
      if (alias->fid != nullptr && *alias->fid != nullptr) {
        const bool trig = (alias->flags & FI_TRIGGER) != 0;
        install_ep(ep_of(*alias->fid), trig && !(alias->flags & FI_RECV),
                   trig && (alias->flags & FI_RECV));
      }
    } else if (command == FI_SETOPSFLAG && arg != nullptr) {
      const std::uint64_t flags = *static_cast<std::uint64_t*>(arg);
      bool tx = false, rx = false;
      {
        std::lock_guard lk(g_ep_mu);
        if (auto it = ep_trig().find(f); it != ep_trig().end())
          tx = it->second.tx, rx = it->second.rx;
      }
      ((flags & FI_RECV) ? rx : tx) = (flags & FI_TRIGGER) != 0;
      set_trigger_default(f, tx, rx);
      fill_ep_data(ep_of(f), tx || rx);
    }
  }
  return r;
}

void fill_ep_fid(fi_ops& t, std::size_t size) {
  if (HOOK_HAS(fi_ops, close, size) && t.close) t.close = ep_close;
  if (HOOK_HAS(fi_ops, bind, size) && t.bind) t.bind = ep_bind;
  if (HOOK_HAS(fi_ops, control, size) && t.control) t.control = ep_control;
}

int ep_tx_ctx(fid_ep* sep, int index, fi_tx_attr* attr, fid_ep** tx, void* context) {
  const int r = orig_of(sep->ops)->tx_ctx(sep, index, attr, tx, context);
  if (r == 0 && tx && *tx) install_ep(*tx, attr && (attr->op_flags & FI_TRIGGER), false);
  return r;
}
int ep_rx_ctx(fid_ep* sep, int index, fi_rx_attr* attr, fid_ep** rx, void* context) {
  const int r = orig_of(sep->ops)->rx_ctx(sep, index, attr, rx, context);
  if (r == 0 && rx && *rx) install_ep(*rx, false, attr && (attr->op_flags & FI_TRIGGER));
  return r;
}
void fill_ep_ops(fi_ops_ep& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_ep, tx_ctx, size) && t.tx_ctx) t.tx_ctx = ep_tx_ctx;
  if (HOOK_HAS(fi_ops_ep, rx_ctx, size) && t.rx_ctx) t.rx_ctx = ep_rx_ctx;
}

ssize_t msg_sendmsg(fid_ep* ep, const fi_msg* msg, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && (flags & FI_TRIGGER))
    return l->sendmsg(ep, msg, flags, false, nullptr);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->msg)->sendmsg(ep, msg, flags);
}
ssize_t msg_recvmsg(fid_ep* ep, const fi_msg* msg, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && (flags & FI_TRIGGER))
    return l->recvmsg(ep, msg, flags, false, nullptr);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->msg)->recvmsg(ep, msg, flags);
}
void fill_msg(fi_ops_msg& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_msg, sendmsg, size) && t.sendmsg) t.sendmsg = msg_sendmsg;
  if (HOOK_HAS(fi_ops_msg, recvmsg, size) && t.recvmsg) t.recvmsg = msg_recvmsg;
}

ssize_t rma_readmsg(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && (flags & FI_TRIGGER))
    return l->rmamsg(ep, msg, flags, false);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->rma)->readmsg(ep, msg, flags);
}
ssize_t rma_writemsg(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && ((flags & FI_TRIGGER) || l->emulates_rma_event(ep)))
    return l->rmamsg(ep, msg, flags, true);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->rma)->writemsg(ep, msg, flags);
}
// ofi_compcntr's FI_RMA_EVENT emulation (../ofi/ep.cpp): the plain writes of an endpoint
// where it emulates the events carry remote CQ data that the target counts.
ssize_t rma_write(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest,
                  std::uint64_t addr, std::uint64_t key, void* context) {
  if (const layer_ops* l = layer(); l && l->emulates_rma_event(ep)) {
    iovec iov{const_cast<void*>(buf), len};
    fi_rma_iov riov{addr, len, key};
    fi_msg_rma m{&iov, &desc, 1, dest, &riov, 1, context, 0};
    return l->rmamsg(ep, &m, ~std::uint64_t{0}, true); // ~0: the endpoint's default flags
  }
  return orig_of(ep->rma)->write(ep, buf, len, desc, dest, addr, key, context);
}
ssize_t rma_writev(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t dest,
                   std::uint64_t addr, std::uint64_t key, void* context) {
  if (const layer_ops* l = layer(); l && l->emulates_rma_event(ep)) {
    std::uint64_t len = 0;
    for (size_t i = 0; i < count; ++i) len += iov[i].iov_len;
    fi_rma_iov riov{addr, len, key};
    fi_msg_rma m{iov, desc, count, dest, &riov, 1, context, 0};
    return l->rmamsg(ep, &m, ~std::uint64_t{0}, true);
  }
  return orig_of(ep->rma)->writev(ep, iov, desc, count, dest, addr, key, context);
}
ssize_t rma_inject_write(fid_ep* ep, const void* buf, size_t len, fi_addr_t dest,
                         std::uint64_t addr, std::uint64_t key) {
  if (const layer_ops* l = layer(); l && l->emulates_rma_event(ep)) {
    iovec iov{const_cast<void*>(buf), len};
    fi_rma_iov riov{addr, len, key};
    fi_msg_rma m{&iov, nullptr, 1, dest, &riov, 1, nullptr, 0};
    return l->rmamsg(ep, &m, FI_INJECT, true);
  }
  return orig_of(ep->rma)->inject(ep, buf, len, dest, addr, key);
}
void fill_rma(fi_ops_rma& t, std::size_t size) {
  if (layer()) {
    if (HOOK_HAS(fi_ops_rma, write, size) && t.write) t.write = rma_write;
    if (HOOK_HAS(fi_ops_rma, writev, size) && t.writev) t.writev = rma_writev;
    if (HOOK_HAS(fi_ops_rma, inject, size) && t.inject) t.inject = rma_inject_write;
  }
  if (HOOK_HAS(fi_ops_rma, readmsg, size) && t.readmsg) t.readmsg = rma_readmsg;
  if (HOOK_HAS(fi_ops_rma, writemsg, size) && t.writemsg) t.writemsg = rma_writemsg;
}

ssize_t tagged_sendmsg(fid_ep* ep, const fi_msg_tagged* msg, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && (flags & FI_TRIGGER))
    return l->sendmsg(ep, nullptr, flags, true, msg);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->tagged)->sendmsg(ep, msg, flags);
}
ssize_t tagged_recvmsg(fid_ep* ep, const fi_msg_tagged* msg, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && (flags & FI_TRIGGER))
    return l->recvmsg(ep, nullptr, flags, true, msg);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->tagged)->recvmsg(ep, msg, flags);
}
void fill_tagged(fi_ops_tagged& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_tagged, sendmsg, size) && t.sendmsg) t.sendmsg = tagged_sendmsg;
  if (HOOK_HAS(fi_ops_tagged, recvmsg, size) && t.recvmsg) t.recvmsg = tagged_recvmsg;
}

ssize_t atomic_writemsg(fid_ep* ep, const fi_msg_atomic* msg, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && (flags & FI_TRIGGER))
    return l->atomicmsg(ep, msg, nullptr, nullptr, 0, nullptr, nullptr, 0, flags, 0);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->atomic)->writemsg(ep, msg, flags);
}
ssize_t atomic_readwritemsg(fid_ep* ep, const fi_msg_atomic* msg, fi_ioc* resultv,
                            void** result_desc, size_t result_count, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && (flags & FI_TRIGGER))
    return l->atomicmsg(ep, msg, nullptr, nullptr, 0, resultv, result_desc, result_count, flags, 1);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->atomic)->readwritemsg(ep, msg, resultv, result_desc, result_count, flags);
}
ssize_t atomic_compwritemsg(fid_ep* ep, const fi_msg_atomic* msg, const fi_ioc* comparev,
                            void** compare_desc, size_t compare_count, fi_ioc* resultv,
                            void** result_desc, size_t result_count, std::uint64_t flags) {
  if (const layer_ops* l = layer(); l && (flags & FI_TRIGGER))
    return l->atomicmsg(ep, msg, comparev, compare_desc, compare_count, resultv, result_desc,
                        result_count, flags, 2);
  trigger_swap s(msg ? msg->context : nullptr, flags);
  return orig_of(ep->atomic)
      ->compwritemsg(ep, msg, comparev, compare_desc, compare_count, resultv, result_desc,
                     result_count, flags);
}
void fill_atomic(fi_ops_atomic& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_atomic, writemsg, size) && t.writemsg) t.writemsg = atomic_writemsg;
  if (HOOK_HAS(fi_ops_atomic, readwritemsg, size) && t.readwritemsg)
    t.readwritemsg = atomic_readwritemsg;
  if (HOOK_HAS(fi_ops_atomic, compwritemsg, size) && t.compwritemsg)
    t.compwritemsg = atomic_compwritemsg;
}

// Endpoints whose default operation flags include FI_TRIGGER (tx_attr/rx_attr op_flags at
// creation, fi_ep_alias(..., FI_TRIGGER), FI_SETOPSFLAG): every data call with a context treats
// it as a struct fi_triggered_context, so every such call is wrapped, not only the *msg ones.
// Tables of this kind are installed only on such endpoints; the others keep the *msg-only
// tables (their fi_send, fi_write, ... are the provider's functions, no extra call).
template <class F>
struct trig_call;
template <class Ops, class R, class... A>
struct trig_call<R (*Ops::*)(fid_ep*, A...)> {
  template <Ops* fid_ep::* Table, R (*Ops::*Fn)(fid_ep*, A...)>
  static R call(fid_ep* ep, A... a) {
    // The context is the last argument of every data call that has one.
    const void* context = std::get<sizeof...(A) - 1>(std::tuple<A...>(a...));
    trigger_swap s(context, FI_TRIGGER);
    return (orig_of(ep->*Table)->*Fn)(ep, a...);
  }
};
#define HOOK_TRIG(T, table, field, size)                                                   \
  do {                                                                                     \
    if (HOOK_HAS(T, field, size) && t.field)                                               \
      t.field = &trig_call<decltype(&T::field)>::template call<&fid_ep::table, &T::field>; \
  } while (0)

void fill_msg_t(fi_ops_msg& t, std::size_t size) {
  fill_msg(t, size);
  HOOK_TRIG(fi_ops_msg, msg, recv, size);
  HOOK_TRIG(fi_ops_msg, msg, recvv, size);
  HOOK_TRIG(fi_ops_msg, msg, send, size);
  HOOK_TRIG(fi_ops_msg, msg, sendv, size);
  HOOK_TRIG(fi_ops_msg, msg, senddata, size);
}
void fill_rma_t(fi_ops_rma& t, std::size_t size) {
  fill_rma(t, size);
  HOOK_TRIG(fi_ops_rma, rma, read, size);
  HOOK_TRIG(fi_ops_rma, rma, readv, size);
  HOOK_TRIG(fi_ops_rma, rma, write, size);
  HOOK_TRIG(fi_ops_rma, rma, writev, size);
  HOOK_TRIG(fi_ops_rma, rma, writedata, size);
}
void fill_tagged_t(fi_ops_tagged& t, std::size_t size) {
  fill_tagged(t, size);
  HOOK_TRIG(fi_ops_tagged, tagged, recv, size);
  HOOK_TRIG(fi_ops_tagged, tagged, recvv, size);
  HOOK_TRIG(fi_ops_tagged, tagged, send, size);
  HOOK_TRIG(fi_ops_tagged, tagged, sendv, size);
  HOOK_TRIG(fi_ops_tagged, tagged, senddata, size);
}
void fill_atomic_t(fi_ops_atomic& t, std::size_t size) {
  fill_atomic(t, size);
  HOOK_TRIG(fi_ops_atomic, atomic, write, size);
  HOOK_TRIG(fi_ops_atomic, atomic, writev, size);
  HOOK_TRIG(fi_ops_atomic, atomic, readwrite, size);
  HOOK_TRIG(fi_ops_atomic, atomic, readwritev, size);
  HOOK_TRIG(fi_ops_atomic, atomic, compwrite, size);
  HOOK_TRIG(fi_ops_atomic, atomic, compwritev, size);
}

void fill_ep_data(fid_ep* ep, bool trigger_default) noexcept {
  if (trigger_default) {
    install<fi_ops_msg, k_msg_t>(ep->msg, fill_msg_t);
    install<fi_ops_rma, k_rma_t>(ep->rma, fill_rma_t);
    install<fi_ops_tagged, k_tagged_t>(ep->tagged, fill_tagged_t);
    install<fi_ops_atomic, k_atomic_t>(ep->atomic, fill_atomic_t);
  } else {
    install<fi_ops_msg, k_msg>(ep->msg, fill_msg);
    install<fi_ops_rma, k_rma>(ep->rma, fill_rma);
    install<fi_ops_tagged, k_tagged>(ep->tagged, fill_tagged);
    install<fi_ops_atomic, k_atomic>(ep->atomic, fill_atomic);
  }
}

void fill_ep_data(fid_ep* ep) noexcept { fill_ep_data(ep, trigger_default(&ep->fid)); }

// ---- memory regions --------------------------------------------------------------------------

int mr_bind(fid* f, fid* bfid, std::uint64_t flags) {
  const fi_ops* orig = orig_of(f->ops);
  if (hook_cntr* h = as_hook_cntr(bfid)) {
    control_guard g;
    fid_cntr* hidden = hidden_of(h);
    if (hidden == nullptr) return -FI_EINVAL;
    const int r = orig->bind(f, &hidden->fid, flags);
    if (r == 0) note_bound(h);
    return r;
  }
  return orig->bind(f, bfid, flags);
}
void fill_mr_fid(fi_ops& t, std::size_t size) {
  if (HOOK_HAS(fi_ops, bind, size) && t.bind) t.bind = mr_bind;
}
void install_mr(fid_mr* mr) noexcept {
  if (mr != nullptr) install<fi_ops, k_mr_fid>(mr->fid.ops, fill_mr_fid);
}

const fi_ops_mr* mr_orig(fid* f) noexcept { return orig_of(reinterpret_cast<fid_domain*>(f)->mr); }

int mr_reg(fid* f, const void* buf, size_t len, std::uint64_t access, std::uint64_t offset,
           std::uint64_t requested_key, std::uint64_t flags, fid_mr** mr, void* context) {
  const int r = mr_orig(f)->reg(f, buf, len, access, offset, requested_key, flags, mr, context);
  if (r == 0 && mr) install_mr(*mr);
  return r;
}
int mr_regv(fid* f, const iovec* iov, size_t count, std::uint64_t access, std::uint64_t offset,
            std::uint64_t requested_key, std::uint64_t flags, fid_mr** mr, void* context) {
  const int r = mr_orig(f)->regv(f, iov, count, access, offset, requested_key, flags, mr, context);
  if (r == 0 && mr) install_mr(*mr);
  return r;
}
int mr_regattr(fid* f, const fi_mr_attr* attr, std::uint64_t flags, fid_mr** mr) {
  const int r = mr_orig(f)->regattr(f, attr, flags, mr);
  if (r == 0 && mr) install_mr(*mr);
  return r;
}
void fill_mr_ops(fi_ops_mr& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_mr, reg, size) && t.reg) t.reg = mr_reg;
  if (HOOK_HAS(fi_ops_mr, regv, size) && t.regv) t.regv = mr_regv;
  if (HOOK_HAS(fi_ops_mr, regattr, size) && t.regattr) t.regattr = mr_regattr;
}

// ---- poll sets -------------------------------------------------------------------------------

fid* translate(fid* f) noexcept {
  if (hook_cntr* h = as_hook_cntr(f)) {
    fid_cntr* hidden = hidden_of(h);
    return hidden ? &hidden->fid : f;
  }
  return f;
}
int poll_add(fid_poll* p, fid* event_fid, std::uint64_t flags) {
  const int r = orig_of(p->ops)->poll_add(p, translate(event_fid), flags);
  if (r == 0)
    if (hook_cntr* h = as_hook_cntr(event_fid)) polled_add(h, 1);
  return r;
}
int poll_del(fid_poll* p, fid* event_fid, std::uint64_t flags) {
  const int r = orig_of(p->ops)->poll_del(p, translate(event_fid), flags);
  if (r == 0)
    if (hook_cntr* h = as_hook_cntr(event_fid)) polled_add(h, -1);
  return r;
}
// fi_poll: the provider's poll, then (progress thread) the hook counters in poll sets catch up
// with what that poll saw (pull_polled says why).
int poll_run(fid_poll* p, void** context, int count) {
  const int r = orig_of(p->ops)->poll(p, context, count);
  if (r > 0 && cfg().progress_thread) pull_polled();
  return r;
}
void fill_poll(fi_ops_poll& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_poll, poll, size) && t.poll) t.poll = poll_run;
  if (HOOK_HAS(fi_ops_poll, poll_add, size) && t.poll_add) t.poll_add = poll_add;
  if (HOOK_HAS(fi_ops_poll, poll_del, size) && t.poll_del) t.poll_del = poll_del;
}

// ---- domains ---------------------------------------------------------------------------------

fid_domain* dom_of(fid* f) noexcept { return reinterpret_cast<fid_domain*>(f); }

int dom_close(fid* f) {
  if (const layer_ops* l = layer()) l->domain_closing(dom_of(f));
  const int r = orig_of(f->ops)->close(f);
  if (r == 0) forget_domain(dom_of(f));
  return r;
}
int dom_control(fid* f, int command, void* arg) {
  const fi_ops* orig = orig_of(f->ops);
  if (const layer_ops* l = layer()) return l->domain_control(f, command, arg, orig);
  if (command == FI_QUEUE_WORK && arg != nullptr) {
    work_swap s(static_cast<fi_deferred_work*>(arg));
    return orig->control(f, command, arg);
  }
  return orig->control(f, command, arg);
}
void fill_domain_fid(fi_ops& t, std::size_t size) {
  if (HOOK_HAS(fi_ops, close, size) && t.close) t.close = dom_close;
  if (HOOK_HAS(fi_ops, control, size) && t.control) t.control = dom_control;
}

// Endpoints of a domain with the progress thread need FI_THREAD_SAFE (the thread drives them
// while the application calls them); install_domain records whether the domain got it.
fi_info* thread_safe_info(const fi_info* info) noexcept {
  if (!cfg().progress_thread || info == nullptr || info->domain_attr == nullptr ||
      info->domain_attr->threading == FI_THREAD_SAFE)
    return nullptr;
  fi_info* dup = fi_dupinfo(info);
  if (dup != nullptr) dup->domain_attr->threading = FI_THREAD_SAFE;
  return dup;
}

bool trig_tx(const fi_info* info) noexcept {
  return info && info->tx_attr && (info->tx_attr->op_flags & FI_TRIGGER);
}
bool trig_rx(const fi_info* info) noexcept {
  return info && info->rx_attr && (info->rx_attr->op_flags & FI_TRIGGER);
}

// ofi_compcntr: the provider below gets its own fi_info (layer_ops::lower_info).
struct lower_info_t {
  fi_info* dup = nullptr;
  fi_info* get(fi_info* info) noexcept {
    if (const layer_ops* l = layer()) dup = l->lower_info(info);
    return dup ? dup : info;
  }
  ~lower_info_t() { fi_freeinfo(dup); }
};
void ep_opened(fid_ep* ep, fid_domain* d, const fi_info* info) noexcept {
  if (const layer_ops* l = layer()) l->ep_opened(ep, d, info);
}

int dom_endpoint(fid_domain* d, fi_info* app_info, fid_ep** ep, void* context) {
  lower_info_t low;
  fi_info* info = low.get(app_info);
  fi_info* safe = thread_safe_info(info);
  int r = orig_of(d->ops)->endpoint(d, safe ? safe : info, ep, context);
  if (r != 0 && safe != nullptr) r = orig_of(d->ops)->endpoint(d, info, ep, context);
  fi_freeinfo(safe);
  if (r == 0 && ep && *ep)
    install_ep(*ep, trig_tx(info), trig_rx(info)), ep_opened(*ep, d, app_info);
  return r;
}
int dom_endpoint2(fid_domain* d, fi_info* app_info, fid_ep** ep, std::uint64_t flags,
                  void* context) {
  lower_info_t low;
  fi_info* info = low.get(app_info);
  fi_info* safe = thread_safe_info(info);
  int r = orig_of(d->ops)->endpoint2(d, safe ? safe : info, ep, flags, context);
  if (r != 0 && safe != nullptr) r = orig_of(d->ops)->endpoint2(d, info, ep, flags, context);
  fi_freeinfo(safe);
  if (r == 0 && ep && *ep)
    install_ep(*ep, trig_tx(info), trig_rx(info)), ep_opened(*ep, d, app_info);
  return r;
}
int dom_scalable_ep(fid_domain* d, fi_info* app_info, fid_ep** sep, void* context) {
  lower_info_t low;
  fi_info* info = low.get(app_info);
  const int r = orig_of(d->ops)->scalable_ep(d, info, sep, context);
  if (r == 0 && sep && *sep) install_ep(*sep, trig_tx(info), trig_rx(info));
  return r;
}
int dom_srx_ctx(fid_domain* d, fi_rx_attr* attr, fid_ep** rx, void* context) {
  const int r = orig_of(d->ops)->srx_ctx(d, attr, rx, context);
  if (r == 0 && rx && *rx) install_ep(*rx, false, attr && (attr->op_flags & FI_TRIGGER));
  return r;
}
int dom_poll_open(fid_domain* d, fi_poll_attr* attr, fid_poll** p) {
  const int r = orig_of(d->ops)->poll_open(d, attr, p);
  if (r == 0 && p && *p) install<fi_ops_poll, k_poll>((*p)->ops, fill_poll);
  return r;
}
int dom_cntr_open(fid_domain* d, fi_cntr_attr* attr, fid_cntr** cntr, void* context) {
  return cntr_open(d, attr, cntr, context);
}
int dom_cq_open(fid_domain* d, fi_cq_attr* attr, fid_cq** cq, void* context) {
  return layer()->cq_open(d, attr, cq, context, orig_of(d->ops));
}
void fill_domain(fi_ops_domain& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_domain, endpoint, size) && t.endpoint) t.endpoint = dom_endpoint;
  if (HOOK_HAS(fi_ops_domain, scalable_ep, size) && t.scalable_ep) t.scalable_ep = dom_scalable_ep;
  if (HOOK_HAS(fi_ops_domain, cntr_open, size) && t.cntr_open) t.cntr_open = dom_cntr_open;
  if (HOOK_HAS(fi_ops_domain, poll_open, size) && t.poll_open) t.poll_open = dom_poll_open;
  if (HOOK_HAS(fi_ops_domain, srx_ctx, size) && t.srx_ctx) t.srx_ctx = dom_srx_ctx;
  if (HOOK_HAS(fi_ops_domain, endpoint2, size) && t.endpoint2) t.endpoint2 = dom_endpoint2;
  if (layer() && HOOK_HAS(fi_ops_domain, cq_open, size) && t.cq_open) t.cq_open = dom_cq_open;
}

// ---- fabrics ---------------------------------------------------------------------------------

int fab_close(fid* f) {
  const int r = orig_of(f->ops)->close(f);
  if (r == 0) forget_fabric(reinterpret_cast<fid_fabric*>(f));
  return r;
}
void fill_fabric_fid(fi_ops& t, std::size_t size) {
  if (HOOK_HAS(fi_ops, close, size) && t.close) t.close = fab_close;
}

int open_domain(fid_fabric* f, fi_info* app_info, fid_domain** d, bool has_flags,
                std::uint64_t flags, void* context) {
  const fi_ops_fabric* orig = orig_of(f->ops);
  lower_info_t low;
  fi_info* info = low.get(app_info);
  auto call = [&](fi_info* i) {
    return has_flags ? orig->domain2(f, i, d, flags, context) : orig->domain(f, i, d, context);
  };
  fi_info* safe = thread_safe_info(info);
  int r = call(safe ? safe : info);
  bool thread_safe = safe != nullptr && r == 0;
  if (r != 0 && safe != nullptr) {
    FI_WARN(
        &self(), FI_LOG_DOMAIN,
        "the provider refused FI_THREAD_SAFE (%s): this domain's counters use caller progress\n",
        fi_strerror(-r));
    r = call(info);
  }
  fi_freeinfo(safe);
  if (r == 0 && d && *d) {
    if (info && info->domain_attr && info->domain_attr->threading == FI_THREAD_SAFE)
      thread_safe = true;
    install_domain(*d, find_fabric(f));
    if (domain_state* ds = find_domain(*d)) {
      ds->progress_thread = cfg().progress_thread && thread_safe && progress_thread_running();
      ds->auto_progress =
          info && info->domain_attr && info->domain_attr->data_progress == FI_PROGRESS_AUTO;
    }
    if (const layer_ops* l = layer()) l->domain_opened(*d, app_info);
  }
  return r;
}
int fab_domain(fid_fabric* f, fi_info* info, fid_domain** d, void* context) {
  return open_domain(f, info, d, false, 0, context);
}
int fab_domain2(fid_fabric* f, fi_info* info, fid_domain** d, std::uint64_t flags, void* context) {
  return open_domain(f, info, d, true, flags, context);
}

// fi_trywait on the hooked fabric: hook counters are armed here (hook_cntr.cpp), everything
// else -- the provider's CQs, EQs, counters, wait sets, plus the wait sets behind hook counters
// -- goes to the provider's trywait in one call.
int fab_trywait(fid_fabric* f, fid** fids, int count) {
  const fi_ops_fabric* orig = orig_of(f->ops);
  if (fids == nullptr || count <= 0) return orig->trywait(f, fids, count);
  bool ours = false;
  for (int i = 0; i < count && !ours; ++i)
    ours = fids[i] != nullptr && as_hook_cntr(fids[i]) != nullptr;
  if (!ours) return orig->trywait(f, fids, count);
  stats().trywaits.fetch_add(1, std::memory_order_relaxed);
  const int cap = 2 * count; // each hook counter may add its provider wait set
  std::unique_ptr<fid*[]> pass(new (std::nothrow) fid*[static_cast<std::size_t>(cap)]);
  if (!pass) return -FI_ENOMEM;
  int n = 0, ret = 0;
  for (int i = 0; i < count; ++i) {
    if (fids[i] == nullptr) return -FI_EINVAL;
    if (hook_cntr* h = as_hook_cntr(fids[i])) {
      const int r = cntr_trywait(h, pass.get(), cap, &n);
      if (r == -FI_EAGAIN)
        ret = r;
      else if (r != 0)
        return r;
    } else {
      pass[n++] = fids[i];
    }
  }
  if (n > 0) {
    const int r = orig->trywait(f, pass.get(), n);
    if (r != 0) return r;
  }
  return ret;
}

void fill_fabric(fi_ops_fabric& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_fabric, domain, size) && t.domain) t.domain = fab_domain;
  if (HOOK_HAS(fi_ops_fabric, domain2, size) && t.domain2) t.domain2 = fab_domain2;
  if (HOOK_HAS(fi_ops_fabric, trywait, size) && t.trywait) t.trywait = fab_trywait;
}

} // namespace

// ---- the fabric (the provider's fabric() entry) ----------------------------------------------

int install_fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  if (attr == nullptr || attr->fabric == nullptr || fabric == nullptr) return -FI_EINVAL;
  const auto* hprov = static_cast<const fi_provider*>(context);
  // The hooked provider's name (e.g. "ofi_rxm"); the fabric's own prov_name is not in the
  // fid. The core provider under a utility one is not visible here.
  const int r = install_fabric_on(attr->fabric, hprov && hprov->name ? hprov->name : "?");
  if (r == 0) *fabric = attr->fabric;
  return r;
}

int install_fabric_on(fid_fabric* f, const char* prov_name) noexcept {
  auto fs = std::unique_ptr<fabric_state>(new (std::nothrow) fabric_state);
  if (!fs) return -FI_ENOMEM;
  fs->fabric = f;
  fs->prov = nullptr;
  try {
    fs->prov_name = prov_name;
  } catch (...) {
    return -FI_ENOMEM;
  }
  fs->sockets = fs->prov_name == "sockets";
  fi_ops_fabric* ops = patch<fi_ops_fabric, k_fabric>(f->ops, fill_fabric);
  fi_ops* fid_ops = patch<fi_ops, k_fabric_fid>(f->fid.ops, fill_fabric_fid);
  if (ops == nullptr || fid_ops == nullptr) return -FI_ENOMEM; // nothing installed yet
  if (!add_fabric(std::move(fs))) return -FI_ENOMEM;
  f->ops = ops;
  f->fid.ops = fid_ops;
  stats().fabrics.fetch_add(1, std::memory_order_relaxed);
  if (cfg().progress_thread) progress_thread_start();
  return 0;
}

void install_domain(fid_domain* d, fabric_state* fs) noexcept {
  auto ds = std::unique_ptr<domain_state>(new (std::nothrow) domain_state);
  if (!ds) {
    FI_WARN(&self(), FI_LOG_DOMAIN, "out of memory: domain left unhooked\n");
    return;
  }
  ds->domain = d;
  ds->fabric = fs;
  fi_ops_domain* ops = patch<fi_ops_domain, k_domain>(d->ops, fill_domain);
  fi_ops* fid_ops = patch<fi_ops, k_domain_fid>(d->fid.ops, fill_domain_fid);
  fi_ops_mr* mr = d->mr ? patch<fi_ops_mr, k_mr_ops>(d->mr, fill_mr_ops) : nullptr;
  if (ops == nullptr || fid_ops == nullptr || (d->mr && mr == nullptr)) {
    FI_WARN(&self(), FI_LOG_DOMAIN, "out of memory: domain left unhooked\n");
    return;
  }
  ds->orig = orig_of(ops);
  if (!add_domain(std::move(ds))) {
    FI_WARN(&self(), FI_LOG_DOMAIN, "out of memory: domain left unhooked\n");
    return;
  }
  d->ops = ops;
  d->fid.ops = fid_ops;
  if (mr) d->mr = mr;
  stats().domains.fetch_add(1, std::memory_order_relaxed);
}

void install_ep(fid_ep* ep, bool trigger_tx, bool trigger_rx) noexcept {
  if (ep == nullptr) return;
  install<fi_ops, k_ep_fid>(ep->fid.ops, fill_ep_fid);
  install<fi_ops_ep, k_ep_ops>(ep->ops, fill_ep_ops);
  set_trigger_default(&ep->fid, trigger_tx, trigger_rx);
  fill_ep_data(ep, trigger_tx || trigger_rx);
}

} // namespace compcntr_hook
