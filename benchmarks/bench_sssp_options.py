"""SSSP options a GIS user reaches for, timed against the plain run in one process:

* ``--max-cost`` with a radius of 1% of the DEM's width (weight ``surface``: about metres on this
  gentle terrain), by the in-core method (reads and writes the whole grid, solves the area
  reached) and the shard method with one-shard units (reads and solves only the units reached);
* the ``walk`` model (directed, an exp per edge) against ``absdiff``;
* ``--allocation`` (a pass over the predecessors) with 16 sources against the plain 16-source run.

    python benchmarks/bench_sssp_options.py --size 4096 --device cpu
    python benchmarks/bench_sssp_options.py --size 16384 --device gpu
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

CELL = 10.0


def timed(st, src, device, **kw):
    from terrain_io.grid.sssp import sssp

    t = time.perf_counter()
    r = sssp(st, src, cell=True, device=device, progress=False, **kw)
    return time.perf_counter() - t, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    from terrain_io.synth import synthesize

    n = args.size
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        st = synthesize(Path(tmp) / "dem.zarr", n, seed=1, cell_size=CELL, progress=False)
        centre = [(n // 2, n // 2)]
        for weight in ("surface", "absdiff", "walk"):  # compile / load the kernels first
            timed(st, centre, args.device, weight=weight, name="warm", max_cost=CELL, allocation=True)
        radius = 0.01 * n * CELL
        unit = st.tile_size * st.shard_size
        print(f"{n}^2 on the {args.device.upper()}; --max-cost {radius:g} (1% of the width)")
        rows = []
        t_full, r_full = timed(st, centre, args.device, weight="surface", name="full", method="incore")
        rows.append(("surface, full run (in-core)", t_full, r_full.reached, 1.0))
        for method, kw in (("incore", {}), ("shards", {"unit": unit})):
            t, r = timed(st, centre, args.device, weight="surface", name=f"cut-{method}", method=method,
                         max_cost=radius, **kw)
            rows.append((f"surface, --max-cost, {method}", t, r.reached, t / t_full))
        t_abs, r_abs = timed(st, centre, args.device, weight="absdiff", name="abs", method="incore")
        rows.append(("absdiff, full run (in-core)", t_abs, r_abs.reached, 1.0))
        t_walk, r_walk = timed(st, centre, args.device, weight="walk", name="walk", method="incore")
        rows.append(("walk, full run (in-core)", t_walk, r_walk.reached, t_walk / t_abs))
        rng = np.random.default_rng(0)
        many = [tuple(map(int, rc)) for rc in rng.integers(0, n, (16, 2))]
        t_many, r_many = timed(st, many, args.device, weight="absdiff", name="many", method="incore")
        rows.append(("absdiff, 16 sources", t_many, r_many.reached, 1.0))
        t_alloc, r_alloc = timed(st, many, args.device, weight="absdiff", name="alloc", method="incore",
                                 allocation=True)
        rows.append(("absdiff, 16 sources, --allocation", t_alloc, r_alloc.reached, t_alloc / t_many))
        print("| run | seconds | cells reached | ratio |")
        print("|---|---|---|---|")
        for what, t, reached, ratio in rows:
            print(f"| {what} | {t:.2f} | {reached:,} | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
