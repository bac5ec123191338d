/* moeflip import: others' captures as runs. */
#include "cli.h"
#include "mf_rundir.h"

#include <getopt.h>
#include <string.h>

static const char *help =
    "usage: moeflip import crova DIR --model CKPT -o RUN\n"
    "       moeflip import vllm|sglang|llamacpp|hf FILE... --model CKPT --tokens TOKENS.jsonl -o RUN\n"
    "\n"
    "Reads a capture into a run directory, so moeflip can diff it against its own runs. CKPT is the model's\n"
    "checkpoint directory (its config.json gives the layers, experts, k and the routing rule; its weights, if\n"
    "present, identify the model). Nothing is loaded or run.\n"
    "\n"
    "crova     DIR/logits/<case>.safetensors with logits [m, V], response [m] and router_logits [L, m, E]; the\n"
    "          experts are derived from the router logits (canonical top-k of the raw scores).\n"
    "vllm      FILE.npy: CompletionOutput.routed_experts saved with numpy.save, [tokens, layers, top_k].\n"
    "sglang    FILE: a /generate response (or an array, or JSON lines of them) with meta_info.routed_experts\n"
    "          (base64 int32 [tokens, num_hidden_layers, top_k]), or the bare base64 text.\n"
    "llamacpp  FILE.csv: llama.cpp moe-trace's layer,expert rows (ubatch by ubatch, layer by layer).\n"
    "hf        FILE.safetensors: outputs.router_logits of output_router_logits=True as router_logits.<i>\n"
    "          [tokens, E] (or router_logits [L, tokens, E]), optionally logits [tokens, V]; the experts are\n"
    "          derived with the model's routing rule.\n"
    "\n"
    "TOKENS is a prompt file (JSON lines {\"id\", \"tokens\"}, or {\"id\", \"text\"} with the model's tokenizer.json):\n"
    "each sequence's tokens as the engine ran them, prompt and completion. The i-th capture (files in the order\n"
    "given) is the i-th line. A capture has one row per token, or one fewer (the last token never ran): the run\n"
    "then holds the tokens it covers; trace the reference with `moeflip trace --input RUN` to compare on exactly\n"
    "them. The manifest's capture.lacks says what the run cannot have (gate weights, router logits, logits): a\n"
    "diff writes the metrics that need them as null, with a warning.\n";

int cmd_import(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(help, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    mf_engine eng = MF_ENGINE_VLLM;
    const bool crova = !strcmp(argv[1], "crova");
    if (!crova && mf_engine_parse(argv[1], &eng))
        return cli_usage_error("import", "unknown source \"%s\" (crova, vllm, sglang, llamacpp, hf)", argv[1]);
    const char *model = NULL, *out = NULL, *tokens = NULL;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"output", required_argument, 0, 'o'},
                                         {"tokens", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc - 1, argv + 1, "m:o:t:h", opts, NULL)) != -1) {
        if (c == 'm') model = optarg;
        else if (c == 'o') out = optarg;
        else if (c == 't') tokens = optarg;
        else if (c == 'h') {
            fputs(help, stdout);
            return 0;
        } else return cli_usage_error("import", "unknown or incomplete option");
    }
    mf_error err = {0};
    /* getopt ran over argv + 1: the operands are argv[optind + 1 ..] */
    if (crova) {
        if (optind != argc - 2 || !model || !out || tokens)
            return cli_usage_error("import", "crova: give DIR, --model CKPT and -o RUN");
        if (mf_import_crova(argv[optind + 1], model, out, &err)) return cli_fail(&err);
        return 0;
    }
    if (optind > argc - 2 || !model || !out || !tokens)
        return cli_usage_error("import", "%s: give FILE..., --model CKPT, --tokens TOKENS.jsonl and -o RUN", argv[1]);
    if (mf_import_engine(eng, (const char *const *)argv + optind + 1, argc - 1 - optind, model, tokens, out, &err))
        return cli_fail(&err);
    return 0;
}
