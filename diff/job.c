/* One diff, start to end: the runs opened and checked, every target
 * accumulated against the reference, the noise floor picked, the outputs
 * written together. `moeflip diff`, the sweep and the collector all diff
 * here, so that the same runs and options give them the same diff.json. */
#include "diff_int.h"
#include "mf_dist.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "numerics|precision|device kind" of a run's manifest: two runs with the same key repeat one configuration. */
static char *config_key(const mf_run *r) {
    json_t *m = json_loads(r->manifest_text, 0, NULL);
    char *s = NULL;
    if (asprintf(&s, "%s|%s|%s", json_string_value(json_object_get(m, "numerics")) ?: "",
                 json_string_value(json_object_get(json_object_get(m, "precision"), "name")) ?: "",
                 json_string_value(json_object_get(json_object_get(m, "device"), "kind")) ?: "") < 0)
        s = NULL;
    json_decref(m);
    return s;
}

/* Whether a run dispatched another run's routing (trace --replay): no repeat of anything. */
static bool replayed(const mf_run *r) {
    json_t *m = json_loads(r->manifest_text, 0, NULL);
    const bool yes = json_object_get(m, "replay") != NULL;
    json_decref(m);
    return yes;
}

/* The first target that repeats the reference's configuration, or -1. */
static int first_repeat(const mf_run *ref, mf_run *const *targets, int n) {
    char *rk = config_key(ref);
    int found = -1;
    for (int i = 0; i < n && found < 0 && rk; i++) {
        if (replayed(targets[i])) continue;
        char *tk = config_key(targets[i]);
        if (tk && !strcmp(rk, tk)) found = i;
        free(tk);
    }
    free(rk);
    return found;
}

/* An output of the diff: written under tmp, renamed to path once every output is written. */
typedef struct output {
    const char *path;   /* NULL: not wanted */
    char tmp[4200];
} output;

#define N_OUTPUTS 3
#define MAX_OUTPUT_PATH 4000   /* room in tmp for the temporary's suffix */

/* Every output renamed into place; on a failure the temporaries that are left are removed by the caller. */
static int commit_outputs(output *outs, mf_error *err) {
    for (int i = 0; i < N_OUTPUTS; i++) {
        if (!outs[i].path) continue;
        if (rename(outs[i].tmp, outs[i].path) != 0)
            return mf_fail(err, MF_EIO, "%s: cannot rename into place: %s", outs[i].path, strerror(errno));
        outs[i].tmp[0] = 0;
    }
    return MF_OK;
}

int mf_diff_runs(const mf_diff_request *q, mf_error *err) {
    const int nt = q->n_targets;
    if (nt < 1) return mf_fail(err, MF_EINVAL, "a diff needs at least one target run");
    mf_run *ref = NULL, *floor_run = NULL;
    mf_run **targets = mf_xcalloc((size_t)nt, sizeof *targets);
    mf_diff_acc **accs = mf_xcalloc((size_t)nt, sizeof *accs);
    mf_diff_acc *floor_acc = NULL;
    bool floor_owned = false;   /* a floor run of its own, not one of the targets */
    const char *ref_label = q->reference_label ? q->reference_label : q->reference;
    /* a job of several ranks shares the diff: each accumulates its block of the reference's sequences, and the
     * blocks are merged on every rank (diff/gather.c); rank 0 writes the outputs */
    const int rank = mf_dist_rank(), size = mf_dist_size();
    const bool shared = size > 1;
    output outs[N_OUTPUTS] = {{q->json_path, ""}, {q->positions_path, ""}, {q->slots_path, ""}};
    int stage = -1;   /* what failed: -1 opening and checking the runs, i accumulating target i (nt: the floor run) */
    int rc = mf_run_open(&ref, q->reference, err);
    for (int i = 0; i < nt && !rc; i++) rc = mf_run_open(&targets[i], q->targets[i], err);
    size_t first = 0, count = ref ? ref->n_seqs : 0;
    if (!rc && shared) diff_share_block(ref, rank, size, &first, &count);
    for (int i = 0; i < nt && !rc; i++) {
        const char *label = q->target_labels && q->target_labels[i] ? q->target_labels[i] : q->targets[i];
        accs[i] = mf_xcalloc(1, sizeof *accs[i]);
        mf_diff_acc_init(accs[i], ref);
        accs[i]->keep_slots = q->slots_path != NULL;
        if (!(rc = mf_diff_align_named(ref, ref_label, targets[i], label, err)) &&
            (rc = diff_acc_add_aligned(accs[i], ref, targets[i], first, count, err)))
            stage = i;
    }
    if (!rc && q->floor == MF_DIFF_FLOOR_RUN) {
        const char *label = q->floor_label ? q->floor_label : q->floor_run;
        floor_owned = true;
        if (!(rc = mf_run_open(&floor_run, q->floor_run, err))) {
            floor_acc = mf_xcalloc(1, sizeof *floor_acc);
            mf_diff_acc_init(floor_acc, ref);
            if (!(rc = mf_diff_align_named(ref, ref_label, floor_run, label, err)) &&
                (rc = diff_acc_add_aligned(floor_acc, ref, floor_run, first, count, err)))
                stage = nt;
        }
    }
    if (shared) {
        mf_diff_acc **all = mf_xcalloc((size_t)nt + 2, sizeof *all);
        int n_all = 0;
        for (int i = 0; i < nt && !rc; i++) all[n_all++] = accs[i];
        if (!rc && floor_acc) all[n_all++] = floor_acc;
        rc = diff_gather(all, n_all, ref, rc, stage, err);
        free(all);
    }
    const mf_diff_opts o = {q->bootstrap, q->seed, q->model_tokenizer};
    diff_labels labels = {q->reference_label, q->target_labels, q->floor_label};
    if (!rc && q->floor == MF_DIFF_FLOOR_REPEAT) {
        const int i = first_repeat(ref, targets, nt);
        if (i >= 0) {
            floor_acc = accs[i];
            floor_run = targets[i];
            labels.floor = q->target_labels ? q->target_labels[i] : NULL;
        }
    }
    for (int i = 0; i < N_OUTPUTS && !rc; i++)
        if (outs[i].path && strlen(outs[i].path) >= MAX_OUTPUT_PATH) rc = mf_fail(err, MF_EINVAL, "an output path is too long");
    for (int i = 0; i < N_OUTPUTS && !rc; i++)
        if (outs[i].path) snprintf(outs[i].tmp, sizeof outs[i].tmp, "%s.tmp.diff.%ld", outs[i].path, (long)getpid());
    /* every rank computes its share of the bootstrap's draws; rank 0 alone writes */
    diff_bootstrap_share(shared);
    if (!rc && q->json_path)
        rc = diff_write_json(rank == 0 ? outs[0].tmp : NULL, ref, targets, accs, nt, floor_acc, floor_run, &o, &labels, err);
    diff_bootstrap_share(false);
    if (rank > 0)
        for (int i = 0; i < N_OUTPUTS; i++) outs[i].path = NULL;
    if (!rc && outs[1].path) rc = mf_diff_write_positions(outs[1].tmp, accs, nt, err);
    if (!rc && outs[2].path) rc = mf_diff_write_slots(outs[2].tmp, accs, nt, err);
    if (!rc) rc = commit_outputs(outs, err);
    rc = shared ? mf_dist_agree(rank == 0 ? rc : MF_OK, err) : rc;
    if (!rc && q->summary && rank == 0) {
        diff_print_summary(q->summary, ref, targets, accs, nt, &labels);
        diff_attribution_summary(q->summary, ref, targets, accs, nt);
    }
    for (int i = 0; i < N_OUTPUTS; i++)
        if (outs[i].path && outs[i].tmp[0]) unlink(outs[i].tmp);
    for (int i = 0; i < nt; i++) {
        if (accs[i]) mf_diff_acc_free(accs[i]);
        free(accs[i]);
        mf_run_close(targets[i]);
    }
    if (floor_owned) {
        if (floor_acc) mf_diff_acc_free(floor_acc);
        free(floor_acc);
        mf_run_close(floor_run);
    }
    free(accs);
    free(targets);
    mf_run_close(ref);
    return rc;
}
