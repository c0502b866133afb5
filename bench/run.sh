#!/usr/bin/env bash
# Cohort's benchmarks, with the peer baselines run in the same invocation
# (this machine is noisy: only same-invocation ratios mean anything).
#
#   bash bench/run.sh [train,round,fedavg,fedavg-lenet,...]   (default: train,round)
#
# train : 1-epoch Fashion-MNIST training, MLP 784-200-200-10, logreg and
#         LeNet-5, batch 32, 1 thread; cohort vs
#         ../shared/bench/peers/train_torch.py, interleaved, REPEATS rounds of
#         each (default 3).
# round : the coordinator's own time per round (no client training),
#         10 and 100 clients.
# fedavg: final test accuracy of the 10-client FedAvg run (make demo's
#         settings) vs fedavg_torch.py, IID and dirichlet:0.5, SEEDS (0..4).
# allreduce: float32 all-reduce across 2 and 4 processes, 4 KiB to 64 MiB
#         (build/bench/allreduce_bench over shared memory, plain TCP with
#         and without authentication, ZeroMQ CURVE (encrypted) and plaintext
#         ZeroMQ tcp://) beside
#         allreduce_gloo.py and allreduce_mpi.c (Open MPI, shared memory),
#         same method, same invocation; memcpy as the ceiling. PIN_ALL=1:
#         Cohort's shm ranks and Open MPI's both bound to a core each even
#         when they outnumber the cores. REPS=N (default 3): every
#         implementation runs N times, interleaved with the others, and each
#         cell is the median of its N runs (this machine is noisy).
# simulate: cohort simulate on Fashion-MNIST split IID over 10, 100 and
#         1,000 clients, MLP, all clients every round, 3 rounds (PLAIN, 2
#         executors; 100 clients also with 1 executor and with SECAGG_PLUS)
#         beside fedavg_torch.py --clients 100 (one thread), same invocation.
# dp    : data-parallel Fashion-MNIST, MLP 784-200-200-10, 1 epoch, global
#         batch 64 split over 1, 2 and 4 local workers (cohort launch) beside
#         PyTorch DDP over Gloo (bench/ddp_torch.py), same invocation.
# fedavg-lenet: MODEL=lenet5 make demo (SecAgg+) on the peer's own
#         Dirichlet(0.5) split vs fedavg_torch.py --model lenet, LENET_SEEDS
#         (default 0).
# secagg: secure-aggregation compute (client, server) for n = 100/500/1000,
#         m = 100K/1M, dropout 0/10/30 %, complete and SecAgg+ graphs; no peer
#         runs here: compare with Bonawitz et al. 2017's published figures.
#         Configurations estimated above SECAGG_MAX_S (default 120 s) are skipped.
# secagg-learn: make demo's 10-client Fashion-MNIST run with PLAIN and with
#         SECAGG_PLUS aggregation (AGGS to pick), same split and seed, SEEDS (0..4).
# secagg-round: end-to-end round time (tasks sent to commit) of 100 client
#         processes on this machine, MLP 784-1024-192-10 (1.0M parameters),
#         PLAIN vs SECAGG_PLUS (AGGS to pick), ROUNDS_E2E rounds each
#         (default 4; the first, which warms up, is left out), run
#         E2E_REPS times (default 3) in turn, plain first in odd runs and
#         secure first in even ones; the ratio is of the medians, and each
#         pair's ratio is printed too, with a 95 % interval for the median
#         pair ratio from 6 pairs on.
#         MASK_PRG=CHACHA20 for ChaCha20 masks.
#         E2E_COHORT runs another build's cohort; E2E_COORD_FLAGS and
#         E2E_CLIENT_FLAGS add flags; E2E_TAG names the runs in the JSON
#         (bench/observability_cost.sh uses them).
# sites : hierarchical mode: make demo's Fashion-MNIST split into 4 shards
#         (SCHEME, default iid), 4 clients vs 2 sites of 2 (a client and a
#         site worker each), SecAgg+ between the clients/sites, SEEDS.
# JSON lines go to $OUT (default ${TMPDIR:-/tmp}/cohort-bench); a summary
# table is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

WHAT=${1:-train,round}
has() { [[ ",$WHAT," == *",$1,"* ]]; }
OUT=${OUT:-${TMPDIR:-/tmp}/cohort-bench}
PEERS=${PEERS:-$(cd .. && pwd)/shared/bench/peers}
REPEATS=${REPEATS:-3}
SEEDS=${SEEDS:-0 1 2 3 4}
PY=/usr/bin/python3   # Debian's, with python3-torch; not the one first on PATH.
mkdir -p "$OUT"
have_peers=0
if [[ -d $PEERS ]] && $PY -c "import torch" 2>/dev/null; then have_peers=1; else
  echo "note: $PEERS or Debian's python3-torch missing: running cohort only" >&2
fi

if has train; then
  : > "$OUT/train.jsonl"
  for ((r = 0; r < REPEATS; r++)); do
    if ((have_peers)); then
      (cd "$PEERS" && $PY train_torch.py --model mlp,logreg,lenet --threads 1 --repeats 1 \
        --seed "$r") | grep '"bench": "train"' >> "$OUT/train.jsonl" || true
    fi
    for model in mlp logreg lenet5; do
      OPENBLAS_NUM_THREADS=1 build/bench/train_bench --model "$model" --repeats 1 --seed "$r" \
        >> "$OUT/train.jsonl"
    done
    # The client's progress bar, redrawn as often as it ever is: "progress":"bar"
    # against the line above ("off"), same model, same seed (issue 31: under 1 %).
    OPENBLAS_NUM_THREADS=1 build/bench/train_bench --model mlp --repeats 1 --seed "$r" \
      --progress bar >> "$OUT/train.jsonl"
  done
fi

if has round; then
  : > "$OUT/round.jsonl"
  for n in 10 100; do build/bench/round_bench --clients "$n" --rounds 7 >> "$OUT/round.jsonl"; done
fi

if has fedavg; then
  : > "$OUT/fedavg.jsonl"
  for seed in $SEEDS; do
    for scheme in iid dirichlet:0.5; do
      part=${scheme%%:*}
      # impl "cohort": Cohort's own partitioner; "cohort-same-split": the
      # peer's exact numpy split, read through `cohort partition --assignment`.
      for impl in cohort cohort-same-split; do
        run_dir="$OUT/fedavg-$impl-$part-$seed"
        assignment=""
        if [[ $impl == cohort-same-split ]]; then
          ((have_peers)) || continue
          assignment="$OUT/split-$part-$seed.txt"
          $PY bench/peer_partition.py "$PEERS" "$part" "$seed" "$assignment"
        fi
        AGGREGATION=PLAIN SEED=$seed SCHEME=$scheme ASSIGNMENT=$assignment RUN_DIR=$run_dir \
          bash scripts/demo.sh > "$run_dir.log" 2>&1
        acc=$(build/cli/cohort status --run-dir "$run_dir" --json | tail -1 |
              $PY -c 'import json,sys; print(json.load(sys.stdin)["test_accuracy"])')
        echo "{\"bench\":\"fedavg_final\",\"impl\":\"$impl\",\"partition\":\"$part\",\"seed\":$seed,\"final_test_acc\":$acc}" >> "$OUT/fedavg.jsonl"
      done
    done
    if ((have_peers)); then
      (cd "$PEERS" && $PY fedavg_torch.py --partition iid,dirichlet --seed "$seed") |
        grep fedavg_summary | $PY -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(json.dumps({"bench": "fedavg_final", "impl": "pytorch", "partition": d["partition"],
                      "seed": int(sys.argv[1]), "final_test_acc": d["final_test_acc"]}))' "$seed" \
        >> "$OUT/fedavg.jsonl"
    fi
  done
fi

if has allreduce; then
  : > "$OUT/allreduce.jsonl"
  mpi_bin=""
  if ((have_peers)) && command -v mpicc > /dev/null; then
    mpi_bin="$OUT/allreduce_mpi"
    mpicc -O2 -o "$mpi_bin" "$PEERS/allreduce_mpi.c"
    "$mpi_bin" --memcpy | grep '^{' >> "$OUT/allreduce.jsonl" || true
  fi
  for rep in $(seq "${REPS:-3}"); do
    for world in 2 4; do
      for transport in shm tcp tcp-auth curve zmq; do
        # Shared memory is pinned like Open MPI's ranks (mpirun binds each to
        # a core unless they outnumber the cores); the TCP runs are not, like
        # Gloo's.
        pin=(); [[ $transport == shm ]] && pin=(--pin)
        [[ $transport == shm && -n ${PIN_ALL:-} ]] && pin=(--pin-all)
        build/bench/allreduce_bench --world "$world" --transport "$transport" "${pin[@]}" \
          >> "$OUT/allreduce.jsonl"
      done
      if ((have_peers)); then
        (cd "$PEERS" && $PY allreduce_gloo.py "$world") | grep '^{' >> "$OUT/allreduce.jsonl" || true
        if [[ -n $mpi_bin ]]; then
          # PIN_ALL=1: both bind every rank to a core even when the ranks
          # outnumber the cores (same policy for both).
          mpirun --allow-run-as-root --oversubscribe ${PIN_ALL:+--bind-to core:overload-allowed} \
            --mca pml ob1 --mca btl self,vader \
            --mca oob_tcp_if_include lo -np "$world" "$mpi_bin" | grep '^{' \
            >> "$OUT/allreduce.jsonl" || true
        fi
      fi
    done
  done
fi

if has simulate; then
  : > "$OUT/simulate.jsonl"
  DATA=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
  # One simulated run: $1 clients (the 60,000 samples split IID), $2
  # aggregation, $3 executors; 3 rounds, every client every round.
  sim_run() {
    local clients=$1 agg=$2 executors=$3 shards="$OUT/sim-shards-$1"
    if [[ ! -f $shards/test.shard ]]; then
      build/cli/cohort partition --format idx \
        --train-images "$DATA/train-images-idx3-ubyte.gz" --train-labels "$DATA/train-labels-idx1-ubyte.gz" \
        --test-images "$DATA/t10k-images-idx3-ubyte.gz" --test-labels "$DATA/t10k-labels-idx1-ubyte.gz" \
        --clients "$clients" --scheme iid --seed 0 --out "$shards" > /dev/null
    fi
    local run="$OUT/sim-run-$clients-$agg-$executors"
    sed -e "s#runs/demo/shards/test.shard#$shards/test.shard#" \
        -e "s#start_clients: 10 #start_clients: $clients #" \
        -e "s#min_clients: 8 #min_clients: $((clients * 8 / 10)) #" \
        -e "s#aggregation: SECAGG_PLUS#aggregation: $agg#" examples/federated.textproto > "$run.textproto"
    rm -rf "$run"
    /usr/bin/time -f "%M" -o "$run.rss" build/cli/cohort simulate --config "$run.textproto" \
      --run-dir "$run" --shards "$shards" --executors "$executors" --rounds 3 > /dev/null 2>&1
    build/cli/cohort status --run-dir "$run" --json | $PY -c '
import json, sys
rounds = [json.loads(l) for l in sys.stdin if l.strip()]
secs = sorted(r["seconds"] for r in rounds[1:])
print(json.dumps({"bench": "simulate", "impl": "cohort", "clients": int(sys.argv[1]),
                  "aggregation": sys.argv[2], "executors": int(sys.argv[3]),
                  "round_s": secs[len(secs) // 2], "test_acc": rounds[-1]["test_accuracy"],
                  "peak_rss_mb": int(open(sys.argv[4]).read().split()[-1]) // 1024}))' \
      "$clients" "$agg" "$executors" "$run.rss" >> "$OUT/simulate.jsonl"
  }
  for clients in 10 100 1000; do sim_run "$clients" PLAIN 2; done
  sim_run 100 PLAIN 1
  for clients in 10 100; do sim_run "$clients" SECAGG_PLUS 2; done
  if ((have_peers)); then
    (cd "$PEERS" && $PY fedavg_torch.py --partition iid --clients 100 --rounds 3 --threads 1) |
      grep '"fedavg_summary"' >> "$OUT/simulate.jsonl" || true
  fi
fi

if has dp; then
  : > "$OUT/dp.jsonl"
  DATA=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
  rm -rf "$OUT/dp-shards"
  build/cli/cohort partition --format idx \
    --train-images "$DATA/train-images-idx3-ubyte.gz" --train-labels "$DATA/train-labels-idx1-ubyte.gz" \
    --test-images "$DATA/t10k-images-idx3-ubyte.gz" --test-labels "$DATA/t10k-labels-idx1-ubyte.gz" \
    --clients 1 --out "$OUT/dp-shards" > /dev/null
  # One launch: $1 impl name, $2 workers, $3 local_sgd_steps, then launch flags.
  dp_run() {
    local impl=$1 world=$2 local_steps=$3; shift 3
    sed -e "s#runs/dp/shards#$OUT/dp-shards#" -e "s#batch_size: 8 #batch_size: $((64 / world)) #" \
        -e "s#epochs: 3#epochs: 1#" -e "s#local_sgd_steps: 0#local_sgd_steps: $local_steps#" \
        examples/data_parallel.textproto \
        > "$OUT/dp-$impl-$world.textproto"
    rm -rf "$OUT/dp-run-$impl-$world"
    build/cli/cohort launch --nproc "$world" --config "$OUT/dp-$impl-$world.textproto" \
      --run-dir "$OUT/dp-run-$impl-$world" "$@" > /dev/null 2>&1
    build/cli/cohort status --run-dir "$OUT/dp-run-$impl-$world" --json | tail -1 | $PY -c '
import json, sys
d = json.load(sys.stdin)
print(json.dumps({"bench": "dp", "impl": sys.argv[2], "world": int(sys.argv[1]), "global_batch": 64,
                  "epoch_s": d["seconds"], "samples_per_s": round(60000 / d["seconds"], 1),
                  "test_acc": d["test_accuracy"]}))' "$world" "$impl" >> "$OUT/dp.jsonl"
  }
  for world in 1 2 4; do
    dp_run cohort "$world" 0
    if ((world > 1)); then
      # Over TCP on loopback, and local SGD averaging every 8 steps.
      dp_run cohort-tcp "$world" 0 --transport tcp
      dp_run cohort-local8 "$world" 8
    fi
    if ((have_peers)); then
      $PY bench/ddp_torch.py "$PEERS" --world "$world" --global-batch 64 | grep '^{' \
        >> "$OUT/dp.jsonl" || true
    fi
  done
fi

# fedavg-lenet: `MODEL=lenet5 make demo` (10 clients, SecAgg+) on the peer's
# own Dirichlet(0.5) split at each seed, vs fedavg_torch.py --model lenet.
if has fedavg-lenet; then
  : > "$OUT/fedavg-lenet.jsonl"
  for seed in ${LENET_SEEDS:-0}; do
    run_dir="$OUT/fedavg-lenet-$seed"
    assignment=""
    if ((have_peers)); then
      assignment="$OUT/split-dirichlet-$seed.txt"
      $PY bench/peer_partition.py "$PEERS" dirichlet "$seed" "$assignment"
    fi
    MODEL=lenet5 SEED=$seed SCHEME=dirichlet:0.5 ASSIGNMENT=$assignment RUN_DIR=$run_dir \
      bash scripts/demo.sh > "$run_dir.log" 2>&1
    build/cli/cohort status --run-dir "$run_dir" --json | tail -1 | $PY -c '
import json, sys
d = json.load(sys.stdin)
print(json.dumps({"bench": "fedavg_lenet", "impl": "cohort", "seed": int(sys.argv[1]),
                  "final_test_acc": d["test_accuracy"], "round_s": d["seconds"]}))' "$seed" \
      >> "$OUT/fedavg-lenet.jsonl"
    if ((have_peers)); then
      (cd "$PEERS" && PEER_WATCHDOG_S=${PEER_WATCHDOG_S:-1500} $PY fedavg_torch.py --model lenet \
        --partition dirichlet --seed "$seed") | grep fedavg_summary | $PY -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(json.dumps({"bench": "fedavg_lenet", "impl": "pytorch", "seed": int(sys.argv[1]),
                      "final_test_acc": d["final_test_acc"]}))' "$seed" >> "$OUT/fedavg-lenet.jsonl"
    fi
  done
fi

if has secagg; then
  : > "$OUT/secagg.jsonl"
  # Records a configuration that did not run, and why.
  skip_secagg() {
    echo "{\"bench\":\"secagg\",\"graph\":\"$graph\",\"n\":$n,\"m\":$m,\"dropout\":$d,\"skipped\":\"$1\"}" \
      >> "$OUT/secagg.jsonl"
  }
  for n in 100 500 1000; do
    for m in 100000 1000000; do
      for graph in complete secagg+; do
        for d in 0 0.1 0.3; do
          # Rough cost model (2 cores): set-up ~ n*k*100us, server masks
          # ~ dropped*k*m*4 bytes at ~16 GB/s (AES-256-CTR, VAES, 2 cores).
          # Skip what would not finish.
          k=200
          [[ $graph == complete || $n -le 200 ]] && k=$n
          est=$($PY -c "n,m,k,d=$n,$m,$k,$d; print(int(n*k*1e-4 + d*n*k*(1-d)*m*4/16e9))")
          if (( est > ${SECAGG_MAX_S:-120} )); then
            skip_secagg "estimated ${est} s"
            continue
          fi
          timeout 600 build/bench/secagg_bench --n "$n" --m "$m" --dropout "$d" --graph "$graph" \
            >> "$OUT/secagg.jsonl" || skip_secagg "timeout"
        done
      done
    done
  done
fi

if has secagg-learn; then
  : > "$OUT/secagg_learn.jsonl"
  for seed in $SEEDS; do
    for agg in ${AGGS:-PLAIN SECAGG_PLUS}; do
      run_dir="$OUT/learn-$agg-$seed"
      AGGREGATION=$agg SEED=$seed RUN_DIR=$run_dir bash scripts/demo.sh > "$run_dir.log" 2>&1
      build/cli/cohort status --run-dir "$run_dir" --json | tail -1 | $PY -c '
import json, sys
d = json.load(sys.stdin)
print(json.dumps({"bench": "secagg_learn", "aggregation": d["aggregation"], "seed": int(sys.argv[1]),
                  "final_test_acc": d["test_accuracy"]}))' "$seed" >> "$OUT/secagg_learn.jsonl"
    done
  done
fi

if has sites; then
  : > "$OUT/sites.jsonl"
  for seed in $SEEDS; do
    for w in 1 2; do
      run_dir="$OUT/sites-$w-$seed"
      # Two sites aggregate securely only when neither assumes the other
      # colludes with the coordinator (corrupt fraction 0).
      corrupt=""; ((w > 1)) && corrupt=0
      CORRUPT=$corrupt CLIENTS=4 SITE_SIZE=$w SCHEME=${SCHEME:-iid} SEED=$seed RUN_DIR=$run_dir \
        bash scripts/demo.sh > "$run_dir.log" 2>&1
      build/cli/cohort status --run-dir "$run_dir" --json | tail -1 | $PY -c '
import json, sys
d = json.load(sys.stdin)
print(json.dumps({"bench": "sites", "site_size": int(sys.argv[1]), "seed": int(sys.argv[2]),
                  "participants": d["participants"], "final_test_acc": d["test_accuracy"]}))' \
        "$w" "$seed" >> "$OUT/sites.jsonl"
    done
  done
fi

if has secagg-round; then
  : > "$OUT/secagg_round.jsonl"
  dir="$OUT/e2e"
  rm -rf "$dir" && mkdir -p "$dir"
  E2E_COHORT=${E2E_COHORT:-build/cli/cohort}
  build/cli/cohort partition --format synthetic --samples 2000 --test-samples 1000 --features 784 \
    --classes 10 --clients 100 --seed 1 --out "$dir/shards" > /dev/null
  for rep in $(seq "${E2E_REPS:-3}"); do
    # Odd runs go plain first, even runs secure first: neither side of a
    # pair always runs on the machine as the other left it.
    order=(${AGGS:-PLAIN SECAGG_PLUS})
    (( rep % 2 == 0 )) && order=($(printf '%s\n' "${order[@]}" | tac))
    for agg in "${order[@]}"; do
      cat > "$dir/$agg.textproto" <<EOF
seed: 1
data { test_shard: "$dir/shards/test.shard" }
model { arch: "mlp" input_dim: 784 num_classes: 10 hidden: 1024 hidden: 192 }
train { batch_size: 20 learning_rate: 0.05 }
rounds { num_rounds: ${ROUNDS_E2E:-4} min_clients: 100 start_clients: 100 round_deadline_s: 600 client_timeout_s: 300 }
net { heartbeat_s: 2 }
secagg { aggregation: $agg stage_timeout_s: 300 ${MASK_PRG:+mask_prg: $MASK_PRG} }
EOF
      rm -rf "$dir/run-$agg"
      $E2E_COHORT ${COORD_LOG:+--log-level $COORD_LOG} coordinator --config "$dir/$agg.textproto" --run-dir "$dir/run-$agg" \
        --bind tcp://127.0.0.1:0 --insecure $E2E_COORD_FLAGS > "$dir/$agg.out" 2> "$dir/$agg.log" &
      coordinator=$!
      for _ in $(seq $((${E2E_START_S:-30} * 10))); do  # E2E_START_S: its start's limit
        [[ -s "$dir/run-$agg/coordinator.endpoint" ]] && break
        sleep 0.1
      done
      endpoint=$(cat "$dir/run-$agg/coordinator.endpoint")
      clients=()
      for ((k = 0; k < 100; k++)); do
        OPENBLAS_NUM_THREADS=1 $E2E_COHORT client --coordinator "$endpoint" --insecure $E2E_CLIENT_FLAGS \
          --data "$dir/shards/$(printf client-%03d $k).shard" 2> /dev/null > /dev/null &
        clients+=("$!")
      done
      wait "$coordinator"
      for pid in "${clients[@]}"; do wait "$pid" || true; done
      $E2E_COHORT status --run-dir "$dir/run-$agg" --json | $PY -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin]
later = rows[1:] or rows
print(json.dumps({"bench": "secagg_round", "aggregation": rows[0]["aggregation"], "clients": 100,
                  "params": 1002570, "rounds": len(rows), "rep": int(sys.argv[1]),
                  "median_round_s": statistics.median(r["seconds"] for r in later),
                  "median_coordinator_s": statistics.median(r["coordinator_seconds"] for r in later),
                  "final_test_acc": rows[-1]["test_accuracy"], "tag": sys.argv[2]}))' \
        "$rep" "${E2E_TAG:-}" >> "$OUT/secagg_round.jsonl"
    done
  done
fi

$PY - "$OUT" "$WHAT" <<'PY'
import json, math, os, statistics, sys
out, what = sys.argv[1], sys.argv[2].split(",")
def load(name):
    path = os.path.join(out, name)
    return [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
if "train" in what:
    rows = [r for r in load("train.jsonl") if "samples_per_s" in r and r.get("threads", 1) == 1]
    print("\n### Training, 1 epoch, batch 32, 1 thread (median samples/s)\n")
    print("| model | cohort | pytorch | ratio | cohort acc | pytorch acc |")
    print("|---|---|---|---|---|---|")
    for model in ("mlp", "logreg", "lenet"):
        # Cohort's preset is lenet5; the peer calls the same net lenet.
        c = [r for r in rows if r.get("impl") == "cohort" and r["model"].rstrip("5") == model]
        p = [r for r in rows if r.get("impl", "pytorch") == "pytorch" and r["model"] == model]
        med = lambda rs, k: statistics.median(r[k] for r in rs) if rs else float("nan")
        cs, ps = med(c, "samples_per_s"), med(p, "samples_per_s")
        print(f"| {model} | {cs:,.0f} | {ps:,.0f} | {cs / ps:.2f}x | {med(c, 'test_acc'):.4f} | {med(p, 'test_acc'):.4f} |")
if "dp" in what:
    rows = load("dp.jsonl")
    print("\n### Data-parallel, MLP, global batch 64, 1 epoch (samples/s)\n")
    print("| workers | cohort | scaling | torch DDP (gloo) | ratio | cohort acc | DDP acc |")
    print("|---|---|---|---|---|---|---|")
    base = [r["samples_per_s"] for r in rows if r["impl"] == "cohort" and r["world"] == 1]
    for world in (1, 2, 4):
        c = [r for r in rows if r["impl"] == "cohort" and r["world"] == world]
        p = [r for r in rows if not r["impl"].startswith("cohort") and r["world"] == world]
        if not c:
            continue
        cs = c[0]["samples_per_s"]
        ps = p[0]["samples_per_s"] if p else float("nan")
        eff = cs / (base[0] * world) if base else float("nan")
        pa = p[0]["test_acc"] if p else float("nan")
        print(f"| {world} | {cs:,.0f} | {eff:.2f} | {ps:,.0f} | {cs / ps:.2f}x | {c[0]['test_acc']:.4f} | {pa:.4f} |")
    print("\n| workers | transport / mode | cohort samples/s | test acc |")
    print("|---|---|---|---|")
    names = {"cohort": "shared memory", "cohort-tcp": "tcp (loopback)",
             "cohort-local8": "shared memory, local SGD every 8 steps"}
    for world in (2, 4):
        for impl, label in names.items():
            for r in rows:
                if r["impl"] == impl and r["world"] == world:
                    print(f"| {world} | {label} | {r['samples_per_s']:,.0f} | {r['test_acc']:.4f} |")
if "simulate" in what:
    rows = load("simulate.jsonl")
    print("\n### cohort simulate, Fashion-MNIST IID, MLP, 1 local epoch, all clients every round\n")
    print("| clients | aggregation | executors | s / round (median, rounds 2-3) | test acc after 3 | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r.get("bench") == "simulate":
            print(f"| {r['clients']} | {r['aggregation']} | {r['executors']} | {r['round_s']:.2f} | {r['test_acc']:.4f} | {r['peak_rss_mb']} |")
    for r in rows:
        if r.get("bench") == "fedavg_summary":
            print(f"\nfedavg_torch.py, 100 clients, 1 thread: {r['round_s_median']:.2f} s / round, test acc {r['final_test_acc']:.4f}")
if "allreduce" in what:
    rows = load("allreduce.jsonl")
    print("\n### All-reduce, float32, processes on this host (median; busbw GB/s, latency)\n")
    impls = sorted({r["impl"] for r in rows if r.get("bench") == "allreduce"})
    # One row per implementation, world and size: the median of its runs
    # (REPS), by time.
    def cell(impl, world, nbytes):
        m = sorted((r for r in rows if r.get("impl") == impl and r.get("world") == world
                    and r.get("bytes") == nbytes), key=lambda r: r["median_s"])
        return m[(len(m) - 1) // 2] if m else None
    reps = max((sum(1 for r in rows if r.get("impl") == i and r.get("world") == 2
                    and r.get("bytes") == 4096) for i in impls), default=0)
    print(f"Each cell: the median of {reps} runs, interleaved.\n")
    print("| world | bytes | " + " | ".join(impls) + " |")
    print("|---|---|" + "---|" * len(impls))
    for world in (2, 4):
        for nbytes in (4096, 1 << 20, 16 << 20, 64 << 20):
            cells = []
            for impl in impls:
                m = cell(impl, world, nbytes)
                if not m:
                    cells.append("")
                elif nbytes == 4096:
                    cells.append(f"{m['median_s'] * 1e6:.0f} us")
                else:
                    cells.append(f"{m['busbw_GBps']:.2f}")
            print(f"| {world} | {nbytes} | " + " | ".join(cells) + " |")
    # Each implementation against its peer in this invocation: > 1 is faster
    # (latency ratio peer/ours at 4 KiB, bandwidth ratio ours/peer above).
    mpi = next((i for i in impls if "mpi" in i), None)
    pairs = [(i, "torch-gloo") for i in ("cohort-tcp", "cohort-tcp-auth", "cohort-curve", "cohort-zmq")
             if i in impls] + ([("cohort-shm", mpi)] if mpi else [])
    if pairs and "torch-gloo" in impls:
        print("\n| world | bytes | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |")
        print("|---|---|" + "---|" * len(pairs))
        for world in (2, 4):
            for nbytes in (4096, 1 << 20, 16 << 20, 64 << 20):
                cells = []
                for a, b in pairs:
                    x, y = cell(a, world, nbytes), cell(b, world, nbytes)
                    if not x or not y:
                        cells.append("")
                    elif nbytes == 4096:
                        cells.append(f"{y['median_s'] / x['median_s']:.2f}x")
                    else:
                        cells.append(f"{x['busbw_GBps'] / y['busbw_GBps']:.2f}x")
                print(f"| {world} | {nbytes} | " + " | ".join(cells) + " |")
    if mpi and reps > 1:
        # The runs one by one (the k-th of each implementation against the
        # k-th of its peer): how far a single run strays from the median.
        print(f"\ncohort-shm / {mpi}, run by run:\n")
        print("| world | bytes | ratios |")
        print("|---|---|---|")
        for world in (2, 4):
            for nbytes in (4096, 1 << 20, 16 << 20, 64 << 20):
                pick = lambda impl: [r for r in rows if r.get("impl") == impl
                                     and r.get("world") == world and r.get("bytes") == nbytes]
                ratios = [y["median_s"] / x["median_s"]
                          for x, y in zip(pick("cohort-shm"), pick(mpi))]
                print(f"| {world} | {nbytes} | " + ", ".join(f"{q:.2f}x" for q in ratios) + " |")
    for r in rows:
        if "copy_GBps" in r:
            print(f"\nmemcpy (1 core, 64 MiB): {r['copy_GBps']:.2f} GB/s")
if "fedavg-lenet" in what:
    rows = load("fedavg-lenet.jsonl")
    print("\n### FedAvg with LeNet-5, 10 clients, Dirichlet(0.5) (peer's split), 10 rounds\n")
    print("| seed | cohort (SecAgg+) | pytorch | difference (points) |")
    print("|---|---|---|---|")
    for seed in sorted({r["seed"] for r in rows}):
        c = [r["final_test_acc"] for r in rows if r["seed"] == seed and r["impl"] == "cohort"]
        p = [r["final_test_acc"] for r in rows if r["seed"] == seed and r["impl"] == "pytorch"]
        if c and p:
            print(f"| {seed} | {c[0]:.4f} | {p[0]:.4f} | {100 * (c[0] - p[0]):+.2f} |")
if "round" in what:
    print("\n### Coordinator time per round (everything but client training)\n")
    print("| clients | params | median s | aggregate+eval+commit s |")
    print("|---|---|---|---|")
    for r in load("round.jsonl"):
        print(f"| {r['clients']} | {r['params']:,} | {r['median_s']:.3f} | {r['aggregate_eval_commit_median_s']:.3f} |")
if "secagg-learn" in what:
    rows = load("secagg_learn.jsonl")
    print("\n### Final test accuracy with and without secure aggregation (make demo, 10 clients)\n")
    print("| seed | plain | secagg+ | difference (points) |")
    print("|---|---|---|---|")
    acc = lambda a, s: next((r["final_test_acc"] for r in rows if r["aggregation"] == a and r["seed"] == s), float("nan"))
    for s in sorted({r["seed"] for r in rows}):
        print(f"| {s} | {acc('plain', s):.4f} | {acc('secagg+', s):.4f} | {100 * (acc('secagg+', s) - acc('plain', s)):+.2f} |")
if "secagg-round" in what:
    rows = load("secagg_round.jsonl")
    by = {a: [r for r in rows if r["aggregation"] == a] for a in ("plain", "secagg+")}
    print("\n### End-to-end round time, 100 client processes, 1.0M parameters\n")
    print("| aggregation | runs | median round s | each run | coordinator s | final acc |")
    print("|---|---|---|---|---|---|")
    med = {}
    for a, rs in by.items():
        if not rs:
            continue
        med[a] = statistics.median(r["median_round_s"] for r in rs)
        each = ", ".join(f"{r['median_round_s']:.2f}" for r in rs)
        coord = statistics.median(r["median_coordinator_s"] for r in rs)
        print(f"| {a} | {len(rs)} | {med[a]:.2f} | {each} | {coord:.2f} | {rs[-1]['final_test_acc']:.4f} |")
    if len(med) == 2:
        pairs = {}
        for r in rows:
            pairs.setdefault(r.get("rep", 1), {})[r["aggregation"]] = r["median_round_s"]
        each = [p["secagg+"] / p["plain"] for p in pairs.values() if len(p) == 2]
        print(f"\nratio secagg+/plain: {med['secagg+'] / med['plain']:.2f}x (of the medians); "
              f"run by run: {', '.join(f'{x:.2f}' for x in each)}")
        # A distribution-free interval for the median pair ratio: the pairs
        # are independent (each starts its own processes; the machine's
        # drift over the invocation aside), so the number below the true
        # median is Binomial(N, 1/2), and the order statistics x(j),
        # x(N+1-j) cover it with probability >= 95 %.
        xs, n = sorted(each), len(each)
        cdf = lambda j: sum(math.comb(n, i) for i in range(j)) / 2**n  # P[B < j]
        j = max((j for j in range(1, n // 2 + 1) if cdf(j) <= 0.025), default=0)
        if j:
            cover = 1 - 2 * cdf(j)
            print(f"median pair ratio {statistics.median(xs):.2f}x, {100 * cover:.1f} % interval "
                  f"[{xs[j - 1]:.2f}, {xs[n - j]:.2f}] ({n} pairs)")
        else:
            print(f"median pair ratio {statistics.median(xs):.2f}x ({n} pairs: 6 or more give a 95 % interval)")
if "secagg" in what:
    print("\n### Secure aggregation compute (s)\n")
    print("| n | m | graph | dropout | k | t | client s | server s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in load("secagg.jsonl"):
        if "skipped" in r:
            print(f"| {r['n']} | {r['m']:,} | {r['graph']} | {r['dropout']} | | | skipped ({r['skipped']}) | |")
        else:
            print(f"| {r['n']} | {r['m']:,} | {r['graph']} | {r['dropout']} | {r['k']} | {r['t']} | {r['client_s']:.3f} | {r['server_s']:.2f} |")
if "fedavg" in what:
    rows = load("fedavg.jsonl")
    print("\n### FedAvg final test accuracy, 10 clients, 10 rounds\n")
    impls = ("cohort", "cohort-same-split", "pytorch")
    print("| partition | seed | " + " | ".join(impls) + " |")
    print("|---|---|" + "---|" * len(impls))
    for part in ("iid", "dirichlet"):
        seeds = sorted({r["seed"] for r in rows if r["partition"] == part})
        acc = lambda impl, s: next((r["final_test_acc"] for r in rows if r["partition"] == part and r["seed"] == s and r["impl"] == impl), float("nan"))
        for s in seeds:
            print(f"| {part} | {s} | " + " | ".join(f"{acc(i, s):.4f}" for i in impls) + " |")
        means = [statistics.mean(acc(i, s) for s in seeds) if seeds else float("nan") for i in impls]
        print(f"| {part} | mean | " + " | ".join(f"{m:.4f}" for m in means) + " |")
PY
