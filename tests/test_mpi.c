/* moeflip under MPI (issue 22): `mpirun -n N moeflip trace|diff|sweep` against the same command as one process,
 * on the embedded default model.
 *
 * What one process writes is the reference: a trace's export, a diff's diff.json and CSVs, a sweep's diff.json
 * must come out byte for byte the same from 2 (and 3) ranks, a job killed mid-run must leave a run that
 * --resume completes to the same export (with the same rank count, and as one process), and a command run
 * alone must not load libmpi. The pure pieces (which GPU a rank takes, which rank traces which sequence, the
 * ranks' blocks) are checked against values worked out by hand. The mpirun tests skip when mpirun is absent or
 * this build has no MPI module. */
#include "testutil.h"
#include "mf_dist.h"
#include "mf_runtime.h"
#include "mf_trace.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MODEL MF_TEST_DEFAULT_MODEL

/* ---- the pure pieces ------------------------------------------------------------------------------------------ */

Test(mpi, device_for_rank) {
    char dev[64];
    mf_error err = {0};
    /* "cuda" without an index: rank r of a node takes GPU r mod count */
    const char *want4[] = {"cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"};
    for (int r = 0; r < 6; r++) {
        cr_assert_eq(mf_device_for_rank("cuda", r, 4, dev, sizeof dev, &err), MF_OK, "%s", err.msg);
        cr_assert_str_eq(dev, want4[r]);
    }
    cr_assert_eq(mf_device_for_rank("hip", 3, 2, dev, sizeof dev, &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(dev, "hip:1");
    cr_assert_eq(mf_device_for_rank("cuda", 5, 1, dev, sizeof dev, &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(dev, "cuda:0");
    /* a GPU named with its index, and the CPU, are every rank's own */
    cr_assert_eq(mf_device_for_rank("cuda:2", 1, 4, dev, sizeof dev, &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(dev, "cuda:2");
    cr_assert_eq(mf_device_for_rank("cpu", 7, 0, dev, sizeof dev, &err), MF_OK, "%s", err.msg);
    cr_assert_str_eq(dev, "cpu");
    /* no GPU to give, a malformed device */
    cr_assert_neq(mf_device_for_rank("cuda", 0, 0, dev, sizeof dev, &err), MF_OK);
    cr_assert(strstr(err.msg, "no GPU"), "%s", err.msg);
    cr_assert_neq(mf_device_for_rank("tpu", 0, 4, dev, sizeof dev, &err), MF_OK);
    cr_assert(strstr(err.msg, "tpu"), "%s", err.msg);
}

static mf_prompt prompt_of(const char *id, int T) {
    return (mf_prompt){.id = (char *)id, .T = T, .answer = -1};
}

Test(mpi, assignment) {
    /* costs 10, 8, 6, 4, 3 over 2 ranks, the most costly first to the rank with less work: 10 -> 0, 8 -> 1,
     * 6 -> 1 (8 < 10), 4 -> 0 (10 < 14), 3 -> 0 (14 = 14: the lower rank) */
    mf_prompt seq[5] = {prompt_of("a", 10), prompt_of("b", 8), prompt_of("c", 6), prompt_of("d", 4), prompt_of("e", 3)};
    mf_prompts p = {.seq = seq, .n = 5};
    int owner[5];
    mf_trace_assign(&p, NULL, 0, 2, owner);
    const int want[5] = {0, 1, 1, 0, 0};
    for (int i = 0; i < 5; i++) cr_assert_eq(owner[i], want[i], "sequence %d: rank %d, want %d", i, owner[i], want[i]);
    /* what a resumed run holds goes to nobody; with generation each costs its new tokens too: 10+5, 6+5, 3+5
     * -> 0, 1, 1 */
    const bool done[5] = {false, true, false, true, false};
    mf_trace_assign(&p, done, 5, 2, owner);
    const int want_resumed[5] = {0, -1, 1, -1, 1};
    for (int i = 0; i < 5; i++) cr_assert_eq(owner[i], want_resumed[i], "resumed %d: rank %d", i, owner[i]);
    /* one rank: everything */
    mf_trace_assign(&p, NULL, 0, 1, owner);
    for (int i = 0; i < 5; i++) cr_assert_eq(owner[i], 0);
}

Test(mpi, blocks) {
    /* 10 draws over 3 ranks: 4, 3, 3 */
    const size_t want_first[3] = {0, 4, 7}, want_len[3] = {4, 3, 3};
    for (int r = 0; r < 3; r++) {
        size_t first, len;
        mf_dist_block(10, r, 3, &first, &len);
        cr_assert(first == want_first[r] && len == want_len[r], "rank %d: [%zu, +%zu)", r, first, len);
    }
    size_t first, len;
    mf_dist_block(2, 2, 3, &first, &len);   /* fewer draws than ranks: the last has none */
    cr_assert(first == 2 && len == 0, "[%zu, +%zu)", first, len);
}

/* ---- running mpirun -------------------------------------------------------------------------------------------- */

static bool have_mpirun(void) {
#ifndef MF_TEST_MPI_BUILD
    return false;
#else
    const char *path = getenv("PATH");
    char dir[4096], exe[4200];
    while (path && *path) {
        const char *colon = strchr(path, ':');
        const size_t n = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(dir, sizeof dir, "%.*s", (int)n, path);
        snprintf(exe, sizeof exe, "%s/mpirun", dir);
        if (access(exe, X_OK) == 0) return true;
        path = colon ? colon + 1 : NULL;
    }
    return false;
#endif
}

/* Skips unless mpirun and this build's MPI module are there; sets what OpenMPI needs to run here (as root, two
 * ranks or three on a machine of two cores, in a container that may forbid reading another process's memory). */
static void need_mpirun(void) {
    if (!have_mpirun())
#ifdef MF_TEST_MPI_BUILD
        cr_skip_test("mpirun not found (apt-get install openmpi-bin): the MPI tests are skipped");
#else
        cr_skip_test("this moeflip was built without MPI (libopenmpi-dev not found when it was configured)");
#endif
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
}

/* Runs a shell command line (printf-style), its stderr into err when given; returns its exit status. */
static int sh(char *err, size_t cap, const char *fmt, ...) {
    char line[16384], cmd[20000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char ef[4200] = "/dev/null";
    if (err) snprintf(ef, sizeof ef, "%s/stderr.txt", temp_dir());
    snprintf(cmd, sizeof cmd, "%s 2>%s", line, ef);
    const int st = system(cmd);
    if (err) {
        FILE *fp = fopen(ef, "r");
        const size_t n = fp ? fread(err, 1, cap - 1, fp) : 0;
        err[n] = 0;
        if (fp) fclose(fp);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* LeakSanitizer (a sanitizer build) matches OpenMPI's leaks by the libraries on their stacks (tests/lsan.supp),
 * which the fast unwinder does not reach through OpenMPI's code */
#define LSAN_MPI "LSAN_OPTIONS=\"$LSAN_OPTIONS:fast_unwind_on_malloc=0\""
#define MPIRUN "env " LSAN_MPI " mpirun --oversubscribe -n"

static void assert_same_file(const char *a, const char *b) {
    size_t la, lb;
    char *da = slurp(a, &la), *db = slurp(b, &lb);
    cr_assert(da && db, "%s or %s is missing", a, b);
    cr_assert(la > 0, "%s is empty", a);
    size_t i = 0;
    while (i < la && i < lb && da[i] == db[i]) i++;
    cr_assert(i == la && la == lb, "%s (%zu bytes) and %s (%zu bytes) differ first at byte %zu", a, la, b, lb, i);
    free(da);
    free(db);
}

/* A prompt file of the test's own: 6 prompts of 12 to 47 token ids below 256 (byte-level tokens of any vocabulary)
 * and 4 multiple-choice items, so that generation and choices are traced, diffed and bootstrapped too. */
static const char *write_input(const char *dir) {
    static char path[4200];
    snprintf(path, sizeof path, "%s/input.jsonl", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    unsigned x = 7;
    for (int i = 0; i < 10; i++) {
        fprintf(f, "{\"id\": \"%c%02d\", \"tokens\": [", i < 6 ? 'p' : 'q', i);
        const int T = 12 + 7 * (i % 6);
        for (int t = 0; t < T; t++) {
            x = x * 1103515245u + 12345u;
            fprintf(f, "%s%u", t ? ", " : "", 32 + (x >> 16) % 200);
        }
        fprintf(f, "]");
        if (i >= 6) fprintf(f, ", \"choices\": [[%d, %d], [%d], [%d, %d, %d]], \"answer\": %d", 40 + i, 41, 77, 90, 91, i, i % 3);
        fprintf(f, "}\n");
    }
    fclose(f);
    return path;
}

/* One process runs one thread (two would spin against each other and the machine's other work); a rank takes the
 * core its launcher bound it to. */
static void trace(const char *launch, const char *input, const char *out, const char *opts) {
    char err[4096];
    const int rc = sh(err, sizeof err, "%s %s trace -q --model %s --input %s --out %s %s%s", launch, MF_TEST_BIN, MODEL, input,
                      out, opts, launch[0] ? "" : " --threads 1");
    cr_assert_eq(rc, 0, "%s trace %s: exit %d: %s", launch, out, rc, err);
}

static void export_run(const char *run, const char *out) {
    char err[4096];
    const int rc = run_moeflip(err, sizeof err, "export %s --format jsonl -o %s", run, out);
    cr_assert_eq(rc, 0, "export %s: %s", run, err);
}

/* ---- trace ---------------------------------------------------------------------------------------------------- */

Test(mpi, trace_export_equals_one_process) {
    need_mpirun();
    const char *d = temp_dir(), *input = write_input(d);
    char one[4200], two[4200], e1[4200], e2[4200];
    snprintf(one, sizeof one, "%s/one", d);
    snprintf(two, sizeof two, "%s/two", d);
    snprintf(e1, sizeof e1, "%s/one.jsonl", d);
    snprintf(e2, sizeof e2, "%s/two.jsonl", d);
    trace("", input, one, "--precision bf16 --generate 4");
    trace(MPIRUN " 2", input, two, "--precision bf16 --generate 4 --shard-seqs 1");
    export_run(one, e1);
    export_run(two, e2);
    assert_same_file(e1, e2);
    /* one manifest names every shard of both ranks, its sequences in the input's order */
    char path[4300];
    snprintf(path, sizeof path, "%s/manifest.json", two);
    json_error_t jerr;
    json_t *man = json_load_file(path, 0, &jerr);
    cr_assert(man, "%s: %s", path, jerr.text);
    cr_assert(json_is_true(json_object_get(man, "complete")));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(man, "device"), "ranks")), 2);
    json_t *seqs = json_object_get(man, "sequences"), *shards = json_object_get(man, "shards");
    cr_assert_eq(json_array_size(seqs), 10);
    static const char *const ids[10] = {"p00", "p01", "p02", "p03", "p04", "p05", "q06", "q07", "q08", "q09"};
    for (size_t i = 0; i < 10; i++)
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(seqs, i), "id")), ids[i]);
    /* one sequence a shard: rank 0 numbered its shards 0, 2, 4, ..., rank 1 1, 3, 5, ...: both wrote */
    int even = 0, odd = 0, last = -1;
    size_t i;
    json_t *s;
    json_array_foreach(shards, i, s) {
        const int k = atoi(json_string_value(json_object_get(s, "file")) + 5);
        cr_assert_gt(k, last, "shards out of order");
        last = k;
        if (k % 2) odd++;
        else even++;
    }
    cr_assert(even > 0 && odd > 0 && even + odd == 10, "%d shards of rank 0, %d of rank 1", even, odd);
    json_decref(man);
    /* nothing else in the run: no temporaries, no shard the manifest does not name */
    cr_assert_eq(dir_entries(two), 11);
}

/* ---- diff ----------------------------------------------------------------------------------------------------- */

Test(mpi, diff_equals_one_process) {
    need_mpirun();
    const char *d = temp_dir(), *input = write_input(d);
    char ref[4200], tgt[4200], twin[4200], rep[4200], opts[4400];
    snprintf(ref, sizeof ref, "%s/ref", d);
    snprintf(tgt, sizeof tgt, "%s/tgt", d);
    snprintf(twin, sizeof twin, "%s/twin", d);
    snprintf(rep, sizeof rep, "%s/rep", d);
    trace("", input, ref, "--precision fp64 --generate 4");
    trace("", input, tgt, "--precision bf16 --generate 4");
    snprintf(opts, sizeof opts, "--precision bf16 --generate 4 --replay %s", ref);
    trace("", input, twin, opts);
    trace("", input, rep, "--precision fp64 --generate 4");   /* a repeat of the reference: the noise floor */
    static const char *const launch[3] = {"", MPIRUN " 2", MPIRUN " 3"};
    for (int k = 0; k < 3; k++) {
        char err[8192];
        const int rc = sh(err, sizeof err, "cd %s && %s %s diff ref tgt twin rep -o d%d.json --positions p%d.csv --slots s%d.csv "
                          "--bootstrap 2000 -q", d, launch[k], MF_TEST_BIN, k, k, k);
        cr_assert_eq(rc, 0, "%s diff: exit %d: %s", launch[k], rc, err);
    }
    /* what the CIs rest on is there: intervals, the twin's attribution, responses and answers, the floor */
    char path[4300];
    snprintf(path, sizeof path, "%s/d0.json", d);
    json_t *dj = json_load_file(path, 0, NULL);
    cr_assert(dj);
    json_t *t0 = json_array_get(json_object_get(dj, "targets"), 0);
    cr_assert(json_is_number(json_array_get(json_object_get(json_object_get(json_object_get(t0, "metrics"), "forward_kl"), "ci95"), 0)));
    cr_assert(json_object_get(dj, "attribution") && json_object_get(dj, "floor"));
    cr_assert(json_object_get(t0, "responses") && json_object_get(t0, "answers"));
    json_decref(dj);
    for (int k = 1; k < 3; k++) {
        const char *kind[3] = {"d%d.json", "p%d.csv", "s%d.csv"};
        for (int f = 0; f < 3; f++) {
            char a[4300], b[4300], na[32], nb[32];
            snprintf(na, sizeof na, kind[f], 0);
            snprintf(nb, sizeof nb, kind[f], k);
            snprintf(a, sizeof a, "%s/%s", d, na);
            snprintf(b, sizeof b, "%s/%s", d, nb);
            assert_same_file(a, b);
        }
    }
}

Test(mpi, sweep_equals_one_process) {
    need_mpirun();
    const char *d = temp_dir(), *input = write_input(d);
    char err[8192];
    for (int k = 0; k < 2; k++) {
        /* the same relative --out from two directories: diff.json names the runs by the paths given */
        const int rc = sh(err, sizeof err, "mkdir -p %s/w%d && cd %s/w%d && %s %s sweep -q --model %s --input %s --out out "
                          "--targets native@bf16,native@fp32 --repeat --bootstrap 500 --threads 1", d, k, d, k,
                          k ? MPIRUN " 2" : "", MF_TEST_BIN, MODEL, input);
        cr_assert_eq(rc, 0, "sweep %d: exit %d: %s", k, rc, err);
    }
    char a[4300], b[4300];
    snprintf(a, sizeof a, "%s/w0/out/diff.json", d);
    snprintf(b, sizeof b, "%s/w1/out/diff.json", d);
    assert_same_file(a, b);
    snprintf(b, sizeof b, "%s/w1/out/report.html", d);
    struct stat st;
    cr_assert(stat(b, &st) == 0 && st.st_size > 0, "%s: rank 0 wrote no report", b);
}

/* ---- an interrupted job, resumed ------------------------------------------------------------------------------ */

static pid_t spawn_mpi_trace(const char *input, const char *out, int ranks) {
    char n[16];
    snprintf(n, sizeof n, "%d", ranks);
    char lsan[4200];
    snprintf(lsan, sizeof lsan, "LSAN_OPTIONS=%s:fast_unwind_on_malloc=0", getenv("LSAN_OPTIONS") ? getenv("LSAN_OPTIONS") : "");
    char *argv[] = {"env", lsan, "mpirun", "--oversubscribe", "-n", n, (char *)MF_TEST_BIN, "trace", "-q", "--model", (char *)MODEL,
                    "--input", (char *)input, "--out", (char *)out, "--precision", "fp64", "--record", "routing",
                    "--shard-seqs", "1", NULL};
    posix_spawn_file_actions_t fa;
    cr_assert_eq(posix_spawn_file_actions_init(&fa), 0);
    cr_assert_eq(posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0), 0);
    cr_assert_eq(posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0), 0);
    pid_t pid;
    const int rc = posix_spawnp(&pid, "env", &fa, NULL, argv, environ);   /* env execs mpirun: the same pid */
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(rc, 0, "posix_spawnp env mpirun: %s", strerror(rc));
    return pid;
}

/* The sequences manifest.json lists now (0 while there is none). */
static size_t listed(const char *run) {
    char path[4300];
    snprintf(path, sizeof path, "%s/manifest.json", run);
    json_t *m = json_load_file(path, 0, NULL);
    const size_t n = json_array_size(json_object_get(m, "sequences"));
    json_decref(m);
    return n;
}

/* The child of mpirun that is rank `rank` (by the environment mpirun gave it), or -1. */
static pid_t rank_pid(pid_t mpirun, int rank) {
    char want[64], path[300];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    DIR *proc = opendir("/proc");
    cr_assert(proc);
    pid_t found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(proc))) {
        char *end;
        const long p = strtol(e->d_name, &end, 10);
        if (*end || p <= 0) continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", p);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int pid = 0, ppid = 0;
        char comm[256], state;
        const bool child = fscanf(f, "%d %255s %c %d", &pid, comm, &state, &ppid) == 4 && ppid == mpirun;
        fclose(f);
        if (!child) continue;
        snprintf(path, sizeof path, "/proc/%ld/environ", p);
        /* /proc files have no size to read up to: read what there is (nothing if the process is gone) */
        static char env[1 << 16];
        f = fopen(path, "r");
        const size_t n = f ? fread(env, 1, sizeof env - 1, f) : 0;
        if (f) fclose(f);
        env[n] = 0;
        for (size_t i = 0; i < n && found < 0; i += strlen(env + i) + 1)
            if (!strcmp(env + i, want)) found = (pid_t)p;
    }
    closedir(proc);
    return found;
}

/* Starts a 2-rank trace, kills rank 1 with SIGKILL once the manifest lists 3 sequences (the job then ends: mpirun
 * kills the others), and checks that what is left is a valid run that lacks sequences. */
static void trace_and_kill_rank(const char *input, const char *run, size_t n_seqs) {
    const pid_t mp = spawn_mpi_trace(input, run, 2);
    const double t0 = mf_now();
    while (listed(run) < 3 && mf_now() - t0 < 60) sleep_ms(2);
    pid_t victim = -1;
    while (victim < 0 && mf_now() - t0 < 60) victim = rank_pid(mp, 1);
    cr_assert_gt(victim, 0, "rank 1 of mpirun %d not found", (int)mp);
    cr_assert_eq(kill(victim, SIGKILL), 0, "kill %d: %s", (int)victim, strerror(errno));
    int st;
    while (waitpid(mp, &st, 0) < 0 && errno == EINTR) {}
    cr_assert(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "mpirun succeeded with rank 1 killed");
    const size_t left = listed(run);
    cr_assert(left >= 3 && left < n_seqs, "the killed job left %zu of %zu sequences (it was meant to stop mid-run)", left, n_seqs);
    char err[4096];
    cr_assert_eq(run_moeflip(err, sizeof err, "inspect %s", run), 0, "the killed job's run does not open: %s", err);
}

Test(mpi, resume_after_a_killed_rank) {
    need_mpirun();
    const char *d = temp_dir();
    /* the model's 32 passages, 4,948 tokens: a few seconds on 2 ranks, time to kill one mid-run; routing only (the
     * export of every logit would take longer than the traces; trace_export_equals_one_process has them) */
    char input[4200], full[4200], ef[4200];
    snprintf(input, sizeof input, "%s/prompts.jsonl", MODEL);
    snprintf(full, sizeof full, "%s/full", d);
    snprintf(ef, sizeof ef, "%s/full.jsonl", d);
    trace("", input, full, "--precision fp64 --record routing");
    export_run(full, ef);
    const size_t n = listed(full);
    cr_assert_gt(n, 8);
    static const char *const resume[2] = {MPIRUN " 2", ""};   /* the same rank count, and one process */
    for (int k = 0; k < 2; k++) {
        char run[4200], ek[4200];
        snprintf(run, sizeof run, "%s/killed%d", d, k);
        snprintf(ek, sizeof ek, "%s/killed%d.jsonl", d, k);
        trace_and_kill_rank(input, run, n);
        trace(resume[k], input, run, "--precision fp64 --record routing --shard-seqs 1 --resume");
        export_run(run, ek);
        assert_same_file(ef, ek);
        cr_assert_eq(listed(run), n);
        cr_assert_eq(dir_entries(run), 1 + (int)n, "the resumed run holds strays");
    }
}

/* ---- what runs alone ------------------------------------------------------------------------------------------ */

Test(mpi, alone_loads_no_mpi) {
    const char *d = temp_dir(), *input = write_input(d);
    char err[1 << 16];
    /* the dynamic loader names every library it loads: none is libmpi, started alone or as a job of one */
    static const char *const env[2] = {"", "OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=0 PMIX_RANK=0"};
    for (int k = 0; k < 2; k++) {
        const int rc = sh(err, sizeof err, "env %s LD_DEBUG=libs %s trace -q --model %s --input %s --out %s/r%d --record routing --threads 1",
                          env[k], MF_TEST_BIN, MODEL, input, d, k);
        cr_assert_eq(rc, 0, "exit %d: %.2000s", rc, err);
        cr_assert(strstr(err, "libjansson"), "LD_DEBUG said nothing of the libraries loaded: %.500s", err);
        cr_assert(!strstr(err, "libmpi"), "a trace run alone loaded libmpi");
    }
}

Test(mpi, one_process_commands_refused_in_a_job) {
    need_mpirun();
    const char *d = temp_dir(), *input = write_input(d);
    char run[4200], err[8192];
    snprintf(run, sizeof run, "%s/r", d);
    trace("", input, run, "--record routing");
    const int rc = sh(err, sizeof err, MPIRUN " 2 %s inspect %s", MF_TEST_BIN, run);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
    const char *line = strstr(err, "moeflip inspect: runs as one process");
    cr_assert(line, "%s", err);
    cr_assert(!strstr(line + 1, "moeflip inspect: runs as one process"), "more than one rank said it: %s", err);
}

#ifndef MF_TEST_MPI_BUILD
/* A build without MPI, started as one rank of several, refuses: each rank would trace everything into one run. */
Test(mpi, no_mpi_build_refuses_a_job) {
    const char *d = temp_dir(), *input = write_input(d);
    char err[4096];
    const int rc = sh(err, sizeof err, "env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 %s trace -q --model %s --input %s "
                      "--out %s/r", MF_TEST_BIN, MODEL, input, d);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "built without MPI") && strchr(err, '\n') == err + strlen(err) - 1, "%s", err);
    cr_assert(run_moeflip(err, sizeof err, "trace -q --model %s --input %s --out %s/alone", MODEL, input, d) == 0, "%s", err);
}
#endif
