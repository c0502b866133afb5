#!/usr/bin/env bash
# Issue 35, item 7: the round time of `mpirun -np 3 cohort simulate` (rank 0
# runs the engine and the sessions, ranks 1 and 2 train, one executor each)
# against one process (`cohort simulate --executors 1`: the sessions on the
# main thread, the training on one executor thread), the same config and
# seed, in one invocation: PAIRS pairs, alternating single, MPI, single, ...
# so that both see the same machine. Each run's round time is the mean of
# the rounds' wall seconds in its store (tasks sent to commit), rounds 2 on
# (round 1 also pays the clients' registration). Also checks that each
# pair ended with the same model bytes, and prints the CPU seconds (user +
# sys, whole run) of the single process and of each MPI rank: where the
# work is.
#
#   bash bench/simulate_mpi.sh [CONFIG]
#
# CONFIG: default examples/simulation.textproto (Fashion-MNIST, MLP
# 784-200-200-10, SecAgg+) with --clients 1000 --per-round 100. PAIRS
# (default 3), ROUNDS (default 4), EXECUTORS (per process, default 1),
# COHORT (default build/cli/cohort), OUT (default ${TMPDIR:-/tmp}/cohort-simmpi).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-examples/simulation.textproto}
PAIRS=${PAIRS:-3}
ROUNDS=${ROUNDS:-4}
EXECUTORS=${EXECUTORS:-1}
COHORT=${COHORT:-build/cli/cohort}
OUT=${OUT:-${TMPDIR:-/tmp}/cohort-simmpi}
command -v mpirun > /dev/null || { echo "simulate_mpi: needs mpirun (scripts/setup.sh: openmpi-bin)" >&2; exit 1; }
command -v sqlite3 > /dev/null || { echo "simulate_mpi: needs sqlite3" >&2; exit 1; }
rm -rf "$OUT" && mkdir -p "$OUT"
ARGS=(--log-level warn simulate --config "$CONFIG" --clients 1000 --per-round 100
      --rounds "$ROUNDS" --executors "$EXECUTORS")
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader
        --mca oob_tcp_if_include lo -np 3)

# FILE CMD...: runs CMD, then writes its CPU seconds (user + sys) to
# FILE (FILE.rank<R> under MPI).
cpu() {
  local file=$1; shift
  bash -c '"${@:2}"; rc=$?; file=$1${OMPI_COMM_WORLD_RANK:+.rank$OMPI_COMM_WORLD_RANK}
    times > "$file.times"  # Not in a pipe: a subshell has no children.
    tail -1 "$file.times" | tr "ms" "  " \
      | awk "{ printf \"%.1f\n\", \$1 * 60 + \$2 + \$3 * 60 + \$4 }" > "$file"
    exit $rc' _ "$file" "$@"
}

# NAME: the mean round seconds (rounds 2 on) of the run in $OUT/NAME.
round_seconds() {
  sqlite3 "$OUT/$1/run.db" "SELECT printf('%.3f', avg(seconds)) FROM rounds WHERE round >= 2"
}
model_hash() {
  sqlite3 "$OUT/$1/run.db" "SELECT hex(model) FROM checkpoints ORDER BY round DESC LIMIT 1" \
    | sha256sum | cut -c1-16
}

printf '%-5s %12s %12s %8s  %-10s %s\n' pair "single s/rd" "mpi -np 3" ratio "same model" \
  "CPU s: single | mpi rank 0, 1, 2"
ratios=()
for p in $(seq 1 "$PAIRS"); do
  cpu "$OUT/cpu-single$p" "$COHORT" "${ARGS[@]}" --run-dir "$OUT/single$p" \
    > "$OUT/single$p.out" 2>&1 || { tail -20 "$OUT/single$p.out" >&2; exit 1; }
  "${MPIRUN[@]}" bash -c "$(declare -f cpu); cpu \"\$@\"" _ "$OUT/cpu-mpi$p" "$COHORT" \
    "${ARGS[@]}" --run-dir "$OUT/mpi$p" > "$OUT/mpi$p.out" 2>&1 \
    || { tail -20 "$OUT/mpi$p.out" >&2; exit 1; }
  s=$(round_seconds "single$p")
  m=$(round_seconds "mpi$p")
  r=$(awk -v s="$s" -v m="$m" 'BEGIN { printf "%.3f", m / s }')
  ratios+=("$r")
  same=no
  [[ $(model_hash "single$p") == $(model_hash "mpi$p") ]] && same=yes
  printf '%-5s %12s %12s %8s  %-10s %s | %s, %s, %s\n' "$p" "$s" "$m" "$r" "$same" \
    "$(cat "$OUT/cpu-single$p")" "$(cat "$OUT/cpu-mpi$p.rank0")" "$(cat "$OUT/cpu-mpi$p.rank1")" \
    "$(cat "$OUT/cpu-mpi$p.rank2")"
done
printf 'median ratio (mpi / single round time): %s\n' \
  "$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')"
