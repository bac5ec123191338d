/* The CPU forward pass, read top to bottom like a transformers modeling
 * file. Activations are held in double. Each part (norm, attention, MLP,
 * router, head) computes in its own dtype D under the precision policy:
 * rd(D, x) rounds to it (a no-op in fp64 runs) and ro() to PyTorch's fp32
 * opmath (also a no-op in fp64), placed exactly where transformers rounds.
 * A part's output is cast back to the residual stream's dtype, as CroVA's
 * selective hooks do; the head's logits keep the head's dtype. */
#include "mf_runtime.h"
#include "mf_router.h"
#include "mf_experts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct fwd {
    const mf_model *m;
    const mf_config *c;
    const mf_run_opts *o;
    mf_dtype R;    /* residual stream dtype */
    mf_dtype O;    /* opmath dtype */
    mf_mm mm;      /* matrix products: compute type, threads, numerics */
    int T;
    double *cos_t, *sin_t;
} fwd;

static inline double rd(mf_dtype D, double x) { return mf_round_to(D, x); }
static inline double ro(const fwd *f, double x) { return mf_round_to(f->O, x); }

/* Products inside a part computing in D: operands hold D values, results are rounded to D. */
static mf_mm mm_in(const fwd *f, mf_dtype D) {
    mf_mm m = f->mm;
    m.in = m.out = D;
    return m;
}

static void cast(mf_dtype D, double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = rd(D, x[i]);
}

/* RMSNorm over rows of n values (row stride ld), Llama cast points:
 * y32 = x32 * rsqrt(mean(x32^2) + eps); out = w * y32.to(input dtype). */
static void rmsnorm(const fwd *f, mf_dtype D, double *x, int rows, int n, size_t ld, const double *w) {
    const double eps = ro(f, f->c->rms_eps);
#pragma omp parallel for num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)rows * n >= 16384)
    for (int r = 0; r < rows; r++) {
        double *v = x + (size_t)r * ld;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += v[i] * v[i];
        double var = ro(f, ss / n);
        double inv = f->O == MF_F64 ? 1.0 / sqrt(var + eps) : (double)(1.0f / sqrtf((float)(var + eps)));
        for (int i = 0; i < n; i++) v[i] = rd(D, w[i] * rd(D, ro(f, v[i] * inv)));
    }
}

/* A norm module: inputs cast to its dtype D, output cast to the stream dtype S. */
static void norm_module(const fwd *f, mf_dtype D, mf_dtype S, const double *x, int rows, int n, const double *w,
                        double *out) {
    for (size_t i = 0; i < (size_t)rows * n; i++) out[i] = rd(D, x[i]);
    rmsnorm(f, D, out, rows, n, (size_t)n, w);
    cast(S, out, (size_t)rows * n);
}

/* q' = q*cos + rotate_half(q)*sin, three roundings, on `heads` heads of a row. */
static void rope(const fwd *f, mf_dtype D, double *x, int heads, size_t row_stride) {
    const int hd = f->c->head_dim, half = hd / 2;
#pragma omp parallel for num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)f->T * heads * hd >= 16384)
    for (int t = 0; t < f->T; t++) {
        double tmp[hd];
        const double *cs = f->cos_t + (size_t)t * hd, *sn = f->sin_t + (size_t)t * hd;
        for (int h = 0; h < heads; h++) {
            double *v = x + (size_t)t * row_stride + (size_t)h * hd;
            for (int i = 0; i < hd; i++) {
                double rot = i < half ? -v[i + half] : v[i - half];
                tmp[i] = rd(D, rd(D, v[i] * cs[i]) + rd(D, rot * sn[i]));
            }
            memcpy(v, tmp, sizeof tmp);
        }
    }
}

/* Eager attention computing in D: S = (Q K^T) * scale, causal (and sliding)
 * mask, softmax in fp32 opmath, P V; each step rounded to D. x holds D values. */
static void attention(const fwd *f, mf_dtype D, const mf_layer *L, int layer, const double *x, double *out) {
    const mf_config *c = f->c;
    const int T = f->T, H = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int nq = nh * hd, nk = nkv * hd, group = nh / nkv;
    double *q = mf_xmalloc((size_t)T * nq * sizeof(double));
    double *k = mf_xmalloc((size_t)T * nk * sizeof(double));
    double *v = mf_xmalloc((size_t)T * nk * sizeof(double));
    double *ctx = mf_xmalloc((size_t)T * nq * sizeof(double));
    const mf_mm mm = mm_in(f, D);
    mf_linear_apply(&mm, &L->q, x, T, q);
    mf_linear_apply(&mm, &L->k, x, T, k);
    mf_linear_apply(&mm, &L->v, x, T, v);
    if (c->qk_norm == MF_QK_NORM_FULL) {
        rmsnorm(f, D, q, T, nq, (size_t)nq, L->q_norm);
        rmsnorm(f, D, k, T, nk, (size_t)nk, L->k_norm);
    }
    if (c->clip_qkv > 0) {   /* clamp of a D tensor: the bound is rounded to D */
        const double cl = rd(D, c->clip_qkv);
        for (size_t i = 0; i < (size_t)T * nq; i++) q[i] = fmin(fmax(q[i], -cl), cl);
        for (size_t i = 0; i < (size_t)T * nk; i++) {
            k[i] = fmin(fmax(k[i], -cl), cl);
            v[i] = fmin(fmax(v[i], -cl), cl);
        }
    }
    if (c->qk_norm == MF_QK_NORM_PER_HEAD) {
        rmsnorm(f, D, q, T * nh, hd, (size_t)hd, L->q_norm);
        rmsnorm(f, D, k, T * nkv, hd, (size_t)hd, L->k_norm);
    }
    rope(f, D, q, nh, (size_t)nq);
    rope(f, D, k, nkv, (size_t)nk);
    const double scale = ro(f, pow((double)hd, -0.5));   /* head_dim ** -0.5, a Python float */
    const int window = c->layer_sliding[layer] ? c->sliding_window : 0;
    mf_mm mm1 = mm;
    mm1.threads = 1;   /* heads run in parallel instead */
#pragma omp parallel for schedule(dynamic) num_threads(f->o->threads) if (f->o->threads > 1 && nh > 1)
    for (int h = 0; h < nh; h++) {
        const int kh = h / group;
        /* K_kh [T, hd] and V_kh^T [hd, T] read in place */
        const mf_mat kp = {k + (size_t)kh * hd, MF_F64, T, hd, (size_t)nk, 1};
        const mf_mat vp = {v + (size_t)kh * hd, MF_F64, hd, T, 1, (size_t)nk};
        double *s = mf_xmalloc((size_t)T * T * sizeof(double));
        mf_matmul(&mm1, q + (size_t)h * hd, T, (size_t)nq, &kp, s, (size_t)T, MF_TRI_COLS);
        for (int i = 0; i < T; i++) {
            double *row = s + (size_t)i * T;
            int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;   /* sees itself + window-1 before */
            double mx = -INFINITY;
            for (int j = j0; j <= i; j++) {
                row[j] = rd(D, ro(f, row[j] * scale));
                mx = row[j] > mx ? row[j] : mx;
            }
            for (int j = 0; j < j0; j++) row[j] = 0;
            for (int j = i + 1; j < T; j++) row[j] = 0;
            if (f->O == MF_F64) {
                double sum = 0;
                for (int j = j0; j <= i; j++) sum += (row[j] = exp(row[j] - mx));
                for (int j = j0; j <= i; j++) row[j] /= sum;
            } else {
                float sum = 0;
                for (int j = j0; j <= i; j++) {
                    float e = (float)exp((double)((float)row[j] - (float)mx));
                    row[j] = e;
                    sum += e;
                }
                for (int j = j0; j <= i; j++) row[j] = rd(D, (float)row[j] / sum);
            }
        }
        mf_matmul(&mm1, s, T, (size_t)T, &vp, ctx + (size_t)h * hd, (size_t)nq, MF_TRI_K);
        free(s);
    }
    mf_linear_apply(&mm, &L->o, ctx, T, out);
    (void)H;
    free(q);
    free(k);
    free(v);
    free(ctx);
}

static void dense_mlp(const fwd *f, mf_dtype D, const mf_layer *L, const double *x, double *out) {
    mf_ffn ffn = {&L->mlp_gate, &L->mlp_up, &L->mlp_down, f->c->act};
    const mf_mm mm = mm_in(f, D);
    mf_ffn_apply(&mm, &ffn, D, x, f->T, out);
}

/* The sparse MoE block computing in D, its router in DR: router, canonical
 * top-k, experts grouped per expert, grouped_mm combine, and Qwen2-MoE's
 * sigmoid-gated shared expert. Records the router's logits, choices and
 * weights at slot `mi` of the result. x holds D values. */
static void moe(const fwd *f, mf_dtype D, mf_dtype DR, const mf_layer *L, const double *x, double *out,
                mf_seq_result *r, int mi) {
    const mf_config *c = f->c;
    const int T = f->T, H = c->hidden, E = c->n_experts, K = c->top_k;
    double *logits = r->router + (size_t)mi * T * E;
    const mf_mm mm = mm_in(f, D), mr = mm_in(f, DR);
    mf_linear_apply(&mr, &L->router, x, T, logits);
    /* transformers v5: Mixtral keeps the top-k weights in fp32; OLMoE and the
     * Qwen MoEs cast them to the router logits' dtype. A product y * w of two
     * dtypes is computed in the wider one (fp32 opmath). */
    const mf_dtype wdt = c->route_rule == MF_ROUTE_SOFTMAX_TOPK_RENORM ? f->O : DR;
    mf_route_spec spec = {MF_ROUTE_KIND_SOFTMAX_TOPK, E, K, c->norm_topk_prob, f->O, wdt};
    uint16_t *ids = r->topk_ids + (size_t)mi * T * K;
    double *w = r->topk_w + (size_t)mi * T * K;
    double *probs = mf_xmalloc((size_t)E * sizeof(double));
    for (int t = 0; t < T; t++) {
        mf_route_out ro_ = {ids + (size_t)t * K, w + (size_t)t * K, 0, 0, false};
        mf_route(&spec, logits + (size_t)t * E, probs, &ro_);
    }
    free(probs);
    mf_dispatch d;
    mf_dispatch_build(&d, ids, T, K, E);
    double *y = mf_xmalloc((size_t)T * K * H * sizeof(double));
    /* With enough experts at work each thread takes whole experts (one
     * product after another, no barrier between them); with few, each
     * product is shared. Either way every expert's rows are computed alike. */
    int active = 0;
    for (int e = 0; e < E; e++) active += d.offset[e + 1] > d.offset[e];
    const int threads = f->o->threads;
    const bool by_expert = threads > 1 && active >= 4 * threads;
    mf_mm mme = mm;
    if (by_expert) mme.threads = 1;
#pragma omp parallel num_threads(by_expert ? threads : 1)
    {
        double *xe = mf_xmalloc((size_t)T * H * sizeof(double));
#pragma omp for schedule(dynamic, 1)
        for (int e = 0; e < E; e++) {
            const int n = d.offset[e + 1] - d.offset[e];
            if (!n) continue;
            for (int i = 0; i < n; i++)
                memcpy(xe + (size_t)i * H, x + (size_t)d.token[d.offset[e] + i] * H, (size_t)H * sizeof(double));
            mf_ffn ffn = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], c->act};
            mf_ffn_apply(&mme, &ffn, D, xe, n, y + (size_t)d.offset[e] * H);
        }
        free(xe);
    }
    mf_combine_spec cs = {wdt == D ? D : f->O, f->O, D};
    mf_combine(&cs, &d, y, H, w, out);
    free(y);
    mf_dispatch_free(&d);
    if (c->has_shared_expert) {
        double *s = mf_xmalloc((size_t)T * H * sizeof(double));
        double *g = r->shared_gate + (size_t)mi * T;
        mf_ffn ffn = {&L->sh_gate, &L->sh_up, &L->sh_down, c->act};
        mf_ffn_apply(&mm, &ffn, D, x, T, s);
        mf_linear_apply(&mm, &L->sh_router, x, T, g);
        for (int t = 0; t < T; t++) {
            g[t] = rd(D, mf_sigmoid(g[t]));
            for (int h = 0; h < H; h++) {
                size_t i = (size_t)t * H + h;
                out[i] = rd(D, out[i] + rd(D, g[t] * s[i]));
            }
        }
        free(s);
    }
}

void mf_seq_result_free(mf_seq_result *r) {
    free(r->topk_ids);
    free(r->topk_w);
    free(r->router);
    free(r->shared_gate);
    free(r->router_in);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

void mf_seq_result_shape(mf_seq_result *r, const mf_config *c, int T) {
    r->T = T;
    r->n_moe = c->n_moe_layers;
    r->k = c->top_k;
    r->E = c->n_experts;
    r->V = c->vocab;
    r->H = c->hidden;
}

const char *const MF_SEQ_DIGEST_NAMES[MF_SEQ_DIGESTS] = {"logits", "router", "topk_ids", "topk_w", "shared_gate"};

void mf_seq_results_digest(const mf_seq_result *r, size_t n, char out[MF_SEQ_DIGESTS][33]) {
    mf_digest_state *d[MF_SEQ_DIGESTS];
    for (int i = 0; i < MF_SEQ_DIGESTS; i++) d[i] = mf_digest_new();
    for (size_t s = 0; s < n; s++) {
        const size_t slots = (size_t)r[s].n_moe * r[s].T;
        mf_digest_update(d[0], r[s].logits, (size_t)r[s].T * r[s].V * sizeof(double));
        if (r[s].router) mf_digest_update(d[1], r[s].router, slots * r[s].E * sizeof(double));
        if (r[s].topk_ids) mf_digest_update(d[2], r[s].topk_ids, slots * r[s].k * sizeof(uint16_t));
        if (r[s].topk_w) mf_digest_update(d[3], r[s].topk_w, slots * r[s].k * sizeof(double));
        if (r[s].shared_gate) mf_digest_update(d[4], r[s].shared_gate, slots * sizeof(double));
    }
    for (int i = 0; i < MF_SEQ_DIGESTS; i++) mf_digest_final(d[i], out[i]);
}

static uint64_t umax(uint64_t a, uint64_t b) { return a > b ? a : b; }

uint64_t mf_forward_cpu_bytes(const mf_config *c, int T_, int threads, bool router_in) {
    const uint64_t T = (uint64_t)(T_ > 0 ? T_ : 1), H = c->hidden, V = c->vocab, hd = c->head_dim;
    const uint64_t nq = (uint64_t)c->n_heads * hd, nk = (uint64_t)c->n_kv_heads * hd, th = threads > 0 ? threads : 1;
    const uint64_t E = c->n_experts > 0 ? c->n_experts : 1, K = c->top_k > 0 ? c->top_k : 1, nm = c->n_moe_layers;
    const uint64_t I = umax(umax(c->intermediate, c->moe_intermediate), c->shared_intermediate);
    const uint64_t result = T * V * 8 + nm * T * (E * 8 + K * 10 + 8) + (router_in ? nm * T * H * 8 : 0);
    const uint64_t stream = 3 * T * H * 8 + 2 * T * hd * 8;
    const uint64_t attn = T * (2 * nq + 2 * nk) * 8 + th * T * T * 8 + T * umax(nq, H) * 8;
    const uint64_t ffn = th * (T * I * 16 + T * umax(I, H) * 8) + T * K * H * 8 + th * T * H * 8;
    const uint64_t head = T * H * 4 + T * V * 4;
    /* the run writer keeps a shard of up to 64 MB and a copy of the sequence's record */
    return result + stream + umax(umax(attn, ffn), head) + result + (64u << 20);
}

uint64_t mf_forward_gpu_host_bytes(const mf_config *c, int T_) {
    const uint64_t T = (uint64_t)(T_ > 0 ? T_ : 1), V = c->vocab, nm = c->n_moe_layers;
    const uint64_t E = c->n_experts > 0 ? c->n_experts : 1, K = c->top_k > 0 ? c->top_k : 1;
    const uint64_t route = nm * T * (E + K + 1) * 4 + nm * T * K * 2;
    const uint64_t result = T * V * 8 + nm * T * (E * 8 + K * 10 + 8);
    /* pinned: the upload's staging slots, the logits and the routing; then the result and the writer's copy */
    return ((uint64_t)6 * (32u << 20)) + T * V * 4 + route + 2 * result + (64u << 20);
}

int mf_runtime_load(mf_model **out, const char *dir, const mf_precision *prec, mf_error *err) {
    return mf_model_load(out, dir, prec->weights, 0, err);
}

int mf_forward_cpu(const mf_model *m, const mf_run_opts *o, const int32_t *tokens, int T, mf_seq_result *r,
                   mf_error *err) {
    const mf_config *c = &m->cfg;
    const int H = c->hidden, V = c->vocab;
    memset(r, 0, sizeof *r);
    if (T <= 0) return mf_fail(err, MF_EINVAL, "empty sequence");
    if (c->rope.partial_rotary_factor != 1.0)
        return mf_fail(err, MF_EUNSUPPORTED, "partial_rotary_factor %g is not supported for %s",
                       c->rope.partial_rotary_factor, c->model_type);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return mf_fail(err, MF_EINVAL, "position %d: token id %d outside the vocabulary [0, %d)", t, tokens[t], V);
    const mf_precision *P = &o->prec;
    fwd f = {m, c, o, P->act, P->opmath, {P->compute, P->act, o->threads, o->numerics, P->act}, T, NULL, NULL};
    mf_seq_result_shape(r, c, T);
    if (r->n_moe) {
        r->topk_ids = mf_xcalloc((size_t)r->n_moe * T * r->k, sizeof(uint16_t));
        r->topk_w = mf_xcalloc((size_t)r->n_moe * T * r->k, sizeof(double));
        r->router = mf_xcalloc((size_t)r->n_moe * T * r->E, sizeof(double));
        if (c->has_shared_expert) r->shared_gate = mf_xcalloc((size_t)r->n_moe * T, sizeof(double));
        if (o->record_router_in) r->router_in = mf_xcalloc((size_t)r->n_moe * T * H, sizeof(double));
    }
    r->logits = mf_xmalloc((size_t)T * V * sizeof(double));

    /* RoPE tables, cast to the model's dtype as the rotary module does (parts
     * computing in fp32 take these values as they are) */
    f.cos_t = mf_xmalloc((size_t)T * c->head_dim * sizeof(double));
    f.sin_t = mf_xmalloc((size_t)T * c->head_dim * sizeof(double));
    mf_rope_tables(c, P, T, f.cos_t, f.sin_t);
    cast(f.R, f.cos_t, (size_t)T * c->head_dim);
    cast(f.R, f.sin_t, (size_t)T * c->head_dim);

    const size_t TH = (size_t)T * H;
    double *h = mf_xmalloc(TH * sizeof(double));
    double *x = mf_xmalloc(TH * sizeof(double));
    double *y = mf_xmalloc(TH * sizeof(double));
    for (int t = 0; t < T; t++)   /* embedding gather, no scaling */
        for (int i = 0; i < H; i++)
            h[(size_t)t * H + i] = rd(f.R, mf_round_to(m->weight_round, mf_load_as_f64(m->embed->data, m->embed->dtype,
                                                                                      (size_t)tokens[t] * H + i)));
    int mi = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const mf_layer *L = &m->layers[l];
        /* a layer in a fp32 block range computes everything, residual adds too, in fp32 */
        const bool blk = mf_precision_layer_fp32(P, l, c->n_layers);
        const mf_dtype S = blk ? MF_F32 : f.R;
        const mf_dtype DN = blk ? MF_F32 : P->part[MF_PART_NORM], DA = blk ? MF_F32 : P->part[MF_PART_ATTN];
        const mf_dtype DM = blk ? MF_F32 : P->part[MF_PART_MLP], DR = blk ? MF_F32 : P->part[MF_PART_ROUTER];
        norm_module(&f, DN, S, h, T, H, L->attn_norm, x);
        cast(DA, x, TH);
        attention(&f, DA, L, l, x, y);
        for (size_t i = 0; i < TH; i++) h[i] = rd(S, h[i] + rd(S, y[i]));
        norm_module(&f, DN, S, h, T, H, L->ffn_norm, x);
        cast(DM, x, TH);
        if (L->is_moe) {
            if (r->router_in) memcpy(r->router_in + (size_t)mi * TH, x, TH * sizeof(double));
            moe(&f, DM, DM == MF_F32 ? MF_F32 : DR, L, x, y, r, mi++);
        } else {
            dense_mlp(&f, DM, L, x, y);
        }
        for (size_t i = 0; i < TH; i++) h[i] = rd(S, h[i] + rd(S, y[i]));
        cast(f.R, h, TH);   /* the layer's output, back in the stream's dtype */
    }
    norm_module(&f, P->part[MF_PART_NORM], f.R, h, T, H, m->final_norm, x);
    const mf_dtype DH = P->part[MF_PART_HEAD];
    cast(DH, x, TH);
    const mf_mm mh = mm_in(&f, DH);
    mf_linear_apply(&mh, &m->head, x, T, r->logits);
    free(h);
    free(x);
    free(y);
    free(f.cos_t);
    free(f.sin_t);
    return MF_OK;
}
