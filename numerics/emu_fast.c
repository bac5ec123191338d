/* Fast emulated GEMM for the common instruction families: NVIDIA fused
 * dot-add and AMD CDNA3 grouped dot with bf16 or f16 inputs and fp32
 * accumulation. Same arithmetic as mma.c, reorganised for speed:
 *  - operands are decoded once (value as double, exponent as int32);
 *  - output columns run side by side in double lanes: eight with AVX-512,
 *    four with AVX2, one at a time in the portable C (same bits from all
 *    three; mf_emu_force_path and MOEFLIP_EMU_PATH pick one for tests);
 *  - a product of two bf16/f16 values is exact in double, scaling by a power
 *    of two is exact, and truncation / floor are explicit roundings, so every
 *    intermediate equals the integer model's; sums of at most 2^40 stay exact.
 * Lanes that meet an infinite or NaN value (or overflow past 2^128) are
 * recomputed by the reference model in mma.c. */
#include "mf_numerics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define EMU_X86 1
#endif

#define LANES 4   /* AVX2 and portable panels */
#define LANES8 8  /* AVX-512 panels */
#define MAXL 8    /* the widest panel */
#define MAXP 4    /* the most column panels one row pass interleaves (AVX-512) */
#define NVP 3     /* column panels interleaved: independent chains hide each other's latency */

/* Exponent per MMA-Sim's convention: unbiased for normal values, the
 * format's minimum for subnormals, -126 for zeros. */
static int conv_exp(double v, int min_exp) {
    if (v == 0) return -126;
    uint64_t u;
    memcpy(&u, &v, 8);
    int e = (int)((u >> 52) & 0x7ff) - 1023;   /* v is a normal double: bf16/f16/fp32 values are */
    return e < min_exp ? min_exp : e;
}

typedef struct decoded {
    double *v;     /* values */
    int32_t *e;    /* exponents */
    bool finite;   /* every value finite */
} decoded;

static int fmt_min_exp(mf_fmt f) { return f == MF_FMT_F16 ? -14 : -126; }

static double fmt_value(mf_fmt f, uint64_t bits) {
    if (f == MF_FMT_BF16) return mf_bf16_to_f32((uint16_t)bits);
    return mf_f16_to_f32((uint16_t)bits);
}

bool mf_emu_fast_supported(const mf_kschedule *s) {
    const mf_mma_instr *I = &s->instr;
    bool in16 = (I->a_fmt == MF_FMT_BF16 || I->a_fmt == MF_FMT_F16) && I->b_fmt == I->a_fmt;
    if (!in16 || I->c_fmt != MF_FMT_F32) return false;
    if (I->kind == MF_MMA_NV_FUSED) return I->out_frac == 23;
    return I->kind == MF_MMA_AMD_GROUPED && !I->interleave;
}

/* One lane's chunk, scalar: the same double arithmetic as the vector code.
 * av/ae: A row values/exponents for the chunk; bv/be with stride. */
static inline double nv_chunk_scalar(int n, const double *av, const int32_t *ae, const double *bv, const int32_t *be,
                                     size_t bs, double c, int F) {
    float cf = (float)c;
    int ec = conv_exp(cf, -126);
    int E = ec;
    for (int i = 0; i < n; i++) {
        int e = ae[i] + be[i * bs];
        E = e > E ? e : E;
    }
    double sc = ldexp(1.0, F - E), S = trunc(c * sc);
    for (int i = 0; i < n; i++) S += trunc(av[i] * bv[i * bs] * sc);
    /* S * 2^(E - F) rounded toward zero to fp32 (subnormals at 2^-149) */
    if (S == 0) return 0.0;
    int es;
    frexp(S, &es);
    int ev = es - 1 + E - F;
    int q = (ev < -126 ? -126 : ev) - 23;
    double v = ldexp(trunc(ldexp(S, E - F - q)), q) + 0.0;   /* + 0.0: a sum truncated to zero is +0 */
    return v;   /* |v| >= 2^128 is caught by the caller */
}

static inline double amd_group_scalar(int n, const double *av, const int32_t *ae, const double *bv, const int32_t *be,
                                      size_t bs, double c) {
    int Ep = INT32_MIN;
    for (int i = 0; i < n; i++) {
        int e = ae[i] + be[i * bs];
        Ep = e > Ep ? e : Ep;
    }
    double sp = ldexp(1.0, 24 - Ep), S = 0;
    for (int i = 0; i < n; i++) S += trunc(av[i] * bv[i * bs] * sp);
    int ec = conv_exp((float)c, -126);
    int E = Ep > ec ? Ep : ec;
    double s31 = floor(ldexp(S, 7 + Ep - E));
    double c24 = floor(ldexp(c, 24 - E));
    return (double)(float)ldexp(s31 + c24 * 128.0, E - 31);   /* one RNE rounding */
}

#ifdef EMU_X86
__attribute__((target("avx2,fma"))) static inline __m256d pow2_pd(__m128i e) {
    /* 2^e for int32 e in the normal double range */
    __m256i x = _mm256_cvtepi32_epi64(_mm_add_epi32(e, _mm_set1_epi32(1023)));
    return _mm256_castsi256_pd(_mm256_slli_epi64(x, 52));
}

/* exponent field of doubles (unbiased), as int32 */
__attribute__((target("avx2,fma"))) static inline __m128i exp_pd(__m256d v) {
    __m256i b = _mm256_srli_epi64(_mm256_castpd_si256(v), 52);
    b = _mm256_and_si256(b, _mm256_set1_epi64x(0x7ff));
    /* pack the low 32 bits of the four 64-bit lanes */
    __m256i perm = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    return _mm_sub_epi32(_mm256_castsi256_si128(perm), _mm_set1_epi32(1023));
}

/* MMA-Sim exponent of fp32 values held in doubles: max(floor(log2|c|), -126), 0 -> -126 */
__attribute__((target("avx2,fma"))) static inline __m128i conv_exp_f32(__m256d c) {
    return _mm_max_epi32(exp_pd(c), _mm_set1_epi32(-126));
}


/* The accumulators of NVP column panels in from, and out to, the caller's
 * lanes, with the flags of lanes whose exponents came near fp32's end. */
__attribute__((target("avx2,fma"), always_inline)) static inline void panels_load(__m256d acc[NVP], __m128i big[NVP],
                                                                                  double *const *cp) {
    for (int p = 0; p < NVP; p++) {
        acc[p] = _mm256_loadu_pd(cp[p]);
        big[p] = _mm_setzero_si128();
    }
}

__attribute__((target("avx2,fma"), always_inline)) static inline void panels_store(const __m256d acc[NVP],
                                                                                   const __m128i big[NVP],
                                                                                   double *const *cp, int *const *up_) {
    for (int p = 0; p < NVP; p++) {
        _mm256_storeu_pd(cp[p], acc[p]);
        _mm_storeu_si128((__m128i *)up_[p], big[p]);
    }
}

/* max(E, ea[i] + eb[i]) over the n products of a chunk: the exponent the
 * instruction aligns them to (per lane of the column panel). */
__attribute__((target("avx2,fma"), always_inline)) static inline __m128i max_product_exp(__m128i E, int n,
                                                                                         const int32_t *ae,
                                                                                         const int32_t *be) {
    for (int i = 0; i < n; i++)
        E = _mm_max_epi32(E, _mm_add_epi32(_mm_set1_epi32(ae[i]), _mm_loadu_si128((const __m128i *)(be + (size_t)i * LANES))));
    return E;
}

__attribute__((target("avx2,fma"), always_inline)) static inline void nv_cols_body(int kc, int nchunks, int F,
                                                                                   const double *av, const int32_t *ae,
                                                                                   const double *const *bvp,
                                                                                   const int32_t *const *bep,
                                                                                   double *const *cp, int *const *up_) {
    __m256d acc[NVP];
    __m128i big[NVP];
    panels_load(acc, big, cp);
    const __m128i vF = _mm_set1_epi32(F);
    for (int t = 0; t < nchunks; t++) {
        const int k0 = t * kc;
        for (int p = 0; p < NVP; p++) {
            const double *bv = bvp[p];
            const int32_t *be = bep[p];
            const __m128i E = max_product_exp(conv_exp_f32(acc[p]), kc, ae + k0, be + (size_t)k0 * LANES);
            big[p] = _mm_or_si128(big[p], _mm_cmpgt_epi32(E, _mm_set1_epi32(125)));
            const __m256d sc = pow2_pd(_mm_sub_epi32(vF, E));
            /* the truncated terms are integers below 2^32: their sum is exact in
             * any order, so two partial sums shorten the dependency chain */
            __m256d S0 = _mm256_round_pd(_mm256_mul_pd(acc[p], sc), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m256d S1 = _mm256_setzero_pd();
            int i = 0;
#define TERM(j) _mm256_round_pd(_mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(av[k0 + i + j]), \
                                                            _mm256_loadu_pd(bv + (size_t)(k0 + i + j) * LANES)), sc), \
                                _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)
            for (; i + 2 <= kc; i += 2) {
                S0 = _mm256_add_pd(S0, TERM(0));
                S1 = _mm256_add_pd(S1, TERM(1));
            }
            for (; i < kc; i++) S0 = _mm256_add_pd(S0, TERM(0));
            __m256d S = _mm256_add_pd(S0, S1);
            /* RZ to fp32: value exponent ev = exp(S) + E - F; keep 23 fraction bits above max(ev, -126) */
            __m128i EF = _mm_sub_epi32(E, vF);
            __m128i q = _mm_sub_epi32(_mm_max_epi32(_mm_add_epi32(exp_pd(S), EF), _mm_set1_epi32(-126)), _mm_set1_epi32(23));
            /* S * 2^(E - F - q), truncated, times 2^q: both factors exact powers of two */
            __m256d r = _mm256_round_pd(_mm256_mul_pd(S, pow2_pd(_mm_sub_epi32(EF, q))), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            acc[p] = _mm256_add_pd(_mm256_mul_pd(r, pow2_pd(q)), _mm256_setzero_pd());   /* -0 -> +0 */
        }
    }
    panels_store(acc, big, cp, up_);
}

/* The chunk length is a compile-time constant in each instance, so the
 * compiler unrolls the loops over the products. */
__attribute__((target("avx2,fma"))) static void nv_cols_avx2(const mf_mma_instr *I, int steps, const double *av,
                                                             const int32_t *ae, const double *const *bv,
                                                             const int32_t *const *be, double *const *c,
                                                             int *const *unsafe) {
    const int kc = I->k / I->halves, n = steps * I->halves, F = I->frac_bits;
    switch (kc) {
    case 4: nv_cols_body(4, n, F, av, ae, bv, be, c, unsafe); break;
    case 8: nv_cols_body(8, n, F, av, ae, bv, be, c, unsafe); break;
    case 16: nv_cols_body(16, n, F, av, ae, bv, be, c, unsafe); break;
    default: nv_cols_body(kc, n, F, av, ae, bv, be, c, unsafe); break;
    }
}

/* Like the NVIDIA body: NVP column panels in one pass over K, their
 * accumulator chains independent, so one hides the other's latency. */
__attribute__((target("avx2,fma"), always_inline)) static inline void amd_cols_body(int g, int groups,
                                                                                    const double *av, const int32_t *ae,
                                                                                    const double *const *bvp,
                                                                                    const int32_t *const *bep,
                                                                                    double *const *cp, int *const *up_) {
    __m256d acc[NVP];
    __m128i big[NVP];
    panels_load(acc, big, cp);
    for (int t = 0; t < groups; t++) {
        const int k0 = t * g;
        for (int p = 0; p < NVP; p++) {
            const double *bv = bvp[p];
            const int32_t *be = bep[p];
            const __m128i Ep = max_product_exp(_mm_set1_epi32(INT32_MIN), g, ae + k0, be + (size_t)k0 * LANES);
            const __m256d sc = pow2_pd(_mm_sub_epi32(_mm_set1_epi32(24), Ep));
            __m256d S0 = _mm256_setzero_pd(), S1 = _mm256_setzero_pd();
            int i = 0;
            for (; i + 2 <= g; i += 2) {
                S0 = _mm256_add_pd(S0, TERM(0));
                S1 = _mm256_add_pd(S1, TERM(1));
            }
            for (; i < g; i++) S0 = _mm256_add_pd(S0, TERM(0));
            __m256d S = _mm256_add_pd(S0, S1);
            __m128i ec = conv_exp_f32(acc[p]);
            __m128i E = _mm_max_epi32(Ep, ec);
            big[p] = _mm_or_si128(big[p], _mm_cmpgt_epi32(E, _mm_set1_epi32(125)));
            __m256d s31 = _mm256_round_pd(_mm256_mul_pd(S, pow2_pd(_mm_sub_epi32(_mm_add_epi32(Ep, _mm_set1_epi32(7)), E))),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
            __m256d c24 = _mm256_round_pd(_mm256_mul_pd(acc[p], pow2_pd(_mm_sub_epi32(_mm_set1_epi32(24), E))),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
            __m256d tot = _mm256_add_pd(s31, _mm256_mul_pd(c24, _mm256_set1_pd(128.0)));
            __m256d v = _mm256_mul_pd(tot, pow2_pd(_mm_sub_epi32(E, _mm_set1_epi32(31))));
            acc[p] = _mm256_cvtps_pd(_mm256_cvtpd_ps(v));   /* RNE to fp32 (the default rounding mode) */
        }
    }
    panels_store(acc, big, cp, up_);
}

__attribute__((target("avx2,fma"))) static void amd_cols_avx2(const mf_mma_instr *I, int steps, const double *av,
                                                              const int32_t *ae, const double *const *bv,
                                                              const int32_t *const *be, double *const *c,
                                                              int *const *unsafe) {
    const int g = I->group, groups = steps * I->k / g;
    switch (g) {
    case 4: amd_cols_body(4, groups, av, ae, bv, be, c, unsafe); break;
    case 8: amd_cols_body(8, groups, av, ae, bv, be, c, unsafe); break;
    default: amd_cols_body(g, groups, av, ae, bv, be, c, unsafe); break;
    }
}

/* ---- AVX-512: eight double lanes per panel, MAXP panels interleaved ------ */

#define T512 __attribute__((target("avx512f,avx512vl,avx2,fma"), always_inline)) static inline

T512 __m512d pow2_512(__m256i e) {
    __m512i x = _mm512_cvtepi32_epi64(_mm256_add_epi32(e, _mm256_set1_epi32(1023)));
    return _mm512_castsi512_pd(_mm512_slli_epi64(x, 52));
}

T512 __m256i exp_512(__m512d v) {
    __m512i b = _mm512_and_si512(_mm512_srli_epi64(_mm512_castpd_si512(v), 52), _mm512_set1_epi64(0x7ff));
    return _mm256_sub_epi32(_mm512_cvtepi64_epi32(b), _mm256_set1_epi32(1023));
}

T512 __m256i conv_exp_f32_512(__m512d c) { return _mm256_max_epi32(exp_512(c), _mm256_set1_epi32(-126)); }

/* The largest product exponent of a chunk, two chains (max is exact in any
 * order); it does not depend on the accumulator, so it overlaps the previous
 * chunk's rounding. */
T512 __m256i max_product_exp8(int n, const int32_t *ae, const int32_t *be) {
    __m256i E0 = _mm256_set1_epi32(INT32_MIN), E1 = E0;
    int i = 0;
    for (; i + 2 <= n; i += 2) {
        E0 = _mm256_max_epi32(E0, _mm256_add_epi32(_mm256_set1_epi32(ae[i]), _mm256_loadu_si256((const __m256i *)(be + (size_t)i * LANES8))));
        E1 = _mm256_max_epi32(E1, _mm256_add_epi32(_mm256_set1_epi32(ae[i + 1]),
                                                   _mm256_loadu_si256((const __m256i *)(be + (size_t)(i + 1) * LANES8))));
    }
    for (; i < n; i++)
        E0 = _mm256_max_epi32(E0, _mm256_add_epi32(_mm256_set1_epi32(ae[i]), _mm256_loadu_si256((const __m256i *)(be + (size_t)i * LANES8))));
    return _mm256_max_epi32(E0, E1);
}

#define RZ (_MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)
#define RD (_MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
/* trunc(a_i * b_i * sc): the product is exact, the scaling by a power of two too */
#define TERM8(j) _mm512_roundscale_pd(_mm512_mul_pd(_mm512_mul_pd(_mm512_set1_pd(av[k0 + i + j]), \
                                                                  _mm512_loadu_pd(bv + (size_t)(k0 + i + j) * LANES8)), sc), RZ)

/* Sum of the n truncated terms of a chunk plus S0 (exact: integers below 2^40). */
T512 __m512d chunk_sum8(int n, int k0, __m512d S0, __m512d sc, const double *av, const double *bv) {
    __m512d S1 = _mm512_setzero_pd();
    int i = 0;
    for (; i + 2 <= n; i += 2) {
        S0 = _mm512_add_pd(S0, TERM8(0));
        S1 = _mm512_add_pd(S1, TERM8(1));
    }
    for (; i < n; i++) S0 = _mm512_add_pd(S0, TERM8(0));
    return _mm512_add_pd(S0, S1);
}

/* The accumulators of MAXP column panels in and out, as panels_load/panels_store for AVX2. */
T512 void panels_load512(__m512d acc[MAXP], __m256i big[MAXP], double *const *cp) {
    for (int p = 0; p < MAXP; p++) {
        acc[p] = _mm512_loadu_pd(cp[p]);
        big[p] = _mm256_setzero_si256();
    }
}

T512 void panels_store512(const __m512d acc[MAXP], const __m256i big[MAXP], double *const *cp, int *const *up_) {
    for (int p = 0; p < MAXP; p++) {
        _mm512_storeu_pd(cp[p], acc[p]);
        _mm256_storeu_si256((__m256i *)up_[p], big[p]);
    }
}

T512 void nv_cols_body512(int kc, int nchunks, int F, const double *av, const int32_t *ae, const double *const *bvp,
                          const int32_t *const *bep, double *const *cp, int *const *up_) {
    __m512d acc[MAXP];
    __m256i big[MAXP];
    panels_load512(acc, big, cp);
    const __m256i vF = _mm256_set1_epi32(F);
    for (int t = 0; t < nchunks; t++) {
        const int k0 = t * kc;
#pragma GCC unroll 4
        for (int p = 0; p < MAXP; p++) {
            const double *bv = bvp[p];
            const __m256i E = _mm256_max_epi32(max_product_exp8(kc, ae + k0, bep[p] + (size_t)k0 * LANES8), conv_exp_f32_512(acc[p]));
            big[p] = _mm256_or_si256(big[p], _mm256_cmpgt_epi32(E, _mm256_set1_epi32(125)));
            const __m512d sc = pow2_512(_mm256_sub_epi32(vF, E));
            __m512d S = chunk_sum8(kc, k0, _mm512_roundscale_pd(_mm512_mul_pd(acc[p], sc), RZ), sc, av, bv);
            /* RZ to fp32 as in the AVX2 body */
            __m256i EF = _mm256_sub_epi32(E, vF);
            __m256i q = _mm256_sub_epi32(_mm256_max_epi32(_mm256_add_epi32(exp_512(S), EF), _mm256_set1_epi32(-126)),
                                         _mm256_set1_epi32(23));
            __m512d r = _mm512_roundscale_pd(_mm512_mul_pd(S, pow2_512(_mm256_sub_epi32(EF, q))), RZ);
            acc[p] = _mm512_add_pd(_mm512_mul_pd(r, pow2_512(q)), _mm512_setzero_pd());   /* -0 -> +0 */
        }
    }
    panels_store512(acc, big, cp, up_);
}

__attribute__((target("avx512f,avx512vl,avx2,fma"))) static void nv_cols_avx512(const mf_mma_instr *I, int steps,
                                                                                const double *av, const int32_t *ae,
                                                                                const double *const *bv,
                                                                                const int32_t *const *be,
                                                                                double *const *c, int *const *unsafe) {
    const int kc = I->k / I->halves, n = steps * I->halves, F = I->frac_bits;
    switch (kc) {
    case 4: nv_cols_body512(4, n, F, av, ae, bv, be, c, unsafe); break;
    case 8: nv_cols_body512(8, n, F, av, ae, bv, be, c, unsafe); break;
    case 16: nv_cols_body512(16, n, F, av, ae, bv, be, c, unsafe); break;
    default: nv_cols_body512(kc, n, F, av, ae, bv, be, c, unsafe); break;
    }
}

T512 void amd_cols_body512(int g, int groups, const double *av, const int32_t *ae, const double *const *bvp,
                           const int32_t *const *bep, double *const *cp, int *const *up_) {
    __m512d acc[MAXP];
    __m256i big[MAXP];
    panels_load512(acc, big, cp);
    for (int t = 0; t < groups; t++) {
        const int k0 = t * g;
#pragma GCC unroll 4
        for (int p = 0; p < MAXP; p++) {
            const double *bv = bvp[p];
            const __m256i Ep = max_product_exp8(g, ae + k0, bep[p] + (size_t)k0 * LANES8);
            const __m512d sc = pow2_512(_mm256_sub_epi32(_mm256_set1_epi32(24), Ep));
            __m512d S = chunk_sum8(g, k0, _mm512_setzero_pd(), sc, av, bv);
            __m256i E = _mm256_max_epi32(Ep, conv_exp_f32_512(acc[p]));
            big[p] = _mm256_or_si256(big[p], _mm256_cmpgt_epi32(E, _mm256_set1_epi32(125)));
            __m512d s31 = _mm512_roundscale_pd(_mm512_mul_pd(S, pow2_512(_mm256_sub_epi32(_mm256_add_epi32(Ep, _mm256_set1_epi32(7)), E))), RD);
            __m512d c24 = _mm512_roundscale_pd(_mm512_mul_pd(acc[p], pow2_512(_mm256_sub_epi32(_mm256_set1_epi32(24), E))), RD);
            __m512d tot = _mm512_add_pd(s31, _mm512_mul_pd(c24, _mm512_set1_pd(128.0)));
            __m512d v = _mm512_mul_pd(tot, pow2_512(_mm256_sub_epi32(E, _mm256_set1_epi32(31))));
            acc[p] = _mm512_cvtps_pd(_mm512_cvtpd_ps(v));   /* RNE to fp32 */
        }
    }
    panels_store512(acc, big, cp, up_);
}

__attribute__((target("avx512f,avx512vl,avx2,fma"))) static void amd_cols_avx512(const mf_mma_instr *I, int steps,
                                                                                 const double *av, const int32_t *ae,
                                                                                 const double *const *bv,
                                                                                 const int32_t *const *be,
                                                                                 double *const *c, int *const *unsafe) {
    const int g = I->group, groups = steps * I->k / g;
    switch (g) {
    case 4: amd_cols_body512(4, groups, av, ae, bv, be, c, unsafe); break;
    case 8: amd_cols_body512(8, groups, av, ae, bv, be, c, unsafe); break;
    default: amd_cols_body512(g, groups, av, ae, bv, be, c, unsafe); break;
    }
}
#endif

/* ---- which kernel ---------------------------------------------------------- */

/* The widest kernel this CPU runs. */
static mf_emu_path cpu_best(void) {
    static int cached = -1;
    if (cached < 0) {
        int best = MF_EMU_PATH_PORTABLE;
#ifdef EMU_X86
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = MF_EMU_PATH_AVX2;
        if (best == MF_EMU_PATH_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"))
            best = MF_EMU_PATH_AVX512;
#endif
        cached = best;
    }
    return (mf_emu_path)cached;
}

static const char *const path_names[] = {[MF_EMU_PATH_AUTO] = "auto", [MF_EMU_PATH_PORTABLE] = "portable",
                                         [MF_EMU_PATH_AVX2] = "avx2", [MF_EMU_PATH_AVX512] = "avx512"};

static mf_emu_path forced_path = MF_EMU_PATH_AUTO;

/* The kernel to use: a forced one, else MOEFLIP_EMU_PATH's (read once), else
 * the widest; never one the CPU lacks. */
static mf_emu_path current_path(void) {
    static int env = -1;
    if (env < 0) {
        const char *v = getenv("MOEFLIP_EMU_PATH");
        int p = MF_EMU_PATH_AUTO;
        for (int i = MF_EMU_PATH_PORTABLE; v && i <= MF_EMU_PATH_AVX512; i++)
            if (!strcmp(v, path_names[i])) p = i;
        env = p;
    }
    mf_emu_path want = forced_path != MF_EMU_PATH_AUTO ? forced_path : (mf_emu_path)env;
    mf_emu_path best = cpu_best();
    return want == MF_EMU_PATH_AUTO || want > best ? best : want;
}

bool mf_emu_force_path(mf_emu_path p) {
    forced_path = p;
    return p <= cpu_best();
}

const char *mf_emu_path_name(void) { return path_names[current_path()]; }

void mf_emu_force_portable(bool on) { forced_path = on ? MF_EMU_PATH_PORTABLE : MF_EMU_PATH_AUTO; }

static void cols_portable(const mf_mma_instr *I, int steps, int lanes, const double *av, const int32_t *ae,
                          const double *bv, const int32_t *be, double *c, int *unsafe) {
    for (int l = 0; l < lanes; l++) {
        double acc = c[l];
        unsafe[l] = 0;
        for (int kk = 0; kk < steps * I->k; kk++) unsafe[l] |= ae[kk] + be[(size_t)kk * lanes + l] > 125;
        if (I->kind == MF_MMA_NV_FUSED) {
            const int kc = I->k / I->halves;
            for (int t = 0; t < steps * I->halves; t++)
            {
                acc = nv_chunk_scalar(kc, av + t * kc, ae + t * kc, bv + (size_t)t * kc * lanes + l,
                                      be + (size_t)t * kc * lanes + l, (size_t)lanes, acc, I->frac_bits);
                unsafe[l] |= !(fabs(acc) < 0x1p126);
            }
        } else {
            const int g = I->group;
            for (int t = 0; t < steps * I->k / g; t++)
            {
                acc = amd_group_scalar(g, av + t * g, ae + t * g, bv + (size_t)t * g * lanes + l,
                                       be + (size_t)t * g * lanes + l, (size_t)lanes, acc);
                unsafe[l] |= !(fabs(acc) < 0x1p126);
            }
        }
        c[l] = acc;
    }
}

/* Plain chain (acc = 1, split = 1) of the instruction over K for a block of
 * rows; returns false for lanes it could not do exactly (the caller redoes
 * them with the reference model). */
typedef struct fast_ctx {
    const mf_mma_instr *I;
    mf_emu_path path;
    int lanes, group;      /* columns per panel; panels per row pass */
    int M, N, K, steps, Kp, panels;
    size_t pstride;        /* elements from one B panel to the next */
    const uint64_t *A, *B, *C0;
    uint64_t *C;
    double *av, *bv;       /* decoded A [M][Kp]; B in panels [panels][Kp][lanes] */
    int32_t *ae, *be;
    bool *a_finite;        /* per row of A */
    bool b_finite;
} fast_ctx;

/* The reference model for one output element (non-finite operands, results
 * near or past the fp32 range). */
static uint64_t reference_element(const fast_ctx *x, int i, int j) {
    const int k = x->I->k;
    uint64_t *a = calloc((size_t)x->Kp, 8), *b = calloc((size_t)x->Kp, 8);
    memcpy(a, x->A + (size_t)i * x->K, (size_t)x->K * 8);
    for (int kk = 0; kk < x->K; kk++) b[kk] = x->B[(size_t)kk * x->N + j];
    uint64_t acc = x->C0 ? x->C0[(size_t)i * x->N + j] : 0;
    for (int t = 0; t < x->steps; t++) acc = mf_mma_dot(x->I, a + (size_t)t * k, b + (size_t)t * k, 1, acc);
    free(a);
    free(b);
    return acc;
}

/* Row i against column panels p0 .. p0 + x->group - 1. */
static void run_group(const fast_ctx *x, int i, int p0) {
    const mf_mma_instr *I = x->I;
    const int W = x->lanes, G = x->group;
    const int np = x->panels - p0 < G ? x->panels - p0 : G;
    double cs[MAXP][MAXL] = {{0}};
    int unsafe[MAXP][MAXL] = {{0}};
    const double *pbv[MAXP];
    const int32_t *pbe[MAXP];
    double *pc[MAXP];
    int *pu[MAXP];
    for (int pp = 0; pp < G; pp++) {
        int q = pp < np ? pp : np - 1;   /* a short group repeats its last panel into scratch lanes */
        pbv[pp] = x->bv + (size_t)(p0 + q) * x->pstride;
        pbe[pp] = x->be + (size_t)(p0 + q) * x->pstride;
        pc[pp] = cs[pp];
        pu[pp] = unsafe[pp];
        for (int l = 0; l < W; l++) {
            int j = (p0 + q) * W + l;
            uint32_t cb = x->C0 && j < x->N ? (uint32_t)x->C0[(size_t)i * x->N + j] : 0;
            float cf;
            memcpy(&cf, &cb, 4);
            cs[pp][l] = isfinite(cf) ? cf : 0.0;
            if (!isfinite(cf)) unsafe[pp][l] = 1;
        }
    }
    const double *av = x->av + (size_t)i * x->Kp;
    const int32_t *ae = x->ae + (size_t)i * x->Kp;
    int flags[MAXP][MAXL];
    memcpy(flags, unsafe, sizeof flags);
    const bool nv = I->kind == MF_MMA_NV_FUSED;
    switch (x->path) {
#ifdef EMU_X86
    case MF_EMU_PATH_AVX512:
        if (nv) nv_cols_avx512(I, x->steps, av, ae, pbv, pbe, pc, pu);
        else amd_cols_avx512(I, x->steps, av, ae, pbv, pbe, pc, pu);
        break;
    case MF_EMU_PATH_AVX2:
        if (nv) nv_cols_avx2(I, x->steps, av, ae, pbv, pbe, pc, pu);
        else amd_cols_avx2(I, x->steps, av, ae, pbv, pbe, pc, pu);
        break;
#endif
    default:
        (void)nv;
        for (int pp = 0; pp < np; pp++) cols_portable(I, x->steps, W, av, ae, pbv[pp], pbe[pp], pc[pp], pu[pp]);
    }
    for (int pp = 0; pp < np; pp++)
        for (int l = 0; l < W; l++) {
            const int j = (p0 + pp) * W + l;
            if (j >= x->N) continue;
            const double v = cs[pp][l];
            if (flags[pp][l] || unsafe[pp][l] || !x->a_finite[i] || !x->b_finite || !(fabs(v) < 0x1p128)) {
                x->C[(size_t)i * x->N + j] = reference_element(x, i, j);
                continue;
            }
            float f = (float)v;   /* exact: v is an fp32 value */
            uint32_t u;
            memcpy(&u, &f, 4);
            x->C[(size_t)i * x->N + j] = u;
        }
}

/* Decodes row kk of B (zeros past K and past N) into every column panel's
 * row kk of x->bv/x->be; reading B row by row keeps its reads sequential. W
 * is a constant in each use. Returns whether every value was finite. */
static inline __attribute__((always_inline)) bool decode_row(fast_ctx *x, int kk, const int W, int min_e, int zero_e) {
    const mf_mma_instr *I = x->I;
    const uint64_t *row = x->B + (size_t)kk * x->N;
    bool finite = true;
    for (int pj = 0; pj < x->panels; pj++) {
        double *bv = x->bv + (size_t)pj * x->pstride + (size_t)kk * W;
        int32_t *be = x->be + (size_t)pj * x->pstride + (size_t)kk * W;
        for (int l = 0; l < W; l++) {
            const int j = pj * W + l;
            const double v = kk < x->K && j < x->N ? fmt_value(I->b_fmt, row[j]) : 0.0;
            finite = finite && isfinite(v);
            bv[l] = isfinite(v) ? v : 0.0;
            be[l] = v == 0 ? zero_e : isfinite(v) ? conv_exp(v, min_e) : -126;
        }
    }
    return finite;
}

/* Memory on a cache-line boundary: a 64-byte AVX-512 load that straddles
 * two lines costs about twice as much. */
static void *alloc64(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p) abort();
    return p;
}

/* B decoded for the fast path once (values, exponents, in column panels), so that products with the same B
 * (a weight matrix, decode step after decode step) skip its decoding. The panels' layout depends on the
 * kernel path, which the pack records. */
struct mf_emu_bpack {
    mf_emu_path path;
    int N, K, lanes, group, steps, Kp, panels;
    size_t pstride;
    const uint64_t *B;   /* the operand bits, for the elements the reference model redoes */
    uint64_t *B_owned;   /* B itself when the pack keeps a copy */
    double *bv;
    int32_t *be;
    bool b_finite;
};

static mf_emu_bpack *pack_b(const mf_kschedule *s, int N, int K, const uint64_t *B, bool copy, int threads) {
    const mf_mma_instr *I = &s->instr;
    mf_emu_bpack *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->N = N;
    p->K = K;
    p->path = current_path();
    p->lanes = p->path == MF_EMU_PATH_AVX512 ? LANES8 : LANES;
    p->group = p->path == MF_EMU_PATH_AVX512 ? MAXP : NVP;
    const int W = p->lanes;
    p->steps = (K + I->k - 1) / I->k;
    p->Kp = p->steps * I->k;
    p->panels = (N + W - 1) / W;
    if (copy) {
        p->B_owned = malloc((size_t)K * N * sizeof(uint64_t) + 1);
        if (!p->B_owned) abort();
        memcpy(p->B_owned, B, (size_t)K * N * sizeof(uint64_t));
        B = p->B_owned;
    }
    p->B = B;
    const int min_e = fmt_min_exp(I->a_fmt), Kp = p->Kp;
    /* a zero's exponent: -126 (MMA-Sim), or far below anything when zero
     * products are left out of the largest exponent (the H200) */
    const int zero_e = I->kind == MF_MMA_NV_FUSED && I->zero_products_excluded ? -1000000 : -126;
    /* panels one cache line (of exponents; two of values) further apart than
     * their length: the interleaved panels' loads do not fall on the same
     * cache sets (a power-of-two stride costs the AVX2 kernel 7%) */
    p->pstride = (size_t)Kp * W + 16;
    p->bv = alloc64((size_t)p->panels * p->pstride * sizeof(double));
    p->be = alloc64((size_t)p->panels * p->pstride * sizeof(int32_t));
    fast_ctx x = {.I = I, .N = N, .K = K, .B = B, .lanes = W, .Kp = Kp, .panels = p->panels, .pstride = p->pstride,
                  .bv = p->bv, .be = p->be};
    bool b_finite = true;
#pragma omp parallel for num_threads(threads) reduction(&& : b_finite) if (threads > 1 && (size_t)K * N > 16384)
    for (int kk = 0; kk < Kp; kk++)
        b_finite = (W == LANES8 ? decode_row(&x, kk, LANES8, min_e, zero_e) : decode_row(&x, kk, LANES, min_e, zero_e)) && b_finite;
    p->b_finite = b_finite;
    return p;
}

mf_emu_bpack *mf_emu_pack_b(const mf_kschedule *s, int N, int K, const uint64_t *B, int threads) {
    return pack_b(s, N, K, B, true, threads);
}

size_t mf_emu_bpack_bytes(const mf_emu_bpack *p) {
    return (size_t)p->panels * p->pstride * (sizeof(double) + sizeof(int32_t)) +
           (p->B_owned ? (size_t)p->K * p->N * sizeof(uint64_t) : 0) + sizeof *p;
}

bool mf_emu_bpack_current(const mf_emu_bpack *p) { return p->path == current_path(); }

void mf_emu_bpack_free(mf_emu_bpack *p) {
    if (!p) return;
    free(p->bv);
    free(p->be);
    free(p->B_owned);
    free(p);
}

void mf_emu_gemm_packed(const mf_kschedule *s, int M, const uint64_t *A, const mf_emu_bpack *p, const uint64_t *C0,
                        uint64_t *C, int threads) {
    const mf_mma_instr *I = &s->instr;
    const int N = p->N, K = p->K, Kp = p->Kp;
    fast_ctx x = {.I = I, .path = p->path, .lanes = p->lanes, .group = p->group, .M = M, .N = N, .K = K,
                  .steps = p->steps, .Kp = Kp, .panels = p->panels, .pstride = p->pstride, .A = A, .B = p->B,
                  .C0 = C0, .C = C, .bv = p->bv, .be = p->be, .b_finite = p->b_finite};
    const int min_e = fmt_min_exp(I->a_fmt);
    const int zero_e = I->kind == MF_MMA_NV_FUSED && I->zero_products_excluded ? -1000000 : -126;
    x.av = alloc64((size_t)M * Kp * sizeof(double));
    x.ae = alloc64((size_t)M * Kp * sizeof(int32_t));
    x.a_finite = malloc((size_t)M * sizeof(bool) + 1);
#pragma omp parallel for num_threads(threads) if (threads > 1 && (size_t)M * Kp > 16384)
    for (int i = 0; i < M; i++) {
        x.a_finite[i] = true;
        for (int kk = 0; kk < Kp; kk++) {
            double v = kk < K ? fmt_value(I->a_fmt, A[(size_t)i * K + kk]) : 0.0;
            x.a_finite[i] &= isfinite(v);
            x.av[(size_t)i * Kp + kk] = isfinite(v) ? v : 0.0;
            x.ae[(size_t)i * Kp + kk] = v == 0 ? zero_e : isfinite(v) ? conv_exp(v, min_e) : -126;
        }
    }
    /* panel groups outermost: a group of B panels stays in cache while every row of A passes */
    const int groups = (x.panels + x.group - 1) / x.group;
    const long tiles = (long)groups * M;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && (double)M * N * K > 65536)
    for (long t = 0; t < tiles; t++) run_group(&x, (int)(t % M), (int)(t / M) * x.group);
    free(x.av);
    free(x.ae);
    free(x.a_finite);
}

void mf_emu_gemm_fast(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B,
                      const uint64_t *C0, uint64_t *C, int threads) {
    mf_emu_bpack *p = pack_b(s, N, K, B, false, threads);
    mf_emu_gemm_packed(s, M, A, p, C0, C, threads);
    mf_emu_bpack_free(p);
}
