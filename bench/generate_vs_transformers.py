#!/usr/bin/env python3
"""Block-diffusion generation on the CPU: `dgemma-run generate` next to HF transformers' `generate`, same weights,
same prompts, same settings, same machine, in one run.

For each model config (default: models/diffusion_gemma/configs/tiny-cpu.json and small-20m.json) the script
  1. builds the HF model with its default random init (torch seed --seed) and writes it once to a temporary
     directory as an HF checkpoint: config.json, generation_config.json (the run's settings), model.safetensors (the
     text weights under the checkpoint names) and the bundled tokenizer (data/tokenizer);
  2. takes --requests chat prompts from test/fixtures/tokenizer/conversations.json, whose `input_ids` are HF's own
     chat-template tokenization of `messages` with the bundled tokenizer (dgemma's tokenizer reproduces them, see
     docs/data.md), so both sides generate from the same ids;
  3. runs HF `DiffusionGemmaForBlockDiffusion.generate` (fp32, eager attention, eager experts, --threads torch
     threads) on the left-padded batch of those ids, --iters times after a one-step warm-up call;
  4. compiles an inference plan (`dgemma-compile --mode infer --micro-batch R --prompt-len P`) and runs
     `dgemma-run generate --input prompts.jsonl --json --threads T` with the same --max-new-tokens and --steps.

New tokens are counted as transformers counts them for `tokens_per_forward`: the non-pad ids after the prompt. The
two sides draw different random numbers (bit compatibility with torch's generator is not a goal,
docs/generation.md), so their texts differ; with random weights no row ever meets the stop rule, so both run every
denoising step of every canvas, and only an EOS can make the counts differ (the table shows both counts).
tokens/s = new tokens / seconds; ratio = dgemma tokens/s / transformers tokens/s. dgemma's seconds are its own
measurement of the generation (the summary line it ends stderr with: plan loading and weight reading excluded, as
they are for HF, whose model is built before the clock starts).

Usage (from the repository root; no CMake involved beyond having built the two tools):
    ninja -C build dgemma-compile dgemma-run
    python3 bench/generate_vs_transformers.py [--bin-dir build/bin] [--config CONFIG.json ...] [--requests 8]
        [--max-new-tokens 64] [--steps 16] [--threads 2] [--iters 1] [--seed 0] [--markdown]
Needs torch, transformers (with DiffusionGemma) and safetensors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = ["models/diffusion_gemma/configs/tiny-cpu.json", "models/diffusion_gemma/configs/small-20m.json"]
CONVERSATIONS = REPO_ROOT / "test/fixtures/tokenizer/conversations.json"
TOKENIZER_DIR = REPO_ROOT / "data/tokenizer"
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


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default="build/bin", help="where dgemma-compile and dgemma-run are (default build/bin)")
    ap.add_argument("--config", action="append", help="model config.json (repeatable; default: tiny-cpu and small-20m)")
    ap.add_argument("--requests", type=int, default=8, help="prompts per run, one micro-batch (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16, help="max denoising steps per canvas (default 16)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for both sides (default 2)")
    ap.add_argument("--iters", type=int, default=1, help="timed HF generate calls, after a one-step warm-up (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="torch seed of the weights; both sides' generation seed")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    return ap.parse_args()


def import_hf():
    try:
        import safetensors  # noqa: F401
        import torch  # noqa: F401
        from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion  # noqa: F401
    except ImportError as error:
        print(f"generate_vs_transformers.py: torch, safetensors and transformers are needed: {error}", file=sys.stderr)
        sys.exit(2)


# ----------------------------------------------------------------------------------------------------------------------
# The shared inputs


def prompts(count: int, vocab_size: int) -> list[dict]:
    """`count` conversations (cycled if the fixture has fewer) with HF's chat-template ids."""
    conversations = json.loads(CONVERSATIONS.read_text())["conversations"]
    usable = [c for c in conversations if not c["image_soft_tokens"] and max(c["input_ids"]) < vocab_size]
    if not usable:
        raise SystemExit(f"{CONVERSATIONS}: no text-only conversation fits a vocabulary of {vocab_size}")
    return [usable[i % len(usable)] for i in range(count)]


def generation_settings(args) -> dict:
    """The run's generation_config.json: the documented defaults, the benchmark's step count and length."""
    return {
        "max_new_tokens": args.max_new_tokens,
        "max_denoising_steps": args.steps,
        "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
        "t_min": 0.4,
        "t_max": 0.8,
        "stability_threshold": 1,
        "confidence_threshold": 0.005,
        "pad_token_id": 0,
    }


def build_model(config_path: Path, seed: int):
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    raw = json.loads(config_path.read_text())
    text_config = raw.pop("text_config")
    for key in ("model_type", "architectures", "vision_config"):
        raw.pop(key, None)
    cfg = DiffusionGemmaConfig(text_config=text_config, vision_config=dict(TINY_VISION), **raw)
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
        c._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(cfg).to(torch.float32).eval()
    work_around_eager_decoder_mask(model)
    return model, cfg


def work_around_eager_decoder_mask(model) -> None:
    """transformers 5.24.0 builds generate's decoder mask from an integer dummy, which the eager mask rejects
    (tools/reference/README.md, "Generation traces"); a float dummy of the same shape gives the same mask."""
    import torch

    decoder = model.model.decoder
    original = decoder.create_diffusion_decoder_attention_mask

    def create_mask(*a, inputs_embeds, **kw):
        if not inputs_embeds.is_floating_point():
            inputs_embeds = torch.empty(inputs_embeds.shape[:2] + (0,), dtype=model.dtype, device=inputs_embeds.device)
        return original(*a, inputs_embeds=inputs_embeds, **kw)

    decoder.create_diffusion_decoder_attention_mask = create_mask


def write_checkpoint(model, config_path: Path, settings: dict, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(config_path, out / "config.json")
    (out / "generation_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    # The text weights under their checkpoint names (model.decoder.*: the encoder's text stack is the same tensors).
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k.startswith("model.decoder.")}
    save_file(tensors, str(out / "model.safetensors"))
    for f in TOKENIZER_DIR.iterdir():
        if f.is_file() and f.suffix in (".model", ".json"):
            shutil.copy(f, out / f.name)


# ----------------------------------------------------------------------------------------------------------------------
# transformers


def run_transformers(model, cfg, rows: list[dict], settings: dict, args) -> dict:
    import torch
    from transformers.models.diffusion_gemma import generation_diffusion_gemma as hf_gen

    ids = [r["input_ids"] for r in rows]
    width = max(len(x) for x in ids)
    pad = cfg.text_config.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], dtype=torch.int64)
    attention_mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], dtype=torch.int64)
    gen_settings = dict(settings)
    gen_settings["sampler_config"] = hf_gen.EntropyBoundSamplerConfig(entropy_bound=settings["sampler_config"]["entropy_bound"])
    eos = cfg.text_config.eos_token_id
    gen_settings["eos_token_id"] = eos if isinstance(eos, list) else [eos]  # what dgemma falls back to
    gen_config = hf_gen.DiffusionGemmaGenerationConfig(**gen_settings)

    def call(seed, config):
        torch.manual_seed(seed)
        return model.generate(input_ids, attention_mask=attention_mask, generation_config=config)

    # Warm-up (first-call allocations) with one denoising step: a full call takes minutes on small-20m.
    call(args.seed + 1, hf_gen.DiffusionGemmaGenerationConfig(**dict(gen_settings, max_denoising_steps=1)))
    times, new_tokens = [], []
    for i in range(args.iters):
        start = time.perf_counter()
        out = call(args.seed + i, gen_config)
        times.append(time.perf_counter() - start)
        new_tokens.append(int((out.sequences[:, width:] != pad).sum()))
    return dict(seconds=sum(times) / len(times), new_tokens=sum(new_tokens) / len(new_tokens), prompt_width=width)


# ----------------------------------------------------------------------------------------------------------------------
# dgemma


def run_checked(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nfailed with exit code {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


# The summary line dgemma-run generate ends stderr with (docs/generation.md, "dgemma-run generate").
SUMMARY = re.compile(r"generated (\d+) requests: (\d+) new tokens in ([0-9.eE+-]+) s")


def run_dgemma(bin_dir: Path, checkpoint: Path, rows: list[dict], prompt_width: int, pad: int, args, work: Path) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    plan = work / "plan"
    run_checked(
        [str(bin_dir / "dgemma-compile"), "--model", str(checkpoint), "--mode", "infer",
         "--micro-batch", str(len(rows)), "--prompt-len", str(prompt_width), "-o", str(plan)],
        env,
    )  # fmt: skip
    prompts_file = work / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in rows))
    done = run_checked(
        [str(bin_dir / "dgemma-run"), "generate", "--plan", str(plan), "--weights", str(checkpoint),
         "--input", str(prompts_file), "--max-new-tokens", str(args.max_new_tokens), "--steps", str(args.steps),
         "--seed", str(args.seed), "--threads", str(args.threads), "--json"],
        env,
    )  # fmt: skip
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    summaries = SUMMARY.findall(done.stderr)
    if len(results) != len(rows) or len(summaries) != 1:
        raise SystemExit(f"dgemma-run generate: expected {len(rows)} JSON results and one summary line, got:\n"
                         f"{done.stdout}\n{done.stderr}")  # fmt: skip
    requests, new_tokens, seconds = int(summaries[0][0]), int(summaries[0][1]), float(summaries[0][2])
    counted = sum(sum(1 for t in r["tokens"] if t != pad) for r in results)
    if requests != len(rows) or counted != new_tokens:
        raise SystemExit(f"dgemma-run generate: summary says {requests} requests and {new_tokens} new tokens, the "
                         f"results hold {len(results)} and {counted}")  # fmt: skip
    return dict(seconds=seconds, new_tokens=new_tokens)


# ----------------------------------------------------------------------------------------------------------------------


def main() -> int:
    args = parse_args()
    import_hf()
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    bin_dir = Path(args.bin_dir)
    bin_dir = bin_dir if bin_dir.is_absolute() else REPO_ROOT / bin_dir
    for tool in ("dgemma-compile", "dgemma-run"):
        if not (bin_dir / tool).is_file():
            print(f"generate_vs_transformers.py: {bin_dir / tool}: not found (ninja -C build {tool})", file=sys.stderr)
            return 2
    torch.set_num_threads(args.threads)
    configs = [Path(c) for c in (args.config or DEFAULT_CONFIGS)]
    configs = [c if c.is_absolute() else REPO_ROOT / c for c in configs]
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()[0]

    table = []
    settings = generation_settings(args)
    for config in configs:
        model, cfg = build_model(config, args.seed)
        rows = prompts(args.requests, cfg.text_config.vocab_size)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = Path(tmp) / "checkpoint"
            write_checkpoint(model, config, settings, checkpoint)
            hf = run_transformers(model, cfg, rows, settings, args)
            dg = run_dgemma(bin_dir, checkpoint, rows, hf["prompt_width"], cfg.text_config.pad_token_id, args, Path(tmp))
        hf_tps, dg_tps = hf["new_tokens"] / hf["seconds"], dg["new_tokens"] / dg["seconds"]
        table.append(
            dict(
                config=config.stem,
                requests=len(rows),
                new=f"{dg['new_tokens']:.0f} / {hf['new_tokens']:.0f}",
                dg_s=dg["seconds"],
                hf_s=hf["seconds"],
                dg_tps=dg_tps,
                hf_tps=hf_tps,
                ratio=dg_tps / hf_tps,
            )
        )
        del model

    print(
        f"Generation, {args.requests} requests (one batch), {args.max_new_tokens} new tokens max, {args.steps} denoising "
        f"steps max, {args.threads} thread(s); HF: mean of {args.iters} calls after a warm-up; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; {cores} core(s), load average {load_before:.2f} before and "
        f"{os.getloadavg()[0]:.2f} after"
    )
    header = ["config", "requests", "new tokens (dgemma / HF)", "dgemma s", "HF s", "dgemma tok/s", "HF tok/s", "ratio"]
    lines = [
        [r["config"], str(r["requests"]), r["new"], f"{r['dg_s']:.3f}", f"{r['hf_s']:.3f}", f"{r['dg_tps']:.1f}",
         f"{r['hf_tps']:.1f}", f"{r['ratio']:.2f}x"]
        for r in table
    ]  # fmt: skip
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for line in lines:
            print("  ".join(c.ljust(w) for c, w in zip(line, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
