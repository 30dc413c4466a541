#!/usr/bin/env bash
# The RL demo (docs/rl.md, "The demo"): the reward carries the learning. It starts from the demo
# model part-way through its training (step 5000 of the main job's run, which answers about half of
# the held-out additions exactly), then spends the same wall-clock budget two ways from there:
#   * dgemma-run rl: the addition prompts and the numeric verifier only, no completion in any gradient;
#   * dgemma-run train: more SFT on the same prompts with their completions;
# and evaluates both (and the start) on the held-out test additions by exact match.
#   Usage: scripts/rl-demo.sh [BUILD_DIR] [SECONDS]   (SECONDS: the budget of each arm, default 300)
# The main job (scripts/demo.sh) leaves the step-5000 checkpoint in BUILD_DIR/demo-run; without it,
# the first 5000 steps of that run are trained here (the same seed and schedule, so the same weights).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
budget=${2:-300}
bin=$build/bin
config=$root/models/diffusion_gemma/configs/demo
tokenizer=$root/data/tokenizer
run=$build/rl-demo
mkdir -p "$run"

start=$build/demo-run/checkpoints/step-00005000
if [ ! -d "$start" ]; then
  start=$run/base/checkpoints/step-00005000
  if [ ! -d "$start" ]; then
    echo "== base: the demo model's first 5000 steps (scripts/demo.sh's run, stopped early)"
    "$bin/dgemma-compile" --model "$config" --mode train --preset demo --images-per-example 1 --prompt-len 32,48,64,96 \
      -o "$run/base/plan"
    "$bin/dgemma-run" train --plan "$run/base/plan" --init random --seed 1 --tokenizer "$tokenizer" \
      --train "$root/data/demo/train.jsonl" --steps 5000 --save-every 5000 --save-dir "$run/base/checkpoints" --overwrite
  fi
fi

echo "== data: the addition rows of the demo splits; the RL prompts carry their sum as the verifier's reference"
python3 - "$root/data/demo" "$run" <<'EOF'
import json, sys
source, out = sys.argv[1], sys.argv[2]
for split in ("train", "test"):
    rows = [json.loads(line) for line in open(f"{source}/{split}.jsonl")]
    additions = [row for row in rows if isinstance(row["messages"][0]["content"], str)]
    with open(f"{out}/{split}-additions.jsonl", "w") as sft, open(f"{out}/{split}-prompts.jsonl", "w") as rl:
        for row in additions:
            sft.write(json.dumps(row) + "\n")
            rl.write(json.dumps({"messages": row["messages"], "reference": row["completion"]}) + "\n")
    print(f"{split}: {len(additions)} additions")
EOF

"$bin/dgemma-compile" --model "$config" --mode infer --micro-batch 32 --prompt-len 48 --max-new-tokens 4 -o "$run/infer" 2>/dev/null
"$bin/dgemma-compile" --model "$config" --mode train --policy-loss grpo --objective base-sft --self-cond-prob 0.5 \
  --micro-batch 32 --prompt-len 48 -o "$run/grpo" 2>/dev/null
"$bin/dgemma-compile" --model "$config" --mode train --preset demo --prompt-len 48 -o "$run/sft" 2>/dev/null

evaluate() {
  "$bin/dgemma-run" eval --plan "$run/infer" --weights "$1" --tokenizer "$tokenizer" --seed 1 \
    --test "$run/test-additions.jsonl" 2>/dev/null | tail -n 1 | python3 -c "import json, sys; print(json.load(sys.stdin)['exact_match'])"
}
echo "== start: held-out exact match $(evaluate "$start")"

echo "== rl: $budget s of GRPO from prompts and the numeric verifier"
rm -rf "$run/rl-checkpoints"
"$bin/dgemma-run" rl --plan "$run/grpo" --rollout-plan "$run/infer" --weights "$start" --tokenizer "$tokenizer" \
  --prompts "$run/train-prompts.jsonl" --reward numeric --group-size 8 --prompts-per-step 16 --lr 1e-3 --seed 1 \
  --steps 100000 --max-seconds "$budget" --metrics "$run/rl-metrics.jsonl" --save-dir "$run/rl-checkpoints" --overwrite
rl_weights=$(ls -d "$run"/rl-checkpoints/step-* | tail -n 1)
echo "== rl: held-out exact match $(evaluate "$rl_weights") ($(basename "$rl_weights"), metrics in $run/rl-metrics.jsonl)"

echo "== sft: $budget s of more SFT on the same additions with their completions"
rm -rf "$run/sft-checkpoints"
"$bin/dgemma-run" train --plan "$run/sft" --weights "$start" --tokenizer "$tokenizer" --train "$run/train-additions.jsonl" \
  --lr 3e-3 --min-lr 3e-4 --decay-steps 19000 --steps 100000 --max-seconds "$budget" --metrics "$run/sft-metrics.jsonl" \
  --save-dir "$run/sft-checkpoints" --overwrite
sft_weights=$(ls -d "$run"/sft-checkpoints/step-* | tail -n 1)
echo "== sft: held-out exact match $(evaluate "$sft_weights") ($(basename "$sft_weights"), metrics in $run/sft-metrics.jsonl)"
