/* Loading a model: every tensor the config implies is looked up and its
 * shape and dtype checked (all of them, before anything else), then the
 * model's linear layers become views of the mapped tensors, in the
 * checkpoint's dtype: the kernels widen values as they load them. Only where
 * the policy's weight dtype cannot hold the stored values (an fp32
 * checkpoint under bf16, bf16 under fp16) is a tensor converted, once, into
 * a copy of that (never wider) dtype, and the mapped pages it came from are
 * given back. FP8 weights (F8_E4M3 with their weight_scale_inv) stay as
 * stored too: the kernels widen the codes with their block's scale as they
 * pack panels (numerics' block-scaled mf_mat). Norm weights and biases
 * (O(hidden) values) are kept as doubles. Hub names: per-expert mlp.experts.E.{gate,up,down}_proj,
 * Mixtral block_sparse_moe.{gate, experts.E.w1/w3/w2}, or the fused
 * mlp.experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I]. */
#include "archs.h"
#include "mxfp4.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct loader {
    mf_model *m;
    bool validate_only;
    bool no_convert;       /* MF_LOAD_NO_CONVERT: views keep the stored dtype */
    mf_dtype ckpt_dtype;   /* every float tensor must have it */
    const char *dir;
    mf_error *err;
} loader;

/* The weight_scale_inv of an FP8 weight t [out, in]: "<name>_scale_inv" (DeepSeek-V3's spelling), or NULL. */
static const mf_st_tensor *fp8_scales(const loader *ld, const mf_st_tensor *t) {
    char nm[512];
    snprintf(nm, sizeof nm, "%s_scale_inv", t->name);
    return mf_checkpoint_find(ld->m->ckpt, nm);
}

/* An F8_E4M3 weight is taken only from a checkpoint whose quantization_config says fp8, with its float
 * weight_scale_inv [ceil(out / block0), ceil(in / block1)] beside it. */
static int fp8_scales_ok(loader *ld, const mf_st_tensor *t) {
    const int *b = ld->m->cfg.fp8_block;
    if (b[0] <= 0)
        return mf_fail(ld->err, MF_EFORMAT, "%s: tensor %s is F8_E4M3, but config.json has no fp8 quantization_config",
                       ld->dir, t->name);
    const mf_st_tensor *s = fp8_scales(ld, t);
    const int64_t ro = (t->shape[0] + b[0] - 1) / b[0], co = (t->shape[1] + b[1] - 1) / b[1];
    if (!s || s->ndim != 2 || s->shape[0] != ro || s->shape[1] != co || !mf_dtype_is_float(s->dtype))
        return mf_fail(ld->err, MF_EFORMAT, "%s: FP8 weight %s needs %s_scale_inv, a float tensor [%lld, %lld] (one "
                       "scale per %dx%d block)", ld->dir, t->name, t->name, (long long)ro, (long long)co, b[0], b[1]);
    return MF_OK;
}

/* Finds `name` and checks it has exactly the shape given (ndim dims). */
static int need(loader *ld, const mf_st_tensor **out, const char *name, int ndim, ...) {
    const mf_st_tensor *t = mf_checkpoint_find(ld->m->ckpt, name);
    *out = t;
    if (!t) return mf_fail(ld->err, MF_EFORMAT, "%s: missing tensor %s", ld->dir, name);
    int64_t want[MF_MAX_DIMS];
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim; i++) want[i] = va_arg(ap, int64_t);
    va_end(ap);
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char have[128] = "", exp[128] = "";
        for (int i = 0; i < t->ndim; i++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        for (int i = 0; i < ndim; i++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%lld", i ? ", " : "", (long long)want[i]);
        return mf_fail(ld->err, MF_EFORMAT, "%s: tensor %s has shape [%s], but the config implies [%s]", ld->dir, name,
                       have, exp);
    }
    if (t->dtype == MF_F8E4M3 && ndim == 2) return fp8_scales_ok(ld, t);
    if (!mf_dtype_is_float(t->dtype))
        return mf_fail(ld->err, MF_EFORMAT, "%s: tensor %s has dtype %s, expected a float dtype (%s)", ld->dir, name,
                       mf_dtype_name(t->dtype), mf_dtype_name(ld->ckpt_dtype));
    if (t->dtype != ld->ckpt_dtype)
        return mf_fail(ld->err, MF_EFORMAT, "%s: tensor %s has dtype %s, but the checkpoint's weights are %s", ld->dir,
                       name, mf_dtype_name(t->dtype), mf_dtype_name(ld->ckpt_dtype));
    return MF_OK;
}

/* A vector [n] whose dtype may differ from the weights' (DeepSeek's e_score_correction_bias is stored fp32 in a bf16
 * checkpoint, and transformers keeps it fp32): its values as stored, unrounded. */
static int vector_as_stored(loader *ld, double **dst, const char *name, int n) {
    const mf_st_tensor *t = mf_checkpoint_find(ld->m->ckpt, name);
    if (!t) return mf_fail(ld->err, MF_EFORMAT, "%s: missing tensor %s", ld->dir, name);
    if (t->ndim != 1 || t->shape[0] != n)
        return mf_fail(ld->err, MF_EFORMAT, "%s: tensor %s must have shape [%d]", ld->dir, name, n);
    if (!mf_dtype_is_float(t->dtype))
        return mf_fail(ld->err, MF_EFORMAT, "%s: tensor %s has dtype %s, expected a float dtype", ld->dir, name,
                       mf_dtype_name(t->dtype));
    if (ld->validate_only) return MF_OK;
    *dst = mf_xmalloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) (*dst)[i] = mf_load_as_f64(t->data, t->dtype, (size_t)i);
    ld->m->n_params += (size_t)n;
    return MF_OK;
}

mf_dtype mf_weight_storage(mf_dtype stored, mf_dtype policy) {
    switch (policy) {
    case MF_F64: return stored;
    case MF_F32: return stored == MF_F64 ? MF_F32 : stored;
    default: return policy;   /* bf16 and f16 hold only themselves exactly */
    }
}

/* Gives the mapped pages of [p, p + n) back (a converted tensor's source):
 * they are clean file pages, read again from the file if ever touched. */
static void release_pages(const void *p, size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1), b = ((uintptr_t)p + n) & ~(uintptr_t)(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* An FP8 weight as stored: the e4m3 bytes in the mapping with their weight_scale_inv beside them, widened by the
 * kernels as they pack panels to what transformers' Fp8Dequantize makes of them, fp32(q x scale_inv of its
 * block), held in the policy's weight dtype (fp32 under fp32 and fp64, where the fp32 products are exact; rounded
 * on to bf16 or fp16 under those, as loading into a bf16 model casts them). Nothing is copied. */
static mf_mat fp8_view(loader *ld, const mf_st_tensor *t) {
    const mf_model *m = ld->m;
    const mf_st_tensor *s = fp8_scales(ld, t);
    return mf_mat_fp8_block(t->data, (int)t->shape[0], (int)t->shape[1], s->data, s->dtype, m->cfg.fp8_block[0],
                            m->cfg.fp8_block[1], mf_weight_storage(MF_F32, m->weight_round));
}

/* The base of tensor t in the dtype the model keeps it in: the mapping, or
 * the tensor's one converted copy (made on first use). */
static const void *tensor_data(loader *ld, const mf_st_tensor *t, mf_dtype *dt) {
    mf_model *m = ld->m;
    *dt = mf_weight_storage(t->dtype, m->weight_round);
    if (*dt == t->dtype || ld->no_convert) {
        *dt = t->dtype;
        return t->data;
    }
    for (size_t i = 0; i < m->n_owned; i++)
        if (m->owned[i].src == t) return m->owned[i].data;
    const size_t n = (size_t)mf_st_numel(t);
    void *copy = mf_xmalloc(n * mf_dtype_size(*dt));
#pragma omp parallel for if (n >= (1u << 20))
    for (size_t i = 0; i < n; i++) mf_store_from_f64(copy, *dt, i, mf_load_as_f64(t->data, t->dtype, i));
    release_pages(t->data, t->nbytes);
    m->owned = mf_xrealloc(m->owned, (m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned].src = t;
    m->owned[m->n_owned].data = copy;
    m->owned[m->n_owned].bytes = n * mf_dtype_size(*dt);
    m->n_owned++;
    return copy;
}

/* A linear layer [out, in] (+ bias [out]) from one tensor (offset rows in). */
static int linear_from(loader *ld, mf_linear *L, const mf_st_tensor *t, size_t elem_offset, int out, int in,
                       const char *bias_name) {
    const mf_st_tensor *b = NULL;
    int rc;
    if (bias_name && (rc = need(ld, &b, bias_name, 1, (int64_t)out))) return rc;
    if (ld->validate_only) return MF_OK;
    mf_model *m = ld->m;
    L->out = out;
    L->in = in;
    if (t->dtype == MF_F8E4M3) {   /* 2-D, whole (need() checked it and its scales) */
        L->w = fp8_view(ld, t);
    } else {
        mf_dtype dt;
        const uint8_t *base = tensor_data(ld, t, &dt);
        L->w = mf_mat_rows(base + elem_offset * mf_dtype_size(dt), dt, out, in);
    }
    if (b) {
        L->bias = mf_xmalloc((size_t)out * sizeof(double));
        for (int i = 0; i < out; i++) L->bias[i] = mf_round_to(m->weight_round, mf_load_as_f64(b->data, b->dtype, (size_t)i));
    }
    m->n_params += (size_t)out * (size_t)in + (b ? (size_t)out : 0);
    return MF_OK;
}

static int linear(loader *ld, mf_linear *L, const char *name, int out, int in, const char *bias_name) {
    const mf_st_tensor *t;
    int rc = need(ld, &t, name, 2, (int64_t)out, (int64_t)in);
    if (rc) return rc;
    return linear_from(ld, L, t, 0, out, in, bias_name);
}

static int vector(loader *ld, double **dst, const char *name, int n) {
    const mf_st_tensor *t;
    int rc = need(ld, &t, name, 1, (int64_t)n);
    if (rc || ld->validate_only) return rc;
    *dst = mf_xmalloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) (*dst)[i] = mf_round_to(ld->m->weight_round, mf_load_as_f64(t->data, t->dtype, (size_t)i));
    ld->m->n_params += (size_t)n;
    return MF_OK;
}

#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
#define NAME2(...) (snprintf(nm2, sizeof nm2, __VA_ARGS__), nm2)

static void add_owned(mf_model *m, const mf_st_tensor *src, void *data, size_t bytes) {
    m->owned = mf_xrealloc(m->owned, (m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned].src = src;
    m->owned[m->n_owned].data = data;
    m->owned[m->n_owned].bytes = bytes;
    m->n_owned++;
}

/* gpt-oss's experts (GptOssExperts): gate_up_proj [E, H, 2I] ("x @ W", gate the even columns, up the odd ones)
 * with gate_up_proj_bias [E, 2I], down_proj [E, I, H] with down_proj_bias [E, H]: held as one copy per tensor
 * in the policy's weight dtype, laid out as the products read weights (per expert the gate's I rows [I, H], the
 * up's I rows [I, H], and the down's H rows [H, I]), the file's pages given back. Or, with an mxfp4
 * quantization_config, gate_up_proj_blocks / _scales [E, 2I, H/32, ...] and down_proj_blocks / _scales [E, H,
 * I/32, ...] (checked in models/mxfp4.c), whose rows are the outputs already: views of the mapped blocks. Under
 * MF_LOAD_NO_CONVERT the bf16 experts are strided views of the file's tensors instead (a GPU lays them out). */
static int gpt_oss_experts(loader *ld, mf_layer *L, int l) {
    mf_model *m = ld->m;
    const mf_config *c = &m->cfg;
    const int E = c->n_experts, I = c->moe_intermediate, H = c->hidden;
    char gu_n[256], dn_n[256], nm[300], nm2[300];
    snprintf(gu_n, sizeof gu_n, "model.layers.%d.mlp.experts.gate_up_proj", l);
    snprintf(dn_n, sizeof dn_n, "model.layers.%d.mlp.experts.down_proj", l);
    const mf_st_tensor *gb, *db, *gu = NULL, *dn = NULL, *gus = NULL, *dns = NULL;
    int rc;
    if ((rc = need(ld, &gb, NAME("%s_bias", gu_n), 2, (int64_t)E, (int64_t)2 * I))) return rc;
    if ((rc = need(ld, &db, NAME("%s_bias", dn_n), 2, (int64_t)E, (int64_t)H))) return rc;
    if (c->mxfp4) {
        gu = mf_checkpoint_find(m->ckpt, NAME("%s_blocks", gu_n));
        gus = mf_checkpoint_find(m->ckpt, NAME2("%s_scales", gu_n));
        if ((rc = mf_mxfp4_check(gu, gus, nm, nm2, E, 2 * I, H, ld->dir, ld->err))) return rc;
        dn = mf_checkpoint_find(m->ckpt, NAME("%s_blocks", dn_n));
        dns = mf_checkpoint_find(m->ckpt, NAME2("%s_scales", dn_n));
        if ((rc = mf_mxfp4_check(dn, dns, nm, nm2, E, H, I, ld->dir, ld->err))) return rc;
    } else {
        if (mf_checkpoint_find(m->ckpt, NAME("%s_blocks", gu_n)))
            return mf_fail(ld->err, MF_EFORMAT, "%s: tensor %s is MXFP4, but config.json has no mxfp4 "
                           "quantization_config", ld->dir, nm);
        if ((rc = need(ld, &gu, gu_n, 3, (int64_t)E, (int64_t)H, (int64_t)2 * I))) return rc;
        if ((rc = need(ld, &dn, dn_n, 3, (int64_t)E, (int64_t)I, (int64_t)H))) return rc;
    }
    if (ld->validate_only) {   /* the scales' values too: every failure before anything is allocated */
        if (c->mxfp4 && (rc = mf_mxfp4_check_values(gu, gus, E, 2 * I, H, ld->dir, ld->err))) return rc;
        if (c->mxfp4 && (rc = mf_mxfp4_check_values(dn, dns, E, H, I, ld->dir, ld->err))) return rc;
        return MF_OK;
    }
    L->exp_gate = mf_xcalloc((size_t)E, sizeof(mf_linear));
    L->exp_up = mf_xcalloc((size_t)E, sizeof(mf_linear));
    L->exp_down = mf_xcalloc((size_t)E, sizeof(mf_linear));
    if (!c->mxfp4 && ld->no_convert) {
        /* MF_LOAD_NO_CONVERT (a GPU's load): strided views of the file's tensors, nothing copied; the GPU's upload
         * lays them out itself. Gate i's input h is gate_up[e][h][2i] (rows 2 apart, columns 2I), up's one
         * further; down's output h, input i is down[e][i][h] (rows 1 apart, columns H). */
        const size_t esz = mf_dtype_size(gu->dtype);
        for (int e = 0; e < E; e++) {
            const uint8_t *g0 = gu->data + (size_t)e * H * 2 * I * esz;
            L->exp_gate[e].w = (mf_mat){.data = g0, .dtype = gu->dtype, .n = I, .k = H, .rs = 2, .cs = (size_t)2 * I};
            L->exp_up[e].w = L->exp_gate[e].w;
            L->exp_up[e].w.data = g0 + esz;
            L->exp_down[e].w = (mf_mat){.data = dn->data + (size_t)e * I * H * mf_dtype_size(dn->dtype),
                                        .dtype = dn->dtype, .n = H, .k = I, .rs = 1, .cs = (size_t)H};
        }
    } else if (c->mxfp4) {
        /* the blocks as they lie (numerics' MXFP4 view: the products widen each code with its scale, to the
         * values transformers' dequantisation gives, rounded to the policy's weight dtype); gate_up's output row
         * 2i is gate i, row 2i + 1 up i: every other row of the expert's [2I, H] */
        const mf_dtype round = mf_weight_storage(MF_F32, m->weight_round);
        const size_t gb_row = (size_t)H / 2, gs_row = (size_t)H / 32, db_row = (size_t)I / 2, ds_row = (size_t)I / 32;
        for (int e = 0; e < E; e++) {
            const uint8_t *blk = gu->data + (size_t)e * 2 * I * gb_row, *sc = gus->data + (size_t)e * 2 * I * gs_row;
            mf_mat w = mf_mat_mxfp4(blk, 2 * I, H, sc, round);
            w.n = I;
            w.rs = 2 * (size_t)H;
            w.q.rs = 2 * gs_row;
            L->exp_gate[e].w = w;
            w.data = blk + gb_row;
            w.q.data = sc + gs_row;
            L->exp_up[e].w = w;
            L->exp_down[e].w = mf_mat_mxfp4(dn->data + (size_t)e * H * db_row, H, I, dns->data + (size_t)e * H * ds_row,
                                            round);
        }
    } else {
        const mf_dtype dt = mf_weight_storage(gu->dtype, m->weight_round);
        const size_t sz = mf_dtype_size(dt), n_gu = (size_t)E * 2 * I * H, n_dn = (size_t)E * H * I;
        uint8_t *gcopy = mf_xmalloc(n_gu * sz), *dcopy = mf_xmalloc(n_dn * sz);
        /* transposed: input h of gate i is gate_up[e][h][2i], of down output h is down[e][i][h] */
#pragma omp parallel for if (n_gu >= (1u << 20))
        for (int e = 0; e < E; e++) {
            for (int h = 0; h < H; h++)
                for (int r = 0; r < 2 * I; r++)
                    mf_store_from_f64(gcopy, dt, (((size_t)e * 2 + (r & 1)) * I + (size_t)(r >> 1)) * H + h,
                                      mf_load_as_f64(gu->data, gu->dtype, ((size_t)e * H + h) * 2 * I + r));
            for (int i = 0; i < I; i++)
                for (int h = 0; h < H; h++)
                    mf_store_from_f64(dcopy, dt, ((size_t)e * H + h) * I + i,
                                      mf_load_as_f64(dn->data, dn->dtype, ((size_t)e * I + i) * H + h));
        }
        release_pages(gu->data, gu->nbytes);
        release_pages(dn->data, dn->nbytes);
        add_owned(m, gu, gcopy, n_gu * sz);
        add_owned(m, dn, dcopy, n_dn * sz);
        for (int e = 0; e < E; e++) {
            L->exp_gate[e].w = mf_mat_rows(gcopy + (size_t)e * 2 * I * H * sz, dt, I, H);
            L->exp_up[e].w = mf_mat_rows(gcopy + ((size_t)e * 2 + 1) * I * H * sz, dt, I, H);
            L->exp_down[e].w = mf_mat_rows(dcopy + (size_t)e * H * I * sz, dt, H, I);
        }
    }
    for (int e = 0; e < E; e++) {
        mf_linear *g = &L->exp_gate[e], *u = &L->exp_up[e], *d = &L->exp_down[e];
        g->out = u->out = I;
        g->in = u->in = H;
        d->out = H;
        d->in = I;
        g->bias = mf_xmalloc((size_t)I * sizeof(double));
        u->bias = mf_xmalloc((size_t)I * sizeof(double));
        d->bias = mf_xmalloc((size_t)H * sizeof(double));
        for (int i = 0; i < I; i++) {
            g->bias[i] = mf_round_to(m->weight_round, mf_load_as_f64(gb->data, gb->dtype, (size_t)e * 2 * I + 2 * i));
            u->bias[i] = mf_round_to(m->weight_round, mf_load_as_f64(gb->data, gb->dtype, (size_t)e * 2 * I + 2 * i + 1));
        }
        for (int h = 0; h < H; h++) d->bias[h] = mf_round_to(m->weight_round, mf_load_as_f64(db->data, db->dtype, (size_t)e * H + h));
    }
    m->n_params += (size_t)E * (3 * (size_t)I * H + 2 * (size_t)I + (size_t)H);
    return MF_OK;
}

static int load_experts(loader *ld, mf_layer *L, int l) {
    const mf_config *c = &ld->m->cfg;
    const mf_arch_desc *d = &mf_arch_table[c->arch];
    const int E = c->n_experts, I = c->moe_intermediate, H = c->hidden;
    char nm[256];
    int rc;
    if (c->clamped_swiglu) return gpt_oss_experts(ld, L, l);
    if (!ld->validate_only) {
        L->exp_gate = mf_xcalloc((size_t)E, sizeof(mf_linear));
        L->exp_up = mf_xcalloc((size_t)E, sizeof(mf_linear));
        L->exp_down = mf_xcalloc((size_t)E, sizeof(mf_linear));
    }
    const mf_st_tensor *gu = mf_checkpoint_find(ld->m->ckpt, NAME("model.layers.%d.mlp.experts.gate_up_proj", l));
    if (gu) {   /* fused layout (transformers v5 in memory; newer checkpoints on disk) */
        const mf_st_tensor *dn;
        if ((rc = need(ld, &gu, nm, 3, (int64_t)E, (int64_t)2 * I, (int64_t)H))) return rc;
        if ((rc = need(ld, &dn, NAME("model.layers.%d.mlp.experts.down_proj", l), 3, (int64_t)E, (int64_t)H, (int64_t)I)))
            return rc;
        for (int e = 0; e < E; e++) {
            size_t base = (size_t)e * 2 * I * H;
            if ((rc = linear_from(ld, &L->exp_gate[e], gu, base, I, H, NULL))) return rc;
            if ((rc = linear_from(ld, &L->exp_up[e], gu, base + (size_t)I * H, I, H, NULL))) return rc;
            if ((rc = linear_from(ld, &L->exp_down[e], dn, (size_t)e * H * I, H, I, NULL))) return rc;
        }
        return MF_OK;
    }
    for (int e = 0; e < E; e++) {
        if (d->mixtral_names && mf_checkpoint_find(ld->m->ckpt, NAME("model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e))) {
            if ((rc = linear(ld, &L->exp_gate[e], nm, I, H, NULL))) return rc;
            if ((rc = linear(ld, &L->exp_up[e], NAME("model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e), I, H, NULL)))
                return rc;
            if ((rc = linear(ld, &L->exp_down[e], NAME("model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e), H, I, NULL)))
                return rc;
            continue;
        }
        if ((rc = linear(ld, &L->exp_gate[e], NAME("model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e), I, H, NULL)))
            return rc;
        if ((rc = linear(ld, &L->exp_up[e], NAME("model.layers.%d.mlp.experts.%d.up_proj.weight", l, e), I, H, NULL)))
            return rc;
        if ((rc = linear(ld, &L->exp_down[e], NAME("model.layers.%d.mlp.experts.%d.down_proj.weight", l, e), H, I, NULL)))
            return rc;
    }
    return MF_OK;
}

/* DeepSeek's latent attention: q_a_proj [q_lora, H] + q_a_layernorm + q_b_proj [heads x qk, q_lora] (or q_proj
 * [heads x qk, H] without q_lora_rank), kv_a_proj_with_mqa [kv_lora + rope, H] + kv_a_layernorm [kv_lora],
 * kv_b_proj [heads x (nope + v), kv_lora], o_proj [H, heads x v]; attention_bias on q_a, kv_a and o. */
static int load_mla(loader *ld, mf_layer *L, int l) {
    const mf_config *c = &ld->m->cfg;
    const int H = c->hidden, nh = c->n_heads, qk = c->qk_nope_dim + c->qk_rope_dim;
    const bool b = c->attn_bias_lora;
    char nm[256], nm2[256];
    int rc;
#define TRY(x) if ((rc = (x))) return rc
    if (c->q_lora_rank > 0) {
        TRY(linear(ld, &L->q_a, NAME("model.layers.%d.self_attn.q_a_proj.weight", l), c->q_lora_rank, H,
                   b ? NAME2("model.layers.%d.self_attn.q_a_proj.bias", l) : NULL));
        TRY(vector(ld, &L->q_a_norm, NAME("model.layers.%d.self_attn.q_a_layernorm.weight", l), c->q_lora_rank));
        TRY(linear(ld, &L->q_b, NAME("model.layers.%d.self_attn.q_b_proj.weight", l), nh * qk, c->q_lora_rank, NULL));
    } else {
        TRY(linear(ld, &L->q, NAME("model.layers.%d.self_attn.q_proj.weight", l), nh * qk, H, NULL));
    }
    TRY(linear(ld, &L->kv_a, NAME("model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l),
               c->kv_lora_rank + c->qk_rope_dim, H, b ? NAME2("model.layers.%d.self_attn.kv_a_proj_with_mqa.bias", l) : NULL));
    TRY(vector(ld, &L->kv_a_norm, NAME("model.layers.%d.self_attn.kv_a_layernorm.weight", l), c->kv_lora_rank));
    TRY(linear(ld, &L->kv_b, NAME("model.layers.%d.self_attn.kv_b_proj.weight", l), nh * (c->qk_nope_dim + c->v_head_dim),
               c->kv_lora_rank, NULL));
    TRY(linear(ld, &L->o, NAME("model.layers.%d.self_attn.o_proj.weight", l), H, nh * c->v_head_dim,
               b ? NAME2("model.layers.%d.self_attn.o_proj.bias", l) : NULL));
#undef TRY
    return MF_OK;
}

/* q/k/v/o projections (with the biases the config asks for) and the q/k norms. */
static int load_gqa(loader *ld, mf_layer *L, int l) {
    const mf_config *c = &ld->m->cfg;
    const int H = c->hidden, hd = c->head_dim, nq = c->n_heads * hd, nkv = c->n_kv_heads * hd;
    char nm[256], nm2[256];
    int rc;
#define TRY(x) if ((rc = (x))) return rc
    const char *qkvb = c->attn_bias_qkv ? "" : NULL;
    TRY(linear(ld, &L->q, NAME("model.layers.%d.self_attn.q_proj.weight", l), nq, H,
               qkvb ? NAME2("model.layers.%d.self_attn.q_proj.bias", l) : NULL));
    TRY(linear(ld, &L->k, NAME("model.layers.%d.self_attn.k_proj.weight", l), nkv, H,
               qkvb ? NAME2("model.layers.%d.self_attn.k_proj.bias", l) : NULL));
    TRY(linear(ld, &L->v, NAME("model.layers.%d.self_attn.v_proj.weight", l), nkv, H,
               qkvb ? NAME2("model.layers.%d.self_attn.v_proj.bias", l) : NULL));
    TRY(linear(ld, &L->o, NAME("model.layers.%d.self_attn.o_proj.weight", l), H, nq,
               c->attn_bias_o ? NAME2("model.layers.%d.self_attn.o_proj.bias", l) : NULL));
    if (c->attn_sinks) TRY(vector(ld, &L->sinks, NAME("model.layers.%d.self_attn.sinks", l), c->n_heads));
    if (c->qk_norm == MF_QK_NORM_FULL) {
        TRY(vector(ld, &L->q_norm, NAME("model.layers.%d.self_attn.q_norm.weight", l), nq));
        TRY(vector(ld, &L->k_norm, NAME("model.layers.%d.self_attn.k_norm.weight", l), nkv));
    } else if (c->qk_norm == MF_QK_NORM_PER_HEAD) {
        TRY(vector(ld, &L->q_norm, NAME("model.layers.%d.self_attn.q_norm.weight", l), hd));
        TRY(vector(ld, &L->k_norm, NAME("model.layers.%d.self_attn.k_norm.weight", l), hd));
    }
#undef TRY
    return MF_OK;
}

static int load_layer(loader *ld, mf_layer *L, int l) {
    const mf_config *c = &ld->m->cfg;
    const mf_arch_desc *d = &mf_arch_table[c->arch];
    const int H = c->hidden;
    char nm[256], nm2[256];
    int rc;
#define TRY(x) if ((rc = (x))) return rc
    TRY(vector(ld, &L->attn_norm, NAME("model.layers.%d.input_layernorm.weight", l), H));
    TRY(vector(ld, &L->ffn_norm, NAME("model.layers.%d.post_attention_layernorm.weight", l), H));
    TRY(c->attn == MF_ATTN_MLA ? load_mla(ld, L, l) : load_gqa(ld, L, l));
    L->is_moe = d->is_moe && c->layer_is_moe[l];
    if (!L->is_moe) {
        const int I = c->intermediate;
        bool b = c->mlp_bias;
        TRY(linear(ld, &L->mlp_gate, NAME("model.layers.%d.mlp.gate_proj.weight", l), I, H,
                   b ? NAME2("model.layers.%d.mlp.gate_proj.bias", l) : NULL));
        TRY(linear(ld, &L->mlp_up, NAME("model.layers.%d.mlp.up_proj.weight", l), I, H,
                   b ? NAME2("model.layers.%d.mlp.up_proj.bias", l) : NULL));
        TRY(linear(ld, &L->mlp_down, NAME("model.layers.%d.mlp.down_proj.weight", l), H, I,
                   b ? NAME2("model.layers.%d.mlp.down_proj.bias", l) : NULL));
        return MF_OK;
    }
    const char *router = "model.layers.%d.mlp.gate.weight";
    if (d->mixtral_names && !mf_checkpoint_find(ld->m->ckpt, NAME(router, l))) router = "model.layers.%d.block_sparse_moe.gate.weight";
    if (d->gpt_oss) router = "model.layers.%d.mlp.router.weight";   /* GptOssTopKRouter: a linear with a bias */
    TRY(linear(ld, &L->router, NAME(router, l), c->n_experts, H,
               d->gpt_oss ? NAME2("model.layers.%d.mlp.router.bias", l) : NULL));
    TRY(load_experts(ld, L, l));
    if (c->route_rule == MF_ROUTE_SIGMOID_GROUP)
        TRY(vector_as_stored(ld, &L->e_bias, NAME("model.layers.%d.mlp.gate.e_score_correction_bias", l), c->n_experts));
    if (c->n_shared_experts > 0) {   /* DeepSeek's shared experts: one MLP of n_shared x moe_intermediate, no gate */
        const int S = c->shared_intermediate;
        const bool b = c->mlp_bias;
        TRY(linear(ld, &L->sh_gate, NAME("model.layers.%d.mlp.shared_experts.gate_proj.weight", l), S, H,
                   b ? NAME2("model.layers.%d.mlp.shared_experts.gate_proj.bias", l) : NULL));
        TRY(linear(ld, &L->sh_up, NAME("model.layers.%d.mlp.shared_experts.up_proj.weight", l), S, H,
                   b ? NAME2("model.layers.%d.mlp.shared_experts.up_proj.bias", l) : NULL));
        TRY(linear(ld, &L->sh_down, NAME("model.layers.%d.mlp.shared_experts.down_proj.weight", l), H, S,
                   b ? NAME2("model.layers.%d.mlp.shared_experts.down_proj.bias", l) : NULL));
    }
    if (c->has_shared_expert) {
        const int S = c->shared_intermediate;
        TRY(linear(ld, &L->sh_gate, NAME("model.layers.%d.mlp.shared_expert.gate_proj.weight", l), S, H, NULL));
        TRY(linear(ld, &L->sh_up, NAME("model.layers.%d.mlp.shared_expert.up_proj.weight", l), S, H, NULL));
        TRY(linear(ld, &L->sh_down, NAME("model.layers.%d.mlp.shared_expert.down_proj.weight", l), H, S, NULL));
        TRY(linear(ld, &L->sh_router, NAME("model.layers.%d.mlp.shared_expert_gate.weight", l), 1, H, NULL));
    }
#undef TRY
    return MF_OK;
}

static int load_all(loader *ld) {
    mf_model *m = ld->m;
    const mf_config *c = &m->cfg;
    int rc;
    const mf_st_tensor *emb;
    if ((rc = need(ld, &emb, "model.embed_tokens.weight", 2, (int64_t)c->vocab, (int64_t)c->hidden))) return rc;
    if (emb->dtype == MF_F8E4M3)   /* rows are read one by one, never through a product */
        return mf_fail(ld->err, MF_EUNSUPPORTED, "%s: model.embed_tokens.weight is F8_E4M3: FP8 is taken for linear "
                       "layers' weights only (DeepSeek-V3 keeps its embedding in bf16)", ld->dir);
    m->embed = emb;
    if (!ld->validate_only) m->n_params += (size_t)c->vocab * (size_t)c->hidden;
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = load_layer(ld, &m->layers[l], l))) return rc;
    if ((rc = vector(ld, &m->final_norm, "model.norm.weight", c->hidden))) return rc;
    if (c->tie_embeddings) {
        if (!ld->validate_only) {   /* the head is a view of the embedding (its copy, if one was made) */
            mf_dtype dt;
            const void *base = tensor_data(ld, emb, &dt);
            m->head.out = c->vocab;
            m->head.in = c->hidden;
            m->head.w = mf_mat_rows(base, dt, c->vocab, c->hidden);
        }
        return MF_OK;
    }
    return linear(ld, &m->head, "lm_head.weight", c->vocab, c->hidden, NULL);
}

/* Whether a tensor's name is an FP8 weight's scale spelling ("..._scale_inv"). */
static bool is_scale_inv(const char *name) {
    const size_t n = strlen(name), w = strlen("_scale_inv");
    return n > w && !strcmp(name + n - w, "_scale_inv");
}

int mf_model_measure(const char *dir, mf_dtype weights, unsigned flags, mf_model_bytes *out, mf_error *err) {
    memset(out, 0, sizeof *out);
    mf_checkpoint *c;
    int rc = mf_checkpoint_open_headers(&c, dir, err);
    if (rc) return rc;
    for (size_t f = 0; f < c->nfiles; f++) {
        const mf_st_file *sf = c->files[f];
        out->files += sf->map.size;
        for (size_t i = 0; i < sf->count; i++) {
            const mf_st_tensor *t = &sf->tensors[i];
            const mf_dtype kept = mf_weight_storage(t->dtype, weights);
            const size_t nl = strlen(t->name);
            /* gpt-oss's fused bf16 experts are held laid out for the products (MXFP4 blocks and scales: in place) */
            const bool fused = t->ndim == 3 && mf_dtype_is_float(t->dtype) &&
                               ((nl > 20 && !strcmp(t->name + nl - 20, "experts.gate_up_proj")) ||
                                (nl > 17 && !strcmp(t->name + nl - 17, "experts.down_proj")));
            /* FP8 codes and their scales are used where they lie, whatever the policy */
            if (fused) out->converted += (uint64_t)mf_st_numel(t) * mf_dtype_size(kept);
            else if (t->dtype == MF_F8E4M3 || is_scale_inv(t->name) || !mf_dtype_is_float(t->dtype) ||
                     kept == t->dtype || (flags & MF_LOAD_NO_CONVERT))
                out->in_place += t->nbytes;
            else out->converted += (uint64_t)mf_st_numel(t) * mf_dtype_size(kept);
        }
    }
    mf_checkpoint_close(c);
    return MF_OK;
}

/* The dtype config.json declares ("dtype" in v5, "torch_dtype" in v4), or INVALID. */
static mf_dtype declared_dtype(const char *config_path) {
    json_t *root = json_load_file(config_path, 0, NULL);
    json_t *v = root ? json_object_get(root, "dtype") : NULL;
    if (!json_is_string(v) && root) v = json_object_get(root, "torch_dtype");
    mf_dtype t = MF_DTYPE_INVALID;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "bfloat16")) t = MF_BF16;
        else if (!strcmp(s, "float16")) t = MF_F16;
        else if (!strcmp(s, "float32")) t = MF_F32;
        else if (!strcmp(s, "float64")) t = MF_F64;
    }
    json_decref(root);
    return t;
}

int mf_model_load(mf_model **out, const char *dir, mf_dtype weights, unsigned flags, mf_error *err) {
    *out = NULL;
    char path[4096];
    if (!mf_is_dir(dir)) return mf_fail(err, MF_EIO, "%s: not a checkpoint directory", dir);
    if (!mf_path_join(path, sizeof path, dir, "config.json")) return mf_fail(err, MF_EINVAL, "%s: path too long", dir);
    mf_model *m = mf_xcalloc(1, sizeof *m);
    int rc = mf_config_load(&m->cfg, path, err);
    if (!rc) rc = (flags & MF_LOAD_DEFER_DIGEST) ? mf_checkpoint_open_deferred(&m->ckpt, dir, err)
                                                 : mf_checkpoint_open(&m->ckpt, dir, err);
    if (rc) {
        free(m);
        return rc;
    }
    m->weight_round = weights;
    m->layers = mf_xcalloc((size_t)m->cfg.n_layers, sizeof(mf_layer));
    const mf_st_tensor *emb = mf_checkpoint_find(m->ckpt, "model.embed_tokens.weight");
    loader ld = {m, true, (flags & MF_LOAD_NO_CONVERT) != 0, emb ? emb->dtype : MF_BF16, dir, err};
    rc = load_all(&ld);   /* pass 1: presence, shapes, dtypes of everything */
    if (!rc) {
        mf_dtype decl = declared_dtype(path);
        if (decl != MF_DTYPE_INVALID && decl != ld.ckpt_dtype)
            mf_log("moeflip: note: %s declares dtype %s but its weights are %s; using the weights as stored", path,
                   mf_dtype_name(decl), mf_dtype_name(ld.ckpt_dtype));
        ld.validate_only = false;
        rc = load_all(&ld);   /* pass 2: views (and the copies a narrower policy needs) */
    }
    if (rc) {
        mf_model_free(m);
        return rc;
    }
    if (flags & MF_LOAD_POPULATE)
        for (size_t i = 0; i < m->ckpt->nfiles; i++) {
            const mf_mmap *mp = &m->ckpt->files[i]->map;
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22   /* Linux 5.14; older kernels say EINVAL and get the read-ahead hint instead */
#endif
            if (mp->data && madvise((void *)mp->data, mp->size, MADV_POPULATE_READ) != 0)
                madvise((void *)mp->data, mp->size, MADV_WILLNEED);
        }
    *out = m;
    return MF_OK;
}

void mf_model_free(mf_model *m) {
    if (!m) return;
    for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
        mf_layer *L = &m->layers[l];
        free(L->attn_norm);
        free(L->ffn_norm);
        free(L->q_norm);
        free(L->k_norm);
        mf_linear_free(&L->q); mf_linear_free(&L->k); mf_linear_free(&L->v); mf_linear_free(&L->o);
        mf_linear_free(&L->mlp_gate); mf_linear_free(&L->mlp_up); mf_linear_free(&L->mlp_down);
        mf_linear_free(&L->router);
        if (L->exp_gate)
            for (int e = 0; e < m->cfg.n_experts; e++) {
                mf_linear_free(&L->exp_gate[e]);
                mf_linear_free(&L->exp_up[e]);
                mf_linear_free(&L->exp_down[e]);
            }
        free(L->exp_gate); free(L->exp_up); free(L->exp_down);
        mf_linear_free(&L->sh_gate); mf_linear_free(&L->sh_up); mf_linear_free(&L->sh_down); mf_linear_free(&L->sh_router);
        mf_linear_free(&L->q_a); mf_linear_free(&L->q_b); mf_linear_free(&L->kv_a); mf_linear_free(&L->kv_b);
        free(L->q_a_norm);
        free(L->kv_a_norm);
        free(L->e_bias);
        free(L->sinks);
    }
    free(m->layers);
    free(m->final_norm);
    mf_linear_free(&m->head);
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i].data);
    free(m->owned);
    mf_checkpoint_close(m->ckpt);
    free(m);
}
