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

static int parse_rope(ctx *c, mf_config *cfg, double default_theta) {
    mf_rope *r = &cfg->rope;
    memset(r, 0, sizeof *r);
    r->type = MF_ROPE_DEFAULT;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->truncate = true;
    r->partial_rotary_factor = 1.0;
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
    if ((rc = get_num(c, c->root, "partial_rotary_factor", 1.0, &r->partial_rotary_factor))) return rc;
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
    INT("head_dim", cfg->hidden / cfg->n_heads, &cfg->head_dim);
    if (cfg->head_dim <= 0 || cfg->head_dim % 2) {
        rc = mf_fail(err, MF_EFORMAT, "%s: head_dim %d must be positive and even", origin, cfg->head_dim);
        goto done;
    }
    if ((rc = get_num(&c, root, "rms_norm_eps", d->rms_eps, &cfg->rms_eps))) goto done;
    if ((rc = parse_rope(&c, cfg, d->rope_theta))) goto done;
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

    /* MoE */
    if (d->is_moe) {
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
        if ((rc = get_bool(&c, root, "norm_topk_prob", d->norm_topk_prob, &cfg->norm_topk_prob))) goto done;
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
