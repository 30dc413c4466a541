#!/usr/bin/env python3
"""Trains the GPT-2 byte-level BPE fixture of dgemma's "gpt2-bpe" tokenizer backend
(test/fixtures/gpt2_bpe/; docs/data.md, "Tokenization").

No GPT-2 vocabulary can be downloaded here, so one is trained the way GPT-2's was: the `tokenizers`
BPE trainer behind a ByteLevel pre-tokenizer (GPT-2's pattern, add_prefix_space=False) with all 256
byte characters in the initial alphabet, 4,096 tokens, on text made here: data/tokenizer/corpus.txt
plus 3,000 records of the parity corpus generator (test/interop/tokenizer_corpus.py) with a seed of
its own (the parity test uses another one), decoded with errors="replace". As in GPT-2,
"<|endoftext|>" is the last id; it is appended after training.

Writes vocab.json and merges.txt as HF's BPE model saves them, tokenizer_config.json as GPT-2's
(transformers' GPT2Tokenizer: "<|endoftext|>" is BOS, EOS and unknown, no PAD, add_prefix_space
false) and special_tokens_map.json. Checks that transformers loads the directory as GPT2Tokenizer, and saves it
with save_pretrained to test/fixtures/gpt2_bpe_json/ (tokenizer.json with the ByteLevel pre-tokenizer,
tokenizer_config.json), the form dgemma routes to the same backend.
Training is single-threaded (RAYON_NUM_THREADS=1), and rerunning reproduces every file byte for byte.

Run from anywhere (needs tokenizers and transformers, test/requirements.txt):
  python3 tools/reference/make_gpt2_bpe_fixture.py
"""
import json
import os
import pathlib
import shutil
import sys

os.environ["RAYON_NUM_THREADS"] = "1"

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
OUT = ROOT / "test" / "fixtures" / "gpt2_bpe"
OUT_JSON = ROOT / "test" / "fixtures" / "gpt2_bpe_json"
sys.path.insert(0, str(ROOT / "test" / "interop"))
import tokenizer_corpus  # noqa: E402

VOCAB_SIZE = 4096
TRAINING_SEED = 20260
EOT = "<|endoftext|>"


def training_text():
    yield from (ROOT / "data" / "tokenizer" / "corpus.txt").read_text(encoding="utf-8").splitlines()
    for record in tokenizer_corpus.corpus(TRAINING_SEED, 3000):
        yield record.decode("utf-8", errors="replace")


def main():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(training_text(), trainer)

    state = json.loads(tokenizer.to_str())["model"]
    vocab = dict(state["vocab"])
    assert EOT not in vocab
    vocab[EOT] = len(vocab)
    merges = [" ".join(m) if isinstance(m, list) else m for m in state["merges"]]

    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "vocab.json", "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(OUT / "merges.txt", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "bos_token": EOT, "eos_token": EOT,
              "unk_token": EOT, "pad_token": None, "model_max_length": 1024, "errors": "replace",
              "added_tokens_decoder": {str(vocab[EOT]): {"content": EOT, "lstrip": False, "rstrip": False,
                                                         "normalized": False, "single_word": False,
                                                         "special": True}}}
    with open(OUT / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(OUT / "special_tokens_map.json", "w", encoding="utf-8") as f:
        json.dump({"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}, f, indent=2)
        f.write("\n")

    from transformers import AutoTokenizer
    loaded = AutoTokenizer.from_pretrained(str(OUT))
    assert type(loaded).__name__ == "GPT2Tokenizer", type(loaded)
    assert loaded.eos_token_id == vocab[EOT] and loaded.bos_token_id == vocab[EOT]
    assert loaded.encode("Hello<|endoftext|>", add_special_tokens=False)[-1] == vocab[EOT]
    print(f"wrote {OUT}: {len(vocab)} tokens, {len(merges)} merges")

    # The same tokenizer as transformers saves it: tokenizer.json (ByteLevel pre-tokenizer and decoder)
    # and tokenizer_config.json.
    shutil.rmtree(OUT_JSON, ignore_errors=True)
    loaded.save_pretrained(str(OUT_JSON))
    assert sorted(p.name for p in OUT_JSON.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    print(f"wrote {OUT_JSON}")


if __name__ == "__main__":
    main()
