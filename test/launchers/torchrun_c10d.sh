#!/usr/bin/env bash
# torchrun with the c10d rendezvous (--rdzv-backend c10d --rdzv-endpoint, the one elastic jobs use)
# starts dgemma-run train's two ranks with --no-python: the metrics equal dgemma-run
# --nproc-per-node 2's on the same plan and seed; the run-level lines appear once and the log holds
# no carriage return.
#   torchrun_c10d.sh SOURCE_DIR BIN_DIR VENV_DIR
# shellcheck source=test/launchers/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=test/launchers/torchrun_lib.sh
source "$here/torchrun_lib.sh"
steps=4

compile_plan
run_reference --steps "$steps" --metrics "$scratch/reference.jsonl"

port=$(free_port)
train_args --steps "$steps" --metrics "$scratch/torchrun.jsonl"
run_logged "$scratch/torchrun.log" "$phase_seconds" "$torchrun" --nnodes 1 --nproc-per-node 2 \
  --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --no-python "${train_args_[@]}"
show_log "torchrun output" "$scratch/torchrun.log"
((run_status == 0)) || fail "torchrun exited $run_status"

compare_metrics "$scratch/reference.jsonl" "$scratch/torchrun.jsonl" "$steps"
expect_once "$scratch/torchrun.log" "defaults of the plan's preset"
expect_no_carriage_return "$scratch/torchrun.log"
pass_if_no_problems "torchrun (c10d rendezvous) trained the same $steps steps as dgemma-run --nproc-per-node 2"
