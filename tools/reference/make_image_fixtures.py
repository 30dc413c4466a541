#!/usr/bin/env python3
"""Generates the image fixtures of runtime/data/image (test/fixtures/images/).

Writes a few small synthetic images (PNG RGB, PNG gray, PNG RGBA, JPEG, a very wide PNG, a 1-pixel-high
PNG) and expected.safetensors with, per image `NAME` (file stem):

  NAME.rgb                 uint8 [H, W, 3]  PIL's Image.open(path).convert("RGB")
  NAME.opts                int64 [1]        max_soft_tokens given to the processor
  NAME.num_soft_tokens     int64 [1]        HF num_soft_tokens_per_image
  NAME.image_position_ids  int64 [max_patches, 2]  HF image_position_ids (padding included)
  NAME.levels              uint8 [ceil(n_real / STRIDE), 768]  HF pixel_values * 255 of the real
                           patches 0, STRIDE, 2*STRIDE, ... (the script asserts these are exact levels)
  NAME.pixel_values_head   float32 [HEAD, 768]  HF pixel_values of the first HEAD patches, unchanged

Full pixel_values ([max_patches, 768] float32) would be megabytes per image; HF's values are exactly
uint8 levels times float32(1/255) (asserted below for every value), so the levels carry them losslessly.
The processor is given PIL's convert("RGB") of each file (so the RGBA fixture has its alpha dropped as
docs/data.md, "JSONL rows" specifies; HF's own convert_to_rgb would composite transparency onto white).

The reference is HF transformers' default Gemma4ImageProcessor (torchvision backend): tvF.resize with
BICUBIC and antialias=True on the uint8 CHW tensor, which on CPU runs torch's native uint8 separable
antialiased kernel, then `image * (1/255)`.

Run (needs torch, torchvision, transformers, pillow, safetensors):
  python tools/reference/make_image_fixtures.py test/fixtures/images
"""
import os
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

STRIDE = 4
HEAD = 16


def synth(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127 + 120 * np.sin(x / max(w, 1) * 6.0 + seed)
    g = 127 + 120 * np.cos(y / max(h, 1) * 5.0 - seed)
    b = (x * 7 + y * 13) % 256
    img = np.stack([r, g, b], axis=-1) + rng.integers(-30, 31, size=(h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def make_images(out):
    specs = []
    rgb = synth(37, 53, 1)
    Image.fromarray(rgb, "RGB").save(os.path.join(out, "rgb.png"))
    specs.append(("rgb", "rgb.png", 70))
    gray = synth(61, 29, 2)[:, :, 0]
    Image.fromarray(gray, "L").save(os.path.join(out, "gray.png"))
    specs.append(("gray", "gray.png", 70))
    rgba = np.concatenate([synth(40, 40, 3), synth(40, 40, 4)[:, :, :1]], axis=-1)
    Image.fromarray(rgba, "RGBA").save(os.path.join(out, "rgba.png"))
    specs.append(("rgba", "rgba.png", 70))
    Image.fromarray(synth(45, 60, 5), "RGB").save(os.path.join(out, "photo.jpg"), quality=90)
    specs.append(("photo", "photo.jpg", 70))
    Image.fromarray(synth(9, 700, 6), "RGB").save(os.path.join(out, "wide.png"))
    specs.append(("wide", "wide.png", 280))
    Image.fromarray(synth(1, 150, 7), "RGB").save(os.path.join(out, "tiny.png"))
    specs.append(("tiny", "tiny.png", 70))
    return specs


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "test/fixtures/images"
    os.makedirs(out, exist_ok=True)
    specs = make_images(out)
    inv = np.float32(1.0 / 255.0)
    tensors = {}
    for name, fname, soft in specs:
        pil = Image.open(os.path.join(out, fname))
        rgb = np.asarray(pil.convert("RGB"))
        proc = Gemma4ImageProcessor(max_soft_tokens=soft)
        # The processor gets PIL's RGB conversion (alpha dropped: docs/data.md, "JSONL rows"). Given the RGBA image itself,
        # HF's convert_to_rgb would composite it onto white instead: a known difference from the spec.
        res = proc(images=[pil.convert("RGB")], return_tensors="pt")
        pv = res["pixel_values"][0].numpy()
        pos = res["image_position_ids"][0].numpy().astype(np.int64)
        n = int(res["num_soft_tokens_per_image"][0])
        n_real = int((pos[:, 0] >= 0).sum())
        assert pv.dtype == np.float32 and pv.shape == (soft * 9, 768), pv.shape
        levels = np.rint(pv.astype(np.float64) * 255.0)
        assert levels.min() >= 0 and levels.max() <= 255
        recon = levels.astype(np.uint8).astype(np.float32) * inv
        assert np.array_equal(recon, pv), f"{name}: HF values are not uint8 levels * float32(1/255)"
        assert not pv[n_real:].any()
        tensors[f"{name}.rgb"] = torch.from_numpy(np.ascontiguousarray(rgb))
        tensors[f"{name}.opts"] = torch.tensor([soft], dtype=torch.int64)
        tensors[f"{name}.num_soft_tokens"] = torch.tensor([n], dtype=torch.int64)
        tensors[f"{name}.image_position_ids"] = torch.from_numpy(np.ascontiguousarray(pos))
        tensors[f"{name}.levels"] = torch.from_numpy(np.ascontiguousarray(levels[:n_real:STRIDE].astype(np.uint8)))
        tensors[f"{name}.pixel_values_head"] = torch.from_numpy(np.ascontiguousarray(pv[:HEAD]))
        print(f"{name}: {pil.mode} {pil.size[1]}x{pil.size[0]} -> {n_real} patches, {n} soft tokens")
    save_file(tensors, os.path.join(out, "expected.safetensors"),
              metadata={"stride": str(STRIDE), "head": str(HEAD),
                        "source": "transformers Gemma4ImageProcessor (torchvision backend), "
                                  "torch " + torch.__version__})
    with open(os.path.join(out, "not_an_image.txt"), "w") as f:
        f.write("this is a text file, not an image\n")
    png = open(os.path.join(out, "rgb.png"), "rb").read()
    with open(os.path.join(out, "truncated.png"), "wb") as f:
        f.write(png[: len(png) // 2])


if __name__ == "__main__":
    main()
