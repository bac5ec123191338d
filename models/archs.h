/* Private to models/: what distinguishes one architecture from another. */
#ifndef MF_ARCHS_H
#define MF_ARCHS_H

#include "mf_models.h"

typedef struct mf_arch_desc {
    const char *model_type;
    /* class defaults for absent keys */
    int vocab, hidden, intermediate, layers, heads, kv_heads /* 0: = heads */, max_pos;
    double rms_eps, rope_theta;
    bool is_moe;
    int n_experts, top_k, moe_intermediate, shared_intermediate;
    bool norm_topk_prob;
    const char *moe_intermediate_key;   /* config key holding the expert width */
    bool has_shared;                    /* Qwen2-MoE: shared expert with sigmoid gate */
    bool sparse_layers;                 /* decoder_sparse_step / mlp_only_layers apply */
    mf_route_rule route;
    mf_qk_norm qk_norm;
    const char *bias_key;               /* config key switching q/k/v biases on (NULL: never) */
    bool bias_default;
    bool bias_on_o;                     /* the same key also puts a bias on o_proj */
    bool mixtral_names;                 /* block_sparse_moe.{gate,experts.E.w1/w2/w3} on disk */
    bool sliding_layers;                /* Qwen: use_sliding_window + max_window_layers */
    int max_window_layers;
    bool sliding_all;                   /* Mixtral: sliding_window applies to every layer */
    /* DeepSeek-V3, DeepSeek-V2, GLM-4.5 (the DeepSeek family of routers and shared experts) */
    bool deepseek_family;
    mf_attn_kind attn;
    double partial_rotary;              /* partial_rotary_factor's default (0: 1.0) */
    int q_lora_rank, kv_lora_rank, qk_rope_dim, qk_nope_dim, v_head_dim;
    int n_shared, n_group, topk_group, first_k_dense;
    double routed_scaling;
    bool gpt_oss;                       /* gpt-oss: sinks, layer_types, clamped SwiGLU experts, biased top-k router */
} mf_arch_desc;

extern const mf_arch_desc mf_arch_table[MF_ARCH_COUNT];

#endif
