#!/usr/bin/env bash
# Prefill throughput of the CPU executor on a synthetic OLMoE of ~14M
# parameters (hidden 256, 4 layers, 16 experts, top-4, vocab 4096), four
# 512-token prompts, per precision. Prints a markdown table row per run:
# the median of REPEATS runs of the forward passes (model load excluded; the
# shard writing is included). Usage: bench/run.sh [BUILD_DIR] [THREADS] [REPEATS]
set -euo pipefail
build=${1:-build}
threads=${2:-2}
repeats=${3:-5}
bin="$build/moeflip"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" synth --arch olmoe --size small --seed 1 -o "$work/model"
echo "| precision | threads | tokens | median tokens/s | min | max |"
echo "|---|---|---|---|---|---|"
for prec in fp32 bf16 fp64; do
  rates=()
  for i in $(seq "$repeats"); do
    rm -rf "$work/run"
    line=$("$bin" trace --model "$work/model" --input "$work/model/tokens.jsonl" --out "$work/run" \
             --precision "$prec" --threads "$threads" --record routing 2>&1 | tail -n 1)
    rates+=("$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' <<<"$line")")
  done
  sorted=$(printf '%s\n' "${rates[@]}" | sort -n)
  med=$(sed -n "$(( (repeats + 1) / 2 ))p" <<<"$sorted")
  echo "| $prec | $threads | 2048 | $med | $(head -n1 <<<"$sorted") | $(tail -n1 <<<"$sorted") |"
done

echo
echo "Matrix products, multiply-adds per second (bf16 operands, fp32 accumulation; 256x256x1024):"
for t in 1 2; do "$build/moeflip_bench_gemm" "$t"; echo; done
