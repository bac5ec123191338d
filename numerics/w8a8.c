/* FP8 weights times quantised activations: DeepSeek-V3's recipe (arXiv:2412.19437, §3.3) as DeepGEMM's sm90
 * kernels and vLLM's W8A8 block-FP8 linear run it on Hopper.
 *
 * The activations are quantised per token per block of the weight's k (1 x 128 for DeepSeek-V3) with
 * vLLM's per_token_group_quant_fp8 rule; each output's K is cut at the weight's block boundaries; within a
 * block the fp8 instruction (Hopper: wgmma.m64n8k32.f32.e4m3.e4m3, 13 fraction bits) runs in a chain from a
 * zero accumulator, four instructions for 128 values; at the end of the block its fp32 partial is promoted:
 * multiplied by the product of the two blocks' scales and added into the fp32 main accumulator (one fma, as
 * nvcc contracts DeepGEMM's `final_accum += scale * accum`). The exact instruction model only. */
#include "mf_numerics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

float mf_w8a8_quant(const float *x, int n, uint8_t *q) {
    float amax = 0;
    for (int i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;   /* a NaN is passed over */
    const float s = (amax > MF_W8A8_EPS ? amax : MF_W8A8_EPS) / 448.0f;
    for (int i = 0; i < n; i++) q[i] = mf_f32_to_f8e4m3_sat(x[i] / s);
    return s;
}

static float bits_f32(uint64_t b) {
    const uint32_t u = (uint32_t)b;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void mf_w8a8_gemm(const mf_kschedule *fp8, int M, const float *a, size_t lda, const mf_mat *w, float *c, size_t ldc,
                  int threads) {
    const mf_mma_instr *I = &fp8->instr;
    const int N = w->n, K = w->k, bk = w->q.bk, nb = (K + bk - 1) / bk, ik = I->k;
    const int span = (bk + ik - 1) / ik * ik;   /* a block's codes, padded with zeros to whole instructions */
    const size_t row = (size_t)nb * span;
    if (M <= 0 || N <= 0) return;
    /* the activations, row by row: codes [M, nb x span] and scales [M, nb] */
    uint64_t *qa = mf_xcalloc((size_t)M * row, sizeof(uint64_t));
    float *sa = mf_xmalloc((size_t)M * nb * sizeof(float));
    uint8_t *q8 = mf_xmalloc((size_t)bk);
    for (int i = 0; i < M; i++)
        for (int b = 0; b < nb; b++) {
            const int k0 = b * bk, kc = K - k0 < bk ? K - k0 : bk;
            sa[(size_t)i * nb + b] = mf_w8a8_quant(a + (size_t)i * lda + k0, kc, q8);
            for (int kk = 0; kk < kc; kk++) qa[(size_t)i * row + (size_t)b * span + kk] = q8[kk];
        }
    free(q8);
    const uint8_t *codes = w->data;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        uint64_t *qw = mf_xcalloc(row, sizeof(uint64_t));
        float *sw = mf_xmalloc((size_t)nb * sizeof(float));
#pragma omp for schedule(static)
        for (int j = 0; j < N; j++) {
            for (int b = 0; b < nb; b++) {
                const int k0 = b * bk, kc = K - k0 < bk ? K - k0 : bk;
                for (int kk = 0; kk < kc; kk++) qw[(size_t)b * span + kk] = codes[(size_t)j * w->rs + (size_t)(k0 + kk) * w->cs];
                sw[b] = (float)mf_load_as_f64(w->q.data, w->q.dtype, (size_t)(j / w->q.bn) * w->q.rs + (size_t)b);
            }
            for (int i = 0; i < M; i++) {
                const uint64_t *qi = qa + (size_t)i * row;
                float acc = 0;
                for (int b = 0; b < nb; b++) {
                    uint64_t p = 0;   /* +0: the chain's first instruction adds nothing (wgmma's scale-d = 0) */
                    for (int t = 0; t < span; t += ik)
                        p = mf_mma_dot(I, qi + (size_t)b * span + t, qw + (size_t)b * span + t, 1, p);
                    acc = fmaf(bits_f32(p), sa[(size_t)i * nb + b] * sw[b], acc);
                }
                c[(size_t)i * ldc + j] = acc;
            }
        }
        free(qw);
        free(sw);
    }
    free(qa);
    free(sa);
}
