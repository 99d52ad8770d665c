"""Stream links written to a GeoPackage through GDAL's Arrow interface (``streams -o``): each batch
handed to ``OGR_L_WriteArrowBatch`` (GDAL >= 3.8, pyogrio's libgdal, through ctypes) as structs of
the Arrow C data interface (https://arrow.apache.org/docs/format/CDataInterface.html) over the
batch's NumPy buffers -- the WKB of all its lines in one buffer with their offsets (large binary),
a buffer a field, a validity bitmap where a double is NaN (NULL, as pyogrio writes NaN).

Why not pyogrio's writer: its loop over the features runs in Cython holding the GIL for the whole
write (H100, 16384^2, 140 k links: 0.97-1.38 s in which the rasters' writer threads, the walks and
the ends' reader waited), and it takes a Python bytes object a feature; ctypes releases the GIL for
each call, and GDAL makes the features from the buffers. (``pyogrio.write_arrow`` holds the GIL too,
and needs pyarrow.) The dataset, layer and fields are created as pyogrio creates them -- the layer
named for the file, fields Integer64 / Integer / Real by dtype, the CRS in GIS axis order -- one
transaction for all batches, the R-tree built once at the end (GDAL defers it for a layer it has
just created): the same features read back.
"""
from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

import numpy as np

from ...atomic import atomic_files
from ...errors import OutputError
from ...vectors import sqlite_cache
from .polygons import pyogrio_gdal, c_strings, gpkg_layer

WKB_LINESTRING = 2
OFT = {np.dtype(np.int32): 0, np.dtype(np.float64): 2, np.dtype(np.int64): 12}  # OGR field types
FORMATS = {np.dtype(np.int32): b"i", np.dtype(np.float64): b"g", np.dtype(np.int64): b"l"}  # Arrow's
NULLABLE = 2  # ARROW_FLAG_NULLABLE


class _Schema(ctypes.Structure):
    pass


class _Array(ctypes.Structure):
    pass


_SCHEMA_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Schema))
_ARRAY_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Array))
_Schema._fields_ = [("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_char_p),
                    ("flags", ctypes.c_int64), ("n_children", ctypes.c_int64),
                    ("children", ctypes.POINTER(ctypes.POINTER(_Schema))), ("dictionary", ctypes.POINTER(_Schema)),
                    ("release", _SCHEMA_RELEASE), ("private_data", ctypes.c_void_p)]
_Array._fields_ = [("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
                   ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
                   ("buffers", ctypes.POINTER(ctypes.c_void_p)), ("children", ctypes.POINTER(ctypes.POINTER(_Array))),
                   ("dictionary", ctypes.POINTER(_Array)), ("release", _ARRAY_RELEASE),
                   ("private_data", ctypes.c_void_p)]


# The buffers belong to the batch's NumPy arrays, held until the call returns: releasing a struct
# only marks it released (the interface's contract: release set to NULL).
@_SCHEMA_RELEASE
def _release_schema(schema):
    schema.contents.release = _SCHEMA_RELEASE()


@_ARRAY_RELEASE
def _release_array(array):
    array.contents.release = _ARRAY_RELEASE()


def usable(driver: str) -> bool:
    """Whether links to ``driver`` go this way: a GeoPackage, pyogrio's GDAL of 3.8 or later."""
    if driver != "GPKG":
        return False
    try:
        return pyogrio_gdal().OGR_L_WriteArrowBatch is not None
    except (ImportError, OSError, AttributeError):  # (AttributeError: a libgdal without a symbol it needs)
        return False


class _Batch:
    """The Arrow struct array of one batch: a column ``geom`` (large binary: ``wkb`` cut at
    ``offsets``) and one a field, over the NumPy buffers, which it holds."""

    def __init__(self, wkb: np.ndarray, offsets: np.ndarray, fields: dict):
        n = len(offsets) - 1
        self.held = [np.ascontiguousarray(wkb, np.uint8), np.ascontiguousarray(offsets, np.int64)]
        columns = [self._column(b"geom", b"Z", n, 0, [None, self.held[1], self.held[0]])]
        for name, values in fields.items():
            values = np.ascontiguousarray(values)
            valid, nulls = None, 0
            if values.dtype.kind == "f":
                missing = np.isnan(values)
                nulls = int(missing.sum())
                valid = np.packbits(~missing, bitorder="little") if nulls else None
            columns.append(self._column(name.encode(), FORMATS[values.dtype], n, nulls, [valid, values]))
        k = len(columns)
        self.schemas = (ctypes.POINTER(_Schema) * k)(*[ctypes.pointer(s) for s, _ in columns])
        self.arrays = (ctypes.POINTER(_Array) * k)(*[ctypes.pointer(a) for _, a in columns])
        self.columns = columns
        self.schema = _Schema(format=b"+s", name=b"", n_children=k, children=self.schemas, release=_release_schema)
        self.top_buffers = (ctypes.c_void_p * 1)(None)
        self.array = _Array(length=n, n_buffers=1, buffers=self.top_buffers, n_children=k, children=self.arrays,
                            release=_release_array)

    def _column(self, name: bytes, fmt: bytes, n: int, nulls: int, buffers: list) -> tuple[_Schema, _Array]:
        self.held += [b for b in buffers if b is not None]
        pointers = (ctypes.c_void_p * len(buffers))(*[None if b is None else b.ctypes.data for b in buffers])
        self.held.append(pointers)
        return (_Schema(format=fmt, name=name, flags=NULLABLE, release=_release_schema),
                _Array(length=n, null_count=nulls, n_buffers=len(buffers), buffers=pointers, release=_release_array))


@contextlib.contextmanager
def link_stream(out, crs: str | None, fields: dict, overwrite: bool = False):
    """Yields ``write(wkb, offsets, values)``, which adds a batch of LineStrings to the GeoPackage
    ``out`` (layer named for the file, ``fields``: name -> dtype, in order; ``values``: name -> array,
    those fields) without holding the GIL; the file complete and renamed into place when the block
    ends (:func:`...atomic.atomic_files`). GDAL's errors: one line naming ``out``."""
    out = Path(out)
    gdal = pyogrio_gdal()

    def fail(what: str, message: str):
        raise OutputError(f"{out}: cannot write it as GPKG: GDAL {what}: {message}") from None

    with atomic_files(out, overwrite) as tmp, gdal.quiet(), sqlite_cache("GPKG"):  # (as pyogrio's writes have it)
        path = str(tmp / out.name)
        gdal.CPLErrorReset()
        with gpkg_layer(gdal, path, out.stem, crs, WKB_LINESTRING, {k: OFT[np.dtype(v)] for k, v in fields.items()},
                        lambda what, message: fail(what, message.replace(path, str(out)))) as layer:
            options = c_strings(["GEOMETRY_NAME=geom"])

            def write(wkb: np.ndarray, offsets: np.ndarray, values: dict) -> None:
                batch = _Batch(wkb, offsets, {k: values[k] for k in fields})
                if not gdal.OGR_L_WriteArrowBatch(layer, ctypes.addressof(batch.schema), ctypes.addressof(batch.array),
                                                  options):
                    fail("write", gdal.error())

            yield write
