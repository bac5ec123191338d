#!/usr/bin/env bash
# The collector service on loopback:
#  1. upload throughput: `moeflip push` of a run with full logits (the 14M synthetic OLMoE, 16 prompts of
#     512 tokens, ~140 MB) to `moeflip serve` (which writes, fsyncs, hashes and verifies it), MB/s, best of 3,
#     next to `cp -r` of the same run on the same disk (and `cp -r` + `sync`);
#  2. the list endpoint under wrk (GET /api/runs, 20 runs stored), requests/s and p99 latency, idle and
#     while pushes of that run go on back to back.
# Usage: bench/serve_bench.sh [BUILD_DIR] [WRK_SECONDS]; needs wrk (Debian package wrk).
set -euo pipefail
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
"$bin" serve --root "$work/root" --listen 127.0.0.1:0 --token-file "$work/token" --quiet > "$work/serve.out" &
server=$!
for _ in $(seq 100); do grep -q listening "$work/serve.out" 2> /dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/serve.out")
url="http://127.0.0.1:$port"

now() { date +%s.%N; }
best_push=999 best_cp=999 best_cps=999 pushes=
for i in 1 2 3; do
  t0=$(now); "$bin" push "$work/big" --name "big-$i" --to "$url" --token-file "$work/token" -q; t1=$(now)
  best_push=$(python3 -c "print(min($best_push, $t1 - $t0))")
  pushes="$pushes $(python3 -c "print(f'{$t1 - $t0:.3f}')")"
  t0=$(now); cp -r "$work/big" "$work/copy-$i"; t1=$(now)
  best_cp=$(python3 -c "print(min($best_cp, $t1 - $t0))")
  t0=$(now); cp -r "$work/big" "$work/copys-$i"; sync; t1=$(now)
  best_cps=$(python3 -c "print(min($best_cps, $t1 - $t0))")
  rm -rf "$work/copy-$i" "$work/copys-$i"
done
echo "## upload ($mb MB run, best of 3)"
echo
echo "| what | seconds | MB/s |"
echo "|---|---|---|"
python3 - "$bytes" "$best_push" "$best_cp" "$best_cps" <<'PY'
import sys
b, p, c, s = int(sys.argv[1]), *map(float, sys.argv[2:])
for name, t in (("moeflip push -> moeflip serve (verified, fsynced)", p), ("cp -r, same disk", c), ("cp -r + sync, same disk", s)):
    print(f"| {name} | {t:.3f} | {b / t / 1e6:.0f} |")
print(f"\npush / cp: {c / p:.2f} of cp's speed; push / (cp + sync): {s / p:.2f}")
PY
echo "pushes (s):$pushes"

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
pushed=$(($(ls "$work/root/runs" | wc -l) - 23))
echo
echo "pushes completed during the wrk run: $pushed; machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
