/* Routing replay's attribution: how much of a target's output error the
 * expert flips cause. A target's replayed twin is a target of the same diff
 * with the target's numerics, precision and device kind whose manifest says it
 * replayed the reference's routing (trace --replay: "replay" with the digest
 * of the reference's manifest). The twin routed as the reference did, so its
 * error is the arithmetic's alone; what the target has beyond it the flips
 * cause:
 *   X_from_flips_pct = 100 x (X(ref, target) - X(ref, twin)) / X(ref, target)
 * for X in forward_kl, raw_logit_mse, prob_mse and the top-1 disagreement
 * (100 - top1_pct), pooled as the diff pools them, over the positions both
 * compare (all of them, but where runs generated their own responses: up to
 * the first divergence of either), with bootstrap intervals over the diff's
 * own resamples. Twins that replay the layers up to l, one per l, make the
 * cumulative curve. docs/diff.md has the definitions and the schema. */
#include "diff_int.h"
#include "mf_router.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What a run's manifest says of its replay, and its configuration. */
typedef struct replay_of {
    bool replayed;
    char digest[40];
    char weights[16];
    bool all_layers;
    int n_layers, *layers;   /* model layer indices replayed */
    char key[400];           /* "numerics|precision|device kind" */
} replay_of;

static void replay_read(const mf_run *r, replay_of *o) {
    memset(o, 0, sizeof *o);
    json_t *m = json_loads(r->manifest_text, 0, NULL);
    snprintf(o->key, sizeof o->key, "%s|%s|%s", json_string_value(json_object_get(m, "numerics")) ?: "",
             json_string_value(json_object_get(json_object_get(m, "precision"), "name")) ?: "",
             json_string_value(json_object_get(json_object_get(m, "device"), "kind")) ?: "");
    json_t *rp = json_object_get(m, "replay");
    const char *d = json_string_value(json_object_get(rp, "source_manifest_digest"));
    json_t *ls = json_object_get(rp, "layers");
    /* a manifest is whoever wrote it's: only a well-formed replay object makes a twin */
    if (json_is_object(rp) && d && strlen(d) == 32 && json_is_array(ls) && json_array_size(ls) <= (size_t)r->n_moe) {
        o->layers = mf_xcalloc(json_array_size(ls) + 1, sizeof *o->layers);
        bool ok = true;
        for (size_t i = 0; i < json_array_size(ls) && ok; i++) {
            json_t *v = json_array_get(ls, i);
            ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < r->n_layers;
            if (ok) o->layers[o->n_layers++] = (int)json_integer_value(v);
        }
        if (ok && o->n_layers) {
            o->replayed = true;
            snprintf(o->digest, sizeof o->digest, "%s", d);
            snprintf(o->weights, sizeof o->weights, "%s", json_string_value(json_object_get(rp, "weights")) ?: "router");
            o->all_layers = o->n_layers == r->n_moe;
        }
    }
    json_decref(m);
}

static bool replays_layer(const replay_of *o, int layer) {
    for (int i = 0; i < o->n_layers; i++)
        if (o->layers[i] == layer) return true;
    return false;
}

/* The layer its replay runs through when it replays the first MoE layers up to one (a point of the cumulative
 * curve), else -1. */
static int prefix_through(const replay_of *o, const mf_run *r) {
    for (int l = 0; l < r->n_moe; l++) {
        const bool in = replays_layer(o, r->moe_layers[l]);
        if (!in) {
            for (int m = l + 1; m < r->n_moe; m++)
                if (replays_layer(o, r->moe_layers[m])) return -1;
            return l ? r->moe_layers[l - 1] : -1;
        }
    }
    return r->moe_layers[r->n_moe - 1];
}

/* ---- the sums of one (target, twin) pair, per case ------------------------------ */

enum { A_KL, A_RAW, A_PROB, A_TOP1, A_COUNT };
static const struct {
    const char *error, *share, *label;
    double scale;
    bool per_logit;   /* over positions x vocabulary */
} attr_metrics[A_COUNT] = {
    {"forward_kl", "kl_from_flips_pct", "KL", 1, false},
    {"raw_logit_mse", "raw_logit_mse_from_flips_pct", "raw logit MSE", 1, true},
    {"prob_mse", "prob_mse_from_flips_pct", "prob MSE", 1, true},
    {"top1_disagreement_pct", "top1_disagreement_from_flips_pct", "top-1 disagreement", 100, false},
};

typedef struct pair_case {
    double positions;
    double target[A_COUNT], twin[A_COUNT];   /* numerators */
} pair_case;

typedef struct pair {
    pair_case *cases;
    size_t n;
    double V;
    bool logits;       /* every case of both runs has full logits */
    int64_t common;    /* positions compared in both */
} pair;

static const mf_case *case_by_id(const mf_diff_acc *a, size_t hint, const char *id) {
    if (hint < a->n_cases && !strcmp(a->cases[hint].id, id)) return &a->cases[hint];
    for (size_t i = 0; i < a->n_cases; i++)
        if (!strcmp(a->cases[i].id, id)) return &a->cases[i];
    return NULL;
}

/* Each case's sums over the positions both runs compare, added in position order (over every position they are
 * the diff's own sums, bit for bit). */
static void pair_build(pair *p, const mf_diff_acc *t, const mf_diff_acc *w) {
    memset(p, 0, sizeof *p);
    p->n = t->n_cases;
    p->V = (double)t->V;
    p->cases = mf_xcalloc(p->n + 1, sizeof *p->cases);
    p->logits = p->n > 0;
    for (size_t c = 0; c < p->n; c++) {
        const mf_case *ct = &t->cases[c], *cw = case_by_id(w, c, ct->id);
        if (!cw) {
            p->logits = false;
            continue;
        }
        p->logits &= ct->has_logits && cw->has_logits;
        const int n = ct->pos_count < cw->pos_count ? ct->pos_count : cw->pos_count;
        pair_case *pc = &p->cases[c];
        pc->positions = n;
        p->common += n;
        for (int k = 0; k < n; k++) {
            const mf_position *a = &t->pos[ct->pos_first + (size_t)k], *b = &w->pos[cw->pos_first + (size_t)k];
            pc->target[A_KL] += a->kl;
            pc->twin[A_KL] += b->kl;
            pc->target[A_RAW] += a->sq_err;
            pc->twin[A_RAW] += b->sq_err;
            pc->target[A_PROB] += a->prob_sq_err;
            pc->twin[A_PROB] += b->prob_sq_err;
            pc->target[A_TOP1] += a->top1 == 0;
            pc->twin[A_TOP1] += b->top1 == 0;
        }
    }
}

/* What a draw computes: the target's error, the twin's, or the share of the target's that the flips cause. */
enum { W_TARGET, W_TWIN, W_SHARE };

typedef struct actx {
    const pair *p;
    int m, what;
} actx;

static double a_pooled(const void *ctx, const int *idx, size_t n) {
    const actx *c = ctx;
    const pair *p = c->p;
    double t = 0, w = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const pair_case *pc = &p->cases[idx ? (size_t)idx[i] : i];
        t += pc->target[c->m];
        w += pc->twin[c->m];
        den += pc->positions * (attr_metrics[c->m].per_logit ? p->V : 1);
    }
    if (!(den > 0)) return NAN;
    switch (c->what) {
    case W_TARGET: return attr_metrics[c->m].scale * t / den;
    case W_TWIN: return attr_metrics[c->m].scale * w / den;
    default: return t != 0 ? 100 * (t - w) / t : NAN;   /* both over the same positions: the denominators cancel */
    }
}

static json_t *a_value(const pair *p, int m, int what, const int *plan, int B) {
    actx c = {p, m, what};
    double ci[2] = {NAN, NAN};
    const double v = a_pooled(&c, NULL, p->n);
    if (isfinite(v)) diff_ci(a_pooled, &c, plan, p->n, B, ci);
    return diff_value_ci(v, ci);
}

/* Of the twin's slots at the layers it replayed (over the positions it compared): those whose dispatched expert
 * set differs from the reference's (none, when the replay did what it says), and those where its own router's
 * choice (the canonical top-k of its recorded router logits) differs from what it dispatched, which is where
 * its router would have flipped. */
static void twin_slots(const mf_diff_acc *w, const replay_of *ro, mf_run *run, double *flipped_pct, double *disagree_pct) {
    int64_t slots = 0, differ = 0, own = 0, own_slots = 0;
    const int K = w->K, E = w->E;
    double *row = mf_xmalloc(sizeof(double) * ((size_t)E + 1));
    uint16_t *mine = mf_xmalloc(sizeof(uint16_t) * ((size_t)K + 1)), *sent = mf_xmalloc(sizeof(uint16_t) * ((size_t)K + 1));
    for (size_t c = 0; c < w->n_cases; c++) {
        const mf_case *cw = &w->cases[c];
        size_t s = 0;
        while (s < run->n_seqs && strcmp(run->seqs[s].id, cw->id)) s++;
        const mf_st_tensor *router = NULL, *ids = NULL;
        mf_error e = {0};
        if (s == run->n_seqs || mf_run_tensor(run, s, "router", &router, &e) || mf_run_tensor(run, s, "topk_ids", &ids, &e) ||
            !router || !ids)
            continue;
        const size_t len = (size_t)run->seqs[s].length;
        for (int l = 0; l < w->L; l++) {
            if (!replays_layer(ro, w->layers[l])) continue;
            slots += cw->layer_slots[l];
            differ += cw->layer_slots[l] - cw->layer_set_equal[l];
            for (int t = 0; t < cw->pos_count; t++) {
                const size_t at = (size_t)l * len + (size_t)t;
                for (int e2 = 0; e2 < E; e2++) row[e2] = mf_load_as_f64(router->data, router->dtype, at * (size_t)E + (size_t)e2);
                memcpy(sent, ids->data + 2 * at * (size_t)K, sizeof(uint16_t) * (size_t)K);
                mf_topk(row, E, K, mine);
                int shared = 0;
                for (int i = 0; i < K; i++)
                    for (int j = 0; j < K; j++) shared += mine[i] == sent[j];
                own += shared != K;
                own_slots++;
            }
        }
    }
    free(row);
    free(mine);
    free(sent);
    *flipped_pct = slots ? 100.0 * (double)differ / (double)slots : NAN;
    *disagree_pct = own_slots ? 100.0 * (double)own / (double)own_slots : NAN;
}

static const char *label_of(const diff_labels *l, int i, const mf_run *r) {
    return l && l->targets && l->targets[i] ? l->targets[i] : r->dir;
}

static json_t *num_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* One twin's entry. */
static json_t *twin_json(mf_run **targets, mf_diff_acc **accs, int i, int j, const replay_of *ro, const int *plan, int B,
                         const diff_labels *labels) {
    json_t *o = json_object(), *ls = json_array();
    json_object_set_new(o, "twin", json_integer(j + 1));
    json_object_set_new(o, "run", json_string(label_of(labels, j, targets[j])));
    for (int l = 0; l < ro->n_layers; l++) json_array_append_new(ls, json_integer(ro->layers[l]));
    json_object_set_new(o, "layers", ls);
    json_object_set_new(o, "all_layers", json_boolean(ro->all_layers));
    const int through = prefix_through(ro, targets[j]);
    json_object_set_new(o, "through_layer", through >= 0 ? json_integer(through) : json_null());
    json_object_set_new(o, "weights", json_string(ro->weights));
    pair p;
    pair_build(&p, accs[i], accs[j]);
    json_object_set_new(o, "positions", json_integer(p.common));
    if (p.logits) {
        json_t *te = json_object(), *we = json_object();
        for (int m = 0; m < A_COUNT; m++) {
            json_object_set_new(te, attr_metrics[m].error, a_value(&p, m, W_TARGET, plan, B));
            json_object_set_new(we, attr_metrics[m].error, a_value(&p, m, W_TWIN, plan, B));
        }
        json_object_set_new(o, "target_error", te);
        json_object_set_new(o, "twin_error", we);
        for (int m = 0; m < A_COUNT; m++) json_object_set_new(o, attr_metrics[m].share, a_value(&p, m, W_SHARE, plan, B));
    }
    double flipped, disagree;
    twin_slots(accs[j], ro, targets[j], &flipped, &disagree);
    json_object_set_new(o, "twin_flipped_slots_pct", num_or_null(flipped));
    json_object_set_new(o, "twin_router_disagrees_pct", num_or_null(disagree));
    free(p.cases);
    return o;
}

/* The twins of target i among the targets: replays of the reference (ref_digest) in its configuration. */
static int twins_of(const replay_of *ro, int n, int i, const char *ref_digest, int *out) {
    int k = 0;
    if (ro[i].replayed) return 0;
    for (int j = 0; j < n; j++)
        if (j != i && ro[j].replayed && !strcmp(ro[j].digest, ref_digest) && !strcmp(ro[j].key, ro[i].key)) out[k++] = j;
    return k;
}

typedef struct curve_point {
    int through, twin;
} curve_point;

static int cmp_point(const void *a, const void *b) {
    const curve_point *x = a, *y = b;
    return x->through != y->through ? (x->through > y->through) - (x->through < y->through) : (x->twin > y->twin) - (x->twin < y->twin);
}

json_t *diff_attribution_json(mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n, const int *plan, int B,
                              const diff_labels *labels) {
    char ref_digest[33];
    mf_digest_buffer(ref->manifest_text, strlen(ref->manifest_text), ref_digest);
    replay_of *ro = mf_xcalloc((size_t)n + 1, sizeof *ro);
    for (int i = 0; i < n; i++) replay_read(targets[i], &ro[i]);
    int *tw = mf_xcalloc((size_t)n + 1, sizeof *tw);
    json_t *all = json_array();
    for (int i = 0; i < n; i++) {
        const int k = twins_of(ro, n, i, ref_digest, tw);
        if (!k) continue;
        json_t *e = json_object(), *list = json_array(), *curve = json_array();
        json_object_set_new(e, "target", json_integer(i + 1));
        json_object_set_new(e, "run", json_string(label_of(labels, i, targets[i])));
        json_t **entries = mf_xcalloc((size_t)k, sizeof *entries);
        int overall = -1;   /* the twin that replays every layer: with the router's weights if there is one */
        for (int q = 0; q < k; q++) {
            entries[q] = twin_json(targets, accs, i, tw[q], &ro[tw[q]], plan, B, labels);
            json_array_append(list, entries[q]);
            if (ro[tw[q]].all_layers && (overall < 0 || (strcmp(ro[tw[overall]].weights, "router") && !strcmp(ro[tw[q]].weights, "router"))))
                overall = q;
        }
        json_object_set_new(e, "twins", list);
        json_object_set_new(e, "overall", overall >= 0 ? json_integer(tw[overall] + 1) : json_null());
        /* the cumulative curve: the prefix twins with the overall twin's weights (the router's without one), in layer
         * order, one per layer */
        const char *weights = overall >= 0 ? ro[tw[overall]].weights : "router";
        curve_point *pts = mf_xcalloc((size_t)k, sizeof *pts);
        int np = 0;
        for (int q = 0; q < k; q++) {
            const int through = prefix_through(&ro[tw[q]], targets[tw[q]]);
            if (through >= 0 && !strcmp(ro[tw[q]].weights, weights)) pts[np++] = (curve_point){through, q};
        }
        qsort(pts, (size_t)np, sizeof *pts, cmp_point);
        for (int q = 0; q < np; q++) {
            if (q && pts[q].through == pts[q - 1].through) continue;   /* a second twin of the same layers adds nothing */
            json_t *pt = json_object(), *src = entries[pts[q].twin];
            json_object_set_new(pt, "through_layer", json_integer(pts[q].through));
            json_object_set(pt, "twin", json_object_get(src, "twin"));
            for (int m = 0; m < A_COUNT; m++)
                if (json_object_get(src, attr_metrics[m].share))
                    json_object_set(pt, attr_metrics[m].share, json_object_get(src, attr_metrics[m].share));
            json_array_append_new(curve, pt);
        }
        json_object_set_new(e, "curve", curve);
        for (int q = 0; q < k; q++) json_decref(entries[q]);
        free(entries);
        free(pts);
        json_array_append_new(all, e);
    }
    for (int i = 0; i < n; i++) free(ro[i].layers);
    free(ro);
    free(tw);
    if (!json_array_size(all)) {
        json_decref(all);
        return NULL;
    }
    return all;
}

void diff_attribution_summary(FILE *out, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n) {
    char ref_digest[33];
    mf_digest_buffer(ref->manifest_text, strlen(ref->manifest_text), ref_digest);
    replay_of *ro = mf_xcalloc((size_t)n + 1, sizeof *ro);
    for (int i = 0; i < n; i++) replay_read(targets[i], &ro[i]);
    int *tw = mf_xcalloc((size_t)n + 1, sizeof *tw);
    bool header = false;
    for (int i = 0; i < n; i++) {
        const int k = twins_of(ro, n, i, ref_digest, tw);
        for (int q = 0; q < k; q++) {
            const int j = tw[q];
            if (!header) fprintf(out, "\nrouting replay: the share of each target's output error that its expert flips cause "
                                 "(against its twin, which routed as the reference)\n");
            header = true;
            fprintf(out, "  target %d, twin %d (", i + 1, j + 1);
            if (ro[j].all_layers) fputs("every MoE layer", out);
            else
                for (int l = 0; l < ro[j].n_layers; l++)
                    fprintf(out, l ? ",%d" : ro[j].n_layers > 1 ? "layers %d" : "layer %d", ro[j].layers[l]);
            fprintf(out, " replayed%s):", strcmp(ro[j].weights, "source") ? "" : ", the reference's weights");
            pair p;
            pair_build(&p, accs[i], accs[j]);
            if (!p.logits) fprintf(out, " no full logits in both runs");
            for (int m = 0; m < A_COUNT && p.logits; m++) {
                actx c = {&p, m, W_SHARE};
                const double v = a_pooled(&c, NULL, p.n);
                if (isfinite(v)) fprintf(out, "  %s %.1f%%", attr_metrics[m].label, v);
                else fprintf(out, "  %s null", attr_metrics[m].label);
            }
            fputc('\n', out);
            free(p.cases);
        }
    }
    for (int i = 0; i < n; i++) free(ro[i].layers);
    free(ro);
    free(tw);
}
