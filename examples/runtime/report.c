/* examples/runtime, what the user sees: the live line rank 0 rewrites while the job runs
 * (--live; every rank sends it its counts), rt_finish (a barrier, then compcntr's counts and
 * the provider's own, exactly-once delivery and checksums per pair), and rt_report (rank 0:
 * the per-rank table and the checks, PASS or FAIL).
 */
#define _GNU_SOURCE
#include "rt_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define LIVE_TAG 7001

/* ---- live display ----------------------------------------------------------------------- */

/* One line, rewritten in place ('\r'), short enough for an 80-column terminal with 4 ranks:
 * each rank's share of its messages sent (or "rma", "done"), then the job's totals. */
static void live_print(struct rt *rt)
{
	const struct rt_opts *o = &rt->o;
	const uint64_t per_rank = o->msgs * (uint64_t)(rt->size - 1);
	uint64_t recv = 0;
	const uint64_t total = per_rank * (uint64_t)rt->size;
	char line[256];
	int n = snprintf(line, sizeof line, "\r  live:");
	for (int r = 0; r < rt->size && n < (int)sizeof line - 48; r++) {
		const struct live_msg *m = &rt->live_all[r];
		recv += m->received;
		if (m->phase == PHASE_RMA || m->phase == PHASE_DONE)
			n += snprintf(line + n, sizeof line - (size_t)n, " r%d:%-4s", r,
			              m->phase == PHASE_RMA ? "rma" : "done");
		else
			n += snprintf(line + n, sizeof line - (size_t)n, " r%d:%3d%%", r,
			              per_rank ? (int)(100 * m->sent / per_rank) : 100);
	}
	const double dt = now_s() - rt->live_t0;
	snprintf(line + n, sizeof line - (size_t)n,
	         " | %" PRIu64 "k/%" PRIu64 "k delivered, %.0fk msg/s ", recv / 1000, total / 1000,
	         dt > 0 ? (double)recv / dt / 1e3 : 0.0);
	fputs(line, stdout);
	fflush(stdout);
	rt->live_printed = 1;
}

void rt_live_tick(struct rt *rt, int force)
{
	if (!rt->o.live)
		return;
	const double t = now_s();
	if (!force && t < rt->next_live)
		return;
	rt->next_live = t + 0.1;
	rt->live_out.rank = rt->rank;
	rt->live_out.phase = rt->phase;
	rt->live_out.sent = rt->st.sent;
	rt->live_out.received = rt->st.received;
	rt->live_out.writes = rt->writes_posted;
	if (rt->rank == 0) {
		rt->live_all[0] = rt->live_out;
		int flag = 1;
		while (flag) {
			MPI_Status s;
			MPI_Iprobe(MPI_ANY_SOURCE, LIVE_TAG, MPI_COMM_WORLD, &flag, &s);
			if (flag) {
				struct live_msg m;
				MPI_Recv(&m, sizeof m, MPI_BYTE, s.MPI_SOURCE, LIVE_TAG,
				         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				if (m.rank >= 0 && m.rank < rt->size)
					rt->live_all[m.rank] = m;
			}
		}
		live_print(rt);
	} else {
		int done = 1;
		if (rt->live_req != MPI_REQUEST_NULL)
			MPI_Test(&rt->live_req, &done, MPI_STATUS_IGNORE);
		if (done) {
			static struct live_msg out; /* stays valid while the Isend is in flight */
			out = rt->live_out;
			MPI_Isend(&out, sizeof out, MPI_BYTE, 0, LIVE_TAG, MPI_COMM_WORLD,
			          &rt->live_req);
		}
	}
}

/* The provider's own count once it has caught up with compcntr's. fi_cntr(3) lets a counter
 * show a completion later than the CQ entry (or compcntr's count) that reported it: through the
 * compcntr hook with its progress thread, fi_cntr_read is a load of what the thread last
 * pulled, up to a round late. So wait (at most 1 s) for the value compcntr counted, then read:
 * a provider that counted less still reads less after the wait, one that counted more at once,
 * and the check below stays exact. */
static uint64_t read_provider(struct fid_cntr *c, uint64_t expect)
{
	(void)fi_cntr_wait(c, expect, 1000); /* -FI_ETIMEDOUT / -FI_EAVAIL: the read says it */
	return fi_cntr_read(c);
}

/* ---- the end ---------------------------------------------------------------------------- */

int rt_finish(struct rt *rt, struct rt_stats *st)
{
	rt->phase = PHASE_DONE;
	rt_live_tick(rt, 1);
	if (rt->o.live && rt->rank != 0) {
		if (rt->live_req != MPI_REQUEST_NULL)
			MPI_Wait(&rt->live_req, MPI_STATUS_IGNORE);
		struct live_msg m = rt->live_out;
		m.phase = PHASE_DONE;
		MPI_Send(&m, sizeof m, MPI_BYTE, 0, LIVE_TAG, MPI_COMM_WORLD);
	}
	if (rt_barrier(rt))
		return -1;
	if (rt->o.live && rt->rank == 0) {
		for (int r = 1; r < rt->size; r++)
			while (rt->live_all[r].phase != PHASE_DONE) {
				struct live_msg m;
				MPI_Status s;
				MPI_Recv(&m, sizeof m, MPI_BYTE, MPI_ANY_SOURCE, LIVE_TAG,
				         MPI_COMM_WORLD, &s);
				if (m.rank >= 0 && m.rank < rt->size)
					rt->live_all[m.rank] = m;
			}
		live_print(rt);
		fputc('\n', stdout);
		fflush(stdout);
	}
	rt_progress_n(rt);
	/* compcntr's counts against the provider's own counters. */
	rt->st.cc_sends = read_cc(rt->cc_sends);
	rt->st.cc_writes = read_cc(rt->cc_writes);
	rt->st.cc_recvs = read_cc(rt->cc_recvs);
	rt->st.cc_puts = rt->cc_puts ? read_cc(rt->cc_puts) : 0;
	rt->st.cc_errors =
	        read_cc_err(rt->cc_sends) + read_cc_err(rt->cc_writes) + read_cc_err(rt->cc_recvs);
	rt->st.pv_sends = read_provider(rt->pv_send, rt->st.cc_sends);
	rt->st.pv_recvs = read_provider(rt->pv_recv, rt->st.cc_recvs);
	rt->st.pv_writes = read_provider(rt->pv_write, rt->st.cc_writes);
	rt->st.pv_errors = fi_cntr_readerr(rt->pv_send) + fi_cntr_readerr(rt->pv_recv) +
	                   fi_cntr_readerr(rt->pv_write);
	rt->st.tx_errors = read_cc_err(rt->cc_sends) + read_cc_err(rt->cc_writes);
	/* exactly once: every sequence number seen */
	for (int s = 0; s < rt->size; s++) {
		if (s == rt->rank)
			continue;
		for (uint64_t k = 0; k < rt->o.msgs; k++) /* this round's */
			if (!(rt->peers[s].seen[k / 8] & (1u << (k % 8))))
				rt->st.missing++;
		rt->st.credits_returned += rt->peers[s].returned;
		if (rt->peers[s].shm_credit)
			rt->st.credits_shm += rt->peers[s].returned;
		rt->st.credits_got += read_cc(rt->cc_credit[s]); /* by message or shared counter */
	}
	/* checksums: what each source sent me (its sum_to[me]) against what I received */
	const size_t n = (size_t)rt->size;
	uint64_t *to = calloc(n, sizeof *to), *from = calloc(n, sizeof *from);
	if (!to || !from)
		return rt_fail(rt, "out of memory");
	for (size_t i = 0; i < n; i++)
		to[i] = rt->peers[i].sum_to;
	MPI_Alltoall(to, 1, MPI_UINT64_T, from, 1, MPI_UINT64_T, MPI_COMM_WORLD);
	for (size_t i = 0; i < n; i++)
		if (i != (size_t)rt->rank && from[i] != rt->peers[i].sum_from)
			rt->st.pair_sum_mismatch++;
	free(to);
	free(from);
	*st = rt->st;
	return 0;
}

/* ---- the report ------------------------------------------------------------------------- */

static const char *verdict(int ok)
{
	return ok ? "PASS" : "FAIL";
}

int rt_report(const struct rt_opts *o, const struct rt_stats *all, int nranks, double wall)
{
	const uint64_t per_pair = o->msgs;
	const uint64_t expected = per_pair * (uint64_t)nranks * (uint64_t)(nranks - 1);
	printf("\n  %-4s %9s %9s %8s %9s %8s %6s %6s %19s %19s %15s %6s %9s\n", "rank", "sent",
	       "received", "window", "inflight", "credits", "waits", "quiets", "sends cc/provider",
	       "recvs cc/provider", "writes cc/prov", "errors", "msg/s");
	uint64_t sent = 0, received = 0, bad = 0, dup = 0, missing = 0, credit_viol = 0,
	         inflight_viol = 0, errors = 0, mismatch_counts = 0, window_bad = 0, writes = 0,
	         quiet_eio = 0, sums = 0, ooo = 0, cr_returned = 0, cr_counted = 0, puts = 0,
	         puts_done = 0, puts_landed = 0, fi_writes = 0;
	uint64_t max_inflight = 0, max_window = 0;
	for (int r = 0; r < nranks; r++) {
		const struct rt_stats *s = &all[r];
		char sends[32], recvs[32], wr[32], infl[32];
		snprintf(sends, sizeof sends, "%" PRIu64 "/%" PRIu64, s->cc_sends, s->pv_sends);
		snprintf(recvs, sizeof recvs, "%" PRIu64 "/%" PRIu64, s->cc_recvs, s->pv_recvs);
		snprintf(wr, sizeof wr, "%" PRIu64 "/%" PRIu64, s->cc_writes, s->pv_writes);
		snprintf(infl, sizeof infl, "%" PRIu64 "/%" PRIu64, s->max_inflight,
		         s->max_inflight_window);
		printf("  %-4d %9" PRIu64 " %9" PRIu64 " %8u %9s %8" PRIu64 " %6" PRIu64
		       " %6" PRIu64 " %19s %19s %15s %6" PRIu64 " %9.0f\n",
		       s->rank, s->sent, s->received, s->my_window, infl, s->credits_returned,
		       s->acquire_waits, s->quiets, sends, recvs, wr,
		       s->cc_errors + s->pv_errors + s->rx_errors,
		       s->msg_seconds > 0 ? (double)s->sent / s->msg_seconds : 0.0);
		sent += s->sent;
		received += s->received;
		bad += s->bad_payload;
		dup += s->duplicates;
		missing += s->missing;
		ooo += s->out_of_order;
		credit_viol += s->credit_violations;
		inflight_viol += s->inflight_violations;
		errors += s->cc_errors + s->pv_errors + s->rx_errors + s->tx_errors;
		mismatch_counts += (s->cc_sends != s->pv_sends) + (s->cc_recvs != s->pv_recvs) +
		                   (s->cc_writes != s->pv_writes) + (s->cc_errors != s->pv_errors) +
		                   (s->cc_puts != s->shm_puts); /* no provider: the puts made */
		window_bad += s->window_bad;
		writes += s->writes;
		quiet_eio += s->quiet_eio;
		sums += s->pair_sum_mismatch;
		cr_returned += s->credits_returned;
		cr_counted += s->credits_got;
		puts += s->shm_puts;
		puts_done += s->cc_puts;
		puts_landed += s->shm_landed;
		fi_writes += s->fi_writes;
		if (s->max_inflight > max_inflight) {
			max_inflight = s->max_inflight;
			max_window = s->max_inflight_window;
		}
	}
	printf("  (window: receive buffers the rank keeps posted per source; inflight: most "
	       "messages a rank had\n"
	       "   in flight to one peer, / that peer's window; credits: credits the rank "
	       "returned; waits:\n"
	       "   acquires that had to wait for credits; cc: compcntr's counters; provider: "
	       "libfabric's fid_cntr)\n");
	for (int r = 0; r < nranks; r++)
		printf("  rank %d peers: %u local (%" PRIu64 " credits returned by %" PRIu64
		       " shared-counter increments), %u remote (%" PRIu64 " credits by %" PRIu64
		       " libfabric messages)\n",
		       all[r].rank, all[r].local_peers, all[r].credits_shm, all[r].credit_incs,
		       all[r].remote_peers, all[r].credits_returned - all[r].credits_shm,
		       all[r].credit_msgs_sent);
	for (int r = 0; r < nranks; r++)
		printf("  rank %d RMA: %" PRIu64 " shared-memory puts to local peers (%" PRIu64
		       " of theirs counted landed here), %" PRIu64
		       " libfabric writes to remote peers\n",
		       all[r].rank, all[r].shm_puts, all[r].shm_landed, all[r].fi_writes);
	putchar('\n');
	int ok = 1, c;
	c = sent == expected && received == expected && bad == 0 && dup == 0 && missing == 0 &&
	    sums == 0;
	ok &= c;
	printf("  check: every message delivered exactly once with the right payload (%" PRIu64
	       " of %" PRIu64 ", bad %" PRIu64 ", duplicates %" PRIu64 ", missing %" PRIu64
	       ", checksum sums differing %" PRIu64 ", out of order %" PRIu64 ")  %s\n",
	       received, expected, bad, dup, missing, sums, ooo, verdict(c));
	c = errors == 0 && (!o->flow || credit_viol == 0);
	ok &= c;
	if (o->flow)
		printf("  check: no receive found no posted buffer (every message had a credit for "
		       "a buffer posted "
		       "before it was sent: violations %" PRIu64
		       "; truncation / error completions %" PRIu64 ")  %s\n",
		       credit_viol, errors, verdict(c));
	else
		printf("  check: no error completions (%" PRIu64
		       "; without flow control messages that found no "
		       "posted buffer waited in the provider's unexpected queue)  %s\n",
		       errors, verdict(c));
	if (o->flow) {
		c = inflight_viol == 0 && max_inflight <= max_window && max_inflight > 0;
		ok &= c;
		printf("  check: in flight never above the window (most in flight %" PRIu64
		       " of window %" PRIu64 ", sends above it %" PRIu64 ")  %s\n",
		       max_inflight, max_window, inflight_viol, verdict(c));
	}
	c = mismatch_counts == 0 && cr_returned == cr_counted && puts == puts_landed;
	ok &= c;
	printf("  check: compcntr's counts equal the provider's own counters (sends, receives, RMA "
	       "writes, errors on every rank: %" PRIu64 " differ; credits, which skip libfabric "
	       "between ranks of a node: %" PRIu64 " returned, %" PRIu64 " counted; shared-memory "
	       "puts, which skip it too: %" PRIu64 " issued, %" PRIu64 " complete, %" PRIu64
	       " landed)  %s\n",
	       mismatch_counts, cr_returned, cr_counted, puts, puts_done, puts_landed, verdict(c));
	c = writes == o->writes * (uint64_t)nranks * (uint64_t)(nranks - 1) && window_bad == 0 &&
	    quiet_eio == 0 && puts + fi_writes == writes && puts_landed == puts;
	ok &= c;
	printf("  check: RMA writes finished by quiet() and landed (%" PRIu64 " writes: %" PRIu64
	       " shared-memory puts, %" PRIu64 " counted landed by their targets, %" PRIu64
	       " libfabric writes; window bytes wrong %" PRIu64 ", quiet EIO %" PRIu64 ")  %s\n",
	       writes, puts, puts_landed, fi_writes, window_bad, quiet_eio, verdict(c));
	printf("  %d ranks, %" PRIu64 " messages of %u B per pair, %" PRIu64
	       " RMA writes of %u B per pair, %.2f s\n",
	       nranks, o->msgs, o->size, o->writes, o->wsize, wall);
	printf("runtime: %s\n", ok ? "all checks passed" : "FAILED");
	fflush(stdout);
	return ok ? 0 : 1;
}
