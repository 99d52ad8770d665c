#!/bin/bash
# Issue 31's `terrain sssp` figures on the GPU machine: the in-core GPU solve's tests, then
# `terrain sssp --method incore --device gpu` at 16384^2 and 32768^2 (synth seed 1, the source at the
# centre, absdiff) as CLI runs in fresh processes, kernels compiled first on 2048^2, with the code
# before (BEFORE=root of that tree, optional) and this tree side by side. From the repository root with
# the package on PYTHONPATH; logs to $OUT.
set -u
OUT=${OUT:-/tmp/sssp_out}; D=${SCRATCH:-/tmp/sssp_run}; mkdir -p "$OUT" "$D"
HERE=$PWD; BEFORE=${BEFORE:-}
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
cli() {  # tree, label, CLI args...
    local tree=$1 label=$2; shift 2
    log "$label"
    (cd "$tree" && PYTHONPATH=$tree:${SITE:-} /usr/bin/time -f "$label: %e s wall, %U user, %S sys, peak RSS %M KB" \
        timeout 120 python3 -m cli "$@") >> "$OUT/log.txt" 2>&1
    tail -1 "$OUT/log.txt"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/log.txt"
if [ "${TESTS:-1}" = 1 ]; then
    timeout ${TEST_S:-200} python3 -m pytest -m gpu -q -x -p no:cacheprovider -rP ${TESTFILES:-tests/test_sssp_near_far_gpu.py} \
        2>&1 | grep -E "relaxations|passed|failed|Error|error|assert" | tail -12 | tee -a "$OUT/log.txt"
fi
python3 -m cli synth -o "$D/w.zarr" --size 2048 --seed 1 -q
for tree in $BEFORE $HERE; do
    cli "$tree" "warm-up $tree" sssp "$D/w.zarr" --cell --source 1024,1024 --method incore --device gpu -q
done
for n in ${SIZES:-16384 32768}; do
    /usr/bin/time -f "synth $n: %e s wall" python3 -m cli synth -o "$D/s$n.zarr" --size $n --seed 1 -q 2>&1 | tail -1
    for tree in $BEFORE $HERE; do
        cli "$tree" "sssp $n $tree" sssp "$D/s$n.zarr" --cell --source $((n / 2)),$((n / 2)) --method incore --device gpu
        grep "^sssp/" "$OUT/log.txt" | tail -1  # its phases
    done
    rm -rf "$D/s$n.zarr"
done
