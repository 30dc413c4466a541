#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, builds what the check needs, runs the GPU tests
# (`ctest -L gpu`: the CUDA kernels against their CPU twins, the CUDA backend, the NCCL
# communicator with one rank, and with two ranks when there are two GPUs; every kernel of
# docs/kernels.md "CUDA twins", the MoE experts, fused_elementwise and the bf16 widening included),
# then trains small-20m for a few steps from the same random init on the CPU and on the GPU and
# compares the losses step by step, in fp32 and in bf16 (elementwise fusion on, the default); with
# two GPUs also with --tp 2, two ranks over NCCL against two over Gloo. Prints a
# summary table last; exits non-zero when a check failed. Budget: under 8 minutes (each stage has
# its own timeout, and a training stage that would start after 5 minutes is skipped, saying so).
#   Usage: scripts/gpu-check.sh [BUILD_DIR]   (default: build)
# Without a GPU it says so and exits 0, having checked nothing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bin
steps=4                 # optimizer steps of each training run
loss_tolerance=1e-3     # relative: f32 sums in another order (cuBLAS, tree reductions) differ in the last bits
bf16_loss_tolerance=2e-2  # relative: a bf16 rounding that falls the other way moves the loss by ~2^-8
start_budget=300        # seconds: no training stage starts later (each takes at most 3 minutes)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! gpus=$(nvidia-smi -L 2>/dev/null) || [[ -z $gpus ]]; then
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi is missing or lists no device); nothing checked"
  exit 0
fi
echo "== gpus"
echo "$gpus"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rows=()     # summary rows: "check|result"
failed=0
record() { rows+=("$1|$2"); }

# The train losses of a metrics file, one per line.
losses() { grep '"split": *"train"' "$1" 2>/dev/null | sed -E 's/.*"loss": *([^,}]*).*/\1/'; }

# train_on_both NAME MODEL RANKS TOLERANCE [COMPILE FLAGS...]: compiles a train plan, trains $steps
# steps from the same random init (--train mock, --seed 1) on cpu and on cuda, and compares the
# losses step by step (relative TOLERANCE); records a row per run and one for the comparison, and
# appends the losses to $comparisons.
comparisons=""
train_on_both() {
  local name=$1 model=$2 ranks=$3 loss_tolerance=$4
  shift 4
  local plan=$work/$name-plan
  plan=${plan// /-}
  echo "== $name: $steps training steps on cpu and on cuda ($ranks rank(s), --train mock, --seed 1)"
  if ! timeout 60 "$bin/dgemma-compile" --model "$model" --mode train --micro-batch 2 --prompt-len 32 "$@" \
    -o "$plan" >"$plan.log" 2>&1; then
    tail -n 20 "$plan.log"
    record "$name compile" "FAILED"
    failed=1
    return
  fi
  local backend start status
  if ((SECONDS > start_budget)); then
    record "$name" "skipped: the check has run for $SECONDS s, past its budget"
    return
  fi
  for backend in cpu cuda; do
    start=$SECONDS
    if timeout 60 "$bin/dgemma-run" train --plan "$plan" --init random --seed 1 --train mock --steps "$steps" \
      --backend "$backend" --nproc-per-node "$ranks" --metrics "$plan-$backend.jsonl" >"$plan-$backend.log" 2>&1; then
      record "$name $backend" "ok: $steps steps ($((SECONDS - start)) s)"
    else
      status=$?
      tail -n 5 "$plan-$backend.log"
      record "$name $backend" "FAILED (exit $status): $(grep -m 1 'error' "$plan-$backend.log" | cut -c 1-150)"
      failed=1
    fi
  done
  [[ -s $plan-cpu.jsonl && -s $plan-cuda.jsonl ]] || return
  local table verdict
  table=$(paste <(losses "$plan-cpu.jsonl") <(losses "$plan-cuda.jsonl") |
    awk -v tolerance="$loss_tolerance" '
      { difference = $1 - $2; if (difference < 0) difference = -difference
        scale = $1 < 0 ? -$1 : $1; relative = scale > 0 ? difference / scale : difference
        if (relative > worst) worst = relative
        printf "  step %-3d cpu %-14s cuda %-14s rel. diff %.2e\n", NR, $1, $2, relative }
      END { printf "verdict %s %.2e\n", (NR > 0 && worst <= tolerance) ? "agree" : "DIFFER", worst }')
  verdict=$(tail -n 1 <<<"$table")
  if [[ $verdict == "verdict agree"* ]]; then
    record "$name losses" "cpu and cuda agree (max rel. diff ${verdict##* } <= $loss_tolerance)"
  else
    record "$name losses" "cpu and cuda DIFFER (max rel. diff ${verdict##* } > $loss_tolerance)"
    failed=1
  fi
  comparisons+="$name losses:"$'\n'"$(sed '$d' <<<"$table")"$'\n'
}

echo "== build (dgemma-compile, dgemma-run, the GPU tests)"
start=$SECONDS
if timeout 60 bash "$root/scripts/configure.sh" "$build" >"$work/configure.log" 2>&1 &&
  timeout 240 cmake --build "$build" -j "$(nproc)" --target dgemma-compile dgemma-run dgemma_gpu_tests \
    $(grep -q '^DGEMMA_HAVE_NCCL:INTERNAL=ON' "$build/CMakeCache.txt" && echo dgemma_nccl_gpu_tests) \
    >"$work/build.log" 2>&1; then
  record "build" "ok ($((SECONDS - start)) s)"
else
  tail -n 30 "$work/configure.log" "$work/build.log" 2>/dev/null
  record "build" "FAILED ($((SECONDS - start)) s)"
  failed=1
fi

if ((failed == 0)); then
  echo "== ctest -L gpu"
  start=$SECONDS
  (cd "$build" && timeout 90 ctest -L gpu --output-on-failure) >"$work/ctest.log" 2>&1
  status=$?
  cat "$work/ctest.log"
  summary=$(grep -E 'tests passed|tests failed' "$work/ctest.log" | tail -n 1)
  skipped=$(grep -c -- '\*\*\*Skipped' "$work/ctest.log" || true)
  if ((status == 0)); then
    record "ctest -L gpu" "ok: ${summary:-no summary} ($skipped skipped, $((SECONDS - start)) s)"
  else
    record "ctest -L gpu" "FAILED (exit $status): ${summary:-see above}"
    failed=1
  fi

  train_on_both "small-20m" "$root/models/diffusion_gemma/configs/small-20m.json" 1 "$loss_tolerance"
  train_on_both "small-20m bf16" "$root/models/diffusion_gemma/configs/small-20m.json" 1 "$bf16_loss_tolerance" \
    --precision bf16
  # Two ranks over NCCL (tensor parallel), against the same two ranks over Gloo.
  if (($(wc -l <<<"$gpus") >= 2)); then
    train_on_both "small-20m tp2" "$root/models/diffusion_gemma/configs/small-20m.json" 2 "$loss_tolerance" --tp 2
  else
    record "small-20m tp2" "skipped: needs 2 GPUs (the NCCL tests ran with one rank)"
  fi
fi

echo
echo "== gpu-check summary ($(head -n 1 <<<"$gpus" | cut -c 1-80))"
printf '%-24s %s\n' "check" "result"
for row in "${rows[@]}"; do printf '%-24s %s\n' "${row%%|*}" "${row#*|}"; done
printf '%s' "$comparisons"
exit "$failed"
