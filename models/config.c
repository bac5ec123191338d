/* config.json in both spellings: transformers v4 (top-level rope_theta and
 * rope_scaling {"type" | "rope_type", ...}) and v5 (rope_parameters). Absent
 * keys take the configuration class defaults of models/archs.c. */
#include "archs.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ctx {
    json_t *root;
    const char *origin;
    mf_error *err;
} ctx;

/* Integer key: absent or null gives def; anything else but an integer fails. */
static int get_int(ctx *c, json_t *obj, const char *key, int def, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MF_OK;
    }
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 1e9) {
        *out = (int)json_real_value(v);
        return MF_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < -1000000000 || json_integer_value(v) > 1000000000)
        return mf_fail(c->err, MF_EFORMAT, "%s: \"%s\" must be an integer", c->origin, key);
    *out = (int)json_integer_value(v);
    return MF_OK;
}

static int get_num(ctx *c, json_t *obj, const char *key, double def, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MF_OK;
    }
    if (!json_is_number(v)) return mf_fail(c->err, MF_EFORMAT, "%s: \"%s\" must be a number", c->origin, key);
    *out = json_number_value(v);
    return MF_OK;
}

static int get_bool(ctx *c, json_t *obj, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MF_OK;
    }
    if (!json_is_boolean(v)) return mf_fail(c->err, MF_EFORMAT, "%s: \"%s\" must be true or false", c->origin, key);
    *out = json_is_true(v);
    return MF_OK;
}

static int parse_rope(ctx *c, mf_config *cfg, double default_theta, double default_prf) {
    mf_rope *r = &cfg->rope;
    memset(r, 0, sizeof *r);
    r->type = MF_ROPE_DEFAULT;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->truncate = true;
    r->partial_rotary_factor = default_prf;
    json_t *params = json_object_get(c->root, "rope_parameters");   /* v5 */
    json_t *scaling = json_object_get(c->root, "rope_scaling");     /* v4 */
    if (params && !json_is_null(params) && !json_is_object(params))
        return mf_fail(c->err, MF_EFORMAT, "%s: \"rope_parameters\" must be an object", c->origin);
    if (scaling && !json_is_null(scaling) && !json_is_object(scaling))
        return mf_fail(c->err, MF_EFORMAT, "%s: \"rope_scaling\" must be an object or null", c->origin);
    /* transformers 5.17 standardises a legacy rope_scaling over rope_parameters when both are given */
    json_t *src = (scaling && json_is_object(scaling)) ? scaling : (params && json_is_object(params)) ? params : NULL;
    int rc;
    /* theta: v5 inside rope_parameters, v4 at top level (v5 still accepts that) */
    double top_theta = default_theta;
    if ((rc = get_num(c, c->root, "rope_theta", default_theta, &top_theta))) return rc;
    r->theta = top_theta;
    if (src && (rc = get_num(c, src, "rope_theta", top_theta, &r->theta))) return rc;
    if ((rc = get_num(c, c->root, "partial_rotary_factor", default_prf, &r->partial_rotary_factor))) return rc;
    if (!src) return MF_OK;
    if (src && (rc = get_num(c, src, "partial_rotary_factor", r->partial_rotary_factor, &r->partial_rotary_factor)))
        return rc;
    json_t *tv = json_object_get(src, "rope_type");
    if (!tv || json_is_null(tv)) tv = json_object_get(src, "type");
    const char *t = json_is_string(tv) ? json_string_value(tv) : "default";
    if (strcmp(t, "default") == 0) r->type = MF_ROPE_DEFAULT;
    else if (strcmp(t, "linear") == 0) r->type = MF_ROPE_LINEAR;
    else if (strcmp(t, "dynamic") == 0) r->type = MF_ROPE_DYNAMIC;
    else if (strcmp(t, "llama3") == 0) r->type = MF_ROPE_LLAMA3;
    else if (strcmp(t, "yarn") == 0) r->type = MF_ROPE_YARN;
    else
        return mf_fail(c->err, MF_EUNSUPPORTED,
                       "%s: rope type \"%s\" is not supported (default, linear, dynamic, llama3, yarn)", c->origin, t);
    if ((rc = get_num(c, src, "factor", 1.0, &r->factor))) return rc;
    if ((rc = get_num(c, src, "low_freq_factor", 1.0, &r->low_freq_factor))) return rc;
    if ((rc = get_num(c, src, "high_freq_factor", 4.0, &r->high_freq_factor))) return rc;
    int top_orig;   /* a top-level original_max_position_embeddings overrides the rope dict's */
    if ((rc = get_int(c, c->root, "original_max_position_embeddings", 0, &top_orig))) return rc;
    if ((rc = get_int(c, src, "original_max_position_embeddings", 0, &r->original_max_pos))) return rc;
    if (top_orig > 0) r->original_max_pos = top_orig;
    if ((rc = get_num(c, src, "beta_fast", 32.0, &r->beta_fast))) return rc;
    if ((rc = get_num(c, src, "beta_slow", 1.0, &r->beta_slow))) return rc;
    if ((rc = get_num(c, src, "mscale", 0.0, &r->mscale))) return rc;
    if ((rc = get_num(c, src, "mscale_all_dim", 0.0, &r->mscale_all_dim))) return rc;
    if ((rc = get_num(c, src, "attention_factor", 0.0, &r->attention_factor))) return rc;
    if ((rc = get_bool(c, src, "truncate", true, &r->truncate))) return rc;
    if (r->type != MF_ROPE_DEFAULT && !(r->factor > 0 && isfinite(r->factor)))
        return mf_fail(c->err, MF_EFORMAT, "%s: rope \"factor\" must be positive", c->origin);
    if (r->type == MF_ROPE_YARN && !(isfinite(r->beta_fast) && isfinite(r->beta_slow) &&
                                     isfinite(r->mscale) && isfinite(r->mscale_all_dim) && r->attention_factor >= 0 &&
                                     isfinite(r->attention_factor)))
        return mf_fail(c->err, MF_EFORMAT,
                       "%s: yarn rope needs finite beta_fast and beta_slow, finite mscale values and a non-negative "
                       "attention_factor", c->origin);
    if (r->type == MF_ROPE_LLAMA3 && !(r->low_freq_factor > 0 && r->high_freq_factor > 0 && isfinite(r->low_freq_factor) &&
                                       isfinite(r->high_freq_factor)))
        return mf_fail(c->err, MF_EFORMAT, "%s: llama3 rope needs positive low_freq_factor and high_freq_factor", c->origin);
    if (r->type == MF_ROPE_LLAMA3 && (r->original_max_pos <= 0 || r->high_freq_factor == r->low_freq_factor))
        return mf_fail(c->err, MF_EFORMAT,
                       "%s: llama3 rope needs original_max_position_embeddings and distinct low/high_freq_factor",
                       c->origin);
    return MF_OK;
}

/* An integer key whose null means "none" (0) while absence means the class default. */
static int get_int_nullable(ctx *c, json_t *obj, const char *key, int def, int *out) {
    json_t *v = json_object_get(obj, key);
    if (v && json_is_null(v)) {
        *out = 0;
        return MF_OK;
    }
    return get_int(c, obj, key, def, out);
}

/* transformers' yarn_get_mscale, on Python floats */
static double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

/* DeepSeek-V3, DeepSeek-V2 and GLM-4.5: multi-head latent attention (the DeepSeeks) or GQA with partial rotary
 * and optional per-head q/k norms (GLM), routed experts behind a grouped sigmoid (V3, GLM) or softmax (V2) router
 * with a scaling factor, shared experts added ungated, and the first first_k_dense_replace layers dense. Keys and
 * defaults as transformers 5.17's DeepseekV3Config, DeepseekV2Config and Glm4MoeConfig read them. */
static int parse_deepseek_family(ctx *c, mf_config *cfg, const mf_arch_desc *d) {
    json_t *root = c->root;
    const char *origin = c->origin;
    mf_error *err = c->err;
    int rc;
#define FINT(key, def, dst) if ((rc = get_int(c, root, key, def, dst))) return rc
    cfg->attn = d->attn;
    if (d->attn == MF_ATTN_MLA) {
        if ((rc = get_int_nullable(c, root, "q_lora_rank", d->q_lora_rank, &cfg->q_lora_rank))) return rc;
        FINT("kv_lora_rank", d->kv_lora_rank, &cfg->kv_lora_rank);
        FINT("qk_rope_head_dim", d->qk_rope_dim, &cfg->qk_rope_dim);
        FINT("qk_nope_head_dim", d->qk_nope_dim, &cfg->qk_nope_dim);
        FINT("v_head_dim", d->v_head_dim, &cfg->v_head_dim);
        if (cfg->q_lora_rank < 0 || cfg->kv_lora_rank <= 0 || cfg->qk_rope_dim <= 0 || cfg->qk_rope_dim % 2 ||
            cfg->qk_nope_dim < 0 || cfg->v_head_dim <= 0)
            return mf_fail(err, MF_EFORMAT,
                           "%s: multi-head latent attention needs kv_lora_rank > 0, an even qk_rope_head_dim > 0, "
                           "qk_nope_head_dim >= 0, v_head_dim > 0 and q_lora_rank >= 0 or null", origin);
        /* transformers sets head_dim to qk_rope_head_dim after reading the file (__post_init__), whatever
         * config.json says: the rotary tables are that wide */
        cfg->head_dim = cfg->rope_dim = cfg->qk_rope_dim;
        if (cfg->n_kv_heads != cfg->n_heads)
            return mf_fail(err, MF_EUNSUPPORTED,
                           "%s: num_key_value_heads %d must equal num_attention_heads %d (latent attention has a key "
                           "and value per head)", origin, cfg->n_kv_heads, cfg->n_heads);
        if (cfg->rope.partial_rotary_factor != 1.0)
            return mf_fail(err, MF_EFORMAT, "%s: partial_rotary_factor does not apply to latent attention", origin);
        bool ab = false;
        if ((rc = get_bool(c, root, "attention_bias", false, &ab))) return rc;
        cfg->attn_bias_lora = ab;
        cfg->attn_bias_qkv = cfg->attn_bias_o = false;
        const int qk = cfg->qk_nope_dim + cfg->qk_rope_dim;
        cfg->attn_scale = pow((double)qk, -0.5);
        if (cfg->arch == MF_ARCH_DEEPSEEK_V3) {
            bool interleave = true;
            if ((rc = get_bool(c, root, "rope_interleave", true, &interleave))) return rc;
            cfg->rope_style = interleave ? MF_ROPE_DEINTERLEAVE : MF_ROPE_HALF;
        } else {
            cfg->rope_style = MF_ROPE_COMPLEX;
        }
        /* yarn_apply_mscale (DeepseekV3Attention and, in 5.17, DeepseekV2Attention): a scaled rope with
         * mscale_all_dim folds mscale(factor, mscale_all_dim)^2 into the softmax scale, with the config's factor */
        if (cfg->rope.type != MF_ROPE_DEFAULT && cfg->rope.mscale_all_dim != 0) {
            const double ms = yarn_get_mscale(cfg->rope.factor, cfg->rope.mscale_all_dim);
            cfg->attn_scale = cfg->attn_scale * ms * ms;
        }
        if (cfg->arch == MF_ARCH_DEEPSEEK_V2 && (rc = get_bool(c, root, "mlp_bias", false, &cfg->mlp_bias))) return rc;
    } else {   /* GLM-4.5: GQA, q/k/v biases (attention_bias), none on o_proj, optional per-head q/k norms */
        bool qkn = false;
        if ((rc = get_bool(c, root, "use_qk_norm", false, &qkn))) return rc;
        cfg->qk_norm = qkn ? MF_QK_NORM_PER_HEAD : MF_QK_NORM_NONE;
        if (cfg->rope_dim <= 0 || cfg->rope_dim % 2)
            return mf_fail(err, MF_EFORMAT, "%s: head_dim %d x partial_rotary_factor %g gives %d rotary dims (need an "
                           "even number above 0)", origin, cfg->head_dim, cfg->rope.partial_rotary_factor, cfg->rope_dim);
    }

    /* the routed and shared experts */
    int ne_a = -1, ne_b = -1;
    FINT("n_routed_experts", -1, &ne_a);
    FINT("num_local_experts", -1, &ne_b);   /* attribute_map alias */
    cfg->n_experts = ne_a >= 0 ? ne_a : ne_b >= 0 ? ne_b : d->n_experts;
    FINT("num_experts_per_tok", d->top_k, &cfg->top_k);
    FINT("moe_intermediate_size", d->moe_intermediate, &cfg->moe_intermediate);
    if ((rc = get_int_nullable(c, root, "n_shared_experts", d->n_shared, &cfg->n_shared_experts))) return rc;
    if ((rc = get_num(c, root, "routed_scaling_factor", d->routed_scaling, &cfg->routed_scaling))) return rc;
    int fkd = 0;
    FINT("first_k_dense_replace", d->first_k_dense, &fkd);
    if (cfg->n_experts <= 0 || cfg->top_k <= 0 || cfg->top_k > cfg->n_experts || cfg->moe_intermediate <= 0)
        return mf_fail(err, MF_EFORMAT, "%s: %d routed experts, top-%d (num_experts_per_tok), expert width %d: need "
                       "0 < top-k <= experts", origin, cfg->n_experts, cfg->top_k, cfg->moe_intermediate);
    if (cfg->n_experts > MF_MAX_EXPERTS || cfg->top_k > MF_MAX_TOP_K)
        return mf_fail(err, MF_EUNSUPPORTED, "%s: %d experts, top-%d (at most %d experts, top-%d)", origin,
                       cfg->n_experts, cfg->top_k, MF_MAX_EXPERTS, MF_MAX_TOP_K);
    if (cfg->n_shared_experts < 0 || fkd < 0 || !isfinite(cfg->routed_scaling))
        return mf_fail(err, MF_EFORMAT, "%s: n_shared_experts and first_k_dense_replace must be >= 0 and "
                       "routed_scaling_factor finite", origin);
    cfg->shared_intermediate = cfg->moe_intermediate * cfg->n_shared_experts;
    cfg->route_rule = d->route;
    if (d->route == MF_ROUTE_SIGMOID_GROUP) {
        if ((rc = get_bool(c, root, "norm_topk_prob", d->norm_topk_prob, &cfg->norm_topk_prob))) return rc;
        FINT("n_group", d->n_group, &cfg->n_group);
        FINT("topk_group", d->topk_group, &cfg->topk_group);
    } else {
        /* DeepseekV2Moe never renormalises: norm_topk_prob is read by nothing */
        cfg->norm_topk_prob = false;
        json_t *tm = json_object_get(root, "topk_method");
        const char *method = json_is_string(tm) ? json_string_value(tm) : "greedy";
        if (strcmp(method, "greedy") == 0) {
            cfg->n_group = cfg->topk_group = 1;
        } else if (strcmp(method, "group_limited_greedy") == 0) {
            cfg->group_limited = true;
            FINT("n_group", 0, &cfg->n_group);
            FINT("topk_group", 0, &cfg->topk_group);
        } else {
            return mf_fail(err, MF_EUNSUPPORTED, "%s: topk_method \"%s\" is not supported (greedy, "
                           "group_limited_greedy)", origin, method);
        }
    }
    if (cfg->n_group <= 0 || cfg->topk_group <= 0 || cfg->topk_group > cfg->n_group || cfg->n_experts % cfg->n_group)
        return mf_fail(err, MF_EFORMAT, "%s: n_group %d and topk_group %d must be positive, topk_group <= n_group, and "
                       "n_group must divide the %d routed experts", origin, cfg->n_group, cfg->topk_group,
                       cfg->n_experts);
    if (d->route == MF_ROUTE_SIGMOID_GROUP && cfg->n_experts / cfg->n_group < 2)
        return mf_fail(err, MF_EFORMAT, "%s: a group's score is the sum of its two best experts: n_group %d leaves "
                       "fewer than two of %d experts a group", origin, cfg->n_group, cfg->n_experts);
    for (int l = 0; l < cfg->n_layers; l++) cfg->layer_is_moe[l] = l >= fkd;
    cfg->n_moe_layers = 0;
    for (int l = 0; l < cfg->n_layers; l++) cfg->n_moe_layers += cfg->layer_is_moe[l];
#undef FINT
    return MF_OK;
}

/* GptOssConfig: without rope_parameters (or v4's rope_scaling) the class sets YaRN, factor 32, beta_fast 32,
 * beta_slow 1, truncate false, original_max_position_embeddings 4096, on rope_theta (default 150000). */
static int gpt_oss_default_rope(ctx *c, mf_config *cfg) {
    json_t *params = json_object_get(c->root, "rope_parameters"), *scaling = json_object_get(c->root, "rope_scaling");
    if ((params && !json_is_null(params)) || (scaling && !json_is_null(scaling))) return MF_OK;
    mf_rope *r = &cfg->rope;
    r->type = MF_ROPE_YARN;
    r->factor = 32.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->truncate = false;
    r->original_max_pos = 4096;
    return MF_OK;
}

/* gpt-oss's parts beyond the shared keys (transformers 5.17 GptOssConfig and GptOssExperts): attention sinks,
 * the clamped SwiGLU, the top-k-then-softmax router with a bias, experts of intermediate_size with biases, every
 * layer MoE, RMSNorm weights applied in fp32. 5.17's GptOssExperts fixes alpha 1.702 and limit 7.0 and reads no
 * key for them: a swiglu_limit in config.json (the Hub's says 7.0) changes nothing there, nor here. */
static int parse_gpt_oss(mf_config *cfg) {
    cfg->attn_sinks = true;
    cfg->clamped_swiglu = true;
    cfg->norm_weight_fp32 = true;
    cfg->mlp_bias = true;
    cfg->norm_topk_prob = false;   /* no such key: the softmax over the k is the rule itself */
    cfg->swiglu_alpha = 1.702;
    cfg->swiglu_limit = 7.0;
    return MF_OK;
}

/* gpt-oss's layer_types (default: sliding_attention at even layers, full_attention at odd ones) and
 * sliding_window (default 128; null: none, which a sliding layer cannot have). */
static int gpt_oss_layer_types(ctx *c, mf_config *cfg, json_t *lt, int *window) {
    int rc;
    if ((rc = get_int(c, c->root, "sliding_window", 128, window))) return rc;
    if (json_is_null(json_object_get(c->root, "sliding_window"))) *window = 0;
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != cfg->n_layers)
            return mf_fail(c->err, MF_EFORMAT, "%s: \"layer_types\" must be an array of %d entries (one a layer)",
                           c->origin, cfg->n_layers);
        for (int l = 0; l < cfg->n_layers; l++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)l));
            if (!s || (strcmp(s, "full_attention") && strcmp(s, "sliding_attention")))
                return mf_fail(c->err, MF_EUNSUPPORTED, "%s: layer_types[%d] must be full_attention or "
                               "sliding_attention", c->origin, l);
            cfg->layer_sliding[l] = strcmp(s, "sliding_attention") == 0;
        }
    } else {
        for (int l = 0; l < cfg->n_layers; l++) cfg->layer_sliding[l] = (l + 1) % 2 != 0;
    }
    return MF_OK;
}

int mf_config_parse(mf_config *cfg, const char *text, size_t len, const char *origin, mf_error *err) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return mf_fail(err, MF_EFORMAT, "%s: malformed JSON at line %d: %s", origin, jerr.line, jerr.text);
    ctx c = {root, origin, err};
    int rc = MF_OK;
    if (!json_is_object(root)) {
        rc = mf_fail(err, MF_EFORMAT, "%s: not a JSON object", origin);
        goto done;
    }
    mf_digest_buffer(text, len, cfg->digest);
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) {
        rc = mf_fail(err, MF_EFORMAT, "%s: no \"model_type\"", origin);
        goto done;
    }
    int a = mf_arch_from_name(json_string_value(mt));
    if (a < 0) {
        rc = mf_fail(err, MF_EUNSUPPORTED, "%s: unknown architecture \"%s\" (known: %s)", origin,
                     json_string_value(mt), mf_arch_list());
        goto done;
    }
    const mf_arch_desc *d = &mf_arch_table[a];
    cfg->arch = (mf_arch)a;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", d->model_type);
#define INT(key, def, dst) if ((rc = get_int(&c, root, key, def, dst))) goto done
    INT("vocab_size", d->vocab, &cfg->vocab);
    INT("hidden_size", d->hidden, &cfg->hidden);
    INT("intermediate_size", d->intermediate, &cfg->intermediate);
    INT("num_hidden_layers", d->layers, &cfg->n_layers);
    INT("num_attention_heads", d->heads, &cfg->n_heads);
    INT("num_key_value_heads", d->kv_heads ? d->kv_heads : cfg->n_heads, &cfg->n_kv_heads);
    /* GptOssConfig: an explicit null means num_attention_heads (absent: the class default 8) */
    if (d->gpt_oss && json_is_null(json_object_get(root, "num_key_value_heads"))) cfg->n_kv_heads = cfg->n_heads;
    INT("max_position_embeddings", d->max_pos, &cfg->max_pos);
    if (cfg->vocab <= 0 || cfg->hidden <= 0 || cfg->n_layers <= 0 || cfg->n_heads <= 0 || cfg->n_kv_heads <= 0 ||
        cfg->intermediate < 0) {
        rc = mf_fail(err, MF_EFORMAT, "%s: sizes must be positive", origin);
        goto done;
    }
    if (cfg->n_layers > MF_MAX_LAYERS) {
        rc = mf_fail(err, MF_EUNSUPPORTED, "%s: %d layers (at most %d)", origin, cfg->n_layers, MF_MAX_LAYERS);
        goto done;
    }
    if (cfg->n_heads % cfg->n_kv_heads) {
        rc = mf_fail(err, MF_EFORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", origin,
                     cfg->n_heads, cfg->n_kv_heads);
        goto done;
    }
    INT("head_dim", d->gpt_oss ? 64 : cfg->hidden / cfg->n_heads, &cfg->head_dim);
    /* GptOssConfig: head_dim defaults to 64; only an explicit null gives hidden_size / num_attention_heads */
    if (d->gpt_oss && json_is_null(json_object_get(root, "head_dim"))) cfg->head_dim = cfg->hidden / cfg->n_heads;
    if (cfg->head_dim <= 0 || cfg->head_dim % 2) {
        rc = mf_fail(err, MF_EFORMAT, "%s: head_dim %d must be positive and even", origin, cfg->head_dim);
        goto done;
    }
    if ((rc = get_num(&c, root, "rms_norm_eps", d->rms_eps, &cfg->rms_eps))) goto done;
    if ((rc = parse_rope(&c, cfg, d->rope_theta, d->partial_rotary > 0 ? d->partial_rotary : 1.0))) goto done;
    if (d->gpt_oss && (rc = gpt_oss_default_rope(&c, cfg))) goto done;
    /* values that can only give NaN or infinities: RMSNorm divides by sqrt(mean + eps), RoPE raises theta to
     * negative powers */
    if (!(cfg->rms_eps > 0 && isfinite(cfg->rms_eps))) {
        rc = mf_fail(err, MF_EFORMAT, "%s: \"rms_norm_eps\" must be a positive number (it is %g)", origin, cfg->rms_eps);
        goto done;
    }
    if (!(cfg->rope.theta > 0 && isfinite(cfg->rope.theta))) {
        rc = mf_fail(err, MF_EFORMAT, "%s: \"rope_theta\" must be a positive number (it is %g)", origin, cfg->rope.theta);
        goto done;
    }
    if (!(cfg->rope.partial_rotary_factor > 0 && cfg->rope.partial_rotary_factor <= 1)) {
        rc = mf_fail(err, MF_EFORMAT, "%s: \"partial_rotary_factor\" must be in (0, 1] (it is %g)", origin,
                     cfg->rope.partial_rotary_factor);
        goto done;
    }
    if (cfg->max_pos <= 0) {
        rc = mf_fail(err, MF_EFORMAT, "%s: \"max_position_embeddings\" must be positive", origin);
        goto done;
    }
    json_t *act = json_object_get(root, "hidden_act");
    const char *as = json_is_string(act) ? json_string_value(act) : "silu";
    if (!strcmp(as, "silu") || !strcmp(as, "swish")) cfg->act = MF_ACT_SILU;
    else if (!strcmp(as, "gelu")) cfg->act = MF_ACT_GELU;
    else if (!strcmp(as, "gelu_pytorch_tanh") || !strcmp(as, "gelu_new") || !strcmp(as, "gelu_fast"))
        cfg->act = MF_ACT_GELU_TANH;
    else if (d->gpt_oss) cfg->act = MF_ACT_SILU;   /* GptOssExperts never reads hidden_act */
    else {
        rc = mf_fail(err, MF_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu, gelu, gelu_pytorch_tanh)",
                     origin, as);
        goto done;
    }
    if ((rc = get_bool(&c, root, "tie_word_embeddings", false, &cfg->tie_embeddings))) goto done;
    bool bias = false;
    if (d->bias_key && (rc = get_bool(&c, root, d->bias_key, d->bias_default, &bias))) goto done;
    cfg->attn_bias_qkv = bias;
    cfg->attn_bias_o = bias && d->bias_on_o;
    if (cfg->arch == MF_ARCH_LLAMA && (rc = get_bool(&c, root, "mlp_bias", false, &cfg->mlp_bias))) goto done;
    cfg->qk_norm = d->qk_norm;
    if (cfg->arch == MF_ARCH_OLMOE && (rc = get_num(&c, root, "clip_qkv", 0.0, &cfg->clip_qkv))) goto done;
    if (!(cfg->clip_qkv >= 0 && isfinite(cfg->clip_qkv))) {
        rc = mf_fail(err, MF_EFORMAT, "%s: \"clip_qkv\" must be a non-negative number", origin);
        goto done;
    }

    json_t *qc = json_object_get(root, "quantization_config");
    if (qc && !json_is_null(qc)) {
        json_t *qm = json_object_get(qc, "quant_method"), *fmt = json_object_get(qc, "fmt");
        json_t *wbs = json_object_get(qc, "weight_block_size");
        const char *method = json_is_string(qm) ? json_string_value(qm) : "(none)";
        if (d->gpt_oss && strcmp(method, "mxfp4") == 0) {
            cfg->mxfp4 = true;   /* the experts' blocks and scales are checked against the config when loading */
            goto quant_done;
        }
        if (strcmp(method, "fp8") != 0) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: quantization_config quant_method \"%s\" is not supported (fp8, "
                         "DeepSeek-V3's block-scaled e4m3; mxfp4, gpt-oss's experts)", origin, method);
            goto done;
        }
        if ((fmt && !(json_is_string(fmt) && !strcmp(json_string_value(fmt), "e4m3"))) || !json_is_array(wbs) ||
            json_array_size(wbs) != 2 || !json_is_integer(json_array_get(wbs, 0)) ||
            !json_is_integer(json_array_get(wbs, 1)) || json_integer_value(json_array_get(wbs, 0)) <= 0 ||
            json_integer_value(json_array_get(wbs, 1)) <= 0 || json_integer_value(json_array_get(wbs, 0)) > 1 << 20 ||
            json_integer_value(json_array_get(wbs, 1)) > 1 << 20) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: an fp8 quantization_config needs fmt e4m3 and a weight_block_size "
                         "of two positive integers (per-tensor or per-channel FP8 is not supported)", origin);
            goto done;
        }
        cfg->fp8_block[0] = (int)json_integer_value(json_array_get(wbs, 0));
        cfg->fp8_block[1] = (int)json_integer_value(json_array_get(wbs, 1));
    }
quant_done:
    cfg->attn = MF_ATTN_GQA;
    cfg->rope_style = MF_ROPE_HALF;
    cfg->attn_scale = pow((double)cfg->head_dim, -0.5);   /* head_dim ** -0.5, a Python float */
    cfg->rope_dim = (int)(cfg->head_dim * cfg->rope.partial_rotary_factor);
    if (d->deepseek_family) {
        if ((rc = parse_deepseek_family(&c, cfg, d))) goto done;
    } else if (d->is_moe) {
        if (d->gpt_oss && (rc = parse_gpt_oss(cfg))) goto done;
        int ne_a, ne_b = -1;
        INT("num_experts", -1, &ne_a);
        /* attribute_map: num_local_experts is an alias except for Qwen2-MoE, whose class has no such mapping */
        if (cfg->arch != MF_ARCH_QWEN2_MOE) {
            INT("num_local_experts", -1, &ne_b);
        }
        cfg->n_experts = ne_a >= 0 ? ne_a : ne_b >= 0 ? ne_b : d->n_experts;
        INT("num_experts_per_tok", d->top_k, &cfg->top_k);
        if (strcmp(d->moe_intermediate_key, "intermediate_size") == 0) cfg->moe_intermediate = cfg->intermediate;
        else INT(d->moe_intermediate_key, d->moe_intermediate, &cfg->moe_intermediate);
        if (!d->gpt_oss && (rc = get_bool(&c, root, "norm_topk_prob", d->norm_topk_prob, &cfg->norm_topk_prob)))
            goto done;
        cfg->route_rule = d->route;
        if (d->route == MF_ROUTE_SOFTMAX_TOPK_RENORM) cfg->norm_topk_prob = true;
        cfg->has_shared_expert = d->has_shared;
        if (d->has_shared) INT("shared_expert_intermediate_size", d->shared_intermediate, &cfg->shared_intermediate);
        if (cfg->n_experts <= 0 || cfg->top_k <= 0 || cfg->top_k > cfg->n_experts || cfg->moe_intermediate <= 0) {
            rc = mf_fail(err, MF_EFORMAT, "%s: %d experts, top-%d, expert width %d: need 0 < top-k <= experts", origin,
                         cfg->n_experts, cfg->top_k, cfg->moe_intermediate);
            goto done;
        }
        if (cfg->n_experts > MF_MAX_EXPERTS || cfg->top_k > MF_MAX_TOP_K) {
            rc = mf_fail(err, MF_EUNSUPPORTED, "%s: %d experts, top-%d (at most %d experts, top-%d)", origin, cfg->n_experts,
                         cfg->top_k, MF_MAX_EXPERTS, MF_MAX_TOP_K);
            goto done;
        }
        if (cfg->has_shared_expert && cfg->shared_intermediate <= 0) {
            rc = mf_fail(err, MF_EFORMAT, "%s: \"shared_expert_intermediate_size\" must be positive", origin);
            goto done;
        }
        int step = 1;
        if (d->sparse_layers) INT("decoder_sparse_step", 1, &step);
        if (step <= 0) step = 1;
        for (int l = 0; l < cfg->n_layers; l++) cfg->layer_is_moe[l] = (l + 1) % step == 0;
        json_t *only = d->sparse_layers ? json_object_get(root, "mlp_only_layers") : NULL;
        if (only && !json_is_null(only)) {
            if (!json_is_array(only)) {
                rc = mf_fail(err, MF_EFORMAT, "%s: \"mlp_only_layers\" must be an array", origin);
                goto done;
            }
            size_t i;
            json_t *v;
            json_array_foreach(only, i, v) {
                if (!json_is_integer(v)) {
                    rc = mf_fail(err, MF_EFORMAT, "%s: \"mlp_only_layers\" entries must be integers", origin);
                    goto done;
                }
                json_int_t l = json_integer_value(v);
                if (l >= 0 && l < cfg->n_layers) cfg->layer_is_moe[l] = false;
            }
        }
        for (int l = 0; l < cfg->n_layers; l++) cfg->n_moe_layers += cfg->layer_is_moe[l];
    }

    /* sliding-window attention, as transformers 5.17 decides it per class:
     * qwen2_moe: layer_types if given, else layer l slides iff use_sliding_window and l is even and
     *            l < max_window_layers; nothing slides without use_sliding_window.
     * qwen3_moe: every layer slides iff use_sliding_window (no layer_types, no max_window_layers).
     * mixtral:   every layer slides iff sliding_window is set. llama, olmoe: never. */
    int window = 0;
    bool use_sw = false;
    if (d->sliding_layers && (rc = get_bool(&c, root, "use_sliding_window", false, &use_sw))) goto done;
    INT("sliding_window", d->sliding_layers ? 4096 : 0, &window);
    json_t *lt = json_object_get(root, "layer_types");
    if (cfg->arch == MF_ARCH_QWEN2_MOE && use_sw && lt && json_is_array(lt)) {
        if ((int)json_array_size(lt) != cfg->n_layers) {
            rc = mf_fail(err, MF_EFORMAT, "%s: \"layer_types\" has %zu entries for %d layers", origin,
                         json_array_size(lt), cfg->n_layers);
            goto done;
        }
        for (int l = 0; l < cfg->n_layers; l++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)l));
            if (!s || (strcmp(s, "full_attention") && strcmp(s, "sliding_attention"))) {
                rc = mf_fail(err, MF_EUNSUPPORTED, "%s: layer_types[%d] must be full_attention or sliding_attention",
                             origin, l);
                goto done;
            }
            cfg->layer_sliding[l] = strcmp(s, "sliding_attention") == 0;
        }
    } else if (cfg->arch == MF_ARCH_QWEN2_MOE && use_sw) {
        int mwl;
        INT("max_window_layers", d->max_window_layers, &mwl);
        for (int l = 0; l < cfg->n_layers; l++) cfg->layer_sliding[l] = l % 2 == 0 && l < mwl;
    } else if (cfg->arch == MF_ARCH_QWEN3_MOE && use_sw) {
        for (int l = 0; l < cfg->n_layers; l++) cfg->layer_sliding[l] = true;
    } else if (d->gpt_oss) {
        if ((rc = gpt_oss_layer_types(&c, cfg, lt, &window))) goto done;
    } else if (d->sliding_all && window > 0) {
        for (int l = 0; l < cfg->n_layers; l++) cfg->layer_sliding[l] = true;
    }
    bool any_sliding = false;
    for (int l = 0; l < cfg->n_layers; l++) any_sliding |= cfg->layer_sliding[l];
    if (any_sliding && window <= 0) {
        rc = mf_fail(err, MF_EFORMAT, "%s: sliding-window layers need a positive \"sliding_window\"", origin);
        goto done;
    }
    cfg->sliding_window = any_sliding ? window : 0;
#undef INT
done:
    json_decref(root);
    return rc;
}

int mf_config_load(mf_config *cfg, const char *path, mf_error *err) {
    char *text;
    size_t len;
    int rc = mf_read_file(path, &text, &len, err);
    if (rc) return rc;
    rc = mf_config_parse(cfg, text, len, path, err);
    free(text);
    return rc;
}
