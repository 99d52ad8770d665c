#!/usr/bin/env bash
# Usage, on a host of 2 GPUs or more, from the repository root: OUT=DIR [BUDGET=seconds] bash benchmarks/multigpu_window.sh
# (CPU rehearsal: TESTS="" BENCH_ARGS="--device cpu --tile 32 --shard 2 --memory 1GB" BIG=512 MID=512 SMALL=256 UNIT=128
#  CUDA_VISIBLE_DEVICES=0,1). Writes host.txt, pytest.txt, log.txt, big.{txt,json}, mid.{txt,json} under $OUT.
# multigpu's device window (issue 33): the multigpu tests and the benchmark in one call
set -u
T0=$(date +%s)
BUDGET=${BUDGET:-200}
el() { echo $(( $(date +%s) - T0 )); }
B="python3 benchmarks/bench_multigpu.py ${BENCH_ARGS:-}"
{ nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id --format=csv; nproc; free -g; } > $OUT/host.txt 2>&1
# the tests, beside the stores and a warm-up that fills the kernel caches (nothing measured meanwhile)
( timeout 170 python3 -m pytest ${TESTS--m multigpu} tests/test_multigpu.py -q -p no:xdist -p no:cacheprovider \
    --durations=4 > $OUT/pytest.txt 2>&1; echo "rc=$? at $(el) s" >> $OUT/pytest.txt ) &
PT=$!
$B --size ${BIG:-32768} --store /tmp/mg-big.zarr --only-store > $OUT/log.txt 2>&1
$B --size ${MID:-16384} --store /tmp/mg-mid.zarr --only-store >> $OUT/log.txt 2>&1
echo "stores at $(el) s" >> $OUT/log.txt
$B --size ${SMALL:-8192} --store /tmp/mg-small.zarr --run-limit 40 --runs mst:cuda2,fill:local,flow:local \
  >> $OUT/log.txt 2>&1
echo "warm-up at $(el) s" >> $OUT/log.txt
wait $PT
echo "tests done at $(el) s" >> $OUT/log.txt
$B --store /tmp/mg-big.zarr --deadline $(( BUDGET - $(el) )) --run-limit 45 --json $OUT/big.json \
  --runs mst:cuda2,mst:cuda1,mst:local,fill:local,flow:local > $OUT/big.txt 2>&1
echo "big done at $(el) s" >> $OUT/log.txt
$B --store /tmp/mg-mid.zarr --unit ${UNIT:-4096} --deadline $(( BUDGET - $(el) )) --run-limit 40 --json $OUT/mid.json \
  --runs shards:cuda2,shards:cuda1,shards:local > $OUT/mid.txt 2>&1
echo "end at $(el) s" >> $OUT/log.txt
