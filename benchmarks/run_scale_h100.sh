#!/bin/bash
# Issue 29/30 (branch scale) on the H100, from the device's repository root copy of this tree in
# .wt/scale: STEP=tests -- the GPU tests of exact weights and hydrology, bench_flow_gpu at 16384^2 on
# this tree and on main's (the root), hydro's commands at 8192^2; STEP=big -- 65536^2 synth, fill,
# flow (CONDITION=none: no fill), basins, streams, hand (bench_flow_cli.py: CLI wall, peak RSS and GPU memory),
# beside the synth the exact weights' GPU tests and the weighted bench at 16384^2 (this tree, main).
ROOT=${ROOT:?the device repository root}
exec > >(tee -a "${OUT:-/tmp}/scale.log") 2>&1  # the log comes back even when the call's time runs out
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
df -h /tmp | tail -1
if [ "$STEP" = tests ]; then
  timeout 230 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_flow_exact_weights.py \
    tests/test_hydro_gpu.py tests/test_flow_gpu_bands.py tests/test_hydro_speed.py tests/test_flow_gpu.py 2>&1 | tail -25
  python3 benchmarks/bench_flow_gpu.py --sizes 16384 --repeat 3 2>&1 | grep -v "^  GPU pool"
  (cd "$ROOT" && PYTHONPATH=$ROOT:/tmp/site python3 benchmarks/bench_flow_gpu.py --sizes 16384 --repeat 3 2>&1 | grep -v "^  GPU pool" | sed 's/^/main: /')
  python3 benchmarks/bench_flow_cli.py --work /tmp/fl --size 8192 --device gpu --then basins streams hand
fi
if [ "$STEP" = big ]; then  # the synth in the background, the kernels compiled and the GPU checks beside it
  mkdir -p /tmp/fl
  ( time python3 -m cli synth -o /tmp/fl/s65536.zarr --size 65536 -q ) >/tmp/synth.log 2>&1 &
  SYN=$!
  python3 benchmarks/bench_flow_cli.py --work /tmp/fl --size 1024 --device gpu --then hand streams basins \
    >/tmp/warm.log 2>&1
  (timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_flow_exact_weights.py \
     tests/test_flow_gpu_bands.py 2>&1 | tail -3
   python3 benchmarks/bench_flow_gpu.py --sizes 16384 --repeat 3 2>&1 | grep -v "^  GPU pool") >/tmp/side.log 2>&1
  wait $SYN
  echo "synth 65536 (beside the compiles and the GPU checks):"; cat /tmp/synth.log
  python3 benchmarks/bench_flow_cli.py --work /tmp/fl --size 65536 --memory 16GB --device gpu --keep \
    --condition ${CONDITION:-fill} --then basins streams hand
  cat /tmp/side.log
  df -h /tmp | tail -1
fi
