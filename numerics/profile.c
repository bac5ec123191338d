/* Numerics profiles: how every matrix product of a model is carried out.
 *   fp64              every product in double (the reference; goes with --precision fp64)
 *   native            the CPU's own fp32 fma chains (mf_gemm_f32); on a GPU, cuBLAS
 *   fixed             GPUs only: our mma.sync kernel, one k16 chain per output
 *   emu:ARCH[:INSTR][:acc=N][:split=N][:tile=N][:reduce=seq|tree]
 *                     a vendor's matrix instruction, bit for bit, chained over K under
 *                     the schedule; ARCH volta, ampere, hopper, blackwell, rtxblackwell,
 *                     cdna2, cdna3, cdna4. :fp8=w8a8 (emu:hopper) multiplies FP8 weights by
 *                     activations quantised to e4m3 (numerics/w8a8.c) instead of widening them.
 * bf16 and fp16 operands go through the instruction for their type; fp32
 * operands go through a plain fp32 fma chain on every architecture (cuBLAS
 * SGEMM without TF32 on CUDA cores, rocBLAS's f32 MFMA, which is an fma chain).
 * emu:hopper follows the H200 where it differs from MMA-Sim: products with a
 * zero factor do not count for the largest exponent. The Blackwell profiles
 * follow MMA-Sim (no Blackwell was measured). A GPU library's bf16 GEMM on
 * sm_100 is built on tcgen05.mma kind::f16 (k16), on sm_120 (no tcgen05,
 * no wgmma) on mma.sync m16n8k16, and on MI350 on the k-doubled MFMA
 * v_mfma_f32_32x32x16_bf16 (what compiled gfx950 kernels issue). */
#include "mf_numerics.h"

#include <stdlib.h>
#include <string.h>

/* fp8 and mxfp4: the instruction a product of e4m3 operands, and one of MXFP4 (e2m1 with ue8m0 block-32
 * scales) operands, goes through on that architecture, or NULL where it has none (the product is then
 * widened to bf16 by whoever runs it, as vLLM does for MXFP4 on Hopper). validation: NULL when the
 * models were checked against MMA-Sim or hardware; else what they rest on. */
static const struct {
    const char *key, *arch, *bf16, *f16, *fp8, *mxf4, *validation;
} archs[] = {
    {"volta", "Volta", NULL, "mma.m8n8k4.f32.f16.f16.f32", NULL, NULL, NULL},
    {"ampere", "Ampere", "mma.m16n8k16.f32.bf16.bf16.f32", "mma.m16n8k16.f32.f16.f16.f32", NULL, NULL, NULL},
    {"hopper", "Hopper", "wgmma.m64n8k16.f32.bf16.bf16", "wgmma.m64n8k16.f32.f16.f16", "wgmma.m64n8k32.f32.e4m3.e4m3",
     NULL, NULL},
    {"blackwell", "Blackwell", "tcgen05.mma.m64n8k16.f32.bf16.bf16", "tcgen05.mma.m64n8k16.f32.f16.f16",
     "tcgen05.mma.m64n8k32.f32.e4m3.e4m3", "tcgen05.mma.m128n8k64.block32.f32.e2m1.e2m1.ue8m0", NULL},
    {"rtxblackwell", "RTX Blackwell", "mma.m16n8k16.f32.bf16.bf16.f32", "mma.m16n8k16.f32.f16.f16.f32",
     "mma.m16n8k32.f32.e4m3.e4m3.f32", "mma.m16n8k64.block32.f32.e2m1.e2m1.f32.ue8m0", NULL},
    {"cdna2", "CDNA2", "mfma_f32_32x32x8bf16_1k", "mfma_f32_32x32x8f16", NULL, NULL,
     "not validated against a simulator or hardware: MMA-Sim does not run CDNA2's bf16/f16 MFMA"},
    {"cdna3", "CDNA3", "mfma_f32_32x32x8_bf16", "mfma_f32_32x32x8_f16", "mfma_f32_32x32x16_fp8_fp8", NULL, NULL},
    {"cdna4", "CDNA4", "mfma_f32_32x32x16_bf16", "mfma_f32_32x32x16_f16", "mfma_f32_32x32x16_fp8_fp8", NULL,
     "not validated against a simulator or hardware: CDNA3's arithmetic (AMD's CDNA4 descriptions state no other "
     "accumulation) on CDNA4's instructions, with its OCP fp8 formats"},
};
#define ARCH_LIST "volta, ampere, hopper, blackwell, rtxblackwell, cdna2, cdna3, cdna4"

int mf_numerics_parse(mf_numerics *n, const char *spec, mf_error *err) {
    memset(n, 0, sizeof *n);
    if (!strcmp(spec, "fp64")) {
        n->kind = MF_NUMERICS_FP64;
        snprintf(n->name, sizeof n->name, "fp64");
        return MF_OK;
    }
    if (!strcmp(spec, "native")) {
        n->kind = MF_NUMERICS_NATIVE;
        snprintf(n->name, sizeof n->name, "native");
        return MF_OK;
    }
    if (!strcmp(spec, "fixed")) {
        n->kind = MF_NUMERICS_FIXED;
        snprintf(n->name, sizeof n->name, "fixed");
        return MF_OK;
    }
    if (strncmp(spec, "emu:", 4))
        return mf_fail(err, MF_EINVAL, "unknown numerics \"%s\" (fp64, native, fixed, emu:ARCH with ARCH one of " ARCH_LIST ")",
                       spec);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec + 4);
    char *save = NULL, *arch = strtok_r(buf, ":", &save);
    int a = -1;
    for (size_t i = 0; arch && i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(arch, archs[i].key)) a = (int)i;
    if (a < 0) return mf_fail(err, MF_EINVAL, "numerics \"%s\": unknown architecture (" ARCH_LIST ")", spec);
    n->kind = MF_NUMERICS_EMU;
    snprintf(n->arch, sizeof n->arch, "%s", archs[a].key);
    n->validation = archs[a].validation;
    const char *instr = NULL;
    int acc = 1, split = 1, tile = 0;
    mf_reduce red = MF_REDUCE_SEQ;
    bool w8a8 = false;
    for (char *tok = strtok_r(NULL, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
        char *end;
        if (!strncmp(tok, "acc=", 4)) {
            acc = (int)strtol(tok + 4, &end, 10);
            if (*end || acc < 1 || acc > 64) return mf_fail(err, MF_EINVAL, "numerics \"%s\": acc takes 1..64", spec);
        } else if (!strncmp(tok, "split=", 6)) {
            split = (int)strtol(tok + 6, &end, 10);
            if (*end || split < 1 || split > 1024) return mf_fail(err, MF_EINVAL, "numerics \"%s\": split takes 1..1024", spec);
        } else if (!strncmp(tok, "tile=", 5)) {
            tile = (int)strtol(tok + 5, &end, 10);
            if (*end || tile < 1 || tile > 1 << 20) return mf_fail(err, MF_EINVAL, "numerics \"%s\": tile takes a K width", spec);
        } else if (!strcmp(tok, "reduce=seq")) {
            red = MF_REDUCE_SEQ;
        } else if (!strcmp(tok, "reduce=tree")) {
            red = MF_REDUCE_TREE;
        } else if (!strcmp(tok, "fp8=w8a8") || !strcmp(tok, "fp8=widen")) {
            w8a8 = !strcmp(tok, "fp8=w8a8");
        } else if (!strncmp(tok, "fp8=", 4)) {
            return mf_fail(err, MF_EINVAL, "numerics \"%s\": fp8 takes widen or w8a8", spec);
        } else if (!instr) {
            instr = tok;
        } else {
            return mf_fail(err, MF_EINVAL, "numerics \"%s\": unexpected \"%s\"", spec, tok);
        }
    }
    /* the instruction for each operand type: the default, or the one named (for its type) */
    const char *names[2] = {archs[a].bf16, archs[a].f16}, *fp8 = archs[a].fp8, *mxf4 = archs[a].mxf4;
    if (instr) {
        mf_mma_instr I;
        if (mf_mma_lookup(&I, archs[a].arch, instr, err)) return mf_fail_wrap(err, "numerics \"%s\"", spec);
        if (I.scaled && I.a_fmt == MF_FMT_E2M1 && I.b_fmt == MF_FMT_E2M1) mxf4 = instr;
        else if (I.scaled) return mf_fail(err, MF_EUNSUPPORTED, "numerics \"%s\": %s: of the block-scaled kinds a "
                                          "profile takes the e2m1 (MXFP4) ones", spec, instr);
        else if (I.a_fmt == MF_FMT_BF16) names[0] = instr;
        else if (I.a_fmt == MF_FMT_F16) names[1] = instr;
        else if (I.a_fmt == MF_FMT_E4M3 || I.a_fmt == MF_FMT_E5M2 || I.a_fmt == MF_FMT_E4M3FNUZ || I.a_fmt == MF_FMT_E5M2FNUZ)
            fp8 = instr;
        else return mf_fail(err, MF_EUNSUPPORTED, "numerics \"%s\": %s is not a bf16, f16, fp8 or mxf4 instruction", spec,
                            instr);
    }
    mf_kschedule *sched[2] = {&n->bf16, &n->f16};
    for (int t = 0; t < 2; t++) {
        n->has[t] = names[t] != NULL;
        if (!names[t]) continue;
        if (mf_mma_lookup(&sched[t]->instr, archs[a].arch, names[t], err)) return mf_fail_wrap(err, "numerics \"%s\"", spec);
        /* Hopper as the H200 computes (measured: tools/mma_probe.cu, tests/fixtures/mma) */
        sched[t]->instr.zero_products_excluded = !strcmp(archs[a].key, "hopper");
        sched[t]->acc = acc;
        sched[t]->split = split;
        sched[t]->tile = tile;
        if (mf_kschedule_check(sched[t], 0, err)) return mf_fail_wrap(err, "numerics \"%s\"", spec);
        sched[t]->reduce = red;
        if (sched[t]->instr.c_fmt != MF_FMT_F32)
            return mf_fail(err, MF_EUNSUPPORTED, "numerics \"%s\": %s does not accumulate in fp32", spec, names[t]);
    }
    /* fp8 and MXFP4 under the same schedule, where the architecture has them and the schedule fits them */
    const char *low[2] = {fp8, mxf4};
    mf_kschedule *lows[2] = {&n->fp8, &n->mxf4};
    bool *has_low[2] = {&n->has_fp8, &n->has_mxf4};
    for (int t = 0; t < 2; t++) {
        if (!low[t]) continue;
        mf_error ignored = {0};
        if (mf_mma_lookup(&lows[t]->instr, archs[a].arch, low[t], err)) return mf_fail_wrap(err, "numerics \"%s\"", spec);
        lows[t]->instr.zero_products_excluded = !strcmp(archs[a].key, "hopper");
        lows[t]->acc = acc;
        lows[t]->split = split;
        lows[t]->tile = tile;
        lows[t]->reduce = red;
        *has_low[t] = mf_kschedule_check(lows[t], 0, &ignored) == MF_OK;
    }
    /* fp8=w8a8: DeepSeek-V3's recipe, whose K order is its own (a chain per block of the weight's scales, then
     * the promotion), on the one architecture it is modelled for */
    if (w8a8) {
        if (!fp8)
            return mf_fail(err, MF_EUNSUPPORTED, "numerics \"%s\": fp8=w8a8: %s has no fp8 instruction", spec, archs[a].arch);
        if (strcmp(archs[a].key, "hopper"))
            return mf_fail(err, MF_EUNSUPPORTED, "numerics \"%s\": fp8=w8a8 models DeepSeek-V3's FP8 recipe on Hopper's "
                           "wgmma (emu:hopper); %s's FP8 GEMMs are not modelled", spec, archs[a].arch);
        if (acc != 1 || split != 1 || tile)
            return mf_fail(err, MF_EINVAL, "numerics \"%s\": fp8=w8a8 has its own K order (a chain per scale block, "
                           "then the promotion); it takes no acc, split or tile", spec);
        if (n->fp8.instr.a_fmt != MF_FMT_E4M3 || n->fp8.instr.b_fmt != MF_FMT_E4M3)
            return mf_fail(err, MF_EUNSUPPORTED, "numerics \"%s\": fp8=w8a8 multiplies e4m3 by e4m3; %s is not such an "
                           "instruction", spec, fp8);
        n->has_fp8 = true;
        n->fp8_products = MF_FP8_W8A8;
        /* validated: the instruction, its chains and this recipe's linear, quantiser included, match an H200
         * running them bit for bit (tests/fixtures/mma/README.md), so the manifest carries no numerics_validation */
    }
    /* canonical name: everything spelled out, so the manifest says exactly what ran */
    char tile_s[24] = "";
    if (tile) snprintf(tile_s, sizeof tile_s, ":tile=%d", tile);
    snprintf(n->name, sizeof n->name, "emu:%s:%s:acc=%d:split=%d%s:reduce=%s%s", archs[a].key,
             instr ? instr : (names[0] ? names[0] : names[1]), acc, split, tile_s, red == MF_REDUCE_TREE ? "tree" : "seq",
             w8a8 ? ":fp8=w8a8" : "");
    return MF_OK;
}

const mf_kschedule *mf_numerics_schedule(const mf_numerics *n, mf_dtype operands) {
    if (n->kind != MF_NUMERICS_EMU) return NULL;
    if (operands == MF_BF16 && n->has[0]) return &n->bf16;
    if (operands == MF_F16 && n->has[1]) return &n->f16;
    return NULL;
}

const mf_kschedule *mf_numerics_schedule_fmt(const mf_numerics *n, mf_fmt operands) {
    if (n->kind != MF_NUMERICS_EMU) return NULL;
    switch (operands) {
    case MF_FMT_BF16: return n->has[0] ? &n->bf16 : NULL;
    case MF_FMT_F16: return n->has[1] ? &n->f16 : NULL;
    case MF_FMT_E4M3:
    case MF_FMT_E5M2:
    case MF_FMT_E4M3FNUZ:
    case MF_FMT_E5M2FNUZ: return n->has_fp8 ? &n->fp8 : NULL;
    case MF_FMT_E2M1: return n->has_mxf4 ? &n->mxf4 : NULL;
    default: return NULL;
    }
}
