/* The C side of suite c_fast_path: calls of the C API as a C program writes them, compiled as
 * C11 with <compcntr/compcntr.h> alone, so they go through the header's inline fast paths
 * (macros over static inline functions) exactly as a user's code does. */
#include <compcntr/compcntr.h>

#include <stddef.h>
#include <stdint.h>

#include "c_fast_path.h"

int cfp_inline_enabled(void)
{
#ifdef COMPCNTR_INLINE_FAST_PATHS
	return 1;
#else
	return 0;
#endif
}

int cfp_read(struct compcntr_comp_cntr *cc, uint64_t *v)
{
	return compcntr_read_comp_cntr(cc, v);
}
int cfp_read_err(struct compcntr_comp_cntr *cc, uint64_t *v)
{
	return compcntr_read_err_comp_cntr(cc, v);
}
int cfp_inc(struct compcntr_comp_cntr *cc, uint64_t n)
{
	return compcntr_inc_comp_cntr(cc, n);
}
int cfp_inc_err(struct compcntr_comp_cntr *cc, uint64_t n)
{
	return compcntr_inc_err_comp_cntr(cc, n);
}
int cfp_set(struct compcntr_comp_cntr *cc, uint64_t v)
{
	return compcntr_set_comp_cntr(cc, v);
}
int cfp_set_err(struct compcntr_comp_cntr *cc, uint64_t v)
{
	return compcntr_set_err_comp_cntr(cc, v);
}
int cfp_wait(struct compcntr_comp_cntr *cc, uint64_t threshold, int timeout_ms)
{
	return compcntr_wait_comp_cntr(cc, threshold, timeout_ms);
}

/* The exported functions, reached by name without a call's parentheses (no macro): what a
 * dlsym() or FFI user gets. */
int cfp_exported_read(struct compcntr_comp_cntr *cc, uint64_t *v)
{
	int (*f)(struct compcntr_comp_cntr *, uint64_t *) = compcntr_read_comp_cntr;
	return f(cc, v);
}
int cfp_exported_inc(struct compcntr_comp_cntr *cc, uint64_t n)
{
	int (*f)(struct compcntr_comp_cntr *, uint64_t) = compcntr_inc_comp_cntr;
	return f(cc, n);
}

/* Where the counter's public struct lies relative to the memory the fast paths use. */
ptrdiff_t cfp_offset_in_slot(struct compcntr_comp_cntr *cc)
{
	return (const char *)cc - (const char *)cc->slot_;
}

/* Creates a counter, destroys it, then increments it: a use after destroy (ASan builds catch it
 * in the fast path's load of cc->slot_). Returns what the increment returned, if it survives. */
int cfp_use_after_destroy(struct compcntr_device *dev)
{
	struct compcntr_comp_cntr_init_attr attr = { 0 };
	struct compcntr_comp_cntr *cc = compcntr_create_comp_cntr(dev, &attr);
	if (cc == NULL || compcntr_destroy_comp_cntr(cc) != 0)
		return -1;
	return compcntr_inc_comp_cntr(cc, 1);
}
