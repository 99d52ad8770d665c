"""The in-core GPU flow routing (CuPy, terrain_io/kernels/flow.cu) against references written here
from the definitions: steepest descent (NumPy), Barnes, Lehman & Mulla 2014's two breadth-first
searches per flat with its combined gradient 2 * towards + (FlatHeight - away) (plain Python), and
a topological-order sum (Kahn) for the accumulation; on terraced, flat-bottomed and nodata-holed
DEMs, a lake larger than a GPU tile, snake-shaped flow paths and a real DEM. Run on a GPU machine
with ``pytest -m gpu``."""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from references import ROOT, parse_esri_ascii
from references import fill_test_dem as _dem, priority_flood

from terrain_io.errors import InputError

pytestmark = pytest.mark.gpu

DR = (0, 1, 1, 1, 0, -1, -1, -1)  # E, SE, S, SW, W, NW, N, NE (the contract)
DC = (1, 1, 0, -1, -1, -1, 0, 1)
OUTLET, SINK, NODATA, FLAT = 8, 9, 255, 254


def d8_reference(z, valid, dx, dy, nodata_drains):
    """Codes 0..7 / OUTLET / NODATA, FLAT where no lower valid neighbour and not an outlet."""
    h, w = z.shape
    diag = math.hypot(dx, dy)
    L = (dx, diag, dy, diag, dx, diag, dy, diag)
    zp = np.pad(z.astype(np.float64), 1)
    vp = np.pad(valid, 1)
    slopes = np.full((8, h, w), -np.inf)
    outlet = np.zeros((h, w), bool)
    outlet[0, :] = outlet[-1, :] = outlet[:, 0] = outlet[:, -1] = True
    inside = np.pad(np.ones((h, w), bool), 1)
    for d in range(8):
        zn = zp[1 + DR[d]:1 + DR[d] + h, 1 + DC[d]:1 + DC[d] + w]
        vn = vp[1 + DR[d]:1 + DR[d] + h, 1 + DC[d]:1 + DC[d] + w]
        if nodata_drains:
            outlet |= inside[1 + DR[d]:1 + DR[d] + h, 1 + DC[d]:1 + DC[d] + w] & ~vn
        lower = valid & vn & (zn < zp[1:-1, 1:-1])
        with np.errstate(invalid="ignore"):
            slopes[d] = np.where(lower, (zp[1:-1, 1:-1] - zn) / L[d], -np.inf)
    best = np.argmax(slopes, axis=0)  # the first maximum: ties go to the smallest code
    has = slopes.max(axis=0) > -np.inf
    code = np.where(has, best, np.where(outlet, OUTLET, FLAT)).astype(np.uint8)
    code[~valid] = NODATA
    return code


def neighbours(i, j, h, w):
    for d in range(8):
        a, b = i + DR[d], j + DC[d]
        if 0 <= a < h and 0 <= b < w:
            yield d, a, b


def bfs(sources, members, h, w):
    dist = {c: 1 for c in sources}
    queue = collections.deque(sources)
    while queue:
        i, j = queue.popleft()
        for _, a, b in neighbours(i, j, h, w):
            if (a, b) in members and (a, b) not in dist:
                dist[a, b] = dist[i, j] + 1
                queue.append((a, b))
    return dist


def barnes_reference(z, valid, code):
    """Barnes et al. 2014 flat by flat: label the flats (8-connected FLAT cells), BFS away from the
    high edges and towards the low edges inside each, combined gradient 2 * towards + (FlatHeight -
    away); each cell drains to its equal neighbour of least gradient (resolved ones first, ties:
    least code); a flat without a low edge is SINK."""
    code = code.copy()
    h, w = z.shape
    seen = np.zeros((h, w), bool)
    for i0, j0 in zip(*np.nonzero(code == FLAT)):
        if seen[i0, j0]:
            continue
        flat = {(int(i0), int(j0))}
        stack = [(int(i0), int(j0))]
        seen[i0, j0] = True
        while stack:
            i, j = stack.pop()
            for _, a, b in neighbours(i, j, h, w):
                if code[a, b] == FLAT and not seen[a, b]:
                    seen[a, b] = True
                    flat.add((a, b))
                    stack.append((a, b))
        high = [c for c in flat if any(valid[a, b] and z[a, b] > z[c] for _, a, b in neighbours(*c, h, w))]
        low = [c for c in flat if any(valid[a, b] and z[a, b] == z[c] and code[a, b] != FLAT
                                      for _, a, b in neighbours(*c, h, w))]
        if not low:
            for c in flat:
                code[c] = SINK
            continue
        away, towards = bfs(high, flat, h, w), bfs(low, flat, h, w)
        flat_height = max(away.values(), default=0)
        grad = {c: 2 * towards[c] + (flat_height - away.get(c, 0)) for c in flat}
        new = {}
        for c in flat:
            best, least = -1, grad[c]
            for d, a, b in neighbours(*c, h, w):
                if not (valid[a, b] and z[a, b] == z[c]):
                    continue
                if (a, b) not in flat:
                    best = d
                    break
                if grad[a, b] < least:
                    best, least = d, grad[a, b]
            assert best >= 0
            new[c] = best
        for c, d in new.items():
            code[c] = d
    return code


def directions_reference(z, valid, dx=1.0, dy=1.0, outlets="edge+nodata"):
    return barnes_reference(z, valid, d8_reference(z, valid, dx, dy, outlets == "edge+nodata"))


def accumulation_reference(code, weights=None, include_self=True):
    """Sums over each cell's upstream cells in a topological order (Kahn's algorithm): counts as
    Python ints, weights in float64; every valid cell drains to an outlet or sink (no cycle)."""
    h, w = code.shape
    valid = code != NODATA
    target = -np.ones(h * w, np.int64)
    for d in range(8):
        rr, cc = np.nonzero(code == d)
        target[rr * w + cc] = (rr + DR[d]) * w + cc + DC[d]
    indeg = np.bincount(target[target >= 0], minlength=h * w)
    own = np.ones(h * w, np.int64) if weights is None else weights.reshape(-1).astype(np.float64)
    own = np.where(valid.reshape(-1), own, 0)
    acc = own.copy()
    queue = collections.deque(np.flatnonzero((indeg == 0) & valid.reshape(-1)).tolist())
    done = 0
    tgt, acc_l, deg = target.tolist(), acc.tolist(), indeg.tolist()
    while queue:
        c = queue.popleft()
        done += 1
        t = tgt[c]
        if t >= 0:
            acc_l[t] += acc_l[c]
            deg[t] -= 1
            if deg[t] == 0:
                queue.append(t)
    assert done == int(valid.sum()), "a cycle in the directions"
    acc = np.array(acc_l, dtype=np.uint64 if weights is None else np.float64)
    if not include_self:
        acc = acc - own.astype(acc.dtype)
    return acc.reshape(h, w)


def gpu_directions(z, valid, dx=1.0, dy=1.0, outlets="edge+nodata"):
    import cupy as cp

    from terrain_io.grid.flow._gpu import directions

    got = directions(cp.asarray(z), cp.asarray(valid), dx, dy, outlets)
    assert got.dtype == cp.uint8 and got.shape == z.shape
    return got.get()


def gpu_accumulation(code, weights=None, include_self=True):
    import cupy as cp

    from terrain_io.grid.flow._gpu import accumulation

    got = accumulation(cp.asarray(code), None if weights is None else cp.asarray(weights), include_self)
    return got.get()


def check_flow(z, valid, dx=1.0, dy=1.0, outlets="edge+nodata", weights=True):
    """GPU directions == reference codes; GPU counts == the topological sum (bytes); weights close."""
    want = directions_reference(z, valid, dx, dy, outlets)
    got = gpu_directions(z, valid, dx, dy, outlets)
    assert (got == want).all(), f"{int((got != want).sum())} codes differ"
    acc = gpu_accumulation(got)
    assert acc.dtype == np.uint64 and acc.tobytes() == accumulation_reference(want).tobytes()
    assert gpu_accumulation(got, include_self=False).tobytes() == accumulation_reference(want, None, False).tobytes()
    if weights:
        wt = np.random.default_rng(7).random(z.shape) * 3
        ref = accumulation_reference(want, wt)
        for self_ in (True, False):
            g = gpu_accumulation(got, wt, self_)
            r = ref if self_ else ref - np.where(valid, wt, 0)
            assert g.dtype == np.float64
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-9)
    return got, acc


def filled(z, valid, outlets="edge+nodata"):
    return np.where(valid, priority_flood(z, valid, outlets == "edge+nodata"), np.nan).astype(z.dtype)


@pytest.mark.parametrize("kind", ["random", "terraced", "flat-bottomed", "nodata-holed"])
@pytest.mark.parametrize("outlets", ["edge+nodata", "edge"])
@pytest.mark.parametrize("condition", ["fill", "none"])
@pytest.mark.parametrize("shape", [(53, 71), (150, 131)])
def test_synthetic_dems(kind, outlets, condition, shape):
    z = _dem(kind, *shape, seed=len(kind) + shape[0])
    valid = ~np.isnan(z)
    if condition == "fill":
        z = filled(z, valid, outlets)
    check_flow(z, valid, outlets=outlets, weights=kind != "random")


def test_cell_size_and_integer_dem():
    rng = np.random.default_rng(3)
    z = (rng.integers(0, 20, (90, 77)) * 3).astype(np.int16)
    valid = np.ones(z.shape, bool)
    zf = filled(z.astype(np.float32), valid).astype(np.int16)
    check_flow(zf, valid, dx=30.0, dy=20.0)
    check_flow(zf.astype(np.float64) / 7, valid, dx=0.5, dy=2.0, weights=False)


def lake_dem(n=300, radius=110, seed=1):
    """A bowl whose floor (a disk of ``radius`` cells, many GPU tiles across) is one flat after
    filling, with islands in it and a notch in the rim towards the west edge."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:n, 0:n]
    r = np.hypot(y - n / 2, x - n / 2)
    z = np.where(r < radius, 10.0 + rng.random((n, n)) * 5, 50.0 + r / 10 + rng.random((n, n)))
    z[(r > radius) & (r < radius + 3)] = 100.0
    z[n // 2, : n // 2 - radius + 3] = 20.0
    z[(np.abs(y - n / 2 - 30) < 6) & (np.abs(x - n / 2 + 20) < 9)] = 70.0  # islands
    z[(np.abs(y - n / 2 + 40) < 3) & (np.abs(x - n / 2 - 25) < 15)] = 90.0
    return z.astype(np.float32)


def test_lake_larger_than_a_tile():
    z = lake_dem()
    valid = np.ones(z.shape, bool)
    zf = filled(z, valid)
    code, acc = check_flow(zf, valid)
    level = zf[150, 150]
    assert (zf == level).sum() > 30000  # the flat spans dozens of 32 x 32 tiles
    from terrain_io.grid.flow._gpu import directions

    assert max(directions.rounds) > 1
    # every cell of the lake drains through the notch: its accumulation counts the whole lake
    assert acc[150, 30 - 2] >= (zf == level).sum()


def spiral_codes(h, w):
    """Directions along one path through every cell, a square spiral from the corner inward."""
    code = np.full((h, w), OUTLET, np.uint8)
    top, bottom, left, right = 0, h - 1, 0, w - 1
    path = []
    while top <= bottom and left <= right:
        path += [(top, j) for j in range(left, right + 1)]
        path += [(i, right) for i in range(top + 1, bottom + 1)]
        if top < bottom:
            path += [(bottom, j) for j in range(right - 1, left - 1, -1)]
        if left < right:
            path += [(i, left) for i in range(bottom - 1, top, -1)]
        top, bottom, left, right = top + 1, bottom - 1, left + 1, right - 1
    code_of = {(DR[d], DC[d]): d for d in range(8)}
    for (a, b), (c, e) in zip(path, path[1:]):
        code[a, b] = code_of[c - a, e - b]
    return code, path


def test_accumulation_along_a_spiral():
    """A path of h * w cells: the accumulation is the position along it (O(log n) rounds across the
    tiles: the path crosses each tile border again and again)."""
    code, path = spiral_codes(300, 257)
    acc = gpu_accumulation(code)
    want = np.zeros(code.shape, np.uint64)
    for k, c in enumerate(path):
        want[c] = k + 1
    assert acc.tobytes() == want.tobytes()
    assert acc.tobytes() == accumulation_reference(code).tobytes()
    wt = np.random.default_rng(1).random(code.shape)
    np.testing.assert_allclose(gpu_accumulation(code, wt), accumulation_reference(code, wt), rtol=1e-12)


def test_serpentine_channel():
    """A 1-cell-wide channel winding row after row through the DEM (path length ~ n / 2), walls
    between its rows: directions and accumulation against the references."""
    h, w = 161, 203
    z = np.full((h, w), 1e6, np.float64)
    k = 0
    for r in range(0, h, 2):
        cols = range(w) if (r // 2) % 2 == 0 else range(w - 1, -1, -1)
        for c in cols:
            z[r, c] = 1e5 - k
            k += 1
        if r + 1 < h:
            c = w - 1 if (r // 2) % 2 == 0 else 0
            z[r + 1, c] = 1e5 - k
            k += 1
    z = z[::-1].copy()  # the channel ends at the top-left corner, an outlet
    valid = np.ones(z.shape, bool)
    code, acc = check_flow(z, valid, weights=False)
    assert acc.max() >= k


def test_real_dem():
    """The sample DEM (344 x 403, integer metres: many flats once filled), whole and with holes."""
    _, z = parse_esri_ascii(ROOT / "sample_data" / "jacksboro_fault_dem.asc")
    z = z.astype(np.float32)
    holed = z.copy()
    holed[100:130, 200:260] = np.nan
    holed[np.random.default_rng(5).random(z.shape) < 0.01] = np.nan
    for dem in (z, holed):
        valid = ~np.isnan(dem)
        check_flow(filled(dem, valid), valid, dx=74.4, dy=92.6)
        check_flow(dem, valid, outlets="edge", weights=False)


def test_cycle_is_an_error():
    code = np.full((40, 40), OUTLET, np.uint8)
    code[10, 10], code[10, 11], code[11, 11], code[11, 10] = 0, 2, 4, 6  # E, S, W, N: a loop
    with pytest.raises(InputError):
        gpu_accumulation(code)
    code, _ = spiral_codes(70, 70)
    code[0, 0], code[0, 1], code[0, 2] = 0, 0, 4  # a loop across tiles is caught by the list ranking
    code[40, 31], code[40, 32] = 0, 4
    with pytest.raises(InputError):
        gpu_accumulation(code)


def test_empty_and_tiny():
    for shape in ((1, 1), (1, 40), (33, 1), (2, 2)):
        z = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        check_flow(z, np.ones(shape, bool))
    z = np.ones((5, 5), np.float32)
    check_flow(z, np.zeros((5, 5), bool))


@pytest.mark.parametrize("case", ["terraced", "flat-bottomed", "nodata-holed", "lake", "real", "spiral"])
def test_cpu_and_gpu_give_the_same_bytes(case):
    """The numba kernels (terrain_io/grid/flow/_cpu.py) and the CuPy ones: directions and counts the
    same bytes; weighted sums equal within the documented rounding."""
    cpu = pytest.importorskip("terrain_io.grid.flow._cpu")
    dx, dy = 10.0, 10.0
    if case == "real":
        _, z = parse_esri_ascii(ROOT / "sample_data" / "jacksboro_fault_dem.asc")
        z = z.astype(np.float32)
        z[100:130, 200:260] = np.nan
        dx, dy = 74.4, 92.6
    elif case == "lake":
        z = lake_dem()
    elif case == "spiral":
        z = None
    else:
        z = _dem(case, 211, 187, seed=11)
    if z is None:
        code, _ = spiral_codes(150, 131)
    else:
        valid = ~np.isnan(z)
        zf = filled(z, valid)
        for dem in (zf, z):
            for outlets in ("edge+nodata", "edge"):
                want = cpu.directions(dem, valid, dx, dy, outlets)
                got = gpu_directions(dem, valid, dx, dy, outlets)
                assert got.tobytes() == want.tobytes(), f"{int((got != want).sum())} codes differ"
        code = cpu.directions(zf, valid, dx, dy)
    for self_ in (True, False):
        want = cpu.accumulation(code, include_self=self_)
        got = gpu_accumulation(code, include_self=self_)
        assert got.dtype == want.dtype == np.uint64 and got.tobytes() == want.tobytes()
    wt = np.random.default_rng(2).random(code.shape) * 5
    want, got = cpu.accumulation(code, wt), gpu_accumulation(code, wt)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("condition", ["fill", "none"])
def test_store_pipeline_gpu_equals_cpu(tmp_path, condition):
    """``terrain flow`` on the GPU (in core) writes the CPU pipeline's bytes (which test_flow_store
    checks against the references)."""
    from terrain_io.grid.flow.pipeline import flow
    from terrain_io.store import TerrainStore

    z = _dem("nodata-holed", 300, 257, seed=5).astype(np.float32)
    out = {}
    for device in ("cpu", "gpu"):
        st = TerrainStore.from_array(tmp_path / f"{device}.zarr", z, tile=32, shard=2)
        res = flow(st, condition=condition, device=device, progress=False)
        assert res.device == device
        st = TerrainStore.open(st.path)
        out[device] = (st.group["flow/direction"][:], st.group["flow/accumulation"][:])
    assert out["gpu"][0].tobytes() == out["cpu"][0].tobytes()
    assert out["gpu"][1].dtype == np.uint64 and out["gpu"][1].tobytes() == out["cpu"][1].tobytes()


def test_gpu_route_keeps_the_memory_budget(tmp_path):
    """The GPU route holds a shard per reader and writer thread on the host: under a budget they do
    not fit it routes on the CPU out of core (one note) and gives the same bytes (issue 34)."""
    from terrain_io.errors import TerrainNote
    from terrain_io.grid.flow.pipeline import flow
    from terrain_io.store import TerrainStore

    z = _dem("terraced", 300, 257, seed=5).astype(np.float32)
    out = {}
    for device, memory in (("gpu", None), ("gpu-budget", "1MB")):
        st = TerrainStore.from_array(tmp_path / f"{device}.zarr", z, tile=32, shard=2)
        if memory is None:
            res = flow(st, condition="none", device="gpu", progress=False)
        else:
            with pytest.warns(TerrainNote, match="beyond the budget"):
                res = flow(st, condition="none", device="gpu", memory=memory, progress=False)
        out[device] = (res.device, res.method, TerrainStore.open(st.path).group["flow/accumulation"][:])
    assert out["gpu"][:2] == ("gpu", "incore") and out["gpu-budget"][0] == "cpu"
    assert out["gpu-budget"][2].tobytes() == out["gpu"][2].tobytes()
