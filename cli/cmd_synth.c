/* moeflip synth: a deterministic random-weight checkpoint in Hub layout. */
#include "cli.h"
#include "mf_models.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *help =
    "usage: moeflip synth --arch NAME --seed S -o DIR [--size tiny|small] [--dtype bf16|fp8]\n"
    "       moeflip synth --size olmoe-1b-7b|qwen1.5-moe-a2.7b|mixtral-8x7b|deepseek-v2-lite|glm-4.5-air|gpt-oss-20b\n"
    "                     --seed S -o DIR\n"
    "       moeflip synth --like CKPT --seed S -o DIR     (CKPT's architecture and sizes, random weights)\n"
    "\n"
    "Writes config.json, model.safetensors (bf16, Hugging Face Hub names) and tokens.jsonl into DIR.\n"
    "NAME: llama, olmoe, qwen2_moe, mixtral, qwen3_moe, deepseek_v3, gpt_oss (tiny only). tiny: hidden 64,\n"
    "3 layers, vocab 384;\n"
    "small: hidden 256, 4 layers, vocab 4096 (olmoe: 16 experts, top-4, ~14M parameters), four\n"
    "512-token prompts. The real sizes take the model's own architecture and dimensions (6.9B, 14.3B,\n"
    "46.7B, 15.7B, 106.9B and 20.9B parameters; gpt-oss-20b with bf16 experts in its fused layout; uniform random\n"
    "weights of deviation 0.8/sqrt(hidden), four 512-token prompts), for GPU\n"
    "benchmarks, and CPU ones at real size; their tensors are generated as the file is written, one at a\n"
    "time (memory: the largest tensor).\n"
    "--dtype fp8 (deepseek_v3, tiny, small or --like): linear weights as DeepSeek-V3 ships them, F8_E4M3 codes\n"
    "with an F32 weight_scale_inv per block (quantization_config weight_block_size [16, 16] at tiny, else\n"
    "[128, 128] or CKPT's); embedding, router, norms and head stay bf16.\n";

int cmd_synth(int argc, char **argv) {
    const char *arch_s = NULL, *out = NULL, *size_s = "tiny", *like = NULL, *dtype_s = "bf16";
    long seed = -1;
    static const struct option opts[] = {{"arch", required_argument, 0, 'a'}, {"seed", required_argument, 0, 's'},
                                         {"output", required_argument, 0, 'o'}, {"size", required_argument, 0, 'z'},
                                         {"like", required_argument, 0, 'l'}, {"dtype", required_argument, 0, 'd'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "a:s:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'a': arch_s = optarg; break;
        case 's':
            if (!cli_parse_int(optarg, 0, 0x7fffffffL, &seed)) return cli_usage_error("synth", "--seed takes a non-negative integer");
            break;
        case 'o': out = optarg; break;
        case 'z': size_s = optarg; break;
        case 'l': like = optarg; break;
        case 'd': dtype_s = optarg; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("synth", "unknown or incomplete option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("synth", "unexpected argument %s", argv[optind]);
    const int size_i = mf_synth_size_from_name(size_s);
    if (size_i < 0)
        return cli_usage_error("synth", "--size takes tiny, small, olmoe-1b-7b, qwen1.5-moe-a2.7b, mixtral-8x7b, "
                               "deepseek-v2-lite, glm-4.5-air or gpt-oss-20b");
    const mf_synth_size size = (mf_synth_size)size_i;
    if (strcmp(dtype_s, "bf16") && strcmp(dtype_s, "fp8")) return cli_usage_error("synth", "--dtype takes bf16 or fp8");
    const mf_dtype weights = strcmp(dtype_s, "fp8") ? MF_BF16 : MF_F8E4M3;
    const bool real = size >= MF_SYNTH_OLMOE_1B_7B;
    if ((!arch_s && !like && !real) || !out || seed < 0)
        return cli_usage_error("synth", "--arch (or --like, or a real model's --size), --seed and -o are required");
    if (real && (arch_s || like)) return cli_usage_error("synth", "--size %s brings its own architecture", size_s);
    int arch = arch_s ? mf_arch_from_name(arch_s) : 0;
    if (arch < 0) return cli_usage_error("synth", "unknown architecture \"%s\" (known: %s)", arch_s, mf_arch_list());
    mf_error err = {0};
    mf_config cfg;
    char path[4200];
    if (like) {
        snprintf(path, sizeof path, "%s/config.json", like);
        if (mf_config_load(&cfg, path, &err)) return cli_fail(&err);
    }
    if (mf_synth_write_as(out, (mf_arch)arch, size, like ? &cfg : NULL, (uint64_t)seed, weights, &err))
        return cli_fail(&err);
    return 0;
}
