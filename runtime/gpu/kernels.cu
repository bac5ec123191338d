/* GPU kernels of the forward pass, one source for CUDA (nvcc) and HIP
 * (hipcc -x hip). Device code is kept C-like: plain functions, no templates
 * beyond what the launch needs, no C++ library.
 *
 * Every elementwise kernel is the CPU executor's loop (runtime/cpu/forward.c,
 * router/router.c, experts/experts.c) over one row or element, with the same
 * double arithmetic and the same rounding formulas, so CPU and GPU runs of
 * one instruction model agree bit for bit. Sequential sums stay sequential
 * (one thread per row) for the same reason. */
#include "gpu_port.h"
#include "gpu_api.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(GPU_CUDA)
#include <cublas_v2.h>
#endif

struct gk_ctx {
    gpuStream_t stream;
    int *flag;   /* device: smallest call_id of an out-of-range emulated product */
    int device;
#if defined(GPU_CUDA)
    cublasHandle_t blas;
#endif
};

/* ------------------------------------------------------------ rounding */

/* x rounded to nearest-even at `mant` fraction bits, exponents from emin
 * (subnormals below) to emax (past the largest finite value: infinity);
 * core/dtype.c's formula. */
__device__ static double round_fmt(double x, int mant, int emin, int emax) {
    if (x == 0 || !isfinite(x)) return x;
    int e;
    frexp(x, &e);
    int ex = e - 1;
    if (ex < emin) ex = emin;
    double quantum = ldexp(1.0, ex - mant);
    double y = rint(x / quantum) * quantum;
    double maxv = ldexp(2.0 - ldexp(1.0, -mant), emax);
    if (fabs(y) > maxv) return copysign((double)INFINITY, x);
    return y;
}

/* The same on the bits of a double, where the result is a normal number of
 * the format that cannot overflow: drop `drop` fraction bits, nearest-even. */
__device__ static double round_bits(double x, int drop, int emin, int emax) {
    unsigned long long u = (unsigned long long)__double_as_longlong(x);
    const int e = (int)((u >> 52) & 0x7ff) - 1023;
    if (e < emin || e >= emax) return round_fmt(x, 52 - drop, emin, emax);
    const unsigned long long half = (1ull << (drop - 1)) - 1, lsb = (u >> drop) & 1;
    u = (u + half + lsb) & ~((1ull << drop) - 1);
    return __longlong_as_double((long long)u);
}

__device__ static double rd(int dt, double x) {
    switch (dt) {
    case GK_F32: return (double)(float)x;
    case GK_BF16: return round_bits(x, 45, -126, 127);
    case GK_F16: return round_bits(x, 42, -14, 15);
    default: return x;
    }
}

__device__ static uint16_t bf16_bits(double x) {
    if (isnan(x)) return 0x7fc0;
    float f = (float)round_bits(x, 45, -126, 127);   /* exact in bf16 */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

__device__ static uint16_t f16_bits(double x) {
    if (isnan(x)) return 0x7e00;
    double r = round_bits(x, 42, -14, 15);
    uint16_t sign = signbit(r) ? 0x8000u : 0;
    double a = fabs(r);
    if (isinf(a)) return sign | 0x7c00u;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    int ex = e - 1;
    if (ex < -14) return sign | (uint16_t)(a * 16777216.0);   /* subnormal: a / 2^-24 */
    return sign | (uint16_t)((ex + 15) << 10) | (uint16_t)((ldexp(a, -ex) - 1.0) * 1024.0);
}

__device__ static double bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

__device__ static double f16_value(uint16_t h) {
    int sign = h & 0x8000, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (ex == 0) v = ldexp((double)man, -24);
    else if (ex == 31) v = man ? (double)NAN : (double)INFINITY;
    else v = ldexp(1.0 + man / 1024.0, ex - 15);
    return sign ? -v : v;
}

/* ------------------------------------------------------------- context */

static int fail(char *msg, size_t n, const char *what, gpuError_t e) {
    snprintf(msg, n, "%s: %s", what, gpuGetErrorString(e));
    return 1;
}

extern "C" int GPU_FN(ctx_open)(gk_ctx **out, int device, char *desc, size_t desc_n, char *msg, size_t msg_n) {
    *out = NULL;
    int count = 0;
    gpuError_t e = gpuGetDeviceCount(&count);
    if (e != gpuSuccess || count == 0) {
        snprintf(msg, msg_n, "no %s GPU on this machine (%s)", GPU_NAME,
                 e != gpuSuccess ? gpuGetErrorString(e) : "none found");
        return 1;
    }
    if (device < 0 || device >= count) {
        snprintf(msg, msg_n, "%s:%d: this machine has %d %s GPU%s (0..%d)", GPU_NAME, device, count, GPU_NAME,
                 count == 1 ? "" : "s", count - 1);
        return 1;
    }
    if ((e = gpuSetDevice(device)) != gpuSuccess) return fail(msg, msg_n, "selecting the GPU", e);
    gpuDeviceProp prop;
    if ((e = gpuGetDeviceProperties(&prop, device)) != gpuSuccess) return fail(msg, msg_n, "reading the GPU", e);
#if defined(GPU_CUDA)
    snprintf(desc, desc_n, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
#else
    snprintf(desc, desc_n, "%s (%s)", prop.name, prop.gcnArchName);
#endif
    gk_ctx *c = (gk_ctx *)calloc(1, sizeof *c);
    c->device = device;
    if ((e = gpuStreamCreate(&c->stream)) != gpuSuccess) {
        free(c);
        return fail(msg, msg_n, "creating a stream", e);
    }
    if ((e = gpuMalloc((void **)&c->flag, sizeof(int))) != gpuSuccess) {
        (void)gpuStreamDestroy(c->stream);
        free(c);
        return fail(msg, msg_n, "allocating GPU memory", e);
    }
#if defined(GPU_CUDA)
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        (void)gpuFree(c->flag);
        (void)gpuStreamDestroy(c->stream);
        free(c);
        snprintf(msg, msg_n, "cuBLAS could not be initialised");
        return 1;
    }
    (void)cublasSetStream(c->blas, c->stream);
    /* PyTorch's default for fp32 products: no TF32 (torch.backends.cuda.matmul.allow_tf32 = False) */
    (void)cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
#endif
    GPU_FN(emu_flag_reset)(c);
    *out = c;
    return 0;
}

extern "C" void GPU_FN(ctx_close)(gk_ctx *c) {
    if (!c) return;
    (void)gpuStreamSynchronize(c->stream);
#if defined(GPU_CUDA)
    (void)cublasDestroy(c->blas);
#endif
    (void)gpuFree(c->flag);
    (void)gpuStreamDestroy(c->stream);
    free(c);
}

extern "C" void *GPU_FN(alloc)(gk_ctx *c, size_t bytes) {
    (void)c;
    void *p = NULL;
    if (gpuMalloc(&p, bytes ? bytes : 1) != gpuSuccess) {
        (void)gpuGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void GPU_FN(free)(gk_ctx *c, void *p) {
    if (c) (void)gpuStreamSynchronize(c->stream);
    if (p) (void)gpuFree(p);
}

extern "C" void *GPU_FN(host_alloc)(size_t bytes) {
    void *p = NULL;
    if (gpuMallocHost(&p, bytes ? bytes : 1) != gpuSuccess) {
        (void)gpuGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void GPU_FN(host_free)(void *p) {
    if (p) (void)gpuFreeHost(p);
}

extern "C" int GPU_FN(upload)(gk_ctx *c, void *dst, const void *src, size_t bytes) {
    if (gpuMemcpyAsync(dst, src, bytes, gpuMemcpyHostToDevice, c->stream) != gpuSuccess) return 1;
    return gpuStreamSynchronize(c->stream) != gpuSuccess;
}

extern "C" int GPU_FN(download)(gk_ctx *c, void *dst, const void *src, size_t bytes) {
    return gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToHost, c->stream) != gpuSuccess;
}

extern "C" int GPU_FN(zero)(gk_ctx *c, void *dst, size_t bytes) {
    return gpuMemsetAsync(dst, 0, bytes, c->stream) != gpuSuccess;
}

extern "C" int GPU_FN(sync)(gk_ctx *c, char *msg, size_t msg_n) {
    gpuError_t e = gpuStreamSynchronize(c->stream);
    if (e == gpuSuccess) e = gpuGetLastError();
    if (e != gpuSuccess) return fail(msg, msg_n, "GPU", e);
    return 0;
}

extern "C" int GPU_FN(emu_flag)(gk_ctx *c) {
    int v = INT_MAX;
    (void)gpuMemcpy(&v, c->flag, sizeof v, gpuMemcpyDeviceToHost);
    return v;
}

extern "C" void GPU_FN(emu_flag_reset)(gk_ctx *c) {
    int v = INT_MAX;
    (void)gpuMemcpyAsync(c->flag, &v, sizeof v, gpuMemcpyHostToDevice, c->stream);
    (void)gpuStreamSynchronize(c->stream);
}

/* ---------------------------------------------------------- elementwise */

#define THREADS 256
static unsigned blocks_for(size_t n) { return (unsigned)((n + THREADS - 1) / THREADS); }

__global__ static void k_round_cast(double *dst, const double *src, size_t n, int dt) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = rd(dt, src[i]);
}

extern "C" void GPU_FN(round_cast)(gk_ctx *c, double *dst, const double *src, size_t n, int dt) {
    if (n) k_round_cast<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, src, n, dt);
}

__global__ static void k_embed(double *h, const float *table, const int32_t *tokens, int T, int H, int dt) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * H) return;
    size_t t = i / H, col = i % H;
    h[i] = rd(dt, (double)table[(size_t)tokens[t] * H + col]);
}

extern "C" void GPU_FN(embed)(gk_ctx *c, double *h, const float *table, const int32_t *tokens, int T, int H, int dt) {
    k_embed<<<blocks_for((size_t)T * H), THREADS, 0, c->stream>>>(h, table, tokens, T, H, dt);
}

/* One thread per row: the CPU's sequential double sum of squares. */
__global__ static void k_rmsnorm(double *out, const double *in, int rows, int n, size_t ld, const double *w,
                                 double eps, int D, int S) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const double *v = in + (size_t)r * ld;
    double *o = out + (size_t)r * ld;
    double ss = 0;
    for (int i = 0; i < n; i++) {
        double x = rd(D, v[i]);
        ss += x * x;
    }
    double var = rd(GK_F32, ss / n);
    double inv = (double)(1.0f / sqrtf((float)(var + eps)));
    for (int i = 0; i < n; i++) {
        double x = rd(D, v[i]);
        o[i] = rd(S, rd(D, w[i] * rd(D, rd(GK_F32, x * inv))));
    }
}

/* One block per row: the roundings in parallel, the sum of squares by one
 * thread in the CPU's order (a double sum's bits depend on it). */
#define NORM_THREADS 128
#define NORM_MAX_SMEM 6144
__global__ static void k_rmsnorm_block(double *out, const double *in, int n, size_t ld, const double *w, double eps,
                                       int D, int S) {
    extern __shared__ double sq[];
    __shared__ double inv_s;
    const double *v = in + (size_t)blockIdx.x * ld;
    double *o = out + (size_t)blockIdx.x * ld;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        double x = rd(D, v[i]);
        sq[i] = x * x;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += sq[i];
        double var = rd(GK_F32, ss / n);
        inv_s = (double)(1.0f / sqrtf((float)(var + eps)));
    }
    __syncthreads();
    const double inv = inv_s;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        double x = rd(D, v[i]);
        o[i] = rd(S, rd(D, w[i] * rd(D, rd(GK_F32, x * inv))));
    }
}

extern "C" void GPU_FN(rmsnorm)(gk_ctx *c, double *out, const double *in, int rows, int n, size_t ld, const double *w,
                                double eps, int D, int S) {
    if (n <= NORM_MAX_SMEM)
        k_rmsnorm_block<<<rows, NORM_THREADS, (size_t)n * sizeof(double), c->stream>>>(out, in, n, ld, w, eps, D, S);
    else
        k_rmsnorm<<<blocks_for((size_t)rows), THREADS, 0, c->stream>>>(out, in, rows, n, ld, w, eps, D, S);
}

/* q' = q*cos + rotate_half(q)*sin, three roundings; one thread per pair
 * (j, j + half) of a (position, head): each new value needs the other's old one. */
__global__ static void k_rope(double *x, int T, int heads, int hd, size_t row_stride, const double *cos_t,
                              const double *sin_t, int D) {
    const int half = hd / 2;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * heads * half) return;
    const int j = (int)(i % half), h = (int)(i / half % heads), t = (int)(i / half / heads);
    double *v = x + (size_t)t * row_stride + (size_t)h * hd;
    const double *cs = cos_t + (size_t)t * hd, *sn = sin_t + (size_t)t * hd;
    const double a = v[j], b = v[j + half];
    v[j] = rd(D, rd(D, a * cs[j]) + rd(D, -b * sn[j]));
    v[j + half] = rd(D, rd(D, b * cs[j + half]) + rd(D, a * sn[j + half]));
}

extern "C" void GPU_FN(rope)(gk_ctx *c, double *x, int T, int heads, int hd, size_t row_stride, const double *cos_t,
                             const double *sin_t, int D) {
    const size_t n = (size_t)T * heads * (hd / 2);
    if (n) k_rope<<<blocks_for(n), THREADS, 0, c->stream>>>(x, T, heads, hd, row_stride, cos_t, sin_t, D);
}

__global__ static void k_clip(double *x, size_t n, double bound) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = fmin(fmax(x[i], -bound), bound);
}

extern "C" void GPU_FN(clip)(gk_ctx *c, double *x, size_t n, double bound) {
    if (n) k_clip<<<blocks_for(n), THREADS, 0, c->stream>>>(x, n, bound);
}

__global__ static void k_residual(double *h, const double *y, size_t n, int S) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = rd(S, h[i] + rd(S, y[i]));
}

extern "C" void GPU_FN(residual)(gk_ctx *c, double *h, const double *y, size_t n, int S) {
    if (n) k_residual<<<blocks_for(n), THREADS, 0, c->stream>>>(h, y, n, S);
}

/* One block per (head, query row): scale, mask and exponentials in
 * parallel, the fp32 sum by one thread in the CPU's order. */
#define SOFTMAX_THREADS 128
__global__ static void k_softmax_causal(double *s, int T, double scale, int window, int D) {
    __shared__ double red[SOFTMAX_THREADS];
    __shared__ float sum_s;
    const int r = blockIdx.x, i = r % T, tid = threadIdx.x;
    double *row = s + (size_t)r * T;
    const int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
    double mx = -INFINITY;
    for (int j = tid; j < T; j += blockDim.x) {
        if (j < j0 || j > i) {
            row[j] = 0;
            continue;
        }
        double v = rd(D, rd(GK_F32, row[j] * scale));
        row[j] = v;
        mx = v > mx ? v : mx;
    }
    red[tid] = mx;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {   /* a maximum: any order gives the same */
        if (tid < h) red[tid] = red[tid + h] > red[tid] ? red[tid + h] : red[tid];
        __syncthreads();
    }
    const float m = (float)red[0];
    for (int j = j0 + tid; j <= i; j += blockDim.x) row[j] = (float)exp((double)((float)row[j] - m));
    __syncthreads();
    if (tid == 0) {
        float sum = 0;
        for (int j = j0; j <= i; j++) sum += (float)row[j];
        sum_s = sum;
    }
    __syncthreads();
    const float sum = sum_s;
    for (int j = j0 + tid; j <= i; j += blockDim.x) row[j] = rd(D, (double)((float)row[j] / sum));
}

extern "C" void GPU_FN(softmax_causal)(gk_ctx *c, double *s, int heads, int T, double scale, int window, int D) {
    k_softmax_causal<<<heads * T, SOFTMAX_THREADS, 0, c->stream>>>(s, T, scale, window, D);
}

__device__ static double act_apply(int act, double x) {
    switch (act) {
    case GK_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case GK_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    default: return x / (1.0 + exp(-x));
    }
}

__global__ static void k_act_mul(double *g, const double *u, size_t n, int act, int D) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = rd(D, rd(D, act_apply(act, g[i])) * u[i]);
}

extern "C" void GPU_FN(act_mul)(gk_ctx *c, double *g, const double *u, size_t n, int act, int D) {
    if (n) k_act_mul<<<blocks_for(n), THREADS, 0, c->stream>>>(g, u, n, act, D);
}

/* --------------------------------------------------------------- routing */

__device__ static bool ranks_before(double a, int ia, double b, int ib) {
    if (isnan(a) != isnan(b)) return isnan(a);   /* NaN ranks highest, as in torch.topk */
    return a > b || (a == b && ia < ib);
}

#define MAX_TOPK 64

/* One thread per token: router/router.c's fp32 path. */
__global__ static void k_route(const double *logits, double *probs, int T, int E, int K, int norm, int wdt,
                               uint16_t *ids_out, double *w_out) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const double *x = logits + (size_t)t * E;
    double *p = probs + (size_t)t * E;
    double m = -INFINITY;
    for (int i = 0; i < E; i++) m = x[i] > m ? x[i] : m;
    float s = 0;
    for (int i = 0; i < E; i++) {
        float e = (float)exp((double)((float)x[i] - (float)m));
        p[i] = e;
        s += e;
    }
    for (int i = 0; i < E; i++) p[i] = (double)((float)p[i] / s);
    uint16_t ids[MAX_TOPK];
    int len = 0;
    for (int i = 0; i < E; i++) {
        int pos = len;
        while (pos > 0 && ranks_before(p[i], i, p[ids[pos - 1]], ids[pos - 1])) pos--;
        if (pos >= K) continue;
        int end = len < K ? len : K - 1;
        for (int j = end; j > pos; j--) ids[j] = ids[j - 1];
        ids[pos] = (uint16_t)i;
        if (len < K) len++;
    }
    float sk = 0;
    for (int i = 0; i < K; i++) sk += (float)p[ids[i]];
    for (int i = 0; i < K; i++) {
        double wi = norm ? (double)((float)p[ids[i]] / sk) : (double)(float)p[ids[i]];
        ids_out[(size_t)t * K + i] = ids[i];
        w_out[(size_t)t * K + i] = rd(wdt, wi);
    }
}

extern "C" void GPU_FN(route)(gk_ctx *c, const double *logits, double *probs, int T, int E, int K, int norm, int wdt,
                              uint16_t *ids, double *w) {
    k_route<<<(T + 63) / 64, 64, 0, c->stream>>>(logits, probs, T, E, K, norm, wdt, ids, w);
}

/* Rows grouped by expert, tokens ascending within one (experts/experts.c's
 * order): one warp (wavefront) per expert walks the (token, slot) list in
 * order a warp-width at a time; a ballot gives each match its rank. */
#if defined(GPU_HIP)
#define WARP 64
#define BALLOT(p) __ballot(p)
#else
#define WARP 32
#define BALLOT(p) __ballot_sync(0xffffffffu, p)
#endif

__global__ static void k_expert_counts(const uint16_t *ids, int R, int *counts) {
    const int e = blockIdx.x, lane = threadIdx.x;
    int n = 0;
    for (int i0 = 0; i0 < R; i0 += WARP) {
        const int i = i0 + lane;
        n += __popcll((unsigned long long)BALLOT(i < R && ids[i] == e));
    }
    if (lane == 0) counts[e] = n;
}

__global__ static void k_expert_rows(const uint16_t *ids, int R, int E, const int *counts, int *offset, int *token,
                                     int *row_of, int K) {
    const int e = blockIdx.x, lane = threadIdx.x;
    int r = 0;
    for (int x = 0; x < e; x++) r += counts[x];
    if (lane == 0) {
        offset[e] = r;
        if (e == E - 1) offset[E] = r + counts[e];
    }
    for (int i0 = 0; i0 < R; i0 += WARP) {
        const int i = i0 + lane;
        const bool mine = i < R && ids[i] == e;
        const unsigned long long m = (unsigned long long)BALLOT(mine);
        if (mine) {
            const int at = r + __popcll(m & ((1ull << lane) - 1));
            token[at] = i / K;
            row_of[i] = at;
        }
        r += __popcll(m);
    }
}

extern "C" void GPU_FN(dispatch)(gk_ctx *c, const uint16_t *ids, int T, int K, int E, int *offset, int *token,
                                 int *row_of) {
    /* offset holds 2E + 1 ints: the offsets, then the counts */
    int *counts = offset + E + 1;
    k_expert_counts<<<E, WARP, 0, c->stream>>>(ids, T * K, counts);
    k_expert_rows<<<E, WARP, 0, c->stream>>>(ids, T * K, E, counts, offset, token, row_of, K);
}

__device__ static void put_operand(void *dst, int fmt, size_t i, double v) {
    if (fmt == GK_F32) ((float *)dst)[i] = (float)v;
    else if (fmt == GK_BF16) ((uint16_t *)dst)[i] = bf16_bits(v);
    else ((uint16_t *)dst)[i] = f16_bits(v);
}

__global__ static void k_gather(void *op, int fmt, int Kp, const double *x, int H, const int *token, int R) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * Kp) return;
    size_t r = i / Kp, col = i % Kp;
    put_operand(op, fmt, i, (int)col < H ? x[(size_t)token[r] * H + col] : 0.0);
}

extern "C" void GPU_FN(gather)(gk_ctx *c, void *op, int fmt, int Kp, const double *x, int H, const int *token,
                               int R) {
    if (R) k_gather<<<blocks_for((size_t)R * Kp), THREADS, 0, c->stream>>>(op, fmt, Kp, x, H, token, R);
}

__global__ static void k_combine(double *out, const double *y, int T, int H, int K, const int *row_of, const double *w,
                                 int prod, int sum, int outdt) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * H) return;
    size_t t = i / H, h = i % H;
    double acc = 0;
    for (int s = 0; s < K; s++) {
        double p = rd(prod, y[(size_t)row_of[t * K + s] * H + h] * w[t * K + s]);
        acc = rd(sum, acc + p);
    }
    out[i] = rd(outdt, acc);
}

extern "C" void GPU_FN(combine)(gk_ctx *c, double *out, const double *y, int T, int H, int K, const int *row_of,
                                const double *w, int prod, int sum, int outdt) {
    k_combine<<<blocks_for((size_t)T * H), THREADS, 0, c->stream>>>(out, y, T, H, K, row_of, w, prod, sum, outdt);
}

__global__ static void k_shared_add(double *out, const double *s, double *g, int T, int H, int D) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * H) return;
    size_t t = i / H;
    double gt = rd(D, 1.0 / (1.0 + exp(-g[t])));
    out[i] = rd(D, out[i] + rd(D, gt * s[i]));
}

__global__ static void k_sigmoid_gate(double *g, int T, int D) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T) g[t] = rd(D, 1.0 / (1.0 + exp(-g[t])));
}

extern "C" void GPU_FN(shared_add)(gk_ctx *c, double *out, const double *s, double *g, int T, int H, int D) {
    k_shared_add<<<blocks_for((size_t)T * H), THREADS, 0, c->stream>>>(out, s, g, T, H, D);
    k_sigmoid_gate<<<blocks_for((size_t)T), THREADS, 0, c->stream>>>(g, T, D);
}

/* ------------------------------------------------------------- operands */

__global__ static void k_pack(void *dst, int fmt, int batch, int rows, int cols, int colsp, const double *src,
                              size_t sb, int group, size_t sr, size_t sc) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t per = (size_t)rows * colsp;
    if (i >= (size_t)batch * per) return;
    size_t b = i / per, r = (i % per) / colsp, col = i % colsp;
    double v = (int)col < cols ? src[(b / group) * sb + r * sr + col * sc] : 0.0;
    put_operand(dst, fmt, i, v);
}

extern "C" void GPU_FN(pack)(gk_ctx *c, void *dst, int fmt, int batch, int rows, int cols, int colsp,
                             const double *src, size_t sb, int group, size_t sr, size_t sc) {
    size_t n = (size_t)batch * rows * colsp;
    if (n) k_pack<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, fmt, batch, rows, cols, colsp, src, sb, group, sr, sc);
}

__global__ static void k_convert_weights(void *dst, int fmt, const float *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) put_operand(dst, fmt, i, (double)src[i]);
}

extern "C" void GPU_FN(convert_weights)(gk_ctx *c, void *dst, int fmt, const float *src, size_t n) {
    if (n) k_convert_weights<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, fmt, src, n);
}

__global__ static void k_epilogue(double *dst, const float *C, int batch, int M, int N, size_t ldc, size_t dst_bstride,
                                  const float *bias, int outdt) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t per = (size_t)M * N;
    if (i >= (size_t)batch * per) return;
    size_t b = i / per, r = (i % per) / N, j = i % N;
    float v = C[i];
    if (bias) v = v + bias[j];
    dst[b * dst_bstride + r * ldc + j] = rd(outdt, (double)v);
}

__global__ static void k_epilogue_packed(void *dst, const float *C, int M, int N, const float *bias, int outdt) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * N) return;
    float v = C[i];
    if (bias) v = v + bias[i % N];
    if (outdt == GK_BF16) ((uint16_t *)dst)[i] = bf16_bits((double)v);
    else if (outdt == GK_F16) ((uint16_t *)dst)[i] = f16_bits((double)v);
    else ((float *)dst)[i] = v;
}

extern "C" void GPU_FN(epilogue_packed)(gk_ctx *c, void *dst, const float *C, int M, int N, const float *bias,
                                        int outdt) {
    size_t n = (size_t)M * N;
    if (n) k_epilogue_packed<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, C, M, N, bias, outdt);
}

extern "C" void GPU_FN(epilogue)(gk_ctx *c, double *dst, const float *C, int batch, int M, int N, size_t ldc,
                                 size_t dst_bstride, const float *bias, int outdt) {
    size_t n = (size_t)batch * M * N;
    if (n) k_epilogue<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, C, batch, M, N, ldc, dst_bstride, bias, outdt);
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
    const float *B = (const float *)g.B + (size_t)b * g.b_bstride + (size_t)e * g.b_bstride * (g.offsets != NULL);
    float acc = 0;
    for (int k0 = 0; k0 < g.K; k0 += CT) {
        int ar = r0 + ty, bc = blockIdx.x * CT + ty;
        As[ty][tx] = ar < r1 && k0 + tx < g.Kp ? A[(size_t)ar * g.Kp + k0 + tx] : 0.0f;
        Bs[ty][tx] = bc < g.N && k0 + tx < g.Kp ? B[(size_t)bc * g.Kp + k0 + tx] : 0.0f;
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
    return ldexp(trunc(ldexp(S, E - F - q)), q);
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
        uint16_t bb = bc < g.N && k0 + tx < g.Kp ? B[(size_t)bc * g.Kp + k0 + tx] : 0;
        double av = g.fmt == GK_F16 ? f16_value(ab) : bf16_value(ab);
        double bv = g.fmt == GK_F16 ? f16_value(bb) : bf16_value(bb);
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

/* ---- tensor cores: a k16 chain of the hardware's own instruction */

#if defined(GPU_CUDA)
#define MBM 64
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

/* One stage: each of the 128 threads moves two 16-byte pieces of A's rows
 * and two of B's (zeros past the rows, the columns or Kp). */
__device__ static void mma_load_stage(uint16_t (*As)[MBK + MPAD], uint16_t (*Bs)[MBK + MPAD], const gk_gemm *g,
                                      const uint16_t *A, const uint16_t *B, int r0, int r1, int n0, int tid, int k0) {
    for (int p = 0; p < 2; p++) {
        const int piece = tid + p * 128, row = piece >> 2, col = (piece & 3) * 8;
        const int ar = r0 + row, bn = n0 + row;
        const bool ka = k0 + col < g->Kp;
        const bool va = ar < r1 && ka, vb = bn < g->N && ka;
        cp_async16(&As[row][col], va ? (const void *)(A + (size_t)ar * g->Kp + k0 + col) : (const void *)A, va ? 16 : 0);
        cp_async16(&Bs[row][col], vb ? (const void *)(B + (size_t)bn * g->Kp + k0 + col) : (const void *)B, vb ? 16 : 0);
    }
}

/* 128 threads, 2x2 warps of 32x32, K in stages of 32 moved by cp.async
 * MSTAGES - 1 stages ahead, fragments read with ldmatrix. Each k16 step is
 * one mma.sync per 16x8 piece with the running fp32 sums as C: the same
 * k16 chain, K ascending from zero, as emu:hopper's plain schedule (the
 * staging changes when operands arrive, not the order of the sums). */
__global__ static void __launch_bounds__(128) k_mma(gk_gemm g) {
    __shared__ __align__(16) uint16_t As[MSTAGES][MBM][MBK + MPAD], Bs[MSTAGES][MBN][MBK + MPAD];
    int e, r0, r1;
    if (!tile_rows(&g, blockIdx.y, MBM, &e, &r0, &r1)) return;
    const int b = blockIdx.z, n0 = blockIdx.x * MBN;
    const uint16_t *A = (const uint16_t *)g.A + (size_t)b * g.a_bstride;
    const uint16_t *B = (const uint16_t *)g.B + (size_t)b * g.b_bstride + (size_t)e * g.b_bstride * (g.offsets != NULL);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float acc[2][4][4];
    for (int x = 0; x < 2; x++)
        for (int y = 0; y < 4; y++)
            for (int z = 0; z < 4; z++) acc[x][y][z] = 0.0f;
    const int KT = (g.Kp + MBK - 1) / MBK;
    for (int s = 0; s < MSTAGES - 1; s++) {
        if (s < KT) mma_load_stage(As[s], Bs[s], &g, A, B, r0, r1, n0, tid, s * MBK);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<MSTAGES - 2>();
        __syncthreads();   /* stage kt has landed for everyone; slot (kt - 1) % MSTAGES is free */
        const int next = kt + MSTAGES - 1;
        if (next < KT) mma_load_stage(As[next % MSTAGES], Bs[next % MSTAGES], &g, A, B, r0, r1, n0, tid, next * MBK);
        cp_async_commit();
        const int slot = kt % MSTAGES, k0 = kt * MBK;
        for (int ks = 0; ks < MBK && k0 + ks < g.Kp; ks += 16) {
            uint32_t af[2][4], bf[4][2];
            for (int mi = 0; mi < 2; mi++)
                ldmatrix_x4(af[mi], &As[slot][wm + mi * 16 + (lane & 15)][ks + (lane >> 4) * 8]);
            for (int np = 0; np < 2; np++) {
                uint32_t r[4];
                ldmatrix_x4(r, &Bs[slot][wn + np * 16 + (lane & 7) + (lane >> 4) * 8][ks + ((lane >> 3) & 1) * 8]);
                bf[2 * np][0] = r[0];
                bf[2 * np][1] = r[1];
                bf[2 * np + 1][0] = r[2];
                bf[2 * np + 1][1] = r[3];
            }
            for (int mi = 0; mi < 2; mi++)
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
    float *C = g.C + (size_t)b * g.c_bstride;
    for (int mi = 0; mi < 2; mi++)
        for (int ni = 0; ni < 4; ni++) {
            int r = r0 + wm + mi * 16 + gq, col = n0 + wn + ni * 8 + 2 * tq;
            for (int h = 0; h < 2; h++) {
                int rr = r + 8 * h;
                if (rr >= r1) continue;
                if (col < g.N) C[(size_t)rr * g.N + col] = acc[mi][ni][2 * h];
                if (col + 1 < g.N) C[(size_t)rr * g.N + col + 1] = acc[mi][ni][2 * h + 1];
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
            if (col < g.N) bb[x] = (short)B[(size_t)col * g.Kp + k0 + kq + x];
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

extern "C" int GPU_FN(gemm)(gk_ctx *c, const gk_gemm *g, char *msg, size_t msg_n) {
    if (g->M <= 0 || g->N <= 0) return 0;
    switch (g->engine) {
    case GK_ENGINE_BLAS:
#if defined(GPU_CUDA)
        if (g->offsets) break;
        return blas_gemm(c, g, msg, msg_n);
#else
        break;
#endif
    case GK_ENGINE_CHAIN32: {
        dim3 grid((g->N + CT - 1) / CT, row_tiles(g, CT), g->batch), block(CT, CT);
        k_chain32<<<grid, block, 0, c->stream>>>(*g);
        return 0;
    }
    case GK_ENGINE_EMU: {
        if (ET % g->emu_chunk || g->emu_k % g->emu_chunk) {
            snprintf(msg, msg_n, "emulated product: chunk of %d products does not divide a 16-wide tile", g->emu_chunk);
            return 1;
        }
        dim3 grid((g->N + ET - 1) / ET, row_tiles(g, ET), g->batch), block(ET, ET);
        k_emu<<<grid, block, 0, c->stream>>>(*g, c->flag);
        return 0;
    }
    case GK_ENGINE_MMA: {
#if defined(GPU_CUDA)
        dim3 grid((g->N + MBN - 1) / MBN, row_tiles(g, MBM), g->batch);
        k_mma<<<grid, 128, 0, c->stream>>>(*g);
#else
        dim3 grid((g->N + 15) / 16, row_tiles(g, 16), g->batch);
        k_mfma<<<grid, 64, 0, c->stream>>>(*g);
#endif
        return 0;
    }
    }
    snprintf(msg, msg_n, "matrix engine %d is not available in the %s backend", g->engine, GPU_NAME);
    return 1;
}
