#!/bin/bash
# Issue 31's MST on the GPU machine: `terrain mst --device gpu` on `terrain synth --size 32768 --seed 1`, CLI
# wall of fresh processes (/usr/bin/time), the tree holding this script alternating with the tree in $MAIN
# (another checkout, or a tree unpacked in an ignored folder: `git archive <commit> | tar -x -C .main`), each
# run's in-process phases from the result's attributes, the shard files compared; kernels compiled first on a
# 4096^2 store (4 shards: the merges above the shards too) by each tree. The previous `mst` result is removed
# before each run, outside its time. Then this tree's MST GPU tests. The dependencies on PYTHONPATH (each tree
# is put before them); logs to $OUT. From a checkout, with a branch's tree unpacked in .main beside it:
#     OUT=/tmp/out MAIN=. RUNS=2 .main/benchmarks/run_mst_h100.sh
# (a dry run without a GPU: DEVICE=cpu SIZE=4096 WARM=1024 TESTS=0)
set -u
OUT=${OUT:-/tmp/mst_out}; D=${SCRATCH:-/tmp/mst_run}; mkdir -p "$OUT" "$D"
HERE=$(cd "$(dirname "$0")/.." && pwd); DEPS=${PYTHONPATH:-}
TREES=("$HERE"); NAMES=(this); [ -n "${MAIN:-}" ] && TREES=("$(cd "$MAIN" && pwd)" "$HERE") && NAMES=(base this)
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
cli() {  # tree, CLI args...
    local tree=$1; shift
    (cd "$tree" && PYTHONPATH="$tree:$DEPS" python3 -m cli "$@")
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/log.txt"
echo "trees: ${NAMES[*]} = ${TREES[*]}" | tee -a "$OUT/log.txt"
DEV=${DEVICE:-gpu}
cli "$HERE" synth -o "$D/w.zarr" --size "${WARM:-4096}" --seed 1 -q
for i in "${!TREES[@]}"; do
    t=${TREES[$i]}
    /usr/bin/time -f "warm-up ${NAMES[$i]}: %e s" timeout 150 bash -c "$(declare -f cli); DEPS='$DEPS'; \
        cli '$t' mst '$D/w.zarr' --device $DEV -q && cli '$t' mst '$D/w.zarr' --device $DEV -q" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
done
log "synth ${SIZE:-32768}"
/usr/bin/time -f "synth: %e s wall" timeout 90 bash -c "$(declare -f cli); DEPS='$DEPS'; cli '$HERE' synth -o "$D/s.zarr" --size ${SIZE:-32768} --seed 1 -q" 2>&1 \
    | tail -1 | tee -a "$OUT/log.txt"
sync
for run in $(seq "${RUNS:-2}"); do
    for i in "${!TREES[@]}"; do
        t=${TREES[$i]}
        rm -rf "$D/s.zarr/mst"; sync
        label="mst ${NAMES[$i]} run $run"
        /usr/bin/time -f "$label: %e s wall, %U user, %S sys, peak RSS %M KB" timeout 60 bash -c \
            "$(declare -f cli); DEPS='$DEPS'; cli '$t' mst '$D/s.zarr' --device $DEV -q" >> "$OUT/log.txt" 2>&1
        tail -1 "$OUT/log.txt"
        PYTHONPATH="$HERE:$DEPS" python3 -c "
import json; from terrain_io.store import TerrainStore
a = TerrainStore.open('$D/s.zarr', mode='r').results()['mst']
print('$label', json.dumps({k: a[k] for k in ('seconds', 'edge_count', 'total_weight_exact', 'merge_decisions', 'timings')}))
" 2>&1 | tee -a "$OUT/log.txt"
        (cd "$D/s.zarr/mst/edges" && find . -type f -path './c/*' | sort | xargs cat | md5sum | sed "s|^|$label shard files: |") \
            | tee -a "$OUT/log.txt"
    done
done
rm -rf "$D/s.zarr"
[ "${TESTS:-1}" = 1 ] || exit 0
log "tests"
cd "$HERE" && PYTHONPATH="$HERE:$DEPS" timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_grid_mst_gpu.py 2>&1 \
    | tail -5 | tee -a "$OUT/log.txt"
