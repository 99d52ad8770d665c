"""The in-core SSSP engine against independent references: distances bit for bit equal to
scipy.sparse.csgraph.dijkstra (which sums left to right in float64, like the engine), and
predecessors equal to the documented tie rule applied, in this file, to scipy's distances."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from terrain_io.grid.sssp import sssp
from terrain_io.weights import steps_of
from terrain_io.grid.sssp.incore import NO_LEVEL, output_distance, ringed, solve_block
from references import CASES, check_warm_solve, KINDS, make_store, random_dem, reference, rule_predecessors, terraced

@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["absdiff", "surface", "cell"])
def test_block_solve_equals_scipy_and_the_tie_rule(case, kind):
    v = CASES[case]()
    if kind == "cell":
        v = np.where(np.isnan(v), np.nan, np.abs(v) + 0.5).astype(np.float32)
    ok = np.argwhere(~np.isnan(v))
    sources = [tuple(ok[0]), tuple(ok[len(ok) // 2]), tuple(ok[-1])]  # corner-ish, middle, last
    dx, dy = 2.0, 3.0
    ref = reference(v.astype(np.float64), sources, kind, dx, dy)
    block = ringed(v)
    dist, level, pred = solve_block(block, KINDS[kind], steps_of(dx, dy), sources)
    inner = dist[1:-1, 1:-1].copy()
    inner[np.isnan(v)] = np.nan
    np.testing.assert_array_equal(inner, ref)  # bit for bit, float64
    np.testing.assert_array_equal(pred, rule_predecessors(v, ref, sources, kind, dx, dy))
    np.testing.assert_array_equal(output_distance(dist, block), ref.astype(np.float32))


@pytest.mark.parametrize("case", ["random", "terraced", "flat"])
def test_a_ringed_block_with_true_ring_values_reproduces_the_whole_solve(case):
    """What a shard solve relies on: given the whole solve's distances and levels on its ring,
    a sub-block's solve gives the same distances, levels and codes inside."""
    v = CASES[case]()
    steps = steps_of(1.0, 1.0)
    sources = [(3, 4)]
    whole = ringed(v)
    dist, level, pred = solve_block(whole, 1, steps, sources)
    r0, r1, c0, c1 = 6, 25, 9, 30  # interior rows r0..r1-1, cols c0..c1-1 of the DEM
    sub = whole[r0 : r1 + 2, c0 : c1 + 2].copy()  # ring = the DEM cells around the window
    sd = dist[r0 : r1 + 2, c0 : c1 + 2].copy()
    sl = level[r0 : r1 + 2, c0 : c1 + 2].copy()
    d2, l2, p2 = solve_block(sub, 1, steps, np.empty((0, 2), np.int64), sd, sl)
    np.testing.assert_array_equal(d2[1:-1, 1:-1], dist[r0 + 1 : r1 + 1, c0 + 1 : c1 + 1])
    np.testing.assert_array_equal(l2[1:-1, 1:-1], level[r0 + 1 : r1 + 1, c0 + 1 : c1 + 1])
    np.testing.assert_array_equal(p2, pred[r0:r1, c0:c1])


@pytest.mark.parametrize("kind", ["absdiff", "surface"])
def test_a_warm_solve_equals_the_whole_solve(kind):
    check_warm_solve(kind, "cpu")


@pytest.mark.parametrize("kind", ["absdiff", "surface", "cell"])
@pytest.mark.parametrize("seed", [6, 7])
def test_a_warm_solve_keeping_levels_and_codes_equals_the_whole_solve(kind, seed):
    """The warm solve that finds levels and codes again only where the ring's change reaches
    (the shard method's re-solves on the CPU): for a ring that fell on one side, and another side
    that was unknown, the whole grid's solve inside -- scipy's distances, the tie rule's codes."""
    v = terraced((150, 140), seed, step=6.0)
    v[np.random.default_rng(seed).random(v.shape) < 0.03] = np.nan
    steps, sources = steps_of(2.0, 3.0), [(4, 7), (120, 135)]
    whole = ringed(v)
    dist, level, pred = solve_block(whole, KINDS[kind], steps, sources)
    np.testing.assert_array_equal(dist[1:-1, 1:-1][~np.isnan(v)],
                                  reference(v.astype(np.float64), sources, kind, 2.0, 3.0)[~np.isnan(v)])
    np.testing.assert_array_equal(pred, rule_predecessors(v, dist[1:-1, 1:-1], sources, kind, 2.0, 3.0))
    r0, r1, c0, c1 = 40, 140, 30, 130
    true = [a[r0 : r1 + 2, c0 : c1 + 2].copy() for a in (whole, dist, level)]
    early = [a.copy() for a in true]
    early[1][0] += 5.0
    early[2][0] = np.where(early[1][0] < np.inf, 0, NO_LEVEL)  # another plateau level on the top
    early[0][:, -1], early[1][:, -1], early[2][:, -1] = np.nan, np.inf, NO_LEVEL
    none = np.empty((0, 2), np.int64)
    d, lv, p = solve_block(early[0], KINDS[kind], steps, none, early[1], early[2])
    changed = ((d != true[1]) | (lv != true[2])).astype(np.uint8)
    changed[1:-1, 1:-1] = 0
    assert changed.sum() > 100
    for block, new in zip((early[0], d, lv), true):
        block[0], block[-1], block[:, 0], block[:, -1] = new[0], new[-1], new[:, 0], new[:, -1]
    d, lv, p2 = solve_block(early[0], KINDS[kind], steps, none, d, lv, warm=True, pred=p, changed=changed)
    assert p2 is p
    np.testing.assert_array_equal(d[1:-1, 1:-1], dist[r0 + 1 : r1 + 1, c0 + 1 : c1 + 1])
    np.testing.assert_array_equal(lv[1:-1, 1:-1], level[r0 + 1 : r1 + 1, c0 + 1 : c1 + 1])
    np.testing.assert_array_equal(p, pred[r0:r1, c0:c1])


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (2, 2), (3, 17)])
def test_thin_grids(shape):
    v = random_dem(shape, sum(shape))
    ref = reference(v.astype(np.float64), [(0, 0)])
    dist, _, pred = solve_block(ringed(v), 1, steps_of(1.0, 1.0), [(0, 0)])
    np.testing.assert_array_equal(dist[1:-1, 1:-1], ref)
    np.testing.assert_array_equal(pred, rule_predecessors(v, ref, [(0, 0)], "absdiff"))


def test_store_incore_method_and_auto(tmp_path):
    v = CASES["holes"]()
    st = make_store(tmp_path, v, tile=8, shard=2)
    sources = [tuple(np.argwhere(~np.isnan(v))[5])]
    r = sssp(st, sources, cell=True, progress=False)  # auto: no index stored, fits in memory
    assert r.method == "incore" and st.group[f"sssp/{r.name}"].attrs["method"] == "incore"
    d = st.group[f"sssp/{r.name}/distance"][:]
    p = st.group[f"sssp/{r.name}/predecessor"][:]
    ref = reference(v.astype(np.float64), sources)
    np.testing.assert_array_equal(d, ref.astype(np.float32))
    np.testing.assert_array_equal(p, rule_predecessors(v, ref, sources, "absdiff"))
    from terrain_io.errors import InputError

    with pytest.raises(InputError, match="in-core SSSP needs"):
        sssp(st, sources, cell=True, progress=False, method="incore", memory="1KB", name="x")
    assert "sssp/x" not in st.results()


def test_cost_distance_on_numpy_and_xarray():
    xr = pytest.importorskip("xarray")

    from terrain_io.grid import cost_distance

    v = CASES["holes"]()
    src = tuple(np.argwhere(~np.isnan(v))[7])
    ref = reference(v.astype(np.float64), [src], "surface", 2.0, 3.0)
    d, p = cost_distance(v, src, weight="surface", cell_size=(2.0, 3.0))
    np.testing.assert_array_equal(d, ref.astype(np.float32))
    np.testing.assert_array_equal(p, rule_predecessors(v, ref, [src], "surface", 2.0, 3.0))
    # xarray: coordinates and attributes kept, the cell size read from them, sources as a raster
    h, w = v.shape
    da = xr.DataArray(v, dims=("y", "x"), coords={"y": 500.0 - 3.0 * np.arange(h), "x": 100.0 + 2.0 * np.arange(w)},
                      attrs={"crs": "EPSG:32633"})
    mask = np.zeros(v.shape, np.uint8)
    mask[src] = 1
    dx, px = cost_distance(da, mask, weight="surface")
    assert isinstance(dx, xr.DataArray) and dx.dims == ("y", "x") and dx.attrs["crs"] == "EPSG:32633"
    np.testing.assert_array_equal(dx.x.values, da.x.values)
    np.testing.assert_array_equal(dx.values, d)
    np.testing.assert_array_equal(px.values, p)
    # the cell model on a cost raster, against scikit-image
    MCP_Geometric = pytest.importorskip("skimage.graph").MCP_Geometric

    cost = np.abs(np.nan_to_num(v, nan=1.0)).astype(np.float64) + 0.5
    dc, _ = cost_distance(v, [src], weight="cell", cost=cost)
    ref_c, _ = MCP_Geometric(np.where(np.isnan(v), np.inf, cost), fully_connected=True).find_costs([src])
    ok = ~np.isnan(v) & np.isfinite(ref_c)
    np.testing.assert_allclose(dc[ok], ref_c[ok], rtol=1e-6)
    from terrain_io.errors import InputError

    with pytest.raises(InputError, match="nodata"):
        cost_distance(v, tuple(np.argwhere(np.isnan(v))[0]))
    with pytest.raises(InputError, match="outside"):
        cost_distance(v, (h, 0))


_MEMORY_SCRIPT = r"""
import sys
import numpy as np
from terrain_io.grid.sssp import sssp
from terrain_io.grid.sssp.incore import host_bytes
from terrain_io.grid.sssp.index import Field
from terrain_io.store import TerrainStore

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

warm = TerrainStore.open(sys.argv[1])
# load the kernels first
sssp(warm, (3, 3), weight="absdiff", cell=True, progress=False, method="incore", device="cpu", name="warm")
for path in sys.argv[2:]:
    st = TerrainStore.open(path)
    budget = host_bytes(st, Field(st, "absdiff"), "cpu")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    base = status("VmRSS")
    n = st.shape[0]
    sssp(st, (n // 3, n // 2), weight="absdiff", cell=True, progress=False, method="incore", device="cpu",
         memory=str(budget))
    print(status("VmHWM") - base, budget)
"""


@pytest.mark.parametrize("options", [{"cell_size": (0, 1)}, {"cell_size": (1, -2)}, {"cell_size": (np.nan, 1)},
                                     {"max_cost": -1}, {"max_cost": np.nan}])
def test_cost_distance_refuses_steps_and_limits_out_of_range(options):
    from terrain_io import cost_distance
    from terrain_io.errors import InputError

    with pytest.raises(InputError, match="cell_size|max_cost"):
        cost_distance(np.zeros((3, 4), np.float32), (0, 0), weight="surface", **options)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux peak-RSS reset")
def test_incore_peak_memory_within_its_estimate(tmp_path):
    """The in-core method's memory estimate (``host_bytes``, what ``--memory`` is checked against)
    bounds the solve's real peak RSS where its work arrays are largest: a flat DEM with holes
    (absdiff: zero weights everywhere, one plateau of the whole grid) and terraces (plateaus with
    many seeds at known levels). Fresh process; the reads' and writes' buffers get 4 MiB."""
    n = 1024
    rng = np.random.default_rng(5)
    flat = np.zeros((n, n), np.float32)
    flat[rng.random((n, n)) < 0.02] = np.nan
    flat[n // 3, n // 2] = 0.0  # the source
    terraces = np.floor(np.add.outer(np.arange(n), 2 * np.arange(n)) / 5).astype(np.float32)
    paths = [make_store(tmp_path, v, tile=256, shard=2, name=f"{i}.zarr").path for i, v in enumerate([flat, terraces])]
    warm = make_store(tmp_path, random_dem((40, 40), 1), tile=16, name="warm.zarr")
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(warm.path), *map(str, paths)],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, MALLOC_ARENA_MAX="2"))
    assert out.returncode == 0, out.stderr
    for line in out.stdout.split("\n")[:2]:
        grown, budget = map(int, line.split())
        assert grown <= budget + (4 << 20), f"peak RSS grew {grown / 2**20:.1f} MiB, estimate {budget / 2**20:.1f} MiB"


@pytest.mark.parametrize("kind", ["surface", "cell", "walk", "absdiff"])
def test_bucket_queues_give_the_heaps_distances(kind):
    """Dial's buckets (cell, surface and walk models) and the radix heap (absdiff: zero and tiny weights)
    against the 4-ary heap, bit for bit: a cold solve whose ring distances lie far apart (for the
    buckets thousands of buckets: seeds enter the circle as its window reaches them), a warm
    re-solve after the ring fell on one side (the cells marked too), and a solve under a limit."""
    import importlib

    K = importlib.import_module("terrain_io.grid.sssp._incore_cpu")
    rng = np.random.default_rng(8)
    h, w = 90, 110
    v = ringed(terraced((h, w), 8, step=3.0) + 0.5)
    v[1:-1, 1:-1][rng.random((h, w)) < 0.03] = np.nan
    v[0], v[-1], v[:, 0], v[:, -1] = 2.0, 3.0, 4.0, 5.0  # a ring of cells with values
    if kind == "walk":
        v *= 0.1  # slopes Tobler's function keeps within a window of buckets
    steps = steps_of(2.0, 3.0)
    kinds = dict(KINDS, walk=K.WALK)
    width, slots = K._bucket_width(v.reshape(-1), h, w, kinds[kind], steps)
    assert bool(slots) == (kind != "absdiff")
    spread = 8 * slots * width if slots else 1e4  # ring distances: for the buckets 8 windows wide
    seed = np.full(v.shape, np.inf)
    seed[0] = rng.random(w + 2) * spread
    seed[:, -1] = rng.random(h + 2) * spread
    seed[h // 2, w // 3] = 0.0  # a source
    assert kind == "absdiff" or (seed[0].max() - seed[0].min()) / width > 4 * slots

    pops = []

    def solve(dist, buckets, warm=False, limit=np.inf, mark=None):
        out = dist.copy()
        pops.append(K.solve_distances(v.reshape(-1), h, w, kinds[kind], steps, out.reshape(-1), warm, limit,
                                      None if mark is None else mark.reshape(-1), buckets))
        return out

    cold = solve(seed, True)
    np.testing.assert_array_equal(cold, solve(seed, False))
    # the queues are exact for any order (a cell improved after its pop is pushed again), so only
    # the pops show that they keep Dijkstra's: each reached interior cell popped once
    assert pops == [np.isfinite(cold[1:-1, 1:-1]).sum()] * 2
    fallen = cold.copy()
    fallen[:, -1] -= spread / 25
    marks = [np.zeros(v.shape, np.uint8) for _ in range(2)]
    warm = solve(fallen, True, True, mark=marks[0])
    np.testing.assert_array_equal(warm, solve(fallen, False, True, mark=marks[1]))
    np.testing.assert_array_equal(*marks)
    assert marks[0].sum() > 100 and (warm < cold).sum() > 100
    limit = float(np.median(cold[np.isfinite(cold)]))
    np.testing.assert_array_equal(solve(seed, True, limit=limit), solve(seed, False, limit=limit))


def test_radix_heap_keys_across_every_binade():
    """The radix heap's keys are the distances' IEEE bits: weights from 1e-300 to 1e300 (every bucket of
    the 64 in use, subnormal sums included) give the 4-ary heap's distances bit for bit."""
    import importlib

    K = importlib.import_module("terrain_io.grid.sssp._incore_cpu")
    rng = np.random.default_rng(9)
    h, w = 70, 80
    v = ringed(10.0 ** rng.uniform(-300, 300, (h, w)))
    v[1:-1, 1:-1][rng.random((h, w)) < 0.2] = 5e-324  # the least subnormal
    v[h // 2 - 9 : h // 2 + 10, w // 2 - 9 : w // 2 + 10] = rng.integers(1, 9, (19, 19)) * 5e-324  # subnormal sums
    out = []
    for buckets in (True, False):
        dist = np.full(v.shape, np.inf)
        dist[h // 2, w // 2] = 0.0
        pops = K.solve_distances(v.reshape(-1), h, w, KINDS["absdiff"], steps_of(1.0, 1.0), dist.reshape(-1), False,
                                 np.inf, None, buckets)
        out.append(dist)
        assert pops == np.isfinite(dist[1:-1, 1:-1]).sum()  # Dijkstra's order: each cell popped once
    np.testing.assert_array_equal(*out)
    inner = out[0][1:-1, 1:-1]
    assert np.isfinite(inner).all() and (inner < 1e-300).sum() > 10 and (inner > 1e290).sum() > 10


def test_distances_beyond_float32_are_unreached_with_one_note():
    """Tobler's walking time up a 30:1 cliff (0.6 s/m * e^(3.5 * 30.05), ~2e45 s) is finite in
    float64 but beyond float32's range: the cell behind it is stored as unreached, with a note,
    where the float64 reference (scipy's Dijkstra on the same edge weights) exceeds float32."""
    import warnings

    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    from terrain_io import cost_distance
    from terrain_io.errors import TerrainNote
    from terrain_io._weights_cpu import walk_time

    dem = np.array([[0.0, 30.0, 30.0, 0.5]], np.float32)
    n = dem.size
    u, v = np.arange(n - 1), np.arange(1, n)
    w = [walk_time(float(dem[0, a]), float(dem[0, b]), 1.0) for a, b in zip(u, v)]
    back = [walk_time(float(dem[0, b]), float(dem[0, a]), 1.0) for a, b in zip(u, v)]
    graph = csr_matrix((w + back, (np.r_[u, v], np.r_[v, u])), shape=(n, n))
    want = dijkstra(graph, indices=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist, _ = cost_distance(dem, (0, 0), weight="walk")
    beyond = want > np.finfo(np.float32).max
    assert beyond.tolist() == [False, True, True, True]
    assert np.isinf(dist[0, beyond]).all() and np.isfinite(dist[0, ~beyond]).all()
    notes = [w for w in seen if issubclass(w.category, TerrainNote)]
    assert len(notes) == 1 and "float32" in str(notes[0].message)
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)]
