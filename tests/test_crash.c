/* Crash safety of `moeflip trace` (issue: "a trace killed with SIGKILL at any
 * moment leaves a run that `inspect` opens and that `trace --resume`
 * completes to exactly the export of an uninterrupted run").
 *
 * Each test makes a tiny synthetic model and a prompt file, traces it once
 * without interruption (the reference), then kills traces with SIGKILL at
 * points spread over the reference's duration and checks what they leave. */
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* 40 sequences of 224 tokens: about 0.5 s for one uninterrupted trace with
 * one thread (48 tokens took under 0.2 s, too short to aim kills at). The
 * kill points scale with the measured time, so a faster build still kills
 * mid-run. */
#define N_SEQS 40
#define SEQ_LEN 224
#define VOCAB 384

typedef struct ctx {
    const char *dir;     /* the test's temp dir */
    char model[4096];
    char prompts[4096];
    char ref_run[4096];
    char ref_export[4096];
    double ref_seconds;  /* wall time of the uninterrupted reference trace */
} ctx;

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Starts `moeflip trace` on run directory `run`: stdout to /dev/null, stderr
 * to err_path (or /dev/null). Returns the child's pid. */
static pid_t spawn_trace(const ctx *c, const char *run, int shard_seqs, bool resume, const char *err_path) {
    char ss[32];
    snprintf(ss, sizeof ss, "%d", shard_seqs);
    char *argv[] = {(char *)MF_TEST_BIN, "trace",  "--model",   (char *)c->model, "--input", (char *)c->prompts,
                    "--out",             (char *)run, "--precision", "bf16",      "--threads", "1",
                    "--shard-seqs",      ss,      "-q",          resume ? "--resume" : NULL, NULL};
    posix_spawn_file_actions_t fa;
    cr_assert_eq(posix_spawn_file_actions_init(&fa), 0);
    cr_assert_eq(posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0), 0);
    cr_assert_eq(posix_spawn_file_actions_addopen(&fa, 2, err_path ? err_path : "/dev/null",
                                                  O_WRONLY | O_CREAT | O_TRUNC, 0644), 0);
    pid_t pid;
    int rc = posix_spawn(&pid, MF_TEST_BIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(rc, 0, "posix_spawn %s: %s", MF_TEST_BIN, strerror(rc));
    return pid;
}

static int wait_status(pid_t pid) {
    int st;
    pid_t got;
    while ((got = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {}
    cr_assert_eq(got, pid, "waitpid: %s", strerror(errno));
    return st;
}

/* Starts a trace, lets it run delay_ms, kills it with SIGKILL and reaps it. */
static void trace_and_kill(const ctx *c, const char *run, int shard_seqs, bool resume, double delay_ms) {
    pid_t pid = spawn_trace(c, run, shard_seqs, resume, NULL);
    sleep_ms(delay_ms);
    /* a child that already finished is a zombie until reaped: kill still succeeds */
    cr_assert_eq(kill(pid, SIGKILL), 0, "kill: %s", strerror(errno));
    wait_status(pid);
}

static void assert_same_file(const char *a, const char *b) {
    size_t la, lb;
    char *da = slurp(a, &la), *db = slurp(b, &lb);
    cr_assert_eq(la, lb, "%s has %zu bytes, %s has %zu", a, la, b, lb);
    size_t i = 0;
    while (i < la && da[i] == db[i]) i++;
    cr_assert_eq(i, la, "%s and %s differ first at byte %zu", a, b, i);
    free(da);
    free(db);
}

/* The manifest of a finished run: complete, every input sequence exactly once. */
static void assert_manifest_complete(const char *run) {
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", run);
    json_error_t jerr;
    json_t *man = json_load_file(path, 0, &jerr);
    cr_assert(man, "%s: %s", path, jerr.text);
    cr_assert(json_is_true(json_object_get(man, "complete")), "%s: not complete", path);
    json_t *seqs = json_object_get(man, "sequences");
    cr_assert(json_is_array(seqs), "%s: no sequences array", path);
    cr_assert_eq(json_array_size(seqs), (size_t)N_SEQS, "%s: %zu sequences", path, json_array_size(seqs));
    bool seen[N_SEQS] = {0};
    size_t i;
    json_t *s;
    json_array_foreach(seqs, i, s) {
        const char *id = json_string_value(json_object_get(s, "id"));
        cr_assert(id, "%s: sequence %zu has no id", path, i);
        int k = -1, used = 0;
        cr_assert(sscanf(id, "q%2d%n", &k, &used) == 1 && used == 3 && id[3] == 0 && k >= 0 && k < N_SEQS,
                  "%s: unexpected sequence id %s", path, id);
        cr_assert(!seen[k], "%s: sequence %s recorded twice", path, id);
        seen[k] = true;
        cr_assert_eq(json_integer_value(json_object_get(s, "length")), SEQ_LEN, "%s: %s has the wrong length", path, id);
    }
    json_decref(man);
    /* and nothing a killed writer left behind */
    cr_assert_eq(dir_entries_named(run, ".tmp."), 0, "%s: a leftover temporary", run);
}

static void export_run(const char *run, const char *out) {
    char err[4096];
    int st = run_moeflip(err, sizeof err, "export '%s' --format jsonl -o '%s'", run, out);
    cr_assert_eq(st, 0, "export %s exited %d: %s", run, st, err);
}

/* A run a kill left, if any, must open. */
static bool check_killed_run(const char *run, const char *what) {
    if (!exists(run)) return false;   /* killed before the run directory appeared */
    char err[4096];
    int st = run_moeflip(err, sizeof err, "inspect '%s' >/dev/null", run);
    cr_assert_eq(st, 0, "%s: inspect of the killed run exited %d: %s", what, st, err);
    return true;
}

/* Resumes to the end; the run must then be complete and export exactly as the reference. */
static void resume_and_compare(const ctx *c, const char *run, int shard_seqs, const char *what) {
    char err_path[4200], exp_path[4200];
    snprintf(err_path, sizeof err_path, "%s.resume.err", run);
    snprintf(exp_path, sizeof exp_path, "%s.jsonl", run);
    int st = wait_status(spawn_trace(c, run, shard_seqs, true, err_path));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        size_t n;
        char *msg = slurp(err_path, &n);
        cr_assert_fail("%s: trace --resume ended with status 0x%x: %s", what, st, msg);
    }
    char err[4096];
    st = run_moeflip(err, sizeof err, "inspect '%s' >/dev/null", run);
    cr_assert_eq(st, 0, "%s: inspect after resume exited %d: %s", what, st, err);
    assert_manifest_complete(run);
    export_run(run, exp_path);
    assert_same_file(c->ref_export, exp_path);
    unlink(exp_path);
}

static void write_prompts(const char *path) {
    FILE *fp = fopen(path, "w");
    cr_assert(fp, "cannot write %s", path);
    for (int s = 0; s < N_SEQS; s++) {
        fprintf(fp, "{\"id\": \"q%02d\", \"tokens\": [", s);
        for (int p = 0; p < SEQ_LEN; p++) fprintf(fp, p ? ",%d" : "%d", (s * 131 + p * 37 + (p * p) % 17) % VOCAB);
        fputs("]}\n", fp);
    }
    cr_assert_eq(fclose(fp), 0);
}

static void setup(ctx *c) {
    memset(c, 0, sizeof *c);
    c->dir = temp_dir();
    snprintf(c->model, sizeof c->model, "%s/M", c->dir);
    snprintf(c->prompts, sizeof c->prompts, "%s/prompts.jsonl", c->dir);
    snprintf(c->ref_run, sizeof c->ref_run, "%s/ref", c->dir);
    snprintf(c->ref_export, sizeof c->ref_export, "%s/REF.jsonl", c->dir);
    char err[4096];
    int st = run_moeflip(err, sizeof err, "synth --arch qwen2_moe --size tiny --seed 7 -o '%s'", c->model);
    cr_assert_eq(st, 0, "synth exited %d: %s", st, err);
    write_prompts(c->prompts);
    char err_path[4200];
    snprintf(err_path, sizeof err_path, "%s/ref.err", c->dir);
    double t0 = mf_now();
    st = wait_status(spawn_trace(c, c->ref_run, 3, false, err_path));
    c->ref_seconds = mf_now() - t0;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reference trace ended with status 0x%x", st);
    assert_manifest_complete(c->ref_run);
    export_run(c->ref_run, c->ref_export);
    cr_log_info("reference trace: %d sequences x %d tokens in %.3f s", N_SEQS, SEQ_LEN, c->ref_seconds);
}

/* Kills at 12 points from "before anything" to near the end, alternating
 * one and three sequences per shard; every leftover opens, and resuming it
 * gives exactly the reference export. */
Test(crash, kill_anywhere_then_resume, .timeout = 300) {
    ctx c;
    setup(&c);
    const double ref_ms = 1000.0 * c.ref_seconds;
    const double delays[] = {0,
                             1,
                             5,
                             20,
                             0.08 * ref_ms,
                             0.17 * ref_ms,
                             0.28 * ref_ms,
                             0.39 * ref_ms,
                             0.51 * ref_ms,
                             0.63 * ref_ms,
                             0.77 * ref_ms,
                             0.92 * ref_ms};
    const int n = (int)(sizeof delays / sizeof delays[0]);
    int partial = 0, absent = 0;
    for (int i = 0; i < n; i++) {
        const int shard_seqs = i % 2 ? 3 : 1;
        char run[4200], what[128];
        snprintf(run, sizeof run, "%s/kill%02d", c.dir, i);
        snprintf(what, sizeof what, "kill %d at %.1f ms (--shard-seqs %d)", i, delays[i], shard_seqs);
        trace_and_kill(&c, run, shard_seqs, false, delays[i]);
        bool there = check_killed_run(run, what);
        if (!there) absent++;
        else {
            char path[4400];
            snprintf(path, sizeof path, "%s/manifest.json", run);
            json_t *man = json_load_file(path, 0, NULL);
            cr_assert(man, "%s: manifest unreadable", what);
            size_t done = json_array_size(json_object_get(man, "sequences"));
            if (!json_is_true(json_object_get(man, "complete")) && done > 0) partial++;
            cr_log_info("%s: run left with %zu of %d sequences%s", what, done, N_SEQS,
                        json_is_true(json_object_get(man, "complete")) ? " (complete)" : "");
            json_decref(man);
        }
        if (!there) cr_log_info("%s: no run directory yet", what);
        resume_and_compare(&c, run, shard_seqs, what);
    }
    /* the kills must have hit the middle of a run, or nothing was tested */
    cr_assert_geq(partial, 3, "only %d of %d kills left a partial run (%d left none)", partial, n, absent);
}

/* Kill, resume-and-kill again and again, then let the last resume finish. */
Test(crash, kill_resume_repeatedly, .timeout = 300) {
    ctx c;
    setup(&c);
    const double ref_ms = 1000.0 * c.ref_seconds;
    char run[4200];
    snprintf(run, sizeof run, "%s/again", c.dir);
    /* the first kill early; each resume is killed after a quarter of a run or so,
     * so that every attempt gets past loading and adds a little */
    const double delays[] = {5, 0.22 * ref_ms, 0.3 * ref_ms, 0.25 * ref_ms, 0.35 * ref_ms, 0.28 * ref_ms};
    const int n = (int)(sizeof delays / sizeof delays[0]);
    size_t prev_done = 0;
    for (int i = 0; i < n; i++) {
        const int shard_seqs = 1 + i % 3;   /* 1, 2, 3: resume may change how shards are cut */
        char what[128];
        snprintf(what, sizeof what, "attempt %d killed at %.1f ms", i, delays[i]);
        trace_and_kill(&c, run, shard_seqs, i > 0, delays[i]);
        if (check_killed_run(run, what)) {
            char path[4400];
            snprintf(path, sizeof path, "%s/manifest.json", run);
            json_t *man = json_load_file(path, 0, NULL);
            cr_assert(man, "%s: manifest unreadable", what);
            size_t done = json_array_size(json_object_get(man, "sequences"));
            cr_assert_geq(done, prev_done, "%s: the run lost sequences (%zu, had %zu)", what, done, prev_done);
            cr_log_info("%s: run holds %zu of %d sequences", what, done, N_SEQS);
            prev_done = done;
            json_decref(man);
        } else {
            cr_assert_eq(prev_done, 0, "%s: the run directory vanished", what);
        }
    }
    resume_and_compare(&c, run, 2, "final resume");
}

/* A trace killed while it built the run directory leaves "<RUN>.tmp.<pid>"
 * beside RUN. Pids repeat (a restarted container gives its command the same
 * one): a later trace that gets that pid must still create the run and
 * complete it. The child's pid is known before it execs, so the leftover is
 * laid down for exactly that pid. */
Test(crash, leftover_of_killed_writer_with_same_pid, .timeout = 120) {
    ctx c;
    setup(&c);
    char run[4200];
    snprintf(run, sizeof run, "%s/samepid", c.dir);
    int go[2];
    cr_assert_eq(pipe(go), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        char b;
        close(go[1]);
        if (read(go[0], &b, 1) != 1) _exit(97);
        int nul = open("/dev/null", O_WRONLY);
        if (nul < 0 || dup2(nul, 1) < 0 || dup2(nul, 2) < 0) _exit(98);
        char *argv[] = {(char *)MF_TEST_BIN, "trace",  "--model",   c.model,     "--input", c.prompts, "--out",
                        run,                 "--precision", "bf16", "--threads", "1",       "--shard-seqs", "3",
                        "-q",                "--resume", NULL};
        execv(MF_TEST_BIN, argv);
        _exit(99);
    }
    close(go[0]);
    /* what a writer with this pid killed inside run-directory creation leaves */
    char tmp[4300], f[4500];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", run, (long)pid);
    cr_assert_eq(mkdir(tmp, 0777), 0, "mkdir %s: %s", tmp, strerror(errno));
    snprintf(f, sizeof f, "%s/manifest.json.tmp.%ld", tmp, (long)pid);
    FILE *fp = fopen(f, "w");
    cr_assert(fp);
    fputs("{\"format\": \"moeflip-r", fp);   /* cut off mid-write */
    cr_assert_eq(fclose(fp), 0);
    cr_assert_eq(write(go[1], "x", 1), 1);
    close(go[1]);
    int st = wait_status(pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "trace over the leftover of a same-pid writer ended with status 0x%x",
              st);
    cr_assert(!exists(tmp), "%s is still there", tmp);
    char err[4096];
    st = run_moeflip(err, sizeof err, "inspect '%s' >/dev/null", run);
    cr_assert_eq(st, 0, "inspect exited %d: %s", st, err);
    assert_manifest_complete(run);
    char exp_path[4300];
    snprintf(exp_path, sizeof exp_path, "%s.jsonl", run);
    export_run(run, exp_path);
    assert_same_file(c.ref_export, exp_path);
}

/* A flipped byte in a shard: inspect refuses the run and names the shard. */
Test(crash, damaged_shard_is_named, .timeout = 120) {
    ctx c;
    setup(&c);
    char shard[4200];
    snprintf(shard, sizeof shard, "%s/part-00000.safetensors", c.ref_run);
    FILE *fp = fopen(shard, "r+b");
    cr_assert(fp, "cannot open %s: %s", shard, strerror(errno));
    cr_assert_eq(fseek(fp, 0, SEEK_END), 0);
    long size = ftell(fp);
    cr_assert_gt(size, 1024, "%s: only %ld bytes", shard, size);
    cr_assert_eq(fseek(fp, size / 2, SEEK_SET), 0);
    int b = fgetc(fp);
    cr_assert_neq(b, EOF);
    cr_assert_eq(fseek(fp, size / 2, SEEK_SET), 0);
    cr_assert_neq(fputc(b ^ 0x5a, fp), EOF);
    cr_assert_eq(fclose(fp), 0);

    char err[4096];
    int st = run_moeflip(err, sizeof err, "inspect '%s'", c.ref_run);
    cr_assert_eq(st, 1, "inspect of a damaged run exited %d: %s", st, err);
    size_t len = strlen(err);
    cr_assert_gt(len, 0, "no message");
    cr_assert_eq(err[len - 1], '\n', "message not ended by a newline: %s", err);
    cr_assert_eq(strchr(err, '\n'), err + len - 1, "more than one line: %s", err);
    cr_assert(strstr(err, "part-00000.safetensors"), "message does not name the shard: %s", err);
    /* resuming the damaged run is refused as well */
    st = run_moeflip(err, sizeof err, "trace --model '%s' --input '%s' --out '%s' --precision bf16 --threads 1 "
                     "--shard-seqs 3 -q --resume", c.model, c.prompts, c.ref_run);
    cr_assert_eq(st, 1, "trace --resume of a damaged run exited %d: %s", st, err);
    cr_assert(strstr(err, "part-00000.safetensors"), "message does not name the shard: %s", err);
}
