#!/usr/bin/env bash
# The pre-training demo (docs/pretraining.md, "The demo"): the demo DiffusionGemma architecture
# (models/diffusion_gemma/configs/demo) trained from random initialisation on raw text, once with
# each pre-training objective (autoregressive, masked diffusion, block diffusion), on CPU in a few
# minutes each. The corpus is the fortune cookies of
# Debian's `fortunes` package (fortune-mod's data, Debian main; about 1.7 MB of text in 8,500
# fortunes), downloaded as a .deb and unpacked here, not installed. It is preprocessed into a
# Megatron indexed dataset with the bundled tokenizer, split 98 / 2 into training and validation
# documents, packed into sequences of 128 tokens, and trained for STEPS steps of 16 sequences. The
# script prints each run's loss and validation perplexity curve, then samples a few prompts from
# the autoregressive and masked-diffusion runs' final checkpoints (block diffusion on packed text
# has no sampler yet).
#   Usage: scripts/pretrain-demo.sh [BUILD_DIR] [STEPS]   (STEPS per objective, default 4000)
# Outputs (corpus, plans, metrics, TensorBoard events, checkpoints) stay in BUILD_DIR/pretrain-demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
steps=${2:-4000}
bin=$build/bin
config=$root/models/diffusion_gemma/configs/demo
tokenizer=$root/data/tokenizer
run=$build/pretrain-demo
mkdir -p "$run/fortunes"

echo "== corpus: Debian's fortunes package"
if [ ! -f "$run/fortunes/corpus.jsonl" ]; then
  (cd "$run/fortunes" && rm -f ./*.deb && apt-get download fortunes && dpkg-deb -x ./fortunes_*.deb package)
  python3 "$root/scripts/make_fortune_corpus.py" "$run/fortunes/package/usr/share/games/fortunes" "$run/fortunes/corpus.jsonl"
fi
"$bin/dgemma-run" preprocess --input "$run/fortunes/corpus.jsonl" --json-keys text --tokenizer "$tokenizer" \
  --output-prefix "$run/fortunes/corpus" --workers 2

# Masked diffusion needs an absorbing token the text never holds: the bundled tokenizer has no mask
# token, so its unused special <|think|> serves.
mask_id=$(python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['added_tokens_decoder']; \
print(next(i for i, v in t.items() if v['content'] == '<|think|>'))" "$tokenizer/tokenizer_config.json")

for objective in autoregressive masked-diffusion block-diffusion; do
  out=$run/$objective
  flags=()
  [ "$objective" = masked-diffusion ] && flags=(--mask-token-id "$mask_id")
  # Block diffusion cuts each packed row into blocks of 32 tokens, each denoised given its clean prefix.
  [ "$objective" = block-diffusion ] && flags=(--canvas-len 32)
  echo "== $objective: compile, then $steps steps from random weights"
  "$bin/dgemma-compile" --model "$config" --mode train --objective "$objective" "${flags[@]}" --seq-len 128 \
    --micro-batch 16 -o "$out/plan"
  "$bin/dgemma-run" train --plan "$out/plan" --init random --seed 1 --tokenizer "$tokenizer" \
    --data-path "$run/fortunes/corpus" --split 98,2,0 --steps "$steps" --lr 3e-3 --min-lr 3e-4 --warmup 100 \
    --eval-every 500 --eval-batches 16 --log-every 500 --metrics "$out/metrics.jsonl" --tensorboard "$out/tensorboard" \
    --save-dir "$out/checkpoints" --overwrite | grep -v "validation loss"
  echo "-- $objective: the curves (train loss averaged over the steps since the last evaluation)"
  python3 - "$out/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
window = []
print(f"{'step':>6} {'train loss':>11} {'val loss':>9} {'val ppl':>8}")
for line in lines:
    if line["split"] == "train":
        window.append(line["loss"])
    elif line["split"] == "validation":
        print(f"{line['step']:>6} {sum(window) / max(len(window), 1):>11.3f} {line['loss']:>9.3f} {line['perplexity']:>8.2f}")
        window = []
PY
  [ "$objective" = block-diffusion ] && continue
  echo "-- $objective: samples from the final checkpoint (temperature 0.7, seed 1)"
  "$bin/dgemma-compile" --model "$config" --mode infer --objective "$objective" "${flags[@]}" --seq-len 128 \
    --micro-batch 1 -o "$out/infer"
  "$bin/dgemma-run" sample --plan "$out/infer" --weights "$out/checkpoints/step-$(printf %08d "$steps")" \
    --tokenizer "$tokenizer" --max-new-tokens 80 --temperature 0.7 --seed 1 \
    --prompt "The computer" --prompt "A wise man" --prompt "Science is"
done
