#!/bin/bash
# Issue 31's MST on the GPU machine: `terrain mst --device gpu` on `terrain synth --size 32768 --seed 1`, CLI
# wall of fresh processes (/usr/bin/time), the tree holding this script alternating with the tree in $MAIN
# (another checkout, or a tree unpacked in an ignored folder: `git archive <commit> | tar -x -C .main`), each
# run's in-process phases from the result's attributes, the decoded `mst/edges` compared (an md5 of its cells,
# shards read in threads: the shard files differ where one tree compresses on the GPU and the other on the CPU);
# kernels compiled first on a $WARM^2 store by each tree; before each run the dirty pages and the GPU's state. The previous `mst` result is removed before each run,
# outside its time. Then this tree's MST GPU tests ($TESTS: 1, or the pytest arguments). The dependencies on
# PYTHONPATH (each tree is put before them; the `.site-ox` tree brings nvCOMP's zstd); logs to $OUT. From a
# checkout, with a branch's tree unpacked in .wt beside it:
#     OUT=/tmp/out MAIN=. RUNS=2 .wt/benchmarks/run_mst_h100.sh
# (a dry run without a GPU: DEVICE=cpu SIZE=4096 WARM=1024 TESTS=0). KEEP_STORE=1: the store is left in
# $SCRATCH/s.zarr for what comes next (its last `mst` result in it).
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
PYTHONPATH="$HERE:$DEPS" python3 -c "from terrain_io import nvzstd; print('nvCOMP zstd loaded:', nvzstd._lib() is not None)" \
    2>&1 | tee -a "$OUT/log.txt"
echo "trees: ${NAMES[*]} = ${TREES[*]}" | tee -a "$OUT/log.txt"
DEV=${DEVICE:-gpu}
if [ "${TESTS:-1}" != 0 ]; then
    log "tests"
    [ "${TESTS:-1}" = 1 ] && TESTS="tests/test_mst_incore_gpu.py tests/test_grid_mst_gpu.py"
    (cd "$HERE" && PYTHONPATH="$HERE:$DEPS" timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu -q -x -p no:cacheprovider \
        $TESTS > "$OUT/tests.log" 2>&1)
    tail -5 "$OUT/tests.log" | tee -a "$OUT/log.txt"
fi
cli "$HERE" synth -o "$D/w.zarr" --size "${WARM:-2048}" --seed 1 -q
for i in "${!TREES[@]}"; do
    t=${TREES[$i]}
    /usr/bin/time -f "warm-up ${NAMES[$i]}: %e s" timeout 150 bash -c "$(declare -f cli); DEPS='$DEPS'; \
        cli '$t' mst '$D/w.zarr' --device $DEV -q && cli '$t' mst '$D/w.zarr' --device $DEV -q" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
done
log "synth ${SIZE:-32768}"
/usr/bin/time -f "synth: %e s wall" timeout 90 bash -c "$(declare -f cli); DEPS='$DEPS'; cli '$HERE' synth -o "$D/s.zarr" --size ${SIZE:-32768} --seed 1 -q" 2>&1 \
    | tail -1 | tee -a "$OUT/log.txt"
sync
# ORDER: the runs, by tree name (default: RUNS rounds of base, this); the cells' md5 after each tree's first
ORDER=${ORDER:-$(for r in $(seq "${RUNS:-2}"); do echo -n "${NAMES[*]} "; done)}
declare -A seen
run=0
for name in $ORDER; do
    for i in "${!TREES[@]}"; do
        [ "${NAMES[$i]}" = "$name" ] || continue
        t=${TREES[$i]}
        seen[$name]=$(( ${seen[$name]:-0} + 1 )); run=${seen[$name]}
        rm -rf "$D/s.zarr/mst"; sync
        label="mst ${NAMES[$i]} run $run"
        echo "$label before: $(grep -E '^(Dirty|Writeback):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')$(nvidia-smi \
            --query-gpu=pstate,clocks.sm,temperature.gpu,power.draw --format=csv,noheader 2>/dev/null)" | tee -a "$OUT/log.txt"
        /usr/bin/time -f "$label: %e s wall, %U user, %S sys, peak RSS %M KB" timeout 60 bash -c \
            "$(declare -f cli); DEPS='$DEPS'; cli '$t' mst '$D/s.zarr' --device $DEV -q" >> "$OUT/log.txt" 2>&1
        tail -1 "$OUT/log.txt"
        PYTHONPATH="$HERE:$DEPS" python3 -c "
import concurrent.futures, hashlib, json
import numpy as np
from terrain_io.store import TerrainStore
st = TerrainStore.open('$D/s.zarr', mode='r')
a = st.results()['mst']
print('$label', json.dumps({k: a.get(k) for k in ('seconds', 'edge_count', 'trees', 'total_weight_exact', 'batch_tiles',
                                                   'merge_decisions', 'timings')}))
if $run == 1 and '${MD5:-1}' == '1':
    bits = np.empty(st.shape, np.uint8)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda w: st.read(w, 'mst/edges', out=bits[w.slices]), st.shards()))
    print('$label cells md5', hashlib.md5(bits).hexdigest())
" 2>&1 | tee -a "$OUT/log.txt"
    done
done
[ "${KEEP_STORE:-0}" = 1 ] || rm -rf "$D/s.zarr"
