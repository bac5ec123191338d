/* Private to models/: the checks of gpt-oss's MXFP4 expert format (transformers 5.17's integrations/mxfp4.py,
 * convert_moe_packed_tensors) before the loader makes the blocks numerics' MXFP4 views. */
#ifndef MF_MXFP4_H
#define MF_MXFP4_H

#include "mf_models.h"

/* The checks of a blocks / scales pair for a weight of E x rows x cols (cols: the inputs, a multiple of 32):
 * blocks U8 [E, rows, cols / 32, 16], scales U8 [E, rows, cols / 32]. One line naming the tensor on failure. */
int mf_mxfp4_check(const mf_st_tensor *blocks, const mf_st_tensor *scales, const char *blocks_name,
                   const char *scales_name, int E, int rows, int cols, const char *origin, mf_error *err);

/* The pair's values, as transformers' dequantisation would compute them (e2m1 code value x 2^(s - 127), the low
 * nibble of each byte the even input; numerics' MXFP4 view computes the same for the products): a scale of 255
 * (E8M0's NaN; transformers' 2^128 is inf in fp32, and 0 x inf NaN) or a value that overflows
 * (|v| x 2^(s - 127) >= 2^128: inf) is refused, naming the scales tensor, expert, row and block. */
int mf_mxfp4_check_values(const mf_st_tensor *blocks, const mf_st_tensor *scales, int E, int rows, int cols,
                          const char *origin, mf_error *err);

#endif
