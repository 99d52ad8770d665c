"""In-core SSSP engine: a first source on synthetic terrain, ours against peers in one process on
the same cost surface, plus the CLI's wall time in a fresh process.

Peers (each where installed): xarray-spatial's ``cost_distance`` on CuPy (GPU) or NumPy,
scikit-image's MCP_Geometric and scipy.sparse.csgraph.dijkstra (CPU). The cost surface is the
``cell`` model's ((c_i + c_j) / 2 * step over a cost raster c), the convention all of them share;
ours also runs ``absdiff``. Distances are compared with each peer's.

    python benchmarks/bench_sssp_incore.py --sizes 8192 16384 --device gpu --peers xrspatial
    python benchmarks/bench_sssp_incore.py --sizes 1024 2048 4096 --device cpu --peers mcp scipy
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import with_cost_raster  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
CELL = 10.0


def make_store(folder: Path, n: int):
    from terrain_io.synth import synthesize

    return with_cost_raster(synthesize(folder / f"dem{n}.zarr", n, seed=1, cell_size=CELL, overwrite=True,
                                       progress=False))


def ours(st, src, weight, device):
    from terrain_io.grid.sssp import sssp

    t = time.perf_counter()
    r = sssp(st, src, weight=weight, cost="cost/c" if weight == "cell" else None, cell=True, device=device,
             progress=False, method="incore", name=f"bench-{weight}")
    return time.perf_counter() - t, r


def peer(what, cost, src, device):
    """Seconds and distances of a peer on the cost raster ``cost`` (NumPy float32)."""
    n = cost.shape[0]
    t = time.perf_counter()
    if what == "xrspatial":
        np.row_stack = np.vstack  # numba.cuda in xarray-spatial 0.10 still calls it
        import xarray as xr
        from xrspatial import cost_distance

        xp = np
        if device == "gpu":
            import cupy as xp
        coords = {"y": np.arange(n)[::-1] * CELL, "x": np.arange(n) * CELL}
        raster = xp.zeros((n, n), np.float32)
        raster[src] = 1.0
        fr = xr.DataArray(xp.asarray(cost), dims=("y", "x"), coords=coords)
        ra = xr.DataArray(raster, dims=("y", "x"), coords=coords)
        t = time.perf_counter()
        d = cost_distance(ra, fr).data
        d = d.get() if hasattr(d, "get") else np.asarray(d)
    elif what == "mcp":
        from skimage.graph import MCP_Geometric

        d, _ = MCP_Geometric(cost.astype(np.float64), fully_connected=True, sampling=(CELL, CELL)).find_costs([src])
    else:
        raise ValueError(what)
    return time.perf_counter() - t, d


def cli_wall(store: Path, src, weight: str, device: str) -> float:
    cmd = [sys.executable, "-c", "from cli.main import main; main()", "-q", "sssp", str(store), "--cell", "--source", f"{src[0]},{src[1]}",
           "--weight", weight, "--method", "incore", "--device", device, "--name", "cli"]
    if weight == "cell":
        cmd += ["--cost", "cost/c"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--peers", nargs="*", default=["mcp"])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--no-cli", action="store_true")
    args = ap.parse_args()
    from terrain_io.backend import resolve_device
    from terrain_io.memory import format_bytes, peak_rss

    device = resolve_device(args.device)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-incore-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"device {device}, {os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d')}", flush=True)
    warm = make_store(work, 128)
    for weight in ("absdiff", "cell"):
        ours(warm, (5, 5), weight, device)  # compile outside the timings
    for n in args.sizes:
        t = time.perf_counter()
        st = make_store(work, n)
        print(f"\n{n}^2 ({n * n / 1e6:.0f}M cells): store made in {time.perf_counter() - t:.1f} s", flush=True)
        src = (n // 3, n // 2)
        for weight in ("absdiff", "cell"):
            sec, r = ours(st, src, weight, device)
            extra = ""
            if device == "gpu":
                from terrain_io.grid.sssp import _incore_gpu

                extra = f", {_incore_gpu.solve_block_gpu.rounds} rounds"
            print(f"  ours {weight:8s} {sec:7.2f} s ({r.timings}{extra}), {n * n / sec / 1e6:.0f} Mcells/s, "
                  f"peak RSS {format_bytes(peak_rss())}", flush=True)
            if not args.no_cli:
                print(f"  ours {weight:8s} CLI wall (fresh process) {cli_wall(st.path, src, weight, device):.2f} s",
                      flush=True)
        mine = st.group["sssp/bench-cell/distance"][:].astype(np.float64)
        cost = st.group["cost/c"][:]
        for what in args.peers:
            try:
                ps, d = peer(what, cost, src, device)
            except ImportError as e:
                print(f"  {what}: not installed ({e})")
                continue
            ok = np.isfinite(d) & (d > 0)
            diff = float(np.max(np.abs(mine[ok] - d[ok]) / d[ok]))
            print(f"  {what:13s} {ps:7.2f} s, max rel diff {diff:.1e} -> ours (cell) {ps / sec:.1f}x faster",
                  flush=True)
        shutil.rmtree(st.path, ignore_errors=True)


if __name__ == "__main__":
    main()
