/* Hostile inputs (issue 17): a run, a capture, a checkpoint, a config or a
 * client that lies gets one clear refusal, never a crash, a hang or a wrong
 * number. Every input is made here, from a run traced of a fixture and then
 * changed: where a shard is changed, its digest and size are recomputed into
 * the manifest, so that the lie passes the digest check and reaches the
 * checks behind it. */
#include "test_serve_util.h"
#include "mf_diff.h"
#include "mf_serve.h"
#include "mf_trace.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define AUTH "Authorization: Bearer " TEST_TOKEN "\r\n"
#define ERR_CAP 8192

/* ---- helpers ------------------------------------------------------------------ */

static const char *join(const char *dir, const char *name) {
    static char buf[8][9000];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, 9000, "%s/%s", dir, name);
    return b;
}

static json_t *manifest_of(const char *run) {
    json_error_t jerr;
    json_t *m = json_load_file(join(run, "manifest.json"), 0, &jerr);
    cr_assert(m, "%s: %s", run, jerr.text);
    return m;
}

static void save_manifest(const char *run, json_t *m) {
    cr_assert_eq(json_dump_file(m, join(run, "manifest.json"), JSON_INDENT(1) | JSON_PRESERVE_ORDER), 0);
    json_decref(m);
}

/* A copy of run (a directory of files) at dir/name. */
static const char *copy_run(const char *run, const char *dir, const char *name) {
    static char out[8][4400];
    static int next;
    char *o = out[next++ % 8];
    snprintf(o, 4400, "%s/%s", dir, name);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", run, o);
    cr_assert_eq(system(cmd), 0);
    return o;
}

/* Records shard i's real size and digest in the manifest (after the test changed the shard). */
static void reseal_shard(const char *run, size_t i) {
    json_t *m = manifest_of(run), *sh = json_array_get(json_object_get(m, "shards"), i);
    const char *file = join(run, json_string_value(json_object_get(sh, "file")));
    char d[33];
    mf_error e = {0};
    cr_assert_eq(mf_digest_file(file, d, &e), MF_OK, "%s", e.msg);
    struct stat st;
    cr_assert_eq(stat(file, &st), 0);
    json_object_set_new(sh, "digest", json_string(d));
    json_object_set_new(sh, "bytes", json_integer((json_int_t)st.st_size));
    save_manifest(run, m);
}

/* Rewrites shard 0 of run: the tensor `drop` left out (if not NULL), tensor `name` added or replaced by the given
 * one (if not NULL); then reseals it. */
static void rewrite_shard(const char *run, const char *drop, const char *name, mf_dtype dt, int ndim, const int64_t *shape,
                          const void *data) {
    json_t *m = manifest_of(run);
    char file[4400];
    snprintf(file, sizeof file, "%s", join(run, json_string_value(json_object_get(json_array_get(json_object_get(m, "shards"), 0), "file"))));
    json_decref(m);
    mf_st_file *f;
    mf_error e = {0};
    cr_assert_eq(mf_st_open(&f, file, &e), MF_OK, "%s", e.msg);
    mf_st_writer *w = mf_st_writer_new();
    for (size_t i = 0; i < f->count; i++) {
        const mf_st_tensor *t = &f->tensors[i];
        if ((drop && !strcmp(t->name, drop)) || (name && !strcmp(t->name, name))) continue;
        mf_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    if (name) mf_st_writer_add(w, name, dt, ndim, shape, data);
    mf_st_writer_meta(w, "format", "moeflip-run");
    mf_st_close(f);
    cr_assert_eq(mf_st_writer_write(w, file, &e), MF_OK, "%s", e.msg);
    mf_st_writer_free(w);
    reseal_shard(run, 0);
}

/* mf_run_open refuses run with code rc and a message holding want. */
static void open_refuses(const char *run, int rc, const char *want) {
    mf_run *r = NULL;
    mf_error e = {0};
    cr_assert_eq(mf_run_open(&r, run, &e), rc, "mf_run_open gave %d (%s), expected %d", e.code, e.msg, rc);
    cr_assert_null(r);
    cr_assert(strstr(e.msg, want), "message does not say \"%s\": %s", want, e.msg);
}

static void assert_one_line(const char *err) {
    size_t n = strlen(err);
    cr_assert(n > 9 && err[n - 1] == '\n' && strchr(err, '\n') == err + n - 1, "not one line: [%s]", err);
    cr_assert(!strncmp(err, "moeflip", 7), "%s", err);
    cr_assert(strlen(err) > strlen("moeflip: \n"), "an empty message: [%s]", err);
}

/* `moeflip CMD` exits status with one line on stderr holding want. */
static void command_fails(int status, const char *want, const char *fmt, const char *arg) {
    char err[ERR_CAP], args[4600];
    snprintf(args, sizeof args, fmt, arg);
    const int st = run_moeflip(err, sizeof err, "%s", args);
    cr_assert_eq(st, status, "moeflip %s exited %d: %s", args, st, err);
    assert_one_line(err);
    cr_assert(strstr(err, want), "moeflip %s: message does not say \"%s\": %s", args, want, err);
}

/* A routing run of the olmoe fixture (3 sequences, 3 MoE layers, 16 experts, top-4, vocabulary 384), made once per
 * test in a fresh directory. */
static const char *routing_run(const char *dir) { return make_run(dir, "r", "hf/olmoe", "--record routing --precision fp32"); }

/* ---- 1. the manifest against itself --------------------------------------------- */

Test(run_manifest, a_sequence_listed_twice_is_refused, .description = "it was counted twice") {
    const char *run = routing_run(temp_dir());
    json_t *m = manifest_of(run), *seqs = json_object_get(m, "sequences");
    json_array_append(seqs, json_array_get(seqs, 0));
    json_object_set_new(json_object_get(m, "input"), "n_sequences", json_integer(4));
    save_manifest(run, m);
    open_refuses(run, MF_EFORMAT, "sequence s0 is listed twice");
}

Test(run_manifest, lengths_outside_a_prompt_file_are_refused) {
    const long long bad[] = {-1, 0, (1 << 20) + 1, 4294967317LL};   /* the last one is 21 modulo 2^32 */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *run = routing_run(temp_dir());
        json_t *m = manifest_of(run);
        json_object_set_new(json_array_get(json_object_get(m, "sequences"), 0), "length", json_integer(bad[i]));
        save_manifest(run, m);
        open_refuses(run, MF_EFORMAT, "sequence s0: length must be an integer from 1 to 1048576");
    }
}

Test(run_manifest, shard_entries_that_lie_are_refused) {
    const char *d = temp_dir(), *run = routing_run(d);
    /* the size: the digest is right, the size is not (a negative one, and one byte more) */
    const long long sizes[] = {-5, 1};
    for (int k = 0; k < 2; k++) {
        const char *c = copy_run(run, d, k ? "plus" : "neg");
        json_t *m = manifest_of(c), *sh = json_array_get(json_object_get(m, "shards"), 0);
        json_object_set_new(sh, "bytes", json_integer(k ? json_integer_value(json_object_get(sh, "bytes")) + sizes[k] : sizes[k]));
        save_manifest(c, m);
        open_refuses(c, MF_EFORMAT, k ? "bytes, the manifest records" : "shard entry 0 is malformed");
        /* push opens runs unhashed: the size is checked there too (it said "changed size while pushing") */
        mf_run *r = NULL;
        mf_error e = {0};
        cr_assert_eq(mf_run_open_unhashed(&r, c, &e), MF_EFORMAT, "%s", e.msg);
    }
    /* a shard listed twice */
    const char *c = copy_run(run, d, "twice");
    json_t *m = manifest_of(c), *shards = json_object_get(m, "shards");
    json_array_append(shards, json_array_get(shards, 0));
    save_manifest(c, m);
    open_refuses(c, MF_EFORMAT, "shard part-00000.safetensors is listed twice");
}

Test(run_manifest, odd_moe_layers_are_refused) {
    const char *d = temp_dir(), *run = routing_run(d);
    const char *lists[] = {"[0, 0, 1]", "[0, 1, 3]", "[2, 1, 0]", "[0, 1, -1]", "[0, 1, \"2\"]", "[0, 1, 2, 2]"};
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        const char *c = copy_run(run, d, i % 2 ? "a" : "b");
        json_t *m = manifest_of(c);
        json_object_set_new(json_object_get(m, "model"), "moe_layers", json_loads(lists[i], 0, NULL));
        save_manifest(c, m);
        open_refuses(c, MF_EFORMAT, "model.moe_layers");
        char cmd[4500];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", c);
        cr_assert_eq(system(cmd), 0);
    }
}

Test(run_manifest, fields_readers_index_by_must_have_their_types) {
    const char *d = temp_dir(), *run = routing_run(d);
    static const struct { const char *key, *json, *want; } cases[] = {
        {"n_experts", "\"many\"", "model.n_experts must be an integer"},
        {"n_experts", "100000", "model.n_experts must be an integer from 0 to 1024"},
        {"top_k", "0", "0 < top_k <= n_experts"},
        {"top_k", "17", "top_k 17, n_experts 16"},
        {"vocab", "-384", "model.vocab"},
        {"n_layers", "2", "model.moe_layers lists 3 layers of a 2-layer model"},
        {"architecture", "7", "model.architecture must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *c = copy_run(run, d, i % 2 ? "a" : "b");
        json_t *m = manifest_of(c);
        json_object_set_new(json_object_get(m, "model"), cases[i].key, json_loads(cases[i].json, JSON_DECODE_ANY, NULL));
        save_manifest(c, m);
        open_refuses(c, MF_EFORMAT, cases[i].want);
        char cmd[4500];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", c);
        cr_assert_eq(system(cmd), 0);
    }
}

/* inspect said "digests verified" of a manifest that contradicts itself. */
Test(run_manifest, inspect_refuses_a_contradictory_manifest) {
    const char *run = routing_run(temp_dir());
    json_t *m = manifest_of(run);
    json_object_set_new(json_object_get(m, "input"), "n_sequences", json_integer(7));   /* complete, 3 of 7 */
    save_manifest(run, m);
    command_fails(1, "marked complete with 3 of the input's 7 sequences", "inspect '%s'", run);
    command_fails(1, "marked complete", "export '%s' --format csv", run);
}

Test(run_manifest, a_key_given_twice_is_refused) {
    const char *run = routing_run(temp_dir());
    char *text;
    size_t len;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(join(run, "manifest.json"), &text, &len, &e), MF_OK);
    char *brace = strrchr(text, '}');
    cr_assert(brace);
    char *out = malloc(len + 64);
    snprintf(out, len + 64, "%.*s, \"complete\": false}\n", (int)(brace - text), text);
    write_text(run, "manifest.json", out);
    free(out);
    free(text);
    open_refuses(run, MF_EFORMAT, "not a valid manifest");
}

/* ---- 3. tensors against the manifest and each other ------------------------------ */

/* A topk run whose topk_tokens is missing crashed export; one with a wrongly shaped topk_tokens printed other
 * tensors' bytes as token ids. */
Test(run_tensors, a_topk_run_needs_all_its_topk_tensors) {
    const char *d = temp_dir(), *run = make_run(d, "k", "hf/olmoe", "--record topk --precision fp32");
    const char *c = copy_run(run, d, "missing");
    rewrite_shard(c, "s1/topk_tokens", NULL, MF_DTYPE_INVALID, 0, NULL, NULL);
    open_refuses(c, MF_EFORMAT, "sequence s1: no topk_tokens in part-00000.safetensors (a topk run");
    command_fails(1, "no topk_tokens", "export '%s' --format jsonl", c);
    /* the right number of bytes as another shape: [13, 8] int32 where [13, 64] is due */
    c = copy_run(run, d, "narrow");
    int32_t ids[13 * 8];
    for (int i = 0; i < 13 * 8; i++) ids[i] = i % 384;
    const int64_t shape[2] = {13, 8};
    rewrite_shard(c, NULL, "s1/topk_tokens", MF_I32, 2, shape, ids);
    open_refuses(c, MF_EFORMAT, "sequence s1: topk_tokens is I32 [13, 8]; the manifest implies I32 [T=13, P=64]");
}

Test(run_tensors, ids_outside_the_model_are_refused) {
    const char *d = temp_dir(), *run = make_run(d, "k", "hf/olmoe", "--record topk --precision fp32");
    /* a token id past the vocabulary */
    const char *c = copy_run(run, d, "tok");
    int32_t toks[13];
    for (int i = 0; i < 13; i++) toks[i] = i;
    toks[7] = 384;
    const int64_t shape[1] = {13};
    rewrite_shard(c, NULL, "s1/tokens", MF_I32, 1, shape, toks);
    open_refuses(c, MF_EFORMAT, "sequence s1: tokens holds token 384 at position 7 (the vocabulary is [0, 384))");
    /* a negative top-k token id */
    c = copy_run(run, d, "topk");
    int32_t tk[13 * 64];
    for (int i = 0; i < 13 * 64; i++) tk[i] = i % 64;
    tk[5 * 64 + 3] = -2;
    const int64_t kshape[2] = {13, 64};
    rewrite_shard(c, NULL, "s1/topk_tokens", MF_I32, 2, kshape, tk);
    open_refuses(c, MF_EFORMAT, "topk_tokens holds token -2 at position 5");
}

Test(run_tensors, tensors_the_record_or_the_model_excludes_are_refused) {
    const char *d = temp_dir(), *run = routing_run(d);
    /* logits in a routing run */
    const char *c = copy_run(run, d, "logits");
    double *z = calloc(13 * 384, sizeof(double));
    const int64_t shape[2] = {13, 384};
    rewrite_shard(c, NULL, "s1/logits", MF_F64, 2, shape, z);
    free(z);
    open_refuses(c, MF_EFORMAT, "has a logits tensor, which a routing run of this model does not record");
    /* a shared gate where the model has no shared expert */
    c = copy_run(run, d, "shared");
    double g[3 * 13] = {0};
    const int64_t gs[2] = {3, 13};
    rewrite_shard(c, NULL, "s1/shared_gate", MF_F64, 2, gs, g);
    open_refuses(c, MF_EFORMAT, "a model without a shared expert");
}

/* A tensor no sequence of the shard owns: a stray name, or another shard's sequence's (a tensor in two shards,
 * of which a reader would take one). */
Test(run_tensors, a_tensor_no_sequence_owns_is_refused) {
    const char *d = temp_dir();
    const char *run = make_run(d, "two", "hf/olmoe", "--record routing --precision fp32 --shard-seqs 2");
    json_t *m = manifest_of(run);
    cr_assert_eq(json_array_size(json_object_get(m, "shards")), 2);
    json_decref(m);
    const char *c = copy_run(run, d, "stray");
    const int32_t x[1] = {0};
    const int64_t one[1] = {1};
    rewrite_shard(c, NULL, "notes/tokens", MF_I32, 1, one, x);
    open_refuses(c, MF_EFORMAT, "tensor notes/tokens belongs to no sequence the manifest places in this shard");
    /* s2 lives in part-00001: a copy of its tokens in part-00000 */
    c = copy_run(run, d, "dup");
    mf_st_file *f;
    mf_error e = {0};
    cr_assert_eq(mf_st_open(&f, join(c, "part-00001.safetensors"), &e), MF_OK, "%s", e.msg);
    const mf_st_tensor *t = mf_st_find(f, "s2/tokens");
    cr_assert(t);
    int32_t *copy = malloc(t->nbytes);
    memcpy(copy, t->data, t->nbytes);
    const int64_t n[1] = {t->shape[0]};
    mf_st_close(f);
    rewrite_shard(c, NULL, "s2/tokens", MF_I32, 1, n, copy);
    free(copy);
    open_refuses(c, MF_EFORMAT, "part-00000.safetensors: tensor s2/tokens belongs to no sequence");
}

/* ---- 4. readers: export --------------------------------------------------------- */

/* One 4-token sequence of the olmoe fixture's shape, values set by the test, written with the run writer. */
typedef struct hand {
    int vocab, experts;
    const char *id;
    uint16_t ids[3 * 4 * 4];
    double router[3 * 4 * 16];
    double *logits;   /* [4][vocab] */
} hand;

static void hand_init(hand *h, int vocab) {
    memset(h, 0, sizeof *h);
    h->vocab = vocab;
    h->experts = 16;
    h->id = "x";
    for (int s = 0; s < 12; s++)
        for (int k = 0; k < 4; k++) h->ids[s * 4 + k] = (uint16_t)k;
    for (int s = 0; s < 12; s++)
        for (int e = 0; e < 16; e++) h->router[s * 16 + e] = -e;
    h->logits = calloc((size_t)4 * (size_t)vocab, sizeof(double));
}

static void write_hand(const char *dir, const hand *h) {
    mf_config cfg;
    mf_error err = {0};
    cr_assert_eq(mf_config_load(&cfg, join(fixture("hf/olmoe"), "config.json"), &err), MF_OK, "%s", err.msg);
    cfg.vocab = h->vocab;
    cfg.n_experts = h->experts;
    int32_t tokens[4] = {5, 6, 7, 8};
    mf_prompt p = {.id = (char *)h->id, .tokens = tokens, .T = 4};
    mf_prompts ps = {&p, 1, "0"};
    mf_precision prec;
    mf_precision_parse(&prec, "fp32", &err);
    mf_run_info info = {.model_dir = "hand", .prec = &prec, .device = "cpu", .numerics = "native", .threads = 1,
                        .record = MF_RECORD_LOGITS, .input_path = "hand", .prompts = &ps, .cfg = &cfg,
                        .weights_digest = "w", .imported_from = "hand"};
    mf_run_writer *w;
    cr_assert_eq(mf_run_create(&w, dir, &info, false, &err), MF_OK, "%s", err.msg);
    mf_seq_result r = {.T = 4, .n_moe = 3, .k = 4, .E = h->experts, .V = h->vocab, .H = 64};
    r.topk_ids = (uint16_t *)h->ids;
    r.router = (double *)h->router;
    r.logits = h->logits;
    double wts[48];
    for (int i = 0; i < 48; i++) wts[i] = 0.25;
    r.topk_w = wts;
    cr_assert_eq(mf_run_writer_add(w, &p, &r, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_run_writer_close(w, &err), MF_OK);
    mf_run_writer_free(w);
}

/* JSON lines are JSON: a logit that is NaN or infinite is null (it was a bare NaN, which no JSON reader takes). */
Test(export, jsonl_values_that_are_not_numbers_are_null) {
    const char *d = temp_dir();
    hand h;
    hand_init(&h, 384);
    h.logits[1 * 384 + 3] = NAN;
    h.logits[2 * 384 + 4] = INFINITY;
    h.router[5] = -INFINITY;
    const char *run = join(d, "nan");
    write_hand(run, &h);
    free(h.logits);
    char out[4500], err[ERR_CAP];
    snprintf(out, sizeof out, "%s/x.jsonl", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "export '%s' --format jsonl -o '%s'", run, out), 0, "%s", err);
    char *text;
    size_t len;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(out, &text, &len, &e), MF_OK);
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        cr_assert(o, "line %d is not JSON: %s", lines, jerr.text);
        const json_t *lg = json_object_get(o, "logits");
        cr_assert_eq(json_array_size(lg), 384);
        if (lines == 1) cr_assert(json_is_null(json_array_get(lg, 3)));
        if (lines == 2) cr_assert(json_is_null(json_array_get(lg, 4)));
        if (lines == 0) cr_assert(json_is_null(json_array_get(json_object_get(json_array_get(json_object_get(o, "layers"), 0), "router_logits"), 5)));
        if (lines == 0) cr_assert_float_eq(json_number_value(json_array_get(lg, 3)), 0.0, 0);
        json_decref(o);
    }
    cr_assert_eq(lines, 4);
    free(text);
}

/* An id holding a comma or a quote is one CSV field (RFC 4180), not two. */
Test(export, csv_quotes_ids_that_need_it) {
    const char *d = temp_dir();
    write_text(d, "p.jsonl", "{\"id\": \"a,\\\"b\\\"\", \"tokens\": [1, 2]}\n{\"id\": \"plain\", \"tokens\": [3]}\n");
    char run[4500], out[4500], err[ERR_CAP];
    snprintf(run, sizeof run, "%s/run", d);
    snprintf(out, sizeof out, "%s/x.csv", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s/p.jsonl' --out '%s' --record routing", fixture("hf/olmoe"), d, run),
                 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "export '%s' --format csv -o '%s'", run, out), 0, "%s", err);
    char *text;
    size_t len;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(out, &text, &len, &e), MF_OK);
    /* 1 header + (2 positions + 1) x 3 MoE layers */
    int rows = 0;
    for (const char *p = text; *p; p++) rows += *p == '\n';
    cr_assert_eq(rows, 1 + 3 * 3);
    cr_assert(strstr(text, "\n\"a,\"\"b\"\"\",0,1,0,"), "the quoted id: %s", text);
    cr_assert(strstr(text, "\nplain,0,3,0,"), "a plain id stays as it is: %s", text);
    free(text);
}

/* ---- 5. readers: diff --------------------------------------------------------------- */

static void open_ok(const char *dir, mf_run **r) {
    mf_error e = {0};
    cr_assert_eq(mf_run_open(r, dir, &e), MF_OK, "%s", e.msg);
}

/* A target with the reference's model digests and other shapes is refused before any comparison (it crashed diff
 * and POST /api/diffs, or corrupted the heap). */
Test(diff, a_target_with_the_references_digests_and_other_shapes_is_refused) {
    const char *d = temp_dir();
    hand a, b;
    hand_init(&a, 384);
    hand_init(&b, 384);
    b.experts = 8;   /* router rows of 8, ids below 8: a run consistent in itself */
    for (int s = 0; s < 12; s++)
        for (int e = 0; e < 8; e++) b.router[s * 8 + e] = -e;
    write_hand(join(d, "ref"), &a);
    write_hand(join(d, "tgt"), &b);
    free(a.logits);
    free(b.logits);
    mf_run *r, *t;
    open_ok(join(d, "ref"), &r);
    open_ok(join(d, "tgt"), &t);
    mf_error e = {0};
    cr_assert_eq(mf_diff_align(r, t, &e), MF_EMISMATCH, "%s", e.msg);
    cr_assert(strstr(e.msg, "disagree on its shape: experts 16 vs 8"), "%s", e.msg);
    mf_diff_acc acc;
    mf_diff_acc_init(&acc, r);
    e = (mf_error){0};
    cr_assert_eq(mf_diff_acc_add_runs(&acc, r, t, &e), MF_EMISMATCH, "%s", e.msg);
    mf_diff_acc_free(&acc);
    mf_run_close(r);
    mf_run_close(t);
    char args[9000];
    snprintf(args, sizeof args, "'%s/ref' '%s/tgt' -o '%s/d.json'", d, d, d);
    command_fails(1, "disagree on its shape", "diff -q %s", args);
    cr_assert(!mf_path_exists(join(d, "d.json")));
}

Test(diff, moe_layers_that_differ_are_refused) {
    const char *d = temp_dir(), *run = routing_run(d);
    const char *c = copy_run(run, d, "c");
    json_t *m = manifest_of(c), *model = json_object_get(m, "model");
    json_object_set_new(model, "n_layers", json_integer(4));
    json_object_set_new(model, "moe_layers", json_loads("[0, 1, 3]", 0, NULL));
    save_manifest(c, m);
    mf_run *r, *t;
    open_ok(run, &r);
    open_ok(c, &t);
    mf_error e = {0};
    cr_assert_eq(mf_diff_align(r, t, &e), MF_EMISMATCH);
    cr_assert(strstr(e.msg, "layers 3 vs 4"), "%s", e.msg);
    mf_run_close(r);
    mf_run_close(t);
}

/* Top-5 agreement over a vocabulary past 65,535: token 65541 is not token 5 (u16 ids aliased them). */
Test(diff, top5_of_a_large_vocabulary_does_not_alias) {
    const char *d = temp_dir();
    const int V = 70000;
    hand a, b;
    hand_init(&a, V);
    hand_init(&b, V);
    for (int p = 0; p < 4; p++) {
        double *x = a.logits + (size_t)p * V, *y = b.logits + (size_t)p * V;
        x[65541] = 10, x[1] = 9, x[2] = 8, x[3] = 7, x[4] = 6;   /* ref: 65541, 1, 2, 3, 4 */
        y[5] = 10, y[1] = 9, y[2] = 8, y[3] = 7, y[4] = 6;       /* target: 5, 1, 2, 3, 4 */
    }
    write_hand(join(d, "ref"), &a);
    write_hand(join(d, "tgt"), &b);
    free(a.logits);
    free(b.logits);
    mf_run *r, *t;
    open_ok(join(d, "ref"), &r);
    open_ok(join(d, "tgt"), &t);
    mf_diff_acc acc;
    mf_diff_acc_init(&acc, r);
    mf_error e = {0};
    cr_assert_eq(mf_diff_acc_add_runs(&acc, r, t, &e), MF_OK, "%s", e.msg);
    cr_assert_float_eq(mf_diff_metric(&acc, "set5_pct"), 0.0, 0, "65541 and 5 are other tokens");
    cr_assert_float_eq(mf_diff_metric(&acc, "ord5_pct"), 0.0, 0);
    cr_assert_float_eq(mf_diff_metric(&acc, "top1_pct"), 0.0, 0);
    mf_diff_acc_free(&acc);
    mf_run_close(r);
    mf_run_close(t);
}

/* A defined metric that is not a number (a target whose logits overflow) is null with a warning; it was left out
 * of diff.json and the summary as if undefined. */
Test(diff, metrics_that_are_not_numbers_are_null_with_a_warning) {
    const char *d = temp_dir();
    hand a, b;
    hand_init(&a, 384);
    hand_init(&b, 384);
    b.logits[2 * 384 + 9] = INFINITY;
    write_hand(join(d, "ref"), &a);
    write_hand(join(d, "tgt"), &b);
    free(a.logits);
    free(b.logits);
    char out[4500], err[ERR_CAP], cmd[9000];
    snprintf(out, sizeof out, "%s/d.json", d);
    snprintf(cmd, sizeof cmd, "diff '%s' '%s' -o '%s' --bootstrap 20 > '%s/summary.txt'", join(d, "ref"), join(d, "tgt"), out, d);
    cr_assert_eq(run_moeflip(err, sizeof err, "%s", cmd), 0, "%s", err);
    json_error_t jerr;
    json_t *j = json_load_file(out, 0, &jerr);
    cr_assert(j, "%s", jerr.text);
    json_t *met = json_object_get(json_array_get(json_object_get(j, "targets"), 0), "metrics");
    json_t *kl = json_object_get(met, "forward_kl");
    cr_assert(kl, "forward_kl is missing: a metric that is not a number must be null, not absent");
    cr_assert(json_is_null(json_object_get(kl, "value")));
    /* a metric the infinity does not touch is still a number: the router's */
    cr_assert(json_is_number(json_object_get(json_object_get(met, "router_set_equal_pct"), "value")));
    json_t *w = json_object_get(j, "warnings");
    cr_assert(json_array_size(w) >= 1);
    bool named = false;
    for (size_t i = 0; i < json_array_size(w); i++) {
        const char *s = json_string_value(json_array_get(w, i));
        named |= s && strstr(s, "forward_kl is not a number") && strstr(s, "sequence x");
    }
    cr_assert(named, "no warning names forward_kl and sequence x");
    json_decref(j);
    char *sum;
    size_t sl;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(join(d, "summary.txt"), &sum, &sl, &e), MF_OK);
    cr_assert(strstr(sum, "forward_kl") && strstr(sum, "null (not a number)") && strstr(sum, "warning:"), "%s", sum);
    free(sum);
    cr_assert(strstr(err, "warning: target 1"), "the warning is logged: %s", err);
    /* and the report says it too */
    char html[4500];
    snprintf(html, sizeof html, "%s/r.html", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "report '%s' -o '%s'", out, html), 0, "%s", err);
    cr_assert_eq(mf_read_file(html, &sum, &sl, &e), MF_OK);
    cr_assert(strstr(sum, "Warnings") && strstr(sum, "forward_kl is not a number"), "the report does not say it");
    free(sum);
}

/* A diff that fails after writing diff.json leaves no diff.json that looks valid. */
Test(diff, a_failed_diff_leaves_no_outputs) {
    const char *d = temp_dir(), *run = routing_run(d);
    char out[4500], err[ERR_CAP];
    snprintf(out, sizeof out, "%s/d.json", d);
    const int st = run_moeflip(err, sizeof err, "diff -q '%s' '%s' -o '%s' --bootstrap 0 --slots '%s/no/such/dir/s.csv'", run, run, out, d);
    cr_assert_eq(st, 1, "%s", err);
    assert_one_line(err);
    cr_assert(!mf_path_exists(out), "diff.json was left by a failed diff");
    cr_assert_eq(dir_entries_named(d, "tmp"), 0, "a temporary was left in %s", d);
}

/* ---- 6. writers: leftovers ------------------------------------------------------ */

static pid_t dead_pid(void) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    cr_assert(p > 0);
    waitpid(p, NULL, 0);
    return p;
}

/* A trace killed before its run directory was renamed into place left RUN.tmp.<pid>, which nothing removed. */
Test(leftovers, a_dead_writers_run_directory_is_removed) {
    const char *d = temp_dir();
    char stale[4500], live[4500];
    const pid_t gone = dead_pid();
    snprintf(stale, sizeof stale, "%s/r.tmp.%ld", d, (long)gone);
    snprintf(live, sizeof live, "%s/r.tmp.%ld", d, (long)getpid());   /* a live process's: kept */
    cr_assert_eq(mkdir(stale, 0755), 0);
    cr_assert_eq(mkdir(live, 0755), 0);
    write_text(stale, "manifest.json", "{}");
    write_text(live, "manifest.json", "{}");
    routing_run(d);
    cr_assert(!mf_path_exists(stale), "%s is still there", stale);
    cr_assert(mf_path_exists(live), "a live writer's directory was removed");
    /* something that is not a run's is never removed */
    snprintf(stale, sizeof stale, "%s/q.tmp.%ld", d, (long)dead_pid());
    cr_assert_eq(mkdir(stale, 0755), 0);
    write_text(stale, "notes.txt", "mine");
    make_run(d, "q", "hf/olmoe", "--record routing");
    cr_assert(mf_path_exists(join(stale, "notes.txt")));
}

/* synth -o into a directory holding another checkpoint mixed the two; a synth that failed left a config.json. */
Test(leftovers, synth_never_mixes_and_never_leaves_half_a_checkpoint) {
    const char *d = temp_dir();
    char other[4500];
    snprintf(other, sizeof other, "%s/other", d);
    cr_assert_eq(mkdir(other, 0755), 0);
    write_text(other, "model.safetensors.index.json", "{\"weight_map\": {}}");
    command_fails(1, "exists and is not empty", "synth --arch olmoe --seed 1 -o '%s'", other);
    cr_assert(!mf_path_exists(join(other, "config.json")));
    /* a write that fails half-way (files limited to 64 KB, the weights are larger): nothing appears */
    char err[ERR_CAP], dst[4500];
    snprintf(dst, sizeof dst, "%s/new", d);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "sh -c \"trap '' XFSZ; ulimit -f 128; '%s' synth --arch olmoe --seed 1 -o '%s'\" 2>'%s/e.txt'", MF_TEST_BIN,
             dst, d);
    const int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "synth under a file size limit: status 0x%x", st);
    cr_assert(!mf_path_exists(dst), "a failed synth left %s", dst);
    cr_assert_eq(dir_entries_named(d, "new.tmp"), 0, "a failed synth left its temporary");
    /* and a synth into an empty directory works */
    snprintf(dst, sizeof dst, "%s/empty", d);
    cr_assert_eq(mkdir(dst, 0755), 0);
    cr_assert_eq(run_moeflip(err, sizeof err, "synth --arch olmoe --seed 1 -o '%s'", dst), 0, "%s", err);
    cr_assert(mf_path_exists(join(dst, "model.safetensors")));
}

/* ---- 7. inputs: config, prompts, model directories ------------------------------- */

Test(inputs, configs_that_can_only_give_nan_are_refused) {
    static const struct { const char *json, *want; } cases[] = {
        {"{\"model_type\": \"olmoe\", \"rms_norm_eps\": -1e-6}", "rms_norm_eps"},
        {"{\"model_type\": \"olmoe\", \"rms_norm_eps\": 0}", "rms_norm_eps"},
        {"{\"model_type\": \"olmoe\", \"rope_theta\": 0}", "rope_theta"},
        {"{\"model_type\": \"olmoe\", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": -10000}}", "rope_theta"},
        {"{\"model_type\": \"olmoe\", \"partial_rotary_factor\": 0}", "partial_rotary_factor"},
        {"{\"model_type\": \"olmoe\", \"clip_qkv\": -8}", "clip_qkv"},
        {"{\"model_type\": \"olmoe\", \"num_experts\": 4096}", "at most 1024 experts"},
        {"{\"model_type\": \"llama\", \"max_position_embeddings\": 0}", "max_position_embeddings"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mf_config c;
        mf_error e = {0};
        cr_assert_neq(mf_config_parse(&c, cases[i].json, strlen(cases[i].json), "config.json", &e), MF_OK, "accepted: %s",
                      cases[i].json);
        cr_assert(strstr(e.msg, cases[i].want), "%s: %s", cases[i].json, e.msg);
    }
    mf_config c;
    mf_error e = {0};
    const char *fine = "{\"model_type\": \"olmoe\", \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000}";
    cr_assert_eq(mf_config_parse(&c, fine, strlen(fine), "config.json", &e), MF_OK, "%s", e.msg);
}

/* A FIFO named config.json or model.safetensors blocked trace for ever (open waits for a writer). */
Test(inputs, a_fifo_in_a_model_directory_is_refused_at_once, .timeout = 60) {
    static const char *names[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        const char *m = copy_fixture_dir("hf/olmoe");
        cr_assert_eq(unlink(join(m, names[i])), 0);
        cr_assert_eq(mkfifo(join(m, names[i]), 0644), 0);
        char err[ERR_CAP];
        const int st = run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s/tokens.jsonl' --out '%s/run'", m, m, m);
        cr_assert_eq(st, 1, "%s: exit %d: %s", names[i], st, err);
        assert_one_line(err);
        cr_assert(strstr(err, names[i]) && strstr(err, "not a regular file (a FIFO)"), "%s", err);
    }
    /* and a prompt file that is a FIFO */
    const char *d = temp_dir();
    cr_assert_eq(mkfifo(join(d, "p.jsonl"), 0644), 0);
    char args[9000];
    snprintf(args, sizeof args, "'%s' --input '%s/p.jsonl' --out '%s/run'", fixture("hf/olmoe"), d, d);
    command_fails(1, "not a regular file (a FIFO)", "trace -q --model %s", args);
}

Test(inputs, the_id_limit_is_said_in_bytes) {
    const char *d = temp_dir();
    char line[1024] = "{\"id\": \"";
    for (int i = 0; i < 101; i++) strcat(line, "\xc3\xa9");   /* 101 characters, 202 bytes */
    strcat(line, "\", \"tokens\": [1]}\n");
    write_text(d, "p.jsonl", line);
    mf_prompts p;
    mf_error e = {0};
    cr_assert_eq(mf_prompts_load(&p, join(d, "p.jsonl"), 384, &e), MF_EINVAL);
    cr_assert(strstr(e.msg, "at most 200 bytes"), "%s", e.msg);
}

/* ---- 8. import crova --------------------------------------------------------------- */

/* A capture dir/logits/<name>.safetensors of m positions for the olmoe fixture (vocabulary 384, 3 MoE layers, 16
 * experts), response tokens as given. */
static void write_case(const char *capture, const char *name, int m, const int64_t *response) {
    char p[9000];
    snprintf(p, sizeof p, "%s/logits", capture);
    mkdir(capture, 0755);
    mkdir(p, 0755);
    mf_st_writer *w = mf_st_writer_new();
    float *lg = calloc((size_t)m * 384, sizeof(float)), *rl = calloc((size_t)3 * m * 16, sizeof(float));
    for (int i = 0; i < 3 * m * 16; i++) rl[i] = (float)(-(i % 16));
    const int64_t ls[2] = {m, 384}, rs[1] = {m}, rls[3] = {3, m, 16};
    mf_st_writer_add(w, "logits", MF_F32, 2, ls, lg);
    mf_st_writer_add(w, "response", MF_I64, 1, rs, response);
    mf_st_writer_add(w, "router_logits", MF_F32, 3, rls, rl);
    snprintf(p, sizeof p, "%s/logits/%s.safetensors", capture, name);
    mf_error e = {0};
    cr_assert_eq(mf_st_writer_write(w, p, &e), MF_OK, "%s", e.msg);
    mf_st_writer_free(w);
    free(lg);
    free(rl);
}

Test(import, case_ids_and_response_tokens_are_checked) {
    const char *d = temp_dir();
    const int64_t good[3] = {1, 2, 3}, bad[3] = {1, 384, 3}, neg[3] = {-1, 2, 3};
    char cap[4500], out[4500];
    /* a token past the vocabulary */
    snprintf(cap, sizeof cap, "%s/c1", d);
    write_case(cap, "a", 3, good);
    write_case(cap, "b", 3, bad);
    snprintf(out, sizeof out, "%s/o1", d);
    mf_error e = {0};
    cr_assert_eq(mf_import_crova(cap, fixture("hf/olmoe"), out, &e), MF_EFORMAT, "%s", e.msg);
    cr_assert(strstr(e.msg, "b.safetensors: response position 1 holds token 384, outside the vocabulary [0, 384)"), "%s", e.msg);
    cr_assert(!mf_path_exists(out), "a refused import left %s", out);
    snprintf(cap, sizeof cap, "%s/c2", d);
    write_case(cap, "a", 3, neg);
    e = (mf_error){0};
    cr_assert_eq(mf_import_crova(cap, fixture("hf/olmoe"), out, &e), MF_EFORMAT);
    cr_assert(strstr(e.msg, "holds token -1"), "%s", e.msg);
    /* a case id with a control character */
    snprintf(cap, sizeof cap, "%s/c3", d);
    write_case(cap, "bad\001id", 3, good);
    e = (mf_error){0};
    cr_assert_eq(mf_import_crova(cap, fixture("hf/olmoe"), out, &e), MF_EINVAL, "%s", e.msg);
    cr_assert(strstr(e.msg, "its name is not a sequence id"), "%s", e.msg);
    cr_assert(!mf_path_exists(out));
    /* the good case imports, and the run validates */
    snprintf(cap, sizeof cap, "%s/c4", d);
    write_case(cap, "a", 3, good);
    e = (mf_error){0};
    cr_assert_eq(mf_import_crova(cap, fixture("hf/olmoe"), out, &e), MF_OK, "%s", e.msg);
    mf_run *r;
    open_ok(out, &r);
    cr_assert_eq(r->n_seqs, 1);
    mf_run_close(r);
    /* importing again over it is refused, and leaves it as it was */
    e = (mf_error){0};
    cr_assert_eq(mf_import_crova(cap, fixture("hf/olmoe"), out, &e), MF_EINVAL);
    cr_assert(strstr(e.msg, "a run is already there"), "%s", e.msg);
    open_ok(out, &r);
    mf_run_close(r);
}

/* An import that fails while writing (files limited to 64 KB) leaves nothing that blocks a retry. */
Test(import, a_failed_import_leaves_nothing) {
    const char *d = temp_dir();
    char cap[4500], out[4500], cmd[9500];
    snprintf(cap, sizeof cap, "%s/cap", d);
    int64_t resp[200];
    for (int i = 0; i < 200; i++) resp[i] = i;
    write_case(cap, "a", 200, resp);   /* 200 x 384 logits: 600 KB as a run */
    snprintf(out, sizeof out, "%s/run", d);
    snprintf(cmd, sizeof cmd, "sh -c \"trap '' XFSZ; ulimit -f 128; '%s' import crova '%s' --model '%s' -o '%s'\" 2>/dev/null", MF_TEST_BIN,
             cap, fixture("hf/olmoe"), out);
    const int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
    cr_assert(!mf_path_exists(out), "a failed import left %s", out);
    cr_assert_eq(dir_entries_named(d, "run.tmp"), 0, "a failed import left its temporary");
    char err[ERR_CAP];
    cr_assert_eq(run_moeflip(err, sizeof err, "import crova '%s' --model '%s' -o '%s'", cap, fixture("hf/olmoe"), out), 0, "%s", err);
}

/* ---- 9. messages and exit codes -------------------------------------------------- */

Test(messages, a_message_cut_inside_a_character_stays_utf8) {
    char big[3000] = "";
    for (int i = 0; i < 1400; i++) strcat(big, "\xc3\xa9");   /* 2800 bytes of é */
    for (int shift = 0; shift < 2; shift++) {
        mf_error e = {0};
        mf_fail(&e, MF_EINVAL, "%.*s%s", shift, "x", big);
        cr_assert(strlen(e.msg) <= sizeof e.msg - 1);
        json_t *j = json_string(e.msg);   /* NULL for a string that is not UTF-8 */
        cr_assert(j, "the message is not valid UTF-8 (shift %d)", shift);
        json_decref(j);
        mf_fail_wrap(&e, "prefix \xe2\x82\xac");
        j = json_string(e.msg);
        cr_assert(j, "the wrapped message is not valid UTF-8");
        json_decref(j);
    }
    mf_error e = {0};
    mf_fail(&e, MF_EINVAL, "a byte \xff and \xc3 alone");
    cr_assert_str_eq(e.msg, "a byte ? and ? alone");
}

/* Output that could not be written (a full disk) is a failure with its reason, never "moeflip: " and nothing. */
Test(messages, a_full_stdout_is_a_failure_with_its_reason) {
    const char *run = routing_run(temp_dir());
    command_fails(1, "No space left on device", "inspect '%s' > /dev/full", run);
    command_fails(1, "No space left on device", "export '%s' --format csv > /dev/full", run);
    command_fails(1, "No space left on device", "inspect --json '%s' > /dev/full", run);
}

/* ---- 10. the collector ---------------------------------------------------------------- */

static void start(test_server *s, const char *d, char root[600], char extra[700]) { server_start_in(s, d, "", root, extra); }

static void put_dir(int port, const char *name, const char *dir, http_resp *r) {
    size_t len;
    char *body = run_body(dir, &len), path[256];
    snprintf(path, sizeof path, "/api/runs/%s", name);
    http_request(port, "PUT", path, AUTH, body, len, r);
    free(body);
}

/* The upload body of dir's shard files (as dir's own manifest lists them, each once) with manifest m instead. */
static void put_with_manifest(int port, const char *name, const char *dir, json_t *m, http_resp *r) {
    char *text = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_t *own = manifest_of(dir), *shards = json_object_get(own, "shards");
    size_t cap = strlen(text) + 256, n = 0;
    for (size_t i = 0; i < json_array_size(shards); i++)
        cap += (size_t)json_integer_value(json_object_get(json_array_get(shards, i), "bytes")) + 128;
    char *b = malloc(cap);
    n += (size_t)sprintf(b + n, "moeflip-run 1\nfile %zu manifest.json\n%s", strlen(text), text);
    for (size_t i = 0; i < json_array_size(shards); i++) {
        const char *f = json_string_value(json_object_get(json_array_get(shards, i), "file"));
        char *data;
        size_t dl;
        mf_error e = {0};
        cr_assert_eq(mf_read_file(join(dir, f), &data, &dl, &e), MF_OK, "%s", e.msg);
        n += (size_t)sprintf(b + n, "file %zu %s\n", dl, f);
        memcpy(b + n, data, dl);
        n += dl;
        free(data);
    }
    n += (size_t)sprintf(b + n, "end\n");
    char path[256];
    snprintf(path, sizeof path, "/api/runs/%s", name);
    http_request(port, "PUT", path, AUTH, b, n, r);
    free(b);
    free(text);
    json_decref(own);
}

static void assert_json_error(const http_resp *r, int status, const char *want) {
    cr_assert_eq(r->status, status, "%d %.*s", r->status, (int)r->body_len, r->body ? r->body : "");
    json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
    cr_assert(j, "the answer is not JSON: %.*s", (int)r->body_len, r->body);
    const char *m = json_string_value(json_object_get(j, "error"));
    cr_assert(m && strstr(m, want), "the error does not say \"%s\": %s", want, m ? m : "(none)");
    json_decref(j);
}

/* A manifest with a long non-ASCII string crashed the server: its message, cut inside a character, could not be
 * encoded, and the NULL was passed on. */
Test(collector, a_long_non_ascii_manifest_string_gets_an_answer) {
    const char *d = temp_dir(), *run = routing_run(d);
    char root[600], extra[700];
    test_server s;
    start(&s, d, root, extra);
    /* two strings, one byte apart: one of them is cut inside a character wherever the cut falls */
    for (int shift = 0; shift < 2; shift++) {
        json_t *m = manifest_of(run);
        char fmt[4000] = "";
        if (shift) strcat(fmt, "x");
        for (int i = 0; i < 1500; i++) strcat(fmt, "\xc3\xa9");
        json_object_set_new(m, "format", json_string(fmt));
        save_manifest(run, m);
        http_resp r;
        put_dir(s.port, "u", run, &r);
        assert_json_error(&r, 422, "not a moeflip run manifest");
        http_free(&r);
        cr_assert(server_alive(&s), "the server died of the answer to a %d-byte string", (int)strlen(fmt));
    }
    http_resp r;
    http_request(s.port, "GET", "/api/health", NULL, NULL, 0, &r);
    cr_assert_eq(r.status, 200);
    http_free(&r);
    server_stop(&s, SIGKILL);
}

Test(collector, two_authorization_headers_are_refused) {
    const char *d = temp_dir(), *run = routing_run(d);
    char root[600], extra[700];
    test_server s;
    start(&s, d, root, extra);
    size_t len;
    char *body = run_body(run, &len);
    http_resp r;
    http_request(s.port, "PUT", "/api/runs/x", "Authorization: Bearer wrong-token-000\r\n" AUTH, body, len, &r);
    assert_json_error(&r, 400, "one Authorization header");
    http_free(&r);
    http_request(s.port, "PUT", "/api/runs/x", AUTH AUTH, body, len, &r);
    assert_json_error(&r, 400, "one Authorization header");
    http_free(&r);
    http_request(s.port, "PUT", "/api/runs/x", AUTH, body, len, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    free(body);
    server_stop(&s, SIGKILL);
}

/* "file -5 ..." was read as 2^64 - 5 and answered "larger than the server takes". */
Test(collector, a_negative_file_size_is_malformed_not_large) {
    const char *d = temp_dir();
    char root[600], extra[700];
    test_server s;
    start(&s, d, root, extra);
    const char body[] = "moeflip-run 1\nfile -5 manifest.json\nend\n";
    http_resp r;
    http_request(s.port, "PUT", "/api/runs/x", AUTH, body, sizeof body - 1, &r);
    assert_json_error(&r, 400, "bytes in decimal digits");
    http_free(&r);
    server_stop(&s, SIGKILL);
}

/* What mf_run_open refuses, the collector refuses: wrong shard sizes, shards listed twice, odd moe_layers. */
Test(collector, runs_that_lie_are_refused) {
    const char *d = temp_dir(), *run = routing_run(d);
    char root[600], extra[700];
    test_server s;
    start(&s, d, root, extra);
    http_resp r;
    /* moe_layers out of order */
    const char *c = copy_run(run, d, "ml");
    json_t *m = manifest_of(c);
    json_object_set_new(json_object_get(m, "model"), "moe_layers", json_loads("[1, 0, 2]", 0, NULL));
    save_manifest(c, m);
    put_dir(s.port, "ml", c, &r);
    assert_json_error(&r, 422, "model.moe_layers[1]");
    http_free(&r);
    /* a shard listed twice (sent once) */
    m = manifest_of(run);
    json_array_append(json_object_get(m, "shards"), json_array_get(json_object_get(m, "shards"), 0));
    put_with_manifest(s.port, "tw", run, m, &r);
    json_decref(m);
    assert_json_error(&r, 422, "shard part-00000.safetensors is listed twice");
    http_free(&r);
    /* a sequence listed twice */
    c = copy_run(run, d, "sq");
    m = manifest_of(c);
    json_array_append(json_object_get(m, "sequences"), json_array_get(json_object_get(m, "sequences"), 1));
    json_object_set_new(json_object_get(m, "input"), "n_sequences", json_integer(4));
    save_manifest(c, m);
    put_dir(s.port, "sq", c, &r);
    assert_json_error(&r, 422, "sequence s1 is listed twice");
    http_free(&r);
    /* a shard one byte longer than the manifest says (its digest right) */
    c = copy_run(run, d, "sz");
    m = manifest_of(c);
    json_t *sh = json_array_get(json_object_get(m, "shards"), 0);
    json_object_set_new(sh, "bytes", json_integer(json_integer_value(json_object_get(sh, "bytes")) - 1));
    save_manifest(c, m);
    put_dir(s.port, "sz", c, &r);
    cr_assert_eq(r.status, 422, "%d %s", r.status, r.body);
    http_free(&r);
    cr_assert_eq(dir_entries(join(root, "runs")), 0, "nothing is stored");
    cr_assert(server_alive(&s));
    server_stop(&s, SIGKILL);
}

/* A stored run with the reference's digests and other shapes crashed POST /api/diffs (which needs no token),
 * and again after every restart. */
Test(collector, a_diff_of_runs_that_disagree_in_shape_is_refused) {
    const char *d = temp_dir();
    hand a, b;
    hand_init(&a, 384);
    hand_init(&b, 384);
    b.experts = 8;
    for (int s2 = 0; s2 < 12; s2++)
        for (int e = 0; e < 8; e++) b.router[s2 * 8 + e] = -e;
    write_hand(join(d, "ref"), &a);
    write_hand(join(d, "tgt"), &b);
    free(a.logits);
    free(b.logits);
    char root[600], extra[700];
    test_server s;
    start(&s, d, root, extra);
    http_resp r;
    put_dir(s.port, "ref", join(d, "ref"), &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    put_dir(s.port, "tgt", join(d, "tgt"), &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    const char req[] = "{\"reference\": \"ref\", \"targets\": [\"tgt\"], \"bootstrap\": 0}";
    for (int round = 0; round < 2; round++) {
        http_request(s.port, "POST", "/api/diffs", NULL, req, sizeof req - 1, &r);
        assert_json_error(&r, 422, "disagree on its shape: experts 16 vs 8");
        cr_assert_null(strstr(r.body, root), "the message names no server directory: %s", r.body);
        http_free(&r);
        cr_assert(server_alive(&s));
        if (round == 0) {
            server_stop(&s, SIGTERM);
            server_start(&s, root, extra);
        }
    }
    server_stop(&s, SIGKILL);
}

/* The collector read tokenizer.json from the directory a pushed manifest names. */
Test(collector, no_file_a_pushed_manifest_names_is_read) {
    const char *d = temp_dir(), *run = routing_run(d);
    char tok[4500], cmd[9500];
    snprintf(tok, sizeof tok, "%s/elsewhere", d);
    cr_assert_eq(mkdir(tok, 0755), 0);
    snprintf(cmd, sizeof cmd, "cp '%s/../../models/tiny-olmoe/tokenizer.json' '%s/'", fixture(""), tok);
    cr_assert_eq(system(cmd), 0);
    json_t *m = manifest_of(run);
    json_object_set_new(json_object_get(m, "model"), "dir", json_string(tok));
    save_manifest(run, m);
    /* moeflip diff of one's own runs does read it: the test's tokenizer is one diff would use */
    char out[4500], err[ERR_CAP];
    snprintf(out, sizeof out, "%s/local.json", d);
    cr_assert_eq(run_moeflip(err, sizeof err, "diff -q '%s' '%s' -o '%s' --bootstrap 0", run, run, out), 0, "%s", err);
    char *text;
    size_t len;
    mf_error e = {0};
    cr_assert_eq(mf_read_file(out, &text, &len, &e), MF_OK);
    cr_assert(strstr(text, "\"token_text\""), "the local diff has no token texts");
    free(text);
    char root[600], extra[700];
    test_server s;
    start(&s, d, root, extra);
    http_resp r;
    put_dir(s.port, "a", run, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    put_dir(s.port, "b", run, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    const char req[] = "{\"reference\": \"a\", \"targets\": [\"b\"], \"bootstrap\": 0}";
    http_request(s.port, "POST", "/api/diffs", NULL, req, sizeof req - 1, &r);
    cr_assert_eq(r.status, 200, "%d %s", r.status, r.body);
    json_t *meta = json_loadb(r.body, r.body_len, 0, NULL);
    http_free(&r);
    const char *url = json_string_value(json_object_get(json_object_get(meta, "files"), "diff"));
    cr_assert(url);
    http_request(s.port, "GET", url, NULL, NULL, 0, &r);
    json_decref(meta);
    cr_assert_eq(r.status, 200);
    cr_assert(r.body_len > 100);
    cr_assert_null(memmem(r.body, r.body_len, "\"token_text\"", 12), "the server read a tokenizer a manifest named");
    http_free(&r);
    server_stop(&s, SIGKILL);
}

/* A run pushed while it was traced was stored incomplete, and the finished run could never replace it. */
Test(collector, a_run_pushed_while_traced_is_replaced_by_the_finished_one) {
    const char *d = temp_dir();
    const char *run = make_run(d, "full", "hf/olmoe", "--record routing --shard-seqs 1");
    /* the run as it was after its first shard: the first shard and sequence, not complete */
    const char *part = copy_run(run, d, "part");
    json_t *m = manifest_of(part);
    json_array_remove(json_object_get(m, "shards"), 2);
    json_array_remove(json_object_get(m, "shards"), 1);
    json_array_remove(json_object_get(m, "sequences"), 2);
    json_array_remove(json_object_get(m, "sequences"), 1);
    json_object_set_new(m, "complete", json_false());
    save_manifest(part, m);
    unlink(join(part, "part-00001.safetensors"));
    unlink(join(part, "part-00002.safetensors"));
    char root[600], extra[700];
    test_server s;
    start(&s, d, root, extra);
    http_resp r;
    put_dir(s.port, "t", part, &r);
    cr_assert_eq(r.status, 201, "%d %s", r.status, r.body);
    http_free(&r);
    put_dir(s.port, "t", run, &r);
    cr_assert_eq(r.status, 201, "the finished run: %d %s", r.status, r.body);
    cr_assert(strstr(r.body, "\"continued\""), "%s", r.body);
    http_free(&r);
    http_request(s.port, "GET", "/api/runs", NULL, NULL, 0, &r);
    json_t *l = json_loadb(r.body, r.body_len, 0, NULL);
    http_free(&r);
    json_t *e = json_array_get(json_object_get(l, "runs"), 0);
    cr_assert_eq(json_array_size(json_object_get(l, "runs")), 1);
    cr_assert(json_is_true(json_object_get(e, "complete")));
    cr_assert_eq(json_integer_value(json_object_get(e, "sequences")), 3);
    json_decref(l);
    /* the stored copy is the finished run */
    char hex[200], dir[1200];
    name_hex("t", hex);
    snprintf(dir, sizeof dir, "%s/runs/%s", root, hex);
    mf_run *sr;
    open_ok(dir, &sr);
    cr_assert_eq(sr->n_seqs, 3);
    mf_run_close(sr);
    /* the finished run is not replaced by its own beginning, nor by another run */
    put_dir(s.port, "t", part, &r);
    cr_assert_eq(r.status, 409, "%d %s", r.status, r.body);
    http_free(&r);
    const char *other = make_run(d, "other", "hf/olmoe", "--record routing --precision fp32");
    put_dir(s.port, "p", part, &r);
    cr_assert_eq(r.status, 201);
    http_free(&r);
    put_dir(s.port, "p", other, &r);
    cr_assert_eq(r.status, 409, "another run does not continue an incomplete one: %d %s", r.status, r.body);
    http_free(&r);
    server_stop(&s, SIGKILL);
}

/* push of a run whose manifest gives a shard the wrong size says so (it said "changed size while pushing"), and
 * one with a negative size is refused before anything is sent (the server said "larger than it takes"). */
Test(collector, push_names_a_wrong_shard_size) {
    const char *d = temp_dir(), *run = routing_run(d);
    json_t *m = manifest_of(run);
    json_t *sh = json_array_get(json_object_get(m, "shards"), 0);
    json_object_set_new(sh, "bytes", json_integer(json_integer_value(json_object_get(sh, "bytes")) + 10));
    save_manifest(run, m);
    char arg[4500];
    snprintf(arg, sizeof arg, "%s' --to http://127.0.0.1:9 --retries 0", run);
    command_fails(1, "bytes, the manifest records", "push -q '%s", arg);
    m = manifest_of(run);
    json_object_set_new(json_array_get(json_object_get(m, "shards"), 0), "bytes", json_integer(-5));
    save_manifest(run, m);
    command_fails(1, "shard entry 0 is malformed", "push -q '%s", arg);
}

/* A device that is not one is bad usage (exit 2), said before anything is read; a build without a GPU backend
 * is a failure of this build (exit 1), not of the command line. */
Test(messages, a_device_that_is_not_one_is_bad_usage) {
    char err[2048];
    const char *model = fixture("hf/olmoe");
    cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s/tokens.jsonl --out %s/tpu --device tpu", model,
                             model, temp_dir()), 2, "%s", err);
    cr_assert(strstr(err, "unknown device \"tpu\""), "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "trace --model %s --input %s/tokens.jsonl --out %s/c9 --device cuda:x", model,
                             model, temp_dir()), 2, "%s", err);
}
