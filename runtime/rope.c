/* Rotary position embedding tables, every scaling type of the five
 * architectures (transformers' modeling_rope_utils). In an fp64 run every
 * step is in double; otherwise each step is rounded to fp32 as PyTorch
 * computes it (cos and sin themselves are correctly rounded here; PyTorch's
 * vectorised cos differs in the last fp32 bit for a few percent of angles,
 * which the cast to bf16 almost always hides). The caller casts cos and sin
 * to the activation dtype. */
#include "mf_runtime.h"

#include <math.h>
#include <stdlib.h>

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* R() rounds to fp32 when emulating PyTorch's fp32 tensor math, else keeps
 * the double: transformers computes every step below on fp32 tensors, with
 * Python floats as fp32 scalars, and `a / t` as `t.reciprocal() * a`. */
#define R(x) (f32 ? (double)(float)(x) : (x))

/* inv_freq[dim/2] and the attention scaling applied to cos and sin. */
static double inv_freqs(const mf_config *cfg, int T, int dim, bool f32, double *inv) {
    const mf_rope *r = &cfg->rope;
    const int half = dim / 2;
    double base = r->theta, scaling = 1.0;
    if (r->type == MF_ROPE_DYNAMIC && T > cfg->max_pos) {   /* NTK: base grows with the sequence */
        double a = R(R(R(R(r->factor * T) / cfg->max_pos)) - (r->factor - 1));
        base = R(base * R(pow(a, R((double)dim / (dim - 2)))));
    }
    for (int i = 0; i < half; i++) inv[i] = R(1.0 / R(pow(R(base), R((2.0 * i) / dim))));
    switch (r->type) {
    case MF_ROPE_DEFAULT:
    case MF_ROPE_DYNAMIC:
        break;
    case MF_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv[i] = R(inv[i] / R(r->factor));
        break;
    case MF_ROPE_LLAMA3: {
        double old = r->original_max_pos;
        double low_wl = R(old / r->low_freq_factor), high_wl = R(old / r->high_freq_factor);
        for (int i = 0; i < half; i++) {
            double wl = R(R(1.0 / inv[i]) * R(2 * M_PI));
            double scaled = wl > low_wl ? R(inv[i] / R(r->factor)) : inv[i];
            if (!(wl < high_wl) && !(wl > low_wl)) {   /* medium band: smooth between scaled and unscaled */
                double smooth = R(R(R(R(1.0 / wl) * old) - R(r->low_freq_factor)) / R(r->high_freq_factor - r->low_freq_factor));
                scaled = R(R(R(R(1 - smooth) * scaled) / R(r->factor)) + R(smooth * scaled));
            }
            inv[i] = scaled;
        }
        break;
    }
    case MF_ROPE_YARN: {
        double orig = r->original_max_pos > 0 ? r->original_max_pos : cfg->max_pos;
        double f = r->factor;
        if (r->attention_factor > 0) scaling = r->attention_factor;
        else if (r->mscale > 0 && r->mscale_all_dim > 0)
            scaling = yarn_mscale(f, r->mscale) / yarn_mscale(f, r->mscale_all_dim);
        else scaling = yarn_mscale(f, 1.0);
        /* the correction range is computed on Python floats (double) */
        double lo = dim * log(orig / (r->beta_fast * 2 * M_PI)) / (2 * log(base));
        double hi = dim * log(orig / (r->beta_slow * 2 * M_PI)) / (2 * log(base));
        if (r->truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            double pos_freq = R(pow(R(base), R((2.0 * i) / dim)));
            double extra = R(1.0 / pos_freq), inter = R(1.0 / R(R(f) * pos_freq));
            double ramp = R(R(i - lo) / R(hi - lo));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra_factor = R(1 - ramp);
            inv[i] = R(R(inter * R(1 - extra_factor)) + R(extra * extra_factor));
        }
        break;
    }
    }
    return scaling;
}

#undef R

void mf_rope_tables(const mf_config *cfg, const mf_precision *prec, int T, double *cos_t, double *sin_t) {
    const int dim = cfg->rope_dim > 0 ? cfg->rope_dim : cfg->head_dim, half = dim / 2;
    const bool f32 = prec->opmath == MF_F32;
    double *inv = mf_xmalloc((size_t)half * sizeof(double));
    double scaling = inv_freqs(cfg, T, dim, f32, inv);
    if (f32) scaling = (float)scaling;
    for (int p = 0; p < T; p++)
        for (int i = 0; i < half; i++) {
            double ang = inv[i] * p;
            double c, s;
            if (f32) {
                float a = (float)ang;
                c = (float)cos((double)a);
                s = (float)sin((double)a);
                if (scaling != 1.0) {
                    c = (float)(c * scaling);
                    s = (float)(s * scaling);
                }
            } else {
                c = cos(ang) * scaling;
                s = sin(ang) * scaling;
            }
            /* emb = cat(freqs, freqs): both halves share the angle */
            cos_t[(size_t)p * dim + i] = cos_t[(size_t)p * dim + i + half] = c;
            sin_t[(size_t)p * dim + i] = sin_t[(size_t)p * dim + i + half] = s;
        }
    free(inv);
}
