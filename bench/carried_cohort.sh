# Sourced by bench/sim_gpu_check.sh and bench/dp_gpu_check.sh (from the
# project root, after setting NAME): the carry of bench/sim_gpu_pack.sh
# unpacked into build-simgpu/unpacked, `cohort` set to its binary with its
# libraries on LD_LIBRARY_PATH, the output folder OUT_DIR ($OUT, else
# build-simgpu/out) and log(), which stamps a line into OUT_DIR/NAME.log.
CARRY=build-simgpu-carry
OUT_DIR=${OUT:-build-simgpu/out}
mkdir -p "$OUT_DIR" build-simgpu
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT_DIR/$NAME.log"; }
[[ -f $CARRY/cohort.tar.xz ]] || { echo "no $CARRY: run bench/sim_gpu_pack.sh first" >&2; exit 1; }
rm -rf build-simgpu/unpacked && mkdir -p build-simgpu/unpacked
tar -C build-simgpu/unpacked -xJf "$CARRY/cohort.tar.xz"
export LD_LIBRARY_PATH=$PWD/build-simgpu/unpacked/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cohort=build-simgpu/unpacked/bin/cohort
"$cohort" --help > /dev/null || { log "the carried cohort does not run here"; exit 1; }
