/* moeflip import: others' captures as runs. */
#include "cli.h"
#include "mf_rundir.h"

#include <getopt.h>
#include <string.h>

static const char *help =
    "usage: moeflip import crova DIR --model CKPT -o RUN\n"
    "\n"
    "Reads a CroVA capture (DIR/logits/<case>.safetensors with logits [m, V], response [m] and, for MoE\n"
    "models, router_logits [L, m, E]) into a run directory, so moeflip can diff what CroVA and Hugging Face\n"
    "captured. CKPT is the model's checkpoint directory (its config.json gives k and the routing rule; its\n"
    "weights, if present, identify the model). CroVA does not record which experts ran: they are derived from\n"
    "the router logits (canonical top-k of the raw scores) and the manifest records them as derived.\n";

int cmd_import(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(help, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "crova")) return cli_usage_error("import", "unknown source \"%s\" (crova)", argv[1]);
    const char *model = NULL, *out = NULL;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"output", required_argument, 0, 'o'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc - 1, argv + 1, "m:o:h", opts, NULL)) != -1) {
        if (c == 'm') model = optarg;
        else if (c == 'o') out = optarg;
        else if (c == 'h') {
            fputs(help, stdout);
            return 0;
        } else return cli_usage_error("import", "unknown or incomplete option");
    }
    if (optind != argc - 2 || !model || !out) return cli_usage_error("import", "give DIR, --model CKPT and -o RUN");
    mf_error err = {0};
    if (mf_import_crova(argv[optind + 1], model, out, &err)) return cli_fail(&err);
    return 0;
}
