/* What the CPU and GPU executors share: loading a model for a run, the GPU host's memory bound that the
 * memory check uses before any backend is loaded, and digests of results (a GPU's record is checked against
 * them). */
#include "mf_runtime.h"

#include <stdint.h>

int mf_runtime_load(mf_model **out, const char *dir, const mf_precision *prec, mf_error *err) {
    return mf_model_load(out, dir, prec->weights, 0, err);
}

uint64_t mf_forward_gpu_host_bytes(const mf_config *c, int T_) {
    const uint64_t T = (uint64_t)(T_ > 0 ? T_ : 1), V = c->vocab, nm = c->n_moe_layers;
    const uint64_t E = c->n_experts > 0 ? c->n_experts : 1, K = c->top_k > 0 ? c->top_k : 1;
    const uint64_t route = nm * T * (E + K + 1) * 4 + nm * T * K * 2;
    const uint64_t result = T * V * 8 + nm * T * (E * 8 + K * 10 + 8);
    /* pinned: the upload's staging slots, the logits and the routing; then the result and the writer's copy */
    return ((uint64_t)6 * (32u << 20)) + T * V * 4 + route + 2 * result + (64u << 20);
}

const char *const MF_SEQ_DIGEST_NAMES[MF_SEQ_DIGESTS] = {"logits", "router", "topk_ids", "topk_w", "shared_gate"};

void mf_seq_results_digest(const mf_seq_result *r, size_t n, char out[MF_SEQ_DIGESTS][33]) {
    mf_digest_state *d[MF_SEQ_DIGESTS];
    for (int i = 0; i < MF_SEQ_DIGESTS; i++) d[i] = mf_digest_new();
    for (size_t s = 0; s < n; s++) {
        const size_t slots = (size_t)r[s].n_moe * r[s].T;
        mf_digest_update(d[0], r[s].logits, (size_t)r[s].T * r[s].V * sizeof(double));
        if (r[s].router) mf_digest_update(d[1], r[s].router, slots * r[s].E * sizeof(double));
        if (r[s].topk_ids) mf_digest_update(d[2], r[s].topk_ids, slots * r[s].k * sizeof(uint16_t));
        if (r[s].topk_w) mf_digest_update(d[3], r[s].topk_w, slots * r[s].k * sizeof(double));
        if (r[s].shared_gate) mf_digest_update(d[4], r[s].shared_gate, slots * sizeof(double));
    }
    for (int i = 0; i < MF_SEQ_DIGESTS; i++) mf_digest_final(d[i], out[i]);
}
