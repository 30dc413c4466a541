#!/usr/bin/env bash
# When one rank fails with a dgemma error under torchrun, torchrun's report names it: the "Root
# Cause" section shows that rank and dgemma's error message, which dgemma-run hands over in the JSON
# file torchrun names in TORCHELASTIC_ERROR_FILE (without it the section reads "error_file: <N/A>"
# and points at a web page instead).
#
# The failure: --metrics in a directory that does not exist. Only rank 0 writes the metrics file,
# so rank 0 fails once the ranks have met and rank 1 fails after it (its peer went away). The
# reference is the same run under dgemma-run --nproc-per-node 2, which prints the same error.
#   torchrun_failure.sh SOURCE_DIR BIN_DIR VENV_DIR
# shellcheck source=test/launchers/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=test/launchers/torchrun_lib.sh
source "$here/torchrun_lib.sh"
metrics=$scratch/no-such-directory/metrics.jsonl

compile_plan
train_args --steps 4 --metrics "$metrics"
run_logged "$scratch/reference.log" "$phase_seconds" "${train_args_[@]}" --nproc-per-node 2
show_log "dgemma-run --nproc-per-node 2 output" "$scratch/reference.log"
((run_status != 0)) || fail "the reference run succeeded; it should fail on --metrics $metrics"
expected=$(grep -m1 -F 'dgemma-run (rank 0): error: ' "$scratch/reference.log") ||
  fail "the reference run printed no 'dgemma-run (rank 0): error: ' line"
[[ $expected == *"$metrics"* ]] || fail "rank 0's error does not name $metrics: $expected"
log "dgemma's error for this run: $expected"

port=$(free_port)
run_logged "$scratch/torchrun.log" "$phase_seconds" "$torchrun" --nnodes 1 --nproc-per-node 2 \
  --master-port "$port" --no-python "${train_args_[@]}"
show_log "torchrun output" "$scratch/torchrun.log"
((run_status == 1)) || fail "torchrun exited $run_status; a failed worker group exits 1"

# The section from "Root Cause (first observed failure):" to the closing line of '='.
root_cause=$(awk '/^Root Cause \(first observed failure\):/ { inside = 1; next } inside && /^=+$/ { exit } inside' \
  "$scratch/torchrun.log")
[[ -n $root_cause ]] || fail "torchrun printed no 'Root Cause (first observed failure):' section"
echo "---- torchrun's Root Cause section ----"
echo "$root_cause"
echo "----"
grep -qE '^  rank +: 0 \(local_rank: 0\)' <<< "$root_cause" || fail "the root cause is not rank 0, the rank that failed first"
grep -qE '^  error_file: .*error\.json$' <<< "$root_cause" ||
  fail "the root cause has no error file: dgemma-run wrote nothing to TORCHELASTIC_ERROR_FILE"
grep -qxF "  traceback : $expected" <<< "$root_cause" ||
  fail "the root cause's traceback is not dgemma's error message '$expected'"
log "PASS: torchrun's Root Cause shows rank 0 and dgemma's message: $expected"
