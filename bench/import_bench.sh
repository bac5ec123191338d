#!/bin/sh
# Import speed of a large synthetic engine capture (issue 22): N sequences of T tokens of a config-only model
# with 16 MoE layers, 64 experts, top-8 (OLMoE-like shapes; no weights: an import reads the config alone), written
# as vLLM .npy files (int16 [T, 16, 8]) and as one SGLang JSON lines file (base64 int32), then imported with
# `moeflip import vllm|sglang` under /usr/bin/time. Prints one line per format: tokens, capture bytes, seconds,
# tokens/s, peak RSS.
#   sh bench/import_bench.sh [BUILD_DIR] [N] [T]        defaults: build 1000 1000 (1M tokens x 16 layers x 8)
set -eu
BUILD=${1:-build}
N=${2:-1000}
T=${3:-1000}
BIN=$(cd "$BUILD" && pwd)/moeflip
WORK=$(mktemp -d /tmp/moeflip-import-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
python3 - "$WORK" "$N" "$T" <<'PY'
import base64, json, os, random, struct, sys
work, n, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
L, E, K, V = 16, 64, 8, 50304
os.makedirs(work + "/model")
cfg = {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024,
       "num_hidden_layers": L, "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": E,
       "num_experts_per_tok": K, "norm_topk_prob": False, "vocab_size": V, "max_position_embeddings": 4096,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
json.dump(cfg, open(work + "/model/config.json", "w"))
rng = random.Random(22)
os.makedirs(work + "/vllm")
# one sequence's tokens and routing, repeated: the import's work does not depend on the values
toks = json.dumps([rng.randrange(V) for _ in range(T)])
ids = []
for t in range(T):
    for l in range(L):
        b = rng.randrange(E)
        ids += [(b + 7 * k) % E for k in range(K)]   # distinct experts per row
h = "{'descr': '<i2', 'fortran_order': False, 'shape': (%d, %d, %d), }" % (T, L, K)
h += " " * (-(10 + len(h) + 1) % 64) + "\n"
npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + struct.pack("<%dh" % len(ids), *ids)
line = json.dumps({"meta_info": {"routed_experts": base64.b64encode(struct.pack("<%di" % len(ids), *ids)).decode()}}) + "\n"
with open(work + "/tokens.jsonl", "w") as tok, open(work + "/sglang.jsonl", "w") as sg:
    for i in range(n):
        tok.write('{"id": "s%d", "tokens": %s}\n' % (i, toks))
        with open(work + "/vllm/s%05d.npy" % i, "wb") as f:
            f.write(npy)
        sg.write(line)
PY
for fmt in vllm sglang; do
    if [ $fmt = vllm ]; then set -- "$WORK"/vllm/*.npy; else set -- "$WORK/sglang.jsonl"; fi
    bytes=$(cat "$@" | wc -c)
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$BIN" import $fmt "$@" --model "$WORK/model" --tokens "$WORK/tokens.jsonl" -o "$WORK/run_$fmt"
    read -r secs rss < "$WORK/time"
    awk -v f=$fmt -v n="$N" -v t="$T" -v b="$bytes" -v s="$secs" -v r="$rss" 'BEGIN {
        printf "%-7s %d tokens (%d x %d), 16 layers x 8: capture %.0f MB, %.2f s, %.2f M tokens/s, peak RSS %.0f MiB\n",
               f, n * t, n, t, b / 1e6, s, n * t / s / 1e6, r / 1024 }'
    rm -rf "$WORK/run_$fmt"
done
