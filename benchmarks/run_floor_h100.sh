#!/bin/bash
# Issue 31's pipelines against their I/O floor on the GPU machine: bench_io at 8192^2 (the floor's rates),
# then `terrain fill`, `sssp --method incore`, `flow --memory 8GB` and `mst` on `terrain synth --size $SIZE
# --seed 1`, `--device gpu`, CLI wall of fresh processes (/usr/bin/time), the trees of $TREES alternating in
# $ORDER (TREES="base=DIR this=DIR"; default: this tree alone), each run's in-process phases from the result's
# attributes, the dirty pages and the GPU's state before it (the command's earlier result removed and the
# dirty pages synced first, outside its time, unless the step says :keep); kernels compiled first on a 2048^2 store by each
# tree (the commands of $WARM_CMDS, default all four); the fill twice first (the GPU wakes, synth's pages settle; both
# kept; FILLS=0: none). $PROBE=1: one more sssp and flow
# of the last tree with their wall split into the interpreter's start, the command and its exit (a sitecustomize
# that notes the time at start and last at exit), and nvCOMP's encode by chunks a call
# (probe_gpu_encode.py on their results); $TRACE=1: one more sssp of the last tree traced (trace_sssp.txt). Dependencies on PYTHONPATH (each tree put before them); logs
# to $OUT. From a checkout, a branch's tree unpacked in .wt-x beside it:
#     OUT=/tmp/out TREES="base=. this=.wt-x" .wt-x/benchmarks/run_floor_h100.sh
set -u
OUT=${OUT:-/tmp/floor_out}; D=${SCRATCH:-/tmp/floor_run}; mkdir -p "$OUT" "$D/hook"
HERE=$(cd "$(dirname "$0")/.." && pwd); DEPS=${PYTHONPATH:-}; N=${SIZE:-32768}
declare -A TREE; NAMES=()
for kv in ${TREES:-this=$HERE}; do TREE[${kv%%=*}]=$(cd "${kv#*=}" && pwd); NAMES+=("${kv%%=*}"); done
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
cli() {  # tree name, CLI args...
    local t=${TREE[$1]}; shift
    (cd "$t" && PYTHONPATH="$t:$DEPS" python3 -m cli "$@")
}
DEV=${DEVICE:-gpu}  # (a dry run without a GPU: DEVICE=cpu SIZE=1024 WARM=512 BENCH_IO=0)
declare -A ARGS=([fill]="fill @ --device $DEV" [sssp]="sssp @ --cell --source $((N / 2)),$((N / 2)) --method incore --device $DEV"
                 [flow]="flow @ --device $DEV --memory 8GB" [mst]="mst @ --device $DEV")
declare -A GROUP=([fill]=fill [sssp]=sssp [flow]=flow [mst]=mst)
timed() {  # command, tree name, label; the command's earlier result removed first (KEEP=1: replaced by the run)
    local cmd=$1 name=$2 label="$1 $2 ${3:-}" t=${TREE[$2]}
    [ "${KEEP:-0}" = 1 ] || { rm -rf "$D/s.zarr/${GROUP[$cmd]}"; sync; }
    echo "$label before: $(grep -E '^Dirty:' /proc/meminfo | tr -s ' ') $(nvidia-smi \
        --query-gpu=pstate,clocks.sm,power.draw --format=csv,noheader 2>/dev/null)" >> "$OUT/log.txt"
    date +%s.%N > "$D/launch"
    local lines; lines=$(wc -l < "$OUT/log.txt")
    (cd "$t" && PYTHONPATH="${HOOK:-}$t:$DEPS" /usr/bin/time -f "$label: %e s wall, %U user, %S sys, peak RSS %M KB" \
        timeout 90 python3 -m cli ${ARGS[$cmd]//@/$D/s.zarr}) >> "$OUT/log.txt" 2>&1
    date +%s.%N > "$D/end"
    tail -1 "$OUT/log.txt"
    tail -n +$((lines + 1)) "$OUT/log.txt" | grep -E "terrain: (note|error|internal error)" | sed 's/^/   /'  # (a note: another way taken)
    (cd "$t" && PYTHONPATH="$t:$DEPS" python3 -c "
import json; from terrain_io.store import TerrainStore
for k, a in TerrainStore.open('$D/s.zarr', mode='r').results().items():
    if k.split('/')[0] == '${GROUP[$cmd]}' and 'timings' in a: print('  ', k, json.dumps(a['timings']))
") 2>&1 | tail -2 | tee -a "$OUT/log.txt"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/log.txt"
echo "trees: $(for n in "${NAMES[@]}"; do echo -n "$n=${TREE[$n]} "; done)" | tee -a "$OUT/log.txt"
cli "${NAMES[0]}" synth -o "$D/w.zarr" --size "${WARM:-2048}" --seed 1 -q
WARM_CMDS=${WARM_CMDS:-"'fill' 'sssp --cell --source 1024,1024 --method incore' 'flow --memory 8GB' 'mst'"}
for n in "${NAMES[@]}"; do
    /usr/bin/time -f "warm-up $n: %e s" timeout 150 bash -c "$(declare -f cli); $(declare -p TREE); DEPS='$DEPS'
        for c in $WARM_CMDS; do
            cli $n \$c '$D/w.zarr' --device $DEV -q || echo \"warm-up failed: \$c\"; done" 2>&1 | tail -3 | tee -a "$OUT/log.txt"
done
PYTHONPATH="${TREE[${NAMES[-1]}]}:$DEPS" python3 -c "from terrain_io import nvzstd; print('nvCOMP usable:', \
    nvzstd.encoder() is not None, nvzstd.decoder() is not None)" 2>&1 | tee -a "$OUT/log.txt"
[ "${BENCH_IO:-1}" = 1 ] && log "bench_io" && (cd "${TREE[${NAMES[-1]}]}" && PYTHONPATH="${TREE[${NAMES[-1]}]}:$DEPS" timeout 120 python3 benchmarks/bench_io.py \
    --size 8192 --reps 3) > "$OUT/bench_io.log" 2>&1
grep -E "^\|" "$OUT/bench_io.log" | tee -a "$OUT/log.txt"
log "synth $N"
/usr/bin/time -f "synth: %e s wall" timeout 90 bash -c "$(declare -f cli); $(declare -p TREE); DEPS='$DEPS'
    cli ${NAMES[0]} synth -o '$D/s.zarr' --size $N --seed 1 -q" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
du -sm "$D/s.zarr/elevation" | tee -a "$OUT/log.txt"
if [ "${FILLS:-2}" != 0 ]; then  # (FILLS=0: none, for a call that has no time for them)
    timed fill "${NAMES[0]}" "(first after synth)"
    KEEP=1 timed fill "${NAMES[0]}" "(second, replacing the first)"
    du -sm "$D/s.zarr/fill/"* | tee -a "$OUT/log.txt"
fi
for step in ${ORDER:-sssp:this flow:this mst:this}; do  # (command:tree, or command:tree:keep)
    IFS=: read -r cmd name keep <<< "$step"
    KEEP=$([ "$keep" = keep ] && echo 1 || echo 0) timed "$cmd" "$name" "${keep:+(replacing the last result)}"
done
if [ "${TRACE:-0}" = 1 ]; then  # one more sssp of the last tree under benchmarks/trace_cli.py (threads' stacks)
    t=${TREE[${NAMES[-1]}]}; rm -rf "$D/s.zarr/sssp"; sync
    (cd "$t" && PYTHONPATH="$t:$DEPS" timeout 60 python3 benchmarks/trace_cli.py --every 2 --merge 20 -- \
        ${ARGS[sssp]//@/$D/s.zarr}) > "$OUT/trace_sssp.txt" 2>&1
    log "sssp ${NAMES[-1]} traced: $(grep 'main returned' "$OUT/trace_sssp.txt")"
fi
du -sm "$D/s.zarr/sssp/"*/{distance,predecessor} "$D/s.zarr/flow/"{direction,accumulation} "$D/s.zarr/mst/edges" 2>/dev/null | tee -a "$OUT/log.txt"
if [ "${PROBE:-0}" = 1 ]; then
    cat > "$D/hook/sitecustomize.py" <<'EOF'
import atexit, sys, time
_t0 = time.time()
atexit.register(lambda: print(f"probe: started {_t0:.3f}, atexit {time.time():.3f}", file=sys.stderr))
EOF
    for n in "${NAMES[-1]}"; do
        for cmd in sssp flow; do
            HOOK="$D/hook:" timed "$cmd" "$n" "(probed)"
            python3 -c "
import re; s = open('$OUT/log.txt').read().rsplit('probe: started', 1)[1]; a, b = map(float, re.findall(r'[\d.]+', s)[:2])
t0, t1 = (float(open('$D/' + f).read()) for f in ('launch', 'end'))
print(f'   $cmd $n: launch->start {a - t0:.2f} s, start->atexit {b - a:.2f} s, atexit->end {t1 - b:.2f} s')
" | tee -a "$OUT/log.txt"
        done
    done
    log "nvCOMP's encode by chunks a call"
    t=${TREE[${NAMES[-1]}]}; r=sssp/r$((N / 2))c$((N / 2))
    (cd "$t" && PYTHONPATH="$t:$DEPS" timeout 90 python3 benchmarks/probe_gpu_encode.py "$D/s.zarr" $r/distance \
        $r/predecessor flow/accumulation flow/direction) 2>&1 | tail -16 | tee -a "$OUT/log.txt"
    log "imports: python3 -m cli --help"
    for n in "${NAMES[@]}"; do
        (cd "${TREE[$n]}" && PYTHONPATH="${TREE[$n]}:$DEPS" /usr/bin/time -f "--help $n: %e s" python3 -m cli --help \
            > /dev/null) 2>&1 | tail -1 | tee -a "$OUT/log.txt"
    done
fi
rm -rf "$D/s.zarr"
