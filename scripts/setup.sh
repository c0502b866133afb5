#!/usr/bin/env bash
# Installs every Debian package Cohort needs to build, test and run its demo.
# Idempotent: installs only what is missing, so a re-run costs one dpkg query.
#   scripts/setup.sh        what `make`, `make test`, `make test-asan` and the demo need
#   scripts/setup.sh fuzz   that, plus clang and its libFuzzer runtime (`make fuzz`)
#   scripts/setup.sh container  that, plus Podman, runc and mmdebstrap (`make test-container`)
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
  python3-yaml python3-jsonschema  # tests/integration/kubernetes_test.py validates the recipes
  slurm-wlm munge  # deploy/slurm/'s sbatch recipes run in a test's own one-node Slurm
  python3-scipy  # tests/data/make_rdp_golden.py and the privacy accountant's live check
  # The cohort Python package (python/) and its tests and examples.
  python3-dev python3-numpy pybind11-dev python3-pybind11 python3-torch libtorch-dev python3-onnx
)
# `kubectl kustomize` builds the Kubernetes recipes in their test: Debian's
# kubernetes-client, unless a kubectl is already there (another package's
# /usr/bin/kubectl would conflict with it).
if ! command -v kubectl >/dev/null 2>&1; then packages+=(kubernetes-client); fi
# GCC's ASan and UBSan runtimes (`make test-asan`) come with build-essential.
for group in "$@"; do
  case $group in
    fuzz) packages+=(clang libclang-rt-14-dev) ;;
    # deploy/container's image on an mmdebstrap'd Debian 12 base; runc where
    # crun refuses hybrid cgroups.
    container) packages+=(podman runc mmdebstrap) ;;
    *) echo "setup: unknown group '$group' (known: fuzz, container)" >&2; exit 2 ;;
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
