#!/bin/bash
# Issue 31's last target on the GPU machine: `terrain sssp --cell --source N/2,N/2 --method incore --device gpu`
# on `terrain synth --size $SIZE --seed 1` against its I/O floor, the trees of $TREES alternating ("base=DIR
# this=DIR", as run_floor_h100.sh), CLI wall of fresh processes (/usr/bin/time; the earlier result removed and the
# dirty pages synced first, outside the time), the wall split into the interpreter's start, the command and its
# exit (a sitecustomize noting the time at start and at exit), phases from the result's timings; bench_io for
# the floor's rates (after synth); then benchmarks/probe_sssp_write.py (the write's encode by bands a call),
# TRACE=1: one run under benchmarks/trace_cli.py, EXIT_PROBE=1: a process's exit with GPU memory and pinned
# buffers, and the GPU tests in $TESTS, within what is left of $BUDGET seconds. Logs to $OUT.
#     OUT=/tmp/out TREES="base=. this=.wt-x" .wt-x/benchmarks/run_sssp_floor_h100.sh
set -u
T0=$(date +%s); OUT=${OUT:-/tmp/sssp_floor}; D=${SCRATCH:-/tmp/sssp_floor_run}; mkdir -p "$OUT" "$D/hook"
DEPS=${PYTHONPATH:-}; N=${SIZE:-32768}; RUNS=${RUNS:-2}
declare -A TREE; NAMES=()
for kv in ${TREES:-this=$(cd "$(dirname "$0")/.." && pwd)}; do TREE[${kv%%=*}]=$(cd "${kv#*=}" && pwd); NAMES+=("${kv%%=*}"); done
LAST=${NAMES[-1]}
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
cli() { local t=${TREE[$1]}; shift; (cd "$t" && PYTHONPATH="$t:$DEPS" python3 -m cli "$@"); }
cat > "$D/hook/sitecustomize.py" <<'EOF'
import atexit, sys, time
_t0 = time.time()
atexit.register(lambda: print(f"probe: started {_t0:.3f}, atexit {time.time():.3f}", file=sys.stderr))
EOF
run() {  # tree name, label
    local name=$1 t=${TREE[$1]} label="sssp $1 ${2:-}"
    rm -rf "$D/s.zarr/sssp"; sync
    echo "$label before: $(grep -E '^Dirty:' /proc/meminfo | tr -s ' ') $(nvidia-smi \
        --query-gpu=pstate,clocks.sm,power.draw --format=csv,noheader 2>/dev/null)" >> "$OUT/log.txt"
    local t0; t0=$(date +%s.%N)
    (cd "$t" && PYTHONPATH="$D/hook:$t:$DEPS" /usr/bin/time -f "$label: %e s wall, %U user, %S sys, peak RSS %M KB" \
        timeout 60 python3 -m cli sssp "$D/s.zarr" --cell --source $((N / 2)),$((N / 2)) --method incore --device gpu) \
        > "$D/run.txt" 2>&1
    local t1; t1=$(date +%s.%N)
    grep -v "^probe:" "$D/run.txt" | tail -2 >> "$OUT/log.txt"; tail -1 "$D/run.txt"
    python3 -c "
import re; s = open('$D/run.txt').read().split('probe: started', 1)[1]; a, b = map(float, re.findall(r'[\d.]+', s)[:2])
print(f'   launch->start {a - $t0:.2f} s, start->atexit {b - a:.2f} s, atexit->end {$t1 - b:.2f} s')" | tee -a "$OUT/log.txt"
    (cd "$t" && PYTHONPATH="$t:$DEPS" python3 -c "
import json; from terrain_io.store import TerrainStore
for k, a in TerrainStore.open('$D/s.zarr', mode='r').results().items():
    if k.startswith('sssp/') and 'timings' in a: print('  ', k, json.dumps(a['timings']))") 2>&1 | tail -1 | tee -a "$OUT/log.txt"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/log.txt"
echo "trees: $(for n in "${NAMES[@]}"; do echo -n "$n=${TREE[$n]} "; done)" | tee -a "$OUT/log.txt"
log "synth $N (beside the warm-ups)"
( /usr/bin/time -f "synth: %e s wall" timeout 120 bash -c "$(declare -f cli); $(declare -p TREE); DEPS='$DEPS'
    cli ${NAMES[0]} synth -o '$D/s.zarr' --size $N --seed 1 -q" > "$D/synth.txt" 2>&1 ) &
SYNTH=$!
cli "${NAMES[0]}" synth -o "$D/w.zarr" --size 2048 --seed 1 -q
for n in "${NAMES[@]}"; do
    /usr/bin/time -f "warm-up $n: %e s" timeout 120 bash -c "$(declare -f cli); $(declare -p TREE); DEPS='$DEPS'
        cli $n sssp '$D/w.zarr' --cell --source 1024,1024 --method incore --device gpu -q" 2>&1 | tail -2 | tee -a "$OUT/log.txt"
done
wait $SYNTH; tail -1 "$D/synth.txt" | tee -a "$OUT/log.txt"; du -sm "$D/s.zarr/elevation" | tee -a "$OUT/log.txt"
PYTHONPATH="${TREE[$LAST]}:$DEPS" python3 -c "from terrain_io import nvzstd; print('nvCOMP usable:', \
    nvzstd.encoder() is not None, nvzstd.decoder() is not None)" 2>&1 | tee -a "$OUT/log.txt"
if [ "${BENCH_IO:-1}" = 1 ]; then
    log "bench_io"
    (cd "${TREE[$LAST]}" && PYTHONPATH="${TREE[$LAST]}:$DEPS" timeout 100 python3 benchmarks/bench_io.py --size 8192 --reps 2) \
        > "$OUT/bench_io.log" 2>&1
    grep -E "^\|" "$OUT/bench_io.log" | tee -a "$OUT/log.txt"
fi
log "sssp $N, compiled first (the 64-bit-indexed kernels) by a run of $LAST"
run "$LAST" "(compiling)"
for i in $(seq "$RUNS"); do for n in "${NAMES[@]}"; do run "$n"; done; done
du -sm "$D/s.zarr/sssp/"*/* | tee -a "$OUT/log.txt"
log "probe_sssp_write ($LAST)"
(cd "${TREE[$LAST]}" && PYTHONPATH="${TREE[$LAST]}:$DEPS" timeout 90 python3 benchmarks/probe_sssp_write.py "$D/s.zarr" \
    "sssp/r$((N / 2))c$((N / 2))" ${PER_CALL:-1 2 4}) 2>&1 | tail -16 | tee -a "$OUT/log.txt"
if [ "${TRACE:-0}" = 1 ]; then
    log "trace_cli ($LAST)"; rm -rf "$D/s.zarr/sssp"; sync
    (cd "${TREE[$LAST]}" && PYTHONPATH="${TREE[$LAST]}:$DEPS" timeout 60 python3 benchmarks/trace_cli.py --every 2 --merge 20 -- \
        sssp "$D/s.zarr" --cell --source $((N / 2)),$((N / 2)) --method incore --device gpu) > "$OUT/trace.txt" 2>&1
    { grep "^trace:" "$OUT/trace.txt"; awk '/^-- thread MainThread/{f=1; print; next} /^-- thread/{f=0} f' "$OUT/trace.txt" \
        | head -40; } | tee -a "$OUT/log.txt"
fi
rm -rf "$D/s.zarr"
[ "${EXIT_PROBE:-0}" = 1 ] && log "a process's exit with the SSSP's GPU memory (20 GiB in CuPy's pool) and pinned frames (1.6 GiB)"
for mode in $([ "${EXIT_PROBE:-0}" = 1 ] && echo plain pool pinned both both_os_exit); do
    python3 -c "
import os, sys, time, cupy as cp, cupyx
m = '$mode'; cp.cuda.runtime.free(0)
keep = [cp.empty(20 << 30, cp.uint8) for _ in range(m in ('pool', 'both', 'both_os_exit'))]
keep += [cupyx.empty_pinned(1600 << 20, 'u1') for _ in range(m in ('pinned', 'both', 'both_os_exit'))]
cp.cuda.Device().synchronize(); print(f'{time.time():.3f}', flush=True)
os._exit(0) if m.endswith('os_exit') else None" > "$D/exit.txt" 2>&1; end=$(date +%s.%N)
    python3 -c "print(f'   exit, $mode: {$end - float(open(\"$D/exit.txt\").read().split()[0]):.3f} s')" | tee -a "$OUT/log.txt"
done
LEFT=$(( ${BUDGET:-340} - $(date +%s) + T0 ))
log "tests ($LEFT s left): ${TESTS:-}"
if [ -n "${TESTS:-}" ] && [ "$LEFT" -gt 30 ]; then
    (cd "${TREE[$LAST]}" && PYTHONPATH="${TREE[$LAST]}:$DEPS" timeout $((LEFT - 10)) python3 -m pytest -q -p no:cacheprovider \
        ${TESTS}) > "$OUT/tests.log" 2>&1
    tail -5 "$OUT/tests.log" | tee -a "$OUT/log.txt"
fi
log "done at $(( $(date +%s) - T0 )) s"
