#!/usr/bin/env bash
# The GPU capture benchmark against Hugging Face for the DeepSeek family: DeepSeek-V2-Lite's dimensions
# (`moeflip synth --size deepseek-v2-lite`: deepseek_v2, 15.7B parameters, 31.4 GB in bf16, which the H200 holds),
# on one GPU, both tools in the same device call.
#   bench/gpu_capture26.sh BIN_DIR WORK_DIR OUT_DIR
# BIN_DIR holds moeflip, libmoeflip_cuda.so and moeflip_gpu_check (a lean build: bench/README.md). The checkpoint
# is written into WORK_DIR (needs 32 GB there); then, twice and alternating, `moeflip trace --device cuda
# --precision bf16` of its four 512-token prompts and bench/hf_job.py (transformers' from_pretrained with eager
# attention + the same four teacher-forced forwards, logits and every router's output to the host), each a whole
# process, its wall time and peak RSS measured from outside; then `moeflip_gpu_check bench` (the forward pass
# alone, median of 10 after a warm-up, native and fixed; profile:native says where the time goes). Logs and JSON
# go to OUT_DIR; the summary lines start with "MEASURED", "moeflip:" and "hf job:".
set -uo pipefail
bin=$1 work=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
size=deepseek-v2-lite
mkdir -p "$work" "$out"
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
m=$work/$size
measure "synth $size" "$bin/moeflip" synth --size "$size" --seed 1 -o "$m"
for round in 1 2; do
  rm -rf "$work/run-$size"
  MOEFLIP_UPLOAD_STATS=1 measure "moeflip trace $size round $round" "$bin/moeflip" trace --model "$m" \
    --input "$m/tokens.jsonl" --out "$work/run-$size" --device cuda --precision bf16 2>&1 | tee -a "$out/trace-$size.log"
  measure "hf job $size round $round" python3 "$here/hf_job.py" --model "$m" --input "$m/tokens.jsonl" \
    --out "$out/hf-$size-$round.json" 2>&1 | grep -v Warning | tee -a "$out/hf-$size.log"
done
"$bin/moeflip" inspect "$work/run-$size" | head -n 20 > "$out/inspect-$size.txt" 2>&1
"$bin/moeflip_gpu_check" bench "$m" bf16 10 native,fixed,profile:native "$out/bench-$size.json" 2>&1 | tail -n 30
rm -rf "$m" "$work/run-$size"
