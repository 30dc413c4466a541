#!/usr/bin/env python3
"""Generate DiffusionGemma parity fixtures from the HuggingFace transformers implementation.

Reference-data generation only: this script is not run by CI. It builds tiny random DiffusionGemma text models
(no vision tower), runs them through `transformers` in fp32 with eager attention on the CPU, and writes, for each
fixture, a directory under test/fixtures/diffusion_gemma/<name>/:

    config.json              HF config as written by save_pretrained (vision_config replaced by null, see README)
    generation_config.json   as written by save_pretrained
    model.safetensors        random fp32 weights under the HF checkpoint names (vision tensors removed)
    batch.safetensors        inputs under the field names of docs/cli.md
    expected.safetensors     reference outputs (names and layouts: tools/reference/README.md)
    meta.json                seeds, shapes, what the fixture exercises, measured margins
    config_legacy.json       (seven_layers only) the same model in the older global_head_dim form

Besides writing, the script checks its own outputs:
  * an independent fp32 re-implementation of docs/model.md (function `spec_forward`, which reads only
    config.json and model.safetensors) must match HF to max|d|/max|ref| <= 1e-5 on every compared tensor;
  * reloading the written fixture with `from_pretrained` and rerunning reproduces expected.safetensors bit for bit;
  * HF's fp32 logits are within 5e-6 (relative) of the same math evaluated in fp64 (the fixture is well conditioned);
  * changing the ids of left-pad tokens does not change any non-pad output (beyond last-bit MoE rounding, <= 1e-5);
  * the sliding window really truncates (encoder receptive field; decoder prefix trim changes the logits);
  * logits with and without self-conditioning differ, and a per-example self-conditioning mask of 0 (1) reproduces
    that row of the no-self-conditioning (self-conditioning) logits;
  * the router top-k choice has a margin (k-th minus (k+1)-th probability) of at least --min-router-gap on every
    non-pad token, so an fp32 port with a different summation order picks the same experts.

Usage (from the repository root):
    python3 tools/reference/make_diffusion_gemma_fixtures.py             # (re)write all fixtures
    python3 tools/reference/make_diffusion_gemma_fixtures.py --check     # regenerate in a temp dir, compare bytes
    python3 tools/reference/make_diffusion_gemma_fixtures.py --only seven_layers
"""

from __future__ import annotations

import argparse
import copy
import filecmp
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU only, even where a GPU exists
# MKL's conditional numerical reproducibility: without it, sgemm results depend on the memory alignment of the
# operands (two identical models at different addresses gave logits differing in the last bits). COMPATIBLE picks
# the same SSE2 code path on every x86 CPU, so a --check on another machine can also be bit-exact.
os.environ.setdefault("MKL_CBWR", "COMPATIBLE,STRICT")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DynamicCache  # noqa: E402
from transformers.models.diffusion_gemma import modeling_diffusion_gemma as hf_dg  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("test/fixtures/diffusion_gemma")
VERSIONS_JSON = Path("tools/reference/versions.json")
REL_TOL = 1e-5  # the parity bound the C++ tests use: max|d| / max|ref|

# A tiny vision tower, only so that HF can instantiate the model. None of its tensors are written: HF turns
# `vision_config=None` into the full default Gemma 4 vision config, so a vision tower always exists in HF.
TINY_VISION = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=16,
    patch_size=4,
    position_embedding_size=8,
)
VISION_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")

# ------------------------------------------------------------------------------------------------------------------
# Fixture definitions
# ------------------------------------------------------------------------------------------------------------------

FIXTURES: dict[str, dict] = {
    # The text part of tests/models/diffusion_gemma/test_modeling_diffusion_gemma.py (DiffusionGemmaVisionText2TextModelTester),
    # verbatim, including the fields HF ignores (hidden_act, moe_num_shared_experts, mm_tokens_per_image,
    # self_conditioning_size). The sliding layer keeps the class-default head_dim 256.
    "hf_tester": dict(
        description=(
            "Text part of the HF test's tiny config (docs/model.md, 'Tiny configs'): vocab 99, hidden 32, 2 layers [sliding, full], "
            "sliding head_dim 256 (class default) vs full head_dim 16, 4 experts top-2, bos 1 / eos 2. "
            "sliding_window 512 is longer than the prompt, so nothing is trimmed."
        ),
        text_config={
            "vocab_size": 99,
            "hidden_size": 32,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 32,
            "hidden_act": "gelu",
            "max_position_embeddings": 512,
            "initializer_range": 0.02,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "moe_intermediate_size": 8,
            "moe_num_shared_experts": 1,
            "num_experts": 4,
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "per_layer_config": {1: {"head_dim": 16, "num_key_value_heads": 2}},
            "top_k_experts": 2,
            "use_bidirectional_attention": "vision",
        },
        top_config=dict(
            image_token_id=4,
            boi_token_id=5,
            eoi_token_id=6,
            mm_tokens_per_image=2,
            self_conditioning_size=16,
            canvas_length=16,
        ),
        prompt_lengths=[25, 19, 12],
        prompt_width=25,
        weight_seed=1000,
        batch_seed=2000,
    ),
    # >= 7 layers with the default 5:1 pattern (layer 5 full) plus the forced-full last layer (layer 6): 2 full layers.
    # layer_types is NOT given: HF derives it (docs/model.md, "Config loading rules") and save_pretrained writes the result.
    "seven_layers": dict(
        description=(
            "7 layers, layer_types derived by HF ([s,s,s,s,s,f] rule + forced-full last layer = 5 sliding, 2 full), "
            "sliding: 4 q heads x 16, 2 KV heads (GQA 2); full: 4 q heads x 32, 1 KV head (GQA 4, K=V), "
            "proportional RoPE with 4 of 16 pairs rotated; sliding_window 4 with left-padded prompts of 11/8/6/2 "
            "tokens in width 11, so the encoder window and the decoder's last-(W-1)=3-prefix-slot trim are both "
            "crossed, and row 3's trimmed prefix contains a pad slot."
        ),
        text_config={
            "vocab_size": 128,
            "hidden_size": 48,
            "intermediate_size": 32,
            "num_hidden_layers": 7,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "per_layer_config": {5: {"head_dim": 32, "num_key_value_heads": 1}, 6: {"head_dim": 32, "num_key_value_heads": 1}},
            "sliding_window": 4,
            "num_experts": 8,
            "top_k_experts": 2,
            "moe_intermediate_size": 8,
            "max_position_embeddings": 4096,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
            "use_bidirectional_attention": "vision",
        },
        top_config=dict(image_token_id=4, boi_token_id=5, eoi_token_id=6, canvas_length=16),
        # Same model in the older form: no layer_types, no per_layer_config, global_head_dim + num_global_key_value_heads.
        legacy_text_overrides={
            "drop": ["layer_types", "per_layer_config"],
            "set": {"global_head_dim": 32, "num_global_key_value_heads": 1},
        },
        prompt_lengths=[11, 8, 6, 2],
        prompt_width=11,
        weight_seed=1100,
        batch_seed=2100,
    ),
    # top_k_experts == num_experts: every expert runs for every token (no routing ties possible to break).
    "all_experts": dict(
        description=(
            "3 layers [full, sliding, full] (a full layer first), top_k_experts == num_experts == 4 so every expert "
            "runs, MQA on the sliding layer (2 q heads, 1 KV head x 16), full layers 2 q x 32 with 2 KV heads (no "
            "grouping), non-default rope_parameters (full: proportional, partial_rotary_factor 0.5, theta 1e5; "
            "sliding: theta 1e3), sliding_window 6 with prompts 9/7/4 in width 9, "
            "use_bidirectional_attention null."
        ),
        text_config={
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 24,
            "num_hidden_layers": 3,
            "layer_types": ["full_attention", "sliding_attention", "full_attention"],
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "per_layer_config": {0: {"head_dim": 32, "num_key_value_heads": 2}, 2: {"head_dim": 32, "num_key_value_heads": 2}},
            "sliding_window": 6,
            "num_experts": 4,
            "top_k_experts": 4,
            "moe_intermediate_size": 8,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 100000.0},
            },
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 2,
        },
        top_config=dict(image_token_id=4, boi_token_id=5, eoi_token_id=6, canvas_length=8),
        prompt_lengths=[9, 7, 4],
        prompt_width=9,
        weight_seed=1200,
        batch_seed=2200,
    ),
}

SC_MASK = [1.0, 0.0, 1.0, 0.0]  # per-example self-conditioning mask for logits_sc_masked (cut to batch size)
SC_LOGIT_SCALE = 4.0  # std of the random self-conditioning logits


# ------------------------------------------------------------------------------------------------------------------
# Determinism helpers
# ------------------------------------------------------------------------------------------------------------------


def set_determinism() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a-b| / max|b| (b is the reference)."""
    a = a.double()
    b = b.double()
    den = b.abs().max().item()
    return (a - b).abs().max().item() / (den if den > 0 else 1.0)


# ------------------------------------------------------------------------------------------------------------------
# Model construction and random weights
# ------------------------------------------------------------------------------------------------------------------


def build_config(fx: dict) -> DiffusionGemmaConfig:
    cfg = DiffusionGemmaConfig(
        text_config=copy.deepcopy(fx["text_config"]),
        vision_config=dict(TINY_VISION),
        **fx["top_config"],
    )
    return cfg


def build_model(cfg: DiffusionGemmaConfig) -> DiffusionGemmaForBlockDiffusion:
    cfg = copy.deepcopy(cfg)
    # Eager attention, and HF's eager per-expert MoE loop (DiffusionGemmaTextExperts.forward). Without the second
    # setting transformers 5.24 silently dispatches the experts to "grouped_mm", whose CPU results are not
    # reproducible bit for bit between two model instances.
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
        c._experts_implementation = "eager"
    model = DiffusionGemmaForBlockDiffusion(cfg).to(torch.float32).eval()
    check_implementations(model)
    return model


def check_implementations(model) -> None:
    for c in (model.config, model.config.text_config, model.model.decoder.text_config):
        assert c._attn_implementation == "eager", c._attn_implementation
        assert c._experts_implementation == "eager", c._experts_implementation
    for layer in list(model.model.decoder.layers) + list(model.model.encoder.language_model.layers):
        assert layer.experts.config._experts_implementation == "eager"
        assert layer.self_attn.config._attn_implementation == "eager"


def randomize_weights(model: DiffusionGemmaForBlockDiffusion, seed: int) -> None:
    """Deterministic random fp32 weights with scales that keep every path numerically alive.

    RMSNorm weights are drawn around 1 (q/k norms around 0.4; either way a `1 + w` bug is visible), routers get a
    wide logit spread, the final norm is scaled up so the logits reach the soft-cap's non-linear range, and every
    `layer_scalar` buffer is random (encoder and decoder copies equal, as in the release).
    """
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    # Tied parameters appear once, under the name registered first (the encoder's for the shared text stack).
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if name.startswith(VISION_PREFIXES):
                p.copy_(normal(p.shape, 0.02))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(normal(p.shape, 1.0))
            elif name in ("model.decoder.norm.weight", "model.encoder.language_model.norm.weight"):
                p.copy_(uniform(p.shape, 2.0, 4.0))  # the final norm (tied: one tensor)
            elif name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
                # Attention has scale 1.0, so q.k grows like |w|^2 * sqrt(head_dim). Weights around 0.4 keep the
                # softmax well conditioned: HF fp32 then sits 1e-6..5e-6 (relative) from an fp64 evaluation, which
                # leaves room under the 1e-5 parity bound for a second, independent fp32 implementation.
                p.copy_(uniform(p.shape, 0.25, 0.6))
            elif p.dim() == 1 and "norm" in name.split(".")[-2]:
                p.copy_(uniform(p.shape, 0.5, 1.5))
            elif name.endswith("router.proj.weight"):
                p.copy_(normal(p.shape, 1.0))
            elif name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
                p.copy_(uniform(p.shape, 0.5, 1.5))
            elif name.endswith("experts.gate_up_proj"):
                p.copy_(normal(p.shape, p.shape[-1] ** -0.5))
            elif name.endswith("experts.down_proj"):
                p.copy_(normal(p.shape, p.shape[-1] ** -0.5))
            elif name.endswith(".weight") and p.dim() == 2:  # nn.Linear [out, in]
                p.copy_(normal(p.shape, p.shape[1] ** -0.5))
            else:
                raise RuntimeError(f"no init rule for parameter {name} {tuple(p.shape)}")
        # Buffers: layer_scalar (one per layer, identical in encoder and decoder)
        dec_layers = model.model.decoder.layers
        enc_layers = model.model.encoder.language_model.layers
        for i, (dl, el) in enumerate(zip(dec_layers, enc_layers)):
            v = uniform((1,), 0.6, 1.4)
            dl.layer_scalar.copy_(v)
            el.layer_scalar.copy_(v)
    # Ties must hold: the encoder text stack is the decoder stack.
    assert model.lm_head.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    enc = model.model.encoder.language_model
    assert enc.embed_tokens.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    assert enc.layers[0].self_attn.q_proj.weight.data_ptr() == dec_layers[0].self_attn.q_proj.weight.data_ptr()
    assert enc.layers[-1].experts.gate_up_proj.data_ptr() == dec_layers[-1].experts.gate_up_proj.data_ptr()


# ------------------------------------------------------------------------------------------------------------------
# Batch
# ------------------------------------------------------------------------------------------------------------------


def make_batch(fx: dict, cfg: DiffusionGemmaConfig) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(fx["batch_seed"])
    tc = cfg.text_config
    V = tc.vocab_size
    L = cfg.canvas_length
    lens = fx["prompt_lengths"]
    B, P = len(lens), fx["prompt_width"]
    pad, bos = tc.pad_token_id, tc.bos_token_id
    specials = {pad, bos, cfg.image_token_id, cfg.boi_token_id, cfg.eoi_token_id}
    if isinstance(tc.eos_token_id, int):
        specials.add(tc.eos_token_id)
    else:
        specials.update(tc.eos_token_id)

    # Prompt ids: ordinary text ids (no special ids), bos first, left padding with the pad id.
    ordinary = torch.tensor([i for i in range(V) if i not in specials], dtype=torch.int64)
    input_ids = torch.full((B, P), pad, dtype=torch.int64)
    attention_mask = torch.zeros((B, P), dtype=torch.int64)
    for b, n in enumerate(lens):
        assert 1 <= n <= P
        body = ordinary[torch.randint(len(ordinary), (n,), generator=g)]
        body[0] = bos
        input_ids[b, P - n :] = body
        attention_mask[b, P - n :] = 1
    position_ids = torch.arange(P, dtype=torch.int64).unsqueeze(0).expand(B, P).contiguous()

    # Canvas: clean targets over the whole vocabulary, then uniform-state noise with per-row level t.
    canvas_ids = torch.randint(V, (B, L), generator=g, dtype=torch.int64)
    diffusion_t = torch.linspace(0.3, 0.9, B, dtype=torch.float32)
    replace = torch.rand((B, L), generator=g) < diffusion_t[:, None]
    noise = torch.randint(V, (B, L), generator=g, dtype=torch.int64)
    noisy_canvas_ids = torch.where(replace, noise, canvas_ids)
    canvas_mask = torch.ones((B, L), dtype=torch.float32)
    # A training-time canvas pad; the forward pass ignores canvas_mask (docs/model.md, "Decoder attention").
    canvas_mask[-1, L - 3 :] = 0.0

    sc_logits = torch.randn((B, L, V), generator=g, dtype=torch.float32) * SC_LOGIT_SCALE

    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        canvas_ids=canvas_ids,
        canvas_mask=canvas_mask,
        noisy_canvas_ids=noisy_canvas_ids,
        diffusion_t=diffusion_t,
        self_conditioning_logits=sc_logits,
    )


# ------------------------------------------------------------------------------------------------------------------
# HF reference run
# ------------------------------------------------------------------------------------------------------------------


class RecordingCache(DynamicCache):
    """A DynamicCache (built from the config, so sliding layers trim to W-1) that also keeps the untrimmed K/V."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.recorded[layer_idx] = (key_states.detach().clone(), value_states.detach().clone())
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class RouterRecorder:
    def __init__(self, model):
        self.calls: list[tuple[str, int, torch.Tensor, torch.Tensor]] = []
        self.handles = []
        enc = model.model.encoder.language_model.layers
        dec = model.model.decoder.layers
        for part, layers in (("encoder", enc), ("decoder", dec)):
            for i, layer in enumerate(layers):
                self.handles.append(layer.router.register_forward_hook(self._hook(part, i)))

    def _hook(self, part, i):
        def fn(module, inputs, outputs):
            probs, _w, idx = outputs
            self.calls.append((part, i, probs.detach().clone(), idx.detach().clone()))

        return fn

    def clear(self):
        self.calls = []

    def remove(self):
        for h in self.handles:
            h.remove()


def hf_forward(model, batch, *, sc_logits=None, sc_mask=None, cache=None):
    am = batch["attention_mask"]
    L = batch["noisy_canvas_ids"].shape[1]
    # Exactly what DiffusionGemmaGenerationMixin.generate builds: the prompt mask padded with ones over the canvas.
    decoder_attention_mask = F.pad(am.bool(), (0, L), value=True)
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=am,
            position_ids=None,  # HF default arange(P), pads included (== batch position_ids)
            decoder_input_ids=batch["noisy_canvas_ids"],
            decoder_attention_mask=decoder_attention_mask,
            self_conditioning_logits=sc_logits,
            self_conditioning_mask=None if sc_mask is None else sc_mask.bool(),
            cache=cache,
        )
    return out


def run_reference(model, cfg, batch) -> tuple[dict[str, torch.Tensor], dict]:
    tc = cfg.text_config
    B, P = batch["input_ids"].shape
    L = batch["noisy_canvas_ids"].shape[1]
    nl = tc.num_hidden_layers
    info: dict = {}
    rec = RouterRecorder(model)

    # (1) no self-conditioning; the recording cache gives both the trimmed cache and the untrimmed K/V.
    cache = RecordingCache(config=tc)
    out = hf_forward(model, batch, cache=cache)
    calls_plain = list(rec.calls)
    rec.clear()
    expected: dict[str, torch.Tensor] = {}
    expected["logits"] = out.logits.detach().clone()
    expected["encoder_hidden"] = out.encoder_last_hidden_state.detach().clone()
    assert out.cache is cache
    for i in range(nl):
        layer = cache.layers[i]
        k, v = layer.keys, layer.values
        kf, vf = cache.recorded[i]
        expected[f"encoder_k.{i}"] = k.detach().clone().contiguous()
        expected[f"encoder_v.{i}"] = v.detach().clone().contiguous()
        expected[f"encoder_k_untrimmed.{i}"] = kf.contiguous()
        expected[f"encoder_v_untrimmed.{i}"] = vf.contiguous()
        S = k.shape[2]
        if tc.layer_types[i] == "sliding_attention":
            assert S == min(P, tc.sliding_window - 1), (i, S)
        else:
            assert S == P, (i, S)
        assert torch.equal(k, kf[:, :, P - S :]) and torch.equal(v, vf[:, :, P - S :])
    assert cache.get_seq_length(0) == P

    # Router top-k indices (no-SC pass): encoder [B,P,k], decoder [B,L,k]
    k_top = tc.top_k_experts
    for part, i, _probs, idx in calls_plain:
        T = P if part == "encoder" else L
        expected[f"{part}_router_topk.{i}"] = idx.reshape(B, T, k_top).to(torch.int64).contiguous()

    # (2) with the self-conditioning logits of the batch
    out_sc = hf_forward(model, batch, sc_logits=batch["self_conditioning_logits"])
    calls_sc = list(rec.calls)
    rec.clear()
    expected["logits_sc"] = out_sc.logits.detach().clone()
    assert torch.equal(out_sc.encoder_last_hidden_state, expected["encoder_hidden"])

    # (3) with a per-example self-conditioning mask
    sc_mask = torch.tensor(SC_MASK[:B], dtype=torch.float32)
    out_m = hf_forward(model, batch, sc_logits=batch["self_conditioning_logits"], sc_mask=sc_mask)
    calls_m = list(rec.calls)
    rec.remove()
    expected["self_conditioning_mask"] = sc_mask
    expected["logits_sc_masked"] = out_m.logits.detach().clone()
    expected["decoder_position_ids"] = (torch.arange(L, dtype=torch.int64) + P).unsqueeze(0).expand(B, L).contiguous()

    # Router margins on every token whose output matters (non-pad prompt tokens, every canvas token, all 3 passes).
    valid_tok = batch["attention_mask"].reshape(-1).bool()
    gaps = []
    for calls in (calls_plain, calls_sc, calls_m):
        for part, _i, probs, _idx in calls:
            if k_top >= probs.shape[-1]:
                continue
            sp = probs.sort(dim=-1, descending=True).values
            gap = sp[:, k_top - 1] - sp[:, k_top]
            if part == "encoder":
                gap = gap[valid_tok]
            gaps.append(gap.min().item())
    info["router_min_topk_gap"] = min(gaps) if gaps else None
    return expected, info


# ------------------------------------------------------------------------------------------------------------------
# Independent implementation of docs/model.md (reads only config.json + model.safetensors)
# ------------------------------------------------------------------------------------------------------------------


def parse_text_config(config_json: dict) -> dict:
    tc = config_json["text_config"]
    n = tc["num_hidden_layers"]
    layer_types = list(tc.get("layer_types") or [])
    if not layer_types:
        layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    layer_types[-1] = "full_attention"
    rope = tc.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
    }
    layers = []
    if "per_layer_config" in tc:
        plc = {int(k): v for k, v in (tc["per_layer_config"] or {}).items()}
        for i in range(n):
            o = plc.get(i, {})
            layers.append(
                dict(head_dim=o.get("head_dim", tc["head_dim"]), nkv=o.get("num_key_value_heads", tc["num_key_value_heads"]))
            )
    else:  # older form
        for i in range(n):
            if layer_types[i] == "full_attention":
                nkv = tc.get("num_global_key_value_heads") or tc["num_key_value_heads"]
                layers.append(dict(head_dim=tc.get("global_head_dim", 512), nkv=nkv))
            else:
                layers.append(dict(head_dim=tc["head_dim"], nkv=tc["num_key_value_heads"]))
    for i, lt in enumerate(layer_types):
        layers[i]["type"] = lt
    return dict(
        H=tc["hidden_size"],
        V=tc["vocab_size"],
        nq=tc["num_attention_heads"],
        eps=tc.get("rms_norm_eps", 1e-6),
        W=tc.get("sliding_window", 512),
        k=tc["top_k_experts"],
        E=tc["num_experts"],
        softcap=tc.get("final_logit_softcapping", 30.0),
        rope=rope,
        layers=layers,
    )


def _rms(x, w=None, eps=1e-6):
    x = x if x.dtype == torch.float64 else x.float()  # fp32 (fp64 only for the conditioning measurement)
    y = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return y * w if w is not None else y


def _inv_freq(rope: dict, head_dim: int, dtype=torch.float32) -> torch.Tensor:
    theta = rope["rope_theta"]
    if rope["rope_type"] == "default":
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))
    assert rope["rope_type"] == "proportional"
    r = int(rope.get("partial_rotary_factor", 1.0) * head_dim // 2)
    f = torch.zeros(head_dim // 2, dtype=dtype)
    f[:r] = 1.0 / (theta ** (torch.arange(0, 2 * r, 2, dtype=dtype) / head_dim))
    return f


def _rope(x, pos, inv_freq):
    # x [B, T, n, d]; pos [B, T]; rotate-half layout
    ang = pos[..., None].to(inv_freq.dtype) * inv_freq
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos()[:, :, None, :], emb.sin()[:, :, None, :]
    d = x.shape[-1]
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * cos + rot * sin


def _attend(q, k, v, allowed):
    # q [B,T,nq,d], k/v [B,S,nkv,d], allowed [B,T,S] bool; scale 1.0; GQA head h reads kv head h // group
    nq, nkv = q.shape[2], k.shape[2]
    grp = nq // nkv
    kk = k.repeat_interleave(grp, dim=2)
    vv = v.repeat_interleave(grp, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, kk)
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhts,bshd->bthd", p, vv)


def _layer(w, pre, cfg, li, h, pos, kv_fn):
    lc = cfg["layers"][li]
    hd, nkv, nq, eps, H = lc["head_dim"], lc["nkv"], cfg["nq"], cfg["eps"], cfg["H"]
    B, T, _ = h.shape
    inv = _inv_freq(cfg["rope"][lc["type"]], hd, h.dtype)
    x = _rms(h, w[pre + "input_layernorm.weight"], eps)
    q = (x @ w[pre + "self_attn.q_proj.weight"].T).view(B, T, nq, hd)
    q = _rope(_rms(q, w[pre + "self_attn.q_norm.weight"], eps), pos, inv)
    kr = (x @ w[pre + "self_attn.k_proj.weight"].T).view(B, T, nkv, hd)
    vkey = pre + "self_attn.v_proj.weight"
    if lc["type"] == "sliding_attention":
        vr = (x @ w[vkey].T).view(B, T, nkv, hd)
    else:
        assert vkey not in w, vkey
        vr = kr  # K = V on full layers: V is the weightless norm of the raw K projection
    k = _rope(_rms(kr, w[pre + "self_attn.k_norm.weight"], eps), pos, inv)
    v = _rms(vr, None, eps)
    K, Vv, allowed = kv_fn(li, k, v)
    o = _attend(q, K, Vv, allowed).reshape(B, T, nq * hd) @ w[pre + "self_attn.o_proj.weight"].T
    r = h + _rms(o, w[pre + "post_attention_layernorm.weight"], eps)
    # dense MLP
    a = _rms(r, w[pre + "pre_feedforward_layernorm.weight"], eps)
    d = (F.gelu(a @ w[pre + "mlp.gate_proj.weight"].T, approximate="tanh") * (a @ w[pre + "mlp.up_proj.weight"].T)) @ w[
        pre + "mlp.down_proj.weight"
    ].T
    h1 = _rms(d, w[pre + "post_feedforward_layernorm_1.weight"], eps)
    # router on the raw residual
    z = _rms(r, None, eps) * w[pre + "router.scale"] * (H**-0.5)
    pr = torch.softmax(z @ w[pre + "router.proj.weight"].T, dim=-1)
    tw, ti = torch.topk(pr, cfg["k"], dim=-1)
    tw = tw / tw.sum(-1, keepdim=True)
    tw = tw * w[pre + "router.per_expert_scale"][ti]
    e_in = _rms(r, w[pre + "pre_feedforward_layernorm_2.weight"], eps)
    gu, dn = w[pre + "experts.gate_up_proj"], w[pre + "experts.down_proj"]
    Ie = dn.shape[-1]
    m = torch.zeros_like(e_in)
    for e in range(cfg["E"]):
        sel = (ti == e).float() * tw  # [B,T,k]
        we = sel.sum(-1)  # weight of expert e per token (0 if not chosen)
        if not bool((ti == e).any()):
            continue
        g_ = e_in @ gu[e, :Ie].T
        u_ = e_in @ gu[e, Ie:].T
        m = m + we[..., None] * ((F.gelu(g_, approximate="tanh") * u_) @ dn[e].T)
    h2 = _rms(m, w[pre + "post_feedforward_layernorm_2.weight"], eps)
    ffn = _rms(h1 + h2, w[pre + "post_feedforward_layernorm.weight"], eps)
    return (r + ffn) * w[pre + "layer_scalar"]


def load_text_weights(model_path: Path) -> dict[str, torch.Tensor]:
    raw = load_file(str(model_path))
    w = {}
    for key, t in raw.items():
        if key.startswith("model.decoder."):
            w[key[len("model.decoder.") :]] = t
    for key, t in raw.items():  # encoder copies (only layer_scalar in a save_pretrained file) must equal the decoder's
        if key.startswith("model.encoder.language_model."):
            short = key[len("model.encoder.language_model.") :]
            assert short in w and torch.equal(w[short], t), key
    return w


def spec_forward(
    config_json: dict,
    w: dict,
    batch: dict,
    *,
    sc_logits=None,
    sc_mask=None,
    trim_sliding_prefix=True,
    dtype=torch.float32,
    encoder_embeds=None,
    image_segment_ids=None,
):
    """The layer math, encoder and decoder of docs/model.md. dtype=float64 evaluates the same math in double precision.

    For a batch with images (make_vision_fixtures.py), `encoder_embeds` [B, P, H] replaces the token embedding of the
    prompt (the merged text + vision input), and `image_segment_ids` [B, P] (0 on text, r >= 1 on the r-th image run)
    adds the image-bidirectional overlay of docs/model.md, "Encoder attention mask" to every encoder layer."""
    cfg = parse_text_config(config_json)
    w = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in w.items()}
    H, eps, W = cfg["H"], cfg["eps"], cfg["W"]
    ids, am = batch["input_ids"], batch["attention_mask"].bool()
    xt = batch["noisy_canvas_ids"]
    B, P = ids.shape
    L = xt.shape[1]
    E = w["embed_tokens.weight"]
    s_emb = torch.tensor(H**0.5, dtype=dtype)  # sqrt(H) rounded to the embedding dtype (fp32 here, no bf16 step)
    n = len(cfg["layers"])

    # ---- encoder (docs/model.md, "Encoder"): causal, sliding = last W keys incl. self, pad keys masked, pad query
    # keeps its diagonal
    pos = torch.arange(P).unsqueeze(0).expand(B, P)
    i_ = torch.arange(P)[:, None]
    j_ = torch.arange(P)[None, :]
    causal = j_ <= i_
    window = (i_ - j_) < W
    kv_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def enc_kv(li, k, v):
        kv_cache[li] = (k, v)
        allowed = causal & (window if cfg["layers"][li]["type"] == "sliding_attention" else True)
        allowed = allowed[None]
        if image_segment_ids is not None:  # the overlay overrides causality and the window, not the key padding
            seg = image_segment_ids
            allowed = allowed | ((seg[:, :, None] > 0) & (seg[:, :, None] == seg[:, None, :]))
        allowed = allowed & am[:, None, :]
        allowed = allowed | (torch.eye(P, dtype=torch.bool)[None] & ~am[:, :, None])
        return k, v, allowed

    h = E[ids] * s_emb if encoder_embeds is None else encoder_embeds.to(dtype)
    for li in range(n):
        h = _layer(w, f"layers.{li}.", cfg, li, h, pos, enc_kv)
    enc_hidden = _rms(h, w["norm.weight"], eps)

    # ---- decoder (docs/model.md, "Decoder")
    x_tok = E[xt] * s_emb
    if sc_logits is not None:
        sft = (torch.softmax(sc_logits.to(dtype), dim=-1) @ E) * s_emb
        if sc_mask is not None:
            sft = sft * sc_mask.to(dtype)[:, None, None]
    else:
        sft = torch.zeros_like(x_tok)
    u = _rms(sft, w["self_conditioning.pre_norm.weight"], eps)
    s_sig = (
        F.gelu(u @ w["self_conditioning.gate_proj.weight"].T, approximate="tanh") * (u @ w["self_conditioning.up_proj.weight"].T)
    ) @ w["self_conditioning.down_proj.weight"].T
    h = _rms(x_tok + s_sig, None, eps)
    dpos = (torch.arange(L) + P).unsqueeze(0).expand(B, L)

    def dec_kv(li, k, v):
        pk, pv = kv_cache[li]
        valid = am
        if cfg["layers"][li]["type"] == "sliding_attention" and trim_sliding_prefix:
            keep = min(P, W - 1)
            pk, pv, valid = pk[:, P - keep :], pv[:, P - keep :], am[:, P - keep :]
        K = torch.cat([pk, k], dim=1)
        Vv = torch.cat([pv, v], dim=1)
        allowed = torch.cat([valid, torch.ones(B, L, dtype=torch.bool)], dim=1)[:, None, :].expand(B, L, K.shape[1])
        return K, Vv, allowed

    for li in range(n):
        h = _layer(w, f"layers.{li}.", cfg, li, h, dpos, dec_kv)
    hf_ = _rms(h, w["norm.weight"], eps)
    logits = hf_ @ E.T
    logits = cfg["softcap"] * torch.tanh(logits / cfg["softcap"])
    kv = {li: (k.permute(0, 2, 1, 3).contiguous(), v.permute(0, 2, 1, 3).contiguous()) for li, (k, v) in kv_cache.items()}
    return dict(logits=logits, encoder_hidden=enc_hidden, kv=kv)


# ------------------------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------------------------


def write_fixture(name: str, fx: dict, out_dir: Path, min_router_gap: float, log) -> dict:
    cfg = build_config(fx)
    weight_seed = fx["weight_seed"]
    tried = []
    for attempt in range(20):
        model = build_model(cfg)
        randomize_weights(model, weight_seed)
        batch = make_batch(fx, cfg)
        expected, info = run_reference(model, cfg, batch)
        gap = info["router_min_topk_gap"]
        tried.append(dict(weight_seed=weight_seed, router_min_topk_gap=gap))
        if gap is None or gap >= min_router_gap:
            break
        log(f"  [{name}] weight seed {weight_seed}: router top-k gap {gap:.3g} < {min_router_gap:g}, trying the next seed")
        weight_seed += 1
    else:
        raise RuntimeError(f"{name}: no weight seed with router gap >= {min_router_gap}")

    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        cfg_json = json.loads((Path(tmp) / "config.json").read_text())
        gen_json = (Path(tmp) / "generation_config.json").read_text()
        saved = load_file(str(Path(tmp) / "model.safetensors"))
        with safe_open(str(Path(tmp) / "model.safetensors"), "pt") as f:
            st_meta = f.metadata()
    # No vision tower in the fixture: drop the vision tensors and the vision config.
    text_only = {k: v.contiguous() for k, v in saved.items() if not k.startswith(VISION_PREFIXES)}
    cfg_json["vision_config"] = None
    (d / "config.json").write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
    (d / "generation_config.json").write_text(gen_json)
    save_file(text_only, str(d / "model.safetensors"), metadata=st_meta)
    save_file({k: v.contiguous() for k, v in batch.items()}, str(d / "batch.safetensors"), metadata={"format": "pt"})
    save_file({k: v.contiguous() for k, v in expected.items()}, str(d / "expected.safetensors"), metadata={"format": "pt"})

    legacy_json = None
    if "legacy_text_overrides" in fx:
        legacy_json = copy.deepcopy(cfg_json)
        for key in fx["legacy_text_overrides"]["drop"]:
            legacy_json["text_config"].pop(key, None)
        legacy_json["text_config"].update(fx["legacy_text_overrides"]["set"])
        (d / "config_legacy.json").write_text(json.dumps(legacy_json, indent=2, sort_keys=True) + "\n")

    checks = verify_fixture(name, d, model, cfg, batch, expected, log)

    tc = cfg.text_config
    meta = dict(
        name=name,
        description=fx["description"],
        generator="tools/reference/make_diffusion_gemma_fixtures.py",
        transformers_version=transformers.__version__,
        torch_version=torch.__version__.split("+")[0],
        weight_seed=weight_seed,
        weight_seeds_tried=tried,
        batch_seed=fx["batch_seed"],
        batch_size=len(fx["prompt_lengths"]),
        prompt_width=fx["prompt_width"],
        prompt_lengths=fx["prompt_lengths"],
        canvas_length=cfg.canvas_length,
        vocab_size=tc.vocab_size,
        hidden_size=tc.hidden_size,
        layer_types=list(tc.layer_types),
        head_dim_per_layer=[tc.per_layer_config[i].head_dim for i in range(tc.num_hidden_layers)],
        num_key_value_heads_per_layer=[tc.per_layer_config[i].num_key_value_heads for i in range(tc.num_hidden_layers)],
        num_attention_heads=tc.num_attention_heads,
        sliding_window=tc.sliding_window,
        num_experts=tc.num_experts,
        top_k_experts=tc.top_k_experts,
        self_conditioning_mask=SC_MASK[: len(fx["prompt_lengths"])],
        rel_tolerance=REL_TOL,
        compare_encoder_only_where_attention_mask_is_1=True,
        checks=checks,
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def verify_fixture(name, d: Path, model, cfg, batch, expected, log) -> dict:
    checks: dict = {}
    tc = cfg.text_config
    B, P = batch["input_ids"].shape
    W = tc.sliding_window
    nl = tc.num_hidden_layers
    am = batch["attention_mask"].bool()

    # (a) reload the written files with HF and rerun: bit-identical
    cfg2 = DiffusionGemmaConfig.from_pretrained(str(d))
    assert cfg2.vision_config.num_hidden_layers == 16  # HF fills in the default vision tower for vision_config=None
    cfg2.vision_config = copy.deepcopy(cfg.vision_config)  # keep the (untested) vision tower tiny
    import logging as _logging

    tl = transformers.utils.logging.get_logger("transformers.modeling_utils")
    old = tl.level
    tl.setLevel(_logging.ERROR)  # the vision tensors are missing from the fixture on purpose
    m2 = DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(d), config=cfg2, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    check_implementations(m2)
    tl.setLevel(old)
    sd1, sd2 = model.state_dict(), m2.state_dict()
    for k, v in sd1.items():
        if k.startswith(VISION_PREFIXES):
            continue
        assert torch.equal(v, sd2[k]), f"reloaded weight differs: {k}"
    batch2 = load_file(str(d / "batch.safetensors"))
    for k in batch:
        assert torch.equal(batch[k], batch2[k]), k
    exp2, _ = run_reference(m2, cfg2, batch2)
    exp_file = load_file(str(d / "expected.safetensors"))
    assert set(exp2) == set(exp_file), set(exp2) ^ set(exp_file)
    bad = {k: (exp2[k].double() - exp_file[k].double()).abs().max().item() for k in exp_file if not torch.equal(exp2[k], exp_file[k])}
    assert not bad, f"{name}: reload+rerun not bit-identical: {bad}"
    checks["reload_rerun_bit_identical"] = True

    # (b) independent docs/model.md implementation reading only config.json + model.safetensors
    cfg_json = json.loads((d / "config.json").read_text())
    w = load_text_weights(d / "model.safetensors")
    errs = {}
    sc, scm = batch["self_conditioning_logits"], expected["self_conditioning_mask"]
    ref = spec_forward(cfg_json, w, batch)
    ref_sc = spec_forward(cfg_json, w, batch, sc_logits=sc)
    ref_m = spec_forward(cfg_json, w, batch, sc_logits=sc, sc_mask=scm)
    errs["logits"] = rel_err(ref["logits"], expected["logits"])
    errs["logits_sc"] = rel_err(ref_sc["logits"], expected["logits_sc"])
    errs["logits_sc_masked"] = rel_err(ref_m["logits"], expected["logits_sc_masked"])
    errs["encoder_hidden[valid]"] = rel_err(ref["encoder_hidden"][am], expected["encoder_hidden"][am])
    kv_err = 0.0
    for li in range(nl):
        k, v = ref["kv"][li]  # [B, nkv, P, hd]
        for nm, t in (("k", k), ("v", v)):
            ex = expected[f"encoder_{nm}_untrimmed.{li}"]
            sel = am[:, None, :, None].expand_as(ex)
            kv_err = max(kv_err, rel_err(t[sel], ex[sel]))
    errs["encoder_kv[valid]"] = kv_err
    for key, e in errs.items():
        assert e <= REL_TOL, f"{name}: spec re-implementation vs HF {key}: rel err {e:.3g} > {REL_TOL}"
    checks["spec_reimplementation_rel_err"] = {k: float(f"{v:.3g}") for k, v in errs.items()}
    # Conditioning: how far HF's fp32 result is from the same math in fp64. An independent fp32 port lands at a
    # similar distance, so this must stay well under the parity bound.
    f64 = {}
    f64["logits"] = rel_err(expected["logits"], spec_forward(cfg_json, w, batch, dtype=torch.float64)["logits"])
    f64["logits_sc"] = rel_err(
        expected["logits_sc"], spec_forward(cfg_json, w, batch, sc_logits=sc, dtype=torch.float64)["logits"]
    )
    for key, e in f64.items():
        assert e <= REL_TOL / 2, f"{name}: HF fp32 vs fp64 {key}: {e:.3g} (fixture badly conditioned)"
    checks["hf_fp32_vs_fp64_rel_err"] = {k: float(f"{v:.3g}") for k, v in f64.items()}
    if "config_legacy.json" in os.listdir(d):
        legacy = json.loads((d / "config_legacy.json").read_text())
        e = rel_err(spec_forward(legacy, w, batch)["logits"], expected["logits"])
        assert e <= REL_TOL, e
        # HF itself must derive the same geometry from the legacy form
        lcfg = DiffusionGemmaConfig.from_dict(copy.deepcopy(legacy))
        lcfg.vision_config = copy.deepcopy(cfg.vision_config)
        for i in range(nl):
            assert lcfg.text_config.layer_types[i] == tc.layer_types[i]
            assert lcfg.text_config.per_layer_config[i].head_dim == tc.per_layer_config[i].head_dim
            assert lcfg.text_config.per_layer_config[i].num_key_value_heads == tc.per_layer_config[i].num_key_value_heads
        m3 = build_model(lcfg)
        m3.load_state_dict(model.state_dict())
        out3 = hf_forward(m3, batch)
        assert torch.equal(out3.logits, expected["logits"]), "legacy config gives different HF logits"
        checks["config_legacy_same_logits"] = True

    # (c) self-conditioning matters, and the per-example mask selects between the two results row by row
    d_sc = rel_err(expected["logits_sc"], expected["logits"])
    assert d_sc > 1e-3, f"self-conditioning changes nothing ({d_sc})"
    # Row b of logits_sc_masked must be row b of logits (mask 0) or of logits_sc (mask 1). Equal up to the MoE-gather
    # rounding (see the pad check): the other rows route differently, so the per-expert GEMMs have other row counts.
    worst = 0.0
    for b in range(B):
        other = expected["logits"][b] if scm[b] == 0 else expected["logits_sc"][b]
        e = rel_err(expected["logits_sc_masked"][b], other)
        assert e <= REL_TOL, f"row {b}: sc_mask {scm[b]} does not select the matching result (rel {e:.3g})"
        worst = max(worst, e)
    checks["sc_mask_rows_match_rel_at_most"] = float(f"{worst:.3g}")
    checks["logits_sc_vs_logits_rel_diff"] = float(f"{d_sc:.3g}")

    # (d) pad tokens: changing the ids under attention_mask == 0 changes no non-pad output
    g = torch.Generator().manual_seed(99)
    batch_p = dict(batch)
    ids = batch["input_ids"].clone()
    repl = torch.randint(3, tc.vocab_size, ids.shape, generator=g)
    ids[~am] = repl[~am]
    assert not torch.equal(ids, batch["input_ids"])
    batch_p["input_ids"] = ids
    exp_p, _ = run_reference(model, cfg, batch_p)
    # Not bit-exact: HF's MoE loop gathers a different token set per expert when pad tokens route elsewhere, and
    # the CPU GEMM rounds differently for a different row count (a few ulp). A leak would be O(1).
    pad_errs = {}
    for k in ("logits", "logits_sc", "logits_sc_masked"):
        pad_errs[k] = rel_err(exp_p[k], expected[k])
    pad_errs["encoder_hidden[valid]"] = rel_err(exp_p["encoder_hidden"][am], expected["encoder_hidden"][am])
    kv_e = 0.0
    for li in range(nl):
        for nm in ("k", "v"):
            ex, ep = expected[f"encoder_{nm}_untrimmed.{li}"], exp_p[f"encoder_{nm}_untrimmed.{li}"]
            kv_e = max(kv_e, rel_err(ep.permute(0, 2, 1, 3)[am], ex.permute(0, 2, 1, 3)[am]))
    pad_errs["encoder_kv[valid]"] = kv_e
    for k, e in pad_errs.items():
        assert e <= REL_TOL, f"{name}: changing pad ids changes {k} (rel {e:.3g})"
    checks["pad_ids_change_valid_outputs_rel_at_most"] = float(f"{max(pad_errs.values()):.3g}")

    # (e) sliding window. Encoder: change the first prompt token of row 0 (a full-length prompt); in the run of
    # sliding layers before the first full layer, layer l's K/V depend only on tokens >= j - l*(W-1).
    checks["sliding_window"] = {}
    first_full = tc.layer_types.index("full_attention")
    if P > W and first_full >= 2:
        row = 0
        assert am[row].all(), "row 0 must be a full-length prompt"
        batch_s = dict(batch)
        ids = batch["input_ids"].clone()
        ids[row, 0] = (int(ids[row, 0]) + 7) % tc.vocab_size
        batch_s["input_ids"] = ids
        exp_s, _ = run_reference(model, cfg, batch_s)
        worst_out, least_in = 0.0, float("inf")
        layers_checked = [li for li in range(1, first_full) if li * (W - 1) + 1 < P]
        assert layers_checked
        for li in layers_checked:
            reach = li * (W - 1)
            for nm in ("k", "v"):
                a = expected[f"encoder_{nm}_untrimmed.{li}"][row]
                b_ = exp_s[f"encoder_{nm}_untrimmed.{li}"][row]
                # outside the reach: equal up to MoE-gather rounding (see the pad check); inside: an O(1) change
                out_e = rel_err(b_[:, reach + 1 :], a[:, reach + 1 :])
                in_e = rel_err(b_[:, : reach + 1], a[:, : reach + 1])
                assert out_e <= REL_TOL, f"layer {li}: window leaks beyond {reach} (rel {out_e:.3g})"
                assert in_e > 1e-2, f"layer {li}: no change inside the reach (rel {in_e:.3g})"
                worst_out, least_in = max(worst_out, out_e), min(least_in, in_e)
        checks["sliding_window"]["encoder_receptive_field"] = dict(
            changed="input_ids[0, 0]",
            layers=layers_checked,
            rule="K/V of sliding layer l at position j > l*(W-1) do not depend on token 0",
            outside_rel_at_most=float(f"{worst_out:.3g}"),
            inside_rel_at_least=float(f"{least_in:.3g}"),
        )
    # Decoder: with the untrimmed prefix on sliding layers the logits change iff the prefix exceeds W-1 slots.
    untrim = spec_forward(cfg_json, w, batch, trim_sliding_prefix=False)["logits"]
    d_trim = rel_err(untrim, expected["logits"])
    if P > W - 1:
        assert d_trim > 1e-3, f"decoder prefix trim has no effect ({d_trim})"
        checks["sliding_window"]["decoder_prefix_trim_matters_rel_diff"] = float(f"{d_trim:.3g}")
    else:
        assert d_trim <= REL_TOL
        checks["sliding_window"]["decoder_prefix_not_trimmed"] = True

    log(f"  [{name}] checks: {json.dumps(checks)}")
    return checks


def write_versions(out_dir: Path, argv: list[str]) -> None:
    import safetensors

    versions = dict(
        python=sys.version.split()[0],
        torch=torch.__version__,
        transformers=transformers.__version__,
        safetensors=safetensors.__version__,
        numpy=__import__("numpy").__version__,
        command=" ".join(
            ["python3", "tools/reference/make_diffusion_gemma_fixtures.py"]
            + [shlex.quote("<absolute path>" if os.path.isabs(a) else a) for a in argv]
        ),
        out_dir=str(out_dir) if not out_dir.is_absolute() else "(an absolute path, not recorded)",
        device="cpu",
        dtype="float32",
        attn_implementation="eager",
        experts_implementation="eager",
        mkl_cbwr=os.environ.get("MKL_CBWR"),
        torch_num_threads=torch.get_num_threads(),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
    )
    (REPO_ROOT / VERSIONS_JSON).write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="fixture root, relative to the repo root")
    ap.add_argument("--only", action="append", choices=sorted(FIXTURES), help="fixture(s) to build (default: all)")
    ap.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and compare byte-for-byte with --out-dir (writes nothing)",
    )
    ap.add_argument(
        "--min-router-gap",
        type=float,
        default=1e-4,
        help="minimum k-th minus (k+1)-th router probability on every relevant token; otherwise the next weight seed is used",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    set_determinism()
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    names = args.only or list(FIXTURES)
    out_dir = args.out_dir if args.out_dir.is_absolute() else REPO_ROOT / args.out_dir
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, modeling file {Path(hf_dg.__file__).name}")

    if args.check:
        ok = True
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                write_fixture(name, FIXTURES[name], Path(tmp), args.min_router_gap, log)
                for f in sorted(os.listdir(Path(tmp) / name)):
                    a, b = Path(tmp) / name / f, out_dir / name / f
                    same = b.exists() and filecmp.cmp(a, b, shallow=False)
                    log(f"  {name}/{f}: {'identical' if same else 'DIFFERS'}")
                    ok &= same
        print("check: all fixture files bit-identical" if ok else "check: FIXTURES DIFFER")
        return 0 if ok else 1

    for name in names:
        log(f"building {name}")
        meta = write_fixture(name, FIXTURES[name], out_dir, args.min_router_gap, log)
        size = sum(p.stat().st_size for p in (out_dir / name).iterdir())
        log(f"  wrote {out_dir.name}/{name}: {size} bytes, weight seed {meta['weight_seed']}")
    write_versions(args.out_dir, sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
