#!/usr/bin/env bash
# The RL demo (docs/rl.md, "The demo"): the reward carries the learning. It starts from the demo
# model part-way through its training (the first 5500 of the main job's 24000 steps, trained here
# once: about half of the held-out additions answered exactly), then spends the same wall-clock time
# two ways from there:
#   * dgemma-run rl: addition prompts and the exact-match verifier only, no completion in any gradient
#     (STEPS steps of GRPO, the two-sided clip, four diffusion times per completion and the negative
#     advantages scaled by 0.25);
#   * dgemma-run train: more SFT on the same prompts with their completions, for as long as the RL
#     run took (--max-seconds);
# and evaluates the start and both ends on the held-out test additions by exact match.
#   Usage: scripts/rl-demo.sh [BUILD_DIR] [STEPS]   (STEPS: GRPO steps, default 150; needs a build)
# The start is trained here, so the demo does not depend on the main job's run (docs/rl.md, "The demo").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
steps=${2:-150}
bin=$build/bin
config=$root/models/diffusion_gemma/configs/demo
tokenizer=$root/data/tokenizer
run=$build/rl-demo
mkdir -p "$run"

start=$run/base/checkpoints/step-00005500
if [ ! -d "$start" ]; then
  echo "== base: the demo model's first 5500 steps (scripts/demo.sh's training, stopped early)"
  "$bin/dgemma-compile" --model "$config" --mode train --preset demo --images-per-example 1 --prompt-len 32,48,64,96 \
    -o "$run/base/plan"
  "$bin/dgemma-run" train --plan "$run/base/plan" --init random --seed 1 --tokenizer "$tokenizer" \
    --train "$root/data/demo/train.jsonl" --steps 5500 --decay-steps 24000 --save-every 5500 --save-dir "$run/base/checkpoints" --overwrite
fi

echo "== data: every addition pair but the held-out ones (validation, test); RL gets the prompts with the sum as"
echo "   the verifier's reference, SFT the same rows with the sum as the completion"
python3 - "$root/data/demo" "$run" <<'EOF'
import json, re, sys
source, out = sys.argv[1], sys.argv[2]
held = set()
with open(f"{out}/test-additions.jsonl", "w") as test:
    for split in ("validation", "test"):
        for line in open(f"{source}/{split}.jsonl"):
            row = json.loads(line)
            content = row["messages"][0]["content"]
            if isinstance(content, str):
                held.add(tuple(map(int, re.findall(r"[0-9]+", content))))
                if split == "test":
                    test.write(line)
with open(f"{out}/rl-prompts.jsonl", "w") as rl, open(f"{out}/sft-rows.jsonl", "w") as sft:
    for a in range(100):
        for b in range(100):
            if (a, b) in held:
                continue
            messages = [{"role": "user", "content": f"What is {a:02d} + {b:02d}?"}]
            rl.write(json.dumps({"messages": messages, "reference": f"{a + b:03d}"}) + "\n")
            sft.write(json.dumps({"messages": messages, "completion": f"{a + b:03d}"}) + "\n")
print(f"{10000 - len(held)} pairs for RL and SFT, {len(held)} held out")
EOF

"$bin/dgemma-compile" --model "$config" --mode infer --micro-batch 32 --prompt-len 48 --max-new-tokens 4 -o "$run/infer" 2>/dev/null
"$bin/dgemma-compile" --model "$config" --mode train --policy-loss grpo --clip-delta 4 --objective base-sft --self-cond-prob 0.5 \
  --micro-batch 32 --prompt-len 48 -o "$run/grpo" 2>/dev/null
"$bin/dgemma-compile" --model "$config" --mode train --preset demo --prompt-len 48 -o "$run/sft" 2>/dev/null

evaluate() {
  "$bin/dgemma-run" eval --plan "$run/infer" --weights "$1" --tokenizer "$tokenizer" --seed 1 \
    --test "$run/test-additions.jsonl" 2>/dev/null | tail -n 1 | python3 -c "import json, sys; print(json.load(sys.stdin)['exact_match'])"
}
echo "== start: held-out exact match $(evaluate "$start")"

echo "== rl: $steps steps of GRPO from the prompts and the exact-match verifier"
rm -rf "$run/rl-checkpoints"
began=$(date +%s.%N)
"$bin/dgemma-run" rl --plan "$run/grpo" --rollout-plan "$run/infer" --weights "$start" --tokenizer "$tokenizer" \
  --prompts "$run/rl-prompts.jsonl" --reward exact --group-size 8 --prompts-per-step 32 --inner-updates 2 \
  --diffusion-samples 4 --negative-advantage-scale 0.25 --lr 5e-4 --min-lr 5e-5 --lr-decay-style cosine --seed 1 \
  --steps "$steps" --save-every "$steps" \
  --metrics "$run/rl-metrics.jsonl" --save-dir "$run/rl-checkpoints" --overwrite | grep -E "^step .*0/|saved"
seconds=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1])))" "$began")
echo "== rl: held-out exact match $(evaluate "$run/rl-checkpoints/step-$(printf %08d "$steps")") after $seconds s (metrics in $run/rl-metrics.jsonl)"

echo "== sft: $seconds s of more SFT on the same additions with their completions"
rm -rf "$run/sft-checkpoints"
"$bin/dgemma-run" train --plan "$run/sft" --weights "$start" --tokenizer "$tokenizer" --train "$run/sft-rows.jsonl" \
  --lr 2.9e-3 --min-lr 3e-4 --decay-steps 19000 --steps 19000 --max-seconds "$seconds" --log-every 1000 \
  --metrics "$run/sft-metrics.jsonl" --save-dir "$run/sft-checkpoints" --overwrite | tail -n 2
sft_weights=$(ls -d "$run"/sft-checkpoints/step-* | tail -n 1)
echo "== sft: held-out exact match $(evaluate "$sft_weights") after $(basename "$sft_weights") (metrics in $run/sft-metrics.jsonl)"
