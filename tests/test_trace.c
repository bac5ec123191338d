/* End to end through the command: trace -> inspect -> export, on the HF
 * fixtures and on synth checkpoints of every architecture. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_router.h"
#include "mf_trace.h"
#include "testutil.h"

/* The jsonl export follows docs/run-format.md ("Export") and agrees with HF's fp64 run. */
Test(trace, export_jsonl_schema_and_values) {
    const char *d = temp_dir();
    char run[4200], out[4200], err[2048];
    snprintf(run, sizeof run, "%s/run", d);
    snprintf(out, sizeof out, "%s/x.jsonl", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s --out %s --precision fp64 -q", fixture("hf/qwen2_moe"),
                             fixture("hf/qwen2_moe/tokens.jsonl"), run), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "export %s --format jsonl -o %s", run, out), 0, "%s", err);
    char *text = slurp(out, NULL);
    size_t n;
    double *ref_logits = read_tensor(fixture("hf/qwen2_moe/ref.safetensors"), "logits_fp64_s1", &n);
    double *ref_router = read_tensor(fixture("hf/qwen2_moe/ref.safetensors"), "router_fp64_s1", &n);
    const int lens[3] = {21, 13, 34}, V = 384, E = 12, K = 4;
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        cr_assert(o, "line %d is not JSON: %s", lines, je.text);
        const char *seq = json_string_value(json_object_get(o, "seq"));
        int pos = (int)json_integer_value(json_object_get(o, "pos"));
        json_t *logits = json_object_get(o, "logits"), *layers = json_object_get(o, "layers");
        cr_assert(seq && json_is_integer(json_object_get(o, "token")));
        cr_assert_eq(json_array_size(logits), (size_t)V);
        cr_assert_eq(json_array_size(layers), 3);
        for (int l = 0; l < 3; l++) {
            json_t *L = json_array_get(layers, (size_t)l);
            cr_assert_eq(json_integer_value(json_object_get(L, "layer")), l);
            json_t *ex = json_object_get(L, "experts"), *rl = json_object_get(L, "router_logits");
            cr_assert_eq(json_array_size(ex), (size_t)K);
            cr_assert_eq(json_array_size(json_object_get(L, "weights")), (size_t)K);
            cr_assert_eq(json_array_size(rl), (size_t)E);
            cr_assert(json_is_number(json_object_get(L, "shared_gate")), "qwen2_moe records its shared gate");
            /* experts are the canonical top-k of the exported router logits, in rank order */
            double s[12];
            uint16_t ids[4];
            for (int e = 0; e < E; e++) s[e] = json_number_value(json_array_get(rl, (size_t)e));
            mf_topk(s, E, K, ids);
            for (int k = 0; k < K; k++) cr_assert_eq(json_integer_value(json_array_get(ex, (size_t)k)), ids[k]);
            if (!strcmp(seq, "s1")) {   /* values: HF's fp64 run */
                for (int e = 0; e < E; e++)
                    cr_assert_float_eq(s[e], ref_router[((size_t)l * lens[1] + pos) * E + e], 1e-5);
            }
        }
        if (!strcmp(seq, "s1"))
            for (int v = 0; v < V; v += 17)
                cr_assert_float_eq(json_number_value(json_array_get(logits, (size_t)v)), ref_logits[(size_t)pos * V + v], 1e-5);
        json_decref(o);
    }
    cr_assert_eq(lines, 21 + 13 + 34);
    free(ref_logits);
    free(ref_router);
    free(text);
}

Test(trace, csv_export_and_inspect_json) {
    const char *d = temp_dir();
    char run[4200], out[4200], err[2048];
    snprintf(run, sizeof run, "%s/run", d);
    snprintf(out, sizeof out, "%s/x.csv", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s --out %s --precision fp32 --record routing -q",
                             fixture("hf/mixtral"), fixture("hf/mixtral/tokens.jsonl"), run), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "export %s --format csv -o %s", run, out), 0, "%s", err);
    char *text = slurp(out, NULL);
    int rows = 0;
    for (char *p = text; *p; p++) rows += *p == '\n';
    cr_assert_eq(rows, 1 + (21 + 13 + 34) * 3, "header + one row per (position, layer)");
    cr_assert(!strncmp(text, "seq,pos,token,layer,experts,weights,router_logits,shared_gate\n", 62));
    free(text);
    snprintf(out, sizeof out, "%s/i.json", d);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "inspect %s --json > %s", run, out);
    cr_assert_eq(run_moeflip(NULL, 0, "%s", cmd), 0);
    json_t *o = json_load_file(out, 0, NULL);
    cr_assert(o);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "summary"), "sequences")), 3);
    cr_assert_str_eq(json_string_value(json_object_get(o, "record")), "routing");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(o, "precision"), "name")), "fp32");
    cr_assert(json_is_true(json_object_get(o, "complete")));
    json_decref(o);
}

/* fp32 against HF's float64: fp32 rounding only. */
Test(trace, fp32_close_to_hf_fp64) {
    mf_error err = {0};
    mf_precision prec;
    cr_assert_eq(mf_precision_parse(&prec, "fp32", &err), MF_OK, "%s", err.msg);
    const char *cases[] = {"olmoe", "qwen3_moe", "mixtral"};
    for (int c = 0; c < 3; c++) {
        char dir[4200], ref[4300];
        snprintf(dir, sizeof dir, "%s", fixture("hf/"));
        strcat(dir, cases[c]);
        snprintf(ref, sizeof ref, "%s/ref.safetensors", dir);
        mf_model *m;
        cr_assert_eq(mf_runtime_load(&m, dir, &prec, &err), MF_OK, "%s", err.msg);
        mf_prompts ps;
        char tok[4300];
        snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
        cr_assert_eq(mf_prompts_load(&ps, tok, m->cfg.vocab, &err), MF_OK);
        mf_run_opts o = {.prec = prec, .threads = 2};
        mf_seq_result r;
        cr_assert_eq(mf_forward_cpu(m, &o, ps.seq[2].tokens, ps.seq[2].T, &r, &err), MF_OK);
        size_t n;
        double *hl = read_tensor(ref, "logits_fp64_s2", &n), mx = 0, d = 0;
        for (size_t i = 0; i < n; i++) {
            mx = fmax(mx, fabs(hl[i]));
            d = fmax(d, fabs(hl[i] - r.logits[i]));
            cr_assert_eq(r.logits[i], (double)(float)r.logits[i], "fp32 logits hold fp32 values");
        }
        cr_assert_leq(d / mx, 2e-6, "%s: fp32 vs HF fp64 %g", cases[c], d / mx);
        free(hl);
        mf_seq_result_free(&r);
        mf_prompts_free(&ps);
        mf_model_free(m);
    }
}

/* synth: every architecture, deterministic, loads and traces. */
Test(trace, synth_every_architecture) {
    const char *archs[] = {"llama", "olmoe", "qwen2_moe", "mixtral", "qwen3_moe"};
    for (int a = 0; a < 5; a++) {
        const char *d1 = temp_dir(), *d2 = temp_dir();
        char err[2048], run[4200], p1[4300], p2[4300];
        cr_assert_eq(run_moeflip(err, sizeof err, "synth --arch %s --seed 11 -o %s", archs[a], d1), 0, "%s", err);
        cr_assert_eq(run_moeflip(err, sizeof err, "synth --arch %s --seed 11 -o %s", archs[a], d2), 0, "%s", err);
        snprintf(p1, sizeof p1, "%s/model.safetensors", d1);
        snprintf(p2, sizeof p2, "%s/model.safetensors", d2);
        char h1[33], h2[33];
        mf_error e = {0};
        cr_assert_eq(mf_digest_file(p1, h1, &e), MF_OK, "%s", e.msg);
        cr_assert_eq(mf_digest_file(p2, h2, &e), MF_OK, "%s", e.msg);
        cr_assert_str_eq(h1, h2, "%s: same seed, same weights", archs[a]);
        snprintf(run, sizeof run, "%s/run", d1);
        snprintf(p1, sizeof p1, "%s/tokens.jsonl", d1);
        cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s --out %s --precision bf16 -q", d1, p1, run), 0,
                     "%s: %s", archs[a], err);
        mf_run *r;
        cr_assert_eq(mf_run_open(&r, run, &e), MF_OK, "%s", e.msg);
        cr_assert_eq(r->n_seqs, 3);
        cr_assert_str_eq(r->arch, archs[a]);
        cr_assert_eq(r->n_moe, a == 0 ? 0 : 3);
        mf_run_close(r);
    }
    /* another seed, other weights: both synths must succeed, or two missing files would "differ" */
    const char *d3 = temp_dir(), *d4 = temp_dir();
    char err[2048], p[4300], h12[33], h11[33];
    mf_error e = {0};
    cr_assert_eq(run_moeflip(err, sizeof err, "synth --arch olmoe --seed 12 -o %s", d3), 0, "%s", err);
    snprintf(p, sizeof p, "%s/model.safetensors", d3);
    cr_assert_eq(mf_digest_file(p, h12, &e), MF_OK, "%s", e.msg);
    cr_assert_eq(run_moeflip(err, sizeof err, "synth --arch olmoe --seed 11 -o %s", d4), 0, "%s", err);
    snprintf(p, sizeof p, "%s/model.safetensors", d4);
    cr_assert_eq(mf_digest_file(p, h11, &e), MF_OK, "%s", e.msg);
    cr_assert_str_neq(h12, h11, "another seed, other weights");
}

Test(trace, record_levels) {
    const char *d = temp_dir();
    const char *run = make_run(d, "topk", "hf/olmoe", "--record topk");
    mf_run *r;
    mf_error e = {0};
    cr_assert_eq(mf_run_open(&r, run, &e), MF_OK, "%s", e.msg);
    const mf_st_tensor *t;
    cr_assert_eq(mf_run_tensor(r, 0, "logits", &t, &e), MF_OK);
    cr_assert_null(t);
    cr_assert_eq(mf_run_tensor(r, 0, "topk_logits", &t, &e), MF_OK);
    cr_assert_not_null(t);
    cr_assert_eq(t->shape[1], 64);
    /* descending, and logsumexp >= the top logit */
    double prev = INFINITY;
    for (int i = 0; i < 64; i++) {
        double v = mf_load_as_f64(t->data, t->dtype, (size_t)i);
        cr_assert_leq(v, prev);
        prev = v;
    }
    const mf_st_tensor *lse;
    cr_assert_eq(mf_run_tensor(r, 0, "logsumexp", &lse, &e), MF_OK, "%s", e.msg);
    cr_assert_not_null(lse, "a topk run records logsumexp");
    cr_assert_geq(mf_load_as_f64(lse->data, MF_F64, 0), mf_load_as_f64(t->data, t->dtype, 0));
    mf_run_close(r);
    run = make_run(d, "full", "hf/olmoe", "--record full");
    cr_assert_eq(mf_run_open(&r, run, &e), MF_OK, "%s", e.msg);
    cr_assert_eq(mf_run_tensor(r, 1, "router_in", &t, &e), MF_OK);
    cr_assert_not_null(t);
    cr_assert_eq(t->shape[2], 64);
    mf_run_close(r);
}

/* The digests a writer computed stand for a second hashing pass (moeflip serve), and must match the manifest;
 * unknown shards are hashed; the unhashed open leaves the digests to the caller. */
static const char *given_digest(void *ud, const char *file) {
    (void)file;
    return ud;
}

Test(trace, open_with_given_digests) {
    const char *run = make_run(temp_dir(), "r", "hf/olmoe", "--record routing");
    char shard[4300];
    mf_run *r;
    mf_error e = {0};
    cr_assert_eq(mf_run_open(&r, run, &e), MF_OK, "%s", e.msg);
    cr_assert_eq(r->n_shards, 1);
    char right[33];
    memcpy(right, r->shard_digest[0], 33);
    snprintf(shard, sizeof shard, "%s/%s", run, r->shard_files[0]);
    mf_run_close(r);
    cr_assert_eq(mf_run_open_given(&r, run, given_digest, right, &e), MF_OK, "%s", e.msg);
    mf_run_close(r);
    char wrong[33];
    memcpy(wrong, right, 33);
    wrong[0] = wrong[0] == '0' ? '1' : '0';
    e = (mf_error){0};
    cr_assert_eq(mf_run_open_given(&r, run, given_digest, wrong, &e), MF_EDIGEST);
    cr_assert(strstr(e.msg, "damaged shard"), "%s", e.msg);
    /* a damaged byte: hashed where nothing is given, not seen by the unhashed open */
    FILE *fp = fopen(shard, "r+b");
    cr_assert(fp, "cannot open %s", shard);
    cr_assert_eq(fseek(fp, -3, SEEK_END), 0);
    const int ch = fgetc(fp);
    cr_assert_neq(ch, EOF);
    cr_assert_eq(fseek(fp, -3, SEEK_END), 0);
    cr_assert_eq(fputc(ch ^ 1, fp), ch ^ 1);
    cr_assert_eq(fclose(fp), 0, "the damaged byte was not written");
    e = (mf_error){0};
    cr_assert_eq(mf_run_open_given(&r, run, given_digest, NULL, &e), MF_EDIGEST);
    cr_assert_eq(mf_run_open(&r, run, &e), MF_EDIGEST);
    cr_assert_eq(mf_run_open_unhashed(&r, run, &e), MF_OK, "%s", e.msg);
    cr_assert_str_eq(r->shard_digest[0], right);
    mf_run_close(r);
}

/* Threads change nothing: every product is one fixed fma chain. */
Test(trace, thread_count_does_not_change_results) {
    const char *d = temp_dir();
    char r1[4200], r2[4200], e1[4300], e2[4300], err[2048];
    snprintf(r1, sizeof r1, "%s/a", d);
    snprintf(r2, sizeof r2, "%s/b", d);
    snprintf(e1, sizeof e1, "%s/a.jsonl", d);
    snprintf(e2, sizeof e2, "%s/b.jsonl", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s --out %s --threads 1 -q", fixture("hf/qwen3_moe"),
                             fixture("hf/qwen3_moe/tokens.jsonl"), r1), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s --out %s --threads 2 -q", fixture("hf/qwen3_moe"),
                             fixture("hf/qwen3_moe/tokens.jsonl"), r2), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "export %s --format jsonl -o %s", r1, e1), 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "export %s --format jsonl -o %s", r2, e2), 0, "%s", err);
    char *a = slurp(e1, NULL), *b = slurp(e2, NULL);
    cr_assert(strlen(a) > 1000 && strcmp(a, b) == 0);
    free(a);
    free(b);
}
