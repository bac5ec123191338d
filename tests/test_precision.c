/* Precision policies: each checked against a property that follows from its
 * definition (CroVA's precision.py semantics), using runs of the other
 * policies on the same Hugging Face checkpoint as the yardstick. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "mf_runtime.h"
#include "mf_trace.h"
#include "testutil.h"

typedef struct run {
    mf_seq_result r;
} run;

static mf_seq_result forward(const char *case_name, const char *policy) {
    char dir[4200], tok[4300];
    snprintf(dir, sizeof dir, "%s", fixture("hf/"));
    strcat(dir, case_name);
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
    mf_error err = {0};
    mf_precision prec;
    cr_assert_eq(mf_precision_parse(&prec, policy, &err), MF_OK, "%s", err.msg);
    mf_model *m;
    cr_assert_eq(mf_runtime_load(&m, dir, &prec, &err), MF_OK, "%s", err.msg);
    mf_prompts ps;
    cr_assert_eq(mf_prompts_load(&ps, tok, m->cfg.vocab, &err), MF_OK);
    mf_run_opts o = {.prec = prec, .threads = 2};
    mf_seq_result r;
    cr_assert_eq(mf_forward_cpu(m, &o, ps.seq[2].tokens, ps.seq[2].T, &r, &err), MF_OK, "%s", err.msg);
    mf_prompts_free(&ps);
    mf_model_free(m);
    return r;
}

static double dist(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (a[i] - b[i]) * (a[i] - b[i]);
    return sqrt(s);
}

static bool all_bf16(const double *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (v[i] != mf_round_bf16(v[i])) return false;
    return true;
}

Test(precision, layercast_equals_fp32_on_a_bf16_checkpoint) {
    mf_seq_result a = forward("qwen2_moe", "layercast"), b = forward("qwen2_moe", "fp32");
    cr_assert(memcmp(a.logits, b.logits, sizeof(double) * a.T * a.V) == 0);
    cr_assert(memcmp(a.router, b.router, sizeof(double) * a.n_moe * a.T * a.E) == 0);
    mf_seq_result_free(&a);
    mf_seq_result_free(&b);
}

Test(precision, selective_router_rounds_to_the_bf16_run_at_the_first_layer) {
    /* Layer 0's router input is the same in both runs; the router's fp32
     * logits rounded to bf16 are exactly the bf16 run's logits there. */
    mf_seq_result s = forward("olmoe", "selective:router"), b = forward("olmoe", "bf16");
    const size_t n0 = (size_t)s.T * s.E;
    bool some_wider = false;
    for (size_t i = 0; i < n0; i++) {
        cr_assert_eq(mf_round_bf16(s.router[i]), b.router[i], "slot %zu", i);
        some_wider |= s.router[i] != b.router[i];
    }
    cr_assert(some_wider, "the router logits are fp32 values, not bf16");
    cr_assert(all_bf16(s.logits, (size_t)s.T * s.V), "everything else stays bf16: the logits are bf16");
    mf_seq_result_free(&s);
    mf_seq_result_free(&b);
}

Test(precision, first_block_in_fp32_then_bf16) {
    /* Layer 0 computes in fp32 (only the RoPE tables, made by the bf16 model,
     * are bf16 values), so its router is far nearer the fp32 run's than the
     * bf16 run's is; layer 1 is bf16 again. */
    mf_seq_result s = forward("qwen3_moe", "selective:first1"), f = forward("qwen3_moe", "fp32"),
                  b = forward("qwen3_moe", "bf16");
    const size_t n0 = (size_t)s.T * s.E;
    cr_assert(!all_bf16(s.router, n0), "layer 0's router logits are fp32 values");
    double ds = dist(s.router, f.router, n0), db = dist(b.router, f.router, n0);
    cr_assert_lt(ds, db / 4, "layer 0: |first1 - fp32| = %g, |bf16 - fp32| = %g", ds, db);
    cr_assert(all_bf16(s.router + n0, n0), "layer 1 computes in bf16");
    cr_assert(all_bf16(s.logits, (size_t)s.T * s.V));
    mf_seq_result_free(&s);
    mf_seq_result_free(&f);
    mf_seq_result_free(&b);
}

Test(precision, blocks_norm_head_is_nearer_fp32_than_bf16_is) {
    /* only the embedding output and each block's output are rounded to bf16 */
    mf_seq_result s = forward("mixtral", "selective:blocks+norm+head"), f = forward("mixtral", "fp32"),
                  b = forward("mixtral", "bf16");
    const size_t n = (size_t)s.T * s.V;
    cr_assert(!all_bf16(s.logits, n), "the head keeps fp32 logits");
    double ds = dist(s.logits, f.logits, n), db = dist(b.logits, f.logits, n);
    cr_assert_lt(ds, db / 2, "|blocks+norm+head - fp32| = %g, |bf16 - fp32| = %g", ds, db);
    mf_seq_result_free(&s);
    mf_seq_result_free(&f);
    mf_seq_result_free(&b);
}

Test(precision, nomlp_keeps_the_moe_block_in_bf16) {
    mf_seq_result s = forward("qwen2_moe", "nomlp");
    cr_assert(all_bf16(s.router, (size_t)s.n_moe * s.T * s.E), "the router is inside .mlp: bf16");
    cr_assert(all_bf16(s.shared_gate, (size_t)s.n_moe * s.T));
    cr_assert(!all_bf16(s.logits, (size_t)s.T * s.V), "fp32 logits");
    mf_seq_result_free(&s);
}

Test(precision, parse) {
    mf_precision p;
    mf_error err = {0};
    cr_assert_eq(mf_precision_parse(&p, "selective:attn+norm+last2", &err), MF_OK);
    cr_assert(p.part[MF_PART_ATTN] == MF_F32 && p.part[MF_PART_NORM] == MF_F32 && p.part[MF_PART_MLP] == MF_BF16);
    cr_assert(!mf_precision_layer_fp32(&p, 1, 4) && mf_precision_layer_fp32(&p, 2, 4) && mf_precision_layer_fp32(&p, 3, 4));
    cr_assert_eq(mf_precision_parse(&p, "selective:mlp", &err), MF_OK);
    cr_assert_eq(p.part[MF_PART_ROUTER], MF_F32, "mlp covers the router");
    cr_assert_eq(mf_precision_parse(&p, "selective:first2+last2", &err), MF_EINVAL);
    cr_assert_eq(mf_precision_parse(&p, "selective:experts", &err), MF_EINVAL);
    cr_assert(strstr(err.msg, "experts"));
    cr_assert_eq(mf_precision_parse(&p, "selective:", &err), MF_EINVAL);
    cr_assert_eq(mf_precision_parse(&p, "tf32", &err), MF_EINVAL);
    cr_assert_eq(mf_precision_parse(&p, "nomlp", &err), MF_OK);
    cr_assert(p.act == MF_F32 && p.weights == MF_BF16 && p.part[MF_PART_MLP] == MF_BF16);
}
