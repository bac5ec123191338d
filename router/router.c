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

/* x rounded to the router's opmath */
static inline double om(const mf_route_spec *spec, double x) { return spec->opmath == MF_F64 ? x : (double)(float)x; }

void mf_route_scores(const mf_route_spec *spec, const double *logits, double *probs) {
    const int E = spec->n_experts;
    if (spec->kind != MF_ROUTE_KIND_SIGMOID_GROUP) {
        mf_softmax(logits, E, spec->opmath, probs);
        return;
    }
    for (int e = 0; e < E; e++) probs[e] = om(spec, 1.0 / (1.0 + exp(-om(spec, logits[e]))));
}

/* The grouped kinds: the row the final top-k ranks, from the scores (sigmoid or softmax) of one token. A group's
 * score: SIGMOID_GROUP the sum of its two best biased scores (in that order, as torch sums topk(2)), SOFTMAX_GREEDY
 * its best probability; the topk_group best groups (canonical order) keep their experts' values, every other
 * expert's becomes -inf (SIGMOID_GROUP: transformers 5.17's masked_fill(-inf)) or 0 (SOFTMAX_GREEDY's 0.0). */
static void grouped_select(const mf_route_spec *spec, const double *scores, double *sel) {
    const int E = spec->n_experts, G = spec->n_group, per = E / G;
    for (int e = 0; e < E; e++)
        sel[e] = spec->kind == MF_ROUTE_KIND_SIGMOID_GROUP ? om(spec, scores[e] + (spec->bias ? spec->bias[e] : 0))
                                                           : scores[e];
    const bool grouped = G > 1 && (spec->kind == MF_ROUTE_KIND_SIGMOID_GROUP || spec->group_limited);
    if (!grouped) return;
    double gs[G];
    for (int g = 0; g < G; g++) {
        const double *v = sel + (size_t)g * per;
        if (spec->kind == MF_ROUTE_KIND_SIGMOID_GROUP) {
            uint16_t two[2];
            mf_topk(v, per, 2, two);
            gs[g] = om(spec, v[two[0]] + v[two[1]]);
        } else {
            uint16_t one;
            mf_topk(v, per, 1, &one);
            gs[g] = v[one];
        }
    }
    uint16_t keep[G];
    mf_topk(gs, G, spec->topk_group, keep);
    bool kept[G];
    for (int g = 0; g < G; g++) kept[g] = false;
    for (int i = 0; i < spec->topk_group; i++) kept[keep[i]] = true;
    const double masked = spec->kind == MF_ROUTE_KIND_SIGMOID_GROUP ? -INFINITY : 0.0;
    for (int e = 0; e < E; e++)
        if (!kept[e / per]) sel[e] = masked;
}

void mf_route_weights_logits(const mf_route_spec *spec, const double *logits, const uint16_t *ids, double *weights) {
    const int k = spec->top_k > 0 ? spec->top_k : 1;
    double v[k];
    for (int i = 0; i < k; i++) v[i] = 0;
    for (int i = 0; i < spec->top_k; i++) v[i] = logits[ids[i]];
    /* torch.softmax over the k values, dtype the logits': the values widened to opmath, max subtracted, exp,
     * summed, divided, the result rounded to weight_out */
    mf_softmax(v, spec->top_k, spec->opmath, weights);
    for (int i = 0; i < spec->top_k; i++) weights[i] = mf_round_to(spec->weight_out, weights[i]);
}

/* ids: the top-k of rank_by (canonical order); *last: the k-th, *next: the (k+1)-th, or -1 when k is every expert.
 * The margins and the tie are between those two. */
static void top_k_and_next(const double *rank_by, int E, int k, uint16_t *ids, int *last, int *next) {
    uint16_t all[k + 1 <= E ? k + 1 : E];
    const int kk = k + 1 <= E ? k + 1 : k;
    mf_topk(rank_by, E, kk, all);
    for (int i = 0; i < k; i++) ids[i] = all[i];
    *last = all[k - 1];
    *next = kk > k ? all[k] : -1;
}

void mf_route(const mf_route_spec *spec, const double *logits, double *probs, mf_route_out *out) {
    const int E = spec->n_experts, k = spec->top_k;
    int a, b;
    if (spec->kind == MF_ROUTE_KIND_TOPK_SOFTMAX) {   /* gpt-oss: ranked on the logits */
        mf_softmax(logits, E, spec->opmath, probs);
        if (out->select)
            for (int e = 0; e < E; e++) out->select[e] = logits[e];
        top_k_and_next(logits, E, k, out->ids, &a, &b);
        out->margin_logit = b < 0 ? 0 : logits[a] - logits[b];
        out->margin_prob = b < 0 ? 0 : probs[a] - probs[b];
        out->tie = b >= 0 && logits[a] == logits[b];
        mf_route_weights_logits(spec, logits, out->ids, out->weights);
        return;
    }
    if (spec->kind != MF_ROUTE_KIND_SOFTMAX_TOPK) {   /* the grouped routers: ranked on their selection scores */
        mf_route_scores(spec, logits, probs);
        double sel_own[E];
        double *sel = out->select ? out->select : sel_own;
        grouped_select(spec, probs, sel);
        top_k_and_next(sel, E, k, out->ids, &a, &b);
        out->margin_prob = out->margin_logit = b < 0 ? 0 : sel[a] - sel[b];
        out->tie = b >= 0 && sel[a] == sel[b];
        mf_route_weights(spec, probs, out->ids, out->weights);
        return;
    }
    mf_softmax(logits, E, spec->opmath, probs);
    if (out->select)
        for (int e = 0; e < E; e++) out->select[e] = probs[e];
    top_k_and_next(probs, E, k, out->ids, &a, &b);
    out->margin_prob = b < 0 ? 0 : probs[a] - probs[b];
    out->margin_logit = b < 0 ? 0 : logits[a] - logits[b];
    out->tie = b >= 0 && probs[a] == probs[b];
    mf_route_weights(spec, probs, out->ids, out->weights);
}

void mf_route_weights(const mf_route_spec *spec, const double *probs, const uint16_t *ids, double *weights) {
    const int k = spec->top_k;
    if (spec->kind != MF_ROUTE_KIND_SOFTMAX_TOPK) {
        /* DeepseekV3MoE: w / (w.sum() + 1e-20) when renormalising, then * routed_scaling_factor, all in opmath
         * (the Python floats as fp32 scalars in an fp32 run) */
        const bool norm = spec->kind == MF_ROUTE_KIND_SIGMOID_GROUP && spec->norm_topk;
        double s = 0;
        for (int i = 0; i < k; i++) s = om(spec, s + probs[ids[i]]);
        const double den = om(spec, s + om(spec, 1e-20)), scale = om(spec, spec->scale);
        for (int i = 0; i < k; i++) {
            const double w = norm ? om(spec, probs[ids[i]] / den) : probs[ids[i]];
            weights[i] = mf_round_to(spec->weight_out, om(spec, w * scale));
        }
        return;
    }
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
