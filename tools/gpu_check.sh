#!/usr/bin/env bash
# The GPU backend's checks on a GPU machine, with a summary.
#   tools/gpu_check.sh [BUILD_DIR] [OUT.json]
# Builds BUILD_DIR when it lacks moeflip_gpu_check (needs nvcc and the Debian
# -dev packages of the README), runs the ctest label "gpu" when BUILD_DIR has
# the test suite, then every validation of tests/gpu_check.c: fp32 against
# fp64, fixed against emu:hopper, emu:ARCH against the CPU, on every fixture,
# a synthetic model of each architecture and two 512-token ones. OUT.json is
# the record that tests/fixtures/gpu/h200-check.json is a copy of.
# On a bare GPU image without the -dev packages, build elsewhere
# (cmake -S . -B build-dev -DMOEFLIP_HIP=OFF -DMOEFLIP_TESTS=OFF && cmake --build
# build-dev --target moeflip_gpu_check) and bring build-dev/moeflip_gpu_check and
# build-dev/libmoeflip_cuda.so: it needs only libjansson, libxxhash, liblzma,
# libgomp and CUDA's libraries there.
# Exit status: 0 all passed, 1 a check failed, 77 no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-gpu-check.json}
if [ ! -x "$build/moeflip_gpu_check" ]; then
  cmake -S . -B "$build" >/dev/null && cmake --build "$build" -j"$(nproc)" >/dev/null || {
    echo "gpu_check: could not build $build (is nvcc installed?)" >&2
    exit 1
  }
fi
ctest_rc=0
if [ -f "$build/CTestTestfile.cmake" ] && [ -x "$build/tests/test_gpu" ]; then
  ctest --test-dir "$build" -L gpu --output-on-failure
  ctest_rc=$?
fi
log=$(mktemp)
"$build/moeflip_gpu_check" validate tests/fixtures "$out" | tee "$log"
rc=${PIPESTATUS[0]}
echo
echo "summary: $(grep -c '^PASS' "$log") checks passed, $(grep -c '^FAIL' "$log") failed (record: $out)$([ -f "$build/CTestTestfile.cmake" ] && echo "; ctest -L gpu: exit $ctest_rc")"
grep '^FAIL' "$log" | cut -c1-400
rm -f "$log"
[ "$rc" = 0 ] && [ "$ctest_rc" != 0 ] && rc=1
exit "$rc"
