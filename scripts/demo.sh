#!/usr/bin/env bash
# The main job: installs what is missing, builds, validates the bundled demo data, trains the demo
# DiffusionGemma (~170K parameters and a tiny vision tower) from scratch on the bundled task, every
# row of it (additions and picture descriptions), on CPU with validation and a final test loss,
# compiles its inference plan, evaluates block-diffusion generation on the held-out test split
# (exact match on text and on image rows), generates two answers (one about a picture), then runs
# the 7-layer reference fixture's forward pass and the CPU kernel benchmark.
#   Usage: scripts/demo.sh [BUILD_DIR]
# Outputs of the training run (plan, metrics, TensorBoard events, checkpoints) and of the evaluation
# (inference plan, per-row answers) stay in BUILD_DIR/demo-run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bash "$root/scripts/install-deps.sh"
bash "$root/scripts/configure.sh" "$build"
cmake --build "$build" -j "$(nproc)"

echo "== data: validate the bundled demo splits with the bundled tokenizer"
for split in train validation test; do
  "$bin/dgemma-run" check-data --data "$root/data/demo/$split.jsonl" --tokenizer "$root/data/tokenizer" --canvas-len 4
done

run=$build/demo-run
rm -rf "$run"
mkdir -p "$run"
# One image per picture row (--images-per-example 1): image rows train through the image twins of
# the entries, in micro-batches of their own (docs/data.md, "Item order"). A picture prompt holds 9
# soft tokens; with the earlier canvas blocks of its description its encoder context needs the 96 bucket.
prompt_buckets=32,48,64,96
echo "== train: the demo model from scratch (preset demo: micro-batch 16, no encoder loss, AdamW, cosine lr 3e-3), every row"
"$bin/dgemma-compile" --model "$root/models/diffusion_gemma/configs/demo" --mode train --preset demo --images-per-example 1 \
  --prompt-len "$prompt_buckets" --report -o "$run/plan"
"$bin/dgemma-run" train --plan "$run/plan" --init random --seed 1 --tokenizer "$root/data/tokenizer" \
  --train "$root/data/demo/train.jsonl" --validation "$root/data/demo/validation.jsonl" --test "$root/data/demo/test.jsonl" \
  --metrics "$run/metrics.jsonl" --tensorboard "$run/tensorboard" --save-dir "$run/checkpoints"
echo "metrics in $run/metrics.jsonl, TensorBoard events in $run/tensorboard"

echo "== eval: block-diffusion generation on the held-out test split (a sum is one 4-token canvas: three digits and EOS;"
echo "   a picture's description at most 12 canvases); exact match overall, on the text rows and on the image rows"
weights=$(ls -d "$run"/checkpoints/step-* | tail -n 1)
"$bin/dgemma-compile" --model "$root/models/diffusion_gemma/configs/demo" --mode infer --micro-batch 20 --images-per-example 1 \
  --prompt-len "$prompt_buckets" --max-new-tokens 48 -o "$run/infer-plan"
"$bin/dgemma-run" eval --plan "$run/infer-plan" --weights "$weights" --tokenizer "$root/data/tokenizer" --seed 1 \
  --test "$root/data/demo/test.jsonl" --out "$run/test-answers.jsonl" | tail -n 1
echo "per-row answers in $run/test-answers.jsonl"

echo "== generate: one question and one picture the model has not seen"
"$bin/dgemma-run" generate --plan "$run/infer-plan" --weights "$weights" --tokenizer "$root/data/tokenizer" --seed 1 \
  --prompt "What is 58 + 67?"
"$bin/dgemma-run" generate --plan "$run/infer-plan" --weights "$weights" --tokenizer "$root/data/tokenizer" --seed 1 \
  --prompt "Describe the picture." --image "$root/data/demo/images/test-0000.png"

fixture=$root/test/fixtures/diffusion_gemma/seven_layers
echo "== forward: the 7-layer HF reference fixture (2 full + 5 sliding layers, window 4), encoder + decoder step"
"$bin/dgemma-compile" --model "$fixture" --mode infer --micro-batch 4 --prompt-len 11 --report -o "$work/dgemma" 2>/dev/null
"$bin/dgemma-run" forward --plan "$work/dgemma" --weights "$fixture/model.safetensors" --input "$fixture/batch.safetensors" \
  --out "$work/dgemma-out.safetensors"
python3 "$root/scripts/summarize_safetensors.py" "$work/dgemma-out.safetensors" | grep -E "logits|encoder_hidden"

echo "== CPU kernel benchmark"
"$bin/dgemma-bench-cpu-kernels" --repeats 5
