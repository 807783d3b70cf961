/* bench/runtime: the benchmark's helper that reaches into examples/runtime's engine
 * (rt_bench.c). */
#ifndef COMPCNTR_BENCH_RUNTIME_RT_BENCH_H
#define COMPCNTR_BENCH_RUNTIME_RT_BENCH_H

#include "rt.h"

/* One RMA write to `peer` finished by compcntr_tracker_quiet (cc = 1) or by fi_cntr_wait on
 * the provider's write counter (cc = 0); returns the seconds it took, < 0 on failure. */
double rt_one_write(struct rt *rt, int peer, int cc);

#endif
