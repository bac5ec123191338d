/* moeflip import vllm|sglang|llamacpp|hf: the production engines' routing captures.
 *
 * The captures in tests/fixtures/engines/olmoe were written by tools/make_engine_fixtures.py in each engine's
 * documented format from the expert ids and router logits Hugging Face recorded for the olmoe test model
 * (tests/fixtures/hf/olmoe/ref.safetensors), so every imported id is checked against Hugging Face's:
 *   vllm      vllm-project/vllm vllm/model_executor/layers/fused_moe/routed_experts_capturer.py: the capture
 *             buffer is [tokens, num_hidden_layers, num_experts_per_tok]; CompletionOutput.routed_experts is a
 *             numpy array of seq_len - 1 rows (issue 22), here int16 written as numpy/lib/format.py lays out .npy;
 *   sglang    sgl-project/sglang python/sglang/srt/layers/moe/routed_experts_capturer.py (int32 [tokens,
 *             num_hidden_layers, num_experts_per_tok], zero-filled) and sgl-project/sglang-jax
 *             docs/features/return_routed_experts.md (meta_info["routed_experts"], base64, ordered token, layer,
 *             slot);
 *   llamacpp  ggml-org/llama.cpp PR #28544 (examples/moe-trace): one layer,expert CSV row per routed activation
 *             from the ffn_moe_topk-<layer> tensors, ubatch by ubatch; a flat copy of that view (its rows are
 *             argsort rows of n_expert ids) writes whole rankings: every n_expert rows a permutation;
 *   hf        transformers' output_router_logits: one [tokens, E] tensor of raw router logits per MoE layer
 *             (tests/fixtures/hf/olmoe/meta.json, outputs_router_logits). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_rundir.h"
#include "testutil.h"

#define L_ 3
#define K_ 4
#define E_ 16

static const char *eng(const char *rel) {
    static char buf[8][4200];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, 4200, "%s/%s", fixture("engines/olmoe"), rel);
    return b;
}

static mf_run *import_ok(mf_engine e, const char *const *files, int n, const char *tokens, const char *name) {
    char out[4200];
    snprintf(out, sizeof out, "%s/%s", temp_dir(), name);
    mf_error err = {0};
    cr_assert_eq(mf_import_engine(e, files, n, fixture("hf/olmoe"), tokens, out, &err), MF_OK, "%s", err.msg);
    mf_run *r;
    cr_assert_eq(mf_run_open(&r, out, &err), MF_OK, "%s", err.msg);
    return r;
}

/* The run's expert ids of sequence i equal Hugging Face's tensor ref_name [L, T, K] on the run's positions. */
static void expect_ids(mf_run *r, size_t i, const char *ref_name, int T_full) {
    size_t n;
    double *want = read_tensor(fixture("hf/olmoe/ref.safetensors"), ref_name, &n);
    cr_assert_eq(n, (size_t)L_ * T_full * K_, "%s", ref_name);
    const mf_st_tensor *t;
    mf_error err = {0};
    cr_assert_eq(mf_run_tensor(r, i, "topk_ids", &t, &err), MF_OK, "%s", err.msg);
    const int T = r->seqs[i].length;
    cr_assert_eq(t->shape[1], T);
    for (int l = 0; l < L_; l++)
        for (int p = 0; p < T; p++)
            for (int k = 0; k < K_; k++) {
                uint16_t v;
                memcpy(&v, t->data + 2 * (((size_t)l * T + p) * K_ + k), 2);
                cr_assert_eq(v, (uint16_t)want[((size_t)l * T_full + p) * K_ + k], "%s: layer %d, position %d, slot %d: %u, HF %g", ref_name, l,
                             p, k, v, want[((size_t)l * T_full + p) * K_ + k]);
            }
    free(want);
}

static const int T_of[3] = {21, 13, 34};   /* tests/fixtures/hf/olmoe/tokens.jsonl */
static const char *ids_of[3] = {"s0", "s1", "s2"};

Test(engines, vllm_rows_are_hf_bf16_cuda_ids_and_the_last_token_is_dropped) {
    const char *f[] = {eng("vllm/s0.npy"), eng("vllm/s1.npy"), eng("vllm/s2.npy")};
    mf_run *r = import_ok(MF_ENGINE_VLLM, f, 3, eng("tokens.jsonl"), "v");
    cr_assert_eq(r->n_seqs, 3);
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(r->seqs[i].length, T_of[i] - 1, "seq_len - 1 rows: the run holds the tokens they cover");
        char name[64];
        snprintf(name, sizeof name, "topk_bf16cuda_%s", ids_of[i]);
        expect_ids(r, i, name, T_of[i]);
        const mf_st_tensor *t;
        mf_error err = {0};
        cr_assert_eq(mf_run_tensor(r, i, "router", &t, &err), MF_OK);
        cr_assert_null(t, "an id capture has no router logits");
        cr_assert_eq(mf_run_tensor(r, i, "topk_w", &t, &err), MF_OK);
        cr_assert_null(t, "nor gate weights");
    }
    cr_assert_eq(r->lacks, MF_LACKS_GATES | MF_LACKS_ROUTER | MF_LACKS_LOGITS);
    cr_assert_str_eq(r->engine, "vllm");
    cr_assert_str_eq(r->record, "routing");
    json_t *m = json_loads(r->manifest_text, 0, NULL);
    json_t *lacks = json_object_get(json_object_get(m, "capture"), "lacks");
    cr_assert_eq(json_array_size(lacks), 3);
    cr_assert_str_eq(json_string_value(json_array_get(lacks, 0)), "gate_weights");
    cr_assert_str_eq(json_string_value(json_array_get(lacks, 1)), "router_logits");
    cr_assert_str_eq(json_string_value(json_array_get(lacks, 2)), "logits");
    json_decref(m);
    mf_run_close(r);
}

Test(engines, sglang_base64_rows_are_hf_fp64_ids) {
    const char *f[] = {eng("sglang/responses.json")};
    mf_run *r = import_ok(MF_ENGINE_SGLANG, f, 1, eng("tokens.jsonl"), "s");
    cr_assert_eq(r->n_seqs, 3, "one file, an array of three responses");
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(r->seqs[i].length, T_of[i]);
        char name[64];
        snprintf(name, sizeof name, "topk_fp64_%s", ids_of[i]);
        expect_ids(r, i, name, T_of[i]);
    }
    mf_run_close(r);
}

Test(engines, llamacpp_csv_rows_are_hf_bf16_cpu_ids_over_ubatches) {
    /* 8-token ubatches: s0 (21 tokens) is three, the last of 5; s0.csv has a header, the others none */
    const char *f[] = {eng("llamacpp/s0.csv"), eng("llamacpp/s1.csv"), eng("llamacpp/s2.csv")};
    mf_run *r = import_ok(MF_ENGINE_LLAMACPP, f, 3, eng("tokens.jsonl"), "l");
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(r->seqs[i].length, T_of[i]);
        char name[64];
        snprintf(name, sizeof name, "topk_bf16cpu_%s", ids_of[i]);
        expect_ids(r, i, name, T_of[i]);
    }
    mf_run_close(r);
}

Test(engines, hf_router_logits_give_hf_fp64_experts_and_keep_the_scores) {
    const char *f[] = {eng("hf/s0.safetensors"), eng("hf/s1.safetensors"), eng("hf/s2.safetensors")};
    mf_run *r = import_ok(MF_ENGINE_HF, f, 3, eng("tokens.jsonl"), "h");
    cr_assert_eq(r->lacks, 0u, "router logits, derived weights and logits: nothing lacking (olmoe has no shared expert)");
    cr_assert_str_eq(r->record, "logits");
    for (size_t i = 0; i < 3; i++) {
        char name[64];
        /* Hugging Face's own choice from the same scores (meta.json: fp64_topk_vs_topk_of_fp64_logits_slots_differing 0) */
        snprintf(name, sizeof name, "topk_fp64_%s", ids_of[i]);
        expect_ids(r, i, name, T_of[i]);
        snprintf(name, sizeof name, "router_fp64_%s", ids_of[i]);
        size_t n;
        double *want = read_tensor(fixture("hf/olmoe/ref.safetensors"), name, &n);
        const mf_st_tensor *t;
        mf_error err = {0};
        cr_assert_eq(mf_run_tensor(r, i, "router", &t, &err), MF_OK, "%s", err.msg);
        cr_assert_eq((size_t)mf_st_numel(t), n);
        for (size_t j = 0; j < n; j++) cr_assert_eq(mf_load_as_f64(t->data, t->dtype, j), want[j], "%s[%zu]", name, j);
        free(want);
    }
    mf_run_close(r);
}

/* ---- diffs ------------------------------------------------------------------- */

static json_t *diff_json(const char *ref, const char *tgt, const char *name) {
    char out[4200], err[4096];
    snprintf(out, sizeof out, "%s/%s.json", temp_dir(), name);
    cr_assert_eq(run_moeflip(err, sizeof err, "diff '%s' '%s' -o '%s' --bootstrap 0 > /dev/null", ref, tgt, out), 0, "%s", err);
    json_t *d = json_load_file(out, 0, NULL);
    cr_assert(d, "%s", out);
    return d;
}

static json_t *metric(json_t *d, const char *name) {
    json_t *m = json_object_get(json_object_get(json_array_get(json_object_get(d, "targets"), 0), "metrics"), name);
    cr_assert(m, "diff.json has no %s", name);
    return m;
}

static double value(json_t *d, const char *name) {
    json_t *v = json_object_get(metric(d, name), "value");
    cr_assert(json_is_number(v), "%s is not a number", name);
    return json_number_value(v);
}

static bool warned(json_t *d, const char *needle) {
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(d, "warnings"), i, w) if (strstr(json_string_value(w), needle)) return true;
    return false;
}

/* A .npy (format 1.0) of int16 [T, L, K] from a run's topk_ids [L, T, K] (rows rows of them). */
static void write_npy_from_run(const char *path, mf_run *r, size_t seq, int rows) {
    const mf_st_tensor *t;
    mf_error err = {0};
    cr_assert_eq(mf_run_tensor(r, seq, "topk_ids", &t, &err), MF_OK, "%s", err.msg);
    const int T = r->seqs[seq].length;
    char header[128];
    int hl = snprintf(header, sizeof header, "{'descr': '<i2', 'fortran_order': False, 'shape': (%d, %d, %d), }", rows, L_, K_);
    while ((10 + hl + 1) % 64) header[hl++] = ' ';
    header[hl++] = '\n';
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    const uint8_t len[2] = {(uint8_t)hl, (uint8_t)(hl >> 8)};
    fwrite(len, 1, 2, f);
    fwrite(header, 1, (size_t)hl, f);
    for (int p = 0; p < rows; p++)
        for (int l = 0; l < L_; l++)
            for (int k = 0; k < K_; k++) {
                uint16_t v;
                memcpy(&v, t->data + 2 * (((size_t)l * T + p) * K_ + k), 2);
                const int16_t s = (int16_t)v;
                fwrite(&s, 2, 1, f);
            }
    fclose(f);
}

Test(engines, a_capture_of_a_runs_own_experts_diffs_with_no_flip_and_null_where_it_lacks) {
    const char *dir = temp_dir();
    const char *ref = make_run(dir, "fp64", "hf/olmoe", "--precision fp64");
    mf_run *r;
    mf_error err = {0};
    cr_assert_eq(mf_run_open(&r, ref, &err), MF_OK, "%s", err.msg);
    char paths[3][4200];
    const char *files[3];
    for (size_t i = 0; i < 3; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/own_%zu.npy", dir, i);
        write_npy_from_run(paths[i], r, i, r->seqs[i].length);
        files[i] = paths[i];
    }
    mf_run_close(r);
    char out[4200];
    snprintf(out, sizeof out, "%s/own", dir);
    cr_assert_eq(mf_import_engine(MF_ENGINE_VLLM, files, 3, fixture("hf/olmoe"), fixture("hf/olmoe/tokens.jsonl"), out, &err), MF_OK,
                 "%s", err.msg);
    json_t *d = diff_json(ref, out, "own");
    cr_assert_eq(value(d, "flipped_slots_pct"), 0.0);
    cr_assert_eq(value(d, "router_set_equal_pct"), 100.0);
    cr_assert_eq(value(d, "router_ord_equal_pct"), 100.0, "the ids in the run's own order");
    /* what the capture cannot have: null, with a warning, never a number */
    const char *nulls[] = {"router_logit_mse", "gate_weight_mse", "forward_kl", "top1_pct", "raw_logit_mse"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) cr_assert(json_is_null(metric(d, nulls[i])), "%s must be null", nulls[i]);
    cr_assert(warned(d, "router_logit_mse: the target (a vllm capture) has no router logits; written as null"));
    cr_assert(warned(d, "forward_kl: the target (a vllm capture) has no logits"));
    cr_assert(warned(d, "gate_weight_mse: the target (a vllm capture) has no gate weights"));
    /* the reference's scores are there: its margins and ties stand */
    cr_assert(json_is_object(metric(d, "tie_slots_pct")));
    json_decref(d);
}

Test(engines, seq_len_minus_1_rows_compare_against_a_reference_traced_on_the_imported_tokens) {
    const char *dir = temp_dir();
    const char *own = make_run(dir, "fp64", "hf/olmoe", "--precision fp64");
    mf_run *r;
    mf_error err = {0};
    cr_assert_eq(mf_run_open(&r, own, &err), MF_OK, "%s", err.msg);
    char paths[3][4200];
    const char *files[3];
    for (size_t i = 0; i < 3; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/short_%zu.npy", dir, i);
        write_npy_from_run(paths[i], r, i, r->seqs[i].length - 1);   /* vLLM's seq_len - 1 rows */
        files[i] = paths[i];
    }
    mf_run_close(r);
    char out[4200], ref[4200], e[4096];
    snprintf(out, sizeof out, "%s/short", dir);
    cr_assert_eq(mf_import_engine(MF_ENGINE_VLLM, files, 3, fixture("hf/olmoe"), fixture("hf/olmoe/tokens.jsonl"), out, &err), MF_OK,
                 "%s", err.msg);
    snprintf(ref, sizeof ref, "%s/ref_short", dir);
    cr_assert_eq(run_moeflip(e, sizeof e, "trace -q --model '%s' --input '%s' --out '%s' --precision fp64", fixture("hf/olmoe"), out, ref),
                 0, "%s", e);
    json_t *d = diff_json(ref, out, "short");
    cr_assert_eq(value(d, "flipped_slots_pct"), 0.0, "a prefix traced alone routes as in the whole sequence (causal)");
    cr_assert_eq(json_integer_value(json_object_get(d, "sequences")), 3);
    json_decref(d);
}

Test(engines, hf_fp64_against_hf_bf16_cpu_flips_the_slots_hugging_face_counted) {
    const char *s[] = {eng("sglang/responses.json")};
    const char *l[] = {eng("llamacpp/s0.csv"), eng("llamacpp/s1.csv"), eng("llamacpp/s2.csv")};
    mf_run *a = import_ok(MF_ENGINE_SGLANG, s, 1, eng("tokens.jsonl"), "fp64");
    mf_run *b = import_ok(MF_ENGINE_LLAMACPP, l, 3, eng("tokens.jsonl"), "bf16cpu");
    json_t *d = diff_json(a->dir, b->dir, "hf");
    /* tests/fixtures/hf/olmoe/meta.json: topk_set_flips_vs_fp64.bf16cpu = 6 flipped of 204 slots */
    cr_assert_float_eq(value(d, "flipped_slots_pct"), 100.0 * 6 / 204, 1e-12);
    cr_assert(json_is_null(metric(d, "tie_slots_pct")), "no reference scores: no margins, no ties");
    cr_assert(warned(d, "tie_slots_pct: the reference (a sglang capture) has no router logits"));
    json_t *layer0 = json_array_get(json_object_get(json_array_get(json_object_get(d, "targets"), 0), "layers"), 0);
    cr_assert(json_is_null(json_object_get(layer0, "ties")));
    json_decref(d);
    mf_run_close(a);
    mf_run_close(b);
}

Test(engines, moeflip_fp64_routes_as_hugging_face_fp64_on_the_sglang_capture) {
    const char *s[] = {eng("sglang/responses.json")};
    mf_run *a = import_ok(MF_ENGINE_SGLANG, s, 1, eng("tokens.jsonl"), "hf64");
    const char *ref = make_run(temp_dir(), "fp64", "hf/olmoe", "--precision fp64");
    json_t *d = diff_json(ref, a->dir, "hf64");
    cr_expect_eq(value(d, "flipped_slots_pct"), 0.0);
    json_decref(d);
    mf_run_close(a);
}

Test(engines, export_leaves_out_what_the_capture_lacks) {
    const char *f[] = {eng("llamacpp/s0.csv"), eng("llamacpp/s1.csv"), eng("llamacpp/s2.csv")};
    mf_run *r = import_ok(MF_ENGINE_LLAMACPP, f, 3, eng("tokens.jsonl"), "x");
    char *buf = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&buf, &len);
    mf_error err = {0};
    cr_assert_eq(mf_run_export(r, MF_EXPORT_JSONL, o, &err), MF_OK, "%s", err.msg);
    fclose(o);
    cr_assert(strstr(buf, "{\"seq\": \"s0\", \"pos\": 0, \"token\": 57, \"layers\": [{\"layer\": 0, \"experts\": ["));
    cr_assert_null(strstr(buf, "weights"));
    cr_assert_null(strstr(buf, "router_logits"));
    free(buf);
    mf_run_close(r);
}

/* ---- refusals ------------------------------------------------------------------- */

static void refused(mf_engine e, const char *file, const char *tokens, const char *needle) {
    char out[4200];
    snprintf(out, sizeof out, "%s/refused", temp_dir());
    mf_error err = {0};
    const char *files[] = {file};
    const int rc = mf_import_engine(e, files, 1, fixture("hf/olmoe"), tokens, out, &err);
    cr_assert_neq(rc, MF_OK, "%s was imported", file);
    cr_assert(strstr(err.msg, needle), "%s: \"%s\" lacks \"%s\"", file, err.msg, needle);
    cr_assert_null(strchr(err.msg, '\n'), "one line: %s", err.msg);
    struct stat st;
    cr_assert_neq(stat(out, &st), 0, "a refused import left %s", out);
}

Test(engines, refusals_name_the_file_the_row_and_the_known_patterns) {
    char t0[4200];   /* eng's buffers rotate */
    snprintf(t0, sizeof t0, "%s", eng("bad/tokens_s0.jsonl"));
    refused(MF_ENGINE_SGLANG, eng("bad/sglang_pd_zero_prompt.json"), t0,
            "response 1 (sequence s0): rows 0 to 14 are all zero in every layer: the all-zero prompt rows that SGLang's "
            "prefill/decode disaggregation returns");
    refused(MF_ENGINE_LLAMACPP, eng("bad/llamacpp_flat_view.csv"), t0, "llamacpp_flat_view.csv:1 (sequence s0): every 16 rows of every layer are a "
                                                                        "permutation of all 16 experts, 336 rows for 21 tokens: the trace copied the "
                                                                        "ffn_moe_topk view flat");
    /* the view read as if contiguous: 21 rows for 21 tokens, but each ubatch's layers are token 0's, 1's, ...
     * rankings of the 16 experts cut into rows of 4 (tools/make_engine_fixtures.py, from HF's fp64 router logits) */
    refused(MF_ENGINE_LLAMACPP, eng("bad/llamacpp_view_read_flat.csv"), t0,
            "llamacpp_view_read_flat.csv:1 (sequence s0): the ubatch of tokens 0 to 7 holds, in every MoE layer, whole "
            "rankings of all 16 experts one after another (each 4 rows a permutation), not each token's top-4: the trace "
            "read the ffn_moe_topk view as contiguous");
    refused(MF_ENGINE_VLLM, eng("bad/vllm_out_of_range.npy"), t0, "vllm_out_of_range.npy (sequence s0): row 5, layer 1, slot 2: expert 16 outside the model's [0, 16)");
    refused(MF_ENGINE_VLLM, eng("bad/vllm_duplicate.npy"), t0, "vllm_duplicate.npy (sequence s0): row 7, layer 2: expert");
    refused(MF_ENGINE_VLLM, eng("bad/vllm_duplicate.npy"), t0, "twice (slots 0 and 3)");
    refused(MF_ENGINE_VLLM, eng("bad/vllm_rows.npy"), t0, "19 rows; the sequence has 21 tokens");
    refused(MF_ENGINE_VLLM, eng("bad/vllm_topk.npy"), t0, "2 expert ids per row; the model's top_k is 4");
    refused(MF_ENGINE_LLAMACPP, eng("bad/llamacpp_duplicate.csv"), t0, "(sequence s0): row 3, layer 0: expert");
    /* three captures for a one-sequence tokens file */
    refused(MF_ENGINE_SGLANG, eng("sglang/responses.json"), t0, "more captures than");
}

Test(engines, hostile_bytes_are_refused_by_name) {
    const char *dir = temp_dir();
    char t0[4200];
    snprintf(t0, sizeof t0, "%s", eng("bad/tokens_s0.jsonl"));
    char p[4200];
    /* vLLM: big-endian, Fortran order, 2 dimensions, data too short */
    static const struct { const char *hdr; size_t data; const char *needle; } npys[] = {
        {"{'descr': '>i2', 'fortran_order': False, 'shape': (21, 3, 4), }", 504, "dtype '>i2'"},
        {"{'descr': '<i2', 'fortran_order': True, 'shape': (21, 3, 4), }", 504, "Fortran-order"},
        {"{'descr': '<i2', 'fortran_order': False, 'shape': (21, 12), }", 504, "2 dimensions"},
        {"{'descr': '<i2', 'fortran_order': False, 'shape': (21, 3, 4), }", 500, "500 bytes of data for a [21, 3, 4] array"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (21, 3, 4), }", 1008, "dtype '<f4'"},
        /* int64 ids (bytes 0x01: 0x0101010101010101 each) do not fit the int32 the reader keeps: no expert index */
        {"{'descr': '<i8', 'fortran_order': False, 'shape': (21, 3, 4), }", 2016,
         "row 0, layer 0, slot 0: expert 72340172838076673 is no expert index"},
    };
    for (size_t i = 0; i < sizeof npys / sizeof npys[0]; i++) {
        snprintf(p, sizeof p, "%s/h%zu.npy", dir, i);
        FILE *f = fopen(p, "wb");
        const size_t hl = strlen(npys[i].hdr);
        fwrite("\x93NUMPY\x01\x00", 1, 8, f);
        const uint8_t len[2] = {(uint8_t)hl, 0};
        fwrite(len, 1, 2, f);
        fwrite(npys[i].hdr, 1, hl, f);
        for (size_t j = 0; j < npys[i].data; j++) fputc(1, f);
        fclose(f);
        refused(MF_ENGINE_VLLM, p, t0, npys[i].needle);
    }
    /* SGLang: not base64, base64 of no whole rows, a response without routed_experts */
    write_text(dir, "b1.json", "{\"meta_info\": {\"routed_experts\": \"AAA*\"}}");
    snprintf(p, sizeof p, "%s/b1.json", dir);
    refused(MF_ENGINE_SGLANG, p, t0, "not base64 (character 3 is 0x2a)");
    write_text(dir, "b2.json", "{\"meta_info\": {\"routed_experts\": \"AAAAAAAA\"}}");
    snprintf(p, sizeof p, "%s/b2.json", dir);
    refused(MF_ENGINE_SGLANG, p, t0, "holds 6 bytes: not whole rows of int32 [num_hidden_layers 3, top_k 4]");
    write_text(dir, "b3.json", "{\"text\": \"hi\", \"meta_info\": {}}");
    snprintf(p, sizeof p, "%s/b3.json", dir);
    refused(MF_ENGINE_SGLANG, p, t0, "response 1 has no meta_info.routed_experts string");
    /* llama.cpp: a layer out of order, a layer the model lacks, a row that is not two integers, rows not whole tokens */
    write_text(dir, "c1.csv", "1,0\n1,1\n1,2\n1,3\n");
    snprintf(p, sizeof p, "%s/c1.csv", dir);
    refused(MF_ENGINE_LLAMACPP, p, t0, "c1.csv:1: layer 1 where MoE layer 0 (layer 0) was expected");
    write_text(dir, "c2.csv", "0,1\n7,2\n");
    snprintf(p, sizeof p, "%s/c2.csv", dir);
    refused(MF_ENGINE_LLAMACPP, p, t0, "c2.csv:2: layer 7 is not a MoE layer of the model");
    write_text(dir, "c3.csv", "0,1\n0,x\n");
    snprintf(p, sizeof p, "%s/c3.csv", dir);
    refused(MF_ENGINE_LLAMACPP, p, t0, "c3.csv:2: not a layer,expert row of two integers");
    write_text(dir, "c4.csv", "0,1\n0,2\n0,3\n1,1\n1,2\n1,3\n2,1\n2,2\n2,3\n");
    snprintf(p, sizeof p, "%s/c4.csv", dir);
    refused(MF_ENGINE_LLAMACPP, p, t0, "c4.csv:1: layer 0 has 3 rows in this ubatch (top-4: not whole tokens)");
    write_text(dir, "c5.csv", "0,99\n");
    snprintf(p, sizeof p, "%s/c5.csv", dir);
    refused(MF_ENGINE_LLAMACPP, p, t0, "c5.csv:1: expert 99 outside the model's [0, 16)");
}

Test(engines, the_command_exits_0_1_and_2) {
    char err[4096], out[4200];
    snprintf(out, sizeof out, "%s/cli", temp_dir());
    cr_assert_eq(run_moeflip(err, sizeof err, "import vllm '%s' '%s' '%s' --model '%s' --tokens '%s' -o '%s'", eng("vllm/s0.npy"),
                             eng("vllm/s1.npy"), eng("vllm/s2.npy"), fixture("hf/olmoe"), eng("tokens.jsonl"), out),
                 0, "%s", err);
    cr_assert_eq(run_moeflip(err, sizeof err, "import vllm '%s' --model '%s' -o '%s/x'", eng("vllm/s0.npy"), fixture("hf/olmoe"),
                             temp_dir()),
                 2, "no --tokens: bad usage");
    cr_assert_eq(run_moeflip(err, sizeof err, "import vlm '%s' --model '%s' --tokens t -o x", eng("vllm/s0.npy"), fixture("hf/olmoe")), 2);
    cr_assert_eq(run_moeflip(err, sizeof err, "import vllm '%s' --model '%s' --tokens '%s' -o '%s/y'", eng("bad/vllm_rows.npy"),
                             fixture("hf/olmoe"), eng("bad/tokens_s0.jsonl"), temp_dir()),
                 1);
    cr_assert(strstr(err, "19 rows; the sequence has 21 tokens"), "%s", err);
    cr_assert_eq(strchr(err, '\n'), strrchr(err, '\n'), "one line: %s", err);
}

Test(engines, a_real_ubatch_whose_experts_happen_to_cover_all_is_no_flat_view) {
    /* 4 tokens of top-4 over 16 experts can partition them by chance: (t + l + 4k) mod 16 does in the first ubatch;
     * the flat-view pattern is named only where the rows are also too many for the tokens */
    const char *dir = temp_dir();
    char csv[8192] = "layer,expert\n", line[32];
    for (int u = 0; u < 6; u += 4)
        for (int l = 0; l < L_; l++)
            for (int t = u; t < u + 4 && t < 6; t++)
                for (int k = 0; k < K_; k++) {
                    snprintf(line, sizeof line, "%d,%d\n", l, (t + l + 4 * k) % 16);
                    strcat(csv, line);
                }
    write_text(dir, "chance.csv", csv);
    write_text(dir, "t6.jsonl", "{\"id\": \"s0\", \"tokens\": [57, 329, 203, 101, 7, 110]}\n");
    char f[4200], t[4200], out[4200];
    snprintf(f, sizeof f, "%s/chance.csv", dir);
    snprintf(t, sizeof t, "%s/t6.jsonl", dir);
    snprintf(out, sizeof out, "%s/chance", dir);
    const char *files[] = {f};
    mf_error err = {0};
    cr_assert_eq(mf_import_engine(MF_ENGINE_LLAMACPP, files, 1, fixture("hf/olmoe"), t, out, &err), MF_OK, "%s", err.msg);
    mf_run *r;
    cr_assert_eq(mf_run_open(&r, out, &err), MF_OK, "%s", err.msg);
    const mf_st_tensor *ids;
    cr_assert_eq(mf_run_tensor(r, 0, "topk_ids", &ids, &err), MF_OK);
    uint16_t v;
    memcpy(&v, ids->data + 2 * (((size_t)2 * 6 + 5) * K_ + 3), 2);   /* layer 2, token 5, slot 3 */
    cr_assert_eq(v, (5 + 2 + 12) % 16);
    mf_run_close(r);
}
