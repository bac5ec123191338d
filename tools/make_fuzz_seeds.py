#!/usr/bin/env python3
"""Seeds for tests/fuzz/corpus/serve that reach the paths the fuzz target's options open (tests/fuzz/fuzz_serve.c):
diffs of the store's runs "fa" and "fb" answered before the client closes, a diff abandoned at once, a chunked
upload in chunks the (small, fuzz-build) upload sizes adopt, and requests cut short that reach the 100 ms timeouts.

The first byte of a seed is the fuzz target's: bits 0-5 and 7 the bytes per write, bit 6 "close once answered".
The upload seeds reuse the run body of the committed seed upload_valid. Usage: tools/make_fuzz_seeds.py [CORPUS_DIR]
"""
import json
import os
import sys

TOKEN = b"fuzz-token-0123456789"
WAIT = 0x40


def first(per_write, wait):
    """The first byte for about per_write bytes per write (1-64, or 1 + 97*k with the top bit)."""
    if per_write <= 64:
        b = per_write - 1
    else:
        b = 0x80 | min(63, (per_write - 1) // 97)
    return bytes([b | (WAIT if wait else 0)])


def post_diff(reference, targets, bootstrap=None, keep_alive=True):
    body = {"reference": reference, "targets": targets}
    if bootstrap is not None:
        body["bootstrap"] = bootstrap
    b = json.dumps(body).encode()
    conn = b"" if keep_alive else b"Connection: close\r\n"
    return b"POST /api/diffs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + conn + \
        b"Content-Length: %d\r\n\r\n" % len(b) + b


def main():
    corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fuzz", "corpus", "serve")
    valid = open(os.path.join(corpus, "upload_valid"), "rb").read()[1:]
    run_body = valid.split(b"\r\n\r\n", 1)[1]
    seeds = {}
    seeds["diff_fa_fb_answered"] = first(486, True) + post_diff("fa", ["fb"])
    seeds["diff_two_targets_then_list"] = first(40, True) + post_diff("fa", ["fb", "fa"], 5) + \
        b"GET /api/runs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    seeds["diff_unknown_target_answered"] = first(486, True) + post_diff("fa", ["nope"], 3)
    seeds["diff_abandoned"] = first(486, False) + post_diff("fb", ["fa"], 7)
    chunked = b"".join(b"%x\r\n" % len(run_body[i:i + 3000]) + run_body[i:i + 3000] + b"\r\n"
                       for i in range(0, len(run_body), 3000)) + b"0\r\n\r\n"
    seeds["upload_chunked_3000_answered"] = first(6000, True) + \
        b"PUT /api/runs/chunky HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN + \
        b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
    head = b"PUT /api/runs/spliced2 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN + \
        b"\r\nContent-Length: %d\r\n\r\n" % len(run_body)
    seeds["upload_spliced_answered"] = first(6000, True) + head + run_body
    seeds["upload_stalls_half_way"] = first(6000, True) + head + run_body[:len(run_body) // 2]
    seeds["headers_stall"] = first(20, True) + b"GET /api/runs HTTP/1.1\r\nHost: x\r\n"
    for name, data in seeds.items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)
    print("wrote %d seeds to %s" % (len(seeds), corpus))


if __name__ == "__main__":
    main()
