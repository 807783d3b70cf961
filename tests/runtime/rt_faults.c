/* compcntr_runtime_test: the test build of examples/runtime's compcntr_runtime (suite runtime).
 * The same program (examples/runtime's files but its main.c) with a main of its own that takes
 * the test's options out of the command line and, through the engine's callbacks (struct
 * rt_callbacks), injects failures and feeds a watchdog:
 *
 *   --fail-rank R --fail-at K --fail-mode exit|hang
 *                  rank R, after posting its K-th message, exits (code 3) or hangs (makes no
 *                  more progress); the suite asserts that the job fails, says why, and ends in
 *                  bounded time. --fail-mode defaults to exit.
 *   --watchdog-s S a rank that spends S seconds without progress ends (code 4). Default: four
 *                  timeouts + 10 s.
 *
 * Every other option is compcntr_runtime's. The watchdog measures time *outside* the engine's
 * progress: every wait of the engine is bounded by --timeout-ms and drives progress, which
 * calls the `alive` callback every 64 calls and before it yields the CPU (on a busy machine one
 * yield can last many ms), so a rank that stops calling it for S seconds is stuck where
 * nothing is bounded (a blocking MPI call on a hung peer) or stopped. The callback re-arms
 * alarm(S) at most every 250 ms, so a healthy run of any length is never cut short. Setting up
 * (rt_open: MPI collectives, no progress yet) gets the default allowance however short S is:
 * it took about 1 s on a busy 2-vCPU machine.
 */
#define _GNU_SOURCE
#include "rt.h"

#include <mpi.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum fail_mode { FAIL_NONE = 0, FAIL_EXIT, FAIL_HANG };

struct faults {
	int rank;         /* this rank */
	int fail_rank;    /* -1: none */
	int fail_mode;    /* enum fail_mode */
	uint64_t fail_at; /* messages posted before the failure */
	int watchdog_s;
	double next_pet; /* when the alive callback next re-arms the alarm */
};

static void on_sent(void *ctx, uint64_t sent)
{
	const struct faults *f = ctx;
	if (f->rank != f->fail_rank || f->fail_mode == FAIL_NONE || sent < f->fail_at)
		return;
	if (f->fail_mode == FAIL_EXIT) {
		fprintf(stderr,
		        "runtime: rank %d: injected failure after %" PRIu64 " messages: exiting\n",
		        f->rank, sent);
		fflush(stderr);
		_exit(3);
	}
	fprintf(stderr,
	        "runtime: rank %d: injected failure after %" PRIu64
	        " messages: hanging (no progress)\n",
	        f->rank, sent);
	fflush(stderr);
	for (;;)
		pause();
}

static void on_alive(void *ctx)
{
	struct faults *f = ctx;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	const double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
	if (t < f->next_pet)
		return;
	f->next_pet = t + 0.25;
	alarm((unsigned)f->watchdog_s);
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] =
	        "runtime: watchdog: no progress for --watchdog-s seconds (stuck outside "
	        "the bounded waits, e.g. in MPI on a hung peer); exiting\n";
	ssize_t w = write(2, msg, sizeof msg - 1);
	(void)w;
	_exit(4);
}

/* Takes the test's options out of argv (the rest stays in order); their count of arguments
 * left, or -1 after printing a usage error. */
static int take_options(int argc, char **argv, struct faults *f)
{
	int n = 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		const int ours = !strcmp(a, "--fail-rank") || !strcmp(a, "--fail-at") ||
		                 !strcmp(a, "--fail-mode") || !strcmp(a, "--watchdog-s");
		if (!ours) {
			argv[n++] = argv[i];
			continue;
		}
		if (!v) {
			if (f->rank == 0)
				fprintf(stderr, "compcntr_runtime: %s needs a value\n", a);
			return -1;
		}
		i++;
		if (!strcmp(a, "--fail-rank")) {
			f->fail_rank = atoi(v);
		} else if (!strcmp(a, "--fail-at")) {
			f->fail_at = strtoull(v, NULL, 0);
		} else if (!strcmp(a, "--watchdog-s")) {
			f->watchdog_s = atoi(v);
		} else {
			f->fail_mode = !strcmp(v, "exit")   ? FAIL_EXIT
			               : !strcmp(v, "hang") ? FAIL_HANG
			                                    : -1;
			if (f->fail_mode < 0) {
				if (f->rank == 0)
					fprintf(stderr,
					        "compcntr_runtime: --fail-mode exit|hang\n");
				return -1;
			}
		}
	}
	argv[n] = NULL;
	return n;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	struct faults f = { .fail_rank = -1 };
	MPI_Comm_rank(MPI_COMM_WORLD, &f.rank);
	const int n = take_options(argc, argv, &f);
	struct rt_opts o;
	int rc = n < 0 ? 2 : rt_parse_args(n, argv, &o);
	if (rc == 0 && f.rank == 0) /* --help */
		printf("test build: --fail-rank R --fail-at K --fail-mode exit|hang, "
		       "--watchdog-s S (tests/runtime/rt_faults.c)\n");
	if (rc < 0) {
		if (f.fail_rank >= 0 && f.fail_mode == FAIL_NONE)
			f.fail_mode = FAIL_EXIT;
		const int setup_s = 4 * (o.timeout_ms / 1000 + 1) + 10;
		if (f.watchdog_s <= 0)
			f.watchdog_s = setup_s;
		signal(SIGALRM, on_alarm);
		alarm((unsigned)(f.watchdog_s > setup_s ? f.watchdog_s : setup_s));
		const struct rt_callbacks callbacks = { .ctx = &f,
			                                .sent = on_sent,
			                                .alive = on_alive };
		o.callbacks = &callbacks;
		rc = rt_run(&o);
		alarm(0);
	}
	MPI_Finalize();
	return rc;
}
