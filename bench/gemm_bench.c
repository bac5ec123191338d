/* Matrix-product throughput in multiply-adds per second: the native kernel
 * of every path this CPU has (portable, AVX2, AVX-512, AVX-512 BF16; the same
 * bits, checked here), on weights held as the models hold them (bf16 rows of
 * k values, widened as the kernel reads them), and the emulated instruction
 * models, on the same core(s), in one run, so their ratios are meaningful
 * on a shared machine.
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
    mf_mat wm;
    mf_kschedule s;
    uint64_t *A, *B, *C;
} job;

static void run_native(void *p) {
    job *j = p;
    mf_gemm_f32(j->M, j->af, (size_t)j->K, &j->wm, j->cf, (size_t)j->N, j->threads, MF_TRI_NONE);
}

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
    uint16_t *wb = malloc(sizeof(uint16_t) * j.N * j.K);
    for (int i = 0; i < j.N * j.K; i++) wb[i] = mf_f32_to_bf16(w[i]);
    j.wm = mf_mat_rows(wb, MF_BF16, j.N, j.K);
    const double macs = (double)j.M * j.N * j.K;
    printf("| kernel | threads | shape MxNxK | multiply-adds/s | vs native |\n|---|---|---|---|---|\n");
    /* every path, from the widest down; the first is "native", the reference of the ratios */
    static const mf_gemm_path paths[] = {MF_GEMM_PATH_AVX512BF16, MF_GEMM_PATH_AVX512, MF_GEMM_PATH_AVX2,
                                         MF_GEMM_PATH_PORTABLE};
    double tn = 0;
    float *ref = malloc(sizeof(float) * j.M * j.N);
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!mf_gemm_force_path(paths[pi])) continue;
        const double t = best_of(pi == 3 ? 2 : 5, run_native, &j);
        if (tn == 0) {
            tn = t;
            memcpy(ref, j.cf, sizeof(float) * j.M * j.N);
        } else if (memcmp(ref, j.cf, sizeof(float) * j.M * j.N) != 0) {
            fprintf(stderr, "the %s kernel differs from the first one\n", mf_gemm_kernel_name());
            return 1;
        }
        printf("| native fp32, bf16 weights (%s) | %d | %dx%dx%d | %.3g | %.2f |\n", mf_gemm_kernel_name(), j.threads,
               j.M, j.N, j.K, macs / t, tn / t);
    }
    mf_gemm_force_path(MF_GEMM_PATH_AUTO);
    free(ref);
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

        printf(" |\n");
        /* the AVX2 kernel too where AVX-512 ran: the same bits, fewer lanes */
        if (fast && !strcmp(mf_emu_path_name(), "avx512") && mf_emu_force_path(MF_EMU_PATH_AVX2)) {
            t = best_of(3, run_emu, &j);
            printf("| emu %s %s avx2 | %d | %dx%dx%d | %.3g | 1/%.1f", cases[c][0], cases[c][1], j.threads, j.M, j.N, j.K,
                   macs / t, t / tn);
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
