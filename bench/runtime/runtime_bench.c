/* compcntr_runtime_bench: the MPI half of benchmark row P15 (bench/rows/p15_runtime.cpp runs it
 * through mpirun and turns its output into table lines). Every variant runs on the same ranks in
 * the same job, samples interleaved (the order alternates per repetition):
 *
 *   credits   messages from every rank to every other rank over libfabric (examples/runtime's
 *             engine), compcntr credit flow control, credits returned by the receivers: into
 *             the sender's shared counter when the two share a node (rows P19), by libfabric
 *             messages otherwise or with --no-node-shm (row P15)
 *   msgcredits  (--msg-credits) the same as credits with every credit returned by a libfabric
 *             message (--no-node-shm's way), in the same job: what the shared counters save
 *   noflow    the same traffic without flow control (no credits, no acquire; the receivers
 *             repost the same window and what finds no buffer waits in the provider)
 *   mpi       the same exchange with MPI_Isend/MPI_Irecv windows of the same size (osu_mbw_mr
 *             style: post a window of receives and sends per peer, MPI_Waitall) on whatever
 *             transport mpirun gave Open MPI (the row runs it with btl tcp,self and with the
 *             default shared-memory transport)
 *   quiet     rank 0: one fi_write to rank 1, finished by compcntr_tracker_quiet (the tracker's
 *             counter fed by compcntr's CQ bridge)
 *   cntrwait  rank 0: one fi_write, finished by fi_cntr_wait on the provider's own write counter
 *
 * Output (rank 0, stdout): "sample <variant> <ns per message or per write> ..." lines (reps values
 * each) and "info key=value" lines. Messages, two clocks: CPU time of every rank's thread (all
 * libfabric work runs there, manual progress; a waiting rank yields its core) summed and divided
 * by all messages (credits, noflow, mpi: the cost of a message, both ends, robust on a shared
 * machine), and wall time of the slowest rank per message it sent (*_wall: the delivered rate,
 * which on an oversubscribed or busy machine measures the scheduler as much as the code).
 * Writes: wall time per write. Exit code 0 when everything ran and checked.
 */
#define _GNU_SOURCE
#include "rt_bench.h"

#include <mpi.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double slowest(double t)
{
	double m = 0;
	MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return m;
}

static double total(double t)
{
	double m = 0;
	MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	return m;
}

static double thread_cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One more round of messages on rt: the CPU time of every rank's thread in it (all libfabric
 * work runs there: manual progress) summed over the ranks, per message; *wall: the slowest
 * rank's wall time (the engine's msg_seconds) per message it sent. */
static double round_ns(struct rt *rt, double all_msgs, double per_rank_msgs, double *wall)
{
	if (rt_next_round(rt))
		MPI_Abort(MPI_COMM_WORLD, 2);
	const double c0 = thread_cpu_s();
	if (rt_messages(rt))
		MPI_Abort(MPI_COMM_WORLD, 2);
	const double cpu = thread_cpu_s() - c0;
	*wall = slowest(rt_stats_of(rt)->msg_seconds) * 1e9 / per_rank_msgs;
	return total(cpu) * 1e9 / all_msgs;
}

/* MPI_Isend/MPI_Irecv windows: msgs messages of size bytes to every other rank, at most window
 * outstanding per peer and direction. Returns this rank's wall time; *cpu its thread CPU time. */
static double mpi_exchange(uint64_t msgs, uint32_t size, uint32_t window, char *sbuf, char *rbuf,
                           MPI_Request *reqs, double *cpu)
{
	int rank, n;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	MPI_Barrier(MPI_COMM_WORLD);
	const double t0 = MPI_Wtime(), c0 = thread_cpu_s();
	for (uint64_t k = 0; k < msgs; k += window) {
		const uint32_t w = (uint32_t)(msgs - k < window ? msgs - k : window);
		int r = 0;
		for (int d = 1; d < n; d++) {
			const int src = (rank - d + n) % n;
			for (uint32_t j = 0; j < w; j++)
				MPI_Irecv(rbuf + ((size_t)src * window + j) * size, (int)size,
				          MPI_BYTE, src, 1, MPI_COMM_WORLD, &reqs[r++]);
		}
		for (int d = 1; d < n; d++) {
			const int dst = (rank + d) % n;
			for (uint32_t j = 0; j < w; j++)
				MPI_Isend(sbuf + ((size_t)dst * window + j) * size, (int)size,
				          MPI_BYTE, dst, 1, MPI_COMM_WORLD, &reqs[r++]);
		}
		MPI_Waitall(r, reqs, MPI_STATUSES_IGNORE);
	}
	*cpu = thread_cpu_s() - c0;
	return MPI_Wtime() - t0;
}

static void print_samples(const char *name, const double *v, int n)
{
	printf("sample %s", name);
	for (int i = 0; i < n; i++)
		printf(" %.1f", v[i]);
	printf("\n");
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	struct rt_opts o;
	rt_default_opts(&o);
	o.msgs = 20000;
	o.writes = 64;
	o.rma_batch = 64;
	o.timeout_ms = 30000;
	int reps = 7, mpi_only = 0, writes_per_sample = 200, msg_credits = 0;
	uint32_t small_window =
	        0;  /* > 0: also credits with this window (the latency-bound regime) */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
		if (!strcmp(a, "--reps"))
			reps = atoi(v), i++;
		else if (!strcmp(a, "--msgs"))
			o.msgs = strtoull(v, NULL, 0), i++;
		else if (!strcmp(a, "--size"))
			o.size = (uint32_t)strtoul(v, NULL, 0), i++;
		else if (!strcmp(a, "--window"))
			o.window = (uint32_t)strtoul(v, NULL, 0), i++;
		else if (!strcmp(a, "--writes"))
			writes_per_sample = atoi(v), i++;
		else if (!strcmp(a, "--spin-us"))
			o.spin_us = atoi(v), i++;
		else if (!strcmp(a, "--batch"))
			o.batch = (uint32_t)strtoul(v, NULL, 0), i++;
		else if (!strcmp(a, "--addr"))
			o.addr = v, i++;
		else if (!strcmp(a, "--provider"))
			o.provider = v, i++;
		else if (!strcmp(a, "--mpi-only"))
			mpi_only = 1;
		else if (!strcmp(a, "--no-node-shm"))
			o.node_shm = 0;
		else if (!strcmp(a, "--msg-credits"))
			msg_credits = 1;
		else if (!strcmp(a, "--small-window"))
			small_window = (uint32_t)strtoul(v, NULL, 0), i++;
		else {
			if (rank == 0)
				fprintf(stderr, "compcntr_runtime_bench: unknown option '%s'\n", a);
			MPI_Finalize();
			return 2;
		}
	}
	if (size < 2 || reps < 1 || o.msgs == 0) {
		if (rank == 0)
			fprintf(stderr, "compcntr_runtime_bench: needs >= 2 ranks, --reps >= 1, "
			                "--msgs >= 1\n");
		MPI_Finalize();
		return 2;
	}
	if (o.size < sizeof(struct rt_msg_hdr))
		o.size = sizeof(struct rt_msg_hdr);
	const double per_rank_msgs = (double)o.msgs * (size - 1);
	double *cc = calloc((size_t)reps, sizeof *cc), *nf = calloc((size_t)reps, sizeof *nf);
	double *mp = calloc((size_t)reps, sizeof *mp), *qt = calloc((size_t)reps, sizeof *qt);
	double *cw = calloc((size_t)reps, sizeof *cw);
	double *ccw = calloc((size_t)reps, sizeof *ccw), *nfw = calloc((size_t)reps, sizeof *nfw);
	double *mpw = calloc((size_t)reps, sizeof *mpw);
	double *sw = calloc((size_t)reps, sizeof *sw), *sww = calloc((size_t)reps, sizeof *sww);
	double *mc = calloc((size_t)reps, sizeof *mc), *mcw = calloc((size_t)reps, sizeof *mcw);
	const double all_msgs = (double)o.msgs * size * (size - 1);
	double cpu = 0;
	char *sbuf = calloc((size_t)size * o.window, o.size),
	     *rbuf = calloc((size_t)size * o.window, o.size);
	MPI_Request *reqs = calloc(2 * (size_t)size * o.window, sizeof *reqs);
	if (!cc || !nf || !mp || !qt || !cw || !ccw || !nfw || !mpw || !sw || !sww || !mc || !mcw ||
	    !sbuf || !rbuf || !reqs)
		MPI_Abort(MPI_COMM_WORLD, 2);

	struct rt *rtc = NULL, *rtn = NULL, *rts = NULL, *rtm = NULL;
	if (!mpi_only) {
		struct rt_opts on = o;
		on.flow = 0;
		rtc = rt_open(&o);
		rtn = rt_open(&on);
		if (!rtc || !rtn)
			MPI_Abort(MPI_COMM_WORLD, 2);
		/* warm-up: connections, caches, first-touch of every buffer */
		if (rt_messages(rtc) || rt_messages(rtn))
			MPI_Abort(MPI_COMM_WORLD, 2);
		if (small_window) {
			struct rt_opts os = o;
			os.window = small_window;
			os.batch = small_window / 4 ? small_window / 4 : 1;
			rts = rt_open(&os);
			if (!rts || rt_messages(rts))
				MPI_Abort(MPI_COMM_WORLD, 2);
		}
		if (msg_credits) {
			struct rt_opts om = o;
			om.node_shm = 0;
			rtm = rt_open(&om);
			if (!rtm || rt_messages(rtm))
				MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	mpi_exchange(o.msgs, o.size, o.window, sbuf, rbuf, reqs, &cpu);
	for (int r = 0; r < reps; r++) {
		for (int step = 0; step < 5; step++) {
			const int which = (step + r) % 5;  /* rotate the order per repetition */
			if (which == 0 && !mpi_only) {
				cc[r] = round_ns(rtc, all_msgs, per_rank_msgs, &ccw[r]);
			} else if (which == 1 && !mpi_only) {
				nf[r] = round_ns(rtn, all_msgs, per_rank_msgs, &nfw[r]);
			} else if (which == 3 && rts) {
				sw[r] = round_ns(rts, all_msgs, per_rank_msgs, &sww[r]);
			} else if (which == 4 && rtm) {
				mc[r] = round_ns(rtm, all_msgs, per_rank_msgs, &mcw[r]);
			} else if (which == 2) {
				mpw[r] = slowest(mpi_exchange(o.msgs, o.size, o.window, sbuf, rbuf,
				                              reqs, &cpu)) *
				         1e9 / per_rank_msgs;
				mp[r] = total(cpu) * 1e9 / all_msgs;
			}
		}
		if (!mpi_only)
			for (int k = 0; k < 2; k++) {
				const int use_cc = (k + r) % 2 == 0;
				double sum = 0;
				if (rank == 0)
					for (int i = 0; i < writes_per_sample; i++) {
						const double t = rt_one_write(rtc, 1, use_cc);
						if (t < 0)
							MPI_Abort(MPI_COMM_WORLD, 2);
						sum += t;
					}
				/* the other ranks serve their endpoint until rank 0 is done */
				if (rt_barrier(rtc))
					MPI_Abort(MPI_COMM_WORLD, 2);
				(use_cc ? qt : cw)[r] = sum * 1e9 / writes_per_sample;
			}
	}
	int rc = 0;
	if (!mpi_only) {
		/* The checks of the last round of each variant, and compcntr's counts against the
		 * provider's over everything this job did. */
		struct rt_stats sc, sn, sm;
		memset(&sm, 0, sizeof sm);
		if (rt_finish(rtc, &sc) || rt_finish(rtn, &sn) || (rtm && rt_finish(rtm, &sm)))
			MPI_Abort(MPI_COMM_WORLD, 2);
		uint64_t mine[4] = {
			(sc.cc_sends != sc.pv_sends) + (sc.cc_recvs != sc.pv_recvs) +
			        (sc.cc_writes != sc.pv_writes) + (sn.cc_sends != sn.pv_sends) +
			        (sn.cc_recvs != sn.pv_recvs) + (sm.cc_sends != sm.pv_sends) +
			        (sm.cc_recvs != sm.pv_recvs) +
			        (sc.credits_returned != sc.credits_got) +
			        (sm.credits_returned != sm.credits_got),
			sc.credit_violations + sc.inflight_violations + sm.credit_violations +
			        sm.inflight_violations,
			sc.bad_payload + sc.duplicates + sc.missing + sn.bad_payload +
			        sn.duplicates + sn.missing + sm.bad_payload + sm.duplicates +
			        sm.missing,
			sc.max_inflight,
		};
		uint64_t sum[4];
		MPI_Reduce(mine, sum, 3, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
		MPI_Reduce(&mine[3], &sum[3], 1, MPI_UINT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
		/* how the credits went: ranks that returned credits through shared counters */
		int shm_ranks = 0, with_local = sc.credits_shm > 0;
		MPI_Reduce(&with_local, &shm_ranks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
		if (rank == 0) {
			printf("info provider=%s\n", rt_provider(rtc));
			printf("info counts_differing=%" PRIu64 "\n", sum[0]);
			printf("info credit_violations=%" PRIu64 "\n", sum[1]);
			printf("info delivery_errors=%" PRIu64 "\n", sum[2]);
			printf("info max_inflight=%" PRIu64 "\n", sum[3]);
			printf("info shm_credit_ranks=%d\n", shm_ranks);
			rc = sum[0] || sum[1] || sum[2];
		}
	}
	if (rank == 0) {
		printf("info ranks=%d\ninfo msgs=%" PRIu64
		       "\ninfo size=%u\ninfo window=%u\ninfo writes=%d\n",
		       size, o.msgs, o.size, o.window, writes_per_sample);
		if (!mpi_only) {
			print_samples("credits", cc, reps);
			print_samples("noflow", nf, reps);
			print_samples("credits_wall", ccw, reps);
			print_samples("noflow_wall", nfw, reps);
			if (rts) {
				print_samples("credits_small", sw, reps);
				print_samples("credits_small_wall", sww, reps);
			}
			if (rtm) {
				print_samples("msgcredits", mc, reps);
				print_samples("msgcredits_wall", mcw, reps);
			}
			print_samples("quiet", qt, reps);
			print_samples("cntrwait", cw, reps);
		}
		print_samples("mpi", mp, reps);
		print_samples("mpi_wall", mpw, reps);
		fflush(stdout);
	}
	MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
	rt_close(rtc);
	rt_close(rtn);
	rt_close(rts);
	rt_close(rtm);
	free(mc), free(mcw), free(sw), free(sww), free(ccw), free(nfw), free(mpw), free(cc),
	        free(nf), free(mp), free(qt), free(cw), free(sbuf), free(rbuf), free(reqs);
	MPI_Finalize();
	return rc;
}
