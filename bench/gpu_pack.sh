#!/usr/bin/env bash
# Prepares what bench/gpu_check.sh carries to a device machine, which has
# nvcc and PyTorch but none of our Debian libraries: the .deb files of
# OpenBLAS, googletest and zlib (unpacked there with dpkg-deb -x, nothing
# installed), Fashion-MNIST and the peers' fmnist.py, in build-gpu-carry/ (about 45 MB; the carry
# limit is 64 MiB). Run here, then: run(command="bash bench/gpu_check.sh",
# carry=["build-gpu-carry"]).
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=build-gpu-carry
rm -rf "$CARRY"
mkdir -p "$CARRY/debs" "$CARRY/fmnist"
(cd "$CARRY/debs" && apt-get download -q \
  libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5 libquadmath0 \
  libgtest-dev zlib1g zlib1g-dev 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
cp "${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}"/*.gz "$CARRY/fmnist/"
# The peer's data loader and model definitions, for the PyTorch side (the
# device machine has no ../shared); carried, never committed.
PEERS=${PEERS:-$(cd .. && pwd)/shared/bench/peers}
mkdir -p "$CARRY/peers"
cp "$PEERS/fmnist.py" "$CARRY/peers/"
du -sh "$CARRY"
