#!/bin/bash
# Issue 31's figures on the GPU machine: the 32768^2 fill / sssp / mst / flow as CLI runs in fresh processes
# (kernels compiled first on 2048^2), the fill right after synth (no pause: synth's pages as it left them),
# with nvCOMP's GPU zstd and without (TERRAIN_NVCOMP=0), flow under --memory 8GB, then bench_io at 8192^2. Run from the repository root with the package on PYTHONPATH; logs to $OUT.
# Steps: tests (the GPU zstd module first), warm-up, synth, runs, bench_io; each under its own timeout.
set -u
OUT=${OUT:-/tmp/io_out}; D=${SCRATCH:-/tmp/io_run}; mkdir -p "$OUT" "$D"
T="python3 -m cli"
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
timed() {  # label, env setting, CLI args...
    local label=$1 envs=$2; shift 2
    log "$label"
    /usr/bin/time -f "$label: %e s wall, %U user, %S sys, peak RSS %M KB" env $envs timeout 120 $T "$@" \
        >> "$OUT/log.txt" 2>&1
    tail -1 "$OUT/log.txt"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/log.txt"
python3 -c "from terrain_io import nvzstd; print('nvCOMP usable:', nvzstd.encoder() is not None)" 2>&1 | tee -a "$OUT/log.txt"
if [ "${TESTS:-1}" = 1 ]; then
    timeout 150 python3 -m pytest -m gpu -q -x -p no:cacheprovider ${TESTFILES:-tests/test_io_gpu_zstd.py tests/test_io_gpu_write.py} 2>&1 \
        | tail -5 | tee -a "$OUT/log.txt"
fi
$T synth -o "$D/w.zarr" --size 2048 --seed 1 -q
$T fill "$D/w.zarr" --device gpu -q && $T sssp "$D/w.zarr" --cell --source 1024,1024 --method incore --device gpu -q \
    && $T mst "$D/w.zarr" --device gpu -q && $T flow "$D/w.zarr" --device gpu -q
log "synth ${SIZE:-32768}"
/usr/bin/time -f "synth: %e s wall" $T synth -o "$D/s.zarr" --size ${SIZE:-32768} --seed 1 -q 2>&1 | tail -1
grep -E "^Dirty" /proc/meminfo | tee -a "$OUT/log.txt"
timed "fill nvcomp (first after synth)" "TERRAIN_NVCOMP=1" fill "$D/s.zarr" --device gpu
du -sm "$D/s.zarr/fill/"* | tee -a "$OUT/log.txt"
timed "fill cpu-encode" "TERRAIN_NVCOMP=0" fill "$D/s.zarr" --device gpu
du -sm "$D/s.zarr/fill/"* | tee -a "$OUT/log.txt"
timed "fill nvcomp (2)" "TERRAIN_NVCOMP=1" fill "$D/s.zarr" --device gpu
timed "sssp nvcomp" "TERRAIN_NVCOMP=1" sssp "$D/s.zarr" --cell --source $(( ${SIZE:-32768} / 2 )),$(( ${SIZE:-32768} / 2 )) \
    --method incore --device gpu
timed "flow --memory 8GB" "TERRAIN_NVCOMP=1" flow "$D/s.zarr" --device gpu --memory 8GB
timed "mst" "TERRAIN_NVCOMP=1" mst "$D/s.zarr" --device gpu
timed "mst (2)" "TERRAIN_NVCOMP=1" mst "$D/s.zarr" --device gpu
python3 -c "
import json; from terrain_io.store import TerrainStore
for k, a in TerrainStore.open('$D/s.zarr', mode='r').results().items():
    t = {x: a[x] for x in a if 'tim' in x or x in ('seconds', 'rounds')}
    if t: print(k, json.dumps(t)[:700])
" 2>&1 | tee -a "$OUT/log.txt"
rm -rf "$D/s.zarr"
log "bench_io"
timeout 150 python3 benchmarks/bench_io.py --size 8192 --reps 2 2>&1 | tee -a "$OUT/log.txt" | tail -8
