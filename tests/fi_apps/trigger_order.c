/* Threshold order, 64-bit thresholds, cancel and flush of triggered operations and deferred
 * work (fi_trigger(3)), for a provider with FI_TRIGGER (here: through ofi_compcntr):
 *
 *  A. three triggered sends armed on counter T out of order (thresholds 3, 1, 2; payload tags
 *     'c', 'a', 'b'), then one fi_cntr_add(T, 3) makes all three due at once: the server must
 *     receive them in threshold order ('a', 'b', 'c'), not in arming order;
 *  B. deferred FI_OP_CNTR_SET items on counter D armed out of order (thresholds 3, 1, 2 setting
 *     X to 30, 10, 20): after fi_cntr_add(D, 3) X is 30 (the last to run is threshold 3);
 *  C. a deferred item at a threshold past 2^32 (2^40 + 1): fi_cntr_set(D, 2^40) leaves it
 *     armed, fi_cntr_add(D, 1) fires it (a 32-bit comparison would have fired it at once);
 *  D. FI_CANCEL_WORK of an armed item (0; it never runs), again (-FI_ENOENT: gone), of an item
 *     never queued (-FI_ENOENT); FI_FLUSH_WORK with two armed items (0; neither runs).
 *
 * Where fi_getinfo has no FI_TRIGGER, both sides print "FI_TRIGGER not supported by <prov>".
 * Prints the results, the counter values and the number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#define MSGSZ 16
#define NMSG 3

static void show(struct app *a, struct fid_cntr *c, const char *what)
{
	out(a, "%s: value %llu, errors %llu", what, (unsigned long long)fi_cntr_read(c),
	    (unsigned long long)fi_cntr_readerr(c));
}

static int queue_set(struct app *a, struct fid_cntr *d, uint64_t threshold,
                     struct fi_deferred_work *w, struct fi_op_cntr *op)
{
	w->threshold = threshold;
	w->triggering_cntr = d;
	w->completion_cntr = NULL;
	w->op_type = FI_OP_CNTR_SET;
	w->op.cntr = op;
	return fi_control(&a->domain->fid, FI_QUEUE_WORK, w);
}

int main(int argc, char **argv)
{
	struct app A, *a = &A;
	app_start(a, argc, argv);

	app_hints(a, FI_MSG | FI_TRIGGER);
	int ret = app_getinfo(a);
	if (ret == -FI_ENODATA) {
		out(a, "FI_TRIGGER not supported by %s (fi_getinfo = %s)", a->prov, errname(ret));
		app_finish(a, 0);
	}
	if (ret)
		die(a, "fi_getinfo(%s, FI_EP_RDM, FI_MSG|FI_TRIGGER) = %s", a->prov, errstr(ret));
	app_open(a);
	struct fid_cq *cq = app_cq(a, FI_WAIT_NONE);
	struct fid_cntr *txc = NULL, *rxc = NULL, *t = NULL, *d = NULL, *x = NULL;
	if (a->role == ROLE_CLIENT) {
		txc = app_cntr(a, FI_WAIT_UNSPEC, "send counter");
		t = app_cntr(a, FI_WAIT_UNSPEC, "trigger counter T");
		d = app_cntr(a, FI_WAIT_UNSPEC, "deferred-work counter D");
		x = app_cntr(a, FI_WAIT_UNSPEC, "target counter X");
	} else {
		rxc = app_cntr(a, FI_WAIT_UNSPEC, "receive counter");
	}
	app_endpoint(a);
	app_bind(a, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION,
	         "CQ, FI_SELECTIVE_COMPLETION");
	if (txc)
		app_bind(a, &txc->fid, FI_SEND, "send counter, FI_SEND");
	else
		app_bind(a, &rxc->fid, FI_RECV, "receive counter, FI_RECV");
	app_connect(a);
	struct app_buf buf;
	app_mr(a, &buf, 4096, FI_SEND | FI_RECV);

	if (a->role == ROLE_SERVER) {
		struct fi_context rctx[NMSG];
		for (int i = 0; i < NMSG; i++)
			POST(a, "receive",
			     fi_recv(a->ep, buf.p + i * MSGSZ, MSGSZ, buf.desc, a->peer, &rctx[i]));
		app_barrier(a); /* receives posted */
		wait_cntr(a, rxc, NMSG, "receive counter");
		out(a, "A: received in this order: %c %c %c", buf.p[0], buf.p[MSGSZ],
		    buf.p[2 * MSGSZ]);
		app_barrier(a);
		show(a, rxc, "receive counter");
	} else {
		static const uint64_t th[NMSG] = { 3, 1, 2 };
		static const char tag[NMSG] = { 'c', 'a', 'b' };
		struct fi_triggered_context tc[NMSG];
		struct iovec iov[NMSG];
		app_barrier(a);
		for (int i = 0; i < NMSG; i++) {
			memset(buf.p + i * MSGSZ, tag[i], MSGSZ);
			tc[i].event_type = FI_TRIGGER_THRESHOLD;
			tc[i].trigger.threshold.cntr = t;
			tc[i].trigger.threshold.threshold = th[i];
			iov[i].iov_base = buf.p + i * MSGSZ;
			iov[i].iov_len = MSGSZ;
			struct fi_msg m = { .msg_iov = &iov[i],
				            .desc = &buf.desc,
				            .iov_count = 1,
				            .addr = a->peer,
				            .context = &tc[i] };
			ret = (int)fi_sendmsg(a->ep, &m, FI_TRIGGER);
			out(a, "A: fi_sendmsg(FI_TRIGGER, T >= %llu, tag '%c') = %s",
			    (unsigned long long)th[i], tag[i], errname(ret));
			if (ret)
				die(a, "A: triggered send refused");
		}
		show(a, txc, "A: send counter after arming");
		CHECK(a, fi_cntr_add(t, 3));
		wait_cntr(a, txc, NMSG, "A: send counter");
		show(a, txc, "A: send counter after fi_cntr_add(T, 3)");

		struct fi_op_cntr set[3] = { { .cntr = x, .value = 30 },
			                     { .cntr = x, .value = 10 },
			                     { .cntr = x, .value = 20 } };
		struct fi_deferred_work w[3];
		for (int i = 0; i < 3; i++) {
			ret = queue_set(a, d, th[i], &w[i], &set[i]);
			out(a, "B: FI_QUEUE_WORK(set X to %llu at D >= %llu) = %s",
			    (unsigned long long)set[i].value, (unsigned long long)th[i],
			    errname(ret));
			if (ret)
				die(a, "B: deferred work refused");
		}
		CHECK(a, fi_cntr_add(d, 3));
		show(a, d, "B: D");
		show(a, x, "B: X after fi_cntr_add(D, 3) (the last to run sets it)");

		const uint64_t big = (uint64_t)1 << 40;
		struct fi_op_cntr set64 = { .cntr = x, .value = 64 };
		struct fi_deferred_work w64;
		ret = queue_set(a, d, big + 1, &w64, &set64);
		out(a, "C: FI_QUEUE_WORK(set X to 64 at D >= 2^40 + 1) = %s", errname(ret));
		CHECK(a, fi_cntr_set(d, big));
		show(a, x, "C: X after fi_cntr_set(D, 2^40)");
		CHECK(a, fi_cntr_add(d, 1));
		show(a, x, "C: X after fi_cntr_add(D, 1)");

		struct fi_op_cntr setc = { .cntr = x, .value = 99 };
		struct fi_deferred_work wc, never;
		memset(&never, 0, sizeof never);
		queue_set(a, d, big + 100, &wc, &setc);
		ret = fi_control(&a->domain->fid, FI_CANCEL_WORK, &wc);
		out(a, "D: FI_CANCEL_WORK(armed item) = %s", errname(ret));
		ret = fi_control(&a->domain->fid, FI_CANCEL_WORK, &wc);
		out(a, "D: FI_CANCEL_WORK(the same again) = %s", errname(ret));
		ret = fi_control(&a->domain->fid, FI_CANCEL_WORK, &never);
		out(a, "D: FI_CANCEL_WORK(never queued) = %s", errname(ret));
		struct fi_deferred_work wf[2];
		struct fi_op_cntr setf[2] = { { .cntr = x, .value = 77 },
			                      { .cntr = x, .value = 88 } };
		for (int i = 0; i < 2; i++)
			queue_set(a, d, big + 200 + (uint64_t)i, &wf[i], &setf[i]);
		ret = fi_control(&a->domain->fid, FI_FLUSH_WORK, NULL);
		out(a, "D: FI_FLUSH_WORK(two armed items) = %s", errname(ret));
		CHECK(a, fi_cntr_add(d, 1000));
		show(a, x, "D: X after fi_cntr_add(D, 1000) (nothing cancelled ran)");
		app_barrier(a);
		show(a, txc, "send counter");
	}
	struct fi_cq_data_entry e;
	ret = (int)fi_cq_read(cq, &e, 1);
	out(a, "fi_cq_read on the selective CQ = %s", errname(ret));
	app_barrier(a);
	app_finish(a, 0);
}
