#!/usr/bin/env python3
"""Cut the committed fp8 fixtures out of tools/mma_probe.cu's full H200 output (tests/fixtures/mma/README.md).

  mma_fixture_subset.py tiles OUT.jsonl.xz FILE:MAIN:SPECIAL [FILE:MAIN:SPECIAL ...]
      the first MAIN tiles (styles in turn) and the first SPECIAL "special" tiles of each FILE, in that order
  mma_fixture_subset.py linear OUT.jsonl.xz FILE ROWS
      every linear of FILE, cut to its first ROWS rows of activations (rows are independent: y[i] depends on
      x[i] and the weights only), everything else as the card wrote it

FILEs may be plain or xz-compressed JSON lines. The output is written with lzma preset 9 | EXTREME.
"""
import json
import lzma
import sys


def read_lines(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return [line for line in f if line.strip()]


def write_lines(path, lines):
    with lzma.open(path, "wt", preset=9 | lzma.PRESET_EXTREME) as f:
        for line in lines:
            f.write(line if line.endswith("\n") else line + "\n")


def tiles(out, specs):
    picked = []
    for spec in specs:
        path, main, special = spec.rsplit(":", 2)
        lines = read_lines(path)
        styles = [json.loads(l)["style"] for l in lines]
        mains = [l for l, s in zip(lines, styles) if s != "special"][: int(main)]
        specials = [l for l, s in zip(lines, styles) if s == "special"][: int(special)]
        if len(mains) < int(main) or len(specials) < int(special):
            sys.exit(f"{path}: has {len(mains)} main and {len(specials)} special tiles")
        picked += mains + specials
    write_lines(out, picked)
    print(f"{out}: {len(picked)} tiles")


def linear(out, path, rows):
    picked = []
    for line in read_lines(path):
        o = json.loads(line)
        M, K, nb = o["M"], o["K"], o["K"] // o["bk"]
        r = min(rows, M)
        o["M"] = r
        o["X"] = o["X"][: r * K]
        o["QA"] = o["QA"][: r * K]
        o["SA"] = o["SA"][: r * nb]
        o["Y"] = o["Y"][: r * o["N"]]
        picked.append(json.dumps(o))
    write_lines(out, picked)
    print(f"{out}: {len(picked)} linears, {rows} rows each")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "tiles":
        tiles(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 5 and sys.argv[1] == "linear":
        linear(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
