/* The main job, `moeflip sweep`: a reference and targets of one model traced
 * on one prompt file, every target diffed against the reference and the two
 * vendors against each other, every figure drawn, one report written. It
 * uses every layer below it (models, trace, diff, viz) and nothing uses it
 * but the command. */
#ifndef MF_JOB_H
#define MF_JOB_H

#include "mf_core.h"

typedef struct mf_sweep_opts {
    const char *model_dir;     /* NULL: the embedded default checkpoint */
    const char *input;         /* NULL with the default model: its prompts */
    const char *out_dir;       /* [moeflip-out] */
    const char *reference;     /* "numerics x precision" spec, [fp64 x fp64] */
    const char *targets;       /* comma-separated "numerics x precision" (NULL: the default set) */
    bool repeat;               /* add a repeat of the first target, the noise floor */
    bool replay;               /* add each target's replayed twins: its arithmetic with the reference's routing in
                                * every MoE layer, and through each layer for the curve (trace --replay) */
    int threads;
    int bootstrap;
    /* continue every prompt greedily by this many tokens in every configuration (0: none; -1: the default,
     * MF_SWEEP_DEFAULT_GENERATE on the embedded model's own texts, none on a prompt file of yours) */
    int generate;
} mf_sweep_opts;

#define MF_SWEEP_DEFAULT_GENERATE 16

int mf_sweep(const mf_sweep_opts *o, mf_error *err);

#endif
