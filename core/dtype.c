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

uint16_t mf_f32_to_f16(float f) { return mf_f64_to_f16((double)f); }   /* f32 -> f64 is exact */

/* OCP FP8 E4M3 (torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111
 * is NaN; exponent 0 is subnormal (m/8 x 2^-6). */
double mf_f8e4m3_to_f64(uint8_t b) {
    const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return sign ? -v : v;
}

uint8_t mf_f32_to_f8e4m3_sat(float x) {
    if (isnan(x)) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (a >= 448) return sign | 0x7e;
    /* the quantum of a's binade (2^(e - 3)), or the subnormals' 2^-9; nearbyint rounds to nearest even in the
     * default mode, and a quantum is a power of two, so a / q and the product back are exact */
    const int e = a < 0x1p-6 ? -6 : ilogb(a);
    const double q = ldexp(1.0, e - 3), r = nearbyint(a / q) * q;
    if (r == 0) return sign;
    if (r < 0x1p-6) return sign | (uint8_t)(r / 0x1p-9);   /* subnormal: m x 2^-9 */
    const int re = ilogb(r);                                /* a value rounded up into the next binade */
    return sign | (uint8_t)((re + 7) << 3) | (uint8_t)(r / ldexp(1.0, re) * 8 - 8);
}

double mf_load_as_f64(const void *buf, mf_dtype t, size_t i) {
    const uint8_t *p = buf;
    switch (t) {
    case MF_F8E4M3: return mf_f8e4m3_to_f64(p[i]);
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
