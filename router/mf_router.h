/* moeflip router: routing rules as pure functions over one token's scores.
 *
 * Canonical order: larger score first; equal scores, lower expert index
 * first. This is the set torch.topk selects on CUDA (ties at the boundary
 * filled in index order), made total so every backend agrees. */
#ifndef MF_ROUTER_H
#define MF_ROUTER_H

#include "mf_core.h"

typedef enum mf_route_kind {
    MF_ROUTE_KIND_SOFTMAX_TOPK,   /* p = softmax(logits); top-k of p; renormalise iff norm_topk */
} mf_route_kind;

typedef struct mf_route_spec {
    mf_route_kind kind;
    int n_experts, top_k;
    bool norm_topk;
    mf_dtype opmath;     /* F32: softmax and renormalisation in fp32 (as HF); F64: exact reference */
    mf_dtype weight_out; /* dtype the applied weights are rounded to (HF: bf16 for OLMoE/Qwen, fp32 for Mixtral) */
} mf_route_spec;

typedef struct mf_route_out {
    uint16_t *ids;       /* [k], rank order */
    double *weights;     /* [k], as applied */
    double margin_logit; /* k-th minus (k+1)-th raw score (0 when k == E) */
    double margin_prob;  /* the same in probability units */
    bool tie;            /* k-th and (k+1)-th probabilities are equal */
} mf_route_out;

/* Indices of the k largest values in canonical order. */
void mf_topk(const double *scores, int n, int k, uint16_t *ids);

/* softmax over n values computed in opmath (F32: every step rounded to fp32,
 * division by the sum as CUDA does it). */
void mf_softmax(const double *x, int n, mf_dtype opmath, double *p);

/* Routes one token: raw router logits [E] -> ids, weights, margins. probs
 * (scratch, [E]) receives the probabilities. */
void mf_route(const mf_route_spec *spec, const double *logits, double *probs, mf_route_out *out);

/* The weights of the k experts ids (rank order) from the probabilities probs [E] of one token, as mf_route
 * gives them for its own choice: the experts' probabilities, renormalised over the k iff norm_topk (summed in
 * rank order), rounded to weight_out. mf_route computes its weights here; routing replay (a run dispatching
 * another run's experts with its own router's weights) does too. */
void mf_route_weights(const mf_route_spec *spec, const double *probs, const uint16_t *ids, double *weights);

#endif
