"""Where the in-core GPU MST's Borůvka spends its time (issue 31): the store's elevations read onto the
GPU once (``upload_held``, as ``terrain mst`` reads them), then ``--reps`` times the whole forest
(``GpuGridForest.forest``) with every kernel launch timed by CUDA events on its stream: each kernel's
launches and GPU milliseconds in all, and round by round (find_min, hook, the pointer jumps, relabel),
beside the forest's wall time and its ``kernel_seconds``.

    python benchmarks/profile_mst_gpu.py STORE [--weight max] [--reps 2]
"""
from __future__ import annotations

import argparse
import collections
import json
import time

import cupy as cp

from terrain_io import weights
from terrain_io.grid.flow.upload import upload_held
from terrain_io.grid.mst._gpu import GpuGridForest
from terrain_io.store import TerrainStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--weight", default="max")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    store = TerrainStore.open(args.store, mode="r")
    t0 = time.perf_counter()
    d_vals, _ = upload_held(store, "elevation", None)
    cp.cuda.Device().synchronize()
    print(f"read {store.shape} {store.dtype}: {time.perf_counter() - t0:.3f} s")
    for rep in range(args.reps):
        gpu = GpuGridForest(weights.get(args.weight), store.dtype)
        launches = []  # (name, start event, stop event), in order

        def timed(name, fn):
            def launch(grid, block, kargs):
                stream = cp.cuda.get_current_stream()
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(stream)
                fn(grid, block, kargs)
                b.record(stream)
                launches.append((name, a, b))
            return launch

        gpu.k = {name: timed(name, fn) for name, fn in gpu.k.items()}
        t0 = time.perf_counter()
        bits, totals = gpu.forest(d_vals, store.nodata)
        edges, _, cells = totals()
        wall = time.perf_counter() - t0
        total, count = collections.defaultdict(float), collections.Counter()
        rounds, current = [], collections.defaultdict(float)
        for name, a, b in launches:
            ms = cp.cuda.get_elapsed_time(a, b)
            total[name] += ms
            count[name] += 1
            if name == "find_min" and current:
                rounds.append(dict(current))
                current = collections.defaultdict(float)
            current[name] += ms
            if name == "jump":
                current["jumps"] += 1
        rounds.append(dict(current))
        print(f"rep {rep}: forest {wall:.3f} s wall, kernel_seconds {gpu.kernel_seconds:.3f}, rounds {gpu.rounds}, "
              f"edges {edges:,}, vertices {cells:,}; launches timed {sum(total.values()) / 1000:.3f} s")
        print("  by kernel (ms, launches):", json.dumps({k: [round(v, 2), count[k]] for k, v in total.items()}))
        for i, r in enumerate(rounds):
            print(f"  round {i}:", json.dumps({k: round(v, 2) for k, v in r.items()}))
        del bits


if __name__ == "__main__":
    main()
