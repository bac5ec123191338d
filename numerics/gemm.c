/* Native CPU matrix products: packed panels, register-blocked kernels,
 * OpenMP over output tiles. One fma chain per output element, k ascending. */
#include "mf_numerics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MF_HAVE_X86 1
#endif

#define MR 6   /* rows of A per kernel call */

static bool force_portable;

void mf_gemm_force_portable(bool on) { force_portable = on; }

static bool cpu_has_avx2_fma(void) {
#ifdef MF_HAVE_X86
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached && !force_portable;
#else
    return false;
#endif
}

const char *mf_gemm_kernel_name(void) { return cpu_has_avx2_fma() ? "avx2+fma" : "portable"; }

static int nr_of(mf_dtype t) { return t == MF_F64 ? MF_NR_F64 : MF_NR_F32; }

void mf_pack(mf_packed *p, mf_dtype type, mf_dtype round, int n, int k, const void *src, mf_dtype src_type,
             size_t row_stride, size_t col_stride) {
    int nr = nr_of(type);
    int panels = (n + nr - 1) / nr;
    size_t count = (size_t)panels * (size_t)k * (size_t)nr;
    size_t esz = mf_dtype_size(type);
    p->n = n;
    p->k = k;
    p->type = type;
    p->data = mf_xcalloc(count ? count : 1, esz);
    for (int pi = 0; pi < panels; pi++) {
        for (int jj = 0; jj < nr; jj++) {
            int j = pi * nr + jj;
            if (j >= n) break;
            if (src_type == MF_F64 && type == MF_F32 && round == MF_F64) {   /* activations: the hot case */
                const double *sd = (const double *)src + (size_t)j * row_stride;
                float *dst = (float *)p->data + (size_t)pi * (size_t)k * (size_t)nr + (size_t)jj;
                for (int kk = 0; kk < k; kk++) dst[(size_t)kk * nr] = (float)sd[(size_t)kk * col_stride];
                continue;
            }
            for (int kk = 0; kk < k; kk++) {
                double v = mf_round_to(round, mf_load_as_f64(src, src_type, (size_t)j * row_stride + (size_t)kk * col_stride));
                size_t at = ((size_t)pi * (size_t)k + (size_t)kk) * (size_t)nr + (size_t)jj;
                if (type == MF_F64) ((double *)p->data)[at] = v;
                else ((float *)p->data)[at] = (float)v;
            }
        }
    }
}

void mf_pack_free(mf_packed *p) {
    free(p->data);
    p->data = NULL;
}

size_t mf_packed_bytes(const mf_packed *p) {
    int nr = nr_of(p->type);
    return (size_t)((p->n + nr - 1) / nr) * (size_t)p->k * (size_t)nr * mf_dtype_size(p->type);
}

double mf_packed_get(const mf_packed *p, int j, int kk) {
    int nr = nr_of(p->type);
    size_t at = ((size_t)(j / nr) * (size_t)p->k + (size_t)kk) * (size_t)nr + (size_t)(j % nr);
    return p->type == MF_F64 ? ((double *)p->data)[at] : ((float *)p->data)[at];
}

/* ---- kernels: acc[MR][NR] over one panel, rows a[0..mr) ------------------ */

static void kernel_f32_portable(int mr, int k, const float *a, size_t lda, const float *b, float *acc) {
    for (int i = 0; i < mr; i++) {
        float r[MF_NR_F32] = {0};
        const float *ai = a + (size_t)i * lda;
        for (int kk = 0; kk < k; kk++) {
            const float *bk = b + (size_t)kk * MF_NR_F32;
            for (int j = 0; j < MF_NR_F32; j++) r[j] = fmaf(ai[kk], bk[j], r[j]);
        }
        memcpy(acc + i * MF_NR_F32, r, sizeof r);
    }
}

static void kernel_f64_portable(int mr, int k, const double *a, size_t lda, const double *b, double *acc) {
    for (int i = 0; i < mr; i++) {
        double r[MF_NR_F64] = {0};
        const double *ai = a + (size_t)i * lda;
        for (int kk = 0; kk < k; kk++) {
            const double *bk = b + (size_t)kk * MF_NR_F64;
            for (int j = 0; j < MF_NR_F64; j++) r[j] = fma(ai[kk], bk[j], r[j]);
        }
        memcpy(acc + i * MF_NR_F64, r, sizeof r);
    }
}

#ifdef MF_HAVE_X86
__attribute__((target("avx2,fma")))
static void kernel_f32_avx2(int mr, int k, const float *a, size_t lda, const float *b, float *acc) {
    __m256 c[MR][2];
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm256_setzero_ps();
    if (mr == MR) {
        const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda,
                    *a5 = a + 5 * lda;
        for (int kk = 0; kk < k; kk++) {
            __m256 b0 = _mm256_loadu_ps(b + (size_t)kk * 16), b1 = _mm256_loadu_ps(b + (size_t)kk * 16 + 8);
            __m256 x;
            x = _mm256_broadcast_ss(a0 + kk); c[0][0] = _mm256_fmadd_ps(x, b0, c[0][0]); c[0][1] = _mm256_fmadd_ps(x, b1, c[0][1]);
            x = _mm256_broadcast_ss(a1 + kk); c[1][0] = _mm256_fmadd_ps(x, b0, c[1][0]); c[1][1] = _mm256_fmadd_ps(x, b1, c[1][1]);
            x = _mm256_broadcast_ss(a2 + kk); c[2][0] = _mm256_fmadd_ps(x, b0, c[2][0]); c[2][1] = _mm256_fmadd_ps(x, b1, c[2][1]);
            x = _mm256_broadcast_ss(a3 + kk); c[3][0] = _mm256_fmadd_ps(x, b0, c[3][0]); c[3][1] = _mm256_fmadd_ps(x, b1, c[3][1]);
            x = _mm256_broadcast_ss(a4 + kk); c[4][0] = _mm256_fmadd_ps(x, b0, c[4][0]); c[4][1] = _mm256_fmadd_ps(x, b1, c[4][1]);
            x = _mm256_broadcast_ss(a5 + kk); c[5][0] = _mm256_fmadd_ps(x, b0, c[5][0]); c[5][1] = _mm256_fmadd_ps(x, b1, c[5][1]);
        }
    } else {
        for (int kk = 0; kk < k; kk++) {
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

__attribute__((target("avx2,fma")))
static void kernel_f64_avx2(int mr, int k, const double *a, size_t lda, const double *b, double *acc) {
    __m256d c[MR][2];
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm256_setzero_pd();
    for (int kk = 0; kk < k; kk++) {
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
#endif

/* Below this many multiply-adds a product runs on one thread: starting a
 * parallel region costs more than it saves. */
#define PARALLEL_MIN_WORK (1 << 16)

/* The driver of both precisions: tiles of MR rows by one packed panel, each computed into a local accumulator by
 * the AVX2 kernel where the CPU has it (else the portable one) and copied out; one definition for both types so
 * that their tiling, threading and triangular skips cannot drift apart. */
#ifdef MF_HAVE_X86
#define GEMM_KERNEL(avx, kavx, kport) if (avx) kavx; else kport
#else
#define GEMM_KERNEL(avx, kavx, kport) kport
#endif
#define DEFINE_GEMM(NAME, T, NR, KERNEL_AVX2, KERNEL_PORTABLE)                                                            \
    void NAME(int m, const T *a, size_t lda, const mf_packed *w, T *c, size_t ldc, int threads, mf_tri tri) {          \
        const int n = w->n, k = w->k, nr = NR;                                                                          \
        const int panels = (n + nr - 1) / nr, rblocks = (m + MR - 1) / MR;                                              \
        const long tiles = (long)panels * rblocks;                                                                      \
        const bool avx = cpu_has_avx2_fma();                                                                            \
        const T *wd = w->data;                                                                                          \
        const double work = (double)m * n * k;                                                                          \
        (void)threads;                                                                                                  \
        _Pragma("omp parallel for schedule(static) num_threads(threads) if (work >= PARALLEL_MIN_WORK && threads > 1)") \
        for (long t = 0; t < tiles; t++) {                                                                              \
            int pi = (int)(t / rblocks), ri = (int)(t % rblocks);                                                       \
            int i0 = ri * MR, mr = m - i0 < MR ? m - i0 : MR;                                                           \
            int j0 = pi * nr, nc = n - j0 < nr ? n - j0 : nr;                                                           \
            if (tri == MF_TRI_COLS && j0 > i0 + mr - 1) continue;                                                       \
            int kk = tri == MF_TRI_K && i0 + mr < k ? i0 + mr : k;                                                      \
            T acc[MR * NR];                                                                                             \
            const T *b = wd + (size_t)pi * (size_t)k * nr;                                                              \
            GEMM_KERNEL(avx, KERNEL_AVX2(mr, kk, a + (size_t)i0 * lda, lda, b, acc),                                    \
                        KERNEL_PORTABLE(mr, kk, a + (size_t)i0 * lda, lda, b, acc));                                    \
            for (int i = 0; i < mr; i++) memcpy(c + (size_t)(i0 + i) * ldc + j0, acc + i * nr, (size_t)nc * sizeof(T)); \
        }                                                                                                               \
        (void)avx;                                                                                                      \
    }

DEFINE_GEMM(mf_gemm_f32, float, MF_NR_F32, kernel_f32_avx2, kernel_f32_portable)
DEFINE_GEMM(mf_gemm_f64, double, MF_NR_F64, kernel_f64_avx2, kernel_f64_portable)
