"""The depression hierarchy (terrain_io.grid.depressions) against references written here from the
definition.

References: higra's binary partition tree by altitude ordering (``bpt_canonical``, the cell-level
minimax tree: lowest common ancestors' altitudes); plateaus by scipy.ndimage.label (8-connectivity, one elevation at a time), each draining
to its lowest lower neighbour (then least cell id) or, holding an outlet, to the outside; basins by
following those receivers; minimax values between every two leaves (and the outside) by a
union-find Kruskal over the whole cell graph (edges max(h_i, h_j), outlets joined to O at h); cells
and volumes by direct sums over the reference basins. Tie-independent checks: a node's spill
elevation is the least minimax from its leaves to any other leaf or O, a merge's children meet at
the minimax between their leaf sets. And consistency with ``fill``: the level at which a root spills
out is the fill level of each of its pits, the roots' volumes sum to the filled volume.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from terrain_io.errors import InputError
from terrain_io.grid.depressions import depressions, read_basins
from terrain_io.grid.fill import fill, read_fill
from terrain_io.store import TerrainStore
from references import N8, command_errors, fill_test_dem, table_command


def _outlets(valid, nodata_drains):
    rows, cols = valid.shape
    out = np.zeros_like(valid)
    out[0], out[-1], out[:, 0], out[:, -1] = True, True, True, True
    if nodata_drains:
        pad = np.pad(valid, 1, constant_values=True)
        for a, b in N8:
            out |= ~pad[1 + a : 1 + a + rows, 1 + b : 1 + b + cols]
    return out & valid


def reference_basins(h, valid, nodata_drains=True):
    """(basin raster, leaf pits in id order) by descent from the definition."""
    rows, cols = h.shape
    hf = h.astype(np.float64)
    outlet = _outlets(valid, nodata_drains)
    plateau = np.full(h.shape, -1, np.int64)
    n = 0
    for v in np.unique(hf[valid]):
        lab, k = ndimage.label(valid & (hf == v), structure=np.ones((3, 3)))
        plateau[lab > 0] = lab[lab > 0] - 1 + n
        n += k
    best = [None] * n  # (elevation, cell id) of the lowest lower neighbour
    has_outlet = np.zeros(n, bool)
    least = np.full(n, rows * cols)
    for i, j in zip(*np.nonzero(valid)):
        p = plateau[i, j]
        has_outlet[p] |= outlet[i, j]
        least[p] = min(least[p], i * cols + j)
        for a, b in N8:
            x, y = i + a, j + b
            if 0 <= x < rows and 0 <= y < cols and valid[x, y] and hf[x, y] < hf[i, j]:
                cand = (hf[x, y], x * cols + y)
                best[p] = cand if best[p] is None else min(best[p], cand)
    leaves = sorted(int(least[p]) for p in range(n) if not has_outlet[p] and best[p] is None)
    leaf_of_least = {c: k + 1 for k, c in enumerate(leaves)}
    end = {}

    def resolve(p):
        chain = []
        while p not in end:
            chain.append(p)
            if has_outlet[p]:
                end[p] = 0
            elif best[p] is None:
                end[p] = leaf_of_least[int(least[p])]
            else:
                c = best[p][1]
                p = plateau[c // cols, c % cols]
                continue
            break
        for q in chain:
            end[q] = end[p]
        return end[p]

    basin = np.zeros(h.shape, np.int64)
    for i, j in zip(*np.nonzero(valid)):
        basin[i, j] = resolve(plateau[i, j])
    return basin, np.array(leaves, np.int64)


def reference_minimax(h, valid, pits, nodata_drains=True):
    """mm[a, b]: the minimax value between leaves a, b (1..L) and the outside (0), by Kruskal over
    the cell graph with O; inf where there is no path."""
    rows, cols = h.shape
    hf = h.astype(np.float64)
    O = rows * cols
    edges = []
    for i, j in zip(*np.nonzero(valid)):
        for a, b in ((0, 1), (1, -1), (1, 0), (1, 1)):
            x, y = i + a, j + b
            if 0 <= x < rows and 0 <= y < cols and valid[x, y]:
                edges.append((max(hf[i, j], hf[x, y]), i * cols + j, x * cols + y))
    for i, j in zip(*np.nonzero(_outlets(valid, nodata_drains))):
        edges.append((hf[i, j], i * cols + j, O))
    edges.sort()
    parent = list(range(O + 1))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    members = {O: [0]}
    for k, c in enumerate(pits):
        members[int(c)] = [k + 1]
    mm = np.full((len(pits) + 1, len(pits) + 1), np.inf)
    for w, u, v in edges:
        ru, rv = find(u), find(v)
        if ru == rv:
            continue
        A, B = members.pop(ru, []), members.pop(rv, [])
        if A and B:
            mm[np.ix_(A, B)] = w
            mm[np.ix_(B, A)] = w
        parent[ru] = rv
        members[rv] = A + B
    return mm


def check_hierarchy(store, outlets="edge+nodata", **kw):
    """Run ``depressions`` and check it against the references; returns (result, basin raster)."""
    vals = np.asarray(store.elevation[...])
    valid = store.valid(vals)
    drains = outlets == "edge+nodata"
    res = depressions(store, outlets=outlets, device="cpu", progress=False, **kw)
    got = read_basins(store)
    basin, pits = reference_basins(vals, valid, drains)
    assert np.array_equal(got, basin)
    t = res.hierarchy
    L = len(pits)
    assert res.leaves == t.n_leaves == L
    assert np.array_equal(t.pit[1 : L + 1], pits)
    hf = vals.astype(np.float64)
    assert np.array_equal(t.pit_elevation[1 : L + 1], hf.ravel()[pits])
    mm = reference_minimax(vals, valid, pits, drains)
    nn = len(t) + 1
    leaves_of = [set() for _ in range(nn)]
    children = [[] for _ in range(nn)]
    for v in range(1, nn):
        leaves_of[v].add(v) if v <= L else None
        assert t.parent[v] == 0 or t.parent[v] > v
        u = v
        while t.parent[u] > 0:
            u = t.parent[u]
            leaves_of[u].add(v) if v <= L else None
        if t.parent[v] > 0:
            children[t.parent[v]].append(v)
    flat = basin.ravel()
    for v in range(1, nn):
        S = sorted(leaves_of[v])
        others = [b for b in range(L + 1) if b not in leaves_of[v]]  # other leaves and O
        out = mm[np.ix_(S, others)].min()
        s = t.spill[v]
        if np.isnan(s):  # never spills: no path to any other leaf or O
            assert out == np.inf and t.parent[v] == 0 and t.spill_cell[v] == -1
            in_s = np.isin(flat, S)
            assert t.cells[v] == in_s.sum()
        else:
            assert s == out, (v, s, out)
            to = t.spills_to[v]
            if to == 0:
                assert t.parent[v] == 0 and mm[S, 0].min() == s
                assert np.all(mm[S, 0] == s)  # every pit of a root fills to its spill level
            else:
                assert t.parent[to] == t.parent[v] > 0 and t.spills_to[to] == v
                assert mm[np.ix_(S, sorted(leaves_of[to]))].min() == s
            c = t.spill_cell[v]
            ci, cj = divmod(int(c), vals.shape[1])
            assert hf[ci, cj] == s
            near = [basin[ci + a, cj + b] for a, b in N8 + [(0, 0)]
                    if 0 <= ci + a < vals.shape[0] and 0 <= cj + b < vals.shape[1]]
            assert any(x in leaves_of[v] for x in near)
            under = np.isin(flat, S) & (hf.ravel() < s)
            assert t.cells[v] == under.sum()
            assert np.isclose(t.volume_cells[v], (s - hf.ravel()[under]).sum(), rtol=1e-12, atol=1e-9)
        if v > L:  # a merge: two children meeting at its merge elevation
            a, b = children[v]
            assert t.spill[a] == t.spill[b] == t.merge[v]
            assert mm[np.ix_(sorted(leaves_of[a]), sorted(leaves_of[b]))].min() == t.merge[v]
            low = min((hf.ravel()[pits[x - 1]], pits[x - 1]) for x in leaves_of[v])
            assert t.pit[v] == low[1]
        else:
            assert np.isnan(t.merge[v]) and not children[v]
    return res, got


def check_against_fill(store, res, outlets):
    fres = fill(store, outlets=outlets, device="cpu", progress=False)
    F = read_fill(store)["elevation"].astype(np.float64).ravel()
    t = res.hierarchy
    root = _roots(t)
    leaves = np.arange(1, t.n_leaves + 1)
    out = ~np.isnan(t.spill[root[leaves]])
    assert np.array_equal(F[t.pit[leaves[out]]], t.spill[root[leaves[out]]])  # a root spills at its pits' F
    assert np.isclose(res.volume, fres.volume, rtol=1e-12, atol=1e-9)


def _roots(t):
    root = np.arange(len(t.parent))
    for v in range(len(t.parent) - 1, 0, -1):  # parents have the larger ids
        if t.parent[v] > 0:
            root[v] = root[t.parent[v]]
    return root


def _same(a, b):
    ta, tb = a.hierarchy, b.hierarchy
    for f in ("parent", "spill", "spill_cell", "spills_to", "merge", "pit", "pit_elevation", "cells",
              "volume_cells"):
        assert getattr(ta, f).tobytes() == getattr(tb, f).tobytes(), f


@pytest.mark.parametrize("kind", [pytest.param("random", marks=pytest.mark.slow), "terraced", "flat-bottomed", "nodata-holed"])
@pytest.mark.parametrize("outlets", ["edge+nodata", "edge"])
def test_synthetic_dems(tmp_path, kind, outlets):
    h = fill_test_dem(kind, 41, 57, seed=len(kind) + 3)
    first = None
    for tile, shard, kw in ((8, 2, {"held": False}), (16, 2, {"held": False, "batch_tiles": 1}), (64, 2, {})):
        st = TerrainStore.from_array(tmp_path / f"{kind}{tile}.zarr", h, tile=tile, shard=shard)
        res, got = check_hierarchy(st, outlets, **kw)
        if first is None:
            first = (res, got)
            check_against_fill(st, res, outlets)
        else:  # the same tree and raster for every tile size and budget
            assert got.tobytes() == first[1].tobytes()
            _same(res, first[0])


def test_plateaus_across_tiles(tmp_path):
    """Wide flats and flat minima crossing many tiles, with exits on several tiles."""
    h = np.full((80, 80), 5.0, np.float32)
    h[10:70, 10:70] = 3.0  # a flat minimum spanning tiles
    h[20:60, 20:60] = 4.0  # a flat terrace inside it, draining into the ring
    h[40, 40] = 1.0  # a pit in the terrace
    h[0:5, 33:45] = 2.0  # flats at the edge: they drain out
    h[30:35, 72:80] = 2.0
    for tile in (8, 16):
        st = TerrainStore.from_array(tmp_path / f"p{tile}.zarr", h, tile=tile, shard=2)
        for outlets in ("edge+nodata", "edge"):
            res, _ = check_hierarchy(st, outlets, held=False)
            assert res.leaves == 2


def test_islands_never_spill(tmp_path):
    """Under ``edge`` a nodata ring walls in an island: its group never spills (NaN, all its cells)."""
    h = np.full((30, 30), 10.0, np.float32)
    h[5:25, 5:25] = np.nan
    h[8:22, 8:22] = 3.0
    h[14, 14] = 1.0
    h[10, 18] = 2.0
    st = TerrainStore.from_array(tmp_path / "i.zarr", h, tile=8, shard=2)
    res, _ = check_hierarchy(st, "edge")
    assert res.roots == 0 and np.isnan(res.hierarchy.spill[1:]).sum() == 1
    res, _ = check_hierarchy(st, "edge+nodata")  # the ring drains both pits
    assert res.roots == res.leaves == 2 and res.merges == 0


@pytest.mark.slow  # long: the default run keeps CI under its 15 minutes (the slow run covers it)
def test_integer_dem_out_of_core_budget(tmp_path):
    """Tiled batches (one tile each) give the same results as held. Under a budget below the
    store (7.5 MB) the tiles fit but its ~110,000 basins (~60 MB) do not: refused in one line."""
    rng = np.random.default_rng(7)
    h = (rng.integers(0, 60, (1000, 1000)) + np.add.outer(np.arange(1000), np.arange(1000)) // 40).astype(np.float64)
    big = TerrainStore.from_array(tmp_path / "big.zarr", h, tile=64, shard=4)
    with pytest.raises(InputError, match="too small for this store's basins"):
        depressions(big, device="cpu", progress=False, memory="7.5MB")
    res = depressions(big, device="cpu", progress=False, held=False, batch_tiles=1)
    assert res.method == "tiled" and res.batch_tiles == 1
    got = read_basins(big)
    held = depressions(big, device="cpu", progress=False, held=True)
    assert held.method == "held"
    assert read_basins(big).tobytes() == got.tobytes()
    _same(res, held)
    small = TerrainStore.from_array(tmp_path / "s.zarr", h[:120, :90].astype(np.int16), tile=16, shard=2)
    check_hierarchy(small)


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (2, 2), (3, 3), (17, 3)])
def test_small_and_empty_dems(tmp_path, shape):
    rng = np.random.default_rng(sum(shape))
    h = rng.integers(0, 5, shape).astype(np.float32)
    if shape == (3, 3):
        h[1, 1] = -1.0  # the one cell that is not an outlet: a leaf
    res, _ = check_hierarchy(TerrainStore.from_array(tmp_path / "a.zarr", h, tile=8, shard=2), held=False)
    assert res.leaves == (1 if shape == (3, 3) else 0)
    empty = TerrainStore.from_array(tmp_path / "e.zarr", np.full(shape, np.nan, np.float32), tile=8, shard=2)
    res = depressions(empty, device="cpu", progress=False)
    assert res.leaves == 0 and not read_basins(empty).any()


def test_parallel_tiles_equal_serial(tmp_path, monkeypatch):
    """Large DEMs run the tiles in a thread pool: forced here, the same results."""
    import terrain_io.grid.fill._tiled as tiled_module
    import terrain_io.grid.depressions.pipeline as module

    h = fill_test_dem("terraced", 61, 50, seed=4)
    st = TerrainStore.from_array(tmp_path / "a.zarr", h, tile=8, shard=2)
    serial, got = check_hierarchy(st, held=False)
    monkeypatch.setattr(module, "SERIAL_BELOW", 0)
    monkeypatch.setattr(tiled_module, "SERIAL_BELOW", 0)
    par, got2 = check_hierarchy(st, held=False)
    assert got2.tobytes() == got.tobytes()
    _same(par, serial)


def test_cli_table_attrs_and_export(tmp_path):
    from click.testing import CliRunner

    from cli.main import cli

    st, output, rows = table_command(tmp_path, "depressions")
    vals = np.asarray(st.elevation[...])
    basin, pits = reference_basins(vals, st.valid(vals), False)
    assert f"{len(pits):,} leaf basins" in output
    assert np.array_equal(read_basins(st), basin)
    attrs = TerrainStore.open(st.path).group["depressions"].attrs
    tree = attrs["depression_tree"]
    assert [int(r["id"]) for r in rows] == tree["id"] == list(range(1, len(rows) + 1))
    assert [r["kind"] for r in rows[: len(pits)]] == ["leaf"] * len(pits)
    assert [int(r["pit_row"]) * 50 + int(r["pit_col"]) for r in rows[: len(pits)]] == pits.tolist()
    assert [int(r["parent"]) for r in rows] == tree["parent"]
    assert attrs["leaves"] == len(pits)
    png = tmp_path / "b.png"
    out = CliRunner().invoke(cli, ["export", str(st.path), "depressions/basin", "-o", str(png)])
    assert out.exit_code == 0 and png.stat().st_size > 100, out.output
    import warnings

    import rasterio

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a picture has no geotransform
        with rasterio.open(png) as ds:
            img = ds.read()[:, : basin.shape[0], : basin.shape[1]]  # the picture above its legend
    # one colour per basin, transparent where there is none
    assert np.array_equal(img[3] > 0, basin > 0)
    for k in np.unique(basin[basin > 0]):
        assert len(np.unique(img[:3, basin == k], axis=1).T) == 1


def test_cli_errors(tmp_path):
    st, (missing, small, sea, table) = command_errors(tmp_path, "depressions")
    assert missing.exit_code == 1 and missing.output.startswith("terrain: error:")
    assert small.exit_code == 1 and "too small" in small.output and "Traceback" not in small.output
    assert len(small.output.strip().splitlines()) == 1
    assert sea.exit_code == 2
    assert table.exit_code == 2 and "does not exist" in table.output
    assert "depressions/basin" not in TerrainStore.open(st.path).results()


def higra_check(store, res, outlets):
    """Our tree against higra's binary partition tree by altitude ordering (Kruskal over the cell
    graph with O; nodata cells hang from O at a huge weight so that the graph is connected): every
    merge's level is the altitude of the lowest common ancestor of its children's pits, every
    root's spill that of its pit and O (the huge weight: never spills)."""
    hg = pytest.importorskip("higra")
    vals = np.asarray(store.elevation[...])
    valid = store.valid(vals)
    rows, cols = vals.shape
    O, big = rows * cols, 1e300
    hf = np.where(valid, vals.astype(np.float64), np.nan).ravel()
    ids = np.arange(O).reshape(rows, cols)
    src, dst = [], []
    for a, b in ((0, 1), (1, -1), (1, 0), (1, 1)):
        c0, c1 = max(0, -b), cols - max(0, b)
        u, v = ids[: rows - a, c0:c1].ravel(), ids[a:, c0 + b : c1 + b].ravel()
        keep = valid.ravel()[u] & valid.ravel()[v]
        src.append(u[keep])
        dst.append(v[keep])
    out = _outlets(valid, outlets == "edge+nodata").ravel()
    src += [np.flatnonzero(out), np.flatnonzero(~valid.ravel())]
    dst += [np.full(out.sum(), O), np.full((~valid).sum(), O)]
    src, dst = np.concatenate(src), np.concatenate(dst)
    w = np.where(dst == O, np.where(valid.ravel()[src], hf[src], big), np.maximum(hf[src], np.append(hf, 0)[dst]))
    g = hg.UndirectedGraph(O + 1)
    g.add_edges(src, dst)
    tree, alt = hg.bpt_canonical(g, w)
    t = res.hierarchy
    spill = np.where(np.isnan(t.spill), big, t.spill)[1:]
    other = np.where(t.parent[1:] == 0, O, t.pit[t.spills_to[1:]])
    tree.lowest_common_ancestor_preprocess()
    assert np.array_equal(alt[tree.lowest_common_ancestor(t.pit[1:], other)], spill)


REAL = sorted(p for p in (Path(__file__).resolve().parents[1] / "sample_data").iterdir() if p.suffix in (".asc", ".tif"))


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_dems_against_higra_and_fill(tmp_path, path):
    from terrain_io.convert import convert

    convert(path, tmp_path / "a.zarr", tile=64, shard=4)
    st = TerrainStore.open(tmp_path / "a.zarr")
    outlets = ("edge+nodata", "edge") if "holes" in path.name else ("edge+nodata",)
    for o in outlets:
        if path.name.startswith("topobathy"):  # small: every check from the definition too
            res, _ = check_hierarchy(st, o, held=False)
        else:
            res = depressions(st, outlets=o, device="cpu", progress=False)
        higra_check(st, res, o)
        check_against_fill(st, res, o)


_MEMORY_SCRIPT = """
import sys
from terrain_io.grid.depressions import depressions
from terrain_io.memory import current_rss, peak_rss, reset_peak_rss
from terrain_io.store import TerrainStore

depressions(TerrainStore.open(sys.argv[2]), device="cpu", progress=False, held=False)  # compile / load kernels
reset_peak_rss()
base = current_rss()
res = depressions(TerrainStore.open(sys.argv[1]), device="cpu", progress=False, memory=sys.argv[3])
print(peak_rss() - base, res.method, res.batch_tiles, res.leaves)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux peak-RSS reset")
@pytest.mark.slow
def test_memory_budget_out_of_core(tmp_path):
    """A store larger than the budget: basins tile by tile, peak RSS within the budget (and a little for the
    O(basins) arrays), the same results as holding the DEM on a copy with other tiles."""
    import os
    import subprocess
    import sys

    from terrain_io.synth import synthesize

    size, budget = 4096, 54
    synthesize(tmp_path / "big.zarr", size, seed=4, nodata_fraction=0.02, tile=256, shard=1)
    synthesize(tmp_path / "warm.zarr", 515, seed=4, tile=256, shard=1)
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(tmp_path / "big.zarr"), str(tmp_path / "warm.zarr"),
                          f"{budget}MB"], capture_output=True, text=True, check=True,
                         env={**os.environ, "NUMBA_NUM_THREADS": "2"})
    grown, method, _batch, leaves = out.stdout.split()
    raw = size * size * 4
    assert method == "tiled" and raw > budget * 2**20
    assert int(grown) <= (budget + 24) * 2**20 and int(grown) < raw, grown
    vals = np.asarray(TerrainStore.open(tmp_path / "big.zarr").elevation[...])
    got = read_basins(tmp_path / "big.zarr")
    other = TerrainStore.from_array(tmp_path / "other.zarr", vals, tile=1024, shard=2)
    res = depressions(other, device="cpu", progress=False, held=True)
    assert res.leaves == int(leaves) and read_basins(other).tobytes() == got.tobytes()
    check_against_fill(other, res, "edge+nodata")
