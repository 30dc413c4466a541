#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, builds what the check needs, runs the GPU tests
# (`ctest -L gpu`: the CUDA kernels against their CPU twins, the CUDA backend, the NCCL
# communicator with one rank, and with two ranks when there are two GPUs), then trains small-20m
# for a few steps from the same random init on the CPU and on the GPU and compares the losses step
# by step. Prints a summary table last; exits non-zero when a check failed. Budget: under 8 minutes
# on a 16-core machine (each stage has its own timeout).
#   Usage: scripts/gpu-check.sh [BUILD_DIR]   (default: build)
# Without a GPU it says so and exits 0, having checked nothing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bin
steps=4                 # optimizer steps of each training run
loss_tolerance=1e-3     # relative: f32 sums in another order (cuBLAS, tree reductions) differ in the last bits

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

echo "== build (dgemma-compile, dgemma-run, the GPU tests)"
start=$SECONDS
if timeout 330 bash "$root/scripts/configure.sh" "$build" >"$work/configure.log" 2>&1 &&
  timeout 330 cmake --build "$build" -j "$(nproc)" --target dgemma-compile dgemma-run dgemma_gpu_tests \
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
  (cd "$build" && timeout 150 ctest -L gpu --output-on-failure) >"$work/ctest.log" 2>&1
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

  echo "== small-20m: $steps training steps on cpu and on cuda from the same init (--train mock, --seed 1)"
  plan=$work/plan
  if timeout 120 "$bin/dgemma-compile" --model "$root/models/diffusion_gemma/configs/small-20m.json" --mode train \
    --micro-batch 2 --prompt-len 32 -o "$plan" >"$work/compile.log" 2>&1; then
    for backend in cpu cuda; do
      start=$SECONDS
      if timeout 150 "$bin/dgemma-run" train --plan "$plan" --init random --seed 1 --train mock --steps "$steps" \
        --backend "$backend" --metrics "$work/$backend.jsonl" >"$work/$backend.log" 2>&1; then
        record "train $backend" "ok: $steps steps ($((SECONDS - start)) s)"
      else
        status=$?
        tail -n 5 "$work/$backend.log"
        record "train $backend" "FAILED (exit $status): $(grep -m 1 'error' "$work/$backend.log" | cut -c 1-160)"
        failed=1
      fi
    done
  else
    tail -n 20 "$work/compile.log"
    record "compile small-20m" "FAILED"
    failed=1
  fi
fi

# The losses side by side: step, cpu, cuda, relative difference.
losses() { grep '"split": *"train"' "$1" 2>/dev/null | sed -E 's/.*"loss": *([^,}]*).*/\1/'; }
comparison=""
if [[ -s $work/cpu.jsonl && -s $work/cuda.jsonl ]]; then
  comparison=$(paste <(losses "$work/cpu.jsonl") <(losses "$work/cuda.jsonl") |
    awk -v tolerance="$loss_tolerance" '
      { difference = $1 - $2; if (difference < 0) difference = -difference
        scale = $1 < 0 ? -$1 : $1; relative = scale > 0 ? difference / scale : difference
        if (relative > worst) worst = relative
        printf "  step %-3d cpu %-14s cuda %-14s rel. diff %.2e\n", NR, $1, $2, relative }
      END { printf "verdict %s %.2e\n", (NR > 0 && worst <= tolerance) ? "agree" : "DIFFER", worst }')
  verdict=$(tail -n 1 <<<"$comparison")
  if [[ $verdict == "verdict agree"* ]]; then
    record "losses cpu vs cuda" "agree (max rel. diff ${verdict##*} <= $loss_tolerance)"
  else
    record "losses cpu vs cuda" "DIFFER (max rel. diff ${verdict##*} > $loss_tolerance)"
    failed=1
  fi
  comparison=$(sed '$d' <<<"$comparison")
fi

echo
echo "== gpu-check summary ($(head -n 1 <<<"$gpus" | cut -c 1-80))"
printf '%-22s %s\n' "check" "result"
for row in "${rows[@]}"; do printf '%-22s %s\n' "${row%%|*}" "${row#*|}"; done
[[ -n $comparison ]] && echo "$comparison"
exit "$failed"
