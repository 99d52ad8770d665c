"""Strong scaling of the tile phases on Dask workers (MST tile phase, SSSP boundary index, SSSP final).

For each worker count W a fresh ``distributed.LocalCluster`` of W single-threaded worker processes
(numba limited to one thread each) runs the same store. Every worker first runs the whole pipeline
on a small store of its own, so the compiled kernels are loaded before anything is timed. Prints
the time of each phase, the parallel efficiency T1 / (W * TW), and the merges that stay on the
client (the MST merge, the SSSP merge phase: Amdahl's serial part); ``--json`` writes them too.

``--gpus 1,2``: one worker per GPU instead (dask-cuda's ``LocalCUDACluster`` when installed, else
``dask worker`` processes each given its own ``CUDA_VISIBLE_DEVICES``), the MST tile phase and the
SSSP phases on the workers' GPUs.

    python benchmarks/bench_scaling.py --size 4096 --workers 1,2,4,8,16
    python benchmarks/bench_scaling.py --size 16384 --shard 4 --gpus 1,2       # a 2-GPU machine
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("mst_tile", "index", "sssp_final")


def _warm(size: int, tile: int, shard: int, device: str = "cpu") -> float:
    """Run MST, index and SSSP on a small store of this process's own: compiles / loads the kernels."""
    import numpy as np

    from terrain_io.grid.mst import mst
    from terrain_io.grid.sssp import sssp
    from terrain_io.synth import synthesize

    t0 = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="terrain-warm-"))
    try:
        st = synthesize(folder / "w.zarr", size, seed=1, tile=tile, shard=shard, progress=False)
        mst(st, device=device, progress=False)
        valid = np.argwhere(np.isfinite(st.elevation[:]))
        sssp(st, tuple(int(x) for x in valid[len(valid) // 2]), cell=True, device=device, progress=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return time.perf_counter() - t0


@contextlib.contextmanager
def _workers(n: int, per_gpu: bool):
    """A scheduler address with n single-threaded worker processes: plain CPU workers, or one per
    GPU (dask-cuda when installed; else ``dask worker`` processes, each seeing only its own GPU)."""
    from distributed import Client, LocalCluster

    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if not per_gpu:
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                          env=env) as cluster:
            yield cluster.scheduler_address
        return
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        LocalCUDACluster = None
    if LocalCUDACluster is not None:
        with LocalCUDACluster(n_workers=n, threads_per_worker=1, dashboard_address=":0") as cluster:
            yield cluster.scheduler_address
        return
    with LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as cluster:
        procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
                                   "--nthreads", "1", "--no-dashboard"],
                                  env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": str(i),
                                       "DASK_LOGGING__DISTRIBUTED": "error"}) for i in range(n)]
        try:
            with Client(cluster.scheduler_address) as client:
                client.wait_for_workers(n, timeout=180)
            yield cluster.scheduler_address
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--gpus", help="worker counts of one worker per GPU, e.g. 1,2 (instead of --workers)")
    ap.add_argument("--device", default=None, help="the workers' kernels: cpu (default) or gpu (default with --gpus)")
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--shard", type=int, default=2, help="tiles per shard side: the unit of a task")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/terrain-bench-scaling"))
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    import numpy as np
    from distributed import Client

    from terrain_io.grid.sssp.index import Field, build_index
    from terrain_io.grid.mst import mst
    from terrain_io.grid.sssp import sssp
    from terrain_io.synth import synthesize

    per_gpu = args.gpus is not None
    device = args.device or ("gpu" if per_gpu else "cpu")
    t0 = time.perf_counter()
    warm_size = min(args.size, 2 * args.tile * args.shard)
    print(f"# client warm-up (numba compile or cache load): {_warm(warm_size, args.tile, args.shard, device):.1f} s",
          flush=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    store = synthesize(args.workdir / f"s{args.size}.zarr", args.size, seed=5, tile=args.tile, shard=args.shard,
                       overwrite=True, progress=False, scheduler="processes")
    values = store.elevation[:]
    valid = np.argwhere(np.isfinite(values))
    source = tuple(int(x) for x in valid[len(valid) // 2])
    del values, valid
    shards = store.shard_grid[0] * store.shard_grid[1]
    head = (f"# {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, {args.size}^2 synthetic "
            f"store, tile {store.tile_size}, shard {store.shard_size} ({shards} shard tasks); "
            f"setup {time.perf_counter() - t0:.1f} s; workers: {'one per GPU' if per_gpu else 'CPU'}, kernels: {device}")
    print(head)
    print(f"{'workers':>8}{'mst tile s':>12}{'eff':>6}{'mst merge s':>13}{'index s':>10}{'eff':>6}"
          f"{'sssp merge s':>14}{'final s':>10}{'eff':>6}{'warm s':>8}", flush=True)
    rows, base = [], {}
    for w in (int(x) for x in (args.gpus or args.workers).split(",")):
        with _workers(w, per_gpu) as addr, Client(addr) as client:
            t0 = time.perf_counter()
            client.run(_warm, warm_size, args.tile, args.shard, device)
            t_warm = time.perf_counter() - t0
            mst_times = mst(store, device=device, progress=False, scheduler=addr).timings
            field = Field(store, "absdiff")
            t0 = time.perf_counter()
            build_index(store, field, scheduler=addr, device=device)
            t_index = time.perf_counter() - t0
            field.close()
            r = sssp(store, source, cell=True, device=device, progress=False, name="bench", scheduler=addr)
            assert r.index_reused
        row = {"workers": w, "mst_tile": mst_times["tile"], "mst_merge": mst_times.get("merge", float("nan")),
               "index": t_index, "sssp_merge": r.timings["merge"], "sssp_final": r.timings["final"],
               "warm": t_warm, "reached": r.reached}
        for k in PHASES:
            base.setdefault(k, row[k])
            row[k + "_eff"] = base[k] / (w * row[k])
        rows.append(row)
        print(f"{w:>8}{row['mst_tile']:>12.2f}{row['mst_tile_eff']:>6.0%}{row['mst_merge']:>13.2f}"
              f"{row['index']:>10.2f}{row['index_eff']:>6.0%}{row['sssp_merge']:>14.2f}"
              f"{row['sssp_final']:>10.2f}{row['sssp_final_eff']:>6.0%}{t_warm:>8.1f}", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"header": head, "size": args.size, "rows": rows}, indent=1))
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
