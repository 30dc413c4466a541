#!/usr/bin/env bash
# The main job: installs what is missing, builds, validates the bundled demo data, trains the demo
# DiffusionGemma (~170K parameters) from scratch on the bundled task on CPU with validation and a
# final test loss, compiles its inference plan, evaluates block-diffusion generation on the held-out
# test split (exact match), generates one answer, then runs the 7-layer reference fixture's forward
# pass and the CPU kernel benchmark.
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
echo "== train: the demo model from scratch (preset demo: 8000 steps, micro-batch 16, no encoder loss, AdamW, cosine lr 3e-3)"
"$bin/dgemma-compile" --model "$root/models/diffusion_gemma/configs/demo" --mode train --preset demo --report \
  -o "$run/plan"
# The vision tower is not built yet: the image rows of the demo task are skipped (listed in
# skipped-rows.txt) and the model learns the arithmetic rows.
if ! "$bin/dgemma-run" train --plan "$run/plan" --init random --seed 1 --tokenizer "$root/data/tokenizer" \
  --train "$root/data/demo/train.jsonl" --validation "$root/data/demo/validation.jsonl" --test "$root/data/demo/test.jsonl" \
  --skip-bad-rows --metrics "$run/metrics.jsonl" --tensorboard "$run/tensorboard" --save-dir "$run/checkpoints" \
  2>"$run/skipped-rows.txt"; then
  tail -n 20 "$run/skipped-rows.txt" >&2
  exit 1
fi
echo "skipped $(grep -c '^skipped: ' "$run/skipped-rows.txt" || true) rows with images or prompts longer than the largest bucket" \
  "(see $run/skipped-rows.txt); metrics in $run/metrics.jsonl, TensorBoard events in $run/tensorboard"

echo "== eval: block-diffusion generation on the held-out test split (one 4-token canvas per answer: three digits and EOS)"
weights=$(ls -d "$run"/checkpoints/step-* | tail -n 1)
"$bin/dgemma-compile" --model "$root/models/diffusion_gemma/configs/demo" --mode infer --micro-batch 20 \
  --prompt-len 32,48,64 --max-new-tokens 4 -o "$run/infer-plan"
# The image rows are skipped until the vision tower lands; the summary counts them.
"$bin/dgemma-run" eval --plan "$run/infer-plan" --weights "$weights" --tokenizer "$root/data/tokenizer" --seed 1 \
  --test "$root/data/demo/test.jsonl" --out "$run/test-answers.jsonl" 2>"$run/eval-skipped-rows.txt" | tail -n 1
echo "per-row answers in $run/test-answers.jsonl"

echo "== generate: one question the model has not seen"
"$bin/dgemma-run" generate --plan "$run/infer-plan" --weights "$weights" --tokenizer "$root/data/tokenizer" --seed 1 \
  --prompt "What is 58 + 67?"

fixture=$root/test/fixtures/diffusion_gemma/seven_layers
echo "== forward: the 7-layer HF reference fixture (2 full + 5 sliding layers, window 4), encoder + decoder step"
"$bin/dgemma-compile" --model "$fixture" --mode infer --micro-batch 4 --prompt-len 11 --report -o "$work/dgemma" 2>/dev/null
"$bin/dgemma-run" forward --plan "$work/dgemma" --weights "$fixture/model.safetensors" --input "$fixture/batch.safetensors" \
  --out "$work/dgemma-out.safetensors"
python3 "$root/scripts/summarize_safetensors.py" "$work/dgemma-out.safetensors" | grep -E "logits|encoder_hidden"

echo "== CPU kernel benchmark"
"$bin/dgemma-bench-cpu-kernels" --repeats 5
