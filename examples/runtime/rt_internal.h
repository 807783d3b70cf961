/* examples/runtime: the engine's state, shared by its files (see rt.h for what each does).
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
 *   cc_puts    on the node's shared device: puts to ranks of this node (memcpy into their
 *              window in the node's segment) that are complete, counted by this rank after
 *              each put; the shared-memory completion tracker (tr_shm) waits on it (quiet).
 *   cc_landed[p]  on the node's shared device: rank p's puts into this rank's window, counted
 *              by p after each memcpy (p resolved this counter by id). The landed check waits
 *              on it, then reads the bytes: p's increment (seq_cst RMW) releases its memcpy,
 *              the wait's read acquires it.
 *   pv_*       the provider's own fid_cntr counters bound to the endpoint (FI_SEND, FI_RECV,
 *              FI_WRITE): compcntr's counts must equal them at the end. Credits through shared
 *              counters are no libfabric traffic: they are checked as credits returned (by
 *              the receivers) = credits counted (by the senders' counters).
 */
#ifndef COMPCNTR_EXAMPLES_RUNTIME_RT_INTERNAL_H
#define COMPCNTR_EXAMPLES_RUNTIME_RT_INTERNAL_H

#include "rt.h"

#include <compcntr/compcntr.h>
#include <compcntr/fabric.h>

#include <mpi.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <time.h>

#define TAG_DATA ((uint64_t)1 << 32)
#define TAG_CREDIT ((uint64_t)2 << 32)
#define TAG_KIND_MASK ((uint64_t)0xffffffff << 32)

enum { PHASE_CONNECT, PHASE_MESSAGES, PHASE_RMA, PHASE_DONE };

/* A posted receive: the fi_context first, so op_context leads back to it. */
struct rx_slot {
	struct fi_context ctx;
	uint32_t src;
	char *buf; /* NULL for a credit receive (zero-length) */
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
	char *shm_win;                /* on my node: its RMA window, mapped here (puts: memcpy) */
	struct compcntr_comp_cntr *shm_landed; /* on my node: its counter of my puts landed */
};

struct live_msg {
	int32_t rank, phase;
	uint64_t sent, received, writes;
};

struct rt {
	struct rt_opts o;
	struct rt_callbacks callbacks; /* o.callbacks with no-op defaults */
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
	MPI_Comm node;                /* this node's ranks during set-up (MPI_COMM_NULL: none) */
	uint64_t job;                 /* unique per run: names the node's segments */
	char *wseg; /* the node's RMA windows, one shared segment (NULL: none) */
	size_t wseg_len;
	struct compcntr_comp_cntr *cc_sends, *cc_writes, *cc_recvs, **cc_credit;
	struct compcntr_comp_cntr *cc_puts, **cc_landed; /* NULL without a node device */
	struct compcntr_credits *cr;
	struct compcntr_tracker *tr; /* quiet: libfabric writes (cc_writes) */
	struct compcntr_tracker *tr_shm; /* quiet: shared-memory puts (cc_puts; NULL: none) */
	struct compcntr_fi_bridge *br;
	struct compcntr_wait_attr wa; /* waits for credits and messages: both CQs */
	struct compcntr_wait_attr wa_tx; /* quiet: the transmit CQ's bridge only */
	/* state */
	int phase;
	uint64_t tx_posted; /* data + credit messages posted */
	uint64_t round_base, round_end; /* this round's sequence numbers per pair: [base, end) */
	uint64_t writes_posted;
	struct rt_stats st;
	/* live display */
	unsigned tick;
	double next_live;
	MPI_Request live_req;
	struct live_msg live_out;
	struct live_msg *live_all; /* rank 0 */
	unsigned idle; /* consecutive progress-function calls that found nothing */
	double live_t0;
	int live_printed;
};

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline uint64_t read_cc(struct compcntr_comp_cntr *cc)
{
	uint64_t v = 0;
	compcntr_read_comp_cntr(cc, &v);
	return v;
}

static inline uint64_t read_cc_err(struct compcntr_comp_cntr *cc)
{
	uint64_t v = 0;
	compcntr_read_err_comp_cntr(cc, &v);
	return v;
}

/* endpoint.c: prints "runtime: rank R: <message>" to stderr; returns -1. */
int rt_fail(struct rt *rt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* counters.c: this rank's node (its communicator, the job's id, the node's shared device),
 * before the memory is registered; then compcntr's objects. 0 or -1. */
int rt_open_node(struct rt *rt);
int rt_open_counters(struct rt *rt);
/* After the address exchange: the credit tracker over one window per peer. 0 or -1. */
int rt_adopt_credits(struct rt *rt, const uint64_t *windows);
void rt_close_counters(struct rt *rt);

/* progress.c */
int rt_progress_n(struct rt *rt); /* drives both CQs; the number of entries handled */
void rt_progress(void *rt); /* the progress function of the waits on both CQs */
void rt_tx_progress(void *rt); /* ... and of quiet: the transmit CQ's bridge */
int rt_post_data_recv(struct rt *rt, struct peer *p, struct rx_slot *s);
int rt_post_credit_recv(struct rt *rt, struct rx_slot *s);

/* messages.c: the payload and checksum of every data message; a wait for done(rt) that
 * drives progress (-1 and the message after timeout_ms) */
unsigned char rt_payload_byte(uint32_t src, uint32_t dst, uint64_t seq, size_t i);
uint64_t rt_msg_sum(const struct rt_msg_hdr *h, const char *payload, size_t n);
int rt_drive_until(struct rt *rt, int (*done)(struct rt *), const char *what);

/* rma.c: the bytes of write j from src to dst; one write posted over libfabric (counted by
 * the tracker); one write to dst by the way it takes (a shared-memory put to a rank of this
 * node, else rt_post_write); the node's RMA windows mapped (rt->window and every local peer's
 * shm_win, with a node device), and unmapped. 0 or -1. */
unsigned char rt_rma_byte(uint32_t src, uint32_t dst, uint64_t j, size_t i);
int rt_post_write(struct rt *rt, int dst, uint64_t j);
int rt_put(struct rt *rt, int dst, uint64_t j);
int rt_map_windows(struct rt *rt);
void rt_unmap_windows(struct rt *rt);

/* report.c: the live line (force: now, not at most every 100 ms) */
void rt_live_tick(struct rt *rt, int force);

#endif
