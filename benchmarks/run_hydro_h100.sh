#!/bin/bash
# Issue 30's figures on the GPU machine in one call (about 200 s of wall): the hydrology's GPU tests
# (they compile every kernel the commands below run), then bench_hydro_cli at 16384^2 (basins,
# watershed, streams -o, HAND, each a fresh process) and the 32768^2 chain with --memory 8GB (fill ->
# flow -> streams -o -> HAND). Run from the repository root with the package and the `.whl-ogr`
# wheels (pyogrio, no rasterio) on PYTHONPATH; the JSON lines go to $OUT.
set -u
OUT=${OUT:-/tmp/hydro_out}; W=${SCRATCH:-/tmp/hydro_run}; mkdir -p "$OUT" "$W/warm.zarr"
unset PYTHONDONTWRITEBYTECODE  # bytecode cached, as a pip install leaves it (bench_hydro_cli does so too)
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$OUT/hydro.log"
timeout 150 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_hydro_startup.py tests/test_hydro_speed.py \
    2>&1 | tail -3 | tee -a "$OUT/hydro.log"
cd benchmarks || exit 1
timeout 200 python3 bench_hydro_cli.py --work "$W" --size 16384 --device gpu 2>&1 | tee -a "$OUT/hydro.log"
timeout 300 python3 bench_hydro_cli.py --work "$W" --size 32768 --memory 8GB --device gpu --workflow 2>&1 \
    | tee -a "$OUT/hydro.log"
