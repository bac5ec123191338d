/* Routing replay (trace --replay) and the attribution it makes possible
 * (diff.json's "attribution", sweep --replay), against independent
 * expectations: an fp64 run replaying its own routing is the plain fp64 run
 * bit for bit (every record level, the decode path, --replay-weights); a bf16
 * run replaying the fp64 reference dispatches exactly the reference's experts
 * (no flipped slot in moeflip diff), at the layers named and only there;
 * recorded weights are applied as recorded (rounded by hand here, and an
 * invariant: weights of zero are a model whose experts output zero); the
 * attribution's numbers are recomputed here from the three runs' exported
 * logits; and every refusal names what is wrong. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mf_trace.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------------ */

/* `moeflip trace -q --model MODEL --input INPUT --out DIR/NAME OPTS`, which must succeed; the run's path. */
static const char *trace(const char *dir, const char *name, const char *model, const char *input, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static const char *trace(const char *dir, const char *name, const char *model, const char *input, const char *fmt, ...) {
    static char out[16][600];
    static int next;
    char *o = out[next++ % 16], opts[2048], err[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(opts, sizeof opts, fmt, ap);
    va_end(ap);
    snprintf(o, 600, "%s/%s", dir, name);
    const int rc = run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s' --out '%s' %s", model, input, o, opts);
    cr_assert_eq(rc, 0, "trace %s failed: %s", opts, err);
    return o;
}

/* A fixture checkpoint directory and its prompts. */
static const char *model_of(const char *rel) { return fixture(rel); }
static const char *tokens_of(const char *rel) {
    static char b[4][4200];
    static int next;
    char *p = b[next++ % 4];
    snprintf(p, 4200, "%s/tokens.jsonl", fixture(rel));
    return p;
}

/* The embedded default model, written once per test into a temporary directory. */
static const char *embedded(void) {
    static char dir[4200];
    snprintf(dir, sizeof dir, "%s/model", temp_dir());
    mf_error err = {0};
    cr_assert_eq(mf_default_model_write(dir, &err), MF_OK, "%s", err.msg);
    return dir;
}

static mf_run *open_run(const char *dir) {
    mf_run *r;
    mf_error err = {0};
    cr_assert_eq(mf_run_open(&r, dir, &err), MF_OK, "%s", err.msg);
    return r;
}

static size_t seq_index(const mf_run *r, const char *id) {
    for (size_t i = 0; i < r->n_seqs; i++)
        if (!strcmp(r->seqs[i].id, id)) return i;
    cr_assert_fail("%s: no sequence %s", r->dir, id);
    return 0;
}

static const mf_st_tensor *tensor(mf_run *r, size_t s, const char *field) {
    const mf_st_tensor *t;
    mf_error err = {0};
    cr_assert_eq(mf_run_tensor(r, s, field, &t, &err), MF_OK, "%s", err.msg);
    return t;
}

static uint16_t u16_at(const mf_st_tensor *t, size_t i) {
    uint16_t v;
    memcpy(&v, t->data + 2 * i, 2);
    return v;
}

static int32_t i32_at(const mf_st_tensor *t, size_t i) {
    int32_t v;
    memcpy(&v, t->data + 4 * i, 4);
    return v;
}

static const char *const FIELDS[] = {"tokens", "topk_ids", "topk_w", "router", "shared_gate", "router_in",
                                     "logits", "topk_logits", "topk_tokens", "logsumexp"};

/* Every tensor of every sequence of a is in b with the same dtype, shape and bytes, and b has no other sequence. */
static void same_bits(const char *a_dir, const char *b_dir, const char *what) {
    mf_run *a = open_run(a_dir), *b = open_run(b_dir);
    cr_assert_eq(a->n_seqs, b->n_seqs, "%s: %zu sequences vs %zu", what, a->n_seqs, b->n_seqs);
    int compared = 0;
    for (size_t i = 0; i < a->n_seqs; i++) {
        const size_t j = seq_index(b, a->seqs[i].id);
        cr_assert_eq(a->seqs[i].generated, b->seqs[j].generated, "%s: %s generated %d vs %d", what, a->seqs[i].id,
                     a->seqs[i].generated, b->seqs[j].generated);
        for (size_t f = 0; f < sizeof FIELDS / sizeof FIELDS[0]; f++) {
            const mf_st_tensor *x = tensor(a, i, FIELDS[f]), *y = tensor(b, j, FIELDS[f]);
            cr_assert_eq(!x, !y, "%s: %s/%s in one run only", what, a->seqs[i].id, FIELDS[f]);
            if (!x) continue;
            cr_assert_eq(x->dtype, y->dtype, "%s: %s/%s dtypes differ", what, a->seqs[i].id, FIELDS[f]);
            cr_assert_eq(mf_st_numel(x), mf_st_numel(y), "%s: %s/%s shapes differ", what, a->seqs[i].id, FIELDS[f]);
            const size_t bytes = (size_t)mf_st_numel(x) * mf_dtype_size(x->dtype);
            cr_assert(!memcmp(x->data, y->data, bytes), "%s: %s/%s differ", what, a->seqs[i].id, FIELDS[f]);
            compared++;
        }
    }
    cr_assert(compared >= 3 * (int)a->n_seqs, "%s: only %d tensors compared", what, compared);
    mf_run_close(a);
    mf_run_close(b);
}

/* The number of slots (MoE layer, position) whose dispatched expert sets differ between two runs of the same
 * tokens, over layers [l0, l1) of the MoE layers and each sequence's first positions up to its length in both. */
static long set_differences(const char *a_dir, const char *b_dir, int l0, int l1) {
    mf_run *a = open_run(a_dir), *b = open_run(b_dir);
    long diff = 0;
    const int K = a->top_k;
    for (size_t i = 0; i < a->n_seqs; i++) {
        const size_t j = seq_index(b, a->seqs[i].id);
        const mf_st_tensor *x = tensor(a, i, "topk_ids"), *y = tensor(b, j, "topk_ids");
        const size_t la = (size_t)a->seqs[i].length, lb = (size_t)b->seqs[j].length, n = la < lb ? la : lb;
        for (int l = l0; l < l1; l++)
            for (size_t t = 0; t < n; t++) {
                int shared = 0;
                for (int p = 0; p < K; p++)
                    for (int q = 0; q < K; q++)
                        shared += u16_at(x, ((size_t)l * la + t) * K + p) == u16_at(y, ((size_t)l * lb + t) * K + q);
                diff += shared != K;
            }
    }
    mf_run_close(a);
    mf_run_close(b);
    return diff;
}

static json_t *load_json(const char *path) {
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    cr_assert(j, "%s: %s", path, e.text);
    return j;
}

/* `moeflip diff REF TARGETS... -o DIR/NAME` with extra options; diff.json parsed. */
static json_t *diff(const char *dir, const char *name, const char *opts, const char *ref, const char *t1, const char *t2,
                    const char *t3) {
    char err[4096], path[4300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const int rc = run_moeflip(err, sizeof err, "diff -q '%s' '%s' %s%s%s %s%s%s -o '%s' %s", ref, t1, t2 ? "'" : "",
                               t2 ? t2 : "", t2 ? "'" : "", t3 ? "'" : "", t3 ? t3 : "", t3 ? "'" : "", path, opts);
    cr_assert_eq(rc, 0, "diff failed: %s", err);
    return load_json(path);
}

static double metric(json_t *d, int target, const char *name) {
    json_t *v = json_object_get(json_object_get(json_object_get(json_array_get(json_object_get(d, "targets"), (size_t)target),
                                                                "metrics"),
                                                name),
                                "value");
    cr_assert(json_is_number(v), "target %d has no %s", target + 1, name);
    return json_number_value(v);
}

/* ---- an fp64 run replaying its own routing is the plain run, bit for bit ------------- */

static void self_replay(const char *model, const char *input, const char *record) {
    const char *d = temp_dir();
    const char *plain = trace(d, "plain", model, input, "--precision fp64 --record %s", record);
    const char *again = trace(d, "again", model, input, "--precision fp64 --record %s --replay '%s'", record, plain);
    same_bits(plain, again, record);
    const char *weighted = trace(d, "weighted", model, input, "--precision fp64 --record %s --replay '%s' --replay-weights",
                                 record, plain);
    same_bits(plain, weighted, "with --replay-weights");
    /* the manifest names the source by the digest of its manifest */
    char path[4300];
    snprintf(path, sizeof path, "%s/manifest.json", plain);
    size_t len;
    char *text = slurp(path, &len), digest[33];
    mf_digest_buffer(text, len, digest);
    free(text);
    snprintf(path, sizeof path, "%s/manifest.json", weighted);
    json_t *m = load_json(path), *rp = json_object_get(m, "replay");
    cr_assert_str_eq(json_string_value(json_object_get(rp, "source_manifest_digest")), digest);
    cr_assert_str_eq(json_string_value(json_object_get(rp, "weights")), "source");
    cr_assert(json_is_true(json_object_get(rp, "all_layers")));
    json_decref(m);
}

Test(replay, fp64_self_replay_every_record_level) {
    static const char *records[] = {"routing", "topk", "logits", "full"};
    for (int r = 0; r < 4; r++) self_replay(model_of("hf/olmoe"), tokens_of("hf/olmoe"), records[r]);
}

/* renormalised top-k (Mixtral), a shared expert (Qwen2-MoE), dense layers between MoE ones, Qwen3 */
Test(replay, fp64_self_replay_architectures) {
    static const char *cases[] = {"hf/mixtral", "hf/qwen2_moe", "hf/qwen2_moe_fused_sparse", "hf/qwen3_moe"};
    for (int c = 0; c < 4; c++) self_replay(model_of(cases[c]), tokens_of(cases[c]), "logits");
}

Test(replay, fp64_self_replay_embedded_model) {
    const char *m = embedded();
    char input[4300];
    snprintf(input, sizeof input, "%s/sweep-prompts.jsonl", m);
    self_replay(m, sampled_prompts(input, 2), "logits");
}

/* Whole-model runs under the 2026 profiles on the embedded model: emu:cdna4's bf16 arithmetic is CDNA3's (its
 * k16 MFMA is two k8 groups) and its manifest says it is not validated; emu:blackwell's is not flagged, and
 * its run differs from CDNA's. */
Test(replay, blackwell_and_cdna4_profiles_embedded_model) {
    const char *m = embedded(), *d = temp_dir();
    char input[4300], path[4300];
    snprintf(input, sizeof input, "%s/sweep-prompts.jsonl", m);
    const char *in = sampled_prompts(input, 2);
    const char *c3 = trace(d, "cdna3", m, in, "--numerics emu:cdna3 --threads 2");
    const char *c4 = trace(d, "cdna4", m, in, "--numerics emu:cdna4 --threads 2");
    const char *bw = trace(d, "blackwell", m, in, "--numerics emu:blackwell --threads 2");
    const char *rtx = trace(d, "rtxblackwell", m, in, "--numerics emu:rtxblackwell --threads 2");
    same_bits(c3, c4, "emu:cdna4 against emu:cdna3");
    same_bits(bw, rtx, "emu:rtxblackwell against emu:blackwell (the same k16 fused sum)");
    snprintf(path, sizeof path, "%s/manifest.json", c4);
    json_t *man = load_json(path);
    cr_assert(strstr(json_string_value(json_object_get(man, "numerics_validation")), "not validated"));
    cr_assert_str_eq(json_string_value(json_object_get(man, "numerics")),
                     "emu:cdna4:mfma_f32_32x32x16_bf16:acc=1:split=1:reduce=seq");
    json_decref(man);
    snprintf(path, sizeof path, "%s/manifest.json", bw);
    man = load_json(path);
    cr_assert_null(json_object_get(man, "numerics_validation"));
    cr_assert_str_eq(json_string_value(json_object_get(man, "numerics")),
                     "emu:blackwell:tcgen05.mma.m64n8k16.f32.bf16.bf16:acc=1:split=1:reduce=seq");
    json_decref(man);
    /* NVIDIA's truncation against AMD's rounding down: the logits differ somewhere */
    mf_run *a = open_run(bw), *b = open_run(c4);
    const mf_st_tensor *x = tensor(a, 0, "logits"), *y = tensor(b, seq_index(b, a->seqs[0].id), "logits");
    cr_assert(memcmp(x->data, y->data, (size_t)mf_st_numel(x) * mf_dtype_size(x->dtype)), "emu:blackwell = emu:cdna4?");
    mf_run_close(a);
    mf_run_close(b);
}

/* The decode path: every generated token's step replays the source's experts at its position. */
Test(replay, fp64_self_replay_decode_path) {
    static const char *cases[] = {"hf/olmoe", "hf/qwen2_moe"};
    for (int c = 0; c < 2; c++) {
        const char *d = temp_dir();
        const char *plain = trace(d, "plain", model_of(cases[c]), tokens_of(cases[c]), "--precision fp64 --generate 8");
        const char *again = trace(d, "again", model_of(cases[c]), tokens_of(cases[c]),
                                  "--precision fp64 --generate 8 --replay '%s'", plain);
        same_bits(plain, again, cases[c]);
        mf_run *r = open_run(plain);
        int generated = 0;
        for (size_t i = 0; i < r->n_seqs; i++) generated += r->seqs[i].generated;
        cr_assert(generated > 0, "%s: nothing generated", cases[c]);
        mf_run_close(r);
    }
}

/* ---- a bf16 run replaying the fp64 reference has no flipped slot against it ---------- */

static void bf16_no_flips(const char *model, const char *input, const char *numerics) {
    const char *d = temp_dir();
    const char *ref = trace(d, "ref", model, input, "--precision fp64");
    const char *plain = trace(d, "plain", model, input, "--precision bf16 --numerics %s", numerics);
    const char *twin = trace(d, "twin", model, input, "--precision bf16 --numerics %s --replay '%s'", numerics, ref);
    json_t *j = diff(d, "diff.json", "--bootstrap 0", ref, plain, twin, NULL);
    cr_assert(metric(j, 0, "flipped_slots_pct") > 0, "%s: the plain bf16 run flips nothing: the test would prove nothing", model);
    cr_assert_eq(metric(j, 1, "flipped_slots_pct"), 0, "%s: the replaying run flips %g%% of slots", model,
                 metric(j, 1, "flipped_slots_pct"));
    cr_assert_eq(metric(j, 1, "router_ord_equal_pct"), 100, "the replayed experts keep the reference's rank order");
    /* the router still ran: its logits are bf16's own, not the reference's */
    cr_assert(metric(j, 1, "router_logit_mse") > 0);
    mf_run *R = open_run(ref);
    const int n_moe = R->n_moe;
    mf_run_close(R);
    cr_assert_eq(set_differences(ref, twin, 0, n_moe), 0);
    /* the diff finds the twin and attributes */
    json_t *a = json_array_get(json_object_get(j, "attribution"), 0);
    cr_assert(a, "no attribution");
    cr_assert_eq(json_integer_value(json_object_get(a, "target")), 1);
    cr_assert_eq(json_integer_value(json_object_get(a, "overall")), 2);
    json_decref(j);
}

Test(replay, bf16_replaying_fp64_has_no_flips_olmoe) { bf16_no_flips(model_of("hf/olmoe"), tokens_of("hf/olmoe"), "emu:hopper"); }
Test(replay, bf16_replaying_fp64_has_no_flips_qwen3) { bf16_no_flips(model_of("hf/qwen3_moe"), tokens_of("hf/qwen3_moe"), "native"); }
Test(replay, bf16_replaying_fp64_has_no_flips_embedded) {
    const char *m = embedded();
    char input[4300];
    snprintf(input, sizeof input, "%s/sweep-prompts.jsonl", m);
    bf16_no_flips(m, sampled_prompts(input, 2), "native");
}

/* Generating, the twin replays the reference's experts at every position while its tokens are the reference's
 * (generated ones too), and routes itself from the first token of its own; teacher-forced on the reference's
 * tokens it replays every position. */
Test(replay, bf16_replaying_fp64_decode_path) {
    const char *d = temp_dir(), *m = model_of("hf/olmoe"), *in = tokens_of("hf/olmoe");
    const char *ref = trace(d, "ref", m, in, "--precision fp64 --generate 12");
    const char *plain = trace(d, "plain", m, in, "--precision bf16 --generate 12");
    const char *twin = trace(d, "twin", m, in, "--precision bf16 --generate 12 --replay '%s'", ref);
    const char *forced = trace(d, "forced", m, ref, "--precision bf16 --replay '%s'", ref);
    json_t *j = diff(d, "diff.json", "--bootstrap 0", ref, plain, twin, NULL);
    cr_assert(metric(j, 0, "flipped_slots_pct") > 0);
    cr_assert_eq(metric(j, 1, "flipped_slots_pct"), 0);
    json_decref(j);
    mf_run *R = open_run(ref), *W = open_run(twin);
    const int K = R->top_k;
    int replayed_generated = 0, own_after = 0;
    for (size_t i = 0; i < R->n_seqs; i++) {
        const size_t w = seq_index(W, R->seqs[i].id);
        const mf_st_tensor *rt = tensor(R, i, "tokens"), *wt = tensor(W, w, "tokens");
        const mf_st_tensor *ri = tensor(R, i, "topk_ids"), *wi = tensor(W, w, "topk_ids");
        const size_t lr = (size_t)R->seqs[i].length, lw = (size_t)W->seqs[w].length;
        const size_t prompt = lr - (size_t)R->seqs[i].generated;
        size_t agree = 0;   /* the leading positions whose tokens are the reference's */
        while (agree < lr && agree < lw && i32_at(rt, agree) == i32_at(wt, agree)) agree++;
        for (int l = 0; l < R->n_moe; l++)
            for (size_t t = 0; t < agree; t++)
                for (int k = 0; k < K; k++)
                    cr_assert_eq(u16_at(wi, ((size_t)l * lw + t) * K + k), u16_at(ri, ((size_t)l * lr + t) * K + k),
                                 "%s layer %d position %zu", R->seqs[i].id, l, t);
        replayed_generated += agree > prompt ? (int)(agree - prompt) : 0;
        own_after += (int)(lw - agree);
    }
    cr_assert(replayed_generated > 0, "no generated position replayed");
    mf_run_close(W);
    mf_run_close(R);
    cr_assert_eq(set_differences(ref, forced, 0, 3), 0, "teacher-forced on the reference's tokens, every position replays");
    (void)own_after;
}

/* ---- --replay-layers: only the layers named ---------------------------------------- */

/* The canonical top-k of a row: larger first, lower index on ties. */
static void topk(const double *v, int n, int k, int *ids) {
    bool *taken = calloc((size_t)n, 1);
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
        taken[best] = true;
        ids[i] = best;
    }
    free(taken);
}

/* At MoE layer l of a run every slot dispatched its own router's choice: the top-k of its recorded logits. */
static void own_choice(const char *run, int l) {
    mf_run *W = open_run(run);
    const int K = W->top_k, E = W->n_experts;
    for (size_t i = 0; i < W->n_seqs; i++) {
        const size_t len = (size_t)W->seqs[i].length;
        const mf_st_tensor *wi = tensor(W, i, "topk_ids"), *wr = tensor(W, i, "router");
        for (size_t t = 0; t < len; t++) {
            double row[MF_MAX_EXPERTS];
            int own[MF_MAX_TOP_K];
            for (int e = 0; e < E; e++) row[e] = mf_load_as_f64(wr->data, wr->dtype, ((size_t)l * len + t) * E + e);
            topk(row, E, K, own);
            for (int k = 0; k < K; k++)
                cr_assert_eq(u16_at(wi, ((size_t)l * len + t) * K + k), own[k], "%s: %s MoE layer %d position %zu", run,
                             W->seqs[i].id, l, t);
        }
    }
    mf_run_close(W);
}

Test(replay, replay_layers_change_only_the_layers_named) {
    const char *d = temp_dir(), *m = model_of("hf/olmoe"), *in = tokens_of("hf/olmoe");
    const char *ref = trace(d, "ref", m, in, "--precision fp64");
    const char *plain = trace(d, "plain", m, in, "--precision bf16 --numerics emu:hopper");
    /* the MoE layer (this model has three, all MoE) where the plain run flips: it must flip there for the test to
     * see the replay */
    int layer = -1;
    for (int l = 0; l < 2 && layer < 0; l++)
        if (set_differences(ref, plain, l, l + 1) > 0) layer = l;
    cr_assert(layer >= 0, "the plain bf16 run flips in neither of the first two layers");
    char spec[16];
    snprintf(spec, sizeof spec, "%d", layer);
    const char *twin = trace(d, "twin", m, in, "--precision bf16 --numerics emu:hopper --replay '%s' --replay-layers %s", ref, spec);
    cr_assert_eq(set_differences(ref, twin, layer, layer + 1), 0, "layer %d replays", layer);
    mf_run *P = open_run(plain), *W = open_run(twin);
    const int K = W->top_k, E = W->n_experts;
    long checked = 0, differs_from_ref = 0;
    mf_run *R = open_run(ref);
    for (size_t i = 0; i < W->n_seqs; i++) {
        const size_t p = seq_index(P, W->seqs[i].id), r = seq_index(R, W->seqs[i].id);
        const size_t len = (size_t)W->seqs[i].length;
        const mf_st_tensor *wi = tensor(W, i, "topk_ids"), *wr = tensor(W, i, "router"), *pi = tensor(P, p, "topk_ids"),
                           *pr = tensor(P, p, "router"), *ri = tensor(R, r, "topk_ids");
        /* before the replayed layer nothing changed: the plain run's bits */
        for (size_t x = 0; x < (size_t)layer * len * E; x++)
            cr_assert_eq(mf_load_as_f64(wr->data, wr->dtype, x), mf_load_as_f64(pr->data, pr->dtype, x));
        for (size_t x = 0; x < (size_t)layer * len * K; x++) cr_assert_eq(u16_at(wi, x), u16_at(pi, x));
        /* after it, each layer's experts are the run's own router's choice: the top-k of its recorded logits */
        for (int l = layer + 1; l < W->n_moe; l++)
            for (size_t t = 0; t < len; t++) {
                double row[64];
                int own[8];
                for (int e = 0; e < E; e++) row[e] = mf_load_as_f64(wr->data, wr->dtype, ((size_t)l * len + t) * E + e);
                topk(row, E, K, own);
                bool same_as_ref = true;
                for (int k = 0; k < K; k++) {
                    cr_assert_eq(u16_at(wi, ((size_t)l * len + t) * K + k), own[k], "%s layer %d position %zu",
                                 W->seqs[i].id, l, t);
                    same_as_ref &= u16_at(ri, ((size_t)l * len + t) * K + k) == own[k];
                }
                differs_from_ref += !same_as_ref;
                checked++;
            }
    }
    cr_assert(checked > 0);
    mf_run_close(R);
    mf_run_close(P);
    mf_run_close(W);
    /* the manifest says which */
    char path[4300];
    snprintf(path, sizeof path, "%s/manifest.json", twin);
    json_t *man = load_json(path), *rp = json_object_get(man, "replay");
    cr_assert_eq(json_array_size(json_object_get(rp, "layers")), 1);
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(rp, "layers"), 0)), layer);
    cr_assert(json_is_false(json_object_get(rp, "all_layers")));
    json_decref(man);
    cr_assert(differs_from_ref > 0, "after layer %d the run's own experts are the reference's everywhere: a replay of every "
              "layer would pass too", layer);
}

/* A range takes the MoE layers inside it; a dense layer named alone is refused. */
Test(replay, replay_layers_range_over_a_dense_layer) {
    const char *d = temp_dir(), *m = model_of("hf/qwen2_moe_fused_sparse"), *in = tokens_of("hf/qwen2_moe_fused_sparse");
    const char *ref = trace(d, "ref", m, in, "--precision fp64");
    const char *twin = trace(d, "twin", m, in, "--precision bf16 --replay '%s' --replay-layers 0-1", ref);
    char path[4300], err[4096];
    snprintf(path, sizeof path, "%s/manifest.json", twin);
    json_t *man = load_json(path), *ls = json_object_get(json_object_get(man, "replay"), "layers");
    cr_assert_eq(json_array_size(ls), 1, "layer 1 is dense: 0-1 holds MoE layer 0 alone");
    cr_assert_eq(json_integer_value(json_array_get(ls, 0)), 0);
    json_decref(man);
    cr_assert_eq(set_differences(ref, twin, 0, 1), 0);
    own_choice(twin, 1);
    const int rc = run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s' --out '%s/x' --replay '%s' --replay-layers 1",
                               m, in, d, ref);
    cr_assert_eq(rc, 1);
    cr_assert(strstr(err, "layer 1 is a dense layer"), "%s", err);
}

/* ---- --replay-weights --------------------------------------------------------------- */

/* x rounded to bf16 (8 significant bits), to nearest, ties to even: by hand, for the normal numbers weights are. */
static double round_bf16(double x) {
    if (x == 0) return x;
    int e;
    const double m = frexp(x, &e);   /* x = m 2^e, 0.5 <= |m| < 1 */
    return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

/* The weights applied are the reference's, rounded to the dtype the model applies them in: bf16 for OLMoE (the
 * router logits' dtype), fp32 for Mixtral (which keeps its top-k weights in fp32). */
static void recorded_weights(const char *fixture_name, bool bf16_weights) {
    const char *d = temp_dir(), *m = model_of(fixture_name), *in = tokens_of(fixture_name);
    const char *ref = trace(d, "ref", m, in, "--precision fp64");
    const char *twin = trace(d, "twin", m, in, "--precision bf16 --replay '%s' --replay-weights", ref);
    const char *own = trace(d, "own", m, in, "--precision bf16 --replay '%s'", ref);
    mf_run *R = open_run(ref), *W = open_run(twin), *O = open_run(own);
    long slots = 0, own_differs = 0;
    for (size_t i = 0; i < R->n_seqs; i++) {
        const size_t w = seq_index(W, R->seqs[i].id), o = seq_index(O, R->seqs[i].id);
        const mf_st_tensor *rw = tensor(R, i, "topk_w"), *ww = tensor(W, w, "topk_w"), *ow = tensor(O, o, "topk_w");
        for (int64_t x = 0; x < mf_st_numel(rw); x++) {
            const double src = mf_load_as_f64(rw->data, rw->dtype, (size_t)x);
            const double want = bf16_weights ? round_bf16(src) : (double)(float)src;
            const double got = mf_load_as_f64(ww->data, ww->dtype, (size_t)x);
            cr_assert_eq(got, want, "%s %s slot %lld: weight %.17g, the reference's %.17g rounded is %.17g", fixture_name,
                         R->seqs[i].id, (long long)x, got, src, want);
            own_differs += mf_load_as_f64(ow->data, ow->dtype, (size_t)x) != got;
            slots++;
        }
    }
    cr_assert(slots > 0);
    cr_assert(own_differs > 0, "%s: the router's own weights equal the reference's: the option would change nothing", fixture_name);
    mf_run_close(R);
    mf_run_close(W);
    mf_run_close(O);
}

Test(replay, replay_weights_are_the_recorded_weights) {
    recorded_weights("hf/olmoe", true);
    recorded_weights("hf/mixtral", false);
}

/* An invariant of the combine: with every replayed weight 0 the MoE blocks add nothing, which is what a model
 * whose experts' down projections are zero computes. The source run is written here with the reference's experts
 * and weights of 0; the checkpoint with zero down projections too. */
Test(replay, replay_weights_of_zero_are_a_model_without_experts) {
    const char *d = temp_dir(), *mdir = model_of("hf/olmoe"), *in = tokens_of("hf/olmoe");
    mf_error err = {0};
    mf_precision prec;
    mf_numerics num;
    cr_assert_eq(mf_precision_parse(&prec, "fp64", &err), MF_OK);
    cr_assert_eq(mf_numerics_parse(&num, "fp64", &err), MF_OK);
    mf_model *m;
    cr_assert_eq(mf_model_load(&m, mdir, prec.weights, 0, &err), MF_OK, "%s", err.msg);
    mf_prompts p;
    cr_assert_eq(mf_prompts_load(&p, in, m->cfg.vocab, &err), MF_OK, "%s", err.msg);
    char src[4300];
    snprintf(src, sizeof src, "%s/zero-weights", d);
    mf_run_info info = {.model_dir = mdir, .model = m, .prec = &prec, .device = "cpu", .numerics = "fp64", .threads = 1,
                        .record = MF_RECORD_LOGITS, .input_path = in, .prompts = &p};
    mf_run_writer *w;
    cr_assert_eq(mf_run_create(&w, src, &info, false, &err), MF_OK, "%s", err.msg);
    mf_run_opts ro = {.prec = prec, .threads = 1, .numerics = &num};
    for (size_t i = 0; i < p.n; i++) {
        mf_seq_result r;
        cr_assert_eq(mf_forward_cpu(m, &ro, p.seq[i].tokens, p.seq[i].T, &r, &err), MF_OK, "%s", err.msg);
        for (size_t x = 0; x < (size_t)r.n_moe * r.T * r.k; x++) r.topk_w[x] = 0;
        cr_assert_eq(mf_run_writer_add(w, &p.seq[i], &r, &err), MF_OK, "%s", err.msg);
        mf_seq_result_free(&r);
    }
    cr_assert_eq(mf_run_writer_close(w, &err), MF_OK, "%s", err.msg);
    mf_run_writer_free(w);
    mf_prompts_free(&p);
    mf_model_free(m);
    /* the checkpoint, its experts' down projections zero */
    const char *zero = copy_fixture_dir("hf/olmoe");
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", mdir);
    mf_st_file *f;
    cr_assert_eq(mf_st_open(&f, path, &err), MF_OK, "%s", err.msg);
    mf_st_writer *sw = mf_st_writer_new();
    int zeroed = 0;
    for (size_t t = 0; t < f->count; t++) {
        const mf_st_tensor *x = &f->tensors[t];
        const size_t bytes = (size_t)mf_st_numel(x) * mf_dtype_size(x->dtype);
        void *data = malloc(bytes + 1);
        memcpy(data, x->data, bytes);
        if (strstr(x->name, ".experts.") && strstr(x->name, "down_proj")) {
            memset(data, 0, bytes);
            zeroed++;
        }
        mf_st_writer_add(sw, x->name, x->dtype, x->ndim, x->shape, data);
        free(data);
    }
    cr_assert_eq(zeroed, 3 * 16, "olmoe's 3 layers x 16 experts");
    snprintf(path, sizeof path, "%s/model.safetensors", zero);
    cr_assert_eq(mf_st_writer_write(sw, path, &err), MF_OK, "%s", err.msg);
    mf_st_writer_free(sw);
    mf_st_close(f);
    const char *replayed = trace(d, "replayed", mdir, in, "--precision fp64 --replay '%s' --replay-weights", src);
    const char *without = trace(d, "without", zero, in, "--precision fp64");
    const char *plain = trace(d, "plain", mdir, in, "--precision fp64");
    mf_run *A = open_run(replayed), *B = open_run(without), *C = open_run(plain);
    for (size_t i = 0; i < A->n_seqs; i++) {
        const size_t j = seq_index(B, A->seqs[i].id), k = seq_index(C, A->seqs[i].id);
        static const char *fields[] = {"logits", "router"};
        for (int q = 0; q < 2; q++) {
            const mf_st_tensor *x = tensor(A, i, fields[q]), *y = tensor(B, j, fields[q]), *z = tensor(C, k, fields[q]);
            const size_t bytes = (size_t)mf_st_numel(x) * mf_dtype_size(x->dtype);
            cr_assert(!memcmp(x->data, y->data, bytes), "%s: %s differ from the model without experts", A->seqs[i].id, fields[q]);
            cr_assert(memcmp(x->data, z->data, bytes), "%s: %s equal the plain run's: the weights changed nothing",
                      A->seqs[i].id, fields[q]);
        }
        const mf_st_tensor *wt = tensor(A, i, "topk_w");
        for (int64_t x = 0; x < mf_st_numel(wt); x++) cr_assert_eq(mf_load_as_f64(wt->data, wt->dtype, (size_t)x), 0);
    }
    mf_run_close(A);
    mf_run_close(B);
    mf_run_close(C);
}

/* ---- the attribution's numbers, recomputed from the runs' exported logits ---------- */

/* A run's exported rows: per sequence (in id order), its tokens and logits (as fp32 values, as the diff reads
 * them). */
typedef struct exported {
    int n;
    char ids[16][64];
    int len[16], generated[16];
    int32_t *tokens[16];
    double *logits[16];   /* [len][V] */
    int V;
} exported;

static void export_run(const char *run, exported *e) {
    memset(e, 0, sizeof *e);
    char path[4300], err[2048];
    snprintf(path, sizeof path, "%s.jsonl", run);
    cr_assert_eq(run_moeflip(err, sizeof err, "export '%s' --format jsonl -o '%s'", run, path), 0, "%s", err);
    size_t len;
    char *text = slurp(path, &len);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *row = json_loads(line, 0, NULL);
        cr_assert(row);
        const char *id = json_string_value(json_object_get(row, "seq"));
        int s = -1;
        for (int i = 0; i < e->n; i++)
            if (!strcmp(e->ids[i], id)) s = i;
        if (s < 0) {
            cr_assert(e->n < 16);
            s = e->n++;
            snprintf(e->ids[s], sizeof e->ids[s], "%s", id);
        }
        json_t *lg = json_object_get(row, "logits");
        e->V = (int)json_array_size(lg);
        const int pos = (int)json_integer_value(json_object_get(row, "pos"));
        cr_assert_eq(pos, e->len[s], "rows in position order");
        e->tokens[s] = realloc(e->tokens[s], sizeof(int32_t) * (size_t)(pos + 1));
        e->tokens[s][pos] = (int32_t)json_integer_value(json_object_get(row, "token"));
        e->logits[s] = realloc(e->logits[s], sizeof(double) * (size_t)(pos + 1) * (size_t)e->V);
        for (int v = 0; v < e->V; v++) e->logits[s][(size_t)pos * e->V + v] = (float)json_number_value(json_array_get(lg, (size_t)v));
        e->generated[s] += json_is_true(json_object_get(row, "generated"));
        e->len[s]++;
        json_decref(row);
    }
    free(text);
    /* id order, as the diff pools */
    for (int i = 0; i < e->n; i++)
        for (int j = i + 1; j < e->n; j++)
            if (strcmp(e->ids[j], e->ids[i]) < 0) {
                char t[64];
                memcpy(t, e->ids[i], 64);
                memcpy(e->ids[i], e->ids[j], 64);
                memcpy(e->ids[j], t, 64);
#define SWAP(a) do { __typeof__(a[0]) x_ = a[i]; a[i] = a[j]; a[j] = x_; } while (0)
                SWAP(e->len);
                SWAP(e->generated);
                SWAP(e->tokens);
                SWAP(e->logits);
#undef SWAP
            }
}

static void exported_free(exported *e) {
    for (int i = 0; i < e->n; i++) {
        free(e->tokens[i]);
        free(e->logits[i]);
    }
}

/* KL(P || Q), squared logit and probability errors and top-1 agreement of one position, from logits a and b. */
static void position_stats(const double *a, const double *b, int V, double out[4]) {
    double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0;
    int ia = 0, ib = 0;
    for (int v = 0; v < V; v++) {
        if (a[v] > ma) ma = a[v], ia = v;
        if (b[v] > mb) mb = b[v], ib = v;
    }
    for (int v = 0; v < V; v++) {
        za += exp(a[v] - ma);
        zb += exp(b[v] - mb);
    }
    double kl = 0, sq = 0, psq = 0;
    for (int v = 0; v < V; v++) {
        const double la = a[v] - ma - log(za), lb = b[v] - mb - log(zb);
        kl += exp(la) * (la - lb);
        sq += (b[v] - a[v]) * (b[v] - a[v]);
        psq += (exp(lb) - exp(la)) * (exp(lb) - exp(la));
    }
    out[0] = kl;
    out[1] = sq;
    out[2] = psq;
    out[3] = ia != ib;   /* a disagreement */
}

/* The positions a run's sequence s compares with the reference's: all of them, or where both generated, those
 * before the first token where they part (the diff's definition, docs/diff.md). */
static int compared(const exported *ref, const exported *x, int s, bool generated) {
    if (!generated) return ref->len[s];
    const int n = ref->len[s] < x->len[s] ? ref->len[s] : x->len[s];
    const int prompt = ref->len[s] - ref->generated[s];
    for (int t = prompt; t < n; t++)
        if (ref->tokens[s][t] != x->tokens[s][t]) return t;
    return n;
}

typedef struct hand {
    int n;
    double pos[16], t[16][4], w[16][4];   /* per case: positions, target and twin sums */
} hand;

/* 100 x (target - twin) / target of metric m over cases idx (all when NULL) */
static double share(const hand *h, int m, const int *idx, int n) {
    double t = 0, w = 0;
    for (int i = 0; i < n; i++) {
        const int c = idx ? idx[i] : i;
        t += h->t[c][m];
        w += h->w[c][m];
    }
    return t != 0 ? 100 * (t - w) / t : NAN;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    const double h = (n - 1) * p / 100;
    const int lo = (int)floor(h);
    return lo >= n - 1 ? v[n - 1] : v[lo] + (h - lo) * (v[lo + 1] - v[lo]);
}

static void near(double got, double want, const char *what) {
    cr_assert(fabs(got - want) <= 1e-9 * fmax(fabs(want), 1e-300) + 1e-15, "%s: diff.json says %.17g, by hand %.17g", what,
              got, want);
}

static void attribution_by_hand(bool generate) {
    const char *d = temp_dir(), *m = model_of("hf/olmoe");
    /* eight sequences, so that the intervals resample something */
    char input[4300], line[512];
    snprintf(input, sizeof input, "%s/prompts.jsonl", d);
    FILE *fp = fopen(input, "w");
    uint32_t x = 12345;
    for (int s = 0; s < 8; s++) {
        int n = snprintf(line, sizeof line, "{\"id\": \"p%d\", \"tokens\": [", s);
        const int len = 9 + 3 * s;
        for (int t = 0; t < len; t++) {
            x = x * 1103515245u + 12345u;
            n += snprintf(line + n, sizeof line - (size_t)n, t ? ", %u" : "%u", (x >> 8) % 384);
        }
        fprintf(fp, "%s]}\n", line);
    }
    fclose(fp);
    const char *gen = generate ? "--generate 16" : "";
    const char *ref = trace(d, "ref", m, input, "--precision fp64 %s", gen);
    const char *tgt = trace(d, "tgt", m, input, "--precision bf16 --numerics emu:cdna3 %s", gen);
    const char *twin = trace(d, "twin", m, input, "--precision bf16 --numerics emu:cdna3 %s --replay '%s'", gen, ref);
    const int B = 300, seed = 4242;
    char opts[64];
    snprintf(opts, sizeof opts, "--bootstrap %d --seed %d", B, seed);
    json_t *j = diff(d, "diff.json", opts, ref, tgt, twin, NULL);
    json_t *a = json_array_get(json_object_get(j, "attribution"), 0);
    cr_assert(a, "no attribution");
    json_t *tw = json_array_get(json_object_get(a, "twins"), 0);
    cr_assert_eq(json_integer_value(json_object_get(tw, "twin")), 2);
    exported R, T, W;
    export_run(ref, &R);
    export_run(tgt, &T);
    export_run(twin, &W);
    cr_assert_eq(R.n, 8);
    hand h = {.n = R.n};
    long positions = 0;
    int parted_apart = 0;   /* sequences whose target and twin part from the reference at different positions */
    for (int s = 0; s < R.n; s++) {
        const int nt = compared(&R, &T, s, generate), nw = compared(&R, &W, s, generate), n = nt < nw ? nt : nw;
        parted_apart += nt != nw;
        h.pos[s] = n;
        positions += n;
        for (int t = 0; t < n; t++) {
            double st[4], sw[4];
            position_stats(R.logits[s] + (size_t)t * R.V, T.logits[s] + (size_t)t * R.V, R.V, st);
            position_stats(R.logits[s] + (size_t)t * R.V, W.logits[s] + (size_t)t * R.V, R.V, sw);
            for (int q = 0; q < 4; q++) {
                h.t[s][q] += st[q];
                h.w[s][q] += sw[q];
            }
        }
    }
    cr_assert_eq(json_integer_value(json_object_get(tw, "positions")), positions);
    cr_assert(!generate || parted_apart > 0, "no sequence where the twin's response parts elsewhere than the target's: the "
              "common positions go untested");
    double den = 0;
    for (int s = 0; s < h.n; s++) den += h.pos[s];
    static const char *errors[] = {"forward_kl", "raw_logit_mse", "prob_mse", "top1_disagreement_pct"};
    static const char *shares[] = {"kl_from_flips_pct", "raw_logit_mse_from_flips_pct", "prob_mse_from_flips_pct",
                                   "top1_disagreement_from_flips_pct"};
    const double scale[4] = {1.0 / den, 1.0 / (den * R.V), 1.0 / (den * R.V), 100.0 / den};
    /* the resampling plan as docs/diff.md defines it: B draws of n sequences (in id order), each index
     * floor(u n) from core's generator seeded with the seed, draw after draw */
    int *plan = malloc(sizeof(int) * (size_t)B * (size_t)h.n);
    mf_rng rng;
    mf_rng_seed(&rng, (uint64_t)seed);
    for (int i = 0; i < B * h.n; i++) plan[i] = (int)(mf_rng_uniform(&rng) * h.n);
    for (int q = 0; q < 4; q++) {
        double t = 0, w = 0;
        for (int s = 0; s < h.n; s++) {
            t += h.t[s][q];
            w += h.w[s][q];
        }
        char what[128];
        snprintf(what, sizeof what, "target_error.%s", errors[q]);
        near(json_number_value(json_object_get(json_object_get(json_object_get(tw, "target_error"), errors[q]), "value")),
             t * scale[q], what);
        snprintf(what, sizeof what, "twin_error.%s", errors[q]);
        near(json_number_value(json_object_get(json_object_get(json_object_get(tw, "twin_error"), errors[q]), "value")),
             w * scale[q], what);
        json_t *sh = json_object_get(tw, shares[q]);
        if (t == 0) {   /* no disagreement in the target: no share */
            cr_assert(json_is_null(json_object_get(sh, "value")), "%s of a target without that error", shares[q]);
            continue;
        }
        near(json_number_value(json_object_get(sh, "value")), 100 * (t - w) / t, shares[q]);
        double *draws = malloc(sizeof(double) * (size_t)B);
        int k = 0;
        for (int b = 0; b < B; b++) {
            const double v = share(&h, q, plan + (size_t)b * h.n, h.n);
            if (!isnan(v)) draws[k++] = v;
        }
        cr_assert(k > 0);
        const double lo = pct(draws, k, 2.5), hi = pct(draws, k, 97.5);
        free(draws);
        snprintf(what, sizeof what, "%s ci95 low", shares[q]);
        near(json_number_value(json_array_get(json_object_get(sh, "ci95"), 0)), lo, what);
        snprintf(what, sizeof what, "%s ci95 high", shares[q]);
        near(json_number_value(json_array_get(json_object_get(sh, "ci95"), 1)), hi, what);
        cr_assert(lo < hi || q == 3, "%s: an interval over 8 sequences of width 0", shares[q]);
    }
    /* the target's own error must be the diff's metrics (over every position, the same sums) */
    if (!generate) near(metric(j, 0, "forward_kl"), json_number_value(json_object_get(json_object_get(json_object_get(tw, "target_error"),
                                                                                                     "forward_kl"), "value")),
                        "target_error.forward_kl against metrics.forward_kl");
    cr_assert(json_number_value(json_object_get(json_object_get(tw, "kl_from_flips_pct"), "value")) > 0,
              "the flips of emu:cdna3 x bf16 cause none of its KL: the replay did nothing");
    cr_assert_eq(json_number_value(json_object_get(tw, "twin_flipped_slots_pct")), 0);
    free(plan);
    exported_free(&R);
    exported_free(&T);
    exported_free(&W);
    json_decref(j);
}

Test(replay, attribution_by_hand_from_exported_logits) { attribution_by_hand(false); }
/* generated responses: over the positions before either run parts from the reference */
Test(replay, attribution_by_hand_generated) { attribution_by_hand(true); }

/* A twin is found by the digest of the reference's manifest and the target's configuration: a replay of another
 * run, or in another configuration, is no twin; nor is a replay a repeat for the noise floor. */
Test(replay, attribution_pairs_only_twins) {
    const char *d = temp_dir(), *m = model_of("hf/olmoe"), *in = tokens_of("hf/olmoe");
    const char *ref = trace(d, "ref", m, in, "--precision fp64");
    const char *ref2 = trace(d, "ref2", m, in, "--precision fp64 --record full");   /* another run of fp64 */
    const char *tgt = trace(d, "tgt", m, in, "--precision bf16");
    const char *other_src = trace(d, "other-src", m, in, "--precision bf16 --replay '%s'", ref2);
    const char *other_cfg = trace(d, "other-cfg", m, in, "--precision bf16 --numerics emu:hopper --replay '%s'", ref);
    json_t *j = diff(d, "d1.json", "--bootstrap 0", ref, tgt, other_src, other_cfg);
    cr_assert_null(json_object_get(j, "attribution"), "no twin here");
    json_decref(j);
    const char *self = trace(d, "self", m, in, "--precision fp64 --replay '%s'", ref);
    j = diff(d, "d2.json", "--bootstrap 0", ref, self, NULL, NULL);
    cr_assert_null(json_object_get(j, "floor"), "a replay is not a repeat of the reference");
    cr_assert_null(json_object_get(j, "attribution"));
    json_decref(j);
}

/* ---- refusals ---------------------------------------------------------------------- */

/* `moeflip trace ... --out DIR/x OPTS` fails with status rc and a message holding want. */
static void refused(const char *model, const char *input, const char *dir, int rc, const char *want, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void refused(const char *model, const char *input, const char *dir, int rc, const char *want, const char *fmt, ...) {
    char opts[4096], err[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(opts, sizeof opts, fmt, ap);
    va_end(ap);
    const int got = run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s' --out '%s/x' %s", model, input, dir, opts);
    cr_assert_eq(got, rc, "%s: exit %d (want %d): %s", opts, got, rc, err);
    cr_assert(strstr(err, want), "%s: \"%s\" does not say \"%s\"", opts, err, want);
    cr_assert(!strchr(err, '\n') || strchr(err, '\n') == err + strlen(err) - 1, "one line: %s", err);
    char path[4300];
    snprintf(path, sizeof path, "%s/x", dir);
    cr_assert(!mf_path_exists(path), "%s: a refused trace left a run", opts);
}

Test(replay, refuses_another_model) {
    const char *d = temp_dir(), *m = model_of("hf/olmoe"), *in = tokens_of("hf/olmoe");
    const char *ref = trace(d, "ref", m, in, "--precision fp64");
    refused(model_of("hf/qwen3_moe"), in, d, 1, "a run of another model (architecture olmoe", "--replay '%s'", ref);
    refused(model_of("hf/olmoe_dynamic"), in, d, 1, "a run of another model (config_digest", "--replay '%s'", ref);
    /* the same config, other weights: one byte of the last tensor changed */
    const char *other = copy_fixture_dir("hf/olmoe");
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", other);
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp);
    fseek(fp, -2, SEEK_END);
    const int c = fgetc(fp);
    fseek(fp, -2, SEEK_END);
    fputc(c ^ 1, fp);
    fclose(fp);
    refused(other, in, d, 1, "a run of another model (weights_digest", "--replay '%s'", ref);
    /* a dense model has no routing */
    refused(model_of("hf/llama"), tokens_of("hf/llama"), d, 1, "dense model", "--replay '%s'", ref);
}

Test(replay, refuses_other_tokens) {
    const char *d = temp_dir(), *m = model_of("hf/olmoe"), *in = tokens_of("hf/olmoe");
    const char *ref = trace(d, "ref", m, in, "--precision fp64");
    /* s1's token at position 4 changed */
    char *text = slurp(in, NULL);
    json_t *lines[3];
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < 3; line = strtok(NULL, "\n")) lines[n++] = json_loads(line, 0, NULL);
    cr_assert_eq(n, 3);
    free(text);
    cr_assert_str_eq(json_string_value(json_object_get(lines[1], "id")), "s1");
    json_t *toks = json_object_get(lines[1], "tokens");
    const json_int_t old = json_integer_value(json_array_get(toks, 4)), neu = (old + 1) % 384;
    json_array_set_new(toks, 4, json_integer(neu));
    char buf[64 << 10] = "";
    for (int i = 0; i < 3; i++) {
        char *s = json_dumps(lines[i], JSON_COMPACT);
        strcat(buf, s);
        strcat(buf, "\n");
        free(s);
    }
    write_text(d, "changed.jsonl", buf);
    char changed[4300], want[256];
    snprintf(changed, sizeof changed, "%s/changed.jsonl", d);
    snprintf(want, sizeof want, "sequence s1, position 4: token %lld in the run, %lld in the input", (long long)old, (long long)neu);
    refused(m, changed, d, 1, want, "--precision bf16 --replay '%s'", ref);
    /* a sequence the run lacks */
    json_object_set_new(lines[1], "id", json_string("s9"));
    buf[0] = 0;
    for (int i = 0; i < 3; i++) {
        char *s = json_dumps(lines[i], JSON_COMPACT);
        strcat(buf, s);
        strcat(buf, "\n");
        free(s);
    }
    write_text(d, "extra.jsonl", buf);
    snprintf(changed, sizeof changed, "%s/extra.jsonl", d);
    refused(m, changed, d, 1, "sequence s9 of the input is not in the run", "--precision bf16 --replay '%s'", ref);
    for (int i = 0; i < 3; i++) json_decref(lines[i]);
    /* a generated run's sequences are longer than the prompts: the message says what to do */
    const char *gen = trace(d, "gen", m, in, "--precision fp64 --generate 4");
    refused(m, in, d, 1, "give --generate", "--precision bf16 --replay '%s'", gen);
}

/* A run of the model whose shard lacks routing (written consistently: the manifest's digest and size are the
 * shard's), and an incomplete run. */
Test(replay, refuses_a_run_without_routing_or_incomplete) {
    const char *d = temp_dir(), *m = model_of("hf/olmoe"), *in = tokens_of("hf/olmoe");
    const char *ref = trace(d, "ref", m, in, "--precision fp64 --shard-seqs 100");
    char path[4300], mpath[4300];
    snprintf(path, sizeof path, "%s/part-00000.safetensors", ref);
    mf_st_file *f;
    mf_error err = {0};
    cr_assert_eq(mf_st_open(&f, path, &err), MF_OK, "%s", err.msg);
    mf_st_writer *w = mf_st_writer_new();
    mf_st_writer_meta(w, "format", "moeflip-run");
    int dropped = 0;
    for (size_t t = 0; t < f->count; t++) {
        const mf_st_tensor *x = &f->tensors[t];
        if (strstr(x->name, "/topk_ids")) {
            dropped++;
            continue;
        }
        const size_t bytes = (size_t)mf_st_numel(x) * mf_dtype_size(x->dtype);
        void *data = malloc(bytes + 1);
        memcpy(data, x->data, bytes);
        mf_st_writer_add(w, x->name, x->dtype, x->ndim, x->shape, data);
        free(data);
    }
    cr_assert_eq(dropped, 3);
    mf_st_close(f);
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    cr_assert_eq(mf_st_writer_write(w, tmp, &err), MF_OK, "%s", err.msg);
    mf_st_writer_free(w);
    cr_assert_eq(rename(tmp, path), 0);
    char digest[33];
    cr_assert_eq(mf_digest_file(path, digest, &err), MF_OK);
    snprintf(mpath, sizeof mpath, "%s/manifest.json", ref);
    json_t *man = load_json(mpath), *sh = json_array_get(json_object_get(man, "shards"), 0);
    json_object_set_new(sh, "digest", json_string(digest));
    size_t bytes;
    free(slurp(path, &bytes));
    json_object_set_new(sh, "bytes", json_integer((json_int_t)bytes));
    cr_assert_eq(json_dump_file(man, mpath, JSON_INDENT(1)), 0);
    refused(m, in, d, 1, "no topk_ids", "--precision bf16 --replay '%s'", ref);
    /* incomplete */
    const char *inc = trace(d, "inc", m, in, "--precision fp64");
    snprintf(mpath, sizeof mpath, "%s/manifest.json", inc);
    json_decref(man);
    man = load_json(mpath);
    json_object_set_new(man, "complete", json_false());
    cr_assert_eq(json_dump_file(man, mpath, JSON_INDENT(1)), 0);
    json_decref(man);
    refused(m, in, d, 1, "not complete", "--precision bf16 --replay '%s'", inc);
}

Test(replay, refuses_bad_layer_lists_and_options) {
    const char *d = temp_dir(), *m = model_of("hf/olmoe"), *in = tokens_of("hf/olmoe");
    const char *ref = trace(d, "ref", m, in, "--precision fp64");
    static const struct { const char *spec, *want; int rc; } bad[] = {
        {"x", "is not a layer index", 2},     {"1,", "is not a layer index", 2},   {"2-1", "a range is N-M", 2},
        {"-1", "is not a layer index", 2},    {"1;2", "is not a layer index", 2},  {"", "takes model layer indices", 2},
        {"3", "not a layer of the model (0 to 2)", 1}, {"0-7", "not a layer of the model", 1},
        {"1,1", "named twice", 2},             {"0-1,1", "named twice", 2},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(m, in, d, bad[i].rc, bad[i].want, "--replay '%s' --replay-layers '%s'", ref, bad[i].spec);
    refused(m, in, d, 2, "go with --replay", "--replay-layers 0");
    refused(m, in, d, 2, "go with --replay", "--replay-weights");
    /* a resumed run keeps its replay */
    const char *run = trace(d, "resumed", m, in, "--precision bf16 --replay '%s' --replay-layers 0", ref);
    char err[4096];
    const int rc = run_moeflip(err, sizeof err, "trace -q --model '%s' --input '%s' --out '%s' --precision bf16 --replay '%s' --resume",
                               m, in, run, ref);
    cr_assert_eq(rc, 1, "%s", err);
    cr_assert(strstr(err, "cannot resume") && strstr(err, "replay"), "%s", err);
}

/* ---- the sweep ------------------------------------------------------------------------- */

Test(replay, sweep_replay_reports_the_share_and_the_curve, .timeout = 300) {
    const char *d = temp_dir();
    char err[4096], path[4300];
    const int rc = run_moeflip(err, sizeof err, "sweep -q --replay --generate 0 --targets emu:hopper@bf16 --bootstrap 200 --out '%s/out' > '%s/sweep.txt'",
                               d, d);
    cr_assert_eq(rc, 0, "%s", err);
    snprintf(path, sizeof path, "%s/out/diff.json", d);
    json_t *j = load_json(path);
    /* the target, its twin in every layer, and one through each of the first three of the default model's four */
    cr_assert_eq(json_array_size(json_object_get(j, "targets")), 5);
    json_t *a = json_array_get(json_object_get(j, "attribution"), 0), *curve = json_object_get(a, "curve");
    cr_assert_eq(json_integer_value(json_object_get(a, "target")), 1);
    cr_assert_eq(json_array_size(curve), 4);
    for (int l = 0; l < 4; l++) {
        json_t *p = json_array_get(curve, (size_t)l);
        cr_assert_eq(json_integer_value(json_object_get(p, "through_layer")), l);
        cr_assert(json_is_number(json_object_get(json_object_get(p, "kl_from_flips_pct"), "value")));
    }
    cr_assert(json_equal(json_object_get(json_array_get(curve, 3), "twin"), json_object_get(a, "overall")),
              "the curve ends at the twin that replays every layer");
    cr_assert(metric(j, 0, "flipped_slots_pct") > 0);
    cr_assert_eq(metric(j, 1, "flipped_slots_pct"), 0, "the twin that replays every layer flips nothing");
    json_decref(j);
    snprintf(path, sizeof path, "%s/sweep.txt", d);
    char *out = slurp(path, NULL);
    cr_assert(strstr(out, "its expert flips cause"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/out/report.html", d);
    char *html = slurp(path, NULL);
    cr_assert(strstr(html, "Routing replay: how much of the output error the expert flips cause"));
    cr_assert(strstr(html, "alt=\"replay-curve\""), "the curve figure is in the report");
    cr_assert(strstr(html, "class=replay"), "replaying targets are labelled");
    free(html);
    snprintf(path, sizeof path, "%s/out/figures/reference-t1-replay-curve.png", d);
    cr_assert(mf_path_exists(path));
}
