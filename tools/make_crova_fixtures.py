#!/usr/bin/env python3
"""Make CroVA-style capture directories and the metrics CroVA would report on them, as test fixtures
for `moeflip diff`.

Usage (needs numpy only; on Debian: apt-get install python3-numpy, then run with /usr/bin/python3):

    python3 tools/make_crova_fixtures.py [--hf tests/fixtures/hf] [--out tests/fixtures/crova]
                                         [--cases olmoe,qwen2_moe,qwen3_moe] [--torch-results FILE]

    # optional, where torch is installed (writes nothing under OUT): CroVA's case_stats in torch on the CPU
    python3 tools/make_crova_fixtures.py --torch-run FILE
    # then regenerate with --torch-results FILE to add those values to expected.json as torch_cpu

The committed expected.json files were made with
    python3 tools/make_crova_fixtures.py --torch-results tests/fixtures/crova/torch_cpu.json
where torch_cpu.json came from --torch-run (torch 2.11.0+cu130, 16 threads, x86_64).

Input: the Hugging Face fixtures DIR/<case>/{ref.safetensors,tokens.jsonl,config.json} (see that README).

Output, per case:
  OUT/<case>/<capture>/logits/<seq>.safetensors  capture = fp64, bf16cpu, bf16cuda; seq = s0, s1, s2
      logits        [T,V]   BF16 (bf16 captures, exact) or F32 (fp64 capture: the fp64 logits rounded to fp32)
      response      [T]     I64  the sequence's token ids
      router_logits [L,T,E] BF16 or F32, the same way
  OUT/<case>/<capture>/meta.json                  config path (relative) and experts_per_token
  OUT/<case>/expected.json                        CroVA's case_stats per sequence, summarize's point values,
                                                  tie counts, paired_bootstrap point values, float64 values,
                                                  torch CPU values (with --torch-results)

The metrics follow CroVA's case_stats, summarize and paired_bootstrap (point values only; docs/diff.md states them):
float32 arithmetic for each per-case sum (blocks of 64 positions summed in float32, block sums accumulated
in a Python float), log_softmax in float32, argmax = first maximal index, top-k with ties broken as
"larger value first, equal values: lower index first", expert sets from top-k of the raw router logits.
"""

import lzma
import argparse
import json
import os
import struct
import sys

import numpy as np

SEQS = ("s0", "s1", "s2")
CAPTURES = ("fp64", "bf16cpu", "bf16cuda")
PAIRS = (("fp64", "bf16cpu"), ("fp64", "bf16cuda"), ("bf16cpu", "bf16cuda"))
BLOCK = 64
TOPN = 5
CONVENTIONS = {
    "per_case": "crova case_stats sums, numpy float32: each block of 64 positions summed "
                "in float32 (numpy pairwise sum), block sums added in a Python float; log_softmax and exp in float32",
    "router_logit_sq_err": "one float32 sum over all L*T*E entries of the case",
    "argmax": "first maximal index",
    "topk": "larger value first; equal values: lower index first (torch.topk has no fixed rule: see ties, "
            "alt_tiebreak_high_index_first and torch_cpu)",
    "router_sets": "top-k (k = experts_per_token) of the stored raw router logits, as float32",
    "equal_bits": "only when both captures hold BF16 logits, else null; summary has equal_bits_pct only then",
    "summary": "crova summarize point values, cases sorted by id; no CIs",
    "paired_bootstrap": "crova paired_bootstrap point values, A = fp64_vs_bf16cpu, B = fp64_vs_bf16cuda; "
                        "no CIs (they need numpy default_rng(20260820) resampling)",
    "float64_check": "sq_err, prob_sq_err, kl, router_logit_sq_err of the same stored values computed in "
                     "float64 (the fp32 kl is rounding-noise dominated: compare a double-precision tool with these)",
    "torch_cpu": "the same case_stats recomputed with torch on the CPU (CroVA's ops: .float(), log_softmax, exp, "
                 "sum, argmax, topk), from the capture files",
}


# ----------------------------------------------------------------------------------------------
# safetensors

_DT = {"F64": "<f8", "F32": "<f4", "I64": "<i8", "I32": "<i4", "BF16": "<u2", "U8": "u1"}


def st_read(path):
    """Return {name: (dtype_string, ndarray)}; BF16 comes back as its raw uint16 bits."""
    # the repository keeps reference files as PATH.xz
    opener = (lambda: lzma.open(path + ".xz")) if not os.path.exists(path) and os.path.exists(path + ".xz") else (lambda: open(path, "rb"))
    with opener() as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        arr = np.frombuffer(data[base + lo:base + hi], dtype=_DT[info["dtype"]])
        out[name] = (info["dtype"], arr.reshape(info["shape"]).copy())
    return out


def st_write(path, tensors):
    """tensors: list of (name, dtype_string, ndarray); BF16 given as uint16 bits. Header padded to 8 bytes."""
    header = {}
    blobs = []
    off = 0
    for name, dt, arr in tensors:
        arr = np.ascontiguousarray(arr.astype(_DT[dt], copy=False))
        b = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16_bits_from_f32(x):
    """Exact: fails unless every value is a bf16 value."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if np.any(u & 0xFFFF):
        raise ValueError("values are not bf16")
    return (u >> 16).astype(np.uint16)


def f32_from_bf16_bits(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------------------------
# CroVA metrics (numpy, float32)

def topk_idx(x, k, high_index_first=False):
    """Indices of the k largest along the last axis, larger value first; equal values: lower index
    first (or higher index first when high_index_first)."""
    if high_index_first:
        n = x.shape[-1]
        order = np.argsort(-x[..., ::-1], axis=-1, kind="stable")[..., :k]
        return (n - 1) - order
    return np.argsort(-x, axis=-1, kind="stable")[..., :k]


def sorted_desc(x, k):
    return -np.sort(-x, axis=-1)[..., :k]


def log_softmax32(x):
    x = x.astype(np.float32)
    m = x.max(axis=-1, keepdims=True)
    s = x - m
    lse = np.log(np.exp(s).sum(axis=-1, keepdims=True, dtype=np.float32))
    return (s - lse).astype(np.float32)


def block_sum(fn, m, dtype=np.float32):
    """Σ over blocks of BLOCK positions: each block summed in `dtype`, block sums added in a Python float."""
    total = 0.0
    for i in range(0, m, BLOCK):
        total += float(fn(slice(i, min(i + BLOCK, m))).sum(dtype=dtype))
    return total


def case_stats(ref, tgt, k, dtype=np.float32):
    """ref/tgt: dicts with 'logits' (float32 values), 'logits_bf16' (bool), 'response', 'router_logits'.
    dtype=float64 gives the same sums in double (a cross-check of the float32 rounding)."""
    a = ref["logits"].astype(np.float32)
    b = tgt["logits"].astype(np.float32)
    if a.shape != b.shape:
        raise ValueError("logit shapes differ")
    if not np.array_equal(ref["response"].astype(np.int64), tgt["response"].astype(np.int64)):
        raise ValueError("responses differ")
    m, V = a.shape
    if dtype == np.float64:
        a, b = a.astype(np.float64), b.astype(np.float64)
        lr = a - a.max(-1, keepdims=True)
        lr = lr - np.log(np.exp(lr).sum(-1, keepdims=True))
        lt = b - b.max(-1, keepdims=True)
        lt = lt - np.log(np.exp(lt).sum(-1, keepdims=True))
    else:
        lr, lt = log_softmax32(a), log_softmax32(b)
    pr, pt = np.exp(lr), np.exp(lt)
    st = {"positions": m, "vocab": V}
    st["sq_err"] = block_sum(lambda s: (b[s] - a[s]) ** 2, m, dtype)
    st["prob_sq_err"] = block_sum(lambda s: (pt[s] - pr[s]) ** 2, m, dtype)
    st["kl"] = block_sum(lambda s: pr[s] * (lr[s] - lt[s]), m, dtype)
    if dtype == np.float64:
        d = ref["router_logits"].astype(np.float64) - tgt["router_logits"].astype(np.float64)
        st["router_logit_sq_err"] = float((d * d).sum())
        st["router_logit_count"] = int(d.size)
        return st
    st["top1"] = int((a.argmax(-1) == b.argmax(-1)).sum())
    ia, ib = topk_idx(a, TOPN), topk_idx(b, TOPN)
    st["ord5"] = int((ia == ib).all(-1).sum())
    st["set5"] = int((np.sort(ia, -1) == np.sort(ib, -1)).all(-1).sum())
    if ref["logits_bf16"] and tgt["logits_bf16"]:
        za = a.view(np.uint32) >> 16
        zb = b.view(np.uint32) >> 16
        st["equal_bits"] = int((za == zb).sum())
    else:
        st["equal_bits"] = None
    st["nonfinite_target"] = int((~np.isfinite(b)).sum())
    rr = ref["router_logits"].astype(np.float32)
    rt = tgt["router_logits"].astype(np.float32)
    L = rr.shape[0]
    er, et = topk_idx(rr, k), topk_idx(rt, k)
    same_set = (np.sort(er, -1) == np.sort(et, -1)).all(-1)  # [L, m]
    same_order = (er == et).all(-1)
    st["router_slots"] = L * m
    st["router_set_equal"] = int(same_set.sum())
    st["router_ord_equal"] = int(same_order.sum())
    st["router_positions_all_layers_equal"] = int(same_set.all(0).sum())
    st["router_logit_sq_err"] = float(((rr - rt) ** 2).sum(dtype=np.float32))
    st["router_logit_count"] = int(rr.size)
    return st


def tie_stats(ref, tgt, k):
    """Exact ties that make a count depend on the top-k tie rule. Each entry: {ref, tgt, either, where}:
    positions (or slots) with the tie in the reference, in the target, in either; `where` lists the
    position t (or [layer, t]) of each `either` one."""
    def cnt(fr, ft):
        e = fr | ft
        return {"ref": int(fr.sum()), "tgt": int(ft.sum()), "either": int(e.sum()),
                "where": [list(map(int, w)) if len(w) > 1 else int(w[0]) for w in zip(*np.nonzero(e))]}

    out = {}
    sa, sb = sorted_desc(ref["logits"], TOPN + 1), sorted_desc(tgt["logits"], TOPN + 1)
    out["top1_tie_positions"] = cnt(sa[:, 0] == sa[:, 1], sb[:, 0] == sb[:, 1])
    # set5 depends on a tie between the 5th and 6th largest
    out["set5_boundary_tie_positions"] = cnt(sa[:, 4] == sa[:, 5], sb[:, 4] == sb[:, 5])
    # ord5 depends on any tie among the 6 largest (inside the top 5 or at its boundary)
    out["ord5_tie_positions"] = cnt((sa[:, 1:] == sa[:, :-1]).any(-1), (sb[:, 1:] == sb[:, :-1]).any(-1))
    ra, rb = sorted_desc(ref["router_logits"], k + 1), sorted_desc(tgt["router_logits"], k + 1)
    ba, bb = ra[..., k - 1] == ra[..., k], rb[..., k - 1] == rb[..., k]
    out["router_boundary_tie_slots"] = cnt(ba, bb)
    out["router_boundary_tie_positions"] = cnt(ba.any(0), bb.any(0))
    out["router_order_tie_slots"] = cnt((ra[..., 1:] == ra[..., :-1]).any(-1),
                                        (rb[..., 1:] == rb[..., :-1]).any(-1))
    return out


def alt_counts(ref, tgt, k):
    """The tie-dependent counts with the opposite rule (equal values: higher index first) on both sides."""
    a, b = ref["logits"], tgt["logits"]
    ia, ib = topk_idx(a, TOPN, True), topk_idx(b, TOPN, True)
    er, et = topk_idx(ref["router_logits"], k, True), topk_idx(tgt["router_logits"], k, True)
    same_set = (np.sort(er, -1) == np.sort(et, -1)).all(-1)
    return {"ord5": int((ia == ib).all(-1).sum()),
            "set5": int((np.sort(ia, -1) == np.sort(ib, -1)).all(-1).sum()),
            "router_set_equal": int(same_set.sum()),
            "router_ord_equal": int((er == et).all(-1).sum()),
            "router_positions_all_layers_equal": int(same_set.all(0).sum())}


def summarize(per_case):
    """Point values of crova summarize(), cases in case_id order."""
    ids = sorted(per_case)
    S = lambda key: sum(per_case[c][key] for c in ids)
    pos = S("positions")
    pv = sum(per_case[c]["positions"] * per_case[c]["vocab"] for c in ids)
    out = {"cases": len(ids), "positions": pos,
           "raw_logit_mse": S("sq_err") / pv,
           "prob_mse": S("prob_sq_err") / pv,
           "forward_kl": S("kl") / pos}
    for key in ("top1", "ord5", "set5"):
        out[key] = S(key)
        out[key + "_pct"] = 100.0 * S(key) / pos
    if per_case[ids[0]].get("equal_bits") is not None:
        out["equal_bits"] = S("equal_bits")
        out["equal_bits_pct"] = 100.0 * S("equal_bits") / pv
    out["nonfinite_target"] = S("nonfinite_target")
    if "router_slots" in per_case[ids[0]]:
        slots = S("router_slots")
        out["router_slots"] = slots
        for key in ("router_set_equal", "router_ord_equal"):
            out[key] = S(key)
            out[key + "_pct"] = 100.0 * S(key) / slots
        out["router_positions_all_layers_equal"] = S("router_positions_all_layers_equal")
        out["router_positions_all_layers_equal_pct"] = 100.0 * S("router_positions_all_layers_equal") / pos
        out["router_logit_mse"] = S("router_logit_sq_err") / S("router_logit_count")
    return out


def paired_point(a, b):
    """Point values of crova paired_bootstrap(a, b); a, b: per_case dicts against one reference."""
    if sorted(a) != sorted(b):
        raise ValueError("case sets differ")
    ids = sorted(a)
    out = {}
    for key in ("sq_err", "kl", "prob_sq_err"):
        x = sum(a[c][key] for c in ids)
        y = sum(b[c][key] for c in ids)
        out[key + "_rel_change_pct"] = 100.0 * (y / x - 1.0)
    for key in ("top1", "ord5", "set5", "equal_bits", "router_set_equal"):
        if a[ids[0]].get(key) is None or b[ids[0]].get(key) is None:
            continue
        out[key + "_diff"] = sum(b[c][key] - a[c][key] for c in ids)
    return out


# ----------------------------------------------------------------------------------------------

def load_case(hfdir, case):
    ref = st_read(os.path.join(hfdir, case, "ref.safetensors"))
    with open(os.path.join(hfdir, case, "config.json")) as f:
        cfg = json.load(f)
    toks = {}
    with open(os.path.join(hfdir, case, "tokens.jsonl")) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                toks[r["id"]] = r["tokens"]
    return ref, cfg, toks


def experts_per_token(cfg):
    for key in ("num_experts_per_tok", "moe_topk", "top_k"):
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    raise ValueError("no experts_per_token in config")


def make_case(hfdir, outdir, case, torch_res=None):
    ref, cfg, toks = load_case(hfdir, case)
    k = experts_per_token(cfg)
    caps = {}  # caps[capture][seq] = dict used by case_stats (values as the capture file holds them)
    files = []
    for cap in CAPTURES:
        cdir = os.path.join(outdir, case, cap)
        os.makedirs(os.path.join(cdir, "logits"), exist_ok=True)
        caps[cap] = {}
        for i, seq in enumerate(SEQS):
            dt_l, lg = ref["logits_%s_s%d" % (cap, i)]
            dt_r, rl = ref["router_%s_s%d" % (cap, i)]
            resp = np.asarray(toks[seq], dtype=np.int64)
            if lg.shape[0] != resp.shape[0] or rl.shape[1] != resp.shape[0]:
                raise ValueError("%s %s %s: length mismatch" % (case, cap, seq))
            if cap == "fp64":
                assert dt_l == "F64" and dt_r == "F64"
                lg_st, rl_st = lg.astype(np.float32), rl.astype(np.float32)
                tens = [("logits", "F32", lg_st), ("response", "I64", resp), ("router_logits", "F32", rl_st)]
                bf = False
            else:
                assert dt_l == "F32" and dt_r == "F32"
                lb, rb = bf16_bits_from_f32(lg), bf16_bits_from_f32(rl)
                lg_st, rl_st = f32_from_bf16_bits(lb), f32_from_bf16_bits(rb)
                assert np.array_equal(lg_st.view(np.uint32), lg.view(np.uint32))
                tens = [("logits", "BF16", lb), ("response", "I64", resp), ("router_logits", "BF16", rb)]
                bf = True
            path = os.path.join(cdir, "logits", seq + ".safetensors")
            st_write(path, tens)
            files.append(path)
            caps[cap][seq] = {"logits": lg_st, "logits_bf16": bf, "response": resp, "router_logits": rl_st}
        meta = {"config": "../../../hf/%s/config.json" % case, "experts_per_token": k,
                "capture": cap,
                "source": "tests/fixtures/hf/%s/ref.safetensors (logits_%s_s*, router_%s_s*)" % (case, cap, cap),
                "logits_dtype": "F32" if cap == "fp64" else "BF16",
                "router_logits_dtype": "F32" if cap == "fp64" else "BF16",
                "cases": list(SEQS)}
        with open(os.path.join(cdir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
    # re-read what was written: the files must give back exactly the values the metrics use
    for cap in CAPTURES:
        for seq in SEQS:
            got = st_read(os.path.join(outdir, case, cap, "logits", seq + ".safetensors"))
            want = caps[cap][seq]
            for name in ("logits", "router_logits"):
                dt, arr = got[name]
                val = f32_from_bf16_bits(arr) if dt == "BF16" else arr
                assert np.array_equal(val.view(np.uint32), want[name].view(np.uint32)), (case, cap, seq, name)
            assert got["response"][0] == "I64" and np.array_equal(got["response"][1], want["response"])

    L, T0, E = caps["fp64"]["s0"]["router_logits"].shape
    exp = {"case": case, "experts_per_token": k, "vocab": int(caps["fp64"]["s0"]["logits"].shape[1]),
           "router_layers": int(L), "experts": int(E),
           "lengths": {s: int(caps["fp64"][s]["response"].shape[0]) for s in SEQS},
           "conventions": CONVENTIONS,
           "pairs": {}}
    per_pair = {}
    for rc, tc in PAIRS:
        name = "%s_vs_%s" % (rc, tc)
        per_case, ties, alt, f64 = {}, {}, {}, {}
        for seq in SEQS:
            r, t = caps[rc][seq], caps[tc][seq]
            per_case[seq] = case_stats(r, t, k)
            f64[seq] = case_stats(r, t, k, dtype=np.float64)
            ties[seq] = tie_stats(r, t, k)
            alt[seq] = alt_counts(r, t, k)
        tie_tot = {key: {w: sum(ties[s][key][w] for s in SEQS) for w in ("ref", "tgt", "either")}
                   for key in ties[SEQS[0]]}
        alt_tot = {key: sum(alt[s][key] for s in SEQS) for key in alt[SEQS[0]]}
        summ = summarize(per_case)
        pv = sum(per_case[s]["positions"] * per_case[s]["vocab"] for s in SEQS)
        pos = sum(per_case[s]["positions"] for s in SEQS)
        f64_pooled = {"raw_logit_mse": sum(f64[s]["sq_err"] for s in SEQS) / pv,
                      "prob_mse": sum(f64[s]["prob_sq_err"] for s in SEQS) / pv,
                      "forward_kl": sum(f64[s]["kl"] for s in SEQS) / pos,
                      "router_logit_mse": sum(f64[s]["router_logit_sq_err"] for s in SEQS)
                                          / sum(f64[s]["router_logit_count"] for s in SEQS)}
        exp["pairs"][name] = {
            "reference": rc, "target": tc,
            "per_case": per_case,
            "summary": summ,
            "ties": {"per_case": ties, "total": tie_tot},
            "alt_tiebreak_high_index_first": {"per_case": alt, "total": alt_tot},
            "float64_check": {"per_case": f64, "pooled": f64_pooled},
        }
        per_pair[name] = per_case
        per_pair[name + "/float64"] = f64
        if torch_res is not None:
            tpc = torch_res["cases"][case]["pairs"][name]
            exp["pairs"][name]["torch_cpu"] = {"per_case": tpc, "summary": summarize(tpc)}
    exp["paired_bootstrap"] = {"a": "fp64_vs_bf16cpu", "b": "fp64_vs_bf16cuda",
                               "point": paired_point(per_pair["fp64_vs_bf16cpu"], per_pair["fp64_vs_bf16cuda"]),
                               "ci": None,
                               "point_float64": paired_point(per_pair["fp64_vs_bf16cpu/float64"],
                                                             per_pair["fp64_vs_bf16cuda/float64"])}
    if torch_res is not None:
        tp = torch_res["cases"][case]["pairs"]
        exp["paired_bootstrap"]["point_torch_cpu"] = paired_point(tp["fp64_vs_bf16cpu"], tp["fp64_vs_bf16cuda"])
        exp["torch_cpu"] = {"torch": torch_res["torch"], "threads": torch_res["threads"],
                            "machine": torch_res["machine"],
                            "topk_order_differs_from_rule":
                                torch_res["cases"][case]["topk_order_differs_from_rule"]}
    path = os.path.join(outdir, case, "expected.json")
    with open(path, "w") as f:
        json.dump(exp, f, indent=1)
        f.write("\n")
    with open(path) as f:
        assert json.load(f) == json.loads(json.dumps(exp))
    files.append(path)
    return exp, files


def torch_stats(ref, tgt, k):
    """crova case_stats as the reference describes it, in torch on the CPU (ref/tgt: dicts of tensors)."""
    import torch
    a, b = ref["logits"].float(), tgt["logits"].float()
    m, V = a.shape
    st = {"positions": m, "vocab": V, "sq_err": 0.0, "prob_sq_err": 0.0, "kl": 0.0,
          "top1": 0, "ord5": 0, "set5": 0}
    for i in range(0, m, BLOCK):
        x, y = a[i:i + BLOCK], b[i:i + BLOCK]
        lr, lt = torch.log_softmax(x, -1), torch.log_softmax(y, -1)
        pr, pt = lr.exp(), lt.exp()
        st["sq_err"] += float(((y - x) ** 2).sum())
        st["prob_sq_err"] += float(((pt - pr) ** 2).sum())
        st["kl"] += float((pr * (lr - lt)).sum())
        st["top1"] += int((x.argmax(-1) == y.argmax(-1)).sum())
        ix, iy = x.topk(TOPN, -1).indices, y.topk(TOPN, -1).indices
        st["ord5"] += int((ix == iy).all(-1).sum())
        st["set5"] += int((ix.sort(-1).values == iy.sort(-1).values).all(-1).sum())
    if ref["logits"].dtype == torch.bfloat16 and tgt["logits"].dtype == torch.bfloat16:
        st["equal_bits"] = int((ref["logits"].view(torch.int16) == tgt["logits"].view(torch.int16)).sum())
    else:
        st["equal_bits"] = None
    st["nonfinite_target"] = int((~torch.isfinite(b)).sum())
    rr, rt = ref["router_logits"].float(), tgt["router_logits"].float()
    er, et = rr.topk(k, dim=-1).indices, rt.topk(k, dim=-1).indices
    same_set = (er.sort(-1).values == et.sort(-1).values).all(-1)
    st["router_slots"] = rr.shape[0] * m
    st["router_set_equal"] = int(same_set.sum())
    st["router_ord_equal"] = int((er == et).all(-1).sum())
    st["router_positions_all_layers_equal"] = int(same_set.all(0).sum())
    st["router_logit_sq_err"] = float(((rr - rt) ** 2).sum())
    st["router_logit_count"] = rr.numel()
    return st


def torch_run(outdir, cases, dest):
    """Recompute every pair of OUT/<case>/expected.json with torch (CroVA's ops, CPU) from the capture
    files; write the results to `dest` (JSON) and print where they differ from expected.json. Also count
    where torch.topk's order differs from the low-index-first rule."""
    import torch
    import platform

    def load(path):
        out = {}
        for name, (dt, arr) in st_read(path).items():
            if dt == "BF16":
                out[name] = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
            else:
                out[name] = torch.from_numpy(arr)
        return out

    res = {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
           "machine": platform.machine(), "cases": {}}
    for case in cases:
        with open(os.path.join(outdir, case, "expected.json")) as f:
            exp = json.load(f)
        k = exp["experts_per_token"]
        data = {c: {s: load(os.path.join(outdir, case, c, "logits", s + ".safetensors")) for s in SEQS}
                for c in CAPTURES}
        rc = {"topk_order_differs_from_rule": {}, "pairs": {}}
        for c in CAPTURES:
            d5 = dr = 0
            for s in SEQS:
                x = data[c][s]["logits"].float()
                d5 += int((x.topk(TOPN, -1).indices.numpy() != topk_idx(x.numpy(), TOPN)).any(-1).sum())
                r = data[c][s]["router_logits"].float()
                dr += int((r.topk(k, -1).indices.numpy() != topk_idx(r.numpy(), k)).any(-1).sum())
            rc["topk_order_differs_from_rule"][c] = {"top5_positions": d5, "router_slots": dr}
        for name, pair in exp["pairs"].items():
            pc = {}
            for s in SEQS:
                got = torch_stats(data[pair["reference"]][s], data[pair["target"]][s], k)
                pc[s] = got
                want = pair["per_case"][s]
                for key, v in got.items():
                    w = want[key]
                    if isinstance(v, float):
                        rel = abs(v - w) / max(abs(w), 1e-300)
                        if rel > 1e-6:
                            print("%s %s %s %s: torch %r numpy %r (rel %.2e)" % (case, name, s, key, v, w, rel))
                    elif v != w:
                        print("%s %s %s %s: torch %r numpy %r" % (case, name, s, key, v, w))
            rc["pairs"][name] = pc
        res["cases"][case] = rc
    with open(dest, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    return 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hf", default=os.path.join(root, "tests", "fixtures", "hf"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "crova"))
    ap.add_argument("--cases", default="olmoe,qwen2_moe,qwen3_moe")
    ap.add_argument("--torch-run", metavar="FILE",
                    help="needs torch; writes nothing under OUT: recomputes every pair of OUT/<case>/expected.json "
                         "with torch on the CPU (CroVA's own ops) from the capture files, writes the results to FILE")
    ap.add_argument("--torch-results", metavar="FILE",
                    help="a FILE written by --torch-run; its values are added to expected.json as torch_cpu")
    args = ap.parse_args()
    if args.torch_run:
        return torch_run(args.out, args.cases.split(","), args.torch_run)
    torch_res = None
    if args.torch_results:
        with open(args.torch_results) as f:
            torch_res = json.load(f)
    for case in args.cases.split(","):
        exp, files = make_case(args.hf, args.out, case, torch_res)
        p = exp["pairs"]
        print("%s: k=%d" % (case, exp["experts_per_token"]))
        for name, d in p.items():
            s = d["summary"]
            print("  %-20s mse %.6g prob_mse %.6g kl %.6g top1 %d ord5 %d set5 %d eqbits %s router set %d ord %d "
                  "all %d rmse %.6g | ties set5 %d ord5 %d rbound %d rord %d" % (
                      name, s["raw_logit_mse"], s["prob_mse"], s["forward_kl"], s["top1"], s["ord5"], s["set5"],
                      s.get("equal_bits", "-"), s["router_set_equal"], s["router_ord_equal"],
                      s["router_positions_all_layers_equal"], s["router_logit_mse"],
                      d["ties"]["total"]["set5_boundary_tie_positions"]["either"],
                      d["ties"]["total"]["ord5_tie_positions"]["either"],
                      d["ties"]["total"]["router_boundary_tie_slots"]["either"],
                      d["ties"]["total"]["router_order_tie_slots"]["either"]))
        print("  paired:", exp["paired_bootstrap"]["point"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
