#!/usr/bin/env bash
# The CUDA backend on the gpt-oss fixture (tests/fixtures/hf26/gpt_oss: attention sinks, sliding and full layers,
# YaRN RoPE, attention biases, the biased top-k-then-softmax router, clamped SwiGLU experts with biases in the fused
# gate_up layout; bf16 weights), on a GPU machine:
#   1. moeflip_gpu_check validate_oss: fp32 on the GPU against the CPU's fp64 (within 1e-5), and bit for bit
#      against the CPU under the same instruction model: fixed (bf16, fp16, selective:router+head) against
#      emu:hopper:mma.m16n8k16, and emu:cdna3, emu:hopper, emu:ampere, emu:volta, emu:blackwell, emu:cdna4 against
#      the CPU's; the decode path (a session, a token a step) and routing replay with and without the source's
#      weights; the MXFP4 twin (gpt_oss_mxfp4) refused in one line. A failing check names its first differing
#      tensor, MoE layer, position and column.
#   2. tools/gpu_cli_check.sh on it: `moeflip trace --device cuda` end to end against the CPU's shards (forward,
#      --generate, --replay, --replay-weights), when the build has the command.
#   tools/gpu_check_oss.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR (default build-gpuoss) is configured when new and built (incrementally) every time, so a changed tree
# is never checked with an old build.
# Exit status: 0 all passed, 1 a check failed or the build failed, 77 no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpuoss}
out=${2:-gpuoss-out}
mkdir -p "$out"
echo "gpu_check_oss: building $build"
{ { [ -f "$build/CMakeCache.txt" ] ||
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOEFLIP_HIP=OFF -DMOEFLIP_CUDA=ON -DMOEFLIP_TESTS=OFF; } &&
  cmake --build "$build" -j"$(nproc)" --target moeflip_gpu_check moeflip_cuda; } > "$out/build.log" 2>&1 || {
  echo "gpu_check_oss: could not build $build:" >&2
  tail -40 "$out/build.log" >&2
  exit 1
}
cmake --build "$build" -j"$(nproc)" --target moeflip >> "$out/build.log" 2>&1 || {
  echo "gpu_check_oss: the moeflip command did not build here; step 2 is skipped"
  rm -f "$build/moeflip"
}
nvidia-smi -L 2>/dev/null || { echo "gpu_check_oss: no NVIDIA GPU" >&2; exit 77; }
"$build/moeflip_gpu_check" validate_oss tests/fixtures "$out/gpuoss-check.json" > "$out/validate_oss.log" 2>&1
rc=$?
echo "validate_oss (exit $rc): $(grep -c '^PASS' "$out/validate_oss.log") checks passed, $(grep -c '^FAIL' "$out/validate_oss.log") failed"
# every failing check in full (its first_diff names the tensor, layer, position and column), and a summary line
# of each passing one
grep -v '^PASS' "$out/validate_oss.log" | cut -c1-3000
grep '^PASS' "$out/validate_oss.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line[5:])
    keys = ("case", "mode", "precision", "gpu_numerics", "cpu_numerics", "logits_rel", "router_rel", "slots_compared",
            "slots_differ", "logits", "logits_differ")
    print("PASS", " ".join(f"{k}={r[k]}" for k in keys if k in r))
' 2>/dev/null
cli_rc=0
if [ -x "$build/moeflip" ]; then
  MODELS="hf26/gpt_oss" tools/gpu_cli_check.sh "$build/moeflip" "$out/cli" > "$out/cli.log" 2>&1
  cli_rc=$?
  echo "gpu_cli_check (exit $cli_rc):"
  cat "$out/cli.log"
fi
[ "$rc" = 0 ] && [ "$cli_rc" != 0 ] && rc=1
exit "$rc"
