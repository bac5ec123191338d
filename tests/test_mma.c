/* Matrix-instruction models: cases worked out by hand from the rules of
 * docs/numerics.md ("The instruction models"), the emulated GEMM against chained single instructions,
 * and (test_mma_vectors) vectors from MMA-Sim and from the H200. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_numerics.h"
#include "testutil.h"

static uint64_t f32b(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static mf_mma_instr lookup(const char *arch, const char *name) {
    mf_mma_instr I;
    mf_error err = {0};
    cr_assert_eq(mf_mma_lookup(&I, arch, name, &err), MF_OK, "%s", err.msg);
    return I;
}

/* k = 16 bf16 products a_i * b_i with a = {1, x, 0...}, b = {1, 1, 0...}. */
static uint32_t dot16(const mf_mma_instr *I, uint16_t a1, float c) {
    uint64_t a[16] = {0x3f80, a1}, b[16] = {0x3f80, 0x3f80};
    return (uint32_t)mf_mma_dot(I, a, b, 1, f32b(c));
}

Test(mma, nvidia_truncates_terms_then_rounds_toward_zero) {
    mf_mma_instr h = lookup("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32");
    cr_assert_eq(h.frac_bits, 25);
    /* 1 - 2^-26: the small term is below 2^-25 relative to E = 0 and is truncated away */
    cr_assert_eq(dot16(&h, 0xb280 /* -2^-26 */, 0.0f), 0x3f800000u);
    /* 1 - 2^-25 survives truncation; the exact sum rounds toward zero to 1 - 2^-24 */
    cr_assert_eq(dot16(&h, 0xb300 /* -2^-25 */, 0.0f), 0x3f7fffffu);
    /* f16 products {1, -2^-24}: Volta keeps 23 bits and truncates the small
     * term away; Hopper keeps 25 and gets 1 - 2^-24, exact in fp32 */
    mf_mma_instr v = lookup("Volta", "mma.m8n8k4.f32.f16.f16.f32");
    uint64_t a[4] = {0x3c00, 0x8001 /* -2^-24 */}, b[4] = {0x3c00, 0x3c00};
    cr_assert_eq(v.frac_bits, 23);
    cr_assert_eq((uint32_t)mf_mma_dot(&v, a, b, 1, 0), 0x3f800000u);
    mf_mma_instr hf = lookup("Hopper", "mma.m16n8k16.f32.f16.f16.f32");
    uint64_t a16[16] = {0x3c00, 0x8001}, b16[16] = {0x3c00, 0x3c00};
    cr_assert_eq((uint32_t)mf_mma_dot(&hf, a16, b16, 1, 0), 0x3f7fffffu);
}

Test(mma, cdna3_rounds_the_accumulator_down) {
    mf_mma_instr c3 = lookup("CDNA3", "mfma_f32_16x16x16_bf16");
    mf_mma_instr h = lookup("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32");
    /* products {1}, c = -2^-30. CDNA3: c is rounded DOWN to 24 bits relative
     * to E = 0, i.e. to -2^-24, and 1 - 2^-24 is exact in fp32. Hopper
     * truncates c toward zero (to 0) and returns 1. */
    cr_assert_eq(dot16(&c3, 0x0000, -0x1p-30f), 0x3f7fffffu);
    cr_assert_eq(dot16(&h, 0x0000, -0x1p-30f), 0x3f800000u);
    /* and for a positive c the two agree */
    cr_assert_eq(dot16(&c3, 0x0000, 0x1p-30f), 0x3f800000u);
}

Test(mma, special_values) {
    mf_mma_instr h = lookup("Hopper", "wgmma.m64n8k16.f32.bf16.bf16");
    cr_assert_eq(dot16(&h, 0x7f80 /* +inf */, 1.0f), 0x7f800000u);
    cr_assert_eq(dot16(&h, 0x7f80, -INFINITY), 0x7fffffffu, "inf - inf is NaN, 0x7fffffff on NVIDIA");
    uint64_t a[16] = {0x7f80}, b[16] = {0x0000};
    cr_assert_eq((uint32_t)mf_mma_dot(&h, a, b, 1, 0), 0x7fffffffu, "inf * 0");
    mf_mma_instr c3 = lookup("CDNA3", "mfma_f32_32x32x8_bf16");
    cr_assert_eq(c3.group, 8);
    uint64_t big_a[8] = {0x7f00 /* 2^127 */, 0x7f00}, big_b[8] = {0x4000 /* 2 */, 0xc000};
    cr_assert_eq((uint32_t)mf_mma_dot(&c3, big_a, big_b, 1, 0), 0x7fc00000u,
                 "CDNA3: products of magnitude >= 2^128 of both signs give NaN, though the exact sum is 0");
}

Test(mma, instruction_table) {
    mf_mma_instr a = lookup("Ampere", "mma.m16n8k16.f32.f16.f16.f32");
    cr_assert_eq(a.halves, 2);
    cr_assert_eq(a.frac_bits, 24);
    cr_assert_eq(lookup("Hopper", "mma.m16n8k16.f32.f16.f16.f32").halves, 1);
    mf_mma_instr f8 = lookup("Hopper", "wgmma.m64n8k32.f32.e4m3.e4m3");
    cr_assert(f8.frac_bits == 13 && f8.out_frac == 13);
    mf_mma_instr x = lookup("CDNA3", "mfma_f32_16x16x8_xf32");
    cr_assert(x.kind == MF_MMA_AMD_GROUPED && x.group == 4 && x.a_fmt == MF_FMT_TF32);
    mf_mma_instr p = lookup("CDNA3", "mfma_f32_16x16x32_fp8_bf8");
    cr_assert(p.interleave && p.group == 16 && p.a_fmt == MF_FMT_E4M3FNUZ && p.b_fmt == MF_FMT_E5M2FNUZ);
    mf_mma_instr c2 = lookup("CDNA2", "mfma_f32_32x32x8bf16_1k");
    cr_assert(c2.kind == MF_MMA_AMD_PAIRWISE && c2.group == 4 && c2.flush);
    mf_mma_instr c1 = lookup("CDNA1", "mfma_f32_32x32x4bf16");
    cr_assert(c1.group == 2 && !c1.flush);
    mf_mma_instr I;
    mf_error err = {0};
    cr_assert_neq(mf_mma_lookup(&I, "Hopper", "mma.m16n8k16.f32.q4.q4.f32", &err), MF_OK);
    cr_assert_neq(mf_mma_lookup(&I, "Pascal", "mma.m16n8k16.f32.bf16.bf16.f32", &err), MF_OK);
}

/* The emulated GEMM is the chain of the instruction over K: compare with
 * tiles run one after another, C carried through. */
static void gemm_vs_tiles(const char *arch, const char *name, int acc) {
    mf_kschedule s = {.instr = lookup(arch, name), .acc = acc, .split = 1, .reduce = MF_REDUCE_SEQ};
    const mf_mma_instr *I = &s.instr;
    const int M = I->m, N = I->n, steps = 6, K = I->k * steps;
    mf_rng r;
    mf_rng_seed(&r, 77);
    uint64_t A[M * K], B[K * N], C0[M * N], G[M * N];
    for (int i = 0; i < M * K; i++) A[i] = mf_f64_to_bf16(ldexp(mf_rng_normal(&r), (int)(mf_rng_next(&r) % 20) - 10));
    for (int i = 0; i < K * N; i++) B[i] = mf_f64_to_bf16(mf_rng_normal(&r));
    for (int i = 0; i < M * N; i++) C0[i] = f32b((float)mf_rng_normal(&r));
    mf_emu_gemm(&s, M, N, K, A, B, C0, G, 2);
    /* by hand: acc chains over the k-steps dealt round-robin, then added in order */
    uint64_t acc_tiles[4][M * N];
    for (int q = 0; q < acc; q++)
        for (int i = 0; i < M * N; i++) acc_tiles[q][i] = q == 0 ? C0[i] : 0;
    uint64_t At[M * I->k], Bt[I->k * N], D[M * N];
    for (int t = 0; t < steps; t++) {
        for (int i = 0; i < M; i++) memcpy(At + i * I->k, A + i * K + t * I->k, sizeof(uint64_t) * I->k);
        memcpy(Bt, B + t * I->k * N, sizeof(uint64_t) * I->k * N);
        mf_mma_tile(I, At, Bt, acc_tiles[t % acc], D);
        memcpy(acc_tiles[t % acc], D, sizeof D);
    }
    for (int i = 0; i < M * N; i++) {
        float sum, v;
        memcpy(&sum, &acc_tiles[0][i], 4);
        for (int q = 1; q < acc; q++) {
            uint32_t u = (uint32_t)acc_tiles[q][i];
            memcpy(&v, &u, 4);
            sum += v;
        }
        cr_assert_eq((uint32_t)G[i], f32b(sum), "%s acc=%d element %d", name, acc, i);
    }
}

Test(emu_gemm, equals_chained_instructions) {
    gemm_vs_tiles("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32", 1);
    gemm_vs_tiles("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32", 2);
    gemm_vs_tiles("Ampere", "mma.m16n8k16.f32.bf16.bf16.f32", 1);
    gemm_vs_tiles("CDNA3", "mfma_f32_16x16x16_bf16", 1);
    gemm_vs_tiles("CDNA3", "mfma_f32_32x32x8_bf16", 4);
}

/* The fast emulated GEMM (AVX2 and portable) equals the reference model on
 * every element, for operands with wide exponent spreads, cancellation,
 * subnormals, and a few infinities and NaNs. */
static uint64_t random_operand(mf_rng *r, mf_fmt f, int style) {
    double v = mf_rng_normal(r);
    if (style == 1) v = ldexp(v, (int)(mf_rng_next(r) % 60) - 30);
    if (style == 2) v = ldexp(v, (int)(mf_rng_next(r) % 40) - (f == MF_FMT_F16 ? 30 : 140));   /* subnormals */
    if (style == 3 && mf_rng_next(r) % 97 == 0) v = (mf_rng_next(r) & 1) ? INFINITY : NAN;
    if (style == 4) v = ldexp(v, (int)(mf_rng_next(r) % 250) - 125);   /* near overflow for bf16 */
    return f == MF_FMT_BF16 ? mf_f64_to_bf16(v) : mf_f64_to_f16(v);
}

static void fast_vs_reference_z(const char *arch, const char *name, int acc, int split, mf_reduce red, bool hw_zero) {
    mf_kschedule s = {.instr = lookup(arch, name), .acc = acc, .split = split, .reduce = red};
    s.instr.zero_products_excluded = hw_zero;
    const int M = 9, N = 13, K = s.instr.k * 8;
    const mf_fmt f = s.instr.a_fmt;
    uint64_t *A = malloc(8 * M * K), *B = malloc(8 * K * N), *C0 = malloc(8 * M * N), *R = malloc(8 * M * N),
             *G = malloc(8 * M * N);
    cr_assert(A && B && C0 && R && G);
    for (int style = 0; style < 5; style++) {
        if (style == 4 && f == MF_FMT_F16) continue;
        mf_rng r;
        mf_rng_seed(&r, (uint64_t)(style * 1000 + acc * 10 + split));
        for (int i = 0; i < M * K; i++) A[i] = (style == 2 && i % 3 == 0) ? 0 : random_operand(&r, f, style);
        for (int i = 0; i < K * N; i++) B[i] = random_operand(&r, f, style % 4);
        for (int i = 0; i < M * N; i++) {
            double c = mf_rng_normal(&r);
            if (style == 2) c = ldexp(c, -135);
            if (style == 0 && i % 7 == 0) c = -0.0;
            C0[i] = f32b((float)c);
        }
        mf_emu_gemm_reference(&s, M, N, K, A, B, C0, R, 1);
        for (int portable = 0; portable < 2; portable++) {
            mf_emu_force_portable(portable);
            mf_emu_gemm(&s, M, N, K, A, B, C0, G, 2);
            for (int i = 0; i < M * N; i++)
                cr_assert_eq((uint32_t)G[i], (uint32_t)R[i], "%s acc %d split %d style %d %s: element %d %08x vs reference %08x",
                             name, acc, split, style, portable ? "portable" : "avx2", i, (uint32_t)G[i], (uint32_t)R[i]);
        }
        mf_emu_force_portable(false);
    }
    free(A); free(B); free(C0); free(R); free(G);
}

static void fast_vs_reference(const char *arch, const char *name, int acc, int split, mf_reduce red) {
    fast_vs_reference_z(arch, name, acc, split, red, false);
}

Test(emu_gemm, fast_path_equals_reference) {
    fast_vs_reference_z("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32", 1, 1, MF_REDUCE_SEQ, true);   /* the H200's zero rule */
    fast_vs_reference("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("Hopper", "wgmma.m64n8k16.f32.f16.f16", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("Ampere", "mma.m16n8k16.f32.bf16.bf16.f32", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("Volta", "mma.m8n8k4.f32.f16.f16.f32", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("CDNA3", "mfma_f32_16x16x16_bf16", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("CDNA3", "mfma_f32_32x32x8_f16", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32", 3, 2, MF_REDUCE_TREE);
    fast_vs_reference("CDNA3", "mfma_f32_32x32x8_bf16", 2, 4, MF_REDUCE_SEQ);
    fast_vs_reference("CDNA2", "mfma_f32_32x32x8bf16_1k", 1, 1, MF_REDUCE_SEQ);   /* pairwise trees, flushing */
    fast_vs_reference("CDNA2", "mfma_f32_32x32x8f16", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("CDNA1", "mfma_f32_32x32x4bf16", 1, 1, MF_REDUCE_SEQ);      /* groups of 2, no flushing */
}

/* ---- vectors from MMA-Sim and from the H200 ------------------------------ */

#include <jansson.h>

static uint64_t hex(json_t *v) { return strtoull(json_string_value(v), NULL, 16); }

/* Runs every case of a JSON-lines file (xz or plain) through the models;
 * returns the number of elements checked. */
static size_t check_vectors(const char *path) {
    char *text;
    size_t len;
    mf_error err = {0};
    cr_assert_eq(mf_read_file(path, &text, &len, &err), MF_OK, "%s", err.msg);
    size_t elements = 0;
    int line = 0;
    char *save = NULL;
    for (char *p = strtok_r(text, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
        line++;
        json_t *o = json_loads(p, 0, NULL);
        cr_assert(o, "%s:%d: not JSON", path, line);
        mf_mma_instr I;
        const char *arch = json_string_value(json_object_get(o, "arch")), *name = json_string_value(json_object_get(o, "instr"));
        cr_assert_eq(mf_mma_lookup(&I, arch, name, &err), MF_OK, "%s:%d: %s", path, line, err.msg);
        const char *src = json_string_value(json_object_get(o, "source"));
        I.zero_products_excluded = src && strstr(src, "h200");
        const size_t na = (size_t)I.m * I.k, nb = (size_t)I.k * I.n, nc = (size_t)I.m * I.n;
        uint64_t *A = malloc(8 * na), *B = malloc(8 * nb), *C = malloc(8 * nc), *D = malloc(8 * nc);
        cr_assert(A && B && C && D);
        for (size_t i = 0; i < na; i++) A[i] = hex(json_array_get(json_object_get(o, "A"), i));
        for (size_t i = 0; i < nb; i++) B[i] = hex(json_array_get(json_object_get(o, "B"), i));
        for (size_t i = 0; i < nc; i++) C[i] = hex(json_array_get(json_object_get(o, "C"), i));
        mf_mma_tile(&I, A, B, C, D);
        json_t *want = json_object_get(o, "D");
        for (size_t i = 0; i < nc; i++)
            cr_assert_eq(D[i], hex(json_array_get(want, i)), "%s:%d (%s %s %s): element %zu: %llx, expected %s", path, line,
                         arch, name, json_string_value(json_object_get(o, "style")), i, (unsigned long long)D[i],
                         json_string_value(json_array_get(want, i)));
        elements += nc;
        free(A); free(B); free(C); free(D);
        json_decref(o);
    }
    free(text);
    cr_log_info("%s: %d cases, %zu elements bit-exact", path, line, elements);
    return elements;
}

Test(mma_vectors, mmasim_every_architecture) {
    size_t n = 0;
    n += check_vectors(fixture("mma/mmasim_Volta.jsonl.xz"));
    n += check_vectors(fixture("mma/mmasim_Ampere.jsonl.xz"));
    n += check_vectors(fixture("mma/mmasim_Hopper.jsonl.xz"));
    n += check_vectors(fixture("mma/mmasim_CDNA3.jsonl.xz"));
    cr_assert_eq(n, 2560 + 12800 + 125440 + 168960);
}

Test(mma_vectors, h200_hardware, .timeout = 300) {
    size_t n = check_vectors(fixture("mma/h200_mma_m16n8k16_bf16.jsonl.xz"));
    n += check_vectors(fixture("mma/h200_mma_m16n8k16_f16.jsonl.xz"));
    n += check_vectors(fixture("mma/h200_wgmma_m64n8k16_bf16.jsonl.xz"));
    cr_assert_eq(n, 136192 + 136192 + 544768);
}

/* The MMA-Sim sample (36 cases over Volta, Ampere, Hopper and CDNA3; tests/fixtures/mma/README.md): every
 * element of every case. */
Test(mma_vectors, mmasim_sample) {
    cr_assert_eq(check_vectors(fixture("mma/mma_sample_vectors.jsonl.xz")), 12032);
}

/* The zero rule the H200 shows: a = {0, x}, b = {2^100, 1} with
 * x = 2^-60 * (1 + 2^-7). MMA-Sim gives the zero product the exponent
 * -126 + 100 = -26, so x is truncated to 25 bits below 2^-26: to nothing.
 * The H200 leaves the zero product out; x alone is exact. */
Test(mma, zero_products_and_the_largest_exponent) {
    mf_mma_instr h = lookup("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32");
    uint64_t a[16] = {0x0000, 0x2181}, b[16] = {0x7180, 0x3f80};
    cr_assert_eq((uint32_t)mf_mma_dot(&h, a, b, 1, 0), 0u, "MMA-Sim's convention");
    h.zero_products_excluded = true;
    cr_assert_eq((uint32_t)mf_mma_dot(&h, a, b, 1, 0), f32b(0x1p-60f * (1.0f + 0x1p-7f)), "the H200");
}

/* cuBLAS on the H200 (tools/cublas_vs_emu.py, bench/README.md): split-K
 * kernels are emu:hopper chains over contiguous ranges of 64-wide K tiles,
 * ceil(tiles / S) each, added in order. A few rows and columns of four such
 * products, with the GPU's outputs (tests/fixtures/cublas). */
Test(emu_gemm, cublas_split_k_on_the_h200) {
    char *text;
    size_t len;
    mf_error err = {0};
    cr_assert_eq(mf_read_file(fixture("cublas/h200_splitk.jsonl.xz"), &text, &len, &err), MF_OK, "%s", err.msg);
    int cases = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), cases++) {
        json_t *o = json_loads(line, 0, NULL);
        cr_assert(o);
        const int K = (int)json_integer_value(json_array_get(json_object_get(o, "shape"), 2));
        const int R = (int)json_array_size(json_object_get(o, "rows")), Cn = (int)json_array_size(json_object_get(o, "cols"));
        mf_numerics n;
        cr_assert_eq(mf_numerics_parse(&n, json_string_value(json_object_get(o, "schedule")), &err), MF_OK, "%s", err.msg);
        uint64_t *A = malloc(8 * (size_t)R * K), *B = malloc(8 * (size_t)K * Cn), *C = malloc(8 * (size_t)R * Cn);
        cr_assert(A && B && C);
        for (int i = 0; i < R * K; i++) A[i] = hex(json_array_get(json_object_get(o, "A"), (size_t)i));
        for (int i = 0; i < K * Cn; i++) B[i] = hex(json_array_get(json_object_get(o, "B"), (size_t)i));
        mf_emu_gemm(&n.bf16, R, Cn, K, A, B, NULL, C, 2);
        for (int i = 0; i < R * Cn; i++)
            cr_assert_eq((uint32_t)C[i], (uint32_t)hex(json_array_get(json_object_get(o, "C"), (size_t)i)), "%s, %s: element %d",
                         json_string_value(json_object_get(o, "call")), n.name, i);
        /* and the plain chain does not produce these bits: the schedule matters */
        mf_numerics plain;
        cr_assert_eq(mf_numerics_parse(&plain, "emu:hopper", &err), MF_OK, "%s", err.msg);
        mf_emu_gemm(&plain.bf16, R, Cn, K, A, B, NULL, C, 2);
        int same = 0;
        for (int i = 0; i < R * Cn; i++) same += (uint32_t)C[i] == (uint32_t)hex(json_array_get(json_object_get(o, "C"), (size_t)i));
        cr_assert_lt(same, R * Cn);
        free(A); free(B); free(C);
        json_decref(o);
    }
    cr_assert_eq(cases, 4);
    free(text);
}
