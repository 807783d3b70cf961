/* An endpoint shut down under a waiter: FI_EP_MSG connected endpoints (fi_passive_ep,
 * fi_listen, fi_connect / fi_accept, an EQ with FI_CONNREQ, FI_CONNECTED and FI_SHUTDOWN), the
 * fabtests fi_msg pattern with a counter on the receiver.
 *
 * The server binds a receive counter (FI_RECV, FI_WAIT_UNSPEC) and a CQ to the endpoint it
 * accepts, posts NRECV receives before fi_accept, and starts a waiter thread that sits in
 * fi_cntr_wait(receive counter, NRECV, WAITER_MS): a threshold that is never reached. The client
 * sends NSENT < NRECV messages, waits for its send counter, and (once the server's own wait for
 * NSENT returned: out-of-band, so the count is final before the shutdown) calls fi_shutdown.
 * The server reads FI_SHUTDOWN from its EQ (fi_eq_sread) and closes its endpoint while the
 * waiter is still waiting; then it joins the waiter and prints what its wait returned, the
 * counter's value and error count, and what the CQ holds.
 *
 * Measured on libfabric 1.17 (without the hook):
 *  - tcp: the shutdown is seen as the socket's end (tcpx_ep_disable), which flushes the posted
 *    receives as CQ error entries (FI_ECANCELED, one per receive not matched) but counts no
 *    error on the counter (tcpx_cq_report_error writes only the CQ); the waiter's wait is
 *    -FI_ETIMEDOUT after WAITER_MS;
 *  - sockets: the posted receives are dropped with the endpoint, with no CQ entry and no counted
 *    error; its timed fi_cntr_wait returns +FI_ETIMEDOUT at once (its deadline is on the wrong
 *    clock), so the waiter calls it again until WAITER_MS have passed (a robust application's
 *    loop); the last call returns +FI_ETIMEDOUT or -FI_ETIMEDOUT (whether its own deadline has
 *    passed), both printed as -FI_ETIMEDOUT: a timed-out wait.
 * On both the counter reads NSENT with 0 errors after the close.
 *
 * FI_EP_MSG exists on tcp and sockets (not on tcp;ofi_rxm, udp;ofi_rxd or shm): elsewhere both
 * sides print "FI_EP_MSG not supported by <prov>" and stop (fi_getinfo = -FI_ENODATA).
 *
 * Usage: fi_app_shutdown -p <provider>   (tcp, sockets)
 */
#include "fi_apps.h"

#include <pthread.h>

#define NRECV 8
#define NSENT 3
#define MSGSZ 64
#define WAITER_MS 2000

static const char *evname(uint32_t ev)
{
	static char other[32];
	switch (ev) {
	case FI_NOTIFY:
		return "FI_NOTIFY";
	case FI_CONNREQ:
		return "FI_CONNREQ";
	case FI_CONNECTED:
		return "FI_CONNECTED";
	case FI_SHUTDOWN:
		return "FI_SHUTDOWN";
	case FI_MR_COMPLETE:
		return "FI_MR_COMPLETE";
	case FI_AV_COMPLETE:
		return "FI_AV_COMPLETE";
	case FI_JOIN_COMPLETE:
		return "FI_JOIN_COMPLETE";
	default:
		snprintf(other, sizeof other, "event %u", ev);
		return other;
	}
}

struct waiter {
	struct fid_cntr *c;
	int ret;
	int done; /* set (atomically) when its wait has returned */
};

/* The waiter thread, while it runs: a failure of the main thread joins it before the run ends
 * (its wait is bounded), so that app_finish never closes the counter under it. */
static pthread_t g_waiter;
static int g_waiter_running;

static void join_waiter(void)
{
	if (g_waiter_running) {
		pthread_join(g_waiter, NULL);
		g_waiter_running = 0;
	}
}

#define fail(a, ...)                                                                               \
	do {                                                                                       \
		join_waiter();                                                                     \
		die((a), __VA_ARGS__);                                                             \
	} while (0)

/* Removes f from the objects app_finish closes (the program closes it itself). */
static void app_disown(struct app *a, struct fid *f)
{
	for (int i = 0; i < a->nowned; i++)
		if (a->owned[i] == f) {
			memmove(&a->owned[i], &a->owned[i + 1],
			        (size_t)(a->nowned - i - 1) * sizeof a->owned[0]);
			a->nowned--;
			return;
		}
}

/* wait_cntr (fi_apps.h) with fail(): in slices of 1 s until APP_WAIT_MS have passed. */
static void wait_count(struct app *a, struct fid_cntr *c, uint64_t threshold, const char *what)
{
	const int64_t deadline = now_ms() + APP_WAIT_MS;
	int ret;
	while ((ret = fi_cntr_wait(c, threshold, 1000)) == -FI_ETIMEDOUT || ret == FI_ETIMEDOUT) {
		if (now_ms() > deadline)
			break;
		sched_yield();
	}
	if (ret)
		fail(a, "fi_cntr_wait(%s, %llu, %d) = %s (value %llu, errors %llu)", what,
		     (unsigned long long)threshold, APP_WAIT_MS, errstr(ret),
		     (unsigned long long)fi_cntr_read(c), (unsigned long long)fi_cntr_readerr(c));
}

/* The next EQ event, which must be `want`: fi_eq_sread in slices of 1 s until APP_WAIT_MS have
 * passed (-FI_EAGAIN is "nothing yet"); an error entry or another event ends the run. */
static struct fi_eq_cm_entry *eq_expect(struct app *a, struct fid_eq *eq, uint32_t want,
                                        struct fi_eq_cm_entry *entry, size_t len)
{
	const int64_t deadline = now_ms() + APP_WAIT_MS;
	uint32_t ev = 0;
	ssize_t ret;
	while ((ret = fi_eq_sread(eq, &ev, entry, len, 1000, 0)) == -FI_EAGAIN &&
	       now_ms() < deadline)
		;
	if (ret == -FI_EAVAIL) {
		struct fi_eq_err_entry err = { 0 };
		ssize_t r2 = fi_eq_readerr(eq, &err, 0);
		fail(a, "waiting for %s: fi_eq_sread = -FI_EAVAIL; fi_eq_readerr = %s, err %s",
		     evname(want), errname((int)r2), errname(-err.err));
	}
	if (ret < 0)
		fail(a, "waiting for %s: fi_eq_sread = %s", evname(want), errstr((int)ret));
	if (ev != want)
		fail(a, "waiting for %s: fi_eq_sread gave %s", evname(want), evname(ev));
	if ((size_t)ret < sizeof *entry)
		fail(a, "%s: fi_eq_sread = %zd bytes, less than an fi_eq_cm_entry", evname(want),
		     ret);
	return entry;
}

static struct fid_eq *open_eq(struct app *a)
{
	struct fi_eq_attr attr = { .size = 16, .wait_obj = FI_WAIT_UNSPEC };
	struct fid_eq *eq;
	CHECK(a, fi_eq_open(a->fabric, &attr, &eq, NULL));
	app_own(a, &eq->fid);
	return eq;
}

/* The waiter: fi_cntr_wait(c, NRECV, WAITER_MS); a +FI_ETIMEDOUT that comes early (sockets'
 * clock) is waited again for the time left. */
static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	const int64_t deadline = now_ms() + WAITER_MS;
	int64_t left = WAITER_MS;
	for (;;) {
		w->ret = fi_cntr_wait(w->c, NRECV, (int)left);
		if (w->ret != FI_ETIMEDOUT && w->ret != -FI_ETIMEDOUT)
			break;
		left = deadline - now_ms();
		if (left <= 0)
			break;
		sched_yield(); /* sockets returns at once: let its progress thread run */
	}
	if (w->ret == FI_ETIMEDOUT) /* sockets' early one, waited again: the same timed-out wait */
		w->ret = -FI_ETIMEDOUT;
	__atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

/* What a CQ holds: completions, and error entries with their err values (each named once, in
 * the order first seen). */
static void show_cq(struct app *a, struct fid_cq *cq, const char *when)
{
	int ok = 0, errs = 0, nerr = 0, seen[8];
	for (;;) {
		struct fi_cq_data_entry e[4];
		ssize_t n = fi_cq_read(cq, e, 4);
		if (n > 0) {
			ok += (int)n;
			continue;
		}
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry ee = { 0 };
			ssize_t r = fi_cq_readerr(cq, &ee, 0);
			if (r != 1)
				fail(a, "fi_cq_read = -FI_EAVAIL, then fi_cq_readerr = %s",
				     errstr((int)r));
			int k = 0;
			while (k < nerr && seen[k] != ee.err)
				k++;
			if (k == nerr && nerr < 8)
				seen[nerr++] = ee.err;
			errs++;
			continue;
		}
		if (n != -FI_EAGAIN)
			fail(a, "fi_cq_read = %s", errstr((int)n));
		break;
	}
	char names[256] = "";
	size_t len = 0;
	for (int k = 0; k < nerr; k++)
		len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", k ? ", " : "",
		                        errname(-seen[k]));
	if (errs)
		out(a, "%s: CQ holds %d completions and %d error entries (err %s)", when, ok, errs,
		    names);
	else
		out(a, "%s: CQ holds %d completions and no error entry", when, ok);
}

static void bind_all(struct app *a, struct fid_ep *ep, struct fid_eq *eq, struct fid_cq *cq,
                     struct fid_cntr *c, uint64_t cflags)
{
	int ret;
	if ((ret = fi_ep_bind(ep, &eq->fid, 0)))
		die(a, "fi_ep_bind(ep, EQ) = %s", errstr(ret));
	if ((ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)))
		die(a, "fi_ep_bind(ep, CQ) = %s", errstr(ret));
	if ((ret = fi_ep_bind(ep, &c->fid, cflags)))
		die(a, "fi_ep_bind(ep, counter) = %s", errstr(ret));
}

static void server(struct app *a)
{
	struct fid_eq *eq = open_eq(a);
	struct fid_pep *pep;
	CHECK(a, fi_passive_ep(a->fabric, a->info, &pep, NULL));
	app_own(a, &pep->fid);
	CHECK(a, fi_pep_bind(pep, &eq->fid, 0));
	CHECK(a, fi_listen(pep));
	char name[256];
	size_t len = sizeof name;
	CHECK(a, fi_getname(&pep->fid, name, &len));
	oob_send_u64(a, len);
	oob_send(a, name, len);

	struct fi_eq_cm_entry req;
	eq_expect(a, eq, FI_CONNREQ, &req, sizeof req);
	struct fi_info *ci = req.info;
	fi_freeinfo(a->info); /* the listener's; app_finish frees the connection's */
	a->info = ci;
	CHECK(a, fi_domain(a->fabric, ci, &a->domain, NULL));
	app_own(a, &a->domain->fid);
	struct fid_cntr *rxc = app_cntr(a, FI_WAIT_UNSPEC, "receive counter");
	struct fid_cq *cq = app_cq(a, FI_WAIT_NONE);
	struct fid_ep *ep;
	CHECK(a, fi_endpoint(a->domain, ci, &ep, NULL));
	app_own(a, &ep->fid); /* until the program closes it below */
	bind_all(a, ep, eq, cq, rxc, FI_RECV);
	CHECK(a, fi_enable(ep));
	struct app_buf rx;
	app_mr(a, &rx, NRECV * MSGSZ, FI_RECV);
	struct fi_context ctx[NRECV];
	a->ep = ep; /* app_pump drives it through the counter and the CQ */
	for (int i = 0; i < NRECV; i++)
		POST(a, "receive",
		     fi_recv(ep, rx.p + i * MSGSZ, MSGSZ, rx.desc, FI_ADDR_UNSPEC, &ctx[i]));
	CHECK(a, fi_accept(ep, NULL, 0));
	struct fi_eq_cm_entry ev;
	eq_expect(a, eq, FI_CONNECTED, &ev, sizeof ev);
	out(a, "EQ: FI_CONNREQ, then FI_CONNECTED%s; %d receives posted",
	    ev.fid == &ep->fid ? " on the accepted endpoint" : " on another fid", NRECV);

	struct waiter w = { .c = rxc, .ret = 1, .done = 0 };
	if (pthread_create(&g_waiter, NULL, waiter_main, &w))
		die(a, "pthread_create failed");
	g_waiter_running = 1;
	wait_count(a, rxc, NSENT, "receive counter");
	size_t bad = 0;
	for (int i = 0; i < NSENT; i++)
		for (int j = 0; j < MSGSZ; j++)
			bad += rx.p[i * MSGSZ + j] != (char)(i * 31 + j);
	out(a, "%d messages received; payload bytes that differ: %zu", NSENT, bad);
	oob_send_u64(a, 1); /* the client may shut down now: the count is final */

	struct fi_eq_cm_entry sd;
	eq_expect(a, eq, FI_SHUTDOWN, &sd, sizeof sd);
	out(a, "EQ: FI_SHUTDOWN%s", sd.fid == &ep->fid ? " on the endpoint" : " on another fid");
	a->ep = NULL;
	app_disown(a, &ep->fid);
	const int waiting = !__atomic_load_n(&w.done, __ATOMIC_SEQ_CST);
	int ret = fi_close(&ep->fid); /* the waiter is still in fi_cntr_wait */
	out(a, "fi_close(endpoint) = %s; the waiter was %s", errname(ret),
	    waiting ? "still waiting" : "no longer waiting");
	join_waiter();
	out(a, "waiter: fi_cntr_wait(receive counter, %d, %d ms) = %s", NRECV, WAITER_MS,
	    errname(w.ret));
	out(a, "after the close: receive counter %llu, errors %llu",
	    (unsigned long long)fi_cntr_read(rxc), (unsigned long long)fi_cntr_readerr(rxc));
	show_cq(a, cq, "after the close");
	ret = fi_cntr_wait(rxc, NSENT, 0);
	out(a, "fi_cntr_wait(receive counter, %d, 0 ms) = %s", NSENT, errname(ret));
	oob_send_u64(a, 2); /* the client may close */
	app_finish(a, 0);
}

static void client(struct app *a)
{
	struct fid_eq *eq = open_eq(a);
	CHECK(a, fi_domain(a->fabric, a->info, &a->domain, NULL));
	app_own(a, &a->domain->fid);
	struct fid_cntr *txc = app_cntr(a, FI_WAIT_UNSPEC, "send counter");
	struct fid_cq *cq = app_cq(a, FI_WAIT_NONE);
	char name[256];
	uint64_t len = oob_recv_u64(a);
	if (len > sizeof name)
		die(a, "server name of %llu bytes", (unsigned long long)len);
	oob_recv(a, name, (size_t)len);
	CHECK(a, fi_endpoint(a->domain, a->info, &a->ep, NULL));
	app_own(a, &a->ep->fid);
	bind_all(a, a->ep, eq, cq, txc, FI_SEND);
	CHECK(a, fi_enable(a->ep));
	CHECK(a, fi_connect(a->ep, name, NULL, 0));
	struct fi_eq_cm_entry ev;
	eq_expect(a, eq, FI_CONNECTED, &ev, sizeof ev);
	out(a, "EQ: FI_CONNECTED%s",
	    ev.fid == &a->ep->fid ? " on the endpoint" : " on another fid");

	struct app_buf tx;
	app_mr(a, &tx, NSENT * MSGSZ, FI_SEND);
	struct fi_context ctx[NSENT];
	for (int i = 0; i < NSENT; i++) {
		for (int j = 0; j < MSGSZ; j++)
			tx.p[i * MSGSZ + j] = (char)(i * 31 + j);
		POST(a, "send", fi_send(a->ep, tx.p + i * MSGSZ, MSGSZ, tx.desc, 0, &ctx[i]));
	}
	wait_cntr(a, txc, NSENT, "send counter");
	out(a, "%d messages sent; send counter %llu (errors %llu)", NSENT,
	    (unsigned long long)fi_cntr_read(txc), (unsigned long long)fi_cntr_readerr(txc));
	show_cq(a, cq, "after the sends");
	if (oob_recv_u64(a) != 1)
		die(a, "out-of-band: unexpected step");
	int ret = fi_shutdown(a->ep, 0);
	out(a, "fi_shutdown(endpoint) = %s", errname(ret));
	if (oob_recv_u64(a) != 2)
		die(a, "out-of-band: unexpected step");
	app_finish(a, 0);
}

int main(int argc, char **argv)
{
	struct app A, *a = &A;
	app_start(a, argc, argv);

	app_hints(a, FI_MSG);
	a->hints->ep_attr->type = FI_EP_MSG;
	a->hints->domain_attr->threading = FI_THREAD_SAFE; /* the waiter thread */
	int ret = app_getinfo(a);
	if (ret == -FI_ENODATA) {
		out(a, "FI_EP_MSG not supported by %s (fi_getinfo = %s)", a->prov, errname(ret));
		app_finish(a, 0);
	}
	if (ret)
		die(a, "fi_getinfo(%s, FI_EP_MSG, FI_MSG) = %s", a->prov, errstr(ret));
	CHECK(a, fi_fabric(a->info->fabric_attr, &a->fabric, NULL));
	app_own(a, &a->fabric->fid);
	if (a->role == ROLE_SERVER)
		server(a);
	else
		client(a);
	return 0;
}
