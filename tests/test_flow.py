"""Flow directions, flats and accumulation (terrain_io.grid.flow) against references written in
tests/references.py from the definitions:
a plain-Python D8 steepest descent, Barnes, Lehman & Mulla 2014's flat resolution written from the
paper (flat labels, its two breadth-first searches and its combined gradient), a topological-order
sum (Kahn), and pyflwdir where it is installed."""
from __future__ import annotations

import numpy as np
import pytest

from terrain_io.grid.flow import _cpu
from terrain_io.grid.flow.codes import NODATA, OUTLET, SINK

from references import (
    FLAT, cases, drains_to_an_end, flat_bottomed, holed, jacksboro, neighbours, priority_flood, reference_directions,
    steepest_descent, topological_sum,
)


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
