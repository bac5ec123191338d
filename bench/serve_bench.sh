#!/usr/bin/env bash
# The collector service on loopback:
#  1. upload throughput: `moeflip push` of a run with full logits (the 14M synthetic OLMoE, 16 prompts of
#     512 tokens, one 69 MB shard) to `moeflip serve` (which writes, fsyncs, hashes and verifies it), MB/s,
#     median of ROUNDS [10] rounds, next to `cp -r` of the same run on the same disk (and `cp -r` + `sync`) in
#     the same rounds;
#  2. the list endpoint under wrk (GET /api/runs, 20 runs stored), requests/s and p99 latency, idle and
#     while pushes of that run go on back to back.
# Usage: [ROUNDS=N] bench/serve_bench.sh [BUILD_DIR] [WRK_SECONDS]; needs wrk (Debian package wrk).
set -euo pipefail
export LC_ALL=C   # EPOCHREALTIME with a decimal point
build=${1:-build}
secs=${2:-10}
bin="$(cd "$(dirname "$build/moeflip")" && pwd)/moeflip"
command -v wrk > /dev/null || { echo "serve_bench: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
work=$(mktemp -d -p "${BENCH_DIR:-/tmp}")
server=
pusher=
cleanup() {
  [ -n "$pusher" ] && kill "$pusher" 2> /dev/null || true
  [ -n "$server" ] && kill "$server" 2> /dev/null || true
  wait 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$bin" synth --arch olmoe --size small --seed 1 -o "$work/model" > /dev/null
python3 - "$work/p.jsonl" <<'PY'
import random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write('{"id": "q%03d", "tokens": [%s]}\n' % (i, ", ".join(str(random.randrange(4096)) for _ in range(512))))
PY
"$bin" trace --model "$work/model" --input "$work/p.jsonl" --out "$work/big" --record logits --precision bf16 --threads 2 -q
"$bin" trace --model "$work/model" --input "$work/p.jsonl" --out "$work/small" --record routing --precision bf16 --threads 2 -q
bytes=$(du -cb "$work/big" | tail -n1 | cut -f1)
mb=$(python3 -c "print(f'{$bytes/1e6:.1f}')")

umask 077
head -c 24 /dev/urandom | base64 > "$work/token"
# start_server ROOT: a server on an ephemeral loopback port; sets server (its pid) and url
start_server() {
  rm -f "$work/serve.out"
  "$bin" serve --root "$1" --listen 127.0.0.1:0 --token-file "$work/token" --quiet > "$work/serve.out" &
  server=$!
  for _ in $(seq 100); do grep -q listening "$work/serve.out" 2> /dev/null && break; sleep 0.1; done
  url="http://127.0.0.1:$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/serve.out")"
}

# Upload: rounds of push, cp -r, cp -r + sync and dd, one after the other, so that all of them see the same machine
# (this VM's speed changes by up to 4x from one minute to the next); the medians are compared.
rounds=${ROUNDS:-10}
shard=$(ls "$work"/big/part-*.safetensors | head -n1)
start_server "$work/uroot"
: > "$work/times"
for i in $(seq "$rounds"); do
  t0=$EPOCHREALTIME; out=$("$bin" push "$work/big" --name "big-$i" --to "$url" --token-file "$work/token"); t1=$EPOCHREALTIME
  inside=$(sed -n 's/.* in \([0-9.]*\) s .*/\1/p' <<< "$out")
  t2=$EPOCHREALTIME; cp -r "$work/big" "$work/copy"; t3=$EPOCHREALTIME
  t4=$EPOCHREALTIME; cp -r "$work/big" "$work/copys"; sync; t5=$EPOCHREALTIME
  # the shard's bytes written straight to the disk (O_DIRECT, 4 MiB at a time) and fsynced: what another durable
  # writer takes
  t6=$EPOCHREALTIME; dd if="$shard" of="$work/direct" bs=4M oflag=direct conv=fsync status=none; t7=$EPOCHREALTIME
  echo "$t0 $t1 $inside $t2 $t3 $t4 $t5 $t6 $t7" >> "$work/times"
  rm -rf "$work/copy" "$work/copys" "$work/direct"
done
kill "$server"; wait "$server" 2> /dev/null || true
echo "## upload ($mb MB run, $rounds rounds)"
echo
python3 - "$bytes" "$work/times" <<'PY'
import statistics, sys
b = int(sys.argv[1])
rows = [list(map(float, l.split())) for l in open(sys.argv[2])]
cols = {
    "moeflip push -> moeflip serve, the whole command (streamed, hashed, fsynced, verified)": [r[1] - r[0] for r in rows],
    "the same pushes, connect to verified answer (as push reports it)": [r[2] for r in rows],
    "cp -r, same disk": [r[4] - r[3] for r in rows],
    "cp -r + sync, same disk": [r[6] - r[5] for r in rows],
    "dd of the shard, O_DIRECT 4 MiB writes + fsync, same disk": [r[8] - r[7] for r in rows],
}
print("| what | median s | MB/s | best s |")
print("|---|---|---|---|")
med = {}
for name, v in cols.items():
    med[name] = statistics.median(v)
    print(f"| {name} | {med[name]:.4f} | {b / med[name] / 1e6:.0f} | {min(v):.4f} |")
push, inside, cp, cps, disk = med.values()
print(f"\nof cp -r's speed (medians): the whole push command {cp / push:.2f}, the upload as push reports it {cp / inside:.2f}; "
      f"of cp -r + sync's: {cps / push:.2f}; of dd's: {disk / push:.2f} and {disk / inside:.2f}")
print("pushes (s): " + " ".join(f"{r[1] - r[0]:.3f}" for r in rows))
PY

start_server "$work/root"
for i in $(seq 20); do "$bin" push "$work/small" --name "run-$i" --to "$url" --token-file "$work/token" -q; done
wrk_row() {
  local label=$1 out
  out=$(wrk -t1 -c16 -d"${secs}s" --latency "$url/api/runs")
  python3 - "$label" "$out" <<'PY'
import re, sys
label, out = sys.argv[1], sys.argv[2]
rps = re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)
p99 = re.search(r"99%\s+([\d.]+\w+)", out).group(1)
p50 = re.search(r"50%\s+([\d.]+\w+)", out).group(1)
errs = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
print(f"| {label} | {float(rps):.0f} | {p50} | {p99} | {errs.group(1) if errs else 0} |")
PY
}
echo
echo "## GET /api/runs with wrk -t1 -c16 -d${secs}s (20 runs listed)"
echo
echo "| while | requests/s | p50 | p99 | non-2xx |"
echo "|---|---|---|---|---|"
wrk_row "idle"
( n=0; while [ ! -e "$work/stop" ]; do n=$((n + 1)); "$bin" push "$work/big" --name "load-$n" --to "$url" --token-file "$work/token" -q || exit 1; done ) &
pusher=$!
sleep 0.5
wrk_row "pushes of the $mb MB run back to back"
touch "$work/stop"
wait "$pusher"
pusher=
pushed=$(($(ls "$work/root/runs" | wc -l) - 20))
echo
echo "pushes completed during the wrk run: $pushed; machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
