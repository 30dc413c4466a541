#!/bin/bash
# Runs inside the bare Debian 12 root of bundle_test.sh (chroot, no GPU, CUDA's libraries at
# /usr/local/cuda/lib64 and nothing else of this project's): the bundle's CPU half.
#   Usage: in_rootfs.sh BUNDLE_DIR
set -euo pipefail
carried=$1
fail() { echo "FAILED: $*"; exit 1; }

# A copy with the gzipped files unpacked, as gpu-check.sh --bundle makes for itself.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$carried" "$work/bundle"
bundle=$work/bundle
find "$bundle/bin" "$bundle/lib" -name '*.gz' -exec gzip -d {} +
export LD_LIBRARY_PATH=/usr/local/cuda/lib64   # the toolkit's folder, first in gpu-check.sh's search order

echo "-- every library a program loads comes from the bundle, CUDA's folder, glibc or the GCC runtime"
for program in "$bundle"/bin/*; do
  ldd "$program" >"$work/ldd" 2>&1 || { cat "$work/ldd"; fail "ldd ${program##*/}"; }
  if grep -q 'not found' "$work/ldd"; then
    cat "$work/ldd"
    fail "${program##*/}: $(grep 'not found' "$work/ldd" | tr -s ' \t' ' ' | tr '\n' ';')"
  fi
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    path=$(realpath -m "$path")
    case $path in
      "$bundle"/lib/* | /usr/local/cuda/lib64/*) continue ;;
    esac
    case $name in
      # glibc's and the GCC runtime's: what scripts/gpu-bundle.sh leaves to the machine.
      libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
        libutil.so.* | libanl.so.* | libnsl.so.* | libstdc++.so.* | libgcc_s.so.*) continue ;;
    esac
    fail "${program##*/} loads $name from $path, this root's own, not the bundle's"
  done <"$work/ldd"
  echo "${program##*/}: $(grep -c "$bundle/" "$work/ldd") libraries from the bundle, $(grep -c /usr/local/cuda/ "$work/ldd") from CUDA's folder"
done

echo "-- dgemma-run --help"
"$bundle/bin/dgemma-run" --help | sed -n 1,3p

echo "-- dgemma-run inspect --plan plans/small-20m"
"$bundle/bin/dgemma-run" inspect --plan "$bundle/plans/small-20m" | sed -n 1,4p

echo "-- two training steps of the small-20m plan on the CPU (gpu-check.sh trains the same plan on cpu and cuda)"
"$bundle/bin/dgemma-run" train --plan "$bundle/plans/small-20m" --init random --seed 1 --train mock --steps 2 \
  --backend cpu --metrics "$work/metrics.jsonl" | tail -n 3
losses=$(grep -c '"split": *"train".*"loss"' "$work/metrics.jsonl" || true)
((losses == 2)) || fail "the training run wrote $losses train losses, not 2"

for tests in "$bundle"/bin/*_tests; do
  echo "-- ${tests##*/} (no GPU: the device tests skip)"
  "$tests" --gtest_brief=1 >"$work/tests.log" 2>&1 || { cat "$work/tests.log"; fail "${tests##*/}"; }
  grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$work/tests.log"
done

echo "-- gpu-check.sh --bundle"
status=0
env -u LD_LIBRARY_PATH bash "$carried/gpu-check.sh" --bundle "$carried" >"$work/gpu-check.log" 2>&1 || status=$?
cat "$work/gpu-check.log"
((status == 0)) || fail "gpu-check.sh --bundle exited $status without a GPU"
grep -q 'no NVIDIA GPU' "$work/gpu-check.log" || fail "gpu-check.sh --bundle did not say there is no GPU"
grep -q 'bundle: ok: dgemma-run starts' "$work/gpu-check.log" || fail "gpu-check.sh --bundle did not start dgemma-run"
echo "PASSED: the bundle runs in a bare Debian 12 root"
