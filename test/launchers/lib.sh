# Shared by the launcher tests (sourced, not run): one DP=2 train plan of the tiny CPU model, the
# reference run by dgemma-run --nproc-per-node 2, and the comparison of two metrics files.
#
# Every test script takes: SOURCE_DIR BIN_DIR [VENV_DIR]
#   SOURCE_DIR  the repository (models/diffusion_gemma/configs/tiny-cpu.json)
#   BIN_DIR     the directory holding dgemma-compile and dgemma-run
#   VENV_DIR    the Python venv of test/requirements.txt (torchrun tests only)
# Exit codes: 0 pass, 1 fail, 77 skip (ctest's SKIP_RETURN_CODE), each with the reason printed.
set -euo pipefail

test_name=$(basename "$0" .sh)
source_dir=$(cd "${1:?usage: $0 SOURCE_DIR BIN_DIR [VENV_DIR]}" && pwd)
bin_dir=$(cd "${2:?usage: $0 SOURCE_DIR BIN_DIR [VENV_DIR]}" && pwd)
# shellcheck disable=SC2034  # read by torchrun_lib.sh
venv_dir=${3:-}
here=$(cd "$(dirname "$0")" && pwd)

log() { echo "[$test_name] $*"; }
fail() {
  echo "[$test_name] FAIL: $*" >&2
  exit 1
}
skip() {
  echo "[$test_name] SKIP: $*"
  exit 77
}

for tool in dgemma-compile dgemma-run; do
  [[ -x $bin_dir/$tool ]] || fail "$bin_dir/$tool does not exist (build it first)"
done
command -v python3 > /dev/null || fail "python3 not found (scripts/install-deps.sh installs it)"

scratch=$(mktemp -d "${TMPDIR:-/tmp}/dgemma-$test_name-XXXXXX")
# on_exit COMMAND: eval'd on every exit path, last registered first (single-quote it, so that its
# variables expand then); then the scratch directory goes (kept on failure when
# DGEMMA_KEEP_SCRATCH=1).
cleanup_commands=()
running_child=
on_exit() { cleanup_commands=("$1" "${cleanup_commands[@]}"); }
run_cleanup() {
  local status=$?
  trap - EXIT INT TERM
  local command
  [[ -z $running_child ]] || kill -TERM "$running_child" 2> /dev/null || true
  for command in "${cleanup_commands[@]}"; do eval "$command" || true; done
  if [[ $status -ne 0 && ${DGEMMA_KEEP_SCRATCH:-0} == 1 ]]; then
    echo "[$test_name] kept $scratch"
  else
    rm -rf "$scratch"
  fi
  exit "$status"
}
trap run_cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# A TCP port nothing listens on now (the kernel's pick).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Prints a captured log, indented, so ctest's output shows what the program said.
show_log() {
  echo "---- $1 ----"
  sed 's/^/  | /' "$2"
  echo "---- end of $1 ----"
}

# The bound of each program a test runs (compile, reference, launcher). The runs take seconds; the
# bound only ends a hung one, with the cleanup, well within ctest's TIMEOUT (CMakeLists.txt here).
phase_seconds=60

# Runs "$@" with stdout and stderr into LOG, bounded by SECONDS (then timeout(1) kills its whole
# process group); sets run_status. Never fails by itself. It runs in the background and the script
# waits for it, so a SIGTERM or SIGINT to the script runs the cleanup at once, which stops it.
run_logged() {
  local log_file=$1 seconds=$2
  shift 2
  log "running: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$seconds" "$@" > "$log_file" 2>&1 &
  running_child=$!
  wait $running_child && run_status=0 || run_status=$?
  running_child=
  log "exit status $run_status after $((SECONDS - start)) s"
  ((run_status != 124 && run_status != 137)) || log "timed out after $seconds s"
}

# The plan: the tiny CPU model, data parallelism 2, micro-batch 2, prompts of 32 or 48 tokens; the
# preset tiny-cpu gives it run defaults, so the run prints the run-level line "defaults of the
# plan's preset ..." (the flags the test leaves out).
plan=$scratch/plan
compile_plan() {
  run_logged "$scratch/compile.log" "$phase_seconds" "$bin_dir/dgemma-compile" \
    --model "$source_dir/models/diffusion_gemma/configs/tiny-cpu.json" --preset tiny-cpu --mode train --dp 2 \
    --micro-batch 2 --prompt-len 32,48 -o "$plan"
  ((run_status == 0)) || { show_log dgemma-compile "$scratch/compile.log"; fail "dgemma-compile exited $run_status"; }
  [[ -f $plan/rank-0.dgplan && -f $plan/rank-1.dgplan ]] || fail "dgemma-compile did not write rank-0 and rank-1 plans"
}

# The train command both runs share: from --init random with a fixed seed on the synthetic data,
# one thread per rank (two ranks on a two-core machine). "$@": --steps, --metrics and the rest;
# the command lands in train_args_.
train_args() {
  train_args_=("$bin_dir/dgemma-run" train --plan "$plan" --init random --seed 7 --train mock --lr 3e-3 --warmup 2
    --threads 1 "$@")
}

# The reference: dgemma-run's own launcher, two local ranks. "$@": --steps, --metrics, ...
run_reference() {
  train_args "$@"
  run_logged "$scratch/reference.log" "$phase_seconds" "${train_args_[@]}" --nproc-per-node 2
  ((run_status == 0)) ||
    { show_log "dgemma-run --nproc-per-node 2" "$scratch/reference.log"; fail "the reference run exited $run_status"; }
}

# compare_metrics REFERENCE CANDIDATE STEPS: both files hold the same lines, field for field, but for
# timing fields; the reference has STEPS train lines.
compare_metrics() {
  python3 "$here/compare_metrics.py" --train-lines "$3" "$1" "$2" || fail "the metrics files differ"
}

# Checks that do not stop the test: each failed one is printed and counted, and pass_if_no_problems
# then fails naming them all, so one run shows every regression at once.
problems=()
problem() {
  echo "[$test_name] FAIL: $*" >&2
  problems+=("$*")
}
pass_if_no_problems() {
  ((${#problems[@]} == 0)) || fail "${#problems[@]} check(s) failed: $(printf '%s; ' "${problems[@]}")"
  log "PASS: $*"
}

# A run-level line of a log must appear exactly once, not once per rank.
expect_once() {
  local log_file=$1 text=$2 count
  count=$(grep -cF -- "$text" "$log_file" || true)
  if ((count == 1)); then
    log "one line with '$text', as expected"
  else
    problem "expected one line with '$text' in the output, found $count"
  fi
}

# Off a terminal, progress goes out as whole lines, never redrawn with a carriage return.
expect_no_carriage_return() {
  local count
  count=$(grep -c $'\r' "$1" || true)
  if ((count == 0)); then
    log "no carriage return in the output"
  else
    problem "the output holds $count line(s) with a carriage return (\\r); off a terminal, progress must be whole lines"
  fi
}
