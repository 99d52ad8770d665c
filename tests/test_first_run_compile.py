"""Issue 27's fast first run, session 15: what each command compiles on its first run, and the routes
that compile less while giving the same results.

- The MST of a small DEM in memory (one Kruskal: ``grid/mst/_cpu.grid_forest``) against scipy's
  minimum spanning tree with the strict order made explicit (``references.scipy_msf``) and against
  the tiled pipeline (forced with ``batch_tiles``), on the cases that stress the order and the exact sum.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from references import islands, scipy_msf, terrain
from terrain_io.grid.mst import edge_list, mst, pipeline as mst_pipeline, read_edges
from terrain_io.store import TerrainStore, valid_mask


def _mst_cases():
    rng = np.random.default_rng(27)
    ties = terrain(61, 47, seed=3, levels=4)
    ties[10:40, 5:30] = 2.0
    zeros = rng.choice(np.array([-0.0, 0.0, -1.5, 2.0, -3.0], dtype=np.float32), size=(33, 41))
    pool = np.array([1e-45, -1e-45, 3e-39, 1e-30, -2.5e-20, 7.0, -1e30, 3.4e38, -3.4e38, 1234.5678], dtype=np.float32)
    extremes = rng.choice(pool, size=(29, 37))
    ints = rng.choice(np.array([-2**31, -2**31 + 1, -5, 0, 5, 2**31 - 2, 2**31 - 1]), size=(27, 31)).astype(np.int32)
    holes = terrain(50, 64, seed=11)
    holes[rng.random(holes.shape) < 0.3] = np.nan
    holes[:, 30:32] = np.nan  # a moat: islands on both sides
    return [("ties", ties, "max"), ("ties-absdiff", ties, "absdiff"), ("signed-zeros", zeros, "max"),
            ("float32-extremes", extremes, "max"), ("int32-extremes", ints, "max"),
            ("float64", zeros.astype(np.float64), "absdiff"), ("nan-islands", holes, "max"),
            ("nan-islands-absdiff", holes, "absdiff"), ("one-row", rng.random((1, 40)).astype(np.float32), "max")]


@pytest.mark.parametrize("name,vals,weight", _mst_cases(), ids=[c[0] for c in _mst_cases()])
def test_small_mst_in_memory_matches_scipy_and_the_tiled_pipeline(tmp_path, name, vals, weight):
    results = {}
    for route, kw in (("memory", {}), ("tiled", {"batch_tiles": 1})):
        store = TerrainStore.from_array(tmp_path / f"{route}.zarr", vals, tile=8, shard=2)
        res = mst(store, weight=weight, device="cpu", progress=False, **kw)
        assert (res.batch_tiles == 0) == (route == "memory")  # the route taken: in memory unless forced
        u, v = edge_list(read_edges(store))
        results[route] = res, set(zip(u.tolist(), v.tolist())), read_edges(store)
    valid = valid_mask(vals, None)
    want, total = scipy_msf(vals, valid, weight)
    for route, (res, got, _) in results.items():
        assert got == want, route
        assert Fraction(res.total_weight_exact) == total and res.total_weight == float(total), route
        assert res.trees == islands(valid) and res.edges == len(want), route
    np.testing.assert_array_equal(results["memory"][2], results["tiled"][2])  # the same bits in mst/edges


def test_mst_in_memory_only_below_its_size_and_within_the_budget(tmp_path, monkeypatch):
    vals = terrain(40, 40, seed=5)
    store = TerrainStore.from_array(tmp_path / "d.zarr", vals, tile=8, shard=2)
    assert mst(store, device="cpu", progress=False).batch_tiles == 0
    assert mst(store, device="cpu", progress=False, memory=mst_pipeline.IN_MEMORY_BYTES * 1600 - 1).batch_tiles > 0
    monkeypatch.setattr(mst_pipeline, "IN_MEMORY_BELOW", 1600)
    assert mst(store, device="cpu", progress=False).batch_tiles > 0


def test_demo_sssp_warm_up_compiles_every_kernel_the_step_runs(tmp_path):
    """The sssp helper's warm-up (a small DEM without a CRS) compiles (or loads) every kernel signature
    that the demo's steps 4-5 then run on the sample (in degrees, EPSG:4269): none is added after it,
    so the helper does not compile twice."""
    script = f"""
import numba
from pathlib import Path
from terrain_io.grid.sssp import _incore_cpu, path as path_module
from terrain_io.grid import _heap_cpu, _radix_cpu
from terrain_io import weights
from cli import demo
def signatures():
    kernels = [v for m in (_incore_cpu, path_module, _heap_cpu, _radix_cpu, weights) for v in vars(m).values()]
    return {{(k.py_func.__qualname__, s) for k in kernels if isinstance(k, numba.core.dispatcher.Dispatcher)
            for s in k.signatures}}
demo._warm_sssp()
warm = signatures()
from terrain_io.convert import convert
from terrain_io.store import TerrainStore
out = Path({str(tmp_path)!r})
st = convert(demo.SAMPLE, out / demo.STORE, tile=demo.TILE, shard=demo.SHARD).path
demo._demo_sssp(TerrainStore.open(st), out)
print(sorted(signatures() - warm) or "none", sorted({{name for name, _ in warm}}))
"""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=root)
    new, warmed = out.stdout.split(" ", 1)
    assert new == "none", out.stdout + out.stderr
    assert all(k in warmed for k in ("'_run_radix'", "'plateau_search'", "'predecessors_serial'")), warmed
