/* moeflip report: a self-contained HTML report of diffs. */
#include "cli.h"
#include "mf_viz.h"

#include <getopt.h>
#include <string.h>

static const char *help =
    "usage: moeflip report DIFF.json [DIFF.json...] -o report.html\n"
    "\n"
    "One self-contained page (no network, no scripts, no external fonts): per diff a summary table of every\n"
    "metric with its 95% interval, a per-layer table per target, the four figures inline as SVG (hover a cell\n"
    "for its numbers), and the runs' metadata.\n";

int cmd_report(int argc, char **argv) {
    const char *out = "report.html";
    static const struct option opts[] = {{"output", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        if (c == 'o') out = optarg;
        else if (c == 'h') {
            fputs(help, stdout);
            return 0;
        } else return cli_usage_error("report", "unknown or incomplete option %s", argv[optind - 1]);
    }
    if (optind >= argc) return cli_usage_error("report", "give at least one diff.json");
    mf_error err = {0};
    if (mf_report_write_many((const char **)(argv + optind), argc - optind, out, &err)) return cli_fail(&err);
    return 0;
}
