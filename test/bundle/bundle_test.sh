#!/usr/bin/env bash
# The GPU check's bundle is self-contained: builds it (scripts/gpu-bundle.sh), then runs its CPU half
# inside a bare Debian 12 root file system (debootstrap --variant=minbase bookworm: glibc, the GCC
# runtime and the base tools, none of this project's dependencies) with CUDA's library folder of
# this machine mounted read-only at /usr/local/cuda/lib64, as a lent GPU machine's toolkit would be:
# in_rootfs.sh checks that every library the programs load comes from the bundle, CUDA's folder or
# the system's glibc and GCC runtime, and runs dgemma-run --help, inspect, two CPU training steps of
# the bundle's small-20m plan, the GPU test binaries (their device tests skip) and
# gpu-check.sh --bundle (no GPU: it must say so and exit 0).
#   Usage: bundle_test.sh SOURCE_DIR BUILD_DIR BUNDLE_DIR ROOTFS_DIR
# The root file system is made once into ROOTFS_DIR (about 200 MB, half a minute to two minutes) and
# reused. Needs root (debootstrap, chroot and a private mount namespace for /proc and the CUDA
# folder, which therefore vanish with the test, even when it is killed) and the Debian mirror
# ($DGEMMA_DEBIAN_MIRROR, default http://deb.debian.org/debian) the first time; without them it
# exits 77, which ctest reports as skipped, with the reason.
set -euo pipefail
source_dir=$1 build=$2 bundle=$3 rootfs=$4
mirror=${DGEMMA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
here=$(cd "$(dirname "$0")" && pwd)

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }

[[ $(id -u) == 0 ]] || skip "needs root (debootstrap, chroot and mount); run ctest as root to check the bundle in a bare Debian 12"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (scripts/install-deps.sh installs it)"
unshare --mount --propagation private true 2>/dev/null ||
  skip "cannot make a private mount namespace here (unshare --mount needs CAP_SYS_ADMIN), which the bare root's /proc needs"

echo "== the bundle"
bash "$source_dir/scripts/gpu-bundle.sh" "$build" "$bundle"

# The folder of CUDA's libraries the build's dgemma-run loads; it stands in for the machine's toolkit.
read -r -a cuda_needed <<<"$(sed -n 's/^cuda-needed: //p' "$bundle/MANIFEST")"
cuda_dir=$(ldd "$build/bin/dgemma-run" | awk -v name="${cuda_needed[0]}" '$1 == name { print $3 }')
[[ -n $cuda_dir ]] || fail "the build's dgemma-run does not find ${cuda_needed[0]}"
cuda_dir=$(dirname "$(realpath "$cuda_dir")")
for soname in "${cuda_needed[@]}"; do
  [[ -e $cuda_dir/$soname ]] || fail "$soname is not in $cuda_dir with ${cuda_needed[0]}"
done

# Removes a folder of ours, never crossing into a mount below it (debootstrap mounts /proc and /sys
# in its target while it works; a killed run may leave them).
remove() {
  local mount
  for mount in $(awk -v dir="$1/" 'index($2, dir) == 1 { print $2 }' /proc/mounts | sort -r); do umount -l "$mount" || true; done
  rm -rf --one-file-system "$1"
}

if [[ ! -f $rootfs/.dgemma-rootfs-complete ]]; then
  echo "== debootstrap --variant=minbase bookworm $rootfs (once)"
  wget -q -T 20 -t 2 -O /dev/null "$mirror/dists/bookworm/Release" ||
    skip "debootstrap cannot reach the Debian mirror $mirror (set DGEMMA_DEBIAN_MIRROR to another)"
  remove "$rootfs.partial"
  start=$SECONDS
  if ! debootstrap --variant=minbase bookworm "$rootfs.partial" "$mirror" >"$rootfs.log" 2>&1; then
    tail -n 20 "$rootfs.log"
    remove "$rootfs.partial"
    fail "debootstrap failed (the log: $rootfs.log)"
  fi
  touch "$rootfs.partial/.dgemma-rootfs-complete"
  remove "$rootfs"
  mv "$rootfs.partial" "$rootfs"
  echo "made in $((SECONDS - start)) s"
fi

echo "== the bundle's CPU half in the bare root"
remove "$rootfs/opt/gpu-bundle"
mkdir -p "$rootfs/opt" "$rootfs/usr/local/cuda/lib64"
cp -r "$bundle" "$rootfs/opt/gpu-bundle"
cp "$here/in_rootfs.sh" "$rootfs/opt/in_rootfs.sh"
# In a private mount namespace: the mounts exist only for this command and end with it.
unshare --mount --propagation private /bin/bash -c '
  set -e
  rootfs=$1 cuda_dir=$2
  mount -t proc proc "$rootfs/proc"
  mount --bind "$cuda_dir" "$rootfs/usr/local/cuda/lib64"
  mount -o remount,bind,ro "$rootfs/usr/local/cuda/lib64"
  exec chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    /bin/bash /opt/in_rootfs.sh /opt/gpu-bundle' _ "$rootfs" "$cuda_dir"
