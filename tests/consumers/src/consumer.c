/* A C consumer: counts on the software device, reports the library version. */
#include <compcntr/compcntr.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	if (strcmp(compcntr_version(), COMPCNTR_VERSION_STRING) != 0) {
		fprintf(stderr, "headers %s, library %s\n", COMPCNTR_VERSION_STRING,
		        compcntr_version());
		return 1;
	}
	struct compcntr_device *dev = compcntr_open_device("soft");
	if (!dev) {
		fprintf(stderr, "open_device: %s\n", compcntr_last_error_message());
		return 1;
	}
	struct compcntr_comp_cntr_init_attr attr = { .type = COMPCNTR_COMP_CNTR_TYPE_BYTES };
	struct compcntr_comp_cntr *cc = compcntr_create_comp_cntr(dev, &attr);
	if (!cc) {
		fprintf(stderr, "create_comp_cntr: %s\n", compcntr_last_error_message());
		return 1;
	}
	for (int i = 0; i < 10; ++i)
		compcntr_inc_comp_cntr(cc, 4096);
	uint64_t v = 0;
	int rc = compcntr_read_comp_cntr(cc, &v);
	int bad = compcntr_inc_comp_cntr(NULL, 1); /* EINVAL, never a crash */
	printf("consumer_c: compcntr %s, %" PRIu64 " bytes, NULL counter -> %d\n",
	       compcntr_version(), v, bad);
	compcntr_destroy_comp_cntr(cc);
	compcntr_close_device(dev);
	return rc == 0 && v == 40960 && bad == 22 /* EINVAL */ ? 0 : 1;
}
