#!/usr/bin/env bash
# `moeflip trace --device cuda` end to end, on a GPU machine. For a synthetic small model of each architecture
# below (four 512-token prompts, bf16), the GPU's `fixed` and `emu:cdna3` runs must be the CPU's
# `emu:hopper:mma.m16n8k16` and `emu:cdna3` runs bit for bit (the same shard digests, which cover every logit,
# router logit, expert id and weight), so must their greedy generations of 24 tokens (the GPU's decode path
# against the CPU's) and their replays of the CPU's fp64 routing, and `moeflip diff` compares the GPU's native, fixed and emu:cdna3 runs with
# the CPU's fp64 one. The same runs on three of the DeepSeek-family fixtures (tests/fixtures/hf26: deepseek_v3,
# deepseek_v2_group, glm4_moe: latent attention, grouped routers, shared experts, whose runs also record the
# routers' selection rows).
#   tools/gpu_cli_check.sh [MOEFLIP] [WORK_DIR]
#   MODELS="hf26/deepseek_v3 ..." tools/gpu_cli_check.sh ...   (a subset: olmoe, qwen2_moe, hf26/NAME)
# MOEFLIP is the program (default build/moeflip; libmoeflip_cuda.so next to it). Prints one line per comparison
# and the diff's figures; exit status 0 when every pair is equal, 1 when one differs or a command fails, 77 when
# there is no NVIDIA GPU here.
set -euo pipefail
bin=${1:-build/moeflip}
work=${2:-$(mktemp -d)}
command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 || { echo "gpu_cli_check: no NVIDIA GPU" >&2; exit 77; }
mkdir -p "$work"
root=$(cd "$(dirname "$0")/.." && pwd)
models=${MODELS:-olmoe qwen2_moe hf26/deepseek_v3 hf26/deepseek_v2_group hf26/glm4_moe}
digests() {
  python3 -c 'import json, sys; print(" ".join(s["digest"] for s in json.load(open(sys.argv[1] + "/manifest.json"))["shards"]))' "$1"
}
differ=0
for name in $models; do
  case $name in
    hf26/*) arch=${name#hf26/}; model=$root/tests/fixtures/hf26/$arch ;;
    *) arch=$name; model=$work/model-$arch; "$bin" synth --arch "$arch" --size small --seed 7 -o "$model" > /dev/null ;;
  esac
  trace() {   # trace NAME OPTIONS...
    local t0=$EPOCHREALTIME
    "$bin" trace --model "$model" --input "$model/tokens.jsonl" --precision bf16 -q --out "$work/$1-$arch" "${@:2}"
    printf '%s %s: %.2f s\n' "$arch" "$1" "$(python3 -c "print($EPOCHREALTIME - $t0)")"
  }
  trace gpu-fixed --device cuda --numerics fixed
  trace cpu-fixed --numerics emu:hopper:mma.m16n8k16.f32.bf16.bf16.f32
  trace gpu-cdna3 --device cuda --numerics emu:cdna3
  trace cpu-cdna3 --numerics emu:cdna3
  trace gpu-native --device cuda
  trace cpu-fp64 --precision fp64
  # the decode path (a KV cache on the device, one token a step) and routing replay, against the CPU's
  trace gpu-fixed-gen --device cuda --numerics fixed --generate 24
  trace cpu-fixed-gen --numerics emu:hopper:mma.m16n8k16.f32.bf16.bf16.f32 --generate 24
  trace gpu-cdna3-gen --device cuda --numerics emu:cdna3 --generate 24
  trace cpu-cdna3-gen --numerics emu:cdna3 --generate 24
  trace gpu-fixed-replay --device cuda --numerics fixed --replay "$work/cpu-fp64-$arch"
  trace cpu-fixed-replay --numerics emu:hopper:mma.m16n8k16.f32.bf16.bf16.f32 --replay "$work/cpu-fp64-$arch"
  trace gpu-cdna3-replayw --device cuda --numerics emu:cdna3 --replay "$work/cpu-fp64-$arch" --replay-weights
  trace cpu-cdna3-replayw --numerics emu:cdna3 --replay "$work/cpu-fp64-$arch" --replay-weights
  for pair in fixed cdna3 fixed-gen cdna3-gen fixed-replay cdna3-replayw; do
    gpu=$(digests "$work/gpu-$pair-$arch") cpu=$(digests "$work/cpu-$pair-$arch")
    if [ "$gpu" = "$cpu" ]; then
      echo "$arch $pair: the GPU's run is the CPU's bit for bit ($gpu)"
    else
      echo "$arch $pair: the GPU's run differs from the CPU's ($gpu against $cpu)"
      differ=1
    fi
  done
  "$bin" diff "$work/cpu-fp64-$arch" "$work/gpu-native-$arch" "$work/gpu-fixed-$arch" "$work/gpu-cdna3-$arch" \
    -o "$work/diff-$arch.json" --bootstrap 0 > /dev/null
  python3 - "$work/diff-$arch.json" "$arch" << 'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for t in d["targets"]:
    m = t["metrics"]
    v = lambda k: m[k]["value"] if isinstance(m[k], dict) else m[k]
    print(f"{sys.argv[2]} {':'.join(t['numerics'].split(':')[:2])} on {t['device']} against fp64 on the CPU: router sets equal "
          f"{v('router_set_equal_pct'):.2f}%, top-1 equal {v('top1_pct'):.2f}%, logit MSE {v('raw_logit_mse'):.3g}, "
          f"KL {v('forward_kl'):.3g}")
PY
done
exit $differ
