/*
 * mma_probe_fp8.cuh - the fp8 part of tools/mma_probe.cu (included by it; one nvcc command builds both).
 *
 *   wgmma.mma_async.sync.aligned.m64n8k32.f32.{e4m3.e4m3, e5m2.e5m2, e4m3.e5m2}
 *     one instruction per tile, A from registers (RS) and again from shared memory (SS):
 *       h200_wgmma_m64n8k32_e4m3.jsonl, h200_wgmma_m64n8k32_e5m2.jsonl, h200_wgmma_m64n8k32_e4m3_e5m2.jsonl
 *     chains of 4 instructions over k = 128 into one fp32 accumulator (DeepGEMM's per-block chain), the first
 *     with scale-d = 1 (D = A.B + C, C fed in) or scale-d = 0 (D = A.B, C ignored):
 *       h200_wgmma_m64n8k32_e4m3_chain4.jsonl (records carry "chain": 4 and "scale_d": 1 or 0)
 *   a DeepSeek-V3-recipe FP8 linear (per token x 128 activation quantisation, per-128-k wgmma chain from zero,
 *   one fma promotion by activation scale x weight scale): h200_w8a8_linear.jsonl
 *
 * fp8 layouts (PTX ISA, "wgmma" register fragments and matrix descriptors), g = lane / 4, t = lane % 4,
 * warp w of the warpgroup holding rows 16w..16w+15:
 *   A registers (8-bit types, k32): a0 = A[16w+g][4t..4t+3], a1 = A[16w+g+8][4t..], a2 = A[16w+g][16+4t..],
 *     a3 = A[16w+g+8][16+4t..], the lowest k in the lowest byte. (Variant 1, a fallback: a1 and a2 swapped.)
 *   B in shared memory, K-major (fp8 has no transpose), no swizzle: two 8 x 16-byte core matrices, the k16..31
 *     one 128 bytes after the k0..15 one: byte (k, n) at (k / 16) * 128 + n * 16 + k % 16; LBO = SBO = 128.
 *   A in shared memory (SS), K-major, no swizzle: byte (m, k) at (k / 16) * 1024 + (m / 8) * 128 + (m % 8) * 16
 *     + k % 16; variant 0: LBO (K direction) 1024, SBO (M direction) 128; variant 1 swaps the two fields.
 *   D: as for the bf16 wgmma: d0..d3 = D[16w+g][2t], [2t+1], D[16w+g+8][2t], [2t+1].
 */
#include <cuda_fp8.h>

enum { F8_E4M3 = 0, F8_E5M2 = 1 };
enum { AB_E4M3 = 0, AB_E5M2 = 1, AB_E4M3_E5M2 = 2 };
enum { S8_NORMAL, S8_WIDE, S8_CANCEL, S8_TINY, S8_WINDOW, S8_SPECIAL, S8_COUNT };
static const char *style8_name[S8_COUNT] = {"normal", "wide", "cancel", "tiny", "window", "special"};
#define S8_MAIN 5 /* tile i < main count has style i % 5 */

/* ------------------------------------------------------------- fp8 formats */
static int f8_mbits(int f) { return f == F8_E4M3 ? 3 : 2; }
static int f8_bias(int f) { return f == F8_E4M3 ? 7 : 15; }
static double f8_max(int f) { return f == F8_E4M3 ? 448.0 : 57344.0; }

static double f8_to_f64(int f, uint8_t c)
{
    int s = c >> 7, mb = f8_mbits(f), eb = 7 - mb, e = (c >> mb) & ((1 << eb) - 1), m = c & ((1 << mb) - 1);
    double v;
    if (f == F8_E4M3 && e == 15 && m == 7) return NAN;
    if (f == F8_E5M2 && e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, 1 - f8_bias(f) - mb);
    else v = ldexp((double)((1 << mb) + m), e - f8_bias(f) - mb);
    return s ? -v : v;
}

/* round to nearest even; past the largest finite value: e4m3 saturates, e5m2 gives inf (x is clamped by the
 * callers where they want a finite value) */
static uint8_t f64_to_f8(int f, double x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    int mb = f8_mbits(f), bias = f8_bias(f);
    double a = fabs(x);
    if (a != a) return f == F8_E4M3 ? 0x7f : 0x7e;
    if (a < ldexp(1.0, 1 - bias)) { /* subnormal: units of 2^(1 - bias - mb) */
        double q = nearbyint(ldexp(a, bias - 1 + mb));
        return sign | (uint8_t)q; /* q == 2^mb is the smallest normal */
    }
    int e;
    double s = frexp(a, &e);
    double q = nearbyint(ldexp(s, mb + 1));
    if (q == ldexp(1.0, mb + 1)) { q /= 2; e += 1; }
    int biased = e - 1 + bias;
    if (f == F8_E4M3) {
        if (biased > 15 || (biased == 15 && (int)q - 8 == 7)) return sign | 0x7e;
    } else if (biased >= 31) {
        return sign | 0x7c;
    }
    return sign | (uint8_t)(biased << mb) | (uint8_t)((int)q - (1 << mb));
}

static uint8_t f8_clamped(int f, double x)
{
    double m = f8_max(f);
    return f64_to_f8(f, x > m ? m : x < -m ? -m : x);
}

static uint8_t f8_subnormal(int f)
{
    int mb = f8_mbits(f);
    return (uint8_t)(((rnd64() & 1) << 7) | (1 + rnd64() % ((1u << mb) - 1)));
}
static uint8_t f8_small_normal(int f) /* exponent field 1..3 */
{
    int mb = f8_mbits(f);
    return (uint8_t)(((rnd64() & 1) << 7) | (rnd_int(1, 3) << mb) | (rnd64() % (1u << mb)));
}

static const uint8_t f8_nan[2][3] = {{0x7f, 0xff, 0x7f}, {0x7e, 0xfe, 0x7d}};
static const uint8_t f8_maxcode[2] = {0x7e, 0x7b};

/* ------------------------------------------------------ fp8 tile generation */
/* A: M x K row-major (format fa), B: K x N row-major (format fb), C: M x N fp32 bits */
static void gen_tile8(int style, int fa, int fb, int M, int N, int K, uint8_t *A, uint8_t *B, uint32_t *C)
{
    int i, j, k;
    switch (style) {
    case S8_NORMAL:
    case S8_SPECIAL:
        for (i = 0; i < M * K; i++) A[i] = f8_clamped(fa, rnd_n());
        for (i = 0; i < K * N; i++) B[i] = f8_clamped(fb, rnd_n());
        for (i = 0; i < M * N; i++) C[i] = f32_bits((float)rnd_n());
        break;
    case S8_WIDE:
        for (i = 0; i < M * K + K * N; i++) {
            int f = i < M * K ? fa : fb;
            int lo = f == F8_E4M3 ? -9 : -16, hi = f == F8_E4M3 ? 8 : 15;
            double x = rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(lo, hi));
            uint8_t c = f8_clamped(f, x);
            if (f == F8_E5M2 && rnd_u() < 0.004) c = (rnd64() & 1) ? 0x7c : 0xfc; /* inf */
            if (i < M * K) A[i] = c;
            else B[i - M * K] = c;
        }
        for (i = 0; i < M * N; i++)
            C[i] = f32_bits((float)(rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(-30, 30))));
        break;
    case S8_CANCEL: {
        for (i = 0; i < M * K; i++) A[i] = f8_clamped(fa, rnd_n());
        for (i = 0; i < K * N; i++) B[i] = f8_clamped(fb, rnd_n());
        for (i = 0; i < M; i++)
            for (k = 0; k + 1 < K; k += 2) {
                double a = f8_to_f64(fa, A[i * K + k]);
                double d = (rnd64() % 3 == 0) ? 0.0 : rnd_sign() * ldexp(1.0, -rnd_int(1, f8_mbits(fa) + 1));
                A[i * K + k + 1] = f8_clamped(fa, -a * (1.0 + d));
            }
        for (k = 0; k + 1 < K; k += 2)
            for (j = 0; j < N; j++) {
                double b = f8_to_f64(fb, B[k * N + j]);
                double d = (rnd64() % 3 == 0) ? 0.0 : rnd_sign() * ldexp(1.0, -rnd_int(1, f8_mbits(fb) + 1));
                B[(k + 1) * N + j] = f8_clamped(fb, b * (1.0 + d));
            }
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) {
                long double s = 0;
                for (k = 0; k < K; k++)
                    s += (long double)f8_to_f64(fa, A[i * K + k]) * f8_to_f64(fb, B[k * N + j]);
                double c = -(double)s;
                int r = rnd_int(0, 3);
                if (r == 1) c *= 1.0 + rnd_sign() * ldexp(1.0, -rnd_int(8, 24));
                if (r == 2) c = -(double)s + rnd_n() * ldexp(1.0, -rnd_int(10, 30));
                C[i * N + j] = f32_bits((float)c);
            }
        break;
    }
    case S8_TINY: {
        int bmode = rnd_int(0, 1);
        for (i = 0; i < M * K; i++) {
            double r = rnd_u();
            A[i] = r < 0.45 ? f8_subnormal(fa) : r < 0.55 ? (uint8_t)((rnd64() & 1) << 7) : f8_small_normal(fa);
        }
        for (i = 0; i < K * N; i++) {
            if (bmode == 0) {
                double r = rnd_u();
                B[i] = r < 0.45 ? f8_subnormal(fb) : r < 0.55 ? (uint8_t)((rnd64() & 1) << 7) : f8_small_normal(fb);
            } else {
                B[i] = f8_clamped(fb, rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(-2, 2)));
            }
        }
        for (i = 0; i < M * N; i++) {
            double r = rnd_u();
            if (r < 0.3) C[i] = f32_subnormal();
            else if (r < 0.45) C[i] = (uint32_t)((rnd64() & 1) << 31);
            else C[i] = f32_bits((float)(rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(-40, -8))));
        }
        break;
    }
    case S8_WINDOW: {
        /* sums wider than the 13-bit alignment window: per row one large term and the others spread 0..24
         * binades below it, B near 1; C absent, far above (products lose bits to its grid), comparable, or far below */
        for (i = 0; i < M; i++) {
            int top = fa == F8_E4M3 ? rnd_int(2, 8) : rnd_int(2, 15);
            int span = rnd_int(8, 24);
            int lo = fa == F8_E4M3 ? -9 : -16;
            for (k = 0; k < K; k++) {
                int e = k == (i % K) ? top : top - rnd_int(0, span);
                if (e < lo) e = lo;
                A[i * K + k] = f8_clamped(fa, rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, e));
            }
        }
        for (i = 0; i < K * N; i++) B[i] = f8_clamped(fb, rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(-1, 1)));
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) {
                int r = rnd_int(0, 4);
                double c = 0;
                if (r == 1) c = rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(12, 30));   /* above */
                if (r == 2) c = rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(0, 12));    /* comparable */
                if (r == 3) c = rnd_sign() * (1.0 + rnd_u()) * ldexp(1.0, rnd_int(-30, -6));  /* below */
                if (r == 4) { /* +-2^e exactly at a binade edge: carries and borrows across it */
                    c = rnd_sign() * ldexp(1.0, rnd_int(4, 16));
                }
                C[i * N + j] = f32_bits((float)c);
            }
        break;
    }
    }
    if (style == S8_SPECIAL) {
        int n, na = M * K / 64 + 2, nc = M * N / 16 + 2;
        for (n = 0; n < na; n++) {
            int r = rnd_int(0, 5), pos = rnd_int(0, M * K - 1);
            A[pos] = r < 2 ? f8_nan[fa][rnd_int(0, 2)]
                   : r < 3 ? (fa == F8_E5M2 ? (uint8_t)((rnd64() & 1) ? 0x7c : 0xfc) : f8_nan[fa][0])
                   : r < 4 ? (uint8_t)(f8_maxcode[fa] | ((rnd64() & 1) << 7))
                           : 0x80;
        }
        for (n = 0; n < 2; n++) {
            int r = rnd_int(0, 4), pos = rnd_int(0, K * N - 1);
            B[pos] = r < 2 ? f8_nan[fb][rnd_int(0, 2)]
                   : r < 3 ? (fb == F8_E5M2 ? (uint8_t)((rnd64() & 1) ? 0x7c : 0xfc) : 0x80)
                           : 0x80;
        }
        for (n = 0; n < nc; n++) {
            int r = rnd_int(0, 4), pos = rnd_int(0, M * N - 1);
            C[pos] = r < 2 ? nan_f32[rnd_int(0, 2)] : r < 3 ? 0x7f800000u : r < 4 ? 0xff800000u : 0x80000000u;
        }
        /* a zero row of A, a zero column of B, +-0 C along them */
        int rz = rnd_int(0, M - 1), jz = rnd_int(0, N - 1), allneg = rnd_int(0, 1);
        for (k = 0; k < K; k++) A[rz * K + k] = allneg ? 0x80 : (uint8_t)((rnd64() & 1) << 7);
        for (k = 0; k < K; k++) B[k * N + jz] = 0x00;
        for (j = 0; j < N; j++) C[rz * N + j] = (rnd64() & 1) ? 0x80000000u : 0u;
        for (i = 0; i < M; i++) C[i * N + jz] = (rnd64() & 1) ? 0x80000000u : 0u;
        /* a row of the largest finite value; C FLT_MAX or +-2^127 (fp32 overflow), or, in a second row, minus
         * the exact sum of maximal products (exact cancellation at the top of the range) */
        int ro = (rz + 1) % M, rc = (rz + 2) % M;
        for (k = 0; k < K; k++) A[ro * K + k] = (uint8_t)(f8_maxcode[fa] | ((k % 3 == 2) << 7));
        for (j = 0; j < N; j++) C[ro * N + j] = (j & 1) ? 0x7f7fffffu : f32_bits((float)ldexp(rnd_sign(), 127));
        for (k = 0; k < K; k++) A[rc * K + k] = f8_maxcode[fa];
        for (j = 0; j < N; j++) {
            if (j == jz) continue;
            long double s = 0;
            for (k = 0; k < K; k++) s += (long double)f8_to_f64(fa, A[rc * K + k]) * f8_to_f64(fb, B[k * N + j]);
            if (isfinite((double)s)) C[rc * N + j] = f32_bits((float)-s);
        }
    }
}

/* ------------------------------------------------------------- fp8 kernels */
__device__ __forceinline__ uint32_t pack4(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

__device__ __forceinline__ uint64_t smem_desc(const void *p, int lbo, int sbo)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

#define WG_RS(TYPES)                                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32." TYPES " "                             \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}\n"                                  \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                   \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(scale_d)             \
                 : "memory")
#define WG_SS(TYPES)                                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32." TYPES " "                             \
                 "{%0,%1,%2,%3}, %4, %5, p, 1, 1;\n}\n"                                             \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                   \
                 : "l"(adesc), "l"(bdesc), "r"(scale_d)                                             \
                 : "memory")

template <int AB>
__device__ __forceinline__ void wg_rs(float *d, const uint32_t *a, uint64_t bdesc, int scale_d)
{
    if (AB == AB_E4M3) WG_RS("e4m3.e4m3");
    else if (AB == AB_E5M2) WG_RS("e5m2.e5m2");
    else WG_RS("e4m3.e5m2");
}
template <int AB>
__device__ __forceinline__ void wg_ss(float *d, uint64_t adesc, uint64_t bdesc, int scale_d)
{
    if (AB == AB_E4M3) WG_SS("e4m3.e4m3");
    else if (AB == AB_E5M2) WG_SS("e5m2.e5m2");
    else WG_SS("e4m3.e5m2");
}

/* A's registers for the k32 chunk starting at column kc of a row-major A with K columns */
template <int AVAR>
__device__ __forceinline__ void load_a_regs(uint32_t *a, const uint8_t *A, int K, int kc, int warp, int lane)
{
    int g = lane >> 2, t = lane & 3, r0 = warp * 16 + g, r1 = r0 + 8, k0 = kc + 4 * t;
    a[0] = pack4(A + r0 * K + k0);
    a[AVAR ? 2 : 1] = pack4(A + r1 * K + k0);
    a[AVAR ? 1 : 2] = pack4(A + r0 * K + k0 + 16);
    a[3] = pack4(A + r1 * K + k0 + 16);
}

/* one warpgroup per 64 x 8 x (32 NCHAIN) tile: NCHAIN instructions into one accumulator, issued back to back
 * (one wgmma.fence, one commit group). MODE 0/1: A from registers (layout variant 0/1); MODE 2/3: A from shared
 * memory (descriptor variant 0/1). scale_d0: the first instruction with scale-d = 0 (C not read). */
template <int AB, int MODE, int NCHAIN>
__global__ void __launch_bounds__(128) k_wgmma_fp8(const uint8_t *A, const uint8_t *B, const uint32_t *C,
                                                   uint32_t *D, int ntiles, int scale_d0)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int K = 32 * NCHAIN;
    __shared__ __align__(1024) uint8_t sA[2048 * NCHAIN];
    __shared__ __align__(1024) uint8_t sB[256 * NCHAIN];
    int tile = blockIdx.x;
    if (tile >= ntiles) return;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const uint8_t *a = A + (size_t)tile * 64 * K, *b = B + (size_t)tile * K * 8;
    const uint32_t *c = C + (size_t)tile * 512;
    uint32_t *dd = D + (size_t)tile * 512;
    for (int i = tid; i < K * 8; i += 128) {
        int k = i / 8, n = i % 8, s = k / 32, kk = k % 32;
        sB[s * 256 + (kk >> 4) * 128 + n * 16 + (kk & 15)] = b[k * 8 + n];
    }
    if (MODE >= 2)
        for (int i = tid; i < 64 * K; i += 128) {
            int m = i / K, k = i % K, s = k / 32, kk = k % 32;
            sA[s * 2048 + (kk >> 4) * 1024 + (m >> 3) * 128 + (m & 7) * 16 + (kk & 15)] = a[m * K + k];
        }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    uint32_t ar[NCHAIN][4];
    if (MODE < 2)
        for (int s = 0; s < NCHAIN; s++) load_a_regs<MODE & 1>(ar[s], a, K, 32 * s, warp, lane);
    int r0 = warp * 16 + g, r1 = r0 + 8, c0 = 2 * t;
    float d[4] = {__uint_as_float(c[r0 * 8 + c0]), __uint_as_float(c[r0 * 8 + c0 + 1]),
                  __uint_as_float(c[r1 * 8 + c0]), __uint_as_float(c[r1 * 8 + c0 + 1])};
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < NCHAIN; s++) {
        int sd = (s > 0 || !scale_d0) ? 1 : 0;
        uint64_t bdesc = smem_desc(sB + s * 256, 128, 128);
        if (MODE < 2) {
            wg_rs<AB>(d, ar[s], bdesc, sd);
        } else {
            uint64_t adesc = (MODE & 1) ? smem_desc(sA + s * 2048, 128, 1024) : smem_desc(sA + s * 2048, 1024, 128);
            wg_ss<AB>(d, adesc, bdesc, sd);
        }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    dd[r0 * 8 + c0] = __float_as_uint(d[0]);
    dd[r0 * 8 + c0 + 1] = __float_as_uint(d[1]);
    dd[r1 * 8 + c0] = __float_as_uint(d[2]);
    dd[r1 * 8 + c0 + 1] = __float_as_uint(d[3]);
#endif
}

template <int AB, int NCHAIN>
static void launch_fp8(int mode, int ntiles, const uint8_t *A, const uint8_t *B, const uint32_t *C, uint32_t *D,
                       int scale_d0)
{
    switch (mode) {
    case 0: k_wgmma_fp8<AB, 0, NCHAIN><<<ntiles, 128>>>(A, B, C, D, ntiles, scale_d0); break;
    case 1: k_wgmma_fp8<AB, 1, NCHAIN><<<ntiles, 128>>>(A, B, C, D, ntiles, scale_d0); break;
    case 2: k_wgmma_fp8<AB, 2, NCHAIN><<<ntiles, 128>>>(A, B, C, D, ntiles, scale_d0); break;
    default: k_wgmma_fp8<AB, 3, NCHAIN><<<ntiles, 128>>>(A, B, C, D, ntiles, scale_d0); break;
    }
}

static void launch_fp8_any(int ab, int nchain, int mode, int ntiles, const uint8_t *A, const uint8_t *B,
                           const uint32_t *C, uint32_t *D, int scale_d0)
{
    if (nchain == 1) {
        if (ab == AB_E4M3) launch_fp8<AB_E4M3, 1>(mode, ntiles, A, B, C, D, scale_d0);
        else if (ab == AB_E5M2) launch_fp8<AB_E5M2, 1>(mode, ntiles, A, B, C, D, scale_d0);
        else launch_fp8<AB_E4M3_E5M2, 1>(mode, ntiles, A, B, C, D, scale_d0);
    } else {
        launch_fp8<AB_E4M3, 4>(mode, ntiles, A, B, C, D, scale_d0);
    }
}

/* ------------------------------------------------------------ fp8 driver */
struct fp8_desc {
    const char *instr, *file;
    int ab, fa, fb, nchain;
};

static const char *f8_type_name(int f) { return f == F8_E4M3 ? "float8_e4m3fn" : "float8_e5m2"; }

static void put_hex8(FILE *f, const char *key, const uint8_t *data, int n)
{
    fprintf(f, ", \"%s\": [", key);
    for (int i = 0; i < n; i++) fprintf(f, i ? ", \"%02x\"" : "\"%02x\"", data[i]);
    fputc(']', f);
}

/* the float64 check of one kernel's D; returns 1 when the normal tiles are at fp8-instruction rounding level
 * (13 fraction bits: max error <= 2e-2 of sum |ab| + |c|; a wrong layout gives errors of order 1) */
static int check_fp8(const struct fp8_desc *in, const char *what, int ntiles, const int *style, const int *sd0,
                     const uint8_t *A, const uint8_t *B, const uint32_t *C, const uint32_t *D, int verbose)
{
    const int M = 64, N = 8, K = 32 * in->nchain;
    double maxerr[S8_COUNT] = {0};
    long nonfinite[S8_COUNT] = {0}, nel[S8_COUNT] = {0}, untouched = 0;
    for (int tile = 0; tile < ntiles; tile++) {
        const uint8_t *a = A + (size_t)tile * M * K, *b = B + (size_t)tile * K * N;
        const uint32_t *c = C + (size_t)tile * M * N, *d = D + (size_t)tile * M * N;
        int st = style[tile];
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                long double s = sd0[tile] ? 0.0L : (long double)bits_f32(c[i * N + j]), mag = fabsl(s);
                for (int k = 0; k < K; k++) {
                    long double p = (long double)f8_to_f64(in->fa, a[i * K + k]) * f8_to_f64(in->fb, b[k * N + j]);
                    s += p;
                    mag += fabsl(p);
                }
                uint32_t dbits = d[i * N + j];
                double dv = bits_f32(dbits);
                nel[st]++;
                if (dbits == 0xffffffffu && st != S8_SPECIAL) untouched++;
                if (!isfinite(dv) || !isfinite((double)s) || !isfinite((double)mag)) {
                    nonfinite[st]++;
                    continue;
                }
                if (mag == 0) continue;
                double err = (double)(fabsl((long double)dv - s) / mag);
                if (err > maxerr[st]) maxerr[st] = err;
            }
    }
    int ok = !(maxerr[S8_NORMAL] > 2e-2 || nonfinite[S8_NORMAL] || untouched > 0);
    printf("  %s: layout check %s (normal max rel err %.3e, untouched %ld)\n", what, ok ? "PASS" : "FAIL",
           maxerr[S8_NORMAL], untouched);
    if (verbose)
        for (int i = 0; i < S8_COUNT; i++)
            if (nel[i])
                printf("    %-8s elements %7ld  non-finite %6ld  max |D-ref|/(sum|ab|+|c|) %.3e\n", style8_name[i],
                       nel[i], nonfinite[i], maxerr[i]);
    return ok;
}

static int g_fp8_avar = 0; /* the A-register layout variant that passed (the linear uses it) */

static int run_fp8(const struct fp8_desc *in, const char *outdir, int ntiles_main, int nspecial, uint64_t seed)
{
    const int M = 64, N = 8, K = 32 * in->nchain;
    int ntiles = ntiles_main + nspecial;
    size_t na = (size_t)ntiles * M * K, nb = (size_t)ntiles * K * N, nc = (size_t)ntiles * M * N;
    uint8_t *A = (uint8_t *)malloc(na), *B = (uint8_t *)malloc(nb);
    uint32_t *C = (uint32_t *)malloc(nc * 4), *D = (uint32_t *)malloc(nc * 4), *D2 = (uint32_t *)malloc(nc * 4);
    int *style = (int *)malloc(sizeof(int) * ntiles), *sd0 = (int *)malloc(sizeof(int) * ntiles);
    rng_state = seed;
    for (int tile = 0; tile < ntiles; tile++) {
        style[tile] = tile < ntiles_main ? tile % S8_MAIN : S8_SPECIAL;
        /* chains: tiles 0..4 mod 10 feed C in (scale-d 1), 5..9 start from scale-d 0 */
        sd0[tile] = in->nchain > 1 && (tile / S8_MAIN) % 2 == 1;
        gen_tile8(style[tile], in->fa, in->fb, M, N, K, A + (size_t)tile * M * K, B + (size_t)tile * K * N,
                  C + (size_t)tile * M * N);
    }
    uint8_t *dA, *dB;
    uint32_t *dC, *dD;
    CK(cudaMalloc(&dA, na));
    CK(cudaMalloc(&dB, nb));
    CK(cudaMalloc(&dC, nc * 4));
    CK(cudaMalloc(&dD, nc * 4));
    CK(cudaMemcpy(dA, A, na, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B, nb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC, C, nc * 4, cudaMemcpyHostToDevice));
    printf("%s%s: %d tiles (%d per style x 5 + %d special), seed %llu\n", in->instr,
           in->nchain > 1 ? " (chains of 4 over k = 128)" : "", ntiles, ntiles_main / S8_MAIN, nspecial,
           (unsigned long long)seed);
    /* scale-d 0 tiles and scale-d 1 tiles in two launches */
    int ok_rs = -1, ok_ss = -1;
    for (int mode = 0; mode < 4; mode++) {
        if ((mode < 2 && ok_rs >= 0) || (mode >= 2 && ok_ss >= 0)) continue;
        uint32_t *out = mode < 2 ? D : D2;
        CK(cudaMemset(dD, 0xff, nc * 4));
        for (int pass = 0; pass < (in->nchain > 1 ? 2 : 1); pass++) {
            /* launch every tile; a tile whose scale-d choice is not this pass's is overwritten by the other */
            launch_fp8_any(in->ab, in->nchain, mode, ntiles, dA, dB, dC, dD, pass);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            uint32_t *tmp = (uint32_t *)malloc(nc * 4);
            CK(cudaMemcpy(tmp, dD, nc * 4, cudaMemcpyDeviceToHost));
            for (int tile = 0; tile < ntiles; tile++)
                if (sd0[tile] == pass)
                    memcpy(out + (size_t)tile * M * N, tmp + (size_t)tile * M * N, (size_t)M * N * 4);
            free(tmp);
        }
        static const char *mode_name[4] = {"A registers, layout 0", "A registers, layout 1 (fallback)",
                                           "A shared, LBO 1024 (K) SBO 128 (M)",
                                           "A shared, LBO 128 SBO 1024 (fallback)"};
        int ok = check_fp8(in, mode_name[mode], ntiles, style, sd0, A, B, C, out, mode < 2);
        if (ok) {
            if (mode < 2) ok_rs = mode;
            else ok_ss = mode;
        }
    }
    long same = 0, total = (long)nc;
    if (ok_rs >= 0 && ok_ss >= 0)
        for (size_t i = 0; i < nc; i++) same += D[i] == D2[i];
    printf("  A from registers vs A from shared memory: %ld / %ld D elements bit-equal\n", same, total);
    cudaFree(dA); cudaFree(dB); cudaFree(dC); cudaFree(dD);

    char path[4096];
    snprintf(path, sizeof path, "%s/%s", outdir, in->file);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    for (int tile = 0; tile < ntiles; tile++) {
        fprintf(f,
                "{\"arch\": \"Hopper\", \"instr\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"a_type\": \"%s\", ",
                in->instr, M, N, K, f8_type_name(in->fa));
        if (in->fb != in->fa) fprintf(f, "\"b_type\": \"%s\", ", f8_type_name(in->fb));
        fprintf(f, "\"c_type\": \"float32\", \"style\": \"%s\", \"source\": \"h200\"", style8_name[style[tile]]);
        if (in->nchain > 1) fprintf(f, ", \"chain\": %d, \"scale_d\": %d", in->nchain, sd0[tile] ? 0 : 1);
        put_hex8(f, "A", A + (size_t)tile * M * K, M * K);
        put_hex8(f, "B", B + (size_t)tile * K * N, K * N);
        put_hex_list(f, "C", C + (size_t)tile * M * N, M * N, 4);
        put_hex_list(f, "D", D + (size_t)tile * M * N, M * N, 4);
        fputs("}\n", f);
    }
    fclose(f);
    printf("  wrote %s\n", path);
    int ok = ok_rs >= 0 && ok_ss >= 0 && same == total;
    if (ok_rs >= 0) g_fp8_avar = ok_rs;
    free(A); free(B); free(C); free(D); free(D2); free(style); free(sd0);
    return ok;
}

/* --------------------------------------------- DeepSeek-V3-recipe FP8 linear */
/* activations x [M, K] fp32 -> codes [M, K] e4m3 and scales [M, K / 128]: one block of 128 threads per
 * (row, 128-block); s = fp32(max(max |x|, 1e-10) / 448), q = e4m3(fp32(x / s)) nearest even, saturating */
__global__ void __launch_bounds__(128) k_w8a8_quant(const float *x, uint8_t *q, float *sa, int K)
{
    __shared__ float red[128];
    int nb = K / 128, row = blockIdx.x / nb, b = blockIdx.x % nb, tid = threadIdx.x;
    float v = x[(size_t)row * K + b * 128 + tid];
    red[tid] = fabsf(v);
    __syncthreads();
    for (int w = 64; w > 0; w >>= 1) {
        if (tid < w) red[tid] = fmaxf(red[tid], red[tid + w]); /* fmaxf passes a NaN over */
        __syncthreads();
    }
    float s = __fdiv_rn(fmaxf(red[0], 1e-10f), 448.0f);
    q[(size_t)row * K + b * 128 + tid] = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3);
    if (tid == 0) sa[(size_t)row * nb + b] = s;
}

/* y [M, N] = the recipe's product of codes qa [M, K] (scales sa [M, K / 128]) and weight codes w [N, K] (scales
 * ws [ceil(N / 128), K / 128]): one warpgroup per 64 x 8 output tile; for each 128-block of k, four
 * wgmma.m64n8k32.f32.e4m3.e4m3 from a zero accumulator (scale-d 0, then 1), A from registers, then
 * acc = fma(partial, sa * ws, acc) in fp32. */
template <int AVAR>
__global__ void __launch_bounds__(128) k_w8a8_linear(const uint8_t *qa, const float *sa, const uint8_t *w,
                                                     const float *ws, float *y, int M, int N, int K)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(1024) uint8_t sB[4 * 256];
    int nb = K / 128, j0 = blockIdx.x * 8, i0 = blockIdx.y * 64;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int r0 = i0 + warp * 16 + g, r1 = r0 + 8, c0 = j0 + 2 * t;
    float acc[4] = {0, 0, 0, 0};
    for (int b = 0; b < nb; b++) {
        __syncthreads();
        for (int i = tid; i < 128 * 8; i += 128) {
            int k = i / 8, n = i % 8, s = k / 32, kk = k % 32;
            sB[s * 256 + (kk >> 4) * 128 + n * 16 + (kk & 15)] = w[(size_t)(j0 + n) * K + b * 128 + k];
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        uint32_t ar[4][4];
        for (int s = 0; s < 4; s++)
            load_a_regs<AVAR>(ar[s], qa + (size_t)i0 * K, K, b * 128 + 32 * s, warp, lane);
        float d[4] = {0, 0, 0, 0};
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; s++) wg_rs<AB_E4M3>(d, ar[s], smem_desc(sB + s * 256, 128, 128), s > 0);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        float sw0 = ws[(size_t)(c0 / 128) * nb + b], sw1 = ws[(size_t)((c0 + 1) / 128) * nb + b];
        float sa0 = sa[(size_t)r0 * nb + b], sa1 = sa[(size_t)r1 * nb + b];
        acc[0] = __fmaf_rn(d[0], __fmul_rn(sa0, sw0), acc[0]);
        acc[1] = __fmaf_rn(d[1], __fmul_rn(sa0, sw1), acc[1]);
        acc[2] = __fmaf_rn(d[2], __fmul_rn(sa1, sw0), acc[2]);
        acc[3] = __fmaf_rn(d[3], __fmul_rn(sa1, sw1), acc[3]);
    }
    y[(size_t)r0 * N + c0] = acc[0];
    y[(size_t)r0 * N + c0 + 1] = acc[1];
    y[(size_t)r1 * N + c0] = acc[2];
    y[(size_t)r1 * N + c0 + 1] = acc[3];
#endif
}

static float bf16_value(double v) { return bits_f32((uint32_t)f32_to_bf16((float)v) << 16); }

/* One linear case: style 0 normal, 1 outliers (per-row magnitudes 2^-8..2^8, a few channels 2^4..2^10 larger),
 * 2 special rows (zeros, below the 1e-10 floor, a NaN, an Inf, exact 448 multiples, one huge value among tiny
 * ones). Returns 1 when y is within fp8 rounding of a float64 product of the GPU's own codes. */
static int run_linear(FILE *f, int style, int M, int N, int K, uint64_t seed, int avar)
{
    static const char *names[3] = {"normal", "outliers", "special"};
    int nb = K / 128, nbn = (N + 127) / 128;
    float *x = (float *)malloc(sizeof(float) * M * K), *ws = (float *)malloc(sizeof(float) * nbn * nb);
    uint8_t *w = (uint8_t *)malloc((size_t)N * K), *qa = (uint8_t *)malloc((size_t)M * K);
    float *sa = (float *)malloc(sizeof(float) * M * nb), *y = (float *)malloc(sizeof(float) * M * N);
    rng_state = seed;
    for (int i = 0; i < N * K; i++) w[i] = f8_clamped(F8_E4M3, rnd_n() * 100.0);
    for (int i = 0; i < nbn * nb; i++) ws[i] = (float)((1.0 + rnd_u()) * ldexp(1.0, rnd_int(-12, -7)));
    for (int i = 0; i < M; i++) {
        double rs = style == 1 ? ldexp(1.0, rnd_int(-8, 8)) : 1.0;
        for (int k = 0; k < K; k++) {
            double v = rnd_n() * rs;
            if (style == 1 && (k % 61 == 7)) v *= ldexp(1.0, rnd_int(4, 10));
            x[(size_t)i * K + k] = bf16_value(v);
        }
    }
    if (style == 2) {
        for (int k = 0; k < K; k++) x[0 * K + k] = 0.0f;                                 /* zeros */
        for (int k = 0; k < K; k++) x[1 * K + k] = bf16_value(rnd_n() * 1e-12);          /* under the floor */
        x[2 * K + 5] = NAN;                                                              /* a NaN */
        x[3 * K + 130] = INFINITY;                                                       /* an Inf */
        for (int k = 0; k < K; k++) x[4 * K + k] = (float)(448.0 * ldexp(1.0, rnd_int(-9, 0)) * rnd_sign());
        for (int k = 0; k < K; k++) x[5 * K + k] = bf16_value(rnd_n() * 1e-3);          /* subnormal codes */
        x[5 * K + 17] = 1000.0f;
        x[5 * K + 300] = -3000.0f;
        for (int k = 0; k < K; k++) x[6 * K + k] = (k & 1) ? -x[6 * K + k - 1] : x[6 * K + k]; /* cancelling pairs */
    }
    float *dx, *dws, *dsa, *dy;
    uint8_t *dw, *dqa;
    CK(cudaMalloc(&dx, sizeof(float) * M * K));
    CK(cudaMalloc(&dws, sizeof(float) * nbn * nb));
    CK(cudaMalloc(&dsa, sizeof(float) * M * nb));
    CK(cudaMalloc(&dy, sizeof(float) * M * N));
    CK(cudaMalloc(&dw, (size_t)N * K));
    CK(cudaMalloc(&dqa, (size_t)M * K));
    CK(cudaMemcpy(dx, x, sizeof(float) * M * K, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dws, ws, sizeof(float) * nbn * nb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, w, (size_t)N * K, cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xff, sizeof(float) * M * N));
    k_w8a8_quant<<<M * nb, 128>>>(dx, dqa, dsa, K);
    CK(cudaGetLastError());
    dim3 grid(N / 8, M / 64);
    if (avar) k_w8a8_linear<1><<<grid, 128>>>(dqa, dsa, dw, dws, dy, M, N, K);
    else k_w8a8_linear<0><<<grid, 128>>>(dqa, dsa, dw, dws, dy, M, N, K);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(qa, dqa, (size_t)M * K, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sa, dsa, sizeof(float) * M * nb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y, dy, sizeof(float) * M * N, cudaMemcpyDeviceToHost));
    cudaFree(dx); cudaFree(dws); cudaFree(dsa); cudaFree(dy); cudaFree(dw); cudaFree(dqa);
    /* float64 check against the GPU's own codes and scales: each block's partial within 2^-12 of its
     * magnitude sum */
    double maxerr = 0;
    long nonfinite = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            long double s = 0, mag = 0;
            for (int b = 0; b < nb; b++) {
                long double p = 0, pm = 0;
                for (int k = b * 128; k < b * 128 + 128; k++) {
                    long double v = (long double)f8_to_f64(F8_E4M3, qa[(size_t)i * K + k]) * f8_to_f64(F8_E4M3, w[(size_t)j * K + k]);
                    p += v;
                    pm += fabsl(v);
                }
                long double sc = (long double)sa[(size_t)i * nb + b] * ws[(size_t)(j / 128) * nb + b];
                s += p * sc;
                mag += pm * fabsl(sc);
            }
            if (!isfinite(y[(size_t)i * N + j]) || !isfinite((double)s)) { nonfinite++; continue; }
            if (mag == 0) continue;
            double e = (double)(fabsl(y[(size_t)i * N + j] - s) / mag);
            if (e > maxerr) maxerr = e;
        }
    int ok = maxerr < 2e-2 && (style == 2 || nonfinite == 0);
    printf("w8a8 linear (%s): M %d N %d K %d, blocks 128 x 128: max |y - ref| / sum |terms| %.3e, non-finite %ld: %s\n",
           names[style], M, N, K, maxerr, nonfinite, ok ? "PASS" : "FAIL");
    fprintf(f, "{\"arch\": \"Hopper\", \"instr\": \"w8a8.m64n8k32.e4m3.chain4\", \"style\": \"%s\", \"source\": \"h200\", "
               "\"M\": %d, \"N\": %d, \"K\": %d, \"bn\": 128, \"bk\": 128",
            names[style], M, N, K);
    put_hex_list(f, "X", x, M * K, 4);
    put_hex8(f, "W", w, N * K);
    put_hex_list(f, "WS", ws, nbn * nb, 4);
    put_hex8(f, "QA", qa, M * K);
    put_hex_list(f, "SA", sa, M * nb, 4);
    put_hex_list(f, "Y", y, M * N, 4);
    fputs("}\n", f);
    free(x); free(ws); free(w); free(qa); free(sa); free(y);
    return ok;
}

static int run_fp8_all(const char *outdir, int ntiles, int nspecial, uint64_t seed)
{
    static const struct fp8_desc d[] = {
        {"wgmma.m64n8k32.f32.e4m3.e4m3", "h200_wgmma_m64n8k32_e4m3.jsonl", AB_E4M3, F8_E4M3, F8_E4M3, 1},
        {"wgmma.m64n8k32.f32.e5m2.e5m2", "h200_wgmma_m64n8k32_e5m2.jsonl", AB_E5M2, F8_E5M2, F8_E5M2, 1},
        {"wgmma.m64n8k32.f32.e4m3.e5m2", "h200_wgmma_m64n8k32_e4m3_e5m2.jsonl", AB_E4M3_E5M2, F8_E4M3, F8_E5M2, 1},
        {"wgmma.m64n8k32.f32.e4m3.e4m3", "h200_wgmma_m64n8k32_e4m3_chain4.jsonl", AB_E4M3, F8_E4M3, F8_E4M3, 4},
    };
    int ok = 1, main = ntiles / S8_MAIN * S8_MAIN;
    /* the chains (four times the operands) get a quarter of the tiles */
    for (int i = 0; i < 4; i++)
        ok &= run_fp8(&d[i], outdir, i == 3 ? (main / 4 + S8_MAIN * 2 - 1) / (S8_MAIN * 2) * (S8_MAIN * 2) : main,
                      i == 3 ? (nspecial + 3) / 4 : nspecial, seed + 1000003ull * (uint64_t)(3 + i));
    char path[4096];
    snprintf(path, sizeof path, "%s/h200_w8a8_linear.jsonl", outdir);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    int lin = 1;
    printf("w8a8 linears: A-register layout variant %d\n", g_fp8_avar);
    lin &= run_linear(f, 0, 64, 136, 256, seed + 1000003ull * 7, g_fp8_avar);
    lin &= run_linear(f, 1, 64, 16, 512, seed + 1000003ull * 8, g_fp8_avar);
    lin &= run_linear(f, 2, 64, 16, 512, seed + 1000003ull * 9, g_fp8_avar);
    fclose(f);
    printf("  wrote %s\n", path);
    return ok && lin;
}
