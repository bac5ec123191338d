/* The forward pass on a GPU, host side (C17): the CPU executor's sequence
 * of steps (runtime/cpu/forward.c), each one a kernel of kernels.cu or
 * gemm.cu on one stream. Built once per backend (MF_GPU_BACKEND_CUDA or
 * _HIP) into its module, the symbols named by GPU_FN.
 *
 * Weights are on the device once, in the dtype the model keeps them in
 * (upload.c); products that need fp32 operands widen them as they read them.
 * Routing, dispatch and the experts run on the device, so
 * the device never waits for the host: each MoE layer's routing leaves on a
 * second stream as the layer finishes, and the host waits only for copies. */
#include "gpu_host.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the module interface this module was built for (mf_core.h) */
MF_MODULE_ABI_DEFINE;

static const char *const prof_names[P_N] = {
    "norms+residuals", "q,k,v", "qk norm", "rope", "q.k", "softmax", "p.v", "o", "router", "route", "dispatch",
    "gather", "experts", "combine", "shared expert", "dense mlp", "head", "copy out"};

static void mark(gpu *G, int part) {
    if (!G->prof) return;
    char m[256];
    GPU_FN(sync)(G->ctx, m, sizeof m);
    const double now = mf_now();
    G->prof_t[part] += now - G->prof_last;
    G->prof_last = now;
}

static int gpu_fail(gpu *G, mf_error *err, const char *what) {
    return mf_fail(err, MF_EIO, "%s: %s: %s", G->desc, what, G->msg);
}

/* ---- weights ---------------------------------------------------------- */

/* The weight as B of a product with operands of fmt on an engine: its one copy where the dtype is fmt's, or
 * where the engine widens as it reads (*b_fmt set for a 16-bit weight under fp32 operands; *q for a
 * block-scaled one, *B then NULL); for cuBLAS, which reads only operands of its own dtype, the weight's
 * values in the scratch G->wide (one weight at a time). False when the weight cannot be such operands. */
static bool weight_as(gpu *G, gw *w, int fmt, int engine, const void **B, int *b_fmt, gk_wq *q) {
    *b_fmt = 0;
    *B = NULL;
    memset(q, 0, sizeof *q);
    const bool quant = w->q.kind != GK_WQ_NONE;
    /* a 16-bit product of weights kept wider: the policy rounds them first */
    if (fmt != GK_F32 && fmt != w->dt) return false;
    if (engine != GK_ENGINE_BLAS && quant) {
        *q = w->q;
        return true;
    }
    if (fmt == w->dt && !quant) {
        *B = w->w;
        return true;
    }
    if (engine == GK_ENGINE_CHAIN32) {
        *b_fmt = w->dt;
        *B = w->w;
        return true;
    }
    const size_t n = (size_t)w->experts * w->n * w->kp, bytes = n * (fmt == GK_F32 ? 4 : 2);
    if (bytes > G->wide_cap) {
        GPU_FN(free)(G->ctx, G->wide);
        G->wide = GPU_FN(alloc)(G->ctx, bytes);
        G->wide_cap = G->wide ? bytes : 0;
        G->wide_of = NULL;
        if (!G->wide) return false;
    }
    if (G->wide_of != w || G->wide_fmt != fmt) {
        if (quant) GPU_FN(widen_q)(G->ctx, G->wide, fmt, &w->q, w->n, w->k, w->kp);
        else GPU_FN(widen)(G->ctx, G->wide, w->w, w->dt, n);
        G->wide_of = w;
        G->wide_fmt = fmt;
    }
    *B = G->wide;
    return true;
}

/* ---- scratch ------------------------------------------------------------ */

static void free_scratch(gpu *G) {
    void **bufs[] = {(void **)&G->h, (void **)&G->x, (void **)&G->y, (void **)&G->q, (void **)&G->k, (void **)&G->v,
                     (void **)&G->ctxv, (void **)&G->s, (void **)&G->g, (void **)&G->u, (void **)&G->ye,
                     (void **)&G->sh, (void **)&G->probs, (void **)&G->cf, &G->opA, &G->opB, &G->opH, (void **)&G->cos_t,
                     (void **)&G->sin_t, (void **)&G->tokens, (void **)&G->topk_w,
                     (void **)&G->router, (void **)&G->shared_gate, (void **)&G->router_in, (void **)&G->offset,
                     (void **)&G->token, (void **)&G->row_of, (void **)&G->logits, (void **)&G->route_dev, (void **)&G->rep_ids,
                     (void **)&G->rep_w, (void **)&G->mla_a, (void **)&G->mla_ckv, (void **)&G->mla_kv,
                     (void **)&G->sel};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        GPU_FN(free)(G->ctx, *bufs[i]);
        *bufs[i] = NULL;
    }
    GPU_FN(host_free)(G->logits_host);
    GPU_FN(host_free)(G->route_host);
    G->logits_host = G->route_host = NULL;
    G->cap_T = 0;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The routing's staging block for T tokens: per MoE layer, `per_layer`
 * floats (router logits [T][E], top-k weights [T][K], shared gates [T],
 * the grouped routers' selection rows [T][E]); after all layers, the ids
 * [n_moe][T][K] as uint16. */
typedef struct route_layout {
    size_t router, w, sh, sel, per_layer, ids_at, bytes;
} route_layout;

static bool grouped_router(const mf_config *c) {
    return c->route_rule == MF_ROUTE_SIGMOID_GROUP || c->route_rule == MF_ROUTE_SOFTMAX_GREEDY;
}

/* Routers whose runs record the row their top-k ranks (`select`): the grouped ones, and gpt-oss's (its logits) */
static bool records_select(const mf_config *c) { return grouped_router(c) || c->route_rule == MF_ROUTE_TOPK_SOFTMAX; }

static route_layout route_layout_for(const mf_config *c, int T) {
    const size_t nm = c->n_moe_layers, E = c->n_experts > 0 ? c->n_experts : 1, K = c->top_k > 0 ? c->top_k : 1;
    route_layout l;
    l.router = (size_t)T * E;
    l.w = (size_t)T * K;
    l.sh = c->has_shared_expert ? (size_t)T : 0;
    l.sel = records_select(c) ? (size_t)T * E : 0;
    l.per_layer = l.router + l.w + l.sh + l.sel;
    l.ids_at = nm * l.per_layer;
    l.bytes = l.ids_at * sizeof(float) + (nm ? nm : 1) * l.w * sizeof(uint16_t);
    return l;
}

static void widen(double *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

/* Allocates the scratch for T tokens; with count non-NULL only adds up its
 * device bytes there (the memory check before anything is allocated). */
static int scratch_for(gpu *G, int T, size_t *count, mf_error *err) {
    const mf_config *c = &G->m->cfg;
    const size_t H = c->hidden, V = c->vocab, nh = c->n_heads;
    const bool mla = c->attn == MF_ATTN_MLA;
    /* a head's query/key and value dims; a position's rows */
    const size_t hd = mla ? (size_t)(c->qk_nope_dim + c->qk_rope_dim) : (size_t)c->head_dim;
    const size_t vhd = mla ? (size_t)c->v_head_dim : hd;
    const size_t nq = G->qw, nk = G->kw, nv = G->vw, nc = G->cw, E = c->n_experts > 0 ? c->n_experts : 1;
    const size_t K = c->top_k > 0 ? c->top_k : 1;
    const size_t I = max_sz(max_sz(c->intermediate, c->moe_intermediate), c->shared_intermediate);
    const size_t t = T, R = max_sz(t * K, t), Tp = round16(T);
    const size_t Hp = round16((int)H), Ip = round16((int)I), hdp = round16((int)hd), nqp = round16((int)max_sz(nq, nc));
    /* latent attention's extra products: q_a [t][qr], kv_a [t][kvr + rope], kv_b [t][heads x (nope + v)] */
    const size_t qr = mla ? (size_t)c->q_lora_rank : 0, kvw = mla ? (size_t)(c->kv_lora_rank + c->qk_rope_dim) : 0;
    const size_t kvb = mla ? nh * (size_t)(c->qk_nope_dim + c->v_head_dim) : 0;
    const size_t lorap = max_sz(round16((int)qr), round16(mla ? c->kv_lora_rank : 0));
    size_t cf = max_sz(max_sz(t * V, nh * t * t), max_sz(R * I * (c->clamped_swiglu ? 2 : 1), R * H));
    cf = max_sz(cf, max_sz(t * max_sz(nq, nc), t * E));
    cf = max_sz(cf, max_sz(t * max_sz(qr, kvw), t * kvb));
    size_t opa = max_sz(max_sz(R * Hp, R * Ip), max_sz(nh * t * Tp, max_sz(nh * t * hdp, t * nqp)));
    opa = max_sz(opa, t * lorap);
    size_t opb = max_sz(nh * t * hdp, nh * max_sz(hd, vhd) * Tp);
    bool ok = true;
#define GET(field, bytes)                                                                                              \
    if (count) *count += (bytes);                                                                                      \
    else ok = ok && (G->field = GPU_FN(alloc)(G->ctx, (bytes))) != NULL
    GET(h, t * H * 8);
    GET(x, t * H * 8);
    GET(y, t * H * 8);
    GET(q, t * nq * 8);
    GET(k, t * nk * 8);
    GET(v, t * nv * 8);
    GET(ctxv, t * nc * 8);
    GET(mla_a, t * qr * 8);
    GET(mla_ckv, t * kvw * 8);
    GET(mla_kv, t * kvb * 8);
    GET(sel, (records_select(c) ? t * E : 1) * 8);
    GET(s, nh * t * t * 8);
    GET(g, R * I * (c->clamped_swiglu ? 2 : 1) * 8);   /* gpt-oss: the fused gate_up's 2I a row */
    GET(u, R * I * 8);
    GET(ye, R * H * 8);
    GET(sh, t * H * 8);
    GET(probs, t * E * 8);
    GET(cf, cf * 4);
    GET(opA, opa * 4);
    GET(opB, opb * 4);
    GET(opH, R * Ip * 2);   /* bf16 or f16 */
    GET(cos_t, t * G->rdim * 8);
    GET(sin_t, t * G->rdim * 8);
    GET(tokens, t * 4);
    GET(topk_w, t * K * 8);
    GET(router, t * E * 8);
    GET(shared_gate, t * 8);
    GET(offset, (2 * E + 1) * 4);
    GET(token, R * 4);
    GET(row_of, R * 4);
    GET(logits, t * V * 4);
    const size_t route_bytes = route_layout_for(c, T).bytes;
    GET(route_dev, route_bytes);
    const size_t nm = c->n_moe_layers > 0 ? (size_t)c->n_moe_layers : 1;
    GET(rep_ids, nm * t * K * 2);
    GET(rep_w, nm * t * K * 8);
#undef GET
    if (count) return MF_OK;
    if (ok) ok = (G->logits_host = GPU_FN(host_alloc)(t * V * 4)) != NULL;
    if (ok) ok = (G->route_host = GPU_FN(host_alloc)(route_bytes)) != NULL;
    if (!ok) {
        free_scratch(G);
        return mf_fail(err, MF_ENOMEM, "%s: not enough memory for a %d-token sequence", G->desc, T);
    }
    G->cap_T = T;
    return MF_OK;
}

static int ensure_scratch(gpu *G, int T, mf_error *err) {
    if (T <= G->cap_T) return MF_OK;
    free_scratch(G);
    return scratch_for(G, T, NULL, err);
}

/* ---- products ------------------------------------------------------------ */

/* An activation operand: element (b, row, col) at p[(b / group) * sb + row * sr + col * sc]. */
typedef struct act_src {
    const double *p;
    size_t sb;
    int group;
    size_t sr, sc;
} act_src;

typedef struct prod {
    const char *what;   /* for messages: "layer 3 q" */
    int layer;
    mf_dtype in, out;   /* operands hold `in` values; the result is rounded to `out` */
    int M, N, K, batch;
    act_src a;
    bool a_packed;      /* A is already in G->opA (gathered expert rows), or in */
    void *a_op;         /* this operand when non-NULL */
    gw *w;              /* B: a weight, or */
    gw *up;             /* with w the gate: both at once, the down's operand into glu_out */
    void *glu_out;
    act_src b;          /* an activation */
    const int *offsets; /* grouped over experts */
    double *dst;        /* or, for the logits, */
    void *dst_packed;
    size_t ldc, dst_bstride;
} prod;

static int engine_for(const gpu *G, int fmt, bool grouped) {
#if defined(MF_GPU_BACKEND_HIP)
    /* the HIP backend has no BLAS engine: its fp32 products are the fp32 fma chain */
    if (fmt == GK_F32) return GK_ENGINE_CHAIN32;
#else
    if (fmt == GK_F32) return G->num.kind == MF_NUMERICS_NATIVE && !grouped ? GK_ENGINE_BLAS : GK_ENGINE_CHAIN32;
#endif
    if (G->engine16 == GK_ENGINE_BLAS && grouped) return GK_ENGINE_MMA;   /* grouped_mm is a tensor-core kernel, not cuBLAS */
    return G->engine16;
}

static int product(gpu *G, prod *p, mf_error *err) {
    const int fmt = gk_dt(p->in), Kp = round16(p->K);
    gk_gemm g = {0};
    g.engine = engine_for(G, fmt, p->offsets != NULL);
    g.fmt = fmt;
    g.M = p->M;
    g.N = p->N;
    g.K = p->K;
    g.Kp = Kp;
    g.batch = p->batch;
    if (!p->a_packed)
        GPU_FN(pack)(G->ctx, G->opA, fmt, p->batch, p->M, p->K, Kp, p->a.p, p->a.sb, p->a.group, p->a.sr, p->a.sc);
    g.A = p->a_op ? p->a_op : G->opA;
    g.a_bstride = (size_t)p->M * Kp;
    if (p->w) {
        if (!weight_as(G, p->w, fmt, g.engine, &g.B, &g.b_fmt, &g.bq))
            return mf_fail(err, MF_ENOMEM, "%s: the weights of %s cannot be operands of this product", G->desc, p->what);
        g.b_bstride = (size_t)p->w->n * p->w->kp;
        g.experts = p->w->experts;
    } else {
        GPU_FN(pack)(G->ctx, G->opB, fmt, p->batch, p->N, p->K, Kp, p->b.p, p->b.sb, p->b.group, p->b.sr, p->b.sc);
        g.B = G->opB;
        g.b_bstride = (size_t)p->N * Kp;
    }
    g.C = G->cf;
    g.c_bstride = (size_t)p->M * p->N;
    if (p->up) {
        int b2_fmt;
        if (!weight_as(G, p->up, fmt, g.engine, &g.B2, &b2_fmt, &g.bq2) || b2_fmt != g.b_fmt ||
            !g.B2 != !g.B)
            return mf_fail(err, MF_ENOMEM, "%s: the weights of %s cannot be operands of this product", G->desc, p->what);
        g.bias2 = p->up->bias;
        g.bias = p->w->bias;
        g.H = p->glu_out;
        g.ldh = round16(p->N);
        g.act = (int)G->m->cfg.act;
        g.outdt = gk_dt(p->out);
    } else if (!p->dst_packed) {
        g.D = p->dst;
        g.ldd = p->ldc;
        g.d_bstride = p->dst_bstride;
        g.bias = p->w ? p->w->bias : NULL;
        g.outdt = gk_dt(p->out);
    }
    g.offsets = p->offsets;
    if (g.engine == GK_ENGINE_EMU) {
        const mf_kschedule *ks = mf_numerics_schedule(&G->num, p->in);
        const mf_mma_instr *I = &ks->instr;
        g.emu_kind = I->kind == MF_MMA_NV_FUSED ? GK_EMU_NV_FUSED : GK_EMU_AMD_GROUPED;
        g.emu_k = I->k;
        g.emu_chunk = I->kind == MF_MMA_NV_FUSED ? I->k / I->halves : I->group;
        g.emu_frac = I->frac_bits;
        g.emu_zero_excluded = I->zero_products_excluded;
    }
    g.call_id = G->ncalls;
    if (G->ncalls < MAX_CALLS)
        snprintf(G->calls[G->ncalls], sizeof G->calls[0], "layer %d %s", p->layer, p->what);
    G->ncalls++;
    if (GPU_FN(gemm)(G->ctx, &g, G->msg, sizeof G->msg)) return mf_fail(err, MF_EIO, "%s: %s: %s", G->desc, p->what, G->msg);
    if (p->dst_packed)
        GPU_FN(epilogue_packed)(G->ctx, p->dst_packed, G->cf, p->M, p->N, p->w ? p->w->bias : NULL, gk_dt(p->out));
    return MF_OK;
}

/* y[M, out] = x[M, in] . W^T (+ b), dense */
static int linear(gpu *G, int layer, const char *what, gw *w, mf_dtype in, mf_dtype out, const double *x, int M,
                  double *y, mf_error *err) {
    prod p = {.what = what, .layer = layer, .in = in, .out = out, .M = M, .N = w->n, .K = w->k, .batch = 1,
              .a = {x, 0, 1, (size_t)w->k, 1}, .w = w, .dst = y, .ldc = (size_t)w->n};
    return product(G, &p, err);
}

/* ---- the model's parts ------------------------------------------------------ */

typedef struct step {
    gpu *G;
    int T, l;
    mf_dtype O;
    bool routing;   /* copy each MoE layer's routing out as it is done */
    int pos;        /* the first new position (0 but for a session's later steps) */
    bool cached;    /* keys and values go to the session's cache (and are read from it) */
    int n_rep;      /* the first this many new positions dispatch the replayed experts */
    const double *cos_t, *sin_t;   /* the new positions' RoPE rows */
} step;

/* Layer l's keys (0) or values (1) in the session's cache. */
static double *cache_of(gpu *G, int l, int which) {
    return G->kv + (size_t)l * G->cache_T * (G->kw + G->vw) + (which ? (size_t)G->cache_T * G->kw : 0);
}

static int attention(step *st, mf_dtype D, glayer *L, mf_error *err) {
    gpu *G = st->G;
    const mf_config *c = &G->m->cfg;
    const int T = st->T, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int nq = nh * hd, nk = nkv * hd, group = nh / nkv;
    const int rs = c->rope_style == MF_ROPE_DEINTERLEAVE ? GK_ROPE_DEINTERLEAVE
                   : c->rope_style == MF_ROPE_COMPLEX    ? GK_ROPE_COMPLEX
                                                         : GK_ROPE_HALF;
    const double eps = (float)c->rms_eps;
    /* the new rows' keys and values: in a session after those of the positions before, which the queries see
     * too (Tk keys in all) */
    double *kbase = st->cached ? cache_of(G, st->l, 0) : G->k, *vbase = st->cached ? cache_of(G, st->l, 1) : G->v;
    double *kn = kbase + (size_t)st->pos * nk, *vn = vbase + (size_t)st->pos * nk;
    const int Tk = st->pos + T;
    int rc;
    if ((rc = linear(G, st->l, "q", &L->q, D, D, G->x, T, G->q, err))) return rc;
    /* k and v take the same operand: x is packed once */
    prod pk = {.what = "k", .layer = st->l, .in = D, .out = D, .M = T, .N = L->k.n, .K = L->k.k, .batch = 1,
               .a = {G->x, 0, 1, (size_t)L->k.k, 1}, .a_packed = true, .w = &L->k, .dst = kn, .ldc = (size_t)L->k.n};
    if ((rc = product(G, &pk, err))) return rc;
    prod pv_ = pk;
    pv_.what = "v";
    pv_.w = &L->v;
    pv_.dst = vn;
    if ((rc = product(G, &pv_, err))) return rc;
    mark(G, P_QKV);
    if (c->qk_norm == MF_QK_NORM_FULL) {
        GPU_FN(rmsnorm_pair)(G->ctx, G->q, T, nq, L->q_norm, kn, T, nk, L->k_norm, eps, gk_dt(D), gk_dt(D),
                             c->norm_weight_fp32);
    }
    if (c->clip_qkv > 0) {
        const double cl = mf_round_to(D, c->clip_qkv);
        GPU_FN(clip)(G->ctx, G->q, (size_t)T * nq, cl);
        GPU_FN(clip)(G->ctx, kn, (size_t)T * nk, cl);
        GPU_FN(clip)(G->ctx, vn, (size_t)T * nk, cl);
    }
    if (c->qk_norm == MF_QK_NORM_PER_HEAD) {
        GPU_FN(rmsnorm_pair)(G->ctx, G->q, T * nh, hd, L->q_norm, kn, T * nkv, hd, L->k_norm, eps, gk_dt(D),
                             gk_dt(D), c->norm_weight_fp32);
    }
    mark(G, P_QKNORM);
    GPU_FN(rope)(G->ctx, G->q, T, nh, (size_t)nq, (size_t)hd, 0, G->rdim, rs, st->cos_t, st->sin_t, gk_dt(D));
    GPU_FN(rope)(G->ctx, kn, T, nkv, (size_t)nk, (size_t)hd, 0, G->rdim, rs, st->cos_t, st->sin_t, gk_dt(D));
    mark(G, P_ROPE);
    /* scores[h] = Q_h K_kh^T, every head at once, against all Tk keys */
    prod qk = {.what = "q.k", .layer = st->l, .in = D, .out = D, .M = T, .N = Tk, .K = hd, .batch = nh,
               .a = {G->q, (size_t)hd, 1, (size_t)nq, 1}, .b = {kbase, (size_t)hd, group, (size_t)nk, 1}, .dst = G->s,
               .ldc = (size_t)Tk, .dst_bstride = (size_t)T * Tk};
    if ((rc = product(G, &qk, err))) return rc;
    mark(G, P_SCORES);
    /* the config's softmax scale, else head_dim ** -0.5, as a Python float in fp32 opmath: as the CPU */
    const double scale = (float)(c->attn_scale > 0 ? c->attn_scale : pow((double)hd, -0.5));
    const int window = c->layer_sliding[st->l] ? c->sliding_window : 0;
    GPU_FN(softmax_causal)(G->ctx, G->s, nh, T, Tk, st->pos, scale, window, gk_dt(D), L->sinks);
    mark(G, P_SOFTMAX);
    /* ctx[:, h] = P_h V_kh (a row's weights past its position are zeros: the same sums as without them) */
    prod pv = {.what = "p.v", .layer = st->l, .in = D, .out = D, .M = T, .N = hd, .K = Tk, .batch = nh,
               .a = {G->s, (size_t)T * Tk, 1, (size_t)Tk, 1}, .b = {vbase, (size_t)hd, group, 1, (size_t)nk},
               .dst = G->ctxv, .ldc = (size_t)nq, .dst_bstride = (size_t)hd};
    if ((rc = product(G, &pv, err))) return rc;
    mark(G, P_PV);
    rc = linear(G, st->l, "o", &L->o, D, D, G->ctxv, T, G->y, err);
    mark(G, P_O);
    return rc;
}

/* DeepSeek's multi-head latent attention (runtime/cpu/forward_body.h's mla_attention, step for step):
 * q = q_b(norm(q_a x)) or q_proj x, per head [nope | rope]; kv_a x = [c | k_rope]; kv_b(norm(c)) per head
 * [k_nope | v]; RoPE on q's rope dims and on k_rope; K = [k_nope | k_rope] (k_rope shared by every head), V = v;
 * the two low-rank norms with eps 1e-6 (transformers' class default), the config's softmax scale. */
static int mla_attention(step *st, mf_dtype D, glayer *L, mf_error *err) {
    gpu *G = st->G;
    const mf_config *c = &G->m->cfg;
    const int T = st->T, nh = c->n_heads, nope = c->qk_nope_dim, rope = c->qk_rope_dim, qk = nope + rope;
    const int vd = c->v_head_dim, kvr = c->kv_lora_rank, kvw = kvr + rope, kvb = nope + vd;
    const int nq = nh * qk, nv = nh * vd;
    const double eps = (float)1e-6;
    const int rs = c->rope_style == MF_ROPE_DEINTERLEAVE ? GK_ROPE_DEINTERLEAVE
                   : c->rope_style == MF_ROPE_COMPLEX    ? GK_ROPE_COMPLEX
                                                         : GK_ROPE_HALF;
    double *kbase = st->cached ? cache_of(G, st->l, 0) : G->k, *vbase = st->cached ? cache_of(G, st->l, 1) : G->v;
    double *kn = kbase + (size_t)st->pos * nq, *vn = vbase + (size_t)st->pos * nv;
    const int Tk = st->pos + T;
    int rc;
    if (c->q_lora_rank > 0) {
        const int qr = c->q_lora_rank;
        if ((rc = linear(G, st->l, "q_a", &L->q_a, D, D, G->x, T, G->mla_a, err))) return rc;
        GPU_FN(rmsnorm)(G->ctx, G->mla_a, G->mla_a, T, qr, (size_t)qr, L->q_a_norm, eps, gk_dt(D), gk_dt(D), GK_F64,
                        c->norm_weight_fp32);
        if ((rc = linear(G, st->l, "q_b", &L->q_b, D, D, G->mla_a, T, G->q, err))) return rc;
    } else if ((rc = linear(G, st->l, "q", &L->q, D, D, G->x, T, G->q, err))) {
        return rc;
    }
    if ((rc = linear(G, st->l, "kv_a", &L->kv_a, D, D, G->x, T, G->mla_ckv, err))) return rc;
    /* the norm of c in place: kv_b reads it there, the rope part after it is not touched */
    GPU_FN(rmsnorm)(G->ctx, G->mla_ckv, G->mla_ckv, T, kvr, (size_t)kvw, L->kv_a_norm, eps, gk_dt(D), gk_dt(D), GK_F64,
                    c->norm_weight_fp32);
    prod pkv = {.what = "kv_b", .layer = st->l, .in = D, .out = D, .M = T, .N = L->kv_b.n, .K = kvr, .batch = 1,
                .a = {G->mla_ckv, 0, 1, (size_t)kvw, 1}, .w = &L->kv_b, .dst = G->mla_kv, .ldc = (size_t)L->kv_b.n};
    if ((rc = product(G, &pkv, err))) return rc;
    mark(G, P_QKV);
    GPU_FN(rope)(G->ctx, G->q, T, nh, (size_t)nq, (size_t)qk, nope, G->rdim, rs, st->cos_t, st->sin_t, gk_dt(D));
    GPU_FN(rope)(G->ctx, G->mla_ckv, T, 1, (size_t)kvw, 0, kvr, G->rdim, rs, st->cos_t, st->sin_t, gk_dt(D));
    GPU_FN(mla_kv)(G->ctx, kn, vn, G->mla_kv, G->mla_ckv, T, nh, nope, rope, vd, kvr, kvw);
    mark(G, P_ROPE);
    (void)kvb;
    prod pqk = {.what = "q.k", .layer = st->l, .in = D, .out = D, .M = T, .N = Tk, .K = qk, .batch = nh,
                .a = {G->q, (size_t)qk, 1, (size_t)nq, 1}, .b = {kbase, (size_t)qk, 1, (size_t)nq, 1}, .dst = G->s,
                .ldc = (size_t)Tk, .dst_bstride = (size_t)T * Tk};
    if ((rc = product(G, &pqk, err))) return rc;
    mark(G, P_SCORES);
    GPU_FN(softmax_causal)(G->ctx, G->s, nh, T, Tk, st->pos, (float)c->attn_scale, 0, gk_dt(D), NULL);
    mark(G, P_SOFTMAX);
    prod pv = {.what = "p.v", .layer = st->l, .in = D, .out = D, .M = T, .N = vd, .K = Tk, .batch = nh,
               .a = {G->s, (size_t)T * Tk, 1, (size_t)Tk, 1}, .b = {vbase, (size_t)vd, 1, 1, (size_t)nv},
               .dst = G->ctxv, .ldc = (size_t)nv, .dst_bstride = (size_t)vd};
    if ((rc = product(G, &pv, err))) return rc;
    mark(G, P_PV);
    rc = linear(G, st->l, "o", &L->o, D, D, G->ctxv, T, G->y, err);
    mark(G, P_O);
    return rc;
}

/* out = down(act(gate x) * up x) over M rows; x dense, or the gathered rows
 * in opA when grouped (the expert weights hold every expert). */
static int ffn(step *st, mf_dtype D, gw *gate, gw *up, gw *down, const double *x, int M, const int *offsets,
               double *out, mf_error *err) {
    gpu *G = st->G;
    const int I = gate->n, H = gate->k;
    int rc;
    prod pg = {.what = "gate", .layer = st->l, .in = D, .out = D, .M = M, .N = I, .K = H, .batch = 1,
               .a = {x, 0, 1, (size_t)H, 1}, .a_packed = offsets != NULL, .w = gate, .offsets = offsets, .dst = G->g,
               .ldc = (size_t)I};
    prod pd = {.what = "down", .layer = st->l, .in = D, .out = D, .M = M, .N = H, .K = I, .batch = 1,
               .a = {G->g, 0, 1, (size_t)I, 1}, .w = down, .offsets = offsets, .dst = out, .ldc = (size_t)H};
    if (engine_for(G, gk_dt(D), offsets != NULL) == GK_ENGINE_MMA && G->glu_fused) {
        /* one product for gate and up whose epilogue is the activation and the
         * down's operand packing (the same roundings as the three steps below) */
        pg.what = "gate+up";
        pg.up = up;
        pg.glu_out = G->opH;
        if ((rc = product(G, &pg, err))) return rc;
        pd.a_packed = true;
        pd.a_op = G->opH;
        return product(G, &pd, err);
    }
    if ((rc = product(G, &pg, err))) return rc;
    prod pu = pg;
    pu.what = "up";
    pu.w = up;
    pu.dst = G->u;
    if ((rc = product(G, &pu, err))) return rc;
    GPU_FN(act_mul)(G->ctx, G->g, G->u, (size_t)M * I, (int)G->m->cfg.act, gk_dt(D));
    return product(G, &pd, err);
}

/* gpt-oss's experts over the R gathered rows in opA (experts/experts.c's clamped form): the fused gate_up as one
 * grouped product rounded to D (its 2I rows in the checkpoint's interleaved order: every output is the same chain
 * as the CPU's separate gate and up products compute), then one kernel adds each row's expert biases (a second
 * rounding, as add_(bias) after grouped_mm) and applies the clamped SwiGLU; down, then its biases. */
static int clamped_experts(step *st, mf_dtype D, glayer *L, int R, double *out, mf_error *err) {
    gpu *G = st->G;
    const mf_config *c = &G->m->cfg;
    const int I2 = L->exp_gate.n, I = I2 / 2, H = L->exp_gate.k, E = c->n_experts;
    int rc;
    prod pg = {.what = "gate_up", .layer = st->l, .in = D, .out = D, .M = R, .N = I2, .K = H, .batch = 1,
               .a = {G->x, 0, 1, (size_t)H, 1}, .a_packed = true, .w = &L->exp_gate, .offsets = G->offset,
               .dst = G->g, .ldc = (size_t)I2};
    if ((rc = product(G, &pg, err))) return rc;
    GPU_FN(glu_clamped)(G->ctx, G->g, G->u, R, I, G->offset, E, L->eb_gate_up, c->swiglu_alpha, c->swiglu_limit,
                        gk_dt(D));
    prod pd = {.what = "down", .layer = st->l, .in = D, .out = D, .M = R, .N = H, .K = I, .batch = 1,
               .a = {G->u, 0, 1, (size_t)I, 1}, .w = &L->exp_down, .offsets = G->offset, .dst = out,
               .ldc = (size_t)H};
    if ((rc = product(G, &pd, err))) return rc;
    GPU_FN(expert_bias)(G->ctx, out, R, H, G->offset, E, L->eb_down, gk_dt(D));
    return MF_OK;
}

static int moe(step *st, mf_dtype D, mf_dtype DR, glayer *L, int mi, mf_error *err) {
    gpu *G = st->G;
    const mf_config *c = &G->m->cfg;
    const int T = st->T, H = c->hidden, E = c->n_experts, K = c->top_k, R = T * K;
    const route_layout lo = route_layout_for(c, T);
    double *logits = G->router;
    int rc;
    /* DeepSeek's and GLM's routers compute in fp32 whatever the model's dtype and keep their weights in fp32
     * (the CPU's moe) */
    const bool deepseek = grouped_router(c);
    if (deepseek) DR = st->O;
    if ((rc = linear(G, st->l, "router", &L->router, DR, DR, G->x, T, logits, err))) return rc;
    mark(G, P_ROUTER);
    const mf_dtype wdt = c->route_rule == MF_ROUTE_SOFTMAX_TOPK_RENORM || deepseek ? st->O : DR;
    uint16_t *ids = (uint16_t *)(G->route_dev + lo.ids_at) + (size_t)mi * lo.w;   /* this layer's slot of the staging */
    double *w = G->topk_w;
    const bool rep_layer = st->n_rep > 0 && (!G->replay->layers || G->replay->layers[mi]);
    const uint16_t *rep_ids = rep_layer ? G->rep_ids + (size_t)mi * T * K : NULL;
    const double *rep_w = rep_layer && G->replay->weights ? G->rep_w + (size_t)mi * T * K : NULL;
    if (records_select(c)) {
        const int kind = c->route_rule == MF_ROUTE_SIGMOID_GROUP    ? GK_ROUTE_SIGMOID_GROUP
                         : c->route_rule == MF_ROUTE_SOFTMAX_GREEDY ? GK_ROUTE_SOFTMAX_GREEDY
                                                                    : GK_ROUTE_TOPK_SOFTMAX;
        const gk_route_spec spec = {kind, E, K, c->norm_topk_prob, c->n_group, c->topk_group, c->group_limited,
                                    gk_dt(wdt), L->e_bias, c->routed_scaling};
        GPU_FN(route_grouped)(G->ctx, &spec, logits, G->probs, G->sel, T, ids, w, rep_ids, rep_w,
                              rep_layer ? st->n_rep : 0);
    } else {
        GPU_FN(route)(G->ctx, logits, G->probs, T, E, K, c->norm_topk_prob, gk_dt(wdt), ids, w, rep_ids, rep_w,
                      rep_layer ? st->n_rep : 0);
    }
    mark(G, P_ROUTE);
    GPU_FN(dispatch)(G->ctx, ids, T, K, E, G->offset, G->token, G->row_of);
    mark(G, P_DISPATCH);
    GPU_FN(gather)(G->ctx, G->opA, gk_dt(D), round16(H), G->x, H, G->token, R);
    mark(G, P_GATHER);
    if (c->clamped_swiglu) rc = clamped_experts(st, D, L, R, G->ye, err);
    else rc = ffn(st, D, &L->exp_gate, &L->exp_up, &L->exp_down, G->x, R, G->offset, G->ye, err);
    if (rc) return rc;
    mark(G, P_EXPERTS);
    GPU_FN(combine)(G->ctx, G->y, G->ye, T, H, K, G->row_of, w, gk_dt(wdt == D ? D : st->O), gk_dt(st->O), gk_dt(D));
    mark(G, P_COMBINE);
    if (c->n_shared_experts > 0) {   /* DeepseekV3MoE: routed + shared_experts(x), one addition in D */
        if ((rc = ffn(st, D, &L->sh_gate, &L->sh_up, &L->sh_down, G->x, T, NULL, G->sh, err))) return rc;
        GPU_FN(residual)(G->ctx, G->y, G->sh, (size_t)T * H, gk_dt(D), GK_F64);   /* sh holds D values */
        mark(G, P_SHARED);
    }
    if (c->has_shared_expert) {
        if ((rc = ffn(st, D, &L->sh_gate, &L->sh_up, &L->sh_down, G->x, T, NULL, G->sh, err))) return rc;
        double *gate = G->shared_gate;
        if ((rc = linear(G, st->l, "shared gate", &L->sh_router, D, D, G->x, T, gate, err))) return rc;
        GPU_FN(shared_add)(G->ctx, G->y, G->sh, gate, T, H, gk_dt(D));
        mark(G, P_SHARED);
    }
    if (st->routing) {
        /* this layer's routing leaves now, on the side, while the next layers run (they reuse router, topk_w
         * and shared_gate after these narrowing copies, in stream order) */
        float *blk = G->route_dev + (size_t)mi * lo.per_layer;
        GPU_FN(narrow)(G->ctx, blk, logits, lo.router);
        GPU_FN(narrow)(G->ctx, blk + lo.router, w, lo.w);
        if (lo.sh) GPU_FN(narrow)(G->ctx, blk + lo.router + lo.w, G->shared_gate, lo.sh);
        if (lo.sel) GPU_FN(narrow)(G->ctx, blk + lo.router + lo.w + lo.sh, G->sel, lo.sel);
        float *hblk = (float *)G->route_host + (size_t)mi * lo.per_layer;
        uint16_t *hids = (uint16_t *)((float *)G->route_host + lo.ids_at) + (size_t)mi * lo.w;
        if (GPU_FN(download_behind)(G->ctx, hblk, blk, lo.per_layer * sizeof(float), mi) ||
            GPU_FN(download_behind)(G->ctx, hids, ids, lo.w * sizeof(uint16_t), mi))
            return mf_fail(err, MF_EIO, "%s: layer %d: queueing the copy of the routing failed", G->desc, st->l);
    }
    return MF_OK;
}

/* ---- entry points ------------------------------------------------------------- */

void GPU_FN(gpu_close)(void *impl) {
    gpu *G = impl;
    if (!G) return;
    if (G->prof && G->prof_forwards) {
        double total = 0;
        for (int i = 0; i < P_N; i++) total += G->prof_t[i];
        fprintf(stderr, "%s: %s, %s: mean of %d forwards, %.3f ms each (with a wait after every step)\n", G->desc,
                G->num.name, G->prec.name, G->prof_forwards, total * 1e3 / G->prof_forwards);
        for (int i = 0; i < P_N; i++)
            fprintf(stderr, "  %-16s %8.3f ms  %5.1f%%\n", prof_names[i], G->prof_t[i] * 1e3 / G->prof_forwards,
                    total > 0 ? 100 * G->prof_t[i] / total : 0.0);
    }
    if (G->ctx) {
        free_scratch(G);
        GPU_FN(free)(G->ctx, G->kv);
        GPU_FN(free)(G->ctx, G->rope_cos);
        GPU_FN(free)(G->ctx, G->rope_sin);
        GPU_FN(weights_free)(G);
        GPU_FN(ctx_close)(G->ctx);
    }
    free(G->layers);
    free(G);
}

const char *GPU_FN(gpu_describe)(const void *impl) { return ((const gpu *)impl)->desc; }

int GPU_FN(gpu_count)(int *count, mf_error *err) {
    char msg[256];
    if (GPU_FN(device_count)(count, msg, sizeof msg)) return mf_fail(err, MF_EIO, "%s", msg);
    return MF_OK;
}

static int run_tokens(gpu *G, const int32_t *tokens, int T, int pos, bool cached, unsigned capture, mf_seq_result *r,
                      mf_error *err);
static int upload_rope(gpu *G, int n, int from, double *dst_cos, double *dst_sin);

/* The set-up a sequence should not pay for: the scratch for max_T tokens,
 * and one forward of max_T tokens, which loads the kernels and lets cuBLAS
 * choose its algorithms for these shapes; with a cache, a session's first
 * decode steps too (one-row products choose other kernels). */
static int warm_up(gpu *G, int max_T, mf_error *err) {
    int rc = ensure_scratch(G, max_T, err);
    if (rc) return rc;
    int32_t *tokens = mf_xcalloc((size_t)max_T, sizeof(int32_t));
    mf_seq_result r;
    const bool prof = G->prof;
    G->prof = false;
    rc = run_tokens(G, tokens, max_T, 0, false, MF_GPU_ROUTING, &r, err);
    if (!rc) mf_seq_result_free(&r);
    for (int p = 0; !rc && G->kv && p < 3 && p < G->cache_T; p++) {
        rc = run_tokens(G, tokens, 1, p, true, MF_GPU_ALL, &r, err);
        if (!rc) mf_seq_result_free(&r);
    }
    G->pos = 0;
    G->prof = prof;
    free(tokens);
    return rc;
}

/* Device bytes of a session's cache of cache_T positions: keys and values of every layer, and the RoPE tables. */
static size_t cache_bytes(const gpu *G, int cache_T) {
    if (cache_T <= 0) return 0;
    const mf_config *c = &G->m->cfg;
    return (size_t)c->n_layers * cache_T * (size_t)(G->kw + G->vw) * 8 + (size_t)2 * cache_T * G->rdim * 8;
}

static double gib(size_t b) { return (double)b / (double)(1u << 30); }

int GPU_FN(gpu_open)(void **out, int device, mf_model *m, const mf_precision *prec, const mf_numerics *num, int max_T,
                     int cache_T, mf_error *err) {
    *out = NULL;
    const mf_config *c = &m->cfg;
    if (c->arch > MF_ARCH_GPT_OSS)
        return mf_fail(err, MF_EUNSUPPORTED, "%s runs on the CPU only for now (--device cpu)", c->model_type);
    if (c->fp8_block[0] > 0 && num->fp8_products == MF_FP8_W8A8)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: numerics %s (FP8 weights times quantised activations) runs on the CPU "
                       "only (--device cpu); on a GPU the FP8 weights are widened (fp8=widen)", c->model_type,
                       num->name);
    if (prec->opmath != MF_F32 || prec->compute != MF_F32)
        return mf_fail(err, MF_EUNSUPPORTED, "precision %s runs on the CPU only (GPUs run bf16, fp16, fp32, layercast, "
                       "nomlp and selective policies)", prec->name);
    const int rdim = c->rope_dim > 0 ? c->rope_dim : c->head_dim;
    const int rope_room = c->attn == MF_ATTN_MLA ? c->qk_rope_dim : c->head_dim;
    if (rdim % 2 || rdim > rope_room)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: %d rotating dims of a %d-dim head is beyond the GPU's RoPE",
                       c->model_type, rdim, rope_room);
    if (grouped_router(c) && (c->n_group > 64 || c->n_group < 1 || c->n_experts % c->n_group))
        return mf_fail(err, MF_EUNSUPPORTED, "%s: %d expert groups of %d experts is beyond the GPU router (up to 64 "
                       "groups of equal size)", c->model_type, c->n_group, c->n_experts);
    if (c->top_k > 64 || c->n_experts > 1024)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: top-%d of %d experts is beyond the GPU router (top-64 of 1024)",
                       c->model_type, c->top_k, c->n_experts);
    gpu *G = calloc(1, sizeof *G);
    if (!G) return mf_fail(err, MF_ENOMEM, "out of memory");
    G->m = m;
    G->prec = *prec;
    G->num = *num;
    G->rdim = rdim;
    if (c->attn == MF_ATTN_MLA) {
        G->qw = G->kw = c->n_heads * (c->qk_nope_dim + c->qk_rope_dim);
        G->vw = G->cw = c->n_heads * c->v_head_dim;
    } else {
        G->qw = G->cw = c->n_heads * c->head_dim;
        G->kw = G->vw = c->n_kv_heads * c->head_dim;
    }
    const char *pe = getenv("MF_GPU_PROFILE");
    G->prof = pe && *pe && strcmp(pe, "0") != 0;

    char msg[256];
    if (GPU_FN(ctx_open)(&G->ctx, device, G->desc, sizeof G->desc, msg, sizeof msg)) {
        free(G);
        return mf_fail(err, MF_EIO, "%s", msg);
    }
    int rc = MF_OK;
#if defined(MF_GPU_BACKEND_HIP)
    const bool hip = true;
#else
    const bool hip = false;
#endif
    const char *glu = getenv("MF_GPU_GLU");
    G->glu_fused = !hip && !(glu && !strcmp(glu, "0"));
    switch (num->kind) {
    case MF_NUMERICS_NATIVE: G->engine16 = hip ? GK_ENGINE_MMA : GK_ENGINE_BLAS; break;
    case MF_NUMERICS_FIXED:
        if (hip) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "numerics fixed is the CUDA mma.sync chain; on HIP, native is our MFMA chain");
            goto done;
        }
        G->engine16 = GK_ENGINE_MMA;
        break;
    case MF_NUMERICS_EMU:
        G->engine16 = GK_ENGINE_EMU;
        for (int t = 0; t < 2; t++) {
            const mf_kschedule *ks = num->has[t] ? (t ? &num->f16 : &num->bf16) : NULL;
            if (!ks) continue;
            if (!mf_emu_fast_supported(ks) || ks->acc != 1 || ks->split != 1) {
                rc = mf_fail(err, MF_EUNSUPPORTED, "numerics %s: on a GPU, emulation runs plain k chains of NVIDIA "
                             "fused or AMD CDNA3 bf16/f16 instructions (acc=1, split=1); run this one on the CPU",
                             num->name);
                goto done;
            }
        }
        break;
    default:
        rc = mf_fail(err, MF_EUNSUPPORTED, "numerics %s runs on the CPU only", num->name);
        goto done;
    }
    /* what the model and max_T tokens need, against what the device has free, before allocating */
    {
        size_t need = GPU_FN(weights_plan)(G), scratch = 0, free_b = 0, total_b = 0;
        scratch_for(G, max_T > cache_T ? (max_T > 0 ? max_T : 1) : cache_T, &scratch, err);
        scratch += cache_bytes(G, cache_T);
        if (G->engine16 == GK_ENGINE_BLAS) scratch += G->q_wide_bytes;   /* native: cuBLAS reads them widened */
        need += scratch + (size_t)6 * (32u << 20);   /* the upload's staging slots */
        if (GPU_FN(mem_info)(G->ctx, &free_b, &total_b, msg, sizeof msg)) {
            rc = mf_fail(err, MF_EIO, "%s: %s", G->desc, msg);
            goto done;
        }
        if (need > free_b) {
            rc = mf_fail(err, MF_ENOMEM, "%s: the model needs %.2f GiB of GPU memory (weights %.2f GiB, %d-token "
                         "scratch and cache %.2f GiB) but the GPU has %.2f GiB free of %.2f GiB", G->desc, gib(need),
                         gib(G->weight_bytes), max_T > cache_T ? max_T : cache_T, gib(scratch), gib(free_b),
                         gib(total_b));
            goto done;
        }
    }
    const double t_up = mf_now();
    if ((rc = GPU_FN(weights_upload)(G, err))) goto done;
    const double up_s = mf_now() - t_up, t_warm = mf_now();
    if (cache_T > 0) {
        G->cache_T = cache_T;
        const size_t rope = (size_t)cache_T * G->rdim * 8;
        G->kv = GPU_FN(alloc)(G->ctx, (size_t)c->n_layers * cache_T * (size_t)(G->kw + G->vw) * 8);
        /* tables that do not depend on the length are made once, for every position the cache holds */
        if (G->kv && c->rope.type != MF_ROPE_DYNAMIC) {
            G->rope_cos = GPU_FN(alloc)(G->ctx, rope);
            G->rope_sin = GPU_FN(alloc)(G->ctx, rope);
            if (G->rope_cos && G->rope_sin && upload_rope(G, cache_T, 0, G->rope_cos, G->rope_sin)) {
                rc = mf_fail(err, MF_EIO, "%s: copying the RoPE tables to the GPU failed", G->desc);
                goto done;
            }
        }
        if (!G->kv || (c->rope.type != MF_ROPE_DYNAMIC && (!G->rope_cos || !G->rope_sin))) {
            rc = mf_fail(err, MF_ENOMEM, "%s: not enough memory for a key-value cache of %d positions", G->desc,
                         cache_T);
            goto done;
        }
    }
    const int warm_T = max_T > cache_T ? max_T : cache_T;
    if (warm_T > 0 && (rc = warm_up(G, warm_T, err))) goto done;
    {
        size_t free_b = 0, total_b = 0;
        if (!GPU_FN(mem_info)(G->ctx, &free_b, &total_b, msg, sizeof msg))
            mf_log("moeflip: %s: weights %.2f GiB uploaded in %.2f s (%.1f GB/s), warm-up %.2f s; %.2f GiB of the GPU in "
                   "use", G->desc, gib(G->weight_bytes), up_s, up_s > 0 ? (double)mf_checkpoint_bytes(m->ckpt) / up_s / 1e9 : 0.0,
                   mf_now() - t_warm, gib(total_b - free_b));
    }
done:
    if (rc) {
        GPU_FN(gpu_close)(G);
        return rc;
    }
    *out = G;
    return MF_OK;
}

/* One product on the device, for moeflip_gpu_check: C[M, N] = round_out(A[M, K] . W_e^T) with the engine the
 * forward pass takes for operands of `in` under num (grouped: rows offsets[e] .. offsets[e + 1] - 1 use w[e]),
 * through product() as the model's are. a: [M][K] host doubles (values of in), c: [M][N] host doubles. */
int GPU_FN(gpu_matmul)(int device, const mf_numerics *num, mf_dtype in, mf_dtype out, const mf_mat *w, int experts,
                       const double *a, int M, const int *offsets, double *c, mf_error *err) {
    gpu *G = calloc(1, sizeof *G);
    if (!G) return mf_fail(err, MF_ENOMEM, "out of memory");
    G->num = *num;
    char msg[256];
    if (GPU_FN(ctx_open)(&G->ctx, device, G->desc, sizeof G->desc, msg, sizeof msg)) {
        free(G);
        return mf_fail(err, MF_EIO, "%s", msg);
    }
#if defined(MF_GPU_BACKEND_HIP)
    G->engine16 = GK_ENGINE_MMA;
#else
    G->engine16 = num->kind == MF_NUMERICS_NATIVE ? GK_ENGINE_BLAS : num->kind == MF_NUMERICS_FIXED ? GK_ENGINE_MMA
                                                                                                 : GK_ENGINE_EMU;
#endif
    gw W;
    int rc = GPU_FN(weight_of_mats)(G, &W, w, experts, err);
    const int N = W.n, K = W.k, Kp = W.kp;
    double *a_dev = GPU_FN(alloc)(G->ctx, (size_t)M * K * sizeof(double) + 8);
    double *c_dev = GPU_FN(alloc)(G->ctx, (size_t)M * N * sizeof(double) + 8);
    G->opA = GPU_FN(alloc)(G->ctx, (size_t)M * Kp * 4 + 16);
    G->cf = GPU_FN(alloc)(G->ctx, (size_t)M * N * 4 + 16);
    int *off_dev = offsets ? GPU_FN(alloc)(G->ctx, (size_t)(experts + 1) * sizeof(int)) : NULL;
    if (!rc && (!a_dev || !c_dev || !G->opA || !G->cf || (offsets && !off_dev)))
        rc = mf_fail(err, MF_ENOMEM, "%s: out of memory for a %dx%dx%d product", G->desc, M, N, K);
    if (!rc && (GPU_FN(upload)(G->ctx, a_dev, a, (size_t)M * K * sizeof(double)) ||
                (offsets && GPU_FN(upload)(G->ctx, off_dev, offsets, (size_t)(experts + 1) * sizeof(int)))))
        rc = mf_fail(err, MF_EIO, "%s: copying a product's operands failed", G->desc);
    if (!rc) {
        prod p = {.what = "product", .layer = 0, .in = in, .out = out, .M = M, .N = N, .K = K, .batch = 1,
                  .a = {a_dev, 0, 1, (size_t)K, 1}, .w = &W, .offsets = off_dev, .dst = c_dev, .ldc = (size_t)N};
        GPU_FN(emu_flag_reset)(G->ctx);
        rc = product(G, &p, err);
    }
    if (!rc && (GPU_FN(download)(G->ctx, c, c_dev, (size_t)M * N * sizeof(double)) ||
                GPU_FN(sync)(G->ctx, msg, sizeof msg)))
        rc = mf_fail(err, MF_EIO, "%s: product: %s", G->desc, msg);
    if (!rc && GPU_FN(emu_flag)(G->ctx) != INT32_MAX)
        rc = mf_fail(err, MF_EINVAL, "%s: the product met a value outside the emulator's exact range", G->desc);
    GPU_FN(weight_free)(G, &W);
    GPU_FN(free)(G->ctx, a_dev);
    GPU_FN(free)(G->ctx, c_dev);
    GPU_FN(free)(G->ctx, off_dev);
    GPU_FN(free)(G->ctx, G->opA);
    GPU_FN(free)(G->ctx, G->cf);
    GPU_FN(free)(G->ctx, G->wide);
    GPU_FN(ctx_close)(G->ctx);
    free(G);
    return rc;
}

const void *GPU_FN(gpu_host_logits)(const void *impl, mf_dtype *dtype) {
    *dtype = ((const gpu *)impl)->logits_dtype;
    return ((const gpu *)impl)->logits_host;
}

/* RoPE tables of positions 0 .. n - 1 as the CPU makes them (rdim values a row), cast to the stream's dtype
 * (DeepSeek-V2's complex freqs_cis stay fp32, opmath), into dst_cos and dst_sin (device) from row `from` on. */
static int upload_rope(gpu *G, int n, int from, double *dst_cos, double *dst_sin) {
    const mf_config *c = &G->m->cfg;
    const size_t hd = (size_t)G->rdim, rows = (size_t)(n - from);
    const mf_dtype td = c->rope_style == MF_ROPE_COMPLEX ? G->prec.opmath : G->prec.act;
    double *cs = mf_xmalloc((size_t)n * hd * sizeof(double)), *sn = mf_xmalloc((size_t)n * hd * sizeof(double));
    mf_rope_tables(c, &G->prec, n, cs, sn);
    for (size_t i = (size_t)from * hd; i < (size_t)n * hd; i++) {
        cs[i] = mf_round_to(td, cs[i]);
        sn[i] = mf_round_to(td, sn[i]);
    }
    const bool fail = GPU_FN(upload)(G->ctx, dst_cos, cs + (size_t)from * hd, rows * hd * sizeof(double)) ||
                      GPU_FN(upload)(G->ctx, dst_sin, sn + (size_t)from * hd, rows * hd * sizeof(double));
    free(cs);
    free(sn);
    return fail;
}

/* Of n new tokens at position pos, how many replay: the source's tokens must agree up to and including a
 * position for it to replay (the CPU's rule, runtime/cpu/forward.c), so the replayed positions are a prefix. */
static int replay_positions(gpu *G, const int32_t *tokens, int n, int pos) {
    const mf_replay *rp = G->replay;
    if (!rp) return 0;
    if (G->replay_agree > pos) G->replay_agree = pos;
    for (int t = 0; t < n; t++) {
        const int p = pos + t;
        if (G->replay_agree == p && p < rp->len && tokens[t] == rp->tokens[p]) G->replay_agree++;
    }
    const int n_rep = G->replay_agree - pos;
    return n_rep < 0 ? 0 : n_rep > n ? n : n_rep;
}

/* The replayed experts (and weights) of n_rep new positions from pos, every MoE layer's, to the device as
 * [n_moe][T][K] (the layout the route kernel reads, T the step's tokens). */
static int upload_replay(gpu *G, int T, int pos, int n_rep) {
    const mf_config *c = &G->m->cfg;
    const mf_replay *rp = G->replay;
    const size_t nm = (size_t)c->n_moe_layers, K = (size_t)c->top_k, n = (size_t)n_rep;
    uint16_t *ids = mf_xcalloc(nm * (size_t)T * K + 1, sizeof *ids);
    double *w = rp->weights ? mf_xcalloc(nm * (size_t)T * K + 1, sizeof *w) : NULL;
    for (size_t mi = 0; mi < nm; mi++) {
        const size_t src = (mi * (size_t)rp->len + (size_t)pos) * K, dst = mi * (size_t)T * K;
        memcpy(ids + dst, rp->ids + src, n * K * sizeof *ids);
        if (w) memcpy(w + dst, rp->weights + src, n * K * sizeof *w);
    }
    bool fail = GPU_FN(upload)(G->ctx, G->rep_ids, ids, nm * (size_t)T * K * sizeof *ids);
    if (w) fail = fail || GPU_FN(upload)(G->ctx, G->rep_w, w, nm * (size_t)T * K * sizeof *w);
    free(ids);
    free(w);
    return fail;
}

/* T new tokens at position pos: a whole sequence (pos 0, not cached), or a session's step (its keys and
 * values into the cache, which the queries read). */
static int run_tokens(gpu *G, const int32_t *tokens, int T, int pos, bool cached, unsigned capture, mf_seq_result *r,
                      mf_error *err) {
    const mf_model *m = G->m;
    const mf_config *c = &m->cfg;
    const mf_precision *P = &G->prec;
    const int H = c->hidden, V = c->vocab;
    memset(r, 0, sizeof *r);
    if (T <= 0) return mf_fail(err, MF_EINVAL, "empty sequence");
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return mf_fail(err, MF_EINVAL, "position %d: token id %d outside the vocabulary [0, %d)", pos + t, tokens[t], V);
    /* the scratch is sized by the keys a row sees, which a session's step has more of than its rows */
    int rc = ensure_scratch(G, pos + T, err);
    if (rc) return rc;
    G->ncalls = 0;
    GPU_FN(emu_flag_reset)(G->ctx);
    const size_t hd = (size_t)G->rdim;
    const double *cos_t = G->cos_t, *sin_t = G->sin_t;
    bool up_fail;
    if (cached && G->rope_cos) {   /* the session's tables, made once */
        cos_t = G->rope_cos + (size_t)pos * hd;
        sin_t = G->rope_sin + (size_t)pos * hd;
        up_fail = false;
    } else {
        /* dynamic NTK: the tables of the length so far, as transformers makes them at every step */
        up_fail = upload_rope(G, pos + T, pos, G->cos_t, G->sin_t) != 0;
    }
    const int n_rep = replay_positions(G, tokens, T, pos);
    up_fail = up_fail || GPU_FN(upload)(G->ctx, G->tokens, tokens, (size_t)T * sizeof(int32_t)) ||
              (n_rep > 0 && upload_replay(G, T, pos, n_rep));
    if (up_fail) return mf_fail(err, MF_EIO, "%s: copying the sequence to the GPU failed", G->desc);

    const size_t TH = (size_t)T * H;
    const mf_dtype Rd = P->act;
    step st = {G, T, 0, P->opmath, c->n_moe_layers > 0 && (capture & MF_GPU_ROUTING), pos, cached, n_rep, cos_t, sin_t};
    const double eps = (float)c->rms_eps;
    if (G->prof) {
        G->prof_forwards++;
        G->prof_last = mf_now();
    }
    GPU_FN(embed)(G->ctx, G->h, G->embed.w, G->embed.dt, G->tokens, T, H, gk_dt(Rd));
    int mi = 0;
    for (int l = 0; l < c->n_layers && !rc; l++) {
        glayer *L = &G->layers[l];
        st.l = l;
        const bool blk = mf_precision_layer_fp32(P, l, c->n_layers);
        const mf_dtype S = blk ? MF_F32 : Rd;
        const mf_dtype DN = blk ? MF_F32 : P->part[MF_PART_NORM], DA = blk ? MF_F32 : P->part[MF_PART_ATTN];
        const mf_dtype DM = blk ? MF_F32 : P->part[MF_PART_MLP], DR = blk ? MF_F32 : P->part[MF_PART_ROUTER];
        GPU_FN(rmsnorm)(G->ctx, G->x, G->h, T, H, (size_t)H, L->attn_norm, eps, gk_dt(DN), gk_dt(S), gk_dt(DA),
                        c->norm_weight_fp32);
        mark(G, P_NORM);
        if ((rc = c->attn == MF_ATTN_MLA ? mla_attention(&st, DA, L, err) : attention(&st, DA, L, err))) break;
        GPU_FN(residual)(G->ctx, G->h, G->y, TH, gk_dt(S), GK_F64);
        GPU_FN(rmsnorm)(G->ctx, G->x, G->h, T, H, (size_t)H, L->ffn_norm, eps, gk_dt(DN), gk_dt(S), gk_dt(DM),
                        c->norm_weight_fp32);
        mark(G, P_NORM);
        if (m->layers[l].is_moe) {
            rc = moe(&st, DM, DM == MF_F32 ? MF_F32 : DR, L, mi++, err);
        } else {
            rc = ffn(&st, DM, &L->mlp_gate, &L->mlp_up, &L->mlp_down, G->x, T, NULL, G->y, err);
            mark(G, P_DENSE);
        }
        if (rc) break;
        GPU_FN(residual)(G->ctx, G->h, G->y, TH, gk_dt(S), gk_dt(Rd));
        mark(G, P_NORM);
    }
    if (rc) return rc;
    const mf_dtype DH = P->part[MF_PART_HEAD];
    GPU_FN(rmsnorm)(G->ctx, G->x, G->h, T, H, (size_t)H, G->final_norm, eps, gk_dt(P->part[MF_PART_NORM]), gk_dt(Rd),
                    gk_dt(DH), c->norm_weight_fp32);
    prod ph = {.what = "head", .layer = c->n_layers, .in = DH, .out = DH, .M = T, .N = V, .K = H, .batch = 1,
               .a = {G->x, 0, 1, (size_t)H, 1}, .w = &G->head, .dst_packed = G->logits, .ldc = (size_t)V};
    if ((rc = product(G, &ph, err))) return rc;
    mark(G, P_HEAD);

    /* outputs, queued behind the work; one wait */
    mf_seq_result_shape(r, c, T);
    const size_t nm = (size_t)r->n_moe;
    G->logits_dtype = DH == MF_BF16 || DH == MF_F16 ? DH : MF_F32;
    const size_t lbytes = (size_t)T * V * (G->logits_dtype == MF_F32 ? 4 : 2);
    bool dl_fail = GPU_FN(download)(G->ctx, G->logits_host, G->logits, lbytes);
    if (st.routing) {
        /* widen each layer's routing as its copy lands, while the GPU runs on */
        const route_layout lo = route_layout_for(c, T);
        r->router = mf_xmalloc(nm * lo.router * sizeof(double));
        r->topk_w = mf_xmalloc(nm * lo.w * sizeof(double));
        r->topk_ids = mf_xmalloc(nm * lo.w * sizeof(uint16_t));
        if (lo.sh) r->shared_gate = mf_xmalloc(nm * lo.sh * sizeof(double));
        if (lo.sel) r->select = mf_xmalloc(nm * lo.sel * sizeof(double));
        for (size_t mi = 0; mi < nm && !dl_fail; mi++) {
            if (GPU_FN(wait_mark)(G->ctx, (int)mi, G->msg, sizeof G->msg)) {
                mf_seq_result_free(r);
                return gpu_fail(G, err, "copying the routing");
            }
            const float *f = (const float *)G->route_host + mi * lo.per_layer;
            widen(r->router + mi * lo.router, f, lo.router);
            widen(r->topk_w + mi * lo.w, f + lo.router, lo.w);
            if (lo.sh) widen(r->shared_gate + mi * lo.sh, f + lo.router + lo.w, lo.sh);
            if (lo.sel) widen(r->select + mi * lo.sel, f + lo.router + lo.w + lo.sh, lo.sel);
        }
        memcpy(r->topk_ids, (const float *)G->route_host + lo.ids_at, nm * lo.w * sizeof(uint16_t));
    }
    if (GPU_FN(sync)(G->ctx, G->msg, sizeof G->msg) || dl_fail) {
        mf_seq_result_free(r);
        return gpu_fail(G, err, "running the sequence");
    }
    const int flagged = GPU_FN(emu_flag)(G->ctx);
    if (flagged != INT32_MAX) {
        mf_seq_result_free(r);
        return mf_fail(err, MF_EUNSUPPORTED, "%s: %s: %s met an infinite, NaN or out-of-range value, which the GPU "
                       "emulator does not model; trace this one on the CPU", G->desc, G->num.name,
                       flagged < MAX_CALLS ? G->calls[flagged] : "a product");
    }
    if (capture & MF_GPU_LOGITS) {
        r->logits = mf_xmalloc((size_t)T * V * sizeof(double));
        const size_t n = (size_t)T * V;
        const uint16_t *h16 = G->logits_host;
        const float *f32 = G->logits_host;
        const mf_dtype ld = G->logits_dtype;
#pragma omp parallel for if (n > 1000000)
        for (size_t i = 0; i < n; i++)
            r->logits[i] = ld == MF_BF16 ? mf_bf16_to_f32(h16[i]) : ld == MF_F16 ? mf_f16_to_f32(h16[i]) : f32[i];
    }
    mark(G, P_OUTPUT);
    return MF_OK;
}

int GPU_FN(gpu_forward)(void *impl, const int32_t *tokens, int T, unsigned capture, mf_seq_result *r, mf_error *err) {
    gpu *G = impl;
    G->replay_agree = 0;
    return run_tokens(G, tokens, T, 0, false, capture, r, err);
}

int GPU_FN(gpu_session_forward)(void *impl, const int32_t *tokens, int n, unsigned capture, mf_seq_result *r,
                                mf_error *err) {
    gpu *G = impl;
    memset(r, 0, sizeof *r);
    if (!G->kv) return mf_fail(err, MF_EINVAL, "%s: the model was opened without a key-value cache", G->desc);
    if (n <= 0) return mf_fail(err, MF_EINVAL, "empty sequence");
    if (G->pos > 0 && n != 1)
        return mf_fail(err, MF_EUNSUPPORTED, "after the prompt, the tokens of a sequence come one at a time");
    if (G->pos + n > G->cache_T)
        return mf_fail(err, MF_EINVAL, "position %d is past the %d the cache was made for", G->pos + n - 1, G->cache_T);
    const int rc = run_tokens(G, tokens, n, G->pos, true, capture, r, err);
    if (!rc) G->pos += n;
    return rc;
}

int GPU_FN(gpu_session_rewind)(void *impl, int pos, mf_error *err) {
    gpu *G = impl;
    if (pos < 0 || pos > G->pos)
        return mf_fail(err, MF_EINVAL, "a session at position %d cannot rewind to %d", G->pos, pos);
    G->pos = pos;   /* the cache's rows from pos on are written again by the next steps */
    if (G->replay_agree > pos) G->replay_agree = pos;
    return MF_OK;
}

void GPU_FN(gpu_set_replay)(void *impl, const mf_replay *rp) {
    gpu *G = impl;
    G->replay = rp;
    G->replay_agree = 0;
}
