#!/usr/bin/env python3
"""Cut small test vectors out of the H200 cuBLAS results that tools/cublas_vs_emu.py saves with --save-bits.

Usage: python3 tools/cublas_splitk_fixture.py BITS_DIR OUT.jsonl.xz

Every output of C = A B depends only on its row of A and its column of B, so a few rows and columns of the
operands, with the matching outputs of the full GPU product, are a complete test of the K schedule. Each line:
{"shape": [M, N, K], "call": ..., "schedule": ..., "rows": [...], "cols": [...], "A": [hex bf16, rows x K],
 "B": [hex bf16, K x cols], "C": [hex fp32, rows x cols]}. Needs numpy.
"""
import json, lzma, sys
import numpy as np

# split-K layouts read off the kernels (bench/README.md): ranges of ceil(T / S) 64-wide K tiles, added in order
CASES = [
    ("bits_256x256x4096.npz", "mm_out_f32_at_cublas", "emu:hopper:split=3:tile=64"),
    ("bits_128x128x8192.npz", "mm_out_f32_at_cublas", "emu:hopper:split=6:tile=64"),
    ("bits_64x1024x8192.npz", "mm_out_f32_at_cublas", "emu:hopper:split=4:tile=64"),
    ("bits_64x1024x8192.npz", "mm_out_f32_at_cublaslt", "emu:hopper:split=3:tile=64"),
]


def main():
    src, out = sys.argv[1], sys.argv[2]
    lines = []
    for fname, call, sched in CASES:
        M, N, K = map(int, fname[5:-4].split("x"))
        z = np.load(f"{src}/{fname}")
        A, B, C = z["A"].reshape(M, K), z["B"].reshape(K, N), z[call].reshape(M, N)
        rows, cols = [0, M - 1], list(range(0, N, max(1, N // 6)))[:6]
        lines.append(json.dumps({
            "shape": [M, N, K], "call": call.replace("_at_", " @ "), "schedule": sched, "rows": rows, "cols": cols,
            "A": [f"{int(v):04x}" for v in A[rows].ravel()],
            "B": [f"{int(v):04x}" for v in B[:, cols].ravel()],
            "C": [f"{int(v):08x}" for v in C[np.ix_(rows, cols)].ravel()],
        }))
    with lzma.open(out, "wt") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
