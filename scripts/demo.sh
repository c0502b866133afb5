#!/usr/bin/env bash
# The demo: a real federated run on Fashion-MNIST on this machine.
# One coordinator and 10 client processes on 127.0.0.1, 10 rounds of FedAvg,
# Dirichlet(0.5) label skew. Leaves the run in runs/demo (run.db inside).
#
# Environment: SCHEME (default dirichlet:0.5), CLIENTS (10), ROUNDS (10),
# SEED (0: partition and run seed), ASSIGNMENT (an explicit split file, see
# `cohort partition --help`; overrides SCHEME), RUN_DIR (runs/demo),
# CONFIG (examples/federated.textproto), COHORT (binary), AGGREGATION
# (SECAGG_PLUS, the default; SECAGG or PLAIN), MODEL (a preset that replaces
# the config's model section: mlp (784-200-200-10), logreg or lenet5),
# SITE_SIZE (1: with W > 1, the shards form CLIENTS / W sites, each a client
# with W - 1 site workers holding the site's other shards), CORRUPT (the
# config's secagg.corrupt_fraction, also passed to the clients as
# --corrupt-fraction; 0 lets two sites aggregate securely).
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEME=${SCHEME:-dirichlet:0.5}
CLIENTS=${CLIENTS:-10}
ROUNDS=${ROUNDS:-10}
SEED=${SEED:-0}
RUN_DIR=${RUN_DIR:-runs/demo}
AGGREGATION=${AGGREGATION:-SECAGG_PLUS}
SITE_SIZE=${SITE_SIZE:-1}
if ((SITE_SIZE < 1 || CLIENTS % SITE_SIZE != 0)); then
  echo "SITE_SIZE=$SITE_SIZE must divide CLIENTS=$CLIENTS" >&2; exit 2
fi
SITES=$((CLIENTS / SITE_SIZE))
CONFIG=${CONFIG:-examples/federated.textproto}
COHORT=${COHORT:-build/cli/cohort}
DATA=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# A fresh run every time: the demo shows a whole run, not a resumed one.
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR/logs"
split=(--clients "$CLIENTS" --scheme "$SCHEME" --seed "$SEED")
if [[ -n ${ASSIGNMENT:-} ]]; then
  split=(--assignment "$ASSIGNMENT")
  SCHEME="split from $ASSIGNMENT"
fi
echo "== partitioning Fashion-MNIST into $CLIENTS shards ($SCHEME)"
"$COHORT" partition --format idx \
  --train-images "$DATA/train-images-idx3-ubyte.gz" --train-labels "$DATA/train-labels-idx1-ubyte.gz" \
  --test-images "$DATA/t10k-images-idx3-ubyte.gz" --test-labels "$DATA/t10k-labels-idx1-ubyte.gz" \
  "${split[@]}" --out "$RUN_DIR/shards"

# The example config points at runs/demo/shards/test.shard; use the run's own.
sed -e "s#runs/demo/shards/test.shard#$RUN_DIR/shards/test.shard#" \
    -e "s#start_clients: 10#start_clients: $SITES#" -e "s#^seed: 0#seed: $SEED#" \
    -e "s#aggregation: SECAGG_PLUS#aggregation: $AGGREGATION#" \
    -e "s#corrupt_fraction: 0.1#corrupt_fraction: ${CORRUPT:-0.1}#" \
    -e "s#min_clients: 8#min_clients: $(( SITES * 8 / 10 > 0 ? SITES * 8 / 10 : 1 ))#" \
    "$CONFIG" > "$RUN_DIR/run.textproto"
if [[ -n ${MODEL:-} ]]; then
  case "$MODEL" in
    mlp) model="model { arch: \"mlp\" hidden: 200 hidden: 200 }" ;;
    logreg | lenet5) model="model { arch: \"$MODEL\" }" ;;
    *) echo "MODEL=$MODEL: must be mlp, logreg or lenet5" >&2; exit 2 ;;
  esac
  # Replace the top-level `model { ... }` block (it ends at the first `}` in
  # column 1).
  awk -v model="$model" '
    /^model \{/ { skip = 1; print model; next }
    skip && /^\}/ { skip = 0; next }
    !skip { print }' "$RUN_DIR/run.textproto" > "$RUN_DIR/run.textproto.new"
  mv "$RUN_DIR/run.textproto.new" "$RUN_DIR/run.textproto"
fi

# Transport security: an identity per process; the coordinator admits the
# clients whose .pub files are in its allowlist, clients pin its key.
echo "== keys for the coordinator and $CLIENTS clients (CURVE on; allowlist in $RUN_DIR/allow)"
mkdir -p "$RUN_DIR/allow"
"$COHORT" keygen --out "$RUN_DIR/keys" --name coordinator > /dev/null
for ((k = 0; k < CLIENTS; k++)); do
  name=$(printf "client-%03d" "$k")
  "$COHORT" keygen --out "$RUN_DIR/keys" --name "$name" > /dev/null
  cp "$RUN_DIR/keys/$name.pub" "$RUN_DIR/allow/"
done

echo "== coordinator + $SITES clients ($SITE_SIZE shards each) on 127.0.0.1, $ROUNDS rounds, aggregation $AGGREGATION (logs in $RUN_DIR/logs)"
"$COHORT" coordinator --config "$RUN_DIR/run.textproto" --run-dir "$RUN_DIR" \
  --bind tcp://127.0.0.1:0 --rounds "$ROUNDS" \
  --identity "$RUN_DIR/keys/coordinator.key" --allow "$RUN_DIR/allow" \
  2> "$RUN_DIR/logs/coordinator.log" &
coordinator=$!
pids+=("$coordinator")
# The coordinator writes its endpoint once bound (port 0 = any free port).
for _ in $(seq 300); do
  [[ -s "$RUN_DIR/coordinator.endpoint" ]] && break
  kill -0 "$coordinator" 2>/dev/null || { cat "$RUN_DIR/logs/coordinator.log"; exit 1; }
  sleep 0.1
done
endpoint=$(cat "$RUN_DIR/coordinator.endpoint")
for ((k = 0; k < CLIENTS; k++)); do
  name=$(printf "client-%03d" "$k")
  site=(); rank=$((k % SITE_SIZE))
  if ((SITE_SIZE > 1)); then
    site=(--site-master "ipc://$(realpath "$RUN_DIR")/site-$((k / SITE_SIZE))" --site-size "$SITE_SIZE")
  fi
  if ((rank == 0)); then
    "$COHORT" client --coordinator "$endpoint" --data "$RUN_DIR/shards/$name.shard" \
      --identity "$RUN_DIR/keys/$name.key" --coordinator-key "$RUN_DIR/keys/coordinator.pub" \
      ${CORRUPT:+--corrupt-fraction "$CORRUPT"} "${site[@]}" 2> "$RUN_DIR/logs/$name.log" &
  else
    "$COHORT" site-worker --data "$RUN_DIR/shards/$name.shard" --rank "$rank" \
      "${site[@]}" 2> "$RUN_DIR/logs/$name.log" &
  fi
  pids+=("$!")
done

status=0
wait "$coordinator" || status=$?
if [[ $status -ne 0 ]]; then
  echo "coordinator failed (exit $status):" >&2
  tail -20 "$RUN_DIR/logs/coordinator.log" >&2
  exit "$status"
fi
for pid in "${pids[@]:1}"; do wait "$pid" || true; done
echo "== done; the run is in $RUN_DIR. Table: $COHORT status --run-dir $RUN_DIR"
