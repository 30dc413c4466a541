#!/usr/bin/env python3
"""Writes a random batch for the built-in graph, or summarises safetensors files (standard library only).

  make_demo_batch.py OUT.safetensors --batch B --length S --hidden H --vocab V
  make_demo_batch.py --summarize FILE.safetensors [...]
"""
import argparse
import json
import math
import random
import struct
import sys


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as stream:
        size = struct.unpack("<Q", stream.read(8))[0]
        header = json.loads(stream.read(size))
        data = stream.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] != "F32":
            continue
        begin, end = entry["data_offsets"]
        tensors[name] = (entry["shape"], struct.unpack(f"<{(end - begin) // 4}f", data[begin:end]))
    return tensors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--summarize", action="store_true")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.summarize:
        for path in args.paths:
            for name, (shape, values) in sorted(read_safetensors(path).items()):
                norm = math.sqrt(sum(v * v for v in values))
                print(f"  {path.rsplit('/', 1)[-1]}: {name} {shape} l2={norm:.6g} first={values[0]:.6g}")
        return 0
    rng = random.Random(args.seed)
    rows = args.batch * args.length
    x = [rng.gauss(0.0, 1.0) for _ in range(rows * args.hidden)]
    target = [0.0] * (rows * args.vocab)
    for row in range(rows):
        target[row * args.vocab + rng.randrange(args.vocab)] = 1.0
    write_safetensors(args.paths[0], {
        "x": ([args.batch, args.length, args.hidden], x),
        "target": ([args.batch, args.length, args.vocab], target),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
