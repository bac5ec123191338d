/* config.json: class defaults for absent keys (transformers' configuration
 * classes; docs/models.md), both rope spellings, MoE and
 * sliding layers. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
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

/* DeepseekV3Config's defaults in transformers 5.17 (DeepSeek-V3 itself), and DeepSeek-V3's own rope_scaling: YaRN
 * factor 40 with mscale = mscale_all_dim = 1 folds (0.1 ln 40 + 1)^2 = 1.873854... into the softmax scale
 * (qk_head_dim 192 ** -0.5). */
Test(config, deepseek_v3_defaults_and_mscale) {
    mf_config c = parse_ok("{\"model_type\": \"deepseek_v3\"}");
    cr_assert_eq(c.arch, MF_ARCH_DEEPSEEK_V3);
    cr_assert_eq(c.attn, MF_ATTN_MLA);
    cr_assert(c.vocab == 129280 && c.hidden == 7168 && c.n_layers == 61 && c.n_heads == 128 && c.n_kv_heads == 128);
    cr_assert(c.q_lora_rank == 1536 && c.kv_lora_rank == 512 && c.qk_rope_dim == 64 && c.qk_nope_dim == 128 &&
              c.v_head_dim == 128);
    cr_assert_eq(c.head_dim, 64, "transformers sets head_dim to qk_rope_head_dim");
    cr_assert(c.n_experts == 256 && c.top_k == 8 && c.moe_intermediate == 2048 && c.n_shared_experts == 1);
    cr_assert_eq(c.shared_intermediate, 2048);
    cr_assert(c.n_group == 8 && c.topk_group == 4 && c.norm_topk_prob);
    cr_assert_float_eq(c.routed_scaling, 2.5, 0);
    cr_assert_eq(c.route_rule, MF_ROUTE_SIGMOID_GROUP);
    cr_assert(!c.layer_is_moe[2] && c.layer_is_moe[3] && c.n_moe_layers == 58, "first_k_dense_replace 3");
    cr_assert_eq(c.rope_style, MF_ROPE_DEINTERLEAVE, "rope_interleave defaults to true");
    cr_assert_float_eq(c.attn_scale, 1.0 / sqrt(192.0), 1e-16);
    cr_assert(!c.has_shared_expert, "DeepSeek's shared experts are ungated");
    mf_config y = parse_ok("{\"model_type\": \"deepseek_v3\", \"max_position_embeddings\": 163840, \"rope_scaling\":"
                           " {\"type\": \"yarn\", \"factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 1.0,"
                           " \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096}}");
    const double ms = 1 + 0.1 * log(40.0);   /* 1.3688879... */
    cr_assert_float_eq(y.attn_scale, 1.0 / sqrt(192.0) * ms * ms, 1e-16);
    mf_config m = parse_ok("{\"model_type\": \"deepseek_v3\", \"q_lora_rank\": null, \"n_group\": 1, \"topk_group\": 1,"
                           " \"rope_interleave\": false, \"routed_scaling_factor\": 2.446, \"n_routed_experts\": 64}");
    cr_assert_eq(m.q_lora_rank, 0, "null q_lora_rank: a plain q_proj (Moonlight)");
    cr_assert_eq(m.rope_style, MF_ROPE_HALF);
    cr_assert_eq(m.n_experts, 64);
}

/* DeepseekV2Config: Llama's sizes with DeepSeek's vocabulary (102400), softmax routing, topk_method greedy, no
 * default top-k; norm_topk_prob is read by nothing in DeepseekV2Moe; RoPE is the complex form; the softmax scale
 * takes mscale(factor, mscale_all_dim)^2 as DeepSeek-V3's does (5.17's DeepseekV2Attention: yarn_apply_mscale). */
Test(config, deepseek_v2_defaults_and_methods) {
    mf_config c = parse_ok("{\"model_type\": \"deepseek_v2\", \"num_experts_per_tok\": 6, \"norm_topk_prob\": true,"
                           " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"mscale\": 0.707,"
                           " \"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 4096}}");
    cr_assert(c.vocab == 102400 && c.hidden == 4096 && c.n_layers == 32 && c.n_heads == 32 && c.n_kv_heads == 32);
    cr_assert(c.n_experts == 64 && c.top_k == 6 && c.moe_intermediate == 1407 && c.n_shared_experts == 2);
    cr_assert(!c.norm_topk_prob && !c.group_limited && c.n_group == 1);
    cr_assert_eq(c.route_rule, MF_ROUTE_SOFTMAX_GREEDY);
    cr_assert_eq(c.rope_style, MF_ROPE_COMPLEX);
    const double ms = 1 + 0.1 * 0.707 * log(40.0);
    cr_assert_float_eq(c.attn_scale, 1.0 / sqrt(192.0) * ms * ms, 1e-16);
    cr_assert_eq(c.n_moe_layers, 32, "first_k_dense_replace 0");
    mf_config g = parse_ok("{\"model_type\": \"deepseek_v2\", \"num_experts_per_tok\": 6, \"topk_method\":"
                           " \"group_limited_greedy\", \"n_group\": 8, \"topk_group\": 3}");
    cr_assert(g.group_limited && g.n_group == 8 && g.topk_group == 3);
    mf_config e;
    mf_error err = {0};
    const char *no_k = "{\"model_type\": \"deepseek_v2\"}";
    cr_assert_eq(mf_config_parse(&e, no_k, strlen(no_k), "x.json", &err), MF_EFORMAT);
    cr_assert(strstr(err.msg, "num_experts_per_tok"), "%s", err.msg);
    const char *meth = "{\"model_type\": \"deepseek_v2\", \"num_experts_per_tok\": 6, \"topk_method\": \"noaux_tc\"}";
    cr_assert_eq(mf_config_parse(&e, meth, strlen(meth), "x.json", &err), MF_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "noaux_tc"), "%s", err.msg);
}

/* GLM-4.5-Air's shape: head_dim 128 (not 4096 / 96), partial_rotary_factor 0.5 by default, q/k/v biases without
 * an o_proj bias, per-head q/k norms only with use_qk_norm. */
Test(config, glm4_moe_partial_rotary_and_biases) {
    mf_config c = parse_ok("{\"model_type\": \"glm4_moe\", \"head_dim\": 128, \"attention_bias\": true,"
                           " \"n_routed_experts\": 128, \"num_experts_per_tok\": 8, \"use_qk_norm\": false}");
    cr_assert_eq(c.arch, MF_ARCH_GLM4_MOE);
    cr_assert(c.attn == MF_ATTN_GQA && c.head_dim == 128 && c.rope_dim == 64);
    cr_assert(c.attn_bias_qkv && !c.attn_bias_o);
    cr_assert_eq(c.qk_norm, MF_QK_NORM_NONE);
    cr_assert(c.n_kv_heads == 8 && c.n_shared_experts == 1 && c.n_group == 1 && c.norm_topk_prob);
    cr_assert(!c.layer_is_moe[0] && c.layer_is_moe[1], "first_k_dense_replace 1");
    cr_assert_float_eq(c.rms_eps, 1e-5, 0);
    mf_config q = parse_ok("{\"model_type\": \"glm4_moe\", \"head_dim\": 128, \"use_qk_norm\": true,"
                           " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0,"
                           " \"partial_rotary_factor\": 0.25}}");
    cr_assert_eq(q.qk_norm, MF_QK_NORM_PER_HEAD);
    cr_assert_eq(q.rope_dim, 32);
}

Test(config, deepseek_family_errors) {
    mf_config c;
    mf_error err = {0};
    const char *kv = "{\"model_type\": \"deepseek_v3\", \"num_key_value_heads\": 16}";
    cr_assert_eq(mf_config_parse(&c, kv, strlen(kv), "x.json", &err), MF_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "num_key_value_heads"), "%s", err.msg);
    const char *grp = "{\"model_type\": \"deepseek_v3\", \"n_routed_experts\": 10, \"n_group\": 4}";
    cr_assert_eq(mf_config_parse(&c, grp, strlen(grp), "x.json", &err), MF_EFORMAT);
    cr_assert(strstr(err.msg, "n_group"), "%s", err.msg);
    /* head_dim in config.json is overwritten by qk_rope_head_dim (DeepseekV3Config.__post_init__) */
    mf_config h = parse_ok("{\"model_type\": \"deepseek_v3\", \"head_dim\": 128}");
    cr_assert_eq(h.head_dim, 64);
    const char *one = "{\"model_type\": \"glm4_moe\", \"head_dim\": 128, \"n_routed_experts\": 8, \"n_group\": 8}";
    cr_assert_eq(mf_config_parse(&c, one, strlen(one), "x.json", &err), MF_EFORMAT);
    cr_assert(strstr(err.msg, "two best"), "%s", err.msg);
}

/* synth --size deepseek-v2-lite / glm-4.5-air: the config written parses to the Hub model's dimensions, and the
 * tensors written hold the model's parameter count. The counts are computed by hand from the Hub configs
 * (DeepSeek-V2-Lite: embeddings 2 x 102400 x 2048, 27 layers of MLA 13,763,072 + norms 4,096, dense layer 0 3 x 2048
 * x 10944, 26 MoE layers of router 64 x 2048 + 64 experts 3 x 2048 x 1408 + shared 3 x 2048 x 2816, final norm:
 * 15,706,484,224 = the model card's 15.7B; GLM-4.5-Air: embeddings 2 x 151552 x 4096, 46 layers of attention
 * 109,066,240 (with q/k/v biases) + norms 8,192, dense layer 0 3 x 4096 x 10944, 45 MoE layers of router 128 x
 * 4096 + correction bias 128 + 128 experts 3 x 4096 x 1408 + shared 3 x 4096 x 1408, final norm: 106,852,251,264,
 * the model card's 106B without its multi-token-prediction layer). */
Test(config, synth_sizes_of_2026_models) {
    struct {
        const char *name;
        uint64_t params;
        mf_arch arch;
        int layers, hidden, experts, top_k, shared, moe_i, dense_i, heads, kv_heads, vocab;
    } cases[] = {
        {"deepseek-v2-lite", 15706484224ull, MF_ARCH_DEEPSEEK_V2, 27, 2048, 64, 6, 2, 1408, 10944, 16, 16, 102400},
        {"glm-4.5-air", 106852251264ull, MF_ARCH_GLM4_MOE, 46, 4096, 128, 8, 1, 1408, 10944, 96, 8, 151552},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int size = mf_synth_size_from_name(cases[i].name);
        cr_assert_geq(size, 0, "%s", cases[i].name);
        char *text = NULL;
        uint64_t n = 0;
        mf_error err = {0};
        cr_assert_eq(mf_synth_plan((mf_synth_size)size, &text, &n, &err), MF_OK, "%s", err.msg);
        mf_config c;
        cr_assert_eq(mf_config_parse(&c, text, strlen(text), cases[i].name, &err), MF_OK, "%s", err.msg);
        free(text);
        cr_expect_eq(n, cases[i].params, "%s: %llu parameters", cases[i].name, (unsigned long long)n);
        cr_expect_eq(c.arch, cases[i].arch);
        cr_expect_eq(c.n_layers, cases[i].layers);
        cr_expect_eq(c.hidden, cases[i].hidden);
        cr_expect_eq(c.n_experts, cases[i].experts);
        cr_expect_eq(c.top_k, cases[i].top_k);
        cr_expect_eq(c.n_shared_experts, cases[i].shared);
        cr_expect_eq(c.moe_intermediate, cases[i].moe_i);
        cr_expect_eq(c.shared_intermediate, cases[i].shared * cases[i].moe_i);
        cr_expect_eq(c.intermediate, cases[i].dense_i);
        cr_expect_eq(c.n_heads, cases[i].heads);
        cr_expect_eq(c.n_kv_heads, cases[i].kv_heads);
        cr_expect_eq(c.vocab, cases[i].vocab);
        cr_expect_eq(c.n_moe_layers, cases[i].layers - 1, "first_k_dense_replace 1");
        cr_expect(!c.layer_is_moe[0] && c.layer_is_moe[1]);
        if (c.arch == MF_ARCH_DEEPSEEK_V2) {
            cr_expect_eq(c.attn, MF_ATTN_MLA);
            cr_expect_eq(c.q_lora_rank, 0);
            cr_expect_eq(c.kv_lora_rank, 512);
            cr_expect_eq(c.qk_rope_dim, 64);
            cr_expect_eq(c.qk_nope_dim, 128);
            cr_expect_eq(c.v_head_dim, 128);
            cr_expect_eq(c.route_rule, MF_ROUTE_SOFTMAX_GREEDY);
            cr_expect_eq(c.rope.type, MF_ROPE_YARN);
            cr_expect_eq(c.rope.factor, 40);
        } else {
            cr_expect_eq(c.attn, MF_ATTN_GQA);
            cr_expect_eq(c.head_dim, 128);
            cr_expect_eq(c.rope_dim, 64, "partial_rotary_factor 0.5");
            cr_expect_eq(c.route_rule, MF_ROUTE_SIGMOID_GROUP);
            cr_expect(c.norm_topk_prob);
            cr_expect(c.attn_bias_qkv);
            cr_expect_eq(c.qk_norm, MF_QK_NORM_NONE);
            cr_expect_eq(c.rope.theta, 1000000.0);
        }
    }
}

/* GptOssConfig (transformers 5.17): gpt-oss-120b's shape by default, head_dim 64 unless null, layer_types alternating
 * sliding (even layers) and full, sliding_window 128, YaRN factor 32 on 4096 positions (truncate false) when no
 * rope keys are given, attention_bias true (q/k/v and o), the clamped SwiGLU's alpha 1.702 and limit 7.0 (fixed in
 * GptOssExperts), the top-k then softmax router, sinks, every layer MoE. */
Test(config, gpt_oss_class_defaults) {
    mf_config c = parse_ok("{\"model_type\": \"gpt_oss\"}");
    cr_assert_eq(c.arch, MF_ARCH_GPT_OSS);
    cr_assert(c.vocab == 201088 && c.hidden == 2880 && c.n_layers == 36 && c.n_heads == 64 && c.n_kv_heads == 8);
    cr_assert_eq(c.head_dim, 64);
    cr_assert(c.n_experts == 128 && c.top_k == 4 && c.moe_intermediate == 2880 && c.n_moe_layers == 36);
    cr_assert_eq(c.route_rule, MF_ROUTE_TOPK_SOFTMAX);
    cr_assert(c.attn_bias_qkv && c.attn_bias_o && c.attn_sinks && c.clamped_swiglu && c.mlp_bias && c.norm_weight_fp32);
    cr_assert_float_eq(c.swiglu_alpha, 1.702, 0);
    cr_assert_float_eq(c.swiglu_limit, 7.0, 0);
    cr_assert(c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[34] && !c.layer_sliding[35]);
    cr_assert_eq(c.sliding_window, 128);
    cr_assert_eq(c.rope.type, MF_ROPE_YARN);
    cr_assert(c.rope.factor == 32 && c.rope.beta_fast == 32 && c.rope.beta_slow == 1 && !c.rope.truncate &&
              c.rope.original_max_pos == 4096 && c.rope.theta == 150000);
    cr_assert_float_eq(c.rms_eps, 1e-5, 0);
    cr_assert_eq(c.max_pos, 131072);
    cr_assert(!c.tie_embeddings && !c.mxfp4);
    cr_assert_float_eq(c.attn_scale, 0.125, 0);
}

/* openai/gpt-oss-20b's config.json as the Hub has it (v4 rope spelling, MXFP4 experts). */
Test(config, gpt_oss_20b_hub_config) {
    mf_config c = parse_ok(
        "{\"architectures\": [\"GptOssForCausalLM\"], \"attention_bias\": true, \"attention_dropout\": 0.0,"
        " \"eos_token_id\": 200002, \"experts_per_token\": 4, \"head_dim\": 64, \"hidden_act\": \"silu\","
        " \"hidden_size\": 2880, \"initial_context_length\": 4096, \"initializer_range\": 0.02,"
        " \"intermediate_size\": 2880, \"layer_types\": [\"sliding_attention\", \"full_attention\","
        " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\","
        " \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","
        " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\","
        " \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","
        " \"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 131072, \"model_type\": \"gpt_oss\","
        " \"num_attention_heads\": 64, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24, \"num_key_value_heads\": 8,"
        " \"num_local_experts\": 32, \"output_router_logits\": false, \"pad_token_id\": 199999,"
        " \"quantization_config\": {\"modules_to_not_convert\": [\"model.layers.*.self_attn\", \"model.layers.*.mlp.router\","
        " \"model.embed_tokens\", \"lm_head\"], \"quant_method\": \"mxfp4\"}, \"rms_norm_eps\": 1e-05,"
        " \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"factor\": 32.0,"
        " \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false},"
        " \"rope_theta\": 150000, \"router_aux_loss_coef\": 0.9, \"sliding_window\": 128, \"swiglu_limit\": 7.0,"
        " \"tie_word_embeddings\": false, \"use_cache\": true, \"vocab_size\": 201088}");
    cr_assert(c.n_layers == 24 && c.n_experts == 32 && c.top_k == 4 && c.mxfp4);
    cr_assert(c.layer_sliding[22] && !c.layer_sliding[23] && c.sliding_window == 128);
    cr_assert(c.rope.type == MF_ROPE_YARN && c.rope.factor == 32 && !c.rope.truncate && c.rope.original_max_pos == 4096);
}

Test(config, gpt_oss_nulls_and_errors) {
    mf_config n = parse_ok("{\"model_type\": \"gpt_oss\", \"hidden_size\": 256, \"num_attention_heads\": 8,"
                           " \"head_dim\": null, \"num_key_value_heads\": null, \"num_hidden_layers\": 4,"
                           " \"layer_types\": [\"full_attention\", \"full_attention\", \"sliding_attention\","
                           " \"full_attention\"], \"sliding_window\": 16, \"swiglu_alpha\": 1.5, \"swiglu_limit\": 0.6,"
                           " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}");
    cr_assert_eq(n.head_dim, 32, "null head_dim: hidden_size / num_attention_heads");
    cr_assert_eq(n.n_kv_heads, 8, "null num_key_value_heads: num_attention_heads");
    cr_assert(!n.layer_sliding[0] && !n.layer_sliding[1] && n.layer_sliding[2] && n.sliding_window == 16);
    cr_assert(n.swiglu_alpha == 1.702 && n.swiglu_limit == 7.0, "5.17's GptOssExperts reads neither key");
    cr_assert_eq(n.rope.type, MF_ROPE_DEFAULT);
    mf_config c;
    mf_error err = {0};
    const char *lt = "{\"model_type\": \"gpt_oss\", \"num_hidden_layers\": 2, \"layer_types\": [\"full_attention\"]}";
    cr_assert_eq(mf_config_parse(&c, lt, strlen(lt), "x.json", &err), MF_EFORMAT);
    cr_assert(strstr(err.msg, "layer_types"), "%s", err.msg);
    const char *sw = "{\"model_type\": \"gpt_oss\", \"num_hidden_layers\": 2, \"sliding_window\": null}";
    cr_assert_eq(mf_config_parse(&c, sw, strlen(sw), "x.json", &err), MF_EFORMAT);
    cr_assert(strstr(err.msg, "sliding_window"), "%s", err.msg);
    const char *q = "{\"model_type\": \"qwen3_moe\", \"quantization_config\": {\"quant_method\": \"mxfp4\"}}";
    cr_assert_eq(mf_config_parse(&c, q, strlen(q), "x.json", &err), MF_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "mxfp4"), "%s", err.msg);
}
