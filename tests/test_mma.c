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

/* ---- Blackwell and CDNA4 (docs/numerics.md): cases worked out by hand ---------------------------- */

/* fp8 products {1, 2^-7 * 2^-7}: tcgen05.mma and sm_120's mma keep 25 fraction bits, so 1 + 2^-14 is exact;
 * Hopper's wgmma and Ada's mma keep 13, and the small product is truncated away. */
Test(mma_blackwell, fp8_keeps_25_bits_where_hopper_keeps_13) {
    uint64_t a[32] = {0x38 /* 1 */, 0x04 /* 2^-7, subnormal */}, b[32] = {0x38, 0x04};
    mf_mma_instr tc = lookup("Blackwell", "tcgen05.mma.m64n8k32.f32.e4m3.e4m3");
    cr_assert(tc.frac_bits == 25 && tc.out_frac == 23 && tc.halves == 1);
    cr_assert_eq((uint32_t)mf_mma_dot(&tc, a, b, 1, 0), 0x3f800200u, "1 + 2^-14");
    mf_mma_instr rtx = lookup("RTX Blackwell", "mma.m16n8k32.f32.e4m3.e4m3.f32");
    cr_assert_eq(rtx.halves, 1);
    cr_assert_eq((uint32_t)mf_mma_dot(&rtx, a, b, 1, 0), 0x3f800200u);
    mf_mma_instr wg = lookup("Hopper", "wgmma.m64n8k32.f32.e4m3.e4m3");
    cr_assert_eq((uint32_t)mf_mma_dot(&wg, a, b, 1, 0), 0x3f800000u);
    mf_mma_instr ada = lookup("Ada", "mma.m16n8k32.f32.e4m3.e4m3.f32");
    cr_assert_eq((uint32_t)mf_mma_dot(&ada, a, b, 1, 0), 0x3f800000u);
    /* bf16 on sm_100 and sm_120: Hopper's fused sum, one k16 */
    mf_mma_instr bf = lookup("Blackwell", "tcgen05.mma.m64n8k16.f32.bf16.bf16");
    cr_assert(bf.kind == MF_MMA_NV_FUSED && bf.frac_bits == 25 && bf.k == 16 && bf.m == 64 && bf.n == 8);
    cr_assert_eq(dot16(&bf, 0xb300 /* -2^-25 */, 0.0f), 0x3f7fffffu);
    mf_mma_instr rbf = lookup("RTX Blackwell", "mma.m16n8k16.f32.bf16.bf16.f32");
    cr_assert(rbf.halves == 1 && rbf.frac_bits == 25);
}

/* mxf8f6f4: the scales take part in the fused sum. Product 1 scaled by 2^30 (ue8m0 157) and C = 1.5:
 * E = 30, and C lies below the 25-bit grid 2^5, so D = 2^30 exactly. Unscaled (127): 1 + 1.5. */
Test(mma_blackwell, mxf8f6f4_scales_inside_the_sum) {
    mf_mma_instr I = lookup("Blackwell", "tcgen05.mma.m128n8k32.block32.f32.e4m3.e4m3.ue8m0");
    cr_assert(I.scaled && I.block == 32 && I.s_fmt == MF_FMT_UE8M0 && I.kind == MF_MMA_NV_FUSED && I.frac_bits == 25);
    uint64_t a[32] = {0x38}, b[32] = {0x38}, sa = 157, sb = 127;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, f32b(1.5f), &sa, &sb, 1), 0x4e800000u, "2^30");
    sa = 127;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, f32b(1.5f), &sa, &sb, 1), f32b(2.5f));
    cr_assert_eq((uint32_t)mf_mma_dot(&I, a, b, 1, f32b(1.5f)), f32b(2.5f), "mf_mma_dot: unit scales");
    sb = 126;   /* 2^-1 */
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, 0, &sa, &sb, 1), f32b(0.5f));
    sb = 0xff;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, 0, &sa, &sb, 1), 0x7fffffffu, "a NaN scale");
    sb = 0;     /* 2^-127: a scale, not a zero */
    sa = 127 + 100;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, 0, &sa, &sb, 1), f32b(0x1p-27f));
}

/* mxf4nvf4: chunk sums of 16 products are exact, terms of chunks are truncated to 35 bits relative to the
 * largest scale exponent among the chunks (a chunk whose sum is zero still counts) and C. */
Test(mma_blackwell, mxf4nvf4_block_sums) {
    mf_mma_instr I = lookup("Blackwell", "tcgen05.mma.m128n8k64.block16.f32.e2m1.e2m1.ue8m0");
    cr_assert(I.kind == MF_MMA_NV_BLOCK_SUM && I.frac_bits == 35 && I.block == 16 && I.k == 64);
    uint64_t a[64] = {0}, b[64] = {0};
    a[0] = 0x2;    /* 1 */
    a[16] = 0xa;   /* -1 */
    a[32] = 0x2;
    b[0] = b[16] = b[32] = 0x2;
    uint64_t sa[4] = {127, 127, 97 /* 2^-30 */, 127}, sb[4] = {127, 127, 127, 127};
    /* 1 - 1 + 2^-30: within 35 bits of E = 0 (25 bits would lose it) */
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, 0, sa, sb, 1), f32b(0x1p-30f));
    sa[3] = 147;   /* the empty fourth chunk, scaled by 2^20, sets E = 20: 2^-30 falls below 2^-15 */
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, 0, sa, sb, 1), 0u);
    sa[0] = sa[1] = sa[2] = sa[3] = 127;
    /* 6 * 6 in chunk 2 with a 2^1 scale, and 1 - 1 in chunks 0 and 1: 72 */
    a[32] = b[32] = 0x7;
    sb[2] = 128;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, 0, sa, sb, 1), f32b(72.0f));
    sb[1] = 0xff;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&I, a, b, 1, 0, sa, sb, 1), 0x7fffffffu);

    /* NVFP4: ue4m3 scales bring their significands (1.5) and lose their sign bit */
    mf_mma_instr nv = lookup("Blackwell", "tcgen05.mma.m128n8k64.block16.f32.e2m1.e2m1.ue4m3");
    uint64_t ones[64];
    for (int i = 0; i < 64; i++) ones[i] = i < 16 ? 0x2 : 0;
    uint64_t qa[4] = {0x3c /* 1.5 */, 0x38, 0x38, 0x38}, qb[4] = {0x38, 0x38, 0x38, 0x38};
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&nv, ones, ones, 1, 0, qa, qb, 1), f32b(24.0f));
    qa[0] = 0xbc;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&nv, ones, ones, 1, 0, qa, qb, 1), f32b(24.0f));
    qa[3] = 0x7f;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&nv, ones, ones, 1, 0, qa, qb, 1), 0x7fffffffu, "NaN in an empty chunk's scale");

    /* sm_120 block32: one scale for two chunks (element 40 is in chunk 2, scale 1) */
    mf_mma_instr r = lookup("RTX Blackwell", "mma.m16n8k64.block32.f32.e2m1.e2m1.f32.ue8m0");
    uint64_t ra[64] = {0}, rb[64] = {0}, ras[2] = {127, 128}, rbs[2] = {127, 127};
    ra[40] = rb[40] = 0x7;
    cr_assert_eq((uint32_t)mf_mma_dot_scaled(&r, ra, rb, 1, f32b(-1.0f), ras, rbs, 1), f32b(71.0f));
}

/* A negative sum that truncates to zero gives +0 (MMA-Sim; the H200 vectors never show a -0 either):
 * -2^-75 * 2^-75 = -2^-150, below fp32's last subnormal. The fast kernels agree. */
Test(mma, nvidia_sum_truncated_to_zero_is_plus_zero) {
    mf_mma_instr h = lookup("Blackwell", "tcgen05.mma.m64n8k16.f32.bf16.bf16");
    uint64_t a[16] = {0x9a00 /* -2^-75 */}, b[16] = {0x1a00 /* 2^-75 */};
    cr_assert_eq((uint32_t)mf_mma_dot(&h, a, b, 1, 0), 0u);
    mf_kschedule s = {.instr = h, .acc = 1, .split = 1, .reduce = MF_REDUCE_SEQ};
    uint64_t A[16 * 2] = {0x9a00, [16] = 0x9a00}, B[16 * 4] = {0x1a00, 0x1a00, 0x1a00, 0x1a00}, C[2 * 4];
    for (int portable = 0; portable < 2; portable++) {
        mf_emu_force_portable(portable);
        mf_emu_gemm(&s, 2, 4, 16, A, B, NULL, C, 1);
        for (int i = 0; i < 8; i++) cr_assert_eq((uint32_t)C[i], 0u, "element %d: %08x", i, (uint32_t)C[i]);
    }
    mf_emu_force_portable(false);
}

Test(mma_blackwell, instruction_names) {
    mf_mma_instr I;
    mf_error err = {0};
    cr_assert_neq(mf_mma_lookup(&I, "Hopper", "tcgen05.mma.m64n8k16.f32.bf16.bf16", &err), MF_OK, "tcgen05 is sm_100's");
    cr_assert_neq(mf_mma_lookup(&I, "Blackwell", "tcgen05.mma.m128n8k64.block32.f32.e2m1.e2m1.ue4m3", &err), MF_OK,
                  "ue4m3 goes with block16 on tcgen05");
    cr_assert_eq(mf_mma_lookup(&I, "RTX Blackwell", "mma.m16n8k64.block32.f32.e2m1.e2m1.f32.ue4m3", &err), MF_OK, "%s",
                 err.msg);
    cr_assert_neq(mf_mma_lookup(&I, "Blackwell", "mma.m16n8k32.block32.f32.e4m3.e4m3.f32.ue8m0", &err), MF_OK,
                  "block-scaled mma.sync is sm_120's");
    cr_assert_neq(mf_mma_lookup(&I, "Hopper", "wgmma.m64n8k32.f32.e2m1.e2m1", &err), MF_OK, "no fp4 before Blackwell");
    cr_assert_neq(mf_mma_lookup(&I, "Blackwell", "tcgen05.mma.m128n8k32.block32.f16.e4m3.e4m3.ue8m0", &err), MF_OK,
                  "block-scaled kinds accumulate in f32");
    cr_assert_neq(mf_mma_lookup(&I, "Blackwell", "tcgen05.mma.m64n8k16.f32.ue8m0.ue8m0", &err), MF_OK);
    cr_assert_neq(mf_mma_lookup(&I, "Blackwell", "tcgen05.mma.m128n8k32.block16.f32.e4m3.e4m3.ue8m0", &err), MF_OK);
    cr_assert_eq(mf_mma_lookup(&I, "Blackwell", "tcgen05.mma.m64n8k32.f32.e2m1.e4m3", &err), MF_OK, "%s", err.msg);
    cr_assert(I.a_fmt == MF_FMT_E2M1 && I.b_fmt == MF_FMT_E4M3 && !I.scaled);
}

/* CDNA4: CDNA3's grouped arithmetic on its own instructions, fp8/bf8 read as the OCP formats. */
Test(mma_cdna4, cdna3_arithmetic_ocp_fp8) {
    mf_mma_instr I = lookup("CDNA4", "mfma_f32_32x32x16_bf16");
    cr_assert(I.kind == MF_MMA_AMD_GROUPED && I.group == 8 && I.k == 16 && I.m == 32);
    cr_assert_eq(dot16(&I, 0x0000, -0x1p-30f), 0x3f7fffffu, "rounds the accumulator down, as CDNA3");
    mf_mma_instr f8 = lookup("CDNA4", "mfma_f32_16x16x32_fp8_bf8"), f3 = lookup("CDNA3", "mfma_f32_16x16x32_fp8_bf8");
    cr_assert(f8.a_fmt == MF_FMT_E4M3 && f8.b_fmt == MF_FMT_E5M2 && f8.interleave && f8.group == 16);
    uint64_t a[32] = {0x38}, b[32] = {0x3c};
    cr_assert_eq((uint32_t)mf_mma_dot(&f8, a, b, 1, 0), f32b(1.0f), "OCP: 0x38 = 1, e5m2 0x3c = 1");
    cr_assert_eq((uint32_t)mf_mma_dot(&f3, a, b, 1, 0), f32b(0.25f), "FNUZ: 0x38 = 0.5, bf8 0x3c = 0.5");
    mf_error err = {0};
    cr_assert_neq(mf_mma_lookup(&I, "CDNA4", "mfma_f32_16x16x8_xf32", &err), MF_OK, "CDNA4 has no xf32");
    cr_assert_neq(mf_mma_lookup(&I, "CDNA4", "mfma_scale_f32_32x32x64_f8f6f4", &err), MF_OK);
    cr_assert(strstr(err.msg, "not modelled"), "%s", err.msg);
}

Test(numerics, blackwell_and_cdna4_profiles) {
    mf_numerics n;
    mf_error err = {0};
    cr_assert_eq(mf_numerics_parse(&n, "emu:blackwell", &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(n.name, "emu:blackwell:tcgen05.mma.m64n8k16.f32.bf16.bf16:acc=1:split=1:reduce=seq");
    cr_assert(n.has[0] && n.has[1] && !n.bf16.instr.zero_products_excluded && !n.validation);
    cr_assert_eq(mf_numerics_schedule_fmt(&n, MF_FMT_E4M3)->instr.frac_bits, 25);
    const mf_kschedule *m4 = mf_numerics_schedule_fmt(&n, MF_FMT_E2M1);
    cr_assert(m4 && m4->instr.kind == MF_MMA_NV_BLOCK_SUM && m4->instr.block == 32 && m4->instr.s_fmt == MF_FMT_UE8M0);
    cr_assert(mf_emu_fast_supported(&n.bf16), "emu:blackwell's bf16 products take the fast path (and the GPU's)");
    cr_assert_eq(mf_numerics_parse(&n, "emu:rtxblackwell", &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(n.bf16.instr.name, "mma.m16n8k16.f32.bf16.bf16.f32");
    cr_assert_str_eq(n.bf16.instr.arch, "RTX Blackwell");
    cr_assert_eq(mf_numerics_schedule_fmt(&n, MF_FMT_E2M1)->instr.m, 16);
    cr_assert_eq(mf_numerics_parse(&n, "emu:blackwell:tcgen05.mma.m128n8k64.block16.f32.e2m1.e2m1.ue4m3", &err), MF_OK,
                 "%s", err.msg);
    cr_assert_eq(n.mxf4.instr.s_fmt, MF_FMT_UE4M3);
    cr_assert_str_eq(n.bf16.instr.name, "tcgen05.mma.m64n8k16.f32.bf16.bf16");
    cr_assert_eq(mf_numerics_parse(&n, "emu:cdna4", &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(n.name, "emu:cdna4:mfma_f32_32x32x16_bf16:acc=1:split=1:reduce=seq");
    cr_assert(n.validation && strstr(n.validation, "not validated"));
    cr_assert_eq(mf_numerics_schedule_fmt(&n, MF_FMT_E4M3)->instr.a_fmt, MF_FMT_E4M3);
    cr_assert_null(mf_numerics_schedule_fmt(&n, MF_FMT_E2M1));
    cr_assert_eq(mf_numerics_parse(&n, "emu:hopper", &err), MF_OK, "%s", err.msg);
    cr_assert(!n.validation && n.has_fp8 && n.fp8.instr.frac_bits == 13 && !n.has_mxf4);
    cr_assert_eq(mf_numerics_parse(&n, "emu:cdna2", &err), MF_OK, "%s", err.msg);
    cr_assert_not_null(n.validation);
    cr_assert_neq(mf_numerics_parse(&n, "emu:blackwell:mma.m16n8k16.f32.bf16.bf16.f32:tile=24", &err), MF_OK);
}

/* On bf16 operands CDNA4's k16 instruction is two CDNA3 k8 groups: emu:cdna4 and emu:cdna3 give the same
 * bits (what the model says; nothing measured it). emu:blackwell and emu:hopper differ only by the H200's zero
 * rule, which these operands never meet. */
Test(numerics, cdna4_equals_cdna3_on_bf16) {
    mf_numerics c3, c4, bw, hp;
    mf_error err = {0};
    cr_assert_eq(mf_numerics_parse(&c3, "emu:cdna3", &err), MF_OK);
    cr_assert_eq(mf_numerics_parse(&c4, "emu:cdna4", &err), MF_OK);
    cr_assert_eq(mf_numerics_parse(&bw, "emu:blackwell", &err), MF_OK);
    cr_assert_eq(mf_numerics_parse(&hp, "emu:hopper", &err), MF_OK);
    enum { M = 5, N = 7, K = 96 };
    mf_rng r;
    mf_rng_seed(&r, 4242);
    uint64_t A[M * K], B[K * N], X[M * N], Y[M * N];
    for (int i = 0; i < M * K; i++) A[i] = mf_f64_to_bf16(ldexp(mf_rng_normal(&r), (int)(mf_rng_next(&r) % 16) - 8));
    for (int i = 0; i < K * N; i++) B[i] = mf_f64_to_bf16(mf_rng_normal(&r));
    mf_emu_gemm(&c3.bf16, M, N, K, A, B, NULL, X, 1);
    mf_emu_gemm(&c4.bf16, M, N, K, A, B, NULL, Y, 1);
    cr_assert_arr_eq(X, Y, sizeof X);
    mf_emu_gemm(&hp.bf16, M, N, K, A, B, NULL, X, 1);
    mf_emu_gemm(&bw.bf16, M, N, K, A, B, NULL, Y, 1);
    cr_assert_arr_eq(X, Y, sizeof X);
}

/* The scaled GEMM chains scaled instructions over K, each k-step with its own scales. */
Test(emu_gemm, scaled_chain_equals_chained_instructions) {
    mf_numerics n;
    mf_error err = {0};
    cr_assert_eq(mf_numerics_parse(&n, "emu:rtxblackwell:acc=2", &err), MF_OK, "%s", err.msg);
    for (int kind = 0; kind < 2; kind++) {
        mf_kschedule s = n.mxf4;
        if (kind == 1) s.instr = lookup("RTX Blackwell", "mma.m16n8k32.block32.f32.e4m3.e5m2.f32.ue8m0");
        const mf_mma_instr *I = &s.instr;
        enum { M = 3, N = 4, STEPS = 5 };
        const int k = I->k, K = k * STEPS, nb = K / I->block;
        mf_rng r;
        mf_rng_seed(&r, 99 + (uint64_t)kind);
        uint64_t *A = malloc(8 * M * K), *B = malloc(8 * K * N), *SA = malloc(8 * M * nb), *SB = malloc(8 * nb * N);
        uint64_t G[M * N], C0[M * N];
        cr_assert(A && B && SA && SB);
        for (int i = 0; i < M * K; i++) A[i] = kind ? mf_rng_next(&r) % 0x7f : mf_rng_next(&r) % 16;
        for (int i = 0; i < K * N; i++) B[i] = kind ? mf_rng_next(&r) % 0x7c : mf_rng_next(&r) % 16;
        for (int i = 0; i < M * nb; i++) SA[i] = 120 + mf_rng_next(&r) % 16;
        for (int i = 0; i < nb * N; i++) SB[i] = 120 + mf_rng_next(&r) % 16;
        for (int i = 0; i < M * N; i++) C0[i] = f32b((float)mf_rng_normal(&r));
        cr_assert_eq(mf_emu_gemm_scaled(&s, M, N, K, A, B, SA, SB, C0, G, 2, &err), MF_OK, "%s", err.msg);
        const int per = k / I->block;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                uint64_t acc[2] = {C0[i * N + j], 0}, bcol[256], scol[8];
                for (int t = 0; t < STEPS; t++) {
                    for (int kk = 0; kk < k; kk++) bcol[kk] = B[(size_t)(t * k + kk) * N + j];
                    for (int q = 0; q < per; q++) scol[q] = SB[(size_t)(t * per + q) * N + j];
                    acc[t % 2] = mf_mma_dot_scaled(I, A + (size_t)i * K + t * k, bcol, 1, acc[t % 2],
                                                   SA + (size_t)i * nb + t * per, scol, 1);
                }
                float x, y;
                uint32_t u0 = (uint32_t)acc[0], u1 = (uint32_t)acc[1];
                memcpy(&x, &u0, 4);
                memcpy(&y, &u1, 4);
                cr_assert_eq((uint32_t)G[i * N + j], f32b(x + y), "%s (%d, %d)", I->name, i, j);
            }
        cr_assert_neq(mf_emu_gemm_scaled(&s, M, N, K - 1, A, B, SA, SB, C0, G, 1, &err), MF_OK);
        cr_assert(strstr(err.msg, "not a multiple"), "%s", err.msg);
        free(A); free(B); free(SA); free(SB);
    }
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
    fast_vs_reference("Blackwell", "tcgen05.mma.m64n8k16.f32.bf16.bf16", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("RTX Blackwell", "mma.m16n8k16.f32.f16.f16.f32", 1, 1, MF_REDUCE_SEQ);
    fast_vs_reference("CDNA4", "mfma_f32_32x32x16_bf16", 1, 1, MF_REDUCE_SEQ);
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
 * returns the number of elements checked. A case with "chain": c is c instructions over k * c, each fed the
 * previous one's D as its C (the first one C, or +0 where "scale_d" is 0: wgmma's D = A.B). */
static size_t check_vectors(const char *path) {
    mf_error err = {0};
    size_t elements = 0, idx;
    json_t *rows = read_jsonl(path), *o;
    json_array_foreach(rows, idx, o) {
        const int line = (int)idx + 1;
        mf_mma_instr I;
        const char *arch = json_string_value(json_object_get(o, "arch")), *name = json_string_value(json_object_get(o, "instr"));
        cr_assert_eq(mf_mma_lookup(&I, arch, name, &err), MF_OK, "%s:%d: %s", path, line, err.msg);
        const char *src = json_string_value(json_object_get(o, "source"));
        I.zero_products_excluded = src && strstr(src, "h200");
        const json_t *jc = json_object_get(o, "chain"), *jsd = json_object_get(o, "scale_d");
        const int chain = jc ? (int)json_integer_value(jc) : 1, scale_d = jsd ? (int)json_integer_value(jsd) : 1;
        cr_assert(chain >= 1 && chain <= 64 && (chain == 1 || !I.scaled), "%s:%d: chain %d", path, line, chain);
        cr_assert_eq(json_integer_value(json_object_get(o, "k")), (json_int_t)I.k * chain, "%s:%d: k", path, line);
        const size_t K = (size_t)I.k * chain, na = (size_t)I.m * K, nb = K * I.n, nc = (size_t)I.m * I.n;
        const size_t nsa = I.scaled ? (size_t)I.m * (I.k / I.block) : 1, nsb = I.scaled ? (size_t)(I.k / I.block) * I.n : 1;
        uint64_t *A = malloc(8 * na), *B = malloc(8 * nb), *C = malloc(8 * nc), *D = malloc(8 * nc);
        uint64_t *As = malloc(8 * (size_t)I.m * I.k), *Cs = malloc(8 * nc);
        uint64_t *SA = malloc(8 * nsa), *SB = malloc(8 * nsb);
        cr_assert(A && B && C && D && As && Cs && SA && SB);
        cr_assert_eq(json_array_size(json_object_get(o, "A")), na, "%s:%d: A", path, line);
        cr_assert_eq(json_array_size(json_object_get(o, "B")), nb, "%s:%d: B", path, line);
        for (size_t i = 0; i < na; i++) A[i] = hex(json_array_get(json_object_get(o, "A"), i));
        for (size_t i = 0; i < nb; i++) B[i] = hex(json_array_get(json_object_get(o, "B"), i));
        for (size_t i = 0; i < nc; i++) C[i] = hex(json_array_get(json_object_get(o, "C"), i));
        if (I.scaled) {
            cr_assert_eq(json_integer_value(json_object_get(o, "block")), I.block, "%s:%d", path, line);
            cr_assert_eq(json_array_size(json_object_get(o, "SA")), nsa, "%s:%d: SA", path, line);
            cr_assert_eq(json_array_size(json_object_get(o, "SB")), nsb, "%s:%d: SB", path, line);
            for (size_t i = 0; i < nsa; i++) SA[i] = hex(json_array_get(json_object_get(o, "SA"), i));
            for (size_t i = 0; i < nsb; i++) SB[i] = hex(json_array_get(json_object_get(o, "SB"), i));
        }
        for (size_t i = 0; i < nc; i++) D[i] = scale_d ? C[i] : 0;
        for (int s = 0; s < chain; s++) {   /* instruction s: A's columns s k .. s k + k - 1, B's rows the same */
            for (int i = 0; i < I.m; i++)
                for (int kk = 0; kk < I.k; kk++) As[(size_t)i * I.k + kk] = A[(size_t)i * K + (size_t)s * I.k + kk];
            memcpy(Cs, D, 8 * nc);
            mf_mma_tile_scaled(&I, As, B + (size_t)s * I.k * I.n, Cs, I.scaled ? SA : NULL, I.scaled ? SB : NULL, D);
        }
        json_t *want = json_object_get(o, "D");
        for (size_t i = 0; i < nc; i++)
            cr_assert_eq(D[i], hex(json_array_get(want, i)), "%s:%d (%s %s %s): element %zu: %llx, expected %s", path, line,
                         arch, name, json_string_value(json_object_get(o, "style")), i, (unsigned long long)D[i],
                         json_string_value(json_array_get(want, i)));
        elements += nc;
        free(A); free(B); free(C); free(D); free(As); free(Cs); free(SA); free(SB);
    }
    cr_log_info("%s: %zu cases, %zu elements bit-exact", path, json_array_size(rows), elements);
    json_decref(rows);
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

/* MMA-Sim's Blackwell models: sm_100 mma and tcgen05.mma (bf16, f16, tf32, f16 accumulation, e4m3/e5m2),
 * its block-scaled mxf8f6f4 and mxf4nvf4 kinds (ue8m0 block 16/32, ue4m3 block 16), and sm_120's mma with its
 * block-scaled kinds; every element of every case. */
Test(mma_vectors, mmasim_blackwell, .timeout = 300) {
    size_t n = check_vectors(fixture("mma/mmasim_Blackwell.jsonl.xz"));
    n += check_vectors(fixture("mma/mmasim_Blackwell_blockscale.jsonl.xz"));
    n += check_vectors(fixture("mma/mmasim_RTXBlackwell.jsonl.xz"));
    cr_assert_eq(n, 56320 + 51200 + 43520);
}

Test(mma_vectors, h200_hardware, .timeout = 300) {
    size_t n = check_vectors(fixture("mma/h200_mma_m16n8k16_bf16.jsonl.xz"));
    n += check_vectors(fixture("mma/h200_mma_m16n8k16_f16.jsonl.xz"));
    n += check_vectors(fixture("mma/h200_wgmma_m64n8k16_bf16.jsonl.xz"));
    cr_assert_eq(n, 136192 + 136192 + 544768);
}

/* The H200's fp8 wgmma (tools/mma_probe_fp8.cuh): m64n8k32 e4m3.e4m3, e5m2.e5m2 and e4m3.e5m2, one instruction a
 * tile, and e4m3 chains of four instructions over k = 128 into one fp32 accumulator (C fed in, or scale-d 0),
 * in the styles normal, wide, cancel, tiny, window (sums wider than the 13-bit alignment window) and special
 * (NaN, Inf, 448 / 57344, -0, fp32 overflow): every element, bit for bit. */
Test(mma_vectors, h200_wgmma_fp8, .timeout = 120) {
    cr_assert_eq(check_vectors(fixture("mma/h200_wgmma_m64n8k32_fp8.jsonl.xz")), (size_t)(12 + 7 + 7 + 11) * 512);
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
    mf_error err = {0};
    size_t idx;
    json_t *rows = read_jsonl(fixture("cublas/h200_splitk.jsonl.xz")), *o;
    json_array_foreach(rows, idx, o) {
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
    }
    cr_assert_eq(json_array_size(rows), 4);
    json_decref(rows);
}
