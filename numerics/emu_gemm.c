/* Emulated GEMM: C[M, N] = A[M, K] . B[K, N] + C0 computed as a chain of one
 * matrix instruction over K, under a declared K-schedule:
 *  - split: K is cut into `split` contiguous ranges (split-K), each its own
 *           chain: K is counted in tiles of `tile` elements (default: the
 *           instruction's k), each range takes ceil(tiles / split) of them
 *           and the last range the rest (cuBLAS's split-K layout on the H200);
 *  - acc:   within a range, k-steps go round-robin to `acc` independent
 *           accumulators (the first starts from C0 in range 0, the others from 0);
 *  - reduce: accumulators, then ranges, are combined with fp32 additions in
 *           order (MF_REDUCE_SEQ) or as a pairwise tree (MF_REDUCE_TREE).
 * K is padded with zeros to a multiple of the instruction's k. */
#include "mf_numerics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float reduce(const float *v, int n, mf_reduce how) {
    if (n == 1) return v[0];
    if (how == MF_REDUCE_TREE) {
        int h = n / 2;
        return reduce(v, h, how) + reduce(v + h, n - h, how);
    }
    float s = v[0];
    for (int i = 1; i < n; i++) s += v[i];
    return s;
}

int mf_kschedule_check(const mf_kschedule *s, int K, mf_error *err) {
    (void)K;
    if (s->acc < 1 || s->split < 1) return mf_fail(err, MF_EINVAL, "schedule: acc and split must be at least 1");
    if (s->tile && s->tile % s->instr.k)
        return mf_fail(err, MF_EINVAL, "schedule: tile %d is not a multiple of %s's k", s->tile, s->instr.name);
    if (s->instr.c_fmt != MF_FMT_F32) return mf_fail(err, MF_EUNSUPPORTED, "schedule: %s does not accumulate in fp32", s->instr.name);
    return MF_OK;
}

/* The k-steps [*first, *end) of range r: ranges of ceil(tiles / split) tiles. */
static void range_steps(const mf_kschedule *s, int steps, int r, int *first, int *end) {
    const int per_tile = s->tile ? s->tile / s->instr.k : 1;
    const int tiles = (steps + per_tile - 1) / per_tile;
    const int each = (tiles + s->split - 1) / s->split;
    int t0 = r * each, t1 = (r + 1) * each;
    if (t0 > tiles) t0 = tiles;
    if (t1 > tiles) t1 = tiles;
    *first = t0 * per_tile < steps ? t0 * per_tile : steps;
    *end = t1 * per_tile < steps ? t1 * per_tile : steps;
}

void mf_emu_gemm_reference(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B,
                           const uint64_t *C0, uint64_t *C, int threads) {
    const mf_mma_instr *I = &s->instr;
    const int k = I->k, steps = (K + k - 1) / k, nacc = s->acc;
    const int Kp = steps * k;
    (void)threads;
#pragma omp parallel num_threads(threads) if (threads > 1 && (double)M * N * K > 65536)
    {
        uint64_t *a = calloc((size_t)Kp, 8), *b = calloc((size_t)Kp, 8);
        float *accs = malloc(sizeof(float) * (size_t)nacc), *ranges = malloc(sizeof(float) * (size_t)s->split);
#pragma omp for schedule(static)
        for (int i = 0; i < M; i++) {
            memcpy(a, A + (size_t)i * K, (size_t)K * 8);
            for (int j = 0; j < N; j++) {
                for (int kk = 0; kk < K; kk++) b[kk] = B[(size_t)kk * N + j];
                uint64_t c0 = C0 ? C0[(size_t)i * N + j] : 0;
                for (int r = 0; r < s->split; r++) {
                    uint64_t acc[nacc];
                    for (int q = 0; q < nacc; q++) acc[q] = (r == 0 && q == 0) ? c0 : 0;
                    int first, end;
                    range_steps(s, steps, r, &first, &end);
                    for (int t = 0; t < end - first; t++) {
                        int step = first + t;
                        uint64_t *dst = &acc[t % nacc];
                        *dst = mf_mma_dot(I, a + (size_t)step * k, b + (size_t)step * k, 1, *dst);
                    }
                    for (int q = 0; q < nacc; q++) accs[q] = mf_bits_f32((uint32_t)acc[q]);
                    ranges[r] = reduce(accs, nacc, s->reduce);
                }
                C[(size_t)i * N + j] = mf_f32_bits(reduce(ranges, s->split, s->reduce));
            }
        }
        free(a);
        free(b);
        free(accs);
        free(ranges);
    }
}

int mf_emu_gemm_scaled(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B,
                       const uint64_t *SA, const uint64_t *SB, const uint64_t *C0, uint64_t *C, int threads, mf_error *err) {
    const mf_mma_instr *I = &s->instr;
    if (!I->scaled) {
        mf_emu_gemm(s, M, N, K, A, B, C0, C, threads);
        return MF_OK;
    }
    if (K < 0 || K % I->k)
        return mf_fail(err, MF_EINVAL, "%s: K = %d is not a multiple of the instruction's k (%d): a block-scaled "
                       "product is not padded", I->name, K, I->k);
    const int k = I->k, steps = K / k, nacc = s->acc, per = k / I->block;   /* scales per step */
    const size_t ns = (size_t)(K / I->block);
    (void)threads;
#pragma omp parallel num_threads(threads) if (threads > 1 && (double)M * N * K > 65536)
    {
        uint64_t *b = malloc(sizeof(uint64_t) * (size_t)(K > 0 ? K : 1)), *sb = malloc(sizeof(uint64_t) * (ns ? ns : 1));
        float *accs = malloc(sizeof(float) * (size_t)nacc), *ranges = malloc(sizeof(float) * (size_t)s->split);
#pragma omp for schedule(static)
        for (int i = 0; i < M; i++) {
            const uint64_t *a = A + (size_t)i * K, *sa = SA + (size_t)i * ns;
            for (int j = 0; j < N; j++) {
                for (int kk = 0; kk < K; kk++) b[kk] = B[(size_t)kk * N + j];
                for (size_t q = 0; q < ns; q++) sb[q] = SB[q * N + j];
                uint64_t c0 = C0 ? C0[(size_t)i * N + j] : 0;
                for (int r = 0; r < s->split; r++) {
                    uint64_t acc[nacc];
                    for (int q = 0; q < nacc; q++) acc[q] = (r == 0 && q == 0) ? c0 : 0;
                    int first, end;
                    range_steps(s, steps, r, &first, &end);
                    for (int t = 0; t < end - first; t++) {
                        const int step = first + t;
                        uint64_t *dst = &acc[t % nacc];
                        *dst = mf_mma_dot_scaled(I, a + (size_t)step * k, b + (size_t)step * k, 1, *dst,
                                                 sa + (size_t)step * per, sb + (size_t)step * per, 1);
                    }
                    for (int q = 0; q < nacc; q++) accs[q] = mf_bits_f32((uint32_t)acc[q]);
                    ranges[r] = reduce(accs, nacc, s->reduce);
                }
                C[(size_t)i * N + j] = mf_f32_bits(reduce(ranges, s->split, s->reduce));
            }
        }
        free(b);
        free(sb);
        free(accs);
        free(ranges);
    }
    return MF_OK;
}

/* CDNA1/CDNA2 f16/bf16 (pairwise fp32 trees, CDNA2 flushing subnormals): plain
 * fp32 arithmetic, so a loop over the columns that the compiler vectorises.
 * Same operations in the same order as mma.c's pairwise(); a plain chain.
 *
 * One row of C: acc[N] += the pairwise group sums of a_i[k] b[k][:], group after
 * group. Built for AVX-512, AVX2 and the baseline (the loader picks at run time):
 * plain fp32 multiplies, adds and compares, never contracted (-ffp-contract=off),
 * give the same bits in every build. flush_sel: CDNA2's flushing of a subnormal
 * result to zero of its sign, as a select the compiler vectorises. */
static inline float flush_sel(float x) {
    /* |x| < 2^-126 (a subnormal or zero): keep only the sign bit, as x * 0.0f would; on the bits, so
     * that the AVX2 and baseline builds vectorise too (a float select stopped them) */
    uint32_t u;
    memcpy(&u, &x, 4);
    u &= (u & 0x7fffffffu) < 0x00800000u ? 0x80000000u : 0xffffffffu;
    memcpy(&x, &u, 4);
    return x;
}

#define PAIRWISE_ROW(F)                                                                                       \
    for (int k0 = 0; k0 < K; k0 += g) {                                                                       \
        const float *restrict b0 = b + (size_t)k0 * N, *restrict b1 = b0 + N;                                 \
        const float x0 = ai[k0], x1 = ai[k0 + 1];                                                             \
        if (g == 2) {                                                                                         \
            for (int j = 0; j < N; j++) acc[j] = F(acc[j] + F(F(x0 * b0[j]) + F(x1 * b1[j])));                \
        } else {                                                                                              \
            const float *restrict b2 = b1 + N, *restrict b3 = b2 + N;                                         \
            const float x2 = ai[k0 + 2], x3 = ai[k0 + 3];                                                     \
            for (int j = 0; j < N; j++)                                                                       \
                acc[j] = F(acc[j] + F(F(F(x0 * b0[j]) + F(x1 * b1[j])) + F(F(x2 * b2[j]) + F(x3 * b3[j])))); \
        }                                                                                                     \
    }
#define KEEP(x) (x)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void pairwise_row(float *restrict acc, const float *restrict ai, const float *restrict b, int N, int K, int g,
                         bool fl) {
    if (fl) {
        PAIRWISE_ROW(flush_sel)
    } else {
        PAIRWISE_ROW(KEEP)
    }
}
#undef PAIRWISE_ROW
#undef KEEP

static bool pairwise_fast(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B,
                          const uint64_t *C0, uint64_t *C, int threads) {
    const mf_mma_instr *I = &s->instr;
    if (I->kind != MF_MMA_AMD_PAIRWISE || s->acc != 1 || s->split != 1 || (I->group != 2 && I->group != 4) ||
        I->a_fmt != I->b_fmt || K % I->k)
        return false;
    const bool fl = I->flush, bf = I->a_fmt == MF_FMT_BF16;
    const float min_in = bf ? 0x1p-126f : 0x1p-14f;
    float *a = mf_xmalloc(sizeof(float) * (size_t)M * K), *b = mf_xmalloc(sizeof(float) * (size_t)K * N);
    bool finite = true;
    for (size_t i = 0; i < (size_t)M * K; i++) {
        float v = bf ? mf_bf16_to_f32((uint16_t)A[i]) : mf_f16_to_f32((uint16_t)A[i]);
        finite &= isfinite(v);
        a[i] = fl && fabsf(v) < min_in ? 0.0f : v;   /* inputs flush to +0 */
    }
    for (size_t i = 0; i < (size_t)K * N; i++) {
        float v = bf ? mf_bf16_to_f32((uint16_t)B[i]) : mf_f16_to_f32((uint16_t)B[i]);
        finite &= isfinite(v);
        b[i] = fl && fabsf(v) < min_in ? 0.0f : v;
    }
    if (!finite) {   /* NaN and Inf: the reference model */
        free(a);
        free(b);
        return false;
    }
    const int g = I->group;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && (double)M * N * K > 65536)
    for (int i = 0; i < M; i++) {
        float *acc = mf_xmalloc(sizeof(float) * (size_t)N);
        for (int j = 0; j < N; j++) {
            float c = C0 ? mf_bits_f32((uint32_t)C0[(size_t)i * N + j]) : 0.0f;
            acc[j] = fl && fabsf(c) < 0x1p-126f ? 0.0f : c;
        }
        pairwise_row(acc, a + (size_t)i * K, b, N, K, g, fl);
        for (int j = 0; j < N; j++) C[(size_t)i * N + j] = mf_f32_bits(acc[j]);
        free(acc);
    }
    free(a);
    free(b);
    return true;
}

/* With the fast path: each (range, accumulator) chain is a plain chain over
 * its own k-steps, gathered into contiguous operands, then reduced. */
bool mf_emu_packable(const mf_kschedule *s, int K) {
    return mf_emu_fast_supported(s) && s->split == 1 && s->acc == 1 && K % s->instr.k == 0;
}

void mf_emu_gemm(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B, const uint64_t *C0,
                 uint64_t *C, int threads) {
    if (!mf_emu_fast_supported(s)) {
        if (!pairwise_fast(s, M, N, K, A, B, C0, C, threads)) mf_emu_gemm_reference(s, M, N, K, A, B, C0, C, threads);
        return;
    }
    const int k = s->instr.k, steps = (K + k - 1) / k, nacc = s->acc;
    if (s->split == 1 && nacc == 1 && K % k == 0) {
        mf_emu_gemm_fast(s, M, N, K, A, B, C0, C, threads);
        return;
    }
    int longest = 0;
    for (int r = 0; r < s->split; r++) {
        int first, end;
        range_steps(s, steps, r, &first, &end);
        if (end - first > longest) longest = end - first;
    }
    const int nchains = s->split * nacc, maxsteps = (longest + nacc - 1) / nacc;
    uint64_t *part = malloc(sizeof(uint64_t) * (size_t)nchains * M * N);
    uint64_t *a = malloc(sizeof(uint64_t) * (size_t)M * maxsteps * k), *b = malloc(sizeof(uint64_t) * (size_t)maxsteps * k * N);
    for (int r = 0; r < s->split; r++)
        for (int q = 0; q < nacc; q++) {
            int n = 0;
            memset(a, 0, sizeof(uint64_t) * (size_t)M * maxsteps * k);
            memset(b, 0, sizeof(uint64_t) * (size_t)maxsteps * k * N);
            int first, end;
            range_steps(s, steps, r, &first, &end);
            for (int t = q; t < end - first; t += nacc, n++) {
                int step = first + t;
                for (int i = 0; i < M; i++)
                    for (int kk = 0; kk < k; kk++) {
                        int src = step * k + kk;
                        a[(size_t)i * maxsteps * k + (size_t)n * k + kk] = src < K ? A[(size_t)i * K + src] : 0;
                    }
                for (int kk = 0; kk < k; kk++) {
                    int src = step * k + kk;
                    if (src < K) memcpy(b + ((size_t)n * k + kk) * N, B + (size_t)src * N, sizeof(uint64_t) * (size_t)N);
                }
            }
            uint64_t *dst = part + (size_t)(r * nacc + q) * M * N;
            if (n == 0) {
                for (size_t i = 0; i < (size_t)M * N; i++) dst[i] = (r == 0 && q == 0 && C0) ? C0[i] : 0;
                continue;
            }
            mf_emu_gemm_fast(s, M, N, maxsteps * k, a, b, (r == 0 && q == 0) ? C0 : NULL, dst, threads);
        }
    float *vals = malloc(sizeof(float) * (size_t)nacc), *ranges = malloc(sizeof(float) * (size_t)s->split);
    for (size_t e = 0; e < (size_t)M * N; e++) {
        for (int r = 0; r < s->split; r++) {
            for (int q = 0; q < nacc; q++) vals[q] = mf_bits_f32((uint32_t)part[(size_t)(r * nacc + q) * M * N + e]);
            ranges[r] = reduce(vals, nacc, s->reduce);
        }
        C[e] = mf_f32_bits(reduce(ranges, s->split, s->reduce));
    }
    free(vals);
    free(ranges);
    free(part);
    free(a);
    free(b);
}
