#!/usr/bin/env python3
"""Prints one line per f32 tensor of safetensors files: name, shape, L2 norm, first value (standard library only).

  summarize_safetensors.py FILE.safetensors [...]
"""
import json
import math
import struct
import sys


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


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for path in paths:
        for name, (shape, values) in sorted(read_safetensors(path).items()):
            norm = math.sqrt(sum(v * v for v in values))
            print(f"  {path.rsplit('/', 1)[-1]}: {name} {shape} l2={norm:.6g} first={values[0]:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
