/* Counter ping-pong (the fi_rdm_cntr_pingpong pattern): no completion queue at all; each side
 * binds a send counter and a receive counter (FI_WAIT_UNSPEC) to its RDM endpoint and learns
 * that its operations finished only from fi_cntr_wait on them. The client sends a ping and waits
 * for the pong; the server waits for the ping and answers. Four message sizes, ITERS round trips
 * each, every payload checked. Then fi_cntr_wait for one more message than was sent must time
 * out (-FI_ETIMEDOUT) and leave the values alone, and fi_cntr_wait on an already reached
 * threshold returns 0 at once.
 *
 * (A CQ is bound with FI_SELECTIVE_COMPLETION, as fabtests does, because the providers refuse
 * to enable an endpoint without one; no operation asks for an entry, and the program checks at
 * the end that none was written.)
 *
 * Prints per size the cumulative counter values, the payload check, the wait results and the
 * number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#define ITERS 20
static const size_t sizes[] = { 1, 64, 4096, 32768 };
#define MAXSZ 32768

static void fill(char *p, size_t len, int who, size_t size, int iter)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (char)(who * 131 + size * 7 + iter * 17 + i);
}

static size_t mismatches(const char *p, size_t len, int who, size_t size, int iter)
{
	size_t bad = 0;
	for (size_t i = 0; i < len; i++)
		bad += p[i] != (char)(who * 131 + size * 7 + iter * 17 + i);
	return bad;
}

int main(int argc, char **argv)
{
	struct app A, *a = &A;
	app_start(a, argc, argv);

	app_hints(a, FI_MSG);
	a->hints->domain_attr->threading = FI_THREAD_DOMAIN;
	int ret = app_getinfo(a);
	if (ret)
		die(a, "fi_getinfo(%s, FI_EP_RDM, FI_MSG) = %s", a->prov, errstr(ret));
	app_open(a);
	struct fid_cntr *txc = app_cntr(a, FI_WAIT_UNSPEC, "send counter");
	struct fid_cntr *rxc = app_cntr(a, FI_WAIT_UNSPEC, "receive counter");
	/* the providers need a CQ on an enabled endpoint (-FI_ENOCQ otherwise); as fabtests does,
	 * bind one with FI_SELECTIVE_COMPLETION: no operation here asks for an entry */
	struct fid_cq *cq = app_cq(a, FI_WAIT_NONE);
	app_endpoint(a);
	app_bind(a, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION, "CQ, selective");
	app_bind(a, &txc->fid, FI_SEND, "send counter, FI_SEND");
	app_bind(a, &rxc->fid, FI_RECV, "receive counter, FI_RECV");
	app_connect(a);

	struct app_buf tx, rx;
	app_mr(a, &tx, MAXSZ, FI_SEND);
	app_mr(a, &rx, MAXSZ, FI_RECV);
	struct fi_context tctx, rctx;
	const int me = a->role, peer = !a->role;
	uint64_t sent = 0, received = 0;
	size_t bad = 0;

	/* the server's first receive is posted before the client may send */
	if (a->role == ROLE_SERVER)
		POST(a, "first receive", fi_recv(a->ep, rx.p, MAXSZ, rx.desc, a->peer, &rctx));
	app_barrier(a);

	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
		const size_t size = sizes[s];
		for (int i = 0; i < ITERS; i++) {
			if (a->role == ROLE_CLIENT) {
				POST(a, "receive",
				     fi_recv(a->ep, rx.p, MAXSZ, rx.desc, a->peer, &rctx));
				fill(tx.p, size, me, size, i);
				POST(a, "ping",
				     fi_send(a->ep, tx.p, size, tx.desc, a->peer, &tctx));
				wait_cntr(a, txc, ++sent, "send counter");
				wait_cntr(a, rxc, ++received, "receive counter");
				bad += mismatches(rx.p, size, peer, size, i);
			} else {
				wait_cntr(a, rxc, ++received, "receive counter");
				bad += mismatches(rx.p, size, peer, size, i);
				/* the next ping may come as soon as the pong is out: repost first */
				const int last =
				        s + 1 == sizeof sizes / sizeof sizes[0] && i + 1 == ITERS;
				if (!last)
					POST(a, "receive",
					     fi_recv(a->ep, rx.p, MAXSZ, rx.desc, a->peer, &rctx));
				fill(tx.p, size, me, size, i);
				POST(a, "pong",
				     fi_send(a->ep, tx.p, size, tx.desc, a->peer, &tctx));
				wait_cntr(a, txc, ++sent, "send counter");
			}
		}
		/* between two barriers nobody sends: the counts printed are final for this size */
		app_barrier(a);
		out(a,
		    "size %zu: %d round trips; send counter %llu (errors %llu), receive counter "
		    "%llu (errors %llu)",
		    size, ITERS, (unsigned long long)fi_cntr_read(txc),
		    (unsigned long long)fi_cntr_readerr(txc), (unsigned long long)fi_cntr_read(rxc),
		    (unsigned long long)fi_cntr_readerr(rxc));
		app_barrier(a);
	}
	out(a, "payload bytes that differ from what the peer sent: %zu", bad);
	app_barrier(a);

	/* nothing more is coming: waiting for one more completion times out, changing nothing.
	 * Not on shm: libfabric 1.17's shm counters wait with a yield loop that ignores the
	 * timeout (util_wait_yield_run), so this wait would never return there. */
	if (strcmp(a->prov, "shm") == 0) {
		out(a, "fi_cntr_wait beyond the last message: not tried on shm (its wait ignores "
		       "the timeout)");
	} else {
		ret = fi_cntr_wait(rxc, received + 1, 20);
		out(a,
		    "fi_cntr_wait(receive counter, %llu, 20 ms) = %s; value then %llu, errors %llu",
		    (unsigned long long)received + 1, errname(ret),
		    (unsigned long long)fi_cntr_read(rxc),
		    (unsigned long long)fi_cntr_readerr(rxc));
	}
	ret = fi_cntr_wait(txc, sent, 0);
	out(a, "fi_cntr_wait(send counter, %llu, 0 ms) = %s", (unsigned long long)sent,
	    errname(ret));
	struct fi_cq_data_entry e;
	ret = (int)fi_cq_read(cq, &e, 1);
	out(a, "fi_cq_read on the selective CQ = %s", errname(ret));
	app_barrier(a);
	app_finish(a, 0);
}
