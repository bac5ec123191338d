/* moeflip rundir: the run directory's format (docs/run-format.md): the prompt files a run is made from, the
 * writer (with resume), the reader that validates a run whole, CroVA import and export.
 *
 * A run is a directory: manifest.json + part-NNNNN.safetensors shards. The
 * manifest is written before the first sequence (with none), and replaced
 * after every shard; every file is written to a temporary name, flushed and
 * renamed, so a run killed at any moment is a valid run holding every
 * sequence whose shard reached the manifest. Readers verify shard digests.
 *
 * Readers of runs (diff, serve, push) include this header only: it sees the models' types, never the executor. */
#ifndef MF_RUNDIR_H
#define MF_RUNDIR_H

#include "mf_core.h"
#include "mf_models.h"

#include <jansson.h>

/* ---- prompts ----------------------------------------------------------- */

#define MF_MAX_SEQ_ID 200          /* bytes of a sequence id (UTF-8) */
#define MF_MAX_SEQ_TOKENS (1 << 20)   /* tokens of one sequence */

#define MF_MAX_CHOICES 64   /* answer choices of one item */

/* One answer choice of a multiple-choice item: its tokens (what follows the prompt) and, once traced, its score:
 * the sum of the tokens' log-probabilities after the prompt (lm-evaluation-harness's loglikelihood), NaN where
 * a logit was not a number; greedy when every token was the argmax of its position (the harness's is_greedy). */
typedef struct mf_choice {
    int32_t *tokens;
    int n;
    double logprob;
    bool greedy;
} mf_choice;

typedef struct mf_prompt {
    char *id;
    int32_t *tokens;
    int T;
    int generated;   /* of the T tokens, the last this many were generated (0 for a prompt) */
    /* a multiple-choice item: its choices (none: n_choices 0) and the index of the right one (-1: not given) */
    mf_choice *choices;
    int n_choices;
    int answer;
    /* the line's own "max_new_tokens": it lowers --generate for this sequence (0: traced, not continued) */
    bool own_max_new;
    int max_new;
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

/* An item's choices from a prompt line's "choices" (texts, or token lists) and "answer" (an index): a text
 * choice's tokens are those that encoding prompt text + choice adds after the prompt text's own (both without
 * special tokens), as lm-evaluation-harness splits them; a prompt given as tokens takes the text choice encoded
 * on its own. where names the line in messages ("FILE:LINE: sequence ID"). */
int mf_choices_parse(mf_prompt *s, json_t *line, const char *prompt_text, size_t prompt_len, int vocab,
                     mf_tokenizer *tok, const char *where, mf_error *err);
/* The item's choice with the highest score (the lower index of equal ones); -1 when a score is NaN. */
int mf_choices_predicted(const mf_choice *c, int n);
/* The manifest's "choices" object of a sequence, and the check of one read back (an item a run records). */
json_t *mf_choices_json(const mf_prompt *p);
typedef struct mf_run_choices {
    int n, answer, predicted;   /* answer, predicted: -1 where none */
    mf_choice *v;
} mf_run_choices;
int mf_choices_from_json(mf_run_choices *out, json_t *o, int vocab, const char *where, mf_error *err);
void mf_run_choices_free(mf_run_choices *c);

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

/* ---- generation, as a run records it ---------------------------------- */

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

/* ---- writing a run ----------------------------------------------------- */

typedef struct mf_run_info {
    const char *model_dir;
    const mf_model *model;
    const mf_precision *prec;
    const char *device;       /* "cpu", "cuda:0", ... */
    const char *numerics;     /* the profile's canonical name: "native", "fp64", "emu:..." */
    const char *numerics_validation;   /* NULL, or why the profile's models are not validated (manifest) */
    const char *fp8_products;          /* NULL, or how an FP8 checkpoint's products were computed (manifest) */
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
    /* an engine's capture (mf_import_engine): the manifest's "capture" object (borrowed; its "lacks" says which
     * tensors the run cannot have: MF_LACKS_* below), and whether the experts are the engine's recorded ids */
    json_t *capture;
    unsigned lacks;
    bool experts_recorded;
    int ranks;                  /* the ranks of the job that traces it (manifest device.ranks when more than 1) */
} mf_run_info;

/* What an imported run cannot have, as its manifest's capture.lacks names it ("gate_weights", "router_logits",
 * "shared_gates", "logits"): its shards hold no such tensor, and a diff writes the metrics that need one as null
 * with a warning. */
enum {
    MF_LACKS_GATES = 1,    /* topk_w */
    MF_LACKS_ROUTER = 2,   /* router */
    MF_LACKS_SHARED = 4,   /* shared_gate (a model with a shared expert) */
    MF_LACKS_LOGITS = 8,   /* logits of any kind (record "routing") */
};
/* The names of lacks' bits, joined with ", " into buf ("router logits, gate weights"). */
const char *mf_lacks_text(unsigned lacks, char *buf, size_t cap);

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

/* A run written by the ranks of a job (trace under mpirun or srun; trace/trace.c). Rank 0 holds the run's writer
 * (mf_run_create) and alone writes the manifest; every other rank writes shards into the same directory with a
 * writer of its own (mf_run_part_create) and hands their entries over (mf_run_writer_take_report, then through
 * MPI), which rank 0 adds to the manifest (mf_run_writer_adopt). Shard numbers never collide: rank r of n numbers
 * its shards first + r, first + r + n, ... (mf_run_writer_number_shards), first being the number past every shard
 * the run had (mf_run_writer_next_shard of rank 0's writer). mf_run_writer_close puts the manifest's sequences in
 * the input's order and its shards in number order, as one process writes them. A shard written but not yet in
 * the manifest when the job is killed is a stray that --resume removes, as for one process. */
int mf_run_part_create(mf_run_writer **out, const char *dir, const mf_run_info *info, mf_error *err);
int mf_run_writer_next_shard(const mf_run_writer *w);
void mf_run_writer_number_shards(mf_run_writer *w, int first, int stride);
/* A rank's writer: its shards and sequences written since the last call, as JSON text ({"shards", "sequences"},
 * malloc'ed), or NULL when there are none. */
char *mf_run_writer_take_report(mf_run_writer *w);
/* Rank 0's writer: adds a report (len bytes; from names its rank in messages) to the manifest and writes it
 * (*positions gets the positions of its sequences):
 * refused, naming the entry, when a shard is malformed, already in the run or not there with its size, or a
 * sequence is not of the input, already in the run, given twice, or in no shard of the report. */
int mf_run_writer_adopt(mf_run_writer *w, const char *report, size_t len, const char *from, uint64_t *positions,
                        mf_error *err);
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
    mf_run_choices *choices;   /* a multiple-choice item's choices and scores, or NULL */
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
    /* the router's selection scores (manifest router.rule): a grouped or biased router records them as `select`
     * [L,T,E] (the row its top-k ranked); n_group groups of n_experts / n_group consecutive experts (1: none) */
    bool has_select;
    int n_group;
    bool complete;
    int max_new_tokens;        /* generation.max_new_tokens of a run that generated, else 0 */
    bool forced;               /* its generated tokens are another run's, teacher-forced (generation.strategy) */
    char precision[64];
    char record[32];
    bool ids_checked;          /* token and expert ids were checked against the model (every open but the unhashed) */
    unsigned lacks;            /* MF_LACKS_*: what an imported capture cannot have (manifest capture.lacks); 0 otherwise */
    char engine[16];           /* capture.engine of an imported capture ("vllm", ...), else "" */
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

/* A run's sequences as prompts (its generated tokens included and marked), for teacher forcing; forced gets the
 * run's generation (max_new_tokens 0 where it generated nothing). */
int mf_prompts_from_run(mf_prompts *p, mf_generation *forced, const char *run_dir, int vocab, mf_error *err);

/* ---- import -------------------------------------------------------------- */

/* CroVA's capture layout: DIR/logits/<case>.safetensors with `logits` [m, V],
 * `response` [m] and optionally `router_logits` [L, m, E]. The model's
 * config.json (in model_dir) gives k and the routing rule; the experts and
 * their weights are derived from the recorded router logits (canonical
 * top-k of the raw logits, as CroVA's metrics do) and the manifest says so. */
int mf_import_crova(const char *src_dir, const char *model_dir, const char *out_dir, mf_error *err);

/* The production engines' routing captures (rundir/engines.c says each format, with its source): vLLM's
 * routed_experts (.npy), SGLang's return_routed_experts (base64 int32 in a /generate response), llama.cpp's
 * moe-trace (layer,expert CSV) and Hugging Face's output_router_logits (safetensors). files[i] holds the next
 * capture(s) in order; the i-th capture is the i-th sequence of tokens_path (a prompt file: ids and tokens, or
 * texts encoded with the model's tokenizer.json); a capture has one row per token, or one fewer (the run then
 * holds the tokens it covers). Refused, with one line naming the file and row: ids out of range, an expert twice
 * in a row, a row count that matches neither, the engines' known failure patterns (named). The manifest's
 * "capture" says what the run lacks (capture.lacks: gate weights, router logits, logits). */
typedef enum mf_engine { MF_ENGINE_VLLM, MF_ENGINE_SGLANG, MF_ENGINE_LLAMACPP, MF_ENGINE_HF } mf_engine;
int mf_engine_parse(const char *name, mf_engine *out);   /* vllm|sglang|llamacpp|hf */
const char *mf_engine_name(mf_engine e);
int mf_import_engine(mf_engine eng, const char *const *files, int n_files, const char *model_dir, const char *tokens_path,
                     const char *out_dir, mf_error *err);
/* The readers' pieces, for tests: a .npy of integers with 3 dimensions (ids as int32, malloc'ed; a value outside
 * int32 is refused as no expert index), and standard base64 with padding; where names the input in messages. */
int mf_engine_read_npy(const uint8_t *d, size_t n, const char *where, int32_t **ids, int64_t shape[3], mf_error *err);
int mf_base64_decode(const char *s, size_t n, uint8_t **out, size_t *out_len, const char *where, mf_error *err);

/* ---- export (docs/run-format.md) -------------------------------------- */

typedef enum mf_export_format { MF_EXPORT_JSONL, MF_EXPORT_CSV } mf_export_format;
int mf_run_export(mf_run *r, mf_export_format fmt, FILE *out, mf_error *err);

#endif
