/* The model's weights onto a GPU, host side (C17).
 *
 * Every weight gets one device copy in the dtype the model keeps it in
 * (mf_weight_storage of its checkpoint dtype under the policy), rows padded
 * to a multiple of 16 values for the tensor-core kernels. The bytes go from
 * the checkpoint's files straight to the device: each file is read once, in
 * order, with pread into pinned staging slots by a few reader threads, while
 * one thread hashes the slots in file order (the weights digest, when it is
 * still to be made) and queues their copies; a slot is read again only once
 * its copies are done. Where a weight's device layout is its file layout
 * (same dtype, no padding) the copy lands in place; otherwise it lands in a
 * device staging slot and a kernel rounds and scatters it (mf_store_from_f64's
 * rounding, so a CPU and a GPU run of one policy hold the same weights).
 * Nothing is faulted into the process's mapping, so the host's resident
 * memory stays the pinned slots and the model's small vectors. */
#include "gpu_host.h"

#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* bytes per staging slot, and slots in flight */
#define SLOT_BYTES ((size_t)32 << 20)
#define SLOTS 6

static size_t dt_size(int dt) { return dt == GK_F64 ? 8 : dt == GK_F32 ? 4 : 2; }

static int gk_of(mf_dtype t) { return t == MF_F64 ? GK_F64 : gk_dt(t); }

/* ---- block-scaled weights: the checkpoint's tensors as they are ---------------- */

/* A checkpoint tensor holding codes or scales of block-scaled weights, at `off` in the device arena. */
typedef struct gq_tensor {
    const uint8_t *host;
    size_t bytes, file, file_off, off;
} gq_tensor;

static int cmp_gq(const void *a, const void *b) {
    const gq_tensor *x = a, *y = b;
    return x->host < y->host ? -1 : x->host > y->host;
}

/* Every tensor of the checkpoint, by address, for finding which one holds a weight's codes. */
static gq_tensor *all_tensors(const mf_checkpoint *ck, size_t *count) {
    size_t n = 0;
    for (size_t f = 0; f < ck->nfiles; f++) n += ck->files[f]->count;
    gq_tensor *v = mf_xcalloc(n ? n : 1, sizeof *v);
    n = 0;
    for (size_t f = 0; f < ck->nfiles; f++)
        for (size_t i = 0; i < ck->files[f]->count; i++) {
            const mf_st_tensor *t = &ck->files[f]->tensors[i];
            if (!t->data || !t->nbytes) continue;
            v[n++] = (gq_tensor){t->data, t->nbytes, f, (size_t)(t->data - ck->files[f]->map.data), 0};
        }
    qsort(v, n, sizeof *v, cmp_gq);
    *count = n;
    return v;
}

/* The tensor of v (sorted) holding [p, p + bytes), or NULL. */
static const gq_tensor *holding(const gq_tensor *v, size_t n, const void *p, size_t bytes) {
    size_t lo = 0, hi = n;
    while (lo < hi) {   /* the last tensor starting at or before p */
        const size_t mid = (lo + hi) / 2;
        if (v[mid].host <= (const uint8_t *)p) lo = mid + 1;
        else hi = mid;
    }
    if (!lo) return NULL;
    const gq_tensor *t = &v[lo - 1];
    const size_t at = (size_t)((const uint8_t *)p - t->host);
    return at < t->bytes && bytes <= t->bytes - at ? t : NULL;
}

/* The bytes a block-scaled view reads from its codes and from its scales (row-major, cs 1). */
static void q_spans(const mf_mat *w, size_t *codes, size_t *scales) {
    const mf_mat_scales *q = &w->q;
    const size_t last = (size_t)(w->n - 1) * w->rs + (size_t)w->k;   /* values up to the last one read, + 1 */
    *codes = q->kind == MF_WQ_MXFP4 ? (last + 1) / 2 : last;
    const size_t srows = (size_t)((w->n + q->bn - 1) / q->bn), scols = (size_t)((w->k + q->bk - 1) / q->bk);
    *scales = ((srows - 1) * q->rs + scols) * mf_dtype_size(q->dtype);
}

/* The device description of a block-scaled view (its pointers filled in later); 0, or nonzero when the GPU
 * kernels do not read such a view. */
static int q_desc(gk_wq *d, const mf_mat *w) {
    const mf_mat_scales *q = &w->q;
    memset(d, 0, sizeof *d);
    if (w->cs != 1 || w->n <= 0 || w->k <= 0 || q->bn <= 0 || q->bk <= 0) return 1;
    if (q->kind == MF_WQ_FP8_BLOCK) {
        if (q->dtype != MF_F32 && q->dtype != MF_BF16 && q->dtype != MF_F16) return 1;
        d->kind = GK_WQ_FP8;
        d->sdt = gk_dt(q->dtype);
    } else {
        if (q->dtype != MF_U8 || w->rs % 2) return 1;
        d->kind = GK_WQ_MXFP4;
    }
    if (q->round != MF_F32 && q->round != MF_BF16 && q->round != MF_F16) return 1;
    d->bn = q->bn;
    d->bk = q->bk;
    d->round = gk_dt(q->round);
    d->rs = w->rs;
    d->srs = q->rs;
    return 0;
}

/* One weight's layout: rows [experts * n][kp] of the model's storage dtype; a block-scaled one keeps its
 * tensors (counted apart, in G->qt) and a table of its experts' pointers. */
static size_t plan_linear(gpu *G, gw *w, const mf_linear *L, int experts) {
    memset(w, 0, sizeof *w);
    if (!L || !L->w.data) return 0;
    w->n = L->out;
    w->k = L->in;
    w->kp = round16(L->in);
    w->experts = experts;
    if (L->w.q.kind != MF_WQ_NONE) {
        w->dt = gk_dt(L->w.q.round);
        w->q.kind = L->w.q.kind == MF_WQ_FP8_BLOCK ? GK_WQ_FP8 : GK_WQ_MXFP4;   /* checked at the upload */
        const size_t wide = (size_t)w->n * w->kp * 4;   /* cuBLAS's widened copy of a dense one, at most fp32 */
        if (experts == 1 && wide > G->q_wide_bytes) G->q_wide_bytes = wide;
        return (size_t)2 * experts * sizeof(void *);
    }
    w->dt = gk_dt(mf_weight_storage(L->w.dtype, G->m->weight_round));
    return (size_t)experts * w->n * w->kp * dt_size(w->dt);
}

/* Every linear of layer l with its device weight, in one table for the plan,
 * the upload and the free. */
typedef struct lin_ref {
    gw *w;
    const mf_linear *L;
    int experts;
} lin_ref;

static int layer_linears(gpu *G, int l, lin_ref *out) {
    const mf_config *c = &G->m->cfg;
    const mf_layer *ML = &G->m->layers[l];
    glayer *L = &G->layers[l];
    int n = 0;
#define ADD(dst, src, e) (out[n].w = (dst), out[n].L = (src), out[n].experts = (e), n++)
    /* absent ones (k and v of latent attention, q_a and q_b without q_lora_rank, ...) have no data: no weight */
    ADD(&L->q, &ML->q, 1);
    ADD(&L->k, &ML->k, 1);
    ADD(&L->v, &ML->v, 1);
    ADD(&L->o, &ML->o, 1);
    ADD(&L->q_a, &ML->q_a, 1);
    ADD(&L->q_b, &ML->q_b, 1);
    ADD(&L->kv_a, &ML->kv_a, 1);
    ADD(&L->kv_b, &ML->kv_b, 1);
    if (ML->is_moe) {
        ADD(&L->router, &ML->router, 1);
        ADD(&L->exp_gate, ML->exp_gate, c->n_experts);
        ADD(&L->exp_up, ML->exp_up, c->n_experts);
        ADD(&L->exp_down, ML->exp_down, c->n_experts);
        if (c->has_shared_expert || c->n_shared_experts > 0) {
            ADD(&L->sh_gate, &ML->sh_gate, 1);
            ADD(&L->sh_up, &ML->sh_up, 1);
            ADD(&L->sh_down, &ML->sh_down, 1);
            if (c->has_shared_expert) ADD(&L->sh_router, &ML->sh_router, 1);
        }
    } else {
        ADD(&L->mlp_gate, &ML->mlp_gate, 1);
        ADD(&L->mlp_up, &ML->mlp_up, 1);
        ADD(&L->mlp_down, &ML->mlp_down, 1);
    }
#undef ADD
    return n;
}

#define MAX_LAYER_LINEARS 20

/* gpt-oss's bf16 experts as the loader leaves them for a GPU (MF_LOAD_NO_CONVERT): strided views of the fused
 * tensors, gate_up_proj [E][H][2I] (gate i at column 2i, up i at 2i + 1) and down_proj [E][I][H] (models/load.c) */
static bool fused_bf16(const mf_layer *ML) { return ML->is_moe && ML->exp_gate && ML->exp_gate[0].w.cs != 1; }

/* gpt-oss's MXFP4 experts as the loader leaves them: gate and up are the even and odd rows of one block matrix
 * [2I, H] an expert (models/load.c), so that matrix itself, rows in the same interleaved order, is the fused
 * weight; checked for every expert, as the views could come from anywhere */
static bool fused_mxfp4(const mf_layer *ML, int experts) {
    if (!ML->is_moe || !ML->exp_gate || !ML->exp_up || ML->exp_gate[0].w.q.kind != MF_WQ_MXFP4) return false;
    for (int e = 0; e < experts; e++) {
        const mf_mat *g = &ML->exp_gate[e].w, *u = &ML->exp_up[e].w;
        if (g->q.kind != MF_WQ_MXFP4 || u->q.kind != MF_WQ_MXFP4 || g->k % 2 || g->rs != 2 * (size_t)g->k ||
            u->rs != g->rs || g->q.rs % 2 || u->q.rs != g->q.rs || u->n != g->n || u->k != g->k ||
            (const uint8_t *)u->data != (const uint8_t *)g->data + g->k / 2 ||
            (const uint8_t *)u->q.data != (const uint8_t *)g->q.data + g->q.rs / 2)
            return false;
    }
    return true;
}

/* gpt-oss's gate and up as one weight of 2I rows an expert: bf16 fused views, or MXFP4 blocks */
static bool fused_experts(const gpu *G, const mf_layer *ML) {
    return fused_bf16(ML) || fused_mxfp4(ML, G->m->cfg.n_experts);
}

size_t GPU_FN(weights_plan)(gpu *G) {
    if (!G->layers) G->layers = mf_xcalloc((size_t)G->m->cfg.n_layers, sizeof(glayer));
    const mf_model *m = G->m;
    const mf_config *c = &m->cfg;
    size_t bytes = 0;
    lin_ref refs[MAX_LAYER_LINEARS];
    size_t n_all = 0, cap = 0;
    gq_tensor *all = NULL;
    free(G->qt);
    G->qt = NULL;
    G->n_qt = 0;
    G->q_wide_bytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const int n = layer_linears(G, l, refs);
        for (int i = 0; i < n; i++) {
            bytes += plan_linear(G, refs[i].w, refs[i].L, refs[i].experts);
            if (!refs[i].w->q.kind) continue;
            if (!all) all = all_tensors(m->ckpt, &n_all);
            for (int e = 0; e < refs[i].experts; e++) {   /* each tensor its codes and scales lie in (once) */
                const mf_mat *w = &refs[i].L[e].w;
                size_t cb, sb;
                q_spans(w, &cb, &sb);
                const gq_tensor *tc = holding(all, n_all, w->data, cb), *ts = holding(all, n_all, w->q.data, sb);
                for (int x = 0; x < 2; x++) {
                    const gq_tensor *t = x ? ts : tc;
                    if (!t || (G->n_qt && G->qt[G->n_qt - 1].host == t->host)) continue;   /* gate and up share one */
                    if (G->n_qt == cap) G->qt = mf_xrealloc(G->qt, (cap = cap ? 2 * cap : 64) * sizeof *G->qt);
                    G->qt[G->n_qt++] = *t;
                }
            }
        }
        if (fused_experts(G, &m->layers[l])) {   /* gpt-oss: one weight of 2I rows an expert for gate and up */
            glayer *L = &G->layers[l];
            L->exp_gate.n *= 2;
            memset(&L->exp_up, 0, sizeof L->exp_up);
        }
    }
    free(all);
    if (G->n_qt) {   /* unique, by address, each at a 256-byte boundary of the arena */
        qsort(G->qt, G->n_qt, sizeof *G->qt, cmp_gq);
        size_t u = 0, off = 0;
        for (size_t i = 0; i < G->n_qt; i++) {
            if (u && G->qt[u - 1].host == G->qt[i].host) continue;
            G->qt[u] = G->qt[i];
            G->qt[u++].off = off;
            off += (G->qt[i].bytes + 255) / 256 * 256;
        }
        G->n_qt = u;
        G->qarena_bytes = off;
        bytes += off;
    }
    /* the embedding as its table [V][H]; a tied head shares it where the layouts agree */
    gw *e = &G->embed;
    memset(e, 0, sizeof *e);
    e->n = c->vocab;
    e->k = e->kp = c->hidden;
    e->experts = 1;
    e->dt = gk_dt(mf_weight_storage(m->embed->dtype, m->weight_round));
    bytes += (size_t)e->n * e->k * dt_size(e->dt);
    bytes += plan_linear(G, &G->head, &m->head, 1);
    if (c->tie_embeddings && G->head.kp == e->k && G->head.dt == e->dt) {
        bytes -= (size_t)G->head.n * G->head.kp * dt_size(G->head.dt);
        G->head.shared = true;
    }
    /* norms (doubles) and biases (floats) */
    bytes += (size_t)c->n_layers * (2 * (size_t)c->hidden + 2 * (size_t)c->n_heads * c->head_dim) * 8;
    bytes += (size_t)c->n_layers * ((size_t)c->q_lora_rank + c->kv_lora_rank + c->n_experts) * 8;   /* MLA, biases */
    if (c->clamped_swiglu)   /* gpt-oss: sinks and the experts' biases (doubles) */
        bytes += (size_t)c->n_layers * ((size_t)c->n_heads + (size_t)c->n_experts * (2 * c->moe_intermediate + c->hidden)) * 8;
    G->weight_bytes = bytes;
    return bytes;
}

/* ---- the stream from files to device ---------------------------------------- */

/* A source range of one file with the device place of its elements: element
 * e of the range goes to dst[(e / k) * kp + e % k] as dst_dt; or, transposed
 * (ta > 0: per-expert matrices [ta][tb] that the products read as columns),
 * where place_t puts it. */
typedef struct seg {
    size_t file, off, bytes;
    int src_dt, dst_dt, k, kp;
    void *dst;
    int ta, tb;
    bool direct;   /* same dtype, no padding: the bytes land as they are */
} seg;

typedef struct segs {
    seg *v;
    size_t n, cap;
} segs;

static int add_seg(gpu *G, segs *S, const void *src, mf_dtype src_dt, size_t elems, int k, void *dst, int dst_dt,
                   int kp, mf_error *err) {
    const mf_checkpoint *ck = G->m->ckpt;
    const uint8_t *p = src;
    for (size_t f = 0; f < ck->nfiles; f++) {
        const mf_mmap *mp = &ck->files[f]->map;
        if (p < mp->data || p >= mp->data + mp->size) continue;
        if (S->n == S->cap) {
            S->cap = S->cap ? 2 * S->cap : 256;
            S->v = mf_xrealloc(S->v, S->cap * sizeof *S->v);
        }
        seg *s = &S->v[S->n++];
        s->file = f;
        s->off = (size_t)(p - mp->data);
        s->bytes = elems * mf_dtype_size(src_dt);
        s->src_dt = gk_of(src_dt);
        s->dst_dt = dst_dt;
        s->k = k;
        s->kp = kp;
        s->dst = dst;
        s->ta = s->tb = 0;
        s->direct = s->src_dt == dst_dt && k == kp;
        return MF_OK;
    }
    return mf_fail(err, MF_EINVAL, "%s: a weight lies outside the checkpoint's files (converted on the host?)",
                   G->desc);
}

static int cmp_seg(const void *a, const void *b) {
    const seg *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int alloc_weight(gpu *G, gw *w, mf_error *err) {
    const size_t bytes = (size_t)w->experts * w->n * w->kp * dt_size(w->dt);
    w->w = GPU_FN(alloc)(G->ctx, bytes);
    if (!w->w) return mf_fail(err, MF_ENOMEM, "%s: cannot hold %zu MB of weights", G->desc, bytes >> 20);
    if (w->kp != w->k && GPU_FN(zero)(G->ctx, w->w, bytes))
        return mf_fail(err, MF_EIO, "%s: clearing a weight's padding failed", G->desc);
    return MF_OK;
}

/* The device address of host bytes p of a block-scaled tensor (uploaded whole into the arena), or NULL. */
static void *q_device(const gpu *G, const void *p, size_t bytes) {
    const gq_tensor *t = holding(G->qt, G->n_qt, p, bytes);
    return t ? (uint8_t *)G->qarena + t->off + ((const uint8_t *)p - t->host) : NULL;
}

/* A block-scaled weight's table of its experts' codes and scales, pointing into the arena. */
static int q_pointers(gpu *G, gw *w, const mf_linear *L, mf_error *err) {
    const int kind = w->q.kind;
    const size_t E = (size_t)w->experts;
    void **tab = mf_xmalloc(2 * E * sizeof *tab);
    int rc = MF_OK;
    for (size_t e = 0; e < E && !rc; e++) {
        const mf_mat *m = &L[e].w;
        size_t cb, sb;
        gk_wq d;
        const bool bad = q_desc(&d, m) || d.kind != kind ||
                         (e && (d.sdt != w->q.sdt || d.bn != w->q.bn || d.bk != w->q.bk || d.round != w->q.round ||
                                d.rs != w->q.rs || d.srs != w->q.srs));   /* the experts alike */
        if (!e) w->q = d;
        if (bad) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: a block-scaled weight [%d, %d] whose layout (row stride %zu, "
                         "column stride %zu, scales %s per %dx%d, values %s) the GPU's products do not read", G->desc,
                         m->n, m->k, m->rs, m->cs, mf_dtype_name(m->q.dtype), m->q.bn, m->q.bk,
                         mf_dtype_name(m->q.round));
            break;
        }
        q_spans(m, &cb, &sb);
        tab[e] = q_device(G, m->data, cb);
        tab[E + e] = q_device(G, m->q.data, sb);
        if (!tab[e] || !tab[E + e])
            rc = mf_fail(err, MF_EINVAL, "%s: a block-scaled weight [%d, %d] (expert %zu) lies outside the "
                         "checkpoint's tensors", G->desc, m->n, m->k, e);
    }
    w->q.kind = kind;
    if (!rc && !(w->qtab = GPU_FN(alloc)(G->ctx, 2 * E * sizeof *tab)))
        rc = mf_fail(err, MF_ENOMEM, "%s: out of memory for a weight's table of experts", G->desc);
    if (!rc && GPU_FN(upload)(G->ctx, w->qtab, tab, 2 * E * sizeof *tab))
        rc = mf_fail(err, MF_EIO, "%s: copying a weight's table of experts to the GPU failed", G->desc);
    w->q.codes = (const uint8_t *const *)w->qtab;
    w->q.scales = (const void *const *)((void **)w->qtab + E);
    free(tab);
    return rc;
}

static int linear_segs(gpu *G, segs *S, gw *w, const mf_linear *L, mf_error *err) {
    if (!w->n) return MF_OK;
    /* a block-scaled weight's bytes come with its tensors (the arena); a plain one's are its own */
    int rc = w->q.kind ? q_pointers(G, w, L, err) : alloc_weight(G, w, err);
    const size_t per = (size_t)w->n * w->kp * dt_size(w->dt);
    for (int e = 0; e < w->experts && !rc && !w->q.kind; e++)
        rc = add_seg(G, S, L[e].w.data, L[e].w.dtype, (size_t)w->n * w->k, w->k, (uint8_t *)w->w + e * per, w->dt,
                     w->kp, err);
    if (!rc && L->bias) {
        float *b = mf_xmalloc((size_t)w->n * sizeof(float));
        for (int j = 0; j < w->n; j++) b[j] = (float)L->bias[j];
        w->bias = GPU_FN(alloc)(G->ctx, (size_t)w->n * sizeof(float));
        rc = !w->bias || GPU_FN(upload)(G->ctx, w->bias, b, (size_t)w->n * sizeof(float));
        free(b);
        if (rc) rc = mf_fail(err, MF_ENOMEM, "%s: out of memory for a bias", G->desc);
    }
    return rc;
}

static double *upload_doubles(gpu *G, const double *src, size_t n) {
    if (!src) return NULL;
    double *d = GPU_FN(alloc)(G->ctx, n * sizeof(double));
    if (d && GPU_FN(upload)(G->ctx, d, src, n * sizeof(double))) {
        GPU_FN(free)(G->ctx, d);
        return NULL;
    }
    return d;
}

/* The fused experts' biases beside them: gate_up's [E][2I] interleaved and down's [E][H], doubles as the loader
 * rounded them */
static int expert_biases(gpu *G, glayer *L, const mf_layer *ML, mf_error *err) {
    const int E = G->m->cfg.n_experts, I = L->exp_gate.n / 2, H = L->exp_gate.k;
    double *bgu = mf_xmalloc((size_t)E * 2 * I * sizeof(double)), *bd = mf_xmalloc((size_t)E * H * sizeof(double));
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < I; i++) {
            bgu[((size_t)e * I + i) * 2] = ML->exp_gate[e].bias[i];
            bgu[((size_t)e * I + i) * 2 + 1] = ML->exp_up[e].bias[i];
        }
        memcpy(bd + (size_t)e * H, ML->exp_down[e].bias, (size_t)H * sizeof(double));
    }
    L->eb_gate_up = upload_doubles(G, bgu, (size_t)E * 2 * I);
    L->eb_down = upload_doubles(G, bd, (size_t)E * H);
    free(bgu);
    free(bd);
    if (!L->eb_gate_up || !L->eb_down)
        return mf_fail(err, MF_ENOMEM, "%s: out of memory for the expert biases", G->desc);
    return MF_OK;
}

/* On the device they are weights as the grouped products read any experts', rows the outputs: exp_gate holds the
 * fused gate_up, [E][2I][Hp] with its rows in the checkpoint's interleaved order (row 2i gate i, 2i + 1 up i: one
 * product for both, whose kernel after pairs the columns), exp_down [E][H][Ip]. Each tensor is one segment of its
 * file, transposed by place_t as it lands. An MXFP4 checkpoint's rows are the outputs already, gate_up's
 * [E][2I][H/32] blocks in this very order: its packed blocks are this B operand as they lie in the arena, nothing
 * dequantised. The biases go beside (expert_biases). */
static int fused_expert_segs(gpu *G, segs *S, glayer *L, const mf_layer *ML, mf_error *err) {
    const mf_config *c = &G->m->cfg;
    const int E = c->n_experts, I = L->exp_gate.n / 2, H = L->exp_gate.k;
    int rc;
    if (L->exp_gate.q.kind) {   /* MXFP4: each expert's [2I, H] blocks and scales where the arena holds them */
        mf_linear *gu = mf_xmalloc((size_t)E * sizeof *gu);
        for (int e = 0; e < E; e++) {
            gu[e] = ML->exp_gate[e];
            gu[e].w.n = 2 * I;
            gu[e].w.rs /= 2;
            gu[e].w.q.rs /= 2;
        }
        rc = q_pointers(G, &L->exp_gate, gu, err);
        free(gu);
        if (!rc) rc = q_pointers(G, &L->exp_down, ML->exp_down, err);
        if (rc) return rc;
        return expert_biases(G, L, ML, err);
    }
    if ((rc = alloc_weight(G, &L->exp_gate, err)) || (rc = alloc_weight(G, &L->exp_down, err))) return rc;
    const mf_mat *gu = &ML->exp_gate[0].w, *dn = &ML->exp_down[0].w;
    if ((rc = add_seg(G, S, gu->data, gu->dtype, (size_t)E * H * 2 * I, H, L->exp_gate.w, L->exp_gate.dt,
                      L->exp_gate.kp, err)))
        return rc;
    seg *s = &S->v[S->n - 1];
    s->ta = H;
    s->tb = 2 * I;
    s->direct = false;
    if ((rc = add_seg(G, S, dn->data, dn->dtype, (size_t)E * I * H, I, L->exp_down.w, L->exp_down.dt, L->exp_down.kp,
                      err)))
        return rc;
    s = &S->v[S->n - 1];
    s->ta = I;
    s->tb = H;
    s->direct = false;
    return expert_biases(G, L, ML, err);
}

static void pause_briefly(void) {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* Where chunks of file f end: every SLOT_BYTES at most, moved back to an
 * element boundary of the converted segment it would cut, so that each
 * chunk's part of a segment is whole elements. */
static size_t *chunk_ends(const segs *S, size_t first, size_t f, size_t size, size_t *count) {
    size_t n = 0, cap = size / SLOT_BYTES + 2, at = 0, s = first;
    size_t *ends = mf_xmalloc(cap * sizeof *ends);
    while (at < size) {
        size_t end = at + SLOT_BYTES < size ? at + SLOT_BYTES : size;
        while (s < S->n && S->v[s].file == f && S->v[s].off + S->v[s].bytes <= end) s++;
        for (size_t t = s; t < S->n && S->v[t].file == f && S->v[t].off < end; t++) {
            const seg *g = &S->v[t];
            if (g->direct || end <= g->off || end >= g->off + g->bytes) continue;
            const size_t esz = dt_size(g->src_dt), cut = g->off + (end - g->off) / esz * esz;
            if (cut > at) end = cut < end ? cut : end;
        }
        if (n == cap) ends = mf_xrealloc(ends, (cap *= 2) * sizeof *ends);
        ends[n++] = end;
        at = end;
    }
    *count = n;
    return ends;
}

/* The copies of one chunk [cs, ce) of file f, held at host (pinned) */
static int queue_chunk(gpu *G, const segs *S, size_t *first, size_t f, size_t cs, size_t ce, const uint8_t *host,
                       void *stage) {
    while (*first < S->n && S->v[*first].file == f && S->v[*first].off + S->v[*first].bytes <= cs) (*first)++;
    for (size_t t = *first; t < S->n && S->v[t].file == f && S->v[t].off < ce; t++) {
        const seg *g = &S->v[t];
        const size_t a = g->off > cs ? g->off : cs, b = g->off + g->bytes < ce ? g->off + g->bytes : ce;
        if (b <= a) continue;
        if (g->direct) {
            if (GPU_FN(copy_async)(G->ctx, (uint8_t *)g->dst + (a - g->off), host + (a - cs), b - a)) return 1;
            continue;
        }
        const size_t esz = dt_size(g->src_dt);
        if (GPU_FN(copy_async)(G->ctx, (uint8_t *)stage + (a - cs), host + (a - cs), b - a)) return 1;
        if (g->ta > 0)
            GPU_FN(place_t)(G->ctx, g->dst, g->dst_dt, g->ta, g->tb, g->kp, (a - g->off) / esz,
                            (uint8_t *)stage + (a - cs), g->src_dt, (b - a) / esz);
        else
            GPU_FN(place)(G->ctx, g->dst, g->dst_dt, g->k, g->kp, (a - g->off) / esz, (uint8_t *)stage + (a - cs),
                          g->src_dt, (b - a) / esz);
    }
    return 0;
}

/* Time spent, for MOEFLIP_UPLOAD_STATS=1 */
typedef struct upload_stats {
    double read_s, queue_s, hash_s, wait_s;
    size_t bytes;
} upload_stats;

/* Streams file f: reader threads pread chunks into the pinned slots and
 * queue their copies (CUDA's calls are thread-safe; the copies are
 * independent), while this thread hashes the slots in file order; a slot is
 * filled again once it is hashed and its copies are done. */
static int stream_file(gpu *G, const segs *S, size_t first, size_t f, uint8_t **host, void **stage, bool hash,
                       char hex[33], upload_stats *st, mf_error *err) {
    const mf_st_file *sf = G->m->ckpt->files[f];
    const size_t size = sf->map.size;
    int fd = open(sf->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mf_fail(err, MF_EIO, "%s: cannot open: %s", sf->path, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    size_t nchunks;
    size_t *ends = chunk_ends(S, first, f, size, &nchunks);
    /* slot i holds chunk ready[i] (read and its copies queued); consumed[i] is the last chunk hashed out of it */
    atomic_long ready[SLOTS], consumed[SLOTS];
    for (int i = 0; i < SLOTS; i++) {
        atomic_init(&ready[i], -1);
        atomic_init(&consumed[i], (long)i - SLOTS);
    }
    atomic_int failed;
    atomic_init(&failed, 0);
    int read_errno = 0;
    mf_digest_state *d = hash ? mf_digest_new() : NULL;
    int readers = omp_get_num_procs() - 1;
    readers = readers < 1 ? 1 : readers > SLOTS - 1 ? SLOTS - 1 : readers;
    double read_s = 0, queue_s = 0, hash_s = 0, wait_s = 0;
#pragma omp parallel num_threads(readers + 1) reduction(+ : read_s, queue_s)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        if (tid == 0 && nt > 1) {
            for (size_t ch = 0; ch < nchunks; ch++) {
                const int slot = (int)(ch % SLOTS);
                const double t0 = mf_now();
                while (atomic_load(&ready[slot]) != (long)ch && !atomic_load(&failed)) pause_briefly();
                if (atomic_load(&failed)) break;
                const double t1 = mf_now();
                const size_t cs = ch ? ends[ch - 1] : 0, ce = ends[ch];
                if (d) mf_digest_update(d, host[slot], ce - cs);
                wait_s += t1 - t0;
                hash_s += mf_now() - t1;
                atomic_store(&consumed[slot], (long)ch);
            }
        } else {
            const int me = nt > 1 ? tid - 1 : 0, step = nt > 1 ? nt - 1 : 1;
            if (GPU_FN(bind_thread)(G->ctx)) atomic_store(&failed, 2);   /* a new thread's device is device 0 */
            /* this reader's chunks: me, me + step, ... */
            for (size_t ch = (size_t)me; ch < nchunks && !atomic_load(&failed); ch += (size_t)step) {
                const int slot = (int)(ch % SLOTS);
                while (atomic_load(&consumed[slot]) != (long)ch - SLOTS && !atomic_load(&failed)) pause_briefly();
                if (atomic_load(&failed)) break;
                if (ch >= SLOTS && GPU_FN(slot_wait)(G->ctx, slot)) {
                    atomic_store(&failed, 2);
                    break;
                }
                const size_t cs = ch ? ends[ch - 1] : 0, ce = ends[ch];
                const double t0 = mf_now();
                size_t got = 0;
                while (got < ce - cs) {
                    const ssize_t r = pread(fd, host[slot] + got, ce - cs - got, (off_t)(cs + got));
                    if (r <= 0) {
                        read_errno = r < 0 ? errno : 0;
                        atomic_store(&failed, 1);
                        break;
                    }
                    got += (size_t)r;
                }
                if (got < ce - cs) break;
                const double t1 = mf_now();
                /* the chunk's segments: from the first that can reach it */
                size_t at = first;
                while (at < S->n && S->v[at].file == f && S->v[at].off + S->v[at].bytes <= cs) at++;
                if (queue_chunk(G, S, &at, f, cs, ce, host[slot], stage[slot]) || GPU_FN(slot_record)(G->ctx, slot)) {
                    atomic_store(&failed, 2);
                    break;
                }
                read_s += t1 - t0;
                queue_s += mf_now() - t1;
                atomic_store(&ready[slot], (long)ch);
                if (nt == 1) {   /* alone: the hashing is this thread's too, chunk after chunk */
                    if (d) mf_digest_update(d, host[slot], ce - cs);
                    atomic_store(&consumed[slot], (long)ch);
                }
            }
        }
    }
    close(fd);
    free(ends);
    if (d) mf_digest_final(d, hex);
    st->read_s += read_s;
    st->queue_s += queue_s;
    st->hash_s += hash_s;
    st->wait_s += wait_s;
    st->bytes += size;
    const int why = atomic_load(&failed);
    if (why == 1)
        return mf_fail(err, MF_EIO, "%s: read failed: %s", sf->path,
                       read_errno ? strerror(read_errno) : "the file is shorter than when it was opened");
    if (why == 2) return mf_fail(err, MF_EIO, "%s: queueing the copy of %s to the GPU failed", G->desc, sf->path);
    return MF_OK;
}

int GPU_FN(weights_upload)(gpu *G, mf_error *err) {
    mf_model *m = G->m;
    const mf_config *c = &m->cfg;
    segs S = {0};
    int rc = MF_OK;
    lin_ref refs[MAX_LAYER_LINEARS];
    /* the block-scaled tensors, whole, as the files hold them: one arena, each copied in place */
    if (G->n_qt && !(G->qarena = GPU_FN(alloc)(G->ctx, G->qarena_bytes)))
        rc = mf_fail(err, MF_ENOMEM, "%s: cannot hold %zu MB of block-scaled weights", G->desc, G->qarena_bytes >> 20);
    for (size_t i = 0; i < G->n_qt && !rc; i++) {
        if (S.n == S.cap) S.v = mf_xrealloc(S.v, (S.cap = S.cap ? 2 * S.cap : 256) * sizeof *S.v);
        S.v[S.n++] = (seg){.file = G->qt[i].file, .off = G->qt[i].file_off, .bytes = G->qt[i].bytes,
                           .src_dt = GK_F32, .dst_dt = GK_F32, .k = 1, .kp = 1,
                           .dst = (uint8_t *)G->qarena + G->qt[i].off, .direct = true};
    }
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const mf_layer *ML = &m->layers[l];
        glayer *L = &G->layers[l];
        const int H = c->hidden;
        L->attn_norm = upload_doubles(G, ML->attn_norm, (size_t)H);
        L->ffn_norm = upload_doubles(G, ML->ffn_norm, (size_t)H);
        if (c->qk_norm == MF_QK_NORM_FULL) {
            L->q_norm = upload_doubles(G, ML->q_norm, (size_t)c->n_heads * c->head_dim);
            L->k_norm = upload_doubles(G, ML->k_norm, (size_t)c->n_kv_heads * c->head_dim);
        } else if (c->qk_norm == MF_QK_NORM_PER_HEAD) {
            L->q_norm = upload_doubles(G, ML->q_norm, (size_t)c->head_dim);
            L->k_norm = upload_doubles(G, ML->k_norm, (size_t)c->head_dim);
        }
        if (ML->q_a_norm) L->q_a_norm = upload_doubles(G, ML->q_a_norm, (size_t)c->q_lora_rank);
        if (ML->kv_a_norm) L->kv_a_norm = upload_doubles(G, ML->kv_a_norm, (size_t)c->kv_lora_rank);
        if (ML->e_bias) L->e_bias = upload_doubles(G, ML->e_bias, (size_t)c->n_experts);
        if (ML->sinks) L->sinks = upload_doubles(G, ML->sinks, (size_t)c->n_heads);
        if (!L->attn_norm || !L->ffn_norm || (c->qk_norm != MF_QK_NORM_NONE && (!L->q_norm || !L->k_norm)) ||
            (ML->q_a_norm && !L->q_a_norm) || (ML->kv_a_norm && !L->kv_a_norm) || (ML->e_bias && !L->e_bias) ||
            (ML->sinks && !L->sinks)) {
            rc = mf_fail(err, MF_ENOMEM, "%s: out of memory for the norms of layer %d", G->desc, l);
            break;
        }
        const bool fused = fused_experts(G, ML);
        const int n = layer_linears(G, l, refs);
        for (int i = 0; i < n && !rc; i++) {
            const bool expert = refs[i].w == &L->exp_gate || refs[i].w == &L->exp_up || refs[i].w == &L->exp_down;
            if (!(fused && expert)) rc = linear_segs(G, &S, refs[i].w, refs[i].L, err);
        }
        if (!rc && fused) rc = fused_expert_segs(G, &S, L, ML, err);
    }
    if (!rc && !(G->final_norm = upload_doubles(G, m->final_norm, (size_t)c->hidden)))
        rc = mf_fail(err, MF_ENOMEM, "%s: out of memory for the final norm", G->desc);
    if (!rc && !(rc = alloc_weight(G, &G->embed, err)))
        rc = add_seg(G, &S, m->embed->data, m->embed->dtype, (size_t)c->vocab * c->hidden, c->hidden, G->embed.w,
                     G->embed.dt, c->hidden, err);
    if (!rc) {
        if (G->head.shared) G->head.w = G->embed.w;
        else rc = linear_segs(G, &S, &G->head, &m->head, err);
    }
    if (rc) {
        free(S.v);
        return rc;
    }
    qsort(S.v, S.n, sizeof *S.v, cmp_seg);
    /* the staging slots: pinned host, and device for the copies a kernel places */
    uint8_t *host[SLOTS] = {0};
    void *stage[SLOTS] = {0};
    for (int i = 0; i < SLOTS && !rc; i++) {
        host[i] = GPU_FN(host_alloc)(SLOT_BYTES);
        stage[i] = GPU_FN(alloc)(G->ctx, SLOT_BYTES);
        if (!host[i] || !stage[i])
            rc = mf_fail(err, MF_ENOMEM, "%s: cannot allocate the %d MB staging slots of the weight upload", G->desc,
                         (int)(SLOTS * (SLOT_BYTES >> 20)));
    }
    mf_checkpoint *ck = m->ckpt;
    const bool hash = !ck->weights_digest[0];
    char(*hex)[33] = mf_xcalloc(ck->nfiles ? ck->nfiles : 1, sizeof *hex);
    size_t first = 0;
    upload_stats st = {0};
    const double t0 = mf_now();
    for (size_t f = 0; f < ck->nfiles && !rc; f++) {
        while (first < S.n && S.v[first].file < f) first++;
        rc = stream_file(G, &S, first, f, host, stage, hash, hex[f], &st, err);
    }
    char msg[256];
    if (!rc && GPU_FN(sync)(G->ctx, msg, sizeof msg)) rc = mf_fail(err, MF_EIO, "%s: weight upload: %s", G->desc, msg);
    if (!rc && hash) mf_checkpoint_digest_finish(ck, hex);
    const char *stats = getenv("MOEFLIP_UPLOAD_STATS");
    if (!rc && stats && *stats && strcmp(stats, "0"))
        mf_log("moeflip: upload of %.2f GB in %.2f s: readers %.2f s reading and %.2f s queueing (summed over "
               "threads), hashing %.2f s, waiting for reads %.2f s", (double)st.bytes / 1e9, mf_now() - t0, st.read_s,
               st.queue_s, st.hash_s, st.wait_s);
    free(hex);
    for (int i = 0; i < SLOTS; i++) {
        GPU_FN(host_free)(host[i]);
        GPU_FN(free)(G->ctx, stage[i]);
    }
    free(S.v);
    return rc;
}

/* ---- one weight from matrices in host memory (moeflip_gpu_check's products) ---------------------------- */

int GPU_FN(weight_of_mats)(gpu *G, gw *w, const mf_mat *mats, int experts, mf_error *err) {
    memset(w, 0, sizeof *w);
    const mf_mat *m0 = &mats[0];
    w->n = m0->n;
    w->k = m0->k;
    w->kp = round16(m0->k);
    w->experts = experts;
    const size_t E = (size_t)experts;
    for (size_t e = 1; e < E; e++)
        if (mats[e].n != m0->n || mats[e].k != m0->k || mats[e].q.kind != m0->q.kind)
            return mf_fail(err, MF_EINVAL, "%s: expert %zu's matrix differs from expert 0's in shape or kind", G->desc, e);
    if (m0->q.kind == MF_WQ_NONE) {
        if (m0->dtype != MF_F32 && m0->dtype != MF_BF16 && m0->dtype != MF_F16)
            return mf_fail(err, MF_EINVAL, "%s: a %s weight is not a GPU operand", G->desc, mf_dtype_name(m0->dtype));
        w->dt = gk_dt(m0->dtype);
        const size_t per = (size_t)w->n * w->kp, bytes = E * per * dt_size(w->dt);
        uint8_t *h = mf_xcalloc(1, bytes);
        for (size_t e = 0; e < E; e++)
            for (int j = 0; j < w->n; j++)
                for (int kk = 0; kk < w->k; kk++)
                    mf_store_from_f64(h, m0->dtype, e * per + (size_t)j * w->kp + kk, mf_mat_get(&mats[e], j, kk));
        w->w = GPU_FN(alloc)(G->ctx, bytes);
        const int rc = !w->w || GPU_FN(upload)(G->ctx, w->w, h, bytes);
        free(h);
        return rc ? mf_fail(err, MF_ENOMEM, "%s: cannot place a %zu-byte weight", G->desc, bytes) : MF_OK;
    }
    /* block-scaled: the bytes each expert's view reads, codes and scales, after a table of their addresses */
    w->dt = gk_dt(m0->q.round);
    size_t *cb = mf_xmalloc(2 * E * sizeof *cb), *sb = cb + E, total = (2 * E * sizeof(void *) + 255) / 256 * 256;
    for (size_t e = 0; e < E; e++) {
        q_spans(&mats[e], &cb[e], &sb[e]);
        total += (cb[e] + 255) / 256 * 256 + (sb[e] + 255) / 256 * 256;
    }
    int rc = MF_OK;
    if (q_desc(&w->q, m0)) rc = mf_fail(err, MF_EUNSUPPORTED, "%s: a block-scaled matrix the GPU does not read", G->desc);
    uint8_t *dev = rc ? NULL : GPU_FN(alloc)(G->ctx, total);
    if (!rc && !dev) rc = mf_fail(err, MF_ENOMEM, "%s: cannot place a %zu-byte weight", G->desc, total);
    void **tab = mf_xmalloc(2 * E * sizeof *tab);
    size_t at = (2 * E * sizeof(void *) + 255) / 256 * 256;
    int bad = 0;
    for (size_t e = 0; e < E && !rc; e++) {
        tab[e] = dev + at;
        bad |= GPU_FN(upload)(G->ctx, tab[e], mats[e].data, cb[e]);
        at += (cb[e] + 255) / 256 * 256;
        tab[E + e] = dev + at;
        bad |= GPU_FN(upload)(G->ctx, tab[E + e], mats[e].q.data, sb[e]);
        at += (sb[e] + 255) / 256 * 256;
    }
    if (!rc && (bad || GPU_FN(upload)(G->ctx, dev, tab, 2 * E * sizeof *tab)))
        rc = mf_fail(err, MF_EIO, "%s: copying a weight to the GPU failed", G->desc);
    w->qtab = dev;
    w->q.codes = (const uint8_t *const *)dev;
    w->q.scales = (const void *const *)((void **)dev + E);
    free(tab);
    free(cb);
    return rc;
}

void GPU_FN(weight_free)(gpu *G, gw *w) {
    GPU_FN(free)(G->ctx, w->w);
    GPU_FN(free)(G->ctx, w->bias);
    GPU_FN(free)(G->ctx, w->qtab);
    memset(w, 0, sizeof *w);
}

static void free_gw(gpu *G, gw *w) {
    if (!w->shared) GPU_FN(free)(G->ctx, w->w);
    GPU_FN(free)(G->ctx, w->bias);
    GPU_FN(free)(G->ctx, w->qtab);
    w->w = NULL;
    w->bias = NULL;
    w->qtab = NULL;
}

void GPU_FN(weights_free)(gpu *G) {
    const mf_config *c = &G->m->cfg;
    for (int l = 0; G->layers && l < c->n_layers; l++) {
        glayer *L = &G->layers[l];
        GPU_FN(free)(G->ctx, L->attn_norm);
        GPU_FN(free)(G->ctx, L->ffn_norm);
        GPU_FN(free)(G->ctx, L->q_norm);
        GPU_FN(free)(G->ctx, L->k_norm);
        GPU_FN(free)(G->ctx, L->q_a_norm);
        GPU_FN(free)(G->ctx, L->kv_a_norm);
        GPU_FN(free)(G->ctx, L->e_bias);
        GPU_FN(free)(G->ctx, L->sinks);
        GPU_FN(free)(G->ctx, L->eb_gate_up);
        GPU_FN(free)(G->ctx, L->eb_down);
        gw *ws[] = {&L->q, &L->k, &L->v, &L->o, &L->mlp_gate, &L->mlp_up, &L->mlp_down, &L->router,
                    &L->exp_gate, &L->exp_up, &L->exp_down, &L->sh_gate, &L->sh_up, &L->sh_down, &L->sh_router,
                    &L->q_a, &L->q_b, &L->kv_a, &L->kv_b};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) free_gw(G, ws[i]);
    }
    free_gw(G, &G->head);
    free_gw(G, &G->embed);
    GPU_FN(free)(G->ctx, G->final_norm);
    GPU_FN(free)(G->ctx, G->wide);
    G->wide = NULL;
    GPU_FN(free)(G->ctx, G->qarena);
    G->qarena = NULL;
    free(G->qt);
    G->qt = NULL;
    G->n_qt = 0;
    free(G->layers);
    G->layers = NULL;
}
