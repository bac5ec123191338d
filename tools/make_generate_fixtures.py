#!/usr/bin/env python3
"""Hugging Face's own greedy continuations of the fixture prompts, as the oracle of `moeflip trace --generate`.

Usage (on a machine with torch and transformers):

    python3 tools/make_generate_fixtures.py --fixtures tests/fixtures/hf [--cases a,b] [--new 16] [--out DIR]

For each case directory (config.json, model.safetensors, tokens.jsonl, generation_config.json) it loads the
checkpoint in float64 with eager attention and eager experts on the CPU (the same way tools/make_fixtures.py makes
the forward references), runs every prompt of tokens.jsonl on its own (batch 1, all-ones attention mask) through

    model.generate(ids, do_sample=False, max_new_tokens=N)

with the generation config read from the directory, and writes generate.json beside it:

    {"max_new_tokens": N, "eos_token_id": ..., "transformers": "...", "torch": "...",
     "sequences": [{"id": "s0", "tokens": [prompt + generated], "prompt_length": T, "generated": G,
                    "margins": [top-1 minus top-2 score of each step]}]}

The margins say how close each greedy choice was: a step whose margin is below the distance between two
implementations' fp64 logits (about 1e-12 here) could go either way, and the test reports it rather than failing
on it.
"""

import argparse
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig


def load_case(path):
    kw = dict(dtype=torch.float64, attn_implementation="eager")
    try:
        return AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager", **kw)
    except TypeError:
        return AutoModelForCausalLM.from_pretrained(path, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--cases", default="")
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--out", default="", help="write OUT/<case>/generate.json instead of beside the checkpoint")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cases = a.cases.split(",") if a.cases else sorted(
        d for d in os.listdir(a.fixtures) if os.path.exists(os.path.join(a.fixtures, d, "tokens.jsonl")))
    failed = 0
    for case in cases:
        try:
            one_case(a, case)
        except Exception as e:  # one case's failure is reported, the others still made
            failed += 1
            print(case, "FAILED:", repr(e), file=sys.stderr)
    sys.exit(1 if failed else 0)


def one_case(a, case):
    path = os.path.join(a.fixtures, case)
    model = load_case(path).eval()
    found = GenerationConfig.from_pretrained(path) if os.path.exists(os.path.join(path, "generation_config.json")) \
        else model.generation_config
    # Only the stop tokens are taken from the files: moeflip's --generate is plain greedy decoding, so a
    # repetition penalty or a minimum length a config might carry must not shape the oracle.
    gc = GenerationConfig(eos_token_id=found.eos_token_id, pad_token_id=found.pad_token_id, do_sample=False,
                          max_new_tokens=a.new)
    out = {"max_new_tokens": a.new, "eos_token_id": gc.eos_token_id, "transformers": transformers.__version__,
           "torch": torch.__version__, "dtype": "float64", "attn_implementation": "eager", "sequences": []}
    with open(os.path.join(path, "tokens.jsonl")) as f:
        prompts = [json.loads(l) for l in f if l.strip()]
    for p in prompts:
        ids = torch.tensor([p["tokens"]], dtype=torch.long)
        with torch.no_grad():
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=a.new,
                               generation_config=gc, output_scores=True, return_dict_in_generate=True,
                               pad_token_id=gc.pad_token_id if gc.pad_token_id is not None else 0)
        seq = g.sequences[0].tolist()
        margins = []
        for s in g.scores:
            top = torch.topk(s[0].double(), 2).values.tolist()
            margins.append(top[0] - top[1])
        out["sequences"].append({"id": p["id"], "tokens": seq, "prompt_length": len(p["tokens"]),
                                 "generated": len(seq) - len(p["tokens"]), "margins": margins})
        print(case, p["id"], "generated", len(seq) - len(p["tokens"]), "min margin %.3g" % min(margins),
              file=sys.stderr)
    dest = os.path.join(a.out, case) if a.out else path
    os.makedirs(dest, exist_ok=True)
    tmp = os.path.join(dest, "generate.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(dest, "generate.json"))


if __name__ == "__main__":
    main()
