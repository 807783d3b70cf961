/* examples/runtime: a small MPI-launched runtime over libfabric whose flow control and RMA
 * completion are compcntr's (credits and the completion tracker). This header is the engine's
 * interface, used by the program (runtime.c, main.c), its test build (tests/runtime/) and the
 * MPI benchmark (bench/runtime/).
 *
 * One process per MPI rank. Each opens an RDM endpoint (default tcp;ofi_rxm), exchanges its
 * address with MPI_Allgather, then:
 *   - streams `msgs` tagged messages to every other rank. The receiver keeps `window` receive
 *     buffers posted for each source; the sender takes one credit per message from a
 *     compcntr credit tracker (compcntr_credits_adopt, one window per peer), and the receiver
 *     returns credits over the network, in batches, as zero-byte fi_tsenddata messages whose
 *     CQ data is the number of credits. The sender's progress counts them into that peer's
 *     compcntr counter, which is what the tracker waits on: a sender never has more messages in
 *     flight to a peer than that peer has buffers posted for it. Ranks of one node
 *     (MPI_COMM_TYPE_SHARED) share those counters instead (a compcntr shared device per node):
 *     the receiver returns credits by incrementing the sender's counter itself, no message.
 *   - issues `writes` RMA writes to every other rank's window, counted by a compcntr counter
 *     (the CQ bridge on the transmit CQ, FI_WRITE) and finished by compcntr_tracker_quiet.
 *     To a rank of its node a write is a put through shared memory instead (the node's RMA
 *     windows live in one shared segment): a memcpy into the peer's window, then increments of
 *     the peer's "landed" counter (which the peer waits on before it checks those bytes) and of
 *     the counter of a second completion tracker, both on the node's shared device.
 * Everything is verified: payload checksums, exactly-once delivery, credit discipline,
 * compcntr's counts against the provider's own fid_cntr counters, the RMA windows' contents.
 *
 * The engine's files: endpoint.c (libfabric set-up, rt_open, rt_close), counters.c (compcntr's
 * counters, bridge and trackers; the node-shared device), progress.c (both CQs, receive checks,
 * credit return), messages.c (credits + messages), rma.c (RMA + quiet), report.c (the live
 * line, the counts, the table and checks).
 */
#ifndef COMPCNTR_EXAMPLES_RUNTIME_RT_H
#define COMPCNTR_EXAMPLES_RUNTIME_RT_H

#include <stddef.h>
#include <stdint.h>

/* Callbacks for a program built around the engine, called on the rank's own thread; any may be
 * NULL. compcntr_runtime sets none; its test build (tests/runtime/rt_faults.c) injects failures
 * and feeds a watchdog through them. */
struct rt_callbacks {
	void *ctx;
	void (*sent)(void *ctx, uint64_t sent); /* after each data message posted (sent so far) */
	void (*alive)(void *ctx); /* progress: every 64 calls, and before it yields the CPU */
};

struct rt_opts {
	const char *provider;   /* fi_getinfo provider name (default "tcp;ofi_rxm") */
	const char *addr;       /* local address for FI_SOURCE (NULL: the provider's choice) */
	const char *iface;      /* network interface (sets FI_TCP_IFACE / FI_SOCKETS_IFACE) */
	uint64_t msgs;          /* messages from every rank to every other rank */
	uint32_t size;          /* bytes per message (>= sizeof(struct rt_msg_hdr)) */
	uint32_t window;        /* receive buffers each rank keeps posted per source */
	int vary_windows;       /* odd ranks post window + window / 2 (per-peer windows) */
	uint32_t batch;         /* credits returned per credit message (0: window / 4, >= 1) */
	int flow; /* 1: credit flow control; 0: none (the reference: senders never wait) */
	int node_shm; /* 1 (default): credits and RMA between ranks of one node by shared
	               * counters and shared memory; 0: everything over libfabric */
	int ranks_per_node; /* > 0: a node is K ranks of a host (local and remote peers on one) */
	uint64_t writes; /* RMA writes to every other rank */
	uint32_t wsize; /* bytes per RMA write */
	uint32_t rma_batch; /* writes per peer between two quiets */
	int timeout_ms; /* bound of every wait; expiry aborts the job */
	int live; /* rank 0 prints a one-line live progress display */
	int spin_us; /* hot-poll time of waits before backing off (default 50; < 0: never
	                         * sleep, poll the network like an MPI progress loop) */
	int interval_us; /* longest sleep between progress calls in a wait (default 100) */
	const struct rt_callbacks *callbacks; /* NULL: none */
};

void rt_default_opts(struct rt_opts *o);

/* The header of every data message. */
struct rt_msg_hdr {
	uint32_t src, dst;
	uint64_t seq; /* 0.. msgs-1, per (src, dst) */
	uint64_t credits_seen; /* credits the sender had received from dst when it sent this */
	uint64_t sum; /* checksum of the header fields above and the payload */
};

/* What one rank measured and checked (gathered to rank 0; plain data). */
struct rt_stats {
	int32_t rank;
	uint32_t my_window; /* buffers posted per source by this rank */
	uint64_t sent, received; /* data messages */
	uint64_t credit_msgs_sent, credits_returned, credits_got;
	uint64_t max_inflight; /* largest issued - returned seen right after an acquire */
	uint64_t max_inflight_window; /* the window of the peer where max_inflight was seen */
	uint64_t inflight_violations; /* sends with issued - returned above the peer's window */
	uint64_t acquire_waits; /* acquires that had to wait */
	uint64_t bad_payload, duplicates, missing, out_of_order;
	uint64_t
	        credit_violations; /* messages the sender had no credit for (seq >= window + seen) */
	uint64_t rx_errors, tx_errors; /* error completions (truncation, ...) */
	uint64_t writes, quiets, quiet_eio; /* writes: RMA writes issued, both ways */
	uint64_t shm_puts, fi_writes; /* ... to local peers by shared memory / by fi_write */
	uint64_t cc_puts; /* shared-memory puts complete: the local tracker's counter */
	uint64_t shm_landed; /* local peers' puts counted landed here (this rank's counters) */
	uint64_t window_bad; /* bytes of this rank's RMA window that did not match */
	uint64_t cc_sends, pv_sends, cc_recvs, pv_recvs, cc_writes, pv_writes;
	uint64_t cc_errors, pv_errors;
	uint64_t pair_sum_mismatch; /* sources whose checksum sum differs from what they sent */
	double msg_seconds; /* wall time of the messaging phase */
	uint32_t local_peers, remote_peers; /* credits by shared counters / by libfabric */
	uint64_t credits_shm, credit_incs; /* credits returned into local peers' counters, and
	                                    * the increments that did it */
};

struct rt; /* opaque engine */

/* Opens the endpoint and everything around it; exchanges addresses with MPI_Allgather. On
 * failure prints the reason and returns NULL (the caller aborts the job). MPI must be
 * initialised. */
struct rt *rt_open(const struct rt_opts *o);
/* The messaging phase (with or without credits), then waits until every message sent and
 * received is complete. 0, or -1 after printing why (the caller aborts). */
int rt_messages(struct rt *rt);
/* The RMA phase: writes + quiets, then verifies this rank's window. 0 or -1. */
int rt_rma(struct rt *rt);
/* Waits (driving progress) until every rank has arrived, then compares compcntr's counters
 * with the provider's and fills st. 0 or -1. */
int rt_finish(struct rt *rt, struct rt_stats *st);
/* For repeated measurements (the benchmark): after rt_messages, prepares the next round of
 * `msgs` messages per pair (reposts the receive windows, then a barrier). 0 or -1. */
int rt_next_round(struct rt *rt);
/* A barrier that keeps driving this rank's endpoint. 0 or -1 (timeout). */
int rt_barrier(struct rt *rt);
/* What this rank counted so far (msg_seconds: the last rt_messages call). */
const struct rt_stats *rt_stats_of(const struct rt *rt);
void rt_close(struct rt *rt);

/* The provider's name, and the options in effect (defaults filled in: batch, size). */
const char *rt_provider(const struct rt *rt);
const struct rt_opts *rt_opts_of(const struct rt *rt);

/* Prints the per-rank table (rank 0) and the checks; returns 0 if every check passed. */
int rt_report(const struct rt_opts *o, const struct rt_stats *all, int nranks, double wall);

/* The program (runtime.c), for main.c and the test build's main: parses argv into *o (MPI
 * initialised); -1 to go on, else the exit code (after --help, or a usage error printed). */
int rt_parse_args(int argc, char **argv, struct rt_opts *o);
/* Runs the phases and the report; returns the exit code (a failing rank aborts the job). */
int rt_run(const struct rt_opts *o);

#endif
