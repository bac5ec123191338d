/* Private to models/: gpt-oss's MXFP4 expert format, decoded as transformers 5.17 dequantises it
 * (integrations/mxfp4.py, convert_moe_packed_tensors). Kept apart from the loader so that the kernels can take
 * these blocks as operands later (as FP8 will be), without the loader changing. */
#ifndef MF_MXFP4_H
#define MF_MXFP4_H

#include "mf_models.h"

/* The checks of a blocks / scales pair for a weight of E x rows x cols (cols: the inputs, a multiple of 32):
 * blocks U8 [E, rows, cols / 32, 16], scales U8 [E, rows, cols / 32]. One line naming the tensor on failure. */
int mf_mxfp4_check(const mf_st_tensor *blocks, const mf_st_tensor *scales, const char *blocks_name,
                   const char *scales_name, int E, int rows, int cols, const char *origin, mf_error *err);

/* Decodes the pair into dst [E, rows, cols] of dtype `dt` (row-major, the value of input c of output row r of
 * expert e at (e * rows + r) * cols + c). Each byte holds two e2m1 codes, the low nibble first (the even
 * input), value table {0, 0.5, 1, 1.5, 2, 3, 4, 6} with bit 3 the sign; each 32 inputs share the scale byte s, an
 * E8M0 exponent: value x 2^(s - 127), computed as transformers does (an fp32 product, exact) and held as bf16
 * (exact: every such value is a bf16 value), then stored in dt. A scale of 255 (E8M0's NaN; transformers' 2^128
 * is inf in fp32, and 0 x inf NaN) or a value that overflows (|v| x 2^(s - 127) >= 2^128) is refused, naming
 * the tensor, expert, row and block. */
int mf_mxfp4_decode(const mf_st_tensor *blocks, const mf_st_tensor *scales, const char *scales_name, int E, int rows,
                    int cols, mf_dtype dt, void *dst, const char *origin, mf_error *err);

#endif
