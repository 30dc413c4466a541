#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang 19, ASan + UBSan, in their own build directory) and
# runs each for a bounded time from a copy of its seed corpus (docs/fuzzing.md). Prints per target:
# executions, coverage (libFuzzer's final cov and ft), corpus size and findings; exits 1 if any
# target has a finding (its reproducer is under BUILD_DIR/findings/TARGET/).
#
#   scripts/fuzz.sh [--ci | --seconds N | --minutes N | --runs N] [--build-dir DIR] [--only T1,T2]
#     --ci          20 s per target (what .ci/run does; the default)
#     --seconds N   N seconds per target;  --minutes N: N minutes per target
#     --runs N      stop each target after N executions; with --seconds or --minutes as well, at
#                   whichever bound comes first (a campaign: --runs 1000000 --minutes 30)
#     --build-dir   default: build-fuzz in the repository
#     --only        a comma-separated subset of the targets (names as in fuzz/: jsonl_row, plan, ...)
#     --keep-going  run past findings (libFuzzer's fork mode, one job at a time): a campaign keeps
#                   fuzzing a target after its first crash, leak, timeout or out-of-memory input
#   scripts/fuzz.sh --write-plan-seeds   regenerates fuzz/corpus/plan/ with this build's plan writer
#   scripts/fuzz.sh --write-manifest-seed   regenerates fuzz/corpus/manifest/saved.json
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz
seconds=
runs=
only=
keep_going=0
action=run
while (($#)); do
  case $1 in
    --ci) seconds=20 ;;
    --seconds) seconds=$2; shift ;;
    --minutes) seconds=$(($2 * 60)); shift ;;
    --runs) runs=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --only) only=$2; shift ;;
    --keep-going) keep_going=1 ;;
    --write-plan-seeds) action=plan-seeds ;;
    --write-manifest-seed) action=manifest-seed ;;
    *) echo "fuzz.sh: unknown argument '$1' (see the usage at the top of scripts/fuzz.sh)" >&2; exit 2 ;;
  esac
  shift
done

targets=(jsonl_row chat_template gpt2_bpe image safetensors plan config generation_config manifest constraint openai_request)
if [[ -n $only ]]; then IFS=, read -r -a targets <<<"$only"; fi

bash "$root/scripts/install-deps.sh"
mkdir -p "$build"
# Only the parser libraries the targets link are built; the MLIR parts are configured, not compiled.
cmake -G Ninja -S "$root" -B "$build" \
  -DCMAKE_BUILD_TYPE=Release -DDGEMMA_FUZZ=ON -DDGEMMA_ENABLE_CUDA=OFF \
  -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
  -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir \
  -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-19/build/utils/lit/lit.py > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --target fuzz -j "${DGEMMA_FUZZ_JOBS:-$(nproc)}"

case $action in
  plan-seeds) rm -f "$root"/fuzz/corpus/plan/*.dgplan; "$build/bin/write_plan_seeds" "$root/fuzz/corpus/plan"; exit 0 ;;
  manifest-seed) DGEMMA_FUZZ_PRINT_SEED=1 "$build/bin/fuzz_manifest" >"$root/fuzz/corpus/manifest/saved.json"; exit 0 ;;
esac

# UBSan reports end the process (-fno-sanitize-recover); leaks are findings too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Without --runs the run is bounded by time (20 s unless told); with it, by time only when told.
bound=()
[[ -n $runs ]] && bound+=(-runs="$runs")
[[ -z $runs && -z $seconds ]] && seconds=20
[[ -n $seconds ]] && bound+=(-max_total_time="$seconds")
((keep_going)) && bound+=(-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
status=0
summary=()
for target in "${targets[@]}"; do
  binary=$build/bin/fuzz_$target
  [[ -x $binary ]] || { echo "fuzz.sh: no target '$target' (built: ${targets[*]})" >&2; exit 2; }
  corpus=$build/corpus/$target findings=$build/findings/$target log=$build/logs/$target.log
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  dict=()
  [[ -f $root/fuzz/dict/$target.dict ]] && dict=(-dict="$root/fuzz/dict/$target.dict")
  echo "fuzz.sh: $target (${runs:+$runs runs}${runs:+${seconds:+, at most }}${seconds:+$seconds s}) ..."
  # Findings of earlier runs stay in $findings; this run counts only what it adds.
  started=$build/logs/$target.started
  touch "$started"
  # The working corpus grows in the build directory; the seeds in fuzz/corpus stay as committed.
  rc=0
  "$binary" "${bound[@]}" "${dict[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/" "$corpus" "$root/fuzz/corpus/$target" >"$log" 2>&1 || rc=$?
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  # Fork mode prints no final stats; its last status line "#N: cov: ..." counts the executions.
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [[ -n $execs ]] || execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  found=$(find "$findings" -type f -newer "$started" | wc -l)
  if ((rc != 0 || found != 0)); then
    status=1
    echo "fuzz.sh: $target: FINDING (exit $rc); reproducer(s) in $findings, log $log:"
    grep -E 'ERROR: |==fuzz finding|runtime error|SUMMARY' "$log" | head -5 || true
  fi
  summary+=("$(printf '%-18s execs %-10s cov %-6s ft %-7s corpus %-5s findings %s' "$target" "${execs:-?}" "${cov:-?}" \
    "${ft:-?}" "${corp:-?}" "$found")")
done
printf '%s\n' "fuzz.sh: summary" "${summary[@]}"
exit $status
