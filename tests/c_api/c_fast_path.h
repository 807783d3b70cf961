/* The C functions of c_fast_path.c, for the C++ suite. */
#ifndef COMPCNTR_TESTS_C_FAST_PATH_H
#define COMPCNTR_TESTS_C_FAST_PATH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct compcntr_comp_cntr;
struct compcntr_device;

int cfp_inline_enabled(void);
int cfp_read(struct compcntr_comp_cntr *cc, uint64_t *v);
int cfp_read_err(struct compcntr_comp_cntr *cc, uint64_t *v);
int cfp_inc(struct compcntr_comp_cntr *cc, uint64_t n);
int cfp_inc_err(struct compcntr_comp_cntr *cc, uint64_t n);
int cfp_set(struct compcntr_comp_cntr *cc, uint64_t v);
int cfp_set_err(struct compcntr_comp_cntr *cc, uint64_t v);
int cfp_wait(struct compcntr_comp_cntr *cc, uint64_t threshold, int timeout_ms);
int cfp_exported_read(struct compcntr_comp_cntr *cc, uint64_t *v);
int cfp_exported_inc(struct compcntr_comp_cntr *cc, uint64_t n);
ptrdiff_t cfp_offset_in_slot(struct compcntr_comp_cntr *cc);
int cfp_use_after_destroy(struct compcntr_device *dev);

#ifdef __cplusplus
}
#endif

#endif
