/* compcntr libfabric integration: an fi_cntr served by a compcntr counter, and a CQ bridge that
 * counts a real libfabric endpoint's completions into compcntr counters.
 * Library: libcompcntr-fabric (pkg-config compcntr-fabric). Reference: docs/fabric.md.
 *
 * Return conventions (fixed by the project's C API specification):
 *   - compcntr_fi_cntr_open and the fi_cntr operations return 0 or a negative libfabric error
 *     (-FI_EINVAL, -FI_EBUSY, ...), exactly like libfabric.
 *   - the two calls that drive the provider return what it returned, the libfabric way:
 *     compcntr_fi_bridge_progress the number of CQ entries consumed or -FI_E*,
 *     compcntr_fi_mirror_progress 0 or -FI_E* (-FI_EINVAL for NULL).
 *   - every other call returns 0 or a positive errno value (compcntr's C convention); the
 *     constructors return NULL and set errno. FI_E* codes equal the errno codes of the same
 *     name (FI_EINVAL == EINVAL, FI_EBUSY == EBUSY, ...).
 *   - NULL pointer arguments are EINVAL (-FI_EINVAL), never a crash. A refused call changes
 *     nothing. compcntr_fi_last_error() names the cause of the last failure in this thread.
 */
#ifndef COMPCNTR_FABRIC_H
#define COMPCNTR_FABRIC_H

#include <compcntr/compcntr.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- fi_cntr adapter ---------------------------------------------------------------------- */

/* Byte counting (an extension on libfabric 1.17, whose enum fi_cntr_events has only
 * FI_CNTR_EVENTS_COMP): attr->events value for a counter whose completion value counts bytes.
 * It is 1, the value libfabric 2.x gives FI_CNTR_EVENTS_BYTES (the CXI provider's
 * FI_CXI_CNTR_EVENTS_BYTES backport uses the same value), so either name works on 2.x. */
#define COMPCNTR_FI_CNTR_EVENTS_BYTES ((enum fi_cntr_events)1)

/* Opens a real struct fid_cntr (fclass FI_CLASS_CNTR, fid.context = context) whose
 * fi_ops_cntr table is served by a new compcntr counter of `dev`: fi_cntr_read, readerr, add,
 * adderr, set, seterr, wait, fi_control(FI_GETWAIT / FI_GETWAITOBJ) and fi_close work on it
 * as fi_cntr(3) says. attr NULL: FI_CNTR_EVENTS_COMP, FI_WAIT_NONE.
 *   attr->events:   FI_CNTR_EVENTS_COMP (a WRS counter) or COMPCNTR_FI_CNTR_EVENTS_BYTES.
 *   attr->wait_obj: FI_WAIT_NONE (fi_cntr_wait is -FI_ENOSYS), FI_WAIT_UNSPEC (compcntr's
 *                   spin-then-futex wait), FI_WAIT_YIELD (spins, sched_yield between checks),
 *                   FI_WAIT_FD (FI_GETWAIT gives a pollable fd; see compcntr_fi_trywait).
 *   attr->flags:    must be 0.
 * Returns 0, or: -FI_EINVAL (NULL dev or cntr, flags != 0, unknown events or wait_obj value,
 * FI_WAIT_SET without wait_set), -FI_EOPNOTSUPP (FI_WAIT_SET, FI_WAIT_MUTEX_COND,
 * FI_WAIT_POLLFD; a counter type the device does not support), -FI_ENOMEM, -FI_EMFILE /
 * -FI_ENFILE (no fd for FI_WAIT_FD). On error *cntr is not written and nothing is created.
 *
 * The counter is not a provider object: never pass it to a provider's fi_ep_bind,
 * fi_trywait or fi_poll_add (the provider would treat its memory as its own counter type).
 * To count an endpoint's completions into it, bind compcntr_fi_cntr_comp_cntr(cntr) to a
 * bridge on the endpoint's CQ (below). fi_close returns -FI_EBUSY while it is bound. */
int compcntr_fi_cntr_open(struct compcntr_device *dev, struct fi_cntr_attr *attr,
                          struct fid_cntr **cntr, void *context);

/* The compcntr counter behind an adapter counter, or behind an application's counter under the
 * hook provider (FI_HOOK=compcntr, docs/hook.md); owned by that counter: do not destroy it. NULL
 * with errno EINVAL for NULL or for any other fid_cntr (a provider's counter is recognised by its
 * ops table without reading past struct fid_cntr). */
struct compcntr_comp_cntr *compcntr_fi_cntr_comp_cntr(struct fid_cntr *cntr);

/* fi_trywait(3) for adapter counters opened with FI_WAIT_FD (libfabric's fi_trywait belongs
 * to a provider's fabric and cannot take them). For each counter: drives the bridges it is
 * bound to, arms its fd, and returns -FI_EAGAIN if its completion or error value changed since
 * the previous compcntr_fi_trywait on it (since open for the first): read it before blocking.
 * 0: safe to block on the fds (poll/epoll); any later update makes the fd readable.
 * -FI_EINVAL: NULL fids, count <= 0, a NULL entry, a fid that is not an adapter counter, or a
 * counter not opened with FI_WAIT_FD. Use it from one thread per counter at a time. */
int compcntr_fi_trywait(struct fid **fids, int count);

/* ---- CQ bridge ------------------------------------------------------------------------------ */

/* Drains a libfabric CQ and counts each completion into the compcntr counters bound to its
 * class. The bridge becomes the CQ's only reader: the application must not read the CQ while a
 * bridge is open on it (entries the bridge consumed are not returned to anyone). */
struct compcntr_fi_bridge;

enum {
	COMPCNTR_FI_BRIDGE_ATTR_FORMAT = 1u << 0,      /* format is valid */
	COMPCNTR_FI_BRIDGE_ATTR_MAX_ENTRIES = 1u << 1, /* max_entries is valid */
};

struct compcntr_fi_bridge_attr {
	uint32_t comp_mask;       /* COMPCNTR_FI_BRIDGE_ATTR_* bits */
	enum fi_cq_format format; /* the CQ's format: FI_CQ_FORMAT_MSG, _DATA or _TAGGED */
	size_t max_entries; /* most entries one progress call consumes (> 0; default 1024) */
};

/* Opens a bridge on `cq` whose format is not known to it. Entries are read one per fi_cq_read
 * into a buffer large enough for the largest format, and only the prefix that FI_CQ_FORMAT_MSG,
 * _DATA and _TAGGED share ({op_context, flags, len}) is interpreted: correct for those three
 * formats. An FI_CQ_FORMAT_CONTEXT CQ (its entries carry no flags) is detected at its first
 * entry (the flags word the provider did not write keeps a sentinel no real entry has); that
 * entry cannot be classified and the bridge refuses to read further (-FI_EOPNOTSUPP).
 * compcntr_fi_bridge_open_ex with the format reads in batches (faster).
 * NULL + errno: EINVAL (NULL cq, or a fid that is not FI_CLASS_CQ), ENOMEM. */
struct compcntr_fi_bridge *compcntr_fi_bridge_open(struct fid_cq *cq);

/* compcntr_fi_bridge_open with attributes (attr NULL: as compcntr_fi_bridge_open). With
 * COMPCNTR_FI_BRIDGE_ATTR_FORMAT the CQ's format must be given exactly (the stride of the
 * entries fi_cq_read writes): FI_CQ_FORMAT_MSG, _DATA or _TAGGED; FI_CQ_FORMAT_CONTEXT and
 * _UNSPEC are EINVAL (no flags to classify by, or an unknown stride).
 * EINVAL also for an unknown comp_mask bit or max_entries == 0. */
struct compcntr_fi_bridge *compcntr_fi_bridge_open_ex(struct fid_cq *cq,
                                                      const struct compcntr_fi_bridge_attr *attr);

/* Binds `cc` to the completion classes in `flags` (any of FI_SEND, FI_RECV, FI_READ, FI_WRITE,
 * FI_REMOTE_READ, FI_REMOTE_WRITE): each later entry of such a class adds 1 (WRS counter) or
 * the entry's len (BYTES counter) to cc's completion count, and each error entry adds 1 to its
 * error count. Each class feeds at most one counter per bridge; one counter may be bound to
 * many bridges and to several disjoint sets of one bridge (it accumulates). There is no
 * unbind: closing the bridge ends its bindings. cc must stay alive until then (an adapter
 * counter's fi_close returns -FI_EBUSY meanwhile). Safe while other threads run progress.
 * Errors: EINVAL (NULL, flags == 0, a bit outside the six), EBUSY (a class of flags already has
 * a counter on this bridge: nothing is bound), ENOTSUP (a BYTES counter for anything but
 * FI_RECV: libfabric 1.17 defines a CQ entry's len for receives only, and providers differ on
 * the others: tcp;ofi_rxm reports 0 for sends and remote writes with CQ data). */
int compcntr_fi_bridge_bind(struct compcntr_fi_bridge *br, struct compcntr_comp_cntr *cc,
                            uint64_t flags);

/* Drains the CQ: reads up to max_entries entries (fi_cq_read, and fi_cq_readerr for error
 * entries), classifies each by its flags and counts it. Returns the number of entries consumed
 * (successful and error entries; 0 if the CQ was empty or another thread was draining it at
 * that moment), or -FI_EINVAL (NULL br), -FI_EOPNOTSUPP (FI_CQ_FORMAT_CONTEXT CQ detected),
 * or the negative error fi_cq_read / fi_cq_readerr returned when no entry was consumed.
 * Classification (first match): FI_REMOTE_WRITE, FI_REMOTE_READ, FI_READ (RMA or atomic
 * read), FI_WRITE (RMA or atomic write), FI_SEND, FI_RECV; an entry with none of these bits
 * (or whose class has no counter) is counted only in the bridge's statistics.
 * Thread safety: any number of threads may call it; one drains at a time (try-lock: the others
 * return 0 at once instead of waiting). */
ssize_t compcntr_fi_bridge_progress(struct compcntr_fi_bridge *br);

/* A compcntr_progress_fn: calls compcntr_fi_bridge_progress((struct compcntr_fi_bridge *)br)
 * and ignores its result. Use it as the progress function of a wait so the waiter drives the CQ:
 *     struct compcntr_wait_attr wa = { .progress = compcntr_fi_bridge_progress_fn, .progress_ctx = br };
 *     compcntr_wait_comp_cntr_ex(cc, n, 1000, &wa);
 * (C++: compcntr::fabric::progress_options(br), or
 * compcntr::wait_options{.drive = compcntr_fi_bridge_progress_fn, .drive_ctx = br}) */
void compcntr_fi_bridge_progress_fn(void *br);

/* What a bridge has consumed since it was opened. */
struct compcntr_fi_bridge_stats {
	uint64_t entries; /* successful entries read */
	uint64_t errors; /* error entries read (fi_cq_readerr) */
	uint64_t unclassified; /* entries (successful or error) with no class bit */
	uint64_t unbound; /* classified entries whose class had no counter */
};
int compcntr_fi_bridge_query_stats(struct compcntr_fi_bridge *br,
                                   struct compcntr_fi_bridge_stats *stats);

/* Closes the bridge (never the CQ) and ends its bindings. Entries still in the CQ stay there.
 * No other thread may be inside compcntr_fi_bridge_progress on it. EINVAL for NULL. */
int compcntr_fi_bridge_close(struct compcntr_fi_bridge *br);

/* ---- provider-counter mirror ------------------------------------------------------------ */

/* Mirrors a provider's fid_cntr -- bound by the application with fi_ep_bind or fi_mr_bind --
 * into a compcntr counter. The provider's counter is the only complete record of what it counts:
 * operations that write no CQ entry (FI_SELECTIVE_COMPLETION), remote RMA events
 * (FI_REMOTE_WRITE / FI_REMOTE_READ with FI_RMA_EVENT), and errors. Each progress call reads it
 * (fi_cntr_read and fi_cntr_readerr, which run the provider's progress) and adds what the
 * completion and the error value gained since the previous read to cc's completion and error
 * values: never twice, never lost, under any number of concurrent progress calls; wrap-safe
 * (gains are computed modulo 2^value_bits). The provider values at open are the baseline.
 * The mirror only reads the provider counter: do not fi_cntr_set it while mirrored (a value
 * that moves backwards is read as "nothing new" until it passes the last value mirrored). */
struct compcntr_fi_mirror;

enum {
	COMPCNTR_FI_MIRROR_ATTR_VALUE_BITS = 1u << 0, /* value_bits is valid */
};

struct compcntr_fi_mirror_attr {
	uint32_t comp_mask; /* COMPCNTR_FI_MIRROR_ATTR_* bits */
	uint32_t value_bits; /* width of the provider's values: 64 (default; util counters of tcp,
	                       * udp, shm, rxm, rxd, verbs, efa) or 32 (the sockets provider, whose
	                       * counters are int32 in libfabric 1.17); 8..64 accepted */
};

/* NULL + errno: EINVAL (NULL argument, a fid that is not FI_CLASS_CNTR), ENOMEM.
 * cc must stay alive until the mirror is closed; the provider counter too. */
struct compcntr_fi_mirror *compcntr_fi_mirror_open(struct fid_cntr *provider_cntr,
                                                   struct compcntr_comp_cntr *cc);
/* As compcntr_fi_mirror_open with attributes (attr NULL: defaults). EINVAL also for an unknown
 * comp_mask bit or value_bits outside 8..64. */
struct compcntr_fi_mirror *compcntr_fi_mirror_open_ex(struct fid_cntr *provider_cntr,
                                                      struct compcntr_comp_cntr *cc,
                                                      const struct compcntr_fi_mirror_attr *attr);

/* Reads the provider counter (driving its progress) and adds what it gained to cc. 0, or
 * -FI_EINVAL for NULL. When it returns, cc includes at least everything the provider counter
 * showed when the call began (a concurrent call may be the one that added it: it has finished
 * adding when this one returns). Thread-safe; the provider's own threading rules apply to the
 * fi_cntr_read it makes. */
int compcntr_fi_mirror_progress(struct compcntr_fi_mirror *m);

/* A compcntr_progress_fn calling compcntr_fi_mirror_progress((struct compcntr_fi_mirror *)m):
 * the progress function of a compcntr wait on cc, so the waiter drives the provider:
 *     struct compcntr_wait_attr wa = { .progress = compcntr_fi_mirror_progress_fn, .progress_ctx = m }; */
void compcntr_fi_mirror_progress_fn(void *m);

/* Frees the mirror (never the provider counter nor cc). No other thread may be inside
 * compcntr_fi_mirror_progress on it. EINVAL for NULL. */
int compcntr_fi_mirror_close(struct compcntr_fi_mirror *m);

/* The sentence naming the cause of the last failed compcntr_fi_* call in this thread. */
const char *compcntr_fi_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_FABRIC_H */
