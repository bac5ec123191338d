#!/usr/bin/env python3
"""Make bit-exact test vectors for GPU matrix instructions with MMA-Sim.

MMA-Sim (public code microsoft/MMA-Sim, Python + PyTorch >= 2.7) is NOT part of
this repository: pass the folder that holds its `mmasim` package with --mmasim.

Schema (one JSON object a line, as tests/fixtures/mma/mma_sample_vectors.jsonl.xz; tests/fixtures/mma/README.md):
  {"arch", "instr", "m", "n", "k", "a_type", ["b_type" only when it differs],
   "c_type", "style", "source": "mma-sim", "A": [hex, m*k row-major],
   "B": [hex, k*n row-major], "C": [hex, m*n], "D": [hex, m*n]}
Hex: lower-case, no 0x, 2 digits a byte of the storage type; tf32/xf32 inputs are
stored as their fp32 bit pattern (the instruction ignores / truncates the low 13
bits; MMA-Sim truncates them), fp8 as 2 digits.

Blackwell records (arch "Blackwell" = sm_100, "RTX Blackwell" = sm_120) add:
  fp4 operands: a_type/b_type "float4_e2m1fn", ONE hex digit an element, unpacked,
    A still m*k row-major and B k*n (the script packs two a byte along k for MMA-Sim,
    element 2p in the low nibble, where the instruction takes them packed: k = 64);
  block-scaled kinds: "s_type" ("float8_e8m0fnu": ue8m0, 2^(bits-127), ff = NaN;
    "float8_ue4m3": e4m3 bits whose sign bit the unit ignores, 7f = NaN), "block"
    (16 or 32: K elements per scale), "SA": [hex, m*(k/block) row-major: row i's
    scales in k order], "SB": [hex, (k/block)*n row-major]; 2 hex digits a scale.
  D = sum over k of A[i][l]*B[l][j]*SA[i][l/block]*SB[l/block][j] + C, as the unit does it.

Instruction names: PTX / AMD ISA spelling = prefix + MMA-Sim's qualifier:
  NVIDIA mma:   "mma."   + qualifier   e.g. mma.m16n8k16.f32.bf16.bf16.f32
                 block-scaled          e.g. mma.m16n8k64.block16.f32.e2m1.e2m1.f32.ue4m3 (mma_block_scale)
  NVIDIA wgmma: "wgmma." + qualifier   e.g. wgmma.m64n8k16.f32.bf16.bf16
  NVIDIA tcgen05.mma: "tcgen05.mma." + qualifier  e.g. tcgen05.mma.m64n8k16.f32.bf16.bf16,
                 tcgen05.mma.m128n8k32.block32.f32.e4m3.e4m3.ue8m0 (tcgen05mma_block_scale)
  AMD MFMA:     "mfma_"  + qualifier   e.g. mfma_f32_16x16x16_bf16

Sub-commands:
  verify FILE.jsonl      recompute D of every case with MMA-Sim, count exact matches
  generate --out DIR     write mmasim_<arch>.jsonl for every instruction below (Blackwell:
                         mmasim_Blackwell.jsonl, mmasim_Blackwell_blockscale.jsonl,
                         mmasim_RTXBlackwell.jsonl); --only ARCH,... (RTXBlackwell for
                         "RTX Blackwell"); --dry-run: the Blackwell cases without D,
                         without torch or MMA-Sim, to check sizes
  crosscheck FILE...     compare the D of (hardware) tiles with MMA-Sim's, element-wise
  xz FILE...             compress each FILE to FILE.xz (lzma preset 9e), in parallel
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
import traceback
import zlib

torch = None
nv_sim = None
amd_sim = None

BASE_SEED = 20261201
STYLES = ["normal", "wide", "cancel", "tiny", "special"]

# (arch, instr) to generate.  "special" (NaN / Inf / signed zeros) only where
# MMA-Sim defines the behaviour (NVIDIA); for AMD, "special" holds signed zeros and
# products >= 2^128 only (MMA-Sim leaves NaN/Inf inputs of AMD as a TODO).
INSTRS = [
    ("Volta", "mma.m8n8k4.f32.f16.f16.f32"),
    ("Ampere", "mma.m16n8k16.f32.bf16.bf16.f32"),
    ("Ampere", "mma.m16n8k16.f32.f16.f16.f32"),
    ("Ampere", "mma.m16n8k8.f32.tf32.tf32.f32"),
    ("Hopper", "mma.m16n8k16.f32.bf16.bf16.f32"),
    ("Hopper", "mma.m16n8k16.f32.f16.f16.f32"),
    ("Hopper", "mma.m16n8k8.f32.tf32.tf32.f32"),
    ("Hopper", "wgmma.m64n8k16.f32.bf16.bf16"),
    ("Hopper", "wgmma.m64n8k16.f32.f16.f16"),
    ("Hopper", "wgmma.m64n16k16.f32.bf16.bf16"),
    ("Hopper", "wgmma.m64n8k16.f16.f16.f16"),
    ("Hopper", "wgmma.m64n8k8.f32.tf32.tf32"),
    ("Hopper", "wgmma.m64n8k32.f32.e4m3.e4m3"),
    ("Hopper", "wgmma.m64n8k32.f32.e5m2.e5m2"),
    ("Hopper", "wgmma.m64n8k32.f32.e4m3.e5m2"),
    ("CDNA3", "mfma_f32_16x16x16_bf16"),
    ("CDNA3", "mfma_f32_32x32x8_bf16"),
    ("CDNA3", "mfma_f32_16x16x16_f16"),
    ("CDNA3", "mfma_f32_32x32x8_f16"),
    ("CDNA3", "mfma_f32_16x16x8_xf32"),
    ("CDNA3", "mfma_f32_32x32x4_xf32"),
    ("CDNA3", "mfma_f32_16x16x32_fp8_fp8"),
    ("CDNA3", "mfma_f32_16x16x32_bf8_bf8"),
    ("CDNA3", "mfma_f32_16x16x32_fp8_bf8"),
    ("CDNA3", "mfma_f32_32x32x16_fp8_fp8"),
    ("CDNA3", "mfma_f32_16x16x4_f32"),
]
# tried, kept only if MMA-Sim runs them (its CDNA1/2 f16/bf16 paths assert; docs/numerics.md, "How the models are checked")
OPTIONAL = [
    ("CDNA2", "mfma_f32_16x16x16bf16_1k"),
    ("CDNA2", "mfma_f32_16x16x16f16"),
]

# type name -> (storage bits, exponent bits, mantissa bits, bias, has_inf, nan bits, max finite)
TYPES = {
    "bfloat16": (16, 8, 7, 127, True, 0x7FC0, 3.3895313892515355e38),
    "float16": (16, 5, 10, 15, True, 0x7E00, 65504.0),
    "float32": (32, 8, 23, 127, True, 0x7FC00000, 3.4028234663852886e38),
    "tfloat32": (32, 8, 23, 127, True, 0x7FC00000, 3.4028234663852886e38),
    "xfloat32": (32, 8, 23, 127, True, 0x7FC00000, 3.4028234663852886e38),
    "float8_e4m3fn": (8, 4, 3, 7, False, 0x7F, 448.0),
    "float8_e5m2": (8, 5, 2, 15, True, 0x7E, 57344.0),
    "float8_e4m3fnuz": (8, 4, 3, 8, False, 0x80, 240.0),
    "float8_e5m2fnuz": (8, 5, 2, 16, False, 0x80, 57344.0),
}


def tdtype(name):
    if name in ("tfloat32", "xfloat32"):
        return torch.float32
    return getattr(torch, name)


def int_dtype(bits):
    return {8: torch.uint8, 16: torch.int16, 32: torch.int32}[bits]


def load_mmasim(path):
    global torch, nv_sim, amd_sim
    sys.path.insert(0, os.path.abspath(path))
    import torch as _torch

    torch = _torch
    torch.set_num_threads(1)  # before any op: workers are forked
    from mmasim.simulator import nv_ptx, amd

    nv_sim, amd_sim = nv_ptx, amd


def git_commit(path):
    """MMA-Sim's commit: a file COMMIT beside the package (an exported tree), else git."""
    p = os.path.join(path, "COMMIT")
    if os.path.exists(p):
        return open(p).read().strip()
    if os.path.isdir(os.path.join(path, ".git")):
        import subprocess

        return subprocess.check_output(["git", "-C", path, "rev-parse", "HEAD"], text=True).strip()
    return "unknown"


_SIM_CACHE = {}


def sim_for(arch, instr):
    key = (arch, instr)
    if key not in _SIM_CACHE:
        if instr.startswith("mma."):
            s = nv_sim.mma(arch, instr[4:])
        elif instr.startswith("wgmma."):
            s = nv_sim.wgmma(arch, instr[6:])
        elif instr.startswith("mfma_"):
            s = amd_sim.mfma(arch, instr[5:])
        else:
            raise ValueError("unknown instruction family: " + instr)
        _SIM_CACHE[key] = s
    return _SIM_CACHE[key]


def type_names(arch, instr, sim):
    def name(dt):
        return str(dt).split(".")[-1]

    a, b, c = name(sim.a_type), name(sim.b_type), name(sim.c_type)
    if a == "float32" and (".tf32." in instr):
        a = b = "tfloat32"
    if a == "float32" and instr.endswith("xf32"):
        a = b = "xfloat32"
    return a, b, c


# ------------------------------------------------------------ bit helpers
def to_tensor(bits, tname, shape):
    nb = TYPES[tname][0]
    if nb == 8:
        vals = list(bits)
    else:
        half = 1 << (nb - 1)
        vals = [v - (1 << nb) if v >= half else v for v in bits]
    t = torch.tensor(vals, dtype=int_dtype(nb)).view(tdtype(tname))
    return t.reshape(shape)


def from_tensor(t, tname):
    nb = TYPES[tname][0]
    mask = (1 << nb) - 1
    return [int(v) & mask for v in t.contiguous().view(int_dtype(nb)).reshape(-1).tolist()]


def enc(vals, tname):
    """Python floats -> bit patterns of type tname (PyTorch's conversion)."""
    t = torch.tensor(vals, dtype=torch.float64).to(tdtype(tname))
    return from_tensor(t, tname)


def dec(bits, tname):
    return to_tensor(bits, tname, (len(bits),)).double().tolist()


def hexs(bits, tname):
    w = TYPES[tname][0] // 4
    return [format(v, "0%dx" % w) for v in bits]


def unhex(lst):
    return [int(h, 16) for h in lst]


# -------------------------------------------------------------- generation
def subnormal_bits(rng, tname):
    nb, eb, mb = TYPES[tname][:3]
    m = rng.randint(1, (1 << mb) - 1)
    if mb > 10:  # vary the number of significant bits
        m = max(1, m >> rng.randint(0, mb - 3))
    return (rng.getrandbits(1) << (nb - 1)) | m


def small_normal_bits(rng, tname):
    nb, eb, mb = TYPES[tname][:3]
    return (rng.getrandbits(1) << (nb - 1)) | (rng.randint(1, 3) << mb) | rng.getrandbits(mb)


def zero_bits(rng, tname, neg=None):
    nb = TYPES[tname][0]
    if tname.endswith("fnuz"):
        return 0  # no -0 (0x80 is NaN)
    s = rng.getrandbits(1) if neg is None else int(neg)
    return s << (nb - 1)


def inf_bits(tname, neg):
    nb, eb, mb = TYPES[tname][:3]
    return (int(neg) << (nb - 1)) | (((1 << eb) - 1) << mb)


def nan_choices(tname):
    nb, eb, mb, _, _, qnan, _ = TYPES[tname]
    if tname.endswith("fnuz"):
        return [0x80]
    sign = 1 << (nb - 1)
    if tname == "float8_e4m3fn":
        return [0x7F, 0xFF]
    expall = ((1 << eb) - 1) << mb
    lst = [qnan, qnan | sign]
    payload = expall | 1  # a signalling NaN / odd payload
    if tname == "tfloat32":
        payload = expall | (1 << 13) | (1 << 21)  # survives truncation to tf32
    lst.append(payload)
    return lst


def clampf(x, tname):
    mx = TYPES[tname][6]
    return max(-mx, min(mx, x))


WIDE_E = {
    "bfloat16": (-48, 48), "float32": (-48, 48), "tfloat32": (-48, 48), "xfloat32": (-48, 48),
    "float16": (-24, 15), "float8_e4m3fn": (-9, 8), "float8_e5m2": (-16, 15),
    "float8_e4m3fnuz": (-10, 7), "float8_e5m2fnuz": (-17, 15),
}


def gen_values(rng, style, tname, count, allow_inf, narrow=False):
    """Bit patterns for `count` inputs of type tname."""
    nb, eb, mb, bias, has_inf, _, mx = TYPES[tname]
    if style in ("normal", "cancel", "special"):
        return enc([clampf(rng.gauss(0.0, 1.0), tname) for _ in range(count)], tname)
    if style == "wide":
        lo, hi = WIDE_E[tname]
        if narrow:  # f16 output: keep most sums finite
            lo, hi = lo // 2, hi // 2
        vals = []
        for _ in range(count):
            x = rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** rng.randint(lo, hi)
            if allow_inf and tname in ("float16", "float8_e5m2") and rng.random() < 0.004:
                x = rng.choice((-1.0, 1.0)) * mx * 4.0  # overflows to inf on conversion
            else:
                x = clampf(x, tname)
            vals.append(x)
        return enc(vals, tname)
    raise ValueError(style)


def tiny_values(rng, tname, count):
    out = []
    for _ in range(count):
        r = rng.random()
        if r < 0.45:
            out.append(subnormal_bits(rng, tname))
        elif r < 0.55:
            out.append(zero_bits(rng, tname))
        else:
            out.append(small_normal_bits(rng, tname))
    return out


def gen_case(arch, instr, style, idx):
    sim = sim_for(arch, instr)
    m, n, k = sim.m, sim.n, sim.k
    at, bt, ct = type_names(arch, instr, sim)
    seed = zlib.crc32(("%d|%s|%s|%s|%d" % (BASE_SEED, arch, instr, style, idx)).encode())
    rng = random.Random(seed)
    is_amd = instr.startswith("mfma_")
    cmx = TYPES[ct][6]

    if style in ("normal", "wide", "cancel", "special"):
        # inf inputs only for NVIDIA (MMA-Sim's AMD model leaves NaN/Inf inputs as a TODO)
        narrow = ct == "float16"
        A = gen_values(rng, "wide" if style == "wide" else "normal", at, m * k, not is_amd, narrow)
        B = gen_values(rng, "wide" if style == "wide" else "normal", bt, k * n, not is_amd, narrow)
        if style == "wide":
            if ct == "float16":
                lo, hi = -20, 15
            elif at in ("bfloat16", "float32", "tfloat32", "xfloat32"):
                lo, hi = -60, 60
            else:
                lo, hi = -30, 30
            C = enc([rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** rng.randint(lo, hi)
                     for _ in range(m * n)], ct)
        else:
            C = enc([rng.gauss(0.0, 1.0) for _ in range(m * n)], ct)
    elif style == "tiny":
        A = tiny_values(rng, at, m * k)
        if rng.random() < 0.5:
            B = tiny_values(rng, bt, k * n)
        else:
            if TYPES[bt][1] == 8:  # wide-range types: bring products near the fp32 subnormal range
                e_lo, e_hi = -8, 8
            else:
                e_lo, e_hi = -2, 2
            B = enc([rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** rng.randint(e_lo, e_hi)
                     for _ in range(k * n)], bt)
        C = []
        cmin = 1 - TYPES[ct][3]  # minimum normal exponent of C's type
        for _ in range(m * n):
            r = rng.random()
            if r < 0.45:
                C.append(subnormal_bits(rng, ct))
            elif r < 0.55:
                C.append(zero_bits(rng, ct))
            else:
                if TYPES[at][1] == 8 or ct == "float16":
                    e = rng.randint(cmin, cmin + 8)
                else:
                    e = rng.randint(-50, -20)
                C.append(enc([rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** e], ct)[0])
    else:
        raise ValueError(style)

    if style == "cancel":
        av = dec(A, at)
        bv = dec(B, bt)
        mba, mbb = TYPES[at][2], TYPES[bt][2]
        for i in range(m):
            for p in range(0, k - 1, 2):
                d = 0.0 if rng.random() < 0.2 else rng.choice((-1, 1)) * 2.0 ** -rng.randint(max(1, mba - 2), mba + 1)
                av[i * k + p + 1] = clampf(-av[i * k + p] * (1.0 + d), at)
        for p in range(0, k - 1, 2):
            for j in range(n):
                d = 0.0 if rng.random() < 0.2 else rng.choice((-1, 1)) * 2.0 ** -rng.randint(max(1, mbb - 2), mbb + 1)
                bv[(p + 1) * n + j] = clampf(bv[p * n + j] * (1.0 + d), bt)
        A = enc(av, at)
        B = enc(bv, bt)
        av, bv = dec(A, at), dec(B, bt)
        cvals = []
        for i in range(m):
            for j in range(n):
                s = math.fsum(av[i * k + l] * bv[l * n + j] for l in range(k))
                r = rng.randint(0, 3)
                c = -s
                if r == 1:
                    c = -s * (1.0 + rng.choice((-1, 1)) * 2.0 ** -rng.randint(8, 24))
                elif r == 2:
                    c = -s + rng.gauss(0.0, 1.0) * 2.0 ** -rng.randint(8, 28)
                cvals.append(max(-cmx, min(cmx, c)))
        C = enc(cvals, ct)

    if style == "special":
        A, B, C = list(A), list(B), list(C)
        # zero row of A, zero column of B, signed-zero C along them
        rz, jz = rng.randrange(m), rng.randrange(n)
        allneg = rng.random() < 0.5
        for l in range(k):
            A[rz * k + l] = zero_bits(rng, at, True if allneg else None)
            B[l * n + jz] = zero_bits(rng, bt, False)
        for j in range(n):
            C[rz * n + j] = zero_bits(rng, ct)
        for i in range(m):
            C[i * n + jz] = zero_bits(rng, ct)
        ro = (rz + 1) % m
        if is_amd:
            # products >= 2^128 (both signs in some rows) where the input type allows
            if TYPES[at][1] == 8:
                for l in range(k):
                    A[ro * k + l] = enc([(1.0 + rng.random()) * 2.0 ** rng.randint(100, 126)], at)[0]
                ro2 = (ro + 1) % m
                if ro2 != rz:
                    for l in range(k):
                        A[ro2 * k + l] = enc([rng.choice((-1.0, 1.0)) * 2.0 ** 120], at)[0]
                    for l in range(k):
                        B[l * n + (jz + 1) % n] = enc([rng.choice((-1.0, 1.0)) * 2.0 ** 20], bt)[0]
        else:
            # NaN / Inf inputs and C; large values to overflow fp32
            na = max(2, m * k // 32)
            for _ in range(na):
                r, pos = rng.randrange(5), rng.randrange(m * k)
                if r < 2 or not TYPES[at][4]:
                    A[pos] = rng.choice(nan_choices(at)) if r < 4 else zero_bits(rng, at, True)
                elif r < 4:
                    A[pos] = inf_bits(at, rng.getrandbits(1))
                else:
                    A[pos] = zero_bits(rng, at, True)
            for _ in range(2):
                r, pos = rng.randrange(5), rng.randrange(k * n)
                if r < 2 or (r < 4 and not TYPES[bt][4]):
                    B[pos] = rng.choice(nan_choices(bt))
                elif r < 4:
                    B[pos] = inf_bits(bt, rng.getrandbits(1))
                else:
                    B[pos] = zero_bits(rng, bt, True)
            nc = max(2, m * n // 16)
            for _ in range(nc):
                r, pos = rng.randrange(5), rng.randrange(m * n)
                if r < 2:
                    C[pos] = rng.choice(nan_choices(ct))
                elif r < 4:
                    C[pos] = inf_bits(ct, r == 3)
                else:
                    C[pos] = zero_bits(rng, ct, True)
            if m > 2:
                amx = TYPES[at][6]
                big = [min(amx, 1.5 * 2.0 ** (100 if l % 2 else 125)) for l in range(k)]
                A_ro = enc(big, at)
                for l in range(k):
                    A[ro * k + l] = A_ro[l]
                cbig = enc([TYPES[ct][6] if j % 2 else rng.choice((-1.0, 1.0)) * 2.0 ** (127 if ct != "float16" else 15)
                            for j in range(n)], ct)
                for j in range(n):
                    C[ro * n + j] = cbig[j]

    At = to_tensor(A, at, (m, k))
    Bt = to_tensor(B, bt, (k, n))
    Ct = to_tensor(C, ct, (m, n))
    D = from_tensor(sim(At, Bt, Ct), ct)
    rec = {"arch": arch, "instr": instr, "m": m, "n": n, "k": k, "a_type": at}
    if bt != at:
        rec["b_type"] = bt
    rec.update({"c_type": ct, "style": style, "source": "mma-sim",
                "A": hexs(A, at), "B": hexs(B, bt), "C": hexs(C, ct), "D": hexs(D, ct)})
    return rec


# ------------------------------------------------------------ Blackwell
# sm_100 ("Blackwell": mma and tcgen05.mma) and sm_120 ("RTX Blackwell": mma, with the
# block-scaled kinds). These cases are made without torch (pure Python bit
# patterns: `generate --dry-run` sizes the files on a machine without torch);
# only MMA-Sim's call needs torch.
BW_INSTRS = [
    # sm_100: the Ampere-style mma it keeps, and tcgen05.mma (cta_group::1, no .ws)
    ("Blackwell", "mma.m16n8k16.f32.bf16.bf16.f32"),
    ("Blackwell", "mma.m16n8k16.f32.f16.f16.f32"),
    ("Blackwell", "tcgen05.mma.m64n8k16.f32.bf16.bf16"),      # kind::f16
    ("Blackwell", "tcgen05.mma.m64n8k16.f32.f16.f16"),
    ("Blackwell", "tcgen05.mma.m64n8k16.f16.f16.f16"),        # f16 accumulation
    ("Blackwell", "tcgen05.mma.m64n8k8.f32.tf32.tf32"),       # kind::tf32
    ("Blackwell", "tcgen05.mma.m64n8k32.f32.e4m3.e4m3"),      # kind::f8f6f4
    ("Blackwell", "tcgen05.mma.m64n8k32.f32.e5m2.e5m2"),
    ("Blackwell", "tcgen05.mma.m64n8k32.f32.e4m3.e5m2"),
    ("Blackwell", "tcgen05.mma.m64n8k32.f16.e4m3.e4m3"),
    ("Blackwell", "tcgen05.mma.m128n8k32.block32.f32.e4m3.e4m3.ue8m0"),   # kind::mxf8f6f4
    ("Blackwell", "tcgen05.mma.m128n8k32.block32.f32.e5m2.e4m3.ue8m0"),
    ("Blackwell", "tcgen05.mma.m128n8k64.block32.f32.e2m1.e2m1.ue8m0"),   # kind::mxf4 (mxf4nvf4)
    ("Blackwell", "tcgen05.mma.m128n8k64.block16.f32.e2m1.e2m1.ue8m0"),
    ("Blackwell", "tcgen05.mma.m128n8k64.block16.f32.e2m1.e2m1.ue4m3"),   # kind::mxf4nvf4 with ue4m3: NVFP4
    # sm_120
    ("RTX Blackwell", "mma.m16n8k16.f32.bf16.bf16.f32"),
    ("RTX Blackwell", "mma.m16n8k16.f32.f16.f16.f32"),
    ("RTX Blackwell", "mma.m16n8k16.f16.f16.f16.f16"),
    ("RTX Blackwell", "mma.m16n8k8.f32.tf32.tf32.f32"),
    ("RTX Blackwell", "mma.m16n8k32.f32.e4m3.e4m3.f32"),
    ("RTX Blackwell", "mma.m16n8k32.f32.e5m2.e5m2.f32"),
    ("RTX Blackwell", "mma.m16n8k32.f32.e4m3.e5m2.f32"),
    ("RTX Blackwell", "mma.m16n8k32.f16.e4m3.e4m3.f16"),
    ("RTX Blackwell", "mma.m16n8k16.f32.e4m3.e4m3.f32"),
    ("RTX Blackwell", "mma.m16n8k32.block32.f32.e4m3.e4m3.f32.ue8m0"),    # kind::mxf8f6f4
    ("RTX Blackwell", "mma.m16n8k32.block32.f32.e5m2.e5m2.f32.ue8m0"),
    ("RTX Blackwell", "mma.m16n8k64.block32.f32.e2m1.e2m1.f32.ue8m0"),    # kind::mxf4nvf4
    ("RTX Blackwell", "mma.m16n8k64.block16.f32.e2m1.e2m1.f32.ue8m0"),
    ("RTX Blackwell", "mma.m16n8k64.block16.f32.e2m1.e2m1.f32.ue4m3"),
    ("RTX Blackwell", "mma.m16n8k64.block32.f32.e2m1.e2m1.f32.ue4m3"),
]
# e2m1 operands of the f8f6f4 kinds (one fp4 per byte): MMA-Sim lists them, but its
# fused dot-add has no exponent rule for them (uint8 tensors); tried, kept if it runs them
BW_OPTIONAL = [
    ("Blackwell", "tcgen05.mma.m64n8k32.f32.e2m1.e2m1"),
    ("Blackwell", "tcgen05.mma.m128n8k32.block32.f32.e4m3.e2m1.ue8m0"),
    ("RTX Blackwell", "mma.m16n8k32.f32.e2m1.e2m1.f32"),
    ("RTX Blackwell", "mma.m16n8k32.block32.f32.e2m1.e4m3.f32.ue8m0"),
]

NV_TYPE_NAMES = {
    "bf16": "bfloat16", "f16": "float16", "f32": "float32", "tf32": "tfloat32",
    "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1fn",
    "ue8m0": "float8_e8m0fnu", "ue4m3": "float8_ue4m3",
}
# type name -> (storage bits, exponent bits, mantissa bits, bias, has_inf, nan bits or None, max finite)
BW_TYPES = {
    "float4_e2m1fn": (4, 2, 1, 1, False, None, 6.0),
    "float8_e8m0fnu": (8, 8, 0, 127, False, 0xFF, 2.0 ** 127),
    "float8_ue4m3": (8, 4, 3, 7, False, 0x7F, 448.0),
}
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def tinfo(tname):
    return TYPES[tname] if tname in TYPES else BW_TYPES[tname]


def tbits(tname):
    return tinfo(tname)[0]


def hexs_t(bits, tname):
    w = max(1, tbits(tname) // 4)
    return [format(v, "0%dx" % w) for v in bits]


def bw_parse(instr):
    """(family, m, n, k, a, b, c, block, s) from the name, without MMA-Sim.
    family: "mma", "mma_bs", "tc", "tc_bs"; a, b, c, s: our type names."""
    if instr.startswith("tcgen05.mma."):
        q = instr[len("tcgen05.mma."):].split(".")
        if len(q) == 4:
            shape, d, a, b = q
            fam, block, s = "tc", None, None
        elif len(q) == 6:
            shape, block, d, a, b, s = q
            fam = "tc_bs"
        else:
            raise ValueError(instr)
        c = d
    elif instr.startswith("mma."):
        q = instr[4:].split(".")
        if len(q) == 5:
            shape, d, a, b, c = q
            fam, block, s = "mma", None, None
        elif len(q) == 7:
            shape, block, d, a, b, c, s = q
            fam = "mma_bs"
        else:
            raise ValueError(instr)
    else:
        raise ValueError(instr)
    mnk = shape[1:].replace("n", " ").replace("k", " ").split()
    m, n, k = (int(x) for x in mnk)
    blk = int(block[len("block"):]) if block else None
    T = NV_TYPE_NAMES
    return fam, m, n, k, T[a], T[b], T[c], blk, (T[s] if s else None)


def bw_file(arch, instr):
    """sm_100's block-scaled tcgen05 tiles (m128) get a file of their own, to keep each file under 1 MB."""
    fam = bw_parse(instr)[0]
    return "mmasim_%s%s.jsonl" % (arch.replace(" ", ""), "_blockscale" if fam == "tc_bs" else "")


# ---- pure-Python conversions (round to nearest even, as PyTorch converts)
def enc1(x, tname):
    nb, eb, mb, bias, has_inf, qnan, mx = tinfo(tname)
    if tname == "tfloat32":
        tname = "float32"
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    if x != x:
        return qnan if qnan is not None else 0
    a = abs(x)
    maxcode = None
    if a == 0.0:
        return sign << (nb - 1)
    if a != math.inf:
        emin = 1 - bias
        e = math.frexp(a)[1] - 1
        q = max(e, emin) - mb
        mi = round(a * 2.0 ** -q)          # Python rounds halves to even
        if e < emin:
            bits = mi
        else:
            bits = ((max(e, emin) + bias) << mb) + mi - (1 << mb)
        maxcode = enc1_max(tname)
        if bits <= maxcode:
            return (sign << (nb - 1)) | bits
    if has_inf:
        return (sign << (nb - 1)) | (((1 << eb) - 1) << mb)
    return qnan if qnan is not None else (sign << (nb - 1)) | enc1_max(tname)


_MAXCODE = {}


def enc1_max(tname):
    if tname not in _MAXCODE:
        nb, eb, mb, bias, has_inf, qnan, mx = tinfo(tname)
        e = math.frexp(mx)[1] - 1
        _MAXCODE[tname] = ((e + bias) << mb) + round(mx * 2.0 ** (mb - e)) - (1 << mb)
    return _MAXCODE[tname]


def enc_py(vals, tname):
    return [enc1(v, tname) for v in vals]


def dec1(bits, tname):
    if tname == "float4_e2m1fn":
        v = FP4_VALUES[bits & 7]
        return -v if bits & 8 else v
    if tname == "float8_e8m0fnu":
        return math.nan if bits == 0xFF else 2.0 ** (bits - 127)
    if tname == "float8_ue4m3":
        bits &= 0x7F   # MMA-Sim takes |scale|
        tname = "float8_e4m3fn"
    nb, eb, mb, bias, has_inf, qnan, mx = tinfo(tname)
    if tname == "tfloat32":
        bits &= ~0x1FFF
    sign = -1.0 if (bits >> (nb - 1)) & 1 else 1.0
    E = (bits >> mb) & ((1 << eb) - 1)
    M = bits & ((1 << mb) - 1)
    if tname == "float8_e4m3fn" and E == 15 and M == 7:
        return math.nan
    if has_inf and E == (1 << eb) - 1:
        return math.nan if M else sign * math.inf
    if E == 0:
        return sign * M * 2.0 ** (1 - bias - mb)
    return sign * (M + (1 << mb)) * 2.0 ** (E - bias - mb)


def dec_py(bits, tname):
    return [dec1(b, tname) for b in bits]


def bw_values(rng, style, tname, count, allow_inf, narrow=False):
    """Element bit patterns for normal / wide (the cancel and special styles start from normal ones)."""
    if tname == "float4_e2m1fn":
        if style == "wide":   # every code, -0 included: the spread comes from the scales
            return [rng.randrange(16) for _ in range(count)]
        return enc_py([rng.gauss(0.0, 2.0) for _ in range(count)], tname)
    if style != "wide":
        return enc_py([clampf(rng.gauss(0.0, 1.0), tname) for _ in range(count)], tname)
    lo, hi = WIDE_E[tname]
    if narrow:
        lo, hi = lo // 2, hi // 2
    mx = tinfo(tname)[6]
    vals = []
    for _ in range(count):
        x = rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** rng.randint(lo, hi)
        if allow_inf and tname in ("float16", "float8_e5m2") and rng.random() < 0.004:
            x = rng.choice((-1.0, 1.0)) * mx * 4.0
        else:
            x = clampf(x, tname)
        vals.append(x)
    return enc_py(vals, tname)


def bw_tiny(rng, tname, count):
    if tname == "float4_e2m1fn":   # 0.5 is fp4's one subnormal
        return [rng.choice((0, 8, 1, 9, 1, 9, 2, 10, 3, 11)) for _ in range(count)]
    return tiny_values(rng, tname, count)


def bw_scales(rng, style, stype, count, fp4):
    """Scale bit patterns (ue8m0: 2^(bits-127), 0xff NaN; ue4m3: e4m3 without its sign, 0x7f NaN)."""
    out = []
    for _ in range(count):
        if stype == "float8_e8m0fnu":
            if style == "normal":
                b = 127 + rng.randint(-3, 3)
            elif style == "wide":
                b = 127 + rng.randint(-40, 40)
            elif style == "cancel":
                b = 127 + rng.randint(-2, 2)
            elif style == "tiny":   # products of the two scales near the fp32 subnormals
                b = rng.randint(55, 85) if not fp4 else rng.randint(50, 75)
            else:
                b = 127 + rng.randint(-4, 4)
        else:
            if style in ("normal", "special"):
                b = enc1(abs(rng.gauss(0.0, 1.5)) + 0.02, "float8_e4m3fn")
            elif style == "wide":
                b = rng.randint(1, 0x7E)
            elif style == "cancel":
                b = enc1(1.0 + rng.random(), "float8_e4m3fn")
            else:   # subnormal ue4m3 (zero included) and the smallest normals
                b = rng.randint(0, 7) if rng.random() < 0.6 else rng.randint(8, 0x17)
        out.append(b)
    return out


def gen_case_bw(arch, instr, style, idx):
    """One case as a record without D (pure Python)."""
    fam, m, n, k, at, bt, ct, blk, st = bw_parse(instr)
    seed = zlib.crc32(("%d|%s|%s|%s|%d" % (BASE_SEED, arch, instr, style, idx)).encode())
    rng = random.Random(seed)
    afp4, bfp4 = at == "float4_e2m1fn", bt == "float4_e2m1fn"
    fp4 = afp4 or bfp4
    packed_fp4 = st is not None and k == 64   # mxf4nvf4: MMA-Sim's block-sum path
    scaled = st is not None
    cmx = tinfo(ct)[6]
    narrow = ct == "float16"
    if style in ("normal", "wide", "cancel", "special"):
        sty = "wide" if style == "wide" else "normal"
        A = bw_values(rng, sty, at, m * k, True, narrow)
        B = bw_values(rng, sty, bt, k * n, True, narrow)
        if style == "wide":
            if ct == "float16":
                lo, hi = -20, 15
            elif at in ("bfloat16", "float32", "tfloat32") or scaled:
                lo, hi = -60, 60
            else:
                lo, hi = -30, 30
            C = enc_py([rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** rng.randint(lo, hi)
                        for _ in range(m * n)], ct)
        else:
            C = enc_py([rng.gauss(0.0, 1.0) for _ in range(m * n)], ct)
    elif style == "tiny":
        A = bw_tiny(rng, at, m * k)
        if rng.random() < 0.5 or bfp4:
            B = bw_tiny(rng, bt, k * n)
        else:
            e_lo, e_hi = (-8, 8) if tinfo(bt)[1] == 8 else (-2, 2)
            B = enc_py([rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** rng.randint(e_lo, e_hi)
                        for _ in range(k * n)], bt)
        C = []
        cmin = 1 - tinfo(ct)[3]
        for _ in range(m * n):
            r = rng.random()
            if r < 0.45:
                C.append(subnormal_bits(rng, ct))
            elif r < 0.55:
                C.append(zero_bits(rng, ct))
            else:
                if st == "float8_e8m0fnu" or (not scaled and (tinfo(at)[1] == 8 or ct == "float16")):
                    e = rng.randint(cmin, cmin + 8)   # near the products the tiny scales make
                elif st == "float8_ue4m3":
                    e = rng.randint(-30, -14)
                else:
                    e = rng.randint(-50, -20)
                C.append(enc1(rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** e, ct))
    else:
        raise ValueError(style)
    nblk = k // blk if scaled else 0
    SA = bw_scales(rng, style, st, m * nblk, fp4) if scaled else None
    SB = bw_scales(rng, style, st, nblk * n, fp4) if scaled else None

    if style == "cancel":
        mba, mbb = tinfo(at)[2], tinfo(bt)[2]
        av, bv = dec_py(A, at), dec_py(B, bt)
        for i in range(m):
            for p in range(0, k - 1, 2):
                if afp4:
                    A[i * k + p + 1] = A[i * k + p] ^ 8 if rng.random() < 0.8 else rng.randrange(16)
                    continue
                d = 0.0 if rng.random() < 0.2 else rng.choice((-1, 1)) * 2.0 ** -rng.randint(max(1, mba - 2), mba + 1)
                av[i * k + p + 1] = clampf(-av[i * k + p] * (1.0 + d), at)
        for p in range(0, k - 1, 2):
            for j in range(n):
                if bfp4:
                    B[(p + 1) * n + j] = B[p * n + j] if rng.random() < 0.8 else rng.randrange(16)
                    continue
                d = 0.0 if rng.random() < 0.2 else rng.choice((-1, 1)) * 2.0 ** -rng.randint(max(1, mbb - 2), mbb + 1)
                bv[(p + 1) * n + j] = clampf(bv[p * n + j] * (1.0 + d), bt)
        if not afp4:
            A = enc_py(av, at)
        if not bfp4:
            B = enc_py(bv, bt)
        av, bv = dec_py(A, at), dec_py(B, bt)
        sa = dec_py(SA, st) if scaled else None
        sb = dec_py(SB, st) if scaled else None
        cvals = []
        for i in range(m):
            for j in range(n):
                if scaled:
                    s = math.fsum(av[i * k + l] * bv[l * n + j] * sa[i * nblk + l // blk] * sb[(l // blk) * n + j]
                                  for l in range(k))
                else:
                    s = math.fsum(av[i * k + l] * bv[l * n + j] for l in range(k))
                r = rng.randint(0, 3)
                c = -s
                if r == 1:
                    c = -s * (1.0 + rng.choice((-1, 1)) * 2.0 ** -rng.randint(8, 24))
                elif r == 2:
                    c = -s + rng.gauss(0.0, 1.0) * 2.0 ** -rng.randint(8, 28)
                cvals.append(max(-cmx, min(cmx, c)))
        C = enc_py(cvals, ct)

    if style == "special":
        # a zero row of A, a zero column of B, signed-zero C along them
        rz, jz = rng.randrange(m), rng.randrange(n)
        allneg = rng.random() < 0.5
        for l in range(k):
            A[rz * k + l] = (8 if allneg else rng.choice((0, 8))) if afp4 else zero_bits(rng, at, True if allneg else None)
            B[l * n + jz] = 0 if bfp4 else zero_bits(rng, bt, False)
        for j in range(n):
            C[rz * n + j] = zero_bits(rng, ct)
        for i in range(m):
            C[i * n + jz] = zero_bits(rng, ct)
        ro = (rz + 1) % m
        # NaN / Inf elements (the formats that have them; fp4 has none)
        if not afp4:
            for _ in range(max(2, m * k // 32)):
                r, pos = rng.randrange(5), rng.randrange(m * k)
                if r < 2 or not tinfo(at)[4]:
                    A[pos] = rng.choice(nan_choices(at)) if r < 4 else zero_bits(rng, at, True)
                elif r < 4:
                    A[pos] = inf_bits(at, rng.getrandbits(1))
                else:
                    A[pos] = zero_bits(rng, at, True)
        if not bfp4:
            for _ in range(2):
                r, pos = rng.randrange(5), rng.randrange(k * n)
                if r < 2 or (r < 4 and not tinfo(bt)[4]):
                    B[pos] = rng.choice(nan_choices(bt))
                elif r < 4:
                    B[pos] = inf_bits(bt, rng.getrandbits(1))
                else:
                    B[pos] = zero_bits(rng, bt, True)
        # NaN / Inf C; MMA-Sim's mxf4nvf4 path takes no infinite C (math.trunc(inf) raises), so NaN only there
        for _ in range(max(2, m * n // 16)):
            r, pos = rng.randrange(5), rng.randrange(m * n)
            if r < 2:
                C[pos] = rng.choice(nan_choices(ct))
            elif r < 4 and not packed_fp4:
                C[pos] = inf_bits(ct, r == 3)
            else:
                C[pos] = zero_bits(rng, ct, True)
        if m > 2:
            # large values: overflow past fp32 (elements at the format's top, or the largest scales)
            if scaled:
                for b in range(nblk):
                    SA[ro * nblk + b] = 0xFE if st == "float8_e8m0fnu" else 0x7E
                ro2 = (ro + 1) % m
                if ro2 != rz and st == "float8_e8m0fnu":
                    for b in range(nblk):
                        SA[ro2 * nblk + b] = 0   # 2^-127: every product far below C
            else:
                amx = tinfo(at)[6]
                big = enc_py([min(amx, 1.5 * 2.0 ** (100 if l % 2 else 125)) for l in range(k)], at)
                for l in range(k):
                    A[ro * k + l] = big[l]
            cbig = enc_py([cmx if j % 2 else rng.choice((-1.0, 1.0)) * 2.0 ** (127 if ct != "float16" else 15)
                           for j in range(n)], ct)
            for j in range(n):
                C[ro * n + j] = cbig[j]
        if scaled:
            # NaN scales: one of A's rows (in one block), one of B's columns
            rn = (rz + 3) % m
            if rn not in (rz, ro):
                SA[rn * nblk + rng.randrange(nblk)] = 0xFF if st == "float8_e8m0fnu" else 0x7F
            jn = (jz + 1) % n
            SB[rng.randrange(nblk) * n + jn] = 0xFF if st == "float8_e8m0fnu" else 0x7F
            if st == "float8_ue4m3":   # scales with the sign bit set (the unit takes |s|) and zero scales
                for _ in range(4):
                    p = rng.randrange(m * nblk)
                    if SA[p] != 0x7F:
                        SA[p] |= 0x80
                SB[rng.randrange(nblk * n)] = 0
    rec = {"arch": arch, "instr": instr, "m": m, "n": n, "k": k, "a_type": at}
    if bt != at:
        rec["b_type"] = bt
    rec.update({"c_type": ct, "style": style, "source": "mma-sim"})
    if scaled:
        rec.update({"s_type": st, "block": blk})
    rec.update({"A": hexs_t(A, at), "B": hexs_t(B, bt), "C": hexs_t(C, ct)})
    if scaled:
        rec.update({"SA": hexs_t(SA, st), "SB": hexs_t(SB, st)})
    return rec


def bw_n_cases(arch, instr, style):
    fam, m, n, k, at, bt, ct, blk, st = bw_parse(instr)
    if fam == "tc_bs":
        return 2
    if at in ("bfloat16", "float16") and ct == "float32":
        # sm_100's mma is Hopper's (MMA-Sim's same model): fewer cases than sm_120's
        return 4 if fam == "tc" or arch == "Blackwell" else 8
    return 2 if fam == "tc" else 4


def bw_sim(arch, instr):
    key = (arch, instr)
    if key not in _SIM_CACHE:
        fam = bw_parse(instr)[0]
        q = instr[len("tcgen05.mma."):] if fam.startswith("tc") else instr[4:]
        ctor = {"mma": nv_sim.mma, "mma_bs": nv_sim.mma_block_scale, "tc": nv_sim.tcgen05mma,
                "tc_bs": nv_sim.tcgen05mma_block_scale}[fam]
        _SIM_CACHE[key] = ctor(arch, q)
    return _SIM_CACHE[key]


def bw_tensor(bits, tname, shape):
    """A torch tensor of MMA-Sim's dtype for our bit patterns (unpacked fp4: uint8, one a byte)."""
    if tname == "float4_e2m1fn":
        return torch.tensor(bits, dtype=torch.uint8).reshape(shape)
    if tname == "float8_ue4m3":
        return torch.tensor(bits, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(shape)
    if tname == "float8_e8m0fnu":
        return torch.tensor(bits, dtype=torch.uint8).view(torch.float8_e8m0fnu).reshape(shape)
    return to_tensor(bits, tname, shape)


def bw_inputs(rec):
    fam, m, n, k, at, bt, ct, blk, st = bw_parse(rec["instr"])
    assert (rec["m"], rec["n"], rec["k"]) == (m, n, k), "dimensions do not match the name"
    A, B, C = unhex(rec["A"]), unhex(rec["B"]), unhex(rec["C"])
    packed = fam.endswith("_bs") and k == 64
    if packed:   # A [m, k/2]: byte p of row i holds elements 2p (low nibble) and 2p+1; B [k/2, n] along k
        At = torch.tensor([A[i * k + 2 * p] | (A[i * k + 2 * p + 1] << 4) for i in range(m) for p in range(k // 2)],
                          dtype=torch.uint8).reshape(m, k // 2)
        Bt = torch.tensor([B[(2 * p) * n + j] | (B[(2 * p + 1) * n + j] << 4) for p in range(k // 2) for j in range(n)],
                          dtype=torch.uint8).reshape(k // 2, n)
    else:
        At = bw_tensor(A, at, (m, k))
        Bt = bw_tensor(B, bt, (k, n))
    Ct = bw_tensor(C, ct, (m, n))
    if st is None:
        return (At, Bt, Ct), ct
    SA = bw_tensor(unhex(rec["SA"]), st, (m, k // blk))
    SB = bw_tensor(unhex(rec["SB"]), st, (k // blk, n))
    return (At, Bt, Ct, SA, SB), ct


def bw_compute_d(rec):
    sim = bw_sim(rec["arch"], rec["instr"])
    args, ct = bw_inputs(rec)
    return hexs(from_tensor(sim(*args), ct), ct)


def gen_case_bw_d(arch, instr, style, idx):
    rec = gen_case_bw(arch, instr, style, idx)
    rec["D"] = bw_compute_d(rec)
    return rec


def is_bw(arch):
    return arch in ("Blackwell", "RTX Blackwell")


def n_cases(arch, instr, style):
    sim = sim_for(arch, instr)
    at, _, ct = type_names(arch, instr, sim)
    # 8 for the common bf16/f16 forms with fp32 accumulation, 4 for the rest
    if at in ("bfloat16", "float16") and ct == "float32" and "m64n16" not in instr:
        return 8
    return 4


def _init_worker():
    torch.set_num_threads(1)


def _gen_task(task):
    arch, instr, style, idx, dry = task
    try:
        if is_bw(arch):
            rec = gen_case_bw(arch, instr, style, idx) if dry else gen_case_bw_d(arch, instr, style, idx)
        else:
            rec = gen_case(arch, instr, style, idx)
        return ("ok", task, json.dumps(rec))
    except Exception:
        return ("err", task, traceback.format_exc())


def _arch_selected(arch, only):
    if not only:
        return True
    wanted = only.split(",")
    return arch in wanted or arch.replace(" ", "") in wanted


def _probe(arch, instr):
    """Runs one case through MMA-Sim; None when it works, else why not (one line)."""
    try:
        if is_bw(arch):
            gen_case_bw_d(arch, instr, "normal", 0)
        else:
            gen_case(arch, instr, "normal", 0)
        return None
    except Exception as e:
        tb = traceback.format_exc().strip().splitlines()
        return "%s: %s; at %s" % (type(e).__name__, e, tb[-3].strip() if len(tb) >= 3 else "")


def cmd_generate(args):
    os.makedirs(args.out, exist_ok=True)
    dry = args.dry_run
    if dry and not all(is_bw(a) for a, _ in INSTRS + OPTIONAL + BW_INSTRS if _arch_selected(a, args.only)):
        print("--dry-run makes only the Blackwell cases (the others need torch): add --only Blackwell,RTXBlackwell")
        return 2
    instrs = [(a, i) for a, i in INSTRS + BW_INSTRS if _arch_selected(a, args.only)]
    # optional instructions: keep only what MMA-Sim can run
    for arch, instr in OPTIONAL + BW_OPTIONAL:
        if not _arch_selected(arch, args.only) or dry:
            continue
        why = _probe(arch, instr)
        if why is None:
            instrs.append((arch, instr))
            print("optional %s %s: MMA-Sim runs it, included" % (arch, instr))
        else:
            print("optional %s %s: MMA-Sim fails (%s), skipped" % (arch, instr, why))
    tasks = []
    for arch, instr in instrs:
        if not dry:
            # an instruction MMA-Sim cannot construct or run is reported once and left out
            try:
                bw_sim(arch, instr) if is_bw(arch) else sim_for(arch, instr)
            except Exception as e:
                print("MMA-Sim lacks %s %s: %s" % (arch, instr, e))
                continue
            if is_bw(arch):
                why = _probe(arch, instr)
                if why is not None:
                    print("ERROR: MMA-Sim fails on %s %s (%s), left out" % (arch, instr, why))
                    continue
        for style in STYLES:
            count = bw_n_cases(arch, instr, style) if is_bw(arch) else n_cases(arch, instr, style)
            for idx in range(count):
                tasks.append((arch, instr, style, idx, dry))
    print("generating %d cases with %d processes%s" % (len(tasks), args.jobs, " (dry run: no D)" if dry else ""))
    t0 = time.time()
    results = {}
    errors = 0
    with mp.Pool(args.jobs, initializer=None if dry else _init_worker) as pool:
        for status, task, payload in pool.imap_unordered(_gen_task, tasks, chunksize=1):
            if status == "ok":
                results[task] = payload
            else:
                errors += 1
                if errors <= 10:
                    print("ERROR in %s:\n%s" % (task, payload))
    print("generated %d cases (%d errors) in %.1f s" % (len(results), errors, time.time() - t0))
    by_file = {}
    for task in tasks:
        if task in results:
            name = bw_file(task[0], task[1]) if is_bw(task[0]) else "mmasim_%s.jsonl" % task[0]
            by_file.setdefault(name, []).append(task)
    for name, lst in by_file.items():
        path = os.path.join(args.out, name + (".dryrun" if dry else ""))
        counts = {}
        with open(path, "w") as f:
            for task in lst:
                f.write(results[task] + "\n")
                counts[(task[1], task[2])] = counts.get((task[1], task[2]), 0) + 1
        extra = ""
        if dry:
            import lzma

            raw = open(path, "rb").read()
            extra = " (%d bytes, %d compressed)" % (len(raw), len(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)))
        print("wrote %s: %d cases%s" % (path, len(lst), extra))
        last = None
        for (instr, style), c in counts.items():
            if instr != last:
                print("   %s:" % instr, end="")
                last = instr
            print(" %s=%d" % (style, c), end="")
            if style == STYLES[-1]:
                print()
        print()
    return 1 if errors else 0


# ---------------------------------------------------------------- checking
def compute_d(rec, arch=None, transpose_b=False):
    arch = arch or rec["arch"]
    if is_bw(arch):
        if transpose_b:
            raise ValueError("B read as n x k: not for Blackwell records")
        return bw_compute_d(dict(rec, arch=arch))
    sim = sim_for(arch, rec["instr"])
    m, n, k = rec["m"], rec["n"], rec["k"]
    at = rec["a_type"]
    bt = rec.get("b_type", at)
    ct = rec["c_type"]
    A = to_tensor(unhex(rec["A"]), at, (m, k))
    if transpose_b:
        B = to_tensor(unhex(rec["B"]), bt, (n, k)).T.contiguous()
    else:
        B = to_tensor(unhex(rec["B"]), bt, (k, n))
    C = to_tensor(unhex(rec["C"]), ct, (m, n))
    return hexs(from_tensor(sim(A, B, C), ct), ct)


def _check_task(args):
    line, arch, try_transpose = args
    rec = json.loads(line)
    try:
        d = compute_d(rec, arch)
    except Exception:
        return (rec["instr"], rec.get("style"), 0, len(rec["D"]), [], traceback.format_exc(), None)
    eq = sum(1 for x, y in zip(d, rec["D"]) if x == y)
    mism = []
    for idx, (x, y) in enumerate(zip(d, rec["D"])):
        if x != y and len(mism) < 3:
            i, j = divmod(idx, rec["n"])
            mism.append({"i": i, "j": j, "file": y, "mmasim": x, "C": rec["C"][idx],
                         "Arow": rec["A"][i * rec["k"]:(i + 1) * rec["k"]],
                         "Bcol": [rec["B"][l * rec["n"] + j] for l in range(rec["k"])]})
    alt = None
    if try_transpose and eq != len(d):
        try:
            d2 = compute_d(rec, arch, transpose_b=True)
            alt = sum(1 for x, y in zip(d2, rec["D"]) if x == y)
        except Exception:
            alt = -1
    return (rec["instr"], rec.get("style"), eq, len(d), mism, None, alt)


def run_checks(lines, arch, jobs, try_transpose):
    with mp.Pool(jobs, initializer=_init_worker) as pool:
        return pool.map(_check_task, [(l, arch, try_transpose) for l in lines], chunksize=2)


def cmd_verify(args):
    lines = [l for l in open(args.file) if l.strip()]
    t0 = time.time()
    res = run_checks(lines, None, args.jobs, True)
    ncase = sum(1 for r in res if r[2] == r[3] and r[5] is None)
    nel = sum(r[2] for r in res)
    tot = sum(r[3] for r in res)
    for line, r in zip(lines, res):
        rec = json.loads(line)
        tag = "OK " if (r[2] == r[3] and r[5] is None) else "BAD"
        extra = ""
        if r[5]:
            extra = " ERROR " + r[5].strip().splitlines()[-1]
        elif r[6] is not None:
            extra = " (B read as n x k: %d/%d)" % (r[6], r[3])
        print("%s %-7s %-34s %-7s %4d/%4d%s" % (tag, rec["arch"], r[0], r[1], r[2], r[3], extra))
        for mm in r[4]:
            print("     mismatch", mm)
        if r[5]:
            print(r[5])
    print("sample verification: %d/%d cases bit-exact, %d/%d elements (%.1f s)"
          % (ncase, len(lines), nel, tot, time.time() - t0))
    return 0 if ncase == len(lines) else 1


def cmd_crosscheck(args):
    allok = True
    for path in args.files:
        lines = [l for l in open(path) if l.strip()]
        t0 = time.time()
        res = run_checks(lines, args.arch, args.jobs, False)
        per = {}
        nerr = 0
        for r in res:
            st = per.setdefault(r[1], [0, 0, 0, 0])
            st[0] += 1
            st[1] += 1 if r[2] == r[3] else 0
            st[2] += r[2]
            st[3] += r[3]
            if r[5]:
                nerr += 1
                if nerr <= 3:
                    print(r[5])
        eq = sum(v[2] for v in per.values())
        tot = sum(v[3] for v in per.values())
        print("crosscheck %s vs MMA-Sim %s: %d/%d elements equal, %d/%d tiles all-equal, %d errors (%.1f s)"
              % (os.path.basename(path), args.arch or "(file arch)", eq, tot,
                 sum(v[1] for v in per.values()), len(lines), nerr, time.time() - t0))
        for st, v in per.items():
            print("   style %-8s tiles %5d (all-equal %5d)  elements %7d/%7d" % (st, v[0], v[1], v[2], v[3]))
        shown = 0
        for r in res:
            for mm in r[4]:
                if shown < 12:
                    print("   mismatch [%s %s] %s" % (r[0], r[1], json.dumps(mm)))
                    shown += 1
        if eq != tot:
            allok = False
    return 0 if allok else 1


def _xz_one(path):
    import lzma

    with open(path, "rb") as f:
        data = f.read()
    comp = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
    with open(path + ".xz", "wb") as f:
        f.write(comp)
    return path, len(data), len(comp)


def cmd_xz(args):
    with mp.Pool(min(len(args.files), args.jobs)) as pool:
        for path, a, b in pool.imap(_xz_one, args.files):
            print("xz %s: %d -> %d bytes" % (path, a, b))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mmasim", help="folder holding MMA-Sim's `mmasim` package")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("verify")
    p.add_argument("file")
    p = sub.add_parser("generate")
    p.add_argument("--out", required=True)
    p.add_argument("--only", help="comma-separated archs (MMA-Sim's names; RTXBlackwell for \"RTX Blackwell\")")
    p.add_argument("--dry-run", action="store_true",
                   help="Blackwell cases without MMA-Sim or torch: A, B, C (and scales) only, to size the files")
    p = sub.add_parser("crosscheck")
    p.add_argument("--arch", help="MMA-Sim arch to use (default: each line's arch)")
    p.add_argument("files", nargs="+")
    p = sub.add_parser("xz")
    p.add_argument("files", nargs="+")
    args = ap.parse_args()
    if args.cmd != "xz" and not (args.cmd == "generate" and args.dry_run):
        if not args.mmasim:
            ap.error("--mmasim is required")
        load_mmasim(args.mmasim)
        print("MMA-Sim at %s, commit %s; torch %s" % (args.mmasim, git_commit(args.mmasim), torch.__version__))
    return {"verify": cmd_verify, "generate": cmd_generate, "crosscheck": cmd_crosscheck,
            "xz": cmd_xz}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
