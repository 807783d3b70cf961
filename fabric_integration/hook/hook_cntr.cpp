// Hook counters: what fi_cntr_open returns under FI_HOOK=compcntr (docs/hook.md).
//
// A hook counter is a struct fid_cntr of ours served by a compcntr counter (`cc`: a padded pool
// slot on the opening thread's NUMA node; compcntr's waits, fds, poll_any, trackers work on it
// through compcntr_fi_cntr_comp_cntr). Behind it stands a *hidden* counter of the provider,
// opened in the same fi_cntr_open call with the application's attributes and context:
//   * every bind the application makes (fi_ep_bind, fi_mr_bind, fi_poll_add, FI_TRIGGER
//     contexts, deferred work) is made with the hidden counter, so the provider counts
//     everything it counts (no CQ entry needed, remote RMA events, errors) and answers every
//     bind error, attribute error and -FI_EBUSY itself -- exactly as without the hook;
//   * a mirror (mirror_core.hpp) carries what the hidden counter gains into cc: fi_cntr_read
//     pulls the completion value, fi_cntr_readerr the error value, fi_cntr_wait both (caller
//     progress, as libfabric's counters drive their endpoints); with the progress thread the
//     thread pulls and the reads are a load;
//   * fi_cntr_add/set/adderr/seterr are applied to the hidden counter and to cc together, under
//     the mirror's resync, so the provider's value (which its triggered operations watch) and
//     the application's stay equal.
#include "hook.hpp"

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

// The fid_cntr, cc, the wait object, the FI_GETWAIT fd, the ops table and trywait's check are
// cntr_base's (../cntr_base.hpp, shared with the adapter); the hook supplies its progress (pull
// the provider's counter through the mirror) and its updates (the provider's counter first).
struct hook_cntr : compcntr_fabric::cntr_base {
  fid_cntr* hidden = nullptr; // the provider's counter (nullptr only after a half-failed close)
  compcntr_fabric::mirror_core m;
  int wait_rc = 0; // the provider's answer to a wait (-FI_ENOSYS for FI_WAIT_NONE
      // util counters), probed at open; 0: waits are served
  bool sockets = false; // sockets semantics for -FI_EAVAIL (see cntr_wait)
  bool thread = false; // the progress thread drives this counter
  bool auto_progress = false; // the provider moves data itself: waits block at once
  // The provider side of blocking (FI_WAIT_FD and FI_WAIT_UNSPEC counters, where the provider
  // lets its counter join an FI_WAIT_FD wait set): the hidden counter is opened on `waitset`,
  // whose fd the provider makes readable when it has work for the counter's endpoints (rxm: the
  // tcp CQ and EQ fds; rxd: the udp CQ fd; sockets: a signal on every update). `epfd` is an
  // epoll set of that fd and cc's eventfd: readable when either side has news. For FI_WAIT_FD
  // counters it is the fd FI_GETWAIT hands out.
  fid_wait* waitset = nullptr;
  int epfd = -1;
  int wait_fd = -1; // the wait set's fd (in epfd; a waiter polls it directly)
  fid_fabric* fabric = nullptr; // the hooked fabric (fi_trywait on waitset)
  std::atomic<std::uint64_t> err_at_readerr{0}; // sockets: error value at the last readerr
  // Statistics: relaxed load+store (not an RMW: no locked instruction on the read path; under
  // concurrent reads of one counter a count may be lost, the stats line is a proof of use, not
  // an exact tally).
  std::atomic<std::uint64_t> reads{0}, readerrs{0}, waits{0};
  std::atomic<int> pending{0}; // bindings to endpoints not enabled yet (progress thread waits)
  std::atomic<int> polled{0}; // poll sets holding the hidden counter (fi_poll: pull_polled)
  hook_cntr* prev = nullptr; // the live list (under live_mu)
  hook_cntr* next = nullptr;

  // cntr_base's class interface (defined below).
  static void drive(hook_cntr& h, bool err) noexcept;
  static int update(hook_cntr& h, compcntr_fabric::update_op op, std::uint64_t v) noexcept;
  static int wait(hook_cntr& h, std::uint64_t threshold, int timeout) noexcept;
  static void after(hook_cntr& h) noexcept;
  static void on_readerr(hook_cntr& h, std::uint64_t e) noexcept;
};

namespace {

using compcntr_fabric::update_op;
inline hook_cntr* of(fid* f) noexcept { return compcntr_fabric::of<hook_cntr>(f); }

// The integer in the wait object field (a C caller may store any int there).
int raw_wait(const fi_cntr_attr& a) noexcept { return compcntr_fabric::raw_enum(a.wait_obj); }

// Whether the progress thread drives this counter now: a thread domain, and no binding to an
// endpoint that is not enabled yet (or whose bind failed). Otherwise the application's calls
// drive it (caller progress), exactly as without the thread.
inline bool by_thread(const hook_cntr* h) noexcept {
  return h->thread && h->pending.load(std::memory_order_acquire) == 0;
}

inline std::uint64_t bump(std::atomic<std::uint64_t>& a) noexcept {
  const std::uint64_t n = a.load(std::memory_order_relaxed) + 1;
  a.store(n, std::memory_order_relaxed);
  return n;
}

// With the progress thread, every k_reader_pull_every-th fi_cntr_read / fi_cntr_readerr of a
// counter also pulls (drives the provider) in the caller. A thread spinning on the read (the
// fabtests ping-pong's wait) then does not depend on the progress thread being scheduled: on a
// 2-CPU machine with two such processes the thread ran a round only every few hundred us (round
// trips of 630-960 us against 27 us with caller progress). 256: a read is a few ns and a pull
// about 1 us on tcp;ofi_rxm, so a spinning reader pulls about once per us and an idle read costs
// under 1% more on average (P14).
constexpr std::uint64_t k_reader_pull_every = 256;

// Pulls made by application threads of thread-mode counters (spinning readers, waiters, fi_poll).
// The progress thread backs off while this moves (caller_pulls()): the application is driving
// progress itself, and a busy thread beside it only takes the CPU and the endpoint locks.
std::atomic<std::uint64_t> g_caller_pulls{0};
inline void note_caller_pull(const hook_cntr* h) noexcept {
  if (h->thread) g_caller_pulls.fetch_add(1, std::memory_order_relaxed);
}

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

// ---- fi_ops_cntr -------------------------------------------------------------------------------

// ofi_compcntr's deferred work (layer_ops::progress) after the counter calls; the hook has none.
inline void layer_progress() noexcept {
  if (const layer_ops* l = layer()) l->progress();
}

} // namespace

// fi_cntr_read / fi_cntr_readerr (cntr_base's table: drive, after, then cc's value). Caller
// progress: pull from the provider (which runs its progress, as fi_cntr_read of the provider's
// own counter does). Progress thread: the thread pulls; a read is a load, and every
// k_reader_pull_every-th read of the counter pulls too (a spinning reader drives progress).
void hook_cntr::drive(hook_cntr& h, bool err) noexcept {
  const std::uint64_t n = bump(err ? h.readerrs : h.reads);
  if (h.hidden && (!by_thread(&h) || n % k_reader_pull_every == 0)) {
    if (err)
      h.m.pull_err();
    else
      h.m.pull_comp();
    note_caller_pull(&h);
  }
}
void hook_cntr::after(hook_cntr&) noexcept { layer_progress(); }
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

// A waiter drives progress itself, with or without the progress thread: it has nothing else to
// do, and waking it through the thread costs a scheduling round (see k_reader_pull_every).
void progress_both(void* ctx) noexcept {
  hook_cntr* h = static_cast<hook_cntr*>(ctx);
  // Not once fi_close closed the provider's counter and compcntr's stayed (a trigger holds it):
  // the mirror still names the freed provider counter (issue 22, fuzz_fi_hook: an FI_WAIT_YIELD
  // wait on such a counter read it).
  if (h->hidden) {
    h->m.pull_comp();
    h->m.pull_err();
    note_caller_pull(h);
  }
  layer_progress();
}

// A wait with no provider fd to sleep on (shm; see cntr_wait): the first k_pure_spin rounds
// spin (a quick answer costs no system call), later rounds yield the CPU between checks (the peer
// process, or another task, may need this CPU: libfabric's own shm wait keeps polling, and a
// non-yielding spin followed by 1 ms sleeps lost to it 1.1-2.3x in P13 under load).
struct spin_then_yield {
  hook_cntr* h;
  std::uint32_t rounds = 0;
};
constexpr std::uint32_t k_pure_spin = 64; // ~1-10 us of shm progress rounds
void progress_spin_then_yield(void* ctx) noexcept {
  auto* s = static_cast<spin_then_yield*>(ctx);
  progress_both(s->h);
  if (++s->rounds > k_pure_spin) sched_yield();
}

bool err_since_readerr(hook_cntr* h) noexcept {
  if (!by_thread(h) && h->hidden) h->m.pull_err();
  return h->errors() != h->err_at_readerr.load(std::memory_order_relaxed);
}

// fi_cntr_wait. Results as libfabric's counters give them:
//  * 0 when the value is >= threshold; -FI_ETIMEDOUT after `timeout` ms (< 0: forever, 0: check
//    once); -FI_EAVAIL when the error value changes during the wait (util counters: tcp, udp,
//    shm, rxm, rxd -- reaching the threshold wins a tie, as in util's loop). The sockets
//    provider reports -FI_EAVAIL for any error since the last fi_cntr_readerr, before and after
//    the wait, error first: that is kept for sockets fabrics.
//  * whatever the provider answers when its counter cannot be waited on (util counters opened
//    with FI_WAIT_NONE: -FI_ENOSYS), probed at open.
// Where libfabric is weak it is not followed: the wait drives the provider's progress between
// checks (with or without the progress thread) and sleeps on the provider's wait-set fds
// (wait_on_fds) or, without them, in compcntr's futex at most 1 ms at a time after up to 10x
// COMPCNTR_FI_WAIT_SPIN_US of checks, never in 50 ms quanta. FI_WAIT_YIELD yields between
// checks and never sleeps.
// Arms both sides of epfd: cc's eventfd (armed: the next update makes it readable) and the
// provider's wait set (fi_trywait resets it; sockets' wait set keeps one byte per signal until
// fi_wait reads it, so it is drained first). -FI_EAGAIN: the provider has work pending now.
// Order matters: the wait set is reset first, cc's fd armed next, and only then are the
// provider's values pulled (by the caller): an update after the reset signals the wait set
// again, one the pull carries into cc makes the armed fd readable, so none is lost between the
// check and the sleep.
// Returns whether it drained any signal (an update the provider signalled since the last drain).
bool drain_sockets_waitset(hook_cntr* h) noexcept {
  int i = 0;
  if (h->sockets && h->waitset != nullptr)
    while (i < 4096 && fi_wait(h->waitset, 0) == 0) ++i;
  return i > 0;
}
// The provider side alone (wait_on_fds arms cc's fd later, see there).
int arm_provider(hook_cntr* h) noexcept {
  drain_sockets_waitset(h);
  if (h->waitset == nullptr) return 0;
  fid* w = &h->waitset->fid;
  return fi_trywait(h->fabric, &w, 1);
}

// fi_cntr_wait of a counter with a provider wait set (with or without the progress thread): one
// progress round (plus, only if COMPCNTR_FI_WAIT_SPIN_US is set, a spin driving progress and
// yielding for that long: config::fd_wait_spin_ns says why not by default), then sleep in
// poll(2) on epfd, armed on both sides, so that the
// provider's own fds (a socket with data, a connection request) or an update of cc wake the
// waiter at once. Sleeps are capped at 10 ms (a safety net for provider work no fd reports);
// libfabric's util wait instead sleeps in 50 ms quanta.
int wait_on_fds(hook_cntr* h, std::uint64_t threshold, int timeout) noexcept {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout < 0 ? 0 : timeout);
  const std::uint64_t err0 = h->errors();
  // One check driving the provider: the completion value first, the error value only while the
  // threshold is not met (reaching the threshold wins a tie, as in util's wait), so a wait that
  // ends costs one provider read, not two.
  auto check = [&]() noexcept -> int {
    h->m.pull_comp();
    note_caller_pull(h);
    layer_progress();
    if (h->value() >= threshold) return 0;
    h->m.pull_err();
    if (h->errors() != err0) return -FI_EAVAIL;
    return 1;
  };
  // One check before arming: a wait called right after a read that saw too little usually finds
  // the answer at its first provider read (fabtests' loop "read; wait"), and then costs no arm.
  if (const int r = check(); r <= 0) return r;
  // With FI_PROGRESS_AUTO (sockets) the provider's thread moves the data: spinning here would
  // only take a CPU from it (two ping-pong processes and their provider threads on two CPUs), so
  // the waiter blocks on the fds at once; their signal comes with each update.
  const auto spin_end =
      start + std::chrono::nanoseconds(h->auto_progress ? 0 : cfg().fd_wait_spin_ns);
  for (;;) {
    const auto now = clock::now();
    if (now < spin_end) {
      if (const int r = check(); r <= 0) return r;
      sched_yield(); // the peer process may need this CPU (see fd_wait_spin_ns)
      continue;
    }
    // The provider's wait set is reset first, then checked (pulling): provider work after the
    // reset signals the wait set. cc's fd is armed only after that check, when a sleep follows:
    // armed during our own pull, the pull's update would write the eventfd (and the next arm
    // read it back), two system calls per wait for nothing. An update of cc by another thread
    // (the progress thread, another reader's pull, fi_cntr_add) after the arm signals the fd; one
    // before it is seen by the loads that follow the arm (its seq_cst fence).
    const int armed = arm_provider(h);
    if (const int r = check(); r <= 0) return r;
    if (timeout >= 0 && now >= deadline) return -FI_ETIMEDOUT;
    if (armed == -FI_EAGAIN) continue; // work pending: progress again, no sleep
    if (const layer_ops* l = layer(); l && l->busy()) continue; // the layer's posts to retry
    if (compcntr_comp_cntr_arm_fd(h->cc) != 0) return -FI_EINVAL;
    if (h->value() >= threshold) return 0;
    if (h->errors() != err0) return -FI_EAVAIL;
    std::int64_t ms = 10;
    if (timeout >= 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
      if (left < ms) ms = left;
    }
    // The two fds directly, not epfd: one epoll level less between a socket and the waiter
    // (the wait set's fd is itself an epoll fd), as deep as libfabric's own wait.
    pollfd p[2] = {{h->wait_fd, POLLIN, 0}, {h->fd, POLLIN, 0}};
    ::poll(p, 2, static_cast<int>(ms));
    if (const int r = check(); r <= 0) return r; // woken: check before arming again
  }
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

int hook_cntr::wait(hook_cntr& hc, std::uint64_t threshold, int timeout) noexcept {
  hook_cntr* h = &hc;
  bump(h->waits);
  if (h->wait_rc != 0) return h->wait_rc;
  if (h->sockets && err_since_readerr(h)) return -FI_EAVAIL;
  if (h->epfd >= 0 && h->hidden != nullptr && h->wait_obj != FI_WAIT_YIELD) {
    const int r = wait_on_fds(h, threshold, timeout);
    if (r == 0 && h->sockets && err_since_readerr(h)) return -FI_EAVAIL;
    return r;
  }
  compcntr_wait_attr wa{};
  spin_then_yield sty{h};
  const bool drive = h->hidden != nullptr;
  if (h->sockets && drive && timeout < 0 && h->wait_obj != FI_WAIT_YIELD) {
    // sockets moves data in its own thread and wakes its counter's waiters (a condition
    // variable) on every update, and nothing of it reaches a fd here; its untimed wait is sound
    // (its timed one returns +FI_ETIMEDOUT at once in 1.17): block in it, on the provider's value
    // that stands for `threshold` (the same, unless cc was also updated through compcntr).
    progress_both(h);
    const std::uint64_t v = h->value(), offset = v - h->m.last_value();
    if (v >= threshold) return err_since_readerr(h) ? -FI_EAVAIL : 0;
    const std::uint64_t need = threshold - offset;
    if (need <= 0x7fffffffu) { // sockets compares as int32
      const int r = fi_cntr_wait(h->hidden, need, -1);
      progress_both(h);
      if (err_since_readerr(h)) return -FI_EAVAIL;
      if (r == 0 && h->value() >= threshold) return 0;
      if (r != 0) return r < 0 ? r : -r;
      // Reached on the provider's side but not on cc's (cc was set meanwhile): wait as below.
    }
  }
  if (h->wait_obj == FI_WAIT_YIELD) {
    wa = yield_attr<progress_both>(h);
  } else if (h->auto_progress && drive) {
    // The provider's thread moves the data and nothing of it reaches a fd here: check (pulling)
    // and yield the CPU between checks, so that thread runs, for up to 10x the spin time, then
    // sleep in 1 ms slices.
    wa.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
    wa = yield_attr<progress_both>(h);
    wa.spin_ns = 10 * cfg().wait_spin_ns;
  } else if (drive) {
    // No provider fd reports arrivals (shm refuses wait sets; an application's FI_WAIT_SET):
    // drive and check, spinning and then yielding, for up to 10x the spin time, then sleep in
    // 1 ms slices driving the provider between them.
    wa.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
    wa.spin_ns = 10 * cfg().wait_spin_ns;
    wa.progress = progress_spin_then_yield;
    wa.progress_ctx = &sty;
  } else {
    // No provider counter any more (fi_close left the counter to compcntr: a trigger holds
    // it): nothing to pull, but every check is still a round of ofi_compcntr's deferred work,
    // as on every other counter (fuzz_fi_ofi found this wait running none).
    wa.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
    wa.spin_ns = cfg().wait_spin_ns;
    wa.progress = progress_both;
    wa.progress_ctx = h;
  }
  const int r = h->wait_cc(threshold, timeout, wa);
  if (r == 0 && h->sockets && err_since_readerr(h)) return -FI_EAVAIL;
  return r;
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

void pending_add(hook_cntr* c, int delta) noexcept {
  c->pending.fetch_add(delta, std::memory_order_acq_rel);
}

void polled_add(hook_cntr* c, int delta) noexcept {
  c->polled.fetch_add(delta, std::memory_order_relaxed);
}

std::uint64_t caller_pulls() noexcept { return g_caller_pulls.load(std::memory_order_relaxed); }

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

int cntr_trywait(hook_cntr* h, fid** pass, int cap, int* npass) noexcept {
  if (h->wait_obj != FI_WAIT_FD || h->fd < 0) return -FI_EINVAL;
  if (h->waitset != nullptr && *npass >= cap) return -FI_ENOMEM;
  // Reset the provider's side, arm cc's fd, then pull and read (see wait_on_fds): an update after the
  // arm makes the fd readable, one before it is in the values read here. A util wait set is
  // reset and checked by the provider's trywait, in the same call as the application's other
  // provider fids (its check sees what came after its reset).
  //
  // A sockets signal drained here is news even when the pull below shows no change: the signal is
  // gone, so if the provider's read does not show its update yet (a read that lags the signal),
  // answering 0 would put the application to sleep on an fd nothing will make readable again --
  // a lost wake-up (issue 22's fault sweep, fault provider code 'lag'). -FI_EAGAIN makes it read
  // and try again; the next trywait drains nothing unless another update came.
  const bool signalled = drain_sockets_waitset(h);
  const int r = h->trywait(
      [h] {
        if (!by_thread(h) && h->hidden) {
          h->m.pull_comp();
          h->m.pull_err();
        }
      },
      signalled);
  if (r != 0 && r != -FI_EAGAIN) return r;
  if (h->waitset != nullptr) pass[(*npass)++] = &h->waitset->fid;
  return r;
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
      note_caller_pull(h);
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
