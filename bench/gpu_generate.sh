#!/usr/bin/env bash
# Batch-1 greedy decoding on one GPU: `moeflip trace --device cuda --generate N` (routing recorded at every step)
# beside Hugging Face generate (bench/hf_generate.py) on the same checkpoint, in the same run; then the decode path
# against the prefill path (the generated run teacher-forced and diffed), under native and fixed numerics.
#   bench/gpu_generate.sh BIN_DIR WORK_DIR OUT_DIR [SIZE [PROMPT_TOKENS [NEW_TOKENS]]]
# BIN_DIR holds moeflip and libmoeflip_cuda.so; SIZE is a `moeflip synth --size` name (default olmoe-1b-7b);
# the prompts are the first PROMPT_TOKENS (64) tokens of the checkpoint's four prompts, NEW_TOKENS (128) new ones
# each, no early stop (generation_config.json's eos_token_id set to null, for both tools). Logs and JSON go to
# OUT_DIR; summary lines start with "moeflip:" and "hf generate:".
set -uo pipefail
bin=$1 work=$2 out=$3
size=${4:-olmoe-1b-7b} plen=${5:-64} new=${6:-128}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work" "$out"
m=$work/$size
[ -f "$m/config.json" ] || "$bin/moeflip" synth --size "$size" --seed 1 -o "$m" > /dev/null
echo '{"eos_token_id": null}' > "$m/generation_config.json"
python3 - "$m/tokens.jsonl" "$plen" > "$work/prompts-$plen.jsonl" << 'PY'
import json, sys
for line in open(sys.argv[1]):
    p = json.loads(line)
    print(json.dumps({"id": p["id"], "tokens": p["tokens"][: int(sys.argv[2])]}))
PY
for num in native fixed; do
  rm -rf "$work/gen-$num" "$work/forced-$num"
  "$bin/moeflip" trace --model "$m" --input "$work/prompts-$plen.jsonl" --out "$work/gen-$num" --device cuda \
    --precision bf16 --numerics "$num" --generate "$new" --record logits 2>&1 | tee -a "$out/generate-$size.log"
  "$bin/moeflip" trace --model "$m" --input "$work/gen-$num" --out "$work/forced-$num" --device cuda \
    --precision bf16 --numerics "$num" --record logits -q 2>&1 | tee -a "$out/generate-$size.log"
  "$bin/moeflip" diff "$work/forced-$num" "$work/gen-$num" -o "$out/prefill-vs-decode-$num-$size.json" \
    --positions "$work/positions-$num.csv" --bootstrap 1000 -q 2>&1 | tee -a "$out/generate-$size.log"
  # the prompt's positions are prefill in both runs (64 rows against the whole sequence's); the generated ones
  # are decode steps in one and prefill rows in the other
  python3 - "$work/positions-$num.csv" "$num" << 'PY' | tee -a "$out/generate-$size.log"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for gen in ("false", "true"):
    r = [x for x in rows if x["generated"] == gen]
    flipped = sum(int(x["flipped_slots"]) > 0 for x in r)
    top1 = sum(x["top1"] == "1" for x in r)
    kl = sum(float(x["kl"]) for x in r) / max(len(r), 1)
    print(f"prefill vs decode ({sys.argv[2]}), {'generated' if gen == 'true' else 'prompt'} positions: {len(r)}, "
          f"with a flipped slot {flipped} ({100 * flipped / max(len(r), 1):.1f}%), top-1 equal {100 * top1 / max(len(r), 1):.1f}%, "
          f"mean KL {kl:.3g}")
PY
done
python3 "$here/hf_generate.py" --model "$m" --input "$work/prompts-$plen.jsonl" --new "$new" \
  --out "$out/hf-generate-$size.json" 2>&1 | grep -v Warning | tee -a "$out/generate-$size.log"
