"""Grid SSSP pipeline against independent references: scipy.sparse.csgraph.dijkstra (absdiff,
surface) and scikit-image MCP_Geometric (cell); predecessor chains checked by a sequential walk."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from terrain_io.errors import InputError
from terrain_io.grid.sssp import sssp
from terrain_io.store import TerrainStore
from references import check_predecessors, DC, DR, make_store, random_dem, reference

def run(store, sources, kind, method="index", **kw):
    if method == "incore":
        kw.pop("cluster", None)
    r = sssp(store, sources, weight=kind, cell=True, progress=False, method=method, **kw)
    g = store.group[f"sssp/{r.name}"]
    return r, g["distance"][:].astype(np.float64), g["predecessor"][:]


@pytest.mark.parametrize("kind", ["absdiff", "surface"])
@pytest.mark.parametrize("tile,cluster", [(8, 8), (16, 4), (32, 16)])
@pytest.mark.parametrize("method", ["incore", "index"])
def test_random_dem_matches_scipy(tmp_path, method, kind, tile, cluster):
    vals = random_dem((45, 61), seed=tile + cluster, holes=0.08)
    vals[0, 0] = vals[31, 31] = vals[16, 17] = 5.0
    # sources on a tile corner, a cluster edge and inside
    sources = [(31, 31)] if tile == 32 else [(16, 17), (0, 0)]
    st = make_store(tmp_path, vals, tile=tile, dx=2.0, dy=3.0)
    r, d, p = run(st, sources, kind, cluster=cluster, method=method)
    ref = reference(vals.astype(np.float64), sources, kind, dx=2.0, dy=3.0)
    np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-4, equal_nan=True)
    check_predecessors(d, p, vals, sources, kind, dx=2.0, dy=3.0)


@pytest.mark.parametrize("method", ["incore", "index"])
def test_flat_dem_zero_weights_no_cycles(tmp_path, method):
    vals = np.full((40, 40), 7.0, np.float32)
    vals[10:30, 20] = np.nan  # a wall with gaps
    vals[15, 20] = 7.0
    st = make_store(tmp_path, vals, tile=8)
    r, d, p = run(st, [(39, 39), (0, 0)], "absdiff", cluster=4, method=method)
    ref = reference(vals.astype(np.float64), [(39, 39), (0, 0)], "absdiff")
    np.testing.assert_allclose(d, ref, atol=1e-9, equal_nan=True)
    check_predecessors(d, p, vals, [(39, 39), (0, 0)], "absdiff")


@pytest.mark.parametrize("method", ["incore", "index"])
def test_real_dem_matches_scipy(tmp_path, method, sample_data):
    from terrain_io.convert import convert

    src = sorted(sample_data.glob("*.asc"))[0]
    st = TerrainStore.open(convert(src, tmp_path / "real.zarr", tile=32, shard=2, progress=False).path)
    vals = st.elevation[:].astype(np.float64)
    vals[~st.valid(st.elevation[:])] = np.nan
    win = vals[:96, :128].copy()  # a corner of the real DEM keeps scipy quick
    sub = make_store(tmp_path, win.astype(np.float32), tile=32, name="sub.zarr", dx=st.cell_size[0],
                     dy=st.cell_size[1])
    rc = next((r, c) for r in range(40, 96) for c in range(64, 128) if not np.isnan(win[r, c]))
    for kind in ("absdiff", "surface"):
        r, d, p = run(sub, [rc], kind, cluster=8, method=method)
        ref = reference(win, [rc], kind, *st.cell_size)
        np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-3, equal_nan=True)
        check_predecessors(d, p, win.astype(np.float32), [rc], kind, *st.cell_size)


def _dem_and_costs(seed, shape, low, spread, dtype):
    """A random float32 DEM and random cell costs in [low, low + spread)."""
    rng = np.random.default_rng(seed)
    return rng.random(shape).astype(np.float32), (rng.random(shape) * spread + low).astype(dtype)


@pytest.mark.parametrize("method", ["incore", "index"])
def test_cell_model_matches_skimage_mcp_geometric(tmp_path, method):
    MCP_Geometric = pytest.importorskip("skimage.graph").MCP_Geometric

    dem, cost = _dem_and_costs(3, (50, 37), 1, 9, np.float64)
    st = make_store(tmp_path, dem, tile=16)
    with st.write_result("costs", attrs={}) as w:
        w.create_array("c", "float64", float("nan"))[:] = cost
    sources = [(16, 16), (49, 0)]
    r, d, p = run(st, sources, "cell", cost="costs/c", cluster=8, method=method)
    ref, _ = MCP_Geometric(cost, fully_connected=True).find_costs(sources)
    np.testing.assert_allclose(d, ref, rtol=1e-5)
    check_predecessors(d, p, cost.astype(np.float32), sources, "cell")


@pytest.mark.parametrize("method", ["incore", "index"])
def test_cell_cost_from_geotiff_file(tmp_path, method):
    import rasterio
    from rasterio.transform import from_origin
    MCP_Geometric = pytest.importorskip("skimage.graph").MCP_Geometric

    dem, cost = _dem_and_costs(4, (24, 40), 0.5, 4, np.float32)
    cost[5, 5:15] = -1  # impassable (negative cost), as in MCP
    st = make_store(tmp_path, dem, tile=8, dx=1.0, dy=1.0)
    tif = tmp_path / "cost.tif"
    with rasterio.open(tif, "w", driver="GTiff", width=40, height=24, count=1, dtype="float32",
                       transform=from_origin(100.0, 500.0, 1.0, 1.0)) as ds:
        ds.write(cost, 1)
    r, d, p = run(st, [(0, 0)], "cell", cost=str(tif), cluster=4, method=method)
    ref, _ = MCP_Geometric(np.where(cost < 0, np.inf, cost).astype(np.float64), fully_connected=True).find_costs([(0, 0)])
    ref[cost < 0] = np.nan
    np.testing.assert_allclose(d, ref, rtol=1e-5, equal_nan=True)
    bad = tmp_path / "bad.tif"
    with rasterio.open(bad, "w", driver="GTiff", width=40, height=24, count=1, dtype="float32",
                       transform=from_origin(101.0, 500.0, 1.0, 1.0)) as ds:
        ds.write(cost, 1)
    with pytest.raises(InputError, match="aligned"):
        sssp(st, [(0, 0)], weight="cell", cost=str(bad), cell=True, progress=False)


def test_index_reused_and_unreachable(tmp_path):
    vals = random_dem((33, 33), seed=9)
    vals[:, 16] = np.nan  # two halves, no edge between them (also no diagonal)
    st = make_store(tmp_path, vals, tile=16)
    r1 = sssp(st, (3, 3), cell=True, progress=False, cluster=8, method="index")
    r2 = sssp(st, [(30, 5)], cell=True, progress=False, cluster=8, name="second")  # auto: the stored index
    assert not r1.index_reused and r2.index_reused
    d = st.group["sssp/second/distance"][:]
    p = st.group["sssp/second/predecessor"][:]
    assert np.all(np.isposinf(d[:, 17:])) and np.all(p[:, 17:] == 255)
    assert np.all(np.isnan(d[:, 16]))
    ref = reference(vals.astype(np.float64), [(30, 5)])
    np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-4, equal_nan=True)
    # the first run's merge took G' straight from phase 1, a later one reads it from the store:
    # the same source again gives the same bytes
    r3 = sssp(st, (3, 3), cell=True, progress=False, cluster=8, name="again", method="index")
    assert r3.index_reused
    for a in ("distance", "predecessor"):
        np.testing.assert_array_equal(st.group[f"sssp/again/{a}"][:], st.group[f"sssp/{r1.name}/{a}"][:])


def test_map_coordinates_and_errors(tmp_path):
    vals = random_dem((20, 20), seed=1)
    vals[2, 3] = np.nan
    st = make_store(tmp_path, vals, tile=8, dx=10.0, dy=10.0)
    # map (x, y) = (100 + 10 * (col + .5), 500 - 10 * (row + .5)) is the centre of (row, col)
    r = sssp(st, (155.0, 425.0), progress=False, cluster=4)
    assert r.sources == [(7, 5)]
    with pytest.raises(InputError, match="outside"):
        sssp(st, (50.0, 425.0), progress=False)
    with pytest.raises(InputError, match="nodata"):
        sssp(st, (2, 3), cell=True, progress=False)
    with pytest.raises(InputError, match="cost"):
        sssp(st, (1, 1), cell=True, weight="cell", progress=False)


def test_paged_merge_under_small_budget_equals_in_memory(tmp_path):
    vals = random_dem((96, 96), seed=5, holes=0.05)
    vals[50, 50] = 1.0
    st = make_store(tmp_path, vals, tile=8, shard=2)
    _, d_small, p_small = run(st, [(50, 50)], "absdiff", cluster=4, memory="128KB", name="small")
    _, d_big, _ = run(st, [(50, 50)], "absdiff", cluster=4, name="big")
    ref = reference(vals.astype(np.float64), [(50, 50)])
    np.testing.assert_allclose(d_small, ref, rtol=1e-5, atol=1e-4, equal_nan=True)
    np.testing.assert_array_equal(d_small, d_big)
    check_predecessors(d_small, p_small, vals, [(50, 50)], "absdiff")


def test_budget_too_small_for_one_tile_is_a_clear_error(tmp_path):
    st = make_store(tmp_path, random_dem((96, 96), seed=5, holes=0.0), tile=8, shard=2)
    with pytest.raises(InputError, match="too small for this store: the SSSP needs at least"):
        run(st, [(5, 5)], "absdiff", cluster=4, memory="8KB", name="tiny")
    assert "sssp/tiny" not in st.results()


MEMORY_SCRIPT = r"""
import sys, gc, numpy as np
from terrain_io.synth import synthesize
from terrain_io.grid.sssp import sssp
from terrain_io.memory import peak_rss
folder, n, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3]
small = synthesize(folder + "/small.zarr", 128, tile=64, shard=4)
big = synthesize(folder + "/big.zarr", n, tile=64, shard=4)
sssp(small, (5, 5), cell=True, progress=False, cluster=8, memory="256KB", method="index")  # compile every kernel first
gc.collect()
before = peak_rss()
r = sssp(big, (n // 2, n // 3), cell=True, progress=False, cluster=8, memory=budget, method="index")
d = big.group["sssp/" + r.name + "/distance"][n // 2 - 2 : n // 2 + 3, n // 3 - 2 : n // 3 + 3]
print(peak_rss() - before, r.reached, float(d[2, 2]), int(np.isfinite(d).sum()))
"""


@pytest.mark.parametrize("n,budget", [(1024, 1200 << 10), pytest.param(2048, 4 << 20, marks=pytest.mark.slow)])
def test_out_of_core_peak_memory_within_budget(tmp_path, n, budget):
    """A float32 store 3.4x (1024^2, 4 MiB) or 4x (2048^2, 16 MiB) the budget: G' (~50 or ~200 MiB)
    is paged, and the peak resident memory of the run grows by no more than the budget."""
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path), str(n), str(budget)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, MALLOC_ARENA_MAX="2"))  # fewer malloc arenas: less allocator noise
    assert out.returncode == 0, out.stderr
    grown, reached, d0, finite = out.stdout.split()
    assert int(reached) == n * n and float(d0) == 0.0 and int(finite) == 25
    assert 3 * budget <= n * n * 4
    assert int(grown) <= budget, f"peak RSS grew by {int(grown) / 2**20:.1f} MiB, budget {budget / 2**20:.0f} MiB"


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (9, 1), (2, 9), (3, 3), (17, 10)])
@pytest.mark.parametrize("method", ["incore", "index"])
def test_thin_and_partial_clusters(tmp_path, method, shape):
    """DEMs narrower than a cluster: clusters of 1 or 2 rows/cols, where every cell is a boundary cell."""
    vals = random_dem(shape, seed=sum(shape))
    st = make_store(tmp_path, vals, tile=8)
    for c in (2, 8):
        _, d, p = run(st, [(shape[0] - 1, 0)], "absdiff", cluster=c, name=f"c{c}", method=method)
        ref = reference(vals.astype(np.float64), [(shape[0] - 1, 0)])
        np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-5)
        check_predecessors(d, p, vals, [(shape[0] - 1, 0)], "absdiff")


def _merged(st, sources, kind="absdiff", cluster=4, sequential=False):
    """Phase 2's arrays for ``sources`` (cells), by the parallel merge or the sequential Dijkstra."""
    import importlib

    from terrain_io.grid.sssp.index import Field, ensure_index

    S = importlib.import_module("terrain_io.grid.sssp.pipeline")
    field = Field(st, kind)
    index, _ = ensure_index(st, field, cluster)
    ms = S.MergeState(st, index, 1 << 30, st.path.parent)
    ms.seed(field, sources)
    ms.run(field, sequential=sequential)
    return ms


@pytest.mark.parametrize("case", ["random", "flat", "terraces"])
def test_parallel_merge_equals_sequential_dijkstra(tmp_path, case):
    """The label-correcting merge reaches exactly the float64 distances of Gerritsen 2012's Dijkstra
    over G', and every label/parent satisfies the tight-edge invariant the final phase relies on."""
    from terrain_io.grid.sssp import _pipeline_cpu as K

    vals = {"random": random_dem((70, 90), seed=4, holes=0.1),
            "flat": np.ones((70, 90), np.float32),
            "terraces": np.floor(random_dem((70, 90), seed=6, holes=0.05) / 10)}[case]
    sources = [(5, 7), (60, 80), (33, 44)]
    for r, c in sources:
        vals[r, c] = 1.0
    st = make_store(tmp_path, vals, tile=16, shard=2)
    par = _merged(st, sources)
    seq = _merged(st, sources, sequential=True)
    assert par.stats["unlabelled"] == 0
    np.testing.assert_array_equal(par.sDist, seq.sDist)
    np.testing.assert_array_equal(par.sSet, seq.sSet)
    # invariants, checked in plain Python over the slots: a grid parent is a tight edge from a vertex
    # one step before (a smaller distance for label 1, else the same distance and label - 1); an
    # intra-cluster vertex has such a tight G' block edge
    c, m, ncc = par.c, par.m, par.ncc
    H, W = vals.shape

    def at(cr, cc):
        ch = (cr // m) * par.TC + cc // m
        return ch, cr % m, cc % m

    seeded = {(k, t, d) for k, t, d, _ in par.seeds}
    checked = 0
    for cr in range(par.ncr):
        for cc in range(par.ncc):
            s, a, b = at(cr, cc)
            h, w = min(c, H - cr * c), min(c, W - cc * c)
            bi, bj = K.boundary_cells(h, w)
            for t in range(bi.size):
                d, lab, how = par.sDist[s, a, b, t], par.sRank[s, a, b, t], par.sHow[s, a, b, t]
                if not np.isfinite(d) or how == K.HOW_SOURCE:
                    continue
                checked += 1
                gi, gj = cr * c + bi[t], cc * c + bj[t]
                if how < 8:
                    pi, pj = gi + DR[how], gj + DC[how]
                    cr2, cc2 = pi // c, pj // c
                    assert (cr2, cc2) != (cr, cc)
                    s2, a2, b2 = at(cr2, cc2)
                    t2 = K.local_index(pi - cr2 * c, pj - cc2 * c, min(c, H - cr2 * c), min(c, W - cc2 * c))
                    wgt = abs(np.float64(vals[pi, pj]) - np.float64(vals[gi, gj]))
                    dp = par.sDist[s2, a2, b2, t2]
                    assert dp + wgt == d
                    assert (dp < d and lab == 1) or (dp == d and par.sRank[s2, a2, b2, t2] == lab - 1)
                else:
                    assert how == K.HOW_INTRA
                    row = par.sD[s, a, b, :, t].astype(np.float64)
                    du = par.sDist[s, a, b]
                    tight = (du + row == d) & (((du < d) & (lab == 1)) | ((du == d) & (par.sRank[s, a, b] == lab - 1)))
                    from_source = lab == 1 and (cr * ncc + cc, t, d) in seeded  # from a source in its cluster
                    assert tight.any() or from_source
    assert checked > 100


@pytest.mark.parametrize("method", ["incore", "index"])
def test_isolated_source_reaches_only_itself(tmp_path, method):
    vals = random_dem((40, 40), seed=2)
    vals[9:12, 9:12] = np.nan
    vals[10, 10] = 5.0
    st = make_store(tmp_path, vals, tile=16)
    r, d, p = run(st, [(10, 10)], "absdiff", cluster=8, method=method)
    others = ~np.isnan(vals)
    others[10, 10] = False
    assert d[10, 10] == 0.0 and r.reached == 1 and np.all(np.isposinf(d[others]))
    assert np.all(p == 255)


@pytest.mark.parametrize("kind", ["absdiff", "surface", "cell"])
@pytest.mark.parametrize("c", [4, 8, 32])
def test_boundary_blocks_equal_dijkstra_per_cluster(kind, c):
    """Phase 1's G' blocks, bit for bit, against scipy's Dijkstra run inside each cluster from each
    boundary cell (both take the minimum over paths of the left-to-right float64 sums)."""
    from terrain_io.grid.sssp import _pipeline_cpu as K
    from terrain_io.weights import steps_of

    kinds = {"absdiff": 1, "surface": 2, "cell": 3}
    vals = random_dem((2 * c + 5, 2 * c + 3), seed=c, holes=0.1).astype(np.float64)
    vals[vals < 4] = 3.0  # plateaus: zero-weight edges and ties
    H, W = vals.shape
    mr, mc, B = -(-H // c), -(-W // c), 4 * c - 4
    d = np.full((mr, mc, B, B), np.inf, np.float32)
    v = np.full((mr, mc, B), np.nan)
    K.boundary_phase(vals, c, kinds[kind], steps_of(2.0, 3.0), d, v)
    for a in range(mr):
        for b in range(mc):
            sub = vals[a * c : (a + 1) * c, b * c : (b + 1) * c]
            h, w = sub.shape
            bi, bj = K.boundary_cells(h, w)
            for s in range(bi.size):
                if np.isnan(sub[bi[s], bj[s]]):
                    assert np.all(d[a, b, s] == np.inf)
                    continue
                ref = reference(sub, [(bi[s], bj[s])], kind, 2.0, 3.0)
                want = np.where(np.isnan(ref), np.inf, ref)[bi, bj].astype(np.float32)
                np.testing.assert_array_equal(d[a, b, s, : bi.size], want)
            np.testing.assert_array_equal(v[a, b, : bi.size], sub[bi, bj])
