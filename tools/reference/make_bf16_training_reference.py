#!/usr/bin/env python3
"""How far HF transformers in bf16 lands from the float64 training reference: the yardstick for dgemma's bf16 mode.

Reference-data generation only: CI does not run this script. For every case of make_training_fixtures.py it loads the
fixture model in bfloat16 (HF as is: bf16 parameters and activations, HF's own float32 islands, the head output cast
to float32 before the soft-cap as HF's forward does), evaluates the same objective on the same committed batch, runs
torch autograd (bf16 gradients), and measures the distance to the committed float64 fixture of that case:

    loss_rel_err, diffusion_loss_rel_err, encoder_loss_rel_err   |bf16 - fp64| / |fp64|
    grad_global_rel_l2                                           sqrt(sum_p |g_p - ref_p|^2 / sum_p |ref_p|^2)
    grad_max_param_rel_l2 (+ grad_max_param)                     max_p |g_p - ref_p| / |ref_p|

It also runs the forward fixtures of test/fixtures/diffusion_gemma/<model> (the same models) in bfloat16 and records
max|bf16 - ref| / max|ref| of the three logits variants against their float32 references.

It writes test/fixtures/diffusion_gemma_train/<model>/bf16.json. The bf16 parity tests
(test/integration/DiffusionGemmaTrainParityTest.cpp, DiffusionGemmaParityTest.cpp) require dgemma's bf16 plans
to be at least about as close to the references as this.

Usage (from anywhere; needs the committed float64 fixtures):
    python3 tools/reference/make_bf16_training_reference.py [--only all_experts] [--check]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_training_fixtures as mtf  # noqa: E402  (sets the determinism environment before importing torch)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

GENERATOR = "tools/reference/make_bf16_training_reference.py"


def hf_softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """HF's forward casts the head output to float32 before the soft-cap; the fixture script applies the head itself
    in the model dtype (to stay in float64), so in bf16 the cast is restored here."""
    return SOFTCAP(x.float() if x.dtype == torch.bfloat16 else x, cap)


SOFTCAP = mtf.softcap
mtf.softcap = hf_softcap  # decoder_logits and clean_encoder_logits look the name up at call time


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def case_gaps(model, params, batch, case, reference) -> dict:
    res, grads, _kv, _none = mtf.run_with_grad(model, params, batch, case)
    out = {}
    for key in ("loss", "diffusion_loss", "encoder_loss"):
        if key in reference:
            out[f"{key}_rel_err"] = float(f"{rel(res[key].double().item(), reference[key].double().item()):.4g}")
    num = den = worst = 0.0
    worst_name = None
    for name, grad in grads.items():
        ref = reference[f"grad/{name}"].double()
        diff = (grad.double() - ref).norm().item()
        scale = ref.norm().item()
        num += diff * diff
        den += scale * scale
        if scale > 0 and diff / scale > worst:
            worst, worst_name = diff / scale, name
    out["grad_global_rel_l2"] = float(f"{math.sqrt(num / den):.4g}")
    out["grad_max_param_rel_l2"] = float(f"{worst:.4g}")
    out["grad_max_param"] = worst_name
    return out


def forward_gaps(model, name: str, log) -> dict:
    """The forward fixture's three logits variants in bf16 against its float32 references."""
    d = mtf.REPO_ROOT / mtf.MODEL_ROOT / name
    batch = load_file(str(d / "batch.safetensors"))
    expected = load_file(str(d / "expected.safetensors"))
    sc = batch["self_conditioning_logits"]
    variants = {
        "logits": dict(),
        "logits_sc": dict(sc_logits=sc),
        "logits_sc_masked": dict(sc_logits=sc, sc_mask=expected["self_conditioning_mask"]),
    }
    out = {}
    for key, kwargs in variants.items():
        logits = mtf.mdg.hf_forward(model, batch, **kwargs).logits.double()
        reference = expected[key].double()
        out[f"{key}_rel_err"] = float(f"{((logits - reference).abs().max() / reference.abs().max()).item():.4g}")
    log(f"  [{name}] forward: {out}")
    return out


def model_reference(name: str, fixtures: Path, log) -> dict:
    model = mtf.load_model(name, torch.bfloat16)
    params = mtf.trainable_params(model, name)
    batch = load_file(str(fixtures / name / "batch.safetensors"))
    cases = {}
    for case in mtf.CASES[name]:
        reference = load_file(str(fixtures / name / f"{case.name}.safetensors"))
        cases[case.name] = case_gaps(model, params, batch, case, reference)
        log(f"  [{name}] {case.name}: {cases[case.name]}")
    return dict(
        generator=GENERATOR,
        reference="the float64 fixture of each case (<case>.safetensors beside this file)",
        comparison="HF transformers in bfloat16 as is (bf16 parameters, activations and gradients; HF's float32 islands; "
        "head output cast to float32 before the soft-cap), same batch and objective, torch autograd",
        versions=dict(torch=torch.__version__, transformers=mtf.transformers.__version__),
        cases=cases,
        forward=dict(
            reference="test/fixtures/diffusion_gemma/<model>/expected.safetensors (HF in float32); max|bf16 - ref| / "
            "max|ref| over every logit",
            **forward_gaps(model, name, log),
        ),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=sorted(mtf.CASES), help="model(s) to measure (default: all)")
    ap.add_argument("--check", action="store_true", help="recompute and compare with the committed bf16.json (writes nothing)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    mtf.mdg.set_determinism()
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    fixtures = mtf.REPO_ROOT / mtf.DEFAULT_OUT
    ok = True
    for name in args.only or list(mtf.CASES):
        text = json.dumps(model_reference(name, fixtures, log), indent=2, sort_keys=True) + "\n"
        path = fixtures / name / "bf16.json"
        if args.check:
            same = path.exists() and path.read_text() == text
            log(f"  {path.relative_to(mtf.REPO_ROOT)}: {'identical' if same else 'DIFFERS'}")
            ok &= same
        else:
            path.write_text(text)
            log(f"  wrote {path.relative_to(mtf.REPO_ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
