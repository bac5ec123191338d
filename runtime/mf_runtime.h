/* moeflip runtime: the forward pass of a loaded model over one sequence,
 * recording what the router did at every MoE layer.
 *
 * The CPU executor follows transformers v5 (5.17, "v5-late" in
 * shared/reference/hf-moe-forward.md §0) cast point by cast point: in a bf16
 * run every op's result is rounded to bf16, elementwise math in between runs
 * in fp32 ("opmath"), matrix products accumulate in fp32; the MoE combine is
 * grouped_mm's (slot products summed in fp32, one rounding). In an fp64 run
 * every operation is in double, from the exact stored weights. */
#ifndef MF_RUNTIME_H
#define MF_RUNTIME_H

#include "mf_core.h"
#include "mf_numerics.h"
#include "mf_models.h"

typedef struct mf_run_opts {
    mf_precision prec;
    int threads;
    bool record_router_in;       /* keep the router's input [L, T, H] */
    const mf_numerics *numerics; /* how matrix products run (NULL: native) */
} mf_run_opts;

/* What one sequence's forward pass produced. Arrays are row-major. */
typedef struct mf_seq_result {
    int T, n_moe, k, E, V, H;
    uint16_t *topk_ids;     /* [n_moe, T, k], rank order */
    double *topk_w;         /* [n_moe, T, k], the weights applied */
    double *router;         /* [n_moe, T, E], raw router logits as computed */
    double *shared_gate;    /* [n_moe, T], sigmoid gate of the shared expert, or NULL */
    double *router_in;      /* [n_moe, T, H] or NULL */
    double *logits;         /* [T, V] */
} mf_seq_result;

/* Loads a model for a run of the given precision (weights rounded to the
 * policy's weight dtype, packed for its compute type). */
int mf_runtime_load(mf_model **out, const char *dir, const mf_precision *prec, mf_error *err);

int mf_forward_cpu(const mf_model *m, const mf_run_opts *o, const int32_t *tokens, int T, mf_seq_result *r,
                   mf_error *err);
void mf_seq_result_free(mf_seq_result *r);

/* RoPE tables [T, rot_dim] (cos, sin), as the policy computes them (exposed for tests). */
void mf_rope_tables(const mf_config *cfg, const mf_precision *prec, int T, double *cos_t, double *sin_t);

#endif
