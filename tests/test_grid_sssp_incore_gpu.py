"""The in-core SSSP engine on the GPU (CuPy tile relaxation) against the CPU engine, byte for
byte, and against scipy's Dijkstra; run on a GPU machine with ``pytest -m gpu``."""
from __future__ import annotations

import numpy as np
import pytest

from terrain_io.grid.sssp import sssp
from terrain_io.weights import steps_of
from terrain_io.grid.sssp.incore import ringed, solve_block
from references import CASES, check_warm_solve, KINDS, make_store, random_dem, reference, rule_predecessors, terraced

pytestmark = pytest.mark.gpu


def both(block, kind, steps, sources, dist=None, level=None):
    cpu = solve_block(block.copy(), kind, steps, sources, None if dist is None else dist.copy(),
                      None if level is None else level.copy())
    gpu = solve_block(block, kind, steps, sources, dist, level, device="gpu")
    return cpu, tuple(a.get() for a in gpu)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["absdiff", "surface", "cell"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_block_equals_cpu_and_scipy(case, kind, dtype):
    v = CASES[case]()
    if kind == "cell":
        v = np.where(np.isnan(v), np.nan, np.abs(v) + 0.5).astype(np.float32)
    ok = np.argwhere(~np.isnan(v))
    sources = [tuple(ok[0]), tuple(ok[len(ok) // 2])]
    block = ringed(v.astype(dtype))
    (dc, lc, pc), (dg, lg, pg) = both(block, KINDS[kind], steps_of(2.0, 3.0), sources)
    np.testing.assert_array_equal(dg, dc)
    np.testing.assert_array_equal(lg, lc)
    np.testing.assert_array_equal(pg, pc)
    ref = reference(v.astype(np.float64), sources, kind, 2.0, 3.0)
    inner = dg[1:-1, 1:-1].copy()
    inner[np.isnan(v)] = np.nan
    np.testing.assert_array_equal(inner, ref)
    np.testing.assert_array_equal(pg, rule_predecessors(v, ref, sources, kind, 2.0, 3.0))


@pytest.mark.parametrize("shape", [(1, 1), (1, 70), (70, 1), (33, 65), (300, 257), (640, 512)])
def test_gpu_many_tiles_and_partial_tiles(shape):
    v = terraced(shape, sum(shape), step=7.0)
    v[np.random.default_rng(1).random(shape) < 0.03] = np.nan
    sources = [tuple(a) for a in np.argwhere(~np.isnan(v))[[0, -1]]]
    (dc, lc, pc), (dg, lg, pg) = both(ringed(v), 1, steps_of(1.0, 1.0), sources)
    np.testing.assert_array_equal(dg, dc)
    np.testing.assert_array_equal(lg, lc)
    np.testing.assert_array_equal(pg, pc)


def test_gpu_ringed_block_equals_cpu():
    v = CASES["terraced"]()
    whole = ringed(v)
    dist, level, _ = solve_block(whole, 1, steps_of(1.0, 1.0), [(3, 4)])
    sub = whole[6:27, 9:32].copy()
    (dc, lc, pc), (dg, lg, pg) = both(sub, 1, steps_of(1.0, 1.0), np.empty((0, 2), np.int64),
                                      dist[6:27, 9:32].copy(), level[6:27, 9:32].copy())
    np.testing.assert_array_equal(dg, dc)
    np.testing.assert_array_equal(lg, lc)
    np.testing.assert_array_equal(pg, pc)


@pytest.mark.parametrize("kind", ["absdiff", "surface"])
def test_gpu_warm_solve_equals_the_whole_solve(kind):
    check_warm_solve(kind, "gpu")


def test_gpu_store_incore_equals_cpu(tmp_path):
    v = random_dem((300, 200), 5, holes=0.05)
    st = make_store(tmp_path, v, tile=32, shard=2)
    src = [tuple(a) for a in np.argwhere(~np.isnan(v))[[10, 2000]]]
    for device in ("cpu", "gpu"):
        r = sssp(st, src, cell=True, progress=False, device=device, method="incore", name=device)
        assert r.method == "incore" and r.device == device
    for a in ("distance", "predecessor"):
        np.testing.assert_array_equal(st.group[f"sssp/gpu/{a}"][:], st.group[f"sssp/cpu/{a}"][:])


def test_cost_distance_on_cupy_equals_numpy():
    import cupy as cp

    from terrain_io.grid import cost_distance

    v = CASES["holes"]()
    src = [tuple(a) for a in np.argwhere(~np.isnan(v))[[3, 300]]]
    d, p = cost_distance(v, src, weight="surface", cell_size=(2.0, 3.0))
    dg, pg = cost_distance(cp.asarray(v), src, weight="surface", cell_size=(2.0, 3.0))
    assert isinstance(dg, cp.ndarray) and isinstance(pg, cp.ndarray)
    np.testing.assert_array_equal(dg.get(), d)
    np.testing.assert_array_equal(pg.get(), p)


@pytest.mark.parametrize("kind", ["absdiff", "surface"])
def test_gpu_shard_method_equals_cpu(tmp_path, kind):
    v = terraced((200, 168), 7, step=6.0)
    v[np.random.default_rng(2).random(v.shape) < 0.04] = np.nan
    st = make_store(tmp_path, v, tile=16, shard=2)
    src = [(31, 31), (32, 32), (150, 3)]
    for device in ("cpu", "gpu"):
        r = sssp(st, src, weight=kind, cell=True, progress=False, device=device, method="shards", unit=32,
                 name=device)
        assert r.method == "shards" and r.device == device
    r = sssp(st, src, weight=kind, cell=True, progress=False, device="gpu", method="incore", name="whole")
    for a in ("distance", "predecessor"):
        np.testing.assert_array_equal(st.group[f"sssp/gpu/{a}"][:], st.group[f"sssp/cpu/{a}"][:])
        np.testing.assert_array_equal(st.group[f"sssp/whole/{a}"][:], st.group[f"sssp/cpu/{a}"][:])
