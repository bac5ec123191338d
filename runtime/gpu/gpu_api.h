/* The GPU backends' internal interface: what runtime/gpu/forward.c asks of
 * runtime/gpu/kernels.cu and gemm.cu. The same sources build the CUDA backend
 * (nvcc) and the HIP backend (hipcc), each a module of its own; GPU_FN gives
 * each its own symbols (mf_cuda_..., mf_hip_...).
 *
 * Weights live on the device once, in the dtype the model keeps them in
 * (mf_weight_storage: the checkpoint's, or the policy's narrower one), rows
 * padded to a multiple of 16 values; products that need fp32 operands widen
 * them as they read them (cuBLAS: into a scratch copy of the one weight).
 * Activations live on the device in double, as on the CPU, and every kernel
 * rounds at the CPU executor's cast points with the same formulas: a GPU run
 * under `fixed` or `emu:ARCH` numerics equals the CPU's run under the same
 * instruction model bit for bit. Matrix products take operands packed into
 * the instruction's input format ([batch][rows][Kp], K padded with zeros to
 * a multiple of 16); the fp32 sums get the bias in fp32 and are rounded to
 * the output dtype in the product's epilogue (inside the mma.sync kernel,
 * else a kernel of its own). */
#ifndef MF_GPU_API_H
#define MF_GPU_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MF_GPU_BACKEND_HIP)
#define GPU_FN(name) mf_hip_##name
#else
#define GPU_FN(name) mf_cuda_##name
#endif

/* dtypes of rounding and of operands */
enum { GK_F64 = 0, GK_F32 = 1, GK_BF16 = 2, GK_F16 = 3 };

/* matrix engines */
enum {
    GK_ENGINE_BLAS,    /* cuBLAS (what PyTorch calls for a dense product) */
    GK_ENGINE_MMA,     /* our tensor-core kernel: mma.sync m16n8k16 (CUDA) or MFMA 16x16x16 (HIP), k16 chain */
    GK_ENGINE_CHAIN32, /* one fp32 fma chain per output, k ascending from zero: the CPU's native fp32 */
    GK_ENGINE_EMU,     /* an instruction model of numerics/, in exact arithmetic */
};

enum { GK_EMU_NV_FUSED = 0, GK_EMU_AMD_GROUPED = 1 };

enum { GK_ACT_SILU = 0, GK_ACT_GELU = 1, GK_ACT_GELU_TANH = 2 };

typedef struct gk_ctx gk_ctx;

/* Block-scaled weights as B, kept as stored (numerics/mf_numerics.h's mf_mat_scales): element (j, kk) of
 * expert e is round_to(round, fp32(code) x fp32(scale)), code element j * rs + kk of codes[e] (FP8: one byte
 * a value; MXFP4: the low nibble of byte i / 2 for an even element i, the high one for an odd), scale element
 * (j / bn) * srs + kk / bk of scales[e] (FP8: of dtype sdt, GK_F32 / GK_BF16 / GK_F16; MXFP4: UE8M0 bytes,
 * 2^(b - 127), 0xff +inf). The engines widen B's values so as they stage B's tiles (cuBLAS: into a scratch copy
 * of the one weight), the values a dequantised copy of dtype `round` holds; zeros past row N and column K. */
enum { GK_WQ_NONE = 0, GK_WQ_FP8 = 1, GK_WQ_MXFP4 = 2 };
typedef struct gk_wq {
    int kind;                       /* GK_WQ_NONE: B is a plain matrix */
    int sdt, bn, bk, round;
    size_t rs, srs;
    const uint8_t *const *codes;    /* device [experts] of device pointers */
    const void *const *scales;
} gk_wq;

typedef struct gk_gemm {
    int engine, fmt;            /* fmt: GK_BF16, GK_F16 or GK_F32 operands */
    int M, N, K, Kp;            /* C[M, N] = A[M, K] . B[N, K]^T; rows of A and B hold Kp values */
    int batch;                  /* independent products (attention heads), strides below */
    const void *A;
    size_t a_bstride;
    const void *B;
    size_t b_bstride;           /* also the stride between experts' weights */
    int b_fmt;                  /* GK_ENGINE_CHAIN32: the dtype B holds (GK_BF16, GK_F16: widened as read); 0: fmt */
    gk_wq bq, bq2;              /* bq.kind != GK_WQ_NONE: B (bq2: B2) is block-scaled, B (B2) unused; not cuBLAS */
    float *C;                   /* [batch][M][N]: the fp32 sums when D is NULL, else scratch */
    size_t c_bstride;
    /* D non-NULL: the result leaves as round_outdt(C + bias[col]) (the sum and
     * bias in fp32) at D[b * d_bstride + row * ldd + col], as the CPU's epilogue */
    double *D;
    size_t ldd, d_bstride;
    const float *bias;
    int outdt;
    /* gate and up at once (GK_ENGINE_MMA on CUDA only): B holds the gate's
     * rows and B2 the up's (bias2 its bias); H receives the down
     * projection's operand, round_outdt(round_outdt(act(gate)) * up) as fmt
     * values, rows ldh apart, zeros from column N to ldh; C and D unused */
    const void *B2;
    const float *bias2;
    void *H;
    int ldh, act;
    const int *offsets;         /* grouped (experts): rows offsets[e] .. offsets[e+1]-1 use expert e's B; NULL: dense */
    int experts;
    /* GK_ENGINE_EMU */
    int emu_kind;               /* GK_EMU_NV_FUSED or GK_EMU_AMD_GROUPED */
    int emu_k;                  /* the instruction's k: the chain runs over K rounded up to it */
    int emu_chunk;              /* products summed at once: k / halves (NVIDIA), the group (AMD) */
    int emu_frac;               /* NVIDIA: fraction bits F of the aligned sum */
    int emu_zero_excluded;      /* NVIDIA: zero products take no part in the largest exponent */
    int call_id;                /* reported when a value falls outside the exact model's range */
} gk_gemm;

/* Context: one device, one stream. Returns 0, or nonzero with a message. */
int GPU_FN(ctx_open)(gk_ctx **out, int device, char *desc, size_t desc_n, char *msg, size_t msg_n);
/* How many GPUs of this backend the process sees (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ... applied): 0 with
 * msg naming why when the runtime finds none. */
int GPU_FN(device_count)(int *count, char *msg, size_t msg_n);
void GPU_FN(ctx_close)(gk_ctx *c);
/* Device memory (NULL when it cannot be had). */
void *GPU_FN(alloc)(gk_ctx *c, size_t bytes);
void GPU_FN(free)(gk_ctx *c, void *p);
void *GPU_FN(host_alloc)(size_t bytes);   /* pinned */
void GPU_FN(host_free)(void *p);
/* Host to device, complete on return. */
int GPU_FN(upload)(gk_ctx *c, void *dst, const void *src, size_t bytes);
/* Device to host, queued on the stream (complete after sync). */
int GPU_FN(download)(gk_ctx *c, void *dst, const void *src, size_t bytes);
/* Device to host on a second stream, behind the work queued so far, which
 * goes on meanwhile; the copy's completion is `mark` (0, 1, ...; copies
 * under one mark complete together). Returns 0, or nonzero. */
int GPU_FN(download_behind)(gk_ctx *c, void *dst, const void *src, size_t bytes, int mark);
/* Waits (the host only) for the copies under `mark`. Returns 0, or nonzero with a message. */
int GPU_FN(wait_mark)(gk_ctx *c, int mark, char *msg, size_t msg_n);
int GPU_FN(zero)(gk_ctx *c, void *dst, size_t bytes);
/* Waits for both streams. Returns 0, or nonzero with the first error's message. */
int GPU_FN(sync)(gk_ctx *c, char *msg, size_t msg_n);
/* The smallest call_id whose product met a value outside the emulator's exact
 * range since the last reset (INT32_MAX: none); valid after sync. */
int GPU_FN(emu_flag)(gk_ctx *c);
void GPU_FN(emu_flag_reset)(gk_ctx *c);

/* ---- elementwise (activations are double [rows][cols]) ---- */
/* dst = (float)src: for values already rounded to fp32 or narrower (exact). */
void GPU_FN(narrow)(gk_ctx *c, float *dst, const double *src, size_t n);
/* h[t] = round_dt(table[tokens[t]]), the table [V][H] of dtype table_dt (GK_BF16, GK_F16, GK_F32) */
void GPU_FN(embed)(gk_ctx *c, double *h, const void *table, int table_dt, const int32_t *tokens, int T, int H, int dt);
/* out[r] = round_C(round_S(round_D(w * round_D(round_O(v * rsqrt(mean(v^2) + eps)))))), v = round_D(in[r]);
 * with w32 (gpt-oss's norm_weight_fp32) round_D(round_O(w * round_O(v * rsqrt(...)))) inside instead;
 * C: a further cast (GK_F64: none) */
void GPU_FN(rmsnorm)(gk_ctx *c, double *out, const double *in, int rows, int n, size_t ld, const double *w, double eps,
                     int D, int S, int C, int w32);
/* Two in-place norms at once, rows n1 and n2 values long and apart (q's and k's) */
void GPU_FN(rmsnorm_pair)(gk_ctx *c, double *x1, int rows1, int n1, const double *w1, double *x2, int rows2, int n2,
                          const double *w2, double eps, int D, int S, int w32);
/* RoPE of the T rows (row_stride apart), heads head_stride apart, on the rdim dims from `off` within a head;
 * the tables hold rdim values a row. style: GK_ROPE_HALF (rotate_half, three roundings), GK_ROPE_DEINTERLEAVE
 * (the same on (x0, x2, ..., x1, x3, ...), left in that order), GK_ROPE_COMPLEX (pairs times cos + i sin in
 * fp32, written back interleaved, one rounding to D): runtime/cpu/forward_body.h's rope. */
enum { GK_ROPE_HALF = 0, GK_ROPE_DEINTERLEAVE = 1, GK_ROPE_COMPLEX = 2 };
void GPU_FN(rope)(gk_ctx *c, double *x, int T, int heads, size_t row_stride, size_t head_stride, int off, int rdim,
                  int style, const double *cos_t, const double *sin_t, int D);
/* DeepSeek's latent attention: the new rows' keys [T][heads x (nope + rope)] (each head's k_nope from kv, then the
 * one shared k_rope from ckv + kvr) and values [T][heads x vd] (from kv), kv [T][heads][nope + vd], ckv rows kvw
 * apart */
void GPU_FN(mla_kv)(gk_ctx *c, double *k, double *v, const double *kv, const double *ckv, int T, int heads, int nope,
                    int rope, int vd, int kvr, int kvw);
void GPU_FN(clip)(gk_ctx *c, double *x, size_t n, double bound);
/* h = round_C(round_S(h + round_S(y))) (C: a further cast, GK_F64: none) */
void GPU_FN(residual)(gk_ctx *c, double *h, const double *y, size_t n, int S, int C);
/* s [heads][Tq][Tk], query rows at positions q0 .. q0 + Tq - 1 against keys 0 .. Tk - 1: scale, causal
 * (sliding) mask, fp32 softmax, rounded to D; zeros where masked. sinks (device [heads], or NULL): gpt-oss's
 * per-head logit in each row's denominator */
void GPU_FN(softmax_causal)(gk_ctx *c, double *s, int heads, int Tq, int Tk, int q0, double scale, int window, int D,
                            const double *sinks);
/* g = round_D(round_D(act(g)) * u) */
void GPU_FN(act_mul)(gk_ctx *c, double *g, const double *u, size_t n, int act, int D);
/* gpt-oss's experts (experts/experts.c's clamped form) on R rows, grouped by offsets [E + 1] (NULL: one expert):
 * gu [R][2I] holds the fused gate_up product, gate i at column 2i and up i at 2i + 1 (the checkpoint's interleaved
 * order); each row's expert bias (device [E][2I], the same order) is added (fp32 sums rounded to D), then
 * h [R][I] = the clamped SwiGLU of them (clamps at limit, (u + 1) * g * sigmoid(alpha g), every step rounded to D) */
void GPU_FN(glu_clamped)(gk_ctx *c, const double *gu, double *h, int R, int I, const int *offsets, int E,
                         const double *bias, double alpha, double limit, int D);
/* y[r][j] = round_D(fp32(y[r][j] + bias[expert of r][j])), R rows of N, bias device [E][N] */
void GPU_FN(expert_bias)(gk_ctx *c, double *y, int R, int N, const int *offsets, int E, const double *bias, int D);
/* Routing of T tokens: fp32 softmax, canonical top-k, optional renormalisation, weights rounded to wdt.
 * The first n_rep tokens replay: their experts are rep_ids [n_rep][K] (rank order), their weights rep_w's
 * (rounded to wdt) or, rep_w NULL, this router's probabilities of those experts, renormalised as its own. */
void GPU_FN(route)(gk_ctx *c, const double *logits, double *probs, int T, int E, int K, int norm, int wdt,
                   uint16_t *ids, double *w, const uint16_t *rep_ids, const double *rep_w, int n_rep);
/* The grouped and scaled routers (router/router.c's SIGMOID_GROUP and SOFTMAX_GREEDY kinds, fp32 opmath):
 * scores, the selection row (biased, groups masked) into sel [T][E], canonical top-k of it, weights
 * (renormalised with the 1e-20, times the scaling factor) rounded to wdt; replayed tokens as in route. */
/* GK_ROUTE_TOPK_SOFTMAX: gpt-oss's router, the top k of the logits (its selection row: the logits themselves),
 * softmax over those k (router.c's mf_route_weights_logits) */
enum { GK_ROUTE_SIGMOID_GROUP = 0, GK_ROUTE_SOFTMAX_GREEDY = 1, GK_ROUTE_TOPK_SOFTMAX = 2 };
typedef struct gk_route_spec {
    int kind, E, K, norm, n_group, topk_group, group_limited, wdt;
    const double *bias;   /* device [E] or NULL */
    double scale;
} gk_route_spec;
void GPU_FN(route_grouped)(gk_ctx *c, const gk_route_spec *spec, const double *logits, double *probs, double *sel,
                           int T, uint16_t *ids, double *w, const uint16_t *rep_ids, const double *rep_w, int n_rep);
/* Rows grouped by expert (ascending), tokens ascending within one; offset
 * has room for 2E + 1 ints (the counts follow the offsets). */
void GPU_FN(dispatch)(gk_ctx *c, const uint16_t *ids, int T, int K, int E, int *offset, int *token, int *row_of);
/* op[r][:] = x[token[r]][:] in the operand format, zero padded to Kp */
void GPU_FN(gather)(gk_ctx *c, void *op, int fmt, int Kp, const double *x, int H, const int *token, int R);
/* out[t] = round_out(sum_s round_sum(acc + round_prod(y[row_of[t,s]] * w[t,s]))) */
void GPU_FN(combine)(gk_ctx *c, double *out, const double *y, int T, int H, int K, const int *row_of,
                     const double *w, int prod, int sum, int outdt);
/* Qwen2-MoE's shared expert: g = round_D(sigmoid(g)); out = round_D(out + round_D(g * s)) */
void GPU_FN(shared_add)(gk_ctx *c, double *out, const double *s, double *g, int T, int H, int D);

/* ---- matrix products ---- */
/* dst[b][r][col] = src[(b / group) * sb + r * sr + col * sc] in fmt for col < cols, 0 up to colsp */
void GPU_FN(pack)(gk_ctx *c, void *dst, int fmt, int batch, int rows, int cols, int colsp, const double *src,
                  size_t sb, int group, size_t sr, size_t sc);
/* dst[i] = src[i] widened to fp32 (exact), src of dtype src_dt (GK_BF16 or GK_F16) */
void GPU_FN(widen)(gk_ctx *c, float *dst, const void *src, int src_dt, size_t n);
/* dst [n][kp] = the values of expert 0 of q's weight [n][k] (zeros from k to kp) as fmt values (GK_F32, or
 * q->round's GK_BF16 / GK_F16): the cuBLAS operand of a block-scaled weight. */
void GPU_FN(widen_q)(gk_ctx *c, void *dst, int fmt, const gk_wq *q, int n, int k, int kp);
/* Returns 0, or nonzero with a message (an engine this build lacks, a cuBLAS failure). */
int GPU_FN(gemm)(gk_ctx *c, const gk_gemm *g, char *msg, size_t msg_n);
/* C[i][j] + bias[j] (in fp32) into [M][N] values of outdt itself (bf16 or f16
 * bits, else fp32): the logits, exact in their dtype, in the fewest bytes to move. */
void GPU_FN(epilogue_packed)(gk_ctx *c, void *dst, const float *C, int M, int N, const float *bias, int outdt);

/* ---- weight upload (runtime/gpu/upload.c) ---- */
/* Free and total memory of the context's device. Returns 0, or nonzero with a message. */
int GPU_FN(mem_info)(gk_ctx *c, size_t *free_bytes, size_t *total_bytes, char *msg, size_t msg_n);
/* Makes the context's device the calling thread's (before its first call on a new thread). */
int GPU_FN(bind_thread)(gk_ctx *c);
/* Pinned host memory to the device on the main stream, not waited for. */
int GPU_FN(copy_async)(gk_ctx *c, void *dst, const void *src, size_t bytes);
/* Staging slots (0 .. GK_SLOTS - 1): slot_record marks the copies queued so
 * far (out of that slot's pinned buffer); slot_wait returns when they are
 * done, so the buffer may be filled again. Both return 0, or nonzero. */
#define GK_SLOTS 8
int GPU_FN(slot_record)(gk_ctx *c, int slot);
int GPU_FN(slot_wait)(gk_ctx *c, int slot);
/* Elements e0 .. e0 + n - 1 of a weight, read as src_dt (GK_F64, GK_F32,
 * GK_BF16, GK_F16) from src (device), stored as dst_dt (rounded to nearest
 * even, as mf_store_from_f64) at dst[(e / k) * kp + e % k]. */
void GPU_FN(place)(gk_ctx *c, void *dst, int dst_dt, int k, int kp, size_t e0, const void *src, int src_dt, size_t n);
/* The same for per-expert matrices [A][B] that a product reads transposed (gpt-oss's "x @ W" experts): element
 * e0 + i (expert x, row a, column b) goes to row b of expert x, column a, at dst[(x * B + b) * kp + a]. */
void GPU_FN(place_t)(gk_ctx *c, void *dst, int dst_dt, int A, int B, int kp, size_t e0, const void *src, int src_dt,
                     size_t n);

#ifdef __cplusplus
}
#endif

#endif
