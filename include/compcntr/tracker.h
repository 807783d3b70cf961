/* compcntr completion tracking for one-sided traffic: issued vs completed operations over one
 * completion counter (MPICH's RMA flush, OpenSHMEM's shmem_quiet). Reference: docs/tracker.md.
 * Reached through <compcntr/compcntr.h>.
 *
 * The runtime calls compcntr_tracker_issue for every operation it issues; the operations'
 * completions (successful or failed) are counted by the counter given to compcntr_tracker_create
 * (attached to a QP, bound to a libfabric bridge, mirrored from a provider counter);
 * compcntr_tracker_quiet waits until everything issued before the call is accounted for.
 * Every call returns 0 or a positive errno value unless stated; the constructor returns NULL and
 * sets errno. NULL pointer arguments are EINVAL. A refused call changes nothing.
 */
#ifndef COMPCNTR_TRACKER_H
#define COMPCNTR_TRACKER_H

#include <compcntr/compcntr.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct compcntr_tracker; /* opaque */
/* At file scope for the _ex prototype when <compcntr/wait.h> is included first. */
struct compcntr_wait_attr;

/* A tracker over completions, a WRS counter. Its baseline is the counter's completion + error
 * values now: what the counter counted before is not waited for. The tracker holds a reference
 * on the counter: compcntr_destroy_comp_cntr(completions) is EBUSY (and the counter stays
 * usable) until compcntr_tracker_destroy. NULL + errno: EINVAL (NULL completions, a BYTES
 * counter), ENOTSUP (the device's max_value + 1 is not a power of two), ENOMEM. */
struct compcntr_tracker *compcntr_tracker_create(struct compcntr_comp_cntr *completions);

/* n more operations issued (n == 0: nothing). Never blocks: one atomic add. EINVAL (nothing
 * changes) for n above a quarter of the counter range. Safe from any number of threads. */
int compcntr_tracker_issue(struct compcntr_tracker *t, uint64_t n);

/* Operations issued since creation (modulo 2^64). 0 with errno EINVAL for a NULL t. */
uint64_t compcntr_tracker_issued(const struct compcntr_tracker *t);

/* Operations accounted for since creation: the counter's completion + error values minus the
 * baseline, modulo the counter range. 0 with errno EINVAL for a NULL t. */
uint64_t compcntr_tracker_completed(const struct compcntr_tracker *t);

/* Waits until completions + errors since the baseline reach what was issued when the call began
 * (operations issued meanwhile are not waited for). A count, not a set: while other threads
 * issue, a later operation's completion can stand in for an earlier one's (docs/tracker.md);
 * without concurrent issuers everything issued before the call is complete on return. Then
 * returns 0, or EIO if the counter's
 * error value grew since the previous quiet that returned EIO (since creation before any): an
 * issued operation failed. Each growth is reported by exactly one quiet, also among concurrent
 * ones; the wait always ends only when everything issued is accounted for. ETIMEDOUT when
 * timeout_ms passes first (< 0: forever; 0: check once); it reports nothing (the next quiet
 * that finishes does). Safe while other threads issue and quiet. */
int compcntr_tracker_quiet(struct compcntr_tracker *t, int timeout_ms);
/* compcntr_tracker_quiet with wait options (attr NULL: defaults), e.g. a progress function that
 * drives the network while quiet waits. EINVAL also for bad attr fields (as
 * compcntr_wait_comp_cntr_ex). */
int compcntr_tracker_quiet_ex(struct compcntr_tracker *t, int timeout_ms,
                              const struct compcntr_wait_attr *attr);

/* Destroys the tracker and drops its reference on the counter (which stays the caller's).
 * No call may be in progress on the tracker. */
int compcntr_tracker_destroy(struct compcntr_tracker *t);

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_TRACKER_H */
