/* Credit-based flow control, the MPICH way, with compcntr's credit tracker.
 *
 * A sender may have at most CREDITS sends in flight to each peer (the receive buffers that peer
 * keeps posted). It counts what it issued in software and lets the network count what came
 * back: each peer's credit counter is attached to the SEND op of the QP to that peer, so every
 * completed send returns one credit. When no credit is left, acquire waits, driving the
 * runtime's progress (here: the peers posting receive buffers) while it does.
 *
 * By hand, for one thread, the pattern is (cc: the peer's completion counter):
 *     while (issued - completed(cc) >= CREDITS) { progress(); wait(cc, issued - CREDITS + 1); }
 *     post_send(...); issued++;
 * compcntr_credits_acquire is that, lock-free for any number of threads, with errors (a failed
 * send returns its credit too), timeouts and counter wrap-around handled.
 *
 * Loopback on the software device: peer p is the far end of QP pair p. Built and run as a test
 * (example_credits); it checks every byte and every count, and exits non-zero on any error.
 */
#include <compcntr/compcntr.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { NPEERS = 3, CREDITS = 4, MSGS = 3000, LEN = 32 };

struct peer {
	struct compcntr_qp *tx, *rx;  /* our QP to the peer, and the peer's end */
	char sbuf[CREDITS][LEN];      /* our send buffers: one per credit, reused round-robin */
	char rbuf[CREDITS][LEN];      /* the peer's receive buffers, likewise */
	struct compcntr_mr *smr, *rmr;
	uint64_t sent, posted;        /* sends issued, receives the peer has posted */
	uint64_t checksum;            /* sum of the first bytes the peer received */
};
static struct peer peers[NPEERS];

#define CHECK(call)                                                                                \
	do {                                                                                       \
		int rc_ = (call);                                                                  \
		if (rc_ != 0) {                                                                    \
			fprintf(stderr, "%s:%d: %s = %d (%s)\n", __FILE__, __LINE__, #call, rc_,   \
			        compcntr_last_error_message());                                    \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

/* The runtime's network progress, called by acquire/flush while they wait: each peer slowly
 * consumes one message per call (posts one receive buffer, which completes a waiting send). */
static void progress(void *ctx)
{
	(void)ctx;
	for (int p = 0; p < NPEERS; p++) {
		struct peer *pp = &peers[p];
		if (pp->posted == pp->sent)
			continue;
		char *buf = pp->rbuf[pp->posted % CREDITS];
		if (compcntr_post_recv(pp->rx, pp->posted, buf, LEN, pp->rmr->lkey) == 0) {
			pp->checksum += (unsigned char)buf[0]; /* the send matched it at once */
			pp->posted++;
		}
	}
}

int main(void)
{
	struct compcntr_device *dev = compcntr_open_device("soft");
	if (!dev)
		return 1;
	struct compcntr_credits *cr = compcntr_credits_create(dev, NPEERS, CREDITS);
	if (!cr)
		return 1;

	for (int p = 0; p < NPEERS; p++) {
		struct peer *pp = &peers[p];
		pp->tx = compcntr_create_qp(dev);
		pp->rx = compcntr_create_qp(dev);
		pp->smr = compcntr_reg_mr(dev, pp->sbuf, sizeof pp->sbuf, 0);
		pp->rmr = compcntr_reg_mr(dev, pp->rbuf, sizeof pp->rbuf,
		                          COMPCNTR_ACCESS_LOCAL_WRITE);
		if (!pp->tx || !pp->rx || !pp->smr || !pp->rmr)
			return 1;
		/* Each completed send to p returns one of p's credits. */
		struct compcntr_qp_attach_comp_cntr_attr at = {
			0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND
		};
		CHECK(compcntr_qp_attach_comp_cntr(pp->tx, compcntr_credits_counter(cr, p), &at));
		CHECK(compcntr_modify_qp(pp->tx, COMPCNTR_QPS_INIT));
		CHECK(compcntr_modify_qp(pp->rx, COMPCNTR_QPS_INIT));
		CHECK(compcntr_connect_qp(pp->tx, pp->rx));
	}

	/* ---- the pattern: acquire a credit, issue, and flush at the end ---- */
	struct compcntr_wait_attr wa = { .progress = progress };
	uint64_t expect[NPEERS] = { 0 }, max_in_flight[NPEERS] = { 0 }, out;
	for (int i = 0; i < MSGS; i++) {
		int p = i % NPEERS;
		struct peer *pp = &peers[p];
		CHECK(compcntr_credits_acquire_ex(cr, p, 1, -1,
		                                  &wa)); /* waits while CREDITS are out */
		/* A send buffer may be reused once its send completed: with sends completing in
		 * order, holding a credit means the send CREDITS ago is done and its slot is free. */
		char *buf = pp->sbuf[pp->sent % CREDITS];
		buf[0] = (char)(i & 0x7f);
		expect[p] += (unsigned char)buf[0];
		/* its completion returns the credit */
		CHECK(compcntr_post_send(pp->tx, i, buf, LEN, pp->smr->lkey));
		pp->sent++;
		uint64_t completed;
		CHECK(compcntr_read_comp_cntr(compcntr_credits_counter(cr, p), &completed));
		if (pp->sent - completed > max_in_flight[p])
			max_in_flight[p] = pp->sent - completed;
		if (i % 1000 == 999) /* periodic flush: everything issued so far has completed */
			for (int q = 0; q < NPEERS; q++)
				CHECK(compcntr_credits_flush_ex(cr, q, -1, &wa));
	}
	for (int p = 0; p < NPEERS; p++)
		CHECK(compcntr_credits_flush_ex(cr, p, -1,
		                                &wa)); /* MPI_Win_flush: all sends to p done */

	/* Every send completed exactly once, every credit is back, every byte arrived. */
	for (int p = 0; p < NPEERS; p++) {
		uint64_t v, e;
		CHECK(compcntr_read_comp_cntr(compcntr_credits_counter(cr, p), &v));
		CHECK(compcntr_read_err_comp_cntr(compcntr_credits_counter(cr, p), &e));
		CHECK(compcntr_credits_outstanding(cr, p, &out));
		if (v != peers[p].sent || e != 0 || out != 0 || peers[p].posted != peers[p].sent ||
		    peers[p].checksum != expect[p] || max_in_flight[p] != CREDITS) {
			fprintf(stderr,
			        "peer %d: %llu completed, %llu errors, %llu outstanding, %llu sent,"
			        " checksum %llu (want %llu), at most %llu in flight\n",
			        p, (unsigned long long)v, (unsigned long long)e,
			        (unsigned long long)out, (unsigned long long)peers[p].sent,
			        (unsigned long long)peers[p].checksum,
			        (unsigned long long)expect[p],
			        (unsigned long long)max_in_flight[p]);
			return 1;
		}
		printf("peer %d: %llu sends, at most %llu in flight, all credits back\n", p,
		       (unsigned long long)v, (unsigned long long)max_in_flight[p]);
	}

	for (int p = 0; p < NPEERS; p++) {
		CHECK(compcntr_destroy_qp(peers[p].tx));
		CHECK(compcntr_destroy_qp(peers[p].rx));
		CHECK(compcntr_dereg_mr(peers[p].smr));
		CHECK(compcntr_dereg_mr(peers[p].rmr));
	}
	CHECK(compcntr_credits_destroy(cr));
	CHECK(compcntr_close_device(dev));
	return 0;
}
