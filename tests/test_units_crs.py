"""Units and CRS as GIS users expect (issue 27): the .prj beside an ASCII grid and ``convert --crs``
checked against GDAL (rasterio), the demo DEM's CRS, points in another CRS (``--source-crs``) and
errors that show the DEM's extent, a unit on every printed number, strict ``info --json``, PNG
legends, progress bars on a terminal."""
from __future__ import annotations

import json
import math
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner
from rasterio.crs import CRS

from cli.main import _register, cli
from terrain_io.convert import convert
from terrain_io.store import TerrainStore

_register()
ROOT = Path(__file__).resolve().parents[1]

ESRI_NAD83 = ('GEOGCS["GCS_North_American_1983",DATUM["D_North_American_1983",SPHEROID["GRS_1980",6378137.0,'
              '298.257222101]],PRIMEM["Greenwich",0.0],UNIT["Degree",0.0174532925199433]]')
ARCINFO_UTM17 = ("Projection    UTM\nZone          17\nDatum         NAD83\nSpheroid      GRS80\nUnits         METERS\n"
                 "Zunits        NO\nXshift        0.0\nYshift        0.0\nParameters\n")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def esri_grid(path: Path, values, x0=500000.0, y0=4000000.0, cell=30.0, prj: str | None = None) -> Path:
    rows, cols = values.shape
    body = "\n".join(" ".join(f"{v:g}" for v in row) for row in values)
    path.write_text(f"ncols {cols}\nnrows {rows}\nxllcorner {x0}\nyllcorner {y0}\ncellsize {cell}\n"
                    f"NODATA_value -9999\n{body}\n")
    if prj is not None:
        path.with_suffix(".prj").write_text(prj)
    return path


def grass_grid(path: Path, values, prj: str) -> Path:
    rows, cols = values.shape
    body = "\n".join(" ".join(f"{v:g}" for v in row) for row in values)
    path.write_text(f"north: {4000000 + 30 * rows}\nsouth: 4000000\neast: {500000 + 30 * cols}\nwest: 500000\n"
                    f"rows: {rows}\ncols: {cols}\n{body}\n")
    path.with_suffix(".prj").write_text(prj)
    return path


# -- 1. the .prj beside an ASCII grid, convert --crs ----------------------------------------------
@pytest.mark.parametrize("prj", [ESRI_NAD83, CRS.from_epsg(32617).to_wkt(), ARCINFO_UTM17],
                         ids=["esri-wkt", "ogc-wkt1", "arcinfo-keywords"])
@pytest.mark.parametrize("writer", [esri_grid, grass_grid], ids=["esri", "grass"])
def test_ascii_grid_takes_the_crs_gdal_reads_from_its_prj(tmp_path, prj, writer):
    src = writer(tmp_path / "dem.asc", np.arange(12.0).reshape(3, 4), prj=prj)
    st = TerrainStore.open(convert(src, tmp_path / "dem.zarr", tile=8, shard=2).path)
    with rasterio.open(src) as ds:
        assert ds.crs is not None
        assert CRS.from_wkt(st.crs) == ds.crs


def test_a_wkt2_prj_is_read_too(tmp_path):
    """GDAL 3.10's ASCII drivers skip a WKT2 .prj; rasterio's CRS reads it."""
    src = esri_grid(tmp_path / "dem.asc", np.ones((2, 2)), prj=CRS.from_epsg(3857).to_wkt(version="WKT2_2019"))
    st = TerrainStore.open(convert(src, tmp_path / "dem.zarr", tile=8, shard=2).path)
    assert CRS.from_wkt(st.crs) == CRS.from_epsg(3857)


def test_sample_dem_is_nad83_geographic_as_gdal_reads_it(tmp_path, sample_data):
    src = sample_data / "jacksboro_fault_dem.asc"
    st = TerrainStore.open(convert(src, tmp_path / "j.zarr", tile=64, shard=2).path)
    with rasterio.open(src) as ds:
        assert CRS.from_wkt(st.crs) == ds.crs
    assert CRS.from_wkt(st.crs).to_epsg() == 4269
    # the cell size in metres at 36.6 N: 3 arc-seconds ~ 74 m east-west, ~ 92 m north-south
    dx, dy = st.metric_cell_size
    assert 70 < dx < 78 and 90 < dy < 94


@pytest.mark.parametrize("src_kind", ["asc-with-prj", "geotiff"])
def test_convert_crs_overrides_the_files_crs(tmp_path, sample_data, src_kind):
    if src_kind == "geotiff":
        src = sample_data / "topobathy_land.tif"  # EPSG:4326 in the file
    else:
        src = esri_grid(tmp_path / "d.asc", np.ones((3, 4)), prj=ESRI_NAD83)
    out = tmp_path / "d.zarr"
    r = run("convert", src, "-o", out, "--tile", "8", "--shard", "2", "--crs", "EPSG:32617")
    assert r.exit_code == 0, r.output
    assert CRS.from_wkt(TerrainStore.open(out).crs) == CRS.from_epsg(32617)
    own = "EPSG:4326" if src_kind == "geotiff" else "NAD83"  # the ESRI WKT names no EPSG code
    assert f"terrain: note: {src}: its CRS {own} replaced by --crs EPSG:32617" in r.output, r.output


def test_convert_crs_takes_a_proj_string_and_refuses_nonsense_in_one_line(tmp_path):
    src = esri_grid(tmp_path / "d.asc", np.ones((3, 4)))
    r = run("convert", src, "-o", tmp_path / "a.zarr", "--crs", "+proj=utm +zone=33 +datum=WGS84 +units=m")
    assert r.exit_code == 0, r.output
    assert CRS.from_wkt(TerrainStore.open(tmp_path / "a.zarr").crs) == CRS.from_epsg(32633)
    r = run("convert", src, "-o", tmp_path / "b.zarr", "--crs", "EPSG:99999999")
    assert r.exit_code == 1 and not (tmp_path / "b.zarr").exists()
    assert r.output.startswith("terrain: error: --crs: not a CRS") and r.output.count("\n") == 1, r.output


def test_an_unreadable_prj_is_one_error_and_crs_overrides_it(tmp_path):
    src = esri_grid(tmp_path / "d.asc", np.ones((3, 4)), prj="this is no CRS\n")
    r = run("convert", src, "-o", tmp_path / "a.zarr")
    assert r.exit_code == 1 and "d.prj: not a CRS GDAL reads" in r.output and "--crs" in r.output, r.output
    assert not (tmp_path / "a.zarr").exists()
    r = run("-q", "convert", src, "-o", tmp_path / "a.zarr", "--crs", "EPSG:4326")
    assert r.exit_code == 0, r.output


# -- 3. points in another CRS: --source-crs / --to-crs, errors that show the DEM's extent ---------------
UTM_X0, UTM_Y0, UTM_CELL, UTM_SHAPE = 500000.0, 4000000.0, 30.0, (40, 50)


@pytest.fixture(scope="module")
def utm_store(tmp_path_factory):
    """A 40 x 50 DEM of 30 m cells in UTM zone 17N (near 36.1 N, 81 W)."""
    tmp = tmp_path_factory.mktemp("utm")
    values = np.random.default_rng(0).random(UTM_SHAPE) * 100
    src = esri_grid(tmp / "utm.asc", values, UTM_X0, UTM_Y0, UTM_CELL, prj=CRS.from_epsg(32617).to_wkt())
    return convert(src, tmp / "utm.zarr", tile=16, shard=2).path


def _numbers_after(text: str, key: str) -> list[float]:
    """The two numbers of 'spans x A .. B, y C .. D' in an error line (key x or y)."""
    part = text.split("spans x ", 1)[1] if key == "x" else text.split("spans x ", 1)[1].split(", y ", 1)[1]
    a, _, rest = part.partition(" .. ")
    return [float(a), float(rest.split(",")[0].split(" ")[0])]


def _dem_bounds():
    """(west, south, east, north) by the Esri grid's definition: lower-left corner + shape x cell size."""
    rows, cols = UTM_SHAPE
    return UTM_X0, UTM_Y0, UTM_X0 + cols * UTM_CELL, UTM_Y0 + rows * UTM_CELL


def _cell_of_lonlat(lon, lat):
    """Reference: GDAL's reprojection and the grid's geometry."""
    from rasterio.warp import transform

    (x,), (y,) = transform("EPSG:4326", "EPSG:32617", [lon], [lat])
    rows = UTM_SHAPE[0]
    return int((UTM_Y0 + rows * UTM_CELL - y) // UTM_CELL), int((x - UTM_X0) // UTM_CELL)


def test_lonlat_csv_without_crs_shows_the_extent_and_the_hint(tmp_path, utm_store):
    pts = tmp_path / "ll.csv"
    pts.write_text("lon,lat\n-80.99,36.15\n")
    r = run("sssp", utm_store, "--sources", pts)
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    west, south, east, north = _dem_bounds()
    assert _numbers_after(r.output, "x") == [west, east] and _numbers_after(r.output, "y") == [south, north]
    assert "EPSG:32617" in r.output and "--sources-crs EPSG:4326" in r.output
    r = run("sssp", utm_store, "--source", "-80.99,36.15")
    assert r.exit_code == 1 and "--source-crs EPSG:4326" in r.output, r.output


def test_utm_numbers_in_a_geojson_without_crs_name_the_extent_in_lonlat_without_runtime_warning(tmp_path, utm_store):
    import warnings

    from rasterio.warp import transform_bounds

    pts = tmp_path / "u.geojson"
    pts.write_text('{"type":"FeatureCollection","features":[{"type":"Feature","properties":{},'
                   '"geometry":{"type":"Point","coordinates":[500100.0,4000100.0]}}]}')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run("sssp", utm_store, "--sources", pts)
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert "inf" not in r.output and "(500100,4000100)" in r.output
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    west, south, east, north = transform_bounds("EPSG:32617", "EPSG:4326", *_dem_bounds(), densify_pts=21)
    np.testing.assert_allclose(_numbers_after(r.output, "x"), [west, east], atol=1e-7)
    np.testing.assert_allclose(_numbers_after(r.output, "y"), [south, north], atol=1e-7)
    assert "EPSG:4326" in r.output and "--sources-crs EPSG:" in r.output


def test_source_crs_and_to_crs_take_lonlat_on_a_projected_dem(tmp_path, utm_store):
    import shutil

    import zarr

    store = tmp_path / "s.zarr"
    shutil.copytree(utm_store, store)
    src, dst = (-80.995, 36.147), (-80.988, 36.152)
    r = run("-q", "sssp", store, "--source", "%r,%r" % src, "--source-crs", "EPSG:4326", "--name", "ll")
    assert r.exit_code == 0, r.output
    distance = zarr.open_group(store, mode="r")["sssp/ll/distance"][...]
    assert list(zip(*np.nonzero(distance == 0))) == [_cell_of_lonlat(*src)]
    out = tmp_path / "p.geojson"
    r = run("-q", "path", store, "--to", "%r,%r" % dst, "--to-crs", "EPSG:4326", "-o", out)
    assert r.exit_code == 0, r.output
    feature = json.loads(out.read_text())["features"][0]
    assert tuple(feature["properties"]["target_cell"]) == _cell_of_lonlat(*dst)
    r = run("sssp", store, "--source", "1,2", "--cell", "--source-crs", "EPSG:4326")
    assert r.exit_code != 0 and "--source-crs applies to --source X,Y" in r.output


# -- 2. the demo DEM's steps are metres ----------------------------------------------------------------
def test_sample_dem_steps_are_geodesic_metres(tmp_path, sample_data):
    """surface and walk on the NAD83 sample: one step east / north costs what the geodesic length of
    the step (pyproj's Geod on GRS80, the reference) gives, within the mid-latitude approximation."""
    import zarr
    from pyproj import Geod

    from terrain_io.grid.sssp import sssp

    st = TerrainStore.open(convert(sample_data / "jacksboro_fault_dem.asc", tmp_path / "j.zarr", tile=64,
                                   shard=2).path)
    h = st.elevation[:].astype(np.float64)
    r, c = 172, 201
    geod = Geod(ellps="GRS80")
    for weight in ("surface", "walk"):
        sssp(st, [(r, c)], weight=weight, cell=True, name=weight, progress=False)
        d = zarr.open_group(st.path, mode="r")[f"sssp/{weight}/distance"][...]
        for dr, dc in ((0, 1), (-1, 0)):
            (x0, x1), (y0, y1) = st.cell_to_map(np.array([r, r + dr]), np.array([c, c + dc]))
            step = geod.inv(x0, y0, x1, y1)[2]
            dh = h[r + dr, c + dc] - h[r, c]
            if weight == "surface":  # any way there is at least as long as the step
                expect, least = math.hypot(step, dh), step
            else:  # Tobler: 6 exp(-3.5 |dh/step + 0.05|) km/h, at most 6 km/h
                expect, least = step / (6000 / 3600 * math.exp(-3.5 * abs(dh / step + 0.05))), step / (6000 / 3600)
            assert least * 0.995 <= d[r + dr, c + dc] <= expect * 1.005


# -- 4. a unit on every printed number; info --json strict -------------------------------------------
def _refuse(constant):
    raise ValueError(f"not strict JSON: {constant}")


def test_info_prints_units_and_the_values_as_written(tmp_path, utm_store):
    values = np.array([[0.02, 99.95, 7.1], [12.5, 3.3, 42.0]])
    src = esri_grid(tmp_path / "v.asc", values, prj=CRS.from_epsg(32617).to_wkt())
    r = run("-q", "convert", src, "-o", tmp_path / "v.zarr", "--tile", "8", "--shard", "2")
    assert r.exit_code == 0, r.output
    out = run("info", tmp_path / "v.zarr").output
    assert "cell size:  30 x 30 m\n" in out and "x=500000 y=4000060 m" in out, out
    assert "values:     0.02 .. 99.95 m\n" in out, out  # the file's text, not float32 noise
    geo = esri_grid(tmp_path / "g.asc", values, x0=-84.4, y0=36.4, cell=0.0008333333, prj=ESRI_NAD83)
    run("-q", "convert", geo, "-o", tmp_path / "g.zarr", "--tile", "8", "--shard", "2")
    out = run("info", tmp_path / "g.zarr").output
    assert "cell size:  0.0008333333 x 0.0008333333 deg (" in out and " m at the mid latitude)" in out, out


def test_info_json_is_strict_json(tmp_path):
    values = np.full((4, 5), -9999.0)  # every cell nodata: min and max are NaN
    src = esri_grid(tmp_path / "n.asc", values)
    run("-q", "convert", src, "-o", tmp_path / "n.zarr", "--tile", "8", "--shard", "2")
    st = TerrainStore.open(tmp_path / "n.zarr")
    with st.write_result("mine", attrs={"level": float("nan"), "reach": [1.5, float("inf")]}) as w:  # README's API
        w.create_array("values", "float32", float("nan"))[...] = 1.0
    r = run("info", "--json", tmp_path / "n.zarr")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output, parse_constant=_refuse)
    assert doc["attrs"]["min"] is None and doc["attrs"]["max"] is None
    assert doc["results"]["mine"]["level"] is None and doc["results"]["mine"]["reach"] == [1.5, None]


def test_summaries_carry_units_and_the_clis_weight_names(tmp_path, utm_store):
    import shutil

    store = tmp_path / "s.zarr"
    shutil.copytree(utm_store, store)
    friction = np.ones(UTM_SHAPE)
    fr = esri_grid(tmp_path / "f.asc", friction, UTM_X0, UTM_Y0, UTM_CELL, prj=CRS.from_epsg(32617).to_wkt())
    r = run("sssp", store, "--source", "10,10", "--cell", "--weight", "walk", "--cost", fr, "--name", "w")
    assert r.exit_code == 0, r.output
    assert "weight walk," in r.output and "walk_friction" not in r.output
    assert " s; " in r.output.split("max distance", 1)[1], r.output
    r = run("sssp", store, "--source", "10,10", "--cell", "--name", "a")
    assert "max distance" in r.output and " m; " in r.output.split("max distance", 1)[1], r.output
    r = run("path", store, "--name", "a", "--to", "30,40", "--cell")
    assert r.exit_code == 0 and r.output.rstrip().endswith(" m"), r.output
    r = run("path", store, "--name", "w", "--to", "30,40", "--cell", "--to", "1,1")
    assert r.exit_code == 0 and r.output.rstrip().endswith(" s"), r.output
    r = run("mst", store)
    assert r.exit_code == 0 and "total weight " in r.output and " m [max]" in r.output, r.output
    r = run("fill", store)
    assert r.exit_code == 0 and " m^3," in r.output.split("filled volume", 1)[1], r.output
    assert "m for absdiff" in run("sssp", "--help").output


# -- 5. PNG pictures: depths in blues, a legend on every picture ----------------------------------------
BLUES_SHALLOW, BLUES_DEEP = (0xC6, 0xDB, 0xEF), (0x08, 0x30, 0x6B)  # ColorBrewer "Blues", light and dark ends
INK = (40, 40, 40)


def _png(path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a picture has no geotransform
        with rasterio.open(path) as ds:
            return ds.read().transpose(1, 2, 0)


@pytest.fixture(scope="module")
def pitted_store(tmp_path_factory):
    """A 60 x 70 DEM with nested pits (a bowl with noise) in UTM, filled, with an MST and an SSSP result."""
    from terrain_io.grid.fill import fill
    from terrain_io.grid.mst import mst
    from terrain_io.grid.sssp import sssp

    tmp = tmp_path_factory.mktemp("png")
    rng = np.random.default_rng(5)
    r, c = np.mgrid[:60, :70]
    values = 50 + 0.02 * ((r - 30) ** 2 + (c - 35) ** 2) + rng.random((60, 70)) * 6
    values[:3, :5] = -9999
    src = esri_grid(tmp / "p.asc", values, prj=CRS.from_epsg(32617).to_wkt())
    st = TerrainStore.open(convert(src, tmp / "p.zarr", tile=16, shard=2).path)
    fill(st, progress=False)
    mst(st, progress=False)
    sssp(st, [(30, 35)], weight="walk", cell=True, name="w", progress=False)
    return st


def test_depth_picture_in_blues_with_its_ramp(tmp_path, pitted_store):
    import zarr

    from terrain_io.export import export

    depth = zarr.open_group(pitted_store.path, mode="r")["fill/depth"][...].astype(np.float64)
    img = _png(export(pitted_store.path, "fill/depth", tmp_path / "d.png"))
    rows, cols = depth.shape
    assert img.shape[0] > rows
    pic, band = img[:rows, :cols], img[rows:]
    lakes = depth > 0
    np.testing.assert_array_equal(pic[..., 3] > 0, lakes)  # dry land and nodata clear
    rgb = pic[lakes][:, :3].astype(int)
    assert (rgb[:, 2] >= rgb[:, 1]).all() and (rgb[:, 1] >= rgb[:, 0]).all()  # blues: B >= G >= R
    lo, hi = np.percentile(depth[lakes], [2, 98])
    assert (pic[lakes & (depth >= hi)][:, :3] == BLUES_DEEP).all()
    assert (pic[lakes & (depth <= lo)][:, :3] == BLUES_SHALLOW).all()
    colours = {tuple(p) for p in band[..., :3].reshape(-1, 3)}
    assert BLUES_DEEP in colours and BLUES_SHALLOW in colours and INK in colours  # the ramp and its text
    assert (band[..., 3] == 255).all()


@pytest.mark.parametrize("array", ["elevation", "fill/elevation", "fill/depth", "fill/depression", "mst/edges",
                                   "sssp/w/distance", "sssp/w/predecessor"])
def test_every_png_has_a_legend_band_below_the_picture(tmp_path, pitted_store, array):
    from terrain_io.export import export

    img = _png(export(pitted_store.path, array, tmp_path / "x.png"))
    rows, cols = pitted_store.shape
    band = img[rows:]
    assert band.shape[0] >= 30 and img.shape[1] >= cols and (band[..., 3] == 255).all()
    ink = (band[..., :3] == INK).all(axis=-1)
    assert ink.sum() > 100  # a title (and ticks or labels) written in the band
    assert ink[: band.shape[0] // 2].any() and ink[band.shape[0] // 2 :].any()


def test_legend_font_draws_the_characters_it_needs():
    from terrain_io.legend import text_mask

    needed = "0123456789abcdefghijklmnopqrstuvwxyz.,-+^()/:;=%<>_\u2264\u2265"
    for ch in needed:
        assert text_mask(ch, 1).any(), ch
    shapes = {text_mask(ch, 1).tobytes() for ch in needed}
    assert len(shapes) == len(needed)  # no two glyphs alike
    assert text_mask("ab", 3).shape == (24, 36)


# -- 6. progress bars on a terminal, none with -q or into a pipe ---------------------------------------
def _run_with_stderr_on_a_pty(args, cwd, sized: bool, timeout: float = 300) -> tuple[int, bytes]:
    """Run ``terrain ARGS`` with stderr on a fresh pseudo-terminal (unsized, as pty.openpty leaves it,
    or 100 x 30): (exit status, what it wrote there)."""
    import fcntl
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    if sized:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("COLUMNS", None), env.pop("LINES", None)
    proc = subprocess.Popen([sys.executable, "-m", "cli", *map(str, args)], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its side
                break
            if not data:
                break
            out += data
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=60), out


@pytest.fixture(scope="module")
def bar_store(tmp_path_factory):
    from terrain_io.synth import synthesize

    tmp = tmp_path_factory.mktemp("bars")
    return synthesize(tmp / "s.zarr", 300, seed=1, tile=32, shard=2).path


@pytest.mark.parametrize("sized", [False, True], ids=["unsized-pty", "sized-pty"])
def test_a_progress_bar_appears_on_a_terminal(tmp_path, bar_store, sized):
    code, err = _run_with_stderr_on_a_pty(["sssp", bar_store, "--source", "5,5", "--cell", "--method", "incore",
                                           "--name", "bar"], tmp_path, sized)
    assert code == 0, err
    assert b"sssp solve" in err and b"%|" in err and b"\r" in err, err


def test_no_progress_bar_with_q_or_into_a_pipe(tmp_path, bar_store):
    code, err = _run_with_stderr_on_a_pty(["-q", "sssp", bar_store, "--source", "5,5", "--cell", "--method",
                                           "incore", "--name", "quiet"], tmp_path, sized=True)
    assert code == 0 and b"%|" not in err, err
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "cli", "sssp", str(bar_store), "--source", "5,5", "--cell", "--method",
                        "incore", "--name", "piped"], env=env, capture_output=True, timeout=300)
    assert r.returncode == 0 and b"%|" not in r.stderr and b"\r" not in r.stderr, r.stderr


def test_a_crs_given_for_points_on_a_dem_without_one_is_noted(tmp_path):
    from terrain_io.errors import TerrainNote
    from terrain_io.points import from_coordinates

    st = TerrainStore.from_array(tmp_path / "n.zarr", np.ones((10, 10), np.float32), tile=8, shard=2,
                                 attrs={"transform": [0.0, 1.0, 0.0, 10.0, 0.0, -1.0], "cell_size": [1.0, 1.0]})
    with pytest.warns(TerrainNote, match="the DEM has no CRS"):
        pts = from_coordinates(st, [(2.5, 7.5)], what="source", crs="EPSG:4326")
    assert pts.cells.tolist() == [[2, 2]]
