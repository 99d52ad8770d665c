"""Never write a wrong number (issue 27): exported values and nodata read back by rasterio/GDAL and by
a parser written here from the Esri ASCII grid's definition; allocation ids against scipy's
multi-source Dijkstra; inputs that used to be taken silently are refused or noted in one line."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner
from rasterio.crs import CRS
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import dijkstra

from cli.main import _register, cli
from terrain_io.convert import convert
from terrain_io.errors import InputError, TerrainError, TerrainNote
from terrain_io.export import export
from terrain_io.grid import cost_distance, mst, sssp
from terrain_io.points import from_coordinates
from terrain_io.synth import synthesize

from references import UTM33, parse_esri_ascii, utm_store

_register()
F32MAX = float(np.finfo(np.float32).max)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def tricky_values():
    """float32 values every one of which a 3-decimal ASCII grid must write exactly: a valid -9999,
    float32's extremes, integers beyond int64's reach after scaling, quarters; NaN holes."""
    rng = np.random.default_rng(3)
    v = (rng.integers(-400, 4000, (37, 45)) / 4).astype(np.float32)
    v[0, :6] = [-9999.0, F32MAX, -F32MAX, 1e20, -3.0e38, 9.5e15]
    v[1, 1] = np.float32(-9999.0004)  # written -9999.000: would read back as nodata
    v[rng.random(v.shape) < 0.1] = np.nan
    v[0, 0] = -9999.0
    return v


# -- 1. Esri ASCII: nodata, exact values, --decimals, .prj ---------------------------------------
def test_ascii_export_reads_back_exactly_with_its_own_nodata_and_prj(tmp_path):
    v = tricky_values()
    st = utm_store(tmp_path / "dem.zarr", v)
    out = tmp_path / "dem.asc"
    export(st.path, "elevation", out)
    header, got = parse_esri_ascii(out)
    nodata = float(header["nodata_value"])
    assert nodata != -9999 and not np.any(np.round(v[~np.isnan(v)].astype(np.float64), 3) == nodata)
    assert abs(nodata) <= F32MAX  # a float32 reader holds it
    np.testing.assert_array_equal(np.isnan(got), np.isnan(v))
    ok = ~np.isnan(v)
    np.testing.assert_array_equal(got.astype(np.float32)[ok], v[ok])  # every value, exactly
    with rasterio.open(out) as ds:  # GDAL's reader, with the .prj beside
        m = ds.read(1, masked=True)
        assert ds.crs == UTM33
        np.testing.assert_array_equal(m.mask, np.isnan(v))
        np.testing.assert_array_equal(m.data[ok].astype(np.float32), v[ok])
    prj = out.with_suffix(".prj").read_text()
    assert prj.startswith("PROJCS[") and CRS.from_wkt(prj) == UTM33


def test_ascii_export_17_decimals_round_trips_float32(tmp_path):
    rng = np.random.default_rng(5)
    v = (rng.standard_normal((20, 30)) * 10.0 ** rng.integers(-6, 8, (20, 30))).astype(np.float32)
    st = utm_store(tmp_path / "dem.zarr", v, crs=None)
    export(st.path, "elevation", tmp_path / "d.asc", decimals=17)
    _, got = parse_esri_ascii(tmp_path / "d.asc")
    np.testing.assert_array_equal(got.astype(np.float32), v)
    # each text is the value rounded to 17 decimals (the float64 parse is within half a unit of it)
    assert np.all(np.abs(got - v.astype(np.float64)) <= 0.5e-17 + np.spacing(np.abs(got)))
    assert not (tmp_path / "d.prj").exists()  # no CRS: no .prj


def test_prj_follows_the_overwrite_rule(tmp_path):
    st = utm_store(tmp_path / "dem.zarr", np.ones((4, 5), np.float32))
    (tmp_path / "d.prj").write_text("mine")
    with pytest.raises(TerrainError, match="d.prj: already exists"):
        export(st.path, "elevation", tmp_path / "d.asc")
    assert (tmp_path / "d.prj").read_text() == "mine" and not (tmp_path / "d.asc").exists()
    export(st.path, "elevation", tmp_path / "d.asc", overwrite=True)
    assert CRS.from_wkt((tmp_path / "d.prj").read_text()) == UTM33
    bare = utm_store(tmp_path / "bare.zarr", np.ones((4, 5), np.float32), crs=None)
    export(bare.path, "elevation", tmp_path / "d.asc", overwrite=True)  # no CRS: no .prj to tell another
    assert not (tmp_path / "d.prj").exists()
    with rasterio.open(tmp_path / "d.asc") as ds:
        assert ds.crs is None


@pytest.mark.parametrize("decimals", [-1, 18, 2.5])
def test_decimals_out_of_range_are_refused(tmp_path, decimals):
    st = utm_store(tmp_path / "dem.zarr", np.ones((4, 4), np.float32))
    with pytest.raises(InputError, match="--decimals"):
        export(st.path, "elevation", tmp_path / "d.asc", decimals=decimals)
    r = run("export", st.path, "-o", tmp_path / "d.asc", "--decimals", decimals)
    assert r.exit_code != 0 and "decimals" in r.output
    assert not (tmp_path / "d.asc").exists()


# -- 2. unreached cells: nodata in GeoTIFF and ASCII, +inf kept in the store -----------------------
def test_unreached_cells_are_nodata_in_geotiff_and_ascii(tmp_path):
    rng = np.random.default_rng(8)
    v = (rng.random((40, 50)) * 50).astype(np.float32)
    v[rng.random(v.shape) < 0.05] = np.nan
    v[20, 25] = 1.0
    st = utm_store(tmp_path / "dem.zarr", v)
    sssp(st, (20, 25), cell=True, progress=False, name="s", max_cost=120.0, method="incore")
    d = st.group["sssp/s/distance"][:]
    unreached = np.isinf(d)
    assert unreached.sum() > 100 and np.isfinite(d).sum() > 100
    export(st.path, "sssp/s/distance", tmp_path / "d.tif")
    export(st.path, "sssp/s/distance", tmp_path / "d.asc", decimals=6)
    with rasterio.open(tmp_path / "d.tif") as ds:
        m = ds.read(1, masked=True)
        np.testing.assert_array_equal(m.mask, ~np.isfinite(d))
        np.testing.assert_array_equal(m.data[~m.mask], d[np.isfinite(d)])
        s = ds.stats(indexes=1, approx=False)[0] if hasattr(ds, "stats") else ds.statistics(1, approx=False)
        assert s.max == pytest.approx(float(d[np.isfinite(d)].max())) and math.isfinite(s.max)
    _, got = parse_esri_ascii(tmp_path / "d.asc")
    np.testing.assert_array_equal(np.isnan(got), ~np.isfinite(d))
    np.testing.assert_allclose(got[np.isfinite(d)], d[np.isfinite(d)], atol=0.5e-6)
    assert np.isinf(st.group["sssp/s/distance"][:]).sum() == unreached.sum()  # the store keeps +inf


# -- 3. mst/edges: 0 is a mask, nodata is 255 -----------------------------------------------------
def test_mst_edges_export_marks_only_nodata_cells(tmp_path):
    rng = np.random.default_rng(2)
    v = (rng.random((33, 41)) * 9).astype(np.float32)
    v[rng.random(v.shape) < 0.15] = np.nan
    st = utm_store(tmp_path / "dem.zarr", v, tile=8, shard=2)
    mst(st, progress=False)
    edges = st.group["mst/edges"][:]
    valid = ~np.isnan(v)
    assert (edges[valid] == 0).any()  # valid cells whose mask is 0: they must not read as nodata
    export(st.path, "mst/edges", tmp_path / "e.tif")
    export(st.path, "mst/edges", tmp_path / "e.asc")
    with rasterio.open(tmp_path / "e.tif") as ds:
        m = ds.read(1, masked=True)
        assert ds.nodata is not None and not 0 <= ds.nodata <= 15
        np.testing.assert_array_equal(m.mask, ~valid)
        np.testing.assert_array_equal(m.data[valid], edges[valid])
    header, got = parse_esri_ascii(tmp_path / "e.asc")
    assert not 0 <= float(header["nodata_value"]) <= 15
    np.testing.assert_array_equal(np.isnan(got), ~valid)
    np.testing.assert_array_equal(got[valid], edges[valid])


# -- 4. infinite elevations, huge values ----------------------------------------------------------
def _ascii(path, values, nodata="-9999"):
    rows, cols = values.shape
    body = "\n".join(" ".join(t for t in row) for row in values)
    path.write_text(f"ncols {cols}\nnrows {rows}\nxllcorner 0\nyllcorner 0\ncellsize 10\nNODATA_value {nodata}\n"
                    + body + "\n")
    return path


@pytest.mark.parametrize("token", ["inf", "-inf", "1e39"])
def test_convert_refuses_infinite_elevations(tmp_path, token):
    cells = np.full((6, 7), "12.5", dtype=object)
    cells[2, 3] = token
    src = _ascii(tmp_path / "dem.asc", cells)
    r = run("convert", src, "-o", tmp_path / "dem.zarr", "--dtype", "float32")
    assert r.exit_code == 1 and r.output.count("\n") == 1 and r.output.startswith("terrain: error:"), r.output
    assert "infinite" in r.output or "beyond the range" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dem.asc"]
    tif = _tif(tmp_path / "inf.tif", np.where(np.arange(20).reshape(4, 5) == 7, np.inf, 1.0).astype(np.float32))
    with pytest.raises(InputError, match="infinite"):
        convert(tif, tmp_path / "t.zarr")
    assert not (tmp_path / "t.zarr").exists()


def test_mst_refuses_a_store_with_infinite_elevations(tmp_path):
    v = np.ones((6, 7), np.float32)
    v[2, 2] = np.inf  # a store not made by convert (from_array, or written before convert refused it)
    st = utm_store(tmp_path / "dem.zarr", v)
    with pytest.raises(InputError, match="infinite"):
        mst(st, progress=False)
    assert "mst" not in st.group


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_huge_values_give_no_runtime_warning_and_no_wrong_distance(tmp_path):
    rng = np.random.default_rng(4)
    z = rng.uniform(-3e38, 3e38, (30, 40)).astype(np.float32)
    src = _ascii(tmp_path / "huge.asc", np.vectorize(lambda x: repr(float(x)))(z))
    s = tmp_path / "huge.zarr"
    for args in (["convert", src, "-o", s], ["info", s], ["mst", s], ["depressions", s],
                 ["export", s, "-o", tmp_path / "h.asc"], ["export", s, "-o", tmp_path / "h.tif"],
                 ["export", s, "-o", tmp_path / "h.png"]):
        r = run("-q", *args)
        assert r.exit_code == 0 and "Warning" not in r.output, (args, r.output)
    _, got = parse_esri_ascii(tmp_path / "h.asc")
    np.testing.assert_array_equal(got.astype(np.float32), z)
    for args in (["sssp", s, "--cell", "--source", "1,1"], ["fill", s]):  # would overflow float32: refused
        r = run("-q", *args)
        assert r.exit_code == 1 and r.output.startswith("terrain: error:") and "float32" in r.output, r.output
        assert r.output.count("\n") == 1


# -- 5. allocation ids are the points' order ------------------------------------------------------
def _scipy_allocation(v, cells, ids):
    """The id of the nearest source of every cell: scipy's multi-source Dijkstra (absdiff, 8 neighbours)."""
    H, W = v.shape
    n = np.arange(H * W).reshape(H, W)
    us, vs, ws = [], [], []
    for dr, dc in [(0, 1), (1, 1), (1, 0), (1, -1)]:  # each undirected edge once
        ta = (slice(0, H - dr), slice(max(0, -dc), W - max(0, dc)))
        tb = (slice(dr, H), slice(max(0, dc), W - max(0, -dc)))
        a, b = v[ta].astype(np.float64), v[tb].astype(np.float64)
        m = ~np.isnan(a) & ~np.isnan(b)
        us.append(n[ta][m]), vs.append(n[tb][m]), ws.append(np.abs(a - b)[m])
    u, w_, wt = np.concatenate(us), np.concatenate(vs), np.concatenate(ws)
    g = coo_matrix((wt, (u, w_)), shape=(H * W, H * W)).tocsr()
    flat = [r * W + c for r, c in cells]
    dist, _, src = dijkstra(g, directed=False, indices=flat, min_only=True, return_predecessors=True)
    lookup = dict(zip(flat, ids))
    out = np.array([lookup.get(int(s), 0) for s in src], np.int64).reshape(H, W)
    out[~np.isfinite(dist.reshape(H, W))] = 0
    return out


@pytest.mark.parametrize("method", ["incore", "shards"])
def test_allocation_ids_follow_the_points_order(tmp_path, method):
    rng = np.random.default_rng(11)
    v = (rng.random((31, 37)) * 40).astype(np.float32)
    v[5, 5] = np.nan
    st = utm_store(tmp_path / "dem.zarr", v, tile=8, shard=2)
    points = [(5, 5), (3, 4), (20, 30), (3, 4), (28, 2), (20, 30), (12, 17)]  # first: on nodata, skipped
    kw = {"unit": 8} if method == "shards" else {}
    with pytest.warns(TerrainNote) as notes:
        sssp(st, points, cell=True, progress=False, name="a", allocation=True, method=method, skip_invalid=True, **kw)
    assert any("share" in str(n.message) and "4, 6" in str(n.message) for n in notes)
    got = st.group["sssp/a/source"][:]
    want = _scipy_allocation(v, [(3, 4), (20, 30), (28, 2), (12, 17)], [2, 3, 5, 7])
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(got)) == {0, 2, 3, 5, 7}


# -- 6. silent acceptance -------------------------------------------------------------------------
def _tif(path, values, crs=UTM33, transform=(500000.0, 30.0, 0.0, 4100000.0, 0.0, -30.0)):
    from rasterio.transform import Affine

    with rasterio.open(path, "w", driver="GTiff", width=values.shape[1], height=values.shape[0], count=1,
                       dtype=str(values.dtype), crs=crs, transform=Affine.from_gdal(*transform)) as ds:
        ds.write(values, 1)
    return path


def test_bad_cost_cells_are_noted_with_their_count(tmp_path):
    v = np.random.default_rng(1).random((12, 14)).astype(np.float32)
    v[0, 0] = np.nan  # no data: not counted
    st = utm_store(tmp_path / "dem.zarr", v, tile=8, shard=1)
    cost = np.ones(v.shape, np.float32)
    cost[0, 0] = np.nan
    cost[3, 3], cost[4, 4], cost[5, 5], cost[6, 6] = -1.0, np.nan, np.inf, -np.inf
    with pytest.warns(TerrainNote, match=r"4 cells .*nodata or NaN 1, negative 2, infinite 1"):
        sssp(st, (1, 1), cell=True, weight="cell", cost=_tif(tmp_path / "cost.tif", cost), progress=False)
    with pytest.warns(TerrainNote, match=r"4 cells .*nodata or NaN 1, negative 2, infinite 1"):
        cost_distance(v, (1, 1), weight="cell", cost=cost)  # the array API: the same note
    with warnings.catch_warnings():
        warnings.simplefilter("error", TerrainNote)  # a clean cost raster: no note
        sssp(st, (1, 1), cell=True, weight="cell", cost=_tif(tmp_path / "ok.tif", np.ones(v.shape, np.float32)),
             progress=False, name="ok")


def test_rasters_in_another_crs_are_refused(tmp_path):
    v = np.ones((10, 12), np.float32)
    st = utm_store(tmp_path / "dem.zarr", v, tile=8, shard=1)
    other = _tif(tmp_path / "src.tif", np.eye(10, 12, dtype=np.uint8), crs=CRS.from_epsg(32634))
    with pytest.raises(InputError, match="EPSG:32634.*EPSG:32633"):
        sssp(st, str(other), progress=False)
    with pytest.raises(InputError, match="EPSG:32634.*EPSG:32633"):
        sssp(st, (1, 1), cell=True, weight="cell", cost=other, progress=False)
    same = _tif(tmp_path / "ok.tif", np.eye(10, 12, dtype=np.uint8))
    assert sssp(st, str(same), progress=False).reached == v.size


def test_cell_sources_must_be_whole_numbers(tmp_path):
    st = utm_store(tmp_path / "dem.zarr", np.ones((10, 12), np.float32), tile=8, shard=1)
    with pytest.raises(InputError, match="whole numbers"):
        from_coordinates(st, (7.7, 2.0), cell=True)
    r = run("sssp", st.path, "--cell", "--source", "7.7,2.9")
    assert r.exit_code != 0 and "whole numbers" in r.output and "sssp" not in st.group
    assert len(from_coordinates(st, (7.0, 2.0), cell=True)) == 1


@pytest.mark.parametrize("cell_size", [-1.0, 0.0, math.nan, math.inf])
def test_synth_refuses_a_cell_size_that_is_no_length(tmp_path, cell_size):
    with pytest.raises(TerrainError, match="--cell-size"):
        synthesize(tmp_path / "s.zarr", 8, cell_size=cell_size)
    assert not any(tmp_path.iterdir())


def test_synth_refuses_a_dem_larger_than_the_free_disk(tmp_path):
    r = run("synth", "-o", tmp_path / "s.zarr", "--size", 5_000_000)
    assert r.exit_code == 1 and r.output.startswith("terrain: error:") and "free" in r.output, r.output
    assert "TiB" in r.output and not any(tmp_path.iterdir())
