#!/usr/bin/env bash
# torchrun starts dgemma-run train's two ranks with --no-python, through its static rendezvous
# (--master-port) or the c10d one elastic jobs use (--rdzv-backend c10d --rdzv-endpoint): the
# metrics equal dgemma-run --nproc-per-node 2's on the same plan and seed; the run-level lines
# appear once and the log holds no carriage return.
#   torchrun_rendezvous.sh SOURCE_DIR BIN_DIR VENV_DIR static|c10d
# shellcheck source=test/launchers/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=test/launchers/torchrun_lib.sh
source "$here/torchrun_lib.sh"
rendezvous=${4:?usage: $0 SOURCE_DIR BIN_DIR VENV_DIR static|c10d}
test_name="torchrun_$rendezvous"
steps=4

compile_plan
run_reference --steps "$steps" --metrics "$scratch/reference.jsonl"

port=$(free_port)
case $rendezvous in
  static) rendezvous_args=(--master-port "$port") ;;
  c10d) rendezvous_args=(--rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port") ;;
  *) fail "unknown rendezvous '$rendezvous' (expected static or c10d)" ;;
esac
train_args --steps "$steps" --metrics "$scratch/torchrun.jsonl"
run_logged "$scratch/torchrun.log" "$phase_seconds" "$torchrun" --nnodes 1 --nproc-per-node 2 \
  "${rendezvous_args[@]}" --no-python "${train_args_[@]}"
show_log "torchrun output" "$scratch/torchrun.log"
((run_status == 0)) || fail "torchrun exited $run_status"

compare_metrics "$scratch/reference.jsonl" "$scratch/torchrun.jsonl" "$steps"
expect_once "$scratch/torchrun.log" "defaults of the plan's preset"
expect_no_carriage_return "$scratch/torchrun.log"
pass_if_no_problems "torchrun ($rendezvous rendezvous) trained the same $steps steps as dgemma-run --nproc-per-node 2"
