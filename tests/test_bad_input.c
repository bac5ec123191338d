/* Bad input to `moeflip trace`: every case must exit 1 with exactly one line
 * on stderr, "moeflip: ...", naming the file, tensor, sequence or line at
 * fault, and must leave no run that claims sequences. Usage errors exit 2.
 * Also: the safetensors reader refuses overlapping and gapped data ranges. */
#include "testutil.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ERR_CAP 8192

/* ---- helpers ------------------------------------------------------------ */

static const char *path_in(const char *dir, const char *name) {
    static char buf[8][4200];
    static int next;
    char *b = buf[next++ % 8];
    cr_assert(mf_path_join(b, 4200, dir, name), "path too long: %s/%s", dir, name);
    return b;
}

/* Asserts that err is exactly one line, ending in its only '\n', starting with prefix. */
static void assert_one_line(const char *err, const char *prefix) {
    size_t n = strlen(err);
    cr_assert(n < ERR_CAP - 1, "stderr was cut off at %zu bytes: %s", n, err);
    cr_assert(n > 0 && err[n - 1] == '\n', "stderr does not end in a newline: [%s]", err);
    cr_assert_eq(strchr(err, '\n'), err + n - 1, "stderr has more than one line:\n%s", err);
    cr_assert_eq(strncmp(err, prefix, strlen(prefix)), 0, "stderr does not start with \"%s\": %s", prefix, err);
}

static void assert_contains(const char *hay, const char *needle) {
    cr_assert(strstr(hay, needle), "message does not contain \"%s\": %s", needle, hay);
}

/* Either OUT does not exist, or it holds no manifest, or its manifest lists no sequences. */
static void assert_no_sequences(const char *out) {
    if (!mf_path_exists(out)) return;
    const char *man = path_in(out, "manifest.json");
    if (!mf_path_exists(man)) return;
    json_error_t jerr;
    json_t *root = json_load_file(man, 0, &jerr);
    cr_assert(root, "%s: not JSON: %s", man, jerr.text);
    json_t *seqs = json_object_get(root, "sequences");
    cr_assert(json_is_array(seqs), "%s: no \"sequences\" array", man);
    cr_assert_eq(json_array_size(seqs), 0, "%s: a failed run claims %zu sequences", man, json_array_size(seqs));
    json_decref(root);
}

/* Runs `moeflip trace --model MODEL --input INPUT --out OUT -q` (OUT given, or
 * a fresh path inside a temp dir) and checks the common contract of a failed
 * trace. Returns the message (without "moeflip: " and the newline). */
static const char *trace_fails_out(const char *model, const char *input, const char *out) {
    static char err[ERR_CAP];
    int st = run_moeflip(err, sizeof err, "trace --model '%s' --input '%s' --out '%s' -q", model, input, out);
    cr_assert_eq(st, 1, "exit status %d, expected 1; stderr: %s", st, err);
    assert_one_line(err, "moeflip: ");
    assert_no_sequences(out);
    return err + strlen("moeflip: ");
}

static const char *trace_fails(const char *model, const char *input) {
    return trace_fails_out(model, input, path_in(temp_dir(), "run"));
}

/* The part of msg after the first occurrence of s (which must be there):
 * used so that a culprit's name is not found inside a temp path by chance. */
static const char *after(const char *msg, const char *s) {
    const char *p = strstr(msg, s);
    cr_assert(p, "message does not contain \"%s\": %s", s, msg);
    return p + strlen(s);
}

/* Replaces the single occurrence of `from` in dir/name with `to`. */
static void replace_in_file(const char *dir, const char *name, const char *from, const char *to) {
    const char *path = path_in(dir, name);
    char *text = slurp(path, NULL);
    char *p = strstr(text, from);
    cr_assert(p, "%s does not contain \"%s\"", path, from);
    cr_assert_null(strstr(p + 1, from), "%s contains \"%s\" more than once", path, from);
    size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
    char *out = malloc(n);
    cr_assert(out);
    snprintf(out, n, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
    write_text(dir, name, out);
    free(out);
    free(text);
}

static void write_bytes(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    cr_assert(fp, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, len, fp), len);
    cr_assert_eq(fclose(fp), 0);
}

/* A raw safetensors file: u64 little-endian `declared_hlen`, the header text, then data_len zero bytes. */
static void write_raw_st(const char *path, uint64_t declared_hlen, const char *header, size_t data_len) {
    size_t hlen = strlen(header), n = 8 + hlen + data_len;
    uint8_t *buf = calloc(1, n);
    cr_assert(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(declared_hlen >> (8 * i));
    memcpy(buf + 8, header, hlen);
    write_bytes(path, buf, n);
    free(buf);
}

/* Rewrites dir/model.safetensors: `drop` left out (if not NULL), `to_f32`
 * converted to F32 (if not NULL), everything else copied through. */
static void rewrite_checkpoint(const char *dir, const char *drop, const char *to_f32) {
    const char *path = path_in(dir, "model.safetensors");
    mf_st_file *f;
    mf_error e = {0};
    cr_assert_eq(mf_st_open(&f, path, &e), MF_OK, "%s", e.msg);
    cr_assert(!drop || mf_st_find(f, drop), "fixture lacks %s", drop);
    cr_assert(!to_f32 || mf_st_find(f, to_f32), "fixture lacks %s", to_f32);
    mf_st_writer *w = mf_st_writer_new();
    mf_st_writer_meta(w, "format", "pt");
    for (size_t i = 0; i < f->count; i++) {
        const mf_st_tensor *t = &f->tensors[i];
        if (drop && strcmp(t->name, drop) == 0) continue;
        if (to_f32 && strcmp(t->name, to_f32) == 0) {
            size_t n = (size_t)mf_st_numel(t);
            float *v = malloc(n * sizeof(float) + 1);
            cr_assert(v);
            for (size_t j = 0; j < n; j++) mf_store_from_f64(v, MF_F32, j, mf_load_as_f64(t->data, t->dtype, j));
            mf_st_writer_add(w, t->name, MF_F32, t->ndim, t->shape, v);
            free(v);
            continue;
        }
        mf_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    mf_st_close(f);
    cr_assert_eq(mf_st_writer_write(w, path, &e), MF_OK, "%s", e.msg);
    mf_st_writer_free(w);
}

/* ---- checkpoint files ----------------------------------------------------- */

Test(bad_input, missing_safetensors) {
    const char *d = copy_fixture_dir("hf/olmoe");
    cr_assert_eq(unlink(path_in(d, "model.safetensors")), 0);
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, "model.safetensors");
}

Test(bad_input, truncated_safetensors) {
    const char *d = copy_fixture_dir("hf/olmoe");
    const char *st = path_in(d, "model.safetensors");
    struct stat sb;
    cr_assert_eq(stat(st, &sb), 0);
    cr_assert_eq(truncate(st, sb.st_size / 2), 0);
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, st);
}

Test(bad_input, garbage_safetensors) {
    const char *d = copy_fixture_dir("hf/olmoe");
    const char *st = path_in(d, "model.safetensors");
    uint8_t junk[4096];
    mf_rng r;
    mf_rng_seed(&r, 0x6a756e6b);
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(mf_rng_next(&r) >> 56);
    /* first byte forced, and, the length being little-endian, its top byte too:
     * the declared header length is huge whatever the junk */
    junk[0] = 0xff;
    junk[7] = 0xff;
    write_bytes(st, junk, sizeof junk);
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, st);
}

Test(bad_input, header_length_past_end) {
    const char *d = copy_fixture_dir("hf/olmoe");
    const char *st = path_in(d, "model.safetensors");
    write_raw_st(st, 1000, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, st);
    assert_contains(msg, "past the end");
}

Test(bad_input, missing_tensor) {
    const char *name = "model.layers.1.self_attn.k_proj.weight";
    const char *d = copy_fixture_dir("hf/olmoe");
    rewrite_checkpoint(d, name, NULL);
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, name);
}

Test(bad_input, shape_disagrees_with_config) {
    const char *d = copy_fixture_dir("hf/qwen3_moe");
    replace_in_file(d, "config.json", "\"moe_intermediate_size\": 32", "\"moe_intermediate_size\": 48");
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, "model.layers.0.mlp.experts.0.gate_proj.weight");
    assert_contains(msg, "shape");
}

Test(bad_input, dtype_disagrees) {
    const char *name = "model.layers.0.mlp.gate.weight";
    const char *d = copy_fixture_dir("hf/olmoe");
    rewrite_checkpoint(d, NULL, name);
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, name);
    assert_contains(after(msg, name), "F32");
}

Test(bad_input, sharded_index_names_missing_tensor) {
    const char *d = copy_fixture_dir("hf/mixtral_linear_v4cfg");
    const char *shard = "model-00001-of-00002.safetensors";
    cr_assert(mf_path_exists(path_in(d, shard)));
    replace_in_file(d, "model.safetensors.index.json", "\"weight_map\": {",
                    "\"weight_map\": {\n    \"model.bogus.weight\": \"model-00001-of-00002.safetensors\",");
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, "model.bogus.weight");
}

/* ---- config.json ----------------------------------------------------------- */

Test(bad_input, unknown_architecture) {
    const char *d = copy_fixture_dir("hf/olmoe");
    replace_in_file(d, "config.json", "\"model_type\": \"olmoe\"", "\"model_type\": \"gpt2\"");
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    const char *rest = after(msg, "config.json");
    assert_contains(rest, "gpt2");
    assert_contains(rest, "olmoe");
    assert_contains(rest, "qwen3_moe");
}

Test(bad_input, malformed_config) {
    const char *d = copy_fixture_dir("hf/olmoe");
    size_t len;
    char *text = slurp(path_in(d, "config.json"), &len);
    cr_assert_gt(len, 10);
    text[len / 2] = 0;
    write_text(d, "config.json", text);
    free(text);
    const char *msg = trace_fails(d, path_in(d, "tokens.jsonl"));
    assert_contains(msg, path_in(d, "config.json"));
}

/* ---- the prompt file ------------------------------------------------------- */

/* Writes text as tokens.jsonl in a fresh temp dir and returns its path. */
static const char *prompt_file(const char *text) {
    const char *t = temp_dir();
    write_text(t, "tokens.jsonl", text);
    return path_in(t, "tokens.jsonl");
}

Test(bad_input, token_outside_vocab) {
    const char *in = prompt_file("{\"id\": \"ok\", \"tokens\": [1, 2, 3]}\n"
                                 "{\"id\": \"bad\", \"tokens\": [1, 2, 384]}\n");
    const char *msg = trace_fails(fixture("hf/olmoe"), in);
    const char *rest = after(msg, in);   /* the sequence id, not a chance match in the path */
    assert_contains(rest, "bad");
    assert_contains(rest, "position 2");
}

Test(bad_input, empty_line_inside_input) {
    const char *in = prompt_file("{\"id\": \"a\", \"tokens\": [1, 2, 3]}\n"
                                 "\n"
                                 "{\"id\": \"b\", \"tokens\": [4, 5]}\n");
    const char *msg = trace_fails(fixture("hf/olmoe"), in);
    const char *rest = after(msg, in);
    cr_assert_eq(strncmp(rest, ":2:", 3), 0, "message does not give line 2 of %s: %s", in, msg);
    assert_contains(rest, "empty");
}

Test(bad_input, malformed_input_line) {
    const char *in = prompt_file("{\"id\": \"a\", \"tokens\": [1, 2, 3]}\n"
                                 "{\"id\": \"x\", \"tokens\": [1, 2\n"
                                 "{\"id\": \"b\", \"tokens\": [4, 5]}\n");
    const char *msg = trace_fails(fixture("hf/olmoe"), in);
    const char *rest = after(msg, in);
    cr_assert_eq(strncmp(rest, ":2:", 3), 0, "message does not give line 2 of %s: %s", in, msg);
}

Test(bad_input, missing_input_file) {
    const char *in = path_in(temp_dir(), "no-such-prompts.jsonl");
    const char *msg = trace_fails(fixture("hf/olmoe"), in);
    assert_contains(msg, in);
}

/* ---- the output ------------------------------------------------------------ */

Test(bad_input, unwritable_output) {
    const char *out = "/proc/moeflip-cannot-write/run";
    const char *msg = trace_fails_out(fixture("hf/olmoe"), fixture("hf/olmoe/tokens.jsonl"), out);
    assert_contains(msg, "/proc/moeflip-cannot-write");
}

/* ---- usage errors exit 2 --------------------------------------------------- */

Test(bad_input, usage_no_arguments) {
    char err[ERR_CAP];
    int st = run_moeflip(err, sizeof err, "trace");
    cr_assert_eq(st, 2, "exit status %d, expected 2; stderr: %s", st, err);
    assert_one_line(err, "moeflip trace: ");
}

Test(bad_input, usage_bad_precision) {
    char err[ERR_CAP];
    const char *t = temp_dir();
    int st = run_moeflip(err, sizeof err, "trace --model '%s' --input '%s' --out '%s' --precision fp8",
                         path_in(t, "X"), path_in(t, "Y"), path_in(t, "Z"));
    cr_assert_eq(st, 2, "exit status %d, expected 2; stderr: %s", st, err);
    assert_one_line(err, "moeflip trace: ");
    assert_contains(err, "fp8");
    cr_assert_not(mf_path_exists(path_in(t, "Z")), "a usage error created the run directory");
}

/* ---- the safetensors reader: data ranges must tile the data region --------- */

/* A file of the header h and data_len data bytes is refused, naming the file and why. */
static void assert_st_refused(const char *file, const char *h, size_t data_len, const char *why) {
    const char *p = path_in(temp_dir(), file);
    write_raw_st(p, strlen(h), h, data_len);
    mf_st_file *f = NULL;
    mf_error e = {0};
    int rc = mf_st_open(&f, p, &e);
    cr_assert_eq(rc, MF_EFORMAT, "mf_st_open returned %d: %s", rc, e.msg);
    cr_assert_eq(e.code, MF_EFORMAT);
    cr_assert_null(f);
    assert_contains(e.msg, why);
    assert_contains(e.msg, p);
}

Test(bad_input, safetensors_overlapping_ranges) {
    assert_st_refused("overlap.safetensors",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                      12, "overlap");
}

Test(bad_input, safetensors_gap_between_ranges) {
    assert_st_refused("gap.safetensors",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                      12, "gap");
}
