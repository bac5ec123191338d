/* Accumulating a diff: alignment, per-sequence sums, per-slot flips. */
#include "diff_int.h"
#include "mf_router.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void mf_diff_acc_init(mf_diff_acc *a, const mf_run *ref) {
    memset(a, 0, sizeof *a);
    const int L = ref->n_moe, E = ref->n_experts;
    a->L = L;
    a->E = E;
    a->K = ref->top_k;
    a->V = ref->vocab;
    a->layers = mf_xcalloc((size_t)L + 1, sizeof(int));
    memcpy(a->layers, ref->moe_layers, (size_t)L * sizeof(int));
    a->flips = mf_xcalloc((size_t)L + 1, sizeof(int64_t));
    a->primary = mf_xcalloc((size_t)L + 1, sizeof(int64_t));
    a->inherited = mf_xcalloc((size_t)L + 1, sizeof(int64_t));
    a->ties = mf_xcalloc((size_t)L + 1, sizeof(int64_t));
    a->n_group = ref->n_group > 1 ? ref->n_group : 1;
    a->cross_group = mf_xcalloc((size_t)L + 1, sizeof(int64_t));
    a->margin_slots = mf_xcalloc((size_t)L * MF_MARGIN_BINS + 1, sizeof(int64_t));
    a->margin_flips = mf_xcalloc((size_t)L * MF_MARGIN_BINS + 1, sizeof(int64_t));
    a->dropped = mf_xcalloc((size_t)L * E + 1, sizeof(int64_t));
    a->added = mf_xcalloc((size_t)L * E + 1, sizeof(int64_t));
    a->transitions = mf_xcalloc((size_t)E * E + 1, sizeof(int64_t));
}

static void case_free(mf_case *c) {
    free(c->id);
    free(c->layer_slots);
    free(c->layer_set_equal);
    free(c->layer_ord_equal);
}

void mf_diff_acc_free(mf_diff_acc *a) {
    for (size_t i = 0; i < a->n_cases; i++) case_free(&a->cases[i]);
    free(a->cases);
    free(a->pos);
    free(a->layers);
    free(a->flips);
    free(a->primary);
    free(a->inherited);
    free(a->ties);
    free(a->cross_group);
    free(a->margin_slots);
    free(a->margin_flips);
    free(a->dropped);
    free(a->added);
    free(a->transitions);
    free(a->slots);
    free(a->flip_list);
    memset(a, 0, sizeof *a);
}

static mf_case *new_case(mf_diff_acc *a, const char *id) {
    if (a->n_cases == a->cap_cases) {
        a->cap_cases = a->cap_cases ? 2 * a->cap_cases : 16;
        a->cases = mf_xrealloc(a->cases, a->cap_cases * sizeof *a->cases);
    }
    mf_case *c = &a->cases[a->n_cases++];
    memset(c, 0, sizeof *c);
    c->id = mf_xstrdup(id);
    c->equal_bits = -1;
    c->layer_slots = mf_xcalloc((size_t)a->L + 1, sizeof(int64_t));
    c->layer_set_equal = mf_xcalloc((size_t)a->L + 1, sizeof(int64_t));
    c->layer_ord_equal = mf_xcalloc((size_t)a->L + 1, sizeof(int64_t));
    return c;
}

static mf_position *new_pos(mf_diff_acc *a) {
    if (a->n_pos == a->cap_pos) {
        a->cap_pos = a->cap_pos ? 2 * a->cap_pos : 256;
        a->pos = mf_xrealloc(a->pos, a->cap_pos * sizeof *a->pos);
    }
    mf_position *p = &a->pos[a->n_pos++];
    memset(p, 0, sizeof *p);
    return p;
}

/* ---- alignment ------------------------------------------------------------ */

/* The run's manifest's "model" object (parsed once per call; caller decrefs the root). */
static json_t *manifest_model(const mf_run *r, json_t **root) {
    *root = json_loads(r->manifest_text, 0, NULL);
    return json_object_get(*root, "model");
}

static int find_seq(mf_run *r, const char *id) {
    for (size_t i = 0; i < r->n_seqs; i++)
        if (!strcmp(r->seqs[i].id, id)) return (int)i;
    return -1;
}

/* Both runs generated their responses themselves: their tokens may part after the prompt. */
static bool own_responses(const mf_run *ref, const mf_run *tgt) {
    return ref->max_new_tokens > 0 && tgt->max_new_tokens > 0 && !ref->forced && !tgt->forced;
}

int mf_diff_align(mf_run *ref, mf_run *tgt, mf_error *err) { return mf_diff_align_named(ref, ref->dir, tgt, tgt->dir, err); }

int mf_diff_align_named(mf_run *ref, const char *ref_name, mf_run *tgt, const char *tgt_name, mf_error *err) {
    static const char *keys[] = {"architecture", "config_digest", "weights_digest"};
    json_t *ra, *rb, *ma = manifest_model(ref, &ra), *mb = manifest_model(tgt, &rb);
    for (int k = 0; k < 3; k++) {
        const char *a = json_string_value(json_object_get(ma, keys[k])), *b = json_string_value(json_object_get(mb, keys[k]));
        a = a ? a : "";
        b = b ? b : "";
        if (strcmp(a, b) != 0) {
            mf_fail(err, MF_EMISMATCH, "%s and %s are runs of different models (%s %s vs %s)", ref_name, tgt_name,
                    keys[k], a, b);
            json_decref(ra);
            json_decref(rb);
            return MF_EMISMATCH;
        }
    }
    json_decref(ra);
    json_decref(rb);
    /* The digests name the model, but it is the shapes the comparison indexes by: a target whose manifest gives
     * the same digests and other shapes (made by hand, or by a writer that lies) is refused here, before any
     * tensor of it is read against the reference's shapes. */
    const struct { const char *what; long long a, b; } facts[] = {
        {"layers", ref->n_layers, tgt->n_layers},   {"MoE layers", ref->n_moe, tgt->n_moe},
        {"experts", ref->n_experts, tgt->n_experts}, {"top-k", ref->top_k, tgt->top_k},
        {"vocabulary", ref->vocab, tgt->vocab},     {"hidden size", ref->hidden, tgt->hidden},
        {"shared experts", ref->has_shared, tgt->has_shared},
    };
    for (size_t k = 0; k < sizeof facts / sizeof facts[0]; k++)
        if (facts[k].a != facts[k].b)
            return mf_fail(err, MF_EMISMATCH, "%s and %s name the same model but disagree on its shape: %s %lld vs %lld", ref_name,
                           tgt_name, facts[k].what, facts[k].a, facts[k].b);
    for (int l = 0; l < ref->n_moe; l++)
        if (ref->moe_layers[l] != tgt->moe_layers[l])
            return mf_fail(err, MF_EMISMATCH, "%s and %s name the same model but disagree on its shape: MoE layer %d is layer %d vs %d",
                           ref_name, tgt_name, l, ref->moe_layers[l], tgt->moe_layers[l]);
    for (size_t i = 0; i < ref->n_seqs; i++) {
        const char *id = ref->seqs[i].id;
        int j = find_seq(tgt, id);
        if (j < 0) return mf_fail(err, MF_EMISMATCH, "sequence %s is in %s but not in %s", id, ref_name, tgt_name);
        const mf_st_tensor *ta, *tb;
        int rc;
        if ((rc = mf_run_tensor(ref, i, "tokens", &ta, err)) || (rc = mf_run_tensor(tgt, (size_t)j, "tokens", &tb, err)))
            return rc;
        if (!ta || !tb) return mf_fail(err, MF_EFORMAT, "sequence %s: no tokens", id);
        int64_t na = mf_st_numel(ta), nb = mf_st_numel(tb);
        if (own_responses(ref, tgt)) {
            /* the prompts must agree; what each run generated after them is what is compared */
            const int pa = ref->seqs[i].length - ref->seqs[i].generated, pb = tgt->seqs[j].length - tgt->seqs[j].generated;
            if (pa != pb)
                return mf_fail(err, MF_EMISMATCH, "sequence %s: a %d-token prompt in %s, %d in %s", id, pa, ref_name, pb,
                               tgt_name);
            na = nb = pa;
        }
        for (int64_t t = 0; t < na && t < nb; t++) {
            int32_t x, y;
            memcpy(&x, ta->data + 4 * t, 4);
            memcpy(&y, tb->data + 4 * t, 4);
            if (x != y)
                return mf_fail(err, MF_EMISMATCH, "sequence %s, position %lld: token %d in %s, %d in %s", id,
                               (long long)t, x, ref_name, y, tgt_name);
        }
        if (na != nb)
            return mf_fail(err, MF_EMISMATCH, "sequence %s: %lld tokens in %s, %lld in %s", id, (long long)na, ref_name,
                           (long long)nb, tgt_name);
    }
    for (size_t j = 0; j < tgt->n_seqs; j++)
        if (find_seq(ref, tgt->seqs[j].id) < 0)
            return mf_fail(err, MF_EMISMATCH, "sequence %s is in %s but not in %s", tgt->seqs[j].id, tgt_name, ref_name);
    return MF_OK;
}

/* ---- per sequence ----------------------------------------------------------- */

/* Bin b (1..32) holds margins in [10^((b-1)/4 - 6), 10^(b/4 - 6)); bin 0 ties
 * (and anything not positive); bin 33 everything from 100 up. */
#define EDGE_EXP_MIN (-32)   /* binary exponents of margins looked up in edges_below */
#define EDGE_EXP_MAX 16
static double bin_edges[MF_MARGIN_BINS + 1];   /* 33 edges, then two NaNs: no margin is <= them */
static int edges_below[EDGE_EXP_MAX - EDGE_EXP_MIN + 1];   /* [e]: the number of edges below 2^e */

static void init_edges(void) {
    if (bin_edges[0] != 0) return;
    for (int b = 0; b < MF_MARGIN_BINS - 1; b++) bin_edges[b] = pow(10.0, b / 4.0 - 6.0);
    bin_edges[MF_MARGIN_BINS - 1] = bin_edges[MF_MARGIN_BINS] = NAN;
    for (int e = EDGE_EXP_MIN; e <= EDGE_EXP_MAX; e++) {
        int n = 0;
        while (n < MF_MARGIN_BINS - 1 && bin_edges[n] < ldexp(1.0, e)) n++;
        edges_below[e - EDGE_EXP_MIN] = n;
    }
}

/* The number of edges <= m (they are sorted): those below 2^e, where 2^e <=
 * m < 2^(e+1), from a table, then the two at most (edges are a factor 1.78
 * apart) from 2^e up to m. */
static int margin_bin(double m) {
    if (!(m > 0)) return 0;
    uint64_t u;
    memcpy(&u, &m, 8);
    int e = (int)((u >> 52) & 0x7ff) - 1023;   /* subnormals read as -1023: below the table */
    e = e < EDGE_EXP_MIN ? EDGE_EXP_MIN - 1 : e > EDGE_EXP_MAX ? EDGE_EXP_MAX : e;
    int lo = e < EDGE_EXP_MIN ? 0 : edges_below[e - EDGE_EXP_MIN];
    lo += bin_edges[lo] <= m;
    lo += bin_edges[lo] <= m;
    return lo < 1 ? 1 : lo;
}

/* Converts n values from element off; the compiler makes an AVX2 and a
 * baseline copy and the loader picks one for the CPU. */
__attribute__((target_clones("avx2", "default"))) static void load_row(const mf_st_tensor *t, size_t off, int n, double *out) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case MF_BF16:
        for (int i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * (off + (size_t)i), 2);
            out[i] = mf_bf16_to_f32(h);
        }
        break;
    case MF_F32:
        for (int i = 0; i < n; i++) {
            float f;
            memcpy(&f, p + 4 * (off + (size_t)i), 4);
            out[i] = f;
        }
        break;
    case MF_F64: memcpy(out, p + 8 * off, sizeof(double) * (size_t)n); break;
    default:
        for (int i = 0; i < n; i++) out[i] = mf_load_as_f64(p, t->dtype, off + (size_t)i);
    }
}

static double get(const mf_st_tensor *t, size_t i) { return mf_load_as_f64(t->data, t->dtype, i); }

/* The largest of v[0..n), NaN left out: the first of the largest in index
 * order, as a plain loop of `x > m ? x : m` would give. Four running maxima;
 * only +0 and -0 compare equal with different bits, so a zero result is
 * taken again in order. */
static double max_unchosen(const double *v, int n) {
    double m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;
    int e = 0;
    for (; e + 4 <= n; e += 4) {
        m0 = v[e] > m0 ? v[e] : m0;
        m1 = v[e + 1] > m1 ? v[e + 1] : m1;
        m2 = v[e + 2] > m2 ? v[e + 2] : m2;
        m3 = v[e + 3] > m3 ? v[e + 3] : m3;
    }
    for (; e < n; e++) m0 = v[e] > m0 ? v[e] : m0;
    m0 = m1 > m0 ? m1 : m0;
    m0 = m2 > m0 ? m2 : m0;
    m0 = m3 > m0 ? m3 : m0;
    if (m0 == 0) {
        m0 = -INFINITY;
        for (e = 0; e < n; e++) m0 = v[e] > m0 ? v[e] : m0;
    }
    return m0;
}

/* The reference's margin at each of n slots: k-th minus (k+1)-th score, the
 * lowest score it dispatched against the highest it did not (INFINITY, and
 * the k-th score NaN, when it dispatched every expert). rows: [n][E] scores;
 * ids: [n][K] as stored (u16). One pass over the slots, apart from the
 * accumulation, so consecutive slots overlap; K a constant where it is 2, 4
 * or 8. bin: the margin's bin. */
static inline __attribute__((always_inline)) void ref_margins_k(const double *rows, const uint8_t *ids, int n, int E,
                                                                const int K, double *margin, double *kth_out,
                                                                int *bin, double *unchosen) {
    for (int t = 0; t < n; t++) {
        if (K >= E) {
            margin[t] = INFINITY;
            kth_out[t] = NAN;
            continue;
        }
        const double *row = rows + (size_t)t * E;
        uint16_t A[K];
        memcpy(A, ids + 2 * (size_t)t * K, sizeof A);
        /* the chosen experts' scores masked out, then a plain maximum */
        for (int e = 0; e < E; e++) unchosen[e] = row[e];
        double kth = INFINITY;
        for (int i = 0; i < K; i++) {
            kth = row[A[i]] < kth ? row[A[i]] : kth;
            unchosen[A[i]] = -INFINITY;
        }
        const double mu = max_unchosen(unchosen, E);
        margin[t] = kth == mu ? 0 : kth - mu;   /* two masked (-inf) scores tie too */
        kth_out[t] = kth;
    }
    for (int t = 0; t < n; t++) bin[t] = margin_bin(margin[t]);
}

static void ref_margins(const double *rows, const uint8_t *ids, int n, int E, int K, double *margin, double *kth_out,
                        int *bin, double *unchosen) {
    switch (K) {
    case 2: ref_margins_k(rows, ids, n, E, 2, margin, kth_out, bin, unchosen); break;
    case 4: ref_margins_k(rows, ids, n, E, 4, margin, kth_out, bin, unchosen); break;
    case 8: ref_margins_k(rows, ids, n, E, 8, margin, kth_out, bin, unchosen); break;
    default: ref_margins_k(rows, ids, n, E, K, margin, kth_out, bin, unchosen);
    }
}

static uint16_t get_u16(const mf_st_tensor *t, size_t i) {
    uint16_t v;
    memcpy(&v, t->data + 2 * i, 2);
    return v;
}

typedef struct seq_view {
    const mf_st_tensor *tokens, *ids, *w, *router, *shared, *logits;
    const mf_st_tensor *select;   /* the scores the router's top-k ranked, where that is not the logits' order */
    size_t len;   /* the sequence's positions in its run: the stride of a layer's rows */
} seq_view;

static int view(mf_run *r, size_t s, seq_view *v, mf_error *err) {
    int rc;
    memset(v, 0, sizeof *v);
    if ((rc = mf_run_tensor(r, s, "tokens", &v->tokens, err)) || (rc = mf_run_tensor(r, s, "topk_ids", &v->ids, err)) ||
        (rc = mf_run_tensor(r, s, "topk_w", &v->w, err)) || (rc = mf_run_tensor(r, s, "router", &v->router, err)) ||
        (rc = mf_run_tensor(r, s, "shared_gate", &v->shared, err)) || (rc = mf_run_tensor(r, s, "logits", &v->logits, err)) ||
        (rc = mf_run_tensor(r, s, "select", &v->select, err)))
        return rc;
    v->len = (size_t)r->seqs[s].length;
    return MF_OK;
}

/* The n (<= 5) largest of v[0..V) in rank order, as mf_topk ranks (NaN first, then larger, equal values by lower
 * index), with int indices: mf_topk's are u16, and token ids of a vocabulary past 65,535 must not alias. */
static void top_tokens(const double *v, int V, int n, int32_t *ids) {
    int len = 0;
    for (int i = 0; i < V; i++) {
        int pos = len;
        while (pos > 0) {
            const double a = v[i], b = v[ids[pos - 1]];
            const bool before = isnan(a) != isnan(b) ? isnan(a) : a > b || (a == b && i < ids[pos - 1]);
            if (!before) break;
            pos--;
        }
        if (pos >= n) continue;
        for (int j = len < n ? len : n - 1; j > pos; j--) ids[j] = ids[j - 1];
        ids[pos] = i;
        if (len < n) len++;
    }
}

/* CroVA's logit statistics for one position (computed in double from the
 * stored values; CroVA sums fp32 blocks, which agrees to ~1e-7 relative). */
static void logit_stats(const mf_st_tensor *A, const mf_st_tensor *B, size_t off, int V, double *sq, double *psq,
                        double *kl, int *top1, int *ord5, int *set5, int64_t *eqbits) {
    double ma = -INFINITY, mb = -INFINITY, s = 0;
    int am = 0, bm = 0;
    double *a = mf_xmalloc(sizeof(double) * (size_t)V * 2), *b = a + V;
    for (int v = 0; v < V; v++) {
        a[v] = (float)get(A, off + (size_t)v);
        b[v] = (float)get(B, off + (size_t)v);
        if (a[v] > ma) { ma = a[v]; am = v; }
        if (b[v] > mb) { mb = b[v]; bm = v; }
        s += (b[v] - a[v]) * (b[v] - a[v]);
    }
    double za = 0, zb = 0;
    for (int v = 0; v < V; v++) {
        za += exp(a[v] - ma);
        zb += exp(b[v] - mb);
    }
    const double la = ma + log(za), lb = mb + log(zb);
    double ps = 0, k = 0;
    for (int v = 0; v < V; v++) {
        double lpa = a[v] - la, lpb = b[v] - lb, pa = exp(lpa), pb = exp(lpb);
        ps += (pb - pa) * (pb - pa);
        k += pa * (lpa - lpb);
    }
    int32_t ta[5], tb[5];
    int n5 = V < 5 ? V : 5;
    top_tokens(a, V, n5, ta);
    top_tokens(b, V, n5, tb);
    int ord = 1, set = 1;
    for (int i = 0; i < n5; i++) {
        ord &= ta[i] == tb[i];
        int found = 0;
        for (int j = 0; j < n5; j++) found |= ta[i] == tb[j];
        set &= found;
    }
    if (eqbits && A->dtype == MF_BF16 && B->dtype == MF_BF16)
        for (int v = 0; v < V; v++) *eqbits += get_u16(A, off + (size_t)v) == get_u16(B, off + (size_t)v);
    *sq = s;
    *psq = ps;
    *kl = k;
    *top1 = am == bm;
    *ord5 = ord;
    *set5 = set;
    free(a);
}

/* ---- one sequence, step by step ------------------------------------------------
 * add_sequence: the case, then each MoE layer (its rows loaded, every slot compared), then each position. The
 * sums are added to in one fixed order (layer by layer, slot by slot), so a diff has the same bits however its
 * steps are cut into functions. */

/* One sequence's rows of one MoE layer at a time, converted to double in one pass per tensor. */
typedef struct layer_rows {
    double *router_ref, *router_tgt;   /* [n][E] router scores */
    double *select_ref;                /* [n][E] the reference's selection scores (its `select`), when it has them */
    double *gate_ref, *gate_tgt;       /* [n][K] applied gate weights, when both runs have them */
    double *shared_ref, *shared_tgt;   /* [n] shared-expert gates, when both runs have them */
    double *router_sq;                 /* [n] each slot's squared router error, summed over the experts */
    double *margin, *kth;              /* [n] the reference's margin and k-th score */
    int *bin;                          /* [n] the margin's bin */
    double *unchosen;                  /* [E] ref_margins' scratch */
} layer_rows;

static void layer_rows_alloc(layer_rows *w, int n, int E, int K) {
    w->router_ref = mf_xmalloc(sizeof(double) * ((size_t)n * E + 1));
    w->router_tgt = mf_xmalloc(sizeof(double) * ((size_t)n * E + 1));
    w->select_ref = mf_xmalloc(sizeof(double) * ((size_t)n * E + 1));
    w->gate_ref = mf_xmalloc(sizeof(double) * ((size_t)n * K + 1));
    w->gate_tgt = mf_xmalloc(sizeof(double) * ((size_t)n * K + 1));
    w->shared_ref = mf_xmalloc(sizeof(double) * ((size_t)n + 1));
    w->shared_tgt = mf_xmalloc(sizeof(double) * ((size_t)n + 1));
    w->router_sq = mf_xmalloc(sizeof(double) * ((size_t)n + 1));
    w->unchosen = mf_xmalloc(sizeof(double) * ((size_t)E + 1));
    w->margin = mf_xmalloc(sizeof(double) * ((size_t)n + 1));
    w->kth = mf_xmalloc(sizeof(double) * ((size_t)n + 1));
    w->bin = mf_xmalloc(sizeof(int) * ((size_t)n + 1));
}

static void layer_rows_free(layer_rows *w) {
    free(w->router_ref);
    free(w->router_tgt);
    free(w->select_ref);
    free(w->gate_ref);
    free(w->gate_tgt);
    free(w->shared_ref);
    free(w->shared_tgt);
    free(w->router_sq);
    free(w->unchosen);
    free(w->margin);
    free(w->kth);
    free(w->bin);
}

/* Each slot's squared router error, summed over experts in order; four slots side by side (independent sums,
 * the same bits as one at a time). x, y: [n][E]. */
static void router_sq_errors(const double *x0, const double *y0, int n, int E, double *out) {
    int t0 = 0;
    for (; t0 + 4 <= n; t0 += 4) {
        const double *x = x0 + (size_t)t0 * E, *y = y0 + (size_t)t0 * E;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int e = 0; e < E; e++) {
            const double d0 = x[e] - y[e], d1 = x[E + e] - y[E + e], d2 = x[2 * E + e] - y[2 * E + e],
                         d3 = x[3 * E + e] - y[3 * E + e];
            s0 += d0 * d0;
            s1 += d1 * d1;
            s2 += d2 * d2;
            s3 += d3 * d3;
        }
        out[t0] = s0;
        out[t0 + 1] = s1;
        out[t0 + 2] = s2;
        out[t0 + 3] = s3;
    }
    for (; t0 < n; t0++) {
        const double *x = x0 + (size_t)t0 * E, *y = y0 + (size_t)t0 * E;
        double s0 = 0;
        for (int e = 0; e < E; e++) s0 += (x[e] - y[e]) * (x[e] - y[e]);
        out[t0] = s0;
    }
}

/* Layer l's rows of both runs, and what the slots need from the reference's alone: squared router errors, margins,
 * k-th scores and bins. */
static void load_layer(layer_rows *w, const seq_view *R, const seq_view *T, int l, int n, int E, int K, bool gates,
                       bool shared) {
    /* the first n positions of layer l in each run (a generated run's rows may run on past them) */
    /* an imported capture may have no scores: the router's error needs both runs', the margins the reference's */
    if (R->router) load_row(R->router, (size_t)l * R->len * E, n * E, w->router_ref);
    if (T->router) load_row(T->router, (size_t)l * T->len * E, n * E, w->router_tgt);
    if (gates) {
        load_row(R->w, (size_t)l * R->len * K, n * K, w->gate_ref);
        load_row(T->w, (size_t)l * T->len * K, n * K, w->gate_tgt);
    }
    if (shared) {
        load_row(R->shared, (size_t)l * R->len, n, w->shared_ref);
        load_row(T->shared, (size_t)l * T->len, n, w->shared_tgt);
    }
    if (R->router && T->router) router_sq_errors(w->router_ref, w->router_tgt, n, E, w->router_sq);
    /* margins in the scores the router ranked: a grouped or biased router's `select`, else the logits (whose
     * order is the softmax's) */
    if (R->select) {
        load_row(R->select, (size_t)l * R->len * E, n * E, w->select_ref);
        ref_margins(w->select_ref, R->ids->data + 2 * (size_t)l * R->len * K, n, E, K, w->margin, w->kth, w->bin, w->unchosen);
    } else if (R->router)
        ref_margins(w->router_ref, R->ids->data + 2 * (size_t)l * R->len * K, n, E, K, w->margin, w->kth, w->bin, w->unchosen);
    else
        for (int t = 0; t < n; t++) {
            w->margin[t] = w->kth[t] = NAN;
            w->bin[t] = 0;
        }
}

/* Whether the two runs dispatched the same experts in the same order at a slot; overlap gets how many experts they
 * share (K when they chose the same set). */
static inline bool same_order(const uint16_t *A, const uint16_t *B, int K, int *overlap) {
    bool ord;   /* the common case: identical choices */
    if (K == 4) {   /* the usual top-4: one 64-bit compare, no call */
        uint64_t x, y;
        memcpy(&x, A, 8);
        memcpy(&y, B, 8);
        ord = x == y;
    } else ord = memcmp(A, B, sizeof(uint16_t) * (size_t)K) == 0;
    *overlap = K;
    if (!ord) {
        *overlap = 0;
        for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++) *overlap += A[i] == B[j];
    }
    return ord;
}

/* The squared differences of a slot's applied gate weights, aligned by expert id: an expert only one run chose counts
 * with weight 0 in the other. Each term is added to the case's running sum (gate_sq) and to the slot's, in order;
 * count gets one per term. */
static inline void gate_errors(const double *wr, const double *wt, const uint16_t *A, const uint16_t *B, int K, bool ord,
                               double *gate_sq, double *slot_gate_sq, int64_t *count) {
    double wtz[K + 1];   /* index K: the 0 of an expert the target did not choose */
    memcpy(wtz, wt, sizeof(double) * (size_t)K);
    wtz[K] = 0;
    for (int i = 0; i < K; i++) {
        int jm = K;   /* the last j with B[j] == A[i] */
        for (int j = 0; j < K; j++) jm = B[j] == A[i] ? j : jm;
        const double wb = wtz[jm];
        *gate_sq += (wr[i] - wb) * (wr[i] - wb);
        *slot_gate_sq += (wr[i] - wb) * (wr[i] - wb);
        (*count)++;
    }
    for (int j = 0; j < K && !ord; j++) {   /* with the same ids in order, every B[j] is in A */
        bool in_a = false;
        for (int i = 0; i < K; i++) in_a |= A[i] == B[j];
        if (!in_a) {
            *gate_sq += wt[j] * wt[j];
            *slot_gate_sq += wt[j] * wt[j];
            (*count)++;
        }
    }
}

/* The margin in probability units: the softmax of the reference's scores at the k-th minus the (k+1)-th. */
static double margin_in_probability(const double *ref_row, int E, double margin, double kth_score) {
    double mx = -INFINITY, z = 0;
    for (int e = 0; e < E; e++) mx = ref_row[e] > mx ? ref_row[e] : mx;
    for (int e = 0; e < E; e++) z += exp(ref_row[e] - mx);
    return isfinite(margin) ? (exp(kth_score - mx) - exp(kth_score - margin - mx)) / z : NAN;
}

/* A new slot record (keep_slots) of what the slot's comparison found, its lists of experts still empty. */
static mf_slot *keep_slot(mf_diff_acc *a, const mf_case *c, int l, int t, bool set, bool ord, bool tie, int overlap) {
    if (a->n_slots == a->cap_slots) {
        a->cap_slots = a->cap_slots ? 2 * a->cap_slots : 1024;
        a->slots = mf_xrealloc(a->slots, a->cap_slots * sizeof *a->slots);
    }
    mf_slot *sl = &a->slots[a->n_slots++];
    memset(sl, 0, sizeof *sl);
    sl->seq = c->id;
    sl->layer = a->layers[l];
    sl->pos = t;
    sl->set_equal = set;
    sl->order_equal = ord;
    sl->tie = tie;
    sl->overlap = overlap;
    return sl;
}

/* Where the flips of one sequence fell, per position, over the layers so far. */
typedef struct seq_flips {
    int *flipped_at;       /* [n] flipped slots */
    int *first_flip;       /* [n] the first model layer that flipped there, -1 */
    bool *all_equal;       /* [n] every layer so far chose the same set */
    int earliest_before;   /* the smallest flipped position in any earlier layer (n: none) */
} seq_flips;

static void seq_flips_init(seq_flips *f, int n) {
    f->flipped_at = mf_xcalloc((size_t)n + 1, sizeof(int));
    f->first_flip = mf_xmalloc(((size_t)n + 1) * sizeof(int));
    for (int t = 0; t < n; t++) f->first_flip[t] = -1;
    f->all_equal = mf_xmalloc((size_t)n + 1);
    for (int t = 0; t < n; t++) f->all_equal[t] = true;
    f->earliest_before = n;
}

static void seq_flips_free(seq_flips *f) {
    free(f->flipped_at);
    free(f->first_flip);
    free(f->all_equal);
}

/* A flip at (MoE layer l, position t): primary or inherited, counted for the layer, the bin of its margin, the
 * position and the experts dropped (A \ B) and added (B \ A), paired in rank order as transitions; into the slot's
 * record too when one is kept. */
static void record_flip(mf_diff_acc *a, mf_case *c, seq_flips *f, int l, int t, int bin, const uint16_t *A,
                        const uint16_t *B, int K, mf_slot *sl) {
    const int E = a->E;
    f->all_equal[t] = false;
    c->flipped++;
    a->flips[l]++;
    if (bin >= 0) a->margin_flips[(size_t)l * MF_MARGIN_BINS + bin]++;   /* -1: no margin (no reference scores) */
    f->flipped_at[t]++;
    if (f->first_flip[t] < 0) f->first_flip[t] = a->layers[l];
    const bool inherited = f->earliest_before <= t;
    if (a->n_flips == a->cap_flips) {
        a->cap_flips = a->cap_flips ? 2 * a->cap_flips : 256;
        a->flip_list = mf_xrealloc(a->flip_list, a->cap_flips * sizeof *a->flip_list);
    }
    a->flip_list[a->n_flips++] = (mf_flip){c->id, a->layers[l], t, inherited};
    c->inherited += inherited;
    c->primary += !inherited;
    a->inherited[l] += inherited;
    a->primary[l] += !inherited;
    int drop[K], add[K], nd = 0, na = 0;
    for (int i = 0; i < K; i++) {
        bool in_b = false, in_a = false;
        for (int j = 0; j < K; j++) {
            in_b |= A[i] == B[j];
            in_a |= B[i] == A[j];
        }
        if (!in_b) drop[nd++] = A[i];
        if (!in_a) add[na++] = B[i];
    }
    if (sl) {
        for (int i = 0; i < nd && i < 8; i++) sl->dropped[sl->n_dropped++] = (uint16_t)drop[i];
        for (int i = 0; i < na && i < 8; i++) sl->added[sl->n_added++] = (uint16_t)add[i];
    }
    if (a->n_group > 1) {
        /* across a group boundary: an expert added from a group the reference took none from, or one dropped
         * from a group the target took none from; within: every change stays inside groups both used */
        const int per = E / a->n_group;
        bool cross = false;
        for (int i = 0; i < na && !cross; i++) {
            bool shared = false;
            for (int j = 0; j < K; j++) shared |= A[j] / per == add[i] / per;
            cross = !shared;
        }
        for (int i = 0; i < nd && !cross; i++) {
            bool shared = false;
            for (int j = 0; j < K; j++) shared |= B[j] / per == drop[i] / per;
            cross = !shared;
        }
        a->cross_group[l] += cross;
        if (sl) sl->cross_group = cross;
    }
    for (int i = 0; i < nd; i++) a->dropped[(size_t)l * E + drop[i]]++;
    for (int i = 0; i < na; i++) a->added[(size_t)l * E + add[i]]++;
    /* which expert took which one's place */
    for (int i = 0; i < nd && i < na; i++) a->transitions[(size_t)drop[i] * E + add[i]]++;
}

/* The case's sums that every slot adds to, in slot order. */
typedef struct slot_sums {
    double router_sq, gate_sq, shared_sq;
} slot_sums;

/* Every slot of MoE layer l (rows loaded in w): choices compared, ties and margins binned, gate and shared-gate
 * errors, the slot kept (keep_slots), flips recorded; then the layer's totals into the case. */
static void add_layer(mf_diff_acc *a, mf_case *c, const seq_view *R, const seq_view *T, int l, int n, const layer_rows *w,
                      bool gates, bool shared, seq_flips *f, slot_sums *sums) {
    const int E = a->E, K = a->K;
    /* without the reference's scores there are no margins (nor ties), without both runs' no router error */
    const bool margins = R->router != NULL || R->select != NULL, router_err = R->router && T->router;
    int earliest_here = n;
    int64_t n_set = 0, n_ord = 0, n_overlap = 0;
    /* the sums in registers across the layer, added to in the same order as one slot at a time */
    double router_sq = sums->router_sq, gate_sq = sums->gate_sq, shared_sq_sum = sums->shared_sq;
    for (int t = 0; t < n; t++) {
        const size_t kr = ((size_t)l * R->len + t) * (size_t)K, kt = ((size_t)l * T->len + t) * (size_t)K;
        uint16_t A[K], B[K];
        memcpy(A, R->ids->data + 2 * kr, sizeof A);
        memcpy(B, T->ids->data + 2 * kt, sizeof B);
        int overlap;
        const bool ord = same_order(A, B, K, &overlap), set = overlap == K;
        n_set += set;
        n_ord += ord;
        n_overlap += overlap;
        if (router_err) router_sq += w->router_sq[t];
        const double margin = w->margin[t];
        const bool tie = margin <= 0;   /* < 0 only when fp32 probabilities tied where the logits did not */
        c->ties += tie;
        a->ties[l] += tie;
        const int bin = w->bin[t];
        if (margins) a->margin_slots[(size_t)l * MF_MARGIN_BINS + bin]++;
        double slot_gate_sq = 0;
        if (gates)
            gate_errors(w->gate_ref + (size_t)t * K, w->gate_tgt + (size_t)t * K, A, B, K, ord, &gate_sq, &slot_gate_sq,
                        &c->gate_count);
        double shared_sq = NAN;
        if (shared) {
            double d = w->shared_ref[t] - w->shared_tgt[t];
            shared_sq = d * d;
            shared_sq_sum += d * d;
            c->shared_count++;
        }
        mf_slot *sl = NULL;
        if (a->keep_slots) {
            sl = keep_slot(a, c, l, t, set, ord, tie, overlap);
            sl->margin_logit = margin;
            sl->shared_sq_err = shared_sq;
            sl->gate_sq_err = gates ? slot_gate_sq : NAN;
            /* selection scores are sigmoid scores or probabilities already: their margin is the margin */
            sl->margin_prob = R->select ? margin
                              : margins ? margin_in_probability(w->router_ref + (size_t)t * E, E, margin, w->kth[t]) : NAN;
            sl->cross_group = -1;
        }
        if (set) continue;
        if (t < earliest_here) earliest_here = t;
        record_flip(a, c, f, l, t, margins ? bin : -1, A, B, K, sl);
    }
    if (earliest_here < f->earliest_before) f->earliest_before = earliest_here;
    sums->router_sq = router_sq;
    sums->gate_sq = gate_sq;
    sums->shared_sq = shared_sq_sum;
    c->router_slots += n;
    c->router_set_equal += n_set;
    c->router_ord_equal += n_ord;
    c->layer_slots[l] += n;
    c->layer_set_equal[l] += n_set;
    c->layer_ord_equal[l] += n_ord;
    c->overlap += n_overlap;
    if (router_err) c->router_logit_count += (int64_t)n * E;
}

/* Every position of the sequence: its record (token, first flipped layer, flipped slots), whether every layer
 * agreed, the error given its flips, and CroVA's logit statistics when both runs have full logits. */
static void add_positions(mf_diff_acc *a, mf_case *c, const seq_view *R, const seq_view *T, const seq_flips *f, int n) {
    const int L = a->L, V = a->V;
    c->pos_first = a->n_pos;
    c->pos_count = n;
    for (int t = 0; t < n; t++) {
        mf_position *p = new_pos(a);
        p->seq = c->id;   /* owned by the case, which moves with it on merge */
        p->pos = t;
        int32_t tok;
        memcpy(&tok, R->tokens->data + 4 * (size_t)t, 4);
        p->token = tok;
        p->first_flip_layer = f->first_flip[t];
        p->flipped_slots = f->flipped_at[t];
        p->kl = p->sq_err = p->prob_sq_err = NAN;
        p->top1 = -1;
        p->generated = t >= c->prompt_len;
        c->router_positions_all_layers_equal += L > 0 && f->all_equal[t];
        const int cls = f->flipped_at[t] >= 2 ? 2 : f->flipped_at[t];
        c->cond_positions[cls]++;
        if (c->has_logits) {
            double sq, psq, kl;
            int top1, ord5, set5;
            logit_stats(R->logits, T->logits, (size_t)t * V, V, &sq, &psq, &kl, &top1, &ord5, &set5,
                        c->equal_bits >= 0 ? &c->equal_bits : NULL);
            c->sq_err += sq;
            c->prob_sq_err += psq;
            c->kl += kl;
            c->top1 += top1;
            c->ord5 += ord5;
            c->set5 += set5;
            c->cond_kl[cls] += kl;
            c->cond_top1[cls] += top1;
            p->kl = kl;
            p->sq_err = sq;
            p->prob_sq_err = psq;
            p->top1 = top1;
        }
    }
}

/* The positions of sequence si (reference) and ti (target) that are compared: all of them, or, where both runs
 * generated their own responses, those before the first token where they part (from there on each position's
 * input differs). The responses' agreement goes into the case. */
static int compared_positions(const mf_run *ref, size_t si, const mf_run *tgt, size_t ti, const seq_view *R,
                              const seq_view *T, mf_case *c) {
    const int n = (int)R->len;
    c->prompt_len = n - ref->seqs[si].generated;
    if (!own_responses(ref, tgt)) return n;
    /* a sequence neither run continued (its line asked for no new tokens) has no response to compare */
    if (ref->seqs[si].generated == 0 && tgt->seqs[ti].generated == 0) return n;
    const int m = (int)T->len, shorter = n < m ? n : m;
    int part = shorter, agree = 0;
    for (int t = c->prompt_len; t < shorter; t++) {
        int32_t x, y;
        memcpy(&x, R->tokens->data + 4 * (size_t)t, 4);
        memcpy(&y, T->tokens->data + 4 * (size_t)t, 4);
        agree += x == y;
        if (x != y && part == shorter) part = t;
    }
    c->responses = true;
    c->response_ref = n - c->prompt_len;
    c->response_tgt = m - c->prompt_len;
    c->first_divergence = part - c->prompt_len;
    c->response_agree = agree;
    c->response_equal = n == m && part == shorter;
    /* the position holding the first differing token ran on different inputs; the one before it is the last
     * whose inputs agree (its logits chose the differing tokens) */
    return part;
}

/* Sequence si of the reference against sequence ti of the target: one new case. */
static int add_sequence(mf_diff_acc *a, mf_run *ref, size_t si, mf_run *tgt, size_t ti, mf_error *err) {
    init_edges();
    seq_view R, T;
    int rc;
    if ((rc = view(ref, si, &R, err)) || (rc = view(tgt, ti, &T, err))) return rc;
    const char *id = ref->seqs[si].id;
    const int L = a->L;
    mf_case *c = new_case(a, id);
    const int n = compared_positions(ref, si, tgt, ti, &R, &T, c);
    if ((rc = diff_answers_case(c, ref->seqs[si].choices, tgt->seqs[ti].choices, ref->dir, tgt->dir, err))) return rc;
    a->generated |= ref->seqs[si].generated > 0;
    c->positions = n;
    c->flip_first = a->n_flips;
    c->vocab = a->V;
    c->has_logits = R.logits && T.logits;
    const bool routing = L > 0 && R.ids && T.ids;
    if (L > 0 && !routing) return mf_fail(err, MF_EFORMAT, "sequence %s: routing tensors missing", id);
    if (c->has_logits && R.logits->dtype == MF_BF16 && T.logits->dtype == MF_BF16) c->equal_bits = 0;
    seq_flips f;
    seq_flips_init(&f, n);
    layer_rows w;
    layer_rows_alloc(&w, n, a->E, a->K);
    const bool gates = R.w && T.w, shared = R.shared && T.shared;
    slot_sums sums = {c->router_logit_sq_err, c->gate_sq_err, c->shared_sq_err};
    for (int l = 0; l < L; l++) {
        load_layer(&w, &R, &T, l, n, a->E, a->K, gates, shared);
        add_layer(a, c, &R, &T, l, n, &w, gates, shared, &f, &sums);
    }
    c->router_logit_sq_err = sums.router_sq;
    c->gate_sq_err = sums.gate_sq;
    c->shared_sq_err = sums.shared_sq;
    layer_rows_free(&w);
    c->flip_count = (int)(a->n_flips - c->flip_first);
    add_positions(a, c, &R, &T, &f, n);
    seq_flips_free(&f);
    return MF_OK;
}

int mf_diff_acc_add_runs(mf_diff_acc *a, mf_run *ref, mf_run *tgt, mf_error *err) {
    return mf_diff_acc_add_range(a, ref, tgt, 0, ref->n_seqs, err);
}

int mf_diff_acc_add_range(mf_diff_acc *a, mf_run *ref, mf_run *tgt, size_t first, size_t count, mf_error *err) {
    int rc = mf_diff_align(ref, tgt, err);
    return rc ? rc : diff_acc_add_aligned(a, ref, tgt, first, count, err);
}

int diff_acc_add_aligned(mf_diff_acc *a, mf_run *ref, mf_run *tgt, size_t first, size_t count, mf_error *err) {
    int rc;
    a->ref_lacks |= ref->lacks;
    a->tgt_lacks |= tgt->lacks;
    if (ref->engine[0]) snprintf(a->ref_engine, sizeof a->ref_engine, "%s", ref->engine);
    if (tgt->engine[0]) snprintf(a->tgt_engine, sizeof a->tgt_engine, "%s", tgt->engine);
    size_t positions = a->n_pos;   /* room for every position at once: no copying as the array grows */
    for (size_t i = first; i < first + count && i < ref->n_seqs; i++) positions += (size_t)ref->seqs[i].length;
    if (positions > a->cap_pos) {
        a->cap_pos = positions;
        a->pos = mf_xrealloc(a->pos, a->cap_pos * sizeof *a->pos);
    }
    for (size_t i = first; i < first + count && i < ref->n_seqs; i++)
        if ((rc = add_sequence(a, ref, i, tgt, (size_t)find_seq(tgt, ref->seqs[i].id), err))) return rc;
    return MF_OK;
}

int mf_diff_merge(mf_diff_acc *dst, mf_diff_acc *src, mf_error *err) {
    if (dst->L != src->L || dst->E != src->E || dst->K != src->K || dst->V != src->V)
        return mf_fail(err, MF_EMISMATCH, "cannot merge diffs of different models");
    for (size_t i = 0; i < src->n_cases; i++) {
        mf_case *c = new_case(dst, src->cases[i].id);
        char *id = c->id;
        int64_t *ls = c->layer_slots, *le = c->layer_set_equal, *lo = c->layer_ord_equal;
        *c = src->cases[i];
        c->pos_first += dst->n_pos;   /* src's runs are appended after dst's below */
        c->flip_first += dst->n_flips;
        free(id);
        free(ls);
        free(le);
        free(lo);
    }
    src->n_cases = 0;
    dst->generated |= src->generated;
    dst->ref_lacks |= src->ref_lacks;
    dst->tgt_lacks |= src->tgt_lacks;
    if (src->ref_engine[0]) memcpy(dst->ref_engine, src->ref_engine, sizeof dst->ref_engine);
    if (src->tgt_engine[0]) memcpy(dst->tgt_engine, src->tgt_engine, sizeof dst->tgt_engine);
    for (size_t i = 0; i < src->n_pos; i++) *new_pos(dst) = src->pos[i];
    src->n_pos = 0;
    if (src->n_flips) {
        dst->flip_list = mf_xrealloc(dst->flip_list, (dst->n_flips + src->n_flips) * sizeof *dst->flip_list);
        memcpy(dst->flip_list + dst->n_flips, src->flip_list, src->n_flips * sizeof *src->flip_list);
        dst->n_flips += src->n_flips;
        dst->cap_flips = dst->n_flips;
        src->n_flips = 0;
    }
    if (src->n_slots) {
        dst->slots = mf_xrealloc(dst->slots, (dst->n_slots + src->n_slots) * sizeof *dst->slots);
        memcpy(dst->slots + dst->n_slots, src->slots, src->n_slots * sizeof *src->slots);
        dst->n_slots += src->n_slots;
        dst->cap_slots = dst->n_slots;
        src->n_slots = 0;
    }
    const size_t L = (size_t)dst->L, E = (size_t)dst->E;
    for (size_t l = 0; l < L; l++) {
        dst->flips[l] += src->flips[l];
        dst->primary[l] += src->primary[l];
        dst->inherited[l] += src->inherited[l];
        dst->ties[l] += src->ties[l];
        dst->cross_group[l] += src->cross_group[l];
    }
    for (size_t i = 0; i < L * MF_MARGIN_BINS; i++) {
        dst->margin_slots[i] += src->margin_slots[i];
        dst->margin_flips[i] += src->margin_flips[i];
    }
    for (size_t i = 0; i < L * E; i++) {
        dst->dropped[i] += src->dropped[i];
        dst->added[i] += src->added[i];
    }
    for (size_t i = 0; i < E * E; i++) dst->transitions[i] += src->transitions[i];
    return MF_OK;
}
