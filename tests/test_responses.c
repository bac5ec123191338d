/* moeflip diff on generated runs: the responses compared as tokens
 * (response_equal_pct, first_divergence_median, generated_token_agreement_pct,
 * CroVA's definitions), routing compared only up to each response's first
 * divergence, generated positions marked in the positions CSV. The runs are
 * written by hand, so every expected value is worked out here. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "mf_diff.h"
#include "testutil.h"

enum { PROMPT = 3, MAXLEN = 8, L = 3, K = 4, E = 16, V = 384 };

typedef struct hand_seq {
    const char *id;
    int response[MAXLEN - PROMPT];
    int n_response;
    int flip_at;   /* a position whose layer-0 choice differs from the reference's (-1: none) */
} hand_seq;

/* A run of the olmoe fixture's shape: every sequence the prompt {1, 2, 3} and its response; routing experts 0..3
 * everywhere (4..7 at flip_at in layer 0), flat logits. */
static const char *write_gen_run(const char *dir, const char *name, const hand_seq *seqs, int n, bool forced) {
    static char paths[4][4200];
    static int next;
    char *path = paths[next++ % 4];
    snprintf(path, sizeof paths[0], "%s/%s", dir, name);
    mf_config cfg;
    mf_error err = {0};
    char cpath[4200];
    snprintf(cpath, sizeof cpath, "%s/config.json", fixture("hf/olmoe"));
    cr_assert_eq(mf_config_load(&cfg, cpath, &err), MF_OK);
    mf_prompt ps[8];
    int32_t tokens[8][MAXLEN];
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < PROMPT; t++) tokens[i][t] = t + 1;
        for (int t = 0; t < seqs[i].n_response; t++) tokens[i][PROMPT + t] = seqs[i].response[t];
        ps[i] = (mf_prompt){.id = (char *)seqs[i].id, .tokens = tokens[i], .T = PROMPT + seqs[i].n_response,
                            .generated = seqs[i].n_response};
    }
    mf_prompts prompts = {ps, (size_t)n, "0"};
    mf_precision prec;
    cr_assert_eq(mf_precision_parse(&prec, "fp32", &err), MF_OK, "%s", err.msg);
    mf_generation gen = {.max_new_tokens = MAXLEN - PROMPT, .forced = forced};
    mf_run_info info = {.model_dir = "hand", .prec = &prec, .device = "cpu", .numerics = "native", .threads = 1,
                        .record = MF_RECORD_LOGITS, .input_path = "hand", .prompts = &prompts, .cfg = &cfg,
                        .weights_digest = "w", .imported_from = "hand", .generation = &gen};
    mf_run_writer *w;
    cr_assert_eq(mf_run_create(&w, path, &info, false, &err), MF_OK, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        const int T = ps[i].T;
        static uint16_t ids[L * MAXLEN * K];
        static double router[L * MAXLEN * E], wts[L * MAXLEN * K], logits[MAXLEN * V];
        for (int l = 0; l < L; l++)
            for (int t = 0; t < T; t++) {
                const bool flip = l == 0 && t == seqs[i].flip_at;
                for (int k = 0; k < K; k++) {
                    ids[((size_t)l * T + t) * K + k] = (uint16_t)(k + (flip ? 4 : 0));
                    wts[((size_t)l * T + t) * K + k] = 0.25;
                }
                for (int e = 0; e < E; e++) router[((size_t)l * T + t) * E + e] = flip ? (e >= 4 && e < 8 ? 1 : -e) : -e;
            }
        mf_seq_result r = {.T = T, .n_moe = L, .k = K, .E = E, .V = V, .H = 64, .topk_ids = ids, .topk_w = wts,
                           .router = router, .logits = logits};
        cr_assert_eq(mf_run_writer_add(w, &ps[i], &r, &err), MF_OK, "%s", err.msg);
    }
    cr_assert_eq(mf_run_writer_close(w, &err), MF_OK, "%s", err.msg);
    mf_run_writer_free(w);
    return path;
}

static json_t *diff_of(const char *ref, const char *tgt, const char *positions, mf_error *err, int *rc) {
    const char *d = temp_dir();
    char out[4200];
    snprintf(out, sizeof out, "%s/diff.json", d);
    const char *targets[] = {tgt};
    mf_diff_request q = {.reference = ref, .targets = targets, .n_targets = 1, .bootstrap = 200, .seed = MF_DIFF_SEED,
                         .json_path = out, .positions_path = positions};
    *rc = mf_diff_runs(&q, err);
    return *rc ? NULL : json_load_file(out, 0, NULL);
}

static double value(json_t *resp, const char *name) {
    return json_real_value(json_object_get(json_object_get(resp, name), "value"));
}

Test(responses, metrics_by_hand) {
    /* prompt {1,2,3} each; reference and target responses:
     *   a  10 11 12 13   10 11 12 13   equal; first divergence 4 (its length); 4 of 4 agree
     *   b  10 11 12 13   10 20 12 13   first divergence 1; 3 of 4 agree
     *   c  10 11         10 11 12      the reference stopped sooner: first divergence 2; 2 of 2 agree
     *   d  5             6             first divergence 0; 0 of 1
     * response_equal_pct 25; first_divergence_median of {0,1,2,4} = 1.5; agreement 9 / 11 */
    const hand_seq R[] = {{"a", {10, 11, 12, 13}, 4, -1}, {"b", {10, 11, 12, 13}, 4, 5}, {"c", {10, 11}, 2, -1},
                          {"d", {5}, 1, -1}};
    const hand_seq T[] = {{"a", {10, 11, 12, 13}, 4, -1}, {"b", {10, 20, 12, 13}, 4, -1}, {"c", {10, 11, 12}, 3, 2},
                          {"d", {6}, 1, -1}};
    const char *dir = temp_dir();
    const char *r = write_gen_run(dir, "r", R, 4, false), *t = write_gen_run(dir, "t", T, 4, false);
    char pos[4200];
    snprintf(pos, sizeof pos, "%s/positions.csv", dir);
    mf_error err = {0};
    int rc;
    json_t *d = diff_of(r, t, pos, &err, &rc);
    cr_assert_eq(rc, MF_OK, "%s", err.msg);
    json_t *tg = json_array_get(json_object_get(d, "targets"), 0), *resp = json_object_get(tg, "responses");
    cr_assert(resp, "a diff of two generated runs has responses");
    cr_assert_eq(json_integer_value(json_object_get(resp, "sequences")), 4);
    cr_assert_float_eq(value(resp, "response_equal_pct"), 25.0, 1e-12);
    cr_assert_float_eq(value(resp, "first_divergence_median"), 1.5, 1e-12);
    cr_assert_float_eq(value(resp, "generated_token_agreement_pct"), 100.0 * 9 / 11, 1e-12);
    /* compared: a 7 positions, b 4 (up to its divergence at 3 + 1), c 5, d 3; 19 in all, 4 of them generated in
     * a, 1 in b, 2 in c, 0 in d */
    cr_assert_eq(json_integer_value(json_object_get(resp, "generated_positions_compared")), 7);
    cr_assert_eq(json_integer_value(json_object_get(resp, "generated_positions_not_compared")), 4);
    /* the flip in b's reference at position 5 comes after b's divergence: not counted; c's target flip at 2 is */
    json_t *fl = json_object_get(tg, "flips");
    cr_assert_eq(json_integer_value(json_object_get(fl, "flipped_slots")), 1);
    json_t *ci = json_object_get(json_object_get(resp, "response_equal_pct"), "ci95");
    cr_assert(json_real_value(json_array_get(ci, 0)) <= 25.0 && json_real_value(json_array_get(ci, 1)) >= 25.0);
    json_decref(d);
    /* the positions CSV: 19 rows, the generated ones marked */
    char *csv = slurp(pos, NULL);
    int rows = 0, marked = 0;
    for (char *line = strtok(csv, "\n"); line; line = strtok(NULL, "\n")) {
        if (rows++ == 0) {
            cr_assert_str_eq(line, "target,seq,pos,token,first_flip_layer,flipped_slots,kl,sq_err,top1,generated");
            continue;
        }
        const char *last = strrchr(line, ',');
        marked += !strcmp(last, ",true");
    }
    cr_assert_eq(rows - 1, 19);
    cr_assert_eq(marked, 7);
    free(csv);
}

/* A teacher-forced target has the reference's tokens: no responses of its own to compare, every position
 * compared. Prompts that differ are refused, naming the sequence. */
Test(responses, forced_targets_and_refusals) {
    const hand_seq R[] = {{"a", {10, 11, 12}, 3, -1}};
    const char *dir = temp_dir();
    const char *r = write_gen_run(dir, "r", R, 1, false), *f = write_gen_run(dir, "f", R, 1, true);
    mf_error err = {0};
    int rc;
    json_t *d = diff_of(r, f, NULL, &err, &rc);
    cr_assert_eq(rc, MF_OK, "%s", err.msg);
    json_t *tg = json_array_get(json_object_get(d, "targets"), 0);
    cr_assert_null(json_object_get(tg, "responses"));
    json_decref(d);
    /* a target whose prompt is longer: refused */
    hand_seq T[] = {{"a", {10, 11, 12}, 3, -1}};
    const char *t = write_gen_run(dir, "t", T, 1, false);
    char man[4400];
    snprintf(man, sizeof man, "%s/manifest.json", t);
    char *text = slurp(man, NULL);
    char *at = strstr(text, "\"generated\": 3");
    cr_assert(at);
    at[13] = '2';   /* the target now says its last 2 tokens were generated: a 4-token prompt */
    write_text(t, "manifest.json", text);
    free(text);
    d = diff_of(r, t, NULL, &err, &rc);
    cr_assert_neq(rc, MF_OK);
    cr_assert(strstr(err.msg, "sequence a") && strstr(err.msg, "prompt"), "%s", err.msg);
}
