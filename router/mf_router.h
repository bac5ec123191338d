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
    /* DeepSeek-V3 / GLM-4.5: s = sigmoid(logits); c = s + bias ranks, s weighs. A group's score is the sum of its two
     * largest c; the topk_group best groups stay, every other expert's c becomes -inf (transformers 5.17's
     * masked_fill); top-k of that (a masked expert only when fewer than k remain, then the lowest index). Weights s of the k, renormalised iff norm_topk (over their sum + 1e-20), times scale. */
    MF_ROUTE_KIND_SIGMOID_GROUP,
    /* DeepSeek-V2: p = softmax(logits); top-k of p, within the topk_group groups of largest max(p) when
     * group_limited (the others' p masked to 0); weights p of the k times scale, never renormalised. */
    MF_ROUTE_KIND_SOFTMAX_GREEDY,
    /* gpt-oss: the logits (the router's bias included) rank; the top-k's weights are the softmax over those k
     * logits alone (in opmath, rounded to weight_out), never scaled. probs receives the softmax over all E (for
     * margins in probability units only: it weighs nothing). */
    MF_ROUTE_KIND_TOPK_SOFTMAX,
} mf_route_kind;

typedef struct mf_route_spec {
    mf_route_kind kind;
    int n_experts, top_k;
    bool norm_topk;
    mf_dtype opmath;     /* F32: softmax and renormalisation in fp32 (as HF); F64: exact reference */
    mf_dtype weight_out; /* dtype the applied weights are rounded to (HF: bf16 for OLMoE/Qwen, fp32 for Mixtral) */
    /* the grouped and scaled kinds */
    int n_group, topk_group;  /* n_group 1: every expert eligible */
    bool group_limited;       /* SOFTMAX_GREEDY: restrict to the best groups */
    const double *bias;       /* SIGMOID_GROUP: e_score_correction_bias [E] (NULL: zeros) */
    double scale;             /* routed_scaling_factor */
} mf_route_spec;

typedef struct mf_route_out {
    uint16_t *ids;       /* [k], rank order */
    double *weights;     /* [k], as applied */
    double margin_logit; /* k-th minus (k+1)-th raw score (0 when k == E); the grouped kinds: of the select row */
    double margin_prob;  /* the same in probability units; the grouped kinds: of the select row */
    bool tie;            /* k-th and (k+1)-th probabilities (select-row scores) are equal */
    double *select;      /* [E] or NULL: receives the scores the final top-k ranked (the grouped kinds: biased and
                          * group-masked, -inf or 0 outside the groups; softmax top-k: the probabilities; top-k then
                          * softmax: the logits) */
} mf_route_out;

/* Indices of the k largest values in canonical order. */
void mf_topk(const double *scores, int n, int k, uint16_t *ids);

/* softmax over n values computed in opmath (F32: every step rounded to fp32,
 * division by the sum as CUDA does it). */
void mf_softmax(const double *x, int n, mf_dtype opmath, double *p);

/* Routes one token: raw router logits [E] -> ids, weights, margins. probs
 * (scratch, [E]) receives the probabilities (SIGMOID_GROUP: the sigmoid scores, before the bias). */
void mf_route(const mf_route_spec *spec, const double *logits, double *probs, mf_route_out *out);

/* The weights of the k experts ids (rank order) from the probabilities probs [E] of one token, as mf_route
 * gives them for its own choice: the experts' probabilities, renormalised over the k iff norm_topk (summed in
 * rank order), times the scale of the scaled kinds, rounded to weight_out (TOPK_SOFTMAX: use
 * mf_route_weights_logits, its weights come from the logits). mf_route computes its weights here;
 * routing replay (a run dispatching another run's experts with its own router's weights) does too. */
void mf_route_weights(const mf_route_spec *spec, const double *probs, const uint16_t *ids, double *weights);

/* TOPK_SOFTMAX's weights for the k experts ids (rank order) of one token's logits [E]: softmax over their k
 * logits in opmath, rounded to weight_out. */
void mf_route_weights_logits(const mf_route_spec *spec, const double *logits, const uint16_t *ids, double *weights);

/* probs [E] from raw logits as mf_route computes them: softmax (TOPK_SOFTMAX: over all E), or the sigmoid scores
 * of SIGMOID_GROUP. */
void mf_route_scores(const mf_route_spec *spec, const double *logits, double *probs);

/* The group of expert e under spec (0 when the router has no groups). */
static inline int mf_route_group(const mf_route_spec *spec, int e) {
    return spec->n_group > 1 ? e / (spec->n_experts / spec->n_group) : 0;
}

#endif
