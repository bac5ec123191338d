#!/usr/bin/env python3
"""Tiny Hugging Face checkpoints of the 2026 MoE families, with transformers' own outputs, as test fixtures.

Usage (on the GPU machine, with torch, transformers and safetensors; CUDA optional):

    python3 tools/make_fixtures_2026.py --out DIR [--cases a,b,...] [--new 16] [--no-hfsrc] [--compact]

Families: deepseek_v3 (with and without q_lora_rank, YaRN with mscale/mscale_all_dim, rope_interleave on and
off, FP8 e4m3 weights with weight_scale_inv block scales), deepseek_v2 (greedy and group_limited_greedy),
glm4_moe (partial rotary, qk-norm, grouped sigmoid routing) and gpt_oss (sinks, sliding/full layer_types, YaRN,
biases, clamped SwiGLU, bf16 and MXFP4 experts). Every case runs on its own (try/except): one failing case is
logged with its traceback and the others are still made. DIR/_hfsrc/ receives the installed transformers files
the cases run (so the exact source the references came from is kept), DIR/SUMMARY.json what each case gave.

For each case DIR/<case>/ holds:
  config.json, generation_config.json, model.safetensors   the checkpoint (bf16; FP8/MXFP4 where the case says)
  tokens.jsonl                                             three random sequences, 21, 13 and 34 tokens
  ref.safetensors                                          the references below
  generate.json                                            fp64 greedy continuations (as make_generate_fixtures.py)
  meta.json                                                how it was made, what was checked

ref.safetensors, for sequence index i (s0, s1, s2); L = number of MoE layers, E experts, k top-k, G groups:
  logits_fp64_s{i}    [T,V]   F64  float64 model, eager attention, eager experts, CPU
  router_fp64_s{i}    [L,T,E] F64  raw router logits as the router computes them (DeepSeek/GLM: F.linear in fp32
                                   even in the float64 model; gpt-oss: in the model dtype, with the router bias)
  scores_fp64_s{i}    [L,T,E] F64  the scores the selection starts from: sigmoid(logits) (deepseek_v3, glm4_moe),
                                   softmax(logits) in fp32 (deepseek_v2), the logits (gpt_oss)
  choice_fp64_s{i}    [L,T,E] F64  sigmoid routers only: scores + e_score_correction_bias, what top-k ranks
  groupscore_fp64_s{i}[L,T,G] F64  grouped routers only: each group's score (deepseek_v3/glm4_moe: sum of the top-2
                                   biased scores; deepseek_v2 group_limited_greedy: the max probability)
  groups_fp64_s{i}    [L,T,g] I32  grouped routers only: the topk_group groups chosen, ascending
  topk_fp64_s{i}      [L,T,k] I32  the experts dispatched (captured entering the experts module), in HF's order
                                   (torch.topk(sorted=False) for DeepSeek/GLM: not necessarily by score)
  topkw_fp64_s{i}     [L,T,k] F64  the routing weight applied to each of them (same order)
  logits_bf16cpu_s{i}, router_bf16cpu_s{i}, scores_bf16cpu_s{i}, choice_bf16cpu_s{i}, topk_bf16cpu_s{i},
  topkw_bf16cpu_s{i}  bf16 model (dtype=torch.bfloat16), eager attention, default experts implementation, CPU
  ..._bf16cuda_s{i}   the same on CUDA (TF32 and reduced-precision reductions off); absent without a GPU
  inv_freq_s{i}       [D/2]   F64  model.model.rotary_emb.inv_freq after sequence i (values as HF holds them)

Quantized cases (deepseek_v3_fp8, gpt_oss_mxfp4) keep their checkpoint in the released format and compute the
references from transformers' own dequantisation (FineGrainedFP8Config / Mxfp4Config with dequantize=True). The
script also dequantises the files itself (FP8: fp32(q * scale_inv) per block, as Fp8Dequantize; MXFP4: the e2m1
table times 2^(scale-127), as convert_moe_packed_tensors) and compares the loaded parameters with that; when
transformers' path fails or disagrees, the references come from the script's dequantised copy and meta.json
says so.
"""

import lzma
import argparse
import glob
import inspect
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402
from safetensors.torch import save_file, load_file  # noqa: E402

import make_fixtures as mf  # noqa: E402  (its helpers; importing it sets the CUDA precision flags)

SEQ_LENS = mf.SEQ_LENS
HAS_CUDA = mf.HAS_CUDA
log = mf.log
BASE = dict(hidden_size=64, num_attention_heads=4, vocab_size=384, num_hidden_layers=3, initializer_range=0.05,
            rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
FP8_BLOCK = [16, 16]
SUMMARY = {}


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------

def case_defs(compact=False):
    """compact: vocabulary 128, expert width 16 and dense width 64 in the DeepSeek-family cases (about half the
    bytes: the repository's fixtures share a size budget); gpt-oss: vocabulary 128, expert width 32 (MXFP4 needs
    widths of 32)."""
    C = {}
    if compact:
        global BASE
        BASE = dict(BASE, vocab_size=128)
    wide = dict(intermediate_size=64, moe_intermediate_size=16) if compact else dict(intermediate_size=96,
                                                                                      moe_intermediate_size=32)
    v3 = dict(BASE, num_key_value_heads=4, **wide, n_routed_experts=16,
              num_experts_per_tok=4, n_group=4, topk_group=2, kv_lora_rank=32, qk_rope_head_dim=16,
              qk_nope_head_dim=24, v_head_dim=20, first_k_dense_replace=1, max_position_embeddings=256)
    C["deepseek_v3"] = dict(
        cls="DeepseekV3ForCausalLM", cfg="DeepseekV3Config", family="deepseek_v3",
        kw=dict(v3, q_lora_rank=32, n_shared_experts=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                rope_interleave=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        desc="DeepSeek-V3: MLA with q_lora_rank 32, kv_lora_rank 32, rope 16 / nope 24 / v 20 (qk_head_dim 40), "
             "rope_interleave False; 16 routed experts top-4 in 4 groups of 4, topk_group 2, non-zero "
             "e_score_correction_bias, norm_topk_prob True, routed_scaling_factor 2.5, 2 shared experts; "
             "first_k_dense_replace 1 (layer 0 is a dense MLP of 96).")
    C["deepseek_v3_noqlora"] = dict(
        cls="DeepseekV3ForCausalLM", cfg="DeepseekV3Config", family="deepseek_v3",
        kw=dict(v3, q_lora_rank=None, n_shared_experts=1, routed_scaling_factor=1.5, norm_topk_prob=False,
                rope_interleave=True, rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
        desc="DeepSeek-V3 without q_lora_rank (plain q_proj, as Moonlight / Kimi-style configs), rope_interleave "
             "True, rope_theta 5e4, norm_topk_prob False, routed_scaling_factor 1.5, 1 shared expert; groups, "
             "bias and dims as deepseek_v3.")
    C["deepseek_v3_yarn"] = dict(
        cls="DeepseekV3ForCausalLM", cfg="DeepseekV3Config", family="deepseek_v3",
        kw=dict(v3, q_lora_rank=32, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                rope_interleave=True, max_position_embeddings=128,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 0.8,
                                 "beta_fast": 32.0, "beta_slow": 1.0}),
        desc="DeepSeek-V3 with YaRN (factor 4, original_max_position_embeddings 16, max_position_embeddings 128 "
             "(a ratio of 8, not 4: shows which of the two each part of transformers uses), mscale 1.0, "
             "mscale_all_dim 0.8: cos/sin scaled by mscale(f,1)/mscale(f,0.8) and the softmax scale by "
             "mscale(f,0.8)^2) and rope_interleave True.")
    C["deepseek_v3_fp8"] = dict(
        cls="DeepseekV3ForCausalLM", cfg="DeepseekV3Config", family="deepseek_v3", quant="fp8",
        kw=dict(v3, q_lora_rank=32, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                rope_interleave=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        desc="DeepSeek-V3 in the released FP8 format: every linear weight of the layers (attention, dense MLP, "
             "routed and shared experts) stored F8_E4M3 with an F32 weight_scale_inv per 16x16 block "
             "(quantization_config as DeepSeek-V3's, weight_block_size [16, 16]); router, norms, embeddings, "
             "lm_head and e_score_correction_bias as in the bf16 cases.")
    v2 = dict(BASE, num_key_value_heads=4, **wide, n_routed_experts=16,
              num_experts_per_tok=4, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=24, v_head_dim=20,
              first_k_dense_replace=1, max_position_embeddings=256, n_shared_experts=2,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    C["deepseek_v2_greedy"] = dict(
        cls="DeepseekV2ForCausalLM", cfg="DeepseekV2Config", family="deepseek_v2",
        kw=dict(v2, q_lora_rank=None, topk_method="greedy", routed_scaling_factor=2.0, norm_topk_prob=False),
        desc="DeepSeek-V2 (V2-Lite style: no q_lora_rank): softmax router, topk_method greedy, "
             "routed_scaling_factor 2.0, 2 shared experts, first_k_dense_replace 1, MLA dims as deepseek_v3, "
             "complex (interleaved) RoPE in fp32.")
    C["deepseek_v2_group"] = dict(
        cls="DeepseekV2ForCausalLM", cfg="DeepseekV2Config", family="deepseek_v2",
        kw=dict(v2, q_lora_rank=32, topk_method="group_limited_greedy", n_group=4, topk_group=2,
                routed_scaling_factor=1.0, norm_topk_prob=False),
        desc="DeepSeek-V2 with q_lora_rank 32 and topk_method group_limited_greedy (4 groups of 4, topk_group 2, "
             "groups ranked by their largest probability).")
    C["glm4_moe"] = dict(
        cls="Glm4MoeForCausalLM", cfg="Glm4MoeConfig", family="glm4_moe",
        kw=dict(BASE, num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.5, use_qk_norm=True,
                attention_bias=True, **wide, n_routed_experts=16,
                num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
                norm_topk_prob=True, routed_scaling_factor=2.5, max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        desc="GLM-4.5 (glm4_moe): head_dim 32 != 64/4, partial_rotary_factor 0.5 (RoPE on 16 of 32 dims), "
             "use_qk_norm True (per head), q/k/v biases, 16 routed experts top-4 in 4 groups (topk_group 2) with "
             "sigmoid + non-zero e_score_correction_bias, norm_topk_prob True, routed_scaling_factor 2.5, "
             "1 shared expert, first_k_dense_replace 1.")
    # transformers 5.17's GptOssExperts fixes limit 7.0 (no config key): init_model puts some expert biases near
    # +-7 so the clamp acts. Compact: vocabulary 128 and expert width 32 (MXFP4 blocks need 32 inputs).
    oss = dict(BASE, num_key_value_heads=2, head_dim=16, intermediate_size=32 if compact else 64,
               num_local_experts=8,
               num_experts_per_tok=4, sliding_window=8, max_position_embeddings=64, attention_bias=True,
               layer_types=["sliding_attention", "full_attention", "sliding_attention"],
               rms_norm_eps=1e-5,
               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})
    C["gpt_oss"] = dict(
        cls="GptOssForCausalLM", cfg="GptOssConfig", family="gpt_oss",
        kw=dict(oss),
        desc="gpt-oss: 8 experts top-4 (router with bias: top-k of the logits, softmax over the k), attention "
             "sinks (non-zero), layer_types sliding/full/sliding with sliding_window 8 (< 13, 21, 34), YaRN "
             "(factor 4, original 16, max_pos 64, truncate False, theta 1.5e5), q/k/v/o and expert biases, "
             "a quarter of the gate and up biases near +-7 (so the clamp at limit 7.0 acts), fused interleaved "
             "gate_up_proj [E,H,2I].")
    C["gpt_oss_mxfp4"] = dict(
        cls="GptOssForCausalLM", cfg="GptOssConfig", family="gpt_oss", quant="mxfp4",
        kw=dict(oss),
        desc="gpt_oss with its experts in the released MXFP4 format: gate_up_proj_blocks [E,2I,H/32,16] and "
             "down_proj_blocks [E,H,I/32,16] (uint8, two e2m1 values a byte, low nibble first), *_scales "
             "(uint8 exponents, bias 127), biases bf16, quantization_config as gpt-oss's.")
    if compact:
        for name, c in C.items():
            if c["family"] != "gpt_oss":
                c["desc"] = (c["desc"].replace("dense MLP of 96", "dense MLP of 64") +
                             " Compact: vocabulary 128, expert width 16, dense width 64.")
            else:
                c["desc"] += " Compact: vocabulary 128, expert width 32."
    return C


# --------------------------------------------------------------------------------------------
# model pieces
# --------------------------------------------------------------------------------------------

def moe_modules(model):
    """[(layer_idx, mlp_module)] of the MoE layers: those whose mlp has an `experts` child."""
    out = []
    for li, layer in enumerate(model.model.layers):
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and hasattr(mlp, "experts"):
            out.append((li, mlp))
    return out


def router_weight(mlp):
    """(weight, bias) of the router of an MoE block: `gate` (DeepSeek, GLM) or `router` (gpt-oss)."""
    r = getattr(mlp, "gate", None)
    if r is None:
        r = getattr(mlp, "router")
    return r.weight, getattr(r, "bias", None), r


def n_experts_of(cfg):
    for name in ("n_routed_experts", "num_local_experts", "num_experts"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


class RouteCapture:
    """Per MoE layer: the block's input (pre-hook on the MoE module) and what enters the experts module
    (indices and weights, pre-hook). Everything else is recomputed from the input with transformers' own ops."""

    def __init__(self, model):
        self.mods = moe_modules(model)
        self.handles = []
        self.reset()
        for j, (li, mlp) in enumerate(self.mods):
            self.handles.append(mlp.register_forward_pre_hook(self._in_hook(j), with_kwargs=True))
            self.handles.append(mlp.experts.register_forward_pre_hook(self._exp_hook(j), with_kwargs=True))

    def reset(self):
        n = len(self.mods)
        self.x = [None] * n
        self.idx = [None] * n
        self.w = [None] * n

    def _in_hook(self, j):
        def hook(mod, args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            self.x[j] = x.detach().reshape(-1, x.shape[-1]).clone()
        return hook

    def _exp_hook(self, j):
        def hook(mod, args, kwargs):
            ts = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
            ints = [t for t in ts if not t.is_floating_point()]
            flts = [t for t in ts[1:] if t.is_floating_point()]
            self.idx[j] = ints[0].detach().clone() if ints else None
            self.w[j] = flts[0].detach().clone() if flts else None
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def route_tensors(family, model, mlp, x, idx, w):
    """Recomputes the router's scores from the block input x [T,H] with the ops transformers uses, and returns
    the dict of per-layer tensors, plus a consistency note (our selection vs the captured one)."""
    cfg = model.config
    W, b, rmod = router_weight(mlp)
    E = W.shape[0]
    k = cfg.num_experts_per_tok
    out = {}
    if family in ("deepseek_v3", "glm4_moe", "deepseek_v2"):
        logits = F.linear(x.type(torch.float32), W.type(torch.float32))
    else:
        logits = F.linear(x, W, b)
    out["router"] = logits
    sel = None
    if family in ("deepseek_v3", "glm4_moe"):
        scores = logits.sigmoid()
        bias = rmod.e_score_correction_bias
        choice = scores + bias
        G = cfg.n_group
        gs = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
        gi = torch.topk(gs, k=cfg.topk_group, dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gi, 1)
        smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        masked = choice.masked_fill(~smask.bool(), float("-inf"))   # as DeepseekV3TopkRouter in 5.17
        sel = torch.topk(masked, k=k, dim=-1, sorted=False)[1]
        out.update(scores=scores, choice=choice, groupscore=gs, groups=torch.sort(gi, dim=-1).values)
        # what the bias and the groups change, for the statistics
        out["_plain_topk_scores"] = torch.topk(scores, k=k, dim=-1)[1]
        out["_plain_topk_choice"] = torch.topk(choice, k=k, dim=-1)[1]
    elif family == "deepseek_v2":
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        out["scores"] = probs
        if getattr(cfg, "topk_method", "greedy") == "group_limited_greedy":
            G = cfg.n_group
            gs = probs.view(-1, G, E // G).max(dim=-1).values
            gi = torch.topk(gs, k=cfg.topk_group, dim=-1, sorted=False)[1]
            gmask = torch.zeros_like(gs).scatter_(1, gi, 1)
            smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
            sel = torch.topk(probs.masked_fill(~smask.bool(), 0.0), k=k, dim=-1, sorted=False)[1]
            out.update(groupscore=gs, groups=torch.sort(gi, dim=-1).values)
            out["_plain_topk_scores"] = torch.topk(probs, k=k, dim=-1)[1]
        else:
            sel = torch.topk(probs, k=k, dim=-1, sorted=False)[1]
    else:   # gpt_oss: top-k of the logits (with the router bias), softmax over the k
        out["scores"] = logits
        sel = torch.topk(logits, k=k, dim=-1)[1]
    note = {}
    if family == "gpt_oss":   # how often the clamp at 7.0 acts on the dispatched experts' gate and up values
        try:
            ex = mlp.experts
            gu = torch.einsum("th,ehc->etc", x.to(ex.gate_up_proj.dtype), ex.gate_up_proj) + ex.gate_up_proj_bias[:, None, :]
            hit = torch.zeros(gu.shape[:2], dtype=torch.bool)
            if idx is not None:
                ii = idx.reshape(-1, idx.shape[-1]).long().cpu()
                hit[ii.T, torch.arange(ii.shape[0])[None, :].expand_as(ii.T)] = True
            hit = hit.to(gu.device)[..., None]
            note["clamp_gate_above_7"] = int(((gu[..., ::2] > 7.0) & hit).sum())
            note["clamp_up_beyond_7"] = int(((gu[..., 1::2].abs() > 7.0) & hit).sum())
            note["gate_up_values_dispatched"] = int(hit.sum()) * gu.shape[-1] // 2
        except Exception as e:  # noqa
            note["clamp_count_failed"] = repr(e)
    if idx is not None:
        idx = idx.reshape(-1, idx.shape[-1])
        if idx.shape[-1] != k:
            note["captured_index_shape"] = list(idx.shape)
        out["topk"] = idx.to(torch.int32)
        if w is not None:
            w2 = w.reshape(idx.shape[0], -1)
            if w2.shape[-1] == E and E != k:
                w2 = torch.gather(w2, 1, idx.long())
            out["topkw"] = w2
        note["our_selection_vs_dispatched_sets_differing"] = int(mf.set_diff_count(sel, idx).sum())
    else:
        out["topk"] = sel.to(torch.int32)
        note["topk_source"] = "recomputed (nothing captured entering the experts)"
    return out, note


# --------------------------------------------------------------------------------------------
# loading, quantisation
# --------------------------------------------------------------------------------------------

def quant_config_for(cdef, dequantize=True):
    q = cdef.get("quant")
    if q == "fp8":
        Cfg = getattr(transformers, "FineGrainedFP8Config")
        try:
            return Cfg(weight_block_size=tuple(FP8_BLOCK), dequantize=dequantize)
        except TypeError:
            c = Cfg(weight_block_size=tuple(FP8_BLOCK))
            c.dequantize = dequantize
            return c
    if q == "mxfp4":
        Cfg = getattr(transformers, "Mxfp4Config")
        try:
            return Cfg(dequantize=dequantize)
        except TypeError:
            c = Cfg()
            c.dequantize = dequantize
            return c
    return None


def load(d, dtype, eager_experts, qcfg=None, device="cpu"):
    kw = dict(dtype=dtype, attn_implementation="eager")
    if qcfg is not None:
        kw["quantization_config"] = qcfg
    how = "default experts"
    if eager_experts:
        kw["experts_implementation"] = "eager"
        how = "experts_implementation='eager'"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, **kw)
    except (TypeError, ValueError) as e:
        if not eager_experts or "experts_implementation" not in str(e):
            raise
        log("  experts_implementation kwarg rejected:", repr(e))
        kw.pop("experts_implementation")
        model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, **kw)
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
        model.config._experts_implementation = "eager"
        how = "set_experts_implementation('eager') after loading"
    idict = info if isinstance(info, dict) else {}
    bad = {kk: v for kk, v in idict.items() if v}
    model.eval()
    model = model.to(device)
    return model, dict(how=how, experts_implementation=getattr(model.config, "_experts_implementation", None),
                       attn_implementation=getattr(model.config, "_attn_implementation", None),
                       loading_info_not_clean={kk: [str(x) for x in v] for kk, v in bad.items()})


FP8_LINEAR = re.compile(r"\.(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|gate_proj|up_proj|"
                        r"down_proj)\.weight$")


def fp8_quantize_dir(d, meta):
    """Rewrites the bf16 checkpoint in d as DeepSeek-V3's FP8 format; returns {name: dequantized fp32 tensor}."""
    files = sorted(glob.glob(os.path.join(d, "model*.safetensors")))
    tensors = {}
    for f in files:
        tensors.update(load_file(f))
        os.remove(f)
    for f in glob.glob(os.path.join(d, "model.safetensors.index.json")):
        os.remove(f)
    bm, bn = FP8_BLOCK
    out, deq, quantized, kept3d = {}, {}, [], []
    fmax = torch.finfo(torch.float8_e4m3fn).max
    for name, t in sorted(tensors.items()):
        if t.dim() == 3 and re.search(r"experts\.(gate_up_proj|down_proj)$", name):
            kept3d.append(name)
        if t.dim() != 2 or not FP8_LINEAR.search(name):
            out[name] = t
            continue
        R, C = t.shape
        if R % bm or C % bn:
            raise RuntimeError(f"{name} {list(t.shape)} is not tiled by the FP8 block {FP8_BLOCK}")
        w = t.to(torch.float32).reshape(R // bm, bm, C // bn, bn)
        amax = w.abs().amax(dim=(1, 3))
        s = torch.where(amax > 0, amax / fmax, torch.ones_like(amax)).to(torch.float32)   # weight_scale_inv
        q = (w / s[:, None, :, None]).clamp(-fmax, fmax).to(torch.float8_e4m3fn).reshape(R, C)
        out[name] = q.contiguous()
        sname = name[: -len(".weight")] + ".weight_scale_inv"
        out[sname] = s.contiguous()
        deq[name] = (q.to(torch.float32).reshape(R // bm, bm, C // bn, bn) * s[:, None, :, None]).reshape(R, C)
        quantized.append(name)
    save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cp = os.path.join(d, "config.json")
    with open(cp) as f:
        cj = json.load(f)
    cj["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                 "weight_block_size": list(FP8_BLOCK)}
    with open(cp, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    if not quantized:
        raise RuntimeError("no linear weight matched the FP8 pattern: the saved tensor names are not as expected")
    meta["quantized_tensors"] = len(quantized)
    meta["fp8_block"] = list(FP8_BLOCK)
    meta["fp8_scale_rule"] = ("weight_scale_inv = amax(|w| over the 16x16 block) / 448 in fp32 (w: the bf16 "
                              "weight); q = (w / weight_scale_inv).to(float8_e4m3fn); dequantised value = "
                              "fp32(q * weight_scale_inv)")
    if kept3d:
        meta["notes"].append(f"fused 3-D expert tensors on disk were left bf16: {kept3d[:4]}")
    log(f"  fp8: {len(quantized)} linear weights quantized (block {FP8_BLOCK}), e.g. {quantized[:3]}")
    return deq


FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_pack(wt):
    """wt [E, R, C] (C a multiple of 32) -> (blocks [E,R,C/32,16] uint8, scales [E,R,C/32] uint8, dequant f32)."""
    E, R, C = wt.shape
    g = wt.to(torch.float32).reshape(E, R, C // 32, 32)
    amax = g.abs().amax(dim=-1)
    # the smallest exponent whose 6 * 2^e covers the block's largest value
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.full_like(amax, -127.0)).clamp(-127, 127)
    scaled = g / torch.pow(2.0, e)[..., None]
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float32)
    code = (scaled.abs()[..., None] - mags).abs().argmin(dim=-1)            # nearest magnitude, lower on ties
    code = code + torch.where(scaled < 0, 8, 0)
    code = torch.where((code == 8), torch.zeros_like(code), code)            # -0 as +0
    lo, hi = code[..., 0::2], code[..., 1::2]
    blocks = (lo | (hi << 4)).to(torch.uint8)
    scales = (e + 127).to(torch.uint8)
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    deq = (lut[code.long()] * torch.pow(2.0, e)[..., None]).reshape(E, R, C)
    return blocks.contiguous(), scales.contiguous(), deq


def mxfp4_quantize_dir(d, meta):
    """Rewrites gpt-oss's bf16 experts in d as MXFP4 blocks and scales; returns {in-memory name: dequant f32}."""
    files = sorted(glob.glob(os.path.join(d, "model*.safetensors")))
    tensors = {}
    for f in files:
        tensors.update(load_file(f))
        os.remove(f)
    for f in glob.glob(os.path.join(d, "model.safetensors.index.json")):
        os.remove(f)
    out, deq = {}, {}
    for name, t in sorted(tensors.items()):
        m = re.search(r"mlp\.experts\.(gate_up_proj|down_proj)$", name)
        if not m:
            out[name] = t
            continue
        # in memory [E, in, out] ("x @ W"); on disk the blocks run along `in` for each output row
        blocks, scales, dq = mxfp4_pack(t.transpose(1, 2).contiguous())
        out[name + "_blocks"] = blocks
        out[name + "_scales"] = scales
        deq[name] = dq.transpose(1, 2).contiguous()
    save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cp = os.path.join(d, "config.json")
    with open(cp) as f:
        cj = json.load(f)
    cj["quantization_config"] = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"],
                                 "quant_method": "mxfp4"}
    with open(cp, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    if not deq:
        raise RuntimeError("no mlp.experts.gate_up_proj / down_proj on disk: the saved tensor names are not as expected")
    meta["quantized_tensors"] = len(deq)
    meta["mxfp4_rule"] = ("per output row and 32 inputs: e = ceil(log2(amax/6)), scale byte e+127, each value the "
                          "nearest e2m1 magnitude of w/2^e (lower code on ties), codes packed low nibble first")
    log(f"  mxfp4: {len(deq)} expert tensors packed: {sorted(deq)[:2]}")
    return deq


def write_dequantized_copy(src, dst, deq, quant):
    """dst: src's checkpoint with the quantized tensors replaced by the script's own dequantisation (fp32 for FP8,
    bf16 for MXFP4: exact there) and no quantization_config."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    t = load_file(os.path.join(dst, "model.safetensors"))
    out = {}
    for name, v in t.items():
        if quant == "fp8" and name.endswith(".weight_scale_inv"):
            continue
        if quant == "mxfp4" and (name.endswith("_blocks") or name.endswith("_scales")):
            continue
        out[name] = deq[name].to(torch.float32) if (quant == "fp8" and name in deq) else v
    if quant == "mxfp4":
        for name, v in deq.items():
            out[name] = v.to(torch.bfloat16)
    os.remove(os.path.join(dst, "model.safetensors"))
    save_file({kk: v.contiguous() for kk, v in out.items()}, os.path.join(dst, "model.safetensors"),
              metadata={"format": "pt"})
    cp = os.path.join(dst, "config.json")
    with open(cp) as f:
        cj = json.load(f)
    cj.pop("quantization_config", None)
    with open(cp, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")


def state_maxdiff(a, b):
    """Largest |a - b| over b's state dict; b's entries a lacks (or has in another shape); a's entries b lacks."""
    sa, sb = a.state_dict(), b.state_dict()
    worst, missing = 0.0, []
    for kk, v in sb.items():
        if kk not in sa:
            missing.append(kk)
            continue
        if sa[kk].shape != v.shape:
            missing.append(f"{kk} shape {list(sa[kk].shape)} vs {list(v.shape)}")
            continue
        worst = max(worst, (sa[kk].double() - v.double()).abs().max().item() if v.numel() else 0.0)
    return worst, missing, [kk for kk in sa if kk not in sb]


# --------------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------------

def run_one(model, cap, family, ids, device):
    cap.reset()
    x = torch.tensor([ids], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model(input_ids=x, use_cache=False)
    res = dict(logits=out.logits[0].detach().cpu())
    layers = []
    notes = []
    with torch.no_grad():
        for j, (li, mlp) in enumerate(cap.mods):
            if cap.x[j] is None:
                raise RuntimeError(f"layer {li}: the MoE block was not called")
            t, note = route_tensors(family, model, mlp, cap.x[j], cap.idx[j], cap.w[j])
            layers.append({kk: v.detach().cpu() for kk, v in t.items()})
            notes.append(note)
    res["layers"] = layers
    res["notes"] = notes
    rot = getattr(model.model, "rotary_emb", None)
    if rot is not None and hasattr(rot, "inv_freq"):
        res["inv_freq"] = rot.inv_freq.detach().cpu().clone()
    return res


def stack(layers, key):
    if not layers or any(key not in L for L in layers):
        return None
    return torch.stack([L[key] for L in layers], 0)


def reference_runs(name, cdef, d, seqs, meta, loader):
    """fp64 (CPU, eager experts) and bf16 (CPU, CUDA: default experts) runs of the checkpoint through
    loader(dtype, eager_experts, device) -> (model, load facts)."""
    family = cdef["family"]
    ref = {}
    m64, facts = loader(torch.float64, True, "cpu")
    meta["fp64_load"] = facts
    log(f"  fp64 load: {facts}")
    cfgd = m64.config.to_dict()
    meta["config_loaded"] = {kk: v for kk, v in cfgd.items() if not kk.startswith("_") and kk not in ("id2label",
                                                                                                     "label2id")}
    rot = getattr(m64.model, "rotary_emb", None)
    if rot is not None:
        meta["rope"] = dict(rope_type=getattr(rot, "rope_type", None),
                            attention_scaling=float(getattr(rot, "attention_scaling", 1.0)),
                            inv_freq_dtype=str(rot.inv_freq.dtype) if hasattr(rot, "inv_freq") else None,
                            rope_parameters=getattr(m64.config, "rope_parameters", None))
        log(f"  rope: {meta['rope']}")
    attn0 = m64.model.layers[0].self_attn
    meta["attention_scaling_layer0"] = float(getattr(attn0, "scaling", float("nan")))
    log(f"  self_attn.scaling of layer 0: {meta['attention_scaling_layer0']!r}")
    cap = RouteCapture(m64)
    meta["moe_layers"] = [li for li, _ in cap.mods]
    meta["num_layers"] = m64.config.num_hidden_layers
    meta["num_experts"] = n_experts_of(m64.config)
    meta["top_k"] = m64.config.num_experts_per_tok
    if cap.mods:
        W, b, rmod = router_weight(cap.mods[0][1])
        bias = getattr(rmod, "e_score_correction_bias", None)
        meta["router_weight_dtype_fp64_run"] = str(W.dtype)
        if bias is not None:
            meta["e_score_correction_bias_dtype_fp64_run"] = str(bias.dtype)
    log(f"  MoE layers {meta['moe_layers']}, E={meta['num_experts']} k={meta['top_k']}")
    stats = dict(bias_changes_topk=0, groups_change_topk=0, slots=0, our_vs_dispatched=0)
    top64 = []
    for i, ids in enumerate(seqs):
        r = run_one(m64, cap, family, ids, "cpu")
        ref[f"logits_fp64_s{i}"] = r["logits"].to(torch.float64)
        if "inv_freq" in r:
            ref[f"inv_freq_s{i}"] = r["inv_freq"].to(torch.float64)
        for key in ("router", "scores", "choice", "groupscore"):
            t = stack(r["layers"], key)
            if t is not None:
                ref[f"{key}_fp64_s{i}"] = t.to(torch.float64)
        for key in ("groups", "topk"):
            t = stack(r["layers"], key)
            if t is not None:
                ref[f"{key}_fp64_s{i}"] = t.to(torch.int32)
        t = stack(r["layers"], "topkw")
        if t is not None:
            ref[f"topkw_fp64_s{i}"] = t.to(torch.float64)
        if i == 0 and r["layers"]:
            meta["router_dtype_fp64_run"] = str(r["layers"][0]["router"].dtype)
            if "topkw" in r["layers"][0]:
                meta["topkw_dtype_fp64_run"] = str(r["layers"][0]["topkw"].dtype)
        for note in r["notes"]:
            stats["our_vs_dispatched"] += note.get("our_selection_vs_dispatched_sets_differing", 0)
            for kk, v in note.items():
                if kk != "our_selection_vs_dispatched_sets_differing":
                    meta["notes"].append(f"s{i}: {kk}: {v}")
        tk = ref.get(f"topk_fp64_s{i}")
        top64.append(tk)
        if tk is not None:
            stats["slots"] += tk.shape[0] * tk.shape[1]
            pc = stack(r["layers"], "_plain_topk_choice")
            ps = stack(r["layers"], "_plain_topk_scores")
            if ps is not None and pc is not None:
                stats["bias_changes_topk"] += int(mf.set_diff_count(ps, pc).sum())
            ref_plain = pc if pc is not None else ps
            if ref_plain is not None:
                stats["groups_change_topk"] += int(mf.set_diff_count(ref_plain, tk).sum())
    cap.remove()
    meta["fp64_routing_stats"] = stats
    log(f"  fp64 routing: {stats}")
    if stats["our_vs_dispatched"]:
        meta["notes"].append(f"WARNING: the script's recomputed selection differs from the dispatched one in "
                             f"{stats['our_vs_dispatched']} slots")
    if top64 and top64[0] is not None:
        allk = torch.cat(top64, dim=1)
        meta["tokens_per_expert_fp64"] = {
            str(li): torch.bincount(allk[j].reshape(-1).long(), minlength=meta["num_experts"]).tolist()
            for j, li in enumerate(meta["moe_layers"])}
        gaps = []
        key = "choice" if "choice_fp64_s0" in ref else "scores"
        for i in range(len(seqs)):
            S = ref.get(f"{key}_fp64_s{i}")
            if S is None:
                continue
            srt = torch.sort(S, dim=-1, descending=True).values
            k = meta["top_k"]
            gaps.append((srt[..., k - 1] - srt[..., k]).reshape(-1))
        if gaps:
            g = torch.cat(gaps)
            meta["selection_gap_min_fp64"] = g.min().item()
            meta["selection_gap_note"] = f"k-th minus (k+1)-th of {key}_fp64 (ignores the group restriction)"
    del m64

    runs = [("bf16cpu", "cpu")] + ([("bf16cuda", "cuda")] if HAS_CUDA else [])
    summary = {}
    for tag, dev in runs:
        try:
            mb, facts = loader(torch.bfloat16, False, dev)
            meta[f"{tag}_load"] = facts
            log(f"  {tag}: {facts}")
            capb = RouteCapture(mb)
            flips = slots = 0
            for i, ids in enumerate(seqs):
                r = run_one(mb, capb, family, ids, dev)
                ref[f"logits_{tag}_s{i}"] = r["logits"].float()
                dl = (r["logits"].double() - ref[f"logits_fp64_s{i}"]).abs().max().item()
                for key in ("router", "scores", "choice"):
                    t = stack(r["layers"], key)
                    if t is not None:
                        ref[f"{key}_{tag}_s{i}"] = t.float()
                t = stack(r["layers"], "topk")
                if t is not None:
                    ref[f"topk_{tag}_s{i}"] = t.to(torch.int32)
                    if top64[i] is not None:
                        dm = mf.set_diff_count(t, top64[i])
                        flips += int(dm.sum())
                        slots += dm.numel()
                t = stack(r["layers"], "topkw")
                if t is not None:
                    ref[f"topkw_{tag}_s{i}"] = t.float()
                log(f"    {tag} s{i}: max|logits - fp64| = {dl:.3g}")
            capb.remove()
            del mb
            summary[tag] = dict(flipped_slots=flips, slots=slots)
            log(f"  {tag}: top-k sets differing from fp64: {flips} of {slots}")
        except Exception as e:  # noqa
            log(f"  !! {tag} run failed: {e!r}")
            traceback.print_exc()
            sys.stdout.flush()
            meta["notes"].append(f"{tag} run failed: {e!r}")
    meta["topk_set_flips_vs_fp64"] = summary
    if HAS_CUDA:
        torch.cuda.empty_cache()
    return ref, summary


def generate(d, loader, new, meta):
    """generate.json as tools/make_generate_fixtures.py writes it, from the fp64 model of loader."""
    model, _ = loader(torch.float64, True, "cpu")
    gpath = os.path.join(d, "generation_config.json")
    found = GenerationConfig.from_pretrained(d) if os.path.exists(gpath) else model.generation_config
    gc = GenerationConfig(eos_token_id=found.eos_token_id, pad_token_id=found.pad_token_id, do_sample=False,
                          max_new_tokens=new)
    out = {"max_new_tokens": new, "eos_token_id": gc.eos_token_id, "transformers": transformers.__version__,
           "torch": torch.__version__, "dtype": "float64", "attn_implementation": "eager", "sequences": []}
    with open(os.path.join(d, "tokens.jsonl")) as f:
        prompts = [json.loads(line) for line in f if line.strip()]
    for p in prompts:
        ids = torch.tensor([p["tokens"]], dtype=torch.long)
        with torch.no_grad():
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                               generation_config=gc, output_scores=True, return_dict_in_generate=True,
                               pad_token_id=gc.pad_token_id if gc.pad_token_id is not None else 0)
        seq = g.sequences[0].tolist()
        margins = []
        for s in g.scores:
            top = torch.topk(s[0].double(), 2).values.tolist()
            margins.append(top[0] - top[1])
        out["sequences"].append({"id": p["id"], "tokens": seq, "prompt_length": len(p["tokens"]),
                                 "generated": len(seq) - len(p["tokens"]), "margins": margins})
    # the generated prefix must equal greedy decoding over no-cache forwards of the same model: checks the cache
    with torch.no_grad():
        s0 = out["sequences"][0]
        full = model(input_ids=torch.tensor([s0["tokens"][:-1]]), use_cache=False).logits[0]
        T0 = s0["prompt_length"]
        nocache = full[T0 - 1:].argmax(-1).tolist()
        meta["generate_cache_check_s0"] = nocache == s0["tokens"][T0:]
    tmp = os.path.join(d, "generate.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(d, "generate.json"))
    mins = [min(sq["margins"]) for sq in out["sequences"] if sq["margins"]]
    meta["generate_min_margin"] = min(mins) if mins else None
    log(f"  generate.json: {[sq['generated'] for sq in out['sequences']]} tokens, min margin "
        f"{meta['generate_min_margin']}, cache check {meta['generate_cache_check_s0']}")
    del model


# --------------------------------------------------------------------------------------------
# one case
# --------------------------------------------------------------------------------------------

def init_model(cdef, seed, meta):
    cfg = mf.build_config(cdef)
    Cls = getattr(transformers, cdef["cls"])
    torch.manual_seed(seed)
    model = Cls(cfg)
    model.eval()
    g = torch.Generator().manual_seed(seed + 7)
    done = []
    with torch.no_grad():
        for pn, p in model.named_parameters():
            if pn.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif pn.endswith(".bias") or pn.endswith("_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif pn.endswith("sinks"):
                # non-zero sinks comparable with the attention scores, so the extra column matters
                p.copy_(0.5 + 0.5 * torch.randn(p.shape, generator=g))
                done.append(f"{pn} set to 0.5 + 0.5*N(0,1)")
            else:
                pf = p.float()
                if not (bool(torch.isfinite(pf).all()) and abs(pf.std().item() - 0.05) < 0.02 and
                        abs(pf.mean().item()) < 0.02):
                    log(f"  !! {pn} {list(p.shape)} looks uninitialised (mean {pf.mean().item():.3g}, "
                        f"std {pf.std().item():.3g}) -> normal(0, 0.05)")
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
                    done.append(f"{pn} re-initialised normal(0,0.05)")
    done.append("every *norm.weight set to 1 + 0.2*N(0,1); every bias (.bias, *_bias) set to 0.1*N(0,1)")
    with torch.no_grad():
        for pn, p in model.named_parameters():
            if pn.endswith("experts.gate_up_proj_bias"):
                # GptOssExperts clamps gate above and up on both sides at 7.0: columns 4j (gate) get 7 + 0.3*N,
                # columns 4j + 1 (up) +-7 + 0.3*N, so some values pass the limit and some stay below it
                n2 = p.shape[-1]
                gcol = torch.arange(0, n2, 4)
                ucol = torch.arange(1, n2, 4)
                p[..., gcol] = 7.0 + 0.3 * torch.randn(p[..., gcol].shape, generator=g)
                sign = torch.where(torch.arange(len(ucol)) % 2 == 0, 1.0, -1.0)
                p[..., ucol] = sign * 7.0 + 0.3 * torch.randn(p[..., ucol].shape, generator=g)
                done.append(f"{pn}: gate columns 4j set to 7 + 0.3*N(0,1), up columns 4j+1 to +-7 + 0.3*N(0,1)")
    model = model.to(torch.bfloat16)
    # the correction bias: non-zero (the init gives zeros), fp32 as DeepSeek-V3's checkpoints store it
    for li, mlp in moe_modules(model):
        rmod = getattr(mlp, "gate", None)
        if rmod is not None and hasattr(rmod, "e_score_correction_bias"):
            b = 0.08 * torch.randn(rmod.e_score_correction_bias.shape, generator=g)
            rmod.e_score_correction_bias = b.to(torch.float32)
            done.append(f"layer {li} e_score_correction_bias set to 0.08*N(0,1) in fp32")
    meta["init"] = (f"class init under torch.manual_seed({seed}) (initializer_range 0.05); then " +
                    "; ".join(done) + "; weights cast to bf16 (model.to(torch.bfloat16)) before the bias was set")
    return model


def print_sources_once(model, printed):
    for li, mlp in moe_modules(model)[:1]:
        for obj in (type(mlp), type(mlp.experts), type(router_weight(mlp)[2])):
            if obj.__name__ in printed:
                continue
            printed.add(obj.__name__)
            try:
                log(f"  ---- source of {obj.__name__} ----")
                log(inspect.getsource(obj))
            except Exception as e:  # noqa
                log("  (no source)", e)
    attn = type(model.model.layers[0].self_attn)
    if attn.__name__ not in printed:
        printed.add(attn.__name__)
        try:
            mod = sys.modules[attn.__module__]
            log(f"  ---- source of {attn.__module__} (attention, rope helpers) ----")
            log(inspect.getsource(mod))
        except Exception as e:  # noqa
            log("  (no source)", e)


def make_case(name, cdef, seed, outdir, tmproot, printed, new):
    t0 = time.time()
    d = os.path.join(outdir, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    meta = dict(case=name, description=cdef["desc"], transformers=transformers.__version__,
                torch=torch.__version__, python=platform.python_version(), seed=seed,
                torch_num_threads=torch.get_num_threads(),
                cuda_device=torch.cuda.get_device_name(0) if HAS_CUDA else None,
                command="python3 tools/make_fixtures_2026.py --out DIR", notes=[])
    model = init_model(cdef, seed, meta)
    print_sources_once(model, printed)
    sd_bf16 = {kk: v.detach().clone() for kk, v in model.state_dict().items()}
    meta["saved_with"] = mf.save_hf(model, d)
    names = mf.st_names(d)
    log("  tensors on disk (layer 1 and outside the layers; experts > 0 left out):")
    for kk in sorted(names):
        if ("layers." not in kk or "layers.1." in kk) and not re.search(r"experts\.([1-9]\d*)\.", kk):
            log(f"    {kk} {names[kk]}")
    V = model.config.vocab_size
    tg = torch.Generator().manual_seed(seed + 1)
    seqs = [torch.randint(0, V, (T,), generator=tg).tolist() for T in SEQ_LENS]
    with open(os.path.join(d, "tokens.jsonl"), "w") as f:
        for i, s in enumerate(seqs):
            f.write(json.dumps({"id": f"s{i}", "tokens": s}) + "\n")
    del model

    quant = cdef.get("quant")
    if quant:
        deq = fp8_quantize_dir(d, meta) if quant == "fp8" else mxfp4_quantize_dir(d, meta)
        names = mf.st_names(d)
        meta["tensor_dtypes_on_disk"] = sorted({v[1] for v in names.values()})
        manual = os.path.join(tmproot, name + "_dequantized")
        write_dequantized_copy(d, manual, deq, quant)

        def manual_loader(dtype, eager, dev):
            m, facts = load(manual, dtype, eager, None, dev)
            facts["source"] = "the script's dequantised copy"
            return m, facts

        def hf_loader(dtype, eager, dev):
            m, facts = load(d, dtype, eager, quant_config_for(cdef), dev)
            facts["source"] = f"transformers' {quant} dequantisation (dequantize=True)"
            return m, facts

        loader = manual_loader
        try:
            mh, _ = hf_loader(torch.float64, True, "cpu")
            mm, _ = manual_loader(torch.float64, True, "cpu")
            worst, odd, extra = state_maxdiff(mh, mm)
            dts = sorted({str(p.dtype) for p in mh.parameters()})
            log(f"  transformers' dequantised fp64 model vs the script's: max |diff| {worst:.3g}, "
                f"missing or reshaped {odd[:6]}, extra {extra[:6]}, parameter dtypes {dts}")
            with torch.no_grad():
                ids = torch.tensor([seqs[0]])
                la = mh(input_ids=ids, use_cache=False).logits
                lb = mm(input_ids=ids, use_cache=False).logits
                dl = (la.double() - lb.double()).abs().max().item()
            log(f"  s0 logits, transformers' dequantisation vs the script's copy: max |diff| {dl:.3g}")
            meta["dequant_check"] = dict(max_abs_param_diff=worst, missing_or_reshaped=odd[:20], extra=extra[:20],
                                         param_dtypes=dts, s0_max_abs_logit_diff=dl)
            del mh, mm
            if worst == 0.0 and not odd and dl == 0.0:
                loader = hf_loader
            else:
                meta["notes"].append("transformers' dequantisation differs from the script's; the references "
                                     "come from the script's dequantised copy")
        except Exception as e:  # noqa
            log(f"  !! transformers' {quant} load with dequantize=True failed: {e!r}")
            traceback.print_exc()
            sys.stdout.flush()
            meta["notes"].append(f"transformers' {quant} dequantize=True load failed ({e!r}); the references come "
                                 "from the script's dequantised copy (same values as Fp8Dequantize / "
                                 "convert_moe_packed_tensors define)")
        meta["reference_source"] = "transformers" if loader is hf_loader else "script-dequantised copy"
    else:
        def loader(dtype, eager, dev):
            return load(d, dtype, eager, None, dev)
        m64, _ = loader(torch.float64, True, "cpu")
        worst, missing = 0.0, []
        sd64 = m64.state_dict()
        for kk, v in sd_bf16.items():
            if kk not in sd64:
                missing.append(kk)
                continue
            if not torch.equal(sd64[kk].to(v.dtype), v):
                worst = max(worst, (sd64[kk].double() - v.double()).abs().max().item())
        meta["reload_max_abs_diff"] = worst
        meta["reload_missing"] = missing[:20]
        log(f"  reload check: {len(sd_bf16)} tensors, missing {missing[:5]}, max mismatch {worst}")
        del m64

    ref, summary = reference_runs(name, cdef, d, seqs, meta, loader)
    for kk in list(ref):
        ref[kk] = ref[kk].contiguous()
    # kept xz-compressed (the references are most of the repository's size; the tests read the .xz)
    save_file(ref, os.path.join(d, "ref.safetensors"))
    with open(os.path.join(d, "ref.safetensors"), "rb") as f, lzma.open(os.path.join(d, "ref.safetensors.xz"), "wb", preset=9) as g:
        g.write(f.read())
    os.remove(os.path.join(d, "ref.safetensors"))
    meta["ref_tensors"] = {kk: [str(v.dtype).replace("torch.", ""), list(v.shape)] for kk, v in sorted(ref.items())}
    try:
        generate(d, loader, new, meta)
    except Exception as e:  # noqa
        log(f"  !! generate failed: {e!r}")
        traceback.print_exc()
        sys.stdout.flush()
        meta["notes"].append(f"generate.json not made: {e!r}")
    meta["files"] = {os.path.basename(f): os.path.getsize(f) for f in sorted(glob.glob(os.path.join(d, "*")))}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    tot = sum(meta["files"].values())
    log(f"  {name}: {tot/1e6:.2f} MB, {time.time()-t0:.1f} s, notes {meta['notes']}")
    return dict(bytes=tot, flips=summary, seconds=round(time.time() - t0, 1), notes=meta["notes"],
                routing=meta.get("fp64_routing_stats"), reference=meta.get("reference_source", "transformers"))


def copy_hfsrc(dst):
    root = os.path.dirname(transformers.__file__)
    want = set()
    for m in ("deepseek_v3", "deepseek_v2", "glm4_moe", "gpt_oss", "llama", "mixtral", "qwen2_moe"):
        for p in ("modeling", "configuration", "modular"):
            rel = f"models/{m}/{p}_{m}.py"
            if os.path.exists(os.path.join(root, rel)):
                want.add(rel)
    for rel in ("modeling_rope_utils.py", "conversion_mapping.py", "core_model_loading.py", "integrations/moe.py",
                "integrations/finegrained_fp8.py", "integrations/mxfp4.py", "quantizers/quantizer_finegrained_fp8.py",
                "quantizers/quantizer_mxfp4.py", "utils/quantization_config.py", "masking_utils.py",
                "activations.py", "modeling_utils.py", "configuration_utils.py"):
        if os.path.exists(os.path.join(root, rel)):
            want.add(rel)
    for rel in sorted(want):
        o = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(o), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), o)
    with open(os.path.join(dst, "FILES.txt"), "w") as f:
        f.write(f"transformers {transformers.__version__} from {root}\ntorch {torch.__version__}\n")
        for rel in sorted(want):
            f.write(rel + "\n")
    log(f"hfsrc: copied {len(want)} files from {root} to {dst}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="")
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--no-hfsrc", action="store_true")
    ap.add_argument("--compact", action="store_true", help="smaller cases (see case_defs)")
    a = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
        f"cuda {HAS_CUDA} {torch.cuda.get_device_name(0) if HAS_CUDA else ''}, threads {torch.get_num_threads()}")
    os.makedirs(a.out, exist_ok=True)
    if not a.no_hfsrc:
        try:
            copy_hfsrc(os.path.join(a.out, "_hfsrc"))
        except Exception as e:  # noqa
            log("hfsrc copy failed:", repr(e))
    defs = case_defs(a.compact)
    names = [c for c in a.cases.split(",") if c] or list(defs)
    tmproot = tempfile.mkdtemp(prefix="mkfx26_")
    printed = set()
    results, failed = {}, []
    for name in names:
        log(f"\n===== case {name} =====")
        try:
            results[name] = make_case(name, defs[name], 2000 + 17 * list(defs).index(name), a.out, tmproot,
                                      printed, a.new)
        except Exception as e:  # noqa
            log(f"!! case {name} FAILED: {e!r}")
            traceback.print_exc()
            sys.stdout.flush()
            failed.append(name)
            results[name] = dict(failed=repr(e))
    shutil.rmtree(tmproot, ignore_errors=True)
    with open(os.path.join(a.out, "SUMMARY.json"), "w") as f:
        json.dump(dict(results=results, failed=failed, transformers=transformers.__version__,
                       torch=torch.__version__, seconds=round(time.time() - t0, 1)), f, indent=2, default=str)
        f.write("\n")
    log("\n===== summary =====")
    for n, r in results.items():
        if "failed" in r:
            log(f"  {n:24s} FAILED {r['failed']}")
        else:
            log(f"  {n:24s} {r['bytes']/1e6:6.2f} MB {r['seconds']:6.1f} s  ref {r['reference']}  flips {r['flips']}"
                f"  routing {r['routing']}")
    log(f"  failed: {failed}; {time.time()-t0:.0f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
