#!/usr/bin/env bash
# Two builds of Cohort side by side: the same bench binaries and `cohort`
# runs of bench/run.sh, OLD and NEW alternately in one invocation (OLD first
# in odd pairs, NEW first in even ones), so the machine's noise falls on both.
#
#   bash bench/ab.sh OLD_TREE NEW_TREE [train,progress,secagg,allreduce,dp,simulate]
#
# (progress: NEW's train_bench with --progress bar against --progress off,
# in the OLD and NEW columns: issue 31's cost of the bar.)
# OLD_TREE and NEW_TREE are checkouts with a release build in build/ (each
# build partitions its own shards from its own tree's examples). PAIRS
# (default 3) pairs per case. Every figure goes to $OUT/ab.jsonl
# (default ${TMPDIR:-/tmp}/cohort-ab); the table printed at the end has, per
# case, the median of each build and the ratio NEW/OLD of the medians, with
# the direction that is better ("higher" for rates, "lower" for seconds).
set -euo pipefail
OLD=$(cd "$1" && pwd)
NEW=$(cd "$2" && pwd)
WHAT=${3:-train,secagg,allreduce,dp,simulate}
has() { [[ ",$WHAT," == *",$1,"* ]]; }
PAIRS=${PAIRS:-3}
OUT=${OUT:-${TMPDIR:-/tmp}/cohort-ab}
DATA=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
PY=/usr/bin/python3
mkdir -p "$OUT"
: > "$OUT/ab.jsonl"

# record CASE BUILD FIGURE_NAME BETTER: reads one number on stdin.
record() {
  local value
  value=$(cat)
  [[ -n $value ]] || value=null
  echo "{\"case\":\"$1\",\"build\":\"$2\",\"figure\":\"$3\",\"better\":\"$4\",\"value\":$value}" \
    >> "$OUT/ab.jsonl"
}
# field NAME [FILTER]: the value of NAME in the last JSON line on stdin (that
# matches the Python expression FILTER over d, if given).
field() {
  $PY -c '
import json, sys
name, cond = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "True"
value = None
for line in sys.stdin:
    if not line.startswith("{"): continue
    d = json.loads(line)
    if eval(cond): value = d[name]
print("" if value is None else value)' "$@"
}

partition() {  # partition TREE CLIENTS DIR
  [[ -f $3/test.shard ]] && return 0
  "$1/build/cli/cohort" partition --format idx \
    --train-images "$DATA/train-images-idx3-ubyte.gz" --train-labels "$DATA/train-labels-idx1-ubyte.gz" \
    --test-images "$DATA/t10k-images-idx3-ubyte.gz" --test-labels "$DATA/t10k-labels-idx1-ubyte.gz" \
    --clients "$2" --scheme iid --seed 0 --out "$3" > /dev/null 2>&1
}

# One case, run once by build $1 (old|new) from tree $2.
run_train() {  # MODEL
  OPENBLAS_NUM_THREADS=1 "$2/build/bench/train_bench" --model "$3" --repeats 1 --seed 0 |
    field samples_per_s | record "train $3" "$1" samples_per_s higher
}
# Issue 31's cost of the progress bar, on NEW's build only: "old" runs
# --progress off, "new" --progress bar (redrawn as often as it ever is).
run_progress() {
  local mode=off
  [[ $1 == new ]] && mode=bar
  OPENBLAS_NUM_THREADS=1 "$NEW/build/bench/train_bench" --model mlp --repeats 1 --seed 0 \
    --progress "$mode" | field samples_per_s | record "progress bar/off (NEW build, train mlp)" \
    "$1" samples_per_s higher
}
run_secagg() {  # N M DROPOUT GRAPH
  local line
  line=$("$2/build/bench/secagg_bench" --n "$3" --m "$4" --dropout "$5" --graph "$6")
  echo "$line" | field client_s | record "secagg n=$3 m=$4 d=$5 $6 client" "$1" client_s lower
  echo "$line" | field server_s | record "secagg n=$3 m=$4 d=$5 $6 server" "$1" server_s lower
}
run_allreduce() {  # WORLD TRANSPORT BYTES [--pin]
  "$2/build/bench/allreduce_bench" --world "$3" --transport "$4" --bytes "$5" "${@:6}" |
    field busbw_GBps | record "allreduce $3 ranks $4 $5 B" "$1" busbw_GBps higher
}
run_dp() {  # WORLD
  local world=$3 run="$OUT/dp-run-$1-$3"
  partition "$2" 1 "$OUT/dp-shards-$1"
  sed -e "s#runs/dp/shards#$OUT/dp-shards-$1#" -e "s#batch_size: 8 #batch_size: $((64 / world)) #" \
    -e "s#epochs: 3#epochs: 1#" \
    "$2/examples/data_parallel.textproto" > "$run.textproto"
  rm -rf "$run"
  "$2/build/cli/cohort" launch --nproc "$world" --config "$run.textproto" --run-dir "$run" \
    > /dev/null 2>&1
  "$2/build/cli/cohort" status --run-dir "$run" --json | tail -1 |
    $PY -c 'import json, sys; print(round(60000 / json.load(sys.stdin)["seconds"], 1))' |
    record "dp $world workers" "$1" samples_per_s higher
}
run_simulate() {  # CLIENTS AGGREGATION EXECUTORS
  local clients=$3 run="$OUT/sim-run-$1-$3-$4-$5" shards="$OUT/sim-shards-$1-$3"
  partition "$2" "$clients" "$shards"
  sed -e "s#runs/demo/shards/test.shard#$shards/test.shard#" \
    -e "s#start_clients: 10 #start_clients: $clients #" \
    -e "s#min_clients: 8 #min_clients: $((clients * 8 / 10)) #" \
    -e "s#aggregation: SECAGG_PLUS#aggregation: $4#" "$2/examples/federated.textproto" > "$run.textproto"
  rm -rf "$run"
  "$2/build/cli/cohort" simulate --config "$run.textproto" --run-dir "$run" --shards "$shards" \
    --executors "$5" --rounds 3 > /dev/null 2>&1
  "$2/build/cli/cohort" status --run-dir "$run" --json | $PY -c '
import json, sys
rounds = [json.loads(l) for l in sys.stdin if l.strip()]
secs = sorted(r["seconds"] for r in rounds[1:])
print(secs[len(secs) // 2])' | record "simulate $3 clients $4 $5 executors" "$1" round_s lower
}

# pair P FUNCTION ARGS...: both builds once, the order alternating with P.
pair() {
  local p=$1 fn=$2
  shift 2
  local order=(old new)
  ((p % 2)) && order=(new old)
  for build in "${order[@]}"; do
    local tree=$OLD
    [[ $build == new ]] && tree=$NEW
    "$fn" "$build" "$tree" "$@" || echo "ab.sh: $fn $build $* failed" >&2
  done
}

echo "start $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((p = 0; p < PAIRS; p++)); do
  if has train; then
    for model in mlp logreg lenet5; do pair "$p" run_train "$model"; done
  fi
  if has progress; then pair "$p" run_progress; fi
  if has secagg; then
    pair "$p" run_secagg 100 100000 0.1 complete
    pair "$p" run_secagg 500 100000 0.1 secagg+
    pair "$p" run_secagg 1000 1000000 0 secagg+
  fi
  if has allreduce; then
    for world in 2 4; do
      pair "$p" run_allreduce "$world" shm 4096 --pin
      pair "$p" run_allreduce "$world" shm 67108864 --pin
      pair "$p" run_allreduce "$world" tcp 67108864
    done
  fi
  if has dp; then
    for world in 1 2 4; do pair "$p" run_dp "$world"; done
  fi
  if has simulate; then
    pair "$p" run_simulate 10 PLAIN 2
    pair "$p" run_simulate 100 PLAIN 2
    pair "$p" run_simulate 1000 PLAIN 2
    pair "$p" run_simulate 100 SECAGG_PLUS 2
  fi
  echo "pair $((p + 1))/$PAIRS done $(date -u +%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done

$PY - "$OUT/ab.jsonl" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = list(dict.fromkeys(r["case"] for r in rows))
print("| case | figure | old (median) | new (median) | new/old | better | per-pair new/old |")
print("|---|---|---|---|---|---|---|")
for case in cases:
    rs = [r for r in rows if r["case"] == case and r["value"] is not None]
    old = [r["value"] for r in rs if r["build"] == "old"]
    new = [r["value"] for r in rs if r["build"] == "new"]
    if not old or not new:
        print(f"| {case} | | {old} | {new} | missing | | |")
        continue
    mo, mn = statistics.median(old), statistics.median(new)
    pairs = " ".join(f"{n / o:.3f}" for o, n in zip(old, new) if o)
    fmt = lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.4g}"
    print(f"| {case} | {rs[0]['figure']} | {fmt(mo)} | {fmt(mn)} | {mn / mo:.3f} | "
          f"{rs[0]['better']} | {pairs} |")
EOF
