/* Rotary position embedding tables, every scaling type of the five
 * architectures (transformers' modeling_rope_utils). inv_freq is computed in
 * double; in an fp32-opmath run the frequencies, angles and cos/sin are
 * rounded to fp32 as PyTorch holds them, and cos/sin are then cast to the
 * activation dtype by the caller. */
#include "mf_runtime.h"

#include <math.h>
#include <stdlib.h>

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* inv_freq[dim/2] and the attention scaling applied to cos and sin. */
static double inv_freqs(const mf_config *cfg, int T, int dim, double *inv) {
    const mf_rope *r = &cfg->rope;
    const int half = dim / 2;
    double base = r->theta, scaling = 1.0;
    if (r->type == MF_ROPE_DYNAMIC && T > cfg->max_pos)
        base = base * pow(r->factor * T / cfg->max_pos - (r->factor - 1), (double)dim / (dim - 2));
    for (int i = 0; i < half; i++) inv[i] = 1.0 / pow(base, (2.0 * i) / dim);
    switch (r->type) {
    case MF_ROPE_DEFAULT:
    case MF_ROPE_DYNAMIC:
        break;
    case MF_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv[i] /= r->factor;
        break;
    case MF_ROPE_LLAMA3: {
        double old = r->original_max_pos;
        double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double wl = 2 * M_PI / inv[i];
            if (wl > low_wl) inv[i] = inv[i] / r->factor;
            else if (!(wl < high_wl)) {   /* medium band: smooth between scaled and unscaled */
                double smooth = (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                inv[i] = (1 - smooth) * inv[i] / r->factor + smooth * inv[i];
            }
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
            double pos_freq = pow(base, (2.0 * i) / dim);
            double extra = 1.0 / pos_freq, inter = 1.0 / (f * pos_freq);
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra_factor = 1 - ramp;
            inv[i] = inter * (1 - extra_factor) + extra * extra_factor;
        }
        break;
    }
    }
    return scaling;
}

void mf_rope_tables(const mf_config *cfg, const mf_precision *prec, int T, double *cos_t, double *sin_t) {
    const int dim = cfg->head_dim, half = dim / 2;
    const bool f32 = prec->opmath == MF_F32;
    double *inv = mf_xmalloc((size_t)half * sizeof(double));
    double scaling = inv_freqs(cfg, T, dim, inv);
    if (f32) {
        for (int i = 0; i < half; i++) inv[i] = (float)inv[i];
        scaling = (float)scaling;
    }
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
