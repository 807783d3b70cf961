/* compcntr: lock-free completion counters for HPC runtimes -- the C API.
 *
 * A one-to-one port of the rdma-core completion counter verbs (ibv_ -> compcntr_), served by
 * the software device "soft" (always available) or by a native RDMA device. Every call returns
 * 0 or a positive errno value unless stated; constructors return NULL and set errno. NULL
 * pointer arguments are EINVAL, never a crash. After a failure, compcntr_last_error_message()
 * names the cause in the calling thread. Reference: docs/ (one page per call family).
 */
#ifndef COMPCNTR_COMPCNTR_H
#define COMPCNTR_COMPCNTR_H

#include <stddef.h>
#include <stdint.h>

#include <compcntr/version.h> /* COMPCNTR_VERSION_STRING and friends: the headers' version */

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library this program runs with ("0.1.0"; a static string). Compare it
 * with COMPCNTR_VERSION_STRING (the headers it was compiled with) to detect a mismatch. */
const char *compcntr_version(void);

/* ---- devices ---------------------------------------------------------------------------- */

struct compcntr_device; /* opaque */

/* NULL or "auto": a native RDMA device if one works, else "soft"; "soft": the software device;
 * else a verbs device name (ENODEV if absent; "" names no device: ENODEV). EINVAL if
 * COMPCNTR_MAX_COUNTERS is set but is not a decimal count in 1..4294963200. "shm:NAME": the
 * shared device NAME, created if absent, owner-only (<compcntr/shared.h>). */
struct compcntr_device *compcntr_open_device(const char *name);
/* EBUSY while objects of the device live (nothing changes then). */
int compcntr_close_device(struct compcntr_device *dev);
/* The name the device was opened as ("soft", "mlx5_0", ...); NULL for a NULL device. */
const char *compcntr_device_name(const struct compcntr_device *dev);

/* The sentence naming the cause of the last failed compcntr call in this thread ("" if none). */
const char *compcntr_last_error_message(void);

/* ---- completion counters ---------------------------------------------------------------- */

enum compcntr_comp_cntr_type {
	COMPCNTR_COMP_CNTR_TYPE_WRS = 0,   /* +1 per completed work request (default) */
	COMPCNTR_COMP_CNTR_TYPE_BYTES = 1, /* +length of each completed operation */
};

enum {
	COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE = 1u << 0, /* comp_mask bit: numa_node is valid */
	COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES = 1u << 1,   /* comp_mask bit: stripes is valid */
};

/* stripes value: one stripe per CPU (a striped counter; see docs/counters.md). */
#define COMPCNTR_COMP_CNTR_STRIPES_PER_CPU UINT32_MAX

struct compcntr_comp_cntr_init_attr {
	uint32_t comp_mask;
	enum compcntr_comp_cntr_type type;
	uint32_t flags;     /* reserved, must be 0 */
	int32_t numa_node;  /* read only with COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE */
	/* Read only with COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES (so a caller built against the older,
	 * shorter struct is never read past its end): 0 or 1 a plain counter; N > 1 a striped
	 * counter of N stripes rounded up to a power of two (at most 256, else EINVAL);
	 * COMPCNTR_COMP_CNTR_STRIPES_PER_CPU one per CPU. Striped counters take updates from many
	 * threads at the speed of separate counters; a read sums the stripes. ENOTSUP on a device
	 * whose counters are native (hardware-backed). */
	uint32_t stripes;
};

struct compcntr_comp_cntr_slot_; /* private: the counter's memory, see below */

struct compcntr_comp_cntr {
	struct compcntr_device *context;
	uint32_t handle;
	/* Private, for the inline fast paths below; do not use or change. */
	uint32_t reserved_;
	struct compcntr_comp_cntr_slot_ *slot_;
};

struct compcntr_comp_cntr_caps {
	uint64_t max_value;
	uint32_t max_counters;
	uint32_t supported_qp_attach_ops;
};

int compcntr_query_comp_cntr_caps(struct compcntr_device *dev,
                                  struct compcntr_comp_cntr_caps *caps);
/* NULL + errno: EINVAL (NULL, flags != 0, unknown comp_mask bit or type, bad numa_node),
 * ENOTSUP (type not supported by the device), ENOMEM (max_counters reached). */
struct compcntr_comp_cntr *compcntr_create_comp_cntr(struct compcntr_device *dev,
                                                     struct compcntr_comp_cntr_init_attr *attr);
/* EBUSY while attached to a live QP or owned (compcntr_comp_cntr_set_owner); the counter
 * stays usable. */
int compcntr_destroy_comp_cntr(struct compcntr_comp_cntr *cc);
/* Marks cc as owned by another object that will destroy it (the libfabric fid_cntr that
 * compcntr_fi_cntr_open made around it does): meanwhile compcntr_destroy_comp_cntr(cc) is
 * EBUSY with a message naming `owner` (a string that outlives the ownership, e.g. a literal).
 * owner NULL ends the ownership. EINVAL for a NULL cc; EBUSY if already owned (nothing changes). */
int compcntr_comp_cntr_set_owner(struct compcntr_comp_cntr *cc, const char *owner);
int compcntr_set_comp_cntr(struct compcntr_comp_cntr *cc, uint64_t value);
int compcntr_set_err_comp_cntr(struct compcntr_comp_cntr *cc, uint64_t value);
int compcntr_inc_comp_cntr(struct compcntr_comp_cntr *cc, uint64_t amount);
int compcntr_inc_err_comp_cntr(struct compcntr_comp_cntr *cc, uint64_t amount);
int compcntr_read_comp_cntr(struct compcntr_comp_cntr *cc, uint64_t *value);
int compcntr_read_err_comp_cntr(struct compcntr_comp_cntr *cc, uint64_t *value);
/* The NUMA node (OS index) whose memory holds the counter's slot, or -EINVAL for a NULL cc.
 * Without the NUMA comp_mask bit, the node local to the CPU the creating thread ran on. */
int compcntr_comp_cntr_numa_node(struct compcntr_comp_cntr *cc);
/* *type = the type the counter was created with. EINVAL for a NULL cc or type. */
int compcntr_comp_cntr_get_type(struct compcntr_comp_cntr *cc, enum compcntr_comp_cntr_type *type);

/* Private to the inline fast paths: wakes what watches the counter after an update made inline
 * (sleeping waiters, an armed fd, poll calls). Not for applications. */
void compcntr_priv_notify_slow(struct compcntr_comp_cntr *cc);

/* ---- inline fast paths ------------------------------------------------------------------
 *
 * With GCC or clang, and unless COMPCNTR_NO_INLINE is defined before this header, the data
 * path calls (read, read_err, inc, inc_err, set, set_err, and wait with a reached threshold,
 * <compcntr/wait.h>) are macros over static inline functions that work on the counter's memory
 * directly: a read is one acquire load, an increment one atomic RMW plus one load, as in C++
 * (`import compcntr;`). Their semantics, memory ordering and return values are those of the
 * exported functions, which they call for everything but the common case (a NULL argument, a
 * striped or hardware-backed counter, an update someone watches). The exported functions stay:
 * take their address, dlsym() them, bind them from another language, or define
 * COMPCNTR_NO_INLINE to call them everywhere. The layout below is part of the library's ABI
 * (the soname changes if it does). */
struct compcntr_comp_cntr_slot_ {
	uint64_t value; /* completion count (atomic); always 0 in a striped counter */
	uint64_t errors; /* error count (atomic); always 0 in a striped counter */
	uint64_t reserved0_[2];
	const void *stripes; /* non-NULL: a striped counter (reads sum its stripes) */
	uint64_t reserved1_[3];
	uint32_t watch; /* non-zero: someone must hear about updates (atomic) */
	uint32_t reserved2_;
	const void *hw; /* non-NULL: updates go through the device (or the stripes) */
};

#if !defined(COMPCNTR_NO_INLINE) && (defined(__GNUC__) || defined(__clang__))
#define COMPCNTR_INLINE_FAST_PATHS 1

/* The exported read through a temporary, so the caller's variable never has its address taken
 * by the fast path (the compiler keeps it in a register); *value is written only on success. */
static inline int compcntr_priv_read_slow_(int (*read)(struct compcntr_comp_cntr *, uint64_t *),
                                           struct compcntr_comp_cntr *cc, uint64_t *value)
{
	uint64_t v;
	const int ret = value == NULL ? read(cc, NULL) : read(cc, &v);
	if (ret == 0)
		*value = v;
	return ret;
}

static inline int compcntr_read_comp_cntr_inline_(struct compcntr_comp_cntr *cc, uint64_t *value)
{
	const struct compcntr_comp_cntr_slot_ *s;
	if (__builtin_expect(cc == NULL || value == NULL, 0) ||
	    __builtin_expect((s = cc->slot_)->stripes != NULL, 0))
		return compcntr_priv_read_slow_(compcntr_read_comp_cntr, cc, value);
	*value = __atomic_load_n(&s->value, __ATOMIC_ACQUIRE);
	return 0;
}

static inline int compcntr_read_err_comp_cntr_inline_(struct compcntr_comp_cntr *cc,
                                                      uint64_t *value)
{
	const struct compcntr_comp_cntr_slot_ *s;
	if (__builtin_expect(cc == NULL || value == NULL, 0) ||
	    __builtin_expect((s = cc->slot_)->stripes != NULL, 0))
		return compcntr_priv_read_slow_(compcntr_read_err_comp_cntr, cc, value);
	*value = __atomic_load_n(&s->errors, __ATOMIC_ACQUIRE);
	return 0;
}

/* Memory ordering: a seq_cst RMW, then a seq_cst load of watch (the library's no-lost-wake-up
 * pairing with waiters, compcntr:slot). */
static inline int compcntr_inc_comp_cntr_inline_(struct compcntr_comp_cntr *cc, uint64_t amount)
{
	struct compcntr_comp_cntr_slot_ *s;
	if (__builtin_expect(cc == NULL, 0) || __builtin_expect((s = cc->slot_)->hw != NULL, 0))
		return (compcntr_inc_comp_cntr)(cc, amount);
	__atomic_fetch_add(&s->value, amount, __ATOMIC_SEQ_CST);
	if (__builtin_expect(__atomic_load_n(&s->watch, __ATOMIC_SEQ_CST) != 0, 0))
		compcntr_priv_notify_slow(cc);
	return 0;
}

static inline int compcntr_inc_err_comp_cntr_inline_(struct compcntr_comp_cntr *cc, uint64_t amount)
{
	struct compcntr_comp_cntr_slot_ *s;
	if (__builtin_expect(cc == NULL, 0) || __builtin_expect((s = cc->slot_)->hw != NULL, 0))
		return (compcntr_inc_err_comp_cntr)(cc, amount);
	__atomic_fetch_add(&s->errors, amount, __ATOMIC_SEQ_CST);
	if (__builtin_expect(__atomic_load_n(&s->watch, __ATOMIC_SEQ_CST) != 0, 0))
		compcntr_priv_notify_slow(cc);
	return 0;
}

static inline int compcntr_set_comp_cntr_inline_(struct compcntr_comp_cntr *cc, uint64_t value)
{
	struct compcntr_comp_cntr_slot_ *s;
	if (__builtin_expect(cc == NULL, 0) || __builtin_expect((s = cc->slot_)->hw != NULL, 0))
		return (compcntr_set_comp_cntr)(cc, value);
	__atomic_store_n(&s->value, value, __ATOMIC_SEQ_CST);
	if (__builtin_expect(__atomic_load_n(&s->watch, __ATOMIC_SEQ_CST) != 0, 0))
		compcntr_priv_notify_slow(cc);
	return 0;
}

static inline int compcntr_set_err_comp_cntr_inline_(struct compcntr_comp_cntr *cc, uint64_t value)
{
	struct compcntr_comp_cntr_slot_ *s;
	if (__builtin_expect(cc == NULL, 0) || __builtin_expect((s = cc->slot_)->hw != NULL, 0))
		return (compcntr_set_err_comp_cntr)(cc, value);
	__atomic_store_n(&s->errors, value, __ATOMIC_SEQ_CST);
	if (__builtin_expect(__atomic_load_n(&s->watch, __ATOMIC_SEQ_CST) != 0, 0))
		compcntr_priv_notify_slow(cc);
	return 0;
}

#define compcntr_read_comp_cntr(cc, value) compcntr_read_comp_cntr_inline_((cc), (value))
#define compcntr_read_err_comp_cntr(cc, value) compcntr_read_err_comp_cntr_inline_((cc), (value))
#define compcntr_inc_comp_cntr(cc, amount) compcntr_inc_comp_cntr_inline_((cc), (amount))
#define compcntr_inc_err_comp_cntr(cc, amount) compcntr_inc_err_comp_cntr_inline_((cc), (amount))
#define compcntr_set_comp_cntr(cc, value) compcntr_set_comp_cntr_inline_((cc), (value))
#define compcntr_set_err_comp_cntr(cc, value) compcntr_set_err_comp_cntr_inline_((cc), (value))
#endif /* inline fast paths */

#ifdef __cplusplus
}
#endif

/* Further call families, one header each, all reachable through this umbrella header. */
#include <compcntr/cmd_comp.h>
#include <compcntr/credits.h>
#include <compcntr/qp.h>
#include <compcntr/shared.h>
#include <compcntr/tracker.h>
#include <compcntr/trigger.h>
#include <compcntr/verbs.h>
#include <compcntr/wait.h>

#endif /* COMPCNTR_COMPCNTR_H */
