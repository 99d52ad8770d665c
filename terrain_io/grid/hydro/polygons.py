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

import concurrent.futures
import contextlib
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
OFT_INTEGER64 = 12
OF_RASTER, OF_VECTOR = 0x02, 0x04
TRADITIONAL_GIS_ORDER = 0  # x = easting / longitude, as the rasters' geotransforms have it
FIELD_ROWS = 8192  # rows of the fields bound a batch (their Python numbers are held: ~2 MB)
LAYER = "polygons"  # the scratch layer; its table lives only in the scratch GeoPackage

_P, _S = ctypes.c_void_p, ctypes.c_char_p
_PROGRESS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p)
_SIGNATURES = {  # name: (restype, argtypes) of the GDAL C API functions used
    "GDALAllRegister": (None, []),
    "GDALGetDriverByName": (_P, [_S]),
    "GDALCreate": (_P, [_P, _S, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, _P]),
    "GDALAddBand": (ctypes.c_int, [_P, ctypes.c_int, _P]),
    "GDALOpenEx": (_P, [_S, ctypes.c_uint, _P, _P, _P]),
    "GDALClose": (ctypes.c_int, [_P]),  # a CPLErr since GDAL 3.7 (:meth:`_Gdal.close`)
    "GDALVersionInfo": (_S, [_S]),
    "GDALGetRasterBand": (_P, [_P, ctypes.c_int]),
    "GDALGetRasterYSize": (ctypes.c_int, [_P]),
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
    "CPLPushErrorHandler": (None, [_P]),
    "CPLPopErrorHandler": (None, []),
    "CPLGetLastErrorMsg": (_S, []),
    "OGR_L_WriteArrowBatch": (ctypes.c_bool, [_P, _P, _P, _P]),  # GDAL >= 3.8 (:mod:`.arrow`)
}
OPTIONAL = {"OGR_L_WriteArrowBatch"}  # None where the libgdal lacks it


class _Gdal:
    """The functions of :data:`_SIGNATURES` typed on one libgdal (ctypes releases the GIL in each call)."""

    def __init__(self, lib: ctypes.CDLL):
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name, None) if name in OPTIONAL else getattr(lib, name)
            if fn is None:
                setattr(self, name, None)
                continue
            fn.restype, fn.argtypes = res, args
            setattr(self, name, fn)
        self.GDALAllRegister()
        self.quiet_handler = ctypes.cast(lib.CPLQuietErrorHandler, _P)
        self.closes_with_error = int(self.GDALVersionInfo(b"VERSION_NUM")) >= 3070000

    def close(self, ds) -> bool:
        """GDALClose; whether it failed (flushing the file), where GDAL says so."""
        err = self.GDALClose(ds)
        return bool(err) and self.closes_with_error

    def error(self) -> str:
        """GDAL's last error message (of this thread) on one line."""
        return " ".join((self.CPLGetLastErrorMsg() or b"").decode(errors="replace").split()) or "(no message)"

    @contextlib.contextmanager
    def quiet(self):
        """GDAL's errors in this thread kept for :meth:`error`, not printed (nor logged by rasterio)."""
        self.CPLPushErrorHandler(self.quiet_handler)
        try:
            yield
        finally:
            self.CPLPopErrorHandler()


@functools.cache
def _rasterio_gdal() -> _Gdal:
    """rasterio's libgdal: dlsym on its extension module finds the symbols of the libraries it links."""
    from rasterio import _base

    return _Gdal(ctypes.CDLL(_base.__file__))


@functools.cache
def pyogrio_gdal() -> _Gdal:
    """The libgdal of pyogrio's wheel (ctypes, through its ``_ogr`` module's symbols)."""
    from ...vectors import pyogrio

    pyogrio()
    from pyogrio import _ogr

    return _Gdal(ctypes.CDLL(_ogr.__file__))


def _writer_for(driver: str) -> _Gdal:
    """The libgdal that writes ``driver``: rasterio's, else (FlatGeobuf) pyogrio's."""
    gdal = _rasterio_gdal()
    if gdal.GDALGetDriverByName(driver.encode()):
        return gdal
    try:
        gdal = pyogrio_gdal()
    except ImportError:
        gdal = None
    if gdal is None or not gdal.GDALGetDriverByName(driver.encode()):
        raise OutputError(f"rasterio's GDAL cannot write {driver}" + ("" if gdal else ": install pyogrio"))
    return gdal


def c_strings(items) -> ctypes.Array:
    """A NULL-terminated ``char **`` (GDAL's string lists)."""
    return (_S * (len(items) + 1))(*[str(s).encode() for s in items], None)


class _Job:
    """A long GDAL call (polygonize, translate) run in a worker thread while this thread waits in
    Python, so that a signal's handler runs at once (the command line's ends the run and removes the
    temporaries: :mod:`...interrupts`); GDAL's progress callback moves ``bar`` and, once the wait is
    cut by an exception (KeyboardInterrupt where no handler is installed), stops GDAL."""

    def __init__(self, gdal: _Gdal, bar=None, total: int = 1):
        self.gdal, self.bar, self.total, self.stop = gdal, bar, total, False
        self.progress = _PROGRESS(self._progress)

    def _progress(self, done, _message, _arg) -> int:
        if self.bar is not None:
            self.bar.update(max(0, int(done * self.total) - self.bar.n))
        return 0 if self.stop else 1

    def run(self, fn, *args):
        """``fn(*args)`` and GDAL's last error message in that thread (GDAL's errors are per thread)."""
        def work():
            with self.gdal.quiet():
                self.gdal.CPLErrorReset()
                return fn(*args), self.gdal.error()

        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gdal") as pool:
            job = pool.submit(work)
            try:
                return job.result()
            except BaseException:
                self.stop = True  # GDAL stops at its next progress call
                while not job.done():  # (its datasets are closed by the caller: not while it runs)
                    try:
                        concurrent.futures.wait([job])
                    except BaseException:  # noqa: BLE001 -- a second interrupt: still wait for GDAL
                        pass
                raise


def _fail(out: Path, driver: str, what: str, message: str):
    """The error of every step: one line naming the output, the step (GDAL's, or SQLite's) and why."""
    raise OutputError(f"{out}: cannot write it as {driver}: {what}: {message}") from None


def write(label, transform, crs: str | None, fields: dict, out, overwrite: bool, scratch: Path,
          progress: bool = False) -> Path:
    """The regions of ``label`` (uint32 labels, 0 none: an array, or a GeoTIFF path whose nodata is
    0) as polygons in ``out``'s format (module docstring), with ``id`` and ``fields`` (name -> array
    indexed by id - 1; integers as 64-bit integers, the rest as doubles), in the CRS ``crs``;
    ``scratch``: a folder for the GeoPackage the polygons are traced into."""
    out = Path(out)
    driver = DRIVERS[out.suffix.lower()]
    traced = scratch / "polygons.gpkg"
    gdal = _writer_for(driver)  # (before the trace: a missing writer is said at once)
    with _rasterio_gdal().quiet():
        _trace(label, transform, crs, traced, lambda what, msg: _fail(out, driver, f"GDAL {what}", msg), progress)
    try:
        _field_table(traced, fields)
    except sqlite3.Error as exc:  # a full disk: one line
        _fail(out, driver, "SQLite", str(exc))
    with gdal.quiet():
        return _translate(gdal, traced, fields, out, driver, overwrite, progress)


def _trace(label, transform, crs: str | None, path: Path, fail, progress: bool) -> None:
    """GDALPolygonize of the labels (their nodata mask: 0 is none) into a new GeoPackage ``path``:
    layer :data:`LAYER` with the field ``id``, no spatial index, one transaction."""
    from ...progress import progress_bar

    gdal = _rasterio_gdal()
    gdal.CPLErrorReset()
    if isinstance(label, np.ndarray):
        held = np.ascontiguousarray(label, np.uint32)
        rows, cols = held.shape
        src = gdal.GDALCreate(gdal.GDALGetDriverByName(b"MEM"), b"", cols, rows, 0, GDT_UINT32, None)
        if not src:
            fail("MEM dataset", gdal.error())
        if gdal.GDALAddBand(src, GDT_UINT32, c_strings([f"DATAPOINTER={held.ctypes.data}", "PIXELOFFSET=4",
                                                      f"LINEOFFSET={held.strides[0]}"])):
            message = gdal.error()
            gdal.GDALClose(src)
            fail("MEM dataset", message)
    else:
        src = gdal.GDALOpenEx(str(label).encode(), OF_RASTER, None, None, None)
        if not src:
            fail("open", gdal.error())
    try:
        band = gdal.GDALGetRasterBand(src, 1)
        geo = (ctypes.c_double * 6)(*transform)
        if not band or gdal.GDALSetGeoTransform(src, geo) or gdal.GDALSetRasterNoDataValue(band, 0):
            fail("raster", gdal.error())
        with gpkg_layer(gdal, path, LAYER, crs, WKB_POLYGON, {"id": OFT_INTEGER64}, fail,
                        ["SPATIAL_INDEX=NO", "GEOMETRY_NAME=geom", "FID=fid"]) as layer:
            rows = gdal.GDALGetRasterYSize(src)
            with progress_bar(progress, rows, "polygons", unit="row") as bar:
                job = _Job(gdal, bar, rows)
                err, message = job.run(gdal.GDALPolygonize, band, gdal.GDALGetMaskBand(band), layer, 0,
                                       c_strings(["8CONNECTED=8"]), job.progress, None)
            if err:
                fail("polygonize", message)
    finally:
        gdal.GDALClose(src)


@contextlib.contextmanager
def gpkg_layer(gdal: _Gdal, path, name: str, crs: str | None, geometry_type: int, fields: dict, fail,
               options=None):
    """A new GeoPackage ``path`` with one layer ``name`` (OGR ``geometry_type``, ``crs`` in GIS axis
    order, ``fields``: name -> OGR field type, in order; layer creation ``options``) in a
    transaction: yields the layer, commits when the block ends, then closes the file (GDAL builds
    a deferred spatial index there). ``fail(what, message)`` raises the step's error."""
    srs = ds = None
    done = False
    try:
        if crs:
            srs = gdal.OSRNewSpatialReference(None)
            if gdal.OSRSetFromUserInput(srs, crs.encode()):
                fail("CRS", gdal.error())
            gdal.OSRSetAxisMappingStrategy(srs, TRADITIONAL_GIS_ORDER)
        ds = gdal.GDALCreate(gdal.GDALGetDriverByName(b"GPKG"), str(path).encode(), 0, 0, 0, 0, None)
        if not ds:
            fail("create", gdal.error())
        layer = gdal.GDALDatasetCreateLayer(ds, name.encode(), srs, geometry_type,
                                            None if options is None else c_strings(options))
        if not layer:
            fail("layer", gdal.error())
        for key, oft in fields.items():
            field = gdal.OGR_Fld_Create(key.encode(), oft)
            failed = gdal.OGR_L_CreateField(layer, field, 1)
            gdal.OGR_Fld_Destroy(field)
            if failed:
                fail("layer", gdal.error())
        if gdal.GDALDatasetStartTransaction(ds, 0):
            fail("layer", gdal.error())
        yield layer
        if gdal.GDALDatasetCommitTransaction(ds):
            fail("commit", gdal.error())
        done = True
    finally:
        if srs:
            gdal.OSRRelease(srs)
        if ds and gdal.close(ds) and done:  # (an error already raised is the one said)
            fail("close", gdal.error())


def _field_table(path: Path, fields) -> None:
    """The fields (a Mapping of columns, or a :class:`terrain_io.tables.Table`) as table ``fields`` (id INTEGER
    PRIMARY KEY) of the GeoPackage ``path``, bound a batch of rows at a time, and an index of the
    polygons' ids (their order in the output)."""
    from ...tables import Table

    fields = Table.of(fields)  # (its derived columns made a batch at a time)
    names = list(fields)
    types = ["INTEGER" if fields.dtype(k).kind in "iub" else "REAL" for k in names]
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # (committed, then closed, on every path)
        db.execute(f"CREATE INDEX polygons_id ON {LAYER} (id)")
        db.execute("CREATE TABLE fields (id INTEGER PRIMARY KEY" + "".join(f', "{k}" {t}' for k, t in zip(names, types))
                   + ")")
        insert = f"INSERT INTO fields VALUES (?{', ?' * len(names)})"
        for rows, block in fields.blocks(FIELD_ROWS):
            db.executemany(insert, zip(range(rows.start + 1, rows.stop + 1), *(block[k].tolist() for k in names)))


def _translate(gdal: _Gdal, traced: Path, fields: dict, out: Path, driver: str, overwrite: bool,
               progress: bool) -> Path:
    """``GDALVectorTranslate`` of the polygons joined with their fields into ``out`` (its layer named
    for the file), ids ascending along the index, under a temporary name renamed when complete. (GDAL
    reports no progress for an SQL layer without a fast count: the bar only says it runs.)"""
    from ...progress import progress_bar

    columns = "".join(f', f."{k}"' for k in fields)
    sql = f"SELECT p.geom, p.id{columns} FROM {LAYER} p JOIN fields f ON f.id = p.id ORDER BY p.id, p.fid"
    args = c_strings(["-f", driver, "-nln", out.stem, "-nlt", "POLYGON", "-sql", sql])
    with atomic_files(out, overwrite, side=SHAPEFILE_SIDE if driver == "ESRI Shapefile" else ()) as tmp, \
            progress_bar(progress, 1, "polygons written", unit="file") as bar:
        def fail(what: str, message: str):
            _fail(out, driver, f"GDAL {what}", message.replace(str(tmp / out.name), str(out)))

        gdal.CPLErrorReset()
        src = gdal.GDALOpenEx(str(traced).encode(), OF_VECTOR, None, None, None)
        opts = gdal.GDALVectorTranslateOptionsNew(args, None) if src else None
        try:
            if not opts:
                fail("open", gdal.error())
            job = _Job(gdal)
            gdal.GDALVectorTranslateOptionsSetProgress(opts, job.progress, None)
            dst, message = job.run(gdal.GDALVectorTranslate, str(tmp / out.name).encode(), None, 1, (_P * 1)(src),
                                   opts, None)
            if not dst:
                fail("translate", message)
            if gdal.close(dst):
                fail("close", gdal.error())
            bar.update(1)
        finally:
            if opts:
                gdal.GDALVectorTranslateOptionsFree(opts)
            if src:
                gdal.GDALClose(src)
    return out
