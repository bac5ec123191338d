/* The architecture registry: model_type, the class defaults of transformers'
 * configuration class (read when config.json omits a key), and the variants
 * each architecture uses. Tensor names live in load.c's per-variant tables. */
#include "archs.h"

#include <string.h>

const mf_arch_desc mf_arch_table[MF_ARCH_COUNT] = {
    [MF_ARCH_LLAMA] = {
        .model_type = "llama", .vocab = 32000, .hidden = 4096, .intermediate = 11008, .layers = 32, .heads = 32,
        .kv_heads = 0, .max_pos = 2048, .rms_eps = 1e-6, .rope_theta = 10000.0, .is_moe = false,
        .qk_norm = MF_QK_NORM_NONE, .bias_key = "attention_bias", .bias_on_o = true,
    },
    [MF_ARCH_OLMOE] = {
        .model_type = "olmoe", .vocab = 50304, .hidden = 2048, .intermediate = 2048, .layers = 16, .heads = 16,
        .kv_heads = 0, .max_pos = 4096, .rms_eps = 1e-5, .rope_theta = 10000.0, .is_moe = true,
        .n_experts = 64, .top_k = 8, .norm_topk_prob = false, .moe_intermediate_key = "intermediate_size",
        .route = MF_ROUTE_SOFTMAX_TOPK, .qk_norm = MF_QK_NORM_FULL, .bias_key = "attention_bias", .bias_on_o = true,
        .mixtral_names = false,
    },
    [MF_ARCH_QWEN2_MOE] = {
        .model_type = "qwen2_moe", .vocab = 151936, .hidden = 2048, .intermediate = 5632, .layers = 24, .heads = 16,
        .kv_heads = 16, .max_pos = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0, .is_moe = true,
        .n_experts = 60, .top_k = 4, .norm_topk_prob = false, .moe_intermediate_key = "moe_intermediate_size",
        .moe_intermediate = 1408, .shared_intermediate = 5632, .has_shared = true, .sparse_layers = true,
        .route = MF_ROUTE_SOFTMAX_TOPK, .qk_norm = MF_QK_NORM_NONE, .bias_key = "qkv_bias", .bias_default = true,
        .bias_on_o = false, .sliding_layers = true, .max_window_layers = 28,
    },
    [MF_ARCH_MIXTRAL] = {
        .model_type = "mixtral", .vocab = 32000, .hidden = 4096, .intermediate = 14336, .layers = 32, .heads = 32,
        .kv_heads = 8, .max_pos = 4096 * 32, .rms_eps = 1e-5, .rope_theta = 1e6, .is_moe = true,
        .n_experts = 8, .top_k = 2, .moe_intermediate_key = "intermediate_size",
        .route = MF_ROUTE_SOFTMAX_TOPK_RENORM, .qk_norm = MF_QK_NORM_NONE, .bias_key = NULL,
        .mixtral_names = true, .sliding_all = true,
    },
    [MF_ARCH_QWEN3_MOE] = {
        .model_type = "qwen3_moe", .vocab = 151936, .hidden = 2048, .intermediate = 6144, .layers = 24, .heads = 32,
        .kv_heads = 4, .max_pos = 32768, .rms_eps = 1e-6, .rope_theta = 10000.0, .is_moe = true,
        .n_experts = 128, .top_k = 8, .norm_topk_prob = false, .moe_intermediate_key = "moe_intermediate_size",
        .moe_intermediate = 768, .sparse_layers = true, .route = MF_ROUTE_SOFTMAX_TOPK,
        .qk_norm = MF_QK_NORM_PER_HEAD, .bias_key = "attention_bias", .bias_on_o = true, .sliding_layers = true,
        .max_window_layers = 28,
    },
    /* transformers 5.17's DeepseekV3Config defaults (DeepSeek-V3 itself) */
    [MF_ARCH_DEEPSEEK_V3] = {
        .model_type = "deepseek_v3", .vocab = 129280, .hidden = 7168, .intermediate = 18432, .layers = 61,
        .heads = 128, .kv_heads = 128, .max_pos = 4096, .rms_eps = 1e-6, .rope_theta = 10000.0, .is_moe = true,
        .n_experts = 256, .top_k = 8, .moe_intermediate = 2048, .norm_topk_prob = true,
        .route = MF_ROUTE_SIGMOID_GROUP, .qk_norm = MF_QK_NORM_NONE, .deepseek_family = true, .attn = MF_ATTN_MLA,
        .q_lora_rank = 1536, .kv_lora_rank = 512, .qk_rope_dim = 64, .qk_nope_dim = 128, .v_head_dim = 128,
        .n_shared = 1, .n_group = 8, .topk_group = 4, .first_k_dense = 3, .routed_scaling = 2.5,
    },
    /* DeepseekV2Config (DeepSeek-V2-Lite's MoE keys on Llama's sizes, DeepSeek's vocabulary) */
    [MF_ARCH_DEEPSEEK_V2] = {
        .model_type = "deepseek_v2", .vocab = 102400, .hidden = 4096, .intermediate = 11008, .layers = 32,
        .heads = 32, .kv_heads = 0, .max_pos = 2048, .rms_eps = 1e-6, .rope_theta = 10000.0, .is_moe = true,
        .n_experts = 64, .top_k = 0, .moe_intermediate = 1407, .norm_topk_prob = false,
        .route = MF_ROUTE_SOFTMAX_GREEDY, .qk_norm = MF_QK_NORM_NONE, .deepseek_family = true, .attn = MF_ATTN_MLA,
        .q_lora_rank = 1536, .kv_lora_rank = 512, .qk_rope_dim = 64, .qk_nope_dim = 128, .v_head_dim = 128,
        .n_shared = 2, .n_group = 0, .topk_group = 0, .first_k_dense = 0, .routed_scaling = 1.0,
    },
    /* Glm4MoeConfig (GLM-4.5's family) */
    [MF_ARCH_GLM4_MOE] = {
        .model_type = "glm4_moe", .vocab = 151552, .hidden = 4096, .intermediate = 10944, .layers = 46,
        .heads = 96, .kv_heads = 8, .max_pos = 131072, .rms_eps = 1e-5, .rope_theta = 10000.0, .is_moe = true,
        .n_experts = 128, .top_k = 8, .moe_intermediate = 1408, .norm_topk_prob = true,
        .route = MF_ROUTE_SIGMOID_GROUP, .qk_norm = MF_QK_NORM_PER_HEAD, .bias_key = "attention_bias",
        .bias_on_o = false, .deepseek_family = true, .attn = MF_ATTN_GQA, .partial_rotary = 0.5,
        .n_shared = 1, .n_group = 1, .topk_group = 1, .first_k_dense = 1, .routed_scaling = 1.0,
    },
    /* transformers 5.17's GptOssConfig defaults (gpt-oss-120b's shape; config.c reads the rest) */
    [MF_ARCH_GPT_OSS] = {
        .model_type = "gpt_oss", .vocab = 201088, .hidden = 2880, .intermediate = 2880, .layers = 36, .heads = 64,
        .kv_heads = 8, .max_pos = 131072, .rms_eps = 1e-5, .rope_theta = 150000.0, .is_moe = true,
        .n_experts = 128, .top_k = 4, .moe_intermediate_key = "intermediate_size", .route = MF_ROUTE_TOPK_SOFTMAX,
        .qk_norm = MF_QK_NORM_NONE, .bias_key = "attention_bias", .bias_default = true, .bias_on_o = true,
        .gpt_oss = true,
    },
};

const char *mf_arch_name(mf_arch a) { return a < MF_ARCH_COUNT ? mf_arch_table[a].model_type : "unknown"; }

const char *mf_arch_list(void) { return "llama, olmoe, qwen2_moe, mixtral, qwen3_moe, deepseek_v3, deepseek_v2, glm4_moe, gpt_oss"; }

int mf_arch_from_name(const char *model_type) {
    for (int a = 0; a < MF_ARCH_COUNT; a++)
        if (strcmp(mf_arch_table[a].model_type, model_type) == 0) return a;
    return -1;
}
