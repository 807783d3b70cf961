// The hook on an endpoint's data calls (fi_ops_msg, fi_ops_rma, fi_ops_tagged, fi_ops_atomic):
// only the *msg calls are wrapped, to translate FI_TRIGGER contexts naming a hook counter (and,
// for ofi_compcntr, to hand FI_TRIGGER calls and emulated-RMA-event writes to the layer); on an
// endpoint whose default flags hold FI_TRIGGER every call with a context is. Every other entry
// stays the provider's function.
#include "patch.hpp"

#include "../cntr_base.hpp"

#include <rdma/fi_atomic.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>

#include <cstdint>
#include <tuple>

namespace compcntr_hook {
using namespace patching;
namespace {

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
  if (const layer_ops* l = layer(); l && ((flags & FI_TRIGGER) || l->emulates_rma_event(ep)))
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
// ofi_compcntr's FI_RMA_EVENT emulation (../ofi/ep.cpp, ../ofi/rma_event.cpp): the plain
// writes of an endpoint where it emulates the events carry remote CQ data that the target
// counts, and its reads are followed to their completion. Each plain call goes to the layer as
// one fi_msg_rma over its iovecs; flags ~0: the endpoint's default flags.
ssize_t layer_rma(const layer_ops* l, fid_ep* ep, const iovec* iov, void** desc, size_t count,
                  fi_addr_t peer, std::uint64_t addr, std::uint64_t key, void* context,
                  std::uint64_t flags, bool write) {
  std::uint64_t len = 0;
  for (size_t i = 0; i < count; ++i) len += iov[i].iov_len;
  fi_rma_iov riov{addr, len, key};
  fi_msg_rma m{iov, desc, count, peer, &riov, 1, context, 0};
  return l->rmamsg(ep, &m, flags, write);
}
ssize_t rma_write(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest,
                  std::uint64_t addr, std::uint64_t key, void* context) {
  if (const layer_ops* l = layer(); l && l->emulates_rma_event(ep)) {
    iovec iov{const_cast<void*>(buf), len};
    return layer_rma(l, ep, &iov, &desc, 1, dest, addr, key, context, ~std::uint64_t{0}, true);
  }
  return orig_of(ep->rma)->write(ep, buf, len, desc, dest, addr, key, context);
}
ssize_t rma_writev(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t dest,
                   std::uint64_t addr, std::uint64_t key, void* context) {
  if (const layer_ops* l = layer(); l && l->emulates_rma_event(ep))
    return layer_rma(l, ep, iov, desc, count, dest, addr, key, context, ~std::uint64_t{0}, true);
  return orig_of(ep->rma)->writev(ep, iov, desc, count, dest, addr, key, context);
}
ssize_t rma_inject_write(fid_ep* ep, const void* buf, size_t len, fi_addr_t dest,
                         std::uint64_t addr, std::uint64_t key) {
  if (const layer_ops* l = layer(); l && l->emulates_rma_event(ep)) {
    iovec iov{const_cast<void*>(buf), len};
    return layer_rma(l, ep, &iov, nullptr, 1, dest, addr, key, nullptr, FI_INJECT, true);
  }
  return orig_of(ep->rma)->inject(ep, buf, len, dest, addr, key);
}
ssize_t rma_read(fid_ep* ep, void* buf, size_t len, void* desc, fi_addr_t src, std::uint64_t addr,
                 std::uint64_t key, void* context) {
  if (const layer_ops* l = layer(); l && l->emulates_rma_event(ep)) {
    iovec iov{buf, len};
    return layer_rma(l, ep, &iov, &desc, 1, src, addr, key, context, ~std::uint64_t{0}, false);
  }
  return orig_of(ep->rma)->read(ep, buf, len, desc, src, addr, key, context);
}
ssize_t rma_readv(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t src,
                  std::uint64_t addr, std::uint64_t key, void* context) {
  if (const layer_ops* l = layer(); l && l->emulates_rma_event(ep))
    return layer_rma(l, ep, iov, desc, count, src, addr, key, context, ~std::uint64_t{0}, false);
  return orig_of(ep->rma)->readv(ep, iov, desc, count, src, addr, key, context);
}
void fill_rma(fi_ops_rma& t, std::size_t size) {
  if (layer()) {
    if (HOOK_HAS(fi_ops_rma, read, size) && t.read) t.read = rma_read;
    if (HOOK_HAS(fi_ops_rma, readv, size) && t.readv) t.readv = rma_readv;
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

} // namespace

void install_ep_data(fid_ep* ep, bool trigger_default) noexcept {
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

} // namespace compcntr_hook
