"""Hydrology benchmark on the same flow directions: basins, Strahler stream order and HAND, ours
(``terrain_io.grid.hydro``, in core) against pyflwdir (``basins``, ``stream_order``, ``hand``).

The DEM is ``synth_array`` (seed 1) routed by our ``flow_direction(condition="fill")``; directions,
accumulation and the filled elevations are saved once, then each tool runs in its own process on
them: its kernels compiled first on a 512^2 corner (numba caches), then each operation timed as
wall seconds and CPU seconds (user + sys of the process), and the process's peak RSS reported (the
loaded inputs included, 13 bytes a cell for everyone). pyflwdir's parse of the directions
(``from_array``: its downstream indices and order) is timed with its first operation, as ours
builds its order in each call. Streams: accumulation >= ``--threshold`` cells.

    python benchmarks/bench_hydro.py --size 4096
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import timed  # noqa: E402 (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn):
    out, wall, cpu = timed(fn)
    return out, {"seconds": round(wall, 3), "cpu": round(cpu, 3)}


def as_d8(d):
    out = np.full(d.shape, 247, np.uint8)
    flowing = d < 8
    out[flowing] = (1 << d[flowing].astype(np.int64)).astype(np.uint8)
    out[d >= 8] = 0
    out[d == 255] = 247
    return out


def one(tool: str, folder: Path, threshold: float) -> dict:
    from terrain_io.memory import peak_rss

    d, acc, z = (np.load(folder / f"{n}.npy") for n in ("d", "acc", "z"))
    res = {"tool": tool, "cells": d.size}
    s = np.s_[:512, :512]
    ds, accs, zs = (np.ascontiguousarray(v[s]) for v in (d, acc, z))  # the warm-up's arrays of the same layout
    if tool == "ours":
        from terrain_io.grid.hydro import basins, hand, stream_order

        basins(ds), stream_order(ds, accs, threshold), hand(ds, zs, accs, threshold)
        _, res["basins"] = _timed(lambda: basins(d))
        _, res["strahler"] = _timed(lambda: stream_order(d, acc, threshold))
        _, res["hand"] = _timed(lambda: hand(d, z, acc, threshold))
    else:
        import pyflwdir

        warm = pyflwdir.from_array(as_d8(ds), ftype="d8", check_ftype=False)
        m = accs >= threshold
        warm.basins(), warm.stream_order(mask=m), warm.hand(drain=m, elevtn=zs)
        mask = acc >= threshold
        flw, t = _timed(lambda: pyflwdir.from_array(as_d8(d), ftype="d8", check_ftype=False))
        _, b = _timed(lambda: flw.basins())
        res["basins"] = {k: round(t[k] + b[k], 3) for k in t}  # with the parse of the directions
        _, res["strahler"] = _timed(lambda: flw.stream_order(mask=mask))
        _, res["hand"] = _timed(lambda: flw.hand(drain=mask, elevtn=z))
    res["peak_rss_mib"] = round(peak_rss() / 2**20)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--threshold", type=float, default=1000)
    ap.add_argument("--one", nargs=2, metavar=("TOOL", "FOLDER"))
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], Path(a.one[1]), a.threshold)))
        return
    from terrain_io.grid.flow import flow_accumulation, flow_direction
    from terrain_io.synth import synth_array

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        z = synth_array(a.size, a.size, seed=1)
        d = flow_direction(z, condition="fill", cell_size=(10.0, 10.0))
        from terrain_io.grid.fill import fill_array  # the filled elevations the directions were routed on

        zf = np.asarray(fill_array(z, outlets="edge+nodata")[0], np.float32)
        np.save(folder / "d.npy", d), np.save(folder / "acc.npy", flow_accumulation(d)), np.save(folder / "z.npy", zf)
        del z, d, zf
        for tool in ("ours", "pyflwdir"):
            out = subprocess.run([sys.executable, __file__, "--threshold", str(a.threshold), "--one", tool, tmp],
                                 capture_output=True, text=True, check=True)
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
