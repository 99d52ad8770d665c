"""Grid MST pipeline (terrain_io.grid.mst) against independent references.

References: scipy.sparse.csgraph.minimum_spanning_tree on the whole grid graph in memory, with the
strict order (weight, smaller id, larger id) made explicit by giving scipy the edges' ranks as
weights; networkx on tiny grids; scipy.ndimage.label (8-connectivity) for the number of trees.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import ndimage

from terrain_io.grid.mst import edge_list, mst, read_edges
from terrain_io.store import TerrainStore, valid_mask
from references import grid_edges, islands, scipy_msf, terrain

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "sample_data"

def run(tmp_path, vals, tile=32, shard=2, nodata=None, weight="max", name="dem.zarr", **kw):
    store = TerrainStore.from_array(tmp_path / name, vals, tile=tile, shard=shard, nodata=nodata)
    res = mst(store, weight=weight, device="cpu", progress=False, **kw)
    u, v = edge_list(read_edges(store))
    return res, set(zip(u.tolist(), v.tolist())), store


def check(tmp_path, vals, nodata=None, weight="max", **kw):
    res, got, store = run(tmp_path, vals, nodata=nodata, weight=weight, **kw)
    valid = valid_mask(vals, nodata)
    want, total = scipy_msf(vals, valid, weight)
    assert got == want
    assert Fraction(res.total_weight_exact) == total
    assert res.total_weight == float(total)
    assert res.trees == islands(valid)
    assert res.edges == len(want) == int(valid.sum()) - res.trees
    attrs = store.results()["mst"]
    assert attrs["edge_count"] == res.edges and attrs["trees"] == res.trees and attrs["weight_model"] == weight
    return res


@pytest.mark.parametrize("shape,tile,shard", [((37, 53), 8, 2), ((64, 64), 8, 4), ((100, 130), 32, 2),
                                              ((1, 200), 8, 2), ((150, 1), 8, 4), ((2, 90), 8, 1),
                                              ((70, 70), 64, 1)])
def test_random_shapes_and_tiles(tmp_path, shape, tile, shard):
    vals = np.random.default_rng(sum(shape)).random(shape).astype(np.float32)
    check(tmp_path, vals, tile=tile, shard=shard)


@pytest.mark.parametrize("weight", ["max", "absdiff"])
def test_many_ties_and_flats(tmp_path, weight):
    vals = terrain(120, 97, seed=3, levels=4)  # a handful of levels: large plateaus
    vals[30:90, 20:80] = 2.0  # one big flat area
    check(tmp_path, vals, weight=weight, tile=16, shard=4)


def test_all_equal(tmp_path):
    check(tmp_path, np.zeros((45, 61), dtype=np.float32), tile=8, shard=2)


def test_signed_zeros_and_negatives(tmp_path):
    """-0.0 and 0.0 are one weight (ties broken by cell ids), negative elevations order below."""
    rng = np.random.default_rng(8)
    vals = rng.choice(np.array([-0.0, 0.0, -1.5, 2.0, -3.0], dtype=np.float32), size=(40, 52))
    check(tmp_path, vals, tile=8, shard=2)
    check(tmp_path, vals.astype(np.float64), tile=8, shard=2, name="f64.zarr")  # the edge-sorting Kruskal


def test_float32_extremes_exact_weight(tmp_path):
    """Subnormal, tiny, huge and negative float32 elevations: the tile sums by exponent stay exact."""
    rng = np.random.default_rng(9)
    pool = np.array([1e-45, -1e-45, 3e-39, 1e-30, -2.5e-20, 7.0, -1e30, 3.4e38, -3.4e38, 1234.5678],
                    dtype=np.float32)
    vals = rng.choice(pool, size=(41, 47))
    bump = rng.random(vals.shape) < 0.5  # neighbouring floats: plateaus and near-ties
    vals[bump] = np.nextafter(vals[bump], np.float32(np.inf))
    check(tmp_path, vals, tile=8, shard=2)
    check(tmp_path, np.nextafter(vals, np.float32(0)), tile=16, shard=2, name="down.zarr")


def test_int32_extremes(tmp_path):
    """The order keys of int32 reach both ends of uint32; the sums reach 2**31 a weight."""
    rng = np.random.default_rng(10)
    pool = np.array([-2**31, -2**31 + 1, -5, 0, 5, 2**31 - 2, 2**31 - 1], dtype=np.int64)
    check(tmp_path, rng.choice(pool, size=(37, 43)).astype(np.int32), tile=8, shard=2)


def test_nodata_islands_int16(tmp_path):
    rng = np.random.default_rng(7)
    vals = rng.integers(-20, 20, size=(90, 110)).astype(np.int16)
    hole = ndimage.gaussian_filter(rng.standard_normal(vals.shape), 3) > 0.02
    vals[hole] = -9999
    vals[:, 50:53] = -9999  # a moat: islands on both sides
    res = check(tmp_path, vals, nodata=-9999, tile=16, shard=2)
    assert res.trees > 2


@pytest.mark.parametrize("weight", ["max", "absdiff"])
def test_nan_islands_and_absdiff(tmp_path, weight):
    vals = terrain(75, 88, seed=11)
    vals[np.random.default_rng(1).random(vals.shape) < 0.3] = np.nan
    check(tmp_path, vals, weight=weight, tile=8, shard=2)


def test_every_tile_size_gives_the_same_forest(tmp_path):
    vals = terrain(300, 410, seed=5, levels=30)
    vals[np.random.default_rng(2).random(vals.shape) < 0.02] = np.nan
    valid = valid_mask(vals, None)
    want, total = scipy_msf(vals, valid)
    for tile in (32, 64, 128, 256, 512, 1024):
        for batch in {1, 2}:
            res, got, _ = run(tmp_path, vals, tile=tile, shard=2, name=f"t{tile}-{batch}.zarr", batch_tiles=batch)
            assert got == want, (tile, batch)
            assert Fraction(res.total_weight_exact) == total


def test_sample_dems(tmp_path):
    from terrain_io.convert import convert

    src = SAMPLE_DATA / "jacksboro_fault_dem.asc"
    if not src.exists():
        pytest.skip("sample data missing")
    reference = np.loadtxt(src, skiprows=6).astype(np.float32)
    reference[reference == -9999] = np.nan
    convert(src, tmp_path / "j.zarr", tile=64, shard=2)
    store = TerrainStore.open(tmp_path / "j.zarr")
    res = mst(store, device="cpu", progress=False)
    u, v = edge_list(read_edges(store))
    want, total = scipy_msf(reference, ~np.isnan(reference))
    assert set(zip(u.tolist(), v.tolist())) == want
    assert Fraction(res.total_weight_exact) == total
    holes = SAMPLE_DATA / "jacksboro_fault_dem_holes.grass.asc"
    if holes.exists():
        convert(holes, tmp_path / "h.zarr", tile=32, shard=4)
        store = TerrainStore.open(tmp_path / "h.zarr")
        values = np.asarray(store.elevation[...])
        res = mst(store, weight="absdiff", device="cpu", progress=False)
        u, v = edge_list(read_edges(store))
        valid = store.valid(values)
        want, total = scipy_msf(values, valid, "absdiff")
        assert set(zip(u.tolist(), v.tolist())) == want
        assert not valid.all() and res.trees == islands(valid)


def test_networkx_tiny(tmp_path):
    nx = pytest.importorskip("networkx")  # the reference
    rng = np.random.default_rng(4)
    for k in range(6):
        vals = rng.integers(0, 3, size=(5 + k, 7)).astype(np.float32)  # ties everywhere
        vals[rng.random(vals.shape) < 0.2] = np.nan
        res, got, _ = run(tmp_path, vals, tile=8, shard=2, name=f"n{k}.zarr")
        valid = ~np.isnan(vals)
        u, v, w = grid_edges(vals, valid, "max")
        g = nx.Graph()
        g.add_nodes_from(np.flatnonzero(valid.ravel()).tolist())
        for a, b, x in zip(u.tolist(), v.tolist(), w.tolist()):
            g.add_edge(a, b, weight=x)
        rank = {e: k for k, e in enumerate(sorted(g.edges(), key=lambda e: (g.edges[e]["weight"], *sorted(e))))}
        nx.set_edge_attributes(g, rank, "rank")  # the strict order (weight, smaller id, larger id)
        forest = nx.minimum_spanning_tree(g, weight="rank", algorithm="kruskal")
        assert got == {tuple(sorted(e)) for e in forest.edges()}
        assert res.total_weight == pytest.approx(forest.size(weight="weight"))
        assert res.trees == nx.number_connected_components(g)


def test_cli(tmp_path):
    from cli.main import _register, cli

    _register()
    vals = terrain(50, 60, seed=9)
    TerrainStore.from_array(tmp_path / "c.zarr", vals, tile=16, shard=2)
    out = CliRunner().invoke(cli, ["mst", str(tmp_path / "c.zarr"), "--weight", "absdiff", "--device", "cpu",
                                   "--memory", "512MB"])
    assert out.exit_code == 0, out.output
    line = out.output.strip().splitlines()[-1]
    assert "3,000 cells" in line and "2,999 edges" in line and "Mcells/s" in line
    _, total = scipy_msf(vals, np.ones(vals.shape, bool), "absdiff")
    assert f"weight {float(total):.10g}" in line
    out = CliRunner().invoke(cli, ["-q", "mst", str(tmp_path / "c.zarr"), "--weight", "nope"])
    assert out.exit_code != 0
    out = CliRunner().invoke(cli, ["mst", str(tmp_path / "missing.zarr")])
    assert out.exit_code == 1 and "terrain: error:" in out.output


_MEMORY_SCRIPT = textwrap.dedent("""
    import sys
    from terrain_io.grid.mst import mst
    from terrain_io.memory import parse_size
    from terrain_io.store import TerrainStore

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    M = sys.modules["terrain_io.grid.mst.pipeline"]

    below, M.SERIAL_BELOW = M.SERIAL_BELOW, 0  # the small store warms the parallel builds the big one runs
    for k in (None, 2):  # compile / load the kernels: whole-shard batches, and full 2 x 2 batches (merge_batch)
        mst(TerrainStore.open(sys.argv[2]), device="cpu", progress=False, batch_tiles=k)
    M.SERIAL_BELOW = below
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    base = status("VmRSS")
    res = mst(TerrainStore.open(sys.argv[1]), device="cpu", progress=False, memory=sys.argv[3])
    print(status("VmHWM") - base, res.batch_tiles, res.edges)
""")


def _memory_run(tmp_path, size, tile, shard, budget):
    vals = terrain(size, size, seed=1, levels=200)
    big = TerrainStore.from_array(tmp_path / "big.zarr", vals, tile=tile, shard=shard)
    TerrainStore.from_array(tmp_path / "warm.zarr", vals[:tile * 2 + 3, :tile * 2 + 3], tile=tile, shard=shard)
    del vals
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(tmp_path / "big.zarr"),
                          str(tmp_path / "warm.zarr"), budget], capture_output=True, text=True, check=True,
                         env={**os.environ, "NUMBA_NUM_THREADS": "2"})
    grown, batch, edges = (int(x) for x in out.stdout.split())
    return big, grown, batch, edges


NEEDS_PROC = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux peak-RSS reset")
SLACK = 24 * 2**20  # interpreter-level buffers (zarr, allocator arenas) outside the pipeline's own data


@NEEDS_PROC
@pytest.mark.slow  # long: the default run keeps CI under its 15 minutes (the slow run covers it)
def test_memory_budget_out_of_core(tmp_path):
    """A store 4x larger than the budget: peak RSS grows by about the budget, far less than the DEM."""
    budget = 16 * 2**20
    big, grown, batch, edges = _memory_run(tmp_path, 4096, 128, 8, "16MB")
    raw = big.shape[0] * big.shape[1] * 4
    assert raw >= 4 * budget
    assert batch < big.shard_size  # the budget forced batches smaller than a shard
    assert grown <= budget + SLACK and grown < 0.65 * raw, grown
    assert edges == big.shape[0] * big.shape[1] - 1


@NEEDS_PROC
@pytest.mark.slow
def test_memory_budget_out_of_core_large(tmp_path):
    budget = 64 * 2**20
    big, grown, batch, edges = _memory_run(tmp_path, 8192, 256, 8, "64MB")
    raw = big.shape[0] * big.shape[1] * 4
    assert raw >= 4 * budget
    assert grown <= budget + SLACK and grown < 0.5 * raw, grown


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_integer_types(tmp_path, dtype):
    """int32 (negative values: cell sort with signed keys) and uint32 (edge sort) elevations."""
    rng = np.random.default_rng(5)
    base = rng.integers(0, 50, size=(70, 90)).astype(np.int64)
    vals = (base - 25 if dtype == "int32" else base + 2**31).astype(dtype)  # uint32 beyond int32
    check(tmp_path, vals, tile=16, shard=2)


@pytest.mark.parametrize("expand", ["held", "shards", "batches"])
def test_deep_batches_and_every_expand_path(tmp_path, monkeypatch, expand):
    """Batches of 8 x 8 tiles (three merge levels inside one ``merge_batch`` call, or block by block
    as a small DEM merges) and batches of 2 x 2 inside 8 x 8 shards, with ties and nodata at tile
    corners; the expand pass over the bits held from the tile phase (whole-shard batches), over
    whole shards read back, and, forced, over the tile phase's batches: every way scipy's forest."""
    mod = sys.modules["terrain_io.grid.mst.pipeline"]
    if expand != "held":
        monkeypatch.setattr(mod, "_holds_bits", lambda *a: False)
    monkeypatch.setattr(mod, "_expand_by_shards", lambda *a: expand == "shards")
    vals = terrain(150, 133, seed=7, levels=12)
    vals[np.random.default_rng(3).random(vals.shape) < 0.05] = np.nan
    vals[::8, ::8] = np.nan  # tile corners
    valid = valid_mask(vals, None)
    want, total = scipy_msf(vals, valid)
    for batch, below in ((8, None), (2, None), (8, 0), (2, 0)):
        if below is not None:  # as a large DEM: full batches merged inside one merge_batch call
            monkeypatch.setattr(sys.modules["terrain_io.grid.mst.pipeline"], "SERIAL_BELOW", below)
        res, got, _ = run(tmp_path, vals, tile=8, shard=8, name=f"b{batch}-{below}.zarr", batch_tiles=batch)
        assert res.batch_tiles == batch
        assert got == want, (batch, below)
        assert Fraction(res.total_weight_exact) == total and res.trees == islands(valid)


def test_merge_sorts_against_numpy():
    """The merge's two sorts: edges in the strict order (weight, code) -- numpy's lexsort, with
    negative weights, signed zeros (equal), ties, huge codes; vertex ids given as a few sorted runs
    -- numpy's argsort (and many runs, where it falls back to the radix argsort, checked against
    numpy's stable argsort too)."""
    from terrain_io.grid.mst._cpu import _argsort_strict, _vertex_order
    from terrain_io.grid._radix_cpu import argsort_int

    rng = np.random.default_rng(11)
    for m in (0, 1, 2, 17, 1000, 5000):
        w = rng.choice(np.array([-3.5, -0.0, 0.0, 1e-300, 2.0, 2.5, 1e300, -1e300]), m)
        w[: m // 2] = rng.standard_normal(m // 2).astype(np.float32)
        code = rng.choice(2**50, m, replace=False).astype(np.int64)
        want = np.lexsort((code, w + 0.0))  # + 0.0: -0.0 becomes 0.0, equal weights
        np.testing.assert_array_equal(_argsort_strict(w, code), want)
    for runs in (1, 2, 4, 5, 40):
        ids = np.concatenate([np.sort(rng.choice(10**9, 300, replace=False)) + k * 10**9
                              for k in rng.permutation(runs)])
        np.testing.assert_array_equal(_vertex_order(ids), np.argsort(ids))
    for m in (0, 1, 300, 5000):  # the radix argsort: numpy's stable argsort, with ties and negatives
        for a in (rng.integers(-5, 6, m), rng.integers(-2**62, 2**62, m), rng.integers(0, 2**31, m) | 7):
            np.testing.assert_array_equal(argsort_int(a.astype(np.int64)), np.argsort(a, kind="stable"))


def test_exact_weight_sum_against_fractions_and_frexp():
    """The superaccumulator behind ``total_weight_exact``: the same buckets as math.frexp gives, and
    the exact sum of Fractions, for doubles of every exponent (subnormals, signed zeros, negatives,
    float32 values), added and subtracted."""
    from terrain_io.grid.mst import _cpu as K
    from terrain_io.grid.mst.shared import EXP_OFFSET, N_EXP, exact_total

    rng = np.random.default_rng(4)
    bits = rng.integers(0, 2**63, 3000, dtype=np.int64).view(np.float64)  # positive, every exponent
    w = np.concatenate([bits[np.isfinite(bits)], -bits[np.isfinite(bits)][:500], [0.0, -0.0, 5e-324, -2.5e-310],
                        rng.standard_normal(500).astype(np.float32), [1e308, -1e308, 2.0**-1022]])
    for sign in (1, -1):
        got = np.zeros((2, N_EXP), dtype=np.int64)
        K.add_exact_many(got, w, sign)
        want = np.zeros((2, N_EXP), dtype=np.int64)
        for x in w.tolist():
            m, e = math.frexp(x)
            mant = int(m * 2**53) * sign
            hi = mant >> 26
            want[0, e + EXP_OFFSET] += hi
            want[1, e + EXP_OFFSET] += mant - (hi << 26)
        np.testing.assert_array_equal(got, want)
        assert exact_total(got) == sign * sum(Fraction(x) for x in w.tolist())
