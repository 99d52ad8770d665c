"""Flow directions, flats and accumulation (terrain_io.grid.flow) against references written here:
a plain-Python D8 steepest descent, Barnes, Lehman & Mulla 2014's flat resolution written from the
paper (flat labels, its two breadth-first searches and its combined gradient), a topological-order
sum (Kahn), and pyflwdir where it is installed."""
from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np
import pytest

from terrain_io.grid.flow import _cpu
from terrain_io.grid.flow.codes import NODATA, OUTLET, SINK

from references import ROOT, parse_esri_ascii

DR = (0, 1, 1, 1, 0, -1, -1, -1)  # E, SE, S, SW, W, NW, N, NE: row grows southward
DC = (1, 1, 0, -1, -1, -1, 0, 1)
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
    """Kahn's algorithm over the cell graph of ``code``: every cell adds its total to its receiver."""
    rows, cols = code.shape
    w = np.where(code != NODATA, 1, 0).astype(object) if weights is None else np.where(code != NODATA, weights, 0.0)
    total = w.copy().ravel()
    down = np.full(rows * cols, -1)
    indeg = np.zeros(rows * cols, np.int64)
    for r in range(rows):
        for c in range(cols):
            d = int(code[r, c])
            if d < 8:
                down[r * cols + c] = (r + DR[d]) * cols + c + DC[d]
                indeg[down[r * cols + c]] += 1
    queue = deque(np.nonzero(indeg == 0)[0].tolist())
    seen = 0
    while queue:
        i = queue.popleft()
        seen += 1
        j = down[i]
        if j >= 0:
            total[j] += total[i]
            indeg[j] -= 1
            if indeg[j] == 0:
                queue.append(j)
    assert seen == rows * cols, "cycle"
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


def priority_flood(z, valid):
    """Filled DEM (Priority-Flood without epsilon) from the edge and the cells next to nodata."""
    out = z.astype(np.float64).copy()
    done = ~valid
    heap = []
    edge = outlet_cells(valid, "edge+nodata")
    for r, c in zip(*np.nonzero(edge)):
        heapq.heappush(heap, (out[r, c], r, c))
        done[r, c] = True
    while heap:
        h, r, c = heapq.heappop(heap)
        for _, rr, cc in neighbours(r, c, z.shape):
            if not done[rr, cc]:
                done[rr, cc] = True
                out[rr, cc] = max(out[rr, cc], h)
                heapq.heappush(heap, (out[rr, cc], rr, cc))
    return out


def terraced(shape=(40, 50), seed=1):
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
    z = terraced((32, 32), seed)
    valid = np.ones(z.shape, bool)
    valid[10:14, 8:20] = False
    valid[20, 20] = False
    valid[25:29, 3:6] = False
    return np.where(valid, z, np.nan), valid


def jacksboro():
    _, values = parse_esri_ascii(ROOT / "sample_data" / "jacksboro_fault_dem.asc")
    return values


def cases():
    t = terraced()
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


@pytest.mark.parametrize("outlets", ["edge+nodata", "edge"])
@pytest.mark.parametrize("dx, dy", [(1.0, 1.0), (30.0, 20.0)])
def test_directions_equal_steepest_descent_and_barnes(outlets, dx, dy):
    for name, z, valid in cases():
        expected, _, _ = reference_directions(z, valid, dx, dy, outlets)
        got = _cpu.directions(z, valid, dx, dy, outlets)
        assert got.dtype == np.uint8
        assert np.array_equal(got, expected), name
        assert drains_to_an_end(got), name


def test_cases_have_flats_sinks_and_outlets():
    """The DEMs above exercise every code: flats, walled flats (SINK), outlets, nodata."""
    seen = set()
    for name, z, valid in cases():
        for outlets in ("edge+nodata", "edge"):
            d8, _ = steepest_descent(z, valid, 1.0, 1.0, outlets)
            got = _cpu.directions(z, valid, 1.0, 1.0, outlets)
            seen |= set(np.unique(got).tolist())
            assert (d8 == FLAT).any(), name
    assert seen == set(range(8)) | {OUTLET, SINK, NODATA}


def test_integer_dem_and_pits_without_condition():
    """An integer DEM with pits: every pit is a one-cell flat without a low edge, SINK."""
    rng = np.random.default_rng(5)
    z = rng.integers(0, 6, (25, 30)).astype(np.int16)
    valid = np.ones(z.shape, bool)
    expected, _, _ = reference_directions(z, valid, 1.0, 1.0, "edge+nodata")
    got = _cpu.directions(z, valid, 1.0, 1.0)
    assert np.array_equal(got, expected)
    assert (got == SINK).any()


def test_real_dem_directions():
    z = jacksboro()
    valid = ~np.isnan(z)
    filled = priority_flood(np.nan_to_num(z), valid)
    expected, d8, _ = reference_directions(filled, valid, 30.0, 25.0, "edge+nodata")
    assert (d8 == FLAT).sum() > 1000  # the filled lakes are flats
    got = _cpu.directions(filled, valid, 30.0, 25.0)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("include_self", [True, False])
def test_accumulation_equals_topological_sum(weighted, include_self):
    rng = np.random.default_rng(7)
    for name, z, valid in cases():
        code = _cpu.directions(z, valid, 1.0, 1.0)
        w = rng.random(z.shape) * 3 if weighted else None
        expected = topological_sum(code, w)
        if not include_self:
            expected = expected - np.where(code != NODATA, w if weighted else 1, 0)
        got = _cpu.accumulation(code, w, include_self=include_self)
        if weighted:
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, expected.astype(np.float64), rtol=1e-12, atol=1e-12, err_msg=name)
        else:
            assert got.dtype == np.uint64
            assert np.array_equal(got, expected.astype(np.uint64)), name
        assert np.all(got[code == NODATA] == 0)


def test_accumulation_of_the_real_dem_counts_every_cell_once():
    z = jacksboro()
    valid = ~np.isnan(z)
    code = _cpu.directions(priority_flood(np.nan_to_num(z), valid), valid, 30.0, 25.0)
    acc = _cpu.accumulation(code)
    assert np.array_equal(acc, topological_sum(code).astype(np.uint64))
    ends = (code == OUTLET) | (code == SINK)
    assert int(acc[ends].sum()) == int(valid.sum())  # each valid cell reaches exactly one end


def test_accumulation_rejects_cycles():
    code = np.array([[0, 3], [6, NODATA]], np.uint8)  # E, then SW, then N: a cycle of three
    with pytest.raises(ValueError, match="cycle"):
        _cpu.accumulation(code)


# --- pyflwdir (d8: 1 = E, 2 = SE, 4 = S, ... 128 = NE, i.e. 1 << our code; 0 pit, 247 nodata) ---

def to_pyflwdir(code):
    out = np.where(code < 8, np.left_shift(1, np.minimum(code, 7).astype(np.int64)), 0).astype(np.uint8)
    out[code == NODATA] = 247
    return out


def test_directions_equal_pyflwdir_where_no_tie():
    """pyflwdir's ``from_dem`` routes a filled DEM along its Priority-Flood: each cell to its lowest
    neighbour (the largest drop, not slope). Where the steepest slope has no tie, no flat is involved
    and the largest drop is the same single neighbour, both must agree."""
    pyflwdir = pytest.importorskip("pyflwdir")
    z = jacksboro()
    valid = ~np.isnan(z)
    filled = priority_flood(np.nan_to_num(z), valid)
    ref = pyflwdir.from_dem(np.where(valid, filled, -9999.0), nodata=-9999.0, outlets="edge")
    theirs = ref.to_array(ftype="d8")
    code, tie = steepest_descent(filled, valid, 1.0, 1.0, "edge+nodata")
    ours = _cpu.directions(filled, valid, 1.0, 1.0)
    comparable = np.zeros(z.shape, bool)
    rows, cols = z.shape
    for r in range(1, rows - 1):
        for c in range(1, cols - 1):
            if not valid[r, c] or code[r, c] >= 8 or tie[r, c]:
                continue
            drops = [(filled[r, c] - filled[rr, cc], d) for d, rr, cc in neighbours(r, c, z.shape) if valid[rr, cc]]
            top = max(drops)[0]
            winners = [d for dz, d in drops if dz == top]
            comparable[r, c] = len(winners) == 1 and winners[0] == code[r, c]
    assert comparable.sum() > 0.5 * valid.sum()
    assert np.array_equal(to_pyflwdir(ours)[comparable], theirs[comparable])


def test_accumulation_equals_pyflwdir():
    pyflwdir = pytest.importorskip("pyflwdir")
    rng = np.random.default_rng(11)
    for name, z, valid in [*cases(), ("jacksboro", jacksboro(), ~np.isnan(jacksboro()))]:
        if name == "jacksboro":
            z = priority_flood(np.nan_to_num(z), valid)
        code = _cpu.directions(z, valid, 1.0, 1.0)
        flw = pyflwdir.from_array(to_pyflwdir(code), ftype="d8")
        counts = flw.upstream_area(unit="cell")
        assert np.array_equal(_cpu.accumulation(code)[valid], counts[valid].astype(np.uint64)), name
        w = rng.random(z.shape)
        np.testing.assert_allclose(_cpu.accumulation(code, w)[valid], flw.accuflux(w)[valid], rtol=1e-12)


# --- the array API (terrain_io.flow_direction / flow_accumulation) ---

def test_array_api_numpy_and_xarray():
    import terrain_io
    from terrain_io.errors import InputError

    xr = pytest.importorskip("xarray")
    z, valid = holed()
    da = xr.DataArray(z, dims=("y", "x"), coords={"y": 1000.0 - 20.0 * np.arange(z.shape[0]),
                                                  "x": 500.0 + 30.0 * np.arange(z.shape[1])}, attrs={"units": "m"})
    expected, _, _ = reference_directions(z, valid, 30.0, 20.0, "edge+nodata")
    code = terrain_io.flow_direction(da)  # cell size from the coordinates
    assert isinstance(code, xr.DataArray) and code.attrs["units"] == "m"
    assert np.array_equal(code.x, da.x) and np.array_equal(code.y, da.y)
    assert np.array_equal(code.values, expected)
    acc = terrain_io.flow_accumulation(code)
    assert isinstance(acc, xr.DataArray) and np.array_equal(acc.y, da.y)
    assert np.array_equal(acc.values, topological_sum(expected).astype(np.uint64))
    assert np.array_equal(terrain_io.flow_direction(z, cell_size=(30.0, 20.0)), expected)
    w = np.where(valid, 2.0, np.nan)
    np.testing.assert_allclose(terrain_io.flow_accumulation(expected, w, include_self=False),
                               2.0 * (topological_sum(expected) - valid).astype(np.float64))
    for bad in (np.ones((3, 3)), np.where(valid, -1.0, 0.0), np.where(valid, np.nan, 1.0)):
        with pytest.raises(InputError):
            terrain_io.flow_accumulation(expected, bad)
    with pytest.raises(InputError, match="no data"):
        terrain_io.flow_direction(np.full((4, 4), np.nan))
    with pytest.raises(InputError):
        terrain_io.flow_accumulation(np.full((2, 2), 17, np.uint8))


@pytest.mark.slow  # compiles the fill kernels' held path (tens of seconds cold); test_flow_store covers fill too
def test_array_api_condition_fill():
    import terrain_io

    f = flat_bottomed()
    valid = np.ones(f.shape, bool)
    expected, _, _ = reference_directions(priority_flood(f, valid), valid, 1.0, 1.0, "edge+nodata")
    assert np.array_equal(terrain_io.flow_direction(f, condition="fill"), expected)
    zi = np.round(f * 10).astype(np.int32)  # integers: the temporary store's nodata is a free value
    expected, _, _ = reference_directions(priority_flood(zi, valid), valid, 1.0, 1.0, "edge+nodata")
    assert np.array_equal(terrain_io.flow_direction(zi, condition="fill"), expected)
