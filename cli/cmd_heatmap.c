/* moeflip heatmap: figures of a diff. */
#include "cli.h"
#include "mf_viz.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *help =
    "usage: moeflip heatmap DIFF.json --kind K [--target N] [--seq ID] [-o FILE.png|.svg|.pdf]\n"
    "\n"
    "  layer-expert     per layer x expert: tokens dropped (the reference chose the expert, the target did not)\n"
    "                   and added, side by side, one colour scale\n"
    "  layer-position   one sequence (--seq; default: the one with most flips): flipped slots per layer x\n"
    "                   position, primary and inherited flips told apart, token ids along the positions\n"
    "  margin           flip probability against the reference's router margin per layer, with the fitted\n"
    "                   P = Phi(-margin / sigma)\n"
    "  flips-kl         per-position KL against the number of flipped slots\n"
    "  replay-curve     the share of the output error the flips cause, replaying the reference's routing\n"
    "                   through each layer (a diff with the target's replayed twins)\n"
    "\n"
    "  --target N       which target of the diff (1-based)   [1]\n"
    "  -o FILE          output; the extension picks PNG, SVG or PDF   [KIND.png]\n";

int cmd_heatmap(int argc, char **argv) {
    const char *kind_s = NULL, *seq = NULL, *out = NULL;
    long target = 1;
    static const struct option opts[] = {{"kind", required_argument, 0, 'k'}, {"target", required_argument, 0, 't'},
                                         {"seq", required_argument, 0, 's'}, {"output", required_argument, 0, 'o'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "k:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'k': kind_s = optarg; break;
        case 't':
            if (!cli_parse_int(optarg, 1, 1000000, &target)) return cli_usage_error("heatmap", "--target takes a number from 1");
            break;
        case 's': seq = optarg; break;
        case 'o': out = optarg; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("heatmap", "unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) return cli_usage_error("heatmap", "give exactly one diff.json");
    mf_heat_kind kind;
    if (!kind_s || mf_heat_kind_parse(kind_s, &kind))
        return cli_usage_error("heatmap", "--kind takes layer-expert, layer-position, margin, flips-kl or replay-curve");
    char def[64];
    if (!out) {
        snprintf(def, sizeof def, "%s.png", kind_s);
        out = def;
    }
    /* the extension picks the format: an unknown one is a usage error, found before any work */
    const char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    if (!dot || (slash && dot < slash) || (strcmp(dot, ".png") && strcmp(dot, ".svg") && strcmp(dot, ".pdf")))
        return cli_usage_error("heatmap", "-o %s: the extension must be .png, .svg or .pdf", out);
    mf_error err = {0};
    char *text;
    size_t len;
    if (mf_read_file(argv[optind], &text, &len, &err)) return cli_fail(&err);
    int rc = mf_heatmap_file(text, (int)target - 1, kind, seq, out, &err);
    free(text);
    return rc ? cli_fail(&err) : 0;
}
