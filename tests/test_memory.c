/* Memory at the checkpoint's scale: a CPU trace keeps the weights where the
 * checkpoint file has them, so its peak resident memory is the checkpoint's
 * bytes (+15%) plus activations, whatever the precision, and a trace that
 * cannot fit says so, with both figures, before it allocates. The model is
 * big enough (about 270 MB of bf16) that the old loader's fp32 panels (2x)
 * or fp64 panels (4x) could not pass. The peak is the child's ru_maxrss,
 * measured by the kernel. */
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

static void check_rss(const char *precision) {
    const char *dir = big_model();
    char path[700], cmd[2400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const long ckpt = file_bytes(path);
    cr_assert_gt(ckpt, 250L << 20, "the model must be big enough to tell 1x from 2x (%ld bytes)", ckpt);
    snprintf(cmd, sizeof cmd, "'%s' trace -q --model '%s' --input '%s/p32.jsonl' --out '%s/run-%s' --precision %s "
             "--record logits --threads 2", MF_TEST_BIN, dir, dir, temp_dir(), precision, precision);
    int status;
    const long rss = peak_rss_of(cmd, &status);
    cr_assert_eq(status, 0, "%s", cmd);
    /* activations of 32 tokens: a few MB (logits 32 x 8192 doubles = 2 MB); 64 MB leaves room for the
     * program, its libraries and a shard being written */
    const long bound = ckpt + ckpt * 15 / 100 + (64L << 20);
    cr_assert_leq(rss, bound, "%s trace: peak RSS %.1f MB for a %.1f MB checkpoint (bound %.1f MB)", precision,
                  rss / 1e6, ckpt / 1e6, bound / 1e6);
    /* and it is the weights that are resident: more than half of them were touched */
    cr_assert_geq(rss, ckpt / 2, "%s trace: peak RSS %.1f MB, less than half the %.1f MB of weights", precision,
                  rss / 1e6, ckpt / 1e6);
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
