/* Dtype names, sizes and exact conversions (round to nearest even). */
#include "mf_core.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; size_t size; } dtype_info[MF_DTYPE_COUNT] = {
    [MF_DTYPE_INVALID] = {"INVALID", 0},
    [MF_BF16] = {"BF16", 2}, [MF_F16] = {"F16", 2}, [MF_F32] = {"F32", 4}, [MF_F64] = {"F64", 8},
    [MF_I8] = {"I8", 1}, [MF_U8] = {"U8", 1}, [MF_I16] = {"I16", 2}, [MF_U16] = {"U16", 2},
    [MF_I32] = {"I32", 4}, [MF_U32] = {"U32", 4}, [MF_I64] = {"I64", 8}, [MF_U64] = {"U64", 8},
    [MF_BOOL] = {"BOOL", 1}, [MF_F8E4M3] = {"F8_E4M3", 1}, [MF_F8E5M2] = {"F8_E5M2", 1},
};

size_t mf_dtype_size(mf_dtype t) { return (t > 0 && t < MF_DTYPE_COUNT) ? dtype_info[t].size : 0; }
const char *mf_dtype_name(mf_dtype t) { return (t > 0 && t < MF_DTYPE_COUNT) ? dtype_info[t].name : "INVALID"; }

mf_dtype mf_dtype_from_name(const char *name) {
    for (int t = 1; t < MF_DTYPE_COUNT; t++)
        if (strcmp(dtype_info[t].name, name) == 0) return (mf_dtype)t;
    return MF_DTYPE_INVALID;
}

bool mf_dtype_is_float(mf_dtype t) { return t == MF_BF16 || t == MF_F16 || t == MF_F32 || t == MF_F64; }


/* Rounds a double to a binary format with `mant` explicit fraction bits,
 * exponent range [emin, emax] (unbiased, normal numbers), gradual underflow.
 * Returns the rounded value as a double (exact). */
static double round_to_format(double x, int mant, int emin, int emax) {
    if (x == 0 || !isfinite(x)) return x;
    int e;
    frexp(x, &e);           /* x = f * 2^e, 0.5 <= |f| < 1, so the leading bit weighs 2^(e-1) */
    int exp = e - 1;
    if (exp < emin) exp = emin;   /* subnormal: quantum fixed by emin */
    double quantum = ldexp(1.0, exp - mant);
    double q = x / quantum;       /* exact: power-of-two scaling */
    double r = nearbyint(q);      /* default rounding mode: nearest even */
    double y = r * quantum;
    /* overflow: past the largest finite value rounds to infinity */
    double maxv = ldexp(2.0 - ldexp(1.0, -mant), emax);
    if (fabs(y) > maxv) return copysign(INFINITY, x);
    return y;
}

uint16_t mf_f64_to_bf16(double d) {
    if (isnan(d)) return mf_f32_to_bf16((float)d);
    double r = round_to_format(d, 7, -126, 127);
    return mf_f32_to_bf16((float)r);   /* exact: r is representable in bf16 */
}

float mf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24);
        if (sign) f = -f;
        return f;
    }
    uint32_t u;
    if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp - 15 + 127) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f16_bits_from_exact(double r) {
    /* r is exactly representable in fp16 (or +-Inf). */
    uint16_t sign = signbit(r) ? 0x8000u : 0;
    double a = fabs(r);
    if (isinf(a)) return sign | 0x7c00u;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    int exp = e - 1;
    if (exp < -14) return sign | (uint16_t)(a * 16777216.0);   /* subnormal: a / 2^-24 */
    uint16_t man = (uint16_t)((ldexp(a, -exp) - 1.0) * 1024.0);
    return sign | (uint16_t)((exp + 15) << 10) | man;
}

uint16_t mf_f64_to_f16(double d) {
    if (isnan(d)) return (uint16_t)(signbit(d) ? 0xfe00u : 0x7e00u);
    return f16_bits_from_exact(round_to_format(d, 10, -14, 15));
}

uint16_t mf_f32_to_f16(float f) { return mf_f64_to_f16((double)f); }   /* f32 -> f64 is exact */

double mf_round_bf16_slow(double x) { return (double)mf_bf16_to_f32(mf_f64_to_bf16(x)); }
double mf_round_f16_slow(double x) { return (double)mf_f16_to_f32(mf_f64_to_f16(x)); }

double mf_load_as_f64(const void *buf, mf_dtype t, size_t i) {
    const uint8_t *p = buf;
    switch (t) {
    case MF_BF16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return mf_bf16_to_f32(h); }
    case MF_F16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return mf_f16_to_f32(h); }
    case MF_F32: { float f; memcpy(&f, p + 4 * i, 4); return f; }
    case MF_F64: { double d; memcpy(&d, p + 8 * i, 8); return d; }
    default: return NAN;
    }
}

void mf_store_from_f64(void *buf, mf_dtype t, size_t i, double x) {
    uint8_t *p = buf;
    switch (t) {
    case MF_BF16: { uint16_t h = mf_f64_to_bf16(x); memcpy(p + 2 * i, &h, 2); break; }
    case MF_F16: { uint16_t h = mf_f64_to_f16(x); memcpy(p + 2 * i, &h, 2); break; }
    case MF_F32: { float f = (float)x; memcpy(p + 4 * i, &f, 4); break; }
    case MF_F64: memcpy(p + 8 * i, &x, 8); break;
    default: break;
    }
}
