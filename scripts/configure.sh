#!/usr/bin/env bash
# Configures a build directory against Debian's MLIR 19.
# Usage: scripts/configure.sh BUILD_DIR [CMAKE_ARGS...]   (e.g. -DDGEMMA_SANITIZE=ON)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: configure.sh BUILD_DIR [CMAKE_ARGS...]}
shift
mkdir -p "$build"
cmake -G Ninja -S "$root" -B "$build" \
  -DCMAKE_BUILD_TYPE=Release \
  -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir \
  -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-19/build/utils/lit/lit.py "$@" > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
