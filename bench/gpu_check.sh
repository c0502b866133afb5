#!/usr/bin/env bash
# The device check (issue 9), for a machine lent by ../.library/device: one
# H200, nvcc and PyTorch, none of our Debian libraries. In under 8 minutes:
#  1. builds train/, the `gpu` suite (train/cuda/cuda_test.cc) and
#     train_bench with g++ and nvcc alone, against the OpenBLAS,
#     googletest and zlib packages that bench/gpu_pack.sh put in
#     build-gpu-carry/ (unpacked with dpkg-deb -x, nothing installed), and
#     the CUDA plugin libcohort_cuda.so;
#  2. runs the gpu suite;
#  3. samples/s of MLP and LeNet-5 at batch 32 and 256 on the GPU, each
#     beside PyTorch eager on the same GPU (bench/torch_gpu_train.py), in
#     this one invocation.
# JSON lines and logs go to $OUT (the run tool's folder), else build-gpu/out.
#
#   here:   bash bench/gpu_pack.sh
#   device: run(command="bash bench/gpu_check.sh", carry=["build-gpu-carry"])
#
# It also runs on a machine without a GPU: the gpu suite then skips and the
# benchmark says so; that is how the script itself is checked.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=build-gpu-carry
OUT_DIR=${OUT:-build-gpu/out}
B=build-gpu
root=$PWD/$B/root
mkdir -p "$root" "$OUT_DIR" "$B/obj"
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT_DIR/gpu_check.log"; }

for deb in "$CARRY"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
lib=$root/usr/lib/x86_64-linux-gnu
blas=$lib/openblas-pthread
[[ -e $blas/libopenblas.so ]] || { echo "no OpenBLAS in $CARRY: run bench/gpu_pack.sh first" >&2; exit 1; }

source bench/cuda_plugin.sh
log "nvcc $("$NVCC" --version | tail -1); CUDA headers ${cuda_inc[*]}"

# 1. Build. Plain g++ over the sources train/ needs (no Meson, no pkg-config).
CXX=${CXX:-g++}
flags=(-std=c++20 -O3 -DNDEBUG -DCOHORT_HAVE_CUDA=1 -I. -I"$root/usr/include"
       -I"$root/usr/include/x86_64-linux-gnu/openblas-pthread")
srcs=(common/status.cc common/net_shape.cc common/rng.cc common/bytes.cc datasets/dataset.cc
      datasets/synthetic.cc datasets/idx.cc train/layout.cc train/cpu_backend.cc train/device.cc
      train/model.cc train/optimizer.cc train/trainer.cc)
objs=()
for s in "${srcs[@]}"; do objs+=("$B/obj/$(echo "$s" | tr / _).o"); done
printf '%s\n' "${srcs[@]}" | xargs -P "$(nproc)" -I{} sh -c \
  "$CXX ${flags[*]} -c {} -o $B/obj/\$(echo {} | tr / _).o"
link=(-L"$blas" -lopenblas -L"$lib" -lz -ldl -lpthread -Wl,-rpath,"$blas:$lib")
gtest=("$lib/libgtest.a" "$lib/libgtest_main.a")
"$CXX" "${flags[@]}" train/cuda/cuda_test.cc "${objs[@]}" "${gtest[@]}" "${link[@]}" -o "$B/cuda_test" &
"$CXX" "${flags[@]}" bench/train_bench.cc "${objs[@]}" "${link[@]}" -o "$B/train_bench" &
build_cuda_plugin "$B/libcohort_cuda.so" &
wait
log "built"

# 2. The gpu suite (train_test needs the config layer, hence protobuf; CI
# runs it on the CPU).
export COHORT_CUDA_PLUGIN=$PWD/$B/libcohort_cuda.so
"$B/cuda_test" 2>&1 | tee "$OUT_DIR/cuda_test.log" | tail -15
log "gpu suite done"

# 3. Speed on the GPU, interleaved with PyTorch eager on the same GPU.
export FMNIST_DIR=$PWD/$CARRY/fmnist
device=cuda:0
"$B/train_bench" --device cuda:0 --repeats 1 --model logreg > /dev/null 2>&1 || device=cpu
[[ $device == cpu ]] && log "no usable GPU: the benchmark runs on the CPU"
: > "$OUT_DIR/train_gpu.jsonl"
for batch in 32 256; do
  for model in mlp lenet5; do
    "$B/train_bench" --device "$device" --model "$model" --batch "$batch" --repeats 2 \
      >> "$OUT_DIR/train_gpu.jsonl"
    if [[ $device != cpu ]] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
      python3 bench/torch_gpu_train.py "$CARRY/peers" --model "${model%5}" --batch "$batch" \
        --repeats 2 >> "$OUT_DIR/train_gpu.jsonl"
    fi
    log "batch $batch $model"
  done
done
python3 - "$OUT_DIR/train_gpu.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| model | batch | cohort samples/s | pytorch samples/s | ratio |")
print("|---|---|---|---|---|")
for model in ("mlp", "lenet"):
    for batch in (32, 256):
        pick = lambda impl: [r["samples_per_s"] for r in rows if r["impl"] == impl
                             and r["model"].rstrip("5") == model and r["batch"] == batch]
        c, p = pick("cohort"), pick("pytorch")
        cm = statistics.median(c) if c else float("nan")
        pm = statistics.median(p) if p else float("nan")
        print(f"| {model} | {batch} | {cm:,.0f} | {pm:,.0f} | {cm / pm:.2f}x |")
PY
log "done"
