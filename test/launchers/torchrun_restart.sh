#!/usr/bin/env bash
# torchrun --max-restarts 1 restarts the worker group after one worker is killed, and the restarted
# dgemma-run ranks (TORCHELASTIC_RESTART_COUNT=1) continue from the newest complete checkpoint of
# --save-dir: the run exits 0 and its metrics file equals an uninterrupted run's (timing aside).
#
# Once the first complete checkpoint (step-NNNNNNNN/manifest.json, step S) is in the save directory
# and the metrics file has the line of step S + 1 (which the resumed run must drop and write
# again), the test finds torchrun's dgemma-run workers in /proc and kills the one whose environment
# has RANK=1 with SIGKILL. The reference is the uninterrupted run under dgemma-run --nproc-per-node 2.
#   torchrun_restart.sh SOURCE_DIR BIN_DIR VENV_DIR
# shellcheck source=test/launchers/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=test/launchers/torchrun_lib.sh
source "$here/torchrun_lib.sh"
# A checkpoint every second step, 20 steps: seconds on two cores, so the kill lands mid-run.
steps=20
common=(--steps "$steps" --save-every 2 --keep 3)

compile_plan
run_reference "${common[@]}" --save-dir "$scratch/reference-checkpoints" --metrics "$scratch/reference.jsonl"

save_dir=$scratch/checkpoints
metrics=$scratch/torchrun.jsonl
port=$(free_port)
train_args "${common[@]}" --save-dir "$save_dir" --metrics "$metrics"
command=("$torchrun" --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --max-restarts 1
  --no-python "${train_args_[@]}")
log "running in the background: ${command[*]}"
start=$SECONDS
timeout --kill-after=10 "$phase_seconds" "${command[@]}" > "$scratch/torchrun.log" 2>&1 &
launcher=$!
on_exit 'kill -TERM $launcher 2> /dev/null'

complete_checkpoints() { compgen -G "$save_dir/step-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]/manifest.json" || true; }
ended_early() {
  wait $launcher && status=0 || status=$?
  show_log "torchrun output" "$scratch/torchrun.log"
  fail "torchrun exited ($status) $1"
}

# 1. The first complete checkpoint.
until [[ -n $(complete_checkpoints) ]]; do
  kill -0 $launcher 2> /dev/null || ended_early "before the first checkpoint was complete"
  ((SECONDS - start < phase_seconds)) || fail "no complete checkpoint in $save_dir after $phase_seconds s"
  sleep 0.05
done
first=$(complete_checkpoints | sed -n 1p | xargs dirname)
log "first complete checkpoint: $first"
first_step=$((10#${first##*/step-}))
until grep -qF "{\"step\": $((first_step + 1)), \"split\": \"train\"" "$metrics" 2> /dev/null; do
  kill -0 $launcher 2> /dev/null || ended_early "before step $((first_step + 1))"
  ((SECONDS - start < phase_seconds)) || fail "no metrics line for step $((first_step + 1)) after $phase_seconds s"
  sleep 0.02
done

# 2. Kill rank 1 of the first attempt.
victim=
while read -r pid rank restart; do
  [[ $rank == 1 && $restart == 0 ]] && victim=$pid
done < <(python3 "$here/workers.py" $launcher)
if [[ -z $victim ]]; then
  kill -0 $launcher 2> /dev/null || ended_early "before its rank-1 worker could be killed"
  fail "no dgemma-run worker with RANK=1 below torchrun (pid $launcher); workers (pid rank restart):" \
    "$(python3 "$here/workers.py" $launcher | tr '\n' ';')"
fi
kill -KILL "$victim"
lines_at_kill=$(wc -l < "$metrics")
log "killed rank 1 (pid $victim, TORCHELASTIC_RESTART_COUNT=0) with SIGKILL; metrics lines so far: $lines_at_kill;" \
  "complete checkpoints: $(complete_checkpoints | xargs -r -n1 dirname | xargs -r -n1 basename | tr '\n' ' ')"

# 3. Watch for the restarted group's workers until torchrun ends.
restarted=
while kill -0 $launcher 2> /dev/null; do
  if [[ -z $restarted ]]; then
    restarted=$(python3 "$here/workers.py" $launcher | awk '$3 == 1 { print $1 " (RANK=" $2 ")" }' | tr '\n' ' ')
    [[ -z $restarted ]] || log "restarted workers with TORCHELASTIC_RESTART_COUNT=1: $restarted"
  fi
  sleep 0.05
done
wait $launcher && run_status=0 || run_status=$?
log "torchrun exited $run_status after $((SECONDS - start)) s"
show_log "torchrun output" "$scratch/torchrun.log"

((run_status == 0)) || fail "torchrun exited $run_status; with --max-restarts 1 the restarted group should finish"
# torchrun logs the failed group as an error: rank 1's SIGKILL (exitcode -9), or rank 0's exit 1 when
# rank 0 noticed its peer was gone before torchrun noticed the kill. Its "will restart worker
# group" is INFO, which it does not print.
failure=$(grep -E "failed \(exitcode: -?[0-9]+\) local_rank: [01] " "$scratch/torchrun.log") ||
  fail "torchrun reported no failed worker after the SIGKILL of rank 1 (pid $victim)"
log "torchrun: ${failure#*] }"
[[ -n $restarted ]] || fail "no worker with TORCHELASTIC_RESTART_COUNT=1 was seen: torchrun did not restart the group"
resumed=$(grep -E 'resum(ed|ing) from .*/step-[0-9]{8}' "$scratch/torchrun.log") ||
  fail "the restarted group did not say which checkpoint it resumed from"
log "dgemma: $resumed"
resumed_step=$(sed -n 's/^resumed from .*: step \([0-9]*\),.*/\1/p' "$scratch/torchrun.log" | sed -n 1p)
[[ -z $resumed_step ]] || log "the metrics file had $lines_at_kill lines at the kill and the run resumed after step" \
  "$resumed_step: $((lines_at_kill - resumed_step)) line(s) were dropped and written again"
compare_metrics "$scratch/reference.jsonl" "$metrics" "$steps"
log "PASS: killed rank 1, torchrun restarted the group, and the run continued to the uninterrupted run's metrics"
