/* Device helpers shared by the kernel sources (kernels.cu, gemm.cu): the
 * context, rounding (core's, mf_core.h), the activations, launch shapes.
 * Included by .cu files only. */
#ifndef MF_GPU_DEVICE_H
#define MF_GPU_DEVICE_H

#include "gpu_port.h"
#include "gpu_api.h"
#include "mf_core.h"

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
    gpuEvent_t slots[GK_SLOTS];   /* weight upload: the copies out of each pinned staging slot */
    int device;
#if defined(GPU_CUDA)
    cublasHandle_t blas;
#endif
};

/* ------------------------------------------------------------ rounding */

/* x as a value of dtype dt: core's own rounding (mf_core.h), compiled for the device. */
[[maybe_unused]] __device__ static double rd(int dt, double x) {
    switch (dt) {
    case GK_F32: return mf_round_f32(x);
    case GK_BF16: return mf_round_bf16(x);
    case GK_F16: return mf_round_f16(x);
    default: return x;
    }
}

/* The MLP's activation, experts/experts.c's formulas in double. */
[[maybe_unused]] __device__ static double act_apply(int act, double x) {
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

/* Element i of a buffer of dtype dt, widened (exact). */
[[maybe_unused]] __device__ static double get_value(const void *src, int dt, size_t i) {
    switch (dt) {
    case GK_F64: return ((const double *)src)[i];
    case GK_F32: return ((const float *)src)[i];
    case GK_BF16: return mf_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return mf_f16_to_f32(((const uint16_t *)src)[i]);
    }
}

[[maybe_unused]] __device__ static void put_operand(void *dst, int fmt, size_t i, double v) {
    if (fmt == GK_F32) ((float *)dst)[i] = (float)v;
    else if (fmt == GK_BF16) ((uint16_t *)dst)[i] = mf_f64_to_bf16(v);
    else ((uint16_t *)dst)[i] = mf_f64_to_f16(v);
}

#endif
