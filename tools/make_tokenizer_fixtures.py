#!/usr/bin/env python3
"""Makes the tokenizer conformance fixtures of tests/test_tokenizer.c with Hugging Face `tokenizers` itself.

    python3 tools/make_tokenizer_fixtures.py OUT_DIR

Needs only `tokenizers` (0.23) and the standard library; downloads nothing. For each family of tokenizer in
use by the MoE models moeflip traces, it trains a small BPE (a few hundred merges) on a corpus this script
makes itself, configures the normalizer, pre-tokenizer, decoder, post-processor and added tokens as those
models' tokenizer.json files have them, writes OUT_DIR/NAME.tokenizer.json (as tokenizers serializes it),
reloads it from that file, and encodes tricky texts with it: OUT_DIR/NAME.cases.json holds, per text, the
ids of Tokenizer.encode(text) and of encode(text, add_special_tokens=False), and Tokenizer.decode(ids) with
skip_special_tokens False and True. Deterministic: the corpus comes from a fixed seed; run twice, the files
are the same (training uses tokenizers' own deterministic BPE trainer).

The families and where their configuration comes from:
  gpt2          GPT-2: ByteLevel pre-tokenizer (GPT-2's pattern, add_prefix_space false), ByteLevel decoder
  neox_olmoe    GPT-NeoX-20B / OLMoE: NFC, ByteLevel (GPT-2's pattern), added runs of spaces and
                |||IP_ADDRESS||| (normalized, not special), <|endoftext|> and <|padding|> special
  roberta       RoBERTa-style byte level: add_prefix_space true, RobertaProcessing, <mask> with lstrip
  qwen2         Qwen2 / Qwen3 (MoE): NFC, Split with Qwen2's pattern + ByteLevel without its pattern,
                <|endoftext|>, <|im_start|>, <|im_end|>
  llama3        Llama-3: Split with Llama-3's pattern + ByteLevel without its pattern, ignore_merges,
                <|begin_of_text|> added by TemplateProcessing after a ByteLevel post-processor
  deepseek_v3   DeepSeek-V3: three Splits (digits, CJK and kana, the main pattern) + ByteLevel, a BOS
  llama2        Llama-2 / Mixtral (SentencePiece BPE): Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer,
                byte_fallback with <0x00>..<0xFF>, unk, Replace/ByteFallback/Fuse/Strip decoder, <s> BOS
  mistral       the newer Llama/Mistral conversion: Metaspace (prepend_scheme first, split false), byte
                fallback, [INST] and [/INST] special, Metaspace decoder
  lowercase_unk NFKC + Lowercase, Digits (individual) + Metaspace (always, split), unk without byte fallback
  bert_like     NFD + StripAccents + Lowercase + Strip, BertPreTokenizer + Digits, "##" subwords,
                WordPiece decoder, BertProcessing, a single_word added token
  splits        Replace (regex) + Strip normalizers; Split with every behaviour and invert, Punctuation,
                CharDelimiterSplit, then ByteLevel without its pattern; rstrip and lstrip added tokens
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SP = "\u2581"  # SentencePiece's space

# The real models' pre-tokenizer patterns, as their tokenizer.json files have them
QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
DEEPSEEK_PATTERNS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]

# ---- the training corpus ---------------------------------------------------------------------------------

PROSE = """\
The router of a mixture-of-experts layer scores every expert for every token and sends the token to the few
with the highest scores. When two experts score almost the same, a small change in the arithmetic can swap
them: the same model, weights and tokens then give different outputs on different hardware. This project
records which experts each token was sent to, and compares runs made on different machines and precisions.
It's a question of numbers: bf16 rounds to 8 significant bits, fp16 to 11, and fp32 to 24. We'll measure how
often the choices flip, where they flip, and whether the flips change what the model says. They're rare, but
they're not random; you've seen them in long prompts more than in short ones. I'd say it's worth checking.
Numbers like 3.14159, 2024-06-01, 1,000,000 and 0x1F appear in logs; so do paths such as /usr/share/doc and
URLs like https://example.org/path?query=1&x=2. Code, too: def f(x):\n    return x ** 2  # square
"""

WORDS = {
    "en": "the of and to in is was for on that with as by at from this are be an it not or have which their "
          "model expert token router layer score weight output input value number result change small large "
          "machine hardware precision arithmetic rounding compare record measure prompt sequence position".split(),
    "fr": "le la les des une est dans pour avec très été déjà où garçon français naïve élève forêt cœur".split(),
    "de": "der die das und ist nicht mit für über größer Straße schön Mädchen Grüße Äpfel Öl".split(),
    "es": "el los las una está niño año mañana corazón también aquí España señor".split(),
    "el": "και του της είναι στο με για από Καλημέρα κόσμε λόγος ψυχή".split(),
    "ru": "и в не на что с как это по но Привет мир город время человек".split(),
    "zh": "的 是 在 我们 模型 专家 数据 计算 你好 世界 中文 文本".split(),
    "ja": "これは 日本語 の テキスト です カタカナ ひらがな 東京 漢字".split(),
}


def corpus():
    rng = random.Random(20261202)
    lines = [line for line in PROSE.splitlines() if line]
    langs = sorted(WORDS)
    for i in range(3000):
        lang = langs[i % len(langs)] if i % 3 else "en"
        words = [rng.choice(WORDS[lang]) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, len(words)), str(rng.randint(0, 99999)))
        if rng.random() < 0.2:
            words[0] = words[0].capitalize()
        sep = " " if lang not in ("zh", "ja") else rng.choice(["", " "])
        line = sep.join(words) + rng.choice([".", ",", "!", "?", ";", ":", "", " ..."])
        if rng.random() < 0.1:
            line = "    " + line
        lines.append(line)
    return lines


# ---- tricky texts ------------------------------------------------------------------------------------------

TEXTS = [
    "",
    " ",
    "   ",
    "\n",
    "\n\n\n",
    "\t",
    "Hello world",
    " Hello world",
    "Hello  world   !",
    "trailing spaces   ",
    "   leading spaces",
    "don't it's I'M we'll they're you've I'd 'S 'T",
    "The model's experts were routed; THE MODEL'S EXPERTS WERE ROUTED.",
    "12345 3.14159 1,000,000 007 2024-01-01 0x1F 1e-5",
    "1234567890123456789",
    "abc123def456ghi7890",
    "x\u00b2 + y\u00b3 = z\u00b9 \u00bd \u00be \u2460 \u216b \u0661\u0662\u0663",
    "\u00dcn\u00efc\u00f6d\u00e9 caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "e\u0301 vs \u00e9 and A\u030a vs \u00c5",
    "\ufb01 \ufb02 \ufb00 \ufb05 \u2126 \u212b \u00b5",
    "\uff21\uff22\uff23\uff11\uff12\uff13\uff01 \u3000full\u3000width",
    "\u0130stanbul \u00df \u1e9e \u01c5 \u03a3\u039f\u03a6\u0399\u0391 \u03c3\u03bf\u03c6\u03af\u03b1\u03c2",
    "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0413\u041e\u0420\u041e\u0414",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u30ab\u30bf\u30ab\u30ca\u3002",
    "\u4e2d\u6587English\u6df7\u5408123\u6570\u5b57",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "\U0001f600\U0001f603 \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f1eb\U0001f1f7 \u2764\ufe0f",
    "a\u0300\u0301\u0302 Z\u0335\u0336\u0337 \u0915\u093f",
    "zero\u200bwidth\u200djoiner\ufeffbom\u00adsoft",
    "a\u00a0b\u2003c\u3000d\u0085e\u2028f\u2029g\u180eh\u1680i\u202fj\u205fk",
    "\r\nwindows\r\nline\rendings\n\r",
    "def f(x):\n    return x**2  # comment\n\tif a != b: pass\n\n\n    \n",
    "https://example.com/path?q=1&r=2#frag and email@example.com",
    "...!!!???---___***///|||~~~",
    "a" * 80,
    "a" + " " * 40 + "b",
    "word\u0000with\u0001control\u007fchars",
    "\U00010348 \U0001d11e \U0001f9ea \U000e0041",
]


def texts_for(specials):
    """The common texts, and texts that put the tokenizer's own special and added tokens inside words,
    next to spaces, twice in a row and cut in half."""
    out = list(TEXTS)
    for s in specials:
        out += [s, s + "Hello" + s, "Hi " + s + " there", s + s, "x" + s + "y", "  " + s + "  ", s[: len(s) // 2] + " " + s[len(s) // 2 :],
                "<" + s + ">"]
    if len(specials) >= 2:
        out.append(specials[0] + "user\nhello " + specials[1] + "\n" + specials[0] + "assistant\n")
    return out


# ---- building -----------------------------------------------------------------------------------------------


def train(model, trainer, normalizer=None, pre_tokenizer=None):
    tok = Tokenizer(model)
    if normalizer is not None:
        tok.normalizer = normalizer
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def byte_trainer(vocab_size, specials):
    return trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def reload(tok, model_fields=None, edit=None):
    """Through tokenizers' own JSON, with model fields set there (as the real files have them)."""
    d = json.loads(tok.to_str())
    if model_fields:
        d["model"].update(model_fields)
    if edit:
        edit(d)
    return Tokenizer.from_str(json.dumps(d, ensure_ascii=False))


def gpt2():
    tok = train(models.BPE(), byte_trainer(1000, ["<|endoftext|>"]),
                pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tok, ["<|endoftext|>"]


def neox_olmoe():
    tok = train(models.BPE(), byte_trainer(1000, ["<|endoftext|>", "<|padding|>"]), normalizer=normalizers.NFC(),
                pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    added = ["|||IP_ADDRESS|||", "|||EMAIL_ADDRESS|||"] + [" " * n for n in (2, 3, 4, 8)]
    tok.add_tokens([AddedToken(s, single_word=False, lstrip=False, rstrip=False, normalized=True, special=False) for s in added])
    return tok, ["<|endoftext|>", "<|padding|>", "|||IP_ADDRESS|||"]


def roberta():
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    tok = train(models.BPE(), byte_trainer(900, specials),
                pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
    return tok, ["<s>", "</s>", "<mask>"]


def qwen2():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = train(models.BPE(), byte_trainer(1000, specials), normalizer=normalizers.NFC(),
                pre_tokenizer=pre_tokenizers.Sequence([
                    pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def llama3():
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"]
    tok = train(models.BPE(), byte_trainer(1100, specials),
                pre_tokenizer=pre_tokenizers.Sequence([
                    pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]))
    tok.decoder = decoders.ByteLevel()
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok = reload(tok, {"ignore_merges": True})
    return tok, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|begin_of_text|>"]


def deepseek_v3():
    bos, eos = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
    tok = train(models.BPE(), byte_trainer(1100, [bos, eos]), normalizer=normalizers.Sequence([]),
                pre_tokenizer=pre_tokenizers.Sequence(
                    [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DEEPSEEK_PATTERNS] +
                    [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single=bos + " $A", pair=bos + " $A " + bos + " $B:1",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return tok, [bos, eos]


def sentencepiece_model():
    """A SentencePiece-style BPE (Llama-2's layout): <unk> <s> </s>, the 256 byte tokens, then the pieces."""
    norm = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=90,
                                  show_progress=False)
    tok = train(models.BPE(unk_token="<unk>"), trainer, normalizer=norm,
                pre_tokenizer=pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="never", split=True))
    d = json.loads(tok.to_str())
    old = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in old:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    return vocab, d["model"]["merges"]


def sentencepiece_tokenizer(vocab, merges, normalizer, pre_tokenizer, decoder, extra_specials=()):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges],
                               unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if normalizer is not None:
        tok.normalizer = normalizer
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in ("<unk>", "<s>", "</s>") + tuple(extra_specials)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def llama2(vocab, merges):
    tok = sentencepiece_tokenizer(
        vocab, merges, normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)]), None,
        decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]))
    return tok, ["<s>", "</s>", "<unk>"]


def mistral(vocab, merges):
    tok = sentencepiece_tokenizer(
        vocab, merges, None, pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="first", split=False),
        decoders.Metaspace(replacement=SP, prepend_scheme="first", split=False), extra_specials=("[INST]", "[/INST]"))
    return tok, ["[INST]", "[/INST]", "<s>", "</s>"]


def lowercase_unk():
    norm = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always", split=True)])
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, special_tokens=["[UNK]"], limit_alphabet=45, show_progress=False)
    tok = train(models.BPE(unk_token="[UNK]", fuse_unk=False), trainer, normalizer=norm, pre_tokenizer=pre)
    tok.decoder = decoders.Metaspace(replacement=SP, prepend_scheme="always", split=True)
    tok = reload(tok, {"unk_token": "[UNK]", "fuse_unk": False, "byte_fallback": False})
    return tok, ["[UNK]"]


def bert_like():
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    norm = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
                                 normalizers.Strip(left=True, right=True)])
    pre = pre_tokenizers.Sequence([pre_tokenizers.BertPreTokenizer(), pre_tokenizers.Digits(individual_digits=False)])
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=specials, limit_alphabet=60,
                                  continuing_subword_prefix="##", show_progress=False)
    tok = train(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"), trainer, normalizer=norm, pre_tokenizer=pre)
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
    tok.add_tokens([AddedToken("expert", single_word=True, normalized=True, special=False)])
    tok = reload(tok, {"unk_token": "[UNK]", "continuing_subword_prefix": "##"})
    return tok, ["[MASK]", "[SEP]", "expert"]


def splits():
    norm = normalizers.Sequence([normalizers.Replace(Regex(r"[ \t]+"), " "), normalizers.Strip(left=False, right=True)])
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.CharDelimiterSplit("|"),
        pre_tokenizers.Split(" ", behavior="merged_with_next", invert=False),
        pre_tokenizers.Split(Regex(r"[,.;:!?]+"), behavior="merged_with_previous", invert=False),
        pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous", invert=False),
        pre_tokenizers.Split("-", behavior="removed", invert=False),
        pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="merged_with_next", invert=True),
        pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok = train(models.BPE(), byte_trainer(900, ["<sep>"]), normalizer=norm, pre_tokenizer=pre)
    tok.add_special_tokens([AddedToken("<sep>", rstrip=True, normalized=False, special=True),
                            AddedToken("<cls>", lstrip=True, rstrip=True, normalized=False, special=True)])
    tok.decoder = decoders.ByteLevel()
    return tok, ["<sep>", "<cls>"]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tools/make_tokenizer_fixtures.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    sp_vocab, sp_merges = sentencepiece_model()
    builders = [
        ("gpt2", "byte-level BPE (GPT-2)", gpt2),
        ("neox_olmoe", "byte-level BPE (GPT-NeoX, OLMoE)", neox_olmoe),
        ("roberta", "byte-level BPE with a prefix space (RoBERTa)", roberta),
        ("qwen2", "regex Split + byte level (Qwen2, Qwen3)", qwen2),
        ("llama3", "regex Split + byte level (Llama-3)", llama3),
        ("deepseek_v3", "regex Splits + byte level (DeepSeek-V3)", deepseek_v3),
        ("llama2", "SentencePiece-style BPE with byte fallback (Llama-2, Mixtral)", lambda: llama2(sp_vocab, sp_merges)),
        ("mistral", "SentencePiece-style BPE, Metaspace pre-tokenizer (Mistral)", lambda: mistral(sp_vocab, sp_merges)),
        ("lowercase_unk", "NFKC, Lowercase, Digits, Metaspace, unk", lowercase_unk),
        ("bert_like", "NFD, StripAccents, BertPreTokenizer, ## subwords, WordPiece decoder", bert_like),
        ("splits", "Split behaviours, Punctuation, CharDelimiterSplit, Replace and Strip", splits),
    ]
    failed = 0
    for name, family, build in builders:
        try:
            write_family(out, name, family, build)
        except Exception as e:  # one family's failure is reported, the others are still made
            failed += 1
            print(name, "FAILED:", repr(e), file=sys.stderr)
    sys.exit(1 if failed else 0)


def write_family(out, name, family, build):
    tok, specials = build()
    path = os.path.join(out, name + ".tokenizer.json")
    tok.save(path, pretty=False)
    tok = Tokenizer.from_file(path)   # the ids come from the file as written, as moeflip reads it
    cases = []
    for text in texts_for(specials):
        ids = tok.encode(text).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    doc = {"name": name, "family": family, "tokenizers_version": tokenizers.__version__,
           "made_by": "tools/make_tokenizer_fixtures.py", "cases": cases}
    with open(os.path.join(out, name + ".cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print("%-14s %5d ids in %d cases, vocabulary %d" % (name, sum(len(c["ids"]) for c in cases), len(cases), tok.get_vocab_size()))


if __name__ == "__main__":
    main()
