/* Native CPU matrix products C[m, n] = A[m, k] . W^T with W read where it
 * lies: a weight in the mapped checkpoint (bf16, f16, f32 or f64, rows of k
 * values; or block-scaled FP8 / MXFP4 codes with their scales), or an
 * activation with any strides. Nothing is converted ahead of the product:
 * each worker copies a panel of NR columns of W by KC values of k into a
 * small buffer in the kernel's layout (widening bf16 and f16 is exact; a
 * block-scaled code becomes fp32(code x scale), rounded to the weights'
 * dtype, the value a dequantised copy would hold), runs every row of A
 * against it, and moves on. The panel is a few
 * dozen kilobytes, reused by all m rows, so its cost is 1/m of the product's.
 *
 * Every output is one fused multiply-add chain over k in ascending order,
 * starting from zero (MF_NUMERICS's definition of native): the portable,
 * AVX2, AVX-512 and AVX-512 BF16 kernels give the same bits, and splitting k
 * into blocks only stores and reloads the running fp32 (fp64) sum exactly.
 *
 * The AVX-512 BF16 kernel (vdpbf16ps) adds two bf16 products per lane and
 * instruction: the odd element's, rounded to fp32, then the even element's,
 * rounded again; the products are exact in fp32. With each pair stored
 * swapped (element k in the odd slot) that is the chain's two fma steps in
 * k order. The instruction treats subnormal inputs and results as zero, so
 * it runs only where none can occur: every nonzero operand of magnitude at
 * least 2^-55 (then every product, and every partial sum, is a multiple of
 * 2^-124, which is zero or normal) and none infinite or NaN; A must hold
 * bf16 values. Anything else takes the fp32 kernel, which gives the same
 * bits. A self-check against the scalar chain runs once before first use. */
#include "mf_numerics.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MF_HAVE_X86 1
#endif

/* ---- which kernel ---------------------------------------------------------- */

static const char *const path_names[] = {[MF_GEMM_PATH_AUTO] = "auto",     [MF_GEMM_PATH_PORTABLE] = "portable",
                                         [MF_GEMM_PATH_AVX2] = "avx2+fma", [MF_GEMM_PATH_AVX512] = "avx512",
                                         [MF_GEMM_PATH_AVX512BF16] = "avx512bf16"};

static bool dp_self_check(void);

static mf_gemm_path cpu_best(void) {
    static int cached = -1;
    if (cached < 0) {
        int best = MF_GEMM_PATH_PORTABLE;
#ifdef MF_HAVE_X86
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = MF_GEMM_PATH_AVX2;
        if (best == MF_GEMM_PATH_AVX2 && __builtin_cpu_supports("avx512f")) best = MF_GEMM_PATH_AVX512;
        if (best == MF_GEMM_PATH_AVX512 && __builtin_cpu_supports("avx512bf16") && dp_self_check())
            best = MF_GEMM_PATH_AVX512BF16;
#endif
        cached = best;
    }
    return (mf_gemm_path)cached;
}

static mf_gemm_path forced = MF_GEMM_PATH_AUTO;

static mf_gemm_path current_path(void) {
    static int env = -1;
    if (env < 0) {
        const char *v = getenv("MOEFLIP_GEMM_PATH");
        int p = MF_GEMM_PATH_AUTO;
        for (int i = MF_GEMM_PATH_PORTABLE; v && i <= MF_GEMM_PATH_AVX512BF16; i++)
            if (!strcmp(v, path_names[i]) || (i == MF_GEMM_PATH_AVX2 && !strcmp(v, "avx2"))) p = i;
        env = p;
    }
    const mf_gemm_path want = forced != MF_GEMM_PATH_AUTO ? forced : (mf_gemm_path)env, best = cpu_best();
    return want == MF_GEMM_PATH_AUTO || want > best ? best : want;
}

bool mf_gemm_force_path(mf_gemm_path p) {
    forced = p;
    return p <= cpu_best();
}

void mf_gemm_force_portable(bool on) { forced = on ? MF_GEMM_PATH_PORTABLE : MF_GEMM_PATH_AUTO; }

const char *mf_gemm_kernel_name(void) { return path_names[current_path()]; }

/* ---- matrices ---------------------------------------------------------------- */

mf_mat mf_mat_rows(const void *data, mf_dtype dtype, int n, int k) {
    return (mf_mat){.data = data, .dtype = dtype, .n = n, .k = k, .rs = (size_t)k, .cs = 1};
}

mf_mat mf_mat_fp8_block(const uint8_t *codes, int n, int k, const void *scales, mf_dtype sdt, int bn, int bk,
                        mf_dtype round) {
    mf_mat w = mf_mat_rows(codes, MF_F8E4M3, n, k);
    w.q = (mf_mat_scales){MF_WQ_FP8_BLOCK, scales, sdt, bn, bk, (size_t)((k + bk - 1) / bk), round};
    return w;
}

mf_mat mf_mat_mxfp4(const uint8_t *blocks, int n, int k, const uint8_t *scales, mf_dtype round) {
    mf_mat w = mf_mat_rows(blocks, MF_U8, n, k);
    w.q = (mf_mat_scales){MF_WQ_MXFP4, scales, MF_U8, 1, 32, (size_t)((k + 31) / 32), round};
    return w;
}

/* ---- block-scaled codes, widened --------------------------------------------- */

/* An e4m3fn byte's value as fp32 (exact): mf_f8e4m3_to_f64's, with its one quiet NaN for S.1111.111. */
static float e4m3_value(unsigned b) {
    if ((b & 0x7f) == 0x7f) return NAN;
    const uint32_t sign = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 15u, m = b & 7u;
    if (!e) {
        const float v = (float)m * 0x1p-9f;   /* subnormal: m/8 x 2^-6 */
        return sign ? -v : v;
    }
    return mf_bits_f32(sign | (e + 120) << 23 | m << 20);   /* (1 + m/8) 2^(e - 7) */
}

static float e4m3_lut[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;
static void e4m3_init(void) {
    for (unsigned b = 0; b < 256; b++) e4m3_lut[b] = e4m3_value(b);
}

/* OCP e2m1 (fp4): 1 sign, 2 exponent (bias 1), 1 mantissa bit; no Inf or NaN. */
static const float e2m1_f32[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Scale q element i as fp32: an FP8 scale_inv as stored (read as transformers reads it, then fp32); a UE8M0
 * byte as fp32(2^(b - 127)): 2^-127 (subnormal) for 0, +inf for 0xff. */
static inline float scale_at(const mf_mat_scales *q, size_t i) {
    if (q->kind == MF_WQ_FP8_BLOCK) return (float)mf_load_as_f64(q->data, q->dtype, i);
    const uint32_t b = ((const uint8_t *)q->data)[i];
    return mf_bits_f32(b ? b << 23 : 1u << 22);
}

/* The value rounded to the weights' dtype, as storing it into a tensor of that dtype and widening it does
 * (mf_roundf_to is mf_round_to on an fp32 value, NaN included: tests/test_dtype.c). */
__attribute__((always_inline)) static inline float round_w(mf_dtype r, float v) {
    if (r == MF_BF16) return mf_bf16_to_f32(mf_f32_to_bf16(v));
    return r == MF_F32 ? v : mf_roundf_to(r, v);
}

static inline float code_f32(const mf_mat *w, size_t i) {
    const uint8_t *c = w->data;
    if (w->q.kind == MF_WQ_FP8_BLOCK) return e4m3_value(c[i]);
    return e2m1_f32[i & 1 ? c[i >> 1] >> 4 : c[i >> 1] & 15u];
}

/* dst[t * ds] = W(j, k0 + t) for t < kc of a block-scaled w: one scale load per block of k. */
#define DEFINE_QROW(NAME, T)                                                                                           \
    static void NAME(const mf_mat *w, int j, int k0, int kc, T *dst, size_t ds) {                                      \
        const mf_mat_scales *q = &w->q;                                                                                \
        const size_t srow = (size_t)(j / q->bn) * q->rs, base = (size_t)j * w->rs, cs = w->cs;                        \
        const uint8_t *c = w->data;                                                                                    \
        const mf_dtype r = q->round;                                                                                   \
        if (q->kind == MF_WQ_FP8_BLOCK) pthread_once(&e4m3_once, e4m3_init);                                           \
        for (int t = 0; t < kc;) {                                                                                     \
            const int blk = (k0 + t) / q->bk;                                                                          \
            const int end = (blk + 1) * q->bk - k0 < kc ? (blk + 1) * q->bk - k0 : kc;                                 \
            const float s = scale_at(q, srow + (size_t)blk);                                                           \
            if (q->kind == MF_WQ_FP8_BLOCK) {                                                                          \
                const uint8_t *p = c + base + (size_t)k0 * cs;                                                         \
                for (; t < end; t++) dst[(size_t)t * ds] = round_w(r, e4m3_lut[p[(size_t)t * cs]] * s);               \
            } else {                                                                                                   \
                for (; t < end; t++) {                                                                                 \
                    const size_t i = base + (size_t)(k0 + t) * cs;                                                     \
                    dst[(size_t)t * ds] = round_w(r, e2m1_f32[i & 1 ? c[i >> 1] >> 4 : c[i >> 1] & 15u] * s);         \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }
DEFINE_QROW(q_row_f32, float)
DEFINE_QROW(q_row_f64, double)

void mf_mat_row_f32(const mf_mat *w, int j, int k0, int kc, float *dst) {
    if (w->q.kind != MF_WQ_NONE) {
        q_row_f32(w, j, k0, kc, dst, 1);
        return;
    }
    for (int t = 0; t < kc; t++) dst[t] = (float)mf_mat_get(w, j, k0 + t);
}

double mf_mat_get(const mf_mat *w, int j, int kk) {
    const size_t i = (size_t)j * w->rs + (size_t)kk * w->cs;
    if (w->q.kind == MF_WQ_NONE) return mf_load_as_f64(w->data, w->dtype, i);
    const mf_mat_scales *q = &w->q;
    return round_w(q->round, code_f32(w, i) * scale_at(q, (size_t)(j / q->bn) * q->rs + (size_t)(kk / q->bk)));
}

void mf_mat_row_bytes(const mf_mat *w, int j0, int rows, const void **codes, size_t *ncodes, const void **scales,
                      size_t *nscales) {
    const size_t first = (size_t)j0 * w->rs, count = (size_t)rows * w->rs;
    *scales = NULL;
    *nscales = 0;
    if (w->q.kind == MF_WQ_MXFP4) {   /* two values a byte, rows start at even elements */
        *codes = (const uint8_t *)w->data + first / 2;
        *ncodes = (count + 1) / 2;
    } else {
        *codes = (const uint8_t *)w->data + first * mf_dtype_size(w->dtype);
        *ncodes = count * mf_dtype_size(w->dtype);
    }
    if (w->q.kind == MF_WQ_NONE || rows <= 0) return;
    const mf_mat_scales *q = &w->q;
    const size_t r0 = (size_t)(j0 / q->bn), r1 = (size_t)((j0 + rows - 1) / q->bn), es = mf_dtype_size(q->dtype);
    *scales = (const uint8_t *)q->data + r0 * q->rs * es;
    *nscales = (r1 - r0 + 1) * q->rs * es;
}

/* ---- panels ------------------------------------------------------------------ */

/* The AVX-512 panel builders (defined below), used by the AVX-512 paths (vec). */
#ifdef MF_HAVE_X86
static bool pairs_block16(const uint16_t *w, size_t rs, int jb, int kc, int nr, uint32_t *dst, int *done_k);
static int f32_block16(const uint16_t *w, size_t rs, int jb, int kc, int nr, float *dst);
static int fp8_block16(const mf_mat *w, int j0, int jb, int k0, int kc, int nr, float *dst);
#endif

/* dst[kk * nr + jj] = W(j0 + jj, k0 + kk) for jj < nc, kk < kc; zero for jj >= nc. */
static void panel_f32(const mf_mat *w, int j0, int nc, int k0, int kc, int nr, float *dst, bool vec) {
    if (nc < nr)
        for (int kk = 0; kk < kc; kk++) memset(dst + (size_t)kk * nr + nc, 0, (size_t)(nr - nc) * sizeof(float));
    if (w->q.kind != MF_WQ_NONE) {   /* block-scaled codes, widened here */
        int jfull = 0, kdone = 0;   /* columns [0, jfull) x values [0, kdone) done 16 x 16 at a time */
#ifdef MF_HAVE_X86
        const mf_mat_scales *q = &w->q;
        if (vec && q->kind == MF_WQ_FP8_BLOCK && w->cs == 1 && q->bk % 16 == 0 && k0 % 16 == 0 &&
            (q->round == MF_F32 || q->round == MF_BF16) && nc >= 16)
            for (jfull = 0; jfull + 16 <= nc; jfull += 16) kdone = fp8_block16(w, j0, jfull, k0, kc, nr, dst);
#endif
        for (int jj = 0; jj < nc; jj++) {
            const int ks = jj < jfull ? kdone : 0;
            if (ks < kc) q_row_f32(w, j0 + jj, k0 + ks, kc - ks, dst + (size_t)ks * nr + jj, (size_t)nr);
        }
        return;
    }
    int jfull = 0, kdone = 0;   /* columns [0, jfull) x values [0, kdone) done by the vector builder */
#ifdef MF_HAVE_X86
    if (vec && w->dtype == MF_BF16 && w->cs == 1 && nc >= 16) {
        const uint16_t *base = (const uint16_t *)w->data + (size_t)j0 * w->rs + k0;
        for (jfull = 0; jfull + 16 <= nc; jfull += 16) kdone = f32_block16(base, w->rs, jfull, kc, nr, dst);
    }
#endif
    for (int jj = 0; jj < nc; jj++) {
        if (jj < jfull && kdone == kc) continue;
        const int kstart = jj < jfull ? kdone : 0;
        if (kstart) {   /* the tail of k this column still needs */
            const uint16_t *s = (const uint16_t *)w->data + (size_t)(j0 + jj) * w->rs + k0;
            for (int kk = kstart; kk < kc; kk++) dst[(size_t)kk * nr + jj] = mf_bf16_to_f32(s[kk]);
            continue;
        }
        const size_t base = (size_t)(j0 + jj) * w->rs + (size_t)k0 * w->cs, cs = w->cs;
        float *d = dst + jj;
        switch (w->dtype) {
        case MF_BF16: {
            const uint16_t *s = (const uint16_t *)w->data + base;
            for (int kk = 0; kk < kc; kk++) d[(size_t)kk * nr] = mf_bf16_to_f32(s[(size_t)kk * cs]);
            break;
        }
        case MF_F16: {
            const uint16_t *s = (const uint16_t *)w->data + base;
            for (int kk = 0; kk < kc; kk++) d[(size_t)kk * nr] = mf_f16_to_f32(s[(size_t)kk * cs]);
            break;
        }
        case MF_F32: {
            const float *s = (const float *)w->data + base;
            for (int kk = 0; kk < kc; kk++) d[(size_t)kk * nr] = s[(size_t)kk * cs];
            break;
        }
        default: {   /* F64 holding fp32 values (activations) */
            const double *s = (const double *)w->data + base;
            for (int kk = 0; kk < kc; kk++) d[(size_t)kk * nr] = (float)s[(size_t)kk * cs];
            break;
        }
        }
    }
}

static void panel_f64(const mf_mat *w, int j0, int nc, int k0, int kc, int nr, double *dst, bool vec) {
    (void)vec;
    if (nc < nr)
        for (int kk = 0; kk < kc; kk++) memset(dst + (size_t)kk * nr + nc, 0, (size_t)(nr - nc) * sizeof(double));
    if (w->q.kind != MF_WQ_NONE) {
        for (int jj = 0; jj < nc; jj++) q_row_f64(w, j0 + jj, k0, kc, dst + jj, (size_t)nr);
        return;
    }
    for (int jj = 0; jj < nc; jj++) {
        const size_t base = (size_t)(j0 + jj) * w->rs + (size_t)k0 * w->cs, cs = w->cs;
        double *d = dst + jj;
        switch (w->dtype) {
        case MF_BF16: {
            const uint16_t *s = (const uint16_t *)w->data + base;
            for (int kk = 0; kk < kc; kk++) d[(size_t)kk * nr] = mf_bf16_to_f32(s[(size_t)kk * cs]);
            break;
        }
        case MF_F16: {
            const uint16_t *s = (const uint16_t *)w->data + base;
            for (int kk = 0; kk < kc; kk++) d[(size_t)kk * nr] = mf_f16_to_f32(s[(size_t)kk * cs]);
            break;
        }
        case MF_F32: {
            const float *s = (const float *)w->data + base;
            for (int kk = 0; kk < kc; kk++) d[(size_t)kk * nr] = s[(size_t)kk * cs];
            break;
        }
        default: {
            const double *s = (const double *)w->data + base;
            for (int kk = 0; kk < kc; kk++) d[(size_t)kk * nr] = s[(size_t)kk * cs];
            break;
        }
        }
    }
}

/* Whether the bf16 bits b may enter vdpbf16ps: zero, or finite with a biased
 * exponent of at least 127 - 55. */
static inline bool dp_safe(uint16_t b) {
    const unsigned e = (b >> 7) & 0xffu;
    return (b & 0x7fffu) == 0 || (e >= 72 && e < 255);
}

/* The bf16 bits of v when v is a dp-safe bf16 value, else -1. */
static inline int32_t dp_bits_of(double v) {
    const float f = (float)v;
    const uint32_t u = mf_f32_bits(f);
    if ((double)f != v || (u & 0xffffu)) return -1;
    const uint16_t b = (uint16_t)(u >> 16);
    return dp_safe(b) ? b : -1;
}

/* The pair panel of vdpbf16ps: dst[(kk / 2) * nr + jj] = W(k0 + kk) << 16 |
 * W(k0 + kk + 1) of column j0 + jj (zeros past nc and past k). False when a
 * value is not a dp-safe bf16. */
static bool panel_pairs(const mf_mat *w, int j0, int nc, int k0, int kc, int kend, int nr, uint32_t *dst, bool vec) {
    /* block-scaled codes take the fp32 kernel (the same bits): their widening is panel_f32's */
    if (w->q.kind != MF_WQ_NONE) return false;
    const int pairs = (kc + 1) / 2;
    if (nc < nr)
        for (int p = 0; p < pairs; p++) memset(dst + (size_t)p * nr + nc, 0, (size_t)(nr - nc) * sizeof(uint32_t));
    int jfull = 0, kdone = 0;   /* columns [0, jfull) x values [0, kdone) done by the vector builder */
#ifdef MF_HAVE_X86
    if (vec && w->dtype == MF_BF16 && w->cs == 1 && nc >= 16) {
        const uint16_t *base = (const uint16_t *)w->data + (size_t)j0 * w->rs + k0;
        const int kv = kend - k0 < kc ? kend - k0 : kc;   /* values of k that exist */
        for (jfull = 0; jfull + 16 <= nc; jfull += 16)
            if (!pairs_block16(base, w->rs, jfull, kv, nr, dst, &kdone)) return false;
    }
#endif
    for (int jj = 0; jj < nc; jj++) {
        const size_t base = (size_t)(j0 + jj) * w->rs + (size_t)k0 * w->cs, cs = w->cs;
        uint32_t *d = dst + jj;
        const int pstart = jj < jfull ? kdone / 2 : 0;
        if (w->dtype == MF_BF16) {
            const uint16_t *s = (const uint16_t *)w->data + base;
            unsigned bad = 0;
            for (int p = pstart; p < pairs; p++) {
                const int kk = 2 * p;
                const uint16_t hi = s[(size_t)kk * cs], lo = k0 + kk + 1 < kend ? s[(size_t)(kk + 1) * cs] : 0;
                bad |= !dp_safe(hi) | !dp_safe(lo);
                d[(size_t)p * nr] = (uint32_t)hi << 16 | lo;
            }
            if (bad) return false;
            continue;
        }
        for (int p = pstart; p < pairs; p++) {
            const int kk = 2 * p;
            const int32_t hi = dp_bits_of(mf_load_as_f64(w->data, w->dtype, base + (size_t)kk * cs));
            const int32_t lo = k0 + kk + 1 < kend ? dp_bits_of(mf_load_as_f64(w->data, w->dtype, base + (size_t)(kk + 1) * cs)) : 0;
            if (hi < 0 || lo < 0) return false;
            d[(size_t)p * nr] = (uint32_t)hi << 16 | (uint32_t)lo;
        }
    }
    return true;
}

/* ---- vectorised panels of bf16 rows (the weights' usual form) ------------- */

#ifdef MF_HAVE_X86
/* r[16] rows of 16 dwords -> r[p] = {row 0 element p, ..., row 15 element p} */
__attribute__((target("avx512f"))) static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int g = 0; g < 4; g++) {   /* u[4g + c]: rows 4g..4g+3 at element 4 lane + c */
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
        const __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
        r[4 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
    }
}

/* The pair panel of 16-row by 32-value blocks of bf16 rows: what panel_pairs
 * computes, with the values' safety checked 32 at a time. Returns the number
 * of values of k done (a multiple of 32) through *done_k, false when a value
 * is not dp-safe. Columns jb .. jb + 15 of the panel. */
__attribute__((target("avx512f,avx512bw"))) static bool pairs_block16(const uint16_t *w, size_t rs, int jb, int kc,
                                                                      int nr, uint32_t *dst, int *done_k) {
    __mmask32 bad = 0;
    const __m512i mag = _mm512_set1_epi16(0x7fff), lo = _mm512_set1_epi16(72 << 7), hi = _mm512_set1_epi16(0x7f80);
    int kk = 0;
    for (; kk + 32 <= kc; kk += 32) {
        __m512i r[16];
        for (int j = 0; j < 16; j++) {
            const __m512i v = _mm512_loadu_si512(w + (size_t)(jb + j) * rs + kk);
            const __m512i a = _mm512_and_si512(v, mag);
            bad |= _mm512_test_epi16_mask(a, a) & (_mm512_cmplt_epu16_mask(a, lo) | _mm512_cmpge_epu16_mask(a, hi));
            r[j] = _mm512_rol_epi32(v, 16);   /* element k to the high half, k + 1 to the low */
        }
        transpose16(r);
        for (int p = 0; p < 16; p++) _mm512_storeu_si512(dst + (size_t)(kk / 2 + p) * nr + jb, r[p]);
    }
    *done_k = kk;
    return !bad;
}

/* 16 e4m3fn codes as fp32, e4m3_value's values bit for bit (its one quiet NaN, for either sign, included). */
__attribute__((target("avx512f"))) static inline __m512 e4m3x16(__m128i bytes) {
    const __m512i v = _mm512_cvtepu8_epi32(bytes), em = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
    const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(0x1p-9f));   /* exponent 0: m x 2^-9 */
    __m512i bits = _mm512_mask_mov_epi32(normal, _mm512_cmplt_epi32_mask(em, _mm512_set1_epi32(8)), _mm512_castps_si512(sub));
    bits = _mm512_or_si512(bits, sign);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(em, _mm512_set1_epi32(0x7f)), _mm512_set1_epi32(0x7fc00000));
    return _mm512_castsi512_ps(bits);
}

/* x rounded to bf16 (nearest even; NaN made quiet) and widened back: mf_f32_to_bf16's bits, 16 at a time. */
__attribute__((target("avx512f"))) static inline __m512i bf16_roundx16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x), hi = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), hi);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x400000)), hi));
}

/* The fp32 panel of 16-row by 16-value blocks of FP8 codes (rows j0 + jb ..), each 16 values inside one scale
 * block (bk a multiple of 16, k0 too): what q_row_f32 computes, weights rounded to fp32 or bf16. Returns the
 * values of k done. */
__attribute__((target("avx512f"))) static int fp8_block16(const mf_mat *w, int j0, int jb, int k0, int kc, int nr,
                                                          float *dst) {
    const mf_mat_scales *q = &w->q;
    const uint8_t *c = w->data;
    const bool bf = q->round == MF_BF16;
    float s[16];
    int have = -1;   /* the scale block s[] holds */
    int kk = 0;
    for (; kk + 16 <= kc; kk += 16) {
        const int blk = (k0 + kk) / q->bk;
        if (blk != have)
            for (int j = 0; j < 16; j++) s[j] = scale_at(q, (size_t)((j0 + jb + j) / q->bn) * q->rs + (size_t)blk);
        have = blk;
        __m512i r[16];
        for (int j = 0; j < 16; j++) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(c + (size_t)(j0 + jb + j) * w->rs + k0 + kk));
            const __m512 v = _mm512_mul_ps(e4m3x16(b), _mm512_set1_ps(s[j]));
            r[j] = bf ? bf16_roundx16(v) : _mm512_castps_si512(v);
        }
        transpose16(r);
        for (int t = 0; t < 16; t++) _mm512_storeu_si512(dst + (size_t)(kk + t) * nr + jb, r[t]);
    }
    return kk;
}

/* The fp32 panel of 16-row by 16-value blocks of bf16 rows (widened). */
__attribute__((target("avx512f"))) static int f32_block16(const uint16_t *w, size_t rs, int jb, int kc, int nr,
                                                          float *dst) {
    int kk = 0;
    for (; kk + 16 <= kc; kk += 16) {
        __m512i r[16];
        for (int j = 0; j < 16; j++)
            r[j] = _mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(w + (size_t)(jb + j) * rs + kk))),
                16);
        transpose16(r);
        for (int t = 0; t < 16; t++) _mm512_storeu_si512(dst + (size_t)(kk + t) * nr + jb, r[t]);
    }
    return kk;
}
#endif

/* ---- kernels: acc[mr][NR] += A[mr, kc] . panel, one fma chain per element --- */

#define MR_SMALL 6    /* portable and AVX2: 6 rows */
#define MR_WIDE 12    /* AVX-512: 12 rows */
#define NR_F32 16     /* portable, AVX2 */
#define NR_F32W 32    /* AVX-512 (two registers per row) */
#define NR_F64 8
#define NR_F64W 16

static void kf32_portable(int mr, int kc, const float *a, size_t lda, const float *b, float *acc) {
    for (int i = 0; i < mr; i++) {
        float *r = acc + i * NR_F32;
        const float *ai = a + (size_t)i * lda;
        for (int kk = 0; kk < kc; kk++) {
            const float *bk = b + (size_t)kk * NR_F32;
            for (int j = 0; j < NR_F32; j++) r[j] = fmaf(ai[kk], bk[j], r[j]);
        }
    }
}

static void kf64_portable(int mr, int kc, const double *a, size_t lda, const double *b, double *acc) {
    for (int i = 0; i < mr; i++) {
        double *r = acc + i * NR_F64;
        const double *ai = a + (size_t)i * lda;
        for (int kk = 0; kk < kc; kk++) {
            const double *bk = b + (size_t)kk * NR_F64;
            for (int j = 0; j < NR_F64; j++) r[j] = fma(ai[kk], bk[j], r[j]);
        }
    }
}

#ifdef MF_HAVE_X86
__attribute__((target("avx2,fma"))) static void kf32_avx2(int mr, int kc, const float *a, size_t lda, const float *b,
                                                          float *acc) {
    __m256 c[MR_SMALL][2];
    for (int i = 0; i < mr; i++) {
        c[i][0] = _mm256_loadu_ps(acc + i * 16);
        c[i][1] = _mm256_loadu_ps(acc + i * 16 + 8);
    }
    if (mr == MR_SMALL) {
        const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda, *a5 = a + 5 * lda;
        for (int kk = 0; kk < kc; kk++) {
            __m256 b0 = _mm256_loadu_ps(b + (size_t)kk * 16), b1 = _mm256_loadu_ps(b + (size_t)kk * 16 + 8), x;
            x = _mm256_broadcast_ss(a0 + kk); c[0][0] = _mm256_fmadd_ps(x, b0, c[0][0]); c[0][1] = _mm256_fmadd_ps(x, b1, c[0][1]);
            x = _mm256_broadcast_ss(a1 + kk); c[1][0] = _mm256_fmadd_ps(x, b0, c[1][0]); c[1][1] = _mm256_fmadd_ps(x, b1, c[1][1]);
            x = _mm256_broadcast_ss(a2 + kk); c[2][0] = _mm256_fmadd_ps(x, b0, c[2][0]); c[2][1] = _mm256_fmadd_ps(x, b1, c[2][1]);
            x = _mm256_broadcast_ss(a3 + kk); c[3][0] = _mm256_fmadd_ps(x, b0, c[3][0]); c[3][1] = _mm256_fmadd_ps(x, b1, c[3][1]);
            x = _mm256_broadcast_ss(a4 + kk); c[4][0] = _mm256_fmadd_ps(x, b0, c[4][0]); c[4][1] = _mm256_fmadd_ps(x, b1, c[4][1]);
            x = _mm256_broadcast_ss(a5 + kk); c[5][0] = _mm256_fmadd_ps(x, b0, c[5][0]); c[5][1] = _mm256_fmadd_ps(x, b1, c[5][1]);
        }
    } else {
        for (int kk = 0; kk < kc; kk++) {
            __m256 b0 = _mm256_loadu_ps(b + (size_t)kk * 16), b1 = _mm256_loadu_ps(b + (size_t)kk * 16 + 8);
            for (int i = 0; i < mr; i++) {
                __m256 x = _mm256_broadcast_ss(a + (size_t)i * lda + kk);
                c[i][0] = _mm256_fmadd_ps(x, b0, c[i][0]);
                c[i][1] = _mm256_fmadd_ps(x, b1, c[i][1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_ps(acc + i * 16, c[i][0]);
        _mm256_storeu_ps(acc + i * 16 + 8, c[i][1]);
    }
}

__attribute__((target("avx2,fma"))) static void kf64_avx2(int mr, int kc, const double *a, size_t lda,
                                                          const double *b, double *acc) {
    __m256d c[MR_SMALL][2];
    for (int i = 0; i < mr; i++) {
        c[i][0] = _mm256_loadu_pd(acc + i * 8);
        c[i][1] = _mm256_loadu_pd(acc + i * 8 + 4);
    }
    for (int kk = 0; kk < kc; kk++) {
        __m256d b0 = _mm256_loadu_pd(b + (size_t)kk * 8), b1 = _mm256_loadu_pd(b + (size_t)kk * 8 + 4);
        for (int i = 0; i < mr; i++) {
            __m256d x = _mm256_broadcast_sd(a + (size_t)i * lda + kk);
            c[i][0] = _mm256_fmadd_pd(x, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_pd(x, b1, c[i][1]);
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_pd(acc + i * 8, c[i][0]);
        _mm256_storeu_pd(acc + i * 8 + 4, c[i][1]);
    }
}

/* 12 rows x 32 columns: 24 accumulators, two panel loads and 12 broadcasts per k */
__attribute__((target("avx512f"))) static void kf32_avx512(int mr, int kc, const float *a, size_t lda, const float *b,
                                                           float *acc) {
    __m512 c[MR_WIDE][2];
    for (int i = 0; i < mr; i++) {
        c[i][0] = _mm512_loadu_ps(acc + i * 32);
        c[i][1] = _mm512_loadu_ps(acc + i * 32 + 16);
    }
    if (mr == MR_WIDE) {
        for (int kk = 0; kk < kc; kk++) {
            const __m512 b0 = _mm512_loadu_ps(b + (size_t)kk * 32), b1 = _mm512_loadu_ps(b + (size_t)kk * 32 + 16);
#pragma GCC unroll 12
            for (int i = 0; i < MR_WIDE; i++) {
                const __m512 x = _mm512_set1_ps(a[(size_t)i * lda + kk]);
                c[i][0] = _mm512_fmadd_ps(x, b0, c[i][0]);
                c[i][1] = _mm512_fmadd_ps(x, b1, c[i][1]);
            }
        }
    } else {
        for (int kk = 0; kk < kc; kk++) {
            const __m512 b0 = _mm512_loadu_ps(b + (size_t)kk * 32), b1 = _mm512_loadu_ps(b + (size_t)kk * 32 + 16);
            for (int i = 0; i < mr; i++) {
                const __m512 x = _mm512_set1_ps(a[(size_t)i * lda + kk]);
                c[i][0] = _mm512_fmadd_ps(x, b0, c[i][0]);
                c[i][1] = _mm512_fmadd_ps(x, b1, c[i][1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_ps(acc + i * 32, c[i][0]);
        _mm512_storeu_ps(acc + i * 32 + 16, c[i][1]);
    }
}

__attribute__((target("avx512f"))) static void kf64_avx512(int mr, int kc, const double *a, size_t lda,
                                                           const double *b, double *acc) {
    __m512d c[MR_WIDE][2];
    for (int i = 0; i < mr; i++) {
        c[i][0] = _mm512_loadu_pd(acc + i * 16);
        c[i][1] = _mm512_loadu_pd(acc + i * 16 + 8);
    }
    if (mr == MR_WIDE) {
        for (int kk = 0; kk < kc; kk++) {
            const __m512d b0 = _mm512_loadu_pd(b + (size_t)kk * 16), b1 = _mm512_loadu_pd(b + (size_t)kk * 16 + 8);
#pragma GCC unroll 12
            for (int i = 0; i < MR_WIDE; i++) {
                const __m512d x = _mm512_set1_pd(a[(size_t)i * lda + kk]);
                c[i][0] = _mm512_fmadd_pd(x, b0, c[i][0]);
                c[i][1] = _mm512_fmadd_pd(x, b1, c[i][1]);
            }
        }
    } else {
        for (int kk = 0; kk < kc; kk++) {
            const __m512d b0 = _mm512_loadu_pd(b + (size_t)kk * 16), b1 = _mm512_loadu_pd(b + (size_t)kk * 16 + 8);
            for (int i = 0; i < mr; i++) {
                const __m512d x = _mm512_set1_pd(a[(size_t)i * lda + kk]);
                c[i][0] = _mm512_fmadd_pd(x, b0, c[i][0]);
                c[i][1] = _mm512_fmadd_pd(x, b1, c[i][1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_pd(acc + i * 16, c[i][0]);
        _mm512_storeu_pd(acc + i * 16 + 8, c[i][1]);
    }
}

/* The pair kernel: a holds rows of swapped bf16 pairs (a 32-bit word per two
 * k), b the pair panel; kc2 pairs. */
__attribute__((target("avx512f,avx512bf16"))) static void kdp_avx512(int mr, int kc2, const uint32_t *a, size_t lda2,
                                                                     const uint32_t *b, float *acc) {
    __m512 c[MR_WIDE][2];
    for (int i = 0; i < mr; i++) {
        c[i][0] = _mm512_loadu_ps(acc + i * 32);
        c[i][1] = _mm512_loadu_ps(acc + i * 32 + 16);
    }
    if (mr == MR_WIDE) {
        for (int p = 0; p < kc2; p++) {
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * 32);
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * 32 + 16);
#pragma GCC unroll 12
            for (int i = 0; i < MR_WIDE; i++) {
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[(size_t)i * lda2 + p]);
                c[i][0] = _mm512_dpbf16_ps(c[i][0], x, b0);
                c[i][1] = _mm512_dpbf16_ps(c[i][1], x, b1);
            }
        }
    } else {
        for (int p = 0; p < kc2; p++) {
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * 32);
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * 32 + 16);
            for (int i = 0; i < mr; i++) {
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[(size_t)i * lda2 + p]);
                c[i][0] = _mm512_dpbf16_ps(c[i][0], x, b0);
                c[i][1] = _mm512_dpbf16_ps(c[i][1], x, b1);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_ps(acc + i * 32, c[i][0]);
        _mm512_storeu_ps(acc + i * 32 + 16, c[i][1]);
    }
}
#endif

#ifdef MF_HAVE_X86
/* The same two kernels reading and writing C itself (rows ldc apart, nc <= 32
 * columns, masked): the running sums start from C's values when `load`, from
 * zero otherwise, so no tile is copied through a buffer between k blocks. */
__attribute__((target("avx512f"))) static inline void cmasks(int nc, __mmask16 *m0, __mmask16 *m1) {
    *m0 = nc >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nc) - 1);
    *m1 = nc >= 32 ? (__mmask16)0xffff : nc > 16 ? (__mmask16)((1u << (nc - 16)) - 1) : (__mmask16)0;
}

/* The bodies with the row count a compile-time constant (a switch picks it), so every row count's loops
 * unroll into registers: experts of a short prompt have a few rows each. */
#define KDP_BODY(MR)                                                                                                   \
    do {                                                                                                               \
        __m512 c[MR][2];                                                                                               \
        for (int i = 0; i < MR; i++) {                                                                                 \
            c[i][0] = load ? _mm512_maskz_loadu_ps(m0, C + (size_t)i * ldc) : _mm512_setzero_ps();                     \
            c[i][1] = load ? _mm512_maskz_loadu_ps(m1, C + (size_t)i * ldc + 16) : _mm512_setzero_ps();                \
        }                                                                                                              \
        for (int p = 0; p < kc2; p++) {                                                                                \
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * 32);                                     \
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * 32 + 16);                                \
            _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++) {                                                    \
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[(size_t)i * lda2 + p]);                         \
                c[i][0] = _mm512_dpbf16_ps(c[i][0], x, b0);                                                            \
                c[i][1] = _mm512_dpbf16_ps(c[i][1], x, b1);                                                            \
            }                                                                                                          \
        }                                                                                                              \
        for (int i = 0; i < MR; i++) {                                                                                 \
            _mm512_mask_storeu_ps(C + (size_t)i * ldc, m0, c[i][0]);                                                   \
            _mm512_mask_storeu_ps(C + (size_t)i * ldc + 16, m1, c[i][1]);                                              \
        }                                                                                                              \
    } while (0)

#define KF32_BODY(MR)                                                                                                  \
    do {                                                                                                               \
        __m512 c[MR][2];                                                                                               \
        for (int i = 0; i < MR; i++) {                                                                                 \
            c[i][0] = load ? _mm512_maskz_loadu_ps(m0, C + (size_t)i * ldc) : _mm512_setzero_ps();                     \
            c[i][1] = load ? _mm512_maskz_loadu_ps(m1, C + (size_t)i * ldc + 16) : _mm512_setzero_ps();                \
        }                                                                                                              \
        for (int kk = 0; kk < kc; kk++) {                                                                              \
            const __m512 b0 = _mm512_loadu_ps(b + (size_t)kk * 32), b1 = _mm512_loadu_ps(b + (size_t)kk * 32 + 16);    \
            _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++) {                                                    \
                const __m512 x = _mm512_set1_ps(a[(size_t)i * lda + kk]);                                              \
                c[i][0] = _mm512_fmadd_ps(x, b0, c[i][0]);                                                             \
                c[i][1] = _mm512_fmadd_ps(x, b1, c[i][1]);                                                             \
            }                                                                                                          \
        }                                                                                                              \
        for (int i = 0; i < MR; i++) {                                                                                 \
            _mm512_mask_storeu_ps(C + (size_t)i * ldc, m0, c[i][0]);                                                   \
            _mm512_mask_storeu_ps(C + (size_t)i * ldc + 16, m1, c[i][1]);                                              \
        }                                                                                                              \
    } while (0)

#define BY_ROWS(BODY)                                                                                                  \
    switch (mr) {                                                                                                      \
    case 1: BODY(1); break;                                                                                            \
    case 2: BODY(2); break;                                                                                            \
    case 3: BODY(3); break;                                                                                            \
    case 4: BODY(4); break;                                                                                            \
    case 5: BODY(5); break;                                                                                            \
    case 6: BODY(6); break;                                                                                            \
    case 7: BODY(7); break;                                                                                            \
    case 8: BODY(8); break;                                                                                            \
    case 9: BODY(9); break;                                                                                            \
    case 10: BODY(10); break;                                                                                          \
    case 11: BODY(11); break;                                                                                          \
    default: BODY(12); break;                                                                                          \
    }

__attribute__((target("avx512f,avx512bf16"))) static void kdp_avx512_c(int mr, int kc2, const uint32_t *a, size_t lda2,
                                                                       const uint32_t *b, float *C, size_t ldc, int nc,
                                                                       bool load) {
    __mmask16 m0, m1;
    cmasks(nc, &m0, &m1);
    BY_ROWS(KDP_BODY)
}

__attribute__((target("avx512f"))) static void kf32_avx512_c(int mr, int kc, const float *a, size_t lda, const float *b,
                                                             float *C, size_t ldc, int nc, bool load) {
    __mmask16 m0, m1;
    cmasks(nc, &m0, &m1);
    BY_ROWS(KF32_BODY)
}

/* A's rows as swapped bf16 pairs, 32 values at a time; false when a value is not a dp-safe bf16 */
__attribute__((target("avx512f,avx512bw"))) static bool pack_row_avx512(int k, const float *src, uint32_t *d) {
    const __m512i lowbits = _mm512_set1_epi32(0xffff), mag = _mm512_set1_epi16(0x7fff);
    const __m512i lo = _mm512_set1_epi16(72 << 7), hi = _mm512_set1_epi16(0x7f80);
    /* the high halves of two vectors of 16 floats, in order: words 1, 3, ..., 31 of x then of y */
    const __m512i sel = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                         23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __mmask32 bad = 0;
    __mmask16 low = 0;
    int kk = 0;
    for (; kk + 32 <= k; kk += 32) {
        const __m512i x = _mm512_loadu_si512(src + kk), y = _mm512_loadu_si512(src + kk + 16);
        low |= _mm512_test_epi32_mask(x, lowbits) | _mm512_test_epi32_mask(y, lowbits);
        const __m512i h = _mm512_permutex2var_epi16(x, sel, y);   /* 32 bf16 values, k order */
        const __m512i a = _mm512_and_si512(h, mag);
        bad |= _mm512_test_epi16_mask(a, a) & (_mm512_cmplt_epu16_mask(a, lo) | _mm512_cmpge_epu16_mask(a, hi));
        _mm512_storeu_si512(d + kk / 2, _mm512_rol_epi32(h, 16));   /* element k to the high half */
    }
    if (bad || low) return false;
    for (; kk < k; kk += 2) {
        const uint32_t h1 = mf_f32_bits(src[kk]), l1 = kk + 1 < k ? mf_f32_bits(src[kk + 1]) : 0;
        if ((h1 | l1) & 0xffffu || !dp_safe((uint16_t)(h1 >> 16)) || !dp_safe((uint16_t)(l1 >> 16))) return false;
        d[kk / 2] = (h1 & 0xffff0000u) | l1 >> 16;
    }
    return true;
}
#endif

/* ---- the self-check of the pair kernel -------------------------------------- */

#ifdef MF_HAVE_X86
/* 96 dot products of 2..96 terms, wide exponent spreads, exact cancellations
 * and zeros: the pair kernel must give the scalar chain's bits on each. */
static bool dp_self_check(void) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    enum { K = 96 };
    uint32_t a[MR_WIDE * (K / 2)], b[(K / 2) * 32];
    float acc[MR_WIDE * 32], want[MR_WIDE * 32];
    uint16_t av[MR_WIDE][K], bv[32][K];
    for (int round = 0; round < 8; round++) {
        for (int i = 0; i < MR_WIDE; i++)
            for (int kk = 0; kk < K; kk++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                const unsigned e = 72 + (unsigned)(s % 140), m = (unsigned)(s >> 20) & 0x7f, sg = (unsigned)(s >> 40) & 1;
                av[i][kk] = (s >> 50) % 11 == 0 ? 0 : (uint16_t)(sg << 15 | e << 7 | m);
            }
        for (int j = 0; j < 32; j++)
            for (int kk = 0; kk < K; kk++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                const unsigned e = 100 + (unsigned)(s % 50), m = (unsigned)(s >> 20) & 0x7f, sg = (unsigned)(s >> 40) & 1;
                bv[j][kk] = (s >> 50) % 13 == 0 ? 0 : (uint16_t)(sg << 15 | e << 7 | m);
                if (j == 1 && kk % 2) bv[j][kk] = bv[j][kk - 1] ^ 0x8000u;   /* cancelling pairs */
            }
        for (int i = 0; i < MR_WIDE; i++)
            for (int p = 0; p < K / 2; p++) a[i * (K / 2) + p] = (uint32_t)av[i][2 * p] << 16 | av[i][2 * p + 1];
        for (int p = 0; p < K / 2; p++)
            for (int j = 0; j < 32; j++) b[p * 32 + j] = (uint32_t)bv[j][2 * p] << 16 | bv[j][2 * p + 1];
        const int kc = 2 + round * 12;
        for (int i = 0; i < MR_WIDE; i++)
            for (int j = 0; j < 32; j++) {
                float c = 0;
                for (int kk = 0; kk < kc; kk++) c = fmaf(mf_bf16_to_f32(av[i][kk]), mf_bf16_to_f32(bv[j][kk]), c);
                want[i * 32 + j] = c;
            }
        memset(acc, 0, sizeof acc);
        kdp_avx512(MR_WIDE, kc / 2, a, K / 2, b, acc);
        if (memcmp(acc, want, sizeof acc)) return false;
    }
    return true;
}
#else
static bool dp_self_check(void) { return false; }
#endif

/* ---- drivers ------------------------------------------------------------------ */

/* Below this many multiply-adds a product runs on one thread: starting a
 * parallel region costs more than it saves. */
#define PARALLEL_MIN_WORK (1 << 16)

/* k is cut into blocks of at most this many values when the rows of A for
 * one block would not stay in a core's cache */
#define A_BLOCK_BYTES (384u << 10)

static int k_block(int m, int k, size_t esz) {
    size_t kc = A_BLOCK_BYTES / ((size_t)(m > 0 ? m : 1) * esz);
    if (kc < 256) kc = 256;
    kc &= ~(size_t)15;   /* even, so pairs never straddle blocks */
    return (size_t)k <= kc ? k : (int)kc;
}

/* Work units: column groups of nr, each over row chunks (more than one when
 * there are too few groups to keep every thread busy). */
typedef struct plan {
    int groups, chunks, chunk_rows;
} plan;

static plan make_plan(int m, int n, int nr, int mr, int threads) {
    plan p;
    p.groups = (n + nr - 1) / nr;
    p.chunks = 1;
    if (threads > 1 && p.groups < 4 * threads) {
        int want = (4 * threads + p.groups - 1) / p.groups, max = (m + mr - 1) / mr;
        p.chunks = want < max ? want : max;
        if (p.chunks < 1) p.chunks = 1;
    }
    p.chunk_rows = ((m + p.chunks - 1) / p.chunks + mr - 1) / mr * mr;
    return p;
}

/* One column group over rows [r0, r1): panel by panel along k, each tile's
 * running sums in acc (from C after the first block). T is float or double. */
#define DEFINE_GROUP(NAME, T, PANEL)                                                                                   \
    static void NAME(const mf_mat *w, int j0, int nc, int r0, int r1, const T *a, size_t lda, T *c, size_t ldc,    \
                     mf_tri tri, int kc_max, int nr, int mr_max, T *panel,                                          \
                     void (*kern)(int, int, const T *, size_t, const T *, T *), bool vec) {                         \
        const int k = w->k;                                                                                         \
        T acc[MR_WIDE * 32];                                                                                        \
        for (int k0 = 0; k0 < k || k0 == 0; k0 += kc_max) {                                                         \
            const int kc = k - k0 < kc_max ? k - k0 : kc_max;                                                       \
            if (tri == MF_TRI_K && k0 > 0 && k0 >= r1) break;                                                       \
            if (kc > 0) PANEL(w, j0, nc, k0, kc, nr, panel, vec);                                                   \
            for (int i0 = r0; i0 < r1; i0 += mr_max) {                                                              \
                const int mr = r1 - i0 < mr_max ? r1 - i0 : mr_max;                                                 \
                if (tri == MF_TRI_COLS && j0 > i0 + mr - 1) continue;                                               \
                const int kend = tri == MF_TRI_K && i0 + mr < k ? i0 + mr : k;                                      \
                if (k0 > 0 && k0 >= kend) continue;                                                                 \
                const int kcc = kend - k0 < kc ? kend - k0 : kc;                                                    \
                for (int i = 0; i < mr; i++) {                                                                      \
                    T *ai = acc + (size_t)i * nr;                                                                   \
                    if (k0 == 0) memset(ai, 0, (size_t)nr * sizeof(T));                                             \
                    else {                                                                                          \
                        memcpy(ai, c + (size_t)(i0 + i) * ldc + j0, (size_t)nc * sizeof(T));                        \
                        memset(ai + nc, 0, (size_t)(nr - nc) * sizeof(T));                                          \
                    }                                                                                               \
                }                                                                                                   \
                if (kcc > 0) kern(mr, kcc, a + (size_t)i0 * lda + k0, lda, panel, acc);                             \
                for (int i = 0; i < mr; i++)                                                                        \
                    memcpy(c + (size_t)(i0 + i) * ldc + j0, acc + (size_t)i * nr, (size_t)nc * sizeof(T));          \
            }                                                                                                       \
            if (k == 0) break;                                                                                      \
        }                                                                                                           \
    }

DEFINE_GROUP(group_f32, float, panel_f32)
DEFINE_GROUP(group_f64, double, panel_f64)

/* The f32 group on the pair kernel, falling back to the fp32 kernel (the
 * same bits) for the rest of k from the first panel that holds a value the
 * pair kernel may not take. */
static void group_dp(const mf_mat *w, int j0, int nc, int r0, int r1, const float *a, size_t lda, const uint32_t *a2,
                     size_t lda2, float *c, size_t ldc, mf_tri tri, int kc_max, uint32_t *pp, float *pf) {
#ifdef MF_HAVE_X86
    const int k = w->k, nr = NR_F32W;
    bool pairs_ok = a2 != NULL;
    for (int k0 = 0; k0 < k || k0 == 0; k0 += kc_max) {
        const int kc = k - k0 < kc_max ? k - k0 : kc_max;
        if (tri == MF_TRI_K && k0 > 0 && k0 >= r1) break;
        if (pairs_ok) pairs_ok = panel_pairs(w, j0, nc, k0, kc, k, nr, pp, true);
        if (!pairs_ok && kc > 0) panel_f32(w, j0, nc, k0, kc, nr, pf, true);
        for (int i0 = r0; i0 < r1; i0 += MR_WIDE) {
            const int mr = r1 - i0 < MR_WIDE ? r1 - i0 : MR_WIDE;
            if (tri == MF_TRI_COLS && j0 > i0 + mr - 1) continue;
            const int kend = tri == MF_TRI_K && i0 + mr < k ? i0 + mr : k;
            if (k0 > 0 && k0 >= kend) continue;
            const int kcc = kend - k0 < kc ? kend - k0 : kc;
            float *ct = c + (size_t)i0 * ldc + j0;
            /* the pairs past kend hold zeros of A (TRI_K: A[i, kk] = 0 for kk > i) or of the padding: exact */
            if (pairs_ok) kdp_avx512_c(mr, (kcc + 1) / 2, a2 + (size_t)i0 * lda2 + k0 / 2, lda2, pp, ct, ldc, nc, k0 > 0);
            else kf32_avx512_c(mr, kcc, a + (size_t)i0 * lda + k0, lda, pf, ct, ldc, nc, k0 > 0);
        }
        if (k == 0) break;
    }
#else
    (void)w, (void)j0, (void)nc, (void)r0, (void)r1, (void)a, (void)lda, (void)a2, (void)lda2, (void)c, (void)ldc;
    (void)tri, (void)kc_max, (void)pp, (void)pf;
#endif
}

/* A as swapped bf16 pairs, when every value is a dp-safe bf16: false otherwise. */
static bool pack_a_pairs(int m, int k, const float *a, size_t lda, uint32_t *dst, size_t lda2, int threads) {
    unsigned bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) num_threads(threads) if (threads > 1 && (size_t)m * k >= 65536)
    for (int i = 0; i < m; i++) {
        const float *src = a + (size_t)i * lda;
#ifdef MF_HAVE_X86
        bad |= !pack_row_avx512(k, src, dst + (size_t)i * lda2);   /* the pair kernel's path: AVX-512 is there */
#else
        uint32_t *d = dst + (size_t)i * lda2;
        for (int kk = 0; kk < k; kk += 2) {
            const uint32_t hi = mf_f32_bits(src[kk]), lo = kk + 1 < k ? mf_f32_bits(src[kk + 1]) : 0;
            bad |= (hi | lo) & 0xffffu;
            bad |= !dp_safe((uint16_t)(hi >> 16)) | !dp_safe((uint16_t)(lo >> 16));
            d[kk / 2] = (hi & 0xffff0000u) | lo >> 16;
        }
#endif
    }
    return !bad;
}

void mf_gemm_f32(int m, const float *a, size_t lda, const mf_mat *w, float *c, size_t ldc, int threads, mf_tri tri) {
    const int n = w->n, k = w->k;
    if (m <= 0 || n <= 0) return;
    const mf_gemm_path path = current_path();
    const bool wide = path >= MF_GEMM_PATH_AVX512;
    const int nr = wide ? NR_F32W : NR_F32, mr = wide ? MR_WIDE : MR_SMALL;
    void (*kern)(int, int, const float *, size_t, const float *, float *) = kf32_portable;
#ifdef MF_HAVE_X86
    if (path == MF_GEMM_PATH_AVX2) kern = kf32_avx2;
    if (wide) kern = kf32_avx512;
#endif
    const double work = (double)m * n * k;
    const bool par = work >= PARALLEL_MIN_WORK && threads > 1;
    const int kc = k_block(m, k, sizeof(float));
    /* the pair kernel wants A as dp-safe bf16 values, pairs swapped */
    uint32_t *a2 = NULL;
    const size_t lda2 = (size_t)(k + 1) / 2;
    if (path == MF_GEMM_PATH_AVX512BF16 && k >= 2) {
        a2 = mf_xmalloc((size_t)m * lda2 * sizeof(uint32_t));
        if (!pack_a_pairs(m, k, a, lda, a2, lda2, par ? threads : 1)) {
            free(a2);
            a2 = NULL;
        }
    }
    const plan pl = make_plan(m, n, nr, mr, par ? threads : 1);
    const long units = (long)pl.groups * pl.chunks;
#pragma omp parallel num_threads(par ? threads : 1)
    {
        float *panel = mf_xmalloc((size_t)(kc > 0 ? kc : 1) * nr * sizeof(float));
        uint32_t *pp = a2 ? mf_xmalloc((size_t)((kc + 1) / 2 > 0 ? (kc + 1) / 2 : 1) * nr * sizeof(uint32_t)) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (long u = 0; u < units; u++) {
            const int g = (int)(u / pl.chunks), ch = (int)(u % pl.chunks);
            const int j0 = g * nr, nc = n - j0 < nr ? n - j0 : nr;
            const int r0 = ch * pl.chunk_rows, r1 = r0 + pl.chunk_rows < m ? r0 + pl.chunk_rows : m;
            if (r0 >= r1) continue;
            /* AVX-512: the kernels read and write C themselves (the pair kernel where A allows it) */
            if (wide) group_dp(w, j0, nc, r0, r1, a, lda, a2, lda2, c, ldc, tri, kc, pp, panel);
            else group_f32(w, j0, nc, r0, r1, a, lda, c, ldc, tri, kc, nr, mr, panel, kern, wide);
        }
        free(panel);
        free(pp);
    }
    free(a2);
}

void mf_gemm_f64(int m, const double *a, size_t lda, const mf_mat *w, double *c, size_t ldc, int threads, mf_tri tri) {
    const int n = w->n, k = w->k;
    if (m <= 0 || n <= 0) return;
    const mf_gemm_path path = current_path();
    const bool wide = path >= MF_GEMM_PATH_AVX512;
    const int nr = wide ? NR_F64W : NR_F64, mr = wide ? MR_WIDE : MR_SMALL;
    void (*kern)(int, int, const double *, size_t, const double *, double *) = kf64_portable;
#ifdef MF_HAVE_X86
    if (path == MF_GEMM_PATH_AVX2) kern = kf64_avx2;
    if (wide) kern = kf64_avx512;
#endif
    const double work = (double)m * n * k;
    const bool par = work >= PARALLEL_MIN_WORK && threads > 1;
    const int kc = k_block(m, k, sizeof(double));
    const plan pl = make_plan(m, n, nr, mr, par ? threads : 1);
    const long units = (long)pl.groups * pl.chunks;
#pragma omp parallel num_threads(par ? threads : 1)
    {
        double *panel = mf_xmalloc((size_t)(kc > 0 ? kc : 1) * nr * sizeof(double));
#pragma omp for schedule(dynamic, 1)
        for (long u = 0; u < units; u++) {
            const int g = (int)(u / pl.chunks), ch = (int)(u % pl.chunks);
            const int j0 = g * nr, nc = n - j0 < nr ? n - j0 : nr;
            const int r0 = ch * pl.chunk_rows, r1 = r0 + pl.chunk_rows < m ? r0 + pl.chunk_rows : m;
            if (r0 >= r1) continue;
            group_f64(w, j0, nc, r0, r1, a, lda, c, ldc, tri, kc, nr, mr, panel, kern, wide);
        }
        free(panel);
    }
}
