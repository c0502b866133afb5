#!/usr/bin/env bash
# Prepares what bench/sim_gpu_check.sh carries to a device machine (nvcc and
# PyTorch there, none of our Debian libraries): `cohort` built here without
# CUDA or MPI, the shared libraries it needs beside it (not glibc, libstdc++
# or libgcc: the device's own serve; the binary needs glibc 2.34 and
# GLIBCXX_3.4.30), as cohort.tar.xz, and Fashion-MNIST, in
# build-simgpu-carry/ (about 45 MB; the carry limit is 64 MiB). The CUDA plugin is built there, by that machine's nvcc.
#   here:   bash bench/sim_gpu_pack.sh
#   device: run(command="bash bench/sim_gpu_check.sh", carry=["build-simgpu-carry"])
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=build-simgpu-carry
B=build-simgpu
if [[ ! -f $B/build.ninja ]]; then
  meson setup "$B" --buildtype=release -Dcuda=disabled -Dmpi=disabled > /dev/null
fi
meson compile -C "$B" cli/cohort > /dev/null
rm -rf "$CARRY" "$B/pack"
mkdir -p "$B/pack/bin" "$B/pack/lib" "$CARRY/fmnist"
cp "$B/cli/cohort" "$B/pack/bin/"
ldd "$B/cli/cohort" | awk '/=>/ {print $3}' | while read -r lib; do
  case $(basename "$lib") in
    libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | librt.so* | \
      libresolv.so* | ld-linux*) ;;
    *) cp -L "$lib" "$B/pack/lib/" ;;
  esac
done
# Compressed: OpenBLAS alone is 36 MB unpacked.
tar -C "$B/pack" -cJf "$CARRY/cohort.tar.xz" bin lib
cp "${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}"/*.gz "$CARRY/fmnist/"
du -sh "$CARRY"
