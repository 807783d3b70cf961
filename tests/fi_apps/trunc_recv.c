/* A receive too small for the message: the error path. The server posts a SMALL-byte receive
 * (inside a larger buffer whose other bytes are a guard pattern) and the client sends BIG bytes.
 * fi_cq(3) says the receive completes in error with FI_ETRUNC (olen = the bytes that did not fit)
 * and fi_cntr(3) that a failed operation increments the error count of the counter bound to it.
 * What each provider really does is printed: the CQ result (fi_cq_readerr fields), the receive
 * counter's value and error count, and how many guard bytes changed. Then a second message
 * with a big enough receive shows whether the endpoint still works and the value counts again
 * (on tcp;ofi_rxm it does not: see PATIENCE_MS).
 * The client prints its own CQ result and send counter for both messages.
 *
 * Prints those results and the number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#define SMALL 16
#define BIG 64
#define BUFSZ 256
#define GUARD ((char)0xEE)
#define OFF2 128
/* How long the second receive may take before it counts as never completing. libfabric 1.17's
 * tcp provider (under ofi_rxm) stops receiving on a connection after a truncation ("dynamically
 * provided rbuf is too small"): the second message never arrives there. A loopback message takes
 * well under a millisecond; 1.5 s is a verdict, not a race. */
#define PATIENCE_MS 1500

/* Reads the CQ until it yields one entry or one error entry; prints it. With `patience_ms`
 * > 0, a completion that does not come within that time is printed instead of failing. */
static void one_completion(struct app *a, struct fid_cq *cq, const char *what, int patience_ms)
{
	const int64_t deadline = now_ms() + (patience_ms > 0 ? patience_ms : APP_WAIT_MS);
	struct fi_cq_data_entry e;
	ssize_t r;
	while ((r = fi_cq_read(cq, &e, 1)) == -FI_EAGAIN)
		if (now_ms() > deadline) {
			if (patience_ms > 0) {
				out(a,
				    "%s: no completion (the endpoint does not receive from this "
				    "peer any more)",
				    what);
				return;
			}
			die(a, "%s: no completion within %d ms", what, APP_WAIT_MS);
		}
	if (r == 1) {
		out(a, "%s: completed without error: len %zu, flags %s", what, e.len,
		    flagstr(e.flags));
		return;
	}
	if (r != -FI_EAVAIL)
		die(a, "%s: fi_cq_read = %s", what, errstr((int)r));
	struct fi_cq_err_entry err = { 0 };
	r = fi_cq_readerr(cq, &err, 0);
	if (r != 1)
		die(a, "%s: fi_cq_readerr = %s", what, errstr((int)r));
	/* err is printed as the number it is: fi_cq(3) says positive, shm 1.17 stores it negated */
	out(a,
	    "%s: fi_cq_read = -FI_EAVAIL; fi_cq_readerr: err %d (%s), olen %zu, len %zu, flags %s",
	    what, err.err, fi_strerror(err.err < 0 ? -err.err : err.err), err.olen, err.len,
	    flagstr(err.flags));
}

static void counters(struct app *a, struct fid_cntr *c, const char *what)
{
	out(a, "%s: value %llu, errors %llu", what, (unsigned long long)fi_cntr_read(c),
	    (unsigned long long)fi_cntr_readerr(c));
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
	struct fi_context ctx[2];

	if (a->role == ROLE_SERVER) {
		memset(buf.p, GUARD, BUFSZ);
		POST(a, "small receive", fi_recv(a->ep, buf.p, SMALL, buf.desc, a->peer, &ctx[0]));
		app_barrier(a); /* posted: the client sends */
		one_completion(a, cq, "receive of 16 bytes for a 64-byte message", 0);
		counters(a, rxc, "receive counter after the truncated message");
		size_t changed = 0, first = 0;
		for (size_t i = 0; i < SMALL; i++)
			first += buf.p[i] != (char)(i + 1);
		for (size_t i = SMALL; i < BUFSZ; i++)
			changed += buf.p[i] != GUARD;
		out(a,
		    "posted bytes that differ from the message: %zu; bytes beyond the posted %d "
		    "that changed: %zu",
		    first, SMALL, changed);
		app_barrier(a); /* round 1 done on both sides */

		POST(a, "big receive",
		     fi_recv(a->ep, buf.p + OFF2, BIG, buf.desc, a->peer, &ctx[1]));
		app_barrier(a);
		one_completion(a, cq, "receive of 64 bytes for a 64-byte message", PATIENCE_MS);
		counters(a, rxc, "receive counter after the second message");
		size_t bad = 0;
		for (size_t i = 0; i < BIG; i++)
			bad += buf.p[OFF2 + i] != (char)(i + 101);
		out(a, "second message: bytes that differ: %zu", bad);
		app_barrier(a);
		counters(a, txc, "send counter");
	} else {
		for (size_t i = 0; i < BIG; i++)
			buf.p[i] = (char)(i + 1);
		for (size_t i = 0; i < BIG; i++)
			buf.p[OFF2 + i] = (char)(i + 101);
		app_barrier(a);
		POST(a, "send", fi_send(a->ep, buf.p, BIG, buf.desc, a->peer, &ctx[0]));
		one_completion(a, cq, "send of 64 bytes into a 16-byte receive", 0);
		counters(a, txc, "send counter after the first message");
		app_barrier(a);

		app_barrier(a);
		POST(a, "send", fi_send(a->ep, buf.p + OFF2, BIG, buf.desc, a->peer, &ctx[1]));
		one_completion(a, cq, "send of 64 bytes into a 64-byte receive", 0);
		counters(a, txc, "send counter after the second message");
		app_barrier(a);
		counters(a, rxc, "receive counter");
	}
	app_barrier(a);
	app_finish(a, 0);
}
