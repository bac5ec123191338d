#!/usr/bin/env bash
# CPU prefill throughput and peak memory: moeflip `trace` against llama.cpp's `llama-bench`, same weights.
#
# usage: bench/cpu_vs_llamacpp.sh MOEFLIP_BUILD LLAMA_BUILD MODEL_DIR THREADS [options]
#
#   MOEFLIP_BUILD  moeflip's build directory (holds the `moeflip` binary)
#   LLAMA_BUILD    llama.cpp's CPU build directory (holds bin/llama-bench); see bench/README.md
#   MODEL_DIR      a Hugging Face OLMoE checkpoint (config.json + model.safetensors, or sharded with
#                  model.safetensors.index.json), e.g. models/tiny-olmoe or a `moeflip synth` directory
#   THREADS        threads for both engines
#
# options:
#   --dtypes "bf16 f32"   which weights to compare: bf16 = moeflip --precision bf16 vs llama.cpp BF16,
#                         f32 = moeflip --precision fp32 vs llama.cpp F32   [bf16 f32]
#   --lengths "64 512"    tokens per prompt   [64 512]
#   --reps N              rounds (see below)   [3]
#   --tokens N            tokens per round and engine: N_PROMPTS = ceil(N/T) prompts of T tokens   [2048]
#   --work DIR            where the GGUF files, prompts and runs go; GGUFs already there are reused
#                         [a temporary directory, removed at the end]
#   --keep                keep the temporary directory
#   --allow-long          also run lengths above the model's max_position_embeddings (skipped by default:
#                         neither engine refuses them, but those positions are untrained)
#   --llama-args "..."    extra llama-bench arguments, e.g. "-fa off" (llama.cpp's defaults are an F16 KV
#                         cache and flash attention "auto", which is on for the CPU; llama-bench's -ctk/-ctv
#                         take f16, bf16 and quantised types, not f32)
#   --python PY           a Python 3 with numpy for bench/hf_to_gguf.py   [python3, else /usr/bin/python3]
#   --blocks              all of moeflip's rounds, then all of llama.cpp's, instead of alternating: for a model whose
#                         two copies (safetensors and GGUF) do not fit the page cache together, where alternating
#                         would read each copy from disk again every round
#
# What is timed: REPS rounds per (dtype, T), the engines taking turns so that a machine's changing load falls on
# both. A round is one `moeflip trace --record routing --threads THREADS` of N_PROMPTS random T-token prompts
# (tokens/s from its "computed in X s": every prompt's forward pass, with the logits of every position, and the
# shard writing; model load excluded; one untimed warm-up trace comes first), then one `llama-bench -p T -n 0
# -t THREADS -embd 1 -r N_PROMPTS` (its own warm-up first; tokens/s = T / mean prompt time). `-embd 1` turns
# embeddings on, and llama.cpp then outputs every position of the batch, so the output head runs at all T
# positions as in a moeflip trace (without it only the last position's logits are computed). The spread is
# over rounds. Peak RSS: the largest maximum resident set size (/usr/bin/time -v) of any of the engine's
# processes (llama.cpp maps the GGUF, so its RSS counts the weights' pages it touched).
#
# Output: one markdown table on stdout; progress on stderr. Memory: a dtype whose weights (as f32 or bf16)
# exceed MemAvailable is skipped (OLMoE-1B-7B in f32 needs ~28 GB). Disk: the GGUFs take about the
# checkpoint's size (bf16) and twice that (f32).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && usage 0
[ $# -ge 4 ] || usage
MF_BUILD=$1 LLAMA_BUILD=$2 MODEL=$3 THREADS=$4
shift 4
DTYPES="bf16 f32" LENGTHS="64 512" REPS=3 TOKENS=2048 WORK="" KEEP=0 ALLOW_LONG=0 LLAMA_ARGS="" PY="" BLOCKS=0
while [ $# -gt 0 ]; do
  case $1 in
    --dtypes) DTYPES=$2; shift 2 ;;
    --lengths) LENGTHS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --allow-long) ALLOW_LONG=1; shift ;;
    --llama-args) LLAMA_ARGS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --blocks) BLOCKS=1; shift ;;
    *) echo "unknown option $1" >&2; usage ;;
  esac
done

HERE=$(cd "$(dirname "$0")" && pwd)
MF="$MF_BUILD/moeflip"
LB="$LLAMA_BUILD/bin/llama-bench"
TIME=/usr/bin/time
log() { echo "cpu_vs_llamacpp: $*" >&2; }
die() { log "$*"; exit 1; }
[ -x "$MF" ] || die "$MF: no moeflip binary (cmake --build $MF_BUILD --target moeflip)"
[ -x "$LB" ] || die "$LB: no llama-bench (see bench/README.md)"
[ -x "$TIME" ] || die "$TIME missing (apt-get install time)"
[ -f "$MODEL/config.json" ] || die "$MODEL: no config.json"
if [ -z "$PY" ]; then
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null; then PY=$p; break; fi
  done
  [ -n "$PY" ] || die "no python3 with numpy (apt-get install python3-numpy)"
fi

if [ -z "$WORK" ]; then
  WORK=$(mktemp -d /tmp/cpu_vs_llamacpp.XXXXXX)
  [ "$KEEP" = 1 ] || trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK"
NAME=$(basename "$(cd "$MODEL" && pwd)")
RESULTS="$WORK/results.tsv"
: > "$RESULTS"

# model facts: max_position_embeddings, vocab size, bytes of the weights as f32 and as bf16
read -r MAXPOS VOCAB F32_BYTES BF16_BYTES < <("$PY" - "$MODEL" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
idx = os.path.join(d, "model.safetensors.index.json")
files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
n = 0
for fn in files:
    with open(os.path.join(d, fn), "rb") as f:
        h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    for k, v in h.items():
        if k != "__metadata__":
            c = 1
            for s in v["shape"]:
                c *= s
            n += c
print(cfg.get("max_position_embeddings", 0), cfg["vocab_size"], 4 * n, 2 * n)
EOF
)
[ -n "${BF16_BYTES:-}" ] || die "$MODEL: could not read config.json and the safetensors headers"
MEMAVAIL=$(awk '/MemAvailable/ {printf "%.0f", $2 * 1024}' /proc/meminfo)

# peak RSS (MiB) from a /usr/bin/time -v log
peak_mib() { awk -F: '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$1"; }

MF_RATES=() LB_RATES=() MF_RSS=0 LB_RSS=0

moeflip_once() {  # prec prompts-file: one trace; sets R (tokens/s) and RSS (MiB)
  local line
  rm -rf "$WORK/run"
  if ! "$TIME" -v -o "$WORK/time.log" "$MF" trace --model "$MODEL" --input "$2" --out "$WORK/run" \
      --precision "$1" --threads "$THREADS" --record routing > "$WORK/mf.log" 2>&1; then
    cat "$WORK/mf.log" >&2; die "moeflip trace failed"
  fi
  rm -rf "$WORK/run"
  line=$(grep 'computed in' "$WORK/mf.log" | tail -n 1)
  [ -n "$line" ] || { cat "$WORK/mf.log" >&2; die "no 'computed in' line from moeflip trace"; }
  R=$(sed -E 's/.*\(([0-9]+) computed in ([0-9.]+) s.*/\1 \2/' <<<"$line" | awk '{printf "%.2f", $1 / $2}')
  RSS=$(peak_mib "$WORK/time.log")
}

llama_once() {  # gguf T prompts: one llama-bench of `prompts` T-token prompts; sets R (tokens/s) and RSS
  # shellcheck disable=SC2086
  if ! "$TIME" -v -o "$WORK/time.log" "$LB" -m "$1" -p "$2" -n 0 -t "$THREADS" -embd 1 -r "$3" -o json \
      $LLAMA_ARGS > "$WORK/lb.json" 2> "$WORK/lb.err"; then
    cat "$WORK/lb.err" >&2; die "llama-bench failed"
  fi
  # the round's rate: all its tokens over all its time (llama-bench's avg_ns is the mean time of one prompt)
  R=$("$PY" -c 'import json,sys; j=json.load(open(sys.argv[1]))[0]; print("%.2f" % (j["n_prompt"] / (j["avg_ns"] * 1e-9)))' \
      "$WORK/lb.json")
  RSS=$(peak_mib "$WORK/time.log")
  cp "$WORK/lb.json" "$WORK/llama-bench-last.json"
}

compare() {  # dtype T prompts-file N: REPS rounds, each one moeflip trace of the N prompts and one llama-bench
  local dtype=$1 T=$2 prompts=$3 N=$4 prec i
  prec=$([ "$dtype" = f32 ] && echo fp32 || echo bf16)
  MF_RATES=() LB_RATES=() MF_RSS=0 LB_RSS=0
  moeflip_once "$prec" "$prompts"   # warm-up, untimed (llama-bench warms up by itself)
  if [ "$BLOCKS" = 1 ]; then
    for i in $(seq "$REPS"); do
      moeflip_once "$prec" "$prompts"
      MF_RATES+=("$R"); if [ "$RSS" -gt "$MF_RSS" ]; then MF_RSS=$RSS; fi
      log "$dtype T=$T round $i: moeflip ${MF_RATES[-1]} tokens/s"
    done
    for i in $(seq "$REPS"); do
      llama_once "$WORK/$NAME-$dtype.gguf" "$T" "$N"
      LB_RATES+=("$R"); if [ "$RSS" -gt "$LB_RSS" ]; then LB_RSS=$RSS; fi
      log "$dtype T=$T round $i: llama.cpp ${LB_RATES[-1]} tokens/s"
    done
  else
    for i in $(seq "$REPS"); do
      moeflip_once "$prec" "$prompts"
      MF_RATES+=("$R"); if [ "$RSS" -gt "$MF_RSS" ]; then MF_RSS=$RSS; fi
      llama_once "$WORK/$NAME-$dtype.gguf" "$T" "$N"
      LB_RATES+=("$R"); if [ "$RSS" -gt "$LB_RSS" ]; then LB_RSS=$RSS; fi
      log "$dtype T=$T round $i: moeflip ${MF_RATES[-1]}, llama.cpp ${LB_RATES[-1]} tokens/s"
    done
  fi
  printf '%s\tmoeflip\t%s\t%s\t%s\t%s\n' "$NAME" "$prec" "$T" "$(IFS=,; echo "${MF_RATES[*]}")" "$MF_RSS" >> "$RESULTS"
  printf '%s\tllama.cpp\t%s\t%s\t%s\t%s\n' "$NAME" "${dtype^^}" "$T" "$(IFS=,; echo "${LB_RATES[*]}")" "$LB_RSS" \
    >> "$RESULTS"
}

DONE_DTYPES=""
for dtype in $DTYPES; do
  case $dtype in bf16) need=$BF16_BYTES ;; f32) need=$F32_BYTES ;; *) die "dtype $dtype: bf16 or f32" ;; esac
  if [ "$need" -gt "$MEMAVAIL" ]; then
    log "skipping $dtype: the weights take $((need >> 20)) MiB, MemAvailable is $((MEMAVAIL >> 20)) MiB"
    continue
  fi
  gguf="$WORK/$NAME-$dtype.gguf"
  if [ ! -s "$gguf" ]; then
    log "converting $MODEL to $gguf"
    "$PY" "$HERE/hf_to_gguf.py" "$MODEL" "$gguf" --outtype "$dtype" -q
  fi
  DONE_DTYPES="$DONE_DTYPES $dtype"
done
[ -n "$DONE_DTYPES" ] || die "nothing to run"

SKIPPED=""
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for T in $LENGTHS; do
  if [ "$MAXPOS" -gt 0 ] && [ "$T" -gt "$MAXPOS" ] && [ "$ALLOW_LONG" = 0 ]; then
    log "skipping T=$T: above max_position_embeddings $MAXPOS (--allow-long runs it)"
    SKIPPED="$SKIPPED $T"
    continue
  fi
  N=$(( (TOKENS + T - 1) / T ))
  prompts="$WORK/prompts-$T.jsonl"
  "$PY" - "$prompts" "$N" "$T" "$VOCAB" <<'EOF'
import json, random, sys
path, n, t, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(1234 + t)
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": f"r{t}-{i}", "tokens": [rng.randrange(v) for _ in range(t)]}) + "\n")
EOF
  for dtype in $DONE_DTYPES; do
    compare "$dtype" "$T" "$prompts" "$N"
  done
done

LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
BLOCKS=$BLOCKS "$PY" - "$RESULTS" "$THREADS" "$REPS" "$TOKENS" "$WORK/llama-bench-last.json" "$MAXPOS" "$SKIPPED" "$LLAMA_ARGS" \
  "$LOAD_START" "$LOAD_END" <<'EOF'
import json, os, statistics, sys
res, threads, reps, tokens, lbinfo, maxpos, skipped, largs, load0, load1 = sys.argv[1:11]
rows = [l.rstrip("\n").split("\t") for l in open(res) if l.strip()]
median = {}
print("| model | engine | dtype | tokens/prompt | tokens/s mean ± sd | median | min–max | n | peak RSS MiB |"
      " llama.cpp / moeflip (medians) |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
for model, eng, dt, T, rates, rss in rows:
    r = [float(x) for x in rates.split(",")]
    m, med = statistics.mean(r), statistics.median(r)
    sd = statistics.stdev(r) if len(r) > 1 else 0.0
    key = (model, dt.lower().replace("fp32", "f32"), T)
    ratio = ""
    if eng == "moeflip":
        median[key] = med
    elif key in median:
        ratio = "%.2f" % (med / median[key])
    print(f"| {model} | {eng} | {dt} | {T} | {m:.0f} ± {sd:.0f} | {med:.0f} | {min(r):.0f}–{max(r):.0f} | {len(r)} |"
          f" {rss} | {ratio} |")
print()
note = (f"{threads} threads; n rounds, each one `moeflip trace --record routing` of ceil({tokens}/T) T-token prompts"
        f" (after one untimed warm-up trace) then one `llama-bench -p T -n 0 -embd 1 -r ceil({tokens}/T)` (its own"
        f" warm-up first); a round's tokens/s is its tokens over its time.")
if os.environ.get("BLOCKS") == "1":
    note += " Engines in blocks (all moeflip rounds, then all llama.cpp rounds), not alternating."
if os.path.exists(lbinfo):
    j = json.load(open(lbinfo))[0]
    note += (f" llama.cpp {j['build_commit']} (build {j['build_number']}), KV cache {j['type_k']}/{j['type_v']},"
             f" flash_attn {j['flash_attn']} (-1 = auto), n_batch {j['n_batch']}, n_ubatch {j['n_ubatch']};"
             f" CPU {j['cpu_info']}.")
note += f" Load average (1, 5, 15 min) {load0} at the start, {load1} at the end."
if largs:
    note += f" Extra llama-bench args: `{largs}`."
if skipped.strip():
    note += f" Skipped lengths above max_position_embeddings {maxpos}:{skipped}."
print(note)
EOF
