/* The decode path on the CPU: a sequence run through a key-value-cache
 * session (its first tokens as a prompt, then one token at a time) gives,
 * position by position, the same bits as one pass over the whole sequence:
 * every product is the same chain of the same values whether its row comes
 * alone or with others. Checked on every architecture's fixture, the YaRN and
 * dynamic-NTK RoPE ones included, in fp64, fp32, bf16 and under an emulated
 * instruction, over every output a run records. */
#include <criterion/criterion.h>
#include <string.h>

#include "mf_runtime.h"
#include "testutil.h"

static const char *const models[] = {"hf/llama", "hf/olmoe", "hf/qwen2_moe", "hf/mixtral", "hf/qwen3_moe",
                                     "hf/qwen3_moe_yarn_v4cfg", "hf/olmoe_dynamic", "hf/llama_tied_llama3",
                                     /* latent attention (both q paths, both RoPEs), partial rotary, FP8 */
                                     "hf26/deepseek_v3", "hf26/deepseek_v3_noqlora", "hf26/deepseek_v2_group",
                                     "hf26/glm4_moe", "hf26/deepseek_v3_fp8",
                                     /* sinks, sliding windows of 8 (< 19 positions), fused and MXFP4 experts */
                                     "hf26/gpt_oss", "hf26/gpt_oss_mxfp4"};

static void same(const char *what, const void *a, const void *b, size_t bytes, const char *model, const char *prec,
                 int pos) {
    cr_assert(memcmp(a, b, bytes) == 0, "%s %s: %s at position %d differs between the session and one pass", model,
              prec, what, pos);
}

static void check(const char *model, const char *prec_name, const char *numerics) {
    mf_precision prec;
    mf_numerics num;
    mf_error err = {0};
    cr_assert_eq(mf_precision_parse(&prec, prec_name, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_numerics_parse(&num, numerics, &err), MF_OK, "%s", err.msg);
    mf_model *m;
    cr_assert_eq(mf_model_load(&m, fixture(model), prec.weights, 0, &err), MF_OK, "%s", err.msg);
    const mf_config *c = &m->cfg;
    enum { T = 19, PROMPT = 7 };
    int32_t tokens[T];
    for (int t = 0; t < T; t++) tokens[t] = (t * 7919 + 13) % c->vocab;
    mf_run_opts o = {.prec = prec, .threads = 2, .record_router_in = true, .numerics = &num};
    mf_seq_result whole;
    cr_assert_eq(mf_forward_cpu(m, &o, tokens, T, &whole, &err), MF_OK, "%s", err.msg);
    mf_cpu_session *s;
    cr_assert_eq(mf_cpu_session_open(&s, m, &o, T, &err), MF_OK, "%s", err.msg);
    for (int p = 0; p < T;) {
        const int n = p == 0 ? PROMPT : 1;
        mf_seq_result r;
        cr_assert_eq(mf_cpu_session_forward(s, tokens + p, n, &r, &err), MF_OK, "%s", err.msg);
        cr_assert_eq(mf_cpu_session_length(s), p + n);
        for (int i = 0; i < n; i++) {
            const int t = p + i, V = c->vocab;
            same("logits", r.logits + (size_t)i * V, whole.logits + (size_t)t * V, (size_t)V * sizeof(double), model,
                 prec_name, t);
            for (int l = 0; l < whole.n_moe; l++) {
                const size_t k = (size_t)whole.k, E = (size_t)whole.E, H = (size_t)whole.H;
                same("expert ids", r.topk_ids + ((size_t)l * n + i) * k, whole.topk_ids + ((size_t)l * T + t) * k,
                     k * sizeof(uint16_t), model, prec_name, t);
                same("gate weights", r.topk_w + ((size_t)l * n + i) * k, whole.topk_w + ((size_t)l * T + t) * k,
                     k * sizeof(double), model, prec_name, t);
                same("router logits", r.router + ((size_t)l * n + i) * E, whole.router + ((size_t)l * T + t) * E,
                     E * sizeof(double), model, prec_name, t);
                same("router inputs", r.router_in + ((size_t)l * n + i) * H, whole.router_in + ((size_t)l * T + t) * H,
                     H * sizeof(double), model, prec_name, t);
                if (whole.select)
                    same("ranked scores", r.select + ((size_t)l * n + i) * E, whole.select + ((size_t)l * T + t) * E,
                         E * sizeof(double), model, prec_name, t);
                if (whole.shared_gate)
                    same("shared gate", r.shared_gate + (size_t)l * n + i, whole.shared_gate + (size_t)l * T + t,
                         sizeof(double), model, prec_name, t);
            }
        }
        mf_seq_result_free(&r);
        p += n;
    }
    /* the session holds T positions: one more is refused, with the position */
    mf_seq_result r;
    cr_assert_neq(mf_cpu_session_forward(s, tokens, 1, &r, &err), MF_OK);
    cr_assert(strstr(err.msg, "position 19"), "%s", err.msg);
    mf_cpu_session_close(s);
    mf_seq_result_free(&whole);
    mf_model_free(m);
}

Test(session, decode_path_equals_one_pass_fp64) {
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) check(models[i], "fp64", "fp64");
}

Test(session, decode_path_equals_one_pass_bf16_fp32) {
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        check(models[i], "bf16", "native");
        check(models[i], "fp32", "native");
    }
}

Test(session, decode_path_equals_one_pass_emulated) {
    check("hf/olmoe", "bf16", "emu:cdna3");
    check("hf/qwen2_moe", "bf16", "emu:hopper");
    check("hf26/deepseek_v3_yarn", "bf16", "emu:hopper");
}
