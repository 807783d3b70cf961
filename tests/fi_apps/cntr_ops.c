/* What an application can do to a counter besides counting traffic, and the errors it gets:
 * the calls fi_cntr(3) and fi_endpoint(3) list, each result printed, so that the runner can
 * require the same answers with and without the hook.
 *
 * Server, on counters of its own (not bound to the traffic endpoint):
 *   values   fi_cntr_add, fi_cntr_set, fi_cntr_adderr, fi_cntr_seterr and what fi_cntr_read /
 *            fi_cntr_readerr then show (the value and the error count are separate);
 *   waits    fi_cntr_wait with timeout 0 at, below and above the value; after fi_cntr_adderr
 *            (util providers: -FI_EAVAIL only when the error count changes *during* the wait;
 *            sockets: -FI_EAVAIL for any error since the last fi_cntr_readerr, which clears
 *            it); on an FI_WAIT_NONE counter. Not on shm: its wait loop ignores the timeout
 *            (util_wait_yield_run), so a wait that is not satisfied at once never returns there;
 *   binds    on a second, never enabled endpoint: a first bind, the same bind again, a second
 *            counter for the same event, flags that are not counter events (FI_MSG);
 *   close    fi_close of a counter still bound (fi_endpoint(3): -FI_EBUSY) and that the counter
 *            is unchanged and still usable afterwards; then endpoint first, counters after.
 * Both, with traffic: the server posts a 16-byte receive and waits for the receive counter
 * with fi_cntr_wait while the client sends 64 bytes. A provider that counts the truncation as an
 * error (tcp;ofi_rxm, sockets) must end the wait with -FI_EAVAIL, the error count 1; one that
 * counts it as a success (udp;ofi_rxd) ends it with 0; shm counts neither (not tried, see above).
 * The server does not drive progress between posting the receive and entering the wait (the
 * handshake is a plain byte on the socketpair), so on a manual-progress provider the error
 * arrives during the wait.
 *
 * Prints those results and the number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#define SMALL 16
#define BIG 64
#define BUFSZ 256
/* How long the traffic wait may take before its verdict is taken: a loopback message arrives in
 * microseconds; 1.5 s is a verdict, not a race. */
#define PATIENCE_MS 1500

/* fi_cntr_open of a counter this program closes itself (not in the harness' close list). */
static struct fid_cntr *local_cntr(struct app *a, enum fi_wait_obj wait, const char *what)
{
	struct fi_cntr_attr attr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = wait };
	struct fid_cntr *c = NULL;
	a->cntr_opens++;
	int ret = fi_cntr_open(a->domain, &attr, &c, NULL);
	if (ret)
		die(a, "fi_cntr_open(%s) = %s", what, errstr(ret));
	return c;
}

static void show(struct app *a, struct fid_cntr *c, const char *after)
{
	out(a, "%s: value %llu, errors %llu", after, (unsigned long long)fi_cntr_read(c),
	    (unsigned long long)fi_cntr_readerr(c));
}

/* One call that returns 0 or an error, printed with the counter's state after it. */
#define OP(a, c, call)                                                                             \
	do {                                                                                       \
		int op_ret_ = (int)(call);                                                         \
		out((a), "%s = %s", #call, errname(op_ret_));                                      \
		show((a), (c), "  then");                                                          \
	} while (0)

static void local_part(struct app *a)
{
	const int shm = strcmp(a->prov, "shm") == 0;
	struct fid_cntr *c = local_cntr(a, FI_WAIT_UNSPEC, "counter C, FI_WAIT_UNSPEC");
	show(a, c, "new counter C");
	OP(a, c, fi_cntr_add(c, 5));
	OP(a, c, fi_cntr_set(c, 42));
	OP(a, c, fi_cntr_adderr(c, 2));
	OP(a, c, fi_cntr_seterr(c, 7));
	OP(a, c, fi_cntr_add(c, 0));
	OP(a, c, fi_cntr_set(c, 3));
	OP(a, c, fi_cntr_seterr(c, 0));

	/* waits, timeout 0 (a wait that cannot be satisfied returns at once) */
	OP(a, c, fi_cntr_wait(c, 3, 0));
	OP(a, c, fi_cntr_wait(c, 2, 0));
	if (!shm)
		OP(a, c, fi_cntr_wait(c, 4, 0));
	CHECK(a, fi_cntr_adderr(c, 1));
	out(a, "fi_cntr_adderr(c, 1) = 0 (the error count is not read before the next waits)");
	/* fi_cntr_readerr is not called here: on sockets it clears the error flag */
	{
		int r = fi_cntr_wait(c, 3, 0);
		out(a,
		    "fi_cntr_wait(c, 3, 0) = %s (threshold reached, an error since the last "
		    "readerr)",
		    errname(r));
		if (!shm) {
			r = fi_cntr_wait(c, 4, 0);
			out(a,
			    "fi_cntr_wait(c, 4, 0) = %s (threshold not reached, an error since the "
			    "last readerr)",
			    errname(r));
		}
	}
	show(a, c, "after the waits (fi_cntr_readerr now called)");
	OP(a, c, fi_cntr_wait(c, 3, 0));
	if (!shm)
		OP(a, c, fi_cntr_wait(c, 4, 0));

	struct fid_cntr *n = local_cntr(a, FI_WAIT_NONE, "counter N, FI_WAIT_NONE");
	if (!shm) {
		OP(a, n, fi_cntr_wait(n, 1, 0));
	} else {
		/* util's FI_WAIT_NONE counter has no wait function at all: this returns at once */
		OP(a, n, fi_cntr_wait(n, 1, 0));
	}
	OP(a, n, fi_cntr_wait(n, 0, 0));

	/* binds and close order on a second endpoint that is never enabled */
	struct fid_ep *ep2;
	CHECK(a, fi_endpoint(a->domain, a->info, &ep2, NULL));
	CHECK(a, fi_ep_bind(ep2, &a->av->fid, 0));
	struct fid_cntr *d = local_cntr(a, FI_WAIT_UNSPEC, "counter D, FI_WAIT_UNSPEC");
	out(a, "fi_ep_bind(ep2, C, FI_SEND) = %s", errname(fi_ep_bind(ep2, &c->fid, FI_SEND)));
	if (strcmp(a->prov, "sockets") != 0) {
		out(a, "fi_ep_bind(ep2, C, FI_SEND) again = %s",
		    errname(fi_ep_bind(ep2, &c->fid, FI_SEND)));
		out(a, "fi_ep_bind(ep2, D, FI_SEND) (a second counter for sends) = %s",
		    errname(fi_ep_bind(ep2, &d->fid, FI_SEND)));
	} else {
		/* measured on sockets 1.17: both return 0, and each leaves C with a reference that
		 * closing ep2 never drops (fi_close(C) is -FI_EBUSY for good, and so is the
		 * domain's close) */
		out(a, "fi_ep_bind(ep2, C or D, FI_SEND) again: not tried on sockets (it accepts "
		       "both and keeps C busy for good)");
	}
	out(a, "fi_ep_bind(ep2, D, FI_RECV | FI_MSG) (FI_MSG is no counter event) = %s",
	    errname(fi_ep_bind(ep2, &d->fid, FI_RECV | FI_MSG)));
	out(a, "fi_close(C) while bound to ep2 = %s", errname(fi_close(&c->fid)));
	/* C is not read while it is bound to ep2: reading a counter drives the progress of its
	 * endpoints, and libfabric 1.17's util providers crash driving one never enabled */
	out(a, "fi_close(ep2) = %s", errname(fi_close(&ep2->fid)));
	show(a, c, "C after its refused close and ep2's close");
	OP(a, c, fi_cntr_add(c, 1));
	out(a, "fi_close(D) = %s", errname(fi_close(&d->fid)));
	out(a, "fi_close(C) = %s", errname(fi_close(&c->fid)));
	out(a, "fi_close(N) = %s", errname(fi_close(&n->fid)));
}

int main(int argc, char **argv)
{
	struct app A, *a = &A;
	app_start(a, argc, argv);

	app_hints(a, FI_MSG);
	int ret = app_getinfo(a);
	if (ret)
		die(a, "fi_getinfo(%s, FI_EP_RDM, FI_MSG) = %s", a->prov, errstr(ret));
	app_open(a);
	struct fid_cq *cq = app_cq(a, FI_WAIT_NONE);
	struct fid_cntr *txc = app_cntr(a, FI_WAIT_UNSPEC, "send counter");
	struct fid_cntr *rxc = app_cntr(a, FI_WAIT_UNSPEC, "receive counter");
	app_endpoint(a);
	app_bind(a, &cq->fid, FI_TRANSMIT | FI_RECV, "CQ");
	app_bind(a, &txc->fid, FI_SEND, "send counter, FI_SEND");
	app_bind(a, &rxc->fid, FI_RECV, "receive counter, FI_RECV");
	app_connect(a);
	struct app_buf buf;
	app_mr(a, &buf, BUFSZ, FI_SEND | FI_RECV);
	struct fi_context ctx;

	if (a->role == ROLE_SERVER)
		local_part(a);
	app_barrier(a);

	const int shm = strcmp(a->prov, "shm") == 0;
	if (shm) {
		if (a->role == ROLE_SERVER)
			out(a,
			    "fi_cntr_wait during a truncated receive: not tried on shm (it counts "
			    "the truncation neither as an error nor as a success, and its wait "
			    "ignores the timeout)");
	} else if (a->role == ROLE_SERVER) {
		POST(a, "small receive", fi_recv(a->ep, buf.p, SMALL, buf.desc, a->peer, &ctx));
		oob_send(a, "p", 1); /* posted; no progress from here until the wait */
		const int64_t deadline = now_ms() + PATIENCE_MS;
		int r;
		/* sockets' timed wait returns +FI_ETIMEDOUT at once (fi_apps.h): retry until the
		 * verdict time, as wait_cntr does */
		while (((r = fi_cntr_wait(rxc, 1, 1000)) == -FI_ETIMEDOUT || r == FI_ETIMEDOUT) &&
		       now_ms() < deadline)
			sched_yield();
		out(a,
		    "fi_cntr_wait(receive counter, 1, 1000 ms) while a 64-byte message meets the "
		    "16-byte receive = %s",
		    errname(r));
		show(a, rxc, "receive counter");
		/* drain the completion (entry or error entry) so that nothing is left queued */
		struct fi_cq_data_entry e;
		ssize_t n;
		const int64_t cq_deadline = now_ms() + APP_WAIT_MS;
		while ((n = fi_cq_read(cq, &e, 1)) == -FI_EAGAIN && now_ms() < cq_deadline)
			;
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			n = fi_cq_readerr(cq, &err, 0);
			if (n != 1)
				die(a, "fi_cq_readerr = %s", errname((int)n));
			out(a, "receive completion: an error entry, err %s",
			    errname(-(err.err < 0 ? -err.err : err.err)));
		} else if (n == 1) {
			out(a, "receive completion: an entry, len %zu", e.len);
		} else {
			die(a, "receive completion: fi_cq_read = %s", errname((int)n));
		}
		app_barrier(a);
	} else {
		char p;
		oob_recv(a, &p, 1);
		memset(buf.p, 'x', BIG);
		POST(a, "send", fi_send(a->ep, buf.p, BIG, buf.desc, a->peer, &ctx));
		wait_cntr(a, txc, 1, "send counter");
		show(a, txc, "send counter");
		app_barrier(a);
		struct fi_cq_data_entry e;
		ssize_t n;
		const int64_t cq_deadline = now_ms() + APP_WAIT_MS;
		while ((n = fi_cq_read(cq, &e, 1)) == -FI_EAGAIN && now_ms() < cq_deadline)
			;
		if (n != 1)
			die(a, "send completion: fi_cq_read = %s", errname((int)n));
		out(a, "send completion: an entry");
	}
	app_barrier(a);
	app_finish(a, 0);
}
