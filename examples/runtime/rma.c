/* examples/runtime, RMA + quiet: the RMA phase, shmem_put / shmem_quiet done with compcntr's
 * completion tracker. compcntr_tracker_issue before every fi_write, and a quiet after every
 * batch of writes to all peers: it returns once every write issued so far has completed (the
 * tracker's counter is fed by the CQ bridge on the transmit CQ, FI_WRITE), EIO if one failed.
 * Then every rank checks, driving progress, that its peers' writes landed in its window.
 */
#define _GNU_SOURCE
#include "rt_internal.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <string.h>

unsigned char rt_rma_byte(uint32_t src, uint32_t dst, uint64_t j, size_t i)
{
	return (unsigned char)(src * 17u + dst * 101u + j * 3u + i * 29u + 5u);
}

int rt_post_write(struct rt *rt, int dst, uint64_t j)
{
	struct peer *p = &rt->peers[dst];
	const struct rt_opts *o = &rt->o;
	char *from = rt->src + ((size_t)dst * o->writes + j) * o->wsize;
	const uint64_t to = p->win_addr + ((uint64_t)rt->rank * o->writes + j) * o->wsize;
	compcntr_tracker_issue(rt->tr, 1); /* before the post: a quiet after it waits for it */
	ssize_t r;
	const double deadline = now_s() + o->timeout_ms / 1e3;
	while ((r = fi_write(rt->ep, from, o->wsize, rt->srcdesc, p->addr, to, p->win_key,
	                     &p->wctx[j])) == -FI_EAGAIN) {
		if (rt_progress_n(rt) == 0)
			sched_yield();
		if (now_s() > deadline)
			return rt_fail(rt, "fi_write to rank %d kept returning -FI_EAGAIN", dst);
	}
	if (r)
		return rt_fail(rt, "fi_write(rank %d): %s", dst, fi_strerror((int)-r));
	rt->writes_posted++;
	rt->st.writes++;
	return 0;
}

static int quiet(struct rt *rt)
{
	const int r = compcntr_tracker_quiet_ex(rt->tr, rt->o.timeout_ms, &rt->wa_tx);
	rt->st.quiets++;
	if (r == EIO) {
		rt->st.quiet_eio++;
		return rt_fail(rt, "quiet: an RMA write failed (%" PRIu64 " write errors)",
		               read_cc_err(rt->cc_writes));
	}
	if (r)
		return rt_fail(
		        rt, "quiet: %s after %d ms (%" PRIu64 " of %" PRIu64 " writes completed)",
		        strerror(r), rt->o.timeout_ms, compcntr_tracker_completed(rt->tr),
		        compcntr_tracker_issued(rt->tr));
	return 0;
}

static uint64_t window_mismatches(struct rt *rt)
{
	const struct rt_opts *o = &rt->o;
	uint64_t bad = 0;
	for (int s = 0; s < rt->size; s++) {
		if (s == rt->rank)
			continue;
		for (uint64_t j = 0; j < o->writes; j++) {
			const char *w = rt->window + ((size_t)s * o->writes + j) * o->wsize;
			for (size_t b = 0; b < o->wsize; b++)
				bad += (unsigned char)w[b] !=
				       rt_rma_byte((uint32_t)s, (uint32_t)rt->rank, j, b);
		}
	}
	return bad;
}

static int window_ok(struct rt *rt)
{
	return window_mismatches(rt) == 0;
}

int rt_rma(struct rt *rt)
{
	const struct rt_opts *o = &rt->o;
	rt->phase = PHASE_RMA;
	for (uint64_t b = 0; b < o->writes; b += o->rma_batch) {
		for (int d = 1; d < rt->size; d++)
			for (uint64_t j = b; j < b + o->rma_batch && j < o->writes; j++)
				if (rt_post_write(rt, (rt->rank + d) % rt->size, j))
					return -1;
		if (quiet(rt))
			return -1; /* shmem_quiet: everything issued so far is complete */
	}
	if (quiet(rt))
		return -1; /* nothing new: returns at once */
	/* The writes of every peer land in this rank's window (the target drives progress too). */
	if (rt_drive_until(rt, window_ok,
	                   "the RMA writes of every rank to land in this rank's window")) {
		rt->st.window_bad = window_mismatches(rt);
		return -1;
	}
	return 0;
}
