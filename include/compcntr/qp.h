/* compcntr QPs: attaching counters to queue pairs, and the software device's loopback data path.
 *
 * Counters count completions of the QPs they are attached to (verbs ibv_qp_attach_comp_cntr
 * rules). On the software device ("soft"), QPs are in-process loopback QPs that really move bytes
 * between registered buffers and really complete or fail. Reference: docs/qp.md.
 * Every call returns 0 or a positive errno value unless stated; constructors return NULL and set
 * errno; NULL pointer arguments are EINVAL. A refused call changes nothing.
 */
#ifndef COMPCNTR_QP_H
#define COMPCNTR_QP_H

#include <compcntr/compcntr.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum compcntr_qp_attach_comp_cntr_op {
	COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND = 1 << 0,              /* sends this side posted */
	COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RECV = 1 << 1, /* receives this side posted */
	COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_READ = 1 << 2, /* RDMA reads this side posted */
	COMPCNTR_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_READ =
	        1 << 3, /* the peer's reads of our memory */
	COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE = 1 << 4, /* RDMA writes this side posted */
	COMPCNTR_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE =
	        1 << 5, /* the peer's writes into our memory */
};

struct compcntr_qp_attach_comp_cntr_attr {
	uint32_t comp_mask; /* must be 0 */
	uint32_t op_mask; /* compcntr_qp_attach_comp_cntr_op bits, not empty */
};

enum compcntr_qp_state {
	COMPCNTR_QPS_RESET,
	COMPCNTR_QPS_INIT,
	COMPCNTR_QPS_RTS,
	COMPCNTR_QPS_ERR
};

struct compcntr_qp; /* opaque */

/* A new QP in RESET (software device). NULL + errno: EINVAL (NULL dev), ENOTSUP (a verbs device:
 * wrap your own ibv_qp, <compcntr/verbs.h>), ENOMEM. */
struct compcntr_qp *compcntr_create_qp(struct compcntr_device *dev);
/* Destroys the QP; its attachments end (no completion is reported for its outstanding work). */
int compcntr_destroy_qp(struct compcntr_qp *qp);
/* RESET->INIT, any->ERR (outstanding work completes in error). INIT->RTS on the software device
 * is done by compcntr_connect_qp. Other transitions or unknown states: EINVAL. Wrapped verbs QPs:
 * ENOTSUP (use ibv_modify_qp). */
int compcntr_modify_qp(struct compcntr_qp *qp, enum compcntr_qp_state state);
/* Software device: pairs two distinct INIT QPs of one device; both move to RTS. EINVAL otherwise. */
int compcntr_connect_qp(struct compcntr_qp *qp, struct compcntr_qp *peer);
/* The QP's state; COMPCNTR_QPS_ERR with errno EINVAL for a NULL qp. */
enum compcntr_qp_state compcntr_qp_state(const struct compcntr_qp *qp);
/* EINVAL: NULL argument, comp_mask != 0, empty op_mask, QP not in RESET/INIT, counter of another
 * device. ENOTSUP: op bits outside the device's supported_qp_attach_ops. EBUSY: an op of op_mask
 * is already counted by a counter on this QP (nothing is attached). No detach: destroying the QP
 * ends its attachments; destroying an attached counter is EBUSY. */
int compcntr_qp_attach_comp_cntr(struct compcntr_qp *qp, struct compcntr_comp_cntr *cc,
                                 struct compcntr_qp_attach_comp_cntr_attr *attr);

/* ---- memory registration (software device) --------------------------------------------- */

enum {
	COMPCNTR_ACCESS_LOCAL_WRITE = 1, /* receive / RDMA-read target */
	COMPCNTR_ACCESS_REMOTE_WRITE = 2, /* target of the peer's RDMA writes (needs LOCAL_WRITE) */
	COMPCNTR_ACCESS_REMOTE_READ = 4, /* source of the peer's RDMA reads */
};

struct compcntr_mr {
	void *addr;
	size_t length;
	uint32_t lkey; /* for this side's work requests */
	uint32_t rkey; /* for the peer's RDMA reads and writes */
};

/* NULL + errno: EINVAL (NULL dev or addr, length 0, unknown access bits, REMOTE_WRITE without
 * LOCAL_WRITE), ENOTSUP (verbs device: use ibv_reg_mr), ENOMEM. */
struct compcntr_mr *compcntr_reg_mr(struct compcntr_device *dev, void *addr, size_t length,
                                    int access);
/* Waits for a copy in progress from or into the region, then removes it. */
int compcntr_dereg_mr(struct compcntr_mr *mr);

/* ---- posting (software device) ------------------------------------------------------------
 * Posting needs RTS (else EINVAL); a NULL addr with len > 0 is EINVAL; a refused post changes
 * nothing. A post that is accepted returns 0 even when its operation then fails: send lengths
 * larger than the matched receive buffer, keys that do not match, ranges outside a registration
 * or missing access rights complete in error (error counts) and move no byte. An error
 * completion moves the QP to ERR and flushes its outstanding work in error (docs/qp.md).
 * Every completion is visible in its counters when the call that completed it returns. */
int compcntr_post_recv(struct compcntr_qp *qp, uint64_t wr_id, void *addr, size_t len,
                       uint32_t lkey);
int compcntr_post_send(struct compcntr_qp *qp, uint64_t wr_id, const void *addr, size_t len,
                       uint32_t lkey);
int compcntr_post_rdma_write(struct compcntr_qp *qp, uint64_t wr_id, const void *addr, size_t len,
                             uint32_t lkey, uint64_t remote_addr, uint32_t rkey);
int compcntr_post_rdma_read(struct compcntr_qp *qp, uint64_t wr_id, void *addr, size_t len,
                            uint32_t lkey, uint64_t remote_addr, uint32_t rkey);

/* ---- progress -------------------------------------------------------------------------------
 * Drains the device's completions that no call delivers by itself (CQs of wrapped verbs QPs
 * under emulation, <compcntr/verbs.h>) into their counters. *completions (if not NULL) receives
 * how many were consumed. Cheap no-op on a device with nothing to drain (the software device). */
int compcntr_progress(struct compcntr_device *dev, size_t *completions);

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_QP_H */
