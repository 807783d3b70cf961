/* The engine of examples/runtime (see rt.h): libfabric traffic between MPI ranks, with flow
 * control by compcntr's credit tracker and RMA completion by compcntr's completion tracker.
 *
 * Who counts what (per rank):
 *   cc_sends   compcntr counter fed by the CQ bridge on the transmit CQ (FI_SEND): data and
 *              credit messages whose send completed locally.
 *   cc_writes  fed by the same bridge (FI_WRITE): RMA writes completed locally. The
 *              completion tracker waits on it (quiet).
 *   cc_recvs   counted by this rank's progress for every entry it reads from the receive CQ
 *              (data and credit messages; error entries as errors).
 *   cc_credit[p]  credits rank p returned: its credit messages' CQ data, added by the
 *              progress function, or, if p shares this node, added by p itself (the counters
 *              then live on the node's shared device and p resolved its one by id). The
 *              credit tracker adopted these counters, one window per peer: acquire(p) is
 *              admitted while sent - returned < window(p).
 *   pv_*       the provider's own fid_cntr counters bound to the endpoint (FI_SEND, FI_RECV,
 *              FI_WRITE): compcntr's counts must equal them at the end. Credits through shared
 *              counters are no libfabric traffic: they are checked as credits returned (by
 *              the receivers) = credits counted (by the senders' counters).
 */
#define _GNU_SOURCE
#include "rt.h"

#include <compcntr/compcntr.h>
#include <compcntr/fabric.h>

#include <mpi.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <sys/mman.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TAG_DATA ((uint64_t)1 << 32)
#define TAG_CREDIT ((uint64_t)2 << 32)
#define TAG_KIND_MASK ((uint64_t)0xffffffff << 32)
#define NAME_MAX_LEN 256
#define LIVE_TAG 7001
#define RX_BATCH 64

enum { PHASE_CONNECT, PHASE_MESSAGES, PHASE_RMA, PHASE_DONE };

void rt_default_opts(struct rt_opts *o)
{
	memset(o, 0, sizeof *o);
	o->provider = "tcp;ofi_rxm";
	o->msgs = 20000;
	o->size = 64;
	o->window = 16;
	o->flow = 1;
	o->node_shm = 1;
	o->writes = 256;
	o->wsize = 64;
	o->rma_batch = 32;
	o->timeout_ms = 20000;
	o->spin_us = 50;
	o->interval_us = 100;
	o->fail_rank = -1;
}

/* A posted receive: the fi_context first, so op_context leads back to it. */
struct rx_slot {
	struct fi_context ctx;
	uint32_t src;
	uint32_t kind;  /* 1 data, 2 credit */
	char *buf;
};

struct peer {
	fi_addr_t addr;
	uint64_t win_addr, win_key;   /* its RMA window */
	uint64_t window;              /* buffers it keeps posted for me: my window towards it */
	/* sending to it */
	char *sbuf;                   /* msgs * size bytes, one slot per message (never reused) */
	struct fi_context *sctx;      /* one per message */
	struct fi_context *wctx;      /* one per RMA write */
	uint64_t sent;
	uint64_t sum_to;              /* sum of the checksums of the messages sent to it */
	/* receiving from it */
	struct rx_slot *rx;           /* data receive slots */
	uint32_t nrx;
	struct rx_slot *crx;          /* credit receive slots (zero-length) */
	uint32_t ncrx;
	uint64_t posted;              /* data buffers posted for it so far */
	uint64_t received;
	uint64_t sum_from;
	uint8_t *seen;                /* msgs bits */
	uint64_t owed;                /* credits to return */
	uint64_t returned;            /* credits returned to it (sent in credit messages) */
	uint64_t credit_msgs;
	struct fi_context *cctx;      /* one per credit message */
	uint64_t ncctx;
	uint64_t got;                 /* credits it returned to me */
	struct compcntr_comp_cntr *shm_credit; /* on my node: its counter of my credits */
};

struct live_msg {
	int32_t rank, phase;
	uint64_t sent, received, writes;
};

struct rt {
	struct rt_opts o;
	int rank, size;
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_ep *ep;
	struct fid_cq *txcq, *rxcq;
	struct fid_cntr *pv_send, *pv_recv, *pv_write;
	struct fid_mr *smr, *rmr, *wmr, *srcmr;
	void *sdesc, *rdesc, *srcdesc;
	char *sregion, *rregion, *window, *src;
	size_t sregion_len, rregion_len, window_len, src_len;
	struct peer *peers;
	/* compcntr */
	struct compcntr_device *dev;
	struct compcntr_device
	        *sdev; /* shared by this node's ranks (NULL: none or --no-node-shm) */
	struct compcntr_comp_cntr *cc_sends, *cc_writes, *cc_recvs, **cc_credit;
	struct compcntr_credits *cr;
	struct compcntr_tracker *tr;
	struct compcntr_fi_bridge *br;
	struct compcntr_wait_attr wa;     /* waits for credits and messages: both CQs */
	struct compcntr_wait_attr wa_tx;  /* quiet: the transmit CQ's bridge only */
	/* state */
	int phase;
	uint64_t tx_posted;           /* data + credit messages posted */
	uint64_t round_base, round_end; /* this round's sequence numbers per pair: [base, end) */
	uint64_t writes_posted;
	struct rt_stats st;
	/* live display */
	unsigned tick;
	double next_live;
	MPI_Request live_req;
	struct live_msg live_out;
	struct live_msg *live_all;    /* rank 0 */
	unsigned idle;                /* consecutive progress-hook calls that found nothing */
	double next_pet; /* when progress next re-arms the watchdog (opts.watchdog_s) */
	double live_t0;
	int live_printed;
};

/* ---- small helpers ---------------------------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double thread_cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(struct rt *rt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct rt *rt, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "runtime: rank %d: ", rt ? rt->rank : -1);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	fflush(stderr);
	va_end(ap);
	return -1;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 0x100000001b3ull;
	return h;
}

static unsigned char payload_byte(uint32_t src, uint32_t dst, uint64_t seq, size_t i)
{
	return (unsigned char)(src * 131u + dst * 31u + seq * 7u + i * 13u + 1u);
}

static unsigned char rma_byte(uint32_t src, uint32_t dst, uint64_t j, size_t i)
{
	return (unsigned char)(src * 17u + dst * 101u + j * 3u + i * 29u + 5u);
}

static uint64_t msg_sum(const struct rt_msg_hdr *h, const char *payload, size_t n)
{
	uint64_t s = 0xcbf29ce484222325ull;
	s = fnv(s, &h->src, sizeof h->src);
	s = fnv(s, &h->dst, sizeof h->dst);
	s = fnv(s, &h->seq, sizeof h->seq);
	s = fnv(s, &h->credits_seen, sizeof h->credits_seen);
	return fnv(s, payload, n);
}

static uint64_t read_cc(struct compcntr_comp_cntr *cc)
{
	uint64_t v = 0;
	compcntr_read_comp_cntr(cc, &v);
	return v;
}

static uint64_t read_cc_err(struct compcntr_comp_cntr *cc)
{
	uint64_t v = 0;
	compcntr_read_err_comp_cntr(cc, &v);
	return v;
}

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

static void live_tick(struct rt *rt, int force)
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

/* ---- progress --------------------------------------------------------------------------- */

/* A receive queue that stays full is a setup error (more buffers than the provider's
 * receive queue holds): bounded, never a hang. */
static int rx_full(struct rt *rt, double *deadline, const char *what)
{
	if (*deadline == 0)
		*deadline = now_s() + rt->o.timeout_ms / 1e3;
	fi_cq_read(rt->rxcq, NULL, 0); /* drives progress without consuming entries */
	if (now_s() < *deadline)
		return 0;
	return fail(rt,
	            "fi_trecv(%s) kept returning -FI_EAGAIN: the receive queue holds %zu entries, "
	            "fewer than the buffers to post (lower --window)",
	            what, rt->info->rx_attr->size);
}

static int post_data_recv(struct rt *rt, struct peer *p, struct rx_slot *s)
{
	ssize_t r;
	double deadline = 0;
	while ((r = fi_trecv(rt->ep, s->buf, rt->o.size, rt->rdesc, FI_ADDR_UNSPEC,
	                     TAG_DATA | s->src, 0, &s->ctx)) == -FI_EAGAIN)
		if (rx_full(rt, &deadline, "data"))
			return -1;
	if (r)
		return fail(rt, "fi_trecv(data from rank %u): %s", s->src, fi_strerror((int)-r));
	p->posted++;
	return 0;
}

static int post_credit_recv(struct rt *rt, struct rx_slot *s)
{
	ssize_t r;
	double deadline = 0;
	while ((r = fi_trecv(rt->ep, NULL, 0, NULL, FI_ADDR_UNSPEC, TAG_CREDIT | s->src, 0,
	                     &s->ctx)) == -FI_EAGAIN)
		if (rx_full(rt, &deadline, "credits"))
			return -1;
	if (r)
		return fail(rt, "fi_trecv(credits from rank %u): %s", s->src, fi_strerror((int)-r));
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
			fail(rt, "fi_tsenddata(credits to rank %d): %s", s, fi_strerror((int)-r));
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
	         h.sum == msg_sum(&h, payload, plen);
	for (size_t i = 0; ok && i < plen; i++)
		ok = (unsigned char)payload[i] == payload_byte(h.src, h.dst, h.seq, i);
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
	if (p->posted < rt->round_end && post_data_recv(rt, p, slot))
		exit(5);
	if (o->flow)
		p->owed++;
}

static void on_credit(struct rt *rt, struct rx_slot *slot, const struct fi_cq_tagged_entry *e)
{
	struct peer *p = &rt->peers[slot->src];
	p->got += e->data;
	compcntr_inc_comp_cntr(rt->cc_credit[slot->src], e->data); /* wakes a waiting acquire */
	if (post_credit_recv(rt, slot))
		exit(5);
}

/* The watchdog (opts.watchdog_s) measures time *outside* progress: every wait here is bounded
 * by timeout_ms and drives progress, so a rank that stops calling it for watchdog_s seconds is
 * stuck where nothing is bounded (a blocking MPI call on a hung peer) or stopped. Re-armed at
 * most every 250 ms (a clock read every 64 progress calls), so a healthy run of any length is
 * never cut short. */
static void watchdog_pet(struct rt *rt)
{
	const double t = now_s();
	if (t < rt->next_pet)
		return;
	rt->next_pet = t + 0.25;
	alarm((unsigned)rt->o.watchdog_s);
}

static void idle_yield(struct rt *rt)
{
	if (rt->o.watchdog_s > 0)
		watchdog_pet(rt);
	sched_yield();
}

/* Drives both CQs; returns the number of entries handled. */
static int progress_n(struct rt *rt)
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
			fail(rt, "fi_cq_read(receive CQ): %s", fi_strerror((int)-r));
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
		live_tick(rt, 0);
	if (rt->o.watchdog_s > 0 && (rt->tick & 63) == 0)
		watchdog_pet(rt);
	return n;
}

/* The progress hook of every compcntr wait here. A wait that found nothing to do gives the
 * CPU away: with more ranks than cores (or a busy machine) the peer whose credits or
 * completions this rank waits for needs the core to produce them (MPI's yield-when-idle).
 * (Sleeping on the CQs' FI_WAIT_FD instead was measured on tcp;ofi_rxm: with manual progress
 * the fd is not signalled by arriving data, so such a sleep lasts its whole timeout.) */
void rt_progress(void *v)
{
	struct rt *rt = v;
	if (progress_n(rt) != 0) {
		rt->idle = 0;
		return;
	}
	/* A short wait (an RMA write's completion, a credit already on the wire) stays hot: the
	 * core is given away only after 16 empty calls in a row. On a busy machine one yield can
	 * last many ms: the watchdog is re-armed before each, not only every 64 calls. */
	if (++rt->idle >= 16)
		idle_yield(rt);
}

static void tx_progress(void *v)
{
	struct rt *rt = v;
	if (compcntr_fi_bridge_progress(rt->br) > 0) {
		rt->idle = 0;
		return;
	}
	if (++rt->idle >= 16)
		idle_yield(rt);
}

/* ---- setup ------------------------------------------------------------------------------ */

static int fi_check(struct rt *rt, const char *call, int r)
{
	if (r)
		return fail(rt, "%s: %s", call, fi_strerror(r < 0 ? -r : r));
	return 0;
}

static int open_cntr(struct rt *rt, struct fid_cntr **c, uint64_t flags, const char *what)
{
	struct fi_cntr_attr a;
	memset(&a, 0, sizeof a);
	a.events = FI_CNTR_EVENTS_COMP;
	a.wait_obj = FI_WAIT_UNSPEC; /* the benchmark's reference uses fi_cntr_wait on it */
	if (fi_check(rt, what, fi_cntr_open(rt->domain, &a, c, NULL)))
		return -1;
	return fi_check(rt, "fi_ep_bind(counter)", fi_ep_bind(rt->ep, &(*c)->fid, flags));
}

static void *zalloc(size_t n)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, n ? n : 1))
		return NULL;
	memset(p, 0, n ? n : 1);
	return p;
}

/* ---- the ranks of this node: credits by shared counters -------------------------------- */

/* The node's shared device "shm:ccrt-<job>-<leader>" (job: a value rank 0 broadcasts, unique
 * per run; leader: the world rank of the node's first rank), created by that rank, opened by
 * the others. Once every rank of the node has it open, the leader removes its name (the
 * segment /dev/shm/compcntr.<name>): the segment lives on while mapped, and a job that ends by
 * MPI_Abort or a kill leaves nothing behind. */
static int open_node_device(struct rt *rt, MPI_Comm node)
{
	int nsize, nrank, leader = rt->rank;
	MPI_Comm_size(node, &nsize);
	MPI_Comm_rank(node, &nrank);
	uint64_t job = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e9);
	MPI_Bcast(&job, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD); /* every rank, alone or not */
	if (nsize < 2)
		return 0; /* alone on its node: no local peers */
	MPI_Bcast(&leader, 1, MPI_INT, 0, node);
	char name[64];
	snprintf(name, sizeof name, "ccrt-%" PRIx64 "-%d", job, leader);
	if (nrank == 0)
		rt->sdev = compcntr_open_shared_device(
		        name, COMPCNTR_SHARED_CREATE | COMPCNTR_SHARED_EXCL, 0600);
	int ok = rt->sdev != NULL, all;
	MPI_Bcast(&ok, 1, MPI_INT, 0, node); /* created before the others open it */
	if (ok && nrank != 0)
		rt->sdev = compcntr_open_shared_device(name, 0, 0600);
	if (!rt->sdev)
		fail(rt, "compcntr_open_shared_device(%s): %s", name,
		     ok ? compcntr_last_error_message() : "its creator failed");
	ok = rt->sdev != NULL;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, node); /* all of the node have it open */
	if (nrank == 0 && rt->sdev) {
		char path[80];
		snprintf(path, sizeof path, "/compcntr.%s", name);
		shm_unlink(path); /* docs/shared.md: "Removing the name early" */
	}
	return all ? 0 : -1;
}

/* Every rank of the node sends each other one the id of its credit counter for it; each
 * resolves the ids it got: peers[s].shm_credit is where this rank returns s's credits. */
static int link_node_peers(struct rt *rt, MPI_Comm node)
{
	int nn;
	MPI_Comm_size(node, &nn);
	int *world = calloc((size_t)nn, sizeof *world);
	struct compcntr_counter_id *mine = calloc((size_t)nn, sizeof *mine),
	                           *theirs = calloc((size_t)nn, sizeof *theirs);
	int r = world && mine && theirs ? 0 : fail(rt, "out of memory");
	if (!r)
		MPI_Allgather(&rt->rank, 1, MPI_INT, world, 1, MPI_INT, node);
	for (int k = 0; !r && k < nn; k++)
		compcntr_comp_cntr_id(rt->cc_credit[world[k]], &mine[k]);
	if (!r)
		MPI_Alltoall(mine, sizeof *mine, MPI_BYTE, theirs, sizeof *theirs, MPI_BYTE, node);
	for (int k = 0; !r && k < nn; k++) {
		struct peer *p = &rt->peers[world[k]];
		if (world[k] == rt->rank)
			continue;
		if (!(p->shm_credit = compcntr_comp_cntr_resolve(rt->sdev, &theirs[k])))
			r = fail(rt, "compcntr_comp_cntr_resolve(rank %d's credit counter): %s",
			         world[k], compcntr_last_error_message());
		else
			rt->st.local_peers++;
	}
	free(world);
	free(mine);
	free(theirs);
	return r;
}

struct rt *rt_open(const struct rt_opts *o)
{
	struct rt *rt = calloc(1, sizeof *rt);
	if (!rt)
		return NULL;
	rt->o = *o;
	rt->live_req = MPI_REQUEST_NULL;
	MPI_Comm_rank(MPI_COMM_WORLD, &rt->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &rt->size);
	struct rt_opts *opt = &rt->o;
	if (opt->size < sizeof(struct rt_msg_hdr))
		opt->size = sizeof(struct rt_msg_hdr);
	if (opt->window == 0)
		opt->window = 1;
	if (opt->batch == 0)
		opt->batch = opt->window / 4 ? opt->window / 4 : 1;
	if (opt->batch > opt->window)
		opt->batch = opt->window;
	if (opt->rma_batch == 0)
		opt->rma_batch = 1;
	rt->st.rank = rt->rank;
	rt->st.my_window =
	        opt->window + (opt->vary_windows && (rt->rank & 1) ? opt->window / 2 : 0);
	/* Receive buffers per source: the window, with or without flow control. Without it the
	 * senders do not wait for credits, and what finds no posted buffer waits in the provider's
	 * unexpected-message queue (rxm buffers it) until a buffer is reposted: the traffic the
	 * credits exist to prevent, kept as the benchmark's reference. */
	const uint32_t nrx = rt->st.my_window;

	/* the provider */
	if (opt->iface) {
		setenv("FI_TCP_IFACE", opt->iface, 1);
		setenv("FI_SOCKETS_IFACE", opt->iface, 1);
	}
	struct fi_info *hints = fi_allocinfo();
	if (!hints)
		return fail(rt, "fi_allocinfo failed"), NULL;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_TAGGED | FI_RMA;
	hints->mode = FI_CONTEXT | FI_RX_CQ_DATA;
	hints->domain_attr->mr_mode =
	        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->fabric_attr->prov_name = strdup(opt->provider);
	int r = fi_getinfo(FI_VERSION(1, 17), opt->addr, NULL, opt->addr ? FI_SOURCE : 0, hints,
	                   &rt->info);
	fi_freeinfo(hints);
	if (r) {
		fail(rt, "fi_getinfo(%s, FI_EP_RDM, tagged + RMA%s%s): %s", opt->provider,
		     opt->addr ? ", " : "", opt->addr ? opt->addr : "", fi_strerror(-r));
		return NULL;
	}
	if (rt->info->domain_attr->cq_data_size < 4)
		return fail(rt, "provider %s has %zu bytes of CQ data: credit messages need 4",
		            rt->info->fabric_attr->prov_name, rt->info->domain_attr->cq_data_size),
		       NULL;
	if (fi_check(rt, "fi_fabric", fi_fabric(rt->info->fabric_attr, &rt->fabric, NULL)) ||
	    fi_check(rt, "fi_domain", fi_domain(rt->fabric, rt->info, &rt->domain, NULL)))
		return NULL;
	struct fi_av_attr av_attr;
	memset(&av_attr, 0, sizeof av_attr);
	av_attr.type = FI_AV_TABLE;
	struct fi_cq_attr cq_attr;
	memset(&cq_attr, 0, sizeof cq_attr);
	cq_attr.format = FI_CQ_FORMAT_TAGGED;
	cq_attr.size = 8192;
	if (fi_check(rt, "fi_av_open", fi_av_open(rt->domain, &av_attr, &rt->av, NULL)) ||
	    fi_check(rt, "fi_cq_open(tx)", fi_cq_open(rt->domain, &cq_attr, &rt->txcq, NULL)) ||
	    fi_check(rt, "fi_cq_open(rx)", fi_cq_open(rt->domain, &cq_attr, &rt->rxcq, NULL)) ||
	    fi_check(rt, "fi_endpoint", fi_endpoint(rt->domain, rt->info, &rt->ep, NULL)) ||
	    fi_check(rt, "fi_ep_bind(av)", fi_ep_bind(rt->ep, &rt->av->fid, 0)) ||
	    fi_check(rt, "fi_ep_bind(tx cq)", fi_ep_bind(rt->ep, &rt->txcq->fid, FI_TRANSMIT)) ||
	    fi_check(rt, "fi_ep_bind(rx cq)", fi_ep_bind(rt->ep, &rt->rxcq->fid, FI_RECV)) ||
	    open_cntr(rt, &rt->pv_send, FI_SEND, "fi_cntr_open(send)") ||
	    open_cntr(rt, &rt->pv_recv, FI_RECV, "fi_cntr_open(recv)") ||
	    open_cntr(rt, &rt->pv_write, FI_WRITE, "fi_cntr_open(write)") ||
	    fi_check(rt, "fi_enable", fi_enable(rt->ep)))
		return NULL;

	/* memory: send slots, receive slots, the RMA window and the RMA source */
	const size_t n = (size_t)rt->size;
	rt->sregion_len = n * opt->msgs * opt->size;
	rt->rregion_len = n * nrx * (size_t)opt->size;
	rt->window_len = n * opt->writes * opt->wsize;
	rt->src_len = n * opt->writes * opt->wsize;
	rt->sregion = zalloc(rt->sregion_len);
	rt->rregion = zalloc(rt->rregion_len);
	rt->window = zalloc(rt->window_len);
	rt->src = zalloc(rt->src_len);
	rt->peers = calloc(n, sizeof *rt->peers);
	if (!rt->sregion || !rt->rregion || !rt->window || !rt->src || !rt->peers)
		return fail(rt, "out of memory"), NULL;
	if (fi_check(rt, "fi_mr_reg(send)",
	             fi_mr_reg(rt->domain, rt->sregion, rt->sregion_len, FI_SEND, 0, 1, 0, &rt->smr,
	                       NULL)) ||
	    fi_check(rt, "fi_mr_reg(recv)",
	             fi_mr_reg(rt->domain, rt->rregion, rt->rregion_len, FI_RECV, 0, 2, 0, &rt->rmr,
	                       NULL)) ||
	    fi_check(rt, "fi_mr_reg(window)",
	             fi_mr_reg(rt->domain, rt->window, rt->window_len, FI_REMOTE_WRITE, 0, 3, 0,
	                       &rt->wmr, NULL)) ||
	    fi_check(rt, "fi_mr_reg(rma source)",
	             fi_mr_reg(rt->domain, rt->src, rt->src_len, FI_WRITE, 0, 4, 0, &rt->srcmr,
	                       NULL)))
		return NULL;
	rt->sdesc = fi_mr_desc(rt->smr);
	rt->rdesc = fi_mr_desc(rt->rmr);
	rt->srcdesc = fi_mr_desc(rt->srcmr);

	/* compcntr: the device, the counters, the bridge, the trackers */
	rt->dev = compcntr_open_device("soft");
	if (!rt->dev)
		return fail(rt, "compcntr_open_device: %s", compcntr_last_error_message()), NULL;
	struct compcntr_comp_cntr_init_attr ca;
	memset(&ca, 0, sizeof ca);
	ca.type = COMPCNTR_COMP_CNTR_TYPE_WRS;
	rt->cc_credit = calloc(n, sizeof *rt->cc_credit);
	if (!rt->cc_credit)
		return fail(rt, "out of memory"), NULL;
	MPI_Comm node = MPI_COMM_NULL;
	if (opt->node_shm)
		MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
	if (node != MPI_COMM_NULL && opt->ranks_per_node > 0) { /* simulated nodes of K ranks */
		int nr;
		MPI_Comm host = node;
		MPI_Comm_rank(host, &nr);
		MPI_Comm_split(host, nr / opt->ranks_per_node, nr, &node);
		MPI_Comm_free(&host);
	}
	if (node != MPI_COMM_NULL && open_node_device(rt, node))
		return NULL;
	struct compcntr_device *cdev = rt->sdev ? rt->sdev : rt->dev; /* the credit counters' */
	if (!(rt->cc_sends = compcntr_create_comp_cntr(rt->dev, &ca)) ||
	    !(rt->cc_writes = compcntr_create_comp_cntr(rt->dev, &ca)) ||
	    !(rt->cc_recvs = compcntr_create_comp_cntr(rt->dev, &ca)))
		return fail(rt, "compcntr_create_comp_cntr: %s", compcntr_last_error_message()),
		       NULL;
	for (size_t i = 0; i < n; i++)
		if (!(rt->cc_credit[i] = compcntr_create_comp_cntr(cdev, &ca)))
			return fail(rt, "compcntr_create_comp_cntr: %s",
			            compcntr_last_error_message()),
			       NULL;
	if (rt->sdev && link_node_peers(rt, node))
		return NULL;
	if (node != MPI_COMM_NULL)
		MPI_Comm_free(&node);
	rt->st.remote_peers = (uint32_t)n - 1 - rt->st.local_peers;
	struct compcntr_fi_bridge_attr ba;
	memset(&ba, 0, sizeof ba);
	ba.comp_mask = COMPCNTR_FI_BRIDGE_ATTR_FORMAT;
	ba.format = FI_CQ_FORMAT_TAGGED;
	rt->br = compcntr_fi_bridge_open_ex(rt->txcq, &ba);
	if (!rt->br)
		return fail(rt, "compcntr_fi_bridge_open_ex: %s", compcntr_fi_last_error()), NULL;
	if (compcntr_fi_bridge_bind(rt->br, rt->cc_sends, FI_SEND) ||
	    compcntr_fi_bridge_bind(rt->br, rt->cc_writes, FI_WRITE))
		return fail(rt, "compcntr_fi_bridge_bind: %s", compcntr_fi_last_error()), NULL;
	rt->tr = compcntr_tracker_create(rt->cc_writes);
	if (!rt->tr)
		return fail(rt, "compcntr_tracker_create: %s", compcntr_last_error_message()), NULL;
	rt->wa.comp_mask = COMPCNTR_WAIT_ATTR_SPIN | COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;
	rt->wa.spin_ns =
	        opt->spin_us < 0 ? COMPCNTR_WAIT_SPIN_FOREVER : (int64_t)opt->spin_us * 1000;
	rt->wa.progress_interval_us = (uint32_t)(opt->interval_us > 0 ? opt->interval_us : 1);
	rt->wa.progress = rt_progress;
	rt->wa.progress_ctx = rt;
	/* quiet waits for write completions only: driving the transmit CQ's bridge is enough (with
	 * manual progress any CQ read drives the whole endpoint, so incoming traffic is still
	 * served; its receive entries wait in the receive CQ for the next full progress call). */
	rt->wa_tx = rt->wa;
	rt->wa_tx.progress = tx_progress;

	/* addresses, windows and RMA keys of every rank */
	char name[NAME_MAX_LEN];
	memset(name, 0, sizeof name);
	size_t len = sizeof name;
	if (fi_check(rt, "fi_getname", fi_getname(&rt->ep->fid, name, &len)))
		return NULL;
	char *names = malloc(n * NAME_MAX_LEN);
	if (!names)
		return fail(rt, "out of memory"), NULL;
	MPI_Allgather(name, NAME_MAX_LEN, MPI_BYTE, names, NAME_MAX_LEN, MPI_BYTE, MPI_COMM_WORLD);
	fi_addr_t *addrs = calloc(n, sizeof *addrs);
	if (!addrs)
		return fail(rt, "out of memory"), NULL;
	for (size_t i = 0; i < n; i++)
		if (fi_av_insert(rt->av, names + i * NAME_MAX_LEN, 1, &addrs[i], 0, NULL) != 1)
			return fail(rt, "fi_av_insert(rank %zu) failed", i), NULL;
	free(names);
	uint64_t mine[3] = { (rt->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
		                     ? (uint64_t)(uintptr_t)rt->window
		                     : 0,
		             fi_mr_key(rt->wmr), rt->st.my_window };
	uint64_t *all = malloc(n * sizeof mine);
	if (!all)
		return fail(rt, "out of memory"), NULL;
	MPI_Allgather(mine, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, MPI_COMM_WORLD);
	uint64_t *windows = calloc(n, sizeof *windows);
	if (!windows)
		return fail(rt, "out of memory"), NULL;
	for (size_t i = 0; i < n; i++) {
		struct peer *p = &rt->peers[i];
		p->addr = addrs[i];
		p->win_addr = all[3 * i];
		p->win_key = all[3 * i + 1];
		p->window = all[3 * i + 2];
		windows[i] = i == (size_t)rt->rank ? 1 : p->window;
	}
	free(addrs);
	free(all);
	/* One window per peer: peer i keeps windows[i] buffers posted for this rank. */
	rt->cr = compcntr_credits_adopt(cdev, rt->cc_credit, (uint32_t)n, windows);
	free(windows);
	if (!rt->cr)
		return fail(rt, "compcntr_credits_adopt: %s", compcntr_last_error_message()), NULL;

	/* per-peer state and the initial receives */
	for (size_t i = 0; i < n; i++) {
		struct peer *p = &rt->peers[i];
		if (i == (size_t)rt->rank)
			continue;
		p->sbuf = rt->sregion + i * opt->msgs * opt->size;
		p->sctx = calloc(opt->msgs ? opt->msgs : 1, sizeof *p->sctx);
		p->wctx = calloc(opt->writes ? opt->writes : 1, sizeof *p->wctx);
		p->seen = calloc(opt->msgs / 8 + 1, 1);
		p->nrx = nrx;
		p->rx = calloc(nrx ? nrx : 1, sizeof *p->rx);
		/* Credit messages from i in flight at once: they return credits for my messages to
		 * i, at most its window for me (p->window, which --vary-windows makes 1.5x) in batches
		 * of `batch`, plus its final short batch; sized from opt->window, a small --batch
		 * with --vary-windows left credit messages unexpected (queued by the provider). */
		p->ncrx = opt->flow && !p->shm_credit ? (uint32_t)(p->window / opt->batch) + 4 : 0;
		p->crx = calloc(p->ncrx ? p->ncrx : 1, sizeof *p->crx);
		p->ncctx = opt->flow ? (opt->msgs + opt->batch - 1) / opt->batch + 4
		                     : 1; /* per round */
		p->cctx = calloc(p->ncctx, sizeof *p->cctx);
		if (!p->sctx || !p->wctx || !p->seen || !p->rx || !p->crx || !p->cctx)
			return fail(rt, "out of memory"), NULL;
		for (uint32_t k = 0; k < nrx && k < opt->msgs; k++) {
			struct rx_slot *s = &p->rx[k];
			s->src = (uint32_t)i;
			s->kind = 1;
			s->buf = rt->rregion + (i * nrx + k) * (size_t)opt->size;
			if (post_data_recv(rt, p, s))
				return NULL;
		}
		for (uint32_t k = 0; k < p->ncrx; k++) {
			p->crx[k].src = (uint32_t)i;
			p->crx[k].kind = 2;
			if (post_credit_recv(rt, &p->crx[k]))
				return NULL;
		}
		for (uint64_t j = 0; j < opt->writes; j++)
			for (size_t b = 0; b < opt->wsize; b++)
				rt->src[(i * opt->writes + j) * opt->wsize + b] =
				        (char)rma_byte((uint32_t)rt->rank, (uint32_t)i, j, b);
	}
	if (opt->live && rt->rank == 0) {
		rt->live_all = calloc(n, sizeof *rt->live_all);
		if (!rt->live_all)
			return fail(rt, "out of memory"), NULL;
		for (size_t i = 0; i < n; i++)
			rt->live_all[i].rank = (int32_t)i;
	}
	/* Every receive is posted before anyone sends. */
	MPI_Barrier(MPI_COMM_WORLD);
	rt->live_t0 = now_s();
	rt->round_end = opt->msgs;
	return rt;
}

/* ---- messaging -------------------------------------------------------------------------- */

static void injected_failure(struct rt *rt)
{
	if (rt->o.fail_mode == RT_FAIL_EXIT) {
		fprintf(stderr,
		        "runtime: rank %d: injected failure after %" PRIu64 " messages: exiting\n",
		        rt->rank, rt->st.sent);
		fflush(stderr);
		_exit(3);
	}
	fprintf(stderr,
	        "runtime: rank %d: injected failure after %" PRIu64
	        " messages: hanging (no progress)\n",
	        rt->rank, rt->st.sent);
	fflush(stderr);
	for (;;)
		pause();
}

static int send_one(struct rt *rt, int dst)
{
	struct peer *p = &rt->peers[dst];
	const struct rt_opts *o = &rt->o;
	if (o->flow) {
		/* One credit of dst: admitted while sent - returned < dst's window; otherwise waits,
		 * driving progress (which counts dst's credit messages into its counter). */
		const int r = compcntr_credits_acquire_ex(rt->cr, (uint32_t)dst, 1, 0, &rt->wa);
		if (r == ETIMEDOUT) {
			rt->st.acquire_waits++;
			const double w0 = now_s();
			const int r2 = compcntr_credits_acquire_ex(rt->cr, (uint32_t)dst, 1,
			                                           o->timeout_ms, &rt->wa);
			rt->st.acquire_wait_seconds += now_s() - w0;
			if (r2)
				return fail(rt,
				            "no credit from rank %d for %d ms (%s; sent %" PRIu64
				            ", credits back %" PRIu64 ", window %" PRIu64
				            "): is it alive?",
				            dst, o->timeout_ms,
				            r2 == ETIMEDOUT ? "ETIMEDOUT" : strerror(r2), p->sent,
				            read_cc(rt->cc_credit[dst]), p->window);
		} else if (r) {
			return fail(rt, "compcntr_credits_acquire(rank %d): %s", dst, strerror(r));
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
	}
	char *buf = p->sbuf + (p->sent - rt->round_base) * o->size;
	struct rt_msg_hdr h = { (uint32_t)rt->rank, (uint32_t)dst, p->sent,
		                read_cc(rt->cc_credit[dst]), 0 };
	char *payload = buf + sizeof h;
	const size_t plen = o->size - sizeof h;
	for (size_t i = 0; i < plen; i++)
		payload[i] = (char)payload_byte(h.src, h.dst, h.seq, i);
	h.sum = msg_sum(&h, payload, plen);
	memcpy(buf, &h, sizeof h);
	ssize_t r;
	const double deadline = now_s() + o->timeout_ms / 1e3;
	while ((r = fi_tsend(rt->ep, buf, o->size, rt->sdesc, p->addr,
	                     TAG_DATA | (uint64_t)rt->rank, &p->sctx[p->sent - rt->round_base])) ==
	       -FI_EAGAIN) {
		if (progress_n(rt) == 0)
			sched_yield();
		if (now_s() > deadline)
			return fail(rt, "fi_tsend to rank %d kept returning -FI_EAGAIN for %d ms",
			            dst, o->timeout_ms);
	}
	if (r)
		return fail(rt, "fi_tsend(rank %d): %s", dst, fi_strerror((int)-r));
	p->sum_to += h.sum;
	p->sent++;
	rt->st.sent++;
	rt->tx_posted++;
	if (rt->rank == rt->o.fail_rank && rt->o.fail_mode != RT_FAIL_NONE &&
	    rt->st.sent >= rt->o.fail_at)
		injected_failure(rt);
	return 0;
}

/* Drives progress until done(rt) or the timeout; -1 (and the message) on timeout. */
static int drive_until(struct rt *rt, int (*done)(struct rt *), const char *what)
{
	const double deadline = now_s() + rt->o.timeout_ms / 1e3;
	while (!done(rt)) {
		if (progress_n(rt) == 0)
			sched_yield();
		if (now_s() > deadline)
			return fail(rt, "timed out after %d ms waiting for %s", rt->o.timeout_ms,
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
	const double t0 = now_s(), c0 = thread_cpu_s();
	/* Round-robin over the peers, each rank starting after itself: every rank streams to
	 * every other one at once. */
	for (uint64_t k = 0; k < o->msgs; k++) {
		for (int d = 1; d < rt->size; d++)
			if (send_one(rt, (rt->rank + d) % rt->size))
				return -1;
		if ((k & 15) == 15)
			progress_n(rt);
	}
	if (drive_until(rt, all_received, "every message from every rank")) {
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
				return fail(rt,
				            "credits_flush(rank %d): %s (credits back %" PRIu64
				            " of %" PRIu64 ")",
				            d, strerror(r), read_cc(rt->cc_credit[d]),
				            rt->peers[d].sent);
		}
	/* Every send posted (data and credits) has completed locally. */
	const int r =
	        compcntr_wait_comp_cntr_ex(rt->cc_sends, rt->tx_posted, o->timeout_ms, &rt->wa);
	if (r)
		return fail(rt,
		            "waiting for %" PRIu64 " send completions (have %" PRIu64 ", %" PRIu64
		            " errors): %s",
		            rt->tx_posted, read_cc(rt->cc_sends), read_cc_err(rt->cc_sends),
		            strerror(r));
	rt->st.msg_seconds = now_s() - t0;
	rt->st.msg_cpu_seconds = thread_cpu_s() - c0;
	return 0;
}

/* ---- RMA -------------------------------------------------------------------------------- */

static int post_write(struct rt *rt, int dst, uint64_t j)
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
		if (progress_n(rt) == 0)
			sched_yield();
		if (now_s() > deadline)
			return fail(rt, "fi_write to rank %d kept returning -FI_EAGAIN", dst);
	}
	if (r)
		return fail(rt, "fi_write(rank %d): %s", dst, fi_strerror((int)-r));
	rt->writes_posted++;
	rt->st.writes++;
	return 0;
}

static int quiet(struct rt *rt)
{
	const double t0 = now_s();
	const int r = compcntr_tracker_quiet_ex(rt->tr, rt->o.timeout_ms, &rt->wa_tx);
	const double us = (now_s() - t0) * 1e6;
	if (us > rt->st.quiet_us_max)
		rt->st.quiet_us_max = us;
	rt->st.quiets++;
	if (r == EIO) {
		rt->st.quiet_eio++;
		return fail(rt, "quiet: an RMA write failed (%" PRIu64 " write errors)",
		            read_cc_err(rt->cc_writes));
	}
	if (r)
		return fail(rt,
		            "quiet: %s after %d ms (%" PRIu64 " of %" PRIu64 " writes completed)",
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
				       rma_byte((uint32_t)s, (uint32_t)rt->rank, j, b);
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
	const double t0 = now_s();
	for (uint64_t b = 0; b < o->writes; b += o->rma_batch) {
		for (int d = 1; d < rt->size; d++)
			for (uint64_t j = b; j < b + o->rma_batch && j < o->writes; j++)
				if (post_write(rt, (rt->rank + d) % rt->size, j))
					return -1;
		if (quiet(rt))
			return -1; /* shmem_quiet: everything issued so far is complete */
	}
	if (quiet(rt))
		return -1; /* nothing new: returns at once */
	rt->st.rma_seconds = now_s() - t0;
	/* The writes of every peer land in this rank's window (the target drives progress too). */
	if (drive_until(rt, window_ok,
	                "the RMA writes of every rank to land in this rank's window")) {
		rt->st.window_bad = window_mismatches(rt);
		return -1;
	}
	return 0;
}

/* ---- rounds and barriers ---------------------------------------------------------------- */

int rt_barrier(struct rt *rt)
{
	/* Everyone arrives; meanwhile this rank keeps serving its endpoint (a peer may still need
	 * it to deliver or complete something), so the barrier is non-blocking. */
	MPI_Request req;
	MPI_Ibarrier(MPI_COMM_WORLD, &req);
	const double deadline = now_s() + rt->o.timeout_ms / 1e3;
	for (int flag = 0; !flag;) {
		if (progress_n(rt) == 0)
			sched_yield();
		MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
		if (!flag && now_s() > deadline)
			return fail(rt, "timed out in a barrier");
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
			if (post_data_recv(rt, p, &p->rx[k]))
				return -1;
	}
	return rt_barrier(rt); /* every receive of the round is posted before anyone sends */
}

const struct rt_stats *rt_stats_of(const struct rt *rt)
{
	return &rt->st;
}

/* ---- the end ---------------------------------------------------------------------------- */

int rt_finish(struct rt *rt, struct rt_stats *st)
{
	rt->phase = PHASE_DONE;
	live_tick(rt, 1);
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
	progress_n(rt);
	/* compcntr's counts against the provider's own counters. */
	rt->st.cc_sends = read_cc(rt->cc_sends);
	rt->st.cc_writes = read_cc(rt->cc_writes);
	rt->st.cc_recvs = read_cc(rt->cc_recvs);
	rt->st.cc_errors =
	        read_cc_err(rt->cc_sends) + read_cc_err(rt->cc_writes) + read_cc_err(rt->cc_recvs);
	rt->st.pv_sends = fi_cntr_read(rt->pv_send);
	rt->st.pv_recvs = fi_cntr_read(rt->pv_recv);
	rt->st.pv_writes = fi_cntr_read(rt->pv_write);
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
		return fail(rt, "out of memory");
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

void rt_close(struct rt *rt)
{
	if (!rt)
		return;
	if (rt->br)
		compcntr_fi_bridge_close(rt->br);
	if (rt->ep)
		fi_close(&rt->ep->fid);
	struct fid_mr *mrs[] = { rt->smr, rt->rmr, rt->wmr, rt->srcmr };
	for (size_t i = 0; i < sizeof mrs / sizeof mrs[0]; i++)
		if (mrs[i])
			fi_close(&mrs[i]->fid);
	struct fid_cntr *cs[] = { rt->pv_send, rt->pv_recv, rt->pv_write };
	for (size_t i = 0; i < 3; i++)
		if (cs[i])
			fi_close(&cs[i]->fid);
	if (rt->txcq)
		fi_close(&rt->txcq->fid);
	if (rt->rxcq)
		fi_close(&rt->rxcq->fid);
	if (rt->av)
		fi_close(&rt->av->fid);
	if (rt->domain)
		fi_close(&rt->domain->fid);
	if (rt->fabric)
		fi_close(&rt->fabric->fid);
	if (rt->info)
		fi_freeinfo(rt->info);
	if (rt->peers)
		for (int i = 0; i < rt->size; i++)
			if (rt->peers[i].shm_credit)
				compcntr_comp_cntr_release(rt->peers[i].shm_credit);
	if (rt->tr)
		compcntr_tracker_destroy(rt->tr);
	if (rt->cr)
		compcntr_credits_destroy(rt->cr);
	struct compcntr_comp_cntr *ccs[] = { rt->cc_sends, rt->cc_writes, rt->cc_recvs };
	for (size_t i = 0; i < 3; i++)
		if (ccs[i])
			compcntr_destroy_comp_cntr(ccs[i]);
	if (rt->cc_credit)
		for (int i = 0; i < rt->size; i++)
			if (rt->cc_credit[i])
				compcntr_destroy_comp_cntr(rt->cc_credit[i]);
	if (rt->sdev)
		compcntr_close_device(rt->sdev); /* the node's last rank removes it */
	if (rt->dev)
		compcntr_close_device(rt->dev);
	if (rt->peers)
		for (int i = 0; i < rt->size; i++) {
			struct peer *p = &rt->peers[i];
			free(p->sctx);
			free(p->wctx);
			free(p->seen);
			free(p->rx);
			free(p->crx);
			free(p->cctx);
		}
	free(rt->peers);
	free(rt->cc_credit);
	free(rt->live_all);
	free(rt->sregion);
	free(rt->rregion);
	free(rt->window);
	free(rt->src);
	free(rt);
}

/* ---- benchmark helpers ------------------------------------------------------------------ */

const char *rt_provider(const struct rt *rt)
{
	return rt->info->fabric_attr->prov_name;
}
int rt_rank(const struct rt *rt)
{
	return rt->rank;
}
const struct rt_opts *rt_opts_of(const struct rt *rt)
{
	return &rt->o;
}
int rt_size(const struct rt *rt)
{
	return rt->size;
}

double rt_one_write(struct rt *rt, int peer, int cc)
{
	const uint64_t j = rt->writes_posted % (rt->o.writes ? rt->o.writes : 1);
	const uint64_t target = fi_cntr_read(rt->pv_write) + 1;
	const double t0 = now_s();
	if (post_write(rt, peer, j))
		return -1;
	if (cc) {
		if (compcntr_tracker_quiet_ex(rt->tr, rt->o.timeout_ms, &rt->wa_tx))
			return -1;
	} else {
		const int r = fi_cntr_wait(rt->pv_write, target, rt->o.timeout_ms);
		if (r)
			return fail(rt, "fi_cntr_wait(write counter): %s", fi_strerror(-r)), -1.0;
	}
	const double dt = now_s() - t0;
	if (!cc) {
		/* The provider counter was waited on; the CQ entry is still queued: drain it (not
		 * timed) so the bridge's count and the tracker stay in step. */
		if (compcntr_tracker_quiet_ex(rt->tr, rt->o.timeout_ms, &rt->wa))
			return -1;
	}
	return dt;
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
	         quiet_eio = 0, sums = 0, ooo = 0, cr_returned = 0, cr_counted = 0;
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
		                   (s->cc_writes != s->pv_writes) + (s->cc_errors != s->pv_errors);
		window_bad += s->window_bad;
		writes += s->writes;
		quiet_eio += s->quiet_eio;
		sums += s->pair_sum_mismatch;
		cr_returned += s->credits_returned;
		cr_counted += s->credits_got;
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
	c = mismatch_counts == 0 && cr_returned == cr_counted;
	ok &= c;
	printf("  check: compcntr's counts equal the provider's own counters (sends, receives, RMA "
	       "writes, errors on every rank: %" PRIu64 " differ; credits, which skip libfabric "
	       "between ranks of a node: %" PRIu64 " returned, %" PRIu64 " counted)  %s\n",
	       mismatch_counts, cr_returned, cr_counted, verdict(c));
	c = writes == o->writes * (uint64_t)nranks * (uint64_t)(nranks - 1) && window_bad == 0 &&
	    quiet_eio == 0;
	ok &= c;
	printf("  check: RMA writes finished by quiet() and landed (%" PRIu64
	       " writes, window bytes wrong %" PRIu64 ", quiet EIO %" PRIu64 ")  %s\n",
	       writes, window_bad, quiet_eio, verdict(c));
	printf("  %d ranks, %" PRIu64 " messages of %u B per pair, %" PRIu64
	       " RMA writes of %u B per pair, %.2f s\n",
	       nranks, o->msgs, o->size, o->writes, o->wsize, wall);
	printf("runtime: %s\n", ok ? "all checks passed" : "FAILED");
	fflush(stdout);
	return ok ? 0 : 1;
}
