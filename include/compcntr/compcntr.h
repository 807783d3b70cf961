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
 * else a verbs device name (ENODEV if absent). */
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
};

struct compcntr_comp_cntr_init_attr {
	uint32_t comp_mask;
	enum compcntr_comp_cntr_type type;
	uint32_t flags;     /* reserved, must be 0 */
	int32_t numa_node;  /* read only with COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE */
};

struct compcntr_comp_cntr {
	struct compcntr_device *context;
	uint32_t handle;
};

struct compcntr_comp_cntr_caps {
	uint64_t max_value;
	uint32_t max_counters;
	uint32_t supported_qp_attach_ops;
};

int compcntr_query_comp_cntr_caps(struct compcntr_device *dev, struct compcntr_comp_cntr_caps *caps);
/* NULL + errno: EINVAL (NULL, flags != 0, unknown comp_mask bit or type, bad numa_node),
 * ENOTSUP (type not supported by the device), ENOMEM (max_counters reached). */
struct compcntr_comp_cntr *compcntr_create_comp_cntr(struct compcntr_device *dev,
                                                     struct compcntr_comp_cntr_init_attr *attr);
/* EBUSY while attached to a live QP (the counter stays usable). */
int compcntr_destroy_comp_cntr(struct compcntr_comp_cntr *cc);
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

#ifdef __cplusplus
}
#endif

/* Further call families, one header each, all reachable through this umbrella header. */
#include <compcntr/qp.h>
#include <compcntr/verbs.h>
#include <compcntr/wait.h>
#include <compcntr/cmd_comp.h>
#include <compcntr/credits.h>

#endif /* COMPCNTR_COMPCNTR_H */
