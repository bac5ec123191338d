#!/usr/bin/env bash
# Block-scaled weights on the CUDA backend, on a GPU machine:
#   1. moeflip_gpu_check validateq: the FP8 fixture (tests/fixtures/hf26/deepseek_v3_fp8: e4m3 codes and their
#      block scales on the device, widened inside the products) under every check validate26 makes of a
#      fixture: fp32 native within 1e-5 of the CPU's fp64; fixed (bf16, fp16, selective:router+head) and every
#      emu: bit for bit against the CPU; decode and replay; fp8=w8a8 refused in one line. Then the product-level
#      checks of the FP8 and MXFP4 kinds (a random matrix and its scales, dense and grouped, every engine).
#      A failing check names its first differing tensor, layer and position (or product, row and column).
#   2. tools/gpu_cli_check.sh on hf26/deepseek_v3_fp8: `moeflip trace --device cuda` end to end against the
#      CPU's shards, when the build has the command.
#   tools/gpu_checkq.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR (default build-gpuq) is configured when absent and built every time.
# Exit status: 0 all passed, 1 a check failed or the build failed, 77 no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpuq}
out=${2:-gpuq-out}
mkdir -p "$out"
# configured when absent, built (incrementally) every time: a second round picks up the changed sources
echo "gpu_checkq: building $build"
{ { [ -f "$build/CMakeCache.txt" ] ||
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOEFLIP_HIP=OFF -DMOEFLIP_CUDA=ON -DMOEFLIP_TESTS=OFF; } &&
  cmake --build "$build" -j"$(nproc)" --target moeflip_gpu_check moeflip_cuda; } > "$out/build.log" 2>&1 || {
  echo "gpu_checkq: could not build $build:" >&2
  tail -40 "$out/build.log" >&2
  exit 1
}
cmake --build "$build" -j"$(nproc)" --target moeflip >> "$out/build.log" 2>&1 ||
  echo "gpu_checkq: the moeflip command did not build here; step 2 is skipped"
nvidia-smi -L 2>/dev/null || { echo "gpu_checkq: no NVIDIA GPU" >&2; exit 77; }
"$build/moeflip_gpu_check" validateq tests/fixtures "$out/h200-checkq.json" > "$out/validateq.log" 2>&1
rc=$?
echo "validateq (exit $rc): $(grep -c '^PASS' "$out/validateq.log") checks passed, $(grep -c '^FAIL' "$out/validateq.log") failed"
grep -v '^PASS' "$out/validateq.log" | cut -c1-1500
cli_rc=0
if [ -x "$build/moeflip" ]; then
  MODELS="hf26/deepseek_v3_fp8" tools/gpu_cli_check.sh "$build/moeflip" "$out/cli" \
    > "$out/cli.log" 2>&1
  cli_rc=$?
  echo "gpu_cli_check (exit $cli_rc):"
  cat "$out/cli.log"
fi
[ "$rc" = 0 ] && [ "$cli_rc" != 0 ] && rc=1
exit "$rc"
