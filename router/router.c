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

void mf_route(const mf_route_spec *spec, const double *logits, double *probs, mf_route_out *out) {
    const int E = spec->n_experts, k = spec->top_k;
    if (spec->kind == MF_ROUTE_KIND_TOPK_SOFTMAX) {
        mf_softmax(logits, E, spec->opmath, probs);
        if (out->select)
            for (int e = 0; e < E; e++) out->select[e] = logits[e];
        uint16_t ids[k + 1 <= E ? k + 1 : E];
        const int kk = k + 1 <= E ? k + 1 : k;
        mf_topk(logits, E, kk, ids);
        for (int i = 0; i < k; i++) out->ids[i] = ids[i];
        if (kk > k) {
            out->margin_logit = logits[ids[k - 1]] - logits[ids[k]];
            out->margin_prob = probs[ids[k - 1]] - probs[ids[k]];
            out->tie = logits[ids[k - 1]] == logits[ids[k]];
        } else {
            out->margin_prob = out->margin_logit = 0;
            out->tie = false;
        }
        mf_route_weights_logits(spec, logits, out->ids, out->weights);
        return;
    }
    if (spec->kind != MF_ROUTE_KIND_SOFTMAX_TOPK) {
        mf_route_scores(spec, logits, probs);
        double sel_own[E];
        double *sel = out->select ? out->select : sel_own;
        grouped_select(spec, probs, sel);
        uint16_t ids[k + 1 <= E ? k + 1 : E];
        const int kk = k + 1 <= E ? k + 1 : k;
        mf_topk(sel, E, kk, ids);
        for (int i = 0; i < k; i++) out->ids[i] = ids[i];
        out->margin_prob = out->margin_logit = kk > k ? sel[ids[k - 1]] - sel[ids[k]] : 0;
        out->tie = kk > k && sel[ids[k - 1]] == sel[ids[k]];
        mf_route_weights(spec, probs, out->ids, out->weights);
        return;
    }
    mf_softmax(logits, E, spec->opmath, probs);
    if (out->select)
        for (int e = 0; e < E; e++) out->select[e] = probs[e];
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
