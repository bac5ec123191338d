/* Pooled metrics, bootstrap intervals, the router noise fit, and the
 * outputs of a diff: diff.json, the summary, the positions CSV. */
#include "diff_int.h"
#include "mf_dist.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- metrics as ratios of sums over cases ---------------------------------- */

typedef enum {
    M_RAW_LOGIT_MSE, M_PROB_MSE, M_FORWARD_KL, M_TOP1, M_ORD5, M_SET5, M_EQUAL_BITS,
    M_ROUTER_SET, M_ROUTER_ORD, M_ROUTER_POS_ALL, M_ROUTER_LOGIT_MSE,
    /* ours */
    M_FLIPPED, M_PRIMARY, M_INHERITED, M_TIES, M_OVERLAP, M_GATE_MSE, M_SHARED_MSE,
    M_KL_0, M_KL_1, M_KL_2, M_TOP1_0, M_TOP1_1, M_TOP1_2,
    M_COUNT
} metric_id;

static const struct {
    const char *name;
    double scale;
    bool logits;   /* needs full logits on both sides */
} metrics[M_COUNT] = {
    [M_RAW_LOGIT_MSE] = {"raw_logit_mse", 1, true},
    [M_PROB_MSE] = {"prob_mse", 1, true},
    [M_FORWARD_KL] = {"forward_kl", 1, true},
    [M_TOP1] = {"top1_pct", 100, true},
    [M_ORD5] = {"ord5_pct", 100, true},
    [M_SET5] = {"set5_pct", 100, true},
    [M_EQUAL_BITS] = {"equal_bits_pct", 100, true},
    [M_ROUTER_SET] = {"router_set_equal_pct", 100, false},
    [M_ROUTER_ORD] = {"router_ord_equal_pct", 100, false},
    [M_ROUTER_POS_ALL] = {"router_positions_all_layers_equal_pct", 100, false},
    [M_ROUTER_LOGIT_MSE] = {"router_logit_mse", 1, false},
    [M_FLIPPED] = {"flipped_slots_pct", 100, false},
    [M_PRIMARY] = {"primary_flips_pct", 100, false},
    [M_INHERITED] = {"inherited_flips_pct", 100, false},
    [M_TIES] = {"tie_slots_pct", 100, false},
    [M_OVERLAP] = {"expert_overlap_pct", 100, false},
    [M_GATE_MSE] = {"gate_weight_mse", 1, false},
    [M_SHARED_MSE] = {"shared_gate_mse", 1, false},
    [M_KL_0] = {"forward_kl_given_0_flips", 1, true},
    [M_KL_1] = {"forward_kl_given_1_flip", 1, true},
    [M_KL_2] = {"forward_kl_given_2plus_flips", 1, true},
    [M_TOP1_0] = {"top1_pct_given_0_flips", 100, true},
    [M_TOP1_1] = {"top1_pct_given_1_flip", 100, true},
    [M_TOP1_2] = {"top1_pct_given_2plus_flips", 100, true},
};

/* numerator and denominator of metric m for one case */
static void num_den(const mf_case *c, int m, int K, double *num, double *den) {
    const double pv = (double)c->positions * (double)c->vocab, pos = (double)c->positions;
    *num = *den = 0;
    if (metrics[m].logits && !c->has_logits) return;
    switch (m) {
    case M_RAW_LOGIT_MSE: *num = c->sq_err; *den = pv; break;
    case M_PROB_MSE: *num = c->prob_sq_err; *den = pv; break;
    case M_FORWARD_KL: *num = c->kl; *den = pos; break;
    case M_TOP1: *num = (double)c->top1; *den = pos; break;
    case M_ORD5: *num = (double)c->ord5; *den = pos; break;
    case M_SET5: *num = (double)c->set5; *den = pos; break;
    case M_EQUAL_BITS:
        if (c->equal_bits >= 0) {
            *num = (double)c->equal_bits;
            *den = pv;
        }
        break;
    case M_ROUTER_SET: *num = (double)c->router_set_equal; *den = (double)c->router_slots; break;
    case M_ROUTER_ORD: *num = (double)c->router_ord_equal; *den = (double)c->router_slots; break;
    case M_ROUTER_POS_ALL:
        if (c->router_slots) {
            *num = (double)c->router_positions_all_layers_equal;
            *den = pos;
        }
        break;
    case M_ROUTER_LOGIT_MSE: *num = c->router_logit_sq_err; *den = (double)c->router_logit_count; break;
    case M_FLIPPED: *num = (double)c->flipped; *den = (double)c->router_slots; break;
    case M_PRIMARY: *num = (double)c->primary; *den = (double)c->flipped; break;
    case M_INHERITED: *num = (double)c->inherited; *den = (double)c->flipped; break;
    case M_TIES: *num = (double)c->ties; *den = (double)c->router_slots; break;
    case M_OVERLAP: *num = (double)c->overlap; *den = (double)c->router_slots * K; break;
    case M_GATE_MSE: *num = c->gate_sq_err; *den = (double)c->gate_count; break;
    case M_SHARED_MSE: *num = c->shared_sq_err; *den = (double)c->shared_count; break;
    case M_KL_0: case M_KL_1: case M_KL_2:
        *num = c->cond_kl[m - M_KL_0];
        *den = (double)c->cond_positions[m - M_KL_0];
        break;
    case M_TOP1_0: case M_TOP1_1: case M_TOP1_2:
        *num = (double)c->cond_top1[m - M_TOP1_0];
        *den = (double)c->cond_positions[m - M_TOP1_0];
        break;
    }
}

static int cmp_case(const void *a, const void *b) { return strcmp(((const mf_case *)a)->id, ((const mf_case *)b)->id); }

/* Cases in id order: pooled values do not depend on how the cases were gathered. */
static void sort_cases(mf_diff_acc *a) {
    if (a->n_cases) qsort(a->cases, a->n_cases, sizeof *a->cases, cmp_case);
}

/* Sum of metric m's numerators (and denominators) over cases idx[0..n), or all when idx is NULL. */
static double sum_num(const mf_diff_acc *a, int m, const int *idx, size_t n, double *den) {
    double s = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        double x, y;
        num_den(&a->cases[idx ? (size_t)idx[i] : i], m, a->K, &x, &y);
        s += x;
        d += y;
    }
    if (den) *den = d;
    return s;
}

/* Pooled ratio over cases idx[0..n) (all cases when idx is NULL). */
static double pooled(const mf_diff_acc *a, int m, const int *idx, size_t n) {
    double den, num = sum_num(a, m, idx, n, &den);
    return den > 0 ? metrics[m].scale * num / den : NAN;
}

static int metric_index(const char *name) {
    for (int m = 0; m < M_COUNT; m++)
        if (!strcmp(metrics[m].name, name)) return m;
    return -1;
}

double mf_diff_metric(const mf_diff_acc *a, const char *name) {
    int m = metric_index(name);
    if (m < 0) return NAN;
    mf_diff_acc *w = (mf_diff_acc *)a;
    sort_cases(w);
    return pooled(a, m, NULL, a->n_cases);
}

/* ---- bootstrap --------------------------------------------------------------- */

/* In a diff shared by the ranks of a job (diff_bootstrap_share): each rank computes a block of the draws of every
 * interval, and rank 0 gathers them, so it has every draw in draw order, as one process computes them. The
 * others' intervals are NaN: their diff.json is not written, and no interval steers anything. Per thread: the
 * collector diffs in several threads at once, never shared. */
static _Thread_local bool shared_draws;

void diff_bootstrap_share(bool on) { shared_draws = on && mf_dist_size() > 1; }

/* The draws [first, first + count) of the B this thread's process computes: all of them, or its rank's block. */
static void own_draws(int B, size_t *first, size_t *count) {
    *first = 0;
    *count = (size_t)B;
    if (shared_draws) mf_dist_block((size_t)B, mf_dist_rank(), mf_dist_size(), first, count);
}

/* The resampling plan: B draws of n case indices, with replacement, from one
 * seeded generator; the same plan for every metric and every target (paired).
 * Only the rows of the draws this process computes (own_draws) are kept: the
 * generator runs through the others' rows to reach them. */
static int *bootstrap_plan(size_t n, int B, uint64_t seed) {
    size_t first, count;
    own_draws(B, &first, &count);
    int *idx = mf_xmalloc(sizeof(int) * (count * n + 1));
    mf_rng r;
    mf_rng_seed(&r, seed);
    for (size_t i = 0; i < first * n; i++) (void)mf_rng_next(&r);
    for (size_t i = 0; i < count * n; i++) idx[i] = (int)(mf_rng_uniform(&r) * (double)n);
    return idx;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* numpy's default percentile: linear interpolation between order statistics */
static double percentile(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double h = (n - 1) * p / 100.0;
    int lo = (int)floor(h);
    if (lo >= n - 1) return v[n - 1];
    return v[lo] + (h - lo) * (v[lo + 1] - v[lo]);
}

/* CI of f(b) over the plan, where f takes the draw's index row; NaN draws are
 * dropped (a draw can miss every case that defines a metric). */
static void ci_of(double (*f)(const void *, const int *, size_t), const void *ctx, const int *plan, size_t n, int B,
                  double ci[2]) {
    ci[0] = ci[1] = NAN;
    if (!plan || !B || !n) return;
    size_t first, count;
    own_draws(B, &first, &count);
    double *v = mf_xmalloc(sizeof(double) * (size_t)B);
    for (size_t b = 0; b < count; b++) v[b] = f(ctx, plan + b * n, n);
    if (shared_draws) {   /* every rank's block, in draw order, at rank 0: the values one process would have */
        uint8_t *all;
        size_t *off;
        mf_dist_gather(v, count * sizeof(double), 0, &all, &off);
        const bool root = all != NULL;
        if (root) memcpy(v, all, sizeof(double) * (size_t)B);
        free(all);
        free(off);
        if (!root) {
            free(v);
            return;
        }
    }
    int k = 0;
    for (int b = 0; b < B; b++)
        if (!isnan(v[b])) v[k++] = v[b];
    if (k) {
        ci[0] = percentile(v, k, 2.5);
        ci[1] = percentile(v, k, 97.5);
    }
    free(v);
}

typedef struct mctx {
    const mf_diff_acc *a, *base;   /* base: paired comparison (a - base) */
    int m;
    int layer;                     /* per-layer agreement */
    bool ord;
} mctx;

static double f_metric(const void *p, const int *idx, size_t n) {
    const mctx *c = p;
    double v = pooled(c->a, c->m, idx, n);
    return c->base ? v - pooled(c->base, c->m, idx, n) : v;
}

static double f_layer(const void *p, const int *idx, size_t n) {
    const mctx *c = p;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const mf_case *k = &c->a->cases[idx[i]];
        num += (double)(c->ord ? k->layer_ord_equal[c->layer] : k->layer_set_equal[c->layer]);
        den += (double)k->layer_slots[c->layer];
    }
    return den > 0 ? 100 * num / den : NAN;
}

static json_t *num_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *value_ci(double v, const double ci[2]) {
    json_t *o = json_object();
    json_object_set_new(o, "value", num_or_null(v));
    json_t *c = json_array();
    json_array_append_new(c, num_or_null(ci[0]));
    json_array_append_new(c, num_or_null(ci[1]));
    json_object_set_new(o, "ci95", c);
    return o;
}

void diff_ci(double (*f)(const void *, const int *, size_t), const void *ctx, const int *plan, size_t n, int B,
             double ci[2]) {
    ci_of(f, ctx, plan, n, B, ci);
}

json_t *diff_value_ci(double v, const double ci[2]) { return value_ci(v, ci); }

/* ---- router noise scale: P(flip | margin) = Phi(-margin / sigma) ------------- */

static double bin_center(int b) {
    if (b == 0) return 0;
    if (b >= MF_MARGIN_BINS - 1) return 300;
    return pow(10, (b - 0.5) / 4.0 - 6.0);
}

static double phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

/* The bins' centres, computed once (the fit evaluates nll about 50 times a layer). */
static const double *bin_centers(void) {
    static double c[MF_MARGIN_BINS];
    static bool done;
    if (!done) {
        for (int b = 0; b < MF_MARGIN_BINS; b++) c[b] = bin_center(b);
        done = true;
    }
    return c;
}

static double nll(const int64_t *slots, const int64_t *flips, double sigma) {
    const double *centre = bin_centers();
    double s = 0;
    for (int b = 0; b < MF_MARGIN_BINS; b++) {
        if (!slots[b]) continue;
        double p = phi(-centre[b] / sigma);
        p = p < 1e-300 ? 1e-300 : p > 1 - 1e-16 ? 1 - 1e-16 : p;
        s -= (double)flips[b] * log(p) + (double)(slots[b] - flips[b]) * log(1 - p);
    }
    return s;
}

/* Maximum likelihood over log sigma by golden-section search; NaN without flips. */
static double fit_sigma(const int64_t *slots, const int64_t *flips) {
    int64_t nf = 0;
    for (int b = 1; b < MF_MARGIN_BINS; b++) nf += flips[b];
    if (!nf) return NAN;
    double lo = log(1e-9), hi = log(1e3);
    const double g = (sqrt(5.0) - 1) / 2;
    double x1 = hi - g * (hi - lo), x2 = lo + g * (hi - lo);
    double f1 = nll(slots, flips, exp(x1)), f2 = nll(slots, flips, exp(x2));
    for (int i = 0; i < 200 && hi - lo > 1e-9; i++) {
        if (f1 < f2) {
            hi = x2;
            x2 = x1;
            f2 = f1;
            x1 = hi - g * (hi - lo);
            f1 = nll(slots, flips, exp(x1));
        } else {
            lo = x1;
            x1 = x2;
            f1 = f2;
            x2 = lo + g * (hi - lo);
            f2 = nll(slots, flips, exp(x2));
        }
    }
    return exp((lo + hi) / 2);
}

/* ---- Spearman correlation of flipped slots with KL over positions --------- */

static const double *rank_values;

static int cmp_rank(const void *a, const void *b) {
    double x = rank_values[*(const int *)a], y = rank_values[*(const int *)b];
    if (x != y) return x < y ? -1 : 1;
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);   /* a total order */
}

static void ranks(const double *v, int n, double *r) {
    int *o = mf_xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) o[i] = i;
    rank_values = v;
    qsort(o, (size_t)n, sizeof *o, cmp_rank);
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && v[o[j + 1]] == v[o[i]]) j++;
        for (int k = i; k <= j; k++) r[o[k]] = (i + j) / 2.0 + 1;   /* ties share the average rank */
        i = j + 1;
    }
    free(o);
}

static double spearman(const mf_diff_acc *a) {
    int n = 0;
    for (size_t i = 0; i < a->n_pos; i++) n += !isnan(a->pos[i].kl);
    if (n < 3) return NAN;
    double *x = mf_xmalloc(sizeof(double) * (size_t)n * 4), *y = x + n, *rx = y + n, *ry = rx + n;
    int k = 0;
    for (size_t c = 0; c < a->n_cases; c++)   /* cases in id order: the same sums however the diff was gathered */
        for (int j = 0; j < a->cases[c].pos_count; j++) {
            const mf_position *p = &a->pos[a->cases[c].pos_first + (size_t)j];
            if (isnan(p->kl)) continue;
            x[k] = p->flipped_slots;
            y[k++] = p->kl;
        }
    ranks(x, n, rx);
    ranks(y, n, ry);
    double mx = 0, my = 0;
    for (int i = 0; i < n; i++) {
        mx += rx[i];
        my += ry[i];
    }
    mx /= n;
    my /= n;
    double sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < n; i++) {
        sxy += (rx[i] - mx) * (ry[i] - my);
        sxx += (rx[i] - mx) * (rx[i] - mx);
        syy += (ry[i] - my) * (ry[i] - my);
    }
    free(x);
    return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : NAN;
}

/* ---- diff.json --------------------------------------------------------------- */

/* How the caller names a run: its label, else its directory. */
static const char *label_or_dir(const char *label, const mf_run *r) { return label ? label : r->dir; }

static const char *target_label(const diff_labels *l, int i, const mf_run *r) {
    return label_or_dir(l && l->targets ? l->targets[i] : NULL, r);
}

static json_t *run_info(mf_run *r, const char *label) {
    json_t *m = json_loads(r->manifest_text, 0, NULL), *o = json_object();
    json_object_set_new(o, "run", json_string(label));
    json_object_set(o, "numerics", json_object_get(m, "numerics"));
    json_object_set(o, "precision", json_object_get(json_object_get(m, "precision"), "name"));
    json_object_set(o, "device", json_object_get(json_object_get(m, "device"), "kind"));
    json_object_set(o, "device_name", json_object_get(json_object_get(m, "device"), "name"));
    json_object_set(o, "model", json_object_get(m, "model"));
    json_object_set(o, "tool", json_object_get(m, "tool"));
    if (json_object_get(m, "replay")) json_object_set(o, "replay", json_object_get(m, "replay"));   /* trace --replay */
    json_decref(m);
    return o;
}

/* Whether metric m is defined for a (some case has a denominator): an undefined metric (no logits, no bf16
 * logits, no shared expert) is left out of diff.json; a defined one is a number, or null with a warning. */
static bool defined(const mf_diff_acc *a, int m) {
    double den;
    sum_num(a, m, NULL, a->n_cases, &den);
    return den > 0;
}

/* The first case (in id order) whose numerator of metric m is not a number, for the warning; NULL if none. */
static const char *first_bad_case(const mf_diff_acc *a, int m) {
    for (size_t i = 0; i < a->n_cases; i++) {
        double x, y;
        num_den(&a->cases[i], m, a->K, &x, &y);
        if (!isfinite(x)) return a->cases[i].id;
    }
    return NULL;
}

/* "who: metric is not a number (...)": a metric that is defined and came out NaN or infinite (logits that
 * overflow, NaN router scores) is written as null, and said so. */
static void warn_not_a_number(json_t *warnings, const char *who, const char *what, const mf_diff_acc *a, const mf_diff_acc *base,
                              int m) {
    const char *bad = first_bad_case(a, m), *bad_base = base ? first_bad_case(base, m) : NULL;
    char line[1024];
    if (bad || bad_base)
        snprintf(line, sizeof line, "%s: %s is not a number (sequence %s of %s is not finite); written as null", who, what,
                 bad ? bad : bad_base, bad ? "this run's comparison" : "the one it is compared with");
    else
        snprintf(line, sizeof line, "%s: %s is not a number (its sums overflow); written as null", who, what);
    mf_utf8_scrub(line);
    json_array_append_new(warnings, json_string(line));
}

/* What metric m needs of the reference and of the target beyond the experts (MF_LACKS_* bits). */
static void metric_needs(int m, unsigned *ref, unsigned *tgt) {
    *ref = *tgt = 0;
    if (metrics[m].logits) *ref = *tgt = MF_LACKS_LOGITS;
    else if (m == M_ROUTER_LOGIT_MSE) *ref = *tgt = MF_LACKS_ROUTER;
    else if (m == M_TIES) *ref = MF_LACKS_ROUTER;   /* ties are the reference's margins */
    else if (m == M_GATE_MSE) *ref = *tgt = MF_LACKS_GATES;
    else if (m == M_SHARED_MSE) *ref = *tgt = MF_LACKS_SHARED;
}

/* Whether a run compared in a cannot have what metric m needs (an imported capture); if so, line says which run
 * lacks what ("the target (a vllm capture) has no logits"). */
static bool metric_lacking(const mf_diff_acc *a, int m, char *line, size_t cap) {
    unsigned need_ref, need_tgt;
    metric_needs(m, &need_ref, &need_tgt);
    const unsigned r = need_ref & a->ref_lacks, t = need_tgt & a->tgt_lacks;
    if (!r && !t) return false;
    char what[128];
    mf_lacks_text(r ? r : t, what, sizeof what);
    snprintf(line, cap, "the %s (a %s capture) has no %s", r ? "reference" : "target", r ? a->ref_engine : a->tgt_engine, what);
    return true;
}

static json_t *metrics_json(const mf_diff_acc *a, const mf_diff_acc *base, const int *plan, int B, json_t *warnings,
                            const char *who) {
    json_t *o = json_object();
    for (int m = 0; m < M_COUNT; m++) {
        char lack[256];
        if (metric_lacking(a, m, lack, sizeof lack) || (base && metric_lacking(base, m, lack, sizeof lack))) {
            /* a metric an imported capture cannot have: null, and said so, never a number made of absent data */
            char line[1024];
            snprintf(line, sizeof line, "%s: %s: %s; written as null", who, metrics[m].name, lack);
            mf_utf8_scrub(line);
            json_array_append_new(warnings, json_string(line));
            json_object_set_new(o, metrics[m].name, json_null());
            continue;
        }
        if (!defined(a, m) || (base && !defined(base, m))) continue;   /* undefined for these runs */
        mctx c = {a, base, m, 0, false};
        double ci[2], v = pooled(a, m, NULL, a->n_cases);
        if (base) v -= pooled(base, m, NULL, base->n_cases);
        if (!isfinite(v)) {
            warn_not_a_number(warnings, who, metrics[m].name, a, base, m);
            ci[0] = ci[1] = NAN;
        } else {
            ci_of(f_metric, &c, plan, a->n_cases, B, ci);
        }
        json_object_set_new(o, metrics[m].name, value_ci(v, ci));
    }
    return o;
}

typedef struct pctx {
    const mf_diff_acc *a, *b;   /* CroVA's x (first target) and y (this target) */
    int m;
} pctx;

static double f_rel_change(const void *p, const int *idx, size_t n) {
    const pctx *c = p;
    double x = sum_num(c->a, c->m, idx, n, NULL), y = sum_num(c->b, c->m, idx, n, NULL);
    return x > 0 ? 100 * (y / x - 1) : NAN;
}

static double f_count_diff(const void *p, const int *idx, size_t n) {
    const pctx *c = p;
    return sum_num(c->b, c->m, idx, n, NULL) - sum_num(c->a, c->m, idx, n, NULL);
}

/* CroVA's paired_bootstrap: relative change of error sums, and count differences. */
static json_t *crova_paired(const mf_diff_acc *a, const mf_diff_acc *b, const int *plan, int B, json_t *warnings,
                            const char *who) {
    json_t *o = json_object();
    static const struct { const char *key; int m; bool rel; } items[] = {
        {"sq_err_rel_change_pct", M_RAW_LOGIT_MSE, true}, {"kl_rel_change_pct", M_FORWARD_KL, true},
        {"prob_sq_err_rel_change_pct", M_PROB_MSE, true}, {"top1_diff", M_TOP1, false},
        {"ord5_diff", M_ORD5, false}, {"set5_diff", M_SET5, false}, {"equal_bits_diff", M_EQUAL_BITS, false},
        {"router_set_equal_diff", M_ROUTER_SET, false},
    };
    const size_t n = a->n_cases;
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        double den;
        sum_num(a, items[i].m, NULL, n, &den);
        if (!(den > 0)) continue;   /* undefined for these runs */
        pctx c = {a, b, items[i].m};
        double (*f)(const void *, const int *, size_t) = items[i].rel ? f_rel_change : f_count_diff;
        double ci[2] = {NAN, NAN};
        const double x = sum_num(a, items[i].m, NULL, n, NULL), y = sum_num(b, items[i].m, NULL, n, NULL);
        if (!isfinite(x) || !isfinite(y)) warn_not_a_number(warnings, who, items[i].key, b, a, items[i].m);
        else ci_of(f, &c, plan, n, B, ci);
        json_object_set_new(o, items[i].key, value_ci(f(&c, NULL, n), ci));
    }
    return o;
}

/* ---- the per-sequence section, written by hand ------------------------------
 * It holds most of diff.json's bytes (every position of every sequence), so it
 * is streamed into the text one line per sequence instead of going through a
 * jansson tree: the same schema and values (reals as jansson prints them at 17
 * digits, strings escaped as jansson does). */

/* Decimal digits of v at o (at most 11 bytes); returns the end. */
static inline char *put_int(char *o, int v) {
    unsigned u = v < 0 ? 0u - (unsigned)v : (unsigned)v;
    char tmp[10];
    int n = 0;
    do tmp[n++] = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) *o++ = '-';
    while (n) *o++ = tmp[--n];
    return o;
}

static void sb_int(mf_buf *b, int v) {
    mf_buf_reserve(b, 12);
    b->n = (size_t)(put_int(b->s + b->n, v) - b->s);
    b->s[b->n] = 0;
}

/* A JSON array of one int field of count positions: "[a, b, ...]". */
static void sb_pos_ints(mf_buf *b, const mf_position *pos, int count, bool tokens) {
    mf_buf_reserve(b, (size_t)count * 13 + 2);
    char *o = b->s + b->n;
    *o++ = '[';
    for (int j = 0; j < count; j++) {
        if (j) {
            *o++ = ',';
            *o++ = ' ';
        }
        o = put_int(o, tokens ? pos[j].token : pos[j].flipped_slots);
    }
    *o++ = ']';
    b->n = (size_t)(o - b->s);
    b->s[b->n] = 0;
}

/* A real as jansson writes it with JSON_REAL_PRECISION(17): %.17g, ".0" when
 * it would read as an integer, no '+' or leading zeros in the exponent; null
 * when not finite (num_or_null). */
static void sb_real(mf_buf *b, double x) {
    if (!isfinite(x)) {
        mf_buf_put(b, "null", 4);
        return;
    }
    char t[40];
    int n = snprintf(t, sizeof t, "%.17g", x);
    char *e = strchr(t, 'e');
    if (!e && !strchr(t, '.')) {
        memcpy(t + n, ".0", 3);
        n += 2;
    }
    if (e) {
        char *from = e + 1, *to = e + 1;
        if (*from == '+') from++;
        else if (*from == '-') to = ++from;
        while (*from == '0' && from[1]) from++;
        memmove(to, from, strlen(from) + 1);
        n = (int)strlen(t);
    }
    mf_buf_put(b, t, (size_t)n);
}

/* A JSON string: quotes, backslashes and control characters escaped as
 * jansson escapes them; other bytes (valid UTF-8) as they are. */
static void sb_str(mf_buf *b, const char *s) {
    mf_buf_reserve(b, 6 * strlen(s) + 2);
    char *o = b->s + b->n;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const unsigned char c = *p;
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20) {
            *o++ = '\\';
            switch (c) {
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            default: o += sprintf(o, "u%04X", c);
            }
        } else *o++ = (char)c;
    }
    *o++ = '"';
    b->n = (size_t)(o - b->s);
    b->s[b->n] = 0;
}

/* Length of the well-formed UTF-8 character at p (RFC 3629: no overlong
 * forms, no surrogates, at most U+10FFFF), 0 when there is none. */
static int utf8_char(const unsigned char *p) {
    const unsigned char c = p[0];
    if (c < 0x80) return 1;
    int len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || c == 0xc0 || c == 0xc1 || c > 0xf4) return 0;
    for (int i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if (c == 0xe0 && p[1] < 0xa0) return 0;   /* overlong */
    if (c == 0xed && p[1] >= 0xa0) return 0;  /* surrogates */
    if (c == 0xf0 && p[1] < 0x90) return 0;   /* overlong */
    if (c == 0xf4 && p[1] >= 0x90) return 0;  /* past U+10FFFF */
    return len;
}

/* A token's text for display: valid UTF-8, control characters made visible. */
static void sb_token_text(mf_buf *b, const mf_tokenizer *tk, int32_t id) {
    char *raw = mf_tokenizer_decode(tk, &id, 1), out[96];
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p && n < sizeof out - 8;) {
        const int len = utf8_char(p);
        if (!len) {   /* a byte of a character split across tokens */
            out[n++] = '?';
            p++;
        } else if (*p == '\n') {
            memcpy(out + n, "\xe2\x86\xb5", 3);   /* a visible newline */
            n += 3;
            p++;
        } else if (*p < 0x20) {
            out[n++] = ' ';
            p++;
        } else {
            memcpy(out + n, p, (size_t)len);
            n += (size_t)len;
            p += len;
        }
    }
    out[n] = 0;
    free(raw);
    sb_str(b, out);
}

/* Per sequence: tokens (and their texts), each position's flipped-slot count
 * and KL, and the flipped slots as [layer, position, inherited] (for the
 * layer x position maps and the flips-KL plot). indent: the array's depth. */
static void sequences_text(mf_buf *b, const mf_diff_acc *a, const mf_tokenizer *tk, int indent) {
    if (!a->n_cases) {
        mf_buf_put(b, "[]", 2);
        return;
    }
    mf_buf_put(b, "[", 1);
    for (size_t ci = 0; ci < a->n_cases; ci++) {
        const mf_case *c = &a->cases[ci];
        const mf_position *pos = a->pos + c->pos_first;
        mf_buf_reserve(b, (size_t)c->pos_count * 16 + (size_t)c->flip_count * 24 + 256);
        mf_buf_put(b, ci ? ",\n" : "\n", ci ? 2 : 1);
        for (int i = 0; i < indent + 1; i++) mf_buf_put(b, " ", 1);
        mf_buf_puts(b, "{\"id\": ");
        sb_str(b, c->id);
        mf_buf_puts(b, ", \"tokens\": ");
        sb_pos_ints(b, pos, c->pos_count, true);
        if (tk) {
            mf_buf_puts(b, ", \"token_text\": [");
            for (int j = 0; j < c->pos_count; j++) {
                if (j) mf_buf_put(b, ", ", 2);
                sb_token_text(b, tk, pos[j].token);
            }
            mf_buf_put(b, "]", 1);
        }
        mf_buf_puts(b, ", \"flipped_slots\": ");
        sb_pos_ints(b, pos, c->pos_count, false);
        bool has_kl = false;
        for (int j = 0; j < c->pos_count; j++) has_kl |= !isnan(pos[j].kl);
        mf_buf_puts(b, ", \"kl\": ");
        if (has_kl) {
            mf_buf_put(b, "[", 1);
            for (int j = 0; j < c->pos_count; j++) {
                if (j) mf_buf_put(b, ", ", 2);
                sb_real(b, pos[j].kl);
            }
            mf_buf_put(b, "]", 1);
        } else mf_buf_put(b, "null", 4);
        mf_buf_puts(b, ", \"flips\": [");
        for (int j = 0; j < c->flip_count; j++) {
            const mf_flip *f = &a->flip_list[c->flip_first + (size_t)j];
            if (j) mf_buf_put(b, ", ", 2);
            mf_buf_put(b, "[", 1);
            sb_int(b, f->layer);
            mf_buf_put(b, ", ", 2);
            sb_int(b, f->pos);
            mf_buf_puts(b, f->inherited ? ", true]" : ", false]");
        }
        mf_buf_put(b, "]}", 2);
    }
    mf_buf_put(b, "\n", 1);
    for (int i = 0; i < indent; i++) mf_buf_put(b, " ", 1);
    mf_buf_put(b, "]", 1);
}

/* Where target i's sequences go in the dumped tree: a string no run name
 * holds (a control character), replaced by sequences_text afterwards. */
#define SEQ_MARK "\001moeflip-sequences-"
#define SEQ_MARK_DUMPED "\"\\u0001moeflip-sequences-"

static json_t *target_json(mf_run *run, const char *label, mf_diff_acc *a, mf_diff_acc *first, mf_diff_acc *floor_acc,
                           const int *plan, int B, int index, json_t *warnings) {
    json_t *t = run_info(run, label);
    const int L = a->L, E = a->E;
    char who[600], who_p[700], who_f[700];
    snprintf(who, sizeof who, "target %d (%s)", index + 1, label);
    snprintf(who_p, sizeof who_p, "%s against the first target", who);
    snprintf(who_f, sizeof who_f, "%s over the noise floor", who);
    json_object_set_new(t, "metrics", metrics_json(a, NULL, plan, B, warnings, who));
    if (first && first != a) {
        json_t *p = json_object();
        json_object_set_new(p, "difference", metrics_json(a, first, plan, B, warnings, who_p));
        json_object_set_new(p, "crova", crova_paired(first, a, plan, B, warnings, who_p));
        json_object_set_new(t, "paired_vs_first_target", p);
    }
    json_t *layers = json_array(), *experts = json_array();
    for (int l = 0; l < L; l++) {
        json_t *o = json_object();
        json_object_set_new(o, "layer", json_integer(a->layers[l]));
        int64_t slots = 0, se = 0, so = 0;
        for (size_t i = 0; i < a->n_cases; i++) {
            slots += a->cases[i].layer_slots[l];
            se += a->cases[i].layer_set_equal[l];
            so += a->cases[i].layer_ord_equal[l];
        }
        json_object_set_new(o, "slots", json_integer(slots));
        double ci[2];
        mctx cs = {a, NULL, 0, l, false}, co = {a, NULL, 0, l, true};
        ci_of(f_layer, &cs, plan, a->n_cases, B, ci);
        json_object_set_new(o, "set_equal_pct", value_ci(slots ? 100.0 * se / slots : NAN, ci));
        ci_of(f_layer, &co, plan, a->n_cases, B, ci);
        json_object_set_new(o, "ord_equal_pct", value_ci(slots ? 100.0 * so / slots : NAN, ci));
        json_object_set_new(o, "flips", json_integer(a->flips[l]));
        json_object_set_new(o, "primary", json_integer(a->primary[l]));
        json_object_set_new(o, "inherited", json_integer(a->inherited[l]));
        /* a grouped router's flips that moved experts between groups; null without groups */
        json_object_set_new(o, "flips_cross_group", a->n_group > 1 ? json_integer(a->cross_group[l]) : json_null());
        /* ties are the reference's margins: null where its capture has no scores */
        json_object_set_new(o, "ties", a->ref_lacks & MF_LACKS_ROUTER ? json_null() : json_integer(a->ties[l]));
        const int64_t *ms = a->margin_slots + (size_t)l * MF_MARGIN_BINS, *mfl = a->margin_flips + (size_t)l * MF_MARGIN_BINS;
        json_object_set_new(o, "sigma", num_or_null(fit_sigma(ms, mfl)));
        json_t *bins = json_array();
        for (int b = 0; b < MF_MARGIN_BINS; b++) {
            if (!ms[b]) continue;
            json_t *bo = json_object();
            json_object_set_new(bo, "margin_lo", json_real(b == 0 ? 0 : b >= MF_MARGIN_BINS - 1 ? 100 : pow(10, (b - 1) / 4.0 - 6)));
            json_object_set_new(bo, "margin_hi", b >= MF_MARGIN_BINS - 1 ? json_null() : json_real(b == 0 ? 0 : pow(10, b / 4.0 - 6)));
            json_object_set_new(bo, "slots", json_integer(ms[b]));
            json_object_set_new(bo, "flips", json_integer(mfl[b]));
            json_array_append_new(bins, bo);
        }
        json_object_set_new(o, "margin_bins", bins);
        json_array_append_new(layers, o);
        json_t *x = json_object(), *dr = json_array(), *ad = json_array();
        json_object_set_new(x, "layer", json_integer(a->layers[l]));
        for (int e = 0; e < E; e++) {
            json_array_append_new(dr, json_integer(a->dropped[(size_t)l * E + e]));
            json_array_append_new(ad, json_integer(a->added[(size_t)l * E + e]));
        }
        json_object_set_new(x, "dropped", dr);
        json_object_set_new(x, "added", ad);
        json_array_append_new(experts, x);
    }
    json_object_set_new(t, "layers", layers);
    json_object_set_new(t, "experts", experts);
    json_t *fl = json_object(), *tr = json_array();
    int64_t flips = 0, prim = 0, inh = 0, ties = 0;
    for (int l = 0; l < L; l++) {
        flips += a->flips[l];
        prim += a->primary[l];
        inh += a->inherited[l];
        ties += a->ties[l];
    }
    json_object_set_new(fl, "flipped_slots", json_integer(flips));
    json_object_set_new(fl, "primary", json_integer(prim));
    json_object_set_new(fl, "inherited", json_integer(inh));
    json_object_set_new(fl, "tie_slots", json_integer(ties));
    for (int i = 0; i < E; i++)
        for (int j = 0; j < E; j++) {
            int64_t n = a->transitions[(size_t)i * E + j];
            if (!n) continue;
            json_t *o = json_object();
            json_object_set_new(o, "dropped", json_integer(i));
            json_object_set_new(o, "added", json_integer(j));
            json_object_set_new(o, "count", json_integer(n));
            json_array_append_new(tr, o);
        }
    json_object_set_new(fl, "transitions", tr);
    json_object_set_new(fl, "spearman_flipped_slots_vs_kl", num_or_null(spearman(a)));
    json_object_set_new(t, "flips", fl);
    if (floor_acc && floor_acc != a)
        json_object_set_new(t, "floor", json_pack("{s:o}", "excess", metrics_json(a, floor_acc, plan, B, warnings, who_f)));
    json_t *resp = diff_responses_json(a, plan, B);
    if (resp) json_object_set_new(t, "responses", resp);
    json_t *answers = diff_answers_json(a, plan, B);
    if (answers) json_object_set_new(t, "answers", answers);
    json_object_set_new(t, "sequences", json_sprintf(SEQ_MARK "%d", index));
    return t;
}

int mf_diff_write_json(const char *path, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n_targets,
                       mf_diff_acc *floor_acc, mf_run *floor_run, const mf_diff_opts *o, mf_error *err) {
    return diff_write_json(path, ref, targets, accs, n_targets, floor_acc, floor_run, o, NULL, err);
}

int diff_write_json(const char *path, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n_targets,
                    mf_diff_acc *floor_acc, mf_run *floor_run, const mf_diff_opts *o, const diff_labels *labels,
                    mf_error *err) {
    for (int i = 0; i < n_targets; i++) sort_cases(accs[i]);
    if (floor_acc) sort_cases(floor_acc);
    const size_t n = n_targets ? accs[0]->n_cases : 0;
    int *plan = o->bootstrap > 0 && n ? bootstrap_plan(n, o->bootstrap, o->seed) : NULL;
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string("moeflip-diff"));
    json_object_set_new(root, "format_version", json_integer(1));
    json_object_set_new(root, "tool", json_string("moeflip " MF_VERSION));
    json_object_set_new(root, "reference", run_info(ref, label_or_dir(labels ? labels->reference : NULL, ref)));
    json_object_set_new(root, "bootstrap", json_pack("{s:i,s:I,s:s,s:s}", "resamples", o->bootstrap, "seed",
                                                     (json_int_t)o->seed, "unit", "sequence",
                                                     "interval", "percentile 2.5 / 97.5, linear interpolation"));
    json_object_set_new(root, "sequences", json_integer((json_int_t)n));
    /* token texts for the figures, when the reference's model has a tokenizer */
    mf_tokenizer *tk = NULL;
    json_t *man = json_loads(ref->manifest_text, 0, NULL);
    const char *mdir = json_string_value(json_object_get(json_object_get(man, "model"), "dir"));
    char tpath[4200];
    if (o->model_tokenizer && mdir && mf_path_join(tpath, sizeof tpath, mdir, "tokenizer.json") && mf_path_exists(tpath))
        mf_tokenizer_load(&tk, tpath, NULL);
    json_decref(man);
    json_t *ts = json_array(), *warnings = json_array();
    for (int i = 0; i < n_targets; i++)
        json_array_append_new(ts, target_json(targets[i], target_label(labels, i, targets[i]), accs[i], accs[0], floor_acc, plan,
                                              o->bootstrap, i, warnings));
    if (tk)
        for (int i = 0; i < n_targets; i++) diff_texts_add(json_array_get(ts, (size_t)i), ref, targets[i], tk);
    json_object_set_new(root, "targets", ts);
    json_t *attribution = diff_attribution_json(ref, targets, accs, n_targets, plan, o->bootstrap, labels);
    if (attribution) json_object_set_new(root, "attribution", attribution);
    if (floor_acc) {
        const char *floor_label = label_or_dir(labels ? labels->floor : NULL, floor_run);
        json_t *f = run_info(floor_run, floor_label);
        char who[600];
        snprintf(who, sizeof who, "the noise floor (%s)", floor_label);
        json_object_set_new(f, "metrics", metrics_json(floor_acc, NULL, plan, o->bootstrap, warnings, who));
        json_object_set_new(root, "floor", f);
    }
    /* every metric is a number or null: the nulls of metrics that are defined are listed here (and logged) */
    if (json_array_size(warnings)) {
        size_t i;
        json_t *w;
        json_array_foreach(warnings, i, w) mf_log("moeflip diff: warning: %s", json_string_value(w));
        json_object_set_new(root, "warnings", warnings);
    } else {
        json_decref(warnings);
    }
    free(plan);
    if (!path) {   /* a rank of a shared diff that computed its draws: rank 0 writes the file */
        json_decref(root);
        mf_tokenizer_free(tk);
        return MF_OK;
    }
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    /* each target's marker string becomes its sequences, written by hand */
    mf_buf out = {0};
    size_t need = strlen(text);   /* one allocation: no copying as the text grows */
    for (int i = 0; i < n_targets; i++)
        need += accs[i]->n_pos * (tk ? 48 : 16) + accs[i]->n_flips * 24 + accs[i]->n_cases * 128;
    mf_buf_reserve(&out, need);
    const char *from = text;
    for (const char *m; (m = strstr(from, SEQ_MARK_DUMPED));) {
        mf_buf_put(&out, from, (size_t)(m - from));
        const char *q = m + strlen(SEQ_MARK_DUMPED);
        const int i = atoi(q);
        const char *line = m;   /* the key's line: its indent is the array's depth */
        while (line > text && line[-1] != '\n') line--;
        int indent = 0;
        while (line[indent] == ' ') indent++;
        sequences_text(&out, accs[i], tk, indent);
        from = strchr(q, '"') + 1;
    }
    mf_buf_puts(&out, from);
    free(text);
    mf_tokenizer_free(tk);
    int rc = mf_write_file_atomic(path, out.s, out.n, err);
    free(out.s);
    return rc;
}

void mf_diff_print_summary(FILE *out, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n_targets,
                           const mf_diff_opts *o) {
    (void)o;
    diff_print_summary(out, ref, targets, accs, n_targets, NULL);
}

static const char *ties_text(int64_t v, char *buf) {
    snprintf(buf, 24, "%lld", (long long)v);
    return buf;
}

void diff_print_summary(FILE *out, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n_targets,
                        const diff_labels *labels) {
    char tbuf[24];
    json_t *rm = json_loads(ref->manifest_text, 0, NULL);
    fprintf(out, "reference  %s: %s x %s (%s, record %s)\n", label_or_dir(labels ? labels->reference : NULL, ref), json_string_value(json_object_get(rm, "numerics")) ?: "?",
            ref->precision, ref->arch, ref->record);
    json_decref(rm);
    for (int i = 0; i < n_targets; i++) {
        mf_diff_acc *a = accs[i];
        sort_cases(a);
        json_t *man = json_loads(targets[i]->manifest_text, 0, NULL);
        fprintf(out, "\ntarget %d   %s: %s x %s, %zu sequences\n", i + 1, target_label(labels, i, targets[i]),
                json_string_value(json_object_get(man, "numerics")) ?: "?", targets[i]->precision, a->n_cases);
        json_decref(man);
        static const int show[] = {M_FORWARD_KL, M_TOP1, M_RAW_LOGIT_MSE, M_ROUTER_SET, M_ROUTER_POS_ALL, M_FLIPPED,
                                   M_PRIMARY, M_KL_0, M_KL_1, M_KL_2};
        int not_numbers = 0;
        for (size_t s = 0; s < sizeof show / sizeof show[0]; s++) {
            char lack[256];
            if (metric_lacking(a, show[s], lack, sizeof lack)) {
                fprintf(out, "  %-40s null (%s)\n", metrics[show[s]].name, lack);
                continue;
            }
            if (!defined(a, show[s])) continue;   /* undefined for these runs */
            double v = pooled(a, show[s], NULL, a->n_cases);
            if (isfinite(v)) fprintf(out, "  %-40s %.6g\n", metrics[show[s]].name, v);
            else {
                fprintf(out, "  %-40s null (not a number)\n", metrics[show[s]].name);
                not_numbers++;
            }
        }
        if (not_numbers)
            fprintf(out, "  warning: %d metric%s above %s not a number%s (diff.json's \"warnings\" say which sequences)\n",
                    not_numbers, not_numbers > 1 ? "s" : "", not_numbers > 1 ? "are" : "is", not_numbers > 1 ? "s" : "");
        diff_responses_summary(out, a);
        diff_answers_summary(out, a);
        if (a->L) {
            fprintf(out, "  %-8s %8s %8s %8s %10s\n", "layer", "flips", "primary", "ties", "sigma");
            for (int l = 0; l < a->L; l++)
                fprintf(out, "  %-8d %8lld %8lld %8s %10.3g\n", a->layers[l], (long long)a->flips[l],
                        (long long)a->primary[l], a->ref_lacks & MF_LACKS_ROUTER ? "null" : ties_text(a->ties[l], tbuf),
                        fit_sigma(a->margin_slots + (size_t)l * MF_MARGIN_BINS, a->margin_flips + (size_t)l * MF_MARGIN_BINS));
        }
    }
}

int mf_diff_write_positions(const char *path, mf_diff_acc **accs, int n_targets, mf_error *err) {
    mf_atomic_file af;
    int rc = mf_atomic_open(&af, path, err);
    if (rc) return rc;
    /* a diff of generated runs says which positions' tokens were generated */
    bool generated = false;
    for (int i = 0; i < n_targets; i++) generated |= accs[i]->generated;
    fputs(generated ? "target,seq,pos,token,first_flip_layer,flipped_slots,kl,sq_err,top1,generated\n"
                    : "target,seq,pos,token,first_flip_layer,flipped_slots,kl,sq_err,top1\n", af.fp);
    for (int i = 0; i < n_targets; i++) {
        mf_diff_acc *a = accs[i];
        sort_cases(a);
        for (size_t k = 0, ci = 0; ci < a->n_cases; ci++, k = 0)
            for (; k < (size_t)a->cases[ci].pos_count; k++) {
            const mf_position *p = &a->pos[a->cases[ci].pos_first + k];
            fprintf(af.fp, "%d,%s,%d,%d,%d,%d,", i + 1, p->seq, p->pos, p->token, p->first_flip_layer, p->flipped_slots);
            if (isnan(p->kl)) fputs(",,", af.fp);
            else fprintf(af.fp, "%.17g,%.17g,", p->kl, p->sq_err);
            if (p->top1 >= 0) fprintf(af.fp, "%d", p->top1);
            if (generated) fputs(p->generated ? ",true" : ",false", af.fp);
            fputc('\n', af.fp);
        }
    }
    return mf_atomic_commit(&af, err);
}

static int cmp_slot(const void *a, const void *b) {
    const mf_slot *x = a, *y = b;
    int c = strcmp(x->seq, y->seq);
    if (c) return c;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static void put_list(FILE *f, const uint16_t *v, int n) {
    for (int i = 0; i < n; i++) fprintf(f, i ? ";%u" : "%u", v[i]);
}

int mf_diff_write_slots(const char *path, mf_diff_acc **accs, int n_targets, mf_error *err) {
    mf_atomic_file af;
    int rc = mf_atomic_open(&af, path, err);
    if (rc) return rc;
    fputs("target,seq,layer,pos,set_equal,order_equal,overlap,dropped,added,margin_logit,margin_prob,tie,"
          "gate_weight_sq_err,shared_gate_sq_err,cross_group\n", af.fp);
    for (int i = 0; i < n_targets; i++) {
        mf_diff_acc *a = accs[i];
        if (a->n_slots) qsort(a->slots, a->n_slots, sizeof *a->slots, cmp_slot);
        for (size_t k = 0; k < a->n_slots; k++) {
            const mf_slot *s = &a->slots[k];
            fprintf(af.fp, "%d,%s,%d,%d,%d,%d,%d,", i + 1, s->seq, s->layer, s->pos, s->set_equal, s->order_equal,
                    s->overlap);
            put_list(af.fp, s->dropped, s->n_dropped);
            fputc(',', af.fp);
            put_list(af.fp, s->added, s->n_added);
            fprintf(af.fp, ",%.17g,%.17g,%d,", s->margin_logit, s->margin_prob, s->tie);
            if (!isnan(s->gate_sq_err)) fprintf(af.fp, "%.17g", s->gate_sq_err);
            fputc(',', af.fp);
            if (!isnan(s->shared_sq_err)) fprintf(af.fp, "%.17g", s->shared_sq_err);
            fputc(',', af.fp);
            if (s->cross_group >= 0) fprintf(af.fp, "%d", s->cross_group);
            fputc('\n', af.fp);
        }
    }
    return mf_atomic_commit(&af, err);
}
