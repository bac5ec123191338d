/* moeflip: entry point and subcommand table. */
#include "cli.h"
#include "mf_dist.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *summary;
} commands[] = {
    {"tokenize", cmd_tokenize, "encode texts to token ids with a Hugging Face tokenizer.json (or decode them)"},
    {"trace", cmd_trace, "run a model over prompts and record its routing (a run directory)"},
    {"inspect", cmd_inspect, "describe a run directory"},
    {"export", cmd_export, "print a run as JSON lines or CSV"},
    {"synth", cmd_synth, "write a random-weight checkpoint of an architecture"},
    {"diff", cmd_diff, "compare runs: output error, expert flips, their relation, with confidence intervals"},
    {"heatmap", cmd_heatmap, "draw where experts flip (PNG, SVG, PDF) from a diff.json"},
    {"report", cmd_report, "a self-contained HTML report of a diff.json"},
    {"sweep", cmd_sweep, "the main job: trace a reference and targets, diff, draw, report"},
    {"import", cmd_import, "read another tool's capture (CroVA) as a run"},
    {"serve", cmd_serve, "the collector service: keeps pushed runs, serves diffs, heatmaps, reports, a web UI"},
    {"push", cmd_push, "send a run to a moeflip serve"},
    {"mma", cmd_mma, "run the bit-accurate GPU matrix-instruction models on test vectors"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: moeflip <command> [options]   (moeflip <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
}

int cli_fail(const mf_error *err) {
    /* in a job of several ranks every rank has the same failure (the ranks agree on it): rank 0 says it */
    if (mf_dist_rank() > 0) return 1;
    /* every failure has its message; a path that lost it still says what kind of failure it was */
    fprintf(stderr, "moeflip: %s\n", err->msg[0] ? err->msg : mf_strerror(err->code ? err->code : MF_EIO));
    return 1;
}

int cli_stdout_error(const char *what) {
    fprintf(stderr, "moeflip: %s: writing to standard output failed: %s\n", what, strerror(errno ? errno : EIO));
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    if (mf_dist_rank() > 0) return EXIT_USAGE;   /* every rank parsed the same arguments */
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moeflip %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see moeflip %s --help)\n", cmd);
    va_end(ap);
    return EXIT_USAGE;
}

bool cli_parse_int(const char *s, long min, long max, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < min || v > max) return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("moeflip %s\n", MF_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            /* under mpirun or srun the ranks join one job; a command started alone loads no MPI at all */
            mf_error err = {0};
            if (mf_dist_init(&err)) return cli_fail(&err);
            const bool shared = !strcmp(argv[1], "trace") || !strcmp(argv[1], "diff") || !strcmp(argv[1], "sweep");
            if (mf_dist_size() > 1 && !shared) {
                const int status = cli_usage_error(argv[1], "runs as one process; trace, diff and sweep are the commands "
                                                   "that share their work over MPI ranks (this job has %d)", mf_dist_size());
                mf_dist_finalize();
                return status;
            }
            /* the other ranks' lines would repeat rank 0's: it alone logs */
            if (mf_dist_rank() > 0) mf_log_set_quiet(true);
            int status = commands[i].run(argc - 1, argv + 1);
            /* what a command printed must have reached stdout (a full disk, a closed pipe): else it failed */
            errno = 0;
            if (fflush(stdout) != 0 || ferror(stdout)) {
                if (status == 0) status = cli_stdout_error(commands[i].name);
            }
            mf_dist_finalize();
            return status;
        }
    fprintf(stderr, "moeflip: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
