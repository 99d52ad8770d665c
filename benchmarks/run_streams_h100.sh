#!/bin/bash
# Issue 30's last target, `terrain streams STORE --threshold 1000 -o x.gpkg --device gpu` at SIZE^2 <= 5 s CLI wall
# in a fresh process, in one device call: a SIZE^2 store (synth, fill and flow on the GPU), every kernel compiled on
# a 512^2 store by each tree, then the CLI walls of this tree and of BASE alternating (bench_gpu_read.py --cli,
# REPEAT rounds), then TRACES runs of each tree under trace_cli.py (its threads sampled) and one under
# `python -X importtime`. TESTS: GPU tests of this tree run first. `.site-ox` tree unpacked at SITE; logs to $OUT.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/streams_out}; W=${SCRATCH:-/tmp/streams_run}; SIZE=${SIZE:-16384}; SITE=${SITE:-/tmp/site}
BASE=${BASE:-}; REPEAT=${REPEAT:-3}; TRACES=${TRACES:-1}
mkdir -p "$OUT" "$W"
export PYTHONPATH=$HERE:$SITE
unset PYTHONDONTWRITEBYTECODE
LOG=$OUT/streams.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"
if [ -n "${TESTS:-}" ]; then
    # shellcheck disable=SC2086
    (cd "$HERE" && timeout -k 5 "${TESTS_S:-120}" python3 -m pytest -m gpu -q -p no:cacheprovider $TESTS \
        > "$OUT/gpu_tests.log" 2>&1)
    tail -3 "$OUT/gpu_tests.log" | tee -a "$LOG"; echo "tests done at $SECONDS s" | tee -a "$LOG"
fi
cd "$W" || exit 1
for s in 512:warm "$SIZE":s; do
    n=${s%%:*}; st=$W/${s##*:}$n.zarr
    [ -e "$st/flow" ] && continue
    t0=$SECONDS
    timeout -k 5 120 bash -c "python3 -m cli synth -o '$st' --size $n -q && python3 -m cli fill '$st' --device gpu -q \
        && python3 -m cli flow '$st' --device gpu -q" || exit 1
    echo "store $n^2: synth, fill, flow $((SECONDS - t0)) s" | tee -a "$LOG"
done
TREES=this=$HERE${BASE:+,base=$BASE}
timeout -k 5 "${WARM_S:-90}" python3 "$HERE/benchmarks/bench_gpu_read.py" "$W/warm512.zarr" --cli "$TREES" --commands streams \
    --repeat 1 > /dev/null 2>> "$LOG"
echo "CLI at $SECONDS s" | tee -a "$LOG"
timeout -k 5 "${CLI_S:-150}" python3 "$HERE/benchmarks/bench_gpu_read.py" "$W/s$SIZE.zarr" --cli "$TREES" \
    --commands streams --repeat "$REPEAT" 2>&1 | tee -a "$LOG"
echo "traces at $SECONDS s" | tee -a "$LOG"
args=(streams "$W/s$SIZE.zarr" --threshold 1000 -o "$W/t.gpkg" --overwrite --device gpu -q)
for k in $(seq "$TRACES"); do
    for tree in ${TREES//,/ }; do
        name=${tree%%=*}; root=${tree#*=}
        t0=$(date +%s.%N)
        PYTHONPATH=$root:$SITE timeout -k 5 40 python3 "$HERE/benchmarks/trace_cli.py" --every 2 --merge 25 -- "${args[@]}" \
            2> "$OUT/trace_${name}_$k.txt"
        echo "trace $name $k: wall $(echo "$(date +%s.%N) - $t0" | bc) s; $(head -1 "$OUT/trace_${name}_$k.txt")" | tee -a "$LOG"
    done
done
for tree in ${TREES//,/ }; do
    name=${tree%%=*}; root=${tree#*=}
    PYTHONPATH=$root:$SITE timeout -k 5 40 python3 -X importtime -m cli "${args[@]}" 2> "$OUT/importtime_$name.txt"
done
echo "done at $SECONDS s" | tee -a "$LOG"
