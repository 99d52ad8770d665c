"""The in-core GPU flow routing (CuPy, terrain_io/kernels/flow.cu) against the references of
tests/references.py, written from the definitions: steepest descent, Barnes, Lehman & Mulla 2014's
two breadth-first searches per flat with its combined gradient, and a topological-order sum (Kahn)
for the accumulation; on terraced, flat-bottomed and nodata-holed DEMs, a lake larger than a GPU tile, snake-shaped flow paths and a real DEM. Run on a GPU machine
with ``pytest -m gpu``."""
from __future__ import annotations

import numpy as np
import pytest
from references import DC, DR, NODATA, OUTLET, ROOT, parse_esri_ascii, priority_flood, reference_directions
from references import fill_test_dem as _dem, topological_sum

from terrain_io.errors import InputError

pytestmark = pytest.mark.gpu


def directions_reference(z, valid, dx=1.0, dy=1.0, outlets="edge+nodata"):
    """Steepest descent, then Barnes, Lehman & Mulla 2014 on the flats (references.reference_directions)."""
    return reference_directions(z, valid, dx, dy, outlets)[0]


def accumulation_reference(code, weights=None, include_self=True):
    """The topological-order sum (references.topological_sum, Kahn's algorithm) as the GPU gives it:
    uint64 counts or float64 sums, without the cell's own share unless ``include_self``."""
    total = topological_sum(code, weights)
    if not include_self:
        total = total - np.where(code != NODATA, 1 if weights is None else weights, 0)
    return total.astype(np.uint64 if weights is None else np.float64)


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
