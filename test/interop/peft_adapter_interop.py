"""dgemma's LoRA adapter directories against the real PEFT on transformers' DiffusionGemma
(docs/training.md, "LoRA adapters").

Usage: peft_adapter_interop.py DGEMMA_COMPILE DGEMMA_RUN --lora-targets LIST
       (run with the test venv's Python: torch, transformers 5.24.0 and peft 0.21.2 of
       test/requirements.txt)

On the all_experts fixture model (test/fixtures/diffusion_gemma/all_experts) and its forward batch:
1. dgemma-compile --mode train --lora 4:8 --lora-targets LIST, then dgemma-run train for 3 steps
   (mock data, lr 1e-2) with --save-dir: the newest checkpoint directory is the adapter directory.
2. PeftModel.from_pretrained loads that directory onto DiffusionGemmaForBlockDiffusion (fp32): no
   missing and no unexpected adapter keys (PEFT's own load result and its warnings), the encoder's
   copy of every adapter equal to the decoder's (dgemma has one adapter for both), and lora_B moved
   away from its zero init by the training.
3. dgemma-run forward --adapter DIR over the unmerged base: its logits against PEFT's fp32 logits,
   max|d| / max|ref| <= 1e-5; and the adapter must change the logits (against the base alone).
4. dgemma-run export --merge-adapter DIR: the merged directory opens in transformers'
   from_pretrained with no missing (text) or unexpected keys, and its logits match dgemma's
   adapter forward within 1e-5.
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools/reference"))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import peft  # noqa: E402
import transformers  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion  # noqa: E402

# The fixture's tiny vision config, and the forward call generate() makes (tools/reference/README.md).
import make_diffusion_gemma_fixtures as fixtures  # noqa: E402

MODEL = REPO_ROOT / "test/fixtures/diffusion_gemma/all_experts"
BOUND = 1e-5
failures = []


def check(condition, message):
    print(("ok: " if condition else "FAIL: ") + message, flush=True)
    if not condition:
        failures.append(message)
    return condition


def run(command):
    print("$ " + " ".join(str(c) for c in command), flush=True)
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        print(result.stdout + result.stderr)
        print(f"FAIL: exit {result.returncode}: {' '.join(str(c) for c in command)}")
        sys.exit(1)
    return result


def rel(got, ref):
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def load_hf(model_dir):
    """DiffusionGemmaForBlockDiffusion in fp32 with eager attention and experts, and its load info.
    A text-only config (vision_config null, as the fixture's) gets the fixture's tiny vision tower,
    which HF needs to build the model; its tensors are then missing by design."""
    config = DiffusionGemmaConfig.from_pretrained(str(model_dir))
    if json.loads((Path(model_dir) / "config.json").read_text()).get("vision_config") is None:
        config.vision_config = copy.deepcopy(fixtures.build_config(fixtures.FIXTURES["all_experts"]).vision_config)
    torch.manual_seed(0)  # HF initializes the absent vision tower from the global generator
    model, info = DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(model_dir), config=config, dtype=torch.float32, output_loading_info=True,
        attn_implementation="eager", experts_implementation="eager")
    return model.eval(), info


def logits_of(model, batch):
    return fixtures.hf_forward(model, batch, sc_logits=batch["self_conditioning_logits"]).logits.float()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("compile")
    parser.add_argument("run")
    parser.add_argument("--lora-targets", required=True)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")

    with tempfile.TemporaryDirectory(prefix="dgemma-peft-interop-") as tmp:
        tmp = Path(tmp)
        # The base checkpoint alone: --weights reads every safetensors file of a directory, and the
        # fixture directory holds its batch and expected outputs too.
        base = tmp / "base"
        base.mkdir()
        for name in ("config.json", "generation_config.json", "model.safetensors"):
            shutil.copy(MODEL / name, base / name)
        batch_path = MODEL / "batch.safetensors"
        batch = load_file(str(batch_path))
        micro_batch, prompt_len = batch["input_ids"].shape
        lora = ["--lora", "4:8", "--lora-targets", args.lora_targets]

        # 1. Train an adapter.
        run([args.compile, "--model", base, "--mode", "train", *lora, "-o", tmp / "plan-train"])
        run([args.run, "train", "--plan", tmp / "plan-train", "--weights", base, "--train", "mock", "--steps", "3",
             "--warmup", "0", "--lr", "1e-2", "--min-lr", "1e-2", "--seed", "5", "--save-dir", tmp / "save"])
        checkpoints = sorted((tmp / "save").glob("step-*"))
        if not check(bool(checkpoints), "dgemma-run train wrote a checkpoint directory"):
            sys.exit(1)
        adapter = checkpoints[-1]
        check((adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file(),
              f"{adapter.name} holds adapter_config.json and adapter_model.safetensors")
        config = json.loads((adapter / "adapter_config.json").read_text())
        print("adapter_config.json:", json.dumps(config, sort_keys=True))

        # 2. PEFT loads it.
        hf_base, _ = load_hf(base)
        base_logits = logits_of(hf_base, batch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            peft_model = PeftModel.from_pretrained(hf_base, str(adapter))
        load_warnings = [str(w.message) for w in caught if "adapter keys" in str(w.message) or "nexpected" in str(w.message)]
        check(not load_warnings, f"PeftModel.from_pretrained warned of no missing or unexpected keys {load_warnings}")
        again = peft_model.load_adapter(str(adapter), adapter_name="again")
        check(not again.missing_keys, f"load_adapter: no missing adapter keys {again.missing_keys[:8]}")
        check(not again.unexpected_keys, f"load_adapter: no unexpected keys {again.unexpected_keys[:8]}")
        peft_model.set_adapter("default")
        peft_model.eval()

        state = {n: p.detach() for n, p in peft_model.named_parameters(remove_duplicate=False) if ".default." in n}
        saved = load_file(str(adapter / "adapter_model.safetensors"))
        check(len(state) == len(saved) and len(saved) > 0,
              f"the model's adapter tensors ({len(state)}) are the file's ({len(saved)})")
        encoder = {n: t for n, t in state.items() if ".encoder.language_model." in n}
        untied = [n for n, t in encoder.items()
                  if not torch.equal(t, state[n.replace(".encoder.language_model.", ".decoder.")])]
        check(bool(encoder) and not untied,
              f"every encoder adapter ({len(encoder)}) equals its decoder adapter {untied[:4]}")
        trained_b = max(t.abs().max().item() for n, t in state.items() if ".lora_B." in n)
        check(trained_b > 0, f"training moved lora_B away from zero (max |B| {trained_b:.3g})")
        peft_logits = logits_of(peft_model, batch)
        check(rel(peft_logits, base_logits) > 1e-4,
              f"the adapter changes PEFT's logits ({rel(peft_logits, base_logits):.3g} relative)")

        # 3. dgemma's forward over the unmerged base with the same adapter.
        run([args.compile, "--model", base, "--mode", "infer", "--micro-batch", micro_batch, "--prompt-len", prompt_len,
             *lora, "-o", tmp / "plan-infer"])
        run([args.run, "forward", "--plan", tmp / "plan-infer", "--weights", base, "--adapter", adapter,
             "--input", batch_path, "--out", tmp / "forward.safetensors"])
        dgemma_logits = load_file(str(tmp / "forward.safetensors"))["logits"]
        check(dgemma_logits.shape == peft_logits.shape, f"logits shape {tuple(dgemma_logits.shape)}")
        error = rel(dgemma_logits, peft_logits)
        check(error <= BOUND, f"dgemma-run forward --adapter against PEFT: {error:.3g} <= {BOUND:g}")

        # 4. The merged export opens in transformers and computes the same logits.
        merged = tmp / "merged"
        run([args.run, "export", "--weights", base, "--merge-adapter", adapter, "--dtype", "fp32", "--out", merged])
        hf_merged, info = load_hf(merged)
        missing = [k for k in info["missing_keys"] if not k.startswith(fixtures.VISION_PREFIXES)]
        check(not missing, f"the merged export has no missing text keys {missing[:8]}")
        check(not info["unexpected_keys"], f"the merged export has no unexpected keys {list(info['unexpected_keys'])[:8]}")
        check(not info.get("mismatched_keys"), f"the merged export has no mis-shaped keys {info.get('mismatched_keys')}")
        merged_logits = logits_of(hf_merged, batch)
        error = rel(merged_logits, dgemma_logits)
        check(error <= BOUND, f"the merged export in transformers against dgemma's adapter forward: {error:.3g} <= {BOUND:g}")
        error = rel(merged_logits, peft_logits)
        check(error <= BOUND, f"the merged export in transformers against PEFT's adapter: {error:.3g} <= {BOUND:g}")

    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
