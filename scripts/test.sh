#!/usr/bin/env bash
# Installs what is missing, configures (Release; the runtime keeps its assertions), builds and runs
# every test through ctest (GoogleTest cases, the lit suite, end-to-end tests; GPU tests skip
# without a device).   Usage: scripts/test.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}

bash "$root/scripts/install-deps.sh"
bash "$root/scripts/configure.sh" "$build"
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest -j "$(nproc)" --output-on-failure
