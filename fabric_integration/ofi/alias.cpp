// fi_ep_alias where the provider below refuses FI_ALIAS (rxm, rxd, shm): ofi_compcntr's alias
// endpoints (docs/ofi_compcntr.md). The endpoint records they post on: ep.cpp.
#include "ofi.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <new>
#include <unordered_map>

namespace compcntr_ofi {
namespace {

// fi_ep_alias where the provider refuses FI_ALIAS (rxm, rxd, shm): an endpoint of ours whose
// calls are those of its endpoint with the alias's operation flags; an alias with FI_TRIGGER
// makes every call with a context a triggered one (the context is a struct
// fi_triggered_context), as fi_trigger(3) and fabtests' fi_rdm_rma_trigger use it.
struct alias_ep {
  fid_ep ep{};
  fid_ep* base = nullptr;
  std::uint64_t flags = 0; // operation flags, FI_TRANSMIT/FI_RECV off
  bool rx = false;
  fi_ops fid_ops{};
  fi_ops_ep ops{};
  fi_ops_cm cm{};
  fi_ops_msg msg{};
  fi_ops_rma rma{};
  fi_ops_tagged tagged{};
  fi_ops_atomic atomic{};
};
std::unordered_map<fid_ep*, alias_ep*>& aliases() noexcept {
  static auto* m = new std::unordered_map<fid_ep*, alias_ep*>;
  return *m;
}
alias_ep* al(fid_ep* ep) noexcept { return reinterpret_cast<alias_ep*>(ep); }
alias_ep* al(fid* f) noexcept { return reinterpret_cast<alias_ep*>(f); }

// The flags of a call without flags of its own on the alias: the alias's flags, and the
// endpoint's FI_COMPLETION default (a selective-completion endpoint reports such a call only
// with it).
std::uint64_t call_flags(alias_ep* a) noexcept {
  std::uint64_t f = a->flags;
  std::lock_guard lk(mu());
  if (ep_st* e = find_ep(a->base)) f |= (a->rx ? e->rx_op_flags : e->tx_op_flags) & FI_COMPLETION;
  return f;
}

int alias_close(fid* f) {
  std::lock_guard lk(mu());
  aliases().erase(&al(f)->ep);
  delete al(f);
  return 0;
}
int alias_bind(fid*, fid*, std::uint64_t) { return -FI_ENOSYS; }
int alias_control(fid* f, int command, void* arg) {
  alias_ep* a = al(f);
  if (command == FI_GETOPSFLAG && arg != nullptr) {
    *static_cast<std::uint64_t*>(arg) = a->flags;
    return 0;
  }
  if (command == FI_SETOPSFLAG && arg != nullptr) {
    a->flags = *static_cast<std::uint64_t*>(arg) & ~(FI_TRANSMIT | FI_RECV);
    return 0;
  }
  return -FI_ENOSYS;
}
int alias_ops_open(fid*, const char*, std::uint64_t, void**, void*) { return -FI_ENOSYS; }
ssize_t alias_cancel(fid* f, void* context) { return fi_cancel(&al(f)->base->fid, context); }
int alias_getopt(fid* f, int level, int name, void* v, size_t* len) {
  return fi_getopt(&al(f)->base->fid, level, name, v, len);
}
int alias_setopt(fid* f, int level, int name, const void* v, size_t len) {
  return fi_setopt(&al(f)->base->fid, level, name, v, len);
}
int alias_getname(fid* f, void* addr, size_t* len) {
  return fi_getname(&al(f)->base->fid, addr, len);
}

// msg
ssize_t a_sendmsg(fid_ep* ep, const fi_msg* m, std::uint64_t flags) {
  return fi_sendmsg(al(ep)->base, m, flags | al(ep)->flags);
}
ssize_t a_sendv(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t dest,
                void* ctx) {
  fi_msg m{iov, desc, count, dest, ctx, 0};
  return fi_sendmsg(al(ep)->base, &m, call_flags(al(ep)));
}
ssize_t a_send(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest, void* ctx) {
  iovec iov{const_cast<void*>(buf), len};
  return a_sendv(ep, &iov, &desc, 1, dest, ctx);
}
ssize_t a_senddata(fid_ep* ep, const void* buf, size_t len, void* desc, std::uint64_t data,
                   fi_addr_t dest, void* ctx) {
  iovec iov{const_cast<void*>(buf), len};
  fi_msg m{&iov, &desc, 1, dest, ctx, data};
  return fi_sendmsg(al(ep)->base, &m, call_flags(al(ep)) | FI_REMOTE_CQ_DATA);
}
ssize_t a_inject(fid_ep* ep, const void* buf, size_t len, fi_addr_t dest) {
  return fi_inject(al(ep)->base, buf, len, dest);
}
ssize_t a_injectdata(fid_ep* ep, const void* buf, size_t len, std::uint64_t data, fi_addr_t dest) {
  return fi_injectdata(al(ep)->base, buf, len, data, dest);
}
ssize_t a_recvmsg(fid_ep* ep, const fi_msg* m, std::uint64_t flags) {
  return fi_recvmsg(al(ep)->base, m, flags | al(ep)->flags);
}
ssize_t a_recvv(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t src, void* ctx) {
  fi_msg m{iov, desc, count, src, ctx, 0};
  return fi_recvmsg(al(ep)->base, &m, call_flags(al(ep)));
}
ssize_t a_recv(fid_ep* ep, void* buf, size_t len, void* desc, fi_addr_t src, void* ctx) {
  iovec iov{buf, len};
  return a_recvv(ep, &iov, &desc, 1, src, ctx);
}

// rma
ssize_t a_writemsg(fid_ep* ep, const fi_msg_rma* m, std::uint64_t flags) {
  return fi_writemsg(al(ep)->base, m, flags | al(ep)->flags);
}
ssize_t a_writev(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t dest,
                 std::uint64_t addr, std::uint64_t key, void* ctx) {
  std::uint64_t len = 0;
  for (size_t i = 0; i < count; ++i) len += iov[i].iov_len;
  fi_rma_iov r{addr, len, key};
  fi_msg_rma m{iov, desc, count, dest, &r, 1, ctx, 0};
  return fi_writemsg(al(ep)->base, &m, call_flags(al(ep)));
}
ssize_t a_write(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest,
                std::uint64_t addr, std::uint64_t key, void* ctx) {
  iovec iov{const_cast<void*>(buf), len};
  return a_writev(ep, &iov, &desc, 1, dest, addr, key, ctx);
}
ssize_t a_writedata(fid_ep* ep, const void* buf, size_t len, void* desc, std::uint64_t data,
                    fi_addr_t dest, std::uint64_t addr, std::uint64_t key, void* ctx) {
  iovec iov{const_cast<void*>(buf), len};
  fi_rma_iov r{addr, len, key};
  fi_msg_rma m{&iov, &desc, 1, dest, &r, 1, ctx, data};
  return fi_writemsg(al(ep)->base, &m, call_flags(al(ep)) | FI_REMOTE_CQ_DATA);
}
ssize_t a_inject_write(fid_ep* ep, const void* buf, size_t len, fi_addr_t dest, std::uint64_t addr,
                       std::uint64_t key) {
  return fi_inject_write(al(ep)->base, buf, len, dest, addr, key);
}
ssize_t a_inject_writedata(fid_ep* ep, const void* buf, size_t len, std::uint64_t data,
                           fi_addr_t dest, std::uint64_t addr, std::uint64_t key) {
  return fi_inject_writedata(al(ep)->base, buf, len, data, dest, addr, key);
}
ssize_t a_readmsg(fid_ep* ep, const fi_msg_rma* m, std::uint64_t flags) {
  return fi_readmsg(al(ep)->base, m, flags | al(ep)->flags);
}
ssize_t a_readv(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t src,
                std::uint64_t addr, std::uint64_t key, void* ctx) {
  std::uint64_t len = 0;
  for (size_t i = 0; i < count; ++i) len += iov[i].iov_len;
  fi_rma_iov r{addr, len, key};
  fi_msg_rma m{iov, desc, count, src, &r, 1, ctx, 0};
  return fi_readmsg(al(ep)->base, &m, call_flags(al(ep)));
}
ssize_t a_read(fid_ep* ep, void* buf, size_t len, void* desc, fi_addr_t src, std::uint64_t addr,
               std::uint64_t key, void* ctx) {
  iovec iov{buf, len};
  return a_readv(ep, &iov, &desc, 1, src, addr, key, ctx);
}

// tagged
ssize_t a_tsendmsg(fid_ep* ep, const fi_msg_tagged* m, std::uint64_t flags) {
  return fi_tsendmsg(al(ep)->base, m, flags | al(ep)->flags);
}
ssize_t a_tsendv(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t dest,
                 std::uint64_t tag, void* ctx) {
  fi_msg_tagged m{iov, desc, count, dest, tag, 0, ctx, 0};
  return fi_tsendmsg(al(ep)->base, &m, call_flags(al(ep)));
}
ssize_t a_tsend(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest,
                std::uint64_t tag, void* ctx) {
  iovec iov{const_cast<void*>(buf), len};
  return a_tsendv(ep, &iov, &desc, 1, dest, tag, ctx);
}
ssize_t a_tsenddata(fid_ep* ep, const void* buf, size_t len, void* desc, std::uint64_t data,
                    fi_addr_t dest, std::uint64_t tag, void* ctx) {
  iovec iov{const_cast<void*>(buf), len};
  fi_msg_tagged m{&iov, &desc, 1, dest, tag, 0, ctx, data};
  return fi_tsendmsg(al(ep)->base, &m, call_flags(al(ep)) | FI_REMOTE_CQ_DATA);
}
ssize_t a_tinject(fid_ep* ep, const void* buf, size_t len, fi_addr_t dest, std::uint64_t tag) {
  return fi_tinject(al(ep)->base, buf, len, dest, tag);
}
ssize_t a_tinjectdata(fid_ep* ep, const void* buf, size_t len, std::uint64_t data, fi_addr_t dest,
                      std::uint64_t tag) {
  return fi_tinjectdata(al(ep)->base, buf, len, data, dest, tag);
}
ssize_t a_trecvmsg(fid_ep* ep, const fi_msg_tagged* m, std::uint64_t flags) {
  return fi_trecvmsg(al(ep)->base, m, flags | al(ep)->flags);
}
ssize_t a_trecvv(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t src,
                 std::uint64_t tag, std::uint64_t ignore, void* ctx) {
  fi_msg_tagged m{iov, desc, count, src, tag, ignore, ctx, 0};
  return fi_trecvmsg(al(ep)->base, &m, call_flags(al(ep)));
}
ssize_t a_trecv(fid_ep* ep, void* buf, size_t len, void* desc, fi_addr_t src, std::uint64_t tag,
                std::uint64_t ignore, void* ctx) {
  iovec iov{buf, len};
  return a_trecvv(ep, &iov, &desc, 1, src, tag, ignore, ctx);
}

// atomics: the *msg calls and the validity queries
ssize_t a_atomicmsg(fid_ep* ep, const fi_msg_atomic* m, std::uint64_t flags) {
  return fi_atomicmsg(al(ep)->base, m, flags | al(ep)->flags);
}
ssize_t a_fetch_atomicmsg(fid_ep* ep, const fi_msg_atomic* m, fi_ioc* resultv, void** result_desc,
                          size_t result_count, std::uint64_t flags) {
  return fi_fetch_atomicmsg(al(ep)->base, m, resultv, result_desc, result_count,
                            flags | al(ep)->flags);
}
ssize_t a_compare_atomicmsg(fid_ep* ep, const fi_msg_atomic* m, const fi_ioc* comparev,
                            void** compare_desc, size_t compare_count, fi_ioc* resultv,
                            void** result_desc, size_t result_count, std::uint64_t flags) {
  return fi_compare_atomicmsg(al(ep)->base, m, comparev, compare_desc, compare_count, resultv,
                              result_desc, result_count, flags | al(ep)->flags);
}
ssize_t a_atomic(fid_ep* ep, const void* buf, size_t count, void* desc, fi_addr_t dest,
                 std::uint64_t addr, std::uint64_t key, fi_datatype dt, fi_op op, void* ctx) {
  fi_ioc ioc{const_cast<void*>(buf), count};
  fi_rma_ioc r{addr, count, key};
  fi_msg_atomic m{&ioc, &desc, 1, dest, &r, 1, dt, op, ctx, 0};
  return fi_atomicmsg(al(ep)->base, &m, call_flags(al(ep)));
}
int a_writevalid(fid_ep* ep, fi_datatype dt, fi_op op, size_t* count) {
  return fi_atomicvalid(al(ep)->base, dt, op, count);
}
int a_readwritevalid(fid_ep* ep, fi_datatype dt, fi_op op, size_t* count) {
  return fi_fetch_atomicvalid(al(ep)->base, dt, op, count);
}
int a_compwritevalid(fid_ep* ep, fi_datatype dt, fi_op op, size_t* count) {
  return fi_compare_atomicvalid(al(ep)->base, dt, op, count);
}

template <class R, class... A>
R nosys(A...) {
  return -FI_ENOSYS;
}

} // namespace

int make_alias(fid_ep* base, struct fi_alias* arg) {
  if (arg == nullptr || arg->fid == nullptr) return -FI_EINVAL;
  if ((arg->flags & FI_TRANSMIT) && (arg->flags & FI_RECV)) return -FI_EINVAL;
  auto* a = new (std::nothrow) alias_ep;
  if (a == nullptr) return -FI_ENOMEM;
  a->base = base;
  a->rx = (arg->flags & FI_RECV) != 0;
  a->flags = arg->flags & ~(FI_TRANSMIT | FI_RECV);
  a->fid_ops.size = sizeof(fi_ops);
  a->fid_ops.close = alias_close;
  a->fid_ops.bind = alias_bind;
  a->fid_ops.control = alias_control;
  a->fid_ops.ops_open = alias_ops_open;
  a->ops.size = sizeof(fi_ops_ep);
  a->ops.cancel = alias_cancel;
  a->ops.getopt = alias_getopt;
  a->ops.setopt = alias_setopt;
  a->ops.tx_ctx = nosys<int, fid_ep*, int, fi_tx_attr*, fid_ep**, void*>;
  a->ops.rx_ctx = nosys<int, fid_ep*, int, fi_rx_attr*, fid_ep**, void*>;
  a->ops.rx_size_left = nosys<ssize_t, fid_ep*>;
  a->ops.tx_size_left = nosys<ssize_t, fid_ep*>;
  a->cm.size = sizeof(fi_ops_cm);
  a->cm.setname = nosys<int, fid*, void*, size_t>;
  a->cm.getname = alias_getname;
  a->cm.getpeer = nosys<int, fid_ep*, void*, size_t*>;
  a->cm.connect = nosys<int, fid_ep*, const void*, const void*, size_t>;
  a->cm.listen = nosys<int, fid_pep*>;
  a->cm.accept = nosys<int, fid_ep*, const void*, size_t>;
  a->cm.reject = nosys<int, fid_pep*, fid_t, const void*, size_t>;
  a->cm.shutdown = nosys<int, fid_ep*, std::uint64_t>;
  a->cm.join = nosys<int, fid_ep*, const void*, std::uint64_t, fid_mc**, void*>;
  a->msg = {sizeof(fi_ops_msg), a_recv,   a_recvv,    a_recvmsg,   a_send, a_sendv,
            a_sendmsg,          a_inject, a_senddata, a_injectdata};
  a->rma = {sizeof(fi_ops_rma), a_read,     a_readv,        a_readmsg,   a_write,
            a_writev,           a_writemsg, a_inject_write, a_writedata, a_inject_writedata};
  a->tagged = {sizeof(fi_ops_tagged),
               a_trecv,
               a_trecvv,
               a_trecvmsg,
               a_tsend,
               a_tsendv,
               a_tsendmsg,
               a_tinject,
               a_tsenddata,
               a_tinjectdata};
  a->atomic.size = sizeof(fi_ops_atomic);
  a->atomic.write = a_atomic;
  a->atomic.writev = nosys<ssize_t, fid_ep*, const fi_ioc*, void**, size_t, fi_addr_t,
                           std::uint64_t, std::uint64_t, fi_datatype, fi_op, void*>;
  a->atomic.writemsg = a_atomicmsg;
  a->atomic.inject = nosys<ssize_t, fid_ep*, const void*, size_t, fi_addr_t, std::uint64_t,
                           std::uint64_t, fi_datatype, fi_op>;
  a->atomic.readwrite = nosys<ssize_t, fid_ep*, const void*, size_t, void*, void*, void*, fi_addr_t,
                              std::uint64_t, std::uint64_t, fi_datatype, fi_op, void*>;
  a->atomic.readwritev =
      nosys<ssize_t, fid_ep*, const fi_ioc*, void**, size_t, fi_ioc*, void**, size_t, fi_addr_t,
            std::uint64_t, std::uint64_t, fi_datatype, fi_op, void*>;
  a->atomic.readwritemsg = a_fetch_atomicmsg;
  a->atomic.compwrite =
      nosys<ssize_t, fid_ep*, const void*, size_t, void*, const void*, void*, void*, void*,
            fi_addr_t, std::uint64_t, std::uint64_t, fi_datatype, fi_op, void*>;
  a->atomic.compwritev =
      nosys<ssize_t, fid_ep*, const fi_ioc*, void**, size_t, const fi_ioc*, void**, size_t, fi_ioc*,
            void**, size_t, fi_addr_t, std::uint64_t, std::uint64_t, fi_datatype, fi_op, void*>;
  a->atomic.compwritemsg = a_compare_atomicmsg;
  a->atomic.writevalid = a_writevalid;
  a->atomic.readwritevalid = a_readwritevalid;
  a->atomic.compwritevalid = a_compwritevalid;
  a->ep.fid.fclass = FI_CLASS_EP;
  a->ep.fid.context = base->fid.context;
  a->ep.fid.ops = &a->fid_ops;
  a->ep.ops = &a->ops;
  a->ep.cm = &a->cm;
  a->ep.msg = &a->msg;
  a->ep.rma = &a->rma;
  a->ep.tagged = &a->tagged;
  a->ep.atomic = &a->atomic;
  {
    std::lock_guard lk(mu());
    try {
      aliases()[&a->ep] = a;
    } catch (...) {
      delete a;
      return -FI_ENOMEM;
    }
  }
  *arg->fid = &a->ep.fid;
  return 0;
}

fid_ep* base_ep(fid_ep* ep) noexcept {
  std::lock_guard lk(mu());
  auto it = aliases().find(ep);
  return it == aliases().end() ? ep : it->second->base;
}

} // namespace compcntr_ofi
