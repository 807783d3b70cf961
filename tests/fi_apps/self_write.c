/* An OpenSHMEM runtime's puts to itself (Sandia OpenSHMEM 1.5.3 over OFI, issue 23): one domain,
 * a "context" endpoint that writes and a separate "target" endpoint that owns the registered
 * memory, the context endpoint writing into the target endpoint of its own process. As SOS does:
 * the context endpoint's default transmit flags hold FI_DELIVERY_COMPLETE, its put counter
 * (FI_WAIT_UNSPEC) is bound with FI_WRITE and a CQ with FI_SELECTIVE_COMPLETION|FI_TRANSMIT; the
 * target endpoint has a CQ and no counter. A put of a scalar is fi_inject_write (SOS's
 * put_scalar), a put with explicit flags fi_writemsg(FI_INJECT|FI_DELIVERY_COMPLETE), and
 * shmem_quiet is fi_cntr_wait on the put counter with the number of puts issued.
 *
 * The domain asks for FI_PROGRESS_MANUAL so that nothing moves the target endpoint but the
 * program's own calls: after the writes the program waits on the put counter and looks at the
 * target memory *before* it drives the target endpoint (fi_cq_read on its CQ), then drives both
 * until everything has landed. A write that is delivery-complete cannot be counted before the
 * target endpoint has processed it, so such a wait cannot return before the data is there.
 *
 * What libfabric 1.17 does (measured without the hook, and what the program prints):
 *   tcp;ofi_rxm  fi_inject_write is counted once the data is handed to the socket: the wait
 *                returns 0 with none of the 8 writes at the target. rxm ignores the endpoint's
 *                FI_DELIVERY_COMPLETE here (its fi_inject_write passes only FI_INJECT to tcp
 *                when a write counter is bound), while fi_writemsg(FI_INJECT|
 *                FI_DELIVERY_COMPLETE) is counted only after the target endpoint ran (the wait
 *                times out until it does). With SOS's default automatic progress, rxm's own
 *                thread for the target endpoint lands the data a moment later: shmem_quiet
 *                returns before the puts have landed whenever the counter is faster than that
 *                thread (SOS's unit/alltoalls, docs/hook.md).
 *   udp;ofi_rxd, sockets  both calls are counted only after the target endpoint ran: the waits
 *                time out with none landed, as FI_DELIVERY_COMPLETE asks.
 *   (shm is not run: its fi_cntr_wait ignores the timeout, so the wait that must time out
 *   would wait for good.)
 *
 * The output must be the same without the hook, with it, and with its progress thread: the hook
 * serves the counter and must neither hide nor add anything (it counts what the provider counts).
 */
#include "fi_apps.h"

#define NPUT 8
#define SLOTS (2 * NPUT) /* strided like SOS's alltoalls with dst = 2: every other int */

/* Slots 0, 2, 4, ... hold `v` (the puts); returns how many do. */
static int landed(const volatile int32_t *t, int32_t v)
{
	int n = 0;
	for (int i = 0; i < NPUT; i++)
		n += t[2 * i] == v;
	return n;
}

int main(int argc, char **argv)
{
	struct app A, *a = &A;
	app_start(a, argc, argv);

	struct fi_info *h = app_hints(a, FI_RMA);
	h->domain_attr->data_progress = FI_PROGRESS_MANUAL;
	h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
	int ret = app_getinfo(a);
	if (ret == -FI_ENODATA) {
		out(a, "FI_PROGRESS_MANUAL with FI_DELIVERY_COMPLETE not supported by %s", a->prov);
		app_finish(a, 0);
	}
	if (ret)
		die(a, "fi_getinfo(%s, FI_RMA, FI_PROGRESS_MANUAL, FI_DELIVERY_COMPLETE) = %s",
		    a->prov, errstr(ret));
	out(a, "context endpoint: default transmit flags %s FI_DELIVERY_COMPLETE",
	    (a->info->tx_attr->op_flags & FI_DELIVERY_COMPLETE) ? "hold" : "lack");
	app_open(a);

	/* The target endpoint: remote writes into its registered memory, a CQ, no counter. */
	struct fi_info *ti = fi_dupinfo(a->info);
	if (!ti)
		die(a, "fi_dupinfo failed");
	ti->caps = FI_RMA | FI_REMOTE_WRITE;
	ti->tx_attr->op_flags = 0;
	struct fid_cq *tcq = app_cq(a, FI_WAIT_NONE); /* opened first: closed after the endpoint */
	struct fid_ep *tep;
	ret = fi_endpoint(a->domain, ti, &tep, NULL);
	fi_freeinfo(ti);
	if (ret)
		die(a, "fi_endpoint(target) = %s", errstr(ret));
	app_own(a, &tep->fid);
	CHECK(a, fi_ep_bind(tep, &a->av->fid, 0));
	CHECK(a, fi_ep_bind(tep, &tcq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(a, fi_enable(tep));
	struct app_buf tb, sb;
	app_mr(a, &tb, 4096, FI_REMOTE_WRITE);
	app_mr(a, &sb, 4096, FI_WRITE);
	volatile int32_t *t = (volatile int32_t *)(void *)tb.p;
	int32_t *src = (int32_t *)(void *)sb.p;

	/* The context endpoint: put counter (FI_WRITE), CQ with selective completion. */
	struct fid_cntr *put = app_cntr(a, FI_WAIT_UNSPEC, "put counter");
	struct fid_cq *cq = app_cq(a, FI_WAIT_NONE);
	app_endpoint(a); /* after its counter and CQ: closed before them */
	app_bind(a, &put->fid, FI_WRITE, "put counter, FI_WRITE");
	app_bind(a, &cq->fid, FI_SELECTIVE_COMPLETION | FI_TRANSMIT | FI_RECV,
	         "CQ, FI_SELECTIVE_COMPLETION|FI_TRANSMIT|FI_RECV");
	CHECK(a, fi_enable(a->ep));
	char name[256];
	size_t len = sizeof name;
	CHECK(a, fi_getname(&tep->fid, name, &len));
	fi_addr_t self;
	if (fi_av_insert(a->av, name, 1, &self, 0, NULL) != 1)
		die(a, "fi_av_insert(own target endpoint) failed");
	const uint64_t base = app_raddr(a, (uint64_t)(uintptr_t)tb.p, 0);

	/* Drives the target endpoint (fi_cq_read on its CQ) and the context endpoint (a read of
	 * the put counter) until the counter reaches `n` and the slots hold `v`. */
	struct fi_cq_data_entry e;
	const char *phase = "";
#define DRIVE_BOTH(n, v)                                                                           \
	do {                                                                                       \
		const int64_t dl_ = now_ms() + APP_WAIT_MS;                                        \
		while (fi_cntr_read(put) < (n) || landed(t, (v)) != NPUT) {                        \
			ret = (int)fi_cq_read(tcq, &e, 1);                                         \
			if (ret != -FI_EAGAIN)                                                     \
				die(a, "%s: fi_cq_read(target CQ) = %s", phase, errstr(ret));      \
			if (now_ms() > dl_)                                                        \
				die(a, "%s: counter %llu, landed %d of %d after %d ms", phase,     \
				    (unsigned long long)fi_cntr_read(put), landed(t, (v)), NPUT,   \
				    APP_WAIT_MS);                                                  \
		}                                                                                  \
	} while (0)

	/* Warm-up: the connection to the own target endpoint (rxm sets it up on the first write
	 * and needs both endpoints driven for it). */
	phase = "warm-up";
	for (int i = 0; i < SLOTS; i++)
		t[i] = -1;
	src[0] = 1;
	for (int i = 0; i < NPUT; i++)
		POST(a, "warm-up fi_write",
		     fi_write(a->ep, src, sizeof *src, sb.desc, self, base + 8 * (uint64_t)i,
		              tb.key, NULL));
	DRIVE_BOTH(NPUT, 1);
	out(a, "warm-up: %d fi_write driven on both endpoints: put counter %llu, landed %d of %d",
	    NPUT, (unsigned long long)fi_cntr_read(put), landed(t, 1), NPUT);
	uint64_t issued = NPUT;

	/* SOS's put of a scalar and shmem_quiet: fi_inject_write x8, fi_cntr_wait(put, issued). */
	phase = "fi_inject_write";
	for (int i = 0; i < SLOTS; i++)
		t[i] = -1;
	src[0] = 2;
	for (int i = 0; i < NPUT; i++)
		POST(a, "fi_inject_write",
		     fi_inject_write(a->ep, src, sizeof *src, self, base + 8 * (uint64_t)i,
		                     tb.key));
	issued += NPUT;
	ret = fi_cntr_wait(put, issued, 200);
	out(a,
	    "fi_inject_write x%d, then fi_cntr_wait(put counter, %llu, 200 ms) = %s: counter %llu, "
	    "landed "
	    "%d of %d (target endpoint not driven)",
	    NPUT, (unsigned long long)issued, errname(ret), (unsigned long long)fi_cntr_read(put),
	    landed(t, 2), NPUT);
	DRIVE_BOTH(issued, 2);
	out(a, "after driving the target endpoint: put counter %llu, landed %d of %d",
	    (unsigned long long)fi_cntr_read(put), landed(t, 2), NPUT);

	/* The same puts with the completion level named in the call. */
	phase = "fi_writemsg(FI_INJECT|FI_DELIVERY_COMPLETE)";
	for (int i = 0; i < SLOTS; i++)
		t[i] = -1;
	src[0] = 3;
	for (int i = 0; i < NPUT; i++) {
		struct iovec iov = { .iov_base = src, .iov_len = sizeof *src };
		struct fi_rma_iov rma = { .addr = base + 8 * (uint64_t)i,
			                  .len = sizeof *src,
			                  .key = tb.key };
		struct fi_msg_rma msg = { .msg_iov = &iov,
			                  .desc = &sb.desc,
			                  .iov_count = 1,
			                  .addr = self,
			                  .rma_iov = &rma,
			                  .rma_iov_count = 1 };
		POST(a, "fi_writemsg", fi_writemsg(a->ep, &msg, FI_INJECT | FI_DELIVERY_COMPLETE));
	}
	issued += NPUT;
	ret = fi_cntr_wait(put, issued, 200);
	out(a,
	    "fi_writemsg(FI_INJECT|FI_DELIVERY_COMPLETE) x%d, then fi_cntr_wait(put counter, %llu, "
	    "200 ms) = %s: counter %llu, landed %d of %d (target endpoint not driven)",
	    NPUT, (unsigned long long)issued, errname(ret), (unsigned long long)fi_cntr_read(put),
	    landed(t, 3), NPUT);
	DRIVE_BOTH(issued, 3);
	out(a, "after driving the target endpoint: put counter %llu, landed %d of %d",
	    (unsigned long long)fi_cntr_read(put), landed(t, 3), NPUT);
	out(a, "put counter errors %llu; fi_cq_read on the selective CQ = %s",
	    (unsigned long long)fi_cntr_readerr(put), errname((int)fi_cq_read(cq, &e, 1)));

	app_barrier(a);
	app_finish(a, 0);
}
