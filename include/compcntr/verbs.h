/* compcntr and the application's own verbs QPs.
 *
 * compcntr_wrap_ibv_qp gives an ibv_qp a compcntr_qp handle so counters can be attached to it with
 * compcntr_qp_attach_comp_cntr. Where the device has native completion counters (rdma-core 65+),
 * the attach is ibv_qp_attach_comp_cntr and the hardware counts. Elsewhere (rdma-core 44, or any
 * device such as "soft") compcntr emulates: compcntr_progress() drains the QP's CQs and adds each
 * completion to the attached counters. Reference: docs/verbs.md.
 */
#ifndef COMPCNTR_VERBS_H
#define COMPCNTR_VERBS_H

#include <compcntr/compcntr.h>
#include <compcntr/qp.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_qp;    /* <infiniband/verbs.h> */
struct ibv_cq_ex; /* <infiniband/verbs.h> */
struct compcntr_qp;

struct compcntr_verbs_qp_attr {
	uint32_t comp_mask;         /* must be 0 */
	/* Emulation only (ignored with native counters): the CQ of the QP's send-queue completions
	 * (required) and of its receive completions (NULL: send_cq), created with ibv_create_cq_ex.
	 * compcntr drains them in compcntr_progress(): do not poll them yourself. A CQ shared by
	 * several wrapped QPs needs IBV_WC_EX_WITH_QP_NUM; BYTES counters need IBV_WC_EX_WITH_BYTE_LEN. */
	struct ibv_cq_ex *send_cq;
	struct ibv_cq_ex *recv_cq;
	/* Optional: the op (one COMPCNTR_QP_ATTACH_COMP_CNTR_OP_ bit: SEND, RECV, RDMA_READ or
	 * RDMA_WRITE) and length of a work request of this QP, from its wr_id; return 0 if known.
	 * Used to charge error completions (their opcode is undefined in verbs) and for the length of
	 * send-queue completions. It runs inside compcntr_progress() with the device's progress lock
	 * held and the CQ mid-poll: it must not call compcntr_progress or wait on this device's
	 * counters, wrap or destroy QPs of this device, or poll the CQ. */
	int (*wr_info)(void *ctx, uint64_t wr_id, uint32_t *op, uint64_t *length);
	void *wr_info_ctx;
};

/* A compcntr_qp for `qp`, which stays the application's (compcntr_destroy_qp does not destroy it;
 * with native counters destroy the ibv_qp first, then its wrapper and counters). NULL + errno:
 * EINVAL (NULL argument, comp_mask != 0, no send_cq for emulation, qp of another device context
 * with native counters), EBUSY (qp already wrapped for emulation), ENOTSUP (built without
 * libibverbs), ENOMEM. Posting and connect on the wrapper are ENOTSUP: use the ibv_qp. */
struct compcntr_qp *compcntr_wrap_ibv_qp(struct compcntr_device *dev, struct ibv_qp *qp,
                                         const struct compcntr_verbs_qp_attr *attr);

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_VERBS_H */
