#!/usr/bin/env bash
# The GPU backend's checks on a GPU machine: builds moeflip_gpu_check when
# BUILD_DIR lacks it, runs every validation of tools/gpu_check.c (fp32 against
# fp64, fixed against emu:hopper, emu:ARCH against the CPU, on every fixture
# and a synthetic model of each architecture), and prints a summary.
#   tools/gpu_check.sh [BUILD_DIR] [OUT.json]
# Exit status: 0 all passed, 1 a check failed, 77 no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-gpu-check.json}
if [ ! -x "$build/moeflip_gpu_check" ]; then
  cmake -S . -B "$build" -DMOEFLIP_TESTS=OFF >/dev/null && cmake --build "$build" -j"$(nproc)" --target moeflip_gpu_check >/dev/null || {
    echo "gpu_check: could not build moeflip_gpu_check in $build (is nvcc installed?)" >&2
    exit 1
  }
fi
log=$(mktemp)
"$build/moeflip_gpu_check" validate tests/fixtures "$out" | tee "$log"
rc=${PIPESTATUS[0]}
echo
echo "summary: $(grep -c '^PASS' "$log") passed, $(grep -c '^FAIL' "$log") failed (record: $out)"
grep '^FAIL' "$log" | cut -c1-400
rm -f "$log"
exit "$rc"
