#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, runs the GPU tests (the CUDA kernels against their
# CPU twins, the CUDA backend, the NCCL communicator with one rank, and with two ranks when there are
# two GPUs; every kernel of docs/kernels.md "CUDA twins", the MoE experts, fused_elementwise and the
# bf16 widening included), then trains small-20m for a few steps from the same random init on the
# CPU and on the GPU and compares the losses step by step, in fp32 and in bf16 (elementwise fusion
# on, the default); with two GPUs also with --tp 2, two ranks over NCCL against two over Gloo. Then
# the per-kernel timing table: small-20m generates from the trained fp32 checkpoint with --profile on
# the CPU and on the GPU (CUDA_LAUNCH_BLOCKING=1, so each kernel call's wall time is its run, not its
# launch), by op side by side. Prints a summary table last; exits non-zero when a check failed.
# Budget: under 8 minutes (each stage has its own timeout; a training stage that would start after
# 5 minutes, and the timing run after 6.5, is skipped, saying so).
#   Usage: scripts/gpu-check.sh --bundle BUNDLE_DIR   on a lent machine: runs the bundle of
#              scripts/gpu-bundle.sh (its programs, libraries, plans and fixtures); builds nothing and
#              needs none of the build's dependencies, only CUDA's libraries, found in this order:
#              $CUDA_HOME/lib64 (and lib), /usr/local/cuda/lib64 (and lib), then the lib folders of
#              the `nvidia` pip wheels of the machine's python3 (site-packages/nvidia/*/lib: the
#              CUDA 13 wheels' nvidia/cu13/lib, NCCL's nvidia/nccl/lib), then the loader's cache;
#              those folders go first in LD_LIBRARY_PATH. docs/performance.md, "GPU check on a lent
#              machine", has the one call to make.
#          scripts/gpu-check.sh [BUILD_DIR]   (default: build) on a machine with this project's
#              dependencies: configures and builds what the check needs first, runs `ctest -L gpu`
#              and compiles its plans with dgemma-compile.
# Without a GPU (nvidia-smi missing or listing no device) it says so and exits 0, having checked
# nothing (with --bundle, after saying where it found CUDA's libraries and whether dgemma-run starts).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=""
if [[ ${1:-} == --bundle ]]; then
  [[ -n ${2:-} && -f ${2:-}/MANIFEST ]] || { echo "usage: gpu-check.sh --bundle BUNDLE_DIR (a folder of scripts/gpu-bundle.sh, with its MANIFEST)" >&2; exit 2; }
  bundle=$(cd "$2" && pwd)
else
  build=${1:-$root/build}
  bin=$build/bin
fi
steps=4                 # optimizer steps of each training run
loss_tolerance=1e-3     # relative: f32 sums in another order (cuBLAS, tree reductions) differ in the last bits
bf16_loss_tolerance=2e-2  # relative: a bf16 rounding that falls the other way moves the loss by ~2^-8
start_budget=300        # seconds: no training stage starts later (each takes at most 2 minutes)
profile_budget=390      # seconds: the timing run does not start later (it takes at most 1.5 minutes)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rows=()     # summary rows: "check|result"
failed=0
record() { rows+=("$1|$2"); }

# ---- the bundle: unpack a working copy, find CUDA's libraries, check that dgemma-run starts --------
if [[ -n $bundle ]]; then
  echo "== bundle $bundle"
  sed -n 's/^\(source\|made\|programs\|glibc\|cuda-needed\): /  \1: /p' "$bundle/MANIFEST"
  checkout=$(git -C "$root" rev-parse HEAD 2>/dev/null)
  if [[ -n $checkout && $(sed -n 's/^source: //p' "$bundle/MANIFEST") != "$checkout"* ]]; then
    echo "  note: this checkout is $checkout; the bundle's programs are of the source above (scripts/gpu-bundle.sh remakes it)"
  fi
  # A working copy: the carried folder stays as it came (gzipped files unpacked only in the copy).
  cp -r "$bundle" "$work/bundle"
  while IFS= read -r -d '' packed; do
    gzip -dc "$packed" >"${packed%.gz}" && chmod 755 "${packed%.gz}" && rm -f "$packed"
  done < <(find "$work/bundle/bin" "$work/bundle/lib" -name '*.gz' -print0)
  bin=$work/bundle/bin

  # CUDA's libraries: the first folder in the search order that has each one.
  search=()
  add_search() { local dir; dir=$(realpath -e "$1" 2>/dev/null) || return 0; [[ " ${search[*]} " == *" $dir "* ]] || search+=("$dir"); }
  for home in "${CUDA_HOME:-}" /usr/local/cuda; do
    [[ -n $home ]] || continue
    for dir in "$home/lib64" "$home/lib" "$home/targets/x86_64-linux/lib"; do add_search "$dir"; done
  done
  for python in python3 python; do
    command -v "$python" >/dev/null 2>&1 || continue
    wheels=$("$python" -c 'import glob, os, nvidia
for base in nvidia.__path__:
    for lib in sorted(glob.glob(os.path.join(base, "*", "lib"))): print(lib)' 2>/dev/null) || continue
    while IFS= read -r dir; do [[ -n $dir ]] && add_search "$dir"; done <<<"$wheels"
    break
  done
  needed=($(sed -n 's/^cuda-needed: //p' "$bundle/MANIFEST") libnccl.so.2)
  library_dirs=()
  missing=()
  echo "== CUDA libraries (search order: ${search[*]:-no CUDA folder, no nvidia wheels}, then the loader's cache)"
  for soname in "${needed[@]}"; do
    found=""
    for dir in "${search[@]}"; do
      if [[ -e $dir/$soname ]]; then found=$dir; break; fi
    done
    if [[ -n $found ]]; then
      [[ " ${library_dirs[*]} " == *" $found "* ]] || library_dirs+=("$found")
    elif { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep "^[[:space:]]*$soname " >/dev/null; then
      found="(the loader's cache)"
    else
      found="NOT FOUND"
      missing+=("$soname")
    fi
    printf '  %-20s %s\n' "$soname" "$found"
  done
  if ((${#library_dirs[@]})); then
    export LD_LIBRARY_PATH=$(IFS=:; echo "${library_dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  echo "  LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

  needs_glibc=$(sed -n 's/^glibc: //p' "$bundle/MANIFEST")
  has_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
  if [[ -n $has_glibc && -n $needs_glibc && $(printf '%s\n%s\n' "$needs_glibc" "$has_glibc" | sort -V | sed -n 1p) != "$needs_glibc" ]]; then
    record "bundle" "FAILED: this machine's glibc is $has_glibc, the bundle needs $needs_glibc or newer"
    failed=1
  elif "$bin/dgemma-run" --help >/dev/null 2>"$work/start.log"; then
    record "bundle" "ok: dgemma-run starts (glibc ${has_glibc:-?} >= $needs_glibc)"
  else
    cat "$work/start.log"
    record "bundle" "FAILED: dgemma-run does not start: $(head -n 1 "$work/start.log" | cut -c 1-150)"
    failed=1
  fi
  if ((${#missing[@]})); then
    record "CUDA libraries" "missing: ${missing[*]} (set CUDA_HOME to a toolkit that has them)"
    [[ ${missing[*]} == libnccl.so.2 ]] || failed=1
  fi
  for row in "${rows[@]}"; do echo "  ${row%%|*}: ${row#*|}"; done
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! gpus=$(nvidia-smi -L 2>/dev/null) || [[ -z $gpus ]]; then
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi is missing or lists no device); nothing checked"
  exit 0
fi
echo "== gpus"
echo "$gpus"

# The train losses of a metrics file, one per line.
losses() { grep '"split": *"train"' "$1" 2>/dev/null | sed -E 's/.*"loss": *([^,}]*).*/\1/'; }

# plan_for NAME [COMPILE FLAGS...]: prints the plan folder of the check NAME: the bundle's
# plans/NAME (spaces as dashes), or here, compiled with dgemma-compile into the work folder. Prints
# nothing (having shown the log) when there is none.
plan_for() {
  local name=${1// /-}
  shift
  if [[ -n $bundle ]]; then
    [[ -f $bundle/plans/$name/rank-0.dgplan ]] && echo "$bundle/plans/$name"
    return
  fi
  if timeout 60 "$bin/dgemma-compile" --model "$root/models/diffusion_gemma/configs/small-20m.json" --backend cuda "$@" \
    -o "$work/$name-plan" >"$work/$name-plan.log" 2>&1; then
    echo "$work/$name-plan"
  else
    tail -n 20 "$work/$name-plan.log" >&2
  fi
}

# train_on_both NAME RANKS TOLERANCE [COMPILE FLAGS...]: takes the train plan of small-20m (micro-batch
# 2, prompt 32, the flags), trains $steps steps from the same random init (--train mock, --seed 1) on
# cpu and on cuda, and compares the losses step by step (relative TOLERANCE); records a row per run
# and one for the comparison, and appends the losses to $comparisons. The fp32 run (NAME small-20m)
# saves its checkpoints for the timing run.
comparisons=""
train_on_both() {
  local name=$1 ranks=$2 loss_tolerance=$3
  shift 3
  local out=$work/${name// /-}
  echo "== $name: $steps training steps on cpu and on cuda ($ranks rank(s), --train mock, --seed 1)"
  if ((SECONDS > start_budget)); then
    record "$name" "skipped: the check has run for $SECONDS s, past its budget"
    return
  fi
  local plan
  plan=$(plan_for "$name" --mode train --micro-batch 2 --prompt-len 32 "$@")
  if [[ -z $plan ]]; then
    if [[ -n $bundle ]]; then record "$name plan" "FAILED: not in the bundle"; else record "$name plan" "FAILED: dgemma-compile failed"; fi
    failed=1
    return
  fi
  local backend start status save
  for backend in cpu cuda; do
    start=$SECONDS
    save=()
    [[ $name == small-20m ]] && save=(--save-dir "$out-$backend-checkpoints")
    if timeout 60 "$bin/dgemma-run" train --plan "$plan" --init random --seed 1 --train mock --steps "$steps" \
      --backend "$backend" --nproc-per-node "$ranks" --metrics "$out-$backend.jsonl" "${save[@]}" >"$out-$backend.log" 2>&1; then
      record "$name $backend" "ok: $steps steps ($((SECONDS - start)) s)"
    else
      status=$?
      tail -n 5 "$out-$backend.log"
      record "$name $backend" "FAILED (exit $status): $(grep -m 1 'error' "$out-$backend.log" | cut -c 1-150)"
      failed=1
    fi
  done
  [[ -s $out-cpu.jsonl && -s $out-cuda.jsonl ]] || return
  local table verdict
  table=$(paste <(losses "$out-cpu.jsonl") <(losses "$out-cuda.jsonl") |
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

# The kernel section of a --profile ("kernels of every entry ..., per denoise pass": op, ms/pass,
# share, calls/pass; an op may have spaces, "(fill zero)") as tab-separated "op ms calls" lines.
kernel_times() {
  awk '/^kernels of every entry/ { on = 1; getline; next } on && NF == 0 { exit }
       on && NF >= 4 { op = $1; for (i = 2; i <= NF - 3; i++) op = op " " $i; print op "\t" $(NF - 2) "\t" $NF }' "$1"
}

# profile_kernels: the per-kernel timing table. small-20m's inference plan (micro-batch 4, prompt 64)
# generates the four prompts (64 new tokens, 16 denoising steps, --seed 1) from the fp32 run's last
# checkpoint, with --profile, on the CPU and on the GPU; prints both profiles' kernel time by op side
# by side, and the GPU's whole profile. On the GPU every launch is synchronous
# (CUDA_LAUNCH_BLOCKING=1): runtime/exec/TimingBackend times each call on the host, which without it
# would be the launch only.
profile_kernels() {
  echo "== kernel timing: small-20m generates 4 prompts with --profile on cpu and on cuda"
  if ((SECONDS > profile_budget)); then
    record "kernel timing" "skipped: the check has run for $SECONDS s, past its budget"
    return
  fi
  local weights
  weights=$(ls -d "$work"/small-20m-cuda-checkpoints/step-* "$work"/small-20m-cpu-checkpoints/step-* 2>/dev/null | sed -n 1p)
  if [[ -z $weights ]]; then
    record "kernel timing" "skipped: no checkpoint (the small-20m training failed)"
    return
  fi
  local plan tokenizer prompts
  plan=$(plan_for small-20m-infer --mode infer --micro-batch 4 --prompt-len 64)
  if [[ -n $bundle ]]; then
    tokenizer=$bundle/fixtures/tokenizer
    prompts=$bundle/fixtures/prompts.jsonl
  else
    tokenizer=$root/data/tokenizer
    prompts=$work/prompts.jsonl
    grep -m 4 -v '"image' "$root/data/demo/test.jsonl" >"$prompts"
  fi
  if [[ -z $plan ]]; then
    record "kernel timing" "FAILED: no inference plan"
    failed=1
    return
  fi
  local backend status
  for backend in cpu cuda; do
    CUDA_LAUNCH_BLOCKING=1 timeout 45 "$bin/dgemma-run" generate --plan "$plan" --weights "$weights" \
      --tokenizer "$tokenizer" --input "$prompts" --max-new-tokens 64 --steps 16 --seed 1 --backend "$backend" \
      --profile >"$work/profile-$backend.out" 2>"$work/profile-$backend.err"
    status=$?
    if ((status != 0)); then
      tail -n 5 "$work/profile-$backend.err"
      record "kernel timing $backend" "FAILED (exit $status): $(grep -m 1 'error' "$work/profile-$backend.err" | cut -c 1-150)"
      failed=1
      return
    fi
  done
  cat "$work/profile-cuda.err"
  local pass_cpu pass_cuda
  pass_cpu=$(sed -n 's/^profile: .*; \([0-9.]*\) ms per pass$/\1/p' "$work/profile-cpu.err")
  pass_cuda=$(sed -n 's/^profile: .*; \([0-9.]*\) ms per pass$/\1/p' "$work/profile-cuda.err")
  echo
  echo "kernel time by op, ms per denoise pass (cpu: $(nproc) cores; cuda: CUDA_LAUNCH_BLOCKING=1)"
  awk -F '\t' 'FILENAME != last { file++; last = FILENAME } file == 1 { cpu[$1] = $2 } file == 2 { cuda[$1] = $2; calls[$1] = $3; order[++n] = $1 }
       END { printf "%-24s %12s %12s %10s %11s\n", "op", "cpu ms", "cuda ms", "cpu/cuda", "calls/pass"
             for (i = 1; i <= n; i++) { op = order[i]
               printf "%-24s %12s %12s %10s %11s\n", op, (op in cpu) ? cpu[op] : "-", cuda[op],
                 (op in cpu && cuda[op] > 0) ? sprintf("%.1fx", cpu[op] / cuda[op]) : "-", calls[op] } }' \
    <(kernel_times "$work/profile-cpu.err") <(kernel_times "$work/profile-cuda.err")
  local top
  top=$(kernel_times "$work/profile-cuda.err" | sed -n 1,3p | awk -F '\t' '{ printf "%s%s %s ms", (NR > 1 ? ", " : ""), $1, $2 }')
  record "kernel timing" "ok: ${pass_cuda:-?} ms per denoise pass on cuda, ${pass_cpu:-?} on cpu; top: $top"
}

if [[ -z $bundle ]]; then
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
fi

if ((failed == 0)); then
  if [[ -z $bundle ]]; then
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
  else
    # The bundle has no ctest files: each GPU test binary runs once, all its tests in one process.
    for tests in dgemma_gpu_tests dgemma_nccl_gpu_tests; do
      [[ -x $bin/$tests ]] || continue
      echo "== $tests"
      start=$SECONDS
      timeout 120 "$bin/$tests" --gtest_brief=1 >"$work/$tests.log" 2>&1
      status=$?
      cat "$work/$tests.log"
      passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$work/$tests.log")
      skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}[.,].*/\1/p' "$work/$tests.log")
      failures=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}[.,].*/\1/p' "$work/$tests.log")
      # A test skips with its reason on the next line; the most frequent reason goes into the row.
      reason=$(awk '/: Skipped$/ { getline; print }' "$work/$tests.log" | sort | uniq -c | sort -rn | sed -n 1p |
        sed 's/^ *[0-9]* //' | cut -c 1-90)
      if ((status == 0)) && [[ $reason == *"no usable CUDA device"* ]]; then
        # nvidia-smi lists a GPU, but the tests found none: they checked nothing.
        record "$tests" "FAILED: ${skipped:-0} of its tests skipped: $reason"
        failed=1
      elif ((status == 0)); then
        record "$tests" "ok: ${passed:-0} passed, ${skipped:-0} skipped${reason:+ (e.g. $reason)} ($((SECONDS - start)) s)"
      else
        record "$tests" "FAILED (exit $status$( ((status == 124)) && echo ', timed out')): ${passed:-0} passed, ${failures:-?} failed, ${skipped:-0} skipped"
        failed=1
      fi
    done
  fi

  train_on_both "small-20m" 1 "$loss_tolerance"
  train_on_both "small-20m bf16" 1 "$bf16_loss_tolerance" --precision bf16
  # Two ranks over NCCL (tensor parallel), against the same two ranks over Gloo.
  if (($(wc -l <<<"$gpus") >= 2)); then
    train_on_both "small-20m tp2" 2 "$loss_tolerance" --tp 2
  else
    record "small-20m tp2" "skipped: needs 2 GPUs (the NCCL tests ran with one rank)"
  fi
  profile_kernels
fi

echo
echo "== gpu-check summary ($(head -n 1 <<<"$gpus" | cut -c 1-80)${bundle:+; bundle $(sed -n 's/^source: //p' "$bundle/MANIFEST" | cut -c 1-12)})"
printf '%-24s %s\n' "check" "result"
for row in "${rows[@]}"; do printf '%-24s %s\n' "${row%%|*}" "${row#*|}"; done
printf '%s' "$comparisons"
exit "$failed"
