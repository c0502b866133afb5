#!/usr/bin/env bash
# The simulator's device check (issue 11, acceptance 6), for a machine lent
# by ../.library/device: `cohort simulate` with LeNet-5 on Fashion-MNIST on
# one GPU, 100 and then 1,000 clients per round (IID, in memory), plain
# FedAvg (the secure stages are CPU work the GPU does not change), 3 rounds
# each; seconds per round (wall, median of rounds 2-3) and the GPU's peak
# memory in use (nvidia-smi, sampled every 100 ms). Under 8 minutes.
#  1. builds the CUDA plugin (libcohort_cuda.so) with this machine's nvcc;
#  2. runs the carried `cohort` (bench/sim_gpu_pack.sh) with --devices cuda:0.
# On a machine without a GPU it runs the same on the CPU and says so: that
# is how the script itself is checked. Output: $OUT (the run tool's
# folder), else build-simgpu/out.
#
#   here:   bash bench/sim_gpu_pack.sh
#   device: run(command="bash bench/sim_gpu_check.sh", carry=["build-simgpu-carry"])
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=sim_gpu_check
source bench/carried_cohort.sh

# 1. The plugin (as bench/gpu_check.sh builds it).
source bench/cuda_plugin.sh
device=cuda:0
if [[ -x $NVCC ]]; then
  build_cuda_plugin build-simgpu/libcohort_cuda.so
  export COHORT_CUDA_PLUGIN=$PWD/build-simgpu/libcohort_cuda.so
  log "plugin built ($("$NVCC" --version | tail -1))"
else
  log "no nvcc"
fi
command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 || device=cpu
[[ $device == cpu ]] && log "no usable GPU: the simulation runs on the CPU"

# 2. The runs. The config: examples/simulation.textproto with LeNet-5, an
# IID split over N clients, every client every round.
data=$PWD/$CARRY/fmnist
: > "$OUT_DIR/sim_gpu.jsonl"
for clients in 100 1000; do
  run=build-simgpu/run-$clients
  rm -rf "$run"
  sed -e "s#/usr/share/datasets/fashion-mnist#$data#" \
      -e 's#arch: "mlp"#arch: "lenet5"#' -e '/hidden: 200/d' -e '/input_dim: 784/d' \
      -e "s#clients: 100#clients: $clients#" -e 's#scheme: "dirichlet:0.5"#scheme: "iid"#' \
      -e 's#num_rounds: 10#num_rounds: 3#' -e "s#min_clients: 8 #min_clients: $((clients * 9 / 10)) #" \
      -e "s#start_clients: 100 #start_clients: $clients #" -e 's#fraction: 0.1 #fraction: 1 #' \
      -e 's#round_deadline_s: 120#round_deadline_s: 3600#' -e 's#aggregation: SECAGG_PLUS#aggregation: PLAIN#' \
      examples/simulation.textproto > "$run.textproto"
  peak=0
  if [[ $device != cpu ]]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 \
      > "$OUT_DIR/gpu_mem_$clients.txt" &
    smi=$!
  fi
  /usr/bin/time -v "$cohort" simulate --config "$run.textproto" --run-dir "$run" \
    --devices "$device" --executors 2 --json > "$OUT_DIR/sim_$clients.json" \
    2> "$OUT_DIR/sim_$clients.log" || { log "simulate failed: $(tail -3 "$OUT_DIR/sim_$clients.log")"; }
  if [[ $device != cpu ]]; then
    kill "$smi" 2> /dev/null || true
    peak=$(sort -n "$OUT_DIR/gpu_mem_$clients.txt" | tail -1)
  fi
  rss=$(awk '/Maximum resident/ {print int($6 / 1024)}' "$OUT_DIR/sim_$clients.log")
  python3 - "$OUT_DIR/sim_$clients.json" "$clients" "$device" "$peak" "$rss" >> "$OUT_DIR/sim_gpu.jsonl" <<'PY'
import json, statistics, sys
rounds = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
secs = [r["seconds"] for r in rounds if r.get("round", 0) >= 2]
print(json.dumps({"bench": "sim_gpu", "clients": int(sys.argv[2]), "device": sys.argv[3],
                  "rounds": len(rounds), "s_per_round": statistics.median(secs) if secs else None,
                  "test_acc": rounds[-1].get("test_accuracy") if rounds else None,
                  "gpu_peak_mib": int(sys.argv[4] or 0), "peak_rss_mib": int(sys.argv[5] or 0)}))
PY
  log "$(tail -1 "$OUT_DIR/sim_gpu.jsonl")"
done
log "done"
