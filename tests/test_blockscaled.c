/* Block-scaled weights (FP8 with DeepSeek-V3's 2-D block scales, MXFP4 with per-32 UE8M0 scales) kept as stored
 * and widened by the kernels as they pack panels. What they must compute is what the loader used to do: dequantise
 * the tensor once, as transformers' Fp8Dequantize does (each value fp32(fp32(q) x fp32(scale_inv)), then held in
 * the policy's weight dtype), and multiply by that copy. Checked here bit for bit against such a copy made in the
 * test, on every native kernel this CPU has, in fp64, and under emulated instructions (where a weight block is
 * cached between products: the cache must tell weights whose codes agree but scales differ); and element values
 * against the formats' specifications (OCP e4m3fn, OCP MX e2m1 + E8M0) computed by hand. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_numerics.h"

static const mf_gemm_path paths[] = {MF_GEMM_PATH_PORTABLE, MF_GEMM_PATH_AVX2, MF_GEMM_PATH_AVX512,
                                     MF_GEMM_PATH_AVX512BF16};

/* ---- element values against the specifications ------------------------------------------------------------ */

Test(blockscaled, fp8_values_are_code_times_block_scale) {
    /* W [3, 5], blocks of 2 x 2: scales S [2, 3] */
    const uint8_t codes[15] = {0x38, 0x3c, 0x7e, 0x01, 0x80,    /* 1, 1.5, 448, 2^-9, -0 */
                               0xb8, 0x40, 0x08, 0x00, 0x3e,    /* -1, 2, 2^-6, 0, 1.75 */
                               0x30, 0x48, 0x7f, 0x44, 0x50};   /* 0.5, 4, NaN, 3, 8 */
    const float S[6] = {0.5f, 2.0f, 1.1f, 0x1p-4f, 3.0f, -1.0f};
    mf_mat w = mf_mat_fp8_block(codes, 3, 5, S, MF_F32, 2, 2, MF_F32);
    cr_assert_eq(mf_mat_get(&w, 0, 0), 0.5);
    cr_assert_eq(mf_mat_get(&w, 0, 1), 0.75);
    cr_assert_eq(mf_mat_get(&w, 0, 2), 896.0, "448 x 2 (second block of k)");
    cr_assert_eq(mf_mat_get(&w, 0, 3), 0x1p-8);
    cr_assert(mf_mat_get(&w, 0, 4) == 0 && signbit(mf_mat_get(&w, 0, 4)), "-0 x 1.1 is -0 (third, partial block)");
    cr_assert_eq(mf_mat_get(&w, 1, 0), -0.5);
    cr_assert_eq(mf_mat_get(&w, 1, 2), 0x1p-6 * 2.0);
    cr_assert_eq(mf_mat_get(&w, 1, 3), 0.0);
    /* 1.75 x fp32(1.1) = 1.9250000417..., in fp32 0x1.eccccep+0 (1.92500007...); in bf16 1.921875 (246 / 128) */
    cr_assert_eq(mf_mat_get(&w, 1, 4), 0x1.eccccep+0);
    mf_mat wb = mf_mat_fp8_block(codes, 3, 5, S, MF_F32, 2, 2, MF_BF16);
    cr_assert_eq(mf_mat_get(&wb, 1, 4), 1.921875, "rounded to bf16 after the fp32 product");
    cr_assert_eq(mf_mat_get(&w, 2, 0), 0.5 * 0x1p-4, "third row: second block row");
    cr_assert_eq(mf_mat_get(&w, 2, 1), 4.0 * 0x1p-4);
    cr_assert(isnan(mf_mat_get(&w, 2, 2)));
    cr_assert_eq(mf_mat_get(&w, 2, 3), 9.0);
    cr_assert_eq(mf_mat_get(&w, 2, 4), -8.0);
    /* fp16 under an fp16 policy: 448 x 2^8 overflows fp16 (max 65504) */
    const float big[1] = {256.0f};
    mf_mat wh = mf_mat_fp8_block(codes, 1, 3, big, MF_F32, 128, 128, MF_F16);
    cr_assert(isinf(mf_mat_get(&wh, 0, 2)), "448 x 256 is past fp16's range");
    cr_assert_eq(mf_mat_get(&wh, 0, 1), 384.0);
    /* bf16 scales (a checkpoint may store scale_inv in bf16) */
    const uint16_t sb[1] = {0x3fc0};   /* 1.5 */
    mf_mat ws = mf_mat_fp8_block(codes, 1, 2, sb, MF_BF16, 128, 128, MF_F32);
    cr_assert_eq(mf_mat_get(&ws, 0, 1), 2.25);
}

Test(blockscaled, mxfp4_values_are_nibble_times_power_of_two) {
    /* one row of 64 values: two blocks of 32, low nibble first */
    uint8_t blocks[32] = {0};
    blocks[0] = 0x97;   /* element 0: 0x7 = 6.0; element 1: 0x9 = -0.5 */
    blocks[1] = 0x21;   /* element 2: 0x1 = 0.5; element 3: 0x2 = 1.0 */
    blocks[16] = 0x0f;  /* element 32: 0xf = -6.0; element 33: +0 */
    const uint8_t scales[2] = {128, 0};   /* 2^1; 2^-127 */
    mf_mat w = mf_mat_mxfp4(blocks, 1, 64, scales, MF_F32);
    cr_assert_eq(mf_mat_get(&w, 0, 0), 12.0);
    cr_assert_eq(mf_mat_get(&w, 0, 1), -1.0);
    cr_assert_eq(mf_mat_get(&w, 0, 2), 1.0);
    cr_assert_eq(mf_mat_get(&w, 0, 3), 2.0);
    cr_assert_eq(mf_mat_get(&w, 0, 4), 0.0);
    cr_assert_eq(mf_mat_get(&w, 0, 32), -6.0 * 0x1p-127, "scale byte 0 is 2^-127 (an fp32 subnormal)");
    cr_assert_eq(mf_mat_get(&w, 0, 33), 0.0);
    const uint8_t inf_scale[2] = {255, 127};
    mf_mat wi = mf_mat_mxfp4(blocks, 1, 64, inf_scale, MF_BF16);
    cr_assert(isinf(mf_mat_get(&wi, 0, 0)) && mf_mat_get(&wi, 0, 0) > 0, "0xff is fp32(2^128) = +inf");
    cr_assert(isnan(mf_mat_get(&wi, 0, 4)), "0 x inf");
    cr_assert_eq(mf_mat_get(&wi, 0, 32), -6.0);
}

/* ---- products: bit-equal to a dequantised copy -------------------------------------------------------------- */

typedef struct qcase {
    int n, k, bn, bk;
    mf_wq kind;
    mf_dtype sdt;     /* FP8 scales' dtype */
    mf_dtype round;   /* the weights' dtype */
} qcase;

typedef struct qweight {
    mf_mat w;      /* block-scaled */
    mf_mat copy;   /* dequantised in the test, in `round` */
    uint8_t *codes;
    void *scales, *values;
} qweight;

/* Random codes (every finite code of the format, NaN codes left out) and scales; the copy is the loader's old
 * dequantisation: fp32(fp32(code) x fp32(scale)), stored into `round`. */
static qweight make(const qcase *c, uint64_t seed) {
    qweight q = {0};
    mf_rng r;
    mf_rng_seed(&r, seed);
    const size_t n = (size_t)c->n * c->k;
    const int sr = c->kind == MF_WQ_MXFP4 ? c->n : (c->n + c->bn - 1) / c->bn;
    const int sc = (c->k + c->bk - 1) / c->bk;
    if (c->kind == MF_WQ_FP8_BLOCK) {
        q.codes = malloc(n);
        for (size_t i = 0; i < n; i++) {
            uint8_t b;
            do b = (uint8_t)mf_rng_next(&r);
            while ((b & 0x7f) == 0x7f);
            q.codes[i] = b;
        }
        q.scales = malloc((size_t)sr * sc * 4);
        for (int i = 0; i < sr * sc; i++) {   /* DeepSeek-V3's are around 2^-10 .. 2^-6; spread wider */
            const float s = (float)ldexp(1.0 + (double)(mf_rng_next(&r) % 1000000) / 1e6, (int)(mf_rng_next(&r) % 16) - 14);
            if (c->sdt == MF_BF16) ((uint16_t *)q.scales)[i] = mf_f32_to_bf16(s);
            else ((float *)q.scales)[i] = s;
        }
        q.w = mf_mat_fp8_block(q.codes, c->n, c->k, q.scales, c->sdt, c->bn, c->bk, c->round);
    } else {
        q.codes = malloc(n / 2);
        for (size_t i = 0; i < n / 2; i++) q.codes[i] = (uint8_t)mf_rng_next(&r);
        q.scales = malloc((size_t)sr * sc);
        for (int i = 0; i < sr * sc; i++) ((uint8_t *)q.scales)[i] = (uint8_t)(120 + mf_rng_next(&r) % 12);
        q.w = mf_mat_mxfp4(q.codes, c->n, c->k, q.scales, c->round);
    }
    q.values = malloc(n * mf_dtype_size(c->round));
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int j = 0; j < c->n; j++)
        for (int kk = 0; kk < c->k; kk++) {
            const size_t i = (size_t)j * c->k + kk;
            float code, scale;
            if (c->kind == MF_WQ_FP8_BLOCK) {
                code = (float)mf_f8e4m3_to_f64(q.codes[i]);
                const size_t si = (size_t)(j / c->bn) * sc + kk / c->bk;
                scale = c->sdt == MF_BF16 ? mf_bf16_to_f32(((uint16_t *)q.scales)[si]) : ((float *)q.scales)[si];
            } else {
                const unsigned nib = i % 2 ? q.codes[i / 2] >> 4 : q.codes[i / 2] & 15u;
                code = (nib & 8 ? -1.0f : 1.0f) * e2m1[nib & 7];
                scale = (float)ldexp(1.0, ((uint8_t *)q.scales)[(size_t)j * sc + kk / 32] - 127);
            }
            mf_store_from_f64(q.values, c->round, i, (float)(code * scale));
        }
    q.copy = mf_mat_rows(q.values, c->round, c->n, c->k);
    return q;
}

static void drop(qweight *q) {
    free(q->codes);
    free(q->scales);
    free(q->values);
}

/* activations of the policy's dtype (bf16 or f16 values; fp32 under an fp32 weight dtype) */
static float *activations(int m, int k, mf_dtype dt, uint64_t seed) {
    mf_rng r;
    mf_rng_seed(&r, seed);
    float *a = malloc(sizeof(float) * m * k);
    for (int i = 0; i < m * k; i++) a[i] = (float)mf_round_to(dt, ldexp(mf_rng_normal(&r), (int)(mf_rng_next(&r) % 9) - 4));
    return a;
}

static void assert_same_f32(const float *x, const float *y, size_t n, const char *what, const qcase *c) {
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&x[i], &y[i], sizeof(float)) == 0, "%s, %dx%d kind %d round %s: C[%zu] = %a, the dequantised "
                  "copy gives %a", what, c->n, c->k, c->kind, mf_dtype_name(c->round), i, x[i], y[i]);
}

static void check_native(const qcase *c, int m) {
    qweight q = make(c, (uint64_t)(c->n * 31 + c->k + c->kind * 7 + c->round));
    float *a = activations(m, c->k, c->round, 99);
    float *got = malloc(sizeof(float) * m * c->n), *want = malloc(sizeof(float) * m * c->n);
    int ran = 0;
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (!mf_gemm_force_path(paths[p])) continue;
        ran++;
        for (int threads = 1; threads <= 2; threads++) {
            memset(got, 0xff, sizeof(float) * m * c->n);
            mf_gemm_f32(m, a, (size_t)c->k, &q.w, got, (size_t)c->n, threads, MF_TRI_NONE);
            mf_gemm_f32(m, a, (size_t)c->k, &q.copy, want, (size_t)c->n, threads, MF_TRI_NONE);
            assert_same_f32(got, want, (size_t)m * c->n, mf_gemm_kernel_name(), c);
        }
    }
    cr_assert_geq(ran, 1);
    mf_gemm_force_path(MF_GEMM_PATH_AUTO);
    /* the fp64 kernels (an fp64 run keeps fp32 weights) */
    double *ad = malloc(sizeof(double) * m * c->k), *gd = malloc(sizeof(double) * m * c->n);
    double *wd = malloc(sizeof(double) * m * c->n);
    for (int i = 0; i < m * c->k; i++) ad[i] = a[i] * (1.0 + 0x1p-40);   /* not fp32 values: a double chain */
    mf_gemm_f64(m, ad, (size_t)c->k, &q.w, gd, (size_t)c->n, 2, MF_TRI_NONE);
    mf_gemm_f64(m, ad, (size_t)c->k, &q.copy, wd, (size_t)c->n, 2, MF_TRI_NONE);
    cr_assert(memcmp(gd, wd, sizeof(double) * m * c->n) == 0, "fp64 kernels, %dx%d kind %d", c->n, c->k, c->kind);
    free(ad), free(gd), free(wd);
    free(a), free(got), free(want);
    drop(&q);
}

Test(blockscaled, fp8_native_products_equal_the_dequantised_copy) {
    const mf_dtype rounds[3] = {MF_BF16, MF_F16, MF_F32};
    for (int r = 0; r < 3; r++) {
        check_native(&(qcase){128, 256, 128, 128, MF_WQ_FP8_BLOCK, MF_F32, rounds[r]}, 7);
        check_native(&(qcase){77, 300, 128, 128, MF_WQ_FP8_BLOCK, MF_F32, rounds[r]}, 1);   /* partial blocks */
        check_native(&(qcase){90, 70, 16, 16, MF_WQ_FP8_BLOCK, MF_BF16, rounds[r]}, 30);   /* the fixture's 16 x 16 */
    }
    check_native(&(qcase){40, 2100, 128, 128, MF_WQ_FP8_BLOCK, MF_F32, MF_BF16}, 200);   /* k cut into blocks */
}

Test(blockscaled, mxfp4_native_products_equal_the_dequantised_copy) {
    check_native(&(qcase){64, 128, 1, 32, MF_WQ_MXFP4, MF_U8, MF_BF16}, 5);
    check_native(&(qcase){33, 96, 1, 32, MF_WQ_MXFP4, MF_U8, MF_F32}, 13);
    check_native(&(qcase){20, 80, 1, 32, MF_WQ_MXFP4, MF_U8, MF_BF16}, 2);   /* a partial last block */
}

/* Through mf_linear_apply under a policy's matrix settings: native, fp64, and emulated instructions (bf16 and
 * f16 operands), each product twice (the second finds the decoded weight block in the cache). */
static void check_linear(const qcase *c, const char *numerics, mf_dtype compute, mf_dtype in, int m) {
    qweight q = make(c, (uint64_t)(c->n + c->k * 3 + in));
    mf_numerics num;
    mf_error err = {0};
    const bool emu = strncmp(numerics, "emu:", 4) == 0;
    if (emu) cr_assert_eq(mf_numerics_parse(&num, numerics, &err), MF_OK, "%s", err.msg);
    const mf_mm mm = {compute, compute == MF_F64 ? MF_F64 : MF_F32, 2, emu ? &num : NULL, in};
    float *af = activations(m, c->k, in, 7);
    double *x = malloc(sizeof(double) * m * c->k), *y = malloc(sizeof(double) * m * c->n);
    double *yc = malloc(sizeof(double) * m * c->n);
    for (int i = 0; i < m * c->k; i++) x[i] = af[i];
    mf_linear L = {c->n, c->k, q.w, NULL}, Lc = {c->n, c->k, q.copy, NULL};
    for (int rep = 0; rep < 2; rep++) {
        mf_linear_apply(&mm, &L, x, m, y);
        mf_linear_apply(&mm, &Lc, x, m, yc);
        for (int i = 0; i < m * c->n; i++)
            cr_assert(memcmp(&y[i], &yc[i], sizeof(double)) == 0, "%s, %dx%d kind %d, product %d: y[%d] = %a, the "
                      "dequantised copy gives %a", numerics, c->n, c->k, c->kind, rep + 1, i, y[i], yc[i]);
    }
    free(af), free(x), free(y), free(yc);
    drop(&q);
}

Test(blockscaled, products_under_every_kind_of_profile_equal_the_dequantised_copy) {
    const qcase fp8b = {96, 256, 128, 128, MF_WQ_FP8_BLOCK, MF_F32, MF_BF16};
    const qcase fp8h = {96, 256, 128, 128, MF_WQ_FP8_BLOCK, MF_F32, MF_F16};
    const qcase fp8f = {96, 256, 128, 128, MF_WQ_FP8_BLOCK, MF_F32, MF_F32};
    const qcase mx = {64, 128, 1, 32, MF_WQ_MXFP4, MF_U8, MF_BF16};
    for (int m = 1; m <= 9; m += 8) {   /* a decode step and a prefill */
        check_linear(&fp8b, "native", MF_F32, MF_BF16, m);
        check_linear(&fp8f, "native", MF_F32, MF_F32, m);
        check_linear(&fp8f, "fp64", MF_F64, MF_F64, m);
        check_linear(&fp8b, "emu:hopper", MF_F32, MF_BF16, m);
        check_linear(&fp8b, "emu:cdna3", MF_F32, MF_BF16, m);
        check_linear(&fp8h, "emu:volta:acc=2", MF_F32, MF_F16, m);
        check_linear(&fp8h, "emu:ampere", MF_F32, MF_F16, m);
        check_linear(&fp8b, "emu:blackwell", MF_F32, MF_BF16, m);
        check_linear(&mx, "emu:hopper", MF_F32, MF_BF16, m);
        check_linear(&mx, "emu:cdna2", MF_F32, MF_BF16, m);
    }
}

/* Two FP8 weights with the same codes and other scales: an emulated product caches decoded weight blocks by the
 * digest of their bytes, which must cover the scales (else the second would be served the first's values). */
Test(blockscaled, cached_weight_blocks_are_told_apart_by_their_scales) {
    const qcase c = {64, 128, 128, 128, MF_WQ_FP8_BLOCK, MF_F32, MF_BF16};
    qweight q1 = make(&c, 1), q2 = make(&c, 1);
    ((float *)q2.scales)[0] *= 2.0f;
    for (size_t i = 0; i < 64 * 128; i++) mf_store_from_f64(q2.values, MF_BF16, i, 2.0 * mf_load_as_f64(q1.values, MF_BF16, i));
    mf_numerics num;
    mf_error err = {0};
    cr_assert_eq(mf_numerics_parse(&num, "emu:hopper", &err), MF_OK, "%s", err.msg);
    const mf_mm mm = {MF_F32, MF_F32, 1, &num, MF_BF16};
    double x[128], y1[64], y2[64], want[64];
    for (int i = 0; i < 128; i++) x[i] = mf_round_to(MF_BF16, 1.0 / (i + 1));
    mf_linear L1 = {64, 128, q1.w, NULL}, L2 = {64, 128, q2.w, NULL}, Lc = {64, 128, q2.copy, NULL};
    mf_linear_apply(&mm, &L1, x, 1, y1);
    mf_linear_apply(&mm, &L2, x, 1, y2);
    mf_linear_apply(&mm, &Lc, x, 1, want);
    cr_assert(memcmp(y2, want, sizeof want) == 0, "the second weight's own values");
    int differ = 0;
    for (int j = 0; j < 64; j++) differ += y1[j] != y2[j];
    cr_assert_gt(differ, 50, "doubled weights give other sums (%d of 64 differ)", differ);
    drop(&q1);
    drop(&q2);
}

/* gpt-oss keeps an expert's gate and up projections interleaved in one [2I, K] tensor (gate rows even, up rows
 * odd). A view of every other row, through the strides of the codes and of the scales, must give the same bits as
 * a dequantised copy of those rows. */
Test(blockscaled, mxfp4_strided_view_of_interleaved_rows) {
    const qcase c = {64, 96, 1, 32, MF_WQ_MXFP4, MF_U8, MF_BF16};
    qweight q = make(&c, 21);
    for (int odd = 0; odd < 2; odd++) {
        mf_mat v = q.w;   /* rows odd, odd + 2, ...: 32 of them */
        v.n = 32;
        v.data = q.codes + odd * (96 / 2);
        v.rs = 2 * 96;
        v.q.data = (const uint8_t *)q.scales + odd * 3;
        v.q.rs = 2 * 3;
        uint16_t *rows = malloc(sizeof(uint16_t) * 32 * 96);
        for (int j = 0; j < 32; j++) memcpy(rows + (size_t)j * 96, (uint16_t *)q.values + (size_t)(2 * j + odd) * 96, 192);
        const mf_mat copy = mf_mat_rows(rows, MF_BF16, 32, 96);
        for (int j = 0; j < 32; j++)
            for (int kk = 0; kk < 96; kk++) cr_assert_eq(mf_mat_get(&v, j, kk), mf_mat_get(&copy, j, kk));
        float *a = activations(5, 96, MF_BF16, 3), got[5 * 32], want[5 * 32];
        mf_gemm_f32(5, a, 96, &v, got, 32, 2, MF_TRI_NONE);
        mf_gemm_f32(5, a, 96, &copy, want, 32, 2, MF_TRI_NONE);
        assert_same_f32(got, want, 5 * 32, "interleaved rows", &c);
        mf_numerics num;
        mf_error err = {0};
        cr_assert_eq(mf_numerics_parse(&num, "emu:cdna3", &err), MF_OK, "%s", err.msg);
        const mf_mm mm = {MF_F32, MF_F32, 1, &num, MF_BF16};
        double x[96], y[32], yc[32];
        for (int i = 0; i < 96; i++) x[i] = a[i];
        mf_linear L = {32, 96, v, NULL}, Lc = {32, 96, copy, NULL};
        mf_linear_apply(&mm, &L, x, 1, y);
        mf_linear_apply(&mm, &Lc, x, 1, yc);
        cr_assert(memcmp(y, yc, sizeof y) == 0, "emu:cdna3 on the strided view");
        free(a);
        free(rows);
    }
    drop(&q);
}

/* Every e4m3 code, NaNs, zeros of both signs and subnormals included, through every kernel: W [32, 16] holds the
 * 256 codes twice (the second copy under another scale block's scale), and every output matches the dequantised
 * copy's bit for bit (NaN outputs with the same bits). */
Test(blockscaled, every_fp8_code_through_every_kernel) {
    uint8_t codes[32 * 16];
    for (int i = 0; i < 32 * 16; i++) codes[i] = (uint8_t)(i % 256);
    const float S[2] = {0.75f, 0x1.8p-7f};   /* rows 0-15, rows 16-31 */
    const mf_dtype rounds[2] = {MF_BF16, MF_F32};
    for (int r = 0; r < 2; r++) {
        const mf_mat w = mf_mat_fp8_block(codes, 32, 16, S, MF_F32, 16, 16, rounds[r]);
        uint32_t values[32 * 16];
        for (int i = 0; i < 32 * 16; i++) {
            const float v = (float)((float)mf_f8e4m3_to_f64(codes[i]) * S[i / (16 * 16)]);
            mf_store_from_f64(values, rounds[r], i, v);
        }
        const mf_mat copy = mf_mat_rows(values, rounds[r], 32, 16);
        float *a = activations(7, 16, MF_BF16, 11), got[7 * 32], want[7 * 32];
        int ran = 0;
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
            if (!mf_gemm_force_path(paths[p])) continue;
            ran++;
            mf_gemm_f32(7, a, 16, &w, got, 32, 1, MF_TRI_NONE);
            mf_gemm_f32(7, a, 16, &copy, want, 32, 1, MF_TRI_NONE);
            const qcase c = {32, 16, 16, 16, MF_WQ_FP8_BLOCK, MF_F32, rounds[r]};
            assert_same_f32(got, want, 7 * 32, mf_gemm_kernel_name(), &c);
            int nans = 0;
            for (int i = 0; i < 7 * 32; i++) nans += isnan(got[i]);
            cr_assert_eq(nans, 7 * 4, "the rows holding 0x7f and 0xff give NaN, the others do not");
        }
        cr_assert_geq(ran, 1);
        mf_gemm_force_path(MF_GEMM_PATH_AUTO);
        free(a);
    }
}
