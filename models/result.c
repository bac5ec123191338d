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
