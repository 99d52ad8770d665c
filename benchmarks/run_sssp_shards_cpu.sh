#!/bin/bash
# Issue 34's CPU figure: the shard SSSP (`--method shards --device cpu`) against the in-core method at
# 16384^2 under --memory 128MB (8x the float32 cells) on the 16-core host, each run in a fresh process
# (benchmarks/bench_sssp_shards.py: CPU and wall time, solves a unit, bytes read and written, peak RSS
# growth). From the repository root with the package on PYTHONPATH; log to $OUT/log.txt.
#
# Seconds it needs there: the store ~60 s (synth, kept in $D between calls on a warm machine), then per
# weight the in-core run (~185 s) and the shard run (~275 s before this branch) -- one weight a call to
# stay within a 600 s command:  WEIGHTS=absdiff first, then WEIGHTS=surface.
# At a tiny size here (2-core VM, ~10 s):  SIZE=1024 MEMORY=3MB TILE=64 SHARD=1 bash benchmarks/run_sssp_shards_cpu.sh
set -eu
SIZE=${SIZE:-16384}; MEMORY=${MEMORY:-128MB}; WEIGHTS=${WEIGHTS:-absdiff}
TILE=${TILE:-256}; SHARD=${SHARD:-2}
OUT=${OUT:-/tmp/sssp_shards_out}; D=${SCRATCH:-/tmp/sssp_shards_run}; mkdir -p "$OUT" "$D"
STORE="$D/s$SIZE-$TILE-$SHARD.zarr"
{ echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) $(nproc) cores; $SIZE^2 under $MEMORY, $WEIGHTS"
  [ -d "$STORE" ] || /usr/bin/time -f "synth: %e s wall" python3 -m cli synth -o "$STORE" --size "$SIZE" --seed 1 \
      --cell-size 10 --tile "$TILE" --shard "$SHARD" -q
  python3 benchmarks/bench_sssp_shards.py --store "$STORE" --size "$SIZE" --memory "$MEMORY" --device cpu \
      --weights $WEIGHTS --workdir "$D"; } 2>&1 | tee -a "$OUT/log.txt"
