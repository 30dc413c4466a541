#!/usr/bin/env bash
# The main job, as far as dgemma goes today: installs what is missing, builds, compiles the built-in
# rms_norm -> matmul -> softmax graph into plans (inference with two prompt-length buckets, and a
# training step), runs them on CPU with random weights, checks the result, and prints the CPU
# kernel benchmark. DiffusionGemma training, evaluation and generation replace this as they land.
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

echo "== compile: inference plan, prompt-length buckets 16 and 32"
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
