/* moeflip_gpu_check: validation and benchmarks of the GPU backend, on a GPU
 * machine. It links only what the forward passes need (no cairo, no
 * Criterion), so a build made elsewhere runs on a bare GPU image.
 *
 *   moeflip_gpu_check validate FIXTURES OUT.json
 *       every check of tools/gpu_check.sh (and the gpu ctest label):
 *       - fp32 on the GPU (cuBLAS, TF32 off) against the CPU's fp64 run:
 *         logits and router logits within 1e-5 relative, the same experts
 *         wherever fp64's logit margin (k-th minus (k+1)-th) exceeds 1e-6;
 *       - `fixed` (mma.sync on the card) against the CPU's
 *         emu:hopper:mma.m16n8k16 run, and the GPU's emu:ARCH against the
 *         CPU's emu:ARCH: bit for bit, every output of every sequence.
 *       OUT.json records each check with digests of the GPU's outputs: the
 *       committed copy (tests/fixtures/gpu/) lets machines without a GPU
 *       check the CPU models against what the H200 computed.
 *   moeflip_gpu_check validate26 FIXTURES OUT.json, validate_oss FIXTURES OUT.json, validateq FIXTURES OUT.json
 *       the same checks on the DeepSeek-family fixtures (tests/fixtures/hf26, the FP8 one refused), or on the
 *       gpt-oss ones (hf26/gpt_oss and its MXFP4 twin), or the block-scaled weights: tools/gpu_check_family.sh.
 *   moeflip_gpu_check bench MODEL_DIR PRECISION REPS NUMERICS[,NUMERICS...] [OUT.json]
 *       (profile:NUMERICS: also print where the time goes, with a wait after every step;
 *       VAR=VALUE/NUMERICS: with a backend variable set for that entry, e.g.
 *       MF_GPU_GLU=0/native for gate, up and the activation as three steps)
 *       teacher-forced capture of the first prompt of MODEL_DIR/tokens.jsonl,
 *       logits and routing copied to the host; tokens per second (median of
 *       REPS after one warm-up), and for the first numerics the same without
 *       copying the routing, the two runs alternating, and the trace's overhead
 *       as the median over the pairs.
 *   moeflip_gpu_check synth SIZE SEED DIR
 *       moeflip synth --size SIZE, for machines that run only this tool.
 * Exit status: 0 all passed, 1 a check failed or an error, 77 no GPU. */
#include "mf_runtime.h"
#include "mf_router.h"
#include "mf_trace.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXIT_NO_GPU 77

static const char *hf_cases[] = {"llama",     "llama_tied_llama3", "mixtral",          "mixtral_linear_v4cfg",
                                 "olmoe",     "olmoe_dynamic",     "qwen2_moe",        "qwen2_moe_fused_sparse",
                                 "qwen3_moe", "qwen3_moe_yarn_v4cfg", "tiny_olmoe"};

/* tests/fixtures/hf26: DeepSeek-V3, DeepSeek-V2 and GLM-4.5 (latent attention, grouped sigmoid and softmax
 * routers, shared experts, dense first layers); the FP8 one is checked apart (check_blockscaled) */
static const char *hf26_cases[] = {"deepseek_v3",        "deepseek_v3_noqlora", "deepseek_v3_yarn",
                                   "deepseek_v2_greedy", "deepseek_v2_group",   "glm4_moe"};

/* tests/fixtures/hf26/gpt_oss: gpt-oss (attention sinks, sliding and full layers, YaRN, attention biases, the
 * biased top-k-then-softmax router, clamped SwiGLU experts with biases, fused gate_up), bf16 weights; and its
 * MXFP4 twin, whose experts stay packed blocks on the device */
static const char *oss_cases[] = {"gpt_oss", "gpt_oss_mxfp4"};

static const char *hopper_mma = "emu:hopper:mma.m16n8k16.f32.bf16.bf16.f32";
static const char *hopper_mma_f16 = "emu:hopper:mma.m16n8k16.f32.f16.f16.f32";

typedef struct outputs {
    size_t n;
    mf_seq_result *r;
    double secs;
} outputs;

static void free_outputs(outputs *o) {
    for (size_t i = 0; o->r && i < o->n; i++) mf_seq_result_free(&o->r[i]);
    free(o->r);
    memset(o, 0, sizeof *o);
}

/* How a check runs its sequences: in one pass each; as a session (the first half of each sequence as a
 * prompt, then one token at a time against the key-value cache: the decode path); or replaying the
 * routing of the CPU's fp64 run of the same sequences (with that run's weights, or the router's own). */
typedef enum { MODE_FORWARD, MODE_DECODE, MODE_REPLAY, MODE_REPLAY_WEIGHTS } run_mode;
static const char *const mode_names[] = {"forward", "decode", "replay", "replay-weights"};

/* A sequence as a session, on a GPU (g) or the CPU (m, ro): its first half at once, then a token at a time.
 * With dynamic NTK scaling a position's RoPE tables depend on the length so far, so the CPU's session, not its
 * one pass, is what the GPU's must equal. */
static int decode_seq(mf_gpu *g, const mf_model *m, const mf_run_opts *ro, const int32_t *tokens, int T,
                      mf_seq_result *out, mf_error *err) {
    const int P = T / 2 > 0 ? T / 2 : 1;
    mf_cpu_session *cs = NULL;
    int rc = g ? mf_gpu_session_rewind(g, 0, err) : mf_cpu_session_open(&cs, m, ro, T, err);
    memset(out, 0, sizeof *out);
    for (int at = 0; at < T && !rc; at += at < P ? P : 1) {
        const int n = at < P ? P : 1;
        mf_seq_result s;
        if ((rc = g ? mf_gpu_session_forward(g, tokens + at, n, MF_GPU_ALL, &s, err)
                    : mf_cpu_session_forward(cs, tokens + at, n, &s, err)))
            break;
        if (at == 0) mf_seq_result_alloc(out, &m->cfg, T, &s);
        mf_seq_result_place(out, &s, at);
        mf_seq_result_free(&s);
    }
    mf_cpu_session_close(cs);
    if (rc) mf_seq_result_free(out);
    return rc;
}

static int run_all(outputs *o, const char *dir, const char *tokens, const char *prec_name, const char *num_name,
                   const char *device, run_mode mode, mf_error *err);

/* The routing of the CPU's fp64 run of every sequence, as replays. */
static int replay_source(outputs *src, mf_replay **rp, const char *dir, const char *tokens, bool weights, mf_error *err) {
    *rp = NULL;
    int rc = run_all(src, dir, tokens, "fp64", "fp64", NULL, MODE_FORWARD, err);
    if (rc) return rc;
    mf_prompts ps;
    if ((rc = mf_prompts_load(&ps, tokens, src->r[0].V, err))) {
        free_outputs(src);
        return rc;
    }
    *rp = mf_xcalloc(src->n, sizeof **rp);
    for (size_t i = 0; i < src->n; i++) {
        int32_t *t = mf_xmalloc((size_t)ps.seq[i].T * sizeof *t);
        memcpy(t, ps.seq[i].tokens, (size_t)ps.seq[i].T * sizeof *t);
        (*rp)[i] = (mf_replay){ps.seq[i].T, t, src->r[i].topk_ids, weights ? src->r[i].topk_w : NULL, NULL};
    }
    mf_prompts_free(&ps);
    return MF_OK;
}

/* Every prompt of tokens on the CPU (device NULL) or a GPU, in the given mode. */
static int run_all(outputs *o, const char *dir, const char *tokens, const char *prec_name, const char *num_name,
                   const char *device, run_mode mode, mf_error *err) {
    memset(o, 0, sizeof *o);
    mf_precision p;
    mf_numerics n;
    if (mf_precision_parse(&p, prec_name, err) || mf_numerics_parse(&n, num_name, err)) return MF_EINVAL;
    mf_model *m = NULL;
    int rc = mf_model_load(&m, dir, p.weights, device ? MF_LOAD_NO_CONVERT : 0, err);
    if (rc) return rc;
    mf_prompts ps;
    if ((rc = mf_prompts_load(&ps, tokens, m->cfg.vocab, err))) {
        mf_model_free(m);
        return rc;
    }
    outputs src = {0};
    mf_replay *rp = NULL;
    if ((mode == MODE_REPLAY || mode == MODE_REPLAY_WEIGHTS) &&
        (rc = replay_source(&src, &rp, dir, tokens, mode == MODE_REPLAY_WEIGHTS, err))) {
        mf_prompts_free(&ps);
        mf_model_free(m);
        return rc;
    }
    o->n = ps.n;
    o->r = mf_xcalloc(ps.n, sizeof(mf_seq_result));
    mf_gpu *g = NULL;
    int max_T = 0;
    for (size_t i = 0; i < ps.n; i++) max_T = ps.seq[i].T > max_T ? ps.seq[i].T : max_T;
    if (device) rc = mf_gpu_open(&g, device, m, &p, &n, max_T, mode == MODE_DECODE ? max_T : 0, err);
    mf_run_opts ro = {.prec = p, .threads = (int)sysconf(_SC_NPROCESSORS_ONLN), .numerics = &n};
    const double t0 = mf_now();
    for (size_t i = 0; i < ps.n && !rc; i++) {
        if (rp) {
            ro.replay = &rp[i];
            if (g) mf_gpu_set_replay(g, &rp[i]);
        }
        rc = mode == MODE_DECODE ? decode_seq(g, m, &ro, ps.seq[i].tokens, ps.seq[i].T, &o->r[i], err)
             : device            ? mf_gpu_forward(g, ps.seq[i].tokens, ps.seq[i].T, MF_GPU_ALL, &o->r[i], err)
                                 : mf_forward_cpu(m, &ro, ps.seq[i].tokens, ps.seq[i].T, &o->r[i], err);
        if (rc) mf_fail_wrap(err, "%s, sequence %s", dir, ps.seq[i].id);
    }
    o->secs = mf_now() - t0;
    mf_gpu_close(g);
    for (size_t i = 0; rp && i < src.n; i++) free((void *)rp[i].tokens);
    free(rp);
    free_outputs(&src);
    mf_prompts_free(&ps);
    mf_model_free(m);
    if (rc) free_outputs(o);
    return rc;
}

/* The digests the committed record compares, as a JSON object. */
static json_t *digests(const outputs *o) {
    char hex[MF_SEQ_DIGESTS][33];
    mf_seq_results_digest(o->r, o->n, hex);
    json_t *j = json_object();
    for (int i = 0; i < MF_SEQ_DIGESTS; i++) json_object_set_new(j, MF_SEQ_DIGEST_NAMES[i], json_string(hex[i]));
    return j;
}

static double rel_err(const double *a, const double *ref, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs(a[i] - ref[i]));
        s = fmax(s, fabs(ref[i]));
    }
    return s > 0 ? d / s : d;
}

static bool check_close(json_t *rec, const outputs *g, const outputs *ref) {
    double lr = 0, rr = 0;
    int differ = 0, compared = 0;
    for (size_t s = 0; s < ref->n; s++) {
        const mf_seq_result *a = &g->r[s], *b = &ref->r[s];
        lr = fmax(lr, rel_err(a->logits, b->logits, (size_t)b->T * b->V));
        if (!b->n_moe) continue;
        const size_t slots = (size_t)b->n_moe * b->T;
        rr = fmax(rr, rel_err(a->router, b->router, slots * b->E));
        double *probs = mf_xmalloc((size_t)b->E * sizeof(double));
        for (size_t i = 0; i < slots; i++) {
            uint16_t ids[1024];
            double w[1024];
            mf_route_spec spec = {.kind = MF_ROUTE_KIND_SOFTMAX_TOPK, .n_experts = b->E, .top_k = b->k, .norm_topk = false, .opmath = MF_F64, .weight_out = MF_F64};
            mf_route_out ro = {.ids = ids, .weights = w};
            if (b->select) {   /* the grouped routers select on these rows (biased scores, groups masked) */
                const double *sel = b->select + i * b->E;
                mf_topk(sel, b->E, b->k + 1 <= b->E ? b->k + 1 : b->k, ids);
                ro.margin_logit = b->k < b->E ? sel[ids[b->k - 1]] - sel[ids[b->k]] : 1;
                if (!isfinite(ro.margin_logit)) ro.margin_logit = 1;   /* the k-th against a masked group */
            } else {
                mf_route(&spec, b->router + i * b->E, probs, &ro);
            }
            if (b->k < b->E && !(ro.margin_logit > 1e-6)) continue;
            compared++;
            bool same = true;   /* as sets: every expert of one is in the other */
            for (int x = 0; x < b->k && same; x++) {
                bool found = false;
                for (int y = 0; y < b->k; y++) found |= a->topk_ids[i * b->k + x] == b->topk_ids[i * b->k + y];
                same = found;
            }
            differ += !same;
        }
        free(probs);
    }
    json_object_set_new(rec, "logits_rel", json_real(lr));
    json_object_set_new(rec, "router_rel", json_real(rr));
    json_object_set_new(rec, "slots_compared", json_integer(compared));
    json_object_set_new(rec, "slots_differ", json_integer(differ));
    return lr <= 1e-5 && rr <= 1e-5 && differ == 0;
}

static size_t bits_differ(const double *a, const double *b, size_t n) {
    size_t d = 0;
    if (!a || !b) return a != b ? n : 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(double)) != 0;
    return d;
}

/* The first element where the GPU's and the CPU's outputs differ, for the record: which sequence, tensor, MoE
 * layer (rows of [layers][T][width] tensors), position and column, and both values. */
static void first_diff(json_t *rec, size_t seq, const char *tensor, const double *a, const double *b, size_t n, int T,
                       size_t width, bool layered) {
    if (json_object_get(rec, "first_diff") || !a || !b) return;
    for (size_t i = 0; i < n; i++) {
        if (!memcmp(&a[i], &b[i], sizeof(double))) continue;
        const size_t row = i / width;
        char text[400];
        if (layered)
            snprintf(text, sizeof text, "sequence %zu, %s, moe layer %zu, position %zu, column %zu: gpu %.17g cpu %.17g",
                     seq, tensor, row / (size_t)T, row % (size_t)T, i % width, a[i], b[i]);
        else
            snprintf(text, sizeof text, "sequence %zu, %s, position %zu, column %zu: gpu %.17g cpu %.17g", seq, tensor,
                     row, i % width, a[i], b[i]);
        json_object_set_new(rec, "first_diff", json_string(text));
        return;
    }
}

static bool check_equal(json_t *rec, const outputs *g, const outputs *c) {
    size_t logits = 0, bl = 0, br = 0, bi = 0, bw = 0, bg = 0, bs = 0;
    for (size_t s = 0; s < c->n; s++) {
        const mf_seq_result *a = &g->r[s], *b = &c->r[s];
        logits += (size_t)b->T * b->V;
        bl += bits_differ(a->logits, b->logits, (size_t)b->T * b->V);
        if (!b->n_moe) {
            first_diff(rec, s, "logits", a->logits, b->logits, (size_t)b->T * b->V, b->T, (size_t)b->V, false);
            continue;
        }
        const size_t slots = (size_t)b->n_moe * b->T;
        /* the earliest tensor first: the routing of the first differing layer tells more than the logits */
        first_diff(rec, s, "router logits", a->router, b->router, slots * b->E, b->T, (size_t)b->E, true);
        first_diff(rec, s, "selection scores", a->select, b->select, b->select ? slots * b->E : 0, b->T, (size_t)b->E,
                   true);
        for (size_t i = 0; i < slots * b->k && !json_object_get(rec, "first_diff"); i++)
            if (a->topk_ids[i] != b->topk_ids[i]) {
                char text[300];
                const size_t row = i / (size_t)b->k;
                snprintf(text, sizeof text, "sequence %zu, experts, moe layer %zu, position %zu, rank %zu: gpu %d cpu %d",
                         s, row / (size_t)b->T, row % (size_t)b->T, i % (size_t)b->k, a->topk_ids[i], b->topk_ids[i]);
                json_object_set_new(rec, "first_diff", json_string(text));
            }
        first_diff(rec, s, "expert weights", a->topk_w, b->topk_w, slots * b->k, b->T, (size_t)b->k, true);
        first_diff(rec, s, "shared gates", a->shared_gate, b->shared_gate, b->shared_gate ? slots : 0, b->T, 1, true);
        first_diff(rec, s, "logits", a->logits, b->logits, (size_t)b->T * b->V, b->T, (size_t)b->V, false);
        br += bits_differ(a->router, b->router, slots * b->E);
        bw += bits_differ(a->topk_w, b->topk_w, slots * b->k);
        for (size_t i = 0; i < slots * b->k; i++) bi += a->topk_ids[i] != b->topk_ids[i];
        if (b->shared_gate) bg += bits_differ(a->shared_gate, b->shared_gate, slots);
        if (b->select || a->select) bs += bits_differ(a->select, b->select, slots * b->E);
    }
    json_object_set_new(rec, "logits", json_integer((json_int_t)logits));
    json_object_set_new(rec, "logits_differ", json_integer((json_int_t)bl));
    json_object_set_new(rec, "router_differ", json_integer((json_int_t)br));
    json_object_set_new(rec, "ids_differ", json_integer((json_int_t)bi));
    json_object_set_new(rec, "weights_differ", json_integer((json_int_t)bw));
    json_object_set_new(rec, "shared_gates_differ", json_integer((json_int_t)bg));
    json_object_set_new(rec, "selection_differ", json_integer((json_int_t)bs));
    return !bl && !br && !bi && !bw && !bg && !bs;
}

typedef struct tally {
    int passed, failed;
    json_t *checks;
} tally;

/* A check's verdict into its record, which is printed as one line (PASS or FAIL, then the JSON), kept and counted */
static void record_check(tally *t, json_t *rec, bool pass) {
    json_object_set_new(rec, "pass", json_boolean(pass));
    char *line = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER);
    printf("%s %s\n", pass ? "PASS" : "FAIL", line);
    fflush(stdout);
    free(line);
    json_array_append_new(t->checks, rec);
    pass ? t->passed++ : t->failed++;
}

/* One check: the GPU run of (precision, gpu numerics) against the CPU run of
 * (cpu precision, cpu numerics). */
static void check_mode(tally *t, const char *label, const char *source, const char *dir, const char *tokens,
                       const char *prec, const char *gpu_num, const char *cpu_prec, const char *cpu_num, bool exact,
                       run_mode mode) {
    mf_error err = {0};
    outputs g, c;
    json_t *rec = json_object();
    json_object_set_new(rec, "case", json_string(label));
    json_object_set_new(rec, "source", json_string(source));
    json_object_set_new(rec, "precision", json_string(prec));
    json_object_set_new(rec, "gpu_numerics", json_string(gpu_num));
    json_object_set_new(rec, "cpu_precision", json_string(cpu_prec));
    json_object_set_new(rec, "cpu_numerics", json_string(cpu_num));
    json_object_set_new(rec, "kind", json_string(exact ? "bit-exact" : "within 1e-5"));
    json_object_set_new(rec, "mode", json_string(mode_names[mode]));
    bool pass = false;
    if (run_all(&g, dir, tokens, prec, gpu_num, "cuda", mode, &err) ||
        run_all(&c, dir, tokens, cpu_prec, cpu_num, NULL, mode, &err)) {
        json_object_set_new(rec, "error", json_string(err.msg));
        free_outputs(&g);
    } else {
        pass = exact ? check_equal(rec, &g, &c) : check_close(rec, &g, &c);
        json_object_set_new(rec, "gpu_digests", digests(&g));
        json_object_set_new(rec, "gpu_seconds", json_real(g.secs));
        json_object_set_new(rec, "cpu_seconds", json_real(c.secs));
        free_outputs(&g);
        free_outputs(&c);
    }
    record_check(t, rec, pass);
}

static void check(tally *t, const char *label, const char *source, const char *dir, const char *tokens,
                  const char *prec, const char *gpu_num, const char *cpu_prec, const char *cpu_num, bool exact) {
    check_mode(t, label, source, dir, tokens, prec, gpu_num, cpu_prec, cpu_num, exact, MODE_FORWARD);
}

/* The session (decode) and replay paths, on one model: exact where the GPU's products are an instruction
 * model's; native cuBLAS within 1e-5 of fp64 (a decode step is another kernel than the prompt's). */
static void check_paths(tally *t, const char *label, const char *source, const char *dir, const char *tokens) {
    check_mode(t, label, source, dir, tokens, "fp32", "native", "fp64", "fp64", false, MODE_DECODE);
    check_mode(t, label, source, dir, tokens, "bf16", "fixed", "bf16", hopper_mma, true, MODE_DECODE);
    check_mode(t, label, source, dir, tokens, "bf16", "emu:cdna3", "bf16", "emu:cdna3", true, MODE_DECODE);
    check_mode(t, label, source, dir, tokens, "bf16", "fixed", "bf16", hopper_mma, true, MODE_REPLAY);
    check_mode(t, label, source, dir, tokens, "bf16", "emu:cdna3", "bf16", "emu:cdna3", true, MODE_REPLAY_WEIGHTS);
}

/* A synthetic checkpoint under root, and the "source" string that names it in
 * the record (test_gpu makes the same one again from it). dir, tok: 4096 and
 * 4200 bytes; src: 256. */
static int synth_case(const char *root, mf_arch a, const char *size, unsigned seed, char *dir, char *tok, char *src) {
    mf_error err = {0};
    snprintf(dir, 4096, "%s/%s-%s", root, mf_arch_name(a), size);
    if (mf_synth_write(dir, a, (mf_synth_size)mf_synth_size_from_name(size), seed, &err)) {
        fprintf(stderr, "moeflip_gpu_check: %s\n", err.msg);
        return 1;
    }
    snprintf(tok, 4200, "%s/tokens.jsonl", dir);
    snprintf(src, 256, "synth:%s:%s:%u", mf_arch_name(a), size, seed);
    return 0;
}

/* Every check of the synthetic models, on one of the DeepSeek-family fixtures: the forward pass under every
 * numerics and precision the GPU runs, then the decode and replay paths. */
static void check_hf26(tally *t, const char *fixtures, const char *name) {
    char dir[4096], tok[4200], src[256];
    snprintf(dir, sizeof dir, "%s/hf26/%s", fixtures, name);
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
    snprintf(src, sizeof src, "hf26/%s", name);
    check(t, name, src, dir, tok, "fp32", "native", "fp64", "fp64", false);
    check(t, name, src, dir, tok, "bf16", "fixed", "bf16", hopper_mma, true);
    check(t, name, src, dir, tok, "fp16", "fixed", "fp16", hopper_mma_f16, true);
    check(t, name, src, dir, tok, "selective:router+head", "fixed", "selective:router+head", hopper_mma, true);
    check(t, name, src, dir, tok, "bf16", "emu:cdna3", "bf16", "emu:cdna3", true);
    check(t, name, src, dir, tok, "bf16", "emu:hopper", "bf16", "emu:hopper", true);
    check(t, name, src, dir, tok, "bf16", "emu:ampere", "bf16", "emu:ampere", true);
    check(t, name, src, dir, tok, "fp16", "emu:volta", "fp16", "emu:volta", true);
    check(t, name, src, dir, tok, "bf16", "emu:blackwell", "bf16", "emu:blackwell", true);
    check(t, name, src, dir, tok, "bf16", "emu:cdna4", "bf16", "emu:cdna4", true);
    check_paths(t, name, src, dir, tok);
}

/* A checkpoint or numerics the GPU refuses (FP8 under fp8=w8a8, the CPU's model of DeepGEMM's recipe), with one
 * line that says where it runs. */
static void check_refused(tally *t, const char *fixtures, const char *name, const char *numerics) {
    char dir[4096], tok[4200];
    snprintf(dir, sizeof dir, "%s/hf26/%s", fixtures, name);
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
    mf_error err = {0};
    outputs g;
    const int rc = run_all(&g, dir, tok, "bf16", numerics, "cuda", MODE_FORWARD, &err);
    if (!rc) free_outputs(&g);
    const bool pass = rc != 0 && strstr(err.msg, "CPU only") && !strchr(err.msg, '\n');
    json_t *rec = json_object();
    json_object_set_new(rec, "case", json_string(name));
    json_object_set_new(rec, "kind", json_string("refused on the GPU"));
    json_object_set_new(rec, "gpu_numerics", json_string(numerics));
    json_object_set_new(rec, "error", json_string(rc ? err.msg : "(ran)"));
    record_check(t, rec, pass);
}

static int write_record(tally *t, const char *out_path) {
    json_t *doc = json_object();
    json_object_set_new(doc, "checks", t->checks);
    json_object_set_new(doc, "passed", json_integer(t->passed));
    json_object_set_new(doc, "failed", json_integer(t->failed));
    char *text = json_dumps(doc, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    mf_error err = {0};
    int rc = mf_write_file_atomic(out_path, text, strlen(text), &err);
    free(text);
    json_decref(doc);
    printf("moeflip_gpu_check: %d checks passed, %d failed; record in %s\n", t->passed, t->failed, out_path);
    if (rc) fprintf(stderr, "moeflip_gpu_check: %s\n", err.msg);
    return t->failed || rc ? 1 : 0;
}

/* Is there a device at all? 0, or the exit status: EXIT_NO_GPU without one, 1 when it fails otherwise. */
static int probe_device(const char *fixtures) {
    char dir[4096], tok[4200];
    mf_error err = {0};
    outputs probe;
    snprintf(dir, sizeof dir, "%s/hf/llama", fixtures);
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
    if (run_all(&probe, dir, tok, "fp32", "native", "cuda", MODE_FORWARD, &err)) {
        fprintf(stderr, "moeflip_gpu_check: %s\n", err.msg);
        return strstr(err.msg, "no cuda GPU") ? EXIT_NO_GPU : 1;
    }
    free_outputs(&probe);
    return 0;
}

/* ---- product-level checks of the block-scaled kinds ------------------------------------------------------- */

static uint64_t lcg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* A random block-scaled matrix [E][n][k] (FP8 codes with F32 scales per bn x bk, no NaN codes; or MXFP4 with
 * UE8M0 scales 2^-7 .. 2^3) whose values are rounded to `round`; views into codes and scales (caller frees). */
typedef struct qmat {
    int E, n, k;
    uint8_t *codes, *scales;
    mf_mat w[4];
} qmat;

static void qmat_make(qmat *q, mf_wq kind, int E, int n, int k, mf_dtype round, bool interleaved, uint64_t seed) {
    q->E = E;
    q->n = n;
    q->k = k;
    if (interleaved) n *= 2;   /* gpt-oss's gate_up_proj_blocks: the views are its odd rows (the up's) */
    const int bn = kind == MF_WQ_FP8_BLOCK ? 32 : 1, bk = kind == MF_WQ_FP8_BLOCK ? 64 : 32;
    const size_t sr = (size_t)(n + bn - 1) / bn, sc = (size_t)(k + bk - 1) / bk;
    const size_t cbytes = kind == MF_WQ_FP8_BLOCK ? (size_t)n * k : (size_t)n * k / 2;
    const size_t sbytes = sr * sc * (kind == MF_WQ_FP8_BLOCK ? 4 : 1);
    q->codes = malloc((size_t)E * cbytes);
    q->scales = malloc((size_t)E * sbytes);
    for (size_t i = 0; i < (size_t)E * cbytes; i++) {
        uint8_t b = (uint8_t)lcg_next(&seed);
        if (kind == MF_WQ_FP8_BLOCK && (b & 0x7f) == 0x7f) b ^= 1;   /* no NaN codes */
        q->codes[i] = b;
    }
    for (size_t i = 0; i < (size_t)E * sr * sc; i++) {
        if (kind == MF_WQ_FP8_BLOCK) {
            const float v = ldexpf(1.0f + (float)(lcg_next(&seed) % 1024) / 1024.0f, (int)(lcg_next(&seed) % 9) - 12);
            memcpy(q->scales + 4 * i, &v, 4);
        } else {
            q->scales[i] = (uint8_t)(120 + lcg_next(&seed) % 11);
        }
    }
    for (int e = 0; e < E; e++) {
        q->w[e] = kind == MF_WQ_FP8_BLOCK
                      ? mf_mat_fp8_block(q->codes + e * cbytes, n, k, q->scales + e * sbytes, MF_F32, bn, bk, round)
                      : mf_mat_mxfp4(q->codes + e * cbytes, n, k, q->scales + e * sbytes, round);
        if (interleaved) {   /* as models/load.c views gpt-oss's up: every other row, from row 1 */
            q->w[e].n = n / 2;
            q->w[e].rs = 2 * (size_t)k;
            q->w[e].q.rs = 2 * sc;
            q->w[e].data = q->codes + e * cbytes + (size_t)k / 2;
            q->w[e].q.data = q->scales + e * sbytes + sc;
        }
    }
}

/* The same values dequantised into a plain matrix of dtype round (what the forward pass held before). */
static void *dequant(const qmat *q, mf_dtype round, mf_mat *out) {
    const size_t per = (size_t)q->n * q->k, es = mf_dtype_size(round);
    uint8_t *d = malloc((size_t)q->E * per * es);
    for (int e = 0; e < q->E; e++) {
        for (int j = 0; j < q->n; j++)
            for (int kk = 0; kk < q->k; kk++)
                mf_store_from_f64(d + e * per * es, round, (size_t)j * q->k + kk, mf_mat_get(&q->w[e], j, kk));
        out[e] = mf_mat_rows(d + e * per * es, round, q->n, q->k);
    }
    return d;
}

/* The first of n outputs [rows][N] where a and b differ: "row r, column c: gpu .. other ..", or "" */
static size_t product_diff(const double *a, const double *b, size_t n, int N, char *text, size_t cap) {
    size_t d = 0;
    text[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (!memcmp(&a[i], &b[i], sizeof(double))) continue;
        if (!d++) snprintf(text, cap, "row %zu, column %zu: gpu %.17g, reference %.17g", i / (size_t)N, i % (size_t)N,
                           a[i], b[i]);
    }
    return d;
}

/* One engine on one kind: the GPU's product of the block-scaled matrix, dense (expert 0) and grouped (three
 * experts, the middle one with no rows), bit for bit against the GPU's product of its dequantised copy (what the
 * engine gave before) and, cpu_num non-NULL, against the CPU's mf_matmul_f32 under cpu_num ("native": the fp32
 * fma chain) on the same mf_mat (not for cuBLAS, native's dense engine, which no CPU kernel models). */
static void check_product(tally *t, mf_wq kind, const char *gpu_num, mf_dtype in, mf_dtype round, const char *cpu_num,
                          bool simple_emu, bool interleaved) {
    enum { E = 3, M = 37, N = 80, K = 200 };
    const int offsets[E + 1] = {0, 13, 13, M};
    char label[200];
    snprintf(label, sizeof label, "%s %s, %s operands, weights %s%s%s", kind == MF_WQ_FP8_BLOCK ? "FP8 block" : "MXFP4",
             gpu_num, mf_dtype_name(in), mf_dtype_name(round), simple_emu ? ", MF_GPU_EMU_SIMPLE=1" : "",
             interleaved ? ", every other row (gpt-oss's up)" : "");
    qmat q;
    qmat_make(&q, kind, E, N, K, round, interleaved,
              0x5eed + (uint64_t)kind * 7 + (uint64_t)in * 131 + (uint64_t)round + interleaved);
    mf_mat plain[E];
    void *dq = dequant(&q, round, plain);
    double *a = malloc(sizeof(double) * M * K), *g = malloc(sizeof(double) * M * N), *r = malloc(sizeof(double) * M * N);
    float *af = malloc(sizeof(float) * M * K), *cf = malloc(sizeof(float) * M * N);
    uint64_t seed = 99;
    for (int i = 0; i < M * K; i++) {
        const double v = ((double)(lcg_next(&seed) % 20001) - 10000.0) / 2500.0;
        a[i] = mf_round_to(in, v);
        af[i] = (float)a[i];
    }
    mf_numerics gn, cn;
    mf_error err = {0};
    json_t *rec = json_object();
    json_object_set_new(rec, "case", json_string(label));
    json_object_set_new(rec, "source", json_string("product"));
    json_object_set_new(rec, "kind", json_string("product bit-exact"));
    json_object_set_new(rec, "gpu_numerics", json_string(gpu_num));
    json_object_set_new(rec, "cpu_numerics", json_string(cpu_num ? cpu_num : "(none)"));
    bool pass = true;
    int rc = mf_numerics_parse(&gn, gpu_num, &err) || (cpu_num && mf_numerics_parse(&cn, cpu_num, &err));
    if (simple_emu) setenv("MF_GPU_EMU_SIMPLE", "1", 1);
    for (int grouped = 0; grouped < 2 && !rc; grouped++) {
        const char *shape = grouped ? "grouped" : "dense";
        const int *off = grouped ? offsets : NULL, ne = grouped ? E : 1;
        char text[300], key[64];
        /* against the dequantised copy, on the same engine */
        if ((rc = mf_gpu_matmul("cuda", &gn, in, in, q.w, ne, a, M, off, g, &err)) ||
            (rc = mf_gpu_matmul("cuda", &gn, in, in, plain, ne, a, M, off, r, &err)))
            break;
        size_t d = product_diff(g, r, (size_t)M * N, N, text, sizeof text);
        snprintf(key, sizeof key, "%s_vs_dequantised_differ", shape);
        json_object_set_new(rec, key, json_integer((json_int_t)d));
        if (d && !json_object_get(rec, "first_diff")) {
            char full[400];
            snprintf(full, sizeof full, "%s, against the GPU's dequantised copy: %s", shape, text);
            json_object_set_new(rec, "first_diff", json_string(full));
        }
        pass &= d == 0;
        if (!cpu_num || (!grouped && gn.kind == MF_NUMERICS_NATIVE)) continue;   /* cuBLAS: no CPU model */
        /* against the CPU's kernels on the same block-scaled mf_mat, one expert's rows at a time */
        const mf_mm mm = {.compute = MF_F32, .out = in, .threads = 1,
                          .numerics = cn.kind == MF_NUMERICS_NATIVE ? NULL : &cn, .in = in};
        for (int e = 0; e < ne; e++) {
            const int r0 = grouped ? off[e] : 0, r1 = grouped ? off[e + 1] : M;
            if (r1 > r0) mf_matmul_f32(&mm, af + (size_t)r0 * K, r1 - r0, K, &q.w[e], cf + (size_t)r0 * N, N, MF_TRI_NONE);
        }
        for (int i = 0; i < M * N; i++) r[i] = cf[i];
        d = product_diff(g, r, (size_t)M * N, N, text, sizeof text);
        snprintf(key, sizeof key, "%s_vs_cpu_differ", shape);
        json_object_set_new(rec, key, json_integer((json_int_t)d));
        if (d && !json_object_get(rec, "first_diff")) {
            char full[400];
            snprintf(full, sizeof full, "%s, against the CPU's %s: %s", shape, cpu_num, text);
            json_object_set_new(rec, "first_diff", json_string(full));
        }
        pass &= d == 0;
    }
    if (simple_emu) unsetenv("MF_GPU_EMU_SIMPLE");
    if (rc) {
        json_object_set_new(rec, "error", json_string(err.msg));
        pass = false;
    }
    record_check(t, rec, pass);
    free(a);
    free(g);
    free(r);
    free(af);
    free(cf);
    free(dq);
    free(q.codes);
    free(q.scales);
}

/* Every engine that can see a block-scaled weight as B, on both kinds: cuBLAS (native dense: the widened
 * scratch; fp32 operands of fp32 and of bf16 values), the fp32 chain (native grouped), mma.sync (native grouped
 * bf16, fixed bf16 and f16), and the emulation kernels k_emu_tiled and k_emu (NVIDIA fused and AMD grouped). */
static void check_products(tally *t) {
    for (int kk = 0; kk < 2; kk++) {
        const mf_wq kind = kk ? MF_WQ_MXFP4 : MF_WQ_FP8_BLOCK;
        check_product(t, kind, "native", MF_F32, MF_F32, "native", false, false);   /* dense cuBLAS fp32; grouped chain */
        check_product(t, kind, "native", MF_F32, MF_BF16, "native", false, false);  /* fp32 operands of bf16 values */
        check_product(t, kind, "native", MF_BF16, MF_BF16, NULL, false, false);     /* cuBLAS bf16; grouped mma.sync */
        check_product(t, kind, "fixed", MF_BF16, MF_BF16, hopper_mma, false, false);
        check_product(t, kind, "fixed", MF_F16, MF_F16, hopper_mma_f16, false, false);
        check_product(t, kind, "emu:hopper", MF_BF16, MF_BF16, "emu:hopper", false, false);
        check_product(t, kind, "emu:hopper", MF_BF16, MF_BF16, "emu:hopper", true, false);
        check_product(t, kind, "emu:cdna3", MF_BF16, MF_BF16, "emu:cdna3", false, false);
        check_product(t, kind, "emu:cdna3", MF_BF16, MF_BF16, "emu:cdna3", true, false);
        check_product(t, kind, "emu:volta", MF_F16, MF_F16, "emu:volta", false, false);
        check_product(t, kind, "emu:hopper", MF_F32, MF_F32, "native", false, false);   /* the fp32 chain, dense too */
    }
    /* gpt-oss's gate and up: views of every other row of one tensor */
    check_product(t, MF_WQ_MXFP4, "fixed", MF_BF16, MF_BF16, hopper_mma, false, true);
    check_product(t, MF_WQ_MXFP4, "emu:cdna3", MF_BF16, MF_BF16, "emu:cdna3", false, true);
    check_product(t, MF_WQ_MXFP4, "native", MF_F32, MF_BF16, "native", false, true);
}

/* The block-scaled weights on the GPU: the product checks of both kinds, the FP8 fixture (codes and scales on
 * the device, widened inside the products) under every numerics, precision and path of check_hf26, and
 * fp8=w8a8's refusal. */
static void check_blockscaled(tally *t, const char *fixtures) {
    check_products(t);
    check_hf26(t, fixtures, "deepseek_v3_fp8");
    check_refused(t, fixtures, "deepseek_v3_fp8", "emu:hopper:fp8=w8a8");
}

/* validate26: the DeepSeek-family fixtures only (hf26_cases, the FP8 one among them). */
static int validate26(const char *fixtures, const char *out_path) {
    const int absent = probe_device(fixtures);
    if (absent) return absent;
    tally t = {0, 0, json_array()};
    for (size_t i = 0; i < sizeof hf26_cases / sizeof hf26_cases[0]; i++) check_hf26(&t, fixtures, hf26_cases[i]);
    check_blockscaled(&t, fixtures);
    return write_record(&t, out_path);
}

/* validate_oss: the gpt-oss fixtures only (oss_cases, as check_hf26 checks the DeepSeek family's). */
static int validate_oss(const char *fixtures, const char *out_path) {
    const int absent = probe_device(fixtures);
    if (absent) return absent;
    tally t = {0, 0, json_array()};
    for (size_t i = 0; i < sizeof oss_cases / sizeof oss_cases[0]; i++) check_hf26(&t, fixtures, oss_cases[i]);
    return write_record(&t, out_path);
}

/* validateq: the block-scaled weights only (check_blockscaled). */
static int validateq(const char *fixtures, const char *out_path) {
    const int absent = probe_device(fixtures);
    if (absent) return absent;
    tally t = {0, 0, json_array()};
    check_blockscaled(&t, fixtures);
    return write_record(&t, out_path);
}

static int validate(const char *fixtures, const char *out_path) {
    char dir[4096], tok[4200], src[256];
    const int absent = probe_device(fixtures);
    if (absent) return absent;
    tally t = {0, 0, json_array()};
    for (size_t i = 0; i < sizeof hf_cases / sizeof hf_cases[0]; i++) {
        snprintf(dir, sizeof dir, "%s/hf/%s", fixtures, hf_cases[i]);
        snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
        snprintf(src, sizeof src, "hf/%s", hf_cases[i]);
        check(&t, hf_cases[i], src, dir, tok, "fp32", "native", "fp64", "fp64", false);
        check(&t, hf_cases[i], src, dir, tok, "bf16", "fixed", "bf16", hopper_mma, true);
        check(&t, hf_cases[i], src, dir, tok, "bf16", "emu:cdna3", "bf16", "emu:cdna3", true);
        check_paths(&t, hf_cases[i], src, dir, tok);
    }
    for (size_t i = 0; i < sizeof hf26_cases / sizeof hf26_cases[0]; i++) check_hf26(&t, fixtures, hf26_cases[i]);
    check_blockscaled(&t, fixtures);
    for (size_t i = 0; i < sizeof oss_cases / sizeof oss_cases[0]; i++) check_hf26(&t, fixtures, oss_cases[i]);
    char tmpl[] = "/tmp/moeflip-gpu-XXXXXX";
    const char *root = mkdtemp(tmpl);
    for (int a = 0; root && a <= MF_ARCH_QWEN3_MOE; a++) {   /* the architectures synth writes */
        const char *name = mf_arch_name((mf_arch)a);
        if (synth_case(root, (mf_arch)a, "tiny", 7, dir, tok, src)) return 1;
        check(&t, name, src, dir, tok, "fp32", "native", "fp64", "fp64", false);
        check(&t, name, src, dir, tok, "bf16", "fixed", "bf16", hopper_mma, true);
        check(&t, name, src, dir, tok, "fp16", "fixed", "fp16", hopper_mma_f16, true);
        check(&t, name, src, dir, tok, "selective:router+head", "fixed", "selective:router+head", hopper_mma, true);
        check(&t, name, src, dir, tok, "bf16", "emu:cdna3", "bf16", "emu:cdna3", true);
        check(&t, name, src, dir, tok, "bf16", "emu:hopper", "bf16", "emu:hopper", true);
        check(&t, name, src, dir, tok, "bf16", "emu:ampere", "bf16", "emu:ampere", true);
        check(&t, name, src, dir, tok, "fp16", "emu:cdna3", "fp16", "emu:cdna3", true);
        check(&t, name, src, dir, tok, "fp16", "emu:volta", "fp16", "emu:volta", true);
        /* Blackwell's k16 fused sums (MMA-Sim's zero rule, not the H200's) and CDNA4's k16 MFMA, on the same kernels */
        check(&t, name, src, dir, tok, "bf16", "emu:blackwell", "bf16", "emu:blackwell", true);
        check(&t, name, src, dir, tok, "fp16", "emu:rtxblackwell", "fp16", "emu:rtxblackwell", true);
        check(&t, name, src, dir, tok, "bf16", "emu:cdna4", "bf16", "emu:cdna4", true);
        check_paths(&t, name, src, dir, tok);
    }
    /* 512-token prompts (tiles, launches and the router's grid at a real length) */
    static const mf_arch small_archs[] = {MF_ARCH_OLMOE, MF_ARCH_QWEN2_MOE};
    for (size_t a = 0; root && a < sizeof small_archs / sizeof small_archs[0]; a++) {
        const char *name = mf_arch_name(small_archs[a]);
        if (synth_case(root, small_archs[a], "small", 3, dir, tok, src)) return 1;
        check(&t, name, src, dir, tok, "fp32", "native", "fp64", "fp64", false);
        check(&t, name, src, dir, tok, "bf16", "fixed", "bf16", hopper_mma, true);
        check(&t, name, src, dir, tok, "bf16", "emu:cdna3", "bf16", "emu:cdna3", true);
    }
    return write_record(&t, out_path);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int bench(const char *dir, const char *prec_name, int reps, const char *nums, const char *out_path) {
    mf_error err = {0};
    mf_precision p;
    if (mf_precision_parse(&p, prec_name, &err)) goto fail;
    const double t_load = mf_now();
    mf_model *m = NULL;
    if (mf_model_load(&m, dir, p.weights, MF_LOAD_NO_CONVERT, &err)) goto fail;
    char tok[4200];
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
    mf_prompts ps;
    if (mf_prompts_load(&ps, tok, m->cfg.vocab, &err)) goto fail;
    printf("model %s: %zu parameters, loaded in %.1f s; prompt %s, %d tokens, %s\n", dir, m->n_params,
           mf_now() - t_load, ps.seq[0].id, ps.seq[0].T, prec_name);
    json_t *doc = json_object(), *rows = json_array();
    char list[1024];
    snprintf(list, sizeof list, "%s", nums);
    bool first = true;
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        /* "VAR=VALUE/NUMERICS": with that variable of the backend set (MF_GPU_GLU=0/native) */
        char *slash = strchr(name, '/'), *eq = strchr(name, '=');
        char *variant = (char *)"";
        if (slash && eq && eq < slash) {
            *slash = *eq = '\0';
            setenv(name, eq + 1, 1);
            *eq = '=';
            variant = name;
            name = slash + 1;
        }
        /* "profile:NUMERICS": the same with a wait after every step and the table of where the time goes */
        const bool profile = !strncmp(name, "profile:", 8);
        if (profile) name += 8;
        setenv("MF_GPU_PROFILE", profile ? "1" : "0", 1);
        mf_numerics n;
        if (mf_numerics_parse(&n, name, &err)) goto fail;
        mf_gpu *g = NULL;
        const double t_open = mf_now();
        if (mf_gpu_open(&g, "cuda", m, &p, &n, ps.seq[0].T, 0, &err)) goto fail;
        const double open_s = mf_now() - t_open;
        /* the first numerics also runs without copying the routing (the trace's
         * overhead), the two kinds of forward alternating so that both see the
         * same state of the card over the same seconds */
        const int kinds = first ? 2 : 1;
        double *times = mf_xmalloc((size_t)2 * reps * sizeof(double));
        for (int i = -1; i < reps; i++) {   /* i = -1: warm-up (weights converted, scratch allocated) */
            for (int k = 0; k < kinds; k++) {
                mf_seq_result r;
                const double t0 = mf_now();
                if (mf_gpu_forward(g, ps.seq[0].tokens, ps.seq[0].T, k == 0 ? MF_GPU_ROUTING : 0u, &r, &err)) goto fail;
                if (i >= 0) times[k * reps + i] = mf_now() - t0;
                mf_seq_result_free(&r);
            }
        }
        if (kinds == 2) {
            /* the overhead within each pair of neighbouring runs, then its median */
            double *over = mf_xmalloc((size_t)reps * sizeof(double));
            for (int i = 0; i < reps; i++) over[i] = times[i] / times[reps + i] - 1;
            qsort(over, (size_t)reps, sizeof(double), cmp_double);
            printf("%s%s%-28s trace overhead (routing copied vs not, pairs of neighbouring runs): median %.2f%% "
                   "(min %.2f%%, max %.2f%%)\n", variant, *variant ? " " : "", n.name, over[reps / 2] * 100,
                   over[0] * 100, over[reps - 1] * 100);
            json_t *row = json_object();
            json_object_set_new(row, "numerics", json_string(n.name));
            json_object_set_new(row, "trace_overhead_median", json_real(over[reps / 2]));
            json_object_set_new(row, "trace_overhead_min", json_real(over[0]));
            json_object_set_new(row, "trace_overhead_max", json_real(over[reps - 1]));
            json_array_append_new(rows, row);
            free(over);
        }
        for (int k = 0; k < kinds; k++) {
            const int capture = k == 0;
            double *t = times + k * reps;
            qsort(t, (size_t)reps, sizeof(double), cmp_double);
            const double med = t[reps / 2], tps = ps.seq[0].T / med;
            printf("%s%s%s%-28s capture %-8s median %.2f ms (min %.2f, max %.2f): %.0f tokens/s   (weights on the GPU in %.1f s)\n",
                   variant, *variant ? " " : "", profile ? "(profiled) " : "", n.name, capture ? "routing" : "logits", med * 1e3, t[0] * 1e3, t[reps - 1] * 1e3, tps, open_s);
            json_t *row = json_object();
            json_object_set_new(row, "numerics", json_string(n.name));
            json_object_set_new(row, "capture_routing", json_boolean(capture));
            json_object_set_new(row, "profiled", json_boolean(profile));
            if (*variant) json_object_set_new(row, "variant", json_string(variant));
            json_object_set_new(row, "median_s", json_real(med));
            json_object_set_new(row, "min_s", json_real(t[0]));
            json_object_set_new(row, "max_s", json_real(t[reps - 1]));
            json_object_set_new(row, "tokens_per_s", json_real(tps));
            json_array_append_new(rows, row);
        }
        free(times);
        first = false;
        mf_gpu_close(g);
        if (*variant) {   /* the variable held for this entry only */
            *strchr(variant, '=') = '\0';
            unsetenv(variant);
        }
    }
    json_object_set_new(doc, "model", json_string(dir));
    json_object_set_new(doc, "precision", json_string(prec_name));
    json_object_set_new(doc, "tokens", json_integer(ps.seq[0].T));
    json_object_set_new(doc, "rows", rows);
    if (out_path) {
        char *text = json_dumps(doc, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        if (mf_write_file_atomic(out_path, text, strlen(text), &err)) goto fail;
        free(text);
    }
    json_decref(doc);
    mf_prompts_free(&ps);
    mf_model_free(m);
    return 0;
fail:
    fprintf(stderr, "moeflip_gpu_check: %s\n", err.msg);
    return 1;
}

static bool have_gpu(void) {
    if (!mf_gpu_built("cuda")) {
        fprintf(stderr, "moeflip_gpu_check: this build has no CUDA backend\n");
        return false;
    }
    return true;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "synth")) {
        mf_error err = {0};
        int size = mf_synth_size_from_name(argv[2]);
        if (size < 0) {
            fprintf(stderr, "moeflip_gpu_check: unknown size %s\n", argv[2]);
            return 2;
        }
        const double t0 = mf_now();
        if (mf_synth_write(argv[4], MF_ARCH_OLMOE, (mf_synth_size)size, strtoull(argv[3], NULL, 10), &err)) {
            fprintf(stderr, "moeflip_gpu_check: %s\n", err.msg);
            return 1;
        }
        printf("wrote %s in %.1f s\n", argv[4], mf_now() - t0);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "validate")) {
        if (!have_gpu()) return EXIT_NO_GPU;
        return validate(argv[2], argv[3]);
    }
    if (argc == 4 && !strcmp(argv[1], "validateq")) {
        if (!have_gpu()) return EXIT_NO_GPU;
        return validateq(argv[2], argv[3]);
    }
    if (argc == 4 && !strcmp(argv[1], "validate26")) {
        if (!have_gpu()) return EXIT_NO_GPU;
        return validate26(argv[2], argv[3]);
    }
    if (argc == 4 && !strcmp(argv[1], "validate_oss")) {
        if (!have_gpu()) return EXIT_NO_GPU;
        return validate_oss(argv[2], argv[3]);
    }
    if ((argc == 6 || argc == 7) && !strcmp(argv[1], "bench")) {
        if (!have_gpu()) return EXIT_NO_GPU;
        return bench(argv[2], argv[3], atoi(argv[4]), argv[5], argc == 7 ? argv[6] : NULL);
    }
    fprintf(stderr, "usage: moeflip_gpu_check validate FIXTURES OUT.json\n"
                    "       moeflip_gpu_check validate26 FIXTURES OUT.json   (the DeepSeek-family fixtures only)\n"
                    "       moeflip_gpu_check validate_oss FIXTURES OUT.json (the gpt-oss fixtures only)\n"
                    "       moeflip_gpu_check validateq FIXTURES OUT.json    (the block-scaled weights only)\n"
                    "       moeflip_gpu_check bench MODEL_DIR PRECISION REPS NUMERICS[,...] [OUT.json]\n"
                    "       moeflip_gpu_check synth SIZE SEED DIR\n");
    return 2;
}
