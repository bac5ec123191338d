/* Routing rules on hand-computed cases. */
#include <criterion/criterion.h>
#include <math.h>

#include "mf_experts.h"
#include "mf_router.h"

Test(router, topk_canonical_ties) {
    double s[6] = {1, 3, 3, 2, 3, 0};
    uint16_t ids[4];
    mf_topk(s, 6, 4, ids);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[1], 2);
    cr_assert_eq(ids[2], 4);
    cr_assert_eq(ids[3], 3);
    mf_topk(s, 6, 2, ids);
    cr_assert(ids[0] == 1 && ids[1] == 2, "equal scores at the boundary: the lower index wins");
    double n[3] = {0, NAN, 5};
    mf_topk(n, 3, 1, ids);
    cr_assert_eq(ids[0], 1, "NaN ranks highest, as torch.topk's comparator does");
}

Test(router, softmax_topk_weights_and_margins) {
    /* logits 0, ln 3, ln 2, ln 4 -> probabilities 1/10, 3/10, 2/10, 4/10 */
    double lg[4] = {0, log(3.0), log(2.0), log(4.0)}, p[4], w[2];
    uint16_t ids[2];
    mf_route_spec spec = {.kind = MF_ROUTE_KIND_SOFTMAX_TOPK, .n_experts = 4, .top_k = 2, .norm_topk = false, .opmath = MF_F64, .weight_out = MF_F64};
    mf_route_out out = {.ids = ids, .weights = w};
    mf_route(&spec, lg, p, &out);
    cr_assert(ids[0] == 3 && ids[1] == 1);
    cr_assert_float_eq(w[0], 0.4, 1e-15);
    cr_assert_float_eq(w[1], 0.3, 1e-15);
    cr_assert_float_eq(out.margin_prob, 0.1, 1e-15);
    cr_assert_float_eq(out.margin_logit, log(3.0) - log(2.0), 1e-15);
    spec.norm_topk = true;   /* Mixtral / norm_topk_prob: renormalise over the k chosen */
    mf_route(&spec, lg, p, &out);
    cr_assert_float_eq(w[0], 4.0 / 7.0, 1e-15);
    cr_assert_float_eq(w[1], 3.0 / 7.0, 1e-15);
    /* bf16 weights: 0.4 -> bf16 0x3ecd = 0.400390625 */
    spec.norm_topk = false;
    spec.opmath = MF_F32;
    spec.weight_out = MF_BF16;
    mf_route(&spec, lg, p, &out);
    cr_assert_eq(w[0], 0.400390625);
}

Test(router, exact_tie_flag) {
    double lg[3] = {1, 1, 0}, p[3], w[1];
    uint16_t ids[1];
    mf_route_spec spec = {.kind = MF_ROUTE_KIND_SOFTMAX_TOPK, .n_experts = 3, .top_k = 1, .norm_topk = false, .opmath = MF_F32, .weight_out = MF_F32};
    mf_route_out out = {.ids = ids, .weights = w};
    mf_route(&spec, lg, p, &out);
    cr_assert_eq(ids[0], 0);
    cr_assert(out.tie);
    cr_assert_eq(out.margin_prob, 0.0);
}

/* DeepSeek-V3's router, hand-computed: 8 experts in 4 groups of 2, the 2 best groups, top-2. Logits 0 (score
 * 0.5) but expert 6's ln 3 (score 0.75); the biases make the choice scores
 *   0.78 0.30 | 0.80 0.50 | 0.40 0.55 | 0.95 0.65     groups (sum of the two): 1.08, 1.30, 0.95, 1.60
 * so groups 3 and 1 stay, and the top-2 are 6 (0.95) and 2 (0.80), not 0 (0.78, a dropped group). The weights are
 * the UNBIASED scores 0.75 and 0.5: renormalised 0.6 and 0.4, times routed_scaling_factor 2.5. */
Test(router, sigmoid_group_topk_deepseek_v3) {
    double lg[8] = {0, 0, 0, 0, 0, 0, log(3.0), 0}, p[8], w[3], sel[8];
    const double bias[8] = {0.28, -0.2, 0.3, 0.0, -0.1, 0.05, 0.2, 0.15};
    uint16_t ids[3];
    mf_route_spec spec = {.kind = MF_ROUTE_KIND_SIGMOID_GROUP, .n_experts = 8, .top_k = 2, .norm_topk = true,
                          .opmath = MF_F64, .weight_out = MF_F64, .n_group = 4, .topk_group = 2, .bias = bias,
                          .scale = 2.5};
    mf_route_out out = {.ids = ids, .weights = w, .select = sel};
    mf_route(&spec, lg, p, &out);
    cr_assert(ids[0] == 6 && ids[1] == 2, "chose %d, %d", ids[0], ids[1]);
    cr_assert_float_eq(p[6], 0.75, 1e-15, "probs hold the sigmoid scores, before the bias");
    cr_assert_float_eq(w[0], 1.5, 1e-14);
    cr_assert_float_eq(w[1], 1.0, 1e-14);
    /* the row the top-k ranked: the dropped groups' experts at -inf (transformers 5.17's masked_fill), the others
     * their biased scores */
    const double want[8] = {-INFINITY, -INFINITY, 0.8, 0.5, -INFINITY, -INFINITY, 0.95, 0.65};
    for (int e = 0; e < 8; e++)
        cr_assert(isinf(want[e]) ? sel[e] == want[e] : fabs(sel[e] - want[e]) < 1e-15, "expert %d: %g", e, sel[e]);
    cr_assert_float_eq(out.margin_logit, 0.8 - 0.65, 1e-15, "margin: k-th minus (k+1)-th of the ranked row");
    cr_assert(!out.tie);
    spec.norm_topk = false;   /* scores times the scale */
    mf_route(&spec, lg, p, &out);
    cr_assert_float_eq(w[0], 1.875, 1e-14);
    cr_assert_float_eq(w[1], 1.25, 1e-14);
    /* one group of two, top-3: the third is a masked expert (-inf), the lowest index (expert 0), weighed by its
     * unbiased score as transformers' gather does */
    spec.topk_group = 1;
    spec.top_k = 3;
    spec.norm_topk = true;
    mf_route(&spec, lg, p, &out);
    cr_assert(ids[0] == 6 && ids[1] == 7 && ids[2] == 0, "chose %d, %d, %d", ids[0], ids[1], ids[2]);
    cr_assert_float_eq(w[2], 2.5 * 0.5 / 1.75, 1e-14);
    cr_assert(out.tie, "the third chosen and the first left out are both masked to -inf: a tie");
    /* replay: the weights of given experts from the scores alone */
    uint16_t given[3] = {1, 6, 4};
    double gw[3];
    mf_route_scores(&spec, lg, p);
    mf_route_weights(&spec, p, given, gw);
    cr_assert_float_eq(gw[1], 2.5 * 0.75 / 1.75, 1e-14);
    cr_assert_eq(mf_route_group(&spec, 5), 2);
}

/* In an fp32 run every step is an fp32 operation, the Python floats (scale, 1e-20) fp32 scalars: with scale 2.446
 * (Moonlight's) the weight is fp32(fp32(s / fp32(sum)) * fp32(2.446)). */
Test(router, sigmoid_group_fp32_steps) {
    double lg[4] = {0.3, -1.1, 0.7, 0.2}, p[4], w[2];
    uint16_t ids[2];
    mf_route_spec spec = {.kind = MF_ROUTE_KIND_SIGMOID_GROUP, .n_experts = 4, .top_k = 2, .norm_topk = true,
                          .opmath = MF_F32, .weight_out = MF_F32, .n_group = 1, .topk_group = 1, .scale = 2.446};
    mf_route_out out = {.ids = ids, .weights = w};
    mf_route(&spec, lg, p, &out);
    cr_assert(ids[0] == 2 && ids[1] == 0);
    const float s2 = (float)(1.0 / (1.0 + exp(-0.7f))), s0 = (float)(1.0 / (1.0 + exp(-0.3f)));
    const float den = (float)(s2 + s0) + 1e-20f;
    cr_assert_eq(w[0], (float)((s2 / den) * 2.446f));
    cr_assert_eq(w[1], (float)((s0 / den) * 2.446f));
}

/* DeepSeek-V2: logits 0, ln 2, ln 3, 0 -> probabilities 1/7, 2/7, 3/7, 1/7; groups {0,1}, {2,3} ranked by their
 * largest probability (2/7 < 3/7). Greedy top-2: 2 and 1; group-limited (1 group): 2 and 3. Weights are the
 * probabilities times routed_scaling_factor 2, never renormalised (norm_topk is ignored). */
Test(router, softmax_greedy_deepseek_v2) {
    double lg[4] = {0, log(2.0), log(3.0), 0}, p[4], w[2];
    uint16_t ids[2];
    mf_route_spec spec = {.kind = MF_ROUTE_KIND_SOFTMAX_GREEDY, .n_experts = 4, .top_k = 2, .norm_topk = true,
                          .opmath = MF_F64, .weight_out = MF_F64, .n_group = 2, .topk_group = 1, .scale = 2.0};
    mf_route_out out = {.ids = ids, .weights = w};
    mf_route(&spec, lg, p, &out);
    cr_assert(ids[0] == 2 && ids[1] == 1, "greedy: %d, %d", ids[0], ids[1]);
    cr_assert_float_eq(w[0], 6.0 / 7.0, 1e-15);
    cr_assert_float_eq(w[1], 4.0 / 7.0, 1e-15);
    spec.group_limited = true;
    mf_route(&spec, lg, p, &out);
    cr_assert(ids[0] == 2 && ids[1] == 3, "group-limited: %d, %d", ids[0], ids[1]);
    cr_assert_float_eq(w[1], 2.0 / 7.0, 1e-15);
    cr_assert_float_eq(out.margin_logit, 1.0 / 7.0, 1e-15, "the (k+1)-th of the masked row is 0");
}

Test(experts, dispatch_groups_by_expert_then_token) {
    /* 3 tokens, top-2 of 4 experts */
    uint16_t ids[6] = {2, 0, 0, 3, 2, 1};
    mf_dispatch d;
    mf_dispatch_build(&d, ids, 3, 2, 4);
    int off[5] = {0, 2, 3, 5, 6};
    for (int e = 0; e <= 4; e++) cr_assert_eq(d.offset[e], off[e]);
    int tok[6] = {0, 1, 2, 0, 2, 1}, slot[6] = {1, 0, 1, 0, 0, 1};
    for (int r = 0; r < 6; r++) {
        cr_assert_eq(d.token[r], tok[r], "row %d", r);
        cr_assert_eq(d.slot[r], slot[r], "row %d", r);
        cr_assert_eq(d.row_of[d.token[r] * 2 + d.slot[r]], r);
    }
    mf_dispatch_free(&d);
}

Test(experts, combine_rounds_once_in_slot_order) {
    /* one token, three slots, H = 1: y = {1, 2^-8, 2^-7}, w = 1. Summed in
     * fp32 and rounded once: 1 + 3*2^-8, a bf16 tie, goes to the even 1 + 2^-6.
     * Added into a bf16 buffer slot by slot (transformers v4's index_add_) it
     * would give 1 (tie to even), then 1 + 2^-7. */
    uint16_t ids[3] = {0, 1, 2};
    mf_dispatch d;
    mf_dispatch_build(&d, ids, 1, 3, 3);
    double y[3] = {1.0, 0x1p-8, 0x1p-7}, w[3] = {1, 1, 1}, out[1];
    mf_combine_spec cs = {MF_BF16, MF_F32, MF_BF16};
    mf_combine(&cs, &d, y, 1, w, out);
    cr_assert_eq(out[0], 1.0 + 0x1p-6, "one rounding of 1 + 3*2^-8");
    mf_dispatch_free(&d);
}

/* gpt-oss: the logits (bias included) rank; the weights are the softmax over the k chosen logits only.
 * Logits 0.5, -1, 2, 1, top-2: experts 2 and 3, weights e^2 / (e^2 + e) = 1 / (1 + e^-1) and 1 / (1 + e); the
 * recorded selection row is the logits; margin 1 - 0.5 in logits. In bf16 the weights round to 0.73046875 and
 * 0.26953125 (187 x 2^-8, 138 x 2^-9). */
Test(router, topk_softmax_gpt_oss) {
    double lg[4] = {0.5, -1, 2, 1}, p[4], w[2], sel[4];
    uint16_t ids[2];
    mf_route_spec spec = {.kind = MF_ROUTE_KIND_TOPK_SOFTMAX, .n_experts = 4, .top_k = 2, .opmath = MF_F64,
                          .weight_out = MF_F64};
    mf_route_out out = {.ids = ids, .weights = w, .select = sel};
    mf_route(&spec, lg, p, &out);
    cr_assert(ids[0] == 2 && ids[1] == 3, "%d %d", ids[0], ids[1]);
    cr_assert_float_eq(w[0], 1.0 / (1.0 + exp(-1.0)), 1e-15);
    cr_assert_float_eq(w[1], 1.0 / (1.0 + exp(1.0)), 1e-15);
    cr_assert_float_eq(out.margin_logit, 0.5, 0);
    for (int e = 0; e < 4; e++) cr_assert_eq(sel[e], lg[e]);
    cr_assert(!out.tie);
    spec.opmath = MF_F32;
    spec.weight_out = MF_BF16;
    mf_route(&spec, lg, p, &out);
    cr_assert_eq(w[0], 0.73046875);
    cr_assert_eq(w[1], 0.26953125);
    double t[3] = {3, 1, 3};   /* a tie at the boundary: the lower index first, equal weights */
    spec.n_experts = 3;
    spec.top_k = 1;
    mf_route(&spec, t, p, &out);
    cr_assert(ids[0] == 0 && out.tie && w[0] == 1.0);
    uint16_t two[2] = {2, 1};   /* replay: another run's experts, this router's weights for them */
    spec.top_k = 2;
    spec.weight_out = MF_F64;
    spec.opmath = MF_F64;
    mf_route_weights_logits(&spec, t, two, w);
    cr_assert_float_eq(w[0], 1.0 / (1.0 + exp(-2.0)), 1e-15);
}
