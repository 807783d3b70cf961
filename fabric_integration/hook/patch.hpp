// The hook's patched ops tables (hook.hpp says why in place): one copy per provider table and
// kind, made once and kept forever, with some entries replaced by a fill function. Internal to
// the hook machinery (fabric.cpp, domain.cpp, ep.cpp, ep_data.cpp, mr.cpp, poll.cpp).
#ifndef COMPCNTR_FABRIC_HOOK_PATCH_HPP
#define COMPCNTR_FABRIC_HOOK_PATCH_HPP

#include "hook.hpp"

#include <rdma/providers/fi_log.h>

#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace compcntr_hook::patching {

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
inline std::mutex& tables_mu() noexcept {
  static auto* m = new std::mutex;
  return *m;
}
inline std::unordered_map<const void*, const void*>& our_tables() noexcept {
  static auto* m = new std::unordered_map<const void*, const void*>;
  return *m;
}
template <class Ops>
Ops* base_of(Ops* t) noexcept {
  std::lock_guard lk(tables_mu());
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
    std::lock_guard lk2(tables_mu());
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

/// ofi_compcntr: the provider below gets its own fi_info (layer_ops::lower_info) when a domain or
/// endpoint is opened; the hook passes the application's.
struct lower_info_t {
  fi_info* dup = nullptr;
  fi_info* get(fi_info* info) noexcept {
    if (const layer_ops* l = layer()) dup = l->lower_info(info);
    return dup ? dup : info;
  }
  lower_info_t() = default;
  lower_info_t(const lower_info_t&) = delete;
  lower_info_t& operator=(const lower_info_t&) = delete;
  ~lower_info_t() { fi_freeinfo(dup); }
};

} // namespace compcntr_hook::patching

#endif
