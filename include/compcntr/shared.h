/* compcntr counters shared by the processes of a node, and counter ids: a device whose counters
 * live in a named POSIX shared-memory segment that every process of the user opens by name; a
 * counter created there is found from any of them by its id. Reference: docs/shared.md.
 * Reached through <compcntr/compcntr.h>.
 *
 * Every call on counters (read, inc, set, wait, poll, credits, tracker) works on a shared
 * counter as on a private one; waits sleep in the kernel across processes. The segment is
 * untrusted input: opening checks its owner, mode, size, magic, version and layout, and refuses
 * anything else with an errno and compcntr_last_error_message(). Every call returns 0 or a
 * positive errno value unless stated; constructors return NULL and set errno. NULL pointer
 * arguments are EINVAL. A refused call changes nothing.
 */
#ifndef COMPCNTR_SHARED_H
#define COMPCNTR_SHARED_H

#include <compcntr/compcntr.h>

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
	COMPCNTR_SHARED_CREATE = 1u << 0, /* create the segment if absent (or stale: replaced) */
	COMPCNTR_SHARED_EXCL = 1u << 1,   /* with CREATE: EEXIST if a live segment has the name */
};

/* Opens the shared device NAME (1 to 200 characters of [A-Za-z0-9._-]; the segment is
 * /dev/shm/compcntr.NAME). compcntr_open_device("shm:NAME") is this with COMPCNTR_SHARED_CREATE
 * and mode 0600. mode: 0 or 0600 owner-only, 0660 (0640, 0620) a group too; other users never.
 * A segment whose processes are all gone (stale), or whose creator died initialising it, is
 * replaced (with CREATE) instead of reused. NULL + errno: EINVAL (name, flags, mode), ENOENT
 * (absent or stale, no CREATE), EEXIST (EXCL), EACCES (another user's segment, or open to every
 * user), EBADMSG (not a compcntr segment, corrupt or truncated), EUSERS (56 live processes
 * have it open), ENOMEM, or the errno of shm_open / mmap. Close it with compcntr_close_device:
 * the other processes keep their counters; the last process to close it removes its name. */
struct compcntr_device *compcntr_open_shared_device(const char *name, uint32_t flags, mode_t mode);

/* Reclaims what dead processes held in the segment of shared device dev (their references,
 * the counters only they held; counters they created that others still hold become "dead":
 * waits on them end with EIO); *reclaimed (may be NULL) = dead processes found. Runs by itself
 * when a process opens the device and every second in sleeping waits. EINVAL for a private
 * device. */
int compcntr_sweep_shared_device(struct compcntr_device *dev, uint32_t *reclaimed);

/* A name for a counter that can outlive it: {generation, index}. On a shared device it names
 * the counter in every process that opened the device; on a private device, in this process. */
struct compcntr_counter_id {
	uint64_t generation;
	uint32_t index;
};

/* *id = cc's id. EINVAL for a NULL argument. */
int compcntr_comp_cntr_id(struct compcntr_comp_cntr *cc, struct compcntr_counter_id *id);

/* A reference to the live counter *id names on dev: use it as a counter (read, inc, wait, ...)
 * until compcntr_comp_cntr_release; it keeps the counter alive meanwhile (its creator's
 * compcntr_destroy_comp_cntr is EBUSY in the same process; in another process the destroy ends
 * the counter's name and the holders keep using it until they release it). NULL + errno:
 * EINVAL (NULL argument), ENOENT (destroyed or never created; on a shared device also when its
 * creator died), ESTALE (the id's generation is gone: its counter was destroyed and the slot
 * freed or reused), ENOMEM. */
struct compcntr_comp_cntr *compcntr_comp_cntr_resolve(struct compcntr_device *dev,
                                                      const struct compcntr_counter_id *id);

/* Drops a reference from compcntr_comp_cntr_resolve (if its counter was destroyed meanwhile,
 * this finishes it). EINVAL for NULL or for a counter that is not such a reference (destroy
 * those with compcntr_destroy_comp_cntr, which is EBUSY on a reference). */
int compcntr_comp_cntr_release(struct compcntr_comp_cntr *ref);

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_SHARED_H */
