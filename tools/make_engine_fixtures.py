#!/usr/bin/env python3
"""Writes tests/fixtures/engines/olmoe/: routing captures of the olmoe test model (tests/fixtures/hf/olmoe) in each
production engine's documented format, made from the expert ids and router logits that Hugging Face recorded in
the fixture's ref.safetensors (tools/make_fixtures.py), so an import's ids can be checked against Hugging Face's.

  vllm/      <id>.npy      CompletionOutput.routed_experts as numpy.save writes it: int16 [T-1, layers, top_k]
                           (the last sampled token never ran), from topk_bf16cuda (HF bf16 on the H200).
                           Format: vllm-project/vllm, vllm/model_executor/layers/fused_moe/routed_experts_capturer.py
                           (buffer [tokens, num_hidden_layers, num_experts_per_tok]); numpy/lib/format.py (.npy).
  sglang/    responses.json  a JSON array of /generate responses, meta_info.routed_experts = base64 of int32
                           [T, num_hidden_layers, top_k] (C order), from topk_fp64.
                           Format: sgl-project/sglang, python/sglang/srt/layers/moe/routed_experts_capturer.py;
                           sgl-project/sglang-jax, docs/features/return_routed_experts.md.
  llamacpp/  <id>.csv      llama.cpp examples/moe-trace (ggml-org/llama.cpp PR #28544): one layer,expert row per
                           routed activation, ubatch by ubatch (8 tokens here), layer by layer, token by token, k
                           ids each; s0.csv has a "layer,expert" header, the others none. From topk_bf16cpu.
  hf/        <id>.safetensors  outputs.router_logits (output_router_logits=True) as router_logits.<i> [T, E] F64
                           and outputs.logits as logits [T, V] F32, from router_fp64 and logits_fp64.
  bad/       captures each import must refuse (the test names why).

No numpy: .npy and safetensors are written by hand. Run: python3 tools/make_engine_fixtures.py
"""
import lzma
import base64
import json
import os
import shutil
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "tests", "fixtures", "hf", "olmoe")
OUT = os.path.join(ROOT, "tests", "fixtures", "engines", "olmoe")
UBATCH = 8

DT = {"F64": ("d", 8), "F32": ("f", 4), "I32": ("i", 4), "I64": ("q", 8)}


def read_safetensors(path):
    # the repository keeps reference files as PATH.xz
    opener = (lambda: lzma.open(path + ".xz")) if not os.path.exists(path) and os.path.exists(path + ".xz") else (lambda: open(path, "rb"))
    with opener() as f:
        data = f.read()
    (hl,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hl])
    body = data[8 + hl:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        code, size = DT[t["dtype"]]
        a, b = t["data_offsets"]
        n = (b - a) // size
        out[name] = (t["shape"], list(struct.unpack("<%d%s" % (n, code), body[a:b])))
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, flat values)"""
    header, blobs, off = {}, [], 0
    for name, (dt, shape, vals) in tensors.items():
        code, size = DT[dt]
        blob = struct.pack("<%d%s" % (len(vals), code), *vals)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_npy(path, descr, shape, vals):
    """numpy's format version 1.0: magic, version, u16 header length, dict header padded to 64 bytes, data"""
    code = {"<i2": "h", "<i4": "i", "<u2": "H"}[descr]
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else ""))
    pad = -(10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack("<%d%s" % (len(vals), code), *vals))


def token_major(ids_ltk, L, T, K):
    """[L, T, K] (the fixture's layout) -> rows [T][L][K]"""
    return [[[ids_ltk[(l * T + t) * K + k] for k in range(K)] for l in range(L)] for t in range(T)]


def flat(rows):
    return [x for r in rows for l in r for x in l]


def csv_rows(rows, L, moe_layers, header):
    lines = ["layer,expert"] if header else []
    T = len(rows)
    for u in range(0, T, UBATCH):
        for l in range(L):
            for t in range(u, min(u + UBATCH, T)):
                for x in rows[t][l]:
                    lines.append("%d,%d" % (moe_layers[l], x))
    return "\n".join(lines) + "\n"


def main():
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    meta = json.load(open(os.path.join(SRC, "meta.json")))
    L, E, K = cfg["num_hidden_layers"], cfg["num_experts"], cfg["num_experts_per_tok"]
    moe_layers = meta["moe_layers"]
    assert len(moe_layers) == L, "olmoe: every layer is MoE"
    ref = read_safetensors(os.path.join(SRC, "ref.safetensors"))
    seqs = [json.loads(l) for l in open(os.path.join(SRC, "tokens.jsonl"))]
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    for d in ("vllm", "sglang", "llamacpp", "hf", "bad"):
        os.makedirs(os.path.join(OUT, d))
    shutil.copy(os.path.join(SRC, "tokens.jsonl"), os.path.join(OUT, "tokens.jsonl"))
    responses = []
    for i, s in enumerate(seqs):
        sid, T = s["id"], len(s["tokens"])
        cuda = token_major(ref["topk_bf16cuda_%s" % sid][1], L, T, K)
        cpu = token_major(ref["topk_bf16cpu_%s" % sid][1], L, T, K)
        fp64 = token_major(ref["topk_fp64_%s" % sid][1], L, T, K)
        write_npy(os.path.join(OUT, "vllm", sid + ".npy"), "<i2", [T - 1, L, K], flat(cuda[:T - 1]))
        responses.append({"text": "", "meta_info": {"id": "req-%d" % i, "prompt_tokens": T, "completion_tokens": 0,
                                                    "routed_experts": base64.b64encode(
                                                        struct.pack("<%di" % (T * L * K), *flat(fp64))).decode()}})
        with open(os.path.join(OUT, "llamacpp", sid + ".csv"), "w") as f:
            f.write(csv_rows(cpu, L, moe_layers, header=(i == 0)))
        shape, router = ref["router_fp64_%s" % sid]
        tensors = {}
        for l in range(L):
            tensors["router_logits.%d" % l] = ("F64", [T, E], router[l * T * E:(l + 1) * T * E])
        lshape, logits = ref["logits_fp64_%s" % sid]
        tensors["logits"] = ("F32", lshape, logits)
        write_safetensors(os.path.join(OUT, "hf", sid + ".safetensors"), tensors)
    with open(os.path.join(OUT, "sglang", "responses.json"), "w") as f:
        json.dump(responses, f, indent=1)
        f.write("\n")

    # refusals, each of the first sequence s0 (T = 21 tokens) against a one-line tokens file
    s0 = seqs[0]
    T = len(s0["tokens"])
    with open(os.path.join(OUT, "bad", "tokens_s0.jsonl"), "w") as f:
        f.write(json.dumps(s0) + "\n")
    fp64 = token_major(ref["topk_fp64_s0"][1], L, T, K)
    bad = os.path.join(OUT, "bad")
    # SGLang prefill/decode disaggregation: the prompt's rows (the first 15 here) all zero, the decoded ones real
    pd = [[[0] * K for _ in range(L)] if t < 15 else fp64[t] for t in range(T)]
    with open(os.path.join(bad, "sglang_pd_zero_prompt.json"), "w") as f:
        json.dump({"text": "", "meta_info": {"routed_experts": base64.b64encode(
            struct.pack("<%di" % (T * L * K), *flat(pd))).decode()}}, f)
    # llama.cpp: the ffn_moe_topk view copied flat: each token's whole descending ranking of the E experts
    router = ref["router_fp64_s0"][1]
    ranks = [[sorted(range(E), key=lambda e: (-router[(l * T + t) * E + e], e)) for l in range(L)] for t in range(T)]
    lines = []
    for u in range(0, T, UBATCH):
        for l in range(L):
            for t in range(u, min(u + UBATCH, T)):
                lines += ["%d,%d" % (moe_layers[l], x) for x in ranks[t][l]]
    open(os.path.join(bad, "llamacpp_flat_view.csv"), "w").write("\n".join(lines) + "\n")
    # llama.cpp: the same view read as if contiguous (k x n_tokens ids from its start): the ubatch's argsort rows one
    # after another, cut into rows of k; as many rows as tokens, the ids after each ubatch's first token wrong
    lines = []
    for u in range(0, T, UBATCH):
        span = range(u, min(u + UBATCH, T))
        for l in range(L):
            run = [x for t in span for x in ranks[t][l]][:len(span) * K]
            lines += ["%d,%d" % (moe_layers[l], x) for x in run]
    open(os.path.join(bad, "llamacpp_view_read_flat.csv"), "w").write("\n".join(lines) + "\n")
    # vLLM: expert 16 (out of [0, 16)) at row 5, layer 1, slot 2
    r = [[list(x) for x in row] for row in fp64]
    r[5][1][2] = E
    write_npy(os.path.join(bad, "vllm_out_of_range.npy"), "<i2", [T, L, K], flat(r))
    # vLLM: row 7, layer 2 holds its slot-0 expert twice
    r = [[list(x) for x in row] for row in fp64]
    r[7][2][3] = r[7][2][0]
    write_npy(os.path.join(bad, "vllm_duplicate.npy"), "<i2", [T, L, K], flat(r))
    # vLLM: 19 rows for 21 tokens (neither T nor T-1)
    write_npy(os.path.join(bad, "vllm_rows.npy"), "<i2", [T - 2, L, K], flat(fp64[:T - 2]))
    # vLLM: top-2 ids for a top-4 model
    write_npy(os.path.join(bad, "vllm_topk.npy"), "<i2", [T, L, 2], [x for row in fp64 for l in row for x in l[:2]])
    # llama.cpp: a duplicated expert in token 3's row of layer 0
    cpu = token_major(ref["topk_bf16cpu_s0"][1], L, T, K)
    cpu[3][0][1] = cpu[3][0][0]
    open(os.path.join(bad, "llamacpp_duplicate.csv"), "w").write(csv_rows(cpu, L, moe_layers, header=True))
    print("wrote", OUT)


if __name__ == "__main__":
    sys.exit(main())
