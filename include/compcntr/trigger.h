/* compcntr triggered operations: run an action once a counter's completion value reaches a
 * threshold (fi_trigger(3) FI_TRIGGER_THRESHOLD, Portals 4 triggered operations).
 * Reference: docs/trigger.md. Reached through <compcntr/compcntr.h>.
 *
 * A trigger is armed on (counter, threshold) with an action fn(ctx, status). The action runs
 * exactly once: with status 0 after the counter's completion value was seen >= threshold
 * (unsigned 64-bit comparison, as compcntr_wait_comp_cntr), or with ECANCELED when the trigger
 * is cancelled, flushed, or its counter is destroyed before it fired.
 *
 * Order: per counter, due triggers run in threshold order, equal thresholds in arming order,
 * whatever order they were armed in. Error completions do not move the completion value and so
 * fire nothing. compcntr_set_comp_cntr to a value at or above armed thresholds fires them; to a
 * value below leaves them armed. Thresholds are values, not distances: an increment that wraps
 * the counter past max_value leaves a value compared as it is (thresholds it passed over in the
 * wrap wait for the counter to climb to them again).
 *
 * Where the action runs (flags):
 *   COMPCNTR_TRIGGER_INLINE   in the thread of an update that made it due, after that update is
 *                             visible, before the update call returns -- or, when another
 *                             thread is already running that counter's due triggers, in that
 *                             thread (so threshold order holds across threads). For cheap
 *                             actions: adding to or setting another counter (chains run to
 *                             completion with bounded stack depth).
 *   COMPCNTR_TRIGGER_DEFERRED queued in threshold order on the counter's device when due; run by
 *                             compcntr_trigger_progress or the device's trigger service thread
 *                             (compcntr_trigger_service_start). For actions that post network
 *                             operations or may block.
 * Memory ordering: what the updating thread wrote before the update that made a trigger due is
 * visible to its action.
 *
 * A counter with no armed trigger pays nothing on its updates. Every call returns 0 or a
 * positive errno value unless stated; constructors return NULL and set errno. NULL pointer
 * arguments are EINVAL. A refused call changes nothing.
 */
#ifndef COMPCNTR_TRIGGER_H
#define COMPCNTR_TRIGGER_H

#include <compcntr/compcntr.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct compcntr_trigger; /* one armed action; opaque */

/* status 0: the threshold was reached; ECANCELED: cancelled, flushed, or its counter was
 * destroyed before it fired. Called exactly once either way. An action must not destroy its own
 * trigger (compcntr_trigger_destroy waits for a firing action to return). */
typedef void (*compcntr_trigger_fn)(void *ctx, int status);

enum {
	COMPCNTR_TRIGGER_INLINE = 1u << 0, /* run in the thread whose update made it due */
	COMPCNTR_TRIGGER_DEFERRED = 1u << 1, /* run by compcntr_trigger_progress / the service */
};

/* Arms fn(ctx, .) on cc at threshold; exactly one of COMPCNTR_TRIGGER_INLINE and
 * COMPCNTR_TRIGGER_DEFERRED in flags. A threshold already reached fires at once, as the flags
 * say (inline: before this call returns). NULL + errno: EINVAL (NULL cc or fn, flags not exactly
 * one mode bit), ENOMEM. The handle stays valid until compcntr_trigger_destroy. */
struct compcntr_trigger *compcntr_trigger_arm(struct compcntr_comp_cntr *cc, uint64_t threshold,
                                              compcntr_trigger_fn fn, void *ctx, uint32_t flags);

/* Built-in inline actions: when cc reaches threshold, add n to target's completion value
 * (fi_trigger's FI_OP_CNTR_ADD) / set it to v (FI_OP_CNTR_SET). The trigger holds a reference
 * on target until it is destroyed (compcntr_destroy_comp_cntr(target) is EBUSY until then).
 * target may have triggers of its own (chains). NULL + errno: EINVAL, ENOMEM. */
struct compcntr_trigger *compcntr_trigger_arm_add(struct compcntr_comp_cntr *cc, uint64_t threshold,
                                                  struct compcntr_comp_cntr *target, uint64_t n);
struct compcntr_trigger *compcntr_trigger_arm_set(struct compcntr_comp_cntr *cc, uint64_t threshold,
                                                  struct compcntr_comp_cntr *target, uint64_t v);

/* 0: cancelled -- fn ran with ECANCELED before this returned; EALREADY: it fired, is firing or
 * was cancelled before (a deferred trigger that is due but not yet run can still be cancelled). */
int compcntr_trigger_cancel(struct compcntr_trigger *t);

/* Cancels t if it has not fired, waits for a firing action to return, frees t. */
int compcntr_trigger_destroy(struct compcntr_trigger *t);

/* Whether t's action has run: 0 not yet; 1 it ran with status 0 (fired); 2 it ran with
 * ECANCELED. -EINVAL for a NULL t. */
int compcntr_trigger_state(const struct compcntr_trigger *t);

/* The threshold t was armed with (0 with errno EINVAL for a NULL t). */
uint64_t compcntr_trigger_threshold(const struct compcntr_trigger *t);

/* Cancels every trigger of cc that has not fired (each fn gets ECANCELED before this
 * returns). Returns the number cancelled (>= 0), or -EINVAL for a NULL cc. */
int compcntr_trigger_flush(struct compcntr_comp_cntr *cc);

/* Runs the deferred actions of dev that are due, in the order they became due; returns how
 * many ran (>= 0), or -EINVAL for a NULL dev. Thread-safe: concurrent callers share the work,
 * each action runs once. */
int compcntr_trigger_progress(struct compcntr_device *dev);

/* Starts (or stops) a thread of dev that runs its deferred actions as they become due, asleep
 * while none is. 0, or EALREADY (already in that state), ENOMEM/EAGAIN (thread creation).
 * The thread is stopped when the device closes. */
int compcntr_trigger_service_start(struct compcntr_device *dev);
int compcntr_trigger_service_stop(struct compcntr_device *dev);

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_TRIGGER_H */
