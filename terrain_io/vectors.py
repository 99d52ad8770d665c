"""Vector outputs (``-o`` of ``path``, ``watershed``, ``basins``, ``streams``): the format named by
the file's suffix, features written through pyogrio as ISO WKB in the store's CRS, staged under a
temporary name with a Shapefile's side files and renamed when complete (:mod:`.atomic`).

:func:`feature_stream` takes features in batches as they are produced and holds them up to a
given size (geometry and fields), then writes what it holds in one call (pyogrio's append for the later ones:
GDAL's GeoPackage, GeoJSON and Shapefile drivers add to the layer). A GeoPackage layer written in one
call builds its R-tree once, at the end (GDAL defers the index of a layer it has just created),
where each appended batch inserts through the index's triggers and SQLite's journal (lines of 41
points, nine fields, 2-core VM: 565 k lines 4.3-4.9 CPU s in one call against 7.3 in nine batches of
65,536, whose wall was 3-4x their CPU; 140 k lines 1.05-1.22 against 1.50-1.62). FlatGeobuf cannot
append (its header counts the features), so its batches are all held and written once at the end.
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np

from .atomic import atomic_files, refuse_existing
from .errors import InputError, OutputError

DRIVERS = {".geojson": "GeoJSON", ".json": "GeoJSON", ".gpkg": "GPKG", ".shp": "ESRI Shapefile",
           ".fgb": "FlatGeobuf"}
SHAPEFILE_SIDE = (".shx", ".dbf", ".prj", ".cpg")
APPENDS = ("GPKG", "GeoJSON", "ESRI Shapefile")  # drivers that add a batch to a written layer
FEATURE_OVERHEAD = 48  # bytes a held feature beside its WKB: the bytes object's header and its list slot
# What pyogrio's package imports, where installed, to learn which of its GeoDataFrame and Arrow reads and
# writes it can offer -- none of which this tool calls: pandas and pyarrow on the H100 host, 0.2-0.5 s of
# a command's start-up holding the GIL (2-core VM, pandas alone: pyogrio's import 0.24-0.28 s, 0.03-0.04 s
# without).
PYOGRIO_PROBES = ("pandas", "pyarrow", "geopandas", "shapely", "pyproj")
VECTOR_EXTRA = "pip install 'terrain-io[vector]'"  # what a user is told to install for vector files
lean_imports = False  # set by the terrain command (cli.main), whose process uses none of them


def pyogrio():
    """pyogrio's ``raw`` module (its reads and writes of WKB and NumPy fields); where ``lean_imports``
    and pyogrio is not yet imported, without importing :data:`PYOGRIO_PROBES` (pyogrio then counts them
    absent for the process; a later ``import pandas`` imports it as usual)."""
    import sys

    if not lean_imports or "pyogrio" in sys.modules:
        from pyogrio import raw

        return raw
    hidden = [name for name in PYOGRIO_PROBES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # (an import of it raises ImportError)
    try:
        from pyogrio import raw
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    return raw


def check_output(out, overwrite: bool = False, own_geojson: bool = False) -> str:
    """The OGR driver for writing to ``out``; one line (an error) for an unknown suffix, an existing
    file without ``overwrite``, or pyogrio missing (but for GeoJSON when the caller writes it
    itself: ``own_geojson``)."""
    out = Path(out)
    driver = DRIVERS.get(out.suffix.lower())
    if driver is None:
        raise InputError(f"{out}: unknown output type {out.suffix!r} (use " + ", ".join(sorted(set(DRIVERS))) + ")")
    refuse_existing(out, overwrite)
    if not (own_geojson and driver == "GeoJSON"):
        try:
            pyogrio()
        except ImportError:
            raise InputError(f"{out}: writing {driver} needs pyogrio ({VECTOR_EXTRA})"
                             + ("; or write .geojson" if own_geojson else "")) from None
    return driver


def wkb_linestring(coords) -> bytes:
    """A 2-D LineString as ISO WKB (little-endian, type 2, the point count, x y doubles)."""
    xy = np.ascontiguousarray(coords, dtype="<f8")
    return b"\x01" + np.array([2, len(xy)], "<u4").tobytes() + xy.tobytes()


def write_features(out, geometry, fields: dict, geometry_type: str, crs=None, overwrite: bool = False,
                   masks: dict | None = None) -> Path:
    """Write ``geometry`` (WKB bytes or None, one a feature) with ``fields`` (name -> array) to
    ``out`` in the format its suffix names; GDAL's errors become one line naming ``out``."""
    with feature_stream(out, geometry_type, crs, overwrite) as write:
        write(geometry, fields, masks)
    return Path(out)


SQLITE_CACHE_MB = 32  # GeoPackage appends: a batch's R-tree inserts 0.74 against 1.00 CPU s with SQLite's 2 MB


@contextlib.contextmanager
def sqlite_cache(driver: str):
    """GDAL's SQLite page cache raised to ``SQLITE_CACHE_MB`` while a GeoPackage is written (each appended
    batch updates the layer's R-tree; 65,536 lines a batch, 2-core VM), then given back."""
    if driver != "GPKG":
        yield
        return
    pyogrio()
    import pyogrio as package

    before = package.get_gdal_config_option("OGR_SQLITE_CACHE")
    package.set_gdal_config_options({"OGR_SQLITE_CACHE": str(SQLITE_CACHE_MB)})
    try:
        yield
    finally:
        package.set_gdal_config_options({"OGR_SQLITE_CACHE": before})


@contextlib.contextmanager
def feature_stream(out, geometry_type: str, crs=None, overwrite: bool = False, hold: int = 0):
    """Yields ``write(geometry, fields, masks=None)``, which adds a batch of features to ``out``
    (the same fields, in the same order, every batch; write at least one batch, empty or not);
    batches are held until they pass ``hold`` bytes (geometry, fields), then written in one call; the
    file is complete and renamed into place when the block ends (module docstring)."""
    raw = pyogrio()
    out = Path(out)
    driver = DRIVERS[out.suffix.lower()]
    written = False
    held, size = [], 0

    def flush(geometry, fields, masks, append):
        options = None
        if driver == "FlatGeobuf" and any(g is None for g in geometry):
            options = {"SPATIAL_INDEX": "NO"}  # its spatial index cannot hold a null geometry
        try:
            with warnings.catch_warnings(), sqlite_cache(driver):
                warnings.simplefilter("ignore", UserWarning)  # "'crs' was not provided": a store without a CRS
                raw.write(str(tmp / out.name), np.asarray(geometry, object), list(fields.values()), list(fields),
                          field_mask=[(masks or {}).get(k) for k in fields], layer=out.stem, driver=driver,
                          geometry_type=geometry_type, crs=crs or None, layer_options=None if append else options,
                          append=append)
        except Exception as exc:  # noqa: BLE001 -- pyogrio/GDAL errors: one line naming OUT
            message = str(exc).replace(str(tmp / out.name), str(out)).splitlines()[0]
            raise OutputError(f"{out}: cannot write it as {driver}: {message}") from None

    def flush_held():
        nonlocal written, size
        if len(held) == 1:
            flush(*held[0], written)
        else:
            names = list(held[0][1])
            geometry = [g for h in held for g in h[0]]
            fields = {k: np.concatenate([np.asarray(h[1][k]) for h in held]) for k in names}

            def mask(h, k):  # a batch's mask of field k, all False where it gives none
                m = (h[2] or {}).get(k)
                return np.zeros(len(h[0]), bool) if m is None else np.asarray(m, bool)

            masks = {k: np.concatenate([mask(h, k) for h in held]) for k in names} if any(h[2] for h in held) else None
            flush(geometry, fields, masks, written)
        written = True
        held.clear()
        size = 0

    def write(geometry, fields: dict, masks: dict | None = None):
        nonlocal size
        geometry = list(geometry)
        held.append((geometry, fields, masks))
        # the bytes it holds: each WKB and its bytes object's header, the fields
        size += sum(len(g) for g in geometry if g is not None) + FEATURE_OVERHEAD * len(geometry) + sum(
            np.asarray(v).nbytes for v in fields.values())
        if driver in APPENDS and size > hold:
            flush_held()

    with atomic_files(out, overwrite, side=SHAPEFILE_SIDE if driver == "ESRI Shapefile" else ()) as tmp:
        yield write
        if held:
            flush_held()
