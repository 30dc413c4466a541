#!/usr/bin/env python3
"""Reference data for the frozen low-precision base (docs/training.md, "Frozen low-precision base"): weights,
their int8 and NF4 codes and scales, and the dequantized values, which dgemma's quantizers and its dequantize
kernel must reproduce bit for bit (test/unit/quant/QuantizeFixtureTest.cpp).

NF4 is bitsandbytes' own: bitsandbytes.functional.quantize_4bit / dequantize_4bit with quant_type="nf4",
blocksize=64 and no double quantization, on the CPU. int8 is dgemma's symmetric per-row format, written here in
torch: scale = amax(|row|) / 127, code = torch.round(w / scale) (ties to even) clamped to [-127, 127], a zero row
taking scale 0 and codes 0; decoded as code * scale in f32.

    pip install torch==2.15.0 bitsandbytes==0.50.2 packaging       # see test/fixtures/quant/versions.json
    python3 tools/reference/make_quant_fixtures.py                 # rewrite test/fixtures/quant/quant.safetensors
    python3 tools/reference/make_quant_fixtures.py --check         # regenerate in memory, byte-compare, exit 1 on a difference

The file holds, per case NAME: NAME.input (f32 or bf16, the logical shape), NAME.codes (nf4: u8, the last dimension
halved, the even element in the high nibble; int8: i8), NAME.scales (f32: nf4 one absmax per 64 elements of a row,
int8 one scale per row), NAME.dequant_f32 and NAME.dequant_bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
import bitsandbytes  # noqa: E402
import bitsandbytes.functional as bnb  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = REPO_ROOT / "test/fixtures/quant"
SEED = 20261207
NF4_TABLE = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
             -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
             0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
             0.7229568362236023, 1.0]


def nf4_edge_rows() -> torch.Tensor:
    """One row of 128: a block holding 1.0 (absmax 1, so the scaled values are the values) with every f32
    midpoint between table values exactly (the tie rule), its f32 neighbours and the table values themselves,
    and a block of zeros."""
    table = torch.tensor(NF4_TABLE, dtype=torch.float32)
    mids = (table[:-1] + table[1:]) / 2
    above = torch.nextafter(mids, torch.full_like(mids, 2.0))
    below = torch.nextafter(mids, torch.full_like(mids, -2.0))
    block = torch.cat([torch.tensor([1.0]), mids, above, below, table, torch.tensor([-0.0, 0.5])])
    assert block.numel() == 64
    return torch.cat([block, torch.zeros(64)]).reshape(1, 128)


def int8_edge_rows() -> torch.Tensor:
    """Rows of 8: absmax 127 (scale exactly 1) with halves (ties to even) and a zero row."""
    return torch.tensor([[127.0, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 1.49],
                         [0.0] * 8])


def cases(generator: torch.Generator) -> dict[str, tuple[str, torch.Tensor]]:
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float32)  # noqa: E731
    return {
        "nf4_f32": ("nf4", torch.cat([randn(3, 128) * 0.05, nf4_edge_rows()])),  # a linear weight [out, in]
        "nf4_bf16_experts": ("nf4", (randn(2, 3, 64) * 0.02).to(torch.bfloat16)),  # an expert weight [E, out, in]
        "int8_f32": ("int8", torch.cat([randn(3, 8) * 0.1, int8_edge_rows()])),
        "int8_bf16_experts": ("int8", (randn(2, 3, 40) * 0.02).to(torch.bfloat16)),
    }


def quantize_nf4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    packed, state = bnb.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=False)
    shape = list(weight.shape)
    out = {"codes": packed.reshape(shape[:-1] + [shape[-1] // 2]).clone(),
           "scales": state.absmax.reshape(shape[:-1] + [shape[-1] // 64]).clone()}
    for name, dtype in (("dequant_f32", torch.float32), ("dequant_bf16", torch.bfloat16)):
        state.dtype = dtype
        out[name] = bnb.dequantize_4bit(packed, state).reshape(shape).clone()
        assert out[name].dtype == dtype
    return out


def quantize_int8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    wide = weight.float()
    scale = wide.abs().amax(dim=-1) / 127
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = torch.where(scale[..., None] == 0, torch.zeros_like(wide), torch.round(wide / safe[..., None]))
    codes = codes.clamp(-127, 127).to(torch.int8)
    decoded = codes.float() * scale[..., None]
    return {"codes": codes, "scales": scale, "dequant_f32": decoded, "dequant_bf16": decoded.to(torch.bfloat16)}


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.uint8: "U8", torch.int8: "I8"}


def safetensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """The safetensors layout (an 8-byte header length, the JSON header, the data), sorted by name, so the
    file needs no safetensors package and is byte-stable."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        data = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def build() -> tuple[bytes, bytes]:
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    tensors = {}
    for name, (fmt, weight) in cases(generator).items():
        tensors[f"{name}.input"] = weight
        for part, value in (quantize_nf4(weight) if fmt == "nf4" else quantize_int8(weight)).items():
            tensors[f"{name}.{part}"] = value
    versions = {"command": "python3 tools/reference/make_quant_fixtures.py", "seed": SEED,
                "torch": torch.__version__, "bitsandbytes": bitsandbytes.__version__,
                "python": ".".join(map(str, sys.version_info[:3]))}
    return safetensors_bytes(tensors), (json.dumps(versions, indent=2, sort_keys=True) + "\n").encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args()
    data, versions = build()
    target = OUT_DIR / "quant.safetensors"
    if args.check:
        same = target.read_bytes() == data
        print(f"{target.relative_to(REPO_ROOT)}: {'identical' if same else 'DIFFERS'}")
        return 0 if same else 1
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    (OUT_DIR / "versions.json").write_bytes(versions)
    print(f"wrote {target.relative_to(REPO_ROOT)} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
