// The hook on memory regions: the domain's fi_mr_reg / regv / regattr install on what they
// return; an MR's fid bind binds a hook counter's hidden provider counter.
#include "patch.hpp"

#include <cstdint>

namespace compcntr_hook {
using namespace patching;
namespace {

int mr_bind(fid* f, fid* bfid, std::uint64_t flags) {
  const fi_ops* orig = orig_of(f->ops);
  if (hook_cntr* h = as_hook_cntr(bfid)) {
    if (const layer_ops* l = layer(); l && l->mr_bind) {
      int r = 0;
      if (l->mr_bind(reinterpret_cast<fid_mr*>(f), reinterpret_cast<fid_cntr*>(bfid), flags, &r))
        return r;
    }
    control_guard g;
    return bind_hidden(orig, f, h, flags);
  }
  return orig->bind(f, bfid, flags);
}
// ofi_compcntr records the MRs of its domains (MR-bound counters it counts itself).
int mr_close(fid* f) {
  const fi_ops* orig = orig_of(f->ops);
  if (const layer_ops* l = layer(); l && l->mr_closing) l->mr_closing(reinterpret_cast<fid_mr*>(f));
  return orig->close(f);
}
void fill_mr_fid(fi_ops& t, std::size_t size) {
  if (HOOK_HAS(fi_ops, bind, size) && t.bind) t.bind = mr_bind;
  if (layer() && HOOK_HAS(fi_ops, close, size) && t.close) t.close = mr_close;
}
void install_mr(fid* d, fid_mr* mr) noexcept {
  if (mr == nullptr) return;
  install<fi_ops, k_mr_fid>(mr->fid.ops, fill_mr_fid);
  if (const layer_ops* l = layer(); l && l->mr_opened)
    l->mr_opened(reinterpret_cast<fid_domain*>(d), mr);
}

const fi_ops_mr* mr_orig(fid* f) noexcept { return orig_of(reinterpret_cast<fid_domain*>(f)->mr); }

int mr_reg(fid* f, const void* buf, size_t len, std::uint64_t access, std::uint64_t offset,
           std::uint64_t requested_key, std::uint64_t flags, fid_mr** mr, void* context) {
  const int r = mr_orig(f)->reg(f, buf, len, access, offset, requested_key, flags, mr, context);
  if (r == 0 && mr) install_mr(f, *mr);
  return r;
}
int mr_regv(fid* f, const iovec* iov, size_t count, std::uint64_t access, std::uint64_t offset,
            std::uint64_t requested_key, std::uint64_t flags, fid_mr** mr, void* context) {
  const int r = mr_orig(f)->regv(f, iov, count, access, offset, requested_key, flags, mr, context);
  if (r == 0 && mr) install_mr(f, *mr);
  return r;
}
int mr_regattr(fid* f, const fi_mr_attr* attr, std::uint64_t flags, fid_mr** mr) {
  const int r = mr_orig(f)->regattr(f, attr, flags, mr);
  if (r == 0 && mr) install_mr(f, *mr);
  return r;
}
void fill_mr_ops(fi_ops_mr& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_mr, reg, size) && t.reg) t.reg = mr_reg;
  if (HOOK_HAS(fi_ops_mr, regv, size) && t.regv) t.regv = mr_regv;
  if (HOOK_HAS(fi_ops_mr, regattr, size) && t.regattr) t.regattr = mr_regattr;
}

} // namespace

fi_ops_mr* patch_mr_ops(fi_ops_mr* ops) noexcept {
  return patch<fi_ops_mr, k_mr_ops>(ops, fill_mr_ops);
}

} // namespace compcntr_hook
