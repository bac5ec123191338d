/* config.json: class defaults for absent keys (transformers' configuration
 * classes; docs/models.md), both rope spellings, MoE and
 * sliding layers. */
#include <criterion/criterion.h>
#include <string.h>

#include "mf_models.h"

static mf_config parse_ok(const char *json) {
    mf_config c;
    mf_error err = {0};
    int rc = mf_config_parse(&c, json, strlen(json), "test.json", &err);
    cr_assert_eq(rc, MF_OK, "%s", err.msg);
    return c;
}

Test(config, olmoe_class_defaults) {
    mf_config c = parse_ok("{\"model_type\": \"olmoe\"}");
    cr_assert_eq(c.arch, MF_ARCH_OLMOE);
    cr_assert_eq(c.vocab, 50304);
    cr_assert_eq(c.hidden, 2048);
    cr_assert_eq(c.n_layers, 16);
    cr_assert_eq(c.n_heads, 16);
    cr_assert_eq(c.n_kv_heads, 16);
    cr_assert_eq(c.n_experts, 64);
    cr_assert_eq(c.top_k, 8);
    cr_assert_eq(c.moe_intermediate, 2048);
    cr_assert(!c.norm_topk_prob);
    cr_assert_float_eq(c.rms_eps, 1e-5, 0);
    cr_assert_float_eq(c.rope.theta, 10000.0, 0);
    cr_assert_eq(c.qk_norm, MF_QK_NORM_FULL);
    cr_assert_eq(c.n_moe_layers, 16);
}

Test(config, qwen3_moe_head_dim_and_norm_topk) {
    mf_config c = parse_ok("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 2048, \"num_attention_heads\": 32,"
                           " \"head_dim\": 128, \"num_experts\": 128, \"norm_topk_prob\": true, \"rope_theta\": 1000000.0}");
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.n_kv_heads, 4);
    cr_assert_eq(c.moe_intermediate, 768);
    cr_assert(c.norm_topk_prob);
    cr_assert_eq(c.qk_norm, MF_QK_NORM_PER_HEAD);
    cr_assert_float_eq(c.rope.theta, 1e6, 0);
}

Test(config, mixtral_always_renormalises_and_names_experts_both_ways) {
    mf_config a = parse_ok("{\"model_type\": \"mixtral\", \"num_local_experts\": 8, \"norm_topk_prob\": false}");
    cr_assert_eq(a.n_experts, 8);
    cr_assert(a.norm_topk_prob);
    cr_assert_eq(a.route_rule, MF_ROUTE_SOFTMAX_TOPK_RENORM);
    mf_config b = parse_ok("{\"model_type\": \"qwen3_moe\", \"num_local_experts\": 16}");
    cr_assert_eq(b.n_experts, 16);
}

Test(config, rope_v4_and_v5_spellings_agree) {
    mf_config v4 = parse_ok("{\"model_type\": \"llama\", \"rope_theta\": 500000.0,"
                            " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}");
    mf_config v5 = parse_ok("{\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": \"linear\","
                            " \"factor\": 2.0, \"rope_theta\": 500000.0}}");
    cr_assert_eq(v4.rope.type, MF_ROPE_LINEAR);
    cr_assert_eq(v5.rope.type, MF_ROPE_LINEAR);
    cr_assert_float_eq(v4.rope.theta, 500000.0, 0);
    cr_assert_float_eq(v5.rope.theta, 500000.0, 0);
    cr_assert_float_eq(v4.rope.factor, 2.0, 0);
    mf_config y = parse_ok("{\"model_type\": \"qwen3_moe\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0,"
                           " \"original_max_position_embeddings\": 4096}}");
    cr_assert_eq(y.rope.type, MF_ROPE_YARN);
    cr_assert_eq(y.rope.original_max_pos, 4096);
    cr_assert_float_eq(y.rope.beta_fast, 32.0, 0);
    mf_config d = parse_ok("{\"model_type\": \"mixtral\", \"rope_scaling\": null}");
    cr_assert_eq(d.rope.type, MF_ROPE_DEFAULT);
    cr_assert_float_eq(d.rope.theta, 1e6, 0);
}

Test(config, qwen2_moe_sparse_layers_and_shared_expert) {
    mf_config c = parse_ok("{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 6, \"decoder_sparse_step\": 2,"
                           " \"mlp_only_layers\": [3]}");
    bool want[6] = {false, true, false, false, false, true};
    for (int l = 0; l < 6; l++) cr_assert_eq(c.layer_is_moe[l], want[l], "layer %d", l);
    cr_assert_eq(c.n_moe_layers, 2);
    cr_assert(c.has_shared_expert);
    cr_assert_eq(c.shared_intermediate, 5632);
    cr_assert(c.attn_bias_qkv, "qwen2_moe has q/k/v biases unless qkv_bias is false");
    cr_assert(!c.attn_bias_o);
    mf_config n = parse_ok("{\"model_type\": \"qwen2_moe\", \"qkv_bias\": false}");
    cr_assert(!n.attn_bias_qkv);
}

Test(config, sliding_layers_per_class) {
    /* qwen2_moe: even layers below max_window_layers, only with use_sliding_window */
    mf_config c = parse_ok("{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 8, \"use_sliding_window\": true,"
                           " \"max_window_layers\": 5, \"sliding_window\": 16}");
    bool want[8] = {true, false, true, false, true, false, false, false};
    for (int l = 0; l < 8; l++) cr_assert_eq(c.layer_sliding[l], want[l], "layer %d", l);
    cr_assert_eq(c.sliding_window, 16);
    mf_config off = parse_ok("{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 3, \"sliding_window\": 8,"
                             " \"layer_types\": [\"full_attention\", \"sliding_attention\", \"full_attention\"]}");
    cr_assert(!off.layer_sliding[1], "without use_sliding_window nothing slides");
    mf_config lt = parse_ok("{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 3, \"use_sliding_window\": true,"
                            " \"layer_types\": [\"full_attention\", \"sliding_attention\", \"full_attention\"]}");
    cr_assert(!lt.layer_sliding[0] && lt.layer_sliding[1] && !lt.layer_sliding[2]);
    cr_assert_eq(lt.sliding_window, 4096, "class default window");
    /* qwen3_moe: every layer */
    mf_config q3 = parse_ok("{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 3, \"use_sliding_window\": true,"
                            " \"max_window_layers\": 1}");
    cr_assert(q3.layer_sliding[0] && q3.layer_sliding[1] && q3.layer_sliding[2]);
    mf_config m = parse_ok("{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, \"sliding_window\": 4096}");
    cr_assert(m.layer_sliding[0] && m.layer_sliding[1]);
    mf_config n = parse_ok("{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, \"sliding_window\": null}");
    cr_assert(!n.layer_sliding[0] && n.sliding_window == 0);
}

Test(config, errors_name_the_problem) {
    mf_config c;
    mf_error err = {0};
    const char *bad = "{\"model_type\": \"gpt2\"}";
    cr_assert_eq(mf_config_parse(&c, bad, strlen(bad), "x.json", &err), MF_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "gpt2") && strstr(err.msg, "qwen3_moe"), "%s", err.msg);
    const char *trunc = "{\"model_type\": \"olmoe\", \"hidden_size\": ";
    cr_assert_eq(mf_config_parse(&c, trunc, strlen(trunc), "x.json", &err), MF_EFORMAT);
    cr_assert(strstr(err.msg, "x.json"), "%s", err.msg);
    const char *ty = "{\"model_type\": \"olmoe\", \"num_experts_per_tok\": \"eight\"}";
    cr_assert_eq(mf_config_parse(&c, ty, strlen(ty), "x.json", &err), MF_EFORMAT);
    cr_assert(strstr(err.msg, "num_experts_per_tok"), "%s", err.msg);
    const char *k = "{\"model_type\": \"olmoe\", \"num_experts\": 4, \"num_experts_per_tok\": 8}";
    cr_assert_eq(mf_config_parse(&c, k, strlen(k), "x.json", &err), MF_EFORMAT);
}
