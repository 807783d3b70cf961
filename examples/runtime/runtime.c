/* compcntr_runtime: an MPI program whose ranks stream messages to each other over libfabric
 * under compcntr credit flow control, and finish RMA writes with compcntr's quiet. See rt.h and
 * examples/runtime/README.md. This file is the program around the engine: its options and the
 * run (main.c calls the two).
 *
 *   mpirun -np 4 compcntr_runtime --addr 127.0.0.1                 # one host
 *   mpirun -np 8 --hostfile hosts compcntr_runtime --iface eth0    # across hosts
 *
 * Exit code 0 only if every check passed on every rank; a rank that fails (or times out
 * waiting for a dead peer) aborts the whole job with MPI_Abort.
 */
#define _GNU_SOURCE
#include "rt.h"

#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: mpirun -np N compcntr_runtime [options]\n"
	        "  --provider NAME    libfabric provider (default tcp;ofi_rxm)\n"
	        "  --addr IP          local address to bind (FI_SOURCE); default: the provider's "
	        "choice\n"
	        "  --iface NAME       network interface for the tcp/sockets providers "
	        "(FI_TCP_IFACE)\n"
	        "  --msgs N           messages from every rank to every other rank (default "
	        "20000)\n"
	        "  --size B           bytes per message (default 64, at least 32)\n"
	        "  --window W         receive buffers each rank posts per source (default 16)\n"
	        "  --vary-windows     odd ranks post W + W/2 buffers (per-peer windows)\n"
	        "  --batch B          credits per credit message (default W/4)\n"
	        "  --no-flow          no flow control (reference): senders do not wait for "
	        "credits\n"
	        "  --no-node-shm      credits and RMA by libfabric between ranks of one node "
	        "too\n"
	        "  --ranks-per-node K treat every K ranks of a host as a node of their own (try "
	        "local and\n"
	        "                     remote peers on one host)\n"
	        "  --writes N         RMA writes to every other rank (default 256)\n"
	        "  --wsize B          bytes per RMA write (default 64)\n"
	        "  --rma-batch N      writes per peer between two quiets (default 32)\n"
	        "  --timeout-ms T     bound of every wait (default 20000); expiry aborts the job\n"
	        "  --live             rank 0 shows a live one-line progress display\n"
	        "  --spin-us U        hot-poll time of waits (default 50)\n"
	        "  --interval-us U    longest sleep between progress calls in a wait (default "
	        "100)\n");
}

int rt_parse_args(int argc, char **argv, struct rt_opts *op)
{
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	struct rt_opts o;
	rt_default_opts(&o);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define VAL()                                                                                      \
	do {                                                                                       \
		if (!v) {                                                                          \
			if (rank == 0)                                                             \
				fprintf(stderr, "compcntr_runtime: %s needs a value\n", a);        \
			return 2;                                                                  \
		}                                                                                  \
		i++;                                                                               \
	} while (0)
		if (!strcmp(a, "--provider")) {
			VAL();
			o.provider = v;
		} else if (!strcmp(a, "--addr")) {
			VAL();
			o.addr = v;
		} else if (!strcmp(a, "--iface")) {
			VAL();
			o.iface = v;
		} else if (!strcmp(a, "--msgs")) {
			VAL();
			o.msgs = strtoull(v, NULL, 0);
		} else if (!strcmp(a, "--size")) {
			VAL();
			o.size = (uint32_t)strtoul(v, NULL, 0);
		} else if (!strcmp(a, "--window")) {
			VAL();
			o.window = (uint32_t)strtoul(v, NULL, 0);
		} else if (!strcmp(a, "--vary-windows"))
			o.vary_windows = 1;
		else if (!strcmp(a, "--batch")) {
			VAL();
			o.batch = (uint32_t)strtoul(v, NULL, 0);
		} else if (!strcmp(a, "--no-flow"))
			o.flow = 0;
		else if (!strcmp(a, "--no-node-shm"))
			o.node_shm = 0;
		else if (!strcmp(a, "--ranks-per-node")) {
			VAL();
			o.ranks_per_node = atoi(v);
		} else if (!strcmp(a, "--writes")) {
			VAL();
			o.writes = strtoull(v, NULL, 0);
		} else if (!strcmp(a, "--wsize")) {
			VAL();
			o.wsize = (uint32_t)strtoul(v, NULL, 0);
		} else if (!strcmp(a, "--rma-batch")) {
			VAL();
			o.rma_batch = (uint32_t)strtoul(v, NULL, 0);
		} else if (!strcmp(a, "--timeout-ms")) {
			VAL();
			o.timeout_ms = atoi(v);
		} else if (!strcmp(a, "--live"))
			o.live = 1;
		else if (!strcmp(a, "--spin-us")) {
			VAL();
			o.spin_us = atoi(v);
		} else if (!strcmp(a, "--interval-us")) {
			VAL();
			o.interval_us = atoi(v);
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			if (rank == 0)
				usage(stdout);
			return 0;
		} else {
			if (rank == 0) {
				fprintf(stderr, "compcntr_runtime: unknown option '%s'\n", a);
				usage(stderr);
			}
			return 2;
		}
	}
	if (size < 2) {
		if (rank == 0)
			fprintf(stderr,
			        "compcntr_runtime: needs at least 2 ranks (mpirun -np 2 ...)\n");
		return 2;
	}
#undef VAL
	*op = o;
	return -1;
}

int rt_run(const struct rt_opts *op)
{
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const struct rt_opts o = *op;
	const double t0 = MPI_Wtime();
	struct rt *rt = rt_open(&o);
	if (!rt)
		MPI_Abort(MPI_COMM_WORLD, 2);
	if (rank == 0) {
		printf("compcntr runtime example: %d ranks over libfabric %s, %s\n", size,
		       rt_provider(rt),
		       o.flow ? "credit flow control (compcntr_credits, credits returned by the "
		                "receivers)"
		              : "no flow control (senders never wait; receivers repost --window "
		                "buffers)");
		const struct rt_opts *eo = rt_opts_of(rt);
		printf("  each rank sends %llu messages of %u B to every other rank; receivers "
		       "keep %u%s buffers "
		       "posted per source%s;\n  then %llu RMA writes to every other rank, %u per "
		       "peer between two "
		       "compcntr_tracker_quiet calls%s\n",
		       (unsigned long long)eo->msgs, eo->size, eo->window,
		       eo->vary_windows ? " (odd ranks 1.5x)" : "",
		       !eo->flow ? ""
		       : eo->node_shm
		               ? " and return credits: to ranks of their node by incrementing "
		                 "the sender's\n  shared counter (no message), to others in "
		                 "batches (zero-byte messages whose CQ data is the count)"
		               : " and return credits in batches (zero-byte messages whose CQ "
		                 "data is the count)",
		       (unsigned long long)eo->writes, eo->rma_batch,
		       eo->node_shm
		               ? ":\n  to ranks of their node by shared memory (memcpy into the "
		                 "peer's window, completion\n  in shared counters), to others "
		                 "by fi_write"
		               : "");
		fflush(stdout);
	}
	if (rt_messages(rt) || rt_rma(rt))
		MPI_Abort(MPI_COMM_WORLD, 2);
	struct rt_stats st;
	if (rt_finish(rt, &st))
		MPI_Abort(MPI_COMM_WORLD, 2);
	const double wall = MPI_Wtime() - t0;
	struct rt_stats *all = rank == 0 ? calloc((size_t)size, sizeof *all) : NULL;
	MPI_Gather(&st, sizeof st, MPI_BYTE, all, sizeof st, MPI_BYTE, 0, MPI_COMM_WORLD);
	int rc = 0;
	if (rank == 0)
		rc = rt_report(rt_opts_of(rt), all, size, wall);
	MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
	free(all);
	rt_close(rt);
	return rc;
}
