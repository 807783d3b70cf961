// fi_cntr_wait and fi_trywait of hook counters (hook_cntr.hpp: the counter; docs/hook.md).
#include "hook_cntr.hpp"

#include <rdma/fi_errno.h>

#include <poll.h>
#include <sched.h>

#include <chrono>
#include <cstdint>

namespace compcntr_hook {
using namespace cntr_detail;
namespace {

// A waiter drives progress itself, with or without the progress thread: it has nothing else to
// do, and waking it through the thread costs a scheduling round (see k_reader_pull_every).
void progress_both(void* ctx) noexcept {
  hook_cntr* h = static_cast<hook_cntr*>(ctx);
  // Not once fi_close closed the provider's counter and compcntr's stayed (a trigger holds it):
  // the mirror still names the freed provider counter (issue 22, fuzz_fi_hook: an FI_WAIT_YIELD
  // wait on such a counter read it).
  const hook_cntr* pulled = nullptr;
  if (h->hidden) {
    h->m.pull_comp();
    h->m.pull_err();
    note_waiter_pull(h);
    pulled = h;
  }
  layer_progress(pulled);
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

// Arms both sides of epfd: cc's eventfd (armed: the next update makes it readable) and the
// provider's wait set (fi_trywait resets it; sockets' wait set keeps one byte per signal until
// fi_wait reads it, so it is drained first). -FI_EAGAIN: the provider has work pending now.
// Order matters: the wait set is reset first, cc's fd armed next, and only then are the
// provider's values pulled (by the caller): an update after the reset signals the wait set
// again, one the pull carries into cc makes the armed fd readable, so none is lost between the
// check and the sleep.
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
  const std::uint64_t err0 = h->errors();
  // One check driving the provider: the completion value first, the error value only while the
  // threshold is not met (reaching the threshold wins a tie, as in util's wait), so a wait that
  // ends costs one provider read, not two.
  auto check = [&]() noexcept -> int {
    h->m.pull_comp();
    note_waiter_pull(h);
    layer_progress(h);
    if (h->value() >= threshold) return 0;
    h->m.pull_err();
    if (h->errors() != err0) return -FI_EAVAIL;
    return 1;
  };
  // One check before arming: a wait called right after a read that saw too little usually finds
  // the answer at its first provider read (fabtests' loop "read; wait"), and then costs no arm.
  if (const int r = check(); r <= 0) return r;
  // The clock only now: most waits of a runtime's quiet end at that first check (SOS's
  // shmem_int_p + shmem_quiet, bench P20), and they need no deadline. Starting it after the check
  // only moves the deadline later: never early.
  const auto start = clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout < 0 ? 0 : timeout);
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

} // namespace compcntr_hook
