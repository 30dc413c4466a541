#!/usr/bin/env python3
"""Writes the bundled demo dataset (standard library only; deterministic for a given --seed).

Two small tasks a tiny model can learn on a CPU in minutes:
  * shapes: a 48x48 PNG with two coloured shapes, one above the other or side by side, captioned
    exactly, e.g. "A blue square above a red circle.";
  * arithmetic: "What is 23 + 05?" -> "028", both numbers in 0..99 written with two digits and the
    sum with three. The fixed widths put every digit at a fixed place: with natural widths ("5",
    "28") the demo model did not learn the sum in minutes (0% exact match after 1500 steps, against
    83% with fixed widths). The 10,000 pairs are dealt out without replacement, so no pair of the
    test or validation split is in train: the test split measures addition learned, not pairs
    memorised.
Splits go to train.jsonl, validation.jsonl and test.jsonl (distinct files, never mixed) with the
images under images/, referenced by paths relative to the JSONL files.

A second task teaches the trained demo model a new skill with a LoRA adapter (docs/training.md,
"The adapter demo"): two-digit subtraction written as the additions are, "What is 87 - 23?" ->
"064" (a >= b, so the difference is in 0..99). Its pairs are dealt out without replacement too;
its train split mixes in additions and described pictures from the base train split, so that the
adapter keeps the old skills (rehearsal). They go to subtraction/{train,validation,test}.jsonl, from their own random streams,
so the base task's files do not change.

  scripts/make_demo_data.py [--out data/demo] [--seed 0]
"""
import argparse
import json
import os
import random
import struct
import zlib

SIZE = 48
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SHAPES = ("square", "circle", "triangle")
SPLITS = {"train": (600, 6000), "validation": (60, 140), "test": (60, 140)}  # (shape rows, arithmetic rows)


def png_bytes(pixels):
    """RGB rows -> a PNG file (8-bit RGB, no interlace)."""
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", SIZE, SIZE, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def inside(shape, x, y, cx, cy, r):
    if shape == "square":
        return abs(x - cx) <= r and abs(y - cy) <= r
    if shape == "circle":
        return (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    # triangle pointing up: apex (cx, cy - r), base from (cx - r, cy + r) to (cx + r, cy + r)
    return cy - r <= y <= cy + r and abs(x - cx) <= (y - (cy - r)) / 2


def render(first, second, layout):
    pixels = [[(255, 255, 255)] * SIZE for _ in range(SIZE)]
    centres = [(24, 12), (24, 36)] if layout == "above" else [(12, 24), (36, 24)]
    for (shape, colour), (cx, cy) in zip((first, second), centres):
        for y in range(SIZE):
            for x in range(SIZE):
                if inside(shape, x, y, cx, cy, 9):
                    pixels[y][x] = COLOURS[colour]
    return pixels


def shape_row(rng, image_path):
    first = (rng.choice(SHAPES), rng.choice(list(COLOURS)))
    second = (rng.choice(SHAPES), rng.choice(list(COLOURS)))
    while second == first:
        second = (rng.choice(SHAPES), rng.choice(list(COLOURS)))
    layout = rng.choice(("above", "left of"))
    caption = f"A {first[1]} {first[0]} {layout} a {second[1]} {second[0]}."
    content = [{"type": "image", "image": image_path}, {"type": "text", "text": "Describe the picture."}]
    return {"messages": [{"role": "user", "content": content}], "completion": caption}, render(first, second, layout)


def arithmetic_row(a, b):
    return {"messages": [{"role": "user", "content": f"What is {a:02d} + {b:02d}?"}], "completion": f"{a + b:03d}"}


SUBTRACTION_SPLITS = {"train": 3000, "validation": 100, "test": 200}
REHEARSED_ADDITIONS = 1000  # base-train additions mixed into the adapter's train split
REHEARSED_PICTURES = 300  # and base-train picture rows (their images stay in images/)


def subtraction_row(a, b):
    return {"messages": [{"role": "user", "content": f"What is {a:02d} - {b:02d}?"}], "completion": f"{a - b:03d}"}


def write_rows(path, rows):
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_subtraction(out_dir, seed, base_train_additions, base_train_pictures):
    pairs = [(a, b) for a in range(100) for b in range(a + 1)]
    random.Random(seed + 2).shuffle(pairs)
    rng = random.Random(seed + 3)
    os.makedirs(out_dir, exist_ok=True)
    for split, count in SUBTRACTION_SPLITS.items():
        rows = [subtraction_row(*pairs.pop()) for _ in range(count)]
        if split == "train":
            rows += rng.sample(base_train_additions, REHEARSED_ADDITIONS)
            for picture in rng.sample(base_train_pictures, REHEARSED_PICTURES):
                row = json.loads(json.dumps(picture))
                row["messages"][0]["content"][0]["image"] = "../" + picture["messages"][0]["content"][0]["image"]
                rows.append(row)
            rng.shuffle(rows)
        write_rows(os.path.join(out_dir, f"{split}.jsonl"), rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "demo"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    pairs = [(a, b) for a in range(100) for b in range(100)]
    random.Random(args.seed + 1).shuffle(pairs)
    os.makedirs(os.path.join(args.out, "images"), exist_ok=True)
    for split, (shape_rows, arithmetic_rows) in SPLITS.items():
        rows = []
        for i in range(shape_rows):
            relative = f"images/{split}-{i:04d}.png"
            row, pixels = shape_row(rng, relative)
            with open(os.path.join(args.out, relative), "wb") as image:
                image.write(png_bytes(pixels))
            rows.append(row)
        additions = [arithmetic_row(*pairs.pop()) for _ in range(arithmetic_rows)]
        if split == "train":
            train_additions, train_pictures = additions, list(rows)
        rows += additions
        rng.shuffle(rows)
        write_rows(os.path.join(args.out, f"{split}.jsonl"), rows)
    write_subtraction(os.path.join(args.out, "subtraction"), args.seed, train_additions, train_pictures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
