"""Issue 30's polygons out of core (``watershed``/``basins -o``, :mod:`terrain_io.grid.hydro.polygons`):
written as GDAL's polygonize emits them, never all in memory. The features equal those of
``rasterio.features.shapes`` on the same labels, geometry by geometry per id (ids ascending, the parts
of an id in GDAL's order), from a raster in memory and from one on disk; fields per id; the CRS kept;
every format read back by readers that are not rasterio (the GeoPackage by SQLite and the format's
definition, GeoJSON by ``json``, the rest by pyogrio); a run cut short leaves no output; and the
process grows by far less than the polygons it writes."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import hydro_dem, utm_store
from terrain_io.errors import OutputError
from terrain_io.store import TerrainStore

_register()
pyogrio = pytest.importorskip("pyogrio")
pyproj = pytest.importorskip("pyproj")
pytestmark = pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")
TRANSFORM = (500000.0, 30.0, 0.0, 4100000.0, 0.0, -30.0)  # references.utm_store's grid
NEEDS_PROC = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux peak-RSS reset")


def _crafted_labels(rows: int = 70, cols: int = 90) -> np.ndarray:
    """Labels with what a tracer can get wrong: a region with a hole holding another region, one id
    in parts that touch only at corners (8-connected: one feature; apart: two), a region spanning
    every row (open across all shards), nodata gaps (0), ids with no cell, jagged borders."""
    rng = np.random.default_rng(7)
    r = np.arange(rows)[:, None] + rng.integers(-2, 3, (rows, cols))
    c = np.arange(cols)[None, :] + rng.integers(-2, 3, (rows, cols))
    lab = (np.clip(r, 0, rows - 1) // 12 * 10 + np.clip(c, 0, cols - 1) // 15 + 1).astype(np.uint32)
    lab[:, 40:43] = 200  # a band over every row
    lab[5:25, 50:70] = 201  # a ring ...
    lab[10:20, 55:65] = 202  # ... around a region ...
    lab[13:16, 58:61] = 0  # ... around a gap
    lab[30, 5] = lab[31, 6] = lab[32, 7] = 203  # a diagonal chain: one feature, 8-connected
    lab[40, 5] = lab[40, 8] = 203  # and two parts apart
    lab[rng.random((rows, cols)) < 0.01] = 0
    lab[lab == 13] = 0  # an id with no cell
    return lab


def _store(path, lab: np.ndarray, crs="UTM33", tile: int = 8, shard: int = 2) -> TerrainStore:
    st = utm_store(path, np.zeros(lab.shape, np.float32), crs=crs, tile=tile, shard=shard)
    with st.write_result("basins") as w:
        w.create_array("label", np.uint32, 0)[...] = lab
    return st


def _fields(lab: np.ndarray) -> dict:
    n = int(lab.max())
    cells = np.bincount(lab.ravel(), minlength=n + 1)[1:].astype(np.int64)
    return {"cells": cells, "area_m2": cells * 900.0, "third": np.arange(n) / 3.0}


def _rings(wkb: bytes) -> list[np.ndarray]:
    """A Polygon's rings from ISO WKB, by the format's definition (byte order, type 3, ring counts)."""
    order = "<" if wkb[0] == 1 else ">"
    assert int(np.frombuffer(wkb[1:5], order + "u4")[0]) == 3
    nrings, off, rings = int(np.frombuffer(wkb[5:9], order + "u4")[0]), 9, []
    for _ in range(nrings):
        n = int(np.frombuffer(wkb[off: off + 4], order + "u4")[0])
        rings.append(np.frombuffer(wkb[off + 4: off + 4 + 16 * n], order + "f8").reshape(n, 2))
        off += 4 + 16 * n
    assert off == len(wkb)
    return rings


def _gpkg(path) -> tuple[str, list[tuple[int, list, dict]]]:
    """The one layer of a GeoPackage read with SQLite alone (OGC 12-128r18): its CRS's definition, and
    (id, rings, fields) a feature in fid order, the geometry's GeoPackage header stripped (req. 19:
    magic "GP", version, flags whose bits 1-3 give the envelope's size)."""
    db = sqlite3.connect(path)
    try:
        table, column, srs = db.execute("SELECT table_name, column_name, srs_id FROM gpkg_geometry_columns").fetchone()
        wkt = db.execute("SELECT definition FROM gpkg_spatial_ref_sys WHERE srs_id = ?", (srs,)).fetchone()[0]
        cur = db.execute(f'SELECT * FROM "{table}" ORDER BY fid')
        names = [d[0] for d in cur.description]
        feats = []
        for row in cur:
            rec = dict(zip(names, row))
            blob = rec.pop(column)
            assert blob[:2] == b"GP" and int.from_bytes(blob[4:8], "little" if blob[3] & 1 else "big") == srs
            env = {0: 0, 1: 32, 2: 48, 3: 48, 4: 64}[(blob[3] >> 1) & 7]
            rec.pop("fid")
            feats.append((rec.pop("id"), _rings(bytes(blob[8 + env:])), rec))
    finally:
        db.close()
    return wkt, feats


def _pyogrio(path) -> tuple[str | None, list[tuple[int, list, dict]]]:
    meta, _, geometry, values = pyogrio.raw.read(path)
    names = list(meta["fields"])
    cols = {k: v for k, v in zip(names, values)}
    return meta["crs"], [(int(cols["id"][i]), _rings(g), {k: cols[k][i].item() for k in names if k != "id"})
                         for i, g in enumerate(geometry)]


def _shapes(lab: np.ndarray) -> dict[int, list[list[np.ndarray]]]:
    """rasterio.features.shapes on the labels (8-connected), the rings of each part by id."""
    from affine import Affine
    from rasterio import features

    out: dict[int, list] = {}
    for geom, value in features.shapes(lab.astype(np.int32), mask=lab > 0, connectivity=8,
                                       transform=Affine.from_gdal(*TRANSFORM)):
        out.setdefault(int(value), []).append([np.asarray(r, np.float64) for r in geom["coordinates"]])
    return out


def _unoriented(ring: np.ndarray) -> list[tuple]:
    """A closed ring's vertices from its least one on, in the direction of the lesser neighbour:
    equal for a ring and its reverse (a Shapefile's outer rings turn clockwise, GDAL's the other way)."""
    pts = [tuple(p) for p in ring[:-1].tolist()]
    k = pts.index(min(pts))
    pts = pts[k:] + pts[:k]
    return pts if pts[1] <= pts[-1] else pts[:1] + pts[:0:-1]


def _check(feats, lab: np.ndarray, fields: dict, digits: int | None = None, ordered: bool = True) -> None:
    """Features (id, rings, fields) equal to rasterio's shapes per id, ids ascending, fields by id;
    for a Shapefile (``digits``) to its 15 significant digits of a double and its rings' orientation;
    not ``ordered`` (FlatGeobuf: its spatial index's order), the parts of an id in any order."""
    ids = [i for i, _, _ in feats]
    assert ids == sorted(ids) or not ordered
    got: dict[int, list] = {}
    for i, rings, rec in feats:
        got.setdefault(i, []).append(rings)
        want = {k: v[i - 1].item() for k, v in fields.items()}
        if digits:
            rec, want = ({k: float(f"{v:.{digits}g}") for k, v in d.items()} for d in (rec, want))
        assert rec == want, i
    want = _shapes(lab)
    assert sorted(got) == sorted(want) == np.unique(lab[lab > 0]).tolist()
    if not ordered:
        got, want = ({i: sorted(p, key=lambda rings: rings[0][0].tolist()) for i, p in d.items()} for d in (got, want))
    for i, parts in want.items():
        assert len(got[i]) == len(parts), i
        for a, b in zip(got[i], parts):
            if digits:
                a, b = ([_unoriented(r) for r in rings] for rings in (a, b))
            assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b)), i


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    lab = _crafted_labels()
    return _store(tmp_path_factory.mktemp("polygons_ooc") / "c.zarr", lab), lab


@pytest.mark.parametrize("route", ["held", "disk"])
def test_polygons_equal_rasterio_shapes_per_id_with_fields_and_crs(crafted, tmp_path, route):
    from terrain_io.grid.hydro.pipeline import write_polygons

    st, lab = crafted
    fields = _fields(lab)
    out = tmp_path / "p.gpkg"
    write_polygons(st, lab if route == "held" else "basins/label", fields, out)
    wkt, feats = _gpkg(out)  # SQLite and the format's definition: no GDAL
    _check(feats, lab, fields)
    assert pyproj.CRS.from_wkt(wkt) == pyproj.CRS.from_epsg(32633)
    crs, again = _pyogrio(out)  # pyogrio's own GDAL
    assert pyproj.CRS.from_user_input(crs) == pyproj.CRS.from_epsg(32633)
    assert len(again) == len(feats) and all(a[0] == b[0] and a[2] == b[2] and all(
        np.array_equal(x, y) for x, y in zip(a[1], b[1])) for a, b in zip(again, feats))
    assert not [p for p in st.path.iterdir() if "scratch" in p.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.gpkg"]


@pytest.mark.parametrize("suffix", [".geojson", ".shp", ".fgb"])
def test_polygons_in_every_format(crafted, tmp_path, suffix):
    """GeoJSON read by ``json`` (RFC 7946's structure), Shapefile and FlatGeobuf (the latter written
    by pyogrio's libgdal: rasterio's wheels lack its driver) by pyogrio: the same features (a
    FlatGeobuf's in the order of its spatial index)."""
    from terrain_io.grid.hydro.pipeline import write_polygons

    st, lab = crafted
    fields = _fields(lab)
    out = tmp_path / f"p{suffix}"
    write_polygons(st, "basins/label", fields, out)
    if suffix == ".geojson":
        doc = json.loads(out.read_text())
        feats = [(f["properties"].pop("id"), [np.asarray(r, np.float64) for r in f["geometry"]["coordinates"]],
                  f["properties"]) for f in doc["features"]]
        assert all(f["geometry"]["type"] == "Polygon" for f in doc["features"])
        assert pyproj.CRS.from_user_input(doc["crs"]["properties"]["name"]) == pyproj.CRS.from_epsg(32633)
    else:
        crs, feats = _pyogrio(out)
        assert pyproj.CRS.from_user_input(crs) == pyproj.CRS.from_epsg(32633)
    _check(feats, lab, fields, 15 if suffix == ".shp" else None, ordered=suffix != ".fgb")


def test_watershed_polygons_through_the_cli_carry_their_fields(tmp_path, monkeypatch):
    """``watershed -o`` beyond the budget (the label raster from disk): outlet cells as given, cells
    and areas counted from the label raster, one feature set per outlet."""
    from terrain_io.grid.hydro import pipeline as P

    path = tmp_path / "a.zarr"
    utm_store(path, hydro_dem(4, shape=(60, 75)).astype(np.float32), tile=8, shard=2)
    assert CliRunner().invoke(cli, ["flow", str(path), "--condition", "fill", "--device", "cpu"]).exit_code == 0
    monkeypatch.setattr(P, "POLYGON_BYTES", 2**40)
    out = tmp_path / "w.gpkg"
    outlets = [(30, 35), (50, 10), (10, 65)]
    res = CliRunner().invoke(cli, ["watershed", str(path), *sum((["--cell", f"{r},{c}"] for r, c in outlets), []),
                                   "-o", str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    lab = np.asarray(TerrainStore.open(path).group["watershed/default/label"][...])
    cells = np.bincount(lab.ravel(), minlength=4)[1:]
    _, feats = _gpkg(out)
    assert sorted({i for i, _, _ in feats}) == [i for i in (1, 2, 3) if cells[i - 1]]
    for i, _, rec in feats:
        assert rec == {"cells": cells[i - 1], "area_m2": cells[i - 1] * 900.0, "outlet_row": outlets[i - 1][0],
                       "outlet_col": outlets[i - 1][1]}


def test_a_gdal_error_is_one_line_and_leaves_nothing(crafted, tmp_path, monkeypatch, capfd):
    """GDAL's error (here: the fields' table missing from the join) is the error's one line, printed
    by nothing else (GDAL's own handler writes to stderr); no output, no temporary, no scratch."""
    from terrain_io.grid.hydro import polygons
    from terrain_io.grid.hydro.pipeline import write_polygons

    st, lab = crafted
    monkeypatch.setattr(polygons, "_field_table", lambda *a: None)  # the join's table missing: GDAL fails
    out = tmp_path / "p.gpkg"
    with pytest.raises(OutputError) as err:
        write_polygons(st, "basins/label", _fields(lab), out)
    assert str(err.value).startswith(f"{out}: cannot write it as GPKG: GDAL ") and "\n" not in str(err.value)
    assert str(err.value).endswith("no such table: fields") and "partial" not in str(err.value)
    assert capfd.readouterr().err == ""
    assert list(tmp_path.iterdir()) == [] and not [p for p in st.path.iterdir() if "scratch" in p.name]


_INTERRUPT = """
import os, signal, sys, time
import numpy as np
from terrain_io import interrupts
from terrain_io.grid.hydro import polygons
from terrain_io.grid.hydro.pipeline import write_polygons
from terrain_io.store import TerrainStore

phase, path, out = sys.argv[1:4]
gdal = polygons._rasterio_gdal()
name = {"trace": "GDALPolygonize", "translate": "GDALVectorTranslate"}[phase]
call = getattr(gdal, name)

def cut(*args):  # Ctrl-C while GDAL works (in its thread), before its first feature; a long call
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    return call(*args)

setattr(gdal, name, cut)
interrupts.install()
write_polygons(TerrainStore.open(path), "basins/label", {"cells": np.ones(300, np.int64)}, out)
print("not reached")
"""


@pytest.mark.parametrize("phase", ["trace", "translate"])
def test_an_interrupted_write_leaves_no_output(crafted, tmp_path, phase):
    """Ctrl-C while GDAL traces or copies (a call of 30 s here): the run ends at once, not when GDAL
    returns (GDAL works in a thread, this one waits in Python, where the handler runs), exit 130
    with one line, no output, no temporary beside it, no scratch in the store."""
    st, _ = crafted
    out = tmp_path / "p.gpkg"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT, phase, str(st.path), str(out)], capture_output=True,
                          text=True, timeout=120)
    assert time.perf_counter() - t0 < 20
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "terrain: interrupted\n"), proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
    assert not [p for p in st.path.iterdir() if "scratch" in p.name]


def test_polygonize_writes_each_polygon_as_its_scan_passes_it(tmp_path, monkeypatch):
    """GDAL's polygonize (>= 3.7, two-arm chains) writes a polygon into the on-disk layer once the scan
    has passed its last row: halfway down 512^2 labels of jagged 8-cell regions about half the
    polygons are in the layer (counted there from the progress callback, between rows)."""
    import ctypes

    from rasterio import _base

    from terrain_io.grid.hydro import polygons
    from terrain_io.grid.hydro.pipeline import write_polygons

    lab = _jagged(512, 8)
    st = _store(tmp_path / "j.zarr", lab, tile=64, shard=2)
    count = ctypes.CDLL(_base.__file__).OGR_L_GetFeatureCount
    count.restype, count.argtypes = ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int]
    gdal = polygons._rasterio_gdal()
    seen, call = [], gdal.GDALPolygonize

    def spy(band, mask, layer, field, options, progress, arg):
        def watch(done, message, a):
            seen.append((done, count(layer, 1)))
            return progress(done, message, a)

        return call(band, mask, layer, field, options, polygons._PROGRESS(watch), arg)

    monkeypatch.setattr(gdal, "GDALPolygonize", spy)
    out = tmp_path / "p.gpkg"
    write_polygons(st, "basins/label", {"cells": np.ones(int(lab.max()), np.int64)}, out)
    total = pyogrio.read_info(out)["features"]
    half = next(n for done, n in seen if done >= 0.5)
    assert 0.4 * total < half < 0.6 * total, (half, total)
    assert seen[-1][1] == total


_GROWN = """
import json, sys
import numpy as np
from terrain_io.memory import current_rss, peak_rss, reset_peak_rss
from terrain_io.store import TerrainStore
from terrain_io.grid.hydro.pipeline import write_polygons

def run(path, regions, out):
    write_polygons(TerrainStore.open(path), "basins/label", {"cells": np.arange(int(regions), dtype=np.int64)}, out)

run(*sys.argv[3:5], sys.argv[5] + ".warm.gpkg")  # the warm-up: GDAL's drivers, SQLite, the imports
reset_peak_rss()
base = current_rss()
run(*sys.argv[1:3], sys.argv[5])
print(json.dumps({"grown": peak_rss() - base}))
"""


def _jagged(n: int, side: int) -> np.ndarray:
    """Square regions of ``side`` cells with jagged borders (+-3 cells): many vertices, few open at once."""
    rng = np.random.default_rng(0)
    r = np.clip(np.arange(n)[:, None] + rng.integers(-3, 4, (n, n)), 0, n - 1) // side
    c = np.clip(np.arange(n)[None, :] + rng.integers(-3, 4, (n, n)), 0, n - 1) // side
    return (r * (-(-n // side)) + c + 1).astype(np.uint32)


@NEEDS_PROC
def test_polygons_out_of_core_hold_far_less_than_they_write(tmp_path):
    """A fresh process traces 2048^2 labels of 65,536 jagged regions (440 k polygons) from disk, 188 MiB
    of GeoPackage: after a warm-up its peak RSS grows by less than a third of the file (40 MiB: the
    polygons open at once, GDAL's 16 MB block cache, SQLite's pages, the spatial index GDAL builds in
    memory, ~40 bytes a polygon). The route that gathered the polygons grew by 456 MiB (2-core VM)."""
    args = []
    for name, n in (("big", 2048), ("warm", 256)):
        lab = _jagged(n, 8)
        args += [_store(tmp_path / f"{name}.zarr", lab, tile=64, shard=4).path, int(lab.max())]
    out = tmp_path / "p.gpkg"
    proc = subprocess.run([sys.executable, "-c", _GROWN, *map(str, args), str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grown = json.loads(proc.stdout.strip().splitlines()[-1])["grown"]
    size = out.stat().st_size
    assert size > 150 << 20
    assert grown < size / 3, (grown / 2**20, size / 2**20)
