#!/usr/bin/env python3
"""Generate float64 reference values and parameter gradients of DiffusionGemma's GRPO policy objective.

Reference-data generation only: this script is not run by CI. It reuses make_training_fixtures.py as is (the model
loading, the float64 islands, the training batch, the decoder passes and the per-example loss of the SFT objective)
and builds on them the GRPO loss of docs/rl.md, differentiated by torch autograd in float64. For every model it writes
test/fixtures/diffusion_gemma_grpo/<model>/:

    <case>.input.safetensors   the SFT fixture's batch (diffusion_gemma_train/<model>/batch.safetensors) plus
                               advantages, old_logps and (kl > 0) ref_logps [B] f32: what `dgemma-run grad` reads
    <case>.safetensors         loss [1], logps [B], kl [B] (kl > 0 only) float64, clipped [B] float32,
                               grad/<checkpoint name> (float32, cast from float64) and
                               logps_grad_norm/<checkpoint name> [B] float64: |d logps_b / d parameter| per example,
                               with which the test bounds how far a float32 logps moves the gradient
    meta.json                  cases, flags, ratios, advantages and values

The objective of one micro-batch (B examples), with the SFT estimate's f, w(t) and masked CE:

    logps_b = -l_b * max(sum_l M_bl, 1)                 (Megatron Bridge's diffusion_sft_logps; l_b the SFT per-example
                                                         loss, so logps_b = -w(t_b) sum_l M_bl CE_bl)
    r_b     = exp(logps_b - old_b)
    surr_b  = min(r_b A_b, clamp(r_b, 1 - eps, 1 + eps) A_b),  clipped_b = [clamp(r_b) A_b < r_b A_b]
              (with the two-sided clip, --clip-delta d: r_b in the first branch is min(r_b, d), and clipped_b is
              also 1 where A_b < 0 and r_b > d: the rows without a gradient)
    kl_b    = exp(ref_b - logps_b) - (ref_b - logps_b) - 1   (k3; kl > 0 only)
    loss    = -(1/B) sum_b (surr_b - kl_coeff kl_b)

The cases are {base-sft, reweighted-ce with weight clip 100} x self-conditioning {0, 1} x kl_coeff {0, 0.04}, all with
eps = 0.2 and the encoder loss off, and two base-sft cases with the two-sided clip at d = 1.38. old_logps is chosen from the float64 logps so that the ratios take the values of
RATIOS (some clipped above, some below, some inside; every ratio at least 0.02 from 1 +- eps, so that float32 cannot
flip a branch); advantages have both signs. The float32 inputs are what the reference uses too.

Usage (from anywhere):
    python3 tools/reference/make_grpo_fixtures.py                 # (re)write all fixtures
    python3 tools/reference/make_grpo_fixtures.py --check         # regenerate in a temp dir, compare bytes
    python3 tools/reference/make_grpo_fixtures.py --only all_experts [--out-dir DIR] [--quiet]
"""

from __future__ import annotations

import argparse
import collections
import filecmp
import json
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_training_fixtures as mtf  # noqa: E402  (sets the environment before importing torch)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

DEFAULT_OUT = Path("test/fixtures/diffusion_gemma_grpo")
SFT_FIXTURES = Path("test/fixtures/diffusion_gemma_train")
GENERATOR = "tools/reference/make_grpo_fixtures.py"
MODELS = ("all_experts", "seven_layers")
CLIP_EPSILON = 0.2
KL_COEFFS = (0.0, 0.04)
MIN_BRANCH_GAP = 0.02  # every ratio at least this far from 1 +- eps
# Per example (cut to B): (ratio exp(logps - old), advantage). Pattern 0: above the range with A > 0 (clipped), below
# with A < 0 (clipped), inside, inside. Pattern 1: below with A > 0 and above with A < 0 (the unclipped branch is the
# smaller: not clipped), inside with A < 0, above with A > 0 (clipped).
PATTERNS = (
    [(1.35, 1.0), (0.6, -0.7), (1.05, 0.5), (0.9, -0.4)],
    [(0.55, 0.8), (1.4, -1.2), (0.9, -0.3), (1.3, 0.6)],
)
REF_OFFSETS = [0.3, -0.25, 0.1, -0.15]  # ref_logps - logps (float64) per example, for the k3 term
# The two-sided clip's bound (--clip-delta): pattern 1's (1.4, -1.2) lies above it with A < 0.
CLIP_DELTA = 1.38


def cases() -> list[dict]:
    out = []
    for objective, clip in (("base-sft", None), ("reweighted-ce", 100.0)):
        for sc in (False, True):
            for ki, kl in enumerate(KL_COEFFS):
                name = f"{objective}.sc{int(sc)}.kl{kl:g}" + (f".clip{clip:g}" if clip is not None else "")
                out.append(dict(name=name, case=mtf.Case(objective, sc, 0.0, clip), kl=kl, pattern=ki, delta=None))
    for sc, kl in ((False, 0.0), (True, KL_COEFFS[1])):
        name = f"base-sft.sc{int(sc)}.kl{kl:g}.delta{CLIP_DELTA:g}"
        out.append(dict(name=name, case=mtf.Case("base-sft", sc, 0.0, None), kl=kl, pattern=1, delta=CLIP_DELTA))
    return out


def policy_logps(model, batch, case: mtf.Case) -> torch.Tensor:
    """logps [B] of the SFT estimate: pass 1 detached (sc1 only), pass 2 with gradient, -l_b * max(sum M, 1)."""
    sc_logits = sc_mask = None
    if case.sc:
        with torch.no_grad():
            sc_logits = mtf.decoder_logits(model, batch).detach()
        sc_mask = batch["self_conditioning_mask"].bool()
    cache = mtf.PrefixCache(config=model.config.text_config)
    f = mtf.decoder_logits(model, batch, sc_logits=sc_logits, sc_mask=sc_mask, cache=cache)
    ell = mtf.per_example_loss(f, batch, case)
    tokens = torch.clamp(batch["canvas_mask"].to(f.dtype).sum(-1), min=1.0)
    return -ell * tokens


def grpo_terms(logps, advantages, old, ref, kl_coeff: float, delta: float | None) -> dict[str, torch.Tensor]:
    ratio = torch.exp(logps - old)
    # The two-sided clip as TRL writes it (its `delta`): the first branch's ratio capped at delta.
    unclipped = (ratio if delta is None else torch.clamp(ratio, max=delta)) * advantages
    clipped_branch = torch.clamp(ratio, 1.0 - CLIP_EPSILON, 1.0 + CLIP_EPSILON) * advantages
    surrogate = torch.min(unclipped, clipped_branch)
    # The rows without a gradient: the clipped branch taken, or a negative advantage's ratio above delta.
    no_gradient = clipped_branch < ratio * advantages
    if delta is not None:
        no_gradient |= (advantages < 0) & (ratio > delta)
    res = dict(ratio=ratio, clipped=no_gradient.to(torch.float32))
    objective = surrogate
    if kl_coeff > 0:
        d = ref - logps
        res["kl"] = torch.exp(d) - d - 1.0
        objective = surrogate - kl_coeff * res["kl"]
    res["loss"] = -objective.sum() / logps.shape[0]
    return res


def write_model(name: str, out_dir: Path, log) -> dict:
    model = mtf.load_model(name, torch.float64)
    params = mtf.trainable_params(model, name)
    sft_dir = mtf.REPO_ROOT / SFT_FIXTURES / name
    sft_meta = json.loads((sft_dir / "meta.json").read_text())
    batch, _ = mtf.make_batch(name, model.config, sft_meta["batch"]["noise_seed"])
    stored = load_file(str(sft_dir / "batch.safetensors"))
    assert set(stored) == set(batch) and all(torch.equal(stored[k], batch[k]) for k in batch), f"{name}: batch differs"
    B = batch["input_ids"].shape[0]
    assert 3 <= B <= len(REF_OFFSETS)
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    counts: collections.Counter = collections.Counter()
    meta_cases = {}
    for spec in cases():
        case, kl_coeff, delta = spec["case"], spec["kl"], spec["delta"]
        log(f"  [{name}] {spec['name']}")
        with mtf.float64_islands(counts):
            with torch.no_grad():
                logps0 = policy_logps(model, batch, case)
            pattern = PATTERNS[spec["pattern"]][:B]
            ratios = torch.tensor([r for r, _ in pattern], dtype=torch.float64)
            # The plan reads float32 inputs: the reference uses the same rounded values.
            advantages = torch.tensor([a for _, a in pattern], dtype=torch.float32)
            old = (logps0 - torch.log(ratios)).to(torch.float32)
            ref = (logps0 + torch.tensor(REF_OFFSETS[:B], dtype=torch.float64)).to(torch.float32)
            model.zero_grad(set_to_none=True)
            logps = policy_logps(model, batch, case)
            assert torch.equal(logps.detach(), logps0), "the estimate is not deterministic"
            tensors = [p for _, p in params]
            per_example = [torch.autograd.grad(logps[b], tensors, retain_graph=True, allow_unused=True) for b in range(B)]
            res = grpo_terms(logps, advantages.double(), old.double(), ref.double(), kl_coeff, delta)
            res["loss"].backward()
        grads = {ck: (p.grad if p.grad is not None else torch.zeros_like(p)).detach() for ck, p in params}
        model.zero_grad(set_to_none=True)

        # The Megatron Bridge definition: logps = -(the SFT fixture's per-example loss) * max(sum M, 1).
        sft_name = f"{case.objective}.sc{int(case.sc)}.enc0.safetensors"
        if (sft_dir / sft_name).exists():
            sft = load_file(str(sft_dir / sft_name))["diffusion_loss_per_example"]
            tokens = torch.clamp(batch["canvas_mask"].double().sum(-1), min=1.0)
            gap = ((logps0 + sft * tokens).abs() / logps0.abs()).max().item()
            assert gap <= 1e-12, f"{name} {spec['name']}: logps differ from {sft_name} by {gap}"
        ratio = res["ratio"].detach()
        for r in ratio.tolist():
            for edge in (1.0 - CLIP_EPSILON, 1.0 + CLIP_EPSILON) + ((delta,) if delta is not None else ()):
                assert abs(r - edge) >= MIN_BRANCH_GAP, f"{name} {spec['name']}: ratio {r} within {MIN_BRANCH_GAP} of {edge}"
        clipped = res["clipped"]
        expected_clipped = [
            float(a * min(max(r, 1 - CLIP_EPSILON), 1 + CLIP_EPSILON) < a * r or (delta is not None and a < 0 and r > delta))
            for r, a in pattern
        ]
        assert delta is None or 0 < sum(1 for r, a in pattern if a < 0 and r > delta), "no ratio above delta"
        assert clipped.tolist() == expected_clipped, (clipped, expected_clipped)

        inputs = {k: v.contiguous() for k, v in batch.items()}
        inputs.update(advantages=advantages, old_logps=old)
        if kl_coeff > 0:
            inputs["ref_logps"] = ref
        save_file(inputs, str(d / f"{spec['name']}.input.safetensors"), metadata={"format": "pt"})
        expected = dict(loss=res["loss"].detach().reshape(1), logps=logps0, clipped=clipped)
        if kl_coeff > 0:
            expected["kl"] = res["kl"].detach()
        expected.update({f"grad/{ck}": g.to(torch.float32).contiguous() for ck, g in grads.items()})
        for i, (ck, _) in enumerate(params):
            norms = [0.0 if per_example[b][i] is None else per_example[b][i].norm().item() for b in range(B)]
            expected[f"logps_grad_norm/{ck}"] = torch.tensor(norms, dtype=torch.float64)
        save_file(expected, str(d / f"{spec['name']}.safetensors"), metadata={"format": "pt"})
        grad_norm = math.sqrt(sum(g.pow(2).sum().item() for g in grads.values()))
        meta_cases[spec["name"]] = dict(
            flags=f"--objective {case.objective} --self-cond-prob {0.5 if case.sc else 0}"
            + (f" --weight-clip {case.clip:g}" if case.clip is not None else "")
            + f" --policy-loss grpo --clip-epsilon {CLIP_EPSILON:g} --kl-coeff {kl_coeff:g}"
            + (f" --clip-delta {delta:g}" if delta is not None else ""),
            ratios=ratio.tolist(),
            advantages=advantages.tolist(),
            clipped=clipped.tolist(),
            logps=logps0.tolist(),
            kl=res["kl"].tolist() if kl_coeff > 0 else None,
            **({"clip_delta": delta} if delta is not None else {}),
            loss=res["loss"].item(),
            grad_global_norm=grad_norm,
        )
        assert grad_norm > 0
    meta = dict(
        generator=GENERATOR,
        model=f"test/fixtures/diffusion_gemma/{name}",
        batch=f"{SFT_FIXTURES}/{name}/batch.safetensors (make_training_fixtures.py)",
        clip_epsilon=CLIP_EPSILON,
        ref_offsets=REF_OFFSETS[:B],
        patterns=[p[:B] for p in PATTERNS],
        float64_island_calls=dict(counts),
        torch=torch.__version__,
        transformers=mtf.transformers.__version__,
        cases=meta_cases,
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="fixture root, relative to the repo root")
    ap.add_argument("--only", action="append", choices=MODELS, help="model(s) to build (default: all)")
    ap.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and compare byte-for-byte with --out-dir (writes nothing)",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    mtf.mdg.set_determinism()
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    out_dir = args.out_dir if args.out_dir.is_absolute() else mtf.REPO_ROOT / args.out_dir
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.only or MODELS:
                write_model(name, Path(tmp), log)
            same = True
            for name in args.only or MODELS:
                produced, existing = Path(tmp) / name, out_dir / name
                files = sorted(os.listdir(produced))
                same &= existing.is_dir() and files == sorted(os.listdir(existing))
                same &= all(filecmp.cmp(produced / f, existing / f, shallow=False) for f in files if (existing / f).exists())
        print("check: all fixture files bit-identical" if same else "check: FIXTURES DIFFER")
        return 0 if same else 1
    for name in args.only or MODELS:
        log(f"building {name}")
        write_model(name, out_dir, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
