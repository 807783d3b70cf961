/* The rdma-core 65 completion counter API, declared from its man pages, for a compile-only
 * check of src/integrations/verbs/native_comp_cntr.cpp on machines whose rdma-core is older (Debian 12 ships
 * rdma-core 44). Force-included (-include) before that unit; nothing built with it is linked.
 *
 * Sources (rdma-core 65): ibv_create_comp_cntr(3), ibv_query_comp_cntr_caps(3),
 * ibv_qp_attach_comp_cntr(3), efadv_create_comp_cntr(3). Where the man page and the library
 * disagree on a name, the library's spelling is used: the attach attribute struct is
 * ibv_qp_attach_comp_cntr_attr and the op bits IBV_QP_ATTACH_COMP_CNTR_OP_* (libibverbs'
 * cmd_comp_cntr.c and pyverbs), where ibv_qp_attach_comp_cntr(3) writes ibv_comp_cntr_attach_attr.
 * native_comp_cntr.cpp takes the struct's type from the function's prototype, so either works.
 */
#ifndef COMPCNTR_TESTS_RDMA_CORE65_DECLS_H
#define COMPCNTR_TESTS_RDMA_CORE65_DECLS_H

#include <infiniband/efadv.h>
#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_comp_cntr {
	struct ibv_context *context;
	uint32_t handle;
};

enum ibv_comp_cntr_type {
	IBV_COMP_CNTR_TYPE_WRS,
	IBV_COMP_CNTR_TYPE_BYTES,
};

struct ibv_comp_cntr_init_attr {
	uint32_t comp_mask;
	enum ibv_comp_cntr_type type;
	uint32_t flags;
};

struct ibv_comp_cntr_caps {
	uint64_t max_value;
	uint32_t max_counters;
	uint32_t supported_qp_attach_ops;
};

enum ibv_qp_attach_comp_cntr_op {
	IBV_QP_ATTACH_COMP_CNTR_OP_SEND = 1 << 0,
	IBV_QP_ATTACH_COMP_CNTR_OP_RECV = 1 << 1,
	IBV_QP_ATTACH_COMP_CNTR_OP_RDMA_READ = 1 << 2,
	IBV_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_READ = 1 << 3,
	IBV_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE = 1 << 4,
	IBV_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE = 1 << 5,
};

struct ibv_qp_attach_comp_cntr_attr {
	uint32_t comp_mask;
	uint32_t op_mask;
};

int ibv_query_comp_cntr_caps(struct ibv_context *context, struct ibv_comp_cntr_caps *caps);
struct ibv_comp_cntr *ibv_create_comp_cntr(struct ibv_context *context,
                                           struct ibv_comp_cntr_init_attr *cc_attr);
int ibv_destroy_comp_cntr(struct ibv_comp_cntr *comp_cntr);
int ibv_set_comp_cntr(struct ibv_comp_cntr *comp_cntr, uint64_t value);
int ibv_set_err_comp_cntr(struct ibv_comp_cntr *comp_cntr, uint64_t value);
int ibv_inc_comp_cntr(struct ibv_comp_cntr *comp_cntr, uint64_t amount);
int ibv_inc_err_comp_cntr(struct ibv_comp_cntr *comp_cntr, uint64_t amount);
int ibv_read_comp_cntr(struct ibv_comp_cntr *comp_cntr, uint64_t *value);
int ibv_read_err_comp_cntr(struct ibv_comp_cntr *comp_cntr, uint64_t *value);
int ibv_qp_attach_comp_cntr(struct ibv_qp *qp, struct ibv_comp_cntr *comp_cntr,
                            struct ibv_qp_attach_comp_cntr_attr *attr);

/* efadv_create_comp_cntr(3) */
enum {
	EFADV_MEMORY_LOCATION_VA,
	EFADV_MEMORY_LOCATION_DMABUF,
};

struct efadv_memory_location {
	uint8_t *ptr;
	struct {
		uint64_t offset;
		int32_t fd;
		uint32_t reserved;
	} dmabuf;
	uint8_t type;
	uint8_t reserved[7];
};

enum {
	EFADV_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM = 1 << 0,
	EFADV_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM = 1 << 1,
};

struct efadv_comp_cntr_init_attr {
	uint64_t comp_mask;
	uint32_t flags;
	uint32_t reserved;
	struct efadv_memory_location comp_cntr_ext_mem;
	struct efadv_memory_location err_cntr_ext_mem;
};

struct ibv_comp_cntr *efadv_create_comp_cntr(struct ibv_context *ibvctx,
                                             struct ibv_comp_cntr_init_attr *attr,
                                             struct efadv_comp_cntr_init_attr *efa_attr,
                                             uint32_t inlen);

#ifdef __cplusplus
}
#endif

#endif
