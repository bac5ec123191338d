/* Matrix-product throughput in multiply-adds per second: the native fp32
 * kernel (and, where the CPU has AVX-512, a bench-only AVX-512 version of it
 * with the same bits) and the emulated instruction models, on the same
 * core(s), in one run, so their ratio is meaningful on a shared machine.
 * Usage: moeflip_bench_gemm [threads] [M N K] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_numerics.h"

static double best_of(int reps, void (*fn)(void *), void *arg) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = mf_now();
        fn(arg);
        double t = mf_now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

typedef struct job {
    int M, N, K, threads;
    float *af, *cf;
    mf_packed wp;
    mf_kschedule s;
    uint64_t *A, *B, *C;
} job;

static void run_native(void *p) {
    job *j = p;
    mf_gemm_f32(j->M, j->af, (size_t)j->K, &j->wp, j->cf, (size_t)j->N, j->threads, MF_TRI_NONE);
}

#if defined(__x86_64__)
#include <immintrin.h>
/* A bench-only native fp32 kernel with AVX-512: the same products as
 * mf_gemm_f32 (one fma chain per output over k in ascending order from zero,
 * so the same bits, checked below), 12 rows x 32 columns (two packed panels)
 * per register block. It answers whether the emulated kernels' ratio should
 * be taken against a wider native kernel; the models keep numerics/gemm.c. */
#define MR12 12
__attribute__((target("avx512f"))) static void native_avx512_tile(int mr, int np, int k, const float *a, size_t lda,
                                                                    const float *b0, const float *b1, float *c,
                                                                    size_t ldc, int nc) {
    __m512 acc[MR12][2];
    for (int i = 0; i < MR12; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    if (mr == MR12 && np == 2) {
        for (int kk = 0; kk < k; kk++) {
            const __m512 w0 = _mm512_loadu_ps(b0 + (size_t)kk * 16), w1 = _mm512_loadu_ps(b1 + (size_t)kk * 16);
            for (int i = 0; i < MR12; i++) {
                const __m512 x = _mm512_set1_ps(a[(size_t)i * lda + kk]);
                acc[i][0] = _mm512_fmadd_ps(x, w0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(x, w1, acc[i][1]);
            }
        }
    } else {
        for (int kk = 0; kk < k; kk++) {
            const __m512 w0 = _mm512_loadu_ps(b0 + (size_t)kk * 16), w1 = _mm512_loadu_ps(b1 + (size_t)kk * 16);
            for (int i = 0; i < mr; i++) {
                const __m512 x = _mm512_set1_ps(a[(size_t)i * lda + kk]);
                acc[i][0] = _mm512_fmadd_ps(x, w0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(x, w1, acc[i][1]);
            }
        }
    }
    float out[32];
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_ps(out, acc[i][0]);
        _mm512_storeu_ps(out + 16, acc[i][1]);
        memcpy(c + (size_t)i * ldc, out, sizeof(float) * (size_t)nc);
    }
}

static void run_native512(void *p) {
    job *j = p;
    const int n = j->wp.n, k = j->wp.k, panels = (n + 15) / 16, pairs = (panels + 1) / 2, rblocks = (j->M + MR12 - 1) / MR12;
    const float *wd = j->wp.data;
#pragma omp parallel for schedule(static) num_threads(j->threads) if (j->threads > 1)
    for (long t = 0; t < (long)pairs * rblocks; t++) {
        const int pp = (int)(t / rblocks), i0 = (int)(t % rblocks) * MR12, mr = j->M - i0 < MR12 ? j->M - i0 : MR12;
        const int p0 = 2 * pp, np = p0 + 1 < panels ? 2 : 1, j0 = p0 * 16, nc = n - j0 < 16 * np ? n - j0 : 16 * np;
        const float *b0 = wd + (size_t)p0 * k * 16, *b1 = np == 2 ? b0 + (size_t)k * 16 : b0;
        native_avx512_tile(mr, np, k, j->af + (size_t)i0 * j->K, (size_t)j->K, b0, b1, j->cf + (size_t)i0 * j->N + j0,
                           (size_t)j->N, nc);
    }
}
#endif

static void run_emu(void *p) {
    job *j = p;
    mf_emu_gemm(&j->s, j->M, j->N, j->K, j->A, j->B, NULL, j->C, j->threads);
}

int main(int argc, char **argv) {
    job j = {.M = 256, .N = 256, .K = 1024, .threads = argc > 1 ? atoi(argv[1]) : 1};
    if (argc > 4) {
        j.M = atoi(argv[2]);
        j.N = atoi(argv[3]);
        j.K = atoi(argv[4]);
    }
    mf_rng r;
    mf_rng_seed(&r, 1);
    j.af = malloc(sizeof(float) * j.M * j.K);
    j.cf = malloc(sizeof(float) * j.M * j.N);
    float *w = malloc(sizeof(float) * j.N * j.K);
    j.A = malloc(8 * (size_t)j.M * j.K);
    j.B = malloc(8 * (size_t)j.K * j.N);
    j.C = malloc(8 * (size_t)j.M * j.N);
    for (int i = 0; i < j.M * j.K; i++) {
        j.A[i] = mf_f64_to_bf16(mf_rng_normal(&r));
        j.af[i] = mf_bf16_to_f32((uint16_t)j.A[i]);
    }
    for (int i = 0; i < j.N * j.K; i++) w[i] = mf_bf16_to_f32(mf_f64_to_bf16(mf_rng_normal(&r)));
    for (int kk = 0; kk < j.K; kk++)
        for (int n = 0; n < j.N; n++) j.B[(size_t)kk * j.N + n] = mf_f32_to_bf16(w[(size_t)n * j.K + kk]);
    mf_pack(&j.wp, MF_F32, MF_F64, j.N, j.K, w, MF_F32, (size_t)j.K, 1);
    const double macs = (double)j.M * j.N * j.K;
    double tn = best_of(5, run_native, &j);
    printf("| kernel | threads | shape MxNxK | multiply-adds/s | vs native fp32 |\n|---|---|---|---|---|\n");
    printf("| native fp32 (%s) | %d | %dx%dx%d | %.3g | 1 |\n", mf_gemm_kernel_name(), j.threads, j.M, j.N, j.K, macs / tn);
    double tn512 = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        float *ref = malloc(sizeof(float) * j.M * j.N);
        memcpy(ref, j.cf, sizeof(float) * j.M * j.N);
        tn512 = best_of(5, run_native512, &j);
        if (memcmp(ref, j.cf, sizeof(float) * j.M * j.N) != 0) {
            fprintf(stderr, "the AVX-512 native kernel differs from mf_gemm_f32\n");
            return 1;
        }
        free(ref);
        printf("| native fp32 (avx512f, bench-only, same bits) | %d | %dx%dx%d | %.3g | %.2f |\n", j.threads, j.M, j.N, j.K,
               macs / tn512, tn / tn512);
    }
#endif
    static const char *cases[][2] = {
        {"Hopper", "mma.m16n8k16.f32.bf16.bf16.f32"}, {"Ampere", "mma.m16n8k16.f32.bf16.bf16.f32"},
        {"Volta", "mma.m8n8k4.f32.f16.f16.f32"},      {"CDNA3", "mfma_f32_16x16x16_bf16"},
        {"CDNA3", "mfma_f32_32x32x8_bf16"},          {"CDNA2", "mfma_f32_32x32x8bf16_1k"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mf_error err = {0};
        if (mf_mma_lookup(&j.s.instr, cases[c][0], cases[c][1], &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        j.s.acc = j.s.split = 1;
        j.s.reduce = MF_REDUCE_SEQ;
        if (!strcmp(cases[c][0], "Volta")) {   /* f16 operands for the f16 instruction */
            for (int i = 0; i < j.M * j.K; i++) j.A[i] = mf_f32_to_f16(j.af[i]);
            for (int kk = 0; kk < j.K; kk++)
                for (int n = 0; n < j.N; n++) j.B[(size_t)kk * j.N + n] = mf_f32_to_f16(w[(size_t)n * j.K + kk]);
        }
        const bool fast = mf_emu_fast_supported(&j.s);
        double t = best_of(3, run_emu, &j);
        printf("| emu %s %s%s%s%s | %d | %dx%dx%d | %.3g | 1/%.1f", cases[c][0], cases[c][1],
               j.s.instr.kind == MF_MMA_AMD_PAIRWISE ? " (fp32 trees, compiler-vectorised)" : "", fast ? " " : "",
               fast ? mf_emu_path_name() : "", j.threads, j.M, j.N, j.K, macs / t, t / tn);
        if (tn512 > 0) printf(" (1/%.1f of avx512f)", t / tn512);
        printf(" |\n");
        /* the AVX2 kernel too where AVX-512 ran: the same bits, fewer lanes */
        if (fast && !strcmp(mf_emu_path_name(), "avx512") && mf_emu_force_path(MF_EMU_PATH_AVX2)) {
            t = best_of(3, run_emu, &j);
            printf("| emu %s %s avx2 | %d | %dx%dx%d | %.3g | 1/%.1f", cases[c][0], cases[c][1], j.threads, j.M, j.N, j.K,
                   macs / t, t / tn);
            if (tn512 > 0) printf(" (1/%.1f of avx512f)", t / tn512);
            printf(" |\n");
            mf_emu_force_path(MF_EMU_PATH_AUTO);
        }
        if (!strcmp(cases[c][0], "Volta")) {
            for (int i = 0; i < j.M * j.K; i++) j.A[i] = mf_f32_to_bf16(j.af[i]);
            for (int kk = 0; kk < j.K; kk++)
                for (int n = 0; n < j.N; n++) j.B[(size_t)kk * j.N + n] = mf_f32_to_bf16(w[(size_t)n * j.K + kk]);
        }
    }
    return 0;
}
