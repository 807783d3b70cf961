/* Count completions with the C API on the software device. */
#include <compcntr/compcntr.h>

#include <inttypes.h>
#include <stdio.h>

int main(void)
{
	struct compcntr_device *dev = compcntr_open_device("soft");
	if (!dev) {
		fprintf(stderr, "open_device: %s\n", compcntr_last_error_message());
		return 1;
	}
	struct compcntr_comp_cntr_init_attr attr = { .type = COMPCNTR_COMP_CNTR_TYPE_WRS };
	struct compcntr_comp_cntr *cc = compcntr_create_comp_cntr(dev, &attr);
	if (!cc) {
		fprintf(stderr, "create_comp_cntr: %s\n", compcntr_last_error_message());
		return 1;
	}
	compcntr_inc_comp_cntr(cc, 3);     /* three operations completed */
	compcntr_inc_err_comp_cntr(cc, 1); /* one failed */

	uint64_t done = 0, failed = 0;
	compcntr_read_comp_cntr(cc, &done);
	compcntr_read_err_comp_cntr(cc, &failed);
	printf("completed %" PRIu64 ", failed %" PRIu64 "\n", done, failed);

	compcntr_destroy_comp_cntr(cc);
	compcntr_close_device(dev);
	return done == 3 && failed == 1 ? 0 : 1;
}
