/* moeflip numerics: how a matrix product is carried out.
 *
 * Every matrix product of a model is C[M,N] = A[M,K] . W[N,K]^T with W read
 * where it lies (mf_mat): a weight in the mapped checkpoint, in its own
 * dtype, or an activation with any strides. The kernels widen W's values as
 * they load them (bf16 and f16 to fp32 or fp64 is exact; block-scaled FP8
 * and MXFP4 codes times their block's scale, as dequantising them would);
 * nothing is copied whole into a wider type.
 *
 * The CPU's own arithmetic ("native") is defined here exactly, so results do
 * not depend on the instruction set or the number of threads: each output
 * element is one fused multiply-add chain over k in ascending order, starting
 * from zero, in the compute type (fp32 or fp64). The portable, AVX2, AVX-512
 * and AVX-512 BF16 kernels compute the same bits. */
#ifndef MF_NUMERICS_H
#define MF_NUMERICS_H

#include "mf_core.h"

/* Block-scaled weights: a checkpoint's narrow codes kept as stored, with their
 * block scales beside them, widened by the kernels as they pack panels (never
 * copied whole into a wider type). Element (j, kk) of such a matrix is
 *     round_to(round, fp32(fp32(code(j, kk)) x fp32(S[j / bn][kk / bk])))
 * the fp32 product of the code's value and its block's scale, then rounded to
 * `round` (F32: as is; BF16, F16: nearest even), which is what dequantising
 * the tensor once and loading it into a model of that dtype gives.
 *  MF_WQ_FP8_BLOCK  codes: F8_E4M3 bytes (mf_mat.dtype MF_F8E4M3), one a value; S: float (F32, BF16 or F16)
 *                   [ceil(n / bn), ceil(k / bk)], DeepSeek-V3's weight_scale_inv with its
 *                   quantization_config weight_block_size [bn, bk] ([128, 128]); transformers' Fp8Dequantize.
 *  MF_WQ_MXFP4      codes: OCP MXFP4 e2m1 nibbles, two a byte (mf_mat.dtype MF_U8): element index
 *                   i = j * rs + kk * cs (rs, cs count values) is the low nibble of byte i / 2 when i is even,
 *                   the high one when odd; S: UE8M0 bytes [n, ceil(k / 32)] (bn = 1, bk = 32), scale
 *                   fp32(2^(b - 127)) with 0xff as +inf, as transformers' convert_moe_packed_tensors computes it
 *                   (torch.ldexp multiplies by 2^e in fp32); gpt-oss's *_blocks and *_scales.
 * A view of such a matrix starts at a block boundary (row 0 of S is its first block row) and, for MXFP4, at
 * an even element. */
typedef enum mf_wq { MF_WQ_NONE, MF_WQ_FP8_BLOCK, MF_WQ_MXFP4 } mf_wq;

typedef struct mf_mat_scales {
    mf_wq kind;           /* MF_WQ_NONE: a plain matrix; the rest is unused */
    const void *data;     /* S [rows, rs]: S[r][c] is element r * rs + c */
    mf_dtype dtype;       /* F32 / BF16 / F16 (FP8), U8 (MXFP4) */
    int bn, bk;           /* rows and k-values one scale covers */
    size_t rs;
    mf_dtype round;       /* F32, BF16 or F16: the policy's weight dtype */
} mf_mat_scales;

/* A matrix W[n, k] as stored: element (j, kk) is element j * rs + kk * cs of
 * `data`, of dtype BF16, F16, F32 or F64, or the code of a block-scaled
 * weight (q.kind != MF_WQ_NONE). */
typedef struct mf_mat {
    const void *data;
    mf_dtype dtype;
    int n, k;
    size_t rs, cs;
    mf_mat_scales q;
} mf_mat;

/* Row-major [n, k] (a safetensors weight [out, in]). */
mf_mat mf_mat_rows(const void *data, mf_dtype dtype, int n, int k);
/* Row-major FP8 codes [n, k] with their scales S [ceil(n / bn), ceil(k / bk)] of float dtype sdt, values
 * rounded to `round` (F32, BF16 or F16). */
mf_mat mf_mat_fp8_block(const uint8_t *codes, int n, int k, const void *scales, mf_dtype sdt, int bn, int bk,
                        mf_dtype round);
/* Row-major MXFP4 [n, k] (k even): n rows of k / 2 bytes, scales [n, ceil(k / 32)] UE8M0 bytes. */
mf_mat mf_mat_mxfp4(const uint8_t *blocks, int n, int k, const uint8_t *scales, mf_dtype round);
/* Element (j, kk) as double (exact; for tests and slow paths). */
double mf_mat_get(const mf_mat *w, int j, int kk);
/* Elements (j, k0 .. k0 + kc - 1) as fp32 (w's values must be fp32 values: any dtype but an F64 holding wider
 * ones): a block-scaled row widened one scale at a time. */
void mf_mat_row_f32(const mf_mat *w, int j, int k0, int kc, float *dst);
/* The bytes of rows [j0, j0 + rows) of w as stored, codes and scales (a row-major w's digest covers both):
 * the codes at *codes (*ncodes bytes), the scales' rows at *scales (*nscales bytes; 0 for a plain w). */
void mf_mat_row_bytes(const mf_mat *w, int j0, int rows, const void **codes, size_t *ncodes, const void **scales,
                      size_t *nscales);

/* Causal shortcuts for attention, where row i is query position i:
 * MF_TRI_COLS: only C[i, j] with j <= i is wanted (Q.K^T); the rest is left
 *   unwritten. MF_TRI_K: A[i, kk] is zero for kk > i (P.V), so the chain
 *   stops at kk = i: the result is the same sum with its trailing exact
 *   zeros left out. */
typedef enum mf_tri { MF_TRI_NONE, MF_TRI_COLS, MF_TRI_K } mf_tri;

/* C[i, j] for i < m, j < n = chain of fma over k; A rows have stride lda,
 * C rows have stride ldc. Uses up to `threads` OpenMP threads. In mf_gemm_f32
 * W's values must be fp32 values (any dtype but an F64 holding wider ones). */
void mf_gemm_f32(int m, const float *a, size_t lda, const mf_mat *w, float *c, size_t ldc, int threads, mf_tri tri);
void mf_gemm_f64(int m, const double *a, size_t lda, const mf_mat *w, double *c, size_t ldc, int threads, mf_tri tri);

/* The kernels, all giving the same bits: AUTO takes the widest this CPU runs
 * (AVX512BF16: the pair kernel for products whose operands are bf16 values,
 * AVX-512 for the rest); MOEFLIP_GEMM_PATH=portable|avx2|avx512|avx512bf16
 * picks one for a whole process (one the CPU lacks falls back to its widest). */
typedef enum mf_gemm_path {
    MF_GEMM_PATH_AUTO, MF_GEMM_PATH_PORTABLE, MF_GEMM_PATH_AVX2, MF_GEMM_PATH_AVX512, MF_GEMM_PATH_AVX512BF16
} mf_gemm_path;
/* Forces a kernel (tests compare them); false when this CPU lacks it. */
bool mf_gemm_force_path(mf_gemm_path p);
/* Which kernel runs now ("avx512bf16", "avx512", "avx2+fma" or "portable"). */
const char *mf_gemm_kernel_name(void);
/* Forces the portable kernels (true) or the widest again (false). */
void mf_gemm_force_portable(bool on);

/* ---- matrix-instruction models (docs/numerics.md) -------------------- */

/* Operand formats of matrix instructions. TF32 (and AMD's xf32) operands are
 * fp32 bit patterns whose low 13 fraction bits the unit ignores; FNUZ are
 * AMD CDNA3's fp8 variants (no -0, NaN = 0x80, other biases). E2M1 is fp4
 * (one value in the low 4 bits of each element); UE8M0 and UE4M3 are the
 * block-scale formats: 2^(bits - 127) with 0xff NaN, and e4m3 whose sign
 * bit the unit ignores. */
typedef enum mf_fmt {
    MF_FMT_BF16, MF_FMT_F16, MF_FMT_F32, MF_FMT_TF32, MF_FMT_F64,
    MF_FMT_E4M3, MF_FMT_E5M2, MF_FMT_E4M3FNUZ, MF_FMT_E5M2FNUZ,
    MF_FMT_E2M1, MF_FMT_UE8M0, MF_FMT_UE4M3, MF_FMT_COUNT
} mf_fmt;

typedef enum mf_mma_kind {
    MF_MMA_NV_FUSED,      /* NVIDIA: one fused dot-add (two halves on Ampere/Ada); mxf8f6f4 with its scales */
    MF_MMA_NV_BLOCK_SUM,  /* NVIDIA Blackwell mxf4nvf4: exact sums of 16 fp4 products, scaled, then fused */
    MF_MMA_AMD_GROUPED,   /* AMD CDNA3 f16/bf16/fp8/xf32: grouped two-stage, rounding down */
    MF_MMA_AMD_PAIRWISE,  /* AMD CDNA1/2 f16/bf16: pairwise fp32 fma tree per group */
    MF_MMA_FMA_CHAIN,     /* fp32 / fp64 forms: sequential fma */
} mf_mma_kind;

typedef struct mf_mma_instr {
    char name[64], arch[32];
    int m, n, k;
    mf_fmt a_fmt, b_fmt, c_fmt;   /* c_fmt is also D's format */
    mf_mma_kind kind;
    int frac_bits;   /* NVIDIA: F (23 Volta, 24 Turing..Ada, 25 Hopper+, 13 fp8 on Hopper/Ada, 35 mxf4nvf4); AMD: 24 */
    int out_frac;    /* NVIDIA fp32 result fraction bits (23, or 13 for fp8 on Hopper/Ada) */
    int halves;      /* NVIDIA: 2 when k is split (Ampere/Ada m16n8k16 etc.) */
    int group;       /* AMD: products per group */
    bool interleave; /* AMD fp8: each group reduced as even and odd halves */
    bool flush;      /* AMD CDNA2: subnormal inputs, partial sums and results flushed to zero */
    /* NVIDIA: products with a zero factor take no part in the largest
     * exponent (measured on an H200; MMA-Sim instead gives a zero the
     * exponent -126). Off by default: the MMA-Sim model. */
    bool zero_products_excluded;
    /* Block-scaled kinds (Blackwell mxf8f6f4, mxf4nvf4): every `block` consecutive k elements of a row of A
     * share one scale of format s_fmt, and so do those of a column of B. */
    bool scaled;
    int block;
    mf_fmt s_fmt;
} mf_mma_instr;

/* Instruction names as PTX and AMD spell them: "mma.m16n8k16.f32.bf16.bf16.f32",
 * "wgmma.m64n8k16.f32.bf16.bf16", "tcgen05.mma.m64n8k16.f32.bf16.bf16", block-scaled
 * "tcgen05.mma.m128n8k64.block16.f32.e2m1.e2m1.ue4m3" and "mma.m16n8k32.block32.f32.e4m3.e4m3.f32.ue8m0"
 * (shape, K elements per scale, D, A, B, [C,] scale format), "mfma_f32_32x32x8_bf16",
 * "mfma_f32_16x16x16bf16_1k", "mfma_f32_16x16x32_fp8_fp8"; arch: Volta, Turing, Ampere, Ada, Hopper,
 * Blackwell (sm_100), RTX Blackwell (sm_120), CDNA1, CDNA2, CDNA3, CDNA4. */
int mf_mma_lookup(mf_mma_instr *I, const char *arch, const char *name, mf_error *err);
int mf_fmt_bytes(mf_fmt f);
const char *mf_fmt_name(mf_fmt f);
/* One output element: D = sum over k of a[i] * b[i * b_stride] + c, as the
 * instruction computes it; operands and result are bit patterns. */
uint64_t mf_mma_dot(const mf_mma_instr *I, const uint64_t *a, const uint64_t *b, size_t b_stride, uint64_t c);
/* A whole tile: A [m, k], B [k, n], C and D [m, n], row-major bit patterns. */
void mf_mma_tile(const mf_mma_instr *I, const uint64_t *A, const uint64_t *B, const uint64_t *C, uint64_t *D);
/* Block-scaled kinds: sa holds row i's k / block scales, sb column j's, element q at sb[q * sb_stride]
 * (mf_mma_dot runs a scaled instruction with unit scales). Unscaled instructions ignore the scales. */
uint64_t mf_mma_dot_scaled(const mf_mma_instr *I, const uint64_t *a, const uint64_t *b, size_t b_stride, uint64_t c,
                           const uint64_t *sa, const uint64_t *sb, size_t sb_stride);
/* SA [m, k / block], SB [k / block, n], row-major. */
void mf_mma_tile_scaled(const mf_mma_instr *I, const uint64_t *A, const uint64_t *B, const uint64_t *C,
                        const uint64_t *SA, const uint64_t *SB, uint64_t *D);

/* ---- emulated GEMM under a K-schedule ---------------------------------- */

typedef enum mf_reduce { MF_REDUCE_SEQ, MF_REDUCE_TREE } mf_reduce;

typedef struct mf_kschedule {
    mf_mma_instr instr;
    int acc;            /* independent accumulators, k-steps dealt round-robin */
    int split;          /* split-K factor: contiguous K ranges, each its own chain */
    int tile;           /* split-K unit in K elements (0: the instruction's k); ranges of ceil(tiles / split) */
    mf_reduce reduce;   /* how accumulators, then ranges, are added (fp32) */
} mf_kschedule;

int mf_kschedule_check(const mf_kschedule *s, int K, mf_error *err);
/* C = A[M, K] . B[K, N] (+ C0 [M, N], or zero when NULL); bit patterns in the
 * instruction's formats, row-major; fp32 result bits. */
void mf_emu_gemm(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B, const uint64_t *C0,
                 uint64_t *C, int threads);

/* Block-scaled instructions: C = sum over k of A[i][k] B[k][j] SA[i][k / block] SB[k / block][j] (+ C0),
 * SA [M, K / block] and SB [K / block, N] in the instruction's scale format, K a multiple of the instruction's
 * k; chained over K under the schedule like mf_emu_gemm (which, for these, runs with unit scales). The
 * exact model only. */
int mf_emu_gemm_scaled(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B,
                       const uint64_t *SA, const uint64_t *SB, const uint64_t *C0, uint64_t *C, int threads, mf_error *err);

/* The fast path (AVX2 or portable) for bf16/f16 inputs with fp32
 * accumulation on NVIDIA fused and AMD CDNA3 grouped instructions; a plain
 * chain. mf_emu_gemm uses it by itself where it applies. */
bool mf_emu_fast_supported(const mf_kschedule *s);
void mf_emu_gemm_fast(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B,
                      const uint64_t *C0, uint64_t *C, int threads);
void mf_emu_force_portable(bool on);   /* tests compare the two */
/* The fast path in two parts, for a B used again and again (a weight matrix, decode step after decode step):
 * B decoded once (kept with a copy of its bits; the layout of the CPU kernel path current at packing), then any
 * number of products with it. Same bits as mf_emu_gemm_fast. mf_emu_packable: whether mf_emu_gemm takes the
 * fast path's plain chain for this schedule and K (the only case a pack serves). */
typedef struct mf_emu_bpack mf_emu_bpack;
/* The most the linear layers keep of decoded weight blocks for emu: profiles (numerics/linear.c), in bytes: a
 * trace's memory check counts it. */
#define MF_EMU_CACHE_BYTES ((size_t)256 << 20)
bool mf_emu_packable(const mf_kschedule *s, int K);
mf_emu_bpack *mf_emu_pack_b(const mf_kschedule *s, int N, int K, const uint64_t *B, int threads);
void mf_emu_gemm_packed(const mf_kschedule *s, int M, const uint64_t *A, const mf_emu_bpack *p, const uint64_t *C0,
                        uint64_t *C, int threads);
size_t mf_emu_bpack_bytes(const mf_emu_bpack *p);
bool mf_emu_bpack_current(const mf_emu_bpack *p);   /* made on the kernel path in use now */
void mf_emu_bpack_free(mf_emu_bpack *p);
/* The fast path's kernels compute the same bits: AVX-512 (eight double lanes
 * per column panel), AVX2 (four) and portable C. AUTO takes the widest the CPU
 * runs; the environment variable MOEFLIP_EMU_PATH=avx512|avx2|portable picks
 * one for a whole process (a kernel the CPU lacks falls back to its widest). */
typedef enum mf_emu_path { MF_EMU_PATH_AUTO, MF_EMU_PATH_PORTABLE, MF_EMU_PATH_AVX2, MF_EMU_PATH_AVX512 } mf_emu_path;
/* Forces a kernel (tests compare them); false when this CPU lacks it. */
bool mf_emu_force_path(mf_emu_path p);
/* The kernel the fast path runs now: "avx512", "avx2" or "portable". */
const char *mf_emu_path_name(void);
/* The reference path only (tests compare it with the fast one). */
void mf_emu_gemm_reference(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B,
                           const uint64_t *C0, uint64_t *C, int threads);

/* ---- numerics profiles ------------------------------------------------- */

/* MF_NUMERICS_FIXED: a GPU's own tensor-core instruction in a fixed schedule
 * (mma.sync m16n8k16, one k16 chain per output, K ascending from zero): on
 * a Hopper GPU it equals emu:hopper:mma.m16n8k16.f32.bf16.bf16.f32 bit for
 * bit. GPUs only. */
typedef enum mf_numerics_kind { MF_NUMERICS_NATIVE, MF_NUMERICS_FP64, MF_NUMERICS_EMU, MF_NUMERICS_FIXED } mf_numerics_kind;

/* How a block-scaled FP8 weight (MF_WQ_FP8_BLOCK) is multiplied under an emu: profile (docs/numerics.md):
 * MF_FP8_WIDEN  its values widened to the policy's weight dtype, the activations as they are, the product the
 *               profile's bf16/f16 instruction (or the fp32 chain), as for any other weight (the default);
 * MF_FP8_W8A8   `fp8=w8a8`: DeepSeek-V3's recipe as DeepGEMM runs it on Hopper: the activations quantised to
 *               e4m3 per token per block of the weight's k (mf_w8a8_quant), the codes multiplied by the fp8
 *               instruction, chained over each such block, every block's fp32 partial times its two scales
 *               added into an fp32 accumulator (mf_w8a8_gemm). emu:hopper only. */
typedef enum mf_fp8_products { MF_FP8_WIDEN, MF_FP8_W8A8 } mf_fp8_products;

typedef struct mf_numerics {
    char name[160];        /* canonical spelling, recorded in the manifest */
    mf_numerics_kind kind;
    char arch[16];         /* emu: volta, ampere, hopper, blackwell, rtxblackwell, cdna2, cdna3, cdna4 */
    bool has[2];           /* an instruction for bf16 [0] and f16 [1] operands */
    mf_kschedule bf16, f16;
    /* The architecture's instruction for fp8 (e4m3) operands and for MXFP4 (e2m1, ue8m0 scales per 32)
     * operands, under the same schedule; has_* false where it has none (or the schedule does not fit it). */
    bool has_fp8, has_mxf4;
    mf_kschedule fp8, mxf4;
    mf_fp8_products fp8_products;   /* MF_FP8_W8A8: FP8 weights' products as mf_w8a8_gemm computes them */
    /* NULL when the profile's models were checked against MMA-Sim or hardware; else why they were not
     * (the manifest records it). */
    const char *validation;
} mf_numerics;

/* "fp64", "native", "fixed", "emu:ARCH[:INSTR][:acc=N][:split=N][:reduce=seq|tree][:fp8=widen|w8a8]". */
int mf_numerics_parse(mf_numerics *n, const char *spec, mf_error *err);
/* The schedule for products of operands of this dtype, or NULL when the
 * product runs as an fp32 (or fp64) fma chain. */
const mf_kschedule *mf_numerics_schedule(const mf_numerics *n, mf_dtype operands);
/* The schedule for fp8 (MF_FMT_E4M3, MF_FMT_E5M2) or MXFP4 (MF_FMT_E2M1) products, or NULL where the
 * profile has no such instruction. */
const mf_kschedule *mf_numerics_schedule_fmt(const mf_numerics *n, mf_fmt operands);

/* ---- FP8 weights times quantised activations (fp8=w8a8) --------------- */

/* The smallest group maximum the activation quantiser takes (vLLM's per_token_group_quant_fp8 eps): a group of
 * zeros gets the scale fp32(1e-10 / 448) and zero codes, so its products are zero and nothing divides by 0. */
#define MF_W8A8_EPS 1e-10f
/* One group of activations (fp32 values) to e4m3 as vLLM's per_token_group_quant_fp8 computes it: the scale
 * s = fp32(max(max |x|, MF_W8A8_EPS) / 448), then q[i] = e4m3(fp32(x[i] / s)) nearest even, saturating at
 * +-448 (mf_f32_to_f8e4m3_sat). Returns s. */
float mf_w8a8_quant(const float *x, int n, uint8_t *q);
/* C[i, j] (row stride ldc, fp32) = the product of a [M, K] (row stride lda, fp32 values) and the FP8 block-scaled
 * w [N, K] (MF_WQ_FP8_BLOCK, blocks bn x bk) under fp8 (an e4m3 x e4m3 instruction; a block of k that is not
 * a whole number of its k is padded with zero codes). Row i of a is quantised in groups of
 * bk (mf_w8a8_quant, scales sa[i][b]); for each output and each block b of k, the instructions run in a chain
 * over the block's codes from a zero accumulator (the partial p, fp32), then the main accumulator
 * acc = fmaf(p, fp32(sa[i][b] x S[j / bn][b]), acc) in fp32, from zero, b ascending. Up to `threads` threads;
 * the same bits for any number. */
void mf_w8a8_gemm(const mf_kschedule *fp8, int M, const float *a, size_t lda, const mf_mat *w, float *c, size_t ldc,
                  int threads);

/* ---- linear layers and matrix products under a precision ------------ */

/* A weight [out, in] as the model holds it: a view of the checkpoint's
 * tensor (or of the one converted copy made where the policy's weight dtype
 * cannot hold the stored values), with an optional bias [out] (its values
 * rounded as the weights are). The model owns what the view points into. */
typedef struct mf_linear {
    int out, in;
    mf_mat w;
    double *bias;
} mf_linear;

/* How one product is carried out: the compute type of the kernel (MF_F32:
 * inputs are fp32 values, fp32 fma chain; MF_F64: double chain), what the
 * result is rounded to when stored (HF's "output dtype"), and threads. */
typedef struct mf_mm {
    mf_dtype compute;
    mf_dtype out;
    int threads;
    const mf_numerics *numerics;   /* NULL: native */
    mf_dtype in;                   /* dtype the inputs hold (BF16 and F16 go through an emulated instruction) */
} mf_mm;

/* y[M, out] = round_out(x[M, in] . W^T + b). In MF_F32 compute, x must hold
 * fp32-representable values (the caller rounded them); the bias is added to
 * the fp32 sum in fp32 before the output rounding, as addmm does. */
void mf_linear_apply(const mf_mm *mm, const mf_linear *L, const double *x, int M, double *y);
/* C[M, N] = round_out(A[M, K] . B^T), B any matrix view (an activation). */
void mf_matmul(const mf_mm *mm, const double *a, int M, size_t lda, const mf_mat *b, double *c, size_t ldc, mf_tri tri);
/* The same with fp32 activations (compute type fp32): x holds fp32 values,
 * y gets the results rounded to mm->out, as floats. */
void mf_linear_apply_f32(const mf_mm *mm, const mf_linear *L, const float *x, int M, float *y);
void mf_matmul_f32(const mf_mm *mm, const float *a, int M, size_t lda, const mf_mat *b, float *c, size_t ldc, mf_tri tri);
/* Frees the bias (the view's data belongs to the model). */
void mf_linear_free(mf_linear *L);

/* ---- activations (computed in double; the caller rounds) -------------- */

typedef enum mf_act { MF_ACT_SILU, MF_ACT_GELU, MF_ACT_GELU_TANH } mf_act;
double mf_act_apply(mf_act act, double x);
double mf_sigmoid(double x);

/* ---- precision policies ------------------------------------------------ */

/* Which dtype each part of the model computes in (CroVA's precision modes,
 * plus `router`; docs/precision.md). A part computing in a wider dtype
 * than the residual stream takes its inputs exactly and casts its outputs
 * back to the stream's dtype (the head's logits stay in its dtype).
 *
 * | policy            | stream | weights | attn | norm | mlp (router, experts, shared) | router | head | layers in fp32 |
 * | fp64              | f64    | f64     | f64  | f64  | f64                           | f64    | f64  |                |
 * | fp32              | f32    | f32     | f32  | f32  | f32                           | f32    | f32  |                |
 * | bf16 / fp16       | bf16   | bf16    | bf16 | bf16 | bf16                          | bf16   | bf16 |                |
 * | layercast         | f32    | bf16    | f32  | f32  | f32                           | f32    | f32  |                |
 * | selective:P+Q...  | bf16   | bf16    | f32 if chosen, else bf16                                    | firstN, lastN, blocks |
 * | nomlp             | f32    | bf16    | f32  | f32  | bf16                          | bf16   | f32  |                |
 * `router` (ours) puts only the router's product in fp32: its logits, the
 * softmax and top-k see fp32 values, and the weights stay fp32 as transformers
 * keeps them in the logits' dtype. */
typedef enum mf_part { MF_PART_ATTN, MF_PART_NORM, MF_PART_MLP, MF_PART_ROUTER, MF_PART_HEAD, MF_PART_COUNT } mf_part;

typedef enum mf_block_range { MF_BLOCKS_NONE, MF_BLOCKS_FIRST, MF_BLOCKS_LAST, MF_BLOCKS_ALL } mf_block_range;

typedef struct mf_precision {
    char name[64];
    mf_dtype act;                  /* the residual stream between parts */
    mf_dtype part[MF_PART_COUNT];  /* what each part computes in */
    mf_dtype weights;              /* weights are rounded to this when loaded */
    mf_dtype opmath;               /* what PyTorch computes elementwise ops in: F32, or F64 for the reference */
    mf_dtype compute;              /* matrix kernels' compute type */
    mf_block_range blocks;         /* decoder layers computed entirely in fp32 */
    int blocks_n;                  /* N of firstN / lastN */
} mf_precision;

/* fp64, fp32, bf16, fp16, layercast, nomlp, selective:<parts> with parts attn,
 * norm, mlp, router, head, firstN, lastN, blocks joined by '+'. */
int mf_precision_parse(mf_precision *p, const char *name, mf_error *err);
/* Whether decoder layer l of n_layers runs entirely in fp32. */
bool mf_precision_layer_fp32(const mf_precision *p, int l, int n_layers);
/* The widest dtype a part computes in anywhere (what a trace must store to keep its values exact). */
mf_dtype mf_precision_widest(const mf_precision *p, mf_part part);

#endif
