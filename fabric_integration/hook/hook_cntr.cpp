// Hook counters (hook_cntr.hpp says what they are): fi_cntr_open, fi_close, the reads and updates
// of cntr_base's table, the FI_GETWAIT and bind entries, and the live list the progress thread
// and the statistics walk. fi_cntr_wait and fi_trywait: cntr_wait.cpp.
#include "hook_cntr.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>

#include "../cntr_base.hpp"
#include "../cntr_classes.h"
#include "../mirror_core.hpp"

namespace compcntr_hook {
using namespace cntr_detail;

// ---- the live list (progress thread, statistics) ----------------------------------------------

std::mutex live_mu;
hook_cntr* live_head = nullptr;

void live_add(hook_cntr* h) noexcept {
  std::lock_guard lk(live_mu);
  h->prev = nullptr;
  h->next = live_head;
  if (live_head) live_head->prev = h;
  live_head = h;
}
void live_remove(hook_cntr* h) noexcept {
  std::lock_guard lk(live_mu);
  if (h->prev)
    h->prev->next = h->next;
  else
    live_head = h->next;
  if (h->next) h->next->prev = h->prev;
  h->prev = h->next = nullptr;
}

// fi_cntr_read / fi_cntr_readerr (cntr_base's table: drive, after, then cc's value). Caller
// progress: pull from the provider (which runs its progress, as fi_cntr_read of the provider's
// own counter does). Progress thread: the thread pulls; a read is a load, and every
// k_reader_pull_every-th read of the counter pulls too (a spinning reader drives progress).
namespace {
// The counter whose completion value this thread's drive() pulled, for after() (one read).
thread_local const hook_cntr* t_drive_pulled = nullptr;
} // namespace

void hook_cntr::drive(hook_cntr& h, bool err) noexcept {
  const std::uint64_t n = bump(err ? h.readerrs : h.reads);
  const bool counted = !by_thread(&h) || n % k_reader_pull_every == 0;
  if (h.hidden && (counted || g_thread_backed_off.load(std::memory_order_relaxed))) {
    if (err) {
      h.m.pull_err();
    } else {
      h.m.pull_comp();
      t_drive_pulled = &h;
    }
    if (counted) note_caller_pull(&h);
  }
}
// The layer's round need not drive the provider again for the counter just read: on
// tcp;ofi_rxm every provider read is a progress call (poll system calls), and a reader spinning on
// a triggering counter paid two per read (P17 (b)).
void hook_cntr::after(hook_cntr& h) noexcept {
  const hook_cntr* const pulled = t_drive_pulled == &h ? &h : nullptr;
  t_drive_pulled = nullptr;
  layer_progress(pulled);
}
void hook_cntr::on_readerr(hook_cntr& h, std::uint64_t e) noexcept {
  if (h.sockets) h.err_at_readerr.store(e, std::memory_order_relaxed);
}

namespace {

// add/set: the provider's counter first (its answer is the application's answer; a refusal
// changes nothing), then cc and the mirror's baseline, all inside one resync so no pull mixes a
// value from before with one from after.
int cntr_add_(hook_cntr* h, uint64_t value) {
  if (!h->hidden) return h->update_cc(update_op::add, value);
  return h->m.resync([&](std::uint64_t& last, std::uint64_t&) {
    const int r = fi_cntr_add(h->hidden, value);
    if (r != 0) return r;
    last += value;
    compcntr_inc_comp_cntr(h->cc, value);
    return 0;
  });
}
int cntr_adderr_(hook_cntr* h, uint64_t value) {
  if (!h->hidden) return h->update_cc(update_op::adderr, value);
  return h->m.resync([&](std::uint64_t&, std::uint64_t& last_err) {
    const int r = fi_cntr_adderr(h->hidden, value);
    if (r != 0) return r;
    last_err += value;
    compcntr_inc_err_comp_cntr(h->cc, value);
    return 0;
  });
}
// After a set, until the provider's reads show the value set, an older and larger value read
// would be taken as growth past the new baseline -- for good: once the provider's value is the
// one set, it is below the baseline and every later gain is "stale" until it passes it. A
// provider read that lags the provider's own set (a counter a NIC writes back to memory; the
// fault provider's 'lag', which found this: fi_cntr_set(c, 3) after 42 read 42 through the hook
// from then on) is therefore read until it shows the value, a bounded number of times (events
// counted right after the set keep it from ever matching: then the baseline is the value set, as
// before). Not while an endpoint bound to the counter is not enabled (rxm and shm progress it on
// a read and crash on such an endpoint).
void settle(hook_cntr* h, bool err, std::uint64_t value) noexcept {
  if (h->pending.load(std::memory_order_acquire) != 0) return;
  const std::uint64_t mask = h->m.mask(), want = value & mask;
  for (int i = 0; i < 64; ++i)
    if (((err ? fi_cntr_readerr(h->hidden) : fi_cntr_read(h->hidden)) & mask) == want) return;
}

int cntr_set_(hook_cntr* h, uint64_t value) {
  if (!h->hidden) return h->update_cc(update_op::set, value);
  return h->m.resync([&](std::uint64_t& last, std::uint64_t&) {
    const int r = fi_cntr_set(h->hidden, value);
    if (r != 0) return r;
    settle(h, false, value);
    last = value;
    compcntr_set_comp_cntr(h->cc, value);
    return 0;
  });
}
int cntr_seterr_(hook_cntr* h, uint64_t value) {
  if (!h->hidden) return h->update_cc(update_op::seterr, value);
  return h->m.resync([&](std::uint64_t&, std::uint64_t& last_err) {
    const int r = fi_cntr_seterr(h->hidden, value);
    if (r != 0) return r;
    settle(h, true, value);
    last_err = value;
    compcntr_set_err_comp_cntr(h->cc, value);
    return 0;
  });
}

} // namespace

int hook_cntr::update(hook_cntr& h, update_op op, std::uint64_t v) noexcept {
  switch (op) {
    case update_op::add: return cntr_add_(&h, v);
    case update_op::set: return cntr_set_(&h, v);
    case update_op::adderr: return cntr_adderr_(&h, v);
    case update_op::seterr: return cntr_seterr_(&h, v);
  }
  return -FI_EINVAL;
}

namespace {

// ---- fi_ops ------------------------------------------------------------------------------------

// fi_close: the provider decides (-FI_EBUSY while its counter is bound to an endpoint or MR, as
// without the hook); only then is cc destroyed. If cc cannot be destroyed (the application
// attached it to a compcntr QP itself) the call is -FI_EBUSY and the counter stays usable as a
// plain compcntr counter (the provider's is gone).
int cntr_close(fid* f) {
  hook_cntr* h = of(f);
  // ofi_compcntr: work that would still update this counter keeps it (nothing is closed).
  if (const layer_ops* l = layer(); l && l->cntr_closing)
    if (const int r = l->cntr_closing(&h->cntr)) return r;
  live_remove(h); // the progress thread no longer touches it
  if (h->hidden) {
    const int r = fi_close(&h->hidden->fid);
    if (r != 0) {
      live_add(h);
      return r;
    }
    h->hidden = nullptr;
  }
  if (h->waitset) {
    fi_close(&h->waitset->fid); // after the hidden counter that was on it
    h->waitset = nullptr;
  }
  if (h->epfd >= 0) {
    ::close(h->epfd);
    h->epfd = -1;
  }
  if (const int err = compcntr_destroy_comp_cntr(h->cc)) {
    FI_WARN(&self(), FI_LOG_CNTR, "fi_close: the compcntr counter cannot be destroyed: %s\n",
            compcntr_last_error_message());
    return -err;
  }
  statistics& s = stats();
  s.reads.fetch_add(h->reads.load(std::memory_order_relaxed), std::memory_order_relaxed);
  s.readerrs.fetch_add(h->readerrs.load(std::memory_order_relaxed), std::memory_order_relaxed);
  s.waits.fetch_add(h->waits.load(std::memory_order_relaxed), std::memory_order_relaxed);
  s.cntr_closed.fetch_add(1, std::memory_order_relaxed);
  delete h;
  return 0;
}

// Anything else on the counter's fid is the provider's business (FI_GETOPSFLAG, sockets'
// FI_GETWAIT of a mutex/cond, ...), except FI_GETWAIT of an FI_WAIT_FD counter, which is ours:
// a real fd (libfabric's util counters have none to give).
int cntr_control(fid* f, int command, void* arg) {
  hook_cntr* h = of(f);
  if (int rc; h->control(command, arg, h->epfd >= 0 ? h->epfd : h->fd, &rc)) return rc;
  if (!h->hidden) return -FI_ENOSYS;
  return h->hidden->fid.ops->control(&h->hidden->fid, command, arg);
}
int cntr_bind(fid* f, fid* bfid, uint64_t flags) {
  hook_cntr* h = of(f);
  if (!h->hidden) return -FI_ENOSYS;
  return h->hidden->fid.ops->bind(&h->hidden->fid, bfid, flags);
}
int cntr_ops_open(fid* f, const char* name, uint64_t flags, void** ops, void* context) {
  hook_cntr* h = of(f);
  if (!h->hidden) return -FI_ENOSYS;
  return h->hidden->fid.ops->ops_open(&h->hidden->fid, name, flags, ops, context);
}

fi_ops cntr_fid_ops = {
    .size = sizeof(fi_ops),
    .close = cntr_close,
    .bind = cntr_bind,
    .control = cntr_control,
    .ops_open = cntr_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

// The width of the provider's counter values: sockets keeps int32 values, util counters 64-bit.
// Probed on the fresh counter (nothing is bound to it yet; the read runs an empty progress).
unsigned probe_bits(fid_cntr* hidden) noexcept {
  constexpr std::uint64_t probe = (std::uint64_t{1} << 32) | 1;
  if (fi_cntr_set(hidden, probe) != 0) return 64;
  const std::uint64_t v = fi_cntr_read(hidden);
  fi_cntr_set(hidden, 0);
  return v == probe ? 64 : 32;
}

} // namespace

hook_cntr* as_hook_cntr(const fid* f) noexcept {
  if (f == nullptr || f->fclass != FI_CLASS_CNTR || f->ops != &cntr_fid_ops) return nullptr;
  return compcntr_fabric::of<hook_cntr>(const_cast<fid*>(f));
}

fid_cntr* hidden_of(hook_cntr* c) noexcept { return c->hidden; }
compcntr_comp_cntr* comp_of(hook_cntr* c) noexcept { return c->cc; }
void pull(hook_cntr* c) noexcept {
  // Not while the counter is bound to an endpoint that is not enabled (or a bind of it was
  // refused): reading the provider's counter progresses its endpoints, and shm and rxm crash on
  // one not enabled yet (issue 22, fuzz_fi_ofi: ofi_compcntr's progress round pulled such a
  // counter when the application read another one). The progress thread skips them too.
  if (c->hidden && c->pending.load(std::memory_order_acquire) == 0) c->m.pull_comp();
}

void note_bound(hook_cntr*) noexcept { stats().cntr_bound.fetch_add(1, std::memory_order_relaxed); }

int bind_hidden(const fi_ops* orig, fid* f, hook_cntr* h, std::uint64_t flags) noexcept {
  fid_cntr* hidden = hidden_of(h);
  if (hidden == nullptr) return -FI_EINVAL;
  const int r = orig->bind(f, &hidden->fid, flags);
  if (r == 0) note_bound(h);
  return r;
}

void pending_add(hook_cntr* c, int delta) noexcept {
  c->pending.fetch_add(delta, std::memory_order_acq_rel);
}

void polled_add(hook_cntr* c, int delta) noexcept {
  c->polled.fetch_add(delta, std::memory_order_relaxed);
}

std::uint64_t caller_pulls() noexcept { return g_caller_pulls.load(std::memory_order_relaxed); }
std::uint64_t waiter_pulls() noexcept { return g_waiter_pulls.load(std::memory_order_relaxed); }
void set_thread_backed_off(bool on) noexcept {
  g_thread_backed_off.store(on, std::memory_order_relaxed);
}

int cntr_open(fid_domain* domain, fi_cntr_attr* attr, fid_cntr** cntr, void* context) noexcept {
  static const int registered =
      compcntr_fi_register_cntr_class(&cntr_fid_ops, compcntr_fabric::base_cc);
  (void)registered;
  stats().cntr_open.fetch_add(1, std::memory_order_relaxed); // every call, as PLAN.md fixes
  domain_state* ds = find_domain(domain);
  if (ds == nullptr || ds->orig == nullptr)
    return -FI_EINVAL; // not a hooked domain (cannot happen)
  if (cntr == nullptr) return -FI_EINVAL;
  fi_cntr_attr a{};
  a.events = FI_CNTR_EVENTS_COMP;
  a.wait_obj = FI_WAIT_NONE;
  if (attr != nullptr) a = *attr; // fi_cntr(3) defaults for NULL (libfabric itself would crash)

  // FI_WAIT_SET without a wait set: the sockets provider (1.17) dereferences the NULL pointer
  // and crashes; the hook answers -FI_EINVAL there, as libfabric's util counters do (the others
  // answer for themselves: util -FI_EINVAL, shm -FI_ENOSYS).
  if (raw_wait(a) == FI_WAIT_SET && a.wait_set == nullptr && ds->fabric && ds->fabric->sockets) {
    stats().cntr_open_refused.fetch_add(1, std::memory_order_relaxed);
    return -FI_EINVAL;
  }
  // The provider validates the attributes and answers exactly as without the hook.
  fid_cntr* hidden = nullptr;
  int r = ds->orig->cntr_open(domain, &a, &hidden, context);
  if (r != 0) {
    stats().cntr_open_refused.fetch_add(1, std::memory_order_relaxed);
    return r;
  }
  // FI_WAIT_FD / FI_WAIT_UNSPEC: reopen the provider's counter on a wait set of ours, whose fd
  // the provider signals (see hook_cntr's waitset). Where the provider refuses, the counter
  // opened above stays (then FI_GETWAIT gives cc's eventfd, which only the hook's own updates
  // signal, and waits poll the provider in 1 ms slices).
  fid_wait* waitset = nullptr;
  int wait_fd = -1;
  // Not for sockets' FI_WAIT_UNSPEC counters: sockets signals a wait set by writing a byte per
  // update into a socket pair that only fi_wait empties, so the wait set of a counter nobody waits
  // on (a send counter) fills up and blocks sockets' progress thread for good. (An FI_WAIT_FD
  // counter of sockets has that property without the hook too.)
  const bool sockets = ds->fabric && ds->fabric->sockets;
  if ((raw_wait(a) == FI_WAIT_FD || (raw_wait(a) == FI_WAIT_UNSPEC && !sockets)) && ds->fabric &&
      ds->fabric->fabric) {
    fi_wait_attr wa{};
    wa.wait_obj = FI_WAIT_FD;
    if (fi_wait_open(ds->fabric->fabric, &wa, &waitset) == 0) {
      fi_cntr_attr on_set = a;
      on_set.wait_obj = FI_WAIT_SET;
      on_set.wait_set = waitset;
      fid_cntr* h2 = nullptr;
      if (fi_control(&waitset->fid, FI_GETWAIT, &wait_fd) == 0 && wait_fd >= 0 &&
          ds->orig->cntr_open(domain, &on_set, &h2, context) == 0) {
        fi_close(&hidden->fid);
        hidden = h2;
      } else {
        fi_close(&waitset->fid);
        waitset = nullptr;
        wait_fd = -1;
      }
    } else {
      waitset = nullptr;
    }
  }
  auto drop_waitset = [&] {
    if (waitset) fi_close(&waitset->fid);
  };
  auto unhooked = [&](const char* why) {
    if (waitset) { // the application gets the provider's counter: give it one without our set
      fid_cntr* plain = nullptr;
      fi_close(&hidden->fid);
      drop_waitset();
      waitset = nullptr;
      const int r2 = ds->orig->cntr_open(domain, &a, &plain, context);
      if (r2 != 0) return r2;
      hidden = plain;
    }
    // Without compcntr the application still gets a working counter: the provider's own.
    FI_WARN(&self(), FI_LOG_CNTR, "fi_cntr_open: %s: %s; returning the provider's counter\n", why,
            compcntr_last_error_message());
    *cntr = hidden;
    return 0;
  };
  compcntr_device* dev = device();
  if (dev == nullptr) return unhooked("no compcntr device");
  compcntr_comp_cntr_init_attr ia{};
  ia.type = COMPCNTR_COMP_CNTR_TYPE_WRS;
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &ia);
  if (cc == nullptr) return unhooked("compcntr_create_comp_cntr failed");
  int fd = -1, epfd = -1;
  if (raw_wait(a) == FI_WAIT_FD || waitset != nullptr) {
    bool ok = compcntr_comp_cntr_get_fd(cc, &fd) == 0;
    if (ok && waitset != nullptr) {
      epfd = ::epoll_create1(EPOLL_CLOEXEC);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ok = epfd >= 0 && ::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0 &&
           ::epoll_ctl(epfd, EPOLL_CTL_ADD, wait_fd, &ev) == 0;
    }
    if (!ok) {
      const int err = errno;
      if (epfd >= 0) ::close(epfd);
      compcntr_destroy_comp_cntr(cc);
      fi_close(&hidden->fid);
      drop_waitset();
      stats().cntr_open_refused.fetch_add(1, std::memory_order_relaxed);
      return err != 0 ? -err : -FI_EMFILE; // FI_E* values are the errno values
    }
  }
  auto* h = new (std::nothrow) hook_cntr;
  if (h == nullptr) {
    if (epfd >= 0) ::close(epfd);
    compcntr_destroy_comp_cntr(cc);
    return unhooked("out of memory");
  }
  h->hidden = hidden;
  h->waitset = waitset;
  h->epfd = epfd;
  h->wait_fd = waitset != nullptr ? wait_fd : -1;
  h->fabric = ds->fabric ? ds->fabric->fabric : nullptr;
  h->cc = cc;
  h->wait_obj = raw_wait(a);
  h->fd = fd;
  h->sockets = ds->fabric && ds->fabric->sockets;
  h->thread = ds->progress_thread;
  h->auto_progress = ds->auto_progress;
  const unsigned bits = probe_bits(hidden);
  h->m.init_at(hidden, cc, bits, 0, 0);
  // Can the provider's counter be waited on? A threshold of 0 is met at once where it can.
  const int w = fi_cntr_wait(hidden, 0, 0);
  h->wait_rc = (w == -FI_ENOSYS || w == -FI_EOPNOTSUPP || w == -FI_EINVAL) ? w : 0;
  // sockets signalled the probe's sets on the wait set: not news for the first fi_trywait.
  drain_sockets_waitset(h);
  // ofi_compcntr is a provider of its own: its counters serve fi_cntr_wait whatever the wait
  // object (compcntr's wait, driving the provider below), as sockets' do and fi_trigger
  // programs expect (fabtests wait on FI_WAIT_NONE counters); the hook answers as the provider.
  if (layer() != nullptr) h->wait_rc = 0;
  h->init_fid(&cntr_fid_ops, &compcntr_fabric::cntr_ops<hook_cntr>::table, context);
  live_add(h);
  stats().cntr_served.fetch_add(1, std::memory_order_relaxed);
  *cntr = &h->cntr;
  return 0;
}

bool progress_all() noexcept {
  bool any = false;
  std::lock_guard lk(live_mu);
  for (hook_cntr* h = live_head; h != nullptr; h = h->next)
    if (h->thread && h->hidden && h->pending.load(std::memory_order_acquire) == 0) {
      any |= h->m.pull_comp();
      any |= h->m.pull_err();
    }
  return any;
}

void pull_polled() noexcept {
  std::lock_guard lk(live_mu);
  for (hook_cntr* h = live_head; h != nullptr; h = h->next)
    if (by_thread(h) && h->hidden && h->polled.load(std::memory_order_relaxed) > 0) {
      h->m.pull_comp();
      h->m.pull_err();
      note_waiter_pull(h);
    }
}

bool sum_live_counts(std::uint64_t& reads, std::uint64_t& readerrs, std::uint64_t& waits) noexcept {
  // An abandoned progress thread (progress.cpp) may hold live_mu for good, blocked on a provider
  // lock the exiting thread holds: then the live counters' counts are left out.
  std::unique_lock lk(live_mu, std::try_to_lock);
  if (!lk.owns_lock()) {
    if (progress_thread_abandoned()) return false;
    lk.lock();
  }
  for (hook_cntr* h = live_head; h != nullptr; h = h->next) {
    reads += h->reads.load(std::memory_order_relaxed);
    readerrs += h->readerrs.load(std::memory_order_relaxed);
    waits += h->waits.load(std::memory_order_relaxed);
  }
  return true;
}

} // namespace compcntr_hook
