/* moeflip export: a run as JSON lines or CSV, on stdout or into a file. */
#include "cli.h"
#include "mf_rundir.h"

#include <getopt.h>
#include <string.h>

static const char *help =
    "usage: moeflip export RUN --format jsonl|csv [-o FILE]\n"
    "\n"
    "jsonl: one object per (sequence, position):\n"
    "  {\"seq\", \"pos\", \"token\", \"logits\": [V], \"layers\": [{\"layer\", \"experts\": [k], \"weights\": [k],\n"
    "   \"router_logits\": [E], \"shared_gate\"?}]}\n"
    "csv: one row per (sequence, position, MoE layer): seq,pos,token,layer,experts,weights,router_logits,shared_gate\n"
    "     with lists joined by ';' (no logits).\n"
    "Numbers round-trip: 17 significant digits for F64 tensors, 9 for the others.\n";

int cmd_export(int argc, char **argv) {
    const char *format = NULL, *out_path = NULL;
    static const struct option opts[] = {{"format", required_argument, 0, 'f'}, {"output", required_argument, 0, 'o'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "f:o:h", opts, NULL)) != -1) {
        if (c == 'f') format = optarg;
        else if (c == 'o') out_path = optarg;
        else if (c == 'h') {
            fputs(help, stdout);
            return 0;
        } else return cli_usage_error("export", "unknown or incomplete option %s", argv[optind - 1]);
    }
    if (optind != argc - 1) return cli_usage_error("export", "give exactly one run directory");
    mf_export_format fmt;
    if (!format) return cli_usage_error("export", "--format is required (jsonl or csv)");
    if (!strcmp(format, "jsonl")) fmt = MF_EXPORT_JSONL;
    else if (!strcmp(format, "csv")) fmt = MF_EXPORT_CSV;
    else return cli_usage_error("export", "--format takes jsonl or csv");
    mf_error err = {0};
    mf_run *r;
    if (mf_run_open(&r, argv[optind], &err)) return cli_fail(&err);
    int status = 0;
    if (out_path) {
        /* into a temporary, renamed when complete: no half-written export */
        mf_atomic_file af;
        if (mf_atomic_open(&af, out_path, &err)) status = 1;
        else if (mf_run_export(r, fmt, af.fp, &err)) {
            mf_atomic_abort(&af);
            status = 1;
        } else if (mf_atomic_commit(&af, &err)) status = 1;
    } else if (mf_run_export(r, fmt, stdout, &err) && !ferror(stdout)) {
        status = 1;
    } else if (fflush(stdout) != 0 || ferror(stdout)) {
        mf_run_close(r);
        return cli_stdout_error("export");
    }
    mf_run_close(r);
    return status ? cli_fail(&err) : 0;
}
