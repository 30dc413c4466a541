#!/usr/bin/env python3
"""Reference collated batches for the data pipeline (docs/data.md, "Chat template" to "Collated batch"), from HF's
tokenizer, the chat
template of make_tokenizer_fixtures.py and HF's Gemma4ImageProcessor, collated by the rules of
docs/data.md ("Blocks", "Collated batch") written out below in Python.

Writes test/fixtures/batch/{rows.jsonl, expected.safetensors, meta.json}. Run from the repo root:
  PYTHONPATH=<dir with torchvision> python3 tools/reference/make_batch_fixtures.py [--chat-template FILE]
(FILE: the upstream Gemma 4 chat_template.jinja, read and never committed; see
make_tokenizer_fixtures.chat_template).
Needs transformers, torch, torchvision, safetensors, sentencepiece, pillow (none of them in CI).

Micro-batches: items in (row, block) order, grouped greedily into batches of at most MICRO_BATCH that
never mix image and text items (the collator rejects mixed ones). pixel_values are compared through
an FNV-1a 64 digest of their float32 bytes (they are exact uint8 levels * float32(1/255), so the C++
values are bit-identical) plus the first patches in full.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from transformers import AutoTokenizer
from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

sys.path.insert(0, os.path.dirname(__file__))
from make_tokenizer_fixtures import chat_template  # noqa: E402

OUT = "test/fixtures/batch"
TOKENIZER = "data/tokenizer"
CANVAS = 16
PAD_TO_MULTIPLE_OF = 2
MICRO_BATCH = 3
MAX_SOFT_TOKENS = 70
HEAD_PATCHES = 4

LONG = ("The committed blocks join the encoder context one by one, so a long answer such as this one is "
        "split into several canvases without truncation.")
ROWS = [
    {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "completion": "4"},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
     "completion": "Blue."},
    {"messages": [{"role": "user", "content": "Translate: café crème"}], "completion": "coffee with cream"},
    {"messages": [{"role": "user", "content": "你好吗？"}], "completion": "我很好，谢谢。"},
    {"messages": [{"role": "user", "content": "Tell me about blocks."}], "completion": LONG},
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "../images/rgb.png"},
                                               {"type": "text", "text": "Describe the picture."}]}],
     "completion": "A smooth gradient of colours."},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "And now?"}], "completion": "Now we talk."},
    {"messages": [{"role": "user", "content": "   spaced   "}], "completion": ""},
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "../images/photo.jpg"},
                                               {"type": "text", "text": "What is this?"}]}],
     "completion": LONG},
    {"messages": [{"role": "user", "content": "Emoji 😀 and symbols ≤ ≥"}], "completion": "Noted ❤"},
    {"messages": [{"role": "user", "content": "Count: one two three four five six seven eight"}],
     "completion": "nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen"},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Two images:"},
                                               {"type": "image", "image": "../images/gray.png"},
                                               {"type": "image", "image": "../images/wide.png"}]}],
     "completion": "A grey one and a wide one."},
    {"messages": [{"role": "system", "content": "Answer in Greek."}, {"role": "user", "content": "Hello"}],
     "completion": "Γειά σου"},
    {"messages": [{"role": "user", "content": "Русский текст, пожалуйста."}], "completion": "Конечно."},
    {"messages": [{"role": "user", "content": "Multi\nline\nprompt"}], "completion": "multi\nline\nanswer"},
    {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                  {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"},
                  {"role": "user", "content": "Q3"}], "completion": "A3"},
    {"messages": [{"role": "user", "content": [{"type": "image", "image": "../images/rgb.png"}]}],
     "completion": "Colours."},
    {"messages": [{"role": "user", "content": "Sort 5 3 9 1"}], "completion": "1 3 5 9"},
    {"messages": [{"role": "user", "content": "한국어"}], "completion": "좋아요"},
    {"messages": [{"role": "user", "content": "Tabs\tand  double  spaces"}], "completion": "ok"},
    {"messages": [{"role": "user", "content": "Long again"}], "completion": LONG + " " + LONG},
    {"messages": [{"role": "user", "content": "Last one"}], "completion": "Done.<eos>"},
]


def fnv1a64(data):
    value = 0xcbf29ce484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= (1 << 63) else value  # stored as int64


def tokenize(tok, processor, row, template):
    images = [part["image"] for m in row["messages"] if isinstance(m["content"], list)
              for part in m["content"] if part["type"] == "image"]
    processed = [processor(images=[Image.open(os.path.join(OUT, p)).convert("RGB")], return_tensors="pt") for p in images]
    counts = [int(p["num_soft_tokens_per_image"][0]) for p in processed]
    messages = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
                 [{"type": "image"} if part["type"] == "image" else part for part in m["content"]]}
                for m in row["messages"]]
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    pieces = text.split("<image>")
    expanded = pieces[0]
    for n, rest in zip(counts, pieces[1:]):
        expanded += "<boi>" + "<image>" * n + "<eoi>" + rest
    ids = tok(expanded, add_special_tokens=False)["input_ids"]
    image_id = tok.convert_tokens_to_ids("<image>")
    completion = tok(row["completion"], add_special_tokens=False)["input_ids"]
    if not completion or completion[-1] != tok.eos_token_id:
        completion.append(tok.eos_token_id)
    return ids, [int(i == image_id) for i in ids], completion, processed


def main():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--chat-template", help="a Jinja chat template file to render the rows with")
    template, template_name = chat_template(parser.parse_args().chat_template)
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    processor = Gemma4ImageProcessor(max_soft_tokens=MAX_SOFT_TOKENS)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "rows.jsonl"), "w", encoding="utf-8") as out:
        for row in ROWS:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")

    items = []  # (input_ids, types, canvas, processed images of the row)
    for row in ROWS:
        ids, types, completion, processed = tokenize(tok, processor, row, template)
        for k in range(0, len(completion), CANVAS):
            items.append((ids + completion[:k], types + [0] * k, completion[k:k + CANVAS], processed))

    batches, current = [], []
    for item in items:
        if current and (len(current) == MICRO_BATCH or bool(current[0][3]) != bool(item[3])):
            batches.append(current)
            current = []
        current.append(item)
    batches.append(current)

    tensors = {}
    for b, batch in enumerate(batches):
        width = -(-max(len(i[0]) for i in batch) // PAD_TO_MULTIPLE_OF) * PAD_TO_MULTIPLE_OF
        fields = {name: [] for name in ("input_ids", "attention_mask", "position_ids", "mm_token_type_ids",
                                        "canvas_ids", "canvas_mask")}
        for ids, types, canvas, _ in batch:
            pad = width - len(ids)
            fields["input_ids"].append([0] * pad + ids)
            fields["attention_mask"].append([0] * pad + [1] * len(ids))
            fields["position_ids"].append(list(range(width)))
            fields["mm_token_type_ids"].append([0] * pad + types)
            fields["canvas_ids"].append(canvas + [0] * (CANVAS - len(canvas)))
            fields["canvas_mask"].append([1.0] * len(canvas) + [0.0] * (CANVAS - len(canvas)))
        for name, rows in fields.items():
            dtype = torch.float32 if name == "canvas_mask" else torch.int64
            tensors[f"batch{b}.{name}"] = torch.tensor(rows, dtype=dtype)
        if batch[0][3]:
            pixels = torch.cat([p["pixel_values"] for item in batch for p in item[3]], dim=0)
            positions = torch.cat([p["image_position_ids"] for item in batch for p in item[3]], dim=0).to(torch.int64)
            tensors[f"batch{b}.pixel_values_shape"] = torch.tensor(list(pixels.shape), dtype=torch.int64)
            tensors[f"batch{b}.pixel_values_fnv1a64"] = torch.tensor([fnv1a64(pixels.numpy().tobytes())], dtype=torch.int64)
            tensors[f"batch{b}.pixel_values_head"] = pixels[:, :HEAD_PATCHES].contiguous()
            tensors[f"batch{b}.image_position_ids"] = positions.contiguous()
    save_file(tensors, os.path.join(OUT, "expected.safetensors"))
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump({"generator": "tools/reference/make_batch_fixtures.py", "rows": len(ROWS), "items": len(items),
                   "batches": len(batches), "canvas_length": CANVAS, "pad_to_multiple_of": PAD_TO_MULTIPLE_OF,
                   "micro_batch": MICRO_BATCH, "max_soft_tokens": MAX_SOFT_TOKENS, "max_encoder_length": 8192,
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "chat_template": template_name},
                  f, indent=1)
        f.write("\n")
    print(f"{len(ROWS)} rows -> {len(items)} items -> {len(batches)} micro-batches", file=sys.stderr)


if __name__ == "__main__":
    main()
