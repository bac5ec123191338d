#!/bin/sh
# MPI on a GPU machine (issue 22): what tests/test_mpi.c cannot check on a CPU-only one.
#   1. `mpirun -n R moeflip trace --device cuda` (no index) puts the node's ranks on its GPUs in turn: rank r on
#      GPU r mod count. Checked by watching nvidia-smi while the job runs: the GPUs the ranks' processes hold
#      must be min(R, count) distinct ones.
#   2. Its export equals one process's `trace --device cuda` byte for byte (the GPU backend is deterministic on
#      one GPU model; a difference between GPUs of one model would show here).
#   3. `--device cuda:0` puts every rank on GPU 0.
#   4. `mpirun -n R moeflip diff` of a CPU fp64 reference against the GPU run writes one process's diff.json.
# Needs: a build with the CUDA backend and the MPI module (libmoeflip_cuda.so, libmoeflip_mpi.so next to moeflip;
# OpenMPI's libopenmpi-dev when it was configured) and mpirun (openmpi-bin) on this machine.
#   sh tools/mpi_gpu_check.sh [BUILD_DIR] [RANKS]      defaults: build, the GPU count (at least 2)
set -eu
BUILD=${1:-build}
BIN=$(cd "$BUILD" && pwd)/moeflip
MODEL=$(cd "$(dirname "$0")/.." && pwd)/models/tiny-olmoe
command -v mpirun >/dev/null || { echo "mpi_gpu_check: mpirun not found (apt-get install openmpi-bin)"; exit 2; }
command -v nvidia-smi >/dev/null || { echo "mpi_gpu_check: nvidia-smi not found: no NVIDIA GPU here"; exit 2; }
for m in mpi cuda; do
  [ -f "$BUILD/libmoeflip_$m.so" ] || { echo "mpi_gpu_check: $BUILD/libmoeflip_$m.so missing (configure with the $m toolkit)"; exit 2; }
done
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
RANKS=${2:-$GPUS}
[ "$RANKS" -ge 2 ] || RANKS=2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
W=$(mktemp -d /tmp/moeflip-mpi-gpu.XXXXXX)
trap 'rm -rf "$W"' EXIT
# the model's 32 passages REPEAT times over (ids made unique; default 4): long enough a job for nvidia-smi to see
# it, short enough that the three full exports (logits included: 186 MB of JSON lines per 32 passages) stay quick
P="$W/prompts.jsonl"
k=0
while [ "$k" -lt "${REPEAT:-4}" ]; do k=$((k + 1)); sed "s/\"id\": *\"/\"id\": \"r$k-/" "$MODEL/prompts.jsonl"; done > "$P"
fail=0
echo "mpi_gpu_check: $GPUS GPU(s), $RANKS ranks, $(mpirun --version | head -n1)"

# the GPUs a job's moeflip processes hold, sampled every 0.1 s while it runs: one "gpu_uuid" a line
watch_gpus() {   # $1: the job's pid, $2: output file
  : > "$2"
  while kill -0 "$1" 2>/dev/null; do
    pids=$(pgrep -d '|' -x moeflip || true)
    [ -n "$pids" ] && nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null |
      awk -F', ' -v p="^($pids)\$" '$1 ~ p {print $2}' >> "$2"
    sleep 0.1
  done
  sort -u "$2" -o "$2"
}

"$BIN" trace -q --model "$MODEL" --input "$P" --out "$W/one" --device cuda --precision bf16
"$BIN" export "$W/one" --format jsonl -o "$W/one.jsonl"

for dev in cuda cuda:0; do
  out="$W/ranks-$(echo $dev | tr : _)"
  mpirun --oversubscribe -n "$RANKS" "$BIN" trace -q --model "$MODEL" --input "$P" --out "$out" --device "$dev" \
    --precision bf16 --shard-seqs 1 &
  job=$!
  watch_gpus $job "$out.gpus" &
  watcher=$!
  wait $job || { echo "FAIL: mpirun -n $RANKS trace --device $dev exited $?"; fail=1; }
  wait $watcher || true
  used=$(wc -l < "$out.gpus")
  want=$([ "$dev" = cuda ] && echo $((RANKS < GPUS ? RANKS : GPUS)) || echo 1)
  if [ "$used" -eq "$want" ]; then echo "ok: --device $dev: the ranks held $used GPU(s): $(tr '\n' ' ' < "$out.gpus")"
  else echo "FAIL: --device $dev on $RANKS ranks: the ranks held $used GPU(s), want $want ($(tr '\n' ' ' < "$out.gpus")): a job too short to sample shows 0"; fail=1; fi
  "$BIN" export "$out" --format jsonl -o "$out.jsonl"
  if cmp -s "$W/one.jsonl" "$out.jsonl"; then echo "ok: --device $dev: the export equals one process's"
  else echo "FAIL: --device $dev: the export of $RANKS ranks differs from one process's ($(cmp "$W/one.jsonl" "$out.jsonl" | head -n1))"; fail=1; fi
done

"$BIN" trace -q --model "$MODEL" --input "$P" --out "$W/ref" --precision fp64
"$BIN" diff "$W/ref" "$W/one" -o "$W/d1.json" -q
mpirun --oversubscribe -n "$RANKS" "$BIN" diff "$W/ref" "$W/one" -o "$W/dn.json" -q
if cmp -s "$W/d1.json" "$W/dn.json"; then echo "ok: diff on $RANKS ranks equals one process's"
else echo "FAIL: diff on $RANKS ranks differs from one process's"; fail=1; fi
[ $fail -eq 0 ] && echo "mpi_gpu_check: all passed"
exit $fail
