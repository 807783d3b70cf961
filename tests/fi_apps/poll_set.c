/* Counters in a poll set (fi_poll(3)), the fabtests fi_poll -t counter pattern: each process
 * opens a poll set, adds its send and receive counters (fi_poll_add), and learns about
 * completions only from fi_poll: it reads a counter only after fi_poll has returned that
 * counter's context. fi_poll(3): a counter is returned when its value (or error count) has
 * changed since it was last returned, so an application that reads the counter after the event
 * must see the change; one that never sees enough events waits forever (here: until the
 * per-wait timeout, then FAILED).
 *
 * The server posts N receives, the client sends N messages; the server loops on fi_poll until
 * its receive counter, read after receive-counter events, shows N; the client does the same for
 * its send counter. Before any traffic, fi_poll must return 0 (nothing has changed). The CQ
 * entries (the counters' operations also write them) are drained at the end.
 *
 * Prints those results and the number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#define N 16
#define MSG 64

static int tx_tag, rx_tag; /* the counters' contexts, as fi_poll returns them */

static struct fid_cntr *tagged_cntr(struct app *a, void *context, const char *what)
{
	struct fi_cntr_attr attr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };
	struct fid_cntr *c = NULL;
	a->cntr_opens++;
	int ret = fi_cntr_open(a->domain, &attr, &c, context);
	if (ret)
		die(a, "fi_cntr_open(%s) = %s", what, errstr(ret));
	app_own(a, &c->fid);
	/* not registered for app_pump: this program drives progress only through fi_poll */
	return c;
}

/* fi_poll until the counter with context `tag`, read after each of its events, shows `n`. */
static void poll_until(struct app *a, struct fid_poll *ps, struct fid_cntr *c, void *tag,
                       uint64_t n, const char *what)
{
	const int64_t deadline = now_ms() + APP_WAIT_MS;
	uint64_t seen = 0;
	int events = 0, others = 0;
	while (seen < n) {
		void *ctx[4];
		int r = fi_poll(ps, ctx, 4);
		if (r < 0)
			die(a, "fi_poll = %s", errstr(r));
		for (int i = 0; i < r; i++) {
			if (ctx[i] == tag) {
				events++;
				seen = fi_cntr_read(c);
			} else if (ctx[i] == &tx_tag || ctx[i] == &rx_tag) {
				others++;
			} else {
				die(a, "fi_poll returned an unknown context");
			}
		}
		if (seen < n && now_ms() > deadline)
			die(a,
			    "%s: fi_poll returned %d event(s) for it in %d ms, and the counter "
			    "read "
			    "after the last showed %llu of %llu (fi_cntr_read now %llu)",
			    what, events, APP_WAIT_MS, (unsigned long long)seen,
			    (unsigned long long)n, (unsigned long long)fi_cntr_read(c));
	}
	if (seen != n)
		die(a, "%s: %llu after the events, more than the %llu operations", what,
		    (unsigned long long)seen, (unsigned long long)n);
	out(a, "%s: %llu, read after fi_poll events only (at least one event: %s)", what,
	    (unsigned long long)seen, events > 0 ? "yes" : "no");
}

static void drain(struct app *a, struct fid_cq *cq, int n, const char *what)
{
	const int64_t deadline = now_ms() + APP_WAIT_MS;
	int got = 0;
	while (got < n) {
		struct fi_cq_data_entry e[N];
		ssize_t r = fi_cq_read(cq, e, (size_t)(n - got));
		if (r > 0)
			got += (int)r;
		else if (r != -FI_EAGAIN)
			die(a, "%s: fi_cq_read = %s", what, errstr((int)r));
		else if (now_ms() > deadline)
			die(a, "%s: %d of %d CQ entries within %d ms", what, got, n, APP_WAIT_MS);
	}
	out(a, "%s: %d CQ entries", what, got);
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
	struct fid_cntr *txc = tagged_cntr(a, &tx_tag, "send counter");
	struct fid_cntr *rxc = tagged_cntr(a, &rx_tag, "receive counter");
	struct fi_poll_attr pattr = { 0 };
	struct fid_poll *ps;
	CHECK(a, fi_poll_open(a->domain, &pattr, &ps));
	app_own(a, &ps->fid);
	CHECK(a, fi_poll_add(ps, &txc->fid, 0));
	CHECK(a, fi_poll_add(ps, &rxc->fid, 0));
	app_endpoint(a);
	app_bind(a, &cq->fid, FI_TRANSMIT | FI_RECV, "CQ");
	app_bind(a, &txc->fid, FI_SEND, "send counter, FI_SEND");
	app_bind(a, &rxc->fid, FI_RECV, "receive counter, FI_RECV");
	app_connect(a);
	struct app_buf buf;
	app_mr(a, &buf, (size_t)N * MSG, FI_SEND | FI_RECV);
	struct fi_context ctx[N];

	{
		void *c[4];
		int r = fi_poll(ps, c, 4);
		out(a, "fi_poll before any traffic = %s", errname(r));
	}
	if (a->role == ROLE_SERVER) {
		for (int i = 0; i < N; i++)
			POST(a, "receive",
			     fi_recv(a->ep, buf.p + i * MSG, MSG, buf.desc, a->peer, &ctx[i]));
		oob_send(a, "p", 1);
		poll_until(a, ps, rxc, &rx_tag, N, "receive counter");
		size_t bad = 0;
		for (int i = 0; i < N * MSG; i++)
			bad += buf.p[i] != (char)(i / MSG + 1);
		out(a, "payload bytes that differ: %zu", bad);
		drain(a, cq, N, "receives");
	} else {
		char p;
		oob_recv(a, &p, 1);
		for (int i = 0; i < N * MSG; i++)
			buf.p[i] = (char)(i / MSG + 1);
		for (int i = 0; i < N; i++) {
			/* -FI_EAGAIN: progress through fi_poll only, as the rest of the program */
			const int64_t deadline = now_ms() + APP_WAIT_MS;
			ssize_t r;
			while ((r = fi_send(a->ep, buf.p + i * MSG, MSG, buf.desc, a->peer,
			                    &ctx[i])) == -FI_EAGAIN &&
			       now_ms() < deadline) {
				void *c[4];
				(void)fi_poll(ps, c, 4);
			}
			if (r)
				die(a, "fi_send(message %d) = %s", i + 1, errstr((int)r));
		}
		poll_until(a, ps, txc, &tx_tag, N, "send counter");
		drain(a, cq, N, "sends");
	}
	app_barrier(a);
	out(a, "counters at the end: send %llu, receive %llu (errors %llu, %llu)",
	    (unsigned long long)fi_cntr_read(txc), (unsigned long long)fi_cntr_read(rxc),
	    (unsigned long long)fi_cntr_readerr(txc), (unsigned long long)fi_cntr_readerr(rxc));
	CHECK(a, fi_poll_del(ps, &txc->fid, 0));
	CHECK(a, fi_poll_del(ps, &rxc->fid, 0));
	app_finish(a, 0);
}
