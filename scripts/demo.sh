#!/usr/bin/env bash
# The main job, as far as dgemma goes today: installs what is missing, builds, compiles a small
# DiffusionGemma (the bundled 7-layer reference fixture) and runs its forward pass on CPU with the
# fixture's weights and batch, compiles the built-in rms_norm -> matmul -> softmax graph into plans
# (two prompt-length buckets, and a training step) and runs them, then prints the CPU kernel
# benchmark. DiffusionGemma training, evaluation and generation replace this as they land.
#   Usage: scripts/demo.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bash "$root/scripts/install-deps.sh"
bash "$root/scripts/configure.sh" "$build"
cmake --build "$build" -j "$(nproc)"

fixture=$root/test/fixtures/diffusion_gemma/seven_layers
echo "== data: validate the bundled demo splits with the bundled tokenizer"
for split in train validation test; do
  "$bin/dgemma-run" check-data --data "$root/data/demo/$split.jsonl" --tokenizer "$root/data/tokenizer" --canvas-len 16
done

echo "== DiffusionGemma: compile the 7-layer fixture (2 full + 5 sliding layers, window 4), run encoder + decoder step"
"$bin/dgemma-compile" --model "$fixture" --mode infer --micro-batch 4 --prompt-len 11 --report -o "$work/dgemma" 2>/dev/null
"$bin/dgemma-run" forward --plan "$work/dgemma" --weights "$fixture/model.safetensors" --input "$fixture/batch.safetensors" \
  --out "$work/dgemma-out.safetensors"
python3 "$root/scripts/make_demo_batch.py" --summarize "$work/dgemma-out.safetensors" | grep -E "logits|encoder_hidden"

echo "== built-in graph: inference plan, prompt-length buckets 16 and 32"
"$bin/dgemma-compile" --model builtin:rmsnorm-matmul-softmax --mode infer --micro-batch 4 --prompt-len 16,32 \
  --hidden-size 256 --vocab-size 512 --report -o "$work/infer"
"$bin/dgemma-run" inspect --plan "$work/infer"

echo "== run: forward on a random batch (random weights from the parameters' init)"
python3 "$root/scripts/make_demo_batch.py" "$work/batch.safetensors" --batch 4 --length 16 --hidden 256 --vocab 512
"$bin/dgemma-run" forward --plan "$work/infer" --init random --seed 1 --input "$work/batch.safetensors" --out "$work/probs.safetensors"

echo "== compile + run: one training step's loss and gradients"
"$bin/dgemma-compile" --model builtin:rmsnorm-matmul-softmax --mode train --micro-batch 4 --prompt-len 16 \
  --hidden-size 256 --vocab-size 512 -o "$work/train"
"$bin/dgemma-run" grad --plan "$work/train" --init random --seed 1 --input "$work/batch.safetensors" --out "$work/grads.safetensors"
python3 "$root/scripts/make_demo_batch.py" --summarize "$work/probs.safetensors" "$work/grads.safetensors"

echo "== CPU kernel benchmark"
"$bin/dgemma-bench-cpu-kernels" --repeats 5
