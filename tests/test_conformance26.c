/* Conformance of the DeepSeek family (deepseek_v3, deepseek_v2, glm4_moe) against Hugging Face itself: our
 * forward pass on the checkpoints of tests/fixtures/hf26 (made by tools/make_fixtures_2026.py with transformers
 * 5.17 on an H200) against transformers' float64 logits, raw router logits, the scores its top-k ranked and the
 * experts and weights it dispatched, and against its bf16 runs on the CPU and CUDA.
 *
 * Hugging Face's "float64" run computes these routers in fp32 (F.linear of x and W cast to fp32) and keeps the
 * RMSNorm upcast, the RoPE tables and the softmaxes in fp32, so the two differ by fp32 rounding; the bar is 1e-5
 * relative, as for the older families. Its top-k is torch.topk(sorted=False): experts are compared as sets, and
 * weights expert by expert. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_router.h"
#include "mf_runtime.h"
#include "mf_trace.h"
#include "testutil.h"

typedef struct stats {
    double logit_rel, router_rel, select_rel, weight_rel;   /* select_rel: over the slots whose experts agree */
    int slots, set_mismatch_above, set_mismatch_near, weight_slots;
    int positions, positions_compared;   /* logits compared up to the first position whose experts differ */
} stats;

static double max_abs(const double *v, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(v[i]));
    return m;
}

/* Hugging Face's ranked row for one slot: the biased scores (choice) or probabilities (scores), every expert
 * outside the groups it kept masked (-inf: DeepseekV3TopkRouter, Glm4MoeTopkRouter; 0: DeepseekV2TopkRouter).
 * groups: its chosen groups for the slot, or NULL to choose them here from the row by the model's rule (its bf16
 * runs do not record them). */
static double hf_select_row(const mf_config *c, const double *row, const double *groups, int ng_kept, double masked,
                            double *out) {
    const int E = c->n_experts, G = c->n_group;
    memcpy(out, row, sizeof(double) * (size_t)E);
    const bool grouped = G > 1 && (c->route_rule == MF_ROUTE_SIGMOID_GROUP || c->group_limited);
    if (!grouped) return INFINITY;   /* gpt_oss has no groups (n_group 0) */
    const int per = E / G;
    /* the groups' scores (sum of the two best biased scores, or the best probability) and their margin: the
     * topk_group-th minus the next */
    double gs[MF_MAX_EXPERTS];
    for (int g = 0; g < G; g++) {
        uint16_t two[2];
        mf_topk(row + (size_t)g * per, per, 2, two);
        gs[g] = c->route_rule == MF_ROUTE_SIGMOID_GROUP ? row[g * per + two[0]] + row[g * per + two[1]]
                                                        : row[g * per + two[0]];
    }
    uint16_t kept[MF_MAX_EXPERTS];
    mf_topk(gs, G, G, kept);
    const double group_margin = c->topk_group < G ? gs[kept[c->topk_group - 1]] - gs[kept[c->topk_group]] : INFINITY;
    bool keep[MF_MAX_EXPERTS] = {false};
    if (groups)
        for (int i = 0; i < ng_kept; i++) keep[(int)groups[i]] = true;
    else
        for (int i = 0; i < c->topk_group; i++) keep[kept[i]] = true;
    for (int e = 0; e < E; e++)
        if (!keep[e / per]) out[e] = masked;
    return group_margin;
}

static bool same_set(const uint16_t *ours, const double *hf, int K) {
    for (int a = 0; a < K; a++) {
        bool found = false;
        for (int b = 0; b < K; b++) found |= ours[a] == (uint16_t)hf[b];
        if (!found) return false;
    }
    return true;
}

static stats compare_case(const char *case_name, const char *prec_name, const char *tag, double min_margin) {
    char dir[4096], ref[4200], tok[4200];
    snprintf(dir, sizeof dir, "%s%s", fixture("hf26/"), case_name);
    snprintf(ref, sizeof ref, "%s/ref.safetensors", dir);
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
    mf_error err = {0};
    mf_precision prec;
    cr_assert_eq(mf_precision_parse(&prec, prec_name, &err), MF_OK);
    mf_model *m;
    cr_assert_eq(mf_runtime_load(&m, dir, &prec, &err), MF_OK, "%s", err.msg);
    const mf_config *c = &m->cfg;
    mf_prompts ps;
    cr_assert_eq(mf_prompts_load(&ps, tok, c->vocab, &err), MF_OK, "%s", err.msg);
    mf_run_opts o = {.prec = prec, .threads = 2};
    stats st = {0};
    const bool fp64 = !strcmp(tag, "fp64");
    const char *sel_field = c->route_rule == MF_ROUTE_SIGMOID_GROUP ? "choice" : "scores";
    const double masked = c->route_rule == MF_ROUTE_SIGMOID_GROUP ? -INFINITY : 0.0;
    for (size_t s = 0; s < ps.n; s++) {
        mf_seq_result r;
        cr_assert_eq(mf_forward_cpu(m, &o, ps.seq[s].tokens, ps.seq[s].T, &r, &err), MF_OK, "%s", err.msg);
        char name[64];
        size_t n;
        double d = 0;
        const int E = r.E, K = r.k, L = r.n_moe;
        int first_mismatch = r.T;   /* the first position where a layer chose other experts than HF's run */
        snprintf(name, sizeof name, "router_%s_s%zu", tag, s);
        double *hr = read_tensor(ref, name, &n);
        cr_assert_eq(n, (size_t)L * r.T * E, "%s: router size", case_name);
        d = 0;
        for (size_t i = 0; i < n; i++) d = fmax(d, fabs(r.router[i] - hr[i]));
        st.router_rel = fmax(st.router_rel, d / max_abs(hr, n));
        free(hr);
        snprintf(name, sizeof name, "%s_%s_s%zu", sel_field, tag, s);
        double *hs = read_tensor(ref, name, &n);
        cr_assert_eq(n, (size_t)L * r.T * E);
        double *hg = NULL;
        size_t ng = 0;
        if (fp64 && c->n_group > 1 && (c->route_rule == MF_ROUTE_SIGMOID_GROUP || c->group_limited)) {
            snprintf(name, sizeof name, "groups_fp64_s%zu", s);
            hg = read_tensor(ref, name, &ng);
            cr_assert_eq(ng, (size_t)L * r.T * c->topk_group);
        }
        snprintf(name, sizeof name, "topk_%s_s%zu", tag, s);
        double *hk = read_tensor(ref, name, &n);
        cr_assert_eq(n, (size_t)L * r.T * K);
        double *hw = NULL;
        if (fp64) {
            snprintf(name, sizeof name, "topkw_fp64_s%zu", s);
            hw = read_tensor(ref, name, &n);
            cr_assert_eq(n, (size_t)L * r.T * K);
        }
        double hsel[MF_MAX_EXPERTS], sel_max = 0, sel_d = 0, w_max = 0, w_d = 0;
        uint16_t order[MF_MAX_EXPERTS];
        for (int l = 0; l < L; l++)
            for (int t = 0; t < r.T; t++) {
                const size_t slot = (size_t)l * r.T + t;
                const double gm =
                    hf_select_row(c, hs + slot * E, hg ? hg + slot * c->topk_group : NULL, c->topk_group, masked, hsel);
                for (int e = 0; e < E && same_set(r.topk_ids + slot * K, hk + slot * K, K); e++) {
                    const double ours_e = r.select[slot * E + e];
                    if (isinf(hsel[e]) || isinf(ours_e)) {   /* masked: both, or the largest error there is */
                        if (hsel[e] != ours_e) sel_d = INFINITY;
                        continue;
                    }
                    sel_max = fmax(sel_max, fabs(hsel[e]));
                    sel_d = fmax(sel_d, fabs(hsel[e] - ours_e));
                }
                mf_topk(hsel, E, K < E ? K + 1 : K, order);
                /* the choice is as close as the nearer of its two decisions: the groups, the experts in them */
                const double margin = fmin(gm, K < E ? hsel[order[K - 1]] - hsel[order[K]] : INFINITY);
                const uint16_t *ours = r.topk_ids + slot * K;
                const bool same = same_set(ours, hk + slot * K, K);
                st.slots++;
                if (!same && margin > min_margin) st.set_mismatch_above++;
                if (!same && margin <= min_margin) st.set_mismatch_near++;
                if (!same && t < first_mismatch) first_mismatch = t;
                if (same && hw) {
                    st.weight_slots++;
                    for (int a = 0; a < K; a++)
                        for (int b = 0; b < K; b++)
                            if (ours[a] == (uint16_t)hk[slot * K + b]) {
                                w_max = fmax(w_max, fabs(hw[slot * K + b]));
                                w_d = fmax(w_d, fabs(hw[slot * K + b] - r.topk_w[slot * K + a]));
                            }
                }
            }
        /* the logits where both runs dispatched the same experts at every layer so far: from the first position
         * whose choice differs (at a near tie: counted above) the two forward passes are different computations */
        snprintf(name, sizeof name, "logits_%s_s%zu", tag, s);
        double *hl = read_tensor(ref, name, &n);
        cr_assert_eq(n, (size_t)r.T * r.V);
        const size_t nl = (size_t)first_mismatch * r.V;
        d = 0;
        for (size_t i = 0; i < nl; i++) d = fmax(d, fabs(r.logits[i] - hl[i]));
        if (nl) st.logit_rel = fmax(st.logit_rel, d / max_abs(hl, nl));
        st.positions += r.T;
        st.positions_compared += first_mismatch;
        free(hl);
        st.select_rel = fmax(st.select_rel, sel_max > 0 ? sel_d / sel_max : sel_d);
        if (w_max > 0) st.weight_rel = fmax(st.weight_rel, w_d / w_max);
        free(hs);
        free(hg);
        free(hk);
        free(hw);
        mf_seq_result_free(&r);
    }
    mf_prompts_free(&ps);
    mf_model_free(m);
    cr_log_info("%s %s vs HF %s: logits rel %.3g (%d of %d positions), router rel %.3g, ranked scores rel %.3g, "
                "weights rel %.3g (%d slots), set mismatches %d (+%d near ties) of %d slots",
                case_name, prec_name, tag, st.logit_rel, st.positions_compared, st.positions, st.router_rel,
                st.select_rel, st.weight_rel, st.weight_slots, st.set_mismatch_above, st.set_mismatch_near, st.slots);
    return st;
}

#define FP64_CASE(name)                                                                                          \
    Test(conformance26_fp64, name) {                                                                             \
        stats s = compare_case(#name, "fp64", "fp64", 1e-6);                                                     \
        cr_expect_leq(s.logit_rel, 1e-5, "logits: max|ours-HF|/max|HF| = %g", s.logit_rel);                       \
        cr_expect_leq(s.router_rel, 1e-5, "router logits: %g", s.router_rel);                                     \
        cr_expect_leq(s.select_rel, 1e-5, "the scores the top-k ranked: %g", s.select_rel);                       \
        cr_expect_leq(s.weight_rel, 1e-5, "routing weights: %g", s.weight_rel);                                   \
        cr_expect_gt(s.weight_slots, 0);                                                                         \
        cr_expect_eq(s.positions_compared, s.positions, "every position's experts agree in fp64");              \
        cr_expect_eq(s.set_mismatch_above, 0, "%d slots with HF margin > 1e-6 chose other experts",             \
                     s.set_mismatch_above);                                                                      \
    }

/* bf16: cast points as transformers', GEMM accumulation order each kernel's own: within 5% of the largest logit
 * of both of Hugging Face's bf16 runs, the same experts wherever its margin exceeds 0.01 (the nearer of the group
 * and the expert decision, in the ranked scores' units: sigmoid values, probabilities or gpt-oss's logits). The
 * logits are compared up to the first position where a layer chose other experts at a near tie (from there the
 * two runs compute different things: Hugging Face's own CPU and CUDA runs of gpt_oss differ by 23% of the
 * largest logit after theirs split), and on at least half the positions. */
#define BF16_CASE(name)                                                                                          \
    Test(conformance26_bf16, name) {                                                                             \
        stats s = compare_case(#name, "bf16", "bf16cuda", 0.01);                                                 \
        stats c = compare_case(#name, "bf16", "bf16cpu", 0.01);                                                  \
        cr_expect_leq(s.logit_rel, 0.05, "logits vs HF bf16 CUDA: %g", s.logit_rel);                              \
        cr_expect_leq(c.logit_rel, 0.05, "logits vs HF bf16 CPU: %g", c.logit_rel);                               \
        cr_expect_eq(s.set_mismatch_above + c.set_mismatch_above, 0, "expert sets differ at clear margins");       \
        cr_expect_geq(2 * s.positions_compared, s.positions, "logits compared at %d of %d positions",             \
                      s.positions_compared, s.positions);                                                         \
        cr_expect_geq(2 * c.positions_compared, c.positions, "logits compared at %d of %d positions",             \
                      c.positions_compared, c.positions);                                                         \
    }

FP64_CASE(deepseek_v3)
FP64_CASE(deepseek_v3_noqlora)
FP64_CASE(deepseek_v3_yarn)
FP64_CASE(deepseek_v3_fp8)
FP64_CASE(deepseek_v2_greedy)
FP64_CASE(deepseek_v2_group)
FP64_CASE(glm4_moe)
FP64_CASE(gpt_oss)
FP64_CASE(gpt_oss_mxfp4)

BF16_CASE(deepseek_v3)
BF16_CASE(deepseek_v3_noqlora)
BF16_CASE(deepseek_v3_yarn)
BF16_CASE(deepseek_v3_fp8)
BF16_CASE(deepseek_v2_greedy)
BF16_CASE(deepseek_v2_group)
BF16_CASE(glm4_moe)
BF16_CASE(gpt_oss)
BF16_CASE(gpt_oss_mxfp4)

/* `moeflip synth --arch deepseek_v3 --dtype fp8` writes transformers' own FP8 layout: the tiny size has the
 * fixture's dimensions, and every tensor of the checkpoint transformers 5.17 wrote (tests/fixtures/hf26/
 * deepseek_v3_fp8) is there with the same dtype and shape, and nothing else. Its codes times their block's
 * scale are the bf16 twin's weights (same seed, same normal draws) to e4m3's precision: within half an e4m3
 * step of the block's largest value, 2^-4 x amax, plus bf16's own rounding. */
Test(conformance26_synth, fp8_synth_has_the_layout_transformers_writes) {
    char fp8[600], bf16[600], err[2048];
    snprintf(fp8, sizeof fp8, "%s/synth-fp8", temp_dir());
    snprintf(bf16, sizeof bf16, "%s/synth-bf16", temp_dir());
    cr_assert_eq(run_moeflip(err, sizeof err, "synth --arch deepseek_v3 --dtype fp8 --seed 4 -o %s", fp8), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "synth --arch deepseek_v3 --seed 4 -o %s", bf16), 0, "%s", err);
    cr_assert_neq(run_moeflip(err, sizeof err, "synth --arch olmoe --dtype fp8 --seed 4 -o %s/x", temp_dir()), 0,
                  "fp8 is for deepseek_v3 only");
    mf_error e = {0};
    mf_checkpoint *hf, *ours, *twin;
    cr_assert_eq(mf_checkpoint_open(&hf, fixture("hf26/deepseek_v3_fp8"), &e), MF_OK, "%s", e.msg);
    cr_assert_eq(mf_checkpoint_open(&ours, fp8, &e), MF_OK, "%s", e.msg);
    cr_assert_eq(mf_checkpoint_open(&twin, bf16, &e), MF_OK, "%s", e.msg);
    cr_assert_eq(ours->files[0]->count, hf->files[0]->count);
    int fp8_tensors = 0;
    for (size_t i = 0; i < hf->files[0]->count; i++) {
        const mf_st_tensor *h = &hf->files[0]->tensors[i], *o = mf_checkpoint_find(ours, h->name);
        cr_assert_not_null(o, "synth lacks %s", h->name);
        cr_assert_eq(o->dtype, h->dtype, "%s: %s, transformers wrote %s", h->name, mf_dtype_name(o->dtype),
                     mf_dtype_name(h->dtype));
        cr_assert_eq(o->ndim, h->ndim, "%s", h->name);
        for (int d = 0; d < h->ndim; d++) cr_assert_eq(o->shape[d], h->shape[d], "%s dim %d", h->name, d);
        if (o->dtype != MF_F8E4M3) continue;
        fp8_tensors++;
        char sn[512];
        snprintf(sn, sizeof sn, "%s_scale_inv", o->name);
        const mf_st_tensor *s = mf_checkpoint_find(ours, sn), *t = mf_checkpoint_find(twin, o->name);
        cr_assert(s && t && t->dtype == MF_BF16, "%s", sn);
        const int64_t R = o->shape[0], C = o->shape[1], sc = s->shape[1];
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                const double scale = mf_load_as_f64(s->data, MF_F32, (size_t)((r / 16) * sc + c / 16));
                const double v = mf_f8e4m3_to_f64(o->data[r * C + c]) * scale, want = mf_load_as_f64(t->data, MF_BF16, (size_t)(r * C + c));
                cr_assert_leq(fabs(v - want), 448 * scale * 0x1p-4 + fabs(want) * 0x1p-8, "%s[%lld, %lld] = %g, bf16 twin %g",
                              o->name, (long long)r, (long long)c, v, want);
            }
    }
    cr_assert_eq(fp8_tensors, 120);
    mf_checkpoint_close(hf);
    mf_checkpoint_close(ours);
    mf_checkpoint_close(twin);
}
