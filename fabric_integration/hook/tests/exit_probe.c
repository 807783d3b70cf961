/* An ordinary libfabric program (libfabric's headers and library only) for the hook's exit test:
 * hook_exit_probe PROVIDER TRIALS runs TRIALS child processes. Each child opens an RDM endpoint
 * with a counter and a CQ, sends messages to itself in a loop (every fi_cq_read runs the
 * provider's progress under the endpoint's lock, and the counter keeps changing, so a progress
 * thread is busy on that lock too), and is then interrupted by a signal whose handler calls
 * exit(0) -- what fabtests' SIGTERM handler does. exit() then runs with the main thread holding
 * a provider lock at some point of the loop.
 *
 * Each child must end by itself with status 0 within 10 s; a child still alive then is an exit
 * deadlock (the hook's progress thread joined from an exit handler while it waits for the lock
 * the exiting thread holds) and is killed. Exit status 0 when every child exited, 1 otherwise.
 * The children's stdout/stderr are the probe's. */
#define _GNU_SOURCE /* strdup, pthread_kill */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                                                \
	do {                                                                                       \
		int r_ = (int)(call);                                                              \
		if (r_) {                                                                          \
			fprintf(stderr, "%s: %s\n", #call, fi_strerror(-r_));                      \
			_exit(3);                                                                  \
		}                                                                                  \
	} while (0)

static atomic_ulong rounds;
static pthread_t main_thread;

static void on_signal(int sig)
{
	(void)sig;
	exit(0); /* as fabtests does: not async-signal-safe, and that is the point */
}

/* Interrupts the main thread once its loop has run `arg` rounds (no sleeping: it yields). */
static void *interrupter(void *arg)
{
	unsigned long after = (unsigned long)(size_t)arg;
	while (atomic_load(&rounds) < after)
		sched_yield();
	pthread_kill(main_thread, SIGUSR1);
	return NULL;
}

static void child(const char *prov, unsigned long after)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->mode = FI_CONTEXT;
	hints->domain_attr->mr_mode =
	        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup(prov);
	int ip = strcmp(prov, "shm") != 0;
	CHECK(fi_getinfo(FI_VERSION(1, 17), ip ? "127.0.0.1" : NULL, NULL, ip ? FI_SOURCE : 0,
	                 hints, &info));
	fi_freeinfo(hints);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_cntr *cntr;
	struct fid_mr *mr;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fi_cntr_attr na = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };
	static char buf[2][64];
	struct fi_context ctx[2];
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	CHECK(fi_av_open(domain, &aa, &av, NULL));
	CHECK(fi_cq_open(domain, &ca, &cq, NULL));
	CHECK(fi_cntr_open(domain, &na, &cntr, NULL));
	CHECK(fi_endpoint(domain, info, &ep, NULL));
	CHECK(fi_ep_bind(ep, &av->fid, 0));
	CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(ep, &cntr->fid, FI_SEND | FI_RECV));
	CHECK(fi_enable(ep));
	CHECK(fi_mr_reg(domain, buf, sizeof buf, FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL));
	void *desc = fi_mr_desc(mr);
	char name[256];
	size_t len = sizeof name;
	CHECK(fi_getname(&ep->fid, name, &len));
	fi_addr_t self = FI_ADDR_UNSPEC;
	if (fi_av_insert(av, name, 1, &self, 0, NULL) != 1) {
		fprintf(stderr, "fi_av_insert of the endpoint's own address failed\n");
		_exit(3);
	}
	signal(SIGUSR1, on_signal);
	main_thread = pthread_self();
	pthread_t t;
	if (pthread_create(&t, NULL, interrupter, (void *)(size_t)after) != 0)
		_exit(3);
	for (;;) { /* until the signal: messages to itself */
		ssize_t r;
		while ((r = fi_recv(ep, buf[1], 64, desc, FI_ADDR_UNSPEC, &ctx[1])) == -FI_EAGAIN)
			fi_cq_read(cq, NULL, 0);
		CHECK(r);
		while ((r = fi_send(ep, buf[0], 64, desc, self, &ctx[0])) == -FI_EAGAIN)
			fi_cq_read(cq, NULL, 0);
		CHECK(r);
		for (int got = 0; got < 2;) {
			struct fi_cq_entry e[2];
			r = fi_cq_read(cq, e, 2);
			if (r > 0)
				got += (int)r;
			else if (r != -FI_EAGAIN)
				CHECK(r);
		}
		atomic_fetch_add(&rounds, 1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return fprintf(stderr, "usage: %s PROVIDER TRIALS\n", argv[0]), 2;
	int trials = atoi(argv[2]), failed = 0;
	for (int i = 0; i < trials; ++i) {
		int fds[2];
		if (pipe(fds) != 0)
			return perror("pipe"), 2;
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0)
			return perror("fork"), 2;
		if (pid == 0) {
			close(fds[0]); /* fds[1] stays open until this process is gone */
			child(argv[1],
			      50 + 37UL * (unsigned long)i); /* different points of the loop */
		}
		close(fds[1]);
		struct pollfd p = { .fd = fds[0], .events = POLLIN };
		int r = poll(&p, 1, 10000); /* POLLHUP when the child has ended */
		close(fds[0]);
		int status = 0;
		if (r == 0) {
			fprintf(stderr,
			        "trial %d (%s): the process did not exit within 10 s after exit() "
			        "was "
			        "called in a signal handler (exit deadlock); killed\n",
			        i, argv[1]);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			++failed;
			continue;
		}
		waitpid(pid, &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "trial %d (%s): exit status %d (signal %d)\n", i, argv[1],
			        WIFEXITED(status) ? WEXITSTATUS(status) : -1,
			        WIFSIGNALED(status) ? WTERMSIG(status) : 0);
			++failed;
		}
	}
	printf("%s: %d of %d processes exited from a signal handler\n", argv[1], trials - failed,
	       trials);
	return failed ? 1 : 0;
}
