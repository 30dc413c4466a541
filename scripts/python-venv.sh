#!/usr/bin/env bash
# Creates, or reuses, the Python virtual environment of dgemma's test clients at BUILD_DIR/venv,
# with the pinned packages of test/requirements.txt, and prints its path.
#
#   scripts/python-venv.sh BUILD_DIR
#
# Up to date (the stamp BUILD_DIR/venv/.dgemma-requirements matches the requirements file and the
# interpreter) it only compares the stamp and returns at once. Otherwise it removes the venv,
# builds it afresh with `python3 -m venv` (PYTHON=... picks another interpreter) and `pip install
# -r`, and writes the stamp last, so an install that was interrupted or failed is redone on the next
# call. A lock (BUILD_DIR/venv.lock) keeps two calls from building at once. Progress goes to stderr;
# stdout is only the path.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: python-venv.sh BUILD_DIR}
requirements=$root/test/requirements.txt
python=${PYTHON:-python3}

mkdir -p "$build"
build=$(cd "$build" && pwd)
venv=$build/venv
stamp=$venv/.dgemma-requirements

if ! command -v "$python" > /dev/null; then
  echo "python-venv: $python not found (scripts/install-deps.sh installs python3)" >&2
  exit 1
fi
# The stamp: the requirements file's hash and the interpreter's version, so a change to either
# rebuilds the venv (a venv links its interpreter and cannot outlive it).
want="requirements $(sha256sum < "$requirements" | cut -d' ' -f1)
python $("$python" -c 'import sys; print(sys.version.split()[0], sys.executable)')"

up_to_date() { [[ -f $stamp && "$(cat "$stamp")" == "$want" && -x $venv/bin/python ]]; }

exec 9> "$build/venv.lock"
flock 9
if up_to_date; then
  echo "$venv"
  exit 0
fi

echo "python-venv: installing test/requirements.txt into $venv (torch and its CUDA wheels: about 4 GB the first time)" >&2
rm -rf "$venv"
if ! "$python" -m venv "$venv" >&2; then
  rm -rf "$venv"
  echo "python-venv: '$python -m venv' failed (on Debian: apt-get install python3-venv; scripts/install-deps.sh does)" >&2
  exit 1
fi
start=$SECONDS
"$venv/bin/python" -m pip install --disable-pip-version-check --no-input --quiet -r "$requirements" >&2
"$venv/bin/python" -m pip check >&2
"$venv/bin/python" -c 'import torch.distributed.run' >&2
printf '%s\n' "$want" > "$stamp.tmp"
mv "$stamp.tmp" "$stamp"
echo "python-venv: installed in $((SECONDS - start)) s" >&2
echo "$venv"
