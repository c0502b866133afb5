#!/usr/bin/env bash
# Runs the libFuzzer harnesses of tests/fuzz/ one after the other and
# records, per harness: executions, seconds, executions per second, result.
#
#   bench/fuzz_run.sh [--build DIR] [--seconds N] [--runs N] [--out DIR] [NAME...]
#
# --build    the clang fuzzing build (default build-fuzz; `make fuzz` makes it)
# --seconds  time per harness (default 60); with --runs, a cap on it
# --runs     stop each harness after N executions (the long run: 10000000)
# --out      where logs, new corpus entries and crash inputs go
#            (default BUILD/fuzz-runs); the committed corpus is only read
# NAME       harnesses to run (default: all eight)
#
# Each harness runs at `nice -n ${FUZZ_NICE:-19}` with one worker, on inputs
# of at most ${FUZZ_MAX_LEN:-1024} bytes (every seed fits; longer inputs reach
# no new code and only slow the text parsers down). A crash, a sanitizer
# report, a leak or an input over 10 s (-timeout=10) fails that harness; its
# input is kept under OUT/NAME/ and the script exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."

build=build-fuzz
seconds=""
runs=""
out=""
names=()
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
((${#names[@]})) || names=(envelope config shard idx csv secagg_server secagg_client secagg_wire dp_ledger)
[[ -n $out ]] || out=$build/fuzz-runs
[[ -n $seconds || -n $runs ]] || seconds=60

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:print_summary=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:print_summary=1:suppressions=$PWD/tests/fuzz/ubsan.supp}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}

mkdir -p "$out"
results=$out/results.tsv
printf 'harness\texecutions\tseconds\texec_per_s\tresult\tlog\n' > "$results"
status=0
for name in "${names[@]}"; do
  bin=$build/tests/fuzz/${name}_fuzz
  seeds=tests/fuzz/corpus/$name
  if [[ ! -x $bin ]]; then
    echo "$bin is missing: run make fuzz (or meson compile -C $build ${name}_fuzz)" >&2
    exit 2
  fi
  dir=$out/$name
  mkdir -p "$dir/corpus"
  log=$dir/log.txt
  args=(-timeout=10 -rss_limit_mb=2048 -max_len="${FUZZ_MAX_LEN:-1024}" -print_final_stats=1
        -artifact_prefix="$dir/")
  [[ -n $runs ]] && args+=(-runs="$runs")
  [[ -n $seconds ]] && args+=(-max_total_time="$seconds")
  echo "== $name: ${runs:+$runs runs}${runs:+${seconds:+, }}${seconds:+at most $seconds s}"
  # The harnesses' scratch files (tests/fuzz/temp_file.h): libFuzzer ends
  # with _Exit, which leaves them behind, so each run gets a folder to drop.
  scratch=$(mktemp -d -p "$([[ -w /dev/shm ]] && echo /dev/shm || echo "${TMPDIR:-/tmp}")" \
    cohort-fuzz-run.XXXXXX)
  start=$(date +%s.%N)
  # New inputs go to the first folder (scratch); the seeds are only read.
  TMPDIR=$scratch nice -n "${FUZZ_NICE:-19}" "$bin" "${args[@]}" "$dir/corpus" "$seeds" \
    > "$log" 2>&1
  rc=$?
  rm -rf "$scratch"
  end=$(date +%s.%N)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  execs=${execs:-0}
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", (b - a) }')
  rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? e / s : 0) }')
  if ((rc == 0)); then
    result=ok
  else
    status=1
    if grep -q 'ERROR: libFuzzer: timeout' "$log"; then result=timeout
    elif grep -q 'out-of-memory' "$log"; then result=oom
    elif grep -q 'ERROR: LeakSanitizer' "$log"; then result=leak
    else result="crash (exit $rc)"
    fi
    tail -n 40 "$log" >&2
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$execs" "$secs" "$rate" "$result" "$log" >> "$results"
  echo "   $execs executions in $secs s ($rate/s): $result"
done
echo
column -t -s $'\t' "$results"
exit $status
