// The provider-counter mirror, public C API (compcntr/fabric.h, docs/fabric.md): a thin shell
// around mirror_core (mirror_core.hpp), which holds the algorithm and its memory ordering.
#include <compcntr/fabric.h>

#include <rdma/fi_errno.h>

#include <cerrno>
#include <new>

#include "internal.hpp"
#include "mirror_core.hpp"

struct compcntr_fi_mirror {
  compcntr_fabric::mirror_core core;
};

using namespace compcntr_fabric;

extern "C" {

struct compcntr_fi_mirror* compcntr_fi_mirror_open_ex(struct fid_cntr* provider_cntr,
                                                      struct compcntr_comp_cntr* cc,
                                                      const struct compcntr_fi_mirror_attr* attr) {
  auto refuse = [](const char* why) -> compcntr_fi_mirror* {
    fail(EINVAL, "compcntr_fi_mirror_open: %s", why);
    errno = EINVAL;
    return nullptr;
  };
  if (provider_cntr == nullptr) return refuse("provider_cntr is NULL");
  if (cc == nullptr) return refuse("cc is NULL");
  if (provider_cntr->fid.fclass != FI_CLASS_CNTR || provider_cntr->ops == nullptr)
    return refuse("provider_cntr is not a counter (fid.fclass != FI_CLASS_CNTR)");
  unsigned bits = 64;
  if (attr != nullptr) {
    if (attr->comp_mask & ~std::uint32_t{COMPCNTR_FI_MIRROR_ATTR_VALUE_BITS})
      return refuse("unknown attr->comp_mask bit");
    if (attr->comp_mask & COMPCNTR_FI_MIRROR_ATTR_VALUE_BITS) {
      if (attr->value_bits < 8 || attr->value_bits > 64)
        return refuse("attr->value_bits must be 8..64");
      bits = attr->value_bits;
    }
  }
  auto* m = new (std::nothrow) compcntr_fi_mirror;
  if (m == nullptr) {
    fail(ENOMEM, "compcntr_fi_mirror_open: out of memory");
    errno = ENOMEM;
    return nullptr;
  }
  m->core.init(provider_cntr, cc, bits);
  return m;
}

struct compcntr_fi_mirror* compcntr_fi_mirror_open(struct fid_cntr* provider_cntr,
                                                   struct compcntr_comp_cntr* cc) {
  return compcntr_fi_mirror_open_ex(provider_cntr, cc, nullptr);
}

int compcntr_fi_mirror_progress(struct compcntr_fi_mirror* m) {
  if (m == nullptr) return -fail(EINVAL, "compcntr_fi_mirror_progress: m is NULL");
  m->core.pull_comp();
  m->core.pull_err();
  return 0;
}

void compcntr_fi_mirror_progress_fn(void* m) {
  if (m != nullptr) compcntr_fi_mirror_progress(static_cast<compcntr_fi_mirror*>(m));
}

int compcntr_fi_mirror_close(struct compcntr_fi_mirror* m) {
  if (m == nullptr) return fail(EINVAL, "compcntr_fi_mirror_close: m is NULL");
  delete m;
  return 0;
}

}  // extern "C"
