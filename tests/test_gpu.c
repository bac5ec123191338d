/* The GPU backends.
 *
 * recorded_h200_runs_equal_the_cpu_models (and ..._sessions_and_replays_...)
 * run everywhere: for every bit-exact check that tools/gpu_check.sh ran on an H200
 * (tests/fixtures/gpu/h200-check.json: `fixed` = the card's own mma.sync,
 * and the GPU's emu:ARCH kernels), the CPU's run of the matching instruction
 * model must give outputs with the same digests as the H200 gave. The
 * expected values are the hardware's, not the CPU's.
 *
 * The other tests need a toolkit or a device, and skip without one:
 * live_checks_pass_on_this_gpu runs the whole validation on the GPU here
 * (label "gpu"); hip_code_objects_hold_mfma reads the HIP backend's AMD
 * code objects; a missing backend or device must give one clear line. */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "mf_runtime.h"
#include "mf_trace.h"
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* The CPU run of one recorded check: its checkpoint (a fixture, or the
 * synthetic model it names, made again: synth is deterministic). */
static void cpu_digests(const char *source, const char *prec_name, const char *num_name, const char *mode,
                        char out[MF_SEQ_DIGESTS][33]) {
    char dir[4096], tok[4200];
    if (!strncmp(source, "hf/", 3) || !strncmp(source, "hf26/", 5)) {
        snprintf(dir, sizeof dir, "%s", fixture(source));
    } else {
        char arch[64], size[16];
        unsigned seed;
        cr_assert_eq(sscanf(source, "synth:%63[^:]:%15[^:]:%u", arch, size, &seed), 3, "source %s", source);
        mf_error err = {0};
        snprintf(dir, sizeof dir, "%s", temp_dir());
        cr_assert_eq(mf_synth_write(dir, (mf_arch)mf_arch_from_name(arch), (mf_synth_size)mf_synth_size_from_name(size),
                                    seed, &err), 0, "%s", err.msg);
    }
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", dir);
    mf_precision p;
    mf_numerics n;
    mf_error err = {0};
    cr_assert_eq(mf_precision_parse(&p, prec_name, &err), 0, "%s", err.msg);
    cr_assert_eq(mf_numerics_parse(&n, num_name, &err), 0, "%s", err.msg);
    mf_model *m = NULL;
    cr_assert_eq(mf_runtime_load(&m, dir, &p, &err), 0, "%s", err.msg);
    mf_prompts ps;
    cr_assert_eq(mf_prompts_load(&ps, tok, m->cfg.vocab, &err), 0, "%s", err.msg);
    mf_seq_result *r = calloc(ps.n, sizeof *r);
    mf_run_opts ro = {.prec = p, .threads = 2, .numerics = &n};
    /* a replay check replays the routing of the CPU's fp64 run of the same sequences (moeflip_gpu_check's
     * source); a decode check's GPU session must be the CPU session's bits */
    const bool replay = !strcmp(mode, "replay") || !strcmp(mode, "replay-weights");
    mf_seq_result *src = calloc(ps.n, sizeof *src);
    mf_model *m64 = NULL;
    if (replay) {
        mf_precision p64;
        cr_assert_eq(mf_precision_parse(&p64, "fp64", &err), 0, "%s", err.msg);
        cr_assert_eq(mf_runtime_load(&m64, dir, &p64, &err), 0, "%s", err.msg);
        mf_run_opts r64 = {.prec = p64, .threads = 2};
        for (size_t i = 0; i < ps.n; i++)
            cr_assert_eq(mf_forward_cpu(m64, &r64, ps.seq[i].tokens, ps.seq[i].T, &src[i], &err), 0, "%s", err.msg);
    }
    for (size_t i = 0; i < ps.n; i++) {
        mf_replay rp = {ps.seq[i].T, ps.seq[i].tokens, src[i].topk_ids,
                        !strcmp(mode, "replay-weights") ? src[i].topk_w : NULL, NULL};
        ro.replay = replay ? &rp : NULL;
        if (!strcmp(mode, "decode")) {
            /* moeflip_gpu_check's session: the first half of the sequence at once, then a token at a time */
            const int T = ps.seq[i].T, P = T / 2 > 0 ? T / 2 : 1;
            mf_cpu_session *cs;
            cr_assert_eq(mf_cpu_session_open(&cs, m, &ro, T, &err), 0, "%s", err.msg);
            for (int at = 0; at < T; at += at < P ? P : 1) {
                mf_seq_result step;
                cr_assert_eq(mf_cpu_session_forward(cs, ps.seq[i].tokens + at, at < P ? P : 1, &step, &err), 0, "%s",
                             err.msg);
                if (at == 0) mf_seq_result_alloc(&r[i], &m->cfg, T, &step);
                mf_seq_result_place(&r[i], &step, at);
                mf_seq_result_free(&step);
            }
            mf_cpu_session_close(cs);
            continue;
        }
        cr_assert_eq(mf_forward_cpu(m, &ro, ps.seq[i].tokens, ps.seq[i].T, &r[i], &err), 0, "%s", err.msg);
    }
    mf_seq_results_digest(r, ps.n, out);
    for (size_t i = 0; i < ps.n; i++) {
        mf_seq_result_free(&r[i]);
        mf_seq_result_free(&src[i]);
    }
    free(r);
    free(src);
    mf_prompts_free(&ps);
    mf_model_free(m64);
    mf_model_free(m);
}

/* The recorded bit-exact checks of one group (one pass each: forward; or the session and replay paths), which
 * run as two tests so that Criterion runs them side by side. */
static void recorded_checks(const char *record, bool paths, size_t want_at_least, size_t want_sanitized) {
    json_error_t je;
    json_t *doc = json_load_file(fixture(record), 0, &je);
    cr_assert(doc, "%s: %s", record, je.text);
    size_t i, compared = 0;
#if defined(__SANITIZE_ADDRESS__)
    static char seen_keys[128][256];
    size_t n_seen = 0;
    want_at_least = want_sanitized;
#else
    (void)want_sanitized;
#endif
    json_t *c;
    json_array_foreach(json_object_get(doc, "checks"), i, c) {
        const char *kind = json_string_value(json_object_get(c, "kind"));
        const char *source = json_string_value(json_object_get(c, "source"));
        cr_assert(json_is_true(json_object_get(c, "pass")), "the H200 failed check %zu (%s)", i, source);
        /* the 512-token synthetic models are checked live on the GPU; here they would take minutes under ASan */
        if (strcmp(kind, "bit-exact") != 0 || strstr(source, ":small:")) continue;
        const char *prec = json_string_value(json_object_get(c, "cpu_precision"));
        const char *num = json_string_value(json_object_get(c, "cpu_numerics"));
        const char *mode = json_string_value(json_object_get(c, "mode"));   /* absent in older records: forward */
        if (paths == (!mode || !strcmp(mode, "forward"))) continue;
#if defined(__SANITIZE_ADDRESS__)
        /* under the sanitizers (ten times slower) one check of each instruction model, precision and path: the
         * whole record is compared by the plain build's run of this test */
        char key[256];
        snprintf(key, sizeof key, "%s|%s|%s", prec, num, mode ? mode : "forward");
        bool seen = false;
        for (size_t s = 0; s < n_seen && !seen; s++) seen = !strcmp(seen_keys[s], key);
        if (seen || n_seen == sizeof seen_keys / sizeof seen_keys[0]) continue;
        snprintf(seen_keys[n_seen++], sizeof seen_keys[0], "%s", key);
#endif
        char got[MF_SEQ_DIGESTS][33];
        cpu_digests(source, prec, num, mode ? mode : "forward", got);
        json_t *want = json_object_get(c, "gpu_digests");
        for (int k = 0; k < MF_SEQ_DIGESTS; k++)
            cr_expect_str_eq(got[k], json_string_value(json_object_get(want, MF_SEQ_DIGEST_NAMES[k])),
                             "%s %s: the CPU's %s differs from the H200's %s (%s, %s)", source, prec, num,
                             json_string_value(json_object_get(c, "gpu_numerics")), mode ? mode : "forward",
                             MF_SEQ_DIGEST_NAMES[k]);
        compared++;
    }
    cr_log_info("%zu recorded H200 runs (%s) reproduced by the CPU's instruction models", compared,
                paths ? "sessions and replays" : "one pass each");
    cr_expect_geq(compared, want_at_least, "only %zu checks compared", compared);
    json_decref(doc);
}

Test(gpu, recorded_h200_runs_equal_the_cpu_models, .timeout = 900) { recorded_checks("gpu/h200-check.json", false, 50, 10); }

/* The GPU's decode path (a session: half of each sequence, then a token at a time against the device's cache)
 * and its routing replay of the CPU's fp64 run, under fixed and emu:cdna3: the CPU's session and replay. */
Test(gpu, recorded_h200_sessions_and_replays_equal_the_cpu_models, .timeout = 900) {
    recorded_checks("gpu/h200-check.json", true, 60, 4);
}

/* The same for the DeepSeek family (tests/fixtures/hf26: latent attention, the grouped routers, shared experts):
 * the DeepSeek-family record of an H200 (tools/gpu_check_family.sh deepseek), 2026-12-02 (54 forward checks,
 * 24 sessions and replays). */
Test(gpu, recorded_h200_deepseek_family_runs_equal_the_cpu_models, .timeout = 900) {
    recorded_checks("gpu/h200-check26.json", false, 54, 4);
}

Test(gpu, recorded_h200_deepseek_family_sessions_and_replays_equal_the_cpu_models, .timeout = 900) {
    recorded_checks("gpu/h200-check26.json", true, 24, 2);
}

/* The same for gpt-oss (tests/fixtures/hf26/gpt_oss: sinks, sliding layers, YaRN, the biased top-k router, clamped
 * SwiGLU experts with biases; and its MXFP4 twin, the experts' blocks packed on the device): the gpt-oss checks of
 * an H200's `tools/gpu_check.sh` record, 2026-12-02 (9 bit-exact forward checks, 4 sessions and replays each). */
Test(gpu, recorded_h200_gpt_oss_runs_equal_the_cpu_models, .timeout = 900) {
    recorded_checks("gpu/h200-check-oss.json", false, 18, 2);
}

Test(gpu, recorded_h200_gpt_oss_sessions_and_replays_equal_the_cpu_models, .timeout = 900) {
    recorded_checks("gpu/h200-check-oss.json", true, 8, 2);
}

/* The block-scaled weights on the GPU (the FP8 fixture's codes and scales on the device, widened inside the
 * products): the block-scaled record of an H200 (tools/gpu_check_family.sh blockscaled), 2026-12-02 (9 forward
 * checks, 4 sessions and replays; its product-level and fp32 checks are the H200's own, passed there). */
Test(gpu, recorded_h200_fp8_runs_equal_the_cpu_models, .timeout = 900) {
    recorded_checks("gpu/h200-checkq.json", false, 9, 2);
}

Test(gpu, recorded_h200_fp8_sessions_and_replays_equal_the_cpu_models, .timeout = 900) {
    recorded_checks("gpu/h200-checkq.json", true, 4, 2);
}

Test(gpu, live_checks_pass_on_this_gpu, .timeout = 1800) {
#ifndef MF_GPU_CHECK_BIN
    cr_skip_test("this build has no CUDA backend");
#else
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s validate %s %s/check.json > %s/log 2>&1", MF_GPU_CHECK_BIN, MF_TEST_FIXTURES,
             temp_dir(), temp_dir());
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
    if (rc == 77) cr_skip_test("no CUDA GPU on this machine");
    cr_expect_eq(rc, 0, "moeflip_gpu_check validate failed (%d); see its log", rc);
#endif
}

Test(gpu, hip_code_objects_hold_mfma) {
#ifndef MF_HIP_CODE_OBJECTS
    cr_skip_test("this build has no HIP backend");
#else
    char list[4096];
    snprintf(list, sizeof list, "%s", MF_HIP_CODE_OBJECTS);
    int objects = 0;
    for (char *save = NULL, *co = strtok_r(list, ",", &save); co; co = strtok_r(NULL, ",", &save)) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "%s -d '%s' | grep -c v_mfma", MF_LLVM_OBJDUMP, co);
        FILE *p = popen(cmd, "r");
        cr_assert(p);
        long n = 0;
        cr_assert_eq(fscanf(p, "%ld", &n), 1, "%s printed nothing", cmd);
        pclose(p);
        cr_log_info("%s: %ld v_mfma instructions", co, n);
        cr_expect_gt(n, 0, "%s holds no MFMA instruction", co);
        objects++;
    }
    cr_expect_geq(objects, 2);
#endif
}

/* gpt_oss runs on the GPU from its bf16 checkpoint and from its MXFP4 one (the experts' blocks kept packed): on
 * a machine without a GPU each gets as far as asking for the device, none is refused for its format. */
Test(gpu, gpt_oss_checkpoints_get_as_far_as_the_device) {
    if (!mf_gpu_built("cuda")) cr_skip_test("this build has no CUDA backend");
    char err[4096];
    const char *out = temp_dir();
    const char *cases[] = {"hf26/gpt_oss_mxfp4", "hf26/gpt_oss"};
    for (int i = 0; i < 2; i++) {
        const char *dir = fixture(cases[i]);
        int rc = run_moeflip(err, sizeof err, "trace --model %s --input %s/tokens.jsonl --out %s/run%d --device cuda",
                             dir, dir, out, i);
        if (rc != 0) cr_expect(strstr(err, "no cuda GPU on this machine") != NULL, "%s: %s", cases[i], err);
    }
}

Test(gpu, without_a_backend_or_device_the_command_says_so) {
    char err[4096];
    const char *out = temp_dir();
    int rc = run_moeflip(err, sizeof err, "trace --model %s --input %s/tokens.jsonl --out %s/run --device hip:0",
                         fixture("hf/olmoe"), fixture("hf/olmoe"), out);
    cr_expect_eq(rc, 1, "exit status %d: %s", rc, err);
    /* no AMD GPU anywhere we test: the HIP runtime finds none, or the build has no HIP backend */
    const char *want = mf_gpu_built("hip") ? "no hip GPU on this machine" : "built without the HIP backend";
    cr_expect(strstr(err, want) != NULL, "message: %s", err);
    cr_expect(strchr(err, '\n') == strrchr(err, '\n'), "one line: %s", err);
    if (mf_gpu_built("cuda")) {
        /* the module loads and finds its functions in the program; then the device query answers */
        rc = run_moeflip(err, sizeof err, "trace --model %s --input %s/tokens.jsonl --out %s/run4 --device cuda:0",
                         fixture("hf/olmoe"), fixture("hf/olmoe"), out);
        cr_expect(strstr(err, "cannot load") == NULL, "the CUDA module: %s", err);
        if (rc != 0) cr_expect(strstr(err, "no cuda GPU on this machine") != NULL, "message: %s", err);
    }
    rc = run_moeflip(err, sizeof err, "trace --model %s --input %s/tokens.jsonl --out %s/run2 --device tpu",
                     fixture("hf/olmoe"), fixture("hf/olmoe"), out);
    cr_expect_eq(rc, 2, "a device that is not one is bad usage");
    cr_expect(strstr(err, "unknown device \"tpu\"") != NULL, "message: %s", err);
    rc = run_moeflip(err, sizeof err, "trace --model %s --input %s/tokens.jsonl --out %s/run3 --numerics fixed",
                     fixture("hf/olmoe"), fixture("hf/olmoe"), out);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(err, "emu:hopper:mma.m16n8k16") != NULL, "message: %s", err);
}
