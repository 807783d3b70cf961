// Hook counters: what fi_cntr_open returns under FI_HOOK=compcntr (docs/hook.md). The struct and
// the helpers its two units share: hook_cntr.cpp (open, close, updates, reads, the live list) and
// cntr_wait.cpp (fi_cntr_wait, fi_trywait).
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
#ifndef COMPCNTR_FABRIC_HOOK_CNTR_HPP
#define COMPCNTR_FABRIC_HOOK_CNTR_HPP

#include "hook.hpp"

#include <atomic>
#include <cstdint>

#include "../cntr_base.hpp"
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

namespace cntr_detail {

using compcntr_fabric::update_op;
inline hook_cntr* of(fid* f) noexcept { return compcntr_fabric::of<hook_cntr>(f); }

// The integer in the wait object field (a C caller may store any int there).
inline int raw_wait(const fi_cntr_attr& a) noexcept {
  return compcntr_fabric::raw_enum(a.wait_obj);
}

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
// The progress thread sleeps between rounds while this moves (caller_pulls()): the application
// is driving progress itself, and a busy thread beside it only takes the CPU and the endpoint
// locks. Waiters and fi_poll also move g_waiter_pulls (waiter_pulls()), and while that moves the
// thread backs off further (progress.cpp) and says so in g_thread_backed_off: a fi_cntr_read
// then pulls as with caller progress (without counting as a pull: the reads alone do not keep
// the thread backed off), so a read after the application's last wait is never the backed-off
// thread's sleep late (the runtime's reference read of each counter at its end, suite
// runtime_tsan on shm).
inline std::atomic<std::uint64_t> g_caller_pulls{0};
inline std::atomic<std::uint64_t> g_waiter_pulls{0};
inline std::atomic<bool> g_thread_backed_off{false};
inline void note_caller_pull(const hook_cntr* h) noexcept {
  if (h->thread) g_caller_pulls.fetch_add(1, std::memory_order_relaxed);
}
inline void note_waiter_pull(const hook_cntr* h) noexcept {
  if (h->thread) {
    g_caller_pulls.fetch_add(1, std::memory_order_relaxed);
    g_waiter_pulls.fetch_add(1, std::memory_order_relaxed);
  }
}

// ofi_compcntr's deferred work (layer_ops::progress) after the counter calls; the hook has none.
// `pulled`: the counter this call pulled a moment ago (layer_ops::progress).
inline void layer_progress(const hook_cntr* pulled = nullptr) noexcept {
  if (const layer_ops* l = layer()) l->progress(pulled);
}

// Drains a sockets wait set (one byte per signal until fi_wait reads it). Returns whether it
// drained any signal (an update the provider signalled since the last drain).
inline bool drain_sockets_waitset(hook_cntr* h) noexcept {
  int i = 0;
  if (h->sockets && h->waitset != nullptr)
    while (i < 4096 && fi_wait(h->waitset, 0) == 0) ++i;
  return i > 0;
}

} // namespace cntr_detail
} // namespace compcntr_hook

#endif
