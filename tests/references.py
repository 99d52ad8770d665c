"""References and helpers shared by test modules, one home for all of them (no test module imports
another): written from the formats' and algorithms' definitions or taken from independent libraries
(scipy, pyflwdir), never from our own code's output. Optional libraries are ``pytest.importorskip``-ed
where used; data files beside the repository (:data:`SHARED_DATA`) skip with a reason where missing."""
from __future__ import annotations

import hashlib
import heapq
import math
import os
import subprocess
import sys
import warnings
from collections import deque
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.stats
import zarr
from scipy import ndimage
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import dijkstra, minimum_spanning_tree

from terrain_io.grid.flow.codes import NODATA, OUTLET, SINK
from terrain_io.store import TerrainStore, write_block

ROOT = Path(__file__).resolve().parents[1]  # the repository
# Larger DEMs kept beside the repository, not in it (too large to commit): ROOT/../shared/data, or the
# folder TERRAIN_TEST_DATA names. Tests that need one skip, saying so, where it is missing.
SHARED_DATA = Path(os.environ.get("TERRAIN_TEST_DATA") or ROOT.parent / "shared" / "data")


def __getattr__(name):
    """``UTM33`` (rasterio's CRS for EPSG:32633), made on first use: GPU runs carry no rasterio."""
    if name == "UTM33":
        from rasterio.crs import CRS

        return CRS.from_epsg(32633)
    raise AttributeError(name)


# attributes of a store or result that differ between equal runs (the generation: a random id per store)
VOLATILE = {"seconds", "timings", "created", "index_reused", "generation"}


def utm_store(path, values, crs="UTM33", tile=16, shard=2) -> TerrainStore:
    """A store of ``values`` on a 30 m grid in ``crs`` (default UTM 33N; None: no CRS)."""
    crs = __getattr__(crs) if crs == "UTM33" else crs
    attrs = {"transform": [500000.0, 30.0, 0.0, 4100000.0, 0.0, -30.0], "cell_size": [30.0, 30.0],
             "crs": crs.to_wkt() if crs else None}
    return TerrainStore.from_array(path, values, tile=tile, shard=shard, attrs=attrs)


def parse_esri_ascii(path):
    """(header, values float64 with NaN for NODATA_value) by the format's definition: keyword lines,
    then nrows lines of ncols numbers."""
    tokens = path.read_text().split()
    header, i = {}, 0
    while tokens[i][0].isalpha():
        header[tokens[i].lower()] = tokens[i + 1]
        i += 2
    rows, cols = int(header["nrows"]), int(header["ncols"])
    body = tokens[i:]
    assert len(body) == rows * cols
    nodata = header.get("nodata_value")
    values = np.array([math.nan if t == nodata else float(t) for t in body]).reshape(rows, cols)
    return header, values


# --- Grid shortest paths: scipy's Dijkstra on the explicit 8-neighbour graph, edge weights from the models' definitions ---

DR = [0, 1, 1, 1, 0, -1, -1, -1]


DC = [1, 1, 0, -1, -1, -1, 0, 1]


def reference(vals, sources, kind="absdiff", dx=1.0, dy=1.0):
    """Multi-source distances by scipy's Dijkstra on the explicit 8-neighbour graph (NaN = no vertex)."""
    H, W = vals.shape
    ids = np.arange(H * W).reshape(H, W)
    us, vs, ws = [], [], []
    for k in range(8):
        dr, dc = DR[k], DC[k]
        r0, r1, c0, c1 = max(0, -dr), H - max(0, dr), max(0, -dc), W - max(0, dc)
        a, b = vals[r0:r1, c0:c1], vals[r0 + dr : r1 + dr, c0 + dc : c1 + dc]
        m = ~np.isnan(a) & ~np.isnan(b)  # (walk_friction: elevation + 1j * friction)
        step = np.hypot(dx * abs(dc), dy * abs(dr))
        w = {"absdiff": lambda: np.abs(a - b), "surface": lambda: np.sqrt(step**2 + (a - b) ** 2),
             "cell": lambda: (a + b) / 2 * step, "walk": lambda: tobler_seconds(a, b, step),
             "walk_friction": lambda: tobler_seconds(a.real, b.real, step) * (a.imag + b.imag) / 2}[kind]()
        us.append(ids[r0:r1, c0:c1][m])
        vs.append(ids[r0 + dr : r1 + dr, c0 + dc : c1 + dc][m])
        ws.append(w[m])
    w = np.concatenate(ws)
    w = np.where(w == 0, 1e-300, w)  # a sparse matrix drops explicit zeros: keep zero-weight edges
    g = sp.csr_matrix((w, (np.concatenate(us), np.concatenate(vs))), shape=(H * W, H * W))
    d = dijkstra(g, directed=True, indices=[r * W + c for r, c in sources], min_only=True).reshape(H, W)
    d[d < 1e-250] = 0.0
    d[np.isnan(vals)] = np.nan
    return d


def tobler_seconds(a, b, step):
    """Seconds to walk from height a to height b over ``step`` metres: Tobler's hiking function
    v = 6 exp(-3.5 |dh/step + 0.05|) km/h, from its definition (NumPy's exp)."""
    speed = 6.0 * np.exp(-3.5 * np.abs((b - a) / step + 0.05)) / 3.6  # m/s
    return step / speed


def edge_w(kind, a, b, k, dx=1.0, dy=1.0):
    """w(a -> b) over direction k."""
    step = np.hypot(dx * abs(DC[k]), dy * abs(DR[k]))
    if kind == "walk_friction":
        return tobler_seconds(a.real, b.real, step) * (a.imag + b.imag) / 2
    return {"absdiff": abs(a - b), "surface": np.sqrt(step**2 + (a - b) ** 2), "cell": (a + b) / 2 * step,
            "walk": tobler_seconds(a, b, step)}[kind]


def check_predecessors(dist, pred, vals, sources, kind, dx=1.0, dy=1.0):
    """Every reached cell's parent is a vertex one step away with dist[parent] + w == dist[cell];
    every chain ends at a source (no cycles) and unreached cells have no parent."""
    H, W = dist.shape
    src = set(map(tuple, sources))
    for (r, c) in src:
        assert pred[r, c] == 255 and dist[r, c] == 0
    reached = np.isfinite(dist)
    assert np.all(pred[~reached] == 255)
    rr, cc = np.nonzero(reached)
    for r, c in zip(rr, cc):
        if (r, c) in src:
            continue
        p = int(pred[r, c])
        assert p < 8, (r, c)
        pr, pc = r + DR[p], c + DC[p]
        assert 0 <= pr < H and 0 <= pc < W and np.isfinite(dist[pr, pc])
        w = edge_w(kind, vals[pr, pc], vals[r, c], p, dx, dy)
        assert np.isclose(float(dist[pr, pc]) + w, float(dist[r, c]), rtol=1e-5, atol=1e-4)
    # chains: walk in order of distance so each walk stops at an already verified cell
    ok = np.zeros(dist.shape, bool)
    for r, c in src:
        ok[r, c] = True
    for r, c in zip(rr, cc):
        path = []
        while not ok[r, c]:
            path.append((r, c))
            assert len(path) <= H * W, "predecessor cycle"
            p = int(pred[r, c])
            r, c = r + DR[p], c + DC[p]
        for q in path:
            ok[q] = True


def make_store(tmp_path, vals, tile=16, shard=2, name="dem.zarr", dx=1.0, dy=1.0):
    attrs = {"transform": [100.0, dx, 0.0, 500.0, 0.0, -dy], "cell_size": [dx, dy]}
    return TerrainStore.from_array(tmp_path / name, vals, tile=tile, shard=shard, attrs=attrs)


def random_dem(shape, seed, holes=0.0):
    rng = np.random.default_rng(seed)
    v = (rng.random(shape) * 50).astype(np.float32)
    if holes:
        v[rng.random(shape) < holes] = np.nan
    return v


# --- The in-core SSSP engine's tie rule, from its definition, and test DEMs with ties ----------------------------

KINDS = {"absdiff": 1, "surface": 2, "cell": 3}


def exact_weight(kind, a, b, k, dx, dy):
    """w(a -> b) over direction k, as IEEE float64 operations (squares as products: pow() can be
    1 ulp off)."""
    step = float(np.hypot(dx * abs(DC[k]), dy * abs(DR[k])))
    return {"absdiff": lambda: abs(a - b), "surface": lambda: float(np.sqrt(step * step + (a - b) * (a - b))),
            "cell": lambda: (a + b) * 0.5 * step}[kind]()


def rule_predecessors(vals, dist, sources, kind, dx=1.0, dy=1.0):
    """The tie rule from its definition (engine docstring), by a plain breadth-first search.

    Tight edge u -> v: dist[u] + w(u, v) == dist[v]. Level 0 at sources and cells with a strictly
    nearer tight parent; else 1 + the least level of the (equal-distance) tight parents. Parent:
    the least key (0 strictly nearer, else level + 1), then the least direction code."""
    from terrain_io.grid.sssp.incore import NO_LEVEL

    H, W = vals.shape
    src = set(map(tuple, sources))

    def parents(r, c):
        for k in range(8):
            pr, pc = r + DR[k], c + DC[k]
            if 0 <= pr < H and 0 <= pc < W and not np.isnan(vals[pr, pc]) and np.isfinite(dist[pr, pc]):
                if dist[pr, pc] + exact_weight(kind, float(vals[pr, pc]), float(vals[r, c]), k, dx, dy) == dist[r, c]:
                    yield k, pr, pc

    level = np.full((H, W), NO_LEVEL, np.int64)
    reached = np.isfinite(dist) & ~np.isnan(vals)
    queue = deque()
    for r, c in zip(*np.nonzero(reached)):
        if (r, c) in src or any(dist[pr, pc] < dist[r, c] for _, pr, pc in parents(r, c)):
            level[r, c] = 0
            queue.append((r, c))
    while queue:  # plateau cells, in order of level
        r, c = queue.popleft()
        for k in range(8):
            x, y = r - DR[k], c - DC[k]  # the cell whose neighbour in direction k is (r, c)
            if 0 <= x < H and 0 <= y < W and reached[x, y] and level[x, y] == NO_LEVEL and dist[x, y] == dist[r, c]:
                if any((pr, pc) == (r, c) for _, pr, pc in parents(x, y)):
                    level[x, y] = level[r, c] + 1
                    queue.append((x, y))
    pred = np.full((H, W), 255, np.uint8)
    for r, c in zip(*np.nonzero(reached)):
        if (r, c) in src:
            continue
        keys = [(0 if dist[pr, pc] < dist[r, c] else level[pr, pc] + 1, k) for k, pr, pc in parents(r, c)]
        pred[r, c] = min(keys)[1]
    return pred


def terraced(shape, seed, step=10.0):
    return (np.floor(random_dem(shape, seed) / step) * step).astype(np.float32)


CASES = {
    "random": lambda: random_dem((37, 53), 1, holes=0.08),
    "terraced": lambda: terraced((40, 40), 2),  # exact ties and zero-weight plateaus
    "flat": lambda: np.full((30, 33), 7.0, np.float32),
    "holes": lambda: np.where(random_dem((41, 29), 3) > 40, np.nan, terraced((41, 29), 4, 25.0)).astype(np.float32),
}


def check_warm_solve(kind: str, device: str):
    """A sub-block solved cold for an earlier ring (distances higher on one side, another side
    not known yet: NaN values, +inf distances) and then warm, in the same blocks, for the true
    ring gives the whole grid's solve inside -- whose distances are scipy's."""
    from terrain_io.weights import steps_of
    from terrain_io.grid.sssp.incore import NO_LEVEL, ringed, solve_block

    v = terraced((150, 140), 5, step=6.0)  # plateaus: levels and ties matter
    v[np.random.default_rng(6).random(v.shape) < 0.03] = np.nan
    steps, sources = steps_of(2.0, 3.0), [(4, 7)]
    whole = ringed(v)
    dist, level, pred = solve_block(whole, KINDS[kind], steps, sources)
    np.testing.assert_array_equal(dist[1:-1, 1:-1][~np.isnan(v)],
                                  reference(v.astype(np.float64), sources, kind, 2.0, 3.0)[~np.isnan(v)])
    r0, r1, c0, c1 = 40, 140, 30, 130  # interior rows r0..r1-1, cols c0..c1-1 of the DEM (several GPU tiles)
    true = [a[r0 : r1 + 2, c0 : c1 + 2].copy() for a in (whole, dist, level)]
    early = [a.copy() for a in true]
    early[1][0] += 5.0
    early[0][:, -1], early[1][:, -1], early[2][:, -1] = np.nan, np.inf, NO_LEVEL
    xp = np
    if device == "gpu":
        import cupy as xp
    blocks = [xp.asarray(a) for a in early]
    none = np.empty((0, 2), np.int64)
    d, lv, _ = solve_block(blocks[0], KINDS[kind], steps, none, blocks[1], blocks[2], device=device)
    blocks[1:] = [d, lv]
    inner = d[1:-1, 1:-1].get() if xp is not np else d[1:-1, 1:-1]
    assert (inner > dist[r0 + 1 : r1 + 1, c0 + 1 : c1 + 1]).sum() > 100  # the early ring's solve is above
    for block, new in zip(blocks, true):
        block[0], block[-1], block[:, 0], block[:, -1] = (xp.asarray(x) for x in (new[0], new[-1], new[:, 0],
                                                                                  new[:, -1]))
    d, lv, p = (xp.asnumpy(a) if xp is not np else a
                for a in solve_block(blocks[0], KINDS[kind], steps, none, blocks[1], blocks[2], device=device,
                                     warm=True))
    np.testing.assert_array_equal(d[1:-1, 1:-1], dist[r0 + 1 : r1 + 1, c0 + 1 : c1 + 1])
    np.testing.assert_array_equal(lv[1:-1, 1:-1], level[r0 + 1 : r1 + 1, c0 + 1 : c1 + 1])
    np.testing.assert_array_equal(p, pred[r0:r1, c0:c1])


# --- Path costs summed edge by edge ------------------------------------------------------------------------------

def walk_cost(vals, cells, kind, dx=1.0, dy=1.0):
    total = 0.0
    for (r0, c0), (r1, c1) in zip(cells[:-1], cells[1:]):
        dr, dc = r1 - r0, c1 - c0
        assert max(abs(dr), abs(dc)) == 1, "cells of a path must be neighbours"
        k = [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)].index((dr, dc))
        total += edge_w(kind, float(vals[r0, c0]), float(vals[r1, c1]), k, dx, dy)
    return total


# --- Depression filling: Priority-Flood written from its definition, pyflwdir, scipy.ndimage lakes ---------------

REAL = [ROOT / "sample_data" / "jacksboro_fault_dem.asc", ROOT / "sample_data" / "jacksboro_fault_dem_holes.grass.asc",
        ROOT / "sample_data" / "pysheds_dem.tif", ROOT / "sample_data" / "topobathy_land.tif",
        SHARED_DATA / "topobathy.tif"]  # convert_dem skips where a file is missing
_REFS: dict = {}  # fill_references' cache: the last DEM's references


N8 = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def priority_flood(h, valid, nodata_drains=True):
    """F by Priority-Flood from the definition: seeds = valid cells on the grid's edge (or next to a
    non-vertex), at their own elevation; a popped level spreads as max(level, h). Unreached: h."""
    rows, cols = h.shape
    F = h.astype(np.float64).copy()
    done = ~valid.copy()
    pq = []
    for i, j in zip(*np.nonzero(valid)):
        edge = i in (0, rows - 1) or j in (0, cols - 1)
        if edge or (nodata_drains and any(not valid[i + a, j + b] for a, b in N8)):
            heapq.heappush(pq, (float(h[i, j]), int(i), int(j)))
            done[i, j] = True
    while pq:
        v, i, j = heapq.heappop(pq)
        for a, b in N8:
            x, y = i + a, j + b
            if 0 <= x < rows and 0 <= y < cols and not done[x, y]:
                done[x, y] = True
                F[x, y] = max(v, float(h[x, y]))
                heapq.heappush(pq, (F[x, y], x, y))
    return F


def pyflwdir_fill(h, valid, nodata_drains=True):
    hh = np.where(valid, h.astype(np.float64), -9999.0)
    pits = None
    if not nodata_drains:
        edge = np.zeros(h.shape, bool)
        edge[0], edge[-1], edge[:, 0], edge[:, -1] = True, True, True, True
        pits = np.flatnonzero(edge & valid)
        if not len(pits):
            return np.where(valid, hh, np.nan)
    pyflwdir = pytest.importorskip("pyflwdir")
    out, _ = pyflwdir.dem.fill_depressions(hh, nodata=-9999.0, idxs_pit=pits)
    if not nodata_drains:  # pyflwdir fills cells no outlet reaches with nothing: they keep h
        out = np.where(out == -9999.0, hh, out)
    return out


def lakes_reference(h, valid, F, cell_area=1.0):
    """The depression table from the reference levels, by scipy.ndimage.label and direct sums."""
    rows, cols = h.shape
    hf = h.astype(np.float64)
    raised = valid & (F > hf)
    lab, n = ndimage.label(raised, structure=np.ones((3, 3)))
    ids = np.arange(rows * cols).reshape(rows, cols)
    idx = np.arange(1, n + 1)
    least = np.asarray(ndimage.minimum(ids, lab, idx), np.int64) if n else np.empty(0, np.int64)
    renum = np.zeros(n + 1, np.int64)
    renum[1 + np.argsort(least)] = idx
    lab = renum[lab]
    least = np.sort(least)
    flat = lab.ravel()
    cells = np.bincount(flat, minlength=n + 1)[1:]
    level = np.asarray(ndimage.maximum(F, lab, idx)) if n else np.empty(0)
    assert n == 0 or np.array_equal(level, ndimage.minimum(F, lab, idx))  # one flat water surface per lake
    depth = np.where(raised, F - hf, 0.0)
    volume = np.bincount(flat, depth.ravel(), minlength=n + 1)[1:] * cell_area
    max_depth = np.asarray(ndimage.maximum(depth, lab, idx)) if n else np.empty(0)
    sel = np.flatnonzero(flat)
    first = sel[np.lexsort((sel, hf.ravel()[sel], flat[sel]))]  # by lake, elevation, cell id
    pit = first[np.searchsorted(flat[first], idx)] if n else np.empty(0, np.int64)
    spill = np.full(n + 1, np.iinfo(np.int64).max)
    pad_h = np.pad(hf, 1, constant_values=np.nan)
    pad_ok = np.pad(valid, 1)
    r, c = np.nonzero(raised)
    for a, b in N8:  # cells next to a lake at its level
        x, y = r + a + 1, c + b + 1
        at = pad_ok[x, y] & (pad_h[x, y] == F[r, c])
        np.minimum.at(spill, lab[r[at], c[at]], (x[at] - 1) * cols + y[at] - 1)
    spill = spill[1:]
    spills_to = np.zeros(n, np.int64)
    for k in range(n):
        si, sj = divmod(int(spill[k]), cols)
        best = (np.inf, -1, 0)
        for a, b in N8:
            x, y = si + a, sj + b
            if 0 <= x < rows and 0 <= y < cols and lab[x, y] not in (0, k + 1):
                best = min(best, (F[x, y], x * cols + y, lab[x, y]))
        spills_to[k] = best[2]
    return lab, dict(least=least, cells=cells, pit=pit, spill=spill, level=level, volume=volume,
                     max_depth=max_depth, spills_to=spills_to)


def fill_references(vals, valid, drains, cell_area):
    """(F by Priority-Flood, F by pyflwdir, lake raster, table), computed once per DEM."""
    key = (vals.tobytes(), vals.shape, str(vals.dtype), drains, cell_area)
    if key not in _REFS:
        F = priority_flood(vals, valid, drains)
        _REFS.clear()
        _REFS[key] = (F, pyflwdir_fill(vals, valid, drains)) + lakes_reference(vals, valid, F, cell_area)
    return _REFS[key]


def check_against_references(store, outlets="edge+nodata", **kw):
    from terrain_io.grid.fill import fill, read_fill

    vals = np.asarray(store.elevation[...])
    valid = store.valid(vals)
    res = fill(store, outlets=outlets, device="cpu", progress=False, **kw)
    got = read_fill(store)
    drains = outlets == "edge+nodata"
    F, P, lab, table = fill_references(vals, valid, drains, float(np.prod(store.cell_size)))
    assert np.array_equal(got["elevation"][valid], F[valid].astype(vals.dtype))
    assert np.array_equal(got["elevation"][valid], P[valid].astype(vals.dtype))
    assert np.array_equal(got["depth"][valid], (F - vals)[valid].astype(np.float32))
    assert np.isnan(got["depth"][~valid]).all() and (got["depression"][~valid] == 0).all()
    assert np.array_equal(got["depression"], lab)
    t = res.table
    assert len(t) == len(table["cells"]) == res.depressions
    for f in ("least", "cells", "pit", "spill", "level", "max_depth", "spills_to"):
        assert np.array_equal(getattr(t, f), table[f]), f
    assert np.allclose(t.volume_cells * np.prod(store.cell_size), table["volume"], rtol=1e-12, atol=0)
    return res, got


FILL_FIELDS = ("least", "cells", "pit", "spill", "level", "volume_cells", "max_depth", "pit_elevation", "spills_to")


def gpu_equals_cpu(st_gpu, st_cpu, outlets="edge+nodata"):
    """Fill both stores (the same DEM), the GPU one on the GPU: every output byte and table entry equal,
    and F equal to the Priority-Flood of the definition (the GPU fill's tests)."""
    from terrain_io.grid.fill import fill, read_fill

    res_c = fill(st_cpu, outlets=outlets, device="cpu", progress=False)
    res_g = fill(st_gpu, outlets=outlets, device="gpu", progress=False)
    assert (res_g.device, res_g.method) == ("gpu", "incore")
    got_c, got_g = read_fill(st_cpu), read_fill(st_gpu)
    for k in got_c:
        assert got_g[k].dtype == got_c[k].dtype, k
        assert got_g[k].tobytes() == got_c[k].tobytes(), k
    for f in FILL_FIELDS:
        a, b = getattr(res_g.table, f), getattr(res_c.table, f)
        assert a.tobytes() == b.tobytes() and a.dtype == b.dtype, f
    assert (res_g.depressions, res_g.filled_cells, res_g.volume) == (res_c.depressions, res_c.filled_cells,
                                                                     res_c.volume)
    vals = np.asarray(st_gpu.elevation[...])
    valid = st_gpu.valid(vals)
    F = priority_flood(vals, valid, outlets == "edge+nodata")
    assert np.array_equal(got_g["elevation"][valid], F[valid].astype(vals.dtype))
    a = TerrainStore.open(st_gpu.path).group["fill"].attrs
    assert a["device"] == "gpu" and a["depressions"] == res_c.depressions
    return res_g


def fill_test_dem(kind, rows, cols, seed):
    rng = np.random.default_rng(seed)
    if kind == "random":
        h = rng.random((rows, cols)).astype(np.float32) * 100
    elif kind == "terraced":  # few levels: ties and flats everywhere
        h = (rng.integers(0, 12, (rows, cols)) // 3).astype(np.float32)
    elif kind == "flat-bottomed":  # bowls with flat floors, a rim with one notch
        y, x = np.mgrid[0:rows, 0:cols]
        h = np.maximum(np.hypot(y - rows / 2, x - cols / 2).astype(np.float32), 5.0)
        h += (rng.integers(0, 3, (rows, cols)) * (h > 6)).astype(np.float32)
        h[rows // 2, :3] = 0.0
    else:  # nodata-holed
        h = rng.integers(0, 40, (rows, cols)).astype(np.float32)
        h[rng.random((rows, cols)) < 0.08] = np.nan
        h[rows // 3 : rows // 3 + 6, cols // 4 : cols // 4 + 9] = np.nan
    return h


def table_command(tmp_path, command: str):
    """``terrain COMMAND --table`` (CPU, outlets at the edge) on a 40 x 50 store with nodata holes:
    (the store, the command's output, the table's rows)."""
    import csv

    from click.testing import CliRunner

    from cli.main import _register, cli

    _register()
    h = fill_test_dem("nodata-holed", 40, 50, seed=2)
    st = TerrainStore.from_array(tmp_path / "a.zarr", h, tile=16, shard=2)
    out = CliRunner().invoke(cli, [command, str(st.path), "--device", "cpu", "--outlets", "edge",
                                   "--table", str(tmp_path / "d.csv")])
    assert out.exit_code == 0, out.output
    with open(tmp_path / "d.csv") as f:
        rows = list(csv.DictReader(f))
    return st, out.output, rows


def command_errors(tmp_path, command: str):
    """``terrain COMMAND`` run wrongly: on a missing store, then on a 20 x 20 store under a 2 KB budget
    (CPU), with outlets 'sea' and with ``--table`` in a missing folder: (that store, the four results)."""
    from click.testing import CliRunner

    from cli.main import _register, cli

    _register()
    missing = CliRunner().invoke(cli, [command, str(tmp_path / "missing.zarr")])
    st = TerrainStore.from_array(tmp_path / "a.zarr", np.ones((20, 20), np.float32), tile=8, shard=2)
    wrong = [["--memory", "2KB", "--device", "cpu"], ["--outlets", "sea"], ["--table", str(tmp_path / "no" / "t.csv")]]
    return st, [missing] + [CliRunner().invoke(cli, [command, str(st.path), *a]) for a in wrong]


def convert_dem(path, out, tile):
    """``path`` converted into the store ``out`` (tile ``tile``, shard 4); the test skips, saying why,
    when ``path`` (a file of the shared data folder) is not there."""
    if not Path(path).exists():
        pytest.skip(f"{path} not found: the shared data folder beside the repository (TERRAIN_TEST_DATA=DIR names "
                    f"another)")
    from terrain_io.convert import convert

    convert(path, out, tile=tile, shard=4)
    return out


# --- Grid MST: scipy's minimum_spanning_tree on the explicit grid graph ------------------------------------------

FORWARD = [(0, 1), (1, -1), (1, 0), (1, 1)]  # E, SW, S, SE: the order of the larger endpoint


def grid_edges(vals, valid, weight):
    """Every edge (u < v) of the 8-connected grid graph with its float64 weight."""
    rows, cols = vals.shape
    us, vs, ws = [], [], []
    r, c = np.nonzero(valid)
    for dr, dc in FORWARD:
        rr, cc = r + dr, c + dc
        ok = (rr >= 0) & (rr < rows) & (cc >= 0) & (cc < cols)
        ok[ok] &= valid[rr[ok], cc[ok]]
        a = vals[r[ok], c[ok]].astype(np.float64)
        b = vals[rr[ok], cc[ok]].astype(np.float64)
        us.append(r[ok] * cols + c[ok])
        vs.append(rr[ok] * cols + cc[ok])
        ws.append(np.maximum(a, b) if weight == "max" else np.abs(a - b))
    return np.concatenate(us), np.concatenate(vs), np.concatenate(ws)


def scipy_msf(vals, valid, weight="max"):
    """(edge set, exact total weight) of the unique MSF under the strict order, by scipy."""
    u, v, w = grid_edges(vals, valid, weight)
    order = np.lexsort((v, u, w))  # weight, then smaller id, then larger id
    rank = np.empty(len(order), dtype=np.float64)
    rank[order] = np.arange(1, len(order) + 1)
    n = vals.size
    tree = minimum_spanning_tree(coo_matrix((rank, (u, v)), shape=(n, n)).tocsr()).tocoo()
    a, b = np.minimum(tree.row, tree.col), np.maximum(tree.row, tree.col)
    chosen = set(zip(a.tolist(), b.tolist()))
    weight_of = dict(zip(zip(u.tolist(), v.tolist()), w.tolist()))
    return chosen, sum(Fraction(weight_of[e]) for e in chosen)


def islands(valid):
    return ndimage.label(valid, structure=np.ones((3, 3)))[1]


def terrain(rows, cols, seed=0, levels=None):
    """Smoothed noise (hills); ``levels`` rounds it to that many values (large flat areas, ties)."""
    rng = np.random.default_rng(seed)
    z = ndimage.gaussian_filter(rng.standard_normal((rows, cols)), 3) * 50 + rng.standard_normal((rows, cols))
    if levels:
        z = np.round((z - z.min()) / (np.ptp(z) + 1e-9) * levels)
    return z.astype(np.float32)


# --- Files -------------------------------------------------------------------------------------------------------

def ascii_dem(folder: Path, size: int) -> Path:
    """A synthetic size x size DEM with 10 % nodata (seed 11) exported as Esri ASCII, 2 decimals:
    ``folder/dem.asc`` (its store ``folder/synth.zarr``, tile 64, shard 2, stays beside it)."""
    from terrain_io.export import export
    from terrain_io.synth import synthesize

    synth = synthesize(folder / "synth.zarr", size, seed=11, nodata_fraction=0.1, tile=64, shard=2)
    return export(synth.path, "elevation", folder / "dem.asc", decimals=2)


def tree_digest(path: Path) -> str | None:
    """A digest of every file's name and bytes under ``path`` (None when there is no such folder)."""
    if not path.exists():
        return None
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def make_read_only(folder: Path) -> None:
    """chmod for ordinary users; root ignores permissions, so make the folder immutable instead."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
    elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root and chattr +i is not available: cannot make a read-only folder")


def make_writable(folder: Path) -> None:
    """Undo :func:`make_read_only`."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    os.chmod(folder, 0o755)


# --- Zarr blocks -------------------------------------------------------------------------------------------------

def blocks_written(tmp_path, compressors):
    """Blocks of a 4-D array written by write_block over whole and partial chunks; (array, the same
    cells written into a numpy copy, the chunk shape), zarr's reading checked against the copy."""
    rng = np.random.default_rng(0)
    shape, chunks = (11, 7, 3, 3), (4, 4, 3, 3)
    arr = zarr.create_array(tmp_path / "a.zarr", shape=shape, chunks=chunks, dtype="float32", fill_value=np.inf,
                            compressors=compressors)
    want = np.full(shape, np.inf, np.float32)
    for start, size in [((0, 0), (8, 4)), ((8, 4), (3, 3)), ((8, 0), (3, 4)), ((1, 5), (2, 1)), ((0, 4), (4, 3))]:
        block = rng.random(size + (3, 3)).astype(np.float32)
        write_block(arr, start + (0, 0), block)
        want[start[0] : start[0] + size[0], start[1] : start[1] + size[1]] = block
    np.testing.assert_array_equal(arr[:], want)
    return arr, want, chunks


# Flow routing (terrain flow): D8 steepest descent and Barnes, Lehman & Mulla 2014's flats written
# from the definitions, a topological-order accumulation, and the DEMs the flow tests share.

FLAT = -1  # reference: no lower neighbour, not an outlet


def neighbours(r, c, shape):
    for d in range(8):
        rr, cc = r + DR[d], c + DC[d]
        if 0 <= rr < shape[0] and 0 <= cc < shape[1]:
            yield d, rr, cc


def outlet_cells(valid, outlets):
    """Valid cells on the edge, or (edge+nodata) 8-adjacent to a nodata cell."""
    rows, cols = valid.shape
    out = np.zeros(valid.shape, bool)
    for r in range(rows):
        for c in range(cols):
            if not valid[r, c]:
                continue
            edge = r in (0, rows - 1) or c in (0, cols - 1)
            out[r, c] = edge or (outlets == "edge+nodata" and any(not valid[rr, cc] for _, rr, cc in
                                                                   neighbours(r, c, valid.shape)))
    return out


def steepest_descent(z, valid, dx, dy, outlets):
    """Reference D8: (codes with FLAT for unresolved cells, mask of cells whose steepest slope ties)."""
    step = [dx, math.hypot(dx, dy), dy, math.hypot(dx, dy)] * 2
    out = outlet_cells(valid, outlets)
    code = np.full(z.shape, NODATA, np.int64)
    tie = np.zeros(z.shape, bool)
    for r in range(z.shape[0]):
        for c in range(z.shape[1]):
            if not valid[r, c]:
                continue
            slopes = [((float(z[r, c]) - float(z[rr, cc])) / step[d], d) for d, rr, cc in neighbours(r, c, z.shape)
                      if valid[rr, cc] and z[rr, cc] < z[r, c]]
            if slopes:
                top = max(s for s, _ in slopes)
                winners = [d for s, d in slopes if s == top]
                code[r, c] = min(winners)
                tie[r, c] = len(winners) > 1
            else:
                code[r, c] = OUTLET if out[r, c] else FLAT
    return code, tie


def barnes_flats(z, valid, code):
    """Barnes, Lehman & Mulla 2014 as the paper gives it: low edges are the cells WITH a direction
    beside a flat cell of equal elevation, high edges flat cells beside higher ground; flats labelled
    by a flood from the low edges; BuildAwayGradient (BFS from the high edges, FlatHeight per label);
    BuildTowardsCombinedGradient (BFS from the low edges, mask = 2 * loops + FlatHeight - away); each
    flat cell drains to the neighbour of its label with the least mask (ties: least code here)."""
    shape = z.shape
    code = code.copy()
    flat = lambda r, c: valid[r, c] and code[r, c] == FLAT
    low, high = [], []
    for r in range(shape[0]):
        for c in range(shape[1]):
            if not valid[r, c]:
                continue
            for _, rr, cc in neighbours(r, c, shape):
                if not valid[rr, cc]:
                    continue
                if code[r, c] != FLAT and flat(rr, cc) and z[rr, cc] == z[r, c]:
                    low.append((r, c))
                    break
            if flat(r, c) and any(valid[rr, cc] and z[rr, cc] > z[r, c] for _, rr, cc in neighbours(r, c, shape)):
                high.append((r, c))
    labels = np.zeros(shape, np.int64)
    n_labels = 0
    for r, c in low:  # label each flat (with its low edges) by a flood over equal elevation
        if labels[r, c]:
            continue
        n_labels += 1
        labels[r, c] = n_labels
        todo = [(r, c)]
        while todo:
            a, b = todo.pop()
            for _, rr, cc in neighbours(a, b, shape):
                if valid[rr, cc] and not labels[rr, cc] and z[rr, cc] == z[a, b]:
                    labels[rr, cc] = n_labels
                    todo.append((rr, cc))
    high = [(r, c) for r, c in high if labels[r, c]]  # flats without a low edge cannot drain
    away = np.zeros(shape, np.int64)
    flat_height = np.zeros(n_labels + 1, np.int64)
    queue, loops = deque(high), 1
    for r, c in high:
        away[r, c] = -1  # queued
    while queue:  # BuildAwayGradient: one BFS level per loop
        for _ in range(len(queue)):
            r, c = queue.popleft()
            away[r, c] = loops
            flat_height[labels[r, c]] = loops
            for _, rr, cc in neighbours(r, c, shape):
                if flat(rr, cc) and labels[rr, cc] == labels[r, c] and away[rr, cc] == 0:
                    away[rr, cc] = -1
                    queue.append((rr, cc))
        loops += 1
    mask = np.zeros(shape, np.int64)
    seen = np.zeros(shape, bool)
    queue, loops = deque(low), 1
    for r, c in low:
        seen[r, c] = True
    while queue:  # BuildTowardsCombinedGradient
        for _ in range(len(queue)):
            r, c = queue.popleft()
            mask[r, c] = 2 * loops + (flat_height[labels[r, c]] - away[r, c] if away[r, c] > 0 else 0)
            for _, rr, cc in neighbours(r, c, shape):
                if flat(rr, cc) and labels[rr, cc] == labels[r, c] and not seen[rr, cc]:
                    seen[rr, cc] = True
                    queue.append((rr, cc))
        loops += 1
    for r in range(shape[0]):
        for c in range(shape[1]):
            if not flat(r, c):
                continue
            if not labels[r, c]:
                code[r, c] = SINK
                continue
            cands = [(mask[rr, cc], d) for d, rr, cc in neighbours(r, c, shape)
                     if valid[rr, cc] and labels[rr, cc] == labels[r, c] and (code[rr, cc] != FLAT or seen[rr, cc])]
            code[r, c] = min(cands)[1]
    return code


def topological_sum(code, weights=None):
    """Kahn's algorithm over the cell graph of ``code``: every cell adds its total to its receiver
    (exact for integer or Fraction ``weights`` of dtype object)."""
    rows, cols = code.shape
    w = np.where(code != NODATA, 1, 0).astype(object) if weights is None else np.where(code != NODATA, weights, 0)
    total = w.copy().ravel()
    down = np.full(rows * cols, -1)
    indeg = np.zeros(rows * cols, np.int64)
    for r in range(rows):
        for c in range(cols):
            d = int(code[r, c])
            if d < 8:
                down[r * cols + c] = (r + DR[d]) * cols + c + DC[d]
                indeg[down[r * cols + c]] += 1
    order = np.nonzero(indeg == 0)[0].tolist()
    for i in order:  # the list grows by the receivers whose donors are all done (a FIFO queue)
        j = down[i]
        if j >= 0:
            total[j] += total[i]
            indeg[j] -= 1
            if indeg[j] == 0:
                order.append(j)
    assert len(order) == rows * cols, "cycle"
    return total.reshape(rows, cols)


def drains_to_an_end(code):
    """Every valid cell's path ends at OUTLET or SINK within as many steps as there are cells."""
    rows, cols = code.shape
    for r0 in range(rows):
        for c0 in range(cols):
            r, c, steps = r0, c0, 0
            while code[r, c] < 8:
                r, c = r + DR[code[r, c]], c + DC[code[r, c]]
                steps += 1
                assert steps <= rows * cols and code[r, c] != NODATA
    return True


def terraced_flats(shape=(40, 50), seed=1):
    rng = np.random.default_rng(seed)
    r, c = np.mgrid[: shape[0], : shape[1]]
    surface = 0.15 * r + 0.1 * c + 2 * np.sin(c / 7.0) + rng.random(shape) * 0.3
    return np.round(surface / 1.5) * 1.5  # wide terraces: flats of every shape


def flat_bottomed(shape=(36, 44)):
    r, c = np.mgrid[: shape[0], : shape[1]]
    bowl = np.hypot(r - shape[0] / 2, c - shape[1] / 2)
    z = np.maximum(bowl, 6.0)  # a flat floor of radius 6 in a bowl: one pit flat
    z[0, 5] = 1.0  # ... drained after filling through one low edge cell
    return z


def holed(seed=3):
    z = terraced_flats((32, 32), seed)
    valid = np.ones(z.shape, bool)
    valid[10:14, 8:20] = False
    valid[20, 20] = False
    valid[25:29, 3:6] = False
    return np.where(valid, z, np.nan), valid


def jacksboro():
    _, values = parse_esri_ascii(ROOT / "sample_data" / "jacksboro_fault_dem.asc")
    return values


def cases():
    t = terraced_flats()
    yield "terraced", t, np.ones(t.shape, bool)
    f = flat_bottomed()
    yield "flat-bottomed filled", priority_flood(f, np.ones(f.shape, bool)), np.ones(f.shape, bool)
    yield "flat-bottomed unfilled", f, np.ones(f.shape, bool)
    h, v = holed()
    yield "nodata holes", h, v
    yield "nodata holes filled", np.where(v, priority_flood(np.nan_to_num(h), v), np.nan), v


def reference_directions(z, valid, dx, dy, outlets):
    code, tie = steepest_descent(z, valid, dx, dy, outlets)
    return barnes_flats(z, valid, code), code, tie


# Hydrology (watersheds, streams, HAND) written from the definitions on a direction raster.

def hydro_dem(seed, shape=(37, 53), holes=True, step=None):
    """A rough surface sloping to the south-east with bumps, pits, optional flats (values rounded
    to ``step``) and nodata holes."""
    rng = np.random.default_rng(seed)
    r, c = np.mgrid[: shape[0], : shape[1]]
    z = 0.3 * (shape[0] - r) + 0.2 * (shape[1] - c) + 3 * rng.random(shape)
    z += 4 * np.sin(r / 5.0) * np.cos(c / 7.0)
    if step:
        z = np.round(z / step) * step
    if holes:
        z[rng.random(shape) < 0.02] = np.nan
        z[10:13, 20:24] = np.nan
    return z


def downstream(d):
    """{cell: downstream cell or None} over valid cells, straight from the code definition."""
    h, w = d.shape
    out = {}
    for r in range(h):
        for c in range(w):
            if d[r, c] == NODATA:
                continue
            k = int(d[r, c])
            t = None
            if k < 8:
                rr, cc = r + DR[k], c + DC[k]
                if 0 <= rr < h and 0 <= cc < w and d[rr, cc] != NODATA:
                    t = (rr, cc)
            out[(r, c)] = t
    return out


def upstream(ds):
    up = {cell: [] for cell in ds}
    for cell, t in ds.items():
        if t is not None:
            up[t].append(cell)
    return up


def reference_labels(d, outlets):
    """Breadth-first search up the reverse flow graph from each outlet, stopping at other outlets."""
    up = upstream(downstream(d))
    label = np.zeros(d.shape, np.int64)
    seeds = set(outlets)
    for i, o in enumerate(outlets, 1):
        label[o] = i
        queue = deque([o])
        while queue:
            cell = queue.popleft()
            for u in up[cell]:
                if u not in seeds:
                    label[u] = i
                    queue.append(u)
    return label


def reference_network(d, acc, threshold):
    """Recursive Strahler and Shreve over the stream cells' stream donors, links walked from heads."""
    ds = downstream(d)
    stream = {cell for cell in ds if acc[cell] >= threshold}
    up = {cell: [u for u in upstream(ds)[cell] if u in stream] for cell in stream}
    strahler, shreve = {}, {}

    def order(cell):
        if cell not in strahler:
            kids = [order(u) for u in up[cell]]
            top = max(kids, default=0)
            strahler[cell] = 1 if not kids else top + (kids.count(top) >= 2)
            shreve[cell] = 1 if not kids else sum(shreve[u] for u in up[cell])
        return strahler[cell]

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * d.size))
    try:
        for cell in stream:
            order(cell)
    finally:
        sys.setrecursionlimit(limit)
    heads = sorted(cell for cell in stream if len(up[cell]) != 1)  # row-major
    link = np.zeros(d.shape, np.int64)
    for i, cell in enumerate(heads, 1):
        while True:
            link[cell] = i
            cell = ds[cell]
            if cell is None or cell not in stream or len(up[cell]) != 1:
                break
    return stream, strahler, shreve, link, heads, ds


def reference_hand(z, d, stream):
    """Walk down each cell's flow path to its first stream cell."""
    ds = downstream(d)
    height = np.full(d.shape, np.nan)
    first = {}
    for cell in ds:
        c = cell
        while c is not None and c not in stream:
            c = ds[c]
        if c is not None:
            height[cell] = float(z[cell]) - float(z[c])
            first[cell] = c
    return height, first


# --- Overviews: a level from the level below, by each reduction's definition (numpy, scipy.stats.mode) ---
def _overview_blocks(a):
    """(h2, w2, 4) of the 2 x 2 blocks in row-major order, the missing cells of odd edges as NaN."""
    h, w = a.shape
    p = np.full((h + h % 2, w + w % 2), np.nan)
    p[:h, :w] = a
    return p.reshape(p.shape[0] // 2, 2, p.shape[1] // 2, 2).transpose(0, 2, 1, 3).reshape(p.shape[0] // 2,
                                                                                         p.shape[1] // 2, 4)


def overview_mean(a):
    """The mean of the valid cells of each block, summed in float64 in row-major order, cast back."""
    b = _overview_blocks(a.astype(np.float64))
    total, n = np.zeros(b.shape[:2]), np.zeros(b.shape[:2])
    for q in range(4):
        ok = ~np.isnan(b[..., q])
        total = total + np.where(ok, b[..., q], 0.0)
        n += ok
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / n, np.nan).astype(a.dtype)


def overview_max(a):
    """The largest valid cell of each block (NaN: none valid)."""
    b = _overview_blocks(a.astype(np.float64))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "All-NaN slice": NaN is the answer there
        return np.nanmax(b, axis=-1).astype(a.dtype)


def overview_mode(a, missing):
    """scipy.stats.mode of the valid cells of each block (ties: the smallest); ``missing`` where none."""
    b = _overview_blocks(np.where(a == missing, np.nan, a.astype(np.float64)))
    empty = np.isnan(b).all(axis=-1)
    b[empty] = missing  # scipy needs one value; replaced below
    m = scipy.stats.mode(b, axis=-1, nan_policy="omit", keepdims=False).mode
    return np.where(empty, missing, m).astype(a.dtype)


# --- Cloud-Optimized GeoTIFF: GDAL's layout rules, checked on the file's bytes ---
def _tiff_ifds(path):
    """Every IFD of a (Big)TIFF by the format's definition: [(ifd offset, {tag: values})], in file order
    of the IFD chain (TIFF 6.0; BigTIFF: 8-byte offsets and counts)."""
    import struct

    data = Path(path).read_bytes()
    assert data[:2] == b"II"
    big = struct.unpack_from("<H", data, 2)[0] == 43
    sizes = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 7: 1, 11: 4, 12: 8, 16: 8, 17: 8}
    fmts = {1: "B", 2: "B", 3: "H", 4: "I", 7: "B", 11: "f", 12: "d", 16: "Q", 17: "q"}
    off = struct.unpack_from("<Q" if big else "<I", data, 8 if big else 4)[0]
    ifds = []
    while off:
        n = struct.unpack_from("<Q" if big else "<H", data, off)[0]
        tags, p = {}, off + (8 if big else 2)
        for _ in range(n):
            tag, typ = struct.unpack_from("<HH", data, p)
            count = struct.unpack_from("<Q" if big else "<I", data, p + 4)[0]
            inline = 8 if big else 4
            where = p + (12 if big else 8)
            if sizes[typ] * count > inline:
                where = struct.unpack_from("<Q" if big else "<I", data, where)[0]
            if typ in fmts:
                tags[tag] = struct.unpack_from(f"<{count}{fmts[typ]}", data, where)
            p += 20 if big else 12
        ifds.append((off, tags))
        off = struct.unpack_from("<Q" if big else "<I", data, p)[0]
    return data, ifds


def check_cog_layout(path):
    """GDAL's COG layout rules (validate_cloud_optimized_geotiff.py), checked on the file's bytes: tiled
    main image, overviews present (reduced-resolution subfiles, each smaller), every IFD before any
    tile data, tile data of the smallest overview first and the full resolution last, and GDAL's
    structural metadata saying so."""
    data, ifds = _tiff_ifds(path)
    assert b"LAYOUT=IFDS_BEFORE_DATA" in data[:400] and b"KNOWN_INCOMPATIBLE_EDITION=NO" in data[:400]
    images = [(off, t) for off, t in ifds if not (t.get(254, (0,))[0] & 4)]  # not masks
    main, overviews = images[0], images[1:]
    assert 322 in main[1] and 324 in main[1], "the main image is not tiled"
    assert overviews, "no overviews"
    widths = [t[256][0] for _, t in images]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == len(widths)
    assert all(t[254][0] & 1 for _, t in overviews)  # reduced-resolution images
    first_data = min(min(o for o in t[324] if o) for _, t in images)
    assert max(off for off, _ in ifds) < first_data, "an IFD after tile data"
    starts = [min(o for o in t[324] if o) for _, t in images]
    assert starts == sorted(starts, reverse=True), "tile data not ordered smallest overview first"
    return len(overviews)
