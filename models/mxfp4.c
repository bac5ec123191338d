/* MXFP4 (OCP microscaling, e2m1 elements with an E8M0 scale per 32) as gpt-oss's checkpoints store their experts. */
#include "mxfp4.h"

#include <math.h>
#include <string.h>

/* e2m1: sign bit 3, exponent bits 2-1, mantissa bit 0 (transformers' FP4_VALUES, in code order) */
static const double e2m1[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

static int shape_is(const mf_st_tensor *t, int ndim, const int64_t *want) {
    if (t->ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != want[i]) return 0;
    return 1;
}

int mf_mxfp4_check(const mf_st_tensor *blocks, const mf_st_tensor *scales, const char *blocks_name,
                   const char *scales_name, int E, int rows, int cols, const char *origin, mf_error *err) {
    if (cols % 32)
        return mf_fail(err, MF_EFORMAT, "%s: %s: MXFP4 blocks hold 32 inputs each, but the config implies %d inputs",
                       origin, blocks_name, cols);
    const int64_t G = cols / 32;
    const int64_t wb[4] = {E, rows, G, 16}, ws[3] = {E, rows, G};
    if (!blocks) return mf_fail(err, MF_EFORMAT, "%s: missing tensor %s", origin, blocks_name);
    if (!scales)
        return mf_fail(err, MF_EFORMAT, "%s: missing tensor %s (the scales of the MXFP4 blocks %s)", origin,
                       scales_name, blocks_name);
    if (blocks->dtype != MF_U8 || !shape_is(blocks, 4, wb))
        return mf_fail(err, MF_EFORMAT, "%s: MXFP4 tensor %s must be U8 [%d, %d, %lld, 16] (it is %s, %d dims)", origin,
                       blocks_name, E, rows, (long long)G, mf_dtype_name(blocks->dtype), blocks->ndim);
    if (scales->dtype != MF_U8 || !shape_is(scales, 3, ws))
        return mf_fail(err, MF_EFORMAT, "%s: MXFP4 scales %s must be U8 [%d, %d, %lld] (it is %s, %d dims)", origin,
                       scales_name, E, rows, (long long)G, mf_dtype_name(scales->dtype), scales->ndim);
    return MF_OK;
}

int mf_mxfp4_check_values(const mf_st_tensor *blocks, const mf_st_tensor *scales, int E, int rows, int cols,
                          const char *origin, mf_error *err) {
    const int G = cols / 32;
    const uint8_t *b = blocks->data, *s = scales->data;
    for (size_t g = 0; g < (size_t)E * rows * G; g++) {
        const int sc = s[g];
        if (sc == 255)
            return mf_fail(err, MF_EFORMAT, "%s: %s: expert %zu, row %zu, block %zu: scale 255 is E8M0's NaN (not a "
                           "weight scale)", origin, scales->name, g / ((size_t)rows * G), g / G % rows, g % G);
        if (sc >= 253) {   /* below 253 even 6 x 2^(sc - 127) stays under 2^128: only these can overflow */
            for (int j = 0; j < 16; j++) {
                const uint8_t byte = b[g * 16 + j];
                const double m = fmax(fabs(e2m1[byte & 15]), fabs(e2m1[byte >> 4]));
                if (ldexp(m, sc - 127) >= ldexp(1.0, 128))
                    return mf_fail(err, MF_EFORMAT, "%s: %s: expert %zu, row %zu, block %zu: scale %d makes the value "
                                   "%g x 2^%d overflow (inf in transformers' dequantisation)", origin, scales->name,
                                   g / ((size_t)rows * G), g / G % rows, g % G, sc, m, sc - 127);
            }
        }
    }
    return MF_OK;
}
