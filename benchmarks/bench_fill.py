"""Depression filling benchmark: ``terrain fill`` against pyflwdir ``fill_depressions``, pysheds
``Grid.fill_depressions`` and GRASS ``r.fill.dir``, side by side on the same synthetic DEM
(``terrain synth`` terrain, no nodata). Every tool runs in its own process, so its peak RSS is
its own; kernels are compiled (numba) on a small DEM in that process before the timed call.
The filled levels are compared cell by cell with ours (max |difference|, cells differing).

    python benchmarks/bench_fill.py --sizes 1024 4096
    python benchmarks/bench_fill.py --sizes 16384 --no-peers --device gpu
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import bench_parser, header, run_child, save_rows, synthetic_dem, warm_side, work_folder, write_geotiff  # noqa: E402 (benchmarks/ is on sys.path)



def one(what: str, store: str, tif: str, out: str, device: str, memory: str | None) -> dict:
    """One measurement in this (fresh) process."""
    import numpy as np

    from terrain_io.memory import peak_rss
    from terrain_io.store import TerrainStore

    res = {"what": what}
    if what == "ours":
        from terrain_io.grid.fill import fill
        from terrain_io.synth import synthesize

        warm = synthesize(Path(out).with_suffix(".warm.zarr"), warm_side(TerrainStore.open(store).shape[0]), seed=2,
                          tile=TerrainStore.open(store).tile_size,
                          overwrite=True)
        fill(warm, device=device, progress=False)
        t = time.perf_counter()
        r = fill(store, device=device, progress=False, memory=memory)
        res.update(seconds=time.perf_counter() - t, timings=r.timings, method=r.method, depressions=r.depressions)
        shutil.rmtree(warm.path)
    elif what == "ours-mst":  # the MST of the same store, for the ratio
        from terrain_io.grid.mst import mst
        from terrain_io.synth import synthesize

        warm = synthesize(Path(out).with_suffix(".warm.zarr"), warm_side(TerrainStore.open(store).shape[0]), seed=2,
                          tile=TerrainStore.open(store).tile_size,
                          overwrite=True)
        mst(warm, device=device, progress=False)
        t = time.perf_counter()
        mst(store, device=device, progress=False, memory=memory)
        res["seconds"] = time.perf_counter() - t
        shutil.rmtree(warm.path)
    elif what == "pyflwdir":
        import pyflwdir

        z = np.asarray(TerrainStore.open(store).elevation[...])
        pyflwdir.dem.fill_depressions(z[:300, :300].copy())
        t = time.perf_counter()
        filled, _ = pyflwdir.dem.fill_depressions(z)
        res["seconds"] = time.perf_counter() - t
        np.save(out, filled.astype(np.float32))
    elif what == "pysheds":
        from pysheds.grid import Grid

        grid = Grid.from_raster(tif)
        dem = grid.read_raster(tif)
        t = time.perf_counter()
        filled = grid.fill_depressions(dem)
        res["seconds"] = time.perf_counter() - t
        np.save(out, np.asarray(filled, np.float32))
    res["peak_rss"] = peak_rss()
    return res


def grass_fill(tif: Path, out: str) -> dict | None:
    """r.fill.dir in a temporary GRASS location (import and export not timed)."""
    if shutil.which("grass") is None or not Path("/usr/bin/time").exists():
        return None
    script = (f"r.in.gdal -o input={tif} output=dem --quiet && g.region raster=dem && "
              f"/usr/bin/time -f 'RSS %M SEC %e' -o {out}.time r.fill.dir input=dem output=filled direction=dir "
              f"--quiet && r.out.gdal -f input=filled output={out}.tif format=GTiff type=Float32 --quiet")
    p = subprocess.run(["grass", "--tmp-location", "XY", "--exec", "bash", "-c", script], capture_output=True,
                       text=True)
    if p.returncode or not Path(f"{out}.time").exists():
        return {"what": "grass", "error": (p.stderr or p.stdout)[-300:]}
    words = Path(f"{out}.time").read_text().split()
    return {"what": "grass", "seconds": float(words[words.index("SEC") + 1]),
            "peak_rss": int(words[words.index("RSS") + 1]) * 1024}


def spawn(what, store, tif, out, device, memory) -> dict:
    return run_child(what, __file__, "--one", what, store, tif, out, device, memory or "")


def compare(ours, other) -> tuple[float, int]:
    import numpy as np

    ok = np.isfinite(ours) & np.isfinite(other)
    diff = np.abs(ours[ok].astype(np.float64) - other[ok].astype(np.float64))
    return float(diff.max()) if diff.size else 0.0, int(np.count_nonzero(diff))


def main():
    ap = bench_parser(sizes=[1024, 4096], memory=True, peers=True, tile=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-mst", action="store_true")
    args = ap.parse_args()
    import numpy as np
    import rasterio

    from terrain_io.memory import format_bytes
    from terrain_io.store import TerrainStore

    work = work_folder(args, "fill")
    header(f"device {args.device}")
    rows = []
    for n in args.sizes:
        st = synthetic_dem(work, n, args.tile)
        tif = work / f"dem{n}.tif"
        if not args.no_peers:
            write_geotiff(tif, np.asarray(st.elevation[...]))
        print(f"\n{n}^2:", flush=True)
        runs = {"ours": spawn("ours", str(st.path), str(tif), str(work / "ours"), args.device, args.memory)}
        ours = np.asarray(TerrainStore.open(st.path).group["fill/elevation"][...])
        if not args.no_mst:
            runs["ours-mst"] = spawn("ours-mst", str(st.path), str(tif), str(work / "mst"), args.device, args.memory)
        if not args.no_peers:
            for what in ("pyflwdir", "pysheds"):
                out = str(work / f"{what}{n}.npy")
                try:
                    runs[what] = spawn(what, str(st.path), str(tif), out, args.device, None)
                    runs[what]["max_abs_diff"], runs[what]["cells_differing"] = compare(ours, np.load(out))
                except RuntimeError as exc:
                    runs[what] = {"what": what, "error": str(exc)[-300:]}
            g = grass_fill(tif, str(work / f"grass{n}"))
            if g is None:
                print("  grass            not installed (apt-get install grass-core): skipped")
            else:
                if "seconds" in g:
                    with rasterio.open(str(work / f"grass{n}") + ".tif") as ds:
                        g["max_abs_diff"], g["cells_differing"] = compare(ours, ds.read(1))
                runs["grass"] = g
        base = runs["ours"]["seconds"]
        for what, r in runs.items():
            if "seconds" not in r:
                print(f"  {what:10s} failed: {r.get('error')}")
                continue
            extra = (f"  max|diff| {r['max_abs_diff']:.3g} ({r['cells_differing']:,} cells)"
                     if "max_abs_diff" in r else "")
            ratio = r["seconds"] / base if what != "ours" else 1.0
            print(f"  {what:10s} {r['seconds']:8.2f} s  {ratio:6.2f}x ours  peak "
                  f"{format_bytes(r['peak_rss']) if r.get('peak_rss') else '?'}{extra}"
                  + (f"  {r['timings']} {r['method']}" if what == "ours" else ""), flush=True)
            rows.append({"n": n, **r})
    save_rows(rows, args.json)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        a = sys.argv[2:]
        print(json.dumps(one(a[0], a[1], a[2], a[3], a[4], a[5] or None)))
    else:
        main()
