/* Matrix products on the GPU: operands packed into an instruction's input
 * format, the engines (cuBLAS; our mma.sync / MFMA k16 chain; the CPU's fp32
 * fma chain; numerics/'s instruction models in exact arithmetic), and the
 * epilogues that round the fp32 sums where the CPU rounds them. One source
 * for CUDA and HIP. */
#include "gpu_device.h"

/* ------------------------------------------------------------- operands */

__global__ static void k_pack(void *dst, int fmt, int rows, int cols, int colsp, const double *src, size_t sb,
                              int group, size_t sr, size_t sc) {
    const int r = blockIdx.x, col = blockIdx.y * blockDim.x + threadIdx.x, b = blockIdx.z;
    if (col >= colsp) return;
    double v = col < cols ? src[(size_t)(b / group) * sb + r * sr + col * sc] : 0.0;
    put_operand(dst, fmt, ((size_t)b * rows + r) * colsp + col, v);
}

extern "C" void GPU_FN(pack)(gk_ctx *c, void *dst, int fmt, int batch, int rows, int cols, int colsp,
                             const double *src, size_t sb, int group, size_t sr, size_t sc) {
    if (batch > 0 && rows > 0 && colsp > 0)
        k_pack<<<row_grid(rows, colsp, batch), THREADS, 0, c->stream>>>(dst, fmt, rows, cols, colsp, src, sb, group,
                                                                        sr, sc);
}

__global__ static void k_widen(float *dst, const void *src, int src_dt, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (float)get_value(src, src_dt, i);
}

extern "C" void GPU_FN(widen)(gk_ctx *c, float *dst, const void *src, int src_dt, size_t n) {
    if (n) k_widen<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, src, src_dt, n);
}

__global__ static void k_epilogue(double *dst, const float *C, int M, int N, size_t ldc, size_t dst_bstride,
                                  const float *bias, int outdt) {
    const int r = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x, b = blockIdx.z;
    if (j >= N) return;
    float v = C[((size_t)b * M + r) * N + j];
    if (bias) v = v + bias[j];
    dst[b * dst_bstride + r * ldc + j] = rd(outdt, (double)v);
}

__global__ static void k_epilogue_packed(void *dst, const float *C, int N, const float *bias, int outdt) {
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= N) return;
    const size_t i = (size_t)blockIdx.x * N + j;
    float v = C[i];
    if (bias) v = v + bias[j];
    if (outdt == GK_BF16) ((uint16_t *)dst)[i] = mf_f64_to_bf16((double)v);
    else if (outdt == GK_F16) ((uint16_t *)dst)[i] = mf_f64_to_f16((double)v);
    else ((float *)dst)[i] = v;
}

extern "C" void GPU_FN(epilogue_packed)(gk_ctx *c, void *dst, const float *C, int M, int N, const float *bias,
                                        int outdt) {
    if (M > 0 && N > 0) k_epilogue_packed<<<row_grid(M, N, 1), THREADS, 0, c->stream>>>(dst, C, N, bias, outdt);
}

/* ------------------------------------------------------ block-scaled B */

/* An e4m3fn byte's value (exact in fp32), S.1111.111 its one NaN: numerics/gemm.c's decoding. */
__device__ static float e4m3_f32(unsigned b) {
    if ((b & 0x7fu) == 0x7fu) return __int_as_float(0x7fc00000);
    const unsigned sign = (b & 0x80u) << 24, ex = (b >> 3) & 15u, m = b & 7u;
    if (!ex) {
        const float v = (float)m * 0x1p-9f;   /* subnormal: m/8 x 2^-6 */
        return sign ? -v : v;
    }
    return __uint_as_float(sign | (ex + 120u) << 23 | m << 20);   /* (1 + m/8) 2^(ex - 7) */
}

/* An OCP e2m1 nibble's value: 1 sign, 2 exponent (bias 1), 1 mantissa bit, no Inf or NaN. */
__device__ static float e2m1_f32(unsigned n) {
    const unsigned mag = n & 7u;
    const float v = mag < 2 ? 0.5f * (float)mag : (float)(2 + (mag & 1)) * (float)(1 << ((mag >> 1) - 1)) * 0.5f;
    return n & 8u ? -v : v;
}

/* Element (j, kk) of expert e of a block-scaled B (j < N, kk < K): round_to(round, fp32(code) x fp32(scale)),
 * as a float, numerics/gemm.c's q_row: what dequantising the weight into a tensor of dtype round holds. */
__device__ static float wq_value(const gk_wq *q, int e, int j, int kk) {
    const size_t i = (size_t)j * q->rs + (size_t)kk, si = (size_t)(j / q->bn) * q->srs + (size_t)(kk / q->bk);
    const uint8_t *c = q->codes[e];
    float code, s;
    if (q->kind == GK_WQ_FP8) {
        code = e4m3_f32(c[i]);
        s = (float)get_value(q->scales[e], q->sdt, si);
    } else {
        code = e2m1_f32(i & 1 ? c[i >> 1] >> 4 : c[i >> 1] & 15u);
        const unsigned b = ((const uint8_t *)q->scales[e])[si];
        s = __uint_as_float(b ? b << 23 : 1u << 22);   /* 2^(b - 127): 2^-127 for 0, +inf for 0xff */
    }
    const float v = __fmul_rn(code, s);
    if (q->round == GK_BF16) return mf_bf16_to_f32(mf_f32_to_bf16(v));
    if (q->round == GK_F16) return (float)mf_round_f16((double)v);
    return v;
}

/* The same as a 16-bit operand of fmt (GK_BF16 or GK_F16, q->round's: exact), 0 outside [N) x [K). */
__device__ static uint16_t wq_bits(const gk_wq *q, int e, int j, int kk, int N, int K, int fmt) {
    if (j >= N || kk >= K) return 0;
    const float v = wq_value(q, e, j, kk);
    return fmt == GK_BF16 ? mf_f32_to_bf16(v) : mf_f64_to_f16((double)v);
}

__global__ static void k_widen_q(void *dst, int fmt, gk_wq q, int n, int k, int kp) {
    const int j = blockIdx.x, kk = blockIdx.y * blockDim.x + threadIdx.x;
    if (kk >= kp) return;
    const size_t i = (size_t)j * kp + kk;
    if (fmt == GK_F32) ((float *)dst)[i] = kk < k ? wq_value(&q, 0, j, kk) : 0.0f;
    else ((uint16_t *)dst)[i] = wq_bits(&q, 0, j, kk, n, k, fmt);
}

extern "C" void GPU_FN(widen_q)(gk_ctx *c, void *dst, int fmt, const gk_wq *q, int n, int k, int kp) {
    if (n > 0 && kp > 0) k_widen_q<<<row_grid(n, kp, 1), THREADS, 0, c->stream>>>(dst, fmt, *q, n, k, kp);
}

/* -------------------------------------------------------- matrix products */

/* Which rows a block handles: dense, rows [by * BM, ...); grouped, the
 * by-th row tile counted over experts in order. */
__device__ static bool tile_rows(const gk_gemm *g, int by, int BM, int *e, int *r0, int *r1) {
    if (!g->offsets) {
        *e = 0;
        *r0 = by * BM;
        *r1 = g->M;
        return *r0 < g->M;
    }
    for (int x = 0; x < g->experts; x++) {
        int n = g->offsets[x + 1] - g->offsets[x], tiles = (n + BM - 1) / BM;
        if (by < tiles) {
            *e = x;
            *r0 = g->offsets[x] + by * BM;
            *r1 = g->offsets[x + 1];
            return true;
        }
        by -= tiles;
    }
    return false;
}

static unsigned row_tiles(const gk_gemm *g, int BM) {
    return (unsigned)((g->M + BM - 1) / BM + (g->offsets ? g->experts : 0));
}

/* ---- fp32 fma chain: the CPU's native fp32 product, element for element */

#define CT 16
__global__ static void k_chain32(gk_gemm g) {
    __shared__ float As[CT][CT + 1], Bs[CT][CT + 1];
    int e, r0, r1;
    if (!tile_rows(&g, blockIdx.y, CT, &e, &r0, &r1)) return;
    const int b = blockIdx.z, tx = threadIdx.x, ty = threadIdx.y;
    const int i = r0 + ty, j = blockIdx.x * CT + tx;
    const float *A = (const float *)g.A + (size_t)b * g.a_bstride;
    /* B's values: fp32, or bf16/f16 widened as they are read (exact) */
    const int bfmt = g.b_fmt ? g.b_fmt : GK_F32;
    const size_t b0 = (size_t)b * g.b_bstride + (size_t)e * g.b_bstride * (g.offsets != NULL);
    float acc = 0;
    for (int k0 = 0; k0 < g.K; k0 += CT) {
        int ar = r0 + ty, bc = blockIdx.x * CT + ty;
        As[ty][tx] = ar < r1 && k0 + tx < g.Kp ? A[(size_t)ar * g.Kp + k0 + tx] : 0.0f;
        if (g.bq.kind) Bs[ty][tx] = bc < g.N && k0 + tx < g.K ? wq_value(&g.bq, e, bc, k0 + tx) : 0.0f;
        else Bs[ty][tx] = bc < g.N && k0 + tx < g.Kp ? (float)get_value(g.B, bfmt, b0 + (size_t)bc * g.Kp + k0 + tx) : 0.0f;
        __syncthreads();
        int kn = g.K - k0 < CT ? g.K - k0 : CT;
        for (int kk = 0; kk < kn; kk++) acc = fmaf(As[ty][kk], Bs[tx][kk], acc);
        __syncthreads();
    }
    if (i < r1 && j < g.N) g.C[(size_t)b * g.c_bstride + (size_t)i * g.N + j] = acc;
}

/* ---- instruction models (numerics/emu_fast.c's formulas, one element per thread) */

/* MMA-Sim's exponent of a value: unbiased for normal numbers, the format's
 * minimum for subnormals. */
__device__ static int value_exp(double v, int min_exp) {
    int e;
    frexp(v, &e);
    return e - 1 < min_exp ? min_exp : e - 1;
}

/* NVIDIA fused dot-add of n products onto c: products aligned to the
 * largest exponent E (c's included), truncated to F fraction bits, summed
 * exactly, the sum truncated to fp32. */
__device__ static double nv_chunk(int n, const double *av, const int *ae, const double *bv, const int *be, double c,
                                  int F) {
    int ec = c == 0 ? -126 : value_exp(c, -126);
    int E = ec;
    for (int i = 0; i < n; i++) E = max(E, ae[i] + be[i]);
    double sc = ldexp(1.0, F - E), S = trunc(c * sc);
    for (int i = 0; i < n; i++) S += trunc(av[i] * bv[i] * sc);
    if (S == 0) return 0.0;
    int es;
    frexp(S, &es);
    int ev = es - 1 + E - F;
    int q = (ev < -126 ? -126 : ev) - 23;
    return ldexp(trunc(ldexp(S, E - F - q)), q) + 0.0;   /* a sum truncated to zero is +0 */
}

/* AMD CDNA3 grouped dot: products aligned to their largest exponent at 24
 * bits, then added to c at 31 bits (both rounding down), one RNE rounding. */
__device__ static double amd_group(int n, const double *av, const int *ae, const double *bv, const int *be, double c) {
    int Ep = INT_MIN;
    for (int i = 0; i < n; i++) Ep = max(Ep, ae[i] + be[i]);
    double sp = ldexp(1.0, 24 - Ep), S = 0;
    for (int i = 0; i < n; i++) S += trunc(av[i] * bv[i] * sp);
    int ec = c == 0 ? -126 : value_exp((float)c, -126);
    int E = Ep > ec ? Ep : ec;
    double s31 = floor(ldexp(S, 7 + Ep - E));
    double c24 = floor(ldexp(c, 24 - E));
    return (double)(float)ldexp(s31 + c24 * 128.0, E - 31);
}

#define ET 16
__global__ static void k_emu(gk_gemm g, int *flag) {
    __shared__ double Av[ET][ET + 1], Bv[ET][ET + 1];
    __shared__ int Ae[ET][ET + 1], Be[ET][ET + 1];
    int e, r0, r1;
    if (!tile_rows(&g, blockIdx.y, ET, &e, &r0, &r1)) return;
    const int b = blockIdx.z, tx = threadIdx.x, ty = threadIdx.y;
    const int i = r0 + ty, j = blockIdx.x * ET + tx;
    const uint16_t *A = (const uint16_t *)g.A + (size_t)b * g.a_bstride;
    const uint16_t *B = (const uint16_t *)g.B + (size_t)b * g.b_bstride + (size_t)e * g.b_bstride * (g.offsets != NULL);
    const int min_e = g.fmt == GK_F16 ? -14 : -126;
    const int zero_e = g.emu_kind == GK_EMU_NV_FUSED && g.emu_zero_excluded ? -1000000 : -126;
    const int Kq = (g.K + g.emu_k - 1) / g.emu_k * g.emu_k;
    double acc = 0;
    bool unsafe = false;
    for (int k0 = 0; k0 < Kq; k0 += ET) {
        int ar = r0 + ty, bc = blockIdx.x * ET + ty;
        uint16_t ab = ar < r1 && k0 + tx < g.Kp ? A[(size_t)ar * g.Kp + k0 + tx] : 0;
        uint16_t bb = g.bq.kind ? wq_bits(&g.bq, e, bc, k0 + tx, g.N, g.K, g.fmt)
                      : bc < g.N && k0 + tx < g.Kp ? B[(size_t)bc * g.Kp + k0 + tx] : 0;
        double av = g.fmt == GK_F16 ? mf_f16_to_f32(ab) : mf_bf16_to_f32(ab);
        double bv = g.fmt == GK_F16 ? mf_f16_to_f32(bb) : mf_bf16_to_f32(bb);
        unsafe |= !isfinite(av) || !isfinite(bv);
        Av[ty][tx] = isfinite(av) ? av : 0.0;
        Bv[ty][tx] = isfinite(bv) ? bv : 0.0;
        Ae[ty][tx] = av == 0 || !isfinite(av) ? (av == 0 ? zero_e : -126) : value_exp(av, min_e);
        Be[ty][tx] = bv == 0 || !isfinite(bv) ? (bv == 0 ? zero_e : -126) : value_exp(bv, min_e);
        __syncthreads();
        double av_[ET], bv_[ET];
        int ae_[ET], be_[ET];
        for (int kk = 0; kk < ET; kk++) {
            av_[kk] = Av[ty][kk];
            ae_[kk] = Ae[ty][kk];
            bv_[kk] = Bv[tx][kk];
            be_[kk] = Be[tx][kk];
            unsafe |= ae_[kk] + be_[kk] > 125;
        }
        for (int c0 = 0; c0 < ET && k0 + c0 < Kq; c0 += g.emu_chunk) {
            if (g.emu_kind == GK_EMU_NV_FUSED)
                acc = nv_chunk(g.emu_chunk, av_ + c0, ae_ + c0, bv_ + c0, be_ + c0, acc, g.emu_frac);
            else
                acc = amd_group(g.emu_chunk, av_ + c0, ae_ + c0, bv_ + c0, be_ + c0, acc);
            unsafe |= !(fabs(acc) < 0x1p126);
        }
        __syncthreads();
    }
    if (i < r1 && j < g.N) {
        g.C[(size_t)b * g.c_bstride + (size_t)i * g.N + j] = (float)acc;
        if (unsafe) atomicMin(flag, g.call_id);
    }
}

#if defined(GPU_CUDA)
/* ---- the instruction models again, register-tiled (CUDA): the same values as k_emu
 *
 * k_emu spends its time in frexp, ldexp and trunc, one output per thread.
 * Here each thread holds a 4 x 4 tile of outputs; operands are decoded once
 * per block (value as double, exponent as int) into shared memory; and
 * truncating a term to a multiple of a power of two Q is one add and one
 * subtract of a "magic" M = 1.5 * 2^52 * Q in the right rounding mode (the
 * sum's last place is Q, so rounding it toward zero, or down, is the
 * truncation; the subtraction is exact). A chunk's terms, so truncated, add
 * up exactly (k_emu_tiled counts them in units of Q, in ints: see there).
 *   NVIDIA fused: E = max(c's exponent, the products'); terms (c among them)
 *     truncated toward zero at Q = 2^(E - F); the sum rounded toward zero to
 *     fp32 (__double2float_rz, subnormals included) is k_emu's normalisation.
 *   AMD CDNA3 grouped: Ep = the products' largest exponent; products truncated
 *     toward zero at 2^(Ep - 24) and summed; E = max(Ep, c's exponent); the
 *     sum rounded down at 2^(E - 31), c at 2^(E - 24), both added and rounded
 *     to fp32 to nearest. */
#define EM_T 4                 /* outputs per thread along each side */
#define EM_B (16 * EM_T)       /* block tile: 64 x 64 */
#define EM_K 16                /* K staged per step */

/* MMA-Sim's exponent of an fp32 value: unbiased for normal numbers, -126 for subnormals and zero */
__device__ static int f32_exp(float v) {
    const int e = (int)((__float_as_uint(v) >> 23) & 0xffu);
    return e == 0 ? -126 : e - 127;
}

/* One operand: its magnitude (0 for a non-finite one, which is flagged), exponent and sign (0, or -2 for a
 * negative one: (sa ^ sb) | 1 is then the product's sign as +-1) */
__device__ static void em_decode(uint16_t bits, int fmt, int zero_e, double *v, int *e, int *sg, bool *bad) {
    const uint16_t mag = bits & 0x7fffu;
    if (fmt == GK_F16) {
        const int ex = (bits >> 10) & 0x1f;
        *bad |= ex == 0x1f;
        *v = ex == 0x1f ? 0.0 : (double)mf_f16_to_f32(mag);
        *e = mag == 0 ? zero_e : ex == 0x1f ? -126 : ex == 0 ? -14 : ex - 15;
    } else {
        const int ex = (bits >> 7) & 0xff;
        *bad |= ex == 0xff;
        *v = ex == 0xff ? 0.0 : (double)mf_bf16_to_f32(mag);
        *e = mag == 0 ? zero_e : ex == 0xff ? -126 : ex == 0 ? -126 : ex - 127;
    }
    *sg = bits & 0x8000u ? -2 : 0;
}

/* An exponent in both halves of a signed 16-bit pair */
__device__ static unsigned pair_both(int e) { return ((unsigned)e & 0xffffu) * 0x10001u; }
/* Four consecutive k of row j of a block-scaled B as k_emu_tiled stages them (one 8-byte load of a plain B) */
__device__ static uint2 wq_raw4(const gk_wq *q, int e, int j, int kk, int N, int K, int fmt) {
    uint16_t v[4];
    for (int t = 0; t < 4; t++) v[t] = wq_bits(q, e, j, kk + t, N, K, fmt);
    return make_uint2((unsigned)v[0] | (unsigned)v[1] << 16, (unsigned)v[2] | (unsigned)v[3] << 16);
}

/* The high word of M = 1.5 * 2^x (its low word is zero) */
__device__ static int magic_hi(int x) { return (1023 + x) << 20 | 1 << 19; }

/* CHUNK: the products fused at once (the instruction's k over its halves, or AMD's group), a compile-time
 * constant so that the loops over them unroll into immediate shared-memory offsets. PARTS: the int counts a
 * chunk's sum is kept in (one per CHUNK / PARTS products; each count is below CHUNK / PARTS * 2^(F+2), plus
 * 2^(F+1) for NVIDIA's c in the first, and must fit in 31 bits).
 *
 * A product's term is counted, not added: with M = 1.5 * 2^52 * Q, fma_rz(|a|, |b|, M) lies in [2^52 Q, 2^53 Q),
 * where the last place is Q, so it is M plus |a b| truncated to a multiple of Q, and its low word is that multiple
 * (under 2^(F+2), as the product is below 4 * 2^E and Q = 2^(E - F)). The signed counts add up exactly; the chunk's
 * sum is their total times Q, the same double the terms' own sum was. Per product: one double fma, one logic
 * operation for the sign, one integer multiply-add, the exponent's add-and-max, and shared-memory loads of two
 * (values) or four (exponents, signs) k at once: rows are padded to 16 bytes, not to an odd count of words, which
 * costs no extra wavefronts for the 16 distinct rows a warp reads. */
#define EM_KD (EM_K + 2)       /* a row of doubles: 144 bytes */
#define EM_KI (EM_K + 4)       /* a row of ints: 80 bytes */
template <int CHUNK, int PARTS, bool NV>
__global__ static void __launch_bounds__(256, 2) k_emu_tiled(gk_gemm g, int *flag) {
    static_assert(NV || PARTS == 1, "AMD's epilogue reads one count");
    __shared__ __align__(16) double Av[EM_B][EM_KD], Bv[EM_B][EM_KD];
    /* Exponents, by kind (each measured both ways, bench/README.md):
     *   NVIDIA: ints, Ae[row][k], Be[column][k].
     *   AMD: signed 16-bit pairs for Hopper's two-lane add-and-max (DPX), which took emu:cdna3 from 421 to 382 ms
     *     a forward but slowed both NVIDIA models (280 -> 319 ms Hopper, 323 -> 368 Ampere): A's row r holds its
     *     exponent in both halves; B's pair (jp, c) = Be[jp * 16 + c] holds columns c + 32 jp (low half) and
     *     c + 32 jp + 16 (high), a thread's outputs j = 2 jp and 2 jp + 1. */
    __shared__ __align__(16) unsigned Ae[EM_B][EM_KI], Be[EM_B][EM_KI];
    __shared__ __align__(16) int As[EM_B][EM_KI], Bs[EM_B][EM_KI];
    int e, r0, r1;
    if (!tile_rows(&g, blockIdx.y, EM_B, &e, &r0, &r1)) return;
    const int b = blockIdx.z, tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx, n0 = blockIdx.x * EM_B;
    const uint16_t *A = (const uint16_t *)g.A + (size_t)b * g.a_bstride;
    const uint16_t *B = (const uint16_t *)g.B + (size_t)b * g.b_bstride + (size_t)e * g.b_bstride * (g.offsets != NULL);
    constexpr bool nv = NV;
    /* NVIDIA's zero products, when excluded from the largest exponent, sum far below any real one */
    const int zero_e = nv && g.emu_zero_excluded ? -1000000 : -126;
    const int Kq = (g.K + g.emu_k - 1) / g.emu_k * g.emu_k, chunk = CHUNK, F = nv ? g.emu_frac : 24;
    constexpr int PART = CHUNK / PARTS;
    float acc[EM_T][EM_T];
    for (int i = 0; i < EM_T; i++)
        for (int j = 0; j < EM_T; j++) acc[i][j] = 0.0f;
    bool bad = false;
    /* Staging: each thread brings four consecutive k of one row of A and of B (one 8-byte load each: rows hold
     * Kp values, a multiple of 16, and the host checks the alignment). Loading the next step's during this one's
     * products measured the same (429 ms a forward either way, emu:cdna3 at OLMoE-1B-7B dims) and spilled more. */
    const int sr = tid >> 2, sk = (tid & 3) * 4;
    const bool a_in = r0 + sr < r1, b_in = n0 + sr < g.N;
    const uint2 *a_src = (const uint2 *)(A + (size_t)(a_in ? r0 + sr : 0) * g.Kp + sk);
    const uint2 *b_src = (const uint2 *)(B + (size_t)(b_in ? n0 + sr : 0) * g.Kp + sk);
    const uint2 zero2 = make_uint2(0u, 0u);
    for (int k0 = 0; k0 < Kq; k0 += EM_K) {
        {
            const uint2 a_raw = a_in && k0 + sk < g.Kp ? a_src[k0 / 4] : zero2;
            const uint2 b_raw = g.bq.kind ? wq_raw4(&g.bq, e, n0 + sr, k0 + sk, g.N, g.K, g.fmt)
                                : b_in && k0 + sk < g.Kp ? b_src[k0 / 4] : zero2;
            const uint16_t av4[4] = {(uint16_t)a_raw.x, (uint16_t)(a_raw.x >> 16), (uint16_t)a_raw.y, (uint16_t)(a_raw.y >> 16)};
            const uint16_t bv4[4] = {(uint16_t)b_raw.x, (uint16_t)(b_raw.x >> 16), (uint16_t)b_raw.y, (uint16_t)(b_raw.y >> 16)};
            double va[4], vb[4];
            int ea[4], eb[4], sa[4], sb[4];
            for (int q = 0; q < 4; q++) {
                em_decode(av4[q], g.fmt, zero_e, &va[q], &ea[q], &sa[q], &bad);
                em_decode(bv4[q], g.fmt, zero_e, &vb[q], &eb[q], &sb[q], &bad);
            }
            *(double2 *)&Av[sr][sk] = make_double2(va[0], va[1]);
            *(double2 *)&Av[sr][sk + 2] = make_double2(va[2], va[3]);
            *(double2 *)&Bv[sr][sk] = make_double2(vb[0], vb[1]);
            *(double2 *)&Bv[sr][sk + 2] = make_double2(vb[2], vb[3]);
            if constexpr (NV) {
                *(int4 *)&Ae[sr][sk] = make_int4(ea[0], ea[1], ea[2], ea[3]);
                *(int4 *)&Be[sr][sk] = make_int4(eb[0], eb[1], eb[2], eb[3]);
            } else {
                *(uint4 *)&Ae[sr][sk] = make_uint4(pair_both(ea[0]), pair_both(ea[1]), pair_both(ea[2]), pair_both(ea[3]));
                unsigned short *be = (unsigned short *)&Be[(sr >> 5) * 16 + (sr & 15)][sk] + ((sr >> 4) & 1);
                for (int q = 0; q < 4; q++) be[2 * q] = (unsigned short)eb[q];
            }
            *(int4 *)&As[sr][sk] = make_int4(sa[0], sa[1], sa[2], sa[3]);
            *(int4 *)&Bs[sr][sk] = make_int4(sb[0], sb[1], sb[2], sb[3]);
        }
        __syncthreads();
        for (int c0 = 0; c0 < EM_K && k0 + c0 < Kq; c0 += chunk) {
            int E[EM_T][EM_T];
            if constexpr (NV) {
                for (int i = 0; i < EM_T; i++)
                    for (int j = 0; j < EM_T; j++) E[i][j] = f32_exp(acc[i][j]);
#pragma unroll
                for (int kk = c0; kk < c0 + CHUNK; kk += 4) {
                    int4 ea[EM_T], eb[EM_T];
                    for (int i = 0; i < EM_T; i++) ea[i] = *(const int4 *)&Ae[ty + 16 * i][kk];
                    for (int j = 0; j < EM_T; j++) eb[j] = *(const int4 *)&Be[tx + 16 * j][kk];
                    for (int i = 0; i < EM_T; i++)
                        for (int j = 0; j < EM_T; j++)
                            E[i][j] = max(max(max(max(E[i][j], ea[i].x + eb[j].x), ea[i].y + eb[j].y),
                                              ea[i].z + eb[j].z),
                                          ea[i].w + eb[j].w);
                }
            } else {
                unsigned EP[EM_T][EM_T / 2];   /* E of outputs (i, 2 jp) and (i, 2 jp + 1), low and high half */
                for (int i = 0; i < EM_T; i++)
                    for (int jp = 0; jp < EM_T / 2; jp++) EP[i][jp] = 0x80008000u;   /* -32768 twice */
#pragma unroll
                for (int kk = c0; kk < c0 + CHUNK; kk += 4) {
                    uint4 ea[EM_T], eb[EM_T / 2];
                    for (int i = 0; i < EM_T; i++) ea[i] = *(const uint4 *)&Ae[ty + 16 * i][kk];
                    for (int jp = 0; jp < EM_T / 2; jp++) eb[jp] = *(const uint4 *)&Be[jp * 16 + tx][kk];
                    for (int i = 0; i < EM_T; i++)
                        for (int jp = 0; jp < EM_T / 2; jp++) {
                            unsigned e2 = __viaddmax_s16x2(ea[i].x, eb[jp].x, EP[i][jp]);
                            e2 = __viaddmax_s16x2(ea[i].y, eb[jp].y, e2);
                            e2 = __viaddmax_s16x2(ea[i].z, eb[jp].z, e2);
                            EP[i][jp] = __viaddmax_s16x2(ea[i].w, eb[jp].w, e2);
                        }
                }
                for (int i = 0; i < EM_T; i++)
                    for (int jp = 0; jp < EM_T / 2; jp++) {
                        E[i][2 * jp] = (int)(short)(EP[i][jp] & 0xffffu);
                        E[i][2 * jp + 1] = (int)EP[i][jp] >> 16;
                    }
            }
            double M[EM_T][EM_T];   /* E is read back from M's exponent below: registers are short */
            int S[PARTS][EM_T][EM_T];
            for (int i = 0; i < EM_T; i++)
                for (int j = 0; j < EM_T; j++) {
                    bad |= E[i][j] > 125;   /* past the model's exact range (NVIDIA's E holds c's too) */
                    /* NVIDIA: Q = 2^(E - F); AMD: the products' Q = 2^(Ep - 24) */
                    M[i][j] = __hiloint2double(magic_hi(52 + E[i][j] - F), 0);
                    for (int p = 0; p < PARTS; p++) S[p][i][j] = 0;
                    if (nv) {   /* c's term, truncated toward zero at Q like the products' */
                        const int n = __double2loint(__dadd_rz(fabs((double)acc[i][j]), M[i][j]));
                        S[0][i][j] = acc[i][j] < 0.0f ? -n : n;
                    }
                }
#pragma unroll
            for (int kk = c0; kk < c0 + CHUNK; kk += 2) {
                const int p = (kk - c0) / PART;   /* a constant once unrolled */
                double2 av[EM_T], bv[EM_T];
                int2 as[EM_T], bs[EM_T];
                for (int i = 0; i < EM_T; i++) {
                    av[i] = *(const double2 *)&Av[ty + 16 * i][kk];
                    as[i] = *(const int2 *)&As[ty + 16 * i][kk];
                }
                for (int j = 0; j < EM_T; j++) {
                    bv[j] = *(const double2 *)&Bv[tx + 16 * j][kk];
                    bs[j] = *(const int2 *)&Bs[tx + 16 * j][kk];
                }
                for (int i = 0; i < EM_T; i++)
                    for (int j = 0; j < EM_T; j++) {
                        const int n0_ = __double2loint(__fma_rz(av[i].x, bv[j].x, M[i][j]));
                        const int n1_ = __double2loint(__fma_rz(av[i].y, bv[j].y, M[i][j]));
                        S[p][i][j] += n0_ * ((as[i].x ^ bs[j].x) | 1);
                        S[p][i][j] += n1_ * ((as[i].y ^ bs[j].y) | 1);
                    }
            }
            for (int i = 0; i < EM_T; i++)
                for (int j = 0; j < EM_T; j++) {
                    if (nv) {
                        /* the chunk's exact sum: the counts (each exact in double, and so their sum) times Q */
                        double count = (double)S[0][i][j];
                        for (int p = 1; p < PARTS; p++) count += (double)S[p][i][j];
                        const int Ep = ((__double2hiint(M[i][j]) >> 20) & 0x7ff) - 1023 - 52 + F;
                        const double sum = count * __hiloint2double((1023 + Ep - F) << 20, 0);
                        acc[i][j] = __double2float_rz(sum) + 0.0f;   /* truncated to zero: +0 */
                    } else {
                        /* AMD's two round-downs as one (the host launches AMD groups with PARTS 1: the count is
                         * S[0]). With E = max(Ep, ec), the model's sum is floor(s at 2^(E - 31)) + floor(c at
                         * 2^(E - 24)), s = count * Q, Q = 2^(Ep - 24). Take q = max(Q, 2^(ec - 31)) and
                         * n = floor(s / q), an arithmetic shift of the count (s is a multiple of Q). Then
                         * rd(c + (Mq + n q)) - Mq, Mq = 1.5 * 2^52 * q, is exactly that sum in each case:
                         *   ec <= Ep:          q = Q, n q = s, and the add rounds c down at Q = 2^(E - 24);
                         *   Ep < ec <= Ep + 7: q = Q, and s and c are already multiples of 2^(E - 31), 2^(E - 24);
                         *   ec > Ep + 7:       q = 2^(E - 31), n q = floor(s at 2^(E - 31)), c a multiple of q.
                         * Mq + n q is M's bits plus n (its low word n, its high word borrowing when n < 0), and
                         * c + Mq + n q stays in Mq's binade, whose last place is q. This replaces the count's
                         * conversion, the scaling and two round-downs (about 3.7 instructions a product, ncu). */
                        const int b1 = __double2hiint(M[i][j]) >> 20;                 /* 1075 + Ep - 24 */
                        const int e8 = (int)((__float_as_uint(acc[i][j]) << 1) >> 24); /* c's biased exponent */
                        const int qb = max(b1, max(e8, 1) + 917);                      /* 1075 + log2(q) */
                        const int n = S[0][i][j] >> min(qb - b1, 31);
                        const int mhi = qb << 20 | 1 << 19;
                        const double t = __dadd_rd((double)acc[i][j], __hiloint2double(mhi + (n >> 31), n));
                        acc[i][j] = __double2float_rn(t - __hiloint2double(mhi, 0));
                    }
                    bad |= !(fabsf(acc[i][j]) < 0x1p126f);
                }
        }
        __syncthreads();
    }
    float *C = g.C + (size_t)b * g.c_bstride;
    for (int i = 0; i < EM_T; i++)
        for (int j = 0; j < EM_T; j++) {
            const int rr = r0 + ty + 16 * i, cc = n0 + tx + 16 * j;
            if (rr < r1 && cc < g.N) C[(size_t)rr * g.N + cc] = acc[i][j];
        }
    /* the operands this thread decoded are the product's own (rows and columns past the product's are zeros) */
    if (bad) atomicMin(flag, g.call_id);
}
#endif

/* ---- tensor cores: a k16 chain of the hardware's own instruction */

#if defined(GPU_CUDA)
#define MBN 64
#define MBK 32
#define MPAD 8
#define MSTAGES 3

__device__ static unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared without a register stop; src_bytes 0 fills zeros */
__device__ static void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ static void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ static void cp_async_wait(void) { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ static void ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* Which rows a block handles, grouped products, worked out by each warp at
 * once: a lane per expert (a warp-width at a time), a scan of the row tiles
 * before it, a ballot for the one that holds tile `by`. tile_rows' walk
 * waited for one load per expert (64 experts: about 2,500 cycles). */
__device__ static bool tile_rows_warp(const gk_gemm *g, int by, int BM, int *e, int *r0, int *r1) {
    if (!g->offsets) return tile_rows(g, by, BM, e, r0, r1);
    const int lane = threadIdx.x & 31;
    int base = 0;   /* row tiles of the experts before this warp-width */
    for (int x0 = 0; x0 < g->experts; x0 += 32) {
        const int x = x0 + lane;
        const int n = x < g->experts ? g->offsets[x + 1] - g->offsets[x] : 0, tiles = (n + BM - 1) / BM;
        int incl = tiles;
        for (int d = 1; d < 32; d *= 2) {
            const int v = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += v;
        }
        const int excl = incl - tiles;
        const unsigned hit = __ballot_sync(0xffffffffu, tiles > 0 && by >= base + excl && by < base + incl);
        if (hit) {
            const int src = __ffs(hit) - 1, first = __shfl_sync(0xffffffffu, excl, src);
            *e = x0 + src;
            *r0 = g->offsets[*e] + (by - base - first) * BM;
            *r1 = g->offsets[*e + 1];
            return true;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    return false;
}

/* One stage: the block's 64 WR threads move A's 32 WR rows and B's 64 rows,
 * 16 bytes a piece (zeros past the rows, the columns or Kp). */
template <int WR>
__device__ static void mma_load_stage(uint16_t (*As)[MBK + MPAD], uint16_t (*Bs)[MBK + MPAD], const gk_gemm *g,
                                      const uint16_t *A, const uint16_t *B, const uint16_t *B2, int r0, int r1, int n0,
                                      int tid, int k0, int e) {
    const int threads = 64 * WR;
    for (int piece = tid; piece < 32 * WR * 4; piece += threads) {
        const int row = piece >> 2, col = (piece & 3) * 8, ar = r0 + row;
        const bool va = ar < r1 && k0 + col < g->Kp;
        cp_async16(&As[row][col], va ? (const void *)(A + (size_t)ar * g->Kp + k0 + col) : (const void *)A, va ? 16 : 0);
    }
    for (int piece = tid; piece < MBN * 4; piece += threads) {
        const int row = piece >> 2, col = (piece & 3) * 8;
        const bool up = g->H && row >= 32;   /* gate and up at once: rows 32.. are the up's */
        const uint16_t *src = up ? B2 : B;
        const int bn = n0 + (up ? row - 32 : row);
        const gk_wq *q = up ? &g->bq2 : &g->bq;
        if (q->kind) {   /* block-scaled: widened here, stored as the 16 bytes a plain B's copy would bring */
            uint32_t w[4];
            for (int t = 0; t < 4; t++)
                w[t] = (uint32_t)wq_bits(q, e, bn, k0 + col + 2 * t, g->N, g->K, g->fmt) |
                       (uint32_t)wq_bits(q, e, bn, k0 + col + 2 * t + 1, g->N, g->K, g->fmt) << 16;
            *(uint4 *)&Bs[row][col] = make_uint4(w[0], w[1], w[2], w[3]);
            continue;
        }
        const bool vb = bn < g->N && k0 + col < g->Kp;
        cp_async16(&Bs[row][col], vb ? (const void *)(src + (size_t)bn * g->Kp + k0 + col) : (const void *)B, vb ? 16 : 0);
    }
}

/* Where a lane's accumulator f = (mi, ni, x) = acc[f >> 4][(f >> 2) & 3][f & 3]
 * sits in its warp's 32x32 tile: mma.sync m16n8's C fragments, 16-row
 * pieces mi, 8-column pieces ni, lane (gq, tq) holding rows gq and gq + 8,
 * columns 2 tq and 2 tq + 1. */
__device__ static int frag_row(int f, int gq) { return (f >> 4) * 16 + gq + 8 * ((f & 3) >> 1); }
__device__ static int frag_col(int f, int tq) { return ((f >> 2) & 3) * 8 + 2 * tq + (f & 1); }

/* 64 WR threads, WR x 2 warps of 32x32 (a block tile of 32 WR rows by 64
 * columns; launched with WR = 2: 128-row blocks for the grouped products,
 * WR = 4, were slower, 20.60 against 19.35 ms, bench/README.md), K in stages
 * of 32 moved by cp.async MSTAGES - 1 stages ahead, fragments read with
 * ldmatrix. Each k16 step is one mma.sync per 16x8 piece with the running
 * fp32 sums as C: the same k16 chain, K ascending from zero, as
 * emu:hopper's plain schedule (the staging changes when operands arrive,
 * not the order of the sums). With g.D the sums leave through the epilogue
 * (bias, rounding) instead of through C. */
template <int WR>
__global__ static void __launch_bounds__(64 * WR) k_mma(gk_gemm g) {
    /* the stages of A and B; after the k loop, the epilogue's fp32 tiles */
    __shared__ __align__(16) uint16_t smem[MSTAGES * (32 * WR + MBN) * (MBK + MPAD)];
    uint16_t(*As)[32 * WR][MBK + MPAD] = (uint16_t(*)[32 * WR][MBK + MPAD])smem;
    uint16_t(*Bs)[MBN][MBK + MPAD] = (uint16_t(*)[MBN][MBK + MPAD])(smem + MSTAGES * 32 * WR * (MBK + MPAD));
    int e, r0, r1;
    if (!tile_rows_warp(&g, blockIdx.y, 32 * WR, &e, &r0, &r1)) return;
    const bool glu = g.H != NULL;   /* gate and up: 32 columns of each */
    const int b = blockIdx.z, n0 = blockIdx.x * (glu ? 32 : MBN);
    const size_t expert_off = (size_t)e * g.b_bstride * (g.offsets != NULL);
    const uint16_t *A = (const uint16_t *)g.A + (size_t)b * g.a_bstride;
    const uint16_t *B = (const uint16_t *)g.B + (size_t)b * g.b_bstride + expert_off;
    const uint16_t *B2 = glu ? (const uint16_t *)g.B2 + (size_t)b * g.b_bstride + expert_off : NULL;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float acc[2][4][4];
    for (int x = 0; x < 2; x++)
        for (int y = 0; y < 4; y++)
            for (int z = 0; z < 4; z++) acc[x][y][z] = 0.0f;
    const int KT = (g.Kp + MBK - 1) / MBK;
    for (int s = 0; s < MSTAGES - 1; s++) {
        if (s < KT) mma_load_stage<WR>(As[s], Bs[s], &g, A, B, B2, r0, r1, n0, tid, s * MBK, e);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<MSTAGES - 2>();
        __syncthreads();   /* stage kt has landed for everyone; slot (kt - 1) % MSTAGES is free */
        const int next = kt + MSTAGES - 1;
        if (next < KT) mma_load_stage<WR>(As[next % MSTAGES], Bs[next % MSTAGES], &g, A, B, B2, r0, r1, n0, tid,
                                              next * MBK, e);
        cp_async_commit();
        const int slot = kt % MSTAGES, k0 = kt * MBK;
        if (r0 + wm >= r1) continue;   /* this warp's rows are all past the expert's: nothing to add */
        for (int ks = 0; ks < MBK && k0 + ks < g.Kp; ks += 16) {
            uint32_t af[2][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
                ldmatrix_x4(af[mi], &As[slot][wm + mi * 16 + (lane & 15)][ks + (lane >> 4) * 8]);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t r[4];
                ldmatrix_x4(r, &Bs[slot][wn + np * 16 + (lane & 7) + (lane >> 4) * 8][ks + ((lane >> 3) & 1) * 8]);
                bf[2 * np][0] = r[0];
                bf[2 * np][1] = r[1];
                bf[2 * np + 1][0] = r[2];
                bf[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    float *d = acc[mi][ni];
                    if (g.fmt == GK_F16)
                        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                                     : "r"(af[mi][0]), "r"(af[mi][1]), "r"(af[mi][2]), "r"(af[mi][3]),
                                       "r"(bf[ni][0]), "r"(bf[ni][1]));
                    else
                        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                                     : "r"(af[mi][0]), "r"(af[mi][1]), "r"(af[mi][2]), "r"(af[mi][3]),
                                       "r"(bf[ni][0]), "r"(bf[ni][1]));
                }
        }
    }
    cp_async_wait<0>();
    if (glu) {
        /* gate and up values, rounded (fp32 holds any value of outdt), meet
         * in shared memory; then each thread finishes elements of the tile */
        __syncthreads();   /* everyone has read the last stage */
        float(*Gs)[33] = (float(*)[33])(void *)smem, (*Us)[33] = Gs + 32 * WR;
        float(*V)[33] = wn ? Us : Gs;
        const float *bias = wn ? g.bias2 : g.bias;
#pragma unroll
        for (int f = 0; f < 32; f++) {
            const int rl = wm + frag_row(f, gq), cl = frag_col(f, tq), cc = n0 + cl;
            float v = acc[f >> 4][(f >> 2) & 3][f & 3];
            if (bias && cc < g.N) v = v + bias[cc];
            V[rl][cl] = (float)rd(g.outdt, (double)v);
        }
        __syncthreads();
        for (int i = tid; i < 32 * WR * 32; i += 64 * WR) {
            const int rl = i >> 5, cl = i & 31, rr = r0 + rl, cc = n0 + cl;
            if (rr >= r1 || cc >= g.ldh) continue;
            double hv = 0;   /* columns N .. ldh: the operand's zero padding */
            if (cc < g.N) hv = rd(g.outdt, rd(g.outdt, act_apply(g.act, (double)Gs[rl][cl])) * (double)Us[rl][cl]);
            put_operand(g.H, g.fmt, (size_t)rr * g.ldh + cc, hv);
        }
        return;
    }
#pragma unroll
    for (int f = 0; f < 32; f++) {
        const int rr = r0 + wm + frag_row(f, gq), cc = n0 + wn + frag_col(f, tq);
        if (rr >= r1 || cc >= g.N) continue;
        float v = acc[f >> 4][(f >> 2) & 3][f & 3];
        if (g.D) {
            if (g.bias) v = v + g.bias[cc];
            g.D[(size_t)b * g.d_bstride + (size_t)rr * g.ldd + cc] = rd(g.outdt, (double)v);
        } else {
            g.C[(size_t)b * g.c_bstride + (size_t)rr * g.N + cc] = v;
        }
    }
}
#endif

#if defined(GPU_HIP)
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));

/* One wavefront (64 lanes) per 16x16 tile, a k16 chain of MFMA
 * 16x16x16 (bf16_1k or f16). Lane l holds A[l % 16][4 (l / 16) + 0..3],
 * B[4 (l / 16) + 0..3][l % 16] and D[4 (l / 16) + 0..3][l % 16]. */
__global__ static void __launch_bounds__(64) k_mfma(gk_gemm g) {
    int e, r0, r1;
    if (!tile_rows(&g, blockIdx.y, 16, &e, &r0, &r1)) return;
    const int b = blockIdx.z, n0 = blockIdx.x * 16, lane = threadIdx.x;
    const uint16_t *A = (const uint16_t *)g.A + (size_t)b * g.a_bstride;
    const uint16_t *B = (const uint16_t *)g.B + (size_t)b * g.b_bstride + (size_t)e * g.b_bstride * (g.offsets != NULL);
    const int row = r0 + lane % 16, col = n0 + lane % 16, kq = 4 * (lane / 16);
    f32x4 acc = {0, 0, 0, 0};
    for (int k0 = 0; k0 < g.Kp; k0 += 16) {
        i16x4 a = {0, 0, 0, 0}, bb = {0, 0, 0, 0};
        for (int x = 0; x < 4; x++) {
            if (row < r1) a[x] = (short)A[(size_t)row * g.Kp + k0 + kq + x];
            if (g.bq.kind) bb[x] = (short)wq_bits(&g.bq, e, col, k0 + kq + x, g.N, g.K, g.fmt);
            else if (col < g.N) bb[x] = (short)B[(size_t)col * g.Kp + k0 + kq + x];
        }
        if (g.fmt == GK_F16) {
            f16x4 ah, bh;
            memcpy(&ah, &a, 8);
            memcpy(&bh, &bb, 8);
            acc = __builtin_amdgcn_mfma_f32_16x16x16f16(ah, bh, acc, 0, 0, 0);
        } else {
            acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, bb, acc, 0, 0, 0);
        }
    }
    float *C = g.C + (size_t)b * g.c_bstride;
    for (int x = 0; x < 4; x++) {
        int rr = r0 + kq + x;
        if (rr < r1 && col < g.N) C[(size_t)rr * g.N + col] = acc[x];
    }
}
#endif

#if defined(GPU_CUDA)
static int blas_gemm(gk_ctx *c, const gk_gemm *g, char *msg, size_t msg_n) {
    /* row-major C[M, N] = A[M, K] B[N, K]^T is column-major C^T = B^T' A: op(B) = T, op(A) = N,
     * as torch.nn.functional.linear calls it */
    const float one = 1.0f, zero = 0.0f;
    cudaDataType_t t = g->fmt == GK_F32 ? CUDA_R_32F : g->fmt == GK_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        c->blas, CUBLAS_OP_T, CUBLAS_OP_N, g->N, g->M, g->K, &one, g->B, t, g->Kp, (long long)g->b_bstride, g->A, t,
        g->Kp, (long long)g->a_bstride, &zero, g->C, CUDA_R_32F, g->N, (long long)g->c_bstride, g->batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(msg, msg_n, "cuBLAS product %dx%dx%d failed (status %d)", g->M, g->N, g->K, (int)s);
        return 1;
    }
    return 0;
}
#endif

#if defined(GPU_CUDA)
/* k_emu_tiled's counts fit in an int when PARTS of them share a chunk (see the kernel) */
static bool tiled_fits(int chunk, int parts, int F) {
    return F + 2 < 31 && (double)(chunk / parts) * ldexp(1.0, F + 2) + ldexp(1.0, F + 1) < 0x1p31;
}
#endif

extern "C" int GPU_FN(gemm)(gk_ctx *c, const gk_gemm *g, char *msg, size_t msg_n) {
    if (g->M <= 0 || g->N <= 0) return 0;
    bool fused = false;   /* the engine wrote D itself */
#if defined(GPU_CUDA)
    if (g->H && g->engine != GK_ENGINE_MMA) goto unavailable;
#else
    if (g->H) goto unavailable;
#endif
    switch (g->engine) {
#if defined(GPU_CUDA)
    case GK_ENGINE_BLAS:
        if (g->offsets || g->bq.kind) goto unavailable;   /* a block-scaled weight reaches cuBLAS widened (widen_q) */
        if (blas_gemm(c, g, msg, msg_n)) return 1;
        break;
#endif
    case GK_ENGINE_CHAIN32: {
        dim3 grid((g->N + CT - 1) / CT, row_tiles(g, CT), g->batch), block(CT, CT);
        k_chain32<<<grid, block, 0, c->stream>>>(*g);
        break;
    }
    case GK_ENGINE_EMU: {
        if (ET % g->emu_chunk || g->emu_k % g->emu_chunk) {
            snprintf(msg, msg_n, "emulated product: chunk of %d products does not divide a 16-wide tile", g->emu_chunk);
            return 1;
        }
#if defined(GPU_CUDA)
        /* MF_GPU_EMU_SIMPLE=1: the one-output-per-thread kernel, for checks */
        const int F = g->emu_kind == GK_EMU_NV_FUSED ? g->emu_frac : 24;
        const bool aligned = g->Kp % 4 == 0 && g->a_bstride % 4 == 0 && g->b_bstride % 4 == 0 &&
                             (uintptr_t)g->A % 8 == 0 && (uintptr_t)g->B % 8 == 0;
        /* a chunk's sum in one int count, or (NVIDIA's 16-product chunk only) in two; AMD's epilogue reads one,
         * which its F of 24 allows for every chunk up to 16 */
        const bool nv = g->emu_kind == GK_EMU_NV_FUSED, one_part = tiled_fits(g->emu_chunk, 1, F);
        const bool counts_fit = one_part || (nv && g->emu_chunk == 16 && tiled_fits(16, 2, F));
        if (!getenv("MF_GPU_EMU_SIMPLE") && aligned && counts_fit &&
            (g->emu_chunk == 4 || g->emu_chunk == 8 || g->emu_chunk == 16)) {
            dim3 grid((g->N + EM_B - 1) / EM_B, row_tiles(g, EM_B), g->batch), block(16, 16);
            if (!nv) {
                if (g->emu_chunk == 4) k_emu_tiled<4, 1, false><<<grid, block, 0, c->stream>>>(*g, c->flag);
                else if (g->emu_chunk == 8) k_emu_tiled<8, 1, false><<<grid, block, 0, c->stream>>>(*g, c->flag);
                else k_emu_tiled<16, 1, false><<<grid, block, 0, c->stream>>>(*g, c->flag);
            } else if (g->emu_chunk == 4) k_emu_tiled<4, 1, true><<<grid, block, 0, c->stream>>>(*g, c->flag);
            else if (g->emu_chunk == 8) k_emu_tiled<8, 1, true><<<grid, block, 0, c->stream>>>(*g, c->flag);
            else if (one_part) k_emu_tiled<16, 1, true><<<grid, block, 0, c->stream>>>(*g, c->flag);
            else k_emu_tiled<16, 2, true><<<grid, block, 0, c->stream>>>(*g, c->flag);
            break;
        }
#endif
        dim3 grid((g->N + ET - 1) / ET, row_tiles(g, ET), g->batch), block(ET, ET);
        k_emu<<<grid, block, 0, c->stream>>>(*g, c->flag);
        break;
    }
    case GK_ENGINE_MMA: {
#if defined(GPU_CUDA)
        const int cols = g->H ? 32 : MBN;
        dim3 grid((g->N + cols - 1) / cols, row_tiles(g, 64), g->batch);
        k_mma<2><<<grid, 128, 0, c->stream>>>(*g);
        fused = true;
#else
        dim3 grid((g->N + 15) / 16, row_tiles(g, 16), g->batch);
        k_mfma<<<grid, 64, 0, c->stream>>>(*g);
#endif
        break;
    }
    default:
        goto unavailable;
    }
    if (g->D && !fused)
        k_epilogue<<<row_grid(g->M, g->N, g->batch), THREADS, 0, c->stream>>>(g->D, g->C, g->M, g->N, g->ldd,
                                                                              g->d_bstride, g->bias, g->outdt);
    return 0;
unavailable:
    snprintf(msg, msg_n, "matrix engine %d%s is not available in the %s backend", g->engine,
             g->H ? " (gate and up at once)" : "", GPU_NAME);
    return 1;
}
