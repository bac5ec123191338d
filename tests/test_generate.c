/* moeflip trace --generate: greedy continuations against Hugging Face's own
 * generate(do_sample=False) in float64 (tools/make_generate_fixtures.py, run
 * on the GPU machine: hf/<case>/generate.json), the stop tokens, argmax ties,
 * the decode path's records against the same tokens teacher-forced, the
 * marks of generated positions, and the refusals. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mf_trace.h"
#include "testutil.h"

/* The Hugging Face oracle of a fixture case. */
static json_t *hf_generate(const char *model) {
    char rel[256];
    snprintf(rel, sizeof rel, "%s/generate.json", model);
    json_error_t e;
    json_t *g = json_load_file(fixture(rel), 0, &e);
    cr_assert(g, "%s: %s (made by tools/make_generate_fixtures.py)", fixture(rel), e.text);
    return g;
}

/* The tokens of sequence id in run dir (malloc'ed), n their count, generated how many the run marks generated. */
static int32_t *run_tokens(const char *dir, const char *id, int *n, int *generated) {
    mf_run *r;
    mf_error err = {0};
    cr_assert_eq(mf_run_open(&r, dir, &err), MF_OK, "%s", err.msg);
    int32_t *out = NULL;
    for (size_t i = 0; i < r->n_seqs; i++) {
        if (strcmp(r->seqs[i].id, id)) continue;
        const mf_st_tensor *t;
        cr_assert_eq(mf_run_tensor(r, i, "tokens", &t, &err), MF_OK, "%s", err.msg);
        *n = r->seqs[i].length;
        *generated = r->seqs[i].generated;
        out = malloc((size_t)*n * sizeof *out);
        memcpy(out, t->data, (size_t)*n * sizeof *out);
    }
    mf_run_close(r);
    cr_assert(out, "%s: no sequence %s", dir, id);
    return out;
}

/* Every prompt of the case continued in fp64 gives Hugging Face's tokens, stopping where it stopped. */
static void matches_hf(const char *model) {
    json_t *g = hf_generate(model);
    const int N = (int)json_integer_value(json_object_get(g, "max_new_tokens"));
    cr_assert(N > 0);
    const char *dir = temp_dir();
    char opts[64];
    snprintf(opts, sizeof opts, "--precision fp64 --record routing --generate %d", N);
    const char *run = make_run(dir, "gen", model, opts);
    size_t i;
    json_t *s;
    int compared = 0;
    json_array_foreach(json_object_get(g, "sequences"), i, s) {
        const char *id = json_string_value(json_object_get(s, "id"));
        json_t *want = json_object_get(s, "tokens");
        const int prompt = (int)json_integer_value(json_object_get(s, "prompt_length"));
        int n, gen;
        int32_t *got = run_tokens(run, id, &n, &gen);
        cr_expect_eq(n, (int)json_array_size(want), "%s %s: %d tokens, Hugging Face %zu", model, id, n,
                     json_array_size(want));
        cr_expect_eq(gen, n - prompt, "%s %s: %d marked generated of %d after a %d-token prompt", model, id, gen, n,
                     prompt);
        for (int t = 0; t < n && t < (int)json_array_size(want); t++) {
            const int h = (int)json_integer_value(json_array_get(want, (size_t)t));
            double margin = t >= prompt ? json_real_value(json_array_get(json_object_get(s, "margins"), (size_t)(t - prompt))) : 0;
            cr_assert_eq(got[t], h, "%s %s position %d: token %d, Hugging Face %d (its margin there %.3g)", model, id,
                         t, got[t], h, margin);
        }
        free(got);
        compared++;
    }
    cr_assert_eq(compared, 3);
    json_decref(g);
}

Test(generate, llama) { matches_hf("hf/llama"); }
Test(generate, llama3_rope) { matches_hf("hf/llama_tied_llama3"); }
Test(generate, mixtral) { matches_hf("hf/mixtral"); }
Test(generate, mixtral_linear_rope) { matches_hf("hf/mixtral_linear_v4cfg"); }
Test(generate, olmoe) { matches_hf("hf/olmoe"); }
/* past max_position_embeddings: HF's dynamic NTK recomputes the frequencies at every step */
Test(generate, olmoe_dynamic_ntk) { matches_hf("hf/olmoe_dynamic"); }
Test(generate, qwen2_moe) { matches_hf("hf/qwen2_moe"); }
Test(generate, qwen2_moe_fused) { matches_hf("hf/qwen2_moe_fused_sparse"); }
Test(generate, qwen3_moe) { matches_hf("hf/qwen3_moe"); }
Test(generate, qwen3_moe_yarn) { matches_hf("hf/qwen3_moe_yarn_v4cfg"); }
Test(generate, tiny_olmoe) { matches_hf("hf/tiny_olmoe"); }
/* the DeepSeek family (tests/fixtures/hf26): latent attention's cache, grouped routers, FP8 weights */
Test(generate, deepseek_v3) { matches_hf("hf26/deepseek_v3"); }
Test(generate, deepseek_v3_noqlora) { matches_hf("hf26/deepseek_v3_noqlora"); }
Test(generate, deepseek_v3_yarn) { matches_hf("hf26/deepseek_v3_yarn"); }
Test(generate, deepseek_v3_fp8) { matches_hf("hf26/deepseek_v3_fp8"); }
Test(generate, deepseek_v2_greedy) { matches_hf("hf26/deepseek_v2_greedy"); }
Test(generate, deepseek_v2_group) { matches_hf("hf26/deepseek_v2_group"); }
Test(generate, glm4_moe) { matches_hf("hf26/glm4_moe"); }
/* gpt-oss: sinks and sliding windows (8) in the cache, the biased top-k router, MXFP4 experts */
Test(generate, gpt_oss) { matches_hf("hf26/gpt_oss"); }
Test(generate, gpt_oss_mxfp4) { matches_hf("hf26/gpt_oss_mxfp4"); }

/* generation_config.json's eos_token_id stops it after the first of them it generates (kept, as Hugging Face
 * keeps it); config.json's where there is no generation_config.json. */
Test(generate, stops_at_eos) {
    json_t *g = hf_generate("hf/olmoe");
    json_t *s0 = json_array_get(json_object_get(g, "sequences"), 0);
    json_t *want = json_object_get(s0, "tokens");
    const int prompt = (int)json_integer_value(json_object_get(s0, "prompt_length"));
    const int N = (int)json_integer_value(json_object_get(g, "max_new_tokens"));
    cr_assert(N >= 4 && (int)json_array_size(want) == prompt + N, "the oracle's s0 must run its full length");
    /* the stop token: HF's fourth generated token, where it does not come earlier */
    int stop_at = -1;
    for (int k = 0; k < N && stop_at < 0; k++) {
        const json_int_t tok = json_integer_value(json_array_get(want, (size_t)(prompt + k)));
        bool earlier = false;
        for (int j = 0; j < k; j++) earlier |= json_integer_value(json_array_get(want, (size_t)(prompt + j))) == tok;
        if (k >= 3 && !earlier) stop_at = k;
    }
    cr_assert(stop_at >= 0, "no generated token of s0 is new after the third");
    const int stop_tok = (int)json_integer_value(json_array_get(want, (size_t)(prompt + stop_at)));
    for (int variant = 0; variant < 2; variant++) {
        const char *m = copy_fixture_dir("hf/olmoe");
        char text[256], path[4400];
        if (variant == 0) {
            /* a list, the other id never generated */
            snprintf(text, sizeof text, "{\"eos_token_id\": [383, %d], \"pad_token_id\": 1}\n", stop_tok);
            write_text(m, "generation_config.json", text);
        } else {
            snprintf(path, sizeof path, "%s/generation_config.json", m);
            cr_assert_eq(unlink(path), 0);
            snprintf(path, sizeof path, "%s/config.json", m);
            char *cfg = slurp(path, NULL);
            char *at = strstr(cfg, "\"eos_token_id\": 2,");
            cr_assert(at, "the fixture's config.json says eos_token_id 2");
            char *edited = malloc(strlen(cfg) + 32);
            snprintf(edited, strlen(cfg) + 32, "%.*s\"eos_token_id\": %d,%s", (int)(at - cfg), cfg, stop_tok,
                     at + strlen("\"eos_token_id\": 2,"));
            write_text(m, "config.json", edited);
            free(edited);
            free(cfg);
        }
        const char *dir = temp_dir();
        char err[2048];
        cr_assert_eq(run_moeflip(err, sizeof err,
                                 "trace -q --model '%s' --input '%s/tokens.jsonl' --out '%s/r' --precision fp64 "
                                 "--generate %d --record routing",
                                 m, m, dir, N),
                     0, "%s", err);
        char run[4200];
        snprintf(run, sizeof run, "%s/r", dir);
        int n, gen;
        int32_t *got = run_tokens(run, "s0", &n, &gen);
        cr_assert_eq(gen, stop_at + 1, "variant %d: stopped after %d generated tokens, not at the stop token (%d)",
                     variant, gen, stop_at + 1);
        cr_assert_eq(got[n - 1], stop_tok, "the stop token is kept");
        for (int t = 0; t < n; t++) cr_assert_eq(got[t], (int)json_integer_value(json_array_get(want, (size_t)t)));
        snprintf(path, sizeof path, "%s/manifest.json", run);
        json_t *man = json_load_file(path, 0, NULL);
        json_t *gm = json_object_get(man, "generation");
        cr_assert_str_eq(json_string_value(json_object_get(gm, "eos_from")),
                         variant == 0 ? "generation_config.json" : "config.json");
        cr_assert_eq(json_array_size(json_object_get(gm, "eos_token_id")), variant == 0 ? 2u : 1u);
        json_decref(man);
        free(got);
    }
    json_decref(g);
}

/* torch.argmax's rule: the first of equal values; values compared as the head's dtype hands them over. */
Test(generate, argmax_ties_go_to_the_lower_id) {
    int32_t t;
    const double a[] = {1.0, 3.0, 3.0, 2.0};
    cr_assert_eq(mf_greedy_token(a, 4, MF_F64, &t), MF_OK);
    cr_assert_eq(t, 1);
    /* 1 + 2^-10 is 1 in bf16 (8 significant bits), not in fp32 */
    const double b[] = {0.5, 1.0, 1.0 + 0x1p-10};
    cr_assert_eq(mf_greedy_token(b, 3, MF_BF16, &t), MF_OK);
    cr_assert_eq(t, 1);
    cr_assert_eq(mf_greedy_token(b, 3, MF_F32, &t), MF_OK);
    cr_assert_eq(t, 2);
    const double c[] = {-INFINITY, -1e300, -INFINITY};
    cr_assert_eq(mf_greedy_token(c, 3, MF_F64, &t), MF_OK);
    cr_assert_eq(t, 1);
    const double d[] = {0.0, NAN, 1.0};
    cr_assert_neq(mf_greedy_token(d, 3, MF_F64, &t), MF_OK, "a NaN logit is refused, not skipped");
}

static char *export_of(const char *run, const char *fmt) {
    const char *dir = temp_dir();
    char err[1024];
    cr_assert_eq(run_moeflip(err, sizeof err, "export '%s' --format %s -o '%s/x'", run, fmt, dir), 0, "%s", err);
    char p[4200];
    snprintf(p, sizeof p, "%s/x", dir);
    return slurp(p, NULL);
}

/* On the CPU the decode path's records (one token a step against the cache) are the bits of one pass over the
 * same tokens: a generated run and the same tokens teacher-forced from it export the same bytes, at every
 * precision the CPU runs and under an emulated instruction. The forced run says what it is. */
Test(generate, decode_records_equal_the_teacher_forced_pass) {
    static const char *const cases[][2] = {{"hf/qwen2_moe", "--precision bf16"},
                                           {"hf/mixtral", "--precision fp32"},
                                           {"hf/olmoe", "--precision bf16 --numerics emu:cdna3"},
                                           {"hf/qwen3_moe", "--precision fp16 --numerics emu:hopper"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *dir = temp_dir();
        char opts[256];
        snprintf(opts, sizeof opts, "%s --generate 6", cases[c][1]);
        const char *gen = make_run(dir, "gen", cases[c][0], opts);
        char err[2048];
        cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s' --out '%s/forced' %s",
                                 fixture(cases[c][0]), gen, dir, cases[c][1]),
                     0, "%s", err);
        char forced[4200];
        snprintf(forced, sizeof forced, "%s/forced", dir);
        char *a = export_of(gen, "jsonl"), *b = export_of(forced, "jsonl");
        cr_assert(strcmp(a, b) == 0, "%s %s: the decode path's records differ from the forced pass's", cases[c][0],
                  cases[c][1]);
        cr_assert(strstr(a, "\"generated\": true"), "generated positions are marked");
        free(a);
        free(b);
        char p[4400];
        snprintf(p, sizeof p, "%s/manifest.json", forced);
        json_t *man = json_load_file(p, 0, NULL);
        json_t *g = json_object_get(man, "generation");
        cr_assert_str_eq(json_string_value(json_object_get(g, "strategy")), "teacher-forced");
        cr_assert_str_eq(json_string_value(json_object_get(g, "path")), "prefill");
        cr_assert_eq(json_integer_value(json_object_get(g, "max_new_tokens")), 6);
        json_decref(man);
    }
}

/* The rows of generated positions, and only those, say so: in JSON lines "generated": true, in the CSV a column
 * that a run without generation does not have. */
Test(generate, export_marks_generated_positions) {
    const char *dir = temp_dir();
    const char *gen = make_run(dir, "gen", "hf/olmoe", "--precision fp32 --generate 5");
    int n, g;
    free(run_tokens(gen, "s1", &n, &g));
    cr_assert_eq(n, 13 + g);
    char *j = export_of(gen, "jsonl");
    int marked = 0, rows = 0;
    for (char *line = strtok(j, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        cr_assert(o);
        const bool m = json_is_true(json_object_get(o, "generated"));
        const int pos = (int)json_integer_value(json_object_get(o, "pos"));
        if (!strcmp(json_string_value(json_object_get(o, "seq")), "s1")) {
            cr_assert_eq(m, pos >= 13, "s1 position %d", pos);
            marked += m;
            rows++;
        }
        json_decref(o);
    }
    cr_assert_eq(rows, n);
    cr_assert_eq(marked, g);
    free(j);
    char *c = export_of(gen, "csv");
    static const char gen_head[] = "seq,pos,token,layer,experts,weights,router_logits,shared_gate,generated\n";
    cr_assert(!strncmp(c, gen_head, strlen(gen_head)));
    cr_assert(strstr(c, ",true\n") && strstr(c, ",false\n"));
    free(c);
    const char *plain = make_run(dir, "plain", "hf/olmoe", "--precision fp32");
    c = export_of(plain, "csv");
    static const char head[] = "seq,pos,token,layer,experts,weights,router_logits,shared_gate\n";
    cr_assert(!strncmp(c, head, strlen(head)));
    cr_assert(!strstr(c, ",true\n"));
    free(c);
}

/* What is refused, with one line naming the file or option, before anything runs. */
Test(generate, refusals) {
    char err[2048];
    const char *m = fixture("hf/olmoe");
    const char *dir = temp_dir();
    cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s/tokens.jsonl' --out '%s/a' --generate 0",
                             m, m, dir), 2);
    cr_assert(strstr(err, "--generate"), "%s", err);
    const char *gen = make_run(dir, "gen", "hf/olmoe", "--precision fp32 --generate 3");
    cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s' --out '%s/b' --generate 3", m, gen,
                             dir), 1);
    cr_assert(strstr(err, "--generate takes a prompt file"), "%s", err);
    /* resuming with another generation is another run */
    cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s/tokens.jsonl' --out '%s' --precision fp32 "
                             "--generate 4 --resume", m, m, gen), 1);
    cr_assert(strstr(err, "generation"), "%s", err);
    static const char *const bad[] = {"{\"eos_token_id\": 384}", "{\"eos_token_id\": \"2\"}", "{\"eos_token_id\": [1, -1]}",
                                      "[2]", "{\"eos_token_id\": 2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *c = copy_fixture_dir("hf/olmoe");
        write_text(c, "generation_config.json", bad[i]);
        cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s/tokens.jsonl' --out '%s/c%zu' "
                                 "--generate 2", c, c, dir, i), 1, "%s", bad[i]);
        const char *nl = strchr(err, '\n');
        cr_assert(strstr(err, "generation_config.json") && (!nl || !nl[1]), "%s: %s", bad[i], err);
    }
}

/* A manifest that marks more positions generated than a sequence could have is refused by every reader. */
Test(generate, reader_refuses_impossible_marks) {
    const char *dir = temp_dir();
    const char *gen = make_run(dir, "gen", "hf/olmoe", "--precision fp32 --record routing --generate 3");
    char p[4400];
    snprintf(p, sizeof p, "%s/manifest.json", gen);
    char *text = slurp(p, NULL);
    static const char *const edits[][2] = {{"\"generated\": 3,", "\"generated\": 99,"},
                                           {"\"generated\": 3,", "\"generated\": -1,"},
                                           {"\"generated\": 3,", "\"generated\": \"3\","},
                                           {"\"max_new_tokens\": 3,", "\"max_new_tokens\": 2,"}};
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        char *at = strstr(text, edits[e][0]);
        cr_assert(at, "the manifest holds %s", edits[e][0]);
        char *edited = malloc(strlen(text) + 64);
        sprintf(edited, "%.*s%s%s", (int)(at - text), text, edits[e][1], at + strlen(edits[e][0]));
        write_text(gen, "manifest.json", edited);
        mf_run *r;
        mf_error err = {0};
        cr_assert_neq(mf_run_open(&r, gen, &err), MF_OK, "edit %zu accepted", e);
        cr_assert(strstr(err.msg, "generated") || strstr(err.msg, "max_new_tokens"), "%s", err.msg);
        free(edited);
    }
    write_text(gen, "manifest.json", text);
    mf_run *r;
    mf_error err = {0};
    cr_assert_eq(mf_run_open(&r, gen, &err), MF_OK, "%s", err.msg);
    mf_run_close(r);
    free(text);
}

/* A line's own "max_new_tokens" lowers --generate for it (0: traced, not continued); what it generates is the
 * first tokens of Hugging Face's continuation; a diff counts as responses only the sequences that were continued. */
Test(generate, a_line_lowers_its_own_limit, .timeout = 120) {
    json_t *g = hf_generate("hf/olmoe");
    const char *dir = temp_dir();
    FILE *in = fopen(fixture("hf/olmoe/tokens.jsonl"), "r");
    char line[8192], text[32768] = "";
    size_t used = 0;
    static const char *const limits[3] = {", \"max_new_tokens\": 2}", ", \"max_new_tokens\": 0}", "}"};
    for (int k = 0; k < 3 && fgets(line, sizeof line, in); k++) {
        char *end = strrchr(line, '}');
        cr_assert(end);
        *end = 0;
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%s\n", line, limits[k]);
    }
    fclose(in);
    write_text(dir, "limits.jsonl", text);
    char err[4096];
    cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model %s --input %s/limits.jsonl --out %s/lim --precision fp64 --record routing --generate 6",
                             fixture("hf/olmoe"), dir, dir),
                 0, "%s", err);
    char run[4200];
    snprintf(run, sizeof run, "%s/lim", dir);
    static const char *const ids[3] = {"s0", "s1", "s2"};
    const int want_gen[3] = {2, 0, 6};
    for (int k = 0; k < 3; k++) {
        int n, gen;
        int32_t *got = run_tokens(run, ids[k], &n, &gen);
        json_t *s = json_array_get(json_object_get(g, "sequences"), (size_t)k);
        const int prompt = (int)json_integer_value(json_object_get(s, "prompt_length"));
        cr_expect_eq(gen, want_gen[k], "%s: %d generated, its limit makes it %d", ids[k], gen, want_gen[k]);
        cr_expect_eq(n, prompt + want_gen[k]);
        for (int t = prompt; t < n; t++)
            cr_expect_eq(got[t], (int)json_integer_value(json_array_get(json_object_get(s, "tokens"), (size_t)t)), "%s position %d",
                         ids[k], t);
        free(got);
    }
    /* the run against itself: two responses (s0, s2), s1 not one */
    char out[4300];
    snprintf(out, sizeof out, "%s/d.json", dir);
    cr_assert_eq(run_moeflip(err, sizeof err, "diff %s %s -o %s", run, run, out), 0, "%s", err);
    json_t *d = json_load_file(out, 0, NULL);
    json_t *resp = json_object_get(json_array_get(json_object_get(d, "targets"), 0), "responses");
    cr_expect_eq(json_integer_value(json_object_get(resp, "sequences")), 2, "responses of s0 and s2 only");
    json_decref(d);
    json_decref(g);
}
