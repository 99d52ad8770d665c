"""Points from files (terrain_io.points): SSSP sources (``terrain sssp --sources``) and path targets
(``terrain path --to ... / --targets``).

References: cells from rasterio's ``rowcol`` after reprojection by rasterio.warp (GDAL's PROJ, not
the pyproj our reader uses); distances from scipy's Dijkstra (test_grid_sssp.reference); the
nodata mask read directly from the array; files written by pyogrio or by hand.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import warnings

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner
from rasterio.crs import CRS
from rasterio.transform import Affine, rowcol
from rasterio.warp import transform as warp_transform

from cli.main import _register, cli
from terrain_io.errors import InputError, SkippedPointsNote
from terrain_io.grid.sssp import sssp
from terrain_io.grid.sssp.path import trace_all
from terrain_io.points import from_coordinates, read_points, vertex_mask
from terrain_io.store import TerrainStore
from references import edge_w, random_dem, reference, walk_cost


pyogrio = pytest.importorskip("pyogrio")
_register()

UTM33 = CRS.from_epsg(32633)
X0, Y0, DX = 500000.0, 5500000.0, 30.0  # the DEM's upper-left corner and cell size in UTM 33N


def utm_store(tmp_path, vals, tile=8, shard=2, crs=UTM33):
    attrs = {"transform": [X0, DX, 0.0, Y0, 0.0, -DX], "cell_size": [DX, DX], "crs": crs.to_wkt() if crs else None}
    return TerrainStore.from_array(tmp_path / "dem.zarr", vals, tile=tile, shard=shard, attrs=attrs)


def wkb_point(x, y):
    return struct.pack("<BIdd", 1, 1, x, y)


def wkb_multipoint(pts):
    return struct.pack("<BII", 1, 4, len(pts)) + b"".join(wkb_point(x, y) for x, y in pts)


def wkb_line(pts):
    return struct.pack("<BII", 1, 2, len(pts)) + b"".join(struct.pack("<dd", x, y) for x, y in pts)


def write_vector(path, geoms, crs, gtype="Point", driver=None):
    geometry = np.array(geoms, dtype=object)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pyogrio warns of a file without a CRS: what some tests want
        pyogrio.raw.write(str(path), geometry, [np.arange(len(geoms), dtype=np.int32)], ["id"], driver=driver,
                          geometry_type=gtype, crs=crs)
    return path


def reference_cells(xy, src_crs, dst_crs=UTM33):
    """Cells of points by GDAL's reprojection and rasterio's rowcol (floor), no code of ours."""
    x, y = (xy[:, 0], xy[:, 1]) if src_crs is None else warp_transform(src_crs, dst_crs, xy[:, 0], xy[:, 1])
    r, c = rowcol(Affine(DX, 0.0, X0, 0.0, -DX, Y0), x, y)
    return np.column_stack([r, c]).astype(np.int64)


def random_interior_points(n, shape, seed):
    """Map coordinates (UTM 33N) of random points well inside cells (clear of the cell edges)."""
    rng = np.random.default_rng(seed)
    r = rng.integers(0, shape[0], n)
    c = rng.integers(0, shape[1], n)
    fr, fc = rng.uniform(0.2, 0.8, n), rng.uniform(0.2, 0.8, n)
    return np.column_stack([X0 + (c + fc) * DX, Y0 - (r + fr) * DX]), np.column_stack([r, c])


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(res, message):
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("terrain: error:") and message in lines[0], res.output
    assert "Traceback" not in res.output


# -- reading and reprojecting ------------------------------------------------------------------
@pytest.mark.parametrize("epsg,suffix,driver", [(4326, "geojson", "GeoJSON"), (32632, "gpkg", "GPKG"),
                                                (3857, "shp", "ESRI Shapefile")])
def test_vector_points_in_another_crs_land_on_the_reference_cells(tmp_path, epsg, suffix, driver):
    vals = random_dem((40, 50), seed=3)
    st = utm_store(tmp_path, vals)
    utm, cells = random_interior_points(60, vals.shape, seed=epsg)
    x, y = warp_transform(UTM33, CRS.from_epsg(epsg), utm[:, 0], utm[:, 1])
    f = write_vector(tmp_path / f"p.{suffix}", [wkb_point(a, b) for a, b in zip(x, y)], f"EPSG:{epsg}",
                     driver=driver)
    pts = read_points(f, st)
    ref = reference_cells(np.column_stack([x, y]), CRS.from_epsg(epsg))
    np.testing.assert_array_equal(pts.cells, ref)
    np.testing.assert_array_equal(pts.cells, cells)  # and the cells the points were made in
    np.testing.assert_array_equal(pts.index, np.arange(60))
    np.testing.assert_allclose(pts.xy, utm, atol=1e-3)


def test_csv_columns_delimiters_and_crs(tmp_path):
    vals = random_dem((30, 40), seed=4)
    st = utm_store(tmp_path, vals)
    utm, cells = random_interior_points(25, vals.shape, seed=5)
    for header, sep in [("X,Y", ","), ("name;Easting;Northing", ";"), ("northing\teasting", "\t")]:
        cols = header.split(sep)
        lines = [header]
        for i, (a, b) in enumerate(utm):
            row = {"x": a, "easting": a, "y": b, "northing": b, "name": f"p{i}"}
            lines.append(sep.join(str(row[c.lower()]) for c in cols))
        (tmp_path / "p.csv").write_text("\n".join(lines) + "\n")
        pts = read_points(tmp_path / "p.csv", st)  # a CSV is in the DEM's CRS
        np.testing.assert_array_equal(pts.cells, cells, err_msg=header)
    lon, lat = warp_transform(UTM33, CRS.from_epsg(4326), utm[:, 0], utm[:, 1])
    (tmp_path / "ll.csv").write_text("Longitude,Latitude\n" + "".join(f"{a!r},{b!r}\n" for a, b in zip(lon, lat)))
    pts = read_points(tmp_path / "ll.csv", st, crs="EPSG:4326")
    np.testing.assert_array_equal(pts.cells, reference_cells(np.column_stack([lon, lat]), CRS.from_epsg(4326)))


def test_multipoints_give_their_parts_and_match_coordinate_pairs(tmp_path):
    vals = random_dem((30, 40), seed=6)
    st = utm_store(tmp_path, vals)
    utm, cells = random_interior_points(7, vals.shape, seed=7)
    geoms = [wkb_point(*utm[0]), wkb_multipoint(utm[1:4]), wkb_multipoint(utm[4:])]
    f = write_vector(tmp_path / "m.gpkg", geoms, "EPSG:32633", gtype="Unknown", driver="GPKG")
    pts = read_points(f, st)
    np.testing.assert_array_equal(pts.cells, cells)
    np.testing.assert_array_equal(pts.index, [0, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(from_coordinates(st, [tuple(p) for p in utm]).cells, cells)
    # a hand-written GeoJSON (RFC 7946: longitude, latitude) gives the same cells
    lon, lat = warp_transform(UTM33, CRS.from_epsg(4326), utm[:, 0], utm[:, 1])
    fc = {"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {}, "geometry": {"type": "MultiPoint", "coordinates": [
            [a, b] for a, b in zip(lon, lat)]}}]}
    (tmp_path / "m.geojson").write_text(json.dumps(fc))
    np.testing.assert_array_equal(read_points(tmp_path / "m.geojson", st).cells, cells)


def test_vertex_mask_reads_each_tile_once(tmp_path, monkeypatch):
    vals = random_dem((100, 90), seed=8, holes=0.3)
    st = utm_store(tmp_path, vals, tile=8, shard=4)
    rng = np.random.default_rng(9)
    # many points in a few tiles (tile by tile), and a dense region (whole shards)
    r = np.concatenate([rng.integers(0, 8, 3000), rng.integers(40, 100, 5000)])
    c = np.concatenate([rng.integers(0, 16, 3000), rng.integers(0, 90, 5000)])
    calls = []
    read = TerrainStore.read
    monkeypatch.setattr(TerrainStore, "read", lambda self, win, *a, **k: calls.append(win) or read(self, win, *a, **k))
    ok = vertex_mask(st, r, c)
    np.testing.assert_array_equal(ok, ~np.isnan(vals[r, c]))
    touched = {(w.r0, w.r1, w.c0, w.c1) for w in calls}
    assert len(calls) == len(touched)  # no window read twice
    cells = sum(w.shape[0] * w.shape[1] for w in calls)
    assert cells <= 2 * 8 * 8 + 100 * 90  # two tiles, then no more than the DEM once


# -- sources -------------------------------------------------------------------------------------
def test_raster_sources_equal_the_same_points_as_sources(tmp_path):
    vals = random_dem((40, 36), seed=10, holes=0.05)
    src = [(3, 4), (20, 30), (39, 0), (17, 17)]
    for r, c in src:
        vals[r, c] = 5.0
    st = utm_store(tmp_path, vals, tile=8)
    mask = np.zeros(vals.shape, np.uint8)
    for r, c in src:
        mask[r, c] = 7
    with rasterio.open(tmp_path / "m.tif", "w", driver="GTiff", height=40, width=36, count=1, dtype="uint8",
                       crs=UTM33, transform=Affine(DX, 0, X0, 0, -DX, Y0), nodata=255) as ds:
        ds.write(mask, 1)
    with st.write_result("masks") as w:
        w.create_array("src", "uint8", 0)[...] = mask
    ref = reference(vals.astype(np.float64), src, "absdiff")
    runs = {"file": ["--sources", tmp_path / "m.tif"], "array": ["--sources", "masks/src"],
            "pairs": [a for r, c in src for a in ("--source", f"{r},{c}")] + ["--cell"]}
    for name, args in runs.items():
        res = run("-q", "sssp", st.path, "--name", name, "--method", "incore", *args)
        assert res.exit_code == 0, res.output
        g = TerrainStore.open(st.path).group[f"sssp/{name}"]
        np.testing.assert_allclose(g["distance"][:], ref, rtol=1e-5, atol=1e-5, equal_nan=True)
        assert sorted(map(tuple, g.attrs["source_cells"])) == sorted(src)
    g = TerrainStore.open(st.path).group
    np.testing.assert_array_equal(g["sssp/file/predecessor"][:], g["sssp/pairs/predecessor"][:])
    # a raster not aligned with the DEM is refused
    with rasterio.open(tmp_path / "off.tif", "w", driver="GTiff", height=40, width=36, count=1, dtype="uint8",
                       crs=UTM33, transform=Affine(DX, 0, X0 + 5, 0, -DX, Y0)) as ds:
        ds.write(mask, 1)
    one_line_error(run("sssp", st.path, "--sources", tmp_path / "off.tif"), "not aligned with the DEM")


def test_vector_sources_in_another_crs_through_sssp(tmp_path):
    vals = random_dem((30, 30), seed=11)
    st = utm_store(tmp_path, vals)
    utm, cells = random_interior_points(3, vals.shape, seed=12)
    lon, lat = warp_transform(UTM33, CRS.from_epsg(4326), utm[:, 0], utm[:, 1])
    f = write_vector(tmp_path / "s.gpkg", [wkb_point(a, b) for a, b in zip(lon, lat)], "EPSG:4326", driver="GPKG")
    r = sssp(st, f, name="v", progress=False, method="incore")
    want = [tuple(map(int, c)) for c in reference_cells(np.column_stack([lon, lat]), CRS.from_epsg(4326))]
    assert r.sources == list(dict.fromkeys(want))
    d = st.group["sssp/v/distance"][:]
    np.testing.assert_allclose(d, reference(vals.astype(np.float64), r.sources), rtol=1e-5, atol=1e-5)


def _bad_inputs(tmp_path):
    """(file, extra options, message) of inputs that must be refused with one line."""
    d = tmp_path
    (d / "empty.geojson").write_text("")
    (d / "empty.csv").write_text("")
    (d / "header.csv").write_text("x,y\n")
    (d / "noxy.csv").write_text("a,b\n1,2\n")
    (d / "text.csv").write_text("x,y\n500100,5499900\nabc,5499900\n")
    (d / "none.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    (d / "garbage.gpkg").write_bytes(b"this is no geopackage" * 10)
    x, y = X0 + 45, Y0 - 45
    line = {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {}, "geometry": {
        "type": "LineString", "coordinates": [[15.0, 49.6], [15.01, 49.61]]}}]}
    (d / "line.geojson").write_text(json.dumps(line))
    write_vector(d / "poly.gpkg", [struct.pack("<BII", 1, 3, 1) + struct.pack("<I", 4) + b"".join(
        struct.pack("<dd", a, b) for a, b in [(x, y), (x + 60, y), (x, y - 60), (x, y)])], "EPSG:32633",
        gtype="Polygon", driver="GPKG")
    write_vector(d / "noprj.shp", [wkb_point(x, y)], None, driver="ESRI Shapefile")
    write_vector(d / "mixed.gpkg", [wkb_point(x, y), wkb_line([(x, y), (x + 30, y)])], "EPSG:32633",
                 gtype="Unknown", driver="GPKG")
    return [
        (d / "empty.geojson", [], "cannot read it as a vector file"),
        (d / "empty.csv", [], "empty file"),
        (d / "header.csv", [], "no points"),
        (d / "noxy.csv", [], "no x and y columns"),
        (d / "text.csv", [], "line 3: expected numbers"),
        (d / "none.geojson", [], "no points"),
        (d / "garbage.gpkg", [], "cannot read it as a vector file"),
        (d / "line.geojson", [], "LineString geometries, not points"),
        (d / "poly.gpkg", [], "Polygon geometries, not points"),
        (d / "mixed.gpkg", [], "feature 1 is a LineString, not a point"),
        (d / "noprj.shp", [], "the file has no CRS and the DEM has one"),
        (d / "noprj.shp", ["--{w}s-crs", "EPSG:99999"], "unknown CRS"),
        (d / "missing.gpkg", [], "no such file and no such array"),
    ]


@pytest.mark.parametrize("what", ["source", "target"])
def test_bad_files_are_one_line_errors(tmp_path, what):
    vals = random_dem((20, 20), seed=13)
    st = utm_store(tmp_path, vals)
    if what == "target":
        sssp(st, [(0, 0)], cell=True, name="a", progress=False, method="incore")
    for f, extra, message in _bad_inputs(tmp_path):
        cmd = ["sssp", st.path, "--sources", f] if what == "source" else ["path", st.path, "--targets", f]
        one_line_error(run(*cmd, *[e.format(w=what) for e in extra]), message)
    # the shapefile without .prj is fine once its CRS is named
    cmd = ["sssp", st.path, "--sources"] if what == "source" else ["path", st.path, "--targets"]
    assert run("-q", *cmd, tmp_path / "noprj.shp", f"--{what}s-crs", "EPSG:32633").exit_code == 0


@pytest.mark.parametrize("what", ["source", "target"])
def test_points_off_the_data_with_and_without_skip_invalid(tmp_path, what):
    vals = random_dem((24, 24), seed=14)
    vals[10, 12] = np.nan
    st = utm_store(tmp_path, vals)
    sssp(st, [(0, 0)], cell=True, name="a", progress=False, method="incore")
    xs = [X0 + 45, X0 + 12 * DX + 5, X0 - 100, X0 + 300]
    ys = [Y0 - 45, Y0 - 10 * DX - 5, Y0 - 100, Y0 - 300]
    (tmp_path / "p.csv").write_text("x,y\n" + "".join(f"{a},{b}\n" for a, b in zip(xs, ys)))
    opt = "--sources" if what == "source" else "--targets"
    cmd = ["sssp", st.path, "--name", "b"] if what == "source" else ["path", st.path, "--name", "a"]
    res = run(*cmd, opt, tmp_path / "p.csv")
    one_line_error(res, f"{what} 1 ({X0 + 12 * DX + 5:.10g},{Y0 - 10 * DX - 5:.10g}) of ")
    assert "lies on a nodata cell (1 more" in res.output
    (tmp_path / "q.csv").write_text(f"x,y\n{X0 - 100},{Y0 - 100}\n")
    one_line_error(run(*cmd, opt, tmp_path / "q.csv"), "lies outside the DEM (24 x 24 cells)")
    with pytest.warns(SkippedPointsNote, match="2 of 4"):
        res = run(*cmd, opt, tmp_path / "p.csv", "--skip-invalid", *(["-o", tmp_path / "o.json"] * (what == "target")))
    assert res.exit_code == 0, res.output
    if what == "source":
        assert TerrainStore.open(st.path).group["sssp/b"].attrs["source_cells"] == [[1, 1], [10, 10]]
    else:
        feats = json.loads((tmp_path / "o.json").read_text())["features"]
        assert [f["properties"]["target"] for f in feats] == [0, 3]
    with pytest.warns(SkippedPointsNote):
        one_line_error(run(*cmd, opt, tmp_path / "q.csv", "--skip-invalid"), f"no {what} lies on the DEM's data")


def test_skip_note_is_one_line_from_the_entry_point(tmp_path):
    vals = random_dem((16, 16), seed=15)
    st = utm_store(tmp_path, vals)
    (tmp_path / "p.csv").write_text(f"x,y\n{X0 + 45},{Y0 - 45}\n{X0 - 100},{Y0 - 100}\n")
    proc = subprocess.run([sys.executable, "-m", "cli", "-q", "sssp", str(st.path), "--sources",
                           str(tmp_path / "p.csv"), "--skip-invalid", "--method", "incore"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"terrain: note: 1 of 2 sources of {tmp_path / 'p.csv'} left out: outside the DEM or on nodata"]


# -- many targets --------------------------------------------------------------------------------
def test_many_targets_paths_are_tight_chains_with_the_reference_cost(tmp_path):
    vals = random_dem((36, 44), seed=16, holes=0.08)
    vals[:, 30] = np.nan  # a wall: the columns right of it are not reached
    vals[5, 6] = vals[30, 20] = 3.0
    st = utm_store(tmp_path, vals, tile=8)
    res = run("-q", "sssp", st.path, "--source", f"{X0 + 6.5 * DX},{Y0 - 5.5 * DX}", "--name", "s",
              "--method", "incore")
    assert res.exit_code == 0, res.output
    ref = reference(vals.astype(np.float64), [(5, 6)], "absdiff")
    rng = np.random.default_rng(17)
    rr, cc = np.nonzero(~np.isnan(vals))
    pick = rng.choice(rr.size, 40, replace=False)
    targets = list(zip(rr[pick], cc[pick])) + [(5, 6)]
    utm = np.array([(X0 + (c + 0.5) * DX, Y0 - (r + 0.5) * DX) for r, c in targets])
    lon, lat = warp_transform(UTM33, CRS.from_epsg(4326), utm[:, 0], utm[:, 1])
    write_vector(tmp_path / "t.geojson", [wkb_point(a, b) for a, b in zip(lon, lat)], "EPSG:4326", driver="GeoJSON")
    res = run("path", st.path, "--targets", tmp_path / "t.geojson", "-o", tmp_path / "paths.geojson")
    assert res.exit_code == 0, res.output
    fc = json.loads((tmp_path / "paths.geojson").read_text())
    assert fc["crs"]["properties"]["name"] == "urn:ogc:def:crs:EPSG::32633"
    feats = fc["features"]
    assert len(feats) == len(targets)
    unreached = 0
    for k, (f, (r, c)) in enumerate(zip(feats, targets)):
        p = f["properties"]
        assert p["target"] == k and p["target_cell"] == [int(r), int(c)]
        if not np.isfinite(ref[r, c]):
            assert f["geometry"] is None and p["cost"] is None and p["cells"] == 0
            unreached += 1
            continue
        assert np.isclose(p["cost"], ref[r, c], rtol=1e-5, atol=1e-5)
        xy = np.array(f["geometry"]["coordinates"])
        cells = np.column_stack([np.floor((Y0 - xy[:, 1]) / DX), np.floor((xy[:, 0] - X0) / DX)]).astype(int)
        if p["cells"] == 1:
            cells = cells[:1]
        assert len(cells) == p["cells"] and tuple(cells[0]) == (5, 6) and tuple(cells[-1]) == (r, c)
        assert p["source_cell"] == [5, 6]
        for (r0, c0), (r1, c1) in zip(cells[:-1], cells[1:]):  # every edge tight in the reference
            k8 = [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)].index((r1 - r0, c1 - c0))
            w = edge_w("absdiff", float(vals[r0, c0]), float(vals[r1, c1]), k8)
            assert np.isclose(ref[r0, c0] + w, ref[r1, c1], rtol=1e-5, atol=1e-5)
        assert np.isclose(walk_cost(vals, cells.tolist(), "absdiff"), ref[r, c], rtol=1e-5, atol=1e-5)
    assert unreached > 0 and unreached < len(targets)
    # the library gives the same paths for --to pairs (cells), one LRU for all
    paths = trace_all(st.path, targets, name="s", cell=True)
    assert [p.reached for p in paths] == [np.isfinite(ref[r, c]) for r, c in targets]
    for p, f in zip(paths, feats):
        if p.reached:
            assert np.allclose(p.xy, f["geometry"]["coordinates"][: len(p.cells)])


def test_repeated_to_and_unreachable_targets(tmp_path):
    vals = random_dem((20, 20), seed=18)
    vals[:, 10] = np.nan
    st = utm_store(tmp_path, vals)
    sssp(st, [(2, 2)], cell=True, name="s", progress=False, method="incore")
    out = tmp_path / "p.geojson"
    res = run("path", st.path, "--cell", "--to", "4,4", "--to", "15,15", "--to", "2,2", "-o", out)
    assert res.exit_code == 0, res.output
    assert "3 targets, 2 reached" in res.output and "1 of 3 targets not reached" in res.output
    feats = json.loads(out.read_text())["features"]
    assert [f["geometry"] is None for f in feats] == [False, True, False]
    assert feats[2]["geometry"]["coordinates"] == [[X0 + 2.5 * DX, Y0 - 2.5 * DX]] * 2  # a source: two positions
    one_line_error(run("path", st.path, "--cell", "--to", "15,15"), "target 15,15 is not reachable")
    one_line_error(run("path", st.path, "--cell", "--to", "15,15", "--to", "16,16"),
                   "none of the 2 targets is reachable")
    with pytest.raises(InputError, match="not reachable"):
        from terrain_io.grid.sssp.path import trace

        trace(st, (15, 15), cell=True)
    res = run("path", st.path, "--to", "1,1", "--targets", out)
    assert res.exit_code == 2 and "not both" in res.output


def test_source_pairs_and_a_file_together(tmp_path):
    vals = random_dem((24, 30), seed=19)
    st = utm_store(tmp_path, vals)
    (tmp_path / "s.csv").write_text(f"easting,northing\n{X0 + 20.5 * DX},{Y0 - 3.5 * DX}\n")
    res = run("-q", "sssp", st.path, "--sources", tmp_path / "s.csv", "--source", "2,4", "--cell", "--name", "both",
              "--method", "incore")
    assert res.exit_code == 0, res.output
    g = TerrainStore.open(st.path).group["sssp/both"]
    assert g.attrs["source_cells"] == [[2, 4], [3, 20]] and g.attrs["source_count"] == 2
    np.testing.assert_allclose(g["distance"][:], reference(vals.astype(np.float64), [(2, 4), (3, 20)]),
                               rtol=1e-5, atol=1e-5)
    res = run("sssp", st.path, "--sources-crs", "EPSG:4326", "--source", "2,4")
    assert res.exit_code == 2 and "--sources-crs applies to --sources FILE" in res.output
    res = run("sssp", st.path)
    assert res.exit_code == 2 and "give the sources" in res.output
