#!/usr/bin/env python3
"""Convert a Hugging Face OLMoE checkpoint to a GGUF file for llama.cpp's `olmoe` architecture.

Usage:
    python3 bench/hf_to_gguf.py MODEL_DIR OUT.gguf [--outtype bf16|f32] [--pre NAME]

What it reads
    MODEL_DIR/config.json (model_type "olmoe" / OlmoeForCausalLM) and either MODEL_DIR/model.safetensors
    or the shards named by MODEL_DIR/model.safetensors.index.json. Tensors may be BF16, F16 or F32.
    MODEL_DIR/tokenizer.json, where present (a byte-level BPE tokenizer, as OLMoE's).

What it writes
    One GGUF v3 file (the layout of ggml/include/gguf.h and docs/gguf.md in llama.cpp): the hyperparameters
    under `olmoe.*`, the vocabulary under `tokenizer.ggml.*`, and the tensors under llama.cpp's names:

        model.embed_tokens.weight                      -> token_embd.weight
        model.layers.L.input_layernorm.weight          -> blk.L.attn_norm.weight
        model.layers.L.self_attn.{q,k,v}_proj.weight   -> blk.L.attn_{q,k,v}.weight    (not permuted: olmoe
                                                          uses llama.cpp's NeoX RoPE, HF's rotate_half)
        model.layers.L.self_attn.o_proj.weight         -> blk.L.attn_output.weight
        model.layers.L.self_attn.{q,k}_norm.weight     -> blk.L.attn_{q,k}_norm.weight (over the full projection)
        model.layers.L.post_attention_layernorm.weight -> blk.L.ffn_norm.weight
        model.layers.L.mlp.gate.weight                 -> blk.L.ffn_gate_inp.weight    (the router)
        model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
                                                       -> blk.L.ffn_{gate,up,down}_exps.weight, the layer's experts
                                                          stacked as numpy [n_expert, out, in]
        model.norm.weight                              -> output_norm.weight
        lm_head.weight                                 -> output.weight (token_embd's values if the
                                                          embeddings are tied)

    With --outtype bf16 (the default) the matrices are BF16; like llama.cpp's own convert_hf_to_gguf.py, the
    norms (1-D tensors) and the router stay F32 (exactly the bf16 values, widened). With --outtype f32 every
    tensor is F32. F32 or F16 sources written as BF16 are rounded to nearest even.

    Without a tokenizer.json (the synthetic checkpoints of `moeflip synth`) it writes tokenizer.ggml.model =
    "none" with olmoe.vocab_size = config.vocab_size: llama.cpp then makes that many dummy tokens, which is
    enough for llama-bench and for feeding token ids, not for text.

Memory: the safetensors files are parsed here (8-byte little-endian header length, JSON header, raw data); the
GGUF header is written first from the safetensors headers alone, then each tensor (each expert matrix, for the
merged expert tensors) is read through a numpy memmap and written in chunks of at most 8M elements. Memory stays
flat whatever the checkpoint size: 115 MB peak RSS for a 643 MB checkpoint (bf16), and the same for one of
13 GB, whose largest tensor (the 50304 x 2048 embedding) is streamed in chunks like any other.

Limits
    * OLMoE only (no dense layers, no shared experts, no GQA-width k_norm, no biases), with one tensor per expert
      projection (the Hub layout); a checkpoint with fused expert tensors or any other tensor is refused.
    * norm_topk_prob true and clip_qkv are refused: llama.cpp's olmoe graph renormalises nothing and clips
      nothing, so the GGUF would compute a different function.
    * rope scaling (rope_scaling / rope_parameters other than "default") is refused.
    * The BPE pre-tokenizer type (tokenizer.ggml.pre) is not detected; it defaults to "default" (give
      --pre olmo for allenai/OLMoE-1B-7B). It only matters for tokenizing text, not for token ids.
    * Only Python 3 and numpy (Debian's python3-numpy).
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# gguf value types (ggml/include/gguf.h)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, T_UINT64, \
    T_INT64, T_FLOAT64 = range(13)

# ggml tensor types (ggml/include/ggml.h) and llama file types (include/llama.h)
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
FTYPE_ALL_F32, FTYPE_MOSTLY_BF16 = 0, 32

# llama.cpp token types (llama_token_type)
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_USER_DEFINED, TOK_UNUSED, TOK_BYTE = 1, 2, 3, 4, 5, 6

ST_DTYPES = {"BF16": (np.uint16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4)}


# ---------------------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------------------

class SafeTensor:
    """One tensor of a safetensors file: where its bytes are, read lazily through a memmap."""

    def __init__(self, path, data_start, name, meta):
        self.path, self.name = path, name
        self.dtype = meta["dtype"]
        if self.dtype not in ST_DTYPES:
            raise SystemExit(f"{name}: dtype {self.dtype} not supported (BF16, F16, F32 only)")
        self.shape = tuple(meta["shape"])
        begin, end = meta["data_offsets"]
        self.offset = data_start + begin
        self.nbytes = end - begin
        np_dtype, size = ST_DTYPES[self.dtype]
        if self.nbytes != size * int(np.prod(self.shape, dtype=np.int64)):
            raise SystemExit(f"{name}: data_offsets do not match shape {self.shape}")

    CHUNK = 1 << 23  # elements converted at a time (32 MB of f32): memory stays flat for any tensor size

    def chunks(self, to_f32):
        """The tensor's data, in row-major order, as bytes of F32 (to_f32) or of bf16 bit patterns, a chunk of
        at most CHUNK elements at a time."""
        np_dtype, size = ST_DTYPES[self.dtype]
        count = int(np.prod(self.shape, dtype=np.int64))
        for lo in range(0, count, self.CHUNK):
            n = min(self.CHUNK, count - lo)
            # one memmap per chunk, dropped after it: the file's pages mapped here never exceed one chunk
            part = np.memmap(self.path, dtype=np_dtype, mode="r", offset=self.offset + lo * size, shape=(n,))
            if self.dtype == "BF16":
                out = (part.astype(np.uint32) << 16).view(np.float32) if to_f32 else np.array(part)
            else:
                f32 = part.astype(np.float32)
                out = f32 if to_f32 else f32_to_bf16_bits(f32)
            del part
            yield out.tobytes()


def f32_to_bf16_bits(x):
    """float32 -> bf16 bit patterns, round to nearest even (NaN kept quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def read_safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data_start = 8 + n
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = SafeTensor(path, data_start, name, meta)
    return tensors


def open_checkpoint(model_dir):
    """All tensors of a checkpoint, single-file or sharded, by name."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    elif os.path.exists(single):
        weight_map, files = None, ["model.safetensors"]
    else:
        raise SystemExit(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")
    tensors = {}
    for fn in files:
        for name, t in read_safetensors_header(os.path.join(model_dir, fn)).items():
            if weight_map is not None and weight_map.get(name) != fn:
                continue  # listed in another shard by the index
            tensors[name] = t
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise SystemExit(f"index names tensors its shards lack: {missing[:5]}")
    return tensors


# ---------------------------------------------------------------------------------------------------------
# GGUF writing
# ---------------------------------------------------------------------------------------------------------

def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


SCALAR_FMT = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I", T_INT32: "<i",
              T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q", T_FLOAT64: "<d"}


def gguf_value(vtype, value):
    if vtype == T_STRING:
        return gguf_str(value)
    return struct.pack(SCALAR_FMT[vtype], value)


def gguf_kv(key, vtype, value, elem_type=None):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == T_ARRAY:
        out += struct.pack("<IQ", elem_type, len(value))
        if elem_type == T_STRING:
            out += b"".join(gguf_str(v) for v in value)
        else:
            np_type = {T_INT32: "<i4", T_UINT32: "<u4", T_FLOAT32: "<f4", T_UINT8: "u1"}[elem_type]
            out += np.asarray(value, dtype=np_type).tobytes()
    else:
        out += gguf_value(vtype, value)
    return out


class OutTensor:
    """A tensor of the output: its GGUF name, numpy shape, ggml type and the source tensors it is made of
    (several for a merged expert tensor, stacked along a new first axis)."""

    def __init__(self, name, parts, ggml_type):
        self.name, self.parts, self.ggml_type = name, parts, ggml_type
        shape = parts[0].shape
        for p in parts:
            if p.shape != shape:
                raise SystemExit(f"{name}: parts of different shapes {p.shape} and {shape}")
        self.shape = (len(parts),) + shape if len(parts) > 1 else shape
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * (4 if ggml_type == GGML_F32 else 2)
        self.offset = 0

    def info(self):
        ne = list(reversed(self.shape))  # ggml's ne[0] is the innermost (contiguous) dimension
        return gguf_str(self.name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + \
            struct.pack("<IQ", self.ggml_type, self.offset)

    def write_data(self, f):
        for p in self.parts:
            for chunk in p.chunks(self.ggml_type == GGML_F32):
                f.write(chunk)


def pad_to(f, alignment):
    pos = f.tell()
    rem = (-pos) % alignment
    if rem:
        f.write(b"\0" * rem)


# ---------------------------------------------------------------------------------------------------------
# OLMoE mapping
# ---------------------------------------------------------------------------------------------------------

def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "olmoe" and "OlmoeForCausalLM" not in cfg.get("architectures", []):
        raise SystemExit(f"not an OLMoE checkpoint (model_type {cfg.get('model_type')!r})")
    if cfg.get("norm_topk_prob"):
        raise SystemExit("norm_topk_prob is true: llama.cpp's olmoe graph does not renormalise the top-k weights")
    if cfg.get("clip_qkv") is not None:
        raise SystemExit("clip_qkv is set: llama.cpp's olmoe graph does not clip q/k/v")
    if cfg.get("attention_bias"):
        raise SystemExit("attention_bias is true: llama.cpp's olmoe graph has no attention biases")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise SystemExit(f"rope type {rope_type!r} not supported (default RoPE only)")
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    if n_kv != n_head:
        raise SystemExit("GQA (num_key_value_heads != num_attention_heads): llama.cpp's olmoe k_norm is n_embd wide")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    if head_dim * n_head != cfg["hidden_size"]:
        raise SystemExit("head_dim * heads != hidden_size: not supported by llama.cpp's olmoe")
    return cfg, float(theta)


def map_tensors(cfg, st, outtype):
    """The output tensors, in llama.cpp's order (token_embd, blocks, output_norm, output)."""
    n_layer = cfg["num_hidden_layers"]
    n_expert = cfg["num_experts"]
    mat = GGML_F32 if outtype == "f32" else GGML_BF16
    used = set()

    def get(name):
        if name not in st:
            raise SystemExit(f"checkpoint lacks {name}")
        used.add(name)
        return st[name]

    out = [OutTensor("token_embd.weight", [get("model.embed_tokens.weight")], mat)]
    for L in range(n_layer):
        p, b = f"model.layers.{L}.", f"blk.{L}."
        out += [
            OutTensor(b + "attn_norm.weight", [get(p + "input_layernorm.weight")], GGML_F32),
            OutTensor(b + "attn_q.weight", [get(p + "self_attn.q_proj.weight")], mat),
            OutTensor(b + "attn_k.weight", [get(p + "self_attn.k_proj.weight")], mat),
            OutTensor(b + "attn_v.weight", [get(p + "self_attn.v_proj.weight")], mat),
            OutTensor(b + "attn_output.weight", [get(p + "self_attn.o_proj.weight")], mat),
            OutTensor(b + "attn_q_norm.weight", [get(p + "self_attn.q_norm.weight")], GGML_F32),
            OutTensor(b + "attn_k_norm.weight", [get(p + "self_attn.k_norm.weight")], GGML_F32),
            OutTensor(b + "ffn_norm.weight", [get(p + "post_attention_layernorm.weight")], GGML_F32),
            OutTensor(b + "ffn_gate_inp.weight", [get(p + "mlp.gate.weight")], GGML_F32),
        ]
        for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            parts = [get(f"{p}mlp.experts.{e}.{hf}.weight") for e in range(n_expert)]
            t = OutTensor(b + gg + ".weight", parts, mat)
            if n_expert == 1:  # keep the expert axis even for a single expert
                t.shape = (1,) + t.shape
            out.append(t)
    out.append(OutTensor("output_norm.weight", [get("model.norm.weight")], GGML_F32))
    if "lm_head.weight" in st:
        out.append(OutTensor("output.weight", [get("lm_head.weight")], mat))
    elif cfg.get("tie_word_embeddings", False):
        out.append(OutTensor("output.weight", [st["model.embed_tokens.weight"]], mat))
    else:
        raise SystemExit("checkpoint lacks lm_head.weight and tie_word_embeddings is false")
    unused = sorted(set(st) - used - {"lm_head.weight"})
    if unused:
        raise SystemExit(f"checkpoint tensors with no place in llama.cpp's olmoe: {unused[:8]}")
    return out


def tokenizer_kvs(model_dir, cfg, pre):
    """tokenizer.ggml.* entries: a gpt2-style BPE vocabulary from tokenizer.json, or llama.cpp's 'none'."""
    arch = "olmoe"
    vocab_size = cfg["vocab_size"]
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        return [gguf_kv("tokenizer.ggml.model", T_STRING, "none"),
                gguf_kv(f"{arch}.vocab_size", T_UINT32, vocab_size)]
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"tokenizer.json model type {model.get('type')!r}: only (byte-level) BPE is supported")
    id_to_tok = {i: t for t, i in model["vocab"].items()}
    specials = {}
    for a in tok.get("added_tokens", []):
        id_to_tok[a["id"]] = a["content"]
        specials[a["id"]] = a.get("special", False)
    if max(id_to_tok) >= vocab_size:
        raise SystemExit(f"tokenizer has id {max(id_to_tok)} >= config vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in id_to_tok:
            tokens.append(f"[PAD{i}]")
            types.append(TOK_UNUSED)
        else:
            tokens.append(id_to_tok[i])
            types.append(TOK_CONTROL if specials.get(i) else (TOK_USER_DEFINED if i in specials else TOK_NORMAL))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    kvs = [gguf_kv("tokenizer.ggml.model", T_STRING, "gpt2"),
           gguf_kv("tokenizer.ggml.pre", T_STRING, pre),
           gguf_kv("tokenizer.ggml.tokens", T_ARRAY, tokens, T_STRING),
           gguf_kv("tokenizer.ggml.token_type", T_ARRAY, types, T_INT32),
           gguf_kv("tokenizer.ggml.merges", T_ARRAY, merges, T_STRING)]
    tcfg = {}
    tcfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(tcfg_path):
        with open(tcfg_path) as f:
            tcfg = json.load(f)
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        v = cfg.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is not None:
            kvs.append(gguf_kv(f"tokenizer.ggml.{name}_token_id", T_UINT32, int(v)))
    kvs.append(gguf_kv("tokenizer.ggml.add_bos_token", T_BOOL, bool(tcfg.get("add_bos_token", False))
                       and cfg.get("bos_token_id") is not None))
    kvs.append(gguf_kv("tokenizer.ggml.add_eos_token", T_BOOL, bool(tcfg.get("add_eos_token", False))))
    return kvs


def convert(model_dir, out_path, outtype="bf16", pre="default", name=None, quiet=False):
    cfg, theta = load_config(model_dir)
    st = open_checkpoint(model_dir)
    tensors = map_tensors(cfg, st, outtype)
    arch = "olmoe"
    kvs = [
        gguf_kv("general.architecture", T_STRING, arch),
        gguf_kv("general.name", T_STRING, name or os.path.basename(os.path.abspath(model_dir))),
        gguf_kv("general.file_type", T_UINT32, FTYPE_ALL_F32 if outtype == "f32" else FTYPE_MOSTLY_BF16),
        gguf_kv("general.alignment", T_UINT32, ALIGNMENT),
        gguf_kv(f"{arch}.context_length", T_UINT32, cfg["max_position_embeddings"]),
        gguf_kv(f"{arch}.embedding_length", T_UINT32, cfg["hidden_size"]),
        gguf_kv(f"{arch}.block_count", T_UINT32, cfg["num_hidden_layers"]),
        gguf_kv(f"{arch}.feed_forward_length", T_UINT32, cfg["intermediate_size"]),
        gguf_kv(f"{arch}.attention.head_count", T_UINT32, cfg["num_attention_heads"]),
        gguf_kv(f"{arch}.attention.head_count_kv", T_UINT32,
                cfg.get("num_key_value_heads", cfg["num_attention_heads"])),
        gguf_kv(f"{arch}.rope.freq_base", T_FLOAT32, theta),
        gguf_kv(f"{arch}.attention.layer_norm_rms_epsilon", T_FLOAT32, float(cfg.get("rms_norm_eps", 1e-5))),
        gguf_kv(f"{arch}.expert_count", T_UINT32, cfg["num_experts"]),
        gguf_kv(f"{arch}.expert_used_count", T_UINT32, cfg["num_experts_per_tok"]),
    ] + tokenizer_kvs(model_dir, cfg, pre)

    offset = 0
    for t in tensors:
        t.offset = offset
        offset += t.nbytes + (-t.nbytes) % ALIGNMENT

    tmp = out_path + ".part"
    with open(tmp, "wb") as f:
        f.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(kvs)))
        for kv in kvs:
            f.write(kv)
        for t in tensors:
            f.write(t.info())
        pad_to(f, ALIGNMENT)
        data_start = f.tell()
        for i, t in enumerate(tensors):
            assert f.tell() - data_start == t.offset
            t.write_data(f)
            pad_to(f, ALIGNMENT)
            if not quiet and (i % 20 == 0 or i == len(tensors) - 1):
                print(f"  [{i + 1}/{len(tensors)}] {t.name} {list(t.shape)}", file=sys.stderr)
    os.replace(tmp, out_path)
    if not quiet:
        print(f"wrote {out_path}: {len(tensors)} tensors, {os.path.getsize(out_path)} bytes, {outtype}",
              file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", help="Hugging Face OLMoE checkpoint directory")
    ap.add_argument("output", help="GGUF file to write")
    ap.add_argument("--outtype", choices=("bf16", "f32"), default="bf16",
                    help="type of the matrices (norms and router are always F32); default bf16")
    ap.add_argument("--pre", default="default",
                    help="tokenizer.ggml.pre (BPE pre-tokenizer type), e.g. olmo; default 'default'")
    ap.add_argument("--name", help="general.name (default: the directory's name)")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args()
    convert(a.model_dir, a.output, a.outtype, a.pre, a.name, a.quiet)


if __name__ == "__main__":
    main()
