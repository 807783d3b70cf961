/* examples/runtime, credits + messages: the messaging phase. Before each data message the
 * sender takes one credit of its destination from compcntr's credit tracker (waiting, with
 * progress, while that peer's window is full), then posts it with fi_tsend; at the end it waits
 * until everything it should receive arrived, every credit it took came back (flush) and every
 * send completed. Also the message format (payload, checksum), barriers that keep the endpoint
 * served, and the rounds of the benchmark.
 */
#define _GNU_SOURCE
#include "rt_internal.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 0x100000001b3ull;
	return h;
}

unsigned char rt_payload_byte(uint32_t src, uint32_t dst, uint64_t seq, size_t i)
{
	return (unsigned char)(src * 131u + dst * 31u + seq * 7u + i * 13u + 1u);
}

uint64_t rt_msg_sum(const struct rt_msg_hdr *h, const char *payload, size_t n)
{
	uint64_t s = 0xcbf29ce484222325ull;
	s = fnv(s, &h->src, sizeof h->src);
	s = fnv(s, &h->dst, sizeof h->dst);
	s = fnv(s, &h->seq, sizeof h->seq);
	s = fnv(s, &h->credits_seen, sizeof h->credits_seen);
	return fnv(s, payload, n);
}

/* One credit of dst: admitted while sent - returned < dst's window; otherwise waits, driving
 * progress (which counts dst's credit messages into its counter). */
static int acquire_credit(struct rt *rt, int dst)
{
	struct peer *p = &rt->peers[dst];
	const struct rt_opts *o = &rt->o;
	const int r = compcntr_credits_acquire_ex(rt->cr, (uint32_t)dst, 1, 0, &rt->wa);
	if (r == ETIMEDOUT) {
		rt->st.acquire_waits++;
		const int r2 = compcntr_credits_acquire_ex(rt->cr, (uint32_t)dst, 1, o->timeout_ms,
		                                           &rt->wa);
		if (r2)
			return rt_fail(
			        rt,
			        "no credit from rank %d for %d ms (%s; sent %" PRIu64
			        ", credits back %" PRIu64 ", window %" PRIu64 "): is it alive?",
			        dst, o->timeout_ms, r2 == ETIMEDOUT ? "ETIMEDOUT" : strerror(r2),
			        p->sent, read_cc(rt->cc_credit[dst]), p->window);
	} else if (r) {
		return rt_fail(rt, "compcntr_credits_acquire(rank %d): %s", dst, strerror(r));
	}
	/* In flight to dst right after admission, counted two ways: the tracker's
	 * outstanding, and this program's own sent - credits received. */
	uint64_t out = 0;
	const int ro = compcntr_credits_outstanding(rt->cr, (uint32_t)dst, &out);
	const uint64_t mine = p->sent + 1 - read_cc(rt->cc_credit[dst]);
	/* EOVERFLOW (more credits back than taken) is a violation too, not "0 in flight". */
	if (ro != 0 || out > p->window || mine > p->window)
		rt->st.inflight_violations++;
	if (mine > rt->st.max_inflight) {
		rt->st.max_inflight = mine;
		rt->st.max_inflight_window = p->window;
	}
	return 0;
}

static int send_one(struct rt *rt, int dst)
{
	struct peer *p = &rt->peers[dst];
	const struct rt_opts *o = &rt->o;
	if (o->flow && acquire_credit(rt, dst))
		return -1;
	char *buf = p->sbuf + (p->sent - rt->round_base) * o->size;
	struct rt_msg_hdr h = { (uint32_t)rt->rank, (uint32_t)dst, p->sent,
		                read_cc(rt->cc_credit[dst]), 0 };
	char *payload = buf + sizeof h;
	const size_t plen = o->size - sizeof h;
	for (size_t i = 0; i < plen; i++)
		payload[i] = (char)rt_payload_byte(h.src, h.dst, h.seq, i);
	h.sum = rt_msg_sum(&h, payload, plen);
	memcpy(buf, &h, sizeof h);
	ssize_t r;
	const double deadline = now_s() + o->timeout_ms / 1e3;
	while ((r = fi_tsend(rt->ep, buf, o->size, rt->sdesc, p->addr,
	                     TAG_DATA | (uint64_t)rt->rank, &p->sctx[p->sent - rt->round_base])) ==
	       -FI_EAGAIN) {
		if (rt_progress_n(rt) == 0)
			sched_yield();
		if (now_s() > deadline)
			return rt_fail(rt,
			               "fi_tsend to rank %d kept returning -FI_EAGAIN for %d ms",
			               dst, o->timeout_ms);
	}
	if (r)
		return rt_fail(rt, "fi_tsend(rank %d): %s", dst, fi_strerror((int)-r));
	p->sum_to += h.sum;
	p->sent++;
	rt->st.sent++;
	rt->tx_posted++;
	rt->callbacks.sent(rt->callbacks.ctx, rt->st.sent);
	return 0;
}

int rt_drive_until(struct rt *rt, int (*done)(struct rt *), const char *what)
{
	const double deadline = now_s() + rt->o.timeout_ms / 1e3;
	while (!done(rt)) {
		if (rt_progress_n(rt) == 0)
			sched_yield();
		if (now_s() > deadline)
			return rt_fail(rt, "timed out after %d ms waiting for %s", rt->o.timeout_ms,
			               what);
	}
	return 0;
}

static int all_received(struct rt *rt)
{
	for (int s = 0; s < rt->size; s++)
		if (s != rt->rank && (rt->peers[s].received < rt->round_end || rt->peers[s].owed))
			return 0;
	return 1;
}

int rt_messages(struct rt *rt)
{
	const struct rt_opts *o = &rt->o;
	rt->phase = PHASE_MESSAGES;
	const double t0 = now_s();
	/* Round-robin over the peers, each rank starting after itself: every rank streams to
	 * every other one at once. */
	for (uint64_t k = 0; k < o->msgs; k++) {
		for (int d = 1; d < rt->size; d++)
			if (send_one(rt, (rt->rank + d) % rt->size))
				return -1;
		if ((k & 15) == 15)
			rt_progress_n(rt);
	}
	if (rt_drive_until(rt, all_received, "every message from every rank")) {
		for (int s = 0; s < rt->size; s++)
			if (s != rt->rank && rt->peers[s].received < rt->round_end)
				fprintf(stderr,
				        "runtime: rank %d: got %" PRIu64 " of %" PRIu64
				        " messages from rank %d\n",
				        rt->rank, rt->peers[s].received - rt->round_base, o->msgs,
				        s);
		return -1;
	}
	if (o->flow)
		for (int d = 0; d < rt->size; d++) {
			if (d == rt->rank)
				continue;
			/* Every credit taken for dst has come back: all my messages to it are consumed. */
			const int r = compcntr_credits_flush_ex(rt->cr, (uint32_t)d, o->timeout_ms,
			                                        &rt->wa);
			if (r)
				return rt_fail(rt,
				               "credits_flush(rank %d): %s (credits back %" PRIu64
				               " of %" PRIu64 ")",
				               d, strerror(r), read_cc(rt->cc_credit[d]),
				               rt->peers[d].sent);
		}
	/* Every send posted (data and credits) has completed locally. */
	const int r =
	        compcntr_wait_comp_cntr_ex(rt->cc_sends, rt->tx_posted, o->timeout_ms, &rt->wa);
	if (r)
		return rt_fail(rt,
		               "waiting for %" PRIu64 " send completions (have %" PRIu64
		               ", %" PRIu64 " errors): %s",
		               rt->tx_posted, read_cc(rt->cc_sends), read_cc_err(rt->cc_sends),
		               strerror(r));
	rt->st.msg_seconds = now_s() - t0;
	return 0;
}

int rt_barrier(struct rt *rt)
{
	/* Everyone arrives; meanwhile this rank keeps serving its endpoint (a peer may still need
	 * it to deliver or complete something), so the barrier is non-blocking. */
	MPI_Request req;
	MPI_Ibarrier(MPI_COMM_WORLD, &req);
	const double deadline = now_s() + rt->o.timeout_ms / 1e3;
	for (int flag = 0; !flag;) {
		if (rt_progress_n(rt) == 0)
			sched_yield();
		MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
		if (!flag && now_s() > deadline)
			return rt_fail(rt, "timed out in a barrier");
	}
	return 0;
}

int rt_next_round(struct rt *rt)
{
	const struct rt_opts *o = &rt->o;
	rt->round_base += o->msgs;
	rt->round_end += o->msgs;
	/* The previous round ended with every buffer consumed and every send complete: the slots,
	 * send buffers and contexts are free again. */
	for (int i = 0; i < rt->size; i++) {
		struct peer *p = &rt->peers[i];
		if (i == rt->rank)
			continue;
		memset(p->seen, 0, o->msgs / 8 + 1);
		for (uint32_t k = 0; k < p->nrx && k < o->msgs; k++)
			if (rt_post_data_recv(rt, p, &p->rx[k]))
				return -1;
	}
	return rt_barrier(rt); /* every receive of the round is posted before anyone sends */
}
