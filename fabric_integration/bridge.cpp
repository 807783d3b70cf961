// The CQ bridge: drains a libfabric CQ and counts its completions into compcntr counters
// (docs/fabric.md).
//
// Reading entries whose format the bridge may not know. fi_cq_read writes entries of the CQ's
// format: CONTEXT {op_context} (8 bytes), MSG {op_context, flags, len} (24), DATA (+buf, data:
// 40), TAGGED (+tag: 48). libfabric offers no query of a CQ's format, so:
//   * open_ex with the format: the stride is known; entries are read `batch` at a time.
//   * open without it: one entry per fi_cq_read, into a buffer the size of the largest format,
//     and only {op_context, flags, len} -- the prefix MSG, DATA and TAGGED share at the same
//     offsets -- is interpreted. Before each read the flags word is set to a sentinel (all
//     ones: no completion has every flag bit); if it is still there after a successful read,
//     the provider wrote a CONTEXT entry, which cannot be classified, and the bridge stops.
// Nothing is ever read past what the provider was allowed to write.
//
// Counting: each batch's completions are summed per class and added with one compcntr call
// per class (fewer atomic RMWs than one per entry); they are visible when progress returns.
#include <compcntr/fabric.h>

#include <rdma/fi_errno.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <vector>

import compcntr;

#include <compcntr/fabric.hpp>

#include "internal.hpp"

using namespace compcntr_fabric;

namespace {

// Completion classes, in the order entries are matched (first match wins).
enum cls : int { remote_write, remote_read, read, write, send, recv, n_classes };
constexpr std::uint64_t class_flag[n_classes] = {FI_REMOTE_WRITE, FI_REMOTE_READ, FI_READ,
                                                 FI_WRITE,        FI_SEND,        FI_RECV};
constexpr std::uint64_t bindable =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
// Classes whose entries' len libfabric 1.17 does not define (fi_cq(3): "This len field only
// applies to completed receive operations"). Measured here: sends report 0 on tcp;ofi_rxm and
// shm but the length on udp;ofi_rxd; remote writes with CQ data report 0 on tcp;ofi_rxm but the
// length on udp;ofi_rxd and shm. A BYTES counter cannot be fed from them reliably.
constexpr std::uint64_t no_len = FI_SEND | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

inline int classify(std::uint64_t flags) noexcept {
  for (int c = 0; c < n_classes; ++c)
    if (flags & class_flag[c]) return c;
  return n_classes;
}

// The common prefix of fi_cq_msg_entry, fi_cq_data_entry and fi_cq_tagged_entry.
static_assert(offsetof(fi_cq_msg_entry, flags) == offsetof(fi_cq_data_entry, flags));
static_assert(offsetof(fi_cq_msg_entry, flags) == offsetof(fi_cq_tagged_entry, flags));
static_assert(offsetof(fi_cq_msg_entry, len) == offsetof(fi_cq_data_entry, len));
static_assert(offsetof(fi_cq_msg_entry, len) == offsetof(fi_cq_tagged_entry, len));
constexpr std::size_t flags_at = offsetof(fi_cq_msg_entry, flags);
constexpr std::size_t len_at = offsetof(fi_cq_msg_entry, len);
constexpr std::uint64_t sentinel = ~std::uint64_t{0};

constexpr std::size_t batch = 64;  // entries per fi_cq_read with a known format (3 KiB TAGGED)
constexpr std::size_t default_max_entries = 1024;

// A counter bound to some classes of a bridge: a C counter (the application keeps it alive), or
// a C++ counter reached through a counter_ref the binding holds (which keeps it alive).
struct binding {
  compcntr_comp_cntr* cc = nullptr;
  compcntr::counter_ref ref;
  bool bytes = false;
  adapter* owner = nullptr;  // the adapter counter cc belongs to, or nullptr

  void add(std::uint64_t n) noexcept {
    if (cc)
      compcntr_inc_comp_cntr(cc, n);
    else
      ref.add(n);
  }
  void add_error(std::uint64_t n) noexcept {
    if (cc)
      compcntr_inc_err_comp_cntr(cc, n);
    else
      ref.add_error(n);
  }
};

}  // namespace

struct compcntr_fi_bridge {
  fid_cq* cq = nullptr;
  std::size_t stride = 0;  // 0: format unknown (one entry per read, prefix only)
  std::size_t max_entries = default_max_entries;

  // One binding per class; published with release, read with acquire by progress.
  std::atomic<const binding*> table[n_classes] = {};

  // The drain try-lock: one thread reads the CQ at a time (fi_cq_read + fi_cq_readerr must
  // not interleave, and CQs of FI_THREAD_DOMAIN domains are not thread-safe). acquire on
  // entry / release on exit order each drain's buffer use and statistics after the previous.
  std::atomic<bool> draining{false};
  std::atomic<bool> context_format{false};  // a CONTEXT entry was seen: refuse to read more

  // Statistics, updated by the draining thread only (relaxed; read by query_stats).
  std::atomic<std::uint64_t> entries{0}, errors{0}, unclassified{0}, unbound{0};

  std::mutex bind_mu;                            // serialises bind and close
  std::vector<std::unique_ptr<binding>> owned;   // every binding made, for close

  alignas(64) unsigned char buf[batch * sizeof(fi_cq_tagged_entry)];
};

namespace {

struct drain_guard {
  compcntr_fi_bridge* br;
  bool held;
  explicit drain_guard(compcntr_fi_bridge* b) noexcept
      : br(b), held(!b->draining.exchange(true, std::memory_order_acquire)) {}
  ~drain_guard() {
    if (held) br->draining.store(false, std::memory_order_release);
  }
};

// Per-batch sums, flushed with one compcntr call per class.
struct tally {
  std::uint64_t done[n_classes] = {}, bytes[n_classes] = {}, failed[n_classes] = {};
  std::uint64_t entries = 0, errors = 0, unclassified = 0, unbound = 0;

  void ok(compcntr_fi_bridge* br, std::uint64_t flags, std::uint64_t len) noexcept {
    ++entries;
    if (const int c = route(br, flags); c >= 0) {
      ++done[c];
      bytes[c] += len;
    }
  }
  void err(compcntr_fi_bridge* br, std::uint64_t flags) noexcept {
    ++errors;
    if (const int c = route(br, flags); c >= 0) ++failed[c];
  }
  /// The class an entry counts in, or -1 (counted as unclassified or unbound instead).
  int route(compcntr_fi_bridge* br, std::uint64_t flags) noexcept {
    const int c = classify(flags);
    if (c == n_classes) {
      ++unclassified;
      return -1;
    }
    if (br->table[c].load(std::memory_order_relaxed) == nullptr) {
      ++unbound;
      return -1;
    }
    return c;
  }
  void flush(compcntr_fi_bridge* br) noexcept {
    for (int c = 0; c < n_classes; ++c) {
      if (done[c] == 0 && failed[c] == 0) continue;
      // acquire: pairs with bind's release store, so the binding's fields are visible. A class
      // counted above had a binding (bindings are never removed while the bridge is open).
      const binding* b = br->table[c].load(std::memory_order_acquire);
      // const_cast: the binding is immutable once published, except for the counter it counts
      // into (its updates are atomic).
      auto* m = const_cast<binding*>(b);
      if (done[c]) m->add(b->bytes ? bytes[c] : done[c]);
      if (failed[c]) m->add_error(failed[c]);
      done[c] = bytes[c] = failed[c] = 0;
    }
    br->entries.store(br->entries.load(std::memory_order_relaxed) + entries,
                      std::memory_order_relaxed);
    br->errors.store(br->errors.load(std::memory_order_relaxed) + errors,
                     std::memory_order_relaxed);
    br->unclassified.store(br->unclassified.load(std::memory_order_relaxed) + unclassified,
                           std::memory_order_relaxed);
    br->unbound.store(br->unbound.load(std::memory_order_relaxed) + unbound,
                      std::memory_order_relaxed);
    entries = errors = unclassified = unbound = 0;
  }
};

inline std::uint64_t load_u64(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Reads the error entry at the head of the CQ (after fi_cq_read returned -FI_EAVAIL).
// 1: consumed; 0: gone (another reader outside the bridge took it); < 0: error.
ssize_t read_error(compcntr_fi_bridge* br, tally& t) noexcept {
  fi_cq_err_entry e{};
  const ssize_t r = fi_cq_readerr(br->cq, &e, 0);
  if (r == -FI_EAGAIN) return 0;
  if (r < 0) return r;
  t.err(br, e.flags);
  return 1;
}

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

ssize_t compcntr_fi_bridge_progress(struct compcntr_fi_bridge* br) {
  if (br == nullptr) return -fail(EINVAL, "compcntr_fi_bridge_progress: br is NULL");
  auto context_refused = [] {
    return -fail(EOPNOTSUPP,
                 "compcntr_fi_bridge_progress: the CQ has FI_CQ_FORMAT_CONTEXT entries (no flags)");
  };
  if (br->context_format.load(std::memory_order_relaxed)) return context_refused();
  drain_guard g(br);
  if (!g.held) return 0; // another thread is draining: its entries are counted by it
  // Again under the drain lock: the drainer that found the CONTEXT entry may have set the flag
  // and let go between the check above and our lock; read nothing more then.
  if (br->context_format.load(std::memory_order_relaxed)) return context_refused();

  tally t;
  ssize_t consumed = 0, error = 0;
  const std::size_t max = br->max_entries;
  if (br->stride != 0) {
    while (static_cast<std::size_t>(consumed) < max) {
      const std::size_t want = std::min(batch, max - static_cast<std::size_t>(consumed));
      const ssize_t n = fi_cq_read(br->cq, br->buf, want);
      if (n > 0) {
        for (ssize_t i = 0; i < n; ++i) {
          const unsigned char* e = br->buf + static_cast<std::size_t>(i) * br->stride;
          t.ok(br, load_u64(e + flags_at), load_u64(e + len_at));
        }
        consumed += n;
        t.flush(br);
        if (static_cast<std::size_t>(n) < want) break; // the CQ is (nearly) empty
      } else if (n == -FI_EAVAIL) {
        const ssize_t r = read_error(br, t);
        if (r < 0) {
          error = r;
          break;
        }
        if (r == 0) break; // the error entry vanished: never spin on -FI_EAVAIL
        consumed += r;
        t.flush(br);
      } else {
        if (n != -FI_EAGAIN) error = n;
        break;
      }
    }
  } else {
    while (static_cast<std::size_t>(consumed) < max) {
      std::uint64_t s = sentinel;
      std::memcpy(br->buf + flags_at, &s, sizeof s);
      const ssize_t n = fi_cq_read(br->cq, br->buf, 1);
      if (n == 1) {
        const std::uint64_t flags = load_u64(br->buf + flags_at);
        ++consumed;
        if (flags == sentinel) {
          ++t.entries;
          ++t.unclassified;
          t.flush(br);
          br->context_format.store(true, std::memory_order_relaxed);
          error = -fail(EOPNOTSUPP,
                        "compcntr_fi_bridge_progress: the CQ has FI_CQ_FORMAT_CONTEXT entries "
                        "(no flags); one entry was consumed and not counted");
          // Entries consumed before it (error entries read with fi_cq_readerr) are reported
          // as usual; the next call returns the error.
          return consumed > 1 ? consumed : error;
        }
        t.ok(br, flags, load_u64(br->buf + len_at));
      } else if (n == -FI_EAVAIL) {
        const ssize_t r = read_error(br, t);
        if (r < 0) {
          error = r;
          break;
        }
        if (r == 0) break; // the error entry vanished: never spin on -FI_EAVAIL
        consumed += r;
      } else {
        if (n < 0 && n != -FI_EAGAIN) error = n; // 0: empty, as -FI_EAGAIN
        break;
      }
    }
    t.flush(br);
  }
  if (consumed > 0) return consumed;
  if (error) {
    fail(static_cast<int>(-error), "compcntr_fi_bridge_progress: fi_cq_read/readerr: %s",
         fi_strerror(static_cast<int>(-error)));
    return error;
  }
  return 0;
}

void compcntr_fi_bridge_progress_fn(void* br) {
  if (br != nullptr) compcntr_fi_bridge_progress(static_cast<compcntr_fi_bridge*>(br));
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
