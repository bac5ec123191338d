#!/usr/bin/env python3
"""cuBLAS bf16 GEMM (fp32 output) on an NVIDIA GPU against moeflip's emu:hopper.

Builds the emulator's C sources (numerics/mma.c, emu_gemm.c, emu_fast.c,
core/status.c, core/dtype.c and tools/cublas_vs_emu_shim.c) into a shared
library with gcc, loads it with ctypes, and for each shape (M, N, K):
  - draws seeded N(0, 1) operands, rounded to bf16 (A [M, K], B [K, N]);
  - runs them through PyTorch on CUDA: torch.mm(a, b, out_dtype=torch.float32)
    (fp32 output), torch.addmm(zeros_f32, a, b, out_dtype=torch.float32), and
    the plain bf16-output torch.mm(a, b), under each preferred BLAS library
    (cublas, cublaslt), with allow_bf16_reduced_precision_reduction = False;
    the CUDA kernels each call launched are recorded with torch.profiler;
  - emulates the same product with wgmma.m64n8k16.f32.bf16.bf16 (Hopper,
    zero products excluded) under K-schedules acc x split x reduce, and, as
    hypotheses only, with other fusion widths (mma.m16n8k8 = k8, and
    "wgmma" k32 / k64, which are no real instructions: one fused dot-add
    over 32 or 64 products);
  - compares bit patterns: the fraction of elements equal in fp32, equal after
    rounding both to bf16 (nearest even), and the ulp distance.

Where the plain k16 chain misses (split-K kernels), split-K layouts the schedule
grid cannot express are tried too: K tiles of 64 or 16 dealt to S partial
chains (contiguous balanced, contiguous ceil(T/S) each, or round-robin), the
partials added in fp32 in order or as a tree; --save-bits keeps the operands and
GPU results of those shapes (OUT/bits_MxNxK.npz).

Writes OUT/cublas_vs_emu.csv (one row per shape x GPU call x schedule),
OUT/summary.json and prints a markdown summary. Needs torch (CUDA) and numpy.

  python3 tools/cublas_vs_emu.py --out DIR [--threads 16] [--seed 0]
  python3 tools/cublas_vs_emu.py --selftest    # library only: no torch, no numpy
"""
import argparse
import array
import ctypes
import datetime
import json
import os
import platform
import struct
import subprocess
import sys
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["numerics/mma.c", "numerics/emu_gemm.c", "numerics/emu_fast.c", "core/status.c", "core/dtype.c",
           "tools/cublas_vs_emu_shim.c"]
ARCH = b"Hopper"
K16 = "wgmma.m64n8k16.f32.bf16.bf16"
FP64 = "fp64"   # baseline: exact-ish sum in double, one rounding to fp32
# name, k, whether it is a real instruction
INSTRS = [(K16, 16, True), ("mma.m16n8k8.f32.bf16.bf16.f32", 8, True),
          ("wgmma.m64n8k32.f32.bf16.bf16", 32, False), ("wgmma.m64n8k64.f32.bf16.bf16", 64, False)]
SHAPES = [(27, 576, 576), (64, 2048, 1024), (128, 1408, 2048), (256, 256, 4096), (512, 512, 2048), (512, 4096, 512)]
# extra shapes, small M x N and long K, where cuBLAS is more likely to pick a split-K kernel
EXTRA_SHAPES = [(128, 128, 8192), (64, 1024, 8192)]
SPLITS = [1, 2, 3, 4, 6, 8, 9, 12, 16]
ACCS = [1, 2, 4, 8]


def build(lib_path):
    cmd = ["gcc", "-O2", "-fopenmp", "-shared", "-fPIC", "-std=c17", "-ffp-contract=off", "-fno-math-errno",
           "-D_GNU_SOURCE", "-I" + os.path.join(ROOT, "core"), "-I" + os.path.join(ROOT, "numerics")]
    cmd += [os.path.join(ROOT, s) for s in SOURCES] + ["-lm", "-o", lib_path]
    print("build:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(lib_path)
    lib.emu.argtypes = [ctypes.c_char_p, ctypes.c_char_p] + [ctypes.c_int] * 7 + [ctypes.c_void_p] * 3 + [ctypes.c_int]
    lib.emu.restype = ctypes.c_int
    return lib


def schedules(K):
    """(instr, acc, split, reduce) for one K; reduce only where it matters
    (more than two accumulators or ranges). The k16 grid comes first."""
    out = []
    for name, k, _real in INSTRS:
        steps = (K + k - 1) // k
        for split in SPLITS:
            if steps % split or (k != 16 and split not in (1, 2, 4, 8)):
                continue
            for acc in ACCS:
                if acc > steps // split or (k != 16 and acc > 2):
                    continue
                for red in (0, 1):
                    if red == 1 and acc <= 2 and split <= 2:
                        continue
                    out.append((name, acc, split, red))
    return out


def sched_name(instr, acc, split, red):
    k = instr.split(".")[1].split("k")[-1]
    return f"k{k}:acc={acc}:split={split}:reduce={'tree' if red else 'seq'}"


# ---- selftest: the library alone (array + ctypes) -----------------------

def _bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def _f32(u):
    return struct.unpack("<f", struct.pack("<I", u))[0]


def selftest(lib_path):
    lib = build(lib_path)
    import random
    rng = random.Random(1)
    ok = True
    # small integers: every schedule gives the exact sum
    M, N, K = 5, 7, 96
    A = array.array("H", [_bf16(float(rng.randint(-4, 4))) for _ in range(M * K)])
    B = array.array("H", [_bf16(float(rng.randint(-4, 4))) for _ in range(K * N)])
    exact = [float(sum(_f32(A[i * K + k] << 16) * _f32(B[k * N + j] << 16) for k in range(K)))
             for i in range(M) for j in range(N)]
    for instr, acc, split, red in schedules(K):
        C = array.array("I", [0] * (M * N))
        rc = lib.emu(ARCH, instr.encode(), acc, split, red, 1, M, N, K, A.buffer_info()[0], B.buffer_info()[0],
                     C.buffer_info()[0], 2)
        got = [_f32(c) for c in C]
        if rc or got != exact:
            print("FAIL exact", sched_name(instr, acc, split, red), rc)
            ok = False
    # random: schedules differ from each other only by rounding; split=3 on 4 steps is refused
    M, N, K = 8, 9, 64
    A = array.array("H", [_bf16(rng.gauss(0, 1)) for _ in range(M * K)])
    B = array.array("H", [_bf16(rng.gauss(0, 1)) for _ in range(K * N)])
    C = array.array("I", [0] * (M * N))
    for instr, acc, split, red in schedules(K):
        rc = lib.emu(ARCH, instr.encode(), acc, split, red, 1, M, N, K, A.buffer_info()[0], B.buffer_info()[0],
                     C.buffer_info()[0], 2)
        for e in range(M * N):
            i, j = divmod(e, N)
            ref = sum(_f32(A[i * K + k] << 16) * _f32(B[k * N + j] << 16) for k in range(K))
            if rc or abs(_f32(C[e]) - ref) > 1e-5 * (1 + abs(ref)):
                print("FAIL close", sched_name(instr, acc, split, red), e, _f32(C[e]), ref)
                ok = False
                break
    rc = lib.emu(ARCH, K16.encode(), 1, 3, 0, 1, M, N, K, A.buffer_info()[0], B.buffer_info()[0], C.buffer_info()[0], 1)
    if rc == 0:
        print("FAIL: split=3 of 4 k-steps accepted")
        ok = False
    print("selftest", "ok" if ok else "FAILED")
    return 0 if ok else 1


# ---- the comparison (torch + numpy) ------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lib", default="/tmp/libmfnum.so")
    ap.add_argument("--emu-budget", type=float, default=180.0,
                    help="seconds of emulation after which the hypothetical fusion widths are skipped")
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: the six of the issue)")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--save-bits", action="store_true",
                    help="write OUT/bits_MxNxK.npz (operands and GPU results) for shapes the plain chain misses")
    args = ap.parse_args()
    if args.selftest:
        return selftest(args.lib)

    import numpy as np
    import torch

    shapes = SHAPES + EXTRA_SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    os.makedirs(args.out, exist_ok=True)
    lib = build(args.lib)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    dev = torch.device("cuda")
    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
        "python": platform.python_version(), "threads": args.threads, "seed": args.seed,
        "preferred_blas_library_default": str(torch.backends.cuda.preferred_blas_library()),
    }
    try:
        env["cuda_compiled_version"] = torch._C._cuda_getCompiledVersion()   # the CUDA torch was built with
    except Exception:
        pass
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
    except Exception:
        pass
    print("env:", json.dumps(env), flush=True)

    def u16(t):
        return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16).reshape(-1)

    def u32(t):
        return t.contiguous().view(torch.int32).cpu().numpy().view(np.uint32).reshape(-1)

    def to_bf16(u):   # fp32 bits -> bf16 bits, nearest even (no NaNs here)
        u = u.astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    def ordered(u):   # fp32 bits -> integers in value order
        s = u.astype(np.int64)
        return np.where(s & 0x80000000, -(s & 0x7FFFFFFF), s)

    def kernels_of(fn):
        from torch.profiler import profile, ProfilerActivity
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = []
        for ev in prof.events():
            if str(getattr(ev, "device_type", "")).endswith("CUDA") and ev.name not in names:
                names.append(ev.name)
        return names

    rows, summary = [], {"env": env, "shapes": []}
    t_emu_total = 0.0
    libs = ["cublas", "cublaslt"]
    blas_default = torch.backends.cuda.preferred_blas_library()
    for si, (M, N, K) in enumerate(shapes):
        g = torch.Generator().manual_seed(zlib.crc32(f"{args.seed}:{M}x{N}x{K}".encode()))
        a = torch.randn(M, K, generator=g).to(torch.bfloat16)
        b = torch.randn(K, N, generator=g).to(torch.bfloat16)
        A, B = u16(a), u16(b)
        ad, bd = a.to(dev), b.to(dev)
        zeros = torch.zeros(M, N, dtype=torch.float32, device=dev)
        calls = {
            "mm_out_f32": (lambda: torch.mm(ad, bd, out_dtype=torch.float32), "f32"),
            "addmm_out_f32": (lambda: torch.addmm(zeros, ad, bd, out_dtype=torch.float32), "f32"),
            "mm_bf16": (lambda: torch.mm(ad, bd), "bf16"),
        }
        def gemm_ex():   # cublasGemmEx straight from CuPy: bf16 in, fp32 out, CUBLAS_COMPUTE_32F, default algo
            import cupy
            from cupy_backends.cuda.libs import cublas as cb
            out = torch.empty(M, N, dtype=torch.float32, device=dev)
            one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
            # row-major C = A B is column-major C^T = B^T A^T: m = N, n = M
            cb.gemmEx(cupy.cuda.device.get_cublas_handle(), 0, 0, N, M, K, one.ctypes.data, bd.data_ptr(), 14, N,
                      ad.data_ptr(), 14, K, zero.ctypes.data, out.data_ptr(), 0, N, 68, -1)
            cupy.cuda.runtime.deviceSynchronize()
            return out
        gpu = {}   # variant -> (bits, kind)
        info = {"shape": [M, N, K], "calls": {}}
        for blas in libs:
            try:
                torch.backends.cuda.preferred_blas_library(blas)
            except Exception as e:
                print(f"preferred_blas_library({blas}) failed: {e}", flush=True)
                continue
            for cname, (fn, kind) in calls.items():
                v = f"{cname}@{blas}"
                try:
                    r1 = fn()
                    torch.cuda.synchronize()
                    r2 = fn()
                    torch.cuda.synchronize()
                except Exception as e:
                    print(f"{M}x{N}x{K} {v}: not available: {type(e).__name__}: {e}", flush=True)
                    info["calls"][v] = {"error": f"{type(e).__name__}: {e}"[:300]}
                    continue
                bits = u32(r1) if kind == "f32" else u16(r1)
                same = bool(torch.equal(r1.view(-1).view(torch.int16 if kind == "bf16" else torch.int32),
                                        r2.view(-1).view(torch.int16 if kind == "bf16" else torch.int32)))
                try:
                    kn = kernels_of(fn)
                except Exception as e:
                    kn = [f"(profiler failed: {e})"]
                gpu[v] = (bits, kind, r1.dtype)
                info["calls"][v] = {"dtype": str(r1.dtype), "repeat_identical": same, "kernels": kn}
                print(f"{M}x{N}x{K} {v}: dtype {r1.dtype}, repeat identical {same}, kernels {kn}", flush=True)
        torch.backends.cuda.preferred_blas_library(blas_default)
        try:
            r1, r2 = gemm_ex(), gemm_ex()
            same = bool(torch.equal(r1.view(torch.int32), r2.view(torch.int32)))
            try:
                kn = kernels_of(gemm_ex)
            except Exception as e:
                kn = [f"(profiler failed: {e})"]
            gpu["cublasGemmEx@cupy"] = (u32(r1), "f32", r1.dtype)
            info["calls"]["cublasGemmEx@cupy"] = {"dtype": "torch.float32", "repeat_identical": same, "kernels": kn}
            print(f"{M}x{N}x{K} cublasGemmEx@cupy: repeat identical {same}, kernels {kn}", flush=True)
        except Exception as e:
            print(f"{M}x{N}x{K} cublasGemmEx@cupy: not available: {type(e).__name__}: {e}", flush=True)
            info["calls"]["cublasGemmEx@cupy"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        # sanity: bf16-output mm equals the fp32-output mm rounded to bf16?
        for blas in libs:
            f, h = gpu.get(f"mm_out_f32@{blas}"), gpu.get(f"mm_bf16@{blas}")
            if f and h:
                info["calls"][f"mm_bf16@{blas}"]["equals_bf16_of_mm_out_f32"] = float(np.mean(to_bf16(f[0]) == h[0]))
        # cross-check between variants (same kernel => same bits)
        f32v = [v for v in gpu if gpu[v][1] == "f32"]
        info["gpu_pairwise_equal_fp32"] = {f"{x}|{y}": float(np.mean(gpu[x][0] == gpu[y][0]))
                                           for i, x in enumerate(f32v) for y in f32v[i + 1:]}

        best = {}
        union = {v: np.zeros(M * N, dtype=bool) for v in gpu if gpu[v][1] == "f32"}   # matched by some k16 schedule
        # first a baseline that is no schedule at all: the fp64 sum rounded once to fp32 (nearest)
        for instr, acc, split, red in [(FP64, 1, 1, 0)] + schedules(K):
            real = instr == K16 or instr.startswith("mma.")
            if instr not in (K16, FP64) and t_emu_total > args.emu_budget:
                continue
            t0 = time.time()
            if instr == FP64:
                af = (A.astype(np.uint32) << 16).view(np.float32).reshape(M, K).astype(np.float64)
                bf = (B.astype(np.uint32) << 16).view(np.float32).reshape(K, N).astype(np.float64)
                C = (af @ bf).astype(np.float32).view(np.uint32).reshape(-1)
                rc, sn = 0, "fp64->fp32 (baseline)"
            else:
                C = np.zeros(M * N, dtype=np.uint32)
                rc = lib.emu(ARCH, instr.encode(), acc, split, red, 1, M, N, K, A.ctypes.data, B.ctypes.data,
                             C.ctypes.data, args.threads)
                sn = sched_name(instr, acc, split, red)
            dt = time.time() - t0
            t_emu_total += dt
            if rc:
                print(f"emu {sn} failed: {rc}", flush=True)
                continue
            Cb = to_bf16(C)
            for v, (bits, kind, _dt) in gpu.items():
                if kind == "f32":
                    hit = C == bits
                    if instr == K16:
                        union[v] |= hit
                    eq32 = float(np.mean(hit))
                    eq16 = float(np.mean(Cb == to_bf16(bits)))
                    d = np.abs(ordered(C) - ordered(bits))
                    maxulp, meanulp = int(d.max()), float(d.mean())
                else:
                    eq32 = ""
                    eq16 = float(np.mean(Cb == bits))
                    maxulp = meanulp = ""
                rows.append({"M": M, "N": N, "K": K, "gpu_call": v, "instr": instr, "real_instr": int(real),
                             "acc": acc, "split": split, "reduce": "tree" if red else "seq", "zero_rule": 1,
                             "eq_fp32": eq32, "eq_bf16": eq16, "max_ulp_fp32": maxulp,
                             "mean_ulp_fp32": meanulp, "emu_s": round(dt, 3)})
                if instr == FP64:
                    continue
                key = (v, "real" if real else "any")
                score = eq32 if kind == "f32" else eq16
                for kk in {key, (v, "any")}:
                    if kk not in best or score > best[kk][0]:
                        best[kk] = (score, sn, eq16, maxulp, meanulp)
            print(f"{M}x{N}x{K} {sn}: {dt:.2f}s  " + "  ".join(
                f"{r['gpu_call']}={r['eq_fp32'] if r['eq_fp32'] != '' else r['eq_bf16']:.4f}"
                for r in rows[-len(gpu):]), flush=True)
        plain = {r["gpu_call"]: (r["eq_fp32"], r["eq_bf16"]) for r in rows
                 if (r["M"], r["N"], r["K"]) == (M, N, K) and r["instr"] == K16 and r["acc"] == 1 and r["split"] == 1}
        info["plain_k16"] = plain
        info["fp64_baseline"] = {r["gpu_call"]: (r["eq_fp32"], r["eq_bf16"]) for r in rows
                                 if (r["M"], r["N"], r["K"]) == (M, N, K) and r["instr"] == FP64}
        info["eq_fp32_any_k16_schedule"] = {v: float(np.mean(u)) for v, u in union.items()}
        print(f"{M}x{N}x{K} matched by some k16 schedule: " + json.dumps(info["eq_fp32_any_k16_schedule"]), flush=True)
        info["best"] = {f"{v}|{w}": {"score": s[0], "schedule": s[1], "eq_bf16": s[2], "max_ulp": s[3],
                                     "mean_ulp": s[4]} for (v, w), s in best.items()}
        print(f"{M}x{N}x{K} best: " + json.dumps(info["best"]), flush=True)

        # Where the plain chain is not exact (a split-K kernel, say): split-K layouts the schedule grid cannot
        # express. K is cut into tiles of `tile` (16 or 64) and the tiles go to S partial chains, either
        # contiguous (uneven where S does not divide the tile count: the first T % S get one more tile, "bal",
        # or each gets ceil(T / S) and the last the rest, "ceil") or dealt round-robin ("rr"); each partial
        # is a plain k16 chain from zero, and the partials are added in fp32 in order or as a pairwise tree.
        ref = gpu.get("mm_out_f32@cublas")
        if ref and any(p[0] != "" and p[0] < 1.0 for p in plain.values()):
            if args.save_bits:
                np.savez_compressed(os.path.join(args.out, f"bits_{M}x{N}x{K}.npz"), A=A, B=B,
                                    **{v.replace("@", "_at_"): g_[0] for v, g_ in gpu.items()})
            hyp = []
            for tile in (64, 16):
                T = K // tile
                for S in range(2, min(T, 64) + 1):
                    for lay in ("bal", "ceil", "rr"):
                        if lay == "ceil" and (T % S == 0 or -(-T // S) * (S - 1) >= T):
                            continue
                        if lay == "bal" and T % S == 0 and tile == 16 and S not in (3, 5, 6, 7):
                            continue   # even contiguous splits of k16 steps are in the grid above
                        if lay == "ceil":
                            c = -(-T // S)
                            sizes = [c] * (S - 1) + [T - c * (S - 1)]
                        else:
                            sizes = [T // S + (1 if i < T % S else 0) for i in range(S)]
                        if lay == "rr":
                            parts = [[t for t in range(i, T, S)] for i in range(S)]
                        else:
                            st = np.cumsum([0] + sizes)
                            parts = [list(range(st[i], st[i + 1])) for i in range(S)]
                        hyp.append((f"tile{tile}:S={S}:{lay}", parts, tile))
            t0 = time.time()
            hbest = []
            for name, parts, tile in hyp:
                vals = []
                for tiles_ in parts:
                    idx = (np.asarray(tiles_)[:, None] * tile + np.arange(tile)[None, :]).reshape(-1)
                    As = np.ascontiguousarray(A.reshape(M, K)[:, idx])
                    Bs = np.ascontiguousarray(B.reshape(K, N)[idx, :])
                    Cp = np.zeros(M * N, dtype=np.uint32)
                    lib.emu(ARCH, K16.encode(), 1, 1, 0, 1, M, N, len(idx), As.ctypes.data, Bs.ctypes.data,
                            Cp.ctypes.data, args.threads)
                    vals.append(Cp.view(np.float32))

                def tree(v):
                    if len(v) == 1:
                        return v[0]
                    h = len(v) // 2
                    return (tree(v[:h]) + tree(v[h:])).astype(np.float32)
                seq = vals[0].copy()
                for v in vals[1:]:
                    seq = (seq + v).astype(np.float32)
                for red, Cf in (("seq", seq), ("tree", tree(vals))):
                    Cu = Cf.view(np.uint32)
                    for v, (bits, kind, _dt) in gpu.items():
                        if kind != "f32":
                            continue
                        eq32 = float(np.mean(Cu == bits))
                        rows.append({"M": M, "N": N, "K": K, "gpu_call": v, "instr": K16, "real_instr": 1,
                                     "acc": 1, "split": f"{name}", "reduce": red, "zero_rule": 1, "eq_fp32": eq32,
                                     "eq_bf16": float(np.mean(to_bf16(Cu) == to_bf16(bits))),
                                     "max_ulp_fp32": int(np.abs(ordered(Cu) - ordered(bits)).max()),
                                     "mean_ulp_fp32": float(np.abs(ordered(Cu) - ordered(bits)).mean()),
                                     "emu_s": ""})
                        if v == "mm_out_f32@cublas":
                            hbest.append((eq32, f"{name}:reduce={red}"))
            hbest.sort(reverse=True)
            info["splitk_hypotheses_top"] = hbest[:8]
            print(f"{M}x{N}x{K} split-K layouts ({len(hyp)} x 2, {time.time() - t0:.1f} s), best: {hbest[:8]}",
                  flush=True)
        summary["shapes"].append(info)

    summary["emu_seconds"] = round(t_emu_total, 1)
    with open(os.path.join(args.out, "cublas_vs_emu.csv"), "w") as f:
        cols = list(rows[0].keys()) if rows else []
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(str(r[c]) if not isinstance(r[c], float) else f"{r[c]:.6f}" for c in cols) + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    print("\n| shape MxNxK | GPU call | best real schedule | % equal fp32 | % equal bf16 | plain k16 chain % fp32 (bf16) | fp64->fp32 baseline % fp32 (bf16) |")
    print("|---|---|---|---|---|---|---|")
    for info in summary["shapes"]:
        M, N, K = info["shape"]
        for v in info["plain_k16"]:
            b = info["best"].get(f"{v}|real")
            if not b:
                continue
            p = info["plain_k16"][v]
            pf = f"{100 * p[0]:.2f} ({100 * p[1]:.2f})" if p[0] != "" else f"- ({100 * p[1]:.2f})"
            sc = f"{100 * b['score']:.2f}" if not v.startswith("mm_bf16") else "-"
            q = info["fp64_baseline"].get(v, ("", 0.0))
            qf = f"{100 * q[0]:.2f} ({100 * q[1]:.2f})" if q[0] != "" else f"- ({100 * q[1]:.2f})"
            print(f"| {M}x{N}x{K} | {v} | {b['schedule']} | {sc} | {100 * b['eq_bf16']:.2f} | {pf} | {qf} |")
    print(f"\nemulation: {t_emu_total:.1f} s; rows: {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
