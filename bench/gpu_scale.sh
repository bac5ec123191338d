#!/usr/bin/env bash
# moeflip at the sizes users study, on one GPU, beside Hugging Face in the same run.
#   bench/gpu_scale.sh BIN_DIR WORK_DIR OUT_DIR [SIZES...]
# BIN_DIR holds moeflip, libmoeflip_cuda.so and moeflip_gpu_check (a lean build: see bench/README.md);
# SIZES are `moeflip synth --size` names (default olmoe-1b-7b). For each size: the checkpoint is written into
# WORK_DIR; then, twice and alternating, `moeflip trace --device cuda --precision bf16` of its four 512-token
# prompts and bench/hf_job.py (transformers' from_pretrained + the same four forwards with logits and router logits
# to the host), each as a whole process, its wall time and peak RSS measured from outside; then
# `moeflip_gpu_check bench` (the forward pass alone, median of 10, under NUMERICS: default
# native,emu:cdna3,emu:hopper). Logs and JSON go to OUT_DIR; the summary lines start with "MEASURED" and "moeflip:" /
# "hf job:". The 2026 sizes work too (deepseek-v2-lite fits an H200: 31.4 GB in bf16); bench/hf_job.py hooks the
# routers of the families whose outputs have no router logits.
set -uo pipefail
bin=$1 work=$2 out=$3
shift 3
sizes=${*:-olmoe-1b-7b}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work" "$out"
# a command's wall time and peak resident memory, read by its parent
measure() {
  python3 - "$@" << 'PY'
import resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[2:]).returncode
w = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
print(f"MEASURED {sys.argv[1]}: exit {rc}, {w:.2f} s wall, peak RSS {rss:.2f} GiB", flush=True)
PY
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cores $(nproc), $(grep MemTotal /proc/meminfo)"
for size in $sizes; do
  m=$work/$size
  measure "synth $size" "$bin/moeflip" synth --size "$size" --seed 1 -o "$m"
  for round in 1 2; do
    rm -rf "$work/run-$size"
    MOEFLIP_UPLOAD_STATS=1 measure "moeflip trace $size round $round" "$bin/moeflip" trace --model "$m" --input "$m/tokens.jsonl" \
      --out "$work/run-$size" --device cuda --precision bf16 2>&1 | tee -a "$out/trace-$size.log"
    measure "hf job $size round $round" python3 "$here/hf_job.py" --model "$m" --input "$m/tokens.jsonl" \
      --out "$out/hf-$size-$round.json" 2>&1 | grep -v Warning | tee -a "$out/hf-$size.log"
  done
  "$bin/moeflip_gpu_check" bench "$m" bf16 10 "${NUMERICS:-native,emu:cdna3,emu:hopper}" "$out/bench-$size.json" 2>&1 | tail -n 4
  rm -rf "$m" "$work/run-$size"
done
