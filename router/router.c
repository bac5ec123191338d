/* Routing: softmax, canonical top-k, optional renormalisation, margins. */
#include "mf_router.h"

#include <math.h>

static inline bool ranks_before(double a, int ia, double b, int ib) {
    /* NaN ranks highest, as in torch.topk's comparator */
    if (isnan(a) != isnan(b)) return isnan(a);
    return a > b || (a == b && ia < ib);
}

void mf_topk(const double *s, int n, int k, uint16_t *ids) {
    /* insertion into a sorted list of k: n and k are small (<= a few hundred) */
    int len = 0;
    for (int i = 0; i < n; i++) {
        int pos = len;
        while (pos > 0 && ranks_before(s[i], i, s[ids[pos - 1]], ids[pos - 1])) pos--;
        if (pos >= k) continue;
        int end = len < k ? len : k - 1;
        for (int j = end; j > pos; j--) ids[j] = ids[j - 1];
        ids[pos] = (uint16_t)i;
        if (len < k) len++;
    }
}

void mf_softmax(const double *x, int n, mf_dtype opmath, double *p) {
    double m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    if (opmath == MF_F64) {
        double s = 0;
        for (int i = 0; i < n; i++) s += (p[i] = exp(x[i] - m));
        for (int i = 0; i < n; i++) p[i] /= s;
        return;
    }
    float s = 0;
    for (int i = 0; i < n; i++) {
        float e = (float)exp((double)((float)x[i] - (float)m));
        p[i] = e;
        s += e;
    }
    for (int i = 0; i < n; i++) p[i] = (float)p[i] / s;
}

void mf_route(const mf_route_spec *spec, const double *logits, double *probs, mf_route_out *out) {
    const int E = spec->n_experts, k = spec->top_k;
    mf_softmax(logits, E, spec->opmath, probs);
    uint16_t ids[k + 1 <= E ? k + 1 : E];
    int kk = k + 1 <= E ? k + 1 : k;
    mf_topk(probs, E, kk, ids);
    for (int i = 0; i < k; i++) out->ids[i] = ids[i];
    if (kk > k) {
        out->margin_prob = probs[ids[k - 1]] - probs[ids[k]];
        out->margin_logit = logits[ids[k - 1]] - logits[ids[k]];
        out->tie = probs[ids[k - 1]] == probs[ids[k]];
    } else {
        out->margin_prob = out->margin_logit = 0;
        out->tie = false;
    }
    mf_route_weights(spec, probs, out->ids, out->weights);
}

void mf_route_weights(const mf_route_spec *spec, const double *probs, const uint16_t *ids, double *weights) {
    const int k = spec->top_k;
    if (spec->opmath == MF_F64) {
        double s = 0;
        for (int i = 0; i < k; i++) s += probs[ids[i]];
        for (int i = 0; i < k; i++) weights[i] = spec->norm_topk ? probs[ids[i]] / s : probs[ids[i]];
    } else {
        float s = 0;
        for (int i = 0; i < k; i++) s += (float)probs[ids[i]];
        for (int i = 0; i < k; i++) weights[i] = spec->norm_topk ? (float)probs[ids[i]] / s : (float)probs[ids[i]];
    }
    for (int i = 0; i < k; i++) weights[i] = mf_round_to(spec->weight_out, weights[i]);
}
