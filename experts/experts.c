/* Dispatch, expert FFN and combine. */
#include "mf_experts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void mf_dispatch_build(mf_dispatch *d, const uint16_t *ids, int T, int k, int E) {
    const int R = T * k;
    d->n_experts = E;
    d->n_tokens = T;
    d->top_k = k;
    d->offset = mf_xcalloc((size_t)E + 1, sizeof(int));
    d->token = mf_xmalloc((size_t)R * sizeof(int));
    d->slot = mf_xmalloc((size_t)R * sizeof(int));
    d->row_of = mf_xmalloc((size_t)R * sizeof(int));
    for (int i = 0; i < R; i++) d->offset[ids[i] + 1]++;
    for (int e = 0; e < E; e++) d->offset[e + 1] += d->offset[e];
    int *fill = mf_xmalloc((size_t)E * sizeof(int));
    memcpy(fill, d->offset, (size_t)E * sizeof(int));
    for (int t = 0; t < T; t++)   /* tokens ascending within each expert */
        for (int s = 0; s < k; s++) {
            int e = ids[t * k + s], r = fill[e]++;
            d->token[r] = t;
            d->slot[r] = s;
            d->row_of[t * k + s] = r;
        }
    free(fill);
}

void mf_dispatch_free(mf_dispatch *d) {
    free(d->offset);
    free(d->token);
    free(d->slot);
    free(d->row_of);
    memset(d, 0, sizeof *d);
}

/* gpt-oss's gated value from gate and up values g, u of act dtype D: PyTorch's ops on D tensors with Python
 * float scalars (the scalars as fp32 in an fp32-opmath run, each result rounded to D). */
static double clamped_swiglu(const mf_ffn *f, mf_dtype D, double g, double u) {
    const bool f64 = D == MF_F64;
    const double lim = f64 ? f->limit : (double)(float)f->limit, alpha = f64 ? f->alpha : (double)(float)f->alpha;
    g = mf_round_to(D, fmin(g, lim));
    u = mf_round_to(D, fmax(fmin(u, lim), -lim));
    const double ga = mf_round_to(D, f64 ? g * alpha : (double)(float)(g * alpha));
    const double glu = mf_round_to(D, g * mf_round_to(D, mf_sigmoid(ga)));
    return mf_round_to(D, mf_round_to(D, u + 1.0) * glu);
}

/* v + b as PyTorch's add_ of a bias into a tensor of dtype D: an fp32 sum rounded to D (exact in fp64). */
static double add_rounded(mf_dtype D, double v, double b) {
    return D == MF_F64 ? v + b : mf_round_to(D, (double)(float)(v + b));
}

/* The clamped (gpt-oss) experts' projection: grouped_mm's product rounded to the output dtype, then the bias
 * added to it in place (transformers 5.17's _grouped_linear: out.add_(bias)), two roundings where a linear
 * layer's bias takes one. */
static void linear_then_bias(const mf_mm *m, const mf_linear *L, const double *x, int M, double *y) {
    mf_linear nb = *L;
    nb.bias = NULL;
    mf_linear_apply(m, &nb, x, M, y);
    if (L->bias)
        for (size_t r = 0; r < (size_t)M; r++)
            for (int j = 0; j < L->out; j++) y[r * L->out + j] = add_rounded(m->out, y[r * L->out + j], L->bias[j]);
}

static void linear_then_bias_f32(const mf_mm *m, const mf_linear *L, const float *x, int M, float *y) {
    mf_linear nb = *L;
    nb.bias = NULL;
    mf_linear_apply_f32(m, &nb, x, M, y);
    if (L->bias)
        for (size_t r = 0; r < (size_t)M; r++)
            for (int j = 0; j < L->out; j++)
                y[r * L->out + j] = (float)add_rounded(m->out, y[r * L->out + j], L->bias[j]);
}

void mf_ffn_apply(const mf_mm *mm, const mf_ffn *f, mf_dtype act_dtype, const double *x, int M, double *y) {
    const int I = f->gate->out;
    double *g = mf_xmalloc((size_t)M * I * sizeof(double));
    double *u = mf_xmalloc((size_t)M * I * sizeof(double));
    mf_mm m = *mm;
    m.out = act_dtype;
    if (f->clamped) {
        linear_then_bias(&m, f->gate, x, M, g);
        linear_then_bias(&m, f->up, x, M, u);
    } else {
        mf_linear_apply(&m, f->gate, x, M, g);
        mf_linear_apply(&m, f->up, x, M, u);
    }
#pragma omp parallel for num_threads(mm->threads) if (mm->threads > 1 && (size_t)M * I >= 8192)
    for (size_t i = 0; i < (size_t)M * I; i++) {
        if (f->clamped) {
            g[i] = clamped_swiglu(f, act_dtype, g[i], u[i]);
            continue;
        }
        double a = mf_round_to(act_dtype, mf_act_apply(f->act, g[i]));
        g[i] = mf_round_to(act_dtype, a * u[i]);
    }
    if (f->clamped) linear_then_bias(&m, f->down, g, M, y);
    else mf_linear_apply(&m, f->down, g, M, y);
    free(g);
    free(u);
}

void mf_combine(const mf_combine_spec *spec, const mf_dispatch *d, const double *y, int H, const double *w,
                double *out) {
    const int T = d->n_tokens, k = d->top_k;
#pragma omp parallel for if ((size_t)T * H * k >= 65536)
    for (int t = 0; t < T; t++) {
        double *o = out + (size_t)t * H;
        for (int h = 0; h < H; h++) {
            double acc = 0;
            for (int s = 0; s < k; s++) {
                double p = mf_round_to(spec->product, y[(size_t)d->row_of[t * k + s] * H + h] * w[t * k + s]);
                acc = mf_round_to(spec->sum, acc + p);
            }
            o[h] = mf_round_to(spec->out, acc);
        }
    }
}

/* The fp32 forms (activations held as floats; policies whose opmath is fp32):
 * the same roundings, each product of two fp32 values exact in double and so
 * equal to the float product, the activation computed in double as above. */
void mf_ffn_apply_f32(const mf_mm *mm, const mf_ffn *f, mf_dtype act_dtype, const float *x, int M, float *y) {
    const int I = f->gate->out;
    float *g = mf_xmalloc((size_t)M * I * sizeof(float));
    float *u = mf_xmalloc((size_t)M * I * sizeof(float));
    mf_mm m = *mm;
    m.out = act_dtype;
    if (f->clamped) {
        linear_then_bias_f32(&m, f->gate, x, M, g);
        linear_then_bias_f32(&m, f->up, x, M, u);
    } else {
        mf_linear_apply_f32(&m, f->gate, x, M, g);
        mf_linear_apply_f32(&m, f->up, x, M, u);
    }
#pragma omp parallel for num_threads(mm->threads) if (mm->threads > 1 && (size_t)M * I >= 8192)
    for (size_t i = 0; i < (size_t)M * I; i++) {
        if (f->clamped) {
            g[i] = (float)clamped_swiglu(f, act_dtype, g[i], u[i]);
            continue;
        }
        const float a = (float)mf_round_to(act_dtype, mf_act_apply(f->act, g[i]));
        g[i] = mf_roundf_to(act_dtype, a * u[i]);
    }
    if (f->clamped) linear_then_bias_f32(&m, f->down, g, M, y);
    else mf_linear_apply_f32(&m, f->down, g, M, y);
    free(g);
    free(u);
}

void mf_combine_f32(const mf_combine_spec *spec, const mf_dispatch *d, const float *y, int H, const double *w,
                    float *out) {
    const int T = d->n_tokens, k = d->top_k;
#pragma omp parallel for if ((size_t)T * H * k >= 65536)
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * H;
        float wt[k];   /* the weights, fp32 values (applied in fp32 or the activations' dtype) */
        const int kk = k;
        for (int s = 0; s < kk; s++) wt[s] = (float)w[t * k + s];
        for (int h = 0; h < H; h++) {
            float acc = 0;
            for (int s = 0; s < kk; s++) {
                const float p = mf_roundf_to(spec->product, y[(size_t)d->row_of[t * k + s] * H + h] * wt[s]);
                acc = mf_roundf_to(spec->sum, acc + p);
            }
            o[h] = mf_roundf_to(spec->out, acc);
        }
    }
}
