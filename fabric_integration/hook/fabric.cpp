// The hook on fabrics (the provider's fabric() entry, install_fabric): domain, domain2 (install
// on the domains they open), trywait (hook counters armed here, the rest passed to the
// provider's trywait in one call), fid close (records).
#include "patch.hpp"

#include <rdma/fi_errno.h>

#include <cstdint>
#include <memory>

namespace compcntr_hook {
using namespace patching;
namespace {

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

} // namespace compcntr_hook
