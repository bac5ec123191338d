/* Bit-accurate models of GPU matrix instructions (docs/numerics.md, "The instruction models").
 *
 * Every input is decoded to an exact (sign, integer significand, exponent)
 * triple and every intermediate is an exact integer scaled by a power of two,
 * so the models are exact by construction; the only roundings are the ones
 * the hardware makes:
 *  - NVIDIA (Volta..Blackwell): one fused dot-add per instruction (Ampere and
 *    Ada split k in two halves): terms truncated to F fraction bits relative
 *    to the largest exponent, added exactly, rounded toward zero to fp32
 *    (round to nearest even for an f16 result); Blackwell's mxf8f6f4 scales
 *    each product by its row's and column's ue8m0 scales inside that sum;
 *  - NVIDIA Blackwell mxf4nvf4: exact sums of 16 fp4 products, scaled, fused
 *    with C at 35 fraction bits;
 *  - AMD CDNA3 (and CDNA4, modelled as CDNA3): groups of products truncated to 24 bits relative to their
 *    largest exponent, then the group sum rounded down to 31 bits and the
 *    accumulator down to 24 bits relative to the larger of the two, added,
 *    rounded to nearest fp32; fp8 groups of 16 reduced as even and odd halves;
 *  - AMD CDNA1/CDNA2: groups of 2 or 4 products summed as a pairwise tree of
 *    fp32 fma, added to the accumulator in fp32; CDNA2 flushes subnormals;
 *  - fp32/fp64 forms: a plain fma chain. */
#include "mf_numerics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- formats ----------------------------------------------------------- */

typedef struct fmt_info {
    const char *name;
    int exp_bits, frac_bits, bias, min_exp, bytes;
    enum { NAN_IEEE, NAN_FN, NAN_FNUZ, NAN_NONE } nan;
} fmt_info;

static const fmt_info fmts[MF_FMT_COUNT] = {
    [MF_FMT_BF16] = {"bf16", 8, 7, 127, -126, 2, NAN_IEEE},
    [MF_FMT_F16] = {"f16", 5, 10, 15, -14, 2, NAN_IEEE},
    [MF_FMT_F32] = {"f32", 8, 23, 127, -126, 4, NAN_IEEE},
    [MF_FMT_TF32] = {"tf32", 8, 23, 127, -126, 4, NAN_IEEE},
    [MF_FMT_F64] = {"f64", 11, 52, 1023, -1022, 8, NAN_IEEE},
    [MF_FMT_E4M3] = {"e4m3", 4, 3, 7, -6, 1, NAN_FN},
    [MF_FMT_E5M2] = {"e5m2", 5, 2, 15, -14, 1, NAN_IEEE},
    [MF_FMT_E4M3FNUZ] = {"fp8", 4, 3, 8, -7, 1, NAN_FNUZ},
    [MF_FMT_E5M2FNUZ] = {"bf8", 5, 2, 16, -15, 1, NAN_FNUZ},
    [MF_FMT_E2M1] = {"e2m1", 2, 1, 1, 0, 1, NAN_NONE},
    [MF_FMT_UE8M0] = {"ue8m0", 8, 0, 127, -127, 1, NAN_NONE},   /* decoded apart: no zero, 0xff NaN */
    [MF_FMT_UE4M3] = {"ue4m3", 4, 3, 7, -6, 1, NAN_FN},         /* e4m3 read without its sign bit */
};

int mf_fmt_bytes(mf_fmt f) { return fmts[f].bytes; }

enum { CLS_ZERO, CLS_FINITE, CLS_INF, CLS_NAN };

/* |x| = mant * 2^(e - fb); e follows MMA-Sim's convention: the unbiased
 * exponent for normal numbers, the format's minimum for subnormals, -126 for
 * zeros. */
typedef struct num {
    int cls;
    bool neg;
    uint64_t mant;
    int e, fb;
} num;

static num decode(mf_fmt f, uint64_t bits) {
    const fmt_info *fi = &fmts[f];
    num x = {0};
    if (f == MF_FMT_TF32) bits &= ~(uint64_t)0x1fff;   /* tf32: fp32 with the low 13 fraction bits cleared */
    if (f == MF_FMT_UE4M3) bits &= 0x7f;               /* unsigned: the unit takes |s| (MMA-Sim) */
    if (f == MF_FMT_E2M1) bits &= 0xf;
    if (f == MF_FMT_UE8M0) {   /* 2^(bits - 127): significand 1, exponent bits - 127 (2^-127 for 0) */
        bits &= 0xff;
        x.cls = bits == 0xff ? CLS_NAN : CLS_FINITE;
        x.mant = 1;
        x.e = (int)bits - 127;
        return x;
    }
    const int total = fi->exp_bits + fi->frac_bits;
    x.neg = (bits >> total) & 1;
    const uint64_t E = (bits >> fi->frac_bits) & ((1u << fi->exp_bits) - 1);
    const uint64_t M = bits & (((uint64_t)1 << fi->frac_bits) - 1);
    const uint64_t Emax = (1u << fi->exp_bits) - 1;
    x.fb = fi->frac_bits;
    if (fi->nan == NAN_FNUZ && x.neg && E == 0 && M == 0) {
        x.cls = CLS_NAN;   /* 0x80: the only NaN, and there is no -0 */
        return x;
    }
    if (fi->nan == NAN_FN && E == Emax && M == ((uint64_t)1 << fi->frac_bits) - 1) {
        x.cls = CLS_NAN;
        return x;
    }
    if (fi->nan == NAN_IEEE && E == Emax) {
        x.cls = M ? CLS_NAN : CLS_INF;
        return x;
    }
    if (E == 0) {
        x.mant = M;
        x.e = M ? fi->min_exp : -126;
        x.cls = M ? CLS_FINITE : CLS_ZERO;
        return x;
    }
    x.cls = CLS_FINITE;
    x.mant = M | ((uint64_t)1 << fi->frac_bits);
    x.e = (int)E - fi->bias;
    return x;
}

static double num_value(num x) {
    if (x.cls == CLS_NAN) return NAN;
    if (x.cls == CLS_INF) return x.neg ? -INFINITY : INFINITY;
    double v = ldexp((double)x.mant, x.e - x.fb);
    return x.neg ? -v : v;
}

/* A signed integer times a power of two: shifts with truncation toward zero
 * (trunc) or toward minus infinity (floor). */
static int64_t shift_trunc(int64_t v, int sh) {
    if (sh >= 0) return v * ((int64_t)1 << sh);   /* callers keep this within 63 bits */
    if (sh <= -63) return 0;
    uint64_t mag = v < 0 ? (uint64_t)(-v) : (uint64_t)v;
    mag >>= -sh;
    return v < 0 ? -(int64_t)mag : (int64_t)mag;
}

static int64_t shift_floor(int64_t v, int sh) {
    if (sh >= 0) return v * ((int64_t)1 << sh);
    if (sh <= -63) return v < 0 ? -1 : 0;
    return v >> -sh;   /* arithmetic shift: floor */
}

static int bitlen(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

/* S * 2^scale rounded toward zero to an fp32 with `frac` fraction bits
 * (23, or 13 for Hopper's fp8 "e8m13" result). */
static uint32_t round_rz_f32(int64_t S, int scale, int frac) {
    if (S == 0) return 0;
    const bool neg = S < 0;
    uint64_t mag = neg ? (uint64_t)(-S) : (uint64_t)S;
    int ev = bitlen(mag) - 1 + scale;
    if (ev >= 128) return neg ? 0xff800000u : 0x7f800000u;
    int eff = ev < -126 ? -126 : ev;
    int q = eff - frac;   /* quantum exponent */
    int sh = q - scale;
    if (sh > 0) mag = sh >= 64 ? 0 : mag >> sh;
    else mag <<= -sh;
    if (!mag) return 0;   /* a sum that truncates to zero is +0, whatever its sign (MMA-Sim) */
    float f = (float)ldexp((double)mag, q);
    return mf_f32_bits(neg ? -f : f);
}

/* The same with round to nearest even into fp16 bits. */
static uint16_t round_rne_f16(int64_t S, int scale) {
    if (S == 0) return 0;
    double v = ldexp((double)S, scale);   /* exact: |S| < 2^53 here */
    uint16_t h = mf_f64_to_f16(v);
    return (h & 0x7fff) ? h : 0;   /* a sum that rounds to zero is +0, whatever its sign */
}

/* ---- NVIDIA: fused dot-add ---------------------------------------------- */

/* NaN and Inf follow the IEEE result of the exact sum. Returns true when the
 * result is decided here (NaN or Inf), with *nan / *inf_neg telling which. */
static bool special_sum(const num *pa, const num *pb, int k, num c, bool *nan, bool *inf_neg) {
    bool pos_inf = false, neg_inf = false, any_nan = false;
    for (int i = 0; i < k; i++) {
        num a = pa[i], b = pb[i];
        if (a.cls == CLS_NAN || b.cls == CLS_NAN) any_nan = true;
        else if (a.cls == CLS_INF || b.cls == CLS_INF) {
            if (a.cls == CLS_ZERO || b.cls == CLS_ZERO) any_nan = true;
            else if (a.neg != b.neg) neg_inf = true;
            else pos_inf = true;
        }
    }
    if (c.cls == CLS_NAN) any_nan = true;
    else if (c.cls == CLS_INF) *(c.neg ? &neg_inf : &pos_inf) = true;
    if (any_nan || (pos_inf && neg_inf)) {
        *nan = true;
        return true;
    }
    if (pos_inf || neg_inf) {
        *nan = false;
        *inf_neg = neg_inf;
        return true;
    }
    return false;
}

/* One fused dot-add over k products and c (decoded), F fraction bits;
 * returns D bits in the output format. scale_e: the exponent every product
 * is scaled by (mxf8f6f4's two ue8m0 scales; 0 without scales). */
static uint64_t nv_fused(const mf_mma_instr *I, const num *pa, const num *pb, int k, num c, int scale_e) {
    bool nan, inf_neg;
    const bool f16_out = I->c_fmt == MF_FMT_F16;
    if (special_sum(pa, pb, k, c, &nan, &inf_neg)) {
        if (nan) return f16_out ? 0x7fff : 0x7fffffffu;
        return f16_out ? (inf_neg ? 0xfc00 : 0x7c00) : (inf_neg ? 0xff800000u : 0x7f800000u);
    }
    const int F = I->frac_bits;
    int E = c.e;
    for (int i = 0; i < k; i++) {
        if (I->zero_products_excluded && (pa[i].cls == CLS_ZERO || pb[i].cls == CLS_ZERO)) continue;
        int e = pa[i].e + pb[i].e + scale_e;
        E = e > E ? e : E;
    }
    int64_t S = 0;
    for (int i = 0; i < k; i++) {
        uint64_t m = pa[i].mant * pb[i].mant;
        if (!m) continue;
        int64_t t = shift_trunc((int64_t)m, F + pa[i].e + pb[i].e + scale_e - E - pa[i].fb - pb[i].fb);
        S += pa[i].neg != pb[i].neg ? -t : t;
    }
    if (c.mant) {
        int64_t t = shift_trunc((int64_t)c.mant, F + c.e - E - c.fb);
        S += c.neg ? -t : t;
    }
    if (f16_out) return round_rne_f16(S, E - F);
    return round_rz_f32(S, E - F, I->out_frac);
}

/* Blackwell mxf4nvf4 (MMA-Sim's model): each run of 16 fp4 products is summed
 * exactly, multiplied by its two scales (their significands included: ue4m3
 * has 3 fraction bits) and given their exponents as its own; these terms and C
 * are then truncated to F = 35 bits relative to the largest exponent among
 * them (a zero sum still counts with its scales' exponents), added exactly and
 * rounded toward zero to fp32. A NaN scale or C gives NaN. An infinite C is
 * not in MMA-Sim's model (it fails there); here it passes through. */
static uint32_t nv_block_sum(const mf_mma_instr *I, const num *pa, const num *pb, int k, num c, const num *sa,
                             const num *sb) {
    const int nscale = k / I->block, chunks = k / 16;
    bool nan = c.cls == CLS_NAN;
    for (int q = 0; q < nscale; q++) nan |= sa[q].cls == CLS_NAN || sb[q].cls == CLS_NAN;
    if (nan) return 0x7fffffffu;
    if (c.cls == CLS_INF) return c.neg ? 0xff800000u : 0x7f800000u;
    const int F = I->frac_bits;
    int64_t sum4[chunks];   /* each chunk's exact sum, times 4: fp4 values are multiples of 1/2 */
    int E = c.e;
    for (int q = 0; q < chunks; q++) {
        int64_t s4 = 0;
        for (int i = q * 16; i < q * 16 + 16; i++) {
            int64_t m = (int64_t)(pa[i].mant * pb[i].mant);
            if (!m) continue;
            m <<= pa[i].e + pb[i].e + 2 - pa[i].fb - pb[i].fb;   /* fp4: e - fb >= -1 */
            s4 += pa[i].neg != pb[i].neg ? -m : m;
        }
        sum4[q] = s4;
        const num *x = &sa[q * 16 / I->block], *y = &sb[q * 16 / I->block];
        E = x->e + y->e > E ? x->e + y->e : E;
    }
    int64_t S = 0;
    for (int q = 0; q < chunks; q++) {
        const num *x = &sa[q * 16 / I->block], *y = &sb[q * 16 / I->block];
        int64_t v = sum4[q] * (int64_t)(x->mant * y->mant);   /* |v| < 2^20 */
        S += shift_trunc(v, F + x->e + y->e - E - 2 - x->fb - y->fb);
    }
    if (c.mant) {
        int64_t t = shift_trunc((int64_t)c.mant, F + c.e - E - c.fb);
        S += c.neg ? -t : t;
    }
    return round_rz_f32(S, E - F, 23);
}

/* ---- AMD CDNA3: two-stage, rounding down -------------------------------- */

static uint32_t amd_nan_bits(const num *pa, const num *pb, int k, num c, bool input_nan_first) {
    /* A NaN input comes through (x86 keeps the first NaN operand); a NaN made
     * by inf - inf or inf * 0 is the x86 default NaN, negative. This is what
     * MMA-Sim's double-precision check produces. */
    if (input_nan_first) {
        for (int i = 0; i < k; i++) {
            if (pa[i].cls == CLS_NAN) return pa[i].neg ? 0xffc00000u : 0x7fc00000u;
            if (pb[i].cls == CLS_NAN) return pb[i].neg ? 0xffc00000u : 0x7fc00000u;
        }
        if (c.cls == CLS_NAN) return c.neg ? 0xffc00000u : 0x7fc00000u;
    }
    return 0xffc00000u;
}

/* Stage 1: sum of products, each truncated to F bits relative to the largest
 * product exponent. Returns the integer sum in units of 2^(*emax - F). */
static int64_t amd_stage1(const num *pa, const num *pb, int n, int stride, int F, int *emax) {
    int E = INT32_MIN;
    for (int i = 0; i < n; i += stride) {
        int e = pa[i].e + pb[i].e;
        E = e > E ? e : E;
    }
    int64_t S = 0;
    for (int i = 0; i < n; i += stride) {
        uint64_t m = pa[i].mant * pb[i].mant;
        if (!m) continue;
        int64_t t = shift_trunc((int64_t)m, F + pa[i].e + pb[i].e - E - pa[i].fb - pb[i].fb);
        S += pa[i].neg != pb[i].neg ? -t : t;
    }
    *emax = E;
    return S;
}

static uint32_t amd_group(const num *pa, const num *pb, int g, num c, bool fp8) {
    bool nan, inf_neg;
    if (special_sum(pa, pb, g, c, &nan, &inf_neg)) {
        if (nan) {
            bool input_nan = c.cls == CLS_NAN;
            for (int i = 0; i < g; i++) input_nan |= pa[i].cls == CLS_NAN || pb[i].cls == CLS_NAN;
            return amd_nan_bits(pa, pb, g, c, input_nan);
        }
        return inf_neg ? 0xff800000u : 0x7f800000u;
    }
    /* products of magnitude >= 2^128 saturate the result to infinity */
    bool pinf = false, ninf = false;
    for (int i = 0; i < g; i++) {
        uint64_t m = pa[i].mant * pb[i].mant;
        if (!m) continue;
        int ev = bitlen(m) - 1 + pa[i].e + pb[i].e - pa[i].fb - pb[i].fb;
        if (ev >= 128) *(pa[i].neg != pb[i].neg ? &ninf : &pinf) = true;
    }
    if (pinf && ninf) return 0x7fc00000u;
    if (pinf || ninf) return ninf ? 0xff800000u : 0x7f800000u;
    const int F = 24;
    int64_t s31;   /* group sum in units of 2^(E - 31) */
    int E;
    int64_t c24;
    if (!fp8) {
        int ep;
        int64_t S = amd_stage1(pa, pb, g, 1, F, &ep);
        E = ep > c.e ? ep : c.e;
        s31 = shift_floor(S, 31 - F + ep - E);
        int64_t cm = c.neg ? -(int64_t)c.mant : (int64_t)c.mant;
        c24 = shift_floor(cm, 24 + c.e - E - c.fb);
    } else {
        int e0, e1;
        int64_t S0 = amd_stage1(pa, pb, g, 2, F, &e0);
        int64_t S1 = amd_stage1(pa + 1, pb + 1, g - 1, 2, F, &e1);
        int em = e0 > e1 ? e0 : e1;
        int64_t s = shift_floor(S0, e0 - em) + shift_floor(S1, e1 - em);   /* units 2^(em - 24) */
        E = em > c.e ? em : c.e;
        s31 = shift_floor(s, 31 - F + em - E);
        int64_t cm = c.neg ? -(int64_t)c.mant : (int64_t)c.mant;
        c24 = c.e >= E - 25 ? shift_floor(cm, 24 + c.e - E - c.fb) : 0;
    }
    int64_t total = s31 + c24 * 128;   /* both in units of 2^(E - 31) */
    float f = (float)ldexp((double)total, E - 31);   /* exact double, one RNE rounding to fp32 */
    if (total == 0) f = 0.0f;
    return mf_f32_bits(f);
}

/* ---- AMD CDNA1/CDNA2: pairwise fp32 fma tree ---------------------------- */

static float flush32(float x, bool keep_sign) {
    if (fabsf(x) < 0x1p-126f) return keep_sign ? x * 0.0f : 0.0f;
    return x;
}

static float pairwise(const float *a, const float *b, int n, bool flush) {
    float s;
    if (n == 1) s = fmaf(a[0], b[0], 0.0f);
    else {
        int m = n / 2;
        float l = pairwise(a, b, m, flush), r = pairwise(a + m, b + m, n - m, flush);
        s = fmaf(l, 1.0f, r);
    }
    return flush ? flush32(s, true) : s;
}

/* ---- instructions ------------------------------------------------------- */

static bool parse_nv_type(const char *s, mf_fmt *f) {
    static const struct { const char *n; mf_fmt f; } t[] = {
        {"bf16", MF_FMT_BF16}, {"f16", MF_FMT_F16}, {"f32", MF_FMT_F32}, {"tf32", MF_FMT_TF32},
        {"f64", MF_FMT_F64},   {"e4m3", MF_FMT_E4M3}, {"e5m2", MF_FMT_E5M2}, {"e2m1", MF_FMT_E2M1},
        {"ue8m0", MF_FMT_UE8M0}, {"ue4m3", MF_FMT_UE4M3},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].n)) {
            *f = t[i].f;
            return true;
        }
    return false;
}

static bool parse_amd_type(const char *s, mf_fmt *f) {
    static const struct { const char *n; mf_fmt f; } t[] = {
        {"bf16", MF_FMT_BF16}, {"f16", MF_FMT_F16}, {"f32", MF_FMT_F32}, {"xf32", MF_FMT_TF32},
        {"f64", MF_FMT_F64},   {"fp8", MF_FMT_E4M3FNUZ}, {"bf8", MF_FMT_E5M2FNUZ},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].n)) {
            *f = t[i].f;
            return true;
        }
    return false;
}

static int nv_arch_frac(const char *arch) {
    if (!strcmp(arch, "Volta")) return 23;
    if (!strcmp(arch, "Turing") || !strcmp(arch, "Ampere") || !strcmp(arch, "Ada") || !strcmp(arch, "Ada Lovelace"))
        return 24;
    if (!strcmp(arch, "Hopper") || !strcmp(arch, "Blackwell") || !strcmp(arch, "RTX Blackwell")) return 25;
    return -1;
}

int mf_mma_lookup(mf_mma_instr *I, const char *arch, const char *name, mf_error *err) {
    memset(I, 0, sizeof *I);
    snprintf(I->arch, sizeof I->arch, "%s", arch);
    snprintf(I->name, sizeof I->name, "%s", name);
    char buf[128];
    snprintf(buf, sizeof buf, "%s", name);
    if (!strncmp(name, "mma.", 4) || !strncmp(name, "wgmma.", 6) || !strncmp(name, "tcgen05.mma.", 12)) {
        const bool wg = name[0] == 'w', tc = name[0] == 't';
        int frac = nv_arch_frac(arch);
        if (frac < 0) return mf_fail(err, MF_EUNSUPPORTED, "%s: unknown NVIDIA architecture \"%s\"", name, arch);
        if (tc && strcmp(arch, "Blackwell"))
            return mf_fail(err, MF_EUNSUPPORTED, "%s: tcgen05.mma is sm_100's (arch Blackwell), not %s's", name, arch);
        char *tok[10];
        int nt = 0;
        char *save = NULL;
        for (char *p = strtok_r(buf + (tc ? 12 : wg ? 6 : 4), ".", &save); p && nt < 10; p = strtok_r(NULL, ".", &save))
            tok[nt++] = p;
        /* mma: mMnNkK.D.A.B.C or mMnNkK.blockS.D.A.B.C.SF; wgmma: mMnNkK.D.A.B;
         * tcgen05.mma: mMnNkK.D.A.B or mMnNkK.blockS.D.A.B.SF */
        const int plain = wg || tc ? 4 : 5;
        const bool scaled = !wg && nt == plain + 2 && !strncmp(tok[1], "block", 5);
        if ((nt != plain && !scaled) || sscanf(tok[0], "m%dn%dk%d", &I->m, &I->n, &I->k) != 3 || I->m < 1 || I->n < 1 ||
            I->k < 1 || I->k > 256)
            return mf_fail(err, MF_EINVAL, "%s: not an instruction name of the form %s", name,
                           wg   ? "wgmma.mMnNkK.D.A.B"
                           : tc ? "tcgen05.mma.mMnNkK[.blockS].D.A.B[.SF]"
                                : "mma.mMnNkK[.blockS].D.A.B.C[.SF]");
        char **t = tok + (scaled ? 2 : 1);   /* D, A, B[, C][, SF] */
        mf_fmt d;
        if (!parse_nv_type(t[0], &d) || !parse_nv_type(t[1], &I->a_fmt) || !parse_nv_type(t[2], &I->b_fmt) ||
            (plain == 5 && !parse_nv_type(t[3], &I->c_fmt)) || (scaled && !parse_nv_type(t[plain - 1], &I->s_fmt)))
            return mf_fail(err, MF_EINVAL, "%s: unknown operand type", name);
        if (plain == 4) I->c_fmt = d;
        if (d != I->c_fmt) return mf_fail(err, MF_EUNSUPPORTED, "%s: C and D types differ", name);
        const mf_fmt at = I->a_fmt, bt = I->b_fmt;
        const bool scale_fmt = at == MF_FMT_UE8M0 || at == MF_FMT_UE4M3 || bt == MF_FMT_UE8M0 || bt == MF_FMT_UE4M3 ||
                               d == MF_FMT_UE8M0 || d == MF_FMT_UE4M3 || d == MF_FMT_E2M1;
        const bool f8f6f4 = (at == MF_FMT_E4M3 || at == MF_FMT_E5M2 || at == MF_FMT_E2M1) &&
                            (bt == MF_FMT_E4M3 || bt == MF_FMT_E5M2 || bt == MF_FMT_E2M1);
        if (scale_fmt || ((at == MF_FMT_E2M1 || bt == MF_FMT_E2M1) && !f8f6f4) ||
            ((at == MF_FMT_E2M1 || bt == MF_FMT_E2M1) && !tc && strcmp(arch, "RTX Blackwell")))
            return mf_fail(err, MF_EINVAL, "%s: ue8m0/ue4m3 are scale formats and e2m1 a Blackwell f8f6f4 operand", name);
        if (scaled) {
            char *end;
            I->block = (int)strtol(tok[1] + 5, &end, 10);
            if (!tc && strcmp(arch, "RTX Blackwell"))
                return mf_fail(err, MF_EUNSUPPORTED, "%s: block-scaled mma is sm_120's (arch RTX Blackwell)", name);
            const bool mx8 = I->k == 32 && f8f6f4 && I->block == 32 && I->s_fmt == MF_FMT_UE8M0;
            const bool mx4 = I->k == 64 && at == MF_FMT_E2M1 && bt == MF_FMT_E2M1 && (I->block == 16 || I->block == 32) &&
                             (I->s_fmt == MF_FMT_UE8M0 || (I->s_fmt == MF_FMT_UE4M3 && (!tc || I->block == 16)));
            if (*end || d != MF_FMT_F32 || !(mx8 || mx4))
                return mf_fail(err, MF_EUNSUPPORTED,
                               "%s: block-scaled kinds are k32 block32 e4m3/e5m2/e2m1 with ue8m0 (mxf8f6f4) and k64 e2m1 with "
                               "ue8m0 block16/32 or ue4m3 block16%s (mxf4nvf4), f32 accumulation", name,
                               tc ? "" : "/32");
            I->scaled = true;
            I->kind = mx4 ? MF_MMA_NV_BLOCK_SUM : MF_MMA_NV_FUSED;
            I->frac_bits = mx4 ? 35 : 25;
            I->out_frac = 23;
            I->halves = 1;
            return MF_OK;
        }
        if (I->a_fmt == MF_FMT_F64) {
            I->kind = MF_MMA_FMA_CHAIN;
            return MF_OK;
        }
        I->kind = MF_MMA_NV_FUSED;
        I->frac_bits = frac;
        I->out_frac = 23;
        const bool fp8 = at == MF_FMT_E4M3 || at == MF_FMT_E5M2;
        const bool ada = !strcmp(arch, "Ada") || !strcmp(arch, "Ada Lovelace");
        if (fp8 && (wg || ada)) {   /* fp8 keeps 13 fraction bits, and so does the fp32 result */
            I->frac_bits = 13;
            if (d == MF_FMT_F32) I->out_frac = 13;
        }
        I->halves = 1;
        if (!wg && !tc && (!strcmp(arch, "Ampere") || ada) &&
            ((I->k == 8 && at == MF_FMT_TF32) || (I->k == 16 && (at == MF_FMT_F16 || at == MF_FMT_BF16)) ||
             (I->k == 32 && fp8)))
            I->halves = 2;
        return MF_OK;
    }
    if (!strncmp(name, "mfma_", 5)) {
        if (strcmp(arch, "CDNA1") && strcmp(arch, "CDNA2") && strcmp(arch, "CDNA3") && strcmp(arch, "CDNA4"))
            return mf_fail(err, MF_EUNSUPPORTED, "%s: unknown AMD architecture \"%s\"", name, arch);
        const bool cdna4 = !strcmp(arch, "CDNA4");
        if (strstr(name, "f8f6f4") || !strncmp(name, "mfma_scale", 10))
            return mf_fail(err, MF_EUNSUPPORTED, "%s: CDNA4's f8f6f4 and block-scaled MFMA are not modelled (fp8 forms such "
                           "as mfma_f32_32x32x16_fp8_fp8 are)", name);
        char *tok[8];
        int nt = 0;
        char *save = NULL;
        for (char *p = strtok_r(buf + 5, "_", &save); p && nt < 8; p = strtok_r(NULL, "_", &save)) tok[nt++] = p;
        mf_fmt d;
        const char *shape = NULL, *at = NULL, *bt = NULL;
        char shape_buf[32] = "", type_buf[16] = "";
        bool k1 = false;
        if (nt == 2 || (nt == 3 && !strcmp(tok[2], "1k"))) {
            /* CDNA1/2: f32_32x32x8f16, f32_32x32x8bf16_1k: type glued to the shape */
            k1 = nt == 3;
            size_t L = strlen(tok[1]);
            size_t tl = L >= 4 && !strcmp(tok[1] + L - 4, "bf16") ? 4 : 3;
            if (L <= tl) return mf_fail(err, MF_EINVAL, "%s: malformed", name);
            snprintf(shape_buf, sizeof shape_buf, "%.*s", (int)(L - tl), tok[1]);
            snprintf(type_buf, sizeof type_buf, "%s", tok[1] + L - tl);
            shape = shape_buf;
            at = bt = type_buf;
        } else if (nt == 3) {
            shape = tok[1];
            at = bt = tok[2];
        } else if (nt == 4 && (!strcmp(tok[3], "fp8") || !strcmp(tok[3], "bf8"))) {
            shape = tok[1];
            at = tok[2];
            bt = tok[3];
        } else if (nt == 4) {
            shape = tok[1];   /* f32_32x32x4_2b_f16: a block-count qualifier before the type */
            at = bt = tok[3];
        } else {
            return mf_fail(err, MF_EINVAL, "%s: not an MFMA name", name);
        }
        if (!parse_amd_type(tok[0], &d) || !parse_amd_type(at, &I->a_fmt) || !parse_amd_type(bt, &I->b_fmt) ||
            sscanf(shape, "%dx%dx%d", &I->m, &I->n, &I->k) != 3)
            return mf_fail(err, MF_EINVAL, "%s: unknown operand type or shape", name);
        I->c_fmt = d;
        if (cdna4) {
            /* CDNA4 reads fp8/bf8 as the OCP formats (E4M3FN, E5M2), CDNA3 as the FNUZ ones, and has no xf32 */
            if (I->a_fmt == MF_FMT_TF32) return mf_fail(err, MF_EUNSUPPORTED, "%s: CDNA4 has no xf32 MFMA", name);
            if (I->a_fmt == MF_FMT_E4M3FNUZ) I->a_fmt = MF_FMT_E4M3;
            if (I->a_fmt == MF_FMT_E5M2FNUZ) I->a_fmt = MF_FMT_E5M2;
            if (I->b_fmt == MF_FMT_E4M3FNUZ) I->b_fmt = MF_FMT_E4M3;
            if (I->b_fmt == MF_FMT_E5M2FNUZ) I->b_fmt = MF_FMT_E5M2;
        }
        const mf_fmt a = I->a_fmt;
        if (a == MF_FMT_F64 || a == MF_FMT_F32) {
            I->kind = MF_MMA_FMA_CHAIN;
        } else if (a == MF_FMT_TF32) {
            I->kind = MF_MMA_AMD_GROUPED;
            I->group = 4;
        } else if (a == MF_FMT_E4M3FNUZ || a == MF_FMT_E5M2FNUZ || a == MF_FMT_E4M3 || a == MF_FMT_E5M2) {
            I->kind = MF_MMA_AMD_GROUPED;
            I->group = 16;
            I->interleave = true;
        } else if (!strcmp(arch, "CDNA3") || cdna4) {   /* CDNA4: CDNA3's arithmetic (docs/numerics.md) */
            I->kind = MF_MMA_AMD_GROUPED;
            I->group = I->k < 8 ? I->k : 8;
        } else {
            I->kind = MF_MMA_AMD_PAIRWISE;
            I->group = (a == MF_FMT_BF16 && !k1) ? 2 : 4;
            I->flush = !strcmp(arch, "CDNA2");
        }
        I->frac_bits = 24;
        return MF_OK;
    }
    return mf_fail(err, MF_EUNSUPPORTED, "%s: unknown instruction (mma.*, wgmma.*, tcgen05.mma.*, mfma_*)", name);
}

const char *mf_fmt_name(mf_fmt f) { return fmts[f].name; }

/* Flushes a subnormal input to +0 (CDNA2 inputs). */
static num flush_in(num x) {
    if (x.cls == CLS_FINITE && x.mant < ((uint64_t)1 << x.fb)) {
        num z = {CLS_ZERO, false, 0, -126, x.fb};
        return z;
    }
    return x;
}

static double fma_chain_value(num x) { return num_value(x); }

uint64_t mf_mma_dot(const mf_mma_instr *I, const uint64_t *a, const uint64_t *b, size_t b_stride, uint64_t c) {
    if (!I->scaled) return mf_mma_dot_scaled(I, a, b, b_stride, c, NULL, NULL, 0);
    uint64_t one[8];   /* at most k / 16 scales; 1.0 in either scale format */
    for (int q = 0; q < 8; q++) one[q] = I->s_fmt == MF_FMT_UE8M0 ? 127 : 0x38;
    return mf_mma_dot_scaled(I, a, b, b_stride, c, one, one, 1);
}

uint64_t mf_mma_dot_scaled(const mf_mma_instr *I, const uint64_t *a, const uint64_t *b, size_t b_stride, uint64_t c,
                           const uint64_t *sa, const uint64_t *sb, size_t sb_stride) {
    const int k = I->k;
    num pa[k], pb[k];
    for (int i = 0; i < k; i++) {
        pa[i] = decode(I->a_fmt, a[i]);
        pb[i] = decode(I->b_fmt, b[(size_t)i * b_stride]);
    }
    num cn = decode(I->c_fmt, c);
    const int nscale = I->scaled ? k / I->block : 1;
    num xa[nscale], xb[nscale];
    for (int q = 0; q < nscale; q++) {
        xa[q] = I->scaled ? decode(I->s_fmt, sa[q]) : (num){CLS_FINITE, false, 1, 0, 0};
        xb[q] = I->scaled ? decode(I->s_fmt, sb[(size_t)q * sb_stride]) : xa[q];
    }
    switch (I->kind) {
    case MF_MMA_NV_FUSED: {
        if (I->scaled) {   /* mxf8f6f4: one ue8m0 scale a row and a column; a NaN scale makes every product NaN */
            if (xa[0].cls == CLS_NAN || xb[0].cls == CLS_NAN) return 0x7fffffffu;
            return nv_fused(I, pa, pb, k, cn, xa[0].e + xb[0].e);
        }
        if (I->halves == 1) return nv_fused(I, pa, pb, k, cn, 0);
        uint64_t d = nv_fused(I, pa, pb, k / 2, cn, 0);
        return nv_fused(I, pa + k / 2, pb + k / 2, k - k / 2, decode(I->c_fmt, d), 0);
    }
    case MF_MMA_NV_BLOCK_SUM: return nv_block_sum(I, pa, pb, k, cn, xa, xb);
    case MF_MMA_AMD_GROUPED: {
        uint32_t acc = (uint32_t)c;
        for (int g = 0; g < k; g += I->group) {
            int n = k - g < I->group ? k - g : I->group;
            acc = amd_group(pa + g, pb + g, n, decode(MF_FMT_F32, acc), I->interleave);
        }
        return acc;
    }
    case MF_MMA_AMD_PAIRWISE: {
        float fa[k], fb[k];
        for (int i = 0; i < k; i++) {
            num x = I->flush ? flush_in(pa[i]) : pa[i], y = I->flush ? flush_in(pb[i]) : pb[i];
            fa[i] = (float)num_value(x);
            fb[i] = (float)num_value(y);
        }
        float acc = mf_bits_f32((uint32_t)c);
        if (I->flush) acc = flush32(acc, false);
        for (int g = 0; g < k; g += I->group) {
            int n = k - g < I->group ? k - g : I->group;
            acc = acc + pairwise(fa + g, fb + g, n, I->flush);
            if (I->flush) acc = flush32(acc, true);
        }
        return mf_f32_bits(acc);
    }
    case MF_MMA_FMA_CHAIN: {
        if (I->c_fmt == MF_FMT_F64) {
            double acc;
            memcpy(&acc, &c, 8);
            for (int i = 0; i < k; i++) acc = fma(fma_chain_value(pa[i]), fma_chain_value(pb[i]), acc);
            uint64_t u;
            memcpy(&u, &acc, 8);
            return u;
        }
        float acc = mf_bits_f32((uint32_t)c);
        for (int i = 0; i < k; i++) acc = fmaf((float)fma_chain_value(pa[i]), (float)fma_chain_value(pb[i]), acc);
        return mf_f32_bits(acc);
    }
    }
    return 0;
}

void mf_mma_tile(const mf_mma_instr *I, const uint64_t *A, const uint64_t *B, const uint64_t *C, uint64_t *D) {
    for (int i = 0; i < I->m; i++)
        for (int j = 0; j < I->n; j++)
            D[(size_t)i * I->n + j] = mf_mma_dot(I, A + (size_t)i * I->k, B + j, (size_t)I->n, C[(size_t)i * I->n + j]);
}

void mf_mma_tile_scaled(const mf_mma_instr *I, const uint64_t *A, const uint64_t *B, const uint64_t *C,
                        const uint64_t *SA, const uint64_t *SB, uint64_t *D) {
    if (I->scaled && (!SA || !SB)) {
        mf_mma_tile(I, A, B, C, D);
        return;
    }
    const size_t ns = I->scaled ? (size_t)(I->k / I->block) : 0;
    for (int i = 0; i < I->m; i++)
        for (int j = 0; j < I->n; j++)
            D[(size_t)i * I->n + j] = mf_mma_dot_scaled(I, A + (size_t)i * I->k, B + j, (size_t)I->n,
                                                        C[(size_t)i * I->n + j], SA ? SA + (size_t)i * ns : NULL,
                                                        SB ? SB + j : NULL, (size_t)I->n);
}
