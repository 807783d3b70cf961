// ofi_compcntr: what libfabric loads (fi_prov_ini, the fi_provider), getinfo, and the fi_info
// the provider below gets for one of ours (ofi.hpp: the design).
#include "ofi.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <strings.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace compcntr_ofi {

int fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context); // fabric.cpp
void fill_layer(compcntr_hook::layer_ops& l) noexcept;                // ep.cpp, domain.cpp

namespace {

constexpr const char* k_name = "ofi_compcntr";
constexpr std::size_t k_name_len = 12;

// fi_getinfo calls our getinfo again from inside our own query of the providers below (we are
// one of them when the hints name no provider or a core provider alone): that nested call
// answers nothing.
thread_local bool t_in_getinfo = false;

// Whether a provider below (by prov_name) has FI_RMA_EVENT itself; learned by getinfo, asked
// again by lower_info for a name getinfo did not see in this process.
std::mutex g_native_mu;
std::map<std::string, bool>& native_rma_event() noexcept {
  static auto* m = new std::map<std::string, bool>;
  return *m;
}

// The prov_name of the hints for the providers below: ours removed from the end, the rest as
// the application wrote it ("tcp;ofi_rxm;ofi_compcntr" -> "tcp;ofi_rxm"; "tcp" stays; a name
// that is only ours -> none).
bool lower_name(const char* name, std::string& out) {
  if (name == nullptr) return false;
  std::string s(name);
  const std::size_t n = s.size();
  if (n >= k_name_len && strcasecmp(s.c_str() + n - k_name_len, k_name) == 0) {
    s.resize(n - k_name_len);
    if (!s.empty() && s.back() == ';') s.pop_back();
  }
  out = s;
  return !out.empty();
}

struct info_ptr {
  fi_info* p = nullptr;
  ~info_ptr() { fi_freeinfo(p); }
};

int query(uint32_t version, const char* node, const char* service, uint64_t flags,
          const fi_info* hints, uint64_t strip, const std::string* name, fi_info** out) {
  fi_info* h = fi_dupinfo(hints);
  if (h == nullptr) return -FI_ENOMEM;
  h->caps &= ~strip;
  if (h->tx_attr) {
    h->tx_attr->caps &= ~strip;
    h->tx_attr->op_flags &= ~FI_TRIGGER;
  }
  if (h->rx_attr) {
    h->rx_attr->caps &= ~strip;
    h->rx_attr->op_flags &= ~FI_TRIGGER;
  }
  if (h->fabric_attr) {
    free(h->fabric_attr->prov_name);
    h->fabric_attr->prov_name = name ? strdup(name->c_str()) : nullptr;
  }
  const int r = fi_getinfo(version, node, service, flags, h, out);
  fi_freeinfo(h);
  return r;
}

const fi_info* find(const fi_info* list, const fi_info* e) noexcept;

// query, preferring offset addressing: where the hints allow FI_MR_VIRT_ADDR (an application
// that can use virtual addresses), each provider below is asked without it first and keeps its
// FI_MR_VIRT_ADDR entry only where it has no other (verbs and efa require it; shm chooses it
// whenever it is allowed). Offset addressing is what the software triggering provider (sockets)
// gives and what programs written for it assume: fabtests' fi_rdm_deferred_wq writes to remote
// address 0, which through shm's virtual addressing is EFAULT. Costs shm its "fast RMA" (the
// initiator's process_vm_writev) for the layer's entries; documented in docs/ofi_compcntr.md.
int query_offset_first(uint32_t version, const char* node, const char* service, uint64_t flags,
                       const fi_info* hints, uint64_t strip, const std::string* name,
                       fi_info** out) {
  const uint64_t mm = hints->domain_attr ? hints->domain_attr->mr_mode : 0;
  if (!(mm & FI_MR_VIRT_ADDR) || (mm & (FI_MR_BASIC | FI_MR_SCALABLE)))
    return query(version, node, service, flags, hints, strip, name, out);
  fi_info* h = fi_dupinfo(hints);
  if (h == nullptr) return -FI_ENOMEM;
  h->domain_attr->mr_mode &= ~static_cast<uint64_t>(FI_MR_VIRT_ADDR);
  fi_info* offset = nullptr;
  const int ro = query(version, node, service, flags, h, strip, name, &offset);
  fi_freeinfo(h);
  fi_info* virt = nullptr;
  const int rv = query(version, node, service, flags, hints, strip, name, &virt);
  if (rv != 0) {
    *out = ro == 0 ? offset : nullptr;
    return ro == 0 ? 0 : rv;
  }
  if (ro != 0) {
    *out = virt;
    return 0;
  }
  // The VIRT_ADDR list in its order, each entry replaced by the first unused offset entry of
  // the same provider, endpoint type, domain and source address (tcp lists one per address).
  const auto same = [](const fi_info* a, const fi_info* b) noexcept {
    return find(a, b) == a && a->addr_format == b->addr_format &&
           a->src_addrlen == b->src_addrlen &&
           (a->src_addrlen == 0 || (a->src_addr && b->src_addr &&
                                    std::memcmp(a->src_addr, b->src_addr, a->src_addrlen) == 0));
  };
  std::vector<const fi_info*> unused;
  for (const fi_info* o = offset; o; o = o->next) unused.push_back(o);
  fi_info *head = nullptr, *tail = nullptr;
  for (fi_info* e = virt; e;) {
    fi_info* next = e->next;
    e->next = nullptr;
    fi_info* pick = e;
    for (const fi_info*& o : unused) {
      if (o == nullptr) continue;
      fi_info one = *o;
      one.next = nullptr; // find() compares the one entry
      if (!same(&one, e)) continue;
      if (fi_info* d = fi_dupinfo(&one)) {
        fi_freeinfo(e);
        pick = d;
        o = nullptr;
      }
      break;
    }
    (tail ? tail->next : head) = pick;
    tail = pick;
    e = next;
  }
  fi_freeinfo(offset);
  *out = head;
  return 0;
}

// The entry of `list` for the same provider and endpoint type as `e`, or nullptr.
const fi_info* find(const fi_info* list, const fi_info* e) noexcept {
  for (const fi_info* i = list; i; i = i->next)
    if (i->fabric_attr && e->fabric_attr && i->fabric_attr->prov_name &&
        e->fabric_attr->prov_name &&
        std::strcmp(i->fabric_attr->prov_name, e->fabric_attr->prov_name) == 0 && i->ep_attr &&
        e->ep_attr && i->ep_attr->type == e->ep_attr->type &&
        (!i->domain_attr || !e->domain_attr || !i->domain_attr->name || !e->domain_attr->name ||
         std::strcmp(i->domain_attr->name, e->domain_attr->name) == 0))
      return i;
  return nullptr;
}

bool ours(const fi_info* e) noexcept {
  return e->fabric_attr && e->fabric_attr->prov_name &&
         std::strstr(e->fabric_attr->prov_name, k_name) != nullptr;
}

// Our entry for a provider below's entry `e`: caps `added` on top; the prov_name is the one
// below (libfabric appends ours).
fi_info* entry_for(const fi_info* e, uint64_t added) noexcept {
  fi_info* r = fi_dupinfo(e);
  if (r == nullptr) return nullptr;
  r->next = nullptr;
  r->caps |= added;
  // The layer's counters are compcntr counters: where the provider below states no counter
  // limit (libfabric 1.17's rxm, rxd and shm say 0), the domain offers as many as compcntr's
  // pool holds. (fabtests' fi_cntr_test tests nothing on a domain with cntr_cnt 0.)
  if (r->domain_attr && r->domain_attr->cntr_cnt == 0)
    if (compcntr_device* d = compcntr_hook::device()) {
      compcntr_comp_cntr_caps caps{};
      if (compcntr_query_comp_cntr_caps(d, &caps) == 0)
        r->domain_attr->cntr_cnt = caps.max_counters;
    }
  if (r->tx_attr && (added & FI_TRIGGER)) r->tx_attr->caps |= FI_TRIGGER;
  if (r->rx_attr && (added & FI_RMA_EVENT)) r->rx_attr->caps |= FI_RMA_EVENT;
  return r;
}

int getinfo(uint32_t version, const char* node, const char* service, uint64_t flags,
            const fi_info* hints, fi_info** info) {
  *info = nullptr;
  if (t_in_getinfo || hints == nullptr) return -FI_ENODATA;
  const uint64_t asked = (hints->caps | (hints->tx_attr ? hints->tx_attr->caps : 0) |
                          (hints->rx_attr ? hints->rx_attr->caps : 0)) &
                         k_added_caps;
  // Hints that name us ("tcp;ofi_rxm;ofi_compcntr") get the layer over every provider below
  // that matches, whatever they ask; all others only where we add an asked capability.
  const char* hn = hints->fabric_attr ? hints->fabric_attr->prov_name : nullptr;
  const std::size_t hl = hn ? std::strlen(hn) : 0;
  const bool named = hl >= k_name_len && strcasecmp(hn + hl - k_name_len, k_name) == 0;
  if (asked == 0 && !named) return -FI_ENODATA;
  std::string name;
  bool has_name = false;
  try {
    has_name = lower_name(hints->fabric_attr ? hints->fabric_attr->prov_name : nullptr, name);
  } catch (...) {
    return -FI_ENOMEM;
  }
  const std::string* np = has_name ? &name : nullptr;
  t_in_getinfo = true;
  info_ptr full, no_trig, plain;
  // The providers that have everything asked for (sockets): not ours to layer over.
  if (!named) query(version, node, service, flags, hints, 0, np, &full.p);
  // The providers with the asked FI_RMA_EVENT of their own (shm, udp;ofi_rxd).
  if (asked & FI_RMA_EVENT)
    query_offset_first(version, node, service, flags, hints, FI_TRIGGER, np, &no_trig.p);
  const int r = query_offset_first(version, node, service, flags, hints, asked, np, &plain.p);
  t_in_getinfo = false;
  if (r != 0) return r == -FI_ENOMEM ? r : -FI_ENODATA;

  fi_info *head = nullptr, *tail = nullptr;
  for (const fi_info* e = plain.p; e; e = e->next) {
    if (ours(e) || find(full.p, e)) continue;
    bool native = false;
    const fi_info* base = e;
    if (asked & FI_RMA_EVENT) {
      // the provider's own entry with FI_RMA_EVENT: the one its endpoints are opened with
      if (const fi_info* n = find(no_trig.p, e)) native = true, base = n;
      if (e->fabric_attr && e->fabric_attr->prov_name) {
        std::lock_guard lk(g_native_mu);
        try {
          native_rma_event()[e->fabric_attr->prov_name] = native;
        } catch (...) {
        }
      }
    }
    if (!named && !(asked & FI_TRIGGER) && native) continue; // nothing to add
    fi_info* n = entry_for(base, asked);
    if (n == nullptr) {
      fi_freeinfo(head);
      return -FI_ENOMEM;
    }
    (tail ? tail->next : head) = n;
    tail = n;
  }
  if (head == nullptr) return -FI_ENODATA;
  *info = head;
  return 0;
}

// Whether the provider below (by name) has FI_RMA_EVENT itself.
bool lower_has_rma_event(const fi_info* low) noexcept {
  const char* pn = low->fabric_attr ? low->fabric_attr->prov_name : nullptr;
  if (pn == nullptr) return false;
  {
    std::lock_guard lk(g_native_mu);
    auto it = native_rma_event().find(pn);
    if (it != native_rma_event().end()) return it->second;
  }
  fi_info* h = fi_dupinfo(low);
  if (h == nullptr) return false;
  fi_info* got = nullptr;
  h->caps |= FI_RMA_EVENT;
  if (h->rx_attr) h->rx_attr->caps |= FI_RMA_EVENT;
  h->next = nullptr;
  const int r =
      fi_getinfo(low->fabric_attr->api_version ? low->fabric_attr->api_version : FI_VERSION(1, 17),
                 nullptr, nullptr, 0, h, &got);
  fi_freeinfo(h);
  fi_freeinfo(got);
  std::lock_guard lk(g_native_mu);
  try {
    native_rma_event()[pn] = r == 0;
  } catch (...) {
  }
  return r == 0;
}

void cleanup() {
  compcntr_hook::progress_thread_stop();
  compcntr_hook::write_stats();
}

fi_provider g_prov = {
    .version = FI_VERSION(0, 1),
    .fi_version = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION),
    .context = {},
    .name = k_name,
    .getinfo = getinfo,
    .fabric = fabric,
    .cleanup = cleanup,
};

const compcntr_hook::module_names g_names = {"COMPCNTR_OFI_STATS", "ofi_compcntr"};

compcntr_hook::layer_ops make_layer() noexcept {
  compcntr_hook::layer_ops l{};
  fill_layer(l);
  return l;
}

} // namespace

/// The fi_info for the provider below: our name off the prov_name, the caps we add off.
/// nullptr for an fi_info that is not ours.
fi_info* lower_info(const fi_info* info) {
  if (info == nullptr || info->fabric_attr == nullptr || info->fabric_attr->prov_name == nullptr)
    return nullptr;
  std::string name;
  try {
    const char* pn = info->fabric_attr->prov_name;
    const std::size_t n = std::strlen(pn);
    if (n < k_name_len || strcasecmp(pn + n - k_name_len, k_name) != 0) return nullptr;
    if (!lower_name(pn, name)) return nullptr;
  } catch (...) {
    return nullptr;
  }
  fi_info* low = fi_dupinfo(info);
  if (low == nullptr) return nullptr;
  free(low->fabric_attr->prov_name);
  low->fabric_attr->prov_name = strdup(name.c_str());
  uint64_t strip = FI_TRIGGER;
  if ((info->caps & FI_RMA_EVENT) && !lower_has_rma_event(low)) strip |= FI_RMA_EVENT;
  low->caps &= ~strip;
  // Emulated FI_RMA_EVENT on an RDM provider (rxm): remote reads are notified by a fetch atomic
  // (rma_event.cpp), which rxm checks against its MR map, and rxm fills that map only on domains
  // with FI_ATOMIC: asked for below the layer (the application's atomic caps are unchanged).
  if ((strip & FI_RMA_EVENT) && low->ep_attr && low->ep_attr->type == FI_EP_RDM)
    low->caps |= FI_ATOMIC;
  // The counter limit is the layer's (entry_for: compcntr's pool where the provider below
  // states none); the provider below is asked for no particular number (shm refuses a domain
  // whose hints ask for more counters than its own attributes say).
  if (low->domain_attr) low->domain_attr->cntr_cnt = 0;
  if (low->tx_attr) {
    low->tx_attr->caps &= ~strip;
    low->tx_attr->op_flags &= ~FI_TRIGGER;
  }
  if (low->rx_attr) {
    low->rx_attr->caps &= ~strip;
    low->rx_attr->op_flags &= ~FI_TRIGGER;
  }
  return low;
}

/// Whether the layer emulates FI_RMA_EVENT for an fi_info of ours.
bool emulates_rma_event(const fi_info* info) noexcept {
  if (info == nullptr || !(info->caps & FI_RMA_EVENT)) return false;
  fi_info* low = lower_info(info);
  if (low == nullptr) return false;
  const bool native = lower_has_rma_event(low);
  fi_freeinfo(low);
  return !native;
}

} // namespace compcntr_ofi

namespace compcntr_hook {
fi_provider& self() noexcept { return compcntr_ofi::g_prov; }
const module_names& module() noexcept { return compcntr_ofi::g_names; }
const layer_ops* layer() noexcept {
  static const layer_ops l = compcntr_ofi::make_layer();
  return &l;
}
} // namespace compcntr_hook

extern "C" __attribute__((visibility("default"))) struct fi_provider* fi_prov_ini(void) {
  compcntr_hook::read_config();
  return &compcntr_hook::self();
}
