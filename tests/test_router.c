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
