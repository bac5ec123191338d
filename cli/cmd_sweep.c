/* moeflip sweep: the main job. */
#include "cli.h"
#include "mf_job.h"

#include <getopt.h>
#include <string.h>

static const char *help =
    "usage: moeflip sweep [--model DIR --input FILE] [--out DIR] [--reference CFG] [--targets CFG,CFG...] [--repeat]\n"
    "                     [--generate N] [--replay] [--threads N] [--bootstrap N]\n"
    "\n"
    "Traces a reference and targets of one model on one prompt file, diffs every target against the reference\n"
    "and the NVIDIA and AMD targets against each other at the same precision, draws every figure and writes\n"
    "OUT/report.html. A configuration is NUMERICS@PRECISION (fp64 alone for the reference).\n"
    "\n"
    "  --model DIR, --input FILE   [the embedded default checkpoint and its texts: open prompts and\n"
    "                               multiple-choice items]; lines of token ids or texts, with choices or not\n"
    "  --generate N                continue every prompt greedily by up to N tokens in every configuration and\n"
    "                               compare the responses [16 on the default texts, else 0]\n"
    "  --out DIR                   [moeflip-out]\n"
    "  --reference CFG             [fp64]\n"
    "  --targets LIST              [emu:hopper@bf16,emu:cdna3@bf16,emu:cdna3@fp32,emu:cdna3@selective:router,\n"
    "                               plus a repeat of the first, the noise floor]\n"
    "  --repeat                    add the repeat with your own --targets too\n"
    "  --replay                    add each target's replayed twins (trace --replay of the reference: in every\n"
    "                              MoE layer, and through each layer for the curve) and report how much of its\n"
    "                              output error the expert flips cause (one more trace per target and MoE layer)\n"
    "  --bootstrap N               [2000]\n"
    "\n"
    "Under mpirun or srun every trace and diff is shared by the ranks; rank 0 draws and writes the report.\n";

int cmd_sweep(int argc, char **argv) {
    mf_sweep_opts o = {.bootstrap = 2000, .generate = -1};
    long v;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},     {"input", required_argument, 0, 'i'},
        {"out", required_argument, 0, 'o'},       {"reference", required_argument, 0, 'r'},
        {"targets", required_argument, 0, 't'},   {"repeat", no_argument, 0, 'R'},
        {"threads", required_argument, 0, 'j'},   {"bootstrap", required_argument, 0, 'b'},
        {"generate", required_argument, 0, 'g'},  {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},            {"replay", no_argument, 0, 'P'},
        {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:i:o:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o.model_dir = optarg; break;
        case 'i': o.input = optarg; break;
        case 'o': o.out_dir = optarg; break;
        case 'r': o.reference = optarg; break;
        case 't': o.targets = optarg; break;
        case 'R': o.repeat = true; break;
        case 'P': o.replay = true; break;
        case 'j':
            if (!cli_parse_int(optarg, 1, 4096, &v)) return cli_usage_error("sweep", "--threads takes a positive integer");
            o.threads = (int)v;
            break;
        case 'b':
            if (!cli_parse_int(optarg, 0, 10000000, &v)) return cli_usage_error("sweep", "--bootstrap takes a count");
            o.bootstrap = (int)v;
            break;
        case 'g':
            if (!cli_parse_int(optarg, 0, 65536, &v)) return cli_usage_error("sweep", "--generate takes a token count, 0 to 65536");
            o.generate = (int)v;
            break;
        case 'q': mf_log_set_quiet(true); break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("sweep", "unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("sweep", "unexpected argument %s", argv[optind]);
    mf_error err = {0};
    return mf_sweep(&o, &err) ? cli_fail(&err) : 0;
}
