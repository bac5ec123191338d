/* The CPU forward pass, read top to bottom like a transformers modeling
 * file. Activations are held in double; ra() rounds to the activation dtype
 * (a no-op in fp64 runs) and ro() to PyTorch's fp32 opmath (also a no-op in
 * fp64), placed exactly where transformers rounds. */
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
    mf_dtype A;    /* activation dtype */
    mf_dtype O;    /* opmath dtype */
    mf_mm mm;      /* matrix products: compute type, output rounded to A */
    int T;
    double *cos_t, *sin_t;
} fwd;

static inline double ra(const fwd *f, double x) { return mf_round_to(f->A, x); }
static inline double ro(const fwd *f, double x) { return mf_round_to(f->O, x); }

/* RMSNorm over rows of n values (row stride ld), Llama cast points:
 * y32 = x32 * rsqrt(mean(x32^2) + eps); out = w * y32.to(input dtype). */
static void rmsnorm(const fwd *f, double *x, int rows, int n, size_t ld, const double *w) {
    const double eps = ro(f, f->c->rms_eps);
#pragma omp parallel for num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)rows * n >= 16384)
    for (int r = 0; r < rows; r++) {
        double *v = x + (size_t)r * ld;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += v[i] * v[i];
        double var = ro(f, ss / n);
        double inv = f->O == MF_F64 ? 1.0 / sqrt(var + eps) : (double)(1.0f / sqrtf((float)(var + eps)));
        for (int i = 0; i < n; i++) v[i] = ra(f, w[i] * ra(f, ro(f, v[i] * inv)));
    }
}

static void rmsnorm_into(const fwd *f, const double *x, int rows, int n, const double *w, double *out) {
    memcpy(out, x, (size_t)rows * n * sizeof(double));
    rmsnorm(f, out, rows, n, (size_t)n, w);
}

/* q' = q*cos + rotate_half(q)*sin, three roundings, on `heads` heads of a row. */
static void rope(const fwd *f, double *x, int heads, size_t row_stride) {
    const int hd = f->c->head_dim, half = hd / 2;
#pragma omp parallel for num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)f->T * heads * hd >= 16384)
    for (int t = 0; t < f->T; t++) {
        double tmp[hd];
        const double *cs = f->cos_t + (size_t)t * hd, *sn = f->sin_t + (size_t)t * hd;
        for (int h = 0; h < heads; h++) {
            double *v = x + (size_t)t * row_stride + (size_t)h * hd;
            for (int i = 0; i < hd; i++) {
                double rot = i < half ? -v[i + half] : v[i - half];
                tmp[i] = ra(f, ra(f, v[i] * cs[i]) + ra(f, rot * sn[i]));
            }
            memcpy(v, tmp, sizeof tmp);
        }
    }
}

/* Eager attention: S = (Q K^T) * scale, causal (and sliding) mask, softmax in
 * fp32 opmath, P V; each step rounded to the activation dtype. */
static void attention(const fwd *f, const mf_layer *L, int layer, const double *x, double *out) {
    const mf_config *c = f->c;
    const int T = f->T, H = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int nq = nh * hd, nk = nkv * hd, group = nh / nkv;
    double *q = mf_xmalloc((size_t)T * nq * sizeof(double));
    double *k = mf_xmalloc((size_t)T * nk * sizeof(double));
    double *v = mf_xmalloc((size_t)T * nk * sizeof(double));
    double *ctx = mf_xmalloc((size_t)T * nq * sizeof(double));
    mf_linear_apply(&f->mm, &L->q, x, T, q);
    mf_linear_apply(&f->mm, &L->k, x, T, k);
    mf_linear_apply(&f->mm, &L->v, x, T, v);
    if (c->qk_norm == MF_QK_NORM_FULL) {
        rmsnorm(f, q, T, nq, (size_t)nq, L->q_norm);
        rmsnorm(f, k, T, nk, (size_t)nk, L->k_norm);
    }
    if (c->clip_qkv > 0) {   /* clamp of an activation-dtype tensor: the bound is rounded to it */
        const double cl = ra(f, c->clip_qkv);
        for (size_t i = 0; i < (size_t)T * nq; i++) q[i] = fmin(fmax(q[i], -cl), cl);
        for (size_t i = 0; i < (size_t)T * nk; i++) {
            k[i] = fmin(fmax(k[i], -cl), cl);
            v[i] = fmin(fmax(v[i], -cl), cl);
        }
    }
    if (c->qk_norm == MF_QK_NORM_PER_HEAD) {
        rmsnorm(f, q, T * nh, hd, (size_t)hd, L->q_norm);
        rmsnorm(f, k, T * nkv, hd, (size_t)hd, L->k_norm);
    }
    rope(f, q, nh, (size_t)nq);
    rope(f, k, nkv, (size_t)nk);
    const double scale = ro(f, pow((double)hd, -0.5));   /* head_dim ** -0.5, a Python float */
    const int window = c->layer_sliding[layer] ? c->sliding_window : 0;
    mf_mm mm1 = f->mm;
    mm1.threads = 1;   /* heads run in parallel instead */
#pragma omp parallel for schedule(dynamic) num_threads(f->o->threads) if (f->o->threads > 1 && nh > 1)
    for (int h = 0; h < nh; h++) {
        const int kh = h / group;
        mf_packed kp, vp;
        mf_pack(&kp, f->mm.compute, MF_F64, T, hd, k + (size_t)kh * hd, MF_F64, (size_t)nk, 1);
        mf_pack(&vp, f->mm.compute, MF_F64, hd, T, v + (size_t)kh * hd, MF_F64, 1, (size_t)nk);
        double *s = mf_xmalloc((size_t)T * T * sizeof(double));
        mf_matmul_packed(&mm1, q + (size_t)h * hd, T, (size_t)nq, &kp, s, (size_t)T, MF_TRI_COLS);
        for (int i = 0; i < T; i++) {
            double *row = s + (size_t)i * T;
            int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;   /* sees itself + window-1 before */
            double mx = -INFINITY;
            for (int j = j0; j <= i; j++) {
                row[j] = ra(f, ro(f, row[j] * scale));
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
                for (int j = j0; j <= i; j++) row[j] = ra(f, (float)row[j] / sum);
            }
        }
        mf_matmul_packed(&mm1, s, T, (size_t)T, &vp, ctx + (size_t)h * hd, (size_t)nq, MF_TRI_K);
        free(s);
        mf_pack_free(&kp);
        mf_pack_free(&vp);
    }
    mf_linear_apply(&f->mm, &L->o, ctx, T, out);
    (void)H;
    free(q);
    free(k);
    free(v);
    free(ctx);
}

static void dense_mlp(const fwd *f, const mf_layer *L, const double *x, double *out) {
    mf_ffn ffn = {&L->mlp_gate, &L->mlp_up, &L->mlp_down, f->c->act};
    mf_ffn_apply(&f->mm, &ffn, f->A, x, f->T, out);
}

/* The sparse MoE block: router, canonical top-k, experts grouped per expert,
 * grouped_mm combine, and Qwen2-MoE's sigmoid-gated shared expert. Records
 * the router's logits, choices and weights at slot `mi` of the result. */
static void moe(const fwd *f, const mf_layer *L, const double *x, double *out, mf_seq_result *r, int mi) {
    const mf_config *c = f->c;
    const int T = f->T, H = c->hidden, E = c->n_experts, K = c->top_k;
    double *logits = r->router + (size_t)mi * T * E;
    mf_mm mr = f->mm;
    mr.out = f->o->prec.part[MF_PART_ROUTER];
    mf_linear_apply(&mr, &L->router, x, T, logits);
    /* transformers v5: Mixtral keeps the top-k weights in fp32; OLMoE and the
     * Qwen MoEs cast them back to the activation dtype. */
    const bool fp32_weights = c->route_rule == MF_ROUTE_SOFTMAX_TOPK_RENORM;
    mf_route_spec spec = {MF_ROUTE_KIND_SOFTMAX_TOPK, E, K, c->norm_topk_prob, f->O, fp32_weights ? f->O : f->A};
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
    double *xe = mf_xmalloc((size_t)T * H * sizeof(double));
    for (int e = 0; e < E; e++) {
        const int n = d.offset[e + 1] - d.offset[e];
        if (!n) continue;
        for (int i = 0; i < n; i++)
            memcpy(xe + (size_t)i * H, x + (size_t)d.token[d.offset[e] + i] * H, (size_t)H * sizeof(double));
        mf_ffn ffn = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], c->act};
        mf_ffn_apply(&f->mm, &ffn, f->A, xe, n, y + (size_t)d.offset[e] * H);
    }
    mf_combine_spec cs = {fp32_weights ? f->O : f->A, f->O, f->A};
    mf_combine(&cs, &d, y, H, w, out);
    free(xe);
    free(y);
    mf_dispatch_free(&d);
    if (c->has_shared_expert) {
        double *s = mf_xmalloc((size_t)T * H * sizeof(double));
        double *g = r->shared_gate + (size_t)mi * T;
        mf_ffn ffn = {&L->sh_gate, &L->sh_up, &L->sh_down, c->act};
        mf_ffn_apply(&f->mm, &ffn, f->A, x, T, s);
        mf_linear_apply(&f->mm, &L->sh_router, x, T, g);
        for (int t = 0; t < T; t++) {
            g[t] = ra(f, mf_sigmoid(g[t]));
            for (int h = 0; h < H; h++) {
                size_t i = (size_t)t * H + h;
                out[i] = ra(f, out[i] + ra(f, g[t] * s[i]));
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

int mf_runtime_load(mf_model **out, const char *dir, const mf_precision *prec, mf_error *err) {
    return mf_model_load(out, dir, prec->compute, prec->weights, err);
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
    fwd f = {m, c, o, o->prec.act, o->prec.opmath, {o->prec.compute, o->prec.act, o->threads, o->numerics, o->prec.act}, T, NULL, NULL};
    r->T = T;
    r->n_moe = c->n_moe_layers;
    r->k = c->top_k;
    r->E = c->n_experts;
    r->V = V;
    r->H = H;
    if (r->n_moe) {
        r->topk_ids = mf_xcalloc((size_t)r->n_moe * T * r->k, sizeof(uint16_t));
        r->topk_w = mf_xcalloc((size_t)r->n_moe * T * r->k, sizeof(double));
        r->router = mf_xcalloc((size_t)r->n_moe * T * r->E, sizeof(double));
        if (c->has_shared_expert) r->shared_gate = mf_xcalloc((size_t)r->n_moe * T, sizeof(double));
        if (o->record_router_in) r->router_in = mf_xcalloc((size_t)r->n_moe * T * H, sizeof(double));
    }
    r->logits = mf_xmalloc((size_t)T * V * sizeof(double));

    /* RoPE tables, cast to the activation dtype as transformers does. */
    f.cos_t = mf_xmalloc((size_t)T * c->head_dim * sizeof(double));
    f.sin_t = mf_xmalloc((size_t)T * c->head_dim * sizeof(double));
    mf_rope_tables(c, &o->prec, T, f.cos_t, f.sin_t);
    for (size_t i = 0; i < (size_t)T * c->head_dim; i++) {
        f.cos_t[i] = ra(&f, f.cos_t[i]);
        f.sin_t[i] = ra(&f, f.sin_t[i]);
    }

    double *h = mf_xmalloc((size_t)T * H * sizeof(double));
    double *x = mf_xmalloc((size_t)T * H * sizeof(double));
    double *y = mf_xmalloc((size_t)T * H * sizeof(double));
    for (int t = 0; t < T; t++)   /* embedding gather, no scaling */
        for (int i = 0; i < H; i++)
            h[(size_t)t * H + i] = ra(&f, mf_round_to(m->weight_round, mf_load_as_f64(m->embed->data, m->embed->dtype,
                                                                                     (size_t)tokens[t] * H + i)));
    int mi = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const mf_layer *L = &m->layers[l];
        rmsnorm_into(&f, h, T, H, L->attn_norm, x);
        attention(&f, L, l, x, y);
        for (size_t i = 0; i < (size_t)T * H; i++) h[i] = ra(&f, h[i] + y[i]);
        rmsnorm_into(&f, h, T, H, L->ffn_norm, x);
        if (L->is_moe) {
            if (r->router_in) memcpy(r->router_in + (size_t)mi * T * H, x, (size_t)T * H * sizeof(double));
            moe(&f, L, x, y, r, mi++);
        } else {
            dense_mlp(&f, L, x, y);
        }
        for (size_t i = 0; i < (size_t)T * H; i++) h[i] = ra(&f, h[i] + y[i]);
    }
    rmsnorm(&f, h, T, H, (size_t)H, m->final_norm);
    mf_mm mh = f.mm;
    mh.out = o->prec.part[MF_PART_HEAD];
    mf_linear_apply(&mh, &m->head, h, T, r->logits);
    free(h);
    free(x);
    free(y);
    free(f.cos_t);
    free(f.sin_t);
    return MF_OK;
}
