/* The exec'ed peer of tests/shared/shared_test.cpp: a separate program (C, the installed API
 * only) that opens shared device NAME, resolves counter {GEN, INDEX}, adds ADD to it, then
 * sleeps in the kernel until the counter reaches 100. Exit 0 on success, else the step that
 * failed (with the library's message on stderr).
 * Usage: shared_child NAME GEN INDEX ADD */
#include <compcntr/compcntr.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(int step, const char *what)
{
	fprintf(stderr, "shared_child: %s failed: %s\n", what, compcntr_last_error_message());
	return step;
}

int main(int argc, char **argv)
{
	struct compcntr_device *dev;
	struct compcntr_counter_id id;
	struct compcntr_comp_cntr *cc;
	struct compcntr_wait_attr attr = { 0 };
	uint64_t v = 0;

	if (argc != 5)
		return fail(2, "usage: shared_child NAME GEN INDEX ADD;");
	dev = compcntr_open_shared_device(argv[1], 0, 0);
	if (!dev)
		return fail(3, "open_shared_device");
	id.generation = strtoull(argv[2], NULL, 10);
	id.index = (uint32_t)strtoul(argv[3], NULL, 10);
	cc = compcntr_comp_cntr_resolve(dev, &id);
	if (!cc)
		return fail(4, "comp_cntr_resolve");
	if (compcntr_inc_comp_cntr(cc, strtoull(argv[4], NULL, 10)) != 0)
		return fail(5, "inc_comp_cntr");
	attr.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
	attr.spin_ns = 0; /* sleep in the kernel at once */
	if (compcntr_wait_comp_cntr_ex(cc, 100, -1, &attr) != 0)
		return fail(6, "wait_comp_cntr_ex");
	if (compcntr_read_comp_cntr(cc, &v) != 0 || v != 100)
		return fail(7, "read_comp_cntr == 100");
	if (compcntr_comp_cntr_release(cc) != 0)
		return fail(8, "comp_cntr_release");
	if (compcntr_close_device(dev) != 0)
		return fail(9, "close_device");
	return 0;
}
