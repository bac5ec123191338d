/* moeflip diff: a reference run against target runs. */
#include "cli.h"
#include "mf_diff.h"

#include <getopt.h>
#include <jansson.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    "  --seed S           resampling seed   [20260820]\n"
    "  --floor RUN        a repeat of the reference configuration\n"
    "  -q, --quiet        no summary on stdout\n";

static char *config_key(mf_run *r) {
    json_t *m = json_loads(r->manifest_text, 0, NULL);
    char *s = NULL;
    if (asprintf(&s, "%s|%s|%s", json_string_value(json_object_get(m, "numerics")) ?: "",
                 json_string_value(json_object_get(json_object_get(m, "precision"), "name")) ?: "",
                 json_string_value(json_object_get(json_object_get(m, "device"), "kind")) ?: "") < 0)
        s = NULL;
    json_decref(m);
    return s;
}

/* The outputs of a diff are written whole or not at all: each under a temporary name first, all renamed into
 * place once every one is written, the temporaries removed when anything failed. */
typedef struct output {
    const char *path;
    char tmp[4200];
} output;

static void output_init(output *o, const char *path) {
    o->path = path;
    o->tmp[0] = 0;
    if (path) snprintf(o->tmp, sizeof o->tmp, "%s.tmp.diff.%ld", path, (long)getpid());
}

int cmd_diff(int argc, char **argv) {
    const char *out = "diff.json", *positions = NULL, *floor_path = NULL, *slots = NULL;
    long boot = 10000, seed = 20260820;
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
    mf_error err = {0};
    mf_run *ref = NULL, *floor_run = NULL;
    mf_run **targets = mf_xcalloc((size_t)nt, sizeof *targets);
    mf_diff_acc **accs = mf_xcalloc((size_t)nt, sizeof *accs);
    mf_diff_acc *floor_acc = NULL;
    int status = 1;
    output outs[3] = {{0}};
    if (mf_run_open(&ref, argv[optind], &err)) goto done;
    for (int i = 0; i < nt; i++)
        if (mf_run_open(&targets[i], argv[optind + 1 + i], &err)) goto done;
    for (int i = 0; i < nt; i++) {
        accs[i] = mf_xcalloc(1, sizeof(mf_diff_acc));
        mf_diff_acc_init(accs[i], ref);
        accs[i]->keep_slots = slots != NULL;
        if (mf_diff_acc_add_runs(accs[i], ref, targets[i], &err)) goto done;
    }
    /* the noise floor: --floor, else the first target that repeats the reference's configuration */
    if (floor_path) {
        if (mf_run_open(&floor_run, floor_path, &err)) goto done;
        floor_acc = mf_xcalloc(1, sizeof *floor_acc);
        mf_diff_acc_init(floor_acc, ref);
        if (mf_diff_acc_add_runs(floor_acc, ref, floor_run, &err)) goto done;
    } else {
        char *rk = config_key(ref);
        for (int i = 0; i < nt && !floor_acc; i++) {
            char *tk = config_key(targets[i]);
            if (rk && tk && !strcmp(rk, tk)) {
                floor_acc = accs[i];
                floor_run = targets[i];
            }
            free(tk);
        }
        free(rk);
    }
    /* the runs are the user's own: token texts come from the tokenizer.json of the reference's model directory */
    mf_diff_opts o = {(int)boot, (uint64_t)seed, true};
    if (strlen(out) >= 4000 || (positions && strlen(positions) >= 4000) || (slots && strlen(slots) >= 4000)) {
        mf_fail(&err, MF_EINVAL, "an output path is too long");
        goto done;
    }
    for (int i = 0; i < 3; i++) output_init(&outs[i], i == 0 ? out : i == 1 ? positions : slots);
    if (mf_diff_write_json(outs[0].tmp, ref, targets, accs, nt, floor_acc, floor_run, &o, &err)) goto done;
    if (positions && mf_diff_write_positions(outs[1].tmp, accs, nt, &err)) goto done;
    if (slots && mf_diff_write_slots(outs[2].tmp, accs, nt, &err)) goto done;
    for (int i = 0; i < 3; i++) {
        if (!outs[i].path) continue;
        if (rename(outs[i].tmp, outs[i].path) != 0) {
            mf_fail(&err, MF_EIO, "%s: cannot rename into place: %s", outs[i].path, strerror(errno));
            goto done;
        }
        outs[i].tmp[0] = 0;
    }
    if (!quiet) {
        mf_diff_print_summary(stdout, ref, targets, accs, nt, &o);
        printf("\nwrote %s%s%s\n", out, positions ? " and " : "", positions ? positions : "");
    }
    status = 0;
done:
    for (int i = 0; i < 3; i++)
        if (outs[i].tmp[0]) unlink(outs[i].tmp);
    if (status) cli_fail(&err);
    bool floor_owned = floor_path != NULL;
    for (int i = 0; i < nt; i++) {
        if (accs[i]) mf_diff_acc_free(accs[i]);
        free(accs[i]);
        mf_run_close(targets[i]);
    }
    if (floor_owned) {
        if (floor_acc) mf_diff_acc_free(floor_acc);
        free(floor_acc);
        mf_run_close(floor_run);
    }
    free(accs);
    free(targets);
    mf_run_close(ref);
    return status;
}
