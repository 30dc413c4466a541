#!/usr/bin/env python3
"""Generates the tokenizer.json fixtures of runtime/data/text (test/fixtures/tokenizer_json/).

1. Converts the bundled SentencePiece tokenizer (data/tokenizer/) to an HF fast tokenizer with
   transformers (AutoTokenizer, GemmaTokenizer with the tokenizers backend) and saves tokenizer.json,
   tokenizer_config.json and special_tokens_map.json into test/fixtures/tokenizer_json/ (no
   tokenizer.model there, so dgemma::Tokenizer must use tokenizer.json).
2. Records the fast tokenizer's ids (tokenizers.Tokenizer.from_file(...).encode(text,
   add_special_tokens=False)) for every text of test/fixtures/tokenizer/encode.json and every
   prompt_text / completion of test/fixtures/tokenizer/conversations.json in
   test/fixtures/tokenizer_json/encode.json, together with the SentencePiece ids of those fixtures,
   and lists the texts where they differ.
3. Builds a second, tiny BPE tokenizer.json with byte fallback (<0x00>..<0xFF> pieces; 120 merges learnt
   here, deterministically, on data/tokenizer/corpus.txt) in test/fixtures/tokenizer_json/byte_fallback/,
   and records, for it and for variants of it (other normalizers, pre-tokenizers, BPE options, added
   token flags), the ids tokenizers gives for texts with unknown characters, emoji and CJK (BF_TEXTS
   and RANDOM_TEXTS seeded random strings), in
   test/fixtures/tokenizer_json/variants.json: {"variants": [{"name", "patch": {top-level key: value,
   "model": {key: value merged into the model}}, "texts": [{"text", "ids"}]}]}.

Run from the repository root after make_tokenizer_fixtures.py (needs transformers, tokenizers,
sentencepiece, protobuf):
  python3 tools/reference/make_tokenizer_json_fixtures.py
"""
import copy
import json
import os
import random
import shutil
import tempfile


import tokenizers
import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SP_DIR = os.path.join(ROOT, "data", "tokenizer")
SP_FIXTURES = os.path.join(ROOT, "test", "fixtures", "tokenizer")
OUT_DIR = os.path.join(ROOT, "test", "fixtures", "tokenizer_json")
BF_DIR = os.path.join(OUT_DIR, "byte_fallback")

# Texts for the byte-fallback tokenizer and its variants: unknown characters, emoji, CJK, specials.
BF_TEXTS = [
    "", " ", "  ", "a", "Hello world", " leading and trailing ", "two  spaces", "line\nbreak",
    "☃", "☃☃ snow", "😀", "😀😀!", "你好，世界", "こんにちは", "안녕하세요", "❤️", "café", "\u00e9\u0301",
    "x<eos>y", "<bos>Hi<eos>", "<eos><eos>", "a <mask> b", "a<mask>b", "  <mask>  ", "hello worldly",
    "say hello world", "<unk>", "<0x41>", "tab\there", "\x00\x7f", "mixed ☃ 😀 你 text",
    "The quick brown fox jumps over the lazy dog.",
]
# Plus random strings over pieces that stress the added-token flags and the splitting (seeded).
RANDOM_ALPHABET = list("abcdehlorswxyz  \n\t.,!") + [
    "☃", "😀", "你", "好", "é", "\u0301", "<eos>", "<bos>", "<mask>", "hello world", "or", " <mask> ", "▁",
    "\u3000", "\u00a0", "<0x41>", "<unk>"]
RANDOM_TEXTS = 40


def random_texts():
    rng = random.Random(1)
    return ["".join(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randint(0, 14))) for _ in range(RANDOM_TEXTS)]


def save_variants(path, obj):
    """variants.json with one text entry per line (small, diffable)."""
    lines = ["{"]
    for key in ("tokenizer", "generator", "tokenizers"):
        lines.append(f" {json.dumps(key)}: {json.dumps(obj[key], ensure_ascii=False)},")
    lines.append(' "variants": [')
    for i, v in enumerate(obj["variants"]):
        lines.append(f'  {{"name": {json.dumps(v["name"])}, "patch": {json.dumps(v["patch"], ensure_ascii=False)}, "texts": [')
        texts = [f"   {json.dumps(t, ensure_ascii=False)}" for t in v["texts"]]
        lines.append(",\n".join(texts))
        lines.append("  ]}" + ("," if i + 1 < len(obj["variants"]) else ""))
    lines.append(" ]")
    lines.append("}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    assert json.load(open(path, encoding="utf-8")) == obj


def save_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def convert_bundled():
    tok = AutoTokenizer.from_pretrained(SP_DIR)
    assert tok.is_fast, type(tok)
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, "tokenizer.json"), encoding="utf-8") as f:
            tokenizer_json = json.load(f)
        with open(os.path.join(tmp, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
    # Machine-specific keys.
    for key in ("vocab_file", "is_local", "local_files_only"):
        config.pop(key, None)
    os.makedirs(OUT_DIR, exist_ok=True)
    for name in ("tokenizer.model",):
        if os.path.exists(os.path.join(OUT_DIR, name)):
            os.remove(os.path.join(OUT_DIR, name))
    save_json(os.path.join(OUT_DIR, "tokenizer.json"), tokenizer_json)
    save_json(os.path.join(OUT_DIR, "tokenizer_config.json"), config)
    shutil.copyfile(os.path.join(SP_DIR, "special_tokens_map.json"), os.path.join(OUT_DIR, "special_tokens_map.json"))

    fast = Tokenizer.from_file(os.path.join(OUT_DIR, "tokenizer.json"))
    with open(os.path.join(SP_FIXTURES, "encode.json"), encoding="utf-8") as f:
        encode = json.load(f)
    with open(os.path.join(SP_FIXTURES, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)
    texts, mismatches = [], []

    def record(kind, name, text, sp_ids):
        ids = fast.encode(text, add_special_tokens=False).ids
        texts.append({"kind": kind, "name": name, "text": text, "ids": ids, "sentencepiece_ids": sp_ids})
        if ids != sp_ids:
            mismatches.append({"kind": kind, "name": name, "text": text})

    for t in encode["texts"]:
        record("text", "", t["text"], t["ids"])
    for c in conversations["conversations"]:
        record("prompt_text", c["name"], c["prompt_text"], c["input_ids"])
        sp_completion = list(c["completion_ids"])
        if sp_completion and sp_completion[-1] == 1 and not c["completion"].endswith("<eos>"):
            sp_completion = sp_completion[:-1]  # completion_ids = encode(completion) + EOS
        record("completion", c["name"], c["completion"], sp_completion)
    save_json(os.path.join(OUT_DIR, "encode.json"), {
        "tokenizer": "test/fixtures/tokenizer_json (converted from data/tokenizer by transformers)",
        "generator": "tools/reference/make_tokenizer_json_fixtures.py",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "vocab_size": fast.get_vocab_size(with_added_tokens=True),
        "mismatches_with_sentencepiece": mismatches,
        "texts": texts,
    })
    print(f"{len(texts)} texts, {len(mismatches)} differ from SentencePiece:")
    for m in mismatches:
        print("  ", json.dumps(m, ensure_ascii=False))


def build_byte_fallback():
    # A small deterministic BPE training (ties broken by the pair's text) on the bundled corpus, with
    # whitespace as "▁" prefixed to every word, as Gemma does: the 60 most frequent characters form the
    # alphabet (any other character needs byte fallback), then 120 merges.
    from collections import Counter
    with open(os.path.join(SP_DIR, "corpus.txt"), encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    words = Counter()
    for line in lines:
        for w in ("▁" + line.replace(" ", "▁")).split("▁"):
            words["▁" + w] += 1
    chars = Counter()
    for w, n in words.items():
        for ch in w:
            chars[ch] += n
    alphabet = sorted(sorted(chars, key=lambda ch: (-chars[ch], ch))[:60])
    known = set(alphabet)
    splits = {w: list(w) for w in words}
    merges = []
    for _ in range(120):
        pairs = Counter()
        for w, n in words.items():
            sym = splits[w]
            for x, y in zip(sym, sym[1:]):
                if x in known and y in known:
                    pairs[(x, y)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(list(best))
        known.add(best[0] + best[1])
        for w in words:
            sym, out, i = splits[w], [], 0
            while i < len(sym):
                if i + 1 < len(sym) and (sym[i], sym[i + 1]) == best:
                    out.append(sym[i] + sym[i + 1])
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            splits[w] = out

    vocab = {}
    for t in ["<pad>", "<eos>", "<bos>", "<unk>"]:
        vocab[t] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in alphabet + [x + y for x, y in merges]:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    mask_id = len(vocab)
    hello_id = mask_id + 1

    def added(i, content, special, normalized=False, lstrip=False, rstrip=False, single_word=False):
        return {"id": i, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
                "normalized": normalized, "special": special}

    tj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(0, "<pad>", True), added(1, "<eos>", True), added(2, "<bos>", True),
                         added(3, "<unk>", True), added(mask_id, "<mask>", True, lstrip=True, rstrip=True),
                         added(hello_id, "hello world", False, normalized=True)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    Tokenizer.from_str(json.dumps(tj))  # must load
    os.makedirs(BF_DIR, exist_ok=True)
    save_json(os.path.join(BF_DIR, "tokenizer.json"), tj)
    save_json(os.path.join(BF_DIR, "tokenizer_config.json"), {
        "backend": "tokenizers", "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>",
        "eos_token": {"content": "<eos>"}, "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>"})

    split_merged_prev = {"type": "Split", "pattern": {"String": "▁"}, "behavior": "MergedWithPrevious",
                         "invert": False}
    variants = [
        ("byte_fallback", {}),
        ("no_byte_fallback_fuse_unk", {"model": {"byte_fallback": False, "fuse_unk": True}}),
        ("no_byte_fallback_no_fuse", {"model": {"byte_fallback": False, "fuse_unk": False}}),
        ("ignore_merges", {"model": {"ignore_merges": True}}),
        ("string_merges", {"model": {"merges": [" ".join(m) for m in merges]}}),
        ("metaspace_first", {"normalizer": None, "pre_tokenizer": {
            "type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}}),
        ("metaspace_always_nosplit", {"normalizer": None, "pre_tokenizer": {
            "type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False}}),
        ("metaspace_never", {"normalizer": None, "pre_tokenizer": {
            "type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True}}),
        ("replace_only_split_prev", {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                                     "pre_tokenizer": split_merged_prev}),
    ]
    for behavior in ["Removed", "Isolated", "MergedWithNext", "Contiguous"]:
        variants.append((f"split_{behavior.lower()}", {"pre_tokenizer": {
            "type": "Sequence", "pretokenizers": [dict(split_merged_prev, behavior=behavior)]}}))
    variants.append(("split_word_isolated", {"pre_tokenizer": {
        "type": "Split", "pattern": {"String": "or"}, "behavior": "Isolated", "invert": False}}))
    variants.append(("added_flags", {"added_tokens": tj["added_tokens"][:4] + [
        added(mask_id, "<mask>", False, lstrip=True), added(hello_id, "hello world", True, single_word=True),
        added(hello_id + 1, "or", False, normalized=False, rstrip=True)]}))

    texts = BF_TEXTS + random_texts()
    out = []
    for name, patch in variants:
        v = copy.deepcopy(tj)
        for key, value in patch.items():
            if key == "model":
                v["model"].update(value)
            else:
                v[key] = value
        tok = Tokenizer.from_str(json.dumps(v))
        out.append({"name": name, "patch": patch,
                    "texts": [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]})
    save_variants(os.path.join(OUT_DIR, "variants.json"), {
        "tokenizer": "test/fixtures/tokenizer_json/byte_fallback",
        "generator": "tools/reference/make_tokenizer_json_fixtures.py",
        "tokenizers": tokenizers.__version__,
        "variants": out,
    })
    print(f"byte_fallback: vocab {len(vocab)}, {len(merges)} merges, {len(out)} variants")


if __name__ == "__main__":
    convert_bundled()
    build_byte_fallback()
