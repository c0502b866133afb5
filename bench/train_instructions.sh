#!/usr/bin/env bash
# The instructions local training executes, counted by valgrind's callgrind
# inside cohort::train::TrainLocal (inclusive: the trainer, its kernels,
# OpenBLAS, the progress callback), the same on a quiet or a loaded machine.
# For changes whose cost is below what wall-clock pairs resolve here (this
# 2-core VM scatters single pairs by +-6 %):
#
#   bash bench/train_instructions.sh trees OLD_TREE NEW_TREE [MODEL]
#       the same train_bench run from two builds (issue 30: did the trainer's
#       code change?);
#   bash bench/train_instructions.sh progress TREE [MODEL]
#       one build, `--progress off` against `--progress bar` (issue 31: what
#       the progress bar costs training).
#
# MODEL: mlp (default), logreg or lenet5; one epoch, batch 32, 1 thread, seed
# 0, on the first SAMPLES (default 6000) Fashion-MNIST training images (a
# subset written to $OUT: callgrind runs ~100x slower than native). The bar
# redraws every 0.1 s of wall clock and reads the clock up to 1,000 times
# an epoch; under valgrind and on a smaller epoch both happen more often per
# sample than in a native full epoch, so its share here is an upper bound.
set -euo pipefail
mode=$1
shift
OUT=${OUT:-${TMPDIR:-/tmp}/cohort-train-instructions}
SAMPLES=${SAMPLES:-6000}
PY=/usr/bin/python3
command -v valgrind > /dev/null || { echo "train_instructions: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
mkdir -p "$OUT/fmnist"
$PY - "$OUT/fmnist" "$SAMPLES" <<'PY'
import gzip, struct, sys
src, (dst, n) = "/usr/share/datasets/fashion-mnist/", (sys.argv[1], int(sys.argv[2]))
for part, count in (("train", n), ("t10k", 1000)):
    images = gzip.open(f"{src}{part}-images-idx3-ubyte.gz").read()
    labels = gzip.open(f"{src}{part}-labels-idx1-ubyte.gz").read()
    gzip.open(f"{dst}/{part}-images-idx3-ubyte.gz", "wb").write(
        struct.pack(">IIII", 2051, count, 28, 28) + images[16:16 + count * 784])
    gzip.open(f"{dst}/{part}-labels-idx1-ubyte.gz", "wb").write(
        struct.pack(">II", 2049, count) + labels[8:8 + count])
PY

run() {  # NAME TREE FLAGS...: runs train_bench under callgrind, in the background
  local name=$1 tree=$2
  shift 2
  FMNIST_DIR="$OUT/fmnist" valgrind --tool=callgrind --callgrind-out-file="$OUT/$name.callgrind" \
    "--toggle-collect=cohort::train::TrainLocal*" "$tree/build/bench/train_bench" --repeats 1 "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.log" &
}
total() {
  callgrind_annotate "$OUT/$1.callgrind" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}

case $mode in
  trees)
    model=${3:-mlp}
    run old "$1" --model "$model"
    run new "$2" --model "$model"
    wait
    a=old b=new ;;
  progress)
    model=${2:-mlp}
    run off "$1" --model "$model" --progress off
    run bar "$1" --model "$model" --progress bar
    wait
    a=off b=bar ;;
  *) echo "usage: train_instructions.sh trees OLD NEW [MODEL] | progress TREE [MODEL]" >&2; exit 2 ;;
esac
ia=$(total $a)
ib=$(total $b)
$PY - "$model" "$SAMPLES" "$a" "$ia" "$b" "$ib" "$OUT" <<'PY'
import json, sys
model, samples, a, ia, b, ib, out = sys.argv[1:]
ia, ib = int(ia), int(ib)
loss = {w: json.loads(open(f"{out}/{w}.json").read())["train_loss"] for w in (a, b)}
print(f"| {model}, {samples} samples, 1 epoch | {a} | {b} | {b}/{a} |")
print("|---|---|---|---|")
print(f"| instructions in TrainLocal | {ia:,} | {ib:,} | {ib / ia:.6f} |")
print(f"| train loss | {loss[a]:.6f} | {loss[b]:.6f} | |")
PY
