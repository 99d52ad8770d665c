"""Strong scaling of the tile phases on Dask CPU workers (MST tile phase, SSSP boundary index).

For each worker count W a fresh ``distributed.LocalCluster`` of W single-threaded worker processes
(numba limited to one thread each) runs the same store; prints the tile-phase time, the parallel
efficiency T1 / (W * TW), and the time of the MST merge that stays on the client (Amdahl's serial part).

    python benchmarks/bench_scaling.py --size 4096 --workers 1,2,4,8,16
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--shard", type=int, default=2, help="tiles per shard side: the unit of a task")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/terrain-bench-scaling"))
    args = ap.parse_args()

    from distributed import LocalCluster

    from terrain_io.grid.index import Field, build_index
    from terrain_io.grid.mst import mst
    from terrain_io.synth import synthesize

    args.workdir.mkdir(parents=True, exist_ok=True)
    store = synthesize(args.workdir / f"s{args.size}.zarr", args.size, seed=5, shard=args.shard, overwrite=True)
    print(f"# {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, {args.size}^2 synthetic store, "
          f"tile {store.tile_size}, shard {store.shard_size}")
    print(f"{'workers':>8}{'mst tile s':>12}{'eff':>7}{'mst merge s':>13}{'index s':>10}{'eff':>7}")
    base = {}
    for w in (int(x) for x in args.workers.split(",")):
        with LocalCluster(n_workers=w, threads_per_worker=1, processes=True, dashboard_address=":0",
                          env={"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}) as cluster:
            addr = cluster.scheduler_address
            mst(store, device="cpu", progress=False, scheduler=addr)  # warm the workers (numba caches)
            res = mst(store, device="cpu", progress=False, scheduler=addr)
            field = Field(store, "absdiff")
            t0 = time.perf_counter()
            build_index(store, field, scheduler=addr)
            t_index = time.perf_counter() - t0
            field.close()
        t_tile = res.timings["tile"]
        base.setdefault("tile", t_tile)
        base.setdefault("index", t_index)
        print(f"{w:>8}{t_tile:>12.2f}{base['tile'] / (w * t_tile):>7.0%}{res.timings['merge']:>13.2f}"
              f"{t_index:>10.2f}{base['index'] / (w * t_index):>7.0%}", flush=True)
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
