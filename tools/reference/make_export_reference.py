#!/usr/bin/env python3
"""What an HF DiffusionGemma directory holds, as transformers' own save_pretrained writes it, and a check that
transformers loads a `dgemma-run export` directory and computes the same logits as dgemma.

Reference-data generation only (docs/training.md, "Export"); CI reads only the committed listing.

    python3 tools/reference/make_export_reference.py
        Builds DiffusionGemmaForBlockDiffusion from models/diffusion_gemma/configs/demo with the tiny vision tower of
        the vision fixtures (make_vision_fixtures.py: vision_config and vision_soft_tokens_per_image), runs
        save_pretrained (fp32 and bf16) and writes the listing test/fixtures/export/demo_hf_listing.json: the text
        and the vision tensors (name, shape, dtype), the files written, and the keys of config.json, text_config,
        vision_config and generation_config.json.
    python3 tools/reference/make_export_reference.py --check
        Recomputes the listing and compares it with the committed one (exit 1 on a difference).
    python3 tools/reference/make_export_reference.py --write-batch BATCH [--batch-model DIR]
        Writes a forward batch for the model (default: the demo): 3 left-padded prompts of width 12, canvas_length
        noisy canvas ids, fixed seed; the input of the check below.
    python3 tools/reference/make_export_reference.py --check-export DIR --batch BATCH --dgemma-out OUT
        Loads DIR with from_pretrained (fp32, eager): no tensor may be missing or unexpected. A DIR whose config has no
        vision_config (a text-only export) is loaded with the tiny vision tower, whose tensors are then missing by
        design. Runs BATCH (docs/cli.md's forward fields) and compares HF's logits with OUT's `logits`
        (dgemma-run forward on the same DIR): max|d| / max|ref| <= 1e-5.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("MKL_CBWR", "COMPATIBLE,STRICT")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import transformers  # noqa: E402
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, GenerationConfig  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_diffusion_gemma_fixtures import VISION_PREFIXES, hf_forward  # noqa: E402
from make_vision_fixtures import SOFT_TOKENS, VISION_CONFIG  # noqa: E402  (the tiny vision tower of issue 18)

DEMO_MODEL = REPO_ROOT / "models/diffusion_gemma/configs/demo"
LISTING = REPO_ROOT / "test/fixtures/export/demo_hf_listing.json"
REL_TOL = 1e-5


def load_config(model_dir: Path) -> DiffusionGemmaConfig:
    """The directory's config; where it has no vision_config (HF would build the full default tower) or no
    vision_soft_tokens_per_image, the tiny ones of the vision fixtures."""
    raw = json.loads((model_dir / "config.json").read_text())
    cfg = DiffusionGemmaConfig.from_pretrained(str(model_dir))
    if raw.get("vision_config") is None:
        cfg.vision_config = DiffusionGemmaConfig(vision_config=dict(VISION_CONFIG)).vision_config
    if "vision_soft_tokens_per_image" not in raw:
        cfg.vision_soft_tokens_per_image = SOFT_TOKENS
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
        c._experts_implementation = "eager"
    return cfg


def safetensors_listing(directory: Path) -> dict:
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                s = f.get_slice(name)
                tensors[name] = {"dtype": s.get_dtype(), "shape": list(s.get_shape())}
    return tensors


def make_listing() -> dict:
    torch.manual_seed(0)
    cfg = load_config(DEMO_MODEL)
    listing: dict = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": "models/diffusion_gemma/configs/demo",
        "vision_config": {key: getattr(cfg.vision_config, key) for key in VISION_CONFIG},
        "vision_soft_tokens_per_image": cfg.vision_soft_tokens_per_image,
        "command": "python3 tools/reference/make_export_reference.py",
    }
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = DiffusionGemmaForBlockDiffusion(copy.deepcopy(cfg)).to(dtype).eval()
        model.generation_config = GenerationConfig.from_pretrained(str(DEMO_MODEL))
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            d = Path(tmp)
            tensors = safetensors_listing(d)
            config = json.loads((d / "config.json").read_text())
            generation = json.loads((d / "generation_config.json").read_text())
            files = sorted(p.name for p in d.iterdir())
        text = {k: v for k, v in sorted(tensors.items()) if not k.startswith(VISION_PREFIXES)}
        vision = {k: v for k, v in sorted(tensors.items()) if k.startswith(VISION_PREFIXES)}
        assert config["vision_config"]["hidden_size"] == cfg.vision_config.hidden_size
        listing[dtype_name] = {
            "files": files,
            "text_tensors": text,
            "vision_tensors": vision,
            "vision_tensor_count": len(vision),
            "config_dtype": config.get("dtype"),
            "config_keys": sorted(config.keys()),
            "text_config_keys": sorted(config["text_config"].keys()),
            "vision_config_keys": sorted(config["vision_config"].keys()),
            "generation_config_keys": sorted(generation.keys()),
        }
    return listing


def write_batch(model_dir: Path, out: Path) -> None:
    cfg = DiffusionGemmaConfig.from_pretrained(str(model_dir))
    vocab, canvas = cfg.text_config.vocab_size, cfg.canvas_length
    g = torch.Generator().manual_seed(5)
    B, P = 3, 12
    lengths = [12, 9, 4]
    input_ids = torch.zeros(B, P, dtype=torch.int64)
    attention_mask = torch.zeros(B, P, dtype=torch.int64)
    for b, n in enumerate(lengths):  # left-padded, bos first, no special ids in the body
        input_ids[b, P - n] = cfg.text_config.bos_token_id
        input_ids[b, P - n + 1 :] = torch.randint(8, vocab, (n - 1,), generator=g)
        attention_mask[b, P - n :] = 1
    canvas_ids = torch.randint(0, vocab, (B, canvas), generator=g)
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": torch.arange(P).repeat(B, 1),
        "canvas_ids": canvas_ids,
        "noisy_canvas_ids": torch.randint(0, vocab, (B, canvas), generator=g),
        "canvas_mask": torch.ones(B, canvas),
    }
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in batch.items()}, str(out), metadata={"format": "pt"})
    print(f"wrote {out}: batch {B}, prompt width {P}, canvas {canvas}")


def check_export(export_dir: Path, batch_path: Path, dgemma_out: Path) -> int:
    cfg = load_config(export_dir)
    text_only = json.loads((export_dir / "config.json").read_text()).get("vision_config") is None
    model, info = DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(export_dir), config=cfg, dtype=torch.float32, output_loading_info=True,
        attn_implementation="eager", experts_implementation="eager")
    model = model.eval()
    missing = [k for k in info["missing_keys"] if not (text_only and k.startswith(VISION_PREFIXES))]
    unexpected = list(info["unexpected_keys"])
    mismatched = list(info.get("mismatched_keys", []))
    vision_missing = len(info["missing_keys"]) - len(missing)
    batch = load_file(str(batch_path))
    out = hf_forward(model, batch, sc_logits=batch.get("self_conditioning_logits"), sc_mask=batch.get("self_conditioning_mask"))
    hf_logits = out.logits.float()
    ours = load_file(str(dgemma_out))["logits"].float()
    assert hf_logits.shape == ours.shape, (hf_logits.shape, ours.shape)
    rel = ((hf_logits - ours).abs().max() / hf_logits.abs().max()).item()
    result = {
        "export": str(export_dir),
        "missing_text_keys": missing,
        "unexpected_keys": unexpected,
        "mismatched_keys": [str(m) for m in mismatched],
        "vision_keys_missing": vision_missing,
        "logits_shape": list(hf_logits.shape),
        "logits_rel_err": rel,
        "bound": REL_TOL,
        "transformers": transformers.__version__,
    }
    print(json.dumps(result, indent=2))
    ok = not missing and not unexpected and not mismatched and rel <= REL_TOL
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed listing, write nothing")
    parser.add_argument("--write-batch", type=Path, help="write a forward batch for --batch-model")
    parser.add_argument("--batch-model", type=Path, default=DEMO_MODEL, help="--write-batch: the model directory")
    parser.add_argument("--check-export", type=Path, help="an export directory to load with transformers")
    parser.add_argument("--batch", type=Path, help="--check-export: the forward batch (safetensors)")
    parser.add_argument("--dgemma-out", type=Path, help="--check-export: dgemma-run forward's output on the same batch")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if args.write_batch:
        write_batch(args.batch_model, args.write_batch)
        return 0
    if args.check_export:
        if not args.batch or not args.dgemma_out:
            parser.error("--check-export needs --batch and --dgemma-out")
        return check_export(args.check_export, args.batch, args.dgemma_out)
    listing = make_listing()
    text = json.dumps(listing, indent=1, sort_keys=True) + "\n"
    if args.check:
        same = LISTING.read_text() == text
        print("same" if same else "DIFFERENT")
        return 0 if same else 1
    LISTING.parent.mkdir(parents=True, exist_ok=True)
    LISTING.write_text(text)
    print(f"wrote {LISTING.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
