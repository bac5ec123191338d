#!/usr/bin/env bash
# Diff throughput: MB of run data (both runs' shards) per second, one core,
# for routing-only runs and for runs with full logits. The model is the
# 14M-parameter synthetic OLMoE; 64 prompts of 512 tokens; reference bf16,
# target fp32. Best of 5 diffs, --bootstrap 0 (the bootstrap's cost grows
# with resamples x sequences, not with data).
# Usage: bench/diff_bench.sh [BUILD_DIR] [WORK_DIR]: with WORK_DIR the model and
# runs are kept there and reused by the next call (for profiling).
set -euo pipefail
build=${1:-build}
bin="$build/moeflip"
if [ -n "${2:-}" ]; then
  work=$2
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
[ -d "$work/model" ] || "$bin" synth --arch olmoe --size small --seed 1 -o "$work/model"
python3 - "$work/p.jsonl" <<'PY'
import random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for i in range(64):
        f.write('{"id": "q%03d", "tokens": [%s]}\n' % (i, ", ".join(str(random.randrange(4096)) for _ in range(512))))
PY
echo "| record | run data (MB, both runs) | best diff time (s) | MB/s per core |"
echo "|---|---|---|---|"
for rec in routing logits; do
  for p in bf16 fp32; do
    [ -d "$work/$rec-$p" ] && [ -n "${2:-}" ] && continue
    "$bin" trace --model "$work/model" --input "$work/p.jsonl" --out "$work/$rec-$p" --record "$rec" --precision "$p" --threads 2 -q
  done
  mb=$(du -cm "$work/$rec-bf16" "$work/$rec-fp32" | tail -n1 | cut -f1)
  bytes=$(du -cb "$work/$rec-bf16" "$work/$rec-fp32" | tail -n1 | cut -f1)
  best=999
  for i in 1 2 3 4 5; do
    t0=$(date +%s.%N)
    OMP_NUM_THREADS=1 "$bin" diff "$work/$rec-bf16" "$work/$rec-fp32" -o "$work/d.json" --bootstrap 0 -q
    t1=$(date +%s.%N)
    best=$(python3 -c "print(min($best, $t1 - $t0))")
  done
  python3 -c "print('| $rec | %.1f | %.3f | %.0f |' % ($bytes/1e6, $best, $bytes/1e6/$best))"
done
