#!/usr/bin/env bash
# Issue 33, acceptance 4, counted instead of timed: the share of the
# coordinator's work that lineage, timings and Prometheus metrics take in
# bench/run.sh's secagg-round (100 client processes, MLP of 1,002,570
# parameters, SecAgg+), with metrics on and the coordinator scraped every
# second by Debian's prometheus.
#
# The coordinator runs under valgrind's callgrind, which counts the
# instructions each function executes (and, inclusively, everything it
# calls), the same on a quiet or a loaded machine; the clients run natively.
# The observability code is named by its entry points, none of which calls
# another (bench/callgrind_share.py); their inclusive instructions over the
# coordinator's own are the share. Under valgrind the coordinator runs ~50x
# slower while Prometheus still scrapes once a wall-clock second, so the
# scrapes are also given per scrape and scaled to a native rate
# (NATIVE_SCRAPES_PER_ROUND, default 2).
#
#   bash bench/observability_share.sh [TREE]      (TREE: a built tree, default .)
#
# ROUNDS_E2E (default 3). Output in $OUT (default ${TMPDIR:-/tmp}/cohort-share).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TREE=$(cd "${1:-.}" && pwd)
OUT=${OUT:-${TMPDIR:-/tmp}/cohort-share}
PY=/usr/bin/python3
command -v valgrind > /dev/null || { echo "observability_share: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
rm -rf "$OUT" && mkdir -p "$OUT"

free_port() {
  $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free_port)
prom_port=$(free_port)
mkdir -p "$OUT/prometheus"
printf '%s\n' "global: { scrape_interval: 1s, scrape_timeout: 1s }" "scrape_configs:" \
  "  - job_name: coordinator" "    static_configs: [{ targets: [\"127.0.0.1:$port\"] }]" \
  > "$OUT/prometheus/prometheus.yml"
prometheus --config.file="$OUT/prometheus/prometheus.yml" \
  --storage.tsdb.path="$OUT/prometheus/data" --web.listen-address="127.0.0.1:$prom_port" \
  > "$OUT/prometheus/log" 2>&1 &
prom=$!
trap 'kill $prom 2> /dev/null || true' EXIT

# The coordinator under callgrind, everything else as it is.
cat > "$OUT/cohort" <<WRAP
#!/usr/bin/env bash
for a in "\$@"; do
  if [[ \$a == coordinator ]]; then
    exec valgrind --tool=callgrind --callgrind-out-file=$OUT/coordinator.callgrind \\
      "$TREE/build/cli/cohort" "\$@"
  fi
done
exec "$TREE/build/cli/cohort" "\$@"
WRAP
chmod +x "$OUT/cohort"

wrapper=$OUT/cohort
(cd "$TREE" && OUT="$OUT/run" E2E_REPS=1 AGGS=SECAGG_PLUS ROUNDS_E2E=${ROUNDS_E2E:-3} \
  E2E_TAG=callgrind E2E_COHORT="$wrapper" E2E_START_S=300 \
  E2E_COORD_FLAGS="--metrics-addr 127.0.0.1:$port --metrics-linger-s 0" \
  E2E_CLIENT_FLAGS="--metrics-addr 127.0.0.1:0 --metrics-linger-s 0" \
  bash "$HERE/run.sh" secagg-round > /dev/null)
scrapes=$(curl -s "http://127.0.0.1:$prom_port/api/v1/query?query=sum_over_time(up%5B1h%5D)" \
  | $PY -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')

callgrind_annotate --inclusive=yes --threshold=100 "$OUT/coordinator.callgrind" \
  > "$OUT/inclusive.txt"
# Requests the metrics endpoint served (Prometheus's timed-out scrapes too).
callgrind_annotate --tree=caller --threshold=100 "$OUT/coordinator.callgrind" > "$OUT/callers.txt"
served=$(grep -m1 '< .*CivetServer::requestHandler' "$OUT/callers.txt" \
  | sed -E 's/.*\(([0-9,]+)x\).*/\1/' | tr -d ,)
SCRAPES_SERVED=${served:-0} $PY "$HERE/callgrind_share.py" "$OUT/inclusive.txt" "$scrapes" \
  "$OUT/run/secagg_round.jsonl"
