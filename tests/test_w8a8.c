/* fp8=w8a8 (numerics/w8a8.c): FP8 weights times activations quantised to e4m3, DeepSeek-V3's recipe on Hopper.
 *
 * The quantiser against values worked by hand from the e4m3 format (OCP 8-bit floating point spec: bias 7, 3
 * fraction bits, subnormals m x 2^-9, 448 the largest finite value); one FP8 linear against a reference written
 * here from the single-instruction model (mf_mma_dot of wgmma.m64n8k32.f32.e4m3.e4m3) and plain fp32 code, bit
 * for bit; a whole trace of the deepseek_v3_fp8 fixture against transformers' float64 logits; the refusals. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_numerics.h"
#include "mf_runtime.h"
#include "mf_trace.h"
#include "testutil.h"

/* ---- the activation quantiser ------------------------------------------ */

Test(w8a8, e4m3_rounding_by_hand) {
    /* normal values: (1 + m/8) 2^(e - 7) is bits e << 3 | m */
    cr_assert_eq(mf_f32_to_f8e4m3_sat(1.0f), 0x38);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(-3.0f), 0xc4);              /* -1.5 x 2^1: sign, e = 8, m = 4 */
    cr_assert_eq(mf_f32_to_f8e4m3_sat(448.0f), 0x7e);             /* 1.75 x 2^8, the largest finite */
    /* ties to even: 1 + 1/16 lies between 1 (m = 0) and 1.125 (m = 1); 1 + 3/16 between m = 1 and 2 */
    cr_assert_eq(mf_f32_to_f8e4m3_sat(1.0625f), 0x38);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(1.1875f), 0x3a);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(1.0625001f), 0x39);          /* just past the tie */
    /* a tie that carries into the next binade: 1.9375 between 1.875 (m = 7) and 2 -> 2 (e = 8, m = 0) */
    cr_assert_eq(mf_f32_to_f8e4m3_sat(1.9375f), 0x40);
    /* saturation: past 448 (RNE would give 480, which e4m3fn does not have) is 448 */
    cr_assert_eq(mf_f32_to_f8e4m3_sat(464.0f), 0x7e);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(500.0f), 0x7e);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(-1e30f), 0xfe);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(INFINITY), 0x7e);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(NAN), 0x7f);
    /* subnormals, m x 2^-9: 2^-9 is 1; 1.5 x 2^-9 ties to 2; 2.5 x 2^-9 to 2; 0.5 x 2^-9 to 0; 7.5 x 2^-9 to the
     * smallest normal 2^-6 (bits 0x08) */
    cr_assert_eq(mf_f32_to_f8e4m3_sat(0x1p-9f), 0x01);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(3 * 0x1p-10f), 0x02);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(5 * 0x1p-10f), 0x02);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(0x1p-10f), 0x00);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(-0x1p-10f), 0x80);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(15 * 0x1p-10f), 0x08);
    cr_assert_eq(mf_f32_to_f8e4m3_sat(0x1p-6f), 0x08);
}

Test(w8a8, group_scale_is_max_over_448) {
    /* max |x| = 448: the scale is exactly 1 and the codes are x's own */
    const float x[] = {448, 1, -3, 1.0625f, 0x1p-9f, 3 * 0x1p-10f, 0x1p-10f, 15 * 0x1p-10f};
    const uint8_t want[] = {0x7e, 0x38, 0xc4, 0x38, 0x01, 0x02, 0x00, 0x08};
    uint8_t q[8];
    cr_assert_eq(mf_w8a8_quant(x, 8, q), 1.0f);
    for (int i = 0; i < 8; i++) cr_assert_eq(q[i], want[i], "x[%d] = %a: code %#x, want %#x", i, x[i], q[i], want[i]);
    /* max |x| = 1: the scale is fp32(1 / 448); 1 / s lands next to 448 and stays 448 (0x7e), -0.5 / s is next to
     * -224 = -1.75 x 2^7 (0xf6) and 0.25 / s next to 112 = 1.75 x 2^6 (0x6e), far from any rounding boundary */
    const float y[] = {0.25f, -0.5f, 1.0f, -1.0f};
    const float s = mf_w8a8_quant(y, 4, q);
    cr_assert_eq(s, 1.0f / 448.0f);
    cr_assert_eq(q[0], 0x6e);
    cr_assert_eq(q[1], 0xf6);
    cr_assert_eq(q[2], 0x7e);
    cr_assert_eq(q[3], 0xfe);
    /* a row of zeros: vLLM's floor on the maximum, 1e-10, gives the scale, and every code is zero */
    const float z[5] = {0};
    memset(q, 0xaa, sizeof q);
    cr_assert_eq(mf_w8a8_quant(z, 5, q), 1e-10f / 448.0f);
    for (int i = 0; i < 5; i++) cr_assert_eq(q[i], 0);
}

/* ---- one linear, against the instruction model and plain fp32 ------------ */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* e4m3 bits of v (|v| <= 448) by search over every code's value: the nearest, a tie to the even code */
static uint8_t e4m3_by_search(double v) {
    uint8_t best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 0x7f; c++) {
        const double d = fabs(fabs(v) - mf_f8e4m3_to_f64((uint8_t)c));
        if (d < bd || (d == bd && !(c & 1))) bd = d, best = (uint8_t)c;
    }
    return (uint8_t)(best | (signbit(v) ? 0x80 : 0));
}

typedef struct lcase {
    int M, N, K, bn, bk;
    mf_dtype out;   /* F32 shows the accumulator's every bit; BF16 is what a bf16 model stores */
} lcase;

static void check_linear(lcase lc, uint64_t seed) {
    const int M = lc.M, N = lc.N, K = lc.K, bn = lc.bn, bk = lc.bk;
    const int nbn = (N + bn - 1) / bn, nbk = (K + bk - 1) / bk;
    uint8_t *codes = malloc((size_t)N * K);
    float *S = malloc(sizeof(float) * (size_t)nbn * nbk), *a = malloc(sizeof(float) * (size_t)M * K);
    for (int i = 0; i < N * K; i++) {
        uint8_t c = (uint8_t)rng_next(&seed);
        codes[i] = (c & 0x7f) == 0x7f ? 0x3c : c;   /* no NaN codes */
    }
    for (int i = 0; i < nbn * nbk; i++) S[i] = ldexpf(1.0f + (float)(rng_next(&seed) % 1000) / 1000, -8 - (int)(rng_next(&seed) % 4));
    for (int i = 0; i < M * K; i++) {   /* bf16 values of spread magnitudes */
        const double v = ((double)(rng_next(&seed) % 20001) - 10000) / 10000 * ldexp(1, (int)(rng_next(&seed) % 9) - 4);
        a[i] = mf_bf16_to_f32(mf_f32_to_bf16((float)v));
    }
    for (int k = 0; k < K; k++) a[(size_t)(M - 1) * K + k] = 0;   /* the last row: zeros */
    mf_error err = {0};
    mf_numerics num;
    cr_assert_eq(mf_numerics_parse(&num, "emu:hopper:fp8=w8a8", &err), MF_OK, "%s", err.msg);
    mf_linear L = {.out = N, .in = K, .w = mf_mat_fp8_block(codes, N, K, S, MF_F32, bn, bk, MF_BF16)};
    mf_mm mm = {.compute = MF_F32, .out = lc.out, .threads = 2, .numerics = &num, .in = MF_BF16};
    float *y = malloc(sizeof(float) * (size_t)M * N);
    mf_linear_apply_f32(&mm, &L, a, M, y);

    /* the reference: quantise in double (exact for these steps) with the fp32 roundings the recipe makes, the
     * instruction from its table, chained 32 codes at a time over each block (zeros past the block's end) */
    mf_mma_instr I;
    cr_assert_eq(mf_mma_lookup(&I, "Hopper", "wgmma.m64n8k32.f32.e4m3.e4m3", &err), MF_OK, "%s", err.msg);
    I.zero_products_excluded = true;   /* as the H200 computes (docs/numerics.md) */
    uint64_t qa[32], qw[32];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int b = 0; b < nbk; b++) {
                const int k0 = b * bk, k1 = k0 + bk < K ? k0 + bk : K;
                double amax = 0;
                for (int k = k0; k < k1; k++) amax = fmax(amax, fabs(a[(size_t)i * K + k]));
                const float s = (float)(fmax(amax, 1e-10f) / 448);
                uint32_t p = 0;
                for (int t = k0; t < k0 + (bk + 31) / 32 * 32; t += 32) {
                    for (int u = 0; u < 32; u++) {
                        const int k = t + u;
                        const bool in = k < k1;
                        const double xs = in ? (double)(float)((double)a[(size_t)i * K + k] / s) : 0;
                        qa[u] = in ? e4m3_by_search(fmax(-448, fmin(448, xs))) : 0;
                        qw[u] = in ? codes[(size_t)j * K + k] : 0;
                    }
                    p = (uint32_t)mf_mma_dot(&I, qa, qw, 1, p);
                }
                float pf;
                memcpy(&pf, &p, 4);
                acc = fmaf(pf, s * S[(j / bn) * nbk + b], acc);
            }
            const float want = lc.out == MF_BF16 ? mf_bf16_to_f32(mf_f32_to_bf16(acc)) : acc;
            cr_assert_eq(memcmp(&y[(size_t)i * N + j], &want, 4), 0, "M %d N %d K %d block %dx%d: y[%d][%d] = %a, want %a",
                         M, N, K, bn, bk, i, j, y[(size_t)i * N + j], want);
            if (i == M - 1) cr_assert_eq(want, 0.0f, "a zero row gives zeros");
        }
    free(codes);
    free(S);
    free(a);
    free(y);
}

Test(w8a8, linear_equals_the_instruction_chain_and_fp32_promotion) {
    for (int o = 0; o < 2; o++) {
        const mf_dtype out = o ? MF_BF16 : MF_F32;
        check_linear((lcase){.M = 4, .N = 7, .K = 300, .bn = 128, .bk = 128, .out = out}, 7);   /* 300 = 2 x 128 + 44 */
        check_linear((lcase){.M = 3, .N = 20, .K = 64, .bn = 16, .bk = 16, .out = out}, 11);    /* the fixture's blocks */
        check_linear((lcase){.M = 2, .N = 5, .K = 1024, .bn = 2, .bk = 128, .out = out}, 13);
    }
}

/* The 13-bit tensor-core sums matter: a block's partial is not the exact sum of its products. */
Test(w8a8, promotion_keeps_what_the_instructions_kept) {
    const int K = 128;
    uint8_t codes[128];
    float S = 1, a[128];
    /* weights all 1 (0x38); activations 448 (max |x| = 448: scale 1, code 0x7e) and 127 of 2^-9 (code 0x01, the
     * smallest subnormal): products 448 and 127 x 2^-9; relative to 448 = 1.75 x 2^8, 13 bits reach 2^-5, so
     * every 2^-9 is cut */
    a[0] = 448;
    for (int k = 0; k < K; k++) codes[k] = 0x38, a[k] = k ? 0x1p-9f : 448;
    mf_error err = {0};
    mf_numerics num;
    cr_assert_eq(mf_numerics_parse(&num, "emu:hopper:fp8=w8a8", &err), MF_OK, "%s", err.msg);
    mf_linear L = {.out = 1, .in = K, .w = mf_mat_fp8_block(codes, 1, K, &S, MF_F32, 128, 128, MF_F32)};
    mf_mm mm = {.compute = MF_F32, .out = MF_F32, .threads = 1, .numerics = &num, .in = MF_F32};
    float y;
    mf_linear_apply_f32(&mm, &L, a, 1, &y);
    cr_assert_eq(y, 448.0f, "the fp8 instruction's 13 bits drop 127 x 2^-9: %a", y);
    /* the same weights widened and run as fp32 keep them */
    mf_mm plain = {.compute = MF_F32, .out = MF_F32, .threads = 1, .numerics = NULL, .in = MF_F32};
    mf_linear_apply_f32(&plain, &L, a, 1, &y);
    cr_assert_eq(y, 448.0f + 127 * 0x1p-9f);
}

/* ---- the same linear on an H200 ------------------------------------------- */

static uint64_t hexv(const json_t *a, size_t i) { return strtoull(json_string_value(json_array_get(a, i)), NULL, 16); }

static float hexf(const json_t *a, size_t i) {
    const uint32_t u = (uint32_t)hexv(a, i);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* DeepSeek-V3's recipe run on the GPU (tools/mma_probe_fp8.cuh, tests/fixtures/mma/README.md): the activations
 * quantised per token per 128 by a CUDA kernel (cvt.rn.satfinite.e4m3x2.f32), the per-block chains of four
 * wgmma.m64n8k32.f32.e4m3.e4m3 from scale-d 0, the fma promotion; the model's codes, scales and every output bit
 * against the card's. */
Test(w8a8, h200_linear_bit_for_bit, .timeout = 120) {
    size_t outputs = 0, codes = 0, idx;
    mf_error err = {0};
    const char *path = fixture("mma/h200_w8a8_linear.jsonl.xz");
    mf_numerics num;
    cr_assert_eq(mf_numerics_parse(&num, "emu:hopper:fp8=w8a8", &err), MF_OK, "%s", err.msg);
    json_t *rows = read_jsonl(path), *o;
    json_array_foreach(rows, idx, o) {
        const int line = (int)idx + 1;
        const int M = (int)json_integer_value(json_object_get(o, "M")), N = (int)json_integer_value(json_object_get(o, "N")),
                  K = (int)json_integer_value(json_object_get(o, "K")), bn = (int)json_integer_value(json_object_get(o, "bn")),
                  bk = (int)json_integer_value(json_object_get(o, "bk"));
        cr_assert(M > 0 && N > 0 && K > 0 && bk == 128 && bn == 128 && K % bk == 0, "%s:%d: shape", path, line);
        const int nb = K / bk, nbn = (N + bn - 1) / bn;
        const json_t *X = json_object_get(o, "X"), *W = json_object_get(o, "W"), *WS = json_object_get(o, "WS"),
                     *QA = json_object_get(o, "QA"), *SA = json_object_get(o, "SA"), *Y = json_object_get(o, "Y");
        cr_assert(json_array_size(X) == (size_t)M * K && json_array_size(W) == (size_t)N * K &&
                  json_array_size(WS) == (size_t)nbn * nb && json_array_size(QA) == (size_t)M * K &&
                  json_array_size(SA) == (size_t)M * nb && json_array_size(Y) == (size_t)M * N, "%s:%d: sizes", path, line);
        float *x = malloc(sizeof(float) * (size_t)M * K), *ws = malloc(sizeof(float) * (size_t)nbn * nb);
        float *y = malloc(sizeof(float) * (size_t)M * N);
        uint8_t *w = malloc((size_t)N * K), q[128];
        cr_assert(x && ws && y && w);
        for (size_t i = 0; i < (size_t)M * K; i++) x[i] = hexf(X, i);
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = (uint8_t)hexv(W, i);
        for (size_t i = 0; i < (size_t)nbn * nb; i++) ws[i] = hexf(WS, i);
        /* the quantiser: every code and scale */
        for (int i = 0; i < M; i++)
            for (int b = 0; b < nb; b++) {
                const float s = mf_w8a8_quant(x + (size_t)i * K + (size_t)b * bk, bk, q), gs = hexf(SA, (size_t)i * nb + b);
                cr_assert_eq(memcmp(&s, &gs, 4), 0, "%s:%d: row %d block %d: scale %a, the H200's %a", path, line, i, b, s, gs);
                for (int kk = 0; kk < bk; kk++)
                    cr_assert_eq(q[kk], hexv(QA, (size_t)i * K + (size_t)b * bk + kk), "%s:%d: x[%d][%d] = %a: code %#x, the H200's %#llx",
                                 path, line, i, b * bk + kk, x[(size_t)i * K + b * bk + kk], q[kk],
                                 (unsigned long long)hexv(QA, (size_t)i * K + (size_t)b * bk + kk));
                codes += (size_t)bk;
            }
        /* the linear, through the layer code an FP8 checkpoint runs */
        mf_linear L = {.out = N, .in = K, .w = mf_mat_fp8_block(w, N, K, ws, MF_F32, bn, bk, MF_F32)};
        mf_mm mm = {.compute = MF_F32, .out = MF_F32, .threads = 2, .numerics = &num, .in = MF_F32};
        mf_linear_apply_f32(&mm, &L, x, M, y);
        for (size_t i = 0; i < (size_t)M * N; i++) {
            const uint32_t want = (uint32_t)hexv(Y, i);
            uint32_t got;
            memcpy(&got, &y[i], 4);
            cr_assert_eq(got, want, "%s:%d (%s): y[%zu][%zu] = %08x, the H200's %08x", path, line,
                         json_string_value(json_object_get(o, "style")), i / N, i % N, got, want);
        }
        outputs += (size_t)M * N;
        free(x); free(ws); free(y); free(w);
    }
    cr_log_info("%s: %zu linears, %zu codes and %zu outputs bit-exact", path, json_array_size(rows), codes, outputs);
    cr_assert_eq(json_array_size(rows), 3);
    json_decref(rows);
    cr_assert_eq(outputs, ((size_t)8 * 136 + 8 * 16 + 8 * 16));
}

/* ---- a whole model --------------------------------------------------------- */

typedef struct trace_err {
    double rel;        /* max |ours - HF fp64| / max |HF fp64| over every logit */
    double *logits;    /* every sequence's, one after the other */
    size_t n;
} trace_err;

static trace_err trace_fixture(const char *numerics) {
    char dir[4096], ref[4200], tok[4200];
    snprintf(dir, sizeof dir, "%s", fixture("hf26/deepseek_v3_fp8"));
    snprintf(ref, sizeof ref, "%s/ref.safetensors", dir);
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
    mf_error err = {0};
    mf_precision prec;
    mf_numerics num;
    cr_assert_eq(mf_precision_parse(&prec, "bf16", &err), MF_OK);
    cr_assert_eq(mf_numerics_parse(&num, numerics, &err), MF_OK, "%s", err.msg);
    mf_model *m;
    cr_assert_eq(mf_runtime_load(&m, dir, &prec, &err), MF_OK, "%s", err.msg);
    mf_prompts ps;
    cr_assert_eq(mf_prompts_load(&ps, tok, m->cfg.vocab, &err), MF_OK, "%s", err.msg);
    mf_run_opts o = {.prec = prec, .threads = 2, .numerics = &num};
    trace_err te = {0};
    double d = 0, hmax = 0;
    for (size_t s = 0; s < ps.n; s++) {
        mf_seq_result r;
        cr_assert_eq(mf_forward_cpu(m, &o, ps.seq[s].tokens, ps.seq[s].T, &r, &err), MF_OK, "%s", err.msg);
        char name[64];
        size_t n;
        snprintf(name, sizeof name, "logits_fp64_s%zu", s);
        double *hl = read_tensor(ref, name, &n);
        cr_assert_eq(n, (size_t)r.T * r.V);
        te.logits = realloc(te.logits, sizeof(double) * (te.n + n));
        for (size_t i = 0; i < n; i++) {
            d = fmax(d, fabs(r.logits[i] - hl[i]));
            hmax = fmax(hmax, fabs(hl[i]));
            te.logits[te.n + i] = r.logits[i];
        }
        te.n += n;
        free(hl);
        mf_seq_result_free(&r);
    }
    mf_prompts_free(&ps);
    mf_model_free(m);
    te.rel = d / hmax;
    return te;
}

/* The mode's logits against transformers' float64 run of the same checkpoint (its weights dequantised, its
 * activations never quantised). Measured: 0.165 of the largest logit, against 0.017 for the widened bf16 run;
 * with the same quantised codes multiplied exactly (fp64 sums per block, a local experiment) it was 0.158, so
 * nearly all of it is the activations' rounding to e4m3 (3 fraction bits: up to 2^-4 relative, in the 16-wide
 * groups of this fixture, in every one of its FP8 linears, routing moved by it at 5% of the slots), not the
 * 13-bit block sums. The bar, 0.25, is that with a margin: it catches a wrong scale or group (errors of order 1
 * or more), not the last digits, which the linear test above checks bit for bit. And the logits are not the
 * widened run's: the test fails if the mode changed nothing. */
Test(w8a8, fixture_trace_is_near_hf_fp64_and_not_the_widened_run) {
    trace_err q = trace_fixture("emu:hopper:fp8=w8a8");
    trace_err w = trace_fixture("emu:hopper");
    cr_assert_eq(q.n, w.n);
    size_t differ = 0;
    for (size_t i = 0; i < q.n; i++) differ += q.logits[i] != w.logits[i];
    cr_log_info("deepseek_v3_fp8 bf16 vs HF fp64: w8a8 logits rel %.4g, widened %.4g; %zu of %zu logits differ",
                q.rel, w.rel, differ, q.n);
    cr_expect_leq(q.rel, 0.25, "w8a8: max |ours - HF| / max |HF| = %g", q.rel);
    cr_expect_leq(w.rel, 0.05, "widened: %g", w.rel);
    cr_expect_gt(differ, q.n / 2, "only %zu of %zu logits differ from the widened run's", differ, q.n);
    free(q.logits);
    free(w.logits);
}

/* The manifest says what the FP8 products were. */
Test(w8a8, manifest_records_the_mode) {
    const char *dir = temp_dir();
    const char *run = make_run(dir, "q", "hf26/deepseek_v3_fp8", "--numerics emu:hopper:fp8=w8a8 --precision bf16");
    const char *wide = make_run(dir, "w", "hf26/deepseek_v3_fp8", "--numerics emu:hopper --precision bf16");
    char path[700];
    json_error_t je;
    snprintf(path, sizeof path, "%s/manifest.json", run);
    json_t *m = json_load_file(path, 0, &je);
    cr_assert(m, "%s", je.text);
    cr_assert_str_eq(json_string_value(json_object_get(m, "numerics")),
                     "emu:hopper:wgmma.m64n8k16.f32.bf16.bf16:acc=1:split=1:reduce=seq:fp8=w8a8");
    const char *fp8 = json_string_value(json_object_get(m, "fp8_products"));
    cr_assert(fp8 && !strncmp(fp8, "w8a8: ", 6) && strstr(fp8, "wgmma.m64n8k32.f32.e4m3.e4m3") && strstr(fp8, "1 x 16"),
              "%s", fp8 ? fp8 : "(none)");
    cr_assert_null(json_object_get(m, "numerics_validation"), "checked against the H200: no validation caveat");
    json_decref(m);
    snprintf(path, sizeof path, "%s/manifest.json", wide);
    m = json_load_file(path, 0, &je);
    cr_assert(m, "%s", je.text);
    fp8 = json_string_value(json_object_get(m, "fp8_products"));
    cr_assert(fp8 && !strncmp(fp8, "widened: ", 9), "%s", fp8 ? fp8 : "(none)");
    json_decref(m);
}

/* ---- refusals -------------------------------------------------------------- */

static void refused(const char *spec, const char *says) {
    mf_numerics n;
    mf_error err = {0};
    cr_assert_neq(mf_numerics_parse(&n, spec, &err), MF_OK, "%s was taken", spec);
    cr_assert(strstr(err.msg, says), "%s: \"%s\" does not say \"%s\"", spec, err.msg, says);
    cr_assert(!strchr(err.msg, '\n'), "one line: %s", err.msg);
}

Test(w8a8, refusals) {
    refused("emu:ampere:fp8=w8a8", "Ampere has no fp8 instruction");
    refused("emu:volta:fp8=w8a8", "Volta has no fp8 instruction");
    refused("emu:cdna3:fp8=w8a8", "CDNA3's FP8 GEMMs are not modelled");
    refused("emu:blackwell:fp8=w8a8", "Blackwell's FP8 GEMMs are not modelled");
    refused("emu:hopper:acc=2:fp8=w8a8", "takes no acc, split or tile");
    refused("emu:hopper:split=4:fp8=w8a8", "takes no acc, split or tile");
    refused("emu:hopper:fp8=w4a8", "fp8 takes widen or w8a8");
    refused("native:fp8=w8a8", "unknown numerics");
    /* fp8=widen is today's arithmetic, spelled as before */
    mf_numerics a, b;
    mf_error err = {0};
    cr_assert_eq(mf_numerics_parse(&a, "emu:hopper:fp8=widen", &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_numerics_parse(&b, "emu:hopper", &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(a.name, b.name);
    cr_assert_eq(a.fp8_products, MF_FP8_WIDEN);
    /* a checkpoint without FP8 weights: the trace says so once it has read the config (exit 1) */
    char msg[2048];
    const int rc = run_moeflip(msg, sizeof msg, "trace -q --model '%s' --input '%s/tokens.jsonl' --out '%s/x' "
                               "--numerics emu:hopper:fp8=w8a8", fixture("hf26/deepseek_v3"),
                               fixture("hf26/deepseek_v3"), temp_dir());
    cr_assert_eq(rc, 1, "exit %d: %s", rc, msg);
    cr_assert(strstr(msg, "fp8=w8a8 is for checkpoints with block-scaled FP8 weights"), "%s", msg);
}
