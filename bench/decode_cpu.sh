#!/bin/sh
# CPU greedy decoding on the embedded model: the default sweep's texts (4 prompts continued by 16 tokens, 12
# multiple-choice items scored) traced once per numerics, one thread each, in one run.
# usage: sh bench/decode_cpu.sh BUILD_DIR
set -e
b=${1:-build}
m=models/tiny-olmoe
out=$(mktemp -d)
for cfg in "bf16 native" "fp64 fp64" "bf16 emu:hopper" "bf16 emu:cdna3"; do
  set -- $cfg
  /usr/bin/time -f "$1 $2: %e s, %M KB peak" "$b/moeflip" trace -q --model $m --input $m/sweep-texts.jsonl \
    --out "$out/$1-$2" --precision "$1" --numerics "$2" --record logits --threads 1 --generate 16
done
rm -rf "$out"
