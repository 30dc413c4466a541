#!/usr/bin/env python3
"""Trains the bundled tokenizer (data/tokenizer/) and generates the tokenizer golden fixtures of
runtime/data/text (test/fixtures/tokenizer/).

1. Trains a SentencePiece BPE model (vocab 256, the tiny-cpu config's vocabulary) on
   data/tokenizer/corpus.txt with the Gemma special tokens at fixed ids (data/tokenizer/README.md), and
   writes tokenizer.model, tokenizer_config.json and special_tokens_map.json.
2. Loads that directory with transformers' AutoTokenizer (GemmaTokenizer, converted from the
   SentencePiece model), renders every conversation below with apply_chat_template(...,
   add_generation_prompt=True, enable_thinking=False) and CHAT_TEMPLATE, expands every image
   placeholder to <boi> + N x <image> + <eoi> as Gemma4Processor.replace_image_token does, and
   tokenizes the result with add_special_tokens=False (the template writes <bos> itself).

CHAT_TEMPLATE is NOT Google's Gemma 4 template (it could not be downloaded when this was written): it
is a reimplementation of docs/data.md, "Chat template" (thinking off). The fixtures therefore
pin dgemma's C++ renderer and tokenizer against HF tokenization plus this template.

Writes test/fixtures/tokenizer/conversations.json:
  {"tokenizer": "data/tokenizer", "vocab_size": 256, "special_tokens": {name: id},
   "conversations": [{"name", "messages" (docs/data.md, "JSONL rows" layout, image paths as given),
                      "image_soft_tokens": [N per image part, in order], "completion",
                      "prompt_text" (rendered and expanded), "input_ids", "mm_token_type_ids",
                      "completion_ids"}]}
and test/fixtures/tokenizer/encode.json: {"texts": [{"text", "ids"}]} (plain text, no template).

Run from the repository root (needs sentencepiece, protobuf, tokenizers, transformers, jinja2):
  python3 tools/reference/make_tokenizer_fixtures.py
"""
import io
import json
import os
import sys

import sentencepiece as spm
import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER_DIR = os.path.join(ROOT, "data", "tokenizer")
OUT_DIR = os.path.join(ROOT, "test", "fixtures", "tokenizer")

VOCAB_SIZE = 256
CONTROL = [("<pad>", 0), ("<eos>", 1), ("<bos>", 2), ("<unk>", 3)]
# User-defined symbols get the ids after the control ones, in this order.
USER_DEFINED = ["<image>", "<boi>", "<eoi>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>", "\n"]
SPECIAL = [t for t, _ in CONTROL] + USER_DEFINED[:-1]  # "\n" is an ordinary piece

CHAT_TEMPLATE = r"""{#- A reimplementation of the Gemma 4 chat template (26B variant) as docs/data.md, 'Chat template',
    specifies it. The real template could not be downloaded when the fixtures were made; this one pins
    the choices docs/data.md leaves open (see data/tokenizer/README.md):
      - text content is stripped of leading/trailing whitespace (Jinja `trim`, i.e. Python str.strip());
      - an image part renders as the bare image token, with no whitespace around it (the processor then
        expands it to <boi> + N x <image> + <eoi>);
      - parts are concatenated with nothing between them;
      - assistant history is rendered as given (no thought removal);
      - only thinking off is implemented (enable_thinking=True raises). -#}
{{- bos_token -}}
{%- for message in messages -%}
  {%- if message['role'] == 'assistant' -%}
    {%- set role = 'model' -%}
  {%- elif message['role'] in ['system', 'user'] -%}
    {%- set role = message['role'] -%}
  {%- else -%}
    {{- raise_exception('unknown role: ' + message['role']) -}}
  {%- endif -%}
  {{- '<|turn>' + role + '\n' -}}
  {%- if message['content'] is string -%}
    {{- message['content'] | trim -}}
  {%- else -%}
    {%- for part in message['content'] -%}
      {%- if part['type'] == 'image' -%}
        {{- '<image>' -}}
      {%- elif part['type'] == 'text' -%}
        {{- part['text'] | trim -}}
      {%- else -%}
        {{- raise_exception('unknown part type: ' + part['type']) -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {%- if enable_thinking is defined and enable_thinking -%}
    {{- raise_exception('thinking on is not implemented by this template') -}}
  {%- endif -%}
  {{- '<|turn>model\n<|channel>thought\n<channel|>' -}}
{%- endif -%}
"""


def train():
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        # Relative to the repository root (main() runs there): the model records this path.
        input=os.path.relpath(os.path.join(TOKENIZER_DIR, "corpus.txt"), ROOT), model_writer=model, model_type="bpe",
        vocab_size=VOCAB_SIZE, character_coverage=1.0, byte_fallback=False,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
        split_digits=True, allow_whitespace_only_pieces=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        user_defined_symbols=USER_DEFINED, num_threads=1, minloglevel=2)
    with open(os.path.join(TOKENIZER_DIR, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    assert sp.get_piece_size() == VOCAB_SIZE
    for i, tok in enumerate(SPECIAL):
        assert sp.piece_to_id(tok) == i, (tok, sp.piece_to_id(tok))

    added = {str(i): {"content": tok, "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False, "special": True} for i, tok in enumerate(SPECIAL)}
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": None,
        "image_token": "<image>", "boi_token": "<boi>", "eoi_token": "<eoi>",
        "model_specific_special_tokens": {"image_token": "<image>", "boi_token": "<boi>", "eoi_token": "<eoi>"},
        "extra_special_tokens": ["<image>", "<boi>", "<eoi>", "<|turn>", "<turn|>", "<|channel>",
                                 "<channel|>", "<|think|>"],
        "added_tokens_decoder": added,
        "model_max_length": 1000000,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False,
        "sp_model_kwargs": {},
    }
    with open(os.path.join(TOKENIZER_DIR, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    special_map = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                   "additional_special_tokens": config["extra_special_tokens"]}
    with open(os.path.join(TOKENIZER_DIR, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special_map, f, indent=2, ensure_ascii=False)
        f.write("\n")


def img(path):
    return {"type": "image", "image": path}


def txt(s):
    return {"type": "text", "text": s}


# (name, messages, image soft-token counts in order, completion)
CONVERSATIONS = [
    ("single_user", [{"role": "user", "content": "Write a long essay about Portugal."}], [], "Portugal is a country."),
    ("system_and_user", [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "What is the capital of Portugal?"}], [], "Lisbon."),
    ("multi_turn_history", [{"role": "system", "content": "You are a helpful assistant."},
                            {"role": "user", "content": "Hello!"},
                            {"role": "assistant", "content": "Hi, how can I help?"},
                            {"role": "user", "content": "How many legs does a spider have?"}], [],
     "A spider has eight legs."),
    ("two_exchanges", [{"role": "user", "content": "1 + 1 = ?"}, {"role": "assistant", "content": "2"},
                       {"role": "user", "content": "2 + 2 = ?"}, {"role": "assistant", "content": "4"},
                       {"role": "user", "content": "and 3 + 3?"}], [], "6"),
    ("image_then_text", [{"role": "user", "content": [img("images/cat.png"), txt("What animal is this?")]}], [4],
     "A cat."),
    ("text_then_image", [{"role": "user", "content": [txt("Describe this picture:"), img("a.png")]}], [9],
     "A red square on a white background."),
    ("two_images", [{"role": "user", "content": [img("a.png"), txt("and"), img("b.jpg"), txt("Which is bigger?")]}],
     [1, 3], "The second one."),
    ("image_only", [{"role": "user", "content": [img("x.png")]}], [2], "A dog."),
    ("image_with_system_and_history", [{"role": "system", "content": "Answer in French."},
                                       {"role": "user", "content": [img("p.png"), txt("Qu'est-ce que c'est ?")]},
                                       {"role": "assistant", "content": "C'est un chat."},
                                       {"role": "user", "content": [txt("Et ça ?"), img("q.png")]}], [5, 6],
     "C'est un chien."),
    ("accents", [{"role": "user", "content": "Où est la bibliothèque ? Straße, Größe, mañana, São Paulo."}], [],
     "À côté de la gare, très près."),
    ("cjk", [{"role": "user", "content": "你好，世界。今天天气很好吗？"}], [], "こんにちは世界。猫がいます。"),
    ("emoji", [{"role": "user", "content": "Party time 🎉👍😀 ❤️"}], [], "😀😀 yes!"),
    ("greek_cyrillic_korean", [{"role": "user", "content": "Καλημέρα κόσμε. Привет, мир! 안녕하세요"}], [],
     "Как дела?"),
    ("unknown_characters", [{"role": "user", "content": "Snow ☃ and 🦀 and ẞ ǅ"}], [], "Ω ☃ ok"),
    ("empty_completion", [{"role": "user", "content": "Say nothing."}], [], ""),
    ("completion_ends_with_eos", [{"role": "user", "content": "Stop."}], [], "Done.<eos>"),
    ("completion_is_eos", [{"role": "user", "content": "Stop now."}], [], "<eos>"),
    ("completion_eos_inside", [{"role": "user", "content": "Echo."}], [], "a<eos>b"),
    ("surrounding_whitespace", [{"role": "system", "content": "  \n padded system \t"},
                                {"role": "user", "content": "\n\n  Hello   there  \n"}], [],
     "  leading and trailing spaces  "),
    ("inner_whitespace", [{"role": "user", "content": "line one\nline two\n\n\tindented\n   three spaces"}], [],
     "a\n\nb\tc  d"),
    ("whitespace_around_images", [{"role": "user", "content": [txt("  look: "), img("a.png"), txt("\n and this \n"),
                                                                img("b.png"), txt("   ")]}], [2, 1], " fine "),
    ("empty_text_parts", [{"role": "user", "content": [txt(""), txt("only"), txt("   ")]}], [], "ok"),
    ("unicode_whitespace", [{"role": "user", "content": "\u3000\u00a0wide space\u2003\u00a0"}], [], "\u00a0x\u3000"),
    ("specials_in_user_text", [{"role": "user", "content": "Say <bos> and <|turn> and <channel|> and <eoi> and <unk>."}],
     [], "<|think|> <pad> <turn|>"),
    ("partial_special_strings", [{"role": "user", "content": "<bo <|tur <image <turn| channel|>> <<eos>>"}], [],
     "< | > <|"),
    ("code", [{"role": "user", "content": "def add(a, b):\n    return a + b  # adds"}], [],
     "for (int i = 0; i < n; ++i) { sum += x[i]; }"),
    ("numbers_and_symbols", [{"role": "user", "content": "3.14159 * 2 = 6.28318, 50% of $20 is $10 #1 @home"}], [],
     "1,000,000 ~ `x` ^ | \\ _"),
    ("long_history", [{"role": "system", "content": "Count."}] +
     [m for i in range(4) for m in ({"role": "user", "content": f"next after {i}"},
                                    {"role": "assistant", "content": str(i + 1)})] +
     [{"role": "user", "content": "next after 4"}], [], "5"),
    ("many_image_tokens", [{"role": "user", "content": [img("big.png"), txt("Describe in detail.")]}], [40],
     "It shows a mountain lake at dawn, with mist on the water."),
    ("assistant_history_with_thought", [{"role": "user", "content": "Think first."},
                                        {"role": "assistant", "content": "<|channel>thought\nsecret plan<channel|>  The answer is 4. "},
                                        {"role": "user", "content": "Again?"}], [], "Still 4."),
    ("consecutive_assistant_messages", [{"role": "user", "content": "Tell me two things."},
                                        {"role": "assistant", "content": "First thing."},
                                        {"role": "assistant", "content": "Second thing."},
                                        {"role": "user", "content": "Thanks."}], [], "You're welcome."),
    ("system_as_list_of_parts", [{"role": "system", "content": [txt("  Be brief. "), txt("Use French.")]},
                                 {"role": "user", "content": "Bonjour"}], [], "Salut."),
]

ENCODE_TEXTS = [
    "", " ", "  ", "\n", "\n\n", "a", "The quick brown fox jumps over the lazy dog.",
    " leading space", "trailing space ", "tab\there", "café crème", "你好", "😀", "❤️", "☃", "<eos>", "x<eos>",
    "<eos><eos>", "<|turn>model\n<|channel>thought\n<channel|>", "<boi><image><image><eoi>", "<pad><unk>",
    "1234567890", "Mixed 中文 and English and Ελληνικά and русский.",
]


def chat_template(path):
    """The template to render with: --chat-template FILE (e.g. the upstream Gemma 4 chat_template.jinja,
    which is read, never committed), else CHAT_TEMPLATE below. Gemma 4 templates write the image
    placeholder as <|image|>; the bundled tokenizer calls it <image>."""
    if not path:
        return CHAT_TEMPLATE, "reimplementation of docs/data.md, 'Chat template' (CHAT_TEMPLATE in this script)"
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text.replace("<|image|>", "<image>"), "upstream Gemma 4 chat_template.jinja (" + os.path.basename(path) + \
        "), image placeholder <|image|> mapped to the bundled <image>"


def main():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--chat-template", help="a Jinja chat template file to render the conversations with")
    args = parser.parse_args()
    template, template_name = chat_template(args.chat_template)
    os.chdir(ROOT)
    train()
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    assert len(tok) == VOCAB_SIZE, len(tok)
    special_ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    for i, t in enumerate(SPECIAL):
        assert special_ids[t] == i, (t, special_ids[t])
    image_id, boi, eoi = special_ids["<image>"], special_ids["<boi>"], special_ids["<eoi>"]

    # The reference ids of docs/data.md, "Chat template" have this shape: <bos> <|turn> user \n ... <turn|> \n <|turn> model \n
    # <|channel> thought \n <channel|>.
    out = []
    for name, messages, counts, completion in CONVERSATIONS:
        text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
        pieces = text.split("<image>")
        assert len(pieces) - 1 == len(counts), (name, len(pieces) - 1, counts)
        expanded = pieces[0]
        for n, rest in zip(counts, pieces[1:]):
            expanded += "<boi>" + "<image>" * n + "<eoi>" + rest
        ids = tok(expanded, add_special_tokens=False)["input_ids"]
        mm = [1 if i == image_id else 0 for i in ids]
        assert sum(mm) == sum(counts), name
        assert ids.count(boi) == expanded.count("<boi>") and ids.count(eoi) == expanded.count("<eoi>"), name
        comp = tok(completion, add_special_tokens=False)["input_ids"]
        if not comp or comp[-1] != tok.eos_token_id:
            comp = comp + [tok.eos_token_id]
        assert all(0 <= i < VOCAB_SIZE for i in ids + comp), name
        out.append({"name": name, "messages": messages, "image_soft_tokens": counts, "completion": completion,
                    "prompt_text": expanded, "input_ids": ids, "mm_token_type_ids": mm, "completion_ids": comp})

    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "conversations.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "data/tokenizer", "vocab_size": VOCAB_SIZE, "special_tokens": special_ids,
                   "generator": "tools/reference/make_tokenizer_fixtures.py",
                   "transformers": transformers.__version__, "sentencepiece": spm.__version__,
                   "chat_template": template_name,
                   "conversations": out}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    texts = [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in ENCODE_TEXTS]
    with open(os.path.join(OUT_DIR, "encode.json"), "w", encoding="utf-8") as f:
        json.dump({"texts": texts}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(out)} conversations and {len(texts)} texts to {OUT_DIR}", file=sys.stderr)


if __name__ == "__main__":
    main()
