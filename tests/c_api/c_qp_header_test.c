/* Compiled as C11: compcntr/qp.h and compcntr/verbs.h must be plain C. A loopback send through
 * the C API; exit status 0 = the calls behaved. */
#include <compcntr/compcntr.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define EXPECT(cond)                                                                               \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond);         \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

int main(void)
{
	struct compcntr_device *dev = compcntr_open_device("soft");
	EXPECT(dev != NULL);
	struct compcntr_qp *a = compcntr_create_qp(dev), *b = compcntr_create_qp(dev);
	EXPECT(a != NULL && b != NULL);
	struct compcntr_comp_cntr_init_attr ca = { .type = COMPCNTR_COMP_CNTR_TYPE_BYTES };
	struct compcntr_comp_cntr *cc = compcntr_create_comp_cntr(dev, &ca);
	EXPECT(cc != NULL);
	struct compcntr_qp_attach_comp_cntr_attr attr = {
		.op_mask = COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RECV
	};
	EXPECT(compcntr_qp_attach_comp_cntr(b, cc, &attr) == 0);
	EXPECT(compcntr_modify_qp(a, (enum compcntr_qp_state)9) ==
	       EINVAL); /* legal C, unknown state */
	EXPECT(strcmp(compcntr_last_error_message(), "modify_qp: unknown state 9") == 0);
	EXPECT(compcntr_qp_state(a) == COMPCNTR_QPS_RESET);
	EXPECT(compcntr_modify_qp(a, COMPCNTR_QPS_INIT) == 0);
	EXPECT(compcntr_modify_qp(b, COMPCNTR_QPS_INIT) == 0);
	EXPECT(compcntr_connect_qp(a, b) == 0);
	EXPECT(compcntr_qp_state(a) == COMPCNTR_QPS_RTS);

	char msg[] = "hello, counters";
	char out[32] = { 0 };
	struct compcntr_mr *smr = compcntr_reg_mr(dev, msg, sizeof msg, 0);
	struct compcntr_mr *rmr =
	        compcntr_reg_mr(dev, out, sizeof out, COMPCNTR_ACCESS_LOCAL_WRITE);
	EXPECT(smr != NULL && rmr != NULL);
	EXPECT(compcntr_post_recv(b, 1, out, sizeof out, rmr->lkey) == 0);
	EXPECT(compcntr_post_send(a, 2, msg, sizeof msg, smr->lkey) == 0);
	uint64_t bytes = 0;
	EXPECT(compcntr_read_comp_cntr(cc, &bytes) == 0 && bytes == sizeof msg);
	EXPECT(strcmp(out, msg) == 0);
	size_t n = 1;
	EXPECT(compcntr_progress(dev, &n) == 0 && n == 0);

	struct compcntr_verbs_qp_attr vattr = { 0 };
	errno = 0;
	EXPECT(compcntr_wrap_ibv_qp(dev, NULL, &vattr) == NULL && errno == EINVAL);

	EXPECT(compcntr_destroy_comp_cntr(cc) == EBUSY);
	EXPECT(compcntr_dereg_mr(smr) == 0 && compcntr_dereg_mr(rmr) == 0);
	EXPECT(compcntr_destroy_qp(a) == 0 && compcntr_destroy_qp(b) == 0);
	EXPECT(compcntr_destroy_comp_cntr(cc) == 0);
	EXPECT(compcntr_close_device(dev) == 0);
	return 0;
}
