#!/usr/bin/env python3
"""Make tiny Hugging Face checkpoints plus Hugging Face's own forward outputs, as test fixtures.

Usage (on a machine with torch, transformers and safetensors; CUDA optional):

    python3 tools/make_fixtures.py --out DIR [--cases a,b,...] [--hfsrc DIR2]

For each case it writes DIR/<case>/:
  config.json, model.safetensors (or shards + model.safetensors.index.json),
  tokens.jsonl (three random sequences, 21, 13 and 34 tokens), ref.safetensors, meta.json.

ref.safetensors, for sequence index i (s0, s1, s2):
  logits_fp64_s{i}      [T,V]   F64  model loaded from DIR/<case> in float64, eager attention, eager experts, CPU
  router_fp64_s{i}      [L,T,E] F64  raw router logits (before softmax) of each MoE layer, same run
  topk_fp64_s{i}        [L,T,k] I32  expert indices HF selected in that run (captured from the router)
  topkw_fp64_s{i}       [L,T,k] F64  routing weights HF used for them (the router's second output, as given)
  logits_bf16cpu_s{i}   [T,V]   F32  bf16 model, eager attention, default experts implementation, CPU
  router_bf16cpu_s{i}   [L,T,E] F32
  topk_bf16cpu_s{i}     [L,T,k] I32
  logits_bf16cuda_s{i}, router_bf16cuda_s{i}, topk_bf16cuda_s{i}: same on CUDA (TF32 and reduced-precision
                                       reductions off); absent when no GPU is present
  inv_freq_s{i}         [D/2]   F64  model.model.rotary_emb.inv_freq of the float64 model right after
                                     sequence i (values as HF holds them, usually fp32)
Dense models (llama) have no router/topk tensors.

--hfsrc DIR2 copies the installed transformers source files we read (model files, rope utils, MoE
integration) to DIR2.
"""

import lzma
import argparse
import copy
import glob
import inspect
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F

import transformers
from transformers import AutoModelForCausalLM
from safetensors import safe_open
from safetensors.torch import save_file

SEQ_LENS = (21, 13, 34)
BASE = dict(hidden_size=64, num_attention_heads=4, vocab_size=384, num_hidden_layers=3,
            initializer_range=0.05, max_position_embeddings=256, rms_norm_eps=1e-6,
            tie_word_embeddings=False)

HAS_CUDA = torch.cuda.is_available()
if HAS_CUDA:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False

LOG_NOTES = {}   # global findings, printed at the end


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------

def case_defs():
    C = {}
    C["llama"] = dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig",
        kw=dict(BASE, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
        desc="Dense Llama baseline: GQA (4 q heads, 2 kv heads), head_dim 16, SwiGLU 128, rope_theta 5e5.")
    C["olmoe"] = dict(
        cls="OlmoeForCausalLM", cfg="OlmoeConfig",
        kw=dict(BASE, num_experts=16, num_experts_per_tok=4, intermediate_size=32, norm_topk_prob=False,
                eos_token_id=2, pad_token_id=1, bos_token_id=None),
        desc="OLMoE: 16 experts top-4, expert intermediate 32, norm_topk_prob False, full-width q/k RMSNorm.")
    C["qwen2_moe"] = dict(
        cls="Qwen2MoeForCausalLM", cfg="Qwen2MoeConfig",
        kw=dict(BASE, num_key_value_heads=2, num_experts=12, num_experts_per_tok=4, moe_intermediate_size=32,
                shared_expert_intermediate_size=96, intermediate_size=96, qkv_bias=True, norm_topk_prob=False),
        desc="Qwen2-MoE: 12 experts top-4 (moe_intermediate 32) + sigmoid-gated shared expert (96), "
             "GQA 4/2, q/k/v bias, norm_topk_prob False.")
    C["mixtral"] = dict(
        cls="MixtralForCausalLM", cfg="MixtralConfig",
        kw=dict(BASE, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, intermediate_size=96),
        desc="Mixtral: 8 experts top-2 (intermediate 96), GQA 4/2; on disk block_sparse_moe.experts.E.w1/w2/w3.")
    C["qwen3_moe"] = dict(
        cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig",
        kw=dict(BASE, num_key_value_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=4,
                moe_intermediate_size=32, intermediate_size=96, norm_topk_prob=True),
        desc="Qwen3-MoE: 16 experts top-4 (moe_intermediate 32), GQA 4/2, head_dim 16, per-head q/k RMSNorm, "
             "norm_topk_prob True.")
    C["llama_tied_llama3"] = dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig",
        kw=dict(BASE, num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True,
                max_position_embeddings=64,
                rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                 "rope_theta": 500000.0}),
        tied=True,
        desc="Dense Llama with tied embeddings (no lm_head.weight on disk) and llama3 RoPE scaling "
             "(factor 8, low 1, high 4, original_max_position_embeddings 16, max_position_embeddings 64, "
             "theta 5e5).")
    C["qwen3_moe_yarn_v4cfg"] = dict(
        cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig",
        kw=dict(BASE, num_key_value_heads=2, head_dim=32, num_experts=16, num_experts_per_tok=4,
                moe_intermediate_size=32, intermediate_size=96, norm_topk_prob=False, hidden_act="gelu",
                max_position_embeddings=64,
                rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                 "rope_theta": 10000.0}),
        v4cfg={"rope_theta": 10000.0,
               "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
        desc="Qwen3-MoE with head_dim 32 != hidden/heads (q_proj [128,64]), YaRN RoPE (factor 4, original 16, "
             "max_position_embeddings 64, theta 1e4), norm_topk_prob False, hidden_act gelu (exact erf); "
             "config.json rewritten in transformers-v4 spelling (top-level rope_theta, rope_scaling with 'type').")
    C["qwen2_moe_fused_sparse"] = dict(
        cls="Qwen2MoeForCausalLM", cfg="Qwen2MoeConfig",
        kw=dict(BASE, num_key_value_heads=2, num_experts=12, num_experts_per_tok=4, moe_intermediate_size=32,
                shared_expert_intermediate_size=96, intermediate_size=96, qkv_bias=True, norm_topk_prob=True,
                mlp_only_layers=[1]),
        fused=True,
        desc="Qwen2-MoE with mlp_only_layers [1] (layer 1 is a dense SwiGLU MLP of intermediate_size 96; "
             "layers 0 and 2 are MoE), norm_topk_prob True, q/k/v bias; experts stored FUSED on disk: "
             "model.layers.L.mlp.experts.gate_up_proj [E,2I,H] (gate rows first) and "
             "model.layers.L.mlp.experts.down_proj [E,H,I].")
    C["mixtral_linear_v4cfg"] = dict(
        cls="MixtralForCausalLM", cfg="MixtralConfig",
        kw=dict(BASE, num_hidden_layers=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                intermediate_size=64, hidden_act="silu",
                rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
        v4cfg={"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
        shard=True,
        desc="Mixtral, 4 layers, 8 experts top-2 (intermediate 64), linear RoPE scaling factor 2, theta 1e4; "
             "config.json in v4 spelling; weights sharded (model-0000N-of-0000M.safetensors + "
             "model.safetensors.index.json).")
    C["olmoe_dynamic"] = dict(
        cls="OlmoeForCausalLM", cfg="OlmoeConfig",
        kw=dict(BASE, num_experts=16, num_experts_per_tok=4, intermediate_size=32, norm_topk_prob=True,
                tie_word_embeddings=True, max_position_embeddings=24, eos_token_id=2, pad_token_id=1,
                bos_token_id=None,
                rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
        tied=True,
        desc="OLMoE with dynamic-NTK RoPE (factor 2, max_position_embeddings 24: s2 with 34 tokens exceeds it, "
             "s0/s1 do not), norm_topk_prob True, tied embeddings. Sequences are run in order s0,s1,s2 on one "
             "model, so HF's stateful inv_freq update equals the stateless rule 'seq_len > 24 -> NTK base'.")
    return C


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def n_experts(cfg):
    for name in ("num_experts", "num_local_experts", "n_routed_experts"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def build_config(cdef):
    Cfg = getattr(transformers, cdef["cfg"])
    kw = copy.deepcopy(cdef["kw"])
    try:
        cfg = Cfg(**kw)
    except TypeError as e:
        log("  !! config constructor rejected kwargs:", e, "-> building default config and setting attributes")
        cfg = Cfg()
        for k, v in kw.items():
            setattr(cfg, k, v)
    # verify every requested value took
    for k, v in kw.items():
        got = getattr(cfg, k, "<missing>")
        if isinstance(v, dict) and isinstance(got, dict):
            bad = {kk: (vv, got.get(kk)) for kk, vv in v.items() if got.get(kk) != vv}
            if bad:
                log(f"  !! config {k}: requested {v}, got {got}")
        elif got != v:
            log(f"  !! config {k}: requested {v!r}, got {got!r}; setting attribute")
            setattr(cfg, k, v)
    return cfg


def gate_modules(model, E):
    """[(layer_idx, gate_module, experts_module_or_None)] for each MoE layer, in layer order."""
    out = []
    for li, layer in enumerate(model.model.layers):
        gate = None
        experts = None
        for name, mod in layer.named_modules():
            last = name.split(".")[-1]
            w = getattr(mod, "weight", None)
            if last == "gate" and isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[0] == E:
                gate = mod
            if last == "experts":
                experts = mod
        if gate is not None:
            out.append((li, gate, experts))
    return out


class Capture:
    """Forward hooks on each router (and a pre-hook on each experts module)."""

    def __init__(self, model, E, k):
        self.E, self.k = E, k
        self.gates = gate_modules(model, E) if E else []
        self.handles = []
        self.reset()
        for j, (li, gate, experts) in enumerate(self.gates):
            self.handles.append(gate.register_forward_hook(self._gate_hook(j), with_kwargs=True))
            if experts is not None:
                self.handles.append(experts.register_forward_pre_hook(self._exp_hook(j), with_kwargs=True))

    def reset(self):
        n = len(self.gates)
        self.out0 = [None] * n       # gate's first output (or the output itself)
        self.recomp = [None] * n     # F.linear(gate input, gate.weight) recomputed here
        self.idx = [None] * n        # integer [T,k] from gate output
        self.w = [None] * n          # routing weights [T,k] from gate output
        self.exp_idx = [None] * n    # integer tensor seen entering the experts module

    def _gate_hook(self, j):
        def hook(mod, args, kwargs, output):
            x = args[0] if args else next(iter(kwargs.values()))
            H = mod.weight.shape[1]
            self.recomp[j] = F.linear(x.reshape(-1, H), mod.weight, getattr(mod, "bias", None)).detach().cpu().clone()
            outs = output if isinstance(output, (tuple, list)) else (output,)
            self.out0[j] = outs[0].detach().cpu().clone()
            idx = None
            w = None
            for t in outs[1:]:
                if not isinstance(t, torch.Tensor):
                    continue
                if idx is None and not t.is_floating_point():
                    idx = t.detach().cpu().clone()
                elif w is None and t.is_floating_point():
                    w = t.detach().cpu().clone()
            if idx is not None and w is not None and w.shape[-1] == self.E and idx.shape[-1] == self.k:
                w = torch.gather(w.reshape(idx.shape[0], -1), 1, idx.reshape(idx.shape[0], -1).long())
            self.idx[j] = idx
            self.w[j] = w
        return hook

    def _exp_hook(self, j):
        def hook(mod, args, kwargs):
            for t in list(args) + list(kwargs.values()):
                if isinstance(t, torch.Tensor) and not t.is_floating_point():
                    self.exp_idx[j] = t.detach().cpu().clone()
                    break
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def load_model(d, dtype, eager_experts):
    kw = dict(dtype=dtype, attn_implementation="eager")
    how = "default"
    if eager_experts:
        kw["experts_implementation"] = "eager"
        how = "from_pretrained(experts_implementation='eager')"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, **kw)
    except (TypeError, ValueError) as e:
        if not eager_experts:
            raise
        log("  experts_implementation kwarg rejected:", repr(e))
        kw.pop("experts_implementation")
        cfg = transformers.AutoConfig.from_pretrained(d)
        cfg._experts_implementation = "eager"
        model, info = AutoModelForCausalLM.from_pretrained(d, config=cfg, output_loading_info=True, **kw)
        how = "config._experts_implementation='eager'"
    impl = getattr(model.config, "_experts_implementation", None)
    if eager_experts and impl != "eager":
        log(f"  !! after {how}: config._experts_implementation={impl!r}; forcing eager")
        if hasattr(model, "set_experts_implementation"):
            try:
                model.set_experts_implementation("eager")
                how += " + set_experts_implementation('eager')"
            except Exception as e:  # noqa
                log("  set_experts_implementation failed:", e)
        if getattr(model.config, "_experts_implementation", None) != "eager":
            model.config._experts_implementation = "eager"
            how += " + config._experts_implementation='eager'"
        impl = getattr(model.config, "_experts_implementation", None)
    idict = info if isinstance(info, dict) else (vars(info) if hasattr(info, "__dict__") else {"info": info})
    bad = {k: v for k, v in idict.items() if v}
    if bad:
        log(f"  !! loading info not clean for {d}: {idict}")
    model.eval()
    return model, how, impl, info


def run_seq(model, cap, ids, device, moe):
    cap.reset()
    x = torch.tensor([ids], dtype=torch.long, device=device)
    kw = dict(input_ids=x, use_cache=False)
    if moe:
        kw["output_router_logits"] = True
    with torch.no_grad():
        out = model(**kw)
    res = dict(logits=out.logits[0].detach().cpu())
    if moe:
        rl = getattr(out, "router_logits", None)
        res["out_router"] = None if rl is None else [t.detach().cpu().reshape(-1, t.shape[-1]) for t in rl]
        res["out0"] = [t.reshape(-1, t.shape[-1]) for t in cap.out0]
        res["recomp"] = cap.recomp[:]
        res["idx"] = cap.idx[:]
        res["w"] = cap.w[:]
        res["exp_idx"] = cap.exp_idx[:]
    rot = getattr(model.model, "rotary_emb", None)
    if rot is not None and hasattr(rot, "inv_freq"):
        res["inv_freq"] = rot.inv_freq.detach().cpu().clone()
    return res


def rows_are_probs(t):
    s = t.double().sum(-1)
    return bool((t.double() >= 0).all() and torch.allclose(s, torch.ones_like(s), atol=1e-3))


def choose_router(res, tag):
    """Pick raw router logits [L,T,E] from the captures; return tensor and a description."""
    L = len(res["out0"])
    raw = []
    srcs = set()
    for j in range(L):
        o0, rc = res["out0"][j], res["recomp"][j]
        if not rows_are_probs(o0):
            raw.append(o0)
            d = (o0.double() - rc.double()).abs().max().item()
            srcs.add(f"gate output[0] (raw; max|out0-F.linear(input,W)|={d:.3g})")
        else:
            raw.append(rc)
            srcs.add("recomputed F.linear(gate input, gate.weight) because gate output[0] are probabilities")
    R = torch.stack(raw, 0)
    if rows_are_probs(R.reshape(-1, R.shape[-1])):
        raise RuntimeError(f"{tag}: stored router values look like probabilities")
    return R, "; ".join(sorted(srcs))


def describe_out_router(res):
    orl = res.get("out_router")
    if orl is None:
        return "outputs.router_logits is None"
    if len(orl) != len(res["out0"]):
        return f"outputs.router_logits has {len(orl)} entries but {len(res['out0'])} MoE layers"
    probs = all(rows_are_probs(t) for t in orl)
    d_raw = max((a.double() - b.double()).abs().max().item() for a, b in zip(orl, res["recomp"]))
    d_o0 = max((a.double() - b.double()).abs().max().item() for a, b in zip(orl, res["out0"]))
    kind = "softmax PROBABILITIES" if probs else "raw logits (rows do not sum to 1)"
    return (f"outputs.router_logits: tuple of {len(orl)} x {list(orl[0].shape)} {orl[0].dtype}: {kind}; "
            f"max|out-F.linear(x,W)|={d_raw:.3g}, max|out-gate_output0|={d_o0:.3g}")


def topk_stack(res, k, R):
    """HF-selected indices [L,T,k] (from router output, else experts input, else topk of R)."""
    if all(t is not None and t.shape[-1] == k for t in res["idx"]):
        return torch.stack([t.reshape(-1, k) for t in res["idx"]]).to(torch.int32), "router output"
    if all(t is not None and t.shape[-1] == k for t in res["exp_idx"]):
        return torch.stack([t.reshape(-1, k) for t in res["exp_idx"]]).to(torch.int32), "experts input"
    return None, "not captured"


def set_diff_count(a, b):
    sa = torch.sort(a.long(), dim=-1).values
    sb = torch.sort(b.long(), dim=-1).values
    return (sa != sb).any(-1)   # [L,T] bool


def st_names(d):
    names = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        if os.path.basename(f) == "ref.safetensors":
            continue
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                sl = fh.get_slice(k)
                names[k] = (os.path.basename(f), str(sl.get_dtype()), list(sl.get_shape()))
    return names


def save_hf(model, d, **kw):
    try:
        model.save_pretrained(d, safe_serialization=True, **kw)
        return "save_pretrained(safe_serialization=True%s)" % "".join(f", {k}={v!r}" for k, v in kw.items())
    except TypeError as e:
        if "safe_serialization" not in str(e):
            raise
        model.save_pretrained(d, **kw)
        return "save_pretrained(%s) (safe_serialization kwarg not accepted)" % ", ".join(
            f"{k}={v!r}" for k, v in kw.items())


def fp64_logits(d, seqs):
    m, _, _, _ = load_model(d, torch.float64, True)
    out = []
    with torch.no_grad():
        for ids in seqs:
            out.append(m(input_ids=torch.tensor([ids]), use_cache=False).logits[0].detach())
    del m
    return out


def maxdiff(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


# --------------------------------------------------------------------------------------------
# one case
# --------------------------------------------------------------------------------------------

def check_reload_by_name(m64, sd_bf16, meta):
    """The fp64 model's parameters, rounded to bf16, must equal the bf16 ones saved (same names)."""
    sd64 = m64.state_dict()
    worst = 0.0
    missing = []
    for kk, v in sd_bf16.items():
        if kk not in sd64:
            missing.append(kk)
            continue
        if not torch.equal(sd64[kk].to(torch.bfloat16), v):
            worst = max(worst, (sd64[kk].double() - v.double()).abs().max().item())
            log(f"  !! reloaded {kk} differs from the saved bf16 value")
    log(f"  reload check: {len(sd_bf16)} params, missing {missing[:5]}, max mismatch {worst}")
    meta["reload_max_abs_diff"] = worst


def reference_runs(d, name, seqs, E, k, moe, meta, reload_check):
    """HF's runs of the checkpoint in d over seqs: the fp64 CPU reference (eager
    experts) and bf16 on the CPU and, where there is one, the GPU. Returns the
    reference tensors and the flip summary; meta gains each run's facts.
    reload_check(m64) compares the loaded fp64 parameters with what was saved."""
    ref = {}
    summary = {}

    # ---- fp64 reference (CPU, eager, eager experts)
    m64, how64, impl64, info64 = load_model(d, torch.float64, moe)
    log(f"  fp64 load: {how64}; config._experts_implementation={impl64!r}; attn="
        f"{getattr(m64.config, '_attn_implementation', None)!r}")
    meta["fp64_load"] = dict(how=how64, experts_implementation=impl64,
                             attn_implementation=getattr(m64.config, "_attn_implementation", None))
    reload_check(m64)
    rot = getattr(m64.model, "rotary_emb", None)
    if rot is not None:
        meta["rope"] = dict(rope_type=getattr(rot, "rope_type", None),
                            attention_scaling=float(getattr(rot, "attention_scaling", 1.0)),
                            inv_freq_dtype=str(rot.inv_freq.dtype),
                            rope_parameters=getattr(m64.config, "rope_parameters", None))
        log(f"  rope: {meta['rope']}")
    cap = Capture(m64, E, k)
    moe_layers = [li for li, _, _ in cap.gates]
    meta["moe_layers"] = moe_layers
    meta["num_layers"] = m64.config.num_hidden_layers
    meta["num_experts"] = E
    meta["top_k"] = k
    if moe:
        log(f"  MoE layers: {moe_layers}")
    top64 = []
    rawtop_diff = 0
    for i, ids in enumerate(seqs):
        r = run_seq(m64, cap, ids, "cpu", moe)
        ref[f"logits_fp64_s{i}"] = r["logits"].to(torch.float64)
        if "inv_freq" in r:
            ref[f"inv_freq_s{i}"] = r["inv_freq"].to(torch.float64)
        if moe:
            R, src = choose_router(r, f"{name} fp64 s{i}")
            ref[f"router_fp64_s{i}"] = R.to(torch.float64)
            if i == 0:
                meta["router_source"] = src
                meta["outputs_router_logits"] = describe_out_router(r)
                meta["router_dtype_fp64_run"] = str(r["out0"][0].dtype)
                log(f"  router stored from: {src}")
                log(f"  {meta['outputs_router_logits']}")
            tk, tsrc = topk_stack(r, k, R)
            if tk is not None:
                ref[f"topk_fp64_s{i}"] = tk
                if all(w is not None and w.shape[-1] == k for w in r["w"]):
                    ref[f"topkw_fp64_s{i}"] = torch.stack([w.reshape(-1, k) for w in r["w"]]).to(torch.float64)
                    if i == 0:
                        meta["topkw_dtype_fp64_run"] = str(r["w"][0].dtype)
                # compare HF's choice with topk of the stored raw logits in float64
                mine = torch.topk(R.double(), k, dim=-1).indices
                rawtop_diff += int(set_diff_count(mine, tk).sum())
                if all(t is not None for t in r["exp_idx"]):
                    ei = torch.stack([t.reshape(-1, k) for t in r["exp_idx"]])
                    if not torch.equal(ei.long(), tk.long()):
                        log("  !! experts-module input indices differ from router output indices")
            if i == 0:
                meta["topk_source"] = tsrc
                log(f"  topk captured from: {tsrc}")
            if tk is None:   # not captured: use topk of fp32 softmax of the raw logits, for the statistics only
                tk = torch.topk(R.float().softmax(-1), k, dim=-1).indices.to(torch.int32)
            top64.append(tk)
    cap.remove()
    del m64
    if moe:
        meta["fp64_topk_vs_topk_of_fp64_logits_slots_differing"] = rawtop_diff
        log(f"  fp64: HF top-k sets vs top-k of the stored fp64 raw logits: {rawtop_diff} slots differ")
        # spread
        allk = torch.cat([t for t in top64], dim=1)   # [L, sumT, k]
        spread = []
        for j, li in enumerate(moe_layers):
            cnt = torch.bincount(allk[j].reshape(-1).long(), minlength=E).tolist()
            spread.append(cnt)
            log(f"  layer {li} tokens-per-expert (fp64, all seqs): {cnt}")
        meta["tokens_per_expert_fp64"] = {str(li): c for li, c in zip(moe_layers, spread)}
        # margins
        gaps = []
        for i in range(len(seqs)):
            R = ref[f"router_fp64_s{i}"]
            srt = torch.sort(R, dim=-1, descending=True).values
            gaps.append((srt[..., k - 1] - srt[..., k]).reshape(-1))
        gaps = torch.cat(gaps)
        log(f"  fp64 raw-logit gap between k-th and (k+1)-th: min {gaps.min().item():.3g}, "
            f"median {gaps.median().item():.3g}; logits std {ref['router_fp64_s0'].std().item():.3g}")
        meta["router_gap_min_fp64"] = gaps.min().item()
        meta["router_gap_median_fp64"] = gaps.median().item()

    # ---- bf16 runs
    runs = [("bf16cpu", "cpu")] + ([("bf16cuda", "cuda")] if HAS_CUDA else [])
    union = [None] * len(seqs)
    for tag, dev in runs:
        try:
            mb, howb, implb, _ = load_model(d, torch.bfloat16, False)
            # default experts implementation (not forced)
            mb = mb.to(dev)
            log(f"  {tag}: experts implementation {implb!r}, attn {getattr(mb.config, '_attn_implementation', None)!r}")
            meta[f"{tag}_load"] = dict(experts_implementation=implb,
                                       attn_implementation=getattr(mb.config, "_attn_implementation", None))
            capb = Capture(mb, E, k)
            flips = 0
            slots = 0
            for i, ids in enumerate(seqs):
                r = run_seq(mb, capb, ids, dev, moe)
                ref[f"logits_{tag}_s{i}"] = r["logits"].float()
                dl = (r["logits"].double() - ref[f"logits_fp64_s{i}"]).abs().max().item()
                if moe:
                    R, src = choose_router(r, f"{name} {tag} s{i}")
                    ref[f"router_{tag}_s{i}"] = R.float()
                    tk, tsrc = topk_stack(r, k, R)
                    if tk is None:
                        tk = torch.topk(R.float().softmax(-1), k, dim=-1).indices.to(torch.int32)
                    ref[f"topk_{tag}_s{i}"] = tk
                    if top64[i] is not None:
                        dm = set_diff_count(tk, top64[i])
                        union[i] = dm if union[i] is None else (union[i] | dm)
                        flips += int(dm.sum())
                        slots += dm.numel()
                        for (j, t) in dm.nonzero().tolist():
                            Rf = ref[f"router_fp64_s{i}"][j, t]
                            srt = torch.sort(Rf, descending=True).values
                            log(f"    flip {tag} s{i} layer {moe_layers[j]} pos {t}: fp64 {sorted(top64[i][j, t].tolist())}"
                                f" vs {sorted(tk[j, t].tolist())}; fp64 gap k/k+1 {(srt[k-1]-srt[k]).item():.3g}")
                log(f"    {tag} s{i}: max|logits - fp64| = {dl:.3g}")
            capb.remove()
            del mb
            if moe:
                summary[tag] = dict(flipped_slots=flips, slots=slots)
                log(f"  {tag}: top-k sets differing from fp64: {flips} of {slots} (layer,position) slots")
        except Exception as e:  # noqa
            log(f"  !! {tag} run failed: {e!r}")
            traceback.print_exc()
            meta["notes"].append(f"{tag} run failed: {e!r}")
    if moe and all(u is not None for u in union):
        summary["cpu_or_cuda"] = dict(flipped_slots=int(sum(int(u.sum()) for u in union)),
                                      slots=int(sum(u.numel() for u in union)))
        log(f"  bf16 cpu OR cuda: top-k sets differing from fp64: {summary['cpu_or_cuda']}")
    if moe:
        meta["topk_set_flips_vs_fp64"] = summary
    if HAS_CUDA:
        torch.cuda.empty_cache()
    return ref, summary


def write_reference(d, ref, meta, moe, list_files):
    """ref.safetensors and meta.json in d (meta gains the tensor table, and the
    file sizes when list_files)."""
    for kk in list(ref):
        ref[kk] = ref[kk].contiguous()
    # kept xz-compressed (the references are most of the repository's size; the tests read the .xz)
    save_file(ref, os.path.join(d, "ref.safetensors"))
    with open(os.path.join(d, "ref.safetensors"), "rb") as f, lzma.open(os.path.join(d, "ref.safetensors.xz"), "wb", preset=9) as g:
        g.write(f.read())
    os.remove(os.path.join(d, "ref.safetensors"))
    meta["ref_tensors"] = {kk: [str(v.dtype).replace("torch.", ""), list(v.shape)] for kk, v in sorted(ref.items())}
    meta["router_meaning"] = ("router_*: raw router logits = F.linear(post_attention_layernorm output, "
                              "mlp.gate.weight), before softmax, one [T,E] slab per MoE layer in layer order; "
                              "topk_*: expert ids HF selected (descending routing probability)") if moe else \
        "dense model: no router"
    if list_files:
        meta["files"] = {os.path.basename(f): os.path.getsize(f) for f in sorted(glob.glob(os.path.join(d, "*")))}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def make_case(name, cdef, seed, outdir, tmproot, printed_src):
    t0 = time.time()
    d = os.path.join(outdir, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    meta = dict(case=name, description=cdef["desc"], transformers=transformers.__version__,
                torch=torch.__version__, python=platform.python_version(), seed=seed,
                torch_num_threads=torch.get_num_threads(),
                cuda_device=torch.cuda.get_device_name(0) if HAS_CUDA else None,
                command="python3 tools/make_fixtures.py --out DIR", notes=[])

    # ---- build, init, round to bf16
    cfg = build_config(cdef)
    Cls = getattr(transformers, cdef["cls"])
    torch.manual_seed(seed)
    model = Cls(cfg)
    model.eval()
    E = n_experts(model.config) if "Llama" not in cdef["cls"] else None
    k = getattr(model.config, "num_experts_per_tok", None) if E else None
    moe = E is not None
    g = torch.Generator().manual_seed(seed + 7)
    perturbed = []
    with torch.no_grad():
        for pn, p in model.named_parameters():
            if pn.endswith("norm.weight"):
                # class init is all ones: perturb so a missing norm-weight multiply is caught
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif pn.endswith(".bias"):
                # class init is zeros: make the bias matter
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                pf = p.float()
                ok = bool(torch.isfinite(pf).all()) and abs(pf.std().item() - 0.05) < 0.02 and \
                    abs(pf.mean().item()) < 0.02
                if not ok:
                    log(f"  !! {pn} {list(p.shape)} looks uninitialised (mean {pf.mean().item():.3g}, "
                        f"std {pf.std().item():.3g}) -> normal(0, 0.05)")
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
                    perturbed.append(f"{pn} re-initialised normal(0,0.05) (class init looked degenerate)")
        for li, gate, _ in (gate_modules(model, E) if moe else []):
            s = gate.weight.float().std().item()
            if s < 1e-3:
                log(f"  !! router weight of layer {li} degenerate (std {s:.3g}) -> normal(0, 0.05)")
                gate.weight.copy_(torch.randn(gate.weight.shape, generator=g) * 0.05)
                perturbed.append(f"layer {li} router weight re-init normal(0,0.05)")
    perturbed.append("every *norm.weight set to 1 + 0.2*N(0,1) (class init is all ones)")
    if any(pn.endswith(".bias") for pn, _ in model.named_parameters()):
        perturbed.append("every bias set to 0.1*N(0,1) (class init is zeros)")
    meta["init"] = ("class init under torch.manual_seed(%d) (initializer_range 0.05); then " % seed) + \
        "; ".join(perturbed) + "; then model.to(torch.bfloat16)"
    model = model.to(torch.bfloat16)
    sd_bf16 = {kk: v.detach().clone() for kk, v in model.state_dict().items()}
    if moe:
        ws = [gate.weight.float().std().item() for _, gate, _ in gate_modules(model, E)]
        log(f"  E={E} k={k}; router weight std per MoE layer: {[round(w, 4) for w in ws]}")

    # router source print (once per class)
    if moe:
        gcls = type(gate_modules(model, E)[0][1])
        if gcls.__name__ not in printed_src:
            printed_src.add(gcls.__name__)
            try:
                log(f"  ---- source of {gcls.__name__}.forward ----")
                log(inspect.getsource(gcls.forward))
            except Exception as e:  # noqa
                log("  (no source)", e)

    # ---- save
    if cdef.get("shard"):
        how = None
        for ms in ("600KB", "500KB", "400KB", "800KB", "300KB"):
            shutil.rmtree(d)
            os.makedirs(d)
            how = save_hf(model, d, max_shard_size=ms)
            shards = sorted(glob.glob(os.path.join(d, "model-*.safetensors")))
            log(f"  max_shard_size={ms}: {len(shards)} shards")
            if 2 <= len(shards) <= 3 and os.path.exists(os.path.join(d, "model.safetensors.index.json")):
                break
        meta["saved_with"] = how
    elif cdef.get("fused"):
        try:
            how = save_hf(model, d, save_original_format=False)
            names = st_names(d)
        except TypeError as e:
            log("  save_original_format=False rejected:", repr(e))
            how, names = None, {}
        if not any(n.endswith("mlp.experts.gate_up_proj") for n in names):
            log(f"  save_original_format=False did not give fused names (how={how}); writing safetensors myself")
            shutil.rmtree(d)
            os.makedirs(d)
            save_hf(model, d)     # for config.json (architectures, dtype) as save_pretrained writes it
            for f in glob.glob(os.path.join(d, "*.safetensors*")):
                os.remove(f)
            tensors = {kk: v.contiguous() for kk, v in model.state_dict().items()}
            save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            how = "save_pretrained for config.json, then safetensors.torch.save_file(model.state_dict()) (manual)"
        meta["saved_with"] = how
    else:
        meta["saved_with"] = save_hf(model, d)
    log(f"  saved with {meta['saved_with']}")

    names = st_names(d)
    meta["tensor_count"] = len(names)
    if cdef.get("fused") or name in ("mixtral_linear_v4cfg",):
        log("  tensor names on disk:")
        for kk in sorted(names):
            log(f"    {kk} {names[kk]}")
    else:
        log("  layer-0 / non-layer tensor names on disk:")
        for kk in sorted(names):
            if "layers." not in kk or "layers.0." in kk:
                if re.search(r"experts\.([1-9]\d*)\.", kk):
                    continue
                log(f"    {kk} {names[kk]}")
    if cdef.get("fused"):
        H = model.config.hidden_size
        I = model.config.moe_intermediate_size
        for kk, (_, dt, shp) in names.items():
            if kk.endswith("mlp.experts.gate_up_proj"):
                assert shp == [E, 2 * I, H], (kk, shp)
            if kk.endswith("mlp.experts.down_proj"):
                assert shp == [E, H, I], (kk, shp)
        assert any(kk.endswith("mlp.experts.gate_up_proj") for kk in names), "no fused tensors on disk"
    if cdef.get("tied"):
        assert "lm_head.weight" not in names, "lm_head.weight present although tied"
        log("  tied: lm_head.weight absent from the saved file(s): OK")
        meta["notes"].append("lm_head.weight absent on disk (tie_word_embeddings true): logits use embed_tokens")
    for kk, (_, dt, _) in names.items():
        assert dt in ("BF16", "bfloat16", "torch.bfloat16") or "BF16" in dt.upper(), (kk, dt)

    # ---- tokens
    V = model.config.vocab_size
    tg = torch.Generator().manual_seed(seed + 1)
    seqs = [torch.randint(0, V, (T,), generator=tg).tolist() for T in SEQ_LENS]
    with open(os.path.join(d, "tokens.jsonl"), "w") as f:
        for i, s in enumerate(seqs):
            f.write(json.dumps({"id": f"s{i}", "tokens": s}) + "\n")

    # ---- alternate-format checks (before computing refs)
    if cdef.get("v4cfg") or cdef.get("fused"):
        alt = os.path.join(tmproot, name + "_alt")
        if os.path.exists(alt):
            shutil.rmtree(alt)
    if cdef.get("v4cfg"):
        shutil.copytree(d, alt)     # v5-spelled copy
        cp = os.path.join(d, "config.json")
        with open(cp) as f:
            cj = json.load(f)
        log(f"  v5 config rope_parameters: {cj.get('rope_parameters')}")
        cj.pop("rope_parameters", None)
        cj.pop("rope_scaling", None)
        cj.pop("rope_theta", None)
        cj.update(copy.deepcopy(cdef["v4cfg"]))
        with open(cp, "w") as f:
            json.dump(cj, f, indent=2, sort_keys=True)
            f.write("\n")
        a = fp64_logits(alt, seqs)
        b = fp64_logits(d, seqs)
        md = maxdiff(a, b)
        lc = transformers.AutoConfig.from_pretrained(d)
        rp = getattr(lc, "rope_parameters", None)
        log(f"  v4-spelled config loads as rope_parameters={rp}; max|logits(v4 cfg)-logits(v5 cfg)| fp64 = {md:.3g}")
        meta["v4cfg_check"] = dict(loaded_rope_parameters=rp, max_abs_logit_diff_vs_v5_config=md)
        if md != 0.0:
            meta["notes"].append(f"WARNING: v4-spelled config gives different logits than the v5 one (max {md})")
        shutil.rmtree(alt)
    if cdef.get("fused"):
        torch.manual_seed(0)
        save_hf(model, alt)    # default (per-expert) format
        pe = st_names(alt)
        log(f"  default save_pretrained of the same model writes {len(pe)} tensors, e.g. "
            f"{sorted(n for n in pe if 'layers.0.mlp' in n)[:4]}")
        a = fp64_logits(alt, seqs)
        b = fp64_logits(d, seqs)
        md = maxdiff(a, b)
        log(f"  fused-on-disk vs per-expert-on-disk: max|logits diff| fp64 = {md:.3g}")
        meta["fused_check"] = dict(max_abs_logit_diff_vs_per_expert_checkpoint=md,
                                   per_expert_tensor_count=len(pe))
        if md != 0.0:
            meta["notes"].append(f"WARNING: fused checkpoint loads differently from per-expert (max {md})")
        shutil.rmtree(alt)

    ref, summary = reference_runs(d, name, seqs, E, k, moe, meta, lambda m64: check_reload_by_name(m64, sd_bf16, meta))
    write_reference(d, ref, meta, moe, list_files=True)
    tot = sum(meta["files"].values())
    log(f"  {name}: {tot/1e6:.2f} MB, {time.time()-t0:.1f} s")
    return dict(flips=summary, bytes=tot)


# --------------------------------------------------------------------------------------------
# transformers source copy
# --------------------------------------------------------------------------------------------

def copy_hfsrc(dst):
    root = os.path.dirname(transformers.__file__)
    want = set()
    for m in ("llama", "olmoe", "qwen2_moe", "qwen3_moe", "mixtral"):
        for p in ("modeling", "configuration", "modular"):
            rel = f"models/{m}/{p}_{m}.py"
            if os.path.exists(os.path.join(root, rel)):
                want.add(rel)
    for rel in ("modeling_rope_utils.py", "conversion_mapping.py", "core_model_loading.py",
                "integrations/moe.py", "modeling_utils.py", "configuration_utils.py", "activations.py",
                "integrations/sdpa_attention.py", "masking_utils.py"):
        if os.path.exists(os.path.join(root, rel)):
            want.add(rel)
    pat = re.compile(r"grouped_mm|def use_experts_implementation|class OutputRecorder|ALL_EXPERTS_FUNCTIONS")
    for dp, dn, fn in os.walk(root):
        reld = os.path.relpath(dp, root)
        if reld.startswith("models") or "__pycache__" in reld:
            continue
        for f in fn:
            if f.endswith(".py"):
                p = os.path.join(dp, f)
                try:
                    with open(p, errors="replace") as fh:
                        if pat.search(fh.read()):
                            want.add(os.path.relpath(p, root))
                except OSError:
                    pass
    for rel in sorted(want):
        o = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(o), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), o)
    with open(os.path.join(dst, "FILES.txt"), "w") as f:
        f.write(f"transformers {transformers.__version__} from {root}\ntorch {torch.__version__}\n")
        for rel in sorted(want):
            f.write(rel + "\n")
    log(f"hfsrc: copied {len(want)} files from {root} to {dst}:")
    for rel in sorted(want):
        log("   ", rel)


# --------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="")
    ap.add_argument("--hfsrc", default="")
    a = ap.parse_args()
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
        f"cuda {HAS_CUDA} {torch.cuda.get_device_name(0) if HAS_CUDA else ''}, threads {torch.get_num_threads()}")
    if a.hfsrc:
        try:
            copy_hfsrc(a.hfsrc)
        except Exception as e:  # noqa
            log("hfsrc copy failed:", repr(e))
            traceback.print_exc()
    os.makedirs(a.out, exist_ok=True)
    defs = case_defs()
    names = [c for c in a.cases.split(",") if c] or list(defs)
    tmproot = tempfile.mkdtemp(prefix="mkfx_")
    printed = set()
    results = {}
    failed = []
    for ci, name in enumerate(names):
        log(f"\n===== case {name} =====")
        try:
            results[name] = make_case(name, defs[name], 1000 + 17 * list(defs).index(name), a.out, tmproot, printed)
        except Exception as e:  # noqa
            log(f"!! case {name} FAILED: {e!r}")
            traceback.print_exc()
            sys.stdout.flush()
            failed.append(name)
    shutil.rmtree(tmproot, ignore_errors=True)
    log("\n===== summary =====")
    tot = 0
    for n, r in results.items():
        tot += r["bytes"]
        log(f"  {n:24s} {r['bytes']/1e6:6.2f} MB  flips {r['flips']}")
    log(f"  total {tot/1e6:.2f} MB; failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
