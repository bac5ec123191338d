#!/usr/bin/env python3
"""Train the tiny OLMoE that moeflip ships (models/tiny-olmoe), with its tokenizer, prompts and HF fixtures.

Run on a machine with one CUDA GPU, torch, transformers (5.x), tokenizers, safetensors and numpy, from the
repository root, after `python3 tools/gather_corpus.py --out .corpus` has written the corpus:

    python3 tools/train_tiny_moe.py --corpus .corpus --work /tmp/tiny --out OUTDIR

What it does, in order (every step prints what it did; the whole run took 270 s on one H200):

 1. Trains a byte-level BPE tokenizer (tokenizers' BPE model, ByteLevel pre-tokenizer and decoder, GPT-2 split
    regex, vocabulary VOCAB including the special token <|endoftext|> = id 0) on the training documents.
 2. Encodes train / val / test, each document followed by <|endoftext|>.
 3. Trains transformers' OlmoeForCausalLM (config in CFG below; no shared expert, norm_topk_prob False) on random
    windows of SEQ tokens of the training stream: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear
    warm-up then cosine decay to 10%, bf16 autocast over fp32 master weights, gradient clipping at 1.0. The loss
    is cross-entropy + AUX_COEF * load-balancing loss + Z_COEF * router z-loss, both computed per MoE layer from
    the raw router logits and summed over layers, as OLMoE does:
        load balancing  E * sum_e f_e * P_e   (f_e: fraction of the layer's top-k slots that went to expert e,
                                               P_e: mean router probability of expert e)
        z-loss          mean over tokens of logsumexp(router logits)^2
    The number of steps is set from a measured step time so that training fits in --train-seconds (and at most
    --max-epochs passes over the training tokens); a hard wall-clock stop backs it up. The val split is evaluated
    every EVAL_EVERY steps and the best weights are kept.
 4. Saves the best weights in bf16 with save_pretrained (Hugging Face Hub layout, one tensor per expert
    projection: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight), with tokenizer.json.
 5. Reloads the saved checkpoint from disk and reports the held-out (test split) loss and perplexity, a unigram
    baseline of the same tokenizer (add-one smoothed counts of the training tokens) on the same targets, and the
    per-layer expert load (tokens per expert, top-k of the router) on the test tokens.
 6. Writes prompts.jsonl: 32 passages of 64-256 tokens from test documents, {"id", "tokens", "text"}; the first
    three are 64 tokens long.
 7. Makes Hugging Face reference outputs for the first three prompts, in the format of tests/fixtures/hf
    (tools/make_fixtures.py's method: fp64 eager/eager on CPU, bf16 on CPU, bf16 on CUDA): ref.safetensors,
    tokens.jsonl, meta.json.
 8. Writes to OUTDIR: model.safetensors, ref.safetensors, rest.tar (everything else) and results.json.
"""

import argparse
import copy
import glob
import hashlib
import json
import lzma
import math
import os
import platform
import random
import shutil
import sys
import tarfile
import time
import traceback

T0 = time.time()

import numpy as np
import torch
import torch.nn.functional as F

import transformers
from transformers import OlmoeConfig, OlmoeForCausalLM
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
import tokenizers
from safetensors import safe_open
from safetensors.torch import save_file

VOCAB = 4096
EOT = "<|endoftext|>"
SEQ = 256
CFG = dict(hidden_size=256, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
           num_experts=16, num_experts_per_tok=4, norm_topk_prob=False, max_position_embeddings=SEQ,
           rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.02, router_aux_loss_coef=0.01,
           rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, hidden_act="silu",
           attention_bias=False, clip_qkv=None)
AUX_COEF = 0.01
Z_COEF = 0.001
EVAL_EVERY = 250
LOG_EVERY = 50
N_PROMPTS = 32

RESULTS = {}


DEV = os.environ.get("TINY_DEVICE", "cuda")     # "cpu" only for a smoke test of the script's logic


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def elapsed():
    return time.time() - T0


# ------------------------------------------------------------------------------------------------ data

def read_docs(path):
    docs = []
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                docs.append(json.loads(line))
    return docs


def train_tokenizer(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False, special_tokens=[EOT],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=tr, length=len(texts))
    return tok


def encode_docs(tok, docs, eot):
    out = []
    B = 512
    for i in range(0, len(docs), B):
        encs = tok.encode_batch([d["text"] for d in docs[i:i + B]])
        for e in encs:
            out.append(np.asarray(e.ids, dtype=np.int32))
    return out


def stream_of(enc, eot):
    parts = []
    for a in enc:
        parts.append(a)
        parts.append(np.asarray([eot], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


# ------------------------------------------------------------------------------------------------ model

def build_model(V, eot, seed, impl):
    cfg = OlmoeConfig(vocab_size=V, pad_token_id=None, bos_token_id=None, eos_token_id=eot, **copy.deepcopy(CFG))
    torch.manual_seed(seed)
    m = OlmoeForCausalLM(cfg)
    m.set_experts_implementation(impl)
    return m


class RouterTap:
    """Forward hooks on every layer's mlp.gate keeping its raw logits (output 0), with their autograd graph."""

    def __init__(self, model):
        self.logits = []
        self.handles = [layer.mlp.gate.register_forward_hook(self._hook) for layer in model.model.layers]

    def _hook(self, mod, args, output):
        self.logits.append(output[0] if isinstance(output, (tuple, list)) else output)

    def take(self):
        out, self.logits = self.logits, []
        return out

    def remove(self):
        for h in self.handles:
            h.remove()


def router_losses(router_logits, E, k):
    lb = 0.0
    z = 0.0
    for r in router_logits:
        r = r.float().reshape(-1, E)
        p = r.softmax(-1)
        top = torch.topk(p, k, dim=-1).indices.reshape(-1)
        f = torch.bincount(top, minlength=E).float() / top.numel()
        lb = lb + E * (f * p.mean(0)).sum()
        z = z + torch.logsumexp(r, dim=-1).pow(2).mean()
    return lb, z


def make_optimizer(model, lr):
    dec = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodec = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [dict(params=dec, weight_decay=0.1), dict(params=nodec, weight_decay=0.0)]
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except Exception as e:  # noqa
        log("fused AdamW unavailable:", repr(e))
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def train_step(model, tap, opt, x, y, use_ac, E, k, V):
    tap.take()
    with torch.autocast(DEV, dtype=torch.bfloat16, enabled=use_ac):
        out = model(input_ids=x, use_cache=False)
    ce = F.cross_entropy(out.logits.float().reshape(-1, V), y.reshape(-1))
    rl = tap.take()
    assert len(rl) == len(model.model.layers), f"captured {len(rl)} router outputs"
    lb, z = router_losses(rl, E, k)
    loss = ce + AUX_COEF * lb + Z_COEF * z
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return ce.detach(), lb.detach(), z.detach(), gn.detach()


@torch.no_grad()
def evaluate(model, tap, stream, E, k, V, use_ac, max_tokens=None, bs=128, want_load=False):
    """Mean CE over non-overlapping windows of SEQ tokens (targets shifted by one); optional expert counts."""
    was = model.training
    model.eval()
    n = (stream.numel() - 1) // SEQ
    if max_tokens:
        n = min(n, max(1, max_tokens // SEQ))
    tot = 0.0
    cnt = 0
    load = torch.zeros(len(model.model.layers), E, dtype=torch.long, device=stream.device)
    for i in range(0, n, bs):
        j = min(n, i + bs)
        idx = torch.arange(i * SEQ, j * SEQ, device=stream.device).reshape(j - i, SEQ)
        x = stream[idx].long()
        y = stream[idx + 1].long()
        tap.take()
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=use_ac):
            out = model(input_ids=x, use_cache=False)
        rl = tap.take()
        tot += F.cross_entropy(out.logits.float().reshape(-1, V), y.reshape(-1), reduction="sum").item()
        cnt += y.numel()
        if want_load:
            for li, r in enumerate(rl):
                top = torch.topk(r.float().reshape(-1, E), k, dim=-1).indices.reshape(-1)
                load[li] += torch.bincount(top, minlength=E)
    if was:
        model.train()
    return tot / max(cnt, 1), cnt, load.cpu()


# ------------------------------------------------------------------------------------------------ saving

def manual_hub_state(model):
    """Hub per-expert layout from the fused in-memory parameters (fallback if save_pretrained does not write it)."""
    sd = {}
    I = model.config.intermediate_size
    for n, p in model.state_dict().items():
        if n.endswith("mlp.experts.gate_up_proj"):
            base = n[: -len("gate_up_proj")]
            for e in range(p.shape[0]):
                sd[f"{base}{e}.gate_proj.weight"] = p[e, :I, :].contiguous()
                sd[f"{base}{e}.up_proj.weight"] = p[e, I:, :].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            base = n[: -len("down_proj")]
            for e in range(p.shape[0]):
                sd[f"{base}{e}.down_proj.weight"] = p[e].contiguous()
        else:
            sd[n] = p.contiguous()
    return sd


def st_names(path):
    out = {}
    with safe_open(path, framework="pt") as fh:
        for k in fh.keys():
            sl = fh.get_slice(k)
            out[k] = (str(sl.get_dtype()), list(sl.get_shape()))
    return out


def save_model(model_bf16, d):
    os.makedirs(d, exist_ok=True)
    how = "save_pretrained(safe_serialization=True)"
    try:
        model_bf16.save_pretrained(d, safe_serialization=True)
    except TypeError:
        model_bf16.save_pretrained(d)
        how = "save_pretrained()"
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    names = {}
    for f in files:
        names.update(st_names(f))
    want = "model.layers.0.mlp.experts.0.gate_proj.weight"
    if files != [os.path.join(d, "model.safetensors")] or want not in names:
        log(f"!! save_pretrained wrote {[os.path.basename(f) for f in files]}, per-expert names present: "
            f"{want in names}; writing model.safetensors by hand in the Hub per-expert layout")
        for f in files + glob.glob(os.path.join(d, "*.index.json")):
            os.remove(f)
        save_file(manual_hub_state(model_bf16), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        how += " then manual per-expert model.safetensors"
        names = st_names(os.path.join(d, "model.safetensors"))
    bad = [k for k, (dt, _) in names.items() if "BF16" not in dt.upper()]
    log(f"saved with {how}: {len(names)} tensors, {os.path.getsize(os.path.join(d, 'model.safetensors'))} bytes; "
        f"non-bf16: {bad}")
    for k in sorted(names):
        if "layers." not in k or ("layers.0." in k and ".experts." not in k) or ".experts.0." in k and "layers.0." in k:
            log(f"   {k} {names[k]}")
    return how, names


# ------------------------------------------------------------------------------------------------ prompts

def make_prompts(tok, test_docs, n, seed):
    """n passages from test documents, each starting at a paragraph start; the first three 64 tokens long, the
    others 72-256 tokens; documents taken round-robin over the packages, each once before any is reused."""
    rng = random.Random(seed)
    tail = [int(round(x)) for x in np.linspace(72, 256, n - 3)]
    rng.shuffle(tail)
    lens = [64, 64, 64] + tail
    by_src = {}
    for d in sorted(test_docs, key=lambda d: hashlib.sha1(d["id"].encode()).hexdigest()):
        by_src.setdefault(d["src"], []).append(d)
    srcs = sorted(by_src)
    order = []
    i = 0
    while any(by_src.values()):
        s = srcs[i % len(srcs)]
        if by_src[s]:
            order.append(by_src[s].pop(0))
        i += 1
    prompts = []
    for d in order * 8:
        if len(prompts) >= n:
            break
        L = lens[len(prompts)]
        paras = d["text"].split("\n\n")
        starts = [j for j in range(len(paras)) if len(paras[j]) >= 40]
        rng.shuffle(starts)
        for j in starts:
            ids = tok.encode("\n\n".join(paras[j:])).ids
            if len(ids) < L:
                continue
            ids = ids[:L]
            text = tok.decode(ids)
            while "\ufffd" in text and len(ids) > 64:    # cut inside a UTF-8 character: drop the partial token
                ids = ids[:-1]
                text = tok.decode(ids)
            if "\ufffd" in text or any(p["text"] == text for p in prompts):
                continue
            prompts.append(dict(id=f"p{len(prompts):02d}", tokens=[int(t) for t in ids], text=text, src=d["id"]))
            break
    return prompts


# ------------------------------------------------------------------------------------------------ HF reference

def make_reference(model_dir, fx_dir, seqs, E, k):
    """tools/make_fixtures.py's reference runs for a saved checkpoint (same tensors and meta.json keys)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_fixtures as mf   # importing it turns off TF32 and reduced-precision reductions on the GPU
    os.makedirs(fx_dir, exist_ok=True)
    shutil.copy2(os.path.join(model_dir, "config.json"), os.path.join(fx_dir, "config.json"))
    with open(os.path.join(fx_dir, "tokens.jsonl"), "w") as f:
        for i, ids in enumerate(seqs):
            f.write(json.dumps({"id": f"s{i}", "tokens": ids}) + "\n")
    meta = dict(case="tiny_olmoe",
                description="The trained tiny OLMoE of models/tiny-olmoe (4 layers, hidden 256, 16 experts top-4, "
                            "expert intermediate 96, vocab 4096, norm_topk_prob False, untied lm_head); "
                            "s0..s2 are prompts p00..p02 of models/tiny-olmoe/prompts.jsonl.",
                transformers=transformers.__version__, torch=torch.__version__, python=platform.python_version(),
                torch_num_threads=torch.get_num_threads(),
                cuda_device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                command="python3 tools/train_tiny_moe.py --corpus .corpus --work DIR --out OUT", notes=[],
                init="trained weights (tools/train_tiny_moe.py), saved in bf16; no perturbation")
    with safe_open(os.path.join(model_dir, "model.safetensors"), framework="pt") as fh:
        disk = {kk: fh.get_tensor(kk) for kk in fh.keys()}

    def check_reload(m64):
        """Reloaded params must equal the bf16 tensors on disk (per-expert on disk, fused in memory)."""
        sd64 = m64.state_dict()
        I = m64.config.intermediate_size
        worst = 0.0
        checked = 0
        for kk, v in disk.items():
            if ".mlp.experts." in kk:
                parts = kk.split(".")
                li, e, proj = int(parts[2]), int(parts[5]), parts[6]
                base = f"model.layers.{li}.mlp.experts."
                if proj == "gate_proj":
                    mem = sd64[base + "gate_up_proj"][e, :I]
                elif proj == "up_proj":
                    mem = sd64[base + "gate_up_proj"][e, I:]
                else:
                    mem = sd64[base + "down_proj"][e]
            else:
                mem = sd64.get(kk)
                if mem is None:
                    log(f"  !! {kk} on disk but not in the loaded model")
                    continue
            checked += 1
            d = (mem.double() - v.double()).abs().max().item()
            worst = max(worst, d)
        log(f"  reload check: {checked} tensors on disk compared, max |loaded - disk| = {worst}")
        meta["reload_max_abs_diff"] = worst

    ref, summary = mf.reference_runs(model_dir, "tiny_olmoe", seqs, E, k, True, meta, check_reload)
    mf.write_reference(fx_dir, ref, meta, True, list_files=False)
    log(f"  reference: {len(ref)} tensors, {os.path.getsize(os.path.join(fx_dir, 'ref.safetensors'))} bytes; "
        f"flips {summary}")
    return summary


# ------------------------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--work", default="/tmp/tiny_moe")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--train-seconds", type=float, default=270.0)
    ap.add_argument("--train-deadline", type=float, default=420.0,
                    help="training stops this many seconds after the script started, whatever --train-seconds says")
    ap.add_argument("--max-epochs", type=float, default=16.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    dev = DEV
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
        f"python {platform.python_version()}, {torch.cuda.get_device_name(0) if DEV == 'cuda' else 'CPU'}, cpu threads "
        f"{torch.get_num_threads()}")
    RESULTS["versions"] = dict(torch=torch.__version__, transformers=transformers.__version__,
                               tokenizers=tokenizers.__version__, python=platform.python_version(),
                               gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else None)
    RESULTS["args"] = vars(a)
    shutil.rmtree(a.work, ignore_errors=True)
    md = os.path.join(a.work, "tiny-olmoe")
    fx = os.path.join(a.work, "tiny_olmoe")
    os.makedirs(md)
    os.makedirs(a.out, exist_ok=True)

    # ---- corpus and tokenizer
    train_docs = read_docs(os.path.join(a.corpus, "train.jsonl.xz"))
    val_docs = read_docs(os.path.join(a.corpus, "val.jsonl.xz"))
    test_docs = read_docs(os.path.join(a.corpus, "test.jsonl.xz"))
    nbytes = {n: sum(len(d["text"].encode()) for d in ds) for n, ds in
              (("train", train_docs), ("val", val_docs), ("test", test_docs))}
    log(f"corpus: {len(train_docs)}/{len(val_docs)}/{len(test_docs)} documents, bytes {nbytes}")
    tok = train_tokenizer([d["text"] for d in train_docs])
    V = tok.get_vocab_size()
    eot = tok.token_to_id(EOT)
    tok.save(os.path.join(md, "tokenizer.json"))
    log(f"tokenizer: vocab {V}, {EOT} = {eot}")
    sample = test_docs[0]["text"][:2000]
    rt = tok.decode(tok.encode(sample).ids)
    log(f"tokenizer round trip on 2000 chars of a test document: {'exact' if rt == sample else 'DIFFERS'}")
    enc = {n: encode_docs(tok, ds, eot) for n, ds in (("train", train_docs), ("val", val_docs), ("test", test_docs))}
    streams_np = {n: stream_of(e, eot) for n, e in enc.items()}
    ntok = {n: int(s.size) for n, s in streams_np.items()}
    log(f"tokens (with one {EOT} per document): {ntok}; bytes per token (train) "
        f"{nbytes['train'] / max(1, ntok['train'] - len(train_docs)):.3f}")
    RESULTS.update(corpus_bytes=nbytes, tokens=ntok, vocab=V, eot=eot,
                   bytes_per_token=nbytes["train"] / max(1, ntok["train"] - len(train_docs)))
    st = {n: torch.from_numpy(s).to(dev) for n, s in streams_np.items()}
    counts = np.bincount(streams_np["train"], minlength=V).astype(np.float64) + 1.0
    logp_uni = np.log(counts / counts.sum())
    top = np.argsort(-counts)[:12]
    log("most frequent tokens: " + ", ".join(f"{tok.id_to_token(int(t))!r}" for t in top))

    E = CFG["num_experts"]
    k = CFG["num_experts_per_tok"]
    B = a.batch
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    offs = torch.arange(SEQ + 1, device=dev)
    ntrain = st["train"].numel()

    def batch():
        ix = torch.randint(0, ntrain - SEQ - 1, (B,), device=dev, generator=gen)
        w = st["train"][ix[:, None] + offs].long()
        return w[:, :-1], w[:, 1:]

    # ---- pick the experts implementation: the fastest that trains (finite loss, matching loss at init)
    probe = {}
    x0, y0 = batch()
    for impl, use_ac in (("grouped_mm", True), ("eager", True), ("grouped_mm", False), ("eager", False)):
        name = f"{impl}{'+bf16autocast' if use_ac else '+fp32'}"
        try:
            m = build_model(V, eot, a.seed, impl).to(dev)
            m.train()
            mtap = RouterTap(m)
            opt = make_optimizer(m, 1e-3)
            ce0 = None
            g0 = None
            for s in range(8):
                if s == 3:
                    sync()
                    t1 = time.time()
                ce, lb, z, gn = train_step(m, mtap, opt, x0, y0, use_ac, E, k, V)
                if ce0 is None:
                    ce0 = ce.item()
                    ex = m.model.layers[0].mlp.experts
                    g0 = [ex.gate_up_proj.grad.norm().item(), ex.down_proj.grad.norm().item(),
                          m.model.layers[0].mlp.gate.weight.grad.norm().item(), gn.item()]
            sync()
            dt = (time.time() - t1) / 5
            ok = math.isfinite(ce.item()) and math.isfinite(gn.item())
            probe[name] = dict(impl=impl, autocast=use_ac, step_s=dt, ce_init=ce0, ce_after=ce.item(), ok=ok,
                               grad_norms_step0=g0)
            log(f"probe {name}: {dt * 1e3:.1f} ms/step, ce {ce0:.4f} -> {ce.item():.4f}, lb {lb.item():.3f}, "
                f"z {z.item():.3f}; step-0 grad norms (layer-0 gate_up, down, router; total) "
                f"{[round(g, 5) for g in g0]}")
            mtap.remove()
            del m, opt, mtap
        except Exception as e:  # noqa
            log(f"probe {name} failed: {e!r}")
            traceback.print_exc(limit=3)
            probe[name] = dict(impl=impl, autocast=use_ac, ok=False, error=repr(e))
        if DEV == "cuda":
            torch.cuda.empty_cache()
        if elapsed() > 200:
            break
    RESULTS["probe"] = probe
    # the eager experts loop is transformers' reference: other implementations must give the same step-0 gradients
    refp = probe.get("eager+bf16autocast") if probe.get("eager+bf16autocast", {}).get("ok") else \
        probe.get("eager+fp32")
    if refp and refp.get("ok"):
        for nm, p in probe.items():
            if p.get("ok") and p is not refp:
                rel = max(abs(a_ - b_) / max(abs(b_), 1e-12) for a_, b_ in zip(p["grad_norms_step0"],
                                                                              refp["grad_norms_step0"]))
                p["grad_rel_diff_vs_eager"] = rel
                if rel > 0.05 or abs(p["ce_init"] - refp["ce_init"]) > 0.02:
                    log(f"!! {nm}: step-0 gradients or loss differ from eager (rel {rel:.3g}); not used")
                    p["ok"] = False
                else:
                    log(f"{nm}: step-0 gradient norms within {rel:.2%} of eager")
    good = [p for p in probe.values() if p.get("ok")]
    ref_ce = [p["ce_init"] for p in good]
    if ref_ce and max(ref_ce) - min(ref_ce) > 0.05:
        log(f"!! initial losses disagree between implementations: {[(p['impl'], p['ce_init']) for p in good]}")
    # prefer bf16 autocast; among those the fastest
    good.sort(key=lambda p: (not p["autocast"], p["step_s"]))
    if good and good[0]["autocast"] and any(not p["autocast"] and p["step_s"] < 0.5 * good[0]["step_s"]
                                              for p in good):
        good.sort(key=lambda p: p["step_s"])
    choice = good[0]
    impl, use_ac = choice["impl"], choice["autocast"]
    log(f"training with experts implementation {impl!r}, bf16 autocast {use_ac}")
    RESULTS["train_impl"] = dict(experts_implementation=impl, bf16_autocast=use_ac)

    # ---- train
    model = build_model(V, eot, a.seed, impl).to(dev)
    model.train()
    tap = RouterTap(model)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"parameters: {nparams} ({nparams / 1e6:.3f} M); bf16 bytes {2 * nparams}")
    RESULTS["parameters"] = nparams
    opt = make_optimizer(model, a.lr)
    budget = max(30.0, min(a.train_seconds, a.train_deadline - elapsed()))
    est = choice["step_s"] * 1.08 + 0.0
    steps_time = int(budget / est)
    steps_epochs = int(a.max_epochs * ntrain / (B * SEQ))
    total = max(200, min(steps_time, steps_epochs))
    log(f"budget {budget:.0f} s, ~{est * 1e3:.1f} ms/step -> {steps_time} steps by time, {steps_epochs} by "
        f"{a.max_epochs} epochs: {total} steps of {B}x{SEQ} tokens")
    RESULTS["planned_steps"] = total

    def lr_at(s):
        if s < a.warmup:
            return a.lr * (s + 1) / a.warmup
        q = min(1.0, (s - a.warmup) / max(1, total - a.warmup))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * q)))

    curve = []
    vals = []
    best = dict(val=float("inf"), step=-1, state=None)
    t_train = time.time()
    acc = None
    nacc = 0
    step = 0
    try:
        for step in range(total):
            if time.time() - t_train > budget:
                log(f"wall-clock budget reached at step {step}")
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            x, y = batch()
            ce, lb, z, gn = train_step(model, tap, opt, x, y, use_ac, E, k, V)
            v = torch.stack([ce, lb, z, gn.float()])
            acc = v if acc is None else acc + v
            nacc += 1
            if (step + 1) % LOG_EVERY == 0 or step == 0:
                m = (acc / nacc).tolist()
                acc, nacc = None, 0
                dt = time.time() - t_train
                tps = (step + 1) * B * SEQ / dt
                curve.append(dict(step=step + 1, ce=m[0], lb=m[1], z=m[2], grad_norm=m[3], lr=lr_at(step), t=dt))
                log(f"step {step + 1:5d} ce {m[0]:.4f} lb {m[1]:.4f} z {m[2]:.3f} gn {m[3]:.3f} lr {lr_at(step):.2e} "
                    f"{dt:6.1f}s {tps / 1e6:.2f} Mtok/s epoch {(step + 1) * B * SEQ / ntrain:.2f}")
            if (step + 1) % EVAL_EVERY == 0 or step + 1 == total:
                vl, _, _ = evaluate(model, tap, st["val"], E, k, V, use_ac, max_tokens=200_000)
                vals.append(dict(step=step + 1, val_ce=vl))
                tag = ""
                if vl < best["val"]:
                    best.update(val=vl, step=step + 1,
                                state={kk: vv.detach().clone() for kk, vv in model.state_dict().items()})
                    tag = " (best)"
                log(f"  val ce {vl:.4f} ppl {math.exp(vl):.2f} at step {step + 1}{tag}")
    except Exception as e:  # noqa
        log(f"!! training stopped by {e!r}")
        traceback.print_exc()
        RESULTS["training_error"] = repr(e)
    steps_done = step + 1
    train_time = time.time() - t_train
    if best["state"] is None or (vals and vals[-1]["step"] != steps_done):
        vl, _, _ = evaluate(model, tap, st["val"], E, k, V, use_ac, max_tokens=200_000)
        vals.append(dict(step=steps_done, val_ce=vl))
        if vl < best["val"]:
            best.update(val=vl, step=steps_done,
                        state={kk: vv.detach().clone() for kk, vv in model.state_dict().items()})
    log(f"trained {steps_done} steps, {steps_done * B * SEQ / 1e6:.1f} M tokens "
        f"({steps_done * B * SEQ / ntrain:.2f} epochs) in {train_time:.1f} s; best val ce {best['val']:.4f} at step "
        f"{best['step']}")
    RESULTS.update(steps=steps_done, train_tokens_seen=steps_done * B * SEQ, train_seconds=train_time,
                   epochs=steps_done * B * SEQ / ntrain, curve=curve, val_curve=vals, best_step=best["step"],
                   best_val_ce=best["val"], batch=B, seq=SEQ, lr=a.lr, warmup=a.warmup)
    model.load_state_dict(best["state"])
    tap.remove()
    del opt

    # ---- save bf16, Hub layout
    mb = copy.deepcopy(model).to(torch.bfloat16)
    mb.config.output_router_logits = False
    saved_with, names = save_model(mb, md)
    RESULTS["saved_with"] = saved_with
    del mb
    with open(os.path.join(md, "config.json")) as f:
        cj = json.load(f)
    log("config.json: " + json.dumps(cj, sort_keys=True))
    del model
    if DEV == "cuda":
        torch.cuda.empty_cache()

    # ---- held-out evaluation of the saved checkpoint (fp32 compute, no TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        ml = OlmoeForCausalLM.from_pretrained(md, dtype=torch.float32, experts_implementation="eager").to(dev)
    except Exception as e:  # noqa
        log(f"from_pretrained with experts_implementation failed ({e!r}); default")
        ml = OlmoeForCausalLM.from_pretrained(md, dtype=torch.float32).to(dev)
    ml.eval()
    mltap = RouterTap(ml)
    tl, tn, load = evaluate(ml, mltap, st["test"], E, k, V, False, bs=64, want_load=True)
    vl2, _, _ = evaluate(ml, mltap, st["val"], E, k, V, False, bs=64)
    mltap.remove()
    n = (st["test"].numel() - 1) // SEQ
    yt = streams_np["test"][1:n * SEQ + 1]
    uni = float(-logp_uni[yt].mean())
    log(f"held-out (test split, {tn} target tokens), saved bf16 checkpoint: ce {tl:.4f} nats/token, ppl "
        f"{math.exp(tl):.2f}; val ce {vl2:.4f}; unigram baseline (same tokenizer, add-one counts of train) "
        f"{uni:.4f} nats/token, ppl {math.exp(uni):.1f}; about {tl / math.log(2) * ntok['test'] / nbytes['test']:.3f} "
        f"bits per byte")
    fair = load.sum(1, keepdim=True).double() / E
    ratio = load.double() / fair
    ok = bool(((ratio >= 0.25) & (ratio <= 4.0)).all())
    log(f"expert load on the test split (tokens per expert, top-{k}; fair share {fair[0, 0].item():.0f}):")
    for li in range(load.shape[0]):
        log(f"  layer {li}: {load[li].tolist()}  min/fair {ratio[li].min().item():.2f} max/fair "
            f"{ratio[li].max().item():.2f}")
    log(f"every expert of every layer within [1/4, 4] x fair share: {ok}")
    RESULTS.update(test_ce=tl, test_ppl=math.exp(tl), test_tokens=tn, val_ce_saved=vl2, unigram_ce=uni,
                   unigram_ppl=math.exp(uni), expert_load=load.tolist(), expert_load_ok=ok)
    del ml
    if DEV == "cuda":
        torch.cuda.empty_cache()

    # ---- prompts
    prompts = make_prompts(tok, test_docs, N_PROMPTS, a.seed)
    with open(os.path.join(md, "prompts.jsonl"), "w") as f:
        for p in prompts:
            f.write(json.dumps({"id": p["id"], "tokens": p["tokens"], "text": p["text"]}, ensure_ascii=False) + "\n")
    RESULTS["prompts"] = [dict(id=p["id"], n=len(p["tokens"]), src=p["src"]) for p in prompts]
    log(f"prompts: {len(prompts)}, lengths {[len(p['tokens']) for p in prompts]}")
    for p in prompts[:3]:
        log(f"  {p['id']} ({p['src']}): {p['text'][:160]!r}")

    # ---- HF reference outputs for p00..p02
    try:
        RESULTS["fixture_flips"] = make_reference(md, fx, [p["tokens"] for p in prompts[:3]], E, k)
    except Exception as e:  # noqa
        log(f"!! reference outputs failed: {e!r}")
        traceback.print_exc()
        RESULTS["fixture_error"] = repr(e)


def finish(out, work):
    os.makedirs(out, exist_ok=True)
    md = os.path.join(work, "tiny-olmoe")
    fx = os.path.join(work, "tiny_olmoe")
    RESULTS["total_seconds"] = elapsed()
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    for src, dst in ((os.path.join(md, "model.safetensors"), "model.safetensors"),
                     (os.path.join(fx, "ref.safetensors"), "ref.safetensors")):
        if os.path.exists(src):
            shutil.copy2(src, os.path.join(out, dst))
    with tarfile.open(os.path.join(out, "rest.tar"), "w") as t:
        for d, arc in ((md, "tiny-olmoe"), (fx, "tiny_olmoe")):
            if os.path.isdir(d):
                for f in sorted(os.listdir(d)):
                    if f not in ("model.safetensors", "ref.safetensors"):
                        t.add(os.path.join(d, f), arcname=f"{arc}/{f}")
    for f in sorted(os.listdir(out)):
        log(f"OUT {f} {os.path.getsize(os.path.join(out, f))}")


if __name__ == "__main__":
    rc = 0
    args = sys.argv[1:]
    out = os.environ.get("OUT", "out")
    work = "/tmp/tiny_moe"
    for i, v in enumerate(args):
        if v == "--out" and i + 1 < len(args):
            out = args[i + 1]
        if v == "--work" and i + 1 < len(args):
            work = args[i + 1]
    try:
        main()
    except Exception as e:  # noqa
        log(f"!! FAILED: {e!r}")
        traceback.print_exc()
        RESULTS["error"] = repr(e)
        rc = 1
    finally:
        finish(out, work)
        log(f"total {elapsed():.1f} s")
    sys.exit(rc)
