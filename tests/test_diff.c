/* moeflip diff against independent values:
 *  - Hugging Face's float64, bf16-CPU and bf16-CUDA captures of three MoE
 *    models, in CroVA's capture layout, with the metrics computed by
 *    tools/make_crova_fixtures.py with CroVA's formulas (tests/fixtures/crova);
 *  - runs built here by hand with known flips, ties and errors;
 *  - merging diffs of shards gives the single-pass result exactly. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_diff.h"
#include "testutil.h"

static mf_run *import(const char *model, const char *capture) {
    char src[4200], out[4200];
    snprintf(src, sizeof src, "%s/%s", fixture("crova"), model);
    strcat(src, "/");
    strcat(src, capture);
    snprintf(out, sizeof out, "%s/%s", temp_dir(), capture);
    mf_error err = {0};
    char mdir[4200];
    snprintf(mdir, sizeof mdir, "%s%s", fixture("hf/"), model);
    cr_assert_eq(mf_import_crova(src, mdir, out, &err), MF_OK, "%s", err.msg);
    mf_run *r;
    cr_assert_eq(mf_run_open(&r, out, &err), MF_OK, "%s", err.msg);
    return r;
}

static mf_diff_acc *new_acc(const mf_run *ref) {
    mf_diff_acc *a = calloc(1, sizeof *a);
    mf_diff_acc_init(a, ref);
    return a;
}

static mf_diff_acc *diff_of(mf_run *ref, mf_run *tgt) {
    mf_diff_acc *a = new_acc(ref);
    mf_error err = {0};
    cr_assert_eq(mf_diff_acc_add_runs(a, ref, tgt, &err), MF_OK, "%s", err.msg);
    return a;
}

static double jnum(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    cr_assert(v, "expected.json lacks %s", k);
    return json_number_value(v);
}

/* Every count exactly; the error sums against the float64 recomputation of
 * the same formulas (CroVA itself sums in fp32: within 1% for KL there). */
static void check_pair(const char *model, const char *ref_cap, const char *tgt_cap) {
    char path[4200], key[128];
    snprintf(path, sizeof path, "%s/%s/expected.json", fixture("crova"), model);
    json_t *e = json_load_file(path, 0, NULL);
    cr_assert(e, "%s", path);
    snprintf(key, sizeof key, "%s_vs_%s", ref_cap, tgt_cap);
    json_t *p = json_object_get(json_object_get(e, "pairs"), key), *sum = json_object_get(p, "summary"),
           *f64 = json_object_get(json_object_get(p, "float64_check"), "pooled");
    cr_assert(p && sum && f64, "%s: no pair %s", path, key);
    mf_run *r = import(model, ref_cap), *t = import(model, tgt_cap);
    mf_diff_acc *a = diff_of(r, t);
    static const char *exact[] = {"top1_pct", "ord5_pct", "set5_pct", "router_set_equal_pct", "router_ord_equal_pct",
                                  "router_positions_all_layers_equal_pct"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        cr_expect_float_eq(mf_diff_metric(a, exact[i]), jnum(sum, exact[i]), 1e-12, "%s %s: %s = %.17g, CroVA %.17g", model,
                           key, exact[i], mf_diff_metric(a, exact[i]), jnum(sum, exact[i]));
    static const char *sums[] = {"raw_logit_mse", "prob_mse", "forward_kl"};
    for (int i = 0; i < 3; i++) {
        double ours = mf_diff_metric(a, sums[i]), ref64 = jnum(f64, sums[i]), crova = jnum(sum, sums[i]);
        cr_expect_leq(fabs(ours - ref64), 1e-9 * fabs(ref64), "%s %s: %s = %.17g, float64 formula %.17g", model, key, sums[i],
                      ours, ref64);
        /* CroVA sums in fp32; its KL (1e-5 .. 1e-7 per position here) loses digits to cancellation */
        const double tol = i == 2 ? 0.2 : 1e-2;
        cr_expect_leq(fabs(ours - crova), tol * fabs(crova), "%s %s: %s = %.17g, CroVA (fp32) %.17g", model, key, sums[i],
                      ours, crova);
    }
    cr_expect_leq(fabs(mf_diff_metric(a, "router_logit_mse") - jnum(sum, "router_logit_mse")),
                  1e-6 * jnum(sum, "router_logit_mse"));
    json_t *eb = json_object_get(sum, "equal_bits_pct");
    if (eb && json_is_number(eb))
        cr_expect_float_eq(mf_diff_metric(a, "equal_bits_pct"), json_number_value(eb), 1e-12, "equal_bits_pct");
    else
        cr_expect(isnan(mf_diff_metric(a, "equal_bits_pct")), "equal_bits_pct only when both sides stored bf16");
    mf_diff_acc_free(a);
    free(a);
    mf_run_close(r);
    mf_run_close(t);
    json_decref(e);
}

Test(diff_crova, olmoe) {
    check_pair("olmoe", "fp64", "bf16cpu");
    check_pair("olmoe", "fp64", "bf16cuda");
    check_pair("olmoe", "bf16cpu", "bf16cuda");
}

Test(diff_crova, qwen2_moe) {
    check_pair("qwen2_moe", "fp64", "bf16cpu");
    check_pair("qwen2_moe", "fp64", "bf16cuda");
    check_pair("qwen2_moe", "bf16cpu", "bf16cuda");
}

Test(diff_crova, qwen3_moe) {
    check_pair("qwen3_moe", "fp64", "bf16cpu");
    check_pair("qwen3_moe", "fp64", "bf16cuda");
    check_pair("qwen3_moe", "bf16cpu", "bf16cuda");
}

/* The paired comparison of two targets, as CroVA's paired_bootstrap reports it. */
Test(diff_crova, paired_point_values) {
    mf_run *r = import("olmoe", "fp64"), *a = import("olmoe", "bf16cpu"), *b = import("olmoe", "bf16cuda");
    mf_diff_acc *da = diff_of(r, a), *db = diff_of(r, b);
    mf_run *targets[2] = {a, b};
    mf_diff_acc *accs[2] = {da, db};
    char out[4200];
    snprintf(out, sizeof out, "%s/d.json", temp_dir());
    mf_diff_opts o = {200, 7, false};
    mf_error err = {0};
    cr_assert_eq(mf_diff_write_json(out, r, targets, accs, 2, NULL, NULL, &o, &err), MF_OK, "%s", err.msg);
    json_t *d = json_load_file(out, 0, NULL);
    cr_assert(d, "%s is not JSON", out);
    json_t *crova = json_object_get(json_object_get(json_array_get(json_object_get(d, "targets"), 1), "paired_vs_first_target"), "crova");
    cr_assert(crova);
    char path[4200];
    snprintf(path, sizeof path, "%s/olmoe/expected.json", fixture("crova"));
    json_t *e = json_load_file(path, 0, NULL), *pt = json_object_get(json_object_get(e, "paired_bootstrap"), "point");
    cr_assert(pt, "%s has no paired_bootstrap.point", path);
    static const char *counts[] = {"top1_diff", "ord5_diff", "set5_diff", "router_set_equal_diff"};
    for (int i = 0; i < 4; i++)
        cr_expect_float_eq(json_number_value(json_object_get(json_object_get(crova, counts[i]), "value")), jnum(pt, counts[i]),
                           1e-12, "%s", counts[i]);
    cr_expect_float_eq(json_number_value(json_object_get(json_object_get(crova, "sq_err_rel_change_pct"), "value")),
                       jnum(pt, "sq_err_rel_change_pct"), 1e-4);
    /* with an interval around the point */
    json_t *sq = json_object_get(crova, "sq_err_rel_change_pct"), *ci = json_object_get(sq, "ci95");
    double v = json_number_value(json_object_get(sq, "value"));
    cr_expect(json_number_value(json_array_get(ci, 0)) <= v + 1e-9 && v <= json_number_value(json_array_get(ci, 1)) + 1e-9);
    json_decref(e);
    json_decref(d);
    mf_diff_acc_free(da);
    mf_diff_acc_free(db);
    free(da);
    free(db);
    mf_run_close(r);
    mf_run_close(a);
    mf_run_close(b);
}

/* ---- hand-built runs ---------------------------------------------------------- */

/* Two runs of the olmoe fixture's shape (3 MoE layers, 16 experts, top-4, vocab
 * 384) with one 4-token sequence whose routing and logits are set by hand. */
typedef struct hand {
    uint16_t ids[3][4][4];
    double router[3][4][16];
    double logits[4][384];
} hand;

/* A run of the hand-made values; experts: the width of the router rows written. */
static void write_run_experts(const char *dir, const hand *h, int experts) {
    mf_config cfg;
    mf_error err = {0};
    char cpath[4200];
    snprintf(cpath, sizeof cpath, "%s/config.json", fixture("hf/olmoe"));
    cr_assert_eq(mf_config_load(&cfg, cpath, &err), MF_OK);
    int32_t tokens[4] = {5, 6, 7, 8};
    mf_prompt p = {.id = "x", .tokens = tokens, .T = 4};
    mf_prompts ps = {&p, 1, "0"};
    mf_precision prec;
    cr_assert_eq(mf_precision_parse(&prec, "fp32", &err), MF_OK, "%s", err.msg);
    mf_run_info info = {.model_dir = "hand", .prec = &prec, .device = "cpu", .numerics = "native", .threads = 1,
                        .record = MF_RECORD_LOGITS, .input_path = "hand", .prompts = &ps, .cfg = &cfg,
                        .weights_digest = "w", .imported_from = "hand"};
    mf_run_writer *w;
    cr_assert_eq(mf_run_create(&w, dir, &info, false, &err), MF_OK, "%s", err.msg);
    mf_seq_result r = {.T = 4, .n_moe = 3, .k = 4, .E = experts, .V = 384, .H = 64};
    r.topk_ids = (uint16_t *)h->ids;
    r.router = (double *)h->router;
    r.logits = (double *)h->logits;
    double wts[3 * 4 * 4];
    for (int i = 0; i < 48; i++) wts[i] = 0.25;
    r.topk_w = wts;
    cr_assert_eq(mf_run_writer_add(w, &p, &r, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_run_writer_close(w, &err), MF_OK);
    mf_run_writer_free(w);
}

/* Writes the reference and target runs in a fresh directory ("r", "t") and opens them. */
static void open_pair(const hand *R, const hand *T, mf_run **r, mf_run **t) {
    const char *d = temp_dir();
    char rp[4200], tp[4200];
    snprintf(rp, sizeof rp, "%s/r", d);
    snprintf(tp, sizeof tp, "%s/t", d);
    write_run_experts(rp, R, 16);
    write_run_experts(tp, T, 16);
    mf_error err = {0};
    cr_assert_eq(mf_run_open(r, rp, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_run_open(t, tp, &err), MF_OK, "%s", err.msg);
}

static void base(hand *h) {
    memset(h, 0, sizeof *h);
    for (int l = 0; l < 3; l++)
        for (int t = 0; t < 4; t++) {
            for (int e = 0; e < 16; e++) h->router[l][t][e] = -e;   /* experts 0..3 lead, margin 1 */
            for (int k = 0; k < 4; k++) h->ids[l][t][k] = (uint16_t)k;
        }
}

Test(diff_hand, flips_ties_and_errors) {
    hand R, T;
    base(&R);
    base(&T);
    /* layer 0, position 1: expert 3 dropped, 9 added (a primary flip) */
    T.ids[0][1][3] = 9;
    /* layer 1, position 2: 2 dropped, 5 added: inherited (layer 0 flipped at position 1 <= 2) */
    T.ids[1][2][2] = 5;
    /* layer 2, position 0: 0 dropped, 7 added: primary (no earlier layer flipped at position 0) */
    T.ids[2][0][0] = 7;
    /* layer 1, position 0: same set, other order */
    T.ids[1][0][0] = 1;
    T.ids[1][0][1] = 0;
    /* an exact tie in the reference at layer 2, position 3: k-th (3) and (k+1)-th (4) equal */
    R.router[2][3][4] = R.router[2][3][3];
    /* a router logit error of 0.5 at one entry */
    T.router[0][0][0] = 0.5;
    /* logits: position 2, target bumps token 5 by ln 2 over a uniform reference */
    T.logits[2][5] = log(2.0);
    mf_run *r, *t;
    open_pair(&R, &T, &r, &t);
    mf_error err = {0};
    mf_diff_acc *a = new_acc(r);
    a->keep_slots = true;
    cr_assert_eq(mf_diff_acc_add_runs(a, r, t, &err), MF_OK, "%s", err.msg);
    /* the slot (layer 0, position 1): 3 dropped for 9; reference scores -e: margin 1 logit,
     * (e^-3 - e^-4) / sum_e e^-e in probability */
    bool seen = false;
    for (size_t i = 0; i < a->n_slots; i++) {
        const mf_slot *sl = &a->slots[i];
        if (sl->layer != 0 || sl->pos != 1) continue;
        seen = true;
        double z = 0;
        for (int e = 0; e < 16; e++) z += exp(-e);
        cr_assert(!sl->set_equal && sl->overlap == 3 && sl->n_dropped == 1 && sl->dropped[0] == 3 && sl->n_added == 1 &&
                  sl->added[0] == 9);
        cr_assert_float_eq(sl->margin_logit, 1.0, 1e-12);
        cr_assert_float_eq(sl->margin_prob, (exp(-3.0) - exp(-4.0)) / z, 1e-12);
        cr_assert(!sl->tie);
    }
    cr_assert(seen);
    /* 12 slots, 3 flipped */
    cr_assert_float_eq(mf_diff_metric(a, "router_set_equal_pct"), 100.0 * 9 / 12, 1e-12);
    cr_assert_float_eq(mf_diff_metric(a, "router_ord_equal_pct"), 100.0 * 8 / 12, 1e-12);
    cr_assert_float_eq(mf_diff_metric(a, "router_positions_all_layers_equal_pct"), 100.0 * 1 / 4, 1e-12, "only position 3");
    /* 0.5 at layer 0 and the tie edit's 1.0 at layer 2 */
    cr_assert_float_eq(mf_diff_metric(a, "router_logit_mse"), (0.25 + 1.0) / (12 * 16), 1e-15);
    cr_assert_float_eq(mf_diff_metric(a, "primary_flips_pct"), 100.0 * 2 / 3, 1e-12);
    cr_assert_float_eq(mf_diff_metric(a, "tie_slots_pct"), 100.0 / 12, 1e-12);
    cr_assert_float_eq(mf_diff_metric(a, "expert_overlap_pct"), 100.0 * (12 * 4 - 3) / 48, 1e-12);
    cr_assert_eq(a->primary[0], 1);
    cr_assert_eq(a->inherited[1], 1);
    cr_assert_eq(a->primary[2], 1);
    cr_assert_eq(a->dropped[0 * 16 + 3], 1);
    cr_assert_eq(a->added[0 * 16 + 9], 1);
    cr_assert_eq(a->transitions[2 * 16 + 5], 1, "2 -> 5 at layer 1");
    cr_assert_eq(a->ties[2], 1);
    /* logits: one position differs at one token by x = ln 2 as stored (fp32) */
    const double x = (double)(float)log(2.0), V = 384, Z = 383 + exp(x);
    cr_assert_float_eq(mf_diff_metric(a, "raw_logit_mse"), x * x / (4 * V), 1e-15);
    /* KL(uniform || p_t) with p_t(5) = e^x / Z, the others 1 / Z */
    const double kl = -log(384.0) - x / 384 + log(Z);
    cr_assert_float_eq(mf_diff_metric(a, "forward_kl"), kl / 4, 1e-15);
    const double psq = (exp(x) / Z - 1.0 / 384) * (exp(x) / Z - 1.0 / 384) + 383 * (1 / Z - 1.0 / 384) * (1 / Z - 1.0 / 384);
    cr_assert_float_eq(mf_diff_metric(a, "prob_mse"), psq / (4 * V), 1e-18);
    cr_assert_float_eq(mf_diff_metric(a, "top1_pct"), 75.0, 1e-12, "position 2's argmax moves from 0 to 5");
    cr_assert_float_eq(mf_diff_metric(a, "set5_pct"), 75.0, 1e-12);
    /* error given flips: position 2 has one flipped slot (layer 1) and all the KL */
    cr_assert_float_eq(mf_diff_metric(a, "forward_kl_given_1_flip"), kl / 3, 1e-15, "positions 0, 1, 2 have one flip each");
    cr_assert_float_eq(mf_diff_metric(a, "forward_kl_given_0_flips"), 0.0, 1e-18);
    mf_diff_acc_free(a);
    free(a);
    mf_run_close(r);
    mf_run_close(t);
}

/* A grouped router's run (DeepSeek-V3's rule: 16 experts in 4 groups of 4, 2 groups kept) records the scores its
 * top-k ranked (`select`): margins come from those, not from the raw logits, and a flip is told apart by whether it
 * moved experts between groups. The logits here put expert 12 first, which the grouped choice never picked, so
 * margins taken from them would all be ties. */
typedef struct grouped {
    uint16_t ids[3][4][4];
    double router[3][4][16], select[3][4][16];
} grouped;

static void write_grouped(const char *dir, const grouped *g) {
    mf_config cfg;
    mf_error err = {0};
    char cpath[4200];
    snprintf(cpath, sizeof cpath, "%s/config.json", fixture("hf/olmoe"));
    cr_assert_eq(mf_config_load(&cfg, cpath, &err), MF_OK);
    cfg.route_rule = MF_ROUTE_SIGMOID_GROUP;
    cfg.n_group = 4;
    cfg.topk_group = 2;
    cfg.routed_scaling = 1.0;
    int32_t tokens[4] = {5, 6, 7, 8};
    mf_prompt p = {.id = "x", .tokens = tokens, .T = 4};
    mf_prompts ps = {&p, 1, "0"};
    mf_precision prec;
    cr_assert_eq(mf_precision_parse(&prec, "fp32", &err), MF_OK, "%s", err.msg);
    mf_run_info info = {.model_dir = "hand", .prec = &prec, .device = "cpu", .numerics = "native", .threads = 1,
                        .record = MF_RECORD_ROUTING, .input_path = "hand", .prompts = &ps, .cfg = &cfg,
                        .weights_digest = "w", .imported_from = "hand"};
    mf_run_writer *w;
    cr_assert_eq(mf_run_create(&w, dir, &info, false, &err), MF_OK, "%s", err.msg);
    mf_seq_result r = {.T = 4, .n_moe = 3, .k = 4, .E = 16, .V = 384, .H = 64};
    r.topk_ids = (uint16_t *)g->ids;
    r.router = (double *)g->router;
    r.select = (double *)g->select;
    double wts[48];
    for (int i = 0; i < 48; i++) wts[i] = 0.25;
    r.topk_w = wts;
    cr_assert_eq(mf_run_writer_add(w, &p, &r, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_run_writer_close(w, &err), MF_OK);
    mf_run_writer_free(w);
}

static void grouped_base(grouped *g) {
    memset(g, 0, sizeof *g);
    for (int l = 0; l < 3; l++)
        for (int t = 0; t < 4; t++) {
            for (int e = 0; e < 16; e++) g->router[l][t][e] = -e;
            g->router[l][t][12] = 5;
            /* groups 0 and 1 kept: experts 0..7 ranked 0.9375, 0.875, ... 0.5 (exact in fp32); the others masked */
            for (int e = 0; e < 8; e++) g->select[l][t][e] = 0.9375 - 0.0625 * e;
            for (int k = 0; k < 4; k++) g->ids[l][t][k] = (uint16_t)k;
        }
}

Test(diff_hand, grouped_router_margins_and_group_crossings) {
    grouped R, T;
    grouped_base(&R);
    grouped_base(&T);
    /* layer 0, position 1: 3 dropped for 4, from group 1 where the reference took none: across */
    T.ids[0][1][3] = 4;
    /* layer 1, position 2: the reference took 0, 1, 4, 5 (groups 0 and 1); the target 0, 1, 4, 6: 5 for 6 inside
     * group 1, which both used */
    R.select[1][2][4] = 0.78125, R.select[1][2][5] = 0.765625, R.select[1][2][2] = 0.53125, R.select[1][2][3] = 0.515625;
    R.ids[1][2][2] = 4, R.ids[1][2][3] = 5;
    T.ids[1][2][2] = 4, T.ids[1][2][3] = 6;
    /* layer 2, position 0: 0 dropped for 12 (group 3): across */
    T.ids[2][0][0] = 12;
    const char *d = temp_dir();
    char rp[4200], tp[4200];
    snprintf(rp, sizeof rp, "%s/r", d);
    snprintf(tp, sizeof tp, "%s/t", d);
    write_grouped(rp, &R);
    write_grouped(tp, &T);
    mf_error err = {0};
    mf_run *r, *t;
    cr_assert_eq(mf_run_open(&r, rp, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_run_open(&t, tp, &err), MF_OK, "%s", err.msg);
    cr_assert(r->has_select && r->n_group == 4);
    mf_diff_acc *a = new_acc(r);
    a->keep_slots = true;
    cr_assert_eq(mf_diff_acc_add_runs(a, r, t, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(a->flips[0] + a->flips[1] + a->flips[2], 3);
    cr_assert(a->cross_group[0] == 1 && a->cross_group[1] == 0 && a->cross_group[2] == 1);
    cr_assert_eq(a->ties[0] + a->ties[1] + a->ties[2], 0, "the ranked scores have no ties (the logits would)");
    int seen = 0;
    for (size_t i = 0; i < a->n_slots; i++) {
        const mf_slot *sl = &a->slots[i];
        if (sl->layer == 0 && sl->pos == 1) {   /* the k-th ranked (0.75) minus the (k+1)-th (0.6875) */
            cr_assert_eq(sl->margin_logit, 0.0625);
            cr_assert_eq(sl->margin_prob, 0.0625, "ranked scores are probabilities already");
            cr_assert_eq(sl->cross_group, 1);
            seen++;
        }
        if (sl->layer == 1 && sl->pos == 2) {   /* its lowest chosen, 0.765625, against expert 6's 0.5625 */
            cr_assert_eq(sl->margin_logit, 0.203125);
            cr_assert_eq(sl->cross_group, 0);
            seen++;
        }
        if (sl->set_equal) cr_assert_eq(sl->cross_group, -1);
    }
    cr_assert_eq(seen, 2);
    mf_diff_acc_free(a);
    free(a);
    mf_run_close(r);
    mf_run_close(t);
}

/* An expert id past the model's count is an error naming where it is, not an
 * index past the end of the score row: the run is refused when it is opened. */
Test(diff_hand, expert_id_out_of_range) {
    hand T;
    base(&T);
    T.ids[1][2][0] = 16;   /* the model has experts 0 .. 15 */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/t", temp_dir());
    write_run_experts(dir, &T, 16);
    mf_run *t = NULL;
    mf_error err = {0};
    cr_assert_eq(mf_run_open(&t, dir, &err), MF_EFORMAT);
    cr_assert_null(t);
    cr_assert(strstr(err.msg, "topk_ids holds expert 16 at layer 1, position 2"), "%s", err.msg);
    cr_assert(strstr(err.msg, "/t"), "names the target run: %s", err.msg);
}

/* A tensor whose shape disagrees with the run's manifest is refused when the
 * run is opened: here router rows of 8 scores in a run of a 16-expert model. */
Test(diff_hand, tensor_shape_disagrees_with_manifest) {
    hand R;
    base(&R);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/narrow", temp_dir());
    write_run_experts(dir, &R, 8);
    mf_run *r = NULL;
    mf_error err = {0};
    cr_assert_eq(mf_run_open(&r, dir, &err), MF_EFORMAT);
    cr_assert_null(r);
    cr_assert(strstr(err.msg, "sequence x: router is") && strstr(err.msg, "[3, 4, 8]") &&
                  strstr(err.msg, "[L=3, T=4, E=16]"), "%s", err.msg);
}

Test(diff_hand, alignment_names_the_first_mismatch) {
    char err_buf[2048];
    const char *d = temp_dir();
    char a[4200], b[4200], in2[4200];
    snprintf(a, sizeof a, "%s/a", d);
    snprintf(b, sizeof b, "%s/b", d);
    cr_assert_eq(run_moeflip(err_buf, sizeof err_buf, "trace --model %s --input %s --out %s -q", fixture("hf/olmoe"),
                             fixture("hf/olmoe/tokens.jsonl"), a), 0, "%s", err_buf);
    snprintf(in2, sizeof in2, "%s/t.jsonl", d);
    /* the same prompts, but the last token of s2 changed */
    mf_prompts ps;
    mf_error e = {0};
    cr_assert_eq(mf_prompts_load(&ps, fixture("hf/olmoe/tokens.jsonl"), 384, &e), MF_OK);
    FILE *fp = fopen(in2, "w");
    cr_assert(fp, "cannot write %s", in2);
    for (size_t i = 0; i < ps.n; i++) {
        fprintf(fp, "{\"id\": \"%s\", \"tokens\": [", ps.seq[i].id);
        for (int t = 0; t < ps.seq[i].T; t++) {
            int tok = ps.seq[i].tokens[t];
            if (i == 2 && t == ps.seq[i].T - 1) tok = (tok + 1) % 384;
            fprintf(fp, t ? ", %d" : "%d", tok);
        }
        fputs("]}\n", fp);
    }
    cr_assert_eq(fclose(fp), 0, "%s was not written", in2);
    mf_prompts_free(&ps);
    cr_assert_eq(run_moeflip(err_buf, sizeof err_buf, "trace --model %s --input %s --out %s -q", fixture("hf/olmoe"), in2, b),
                 0, "%s", err_buf);
    char out[4300];
    snprintf(out, sizeof out, "%s/d.json", d);
    cr_assert_eq(run_moeflip(err_buf, sizeof err_buf, "diff %s %s -o %s -q", a, b, out), 1);
    cr_assert(strstr(err_buf, "sequence s2, position 33"), "%s", err_buf);
}

/* Diffing shards apart and merging gives the single-pass diff.json exactly. */
Test(diff_merge, shards_merge_to_the_single_pass_result) {
    mf_run *r = import("qwen2_moe", "fp64"), *t = import("qwen2_moe", "bf16cuda");
    mf_diff_acc *all = diff_of(r, t), *p1 = new_acc(r), *p2 = new_acc(r);
    mf_error err = {0};
    /* shards in the opposite order from the run's */
    cr_assert_eq(mf_diff_acc_add_range(p2, r, t, 2, 1, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_diff_acc_add_range(p1, r, t, 0, 2, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_diff_merge(p2, p1, &err), MF_OK, "%s", err.msg);
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/all.json", temp_dir());
    snprintf(b, sizeof b, "%s/merged.json", temp_dir());
    mf_diff_opts o = {500, 3, false};
    mf_run *targets[1] = {t};
    cr_assert_eq(mf_diff_write_json(a, r, targets, &all, 1, NULL, NULL, &o, &err), MF_OK);
    cr_assert_eq(mf_diff_write_json(b, r, targets, &p2, 1, NULL, NULL, &o, &err), MF_OK);
    char *x, *y;
    size_t nx, ny;
    cr_assert_eq(mf_read_file(a, &x, &nx, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_read_file(b, &y, &ny, &err), MF_OK, "%s", err.msg);
    cr_assert(nx > 1000 && nx == ny && memcmp(x, y, nx) == 0, "merged diff differs from the single pass");
    free(x);
    free(y);
    mf_diff_acc_free(all);
    mf_diff_acc_free(p1);
    mf_diff_acc_free(p2);
    free(all);
    free(p1);
    free(p2);
    mf_run_close(r);
    mf_run_close(t);
}

/* ---- the diff job (mf_diff_runs) ---------------------------------------------------- */

/* One output that cannot be written: none is left, not even the ones that could be, nor a temporary. */
Test(diff_job, outputs_are_written_whole_or_not_at_all) {
    const char *d = temp_dir();
    const char *ref = make_run(d, "ref", "hf/olmoe", "--precision fp64");
    const char *hop = make_run(d, "hop", "hf/olmoe", "--numerics emu:hopper --precision bf16");
    char json[700], slots[700], positions[700];
    snprintf(json, sizeof json, "%s/d.json", d);
    snprintf(slots, sizeof slots, "%s/slots.csv", d);
    snprintf(positions, sizeof positions, "%s/no-such-dir/positions.csv", d);
    const char *targets[] = {hop};
    mf_diff_request q = {.reference = ref, .targets = targets, .n_targets = 1, .bootstrap = 0, .seed = MF_DIFF_SEED,
                         .json_path = json, .positions_path = positions, .slots_path = slots};
    mf_error err = {0};
    cr_assert_neq(mf_diff_runs(&q, &err), MF_OK);
    cr_assert(strstr(err.msg, "positions.csv"), "%s", err.msg);
    cr_assert_not(mf_path_exists(json), "diff.json was left without its positions");
    cr_assert_not(mf_path_exists(slots), "the slots CSV was left without the positions");
    cr_assert_eq(dir_entries_named(d, "tmp"), 0, "a temporary was left in %s", d);
    /* the same request with every path writable writes all three */
    snprintf(positions, sizeof positions, "%s/positions.csv", d);
    err = (mf_error){0};
    cr_assert_eq(mf_diff_runs(&q, &err), MF_OK, "%s", err.msg);
    cr_assert(mf_path_exists(json) && mf_path_exists(slots) && mf_path_exists(positions));
}

/* Labels name the runs in diff.json, the summary and the messages; the repeat policy takes the first target with the
 * reference's configuration as the floor, the none policy takes none. */
Test(diff_job, labels_name_the_runs_and_the_repeat_is_the_floor) {
    const char *d = temp_dir();
    const char *ref = make_run(d, "ref", "hf/olmoe", "--precision fp64");
    const char *hop = make_run(d, "hop", "hf/olmoe", "--numerics emu:hopper --precision bf16");
    const char *rep = make_run(d, "rep", "hf/olmoe", "--precision fp64");
    const char *targets[] = {hop, rep}, *labels[] = {"H", "P"};
    char json[700];
    snprintf(json, sizeof json, "%s/d.json", d);
    char *summary = NULL;
    size_t summary_len = 0;
    FILE *sf = open_memstream(&summary, &summary_len);
    cr_assert(sf);
    mf_diff_request q = {.reference = ref, .targets = targets, .n_targets = 2, .reference_label = "R", .target_labels = labels,
                         .floor = MF_DIFF_FLOOR_REPEAT, .bootstrap = 20, .seed = MF_DIFF_SEED, .json_path = json, .summary = sf};
    mf_error err = {0};
    cr_assert_eq(mf_diff_runs(&q, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(fclose(sf), 0);
    cr_assert(strstr(summary, "reference  R: fp64 x fp64") && strstr(summary, "target 1   H: ") && strstr(summary, "target 2   P: "),
              "%s", summary);
    cr_assert_null(strstr(summary, d), "the summary names a directory: %s", summary);
    free(summary);
    json_t *doc = json_load_file(json, 0, NULL);
    cr_assert(doc);
    json_t *ts = json_object_get(doc, "targets");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "reference"), "run")), "R");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ts, 0), "run")), "H");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ts, 1), "run")), "P");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "floor"), "run")), "P");
    /* the floor is an exact repeat on the CPU: H's excess over it is H's own value */
    json_t *excess = json_object_get(json_object_get(json_object_get(json_array_get(ts, 0), "floor"), "excess"), "flipped_slots_pct");
    json_t *own = json_object_get(json_object_get(json_array_get(ts, 0), "metrics"), "flipped_slots_pct");
    cr_assert(excess && own);
    cr_assert_float_eq(json_number_value(json_object_get(excess, "value")), json_number_value(json_object_get(own, "value")), 0);
    cr_assert_null(json_object_get(json_array_get(ts, 1), "floor"), "the floor has no excess over itself");
    json_decref(doc);
    /* no floor asked for: none */
    q.floor = MF_DIFF_FLOOR_NONE;
    q.summary = NULL;
    cr_assert_eq(mf_diff_runs(&q, &err), MF_OK, "%s", err.msg);
    doc = json_load_file(json, 0, NULL);
    cr_assert(doc);
    cr_assert_null(json_object_get(doc, "floor"));
    cr_assert_null(json_object_get(json_array_get(json_object_get(doc, "targets"), 0), "floor"));
    json_decref(doc);
    /* a run of another model is refused with both runs named by their labels */
    const char *other = make_run(d, "other", "hf/qwen2_moe", "--precision fp64");
    const char *bad[] = {other}, *bad_labels[] = {"Q"};
    mf_diff_request b = {.reference = ref, .targets = bad, .n_targets = 1, .reference_label = "R", .target_labels = bad_labels,
                         .seed = MF_DIFF_SEED, .json_path = json};
    err = (mf_error){0};
    cr_assert_eq(mf_diff_runs(&b, &err), MF_EMISMATCH);
    cr_assert(strstr(err.msg, "R and Q are runs of different models"), "%s", err.msg);
}
