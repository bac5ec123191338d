/* Device helpers shared by the kernel sources (kernels.cu, gemm.cu): the
 * context, and the CPU's rounding formulas (core/dtype.c) as device code.
 * Included by .cu files only. */
#ifndef MF_GPU_DEVICE_H
#define MF_GPU_DEVICE_H

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
    /* copies that leave behind the work without holding it up (the routing
     * of each layer): a second stream, an event fencing it behind the main
     * one, and an event per mark */
    gpuStream_t side;
    gpuEvent_t fence;
    gpuEvent_t *marks;
    int n_marks;
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

/* The MLP's activation, experts/experts.c's formulas in double. */
__device__ static double act_apply(int act, double x) {
    switch (act) {
    case GK_ACT_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case GK_ACT_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    default: return x / (1.0 + exp(-x));
    }
}

/* ------------------------------------------------------------ launches */

#define THREADS 256
static unsigned blocks_for(size_t n) { return (unsigned)((n + THREADS - 1) / THREADS); }

/* A [z][rows][cols] launch with the row and z on the grid: a thread's row
 * and column come without a 64-bit division (tens of instructions each). */
static dim3 row_grid(size_t rows, size_t cols, unsigned z) {
    return dim3((unsigned)rows, (unsigned)((cols + THREADS - 1) / THREADS), z);
}

__device__ static void put_operand(void *dst, int fmt, size_t i, double v) {
    if (fmt == GK_F32) ((float *)dst)[i] = (float)v;
    else if (fmt == GK_BF16) ((uint16_t *)dst)[i] = bf16_bits(v);
    else ((uint16_t *)dst)[i] = f16_bits(v);
}

#endif
