/* moeflip diff: compare a reference run with target runs of the same model on
 * the same tokens. CroVA's metrics (same definitions, ratio-of-sums pooling,
 * case-level bootstrap), and what CroVA lacks: flips per layer and expert,
 * margins, primary vs inherited flips, the router's noise scale per layer,
 * error conditional on flips, and the excess over a repeat's noise floor.
 *
 * Everything is accumulated per sequence ("case") into sums and counts, so
 * accumulators of disjoint sets of sequences merge exactly (mf_diff_merge):
 * pooled values are always computed from the cases in sequence-id order. */
#ifndef MF_DIFF_H
#define MF_DIFF_H

#include "mf_core.h"
#include "mf_rundir.h"

#define MF_MARGIN_BINS 34   /* bin 0: exact ties; 1..32: 4 per decade from 1e-6 to 1e2; 33: above */

/* Per-sequence sums (CroVA's case_stats, plus ours). */
typedef struct mf_case {
    char *id;
    int64_t positions, vocab;
    bool has_logits;
    double sq_err, prob_sq_err, kl;
    int64_t top1, ord5, set5;
    int64_t equal_bits;                 /* -1 when the two runs did not both store bf16 logits */
    int64_t router_slots, router_set_equal, router_ord_equal, router_positions_all_layers_equal;
    double router_logit_sq_err;
    int64_t router_logit_count;
    /* ours */
    int64_t flipped, primary, inherited, ties;
    int64_t overlap;                    /* sum over slots of |A intersect B| */
    double gate_sq_err;
    int64_t gate_count;
    double shared_sq_err;
    int64_t shared_count;
    int64_t cond_positions[3], cond_top1[3];   /* positions with 0, 1, >= 2 flipped slots */
    double cond_kl[3];
    int64_t *layer_slots, *layer_set_equal, *layer_ord_equal;   /* [L] */
    /* generated runs: the prompt's length, each run's response (what follows it), where they first differ
     * (the shorter length when they never do), and how many of the shorter's positions agree. Positions from the
     * first differing token on are not compared (their inputs differ). */
    bool responses;                  /* both runs generated their own (neither teacher-forced) */
    int prompt_len, response_ref, response_tgt, first_divergence, response_agree;
    bool response_equal;
    /* a multiple-choice item both runs scored: its answer and each run's pick (-1: none, or NaN scores), the
     * reference's pick's score and its lead over the best other choice, and the target's score of that pick */
    bool answers;
    int answer, pred_ref, pred_tgt, n_choices;
    double answer_margin_ref, logprob_ref, logprob_tgt;
    size_t pos_first, flip_first;   /* this case's runs in the accumulator's pos[] and flip_list[] */
    int pos_count, flip_count;
} mf_case;

/* One position's record (for --positions and the Spearman correlation). */
typedef struct mf_position {
    int case_index;          /* into the accumulator's cases, before sorting: resolved by id */
    const char *seq;         /* the case's id */
    int pos, token;
    int first_flip_layer;    /* model layer index, -1 when none flipped */
    int flipped_slots;
    double kl, sq_err;       /* NaN when the runs have no full logits */
    double prob_sq_err;      /* the same, for the probabilities (the routing replay's attribution sums it) */
    int top1;                /* 1 agree, 0 differ, -1 unknown */
    bool generated;          /* the reference generated this position's token */
} mf_position;

/* One flipped slot (sparse: kept always, for the layer x position maps). */
typedef struct mf_flip {
    const char *seq;
    int layer, pos;   /* model layer index */
    bool inherited;
} mf_flip;

/* One (layer, position) slot, kept when the accumulator's keep_slots is set. */
typedef struct mf_slot {
    const char *seq;
    int layer, pos;
    bool set_equal, order_equal, tie;
    int overlap;
    uint16_t dropped[8], added[8];   /* the first 8 of each (k is at most 8 in these models) */
    int n_dropped, n_added;
    double margin_logit, margin_prob, gate_sq_err, shared_sq_err;
    int cross_group;                 /* a flip that moved experts between groups: 1, within them: 0; -1 no groups */
} mf_slot;

typedef struct mf_diff_acc {
    int L, E, K, V;
    int *layers;                      /* [L] model layer index of each MoE layer */
    mf_case *cases;
    size_t n_cases, cap_cases;
    mf_position *pos;
    size_t n_pos, cap_pos;
    int64_t *flips, *primary, *inherited, *ties;   /* [L] */
    int n_group;                                   /* the reference's router groups (1: none) */
    int64_t *cross_group;                          /* [L] flips whose experts changed groups (n_group > 1) */
    /* [L][MF_MARGIN_BINS] by reference margin: in logit units, or for a router that ranks other scores (the
     * run's `select`: DeepSeek's biased sigmoid scores within the chosen groups) in those */
    int64_t *margin_slots, *margin_flips;
    int64_t *dropped, *added;                      /* [L][E] */
    int64_t *transitions;                          /* [E][E]: dropped expert -> added expert, same slot */
    mf_flip *flip_list;
    size_t n_flips, cap_flips;
    bool keep_slots;
    bool generated;                   /* some case has generated positions (the positions CSV marks them) */
    mf_slot *slots;
    size_t n_slots, cap_slots;
    /* what the runs compared cannot have (MF_LACKS_*: an imported capture's manifest capture.lacks) and their
     * engines: the metrics that need it are written as null with a warning */
    unsigned ref_lacks, tgt_lacks;
    char ref_engine[16], tgt_engine[16];
} mf_diff_acc;

/* An empty accumulator for diffs against the reference run ref (its MoE
 * layers, experts, top-k and vocabulary). */
void mf_diff_acc_init(mf_diff_acc *a, const mf_run *ref);
void mf_diff_acc_free(mf_diff_acc *a);
/* Adds every sequence of the two runs (aligned: same ids and tokens, checked). */
int mf_diff_acc_add_runs(mf_diff_acc *a, mf_run *ref, mf_run *tgt, mf_error *err);
/* Adds the reference's sequences first .. first+count-1 (a shard of the work). */
int mf_diff_acc_add_range(mf_diff_acc *a, mf_run *ref, mf_run *tgt, size_t first, size_t count, mf_error *err);
/* Merges src into dst (both over the same model); src is left empty. */
int mf_diff_merge(mf_diff_acc *dst, mf_diff_acc *src, mf_error *err);

/* Checks that two runs can be compared: same model and the same token
 * sequences; the message names the first mismatching sequence and position.
 * Two runs that each generated their responses need the same prompts only:
 * their responses are compared as tokens, and their records up to the first
 * token where they part. */
int mf_diff_align(mf_run *ref, mf_run *tgt, mf_error *err);
/* mf_diff_align with the runs named ref_name and tgt_name in the message instead of by their directories. */
int mf_diff_align_named(mf_run *ref, const char *ref_name, mf_run *tgt, const char *tgt_name, mf_error *err);

/* The seed of the bootstrap's resampling plan wherever none is given (moeflip diff without --seed, the sweep,
 * the collector): one value, so that their intervals for the same runs are the same. */
#define MF_DIFF_SEED 20260820

typedef struct mf_diff_opts {
    int bootstrap;          /* resamples (0: no intervals) */
    uint64_t seed;
    /* token texts from the tokenizer.json in the model directory the reference's manifest names: only for runs
     * the caller trusts (its own); false reads no file a manifest names (the collector) */
    bool model_tokenizer;
} mf_diff_opts;

/* Writes diff.json for the reference and targets (accs[i] = target i vs the
 * reference); floor (may be NULL) is a repeat of the reference configuration. */
int mf_diff_write_json(const char *path, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n_targets,
                       mf_diff_acc *floor_acc, mf_run *floor_run, const mf_diff_opts *o, mf_error *err);
/* The one-screen summary. */
void mf_diff_print_summary(FILE *out, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n_targets,
                           const mf_diff_opts *o);
/* One row per (target, sequence, position). */
int mf_diff_write_positions(const char *path, mf_diff_acc **accs, int n_targets, mf_error *err);
/* One row per (target, sequence, layer, position) slot (needs keep_slots). */
int mf_diff_write_slots(const char *path, mf_diff_acc **accs, int n_targets, mf_error *err);

/* ---- one diff, start to end --------------------------------------------------
 * What `moeflip diff`, the sweep and the collector each do: open the runs, check that they can be compared,
 * accumulate every target against the reference, pick the noise floor, write the outputs. */

/* Where a diff's noise floor comes from (docs/diff.md, "The noise floor"). */
typedef enum mf_diff_floor {
    MF_DIFF_FLOOR_NONE,     /* none */
    MF_DIFF_FLOOR_REPEAT,   /* the first target with the reference's numerics, precision and device kind, if any */
    MF_DIFF_FLOOR_RUN,      /* floor_run, a run of its own */
} mf_diff_floor;

typedef struct mf_diff_request {
    const char *reference;              /* run directories */
    const char *const *targets;         /* [n_targets] */
    int n_targets;
    /* How diff.json ("run", and the warnings), the summary and the messages name the runs: NULL, or a NULL entry,
     * names a run by its directory. The collector gives the names the runs were pushed under. */
    const char *reference_label;
    const char *const *target_labels;
    mf_diff_floor floor;
    const char *floor_run, *floor_label;
    int bootstrap;                      /* resamples (0: no intervals) */
    uint64_t seed;                      /* MF_DIFF_SEED unless the caller was given one */
    bool model_tokenizer;               /* as mf_diff_opts */
    /* The outputs, NULL where not wanted (diff.json, the positions and slots CSVs): each is written under a
     * temporary name, and all are renamed into place once every one is written; nothing is left when one fails. */
    const char *json_path, *positions_path, *slots_path;
    FILE *summary;                      /* the one-screen summary, once the files are in place; NULL: none */
} mf_diff_request;

/* Runs one diff; the message of a failure names the runs by their labels. */
int mf_diff_runs(const mf_diff_request *q, mf_error *err);

/* Pooled CroVA metric by name over all cases ("raw_logit_mse", ..., "router_logit_mse"); NaN when undefined. */
double mf_diff_metric(const mf_diff_acc *a, const char *name);

#endif
