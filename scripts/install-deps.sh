#!/usr/bin/env bash
# Installs dgemma's build and test dependencies on Debian 12 (bookworm). Idempotent: when every
# package is already present it only runs `dpkg-query` and returns in well under a second.
set -euo pipefail

# MLIR is pinned to 19: installing libmlir-22 silently removes libmlir-19 and mlir-19-tools (the two
# declare Conflicts on each other), which breaks a build directory configured against 19.
# clang 19 and its compiler-rt (libFuzzer, ASan, UBSan) build the fuzz targets (scripts/fuzz.sh).
packages=(
  build-essential cmake ninja-build pkg-config python3
  libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools
  nlohmann-json3-dev libgtest-dev libgmock-dev libcli11-dev
  libopenblas-dev libgloo-dev libsentencepiece-dev libxxhash-dev libzstd-dev
  libpng-dev libjpeg-dev libstb-dev
  # gzip'd JSONL corpora for dgemma-run preprocess (runtime/data/indexed)
  zlib1g-dev
  # PCRE2: the Unicode regex of the GPT-2 BPE tokenizer's pre-tokenizer (runtime/data/text/ByteLevelBpe.cpp)
  libpcre2-dev
  clang-19 libclang-rt-19-dev
  # clang-format of the changed lines (scripts/check-format.sh, .clang-format)
  clang-format-19
  # The GPU check's bundle (scripts/gpu-bundle.sh) and its test in a bare Debian 12 root (test/bundle).
  patchelf debootstrap
  # The Python venv of the test clients (scripts/python-venv.sh, test/requirements.txt)
  python3-venv
  # Boost.Beast/Asio, header-only, for dgemma-serve's HTTP (runtime/serve/http); curl, a client its
  # tests start (test/interop/serve, test/unit/serve/http)
  libboost1.81-dev curl
  # The launcher tests (test/launchers): Open MPI's mpirun, and Slurm with munge (the srun test starts
  # its own munged, slurmctld and slurmd, so the packages' services need no setup)
  openmpi-bin slurmctld slurmd slurm-client munge
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
