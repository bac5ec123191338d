/* moeflip trace: run a checkpoint over a prompt file, write a run directory. */
#include "cli.h"
#include "mf_trace.h"

#include <getopt.h>
#include <omp.h>
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
    "  --numerics P         native | fp64 | emu:ARCH[:INSTR][:acc=N][:split=N][:reduce=seq|tree]\n"
    "                       ARCH: volta ampere hopper cdna2 cdna3   [native; fp64 with --precision fp64]\n"
    "  --device D           cpu   [cpu]\n"
    "  --threads N          CPU threads   [all cores]\n"
    "  --record LEVEL       routing | topk | logits | full   [logits if vocab <= 32768, else topk]\n"
    "  --resume             continue an interrupted run in RUN\n"
    "  --shard-seqs N       write a shard every N sequences   [by size and time]\n"
    "  -q, --quiet          no progress output\n";

int cmd_trace(int argc, char **argv) {
    const char *model_dir = NULL, *input = NULL, *out = NULL, *prec_name = "bf16", *device = "cpu", *record_s = NULL,
               *numerics_s = NULL;
    long threads = sysconf(_SC_NPROCESSORS_ONLN), shard_seqs = 0;
    bool resume = false;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},  {"input", required_argument, 0, 'i'},
        {"out", required_argument, 0, 'o'},    {"precision", required_argument, 0, 'p'},
        {"device", required_argument, 0, 'd'}, {"threads", required_argument, 0, 't'},
        {"record", required_argument, 0, 'r'}, {"resume", no_argument, 0, 'R'},
        {"shard-seqs", required_argument, 0, 'S'}, {"quiet", no_argument, 0, 'q'},
        {"numerics", required_argument, 0, 'n'},
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
        case 'R': resume = true; break;
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
    if (strcmp(device, "cpu") != 0)
        return cli_usage_error("trace", "device \"%s\" is not available in this build (cpu)", device);
    mf_error err = {0};
    mf_precision prec;
    if (mf_precision_parse(&prec, prec_name, &err)) return cli_usage_error("trace", "%s", err.msg);
    mf_numerics numerics;
    if (!numerics_s) numerics_s = prec.act == MF_F64 ? "fp64" : "native";
    if (mf_numerics_parse(&numerics, numerics_s, &err)) return cli_usage_error("trace", "%s", err.msg);
    if ((prec.act == MF_F64) != (numerics.kind == MF_NUMERICS_FP64))
        return cli_usage_error("trace", "--precision fp64 and --numerics fp64 go together (every product in double)");
    if (numerics.kind == MF_NUMERICS_EMU && (prec.act == MF_BF16 || prec.act == MF_F16) &&
        !mf_numerics_schedule(&numerics, prec.act))
        return cli_usage_error("trace", "%s has no %s matrix instruction", numerics.arch, mf_dtype_name(prec.act));
    omp_set_num_threads((int)threads);

    /* config, then the prompts (validated whole), then the weights */
    char cfg_path[4096];
    mf_config cfg;
    if (!mf_path_join(cfg_path, sizeof cfg_path, model_dir, "config.json")) return cli_usage_error("trace", "path too long");
    if (!mf_is_dir(model_dir)) {
        mf_fail(&err, MF_EIO, "%s: not a checkpoint directory", model_dir);
        return cli_fail(&err);
    }
    if (mf_config_load(&cfg, cfg_path, &err)) return cli_fail(&err);
    mf_record record = mf_record_default(cfg.vocab);
    if (record_s && mf_record_parse(record_s, &record))
        return cli_usage_error("trace", "--record takes routing, topk, logits or full");
    mf_prompts prompts;
    if (mf_prompts_load(&prompts, input, cfg.vocab, &err)) return cli_fail(&err);
    mf_model *model = NULL;
    mf_run_writer *w = NULL;
    int status = 1;
    if (mf_runtime_load(&model, model_dir, &prec, &err)) goto done;
    mf_run_info info = {model_dir, model, &prec, "cpu", numerics.name, (int)threads,
                        record, input, &prompts, (int)shard_seqs, NULL, NULL, NULL};
    if (mf_run_create(&w, out, &info, resume, &err)) goto done;
    mf_run_opts ro = {prec, (int)threads, record == MF_RECORD_FULL, &numerics};
    uint64_t total_tokens = 0, done_tokens = 0;
    for (size_t i = 0; i < prompts.n; i++) total_tokens += (uint64_t)prompts.seq[i].T;
    mf_progress bar;
    mf_progress_begin(&bar, "trace", total_tokens);
    double t0 = mf_now();
    uint64_t computed = 0;
    for (size_t i = 0; i < prompts.n; i++) {
        const mf_prompt *p = &prompts.seq[i];
        if (mf_run_writer_has(w, p->id)) {
            done_tokens += (uint64_t)p->T;
            continue;
        }
        mf_seq_result r;
        if (mf_forward_cpu(model, &ro, p->tokens, p->T, &r, &err)) {
            mf_fail_wrap(&err, "sequence %s", p->id);
            mf_progress_end(&bar);
            goto done;
        }
        int rc = mf_run_writer_add(w, p, &r, &err);
        mf_seq_result_free(&r);
        if (rc) {
            mf_progress_end(&bar);
            goto done;
        }
        done_tokens += (uint64_t)p->T;
        computed += (uint64_t)p->T;
        mf_progress_update(&bar, done_tokens, p->id);
    }
    mf_progress_end(&bar);
    if (mf_run_writer_close(w, &err)) goto done;
    double secs = mf_now() - t0;
    mf_log("moeflip: wrote %s: %zu sequences, %llu tokens (%llu computed in %.3f s, %.0f tokens/s), %s, %s on cpu, "
           "%ld threads",
           out, mf_run_writer_done(w), (unsigned long long)total_tokens, (unsigned long long)computed, secs,
           secs > 0 ? (double)computed / secs : 0.0, prec.name, numerics.name, threads);
    status = 0;
done:
    if (status) cli_fail(&err);
    mf_run_writer_free(w);
    mf_model_free(model);
    mf_prompts_free(&prompts);
    return status;
}
