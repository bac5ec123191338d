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
static void FN(rmsnorm_eps)(const fwd *f, mf_dtype D, ACT *x, int rows, int n, size_t ld, const double *w,
                            double eps_cfg) {
    const double eps = ro(f, eps_cfg);
#pragma omp parallel for num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)rows * n >= 16384)
    for (int r = 0; r < rows; r++) {
        ACT *v = x + (size_t)r * ld;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
        double var = ro(f, ss / n);
        double inv = f->O == MF_F64 ? 1.0 / sqrt(var + eps) : (double)(1.0f / sqrtf((float)(var + eps)));
        const ACT inva = (ACT)inv;
        if (f->c->norm_weight_fp32)   /* gpt-oss: (weight * hidden32).to(input dtype), one rounding */
            for (int i = 0; i < n; i++) v[i] = RDA(D, ROA((ACT)w[i] * ROA(v[i] * inva)));
        else
            for (int i = 0; i < n; i++) v[i] = RDA(D, (ACT)w[i] * RDA(D, ROA(v[i] * inva)));
    }
}

static void FN(rmsnorm)(const fwd *f, mf_dtype D, ACT *x, int rows, int n, size_t ld, const double *w) {
    FN(rmsnorm_eps)(f, D, x, rows, n, ld, w, f->c->rms_eps);
}

/* A norm module: inputs cast to its dtype D, output cast to the stream dtype S. */
static void FN(norm_module)(const fwd *f, mf_dtype D, mf_dtype S, const ACT *x, int rows, int n, const double *w,
                            ACT *out) {
#pragma omp parallel for schedule(static) if ((size_t)rows * n >= PAR_ELEMS)
    for (size_t i = 0; i < (size_t)rows * n; i++) out[i] = RDA(D, x[i]);
    FN(rmsnorm)(f, D, out, rows, n, (size_t)n, w);
    FN(cast)(S, out, (size_t)rows * n);
}

/* RoPE on `heads` heads of each of the T rows (row_stride apart, heads head_stride apart), on the rope_dim
 * dims from `off` within a head; the tables hold rope_dim values a position (cat(freqs, freqs)).
 *   MF_ROPE_HALF:         q' = q*cos + rotate_half(q)*sin, three roundings
 *   MF_ROPE_DEINTERLEAVE: the same on (q0, q2, ..., q1, q3, ...) (apply_rotary_pos_emb_interleave), left in that order
 *   MF_ROPE_COMPLEX:      pairs (q2i, q2i+1) times cos + i sin in fp32 opmath (products, then their sum, each
 *                         rounded as PyTorch's complex<float> multiply does), written back in place, one rounding */
static void FN(rope)(const fwd *f, mf_dtype D, ACT *x, int heads, size_t row_stride, size_t head_stride, int off,
                     const ACT *cos_t, const ACT *sin_t) {
    const int rdim = f->c->rope_dim, half = rdim / 2;
    const mf_rope_style style = f->c->rope_style;
#pragma omp parallel for num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)f->T * heads * rdim >= 16384)
    for (int t = 0; t < f->T; t++) {
        ACT tmp[rdim], in[rdim];
        const ACT *cs = cos_t + (size_t)t * rdim, *sn = sin_t + (size_t)t * rdim;
        for (int h = 0; h < heads; h++) {
            ACT *v = x + (size_t)t * row_stride + (size_t)h * head_stride + off;
            if (style == MF_ROPE_COMPLEX) {
                for (int i = 0; i < half; i++) {
                    const ACT a = v[2 * i], b = v[2 * i + 1], c = cs[i], s = sn[i];
                    tmp[2 * i] = RDA(D, ROA(ROA(a * c) - ROA(b * s)));
                    tmp[2 * i + 1] = RDA(D, ROA(ROA(a * s) + ROA(b * c)));
                }
                memcpy(v, tmp, sizeof tmp);
                continue;
            }
            if (style == MF_ROPE_DEINTERLEAVE)
                for (int i = 0; i < half; i++) {
                    in[i] = v[2 * i];
                    in[half + i] = v[2 * i + 1];
                }
            else
                memcpy(in, v, sizeof in);
            for (int i = 0; i < rdim; i++) {
                const ACT rot = i < half ? -in[i + half] : in[i - half];
                tmp[i] = RDA(D, RDA(D, in[i] * cs[i]) + RDA(D, rot * sn[i]));
            }
            memcpy(v, tmp, sizeof tmp);
        }
    }
}

/* Scores, mask, softmax and weighted values of the T new rows against the cache, head by head, computing in D:
 * S = (Q K^T) * scale, causal (and sliding) mask, softmax in fp32 opmath, P V; each step rounded to D. With sinks
 * (gpt-oss), head h's row gains the logit sinks[h] as a last column, dropped after the softmax: the row less its
 * maximum (a D tensor: each difference rounded to D), then softmax in opmath rounded to D. Head h
 * reads its query at q + h * qk_dim (rows q_stride apart), key head h / group at kc + kh * qk_dim (rows k_stride
 * apart), value head at vc + kh * v_dim (rows v_stride apart), and writes ctx + h * v_dim (rows nh * v_dim). */
static void FN(attn_core)(const fwd *f, mf_dtype D, const ACT *q, size_t q_stride, const ACT *kc, size_t k_stride,
                          const ACT *vc, size_t v_stride, int nh, int group, int qk_dim, int v_dim, double scale_py,
                          int window, const double *sinks, ACT *ctx) {
    const int T = f->T, P0 = f->pos, Tc = P0 + T;
    const mf_mm mm = mm_in(f, D);
    const double scale = ro(f, scale_py);   /* a Python float, an fp32 scalar in fp32 opmath */
    const ACT scalea = (ACT)scale;
    mf_mm mm1 = mm;
    mm1.threads = 1;   /* heads run in parallel instead */
#pragma omp parallel for schedule(dynamic) num_threads(f->o->threads) if (f->o->threads > 1 && nh > 1)
    for (int h = 0; h < nh; h++) {
        const int kh = h / group;
        /* K_kh [Tc, qk_dim] and V_kh^T [v_dim, Tc] read in place, from the cache */
        const mf_mat kp = {.data = kc + (size_t)kh * qk_dim, .dtype = ACT_DTYPE, .n = Tc, .k = qk_dim,
                           .rs = k_stride, .cs = 1};
        const mf_mat vp = {.data = vc + (size_t)kh * v_dim, .dtype = ACT_DTYPE, .n = v_dim, .k = Tc,
                           .rs = 1, .cs = v_stride};
        ACT *s = mf_xmalloc((size_t)T * Tc * sizeof(ACT));
        /* from position 0 the scores are causal within the new rows; one row against the cache sees all of it */
        MATMUL(&mm1, q + (size_t)h * qk_dim, T, q_stride, &kp, s, (size_t)Tc, P0 == 0 ? MF_TRI_COLS : MF_TRI_NONE);
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
            if (sinks) {   /* eager_attention_forward of gpt-oss: cat(scores, sink) - max, softmax, drop the sink */
                const double sk = sinks[h];
                mx = sk > mx ? sk : mx;
                for (int j = j0; j <= i; j++) row[j] = RDA(D, row[j] - (ACT)mx);
                const double skd = rd(D, sk - mx);
                if (f->O == MF_F64) {
                    double sum = 0;
                    for (int j = j0; j <= i; j++) sum += (row[j] = exp(row[j]));
                    sum += exp(skd);
                    for (int j = j0; j <= i; j++) row[j] /= sum;
                } else {
                    float sum = 0;
                    for (int j = j0; j <= i; j++) {
                        float e = (float)exp((double)(float)row[j]);
                        row[j] = e;
                        sum += e;
                    }
                    sum += (float)exp((double)(float)skd);
                    for (int j = j0; j <= i; j++) row[j] = rd(D, (float)row[j] / sum);
                }
                continue;
            }
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
        MATMUL(&mm1, s, T, (size_t)Tc, &vp, ctx + (size_t)h * v_dim, (size_t)nh * v_dim, P0 == 0 ? MF_TRI_K : MF_TRI_NONE);
        free(s);
    }
}

/* Eager attention computing in D (attn_core), x holding D values: q/k/v
 * projections, the q/k norms and clamps, RoPE. The T new positions start at
 * f->pos: their keys and values go into the layer's cache kc, vc
 * ([positions][nk]) after those of the positions before, and the queries
 * attend to all of them: a prompt from position 0 (causal within it), or one
 * token against the cache. Either way each score, weight and output is the
 * same chain of the same values as in one pass over the whole sequence. */
static void FN(attention)(const fwd *f, mf_dtype D, const mf_layer *L, int layer, const ACT *x, ACT *out,
                          const ACT *cos_t, const ACT *sin_t, ACT *kc, ACT *vc) {
    const mf_config *c = f->c;
    const int T = f->T, P0 = f->pos, H = c->hidden, hd = c->head_dim, nh = c->n_heads;
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
    FN(rope)(f, D, q, nh, (size_t)nq, (size_t)hd, 0, cos_t, sin_t);
    FN(rope)(f, D, k, nkv, (size_t)nk, (size_t)hd, 0, cos_t, sin_t);
    const int window = c->layer_sliding[layer] ? c->sliding_window : 0;
    FN(attn_core)(f, D, q, (size_t)nq, kc, (size_t)nk, vc, (size_t)nk, nh, group, hd, hd,
                  c->attn_scale > 0 ? c->attn_scale : pow((double)hd, -0.5), window, L->sinks, ctx);
    LINEAR(&mm, &L->o, ctx, T, out);
    (void)H;
    free(q);
    free(ctx);
}

/* DeepSeek's multi-head latent attention computing in D (DeepseekV3Attention, DeepseekV2Attention):
 *   q = q_b(q_a_layernorm(q_a(x))) (or q_proj(x)), per head [nope | rope]
 *   kv_a(x) = [c | k_rope]; kv_b(kv_a_layernorm(c)) per head [k_nope | v]; k_rope shared by every head
 *   RoPE on q's rope part and k_rope; K = [k_nope | k_rope], V = v; softmax scale as the config gives it.
 * The two low-rank norms use transformers' class default eps 1e-6, not rms_norm_eps. The cache holds K rows
 * [heads x (nope + rope)] and V rows [heads x v]. */
static void FN(mla_attention)(const fwd *f, mf_dtype D, const mf_layer *L, const ACT *x, ACT *out, const ACT *cos_t,
                              const ACT *sin_t, ACT *kc, ACT *vc) {
    const mf_config *c = f->c;
    const int T = f->T, P0 = f->pos, nh = c->n_heads, nope = c->qk_nope_dim, rope = c->qk_rope_dim;
    const int qk = nope + rope, vd = c->v_head_dim, kvr = c->kv_lora_rank, kvw = kvr + rope, kvb = nope + vd;
    const size_t nq = (size_t)nh * qk, nv = (size_t)nh * vd;
    const mf_mm mm = mm_in(f, D);
    ACT *q = mf_xmalloc((size_t)T * nq * sizeof(ACT));
    if (c->q_lora_rank > 0) {
        const int qr = c->q_lora_rank;
        ACT *qa = mf_xmalloc((size_t)T * qr * sizeof(ACT));
        LINEAR(&mm, &L->q_a, x, T, qa);
        FN(rmsnorm_eps)(f, D, qa, T, qr, (size_t)qr, L->q_a_norm, 1e-6);
        LINEAR(&mm, &L->q_b, qa, T, q);
        free(qa);
    } else {
        LINEAR(&mm, &L->q, x, T, q);
    }
    ACT *ckv = mf_xmalloc((size_t)T * kvw * sizeof(ACT));
    LINEAR(&mm, &L->kv_a, x, T, ckv);
    ACT *cn = mf_xmalloc((size_t)T * kvr * sizeof(ACT));
    for (int t = 0; t < T; t++) memcpy(cn + (size_t)t * kvr, ckv + (size_t)t * kvw, (size_t)kvr * sizeof(ACT));
    FN(rmsnorm_eps)(f, D, cn, T, kvr, (size_t)kvr, L->kv_a_norm, 1e-6);
    ACT *kv = mf_xmalloc((size_t)T * nh * kvb * sizeof(ACT));
    LINEAR(&mm, &L->kv_b, cn, T, kv);
    FN(rope)(f, D, q, nh, nq, (size_t)qk, nope, cos_t, sin_t);
    FN(rope)(f, D, ckv, 1, (size_t)kvw, 0, kvr, cos_t, sin_t);
    ACT *k = kc + (size_t)P0 * nq, *v = vc + (size_t)P0 * nv;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const ACT *src = kv + ((size_t)t * nh + h) * kvb;
            memcpy(k + (size_t)t * nq + (size_t)h * qk, src, (size_t)nope * sizeof(ACT));
            memcpy(k + (size_t)t * nq + (size_t)h * qk + nope, ckv + (size_t)t * kvw + kvr, (size_t)rope * sizeof(ACT));
            memcpy(v + (size_t)t * nv + (size_t)h * vd, src + nope, (size_t)vd * sizeof(ACT));
        }
    ACT *ctx = mf_xmalloc((size_t)T * nv * sizeof(ACT));
    FN(attn_core)(f, D, q, nq, kc, nq, vc, nv, nh, 1, qk, vd, c->attn_scale, 0, NULL, ctx);
    LINEAR(&mm, &L->o, ctx, T, out);
    free(q);
    free(ckv);
    free(cn);
    free(kv);
    free(ctx);
}

static void FN(dense_mlp)(const fwd *f, mf_dtype D, const mf_layer *L, const ACT *x, ACT *out) {
    mf_ffn ffn = {&L->mlp_gate, &L->mlp_up, &L->mlp_down, f->c->act, false, 0, 0};
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
    /* DeepSeek's and GLM's routers compute in fp32 whatever the model's dtype (F.linear of x and W cast to
     * fp32), and keep the weights in fp32; so does Mixtral's renormalisation. OLMoE and the Qwen MoEs cast their
     * weights to the router logits' dtype. A product y * w of two dtypes is computed in the wider one (fp32
     * opmath). */
    const bool deepseek = c->route_rule == MF_ROUTE_SIGMOID_GROUP || c->route_rule == MF_ROUTE_SOFTMAX_GREEDY;
    if (deepseek) DR = f->O;
    const mf_mm mm = mm_in(f, D), mr = mm_in(f, DR);
    FN(linear_to_f64)(&mr, &L->router, x, T, logits);
    /* gpt-oss: F.linear(x, W, b) in the router's dtype, softmax over the top k in that dtype too */
    const mf_dtype wdt = c->route_rule == MF_ROUTE_SOFTMAX_TOPK_RENORM || deepseek ? f->O : DR;
    const mf_route_kind kind = c->route_rule == MF_ROUTE_SIGMOID_GROUP    ? MF_ROUTE_KIND_SIGMOID_GROUP
                               : c->route_rule == MF_ROUTE_SOFTMAX_GREEDY ? MF_ROUTE_KIND_SOFTMAX_GREEDY
                               : c->route_rule == MF_ROUTE_TOPK_SOFTMAX   ? MF_ROUTE_KIND_TOPK_SOFTMAX
                                                                          : MF_ROUTE_KIND_SOFTMAX_TOPK;
    mf_route_spec spec = {kind, E, K, c->norm_topk_prob, f->O, wdt, c->n_group, c->topk_group, c->group_limited,
                          L->e_bias, c->routed_scaling};
    uint16_t *ids = r->topk_ids + (size_t)mi * T * K;
    double *w = r->topk_w + (size_t)mi * T * K;
    double *sel = r->select ? r->select + (size_t)mi * T * E : NULL;
#pragma omp parallel num_threads(f->o->threads) if (f->o->threads > 1 && (size_t)T * E >= 8192)
    {
        double *probs = mf_xmalloc((size_t)E * sizeof(double));
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            mf_route_out ro_ = {ids + (size_t)t * K, w + (size_t)t * K, 0, 0, false, sel ? sel + (size_t)t * E : NULL};
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
            } else if (kind == MF_ROUTE_KIND_TOPK_SOFTMAX) {
                mf_route_weights_logits(&spec, logits + (size_t)t * E, ids + (size_t)t * K, w + (size_t)t * K);
            } else {
                mf_route_scores(&spec, logits + (size_t)t * E, probs);
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
            mf_ffn ffn = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], c->act, c->clamped_swiglu, c->swiglu_alpha,
                          c->swiglu_limit};
            FFN(&mme, &ffn, D, xe, n, y + (size_t)d.offset[e] * H);
        }
        free(xe);
    }
    mf_combine_spec cs = {wdt == D ? D : f->O, f->O, D};
    COMBINE(&cs, &d, y, H, w, out);
    free(y);
    mf_dispatch_free(&d);
    if (c->n_shared_experts > 0) {   /* DeepseekV3MoE: routed + shared_experts(x), one addition in D */
        ACT *s = mf_xmalloc((size_t)T * H * sizeof(ACT));
        mf_ffn ffn = {&L->sh_gate, &L->sh_up, &L->sh_down, c->act, false, 0, 0};
        FFN(&mm, &ffn, D, x, T, s);
        for (size_t i = 0; i < (size_t)T * H; i++) out[i] = RDA(D, out[i] + s[i]);
        free(s);
    }
    if (c->has_shared_expert) {
        ACT *s = mf_xmalloc((size_t)T * H * sizeof(ACT));
        double *g = r->shared_gate + (size_t)mi * T;
        mf_ffn ffn = {&L->sh_gate, &L->sh_up, &L->sh_down, c->act, false, 0, 0};
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
        if (c->route_rule == MF_ROUTE_SIGMOID_GROUP || c->route_rule == MF_ROUTE_SOFTMAX_GREEDY ||
            c->route_rule == MF_ROUTE_TOPK_SOFTMAX)
            r->select = mf_xcalloc((size_t)r->n_moe * T * r->E, sizeof(double));
        if (o->record_router_in) r->router_in = mf_xcalloc((size_t)r->n_moe * T * H, sizeof(double));
    }
    r->logits = mf_xmalloc((size_t)T * V * sizeof(double));

    /* RoPE tables of the new positions, cast to the model's dtype as the rotary
     * module does (parts computing in fp32 take these values as they are):
     * the tables of positions 0 .. pos + T - 1, whose rows for a position do
     * not depend on the length but for dynamic NTK scaling, where transformers
     * computes them for the length so far at every step */
    const int rdim = c->rope_dim > 0 ? c->rope_dim : c->head_dim, Tc = sn->pos + T;
    const size_t TD = (size_t)Tc * rdim;
    double *cs64 = mf_xmalloc(TD * sizeof(double)), *sn64 = mf_xmalloc(TD * sizeof(double));
    mf_rope_tables(c, P, Tc, cs64, sn64);
    ACT *cos_t = mf_xmalloc((size_t)T * rdim * sizeof(ACT)), *sin_t = mf_xmalloc((size_t)T * rdim * sizeof(ACT));
    /* DeepSeek-V2's rotary module hands over complex64 freqs_cis: its tables stay in fp32 (opmath) */
    const mf_dtype TD_ = c->rope_style == MF_ROPE_COMPLEX ? f.O : f.R;
    for (size_t i = 0; i < (size_t)T * rdim; i++) {
        cos_t[i] = (ACT)rd(TD_, cs64[(size_t)sn->pos * rdim + i]);
        sin_t[i] = (ACT)rd(TD_, sn64[(size_t)sn->pos * rdim + i]);
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
        ACT *kc = (ACT *)sn->kc[sn->keep ? l : 0], *vc = (ACT *)sn->vc[sn->keep ? l : 0];
        if (c->attn == MF_ATTN_MLA) FN(mla_attention)(&f, DA, L, x, y, cos_t, sin_t, kc, vc);
        else FN(attention)(&f, DA, L, l, x, y, cos_t, sin_t, kc, vc);
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
