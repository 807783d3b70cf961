// Shared devices: the counters. Holds cell ownership (free_cell, release_cell, bind: a slot
// bound to its cell as a 2-stripe counter), the counter operations (shared_counter_ops), the
// shared backend (bind_counter claims a free cell, unbind_counter lets go of it, and
// open_shared_backend), the entry points the core calls (compcntr:shared: notify_shared, ids, wait
// words, creator death) and resolve_shared_slot (a counter of the segment by its id). The
// guarantees and the memory ordering: the file comment of compcntr:shared_impl
// (src/core/shared/segment_impl.cppm).
module;
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <system_error>
#include "core/shared/layout.hpp"
#include "core/wait/futex.hpp"
module compcntr;
import :shared_impl;

namespace compcntr::detail {

static_assert(sizeof(shm::half) == sizeof(stripe) && alignof(shm::half) == alignof(stripe) &&
                  offsetof(shm::half, value) == offsetof(stripe, value) &&
                  offsetof(shm::half, errors) == offsetof(stripe, errors),
              "a cell half is read as a stripe");

// ---- cells --------------------------------------------------------------------------------

// Frees cell i whose ctl we read as `seen` and may change: mark it being freed by us (so a
// sweep finishes the job if we die), bump the generation, store it free. false if ctl changed.
bool shared_segment::free_cell(std::uint32_t i, std::uint64_t seen) noexcept {
  shm::record& r = records[i];
  const std::uint64_t mark = shm::make_ctl(shm::cell_freeing, me < shm::max_procs ? bit() : 0);
  if (!r.ctl.compare_exchange_strong(seen, mark, std::memory_order_acq_rel)) return false;
  r.generation.fetch_add(1, std::memory_order_release);
  r.ctl.store(0, std::memory_order_release);
  return true;
}

// Our process lets go of cell i (its last local slot is gone). Called with `mu` held.
void shared_segment::release_cell(std::uint32_t i) noexcept {
  shm::record& r = records[i];
  const std::uint64_t b = bit();
  std::uint64_t c = r.ctl.load(std::memory_order_acquire);
  for (;;) {
    if ((c & b) == 0) return; // not ours (scribbled): nothing to give back
    const std::uint64_t st = shm::cell_state(c), rest = c & shm::holders_mask & ~b;
    std::uint64_t next_state = st;
    if (st == shm::cell_live && r.creator.load(std::memory_order_relaxed) == me)
      next_state = shm::cell_orphan; // the creator destroyed it: no new resolves
    if (rest == 0 && (st == shm::cell_live || st == shm::cell_orphan || st == shm::cell_dead)) {
      if (free_cell(i, c)) return; // we were its last holder
      c = r.ctl.load(std::memory_order_acquire);
      continue;
    }
    if (r.ctl.compare_exchange_weak(c, shm::make_ctl(next_state, rest), std::memory_order_acq_rel,
                                    std::memory_order_acquire))
      return;
  }
}

void shared_segment::bind(slot& s, std::uint32_t i) noexcept {
  s.backend_data = this;
  s.stripes = reinterpret_cast<std::uintptr_t>(&cells[i]) + two_stripes_tag;
  s.stripe_mask_ = 1;
  s.cpu_offset = rseq_cpu_offset();
  s.hw = &shared_counter_ops;
  s.watch.fetch_or(watch_shared, std::memory_order_relaxed); // published with the counter
}

// ---- the counter operations (compcntr:shared) -----------------------------------------------

namespace {

// A set bumps the cell's silent_updates (seq_cst, after the value's store and before the
// notify): it may leave the value as it was, and a plain-armed fd of another process compares
// the count with its arm's sample (shared_fd_check) as it compares value and errors. Adds do
// not (slot::hw_add's stripe path; an add of 0 is the one update such an fd does not hear).
void bump_silent(slot& s) noexcept {
  shared_segment& g = seg_of(s);
  g.records[g.cell_of(s)].silent_updates.fetch_add(1, std::memory_order_seq_cst);
}
void shared_add(slot& s, std::uint64_t n) noexcept { s.add(n); }
void shared_add_error(slot& s, std::uint64_t n) noexcept { s.add_error(n); }
// As a striped counter's set: half 0 = v - half 1, one seq_cst store, then notify.
void shared_set(slot& s, std::uint64_t v) noexcept {
  stripe* st = s.stripe_array();
  st[0].value.store(v - st[1].value.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  bump_silent(s);
  s.notify();
}
void shared_set_error(slot& s, std::uint64_t v) noexcept {
  stripe* st = s.stripe_array();
  st[0].errors.store(v - st[1].errors.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  bump_silent(s);
  s.notify();
}

class shared_backend final : public backend {
 public:
  std::string_view name() const noexcept override { return seg_.dev_name; }
  counter_caps caps() const noexcept override {
    return counter_caps{UINT64_MAX, seg_.cell_count, 0};
  }
  std::error_code bind_counter(slot& s) noexcept override;
  void unbind_counter(slot& s) noexcept override;
  bool binds_counters() const noexcept override { return true; }
  shared_segment* shared() noexcept override { return &seg_; }
  shared_segment seg_;
};

std::error_code shared_backend::bind_counter(slot& s) noexcept {
  shared_segment& g = seg_;
  const std::uint32_t n = g.cell_count;
  const std::uint32_t start = g.hdr->alloc_hint.load(std::memory_order_relaxed) % n;
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint32_t i = start + k < n ? start + k : start + k - n;
    shm::record& r = g.records[i];
    std::uint64_t c = r.ctl.load(std::memory_order_relaxed);
    if (c != 0) continue;
    if (!r.ctl.compare_exchange_strong(c, shm::make_ctl(shm::cell_creating, g.bit()),
                                       std::memory_order_acquire))
      continue;
    g.hdr->alloc_hint.store(i + 1, std::memory_order_relaxed);
    shm::cell& cell = g.cells[i];
    for (shm::half& h : cell.h) {
      h.value.store(0, std::memory_order_relaxed);
      h.errors.store(0, std::memory_order_relaxed);
    }
    r.type.store(static_cast<std::uint32_t>(s.type), std::memory_order_relaxed);
    r.creator.store(g.me, std::memory_order_relaxed);
    const std::uint64_t gen = r.generation.load(std::memory_order_acquire);
    r.ctl.store(shm::make_ctl(shm::cell_live, g.bit()), std::memory_order_release);
    {
      std::lock_guard lock(g.mu);
      shared_segment::local& l = g.locals[i];
      l.s = &s;
      ++l.count;
      l.gen.store(gen, std::memory_order_relaxed);
    }
    g.bind(s, i);
    return {};
  }
  return fail(ENOMEM,
              "create_comp_cntr: the shared device '%s' has all its %u counters in use (by "
              "the processes that opened it)",
              g.dev_name.c_str(), n);
}

void shared_backend::unbind_counter(slot& s) noexcept {
  if (!is_shared(s) || s.backend_data != &seg_) return; // never bound (a failed create/resolve)
  shared_segment& g = seg_;
  const std::uint32_t i = g.cell_of(s);
  {
    // Before the slot's stripes (and then its extension block) go: the watcher only touches
    // registered slots, under watch_mu.
    std::lock_guard wl(g.watch_mu);
    g.watched.erase(std::remove(g.watched.begin(), g.watched.end(), &s), g.watched.end());
  }
  s.watch.fetch_and(~watch_shared, std::memory_order_relaxed);
  s.stripes = 0;
  s.stripe_mask_ = 0;
  s.hw = nullptr;
  s.backend_data = nullptr;
  std::lock_guard lock(g.mu);
  shared_segment::local& l = g.locals[i];
  if (l.s == &s) l.s = nullptr;
  if (l.count > 0 && --l.count == 0) g.release_cell(i);
}

} // namespace

const hw_counter_ops shared_counter_ops = {shared_add, shared_add_error, shared_set,
                                           shared_set_error, nullptr};

void notify_shared(slot& s) noexcept {
  shm::header& h = *seg_of(s).hdr;
  if (h.sleepers.load(std::memory_order_seq_cst) != 0) {
    // Bump first: a waiter between its read of the word and FUTEX_WAIT finds it changed.
    h.wake_seq.fetch_add(1, std::memory_order_release);
    futex::wake_shared(h.wake_seq);
  }
}

counter_id shared_counter_id(const slot& s) noexcept {
  const shared_segment& g = seg_of(s);
  const std::uint32_t i = g.cell_of(s);
  return {g.locals[i].gen.load(std::memory_order_relaxed), i};
}

std::uint32_t shared_silent_updates(const slot& s) noexcept {
  const shared_segment& g = seg_of(s);
  return g.records[g.cell_of(s)].silent_updates.load(std::memory_order_seq_cst);
}

shared_wait_words shared_words(const slot& s) noexcept {
  shared_segment& g = seg_of(s);
  return {&g.hdr->wake_seq, &g.hdr->sleepers, &g.hdr->proc_sleepers[g.me]};
}

bool shared_creator_died(const slot& s) noexcept {
  const shared_segment& g = seg_of(s);
  return shm::cell_state(g.records[g.cell_of(s)].ctl.load(std::memory_order_acquire)) ==
         shm::cell_dead;
}

std::unique_ptr<backend> open_shared_backend(std::string_view name, std::uint32_t flags,
                                             std::uint32_t mode, std::error_code& ec) noexcept {
  std::unique_ptr<shared_backend> be(new (std::nothrow) shared_backend);
  if (!be) {
    fail_into(ec, ENOMEM, "open_shared_device: out of memory");
    return nullptr;
  }
  if (auto e = be->seg_.open(name, flags, mode)) {
    ec = e;
    return nullptr;
  }
  be->seg_.locals.reset(new (std::nothrow) shared_segment::local[be->seg_.cell_count]);
  if (!be->seg_.locals) {
    fail_into(ec, ENOMEM, "open_shared_device: out of memory for %u counters' local state",
              be->seg_.cell_count);
    return nullptr;
  }
  ec.clear();
  return be;
}

slot* resolve_shared_slot(device_core& dev, counter_id id, std::error_code& ec) noexcept {
  shared_segment& g = *dev.shared();
  const char* n = g.dev_name.c_str();
  const unsigned long long idgen = id.generation;
  if (id.index >= g.cell_count) {
    fail_into(ec, ENOENT,
              "resolve: counter id {index %u, generation %llu} names no counter of '%s' (it "
              "has %u)",
              id.index, idgen, n, g.cell_count);
    return nullptr;
  }
  const std::uint32_t i = id.index;
  shm::record& r = g.records[i];
  auto stale = [&] {
    fail_into(ec, ESTALE,
              "resolve: counter id {index %u, generation %llu} of '%s' is stale: its counter "
              "was destroyed (the cell is at generation %llu)",
              i, idgen, n,
              static_cast<unsigned long long>(r.generation.load(std::memory_order_relaxed)));
    return static_cast<slot*>(nullptr);
  };
  auto gone = [&](std::uint64_t st) {
    fail_into(ec, ENOENT,
              "resolve: counter id {index %u, generation %llu} of '%s' names no live counter "
              "(%s)",
              i, idgen, n,
              st == shm::cell_dead     ? "its creator died"
              : st == shm::cell_orphan ? "its creator destroyed it"
                                       : "it was never created or is being created");
    return static_cast<slot*>(nullptr);
  };
  if (r.generation.load(std::memory_order_acquire) != id.generation) return stale();
  std::lock_guard lock(g.mu);
  shared_segment::local& l = g.locals[i];
  // Resolvable only while its creator holds it (a holder's own slot does not revive it).
  if (const std::uint64_t st = shm::cell_state(r.ctl.load(std::memory_order_acquire));
      st != shm::cell_live)
    return gone(st);
  if (l.count > 0 && l.s != nullptr && l.gen.load(std::memory_order_relaxed) == id.generation &&
      take_counter_ref(*l.s)) {
    ec.clear();
    return l.s; // this process's slot of the counter (its creator's, or a resolved one)
  }
  // A new local slot (before taking the cell: a refused allocation changes nothing).
  slot* s = dev.pool().allocate(-1, ec);
  if (s == nullptr) return nullptr;
  reset_field(s->dev, &dev);
  auto undo = [&](slot* res) {
    unref_counter_slot(*s); // never bound: straight back to the pool
    return res;
  };
  std::uint64_t c = r.ctl.load(std::memory_order_acquire);
  if (l.count == 0) {
    for (;;) {
      if (shm::cell_state(c) != shm::cell_live) return undo(gone(shm::cell_state(c)));
      if (r.ctl.compare_exchange_weak(c, c | g.bit(), std::memory_order_acq_rel,
                                      std::memory_order_acquire))
        break;
    }
    // Recycled between the generation check and the CAS: the bit is on a newer counter.
    if (r.generation.load(std::memory_order_acquire) != id.generation) {
      g.release_cell(i);
      return undo(stale());
    }
  } else if (shm::cell_state(c) != shm::cell_live) {
    return undo(gone(shm::cell_state(c)));
  }
  const std::uint32_t type = r.type.load(std::memory_order_relaxed);
  if (type > static_cast<std::uint32_t>(counter_type::bytes)) {
    if (l.count == 0) g.release_cell(i);
    fail_into(ec, EBADMSG, "resolve: counter %u of '%s' has a corrupt type (%u) in the segment", i,
              n, type);
    return undo(nullptr);
  }
  s->type = static_cast<counter_type>(type);
  l.s = s;
  ++l.count;
  l.gen.store(id.generation, std::memory_order_relaxed);
  g.bind(*s, i);
  ec.clear();
  return s;
}

} // namespace compcntr::detail
