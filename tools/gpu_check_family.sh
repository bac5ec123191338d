#!/usr/bin/env bash
# The CUDA backend on one family of the 2026 fixtures (tests/fixtures/hf26), on a GPU machine; tools/gpu_check.sh
# runs every check at once, this runs one part of them, faster:
#   deepseek     moeflip_gpu_check validate26: deepseek_v3 (and its no-q_lora and YaRN variants), deepseek_v2
#                greedy and group-limited, glm4_moe, and the block-scaled checks below
#   gpt-oss      validate_oss: gpt_oss (sinks, sliding and full layers, YaRN, the biased top-k router, clamped
#                SwiGLU experts with biases in the fused layout) and its MXFP4 twin gpt_oss_mxfp4
#   blockscaled  validateq: the FP8 fixture deepseek_v3_fp8 (codes and block scales on the device, widened inside
#                the products) and product-level checks of the FP8 and MXFP4 kinds on every engine; fp8=w8a8
#                refused in one line
# For each fixture: fp32 on the GPU within 1e-5 of the CPU's fp64, and bit for bit against the CPU under the same
# instruction model (fixed against emu:hopper:mma.m16n8k16, every emu: against the CPU's), forward, decode and
# replay; a failing check names its first differing tensor, layer, position and column. Then
# tools/gpu_cli_check.sh on the family's fixtures: `moeflip trace --device cuda` end to end against the CPU's
# shards (forward, --generate, --replay), when the build has the command.
#   tools/gpu_check_family.sh deepseek|gpt-oss|blockscaled [BUILD_DIR] [OUT_DIR]
# BUILD_DIR (default build-gpu) is configured when absent and built (incrementally) every time, so a second round
# picks up changed sources. Exit status: 0 all passed, 1 a check or the build failed, 2 bad usage, 77 no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
family=${1:-}
case "$family" in
  deepseek) validate=validate26 models="hf26/deepseek_v3 hf26/deepseek_v2_group hf26/glm4_moe" ;;
  gpt-oss) validate=validate_oss models="hf26/gpt_oss hf26/gpt_oss_mxfp4" ;;
  blockscaled) validate=validateq models="hf26/deepseek_v3_fp8" ;;
  *) echo "usage: tools/gpu_check_family.sh deepseek|gpt-oss|blockscaled [BUILD_DIR] [OUT_DIR]" >&2; exit 2 ;;
esac
build=${2:-build-gpu}
out=${3:-gpu-$family-out}
mkdir -p "$out"
echo "gpu_check_family: building $build"
{ { [ -f "$build/CMakeCache.txt" ] ||
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOEFLIP_HIP=OFF -DMOEFLIP_CUDA=ON -DMOEFLIP_TESTS=OFF; } &&
  cmake --build "$build" -j"$(nproc)" --target moeflip_gpu_check moeflip_cuda; } > "$out/build.log" 2>&1 || {
  echo "gpu_check_family: could not build $build:" >&2
  tail -40 "$out/build.log" >&2
  exit 1
}
cmake --build "$build" -j"$(nproc)" --target moeflip >> "$out/build.log" 2>&1 ||
  echo "gpu_check_family: the moeflip command did not build here; the CLI check is skipped"
nvidia-smi -L 2>/dev/null || { echo "gpu_check_family: no NVIDIA GPU" >&2; exit 77; }
"$build/moeflip_gpu_check" "$validate" tests/fixtures "$out/$family-check.json" > "$out/$validate.log" 2>&1
rc=$?
echo "$validate (exit $rc): $(grep -c '^PASS' "$out/$validate.log") checks passed, $(grep -c '^FAIL' "$out/$validate.log") failed"
grep -v '^PASS' "$out/$validate.log" | cut -c1-1500
cli_rc=0
if [ -x "$build/moeflip" ]; then
  MODELS="$models" tools/gpu_cli_check.sh "$build/moeflip" "$out/cli" > "$out/cli.log" 2>&1
  cli_rc=$?
  echo "gpu_cli_check (exit $cli_rc):"
  cat "$out/cli.log"
fi
[ "$rc" = 0 ] && [ "$cli_rc" != 0 ] && rc=1
exit "$rc"
