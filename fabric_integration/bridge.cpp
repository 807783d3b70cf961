// The CQ bridge: counts a libfabric CQ's completions into compcntr counters (docs/fabric.md).
// Holds opening a bridge (the CQ's format if known, max_entries), binding counters to
// completion classes (C counters, adapter counters, C++ counters through compcntr::fabric::bind),
// the statistics and close. Draining the CQ (compcntr_fi_bridge_progress): bridge_progress.cpp;
// what both share: bridge.hpp.
#include <compcntr/fabric.h>

#include <rdma/fi_errno.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <vector>

import compcntr;

#include <compcntr/fabric.hpp>

#include "bridge.hpp"
#include "internal.hpp"

using namespace compcntr_fabric;

namespace {

constexpr std::uint64_t bindable =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
// Classes whose entries' len libfabric 1.17 does not define (fi_cq(3): "This len field only
// applies to completed receive operations"). Measured here: sends report 0 on tcp;ofi_rxm and
// shm but the length on udp;ofi_rxd; remote writes with CQ data report 0 on tcp;ofi_rxm but the
// length on udp;ofi_rxd and shm. A BYTES counter cannot be fed from them reliably.
constexpr std::uint64_t no_len = FI_SEND | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

bool valid_format(int f, std::size_t& stride) noexcept {
  switch (f) {
    case FI_CQ_FORMAT_MSG: stride = sizeof(fi_cq_msg_entry); return true;
    case FI_CQ_FORMAT_DATA: stride = sizeof(fi_cq_data_entry); return true;
    case FI_CQ_FORMAT_TAGGED: stride = sizeof(fi_cq_tagged_entry); return true;
    default: return false;
  }
}

compcntr_fi_bridge* fail_open(int err, const char* what) noexcept {
  fail(err, "%s", what);
  errno = err;
  return nullptr;
}

// The part of binding shared by the C and C++ calls: checks flags, refuses overlaps, registers
// the binding with its adapter counter (if cc is one) and publishes it.
int bind_binding(compcntr_fi_bridge* br, std::unique_ptr<binding> b, std::uint64_t flags,
                 const char* call) noexcept {
  if (flags == 0) return fail(EINVAL, "%s: flags is 0", call);
  if (flags & ~bindable)
    return fail(EINVAL,
                "%s: flags 0x%llx has bits outside FI_SEND | FI_RECV | FI_READ | FI_WRITE | "
                "FI_REMOTE_READ | FI_REMOTE_WRITE",
                call, static_cast<unsigned long long>(flags & ~bindable));
  if (b->bytes && (flags & no_len))
    return fail(ENOTSUP,
                "%s: a BYTES counter can count FI_RECV only (libfabric 1.17 defines a CQ entry's "
                "len for receives only; providers report 0 for other classes)",
                call);
  std::lock_guard lk(br->bind_mu);
  for (int c = 0; c < n_classes; ++c)
    if ((flags & class_flag[c]) && br->table[c].load(std::memory_order_relaxed) != nullptr)
      return fail(EBUSY, "%s: class 0x%llx already has a counter on this bridge", call,
                  static_cast<unsigned long long>(class_flag[c]));
  try {
    br->owned.reserve(br->owned.size() + 1);
  } catch (...) {
    return fail(ENOMEM, "%s: out of memory", call);
  }
  if (b->cc) {
    std::lock_guard rl(registry_lock());
    if (adapter* a = find_adapter(b->cc)) {
      if (!add_binding(*a, br)) return fail(ENOMEM, "%s: out of memory", call);
      b->owner = a;
    }
  }
  // release: progress's acquire load of the class slot sees the binding's fields.
  for (int c = 0; c < n_classes; ++c)
    if (flags & class_flag[c]) br->table[c].store(b.get(), std::memory_order_release);
  br->owned.push_back(std::move(b)); // capacity reserved above: cannot throw
  return 0;
}

} // namespace

extern "C" {

struct compcntr_fi_bridge* compcntr_fi_bridge_open(struct fid_cq* cq) {
  return compcntr_fi_bridge_open_ex(cq, nullptr);
}

struct compcntr_fi_bridge* compcntr_fi_bridge_open_ex(struct fid_cq* cq,
                                                      const struct compcntr_fi_bridge_attr* attr) {
  if (cq == nullptr) return fail_open(EINVAL, "compcntr_fi_bridge_open: cq is NULL");
  if (cq->fid.fclass != FI_CLASS_CQ)
    return fail_open(EINVAL, "compcntr_fi_bridge_open: cq is not a CQ (fclass)");
  std::size_t stride = 0, max_entries = default_max_entries;
  if (attr != nullptr) {
    constexpr std::uint32_t known =
        COMPCNTR_FI_BRIDGE_ATTR_FORMAT | COMPCNTR_FI_BRIDGE_ATTR_MAX_ENTRIES;
    if (attr->comp_mask & ~known) {
      fail(EINVAL, "compcntr_fi_bridge_open_ex: unknown comp_mask bit(s) 0x%x",
           attr->comp_mask & ~known);
      errno = EINVAL;
      return nullptr;
    }
    if ((attr->comp_mask & COMPCNTR_FI_BRIDGE_ATTR_FORMAT) &&
        !valid_format(raw_enum(attr->format), stride)) {
      fail(EINVAL,
           "compcntr_fi_bridge_open_ex: format %d cannot be bridged (FI_CQ_FORMAT_MSG, _DATA or "
           "_TAGGED: CONTEXT entries carry no flags, UNSPEC has no known size)",
           raw_enum(attr->format));
      errno = EINVAL;
      return nullptr;
    }
    if (attr->comp_mask & COMPCNTR_FI_BRIDGE_ATTR_MAX_ENTRIES) {
      if (attr->max_entries == 0)
        return fail_open(EINVAL, "compcntr_fi_bridge_open_ex: max_entries must be > 0");
      max_entries = attr->max_entries;
    }
  }
  auto* br = new (std::nothrow) compcntr_fi_bridge;
  if (br == nullptr) return fail_open(ENOMEM, "compcntr_fi_bridge_open: out of memory");
  br->cq = cq;
  br->stride = stride;
  br->max_entries = max_entries;
  return br;
}

int compcntr_fi_bridge_bind(struct compcntr_fi_bridge* br, struct compcntr_comp_cntr* cc,
                            uint64_t flags) {
  if (br == nullptr) return fail(EINVAL, "compcntr_fi_bridge_bind: br is NULL");
  if (cc == nullptr) return fail(EINVAL, "compcntr_fi_bridge_bind: cc is NULL");
  compcntr_comp_cntr_type type{};
  if (const int err = compcntr_comp_cntr_get_type(cc, &type))
    return fail(err, "compcntr_fi_bridge_bind: %s", compcntr_last_error_message());
  std::unique_ptr<binding> b(new (std::nothrow) binding);
  if (!b) return fail(ENOMEM, "compcntr_fi_bridge_bind: out of memory");
  b->cc = cc;
  b->bytes = type == COMPCNTR_COMP_CNTR_TYPE_BYTES;
  return bind_binding(br, std::move(b), flags, "compcntr_fi_bridge_bind");
}

int compcntr_fi_bridge_query_stats(struct compcntr_fi_bridge* br,
                                   struct compcntr_fi_bridge_stats* stats) {
  if (br == nullptr) return fail(EINVAL, "compcntr_fi_bridge_query_stats: br is NULL");
  if (stats == nullptr) return fail(EINVAL, "compcntr_fi_bridge_query_stats: stats is NULL");
  stats->entries = br->entries.load(std::memory_order_relaxed);
  stats->errors = br->errors.load(std::memory_order_relaxed);
  stats->unclassified = br->unclassified.load(std::memory_order_relaxed);
  stats->unbound = br->unbound.load(std::memory_order_relaxed);
  return 0;
}

int compcntr_fi_bridge_close(struct compcntr_fi_bridge* br) {
  if (br == nullptr) return fail(EINVAL, "compcntr_fi_bridge_close: br is NULL");
  {
    std::lock_guard lk(br->bind_mu);
    std::lock_guard rl(registry_lock());
    for (auto& b : br->owned)
      if (b->owner) remove_binding(*b->owner, br); // after this no adapter reader reaches br
  }
  delete br;
  return 0;
}

} // extern "C"

int compcntr::fabric::bind(compcntr_fi_bridge* br, compcntr::counter_ref ref,
                           std::uint64_t flags) noexcept {
  if (br == nullptr) return fail(EINVAL, "compcntr::fabric::bind: br is NULL");
  if (!ref) return fail(EINVAL, "compcntr::fabric::bind: the counter_ref is empty");
  std::unique_ptr<binding> b(new (std::nothrow) binding);
  if (!b) return fail(ENOMEM, "compcntr::fabric::bind: out of memory");
  b->bytes = ref.type() == compcntr::counter_type::bytes;
  b->ref = std::move(ref);
  return bind_binding(br, std::move(b), flags, "compcntr::fabric::bind");
}

int compcntr::fabric::bind(compcntr_fi_bridge* br, const compcntr::device& dev,
                           compcntr::counter_view c, std::uint64_t flags) noexcept {
  if (!c) return fail(EINVAL, "compcntr::fabric::bind: the counter is empty");
  std::error_code ec;
  compcntr::counter_ref ref = dev.resolve(c.id(), ec);
  // A handle resolved on another device names an unrelated slot: check it is c's.
  if (ec || ref.native_slot() != c.native_slot())
    return fail(EINVAL, "compcntr::fabric::bind: the counter is not a counter of `dev`");
  return bind(br, std::move(ref), flags);
}
