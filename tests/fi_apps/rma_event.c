/* RMA writes and reads with counters on both sides. The client writes NWRITE blocks into the
 * server's registered buffer and reads NREAD blocks back from a region the server filled; its
 * write and read counters (FI_WRITE, FI_READ) say when they completed. Where the provider has
 * FI_RMA_EVENT, the server learns of the remote accesses only through its target counters
 * (FI_REMOTE_WRITE, FI_REMOTE_READ bound to the endpoint; no CQ entry is written for them) and
 * then checks the data; it also tries to bind a third counter to the memory region itself
 * (fi_mr_bind with FI_REMOTE_WRITE) and prints what the provider answers. Where the provider has
 * no FI_RMA_EVENT, both sides print "FI_RMA_EVENT not supported by <prov>" and the client's
 * writes and reads run with initiator counters only.
 *
 * Prints the counter values, the data checks, and the number of fi_cntr_open calls.
 */
#include "fi_apps.h"

#define NWRITE 8
#define WSZ 512
#define NREAD 4
#define RSZ 1024
#define BUFSZ 65536
#define READ_OFF 32768

static char wpat(size_t i)
{
	return (char)(i * 3 + 7);
}
static char rpat(size_t i)
{
	return (char)(i * 11 + 5);
}

int main(int argc, char **argv)
{
	struct app A, *a = &A;
	app_start(a, argc, argv);

	app_hints(a, FI_MSG | FI_RMA | FI_RMA_EVENT);
	int ret = app_getinfo(a);
	int events = ret == 0;
	if (ret == -FI_ENODATA) {
		out(a,
		    "FI_RMA_EVENT not supported by %s (fi_getinfo = %s): initiator counters only",
		    a->prov, errname(ret));
		app_hints(a, FI_MSG | FI_RMA);
		ret = app_getinfo(a);
	}
	if (ret)
		die(a, "fi_getinfo(%s, FI_EP_RDM, FI_MSG|FI_RMA%s) = %s", a->prov,
		    events ? "|FI_RMA_EVENT" : "", errstr(ret));
	if (events && !(a->info->caps & FI_RMA_EVENT))
		die(a, "fi_getinfo returned an fi_info without the FI_RMA_EVENT asked for");
	app_open(a);
	struct fid_cq *cq = app_cq(a, FI_WAIT_NONE);
	struct fid_cntr *wc = NULL, *rc = NULL, *rwc = NULL, *rrc = NULL, *mrc = NULL;
	if (a->role == ROLE_CLIENT) {
		wc = app_cntr(a, FI_WAIT_UNSPEC, "write counter");
		rc = app_cntr(a, FI_WAIT_UNSPEC, "read counter");
	} else if (events) {
		rwc = app_cntr(a, FI_WAIT_UNSPEC, "remote write counter");
		rrc = app_cntr(a, FI_WAIT_UNSPEC, "remote read counter");
		mrc = app_cntr(a, FI_WAIT_UNSPEC, "memory region counter");
	}
	app_endpoint(a);
	app_bind(a, &cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION,
	         "CQ, FI_SELECTIVE_COMPLETION");
	if (wc) {
		app_bind(a, &wc->fid, FI_WRITE, "write counter, FI_WRITE");
		app_bind(a, &rc->fid, FI_READ, "read counter, FI_READ");
	}
	if (rwc) {
		app_bind(a, &rwc->fid, FI_REMOTE_WRITE, "remote write counter, FI_REMOTE_WRITE");
		app_bind(a, &rrc->fid, FI_REMOTE_READ, "remote read counter, FI_REMOTE_READ");
	}
	struct app_buf buf;
	int mr_bound = 0;
	if (a->role == ROLE_SERVER) {
		app_mr(a, &buf, BUFSZ, FI_REMOTE_WRITE | FI_REMOTE_READ);
		for (size_t i = 0; i < BUFSZ - READ_OFF; i++)
			buf.p[READ_OFF + i] = rpat(i);
		if (mrc) {
			ret = fi_mr_bind(buf.mr, &mrc->fid, FI_REMOTE_WRITE);
			out(a, "fi_mr_bind(memory region, counter, FI_REMOTE_WRITE) = %s",
			    errname(ret));
			mr_bound = ret == 0;
			if (mr_bound && (a->info->domain_attr->mr_mode & FI_MR_ENDPOINT))
				CHECK(a, fi_mr_enable(buf.mr));
		}
	} else {
		app_mr(a, &buf, BUFSZ, FI_WRITE | FI_READ);
	}
	app_connect(a);

	if (a->role == ROLE_SERVER) {
		oob_send_u64(a, (uint64_t)(uintptr_t)buf.p);
		oob_send_u64(a, buf.key);
		if (events) {
			wait_cntr(a, rwc, NWRITE, "remote write counter");
			size_t bad = 0;
			for (size_t i = 0; i < NWRITE * WSZ; i++)
				bad += buf.p[i] != wpat(i);
			out(a,
			    "remote write counter %llu (errors %llu); bytes written that differ: "
			    "%zu",
			    (unsigned long long)fi_cntr_read(rwc),
			    (unsigned long long)fi_cntr_readerr(rwc), bad);
			wait_cntr(a, rrc, NREAD, "remote read counter");
			out(a, "remote read counter %llu (errors %llu)",
			    (unsigned long long)fi_cntr_read(rrc),
			    (unsigned long long)fi_cntr_readerr(rrc));
			if (mr_bound) {
				wait_cntr(a, mrc, NWRITE, "memory region counter");
				out(a, "memory region counter %llu (errors %llu)",
				    (unsigned long long)fi_cntr_read(mrc),
				    (unsigned long long)fi_cntr_readerr(mrc));
			}
		}
		app_barrier(a); /* the client's counters are final */
		if (events) {
			/* nothing else arrived after the client was done */
			out(a, "after the client finished: remote write %llu, remote read %llu%s",
			    (unsigned long long)fi_cntr_read(rwc),
			    (unsigned long long)fi_cntr_read(rrc),
			    mr_bound ? "" : " (memory region counter not bound)");
			if (mr_bound)
				out(a, "after the client finished: memory region counter %llu",
				    (unsigned long long)fi_cntr_read(mrc));
		} else {
			out(a, "target side: no counter can see the remote accesses; writes not "
			       "checked here");
		}
	} else {
		uint64_t base = oob_recv_u64(a), key = oob_recv_u64(a);
		struct fi_context ctx[NWRITE + NREAD];
		for (size_t i = 0; i < NWRITE * WSZ; i++)
			buf.p[i] = wpat(i);
		for (int i = 0; i < NWRITE; i++)
			POST(a, "fi_write",
			     fi_write(a->ep, buf.p + i * WSZ, WSZ, buf.desc, a->peer,
			              app_raddr(a, base, (uint64_t)i * WSZ), key, &ctx[i]));
		wait_cntr(a, wc, NWRITE, "write counter");
		for (int i = 0; i < NREAD; i++)
			POST(a, "fi_read",
			     fi_read(a->ep, buf.p + READ_OFF + i * RSZ, RSZ, buf.desc, a->peer,
			             app_raddr(a, base, READ_OFF + (uint64_t)i * RSZ), key,
			             &ctx[NWRITE + i]));
		wait_cntr(a, rc, NREAD, "read counter");
		size_t bad = 0;
		for (size_t i = 0; i < NREAD * RSZ; i++)
			bad += buf.p[READ_OFF + i] != rpat(i);
		out(a,
		    "write counter %llu (errors %llu); read counter %llu (errors %llu); bytes read "
		    "that differ: %zu",
		    (unsigned long long)fi_cntr_read(wc), (unsigned long long)fi_cntr_readerr(wc),
		    (unsigned long long)fi_cntr_read(rc), (unsigned long long)fi_cntr_readerr(rc),
		    bad);
		app_barrier(a);
	}
	struct fi_cq_data_entry e;
	ret = (int)fi_cq_read(cq, &e, 1);
	out(a, "fi_cq_read on the selective CQ = %s", errname(ret));
	app_barrier(a);
	app_finish(a, 0);
}
