/* moeflip models: config.json (transformers v4 and v5 spellings), safetensors
 * files (single or sharded), the architecture registry, and loaded models.
 *
 * Adding an architecture: one entry in models/archs.c (its model_type, class
 * defaults, which attention and MoE variants it uses, and its tensor names);
 * the loader and the runtime read only the resulting mf_config and mf_model. */
#ifndef MF_MODELS_H
#define MF_MODELS_H

#include "mf_core.h"
#include "mf_numerics.h"

/* ---- safetensors ------------------------------------------------------- */

#define MF_MAX_DIMS 8

typedef struct mf_st_tensor {
    char *name;
    mf_dtype dtype;
    int ndim;
    int64_t shape[MF_MAX_DIMS];
    const uint8_t *data;   /* points into the mapped file (NULL when only the header was read) */
    size_t nbytes;
    size_t offset;         /* of the data in the file */
} mf_st_tensor;

typedef struct mf_st_file {
    char *path;
    mf_mmap map;
    mf_st_tensor *tensors;   /* sorted by name */
    size_t count;
    char *metadata_json;     /* the "__metadata__" object as JSON text, or NULL */
    /* the file's identity when it was opened (device, inode, size, and the
     * modification and change times to the nanosecond): what the weights
     * digest cache is keyed by */
    char identity[128];
} mf_st_file;

/* Maps a .safetensors file and validates its header completely: length,
 * JSON, every dtype, shape and data range, and that the ranges tile the data
 * region with no gap and no overlap. */
int mf_st_open(mf_st_file **out, const char *path, mf_error *err);
/* The same validation from the header alone, read with pread: nothing is
 * mapped (map.data NULL, map.size the file's size, tensors' data NULL). */
int mf_st_open_header(mf_st_file **out, const char *path, mf_error *err);
void mf_st_close(mf_st_file *f);
const mf_st_tensor *mf_st_find(const mf_st_file *f, const char *name);
int64_t mf_st_numel(const mf_st_tensor *t);

/* Writer: tensors are copied in; write() replaces the file atomically. */
typedef struct mf_st_writer mf_st_writer;
mf_st_writer *mf_st_writer_new(void);
void mf_st_writer_free(mf_st_writer *w);
/* shape has ndim entries; data holds numel * dtype size bytes. */
void mf_st_writer_add(mf_st_writer *w, const char *name, mf_dtype dtype, int ndim, const int64_t *shape,
                      const void *data);
/* A tensor whose bytes fill(ud, dst, nbytes) makes when the file is written
 * (ud: up to 64 bytes, copied), so the writer holds one such tensor at a time. */
typedef void (*mf_st_fill_fn)(const void *ud, void *dst, size_t nbytes);
void mf_st_writer_add_generated(mf_st_writer *w, const char *name, mf_dtype dtype, int ndim, const int64_t *shape,
                                mf_st_fill_fn fill, const void *ud, size_t ud_size);
void mf_st_writer_meta(mf_st_writer *w, const char *key, const char *value);
size_t mf_st_writer_bytes(const mf_st_writer *w);
int mf_st_writer_write(mf_st_writer *w, const char *path, mf_error *err);

/* A checkpoint directory: model.safetensors, or shards listed by
 * model.safetensors.index.json. */
/* A tensor's entry in the sharded index: which file holds it. */
typedef struct mf_ckpt_entry {
    const char *name;   /* the file's own copy of the tensor's name */
    size_t file;
} mf_ckpt_entry;

typedef struct mf_checkpoint {
    char *dir;
    mf_st_file **files;
    size_t nfiles;
    char weights_digest[33];   /* over the files' bytes, in file-name order */
    /* every tensor of every file, sorted by name; with an index, each where the
     * index says it is (a tensor anywhere else, or in no index entry, is refused) */
    mf_ckpt_entry *entries;
    size_t n_entries;
} mf_checkpoint;

/* Maps the files, validates their headers and computes the weights digest
 * (reading the files, not faulting in the mapping). */
int mf_checkpoint_open(mf_checkpoint **out, const char *dir, mf_error *err);
/* The same without the digest (weights_digest is "" until mf_checkpoint_digest
 * or mf_checkpoint_digest_finish). */
int mf_checkpoint_open_deferred(mf_checkpoint **out, const char *dir, mf_error *err);
/* The files' headers only, validated (nothing mapped: tensors' data NULL). */
int mf_checkpoint_open_headers(mf_checkpoint **out, const char *dir, mf_error *err);
/* Computes the weights digest now (a no-op when it is known). Each file's
 * XXH3-128 is kept in a cache ($MOEFLIP_CACHE_DIR, else $XDG_CACHE_HOME/moeflip,
 * else ~/.cache/moeflip: weights-digests), keyed by the file's device, inode,
 * size, modification and change times (any write changes the change time),
 * so a checkpoint is hashed once; MOEFLIP_DIGEST_CACHE=0 turns it off. Opening
 * a checkpoint (deferred or not) takes the digest from the cache when every
 * file is there. */
int mf_checkpoint_digest(mf_checkpoint *c, mf_error *err);
/* Sets the weights digest from each file's XXH3-128 (hex, c->files order),
 * for a caller that hashed the files as it read them. */
void mf_checkpoint_digest_finish(mf_checkpoint *c, char (*file_hex)[33]);
/* The bytes of all the checkpoint's files. */
uint64_t mf_checkpoint_bytes(const mf_checkpoint *c);
void mf_checkpoint_close(mf_checkpoint *c);
/* The tensor, or NULL when absent: from the file the index names for it (one
 * file only, without an index). */
const mf_st_tensor *mf_checkpoint_find(const mf_checkpoint *c, const char *name);

/* ---- configuration ---------------------------------------------------- */

typedef enum mf_arch {
    MF_ARCH_LLAMA, MF_ARCH_OLMOE, MF_ARCH_QWEN2_MOE, MF_ARCH_MIXTRAL, MF_ARCH_QWEN3_MOE,
    MF_ARCH_DEEPSEEK_V3, MF_ARCH_DEEPSEEK_V2, MF_ARCH_GLM4_MOE, MF_ARCH_GPT_OSS, MF_ARCH_COUNT
} mf_arch;

/* How attention projects its queries, keys and values. */
typedef enum mf_attn_kind {
    MF_ATTN_GQA,   /* q/k/v/o projections, grouped key-value heads (Llama and the others) */
    MF_ATTN_MLA,   /* DeepSeek's multi-head latent attention: low-rank q (or q_proj), kv_a -> kv_b, a shared rope key */
} mf_attn_kind;

/* Which dims of a head rotate, and how. */
typedef enum mf_rope_style {
    MF_ROPE_HALF,          /* rotate_half on the first rope_dim dims: element i pairs with i + rope_dim/2 */
    MF_ROPE_DEINTERLEAVE,  /* DeepSeek-V3 rope_interleave: pairs (2i, 2i+1), written de-interleaved, then rotate_half */
    MF_ROPE_COMPLEX,       /* DeepSeek-V2: pairs (2i, 2i+1) times e^(i theta) in fp32, written interleaved, one rounding */
} mf_rope_style;

typedef enum mf_rope_type {
    MF_ROPE_DEFAULT, MF_ROPE_LINEAR, MF_ROPE_DYNAMIC, MF_ROPE_LLAMA3, MF_ROPE_YARN
} mf_rope_type;

typedef enum mf_qk_norm {
    MF_QK_NORM_NONE,
    MF_QK_NORM_FULL,       /* OLMoE: RMSNorm over the whole q (k) projection, before the head split */
    MF_QK_NORM_PER_HEAD,   /* Qwen3: RMSNorm over each head's head_dim values */
} mf_qk_norm;

typedef enum mf_route_rule {
    MF_ROUTE_SOFTMAX_TOPK,        /* softmax over experts, top-k; renormalise iff norm_topk_prob */
    MF_ROUTE_SOFTMAX_TOPK_RENORM, /* Mixtral: always renormalise the top-k */
    MF_ROUTE_SIGMOID_GROUP,       /* DeepSeek-V3, GLM-4.5: sigmoid + correction bias, best groups, top-k; scaled */
    MF_ROUTE_SOFTMAX_GREEDY,      /* DeepSeek-V2: softmax, top-k (optionally within the best groups); scaled */
    MF_ROUTE_TOPK_SOFTMAX,        /* gpt-oss: top-k of the (biased) logits, softmax over those k */
} mf_route_rule;

typedef struct mf_rope {
    mf_rope_type type;
    double theta;
    double factor;
    double low_freq_factor, high_freq_factor;   /* llama3 */
    int original_max_pos;                        /* llama3, yarn (0: use max_position_embeddings) */
    double beta_fast, beta_slow;                 /* yarn */
    double mscale, mscale_all_dim;               /* yarn */
    double attention_factor;                     /* yarn: 0 = derive */
    bool truncate;                               /* yarn */
    double partial_rotary_factor;
} mf_rope;

#define MF_MAX_LAYERS 512
#define MF_MAX_EXPERTS 1024   /* a diff keeps an experts x experts table per target */
#define MF_MAX_TOP_K 64       /* experts chosen per token */

typedef struct mf_config {
    mf_arch arch;
    char model_type[64];
    int vocab, hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim;
    int max_pos;
    double rms_eps;
    mf_rope rope;
    mf_act act;
    bool tie_embeddings;
    bool attn_bias_qkv, attn_bias_o, mlp_bias;
    mf_qk_norm qk_norm;
    double clip_qkv;                 /* 0: none */
    mf_attn_kind attn;
    int rope_dim;                    /* dims of a head that rotate: head_dim * partial_rotary_factor; MLA: qk_rope */
    mf_rope_style rope_style;
    double attn_scale;               /* the softmax scale, as transformers computes it (head_dim ** -0.5 but for MLA) */
    /* MLA (attn == MF_ATTN_MLA): head_dim is qk_rope_dim, as transformers sets it */
    int q_lora_rank;                 /* 0: q_proj straight from the hidden state */
    int kv_lora_rank, qk_rope_dim, qk_nope_dim, v_head_dim;
    bool attn_bias_lora;             /* attention_bias: biases on q_a_proj, kv_a_proj_with_mqa and o_proj */
    /* MoE */
    int n_experts, top_k, moe_intermediate, shared_intermediate;
    bool norm_topk_prob;
    mf_route_rule route_rule;
    bool has_shared_expert;          /* Qwen2-MoE: a shared expert behind a sigmoid gate (recorded as shared_gate) */
    int n_shared_experts;            /* DeepSeek/GLM: shared experts of moe_intermediate each, added ungated */
    /* grouped and scaled routers (MF_ROUTE_SIGMOID_GROUP, MF_ROUTE_SOFTMAX_GREEDY) */
    int n_group, topk_group;         /* n_group 1: no group restriction */
    bool group_limited;              /* DeepSeek-V2 topk_method group_limited_greedy */
    double routed_scaling;           /* routed_scaling_factor */
    bool layer_is_moe[MF_MAX_LAYERS];
    int n_moe_layers;
    int sliding_window;              /* 0: none */
    bool layer_sliding[MF_MAX_LAYERS];
    /* quantization_config: DeepSeek-V3's fine-grained FP8 (quant_method fp8, fmt e4m3): linear weights stored
     * F8_E4M3 with an F32 weight_scale_inv per fp8_block[0] x fp8_block[1] block; 0 0 when not quantized */
    int fp8_block[2];
    /* gpt-oss (MF_ARCH_GPT_OSS) */
    bool attn_sinks;                 /* a learned logit per head in each softmax's denominator (self_attn.sinks) */
    bool clamped_swiglu;             /* experts: gate clamped above, up both sides at swiglu_limit, then
                                      * (up + 1) * gate * sigmoid(swiglu_alpha * gate); biases on every projection */
    double swiglu_alpha, swiglu_limit;
    bool norm_weight_fp32;           /* RMSNorm returns (w * y32) cast once (gpt-oss), not w * y32.to(dtype) (Llama) */
    bool mxfp4;                      /* quantization_config quant_method mxfp4: experts as *_blocks and *_scales */
    char digest[33];                 /* of config.json's bytes */
} mf_config;

int mf_config_load(mf_config *cfg, const char *path, mf_error *err);
/* Parses config JSON text; `origin` names it in messages. */
int mf_config_parse(mf_config *cfg, const char *json_text, size_t len, const char *origin, mf_error *err);
const char *mf_arch_name(mf_arch a);
/* "llama, olmoe, ..." for messages. */
const char *mf_arch_list(void);
int mf_arch_from_name(const char *model_type);   /* -1 when unknown */

/* ---- loaded model ------------------------------------------------------ */

typedef struct mf_layer {
    double *attn_norm, *ffn_norm;
    mf_linear q, k, v, o;
    double *q_norm, *k_norm;          /* qk_norm weights, or NULL */
    bool is_moe;
    mf_linear mlp_gate, mlp_up, mlp_down;    /* dense layers */
    mf_linear router;                         /* [E, H] */
    mf_linear *exp_gate, *exp_up, *exp_down;  /* E each */
    mf_linear sh_gate, sh_up, sh_down, sh_router;   /* shared expert (or experts) and Qwen2-MoE's [1, H] gate */
    /* MLA */
    mf_linear q_a, q_b, kv_a, kv_b;           /* q = q_b(norm(q_a x)) (or the q above), kv_a: [kv_lora + rope, H] */
    double *q_a_norm, *kv_a_norm;
    double *e_bias;                           /* e_score_correction_bias [E], as stored (fp32), or NULL */
    double *sinks;                            /* gpt-oss attention sinks [n_heads], or NULL */
} mf_layer;

/* A tensor the model holds converted (its checkpoint values rounded to the
 * policy's weight dtype, which cannot hold them as stored). */
typedef struct mf_owned_tensor {
    const mf_st_tensor *src;
    void *data;
    size_t bytes;
} mf_owned_tensor;

typedef struct mf_model {
    mf_config cfg;
    mf_checkpoint *ckpt;
    mf_dtype weight_round;   /* the policy's weight dtype: values are rounded to it (BF16 in a bf16 run) */
    const mf_st_tensor *embed;   /* [V, H], read straight from the mapping */
    mf_layer *layers;
    double *final_norm;
    mf_linear head;
    size_t n_params;
    mf_owned_tensor *owned;  /* the converted copies the views point into */
    size_t n_owned;
} mf_model;

/* The dtype a weight stored as `stored` is kept in under a policy whose
 * weights are `policy`: the stored dtype where the policy's holds its values
 * exactly (bf16 under fp32 or fp64), else the policy's (fp32 under bf16). */
mf_dtype mf_weight_storage(mf_dtype stored, mf_dtype policy);

/* mf_model_load flags: MF_LOAD_DEFER_DIGEST leaves the weights digest to a
 * caller that reads every byte anyway (the GPU upload: mf_checkpoint_open_deferred);
 * MF_LOAD_NO_CONVERT keeps every view in the checkpoint's files and dtype,
 * for a caller that converts where it puts them (a GPU); the CPU executor
 * needs the conversions. */
enum { MF_LOAD_DEFER_DIGEST = 1u, MF_LOAD_NO_CONVERT = 2u, MF_LOAD_POPULATE = 4u };
/* MF_LOAD_POPULATE reads the mapped files into the mapping at load (MADV_POPULATE_READ, sequential
 * read-ahead), so the first forward does not stop at a page fault per page of weights. */

/* Loads config + weights from a Hub checkpoint directory. Every tensor's
 * presence, shape and dtype is checked against the config first; the linear
 * layers are then views of the mapped tensors (see mf_weight_storage), norm
 * weights and biases doubles rounded to `weights`. */
int mf_model_load(mf_model **out, const char *dir, mf_dtype weights, unsigned flags, mf_error *err);
void mf_model_free(mf_model *m);

/* What loading a checkpoint for a policy will take, from its headers alone
 * (nothing allocated): its files' bytes (mapped: address space), the tensors
 * used in place (resident once touched) and the converted copies. */
typedef struct mf_model_bytes {
    uint64_t files, in_place, converted;
} mf_model_bytes;
int mf_model_measure(const char *dir, mf_dtype weights, unsigned flags, mf_model_bytes *out, mf_error *err);

/* ---- a sequence's results -------------------------------------------- */

/* What one sequence's forward pass produced (runtime/ computes it, rundir/ records it). Arrays are row-major. */
typedef struct mf_seq_result {
    int T, n_moe, k, E, V, H;
    uint16_t *topk_ids;     /* [n_moe, T, k], rank order */
    double *topk_w;         /* [n_moe, T, k], the weights applied */
    double *router;         /* [n_moe, T, E], raw router logits as computed */
    double *shared_gate;    /* [n_moe, T], sigmoid gate of the shared expert, or NULL */
    double *select;         /* [n_moe, T, E], the scores the router's final top-k ranked where that is not the
                             * softmax of the logits (DeepSeek, GLM: biased, -inf outside the chosen groups), or NULL */
    double *router_in;      /* [n_moe, T, H] or NULL */
    double *logits;         /* [T, V] */
    /* or, where logits is NULL, the logits [T, V] as the device handed them
     * over (a GPU's host buffer, of logits_raw_dtype), borrowed: valid until
     * that device's next forward, never freed here */
    const void *logits_raw;
    mf_dtype logits_raw_dtype;
} mf_seq_result;

void mf_seq_result_free(mf_seq_result *r);
/* The shape fields of a result for T positions of a model with this config (CPU and GPU alike). */
void mf_seq_result_shape(mf_seq_result *r, const mf_config *c, int T);
/* A result laid out for T positions, with the optional arrays (shared gates, selection scores, router inputs)
 * that `like` has: for one assembled from the results of several steps (a prompt, then a token at a time). */
void mf_seq_result_alloc(mf_seq_result *r, const mf_config *c, int T, const mf_seq_result *like);
/* A step's src->T positions into dst's layout at position `at` (at + src->T <= dst->T; src's logits as doubles). */
void mf_seq_result_place(mf_seq_result *dst, const mf_seq_result *src, int at);

/* ---- tokenizer ---------------------------------------------------------
 *
 * A Hugging Face tokenizer.json, read as tokenizers 0.23 reads it, encoding a text to exactly the ids of its
 * Tokenizer.encode(text) and decoding ids as its Tokenizer.decode (docs/tokenizers.md):
 *   normalizers    NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, StripAccents, ByteLevel, Sequence
 *   pre-tokenizers ByteLevel, Split, Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation,
 *                  CharDelimiterSplit, BertPreTokenizer, Sequence
 *   model          BPE (merges, continuing_subword_prefix, end_of_word_suffix, unk and fuse_unk, byte_fallback,
 *                  ignore_merges)
 *   added tokens   special or not, normalized or not, single_word, lstrip, rstrip
 *   post-processor TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence
 *   decoders       ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder, WordPiece, CTC, Sequence
 * Anything else (another model, truncation, padding, BPE dropout) is refused with one line naming it. A loaded
 * tokenizer is read only: several threads may encode with it at once. */

typedef struct mf_tokenizer mf_tokenizer;

int mf_tokenizer_load(mf_tokenizer **out, const char *path, mf_error *err);
/* The same from the file's text (len bytes); origin names it in messages. */
int mf_tokenizer_parse(mf_tokenizer **out, const char *json_text, size_t len, const char *origin, mf_error *err);
void mf_tokenizer_free(mf_tokenizer *t);
/* One past the largest id of the vocabulary and the added tokens. */
int mf_tokenizer_size(const mf_tokenizer *t);
/* The ids of text (len bytes of UTF-8), as Tokenizer.encode(text, add_special_tokens=...) gives them; *ids is
 * malloc'ed (never NULL on success, *n may be 0). */
int mf_tokenizer_encode(const mf_tokenizer *t, const char *text, size_t len, bool add_special_tokens, int32_t **ids,
                        size_t *n, mf_error *err);
/* Tokenizer.decode(ids, skip_special_tokens): the text through the file's decoder (without one: the tokens
 * joined by spaces); unknown ids are skipped. *text is malloc'ed, NUL-terminated, valid UTF-8 when the decoder
 * makes it so (ByteLevel and ByteFallback replace broken bytes with U+FFFD). */
int mf_tokenizer_decode_text(const mf_tokenizer *t, const int32_t *ids, size_t n, bool skip_special_tokens, char **text,
                             size_t *len, mf_error *err);
/* Each token's own bytes, for showing one token at a time (malloc'ed, NUL-terminated): byte-level characters
 * turned back into bytes (so a UTF-8 character may be cut at a token boundary), added tokens as their content,
 * other tokens as they are; unknown ids give nothing. */
char *mf_tokenizer_decode(const mf_tokenizer *t, const int32_t *ids, int n);

/* ---- synthetic checkpoints -------------------------------------------- */

/* tiny (tests), small (CPU benchmarks), and five real models' dimensions
 * (GPU benchmarks; the architecture is the real model's): OLMoE-1B-7B
 * (6.9B parameters), Qwen1.5-MoE-A2.7B (14.3B), Mixtral-8x7B (46.7B),
 * DeepSeek-V2-Lite (15.7B), GLM-4.5-Air (106.9B without its MTP layer); their
 * tensors are generated as the file is written, one at a time. */
typedef enum mf_synth_size {
    MF_SYNTH_TINY, MF_SYNTH_SMALL, MF_SYNTH_OLMOE_1B_7B, MF_SYNTH_QWEN15_MOE_A27B, MF_SYNTH_MIXTRAL_8X7B,
    MF_SYNTH_DEEPSEEK_V2_LITE, MF_SYNTH_GLM45_AIR,
    MF_SYNTH_GPT_OSS_20B   /* openai/gpt-oss-20b's dimensions (20.9B parameters), bf16 experts in its fused layout */
} mf_synth_size;
/* "tiny", "small", "olmoe-1b-7b", "qwen1.5-moe-a2.7b", "mixtral-8x7b", "deepseek-v2-lite", "glm-4.5-air",
 * "gpt-oss-20b"; -1 when unknown */
int mf_synth_size_from_name(const char *name);
/* What `synth --size` of DeepSeek-V2-Lite or GLM-4.5-Air would write, without writing it: the config.json text
 * (malloc'ed) and the parameter count of its tensors. */
int mf_synth_plan(mf_synth_size size, char **config_json, uint64_t *n_params, mf_error *err);

/* Writes a deterministic random-weight bf16 checkpoint in Hub layout
 * (config.json, model.safetensors) plus tokens.jsonl into dir. */
int mf_synth_write(const char *dir, mf_arch arch, mf_synth_size size, uint64_t seed, mf_error *err);
/* The same with the shape (architecture and sizes) of `like`'s config. */
int mf_synth_write_like(const char *dir, mf_arch arch, mf_synth_size size, const mf_config *like, uint64_t seed,
                        mf_error *err);
/* The same with the linear weights in `weights`: MF_BF16, or MF_F8E4M3 for deepseek_v3 (DeepSeek-V3's FP8
 * layout: e4m3 codes with an F32 weight_scale_inv per block, quantization_config weight_block_size [16, 16] at
 * tiny, [128, 128] otherwise or like's own; embedding, router, norms and head stay bf16). deepseek_v3 is
 * written at tiny and small (or like's sizes). */
int mf_synth_write_as(const char *dir, mf_arch arch, mf_synth_size size, const mf_config *like, uint64_t seed,
                      mf_dtype weights, mf_error *err);

/* ---- the embedded default checkpoint (models/embedded.c) --------------- */

/* Writes the files of the checkpoint built into the program (config.json, model.safetensors, its prompts, and its
 * tokenizer.json where it has one) into dir. */
int mf_default_model_write(const char *dir, mf_error *err);
/* Whether the embedded checkpoint has a file of that name (e.g. "sweep-prompts.jsonl"). */
bool mf_default_has(const char *name);

#endif
