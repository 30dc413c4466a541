#!/usr/bin/env bash
# Teaches the trained demo model a new skill with a LoRA adapter, over a frozen base stored in bf16
# and in NF4 (docs/training.md, "The adapter demo"): two-digit subtraction, written as the additions
# are ("What is 87 - 23?" -> "064"). For each base dtype it trains rank-8 adapters on attention, the
# dense MLP and every expert, then evaluates block-diffusion generation on the held-out subtraction
# rows (the new skill) and on the base task's test split (the old skill: additions and pictures),
# and prints the exact match of each and the time the training took.
#   Usage: scripts/adapter-demo.sh [BUILD_DIR]
# Needs the demo's trained checkpoint (scripts/demo.sh writes BUILD_DIR/demo-run); its outputs stay
# in BUILD_DIR/adapter-demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bin
model=$root/models/diffusion_gemma/configs/demo
data=$root/data/demo
base=$(ls -d "$build"/demo-run/checkpoints/step-* 2>/dev/null | tail -n 1 || true)
if [[ -z "$base" ]]; then
  echo "adapter-demo: no trained demo checkpoint in $build/demo-run/checkpoints; run scripts/demo.sh first" >&2
  exit 2
fi
run=$build/adapter-demo
rm -rf "$run"
mkdir -p "$run"
adapters=(--lora 8:16 --lora-targets attention,mlp,experts)
# The demo's buckets: the rehearsed pictures (and the old task's at evaluation) need the image twins.
prompt_buckets=32,48,64,96

summary=()
for dtype in bf16 nf4; do
  out=$run/$dtype
  echo "== adapter over a frozen $dtype base: train on subtraction (with rehearsed additions and pictures)"
  "$bin/dgemma-compile" --model "$model" --mode train --preset demo --images-per-example 1 "${adapters[@]}" \
    --base-dtype "$dtype" --prompt-len "$prompt_buckets" --report -o "$out/plan" | grep -E "^rank 0 parameters"
  start=$(date +%s)
  "$bin/dgemma-run" train --plan "$out/plan" --weights "$base" --seed 1 --tokenizer "$root/data/tokenizer" \
    --train "$data/subtraction/train.jsonl" --validation "$data/subtraction/validation.jsonl" \
    --steps 12000 --lr 1e-2 --min-lr 1e-3 --warmup 50 --decay-steps 12000 --eval-every 2000 \
    --metrics "$out/metrics.jsonl" --save-dir "$out/checkpoints"
  seconds=$(($(date +%s) - start))
  adapter=$(ls -d "$out"/checkpoints/step-* | tail -n 1)

  echo "== eval: the new skill (held-out subtraction rows) and the old one (the base task's test split)"
  "$bin/dgemma-compile" --model "$model" --mode infer --micro-batch 20 --images-per-example 1 "${adapters[@]}" \
    --base-dtype "$dtype" --prompt-len "$prompt_buckets" --max-new-tokens 48 -o "$out/infer-plan"
  new=$("$bin/dgemma-run" eval --plan "$out/infer-plan" --weights "$base" --adapter "$adapter" --tokenizer "$root/data/tokenizer" \
    --seed 1 --test "$data/subtraction/test.jsonl" --out "$out/subtraction-answers.jsonl" | tail -n 1)
  old=$("$bin/dgemma-run" eval --plan "$out/infer-plan" --weights "$base" --adapter "$adapter" --tokenizer "$root/data/tokenizer" \
    --seed 1 --test "$data/test.jsonl" --out "$out/base-task-answers.jsonl" | tail -n 1)
  echo "new skill: $new"
  echo "old skill: $old"
  summary+=("$dtype base: trained in ${seconds} s; subtraction: $new; base task: $old")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
