"""Overviews and web map tiles: ``terrain overviews`` against one read of the store, and the time of a
tile of ``terrain view``, cold (rendered) and warm (from the cache).

Each figure is wall seconds and CPU seconds (user + sys of this process: on a shared machine the
CPU time is the steadier figure; ``*_sys`` its system part); "cores" is CPU / wall (how many cores
were kept busy), head_ms and tail_ms the pyramid's time before its first base block is read and after
its last (one thread works).
"One read": every shard of the array read and decoded in Morton order (``store.read_shard``, one
thread, as the overviews' pass reads them), the files in the page cache as for the overviews run just
after it (an untimed first run warms it); each timed run writes
the first pyramid of the store: the one before it is moved aside untimed (a replacement also deletes the
old) and deleted after the last run, not just before the timed one as ``--remove-old`` does: on an
ext4 without a journal (the 2-core VM's) each new inode is searched past the inodes freed nearby in the
last seconds (``recently_deleted``), and a pyramid's 88 new files and folders cost 2 to 40 ms of system
time by how much was freed before it (benchmarks/RESULTS.md, issue 32). Tiles: a fresh
:class:`terrain_io.view.tiles.TileSource` on the store with its overviews; ``--tiles`` distinct
tiles at each of three zooms (the whole DEM in a few tiles, a middle zoom, the native zoom where a
pixel is about a cell), each rendered once (cold), then served again (warm).

    python benchmarks/bench_view.py --size 4096                 # synthesizes the store in a temporary folder
    python benchmarks/bench_view.py --store fill.zarr --array fill/elevation
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import timed  # noqa: E402 (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_once(path, array):
    from terrain_io.store import TerrainStore, read_shard
    from terrain_io.zorder import morton_order

    st = TerrainStore.open(path, mode="r")
    arr = st.group[array]
    side = st.tile_size * st.shard_size
    for r, c in morton_order(*(-(-n // side) for n in arr.shape)):
        read_shard(arr, int(r), int(c))


def system_seconds() -> float:
    """The kernel's CPU seconds of this process: where a pyramid's new file pages are paid (on the
    2-core VM each 4 KiB page of memory it had handed back to its host faults there when first
    written: 22 MB of new file pages cost 4-8 ms of system time into pages just freed, 8-90 ms
    into others; benchmarks/RESULTS.md, issue 32, fifth round)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def timed_reads(fn):
    """(fn(), {"head_ms", "tail_ms"}): the time before the first base block's read starts and after the
    last one ends -- where the pyramid's fixed work runs with a core idle (``overviews.read_halved``
    wrapped)."""
    import time

    import terrain_io.overviews as ov

    inner, spans = ov.read_halved, []

    def wrapped(*args):
        t = time.perf_counter()
        try:
            return inner(*args)
        finally:
            spans.append((t, time.perf_counter()))

    ov.read_halved = wrapped
    try:
        start = time.perf_counter()
        out = fn()
        end = time.perf_counter()
    finally:
        ov.read_halved = inner
    return out, {"head_ms": round(1000 * (min(a for a, _ in spans) - start), 1),
                 "tail_ms": round(1000 * (end - max(b for _, b in spans)), 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--store", type=Path, default=None, help="an existing store (its overviews are replaced)")
    ap.add_argument("--array", default="elevation")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tiles", type=int, default=12)
    ap.add_argument("--scheduler", default="local")
    ap.add_argument("--no-warmup", action="store_true", help="no untimed first run (a store just written is cached)")
    ap.add_argument("--remove-old", action="store_true",
                    help="delete the last pyramid just before each timed run (the earlier rounds' figures)")
    ap.add_argument("--keep-old", type=Path, default=None,
                    help="move the replaced pyramids into this folder and keep them (runs one after another: "
                         "no run pays for the inodes the one before freed)")
    args = ap.parse_args()
    from terrain_io.overviews import write_overviews
    from terrain_io.view.tiles import TileSource

    tmp = None
    path = args.store
    if path is None:
        tmp = Path(tempfile.mkdtemp(prefix="bench_view_"))
        path = tmp / "s.zarr"
        subprocess.run([sys.executable, "-m", "cli", "-q", "synth", "-o", str(path), "--size", str(args.size),
                        "--seed", "1", "--nodata-fraction", "0.02"], check=True, cwd=ROOT)
    rows = []
    old = Path(tempfile.mkdtemp(prefix=".bench_view_old_", dir=args.keep_old or Path(path).parent))  # moved aside
    try:
        if not args.no_warmup:
            write_overviews(path, [args.array], scheduler=args.scheduler)  # compiles the kernels, warms the cache
        else:  # the kernels compiled on a small block only
            from terrain_io.overviews import reduce2x2, resampling_for
            from terrain_io.store import TerrainStore

            dtype = TerrainStore.open(path, mode="r").group[args.array].dtype
            reduce2x2(np.zeros((4, 4), dtype), resampling_for(args.array, dtype), None)
        for rep in range(args.reps):
            if args.remove_old:  # a first pyramid, not a replacement
                shutil.rmtree(Path(path) / "overviews", ignore_errors=True)
            elif (Path(path) / "overviews").exists():
                (Path(path) / "overviews").rename(old / str(rep))
            rs = system_seconds()
            _, rw, rc = timed(lambda: read_once(path, args.array))
            rs, os_ = system_seconds() - rs, system_seconds()
            (_, edges), ow, oc = timed(lambda: timed_reads(lambda: write_overviews(path, [args.array],
                                                                                  scheduler=args.scheduler)))
            os_ = system_seconds() - os_
            rows.append({"what": "overviews", "array": args.array, "rep": rep, "read_wall": round(rw, 3),
                         "read_cpu": round(rc, 3), "overviews_wall": round(ow, 3), "overviews_cpu": round(oc, 3),
                         "ratio_wall": round(ow / rw, 2), "ratio_cpu": round(oc / rc, 2),
                         "read_cores": round(rc / rw, 2), "overviews_cores": round(oc / ow, 2),
                         "read_sys": round(rs, 3), "overviews_sys": round(os_, 3), **edges})
            print(json.dumps(rows[-1]), flush=True)
        runs = [r for r in rows if r["what"] == "overviews"]
        best = {k: min(r[k] for r in runs) for k in ("read_wall", "read_cpu", "overviews_wall", "overviews_cpu",
                                                    "read_sys", "overviews_sys")}
        print(json.dumps({"what": f"overviews, best of {len(runs)}", **best,
                          "ratio_wall": round(best["overviews_wall"] / best["read_wall"], 2),
                          "ratio_cpu": round(best["overviews_cpu"] / best["read_cpu"], 2),
                          "median_ratio_wall": float(np.median([r["ratio_wall"] for r in runs])),
                          "median_overviews_sys": float(np.median([r["overviews_sys"] for r in runs]))}), flush=True)
        source, _, _ = timed(lambda: TileSource(path))
        top = source.native_zoom()
        w, s, e, n = source.bounds_lonlat()
        for zoom in (max(0, top - 6), max(0, top - 3), top):
            tiles = _tiles_over(w, s, e, n, zoom, args.tiles)
            cold = [timed(lambda t=t: source.tile(args.array, *t))[1] for t in tiles]
            warm = [timed(lambda t=t: source.tile(args.array, *t))[1] for t in tiles]
            rows.append({"what": "tile", "array": args.array, "zoom": zoom, "tiles": len(tiles),
                         "cold_median_ms": round(1000 * float(np.median(cold)), 1),
                         "cold_max_ms": round(1000 * max(cold), 1),
                         "warm_median_ms": round(1000 * float(np.median(warm)), 3),
                         "warm_max_ms": round(1000 * max(warm), 3)})
            print(json.dumps(rows[-1]), flush=True)
        http_tiles(path, args.array, top, source.bounds_lonlat(), args.tiles, rows)
    finally:
        if args.keep_old is None:
            shutil.rmtree(old, ignore_errors=True)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def http_tiles(path, array, top, bounds, count, rows):
    """Tiles through ``terrain view``'s server on 127.0.0.1 (a fresh one: cold, then warm), each
    request on its own connection as a browser's first one."""
    import http.client
    import threading

    from terrain_io.view import make_server

    server = make_server(path, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def fetch(t):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("GET", f"/tiles/{array}/{t[0]}/{t[1]}/{t[2]}.png")
        r = conn.getresponse()
        body = r.read()
        conn.close()
        assert r.status == 200, (r.status, body)

    try:
        for zoom in (max(0, top - 6), max(0, top - 3), top):
            tiles = _tiles_over(*bounds, zoom, count)
            cold = [timed(lambda t=t: fetch(t))[1] for t in tiles]
            warm = [timed(lambda t=t: fetch(t))[1] for t in tiles]
            rows.append({"what": "http tile", "array": array, "zoom": zoom, "tiles": len(tiles),
                         "cold_median_ms": round(1000 * float(np.median(cold)), 1),
                         "cold_max_ms": round(1000 * max(cold), 1),
                         "warm_median_ms": round(1000 * float(np.median(warm)), 2),
                         "warm_max_ms": round(1000 * max(warm), 2)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.shutdown()
        server.server_close()


def _tiles_over(w, s, e, n, zoom, count):
    """Up to ``count`` distinct tiles of ``zoom`` over the DEM, spread over it."""
    def tile_of(lon, lat):
        k = 2**zoom
        x = int((lon + 180) / 360 * k)
        y = int((1 - math.asinh(math.tan(math.radians(lat))) / math.pi) / 2 * k)
        return min(x, k - 1), min(y, k - 1)

    found = []
    for a in np.linspace(0.05, 0.95, 8):
        for b in np.linspace(0.05, 0.95, 8):
            t = (zoom, *tile_of(w + a * (e - w), s + b * (n - s)))
            if t not in found:
                found.append(t)
    return found[:count]


if __name__ == "__main__":
    main()
