/* compcntr polling helpers: wait for one counter, poll many, pollable fds, progress functions.
 * Reference: docs/wait.md. Reached through <compcntr/compcntr.h>.
 *
 * Every call returns 0 or a positive errno value. NULL pointer arguments are EINVAL and change
 * nothing. Counters must stay alive while a call waits or polls on them.
 */
#ifndef COMPCNTR_WAIT_H
#define COMPCNTR_WAIT_H

#include <compcntr/compcntr.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Waits until the completion count is >= threshold (0), the error count changes during the
 * wait (EIO), or timeout_ms milliseconds pass (ETIMEDOUT). timeout_ms < 0: forever; 0: check
 * once. Spins briefly, then yields, then sleeps in the kernel. */
int compcntr_wait_comp_cntr(struct compcntr_comp_cntr *cc, uint64_t threshold, int timeout_ms);

/* Waits until one of the n counters ccs[i] reaches thresholds[i]: 0 and *which = i. EIO and
 * *which = i when the error count of ccs[i] changes during the call. ETIMEDOUT (which unchanged).
 * Fair: a thread's next poll starts scanning after the index it was last given.
 * EINVAL: NULL ccs/thresholds/which, a NULL element, or n == 0. ENOMEM: n > 32 and no memory
 * for the per-call state. */
int compcntr_poll_comp_cntrs(struct compcntr_comp_cntr *const *ccs, const uint64_t *thresholds,
                             size_t n, int timeout_ms, size_t *which);

/* ---- options ---------------------------------------------------------------------------- */

/* A progress function, called by the waiting thread between checks (emulated backends drain
 * their completion queues here). It may update counters, but must not wait on the same ones.
 * It runs with no compcntr lock held. */
typedef void (*compcntr_progress_fn)(void *ctx);

enum compcntr_wait_attr_mask {
	COMPCNTR_WAIT_ATTR_SPIN = 1u << 0,              /* spin_ns is valid */
	COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL = 1u << 1, /* progress_interval_us is valid */
};

/* spin_ns value: poll forever, never sleep in the kernel (lowest latency, burns a core). */
#define COMPCNTR_WAIT_SPIN_FOREVER INT64_MAX

/* Options of the _ex calls. Fields are read only when their comp_mask bit is set (verbs style:
 * a zeroed struct means the defaults); progress is used when non-NULL. */
struct compcntr_wait_attr {
	uint32_t comp_mask;            /* enum compcntr_wait_attr_mask bits */
	uint32_t progress_interval_us; /* longest sleep when progress is set (> 0; default 1000) */
	int64_t spin_ns; /* hot-poll time before backing off and sleeping (>= 0;
	                                * default 5000); 0: sleep as soon as a check fails;
	                                * COMPCNTR_WAIT_SPIN_FOREVER: never sleep */
	compcntr_progress_fn progress; /* NULL: none */
	void *progress_ctx; /* passed to progress */
};

/* compcntr_wait_comp_cntr with options (attr NULL: defaults). EINVAL also for an unknown
 * comp_mask bit, spin_ns < 0 or progress_interval_us == 0. */
int compcntr_wait_comp_cntr_ex(struct compcntr_comp_cntr *cc, uint64_t threshold, int timeout_ms,
                               const struct compcntr_wait_attr *attr);
/* compcntr_wait_comp_cntr_ex against an error count the caller already read: EIO as soon as a
 * check (the first one included) sees the error count differ from errors_seen, instead of
 * "changed during the wait". For a caller that reads the counter, decides what to wait for,
 * and then waits: an error that arrives between its read and the wait's own sample would
 * otherwise go unseen (C++ compcntr::wait_since). Reaching the threshold still wins over an
 * error change seen at the same check. attr NULL: defaults. */
int compcntr_wait_comp_cntr_since(struct compcntr_comp_cntr *cc, uint64_t threshold,
                                  uint64_t errors_seen, int timeout_ms,
                                  const struct compcntr_wait_attr *attr);

/* compcntr_poll_comp_cntrs with options (attr NULL: defaults). */
int compcntr_poll_comp_cntrs_ex(struct compcntr_comp_cntr *const *ccs, const uint64_t *thresholds,
                                size_t n, int timeout_ms, size_t *which,
                                const struct compcntr_wait_attr *attr);

/* ---- pollable file descriptor ----------------------------------------------------------- */

/* *fd = the counter's eventfd (non-blocking, close-on-exec), created on the first call; later
 * calls give the same fd. The counter owns it: destroying the counter closes it. Having an fd
 * costs the increment path nothing. EMFILE/ENFILE/ENOMEM if it cannot be created. */
int compcntr_comp_cntr_get_fd(struct compcntr_comp_cntr *cc, int *fd);

/* Arms the fd (EINVAL if compcntr_comp_cntr_get_fd was never called): the next update of the
 * completion or error count makes it readable (POLLIN/EPOLLIN), once; it stays readable until
 * the next arm (which drains it) or until you read it. Use: arm, then read the counter, and
 * only if it is not done, poll/epoll_wait on the fd. Readiness may be spurious, never missed. */
int compcntr_comp_cntr_arm_fd(struct compcntr_comp_cntr *cc);

/* Arms the fd for a threshold (EINVAL if compcntr_comp_cntr_get_fd was never called): it becomes
 * readable once the completion count is >= threshold, or once the error count differs from its
 * value at this call -- not on the updates before that, which leave it armed. So an epoll-driven
 * progress engine wakes once per batch, not once per completion. If the threshold is already
 * reached when arming (or an error raced with it), the fd is readable on return. One-shot, like
 * compcntr_comp_cntr_arm_fd (re-arm to wait again; a new arm replaces the condition and drains
 * an earlier readiness). Readiness may be spurious, never missed: read the counter after it. A
 * spurious readiness comes only from a signal that raced with the arm, at most one per signal
 * (an arm drains a signal in flight: tests/core/fd_race_test.cpp).
 * While armed below the threshold, every update of the counter takes the watcher path (a call
 * and a few loads, ~55 instructions; no RMW, no syscall); nothing at all while not armed. Arm
 * from one thread at a time per counter. */
int compcntr_comp_cntr_arm_fd_threshold(struct compcntr_comp_cntr *cc, uint64_t threshold);

#ifdef COMPCNTR_INLINE_FAST_PATHS
/* compcntr_wait_comp_cntr inline when the threshold is already reached (one acquire load, as
 * the C++ compcntr::wait); everything else is the exported call. See <compcntr/compcntr.h>.
 * No stripes test: a striped counter's slot value is 0 for its whole life, so it passes here
 * only for threshold 0 (which its sum reaches too); any other threshold takes the call. */
static inline int compcntr_wait_comp_cntr_inline_(struct compcntr_comp_cntr *cc, uint64_t threshold,
                                                  int timeout_ms)
{
	if (__builtin_expect(cc != NULL, 1) &&
	    __atomic_load_n(&cc->slot_->value, __ATOMIC_ACQUIRE) >= threshold)
		return 0;
	return (compcntr_wait_comp_cntr)(cc, threshold, timeout_ms);
}
#define compcntr_wait_comp_cntr(cc, threshold, timeout_ms)                                         \
	compcntr_wait_comp_cntr_inline_((cc), (threshold), (timeout_ms))
#endif

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_WAIT_H */
