/* Send/receive with FI_SELECTIVE_COMPLETION: the CQ is bound with FI_SELECTIVE_COMPLETION on
 * both sides, so only operations posted with the FI_COMPLETION flag write a CQ entry, while the
 * counters bound beside it count every operation. This is the traffic a CQ-based bridge cannot
 * see and a counter must.
 *
 * The server posts NMSG receives with fi_recvmsg, FI_COMPLETION on every 4th. The client sends
 * NMSG messages: NSENDMSG with fi_sendmsg (FI_COMPLETION on every 3rd), then NSEND with fi_send
 * (no flag: no entry under selective completion), then NINJECT with fi_inject (never an entry).
 * Each side waits for its counter to reach the total (fi_cntr_wait; injected sends are counted
 * too by tcp;ofi_rxm, udp;ofi_rxd, shm and sockets), then reads its CQ: it must
 * hold exactly the flagged operations (their indices, lengths and flags are printed), and then
 * -FI_EAGAIN.
 *
 * Prints the counter values, the CQ entries, and the number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#define NSENDMSG 12
#define NSEND 4
#define NINJECT 4
#define NMSG (NSENDMSG + NSEND + NINJECT)
#define MSGSZ 48

static int flagged_send(int i)
{
	return i < NSENDMSG && i % 3 == 0;
}
static int flagged_recv(int i)
{
	return i % 4 == 0;
}

static int cmp_int(const void *x, const void *y)
{
	return *(const int *)x - *(const int *)y;
}

/* Reads the CQ until `expect` entries came (or APP_WAIT_MS passed), prints them by operation
 * index (sorted), then prints what one more read returns. */
static void drain(struct app *a, struct fid_cq *cq, int expect, struct fi_context *ctx,
                  const char *what)
{
	int idx[NMSG], n = 0;
	char line[1024];
	size_t len = 0;
	struct fi_cq_data_entry e[NMSG];
	size_t elen[NMSG];
	uint64_t eflags[NMSG];
	const int64_t deadline = now_ms() + APP_WAIT_MS;
	while (n < expect && now_ms() < deadline) {
		ssize_t r = fi_cq_read(cq, e, 1);
		if (r == -FI_EAGAIN)
			continue;
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			ssize_t rr = fi_cq_readerr(cq, &err, 0);
			die(a, "%s CQ: error entry (fi_cq_readerr = %zd, err %s, flags %s)", what,
			    rr, errname(-err.err), flagstr(err.flags));
		}
		if (r != 1)
			die(a, "%s CQ: fi_cq_read = %s", what, errstr((int)r));
		int k = (int)((struct fi_context *)e[0].op_context - ctx);
		if (k < 0 || k >= NMSG)
			die(a, "%s CQ: entry with a context that is not an operation's", what);
		idx[n] = k;
		elen[k] = e[0].len;
		eflags[k] = e[0].flags;
		n++;
	}
	qsort(idx, (size_t)n, sizeof idx[0], cmp_int);
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(line + len, sizeof line - len, "%s#%d", i ? " " : "",
		                        idx[i]);
	out(a, "%s CQ: %d entries (%d operations were flagged FI_COMPLETION): %s", what, n, expect,
	    n ? line : "none");
	for (int i = 0; i < n; i++)
		out(a, "%s CQ entry #%d: len %zu, flags %s", what, idx[i], elen[idx[i]],
		    flagstr(eflags[idx[i]]));
	ssize_t r = fi_cq_read(cq, e, 1);
	out(a, "%s CQ: one more fi_cq_read = %s", what, errname((int)r));
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
	app_bind(a, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION,
	         "CQ, FI_SELECTIVE_COMPLETION");
	app_bind(a, &txc->fid, FI_SEND, "send counter, FI_SEND");
	app_bind(a, &rxc->fid, FI_RECV, "receive counter, FI_RECV");
	app_connect(a);
	const size_t inject_max = a->info->tx_attr->inject_size;

	struct app_buf buf;
	app_mr(a, &buf, NMSG * MSGSZ, FI_SEND | FI_RECV);
	struct fi_context ctx[NMSG];

	if (a->role == ROLE_SERVER) {
		int flagged = 0;
		for (int i = 0; i < NMSG; i++) {
			struct iovec iov = { .iov_base = buf.p + i * MSGSZ, .iov_len = MSGSZ };
			struct fi_msg m = { .msg_iov = &iov,
				            .desc = &buf.desc,
				            .iov_count = 1,
				            .addr = a->peer,
				            .context = &ctx[i] };
			flagged += flagged_recv(i);
			POST(a, "receive",
			     fi_recvmsg(a->ep, &m, flagged_recv(i) ? FI_COMPLETION : 0));
		}
		app_barrier(a); /* receives posted */
		wait_cntr(a, rxc, NMSG, "receive counter");
		size_t bad = 0;
		for (int i = 0; i < NMSG * MSGSZ; i++)
			bad += buf.p[i] != (char)(i * 5 + 1);
		out(a, "receive counter %llu (errors %llu); payload bytes that differ: %zu",
		    (unsigned long long)fi_cntr_read(rxc), (unsigned long long)fi_cntr_readerr(rxc),
		    bad);
		drain(a, cq, flagged, ctx, "receive");
		app_barrier(a); /* all received */
		out(a, "send counter %llu (errors %llu)", (unsigned long long)fi_cntr_read(txc),
		    (unsigned long long)fi_cntr_readerr(txc));
	} else {
		for (int i = 0; i < NMSG * MSGSZ; i++)
			buf.p[i] = (char)(i * 5 + 1);
		if (inject_max < MSGSZ)
			die(a, "inject_size %zu < %d", inject_max, MSGSZ);
		app_barrier(a); /* receives posted */
		int flagged = 0, i = 0;
		for (; i < NSENDMSG; i++) {
			struct iovec iov = { .iov_base = buf.p + i * MSGSZ, .iov_len = MSGSZ };
			struct fi_msg m = { .msg_iov = &iov,
				            .desc = &buf.desc,
				            .iov_count = 1,
				            .addr = a->peer,
				            .context = &ctx[i] };
			flagged += flagged_send(i);
			POST(a, "fi_sendmsg",
			     fi_sendmsg(a->ep, &m, flagged_send(i) ? FI_COMPLETION : 0));
		}
		for (; i < NSENDMSG + NSEND; i++)
			POST(a, "fi_send",
			     fi_send(a->ep, buf.p + i * MSGSZ, MSGSZ, buf.desc, a->peer, &ctx[i]));
		/* every operation above is counted once it completes: wait for them first */
		wait_cntr(a, txc, NSENDMSG + NSEND, "send counter");
		for (; i < NMSG; i++)
			POST(a, "fi_inject", fi_inject(a->ep, buf.p + i * MSGSZ, MSGSZ, a->peer));
		/* the four providers count injected sends too (they write no CQ entry, ever) */
		wait_cntr(a, txc, NMSG, "send counter, with the injects");
		app_barrier(a); /* all received by the server */
		drain(a, cq, flagged, ctx, "send");
		out(a, "send counter %llu (errors %llu); receive counter %llu (errors %llu)",
		    (unsigned long long)fi_cntr_read(txc), (unsigned long long)fi_cntr_readerr(txc),
		    (unsigned long long)fi_cntr_read(rxc),
		    (unsigned long long)fi_cntr_readerr(rxc));
	}
	app_barrier(a);
	app_finish(a, 0);
}
