#!/usr/bin/env bash
# Installs every Debian package Cohort needs to build, test and run its demo.
# Idempotent: installs only what is missing, so a re-run costs one dpkg query.
#   scripts/setup.sh        what `make`, `make test`, `make test-asan` and the demo need
#   scripts/setup.sh fuzz   that, plus clang and its libFuzzer runtime (`make fuzz`)
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config
  libzmq3-dev cppzmq-dev libsodium-dev libssl-dev
  libprotobuf-dev protobuf-compiler
  libsqlite3-dev libgtest-dev libcli11-dev libspdlog-dev
  libopenblas-dev zlib1g-dev libzip-dev libarchive-dev libonnx-dev prometheus prometheus-cpp-dev
  openmpi-bin libopenmpi-dev
  dataset-fashion-mnist
  chromium  # `cohort report`'s test renders the page in headless Chromium
  systemd   # systemd-analyze checks the units `cohort provision` writes
  curl      # bench/observability_cost.sh reads Prometheus's query API
  python3-scipy  # tests/data/make_rdp_golden.py and the privacy accountant's live check
  # The cohort Python package (python/) and its tests and examples.
  python3-dev python3-numpy pybind11-dev python3-pybind11 python3-torch libtorch-dev python3-onnx
)
# GCC's ASan and UBSan runtimes (`make test-asan`) come with build-essential.
for group in "$@"; do
  case $group in
    fuzz) packages+=(clang libclang-rt-14-dev) ;;
    *) echo "setup: unknown group '$group' (known: fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
