#!/usr/bin/env bash
# Open MPI's mpirun -np 2 starts dgemma-run train's two ranks (they read OMPI_COMM_WORLD_*, rank 0
# serves the TCP store on MASTER_PORT): the metrics equal dgemma-run --nproc-per-node 2's on the same
# plan and seed. The run-level lines appear once (not once per rank) and the log holds no carriage
# return.
#   mpirun.sh SOURCE_DIR BIN_DIR
# shellcheck source=test/launchers/lib.sh
source "$(dirname "$0")/lib.sh"

command -v mpirun > /dev/null || fail "mpirun not found (Debian: openmpi-bin; scripts/install-deps.sh installs it)"
mpirun_flags=(-np 2)
# As root, Open MPI refuses to start without --allow-run-as-root; on a machine with fewer free
# slots than ranks it needs --oversubscribe.
[[ $(id -u) -ne 0 ]] || mpirun_flags+=(--allow-run-as-root)
mpirun_flags+=(--oversubscribe)
steps=4

compile_plan
run_reference --steps "$steps" --metrics "$scratch/reference.jsonl"

port=$(free_port)
train_args --steps "$steps" --metrics "$scratch/mpirun.jsonl"
run_logged "$scratch/mpirun.log" "$phase_seconds" mpirun "${mpirun_flags[@]}" -x MASTER_PORT="$port" "${train_args_[@]}"
show_log "mpirun output" "$scratch/mpirun.log"
((run_status == 0)) || fail "mpirun exited $run_status"

compare_metrics "$scratch/reference.jsonl" "$scratch/mpirun.jsonl" "$steps"

# Rank 0 alone prints what concerns the whole run.
expect_once "$scratch/mpirun.log" "defaults of the plan's preset"
expect_once "$scratch/mpirun.log" "--train mock: 64 synthetic items"
expect_once "$scratch/mpirun.log" "step $steps/$steps  loss "
expect_no_carriage_return "$scratch/mpirun.log"
pass_if_no_problems "mpirun -np 2 trained the same $steps steps as dgemma-run --nproc-per-node 2"
