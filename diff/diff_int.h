/* diff/ internals shared by its files (not a public header). */
#ifndef MF_DIFF_INT_H
#define MF_DIFF_INT_H

#include "mf_diff.h"

#include <jansson.h>
#include <stdio.h>

/* mf_diff_acc_add_range for runs already checked with mf_diff_align (or mf_diff_align_named, whose messages name
 * the runs by their labels): the check is not made twice. */
int diff_acc_add_aligned(mf_diff_acc *a, mf_run *ref, mf_run *tgt, size_t first, size_t count, mf_error *err);

/* How diff.json and the summary name the runs (mf_diff_request's labels): NULL, or a NULL entry, names a run by
 * its directory. */
typedef struct diff_labels {
    const char *reference;
    const char *const *targets;   /* NULL or one per target */
    const char *floor;
} diff_labels;

/* mf_diff_write_json and mf_diff_print_summary with the runs named by labels (NULL: by their directories). */
int diff_write_json(const char *path, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n_targets,
                    mf_diff_acc *floor_acc, mf_run *floor_run, const mf_diff_opts *o, const diff_labels *labels,
                    mf_error *err);
void diff_print_summary(FILE *out, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n_targets,
                        const diff_labels *labels);

/* The bootstrap interval of f over the plan (NaN draws dropped), and {"value", "ci95"} as diff.json writes them. */
void diff_ci(double (*f)(const void *, const int *, size_t), const void *ctx, const int *plan, size_t n, int B,
             double ci[2]);
json_t *diff_value_ci(double v, const double ci[2]);

/* Generated responses compared (diff/responses.c): diff.json's "responses" (NULL when no case has both runs'
 * own responses) and the summary's lines. */
json_t *diff_responses_json(const mf_diff_acc *a, const int *plan, int B);
void diff_responses_summary(FILE *out, const mf_diff_acc *a);

/* With the model's tokenizer: the texts of a target's responses (prompt, the part both runs generated alike,
 * and each run's rest) and of its changed items (prompt, choices), added to its diff.json object. */
void diff_texts_add(json_t *target, mf_run *ref, mf_run *tgt, const mf_tokenizer *tk);

/* Multiple-choice answers compared (diff/answers.c): a case's items from both runs (MF_EMISMATCH when their
 * choices differ), diff.json's "answers" (NULL when no case has them) and the summary's lines. */
int diff_answers_case(mf_case *c, const mf_run_choices *r, const mf_run_choices *t, const char *ref_name,
                      const char *tgt_name, mf_error *err);
json_t *diff_answers_json(const mf_diff_acc *a, const int *plan, int B);
void diff_answers_summary(FILE *out, const mf_diff_acc *a);

/* Routing replay's attribution (diff/attribution.c): diff.json's "attribution", one entry per target that has a
 * replayed twin among the targets (NULL when none has), its intervals over the diff's plan; and the summary's
 * lines. The accumulators' cases are in id order. */
json_t *diff_attribution_json(mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n, const int *plan, int B,
                              const diff_labels *labels);
void diff_attribution_summary(FILE *out, mf_run *ref, mf_run **targets, mf_diff_acc **accs, int n);

/* ---- a diff shared by the ranks of a job (diff/gather.c; mf_dist.h) ---- */

/* The reference's sequences that rank accumulates: [*first, *first + *count), contiguous blocks in rank order of
 * about equal positions. */
void diff_share_block(const mf_run *ref, int rank, int size, size_t *first, size_t *count);
/* An accumulator's whole state as bytes (appended to b), and back: unpack fills a (initialised here for ref's
 * model; the caller frees it, also on a failure), refusing a state of another build or model or cut short, from
 * naming the sender in messages. */
void diff_acc_pack(const mf_diff_acc *a, mf_buf *b);
int diff_acc_unpack(mf_diff_acc *a, const mf_run *ref, const uint8_t *data, size_t n, const char *from, mf_error *err);
/* Collective: every rank's outcome (rc, and stage: -1 opening and checking the runs, i accumulating the i-th of
 * accs) and, when every rank succeeded, every rank's n_accs accumulators merged in rank order into accs on every
 * rank. A failure is every rank's: the earliest stage's, at the lowest rank. */
int diff_gather(mf_diff_acc **accs, int n_accs, const mf_run *ref, int rc, int stage, mf_error *err);
/* While on (and the job has several ranks), the bootstrap's draws are shared: each rank computes its block of
 * every interval's draws, and every interval is a collective call (diff_write_json must then run on every rank;
 * a NULL path writes nothing). Per thread. */
void diff_bootstrap_share(bool on);

#endif
