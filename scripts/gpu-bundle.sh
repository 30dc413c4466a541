#!/usr/bin/env bash
# Builds the GPU check's bundle: a folder that runs `scripts/gpu-check.sh --bundle DIR` on a lent GPU
# machine that has the CUDA toolkit, a driver and a Python but none of this project's build
# dependencies (MLIR, Gloo, OpenBLAS, SentencePiece, CLI11) and no package registry. Nothing is built
# or configured here: it takes the programs of an existing CUDA build (BUILD_DIR/bin) and copies them.
#   Usage: scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, BUILD_DIR/gpu-bundle)
#
# The bundle:
#   bin/        dgemma-run, dgemma_gpu_tests and, when the build has NCCL, dgemma_nccl_gpu_tests:
#               stripped copies (the build's own files are never modified) whose RUNPATH is
#               $ORIGIN/../lib
#   lib/        every shared library they load (ldd here) that is neither glibc's, nor the GCC
#               runtime's (libstdc++, libgcc_s), nor CUDA's: OpenBLAS with libgfortran and
#               libquadmath, Gloo with hiredis, ibverbs and libnl, SentencePiece, libpng, libjpeg,
#               xxhash and zlib. Each has RUNPATH $ORIGIN, so their own dependencies resolve in lib/
#               too
#   plans/      train plans of small-20m (micro-batch 2, prompt 32, --backend cuda): fp32, bf16 and
#               --tp 2 (two ranks), and an inference plan (micro-batch 4, prompt 64) for the
#               per-kernel timing table; compiled here with BUILD_DIR/bin/dgemma-compile
#   fixtures/   the bundled tokenizer (data/tokenizer) and four text prompts of the demo's test split,
#               for the timing run's generation. The GPU test binaries read no files
#   gpu-check.sh  a copy of scripts/gpu-check.sh, so the bundle also runs where the repository is not
#   MANIFEST    the source commit, the programs, each carried library and where it came from, the
#               plans' compile commands, the CUDA libraries the machine must supply (`cuda-needed:`,
#               `cuda-dlopen:`) and the newest glibc symbol version any carried file needs (`glibc:`)
#
# glibc is not carried (it must match the machine's loader); the machine needs at least the version
# MANIFEST's `glibc:` names (2.34 for a Debian 12 build; gpu-check.sh --bundle checks it). Nor is
# the GCC runtime: Debian 12's libstdc++ itself needs glibc 2.36, so carrying it would keep the
# bundle off Ubuntu 22.04 (glibc 2.35), whose own libstdc++ (gcc 12's) serves the programs; the
# machine's must have the GLIBCXX and CXXABI versions MANIFEST's `libstdc++:` names (gcc 12 or newer:
# Ubuntu 22.04 and 24.04, Debian 12 and 13 have them; RHEL 9's gcc 11 does not). CUDA's libraries
# (cudart, cuBLAS, cuBLASLt, NCCL) and the driver's libcuda are not carried either: they are the
# machine's (docs/performance.md, "GPU check on a lent machine", has the search order). The programs
# link cudart and cuBLAS/cuBLASLt (so these must be found even to print --help) but not libcuda,
# which cudart loads with dlopen when a device is first used, and NCCL is loaded with dlopen by a
# multi-rank --backend cuda run: the programs start on a machine without a GPU driver.
#
# A file over 4 MiB is stored gzipped (NAME.gz; OpenBLAS alone is 36 MB, 11 MB gzipped) so the
# bundle stays under 40 MiB: a device call carries at most 64 MiB, the repository's tracked files
# (about 18 MB) included. gpu-check.sh --bundle unpacks them into a working copy of the bundle in its
# temporary folder (the carried folder stays as it came).
# Prints the size and a summary of the contents; fails if the bundle is over 40 MiB.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$root/build}")
out=$(realpath -m "${2:-$build/gpu-bundle}")
limit=$((40 * 1024 * 1024))
compress_over=$((4 * 1024 * 1024))
model=$root/models/diffusion_gemma/configs/small-20m.json

die() { echo "gpu-bundle: $*" >&2; exit 1; }

for tool in patchelf strip objdump gzip ldd; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/install-deps.sh installs it)"
done
[[ -x $build/bin/dgemma-compile && -x $build/bin/dgemma-run ]] ||
  die "$build/bin has no dgemma-compile and dgemma-run: build them first (scripts/configure.sh $build && cmake --build $build)"
[[ -x $build/bin/dgemma_gpu_tests ]] ||
  die "$build/bin/dgemma_gpu_tests is missing: the bundle needs a CUDA build (nvcc present when configuring) with the GPU tests built"
programs=(dgemma-run dgemma_gpu_tests)
if grep -q '^DGEMMA_HAVE_NCCL:INTERNAL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  [[ -x $build/bin/dgemma_nccl_gpu_tests ]] || die "the build has NCCL but $build/bin/dgemma_nccl_gpu_tests is not built"
  programs+=(dgemma_nccl_gpu_tests)
fi
# Never delete a folder this script did not make.
if [[ -e $out && ! -f $out/MANIFEST ]] && [[ -n $(ls -A "$out" 2>/dev/null) ]]; then
  die "$out exists and is not a bundle (no MANIFEST): not replacing it"
fi

mkdir -p "$(dirname "$out")"
stage=$(mktemp -d "$(dirname "$out")/.gpu-bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
chmod 755 "$stage"
mkdir -p "$stage"/{bin,lib,plans,fixtures}

# glibc's own libraries (and the kernel's vDSO) and the GCC runtime: the machine's, never carried.
is_system() {
  case $1 in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | libdl.so.* | \
      librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnsl.so.* | libBrokenLocale.so.* | \
      libstdc++.so.* | libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
# CUDA's libraries and the driver's: found on the machine.
is_cuda() {
  case $1 in
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | libnvidia-* | libnvrtc* | \
      libnvJitLink.so.* | libcufft* | libcurand.so.* | libcusolver* | libcusparse.so.* | libcudnn*) return 0 ;;
  esac
  return 1
}

# The sources the build was configured from (the commit MANIFEST names).
source=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
source=${source:-$root}
manifest=$stage/MANIFEST
{
  echo "dgemma GPU-check bundle (scripts/gpu-bundle.sh); run: bash gpu-check.sh --bundle DIR"
  echo "source: $(git -C "$source" rev-parse HEAD 2>/dev/null || echo unknown)$(
    [[ -n $(git -C "$source" status --porcelain --untracked-files=no 2>/dev/null) ]] && echo ' (with uncommitted changes)')"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "programs: ${programs[*]}"
} >"$manifest"

# The programs: stripped copies with RUNPATH $ORIGIN/../lib.
declare -A carried=()   # soname -> the file it was copied from
cuda_needed=()
cuda_dirs=""            # where ldd found the CUDA libraries here (for the check below)
for program in "${programs[@]}"; do
  strip --strip-unneeded -o "$stage/bin/$program" "$build/bin/$program"
  patchelf --set-rpath '$ORIGIN/../lib' "$stage/bin/$program"
  # ldd lists the whole closure (the libraries' own dependencies too), resolved as the build runs them.
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    is_system "$name" && continue
    if is_cuda "$name"; then
      [[ " ${cuda_needed[*]} " == *" $name "* ]] || cuda_needed+=("$name")
      [[ $path == /* && :$cuda_dirs: != *:$(dirname "$path"):* ]] && cuda_dirs+=${cuda_dirs:+:}$(dirname "$path")
      continue
    fi
    [[ $path == /* ]] || die "$program needs $name, which is not found here: $(ldd "$build/bin/$program" | grep 'not found' | tr -s ' \t' ' ')"
    carried[$name]=$(realpath "$path")
  done < <(ldd "$build/bin/$program")
done

for name in $(printf '%s\n' "${!carried[@]}" | sort); do
  cp "${carried[$name]}" "$stage/lib/$name"
  chmod 755 "$stage/lib/$name"
  patchelf --set-rpath '$ORIGIN' "$stage/lib/$name"
  package=""
  for candidate in "${carried[$name]}" "${carried[$name]/#\/usr\/lib\//\/lib\/}"; do
    package=$(dpkg -S "$candidate" 2>/dev/null | sed -n 1p | cut -d: -f1) && break
  done
  echo "lib: $name <- ${carried[$name]}${package:+ (Debian package $package)}" >>"$manifest"
done

# Check the copies resolve every carried library inside the bundle: ldd on them with no path of this
# machine's but where the CUDA libraries are (their own dependencies must then come from lib/ too).
for program in "${programs[@]}"; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    is_system "$name" && continue
    is_cuda "$name" && continue
    path=$(realpath -m "$path")
    [[ $path == "$stage/lib/"* ]] ||
      die "bin/$program: $name resolves to $path, not to the bundle's lib/ (a carried library lacks \$ORIGIN?)"
  done < <(LD_LIBRARY_PATH=$cuda_dirs ldd "$stage/bin/$program")
done

# The newest symbol versions of glibc and libstdc++ that any carried file needs.
newest() { grep -o "$1"'[0-9.]*[0-9]' "$symbols" | sort -uV | tail -n 1; }
symbols=$stage/.symbols
for file in "$stage"/bin/* "$stage"/lib/*; do objdump -T "$file"; done >"$symbols"
glibc=$(newest GLIBC_)
libstdcxx="$(newest GLIBCXX_) $(newest CXXABI_)"
rm -f "$symbols"
{
  echo "glibc: ${glibc#GLIBC_}"
  echo "libstdc++: $libstdcxx"
  echo "cuda-needed: ${cuda_needed[*]}"
  echo "cuda-dlopen: libcuda.so.1 (cudart, when a device is first used)$(
    [[ " ${programs[*]} " == *" dgemma_nccl_gpu_tests "* ]] && echo "; libnccl.so.2 (a multi-rank --backend cuda run and the NCCL tests)")"
} >>"$manifest"

# The plans gpu-check.sh runs, and the fixtures of its timing run.
compile() {
  local name=$1
  shift
  "$build/bin/dgemma-compile" --model "$model" --backend cuda "$@" -o "$stage/plans/$name" >"$stage/plans/$name.log" 2>&1 ||
    { cat "$stage/plans/$name.log" >&2; die "dgemma-compile failed for plans/$name"; }
  rm -f "$stage/plans/$name.log"
  echo "plan: $name: dgemma-compile --model models/diffusion_gemma/configs/small-20m.json --backend cuda $*" >>"$manifest"
}
compile small-20m --mode train --micro-batch 2 --prompt-len 32
compile small-20m-bf16 --mode train --micro-batch 2 --prompt-len 32 --precision bf16
compile small-20m-tp2 --mode train --micro-batch 2 --prompt-len 32 --tp 2
compile small-20m-infer --mode infer --micro-batch 4 --prompt-len 64
cp -r "$root/data/tokenizer" "$stage/fixtures/tokenizer"
grep -m 4 -v '"image' "$root/data/demo/test.jsonl" >"$stage/fixtures/prompts.jsonl"
cp "$root/scripts/gpu-check.sh" "$stage/gpu-check.sh"

# Large files are stored gzipped; gpu-check.sh --bundle unpacks them.
while IFS= read -r -d '' file; do
  if (($(stat -c %s "$file") > compress_over)); then
    gzip -9 "$file"
    echo "gzipped: ${file#"$stage"/}" >>"$manifest"
  fi
done < <(find "$stage/bin" "$stage/lib" -type f -print0)

bytes=$(du -sb "$stage" | cut -f 1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu-bundle: contents"
for dir in bin lib plans fixtures; do
  printf '  %-9s %9s  %s\n' "$dir/" "$(mib "$(du -sb "$stage/$dir" | cut -f 1)")" \
    "$(cd "$stage/$dir" && ls | tr '\n' ' ' | cut -c 1-300)"
done
echo "  needs from the machine: glibc >= ${glibc#GLIBC_}, libstdc++ with $libstdcxx, ${cuda_needed[*]} (and libcuda.so.1, libnccl.so.2 by dlopen)"
if ((bytes > limit)); then
  die "the bundle is $(mib "$bytes"), over the limit of $(mib "$limit"); nothing written to $out"
fi
rm -rf "$out"
mv "$stage" "$out"
trap - EXIT
echo "gpu-bundle: wrote $out: $(mib "$bytes") (limit $(mib "$limit"))"
