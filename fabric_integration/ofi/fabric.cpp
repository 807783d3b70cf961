// ofi_compcntr's fabric(): the fabric of the provider below, installed on by the hook machinery
// (compcntr counters) with this layer's additions at its layer_ops points (ofi.hpp).
#include "ofi.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <strings.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace compcntr_ofi {

int fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  if (attr == nullptr || fabric == nullptr || attr->prov_name == nullptr) return -FI_EINVAL;
  // "tcp;ofi_rxm;ofi_compcntr" -> the provider below, "tcp;ofi_rxm"
  const char* last = std::strrchr(attr->prov_name, ';');
  if (last == nullptr || strcasecmp(last + 1, compcntr_hook::self().name) != 0) {
    FI_WARN(&compcntr_hook::self(), FI_LOG_FABRIC,
            "fi_fabric with prov_name %s: no provider below ofi_compcntr named\n", attr->prov_name);
    return -FI_ENODATA;
  }
  std::string below;
  try {
    below.assign(attr->prov_name, static_cast<std::size_t>(last - attr->prov_name));
  } catch (...) {
    return -FI_ENOMEM;
  }
  fi_fabric_attr low = *attr;
  low.prov_name = below.data();
  low.fabric = nullptr;
  fid_fabric* f = nullptr;
  int r = fi_fabric(&low, &f, context);
  if (r != 0) return r;
  r = compcntr_hook::install_fabric_on(f, below.c_str());
  if (r != 0) {
    fi_close(&f->fid);
    return r;
  }
  *fabric = f;
  return 0;
}

} // namespace compcntr_ofi
