/* compcntr: asynchronous command completion (DEVX-style) -- the C API.
 *
 * Issue counter queries without blocking and collect the responses later from an object whose
 * fd polls readable exactly while a response is queued. A port of rdma-core's
 * mlx5dv_devx_create_cmd_comp / mlx5dv_devx_get_async_cmd_comp family (mlx5dv_ -> compcntr_);
 * on mlx5 devices it is served by those calls. Reference: docs/cmd_comp.md.
 */
#ifndef COMPCNTR_CMD_COMP_H
#define COMPCNTR_CMD_COMP_H

#include <compcntr/compcntr.h>

#ifdef __cplusplus
extern "C" {
#endif

struct compcntr_devx_cmd_comp {
	int fd; /* readable (poll/epoll) while >= 1 response is queued; O_NONBLOCK is honoured */
};

/* NULL + errno: EINVAL (dev NULL), ENOMEM, EMFILE/ENFILE (no file descriptor left). */
struct compcntr_devx_cmd_comp *compcntr_devx_create_cmd_comp(struct compcntr_device *dev);
/* Discards queued and in-flight responses and closes the fd. */
void compcntr_devx_destroy_cmd_comp(struct compcntr_devx_cmd_comp *cmd_comp);

struct compcntr_devx_async_cmd_hdr {
	uint64_t wr_id;     /* the wr_id the command was issued with */
	uint8_t out_data[]; /* the command's output: struct compcntr_comp_cntr_values for queries */
};

/* Pops one response. EINVAL: NULL argument or cmd_resp_len < sizeof(header) (8);
 * ENOSPC: cmd_resp_len < header + the response's data (the response stays queued);
 * EAGAIN: none queued and the fd is O_NONBLOCK (else the call blocks);
 * EIO: the device failed the command (cmd_resp->wr_id names it, the response is consumed). */
int compcntr_devx_get_async_cmd_comp(struct compcntr_devx_cmd_comp *cmd_comp,
                                     struct compcntr_devx_async_cmd_hdr *cmd_resp,
                                     size_t cmd_resp_len);

struct compcntr_comp_cntr_values {
	uint64_t comp; /* completion count */
	uint64_t err; /* error count */
};

/* Bytes of one counter query response: header + struct compcntr_comp_cntr_values (24). */
#define COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN                                                          \
	(sizeof(struct compcntr_devx_async_cmd_hdr) + sizeof(struct compcntr_comp_cntr_values))

/* Queries cc asynchronously: answered on cmd_comp with wr_id and the counter's values.
 * EINVAL: NULL argument, or cc and cmd_comp of different devices; EAGAIN: 1 MiB of responses
 * (65,536 queries) outstanding on cmd_comp (nothing changes). */
int compcntr_query_comp_cntr_async(struct compcntr_comp_cntr *cc, uint64_t wr_id,
                                   struct compcntr_devx_cmd_comp *cmd_comp);

#ifdef __cplusplus
}
#endif

#endif /* COMPCNTR_CMD_COMP_H */
