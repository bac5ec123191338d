/* The native kernels compute, for every output, one fma chain over k in
 * ascending order: checked against a plain scalar loop written here, for
 * every kernel this CPU has (portable, AVX2, AVX-512, AVX-512 BF16), 1 and 2
 * threads, odd shapes, k split into blocks, weights of every dtype and
 * layout the models use (bf16, f16, f32 rows read in place; an f64
 * activation read through strides), and the causal shortcuts. The AVX-512
 * BF16 kernel's self-imposed limits (no subnormal, tiny, infinite or
 * non-bf16 operand) are crossed on purpose: the result must not change. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_numerics.h"

static const mf_gemm_path paths[] = {MF_GEMM_PATH_PORTABLE, MF_GEMM_PATH_AVX2, MF_GEMM_PATH_AVX512,
                                     MF_GEMM_PATH_AVX512BF16};

/* values of bf16 precision (bf16 = true) or fp32, exponents spread over [-spread, spread] */
static float value(mf_rng *r, int spread, bool bf16) {
    float v = (float)ldexp(mf_rng_normal(r), spread ? (int)(mf_rng_next(r) % (2 * spread + 1)) - spread : 0);
    return bf16 ? mf_bf16_to_f32(mf_f32_to_bf16(v)) : v;
}

typedef enum { W_BF16, W_F16, W_F32, W_F64_COLS } wkind;

/* W [n, k] as the kernel will read it, and the same values as fp32 rows for the reference */
static mf_mat make_w(wkind kind, int n, int k, const float *wf, void **store) {
    mf_mat m;
    switch (kind) {
    case W_BF16: {
        uint16_t *b = malloc(sizeof(uint16_t) * n * k);
        for (int i = 0; i < n * k; i++) b[i] = mf_f32_to_bf16(wf[i]);
        *store = b;
        return mf_mat_rows(b, MF_BF16, n, k);
    }
    case W_F16: {
        uint16_t *h = malloc(sizeof(uint16_t) * n * k);
        for (int i = 0; i < n * k; i++) h[i] = mf_f32_to_f16(wf[i]);
        *store = h;
        return mf_mat_rows(h, MF_F16, n, k);
    }
    case W_F32: {
        float *f = malloc(sizeof(float) * n * k);
        memcpy(f, wf, sizeof(float) * n * k);
        *store = f;
        return mf_mat_rows(f, MF_F32, n, k);
    }
    default: {   /* an activation [k, n] in double, read as W through strides (V^T in attention) */
        double *d = malloc(sizeof(double) * n * k);
        for (int j = 0; j < n; j++)
            for (int kk = 0; kk < k; kk++) d[(size_t)kk * n + j] = wf[(size_t)j * k + kk];
        *store = d;
        m = (mf_mat){.data = d, .dtype = MF_F64, .n = n, .k = k, .rs = 1, .cs = (size_t)n};
        return m;
    }
    }
}

/* The values W holds as fp32 (f16 rounds its inputs) */
static void w_values(wkind kind, const mf_mat *m, float *wf) {
    (void)kind;
    for (int j = 0; j < m->n; j++)
        for (int kk = 0; kk < m->k; kk++) wf[(size_t)j * m->k + kk] = (float)mf_mat_get(m, j, kk);
}

static void check_case(int m, int n, int k, int spread, bool bf16, wkind kind, int poison) {
    mf_rng r;
    mf_rng_seed(&r, (uint64_t)(m * 131 + n * 7 + k + kind * 1000 + poison * 77));
    float *a = malloc(sizeof(float) * m * k), *wf = malloc(sizeof(float) * n * k);
    float *c = malloc(sizeof(float) * m * n), *ref = malloc(sizeof(float) * m * n);
    for (int i = 0; i < m * k; i++) a[i] = value(&r, spread, bf16);
    for (int i = 0; i < n * k; i++) wf[i] = value(&r, spread, bf16 || kind != W_F32);
    /* poison 1: a subnormal bf16 weight; 2: a tiny (2^-60) activation; 3: an activation that is not a bf16 value */
    if (poison == 1) wf[(n / 2) * k + k / 2] = mf_bf16_to_f32(0x0005);
    if (poison == 2) a[(m / 2) * k + k - 1] = 0x1p-60f;
    if (poison == 3) a[k / 3] = 1.0f + 0x1p-20f;
    void *store;
    mf_mat w = make_w(kind, n, k, wf, &store);
    w_values(kind, &w, wf);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float acc = 0;
            for (int kk = 0; kk < k; kk++) acc = fmaf(a[i * k + kk], wf[j * k + kk], acc);
            ref[i * n + j] = acc;
        }
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (!mf_gemm_force_path(paths[p])) continue;
        for (int threads = 1; threads <= 2; threads++) {
            memset(c, 0xff, sizeof(float) * m * n);   /* NaN poison: every element must be written */
            mf_gemm_f32(m, a, (size_t)k, &w, c, (size_t)n, threads, MF_TRI_NONE);
            for (int i = 0; i < m * n; i++)
                cr_assert(memcmp(&c[i], &ref[i], sizeof(float)) == 0,
                          "%dx%dx%d, W kind %d, poison %d, %s, %d threads: C[%d, %d] = %a, the fma chain gives %a", m,
                          n, k, kind, poison, mf_gemm_kernel_name(), threads, i / n, i % n, c[i], ref[i]);
        }
        /* causal: columns j <= i are the same values */
        mf_gemm_f32(m, a, (size_t)k, &w, c, (size_t)n, 2, MF_TRI_COLS);
        for (int i = 0; i < m; i++)
            for (int j = 0; j <= i && j < n; j++)
                cr_assert(memcmp(&c[i * n + j], &ref[i * n + j], sizeof(float)) == 0, "%s TRI_COLS C[%d, %d]",
                          mf_gemm_kernel_name(), i, j);
    }
    mf_gemm_force_path(MF_GEMM_PATH_AUTO);
    free(store);
    free(a); free(wf); free(c); free(ref);
}

Test(gemm, every_kernel_matches_the_scalar_fma_chain) {
    check_case(1, 1, 1, 0, false, W_F32, 0);
    check_case(6, 16, 64, 0, false, W_F32, 0);
    check_case(7, 17, 33, 0, false, W_F32, 0);
    check_case(13, 40, 129, 20, false, W_F32, 0);   /* wide exponent spread: order of the chain matters */
    check_case(64, 224, 256, 3, false, W_F32, 0);
}

Test(gemm, weights_in_their_checkpoint_dtype) {
    for (int kind = W_BF16; kind <= W_F64_COLS; kind++) {
        check_case(5, 33, 31, 4, true, kind, 0);
        check_case(25, 70, 130, 10, true, kind, 0);   /* bf16 operands: the pair kernel where the CPU has it */
        check_case(30, 19, 97, 3, false, kind, 0);    /* fp32 activations: the fp32 kernels */
    }
}

/* k = 2100 > the 512-value blocks of a 200-row product: the running sums
 * are stored and reloaded between blocks */
Test(gemm, k_split_into_blocks) {
    check_case(200, 40, 2100, 6, true, W_BF16, 0);
    check_case(200, 21, 2101, 6, false, W_F32, 0);
}

Test(gemm, pair_kernel_limits_give_the_same_bits) {
    for (int poison = 1; poison <= 3; poison++) {
        check_case(26, 45, 70, 8, true, W_BF16, poison);
        check_case(200, 40, 2100, 6, true, W_BF16, poison);
    }
}

Test(gemm, tri_k_drops_only_trailing_zeros) {
    const int m = 11, n = 16, k = 11;
    mf_rng r;
    mf_rng_seed(&r, 9);
    float a[11 * 11], w[16 * 11], c1[11 * 16], c2[11 * 16];
    for (int i = 0; i < m * k; i++) a[i] = value(&r, 0, true);
    for (int i = 0; i < n * k; i++) w[i] = value(&r, 0, true);
    for (int i = 0; i < m; i++)
        for (int kk = i + 1; kk < k; kk++) a[i * k + kk] = 0;   /* causal P */
    const mf_mat p = mf_mat_rows(w, MF_F32, n, k);
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!mf_gemm_force_path(paths[pi])) continue;
        mf_gemm_f32(m, a, (size_t)k, &p, c1, (size_t)n, 1, MF_TRI_NONE);
        mf_gemm_f32(m, a, (size_t)k, &p, c2, (size_t)n, 1, MF_TRI_K);
        cr_assert(memcmp(c1, c2, sizeof c1) == 0, "%s", mf_gemm_kernel_name());
    }
    mf_gemm_force_path(MF_GEMM_PATH_AUTO);
}

Test(gemm, f64_matches_scalar_chain) {
    const int m = 29, n = 21, k = 37;
    mf_rng r;
    mf_rng_seed(&r, 3);
    double a[29 * 37], w[21 * 37], c[29 * 21];
    uint16_t wb[21 * 37];
    for (int i = 0; i < m * k; i++) a[i] = mf_rng_normal(&r);
    for (int i = 0; i < n * k; i++) w[i] = mf_rng_normal(&r);
    for (int i = 0; i < n * k; i++) wb[i] = mf_f32_to_bf16((float)w[i]);
    for (int form = 0; form < 2; form++) {   /* f64 rows; bf16 rows widened to double */
        const mf_mat p = form ? mf_mat_rows(wb, MF_BF16, n, k) : mf_mat_rows(w, MF_F64, n, k);
        for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
            if (!mf_gemm_force_path(paths[pi])) continue;
            mf_gemm_f64(m, a, (size_t)k, &p, c, (size_t)n, 2, MF_TRI_NONE);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double acc = 0;
                    for (int kk = 0; kk < k; kk++) acc = fma(a[i * k + kk], mf_mat_get(&p, j, kk), acc);
                    cr_assert_eq(c[i * n + j], acc, "%s form %d C[%d, %d]", mf_gemm_kernel_name(), form, i, j);
                }
        }
    }
    mf_gemm_force_path(MF_GEMM_PATH_AUTO);
}

Test(gemm, linear_adds_bias_in_fp32_then_rounds) {
    /* 1x1: x = 1, W = 1 + 2^-8 (exact in fp32), bias = 2^-9: fp32 sum 1 + 3*2^-9
     * rounds to bf16 1 + 2^-7 (nearest); without the bias it is a tie -> 1.0. */
    double x[1] = {1.0}, y[1];
    float wv = 1.0f + 0x1p-8f;
    mf_linear L = {1, 1, mf_mat_rows(&wv, MF_F32, 1, 1), NULL};
    mf_mm mm = {MF_F32, MF_BF16, 1, NULL, MF_F32};
    mf_linear_apply(&mm, &L, x, 1, y);
    cr_assert_eq(y[0], 1.0);
    double b = 0x1p-9;
    L.bias = &b;
    mf_linear_apply(&mm, &L, x, 1, y);
    cr_assert_eq(y[0], 1.0 + 0x1p-7);
}

/* A linear layer under an emulated profile computes what the instruction
 * computes: x = {1, -2^-25}, W = {1, 1}. The CPU's fp32 fma chain gives the
 * tie 1 - 2^-25, rounded to even: 1.0. Hopper keeps 25 fraction bits, sums
 * exactly and rounds toward zero: 1 - 2^-24. */
Test(gemm, linear_under_emulated_hopper) {
    double x[2] = {1.0, -0x1p-25}, y[1];
    float wv[2] = {1.0f, 1.0f};
    mf_linear L = {1, 2, mf_mat_rows(wv, MF_F32, 1, 2), NULL};
    mf_mm native = {MF_F32, MF_F32, 1, NULL, MF_BF16};
    mf_linear_apply(&native, &L, x, 1, y);
    cr_assert_eq(y[0], 1.0);
    mf_numerics hopper, cdna3;
    mf_error err = {0};
    cr_assert_eq(mf_numerics_parse(&hopper, "emu:hopper", &err), MF_OK, "%s", err.msg);
    mf_mm emu = {MF_F32, MF_F32, 1, &hopper, MF_BF16};
    mf_linear_apply(&emu, &L, x, 1, y);
    cr_assert_eq(y[0], 1.0 - 0x1p-24);
    /* CDNA3 truncates products to 24 bits relative to the largest: -2^-25 is
     * cut to zero before anything is added, so the result is 1.0 */
    cr_assert_eq(mf_numerics_parse(&cdna3, "emu:cdna3", &err), MF_OK, "%s", err.msg);
    emu.numerics = &cdna3;
    mf_linear_apply(&emu, &L, x, 1, y);
    cr_assert_eq(y[0], 1.0);
}

Test(gemm, numerics_profiles_parse) {
    mf_numerics n;
    mf_error err = {0};
    cr_assert_eq(mf_numerics_parse(&n, "emu:cdna3:mfma_f32_16x16x16_bf16:acc=2", &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(n.name, "emu:cdna3:mfma_f32_16x16x16_bf16:acc=2:split=1:reduce=seq");
    cr_assert_eq(n.bf16.acc, 2);
    cr_assert_str_eq(n.f16.instr.name, "mfma_f32_32x32x8_f16");
    cr_assert_eq(mf_numerics_parse(&n, "emu:volta", &err), MF_OK);
    cr_assert_null(mf_numerics_schedule(&n, MF_BF16), "Volta has no bf16 instruction");
    cr_assert_not_null(mf_numerics_schedule(&n, MF_F16));
    cr_assert_null(mf_numerics_schedule(&n, MF_F32), "fp32 operands run as an fma chain");
    cr_assert_neq(mf_numerics_parse(&n, "emu:pascal", &err), MF_OK);
    cr_assert_neq(mf_numerics_parse(&n, "emu:hopper:acc=0", &err), MF_OK);
    cr_assert_neq(mf_numerics_parse(&n, "emu:hopper:mfma_f32_32x32x8_bf16", &err), MF_OK, "an AMD instruction on Hopper");
    cr_assert_eq(mf_numerics_parse(&n, "native", &err), MF_OK);
    cr_assert_eq(n.kind, MF_NUMERICS_NATIVE);
}

/* ---- the emulated GEMM's kernels --------------------------------------------
 * mf_emu_force_path picks the fast path's kernel (MOEFLIP_EMU_PATH does the
 * same for a whole process): AVX-512, AVX2 and portable C must give the same
 * bits on the same inputs, and the same as the reference model. Shapes cover
 * full and short panel groups of both widths (4 and 8 columns), operands
 * wide exponent spreads, cancellation, zeros, subnormals, Inf/NaN and
 * results near fp32's end. */

static uint64_t emu_operand(mf_rng *r, mf_fmt f, int style) {
    double v = mf_rng_normal(r);
    if (style == 1) v = ldexp(v, (int)(mf_rng_next(r) % 60) - 30);
    if (style == 2) v = mf_rng_next(r) % 3 == 0 ? 0.0 : ldexp(v, (int)(mf_rng_next(r) % 40) - (f == MF_FMT_F16 ? 30 : 140));
    if (style == 3 && mf_rng_next(r) % 89 == 0) v = (mf_rng_next(r) & 1) ? INFINITY : NAN;
    if (style == 4) v = ldexp(v, f == MF_FMT_F16 ? (int)(mf_rng_next(r) % 24) - 8 : (int)(mf_rng_next(r) % 250) - 125);
    if (style == 5 && mf_rng_next(r) % 2) v = -v * 0x1p-3;   /* near-cancelling sums */
    return f == MF_FMT_BF16 ? mf_f64_to_bf16(v) : mf_f64_to_f16(v);
}

static void emu_paths_agree(const char *arch, const char *name, bool hw_zero, int M, int N, int ksteps) {
    mf_kschedule s = {.acc = 1, .split = 1, .reduce = MF_REDUCE_SEQ};
    mf_error err = {0};
    cr_assert_eq(mf_mma_lookup(&s.instr, arch, name, &err), MF_OK, "%s", err.msg);
    s.instr.zero_products_excluded = hw_zero;
    cr_assert(mf_emu_fast_supported(&s), "%s %s has a fast path", arch, name);
    const int K = s.instr.k * ksteps;
    const mf_fmt f = s.instr.a_fmt;
    uint64_t *A = malloc(8 * (size_t)M * K), *B = malloc(8 * (size_t)K * N), *C0 = malloc(8 * (size_t)M * N);
    uint64_t *R = malloc(8 * (size_t)M * N), *G = malloc(8 * (size_t)M * N);
    static const mf_emu_path paths[] = {MF_EMU_PATH_PORTABLE, MF_EMU_PATH_AVX2, MF_EMU_PATH_AVX512};
    static const char *names[] = {"portable", "avx2", "avx512"};
    for (int style = 0; style < 6; style++) {
        mf_rng r;
        mf_rng_seed(&r, (uint64_t)(style * 7919 + M * 31 + N));
        for (int i = 0; i < M * K; i++) A[i] = emu_operand(&r, f, style);
        for (int i = 0; i < K * N; i++) B[i] = emu_operand(&r, f, style == 4 ? 4 : style % 4);
        for (int i = 0; i < M * N; i++) {
            float c = (float)mf_rng_normal(&r);
            if (style == 2) c = (float)ldexp(c, -135);
            if (style == 4) c = (float)ldexp(c, 120);
            if (style == 0 && i % 5 == 0) c = -0.0f;
            uint32_t u;
            memcpy(&u, &c, 4);
            C0[i] = u;
        }
        mf_emu_gemm_reference(&s, M, N, K, A, B, C0, R, 1);
        for (int p = 0; p < 3; p++) {
            if (!mf_emu_force_path(paths[p])) {
                cr_log_info("this CPU has no %s kernel: not checked", names[p]);
                continue;
            }
            cr_assert_str_eq(mf_emu_path_name(), names[p]);
            for (int threads = 1; threads <= 2; threads++) {
                memset(G, 0xff, 8 * (size_t)M * N);
                mf_emu_gemm_fast(&s, M, N, K, A, B, C0, G, threads);
                for (int i = 0; i < M * N; i++)
                    cr_assert_eq(G[i], R[i], "%s %s style %d %dx%dx%d, %s kernel, %d threads: element %d %08llx, reference %08llx",
                                 arch, name, style, M, N, K, names[p], threads, i, (unsigned long long)G[i],
                                 (unsigned long long)R[i]);
            }
        }
    }
    mf_emu_force_path(MF_EMU_PATH_AUTO);
    free(A); free(B); free(C0); free(R); free(G);
}

Test(emu_gemm, every_kernel_gives_the_same_bits) {
    const int shapes[][3] = {{3, 5, 2}, {5, 37, 3}, {4, 64, 2}, {2, 100, 3}};   /* M, N, k-steps */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int M = shapes[i][0], N = shapes[i][1], S = shapes[i][2];
        emu_paths_agree("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32", false, M, N, S);
        emu_paths_agree("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32", true, M, N, S);   /* the H200's zero rule */
        emu_paths_agree("Hopper", "wgmma.m64n8k16.f32.f16.f16", false, M, N, S);
        emu_paths_agree("Ampere", "mma.m16n8k16.f32.bf16.bf16.f32", false, M, N, S);
        emu_paths_agree("Volta", "mma.m8n8k4.f32.f16.f16.f32", false, M, N, S);
        emu_paths_agree("CDNA3", "mfma_f32_16x16x16_bf16", false, M, N, S);
        emu_paths_agree("CDNA3", "mfma_f32_32x32x8_f16", false, M, N, S);
    }
}
