/* moeflip trace: prompt files, and the run directory (DESIGN.md §5).
 *
 * A run is a directory: manifest.json + part-NNNNN.safetensors shards. The
 * manifest is written before the first sequence (with none), and replaced
 * after every shard; every file is written to a temporary name, flushed and
 * renamed, so a run killed at any moment is a valid run holding every
 * sequence whose shard reached the manifest. Readers verify shard digests. */
#ifndef MF_TRACE_H
#define MF_TRACE_H

#include "mf_core.h"
#include "mf_models.h"
#include "mf_runtime.h"

/* ---- prompts ----------------------------------------------------------- */

#define MF_MAX_SEQ_ID 200          /* bytes of a sequence id (UTF-8) */
#define MF_MAX_SEQ_TOKENS (1 << 20)   /* tokens of one sequence */

typedef struct mf_prompt {
    char *id;
    int32_t *tokens;
    int T;
    int generated;   /* of the T tokens, the last this many were generated (0 for a prompt) */
} mf_prompt;

typedef struct mf_prompts {
    mf_prompt *seq;
    size_t n;
    char digest[33];
} mf_prompts;

/* JSON lines {"id": "...", "tokens": [ids]}; everything is validated before
 * anything runs: ids unique and well-formed, tokens integers in [0, vocab). */
int mf_prompts_load(mf_prompts *p, const char *path, int vocab, mf_error *err);
/* The same where a line may hold {"id", "text"} instead (a line with "tokens" uses them): the text is
 * encoded with the tokenizer.json at tokenizer_path (read at the first such line; NULL or absent: such a
 * line is refused, naming the file), as Hugging Face tokenizers' Tokenizer.encode(text) does. */
int mf_prompts_load_text(mf_prompts *p, const char *path, int vocab, const char *tokenizer_path, mf_error *err);

/* Texts: JSON lines {"id": "...", "text": "..."} (ids as prompt files have them, unique; texts of at most
 * MF_MAX_TEXT_BYTES bytes, possibly empty), for `moeflip tokenize`. */
#define MF_MAX_TEXT_BYTES (16 << 20)
typedef struct mf_text {
    char *id;
    char *text;
    size_t len;
} mf_text;
typedef struct mf_texts {
    mf_text *v;
    size_t n;
} mf_texts;
int mf_texts_load(mf_texts *t, const char *path, mf_error *err);
void mf_texts_free(mf_texts *t);
void mf_prompts_free(mf_prompts *p);
/* A sequence id as prompt files and runs take it: 1 to MF_MAX_SEQ_ID bytes of UTF-8 without '/', '\\' or
 * control characters. */
bool mf_seq_id_valid(const char *id);

/* ---- what a run records ------------------------------------------------ */

typedef enum mf_record {
    MF_RECORD_ROUTING,   /* tokens, topk_ids, topk_w, router, shared_gate */
    MF_RECORD_TOPK,      /* routing + top-64 logits with their token ids + logsumexp */
    MF_RECORD_LOGITS,    /* routing + full logits */
    MF_RECORD_FULL,      /* routing + full logits + router_in */
} mf_record;

#define MF_TOPK_LOGITS 64

int mf_record_parse(const char *s, mf_record *out);   /* routing|topk|logits|full */
const char *mf_record_name(mf_record r);
/* The default: full logits when the vocabulary is small enough to keep. */
mf_record mf_record_default(int vocab);

/* ---- writing a run ----------------------------------------------------- */

typedef struct mf_run_info {
    const char *model_dir;
    const mf_model *model;
    const mf_precision *prec;
    const char *device;       /* "cpu", "cuda:0", ... */
    const char *numerics;     /* "native" | "fp64" */
    int threads;
    mf_record record;
    const char *input_path;
    const mf_prompts *prompts;
    int shard_seqs;           /* sequences per shard (0: by size and time) */
    /* imports: no model is loaded; these name it instead */
    const mf_config *cfg;
    const char *weights_digest;
    const char *imported_from;  /* e.g. "crova DIR"; experts are then derived, not dispatched */
    const char *device_name;    /* a GPU's name and architecture (NULL: the CPU's) */
    const struct mf_generation *generation;   /* NULL: the prompts as they stand */
    const char *replay_json;    /* the manifest's "replay" object, as JSON text (NULL: no routing replay) */
} mf_run_info;

typedef struct mf_run_writer mf_run_writer;

/* Creates the run directory and its empty manifest, or with resume, reopens
 * an existing run made with the same model, precision, record level and
 * input, verifying its shards. */
int mf_run_create(mf_run_writer **out, const char *dir, const mf_run_info *info, bool resume, mf_error *err);
bool mf_run_writer_has(const mf_run_writer *w, const char *seq_id);
size_t mf_run_writer_done(const mf_run_writer *w);
/* Adds one sequence; writes a shard (and the manifest) when one is due. */
int mf_run_writer_add(mf_run_writer *w, const mf_prompt *p, const mf_seq_result *r, mf_error *err);
/* Writes what is pending and marks the run complete when every input sequence is in. */
int mf_run_writer_close(mf_run_writer *w, mf_error *err);
void mf_run_writer_free(mf_run_writer *w);
/* Removes what writers of dir killed before their run appeared left: <dir>.tmp.<pid> directories of processes
 * that are gone, when they hold only run files. */
void mf_run_remove_stale(const char *dir);
/* Removes the directory dir if it holds only run files (the manifest, shards, their temporaries); true when it
 * is gone. */
bool mf_run_remove_dir(const char *dir);

/* ---- reading a run ----------------------------------------------------- */

typedef struct mf_run_seq {
    char *id;
    int length;
    int generated;      /* the last this many positions were generated (0 in a run that does not generate) */
    int shard;          /* index into the shard list */
} mf_run_seq;

typedef struct mf_run {
    char *dir;
    char *manifest_text;       /* manifest.json as read */
    mf_run_seq *seqs;
    size_t n_seqs;
    char **shard_files;
    size_t n_shards;
    uint64_t *shard_bytes;
    char (*shard_digest)[33];
    mf_st_file **shards;       /* opened and verified by mf_run_open */
    /* model facts from the manifest */
    char arch[64];
    int n_layers, n_moe, top_k, n_experts, vocab, hidden;
    int *moe_layers;           /* [n_moe] model layer index of each MoE layer */
    bool has_shared;
    bool complete;
    int max_new_tokens;        /* generation.max_new_tokens of a run that generated, else 0 */
    bool forced;               /* its generated tokens are another run's, teacher-forced (generation.strategy) */
    char precision[64];
    char record[32];
    bool ids_checked;          /* token and expert ids were checked against the model (every open but the unhashed) */
} mf_run;

/* Opens a run and validates it whole (trace/run.c says what is checked, in which order): the manifest against
 * itself, the shards against the manifest (sizes, digests), every sequence's tensors against the shapes the
 * manifest declares and each other, and the ids against the vocabulary and the experts. Every reader opens
 * runs here; a run that does not validate is refused with one message naming the file, sequence or tensor. */
int mf_run_open(mf_run **out, const char *dir, mf_error *err);
/* mf_run_open without reading the shards' bytes a second time: given(ud, file) returns the XXH3-128 digest
 * (32 hex digits) that the caller computed over exactly the bytes it wrote to that file (moeflip serve hashes
 * an upload as it writes it), and it must equal the manifest's, with the file's size; where given returns
 * NULL (or given is NULL) the shard is hashed as mf_run_open does. The manifest and every shard's safetensors
 * header are checked either way. */
int mf_run_open_given(mf_run **out, const char *dir, const char *(*given)(void *ud, const char *file), void *ud,
                      mf_error *err);
/* mf_run_open that hashes no shard, for a caller whose shards' bytes are checked elsewhere (moeflip push: the
 * server hashes what it receives and refuses a shard that differs from the manifest). Everything else is checked
 * but the ids' values (a damaged byte is the server's to name); mf_run_tensor checks those as it reads them. */
int mf_run_open_unhashed(mf_run **out, const char *dir, mf_error *err);
void mf_run_close(mf_run *r);
/* Tensor <seq-id>/<field> of sequence i (its shape checked again), or NULL: a field the run does not record
 * is not an error (rc MF_OK, *t NULL). */
int mf_run_tensor(mf_run *r, size_t seq, const char *field, const mf_st_tensor **t, mf_error *err);

/* ---- one trace, as the command runs it ---------------------------------- */

typedef struct mf_trace_opts {
    const char *model_dir, *input, *out;
    const char *precision;   /* policy name */
    const char *numerics;    /* NULL: native, or fp64 with --precision fp64 */
    const char *record;      /* NULL: the default for the vocabulary */
    int threads;             /* 0: every core */
    bool resume;
    int shard_seqs;
    const char *label;       /* progress bar label */
    bool silent;             /* no closing line */
    const char *device;      /* NULL or "cpu": the CPU; "cuda[:N]", "hip[:N]": a GPU */
    int generate;            /* continue every prompt greedily by up to this many tokens (0: none) */
    /* routing replay (trace/replay.c): dispatch the experts this run dispatched instead of the router's own */
    const char *replay;          /* a run directory (NULL: no replay) */
    const char *replay_layers;   /* which layers: model layer indices "N,N-M,..." (NULL: every MoE layer) */
    bool replay_weights;         /* apply its recorded weights too (else this router's weights of its experts) */
} mf_trace_opts;

/* Parses and checks the precision and numerics of a trace. */
int mf_trace_check(const mf_trace_opts *o, mf_precision *prec, mf_numerics *num, mf_error *err);
int mf_trace(const mf_trace_opts *o, mf_error *err);

/* ---- generation ----------------------------------------------------------- */

#define MF_MAX_STOP_TOKENS 64
#define MF_MAX_NEW_TOKENS (1 << 16)

/* Greedy decoding as Hugging Face generate(do_sample=False) does it. */
typedef struct mf_generation {
    int max_new_tokens;
    int32_t eos[MF_MAX_STOP_TOKENS];   /* generation stops after any of these (kept in the output) */
    int n_eos;
    char eos_source[32];               /* "generation_config.json", "config.json" or "none" */
    bool forced;                       /* the tokens are another run's, traced in one pass (teacher forcing) */
} mf_generation;

/* eos_token_id (an id, a list or null) from DIR/generation_config.json, or config.json where there is none. */
int mf_generation_load(mf_generation *g, const char *model_dir, int vocab, int max_new_tokens, mf_error *err);
bool mf_generation_stops(const mf_generation *g, int32_t token);
/* A run's sequences as prompts (its generated tokens included and marked), for teacher forcing; forced gets the
 * run's generation (max_new_tokens 0 where it generated nothing). */
int mf_prompts_from_run(mf_prompts *p, mf_generation *forced, const char *run_dir, int vocab, mf_error *err);
/* The argmax of V logits rounded to the head's dtype, the lowest id of equal values (torch.argmax);
 * MF_EINVAL where one is NaN. */
int mf_greedy_token(const double *logits, int V, mf_dtype head, int32_t *token);
/* The prompt, then up to max_new_tokens greedy tokens, each run one step against the key-value cache (the
 * decode path). tokens (room for p->T + max_new_tokens) gets the prompt and the generated tokens; r every
 * position's results, the generated ones as their decode steps computed them. */
int mf_generate_cpu(const mf_model *m, const mf_run_opts *o, const mf_generation *gen, const mf_prompt *p,
                    int32_t *tokens, int *generated, mf_seq_result *r, mf_error *err);

/* ---- routing replay ---------------------------------------------------------
 * trace --replay RUN: every (MoE layer, position) dispatches the experts RUN dispatched there, in its rank
 * order, with RUN's weights (replay_weights) or the router's own weights of those experts; the router still
 * runs and its logits are recorded as computed. RUN must be a complete run of the same model (architecture,
 * config and weights digests) holding every input sequence with the same tokens (with generate: the same
 * prompt), routing recorded. */

typedef struct mf_replay_source mf_replay_source;

/* Opens RUN for prompts of the model whose config is cfg, checking all of the above but the weights digest
 * (the weights are not loaded yet). layers: --replay-layers (NULL: every MoE layer). */
int mf_replay_open(mf_replay_source **out, const char *run_dir, const mf_config *cfg, const mf_prompts *prompts,
                   bool generate, const char *layers, bool weights, mf_error *err);
/* The weights digest of the loaded model against RUN's. */
int mf_replay_check_weights(const mf_replay_source *s, const char *weights_digest, mf_error *err);
/* The routing of prompt i (its index in the prompts given to mf_replay_open), valid until the next call. */
int mf_replay_sequence(mf_replay_source *s, size_t prompt, mf_replay *out, mf_error *err);
/* The manifest's "replay" object as JSON text: source, source_manifest_digest (XXH3-128 of RUN's manifest.json,
 * the identity by which a diff finds a target's replayed twin), source_numerics, source_precision,
 * source_device, layers (model layer indices), all_layers, weights ("router" or "source"). */
const char *mf_replay_manifest(const mf_replay_source *s);
void mf_replay_close(mf_replay_source *s);
/* --replay-layers: "N" or "N-M", comma-separated model layer indices; a single index must be a MoE layer, a
 * range takes the MoE layers in it and must hold one; none twice. layers [n_moe] gets which MoE layers are
 * named. With cfg NULL only the syntax is checked (layers is not written). */
int mf_replay_layers_parse(const char *spec, const mf_config *cfg, bool *layers, mf_error *err);

/* ---- import -------------------------------------------------------------- */

/* CroVA's capture layout: DIR/logits/<case>.safetensors with `logits` [m, V],
 * `response` [m] and optionally `router_logits` [L, m, E]. The model's
 * config.json (in model_dir) gives k and the routing rule; the experts and
 * their weights are derived from the recorded router logits (canonical
 * top-k of the raw logits, as CroVA's metrics do) and the manifest says so. */
int mf_import_crova(const char *src_dir, const char *model_dir, const char *out_dir, mf_error *err);

/* ---- export (DESIGN.md §8) ---------------------------------------------- */

typedef enum mf_export_format { MF_EXPORT_JSONL, MF_EXPORT_CSV } mf_export_format;
int mf_run_export(mf_run *r, mf_export_format fmt, FILE *out, mf_error *err);

#endif
