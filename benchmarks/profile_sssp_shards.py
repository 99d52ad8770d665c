"""Where the shard method's time goes: one run of ``sssp(method="shards")`` on a store, every helper
of ``grid/sssp/shards.py`` wrapped with a timer (the device synchronised around it), one JSON line
per unit solve (unit; warm -- "kept" in memory, from "disk" -- or cold; seconds per phase; tile
rounds) and the totals; then the unit (1, 1) solved in core from one source at its centre, what the
in-core method does on a store of a unit's size (the yardstick for a solve from a ring). Figures:
benchmarks/RESULTS.md ("the shard method at scale").

    python benchmarks/profile_sssp_shards.py big.zarr --weight surface --memory 4GB --device gpu
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import sys
import time

import numpy as np

shards = importlib.import_module("terrain_io.grid.sssp.shards")
PHASES = ("_read_values", "_read_unit", "_write_unit", "solve_block", "output_distance", "boundary_sides", "to_host")


def sync(device):
    if device == "gpu":
        import cupy as cp

        cp.cuda.get_current_stream().synchronize()


def instrument(device, totals):
    """Wrap the helpers (module globals, looked up at call time) and the unit solve."""
    def timed(name, f):
        def g(*a, **k):
            sync(device)
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                sync(device)
                totals[name] += time.perf_counter() - t
        return g

    for name in PHASES:
        setattr(shards, name, timed(name, getattr(shards, name)))
    shards.Lines.update = timed("lines.update", shards.Lines.update)
    shards.UnitScratch.save = timed("scratch.save", shards.UnitScratch.save)
    shards.UnitScratch.load = timed("scratch.load", shards.UnitScratch.load)
    solve_unit = shards.solve_unit

    def logged(task):
        before, t = dict(totals), time.perf_counter()
        kept = task.cache is not None and (task.i, task.j) in task.cache.items
        warm = "kept" if kept else "disk" if task.scratch and shards.UnitScratch(task.scratch).file(
            task.i, task.j).exists() else False
        res = solve_unit(task)
        gpu_mod = sys.modules.get("terrain_io.grid.sssp._incore_gpu")
        print(json.dumps({"unit": [task.i, task.j], "warm": warm, "reached": task.ring is not None,
                          "seconds": round(time.perf_counter() - t, 3),
                          "rounds": getattr(getattr(gpu_mod, "solve_block_gpu", None), "rounds", None),
                          **{k: round(v - before.get(k, 0.0), 3) for k, v in totals.items()
                             if v - before.get(k, 0.0) >= 0.001}}), flush=True)
        return res

    shards.solve_unit = logged


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--weight", default="surface")
    ap.add_argument("--memory", default="4GB")
    ap.add_argument("--device", default="gpu")
    a = ap.parse_args()

    from terrain_io.grid.sssp import sssp
    from terrain_io.grid.sssp.incore import ringed, solve_block, value_dtype
    from terrain_io.grid.sssp.index import Field
    from terrain_io.memory import peak_rss
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(a.store)
    totals = collections.defaultdict(float)
    instrument(a.device, totals)
    n = st.shape[0]
    t = time.perf_counter()
    res = sssp(st, (n // 2, n // 2), weight=a.weight, cell=True, progress=False, method="shards", device=a.device,
               memory=a.memory, name="profile")
    print(json.dumps({"seconds": round(time.perf_counter() - t, 2), "stats": res.merge_stats,
                      "phases": {k: round(v, 2) for k, v in totals.items()},
                      "peak_rss_gib": round(peak_rss() / 2**30, 2)}), flush=True)

    side = res.merge_stats["unit"]
    field = Field(st, a.weight, None)
    win = shards.Lines(st.shape, side, np.float32, field.model.kind, field.steps()).window(1, 1)
    vdtype = value_dtype(field)
    vals = ringed(shards._read_values(field, win, vdtype, 16))
    if a.device == "gpu":
        import cupy as cp

        vals = cp.asarray(vals)
    for _ in range(2):  # the first may compile
        sync(a.device)
        t = time.perf_counter()
        solve_block(vals, field.model.kind, field.steps(), [(win.shape[0] // 2, win.shape[1] // 2)], device=a.device)
        sync(a.device)
        print(f"unit (1, 1) from one source at its centre: {time.perf_counter() - t:.3f} s", flush=True)
    field.close()


if __name__ == "__main__":
    main()
