#!/usr/bin/env python3
"""One DiffusionGemma training step in dgemma (CPU backend) and in PyTorch eager + HF transformers, side by side.

For each model config, both sides run the same micro-batch (B rows, prompt width P, canvas L; every prompt token real,
the canvas full, t and the noisy canvas injected) through the same objective: the decoder loss of --objective with
detached two-pass self-conditioning (fixed coins 1, 0, 1, 0, ... so pass 1 always runs) and the clean-target encoder
loss, then the backward pass. dgemma runs `dgemma-bench-train-step --json` (train_step, the compiled plan's forward +
backward); PyTorch runs HF's DiffusionGemmaForBlockDiffusion in fp32 with eager attention and the eager per-expert MoE
loop, `loss.backward()` with the gradients set to None before each step. By default dgemma reads the very weights the
HF model was initialised with, so the two losses must agree (the table says how closely); the batch is drawn by the
same splitmix64 stream on both sides and checked by checksum.

Tokens per step = B * (P + L); tokens/s = that / mean seconds per step; ratio = dgemma tokens/s / PyTorch tokens/s.
The second table also gives each side's CPU seconds (user + system, all threads) per timed step, which a shared machine's
other load moves much less than the wall-clock time.
The optimizer step (global-norm clip + AdamW over every parameter) is timed separately on both sides.

Usage (from the repository root, after `ninja -C build dgemma-bench-train-step`):
    python3 bench/train_step_vs_pytorch.py [--dgemma-bin build/bin/dgemma-bench-train-step] [--threads 2]
        [--micro-batch 4] [--prompt-len 64] [--warmup 2] [--iters 5] [--min-seconds 3] [--profile] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = ["models/diffusion_gemma/configs/tiny-cpu.json", "models/diffusion_gemma/configs/small-20m.json"]
DEFAULT_BIN = "build/bin/dgemma-bench-train-step"
OBJECTIVES = ("base-sft", "reweighted-ce", "loo-ce", "reweighted-loo-ce")
# HF always instantiates a vision tower (vision_config=None means the full default one); this tiny one is never run.
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
MASK64 = (1 << 64) - 1


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dgemma-bin", default=DEFAULT_BIN, help=f"dgemma-bench-train-step (default {DEFAULT_BIN})")
    ap.add_argument("--config", action="append", help="model config.json (repeatable; default: tiny-cpu and small-20m)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--objective", default="base-sft", choices=OBJECTIVES)
    ap.add_argument("--self-cond-prob", type=float, default=0.5)
    ap.add_argument("--encoder-loss-weight", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2, help="threads for both sides (default 2)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5, help="at least this many timed steps per side and entry")
    ap.add_argument(
        "--min-seconds", type=float, default=3.0, help="and at least this much timed time (so tiny steps repeat more)"
    )
    ap.add_argument("--seed", type=int, default=1234, help="batch seed (both sides) and dgemma's init seed")
    ap.add_argument(
        "--dgemma-init",
        action="store_true",
        help="let dgemma draw its own weights (initializeWeights) instead of reading the HF model's",
    )
    ap.add_argument("--profile", action="store_true", help="also print dgemma's per-op profile (stderr of the binary)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    return ap.parse_args()


def import_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion  # noqa: F401
    except ImportError as error:
        print(
            f"train_step_vs_pytorch.py: PyTorch and HF transformers (with DiffusionGemma) are needed: {error}\n"
            "  install them with: pip install torch transformers",
            file=sys.stderr,
        )
        sys.exit(2)


# ----------------------------------------------------------------------------------------------------------------------
# The batch: the same splitmix64 stream as bench/train_step_bench.cpp (makeBatch)


class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self) -> float:
        return (self.next() >> 11) * 2.0**-53


def make_batch(cfg, raw_config: dict, rows: int, prompt_len: int, seed: int):
    import torch

    tc = cfg.text_config
    vocab, canvas = tc.vocab_size, cfg.canvas_length
    special = {tc.pad_token_id, tc.bos_token_id, cfg.image_token_id, cfg.boi_token_id, cfg.eoi_token_id}
    # dgemma's rule: the top-level eos list when config.json has one, else the text config's.
    eos = raw_config.get("eos_token_id", raw_config["text_config"].get("eos_token_id"))
    special.update(eos if isinstance(eos, (list, tuple)) else [eos])
    rng = SplitMix64(seed)
    input_ids = []
    for i in range(rows * prompt_len):
        token = tc.bos_token_id
        if i % prompt_len != 0:
            token = rng.next() % vocab
            while token in special:
                token = rng.next() % vocab
        input_ids.append(token)
    canvas_ids = [rng.next() % vocab for _ in range(rows * canvas)]
    times = torch.tensor([0.1 + 0.8 * (b + 0.5) / rows for b in range(rows)], dtype=torch.float32)
    noisy = []
    for i in range(rows * canvas):
        replace = rng.uniform() < float(times[i // canvas])
        noisy.append(rng.next() % vocab if replace else canvas_ids[i])
    checksum = 0
    for values in (input_ids, canvas_ids, noisy):
        checksum = (checksum + sum((i + 1) * v for i, v in enumerate(values))) & MASK64
    batch = dict(
        input_ids=torch.tensor(input_ids, dtype=torch.int64).view(rows, prompt_len),
        attention_mask=torch.ones((rows, prompt_len), dtype=torch.int64),
        canvas_ids=torch.tensor(canvas_ids, dtype=torch.int64).view(rows, canvas),
        canvas_mask=torch.ones((rows, canvas), dtype=torch.float32),
        noisy_canvas_ids=torch.tensor(noisy, dtype=torch.int64).view(rows, canvas),
        diffusion_t=times,
        self_conditioning_mask=torch.tensor([1.0 if b % 2 == 0 else 0.0 for b in range(rows)], dtype=torch.float32),
    )
    return batch, checksum


# ----------------------------------------------------------------------------------------------------------------------
# The HF model and the objective (docs/training.md, "The objective", as the fixture generator evaluates it)


def build_model(config_path: Path):
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    raw = json.loads(config_path.read_text())
    text_config = raw.pop("text_config")
    for key in ("model_type", "architectures", "vision_config"):
        raw.pop(key, None)
    cfg = DiffusionGemmaConfig(text_config=text_config, vision_config=dict(TINY_VISION), **raw)
    # Eager attention and HF's eager per-expert MoE loop (otherwise transformers picks grouped_mm for the experts).
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
        c._experts_implementation = "eager"
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(cfg).to(torch.float32).train()
    for layer in list(model.model.decoder.layers) + list(model.model.encoder.language_model.layers):
        assert layer.self_attn.config._attn_implementation == "eager"
        assert layer.experts.config._experts_implementation == "eager"
    assert model.config.text_config.attention_dropout == 0.0
    return model, cfg


def text_parameters(model):
    """The trainable text parameters (tied tensors once); the vision tower is excluded from the step."""
    return [p for n, p in model.named_parameters() if not n.startswith(VISION_PREFIXES)]


def softcap(x, cap: float):
    import torch

    return torch.tanh(x / cap) * cap


def decoder_logits(model, batch, sc_logits=None, sc_mask=None):
    import torch.nn.functional as F

    am = batch["attention_mask"]
    L = batch["noisy_canvas_ids"].shape[1]
    out = model.model(
        input_ids=batch["input_ids"],
        attention_mask=am,
        decoder_input_ids=batch["noisy_canvas_ids"],
        decoder_attention_mask=F.pad(am.bool(), (0, L), value=True),
        self_conditioning_logits=sc_logits,
        self_conditioning_mask=sc_mask,
    )
    return softcap(model.lm_head(out.last_hidden_state), model.final_logit_softcapping)


def encoder_loss(model, batch):
    import torch
    from transformers import DynamicCache

    P, L = batch["input_ids"].shape[1], batch["canvas_ids"].shape[1]
    out = model.model.encoder(
        input_ids=torch.cat([batch["input_ids"], batch["canvas_ids"]], dim=1),
        attention_mask=torch.cat([batch["attention_mask"], batch["canvas_mask"].to(torch.int64)], dim=1),
        position_ids=torch.arange(P + L, dtype=torch.int64).unsqueeze(0),
        cache=DynamicCache(config=model.config.text_config),
    )
    logits = softcap(model.lm_head(out.last_hidden_state[:, P - 1 : P + L - 1]), model.final_logit_softcapping)
    M = batch["canvas_mask"]
    ce = -torch.log_softmax(logits, dim=-1).gather(-1, batch["canvas_ids"].unsqueeze(-1)).squeeze(-1)
    return (M * ce).sum() / torch.clamp(M.sum(), min=1.0)


def objective(model, batch, args):
    import torch
    import torch.nn.functional as F

    B = batch["input_ids"].shape[0]
    sc_logits = sc_mask = None
    if args.self_cond_prob > 0:
        with torch.no_grad():
            sc_logits = decoder_logits(model, batch).detach()
        sc_mask = batch["self_conditioning_mask"].bool()
    f = decoder_logits(model, batch, sc_logits, sc_mask)
    x0, xt, M, t = batch["canvas_ids"], batch["noisy_canvas_ids"], batch["canvas_mask"], batch["diffusion_t"]
    alpha = 1.0 - t
    z = f
    if args.objective.endswith("loo-ce"):
        delta = torch.log(1.0 + f.shape[-1] * alpha / torch.clamp(1.0 - alpha, min=1e-12))
        z = f + delta[:, None, None] * F.one_hot(xt, f.shape[-1]).to(f.dtype)
    ce = -torch.log_softmax(z, dim=-1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    w = 1.0 / torch.clamp(alpha, min=1e-12) if args.objective.startswith("reweighted") else torch.ones_like(t)
    per_example = w * (M * ce).sum(-1) / torch.clamp(M.sum(-1), min=1.0)
    loss = per_example.sum() / B
    if args.encoder_loss_weight > 0:
        loss = loss + args.encoder_loss_weight * encoder_loss(model, batch)
    return loss


def timed(body, warmup: int, args) -> tuple[list[float], float]:
    """Seconds of each timed call (`warmup` untimed calls, then at least --iters calls and --min-seconds), and the
    process's CPU seconds (user + system, every thread) per timed call."""
    for _ in range(warmup):
        body()
    times: list[float] = []
    cpu_start = time.process_time()
    while len(times) < args.iters or sum(times) < args.min_seconds:
        start = time.perf_counter()
        body()
        times.append(time.perf_counter() - start)
    return times, (time.process_time() - cpu_start) / len(times)


def time_pytorch(model, batch, args) -> dict:
    import torch

    params = text_parameters(model)
    last = {}

    def step():
        model.zero_grad(set_to_none=True)
        loss = objective(model, batch, args)
        loss.backward()
        last["loss"] = loss.item()

    times, cpu = timed(step, args.warmup, args)

    # The optimizer step dgemma's optimizer_step entry does: global-norm clip to 1.0, then AdamW (torch's default
    # implementation choice), on zero gradients.
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for p in params:
        p.grad = torch.zeros_like(p)

    def optimizer_step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    opt_times, _ = timed(optimizer_step, max(args.warmup, 1), args)
    return dict(
        steps=len(times),
        mean=sum(times) / len(times),
        min=min(times),
        cpu=cpu,
        loss=last["loss"],
        optimizer_mean=sum(opt_times) / len(opt_times),
        params=sum(p.numel() for p in params),
    )


# ----------------------------------------------------------------------------------------------------------------------


def run_dgemma(binary: Path, config: Path, weights: Path | None, args) -> dict:
    cmd = [
        str(binary),
        "--model", str(config),
        "--micro-batch", str(args.micro_batch),
        "--prompt-len", str(args.prompt_len),
        "--objective", args.objective,
        "--self-cond-prob", repr(args.self_cond_prob),
        "--encoder-loss-weight", repr(args.encoder_loss_weight),
        "--threads", str(args.threads),
        "--warmup", str(args.warmup),
        "--iters", str(args.iters),
        "--min-seconds", repr(args.min_seconds),
        "--seed", str(args.seed),
        "--json",
    ]  # fmt: skip
    if weights is not None:
        cmd += ["--weights", str(weights)]
    if args.profile:
        cmd.append("--profile")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nfailed with exit code {done.returncode}:\n{done.stderr}")
    if args.profile:
        print(f"--- dgemma profile, {config.name} ---{done.stderr}", file=sys.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if len(lines) != 1:
        raise SystemExit(f"{' '.join(cmd)}: expected one JSON line, got:\n{done.stdout}")
    return json.loads(lines[0])


def save_text_weights(model, path: Path) -> None:
    """The HF text weights under their checkpoint names (model.decoder.*: the encoder's text stack is the same tensors)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k.startswith("model.decoder.")}
    save_file(tensors, str(path))


def main() -> int:
    args = parse_args()
    import_torch()
    import torch
    import transformers

    binary = Path(args.dgemma_bin)
    binary = binary if binary.is_absolute() else REPO_ROOT / binary
    if not binary.is_file():
        print(f"train_step_vs_pytorch.py: {binary}: not found (ninja -C build dgemma-bench-train-step)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    configs = [Path(c) for c in (args.config or DEFAULT_CONFIGS)]
    configs = [c if c.is_absolute() else REPO_ROOT / c for c in configs]

    cores = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        print(
            f"warning: load average {load_before:.2f} on {cores} core(s) before the run: other processes share the CPU "
            "and the timings will be noisy",
            file=sys.stderr,
        )
    rows = []
    for config in configs:
        model, cfg = build_model(config)
        batch, checksum = make_batch(cfg, json.loads(config.read_text()), args.micro_batch, args.prompt_len, args.seed)
        with tempfile.TemporaryDirectory() as tmp:
            weights = None
            if not args.dgemma_init:
                weights = Path(tmp) / "model.safetensors"
                save_text_weights(model, weights)
            dg = run_dgemma(binary, config, weights, args)
        if dg["batch_checksum"] != checksum:
            raise SystemExit(f"{config}: dgemma's batch differs from this script's (checksum {dg['batch_checksum']} != {checksum})")
        pt = time_pytorch(model, batch, args)
        if pt["params"] != dg["params"]:
            print(f"warning: {config.name}: parameter counts differ: dgemma {dg['params']}, PyTorch {pt['params']}", file=sys.stderr)
        tokens = dg["tokens_per_step"]
        rows.append(
            dict(
                config=config.stem,
                params=dg["params"],
                tokens=f"{args.micro_batch}x({args.prompt_len}+{cfg.canvas_length})={tokens}",
                dg_s=dg["train_step_mean_s"],
                dg_tps=tokens / dg["train_step_mean_s"],
                pt_s=pt["mean"],
                pt_tps=tokens / pt["mean"],
                ratio=pt["mean"] / dg["train_step_mean_s"],
                dg_min=dg["train_step_min_s"],
                pt_min=pt["min"],
                dg_cpu=dg["train_step_cpu_s"],
                pt_cpu=pt["cpu"],
                dg_opt=dg["optimizer_step_mean_s"],
                pt_opt=pt["optimizer_mean"],
                dg_loss=dg["loss"],
                pt_loss=pt["loss"],
                steps=f"{dg['train_steps_timed']}/{pt['steps']}",
            )
        )
        del model

    print(
        f"One training step (forward + backward): {args.objective}, self-conditioning p {args.self_cond_prob:g} "
        f"(coins 1,0,1,0,...), encoder loss weight {args.encoder_loss_weight:g}; {args.threads} thread(s); "
        f"warmup {args.warmup}, then at least {args.iters} timed steps and {args.min_seconds:g} s; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"weights: {'each side its own init' if args.dgemma_init else 'the same (HF init, read by dgemma)'}; "
        f"{cores} core(s), load average {load_before:.2f} before and {os.getloadavg()[0]:.2f} after"
    )
    header = ["config", "params", "tokens/step", "dgemma s/step", "dgemma tok/s", "PyTorch s/step", "PyTorch tok/s", "ratio"]
    table = [
        [
            r["config"],
            f"{r['params']:,}",
            r["tokens"],
            f"{r['dg_s']:.4f}",
            f"{r['dg_tps']:.0f}",
            f"{r['pt_s']:.4f}",
            f"{r['pt_tps']:.0f}",
            f"{r['ratio']:.2f}x",
        ]
        for r in rows
    ]
    extra_header = ["config", "timed steps dgemma/PyTorch", "dgemma min s", "PyTorch min s", "dgemma CPU s", "PyTorch CPU s",
                    "dgemma optimizer s", "PyTorch optimizer s", "dgemma loss", "PyTorch loss"]
    extra = [
        [
            r["config"],
            r["steps"],
            f"{r['dg_min']:.4f}",
            f"{r['pt_min']:.4f}",
            f"{r['dg_cpu']:.4f}",
            f"{r['pt_cpu']:.4f}",
            f"{r['dg_opt']:.4f}",
            f"{r['pt_opt']:.4f}",
            f"{r['dg_loss']:.6f}",
            f"{r['pt_loss']:.6f}",
        ]
        for r in rows
    ]
    for head, body in ((header, table), (extra_header, extra)):
        print()
        if args.markdown:
            print("| " + " | ".join(head) + " |")
            print("|" + "|".join("---" for _ in head) + "|")
            for line in body:
                print("| " + " | ".join(line) + " |")
        else:
            widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(head)]
            print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
            for line in body:
                print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))))
    if not args.dgemma_init:
        worst = max(abs(r["dg_loss"] - r["pt_loss"]) / abs(r["pt_loss"]) for r in rows)
        print(f"\nsame weights and batch: largest relative loss difference {worst:.2e}")
        if worst > 1e-4:
            print("error: the two sides disagree on the loss (bound 1e-4): they are not running the same step", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
