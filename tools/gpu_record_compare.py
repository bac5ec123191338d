#!/usr/bin/env python3
"""Compares a fresh `moeflip_gpu_check validate` record with the committed one, check by check.

    python3 tools/gpu_record_compare.py NEW.json [tests/fixtures/gpu/h200-check.json]

A check is matched by (source, case, precision, gpu_numerics, cpu_numerics); its GPU digests (logits, router logits, expert
ids, weights, shared gates) must be equal, and it must pass. Prints one line per difference and a summary; exit 0
when every recorded check is there with the same digests, 1 otherwise.
"""
import json
import sys


def key(c):
    # kind and mode tell apart the checks of one case and numerics (forward, decode, replay, ...): without them the
    # later of two checks stood for both, and the earlier one read as different
    return (c.get("source"), c.get("case"), c.get("kind"), c.get("mode"), c.get("precision"), c.get("gpu_numerics"),
            c.get("cpu_numerics"))


def main():
    new = json.load(open(sys.argv[1]))["checks"]
    old = json.load(open(sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/gpu/h200-check.json"))["checks"]
    got = {key(c): c for c in new}
    bad = 0
    for c in old:
        n = got.get(key(c))
        if n is None:
            print("missing:", key(c))
            bad += 1
        elif n.get("gpu_digests") != c.get("gpu_digests") or not n.get("pass"):
            print("differs:", key(c), "pass" if n.get("pass") else "FAIL")
            bad += 1
    print(f"{len(old)} recorded checks, {len(new)} new, {bad} missing or different")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
