/* Waiting for completions three ways: poll over several counters, a blocking wait on one, and
 * an epoll loop on a counter's file descriptor. Another thread plays the network. */
#include <compcntr/compcntr.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <unistd.h>

static void *network(void *arg)
{
	struct compcntr_comp_cntr **cc = arg;
	compcntr_inc_comp_cntr(cc[1], 4); /* four operations counted by counter 1 complete */
	compcntr_inc_comp_cntr(cc[2], 1); /* one counted by counter 2 */
	return NULL;
}

int main(void)
{
	struct compcntr_device *dev = compcntr_open_device("soft");
	struct compcntr_comp_cntr_init_attr attr = { .type = COMPCNTR_COMP_CNTR_TYPE_WRS };
	struct compcntr_comp_cntr *cc[3];
	for (int i = 0; i < 3; i++)
		if (!dev || !(cc[i] = compcntr_create_comp_cntr(dev, &attr)))
			return fprintf(stderr, "setup: %s\n", compcntr_last_error_message()), 1;

	/* The fd of counter 2 goes into an epoll set before anything happens. */
	int fd, ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN };
	if (compcntr_comp_cntr_get_fd(cc[2], &fd) || ep < 0 ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev))
		return fprintf(stderr, "fd: %s\n", compcntr_last_error_message()), 1;

	pthread_t t;
	pthread_create(&t, NULL, network, cc);

	/* 1. Which of counters 0 and 1 reaches its threshold first? (5 s timeout) */
	const uint64_t thresholds[2] = { 1, 4 };
	size_t which = 0;
	int rc = compcntr_poll_comp_cntrs(cc, thresholds, 2, 5000, &which);
	printf("poll: %s, counter %zu\n", rc == 0 ? "ready" : "failed", which);

	/* 2. Block until counter 1 has 4 completions (here: already true, returns at once). */
	rc |= compcntr_wait_comp_cntr(cc[1], 4, 5000);

	/* 3. The epoll pattern: arm, check, and only then sleep in epoll_wait. */
	uint64_t v = 0;
	for (;;) {
		compcntr_comp_cntr_arm_fd(cc[2]);
		compcntr_read_comp_cntr(cc[2], &v);
		if (v >= 1 || epoll_wait(ep, &ev, 1, 5000) <= 0)
			break;
	}
	printf("epoll: counter 2 = %" PRIu64 "\n", v);

	pthread_join(t, NULL);
	close(ep);
	for (int i = 0; i < 3; i++)
		compcntr_destroy_comp_cntr(cc[i]); /* also closes counter 2's fd */
	compcntr_close_device(dev);
	return rc == 0 && which == 1 && v == 1 ? 0 : 1;
}
