/* Exact conversions, checked against values worked out by hand from the
 * IEEE formats (bf16: 8 significant bits; fp16: 11, exponent -14..15). */
#include <criterion/criterion.h>
#include <math.h>

#include "mf_core.h"

Test(dtype, bf16_round_to_nearest_even) {
    cr_assert_eq(mf_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(mf_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80, "halfway 1 + 2^-8 goes to the even neighbour 1.0");
    cr_assert_eq(mf_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82, "halfway 1 + 3*2^-8 goes to the even 1 + 2^-6");
    cr_assert_eq(mf_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81, "just above halfway rounds up");
    cr_assert_eq(mf_f32_to_bf16(-2.0f), 0xc000);
    cr_assert_eq(mf_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(mf_f32_to_bf16(3.4028235e38f), 0x7f80, "FLT_MAX rounds past the largest bf16 to infinity");
    cr_assert_eq(mf_f32_to_bf16(0x1.fe0000p127f), 0x7f7f, "largest bf16 stays");
    uint16_t n = mf_f32_to_bf16(NAN);
    cr_assert((n & 0x7f80) == 0x7f80 && (n & 0x7f), "NaN stays NaN");
    cr_assert_float_eq(mf_bf16_to_f32(0x4049), 3.140625f, 0);
}

Test(dtype, bf16_from_double_rounds_once) {
    /* 1 + 2^-8 + 2^-40: through float it becomes the tie 1 + 2^-8 and then 1.0;
     * rounded once it is just above the tie and goes up to 1 + 2^-7. */
    double x = 1.0 + 0x1p-8 + 0x1p-40;
    cr_assert_eq(mf_f64_to_bf16(x), 0x3f81);
    cr_assert_eq(mf_f32_to_bf16((float)x), 0x3f80);
    cr_assert_eq(mf_round_bf16(x), 1.0 + 0x1p-7);
    cr_assert_eq(mf_round_bf16(-x), -(1.0 + 0x1p-7));
    /* subnormal bf16: quantum 2^-133 */
    cr_assert_eq(mf_round_bf16(0x1p-133 * 1.5), 0x1p-132, "tie between 1 and 2 quanta goes to 2 (even)");
    cr_assert_eq(mf_round_bf16(0x1p-135), 0.0);
    cr_assert_eq(mf_round_bf16(0.0), 0.0);
    cr_assert(signbit(mf_round_bf16(-0.0)));
}

Test(dtype, fast_and_slow_bf16_paths_agree) {
    mf_rng r;
    mf_rng_seed(&r, 5);
    for (int i = 0; i < 200000; i++) {
        double x = ldexp(mf_rng_uniform(&r) * 2 - 1, (int)(mf_rng_next(&r) % 300) - 150);
        cr_assert_eq(mf_round_bf16(x), mf_round_bf16_slow(x), "x = %a", x);
        cr_assert_eq(mf_round_f16(x), mf_round_f16_slow(x), "x = %a", x);
    }
}

Test(dtype, f16_conversions) {
    cr_assert_eq(mf_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(mf_f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(mf_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(mf_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
    cr_assert(isinf(mf_f16_to_f32(0xfc00)) && mf_f16_to_f32(0xfc00) < 0);
    cr_assert_eq(mf_f64_to_f16(65504.0), 0x7bff);
    cr_assert_eq(mf_f64_to_f16(65519.0), 0x7bff, "below the tie with 65536 stays finite");
    cr_assert_eq(mf_f64_to_f16(65520.0), 0x7c00, "the tie rounds to even 65536, past the range: infinity");
    cr_assert_eq(mf_f64_to_f16(0x1p-24), 0x0001);
    cr_assert_eq(mf_f64_to_f16(0x1p-25), 0x0000, "tie between 0 and the smallest subnormal goes to 0 (even)");
    cr_assert_eq(mf_f64_to_f16(3 * 0x1p-26), 0x0001);
    cr_assert_eq(mf_f64_to_f16(1.0 / 3.0), 0x3555);
    cr_assert_eq(mf_f64_to_f16(-0.0), 0x8000);
}

Test(dtype, names_and_sizes) {
    cr_assert_eq(mf_dtype_from_name("BF16"), MF_BF16);
    cr_assert_eq(mf_dtype_from_name("F8_E4M3"), MF_F8E4M3);
    cr_assert_eq(mf_dtype_from_name("bf16"), MF_DTYPE_INVALID);
    cr_assert_eq(mf_dtype_size(MF_F64), 8);
    cr_assert_eq(mf_dtype_size(MF_U16), 2);
}

/* The float executor rounds fp32 values with mf_roundf_to; it must be
 * mf_round_to of the same value bit for bit, on every 97th bit pattern of
 * fp32 (44 million values: every exponent, subnormals, ties, infinities) and
 * on the edges named here. NaNs must stay NaNs. */
Test(dtype, roundf_to_is_round_to_on_fp32_values) {
    static const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x3f808000u,
                                     0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f7f8000u, 0x7f800000u, 0xff800000u,
                                     0x477fefffu, 0x477ff000u, 0x33800000u, 0x33000000u, 0xb3c00000u};
    const mf_dtype dts[] = {MF_BF16, MF_F16, MF_F32};
    const uint64_t sampled = ((1ull << 32) + 96) / 97, n_edges = sizeof edges / sizeof edges[0];
    for (size_t d = 0; d < 3; d++) {
        for (uint64_t i = 0; i < sampled + n_edges; i++) {
            const uint32_t bits = i < sampled ? (uint32_t)(i * 97) : edges[i - sampled];
            const float x = mf_bits_f32(bits);
            const float a = mf_roundf_to(dts[d], x), b = (float)mf_round_to(dts[d], x);
            if (isnan(x)) {
                cr_assert(isnan(a) && isnan(b), "%s of a NaN", mf_dtype_name(dts[d]));
                continue;
            }
            cr_assert(mf_f32_bits(a) == mf_f32_bits(b), "%s: x = %a (0x%08x): %a against %a", mf_dtype_name(dts[d]), x,
                      bits, a, b);
        }
    }
}

/* FP8 E4M3 (float8_e4m3fn), from the OCP FP8 table: bias 7, 3 mantissa bits, subnormals below 2^-6, S.1111.111
 * NaN and no infinities (so S.1111.110 = 448 is the largest). */
Test(dtype, f8e4m3_values) {
    cr_assert_eq(mf_f8e4m3_to_f64(0x38), 1.0);
    cr_assert_eq(mf_f8e4m3_to_f64(0x3c), 1.5);
    cr_assert_eq(mf_f8e4m3_to_f64(0xb8), -1.0);
    cr_assert_eq(mf_f8e4m3_to_f64(0x7e), 448.0);
    cr_assert_eq(mf_f8e4m3_to_f64(0x78), 256.0, "exponent 15 is a number here");
    cr_assert_eq(mf_f8e4m3_to_f64(0x08), 0x1p-6, "the smallest normal");
    cr_assert_eq(mf_f8e4m3_to_f64(0x01), 0x1p-9, "the smallest subnormal");
    cr_assert_eq(mf_f8e4m3_to_f64(0x07), 7 * 0x1p-9);
    cr_assert(isnan(mf_f8e4m3_to_f64(0x7f)) && isnan(mf_f8e4m3_to_f64(0xff)));
    cr_assert(signbit(mf_f8e4m3_to_f64(0x80)) && mf_f8e4m3_to_f64(0x80) == 0);
    const uint8_t b[2] = {0x40, 0xc4};
    cr_assert_eq(mf_load_as_f64(b, MF_F8E4M3, 1), -3.0);
}
