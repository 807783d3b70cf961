/* examples/runtime, progress: this rank's endpoint is driven only here (manual progress). It
 * reads both CQs (the transmit one through compcntr's CQ bridge, which counts sends and writes),
 * checks every data message received, reposts its buffer and owes its sender a credit, counts
 * returned credits into the senders' counters, and returns owed credits: into a local peer's
 * shared counter at once, to a remote one in batches of zero-byte messages. rt_progress is the
 * progress function of every compcntr wait of the engine.
 */
#define _GNU_SOURCE
#include "rt_internal.h"

#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_BATCH 64

/* A receive queue that stays full is a setup error (more buffers than the provider's
 * receive queue holds): bounded, never a hang. */
static int rx_full(struct rt *rt, double *deadline, const char *what)
{
	if (*deadline == 0)
		*deadline = now_s() + rt->o.timeout_ms / 1e3;
	fi_cq_read(rt->rxcq, NULL, 0); /* drives progress without consuming entries */
	if (now_s() < *deadline)
		return 0;
	return rt_fail(rt,
	               "fi_trecv(%s) kept returning -FI_EAGAIN: the receive queue holds %zu "
	               "entries, fewer than the buffers to post (lower --window)",
	               what, rt->info->rx_attr->size);
}

int rt_post_data_recv(struct rt *rt, struct peer *p, struct rx_slot *s)
{
	ssize_t r;
	double deadline = 0;
	while ((r = fi_trecv(rt->ep, s->buf, rt->o.size, rt->rdesc, FI_ADDR_UNSPEC,
	                     TAG_DATA | s->src, 0, &s->ctx)) == -FI_EAGAIN)
		if (rx_full(rt, &deadline, "data"))
			return -1;
	if (r)
		return rt_fail(rt, "fi_trecv(data from rank %u): %s", s->src, fi_strerror((int)-r));
	p->posted++;
	return 0;
}

int rt_post_credit_recv(struct rt *rt, struct rx_slot *s)
{
	ssize_t r;
	double deadline = 0;
	while ((r = fi_trecv(rt->ep, NULL, 0, NULL, FI_ADDR_UNSPEC, TAG_CREDIT | s->src, 0,
	                     &s->ctx)) == -FI_EAGAIN)
		if (rx_full(rt, &deadline, "credits"))
			return -1;
	if (r)
		return rt_fail(rt, "fi_trecv(credits from rank %u): %s", s->src,
		               fi_strerror((int)-r));
	return 0;
}

/* Returns owed credits to every source that has a batch ready (or its last ones). A send that
 * would block (-FI_EAGAIN) is left owed for the next progress call. */
static int send_credits(struct rt *rt)
{
	int sent = 0;
	for (int s = 0; s < rt->size; s++) {
		struct peer *p = &rt->peers[s];
		if (s == rt->rank || p->owed == 0)
			continue;
		if (p->shm_credit) { /* a rank of this node: into its counter, at once, no message */
			p->returned += p->owed;
			compcntr_inc_comp_cntr(p->shm_credit,
			                       p->owed); /* wakes a waiting acquire */
			p->owed = 0;
			rt->st.credit_incs++;
			sent++;
			continue;
		}
		if (p->owed < rt->o.batch && p->received < rt->round_end)
			continue;
		/* A context is reused only in a later round, after every send of this one completed. */
		const ssize_t r = fi_tsenddata(rt->ep, NULL, 0, NULL, p->owed, p->addr,
		                               TAG_CREDIT | (uint64_t)rt->rank,
		                               &p->cctx[p->credit_msgs % p->ncctx]);
		if (r == -FI_EAGAIN)
			continue;
		if (r) {
			rt_fail(rt, "fi_tsenddata(credits to rank %d): %s", s,
			        fi_strerror((int)-r));
			exit(5);
		}
		p->returned += p->owed;
		p->owed = 0;
		p->credit_msgs++;
		rt->tx_posted++;
		rt->st.credit_msgs_sent++;
		sent++;
	}
	return sent;
}

static void on_data(struct rt *rt, struct rx_slot *slot, const struct fi_cq_tagged_entry *e)
{
	struct peer *p = &rt->peers[slot->src];
	const struct rt_opts *o = &rt->o;
	struct rt_msg_hdr h;
	memcpy(&h, slot->buf, sizeof h);
	const char *payload = slot->buf + sizeof h;
	const size_t plen = o->size - sizeof h;
	int ok = e->len == o->size && h.src == slot->src && h.dst == (uint32_t)rt->rank &&
	         h.seq >= rt->round_base && h.seq < rt->round_end &&
	         h.sum == rt_msg_sum(&h, payload, plen);
	for (size_t i = 0; ok && i < plen; i++)
		ok = (unsigned char)payload[i] == rt_payload_byte(h.src, h.dst, h.seq, i);
	if (!ok) {
		rt->st.bad_payload++;
	} else {
		const uint64_t bit = h.seq - rt->round_base;
		if (p->seen[bit / 8] & (1u << (bit % 8)))
			rt->st.duplicates++;
		p->seen[bit / 8] |= (uint8_t)(1u << (bit % 8));
		if (h.seq != p->received)
			rt->st.out_of_order++;
		/* Credit discipline, checked by the receiver independently of the sender's tracker:
		 * the sender may send message seq only while seq < my window + the credits it had
		 * received from me, and it cannot have received more than I returned. */
		if (o->flow && (h.seq >= (uint64_t)rt->st.my_window + h.credits_seen ||
		                h.credits_seen > p->returned))
			rt->st.credit_violations++;
		p->sum_from += h.sum;
	}
	p->received++;
	rt->st.received++;
	/* The buffer goes back first, then its credit: a credit always stands for a posted buffer.
	 * A buffer that cannot be reposted must not be credited (the sender would overrun the
	 * window and the check could not tell): fatal, like the other progress errors. */
	if (p->posted < rt->round_end && rt_post_data_recv(rt, p, slot))
		exit(5);
	if (o->flow)
		p->owed++;
}

static void on_credit(struct rt *rt, struct rx_slot *slot, const struct fi_cq_tagged_entry *e)
{
	struct peer *p = &rt->peers[slot->src];
	p->got += e->data;
	compcntr_inc_comp_cntr(rt->cc_credit[slot->src], e->data); /* wakes a waiting acquire */
	if (rt_post_credit_recv(rt, slot))
		exit(5);
}

static void idle_yield(struct rt *rt)
{
	rt->callbacks.alive(rt->callbacks.ctx);
	sched_yield();
}

int rt_progress_n(struct rt *rt)
{
	int n = 0;
	const ssize_t b = compcntr_fi_bridge_progress(rt->br);
	if (b > 0)
		n += (int)b;
	struct fi_cq_tagged_entry e[RX_BATCH];
	for (;;) {
		const ssize_t r = fi_cq_read(rt->rxcq, e, RX_BATCH);
		if (r == -FI_EAGAIN || r == 0)
			break;
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry err;
			memset(&err, 0, sizeof err);
			if (fi_cq_readerr(rt->rxcq, &err, 0) == 1) {
				rt->st.rx_errors++;
				compcntr_inc_err_comp_cntr(rt->cc_recvs, 1);
				struct rx_slot *s = err.op_context;
				fprintf(stderr,
				        "runtime: rank %d: receive error (%s) from rank %u%s\n",
				        rt->rank, fi_strerror(err.err), s ? s->src : 0u,
				        err.err == FI_ETRUNC
				                ? ": truncated (no buffer large enough)"
				                : "");
				n++;
			}
			continue;
		}
		if (r < 0) {
			rt_fail(rt, "fi_cq_read(receive CQ): %s", fi_strerror((int)-r));
			exit(5);
		}
		for (ssize_t i = 0; i < r; i++) {
			struct rx_slot *s = e[i].op_context;
			compcntr_inc_comp_cntr(rt->cc_recvs, 1);
			if ((e[i].tag & TAG_KIND_MASK) == TAG_CREDIT)
				on_credit(rt, s, &e[i]);
			else
				on_data(rt, s, &e[i]);
		}
		n += (int)r;
		if (r < RX_BATCH)
			break;
	}
	n += send_credits(rt);
	if ((++rt->tick & 255) == 0)
		rt_live_tick(rt, 0);
	if ((rt->tick & 63) == 0)
		rt->callbacks.alive(rt->callbacks.ctx);
	return n;
}

/* The progress function of every compcntr wait here. A wait that found nothing to do gives the
 * CPU away: with more ranks than cores (or a busy machine) the peer whose credits or
 * completions this rank waits for needs the core to produce them (MPI's yield-when-idle).
 * (Sleeping on the CQs' FI_WAIT_FD instead was measured on tcp;ofi_rxm: with manual progress
 * the fd is not signalled by arriving data, so such a sleep lasts its whole timeout.) */
void rt_progress(void *v)
{
	struct rt *rt = v;
	if (rt_progress_n(rt) != 0) {
		rt->idle = 0;
		return;
	}
	/* A short wait (an RMA write's completion, a credit already on the wire) stays hot: the
	 * core is given away only after 16 empty calls in a row. */
	if (++rt->idle >= 16)
		idle_yield(rt);
}

void rt_tx_progress(void *v)
{
	struct rt *rt = v;
	if (compcntr_fi_bridge_progress(rt->br) > 0) {
		rt->idle = 0;
		return;
	}
	if (++rt->idle >= 16)
		idle_yield(rt);
}
