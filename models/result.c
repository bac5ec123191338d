/* A sequence's results: what a forward pass hands to the run writer. */
#include "mf_models.h"

#include <stdlib.h>
#include <string.h>

void mf_seq_result_free(mf_seq_result *r) {
    free(r->topk_ids);
    free(r->topk_w);
    free(r->router);
    free(r->shared_gate);
    free(r->select);
    free(r->router_in);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

void mf_seq_result_shape(mf_seq_result *r, const mf_config *c, int T) {
    r->T = T;
    r->n_moe = c->n_moe_layers;
    r->k = c->top_k;
    r->E = c->n_experts;
    r->V = c->vocab;
    r->H = c->hidden;
}

void mf_seq_result_alloc(mf_seq_result *r, const mf_config *c, int T, const mf_seq_result *like) {
    memset(r, 0, sizeof *r);
    mf_seq_result_shape(r, c, T);
    const size_t slots = (size_t)r->n_moe * (size_t)T;
    /* + 1: a dense model's empty arrays are still allocations, as the forward passes make them */
    r->topk_ids = mf_xmalloc(slots * (size_t)r->k * sizeof *r->topk_ids + 1);
    r->topk_w = mf_xmalloc(slots * (size_t)r->k * sizeof *r->topk_w + 1);
    r->router = mf_xmalloc(slots * (size_t)r->E * sizeof *r->router + 1);
    if (like->shared_gate) r->shared_gate = mf_xmalloc(slots * sizeof *r->shared_gate + 1);
    if (like->select) r->select = mf_xmalloc(slots * (size_t)r->E * sizeof *r->select + 1);
    if (like->router_in) r->router_in = mf_xmalloc(slots * (size_t)r->H * sizeof *r->router_in + 1);
    r->logits = mf_xmalloc((size_t)T * (size_t)r->V * sizeof *r->logits);
}

/* Per MoE layer, n positions of width w from src (laid out for n positions) to dst (for T) at position at. */
#define PLACE_ROWS(field, w)                                                                                        \
    for (size_t l = 0; l < L; l++)                                                                                  \
    memcpy(dst->field + (l * T + at) * (w), src->field + l * n * (w), n * (w) * sizeof *dst->field)

void mf_seq_result_place(mf_seq_result *dst, const mf_seq_result *src, int at_) {
    const size_t L = (size_t)dst->n_moe, T = (size_t)dst->T, at = (size_t)at_, n = (size_t)src->T;
    if (L) {
        PLACE_ROWS(topk_ids, (size_t)dst->k);
        PLACE_ROWS(topk_w, (size_t)dst->k);
        PLACE_ROWS(router, (size_t)dst->E);
        if (dst->shared_gate && src->shared_gate) PLACE_ROWS(shared_gate, (size_t)1);
        if (dst->select && src->select) PLACE_ROWS(select, (size_t)dst->E);
        if (dst->router_in && src->router_in) PLACE_ROWS(router_in, (size_t)dst->H);
    }
    memcpy(dst->logits + at * (size_t)dst->V, src->logits, n * (size_t)dst->V * sizeof *dst->logits);
}
