/* ctypes entry point for tools/cublas_vs_emu.py: one emulated GEMM under a
 * K-schedule, bf16 operands as uint16 bit patterns, fp32 result bits.
 * Built with numerics/mma.c, emu_gemm.c, emu_fast.c, core/status.c and
 * core/dtype.c only (no jansson / xxhash / lzma needed). */
#include "mf_numerics.h"

#include <stdlib.h>

/* zero_rule: 1 sets instr.zero_products_excluded (the H200's measured
 * behaviour), 0 keeps the MMA-Sim model. Returns 0, or a negative MF_E* code
 * with the message written to stderr. */
int emu(const char *arch, const char *instr, int acc, int split, int reduce, int zero_rule, int M, int N, int K,
        const uint16_t *A, const uint16_t *B, uint32_t *C, int threads) {
    mf_error err = {0};
    mf_kschedule s = {0};
    if (mf_mma_lookup(&s.instr, arch, instr, &err)) {
        fprintf(stderr, "emu: %s\n", err.msg);
        return err.code;
    }
    s.instr.zero_products_excluded = zero_rule != 0;
    s.acc = acc;
    s.split = split;
    s.reduce = reduce ? MF_REDUCE_TREE : MF_REDUCE_SEQ;
    if (mf_kschedule_check(&s, K, &err)) {
        fprintf(stderr, "emu: %s\n", err.msg);
        return err.code;
    }
    uint64_t *a = malloc(sizeof *a * (size_t)M * K), *b = malloc(sizeof *b * (size_t)K * N),
             *c = malloc(sizeof *c * (size_t)M * N);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return MF_ENOMEM;
    }
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = A[i];
    for (size_t i = 0; i < (size_t)K * N; i++) b[i] = B[i];
    mf_emu_gemm(&s, M, N, K, a, b, NULL, c, threads);
    for (size_t i = 0; i < (size_t)M * N; i++) C[i] = (uint32_t)c[i];
    free(a), free(b), free(c);
    return 0;
}
