/* P11's C side: the timed loops of the C API rows, in a C translation unit compiled as a C
 * runtime compiles its own code (the C compiler, <compcntr/compcntr.h>, linked against the
 * shared libcompcntr, nothing from the C++ side). Each loop is a noinline function taking the
 * counter (or the atomic) by pointer, as the C++ loops of P1/P2 take theirs by reference, and
 * consumes what it reads with an empty asm (bench::keep's C twin), so nothing is optimised away.
 * The loops check every return value the way careful C code does (`if (ret) ...`); a non-zero
 * return is counted in *failures so the row can report it (it never happens on a live counter). */
#include <compcntr/compcntr.h>

#include <stdatomic.h>
#include <stdint.h>

#include "p11_c_loops.h"

#define KEEP(v) __asm__ volatile("" : : "r"(v))

__attribute__((noinline)) void p11_c_read(struct compcntr_comp_cntr *cc, uint64_t n,
                                          uint64_t *failures)
{
	uint64_t bad = 0;
	for (uint64_t i = 0; i < n; ++i) {
		uint64_t v;
		if (compcntr_read_comp_cntr(cc, &v) != 0)
			++bad;
		KEEP(v);
	}
	*failures += bad;
}

__attribute__((noinline)) void p11_c_read_err(struct compcntr_comp_cntr *cc, uint64_t n,
                                              uint64_t *failures)
{
	uint64_t bad = 0;
	for (uint64_t i = 0; i < n; ++i) {
		uint64_t v;
		if (compcntr_read_err_comp_cntr(cc, &v) != 0)
			++bad;
		KEEP(v);
	}
	*failures += bad;
}

__attribute__((noinline)) void p11_c_inc(struct compcntr_comp_cntr *cc, uint64_t n,
                                         uint64_t *failures)
{
	uint64_t bad = 0;
	for (uint64_t i = 0; i < n; ++i)
		if (compcntr_inc_comp_cntr(cc, 1) != 0)
			++bad;
	*failures += bad;
}

__attribute__((noinline)) void p11_c_inc_err(struct compcntr_comp_cntr *cc, uint64_t n,
                                             uint64_t *failures)
{
	uint64_t bad = 0;
	for (uint64_t i = 0; i < n; ++i)
		if (compcntr_inc_err_comp_cntr(cc, 1) != 0)
			++bad;
	*failures += bad;
}

/* A wait whose threshold is already reached (the common case of a runtime's completion check):
 * the call must return 0 at once. */
__attribute__((noinline)) void p11_c_wait_satisfied(struct compcntr_comp_cntr *cc,
                                                    uint64_t threshold, uint64_t n,
                                                    uint64_t *failures)
{
	uint64_t bad = 0;
	for (uint64_t i = 0; i < n; ++i)
		if (compcntr_wait_comp_cntr(cc, threshold, 1000) != 0)
			++bad;
	*failures += bad;
}

/* The raw C11 atomics a C runtime would otherwise use. */
__attribute__((noinline)) void p11_c_raw_load(_Atomic uint64_t *a, uint64_t n)
{
	for (uint64_t i = 0; i < n; ++i) {
		uint64_t v = atomic_load_explicit(a, memory_order_acquire);
		KEEP(v);
	}
}

__attribute__((noinline)) void p11_c_raw_fetch_add(_Atomic uint64_t *a, uint64_t n)
{
	for (uint64_t i = 0; i < n; ++i)
		atomic_fetch_add(a, 1);
}
