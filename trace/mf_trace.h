/* moeflip trace: one trace as the command runs it (a model's forward passes over a prompt file into a run
 * directory, rundir/), and greedy generation. */
#ifndef MF_TRACE_H
#define MF_TRACE_H

#include "mf_core.h"
#include "mf_models.h"
#include "mf_runtime.h"
#include "mf_rundir.h"

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
/* In a job of several ranks (mf_dist.h) every rank calls it with the same options: the ranks share the sequences
 * (mf_trace_assign), rank 0 writes the manifest, and every rank returns the same status. */
int mf_trace(const mf_trace_opts *o, mf_error *err);
/* Which rank traces each sequence: the ones not done (done NULL: none is), the most costly first (positions: the
 * prompt, up to generate new tokens, every choice after the prompt), each to the rank with the least work so far
 * (the lowest of equals); owner[i] gets the rank, -1 for a sequence done. The same on every rank. */
void mf_trace_assign(const mf_prompts *p, const bool *done, int generate, int ranks, int *owner);

/* Scores every choice of p (its multiple-choice item): one forward pass of the prompt and the choice on the CPU
 * (model, ro) or a GPU, or on the CPU a key-value-cache session rewound between choices where that reads the
 * weights no more often (trace/score.c). */
int mf_choices_score(mf_prompt *p, const mf_model *m, const mf_run_opts *ro, mf_gpu *gpu, mf_error *err);

/* ---- generation ----------------------------------------------------------- */

/* eos_token_id (an id, a list or null) from DIR/generation_config.json, or config.json where there is none. */
int mf_generation_load(mf_generation *g, const char *model_dir, int vocab, int max_new_tokens, mf_error *err);
bool mf_generation_stops(const mf_generation *g, int32_t token);
/* The argmax of V logits rounded to the head's dtype, the lowest id of equal values (torch.argmax);
 * MF_EINVAL where one is NaN. */
int mf_greedy_token(const double *logits, int V, mf_dtype head, int32_t *token);
/* The prompt, then up to max_new_tokens greedy tokens, each run one step against the key-value cache (the
 * decode path), on the CPU (gpu NULL) or on a GPU opened with a cache of p->T + max_new_tokens positions.
 * tokens (room for p->T + max_new_tokens) gets the prompt and the generated tokens; r every position's
 * results, the generated ones as their decode steps computed them; *decode_s the seconds after the prompt. */
int mf_generate(const mf_model *m, const mf_run_opts *o, mf_gpu *gpu, const mf_generation *gen, const mf_prompt *p,
                int32_t *tokens, int *generated, double *decode_s, mf_seq_result *r, mf_error *err);

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

#endif
