/* A program that ends with counters still live (no destroy, no close), its handles in globals
 * (reachable: not the program's leaks): under LeakSanitizer (the ASan build) nothing a live
 * counter owns may be reported as leaked. Regression (issue 22,
 * found by the runtime fault sweep under ASan): a slot's extension block (fd, armed state)
 * is reachable only from its slot, and the pool's arenas are mmap'd by hwloc, which LSan did
 * not scan: every such block was reported at exit. The pool now registers its arenas as LSan
 * root regions. In the other builds the program only checks its calls. */
#include <compcntr/compcntr.h>
#include <compcntr/wait.h>

#include <stdio.h>
#include <stdlib.h>

static void die(const char *what)
{
	fprintf(stderr, "live_at_exit: %s: %s\n", what, compcntr_last_error_message());
	exit(1);
}

static struct compcntr_device *dev;
static struct compcntr_comp_cntr *live[3];

int main(void)
{
	dev = compcntr_open_device("soft");
	if (!dev)
		die("compcntr_open_device");
	for (int i = 0; i < 3; i++) {
		struct compcntr_comp_cntr_init_attr attr = { .comp_mask = 0 };
		struct compcntr_comp_cntr *cc = live[i] = compcntr_create_comp_cntr(dev, &attr);
		if (!cc)
			die("compcntr_create_comp_cntr");
		int fd = -1;
		if (compcntr_comp_cntr_get_fd(cc, &fd) != 0) /* creates the extension block */
			die("compcntr_comp_cntr_get_fd");
		if (compcntr_comp_cntr_arm_fd(cc) != 0)
			die("compcntr_comp_cntr_arm_fd");
	}
	/* No destroy, no close: the process ends with three live counters. */
	return 0;
}
