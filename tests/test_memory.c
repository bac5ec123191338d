/* Memory at the checkpoint's scale: a CPU trace keeps the weights where the
 * checkpoint file has them, so its peak resident memory is the checkpoint's
 * bytes (+15%) plus activations, whatever the precision, and a trace that
 * cannot fit says so, with both figures, before it allocates. The model is
 * big enough (about 270 MB of bf16) that the old loader's fp32 panels (2x)
 * or fp64 panels (4x) could not pass. The peak is the child's ru_maxrss,
 * measured by the kernel. The same holds for an FP8 checkpoint (DeepSeek-V3's
 * layout, about 130 MB): its e4m3 codes and block scales are used as stored,
 * where the loader once made bf16 (2x) or fp32 (4x) copies of them, and the
 * estimate a trace checks before it loads counts them at their own size. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* OLMoE, hidden 1024, 4 layers, 8 experts of width 1024 (top-2), vocabulary
 * 8192: 135M parameters. 32 tokens route to every expert, so every weight is
 * touched. */
static const char *big_model(void) {
    static char dir[512];
    if (dir[0]) return dir;
    const char *base = temp_dir();
    char like[600];
    snprintf(like, sizeof like, "%s/like", base);
    mkdir(like, 0755);
    write_text(like, "config.json",
               "{\"model_type\": \"olmoe\", \"vocab_size\": 8192, \"hidden_size\": 1024, \"intermediate_size\": 1024,"
               " \"num_hidden_layers\": 4, \"num_attention_heads\": 8, \"num_key_value_heads\": 8,"
               " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"max_position_embeddings\": 512,"
               " \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false}");
    snprintf(dir, sizeof dir, "%s/model", base);
    char err[2048];
    cr_assert_eq(run_moeflip(err, sizeof err, "synth --like %s --seed 3 -o %s", like, dir), 0, "%s", err);
    /* one 32-token prompt */
    char line[1024] = "{\"id\": \"p\", \"tokens\": [";
    for (int t = 0; t < 32; t++) snprintf(line + strlen(line), sizeof line - strlen(line), "%s%d", t ? ", " : "", (t * 977 + 13) % 8192);
    strcat(line, "]}\n");
    write_text(dir, "p32.jsonl", line);
    return dir;
}

static long file_bytes(const char *path) {
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    return (long)st.st_size;
}

/* Runs the command in a child and returns its peak resident memory in bytes (exit status in *status). */
static long peak_rss_of(const char *cmd, int *status) {
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st;
    struct rusage ru;
    cr_assert_eq(wait4(pid, &st, 0, &ru), pid);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return ru.ru_maxrss * 1024L;
}

/* A trace of dir's checkpoint (at least min_ckpt bytes, to tell 1x from 2x) under precision: its peak RSS is the
 * checkpoint's bytes + 15% + 64 MB (+ sanitizer_slack in the sanitizer build), and at least half of them. */
static void check_rss_of(const char *dir, long min_ckpt, const char *what, const char *precision, long sanitizer_slack) {
    char path[700], cmd[2400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const long ckpt = file_bytes(path);
    cr_assert_gt(ckpt, min_ckpt, "the model must be big enough to tell 1x from 2x (%ld bytes)", ckpt);
    snprintf(cmd, sizeof cmd, "'%s' trace -q --model '%s' --input '%s/p32.jsonl' --out '%s/run-%s' --precision %s "
             "--record logits --threads 2", MF_TEST_BIN, dir, dir, temp_dir(), precision, precision);
    int status;
    const long rss = peak_rss_of(cmd, &status);
    cr_assert_eq(status, 0, "%s", cmd);
    /* activations of 32 tokens: a few MB (logits 32 x 8192 doubles = 2 MB); 64 MB leaves room for the
     * program, its libraries and a shard being written */
    long bound = ckpt + ckpt * 15 / 100 + (64L << 20);
    if (MF_TEST_SANITIZED) bound += sanitizer_slack;
    cr_assert_leq(rss, bound, "%s trace%s: peak RSS %.1f MB for a %.1f MB checkpoint (bound %.1f MB)", precision, what,
                  rss / 1e6, ckpt / 1e6, bound / 1e6);
    /* and it is the weights that are resident: more than half of them were touched */
    cr_assert_geq(rss, ckpt / 2, "%s trace%s: peak RSS %.1f MB, less than half the %.1f MB of weights", precision, what,
                  rss / 1e6, ckpt / 1e6);
}

static void check_rss(const char *precision) { check_rss_of(big_model(), 250L << 20, "", precision, 0); }

/* deepseek_v3, hidden 1024, 5 layers (the first dense), 16 experts of width 512 (top-4) and a shared one,
 * vocabulary 2048, linear weights FP8 in 128 x 128 blocks: 121 MB of e4m3 codes, 8 MB of bf16 (embedding, head,
 * routers, norms). 32 tokens choose 128 experts a layer: every weight is touched. */
static const char *big_fp8_model(void) {
    static char dir[512];
    if (dir[0]) return dir;
    const char *base = temp_dir();
    char like[600];
    snprintf(like, sizeof like, "%s/like-fp8", base);
    mkdir(like, 0755);
    write_text(like, "config.json",
               "{\"model_type\": \"deepseek_v3\", \"vocab_size\": 2048, \"hidden_size\": 1024, \"intermediate_size\": 2048,"
               " \"moe_intermediate_size\": 512, \"num_hidden_layers\": 5, \"num_attention_heads\": 8,"
               " \"num_key_value_heads\": 8, \"q_lora_rank\": 256, \"kv_lora_rank\": 256, \"qk_nope_head_dim\": 64,"
               " \"qk_rope_head_dim\": 32, \"v_head_dim\": 64, \"n_routed_experts\": 16, \"num_experts_per_tok\": 4,"
               " \"n_shared_experts\": 1, \"n_group\": 4, \"topk_group\": 2, \"first_k_dense_replace\": 1,"
               " \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false}");
    snprintf(dir, sizeof dir, "%s/model-fp8", base);
    char err[2048];
    cr_assert_eq(run_moeflip(err, sizeof err, "synth --like %s --dtype fp8 --seed 5 -o %s", like, dir), 0, "%s", err);
    char line[1024] = "{\"id\": \"p\", \"tokens\": [";
    for (int t = 0; t < 32; t++) snprintf(line + strlen(line), sizeof line - strlen(line), "%s%d", t ? ", " : "", (t * 977 + 13) % 2048);
    strcat(line, "]}\n");
    write_text(dir, "p32.jsonl", line);
    return dir;
}

/* bf16 copies of the FP8 weights alone would be 1.85x the file. The sanitizer's shadow of the heap and its
 * quarantine of freed blocks added 90-110 MB here. */
static void check_rss_fp8(const char *precision) {
    check_rss_of(big_fp8_model(), 120L << 20, " of an FP8 checkpoint", precision, 64L << 20);
}

Test(memory, fp8_bf16_trace_rss_is_the_checkpoint_plus_activations, .timeout = 300) { check_rss_fp8("bf16"); }
Test(memory, fp8_fp32_trace_rss_is_the_checkpoint_plus_activations, .timeout = 300) { check_rss_fp8("fp32"); }

/* The estimate before loading: FP8 codes and their scales are in place (the file's tensors, byte for byte),
 * nothing converted, under every policy whose weight dtype holds the bf16 tensors as stored. */
Test(memory, fp8_estimate_counts_the_weights_at_their_own_size, .timeout = 300) {
    const char *dir = big_fp8_model();
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const long ckpt = file_bytes(path);
    const mf_dtype policies[3] = {MF_BF16, MF_F32, MF_F64};
    for (int i = 0; i < 3; i++) {
        mf_model_bytes mb;
        mf_error err = {0};
        cr_assert_eq(mf_model_measure(dir, policies[i], 0, &mb, &err), MF_OK, "%s", err.msg);
        /* the routers' e_score_correction_bias, F32 [16] in a bf16 checkpoint, count as 4 x 16 bf16 copies */
        cr_assert_leq(mb.converted, 4 * 16 * 2, "%s: %llu bytes counted as converted", mf_dtype_name(policies[i]),
                      (unsigned long long)mb.converted);
        cr_assert(mb.in_place <= (uint64_t)ckpt && mb.in_place > (uint64_t)ckpt - (64u << 10),
                  "%s: %llu bytes in place of a %ld-byte file (its header is the rest)", mf_dtype_name(policies[i]),
                  (unsigned long long)mb.in_place, ckpt);
        cr_assert_eq(mb.files, (uint64_t)ckpt);
    }
    /* fp16 cannot hold bf16 values: only the bf16 tensors (embedding, head, routers, norms) become copies */
    mf_model_bytes mb;
    mf_error err = {0};
    cr_assert_eq(mf_model_measure(dir, MF_F16, 0, &mb, &err), MF_OK, "%s", err.msg);
    cr_assert(mb.converted > 0 && mb.converted < (uint64_t)ckpt / 10, "fp16: %llu bytes converted",
              (unsigned long long)mb.converted);
}

Test(memory, bf16_trace_rss_is_the_checkpoint_plus_activations, .timeout = 300) { check_rss("bf16"); }
Test(memory, fp64_trace_rss_is_the_checkpoint_plus_activations, .timeout = 300) { check_rss("fp64"); }
Test(memory, fp32_trace_rss_is_the_checkpoint_plus_activations, .timeout = 300) { check_rss("fp32"); }

/* With less address space than the mapped checkpoint needs, the trace refuses
 * before it allocates: exit 1, one line with both figures, no run left. */
Test(memory, refuses_when_the_limit_is_too_small, .timeout = 300) {
#if defined(__SANITIZE_ADDRESS__)
    /* an AddressSanitizer build maps terabytes of shadow memory at start: no address-space limit fits it */
    cr_skip_test("the address-space limit cannot be tested in an AddressSanitizer build");
#endif
    const char *dir = big_model();
    char cmd[2400], out[1200];
    snprintf(out, sizeof out, "%s/refused", temp_dir());
    snprintf(cmd, sizeof cmd, "prlimit --as=%ld '%s' trace --model '%s' --input '%s/p32.jsonl' --out '%s' "
             "--precision bf16 2>&1", 200L << 20, MF_TEST_BIN, dir, dir, out);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char msg[4096] = "";
    size_t n = fread(msg, 1, sizeof msg - 1, p);
    msg[n] = 0;
    const int status = pclose(p);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "exit %d: %s", status, msg);
    cr_assert(strstr(msg, "needs") && strstr(msg, "GiB of address space") && strstr(msg, "RLIMIT_AS"), "%s", msg);
    cr_assert(strchr(msg, '\n') == msg + strlen(msg) - 1, "one line: %s", msg);
    struct stat st;
    cr_assert_neq(stat(out, &st), 0, "no run directory is left behind");
}
