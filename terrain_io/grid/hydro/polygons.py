"""Polygons of a label raster written to the output file as GDAL traces them (``watershed`` and
``basins -o``; issue 30: the vector writers never hold the whole network in memory).

Three steps, all in GDAL -- the libgdal that rasterio loads, called through ctypes, since rasterio's
Python API (``features.shapes``) gathers every polygon in a memory layer first:

1. The labels as a band whose nodata is 0, so that its nodata mask is polygonize's mask: a MEM
   dataset over the NumPy array (no copy) where the labels are held, else a GeoTIFF of them written
   shard by shard (``pipeline._label_tiffs``).
2. ``GDALPolygonize`` (8-connected; GDAL >= 3.7 traces by the two-arm chains of Teng, Wang & Liu,
   "An efficient algorithm for raster-to-vector data conversion", Geographic Information Sciences
   14(1), 2008, and emits each polygon when its scan passes the polygon's last row) writes every
   polygon at once into a GeoPackage layer in a scratch folder, one transaction: memory holds the
   polygons still open on the current row, never all of them.
3. The fields (one row an id) go into a table of the same GeoPackage (Python's sqlite3: the doubles
   bound exactly), and ``GDALVectorTranslate`` copies their join, ``ORDER BY id, fid`` along an index
   (no sort in memory), into OUT's format under a temporary name renamed when complete
   (:func:`...atomic.atomic_files`). FlatGeobuf, which rasterio's wheels leave out, is written the
   same way by pyogrio's libgdal.

The features are those of ``rasterio.features.shapes`` on the same labels: ids ascending, the parts
of one id (regions touching only at corners are one feature a part) in GDAL's order of emission.
"""
from __future__ import annotations

import ctypes
import functools
import sqlite3
from pathlib import Path

import numpy as np

from ...atomic import atomic_files
from ...errors import OutputError
from ...vectors import DRIVERS, SHAPEFILE_SIDE

GDT_UINT32 = 4
WKB_POLYGON = 3
OFT_INTEGER64, OFT_REAL = 12, 2
OF_RASTER, OF_VECTOR = 0x02, 0x04
TRADITIONAL_GIS_ORDER = 0  # x = easting / longitude, as the rasters' geotransforms have it
FIELD_ROWS = 65536  # rows of the fields' table bound a batch (their Python numbers are what is held)
LAYER = "polygons"  # the scratch layer; its table lives only in the scratch GeoPackage

_P, _S = ctypes.c_void_p, ctypes.c_char_p
_PROGRESS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p)
_SIGNATURES = {  # name: (restype, argtypes) of the GDAL C API functions used
    "GDALAllRegister": (None, []),
    "GDALGetDriverByName": (_P, [_S]),
    "GDALCreate": (_P, [_P, _S, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, _P]),
    "GDALAddBand": (ctypes.c_int, [_P, ctypes.c_int, _P]),
    "GDALOpenEx": (_P, [_S, ctypes.c_uint, _P, _P, _P]),
    "GDALClose": (ctypes.c_int, [_P]),
    "GDALGetRasterBand": (_P, [_P, ctypes.c_int]),
    "GDALGetMaskBand": (_P, [_P]),
    "GDALSetGeoTransform": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_double)]),
    "GDALSetRasterNoDataValue": (ctypes.c_int, [_P, ctypes.c_double]),
    "GDALDatasetCreateLayer": (_P, [_P, _S, _P, ctypes.c_int, _P]),
    "GDALDatasetStartTransaction": (ctypes.c_int, [_P, ctypes.c_int]),
    "GDALDatasetCommitTransaction": (ctypes.c_int, [_P]),
    "OGR_Fld_Create": (_P, [_S, ctypes.c_int]),
    "OGR_Fld_Destroy": (None, [_P]),
    "OGR_L_CreateField": (ctypes.c_int, [_P, _P, ctypes.c_int]),
    "OSRNewSpatialReference": (_P, [_S]),
    "OSRSetFromUserInput": (ctypes.c_int, [_P, _S]),
    "OSRSetAxisMappingStrategy": (None, [_P, ctypes.c_int]),
    "OSRRelease": (None, [_P]),
    "GDALPolygonize": (ctypes.c_int, [_P, _P, _P, ctypes.c_int, _P, _PROGRESS, _P]),
    "GDALVectorTranslateOptionsNew": (_P, [_P, _P]),
    "GDALVectorTranslateOptionsSetProgress": (None, [_P, _PROGRESS, _P]),
    "GDALVectorTranslateOptionsFree": (None, [_P]),
    "GDALVectorTranslate": (_P, [_S, _P, ctypes.c_int, ctypes.POINTER(_P), _P, ctypes.POINTER(ctypes.c_int)]),
    "CPLErrorReset": (None, []),
    "CPLGetLastErrorMsg": (_S, []),
}


class _Gdal:
    """The functions of :data:`_SIGNATURES` typed on one libgdal (ctypes releases the GIL in each call)."""

    def __init__(self, lib: ctypes.CDLL):
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name, fn)
        self.GDALAllRegister()

    def error(self) -> str:
        """GDAL's last error message, its first line."""
        return ((self.CPLGetLastErrorMsg() or b"").decode(errors="replace").splitlines() or ["(no message)"])[0]


@functools.cache
def _rasterio_gdal() -> _Gdal:
    """rasterio's libgdal: dlsym on its extension module finds the symbols of the libraries it links."""
    from rasterio import _base

    return _Gdal(ctypes.CDLL(_base.__file__))


@functools.cache
def _pyogrio_gdal() -> _Gdal:
    from pyogrio import _ogr

    return _Gdal(ctypes.CDLL(_ogr.__file__))


def _writer_for(driver: str) -> _Gdal:
    """The libgdal that writes ``driver``: rasterio's, else (FlatGeobuf) pyogrio's."""
    gdal = _rasterio_gdal()
    if gdal.GDALGetDriverByName(driver.encode()):
        return gdal
    try:
        gdal = _pyogrio_gdal()
    except ImportError:
        gdal = None
    if gdal is None or not gdal.GDALGetDriverByName(driver.encode()):
        raise OutputError(f"rasterio's GDAL cannot write {driver}" + ("" if gdal else ": install pyogrio"))
    return gdal


def _strings(items) -> ctypes.Array:
    """A NULL-terminated ``char **`` (GDAL's string lists)."""
    return (_S * (len(items) + 1))(*[str(s).encode() for s in items], None)


class _Progress:
    """A GDAL progress callback: moves ``bar`` to the fraction done, and lets Python act between rows
    (Ctrl-C's handler, which ends the run and removes the temporaries); an exception it raises stops
    GDAL and is raised again when the call returns (:meth:`check`)."""

    def __init__(self, bar, total: int):
        self.bar, self.total, self.stop = bar, total, None
        self.fn = _PROGRESS(self._call)

    def _call(self, done, _message, _arg):
        try:
            self.bar.update(int(done * self.total) - self.bar.n)
            return 1
        except BaseException as exc:  # noqa: BLE001 -- a callback cannot raise through C: kept for check()
            self.stop = exc
            return 0

    def check(self):
        if self.stop is not None:
            raise self.stop


def write(label, transform, crs: str | None, fields: dict, out, overwrite: bool, scratch: Path,
          progress: bool = False) -> Path:
    """The regions of ``label`` (uint32 labels, 0 none: an array, or a GeoTIFF path whose nodata is
    0) as polygons in ``out``'s format (module docstring), with ``id`` and ``fields`` (name -> array
    indexed by id - 1; integers as 64-bit integers, the rest as doubles), in the CRS ``crs``;
    ``scratch``: a folder for the GeoPackage the polygons are traced into."""
    from ...progress import progress_bar

    out = Path(out)
    driver = DRIVERS[out.suffix.lower()]
    gdal = _rasterio_gdal()
    traced = scratch / "polygons.gpkg"

    def fail(what: str):
        raise OutputError(f"{out}: cannot write it as {driver}: GDAL {what}: {gdal.error()}")

    gdal.CPLErrorReset()
    if isinstance(label, np.ndarray):
        held = np.ascontiguousarray(label, np.uint32)
        src = gdal.GDALCreate(gdal.GDALGetDriverByName(b"MEM"), b"", held.shape[1], held.shape[0], 0, GDT_UINT32,
                              None)
        if not src or gdal.GDALAddBand(src, GDT_UINT32, _strings([f"DATAPOINTER={held.ctypes.data}",
                                                                  "PIXELOFFSET=4", f"LINEOFFSET={held.strides[0]}"])):
            fail("MEM dataset")
        rows = held.shape[0]
    else:
        src = gdal.GDALOpenEx(str(label).encode(), OF_RASTER, None, None, None)
        if not src:
            fail("open")
        rows = None
    srs = None
    try:
        band = gdal.GDALGetRasterBand(src, 1)
        if transform is not None and gdal.GDALSetGeoTransform(src, (ctypes.c_double * 6)(*transform)):
            fail("geotransform")
        if gdal.GDALSetRasterNoDataValue(band, 0.0):
            fail("nodata")
        if crs:
            srs = gdal.OSRNewSpatialReference(None)
            if gdal.OSRSetFromUserInput(srs, crs.encode()):
                fail("CRS")
            gdal.OSRSetAxisMappingStrategy(srs, TRADITIONAL_GIS_ORDER)
        with progress_bar(progress, rows or 100, "polygons", unit="row" if rows else "%") as bar:
            _trace(gdal, band, srs, traced, _Progress(bar, rows or 100), fail)
    finally:
        if srs:
            gdal.OSRRelease(srs)
        gdal.GDALClose(src)
    _field_table(traced, fields)
    return _translate(traced, fields, out, driver, overwrite, progress)


def _trace(gdal: _Gdal, band, srs, path: Path, progress: _Progress, fail) -> None:
    """GDALPolygonize of ``band`` (its nodata mask) into a new GeoPackage ``path``: layer
    :data:`LAYER` with the field ``id``, no spatial index, one transaction."""
    ds = gdal.GDALCreate(gdal.GDALGetDriverByName(b"GPKG"), str(path).encode(), 0, 0, 0, 0, None)
    if not ds:
        fail("create")
    try:
        layer = gdal.GDALDatasetCreateLayer(ds, LAYER.encode(), srs, WKB_POLYGON,
                                            _strings(["SPATIAL_INDEX=NO", "GEOMETRY_NAME=geom", "FID=fid"]))
        if not layer:
            fail("layer")
        field = gdal.OGR_Fld_Create(b"id", OFT_INTEGER64)
        err = gdal.OGR_L_CreateField(layer, field, 1)
        gdal.OGR_Fld_Destroy(field)
        if err or gdal.GDALDatasetStartTransaction(ds, 0):
            fail("field")
        err = gdal.GDALPolygonize(band, gdal.GDALGetMaskBand(band), layer, 0, _strings(["8CONNECTED=8"]), progress.fn,
                                  None)
        progress.check()
        if err or gdal.GDALDatasetCommitTransaction(ds):
            fail("polygonize")
    finally:
        if gdal.GDALClose(ds):
            fail("close")


def _field_table(path: Path, fields: dict) -> None:
    """The fields as table ``fields`` (id INTEGER PRIMARY KEY) of the GeoPackage ``path``, and an
    index of the polygons' ids (their order in the output)."""
    names = list(fields)
    types = ["INTEGER" if np.asarray(fields[k]).dtype.kind in "iub" else "REAL" for k in names]
    n = len(fields[names[0]]) if names else 0
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE INDEX polygons_id ON {LAYER} (id)")
        db.execute("CREATE TABLE fields (id INTEGER PRIMARY KEY" + "".join(f', "{k}" {t}' for k, t in zip(names, types))
                   + ")")
        insert = f"INSERT INTO fields VALUES (?{', ?' * len(names)})"
        for s in range(0, n, FIELD_ROWS):
            e = min(s + FIELD_ROWS, n)
            cols = [np.asarray(fields[k][s:e]).tolist() for k in names]
            db.executemany(insert, zip(range(s + 1, e + 1), *cols))
    db.close()


def _translate(traced: Path, fields: dict, out: Path, driver: str, overwrite: bool, progress: bool) -> Path:
    """``GDALVectorTranslate`` of the polygons joined with their fields into ``out`` (its layer named
    for the file), ids ascending along the index, under a temporary name renamed when complete."""
    from ...progress import progress_bar

    gdal = _writer_for(driver)
    columns = "".join(f', f."{k}"' for k in fields)
    sql = f"SELECT p.geom, p.id{columns} FROM {LAYER} p JOIN fields f ON f.id = p.id ORDER BY p.id, p.fid"
    args = _strings(["-f", driver, "-nln", out.stem, "-nlt", "POLYGON", "-sql", sql])
    with atomic_files(out, overwrite, side=SHAPEFILE_SIDE if driver == "ESRI Shapefile" else ()) as tmp, \
            progress_bar(progress, 100, "polygons written", unit="%") as bar:
        def fail(what: str):
            message = gdal.error().replace(str(tmp / out.name), str(out))
            raise OutputError(f"{out}: cannot write it as {driver}: GDAL {what}: {message}")

        gdal.CPLErrorReset()
        src = gdal.GDALOpenEx(str(traced).encode(), OF_VECTOR, None, None, None)
        if not src:
            fail("open")
        opts = gdal.GDALVectorTranslateOptionsNew(args, None)
        try:
            if not opts:
                fail("options")
            step = _Progress(bar, 100)
            gdal.GDALVectorTranslateOptionsSetProgress(opts, step.fn, None)
            usage = ctypes.c_int(0)
            dst = gdal.GDALVectorTranslate(str(tmp / out.name).encode(), None, 1, (_P * 1)(src), opts,
                                           ctypes.byref(usage))
            step.check()
            if not dst:
                fail("translate")
            if gdal.GDALClose(dst):
                fail("close")
        finally:
            if opts:
                gdal.GDALVectorTranslateOptionsFree(opts)
            gdal.GDALClose(src)
    return out
