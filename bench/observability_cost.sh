#!/usr/bin/env bash
# Issue 33, acceptance 4: what lineage, timings and Prometheus metrics cost a
# round. bench/run.sh's secagg-round (100 client processes, MLP
# 784-1024-192-10 of 1,002,570 parameters, SecAgg+, the median round seconds
# of rounds 2-4) run three ways in one invocation, in turn (the order
# rotates every rep, so the machine's drift falls on all three):
#   old      OLD_TREE's cohort: a build from before lineage, timings and
#            metrics (aa2fd33);
#   off      NEW_TREE's cohort without --metrics-addr (lineage and timings
#            are always on);
#   metrics  NEW_TREE's cohort with --metrics-addr on the coordinator and
#            every client, the coordinator scraped every second by Debian's
#            prometheus.
#
#   bash bench/observability_cost.sh OLD_TREE NEW_TREE
#
# REPS (default 3) reps; ROUNDS_E2E (default 4). JSON lines in
# $OUT/cost.jsonl (default ${TMPDIR:-/tmp}/cohort-cost); the table printed
# at the end has each way's median and its ratio to `old`.
set -euo pipefail
OLD=$(cd "$1" && pwd)
NEW=$(cd "$2" && pwd)
OUT=${OUT:-${TMPDIR:-/tmp}/cohort-cost}
REPS=${REPS:-3}
PY=/usr/bin/python3
mkdir -p "$OUT"
: > "$OUT/cost.jsonl"

free_port() {
  $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free_port)
prom_port=$(free_port)
rm -rf "$OUT/prometheus" && mkdir -p "$OUT/prometheus"
printf '%s\n' "global: { scrape_interval: 1s, scrape_timeout: 1s }" "scrape_configs:" \
  "  - job_name: coordinator" "    static_configs: [{ targets: [\"127.0.0.1:$port\"] }]" \
  > "$OUT/prometheus/prometheus.yml"
prometheus --config.file="$OUT/prometheus/prometheus.yml" \
  --storage.tsdb.path="$OUT/prometheus/data" --web.listen-address="127.0.0.1:$prom_port" \
  > "$OUT/prometheus/log" 2>&1 &
prom=$!
trap 'kill $prom 2> /dev/null || true' EXIT

run_way() {  # WAY REP
  local cohort=$NEW/build/cli/cohort coord="" client=""
  case $1 in
    old) cohort=$OLD/build/cli/cohort ;;
    metrics)
      coord="--metrics-addr 127.0.0.1:$port --metrics-linger-s 0"
      client="--metrics-addr 127.0.0.1:0 --metrics-linger-s 0" ;;
  esac
  (cd "$NEW" && OUT="$OUT/$1-$2" E2E_REPS=1 AGGS=SECAGG_PLUS E2E_TAG=$1 E2E_COHORT=$cohort \
    E2E_COORD_FLAGS=$coord E2E_CLIENT_FLAGS=$client bash bench/run.sh secagg-round > /dev/null)
  cat "$OUT/$1-$2/secagg_round.jsonl" >> "$OUT/cost.jsonl"
}

ways=(old off metrics)
for rep in $(seq "$REPS"); do
  for i in 0 1 2; do
    run_way "${ways[$(((rep + i) % 3))]}" "$rep"
  done
done
# The scrapes Prometheus made of the coordinators that had metrics on.
scrapes=$(curl -s "http://127.0.0.1:$prom_port/api/v1/query?query=sum_over_time(up%5B1h%5D)" \
  | $PY -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')

$PY - "$OUT/cost.jsonl" "$scrapes" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = {w: statistics.median(r["median_round_s"] for r in rows if r["tag"] == w)
       for w in ("old", "off", "metrics")}
print("\n| way | runs | median round s | / old |")
print("|---|---|---|---|")
for w, m in med.items():
    n = sum(r["tag"] == w for r in rows)
    print(f"| {w} | {n} | {m:.3f} | {m / med['old']:.4f} |")
print("\nper run:", ", ".join(f"{r['tag']}:{r['median_round_s']:.3f}" for r in rows))
print("successful prometheus scrapes of the coordinators:", sys.argv[2])
PY
