#!/usr/bin/env bash
# Usage, on a host of 2 GPUs or more, from the repository root: OUT=DIR [BUDGET=seconds] [PART=1|2] bash benchmarks/multigpu_window.sh
# (CPU rehearsal: TESTS="" BENCH_ARGS="--device cpu --tile 32 --shard 2 --memory 1GB" BIG=512 MID=512 SMALL=256 HUGE=1024
#  UNIT=128 CUDA_VISIBLE_DEVICES=0,1). multigpu's device windows (issue 33), each one call:
# - PART=1: a warm-up that compiles the kernels, then at 32768^2 the MST on every number of GPUs up to 4 and in one
#   process, at 16384^2 the SSSP shard method on up to 4 GPUs, then `pytest -m multigpu` beside the synth of the
#   65536^2 store for part 2 (left in /tmp for the next call on the same warm machine).
#   Writes host.txt, log.txt, big.{txt,json}, mid.{txt,json}, pytest.txt under $OUT.
# - PART=2: 65536^2 (4.3G cells) on 2 GPUs: MST, fill, flow, the SSSP shard method (`surface` weights), each end to
#   end with peak RSS and GPU memory per worker (huge.{txt,json}); the store is made first if it is not there.
set -u
T0=$(date +%s)
BUDGET=${BUDGET:-200}
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(el) )); }
B="python3 benchmarks/bench_multigpu.py ${BENCH_ARGS:-}"
{ nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id --format=csv; nproc; free -g; df -h /tmp; } > $OUT/host.txt 2>&1
NGPU=$(python3 -c "from terrain_io import parallel; print(len(parallel.visible_gpus()))" 2>/dev/null || echo 2)
upto() {  # STEP: STEP:cudaN,...,STEP:cuda1 for the GPUs this host has (4, 2, 1)
    local runs=""; for n in 4 2 1; do [ "$n" -le "$NGPU" ] && runs="$runs,$1:cuda$n"; done; echo "${runs#,}"
}
if [ "${PART:-1}" = 1 ]; then
    $B --size ${SMALL:-8192} --store /tmp/mg-small.zarr --run-limit 60 --unit 2048 \
      --runs mst:cuda2,fill:local,flow:local,shards:cuda2 > $OUT/log.txt 2>&1
    echo "warm-up at $(el) s" >> $OUT/log.txt
    $B --size ${BIG:-32768} --store /tmp/mg-big.zarr --deadline $(left) --run-limit 60 --json $OUT/big.json \
      --runs $(upto mst),mst:local > $OUT/big.txt 2>&1
    echo "big done at $(el) s" >> $OUT/log.txt
    $B --size ${MID:-16384} --store /tmp/mg-mid.zarr --unit ${UNIT:-4096} --deadline $(( $(left) - 170 )) --run-limit 60 \
      --json $OUT/mid.json --runs $(upto shards) > $OUT/mid.txt 2>&1
    echo "mid done at $(el) s" >> $OUT/log.txt
    ( timeout $(( $(left) - 5 )) python3 -m pytest ${TESTS--m multigpu} tests/test_multigpu.py -q -p no:xdist \
        -p no:cacheprovider --durations=4 > $OUT/pytest.txt 2>&1; echo "rc=$? at $(el) s" >> $OUT/pytest.txt ) &
    timeout $(( $(left) - 5 )) $B --size ${HUGE:-65536} --store /tmp/mg-huge.zarr --only-store >> $OUT/log.txt 2>&1
    echo "huge store at $(el) s (rc $?)" >> $OUT/log.txt
    wait
else
    [ -d /tmp/mg-huge.zarr ] || { $B --size ${HUGE:-65536} --store /tmp/mg-huge.zarr --only-store > $OUT/log.txt 2>&1;
                                  echo "huge store at $(el) s" >> $OUT/log.txt; }
    $B --store /tmp/mg-huge.zarr --weight surface --deadline $(left) --run-limit 420 --json $OUT/huge.json \
      --runs mst:cuda2,fill:cuda2,flow:cuda2,shards:cuda2 > $OUT/huge.txt 2>&1
    echo "huge done at $(el) s" >> $OUT/log.txt
fi
du -sh /tmp/mg-*.zarr >> $OUT/log.txt 2>&1
