"""Depression filling on a GPU machine: ``terrain fill`` on the GPU against xarray-spatial's
``fill_d8`` (``xrspatial.hydro``: Planchon-Darboux; on CuPy one Jacobi sweep of numba.cuda a
launch until nothing changes, on NumPy its numba forward/backward scans, one thread) side by side
in one process on the same synthetic DEM (``terrain_io.synth``, tile 256, shard 8), and the ratio
to our GPU MST on the same store. Conventions: xarray-spatial drains only at the grid's edge and
NaN cells are walls, so ours runs with ``outlets="edge"``; every peer's filled levels are compared
cell by cell with ours. Kernels (CuPy, numba.cuda, numba) are compiled on a small DEM first.
Then, each in a fresh process: ``terrain fill --device gpu`` on the CLI (wall time, peak RSS), and
optionally a larger DEM with a memory budget.

    python benchmarks/bench_fill_gpu.py --size 16384 --numpy-size 4096 --big 32768 --big-memory 8GB
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import PeakGpu, bench_parser, child_env, warm_side, work_folder  # noqa: E402 (benchmarks/ is on sys.path)



def synth(path: Path, n: int) -> float:
    from terrain_io.synth import synthesize

    t = time.perf_counter()
    if not (path / "zarr.json").exists():
        synthesize(path, n, seed=1, cell_size=10.0, tile=256, shard=8, overwrite=True)
    return time.perf_counter() - t


def substore(path: Path, values):
    import shutil

    from terrain_io.store import TerrainStore

    shutil.rmtree(path, ignore_errors=True)
    return TerrainStore.from_array(path, values, tile=256, shard=8)


def ours(store, outlets="edge", device="gpu", memory=None) -> dict:
    import cupy

    from terrain_io.grid.fill import fill

    cupy.get_default_memory_pool().free_all_blocks()
    with PeakGpu() as peak:
        t = time.perf_counter()
        r = fill(store, outlets=outlets, device=device, progress=False, memory=memory)
        sec = time.perf_counter() - t
    return {"seconds": sec, "timings": r.timings, "depressions": r.depressions, "device": r.device,
            "method": r.method, "peak_gpu": peak.peak}


def xrs_fill(values, gpu: bool) -> tuple[float, object]:
    import numpy as np
    import xarray as xr

    np.row_stack = np.vstack  # numba.cuda in xarray-spatial 0.10 still calls it
    from xrspatial.hydro import fill_d8

    if gpu:
        import cupy

        data = cupy.asarray(values)
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        out = fill_d8(xr.DataArray(data, dims=("y", "x"))).data
        cupy.cuda.Device().synchronize()
        sec = time.perf_counter() - t
        return sec, out.get()
    t = time.perf_counter()
    out = fill_d8(xr.DataArray(values, dims=("y", "x"))).data
    return time.perf_counter() - t, out


def compare(ours_filled, theirs) -> int:
    """Cells whose filled level differs (both as float64; NaN = NaN)."""
    import numpy as np

    a, b = ours_filled.astype(np.float64), np.asarray(theirs, np.float64)
    return int(np.count_nonzero(~((a == b) | (np.isnan(a) & np.isnan(b)))))


def fresh_cli(args: list[str]) -> dict:
    """``terrain ARGS`` in a fresh process: wall seconds and its peak RSS (VmHWM: its own, not the parent's)."""
    env = child_env()
    code = ("import sys, time; t = time.perf_counter(); from cli.main import main; sys.argv = ['terrain'] + "
            f"{args!r}\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "from terrain_io.memory import peak_rss\nprint('RSS', peak_rss(), 'SEC', time.perf_counter() - t)")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t
    if p.returncode:
        raise RuntimeError(p.stderr[-2000:])
    words = p.stdout.split()
    return {"wall": wall, "in_process": float(words[words.index("SEC") + 1]),
            "peak_rss": int(words[words.index("RSS") + 1]), "out": p.stdout.strip().splitlines()[0][:300]}


def main():
    ap = bench_parser(peers=True)
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--numpy-size", type=int, default=4096, help="size for xarray-spatial's NumPy fill_d8")
    ap.add_argument("--cupy-small", type=int, default=4096, help="xarray-spatial's CuPy fill_d8 is timed here "
                    "first; at --size only if that predicts (n^3) no more than --peer-cap seconds")
    ap.add_argument("--peer-cap", type=float, default=120.0)
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--big-memory", default="8GB")
    args = ap.parse_args()
    import cupy
    import numpy as np

    from terrain_io.grid.fill import read_fill
    from terrain_io.grid.mst import mst
    from terrain_io.memory import format_bytes
    from terrain_io.store import TerrainStore

    work = work_folder(args, "fill-gpu")
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(f"{props['name'].decode()}, {os.cpu_count()} host cores, {time.strftime('%Y-%m-%d')}", flush=True)
    rows = {}

    # compile everything on a small DEM
    warm = work / "warm.zarr"
    synth(warm, max(700, warm_side(args.size)))
    ours(TerrainStore.open(warm))
    ours(TerrainStore.open(warm), outlets="edge+nodata")
    mst(TerrainStore.open(warm), device="gpu", progress=False)
    small = np.asarray(TerrainStore.open(warm).elevation[...])[:300, :300].copy()
    if not args.no_peers:
        xrs_fill(small, True)
        xrs_fill(small, False)

    n = args.size
    path = work / f"dem{n}.zarr"
    rows["synth"] = synth(path, n)
    st = TerrainStore.open(path)
    print(f"\n{n}^2 (synth {rows['synth']:.1f} s):", flush=True)
    for k in range(2):
        r = ours(st)
        rows[f"ours{k}"] = r
        print(f"  ours GPU fill (edge) run {k + 1}: {r['seconds']:.2f} s  {r['timings']}  peak GPU pool "
              f"{format_bytes(r['peak_gpu'])}  {r['depressions']:,} depressions", flush=True)
    r = ours(st, outlets="edge+nodata")
    rows["ours_en"] = r
    print(f"  ours GPU fill (edge+nodata): {r['seconds']:.2f} s", flush=True)
    t = time.perf_counter()
    mst(st, device="gpu", progress=False)
    rows["mst"] = time.perf_counter() - t
    best = min(rows["ours0"]["seconds"], rows["ours1"]["seconds"])
    print(f"  ours GPU MST: {rows['mst']:.2f} s -> fill / MST = {best / rows['mst']:.2f}x", flush=True)
    filled = read_fill(st)["elevation"]
    vals = np.asarray(st.elevation[...])

    def on_corner(dem, m: int, gpu: bool) -> dict:
        """xarray-spatial's fill_d8 (CuPy or NumPy) against ours on the DEM's m x m corner."""
        sub = dem[:m, :m].copy()
        sub_store = substore(work / f"sub{m}.zarr", sub)
        o = ours(sub_store)
        sec, out = xrs_fill(sub, gpu)
        row = {"n": m, "seconds": sec, "ours": o["seconds"], "differ": compare(read_fill(sub_store)["elevation"], out)}
        print(f"  {m}^2: xarray-spatial {'CuPy' if gpu else 'NumPy'} fill_d8 {sec:.2f} s vs ours GPU "
              f"{o['seconds']:.3f} s: {sec / o['seconds']:.1f}x; cells differing {row['differ']}", flush=True)
        return row

    if not args.no_peers:
        m = args.cupy_small
        rows["xrs_cupy_small"] = on_corner(vals, m, True)
        sec = rows["xrs_cupy_small"]["seconds"]
        if sec * (n / m) ** 3 <= args.peer_cap:
            sec, out = xrs_fill(vals, True)
            rows["xrs_cupy"] = {"n": n, "seconds": sec, "differ": compare(filled, out)}
            print(f"  {n}^2: xarray-spatial CuPy fill_d8 {sec:.2f} s: {sec / best:.1f}x ours; cells differing "
                  f"{rows['xrs_cupy']['differ']}", flush=True)
            del out
        else:
            print(f"  {n}^2: xarray-spatial CuPy fill_d8 not run (predicted {sec * (n / m) ** 3:.0f} s from {m}^2)")
        rows["xrs_numpy"] = on_corner(vals, args.numpy_size, False)
    del filled, vals

    r = fresh_cli(["fill", str(path), "--device", "gpu", "--outlets", "edge"])
    rows["cli"] = r
    print(f"  CLI fresh process: wall {r['wall']:.2f} s (in process {r['in_process']:.2f} s), peak RSS "
          f"{format_bytes(r['peak_rss'])}: {r['out']}", flush=True)
    r = fresh_cli(["mst", str(path), "--device", "gpu"])
    rows["cli_mst"] = r
    print(f"  CLI fresh process, terrain mst --device gpu: wall {r['wall']:.2f} s (in process {r['in_process']:.2f} s)"
          f" -> fill / MST (CLI wall) = {rows['cli']['wall'] / r['wall']:.2f}x", flush=True)
    if args.big:
        n = args.big
        path = work / f"dem{n}.zarr"
        rows["big_synth"] = synth(path, n)
        r = fresh_cli(["fill", str(path), "--device", "gpu", "--memory", args.big_memory])
        rows["big"] = r
        print(f"\n{n}^2 (synth {rows['big_synth']:.1f} s), --memory {args.big_memory}: CLI wall {r['wall']:.2f} s "
              f"(in process {r['in_process']:.2f} s), peak RSS {format_bytes(r['peak_rss'])}: {r['out']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
