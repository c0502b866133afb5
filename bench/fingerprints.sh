#!/usr/bin/env bash
# Prints the SHA-256 of the final model of seven fixed runs, one line each:
# the check that a refactoring changed nothing Cohort computes.
#
#   bash bench/fingerprints.sh [demo,lenet5,plain,simulate,launch,resume,site]
#
#   demo     : make demo (10 clients, SecAgg+, MLP, 10 rounds)
#   lenet5   : MODEL=lenet5 make demo
#   plain    : AGGREGATION=PLAIN make demo
#   simulate : cohort simulate of examples/simulation.textproto, --dropout 0.2
#   launch   : cohort launch --nproc 2 of examples/data_parallel.textproto, exact
#   resume   : a secure 5-client run whose coordinator is SIGKILLed inside
#              the commit of round 3 and restarted (it resumes from round 2)
#   site     : SITE_SIZE=2 make demo (5 sites of a client and a site worker)
#
# Each line: NAME  ROUNDS  SHA-256(model bytes)  SHA-256(stored round figures)
# The model hash is of the latest checkpoint's float32 bytes in run.db. The
# second hash is of the rounds table's computed columns (losses, accuracies,
# counts), not the timings. Runs live in $FP_DIR (default /tmp/cohort-fp).
set -euo pipefail
cd "$(dirname "$0")/.."

WHAT=${1:-demo,lenet5,plain,simulate,launch,resume,site}
has() { [[ ",$WHAT," == *",$1,"* ]]; }
FP_DIR=${FP_DIR:-${TMPDIR:-/tmp}/cohort-fp}
COHORT=${COHORT:-build/cli/cohort}
DATA=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
mkdir -p "$FP_DIR"

# NAME RUN_DIR: one line of figures for the run stored in RUN_DIR/run.db.
print_fp() {
  local db="$2/run.db" tmp="$FP_DIR/model.bin"
  rm -f "$tmp"
  local round
  round=$(sqlite3 "$db" "SELECT round, writefile('$tmp', model) FROM checkpoints \
    ORDER BY round DESC LIMIT 1" | cut -d'|' -f1)
  local model figures
  model=$(sha256sum "$tmp" | cut -c1-64)
  figures=$(sqlite3 "$db" "SELECT round, participants, selected, dropped, \
    printf('%.9g', train_loss), printf('%.9g', test_accuracy), printf('%.9g', test_loss), \
    outcome FROM rounds ORDER BY round" | sha256sum | cut -c1-16)
  printf '%-9s %3s  %s  %s\n' "$1" "$round" "$model" "$figures"
}

demo() {  # NAME, then environment assignments for scripts/demo.sh
  local name=$1; shift
  env "$@" RUN_DIR="$FP_DIR/$name" COHORT="$COHORT" bash scripts/demo.sh > "$FP_DIR/$name.out" 2>&1 \
    || { echo "$name: demo failed" >&2; tail -20 "$FP_DIR/$name.out" >&2; return 1; }
  print_fp "$name" "$FP_DIR/$name"
}

simulate() {
  local dir="$FP_DIR/simulate"
  rm -rf "$dir"
  "$COHORT" simulate --config examples/simulation.textproto --run-dir "$dir" --dropout 0.2 \
    > "$FP_DIR/simulate.out" 2>&1 || { tail -20 "$FP_DIR/simulate.out" >&2; return 1; }
  print_fp simulate "$dir"
}

launch() {
  local dir="$FP_DIR/launch"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$COHORT" partition --format idx \
    --train-images "$DATA/train-images-idx3-ubyte.gz" --train-labels "$DATA/train-labels-idx1-ubyte.gz" \
    --test-images "$DATA/t10k-images-idx3-ubyte.gz" --test-labels "$DATA/t10k-labels-idx1-ubyte.gz" \
    --clients 1 --out "$dir/shards" > /dev/null
  sed -e "s#runs/dp/shards#$dir/shards#" -e "s#exact: false#exact: true#" \
    -e "s#epochs: 3#epochs: 1#" examples/data_parallel.textproto > "$dir/run.textproto"
  "$COHORT" launch --nproc 2 --config "$dir/run.textproto" --run-dir "$dir" \
    > "$FP_DIR/launch.out" 2>&1 || { tail -20 "$FP_DIR/launch.out" >&2; return 1; }
  print_fp launch "$dir"
}

# A secure run of 5 clients and 5 rounds whose coordinator dies inside the
# commit of round 3 (COHORT_FAULT_KILL_IN_COMMIT) and is restarted on the
# same endpoint; the clients stay up and carry on with it.
resume() {
  local dir="$FP_DIR/resume" n=5
  rm -rf "$dir"
  mkdir -p "$dir/logs"
  "$COHORT" partition --format idx \
    --train-images "$DATA/train-images-idx3-ubyte.gz" --train-labels "$DATA/train-labels-idx1-ubyte.gz" \
    --test-images "$DATA/t10k-images-idx3-ubyte.gz" --test-labels "$DATA/t10k-labels-idx1-ubyte.gz" \
    --clients "$n" --scheme dirichlet:0.5 --seed 0 --out "$dir/shards" > /dev/null
  sed -e "s#runs/demo/shards/test.shard#$dir/shards/test.shard#" \
    -e "s#start_clients: 10#start_clients: $n#" -e "s#min_clients: 8#min_clients: $n#" \
    examples/federated.textproto > "$dir/run.textproto"
  local pids=()
  COHORT_FAULT_KILL_IN_COMMIT=3 "$COHORT" coordinator --config "$dir/run.textproto" \
    --run-dir "$dir" --insecure --bind tcp://127.0.0.1:0 --rounds 5 \
    > "$dir/logs/coordinator-1.out" 2> "$dir/logs/coordinator-1.log" &
  local coordinator=$!
  for _ in $(seq 300); do [[ -s "$dir/coordinator.endpoint" ]] && break; sleep 0.1; done
  local endpoint
  endpoint=$(cat "$dir/coordinator.endpoint")
  for ((k = 0; k < n; k++)); do
    local name
    name=$(printf "client-%03d" "$k")
    "$COHORT" client --coordinator "$endpoint" --data "$dir/shards/$name.shard" --insecure \
      2> "$dir/logs/$name.log" &
    pids+=("$!")
  done
  wait "$coordinator" 2> /dev/null || true
  grep -q "SIGKILL before the commit of round 3" "$dir/logs/coordinator-1.log" \
    || { echo "resume: the coordinator was not killed in round 3" >&2; return 1; }
  "$COHORT" coordinator --config "$dir/run.textproto" --run-dir "$dir" --insecure \
    --bind "$endpoint" --rounds 5 > "$dir/logs/coordinator-2.out" 2> "$dir/logs/coordinator-2.log" \
    || { tail -20 "$dir/logs/coordinator-2.log" >&2; return 1; }
  for pid in "${pids[@]}"; do wait "$pid" || true; done
  print_fp resume "$dir"
}

has demo && demo demo
has lenet5 && demo lenet5 MODEL=lenet5
has plain && demo plain AGGREGATION=PLAIN
has simulate && simulate
has launch && launch
has resume && resume
has site && demo site SITE_SIZE=2 CORRUPT=0
exit 0
