/* moeflip diff: a reference run against target runs. */
#include "cli.h"
#include "mf_diff.h"
#include "mf_dist.h"

#include <getopt.h>

#define TEXT_OF(x) #x
#define NUMBER_TEXT(x) TEXT_OF(x)   /* a macro's value as a string literal */

static const char *help =
    "usage: moeflip diff REF TARGET [TARGET...] [-o diff.json] [--positions FILE.csv] [--slots FILE.csv]\n"
    "                    [--bootstrap N] [--seed S] [--floor RUN]\n"
    "\n"
    "Compares runs of the same model on the same tokens. Metrics (CroVA's definitions, pooled as ratios of sums\n"
    "over all positions of all sequences): raw_logit_mse, prob_mse, forward_kl (KL(P_ref || P_target), nats per\n"
    "position), top1_pct, ord5_pct, set5_pct, equal_bits_pct, router_set_equal_pct, router_ord_equal_pct,\n"
    "router_positions_all_layers_equal_pct, router_logit_mse; and flips: per layer, per expert, primary vs\n"
    "inherited, margins and the router noise scale sigma per layer, error conditional on flipped slots.\n"
    "Every metric has a 95% bootstrap interval (whole sequences resampled); targets after the first are also\n"
    "compared with the first, paired. A target with the reference's numerics, precision and device (a repeat),\n"
    "or --floor RUN, is the noise floor: other targets report their excess over it.\n"
    "\n"
    "  -o FILE            diff.json   [diff.json]\n"
    "  --positions FILE   one CSV row per (target, sequence, position)\n"
    "  --slots FILE       one CSV row per (target, sequence, layer, position): set/order equal, overlap,\n"
    "                     dropped and added experts, the reference's margin (logit and probability units),\n"
    "                     tie, gate-weight and shared-gate squared error\n"
    "  --bootstrap N      resamples   [10000; 0: no intervals]\n"
    "  --seed S           resampling seed   [" NUMBER_TEXT(MF_DIFF_SEED) "]\n"
    "  --floor RUN        a repeat of the reference configuration\n"
    "  -q, --quiet        no summary on stdout\n"
    "\n"
    "Under mpirun or srun the ranks share the sequences and the bootstrap's resamples; rank 0 writes the same\n"
    "files as one process (docs/mpi.md).\n";

int cmd_diff(int argc, char **argv) {
    const char *out = "diff.json", *positions = NULL, *floor_path = NULL, *slots = NULL;
    long boot = 10000, seed = MF_DIFF_SEED;
    bool quiet = false;
    static const struct option opts[] = {{"output", required_argument, 0, 'o'}, {"positions", required_argument, 0, 'P'},
                                         {"slots", required_argument, 0, 'L'},
                                         {"bootstrap", required_argument, 0, 'b'}, {"seed", required_argument, 0, 's'},
                                         {"floor", required_argument, 0, 'f'}, {"quiet", no_argument, 0, 'q'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'P': positions = optarg; break;
        case 'L': slots = optarg; break;
        case 'b':
            if (!cli_parse_int(optarg, 0, 10000000, &boot)) return cli_usage_error("diff", "--bootstrap takes a count");
            break;
        case 's':
            if (!cli_parse_int(optarg, 0, 0x7fffffffffffffffL, &seed)) return cli_usage_error("diff", "--seed takes an integer");
            break;
        case 'f': floor_path = optarg; break;
        case 'q': quiet = true; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("diff", "unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    const int nt = argc - optind - 1;
    if (nt < 1) return cli_usage_error("diff", "give a reference run and at least one target run");
    /* the runs are the user's own: token texts come from the tokenizer.json of the reference's model directory */
    mf_diff_request q = {
        .reference = argv[optind],
        .targets = (const char *const *)(argv + optind + 1),
        .n_targets = nt,
        .floor = floor_path ? MF_DIFF_FLOOR_RUN : MF_DIFF_FLOOR_REPEAT,
        .floor_run = floor_path,
        .bootstrap = (int)boot,
        .seed = (uint64_t)seed,
        .model_tokenizer = true,
        .json_path = out,
        .positions_path = positions,
        .slots_path = slots,
        .summary = quiet ? NULL : stdout,
    };
    mf_error err = {0};
    if (mf_diff_runs(&q, &err)) return cli_fail(&err);
    if (!quiet && mf_dist_rank() == 0)   /* the ranks of a job wrote one diff: rank 0 says so */
        printf("\nwrote %s%s%s\n", out, positions ? " and " : "", positions ? positions : "");
    return 0;
}
