#!/bin/sh
# Throughput of `moeflip trace` and `moeflip diff` against the number of MPI ranks (issue 22), on the embedded
# default model (models/tiny-olmoe). One rank is the command run alone with --threads 1; N > 1 ranks are
# `mpirun --oversubscribe -n N`, each rank on the core mpirun binds it to. For each, best of REPEATS (3) runs:
# wall time, the CPU time of the command and everything it started (user + system, every rank summed), and the
# CPU time of its busiest rank (GNU time around each rank): on a machine that other work shares, the wall time of
# N ranks depends on the cores the others leave, while the busiest rank's CPU time is about what the wall time is
# on an idle one (the ranks wait for each other by polling every millisecond, at next to no CPU).
#   - startup: `mpirun -n N true`, what a job pays before moeflip starts;
#   - trace: the model's 32 held-out passages (4,948 tokens), bf16 native and emu:hopper, --record logits;
#   - diff, logits: fp64 against bf16 of those passages, full logits, --bootstrap 10000 (the accumulation of the
#     logits dominates);
#   - diff, many sequences: 2,000 sequences of 16 tokens, --record routing, --bootstrap 10000 (the bootstrap
#     dominates: it grows with resamples x sequences).
# Every MPI output is compared with the one-process output (cmp): a difference stops the script.
#   sh bench/mpi_bench.sh [BUILD_DIR] [RANKS...]        defaults: build 1 2 (needs mpirun and GNU time)
set -eu
BUILD=${1:-build}
[ $# -gt 0 ] && shift
RANKS=${*:-1 2}
BIN=$(cd "$BUILD" && pwd)/moeflip
MODEL=$(cd "$(dirname "$0")/.." && pwd)/models/tiny-olmoe
WORK=$(mktemp -d /tmp/moeflip-mpi-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
python3 - "$BIN" "$MODEL" "$WORK" "${REPEATS:-3}" $RANKS <<'PY'
import filecmp, json, os, random, resource, shutil, subprocess, sys, time
bin, model, work, repeats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ranks = [int(r) for r in sys.argv[5:]]

def launch(n):
    return [] if n == 1 else ["mpirun", "--oversubscribe", "-n", str(n)]

def timed(cmd, before=None):
    """best wall, best CPU (user + system of every descendant) and best busiest rank's CPU of `repeats` runs"""
    wall = cpu = busiest = float("inf")
    mpi = cmd and cmd[0] == "mpirun"
    if mpi:   # each rank under GNU time, into a file of its own
        n = cmd.index("-n") + 2
        cmd = cmd[:n] + ["sh", "-c", 'exec /usr/bin/time -f "%U %S" -o "$0.$OMPI_COMM_WORLD_RANK" "$@"',
                         os.path.join(work, "rank-cpu")] + cmd[n:]
    for _ in range(repeats):
        if before: before()
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = min(wall, t1 - t0)
        c = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        cpu = min(cpu, c)
        if mpi:
            ranks_cpu = []
            for f in os.listdir(work):
                if f.startswith("rank-cpu."):
                    u, s_ = open(os.path.join(work, f)).read().split()[-2:]
                    ranks_cpu.append(float(u) + float(s_))
                    os.unlink(os.path.join(work, f))
            busiest = min(busiest, max(ranks_cpu))
        else:
            busiest = min(busiest, c)
    return wall, cpu, busiest

def one(n):   # one process runs one thread; a rank takes its core
    return ["--threads", "1"] if n == 1 else []

rows = []
def row(work_name, n, t, amount, unit, base):
    wall, cpu, busiest = t
    rows.append("| %s | %d | %.3f | %.3f | %.3f | %.0f %s | %.2f | %.2f |" % (work_name, n, wall, cpu, busiest,
                amount / wall, unit, base[0] / wall, base[2] / busiest))

for n in ranks:
    if n > 1:
        w, c, b = timed(["mpirun", "--oversubscribe", "-n", str(n), "true"])
        rows.append("| startup (`mpirun -n %d true`) | %d | %.3f | %.3f | %.3f | | | |" % (n, n, w, c, b))

prompts = os.path.join(model, "prompts.jsonl")
tokens = sum(len(json.loads(l)["tokens"]) for l in open(prompts) if l.strip())
runs = {}
for numerics in ("native", "emu:hopper"):
    base = None
    for n in ranks:
        out = os.path.join(work, "trace-%s-%d" % (numerics.replace(":", "_"), n))
        cmd = launch(n) + [bin, "trace", "-q", "--model", model, "--input", prompts, "--out", out, "--precision", "bf16",
                           "--numerics", numerics] + one(n)
        t = timed(cmd, before=lambda: shutil.rmtree(out, ignore_errors=True))
        subprocess.run([bin, "export", out, "--format", "jsonl", "-o", out + ".jsonl"], check=True)
        if base is None: base, first = t, out
        elif not filecmp.cmp(first + ".jsonl", out + ".jsonl", shallow=False):
            sys.exit("trace on %d ranks exported something else than one process" % n)
        row("trace, bf16 %s, %d tokens" % (numerics, tokens), n, t, tokens, "tokens/s", base)
    runs[numerics] = first

ref = os.path.join(work, "ref")
subprocess.run([bin, "trace", "-q", "--model", model, "--input", prompts, "--out", ref, "--precision", "fp64", "--threads", "1"], check=True)

# many short sequences (token ids below 256, byte-level tokens of the model's vocabulary), routing only
many = os.path.join(work, "many.jsonl")
rng = random.Random(22)
with open(many, "w") as f:
    for i in range(2000):
        f.write(json.dumps({"id": "s%04d" % i, "tokens": [rng.randrange(32, 232) for _ in range(16)]}) + "\n")
mref, mtgt = os.path.join(work, "mref"), os.path.join(work, "mtgt")
for out, p in ((mref, "fp64"), (mtgt, "bf16")):
    subprocess.run([bin, "trace", "-q", "--model", model, "--input", many, "--out", out, "--precision", p,
                    "--record", "routing", "--threads", "1"], check=True)

def du(*dirs):
    return sum(os.path.getsize(os.path.join(d, f)) for d in dirs for f in os.listdir(d))

for name, a, b in (("diff, logits, 32 sequences", ref, runs["native"]), ("diff, routing, 2,000 sequences", mref, mtgt)):
    mb = du(a, b) / 1e6
    for boot in (10000, 0):
        base = None
        for n in ranks:
            out = os.path.join(work, "d%d-%d.json" % (boot, n))
            t = timed(launch(n) + [bin, "diff", a, b, "-o", out, "-q", "--bootstrap", str(boot)])
            if base is None: base, first = t, out
            elif not filecmp.cmp(first, out, shallow=False):
                sys.exit("diff on %d ranks wrote another diff.json than one process" % n)
            row("%s (%.0f MB of runs), --bootstrap %d" % (name, mb, boot), n, t, mb, "MB/s", base)

print("| work | ranks | best wall (s) | best CPU, all ranks (s) | best CPU, busiest rank (s) | throughput (wall) | "
      "speed-up (wall) | speed-up (busiest rank's CPU) |")
print("|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
PY
