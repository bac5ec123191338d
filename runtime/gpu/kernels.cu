/* GPU kernels of the forward pass apart from the matrix products (gemm.cu):
 * the context, elementwise steps, routing and dispatch. One source for CUDA
 * (nvcc) and HIP (hipcc -x hip); device code is kept C-like.
 *
 * Every elementwise kernel is the CPU executor's loop (runtime/cpu/forward.c,
 * router/router.c, experts/experts.c) over one row or element, with the same
 * double arithmetic and the same rounding formulas, so CPU and GPU runs of
 * one instruction model agree bit for bit. Sequential sums stay sequential
 * (one thread per row) for the same reason. */
#include "gpu_device.h"

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
