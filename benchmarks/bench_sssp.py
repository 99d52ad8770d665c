"""Grid SSSP benchmark: ours (first source, and a further source with the stored index) against
scipy.sparse.csgraph.dijkstra (absdiff), scikit-image MCP_Geometric and GRASS r.cost (cell model),
side by side on the same synthetic DEMs. Every measurement runs in its own process, so its peak
RSS is its own; results are compared cell by cell with the peers'.

Two times for each: ``seconds``, the call alone (after the imports: ours from the store to the
written result, numba's first load of its cached kernels included; the Python peers from reading
the store's array to the distances in memory), and ``process``, the whole fresh process as this
script waits for it (interpreter start, imports, the call, exit; less the peers' saving of their
result for the comparison). GRASS r.cost's time is its own process either way.

    python benchmarks/bench_sssp.py --sizes 1024 2048 4096
    python benchmarks/bench_sssp.py --sizes 8192 16384 --no-peers --device gpu   # the H100 case
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import warm_side, with_cost_raster  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]


def one(what: str, store: str, n: int, device: str, cluster: int, out: str, method: str = "auto") -> dict:
    """One measurement in this (fresh) process."""
    import numpy as np

    from terrain_io.memory import peak_rss
    from terrain_io.store import TerrainStore

    src = (n // 3, n // 2)
    st = TerrainStore.open(store)
    res = {"what": what}
    if what.startswith("ours"):
        from terrain_io.grid.sssp import sssp

        weight = "cell" if "cell" in what else "absdiff"
        cost = "cost/c" if weight == "cell" else None
        if what.endswith("first"):
            shutil.rmtree(Path(store) / "index", ignore_errors=True)
        t = time.perf_counter()
        r = sssp(st, src, weight=weight, cost=cost, cell=True, device=device, progress=False, name=what,
                 method=method, **({"cluster": cluster} if method == "index" else {}))
        res.update(seconds=time.perf_counter() - t, timings=r.timings, index_reused=r.index_reused,
                   merge_stats=r.merge_stats)
    elif what == "scipy":
        import scipy.sparse as sp
        from scipy.sparse.csgraph import dijkstra

        t = time.perf_counter()
        v = st.elevation[:].astype(np.float64)
        ids = np.arange(n * n, dtype=np.int32).reshape(n, n)
        us, vs, ws = [], [], []
        for dr, dc in ((0, 1), (1, 1), (1, 0), (1, -1)):  # each undirected edge once
            r0, r1, c0, c1 = 0, n - dr, max(0, -dc), n - max(0, dc)
            us.append(ids[r0:r1, c0:c1].ravel())
            vs.append(ids[r0 + dr : r1 + dr, c0 + dc : c1 + dc].ravel())
            ws.append(np.abs(v[r0:r1, c0:c1] - v[r0 + dr : r1 + dr, c0 + dc : c1 + dc]).ravel() + 1e-300)
        del v
        g = sp.csr_matrix((np.concatenate(ws), (np.concatenate(us), np.concatenate(vs))), shape=(n * n, n * n))
        del us, vs, ws
        d = dijkstra(g, directed=False, indices=src[0] * n + src[1])
        res["seconds"] = time.perf_counter() - t
        np.save(out, d.reshape(n, n).astype(np.float32))
        res["save"] = time.perf_counter() - t - res["seconds"]
    elif what == "mcp":
        from skimage.graph import MCP_Geometric

        t = time.perf_counter()
        c = st.group["cost/c"][:].astype(np.float64)
        d, _ = MCP_Geometric(c, fully_connected=True, sampling=(10.0, 10.0)).find_costs([src])
        res["seconds"] = time.perf_counter() - t
        np.save(out, d.astype(np.float32))
        res["save"] = time.perf_counter() - t - res["seconds"]
    res["peak_rss"] = peak_rss()
    return res


def grass_rcost(tif: Path, n: int, out: str) -> dict | None:
    """r.cost on the cost raster in a temporary GRASS location (import and export not timed)."""
    if shutil.which("grass") is None:
        return None
    for old in (f"{out}.tif", f"{out}.sec", f"{out}.time"):  # a reused --workdir's (r.out.gdal refuses to overwrite)
        Path(old).unlink(missing_ok=True)
    row, col = n // 3, n // 2
    x, y = (col + 0.5) * 10.0, (n - row - 0.5) * 10.0
    script = (f"r.in.gdal -o input={tif} output=cost --quiet && g.region raster=cost && "
              f"/usr/bin/time -f 'RSS %M' -o {out}.time bash -c 'T0=$(date +%s.%N); "
              f"r.cost input=cost output=acc start_coordinates={x},{y} --quiet; "
              f"echo $(echo \"$(date +%s.%N) - $T0\" | bc) > {out}.sec' && "
              f"r.out.gdal -f input=acc output={out}.tif format=GTiff type=Float64 --quiet")
    if shutil.which("bc") is None or not Path("/usr/bin/time").exists():
        script = script.replace(f"/usr/bin/time -f 'RSS %M' -o {out}.time ", "")
        script = script.replace("T0=$(date +%s.%N); ", "").replace(
            f"; echo $(echo \"$(date +%s.%N) - $T0\" | bc) > {out}.sec", "")
    t = time.perf_counter()
    subprocess.run(["grass", "--tmp-location", "XY", "--exec", "bash", "-c", script], check=True,
                   capture_output=True)
    seconds = time.perf_counter() - t
    res = {"what": "grass", "seconds": seconds, "peak_rss": None}
    if Path(f"{out}.sec").exists():
        res["seconds"] = float(Path(f"{out}.sec").read_text())
    res["process"] = res["seconds"]  # (r.cost's own process)
    if Path(f"{out}.time").exists():
        for line in Path(f"{out}.time").read_text().splitlines():
            if line.startswith("RSS"):
                res["peak_rss"] = int(line.split()[1]) * 1024
    return res


METHOD = "auto"  # --method: ours by this SSSP method


def spawn(what, store, n, device, cluster, out) -> dict:
    cmd = [sys.executable, __file__, "--one", what, store, str(n), device, str(cluster), out, METHOD]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    wall = time.perf_counter() - t
    if p.returncode:
        raise RuntimeError(f"{what} failed: {p.stderr[-2000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["process"] = wall - res.pop("save", 0.0)
    return res


def make_store(folder: Path, n: int):
    from terrain_io.synth import synthesize

    return with_cost_raster(synthesize(folder / f"dem{n}.zarr", n, seed=1, cell_size=10.0, overwrite=True))


def compare(store, name: str, ref_path: str) -> float:
    import numpy as np

    from terrain_io.store import TerrainStore

    ours = TerrainStore.open(store).group[f"sssp/{name}/distance"][:].astype(np.float64)
    ref = np.load(ref_path).astype(np.float64)
    ok = np.isfinite(ref) & (ref > 0)
    return float(np.max(np.abs(ours[ok] - ref[ok]) / ref[ok]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--cluster", type=int, default=8)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-cell", action="store_true")
    ap.add_argument("--first-only", action="store_true", help="skip the further source (large sizes)")
    ap.add_argument("--method", default="auto", help="our SSSP method (auto|incore|shards|index)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    global METHOD
    METHOD = args.method
    import numpy as np

    from terrain_io.backend import resolve_device
    from terrain_io.memory import format_bytes

    device = resolve_device(args.device)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-sssp-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"device {device}, method {args.method}, cluster {args.cluster}, {os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d')}")
    # numba compiles the kernels once per installation (cached on disk): do it outside the timings,
    # for the serial twins (small grids) and the parallel builds (from jit.SERIAL_BELOW cells on)
    for side in sorted({256, *(warm_side(n) for n in args.sizes)}):
        warm = make_store(work, side)
        for model in ["absdiff"] + ([] if args.no_cell else ["cell"]):
            tag = "" if model == "absdiff" else "-cell"
            spawn(f"ours{tag}-first", str(warm.path), side, device, args.cluster, "")
        shutil.rmtree(warm.path, ignore_errors=True)
    for n in args.sizes:
        t = time.perf_counter()
        st = make_store(work, n)
        store = str(st.path)
        print(f"\n{n}^2: synthetic store in {time.perf_counter() - t:.1f} s", flush=True)
        runs = {}
        models = ["absdiff"] + ([] if args.no_cell else ["cell"])
        for model in models:
            tag = "" if model == "absdiff" else "-cell"
            for what in (f"ours{tag}-first",) + (() if args.first_only else (f"ours{tag}-again",)):
                runs[what] = spawn(what, store, n, device, args.cluster, "")
                r = runs[what]
                print(f"  {what:16s} {r['seconds']:8.2f} s  process {r['process']:6.2f} s  peak "
                      f"{format_bytes(r['peak_rss'])}  {r['timings']}  "
                      f"merge {r['merge_stats'].get('seconds')}",
                      flush=True)
            if args.no_peers:
                continue
            peers = ["scipy"] if model == "absdiff" else ["mcp"]
            for what in peers:
                out = str(work / f"{what}{n}.npy")
                runs[what] = spawn(what, store, n, device, args.cluster, out)
                runs[what]["max_rel_diff"] = compare(store, f"ours{tag}-" + ("first" if args.first_only else "again"), out)
            if model == "cell":
                tif = work / f"cost{n}.tif"
                import rasterio

                c = st.group["cost/c"][:]
                with rasterio.open(tif, "w", driver="GTiff", width=n, height=n, count=1, dtype="float32",
                                   transform=rasterio.transform.from_origin(0, n * 10.0, 10.0, 10.0)) as ds:
                    ds.write(c, 1)
                g = grass_rcost(tif, n, str(work / f"grass{n}"))
                if g is None:
                    print("  grass            not installed (apt-get install grass-core): skipped")
                else:
                    import rasterio

                    with rasterio.open(str(work / f"grass{n}") + ".tif") as ds:
                        # r.cost counts steps in cells (1 or sqrt 2), not map units: scale to the cell size
                        np.save(work / f"grass{n}.npy", (ds.read(1) * 10.0).astype(np.float32))
                    g["max_rel_diff"] = compare(store, f"ours{tag}-" + ("first" if args.first_only else "again"), str(work / f"grass{n}.npy"))
                    runs["grass"] = g
            for what in peers + (["grass"] if model == "cell" and "grass" in runs else []):
                r = runs[what]
                mine_first, mine_again = runs[f"ours{tag}-first"], runs.get(f"ours{tag}-again")
                again = f", again {r['seconds'] / mine_again['seconds']:.2f}x" if mine_again else ""
                print(f"  {what:16s} {r['seconds']:8.2f} s  process {r['process']:6.2f} s  peak "
                      f"{format_bytes(r['peak_rss']) if r['peak_rss'] else '?'}  max rel diff {r['max_rel_diff']:.1e}"
                      f"  -> ours first {r['seconds'] / mine_first['seconds']:.2f}x{again} faster "
                      f"(process {r['process'] / mine_first['process']:.2f}x)", flush=True)
        rows.append({"n": n, "device": device, "cluster": args.cluster, "runs": runs})
        shutil.rmtree(st.path, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        what, store, n, device, cluster, out, method = sys.argv[2:9]
        print(json.dumps(one(what, store, int(n), device, int(cluster), out, method)))
    else:
        main()
