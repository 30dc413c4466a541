# Sourced by the torchrun tests after lib.sh: the venv's torchrun, and a quiet Python.
[[ -n $venv_dir ]] || fail "no VENV_DIR given (ctest passes BUILD_DIR/venv, made by scripts/python-venv.sh)"
torchrun=$venv_dir/bin/torchrun
[[ -x $torchrun ]] || fail "$torchrun does not exist (scripts/python-venv.sh BUILD_DIR makes the venv)"
# torchrun sets OMP_NUM_THREADS=1 for its workers and says so; dgemma's pool takes --threads.
export OMP_NUM_THREADS=1
