#!/usr/bin/env python3
"""Generate DiffusionGemma vision parity fixtures (images, vision tower, encoder, decoder) from HF transformers.

Reference-data generation only: this script is not run by CI. It builds one tiny random DiffusionGemma model WITH a
tiny Gemma 4 vision tower (the text part is models/diffusion_gemma/configs/tiny-cpu.json), feeds it real images
processed by transformers' Gemma4ImageProcessor, runs it in fp32 with eager attention on the CPU, and writes
test/fixtures/diffusion_gemma_vision/<case>/:

    config.json              HF config as written by save_pretrained (with the tiny vision_config)
    model.safetensors        every tensor of the HF model (text, vision tower, projector), HF names, fp32
    batch.safetensors        inputs: prompt ids with expanded image placeholders, mm_token_type_ids, pixel_values,
                             image_position_ids, canvas, self-conditioning (names: tools/reference/README.md)
    expected.safetensors     forward cases: vision features, merged encoder input, encoder hidden/K/V and logits,
                             with the image-bidirectional overlay on (as generate() builds the mask) and off (`_causal`,
                             what HF's forward() computes without mm_token_type_ids)
    <objective>.safetensors  training case: loss terms and float64 gradients of every parameter (vision included)
    synthetic.png            the non-square synthetic image (cases that use it)
    meta.json                seeds, image sources, shapes, the measured check values

Besides writing, the script checks its own outputs (tools/reference/README.md, "Vision fixtures"):
  * an independent re-implementation of the vision tower and projector of issue 18 (2-D RoPE: docs/model.md,
    "Rotary embedding"), the merge and the encoder overlay (it reads only config.json, model.safetensors and the
    batch, and uses the image-contract host inputs image_pool_slot / image_token_index / image_segment_ids) agrees
    with HF;
  * reloading the written fixture with from_pretrained and rerunning reproduces expected.safetensors bit for bit;
  * HF's fp32 outputs are close to the same math in fp64, the overlay changes the image positions (and only from the
    first image token on), and the router top-k margin is at least 1e-4 on every token that matters;
  * training: a central finite-difference check of the float64 gradient, and float32-vs-float64 gaps.

Usage (from anywhere):
    python3 tools/reference/make_vision_fixtures.py             # (re)write all cases
    python3 tools/reference/make_vision_fixtures.py --check     # regenerate in a temp dir, compare bytes
    python3 tools/reference/make_vision_fixtures.py [--out-dir DIR] [--quiet]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import filecmp
import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU only, even where a GPU exists
# Same reproducibility settings as make_diffusion_gemma_fixtures.py (see tools/reference/README.md, "Determinism").
os.environ.setdefault("MKL_CBWR", "COMPATIBLE,STRICT")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DynamicCache  # noqa: E402
from transformers.models.gemma4 import modeling_gemma4 as hf_g4  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_diffusion_gemma_fixtures as mdg  # noqa: E402  (determinism, eager checks, recording cache, spec_forward)
import make_training_fixtures as mtf  # noqa: E402  (float64 islands, the objective's loss terms)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("test/fixtures/diffusion_gemma_vision")
TINY_CPU_CONFIG = Path("models/diffusion_gemma/configs/tiny-cpu.json")
DEMO_IMAGES = Path("data/demo/images")
GENERATOR = "tools/reference/make_vision_fixtures.py"
REL_TOL = 1e-5  # the parity bound of the C++ tests: max|d| / max|ref|
SPEC_TOL = 2e-6  # the independent re-implementation vs HF (both fp32)
MIN_ROUTER_GAP = 1e-4

# The tiny vision tower of issue 18. T = 70 is the smallest max_soft_tokens the HF processor accepts
# ({70, 140, 280, 560, 1120}); with p = 4 and k = 2 an image gets N_p = T k^2 = 280 patch rows of 3 p^2 = 48 values.
VISION_CONFIG = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=32,
    patch_size=4,
    pooling_kernel_size=2,
    position_embedding_size=64,
    standardize=True,
)
SOFT_TOKENS = 70
TOP_CONFIG = dict(
    image_token_id=4, boi_token_id=5, eoi_token_id=6, canvas_length=16, vision_soft_tokens_per_image=SOFT_TOKENS
)
WEIGHT_SEED = 4000  # first weight seed tried (searched for a router margin, see write_case)
SYNTHETIC = dict(
    height=24, width=72, seed=11
)  # non-square: 32 x 112 after the resize, 224 of 280 patches, 56 soft tokens
SC_MASK = [1.0, 0.0]
SC_LOGIT_SCALE = 4.0

# Per case: the images of each example (demo file names or "synthetic") and the text-token counts around them
# (I + 1 chunks for I images: before the first image, between images, after the last).
CASES: dict[str, dict] = {
    "one_image": dict(
        description="Batch 2, one image per example: a 48x48 demo PNG (upscaled to 64x64: 256 patches, 64 soft tokens) "
        "and the 24x72 synthetic image (32x112: 224 patches, 56 soft tokens); both have padding patches.",
        images=[["test-0000.png"], ["synthetic"]],
        text=[[3, 2], [1, 5]],
        batch_seed=4100,
    ),
    "two_images": dict(
        description="Batch 2, two images per example (two image runs per prompt, separated by text): demo PNGs and the "
        "synthetic image, so the examples have different soft-token counts (128 and 120).",
        images=[["test-0001.png", "test-0002.png"], ["synthetic", "test-0003.png"]],
        text=[[2, 1, 3], [1, 2, 1]],
        batch_seed=4200,
        # To keep all fixtures near 2 MB, this case does not write what one_image already pins down per layer (the
        # per-patch tower output and the K/V); its encoder_hidden and logits still cover the two-run overlay.
        not_written=("vision_tower_hidden", "encoder_k_untrimmed", "encoder_v_untrimmed", "encoder_hidden_causal"),
    ),
}
# Computed and checked against the re-implementation in every case, but not written (size): the overlay-off K/V.
NOT_WRITTEN = ("encoder_k_untrimmed_causal.", "encoder_v_untrimmed_causal.")


def written(expected: dict[str, torch.Tensor], case: dict) -> dict[str, torch.Tensor]:
    skip = NOT_WRITTEN + tuple(case.get("not_written", ()))
    return {k: v.contiguous() for k, v in expected.items() if not k.startswith(skip)}


TRAIN_CASE = "train_one_image"
TRAIN_SOURCE = "one_image"  # the training case uses this case's prompts and images
TRAIN_OBJECTIVE = mtf.Case("reweighted-loo-ce", True, 1.0)
TRAIN_T = [0.25, 0.5]
TRAIN_NOISE_SEED = 4300
FD_SEED = 4400


# ------------------------------------------------------------------------------------------------------------------
# Config, model, weights
# ------------------------------------------------------------------------------------------------------------------


def build_config() -> DiffusionGemmaConfig:
    tiny = json.loads((REPO_ROOT / TINY_CPU_CONFIG).read_text())
    text = {k: v for k, v in tiny["text_config"].items() if k != "model_type"}
    for key in ("image_token_id", "boi_token_id", "eoi_token_id", "canvas_length"):
        assert tiny[key] == TOP_CONFIG[key], key
    return DiffusionGemmaConfig(text_config=text, vision_config=dict(VISION_CONFIG), **TOP_CONFIG)


def build_model(cfg: DiffusionGemmaConfig) -> DiffusionGemmaForBlockDiffusion:
    model = mdg.build_model(cfg)  # eager attention and eager experts everywhere (checked)
    assert model.model.encoder.vision_tower.config._attn_implementation == "eager"
    return model


def randomize_weights(model: DiffusionGemmaForBlockDiffusion, seed: int) -> None:
    """The text weights as in make_diffusion_gemma_fixtures.py; the vision tower and projector then get their own draws
    from a second generator: linears N(0, 1/fan_in), position tables N(0, 1), norms U(0.5, 1.5) (q/k norms U(0.5, 1),
    scale-1 attention over 8-dim heads stays well conditioned), std_bias N(0, 0.5) and std_scale U(0.5, 2), so that
    standardize is far from the identity."""
    mdg.randomize_weights(model, seed)
    g = torch.Generator().manual_seed(seed + 100_000)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    vision = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(vision):
            if not name.startswith(mdg.VISION_PREFIXES):
                continue
            p = vision[name]
            if name.endswith("position_embedding_table"):
                p.copy_(normal(p.shape, 1.0))
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(uniform(p.shape, 0.5, 1.0))
            elif name.endswith("norm.weight"):
                p.copy_(uniform(p.shape, 0.5, 1.5))
            elif name.endswith(".weight") and p.dim() == 2:
                p.copy_(normal(p.shape, p.shape[1] ** -0.5))
            else:
                raise RuntimeError(f"no init rule for vision parameter {name} {tuple(p.shape)}")
        tower = model.model.encoder.vision_tower
        tower.std_bias.copy_(normal(tower.std_bias.shape, 0.5))
        tower.std_scale.copy_(uniform(tower.std_scale.shape, 0.5, 2.0))


# ------------------------------------------------------------------------------------------------------------------
# Images and batch
# ------------------------------------------------------------------------------------------------------------------


def synthetic_image() -> np.ndarray:
    """A smooth-plus-noise RGB test card (the recipe of make_image_fixtures.py), h x w x 3 uint8."""
    h, w, seed = SYNTHETIC["height"], SYNTHETIC["width"], SYNTHETIC["seed"]
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127 + 120 * np.sin(x / w * 6.0 + seed)
    gch = 127 + 120 * np.cos(y / h * 5.0 - seed)
    b = (x * 7 + y * 13) % 256
    img = np.stack([r, gch, b], axis=-1) + rng.integers(-30, 31, size=(h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def image_processor():
    """transformers' default Gemma4ImageProcessor (the torchvision backend, what AutoImageProcessor gives). Imported
    here so that other scripts can import this module's config constants without torchvision."""
    try:
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
    except ImportError as e:
        sys.exit(
            f"make_vision_fixtures.py needs torchvision for transformers' Gemma4ImageProcessor ({e}); "
            "see tools/reference/README.md"
        )
    vc = VISION_CONFIG
    return Gemma4ImageProcessor(
        patch_size=vc["patch_size"], pooling_kernel_size=vc["pooling_kernel_size"], max_soft_tokens=SOFT_TOKENS
    )


def load_images(names: list[str], synthetic_png: Path | None) -> list[Image.Image]:
    out = []
    for n in names:
        path = synthetic_png if n == "synthetic" else REPO_ROOT / DEMO_IMAGES / n
        out.append(Image.open(path).convert("RGB"))
    return out


def make_batch(case: dict, cfg, d: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Prompts with the image placeholders expanded as Gemma4Processor.replace_image_token does
    (<boi> + n x <image> + <eoi>, n = the image's num_soft_tokens), left-padded; pixel_values and image_position_ids
    from Gemma4ImageProcessor; mm_token_type_ids as ProcessorMixin.create_mm_token_type_ids (1 on image ids)."""
    tc = cfg.text_config
    V, L = tc.vocab_size, cfg.canvas_length
    pad, bos = tc.pad_token_id, tc.bos_token_id
    img_id, boi, eoi = cfg.image_token_id, cfg.boi_token_id, cfg.eoi_token_id
    specials = {
        pad,
        bos,
        img_id,
        boi,
        eoi,
        *([tc.eos_token_id] if isinstance(tc.eos_token_id, int) else tc.eos_token_id),
    }
    ordinary = torch.tensor([i for i in range(V) if i not in specials], dtype=torch.int64)
    g = torch.Generator().manual_seed(case["batch_seed"])

    synthetic_png = None
    if any("synthetic" in row for row in case["images"]):
        synthetic_png = d / "synthetic.png"
        Image.fromarray(synthetic_image(), "RGB").save(synthetic_png)
    flat = [n for row in case["images"] for n in row]
    I = len(case["images"][0])
    assert all(len(row) == I for row in case["images"]), "every example has exactly I images"
    res = image_processor()(images=load_images(flat, synthetic_png), return_tensors="pt")
    pixel_values = res["pixel_values"].contiguous()
    image_position_ids = res["image_position_ids"].to(torch.int64).contiguous()
    soft = [int(n) for n in res["num_soft_tokens_per_image"]]
    N, Np, Dp = pixel_values.shape
    vc = VISION_CONFIG
    assert (N, Np, Dp) == (len(flat), SOFT_TOKENS * vc["pooling_kernel_size"] ** 2, 3 * vc["patch_size"] ** 2)
    assert pixel_values.dtype == torch.float32

    rows = []
    for b, (names, chunks) in enumerate(zip(case["images"], case["text"])):
        assert len(chunks) == I + 1
        seq = [bos] + ordinary[torch.randint(len(ordinary), (chunks[0],), generator=g)].tolist()
        for i in range(I):
            seq += [boi] + [img_id] * soft[b * I + i] + [eoi]
            seq += ordinary[torch.randint(len(ordinary), (chunks[i + 1],), generator=g)].tolist()
        rows.append(seq)
    B, P = len(rows), max(len(r) for r in rows)
    input_ids = torch.full((B, P), pad, dtype=torch.int64)
    attention_mask = torch.zeros((B, P), dtype=torch.int64)
    for b, r in enumerate(rows):
        input_ids[b, P - len(r) :] = torch.tensor(r)
        attention_mask[b, P - len(r) :] = 1
    mm_token_type_ids = (input_ids == img_id).to(torch.int64)
    position_ids = torch.arange(P, dtype=torch.int64).unsqueeze(0).expand(B, P).contiguous()
    noisy_canvas_ids = torch.randint(V, (B, L), generator=g, dtype=torch.int64)
    sc_logits = torch.randn((B, L, V), generator=g, dtype=torch.float32) * SC_LOGIT_SCALE
    batch = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        mm_token_type_ids=mm_token_type_ids,
        pixel_values=pixel_values,
        image_position_ids=image_position_ids,
        noisy_canvas_ids=noisy_canvas_ids,
        self_conditioning_logits=sc_logits,
        self_conditioning_mask=torch.tensor(SC_MASK[:B], dtype=torch.float32),
    )
    info = dict(
        images=[
            dict(
                example=n // I,
                source=(f"{DEMO_IMAGES}/{name}" if name != "synthetic" else "synthetic.png (this directory)"),
                size_hw=list(load_images([name], synthetic_png)[0].size[::-1]),
                valid_patches=int((image_position_ids[n, :, 0] >= 0).sum()),
                patch_grid_wh=[int(image_position_ids[n, :, 0].max()) + 1, int(image_position_ids[n, :, 1].max()) + 1],
                soft_tokens=soft[n],
            )
            for n, name in enumerate(flat)
        ],
        images_per_example=I,
        batch_size=B,
        prompt_width=P,
        prompt_lengths=attention_mask.sum(1).tolist(),
        image_tokens_per_example=mm_token_type_ids.sum(1).tolist(),
        canvas_length=L,
        batch_seed=case["batch_seed"],
        image_processor=dict(
            cls="transformers.models.gemma4.image_processing_gemma4.Gemma4ImageProcessor (torchvision backend)",
            patch_size=vc["patch_size"],
            pooling_kernel_size=vc["pooling_kernel_size"],
            max_soft_tokens=SOFT_TOKENS,
            input="PIL Image.open(path).convert('RGB')",
        ),
    )
    return batch, info


def derive_image_plan_inputs(batch, images_per_example: int, k: int, T: int) -> dict[str, torch.Tensor]:
    """The host-derived inputs of the image contract (runtime/data/batch/ImageInputs): image_pool_slot [N, N_p],
    image_token_index [B, P] and image_segment_ids [B, P], computed here from their definition."""
    pos, mm = batch["image_position_ids"], batch["mm_token_type_ids"]
    N, Np, _ = pos.shape
    B, P = mm.shape
    I = images_per_example
    slot = torch.full((N, Np), N * T, dtype=torch.int64)
    ranks_per_image = []
    for n in range(N):
        valid = ~((pos[n, :, 0] == -1) & (pos[n, :, 1] == -1))
        x, y = pos[n, :, 0], pos[n, :, 1]
        max_x = int(x[valid].max()) + 1
        bucket = torch.div(x, k, rounding_mode="floor") + (max_x // k) * torch.div(y, k, rounding_mode="floor")
        occupied = torch.unique(bucket[valid])  # sorted ascending
        assert len(occupied) <= T
        rank = torch.searchsorted(occupied, bucket)
        slot[n, valid] = n * T + rank[valid]
        ranks_per_image.append(len(occupied))
    token_index = torch.full((B, P), N * T, dtype=torch.int64)
    segment_ids = torch.zeros((B, P), dtype=torch.int64)
    for b in range(B):
        rows = [n * T + r for n in range(b * I, (b + 1) * I) for r in range(ranks_per_image[n])]
        where = (mm[b] == 1).nonzero().flatten()
        assert len(where) == len(
            rows
        ), f"example {b}: {len(where)} image tokens but the images give {len(rows)} pooled tokens"
        token_index[b, where] = torch.tensor(rows, dtype=torch.int64)
        is_img = mm[b] == 1
        starts = is_img & ~torch.cat([torch.zeros(1, dtype=torch.bool), is_img[:-1]])
        segment_ids[b] = torch.where(is_img, torch.cumsum(starts.to(torch.int64), 0), 0)
    return dict(image_pool_slot=slot, image_token_index=token_index, image_segment_ids=segment_ids)


# ------------------------------------------------------------------------------------------------------------------
# HF runs
# ------------------------------------------------------------------------------------------------------------------


class VisionProbe:
    """Captures the vision tower's per-patch output, the pooled + standardized tokens, the projected features and the
    merged encoder input (the inputs_embeds the encoder text stack receives)."""

    def __init__(self, model):
        enc = model.model.encoder
        self.seen: dict[str, list[torch.Tensor]] = collections.defaultdict(list)
        self.handles = [
            enc.vision_tower.encoder.register_forward_hook(
                lambda m, a, o: self.seen["tower"].append(o.last_hidden_state)
            ),
            enc.vision_tower.register_forward_hook(lambda m, a, o: self.seen["pooled"].append(o.last_hidden_state)),
            enc.embed_vision.register_forward_hook(lambda m, a, o: self.seen["features"].append(o)),
            enc.language_model.register_forward_pre_hook(
                lambda m, a, kw: self.seen["inputs_embeds"].append(kw["inputs_embeds"]), with_kwargs=True
            ),
        ]

    def last(self, key: str) -> torch.Tensor:
        return self.seen[key][-1]

    def remove(self):
        for h in self.handles:
            h.remove()


def encode(model, batch, *, overlay: bool, cache, ids=None, attention_mask=None, mm=None):
    """One encoder call with the images. overlay=True builds the mask dictionary as generate() does
    (DiffusionGemmaGenerationMixin._prepare_encoder_inputs: create_masks_for_generate with mm_token_type_ids) and passes
    it; overlay=False passes the 2-D mask and no mm_token_type_ids, which is what HF's forward() does."""
    ids = batch["input_ids"] if ids is None else ids
    am = batch["attention_mask"] if attention_mask is None else attention_mask
    mm = batch["mm_token_type_ids"] if mm is None else mm
    B, S = ids.shape
    position_ids = torch.arange(S, dtype=torch.int64).unsqueeze(0)
    dtype = model.dtype
    kwargs = dict(
        input_ids=ids,
        cache=cache,
        position_ids=position_ids,
        pixel_values=batch["pixel_values"].to(dtype),
        image_position_ids=batch["image_position_ids"],
    )
    if overlay:
        mask = model.model.encoder.create_masks_for_generate(
            config=model.config,
            inputs_embeds=torch.empty((B, S, 0), dtype=dtype),  # only batch, length, dtype and device are read
            attention_mask=am.bool(),
            cache=cache,
            position_ids=position_ids,
            mm_token_type_ids=mm,
        )
        assert isinstance(mask, dict)
        return model.model.encoder(attention_mask=mask, mm_token_type_ids=mm, **kwargs)
    return model.model.encoder(attention_mask=am, **kwargs)


def decoder_logits(model, batch, cache, *, sc_logits=None, sc_mask=None) -> torch.Tensor:
    """The decoder on the encoder's cache, with the decoder mask generate() passes; lm_head and the soft-cap applied
    here so that float64 stays float64 (bit-identical to HF's .logits in float32, checked)."""
    am = batch["attention_mask"]
    L = batch["noisy_canvas_ids"].shape[1]
    out = model.model(
        input_ids=None,
        cache=cache,
        decoder_input_ids=batch["noisy_canvas_ids"],
        decoder_attention_mask=F.pad(am.bool(), (0, L), value=True),
        self_conditioning_logits=sc_logits,
        self_conditioning_mask=sc_mask,
    )
    return mtf.softcap(model.lm_head(out.last_hidden_state), model.final_logit_softcapping)


def run_reference(model, cfg, batch) -> tuple[dict[str, torch.Tensor], dict]:
    tc = cfg.text_config
    B, P = batch["input_ids"].shape
    nl = tc.num_hidden_layers
    sc, scm = batch["self_conditioning_logits"], batch["self_conditioning_mask"].bool()
    expected: dict[str, torch.Tensor] = {}
    rec = mdg.RouterRecorder(model)
    probe = VisionProbe(model)
    gaps = []
    for overlay, suffix in ((True, ""), (False, "_causal")):
        cache = mdg.RecordingCache(config=tc)
        with torch.no_grad():
            enc = encode(model, batch, overlay=overlay, cache=cache)
            out = model(
                input_ids=None,
                cache=cache,
                decoder_input_ids=batch["noisy_canvas_ids"],
                decoder_attention_mask=F.pad(
                    batch["attention_mask"].bool(), (0, batch["noisy_canvas_ids"].shape[1]), value=True
                ),
                self_conditioning_logits=sc,
                self_conditioning_mask=scm,
            )
        if overlay:
            expected["vision_tower_hidden"] = probe.last("tower").detach().clone()
            expected["vision_pooled"] = probe.last("pooled").detach().clone()
            expected["vision_features"] = probe.last("features").detach().clone()
            expected["inputs_embeds"] = probe.last("inputs_embeds").detach().clone()
        else:  # the vision tower and the merge do not depend on the mask
            assert torch.equal(probe.last("features"), expected["vision_features"])
            assert torch.equal(probe.last("inputs_embeds"), expected["inputs_embeds"])
        expected[f"encoder_hidden{suffix}"] = enc.last_hidden_state.detach().clone()
        for i in range(nl):
            layer = cache.layers[i]
            kf, vf = cache.recorded[i]
            S = layer.keys.shape[2]
            assert S == (min(P, tc.sliding_window - 1) if tc.layer_types[i] == "sliding_attention" else P), (i, S)
            assert torch.equal(layer.keys, kf[:, :, P - S :]) and torch.equal(layer.values, vf[:, :, P - S :])
            # Only the untrimmed K/V are written (the C++ parity tests compare those); the decoder reads their last S
            # slots, S = min(P, W - 1) on sliding layers and P on full layers (asserted above).
            expected[f"encoder_k_untrimmed{suffix}.{i}"] = kf.contiguous()
            expected[f"encoder_v_untrimmed{suffix}.{i}"] = vf.contiguous()
        expected[f"logits{suffix}"] = out.logits.detach().clone()
        # router margins: real prompt tokens of the encoder, every canvas token of the decoder
        valid = batch["attention_mask"].reshape(-1).bool()
        for part, _i, probs, _idx in rec.calls:
            sp = probs.sort(dim=-1, descending=True).values
            gap = sp[:, tc.top_k_experts - 1] - sp[:, tc.top_k_experts]
            gaps.append((gap[valid] if part == "encoder" else gap).min().item())
        rec.clear()
    rec.remove()
    probe.remove()
    expected["decoder_position_ids"] = (
        (torch.arange(batch["noisy_canvas_ids"].shape[1], dtype=torch.int64) + P)
        .unsqueeze(0)
        .expand(B, -1)
        .contiguous()
    )
    return expected, dict(router_min_topk_gap=min(gaps))


def hf_forward(model, batch, *, with_mm_token_type_ids: bool) -> torch.Tensor:
    """HF's own forward() with the images and 2-D masks. Without mm_token_type_ids (as HF's forward-pass tests call it)
    it builds plain causal masks; with them, transformers 5.25 builds the overlay too (see README, "Vision fixtures").
    """
    L = batch["noisy_canvas_ids"].shape[1]
    extra = dict(mm_token_type_ids=batch["mm_token_type_ids"]) if with_mm_token_type_ids else {}
    with torch.no_grad():
        out = model(
            **extra,
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=batch["pixel_values"],
            image_position_ids=batch["image_position_ids"],
            decoder_input_ids=batch["noisy_canvas_ids"],
            decoder_attention_mask=F.pad(batch["attention_mask"].bool(), (0, L), value=True),
            self_conditioning_logits=batch["self_conditioning_logits"],
            self_conditioning_mask=batch["self_conditioning_mask"].bool(),
            cache=DynamicCache(config=model.config.text_config),
        )
    return out.logits


# ------------------------------------------------------------------------------------------------------------------
# Independent implementation of the vision tower and projector (issue 18; reads config.json, model.safetensors, batch)
# ------------------------------------------------------------------------------------------------------------------


def _rotate_half_2d(x, ang_x, ang_y):
    """2-D RoPE: dims [0, d/2) rotate by the patch column's angles, [d/2, d) by its row's, each half with the
    rotate-half rule of size d/2. x [N, Np, h, d]; ang_* [N, Np, d/4]."""
    d = x.shape[-1]
    out = []
    for part, ang in ((x[..., : d // 2], ang_x), (x[..., d // 2 :], ang_y)):
        e = torch.cat([ang, ang], dim=-1)[:, :, None, :]
        h = part.shape[-1] // 2
        rot = torch.cat([-part[..., h:], part[..., :h]], dim=-1)
        out.append(part * e.cos() + rot * e.sin())
    return torch.cat(out, dim=-1)


def spec_vision(config_json: dict, w: dict, batch: dict, plan: dict, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Per-patch tower output [N, N_p, Hv], pooled + standardized slots [N T, Hv] and projected features [N T, H]
    (rows of unoccupied slots are zero before the projector and are never gathered)."""
    vc = config_json["vision_config"]
    Hv, nh, hd, eps = vc["hidden_size"], vc["num_attention_heads"], vc["head_dim"], vc.get("rms_norm_eps", 1e-6)
    k, theta = vc["pooling_kernel_size"], vc["rope_parameters"]["rope_theta"]
    T = config_json["vision_soft_tokens_per_image"]
    pre = "model.encoder.vision_tower."
    W = {key[len(pre) :]: t.to(dtype) for key, t in w.items() if key.startswith(pre)}
    pv, pos = batch["pixel_values"].to(dtype), batch["image_position_ids"]
    N, Np, _ = pv.shape
    valid = ~((pos[..., 0] == -1) & (pos[..., 1] == -1))
    px, py = pos[..., 0].clamp(min=0), pos[..., 1].clamp(min=0)
    table = W["patch_embedder.position_embedding_table"]
    x = (2.0 * (pv - 0.5)) @ W["patch_embedder.input_proj.weight"].T
    x = x + torch.where(valid[..., None], table[0][px] + table[1][py], torch.zeros((), dtype=dtype))
    half = hd // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, 2, dtype=dtype) / half))
    ang_x = pos[..., 0, None].to(dtype) * inv
    ang_y = pos[..., 1, None].to(dtype) * inv
    allowed = valid[:, None, None, :]  # bidirectional; padding patches masked as keys
    for j in range(vc["num_hidden_layers"]):
        p = f"encoder.layers.{j}."
        a = mdg._rms(x, W[p + "input_layernorm.weight"], eps)
        q = (a @ W[p + "self_attn.q_proj.linear.weight"].T).view(N, Np, nh, hd)
        kk = (a @ W[p + "self_attn.k_proj.linear.weight"].T).view(N, Np, -1, hd)
        v = (a @ W[p + "self_attn.v_proj.linear.weight"].T).view(N, Np, -1, hd)
        q = _rotate_half_2d(mdg._rms(q, W[p + "self_attn.q_norm.weight"], eps), ang_x, ang_y)
        kk = _rotate_half_2d(mdg._rms(kk, W[p + "self_attn.k_norm.weight"], eps), ang_x, ang_y)
        v = mdg._rms(v, None, eps)
        grp = nh // kk.shape[2]
        s = torch.einsum("nqhd,nkhd->nhqk", q, kk.repeat_interleave(grp, dim=2))  # scale 1
        s = s.masked_fill(~allowed, float("-inf"))
        o = torch.einsum("nhqk,nkhd->nqhd", torch.softmax(s, dim=-1), v.repeat_interleave(grp, dim=2)).reshape(
            N, Np, nh * hd
        )
        x = x + mdg._rms(o @ W[p + "self_attn.o_proj.linear.weight"].T, W[p + "post_attention_layernorm.weight"], eps)
        m = mdg._rms(x, W[p + "pre_feedforward_layernorm.weight"], eps)
        m = (
            F.gelu(m @ W[p + "mlp.gate_proj.linear.weight"].T, approximate="tanh")
            * (m @ W[p + "mlp.up_proj.linear.weight"].T)
        ) @ W[p + "mlp.down_proj.linear.weight"].T
        x = x + mdg._rms(m, W[p + "post_feedforward_layernorm.weight"], eps)
    tower = x
    # pool: scatter-add into the flat slot list [N T] (+1 dump row for padding patches), (1/k^2) sqrt(Hv)
    pooled = torch.zeros((N * T + 1, Hv), dtype=dtype)
    pooled.index_add_(0, plan["image_pool_slot"].reshape(-1), tower.reshape(N * Np, Hv) / (k * k))
    pooled = pooled[: N * T] * torch.tensor(Hv**0.5, dtype=dtype)
    if vc.get("standardize"):
        pooled = (pooled - W["std_bias"]) * W["std_scale"]
    proj = w["model.encoder.embed_vision.embedding_projection.weight"].to(dtype)
    features = mdg._rms(pooled, None, eps) @ proj.T
    occupied = torch.zeros(N * T, dtype=torch.bool)
    occupied[plan["image_pool_slot"][valid]] = True
    return dict(tower=tower, valid=valid, pooled=pooled, features=features, occupied=occupied)


def spec_merge(config_json: dict, w_text: dict, batch: dict, plan: dict, features: torch.Tensor, dtype=torch.float32):
    """The encoder input: token embeddings (image ids looked up as the pad id) times sqrt(H), with the rows at image
    positions replaced by the gathered projected features (no sqrt(H) on those)."""
    tc = config_json["text_config"]
    H = tc["hidden_size"]
    ids = batch["input_ids"]
    ids = torch.where(ids == config_json["image_token_id"], torch.full_like(ids, tc["pad_token_id"]), ids)
    x_text = w_text["embed_tokens.weight"].to(dtype)[ids] * torch.tensor(H**0.5, dtype=dtype)
    idx = plan["image_token_index"]
    rows = torch.cat([features, torch.zeros((1, features.shape[1]), dtype=dtype)])  # out-of-range index -> zero row
    is_image = (idx < features.shape[0])[..., None].to(dtype)
    return x_text * (1 - is_image) + rows[idx.clamp(max=features.shape[0])]


def spec_all(d: Path, batch: dict, plan: dict, dtype=torch.float32) -> dict:
    config_json = json.loads((d / "config.json").read_text())
    w_all = load_file(str(d / "model.safetensors"))
    w_text = mdg.load_text_weights(d / "model.safetensors")
    vis = spec_vision(config_json, w_all, batch, plan, dtype)
    embeds = spec_merge(config_json, w_text, batch, plan, vis["features"], dtype)
    sc, scm = batch["self_conditioning_logits"], batch["self_conditioning_mask"]
    out = dict(vision=vis, inputs_embeds=embeds)
    for overlay, suffix in ((True, ""), (False, "_causal")):
        out[suffix] = mdg.spec_forward(
            config_json,
            w_text,
            batch,
            sc_logits=sc,
            sc_mask=scm,
            dtype=dtype,
            encoder_embeds=embeds,
            image_segment_ids=plan["image_segment_ids"] if overlay else None,
        )
    return out


def spec_errors(spec: dict, expected: dict, batch: dict) -> dict[str, float]:
    am = batch["attention_mask"].bool()
    vis = spec["vision"]
    errs = {
        "vision_tower_hidden[valid]": mdg.rel_err(
            vis["tower"][vis["valid"]], expected["vision_tower_hidden"][vis["valid"]]
        ),
        "vision_pooled": mdg.rel_err(vis["pooled"][vis["occupied"]], expected["vision_pooled"]),
        "vision_features": mdg.rel_err(vis["features"][vis["occupied"]], expected["vision_features"]),
        "inputs_embeds": mdg.rel_err(spec["inputs_embeds"], expected["inputs_embeds"]),
    }
    for suffix in ("", "_causal"):
        ref = spec[suffix]
        errs[f"logits{suffix}"] = mdg.rel_err(ref["logits"], expected[f"logits{suffix}"])
        errs[f"encoder_hidden{suffix}[valid]"] = mdg.rel_err(
            ref["encoder_hidden"][am], expected[f"encoder_hidden{suffix}"][am]
        )
        kv = 0.0
        for li, (k, v) in ref["kv"].items():
            for nm, t in (("k", k), ("v", v)):
                ex = expected[f"encoder_{nm}_untrimmed{suffix}.{li}"]
                sel = am[:, None, :, None].expand_as(ex)
                kv = max(kv, mdg.rel_err(t[sel], ex[sel]))
        errs[f"encoder_kv{suffix}[valid]"] = kv
    return errs


# ------------------------------------------------------------------------------------------------------------------
# Writing and checking a forward case
# ------------------------------------------------------------------------------------------------------------------


def save_model_files(model, d: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        cfg_json = json.loads((Path(tmp) / "config.json").read_text())
        saved = load_file(str(Path(tmp) / "model.safetensors"))
        with safe_open(str(Path(tmp) / "model.safetensors"), "pt") as f:
            st_meta = f.metadata()
    assert cfg_json["vision_config"]["hidden_size"] == VISION_CONFIG["hidden_size"]
    assert cfg_json["vision_soft_tokens_per_image"] == SOFT_TOKENS
    (d / "config.json").write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in saved.items()}, str(d / "model.safetensors"), metadata=st_meta)


def reload_model(d: Path, dtype=torch.float32) -> DiffusionGemmaForBlockDiffusion:
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(d), attn_implementation="eager", experts_implementation="eager"
    )
    model = model.to(dtype).eval()
    mdg.check_implementations(model)
    stored = load_file(str(d / "model.safetensors"))
    sd = model.state_dict()
    for k, v in stored.items():
        assert torch.equal(sd[k], v.to(dtype)), f"{k} not loaded"
    return model


def write_forward_cases(out_dir: Path, log) -> None:
    """All forward cases share one model: the first weight seed from WEIGHT_SEED on whose router top-k margin is at
    least MIN_ROUTER_GAP on every token that matters in every case. Its files are written once, into the first case;
    the other cases' model.safetensors is a relative symbolic link to it (config.json is copied)."""
    cfg = build_config()
    batches = {}
    for name, case in CASES.items():
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        batches[name] = make_batch(case, cfg, out_dir / name)
    seed, tried = WEIGHT_SEED, []
    for _ in range(20):
        model = build_model(cfg)
        randomize_weights(model, seed)
        runs = {name: run_reference(model, cfg, batches[name][0]) for name in CASES}
        gap = min(r[1]["router_min_topk_gap"] for r in runs.values())
        tried.append(dict(weight_seed=seed, router_min_topk_gap=float(f"{gap:.3g}")))
        if gap >= MIN_ROUTER_GAP:
            break
        log(f"  weight seed {seed}: router top-k gap {gap:.3g} < {MIN_ROUTER_GAP:g}, trying the next seed")
        seed += 1
    else:
        raise RuntimeError(f"no weight seed with router gap >= {MIN_ROUTER_GAP}")

    first = next(iter(CASES))
    save_model_files(model, out_dir / first)
    for name, case in CASES.items():
        d = out_dir / name
        if name != first:
            (d / "config.json").write_bytes((out_dir / first / "config.json").read_bytes())
            link_model(d, first)
        batch, info = batches[name]
        expected, run_info = runs[name]
        save_file(
            {k: v.contiguous() for k, v in batch.items()}, str(d / "batch.safetensors"), metadata={"format": "pt"}
        )
        vc = VISION_CONFIG
        plan = derive_image_plan_inputs(batch, info["images_per_example"], vc["pooling_kernel_size"], SOFT_TOKENS)
        expected.update(plan)
        save_file(written(expected, case), str(d / "expected.safetensors"), metadata={"format": "pt"})
        checks = verify_forward_case(name, d, model, cfg, batch, expected, plan, log)
        checks["router_min_topk_gap"] = float(f"{run_info['router_min_topk_gap']:.3g}")
        meta = dict(
            name=name,
            description=case["description"],
            generator=GENERATOR,
            versions=versions(),
            settings=settings(),
            model="config.json + model.safetensors of this directory"
            + ("" if name == first else f" (model.safetensors: a symbolic link to ../{first}/model.safetensors)"),
            weight_seed=seed,
            weight_seeds_tried=tried,
            weight_init=" ".join(randomize_weights.__doc__.split()),
            batch=info,
            self_conditioning_mask=SC_MASK[: info["batch_size"]],
            rel_tolerance=REL_TOL,
            compare_encoder_only_where_attention_mask_is_1=True,
            compare_vision_tower_hidden_only_on_valid_patches=True,
            checks=checks,
        )
        (d / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def link_model(d: Path, source_case: str) -> None:
    link = d / "model.safetensors"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path("..") / source_case / "model.safetensors")


def verify_forward_case(name, d: Path, model, cfg, batch, expected, plan, log) -> dict:
    checks: dict = {}
    am = batch["attention_mask"].bool()

    # (a) reload the written files with HF (vision tower included) and rerun: bit-identical
    m2 = reload_model(d)
    batch2 = load_file(str(d / "batch.safetensors"))
    for k in batch:
        assert torch.equal(batch[k], batch2[k]), k
    exp2, _ = run_reference(m2, m2.config, batch2)
    exp_file = load_file(str(d / "expected.safetensors"))
    for k, v in exp2.items():  # every computed tensor, written or not
        assert torch.equal(v, expected[k]), f"{name}: reload+rerun differs in {k}"
    for k, v in exp_file.items():
        assert torch.equal(v, expected[k]), f"{name}: expected.safetensors differs from the run in {k}"
    checks["reload_rerun_bit_identical"] = True

    # (b) HF's own forward() with the images is the overlay-off result
    checks["hf_forward_equals_logits_causal"] = bool(
        torch.equal(hf_forward(model, batch, with_mm_token_type_ids=False), expected["logits_causal"])
    )
    assert checks["hf_forward_equals_logits_causal"], f"{name}: HF forward() differs from the overlay-off logits"
    e_mm = mdg.rel_err(hf_forward(model, batch, with_mm_token_type_ids=True), expected["logits"])
    assert e_mm <= REL_TOL, f"{name}: HF forward() with mm_token_type_ids vs the generate() mask: {e_mm:.3g}"
    checks["hf_forward_with_mm_token_type_ids_vs_logits_rel_err"] = float(f"{e_mm:.3g}")

    # (c) the independent re-implementation (fp32) and its fp64 twin
    errs = spec_errors(spec_all(d, batch, plan), expected, batch)
    for key, e in errs.items():
        assert e <= SPEC_TOL, f"{name}: spec re-implementation vs HF {key}: rel err {e:.3g} > {SPEC_TOL}"
    checks["spec_reimplementation_rel_err"] = {k: float(f"{v:.3g}") for k, v in errs.items()}
    f64 = spec_errors(spec_all(d, batch, plan, dtype=torch.float64), expected, batch)
    for key, e in f64.items():
        assert e <= REL_TOL / 2, f"{name}: HF fp32 vs fp64 {key}: {e:.3g} (fixture badly conditioned)"
    checks["hf_fp32_vs_fp64_rel_err"] = {k: float(f"{v:.3g}") for k, v in f64.items()}

    # (d) the overlay: same vision input, different encoder output from the first image token on, identical before it
    first_img = [int((batch["mm_token_type_ids"][b] == 1).nonzero()[0]) for b in range(am.shape[0])]
    before, after = 0.0, math.inf
    for b, j in enumerate(first_img):
        e0 = expected["encoder_hidden"][b, :j][am[b, :j]]
        before = max(before, mdg.rel_err(e0, expected["encoder_hidden_causal"][b, :j][am[b, :j]]))
        after = min(after, mdg.rel_err(expected["encoder_hidden"][b, j:], expected["encoder_hidden_causal"][b, j:]))
    d_logits = mdg.rel_err(expected["logits"], expected["logits_causal"])
    # Before the first image token only the rounding of HF's MoE loop moves (it gathers other token sets per expert
    # once the routing after the image differs); a leak of the overlay would be O(1).
    assert before <= REL_TOL and after > 1e-2 and d_logits > 1e-3, (before, after, d_logits)
    checks["overlay"] = dict(
        encoder_hidden_before_first_image_token_rel_diff_at_most=float(f"{before:.3g}"),
        encoder_hidden_from_first_image_token_rel_diff_at_least=float(f"{after:.3g}"),
        logits_rel_diff=float(f"{d_logits:.3g}"),
    )

    # (e) what the inputs exercise
    vis_valid = ~((batch["image_position_ids"] == -1).all(-1))
    checks["inputs"] = dict(
        padding_patches_per_image=(~vis_valid).sum(1).tolist(),
        std_bias_abs_max=float(f"{model.model.encoder.vision_tower.std_bias.abs().max().item():.3g}"),
        std_scale_range=[
            float(f"{model.model.encoder.vision_tower.std_scale.min().item():.3g}"),
            float(f"{model.model.encoder.vision_tower.std_scale.max().item():.3g}"),
        ],
        image_runs_per_example=plan["image_segment_ids"].max(1).values.tolist(),
        # The decoder embeds an image id on the canvas as an ordinary id (only encoder placeholders are replaced).
        noisy_canvas_ids_equal_to_image_token_id=int((batch["noisy_canvas_ids"] == cfg.image_token_id).sum()),
        image_run_longer_than_sliding_window=bool(
            max(batch["mm_token_type_ids"].sum(1).tolist()) > cfg.text_config.sliding_window
        ),
    )
    log(f"  [{name}] checks: {json.dumps(checks)}")
    return checks


# ------------------------------------------------------------------------------------------------------------------
# Training case
# ------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def vision_float64_islands(counts: collections.Counter):
    """The float32 islands of HF's Gemma 4 vision tower, evaluated in float64 when the activations are float64
    (the text islands are mtf.float64_islands): Gemma4RMSNorm (`hidden_states.float()`), the 2-D RoPE (float32
    inv_freq and angles) and the pooler (float32 one-hot weights, matmul and sqrt(Hv) scaling). The standardize step
    reads its buffers with `.float()`, which is exact here (the buffers hold float32 values)."""
    orig_norm = hf_g4.Gemma4RMSNorm.forward
    orig_rope = hf_g4.Gemma4VisionRotaryEmbedding.forward
    orig_pool = hf_g4.Gemma4VisionPooler.forward

    def rms_norm(self, hidden_states):
        if hidden_states.dtype != torch.float64:
            return orig_norm(self, hidden_states)
        counts["vision_rmsnorm"] += 1
        out = self._norm(hidden_states)
        return out * self.weight if self.with_scale else out

    def rope(self, x, position_ids):
        if x.dtype != torch.float64:
            return orig_rope(self, x, position_ids)
        counts["vision_rope"] += 1
        theta = float(self.config.rope_parameters["rope_theta"])
        half = self.config.head_dim // 2
        inv = 1.0 / (theta ** (torch.arange(0, half, 2, dtype=torch.float64) / half))
        assert ((inv - self.inv_freq.double()).abs() <= 2e-7 * inv).all(), "fp64 vision inv_freq disagrees with HF's"
        freqs = position_ids[..., None].to(torch.float64) * inv
        return self.recomposition_frequencies(freqs.cos()), self.recomposition_frequencies(freqs.sin())

    def pool(self, hidden_states, pixel_position_ids, padding_positions, output_length=None):
        if hidden_states.dtype != torch.float64:
            return orig_pool(self, hidden_states, pixel_position_ids, padding_positions, output_length)
        counts["vision_pool"] += 1
        h = hidden_states.masked_fill(padding_positions.unsqueeze(-1), 0.0)
        k = int((h.shape[1] // output_length) ** 0.5)
        assert k > 1 and k * k * output_length == h.shape[1]
        pos = pixel_position_ids.clamp(min=0)
        max_x = pos[..., 0].max(dim=-1, keepdim=True)[0] + 1
        idx = torch.div(pos, k, rounding_mode="floor")
        idx = idx[..., 0] + (max_x // k) * idx[..., 1]
        weights = F.one_hot(idx.long(), output_length).to(torch.float64) / (k * k)
        mask = torch.logical_not((weights == 0).all(dim=1))
        return (weights.transpose(1, 2) @ h) * self.root_hidden_size, mask

    hf_g4.Gemma4RMSNorm.forward = rms_norm
    hf_g4.Gemma4VisionRotaryEmbedding.forward = rope
    hf_g4.Gemma4VisionPooler.forward = pool
    try:
        yield
    finally:
        hf_g4.Gemma4RMSNorm.forward = orig_norm
        hf_g4.Gemma4VisionRotaryEmbedding.forward = orig_rope
        hf_g4.Gemma4VisionPooler.forward = orig_pool


@contextlib.contextmanager
def all_float64_islands(counts):
    with mtf.float64_islands(counts), vision_float64_islands(counts):
        yield


def make_train_batch(src: dict, cfg) -> tuple[dict[str, torch.Tensor], dict]:
    """The one_image prompts and images plus a clean canvas (ordinary ids: the clean encoder pass reads it, and an image
    id there would be taken for a placeholder), right padding in row 1, fixed t and uniform-state corruption drawn as
    make_training_fixtures.py draws it."""
    tc = cfg.text_config
    V, pad, L = tc.vocab_size, tc.pad_token_id, cfg.canvas_length
    B = src["input_ids"].shape[0]
    specials = {pad, tc.bos_token_id, cfg.image_token_id, cfg.boi_token_id, cfg.eoi_token_id, tc.eos_token_id}
    ordinary = torch.tensor([i for i in range(V) if i not in specials], dtype=torch.int64)
    g = torch.Generator().manual_seed(TRAIN_NOISE_SEED)
    canvas_mask = torch.ones((B, L), dtype=torch.float32)
    canvas_mask[1, L - 3 :] = 0.0
    canvas_ids = torch.where(
        canvas_mask > 0, ordinary[torch.randint(len(ordinary), (B, L), generator=g)], torch.full((B, L), pad)
    )
    diffusion_t = torch.tensor(TRAIN_T[:B], dtype=torch.float32)
    u = torch.rand((B, L), generator=g, dtype=torch.float32)
    r = torch.randint(V, (B, L), generator=g, dtype=torch.int64)
    selected = (u < diffusion_t[:, None]) & (canvas_mask == 1)
    noisy = torch.where(selected, r, canvas_ids)
    valid = canvas_mask == 1
    assert ((noisy == canvas_ids) & valid).any() and ((noisy != canvas_ids) & valid).any()
    batch = {
        k: src[k]
        for k in (
            "input_ids",
            "attention_mask",
            "position_ids",
            "mm_token_type_ids",
            "pixel_values",
            "image_position_ids",
        )
    }
    batch.update(
        canvas_ids=canvas_ids,
        canvas_mask=canvas_mask,
        noisy_canvas_ids=noisy,
        diffusion_t=diffusion_t,
        self_conditioning_mask=torch.tensor(SC_MASK[:B], dtype=torch.float32),
    )
    info = dict(
        source=f"{DEFAULT_OUT}/{TRAIN_SOURCE}/batch.safetensors (prompts, images)",
        canvas_lengths=canvas_mask.sum(1).to(torch.int64).tolist(),
        diffusion_t=TRAIN_T[:B],
        self_conditioning_mask=SC_MASK[:B],
        noise_seed=TRAIN_NOISE_SEED,
        draws="g = torch.Generator().manual_seed(noise_seed); "
        "canvas = ordinary_ids[torch.randint(len(ordinary_ids), (B, L), generator=g)] (pad where canvas_mask is 0); "
        "u = torch.rand((B, L), generator=g); r = torch.randint(V, (B, L), generator=g); "
        "noisy = where((u < t[:, None]) & (canvas_mask == 1), r, canvas_ids)",
        changed_positions_per_row=((noisy != canvas_ids) & valid).sum(1).tolist(),
        noisy_ids_equal_to_image_token_id=int((noisy == cfg.image_token_id).sum()),
    )
    return batch, info


def train_objective(model, batch, case: mtf.Case, pass1_logits=None) -> dict[str, torch.Tensor]:
    """The MB objective of make_training_fixtures.py with images: every encoder call (the K/V pass of pass 1 and pass 2,
    and the clean pass over prompt ++ x0) runs the vision tower and the image-bidirectional overlay, as MB does."""
    tc = model.config.text_config
    B, P = batch["input_ids"].shape
    L = batch["canvas_ids"].shape[1]
    sc_logits = sc_mask = None
    if case.sc:
        if pass1_logits is None:
            with torch.no_grad():
                cache1 = DynamicCache(config=tc)
                encode(model, batch, overlay=True, cache=cache1)
                pass1_logits = decoder_logits(model, batch, cache1).detach()
        sc_logits, sc_mask = pass1_logits, batch["self_conditioning_mask"].bool()
    cache = DynamicCache(config=tc)
    encode(model, batch, overlay=True, cache=cache)
    f = decoder_logits(model, batch, cache, sc_logits=sc_logits, sc_mask=sc_mask)
    ell = mtf.per_example_loss(f, batch, case)
    res = dict(diffusion_loss_per_example=ell, diffusion_loss=ell.sum() / B)
    total = mtf.DEC_W * ell.sum()
    if case.enc_w > 0:
        ids = torch.cat([batch["input_ids"], batch["canvas_ids"]], dim=1)
        am = torch.cat([batch["attention_mask"], batch["canvas_mask"].to(torch.int64)], dim=1)
        mm = torch.cat([batch["mm_token_type_ids"], torch.zeros((B, L), dtype=torch.int64)], dim=1)
        h = encode(
            model, batch, overlay=True, cache=DynamicCache(config=tc), ids=ids, attention_mask=am, mm=mm
        ).last_hidden_state
        logits_e = mtf.softcap(model.lm_head(h[:, P - 1 : P + L - 1]), model.final_logit_softcapping)
        M = batch["canvas_mask"].to(logits_e.dtype)
        ce = -torch.log_softmax(logits_e, dim=-1).gather(-1, batch["canvas_ids"].unsqueeze(-1)).squeeze(-1)
        enc = (M * ce).sum() / torch.clamp(M.sum(), min=1.0)
        res["encoder_loss"] = enc
        total = total + case.enc_w * enc * B
    res["loss"] = total / B
    return res


def trainable_params(model, d: Path) -> list[tuple[str, torch.nn.Parameter]]:
    """(checkpoint name, parameter) for every trainable parameter: the shared text stack under its model.decoder.*
    name (named_parameters lists it under the encoder's), the vision tower and projector under their own names."""
    out = {}
    for n, p in model.named_parameters():
        ck = (
            "model.decoder." + n[len("model.encoder.language_model.") :]
            if n.startswith("model.encoder.language_model.")
            else n
        )
        assert p.requires_grad and ck not in out, n
        out[ck] = p
    stored = load_file(str(d / "model.safetensors"))
    want = {k for k in stored if not k.endswith(("layer_scalar", "std_bias", "std_scale"))}
    assert set(out) == want, set(out) ^ want
    return sorted(out.items())


def grads_of(model, params, batch, case):
    model.zero_grad(set_to_none=True)
    res = train_objective(model, batch, case)
    res["loss"].backward()
    grads = {ck: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for ck, p in params}
    missing = [ck for ck, p in params if p.grad is None]
    model.zero_grad(set_to_none=True)
    return {k: v.detach() for k, v in res.items()}, grads, missing


def fd_check(model64, params, batch, case, grads64) -> dict:
    """Central finite difference of the float64 loss along a random direction (scaled by each parameter's RMS, zero on
    the embedding's pad row: padding_idx drops its lookups by design) against g . d; pass 1 held fixed."""
    g = torch.Generator().manual_seed(FD_SEED)
    dirs, saved = {}, {}
    for ck, p in params:
        rms = p.detach().pow(2).mean().sqrt().item()
        dirs[ck] = torch.randn(p.shape, generator=g, dtype=torch.float64) * (rms if rms > 0 else 1.0)
        if ck == "model.decoder.embed_tokens.weight":
            dirs[ck][model64.config.text_config.pad_token_id] = 0.0
        saved[ck] = p.detach().clone()
    analytic = sum((grads64[ck] * dirs[ck]).sum().item() for ck, _ in params)
    vision_part = sum((grads64[ck] * dirs[ck]).sum().item() for ck, _ in params if ck.startswith(mdg.VISION_PREFIXES))
    vals = []
    with torch.no_grad():
        cache1 = DynamicCache(config=model64.config.text_config)
        encode(model64, batch, overlay=True, cache=cache1)
        f1 = decoder_logits(model64, batch, cache1)
        for sign in (1.0, -1.0):
            for ck, p in params:
                p.copy_(saved[ck] + sign * mtf.FD_EPS * dirs[ck])
            vals.append(train_objective(model64, batch, case, pass1_logits=f1)["loss"].item())
        for ck, p in params:
            p.copy_(saved[ck])
    numeric = (vals[0] - vals[1]) / (2 * mtf.FD_EPS)
    rel = abs(numeric - analytic) / abs(analytic)
    return dict(
        eps=mtf.FD_EPS,
        directional_derivative=analytic,
        vision_parameters_share=float(f"{vision_part / analytic:.3g}"),
        finite_difference=numeric,
        rel_err=float(f"{rel:.3g}"),
    )


def check_float64_everywhere(model64, batch, case) -> int:
    """Every floating output of every module is float64 during the float64 objective (islands included)."""
    bad, seen = [], [0]

    def hook(module, args, out):
        for t in out if isinstance(out, (tuple, list)) else [getattr(out, "last_hidden_state", out)]:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                seen[0] += 1
                if t.dtype != torch.float64:
                    bad.append(type(module).__name__)

    handles = [m.register_forward_hook(hook) for m in model64.modules()]
    try:
        with torch.no_grad():
            train_objective(model64, batch, case)
    finally:
        for h in handles:
            h.remove()
    assert not bad, f"float32 outputs in the float64 reference: {sorted(set(bad))}"
    return seen[0]


def train_routing(model, batch, case) -> tuple[float, list[torch.Tensor]]:
    """Smallest top-k router margin over the tokens whose routing reaches the loss (real prompt tokens of the K/V
    passes, real prompt and canvas tokens of the clean pass, every canvas token of the decoder), and the chosen experts
    of those tokens, call by call."""
    B, P = batch["input_ids"].shape
    kv_tokens = batch["attention_mask"].reshape(-1).bool()
    clean_tokens = torch.cat([batch["attention_mask"].bool(), batch["canvas_mask"] > 0], dim=1).reshape(-1)
    rec = mdg.RouterRecorder(model)
    try:
        with torch.no_grad():
            train_objective(model, batch, case)
    finally:
        rec.remove()
    k = model.config.text_config.top_k_experts
    gap, chosen = math.inf, []
    for part, _i, probs, idx in rec.calls:
        n = probs.shape[0]
        rel_tokens = (
            torch.ones(n, dtype=torch.bool) if part == "decoder" else (kv_tokens if n == B * P else clean_tokens)
        )
        sp = probs.sort(dim=-1, descending=True).values
        gap = min(gap, (sp[:, k - 1] - sp[:, k])[rel_tokens].min().item())
        chosen.append(idx[rel_tokens].sort(dim=-1).values)
    return gap, chosen


def write_train_case(out_dir: Path, log) -> dict:
    src_dir = out_dir / TRAIN_SOURCE
    d = out_dir / TRAIN_CASE
    d.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "synthetic.png"):
        (d / f).write_bytes((src_dir / f).read_bytes())
    link_model(d, TRAIN_SOURCE)
    model64 = reload_model(d, torch.float64)
    model32 = reload_model(d, torch.float32)
    cfg = model64.config
    batch, info = make_train_batch(load_file(str(src_dir / "batch.safetensors")), cfg)
    save_file({k: v.contiguous() for k, v in batch.items()}, str(d / "batch.safetensors"), metadata={"format": "pt"})
    case = TRAIN_OBJECTIVE
    params64, params32 = trainable_params(model64, d), trainable_params(model32, d)
    counts: collections.Counter = collections.Counter()
    with all_float64_islands(counts):
        module_outputs = check_float64_everywhere(model64, batch, case)
        res64, g64, missing = grads_of(model64, params64, batch, case)
        fd = fd_check(model64, params64, batch, case, g64)
    for key in ("softmax", "rmsnorm", "rope", "vision_rmsnorm", "vision_rope", "vision_pool"):
        assert counts[key] > 0, f"float64 promotion of {key} never happened: {counts}"
    assert not missing, missing
    assert fd["rel_err"] <= mtf.FD_TOL, f"finite-difference check {fd}"
    res32, g32, _ = grads_of(model32, params32, batch, case)
    with all_float64_islands(collections.Counter()):
        gap, chosen64 = train_routing(model64, batch, case)
    _, chosen32 = train_routing(model32, batch, case)
    mismatches = sum(int((a != b).any(-1).sum()) for a, b in zip(chosen64, chosen32))
    assert gap >= MIN_ROUTER_GAP and mismatches == 0, (gap, mismatches)

    zero = [k for k, v in g64.items() if v.abs().max().item() == 0.0]
    assert not zero, f"parameters with an exactly zero gradient: {zero}"
    num = den = 0.0
    worst, worst_name = 0.0, None
    vision_worst = 0.0
    for k in g64:
        n64 = g64[k].norm().item()
        diff = (g32[k].double() - g64[k]).norm().item()
        num, den = num + diff**2, den + n64**2
        if diff / n64 > worst:
            worst, worst_name = diff / n64, k
        if k.startswith(mdg.VISION_PREFIXES):
            vision_worst = max(vision_worst, diff / n64)
    out = {
        "loss": res64["loss"].reshape(1),
        "diffusion_loss": res64["diffusion_loss"].reshape(1),
        "encoder_loss": res64["encoder_loss"].reshape(1),
        "diffusion_loss_per_example": res64["diffusion_loss_per_example"].contiguous(),
    }
    for k, v in g64.items():
        out[f"grad/{k}"] = v.to(torch.float32).contiguous()
    save_file(out, str(d / f"{case.name}.safetensors"), metadata={"format": "pt"})
    vision_norm = math.sqrt(sum(v.pow(2).sum().item() for k, v in g64.items() if k.startswith(mdg.VISION_PREFIXES)))
    rel = mtf.rel
    meta = dict(
        name=TRAIN_CASE,
        description="The block-diffusion SFT objective (docs/training.md, 'The objective'; make_training_fixtures.py's "
        "definition) on the one_image prompts and images: reweighted-loo-ce, self-conditioning on with mask [1, 0], "
        "encoder loss weight 1. Every encoder call (both K/V passes and the clean pass over prompt ++ x0) runs the "
        "vision "
        "tower and the image-bidirectional overlay. Gradients of every parameter, vision tower and projector included, "
        "in float64 torch autograd.",
        generator=GENERATOR,
        model="config.json + model.safetensors of this directory "
        f"(model.safetensors: a symbolic link to ../{TRAIN_SOURCE}/model.safetensors)",
        versions=versions(),
        settings=dict(
            settings(), reference_dtype="float64 (model.double(), HF float32 islands of text and vision in float64)"
        ),
        batch=info,
        cases=[
            dict(
                file=f"{case.name}.safetensors",
                settings=case.settings(),
                loss=res64["loss"].item(),
                diffusion_loss=res64["diffusion_loss"].item(),
                encoder_loss=res64["encoder_loss"].item(),
                diffusion_loss_per_example=res64["diffusion_loss_per_example"].tolist(),
                fp32_vs_fp64=dict(
                    loss_rel_err=float(f"{rel(res32['loss'].item(), res64['loss'].item()):.3g}"),
                    encoder_loss_rel_err=float(
                        f"{rel(res32['encoder_loss'].item(), res64['encoder_loss'].item()):.3g}"
                    ),
                    grad_max_param_rel_l2=float(f"{worst:.3g}"),
                    grad_max_param=worst_name,
                    grad_max_vision_param_rel_l2=float(f"{vision_worst:.3g}"),
                    grad_global_rel_l2=float(f"{math.sqrt(num / den):.3g}"),
                ),
                grad_global_norm=float(f"{math.sqrt(den):.6g}"),
                grad_vision_norm=float(f"{vision_norm:.6g}"),
                finite_difference=fd,
            )
        ],
        checks=dict(
            router=dict(min_topk_gap=float(f"{gap:.3g}"), fp32_fp64_routing_mismatches=mismatches),
            float64_module_outputs_checked=module_outputs,
            float64_islands_promoted=dict(sorted(counts.items())),
            params_with_exactly_zero_grad=[],
        ),
        notes=[
            "grad/<name>: d loss / d theta cast from float64 to float32. Text parameters under their model.decoder.* "
            "names (the encoder text stack is tied to the decoder), vision tower and projector under "
            "model.encoder.vision_tower.* / model.encoder.embed_vision.*. std_bias / std_scale and layer_scalar are "
            "buffers: no gradient.",
            "The vision tower runs once per encoder call; the gradient of its parameters sums the K/V pass of pass 2 "
            "and the clean pass (pass 1 is a no_grad stop-gradient).",
            "canvas_ids are ordinary ids (no image, boi, eoi, bos, eos or pad id at a real position): "
            "the clean encoder "
            "pass reads them, and HF would count an image id there as a placeholder.",
        ],
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    log(
        f"  [{TRAIN_CASE}] loss {res64['loss'].item():.17g}  fd {fd['rel_err']:.3g}  "
        f"fp32 grad {worst:.3g} ({worst_name})"
    )
    return meta


# ------------------------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------------------------


def versions() -> dict:
    import safetensors
    import torchvision

    return dict(
        python=sys.version.split()[0],
        torch=torch.__version__,
        torchvision=torchvision.__version__,
        transformers=transformers.__version__,
        safetensors=safetensors.__version__,
        numpy=np.__version__,
        pillow=Image.__version__,
    )


def settings() -> dict:
    return dict(
        device="cpu",
        dtype="float32",
        attn_implementation="eager (text and vision)",
        experts_implementation="eager",
        mkl_cbwr=os.environ.get("MKL_CBWR"),
        torch_num_threads=torch.get_num_threads(),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
    )


def write_all(out_dir: Path, log) -> None:
    log("building " + ", ".join(CASES))
    write_forward_cases(out_dir, log)
    log(f"building {TRAIN_CASE}")
    write_train_case(out_dir, log)


def main() -> int:
    names = list(CASES) + [TRAIN_CASE]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="fixture root, relative to the repo root")
    ap.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and compare byte-for-byte with --out-dir (writes nothing)",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    mdg.set_determinism()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    out_dir = args.out_dir if args.out_dir.is_absolute() else REPO_ROOT / args.out_dir
    log(f"torch {torch.__version__}, transformers {transformers.__version__}")

    if args.check:
        ok = True
        with tempfile.TemporaryDirectory() as tmp:
            write_all(Path(tmp), log)
            for name in names:
                produced = sorted(os.listdir(Path(tmp) / name))
                existing = sorted(os.listdir(out_dir / name)) if (out_dir / name).is_dir() else []
                for f in sorted(set(produced) | set(existing)):
                    a, b = Path(tmp) / name / f, out_dir / name / f
                    if a.is_symlink() or b.is_symlink():
                        same = a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
                    else:
                        same = a.exists() and b.exists() and filecmp.cmp(a, b, shallow=False)
                    log(f"  {name}/{f}: {'identical' if same else 'DIFFERS'}")
                    ok &= same
        print("check: all fixture files bit-identical" if ok else "check: FIXTURES DIFFER")
        return 0 if ok else 1

    write_all(out_dir, log)
    for name in names:
        size = sum(p.lstat().st_size for p in (out_dir / name).iterdir())
        log(f"  {name}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
