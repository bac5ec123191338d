/* moeflip numerics: how a matrix product is carried out.
 *
 * Every matrix product of a model is C[M,N] = A[M,K] . W[N,K]^T with W held
 * "packed": split into panels of MF_NR_F32 (or MF_NR_F64) rows of W, each panel
 * stored k-major, so the kernels stream it once per block of A rows.
 *
 * The CPU's own arithmetic ("native") is defined here exactly, so results do
 * not depend on the instruction set or the number of threads: each output
 * element is one fused multiply-add chain over k in ascending order, starting
 * from zero, in the compute type (fp32 or fp64). The AVX2 kernels and the
 * portable kernels compute the same bits. */
#ifndef MF_NUMERICS_H
#define MF_NUMERICS_H

#include "mf_core.h"

#define MF_NR_F32 16
#define MF_NR_F64 8

typedef struct mf_packed {
    int n, k;          /* logical W is [n, k] */
    mf_dtype type;     /* compute type: MF_F32 or MF_F64 */
    void *data;        /* ceil(n / NR) panels of k * NR values, zero padded */
} mf_packed;

/* Packs W given element (j, kk) at src[j * row_stride + kk * col_stride].
 * The source may be any float dtype (read exactly); each value is first
 * rounded to `round` (MF_F64: kept) and then stored in the compute type
 * `type` (MF_F32 or MF_F64). */
void mf_pack(mf_packed *p, mf_dtype type, mf_dtype round, int n, int k, const void *src, mf_dtype src_type,
             size_t row_stride, size_t col_stride);
void mf_pack_free(mf_packed *p);
size_t mf_packed_bytes(const mf_packed *p);
/* Element (j, kk) of a packed matrix, as double (for tests and slow paths). */
double mf_packed_get(const mf_packed *p, int j, int kk);

/* Causal shortcuts for attention, where row i is query position i:
 * MF_TRI_COLS: only C[i, j] with j <= i is wanted (Q.K^T); the rest is left
 *   unwritten. MF_TRI_K: A[i, kk] is zero for kk > i (P.V), so the chain
 *   stops at kk = i: the result is the same sum with its trailing exact
 *   zeros left out. */
typedef enum mf_tri { MF_TRI_NONE, MF_TRI_COLS, MF_TRI_K } mf_tri;

/* C[i, j] for i < m, j < n = chain of fma over k; A rows have stride lda,
 * C rows have stride ldc. Uses up to `threads` OpenMP threads. */
void mf_gemm_f32(int m, const float *a, size_t lda, const mf_packed *w, float *c, size_t ldc, int threads, mf_tri tri);
void mf_gemm_f64(int m, const double *a, size_t lda, const mf_packed *w, double *c, size_t ldc, int threads, mf_tri tri);

/* Which kernel runs on this CPU ("avx2+fma" or "portable"). */
const char *mf_gemm_kernel_name(void);
/* Forces the portable kernels (tests compare the two). */
void mf_gemm_force_portable(bool on);

/* ---- linear layers and matrix products under a precision ------------ */

/* A weight [out, in], packed, with an optional bias [out]. */
typedef struct mf_linear {
    int out, in;
    mf_packed w;
    double *bias;
} mf_linear;

/* How one product is carried out: the compute type of the kernel (MF_F32:
 * inputs are fp32 values, fp32 fma chain; MF_F64: double chain), what the
 * result is rounded to when stored (HF's "output dtype"), and threads. */
typedef struct mf_mm {
    mf_dtype compute;
    mf_dtype out;
    int threads;
} mf_mm;

/* y[M, out] = round_out(x[M, in] . W^T + b). In MF_F32 compute, x must hold
 * fp32-representable values (the caller rounded them); the bias is added to
 * the fp32 sum in fp32 before the output rounding, as addmm does. */
void mf_linear_apply(const mf_mm *mm, const mf_linear *L, const double *x, int M, double *y);
/* C[M, N] = round_out(A[M, K] . B^T) with B packed. */
void mf_matmul_packed(const mf_mm *mm, const double *a, int M, size_t lda, const mf_packed *b, double *c, size_t ldc,
                      mf_tri tri);
void mf_linear_free(mf_linear *L);

/* ---- activations (computed in double; the caller rounds) -------------- */

typedef enum mf_act { MF_ACT_SILU, MF_ACT_GELU, MF_ACT_GELU_TANH } mf_act;
double mf_act_apply(mf_act act, double x);
double mf_sigmoid(double x);

/* ---- precision policies ------------------------------------------------ */

/* Which dtype each part of the model computes and stores in. */
typedef enum mf_part { MF_PART_ATTN, MF_PART_NORM, MF_PART_MLP, MF_PART_ROUTER, MF_PART_HEAD, MF_PART_COUNT } mf_part;

typedef struct mf_precision {
    char name[64];
    mf_dtype act;                  /* residual stream and activations */
    mf_dtype part[MF_PART_COUNT];
    mf_dtype weights;              /* weights are rounded to this when loaded */
    mf_dtype opmath;               /* what PyTorch computes elementwise ops in: F32, or F64 for the reference */
    mf_dtype compute;              /* matrix kernels' compute type */
} mf_precision;

/* "fp64", "fp32", "bf16", "fp16". Returns MF_EINVAL with a message otherwise. */
int mf_precision_parse(mf_precision *p, const char *name, mf_error *err);

#endif
