#!/usr/bin/env bash
# The collector service on loopback:
#  1. upload throughput: `moeflip push` of a run with full logits (the 14M synthetic OLMoE, 16 prompts of
#     512 tokens, one 69 MB shard) to `moeflip serve` (which writes, fsyncs, hashes and verifies it), MB/s,
#     median of ROUNDS [10] rounds, next to `cp -r` of the same run on the same disk (and `cp -r` + `sync`, and
#     dd) in the same rounds; then push, `cp -r` and `cp -r` + `sync` of a run four times as large (64 prompts,
#     276 MB);
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
prompts() {
python3 - "$1" "$2" <<'PY'
import random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write('{"id": "q%03d", "tokens": [%s]}\n' % (i, ", ".join(str(random.randrange(4096)) for _ in range(512))))
PY
}
prompts "$work/p.jsonl" 16
prompts "$work/p64.jsonl" 64
"$bin" trace --model "$work/model" --input "$work/p.jsonl" --out "$work/big" --record logits --precision bf16 --threads 2 -q
"$bin" trace --model "$work/model" --input "$work/p.jsonl" --out "$work/small" --record routing --precision bf16 --threads 2 -q
"$bin" trace --model "$work/model" --input "$work/p64.jsonl" --out "$work/huge" --record logits --precision bf16 --threads 2 -q
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
# (this VM's speed changes by up to 4x from one minute to the next); the medians are compared. Every round starts a
# server on an empty root and removes every copy once it is timed: on this VM a page the guest has not used lately
# costs a fault in the hypervisor when it is touched again (freed pages go back to the host), so a copy made while
# the earlier ones are kept runs into fresh pages and is several times slower (cp -r of the 69 MB run: 0.16 s
# against 0.018 s) for reasons of the VM alone. Both sides write into recycled pages here.
rounds=${ROUNDS:-10}
shard=$(ls "$work"/big/part-*.safetensors | head -n1)
stop_server() { kill "$server"; wait "$server" 2> /dev/null || true; server=; }
# push_timed RUN NAME: the whole command's start and end, and the upload's seconds as push reports it
push_timed() {
  local t0 t1 out
  t0=$EPOCHREALTIME; out=$("$bin" push "$1" --name "$2" --to "$url" --token-file "$work/token"); t1=$EPOCHREALTIME
  echo "$t0 $t1 $(sed -n 's/.* in \([0-9.]*\) s .*/\1/p' <<< "$out")"
}
: > "$work/times"
for i in $(seq "$rounds"); do
  rm -rf "$work/uroot"; start_server "$work/uroot"; sync
  read -r t0 t1 inside <<< "$(push_timed "$work/big" big)"
  t2=$EPOCHREALTIME; cp -r "$work/big" "$work/copy"; t3=$EPOCHREALTIME
  rm -rf "$work/copy"; sync
  t4=$EPOCHREALTIME; cp -r "$work/big" "$work/copys"; sync; t5=$EPOCHREALTIME
  rm -rf "$work/copys"
  # the shard's bytes written straight to the disk (O_DIRECT, 4 MiB at a time) and fsynced: what another durable
  # writer takes
  t6=$EPOCHREALTIME; dd if="$shard" of="$work/direct" bs=4M oflag=direct conv=fsync status=none; t7=$EPOCHREALTIME
  rm -f "$work/direct"
  echo "$t0 $t1 $inside $t2 $t3 $t4 $t5 $t6 $t7" >> "$work/times"
  stop_server
done
: > "$work/times4"
for i in $(seq "$rounds"); do
  rm -rf "$work/uroot"; start_server "$work/uroot"; sync
  read -r t0 t1 inside <<< "$(push_timed "$work/huge" huge)"
  stop_server; rm -rf "$work/uroot"; sync
  t2=$EPOCHREALTIME; cp -r "$work/huge" "$work/copy"; t3=$EPOCHREALTIME
  rm -rf "$work/copy"; sync
  # cp -r + sync: what the disk took in this round, for reading a slow push (a durable one waits for the disk)
  t4=$EPOCHREALTIME; cp -r "$work/huge" "$work/copys"; sync; t5=$EPOCHREALTIME
  rm -rf "$work/copys"
  echo "$t0 $t1 $inside $t2 $t3 $t4 $t5" >> "$work/times4"
done
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
# each push against the cp -r of its own round (seconds apart, so the same minute of this machine): median of the ratios
whole = statistics.median((r[4] - r[3]) / (r[1] - r[0]) for r in rows)
upload = statistics.median((r[4] - r[3]) / r[2] for r in rows)
print(f"of cp -r's speed in the same round (median of the rounds' ratios): the whole command {whole:.2f}, the upload {upload:.2f}")
print("pushes (s): " + " ".join(f"{r[1] - r[0]:.3f}" for r in rows))
PY
bytes4=$(du -cb "$work/huge" | tail -n1 | cut -f1)
python3 - "$bytes4" "$work/times4" <<'PY'
import statistics, sys
b = int(sys.argv[1])
rows = [list(map(float, l.split())) for l in open(sys.argv[2])]
push, inside, cp = (statistics.median(v) for v in ([r[1] - r[0] for r in rows], [r[2] for r in rows], [r[4] - r[3] for r in rows]))
print(f"\n{b / 1e6:.0f} MB run ({len(rows)} rounds, medians): push {push:.4f} s whole, {inside:.4f} s upload; cp -r {cp:.4f} s; "
      f"of cp -r's speed: whole command {cp / push:.2f}, upload {cp / inside:.2f}")
print(f"of cp -r's speed in the same round (median of the rounds' ratios): whole command "
      f"{statistics.median((r[4] - r[3]) / (r[1] - r[0]) for r in rows):.2f}, upload {statistics.median((r[4] - r[3]) / r[2] for r in rows):.2f}")
print(f"cp -r + sync {statistics.median(r[6] - r[5] for r in rows):.4f} s, of its speed: whole command "
      f"{statistics.median(r[6] - r[5] for r in rows) / push:.2f}")
print("pushes (s): " + " ".join(f"{r[1] - r[0]:.3f}" for r in rows) + "; cp -r (s): " + " ".join(f"{r[4] - r[3]:.3f}" for r in rows)
      + "; cp -r + sync (s): " + " ".join(f"{r[6] - r[5]:.3f}" for r in rows))
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
