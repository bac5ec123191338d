#!/usr/bin/env bash
# The CUDA backend on the DeepSeek-family fixtures (tests/fixtures/hf26: deepseek_v3, its no-q_lora and YaRN
# variants, deepseek_v2 greedy and group-limited, glm4_moe), on a GPU machine:
#   1. moeflip_gpu_check validate26: for each fixture, fp32 on the GPU against the CPU's fp64 (within 1e-5), and
#      bit for bit against the CPU under the same instruction model: fixed (bf16, fp16, selective:router+head)
#      against emu:hopper:mma.m16n8k16, and emu:cdna3, emu:hopper, emu:ampere, emu:volta, emu:blackwell,
#      emu:cdna4 against the CPU's; the decode path (a session, a token a step) and routing replay; the FP8
#      fixture refused in one line. A failing check names its first differing tensor, layer and position.
#   2. tools/gpu_cli_check.sh on three of them: `moeflip trace --device cuda` end to end against the CPU's
#      shards (forward, --generate, --replay), when the build has the command.
#   tools/gpu_check26.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR (default build-gpu26) is configured and built when it lacks moeflip_gpu_check or the CUDA module.
# Exit status: 0 all passed, 1 a check failed or the build failed, 77 no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu26}
out=${2:-gpu26-out}
mkdir -p "$out"
if [ ! -x "$build/moeflip_gpu_check" ] || [ ! -f "$build/libmoeflip_cuda.so" ]; then
  echo "gpu_check26: building $build"
  { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOEFLIP_HIP=OFF -DMOEFLIP_CUDA=ON -DMOEFLIP_TESTS=OFF &&
    cmake --build "$build" -j"$(nproc)" --target moeflip_gpu_check moeflip_cuda; } > "$out/build.log" 2>&1 || {
    echo "gpu_check26: could not build $build:" >&2
    tail -40 "$out/build.log" >&2
    exit 1
  }
  cmake --build "$build" -j"$(nproc)" --target moeflip >> "$out/build.log" 2>&1 ||
    echo "gpu_check26: the moeflip command did not build here; step 2 is skipped"
fi
nvidia-smi -L 2>/dev/null || { echo "gpu_check26: no NVIDIA GPU" >&2; exit 77; }
"$build/moeflip_gpu_check" validate26 tests/fixtures "$out/gpu26-check.json" > "$out/validate26.log" 2>&1
rc=$?
echo "validate26 (exit $rc): $(grep -c '^PASS' "$out/validate26.log") checks passed, $(grep -c '^FAIL' "$out/validate26.log") failed"
grep -v '^PASS' "$out/validate26.log" | cut -c1-1500
cli_rc=0
if [ -x "$build/moeflip" ]; then
  MODELS="hf26/deepseek_v3 hf26/deepseek_v2_group hf26/glm4_moe" tools/gpu_cli_check.sh "$build/moeflip" "$out/cli" \
    > "$out/cli.log" 2>&1
  cli_rc=$?
  echo "gpu_cli_check (exit $cli_rc):"
  cat "$out/cli.log"
fi
[ "$rc" = 0 ] && [ "$cli_rc" != 0 ] && rc=1
exit "$rc"
