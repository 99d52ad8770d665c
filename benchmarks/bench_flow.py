"""Flow routing benchmark: directions (flats resolved) + accumulation from a filled DEM, ours against
pyflwdir (``from_dem`` + ``upstream_area``) and pysheds (``resolve_flats`` + ``flowdir`` +
``accumulation``), side by side on the same ``terrain synth`` terrain filled by ``terrain fill``.

Every tool runs in its own process on the filled DEM loaded into memory (float32), its kernels
compiled first on a small DEM in that process (numba caches), and is timed the same way around its
calls: wall seconds and CPU seconds (user + sys of the process) and the process's peak RSS (the
loaded DEM included, the same 4 bytes a cell for every tool). ``ours-cli`` is ``terrain flow STORE``
in a fresh process (the stored fill read, the results written to the store).

    python benchmarks/bench_flow.py --sizes 4096
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import bench_parser, child_env, cpu_seconds, run_child, save_rows, work_folder, write_geotiff  # noqa: E402 (benchmarks/ is on sys.path)


def one(what: str, store: str, tif: str) -> dict:
    """One measurement in this (fresh) process."""
    import numpy as np

    from terrain_io.memory import peak_rss
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(store, mode="r")
    z = np.asarray(st.group["fill/elevation"][...])
    dx, dy = st.metric_cell_size
    small = np.ascontiguousarray(z[:2100, :2100])  # above jit.SERIAL_BELOW: the parallel builds compile too
    res = {"what": what}
    if what == "ours":
        from terrain_io import flow_accumulation, flow_direction

        flow_accumulation(flow_direction(small, cell_size=(dx, dy)))
        w, c = time.perf_counter(), cpu_seconds()
        code = flow_direction(z, cell_size=(dx, dy))
        acc = flow_accumulation(code)
        res.update(seconds=time.perf_counter() - w, cpu=cpu_seconds() - c, max_acc=int(acc.max()))
    elif what == "pyflwdir":
        import pyflwdir

        pyflwdir.from_dem(small, nodata=-9999.0).upstream_area(unit="cell")
        w, c = time.perf_counter(), cpu_seconds()
        flw = pyflwdir.from_dem(z, nodata=-9999.0)
        acc = flw.upstream_area(unit="cell")
        res.update(seconds=time.perf_counter() - w, cpu=cpu_seconds() - c, max_acc=int(acc.max()))
    elif what == "pysheds":
        if not hasattr(np, "in1d"):  # pysheds 0.5 calls np.in1d, gone in NumPy 2.4
            np.in1d = np.isin
        from pysheds.grid import Grid

        small_tif = tif.replace(".tif", ".small.tif")  # pysheds' numba kernels compiled on a small DEM
        warm = Grid.from_raster(small_tif)
        warm.accumulation(warm.flowdir(warm.resolve_flats(warm.read_raster(small_tif))))
        grid = Grid.from_raster(tif)
        dem = grid.read_raster(tif)
        w, c = time.perf_counter(), cpu_seconds()
        inflated = grid.resolve_flats(dem)
        fdir = grid.flowdir(inflated)
        acc = grid.accumulation(fdir)
        res.update(seconds=time.perf_counter() - w, cpu=cpu_seconds() - c, max_acc=int(np.asarray(acc).max()))
    res["peak_rss"] = peak_rss()
    return res


def cli_run(store: Path) -> dict:
    """``terrain flow STORE`` in a fresh process (kernels cached by an earlier run), under GNU time:
    wall, CPU (user + sys), peak RSS of that process."""
    env = child_env()
    cmd = [sys.executable, "-m", "cli", "flow", str(store)]
    subprocess.run(cmd, env=env, capture_output=True, check=True)  # compiles or loads the kernels
    p = subprocess.run(["/usr/bin/time", "-f", "TIME %e %U %S %M", *cmd], env=env, capture_output=True, text=True,
                       check=True)
    wall, user, sys_, kib = (float(v) for v in p.stderr.strip().splitlines()[-1].split()[1:])
    return {"what": "ours-cli", "seconds": wall, "cpu": user + sys_, "peak_rss": int(kib) * 1024,
            "summary": p.stdout.strip()}


def spawn(what, store, tif) -> dict:
    try:
        return run_child(what, __file__, "--one", what, store, tif)
    except RuntimeError as exc:  # a peer that fails is reported, the others still run
        return {"what": what, "error": str(exc)[-600:]}


def main():
    args = bench_parser(sizes=[4096]).parse_args()
    import numpy as np

    from terrain_io.grid.fill import fill
    from terrain_io.memory import format_bytes
    from terrain_io.synth import synthesize

    work = work_folder(args, "flow")
    print(f"{os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d')}", flush=True)
    rows = []
    for n in args.sizes:
        st = synthesize(work / f"dem{n}.zarr", n, seed=1, cell_size=10.0, overwrite=True, progress=False)
        fill(st, device="cpu", progress=False)
        tif = work / f"filled{n}.tif"
        write_geotiff(tif, np.asarray(st.group["fill/elevation"][...]))
        write_geotiff(str(tif).replace(".tif", ".small.tif"), np.asarray(st.group["fill/elevation"][:512, :512]))
        print(f"\n{n}^2 (filled):", flush=True)
        runs = [spawn(w, str(st.path), str(tif)) for w in ("ours", "pyflwdir", "pysheds")]
        runs.append(cli_run(st.path))
        base = runs[0].get("seconds")
        for r in runs:
            if "seconds" not in r:
                print(f"  {r['what']:9s} failed: {r.get('error')}")
                continue
            print(f"  {r['what']:9s} wall {r['seconds']:7.2f} s ({r['seconds'] / base:5.2f}x ours)  CPU "
                  f"{r['cpu']:7.2f} s  peak RSS {format_bytes(r['peak_rss'])}"
                  + (f"  largest accumulation {r['max_acc']:,}" if "max_acc" in r else f"  {r.get('summary', '')}"),
                  flush=True)
            rows.append({"n": n, **r})
        shutil.rmtree(st.path, ignore_errors=True)
    save_rows(rows, args.json)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(one(*sys.argv[2:5])))
    else:
        main()
