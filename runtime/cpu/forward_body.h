/* The CPU forward pass over activations of type ACT, read top to bottom
 * like a transformers modeling file; included twice by forward.c:
 * ACT = double for fp64 runs, float for the others (every value such a run
 * stores is a bf16, fp16 or fp32 value, so a float holds it exactly, and the
 * arithmetic is the same double expressions as before, the operands widened
 * as they are read: the bits do not change, the memory halves).
 *   ACT        the activation type
 *   ACT_DTYPE  its mf_dtype (MF_F64, MF_F32), for the matrix views of K and V
 *   FN(name)   name with the type's suffix
 *   LINEAR, MATMUL, FFN, COMBINE: numerics' and experts' functions over ACT
 *   RDA(D, x)  x (an ACT expression) rounded to D, as ACT; ROA(x) the same to opmath
 * In the float form these are float operations: an operation on fp32 values
 * rounded to fp32 is the double operation rounded once (53 >= 2 x 24 + 2
 * bits), and rounded on to bf16 or fp16 it is the double result rounded
 * once when the operands are bf16 (fp16) values themselves, which they are
 * at every such place (the part's inputs and weights are of its dtype). */

/* A product whose result the run keeps as doubles (router logits, shared gates, logits) */
static void FN(linear_to_f64)(const mf_mm *mm, const mf_linear *L, const ACT *x, int M, double *y) {
#if ACT_IS_DOUBLE
    LINEAR(mm, L, x, M, y);
#else
    ACT *t = mf_xmalloc((size_t)M * L->out * sizeof(ACT));
    LINEAR(mm, L, x, M, t);
    for (size_t i = 0; i < (size_t)M * L->out; i++) y[i] = t[i];
    free(t);
#endif
}

/* Elementwise loops are shared between threads from this many values on. */
#define PAR_ELEMS 32768

static void FN(cast)(mf_dtype D, ACT *x, size_t n) {
    if (D == MF_F64 || (D == MF_F32 && !ACT_IS_DOUBLE)) return;   /* the values are of D already */
#pragma omp parallel for schedule(static) if (n >= PAR_ELEMS)
    for (size_t i = 0; i < n; i++) x[i] = RDA(D, x[i]);
}

/* h = round_S(h + round_S(y)): the residual add */
static void FN(residual)(mf_dtype S, ACT *h, const ACT *y, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_ELEMS)
    for (size_t i = 0; i < n; i++) h[i] = RDA(S, h[i] + RDA(S, y[i]));
}

/* RMSNorm over rows of n values (row stride ld), Llama cast points:
 * y32 = x32 * rsqrt(mean(x32^2) + eps); out = w * y32.to(input dtype). */
static void FN(rmsnorm)(const fwd *f, mf_dtype D, ACT *x, int rows, int n, size_t ld, const double *w) {
    const double eps = ro(f, f->c->rms_eps);
#pragma omp parallel for num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)rows * n >= 16384)
    for (int r = 0; r < rows; r++) {
        ACT *v = x + (size_t)r * ld;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
        double var = ro(f, ss / n);
        double inv = f->O == MF_F64 ? 1.0 / sqrt(var + eps) : (double)(1.0f / sqrtf((float)(var + eps)));
        const ACT inva = (ACT)inv;
        for (int i = 0; i < n; i++) v[i] = RDA(D, (ACT)w[i] * RDA(D, ROA(v[i] * inva)));
    }
}

/* A norm module: inputs cast to its dtype D, output cast to the stream dtype S. */
static void FN(norm_module)(const fwd *f, mf_dtype D, mf_dtype S, const ACT *x, int rows, int n, const double *w,
                            ACT *out) {
#pragma omp parallel for schedule(static) if ((size_t)rows * n >= PAR_ELEMS)
    for (size_t i = 0; i < (size_t)rows * n; i++) out[i] = RDA(D, x[i]);
    FN(rmsnorm)(f, D, out, rows, n, (size_t)n, w);
    FN(cast)(S, out, (size_t)rows * n);
}

/* q' = q*cos + rotate_half(q)*sin, three roundings, on `heads` heads of a row. */
static void FN(rope)(const fwd *f, mf_dtype D, ACT *x, int heads, size_t row_stride, const ACT *cos_t,
                     const ACT *sin_t) {
    const int hd = f->c->head_dim, half = hd / 2;
#pragma omp parallel for num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)f->T * heads * hd >= 16384)
    for (int t = 0; t < f->T; t++) {
        ACT tmp[hd];
        const ACT *cs = cos_t + (size_t)t * hd, *sn = sin_t + (size_t)t * hd;
        for (int h = 0; h < heads; h++) {
            ACT *v = x + (size_t)t * row_stride + (size_t)h * hd;
            for (int i = 0; i < hd; i++) {
                const ACT rot = i < half ? -v[i + half] : v[i - half];
                tmp[i] = RDA(D, RDA(D, v[i] * cs[i]) + RDA(D, rot * sn[i]));
            }
            memcpy(v, tmp, sizeof tmp);
        }
    }
}

/* Eager attention computing in D: S = (Q K^T) * scale, causal (and sliding)
 * mask, softmax in fp32 opmath, P V; each step rounded to D. x holds D values. */
/* The T new positions start at f->pos: their keys and values go into the
 * layer's cache kc, vc ([positions][nk]) after those of the positions before,
 * and the queries attend to all of them: a prompt from position 0 (causal
 * within it), or one token against the cache. Either way each score, weight
 * and output is the same chain of the same values as in one pass over the
 * whole sequence. */
static void FN(attention)(const fwd *f, mf_dtype D, const mf_layer *L, int layer, const ACT *x, ACT *out,
                          const ACT *cos_t, const ACT *sin_t, ACT *kc, ACT *vc) {
    const mf_config *c = f->c;
    const int T = f->T, P0 = f->pos, Tc = P0 + T, H = c->hidden, hd = c->head_dim, nh = c->n_heads;
    const int nkv = c->n_kv_heads;
    const int nq = nh * hd, nk = nkv * hd, group = nh / nkv;
    ACT *q = mf_xmalloc((size_t)T * nq * sizeof(ACT));
    ACT *k = kc + (size_t)P0 * nk;
    ACT *v = vc + (size_t)P0 * nk;
    ACT *ctx = mf_xmalloc((size_t)T * nq * sizeof(ACT));
    const mf_mm mm = mm_in(f, D);
    LINEAR(&mm, &L->q, x, T, q);
    LINEAR(&mm, &L->k, x, T, k);
    LINEAR(&mm, &L->v, x, T, v);
    if (c->qk_norm == MF_QK_NORM_FULL) {
        FN(rmsnorm)(f, D, q, T, nq, (size_t)nq, L->q_norm);
        FN(rmsnorm)(f, D, k, T, nk, (size_t)nk, L->k_norm);
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
        FN(rmsnorm)(f, D, q, T * nh, hd, (size_t)hd, L->q_norm);
        FN(rmsnorm)(f, D, k, T * nkv, hd, (size_t)hd, L->k_norm);
    }
    FN(rope)(f, D, q, nh, (size_t)nq, cos_t, sin_t);
    FN(rope)(f, D, k, nkv, (size_t)nk, cos_t, sin_t);
    const double scale = ro(f, pow((double)hd, -0.5));   /* head_dim ** -0.5, a Python float */
    const ACT scalea = (ACT)scale;
    const int window = c->layer_sliding[layer] ? c->sliding_window : 0;
    mf_mm mm1 = mm;
    mm1.threads = 1;   /* heads run in parallel instead */
#pragma omp parallel for schedule(dynamic) num_threads(f->o->threads) if (f->o->threads > 1 && nh > 1)
    for (int h = 0; h < nh; h++) {
        const int kh = h / group;
        /* K_kh [Tc, hd] and V_kh^T [hd, Tc] read in place, from the cache */
        const mf_mat kp = {kc + (size_t)kh * hd, ACT_DTYPE, Tc, hd, (size_t)nk, 1};
        const mf_mat vp = {vc + (size_t)kh * hd, ACT_DTYPE, hd, Tc, 1, (size_t)nk};
        ACT *s = mf_xmalloc((size_t)T * Tc * sizeof(ACT));
        /* from position 0 the scores are causal within the new rows; one row against the cache sees all of it */
        MATMUL(&mm1, q + (size_t)h * hd, T, (size_t)nq, &kp, s, (size_t)Tc, P0 == 0 ? MF_TRI_COLS : MF_TRI_NONE);
        for (int r = 0; r < T; r++) {
            const int i = P0 + r;   /* the row's position */
            ACT *row = s + (size_t)r * Tc;
            int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;   /* sees itself + window-1 before */
            double mx = -INFINITY;
            for (int j = j0; j <= i; j++) {
                row[j] = RDA(D, ROA(row[j] * scalea));
                mx = row[j] > mx ? row[j] : mx;
            }
            for (int j = 0; j < j0; j++) row[j] = 0;
            for (int j = i + 1; j < Tc; j++) row[j] = 0;
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
        /* P V: a row's weights past its position are zeros (TRI_K leaves them out: the same sums) */
        MATMUL(&mm1, s, T, (size_t)Tc, &vp, ctx + (size_t)h * hd, (size_t)nq, P0 == 0 ? MF_TRI_K : MF_TRI_NONE);
        free(s);
    }
    LINEAR(&mm, &L->o, ctx, T, out);
    (void)H;
    free(q);
    free(ctx);
}

static void FN(dense_mlp)(const fwd *f, mf_dtype D, const mf_layer *L, const ACT *x, ACT *out) {
    mf_ffn ffn = {&L->mlp_gate, &L->mlp_up, &L->mlp_down, f->c->act};
    const mf_mm mm = mm_in(f, D);
    FFN(&mm, &ffn, D, x, f->T, out);
}

/* The sparse MoE block computing in D, its router in DR: router, canonical
 * top-k, experts grouped per expert, grouped_mm combine, and Qwen2-MoE's
 * sigmoid-gated shared expert. Records the router's logits, choices and
 * weights at slot `mi` of the result. x holds D values. */
static void FN(moe)(const fwd *f, mf_dtype D, mf_dtype DR, const mf_layer *L, const ACT *x, ACT *out,
                    mf_seq_result *r, int mi) {
    const mf_config *c = f->c;
    const int T = f->T, H = c->hidden, E = c->n_experts, K = c->top_k;
    double *logits = r->router + (size_t)mi * T * E;
    const mf_mm mm = mm_in(f, D), mr = mm_in(f, DR);
    FN(linear_to_f64)(&mr, &L->router, x, T, logits);
    /* transformers v5: Mixtral keeps the top-k weights in fp32; OLMoE and the
     * Qwen MoEs cast them to the router logits' dtype. A product y * w of two
     * dtypes is computed in the wider one (fp32 opmath). */
    const mf_dtype wdt = c->route_rule == MF_ROUTE_SOFTMAX_TOPK_RENORM ? f->O : DR;
    mf_route_spec spec = {MF_ROUTE_KIND_SOFTMAX_TOPK, E, K, c->norm_topk_prob, f->O, wdt};
    uint16_t *ids = r->topk_ids + (size_t)mi * T * K;
    double *w = r->topk_w + (size_t)mi * T * K;
#pragma omp parallel num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)T * E >= 8192)
    {
        double *probs = mf_xmalloc((size_t)E * sizeof(double));
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            mf_route_out ro_ = {ids + (size_t)t * K, w + (size_t)t * K, 0, 0, false};
            mf_route(&spec, logits + (size_t)t * E, probs, &ro_);
        }
        free(probs);
    }
    /* routing replay: the source's experts at the replayed positions, in its rank order, with its weights
     * (rounded to the dtype this model applies them in) or this router's own for those experts */
    const mf_replay *rp = f->o->replay;
    if (rp && f->replay_n > 0 && (!rp->layers || rp->layers[mi])) {
        double *probs = mf_xmalloc((size_t)E * sizeof(double));
        for (int t = 0; t < f->replay_n; t++) {
            const size_t src = ((size_t)mi * rp->len + (size_t)(f->pos + t)) * K;
            memcpy(ids + (size_t)t * K, rp->ids + src, (size_t)K * sizeof *ids);
            if (rp->weights) {
                for (int i = 0; i < K; i++) w[(size_t)t * K + i] = rd(wdt, rp->weights[src + i]);
            } else {
                mf_softmax(logits + (size_t)t * E, E, spec.opmath, probs);
                mf_route_weights(&spec, probs, ids + (size_t)t * K, w + (size_t)t * K);
            }
        }
        free(probs);
    }
    mf_dispatch d;
    mf_dispatch_build(&d, ids, T, K, E);
    ACT *y = mf_xmalloc((size_t)T * K * H * sizeof(ACT));
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
        ACT *xe = mf_xmalloc((size_t)T * H * sizeof(ACT));
#pragma omp for schedule(dynamic, 1)
        for (int e = 0; e < E; e++) {
            const int n = d.offset[e + 1] - d.offset[e];
            if (!n) continue;
            for (int i = 0; i < n; i++)
                memcpy(xe + (size_t)i * H, x + (size_t)d.token[d.offset[e] + i] * H, (size_t)H * sizeof(ACT));
            mf_ffn ffn = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], c->act};
            FFN(&mme, &ffn, D, xe, n, y + (size_t)d.offset[e] * H);
        }
        free(xe);
    }
    mf_combine_spec cs = {wdt == D ? D : f->O, f->O, D};
    COMBINE(&cs, &d, y, H, w, out);
    free(y);
    mf_dispatch_free(&d);
    if (c->has_shared_expert) {
        ACT *s = mf_xmalloc((size_t)T * H * sizeof(ACT));
        double *g = r->shared_gate + (size_t)mi * T;
        mf_ffn ffn = {&L->sh_gate, &L->sh_up, &L->sh_down, c->act};
        FFN(&mm, &ffn, D, x, T, s);
        FN(linear_to_f64)(&mm, &L->sh_router, x, T, g);
        for (int t = 0; t < T; t++) {
            g[t] = rd(D, mf_sigmoid(g[t]));
            for (int h = 0; h < H; h++) {
                size_t i = (size_t)t * H + h;
                out[i] = RDA(D, out[i] + RDA(D, (ACT)g[t] * s[i]));
            }
        }
        free(s);
    }
}

/* T new tokens at the session's positions sn->pos .. + T - 1 */
static int FN(step)(mf_cpu_session *sn, const int32_t *tokens, int T, mf_seq_result *r, mf_error *err) {
    const mf_model *m = sn->m;
    const mf_run_opts *o = &sn->o;
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
    fwd f = {m, c, o, P->act, P->opmath, {P->compute, P->act, o->threads, o->numerics, P->act}, T, sn->pos, 0};
    f.replay_n = replay_positions(sn, tokens, T);
    mf_seq_result_shape(r, c, T);
    if (r->n_moe) {
        r->topk_ids = mf_xcalloc((size_t)r->n_moe * T * r->k, sizeof(uint16_t));
        r->topk_w = mf_xcalloc((size_t)r->n_moe * T * r->k, sizeof(double));
        r->router = mf_xcalloc((size_t)r->n_moe * T * r->E, sizeof(double));
        if (c->has_shared_expert) r->shared_gate = mf_xcalloc((size_t)r->n_moe * T, sizeof(double));
        if (o->record_router_in) r->router_in = mf_xcalloc((size_t)r->n_moe * T * H, sizeof(double));
    }
    r->logits = mf_xmalloc((size_t)T * V * sizeof(double));

    /* RoPE tables of the new positions, cast to the model's dtype as the rotary
     * module does (parts computing in fp32 take these values as they are):
     * the tables of positions 0 .. pos + T - 1, whose rows for a position do
     * not depend on the length but for dynamic NTK scaling, where transformers
     * computes them for the length so far at every step */
    const int hd = c->head_dim, Tc = sn->pos + T;
    const size_t TD = (size_t)Tc * hd;
    double *cs64 = mf_xmalloc(TD * sizeof(double)), *sn64 = mf_xmalloc(TD * sizeof(double));
    mf_rope_tables(c, P, Tc, cs64, sn64);
    ACT *cos_t = mf_xmalloc((size_t)T * hd * sizeof(ACT)), *sin_t = mf_xmalloc((size_t)T * hd * sizeof(ACT));
    for (size_t i = 0; i < (size_t)T * hd; i++) {
        cos_t[i] = (ACT)rd(f.R, cs64[(size_t)sn->pos * hd + i]);
        sin_t[i] = (ACT)rd(f.R, sn64[(size_t)sn->pos * hd + i]);
    }
    free(cs64);
    free(sn64);

    const size_t TH = (size_t)T * H;
    ACT *h = mf_xmalloc(TH * sizeof(ACT));
    ACT *x = mf_xmalloc(TH * sizeof(ACT));
    ACT *y = mf_xmalloc(TH * sizeof(ACT));
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
        FN(norm_module)(&f, DN, S, h, T, H, L->attn_norm, x);
        FN(cast)(DA, x, TH);
        FN(attention)(&f, DA, L, l, x, y, cos_t, sin_t, (ACT *)sn->kc[sn->keep ? l : 0], (ACT *)sn->vc[sn->keep ? l : 0]);
        FN(residual)(S, h, y, TH);
        FN(norm_module)(&f, DN, S, h, T, H, L->ffn_norm, x);
        FN(cast)(DM, x, TH);
        if (L->is_moe) {
            if (r->router_in)
                for (size_t i = 0; i < TH; i++) r->router_in[(size_t)mi * TH + i] = x[i];
            FN(moe)(&f, DM, DM == MF_F32 ? MF_F32 : DR, L, x, y, r, mi++);
        } else {
            FN(dense_mlp)(&f, DM, L, x, y);
        }
        FN(residual)(S, h, y, TH);
        FN(cast)(f.R, h, TH);   /* the layer's output, back in the stream's dtype */
    }
    FN(norm_module)(&f, P->part[MF_PART_NORM], f.R, h, T, H, m->final_norm, x);
    const mf_dtype DH = P->part[MF_PART_HEAD];
    FN(cast)(DH, x, TH);
    const mf_mm mh = mm_in(&f, DH);
    FN(linear_to_f64)(&mh, &m->head, x, T, r->logits);
    free(h);
    free(x);
    free(y);
    free(cos_t);
    free(sin_t);
    sn->pos += T;
    return MF_OK;
}
