/* moeflip trace: run a checkpoint over a prompt file, write a run directory. */
#include "cli.h"
#include "mf_trace.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *help =
    "usage: moeflip trace --model DIR --input FILE.jsonl --out RUN [options]\n"
    "\n"
    "Runs a Hugging Face checkpoint over every sequence of FILE.jsonl ({\"id\", \"tokens\"} per line) and\n"
    "writes a run directory: manifest.json + part-NNNNN.safetensors with, per sequence and MoE layer,\n"
    "the experts dispatched, the weights applied, the raw router logits, and the logits.\n"
    "\n"
    "  --model DIR          checkpoint directory (config.json + *.safetensors)\n"
    "  --input FILE         prompts, JSON lines\n"
    "  --out RUN            run directory to create\n"
    "  --precision P        fp64 (reference) | fp32 | bf16 | fp16   [bf16]\n"
    "  --numerics P         native | fp64 | fixed (GPU) | emu:ARCH[:INSTR][:acc=N][:split=N][:reduce=seq|tree]\n"
    "                       ARCH: volta ampere hopper blackwell rtxblackwell cdna2 cdna3 cdna4\n"
    "                       [native; fp64 with --precision fp64]\n"
    "  --device D           cpu | cuda[:N] | hip[:N]   [cpu]\n"
    "  --threads N          CPU threads   [all cores]\n"
    "  --record LEVEL       routing | topk | logits | full   [logits if vocab <= 32768, else topk]\n"
    "  --generate N         continue every prompt greedily by up to N tokens with a key-value cache,\n"
    "                       stopping at generation_config.json's eos_token_id (CPU)\n"
    "  --replay RUN         routing replay: dispatch, at every MoE layer and position, the experts RUN\n"
    "                       dispatched (a complete run of this model on the same tokens; with --generate, the\n"
    "                       same prompts); the router still runs and its logits are recorded (CPU)\n"
    "  --replay-layers L    replay only these MoE layers: model layer indices, N or N-M, comma-separated\n"
    "  --replay-weights     apply RUN's recorded gate weights too   [this router's weights of RUN's experts]\n"
    "  --resume             continue an interrupted run in RUN\n"
    "  --shard-seqs N       write a shard every N sequences   [by size and time]\n"
    "  -q, --quiet          no progress output\n"
    "\n"
    "Under mpirun or srun the ranks share the sequences and write one run; --device cuda (or hip) without\n"
    "an index gives each rank of a node one of its GPUs in turn (docs/mpi.md).\n";

int cmd_trace(int argc, char **argv) {
    const char *model_dir = NULL, *input = NULL, *out = NULL, *prec_name = "bf16", *device = "cpu", *record_s = NULL,
               *numerics_s = NULL, *replay = NULL, *replay_layers = NULL;
    bool replay_weights = false;
    long threads = 0, shard_seqs = 0, generate = 0;
    bool resume = false;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},  {"input", required_argument, 0, 'i'},
        {"out", required_argument, 0, 'o'},    {"precision", required_argument, 0, 'p'},
        {"device", required_argument, 0, 'd'}, {"threads", required_argument, 0, 't'},
        {"record", required_argument, 0, 'r'}, {"resume", no_argument, 0, 'R'},
        {"shard-seqs", required_argument, 0, 'S'}, {"quiet", no_argument, 0, 'q'},
        {"numerics", required_argument, 0, 'n'}, {"generate", required_argument, 0, 'g'},
        {"replay", required_argument, 0, 'P'}, {"replay-layers", required_argument, 0, 'L'},
        {"replay-weights", no_argument, 0, 'W'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:i:o:p:d:t:r:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'i': input = optarg; break;
        case 'o': out = optarg; break;
        case 'p': prec_name = optarg; break;
        case 'd': device = optarg; break;
        case 'n': numerics_s = optarg; break;
        case 't':
            if (!cli_parse_int(optarg, 1, 4096, &threads)) return cli_usage_error("trace", "--threads takes a positive integer");
            break;
        case 'r': record_s = optarg; break;
        case 'g':
            if (!cli_parse_int(optarg, 1, MF_MAX_NEW_TOKENS, &generate))
                return cli_usage_error("trace", "--generate takes a number of tokens from 1 to %d", MF_MAX_NEW_TOKENS);
            break;
        case 'R': resume = true; break;
        case 'P': replay = optarg; break;
        case 'L': replay_layers = optarg; break;
        case 'W': replay_weights = true; break;
        case 'S':
            if (!cli_parse_int(optarg, 1, 1 << 20, &shard_seqs)) return cli_usage_error("trace", "--shard-seqs takes a positive integer");
            break;
        case 'q': mf_log_set_quiet(true); break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("trace", "unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("trace", "unexpected argument %s", argv[optind]);
    if (!model_dir || !input || !out) return cli_usage_error("trace", "--model, --input and --out are required");
    mf_trace_opts o = {.model_dir = model_dir, .input = input, .out = out, .precision = prec_name,
                       .numerics = numerics_s, .record = record_s, .threads = (int)threads, .resume = resume,
                       .shard_seqs = (int)shard_seqs, .label = "trace", .device = device, .generate = (int)generate,
                       .replay = replay, .replay_layers = replay_layers, .replay_weights = replay_weights};
    mf_error err = {0};
    mf_precision prec;
    mf_numerics num;
    if (mf_trace_check(&o, &prec, &num, &err)) return cli_usage_error("trace", "%s", err.msg);
    if (record_s) {
        mf_record rec;
        if (mf_record_parse(record_s, &rec)) return cli_usage_error("trace", "--record takes routing, topk, logits or full");
    }
    return mf_trace(&o, &err) ? cli_fail(&err) : 0;
}
