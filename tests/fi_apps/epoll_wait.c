/* Blocking in epoll on a counter's wait fd (FI_WAIT_FD, fi_control(FI_GETWAIT)) with fi_trywait,
 * the pattern of event-loop applications (fi_poll(3), fi_trywait(3)): before blocking, the
 * application asks fi_trywait whether it may; 0 means "nothing is pending: block on the fd",
 * -FI_EAGAIN means "progress first: read the object again".
 *
 * The server opens its receive counter with FI_WAIT_FD and its CQ with FI_WAIT_FD, prints what
 * fi_cntr_open, fi_cq_open and FI_GETWAIT answer, and with nothing in flight what fi_trywait
 * answers on the counter alone and on the counter mixed with the CQ, and what epoll_wait(0)
 * sees. Then it receives NMSG messages one at a time: it tells the client (out of band) to send
 * the next one and waits in the fi_trywait/epoll_wait loop until the counter shows it. An
 * epoll_wait that reaches its APP_WAIT_MS timeout fails the run (the fd did not wake the
 * application although a message was on its way). Where a provider gives no fd, the server
 * prints the refusal and waits with fi_cntr_wait instead.
 *
 * Prints those results, the final counts, and the number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#include <sys/epoll.h>

#define NMSG 8
#define MSGSZ 32

int main(int argc, char **argv)
{
	struct app A, *a = &A;
	app_start(a, argc, argv);

	app_hints(a, FI_MSG);
	int ret = app_getinfo(a);
	if (ret)
		die(a, "fi_getinfo(%s, FI_EP_RDM, FI_MSG) = %s", a->prov, errstr(ret));
	app_open(a);

	struct fid_cntr *c;
	struct fid_cq *cq = NULL;
	int fd = -1, cqfd = -1, have_cq_fd = 0, fd_cntr = 0;
	if (a->role == ROLE_SERVER) {
		ret = app_cntr_try(a, FI_WAIT_FD, &c);
		out(a, "fi_cntr_open(FI_WAIT_FD) = %s", errname(ret));
		fd_cntr = ret == 0;
		if (ret) {
			c = app_cntr(a, FI_WAIT_UNSPEC, "receive counter, FI_WAIT_UNSPEC");
			out(a, "fi_control(counter, FI_GETWAIT): not called (the counter has no FD "
			       "wait object)");
		} else {
			ret = fi_control(&c->fid, FI_GETWAIT, &fd);
			out(a, "fi_control(counter, FI_GETWAIT) = %s%s", errname(ret),
			    ret       ? ""
			    : fd >= 0 ? "; an fd"
			              : "; a negative fd");
			if (ret || fd < 0)
				fd = -1;
		}
		struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA,
			                      .size = 256,
			                      .wait_obj = FI_WAIT_FD };
		ret = fi_cq_open(a->domain, &cq_attr, &cq, NULL);
		out(a, "fi_cq_open(FI_WAIT_FD) = %s", errname(ret));
		if (ret) {
			cq = app_cq(a, FI_WAIT_NONE);
			out(a, "fi_control(CQ, FI_GETWAIT): not called (the CQ has no FD wait "
			       "object)");
		} else {
			app_own(a, &cq->fid);
			a->pump_cq[a->npump_cq++] = cq;
			ret = fi_control(&cq->fid, FI_GETWAIT, &cqfd);
			out(a, "fi_control(CQ, FI_GETWAIT) = %s%s", errname(ret),
			    ret         ? ""
			    : cqfd >= 0 ? "; an fd"
			                : "; a negative fd");
			have_cq_fd = ret == 0 && cqfd >= 0;
		}
	} else {
		c = app_cntr(a, FI_WAIT_UNSPEC, "send counter");
		cq = app_cq(a, FI_WAIT_NONE);
	}
	app_endpoint(a);
	app_bind(a, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION,
	         "CQ, FI_SELECTIVE_COMPLETION");
	app_bind(a, &c->fid, a->role == ROLE_SERVER ? FI_RECV : FI_SEND, "counter");
	app_connect(a);

	struct app_buf buf;
	app_mr(a, &buf, NMSG * MSGSZ, FI_SEND | FI_RECV);
	struct fi_context ctx[NMSG];

	if (a->role == ROLE_SERVER) {
		for (int i = 0; i < NMSG; i++)
			POST(a, "receive",
			     fi_recv(a->ep, buf.p + i * MSGSZ, MSGSZ, buf.desc, a->peer, &ctx[i]));
		int epfd = -1;
		if (fd >= 0) {
			epfd = epoll_create1(EPOLL_CLOEXEC);
			struct epoll_event ev = { .events = EPOLLIN };
			if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev))
				die(a, "epoll on the counter's fd: %s", strerror(errno));
		}
		app_barrier(a); /* connected, receives posted, nothing sent */

		/* fi_trywait only on objects with an FD wait object: libfabric 1.17 calls a NULL
		 * function (SIGSEGV) for shm's FI_WAIT_UNSPEC counter */
		struct fid *fids[2] = { &c->fid, &cq->fid };
		if (fd_cntr) {
			ret = fi_trywait(a->fabric, fids, 1);
			out(a, "nothing sent: fi_trywait(counter) = %s", errname(ret));
		} else {
			out(a, "nothing sent: fi_trywait(counter): not called (no FD wait object)");
		}
		if (epfd >= 0) {
			struct epoll_event ev;
			out(a, "nothing sent: epoll_wait(counter fd, 0 ms) = %d",
			    epoll_wait(epfd, &ev, 1, 0));
		} else {
			out(a, "nothing sent: epoll_wait(counter fd, 0 ms): no fd");
		}
		if (fd_cntr && have_cq_fd) {
			ret = fi_trywait(a->fabric, fids, 2);
			out(a, "nothing sent: fi_trywait(counter, CQ) = %s", errname(ret));
		} else {
			out(a,
			    "nothing sent: fi_trywait(counter, CQ): not called (no FD wait object "
			    "on %s)",
			    fd_cntr ? "the CQ" : "the counter");
		}

		for (int i = 1; i <= NMSG; i++) {
			char go = 'g';
			oob_send(a, &go, 1);
			if (epfd < 0) {
				wait_cntr(a, c, (uint64_t)i, "receive counter");
				continue;
			}
			const int64_t deadline = now_ms() + APP_WAIT_MS;
			while (fi_cntr_read(c) < (uint64_t)i) {
				if (now_ms() > deadline)
					die(a, "message %d: counter still %llu after %d ms", i,
					    (unsigned long long)fi_cntr_read(c), APP_WAIT_MS);
				ret = fi_trywait(a->fabric, fids, 1);
				if (ret == -FI_EAGAIN)
					continue;
				if (ret)
					die(a, "message %d: fi_trywait(counter) = %s", i,
					    errstr(ret));
				struct epoll_event ev;
				int n = epoll_wait(epfd, &ev, 1, APP_WAIT_MS);
				if (n < 0 && errno != EINTR)
					die(a, "epoll_wait: %s", strerror(errno));
				if (n == 0) {
					die(a,
					    "message %d: epoll_wait on the counter's fd slept %d "
					    "ms with a message on its way (counter %llu)",
					    i, APP_WAIT_MS, (unsigned long long)fi_cntr_read(c));
				}
			}
		}
		size_t bad = 0;
		for (size_t i = 0; i < NMSG * MSGSZ; i++)
			bad += buf.p[i] != (char)(i ^ 0x5a);
		out(a,
		    "%d messages received %s; receive counter %llu (errors %llu); payload bytes "
		    "that differ: %zu",
		    NMSG, epfd >= 0 ? "through fi_trywait + epoll_wait" : "through fi_cntr_wait",
		    (unsigned long long)fi_cntr_read(c), (unsigned long long)fi_cntr_readerr(c),
		    bad);
		if (epfd >= 0)
			close(epfd);
	} else {
		for (size_t i = 0; i < NMSG * MSGSZ; i++)
			buf.p[i] = (char)(i ^ 0x5a);
		app_barrier(a);
		for (int i = 1; i <= NMSG; i++) {
			char go;
			/* progress our side while the server is not ready (acknowledgements) */
			const int64_t deadline = now_ms() + APP_WAIT_MS;
			for (;;) {
				struct pollfd pfd = { .fd = a->sock, .events = POLLIN };
				if (poll(&pfd, 1, 1) > 0)
					break;
				if (now_ms() > deadline)
					die(a, "server never asked for message %d", i);
				app_pump(a);
			}
			oob_recv(a, &go, 1);
			POST(a, "send",
			     fi_send(a->ep, buf.p + (i - 1) * MSGSZ, MSGSZ, buf.desc, a->peer,
			             &ctx[i - 1]));
			wait_cntr(a, c, (uint64_t)i, "send counter");
		}
		out(a, "%d messages sent; send counter %llu (errors %llu)", NMSG,
		    (unsigned long long)fi_cntr_read(c), (unsigned long long)fi_cntr_readerr(c));
	}
	app_barrier(a);
	app_finish(a, 0);
}
