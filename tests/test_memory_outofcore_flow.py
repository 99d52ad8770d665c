"""``terrain flow --memory`` on a store 8x the budget (README "Memory budgets"): in a fresh process,
after the imports and a warm-up run on a small store (the kernels loaded), the out-of-core pipeline's
peak RSS grows by at most the budget above the process's own baseline. The budget must hold the
window, the perimeter lists of every window edge (exits and entries, ~80 bytes a window-edge cell)
and the flats' lists; the DEM is float64 so that a store 8x the budget leaves windows large enough
for that floor."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from terrain_io.store import TerrainStore

_SCRIPT = r"""
import json, sys
from terrain_io.grid.flow.pipeline import flow
from terrain_io.memory import current_rss, peak_rss, reset_peak_rss

big, warm, budget = sys.argv[1:4]
flow(warm, condition="none", memory=budget, progress=False, window_tiles=2)  # kernels of the tiled pipeline loaded
reset_peak_rss()
base = current_rss()
r = flow(big, condition="none", memory=budget, progress=False)
print(json.dumps({"method": r.method, "window_tiles": r.window_tiles, "flat_cells": r.flat_cells,
                  "grown": peak_rss() - base, "timings": r.timings}))
"""


def _terrain(n: int, seed: int) -> np.ndarray:
    """A ramp with noise, terraced (exact-tie flats, some crossing window edges) in its middle band."""
    rng = np.random.default_rng(seed)
    r = np.arange(n, dtype=np.float64)[:, None]
    c = np.arange(n, dtype=np.float64)[None, :]
    z = 0.01 * r + 0.02 * c + 3 * np.sin(c / 97) * np.cos(r / 71)
    band = slice(n // 3, n // 3 + n // 16)
    z[band] = np.floor(z[band] * 2) / 2
    z[: band.start] += rng.random((band.start, n))
    z[band.stop:] += rng.random((n - band.stop, n))
    return z


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux peak-RSS reset")
def test_flow_outofcore_within_budget(tmp_path):
    n = 6144
    big = TerrainStore.from_array(tmp_path / "big.zarr", _terrain(n, 1), tile=256, shard=2)
    warm = TerrainStore.from_array(tmp_path / "warm.zarr", _terrain(1027, 2), tile=256, shard=2)
    budget = n * n * 8 // 8
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(big.path), str(warm.path), str(budget)],
                         capture_output=True, text=True, timeout=1800, env={**os.environ, "NUMBA_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(res)  # the figures for benchmarks/RESULTS.md (pytest -rP)
    assert res["method"] == "tiled" and res["flat_cells"] > 0, res
    assert n * n * big.dtype.itemsize >= 8 * budget
    assert res["grown"] <= budget, f"peak RSS grew by {res['grown'] / 2**20:.1f} MiB, budget {budget / 2**20:.1f} MiB"
