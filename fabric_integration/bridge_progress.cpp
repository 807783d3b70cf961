// The CQ bridge: draining a libfabric CQ into compcntr counters (compcntr_fi_bridge_progress,
// docs/fabric.md). Opening, binding and closing: bridge.cpp; what both share: bridge.hpp.
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
#include <compcntr/fabric.h>

#include <rdma/fi_errno.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

import compcntr;

#include <compcntr/fabric.hpp>

#include "bridge.hpp"
#include "internal.hpp"

using namespace compcntr_fabric;

namespace {

// The common prefix of fi_cq_msg_entry, fi_cq_data_entry and fi_cq_tagged_entry.
static_assert(offsetof(fi_cq_msg_entry, flags) == offsetof(fi_cq_data_entry, flags));
static_assert(offsetof(fi_cq_msg_entry, flags) == offsetof(fi_cq_tagged_entry, flags));
static_assert(offsetof(fi_cq_msg_entry, len) == offsetof(fi_cq_data_entry, len));
static_assert(offsetof(fi_cq_msg_entry, len) == offsetof(fi_cq_tagged_entry, len));
constexpr std::size_t flags_at = offsetof(fi_cq_msg_entry, flags);
constexpr std::size_t len_at = offsetof(fi_cq_msg_entry, len);
constexpr std::uint64_t sentinel = ~std::uint64_t{0};

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

} // namespace

extern "C" {

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

} // extern "C"
