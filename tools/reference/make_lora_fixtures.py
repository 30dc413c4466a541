#!/usr/bin/env python3
"""Generate reference losses and adapter gradients of LoRA fine-tuning of DiffusionGemma with HF PEFT, in float64.

Reference-data generation only: this script is not run by CI. It loads the tiny fixture models of
test/fixtures/diffusion_gemma/<model>/ exactly as make_training_fixtures.py does, wraps them with PEFT LoRA (rank 4,
alpha 8, dropout 0) on one target group at a time, sets every adapter to seeded values (lora_B nonzero, so every
adapter gradient is informative), and evaluates make_training_fixtures.py's objective on its batch
(test/fixtures/diffusion_gemma_train/<model>/batch.safetensors) with torch autograd in float64. It writes
test/fixtures/diffusion_gemma_lora/<model>/:

    <group>.adapter.safetensors          the adapter weights (float32, exactly the values the reference used) under
                                         dgemma's parameter names (docs/training.md, "LoRA adapters")
    peft-<group>/                        the same adapters as PEFT's save_pretrained writes them (adapter_config.json,
                                         adapter_model.safetensors): the input of dgemma-run --adapter
    <group>.<case>.safetensors           loss, diffusion_loss, encoder_loss (enc1 only), diffusion_loss_per_example
                                         (float64), and grad/<adapter name> (float32, cast from float64)
    meta.json                            groups, cases, losses, fp32-vs-fp64 gaps, checks, the PEFT layouts, notes

Target groups (dgemma-compile --lora-targets): attention (q/k/v/o_proj; full-attention layers without v_proj have
none), mlp (the dense gate/up/down_proj), experts (the routed experts' gate_up_proj and down_proj, through PEFT's
target_parameters), router (router.proj).

HF's DiffusionGemma holds the text stack twice, the encoder's language_model and the decoder, with tied weights.
PEFT wraps both copies and gives each its own adapter. The script ties them again: the encoder copy's lora_A/lora_B
are the decoder's Parameter objects, so autograd sums both copies' gradients into one tensor. That is dgemma's
semantics (one adapter serves the encoder and the decoder pass, as one base weight does).

Usage (from anywhere):
    python3 tools/reference/make_lora_fixtures.py              # (re)write all fixtures
    python3 tools/reference/make_lora_fixtures.py --check      # regenerate in a temp dir, compare bytes
    python3 tools/reference/make_lora_fixtures.py --only all_experts [--out-dir DIR] [--quiet]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import filecmp
import json
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# make_training_fixtures sets the environment (CPU only, MKL_CBWR, offline) before it imports torch.
import make_training_fixtures as mtf  # noqa: E402  (model loading, batch, objective, float64 islands, checks)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import peft  # noqa: E402
import transformers  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora.layer import LoraLayer, ParamWrapper  # noqa: E402

REPO_ROOT = mtf.REPO_ROOT
TRAIN_ROOT = Path("test/fixtures/diffusion_gemma_train")
DEFAULT_OUT = Path("test/fixtures/diffusion_gemma_lora")
GENERATOR = "tools/reference/make_lora_fixtures.py"

RANK = 4
ALPHA = 8.0
SCALE = ALPHA / RANK
B_STD = 0.1  # lora_B ~ N(0, B_STD^2): large enough that the adapters move the loss, small enough to keep it a fine-tune
NOISE_TRIALS = 8  # perturbed float32 runs per case (fp32_noise_floor)
LORA_SEED = {"hf_tester": 7000, "seven_layers": 7100, "all_experts": 7200}  # first seed tried per model

# dgemma-compile --lora-targets group -> the single names it resolves to, and where each sits in a layer.
TARGET_GROUPS = {
    "attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "mlp": ["gate_proj", "up_proj", "down_proj"],
    "experts": ["experts.gate_up_proj", "experts.down_proj"],
    "router": ["router.proj"],
}
LINEAR_PATHS = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
    "router.proj": "router.proj",
}
EXPERT_PARAMS = {"experts.gate_up_proj": "gate_up_proj", "experts.down_proj": "down_proj"}

Case = mtf.Case
CASES: dict[str, dict[str, list[Case]]] = {
    # all_experts: with and without self-conditioning and the encoder loss, for every group.
    "all_experts": {g: [Case("reweighted-loo-ce", True, 1.0), Case("base-sft", False, 0.0)] for g in TARGET_GROUPS},
    "seven_layers": {g: [Case("reweighted-loo-ce", True, 1.0)] for g in TARGET_GROUPS},
    "hf_tester": {g: [Case("reweighted-loo-ce", True, 1.0)] for g in TARGET_GROUPS},
}


# ------------------------------------------------------------------------------------------------------------------
# Adapters: PEFT's modules and parameters under dgemma's names and layouts
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Adapter:
    """One targeted base weight of the decoder stack: its dgemma adapter names and PEFT's Parameters.

    layout "linear": dgemma A [r, in] = PEFT lora_A.weight, dgemma B [out, r] = PEFT lora_B.weight.
    layout "experts": PEFT's ParamWrapper keeps all experts in one Linear pair: lora_A.weight [E*r, in] with expert
    e's rows at [e*r, (e+1)*r), and lora_B.weight [out, r*E] with expert e's column k at k*E + e (PEFT's
    get_delta_weight: lora_A.reshape(E, r, in), lora_B.reshape(out, r, E)). dgemma: A [E, r, in], B [E, out, r].
    """

    base: str  # dgemma name of the base weight, e.g. model.decoder.layers.0.self_attn.q_proj.weight
    name_a: str
    name_b: str
    layout: str
    peft_a: torch.nn.Parameter
    peft_b: torch.nn.Parameter
    experts: int = 1

    def to_dgemma(self, which: str, t: torch.Tensor) -> torch.Tensor:
        if self.layout == "linear":
            return t
        E = self.experts
        if which == "A":
            return t.reshape(E, t.shape[0] // E, t.shape[1])
        return t.reshape(t.shape[0], t.shape[1] // E, E).permute(2, 0, 1)

    def to_peft(self, which: str, t: torch.Tensor) -> torch.Tensor:
        if self.layout == "linear":
            return t
        E = t.shape[0]
        if which == "A":
            return t.reshape(E * t.shape[1], t.shape[2])
        return t.permute(1, 2, 0).reshape(t.shape[1], t.shape[2] * E)


def lora_config(group: str) -> LoraConfig:
    """The group's LoraConfig in the form dgemma writes and reads (docs/training.md, "LoRA adapters"): expert tensors
    as target_parameters "experts.<name>", linear modules as one regular expression over the text layers of the
    encoder and the decoder. Not a list of names: the vision tower has q_proj, k_proj, ... modules too
    (Gemma4ClippableLinear, which PEFT cannot wrap), and the adapters belong to the text stack only."""
    names = TARGET_GROUPS[group]
    if group == "experts":
        return LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=[], target_parameters=names)
    by_parent: dict[str, list[str]] = {}
    for n in names:
        parent, module = LINEAR_PATHS[n].rsplit(".", 1)
        by_parent.setdefault(parent, []).append(module)
    parts = [p + r"\." + (ms[0] if len(ms) == 1 else "(?:" + "|".join(ms) + ")") for p, ms in by_parent.items()]
    return LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        lora_dropout=0.0,
        target_modules=r"model\.(?:encoder\.language_model|decoder)\.layers\.\d+\.(?:" + "|".join(parts) + ")",
    )


def _modules_of_layer(layer, group: str) -> list[tuple[str, torch.nn.Module]]:
    """(dgemma base-weight path inside the layer, PEFT LoRA module) for every target of `group` in one layer."""
    out = []
    if group == "experts":
        m = layer.experts
        while isinstance(m, ParamWrapper):
            out.append((f"experts.{m.parameter_name}", m))
            m = m.base_layer
        return sorted(out, key=lambda x: x[0])
    for n in TARGET_GROUPS[group]:
        m = layer
        for part in LINEAR_PATHS[n].split("."):
            m = getattr(m, part, None)
        if m is None:  # a full-attention layer with attention_k_eq_v has no v_proj
            continue
        assert isinstance(m, LoraLayer), f"{LINEAR_PATHS[n]} was not wrapped by PEFT"
        out.append((f"{LINEAR_PATHS[n]}.weight", m))
    return out


def wrap_and_tie(model, group: str):
    """Wraps `model` in place with PEFT LoRA on `group`, ties the encoder copy's adapters to the decoder's and returns
    the PeftModel and the decoder adapters, sorted by dgemma name."""
    peft_model = get_peft_model(model, lora_config(group))
    dec_layers = model.model.decoder.layers
    enc_layers = model.model.encoder.language_model.layers
    adapters = []
    for i, (dl, el) in enumerate(zip(dec_layers, enc_layers)):
        dmods, emods = _modules_of_layer(dl, group), _modules_of_layer(el, group)
        assert [p for p, _ in dmods] == [p for p, _ in emods], (i, dmods, emods)
        for (path, dm), (_, em) in zip(dmods, emods):
            # One adapter for both copies, as one base weight serves both.
            em.lora_A["default"].weight = dm.lora_A["default"].weight
            em.lora_B["default"].weight = dm.lora_B["default"].weight
            a, b = dm.lora_A["default"].weight, dm.lora_B["default"].weight
            prefix = f"model.decoder.layers.{i}."
            if isinstance(dm, ParamWrapper):
                base = prefix + path
                assert dm.num_experts > 1 and dm.scaling["default"] == SCALE
                adapters.append(Adapter(base, base + ".lora_A", base + ".lora_B", "experts", a, b, dm.num_experts))
            else:
                module = prefix + path[: -len(".weight")]
                assert dm.scaling["default"] == SCALE
                adapters.append(Adapter(prefix + path, module + ".lora_A.weight", module + ".lora_B.weight", "linear", a, b))
    assert adapters, f"{group}: PEFT wrapped nothing"
    # Every adapter tensor once (named_parameters lists a shared tensor once), and nothing else trainable.
    lora = [(n, p) for n, p in model.named_parameters() if "lora_" in n]
    assert len(lora) == 2 * len(adapters), (len(lora), len(adapters))
    assert all(p.requires_grad for _, p in lora)
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n), "a base weight is trainable"
    return peft_model, sorted(adapters, key=lambda a: a.base)


def save_peft_directory(peft_model, name: str, directory: Path) -> list[str]:
    """PEFT's own save_pretrained of the (float32) adapters: the directory a torch user would hand to dgemma-run
    --adapter. Its base_model_name_or_path is the repository-relative model directory, not this machine's path, and
    PEFT's generated model card is left out. Returns the saved keys."""
    peft_model.peft_config["default"].base_model_name_or_path = f"{mtf.MODEL_ROOT}/{name}"
    peft_model.save_pretrained(str(directory))
    (directory / "README.md").unlink()
    assert sorted(os.listdir(directory)) == ["adapter_config.json", "adapter_model.safetensors"], os.listdir(directory)
    return sorted(load_file(str(directory / "adapter_model.safetensors")))


def draw_adapters(adapters: list[Adapter], seed: int) -> dict[str, torch.Tensor]:
    """Seeded float32 values in dgemma's layout: A ~ U(+-1/sqrt(in)) (the bound of PEFT's kaiming_uniform(a=sqrt(5))
    and of dg-lora's init), B ~ N(0, B_STD^2) instead of PEFT's zeros."""
    g = torch.Generator().manual_seed(seed)
    values = {}
    for ad in adapters:
        a = ad.to_dgemma("A", ad.peft_a.detach())
        b = ad.to_dgemma("B", ad.peft_b.detach())
        fan_in = a.shape[-1]
        bound = 1.0 / math.sqrt(fan_in)
        values[ad.name_a] = (torch.rand(a.shape, generator=g, dtype=torch.float32) * 2 - 1) * bound
        values[ad.name_b] = torch.randn(b.shape, generator=g, dtype=torch.float32) * B_STD
    return values


def set_adapters(adapters: list[Adapter], values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for ad in adapters:
            for which, name, p in (("A", ad.name_a, ad.peft_a), ("B", ad.name_b, ad.peft_b)):
                v = ad.to_peft(which, values[name]).to(p.dtype)
                assert v.shape == p.shape, (name, v.shape, p.shape)
                p.copy_(v)
                assert torch.equal(ad.to_dgemma(which, p.detach()).float(), values[name]), name  # the layout round-trips


def check_delta_layout(model, adapters: list[Adapter], values) -> float:
    """Each adapter's delta weight under dgemma's layout and formula, s * B @ A (per expert), equals PEFT's own
    get_delta_weight, in the base weight's shape: the layout conversion is PEFT's."""
    dec = model.model.decoder.layers
    worst = 0.0
    with torch.no_grad():
        for ad in adapters:
            A, B = values[ad.name_a].double(), values[ad.name_b].double()
            ours = SCALE * (B @ A)  # [out, in], or [E, out, in] batched over experts
            layer = dec[int(ad.base.split(".")[3])]
            path = ad.base.split(".", 4)[4]
            if ad.layout == "experts":
                m = layer.experts
                while m.parameter_name != path.split(".")[1]:
                    m = m.base_layer
                base_shape = getattr(m.get_base_layer(), m.parameter_name).shape
            else:
                m = layer
                for part in path[: -len(".weight")].split("."):
                    m = getattr(m, part)
                base_shape = m.base_layer.weight.shape
            theirs = m.get_delta_weight("default").double()
            assert theirs.shape == base_shape == ours.shape, (ad.base, theirs.shape, base_shape, ours.shape)
            worst = max(worst, ((ours - theirs).abs().max() / theirs.abs().max()).item())
    assert worst <= 1e-15, worst
    return worst


# ------------------------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------------------------


def adapter_params(adapters: list[Adapter]) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for ad in adapters for n, p in ((ad.name_a, ad.peft_a), (ad.name_b, ad.peft_b))]


def to_dgemma_grads(adapters: list[Adapter], grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for ad in adapters:
        out[ad.name_a] = ad.to_dgemma("A", grads[ad.name_a]).contiguous()
        out[ad.name_b] = ad.to_dgemma("B", grads[ad.name_b]).contiguous()
    return out


def load_batch(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(REPO_ROOT / TRAIN_ROOT / name / "batch.safetensors"))


def train_fixture_loss(name: str, case: Case) -> float | None:
    meta = json.loads((REPO_ROOT / TRAIN_ROOT / name / "meta.json").read_text())
    for c in meta["cases"]:
        if c["file"] == f"{case.name}.safetensors":
            return c["loss"]
    return None


def build(name: str, group: str, dtype: torch.dtype):
    model = mtf.load_model(name, dtype)
    peft_model, adapters = wrap_and_tie(model, group)
    return model, peft_model, adapters


def routing_ok(model64, batch, cases, tc) -> tuple[bool, float]:
    """Whether every relevant token's top-k router margin is at least MIN_ROUTER_GAP with the adapters as set."""
    if tc.top_k_experts >= tc.num_experts:
        return True, math.inf
    probe = mtf.RouterProbe(model64)
    with mtf.float64_islands(collections.Counter()), torch.no_grad():
        for case in cases:
            mtf.objective(model64, batch, case, probe=probe)
    probe.remove()
    gap = min(mtf.router_gaps(probe.calls, batch, tc.top_k_experts).values())
    return gap >= mtf.MIN_ROUTER_GAP, gap


def fp32_noise_floor(model32, batch, case, res64) -> dict[str, float]:
    """How finely float32 can resolve this case's loss terms at all: the largest relative error against the float64
    reference over NOISE_TRIALS runs of HF + PEFT in float32 whose base weights are perturbed by a relative
    U(-2^-24, 2^-24) each (one float32 rounding). A float32 implementation that rounds differently from HF lands
    within about this distance; the C++ bound for a loss term is max(1e-6, 1.5 x this)."""
    saved = {n: p.detach().clone() for n, p in model32.named_parameters() if "lora_" not in n}
    floor = {k: 0.0 for k in ("loss", "diffusion_loss", "encoder_loss") if k in res64}
    try:
        for trial in range(NOISE_TRIALS):
            g = torch.Generator().manual_seed(9000 + trial)
            with torch.no_grad():
                for n, p in model32.named_parameters():
                    if n in saved:
                        p.copy_(saved[n] * (1 + (torch.rand(p.shape, generator=g) * 2 - 1) * 2.0**-24))
                res32 = mtf.objective(model32, batch, case)
            for k in floor:
                floor[k] = max(floor[k], mtf.rel(res32[k].item(), res64[k].item()))
    finally:
        with torch.no_grad():
            for n, p in model32.named_parameters():
                if n in saved:
                    p.copy_(saved[n])
    return {k: float(f"{v:.3g}") for k, v in floor.items()}


def write_group(name: str, group: str, batch, out_dir: Path, log) -> dict:
    cases = CASES[name][group]
    model64, _, adapters64 = build(name, group, torch.float64)
    model32, peft32, adapters32 = build(name, group, torch.float32)
    tc = model64.config.text_config
    assert [a.name_a for a in adapters64] == [a.name_a for a in adapters32]

    seed, tried = LORA_SEED[name], []
    for _ in range(50):
        values = draw_adapters(adapters64, seed)
        set_adapters(adapters64, values)
        ok, gap = routing_ok(model64, batch, cases, tc)
        if ok:
            break
        tried.append(dict(lora_seed=seed, min_topk_gap=float(f"{gap:.3g}")))
        log(f"  [{name}/{group}] lora seed {seed}: router top-k gap {gap:.3g} < {mtf.MIN_ROUTER_GAP:g}, next seed")
        seed += 1
    else:
        raise RuntimeError(f"{name}/{group}: no adapter seed with router gap >= {mtf.MIN_ROUTER_GAP}")
    set_adapters(adapters64, values)
    set_adapters(adapters32, values)
    delta_layout_rel = check_delta_layout(model64, adapters64, values)
    save_file({k: v.contiguous() for k, v in values.items()}, str(out_dir / f"{group}.adapter.safetensors"), metadata={"format": "pt"})
    peft_keys = save_peft_directory(peft32, name, out_dir / f"peft-{group}")
    # Both copies of every adapter, the decoder's and the encoder's language model's, with equal values.
    assert len(peft_keys) == 2 * len(values), (len(peft_keys), len(values))

    params64, params32 = adapter_params(adapters64), adapter_params(adapters32)
    counts: collections.Counter = collections.Counter()
    cases_meta = []
    for ci, case in enumerate(cases):
        with mtf.float64_islands(counts):
            if ci == 0:
                float64_check = mtf.check_float64_everywhere(model64, batch, case)
            probe64 = mtf.RouterProbe(model64)
            res64, g64, _kv, none64 = mtf.run_with_grad(model64, params64, batch, case, probe=probe64)
            probe64.remove()
            fd = mtf.fd_check(model64, params64, batch, case, g64, seed=8000 + ci, pad_id=tc.pad_token_id)
            # The base model alone (every lora_B zero) reproduces the training fixture's loss: same batch, same
            # objective, and the adapters add exact zeros.
            zero_b = {k: (torch.zeros_like(v) if ".lora_B" in k else v) for k, v in values.items()}
            set_adapters(adapters64, zero_b)
            with torch.no_grad():
                base_loss = mtf.objective(model64, batch, case)["loss"].item()
            set_adapters(adapters64, values)
        probe32 = mtf.RouterProbe(model32)
        res32, g32, _, _ = mtf.run_with_grad(model32, params32, batch, case, probe=probe32)
        probe32.remove()
        noise_floor = fp32_noise_floor(model32, batch, case, res64)
        assert not none64, f"{name}/{group} {case.name}: adapters without a gradient: {none64}"
        assert fd["rel_err"] <= mtf.FD_TOL, f"{name}/{group} {case.name}: finite-difference check {fd}"
        loss = res64["loss"].item()
        reference_base = train_fixture_loss(name, case)
        if reference_base is not None:
            assert mtf.rel(base_loss, reference_base) <= 1e-12, (base_loss, reference_base)
        adapter_effect = mtf.rel(loss, base_loss)
        assert adapter_effect > 1e-4, f"{name}/{group} {case.name}: the adapters barely move the loss ({adapter_effect:.3g})"

        dg64, dg32 = to_dgemma_grads(adapters64, g64), to_dgemma_grads(adapters32, g32)
        zero = [k for k, v in dg64.items() if v.abs().max().item() == 0.0]
        assert not zero, f"{name}/{group} {case.name}: zero adapter gradients {zero}"
        g_rel, worst, num, den = 0.0, None, 0.0, 0.0
        for k in dg64:
            n64 = dg64[k].norm().item()
            d = (dg32[k].double() - dg64[k]).norm().item()
            num, den = num + d * d, den + n64 * n64
            if d / n64 > g_rel:
                g_rel, worst = d / n64, k

        out = {
            "loss": res64["loss"].reshape(1),
            "diffusion_loss": res64["diffusion_loss"].reshape(1),
            "diffusion_loss_per_example": res64["diffusion_loss_per_example"].contiguous(),
        }
        if "encoder_loss" in res64:
            out["encoder_loss"] = res64["encoder_loss"].reshape(1)
        for k, v in sorted(dg64.items()):
            out[f"grad/{k}"] = v.to(torch.float32).contiguous()
        fname = f"{group}.{case.name}.safetensors"
        save_file(out, str(out_dir / fname), metadata={"format": "pt"})

        cm = dict(
            file=fname,
            settings=case.settings(),
            loss=loss,
            diffusion_loss=res64["diffusion_loss"].item(),
            encoder_loss=res64["encoder_loss"].item() if "encoder_loss" in res64 else None,
            base_loss_with_lora_B_zero=base_loss,
            base_loss_in_training_fixture=reference_base,
            loss_change_by_adapters_rel=float(f"{adapter_effect:.3g}"),
            fp32_vs_fp64=dict(
                loss_rel_err=float(f"{mtf.rel(res32['loss'].item(), loss):.3g}"),
                diffusion_loss_rel_err=float(f"{mtf.rel(res32['diffusion_loss'].item(), res64['diffusion_loss'].item()):.3g}"),
                encoder_loss_rel_err=(
                    float(f"{mtf.rel(res32['encoder_loss'].item(), res64['encoder_loss'].item()):.3g}")
                    if "encoder_loss" in res64
                    else None
                ),
                grad_max_param_rel_l2=float(f"{g_rel:.3g}"),
                grad_max_param=worst,
                grad_global_rel_l2=float(f"{math.sqrt(num / den):.3g}"),
            ),
            fp32_noise_floor=noise_floor,
            adapter_grad_global_norm=float(f"{math.sqrt(den):.6g}"),
            finite_difference=fd,
            router=mtf.router_summary(probe64.calls, probe32.calls, batch, tc.top_k_experts, tc.num_experts),
        )
        assert cm["router"].get("min_topk_gap", math.inf) >= mtf.MIN_ROUTER_GAP, cm["router"]
        assert cm["router"].get("fp32_fp64_routing_mismatches", 0) == 0, cm["router"]
        cases_meta.append(cm)
        log(
            f"    {group} {case.name}: loss {loss:.12g} (base {base_loss:.12g})  fp32 gaps: loss "
            f"{cm['fp32_vs_fp64']['loss_rel_err']:.3g} grad {g_rel:.3g}  fd {fd['rel_err']:.3g}  fp32 floor {noise_floor}"
        )
    for key in ("softmax", "rmsnorm", "rope"):
        assert counts[key] > 0, f"float64 promotion of {key} never happened: {counts}"
    return dict(
        targets=TARGET_GROUPS[group],
        lora_targets_flag=group,
        adapter_file=f"{group}.adapter.safetensors",
        peft_directory=f"peft-{group}",
        peft_key_count=len(peft_keys),
        adapters=[
            dict(base=ad.base, lora_A=[ad.name_a, list(values[ad.name_a].shape)], lora_B=[ad.name_b, list(values[ad.name_b].shape)])
            for ad in adapters64
        ],
        lora_seed=seed,
        lora_seeds_tried=tried,
        checks=dict(float64_evaluation=float64_check, delta_weight_dgemma_layout_vs_peft_rel=delta_layout_rel),
        cases=cases_meta,
    )


NOTES = [
    "PEFT LoraConfig(r=4, lora_alpha=8, lora_dropout=0): scale s = alpha / r = 2; a targeted linear computes "
    "x W^T + s (x A^T) B^T (PEFT's lora.Linear), a targeted expert tensor acts as W_e + s B_e A_e per expert "
    "(PEFT's ParamWrapper, target_parameters).",
    "Tied adapters: HF's DiffusionGemma has the text stack twice (model.encoder.language_model.* and model.decoder.*) "
    "with tied base weights, and PEFT wraps both copies with separate adapters. The reference ties each encoder "
    "adapter to its decoder adapter (the same Parameter objects), so there is one adapter per base weight, used by the "
    "K/V pass, the decoder pass and the clean encoder pass, and its gradient is the sum over all of them. That is "
    "dgemma's semantics. A PEFT adapter directory of such a model holds both copies' keys with equal values.",
    "Adapter values: float32 draws (generator seeded with lora_seed, adapters in sorted dgemma-name order, A then B): "
    "A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform(a=sqrt(5)) bound), B ~ N(0, 0.1^2) instead of PEFT's "
    "zeros, so every gradient is informative. The float64 reference uses exactly these float32 values; the base "
    "weights are test/fixtures/diffusion_gemma/<model>/model.safetensors, frozen (requires_grad False).",
    "Names and layouts: linear adapters P.lora_A.weight [r, in] and P.lora_B.weight [out, r] (PEFT's own layout, "
    "P the decoder module path); expert adapters model.decoder.layers.N.experts.{gate_up_proj,down_proj}.lora_A "
    "[E, r, in] and .lora_B [E, out, r]. PEFT's ParamWrapper stores them as lora_A.weight [E*r, in] (expert e at rows "
    "e*r ... e*r+r-1) and lora_B.weight [out, r*E] (expert e's column k at k*E + e). checks.delta_weight_dgemma_"
    "layout_vs_peft_rel compares s B_e A_e in dgemma's layout with PEFT's get_delta_weight.",
    "PEFT key names (for reading a PEFT adapter directory): target_parameters ['experts.gate_up_proj', "
    "'experts.down_proj'] nests two ParamWrappers on each experts module, the first listed innermost, so "
    "gate_up_proj's adapter is saved as ...experts.base_layer.lora_A.weight and down_proj's as "
    "...experts.lora_A.weight. target_modules must not match the vision tower (it has q_proj/k_proj/... of a type "
    "PEFT cannot wrap), hence dgemma's regex model\\.(?:encoder\\.language_model|decoder)\\.layers\\.\\d+\\.(?:...). "
    "The peft-<group> directories use exactly the config form dgemma writes, which is the form dgemma-run --adapter reads.",
    "Objective, batch and float64 evaluation: make_training_fixtures.py's, unchanged (its objective(), "
    "float64_islands, the batch of test/fixtures/diffusion_gemma_train/<model>/batch.safetensors). With every lora_B "
    "zero the loss equals that fixture's loss (base_loss_with_lora_B_zero vs base_loss_in_training_fixture, where "
    "the case exists there). Gradients are d loss / d adapter in dgemma's layout.",
    "finite_difference: make_training_fixtures.py's central difference along a random direction over the adapter "
    "parameters only. fp32_vs_fp64: HF + PEFT in float32 as is against the float64 reference (max over adapters of "
    "||g32 - g64|| / ||g64||, and the global ratio).",
]


def write_model(name: str, out_dir: Path, log) -> dict:
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    batch = load_batch(name)
    groups = {}
    for group in CASES[name]:
        log(f"  [{name}] {group}")
        groups[group] = write_group(name, group, batch, d, log)
    meta = dict(
        name=name,
        description=f"LoRA (rank {RANK}, alpha {ALPHA:g}, dropout 0) on each target group of the {name} fixture model, "
        "float64 reference with HF transformers + PEFT, adapters tied across the encoder and decoder copies.",
        generator=GENERATOR,
        model=f"{mtf.MODEL_ROOT}/{name} (config.json + model.safetensors)",
        batch=f"{TRAIN_ROOT}/{name}/batch.safetensors",
        rank=RANK,
        alpha=ALPHA,
        dropout=0.0,
        scale=SCALE,
        adapters_tied_between_encoder_and_decoder=True,
        versions=dict(
            python=sys.version.split()[0],
            torch=torch.__version__,
            transformers=transformers.__version__,
            peft=peft.__version__,
            safetensors=__import__("safetensors").__version__,
        ),
        settings=dict(
            device="cpu",
            reference_dtype="float64 (model.double(), HF float32 islands evaluated in float64)",
            comparison_dtype="float32 (HF + PEFT as is)",
            attn_implementation="eager",
            experts_implementation="eager",
            mkl_cbwr=os.environ.get("MKL_CBWR"),
            torch_num_threads=torch.get_num_threads(),
            deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        ),
        groups=groups,
        notes=NOTES,
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def files_under(directory: Path) -> list[str]:
    """Every file below `directory` (the PEFT directories included), relative to it."""
    if not directory.is_dir():
        return []
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="fixture root, relative to the repo root")
    ap.add_argument("--only", action="append", choices=sorted(CASES), help="model(s) to build (default: all)")
    ap.add_argument("--check", action="store_true", help="regenerate into a temporary directory and compare bytes")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    mtf.mdg.set_determinism()
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    names = args.only or list(CASES)
    out_dir = args.out_dir if args.out_dir.is_absolute() else REPO_ROOT / args.out_dir
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")

    if args.check:
        ok = True
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                write_model(name, Path(tmp), log)
                produced = files_under(Path(tmp) / name)
                existing = files_under(out_dir / name)
                for f in sorted(set(produced) | set(existing)):
                    a, b = Path(tmp) / name / f, out_dir / name / f
                    same = a.exists() and b.exists() and filecmp.cmp(a, b, shallow=False)
                    log(f"  {name}/{f}: {'identical' if same else 'DIFFERS'}")
                    ok &= same
        print("check: all fixture files bit-identical" if ok else "check: FIXTURES DIFFER")
        return 0 if ok else 1

    for name in names:
        log(f"building {name}")
        write_model(name, out_dir, log)
        size = sum((out_dir / name / f).stat().st_size for f in files_under(out_dir / name))
        log(f"  wrote {name}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
