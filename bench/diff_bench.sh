#!/usr/bin/env bash
# Diff throughput: MB of run data (both runs' shards) per second, one core,
# for routing-only runs and for runs with full logits. The model is the
# 14M-parameter synthetic OLMoE; 64 prompts of 512 tokens; reference bf16,
# target fp32. Best of 5 diffs, --bootstrap 0 (the bootstrap's cost grows
# with resamples x sequences, not with data): wall time (what the goal is
# stated in) and the process's CPU time, user + system (less sensitive to
# other work on a shared machine). DIFF_BENCH_RECORDS="routing" skips logits.
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
echo "| record | run data (MB, both runs) | best diff time (s) | MB/s per core | best CPU time (s) | MB per CPU second |"
echo "|---|---|---|---|---|---|"
for rec in ${DIFF_BENCH_RECORDS:-routing logits}; do
  for p in bf16 fp32; do
    [ -d "$work/$rec-$p" ] && [ -n "${2:-}" ] && continue
    "$bin" trace --model "$work/model" --input "$work/p.jsonl" --out "$work/$rec-$p" --record "$rec" --precision "$p" --threads 2 -q
  done
  mb=$(du -cm "$work/$rec-bf16" "$work/$rec-fp32" | tail -n1 | cut -f1)
  bytes=$(du -cb "$work/$rec-bf16" "$work/$rec-fp32" | tail -n1 | cut -f1)
  # wall time and the process's CPU time (user + system), best of 5 each
  OMP_NUM_THREADS=1 python3 - "$bin" "$work/$rec-bf16" "$work/$rec-fp32" "$work/d.json" "$bytes" "$rec" <<'PY'
import resource, subprocess, sys, time
bin, ref, tgt, out, nbytes, rec = sys.argv[1:7]
wall = cpu = 1e9
for _ in range(5):
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([bin, "diff", ref, tgt, "-o", out, "--bootstrap", "0", "-q"], check=True)
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = min(wall, t1 - t0)
    cpu = min(cpu, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
mb = int(nbytes) / 1e6
print("| %s | %.1f | %.3f | %.0f | %.3f | %.0f |" % (rec, mb, wall, mb / wall, cpu, mb / cpu))
PY
done
