#!/usr/bin/env python3
"""Hugging Face transformers doing the job of one `moeflip trace --device cuda`, timed end to end.

    python3 bench/hf_job.py --model DIR --input PROMPTS.jsonl [--out result.json]

The job, in this one process, as a user would write it: import torch and transformers, load the checkpoint onto the
GPU (AutoModelForCausalLM.from_pretrained(DIR, dtype=bfloat16, attn_implementation="eager", device_map="cuda");
eager attention is the plain matmul-softmax-matmul that moeflip reproduces), then for every prompt of PROMPTS.jsonl
({"id", "tokens"} lines) one teacher-forced forward with output_router_logits=True, copying the logits (bf16, as HF
returns them) and every layer's router logits to the host (DeepSeek-V2/V3 and GLM-4.5, whose outputs have no router
logits: what each MoE layer's router returns, through a forward hook). No warm-up: the first forward pays its set-up, as it
does in a user's job. Prints one line and, with --out, writes the times as JSON: process start to imports done, the
load, each forward, the whole job (from process start, read from /proc), peak GPU memory and peak host RSS.
"""

import argparse
import json
import os
import resource
import sys
import time

T_START = time.perf_counter()


def process_age():
    """Seconds since this process started (its start time from /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return up - start_ticks / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--out")
    a = ap.parse_args()
    age0 = process_age()
    import torch
    from transformers import AutoModelForCausalLM

    t_imported = time.perf_counter()
    prompts = [json.loads(line) for line in open(a.input) if line.strip()]
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="eager",
                                                 device_map="cuda")
    model.eval()
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    forwards = []
    tokens = 0
    # DeepSeek-V2/V3 and GLM-4.5 hand back no router_logits: their routers' outputs (every tensor each MoE layer's
    # mlp.gate returns) are copied to the host by a forward hook instead, inside the same timing
    hooked = model.config.model_type in ("deepseek_v2", "deepseek_v3", "glm4_moe")
    captured = []

    def keep(module, inputs, output):
        for x in output if isinstance(output, (tuple, list)) else (output,):
            if torch.is_tensor(x):
                captured.append(x.to("cpu"))

    if hooked:
        for name, module in model.named_modules():
            if name.endswith("mlp.gate"):
                module.register_forward_hook(keep)
    with torch.inference_mode():
        for p in prompts:
            t = time.perf_counter()
            ids = torch.tensor([p["tokens"]], dtype=torch.long, device="cuda")
            captured.clear()
            if hooked:
                out = model(input_ids=ids, use_cache=False)
            else:
                out = model(input_ids=ids, use_cache=False, output_router_logits=True)
            logits = out.logits.to("cpu")
            routers = list(captured) if hooked else [r.to("cpu") for r in out.router_logits]
            torch.cuda.synchronize()
            forwards.append(time.perf_counter() - t)
            tokens += ids.shape[1]
            del out, logits, routers
    job_s = process_age()
    r = dict(model=os.path.abspath(a.model), prompts=len(prompts), tokens=tokens,
             python_start_s=age0, imports_s=t_imported - T_START, load_s=load_s, forward_s=forwards,
             forwards_total_s=sum(forwards), job_s=job_s, peak_gpu_bytes=torch.cuda.max_memory_allocated(),
             peak_host_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             torch=torch.__version__, gpu=torch.cuda.get_device_name())
    import transformers
    r["transformers"] = transformers.__version__
    print(f"hf job: {job_s:.2f} s (imports {r['imports_s']:.2f} s, load {load_s:.2f} s, {len(prompts)} forwards "
          f"{sum(forwards):.3f} s: " + ", ".join(f"{x:.3f}" for x in forwards) +
          f"), peak GPU {r['peak_gpu_bytes'] / 2**30:.2f} GiB, peak RSS {r['peak_host_rss_bytes'] / 2**30:.2f} GiB",
          flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
