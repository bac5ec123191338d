/* rundir/ internals shared by its importers (not a public header). */
#ifndef MF_RUNDIR_INT_H
#define MF_RUNDIR_INT_H

#include "mf_rundir.h"

/* An import's destination: refused when a run (or anything but an empty directory) is there; tmp (cap bytes) gets
 * <out_dir>.tmp.<pid>, where the run is built before it is renamed into place. */
int rundir_import_dest(const char *out_dir, char *tmp, size_t cap, mf_error *err);
/* Experts and weights derived from recorded router logits [rows, E], as CroVA's metrics derive them: the canonical
 * top-k of the raw logits, each weighted by the model's fp32 softmax routing; ids and w are [rows, top_k]. */
void rundir_derive_experts(const mf_config *cfg, const double *router, size_t rows, uint16_t *ids, double *w);

#endif
