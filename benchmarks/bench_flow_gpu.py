"""Flow routing kernels on the GPU, data resident on the GPU: throughput (cells/s) of the in-core
``directions`` (D8 + flats) and ``accumulation`` (counts and weighted) of
terrain_io/grid/flow/_gpu.py on a synthetic filled DEM, and xarray-spatial 0.10.20's CuPy
``flow_accumulation_d8`` (frontier peeling: one pair of launches per cell of the longest flow path)
on the same directions, side by side in one process. Times: CUDA events around the call, median
of ``--repeat`` runs after a warm-up (kernels compiled on a small DEM first).

The DEM: value noise (octaves of bilinearly upsampled uniform grids, float32) quantized to 0.25 m
(terraces and ties), filled on the GPU by terrain_io.grid.fill._gpu (its lakes are the flats).

    python benchmarks/bench_flow_gpu.py --sizes 4096 8192 16384 --xrs-small 4096 --xrs-size 16384 --xrs-force
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

from common import PeakGpu  # benchmarks/ is on sys.path when run as a script


def synthetic_filled(n: int, seed: int = 1):
    import cupy as cp
    from cupyx.scipy import ndimage

    from terrain_io.grid.fill._gpu import GpuFill

    rs = cp.random.RandomState(seed)
    z = cp.zeros((n, n), cp.float32)
    amp, cells = 400.0, 4
    while cells <= n // 4:
        coarse = rs.random_sample((cells + 1, cells + 1)).astype(cp.float32)
        z += amp * ndimage.zoom(coarse, n / (cells + 1), order=1, output=cp.float32)[:n, :n]
        amp, cells = amp / 2.2, cells * 2
    z = cp.floor(z * 4) / 4
    f = GpuFill(n, n, cp.float32, None)
    f.load(0, z)
    f.levels(True)
    out = f.F[1:-1, 1:-1].copy()
    f.close()
    return out


def timed(fn, repeat: int):
    import cupy as cp

    fn()
    times = []
    for _ in range(repeat):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def to_esri(code):
    """Our codes as xarray-spatial's (ESRI 1..128 clockwise from east, 0 no outflow, NaN nodata)."""
    import cupy as cp

    c = code.astype(cp.int32)
    return cp.where(c < 8, cp.left_shift(1, cp.minimum(c, 7)).astype(cp.float64),
                    cp.where(c == 255, cp.nan, 0.0))


def xrs_accumulation(esri):
    import cupy as cp
    import numpy as np
    import xarray as xr

    np.row_stack = np.vstack  # numba.cuda in xarray-spatial 0.10 still calls it
    from xrspatial.hydro import flow_accumulation_d8

    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    out = flow_accumulation_d8(xr.DataArray(esri, dims=("y", "x"))).data
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--xrs-small", type=int, default=2048, help="xarray-spatial is timed here first")
    ap.add_argument("--xrs-size", type=int, default=16384)
    ap.add_argument("--xrs-cap", type=float, default=90.0, help="run xarray-spatial at --xrs-size only if the "
                    "n^3 prediction from --xrs-small is below this many seconds")
    ap.add_argument("--xrs-force", action="store_true", help="run xarray-spatial at --xrs-size whatever the prediction")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import cupy as cp

    import numpy as np

    from terrain_io.grid.flow._gpu import accumulation, device_bytes, directions

    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"{props['name'].decode()}, CuPy {cp.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
          flush=True)
    t = time.perf_counter()
    small = synthetic_filled(256)
    ok = cp.ones(small.shape, cp.bool_)
    d = directions(small, ok, 10.0, 10.0)
    accumulation(d)
    accumulation(d, cp.ones(small.shape))
    print(f"compile + warm-up: {time.perf_counter() - t:.1f} s", flush=True)
    rows = {}
    for n in args.sizes:
        t = time.perf_counter()
        z = synthetic_filled(n)
        cp.cuda.Device().synchronize()
        ok = cp.ones(z.shape, cp.bool_)
        gen = time.perf_counter() - t
        cells = n * n
        td = timed(lambda: directions(z, ok, 10.0, 10.0), max(1, args.repeat // 2))
        code = directions(z, ok, 10.0, 10.0)
        rounds = directions.rounds
        flat = int(cp.count_nonzero(code == 254))
        ta = timed(lambda: accumulation(code), args.repeat)
        base = cp.get_default_memory_pool().used_bytes()
        with PeakGpu() as peak_d:
            directions(z, ok, 10.0, 10.0)
        with PeakGpu() as peak_a:
            acc = accumulation(code)
        exits = accumulation.exits
        phases = {k: round(v, 2) for k, v in accumulation.timings.items()}
        wt = cp.random.RandomState(2).random_sample(z.shape)
        tw = timed(lambda: accumulation(code, wt), args.repeat)
        phases_w = {k: round(v, 2) for k, v in accumulation.timings.items()}
        # every cell is counted once at the end of its path (an outlet or a sink)
        ends = (code == 8) | (code == 9)
        assert int(acc[ends].sum()) == cells, "counts do not add up"
        wsum = float(accumulation(code, wt)[ends].sum())
        assert math.isclose(wsum, float(wt.sum()), rel_tol=1e-9), (wsum, float(wt.sum()))
        longest = int(acc.max())
        r = {"cells": cells, "synth_s": gen, "directions_s": td, "directions_cells_per_s": cells / td,
             "bfs_rounds": list(rounds), "accumulation_s": ta, "accumulation_cells_per_s": cells / ta,
             "weighted_s": tw, "weighted_cells_per_s": cells / tw, "weighted_phases_ms": phases_w,
             "exits": exits, "max_accumulation": longest,
             "sinks": int(cp.count_nonzero(code == 9)), "unresolved_left": flat,
             "accumulation_phases_ms": phases,
             "peak_gpu_directions": peak_d.peak, "peak_gpu_accumulation": peak_a.peak, "held_before": base,
             "device_bytes_directions": device_bytes(n, n, np.float32),
             "device_bytes_accumulation": device_bytes(n, n, np.float32)}
        print(f"  GPU pool beyond the inputs: directions {peak_d.peak / 2**30:.2f} GiB, accumulation "
              f"{peak_a.peak / 2**30:.2f} GiB (inputs: {base / 2**30:.2f} GiB; device_bytes bound "
              f"{device_bytes(n, n, np.float32) / 2**30:.2f} GiB with the inputs)", flush=True)
        rows[n] = r
        print(f"{n}^2: directions {td * 1e3:.1f} ms ({cells / td:.3g} cells/s, BFS rounds {rounds}); "
              f"accumulation {ta * 1e3:.2f} ms ({cells / ta:.3g} cells/s; {exits:,} exits = "
              f"{exits / cells:.1%}; phases ms {phases}); weighted {tw * 1e3:.2f} ms ({cells / tw:.3g} cells/s; "
              f"phases ms {phases_w}); "
              f"largest basin {longest:,} cells", flush=True)
        if n == args.xrs_size or n == args.xrs_small:
            rows[n]["code"] = code
        del z, ok, wt, acc
        cp.get_default_memory_pool().free_all_blocks()

    xrs = {}
    try:
        import xrspatial  # noqa: F401
        have = True
    except ImportError as e:
        print(f"xarray-spatial not importable: {e}")
        have = False
    if have:
        m = args.xrs_small
        code = rows[m].pop("code") if m in rows and "code" in rows[m] else directions(
            synthetic_filled(m), cp.ones((m, m), cp.bool_), 10.0, 10.0)
        xrs_accumulation(to_esri(code[:64, :64]))  # compile its numba.cuda kernels
        sec, out = xrs_accumulation(to_esri(code))
        ours = accumulation(code)
        same = bool(cp.all(out[code != 255] == ours[code != 255].astype(cp.float64)))
        xrs[m] = {"seconds": sec, "equal": same}
        if m in rows:
            xrs[m]["ratio"] = sec / rows[m]["accumulation_s"]
        print(f"xarray-spatial CuPy flow_accumulation_d8 {m}^2: {sec:.2f} s, equal to ours: {same}; "
              f"{xrs[m].get('ratio', 0):.0f}x ours", flush=True)
        n = args.xrs_size
        pred = sec * (n / m) ** 3
        if n in rows and (pred <= args.xrs_cap or args.xrs_force):
            code = rows[n].pop("code")
            sec, out = xrs_accumulation(to_esri(code))
            ours = accumulation(code)
            same = bool(cp.all(out[code != 255] == ours[code != 255].astype(cp.float64)))
            xrs[n] = {"seconds": sec, "equal": same, "ratio": sec / rows[n]["accumulation_s"]}
            print(f"xarray-spatial CuPy flow_accumulation_d8 {n}^2: {sec:.2f} s, equal to ours: {same}; "
                  f"ours {rows[n]['accumulation_s'] * 1e3:.2f} ms -> {xrs[n]['ratio']:.0f}x", flush=True)
        else:
            print(f"xarray-spatial at {n}^2 predicted {pred:.0f} s (n^3 from {m}^2): not run (cap {args.xrs_cap} s)")
            xrs[n] = {"predicted_s": pred}
    for r in rows.values():
        r.pop("code", None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "xrs": xrs, "device": props["name"].decode(), "pid": os.getpid()}, f, indent=1)


if __name__ == "__main__":
    main()
