"""Watersheds, basins, stream order / links and HAND (terrain_io.grid.hydro) against references
written in tests/references.py -- a traversal of the reverse flow graph, a recursive Strahler / Shreve, a walk down
each flow path -- and against pyflwdir's basins, stream_order and hand on the same directions
(where it is installed). DEMs are routed by our flow_direction (pits, flats and nodata included)."""
from __future__ import annotations

import numpy as np
import pytest

from references import downstream, hydro_dem, reference_hand, reference_labels, reference_network

from terrain_io.errors import InputError
from terrain_io.grid.flow import flow_accumulation, flow_direction
from terrain_io.grid.flow.codes import NODATA
from terrain_io.grid.hydro import basins, hand, stream_links, stream_order, watershed


CASES = [(0, "none", None), (1, "fill", None), (2, "none", 2.0), (3, "fill", 1.0)]


@pytest.fixture(params=CASES, ids=lambda p: f"seed{p[0]}-{p[1]}-step{p[2]}")
def routed(request):
    seed, condition, step = request.param
    z = hydro_dem(seed, step=step)
    d = flow_direction(z, condition=condition)
    return z, d, flow_accumulation(d)


# --- references --------------------------------------------------------------------------------------------------


def as_pyflwdir(d):
    """Our codes in pyflwdir's d8 (ESRI's powers of two; 0 = pit, 247 = nodata)."""
    out = np.full(d.shape, 247, np.uint8)
    flowing = d < 8
    out[flowing] = (1 << d[flowing].astype(np.int64)).astype(np.uint8)
    out[(d == 8) | (d == 9)] = 0
    return out


# --- tests ---------------------------------------------------------------------------------------------------------

def test_watershed_equals_reverse_traversal(routed):
    z, d, acc = routed
    rng = np.random.default_rng(5)
    valid = np.argwhere(d != NODATA)
    # outlets on the big rivers (nested ones among them) and random cells
    big = np.argwhere(acc >= np.quantile(acc[d != NODATA], 0.97))
    picks = np.concatenate([big[rng.choice(len(big), 6, replace=False)],
                            valid[rng.choice(len(valid), 6, replace=False)]])
    outlets = [tuple(int(v) for v in p) for p in {tuple(p) for p in picks.tolist()}]
    outlets.sort(key=lambda p: (p[1], p[0]))
    got = watershed(d, outlets)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, reference_labels(d, outlets))


def test_basins_equal_reverse_traversal(routed):
    z, d, acc = routed
    ds = downstream(d)
    terminals = sorted(cell for cell, t in ds.items() if t is None)
    label, table = basins(d)
    ref = reference_labels(d, terminals)
    np.testing.assert_array_equal(label, ref)
    assert (label[d != NODATA] > 0).all()
    np.testing.assert_array_equal(table.row, [r for r, _ in terminals])
    np.testing.assert_array_equal(table.col, [c for _, c in terminals])
    np.testing.assert_array_equal(table.cells, np.bincount(ref.ravel(), minlength=len(terminals) + 1)[1:])


@pytest.mark.parametrize("threshold", [1, 25])
def test_stream_order_and_links_equal_recursion(routed, threshold):
    z, d, acc = routed
    stream, strahler, shreve, link, heads, ds = reference_network(d, acc, threshold)
    ref_s = np.zeros(d.shape, np.int64)
    ref_m = np.zeros(d.shape, np.int64)
    for cell in stream:
        ref_s[cell], ref_m[cell] = strahler[cell], shreve[cell]
    got_s = stream_order(d, acc, threshold)
    got_m = stream_order(d, acc, threshold, method="shreve")
    assert got_s.dtype == np.uint8 and (ref_s.max() >= 2 or threshold > 4)
    np.testing.assert_array_equal(got_s, ref_s)
    np.testing.assert_array_equal(got_m, ref_m)
    got_l, table = stream_links(d, acc, threshold)
    np.testing.assert_array_equal(got_l, link)
    np.testing.assert_array_equal(np.c_[table.head_row, table.head_col], heads)
    for i in range(len(heads)):  # every link's downstream id follows the flow from its last cell
        tail = (int(table.tail_row[i]), int(table.tail_col[i]))
        assert link[tail] == i + 1
        nxt = ds[tail]
        assert table.downstream[i] == (link[nxt] if nxt is not None and nxt in stream else 0)
        assert table.downstream[i] != i + 1
        assert table.cells[i] == (link == i + 1).sum()
        assert table.strahler[i] == ref_s[tail] and table.shreve[i] == ref_m[tail]


@pytest.mark.parametrize("threshold", [3, 40])
def test_hand_equals_walk_down(routed, threshold):
    z, d, acc = routed
    zf = np.where(np.isnan(z), 0.0, z)
    stream = {cell for cell in downstream(d) if acc[cell] >= threshold}
    ref, first = reference_hand(zf, d, stream)
    got, drain = hand(d, zf, acc, threshold, drainage=True)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got[~np.isnan(ref)], ref[~np.isnan(ref)].astype(np.float32))
    links, _ = stream_links(d, acc, threshold)
    ref_drain = np.zeros(d.shape, np.int64)
    for cell, c in first.items():
        ref_drain[cell] = links[c]
    np.testing.assert_array_equal(drain, ref_drain)


def test_against_pyflwdir(routed):
    pyflwdir = pytest.importorskip("pyflwdir")
    z, d, acc = routed
    flw = pyflwdir.from_array(as_pyflwdir(d), ftype="d8", check_ftype=False)
    # basins: the same partition (pyflwdir numbers them its own way)
    ours, _ = basins(d)
    theirs = flw.basins()
    pairs = np.unique(np.c_[ours.ravel(), theirs.ravel()], axis=0)
    assert len(pairs) == len(np.unique(ours)) == len(np.unique(theirs))
    # subbasins of outlets in our order: the same ids
    big = np.argwhere(acc >= np.quantile(acc[d != NODATA], 0.95))[::7]
    outlets = [tuple(int(v) for v in p) for p in big]
    np.testing.assert_array_equal(watershed(d, outlets), flw.basins(idxs=big[:, 0] * d.shape[1] + big[:, 1]))
    threshold = 8
    mask = (acc >= threshold) & (d != NODATA)
    np.testing.assert_array_equal(stream_order(d, acc, threshold), flw.stream_order(type="strahler", mask=mask))
    zf = np.where(np.isnan(z), 0.0, z)
    got = hand(d, zf, acc, threshold)
    ref = flw.hand(drain=mask, elevtn=zf)
    ok = ~np.isnan(got)  # pyflwdir measures a path that meets no stream from its pit instead
    assert ok.sum() > 0.5 * (d != NODATA).sum()
    np.testing.assert_allclose(got[ok], ref[ok], atol=1e-4)


def test_xarray_kind_kept():
    xr = pytest.importorskip("xarray")
    z = hydro_dem(4, shape=(20, 30), holes=False)
    da = xr.DataArray(z, dims=("y", "x"), coords={"y": np.arange(20) * -10.0, "x": np.arange(30) * 10.0},
                      attrs={"crs": "EPSG:32633"})
    d = flow_direction(da)
    acc = flow_accumulation(d)
    order = stream_order(d, acc, 5)
    assert isinstance(order, xr.DataArray) and order.attrs["crs"] == "EPSG:32633"
    np.testing.assert_array_equal(order.x, da.x)
    np.testing.assert_array_equal(order.values, stream_order(d.values, acc.values, 5))
    height = hand(d, da, acc, 5)
    np.testing.assert_array_equal(height.values, hand(d.values, z, acc.values, 5))
    label, _ = basins(d)
    assert isinstance(label, xr.DataArray) and label.dtype == np.uint32


def test_bad_input():
    d = flow_direction(hydro_dem(6, shape=(10, 12)))
    acc = flow_accumulation(d)
    nodata = tuple(int(v) for v in np.argwhere(d == NODATA)[0])
    for outlets, words in [([(10, 0)], "outside"), ([nodata], "nodata"), ([(1, 1), (1, 1)], "more than once"),
                           ([], "no outlets")]:
        with pytest.raises(InputError, match=words):
            watershed(d, outlets)
    for threshold in (0, -1, float("nan")):
        with pytest.raises(InputError, match="threshold"):
            stream_order(d, acc, threshold)
    with pytest.raises(InputError, match="method"):
        stream_order(d, acc, 1, method="horton")
    cycle = np.array([[0, 4]], np.uint8)  # two cells draining into each other
    with pytest.raises(InputError, match="cycles"):
        basins(cycle)


@pytest.mark.slow  # pysheds compiles its own numba kernels on import: ~50 s on 2 cores
def test_watershed_against_pysheds_catchment(routed, tmp_path, monkeypatch):
    """pysheds' ``catchment`` on the same directions (ESRI codes in a GeoTIFF): equal inside the DEM's
    outermost ring, which pysheds' catchment leaves out."""
    if not hasattr(np, "in1d"):  # pysheds 0.5 calls np.in1d, gone in NumPy 2.4 (this test only)
        monkeypatch.setattr(np, "in1d", np.isin, raising=False)
    grid_mod = pytest.importorskip("pysheds.grid")
    rasterio = pytest.importorskip("rasterio")
    from affine import Affine

    z, d, acc = routed
    esri = as_pyflwdir(d).astype(np.int32)
    esri[d == NODATA] = -1
    path = tmp_path / "d.tif"
    with rasterio.open(path, "w", driver="GTiff", width=d.shape[1], height=d.shape[0], count=1, dtype="int32",
                       nodata=-1, transform=Affine(1, 0, 0, 0, -1, d.shape[0]), crs="EPSG:32633") as f:
        f.write(esri, 1)
    grid = grid_mod.Grid.from_raster(str(path))
    fdir = grid.read_raster(str(path))
    big = np.argwhere(acc >= np.quantile(acc[d != NODATA], 0.9))[::9][:4]
    for r, c in big:
        ours = watershed(d, [(int(r), int(c))]) == 1
        theirs = np.asarray(grid.catchment(x=int(c), y=int(r), fdir=fdir, xytype="index")).astype(bool)
        np.testing.assert_array_equal(ours[1:-1, 1:-1], theirs[1:-1, 1:-1])
        assert ours.sum() > 1
