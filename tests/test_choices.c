/* Multiple-choice items: how a line's choices become tokens (lm-evaluation-harness's split of prompt + choice),
 * each choice's score against the sum of log-softmax terms computed here from the logits of a plain trace of
 * prompt + choice (both the CPU's session path, for one- and two-token choices, and its one-pass path), the
 * prediction, the refusals, teacher forcing keeping the items, and moeflip diff's answer metrics against hand
 * counts over runs whose scores were set by hand. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_trace.h"
#include "testutil.h"

#define MC_FILE "../../models/tiny-olmoe/sweep-texts.jsonl"
#define TINY "../../models/tiny-olmoe"

static json_t *manifest(const char *run) {
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", run);
    json_t *m = json_load_file(path, 0, NULL);
    cr_assert(m, "%s: no manifest", path);
    return m;
}

static json_t *seq_entry(json_t *m, const char *id) {
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(m, "sequences"), i, s) if (!strcmp(json_string_value(json_object_get(s, "id")), id)) return s;
    cr_assert_fail("no sequence %s", id);
    return NULL;
}

static mf_prompts load_items(const char *path, mf_error *err, int *rc) {
    mf_prompts p;
    *rc = mf_prompts_load_text(&p, path, 4096, fixture(TINY "/tokenizer.json"), err);
    return p;
}

/* A text choice's tokens are those encoding prompt + choice adds after the prompt's own (no special tokens). */
Test(choices, text_choices_split_as_the_harness_does) {
    mf_error err = {0};
    int rc;
    mf_prompts p = load_items(fixture(MC_FILE), &err, &rc);
    cr_assert_eq(rc, MF_OK, "%s", err.msg);
    mf_tokenizer *tok;
    cr_assert_eq(mf_tokenizer_load(&tok, fixture(TINY "/tokenizer.json"), &err), MF_OK, "%s", err.msg);
    json_t *lines[64];
    FILE *f = fopen(fixture(MC_FILE), "r");
    char buf[4096];
    size_t n = 0;
    while (fgets(buf, sizeof buf, f) && n < 64) lines[n++] = json_loads(buf, 0, NULL);
    fclose(f);
    cr_assert_eq(n, p.n);
    int items = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *choices = json_object_get(lines[i], "choices");
        const char *text = json_string_value(json_object_get(lines[i], "text"));
        if (!choices) {
            cr_expect_eq(p.seq[i].n_choices, 0);
            json_decref(lines[i]);
            continue;
        }
        items++;
        cr_assert_eq(p.seq[i].n_choices, (int)json_array_size(choices));
        cr_expect_eq(p.seq[i].answer, (int)json_integer_value(json_object_get(lines[i], "answer")));
        int32_t *ctx, *whole;
        size_t nc, nw;
        cr_assert_eq(mf_tokenizer_encode(tok, text, strlen(text), false, &ctx, &nc, &err), MF_OK);
        for (int k = 0; k < p.seq[i].n_choices; k++) {
            char joined[1024];
            snprintf(joined, sizeof joined, "%s%s", text, json_string_value(json_array_get(choices, (size_t)k)));
            cr_assert_eq(mf_tokenizer_encode(tok, joined, strlen(joined), false, &whole, &nw, &err), MF_OK);
            const mf_choice *c = &p.seq[i].choices[k];
            cr_assert_eq((size_t)c->n, nw - nc, "%s choice %d: %d tokens, the split gives %zu", p.seq[i].id, k, c->n, nw - nc);
            cr_expect(!memcmp(c->tokens, whole + nc, (size_t)c->n * sizeof(int32_t)), "%s choice %d", p.seq[i].id, k);
            free(whole);
        }
        free(ctx);
        json_decref(lines[i]);
    }
    cr_assert_eq(items, 12);
    mf_tokenizer_free(tok);
    mf_prompts_free(&p);
}

/* log softmax of row t of a [T, V] logits tensor at tok, in double, and whether tok is the row's argmax */
static double log_softmax_at(const double *x, int V, int t, int tok, bool *argmax) {
    const double *row = x + (size_t)t * V;
    double mx = row[0];
    int best = 0;
    for (int j = 1; j < V; j++)
        if (row[j] > mx) mx = row[j], best = j;
    long double s = 0;
    for (int j = 0; j < V; j++) s += expl((long double)row[j] - mx);
    *argmax = best == tok;
    return row[tok] - mx - (double)logl(s);
}

/* Every item's scores, as a bf16 trace and an fp64 trace record them, equal the log-softmax sums computed here from
 * the logits of plain traces of prompt + choice; the prediction is the best score; the run's log line counts them. */
static void scores_match_plain_traces(const char *precision) {
    const char *dir = temp_dir();
    char errbuf[4096] = "";
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "trace --model %s --input %s --out %s/mc --precision %s --record topk --threads 2",
                             fixture(TINY), fixture(MC_FILE), dir, precision),
                 0, "%s", errbuf);
    cr_assert(strstr(errbuf, "scored 12 multiple-choice items"), "%s", errbuf);
    /* the plain sequences: every item's prompt + choice, as tokens */
    mf_error err = {0};
    int rc;
    mf_prompts p = load_items(fixture(MC_FILE), &err, &rc);
    cr_assert_eq(rc, MF_OK, "%s", err.msg);
    char plain[4200];
    snprintf(plain, sizeof plain, "%s/plain.jsonl", dir);
    FILE *f = fopen(plain, "w");
    for (size_t i = 0; i < p.n; i++)
        for (int k = 0; k < p.seq[i].n_choices; k++) {
            fprintf(f, "{\"id\": \"%s.%d\", \"tokens\": [", p.seq[i].id, k);
            for (int t = 0; t < p.seq[i].T; t++) fprintf(f, "%s%d", t ? ", " : "", p.seq[i].tokens[t]);
            for (int t = 0; t < p.seq[i].choices[k].n; t++) fprintf(f, ", %d", p.seq[i].choices[k].tokens[t]);
            fprintf(f, "]}\n");
        }
    fclose(f);
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "trace --model %s --input %s --out %s/plain --precision %s --record logits --threads 2",
                             fixture(TINY), plain, dir, precision),
                 0, "%s", errbuf);
    char run[4200], mc[4200];
    snprintf(run, sizeof run, "%s/plain", dir);
    snprintf(mc, sizeof mc, "%s/mc", dir);
    mf_run *r;
    cr_assert_eq(mf_run_open(&r, run, &err), MF_OK, "%s", err.msg);
    json_t *m = manifest(mc);
    int session_items = 0, pass_items = 0;
    for (size_t i = 0; i < p.n; i++) {
        if (!p.seq[i].n_choices) continue;
        json_t *ch = json_object_get(seq_entry(m, p.seq[i].id), "choices");
        cr_assert(ch, "%s: no choices in the manifest", p.seq[i].id);
        int steps = 1, best = -1;
        double best_lp = 0;
        for (int k = 0; k < p.seq[i].n_choices; k++) {
            steps += p.seq[i].choices[k].n - 1;
            char id[256];
            snprintf(id, sizeof id, "%s.%d", p.seq[i].id, k);
            size_t si = 0;
            while (si < r->n_seqs && strcmp(r->seqs[si].id, id)) si++;
            cr_assert(si < r->n_seqs);
            const mf_st_tensor *lt;
            cr_assert_eq(mf_run_tensor(r, si, "logits", &lt, &err), MF_OK, "%s", err.msg);
            const int V = 4096, T = r->seqs[si].length;
            double *x = malloc((size_t)T * V * sizeof *x);
            for (size_t e = 0; e < (size_t)T * V; e++) x[e] = mf_load_as_f64(lt->data, lt->dtype, e);
            double want = 0;
            bool greedy = true;
            for (int t = 0; t < p.seq[i].choices[k].n; t++) {
                bool g;
                want += log_softmax_at(x, V, p.seq[i].T + t - 1, p.seq[i].choices[k].tokens[t], &g);
                greedy &= g;
            }
            free(x);
            const double got = json_number_value(json_array_get(json_object_get(ch, "logprob"), (size_t)k));
            cr_expect(fabs(got - want) <= 1e-9 * (1 + fabs(want)), "%s %s choice %d: logprob %.17g, from the logits %.17g",
                      precision, p.seq[i].id, k, got, want);
            cr_expect_eq(json_is_true(json_array_get(json_object_get(ch, "greedy"), (size_t)k)), greedy, "%s choice %d greedy",
                         p.seq[i].id, k);
            if (best < 0 || want > best_lp) best = k, best_lp = want;
        }
        cr_expect_eq(json_integer_value(json_object_get(ch, "predicted")), best, "%s: predicted", p.seq[i].id);
        cr_expect_eq(json_integer_value(json_object_get(ch, "answer")), p.seq[i].answer);
        if (steps <= p.seq[i].n_choices) session_items++;
        else pass_items++;
    }
    cr_assert(session_items > 0 && pass_items > 0, "both scoring paths taken (%d, %d)", session_items, pass_items);
    json_decref(m);
    mf_run_close(r);
    mf_prompts_free(&p);
}

Test(choices, bf16_scores_are_the_logits_log_softmax, .timeout = 300) { scores_match_plain_traces("bf16"); }
Test(choices, fp64_scores_are_the_logits_log_softmax, .timeout = 300) { scores_match_plain_traces("fp64"); }

/* Dynamic NTK (past max_position_embeddings) scores every choice in one pass of prompt + choice: its scores are
 * those of the plain pass too. */
Test(choices, dynamic_ntk_scores_in_one_pass, .timeout = 120) {
    const char *dir = temp_dir();
    /* olmoe_dynamic's s2 (34 tokens) runs past its 24 positions: its first 30 tokens as the prompt, the rest choices */
    FILE *f = fopen(fixture("hf/olmoe_dynamic/tokens.jsonl"), "r");
    char line[8192];
    json_t *s2 = NULL;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!strcmp(json_string_value(json_object_get(o, "id")), "s2")) s2 = o;
        else json_decref(o);
    }
    fclose(f);
    cr_assert(s2);
    json_t *toks = json_object_get(s2, "tokens");
    cr_assert_eq(json_array_size(toks), 34);
    char items[8192], plain[8192];
    int o1 = snprintf(items, sizeof items, "{\"id\": \"q\", \"tokens\": [");
    int o2 = snprintf(plain, sizeof plain, "{\"id\": \"q.0\", \"tokens\": [");
    for (int t = 0; t < 34; t++) {
        const int v = (int)json_integer_value(json_array_get(toks, (size_t)t));
        if (t < 30) o1 += snprintf(items + o1, sizeof items - (size_t)o1, "%s%d", t ? ", " : "", v);
        o2 += snprintf(plain + o2, sizeof plain - (size_t)o2, "%s%d", t ? ", " : "", v);
    }
    const int c0 = (int)json_integer_value(json_array_get(toks, 30)), c1 = (int)json_integer_value(json_array_get(toks, 31)),
              c2 = (int)json_integer_value(json_array_get(toks, 32)), c3 = (int)json_integer_value(json_array_get(toks, 33));
    snprintf(items + o1, sizeof items - (size_t)o1, "], \"choices\": [[%d, %d, %d, %d], [%d, %d, %d]], \"answer\": 0}\n", c0, c1,
             c2, c3, c3, c2, c1);
    snprintf(plain + o2, sizeof plain - (size_t)o2, "]}\n");
    write_text(dir, "items.jsonl", items);
    write_text(dir, "plain.jsonl", plain);
    char errbuf[2048];
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "trace --model %s --input %s/items.jsonl --out %s/mc --precision fp64 --record topk",
                             fixture("hf/olmoe_dynamic"), dir, dir),
                 0, "%s", errbuf);
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "trace --model %s --input %s/plain.jsonl --out %s/plain --precision fp64 --record logits",
                             fixture("hf/olmoe_dynamic"), dir, dir),
                 0, "%s", errbuf);
    char run[4200], mc[4200];
    snprintf(run, sizeof run, "%s/plain", dir);
    snprintf(mc, sizeof mc, "%s/mc", dir);
    mf_run *r;
    mf_error err = {0};
    cr_assert_eq(mf_run_open(&r, run, &err), MF_OK, "%s", err.msg);
    const mf_st_tensor *lt;
    cr_assert_eq(mf_run_tensor(r, 0, "logits", &lt, &err), MF_OK);
    const int V = r->vocab;
    double *x = malloc((size_t)34 * V * sizeof *x);
    for (size_t e = 0; e < (size_t)34 * V; e++) x[e] = mf_load_as_f64(lt->data, lt->dtype, e);
    double want = 0;
    bool g;
    for (int t = 30; t < 34; t++) want += log_softmax_at(x, V, t - 1, (int)json_integer_value(json_array_get(toks, (size_t)t)), &g);
    free(x);
    json_t *m = manifest(mc);
    const double got = json_number_value(json_array_get(json_object_get(json_object_get(seq_entry(m, "q"), "choices"), "logprob"), 0));
    cr_expect(fabs(got - want) <= 1e-9 * (1 + fabs(want)), "logprob %.17g, from the one pass's logits %.17g", got, want);
    json_decref(m);
    json_decref(s2);
    mf_run_close(r);
}

static void refused(const char *line, const char *needle) {
    const char *dir = temp_dir();
    write_text(dir, "p.jsonl", line);
    char path[4200];
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    mf_error err = {0};
    int rc;
    mf_prompts p = load_items(path, &err, &rc);
    cr_assert_neq(rc, MF_OK, "accepted: %s", line);
    cr_expect(strstr(err.msg, needle), "%s: the message \"%s\" does not say \"%s\"", line, err.msg, needle);
    cr_expect(strstr(err.msg, "p.jsonl:1"), "the message names the line: %s", err.msg);
    (void)p;
}

Test(choices, refusals) {
    refused("{\"id\": \"a\", \"text\": \"x\", \"choices\": [\" y\"]}\n", "2 to 64");
    refused("{\"id\": \"a\", \"text\": \"x\", \"choices\": \" y\"}\n", "2 to 64");
    refused("{\"id\": \"a\", \"text\": \"x\", \"choices\": [\" y\", \" z\"], \"answer\": 2}\n", "index of a choice");
    refused("{\"id\": \"a\", \"text\": \"x\", \"choices\": [\" y\", \" z\"], \"answer\": \"0\"}\n", "index of a choice");
    refused("{\"id\": \"a\", \"text\": \"x\", \"answer\": 0}\n", "without \"choices\"");
    refused("{\"id\": \"a\", \"tokens\": [1, 2], \"choices\": [[3], [4096]]}\n", "choice 1");
    refused("{\"id\": \"a\", \"tokens\": [1, 2], \"choices\": [[3], []]}\n", "choice 1");
    refused("{\"id\": \"a\", \"tokens\": [1, 2], \"choices\": [[3], 7]}\n", "choice 1");
    refused("{\"id\": \"a\", \"text\": \"x\", \"choices\": [\" y\", \"\"]}\n", "adds no token");
    refused("{\"id\": \"a\", \"text\": \"x\", \"max_new_tokens\": -1}\n", "max_new_tokens");
    refused("{\"id\": \"a\", \"tokens\": [1], \"max_new_tokens\": 1.5}\n", "max_new_tokens");
}

/* A text choice after a prompt given as tokens needs the tokenizer, and says so where there is none. */
Test(choices, a_text_choice_needs_the_tokenizer) {
    const char *dir = temp_dir();
    write_text(dir, "p.jsonl", "{\"id\": \"a\", \"tokens\": [1, 2], \"choices\": [\" y\", [5]]}\n");
    char path[4200];
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    mf_prompts p;
    mf_error err = {0};
    cr_assert_neq(mf_prompts_load_text(&p, path, 4096, NULL, &err), MF_OK);
    cr_expect(strstr(err.msg, "a choice given as text"), "%s", err.msg);
}

/* A run's items go with its tokens into a teacher-forced trace: the same choices, the same scores at the same
 * precision. */
Test(choices, teacher_forcing_keeps_the_items, .timeout = 300) {
    const char *dir = temp_dir();
    char errbuf[2048];
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "trace --model %s --input %s --out %s/a --precision bf16 --record routing --threads 2",
                             fixture(TINY), fixture(MC_FILE), dir),
                 0, "%s", errbuf);
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "trace --model %s --input %s/a --out %s/b --precision bf16 --record routing --threads 2",
                             fixture(TINY), dir, dir),
                 0, "%s", errbuf);
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    json_t *ma = manifest(a), *mb = manifest(b);
    size_t i;
    json_t *s;
    int items = 0;
    json_array_foreach(json_object_get(ma, "sequences"), i, s) {
        json_t *ca = json_object_get(s, "choices");
        json_t *cb = json_object_get(seq_entry(mb, json_string_value(json_object_get(s, "id"))), "choices");
        cr_expect(!ca == !cb);
        if (!ca) continue;
        items++;
        cr_expect(json_equal(ca, cb), "%s: the forced trace's choices differ", json_string_value(json_object_get(s, "id")));
    }
    cr_expect_eq(items, 12);
    json_decref(ma);
    json_decref(mb);
}

/* Sets the scores of a run's items by hand: choice `pick` of item k gets -1, the others -5 (pick -1: NaN scores). */
static void set_picks(const char *run, const int *picks, int n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", run);
    json_t *m = json_load_file(path, 0, NULL);
    size_t i;
    json_t *s;
    int k = 0;
    json_array_foreach(json_object_get(m, "sequences"), i, s) {
        json_t *ch = json_object_get(s, "choices");
        if (!ch || k >= n) continue;
        json_t *lp = json_object_get(ch, "logprob");
        for (size_t c = 0; c < json_array_size(lp); c++)
            json_array_set_new(lp, c, picks[k] < 0 ? json_null() : json_real((int)c == picks[k] ? -1.0 : -5.0));
        json_object_set_new(ch, "predicted", picks[k] < 0 ? json_null() : json_integer(picks[k]));
        k++;
    }
    cr_assert_eq(json_dump_file(m, path, 0), 0);
    json_decref(m);
}

/* answer_agreement_pct, accuracy_pct and the changed items against counts made by hand. The sweep's 12 items'
 * answers are 0,1,2,3,0,1,2,3,0,1,2,3. */
Test(choices, diff_answer_metrics_by_hand, .timeout = 300) {
    const char *dir = temp_dir();
    char errbuf[4096];
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "trace --model %s --input %s --out %s/ref --precision bf16 --record routing --threads 2",
                             fixture(TINY), fixture(MC_FILE), dir),
                 0, "%s", errbuf);
    char ref[4200], tgt[4200], out[4200];
    snprintf(ref, sizeof ref, "%s/ref", dir);
    snprintf(tgt, sizeof tgt, "%s/tgt", dir);
    snprintf(out, sizeof out, "%s/diff.json", dir);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp -r %s %s", ref, tgt);
    cr_assert_eq(system(cmd), 0);
    /* reference: right on items 0-5, wrong on 6-11 (answer + 1 mod 4); target: the same but 1, 7 changed to
     * right and 2 changed to wrong, and item 11 unscored */
    const int ans[12] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
    int rp[12], tp[12];
    for (int k = 0; k < 12; k++) rp[k] = k < 6 ? ans[k] : (ans[k] + 1) % 4;
    memcpy(tp, rp, sizeof tp);
    tp[1] = (ans[1] + 2) % 4;   /* right -> wrong */
    tp[7] = ans[7];             /* wrong -> right */
    tp[2] = (ans[2] + 3) % 4;   /* right -> wrong */
    tp[11] = -1;                /* NaN scores */
    set_picks(ref, rp, 12);
    set_picks(tgt, tp, 12);
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "diff %s %s -o %s", ref, tgt, out), 0, "%s", errbuf);
    json_t *d = json_load_file(out, 0, NULL);
    json_t *a = json_object_get(json_array_get(json_object_get(d, "targets"), 0), "answers");
    cr_assert(a, "diff.json has no answers");
    cr_expect_eq(json_integer_value(json_object_get(a, "items")), 12);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(a, "unscored"), "target")), 1);
    /* agreement over the 11 items both predicted: 8 agree (items 0, 3, 4, 5, 6, 8, 9, 10) */
    const double agree = json_number_value(json_object_get(json_object_get(a, "answer_agreement_pct"), "value"));
    cr_expect(fabs(agree - 800.0 / 11) < 1e-9, "answer_agreement_pct %.17g, by hand 8/11", agree);
    json_t *acc = json_object_get(a, "accuracy_pct");
    const double ar = json_number_value(json_object_get(json_object_get(acc, "reference"), "value"));
    const double at = json_number_value(json_object_get(json_object_get(acc, "target"), "value"));
    cr_expect(fabs(ar - 50.0) < 1e-9, "reference accuracy %.17g, by hand 6/12", ar);
    /* target: right on 0, 3, 4, 5, 7 of its 11 predicted items */
    cr_expect(fabs(at - 500.0 / 11) < 1e-9, "target accuracy %.17g, by hand 5/11", at);
    json_t *ci = json_object_get(json_object_get(acc, "reference"), "ci95");
    cr_expect(json_number_value(json_array_get(ci, 0)) < 50 && json_number_value(json_array_get(ci, 1)) > 50, "an interval around 50");
    json_t *changed = json_object_get(a, "changed");
    cr_assert_eq(json_array_size(changed), 4, "items 1, 2, 7 and 11 changed");
    static const char *const ids[4] = {"py-dict", "sql-create", "git-clone", "psql"};
    for (int k = 0; k < 4; k++) {
        json_t *e = NULL;
        for (size_t j = 0; j < json_array_size(changed); j++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(changed, j), "id")), ids[k])) e = json_array_get(changed, j);
        cr_assert(e, "%s is not listed as changed", ids[k]);
        cr_expect(fabs(json_number_value(json_object_get(e, "reference_margin")) - 4.0) < 1e-12, "margin -1 - -5");
        cr_expect_eq(json_integer_value(json_object_get(e, "reference")), rp[k == 0 ? 1 : k == 1 ? 2 : k == 2 ? 7 : 11]);
        if (k == 3) cr_expect(json_is_null(json_object_get(e, "target")), "psql's target pick is null");
    }
    json_decref(d);
}

/* A reader refuses an item whose recorded prediction is not what its scores make, and impossible values. */
Test(choices, reader_refuses_impossible_items, .timeout = 120) {
    const char *dir = temp_dir();
    char errbuf[4096];
    cr_assert_eq(run_moeflip(errbuf, sizeof errbuf, "trace --model %s --input %s --out %s/ref --precision bf16 --record routing --threads 2",
                             fixture(TINY), fixture(MC_FILE), dir),
                 0, "%s", errbuf);
    static const char *const edits[][2] = {
        {"predicted", "another"}, {"logprob", "a number <= 0"}, {"answer", "a choice's index"}, {"tokens", "token"}};
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        char run[4200], cmd[9000], path[4300];
        snprintf(run, sizeof run, "%s/r%zu", dir, e);
        snprintf(cmd, sizeof cmd, "cp -r %s/ref %s", dir, run);
        cr_assert_eq(system(cmd), 0);
        snprintf(path, sizeof path, "%s/manifest.json", run);
        json_t *m = json_load_file(path, 0, NULL);
        json_t *ch = json_object_get(seq_entry(m, "apt-install"), "choices");
        const int pred = (int)json_integer_value(json_object_get(ch, "predicted"));
        switch (e) {
        case 0: json_object_set_new(ch, "predicted", json_integer((pred + 1) % 4)); break;
        case 1: json_array_set_new(json_object_get(ch, "logprob"), 0, json_real(0.5)); break;
        case 2: json_object_set_new(ch, "answer", json_integer(4)); break;
        case 3: json_array_set_new(json_array_get(json_object_get(ch, "tokens"), 0), 0, json_integer(4096)); break;
        }
        cr_assert_eq(json_dump_file(m, path, 0), 0);
        json_decref(m);
        mf_run *r;
        mf_error err = {0};
        cr_assert_neq(mf_run_open(&r, run, &err), MF_OK, "edit %s accepted", edits[e][0]);
        cr_expect(strstr(err.msg, edits[e][1]) && strstr(err.msg, "apt-install"), "edit %s: %s", edits[e][0], err.msg);
    }
}
