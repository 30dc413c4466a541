#!/usr/bin/env python3
"""Record HF transformers' block-diffusion `generate` as a replayable trace, for dgemma's generation parity test.

Reference-data generation only: this script is not run by CI. For each fixture it loads one of the tiny random models
of test/fixtures/diffusion_gemma/<model>/ (config.json + model.safetensors, referenced, not copied), runs
`DiffusionGemmaForBlockDiffusion.generate` (fp32, eager attention, eager experts, CPU, one thread, deterministic) on a
left-padded batch of prompts of different lengths, records every random draw HF makes and every intermediate the
C++ test compares, and writes test/fixtures/generation/<name>/:

    generation_config.json   the settings of the run, as HF's DiffusionGemmaGenerationConfig.save_pretrained writes them
    trace.safetensors        inputs, HF's own draws, per-step and per-canvas records, cache K/V, final outputs
    meta.json                what was run, which model, the step table, the checks and their measured values

The layout of trace.safetensors and the rules for comparing against it are in tools/reference/README.md
("Generation traces") and docs/generation-parity.md.

How the draws are recorded. HF draws three kinds of random numbers, all from torch's global generator:
  * the initial canvas of every block: `EntropyBoundSampler.initialize_canvas` (torch.randint over all V ids);
  * the renoise ids of every step: `renoise_canvas` calls `initialize_canvas` again for a whole fresh canvas, of
    which only the rejected positions are used;
  * the per-position categorical sample of every step: `torch.multinomial(softmax(z))`.
The script wraps those two functions and keeps their results. Replaying them through HF (the wrapped functions then
return the recorded tensors and the generator is seeded differently) must reproduce every record bit for bit.

EOS inside a block. With random weights the configured EOS ids may never show up where they are wanted. The script
first runs with the fixture's base EOS ids, then picks an id that the argmax committed mid-block in canvas
`eos_canvas` of one row and nowhere earlier in any row, adds it to the EOS ids and reruns with the same torch seed:
every draw up to that commit is the same, so that row now finishes inside the block while another row goes on.
The rerun is the recorded run.

Usage (from anywhere; paths are relative to the repository root):
    python3 tools/reference/make_generation_fixtures.py            # (re)write all fixtures
    python3 tools/reference/make_generation_fixtures.py --check    # regenerate in a temp dir, compare bytes
    python3 tools/reference/make_generation_fixtures.py --only seven_layers
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU only, even where a GPU exists
# Without conditional numerical reproducibility MKL's sgemm depends on operand alignment (see README, "Determinism").
os.environ.setdefault("MKL_CBWR", "COMPATIBLE,STRICT")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, Gemma4VisionConfig  # noqa: E402
from transformers.models.diffusion_gemma import generation_diffusion_gemma as hf_gen  # noqa: E402

# HF always builds a vision tower; the fixtures have none, so the forward fixtures' tiny one will do (README,
# "No vision-less model"). This script's directory is on sys.path when it runs.
from make_diffusion_gemma_fixtures import TINY_VISION  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("test/fixtures/generation")
MODEL_ROOT = Path("test/fixtures/diffusion_gemma")
VERSIONS_JSON = Path("tools/reference/generation_versions.json")


# The argmax at a position is called a near-tie when HF's top two raw logits are closer than this
# (docs/generation-parity.md): an fp32 port at 1e-5 relative error can legitimately pick the other one.
NEAR_TIE_LOGIT_GAP = 1e-3
# An acceptance decision is called marginal when the position's exclusive entropy sum is this close to the bound.
ACCEPT_MARGIN = 1e-4
# Every row's mean entropy must be at least this far (relative) from the confidence threshold.
STOP_MARGIN = 1e-3

FIXTURES: dict[str, dict] = {
    # The model with a crossed sliding window (W = 4) and 2 full layers: every cache rule is exercised. Default
    # stability rule (1 step) and confidence threshold: on random weights the argmax never stays put for a whole
    # canvas, so every canvas runs all N steps.
    "seven_layers": dict(
        model="seven_layers",
        description=(
            "seven_layers (5 sliding layers with W = 4, 2 full), 4 left-padded prompts of 9/6/4/1 tokens in width 9, "
            "64 new tokens = 4 canvases of 16, 8 denoising steps, entropy bound 1.0 (1-7 of 16 positions accepted "
            "per step), default stop rule (never met on random weights, so every canvas runs 8 steps). EOS ids: the "
            "config's 1 (never produced) and an extra id that ends row 0 inside canvas 2 (row 0's canvas 3 is all "
            "pad); rows 1-3 run to the end."
        ),
        prompt_lengths=[9, 6, 4, 1],
        prompt_width=9,
        prompt_seed=3100,
        torch_seed=3200,
        max_new_tokens=64,
        max_denoising_steps=8,
        entropy_bound=1.0,
        t_min=0.4,
        t_max=0.8,
        stability_threshold=1,
        confidence_threshold=0.005,
        base_eos=[1],
        eos_canvas=2,
        z_steps=[(0, 0), (0, 1), (1, 0), (3, 7)],  # (canvas, step index within the canvas)
    ),
    # The HF test's config. stability_threshold 0 (always "stable") with a confidence threshold inside the entropy
    # range makes rows stop denoising at different steps: frozen rows in a batch and the early exit of a canvas.
    "hf_tester": dict(
        model="hf_tester",
        description=(
            "hf_tester (sliding head_dim 256, W = 512: nothing trimmed), 3 left-padded prompts of 13/9/5 tokens in "
            "width 13, 64 new tokens = 4 canvases of 16, 8 denoising steps, entropy bound 0.5, stability_threshold 0 "
            "and confidence_threshold 0.46: rows stop denoising at different steps (frozen rows), canvases 0 and 3 end "
            "after 5 and 6 steps. No base EOS id (the config's id 2 would end every row in canvas 1); the extra EOS id "
            "ends row 0 inside canvas 2 and row 1 inside canvas 3; row 2 runs to the end."
        ),
        prompt_lengths=[13, 9, 5],
        prompt_width=13,
        prompt_seed=3300,
        torch_seed=3400,
        max_new_tokens=64,
        max_denoising_steps=8,
        entropy_bound=0.5,
        t_min=0.4,
        t_max=0.8,
        stability_threshold=0,
        confidence_threshold=0.46,
        base_eos=[],
        eos_canvas=2,
        z_steps=[(0, 0), (0, 1), (1, 0)],
    ),
}


def set_determinism() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    den = b.abs().max().item()
    return (a - b).abs().max().item() / (den if den > 0 else 1.0)


# ------------------------------------------------------------------------------------------------------------------
# Model and prompts
# ------------------------------------------------------------------------------------------------------------------


def load_model(model_dir: Path) -> tuple[DiffusionGemmaForBlockDiffusion, DiffusionGemmaConfig]:
    cfg = DiffusionGemmaConfig.from_pretrained(model_dir)
    cfg.vision_config = Gemma4VisionConfig(**TINY_VISION)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(
        model_dir, config=cfg, attn_implementation="eager", experts_implementation="eager"
    )
    model = model.to(torch.float32).eval()
    for c in (model.config, model.config.text_config, model.model.decoder.text_config):
        assert c._attn_implementation == "eager" and c._experts_implementation == "eager"
    work_around_eager_decoder_mask(model)
    return model, model.config


def work_around_eager_decoder_mask(model) -> None:
    """HF 5.24.0 bug: `generate` builds the decoder mask with `inputs_embeds=current_canvas.unsqueeze(-1)`, an integer
    tensor, and the eager mask then fails in `torch.finfo(int64)`. Only the shape, dtype and device of that argument
    are used, so a float dummy of the same shape gives the mask `model(...)` builds from real embeddings."""
    decoder = model.model.decoder
    original = decoder.create_diffusion_decoder_attention_mask

    def create_mask(*args, inputs_embeds, **kwargs):
        if not inputs_embeds.is_floating_point():
            inputs_embeds = torch.empty(inputs_embeds.shape[:2] + (0,), dtype=model.dtype, device=inputs_embeds.device)
        return original(*args, inputs_embeds=inputs_embeds, **kwargs)

    decoder.create_diffusion_decoder_attention_mask = create_mask


def make_prompts(fx: dict, cfg: DiffusionGemmaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts: bos first, then ordinary ids (no special id, no EOS candidate of the base list)."""
    tc = cfg.text_config
    g = torch.Generator().manual_seed(fx["prompt_seed"])
    eos = tc.eos_token_id if isinstance(tc.eos_token_id, list) else [tc.eos_token_id]
    specials = {tc.pad_token_id, tc.bos_token_id, cfg.image_token_id, cfg.boi_token_id, cfg.eoi_token_id, *eos}
    ordinary = torch.tensor([i for i in range(tc.vocab_size) if i not in specials], dtype=torch.int64)
    B, P = len(fx["prompt_lengths"]), fx["prompt_width"]
    input_ids = torch.full((B, P), tc.pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((B, P), dtype=torch.int64)
    for b, n in enumerate(fx["prompt_lengths"]):
        body = ordinary[torch.randint(len(ordinary), (n,), generator=g)]
        body[0] = tc.bos_token_id
        input_ids[b, P - n :] = body
        attention_mask[b, P - n :] = 1
    return input_ids, attention_mask


def generation_config(fx: dict, eos_ids: list[int]) -> hf_gen.DiffusionGemmaGenerationConfig:
    return hf_gen.DiffusionGemmaGenerationConfig(
        max_new_tokens=fx["max_new_tokens"],
        max_denoising_steps=fx["max_denoising_steps"],
        sampler_config=hf_gen.EntropyBoundSamplerConfig(entropy_bound=fx["entropy_bound"]),
        t_min=fx["t_min"],
        t_max=fx["t_max"],
        stability_threshold=fx["stability_threshold"],
        confidence_threshold=fx["confidence_threshold"],
        eos_token_id=list(eos_ids),
        pad_token_id=0,
    )


# ------------------------------------------------------------------------------------------------------------------
# Recording (and replaying) one HF generate call
# ------------------------------------------------------------------------------------------------------------------


class Recorder:
    """Wraps the HF functions that draw randomness or produce a compared intermediate, for one `generate` call.

    With `replay` (a previous Recorder's draws), the draw functions return the recorded tensors instead of drawing.
    """

    def __init__(self, model, replay: "Recorder | None" = None):
        self.model = model
        self.replay = replay
        self.initial_canvases: list[torch.Tensor] = []
        self.renoise: list[torch.Tensor] = []
        self.sampled: list[torch.Tensor] = []
        self.steps: list[dict] = []
        self.canvases: list[dict] = []
        self.encoder_calls: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self.decoder_forward_passes: torch.Tensor | None = None
        self._in_renoise = False
        self._step: dict | None = None

    def _next_replayed(self, recorded: list[torch.Tensor], taken: list[torch.Tensor], what: str) -> torch.Tensor:
        assert len(taken) < len(recorded), f"replay ran out of recorded {what}"
        return recorded[len(taken)].clone()

    @contextlib.contextmanager
    def active(self):
        S = hf_gen.EntropyBoundSampler
        M = hf_gen.DiffusionGemmaGenerationMixin
        T = hf_gen.LinearTemperatureScheduleLogitsProcessor
        saved = dict(
            initialize_canvas=S.initialize_canvas,
            accept_canvas=S.accept_canvas,
            renoise_canvas=S.renoise_canvas,
            multinomial=torch.multinomial,
            denoising_step=M._denoising_step,
            finalize_canvas=M.__dict__["_finalize_canvas"],
            tokens_per_forward=M.__dict__["_compute_tokens_per_forward"],
            temperature=T.__call__,
        )
        rec = self

        def initialize_canvas(sampler, batch_size, device):
            if rec.replay is not None:
                src = rec.replay.renoise if rec._in_renoise else rec.replay.initial_canvases
                dst = rec.renoise if rec._in_renoise else rec.initial_canvases
                ids = rec._next_replayed(src, dst, "canvases")
            else:
                ids = saved["initialize_canvas"](sampler, batch_size, device)
            (rec.renoise if rec._in_renoise else rec.initial_canvases).append(ids.clone())
            return ids

        def renoise_canvas(sampler, accepted_canvas, cur_step):
            rec._in_renoise = True
            try:
                return saved["renoise_canvas"](sampler, accepted_canvas, cur_step)
            finally:
                rec._in_renoise = False

        def multinomial(probs, num_samples, *args, **kwargs):
            if rec.replay is not None:
                ids = rec._next_replayed(rec.replay.sampled, rec.sampled, "samples")
            else:
                ids = saved["multinomial"](probs, num_samples, *args, **kwargs)
            rec.sampled.append(ids.clone())
            return ids

        def temperature(processor, input_ids, scores, cur_step):
            z = saved["temperature"](processor, input_ids, scores, cur_step)
            # The same expression HF evaluates, kept as the f32 tensor it divides by.
            t = processor.t_min + ((processor.t_max - processor.t_min) * (cur_step / processor.max_denoising_steps))
            assert torch.equal(z, scores / t)
            rec._step["temperature"] = t.clone()
            rec._step["raw_logits"] = scores.clone()
            return z

        def accept_canvas(sampler, current_canvas, denoiser_canvas, logits, cur_step):
            out = saved["accept_canvas"](sampler, current_canvas, denoiser_canvas, logits, cur_step)
            rec._step["z"] = logits.clone()
            rec._step["entropy"] = torch.distributions.Categorical(logits=logits).entropy().clone()
            rec._step["accepted"] = sampler.accepted_token_mask.clone()
            return out

        def denoising_step(model, **kwargs):
            rec._step = dict(
                cur_step=int(kwargs["cur_step"]),
                canvas_in=kwargs["current_canvas"].clone(),
                finished_before=kwargs["finished_denoising"].clone(),
            )
            canvas, argmax, sc_logits, finished = saved["denoising_step"](model, **kwargs)
            rec._step.update(
                canvas_out=canvas.clone(),
                argmax=argmax.clone(),
                self_conditioning_logits=sc_logits.clone(),
                finished_after=finished.clone(),
            )
            rec.steps.append(rec._step)
            rec._step = None
            return canvas, argmax, sc_logits, finished

        def finalize_canvas(input_ids, finished_sequences, generation_config, stopping_criteria, canvas_length, eos_tensor):
            argmax = input_ids[:, -canvas_length:].clone()
            ids, finished = saved["finalize_canvas"].__func__(
                input_ids, finished_sequences, generation_config, stopping_criteria, canvas_length, eos_tensor
            )
            rec.canvases.append(
                dict(argmax=argmax, committed=ids[:, -canvas_length:].clone(), finished=finished.clone())
            )
            return ids, finished

        def tokens_per_forward(input_ids, decoder_forward_passes, initial_len, pad_token_id):
            rec.decoder_forward_passes = decoder_forward_passes.clone()
            return saved["tokens_per_forward"].__func__(input_ids, decoder_forward_passes, initial_len, pad_token_id)

        def encoder_hook(module, args, kwargs, output):
            cache = output.cache
            rec.encoder_calls.append([(lay.keys.clone(), lay.values.clone()) for lay in cache.layers])

        S.initialize_canvas = initialize_canvas
        S.renoise_canvas = renoise_canvas
        S.accept_canvas = accept_canvas
        torch.multinomial = multinomial
        T.__call__ = temperature
        M._denoising_step = denoising_step
        M._finalize_canvas = staticmethod(finalize_canvas)
        M._compute_tokens_per_forward = staticmethod(tokens_per_forward)
        handle = self.model.model.encoder.register_forward_hook(encoder_hook, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()
            S.initialize_canvas = saved["initialize_canvas"]
            S.renoise_canvas = saved["renoise_canvas"]
            S.accept_canvas = saved["accept_canvas"]
            torch.multinomial = saved["multinomial"]
            T.__call__ = saved["temperature"]
            M._denoising_step = saved["denoising_step"]
            M._finalize_canvas = saved["finalize_canvas"]
            M._compute_tokens_per_forward = saved["tokens_per_forward"]


def run_generate(model, input_ids, attention_mask, gen_cfg, torch_seed: int, replay: Recorder | None = None):
    torch.manual_seed(torch_seed)
    rec = Recorder(model, replay)
    with rec.active():
        out = model.generate(input_ids, attention_mask=attention_mask, generation_config=gen_cfg)
    rec.sequences = out.sequences.clone()
    rec.tokens_per_forward = out.tokens_per_forward.clone()
    # One multinomial and one renoise canvas per step, one initial canvas per canvas: nothing else drew.
    assert len(rec.sampled) == len(rec.steps) == len(rec.renoise), (len(rec.sampled), len(rec.steps), len(rec.renoise))
    assert len(rec.initial_canvases) == len(rec.canvases)
    return rec


# ------------------------------------------------------------------------------------------------------------------
# EOS inside a block
# ------------------------------------------------------------------------------------------------------------------


def first_finished_canvas(rec: Recorder, row: int) -> int | None:
    for c, canvas in enumerate(rec.canvases):
        if canvas["finished"][row]:
            return c
    return None


def eos_candidates(rec: Recorder, fx: dict, L: int) -> list[tuple[int, int, int]]:
    """(id, row, position): ids the argmax committed at a mid-block position of canvas `eos_canvas` in a row still
    running, that occur in no committed block before it (any row) nor earlier in that block."""
    c = fx["eos_canvas"]
    if len(rec.canvases) <= c:
        return []
    earlier = set()
    for canvas in rec.canvases[:c]:
        earlier.update(canvas["committed"].flatten().tolist())
    block = rec.canvases[c]["committed"]
    out = []
    for row in range(block.shape[0]):
        if first_finished_canvas(rec, row) is not None and first_finished_canvas(rec, row) <= c:
            continue
        ids = block[row].tolist()
        for pos in range(2, L - 2):
            tok = ids[pos]
            if tok == 0 or tok in earlier or tok in ids[:pos] or tok in fx["base_eos"]:
                continue
            out.append((tok, row, pos))
    return out


def eos_inside_block_holds(rec: Recorder, fx: dict, eos_ids: list[int], L: int) -> dict | None:
    """The recorded run ends a row inside canvas `eos_canvas` (EOS mid-block, pads after it) while another row is still
    running when the last canvas is committed."""
    c = fx["eos_canvas"]
    n_canvases = len(rec.canvases)
    ended_inside = None
    for row in range(rec.sequences.shape[0]):
        if first_finished_canvas(rec, row) != c:
            continue
        block = rec.canvases[c]["committed"][row].tolist()
        pos = next(i for i, t in enumerate(block) if t in eos_ids)
        if 0 < pos < L - 1 and all(t == 0 for t in block[pos + 1 :]):
            ended_inside = dict(row=row, canvas=c, position=pos, token=block[pos])
            break
    running = [r for r in range(rec.sequences.shape[0]) if first_finished_canvas(rec, r) is None]
    if ended_inside is None or not running or n_canvases != canvas_count(fx, L):
        return None
    ended_inside["rows_running_to_the_end"] = running
    return ended_inside


def canvas_count(fx: dict, L: int) -> int:
    return -(-fx["max_new_tokens"] // L)


# ------------------------------------------------------------------------------------------------------------------
# The trace
# ------------------------------------------------------------------------------------------------------------------


def top2_gap(x: torch.Tensor) -> torch.Tensor:
    top = x.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def acceptance_margins(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """|exclusive entropy sum - bound| per position, in the sorted order HF uses (docs/generation.md)."""
    sorted_h, order = torch.sort(entropy, dim=-1)
    excl = torch.cumsum(sorted_h, dim=-1) - sorted_h
    return torch.zeros_like(entropy).scatter(-1, order, (excl - bound).abs())


def spec_acceptance(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """The acceptance rule as docs/generation.md states it, in float64 with a stable sort (ties: lower position first)."""
    B, L = entropy.shape
    out = torch.zeros((B, L), dtype=torch.bool)
    for b in range(B):
        h = entropy[b].double().tolist()
        order = sorted(range(L), key=lambda i: h[i])
        excl = 0.0
        for i in order:
            out[b, i] = excl <= bound
            excl += h[i]
    return out


def build_trace(rec: Recorder, fx: dict, input_ids, attention_mask, cfg) -> tuple[dict, dict]:
    L = cfg.canvas_length
    B, P = input_ids.shape
    steps = rec.steps
    # Which canvas each step belongs to: steps come in canvas order, and the schedule counts N..1 in each canvas.
    step_canvas, c = [], -1
    N = fx["max_denoising_steps"]
    for s in steps:
        if s["cur_step"] == N:
            c += 1
        step_canvas.append(c)
    assert c == len(rec.canvases) - 1

    def stack(key, dtype=None):
        t = torch.stack([s[key] for s in steps])
        return t.to(dtype) if dtype is not None else t

    trace: dict[str, torch.Tensor] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "initial_canvas": torch.stack(rec.initial_canvases),
        "step_canvas": torch.tensor(step_canvas, dtype=torch.int64),
        "step_n": torch.tensor([s["cur_step"] for s in steps], dtype=torch.int64),
        "temperature": torch.stack([s["temperature"].reshape(()) for s in steps]).to(torch.float32),
        "canvas_in": stack("canvas_in"),
        "sampled": torch.stack([x.view(B, L) for x in rec.sampled]),
        "renoise": torch.stack(rec.renoise),
        "entropy": stack("entropy"),
        "accepted": stack("accepted", torch.uint8),
        "argmax": stack("argmax"),
        "canvas_out": stack("canvas_out"),
        "finished_denoising": stack("finished_after", torch.uint8),
        "argmax_near_tie": (top2_gap(stack("raw_logits")) < NEAR_TIE_LOGIT_GAP).to(torch.uint8),
        "accept_marginal": (
            torch.stack([acceptance_margins(s["entropy"], fx["entropy_bound"]) for s in steps]) < ACCEPT_MARGIN
        ).to(torch.uint8),
        "committed_argmax": torch.stack([x["argmax"] for x in rec.canvases]),
        "committed": torch.stack([x["committed"] for x in rec.canvases]),
        "finished": torch.stack([x["finished"] for x in rec.canvases]).to(torch.uint8),
        "sequences": rec.sequences,
        "tokens_per_forward": rec.tokens_per_forward.to(torch.float32),
        "decoder_forward_passes": rec.decoder_forward_passes.to(torch.int64),
    }
    # z of selected steps. No row is frozen before any of them, so z is also the self-conditioning logits the step
    # leaves for the next one (a frozen row would keep its previous logits: HF's torch.where).
    z_steps = []
    for canvas, k in fx["z_steps"]:
        s = [i for i, sc in enumerate(step_canvas) if sc == canvas][k]
        assert not steps[s]["finished_before"].any(), f"z step {s} has a frozen row"
        assert torch.equal(steps[s]["self_conditioning_logits"], steps[s]["z"])
        z_steps.append(s)
        trace[f"z.{s}"] = steps[s]["z"]
    # Cache after every commit pass (encoder call k >= 1 encodes block k-1): the newest min(S_l, L) slots of every
    # layer in HF's layout [B, Hkv, slots, D]. Every one of them holds a committed token (valid in the mask).
    cache_lengths = {}
    for k, layers in enumerate(rec.encoder_calls):
        cache_lengths[k] = [int(key.shape[2]) for key, _ in layers]
        if k == 0:
            continue
        for li, (key, value) in enumerate(layers):
            n = min(key.shape[2], L)
            trace[f"cache_k.{k}.{li}"] = key[:, :, -n:].contiguous()
            trace[f"cache_v.{k}.{li}"] = value[:, :, -n:].contiguous()
    trace = {k: v.contiguous() for k, v in trace.items()}
    info = dict(z_steps=z_steps, cache_lengths=cache_lengths, step_canvas=step_canvas)
    return trace, info


def compare_runs(a: Recorder, b: Recorder) -> None:
    """Bit-for-bit equality of every record of two runs."""
    assert torch.equal(a.sequences, b.sequences), "sequences differ"
    assert torch.equal(a.tokens_per_forward, b.tokens_per_forward)
    assert len(a.steps) == len(b.steps) and len(a.canvases) == len(b.canvases)
    for sa, sb in zip(a.steps, b.steps):
        for key in sa:
            x, y = sa[key], sb[key]
            assert (x == y) if not isinstance(x, torch.Tensor) else torch.equal(x, y), key
    for ca, cb in zip(a.canvases, b.canvases):
        for key in ca:
            assert torch.equal(ca[key], cb[key]), key
    for la, lb in zip(a.encoder_calls, b.encoder_calls):
        for (ka, va), (kb, vb) in zip(la, lb):
            assert torch.equal(ka, kb) and torch.equal(va, vb), "cache differs"


def check_trace(rec: Recorder, trace: dict, fx: dict, eos_ids: list[int], cfg) -> dict:
    """Consistency of the record with docs/generation.md; returns the measured values for meta.json."""
    checks: dict = {}
    L, V = cfg.canvas_length, cfg.text_config.vocab_size
    N = fx["max_denoising_steps"]
    # The temperature HF divides by is the contract's f32 formula (docs/generation.md, "The algorithm").
    for s, n in enumerate(trace["step_n"].tolist()):
        t32 = np.float32(fx["t_min"]) + np.float32(fx["t_max"] - fx["t_min"]) * (np.float32(n) / np.float32(N))
        assert np.float32(trace["temperature"][s].item()) == t32, (s, n, trace["temperature"][s].item(), t32)
    checks["temperature_is_f32_formula"] = True
    # z = raw logits / T; the argmax over z is the argmax over the raw logits.
    for st in rec.steps:
        assert torch.equal(st["z"], st["raw_logits"] / st["temperature"])
    # Acceptance: the documented rule (stable order, float64 sums) gives HF's mask wherever the decision is not marginal.
    disagree = 0
    for s, st in enumerate(rec.steps):
        spec = spec_acceptance(st["entropy"], fx["entropy_bound"])
        diff = (spec != st["accepted"]) & (trace["accept_marginal"][s] == 0)
        disagree += int(diff.sum())
    assert disagree == 0, f"{disagree} acceptance decisions differ from the documented rule"
    checks["acceptance_matches_documented_rule"] = True
    accepted_per_step = trace["accepted"].sum(-1)
    checks["accepted_per_step_min_max"] = [int(accepted_per_step.min()), int(accepted_per_step.max())]
    assert int(accepted_per_step.max()) < L, "every position accepted somewhere: the bound gives no partial acceptance"
    # The new canvas: accepted positions take the sample, rejected ones the renoise ids; frozen rows keep theirs.
    for s, st in enumerate(rec.steps):
        acc = st["accepted"]
        fresh = torch.where(acc, trace["sampled"][s], trace["renoise"][s])
        frozen = st["finished_before"][:, None]
        assert torch.equal(st["canvas_out"], torch.where(frozen, st["canvas_in"], fresh))
        argmax = st["z"].argmax(-1)
        assert torch.equal(st["argmax"][~st["finished_before"]], argmax[~st["finished_before"]])
    # The committed block is the last step's argmax, then the EOS rule (docs/generation.md, "The algorithm").
    finished_before = torch.zeros(rec.sequences.shape[0], dtype=torch.bool)
    for c, canvas in enumerate(rec.canvases):
        last = max(i for i, sc in enumerate(trace["step_canvas"].tolist()) if sc == c)
        assert torch.equal(canvas["argmax"], rec.steps[last]["argmax"])
        expect = canvas["argmax"].clone()
        for b in range(expect.shape[0]):
            if finished_before[b]:
                expect[b] = 0
                continue
            hits = [i for i, t in enumerate(expect[b].tolist()) if t in eos_ids]
            if hits:
                expect[b, hits[0] + 1 :] = 0
        assert torch.equal(canvas["committed"], expect), c
        finished_before = canvas["finished"].clone()
    steps_per_canvas = [trace["step_canvas"].tolist().count(c) for c in range(len(rec.canvases))]
    checks["steps_per_canvas"] = steps_per_canvas
    checks["argmax_near_ties"] = int(trace["argmax_near_tie"].sum())
    checks["accept_marginal"] = int(trace["accept_marginal"].sum())
    checks["min_top2_logit_gap"] = float(f"{min(top2_gap(st['raw_logits']).min().item() for st in rec.steps):.3g}")
    checks["min_acceptance_margin"] = float(
        f"{min(acceptance_margins(st['entropy'], fx['entropy_bound']).min().item() for st in rec.steps):.3g}"
    )
    # The stop rule compares the mean entropy of a row with the confidence threshold: keep the decisions away from it,
    # so that an fp32 port (entropy within 1e-5 relative) decides the same.
    means = trace["entropy"].double().mean(-1)
    stop_margin = float(((means - fx["confidence_threshold"]).abs() / fx["confidence_threshold"]).min())
    assert stop_margin >= STOP_MARGIN, f"a row's mean entropy is within {stop_margin:.2g} (relative) of the threshold"
    checks["min_stop_margin_relative"] = float(f"{stop_margin:.3g}")
    # The initial canvases and renoise ids are uniform over all V ids (specials included): a loose sanity bound.
    assert int(trace["renoise"].max()) < V and int(trace["renoise"].min()) >= 0
    return checks


# ------------------------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------------------------


def write_fixture(name: str, fx: dict, out_dir: Path, log) -> dict:
    model_dir = REPO_ROOT / MODEL_ROOT / fx["model"]
    model, cfg = load_model(model_dir)
    L = cfg.canvas_length
    input_ids, attention_mask = make_prompts(fx, cfg)

    # Run 1: the base EOS ids. Then the extra EOS id, same seed (docstring, "EOS inside a block").
    first = run_generate(model, input_ids, attention_mask, generation_config(fx, fx["base_eos"]), fx["torch_seed"])
    tried = []
    rec = eos_ids = eos_info = None
    for token, row, pos in eos_candidates(first, fx, L):
        ids = fx["base_eos"] + [token]
        tried.append(token)
        candidate = run_generate(model, input_ids, attention_mask, generation_config(fx, ids), fx["torch_seed"])
        info = eos_inside_block_holds(candidate, fx, ids, L)
        if info is not None:
            rec, eos_ids, eos_info = candidate, ids, info
            break
    assert rec is not None, f"{name}: no extra EOS id ends a row inside canvas {fx['eos_canvas']} (tried {tried})"
    log(f"  [{name}] EOS ids {eos_ids}: {eos_info}")

    # Determinism and replay: the same seed again, and the recorded draws under another seed, reproduce everything.
    again = run_generate(model, input_ids, attention_mask, generation_config(fx, eos_ids), fx["torch_seed"])
    compare_runs(rec, again)
    replayed = run_generate(model, input_ids, attention_mask, generation_config(fx, eos_ids), fx["torch_seed"] + 1, rec)
    compare_runs(rec, replayed)
    unreplayed = run_generate(model, input_ids, attention_mask, generation_config(fx, eos_ids), fx["torch_seed"] + 1)
    assert not torch.equal(unreplayed.sequences, rec.sequences), "another seed gives the same text: draws unused?"

    trace, info = build_trace(rec, fx, input_ids, attention_mask, cfg)
    checks = check_trace(rec, trace, fx, eos_ids, cfg)
    checks["rerun_bit_identical"] = True
    checks["replay_of_recorded_draws_bit_identical"] = True
    checks["another_seed_changes_the_text"] = True

    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    gen_cfg = generation_config(fx, eos_ids)
    gen_cfg.save_pretrained(d)
    # The written file must be what HF reads back.
    assert hf_gen.DiffusionGemmaGenerationConfig.from_pretrained(d).to_dict() == gen_cfg.to_dict()
    save_file(trace, str(d / "trace.safetensors"), metadata={"format": "pt"})

    tc = cfg.text_config
    n_steps = len(rec.steps)
    meta = dict(
        name=name,
        description=fx["description"],
        model=str(MODEL_ROOT / fx["model"]),
        batch_size=int(input_ids.shape[0]),
        prompt_width=int(input_ids.shape[1]),
        prompt_lengths=fx["prompt_lengths"],
        canvas_length=L,
        vocab_size=tc.vocab_size,
        layer_types=list(tc.layer_types),
        sliding_window=tc.sliding_window,
        settings=dict(
            max_new_tokens=fx["max_new_tokens"],
            max_denoising_steps=fx["max_denoising_steps"],
            entropy_bound=fx["entropy_bound"],
            t_min=fx["t_min"],
            t_max=fx["t_max"],
            stability_threshold=fx["stability_threshold"],
            confidence_threshold=fx["confidence_threshold"],
            eos_token_id=eos_ids,
            pad_token_id=0,
        ),
        prompt_seed=fx["prompt_seed"],
        torch_seed=fx["torch_seed"],
        eos_inside_block=eos_info,
        extra_eos_ids_tried=tried,
        canvases=len(rec.canvases),
        steps=n_steps,
        step_canvas=info["step_canvas"],
        z_steps=info["z_steps"],
        cache_slots_per_encoder_call=info["cache_lengths"],
        near_tie_logit_gap=NEAR_TIE_LOGIT_GAP,
        accept_margin=ACCEPT_MARGIN,
        checks=checks,
        generator="tools/reference/make_generation_fixtures.py",
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(f"  [{name}] {len(rec.canvases)} canvases, {n_steps} steps, checks {json.dumps(checks)}")
    return meta


def write_versions(out_dir: Path, argv: list[str]) -> None:
    import safetensors

    versions = dict(
        python=sys.version.split()[0],
        torch=torch.__version__,
        transformers=transformers.__version__,
        safetensors=safetensors.__version__,
        numpy=np.__version__,
        command=" ".join(
            ["python3", "tools/reference/make_generation_fixtures.py"]
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
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    set_determinism()
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    transformers.logging.set_verbosity_error()  # the load report lists the (absent) vision tensors as MISSING
    names = args.only or list(FIXTURES)
    out_dir = args.out_dir if args.out_dir.is_absolute() else REPO_ROOT / args.out_dir

    if args.check:
        ok = True
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                write_fixture(name, FIXTURES[name], Path(tmp), log)
                for f in sorted(os.listdir(Path(tmp) / name)):
                    a, b = Path(tmp) / name / f, out_dir / name / f
                    same = b.exists() and filecmp.cmp(a, b, shallow=False)
                    log(f"  {name}/{f}: {'identical' if same else 'DIFFERS'}")
                    ok &= same
        print("check: all fixture files bit-identical" if ok else "check: FIXTURES DIFFER")
        return 0 if ok else 1

    for name in names:
        log(f"building {name}")
        write_fixture(name, FIXTURES[name], out_dir, log)
        size = sum(p.stat().st_size for p in (out_dir / name).iterdir())
        log(f"  wrote {out_dir.name}/{name}: {size} bytes")
    write_versions(args.out_dir, sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
