/*
 * mma_probe.cu - run NVIDIA matrix instructions on real hardware (Hopper, sm_90a)
 * on random tiles and write the tiles and the card's results as JSON lines, one
 * tile a line, in the schema of tests/fixtures/mma/README.md:
 *
 *   {"arch": "Hopper", "instr": ..., "m", "n", "k", "a_type", "c_type", "style",
 *    "source": "h200", "A": [hex, m*k row-major], "B": [hex, k*n row-major],
 *    "C": [hex, m*n], "D": [hex, m*n]}
 *
 * Instructions:
 *   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   -> h200_mma_m16n8k16_bf16.jsonl
 *   mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32     -> h200_mma_m16n8k16_f16.jsonl
 *   wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16   -> h200_wgmma_m64n8k16_bf16.jsonl
 *     (A from registers, B from shared memory through a matrix descriptor,
 *      no swizzle, K-major)
 *
 * Inputs come from a seeded host RNG (splitmix64), styles "normal", "wide",
 * "cancel", "tiny" in equal shares (tile i has style i % 4), then extra tiles of
 * style "special" (NaN, Inf, signed zeros, fp32 overflow).  Each tile's D is
 * compared with a float64 (long double) reference; on "normal" tiles the error,
 * relative to sum |a_i b_i| + |c|, must stay at fp32 rounding level, which
 * validates the fragment layouts.
 *
 * fp8 (wgmma.m64n8k32 e4m3/e5m2, chains, a DeepSeek-V3-recipe linear): tools/mma_probe_fp8.cuh.
 *
 * Build: nvcc -O2 -arch=sm_90a -o mma_probe tools/mma_probe.cu
 * Run:   ./mma_probe OUTDIR [tiles_per_instr=1000] [special_tiles=64] [seed=20261201] [all|fp8|bf16]
 * Exit status: 0 when every layout check passed, 1 otherwise, 2 on CUDA errors.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t e_ = (x);                                                   \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #x, __FILE__,       \
                    __LINE__, cudaGetErrorString(e_));                          \
            exit(2);                                                            \
        }                                                                       \
    } while (0)

enum { T_BF16 = 0, T_F16 = 1 };
enum { ST_NORMAL, ST_WIDE, ST_CANCEL, ST_TINY, ST_SPECIAL, ST_COUNT };
static const char *style_name[ST_COUNT] = {"normal", "wide", "cancel", "tiny", "special"};

/* ------------------------------------------------------------------ RNG */
static uint64_t rng_state;
static uint64_t rnd64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rnd_u(void) { return (double)(rnd64() >> 11) * 0x1.0p-53; }
static int rnd_int(int lo, int hi) { return lo + (int)(rnd64() % (uint64_t)(hi - lo + 1)); }
static double rnd_n(void)
{
    double u1 = rnd_u(), u2 = rnd_u();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static double rnd_sign(void) { return (rnd64() & 1) ? -1.0 : 1.0; }

/* ---------------------------------------------------------- conversions */
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint16_t f32_to_bf16(float f) /* round to nearest even */
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t f64_to_f16(double x) /* round to nearest even, overflow to inf */
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (a != a) return 0x7e00;
    if (a >= 65520.0) return sign | 0x7c00;
    if (a < 0x1p-14) { /* subnormal: units of 2^-24 */
        double q = nearbyint(a * 0x1p24); /* default rounding mode: RNE */
        return sign | (uint16_t)q;        /* q == 1024 gives the smallest normal */
    }
    int e;
    double s = frexp(a, &e); /* a = s * 2^e, s in [0.5,1) */
    double q = nearbyint(s * 2048.0); /* 11 significant bits */
    if (q == 2048.0) { q = 1024.0; e += 1; }
    int biased = e - 1 + 15;
    if (biased >= 31) return sign | 0x7c00;
    return sign | (uint16_t)(biased << 10) | (uint16_t)((int)q - 1024);
}

static uint16_t to_in(int t, double x)
{
    return t == T_BF16 ? f32_to_bf16((float)x) : f64_to_f16(x);
}

static double in_to_f64(int t, uint16_t h)
{
    if (t == T_BF16) return (double)bits_f32((uint32_t)h << 16);
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp((double)(1024 + m), e - 25);
    return s ? -v : v;
}

static int in_mant_bits(int t) { return t == T_BF16 ? 7 : 10; }

static uint16_t in_subnormal(int t) /* random sign, exponent field 0, mantissa != 0 */
{
    int mb = in_mant_bits(t);
    uint16_t m = (uint16_t)(1 + rnd64() % ((1u << mb) - 1));
    return (uint16_t)(((rnd64() & 1) << 15) | m);
}
static uint16_t in_small_normal(int t) /* exponent field 1..3 */
{
    int mb = in_mant_bits(t);
    uint16_t m = (uint16_t)(rnd64() % (1u << mb));
    uint16_t e = (uint16_t)rnd_int(1, 3);
    return (uint16_t)(((rnd64() & 1) << 15) | (e << mb) | m);
}
static uint32_t f32_subnormal(void)
{
    uint32_t m = 1 + (uint32_t)(rnd64() % 0x7fffffu);
    /* vary the number of significant bits */
    int sh = rnd_int(0, 20);
    m >>= sh;
    if (!m) m = 1;
    return (uint32_t)((rnd64() & 1) << 31) | m;
}

static const uint16_t nan_in[2][3] = {{0x7fc0, 0xffc0, 0x7f81}, {0x7e00, 0xfe00, 0x7c01}};
static const uint16_t inf_in[2][2] = {{0x7f80, 0xff80}, {0x7c00, 0xfc00}};
static const uint32_t nan_f32[3] = {0x7fc00000u, 0xffc00000u, 0x7f800001u};

/* ------------------------------------------------------ tile generation */
/* A: M x K row-major, B: K x N row-major, C: M x N fp32 bits */
static void gen_tile(int style, int t, int M, int N, int K, uint16_t *A, uint16_t *B,
                     uint32_t *C)
{
    int i, j, k;
    switch (style) {
    case ST_NORMAL:
    case ST_SPECIAL:
        for (i = 0; i < M * K; i++) A[i] = to_in(t, rnd_n());
        for (i = 0; i < K * N; i++) B[i] = to_in(t, rnd_n());
        for (i = 0; i < M * N; i++) C[i] = f32_bits((float)rnd_n());
        break;
    case ST_WIDE: {
        int elo = t == T_BF16 ? -48 : -24, ehi = t == T_BF16 ? 48 : 15;
        int clo = t == T_BF16 ? -60 : -30, chi = t == T_BF16 ? 60 : 30;
        for (i = 0; i < M * K + K * N; i++) {
            double x = rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(elo, ehi));
            if (t == T_F16 && rnd_u() < 0.002) x = rnd_sign() * 70000.0; /* overflows to inf */
            if (i < M * K) A[i] = to_in(t, x);
            else B[i - M * K] = to_in(t, x);
        }
        for (i = 0; i < M * N; i++)
            C[i] = f32_bits((float)(rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(clo, chi))));
        break;
    }
    case ST_CANCEL: {
        /* neighbouring products nearly cancel; C is close to minus the sum */
        int mb = in_mant_bits(t);
        for (i = 0; i < M * K; i++) A[i] = to_in(t, rnd_n());
        for (i = 0; i < K * N; i++) B[i] = to_in(t, rnd_n());
        for (i = 0; i < M; i++)
            for (k = 0; k + 1 < K; k += 2) {
                double a = in_to_f64(t, A[i * K + k]);
                double d = (rnd64() % 3 == 0) ? 0.0 : rnd_sign() * ldexp(1.0, -rnd_int(mb - 2, mb + 1));
                A[i * K + k + 1] = to_in(t, -a * (1.0 + d));
            }
        for (k = 0; k + 1 < K; k += 2)
            for (j = 0; j < N; j++) {
                double b = in_to_f64(t, B[k * N + j]);
                double d = (rnd64() % 3 == 0) ? 0.0 : rnd_sign() * ldexp(1.0, -rnd_int(mb - 2, mb + 1));
                B[(k + 1) * N + j] = to_in(t, b * (1.0 + d));
            }
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) {
                long double s = 0;
                for (k = 0; k < K; k++)
                    s += (long double)in_to_f64(t, A[i * K + k]) * in_to_f64(t, B[k * N + j]);
                double c = -(double)s;
                int r = rnd_int(0, 3);
                if (r == 1) c *= 1.0 + rnd_sign() * ldexp(1.0, -rnd_int(8, 24));
                if (r == 2) c = -(double)s + rnd_n() * ldexp(1.0, -rnd_int(10, 30));
                C[i * N + j] = f32_bits((float)c);
            }
        break;
    }
    case ST_TINY: {
        /* subnormal / near-minimum inputs; subnormal or tiny C */
        int bmode = rnd_int(0, 1); /* 0: B tiny too; 1: B scaled so products are near C */
        for (i = 0; i < M * K; i++) {
            double r = rnd_u();
            A[i] = r < 0.45 ? in_subnormal(t) : r < 0.55 ? (uint16_t)((rnd64() & 1) << 15)
                                                         : in_small_normal(t);
        }
        for (i = 0; i < K * N; i++) {
            if (bmode == 0) {
                double r = rnd_u();
                B[i] = r < 0.45 ? in_subnormal(t) : r < 0.55 ? (uint16_t)((rnd64() & 1) << 15)
                                                             : in_small_normal(t);
            } else {
                int e = t == T_BF16 ? rnd_int(-8, 8) : rnd_int(-2, 2);
                B[i] = to_in(t, rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, e));
            }
        }
        for (i = 0; i < M * N; i++) {
            double r = rnd_u();
            if (r < 0.45) C[i] = f32_subnormal();
            else if (r < 0.55) C[i] = (uint32_t)((rnd64() & 1) << 31);
            else {
                int e = t == T_BF16 ? rnd_int(-126, -118) : rnd_int(-50, -20);
                C[i] = f32_bits((float)(rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, e)));
            }
        }
        break;
    }
    }
    if (style == ST_SPECIAL) {
        int n;
        int na = M * K / 32 + 2, nc = M * N / 16 + 2;
        for (n = 0; n < na; n++) {
            int r = rnd_int(0, 4), pos = rnd_int(0, M * K - 1);
            A[pos] = r < 2 ? nan_in[t][rnd_int(0, 2)] : r < 4 ? inf_in[t][rnd_int(0, 1)] : 0x8000;
        }
        for (n = 0; n < 2; n++) {
            int r = rnd_int(0, 4), pos = rnd_int(0, K * N - 1);
            B[pos] = r < 2 ? nan_in[t][rnd_int(0, 2)] : r < 4 ? inf_in[t][rnd_int(0, 1)] : 0x8000;
        }
        for (n = 0; n < nc; n++) {
            int r = rnd_int(0, 4), pos = rnd_int(0, M * N - 1);
            C[pos] = r < 2 ? nan_f32[rnd_int(0, 2)] : r < 3 ? 0x7f800000u : r < 4 ? 0xff800000u : 0x80000000u;
        }
        /* a zero row of A (all -0 or mixed signs), a zero column of B (+0),
           C of -0 / +0 along them: tests the sign of an exact zero sum */
        int rz = rnd_int(0, M - 1), jz = rnd_int(0, N - 1), allneg = rnd_int(0, 1);
        for (k = 0; k < K; k++) A[rz * K + k] = allneg ? 0x8000 : (uint16_t)((rnd64() & 1) << 15);
        for (k = 0; k < K; k++) B[k * N + jz] = 0x0000;
        for (j = 0; j < N; j++) C[rz * N + j] = (rnd64() & 1) ? 0x80000000u : 0u;
        for (i = 0; i < M; i++) C[i * N + jz] = (rnd64() & 1) ? 0x80000000u : 0u;
        /* fp32 overflow of the sum: large products and / or C near FLT_MAX */
        if (M > 2) {
            int ro = (rz + 1) % M;
            for (k = 0; k < K; k++)
                A[ro * K + k] = to_in(t, t == T_BF16 ? ldexp(1.5, (k & 1) ? 100 : 125) : 60000.0);
            for (j = 0; j < N; j++)
                C[ro * N + j] = (j & 1) ? 0x7f7fffffu : f32_bits((float)ldexp(rnd_sign(), 127));
        }
    }
}

/* ------------------------------------------------------------- kernels */
__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi)
{
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

/* one warp per 16x8x16 tile; PTX ISA fragment layouts for mma.m16n8k16 */
template <int IN_F16>
__global__ void k_mma_m16n8k16(const uint16_t *A, const uint16_t *B, const uint32_t *C,
                               uint32_t *D, int ntiles)
{
    int tile = blockIdx.x;
    if (tile >= ntiles) return;
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const uint16_t *a = A + (size_t)tile * 256, *b = B + (size_t)tile * 128;
    const uint32_t *c = C + (size_t)tile * 128;
    uint32_t *d = D + (size_t)tile * 128;
    int r0 = g, r1 = g + 8, k0 = 2 * t;
    uint32_t a0 = pack2(a[r0 * 16 + k0], a[r0 * 16 + k0 + 1]);
    uint32_t a1 = pack2(a[r1 * 16 + k0], a[r1 * 16 + k0 + 1]);
    uint32_t a2 = pack2(a[r0 * 16 + k0 + 8], a[r0 * 16 + k0 + 9]);
    uint32_t a3 = pack2(a[r1 * 16 + k0 + 8], a[r1 * 16 + k0 + 9]);
    uint32_t b0 = pack2(b[k0 * 8 + g], b[(k0 + 1) * 8 + g]);
    uint32_t b1 = pack2(b[(k0 + 8) * 8 + g], b[(k0 + 9) * 8 + g]);
    float c0 = __uint_as_float(c[r0 * 8 + k0]), c1 = __uint_as_float(c[r0 * 8 + k0 + 1]);
    float c2 = __uint_as_float(c[r1 * 8 + k0]), c3 = __uint_as_float(c[r1 * 8 + k0 + 1]);
    float d0, d1, d2, d3;
    if (IN_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                     : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0),
                       "f"(c1), "f"(c2), "f"(c3));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                     : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0),
                       "f"(c1), "f"(c2), "f"(c3));
    d[r0 * 8 + k0] = __float_as_uint(d0);
    d[r0 * 8 + k0 + 1] = __float_as_uint(d1);
    d[r1 * 8 + k0] = __float_as_uint(d2);
    d[r1 * 8 + k0 + 1] = __float_as_uint(d3);
}

/* one warpgroup (128 threads) per 64x8x16 tile.
   A from registers: warp w holds rows 16w..16w+15 in the mma.m16n8k16 A layout.
   B (16x8, K-major) in shared memory, no swizzle: two 8x8 core matrices
   (8 rows of n, 16 bytes = 8 k-values each), the k=8..15 one 128 bytes after the
   k=0..7 one: element (k, n) at 16-bit index (k/8)*64 + n*8 + k%8.
   TRANS_B = 1 (a fallback, used only if the K-major layout fails its check): B
   MN-major (imm-trans-b = 1), core matrices of 8 k-rows x 8 n-values:
   element (k, n) at index (k/8)*64 + (k%8)*8 + n.
   D: warp w holds rows 16w.., same layout as mma.m16n8k16's C/D. */
template <int TRANS_B>
__global__ void __launch_bounds__(128) k_wgmma_m64n8k16_bf16(const uint16_t *A,
                                                               const uint16_t *B,
                                                               const uint32_t *C,
                                                               uint32_t *D, int ntiles)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(1024) uint16_t sB[128];
    int tile = blockIdx.x;
    if (tile >= ntiles) return;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const uint16_t *a = A + (size_t)tile * 1024, *b = B + (size_t)tile * 128;
    const uint32_t *c = C + (size_t)tile * 512;
    uint32_t *d = D + (size_t)tile * 512;
    {
        int k = tid >> 3, n = tid & 7;
        if (TRANS_B) sB[(k >> 3) * 64 + (k & 7) * 8 + n] = b[k * 8 + n];
        else sB[(k >> 3) * 64 + n * 8 + (k & 7)] = b[k * 8 + n];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    int r0 = warp * 16 + g, r1 = r0 + 8, k0 = 2 * t;
    uint32_t a0 = pack2(a[r0 * 16 + k0], a[r0 * 16 + k0 + 1]);
    uint32_t a1 = pack2(a[r1 * 16 + k0], a[r1 * 16 + k0 + 1]);
    uint32_t a2 = pack2(a[r0 * 16 + k0 + 8], a[r0 * 16 + k0 + 9]);
    uint32_t a3 = pack2(a[r1 * 16 + k0 + 8], a[r1 * 16 + k0 + 9]);
    float d0 = __uint_as_float(c[r0 * 8 + k0]), d1 = __uint_as_float(c[r0 * 8 + k0 + 1]);
    float d2 = __uint_as_float(c[r1 * 8 + k0]), d3 = __uint_as_float(c[r1 * 8 + k0 + 1]);
    uint32_t saddr = (uint32_t)__cvta_generic_to_shared(sB);
    uint64_t desc = (uint64_t)((saddr & 0x3FFFF) >> 4)   /* start address */
                    | ((uint64_t)(128 >> 4) << 16)       /* leading-dim byte offset */
                    | ((uint64_t)(128 >> 4) << 32);      /* stride-dim byte offset */
    /* swizzle mode (bits 62-63) 0: none; base offset 0 */
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if (TRANS_B)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 1;\n}\n"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1)
                     : "memory");
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1)
                     : "memory");
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    d[r0 * 8 + k0] = __float_as_uint(d0);
    d[r0 * 8 + k0 + 1] = __float_as_uint(d1);
    d[r1 * 8 + k0] = __float_as_uint(d2);
    d[r1 * 8 + k0 + 1] = __float_as_uint(d3);
#endif
}

/* --------------------------------------------------------------- driver */
static void put_hex_list(FILE *f, const char *key, const void *data, int n, int bytes);
#include "mma_probe_fp8.cuh"

struct instr_desc {
    const char *instr, *file, *a_type;
    int t, M, N, K, wg;
};

static void put_hex_list(FILE *f, const char *key, const void *data, int n, int bytes)
{
    int i;
    fprintf(f, ", \"%s\": [", key);
    for (i = 0; i < n; i++) {
        if (bytes == 2) fprintf(f, i ? ", \"%04x\"" : "\"%04x\"", ((const uint16_t *)data)[i]);
        else fprintf(f, i ? ", \"%08x\"" : "\"%08x\"", ((const uint32_t *)data)[i]);
    }
    fputc(']', f);
}

static int check_tiles(const struct instr_desc *in, int ntiles, int ntiles_main, int nspecial,
                       uint64_t seed, const int *style, const uint16_t *A, const uint16_t *B,
                       const uint32_t *C, const uint32_t *D)
{
    int M = in->M, N = in->N, K = in->K, t = in->t, i, j, k, tile;
    /* float64 check */
    double maxerr[ST_COUNT] = {0};
    long nonfinite[ST_COUNT] = {0}, nel[ST_COUNT] = {0}, untouched = 0;
    for (tile = 0; tile < ntiles; tile++) {
        const uint16_t *a = A + (size_t)tile * M * K, *b = B + (size_t)tile * K * N;
        const uint32_t *c = C + (size_t)tile * M * N, *d = D + (size_t)tile * M * N;
        int st = style[tile];
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) {
                long double s = bits_f32(c[i * N + j]), mag = fabsl(s);
                for (k = 0; k < K; k++) {
                    long double p = (long double)in_to_f64(t, a[i * K + k]) * in_to_f64(t, b[k * N + j]);
                    s += p;
                    mag += fabsl(p);
                }
                uint32_t dbits = d[i * N + j];
                double dv = bits_f32(dbits);
                nel[st]++;
                if (dbits == 0xffffffffu && st != ST_SPECIAL) untouched++; /* D was preset to ~0 */
                if (!isfinite(dv) || !isfinite((double)s) || !isfinite((double)mag)) {
                    nonfinite[st]++;
                    continue;
                }
                if (mag == 0) continue;
                double err = (double)(fabsl((long double)dv - s) / mag);
                if (err > maxerr[st]) maxerr[st] = err;
            }
    }
    int ok = 1;
    printf("%s: %d tiles (%d per style x 4 + %d special), seed %llu\n", in->instr, ntiles,
           ntiles_main / 4, nspecial, (unsigned long long)seed);
    for (i = 0; i < ST_COUNT; i++) {
        if (!nel[i]) continue;
        printf("  %-8s elements %7ld  non-finite %6ld  max |D-ref|/(sum|ab|+|c|) %.3e\n",
               style_name[i], nel[i], nonfinite[i], maxerr[i]);
    }
    if (maxerr[ST_NORMAL] > 2e-6 || nonfinite[ST_NORMAL] || untouched > 0) ok = 0;
    printf("  layout check on normal tiles (max rel err <= 2e-6, no NaN/Inf, every D written): %s"
           " (untouched D elements: %ld)\n", ok ? "PASS" : "FAIL", untouched);
    return ok;
}

static int run_instr(const struct instr_desc *in, const char *outdir, int ntiles_main,
                     int nspecial, uint64_t seed)
{
    int M = in->M, N = in->N, K = in->K, t = in->t;
    int ntiles = ntiles_main + nspecial, tile;
    size_t na = (size_t)ntiles * M * K, nb = (size_t)ntiles * K * N, nc = (size_t)ntiles * M * N;
    uint16_t *A = (uint16_t *)malloc(na * 2), *B = (uint16_t *)malloc(nb * 2);
    uint32_t *C = (uint32_t *)malloc(nc * 4), *D = (uint32_t *)malloc(nc * 4);
    int *style = (int *)malloc(sizeof(int) * ntiles);
    rng_state = seed;
    for (tile = 0; tile < ntiles; tile++) {
        style[tile] = tile < ntiles_main ? tile % 4 : ST_SPECIAL;
        gen_tile(style[tile], t, M, N, K, A + (size_t)tile * M * K, B + (size_t)tile * K * N,
                 C + (size_t)tile * M * N);
    }
    uint16_t *dA, *dB;
    uint32_t *dC, *dD;
    CK(cudaMalloc(&dA, na * 2));
    CK(cudaMalloc(&dB, nb * 2));
    CK(cudaMalloc(&dC, nc * 4));
    CK(cudaMalloc(&dD, nc * 4));
    CK(cudaMemcpy(dA, A, na * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B, nb * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC, C, nc * 4, cudaMemcpyHostToDevice));
    int ok = 0, variant;
    for (variant = 0; variant < (in->wg ? 2 : 1) && !ok; variant++) {
        CK(cudaMemset(dD, 0xff, nc * 4));
        if (in->wg && variant == 0) k_wgmma_m64n8k16_bf16<0><<<ntiles, 128>>>(dA, dB, dC, dD, ntiles);
        else if (in->wg) k_wgmma_m64n8k16_bf16<1><<<ntiles, 128>>>(dA, dB, dC, dD, ntiles);
        else if (t == T_F16) k_mma_m16n8k16<1><<<ntiles, 32>>>(dA, dB, dC, dD, ntiles);
        else k_mma_m16n8k16<0><<<ntiles, 32>>>(dA, dB, dC, dD, ntiles);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(D, dD, nc * 4, cudaMemcpyDeviceToHost));
        ok = check_tiles(in, ntiles, ntiles_main, nspecial, seed, style, A, B, C, D);
        if (in->wg)
            printf("  (wgmma B operand: %s)\n", variant == 0 ? "K-major, imm-trans-b 0"
                                                           : "MN-major, imm-trans-b 1 (fallback)");
    }
    cudaFree(dA); cudaFree(dB); cudaFree(dC); cudaFree(dD);

    char path[4096];
    snprintf(path, sizeof path, "%s/%s", outdir, in->file);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    for (tile = 0; tile < ntiles; tile++) {
        fprintf(f,
                "{\"arch\": \"Hopper\", \"instr\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
                "\"a_type\": \"%s\", \"c_type\": \"float32\", \"style\": \"%s\", \"source\": \"h200\"",
                in->instr, M, N, K, in->a_type, style_name[style[tile]]);
        put_hex_list(f, "A", A + (size_t)tile * M * K, M * K, 2);
        put_hex_list(f, "B", B + (size_t)tile * K * N, K * N, 2);
        put_hex_list(f, "C", C + (size_t)tile * M * N, M * N, 4);
        put_hex_list(f, "D", D + (size_t)tile * M * N, M * N, 4);
        fputs("}\n", f);
    }
    fclose(f);
    printf("  wrote %s\n", path);
    free(A); free(B); free(C); free(D); free(style);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUTDIR [tiles_per_instr=1000] [special_tiles=64] [seed] [all|fp8|bf16]\n", argv[0]);
        return 2;
    }
    const char *outdir = argv[1];
    int ntiles = argc > 2 ? atoi(argv[2]) : 1000;
    int nspecial = argc > 3 ? atoi(argv[3]) : 64;
    uint64_t seed = argc > 4 ? strtoull(argv[4], 0, 10) : 20261201ull;
    const char *which = argc > 5 ? argv[5] : "all";
    ntiles = (ntiles + 3) / 4 * 4;

    int dev, drv = 0, rt = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    printf("device: %s (sm_%d%d), CUDA driver API %d, runtime %d\n", prop.name, prop.major,
           prop.minor, drv, rt);

    static const struct instr_desc instrs[] = {
        {"mma.m16n8k16.f32.bf16.bf16.f32", "h200_mma_m16n8k16_bf16.jsonl", "bfloat16", T_BF16, 16, 8, 16, 0},
        {"mma.m16n8k16.f32.f16.f16.f32", "h200_mma_m16n8k16_f16.jsonl", "float16", T_F16, 16, 8, 16, 0},
        {"wgmma.m64n8k16.f32.bf16.bf16", "h200_wgmma_m64n8k16_bf16.jsonl", "bfloat16", T_BF16, 64, 8, 16, 1},
    };
    int all_ok = 1;
    if (strcmp(which, "fp8"))
        for (int i = 0; i < 3; i++)
            all_ok &= run_instr(&instrs[i], outdir, ntiles, nspecial, seed + 1000003ull * (uint64_t)i);
    if (strcmp(which, "bf16")) all_ok &= run_fp8_all(outdir, ntiles, nspecial, seed);
    printf("overall layout check: %s\n", all_ok ? "PASS" : "FAIL");
    return all_ok ? 0 : 1;
}
