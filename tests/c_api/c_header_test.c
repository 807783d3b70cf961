/* Compiled as C11: the public header must be plain C. Exit status 0 = the calls behaved. */
#include <compcntr/compcntr.h>

#include <errno.h>
#include <stdio.h>

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
	struct compcntr_comp_cntr_init_attr attr = { .type = COMPCNTR_COMP_CNTR_TYPE_WRS };
	struct compcntr_comp_cntr *cc = compcntr_create_comp_cntr(dev, &attr);
	EXPECT(cc != NULL);
	EXPECT(compcntr_inc_comp_cntr(cc, 7) == 0);
	uint64_t v = 0;
	EXPECT(compcntr_read_comp_cntr(cc, &v) == 0 && v == 7);
	attr.flags = 1;
	errno = 0;
	EXPECT(compcntr_create_comp_cntr(dev, &attr) == NULL && errno == EINVAL);
	EXPECT(compcntr_close_device(dev) == EBUSY);
	EXPECT(compcntr_destroy_comp_cntr(cc) == 0);
	EXPECT(compcntr_close_device(dev) == 0);
	return 0;
}
