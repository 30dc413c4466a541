#!/usr/bin/env bash
# Installs what is missing, configures (Release; the runtime keeps its assertions), builds and runs
# every test through ctest (GoogleTest cases, the lit suite, end-to-end tests; GPU tests skip
# without a device).
#
#   scripts/test.sh [BUILD_DIR]                 default build/
#   scripts/test.sh --sanitize [BUILD_DIR]      default build-sanitize/: everything built with
#                                               AddressSanitizer + UndefinedBehaviorSanitizer
#                                               (-DDGEMMA_SANITIZE=ON, docs/fuzzing.md); any report
#                                               fails its test
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sanitize=0
if [[ ${1:-} == --sanitize ]]; then sanitize=1; shift; fi
build=${1:-$root/build}
configure_flags=()
if ((sanitize)); then
  build=${1:-$root/build-sanitize}
  configure_flags=(-DDGEMMA_SANITIZE=ON)
  # Reports end the process with an error (UBSan does not recover; cmake/Sanitizers.cmake); leaks
  # are reported at exit. Suppressions name leaks of libraries dgemma does not build.
  # allow_user_poisoning=0: LLVM's headers poison and unpoison their allocators' memory by hand when
  # the including code is built with ASan, but Debian's MLIR and LLVM libraries are not, so memory
  # that an inline header function poisoned is later written by the library and reported as a
  # use-after-poison inside MLIR (every dgemma-opt run, every test that builds IR). dgemma itself
  # never poisons memory by hand, so nothing of ours goes unchecked.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:allow_user_poisoning=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/cmake/lsan.supp:print_suppressions=0}
fi
jobs=${DGEMMA_TEST_JOBS:-$(nproc)}

bash "$root/scripts/install-deps.sh"
bash "$root/scripts/configure.sh" "$build" "${configure_flags[@]}"
cmake --build "$build" -j "$jobs"
cd "$build"
ctest -j "$jobs" --output-on-failure
