#!/usr/bin/env python3
"""Hugging Face generate(do_sample=False) at batch 1, timed: the baseline of `moeflip trace --device cuda --generate`.

    python3 bench/hf_generate.py --model DIR --input PROMPTS.jsonl --new N [--out result.json]

Loads DIR with AutoModelForCausalLM.from_pretrained(dtype=bfloat16, attn_implementation="eager", device_map="cuda"),
as a user would, then, for every prompt of PROMPTS.jsonl ({"id", "tokens"} lines), one prefill-only forward (the
prompt's cost, measured apart) and one greedy generate of exactly N new tokens (min_new_tokens=N: no early stop)
with the default DynamicCache. One warm-up generate of 8 tokens comes first, so that kernel loading and the
allocator's first growth are not counted against Hugging Face. The decode rate is (N - 1) new tokens over the
generate's time minus its prefill (generate runs the prompt once, then N - 1 one-token steps). Prints one line;
with --out writes the figures and the generated tokens as JSON.
"""

import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--new", type=int, required=True)
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    prompts = [json.loads(line) for line in open(a.input) if line.strip()]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="eager",
                                                 device_map="cuda")
    model.eval()
    res = []
    with torch.inference_mode():
        warm = torch.tensor([prompts[0]["tokens"]], dtype=torch.long, device="cuda")
        model.generate(warm, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        for p in prompts:
            ids = torch.tensor([p["tokens"]], dtype=torch.long, device="cuda")
            t = time.perf_counter()
            model(input_ids=ids, use_cache=True)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - t
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            gen = time.perf_counter() - t
            new = out[0, ids.shape[1]:].tolist()
            res.append(dict(id=p["id"], prompt=ids.shape[1], new=len(new), prefill_s=prefill, generate_s=gen,
                            decode_tokens_per_s=(len(new) - 1) / max(gen - prefill, 1e-9), tokens=new))
    dec = sorted(r["decode_tokens_per_s"] for r in res)
    whole = sum(r["new"] for r in res) / sum(r["generate_s"] for r in res)
    import transformers
    print(f"hf generate: {len(res)} prompts x {a.new} new tokens, generate {whole:.1f} tokens/s overall, decode "
          f"median {dec[len(dec) // 2]:.1f} tokens/s ({', '.join(f'{x:.1f}' for x in dec)}); transformers "
          f"{transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(results=res, generate_tokens_per_s=whole, transformers=transformers.__version__,
                           torch=torch.__version__, gpu=torch.cuda.get_device_name()), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
