/* Private interface between libcompcntr-fabric and the hook provider (libcompcntr-fi.so):
 * not installed. The hook registers the fid ops table of its counters so that the public
 * compcntr_fi_cntr_comp_cntr() recognises them (c-api.md: "Under it,
 * compcntr_fi_cntr_comp_cntr() returns the compcntr counter behind an application's fid_cntr").
 * A counter class is recognised by its fid.ops pointer, read from the struct fid header every
 * fid_cntr has; nothing past struct fid_cntr is read for a counter of another class. */
#ifndef COMPCNTR_FABRIC_CNTR_CLASSES_H
#define COMPCNTR_FABRIC_CNTR_CLASSES_H

#include <compcntr/fabric.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct compcntr_comp_cntr *(*compcntr_fi_cntr_class_get)(struct fid_cntr *cntr);

/* Registers a class (idempotent for the same ops). 0, or ENOSPC when 8 classes exist.
 * Classes are never unregistered: register only tables that live as long as the process (the
 * hook module is never unloaded before exit: libfabric dlcloses it in its destructor). */
int compcntr_fi_register_cntr_class(const struct fi_ops *fid_ops, compcntr_fi_cntr_class_get get);

#ifdef __cplusplus
}
#endif

#endif
