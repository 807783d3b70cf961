/* compcntr credit tracking: per-peer credits backed by completion counters (MPI runtimes).
 * Reference: docs/credits.md. Reached through <compcntr/compcntr.h>.
 *
 * Each peer has credits_per_peer credits and a completion counter. acquire takes credits when
 * issued - completed + n <= credits_per_peer (issued: credits taken so far; completed: the
 * counter's completion count + error count), else waits; a completion counted by the peer's
 * counter (attached to a QP, bound to a libfabric bridge, or compcntr_inc_comp_cntr) returns a
 * credit. The window (credits_per_peer) may differ per peer (compcntr_credits_create_per_peer,
 * compcntr_credits_adopt). Every call returns 0 or a positive errno value; the constructor returns NULL and sets
 * errno. NULL pointers, peer >= npeers, n == 0 and n > credits_per_peer are EINVAL. A refused
 * call changes nothing.
 */
#ifndef COMPCNTR_CREDITS_H
#define COMPCNTR_CREDITS_H

#include <compcntr/compcntr.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct compcntr_credits; /* opaque */
/* Declared here too: with <compcntr/wait.h> included first, this header is read before
 * wait.h's body, and the _ex prototypes need the tag at file scope. */
struct compcntr_wait_attr;

/* A tracker with npeers peers of credits_per_peer credits each, and one new WRS counter per
 * peer on dev. NULL + errno: EINVAL (NULL dev, npeers == 0, credits_per_peer == 0 or above a
 * quarter of the device's counter range), ENOTSUP (the device's max_value + 1 is not a power of
 * two), ENOMEM. While the tracker lives, compcntr_close_device(dev) is EBUSY. */
struct compcntr_credits *compcntr_credits_create(struct compcntr_device *dev, uint32_t npeers,
                                                 uint64_t credits_per_peer);

/* compcntr_credits_create with a window per peer: peer i may have windows[i] credits
 * outstanding (e.g. the receive buffers peer i posted for this process). npeers entries. NULL +
 * errno: EINVAL (NULL dev or windows, npeers == 0, a window of 0 or above a quarter of the
 * device's counter range: the message names the peer), ENOTSUP, ENOMEM as create. */
struct compcntr_credits *compcntr_credits_create_per_peer(struct compcntr_device *dev,
                                                          uint32_t npeers, const uint64_t *windows);

/* A tracker over counters the caller created on dev (WRS, one per peer: peer i is ccs[i]) with
 * a window per peer (windows[i]). issued starts at each counter's completion + error count: what
 * it counted before is not outstanding, so adopt counters with nothing in flight. The tracker
 * holds a reference on each counter: compcntr_destroy_comp_cntr on one is EBUSY until
 * compcntr_credits_destroy, which leaves the counters to the caller. NULL + errno: EINVAL (NULL
 * dev/ccs/windows or element, npeers == 0, a counter of another device, a BYTES counter, the
 * same counter for two peers, a bad window), ENOTSUP, ENOMEM. */
struct compcntr_credits *compcntr_credits_adopt(struct compcntr_device *dev,
                                                struct compcntr_comp_cntr *const *ccs,
                                                uint32_t npeers, const uint64_t *windows);

/* Takes n credits of peer: 0 at once if issued - completed + n <= credits_per_peer, else waits
 * (as compcntr_wait_comp_cntr: spin, then sleep) for completions of the peer's counter.
 * ETIMEDOUT: timeout_ms passed (< 0: forever; 0: check once). EIO: the peer's error count
 * changed during the call and did not free enough credits. EOVERFLOW: the peer's counts are
 * inconsistent (completed > issued: its counter was set, or counted completions that took no
 * credit). Only a 0 return takes credits. */
int compcntr_credits_acquire(struct compcntr_credits *cr, uint32_t peer, uint64_t n,
                             int timeout_ms);
/* compcntr_credits_acquire with wait options (attr NULL: defaults), e.g. a progress function that
 * drives the runtime's network progress while it waits for credits. EINVAL also for bad attr
 * fields (as compcntr_wait_comp_cntr_ex). */
int compcntr_credits_acquire_ex(struct compcntr_credits *cr, uint32_t peer, uint64_t n,
                                int timeout_ms, const struct compcntr_wait_attr *attr);

/* Gives back n credits of peer whose operations will never complete into its counter (e.g.
 * cancelled before they were posted): adds n to the peer's counter (a software completion,
 * which wakes waiting acquirers). EINVAL (nothing changes) if n is more than outstanding.
 * EOVERFLOW: inconsistent counts. */
int compcntr_credits_release(struct compcntr_credits *cr, uint32_t peer, uint64_t n);

/* Waits until every credit of peer taken before the call has come back (MPI_Win_flush).
 * 0 | ETIMEDOUT | EIO, timeout_ms as compcntr_credits_acquire. */
int compcntr_credits_flush(struct compcntr_credits *cr, uint32_t peer, int timeout_ms);
int compcntr_credits_flush_ex(struct compcntr_credits *cr, uint32_t peer, int timeout_ms,
                              const struct compcntr_wait_attr *attr);

/* *outstanding = issued - completed for peer (credits in use). EOVERFLOW (and *outstanding
 * unchanged) when the counts are inconsistent. */
int compcntr_credits_outstanding(struct compcntr_credits *cr, uint32_t peer, uint64_t *outstanding);

/* *issued = credits of peer taken so far (modulo 2^64); *completed = the peer counter's
 * completion + error count (modulo its range); *window = the peer's window. The raw counts of
 * the MPICH pattern (issued - completed = outstanding) for runtimes that compare them
 * themselves. EINVAL for NULL pointers or peer >= npeers. */
int compcntr_credits_issued(struct compcntr_credits *cr, uint32_t peer, uint64_t *issued);
int compcntr_credits_completed(struct compcntr_credits *cr, uint32_t peer, uint64_t *completed);
int compcntr_credits_window(struct compcntr_credits *cr, uint32_t peer, uint64_t *window);

/* The counter whose completions return peer's credits: attach it to a QP (e.g. the SEND op of
 * the QP to that peer) or bind it to a bridge. It is a real counter (read, wait, poll, fd), held
 * by the tracker (owned by it unless adopted): compcntr_destroy_comp_cntr on it is EBUSY (it stays usable), and it must not
 * be set or incremented except through completions and compcntr_credits_release. NULL + errno
 * EINVAL for a NULL cr or peer >= npeers. */
struct compcntr_comp_cntr *compcntr_credits_counter(struct compcntr_credits *cr, uint32_t peer);

/* Destroys the tracker and the counters it created (an adopted tracker drops its references
 * and leaves the counters to the caller); the pointers compcntr_credits_counter returned for
 * created counters become invalid. A counter still attached to a live QP lives on (unread) until that QP is destroyed,
 * as a C++ counter dropped while attached. No call may be in progress on the tracker. */
int compcntr_credits_destroy(struct compcntr_credits *cr);

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_CREDITS_H */
