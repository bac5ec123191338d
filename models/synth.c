/* Deterministic random-weight checkpoints in Hub layout (bf16), for every
 * architecture, at two sizes: tiny (tests) and small (benchmarks; the OLMoE
 * one has ~14M parameters: hidden 256, 4 layers, 16 experts, top-4), and at
 * the dimensions of four real models for benchmarks. */
#include "archs.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct synth {
    mf_st_writer *st;
    mf_rng rng;
    bool big;          /* real-model sizes: billions of values */
    uint64_t seed, tensors;
    bool dry;          /* count the parameters only (mf_synth_plan) */
    uint64_t params;
} synth;

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A real-size tensor's values: uniform with the given mean and deviation,
 * each a hash of (seed, tensor, index), so threads need no shared state; made
 * when the file is written, one tensor at a time. */
typedef struct big_fill {
    uint64_t key;
    double mean, half;
} big_fill;

static void fill_big(const void *ud, void *dst, size_t nbytes) {
    const big_fill *f = ud;
    uint16_t *buf = dst;
    const size_t n = nbytes / sizeof(uint16_t);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix(f->key + i) >> 11) * 0x1p-53;
        buf[i] = mf_f64_to_bf16(f->mean + f->half * (2.0 * u - 1.0));
    }
}

static void tensor(synth *s, const char *name, int64_t rows, int64_t cols, double mean, double std) {
    int64_t shape[2] = {rows, cols};
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    s->params += n;
    if (s->dry) return;
    if (s->big) {
        const big_fill f = {splitmix(s->seed ^ splitmix(++s->tensors)), mean, std * sqrt(3.0)};
        mf_st_writer_add_generated(s->st, name, MF_BF16, cols ? 2 : 1, shape, fill_big, &f, sizeof f);
        return;
    }
    uint16_t *buf = mf_xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) buf[i] = mf_f64_to_bf16(mean + std * mf_rng_normal(&s->rng));
    mf_st_writer_add(s->st, name, MF_BF16, cols ? 2 : 1, shape, buf);
    free(buf);
}

/* A 3-D real-size tensor (gpt-oss's fused experts), made as the file is written. */
static void tensor3(synth *s, const char *name, int64_t a, int64_t b, int64_t c, double mean, double std) {
    const int64_t shape[3] = {a, b, c};
    const big_fill f = {splitmix(s->seed ^ splitmix(++s->tensors)), mean, std * sqrt(3.0)};
    mf_st_writer_add_generated(s->st, name, MF_BF16, 3, shape, fill_big, &f, sizeof f);
}

int mf_synth_size_from_name(const char *name) {
    static const char *names[] = {"tiny",         "small",            "olmoe-1b-7b", "qwen1.5-moe-a2.7b",
                                  "mixtral-8x7b", "deepseek-v2-lite", "glm-4.5-air", "gpt-oss-20b"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

#define W(rows, cols, ...) (snprintf(nm, sizeof nm, __VA_ARGS__), tensor(&s, nm, rows, cols, 0.0, std))
#define NORM(n, ...) (snprintf(nm, sizeof nm, __VA_ARGS__), tensor(&s, nm, n, 0, 1.0, 0.1))
#define BIAS(n, ...) (snprintf(nm, sizeof nm, __VA_ARGS__), tensor(&s, nm, n, 0, 0.0, 0.1))

static int synth_into(const char *dir, mf_arch arch, mf_synth_size size, const mf_config *like, uint64_t seed,
                      mf_error *err);
static int write_prompts(const char *dir, mf_rng *rng, bool long_ones, int V, mf_error *err);

/* The final norm and the head, then the file and its prompts (four of 512 tokens when long_prompts); a dry run
 * (parameters counted only) writes nothing */
static int finish_model(synth *s, const char *dir, int V, int H, double std, bool long_prompts, mf_error *err) {
    tensor(s, "model.norm.weight", H, 0, 1.0, 0.1);
    tensor(s, "lm_head.weight", V, H, 0.0, std);
    if (s->dry) return MF_OK;
    char path[4096];
    mf_path_join(path, sizeof path, dir, "model.safetensors");
    const int rc = mf_st_writer_write(s->st, path, err);
    mf_st_writer_free(s->st);
    return rc ? rc : write_prompts(dir, &s->rng, long_prompts, V, err);
}
static int synth_deepseek(const char *dir, mf_synth_size size, const mf_config *like, uint64_t seed, bool fp8,
                          mf_error *err);

/* dir/config.json from cfg (taken: freed here), keys in insertion order as the Hub writes them */
static int write_config(const char *dir, json_t *cfg, mf_error *err) {
    char path[4096];
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(cfg);
    mf_path_join(path, sizeof path, dir, "config.json");
    const int rc = mf_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

/* Removes the files of dir (not below it) and dir. */
static void remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4400];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && mf_path_join(p, sizeof p, dir, e->d_name)) unlink(p);
        closedir(d);
    }
    rmdir(dir);
}

static bool dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d))) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* A checkpoint appears whole or not at all: it is written into <dir>.tmp.<pid> and renamed to dir, which may
 * exist only as an empty directory (synth never mixes its files with another checkpoint's). */
int mf_synth_write_like(const char *dir, mf_arch arch, mf_synth_size size, const mf_config *like, uint64_t seed,
                        mf_error *err) {
    return mf_synth_write_as(dir, arch, size, like, seed, MF_BF16, err);
}

int mf_synth_write_as(const char *dir, mf_arch arch, mf_synth_size size, const mf_config *like, uint64_t seed,
                      mf_dtype weights, mf_error *err) {
    if (strlen(dir) > 4000) return mf_fail(err, MF_EINVAL, "%s: path too long", dir);
    const mf_arch shape = like ? like->arch : arch;
    if (size < MF_SYNTH_OLMOE_1B_7B && shape > MF_ARCH_DEEPSEEK_V3 && shape != MF_ARCH_GPT_OSS)
        return mf_fail(err, MF_EUNSUPPORTED, "synth writes llama, olmoe, qwen2_moe, mixtral, qwen3_moe, deepseek_v3 "
                       "and gpt_oss checkpoints, not %s", mf_arch_name(shape));
    if (size >= MF_SYNTH_OLMOE_1B_7B && shape == MF_ARCH_DEEPSEEK_V3)
        return mf_fail(err, MF_EUNSUPPORTED, "synth writes deepseek_v3 at the tiny and small sizes (or --like)");
    if (size == MF_SYNTH_SMALL && shape == MF_ARCH_GPT_OSS)
        return mf_fail(err, MF_EUNSUPPORTED, "synth writes gpt_oss at tiny and gpt-oss-20b sizes (not small)");
    if (weights != MF_BF16 && !(weights == MF_F8E4M3 && shape == MF_ARCH_DEEPSEEK_V3 && size < MF_SYNTH_OLMOE_1B_7B))
        return mf_fail(err, MF_EUNSUPPORTED, "synth writes %s weights for deepseek_v3 only (bf16 for every "
                       "architecture)", mf_dtype_name(weights));
    const bool exists = mf_path_exists(dir);
    if (exists && !mf_is_dir(dir)) return mf_fail(err, MF_EINVAL, "%s: exists and is not a directory", dir);
    if (exists && !dir_is_empty(dir))
        return mf_fail(err, MF_EINVAL, "%s: exists and is not empty: synth writes a new checkpoint directory (give another -o)", dir);
    char parent[4096], tmp[4200];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    int rc;
    if (slash && slash != parent) {
        *slash = 0;
        if ((rc = mf_mkdir_p(parent, err))) return rc;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    if (mf_is_dir(tmp)) remove_flat_dir(tmp);   /* a synth killed with our pid (pids repeat) */
    if (mkdir(tmp, 0777) != 0) return mf_fail(err, MF_EIO, "%s: cannot create directory: %s", tmp, strerror(errno));
    rc = shape == MF_ARCH_DEEPSEEK_V3 ? synth_deepseek(tmp, size, like, seed, weights == MF_F8E4M3, err)
                                      : synth_into(tmp, arch, size, like, seed, err);
    if (!rc && exists && rmdir(dir) != 0) rc = mf_fail(err, MF_EIO, "%s: cannot replace the empty directory: %s", dir, strerror(errno));
    if (!rc && rename(tmp, dir) != 0) rc = mf_fail(err, MF_EIO, "%s: cannot rename the checkpoint into place: %s", dir, strerror(errno));
    if (rc) remove_flat_dir(tmp);
    return rc;
}

int mf_synth_write(const char *dir, mf_arch arch, mf_synth_size size, uint64_t seed, mf_error *err) {
    return mf_synth_write_like(dir, arch, size, NULL, seed, err);
}

/* openai/gpt-oss-20b's dimensions (its Hub config.json): 24 layers alternating sliding (128) and full attention,
 * hidden 2880, 64 query and 8 key-value heads of 64, 32 experts of 2880 top-4, vocabulary 201088, YaRN factor 32
 * on 4096 positions with truncate false, rope_theta 150000, swiglu_limit 7. The Hub's experts are MXFP4; these are
 * bf16 (as openai/gpt-oss-20b dequantised), in the fused layout: gate_up_proj [E, H, 2I] (gate the even columns),
 * down_proj [E, I, H], with biases, attention sinks and the router's bias. */
static int synth_gpt_oss(const char *dir, mf_synth_size size, const mf_config *like, uint64_t seed, mf_error *err) {
    int H = 2880, L = 24, nh = 64, nkv = 8, hd = 64, V = 201088, E = 32, K = 4, I = 2880, window = 128;
    const bool big = size >= MF_SYNTH_OLMOE_1B_7B;
    if (like) {   /* --like a gpt_oss checkpoint */
        H = like->hidden, L = like->n_layers, nh = like->n_heads, nkv = like->n_kv_heads, hd = like->head_dim;
        V = like->vocab, E = like->n_experts, K = like->top_k, I = like->moe_intermediate;
        window = like->sliding_window > 0 ? like->sliding_window : 128;
    } else if (!big) {   /* tiny (tests): the fixtures' shape */
        H = 64, L = 3, nh = 4, nkv = 2, hd = 16, V = 384, E = 8, K = 4, I = 32, window = 8;
    }
    const double std = big ? 0.8 / sqrt((double)H) : 0.05;
    json_t *cfg = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string("GptOssForCausalLM"));
    json_object_set_new(cfg, "architectures", archs);
    json_object_set_new(cfg, "model_type", json_string("gpt_oss"));
    json_object_set_new(cfg, "dtype", json_string("bfloat16"));
    json_object_set_new(cfg, "attention_bias", json_true());
    json_object_set_new(cfg, "head_dim", json_integer(hd));
    json_object_set_new(cfg, "hidden_act", json_string("silu"));
    json_object_set_new(cfg, "hidden_size", json_integer(H));
    json_object_set_new(cfg, "intermediate_size", json_integer(I));
    json_t *lt = json_array();
    for (int l = 0; l < L; l++)
        json_array_append_new(lt, json_string(like ? (like->layer_sliding[l] ? "sliding_attention" : "full_attention")
                                                   : l % 2 ? "full_attention" : "sliding_attention"));
    json_object_set_new(cfg, "layer_types", lt);
    json_object_set_new(cfg, "max_position_embeddings", json_integer(131072));
    json_object_set_new(cfg, "num_attention_heads", json_integer(nh));
    json_object_set_new(cfg, "num_experts_per_tok", json_integer(K));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(L));
    json_object_set_new(cfg, "num_key_value_heads", json_integer(nkv));
    json_object_set_new(cfg, "num_local_experts", json_integer(E));
    json_object_set_new(cfg, "rms_norm_eps", json_real(1e-5));
    json_t *rope = json_object();
    json_object_set_new(rope, "beta_fast", json_real(32.0));
    json_object_set_new(rope, "beta_slow", json_real(1.0));
    json_object_set_new(rope, "factor", json_real(32.0));
    json_object_set_new(rope, "original_max_position_embeddings", json_integer(4096));
    json_object_set_new(rope, "rope_type", json_string("yarn"));
    json_object_set_new(rope, "truncate", json_false());
    json_object_set_new(cfg, "rope_scaling", rope);
    json_object_set_new(cfg, "rope_theta", json_integer(150000));
    json_object_set_new(cfg, "sliding_window", json_integer(window));
    json_object_set_new(cfg, "swiglu_limit", json_real(7.0));
    json_object_set_new(cfg, "tie_word_embeddings", json_false());
    json_object_set_new(cfg, "vocab_size", json_integer(V));
    char nm[256];
    int rc = write_config(dir, cfg, err);
    if (rc) return rc;
    synth s = {mf_st_writer_new(), {{0}}, big, seed, 0, false, 0};
    mf_rng_seed(&s.rng, seed);
    W(V, H, "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) {
        NORM(H, "model.layers.%d.input_layernorm.weight", l);
        NORM(H, "model.layers.%d.post_attention_layernorm.weight", l);
        W(nh * hd, H, "model.layers.%d.self_attn.q_proj.weight", l);
        W(nkv * hd, H, "model.layers.%d.self_attn.k_proj.weight", l);
        W(nkv * hd, H, "model.layers.%d.self_attn.v_proj.weight", l);
        W(H, nh * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        BIAS(nh * hd, "model.layers.%d.self_attn.q_proj.bias", l);
        BIAS(nkv * hd, "model.layers.%d.self_attn.k_proj.bias", l);
        BIAS(nkv * hd, "model.layers.%d.self_attn.v_proj.bias", l);
        BIAS(H, "model.layers.%d.self_attn.o_proj.bias", l);
        BIAS(nh, "model.layers.%d.self_attn.sinks", l);
        W(E, H, "model.layers.%d.mlp.router.weight", l);
        BIAS(E, "model.layers.%d.mlp.router.bias", l);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj", l);
        tensor3(&s, nm, E, H, 2 * I, 0.0, std);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        tensor(&s, nm, E, 2 * I, 0.0, 0.1);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj", l);
        tensor3(&s, nm, E, I, H, 0.0, std);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.down_proj_bias", l);
        tensor(&s, nm, E, H, 0.0, 0.1);
    }
    return finish_model(&s, dir, V, H, std, big, err);
}

/* DeepSeek-V2-Lite (deepseek_v2: latent attention without q_lora, softmax greedy router, 2 shared experts) and
 * GLM-4.5-Air (glm4_moe: GQA with biases and half-rotary heads, sigmoid + correction bias router, 1 shared
 * expert) at their Hub dimensions (docs/commands.md#synth cites each config.json). dir NULL: nothing is written;
 * the config text goes to *cfg_text and the parameter count to *params (mf_synth_plan). */
static int synth_family26(const char *dir, mf_synth_size size, uint64_t seed, char **cfg_text, uint64_t *params,
                          mf_error *err) {
    const bool ds = size == MF_SYNTH_DEEPSEEK_V2_LITE;
    /* deepseek-ai/DeepSeek-V2-Lite, zai-org/GLM-4.5-Air */
    const int V = ds ? 102400 : 151552, H = ds ? 2048 : 4096, L = ds ? 27 : 46, nh = ds ? 16 : 96, nkv = ds ? 16 : 8;
    const int I_dense = ds ? 10944 : 10944, I_moe = 1408, E = ds ? 64 : 128, K = ds ? 6 : 8, n_shared = ds ? 2 : 1;
    const int hd = 128, kvr = 512, rope = 64, nope = 128, vd = 128;   /* hd: GLM; the rest DeepSeek's MLA */
    json_t *cfg = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(ds ? "DeepseekV2ForCausalLM" : "Glm4MoeForCausalLM"));
    json_object_set_new(cfg, "architectures", archs);
    json_object_set_new(cfg, "model_type", json_string(ds ? "deepseek_v2" : "glm4_moe"));
    json_object_set_new(cfg, "torch_dtype", json_string("bfloat16"));
    json_object_set_new(cfg, "vocab_size", json_integer(V));
    json_object_set_new(cfg, "hidden_size", json_integer(H));
    json_object_set_new(cfg, "intermediate_size", json_integer(I_dense));
    json_object_set_new(cfg, "moe_intermediate_size", json_integer(I_moe));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(L));
    json_object_set_new(cfg, "num_attention_heads", json_integer(nh));
    json_object_set_new(cfg, "num_key_value_heads", json_integer(nkv));
    json_object_set_new(cfg, "n_routed_experts", json_integer(E));
    json_object_set_new(cfg, "n_shared_experts", json_integer(n_shared));
    json_object_set_new(cfg, "num_experts_per_tok", json_integer(K));
    json_object_set_new(cfg, "first_k_dense_replace", json_integer(1));
    json_object_set_new(cfg, "moe_layer_freq", json_integer(1));
    json_object_set_new(cfg, "n_group", json_integer(1));
    json_object_set_new(cfg, "topk_group", json_integer(1));
    json_object_set_new(cfg, "norm_topk_prob", json_boolean(!ds));
    json_object_set_new(cfg, "routed_scaling_factor", json_real(1.0));
    json_object_set_new(cfg, "hidden_act", json_string("silu"));
    json_object_set_new(cfg, "rms_norm_eps", json_real(ds ? 1e-6 : 1e-5));
    json_object_set_new(cfg, "tie_word_embeddings", json_false());
    json_object_set_new(cfg, "attention_bias", json_boolean(!ds));
    if (ds) {
        json_object_set_new(cfg, "q_lora_rank", json_null());
        json_object_set_new(cfg, "kv_lora_rank", json_integer(kvr));
        json_object_set_new(cfg, "qk_rope_head_dim", json_integer(rope));
        json_object_set_new(cfg, "qk_nope_head_dim", json_integer(nope));
        json_object_set_new(cfg, "v_head_dim", json_integer(vd));
        json_object_set_new(cfg, "topk_method", json_string("greedy"));
        json_object_set_new(cfg, "scoring_func", json_string("softmax"));
        json_object_set_new(cfg, "max_position_embeddings", json_integer(163840));
        json_object_set_new(cfg, "rope_theta", json_integer(10000));
        json_t *y = json_object();
        json_object_set_new(y, "type", json_string("yarn"));
        json_object_set_new(y, "factor", json_integer(40));
        json_object_set_new(y, "original_max_position_embeddings", json_integer(4096));
        json_object_set_new(y, "beta_fast", json_integer(32));
        json_object_set_new(y, "beta_slow", json_integer(1));
        json_object_set_new(y, "mscale", json_real(0.707));
        json_object_set_new(y, "mscale_all_dim", json_real(0.707));
        json_object_set_new(cfg, "rope_scaling", y);
    } else {
        json_object_set_new(cfg, "head_dim", json_integer(hd));
        json_object_set_new(cfg, "partial_rotary_factor", json_real(0.5));
        json_object_set_new(cfg, "use_qk_norm", json_false());
        json_object_set_new(cfg, "max_position_embeddings", json_integer(131072));
        json_object_set_new(cfg, "rope_theta", json_integer(1000000));
        json_object_set_new(cfg, "rope_scaling", json_null());
    }
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(cfg);
    int rc = MF_OK;
    char path[4096], nm[256];
    if (dir) {
        mf_path_join(path, sizeof path, dir, "config.json");
        rc = mf_write_file_atomic(path, text, strlen(text), err);
        free(text);
        if (rc) return rc;
    } else {
        *cfg_text = text;
    }
    const double std = 0.8 / sqrt((double)H);
    synth s = {dir ? mf_st_writer_new() : NULL, {{0}}, true, seed, 0, !dir, 0};
    mf_rng_seed(&s.rng, seed);
    W(V, H, "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) {
        NORM(H, "model.layers.%d.input_layernorm.weight", l);
        NORM(H, "model.layers.%d.post_attention_layernorm.weight", l);
        if (ds) {
            W(nh * (nope + rope), H, "model.layers.%d.self_attn.q_proj.weight", l);
            W(kvr + rope, H, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l);
            NORM(kvr, "model.layers.%d.self_attn.kv_a_layernorm.weight", l);
            W(nh * (nope + vd), kvr, "model.layers.%d.self_attn.kv_b_proj.weight", l);
            W(H, nh * vd, "model.layers.%d.self_attn.o_proj.weight", l);
        } else {
            W(nh * hd, H, "model.layers.%d.self_attn.q_proj.weight", l);
            W(nkv * hd, H, "model.layers.%d.self_attn.k_proj.weight", l);
            W(nkv * hd, H, "model.layers.%d.self_attn.v_proj.weight", l);
            BIAS(nh * hd, "model.layers.%d.self_attn.q_proj.bias", l);
            BIAS(nkv * hd, "model.layers.%d.self_attn.k_proj.bias", l);
            BIAS(nkv * hd, "model.layers.%d.self_attn.v_proj.bias", l);
            W(H, nh * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        }
        if (l < 1) {   /* first_k_dense_replace */
            W(I_dense, H, "model.layers.%d.mlp.gate_proj.weight", l);
            W(I_dense, H, "model.layers.%d.mlp.up_proj.weight", l);
            W(H, I_dense, "model.layers.%d.mlp.down_proj.weight", l);
            continue;
        }
        W(E, H, "model.layers.%d.mlp.gate.weight", l);
        if (!ds) BIAS(E, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        for (int e = 0; e < E; e++) {
            W(I_moe, H, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            W(I_moe, H, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            W(H, I_moe, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
        }
        W(n_shared * I_moe, H, "model.layers.%d.mlp.shared_experts.gate_proj.weight", l);
        W(n_shared * I_moe, H, "model.layers.%d.mlp.shared_experts.up_proj.weight", l);
        W(H, n_shared * I_moe, "model.layers.%d.mlp.shared_experts.down_proj.weight", l);
    }
    rc = finish_model(&s, dir, V, H, std, true, err);
    if (!dir) *params = s.params;
    return rc;
}

int mf_synth_plan(mf_synth_size size, char **config_json, uint64_t *n_params, mf_error *err) {
    *config_json = NULL;
    *n_params = 0;
    if (size != MF_SYNTH_DEEPSEEK_V2_LITE && size != MF_SYNTH_GLM45_AIR)
        return mf_fail(err, MF_EUNSUPPORTED, "mf_synth_plan: only deepseek-v2-lite and glm-4.5-air are planned");
    return synth_family26(NULL, size, 0, config_json, n_params, err);
}

static int synth_into(const char *dir, mf_arch arch, mf_synth_size size, const mf_config *like, uint64_t seed,
                      mf_error *err) {
    if (size == MF_SYNTH_DEEPSEEK_V2_LITE || size == MF_SYNTH_GLM45_AIR) return synth_family26(dir, size, seed, NULL, NULL, err);
    if (size == MF_SYNTH_GPT_OSS_20B || (like ? like->arch : arch) == MF_ARCH_GPT_OSS)
        return synth_gpt_oss(dir, size == MF_SYNTH_GPT_OSS_20B ? size : MF_SYNTH_TINY, like, seed, err);
    const bool small = size == MF_SYNTH_SMALL;
    int H = small ? 256 : 64, L = small ? 4 : 3, nh = 4, V = small ? 4096 : 384;
    int nkv = (arch == MF_ARCH_OLMOE) ? nh : 2, hd = H / nh;
    int E = arch == MF_ARCH_MIXTRAL ? 8 : 16, K = arch == MF_ARCH_MIXTRAL ? 2 : 4;
    int I_moe = small ? 224 : 32, I_dense = small ? 688 : 128, I_shared = small ? 512 : 96;
    if (like) {   /* the shape of an existing model, with random weights */
        arch = like->arch;
        H = like->hidden;
        L = like->n_layers;
        nh = like->n_heads;
        nkv = like->n_kv_heads;
        hd = like->head_dim;
        V = like->vocab;
        if (like->n_experts) {
            E = like->n_experts;
            K = like->top_k;
            I_moe = like->moe_intermediate;
        }
        I_dense = like->intermediate;
        if (like->shared_intermediate) I_shared = like->shared_intermediate;
    }
    const bool big = size >= MF_SYNTH_OLMOE_1B_7B;
    if (size == MF_SYNTH_OLMOE_1B_7B) {   /* allenai/OLMoE-1B-7B-0924 */
        arch = MF_ARCH_OLMOE;
        H = 2048, L = 16, nh = 16, nkv = 16, hd = 128, V = 50304, E = 64, K = 8, I_moe = 1024, I_dense = 1024;
    } else if (size == MF_SYNTH_QWEN15_MOE_A27B) {   /* Qwen/Qwen1.5-MoE-A2.7B */
        arch = MF_ARCH_QWEN2_MOE;
        H = 2048, L = 24, nh = 16, nkv = 16, hd = 128, V = 151936, E = 60, K = 4, I_moe = 1408, I_dense = 5632,
        I_shared = 5632;
    } else if (size == MF_SYNTH_MIXTRAL_8X7B) {   /* mistralai/Mixtral-8x7B-v0.1 */
        arch = MF_ARCH_MIXTRAL;
        H = 4096, L = 32, nh = 32, nkv = 8, hd = 128, V = 32000, E = 8, K = 2, I_moe = 14336, I_dense = 14336;
    }
    /* random weights of deviation 0.05 keep activations bounded in the tiny
     * models; at real widths the deviation shrinks as 1/sqrt(hidden) */
    const double std = big ? 0.8 / sqrt((double)H) : 0.05;
    const mf_arch_desc *d = &mf_arch_table[arch];
    int rc;

    json_t *cfg = json_object();
    static const char *classes[MF_ARCH_COUNT] = {"LlamaForCausalLM", "OlmoeForCausalLM", "Qwen2MoeForCausalLM",
                                                 "MixtralForCausalLM", "Qwen3MoeForCausalLM"};
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(classes[arch]));
    json_object_set_new(cfg, "architectures", archs);
    json_object_set_new(cfg, "model_type", json_string(d->model_type));
    json_object_set_new(cfg, "dtype", json_string("bfloat16"));
    json_object_set_new(cfg, "vocab_size", json_integer(V));
    json_object_set_new(cfg, "hidden_size", json_integer(H));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(L));
    json_object_set_new(cfg, "num_attention_heads", json_integer(nh));
    json_object_set_new(cfg, "num_key_value_heads", json_integer(nkv));
    json_object_set_new(cfg, "head_dim", json_integer(hd));
    json_object_set_new(cfg, "hidden_act", json_string("silu"));
    json_object_set_new(cfg, "max_position_embeddings", json_integer(4096));
    json_object_set_new(cfg, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(cfg, "tie_word_embeddings", json_false());
    json_t *rope = json_object();
    json_object_set_new(rope, "rope_type", json_string("default"));
    json_object_set_new(rope, "rope_theta", json_real(arch == MF_ARCH_LLAMA ? 500000.0 : 10000.0));
    json_object_set_new(cfg, "rope_parameters", rope);
    json_object_set_new(cfg, "intermediate_size", json_integer(arch == MF_ARCH_OLMOE || arch == MF_ARCH_MIXTRAL ? I_moe : I_dense));
    if (d->is_moe) {
        json_object_set_new(cfg, arch == MF_ARCH_MIXTRAL ? "num_local_experts" : "num_experts", json_integer(E));
        json_object_set_new(cfg, "num_experts_per_tok", json_integer(K));
        if (arch != MF_ARCH_MIXTRAL) json_object_set_new(cfg, "norm_topk_prob", json_boolean(arch == MF_ARCH_QWEN3_MOE));
        if (arch == MF_ARCH_QWEN2_MOE || arch == MF_ARCH_QWEN3_MOE)
            json_object_set_new(cfg, "moe_intermediate_size", json_integer(I_moe));
        if (arch == MF_ARCH_QWEN2_MOE) {
            json_object_set_new(cfg, "shared_expert_intermediate_size", json_integer(I_shared));
            json_object_set_new(cfg, "qkv_bias", json_true());
        }
    }
    char nm[256];
    rc = write_config(dir, cfg, err);
    if (rc) return rc;

    synth s = {mf_st_writer_new(), {{0}}, big, seed, 0, false, 0};
    mf_rng_seed(&s.rng, seed);
    W(V, H, "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) {
        NORM(H, "model.layers.%d.input_layernorm.weight", l);
        NORM(H, "model.layers.%d.post_attention_layernorm.weight", l);
        W(nh * hd, H, "model.layers.%d.self_attn.q_proj.weight", l);
        W(nkv * hd, H, "model.layers.%d.self_attn.k_proj.weight", l);
        W(nkv * hd, H, "model.layers.%d.self_attn.v_proj.weight", l);
        W(H, nh * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        if (arch == MF_ARCH_QWEN2_MOE) {
            BIAS(nh * hd, "model.layers.%d.self_attn.q_proj.bias", l);
            BIAS(nkv * hd, "model.layers.%d.self_attn.k_proj.bias", l);
            BIAS(nkv * hd, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (arch == MF_ARCH_OLMOE) {
            NORM(nh * hd, "model.layers.%d.self_attn.q_norm.weight", l);
            NORM(nkv * hd, "model.layers.%d.self_attn.k_norm.weight", l);
        } else if (arch == MF_ARCH_QWEN3_MOE) {
            NORM(hd, "model.layers.%d.self_attn.q_norm.weight", l);
            NORM(hd, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        if (!d->is_moe) {
            W(I_dense, H, "model.layers.%d.mlp.gate_proj.weight", l);
            W(I_dense, H, "model.layers.%d.mlp.up_proj.weight", l);
            W(H, I_dense, "model.layers.%d.mlp.down_proj.weight", l);
            continue;
        }
        const char *pre = arch == MF_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
        W(E, H, "model.layers.%d.%s.gate.weight", l, pre);
        for (int e = 0; e < E; e++) {
            if (arch == MF_ARCH_MIXTRAL) {
                W(I_moe, H, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
                W(H, I_moe, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
                W(I_moe, H, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
            } else {
                W(I_moe, H, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                W(I_moe, H, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                W(H, I_moe, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            }
        }
        if (arch == MF_ARCH_QWEN2_MOE) {
            W(I_shared, H, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
            W(I_shared, H, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
            W(H, I_shared, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
            W(1, H, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        }
    }
    return finish_model(&s, dir, V, H, std, small || big, err);
}

/* prompts: tiny: three short sequences; small: four of 512 tokens (pp512) */
static int write_prompts(const char *dir, mf_rng *rng, bool long_ones, int V, mf_error *err) {
    const int nseq = long_ones ? 4 : 3;
    static const int tiny_len[3] = {21, 13, 34};
    mf_buf out = {0};
    for (int q = 0; q < nseq; q++) {
        int T = long_ones ? 512 : tiny_len[q];
        mf_buf_printf(&out, "{\"id\": \"s%d\", \"tokens\": [", q);
        for (int t = 0; t < T; t++) mf_buf_printf(&out, t ? ", %d" : "%d", (int)(mf_rng_next(rng) % (uint64_t)V));
        mf_buf_puts(&out, "]}\n");
    }
    char path[4096];
    mf_path_join(path, sizeof path, dir, "tokens.jsonl");
    int rc = mf_write_file_atomic(path, out.s, out.n, err);
    mf_buf_free(&out);
    return rc;
}

/* ---- deepseek_v3 (latent attention, grouped sigmoid router, shared experts; bf16 or FP8) --------------------- */

/* x (|x| <= 448) as the nearest e4m3fn code, ties to even (a value of 3 fraction bits, exponent >= -6). */
static uint8_t e4m3_code(double x) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = mf_round_to_format(fabs(x), 3, -6, 8);
    if (a > 448) a = 448;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    e -= 1;   /* a = 1.m x 2^e */
    if (e < -6) return sign | (uint8_t)(a * 512.0);   /* subnormal: m x 2^-9 */
    return sign | (uint8_t)((e + 7) << 3) | (uint8_t)((ldexp(a, -e) - 1.0) * 8.0);
}

/* A linear weight [rows, cols]: bf16, or FP8 as DeepSeek-V3 stores it: per block of b0 x b1 values the scale
 * amax / 448 as an F32 "<name>_scale_inv" [ceil(rows / b0), ceil(cols / b1)], each value the e4m3 code of
 * value / scale (so code x scale_inv is the value, to e4m3's precision). */
static void linear_w(synth *s, const char *name, int64_t rows, int64_t cols, double std, const int *fp8_block) {
    if (!fp8_block) {
        tensor(s, name, rows, cols, 0.0, std);
        return;
    }
    const int b0 = fp8_block[0], b1 = fp8_block[1];
    const int64_t sr = (rows + b0 - 1) / b0, sc = (cols + b1 - 1) / b1;
    const size_t n = (size_t)rows * (size_t)cols;
    double *v = mf_xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) v[i] = std * mf_rng_normal(&s->rng);
    float *scale = mf_xcalloc((size_t)(sr * sc), sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float *m = &scale[(r / b0) * sc + c / b1];
            *m = fmaxf(*m, (float)fabs(v[r * cols + c]));
        }
    for (int64_t i = 0; i < sr * sc; i++) scale[i] = scale[i] > 0 ? scale[i] / 448.0f : 1.0f;
    uint8_t *q = mf_xmalloc(n);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = e4m3_code(v[r * cols + c] / scale[(r / b0) * sc + c / b1]);
    const int64_t shape[2] = {rows, cols}, sshape[2] = {sr, sc};
    char nm[512];
    snprintf(nm, sizeof nm, "%s_scale_inv", name);
    mf_st_writer_add(s->st, name, MF_F8E4M3, 2, shape, q);
    mf_st_writer_add(s->st, nm, MF_F32, 2, sshape, scale);
    free(v);
    free(q);
    free(scale);
}

/* first_k_dense_replace of a deepseek config: its leading dense layers */
static int leading_dense(const mf_config *c) {
    int k = 0;
    while (k < c->n_layers && !c->layer_is_moe[k]) k++;
    return k;
}

static int synth_deepseek(const char *dir, mf_synth_size size, const mf_config *like, uint64_t seed, bool fp8,
                          mf_error *err) {
    const bool small = size == MF_SYNTH_SMALL;
    /* tiny: the dimensions of tests/fixtures/hf26/deepseek_v3; small: hidden 256, 4 layers */
    int H = small ? 256 : 64, L = small ? 4 : 3, nh = 4, V = small ? 4096 : 384, q_lora = small ? 128 : 32,
        kv_lora = small ? 128 : 32, nope = small ? 32 : 24, rope_d = small ? 32 : 16, vd = small ? 32 : 20,
        E = 16, K = 4, I_moe = small ? 224 : 32, I_dense = small ? 688 : 96, n_shared = 1, G = 4, TG = 2, fkd = 1;
    int block[2] = {small ? 128 : 16, small ? 128 : 16};
    double scaling = 2.5;
    if (like) {
        H = like->hidden, L = like->n_layers, nh = like->n_heads, V = like->vocab, q_lora = like->q_lora_rank;
        kv_lora = like->kv_lora_rank, nope = like->qk_nope_dim, rope_d = like->qk_rope_dim, vd = like->v_head_dim;
        E = like->n_experts, K = like->top_k, I_moe = like->moe_intermediate, I_dense = like->intermediate;
        n_shared = like->n_shared_experts, G = like->n_group, TG = like->topk_group, fkd = leading_dense(like);
        scaling = like->routed_scaling;
        if (like->fp8_block[0] > 0) block[0] = like->fp8_block[0], block[1] = like->fp8_block[1];
        else block[0] = block[1] = 128;
    }
    const double std = 0.05;
    const int *fb = fp8 ? block : NULL;
    json_t *cfg = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string("DeepseekV3ForCausalLM"));
    json_object_set_new(cfg, "architectures", archs);
    json_object_set_new(cfg, "model_type", json_string("deepseek_v3"));
    json_object_set_new(cfg, "dtype", json_string("bfloat16"));
    json_object_set_new(cfg, "vocab_size", json_integer(V));
    json_object_set_new(cfg, "hidden_size", json_integer(H));
    json_object_set_new(cfg, "intermediate_size", json_integer(I_dense));
    json_object_set_new(cfg, "moe_intermediate_size", json_integer(I_moe));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(L));
    json_object_set_new(cfg, "num_attention_heads", json_integer(nh));
    json_object_set_new(cfg, "num_key_value_heads", json_integer(nh));
    json_object_set_new(cfg, "q_lora_rank", q_lora > 0 ? json_integer(q_lora) : json_null());
    json_object_set_new(cfg, "kv_lora_rank", json_integer(kv_lora));
    json_object_set_new(cfg, "qk_nope_head_dim", json_integer(nope));
    json_object_set_new(cfg, "qk_rope_head_dim", json_integer(rope_d));
    json_object_set_new(cfg, "v_head_dim", json_integer(vd));
    json_object_set_new(cfg, "n_routed_experts", json_integer(E));
    json_object_set_new(cfg, "num_experts_per_tok", json_integer(K));
    json_object_set_new(cfg, "n_shared_experts", json_integer(n_shared));
    json_object_set_new(cfg, "n_group", json_integer(G));
    json_object_set_new(cfg, "topk_group", json_integer(TG));
    json_object_set_new(cfg, "first_k_dense_replace", json_integer(fkd));
    json_object_set_new(cfg, "routed_scaling_factor", json_real(scaling));
    json_object_set_new(cfg, "norm_topk_prob", json_true());
    json_object_set_new(cfg, "hidden_act", json_string("silu"));
    json_object_set_new(cfg, "max_position_embeddings", json_integer(4096));
    json_object_set_new(cfg, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(cfg, "tie_word_embeddings", json_false());
    json_object_set_new(cfg, "rope_interleave", json_true());
    json_t *rope = json_object();
    json_object_set_new(rope, "rope_type", json_string("default"));
    json_object_set_new(rope, "rope_theta", json_real(10000.0));
    json_object_set_new(cfg, "rope_parameters", rope);
    if (fp8) {   /* DeepSeek-V3's own quantization_config */
        json_t *qc = json_object(), *wbs = json_array();
        json_object_set_new(qc, "activation_scheme", json_string("dynamic"));
        json_object_set_new(qc, "fmt", json_string("e4m3"));
        json_object_set_new(qc, "quant_method", json_string("fp8"));
        json_array_append_new(wbs, json_integer(block[0]));
        json_array_append_new(wbs, json_integer(block[1]));
        json_object_set_new(qc, "weight_block_size", wbs);
        json_object_set_new(cfg, "quantization_config", qc);
    }
    char nm[256];
    int rc = write_config(dir, cfg, err);
    if (rc) return rc;

    synth s = {mf_st_writer_new(), {{0}}, false, seed, 0, false, 0};
    mf_rng_seed(&s.rng, seed);
#define LW(rows, cols, ...) (snprintf(nm, sizeof nm, __VA_ARGS__), linear_w(&s, nm, rows, cols, std, fb))
    W(V, H, "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) {
        NORM(H, "model.layers.%d.input_layernorm.weight", l);
        NORM(H, "model.layers.%d.post_attention_layernorm.weight", l);
        if (q_lora > 0) {
            LW(q_lora, H, "model.layers.%d.self_attn.q_a_proj.weight", l);
            NORM(q_lora, "model.layers.%d.self_attn.q_a_layernorm.weight", l);
            LW(nh * (nope + rope_d), q_lora, "model.layers.%d.self_attn.q_b_proj.weight", l);
        } else {
            LW(nh * (nope + rope_d), H, "model.layers.%d.self_attn.q_proj.weight", l);
        }
        LW(kv_lora + rope_d, H, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l);
        NORM(kv_lora, "model.layers.%d.self_attn.kv_a_layernorm.weight", l);
        LW(nh * (nope + vd), kv_lora, "model.layers.%d.self_attn.kv_b_proj.weight", l);
        LW(H, nh * vd, "model.layers.%d.self_attn.o_proj.weight", l);
        if (l < fkd) {
            LW(I_dense, H, "model.layers.%d.mlp.gate_proj.weight", l);
            LW(I_dense, H, "model.layers.%d.mlp.up_proj.weight", l);
            LW(H, I_dense, "model.layers.%d.mlp.down_proj.weight", l);
            continue;
        }
        W(E, H, "model.layers.%d.mlp.gate.weight", l);   /* the router stays bf16, its bias fp32 */
        float *bias = mf_xmalloc((size_t)E * sizeof(float));
        for (int e = 0; e < E; e++) bias[e] = (float)(0.01 * mf_rng_normal(&s.rng));
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        mf_st_writer_add(s.st, nm, MF_F32, 1, (const int64_t[1]){E}, bias);
        free(bias);
        for (int e = 0; e < E; e++) {
            LW(I_moe, H, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            LW(I_moe, H, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            LW(H, I_moe, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
        }
        if (n_shared > 0) {
            LW(n_shared * I_moe, H, "model.layers.%d.mlp.shared_experts.gate_proj.weight", l);
            LW(n_shared * I_moe, H, "model.layers.%d.mlp.shared_experts.up_proj.weight", l);
            LW(H, n_shared * I_moe, "model.layers.%d.mlp.shared_experts.down_proj.weight", l);
        }
    }
#undef LW
    return finish_model(&s, dir, V, H, std, small, err);
}
