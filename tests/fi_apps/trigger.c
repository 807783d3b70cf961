/* Triggered operations (fi_trigger(3): FI_TRIGGER with a threshold on a counter) and deferred
 * work (fi_control(domain, FI_QUEUE_WORK)), the pattern of fabtests' fi_rdm_rma_trigger and
 * fi_rdm_deferred_wq. Where the provider has FI_TRIGGER (sockets, of the four):
 *
 *  A. the client posts a send with FI_TRIGGER, threshold 2 on an unbound counter T; it must not
 *     run after one fi_cntr_add(T, 1) and must run after the second;
 *  B. it posts an RMA write with FI_TRIGGER, threshold 3 on its own send counter (bound to the
 *     endpoint), then two ordinary sends: their completions bring the counter to 3 and fire the
 *     write; the server sees the data through its remote write counter;
 *  C. it queues three deferred work items on counter D (thresholds 1, 2, 3): add 5 to counter
 *     X, a send, set X to 100; each fi_cntr_add(D, 1) releases one of them; the completion
 *     counter C named in each item is printed; then FI_FLUSH_WORK.
 *
 * Where the provider has no FI_TRIGGER, both sides print "FI_TRIGGER not supported by <prov>"
 * and the client still asks the domain to queue a deferred counter update, printing the
 * provider's answer (a refusal; nothing may crash).
 *
 * Prints the results, the counter values and the number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#define MSGSZ 32
#define NMSG 4 /* A: 1 triggered send; B: 2 sends; C: 1 deferred send */
#define WSZ 64
#define BUFSZ 4096
#define WOFF 1024

static void show(struct app *a, struct fid_cntr *c, const char *what)
{
	out(a, "%s: value %llu, errors %llu", what, (unsigned long long)fi_cntr_read(c),
	    (unsigned long long)fi_cntr_readerr(c));
}

static void no_trigger(struct app *a)
{
	app_hints(a, FI_MSG);
	int ret = app_getinfo(a);
	if (ret)
		die(a, "fi_getinfo(%s, FI_EP_RDM, FI_MSG) = %s", a->prov, errstr(ret));
	app_open(a);
	if (a->role == ROLE_CLIENT) {
		struct fid_cntr *d = app_cntr(a, FI_WAIT_NONE, "triggering counter");
		struct fid_cntr *x = app_cntr(a, FI_WAIT_NONE, "target counter");
		struct fi_op_cntr op = { .cntr = x, .value = 5 };
		struct fi_deferred_work w = { .threshold = 1,
			                      .triggering_cntr = d,
			                      .completion_cntr = x,
			                      .op_type = FI_OP_CNTR_ADD,
			                      .op.cntr = &op };
		ret = fi_control(&a->domain->fid, FI_QUEUE_WORK, &w);
		out(a, "fi_control(domain, FI_QUEUE_WORK, counter add) = %s", errname(ret));
		CHECK(a, fi_cntr_add(d, 1));
		out(a, "after fi_cntr_add(triggering counter, 1): target counter %llu",
		    (unsigned long long)fi_cntr_read(x));
		ret = fi_control(&a->domain->fid, FI_FLUSH_WORK, NULL);
		out(a, "fi_control(domain, FI_FLUSH_WORK) = %s", errname(ret));
	}
	app_barrier(a);
	app_finish(a, 0);
}

int main(int argc, char **argv)
{
	struct app A, *a = &A;
	app_start(a, argc, argv);

	app_hints(a, FI_MSG | FI_RMA | FI_RMA_EVENT | FI_TRIGGER);
	int ret = app_getinfo(a);
	if (ret == -FI_ENODATA) {
		out(a,
		    "FI_TRIGGER not supported by %s (fi_getinfo with "
		    "FI_MSG|FI_RMA|FI_RMA_EVENT|FI_TRIGGER = %s)",
		    a->prov, errname(ret));
		no_trigger(a);
	}
	if (ret)
		die(a, "fi_getinfo(%s, FI_EP_RDM, FI_MSG|FI_RMA|FI_RMA_EVENT|FI_TRIGGER) = %s",
		    a->prov, errstr(ret));
	app_open(a);
	struct fid_cq *cq = app_cq(a, FI_WAIT_NONE);
	struct fid_cntr *txc = NULL, *wc = NULL, *t = NULL, *d = NULL, *x = NULL, *c = NULL;
	struct fid_cntr *rxc = NULL, *rwc = NULL;
	if (a->role == ROLE_CLIENT) {
		txc = app_cntr(a, FI_WAIT_UNSPEC, "send counter");
		wc = app_cntr(a, FI_WAIT_UNSPEC, "write counter");
		t = app_cntr(a, FI_WAIT_UNSPEC, "trigger counter T");
		d = app_cntr(a, FI_WAIT_UNSPEC, "deferred-work counter D");
		x = app_cntr(a, FI_WAIT_UNSPEC, "target counter X");
		c = app_cntr(a, FI_WAIT_UNSPEC, "completion counter C");
	} else {
		rxc = app_cntr(a, FI_WAIT_UNSPEC, "receive counter");
		rwc = app_cntr(a, FI_WAIT_UNSPEC, "remote write counter");
	}
	app_endpoint(a);
	app_bind(a, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION,
	         "CQ, FI_SELECTIVE_COMPLETION");
	if (txc) {
		app_bind(a, &txc->fid, FI_SEND, "send counter, FI_SEND");
		app_bind(a, &wc->fid, FI_WRITE, "write counter, FI_WRITE");
	} else {
		app_bind(a, &rxc->fid, FI_RECV, "receive counter, FI_RECV");
		app_bind(a, &rwc->fid, FI_REMOTE_WRITE, "remote write counter, FI_REMOTE_WRITE");
	}
	app_connect(a);
	struct app_buf buf;
	app_mr(a, &buf, BUFSZ, FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE);

	if (a->role == ROLE_SERVER) {
		struct fi_context rctx[NMSG];
		for (int i = 0; i < NMSG; i++)
			POST(a, "receive",
			     fi_recv(a->ep, buf.p + i * MSGSZ, MSGSZ, buf.desc, a->peer, &rctx[i]));
		oob_send_u64(a, (uint64_t)(uintptr_t)buf.p);
		oob_send_u64(a, buf.key);
		app_barrier(a); /* receives posted */
		static const char *phase[NMSG] = { "A (triggered send)", "B (first send)",
			                           "B (second send)", "C (deferred send)" };
		for (int i = 0; i < NMSG; i++) {
			wait_cntr(a, rxc, (uint64_t)i + 1, "receive counter");
			out(a, "message %d received: %s, tag byte %d", i + 1, phase[i],
			    buf.p[i * MSGSZ]);
			if (i == 3) {
				char r = 'r';
				oob_send(a, &r, 1); /* the deferred send arrived */
			}
			if (i == 2) {
				wait_cntr(a, rwc, 1, "remote write counter");
				size_t bad = 0;
				for (size_t k = 0; k < WSZ; k++)
					bad += buf.p[WOFF + k] != (char)(k + 33);
				out(a,
				    "triggered write arrived: remote write counter %llu; bytes "
				    "that differ: %zu",
				    (unsigned long long)fi_cntr_read(rwc), bad);
			}
		}
		app_barrier(a);
		show(a, rxc, "receive counter");
		show(a, rwc, "remote write counter");
	} else {
		uint64_t base = oob_recv_u64(a), key = oob_recv_u64(a);
		for (int i = 0; i < NMSG; i++)
			memset(buf.p + i * MSGSZ, 'a' + i, MSGSZ);
		for (size_t k = 0; k < WSZ; k++)
			buf.p[WOFF + k] = (char)(k + 33);
		app_barrier(a);

		/* A: a send held back until T reaches 2 */
		struct fi_triggered_context tA = { .event_type = FI_TRIGGER_THRESHOLD,
			                           .trigger.threshold = { .cntr = t,
			                                                  .threshold = 2 } };
		struct iovec iovA = { .iov_base = buf.p, .iov_len = MSGSZ };
		struct fi_msg mA = { .msg_iov = &iovA,
			             .desc = &buf.desc,
			             .iov_count = 1,
			             .addr = a->peer,
			             .context = &tA };
		ret = (int)fi_sendmsg(a->ep, &mA, FI_TRIGGER);
		out(a, "A: fi_sendmsg(FI_TRIGGER, T >= 2) = %s", errname(ret));
		if (ret)
			die(a, "A: triggered send refused");
		show(a, txc, "A: send counter after posting");
		CHECK(a, fi_cntr_add(t, 1));
		show(a, txc, "A: send counter after fi_cntr_add(T, 1), T = 1");
		CHECK(a, fi_cntr_add(t, 1));
		wait_cntr(a, txc, 1, "A: send counter");
		show(a, txc, "A: send counter after fi_cntr_add(T, 1), T = 2");
		show(a, t, "A: T");

		/* B: a write held back until the send counter reaches 3 */
		struct fi_triggered_context tB = { .event_type = FI_TRIGGER_THRESHOLD,
			                           .trigger.threshold = { .cntr = txc,
			                                                  .threshold = 3 } };
		struct iovec iovB = { .iov_base = buf.p + WOFF, .iov_len = WSZ };
		struct fi_rma_iov riovB = { .addr = app_raddr(a, base, WOFF),
			                    .len = WSZ,
			                    .key = key };
		struct fi_msg_rma mB = { .msg_iov = &iovB,
			                 .desc = &buf.desc,
			                 .iov_count = 1,
			                 .addr = a->peer,
			                 .rma_iov = &riovB,
			                 .rma_iov_count = 1,
			                 .context = &tB };
		ret = (int)fi_writemsg(a->ep, &mB, FI_TRIGGER);
		out(a, "B: fi_writemsg(FI_TRIGGER, send counter >= 3) = %s", errname(ret));
		if (ret)
			die(a, "B: triggered write refused");
		show(a, wc, "B: write counter after posting");
		struct fi_context sctx[2];
		for (int i = 0; i < 2; i++)
			POST(a, "B: send",
			     fi_send(a->ep, buf.p + (1 + i) * MSGSZ, MSGSZ, buf.desc, a->peer,
			             &sctx[i]));
		wait_cntr(a, txc, 3, "B: send counter");
		wait_cntr(a, wc, 1, "B: write counter");
		show(a, txc, "B: send counter");
		show(a, wc, "B: write counter");

		/* C: deferred work on D */
		struct fi_op_cntr add5 = { .cntr = x, .value = 5 },
		                  set100 = { .cntr = x, .value = 100 };
		struct iovec iovC = { .iov_base = buf.p + 3 * MSGSZ, .iov_len = MSGSZ };
		struct fi_deferred_work w[3] = {
			{ .threshold = 1,
			  .triggering_cntr = d,
			  .completion_cntr = c,
			  .op_type = FI_OP_CNTR_ADD,
			  .op.cntr = &add5 },
			{ .threshold = 2,
			  .triggering_cntr = d,
			  .completion_cntr = c,
			  .op_type = FI_OP_SEND },
			{ .threshold = 3,
			  .triggering_cntr = d,
			  .completion_cntr = c,
			  .op_type = FI_OP_CNTR_SET,
			  .op.cntr = &set100 },
		};
		/* the send's context must be its work item's (fi_trigger(3) leaves it to the provider;
		 * sockets requires it) */
		struct fi_op_msg sendC = { .ep = a->ep,
			                   .msg = { .msg_iov = &iovC,
			                            .desc = &buf.desc,
			                            .iov_count = 1,
			                            .addr = a->peer,
			                            .context = &w[1].context },
			                   .flags = 0 };
		w[1].op.msg = &sendC;
		static const char *what[3] = { "add 5 to X at D >= 1", "send at D >= 2",
			                       "set X to 100 at D >= 3" };
		for (int i = 0; i < 3; i++) {
			ret = fi_control(&a->domain->fid, FI_QUEUE_WORK, &w[i]);
			out(a, "C: fi_control(domain, FI_QUEUE_WORK, %s) = %s", what[i],
			    errname(ret));
			if (ret)
				die(a, "C: deferred work refused");
		}
		show(a, x, "C: X after queueing");
		CHECK(a, fi_cntr_add(d, 1));
		wait_cntr(a, x, 5, "C: X");
		show(a, x, "C: X after D = 1");
		show(a, txc, "C: send counter after D = 1");
		show(a, c, "C: C after D = 1");
		CHECK(a, fi_cntr_add(d, 1));
		char r;
		oob_recv(a, &r, 1); /* the server has the deferred send */
		show(a, txc, "C: send counter after D = 2 (the server has the message)");
		wait_cntr(a, c, 1,
		          "C: completion counter C"); /* bumped when the deferred send completes */
		show(a, c, "C: C after D = 2");
		show(a, x, "C: X after D = 2");
		CHECK(a, fi_cntr_add(d, 1));
		wait_cntr(a, x, 100, "C: X");
		show(a, x, "C: X after D = 3");
		ret = fi_control(&a->domain->fid, FI_FLUSH_WORK, NULL);
		out(a, "C: fi_control(domain, FI_FLUSH_WORK) = %s", errname(ret));
		app_barrier(a);
		show(a, c, "C: completion counter C");
		show(a, d, "C: D");
		show(a, txc, "send counter");
		show(a, wc, "write counter");
	}
	struct fi_cq_data_entry e;
	ret = (int)fi_cq_read(cq, &e, 1);
	out(a, "fi_cq_read on the selective CQ = %s", errname(ret));
	app_barrier(a);
	app_finish(a, 0);
}
