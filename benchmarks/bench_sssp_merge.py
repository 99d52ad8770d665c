"""SSSP merge phase (phase 2) alone: the parallel label-correcting merge against Gerritsen 2012's
sequential Dijkstra over G' with the cluster priority queue, on one synthetic store, with the
parallel merge's batch size swept. Prints seconds per stage and the ratio.

    python benchmarks/bench_sssp_merge.py --size 2048
    python benchmarks/bench_sssp_merge.py --size 8192 --device gpu --batches 4096 16384 65536
"""
from __future__ import annotations

import argparse
import importlib
import tempfile
import time
from pathlib import Path

import numba
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--device", default="cpu", help="device of the index build")
    ap.add_argument("--batches", type=int, nargs="*", default=[])
    ap.add_argument("--no-sequential", action="store_true", help="skip the sequential Dijkstra (slow at 8192^2)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()

    from terrain_io.grid.sssp.index import Field, ensure_index
    from terrain_io.synth import synthesize

    sssp_mod = importlib.import_module("terrain_io.grid.sssp.pipeline")
    work = Path(args.workdir or tempfile.mkdtemp())
    n = args.size
    path = work / f"dem{n}.zarr"
    st = synthesize(path, n, seed=1, cell_size=10.0) if not path.exists() else sssp_mod.TerrainStore.open(path)
    field = Field(st, "absdiff")
    t = time.perf_counter()
    index, _ = ensure_index(st, field, 8, device=args.device)
    print(f"{n}^2, {numba.get_num_threads()} threads; index {time.perf_counter() - t:.1f} s", flush=True)

    def merge(batch=None, sequential=False):
        ms = sssp_mod.MergeState(st, index, 1 << 36, work)
        ms.seed(field, [(n // 3, n // 2)])  # first call compiles; the timed ones below do not
        if batch:
            ms.batch = batch
        t = time.perf_counter()
        ms.run(field, sequential=sequential)
        return ms, time.perf_counter() - t

    merge(sequential=False)
    best, distances = float("inf"), []
    for b in args.batches or [None]:
        ms, sec = merge(b)
        print(f"parallel merge, batch {ms.batch}: {sec:.2f} s  {ms.stats}", flush=True)
        best = min(best, sec)
        if not args.no_sequential:
            distances.append(ms.sDist.copy())
        del ms
    if not args.no_sequential:
        ms, sec = merge(sequential=True)
        same = all(np.array_equal(ms.sDist, d) for d in distances)
        print(f"sequential Dijkstra (Gerritsen 2012): {sec:.2f} s; parallel is {sec / best:.1f}x faster; "
              f"distances bit-identical: {same}")

if __name__ == "__main__":
    main()
