#!/usr/bin/env python3
"""Generate reference losses and parameter gradients of the DiffusionGemma block-diffusion SFT objective.

Reference-data generation only: this script is not run by CI. It loads the tiny fixture models of
test/fixtures/diffusion_gemma/<model>/ into HuggingFace `DiffusionGemmaForBlockDiffusion` (exactly as
make_diffusion_gemma_fixtures.py reloads them), evaluates the Megatron Bridge training objective of
docs/training.md, "The objective" with HF modules, and differentiates it with torch autograd in float64.
For every model it writes test/fixtures/diffusion_gemma_train/<model>/:

    batch.safetensors                                      the training micro-batch, with the test hooks
                                                           (noisy_canvas_ids, diffusion_t, self_conditioning_mask)
    <objective>.sc<0|1>.enc<0|1>[.clip<c>][.aux<a>].safetensors
                                                           loss, diffusion_loss, encoder_loss (enc1 only),
                                                           router_aux_loss (aux only),
                                                           diffusion_loss_per_example (float64) and
                                                           grad/<checkpoint name> (float32, cast from float64)
    meta.json                                              cases, loss values, fp32-vs-fp64 gaps, checks, notes

The objective of one micro-batch (B examples, prompt width P, canvas L, vocabulary K):

    pass 1 (sc1 only, no grad):  f1 = softcap(head(HF forward(input_ids, noisy_canvas_ids)))
    pass 2 (grad):               f  = softcap(head(HF forward(..., sc logits f1, sc mask)))   (sc0: no sc logits)
    z   = f, or f + delta(t) * onehot(noisy) for the leave-one-out variants
    l_b = w(t_b) * sum_l M_bl CE(z_bl, x0_bl) / max(sum_l M_bl, 1)
    enc = sum M CE(softcap(head(clean encoder(prompt ++ x0)[P-1 : P+L-1])), x0) / max(sum M, 1)   (enc1 only)
    aux = sum over the router calls of pass 2 and the clean pass of (E / k) / T_real^2 sum_e P_e c_e, over real
          tokens only: P_e = sum_t w_t p_te, c_e = sum_t w_t #{j : idx[t, j] == e}, w_t = 0 on padding   (aux cases only)
    loss = (sum_b l_b + enc_w * enc * B) / B + a * aux;  diffusion_loss = sum_b l_b / B;  encoder_loss = enc

Besides writing, the script checks its own results (see tools/reference/README.md), among them a central
finite-difference check of the float64 gradient, the gradient path from the decoder loss into the encoder through the
prefix K/V, the masking of pads in the clean encoder pass, and the relations between the objectives.

Usage (from anywhere):
    python3 tools/reference/make_training_fixtures.py              # (re)write all fixtures
    python3 tools/reference/make_training_fixtures.py --check      # regenerate in a temp dir, compare bytes
    python3 tools/reference/make_training_fixtures.py --only all_experts [--out-dir DIR] [--quiet]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
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

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DynamicCache  # noqa: E402
from transformers.models.diffusion_gemma import modeling_diffusion_gemma as hf_dg  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_diffusion_gemma_fixtures as mdg  # noqa: E402  (model definitions, tiny vision config, eager checks)

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_ROOT = Path("test/fixtures/diffusion_gemma")
DEFAULT_OUT = Path("test/fixtures/diffusion_gemma_train")
GENERATOR = "tools/reference/make_training_fixtures.py"

OBJECTIVES = ("base-sft", "reweighted-ce", "loo-ce", "reweighted-loo-ce")
DEC_W = 1.0  # diffusion_decoder_loss_weight (MB default)
DIFFUSION_T = [0.25, 0.5, 0.9, 0.05]  # per-example t, cut to B
SC_MASK = [1.0, 0.0, 1.0, 0.0]  # per-example self-conditioning coins, cut to B
NOISE_SEED = {"hf_tester": 3000, "seven_layers": 3100, "all_experts": 3200}  # torch.Generator seed for u and r
FD_EPS = 1e-6  # central finite-difference step (relative to each parameter's RMS)
FD_TOL = 1e-6  # allowed relative error of the directional derivative (float64)
MIN_ROUTER_GAP = 1e-4  # warn (meta.json) if a relevant token's top-k router margin is below this


@dataclasses.dataclass(frozen=True)
class Case:
    objective: str
    sc: bool
    enc_w: float
    clip: float | None = None
    aux: float = 0.0  # router load-balancing loss coefficient (moe_aux_loss_coeff)

    @property
    def name(self) -> str:
        s = f"{self.objective}.sc{int(self.sc)}.enc{int(self.enc_w > 0)}"
        s += f".clip{self.clip:g}" if self.clip is not None else ""
        return s + (f".aux{self.aux:g}" if self.aux > 0 else "")

    @property
    def reweighted(self) -> bool:
        return self.objective.startswith("reweighted")

    @property
    def loo(self) -> bool:
        return self.objective.endswith("loo-ce")

    def settings(self) -> dict:
        return dict(
            objective=self.objective,
            self_conditioning=self.sc,
            diffusion_decoder_loss_weight=DEC_W,
            diffusion_encoder_loss_weight=self.enc_w,
            diffusion_weight_clip=self.clip,
            moe_aux_loss_coeff=self.aux,
        )


CASES: dict[str, list[Case]] = {
    "all_experts": [Case(o, sc, ew) for o in OBJECTIVES for sc in (False, True) for ew in (0.0, 1.0)]
    + [Case("reweighted-ce", True, 1.0, 1.5), Case("base-sft", True, 1.0, aux=0.01)],
    "seven_layers": [Case("reweighted-loo-ce", True, 1.0)],
    "hf_tester": [Case("reweighted-loo-ce", True, 1.0), Case("base-sft", True, 1.0, aux=0.01)],
}

DESCRIPTIONS = {
    "all_experts": "Every objective x self-conditioning on/off x encoder loss on/off, plus reweighted-ce with a weight "
    "clip of 1.5 (active on the t = 0.5 and t = 0.9 rows), plus base-sft (sc on, enc_w 1) with a router load-balancing "
    "loss of coefficient 0.01. top_k == num_experts, so routing is smooth; for the same reason every router call's "
    "load-balancing loss is exactly E / k = 1 in exact arithmetic, with zero gradient: that case pins the number and "
    "placement of the calls (pass 2 and the clean pass, 9 calls) and the coefficient, not the gradient through P_e.",
    "seven_layers": "One case (reweighted-loo-ce, sc on, enc_w 1). sliding_window 4: the K/V pass, the decoder's "
    "last-(W-1) prefix trim and the clean encoder pass over P + L = 27 tokens all cross the window.",
    "hf_tester": "reweighted-loo-ce (sc on, enc_w 1) on the text part of the HF tester config (sliding head_dim 256, "
    "full head_dim 16, top-2 of 4 experts), plus base-sft (sc on, enc_w 1) with a router load-balancing loss of "
    "coefficient 0.01: with top_k < num_experts its gradient through P_e is nonzero, and it leaves the padding out.",
}


# ------------------------------------------------------------------------------------------------------------------
# Float64 evaluation of the HF modules
# ------------------------------------------------------------------------------------------------------------------


def _rope_inv_freq64(rope_module, layer_type: str) -> torch.Tensor:
    """The RoPE inverse frequencies of one layer type in float64 (HF computes them in float32 at init)."""
    rp = rope_module.config.rope_parameters[layer_type]
    hd = rope_module.config.per_layer_config[layer_type].head_dim
    theta = float(rp["rope_theta"])
    prf = rp.get("partial_rotary_factor", 1.0)
    if rp["rope_type"] == "default":
        dim = int(hd * prf)
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    elif rp["rope_type"] == "proportional":
        rot = int(prf * hd // 2)
        inv = torch.zeros(hd // 2, dtype=torch.float64)
        inv[:rot] = 1.0 / (theta ** (torch.arange(0, 2 * rot, 2, dtype=torch.float64) / hd))
    else:
        raise RuntimeError(f"rope_type {rp['rope_type']} not handled")
    buf = getattr(rope_module, f"{layer_type}_inv_freq").to(torch.float64)
    assert inv.shape == buf.shape and torch.equal(inv == 0, buf == 0), layer_type
    assert ((inv - buf).abs() <= 2e-7 * inv.abs()).all(), f"{layer_type}: fp64 inv_freq disagrees with HF's buffer"
    assert getattr(rope_module, f"{layer_type}_attention_scaling") == 1.0
    return inv


@contextlib.contextmanager
def float64_islands(counts: collections.Counter):
    """Evaluate HF's hard-coded float32 islands in float64 when the activations are float64.

    `model.double()` alone is not a float64 evaluation: transformers 5.24 upcasts to, and computes in, float32 in every
    RMSNorm (`hidden_states.float()`), the attention and router softmax (`softmax(dtype=float32)`), the
    self-conditioning softmax (`Tensor.softmax(dtype=float32)`) and RoPE (float32 inv_freq and angles), and it casts
    the LM-head output to float32 (that last one is avoided by applying the head in `decoder_logits`). Inside this
    context each of these runs in float64 when its input is float64; float32 inputs take HF's own code unchanged.
    """
    orig_softmax = F.softmax
    tensor_has_softmax = "softmax" in torch.Tensor.__dict__
    orig_tensor_softmax = torch.Tensor.softmax
    orig_norm = hf_dg.DiffusionGemmaRMSNorm.forward
    orig_rope = hf_dg.DiffusionGemmaTextRotaryEmbedding.forward
    inv_cache: dict = {}

    def softmax(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002 (torch's parameter name)
        if dtype == torch.float32 and input.dtype == torch.float64:
            dtype = torch.float64
            counts["softmax"] += 1
        return orig_softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    def tensor_softmax(self, *args, **kwargs):
        if kwargs.get("dtype") == torch.float32 and self.dtype == torch.float64:
            kwargs["dtype"] = torch.float64
            counts["tensor_softmax"] += 1
        return orig_tensor_softmax(self, *args, **kwargs)

    def rms_norm(self, hidden_states):
        if hidden_states.dtype != torch.float64:
            return orig_norm(self, hidden_states)
        counts["rmsnorm"] += 1
        out = self._norm(hidden_states)
        return out * self.weight if self.with_scale else out

    def rope(self, x, position_ids, layer_type):
        if x.dtype != torch.float64:
            return orig_rope(self, x, position_ids, layer_type)
        counts["rope"] += 1
        key = (id(self), layer_type)
        if key not in inv_cache:
            inv_cache[key] = _rope_inv_freq64(self, layer_type)
        freqs = position_ids[..., None].to(torch.float64) * inv_cache[key]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    F.softmax = softmax
    torch.Tensor.softmax = tensor_softmax
    hf_dg.DiffusionGemmaRMSNorm.forward = rms_norm
    hf_dg.DiffusionGemmaTextRotaryEmbedding.forward = rope
    try:
        yield
    finally:
        F.softmax = orig_softmax
        if tensor_has_softmax:
            torch.Tensor.softmax = orig_tensor_softmax
        else:
            del torch.Tensor.softmax
        hf_dg.DiffusionGemmaRMSNorm.forward = orig_norm
        hf_dg.DiffusionGemmaTextRotaryEmbedding.forward = orig_rope


# ------------------------------------------------------------------------------------------------------------------
# Model and batch
# ------------------------------------------------------------------------------------------------------------------


def load_model(name: str, dtype: torch.dtype) -> DiffusionGemmaForBlockDiffusion:
    """Reload a fixture model the way make_diffusion_gemma_fixtures.py does (verify_fixture, step a)."""
    d = REPO_ROOT / MODEL_ROOT / name
    cfg = DiffusionGemmaConfig.from_pretrained(str(d))
    cfg.vision_config = copy.deepcopy(mdg.build_config(mdg.FIXTURES[name]).vision_config)  # tiny, never used
    tl = transformers.utils.logging.get_logger("transformers.modeling_utils")
    old = tl.level
    tl.setLevel(logging.ERROR)  # the vision tensors are missing from the fixture on purpose
    torch.manual_seed(0)  # HF initializes the missing (unused) vision tensors from the global generator
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(d), config=cfg, attn_implementation="eager", experts_implementation="eager"
    )
    tl.setLevel(old)
    model = model.to(dtype).eval()
    mdg.check_implementations(model)
    tc = model.config.text_config
    assert tc.attention_dropout == 0.0
    # Every stored tensor, including both layer_scalar copies, was loaded.
    stored = load_file(str(d / "model.safetensors"))
    sd = model.state_dict()
    for k, v in stored.items():
        assert torch.equal(sd[k], v.to(dtype)), f"{name}: {k} not loaded"
    # One tensor each: the encoder text stack is the decoder stack, lm_head is embed_tokens.
    dec, enc = model.model.decoder, model.model.encoder.language_model
    assert model.lm_head.weight is dec.embed_tokens.weight and enc.embed_tokens.weight is dec.embed_tokens.weight
    assert enc.norm.weight is dec.norm.weight
    for el, dl in zip(enc.layers, dec.layers):
        assert el.self_attn.q_proj.weight is dl.self_attn.q_proj.weight
        assert el.experts.down_proj is dl.experts.down_proj and el.router.per_expert_scale is dl.router.per_expert_scale
        assert el.layer_scalar is not dl.layer_scalar and torch.equal(el.layer_scalar, dl.layer_scalar)
    assert dec.embed_tokens.padding_idx == enc.embed_tokens.padding_idx == tc.pad_token_id
    return model


def trainable_params(model, name: str) -> list[tuple[str, torch.nn.Parameter]]:
    """(checkpoint name, parameter) for every trainable text parameter, sorted by checkpoint name.

    named_parameters lists each tied tensor once, under the name registered first: the encoder's
    (`model.encoder.language_model.*`) for the shared text stack and the embedding. Each is reported under the
    decoder's checkpoint name, the one model.safetensors uses.
    """
    out = {}
    for n, p in model.named_parameters():
        if n.startswith(mdg.VISION_PREFIXES):
            continue
        if n.startswith("model.encoder.language_model."):
            ck = "model.decoder." + n[len("model.encoder.language_model.") :]
        elif n.startswith("model.decoder."):
            ck = n
        else:
            raise RuntimeError(f"unexpected parameter {n}")
        assert p.requires_grad and ck not in out, n
        out[ck] = p
    stored = load_file(str(REPO_ROOT / MODEL_ROOT / name / "model.safetensors"))
    expected = {k for k in stored if not k.endswith("layer_scalar")}
    assert set(out) == expected, set(out) ^ expected
    return sorted(out.items())


def make_batch(name: str, cfg, noise_seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    tc = cfg.text_config
    V, pad = tc.vocab_size, tc.pad_token_id
    src = load_file(str(REPO_ROOT / MODEL_ROOT / name / "batch.safetensors"))
    input_ids, attention_mask = src["input_ids"], src["attention_mask"]
    B, L = src["canvas_ids"].shape
    assert B >= 3 and L >= 4
    # Right-padded canvas: row 0 full, row 1 without its last 3 positions, the last row with only 2 real tokens.
    canvas_mask = torch.ones((B, L), dtype=torch.float32)
    canvas_mask[1, L - 3 :] = 0.0
    canvas_mask[B - 1, 2:] = 0.0
    canvas_ids = torch.where(canvas_mask > 0, src["canvas_ids"], torch.full_like(src["canvas_ids"], pad))
    # Uniform-state corruption (docs/training.md) with fixed t: u [B, L], then r [B, L], drawn for every position.
    diffusion_t = torch.tensor(DIFFUSION_T[:B], dtype=torch.float32)
    g = torch.Generator().manual_seed(noise_seed)
    u = torch.rand((B, L), generator=g, dtype=torch.float32)
    r = torch.randint(V, (B, L), generator=g, dtype=torch.int64)
    selected = (u < diffusion_t[:, None]) & (canvas_mask == 1)
    noisy_canvas_ids = torch.where(selected, r, canvas_ids)
    valid = canvas_mask == 1
    assert torch.equal(noisy_canvas_ids[~valid], canvas_ids[~valid])
    same = (noisy_canvas_ids == canvas_ids) & valid
    diff = (noisy_canvas_ids != canvas_ids) & valid
    assert same.any() and diff.any(), "the noisy canvas must keep some ids and change others"
    batch = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=src["position_ids"],
        canvas_ids=canvas_ids,
        canvas_mask=canvas_mask,
        noisy_canvas_ids=noisy_canvas_ids,
        diffusion_t=diffusion_t,
        self_conditioning_mask=torch.tensor(SC_MASK[:B], dtype=torch.float32),
    )
    info = dict(
        source=f"{MODEL_ROOT}/{name}/batch.safetensors (input_ids, attention_mask, position_ids, canvas_ids)",
        batch_size=B,
        prompt_width=int(input_ids.shape[1]),
        prompt_lengths=attention_mask.sum(1).tolist(),
        canvas_length=L,
        canvas_lengths=canvas_mask.sum(1).to(torch.int64).tolist(),
        diffusion_t=DIFFUSION_T[:B],
        self_conditioning_mask=SC_MASK[:B],
        noise_seed=noise_seed,
        noise_draws="g = torch.Generator().manual_seed(noise_seed); u = torch.rand((B, L), generator=g); "
        "r = torch.randint(V, (B, L), generator=g); noisy = where((u < t[:, None]) & (canvas_mask == 1), r, canvas_ids)",
        corrupted_positions_per_row=selected.sum(1).tolist(),
        changed_positions_per_row=diff.sum(1).tolist(),
        selected_but_unchanged=int((selected & same).sum()),
        valid_canvas_tokens_equal_to_pad_id=int(((canvas_ids == pad) & valid).sum()),
        noisy_ids_equal_to_pad_id_at_valid_positions=int(((noisy_canvas_ids == pad) & valid).sum()),
    )
    return batch, info


# ------------------------------------------------------------------------------------------------------------------
# The objective
# ------------------------------------------------------------------------------------------------------------------


class PrefixCache(DynamicCache):
    """The DynamicCache of the K/V pass (built from the text config, so sliding layers keep W-1 slots).

    It keeps the K/V tensors each encoder layer produced and retains their gradients, so the gradient that reaches the
    encoder through the prefix K/V can be measured. With detach=True the decoder reads detached copies instead (the
    encoder's own attention still uses the attached ones): the difference of the two gradients is the K/V path.
    """

    def __init__(self, *args, detach: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.detach_prefix = detach
        self.produced: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if key_states.requires_grad:
            key_states.retain_grad()
            value_states.retain_grad()
        self.produced[layer_idx] = (key_states, value_states)
        out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if self.detach_prefix:
            layer = self.layers[layer_idx]
            layer.keys, layer.values = layer.keys.detach(), layer.values.detach()
        return out


class RouterProbe:
    """Records every router call (probabilities and chosen experts), labelled with the current pass."""

    def __init__(self, model):
        self.phase = ""
        self.calls: list[tuple[str, str, int, torch.Tensor, torch.Tensor]] = []
        self.handles = []
        for part, layers in (("encoder", model.model.encoder.language_model.layers), ("decoder", model.model.decoder.layers)):
            for i, layer in enumerate(layers):
                self.handles.append(layer.router.register_forward_hook(self._hook(part, i)))

    def _hook(self, part, i):
        def fn(module, inputs, outputs):
            probs, _w, idx = outputs
            self.calls.append((self.phase, part, i, probs.detach().clone(), idx.detach().clone()))

        return fn

    def remove(self):
        for h in self.handles:
            h.remove()


class RouterAux:
    """Keeps the router outputs (with their autograd graph) of the calls that carry the load-balancing loss.

    Only calls made while `phase` is set are kept: the objective sets "pass2" for pass 2 (the encoder K/V pass over the
    prompt and the decoder) and "clean" for the clean encoder pass, never for pass 1 (no_grad). Each call is labelled
    with its phase and part (encoder or decoder), which select its real-token weights (`aux_token_weights`).
    """

    def __init__(self, model):
        self.phase = ""
        self.calls: list[tuple[str, str, torch.Tensor, torch.Tensor]] = []
        self.handles = []
        for part, layers in (("encoder", model.model.encoder.language_model.layers), ("decoder", model.model.decoder.layers)):
            for layer in layers:  # distinct router modules with tied parameters
                self.handles.append(layer.router.register_forward_hook(self._hook(part)))

    def _hook(self, part):
        def fn(module, inputs, outputs):
            if self.phase:
                probs, _w, idx = outputs  # router_probabilities [T, E] (softmax over all experts), top_k_index [T, k]
                self.calls.append((self.phase, part, probs, idx))

        return fn

    def remove(self):
        for h in self.handles:
            h.remove()


def aux_token_weights(phase: str, part: str, batch, n: int) -> torch.Tensor:
    """w_t of a load-balancing call: 1 for a real token, 0 for padding (tokens in HF's [B*S] row-major order).

    K/V pass: attention_mask; clean pass: cat(attention_mask, canvas_mask > 0); decoder: 1 on every canvas position
    (canvas pads are real decoder queries)."""
    if part == "decoder":
        w = torch.ones(n, dtype=torch.bool)
    elif phase == "clean":
        w = torch.cat([batch["attention_mask"].bool(), batch["canvas_mask"] > 0], dim=1).reshape(-1)
    else:
        assert phase == "pass2", phase
        w = batch["attention_mask"].reshape(-1).bool()
    assert w.shape == (n,), (w.shape, n)
    return w


def load_balancing_loss(probs: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """(E / k) / T_real^2 * sum_e P_e c_e over the call's real tokens (w_t = 1; padding has w_t = 0), with
    T_real = max(sum_t w_t, 1), P_e = sum_t w_t p_te (differentiable) and c_e = sum_t w_t #{j : idx[t, j] == e}
    (a discrete count, no gradient). This is dgemma's loadBalancingLoss."""
    T = probs.shape[0]
    assert probs.shape == (T, num_experts) and idx.shape == (T, top_k) and w.shape == (T,)
    wt = w.to(probs.dtype)
    mass = (probs * wt[:, None]).sum(0)
    counts = torch.bincount(idx.reshape(-1), weights=wt[:, None].expand(T, top_k).reshape(-1), minlength=num_experts)
    real = max(wt.sum().item(), 1.0)
    return (mass * counts.to(probs.dtype)).sum() * ((num_experts / top_k) / (real * real))


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(x / cap) * cap  # HF's order: / cap, tanh, * cap


def decoder_logits(model, batch, *, sc_logits=None, sc_mask=None, cache=None) -> torch.Tensor:
    """DiffusionGemmaForBlockDiffusion.forward with the arguments generate() uses, in the model's dtype.

    HF's forward casts the head output to float32; applying lm_head and the soft-cap here keeps float64 in float64.
    In float32 the result is bit-identical to `model(...).logits` (checked in `check_head_matches_hf`).
    """
    am = batch["attention_mask"]
    L = batch["noisy_canvas_ids"].shape[1]
    out = model.model(
        input_ids=batch["input_ids"],
        attention_mask=am,
        position_ids=None,  # HF default arange(P), pads included (== batch position_ids)
        decoder_input_ids=batch["noisy_canvas_ids"],
        decoder_attention_mask=F.pad(am.bool(), (0, L), value=True),  # what generate() passes
        self_conditioning_logits=sc_logits,
        self_conditioning_mask=sc_mask,
        cache=cache,
    )
    return softcap(model.lm_head(out.last_hidden_state), model.final_logit_softcapping)


def clean_encoder_logits(model, batch, *, ids=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The separate clean encoder pass of docs/training.md, "Encoder loss" over prompt ++ x0, with a fresh cache.

    Returns (logits at positions [P-1, P+L-1), final-normed hidden states [B, P+L, H]).
    """
    P = batch["input_ids"].shape[1]
    L = batch["canvas_ids"].shape[1]
    clean_ids = torch.cat([batch["input_ids"], batch["canvas_ids"]], dim=1) if ids is None else ids
    clean_mask = torch.cat([batch["attention_mask"], batch["canvas_mask"].to(torch.int64)], dim=1)
    out = model.model.encoder(
        input_ids=clean_ids,
        attention_mask=clean_mask,
        position_ids=torch.arange(P + L, dtype=torch.int64).unsqueeze(0),
        cache=DynamicCache(config=model.config.text_config),
    )
    h = out.last_hidden_state
    return softcap(model.lm_head(h[:, P - 1 : P + L - 1]), model.final_logit_softcapping), h


def per_example_loss(f: torch.Tensor, batch, case: Case) -> torch.Tensor:
    dt = f.dtype
    x0, xt = batch["canvas_ids"], batch["noisy_canvas_ids"]
    M = batch["canvas_mask"].to(dt)
    t = batch["diffusion_t"].to(dt)
    K = f.shape[-1]
    alpha = 1.0 - t
    z = f
    if case.loo:
        assert int(xt.max()) < K
        delta = torch.log(1.0 + K * alpha / torch.clamp(1.0 - alpha, min=1e-12))
        z = f + delta[:, None, None] * F.one_hot(xt, K).to(dt)
    ce = -torch.log_softmax(z, dim=-1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    w = 1.0 / torch.clamp(alpha, min=1e-12) if case.reweighted else torch.ones_like(t)
    if case.clip is not None:
        w = torch.clamp(w, max=case.clip)
    return w * (M * ce).sum(-1) / torch.clamp(M.sum(-1), min=1.0)


def encoder_loss(model, batch) -> torch.Tensor:
    logits_e, _ = clean_encoder_logits(model, batch)
    M = batch["canvas_mask"].to(logits_e.dtype)
    ce = -torch.log_softmax(logits_e, dim=-1).gather(-1, batch["canvas_ids"].unsqueeze(-1)).squeeze(-1)
    return (M * ce).sum() / torch.clamp(M.sum(), min=1.0)


def objective(
    model, batch, case: Case, *, cache=None, probe: RouterProbe | None = None, pass1_logits=None
) -> dict[str, torch.Tensor]:
    """The micro-batch objective. pass1_logits (finite-difference check only) replaces pass 1's result."""
    aux = RouterAux(model) if case.aux > 0 else None
    try:
        return _objective(model, batch, case, cache=cache, probe=probe, pass1_logits=pass1_logits, aux=aux)
    finally:
        if aux is not None:
            aux.remove()


def _objective(model, batch, case: Case, *, cache, probe, pass1_logits, aux: RouterAux | None) -> dict[str, torch.Tensor]:
    B = batch["input_ids"].shape[0]
    sc_logits = sc_mask = None
    if case.sc:
        if probe is not None:
            probe.phase = "pass1"
        with torch.no_grad():
            sc_logits = decoder_logits(model, batch).detach() if pass1_logits is None else pass1_logits
        sc_mask = batch["self_conditioning_mask"].bool()
    if probe is not None:
        probe.phase = "pass2"
    if aux is not None:
        aux.phase = "pass2"  # from here on: pass 2 (K/V pass + decoder), then the clean encoder pass
    f = decoder_logits(model, batch, sc_logits=sc_logits, sc_mask=sc_mask, cache=cache)
    ell = per_example_loss(f, batch, case)
    decoder_sum = ell.sum()
    res = dict(diffusion_loss_per_example=ell, diffusion_loss=decoder_sum / B)
    total = DEC_W * decoder_sum
    if case.enc_w > 0:
        if probe is not None:
            probe.phase = "clean"
        if aux is not None:
            aux.phase = "clean"
        enc = encoder_loss(model, batch)
        res["encoder_loss"] = enc
        total = total + case.enc_w * enc * B
    res["loss"] = total / B
    if aux is not None:
        tc = model.config.text_config
        n_layers = tc.num_hidden_layers
        assert len(aux.calls) == (3 if case.enc_w > 0 else 2) * n_layers, len(aux.calls)
        weights = [aux_token_weights(ph, part, batch, p.shape[0]) for ph, part, p, _i in aux.calls]
        terms = [load_balancing_loss(p, i, w, tc.num_experts, tc.top_k_experts) for (_ph, _part, p, i), w in zip(aux.calls, weights)]
        res["router_aux_loss"] = torch.stack(terms).sum()
        res["router_aux_loss_per_call"] = torch.stack(terms).detach()
        res["router_aux_tokens_per_call"] = torch.tensor([int(w.sum()) for w in weights], dtype=torch.int64)
        res["loss"] = res["loss"] + case.aux * res["router_aux_loss"]
    return res


def run_with_grad(model, params, batch, case, *, detach_prefix=False, probe=None):
    model.zero_grad(set_to_none=True)
    cache = PrefixCache(config=model.config.text_config, detach=detach_prefix)
    res = objective(model, batch, case, cache=cache, probe=probe)
    res["loss"].backward()
    grads = {}
    for ck, p in params:
        grads[ck] = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
    kv_grad = {}
    for li, (k, v) in sorted(cache.produced.items()):
        kv_grad[li] = (
            0.0 if k.grad is None else k.grad.norm().item(),
            0.0 if v.grad is None else v.grad.norm().item(),
        )
    none_grads = [ck for ck, p in params if p.grad is None]
    model.zero_grad(set_to_none=True)
    return {k: v.detach() for k, v in res.items()}, grads, kv_grad, none_grads


# ------------------------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------------------------


def check_head_matches_hf(model32, batch) -> None:
    """In float32, lm_head + soft-cap applied here equals HF's own `.logits` bit for bit."""
    L = batch["noisy_canvas_ids"].shape[1]
    with torch.no_grad():
        ours = decoder_logits(model32, batch)
        hf = model32(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["noisy_canvas_ids"],
            decoder_attention_mask=F.pad(batch["attention_mask"].bool(), (0, L), value=True),
        ).logits
    assert torch.equal(ours, hf), "decoder_logits differs from DiffusionGemmaForBlockDiffusion.logits"


def check_float64_everywhere(model64, batch, case) -> dict:
    """Inside float64_islands, every floating output of every text module is float64."""
    bad = []
    handles = []

    def hook(mod, inputs, outputs, name=None):
        outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        for o in outs:
            if isinstance(o, torch.Tensor) and o.is_floating_point() and o.dtype != torch.float64:
                bad.append((name, str(o.dtype)))

    for n, m in model64.named_modules():
        if n.startswith(("model.encoder.vision_tower", "model.encoder.embed_vision")):
            continue
        handles.append(m.register_forward_hook(lambda mod, i, o, n=n: hook(mod, i, o, n)))
    try:
        with torch.no_grad():
            res = objective(model64, batch, case)
    finally:
        for h in handles:
            h.remove()
    assert not bad, f"float32 outputs in the float64 run: {sorted(set(bad))[:10]}"
    assert all(v.dtype == torch.float64 for v in res.values())
    return dict(all_module_outputs_float64=True)


def check_clean_pass_masks(model64, batch) -> dict:
    """The clean encoder pass masks its pads (left prompt pads and right canvas pads) and, at the real prompt
    positions, reproduces the K/V pass's encoder hidden states (same causal/sliding masks)."""
    P = batch["input_ids"].shape[1]
    am = batch["attention_mask"].bool()
    clean_valid = torch.cat([am, batch["canvas_mask"] > 0], dim=1)
    with torch.no_grad():
        logits_e, h = clean_encoder_logits(model64, batch)
        enc_kv = model64.model.encoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], cache=DynamicCache(config=model64.config.text_config)
        ).last_hidden_state
        # the K/V pass's hidden states at real prompt positions
        d_prefix = ((h[:, :P][am] - enc_kv[am]).abs().max() / enc_kv[am].abs().max()).item()
        # replace every pad id (mask 0) by other ids: scored logits must not move
        g = torch.Generator().manual_seed(7)
        ids = torch.cat([batch["input_ids"], batch["canvas_ids"]], dim=1)
        V = model64.config.text_config.vocab_size
        repl = torch.randint(3, V, ids.shape, generator=g)
        ids2 = torch.where(clean_valid, ids, repl)
        assert not torch.equal(ids, ids2)
        logits_e2, _ = clean_encoder_logits(model64, batch, ids=ids2)
        M = batch["canvas_mask"] > 0
        d_pad = ((logits_e2[M] - logits_e[M]).abs().max() / logits_e[M].abs().max()).item()
        enc0 = encoder_loss(model64, batch).item()
        # the unmasked alternative (no attention_mask at all) does change the scored logits where a prompt is padded
        L = batch["canvas_ids"].shape[1]
        out = model64.model.encoder(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(P + L).unsqueeze(0),
            cache=DynamicCache(config=model64.config.text_config),
        )
        lu = softcap(model64.lm_head(out.last_hidden_state[:, P - 1 : P + L - 1]), model64.final_logit_softcapping)
        d_unmasked = ((lu[M] - logits_e[M]).abs().max() / logits_e[M].abs().max()).item()
    assert d_prefix <= 1e-12, f"clean pass prompt hidden differs from the K/V pass ({d_prefix:.3g})"
    assert d_pad <= 1e-12, f"changing pad ids changes the encoder-loss logits ({d_pad:.3g})"
    assert d_unmasked > 1e-3, f"the attention mask makes no difference in the clean pass ({d_unmasked:.3g})"
    return dict(
        prompt_hidden_vs_kv_pass_rel=float(f"{d_prefix:.3g}"),
        pad_ids_changed_scored_logits_rel=float(f"{d_pad:.3g}"),
        without_attention_mask_scored_logits_rel_diff=float(f"{d_unmasked:.3g}"),
        encoder_loss_float64=enc0,
    )


def fd_check(model64, params, batch, case, grads64, seed: int, pad_id: int) -> dict:
    """Central finite difference of the float64 loss along a random direction vs the autograd gradient.

    The direction leaves the pad row of the embedding alone: with padding_idx, HF's gradient of that row omits the
    lookups on purpose, so it is not the derivative of the forward function.
    """
    g = torch.Generator().manual_seed(seed)
    dirs, saved = {}, {}
    for ck, p in params:
        rms = p.detach().pow(2).mean().sqrt().item()
        dirs[ck] = torch.randn(p.shape, generator=g, dtype=torch.float64) * (rms if rms > 0 else 1.0)
        if ck == "model.decoder.embed_tokens.weight":
            dirs[ck][pad_id] = 0.0
        saved[ck] = p.detach().clone()
    analytic = sum((grads64[ck] * dirs[ck]).sum().item() for ck, _ in params)
    vals = []
    with torch.no_grad():
        # Pass 1 is a stop-gradient: its logits stay those of the unperturbed parameters.
        f1 = decoder_logits(model64, batch) if case.sc else None
        for sign in (1.0, -1.0):
            for ck, p in params:
                p.copy_(saved[ck] + sign * FD_EPS * dirs[ck])
            vals.append(objective(model64, batch, case, pass1_logits=f1)["loss"].item())
        for ck, p in params:
            p.copy_(saved[ck])
    numeric = (vals[0] - vals[1]) / (2 * FD_EPS)
    rel = abs(numeric - analytic) / max(abs(analytic), 1e-300)
    return dict(eps=FD_EPS, directional_derivative=analytic, finite_difference=numeric, rel_err=float(f"{rel:.3g}"))


def _relevant_tokens(phase: str, part: str, batch, n: int) -> torch.Tensor:
    """Tokens whose routing influences the loss: real prompt tokens in the K/V pass, every canvas token in the
    decoder (canvas pads are attended as keys), and the real tokens of the clean encoder pass."""
    if part == "decoder":
        return torch.ones(n, dtype=torch.bool)
    if phase == "clean":
        return torch.cat([batch["attention_mask"].bool(), batch["canvas_mask"] > 0], dim=1).reshape(-1)
    return batch["attention_mask"].reshape(-1).bool()


def router_gaps(calls, batch, top_k) -> dict[str, float]:
    """Smallest top-k margin (k-th minus (k+1)-th router probability) per pass, over the relevant tokens."""
    gaps: dict[str, float] = {}
    for ph, part, _li, probs, _idx in calls:
        rel = _relevant_tokens(ph, part, batch, probs.shape[0])
        sp = probs.sort(dim=-1, descending=True).values
        gap = (sp[:, top_k - 1] - sp[:, top_k])[rel].min().item()
        key = f"{ph}.{part}"
        gaps[key] = min(gaps.get(key, math.inf), gap)
    return gaps


def router_summary(calls64, calls32, batch, top_k, num_experts) -> dict:
    """Smallest top-k margin on every token whose routing matters, and fp32-vs-fp64 routing agreement."""
    if top_k >= num_experts:
        return dict(all_experts_always_chosen=True)
    mismatched = 0
    assert len(calls64) == len(calls32)
    for (ph, part, li, _p, idx), (ph32, part32, li32, _p32, idx32) in zip(calls64, calls32):
        assert (ph, part, li) == (ph32, part32, li32)
        rel = _relevant_tokens(ph, part, batch, idx.shape[0])
        mismatched += int((idx[rel].sort(dim=-1).values != idx32[rel].sort(dim=-1).values).any(-1).sum())
    out = {k: float(f"{v:.3g}") for k, v in sorted(router_gaps(calls64, batch, top_k).items())}
    return dict(min_topk_gap_by_pass=out, min_topk_gap=min(out.values()), fp32_fp64_routing_mismatches=mismatched)


def choose_noise_seed(name, model64, cfg, log) -> tuple[int, list[dict]]:
    """The first noise seed from NOISE_SEED[name] on whose batch every relevant token of every case has a top-k
    router margin of at least MIN_ROUTER_GAP (float64), so that a float32 port picks the same experts."""
    tc = cfg.text_config
    seed, tried = NOISE_SEED[name], []
    if tc.top_k_experts >= tc.num_experts:
        return seed, tried
    for _ in range(50):
        batch, _ = make_batch(name, cfg, seed)
        probe = RouterProbe(model64)
        with float64_islands(collections.Counter()), torch.no_grad():
            for case in CASES[name]:
                objective(model64, batch, case, probe=probe)
        probe.remove()
        gap = min(router_gaps(probe.calls, batch, tc.top_k_experts).values())
        tried.append(dict(noise_seed=seed, min_topk_gap=float(f"{gap:.3g}")))
        if gap >= MIN_ROUTER_GAP:
            return seed, tried
        log(f"  [{name}] noise seed {seed}: router top-k gap {gap:.3g} < {MIN_ROUTER_GAP:g}, trying the next seed")
        seed += 1
    raise RuntimeError(f"{name}: no noise seed with router gap >= {MIN_ROUTER_GAP}")


# ------------------------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------------------------


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def write_model(name: str, out_dir: Path, log) -> dict:
    model64 = load_model(name, torch.float64)
    model32 = load_model(name, torch.float32)
    cfg = model64.config
    tc = cfg.text_config
    params64 = trainable_params(model64, name)
    params32 = trainable_params(model32, name)
    noise_seed, seeds_tried = choose_noise_seed(name, model64, cfg, log)
    batch, batch_info = make_batch(name, cfg, noise_seed)
    batch_info["noise_seeds_tried"] = seeds_tried
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in batch.items()}, str(d / "batch.safetensors"), metadata={"format": "pt"})

    check_head_matches_hf(model32, batch)
    counts: collections.Counter = collections.Counter()
    model_checks: dict = {"float32_head_bit_identical_to_hf_logits": True}
    cases_meta = []
    per_example: dict[str, torch.Tensor] = {}
    case_results: dict[str, tuple[dict, dict]] = {}

    for ci, case in enumerate(CASES[name]):
        log(f"  [{name}] {case.name}")
        with float64_islands(counts):
            if ci == 0:
                model_checks["float64_evaluation"] = check_float64_everywhere(model64, batch, case)
                model_checks["clean_encoder_pass"] = check_clean_pass_masks(model64, batch)
            probe64 = RouterProbe(model64)
            res64, g64, kv_grad, none64 = run_with_grad(model64, params64, batch, case, probe=probe64)
            probe64.remove()
            _, g64_det, _, _ = run_with_grad(model64, params64, batch, case, detach_prefix=True)
            fd = fd_check(model64, params64, batch, case, g64, seed=5000 + ci, pad_id=tc.pad_token_id)
            if ci == 0:
                # HF's padding_idx: the pad row of the (tied) embedding gets no gradient from lookups.
                embs = (model64.model.decoder.embed_tokens, model64.model.encoder.language_model.embed_tokens)
                for e in embs:
                    e.padding_idx = None
                _, g_nopad, _, _ = run_with_grad(model64, params64, batch, case)
                for e in embs:
                    e.padding_idx = tc.pad_token_id
        probe32 = RouterProbe(model32)
        res32, g32, _, _ = run_with_grad(model32, params32, batch, case, probe=probe32)
        probe32.remove()
        assert fd["rel_err"] <= FD_TOL, f"{name} {case.name}: finite-difference check {fd}"

        # --- encoder side: the decoder loss reaches the encoder through the prefix K/V
        tot = math.sqrt(sum(g64[k].pow(2).sum().item() for k in g64))
        kv_path = math.sqrt(sum((g64[k] - g64_det[k]).pow(2).sum().item() for k in g64))
        assert kv_path / tot > 1e-3, f"{name} {case.name}: no gradient through the prefix K/V ({kv_path / tot:.3g})"
        for li, (gk, gv) in kv_grad.items():
            assert gk > 0 and gv > 0, f"{name} {case.name}: zero gradient at encoder layer {li} K/V"
        # --- fp32 vs fp64
        g_rel, worst_name = 0.0, None
        zero_in_64 = []
        num = den = 0.0
        for k in g64:
            n64 = g64[k].norm().item()
            diff = (g32[k].double() - g64[k]).norm().item()
            num += diff**2
            den += n64**2
            if n64 == 0.0:
                zero_in_64.append(k)
                assert g32[k].abs().max().item() == 0.0, f"{k}: zero in fp64 but not in fp32"
                continue
            if diff / n64 > g_rel:
                g_rel, worst_name = diff / n64, k
        if case.sc:
            assert not zero_in_64, zero_in_64
        else:
            # without self-conditioning the self-conditioning MLP runs on an all-zero signal: exactly zero gradient
            assert zero_in_64 and all(".self_conditioning." in k for k in zero_in_64), zero_in_64
        assert not none64, none64

        out = {
            "loss": res64["loss"].reshape(1),
            "diffusion_loss": res64["diffusion_loss"].reshape(1),
            "diffusion_loss_per_example": res64["diffusion_loss_per_example"].contiguous(),
        }
        if "encoder_loss" in res64:
            out["encoder_loss"] = res64["encoder_loss"].reshape(1)
        if "router_aux_loss" in res64:
            out["router_aux_loss"] = res64["router_aux_loss"].reshape(1)
        for k, v in g64.items():
            out[f"grad/{k}"] = v.to(torch.float32).contiguous()
        save_file(out, str(d / f"{case.name}.safetensors"), metadata={"format": "pt"})
        per_example[case.name] = res64["diffusion_loss_per_example"]
        case_results[case.name] = (res64, g64)

        cm = dict(
            file=f"{case.name}.safetensors",
            settings=case.settings(),
            loss=res64["loss"].item(),
            diffusion_loss=res64["diffusion_loss"].item(),
            encoder_loss=res64["encoder_loss"].item() if "encoder_loss" in res64 else None,
            diffusion_loss_per_example=res64["diffusion_loss_per_example"].tolist(),
            example_weights=[
                min(1.0 / max(1.0 - t, 1e-12), case.clip if case.clip is not None else math.inf) if case.reweighted else 1.0
                for t in batch["diffusion_t"].double().tolist()
            ],
            fp32_vs_fp64=dict(
                loss_rel_err=float(f"{rel(res32['loss'].item(), res64['loss'].item()):.3g}"),
                diffusion_loss_rel_err=float(f"{rel(res32['diffusion_loss'].item(), res64['diffusion_loss'].item()):.3g}"),
                encoder_loss_rel_err=(
                    float(f"{rel(res32['encoder_loss'].item(), res64['encoder_loss'].item()):.3g}")
                    if "encoder_loss" in res64
                    else None
                ),
                grad_max_param_rel_l2=float(f"{g_rel:.3g}"),
                grad_max_param=worst_name,
                grad_global_rel_l2=float(f"{math.sqrt(num / den):.3g}"),
            ),
            grad_global_norm=float(f"{tot:.6g}"),
            params_with_exactly_zero_grad=zero_in_64,
            encoder_side=dict(
                prefix_kv_path_grad_rel=float(f"{kv_path / tot:.3g}"),
                prefix_kv_grad_norm_per_layer={str(li): [float(f"{gk:.3g}"), float(f"{gv:.3g}")] for li, (gk, gv) in kv_grad.items()},
            ),
            finite_difference=fd,
            router=router_summary(probe64.calls, probe32.calls, batch, tc.top_k_experts, tc.num_experts),
        )
        if ci == 0:
            emb = "model.decoder.embed_tokens.weight"
            pad = tc.pad_token_id
            others = torch.ones(tc.vocab_size, dtype=torch.bool)
            others[pad] = False
            model_checks["pad_row_gradient"] = dict(
                case=case.name,
                pad_row_grad_norm=float(f"{g64[emb][pad].norm().item():.3g}"),
                embedding_grad_norm=float(f"{g64[emb].norm().item():.3g}"),
                pad_row_change_without_padding_idx_rel_to_embedding_grad=float(
                    f"{(g_nopad[emb][pad] - g64[emb][pad]).norm().item() / g64[emb].norm().item():.3g}"
                ),
                pad_row_change_without_padding_idx_rel=float(
                    f"{(g_nopad[emb][pad] - g64[emb][pad]).norm().item() / g64[emb][pad].norm().item():.3g}"
                ),
                other_rows_change_without_padding_idx_rel=float(
                    f"{(g_nopad[emb][others] - g64[emb][others]).norm().item() / g64[emb][others].norm().item():.3g}"
                ),
            )
            assert model_checks["pad_row_gradient"]["pad_row_change_without_padding_idx_rel"] > 1e-3
        if case.aux > 0:
            def run_without_aux(base: Case):
                with float64_islands(counts):
                    r0, g0, _, _ = run_with_grad(model64, params64, batch, base)
                return r0, g0

            cm["router_aux"] = aux_summary(case, res64, res32, g64, case_results, tc, run_without_aux)
        assert cm["router"].get("min_topk_gap", math.inf) >= MIN_ROUTER_GAP, cm["router"]
        assert cm["router"].get("fp32_fp64_routing_mismatches", 0) == 0, cm["router"]
        cases_meta.append(cm)
        log(
            f"    loss {cm['loss']:.12g}  diffusion {cm['diffusion_loss']:.12g}  encoder {cm['encoder_loss']}  "
            f"fp32 gaps: loss {cm['fp32_vs_fp64']['loss_rel_err']:.3g} grad {cm['fp32_vs_fp64']['grad_max_param_rel_l2']:.3g}"
            f"  fd {fd['rel_err']:.3g}  kv-path {kv_path / tot:.3g}"
            + (f"  aux {cm['router_aux']['router_aux_loss']:.17g}" if "router_aux" in cm else "")
        )

    for key in ("softmax", "tensor_softmax", "rmsnorm", "rope"):
        assert counts[key] > 0, f"float64 promotion of {key} never happened: {counts}"
    model_checks["objective_relations"] = relation_checks(per_example, batch)

    meta = dict(
        name=name,
        description=DESCRIPTIONS[name],
        generator=GENERATOR,
        model=f"{MODEL_ROOT}/{name} (config.json + model.safetensors; see its meta.json)",
        versions=dict(
            python=sys.version.split()[0],
            torch=torch.__version__,
            transformers=transformers.__version__,
            safetensors=__import__("safetensors").__version__,
        ),
        settings=dict(
            device="cpu",
            reference_dtype="float64 (model.double(), HF float32 islands evaluated in float64)",
            comparison_dtype="float32 (HF as is)",
            attn_implementation="eager",
            experts_implementation="eager",
            mkl_cbwr=os.environ.get("MKL_CBWR"),
            torch_num_threads=torch.get_num_threads(),
            deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
            model_mode="eval (attention_dropout 0, so identical to train mode)",
        ),
        vocab_size=tc.vocab_size,
        pad_token_id=tc.pad_token_id,
        batch=batch_info,
        cases=cases_meta,
        checks=model_checks,
        notes=notes_for(CASES[name]),
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def aux_summary(case: Case, res64, res32, g64, case_results, tc, run_without_aux) -> dict:
    """The router load-balancing term of an aux case, and its relation to the same case without it (taken from the
    written cases where that case is one of them, else evaluated here and not written)."""
    aux64 = res64["router_aux_loss"].item()
    per_call = res64["router_aux_loss_per_call"]
    out = dict(
        coefficient=case.aux,
        router_aux_loss=aux64,
        weighted=case.aux * aux64,
        calls=int(per_call.numel()),
        real_tokens_per_call=res64["router_aux_tokens_per_call"].tolist(),
        per_call=per_call.tolist(),
        fp32_vs_fp64_rel_err=float(f"{rel(res32['router_aux_loss'].item(), aux64):.3g}"),
    )
    if tc.top_k_experts >= tc.num_experts:
        # Every token picks every expert once, so c_e = T_real and the term is E / k * (sum_t w_t sum_e p_te) / T_real
        # = E / k.
        dev = (per_call - tc.num_experts / tc.top_k_experts).abs().max().item()
        assert dev <= 1e-14, dev
        out["all_experts_chosen_per_call_deviation_from_E_over_k"] = float(f"{dev:.3g}")
    base_case = dataclasses.replace(case, aux=0.0)
    base = base_case.name
    written = base in case_results
    r0, g0 = case_results[base] if written else run_without_aux(base_case)
    for key in ("diffusion_loss", "encoder_loss", "diffusion_loss_per_example"):
        if key in r0:
            assert torch.equal(r0[key], res64[key]), key  # the aux term leaves the other terms alone
    d = rel(res64["loss"].item() - r0["loss"].item(), case.aux * aux64)
    assert d <= 1e-9, d
    num = math.sqrt(sum((g64[k] - g0[k]).pow(2).sum().item() for k in g64))
    den = math.sqrt(sum(g0[k].pow(2).sum().item() for k in g0))
    per_param = {k: (g64[k] - g0[k]).norm().item() / g0[k].norm().item() for k in g64 if g0[k].norm().item() > 0}
    top = max(per_param, key=per_param.get)
    out["relative_to_case_without_aux"] = dict(
        case=base,
        case_written=written,
        other_terms_bit_identical=True,
        loss_difference_vs_weighted_aux_rel=float(f"{d:.3g}"),
        grad_change_global_rel_l2=float(f"{num / den:.3g}"),
        grad_change_max_param_rel_l2=float(f"{per_param[top]:.3g}"),
        grad_change_max_param=top,
    )
    if tc.top_k_experts < tc.num_experts:
        assert num / den > 1e-6, f"the aux term has no visible gradient ({num / den:.3g})"
    return out


def relation_checks(per_example: dict[str, torch.Tensor], batch) -> dict:
    """Cross-case relations of docs/training.md ("The four objectives", "Self-conditioning") on the float64
    per-example losses."""
    t = batch["diffusion_t"].double()
    w = 1.0 / (1.0 - t)
    out: dict = {}
    worst, checked = 0.0, False
    pairs = [("base-sft", "reweighted-ce"), ("loo-ce", "reweighted-loo-ce")]
    for plain, rw in pairs:
        for sc in (0, 1):
            for enc in (0, 1):
                a, b = f"{plain}.sc{sc}.enc{enc}", f"{rw}.sc{sc}.enc{enc}"
                if a in per_example and b in per_example:
                    r = ((per_example[b] - w * per_example[a]).abs() / (w * per_example[a]).abs()).max().item()
                    worst, checked = max(worst, r), True
                    half = (t == 0.5).nonzero().flatten().tolist()
                    for i in half:  # MB anchor: reweighted-ce is exactly twice base-sft at t = 0.5
                        assert per_example[b][i].item() == 2.0 * per_example[a][i].item(), (a, b, i)
    if checked:
        assert worst <= 1e-14, worst
        out["reweighted_equals_w_times_unweighted_rel_at_most"] = float(f"{worst:.3g}")
        out["reweighted_exactly_twice_unweighted_at_t_0.5"] = True
    # Rows with self-conditioning mask 0 in an sc1 case equal the sc0 case (the signal is exactly zero).
    off = (batch["self_conditioning_mask"] == 0).nonzero().flatten().tolist()
    on = (batch["self_conditioning_mask"] == 1).nonzero().flatten().tolist()
    worst_off, least_on = 0.0, math.inf
    for name1, v1 in per_example.items():
        name0 = name1.replace(".sc1.", ".sc0.")
        if ".sc1." in name1 and name0 in per_example:
            v0 = per_example[name0]
            worst_off = max(worst_off, max(abs(v1[i].item() - v0[i].item()) / abs(v0[i].item()) for i in off))
            least_on = min(least_on, min(abs(v1[i].item() - v0[i].item()) / abs(v0[i].item()) for i in on))
    if least_on < math.inf:
        assert worst_off <= 1e-12 and least_on > 1e-4, (worst_off, least_on)
        out["sc_mask_0_rows_equal_sc0_rel_at_most"] = float(f"{worst_off:.3g}")
        out["sc_mask_1_rows_differ_from_sc0_rel_at_least"] = float(f"{least_on:.3g}")
    # The encoder loss does not change the decoder term.
    worst_enc = 0.0
    for name1, v1 in per_example.items():
        name0 = name1.replace(".enc1", ".enc0")
        if ".enc1" in name1 and name0 in per_example:
            worst_enc = max(worst_enc, ((v1 - per_example[name0]).abs() / per_example[name0].abs()).max().item())
    if any(".enc0" in k for k in per_example):
        assert worst_enc <= 1e-12, worst_enc
        out["decoder_term_independent_of_enc_w_rel_at_most"] = float(f"{worst_enc:.3g}")
    return out


NOTES = [
    "Objective: Megatron Bridge definition (docs/training.md, 'The objective'). loss = (dec_w * sum_b l_b + enc_w * enc_loss * B) / B "
    "with dec_w = 1; diffusion_loss = sum_b l_b / B; encoder_loss = enc_loss (a token mean over the micro-batch). "
    "Router aux loss coefficient 0. Gradients are d loss / d theta (loss already divided by B).",
    "alpha = 1 - t, w(t) = 1 / max(alpha, 1e-12) (then min(w, clip) with a clip) and "
    "delta(t) = log(1 + K alpha / max(1 - alpha, 1e-12)) are computed in the working dtype from the float32 "
    "diffusion_t of batch.safetensors (0.9 is 0.89999998 there); K = vocab_size.",
    "Self-conditioning: pass 1 is a full no-grad forward on noisy_canvas_ids; pass 2 feeds its soft-capped logits "
    "(raw, no temperature) with self_conditioning_mask as a bool. sc0 cases pass no self-conditioning logits at all; "
    "the self-conditioning MLP then runs on an all-zero signal and its parameters get exactly zero gradient (listed "
    "per case under params_with_exactly_zero_grad; they are still written).",
    "Encoder loss: a separate model.model.encoder call over cat(input_ids, canvas_ids) with attention mask "
    "cat(attention_mask, canvas_mask), positions arange(P + L) and a fresh DynamicCache; logits of positions "
    "[P-1, P+L-1) through the tied lm_head and the soft-cap 30 tanh(x / 30); targets canvas_ids; weights canvas_mask.",
    "HF's encoder masks pads in that pass: DiffusionGemmaEncoderModel computes create_masks_for_generate and discards "
    "the result, but it hands the 2-D mask to DiffusionGemmaEncoderTextModel, which builds the causal and sliding masks "
    "with the padding mask. checks.clean_encoder_pass measures it.",
    "Gradients are saved under the decoder checkpoint names (model.decoder.*). HF ties the encoder text stack to the "
    "decoder stack and lm_head to embed_tokens, so each gradient is the sum over the K/V pass, the decoder pass, the "
    "clean encoder pass and the head. layer_scalar is a buffer and has no gradient.",
    "nn.Embedding(padding_idx=pad) (HF, and docs/training.md, 'Gradient paths'): lookups of the pad id give the pad row no gradient; it gets "
    "gradient only from the tied head and, with self-conditioning, from the soft embedding softmax(f1) @ E. "
    "checks.pad_row_gradient shows that ignoring padding_idx would change that row. The canvas pads (right padding, "
    "mask 0) are pad ids in the decoder input and are attended as keys, so they are lookups whose gradient is dropped.",
    "Float64 reference: model.double() alone still runs HF's float32 islands (RMSNorm, attention/router/"
    "self-conditioning softmax, RoPE, the float32 cast of the head output). The script evaluates those in float64 too "
    "(float64_islands in the script), so the reference is the same math in float64 throughout; all_module_outputs_"
    "float64 in checks.float64_evaluation confirms it. embed_scale keeps "
    "HF's value float32(sqrt(H)), the constant a float32 model multiplies by.",
    "fp32_vs_fp64 compares HF run in float32 as is (with its float32 islands) against the float64 reference: "
    "loss_rel_err = |L32 - L64| / |L64|; grad_max_param_rel_l2 = max over parameters with a nonzero gradient of "
    "||g32 - g64|| / ||g64||; grad_global_rel_l2 = ||g32 - g64|| / ||g64|| over all parameters together.",
    "encoder_side.prefix_kv_path_grad_rel = ||g - g_detached|| / ||g||, where g_detached is the gradient with the "
    "decoder reading detached prefix K/V: the part of the gradient that flows from the decoder loss into the encoder "
    "through the prefix K/V. prefix_kv_grad_norm_per_layer: ||d loss / d K||, ||d loss / d V|| of each encoder layer's "
    "K/V in the K/V pass.",
    "finite_difference: (L(theta + eps d) - L(theta - eps d)) / (2 eps) against g . d in float64, with d a random "
    "direction scaled by each parameter's RMS, zero on the pad row of the embedding (whose HF gradient omits the "
    "lookups by design, so it is not the derivative of the forward function) and with the pass-1 logits held at their "
    "unperturbed value (pass 1 is a stop-gradient).",
]


AUX_NOTE = (
    "Router load-balancing loss (cases named .aux<a>, a = moe_aux_loss_coeff; dgemma's loadBalancingLoss, "
    "docs/training.md, 'Router aux loss'): loss += a * sum over router calls of (E / k) / T_real^2 * sum_e P_e c_e. The calls are those of "
    "pass 2 (the encoder K/V pass over the prompt, then the decoder) and of the clean encoder pass, in that order; never "
    "pass 1 (no_grad). Padding does not count: w_t = 1 for a real token and 0 for padding, with w = attention_mask in "
    "the K/V pass, w = cat(attention_mask, canvas_mask > 0) in the clean pass and w = 1 on every canvas position in the "
    "decoder (canvas pads are real decoder queries). T_real = max(sum_t w_t, 1), P_e = sum_t w_t p_te with p = the "
    "router's softmax over all experts (HF's router_probabilities, captured by forward hooks with its graph), c_e = "
    "sum_t w_t #{j : top_k_index[t, j] == e} (a count, no gradient). diffusion_loss and encoder_loss do not include it; "
    "router_aux_loss (file and meta) is the unweighted sum. With top_k == num_experts every call's term is E / k = 1 "
    "and its gradient is zero."
)


def notes_for(cases: list[Case]) -> list[str]:
    """NOTES, plus the router aux note where a model has an aux case (the other models' meta.json stay as they were)."""
    if not any(c.aux > 0 for c in cases):
        return NOTES
    first = NOTES[0].replace("Router aux loss coefficient 0.", "Router aux loss coefficient 0 except in .aux<a> cases.")
    assert first != NOTES[0]
    return [first, *NOTES[1:], AUX_NOTE]


# ------------------------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="fixture root, relative to the repo root")
    ap.add_argument("--only", action="append", choices=sorted(CASES), help="model(s) to build (default: all)")
    ap.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and compare byte-for-byte with --out-dir (writes nothing)",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    mdg.set_determinism()
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    names = args.only or list(CASES)
    out_dir = args.out_dir if args.out_dir.is_absolute() else REPO_ROOT / args.out_dir
    log(f"torch {torch.__version__}, transformers {transformers.__version__}")

    if args.check:
        ok = True
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                write_model(name, Path(tmp), log)
                produced = sorted(os.listdir(Path(tmp) / name))
                existing = sorted(os.listdir(out_dir / name)) if (out_dir / name).is_dir() else []
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
        size = sum(p.stat().st_size for p in (out_dir / name).iterdir())
        log(f"  wrote {name}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
