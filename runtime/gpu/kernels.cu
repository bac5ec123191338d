/* GPU kernels of the forward pass apart from the matrix products (gemm.cu):
 * the context, elementwise steps, routing and dispatch. One source for CUDA
 * (nvcc) and HIP (hipcc -x hip); device code is kept C-like.
 *
 * Every elementwise kernel is the CPU executor's loop (runtime/cpu/forward.c,
 * router/router.c, experts/experts.c) over one row or element, with the same
 * double arithmetic and the same rounding formulas, so CPU and GPU runs of
 * one instruction model agree bit for bit. Sequential sums stay sequential
 * (one thread of the row's block or warp adds them, in order) for the same
 * reason. */
#include "gpu_device.h"

/* ------------------------------------------------------------- context */

static int fail(char *msg, size_t n, const char *what, gpuError_t e) {
    snprintf(msg, n, "%s: %s", what, gpuGetErrorString(e));
    return 1;
}

/* Frees what a context holds and the context; on a part-made one (ctx_open's failures) members still zero are
 * skipped. */
static void ctx_release(gk_ctx *c) {
    if (c->stream) (void)gpuStreamSynchronize(c->stream);
    if (c->side) (void)gpuStreamSynchronize(c->side);
    for (int i = 0; i < c->n_marks; i++) (void)gpuEventDestroy(c->marks[i]);
    for (int i = 0; i < GK_SLOTS; i++)
        if (c->slots[i]) (void)gpuEventDestroy(c->slots[i]);
    free(c->marks);
    if (c->fence) (void)gpuEventDestroy(c->fence);
    if (c->side) (void)gpuStreamDestroy(c->side);
#if defined(GPU_CUDA)
    if (c->blas) (void)cublasDestroy(c->blas);
#endif
    if (c->flag) (void)gpuFree(c->flag);
    if (c->stream) (void)gpuStreamDestroy(c->stream);
    free(c);
}

extern "C" int GPU_FN(device_count)(int *count, char *msg, size_t msg_n) {
    *count = 0;
    const gpuError_t e = gpuGetDeviceCount(count);
    if (e != gpuSuccess || *count == 0) {
        *count = 0;
        snprintf(msg, msg_n, "no %s GPU on this machine (%s)", GPU_NAME, e != gpuSuccess ? gpuGetErrorString(e) : "none found");
        return 1;
    }
    return 0;
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
    const char *what = NULL;
    if ((e = gpuStreamCreate(&c->stream)) != gpuSuccess || (e = gpuStreamCreate(&c->side)) != gpuSuccess)
        what = "creating a stream";
    else if ((e = gpuEventCreateWithFlags(&c->fence, gpuEventDisableTiming)) != gpuSuccess)
        what = "creating an event";
    else if ((e = gpuMalloc((void **)&c->flag, sizeof(int))) != gpuSuccess)
        what = "allocating GPU memory";
    for (int i = 0; i < GK_SLOTS && !what; i++)
        if ((e = gpuEventCreateWithFlags(&c->slots[i], gpuEventDisableTiming)) != gpuSuccess) what = "creating an event";
    if (what) {
        ctx_release(c);
        return fail(msg, msg_n, what, e);
    }
#if defined(GPU_CUDA)
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        ctx_release(c);
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
    if (c) ctx_release(c);
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
    if (c) {
        (void)gpuStreamSynchronize(c->stream);
        (void)gpuStreamSynchronize(c->side);
    }
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

extern "C" int GPU_FN(download_behind)(gk_ctx *c, void *dst, const void *src, size_t bytes, int mark) {
    if (mark < 0) return 1;
    if (mark >= c->n_marks) {
        const int n = mark + 16;
        gpuEvent_t *m = (gpuEvent_t *)realloc(c->marks, (size_t)n * sizeof *m);
        if (!m) return 1;
        c->marks = m;
        for (; c->n_marks < n; c->n_marks++)
            if (gpuEventCreateWithFlags(&c->marks[c->n_marks], gpuEventDisableTiming) != gpuSuccess) return 1;
    }
    return gpuEventRecord(c->fence, c->stream) != gpuSuccess ||
           gpuStreamWaitEvent(c->side, c->fence, 0) != gpuSuccess ||
           gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToHost, c->side) != gpuSuccess ||
           gpuEventRecord(c->marks[mark], c->side) != gpuSuccess;
}

extern "C" int GPU_FN(wait_mark)(gk_ctx *c, int mark, char *msg, size_t msg_n) {
    if (mark < 0 || mark >= c->n_marks) {
        snprintf(msg, msg_n, "no copy was queued under mark %d", mark);
        return 1;
    }
    gpuError_t e = gpuEventSynchronize(c->marks[mark]);
    return e != gpuSuccess ? fail(msg, msg_n, "GPU", e) : 0;
}

extern "C" int GPU_FN(zero)(gk_ctx *c, void *dst, size_t bytes) {
    return gpuMemsetAsync(dst, 0, bytes, c->stream) != gpuSuccess;
}

extern "C" int GPU_FN(sync)(gk_ctx *c, char *msg, size_t msg_n) {
    gpuError_t e = gpuStreamSynchronize(c->stream);
    if (e == gpuSuccess) e = gpuStreamSynchronize(c->side);
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


__global__ static void k_narrow(float *dst, const double *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (float)src[i];
}

extern "C" void GPU_FN(narrow)(gk_ctx *c, float *dst, const double *src, size_t n) {
    if (n) k_narrow<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, src, n);
}

__global__ static void k_embed(double *h, const void *table, int table_dt, const int32_t *tokens, int H, int dt) {
    const int t = blockIdx.x, col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= H) return;
    h[(size_t)t * H + col] = rd(dt, get_value(table, table_dt, (size_t)tokens[t] * H + col));
}

extern "C" void GPU_FN(embed)(gk_ctx *c, double *h, const void *table, int table_dt, const int32_t *tokens, int T, int H,
                              int dt) {
    if (T > 0 && H > 0) k_embed<<<row_grid(T, H, 1), THREADS, 0, c->stream>>>(h, table, table_dt, tokens, H, dt);
}

/* ---------------------------------------------------------- weight upload */

extern "C" int GPU_FN(mem_info)(gk_ctx *c, size_t *free_bytes, size_t *total_bytes, char *msg, size_t msg_n) {
    (void)c;
    gpuError_t e = gpuMemGetInfo(free_bytes, total_bytes);
    return e != gpuSuccess ? fail(msg, msg_n, "reading the GPU's free memory", e) : 0;
}

extern "C" int GPU_FN(bind_thread)(gk_ctx *c) { return gpuSetDevice(c->device) != gpuSuccess; }

extern "C" int GPU_FN(copy_async)(gk_ctx *c, void *dst, const void *src, size_t bytes) {
    return gpuMemcpyAsync(dst, src, bytes, gpuMemcpyHostToDevice, c->stream) != gpuSuccess;
}

extern "C" int GPU_FN(slot_record)(gk_ctx *c, int slot) {
    return slot < 0 || slot >= GK_SLOTS || gpuEventRecord(c->slots[slot], c->stream) != gpuSuccess;
}

extern "C" int GPU_FN(slot_wait)(gk_ctx *c, int slot) {
    return slot < 0 || slot >= GK_SLOTS || gpuEventSynchronize(c->slots[slot]) != gpuSuccess;
}

__global__ static void k_place(void *dst, int dst_dt, int k, int kp, size_t e0, const void *src, int src_dt, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t e = e0 + i;
    put_operand(dst, dst_dt, (e / (size_t)k) * (size_t)kp + e % (size_t)k, get_value(src, src_dt, i));
}

extern "C" void GPU_FN(place)(gk_ctx *c, void *dst, int dst_dt, int k, int kp, size_t e0, const void *src, int src_dt,
                              size_t n) {
    if (n) k_place<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, dst_dt, k, kp, e0, src, src_dt, n);
}

/* Element e of per-expert matrices [A][B] stored row-major (gpt-oss's fused experts, "x @ W" layouts) to the
 * products' rows: column b of expert x becomes row b, its values the A of that column, at
 * dst[(x * B + b) * kp + a]. */
__global__ static void k_place_t(void *dst, int dst_dt, int A, int B, int kp, size_t e0, const void *src, int src_dt,
                                 size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t e = e0 + i, per = (size_t)A * B, x = e / per, rem = e % per, a = rem / (size_t)B, b = rem % (size_t)B;
    put_operand(dst, dst_dt, (x * (size_t)B + b) * (size_t)kp + a, get_value(src, src_dt, i));
}

extern "C" void GPU_FN(place_t)(gk_ctx *c, void *dst, int dst_dt, int A, int B, int kp, size_t e0, const void *src,
                                int src_dt, size_t n) {
    if (n) k_place_t<<<blocks_for(n), THREADS, 0, c->stream>>>(dst, dst_dt, A, B, kp, e0, src, src_dt, n);
}

/* A sequential sum, p[0] + p[1] + ... in this order, its operands read
 * eight ahead: without the read-ahead every add waited for its own shared
 * memory load (about 30 cycles) instead of the previous add (a few). */
template <typename T> __device__ static T seq_sum(const T *p, int n) {
    T s = 0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        T v[8];
        for (int u = 0; u < 8; u++) v[u] = p[i + u];
        for (int u = 0; u < 8; u++) s += v[u];
    }
    for (; i < n; i++) s += p[i];
    return s;
}

/* One block per row: the roundings in parallel, the sum of squares by one
 * thread in the CPU's order (a double sum's bits depend on it). Two
 * independent jobs can share a launch (q's and k's norms), so that their
 * sums run side by side; C is a further cast of the output (GK_F64: none),
 * the one the CPU makes of the normed activations before the next product. */
#define NORM_THREADS 256
#define NORM_MAX_SMEM 6144
typedef struct norm_job {
    double *out;
    const double *in;
    const double *w;
    int rows, n;
    size_t ld;
} norm_job;

/* The normed value of x (a D value) times weight w: Llama's w * round_D(y32), or gpt-oss's (w32 set)
 * round_D(fp32(w * y32)), one rounding (runtime/cpu/forward_body.h's rmsnorm_eps) */
__device__ static double norm_out(double x, double inv, double w, int D, int w32) {
    if (w32) return rd(D, rd(GK_F32, (double)(float)w * rd(GK_F32, x * inv)));
    return rd(D, w * rd(D, rd(GK_F32, x * inv)));
}

__global__ static void __launch_bounds__(NORM_THREADS) k_rmsnorm_block(norm_job j0, norm_job j1, double eps, int D,
                                                                       int S, int C, int w32) {
    extern __shared__ double sq[];
    __shared__ double inv_s;
    const bool second = (int)blockIdx.x >= j0.rows;
    const norm_job j = second ? j1 : j0;
    const int r = second ? blockIdx.x - j0.rows : blockIdx.x, n = j.n;
    const double *v = j.in + (size_t)r * j.ld, *w = j.w;
    double *o = j.out + (size_t)r * j.ld;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        double x = rd(D, v[i]);
        sq[i] = x * x;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const double ss = seq_sum(sq, n);
        double var = rd(GK_F32, ss / n);
        inv_s = (double)(1.0f / sqrtf((float)(var + eps)));
    }
    __syncthreads();
    const double inv = inv_s;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        double x = rd(D, v[i]);
        o[i] = rd(C, rd(S, norm_out(x, inv, w[i], D, w32)));
    }
}

/* The same, one thread per row, for rows too long for shared memory. */
__global__ static void k_rmsnorm(norm_job j, double eps, int D, int S, int C, int w32) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= j.rows) return;
    const double *v = j.in + (size_t)r * j.ld;
    double *o = j.out + (size_t)r * j.ld;
    double ss = 0;
    for (int i = 0; i < j.n; i++) {
        double x = rd(D, v[i]);
        ss += x * x;
    }
    double var = rd(GK_F32, ss / j.n);
    double inv = (double)(1.0f / sqrtf((float)(var + eps)));
    for (int i = 0; i < j.n; i++) {
        double x = rd(D, v[i]);
        o[i] = rd(C, rd(S, norm_out(x, inv, j.w[i], D, w32)));
    }
}

static void rmsnorm_jobs(gk_ctx *c, norm_job a, norm_job b, double eps, int D, int S, int C, int w32) {
    const int n = a.n > b.n ? a.n : b.n;
    if (n <= NORM_MAX_SMEM) {
        if (a.rows + b.rows > 0)
            k_rmsnorm_block<<<a.rows + b.rows, NORM_THREADS, (size_t)n * sizeof(double), c->stream>>>(a, b, eps, D, S, C,
                                                                                                     w32);
        return;
    }
    if (a.rows > 0) k_rmsnorm<<<blocks_for((size_t)a.rows), THREADS, 0, c->stream>>>(a, eps, D, S, C, w32);
    if (b.rows > 0) k_rmsnorm<<<blocks_for((size_t)b.rows), THREADS, 0, c->stream>>>(b, eps, D, S, C, w32);
}

extern "C" void GPU_FN(rmsnorm)(gk_ctx *c, double *out, const double *in, int rows, int n, size_t ld, const double *w,
                                double eps, int D, int S, int C, int w32) {
    norm_job a = {out, in, w, rows, n, ld}, none = {out, in, w, 0, n, ld};
    rmsnorm_jobs(c, a, none, eps, D, S, C, w32);
}

extern "C" void GPU_FN(rmsnorm_pair)(gk_ctx *c, double *x1, int rows1, int n1, const double *w1, double *x2, int rows2,
                                     int n2, const double *w2, double eps, int D, int S, int w32) {
    norm_job a = {x1, x1, w1, rows1, n1, (size_t)n1}, b = {x2, x2, w2, rows2, n2, (size_t)n2};
    rmsnorm_jobs(c, a, b, eps, D, S, GK_F64, w32);
}

/* RoPE of one (row, head) per block, runtime/cpu/forward_body.h's rope: the head's rdim values are read into
 * shared memory first (a pair's two new values need both old ones, and DEINTERLEAVE writes elsewhere than it
 * reads), then one thread per pair writes its two values. */
__global__ static void k_rope(double *x, size_t row_stride, size_t head_stride, int off, int rdim, int style,
                              const double *cos_t, const double *sin_t, int D) {
    extern __shared__ double in[];
    const int t = blockIdx.x, h = blockIdx.y, half = rdim / 2;
    double *v = x + (size_t)t * row_stride + (size_t)h * head_stride + off;
    const double *cs = cos_t + (size_t)t * rdim, *sn = sin_t + (size_t)t * rdim;
    for (int i = threadIdx.x; i < rdim; i += blockDim.x) in[i] = v[i];
    __syncthreads();
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        if (style == GK_ROPE_COMPLEX) {
            const double a = in[2 * j], b = in[2 * j + 1], c = cs[j], s = sn[j];
            v[2 * j] = rd(D, rd(GK_F32, rd(GK_F32, a * c) - rd(GK_F32, b * s)));
            v[2 * j + 1] = rd(D, rd(GK_F32, rd(GK_F32, a * s) + rd(GK_F32, b * c)));
            continue;
        }
        const double a = style == GK_ROPE_DEINTERLEAVE ? in[2 * j] : in[j];
        const double b = style == GK_ROPE_DEINTERLEAVE ? in[2 * j + 1] : in[j + half];
        v[j] = rd(D, rd(D, a * cs[j]) + rd(D, -b * sn[j]));
        v[j + half] = rd(D, rd(D, b * cs[j + half]) + rd(D, a * sn[j + half]));
    }
}

extern "C" void GPU_FN(rope)(gk_ctx *c, double *x, int T, int heads, size_t row_stride, size_t head_stride, int off,
                             int rdim, int style, const double *cos_t, const double *sin_t, int D) {
    if (T > 0 && heads > 0 && rdim >= 2)
        k_rope<<<dim3((unsigned)T, (unsigned)heads), 64, (size_t)rdim * sizeof(double), c->stream>>>(
            x, row_stride, head_stride, off, rdim, style, cos_t, sin_t, D);
}

__global__ static void k_mla_kv(double *k, double *v, const double *kv, const double *ckv, int heads, int nope,
                                int rope, int vd, int kvr, int kvw) {
    const int t = blockIdx.x, h = blockIdx.y, qk = nope + rope;
    const double *src = kv + ((size_t)t * heads + h) * (nope + vd);
    double *kd = k + (size_t)t * heads * qk + (size_t)h * qk, *vdst = v + (size_t)t * heads * vd + (size_t)h * vd;
    for (int i = threadIdx.x; i < qk; i += blockDim.x) kd[i] = i < nope ? src[i] : ckv[(size_t)t * kvw + kvr + i - nope];
    for (int i = threadIdx.x; i < vd; i += blockDim.x) vdst[i] = src[nope + i];
}

extern "C" void GPU_FN(mla_kv)(gk_ctx *c, double *k, double *v, const double *kv, const double *ckv, int T, int heads,
                               int nope, int rope, int vd, int kvr, int kvw) {
    if (T > 0 && heads > 0)
        k_mla_kv<<<dim3((unsigned)T, (unsigned)heads), 64, 0, c->stream>>>(k, v, kv, ckv, heads, nope, rope, vd, kvr,
                                                                         kvw);
}

__global__ static void k_clip(double *x, size_t n, double bound) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = fmin(fmax(x[i], -bound), bound);
}

extern "C" void GPU_FN(clip)(gk_ctx *c, double *x, size_t n, double bound) {
    if (n) k_clip<<<blocks_for(n), THREADS, 0, c->stream>>>(x, n, bound);
}

__global__ static void k_residual(double *h, const double *y, size_t n, int S, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = rd(C, rd(S, h[i] + rd(S, y[i])));
}

extern "C" void GPU_FN(residual)(gk_ctx *c, double *h, const double *y, size_t n, int S, int C) {
    if (n) k_residual<<<blocks_for(n), THREADS, 0, c->stream>>>(h, y, n, S, C);
}

/* One block per (head, query row): scale, mask and exponentials in
 * parallel, the fp32 sum by one thread in the CPU's order, over the
 * exponentials kept in shared memory when the row fits (in_smem). */
#define SOFTMAX_THREADS 128
#define SOFTMAX_MAX_SMEM 8192
/* Rows [heads][Tq][Tk]: query row r is position q0 + r % Tq and sees keys
 * 0 .. q0 + r % Tq (the last `window` of them when sliding). A row's result
 * depends only on its own keys, not on Tk: a decode step's row (one query
 * against the cache) is the bits of the same row in a pass over the whole
 * sequence. */
/* With sinks (gpt-oss), head h's row gains the logit sinks[h] as a last column, dropped after the softmax, as the
 * CPU's attn_core: the maximum includes it, each score less the maximum is a D value (an fp32 difference rounded
 * to D; the sink's a double difference rounded to D), and the sink's exponential joins the fp32 sum last. */
__global__ static void k_softmax_causal(double *s, int Tq, int Tk, int q0, double scale, int window, int D,
                                        int in_smem, const double *sinks) {
    extern __shared__ float ex[];
    __shared__ double red[SOFTMAX_THREADS];
    __shared__ float sum_s;
    const int r = blockIdx.x, i = q0 + r % Tq, tid = threadIdx.x;
    double *row = s + (size_t)r * Tk;
    const int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
    double mx = -INFINITY;
    for (int j = tid; j < Tk; j += blockDim.x) {
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
    double mx_all = red[0];
    const double sk = sinks ? sinks[r / Tq] : 0;
    if (sinks) mx_all = sk > mx_all ? sk : mx_all;
    const float m = (float)mx_all;
    for (int j = j0 + tid; j <= i; j += blockDim.x) {
        const float e = sinks ? (float)exp((double)(float)rd(D, (double)((float)row[j] - m)))
                              : (float)exp((double)((float)row[j] - m));
        if (in_smem) ex[j - j0] = e;
        else row[j] = e;
    }
    __syncthreads();
    if (tid == 0) {
        float sum = 0;
        if (in_smem) sum = seq_sum(ex, i - j0 + 1);
        else
            for (int j = j0; j <= i; j++) sum += (float)row[j];
        if (sinks) sum += (float)exp((double)(float)rd(D, sk - mx_all));
        sum_s = sum;
    }
    __syncthreads();
    const float sum = sum_s;
    for (int j = j0 + tid; j <= i; j += blockDim.x)
        row[j] = rd(D, (double)((in_smem ? ex[j - j0] : (float)row[j]) / sum));
}

extern "C" void GPU_FN(softmax_causal)(gk_ctx *c, double *s, int heads, int Tq, int Tk, int q0, double scale,
                                       int window, int D, const double *sinks) {
    const int in_smem = Tk <= SOFTMAX_MAX_SMEM;
    k_softmax_causal<<<heads * Tq, SOFTMAX_THREADS, in_smem ? (size_t)Tk * sizeof(float) : 0, c->stream>>>(
        s, Tq, Tk, q0, scale, window, D, in_smem, sinks);
}

__global__ static void k_act_mul(double *g, const double *u, size_t n, int act, int D) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = rd(D, rd(D, act_apply(act, g[i])) * u[i]);
}

extern "C" void GPU_FN(act_mul)(gk_ctx *c, double *g, const double *u, size_t n, int act, int D) {
    if (n) k_act_mul<<<blocks_for(n), THREADS, 0, c->stream>>>(g, u, n, act, D);
}

/* The expert of grouped row r: the last e with offsets[e] <= r (offsets[E] is the row count) */
__device__ static int expert_of(const int *offsets, int E, int r) {
    int lo = 0, hi = E;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (offsets[mid] <= r) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* v + b as PyTorch's add_ of a bias into a D tensor: the fp32 sum rounded to D (experts/experts.c's add_rounded) */
__device__ static double add_rounded(int D, double v, double b) {
    return D == GK_F64 ? v + b : rd(D, (double)(float)(v + b));
}

/* experts/experts.c's clamped_swiglu on D values, the Python float scalars as fp32 */
__device__ static double clamped_swiglu(int D, double g, double u, double alpha, double limit) {
    const double lim = (double)(float)limit, al = (double)(float)alpha;
    g = rd(D, fmin(g, lim));
    u = rd(D, fmax(fmin(u, lim), -lim));
    const double ga = rd(D, (double)(float)(g * al));
    const double glu = rd(D, g * rd(D, 1.0 / (1.0 + exp(-ga))));
    return rd(D, rd(D, u + 1.0) * glu);
}

__global__ static void k_glu_clamped(const double *gu, double *h, int I, const int *offsets, int E, const double *b,
                                     double alpha, double limit, int D) {
    const int r = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= I) return;
    const size_t e = offsets ? (size_t)expert_of(offsets, E, r) : 0, at = (size_t)r * 2 * I + 2 * (size_t)i;
    const size_t bat = e * 2 * I + 2 * (size_t)i;
    const double gv = add_rounded(D, gu[at], b[bat]), uv = add_rounded(D, gu[at + 1], b[bat + 1]);
    h[(size_t)r * I + i] = clamped_swiglu(D, gv, uv, alpha, limit);
}

extern "C" void GPU_FN(glu_clamped)(gk_ctx *c, const double *gu, double *h, int R, int I, const int *offsets, int E,
                                    const double *bias, double alpha, double limit, int D) {
    if (R > 0 && I > 0)
        k_glu_clamped<<<row_grid((size_t)R, (size_t)I, 1), THREADS, 0, c->stream>>>(gu, h, I, offsets, E, bias, alpha,
                                                                                     limit, D);
}

__global__ static void k_expert_bias(double *y, int N, const int *offsets, int E, const double *bias, int D) {
    const int r = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= N) return;
    const size_t e = offsets ? (size_t)expert_of(offsets, E, r) : 0, at = (size_t)r * N + j;
    y[at] = add_rounded(D, y[at], bias[e * N + j]);
}

extern "C" void GPU_FN(expert_bias)(gk_ctx *c, double *y, int R, int N, const int *offsets, int E, const double *bias,
                                    int D) {
    if (R > 0 && N > 0)
        k_expert_bias<<<row_grid((size_t)R, (size_t)N, 1), THREADS, 0, c->stream>>>(y, N, offsets, E, bias, D);
}

/* --------------------------------------------------------------- routing */

/* A warp (CUDA) or wavefront (HIP) and its lane exchanges. */
#if defined(GPU_HIP)
#define WARP 64
#define BALLOT(p) __ballot(p)
#define SHFL(v, src) __shfl(v, src)
#define SHFL_XOR(v, d) __shfl_xor(v, d)
#else
#define WARP 32
#define BALLOT(p) __ballot_sync(0xffffffffu, p)
#define SHFL(v, src) __shfl_sync(0xffffffffu, v, src)
#define SHFL_XOR(v, d) __shfl_xor_sync(0xffffffffu, v, d)
#endif

__device__ static bool ranks_before(double a, int ia, double b, int ib) {
    if (isnan(a) != isnan(b)) return isnan(a);   /* NaN ranks highest, as in torch.topk */
    return a > b || (a == b && ia < ib);
}

#define MAX_TOPK 64

/* One warp (a block of WARP threads) per token: router/router.c's fp32 path. The maximum, the
 * exponentials, the divisions and the ranks run across the lanes; the two
 * fp32 sums run on one lane in the CPU's order. An expert's rank is the
 * number of experts that rank before it (NaN highest, then larger, then the
 * lower index; NaNs among themselves by index, as the CPU's stable
 * insertion keeps them), so the top k land where the CPU's sorted list has
 * them. */
__global__ static void k_route(const double *logits, double *probs, int T, int E, int K, int norm, int wdt,
                               uint16_t *ids_out, double *w_out, const uint16_t *rep_ids, const double *rep_w,
                               int n_rep) {
    (void)T;   /* the grid's x dimension: blockIdx.x is the position */
    extern __shared__ float p[];   /* E probabilities, then the top k's ids */
    const int lane = threadIdx.x, t = blockIdx.x;
    uint16_t *ids = (uint16_t *)(p + E);
    const double *x = logits + (size_t)t * E;
    double *pt = probs + (size_t)t * E;
    double m = -INFINITY;
    for (int i = lane; i < E; i += WARP) m = x[i] > m ? x[i] : m;
    for (int d = WARP / 2; d > 0; d /= 2) {   /* a maximum: any order gives the same */
        const double o = SHFL_XOR(m, d);
        m = o > m ? o : m;
    }
    for (int i = lane; i < E; i += WARP) p[i] = (float)exp((double)((float)x[i] - (float)m));
    __syncthreads();
    float s = 0;
    if (lane == 0) s = seq_sum(p, E);
    s = SHFL(s, 0);
    for (int i = lane; i < E; i += WARP) {
        p[i] = p[i] / s;
        pt[i] = p[i];
    }
    __syncthreads();
    for (int i = lane; i < E; i += WARP) {
        const double a = p[i];
        int rank = 0;
        for (int j = 0; j < E && rank < K; j++)
            rank += j != i && (ranks_before(p[j], j, a, i) || (!ranks_before(a, i, p[j], j) && j < i));
        if (rank < K) ids[rank] = (uint16_t)i;
    }
    __syncthreads();
    const bool replayed = t < n_rep;   /* routing replay: another run's experts, in its rank order */
    if (replayed)
        for (int i = lane; i < K; i += WARP) ids[i] = rep_ids[(size_t)t * K + i];
    __syncthreads();
    float sk = 0;
    if (lane == 0)
        for (int i = 0; i < K; i++) sk += p[ids[i]];
    sk = SHFL(sk, 0);
    for (int i = lane; i < K; i += WARP) {
        const float pi = p[ids[i]];
        const double wi = replayed && rep_w ? rep_w[(size_t)t * K + i] : norm ? (double)(pi / sk) : (double)pi;
        ids_out[(size_t)t * K + i] = ids[i];
        w_out[(size_t)t * K + i] = rd(wdt, wi);
    }
}

extern "C" void GPU_FN(route)(gk_ctx *c, const double *logits, double *probs, int T, int E, int K, int norm, int wdt,
                              uint16_t *ids, double *w, const uint16_t *rep_ids, const double *rep_w, int n_rep) {
    const size_t smem = (size_t)E * sizeof(float) + MAX_TOPK * sizeof(uint16_t);
    if (T) k_route<<<T, WARP, smem, c->stream>>>(logits, probs, T, E, K, norm, wdt, ids, w, rep_ids, rep_w, n_rep);
}

/* ---------------------------------------------------- grouped, scaled routers */

/* router/router.c's mf_topk: insertion into a sorted list of k (canonical order: NaN first, then larger, then the
 * lower index) */
__device__ static void topk_insert(const double *s, int n, int k, uint16_t *ids) {
    int len = 0;
    for (int i = 0; i < n; i++) {
        int pos = len;
        while (pos > 0 && ranks_before(s[i], i, s[ids[pos - 1]], ids[pos - 1])) pos--;
        if (pos >= k) continue;
        const int end = len < k ? len : k - 1;
        for (int j = end; j > pos; j--) ids[j] = ids[j - 1];
        ids[pos] = (uint16_t)i;
        if (len < k) len++;
    }
}

__device__ static double om32(double x) { return (double)(float)x; }

/* router/router.c's mf_route_weights of the grouped kinds, opmath fp32 */
__device__ static void grouped_weights(const gk_route_spec *sp, const double *p, const uint16_t *ids, double *w) {
    const bool norm = sp->kind == GK_ROUTE_SIGMOID_GROUP && sp->norm;
    double s = 0;
    for (int i = 0; i < sp->K; i++) s = om32(s + p[ids[i]]);
    const double den = om32(s + om32(1e-20)), scale = om32(sp->scale);
    for (int i = 0; i < sp->K; i++) {
        const double wi = norm ? om32(p[ids[i]] / den) : p[ids[i]];
        w[i] = rd(sp->wdt, om32(wi * scale));
    }
}

#define MAX_GROUPS 64

/* router/router.c's mf_route_weights_logits, opmath fp32: softmax over the k chosen experts' logits (the max
 * subtracted, the fp32 sum in rank order), each weight rounded to wdt */
__device__ static void logit_weights(const double *x, const uint16_t *ids, int K, int wdt, double *w) {
    double m = -INFINITY;
    for (int i = 0; i < K; i++) m = x[ids[i]] > m ? x[ids[i]] : m;
    float sum = 0;
    for (int i = 0; i < K; i++) {
        const float e = (float)exp((double)((float)x[ids[i]] - (float)m));
        w[i] = e;
        sum += e;
    }
    for (int i = 0; i < K; i++) w[i] = rd(wdt, (double)((float)w[i] / sum));
}

/* One thread per token, the CPU's sequential code (router/router.c's mf_route for these kinds) line for line:
 * the scores, the selection row, the groups, the top k, the weights. */
__global__ static void k_route_grouped(gk_route_spec sp, const double *logits, double *probs, double *sel, int T,
                                       uint16_t *ids_out, double *w_out, const uint16_t *rep_ids, const double *rep_w,
                                       int n_rep) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int E = sp.E, K = sp.K;
    const double *x = logits + (size_t)t * E;
    double *p = probs + (size_t)t * E, *s = sel + (size_t)t * E;
    if (sp.kind == GK_ROUTE_TOPK_SOFTMAX) {   /* gpt-oss: the top k of the (biased) logits, a softmax over those k */
        uint16_t ids[MAX_TOPK];
        double w[MAX_TOPK];
        for (int e = 0; e < E; e++) s[e] = x[e];
        topk_insert(x, E, K, ids);
        if (t < n_rep)
            for (int i = 0; i < K; i++) ids[i] = rep_ids[(size_t)t * K + i];
        if (t < n_rep && rep_w)
            for (int i = 0; i < K; i++) w[i] = rd(sp.wdt, rep_w[(size_t)t * K + i]);
        else
            logit_weights(x, ids, K, sp.wdt, w);
        for (int i = 0; i < K; i++) {
            ids_out[(size_t)t * K + i] = ids[i];
            w_out[(size_t)t * K + i] = w[i];
        }
        return;
    }
    if (sp.kind == GK_ROUTE_SIGMOID_GROUP) {
        for (int e = 0; e < E; e++) p[e] = om32(1.0 / (1.0 + exp(-om32(x[e]))));
    } else {   /* mf_softmax, fp32 */
        double m = -INFINITY;
        for (int e = 0; e < E; e++) m = x[e] > m ? x[e] : m;
        float sum = 0;
        for (int e = 0; e < E; e++) {
            const float ev = (float)exp((double)((float)x[e] - (float)m));
            p[e] = ev;
            sum += ev;
        }
        for (int e = 0; e < E; e++) p[e] = (float)p[e] / sum;
    }
    for (int e = 0; e < E; e++) s[e] = sp.kind == GK_ROUTE_SIGMOID_GROUP ? om32(p[e] + (sp.bias ? sp.bias[e] : 0)) : p[e];
    const int G = sp.n_group;
    if (G > 1 && (sp.kind == GK_ROUTE_SIGMOID_GROUP || sp.group_limited)) {
        const int per = E / G;
        double gs[MAX_GROUPS];
        for (int g = 0; g < G; g++) {
            const double *v = s + (size_t)g * per;
            if (sp.kind == GK_ROUTE_SIGMOID_GROUP) {
                uint16_t two[2];
                topk_insert(v, per, 2, two);
                gs[g] = om32(v[two[0]] + v[two[1]]);
            } else {
                uint16_t one;
                topk_insert(v, per, 1, &one);
                gs[g] = v[one];
            }
        }
        uint16_t keep[MAX_GROUPS];
        topk_insert(gs, G, sp.topk_group, keep);
        bool kept[MAX_GROUPS];
        for (int g = 0; g < G; g++) kept[g] = false;
        for (int i = 0; i < sp.topk_group; i++) kept[keep[i]] = true;
        const double masked = sp.kind == GK_ROUTE_SIGMOID_GROUP ? -INFINITY : 0.0;
        for (int e = 0; e < E; e++)
            if (!kept[e / per]) s[e] = masked;
    }
    uint16_t ids[MAX_TOPK + 1];
    double w[MAX_TOPK];
    const int kk = K + 1 <= E ? K + 1 : K;
    topk_insert(s, E, kk, ids);
    if (t < n_rep) {   /* routing replay: another run's experts, in its rank order; its weights or this router's */
        for (int i = 0; i < K; i++) ids[i] = rep_ids[(size_t)t * K + i];
        if (rep_w)
            for (int i = 0; i < K; i++) w[i] = rd(sp.wdt, rep_w[(size_t)t * K + i]);
        else
            grouped_weights(&sp, p, ids, w);
    } else {
        grouped_weights(&sp, p, ids, w);
    }
    for (int i = 0; i < K; i++) {
        ids_out[(size_t)t * K + i] = ids[i];
        w_out[(size_t)t * K + i] = w[i];
    }
}

extern "C" void GPU_FN(route_grouped)(gk_ctx *c, const gk_route_spec *spec, const double *logits, double *probs,
                                      double *sel, int T, uint16_t *ids, double *w, const uint16_t *rep_ids,
                                      const double *rep_w, int n_rep) {
    if (T > 0)
        k_route_grouped<<<(unsigned)((T + 63) / 64), 64, 0, c->stream>>>(*spec, logits, probs, sel, T, ids, w, rep_ids,
                                                                         rep_w, n_rep);
}

/* Rows grouped by expert, tokens ascending within one (experts/experts.c's
 * order): one warp (wavefront) per expert walks the (token, slot) list in
 * order a warp-width at a time; a ballot gives each match its rank. */

/* The walks read DISPATCH_AHEAD warp-widths of ids before the first ballot:
 * one load's latency per step instead of one per warp-width. */
#define DISPATCH_AHEAD 8
#define NO_EXPERT 0xffffu

__global__ static void k_expert_counts(const uint16_t *ids, int R, int *counts) {
    const int e = blockIdx.x, lane = threadIdx.x;
    int n = 0;
    for (int i0 = 0; i0 < R; i0 += DISPATCH_AHEAD * WARP) {
        uint16_t v[DISPATCH_AHEAD];
        for (int u = 0; u < DISPATCH_AHEAD; u++) {
            const int i = i0 + u * WARP + lane;
            v[u] = i < R ? ids[i] : NO_EXPERT;
        }
        for (int u = 0; u < DISPATCH_AHEAD; u++) n += __popcll((unsigned long long)BALLOT(v[u] == e));
    }
    if (lane == 0) counts[e] = n;
}

__global__ static void k_expert_rows(const uint16_t *ids, int R, int E, const int *counts, int *offset, int *token,
                                     int *row_of, int K) {
    const int e = blockIdx.x, lane = threadIdx.x;
    int r = 0;   /* rows of the experts before e: lanes add a share each */
    for (int x = lane; x < e; x += WARP) r += counts[x];
    for (int d = WARP / 2; d > 0; d /= 2) r += SHFL_XOR(r, d);
    if (lane == 0) {
        offset[e] = r;
        if (e == E - 1) offset[E] = r + counts[e];
    }
    for (int i0 = 0; i0 < R; i0 += DISPATCH_AHEAD * WARP) {
        uint16_t v[DISPATCH_AHEAD];
        for (int u = 0; u < DISPATCH_AHEAD; u++) {
            const int i = i0 + u * WARP + lane;
            v[u] = i < R ? ids[i] : NO_EXPERT;
        }
        for (int u = 0; u < DISPATCH_AHEAD; u++) {
            const int i = i0 + u * WARP + lane;
            const bool mine = v[u] == e;
            const unsigned long long m = (unsigned long long)BALLOT(mine);
            if (mine) {
                const int at = r + __popcll(m & ((1ull << lane) - 1));
                token[at] = i / K;
                row_of[i] = at;
            }
            r += __popcll(m);
        }
    }
}

extern "C" void GPU_FN(dispatch)(gk_ctx *c, const uint16_t *ids, int T, int K, int E, int *offset, int *token,
                                 int *row_of) {
    /* offset holds 2E + 1 ints: the offsets, then the counts */
    int *counts = offset + E + 1;
    k_expert_counts<<<E, WARP, 0, c->stream>>>(ids, T * K, counts);
    k_expert_rows<<<E, WARP, 0, c->stream>>>(ids, T * K, E, counts, offset, token, row_of, K);
}

__global__ static void k_gather(void *op, int fmt, int Kp, const double *x, int H, const int *token) {
    const int r = blockIdx.x, col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= Kp) return;
    put_operand(op, fmt, (size_t)r * Kp + col, col < H ? x[(size_t)token[r] * H + col] : 0.0);
}

extern "C" void GPU_FN(gather)(gk_ctx *c, void *op, int fmt, int Kp, const double *x, int H, const int *token,
                               int R) {
    if (R > 0 && Kp > 0) k_gather<<<row_grid(R, Kp, 1), THREADS, 0, c->stream>>>(op, fmt, Kp, x, H, token);
}

__global__ static void k_combine(double *out, const double *y, int T, int H, int K, const int *row_of, const double *w,
                                 int prod, int sum, int outdt) {
    (void)T;   /* the grid's x dimension: blockIdx.x is the position */
    const int t = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
    if (h >= H) return;
    const size_t i = (size_t)t * H + h;
    double acc = 0;
    for (int s = 0; s < K; s++) {
        double p = rd(prod, y[(size_t)row_of[t * K + s] * H + h] * w[t * K + s]);
        acc = rd(sum, acc + p);
    }
    out[i] = rd(outdt, acc);
}

extern "C" void GPU_FN(combine)(gk_ctx *c, double *out, const double *y, int T, int H, int K, const int *row_of,
                                const double *w, int prod, int sum, int outdt) {
    if (T > 0 && H > 0)
        k_combine<<<row_grid(T, H, 1), THREADS, 0, c->stream>>>(out, y, T, H, K, row_of, w, prod, sum, outdt);
}

__global__ static void k_shared_add(double *out, const double *s, double *g, int T, int H, int D) {
    (void)T;   /* the grid's x dimension: blockIdx.x is the position */
    const int t = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
    if (h >= H) return;
    const size_t i = (size_t)t * H + h;
    double gt = rd(D, 1.0 / (1.0 + exp(-g[t])));
    out[i] = rd(D, out[i] + rd(D, gt * s[i]));
}

__global__ static void k_sigmoid_gate(double *g, int T, int D) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T) g[t] = rd(D, 1.0 / (1.0 + exp(-g[t])));
}

extern "C" void GPU_FN(shared_add)(gk_ctx *c, double *out, const double *s, double *g, int T, int H, int D) {
    if (T > 0 && H > 0) k_shared_add<<<row_grid(T, H, 1), THREADS, 0, c->stream>>>(out, s, g, T, H, D);
    k_sigmoid_gate<<<blocks_for((size_t)T), THREADS, 0, c->stream>>>(g, T, D);
}
