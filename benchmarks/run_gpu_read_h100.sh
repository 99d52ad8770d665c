#!/bin/bash
# Issue 30's reads onto the GPU in one device call (~300-400 s of wall at 16384^2): this tree's GPU tests
# of the reads (they compile the kernels), a SIZE^2 store made by this tree (synth, fill and flow on the
# GPU), the CLI walls of streams -o, hand and flow of this tree and of BASE (the baseline tree, e.g. main),
# alternating, then bench_gpu_read.py's reads in one process (the CPU's decode and pageable copies against
# nvCOMP's decode on the GPU); TESTS_LAST=1: the tests at the end instead; TRACES=N: N runs of streams -o a tree
# under trace_cli.py and one under python -X importtime (where a fresh process's time goes); READS=0: no reads. Run from anywhere with the `.site-ox` tree (pyogrio and nvCOMP, see
# run_hydro_h100.sh) unpacked at SITE; logs and JSON lines go to $OUT.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpu_read_out}; W=${SCRATCH:-/tmp/gpu_read_run}; SIZE=${SIZE:-16384}; SITE=${SITE:-/tmp/site}
BASE=${BASE:-}; REPEAT=${REPEAT:-2}; COMMANDS=${COMMANDS:-streams,hand,flow}
mkdir -p "$OUT" "$W"
export PYTHONPATH=$HERE:$SITE
unset PYTHONDONTWRITEBYTECODE  # bytecode cached, as a pip install leaves it
LOG=$OUT/read.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"
python3 -c "from terrain_io import nvzstd; print('nvCOMP zstd loaded:', nvzstd._lib() is not None)" 2>&1 | tee -a "$LOG"
TESTS=${TESTS:-tests/test_gpu_read.py tests/test_io_gpu_write.py::test_flow_and_hydrology_on_the_gpu_store_the_cpus_cells}
gpu_tests() {
    # shellcheck disable=SC2086  # (TESTS: a list)
    (cd "$HERE" && timeout -k 5 "${TESTS_S:-100}" python3 -m pytest -m gpu -q -p no:cacheprovider $TESTS \
        > "$OUT/gpu_tests.log" 2>&1)
    tail -3 "$OUT/gpu_tests.log" | tee -a "$LOG"; echo "tests done at $SECONDS s" | tee -a "$LOG"
}
[ -z "${TESTS_LAST:-}" ] && gpu_tests
cd "$W" || exit 1
for s in 512:warm "$SIZE":s; do  # the small store compiles every kernel the commands below run, in both trees
    n=${s%%:*}; st=$W/${s##*:}$n.zarr
    [ -e "$st/flow" ] && continue
    t0=$SECONDS
    timeout -k 5 90 bash -c "python3 -m cli synth -o '$st' --size $n -q && python3 -m cli fill '$st' --device gpu -q \
        && python3 -m cli flow '$st' --device gpu -q" || exit 1
    echo "store $n^2: synth, fill, flow $((SECONDS - t0)) s" | tee -a "$LOG"
done
TREES=this=$HERE${BASE:+,base=$BASE}${MORE:+,$MORE}  # MORE: NAME=TREE,... more trees beside them
echo "warm-up at $SECONDS s" | tee -a "$LOG"
timeout -k 5 "${WARM_S:-50}" python3 "$HERE/benchmarks/bench_gpu_read.py" "$W/warm512.zarr" --cli "$TREES" --commands "$COMMANDS" \
    --repeat 1 > /dev/null 2>> "$LOG"
echo "CLI at $SECONDS s" | tee -a "$LOG"
timeout -k 5 "${CLI_S:-120}" python3 "$HERE/benchmarks/bench_gpu_read.py" "$W/s$SIZE.zarr" --cli "$TREES" \
    --commands "$COMMANDS" --repeat "$REPEAT" 2>&1 | tee -a "$LOG"
if [ "${TRACES:-0}" -gt 0 ]; then  # streams -o of each tree under trace_cli.py (its threads sampled), then -X importtime
    echo "traces at $SECONDS s" | tee -a "$LOG"
    args=(streams "$W/s$SIZE.zarr" --threshold 1000 -o "$W/t.gpkg" --overwrite --device gpu -q)
    for k in $(seq "$TRACES"); do
        for tree in ${TREES//,/ }; do
            name=${tree%%=*}; root=${tree#*=}; t0=$(date +%s.%N)
            PYTHONPATH=$root:$SITE timeout -k 5 40 python3 "$HERE/benchmarks/trace_cli.py" -- "${args[@]}" \
                2> "$OUT/trace_${name}_$k.txt"
            echo "trace $name $k: CLI wall $(python3 -c "print(round($(date +%s.%N) - $t0, 3))") s;" \
                "$(head -1 "$OUT/trace_${name}_$k.txt")" "$(grep "exit's frees" "$OUT/trace_${name}_$k.txt")" | tee -a "$LOG"
        done
    done
    for tree in ${TREES//,/ }; do
        PYTHONPATH=${tree#*=}:$SITE timeout -k 5 40 python3 -X importtime -m cli "${args[@]}" 2> "$OUT/importtime_${tree%%=*}.txt"
    done
fi
if [ "${READS:-1}" = 1 ]; then
    echo "reads at $SECONDS s" | tee -a "$LOG"
    timeout -k 5 "${READS_S:-60}" python3 "$HERE/benchmarks/bench_gpu_read.py" "$W/s$SIZE.zarr" --repeat "${READ_REPEAT:-1}" \
        2>&1 | tee -a "$LOG"
fi
[ -n "${TESTS_LAST:-}" ] && gpu_tests
exit 0
