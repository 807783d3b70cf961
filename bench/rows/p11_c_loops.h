/* P11's C loops (p11_c_loops.c), declared for the C++ row (p11_c_api.cpp) and for C. */
#ifndef COMPCNTR_BENCH_P11_C_LOOPS_H
#define COMPCNTR_BENCH_P11_C_LOOPS_H

#include <stdint.h>

#ifdef __cplusplus
#include <atomic>
typedef std::atomic<uint64_t> p11_atomic_u64;
extern "C" {
#else
typedef _Atomic uint64_t p11_atomic_u64;
#endif

struct compcntr_comp_cntr;

void p11_c_read(struct compcntr_comp_cntr *cc, uint64_t n, uint64_t *failures);
void p11_c_read_err(struct compcntr_comp_cntr *cc, uint64_t n, uint64_t *failures);
void p11_c_inc(struct compcntr_comp_cntr *cc, uint64_t n, uint64_t *failures);
void p11_c_inc_err(struct compcntr_comp_cntr *cc, uint64_t n, uint64_t *failures);
void p11_c_wait_satisfied(struct compcntr_comp_cntr *cc, uint64_t threshold, uint64_t n,
                          uint64_t *failures);
void p11_c_raw_load(p11_atomic_u64 *a, uint64_t n);
void p11_c_raw_fetch_add(p11_atomic_u64 *a, uint64_t n);

#ifdef __cplusplus
}
#endif

#endif
