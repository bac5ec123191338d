/* Emulated GEMM: C[M, N] = A[M, K] . B[K, N] + C0 computed as a chain of one
 * matrix instruction over K, under a declared K-schedule:
 *  - split: K is cut into `split` contiguous ranges (split-K), each its own chain;
 *  - acc:   within a range, k-steps go round-robin to `acc` independent
 *           accumulators (the first starts from C0 in range 0, the others from 0);
 *  - reduce: accumulators, then ranges, are combined with fp32 additions in
 *           order (MF_REDUCE_SEQ) or as a pairwise tree (MF_REDUCE_TREE).
 * K is padded with zeros to a multiple of the instruction's k. */
#include "mf_numerics.h"

#include <stdlib.h>
#include <string.h>

static float bits_to_f32(uint64_t u) {
    uint32_t v = (uint32_t)u;
    float f;
    memcpy(&f, &v, 4);
    return f;
}

static uint64_t f32_to_bits(float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    return v;
}

static float reduce(const float *v, int n, mf_reduce how) {
    if (n == 1) return v[0];
    if (how == MF_REDUCE_TREE) {
        int h = n / 2;
        return reduce(v, h, how) + reduce(v + h, n - h, how);
    }
    float s = v[0];
    for (int i = 1; i < n; i++) s += v[i];
    return s;
}

int mf_kschedule_check(const mf_kschedule *s, int K, mf_error *err) {
    const int k = s->instr.k;
    if (s->acc < 1 || s->split < 1) return mf_fail(err, MF_EINVAL, "schedule: acc and split must be at least 1");
    if (s->instr.c_fmt != MF_FMT_F32) return mf_fail(err, MF_EUNSUPPORTED, "schedule: %s does not accumulate in fp32", s->instr.name);
    int steps = (K + k - 1) / k;
    if (steps % s->split) return mf_fail(err, MF_EINVAL, "schedule: %d k-steps of %s do not split %d ways", steps, s->instr.name, s->split);
    return MF_OK;
}

void mf_emu_gemm(const mf_kschedule *s, int M, int N, int K, const uint64_t *A, const uint64_t *B, const uint64_t *C0,
                 uint64_t *C, int threads) {
    const mf_mma_instr *I = &s->instr;
    const int k = I->k, steps = (K + k - 1) / k, per_range = steps / s->split, nacc = s->acc;
    const int Kp = steps * k;
    (void)threads;
#pragma omp parallel num_threads(threads) if (threads > 1 && (double)M * N * K > 65536)
    {
        uint64_t *a = calloc((size_t)Kp, 8), *b = calloc((size_t)Kp, 8);
        float *accs = malloc(sizeof(float) * (size_t)nacc), *ranges = malloc(sizeof(float) * (size_t)s->split);
#pragma omp for schedule(static)
        for (int i = 0; i < M; i++) {
            memcpy(a, A + (size_t)i * K, (size_t)K * 8);
            for (int j = 0; j < N; j++) {
                for (int kk = 0; kk < K; kk++) b[kk] = B[(size_t)kk * N + j];
                uint64_t c0 = C0 ? C0[(size_t)i * N + j] : 0;
                for (int r = 0; r < s->split; r++) {
                    uint64_t acc[nacc];
                    for (int q = 0; q < nacc; q++) acc[q] = (r == 0 && q == 0) ? c0 : 0;
                    for (int t = 0; t < per_range; t++) {
                        int step = r * per_range + t;
                        uint64_t *dst = &acc[t % nacc];
                        *dst = mf_mma_dot(I, a + (size_t)step * k, b + (size_t)step * k, 1, *dst);
                    }
                    for (int q = 0; q < nacc; q++) accs[q] = bits_to_f32(acc[q]);
                    ranges[r] = reduce(accs, nacc, s->reduce);
                }
                C[(size_t)i * N + j] = f32_to_bits(reduce(ranges, s->split, s->reduce));
            }
        }
        free(a);
        free(b);
        free(accs);
        free(ranges);
    }
}
