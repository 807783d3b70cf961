/* Asynchronous counter queries collected from an epoll loop (C API, software device).
 * Built and run by the test suite (examples/meson.build), quoted by docs/cmd_comp.md. */
#include <compcntr/compcntr.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

enum { NCOUNTERS = 4 };

int main(void)
{
	struct compcntr_device *dev = compcntr_open_device("soft");
	if (!dev)
		return fprintf(stderr, "open_device: %s\n", compcntr_last_error_message()), 1;
	struct compcntr_comp_cntr_init_attr attr = { .type = COMPCNTR_COMP_CNTR_TYPE_WRS };
	struct compcntr_comp_cntr *cc[NCOUNTERS];
	for (int i = 0; i < NCOUNTERS; i++) {
		cc[i] = compcntr_create_comp_cntr(dev, &attr);
		if (!cc[i])
			return fprintf(stderr, "create_comp_cntr: %s\n",
			               compcntr_last_error_message()),
			       1;
		compcntr_inc_comp_cntr(cc[i], 10 * (i + 1)); /* some completions */
	}
	struct compcntr_devx_cmd_comp *cmd = compcntr_devx_create_cmd_comp(dev);
	if (!cmd)
		return fprintf(stderr, "create_cmd_comp: %s\n", compcntr_last_error_message()), 1;

	/* Non-blocking collection from an epoll loop: the fd is readable while responses wait. */
	fcntl(cmd->fd, F_SETFL, fcntl(cmd->fd, F_GETFL) | O_NONBLOCK);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN };
	epoll_ctl(ep, EPOLL_CTL_ADD, cmd->fd, &ev);

	for (int i = 0; i < NCOUNTERS; i++) /* wr_id = which counter */
		if (compcntr_query_comp_cntr_async(cc[i], (uint64_t)i, cmd))
			return fprintf(stderr, "query: %s\n", compcntr_last_error_message()), 1;

	uint64_t sum = 0;
	int answered = 0;
	while (answered < NCOUNTERS && epoll_wait(ep, &ev, 1, 10000) == 1) {
		uint64_t buf[COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN / sizeof(uint64_t)];
		struct compcntr_devx_async_cmd_hdr *resp =
		        (struct compcntr_devx_async_cmd_hdr *)buf;
		while (compcntr_devx_get_async_cmd_comp(cmd, resp, sizeof buf) == 0) {
			struct compcntr_comp_cntr_values v;
			memcpy(&v, resp->out_data, sizeof v);
			printf("counter %" PRIu64 ": %" PRIu64 " completed, %" PRIu64 " failed\n",
			       resp->wr_id, v.comp, v.err);
			sum += v.comp;
			answered++;
		} /* stops at EAGAIN: the queue is empty, back to epoll_wait */
	}
	close(ep);
	compcntr_devx_destroy_cmd_comp(cmd);
	for (int i = 0; i < NCOUNTERS; i++)
		compcntr_destroy_comp_cntr(cc[i]);
	compcntr_close_device(dev);
	return answered == NCOUNTERS && sum == 100 ? 0 : 1;
}
