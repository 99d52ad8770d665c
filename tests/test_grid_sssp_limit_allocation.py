"""``--max-cost`` and allocation on every SSSP method, against scipy's Dijkstra: a limited run
equals the full run clipped at the limit; the allocation equals the argmin over one scipy run per
source (exact ties: one of the tied sources, the one the predecessor chain leads to)."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from terrain_io.grid.sssp import sssp
from terrain_io.grid.sssp.array import cost_distance
from references import DC, DR, make_store, random_dem, reference, terraced

_register()
METHODS = {"incore": {}, "shards": {"unit": 16}, "index": {"cluster": 4}}


def dems():
    holed = terraced((45, 38), 6, step=8.0)
    holed[np.random.default_rng(6).random(holed.shape) < 0.06] = np.nan
    return {"random": random_dem((41, 47), 11, holes=0.05), "terraced": holed,
            "no nodata": random_dem((40, 48), 12)}  # unreached units are then written unread


def between(values, q):
    """A limit halfway between two neighbouring distinct values (no cell sits on it)."""
    u = np.unique(values[np.isfinite(values)])
    i = int(q * (len(u) - 1))
    return (u[i] + u[i + 1]) / 2


def read(st, name, what=("distance", "predecessor", "source")):
    g = st.group[f"sssp/{name}"]
    return [g[a][:] if a in g else None for a in what]


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("case", ["random", "terraced", "no nodata"])
@pytest.mark.parametrize("kind", ["absdiff", "surface"])
def test_max_cost_equals_the_full_run_clipped(tmp_path, method, case, kind):
    v = dems()[case]
    st = make_store(tmp_path, v, tile=8, shard=2)
    ok = np.argwhere(~np.isnan(v))
    src = [tuple(ok[len(ok) // 3])]
    ref = reference(v.astype(np.float64), src, kind)
    limit = between(ref, 0.3)
    kw = METHODS[method]
    sssp(st, src, weight=kind, cell=True, progress=False, method=method, name="full", **kw)
    r = sssp(st, src, weight=kind, cell=True, progress=False, method=method, name="cut", max_cost=limit, **kw)
    full_d, full_p, _ = read(st, "full")
    d, p, _ = read(st, "cut")
    inside = ref <= limit
    want = np.where(inside, full_d, np.where(np.isnan(v), np.nan, np.inf)).astype(np.float32)
    np.testing.assert_array_equal(d, want)
    np.testing.assert_array_equal(p, np.where(inside, full_p, 255))
    assert r.reached == int(inside.sum())
    assert st.group["sssp/cut"].attrs["max_cost"] == limit
    if method == "shards":  # units wholly beyond the limit are never solved
        assert r.merge_stats["unreached_units"] > 0
    if case == "no nodata":
        assert st.attrs["valid_count"] == v.size


def test_max_cost_on_the_array_api():
    v = random_dem((30, 40), 4, holes=0.05)
    ref = reference(v.astype(np.float64), [(10, 10)], "surface", 2.0, 2.0)
    limit = between(ref, 0.2)
    d, _ = cost_distance(v, [(10, 10)], weight="surface", cell_size=(2.0, 2.0), max_cost=limit)
    np.testing.assert_array_equal(d, np.where(ref <= limit, ref, np.where(np.isnan(v), np.nan, np.inf)).astype(np.float32))


def check_allocation(alloc, dist, pred, vals, sources, kind, dx=1.0, dy=1.0):
    """``alloc`` against one scipy run per source: where one source is strictly nearest, that one;
    on exact ties one of the tied; always the label of the cell's parent (the chain's root)."""
    per = np.stack([reference(vals.astype(np.float64), [s], kind, dx, dy) for s in sources])
    best = np.where(np.isnan(per), np.inf, per).min(axis=0)
    reached = np.isfinite(dist)
    assert np.all(alloc[~reached] == 0)
    nearest = per == best[None]
    rr, cc = np.nonzero(reached)
    for r, c in zip(rr, cc):
        a = int(alloc[r, c])
        assert 1 <= a <= len(sources) and nearest[a - 1, r, c], (r, c, a, per[:, r, c])
        p = int(pred[r, c])
        if p != 255:
            assert alloc[r + DR[p], c + DC[p]] == a
    unique = nearest.sum(axis=0) == 1
    assert unique[reached].mean() > 0.5  # the test mostly decides by distance, not by ties


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("case", ["random", "terraced"])
def test_allocation_equals_the_argmin_over_sources(tmp_path, method, case):
    v = dems()[case]
    st = make_store(tmp_path, v, tile=8, shard=2)
    # sources on block corners (the allocation's frames) and inside
    src = [rc for rc in [(15, 15), (16, 16), (0, 31), (40, 2), (22, 36)] if not np.isnan(v[rc])]
    sssp(st, src, cell=True, progress=False, method=method, name="a", allocation=True, **METHODS[method])
    d, p, a = read(st, "a")
    assert a.dtype == np.uint32
    check_allocation(a, d, p, v, src, "absdiff")


def test_allocation_is_the_same_bytes_on_incore_and_shards_with_a_limit(tmp_path):
    v = dems()["terraced"]
    st = make_store(tmp_path, v, tile=8, shard=1)
    src = [rc for rc in [(7, 7), (8, 8), (30, 20), (44, 37)] if not np.isnan(v[rc])]
    out = {}
    for method in ("incore", "shards"):
        sssp(st, src, cell=True, progress=False, method=method, name=method, allocation=True, max_cost=30.0,
             **METHODS[method])
        out[method] = read(st, method)
    for x, y in zip(out["incore"], out["shards"]):
        np.testing.assert_array_equal(x, y)
    assert np.all(out["incore"][2][~np.isfinite(out["incore"][0])] == 0)


def test_allocation_on_the_array_api_and_xarray():
    xr = pytest.importorskip("xarray")
    v = random_dem((25, 31), 8, holes=0.05)
    src = [(2, 3), (20, 25), (12, 12)]
    src = [s for s in src if not np.isnan(v[s])]
    d, p, a = cost_distance(v, src, allocation=True)
    check_allocation(a, d, p, v, src, "absdiff")
    da = xr.DataArray(v, dims=("y", "x"), coords={"y": np.arange(25) * -10.0, "x": np.arange(31) * 10.0})
    out = cost_distance(da, src, allocation=True)
    assert out[2].name == "source" and list(out[2].coords) == ["y", "x"]
    np.testing.assert_array_equal(out[2].values, a)


def test_cli_max_cost_and_allocation(tmp_path):
    v = random_dem((33, 30), 2)
    st = make_store(tmp_path, v, tile=8, shard=2)
    res = CliRunner().invoke(cli, ["sssp", str(st.path), "--cell", "--source", "3,4", "--source", "25,20",
                                   "--max-cost", "60", "--allocation", "--name", "c"])
    assert res.exit_code == 0, res.output
    d, _, a = read(st, "c")
    ref = reference(v.astype(np.float64), [(3, 4), (25, 20)], "absdiff")
    np.testing.assert_array_equal(np.isfinite(d), ref <= 60)
    assert set(np.unique(a)) == {0, 1, 2}
    res = CliRunner().invoke(cli, ["sssp", str(st.path), "--cell", "--source", "3,4", "--max-cost", "-1"])
    assert res.exit_code == 1 and "max-cost" in res.output and "Traceback" not in res.output


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["incore", "shards"])
def test_limit_and_allocation_gpu_equal_cpu(tmp_path, method):
    v = dems()["terraced"]
    st = make_store(tmp_path, v, tile=8, shard=1)
    src = [rc for rc in [(7, 7), (8, 8), (30, 20), (44, 37)] if not np.isnan(v[rc])]
    out = {}
    for device in ("cpu", "gpu"):
        sssp(st, src, cell=True, progress=False, method=method, name=device, device=device, allocation=True,
             max_cost=30.0, **METHODS[method])
        out[device] = read(st, device)
    for x, y in zip(out["cpu"], out["gpu"]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.gpu
def test_allocation_gpu_pointer_jumping_equals_cpu():
    import cupy as cp

    v = random_dem((300, 257), 5, holes=0.03)
    src = [tuple(x) for x in np.argwhere(~np.isnan(v))[::9000]]
    d, p, a = cost_distance(v, src, allocation=True)
    dg, pg, ag = cost_distance(cp.asarray(v), src, allocation=True)
    np.testing.assert_array_equal(ag.get(), a)
    check_allocation(a, d, p, v, src, "absdiff")


def test_auto_counts_the_allocation_in_the_in_core_budget(tmp_path):
    """A budget that holds the in-core solve but not its allocation arrays: ``auto`` takes the shard
    method (the in-core method would refuse), and the allocation is still the argmin."""
    from terrain_io.grid.sssp.incore import incore_bytes
    from terrain_io.grid.sssp.index import Field

    v = random_dem((256, 256), 13)
    st = make_store(tmp_path, v, tile=16, shard=1)
    field = Field(st, "absdiff")
    budget = (incore_bytes(st, field, "cpu") + incore_bytes(st, field, "cpu", allocation=True)) // 2
    src = [(3, 3), (240, 200)]
    r = sssp(st, src, cell=True, progress=False, memory=budget, name="a", allocation=True)
    assert r.method == "shards"
    d, p, a = read(st, "a")
    check_allocation(a, d, p, v, src, "absdiff")
