#!/bin/bash
# Issue 30's figures on the GPU machine in one call (at most 310 s of wall): the hydrology's GPU tests
# (they compile every kernel the commands below run), then bench_hydro_cli at 16384^2 (streams -o and
# HAND, twice each, a fresh process each) and the 32768^2 chain with --memory 8GB (fill -> flow ->
# streams -o -> HAND). Run from the repository root with the package and the `.site-ox` tree (pyogrio and
# nvCOMP's GPU zstd, no rasterio) on PYTHONPATH; the logs and JSON lines go to $OUT. basins and watershed
# at 16384^2: add them to --only (their code is unchanged since the lead's 2.18 / 1.83 s).
# The `.site-ox` tree (an ignored folder carried to the GPU machine, ~50 MB: pyogrio's and nvCOMP's wheels
# together pass the 64 MiB carry as wheels, an installed tree compresses under it), made once from cp312 wheels:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d w \
#       zarr==3.1.6 numcodecs==0.16.6 donfig google-crc32c affine pyogrio==0.13.0 pyflwdir==0.5.12 nvidia-libnvcomp-cu13
#   mkdir -p s/site && for f in w/*.whl; do unzip -q -o "$f" -d s/site; done
#   mkdir -p .site-ox && tar -C s -cf - site | xz -9 > .site-ox/site.tar.xz
# and on the GPU machine: mkdir -p /tmp/site && tar -C /tmp -xJf .site-ox/site.tar.xz (PYTHONPATH=$PWD:/tmp/site).
set -u
OUT=${OUT:-/tmp/hydro_out}; W=${SCRATCH:-/tmp/hydro_run}; mkdir -p "$OUT" "$W"
unset PYTHONDONTWRITEBYTECODE  # bytecode cached, as a pip install leaves it (bench_hydro_cli does so too)
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$OUT/hydro.log"
python3 -c "from terrain_io import nvzstd; print('nvCOMP zstd loaded:', nvzstd._lib() is not None)" \
    2>&1 | tee -a "$OUT/hydro.log"
timeout -k 5 100 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_hydro_startup.py tests/test_hydro_speed.py \
    tests/test_io_gpu_write.py::test_flow_and_hydrology_on_the_gpu_store_the_cpus_cells > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log" | tee -a "$OUT/hydro.log"
cd benchmarks || exit 1
timeout -k 5 70 python3 bench_hydro_cli.py --work "$W" --size 16384 --device gpu --only streams,hand --repeat 2 2>&1 \
    | tee -a "$OUT/hydro.log"
timeout -k 5 140 python3 bench_hydro_cli.py --work "$W" --size 32768 --memory 8GB --device gpu --workflow 2>&1 \
    | tee -a "$OUT/hydro.log"
