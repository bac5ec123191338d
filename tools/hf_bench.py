#!/usr/bin/env python3
"""Time Hugging Face transformers' teacher-forced capture on a checkpoint that moeflip benchmarks.

Run on a machine with one CUDA GPU, torch and transformers 5.x:

    python3 tools/hf_bench.py --model DIR [--tokens 512] [--reps 5] [--experts grouped_mm,eager] [--out results.json]

DIR is a Hub-layout checkpoint (config.json with model_type olmoe, qwen2_moe or mixtral; model.safetensors in bf16),
e.g. one written by `moeflip synth`. For each experts implementation in --experts, in one process:

  1. load AutoModelForCausalLM.from_pretrained(DIR, dtype=bfloat16, attn_implementation="eager",
     experts_implementation=IMPL) onto cuda, eval mode, under torch.inference_mode();
  2. one warm-up forward of batch 1 x N tokens, then --reps timed forwards: synchronize, start the clock, forward
     with output_router_logits=True, copy the logits (bf16, as HF returns them) and every layer's router logits to
     the host, synchronize, stop the clock;
  3. report median and min seconds, tokens/s (N / median) and peak GPU memory; free the model.

The N tokens are the first N of the first sequence of DIR/tokens.jsonl when it has that many, else fixed-seed random
ids below the vocabulary size. An implementation this transformers version does not offer is reported and skipped.
Prints one line per implementation; --out also writes everything as JSON. Exit status 1 if any implementation failed
with an error (not counting unavailable ones), 2 on bad usage or no GPU.

How transformers 5.x picks the MoE experts kernel (read in transformers' v5 source; the script checks at run time that
the choice was honoured, via model.config._experts_implementation):
  - src/transformers/modeling_utils.py, PreTrainedModel.from_pretrained: a kwarg `experts_implementation=...` is
    popped into `config._experts_implementation` (configuration_utils.py, PreTrainedConfig.__init__, also accepts it
    as a config kwarg). PreTrainedModel.__init__ then calls `_check_and_adjust_experts_implementation` ->
    `get_correct_experts_implementation`, which maps None to the default "grouped_mm", raises ValueError for a name
    outside "eager" + ExpertsInterface's keys ("grouped_mm", "batched_mm", plus any registered ones), and for
    "grouped_mm" runs `_grouped_mm_can_dispatch` (which raises if the model's experts class is not decorated; falls
    back to "eager" silently only when grouped_mm was the default, not when it was asked for).
  - src/transformers/integrations/moe.py, `use_experts_implementation`: the decorator on OlmoeExperts / MixtralExperts /
    Qwen2MoeExperts; its wrapped forward calls
    `ALL_EXPERTS_FUNCTIONS.get_interface(self.config._experts_implementation, original_forward)`, so "eager" runs the
    class's own loop over hit experts, "grouped_mm" runs `grouped_mm_experts_forward` (tokens sorted by expert, one
    torch.nn.functional.grouped_mm / torch._grouped_mm per projection), "batched_mm" runs `batched_mm_experts_forward`
    (per-token bmm on gathered expert weights).
  - PreTrainedModel.set_experts_implementation(name) switches a loaded model; not used here, each implementation gets
    a fresh load so that its peak memory is measured on its own.
"""

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


class Unavailable(Exception):
    """The requested experts implementation is not offered (or not honoured) by this transformers/model."""


def log(*a):
    print(*a, flush=True)


def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def input_ids(model_dir, n, vocab, seed):
    """First n tokens of the first sequence of DIR/tokens.jsonl if it has n, else fixed-seed random ids."""
    path = os.path.join(model_dir, "tokens.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            first = next((line for line in f if line.strip()), None)
        if first is not None:
            rec = json.loads(first)
            toks = rec["tokens"]
            if len(toks) >= n:
                toks = toks[:n]
                bad = [t for t in toks if not 0 <= t < vocab]
                if bad:
                    raise SystemExit(f"{path}: token id {bad[0]} outside the vocabulary [0, {vocab})")
                return torch.tensor([toks], dtype=torch.long), f"{path} (first sequence {rec.get('id')!r}, first {n})"
            log(f"note: {path}: first sequence has {len(toks)} tokens < {n}; using random ids instead")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, n), generator=g, dtype=torch.long), f"random ids, seed {seed}, vocab {vocab}"


def load(model_dir, impl):
    kw = dict(
        dtype=torch.bfloat16,
        # Eager attention: the plain matmul-softmax-matmul path, the one moeflip's HF fixtures are made with
        # (tools/make_fixtures.py), so HF is timed on the same attention math moeflip reproduces, not a fused kernel.
        attn_implementation="eager",
        experts_implementation=impl,
        output_loading_info=True,
    )
    # device_map="cuda" puts the weights straight on the GPU (no 14+ GB host copy), but needs accelerate.
    on_gpu = importlib.util.find_spec("accelerate") is not None
    if on_gpu:
        kw["device_map"] = "cuda"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, **kw)
    except (ValueError, ImportError) as e:
        # get_correct_experts_implementation / _grouped_mm_can_dispatch raise ValueError for an unknown name or an
        # experts class that cannot switch; any other load failure is a real error, reported as such.
        if isinstance(e, ValueError) and "experts" not in str(e):
            raise
        raise Unavailable(f"{type(e).__name__}: {e}") from e
    if not on_gpu:
        model.to("cuda")
    model.eval()
    got = getattr(model.config, "_experts_implementation", None)
    if got != impl:
        # An older transformers would take the kwarg as a plain config attribute and run its only (eager) path.
        del model
        raise Unavailable(f"asked for {impl!r} but model.config._experts_implementation is {got!r}")
    idict = info if isinstance(info, dict) else vars(info) if hasattr(info, "__dict__") else {}
    bad = {k: v for k, v in idict.items() if v}
    if bad:
        log(f"warning: loading info not clean (missing/unexpected/mismatched weights): {bad}")
    return model


def capture(model, ids):
    """One teacher-forced forward and the copy of what a capture keeps to the host."""
    # use_cache=False: a capture is one full-sequence pass, so no KV cache is built.
    # output_router_logits=True: moeflip's capture records every MoE layer's routing, so HF must produce and hand back
    # the router logits too (collected by HF's OutputRecorder hooks on the *TopKRouter modules); with it HF's
    # *ForCausalLM.forward also computes its load-balancing aux loss, part of what HF costs for the same output.
    out = model(input_ids=ids, use_cache=False, output_router_logits=True)
    logits = out.logits.to("cpu")  # HF's own dtype (bf16): no upcast that a capture would not do
    routers = [r.to("cpu") for r in out.router_logits]
    return logits, routers


def bench(model_dir, impl, ids, reps):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = load(model_dir, impl)
    load_s = time.perf_counter() - t0
    weights = torch.cuda.memory_allocated()
    try:
        torch.cuda.reset_peak_memory_stats()  # peak of the forwards, weights included (they stay allocated)
        x = ids.to("cuda")
        with torch.inference_mode():
            logits, routers = capture(model, x)  # warm-up: kernel selection, allocator, lazy inits
            shape = dict(logits=list(logits.shape), logits_dtype=str(logits.dtype), router_layers=len(routers),
                         router=list(routers[0].shape) if routers else None,
                         router_dtype=str(routers[0].dtype) if routers else None)
            del logits, routers
            times = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t = time.perf_counter()
                logits, routers = capture(model, x)
                torch.cuda.synchronize()  # the pageable .to("cpu") copies already wait; this makes it explicit
                times.append(time.perf_counter() - t)
                del logits, routers
        peak = torch.cuda.max_memory_allocated()
        peak_reserved = torch.cuda.max_memory_reserved()
    finally:
        del model
        gc.collect()
        torch.cuda.empty_cache()
    med = statistics.median(times)
    n = ids.shape[1]
    return dict(experts_implementation=impl, status="ok", tokens=n, reps=reps, median_s=med, min_s=min(times),
                tokens_per_s=n / med, times_s=times, load_s=load_s, weights_gpu_bytes=weights,
                peak_gpu_bytes=peak, peak_gpu_reserved_bytes=peak_reserved, outputs=shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hub-layout checkpoint directory")
    ap.add_argument("--tokens", type=int, default=512, help="sequence length N (batch 1)")
    ap.add_argument("--reps", type=int, default=5, help="timed forwards per implementation")
    ap.add_argument("--experts", default="grouped_mm,eager", help="comma-separated experts implementations")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random ids (when tokens.jsonl is not used)")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    impls = [s.strip() for s in a.experts.split(",") if s.strip()]
    if a.tokens < 1 or a.reps < 1 or not impls:
        ap.error("--tokens and --reps must be >= 1 and --experts must name at least one implementation")
    if not torch.cuda.is_available():
        log("error: no CUDA device")
        return 2

    cfg = read_config(a.model)
    mtype = cfg.get("model_type")
    if mtype not in ("olmoe", "qwen2_moe", "mixtral"):
        log(f"note: model_type {mtype!r} is not one moeflip benchmarks; trying anyway")
    ids, source = input_ids(a.model, a.tokens, cfg["vocab_size"], a.seed)
    gpu = torch.cuda.get_device_name()
    log(f"model {a.model} ({mtype}), {ids.shape[1]} tokens from {source}, {a.reps} reps")
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {gpu}")

    results = []
    for impl in impls:
        try:
            r = bench(a.model, impl, ids, a.reps)
            log(f"{impl:>12}: median {r['median_s']:.4f} s  min {r['min_s']:.4f} s  "
                f"{r['tokens_per_s']:,.0f} tokens/s  peak {r['peak_gpu_bytes'] / 2**30:.2f} GiB "
                f"(weights {r['weights_gpu_bytes'] / 2**30:.2f} GiB, load {r['load_s']:.1f} s)")
        except Unavailable as e:
            r = dict(experts_implementation=impl, status="unavailable", reason=str(e))
            log(f"{impl:>12}: NOT AVAILABLE in transformers {transformers.__version__}: {e}")
        except Exception as e:  # noqa: BLE001 -- report and go on to the next implementation
            r = dict(experts_implementation=impl, status="error", reason=f"{type(e).__name__}: {e}")
            log(f"{impl:>12}: FAILED: {type(e).__name__}: {e}")
        gc.collect()
        torch.cuda.empty_cache()
        results.append(r)

    if a.out:
        doc = dict(model=os.path.abspath(a.model), model_type=mtype, tokens=ids.shape[1], reps=a.reps,
                   token_source=source, torch=torch.__version__, transformers=transformers.__version__,
                   cuda=torch.version.cuda, gpu=gpu, attn_implementation="eager", dtype="bfloat16",
                   results=results)
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        log(f"wrote {a.out}")
    return 1 if any(r["status"] == "error" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
