#!/usr/bin/env bash
# The data-parallel device check (issue 10, acceptance 7), for a machine
# lent by ../.library/device, with the carry of bench/sim_gpu_pack.sh (the
# carried `cohort`, its libraries, Fashion-MNIST). One GPU means world size
# 1: it times one epoch of `cohort launch --nproc 1` (MLP and LeNet-5,
# global batch 64 and 256) with the model, gradients and optimizer on
# cuda:0, and the same on the CPU, in this one invocation; on the GPU also
# with `--collectives device`: the gradients stay on the device and NCCL
# sums them (a group of one rank: NCCL refuses two ranks on one GPU), the
# step the data-parallel mode takes between GPUs. The NCCL all-reduce's
# own check is the `gpu` suite's NcclSumsADeviceBufferInAGroupOfOne
# (bench/gpu_check.sh). On a machine
# without a GPU only the CPU rows come out, which is how the script itself
# is checked. Output: $OUT, else build-simgpu/out.
#   here:   bash bench/sim_gpu_pack.sh
#   device: run(command="bash bench/dp_gpu_check.sh", carry=["build-simgpu-carry"])
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=dp_gpu_check
source bench/carried_cohort.sh
source bench/cuda_plugin.sh
devices=(cpu)
if [[ -x $NVCC ]] && command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  build_cuda_plugin build-simgpu/libcohort_cuda.so
  export COHORT_CUDA_PLUGIN=$PWD/build-simgpu/libcohort_cuda.so
  devices=(cuda:0 cpu)
else
  log "no usable GPU: CPU rows only"
fi
data=$PWD/$CARRY/fmnist
shards=build-simgpu/dp-shards
rm -rf "$shards"
"$cohort" partition --format idx \
  --train-images "$data/train-images-idx3-ubyte.gz" --train-labels "$data/train-labels-idx1-ubyte.gz" \
  --test-images "$data/t10k-images-idx3-ubyte.gz" --test-labels "$data/t10k-labels-idx1-ubyte.gz" \
  --clients 1 --out "$shards" > /dev/null
: > "$OUT_DIR/dp_gpu.jsonl"
for model in mlp lenet5; do
  for batch in 64 256; do
    runs=("${devices[@]}")
    [[ ${devices[0]} == cuda:0 ]] && runs+=(cuda:0+nccl)
    for variant in "${runs[@]}"; do
      device=${variant%+nccl}
      collectives=auto
      [[ $variant == *+nccl ]] && collectives=device
      run=build-simgpu/dp-$model-$batch-${variant//[:+]/}
      sed -e "s#runs/dp/shards#$PWD/$shards#" -e "s#batch_size: 8 #batch_size: $batch #" \
          -e "s#epochs: 3#epochs: 1#" examples/data_parallel.textproto > "$run.textproto"
      if [[ $model == lenet5 ]]; then
        sed -i -e 's#arch: "mlp"#arch: "lenet5"#' -e '/hidden:/d' -e '/input_dim:/d' "$run.textproto"
      fi
      rm -rf "$run"
      if "$cohort" launch --nproc 1 --device "$device" --collectives "$collectives" \
          --config "$run.textproto" --run-dir "$run" > "$run.log" 2>&1; then
        grep -h "summed on the device" "$run".log "$run"/*.log 2> /dev/null | head -1 || true
        "$cohort" status --run-dir "$run" --json | tail -1 | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(json.dumps({"bench": "dp_gpu", "model": sys.argv[1], "batch": int(sys.argv[2]),
                  "device": sys.argv[3], "aggregation": d.get("aggregation"), "epoch_s": d["seconds"],
                  "samples_per_s": round(60000 / d["seconds"], 1), "test_acc": d["test_accuracy"]}))' \
          "$model" "$batch" "$variant" >> "$OUT_DIR/dp_gpu.jsonl"
        log "$(tail -1 "$OUT_DIR/dp_gpu.jsonl")"
      else
        log "$model batch $batch on $variant failed: $(tail -2 "$run.log")"
      fi
    done
  done
done
log "done"
