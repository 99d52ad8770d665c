"""Streaming conversion of DEM files into a TerrainStore.

Readers:
- Esri ASCII grid (``ncols``, ``nrows``, ``xllcorner|xllcenter``, ``yllcorner|yllcenter``,
  ``cellsize`` or ``dx``/``dy``, ``NODATA_value``; keys case-insensitive), one grid row per line.
- GRASS ASCII raster (``north: south: east: west: rows: cols:``, optional ``null:``, ``type:``,
  ``multiplier:``); ``*`` is null unless ``null:`` names another value.
- GeoTIFF and any raster GDAL opens (rasterio), read window by window.

ASCII bodies are parsed in row bands of one tile height (numba, lines in parallel), so memory is
O(cols x tile) whatever the file size. Bands are gathered into full shard rows before they are
written (zarr rewrites a whole shard on every partial write); a shard row wider than the memory
allowance is spilled tile by tile to a scratch file instead of RAM. The store is built under a
temporary name and renamed when complete: an interrupted conversion leaves nothing that looks whole.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import _ascii_parse as ap
from .errors import InputError, TerrainError, TerrainNote
from .jit import SERIAL_BELOW
from .atomic import atomic_directory
from .progress import progress_bar
from .units import crs_label
from .parallel import check_scheduler, map_shards
from .store import (DEFAULT_SHARD, DEFAULT_TILE, Statistics, TerrainStore, Window, check_store_output, check_tiling,
                    write_elevation_window)

READ_BLOCK = 8 << 20  # bytes of ASCII text per read
SHARD_ROW_RAM = 128 << 20  # shard rows larger than this are spilled to a scratch file


@dataclass
class GridHeader:
    """Geometry of a raster: shape, GDAL transform, nodata; ``body_offset`` for ASCII files."""

    rows: int
    cols: int
    transform: tuple[float, float, float, float, float, float] | None
    nodata: float | None = None
    crs: str | None = None
    source_format: str = ""
    source_dtype: str = "float32"
    multiplier: float | None = None
    body_offset: int = 0
    body_line: int = 1  # 1-based line number of the first body line
    extra: dict = field(default_factory=dict)

    @property
    def cell_size(self) -> tuple[float, float] | None:
        if self.transform is None:
            return None
        return abs(self.transform[1]), abs(self.transform[5])


@dataclass
class ConvertSummary:
    path: Path
    rows: int
    cols: int
    valid: int
    source_bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.source_bytes / 1e6 / max(self.seconds, 1e-9)


# ---------------------------------------------------------------------------------------------
# ASCII headers
# ---------------------------------------------------------------------------------------------
_ESRI_KEYS = {"ncols", "nrows", "xllcorner", "xllcenter", "yllcorner", "yllcenter", "cellsize", "dx", "dy",
              "nodata_value", "byteorder"}
_GRASS_KEYS = {"north", "south", "east", "west", "rows", "cols", "null", "type", "multiplier"}


def _number(src: Path, lineno: int, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{src}, line {lineno}: header value of '{key}' is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise InputError(f"{src}, line {lineno}: header value of '{key}' is not finite: {text!r}")
    return value


def _size(src: Path, lineno: int, key: str, text: str) -> int:
    value = _number(src, lineno, key, text)
    if value != int(value) or value <= 0:
        raise InputError(f"{src}, line {lineno}: '{key}' must be a positive integer, got {text!r}")
    return int(value)


def read_ascii_header(src) -> GridHeader:
    """Parse the header of an Esri or GRASS ASCII grid; the body starts at ``body_offset``."""
    src = Path(src)
    with open(src, "rb") as f:
        head = f.read(1 << 16)
    if not head.strip():
        raise InputError(f"{src}: empty file")
    if b"\0" in head:
        raise InputError(f"{src}: binary data where an ASCII grid header was expected")
    lines = head.split(b"\n")
    first = next((ln for ln in lines if ln.strip()), b"")
    grass = b":" in first.split()[0] if first.split() else False
    keys: dict[str, tuple[int, str]] = {}
    body_found = True
    offset = 0
    lineno = 0
    for i, raw in enumerate(lines):
        text = raw.decode("latin-1").strip()
        cut = i == len(lines) - 1  # the last piece may be cut mid-line: only the body may start there
        if not text:
            offset += len(raw) + 1
            lineno += 1
            continue
        if grass:
            if ":" not in text.split()[0]:
                break
            key, _, value = text.partition(":")
        else:
            parts = text.split()
            if not parts[0][:1].isalpha() or parts[0].lower() in ("nan", "inf", "infinity"):
                break  # the first grid row
        if cut and len(head) == 1 << 16:
            raise InputError(f"{src}: header longer than 64 KiB")
        if not grass:
            if len(parts) != 2:
                raise InputError(f"{src}, line {lineno + 1}: malformed header line {text!r} (expected 'key value')")
            key, value = parts
        key = key.strip().lower()
        known = _GRASS_KEYS if grass else _ESRI_KEYS
        if key not in known:
            raise InputError(f"{src}, line {lineno + 1}: unknown header key {key!r}")
        if key in keys:
            raise InputError(f"{src}, line {lineno + 1}: duplicate header key {key!r}")
        keys[key] = (lineno + 1, value.strip())
        offset += len(raw) + 1
        lineno += 1
    else:
        body_found = False
    hdr = _grass_header(src, keys) if grass else _esri_header(src, keys)
    if not body_found:
        raise InputError(f"{src}: no grid values after the header")
    hdr.body_offset = offset
    hdr.body_line = lineno + 1
    return hdr


def _need(src: Path, keys: dict, *names: str) -> str:
    """The first of ``names`` present in the header; an error naming them all when none is."""
    for name in names:
        if name in keys:
            return name
    raise InputError(f"{src}: missing header key {' or '.join(repr(n) for n in names)}")


def _esri_header(src: Path, keys: dict) -> GridHeader:
    def num(key):
        return _number(src, keys[key][0], key, keys[key][1])

    def size(key):
        _need(src, keys, key)
        return _size(src, keys[key][0], key, keys[key][1])

    cols, rows = size("ncols"), size("nrows")
    if "cellsize" in keys:
        if "dx" in keys or "dy" in keys:
            raise InputError(f"{src}: header has both 'cellsize' and 'dx'/'dy'")
        dx = dy = num("cellsize")
    else:
        dx, dy = num(_need(src, keys, "dx", "cellsize")), num(_need(src, keys, "dy"))
    if dx <= 0 or dy <= 0:
        raise InputError(f"{src}: cell size must be positive, got {dx} x {dy}")
    if "xllcorner" in keys and "xllcenter" in keys or "yllcorner" in keys and "yllcenter" in keys:
        raise InputError(f"{src}: header has both a corner and a center origin")
    kx, ky = _need(src, keys, "xllcorner", "xllcenter"), _need(src, keys, "yllcorner", "yllcenter")
    x = num(kx) - (dx / 2 if kx == "xllcenter" else 0.0)
    y = num(ky) - (dy / 2 if ky == "yllcenter" else 0.0)
    nodata = num("nodata_value") if "nodata_value" in keys else None
    return GridHeader(rows, cols, (x, dx, 0.0, y + rows * dy, 0.0, -dy), nodata, source_format="esri-ascii")


def _grass_header(src: Path, keys: dict) -> GridHeader:
    def num(key):
        _need(src, keys, key)
        return _number(src, keys[key][0], key, keys[key][1])

    north, south, east, west = num("north"), num("south"), num("east"), num("west")
    rows = _size(src, keys[_need(src, keys, "rows")][0], "rows", keys["rows"][1])
    cols = _size(src, keys[_need(src, keys, "cols")][0], "cols", keys["cols"][1])
    if north <= south or east <= west:
        raise InputError(f"{src}: north must exceed south and east must exceed west")
    dx, dy = (east - west) / cols, (north - south) / rows
    nodata = None if keys.get("null", (0, "*"))[1] == "*" else num("null")
    multiplier = num("multiplier") if "multiplier" in keys else None
    kind = keys.get("type", (0, "float"))[1].lower()
    if kind not in ("int", "float", "double"):
        raise InputError(f"{src}: unknown GRASS type {kind!r} (int, float or double)")
    return GridHeader(rows, cols, (west, dx, 0.0, north, 0.0, -dy), nodata, source_format="grass-ascii",
                      source_dtype={"int": "int32", "float": "float32", "double": "float64"}[kind],
                      multiplier=multiplier)


def crs_wkt(text, what: str) -> str:
    """The WKT of a CRS given as anything rasterio's ``CRS.from_user_input`` reads: ``EPSG:32617``, WKT
    (OGC or ESRI's), a PROJ string, ``OGC:CRS84``, ... ``what`` names the CRS's origin in errors."""
    from rasterio.crs import CRS
    from rasterio.errors import CRSError

    try:
        return CRS.from_user_input(text).to_wkt()
    except CRSError as exc:
        raise InputError(f"{what}: not a CRS ({_first_line(exc)}): {str(text).strip()[:80]!r}") from None


def prj_beside(src: Path) -> Path | None:
    """The ``.prj`` file beside an ASCII grid (the same name, as GDAL looks for it), or None."""
    return next((p for p in (src.with_suffix(".prj"), src.with_suffix(".PRJ")) if p.is_file()), None)


def _prj_crs(prj: Path) -> str:
    """The CRS of a ``.prj`` as GDAL's ASCII grid drivers read it: WKT (OGC or ESRI), else the old
    ArcInfo keyword form (``Projection UTM`` / ``Zone 17`` / ...), which only GDAL's importFromESRI
    parses -- so it is read by GDAL itself, beside a one-cell grid. Unreadable: an error (GDAL
    would drop the CRS without a word)."""
    text = prj.read_text(encoding="latin-1").strip()
    if not text:
        raise InputError(f"{prj}: empty .prj (remove it, or give the CRS with --crs)")
    try:
        return crs_wkt(text, str(prj))
    except InputError:
        pass
    import rasterio

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "g.asc").write_text("ncols 1\nnrows 1\nxllcorner 0\nyllcorner 0\ncellsize 1\n0\n")
        (Path(tmp) / "g.prj").write_text(text, encoding="latin-1")
        with rasterio.Env(CPL_LOG="/dev/null"), rasterio.open(Path(tmp) / "g.asc") as ds:
            if ds.crs is not None:
                return ds.crs.to_wkt()
    raise InputError(f"{prj}: not a CRS GDAL reads: {text[:80]!r} (fix it, or give the CRS with --crs)")


def _readable_prj(src: Path) -> str | None:
    """The CRS of the .prj beside ``src`` when there is a readable one (``--crs`` replaces the rest)."""
    prj = prj_beside(src)
    try:
        return _prj_crs(prj) if prj is not None else None
    except InputError:
        return None


def _same_crs(a: str, b: str) -> bool:
    from rasterio.crs import CRS

    return CRS.from_user_input(a) == CRS.from_user_input(b)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def is_ascii_grid(src) -> bool:
    """True when ``src`` looks like an Esri or GRASS ASCII grid (by its first header word)."""
    try:
        with open(src, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    words = head.split()
    if not words:
        return Path(src).suffix.lower() in (".asc", ".txt", ".grd", ".ascii")
    w = words[0].rstrip(b":").lower()
    return w in {k.encode() for k in _ESRI_KEYS | _GRASS_KEYS}


# ---------------------------------------------------------------------------------------------
# ASCII body: row bands
# ---------------------------------------------------------------------------------------------
def iter_ascii_bands(src, hdr: GridHeader, band_rows: int, progress=None, dtype=np.float64):
    """Yield (row0, array of shape (k, cols)) for consecutive bands of ``band_rows`` rows.

    ``dtype`` float64 or float32: float32 parses straight to the store's type (half the memory);
    the band array is reused, so consumers copy what they keep.
    """
    src = Path(src)
    cols = hdr.cols
    band = np.empty((band_rows, cols), dtype=dtype)
    nodata = np.array([] if hdr.nodata is None else [hdr.nodata], dtype=dtype)  # becomes NaN while parsing
    parse = ap.parse_lines if hdr.rows * cols >= SERIAL_BELOW else ap.parse_lines_serial
    filled = 0
    row = 0
    lineno = hdr.body_line
    carry = b""
    with open(src, "rb") as f:
        f.seek(hdr.body_offset)
        while True:
            chunk = f.read(READ_BLOCK)
            eof = not chunk
            data = carry + chunk
            if not eof:
                cut = data.rfind(b"\n")
                if cut < 0:
                    carry = data
                    continue
                carry, data = data[cut + 1 :], data[: cut + 1]
            else:
                carry = b""
            if progress is not None:
                progress.update(len(chunk))
            buf = np.frombuffer(data, dtype=np.uint8)
            nl = np.flatnonzero(buf == 10)
            starts = np.concatenate(([0], nl + 1))
            ends = np.concatenate((nl, [len(buf)]))
            if len(ends) and ends[-1] == starts[-1]:
                starts, ends = starts[:-1], ends[:-1]  # data ended with a newline
            linenos = lineno + np.arange(len(starts))
            lineno += len(starts)
            keep = np.array([not ap.blank_line(buf, s, e) for s, e in zip(starts, ends)], dtype=bool) \
                if _maybe_blank(buf, starts, ends) else np.ones(len(starts), dtype=bool)
            starts, ends, linenos = starts[keep], ends[keep], linenos[keep]
            pos = 0
            while pos < len(starts):
                if row + filled >= hdr.rows:
                    raise InputError(f"{src}, line {linenos[pos]}: more rows than nrows={hdr.rows}")
                take = min(band_rows - filled, len(starts) - pos, hdr.rows - row - filled)
                s, e = starts[pos : pos + take], ends[pos : pos + take]
                status = np.empty(take, dtype=np.int8)
                detail = np.empty(take, dtype=np.int64)
                parse(buf, s, e, band[filled : filled + take], status, detail, nodata)
                if status.any():
                    _resolve_status(src, buf, s, e, status, detail, linenos[pos : pos + take], band[filled:], cols,
                                    nodata)
                filled += take
                pos += take
                if filled == band_rows or row + filled == hdr.rows:
                    yield row, band[:filled]
                    row += filled
                    filled = 0
            if eof:
                break
    if row + filled < hdr.rows:
        raise InputError(f"{src}: file ends after {row + filled} of {hdr.rows} rows")


def _maybe_blank(buf, starts, ends) -> bool:
    """Cheap test whether any line could be blank (short lines), to skip the per-line check."""
    return bool(np.any((ends - starts) < 2)) or bool(np.any(buf[starts] <= 32))


def _resolve_status(src, buf, starts, ends, status, detail, linenos, out, cols, nodata):
    for i in np.flatnonzero(status):
        ln = int(linenos[i])
        if status[i] == ap.WRONG_COUNT:
            raise InputError(f"{src}, line {ln}: expected {cols} values in the row, found {int(detail[i])}")
        text = bytes(buf[starts[i] : ends[i]]).decode("latin-1")
        if status[i] in (ap.BAD_TOKEN, ap.OVERFLOW):
            off = int(detail[i]) - int(starts[i])
            token = text[off:].split()[0] if text[off:].split() else text[max(off - 10, 0):off + 10]
            if status[i] == ap.OVERFLOW:
                raise InputError(f"{src}, line {ln}: {token[:40]!r} is beyond the range of {out.dtype} "
                                 "(use --dtype float64)")
            raise InputError(f"{src}, line {ln}: not a number: {token[:40]!r}")
        exact = np.array([float("nan") if t == "*" else float(t) for t in text.split()])  # exact slow path
        with np.errstate(over="ignore"):
            out[i] = exact
        if np.isinf(out[i]).any() and not np.isinf(exact).all(where=np.isinf(out[i])):
            raise InputError(f"{src}, line {ln}: a value is beyond the range of {out.dtype} (use --dtype float64)")
        if len(nodata):
            out[i][out[i] == nodata[0]] = np.nan


# ---------------------------------------------------------------------------------------------
# Writing shard rows
# ---------------------------------------------------------------------------------------------
class ShardRowWriter:
    """Gathers row bands (one tile high) into shard rows and writes whole shards to a zarr array.

    A shard row (S*T rows x all columns) is held in RAM when it fits ``SHARD_ROW_RAM``, otherwise
    its tiles go to an unlinked scratch file and come back one shard at a time, so memory stays
    O(cols x T + shard) for any width.
    """

    def __init__(self, store: TerrainStore, scratch_dir: Path):
        self.store = store
        self.arr = store.elevation
        self.t = store.tile_size
        self.st = store.tile_size * store.shard_size
        rows, cols = store.shape
        self.cols = cols
        self.dtype = store.dtype
        nbytes = min(self.st, rows) * cols * self.dtype.itemsize
        self.in_ram = nbytes <= SHARD_ROW_RAM
        self.ram = np.empty((min(self.st, rows), cols), self.dtype) if self.in_ram else None
        self.scratch = None if self.in_ram else tempfile.TemporaryFile(dir=scratch_dir)
        self.shard_row0 = 0

    def add_band(self, row0: int, band: np.ndarray) -> None:
        """Add rows ``row0 : row0 + len(band)`` (a multiple of T rows, except at the DEM's end)."""
        local = row0 - self.shard_row0
        if self.in_ram:
            self.ram[local : local + len(band)] = band
        else:
            t = self.t
            block = np.zeros((t, t), self.dtype)  # every tile is stored T x T, partial ones padded
            for c0 in range(0, self.cols, t):
                part = band[:, c0 : c0 + t]
                block[: part.shape[0], : part.shape[1]] = part
                os.pwrite(self.scratch.fileno(), block.tobytes(), self._offset(local, c0))
        end = row0 + len(band)
        if end - self.shard_row0 == self.st or end == self.store.shape[0]:
            self._flush(end)

    def _offset(self, local_row: int, c0: int) -> int:
        # tile (local_row // T, c0 // T) stored as a T x T block (full width T even for the last column)
        return ((local_row // self.t) * (-(-self.cols // self.t)) + c0 // self.t) * self.t * self.t * self.dtype.itemsize

    def _flush(self, end: int) -> None:
        nrows = end - self.shard_row0
        for c0 in range(0, self.cols, self.st):
            c1 = min(c0 + self.st, self.cols)
            if self.in_ram:
                block = self.ram[:nrows, c0:c1]
            else:
                block = np.empty((nrows, c1 - c0), self.dtype)
                for lr in range(0, nrows, self.t):
                    h = min(self.t, nrows - lr)
                    for tc in range(c0, c1, self.t):
                        raw = os.pread(self.scratch.fileno(), self.t * self.t * self.dtype.itemsize,
                                       self._offset(lr, tc))
                        w = min(self.t, c1 - tc)
                        tile = np.frombuffer(raw, self.dtype).reshape(-1, self.t)
                        block[lr : lr + h, tc - c0 : tc - c0 + w] = tile[:h, :w]
            self.arr[self.shard_row0 : end, c0:c1] = block
        self.shard_row0 = end

    def close(self):
        if self.scratch is not None:
            self.scratch.close()


# ---------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------
def _output_dtype(requested: str | None, hdr: GridHeader) -> np.dtype:
    if requested and requested != "auto":
        try:
            dt = np.dtype(requested)
        except TypeError:
            raise InputError(f"unknown dtype {requested!r}") from None
        if dt.kind not in "iuf" or dt.itemsize > 8:
            raise InputError(f"unsupported dtype {requested!r} (use float32, float64, int16, int32, ...)")
        return dt
    src = np.dtype(hdr.source_dtype)
    if src.kind == "f" or hdr.source_format.endswith("ascii"):
        return np.dtype("float64") if src == np.float64 and not hdr.source_format.endswith("ascii") else np.dtype("float32")
    return src  # integer rasters keep their type


def _cast_band(values: np.ndarray, nodata_in, dtype: np.dtype, nodata_out, multiplier=None) -> np.ndarray:
    """Source values -> store dtype: nodata becomes NaN (floats) or ``nodata_out`` (integers).

    A float band already in the store's dtype is converted in place (no copy).
    """
    if values.dtype.kind != "f":
        values = values.astype(np.float64)
    missing = np.isnan(values)
    if nodata_in is not None and not math.isnan(nodata_in):
        missing |= values == values.dtype.type(nodata_in)
    if multiplier is not None:
        values = values * multiplier
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            out = values if values.dtype == dtype else values.astype(dtype)
        if np.isinf(out).any() and not np.isinf(values).all(where=np.isinf(out)):
            raise InputError(f"values beyond the range of {dtype} (use --dtype float64)")
        out[missing] = np.nan
        return out
    info = np.iinfo(dtype)
    good = values[~missing]
    if good.size and (good.min() < info.min or good.max() > info.max or np.any(good != np.round(good))):
        raise InputError(f"values do not fit {dtype} exactly (use --dtype float32)")
    out = np.where(missing, nodata_out, values).astype(dtype)
    return out


@dataclass(frozen=True)
class _Cast:
    """Source values -> store values (picklable, for shard tasks on other processes)."""

    nodata_in: float | None
    dtype: str
    nodata_out: int | None
    multiplier: float | None = None

    def __call__(self, values: np.ndarray) -> np.ndarray:
        return _cast_band(values, self.nodata_in, np.dtype(self.dtype), self.nodata_out, self.multiplier)


def _int_nodata(dtype: np.dtype, nodata):
    if dtype.kind == "f":
        return None
    if nodata is not None and not math.isnan(nodata):
        info = np.iinfo(dtype)
        if info.min <= nodata <= info.max and nodata == int(nodata):
            return int(nodata)
    return int(np.iinfo(dtype).min) if dtype.kind == "i" else int(np.iinfo(dtype).max)


def convert(src, out=None, *, tile: int = DEFAULT_TILE, shard: int = DEFAULT_SHARD, dtype: str | None = None,
            overwrite: bool = False, progress: bool = False, scheduler: str | None = "local",
            announce=None, elevation: bool = True, crs=None) -> ConvertSummary:
    """Convert an ASCII grid or any GDAL raster at ``src`` into a new store at ``out``.

    The CRS: ``crs`` (anything :func:`crs_wkt` reads) when given, overriding the file's; else a
    raster's own, or the ``.prj`` beside an ASCII grid (as GDAL reads it); else none.
    ``out`` defaults to ``src`` with the suffix ``.zarr``. Returns a summary; raises InputError
    for unusable input and leaves no store behind on any failure. ``elevation``: the values are
    elevations, so +-inf (no elevation, and weights of inf - inf = NaN) is refused; a cost or
    source raster (False) may hold it. ``scheduler`` (rasters only):
    one task per shard window on Dask (see :func:`terrain_io.parallel.map_shards`).
    """
    t0 = time.perf_counter()
    src = Path(src)
    if not src.exists():
        raise InputError(f"{src}: no such file")
    if src.is_dir():
        raise InputError(f"{src}: is a directory, not a DEM file")
    check_tiling(tile, shard)
    out = Path(out) if out is not None else src.with_suffix(".zarr")
    check_store_output(out, overwrite, source=src)  # only a store of this tool is replaced
    scheduler = check_scheduler(scheduler)
    crs = crs_wkt(crs, "--crs") if crs is not None else None
    ascii_grid = is_ascii_grid(src)
    if ascii_grid and scheduler != "local":
        raise TerrainError("an ASCII grid is parsed as one stream: --scheduler applies to GeoTIFF and other rasters")
    reader = _AsciiSource(src) if ascii_grid else _RasterSource(src, scheduler, announce)
    with reader:
        hdr = reader.header
        if crs is not None:
            own = hdr.crs or (_readable_prj(src) if ascii_grid else None)
            if own is not None and not _same_crs(own, crs):
                warnings.warn(f"{src}: its CRS {crs_label(own)} replaced by --crs {crs_label(crs)}", TerrainNote,
                              stacklevel=2)
            hdr.crs = crs
        elif ascii_grid and (prj := prj_beside(src)) is not None:
            hdr.crs = _prj_crs(prj)
        out_dtype = _output_dtype(dtype, hdr)
        nodata_out = _int_nodata(out_dtype, hdr.nodata)
        attrs = {
            "crs": hdr.crs,
            "transform": list(hdr.transform) if hdr.transform else None,
            "cell_size": list(hdr.cell_size) if hdr.cell_size else None,
            "source": str(src.name),
            "source_format": hdr.source_format,
            "source_nodata": hdr.nodata,
        }
        stats = Statistics()
        with atomic_directory(out) as tmp:
            store = TerrainStore.create(tmp, (hdr.rows, hdr.cols), out_dtype, tile=tile, shard=shard,
                                        nodata=nodata_out, attrs=attrs)
            reader.write(store, stats, _Cast(hdr.nodata, str(out_dtype), nodata_out, hdr.multiplier), progress)
            if elevation and stats.valid and not (math.isfinite(stats.minimum) and math.isfinite(stats.maximum)):
                raise InputError(f"{src}: holds infinite values ({stats.minimum} .. {stats.maximum}): not "
                                 "elevations; make those cells nodata in the source")
            store.update_attrs(**stats.as_attrs())
    if stats.valid == 0:
        warnings.warn(f"{src}: every cell is nodata: the DEM has no vertices", stacklevel=2)
    return ConvertSummary(out, hdr.rows, hdr.cols, stats.valid, src.stat().st_size, time.perf_counter() - t0)


class _AsciiSource:
    def __init__(self, src: Path):
        self.src = src
        self.header = read_ascii_header(src)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, store: TerrainStore, stats: Statistics, cast, progress: bool) -> None:
        size = self.src.stat().st_size - self.header.body_offset
        bar = progress_bar(progress, size, f"convert {self.src.name}", unit="B")
        writer = ShardRowWriter(store, store.path.parent)
        direct = store.dtype == np.float32 and self.header.multiplier is None
        try:
            for row0, band in iter_ascii_bands(self.src, self.header, store.tile_size, bar,
                                               np.float32 if direct else np.float64):
                values = band if direct else cast(band)  # direct: parsed to float32, nodata already NaN
                stats.add(values, store.nodata)
                writer.add_band(row0, values)
        finally:
            writer.close()
            bar.close()


class _RasterSource:
    """Any raster GDAL reads, through rasterio, one shard window at a time (band 1)."""

    def __init__(self, src: Path, scheduler: str = "local", announce=None):
        self.scheduler, self.announce = scheduler, announce
        import rasterio
        from rasterio.errors import RasterioIOError

        self.src = src
        self._env = rasterio.Env(GDAL_CACHEMAX=64 * 1024 * 1024)  # shard windows need no big block cache
        self._env.__enter__()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # NotGeoreferencedWarning: handled below
                self.ds = rasterio.open(src)
        except (RasterioIOError, OSError) as exc:
            self._env.__exit__(None, None, None)
            msg = str(exc).splitlines()[0] if str(exc) else "unreadable"
            raise InputError(f"{src}: not a raster GDAL can read ({msg})") from None
        ds = self.ds
        if ds.width <= 0 or ds.height <= 0:
            raise InputError(f"{src}: empty raster")
        t = ds.transform
        georef = ds.crs is not None or not t.is_identity
        self.header = GridHeader(
            ds.height, ds.width,
            (t.c, t.a, t.b, t.f, t.d, t.e) if georef else None,
            ds.nodata,
            crs=ds.crs.to_wkt() if ds.crs else None,
            source_format=f"gdal-{ds.driver.lower()}",
            source_dtype=ds.dtypes[0],
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.ds.close()
        self._env.__exit__(*exc)
        return False

    def _read(self, window):
        from rasterio.errors import RasterioIOError

        try:
            return self.ds.read(1, window=window)
        except RasterioIOError as exc:
            raise InputError(f"{self.src}: read error: {str(exc).splitlines()[0]}") from None

    def write(self, store: TerrainStore, stats: Statistics, cast, progress: bool) -> None:
        from rasterio.windows import Window as RioWindow

        if self.scheduler != "local":
            tasks = [_RasterShard(str(self.src), str(store.path), win, cast) for win in store.shards()]
            with progress_bar(progress, len(tasks), f"convert {self.src.name}", unit="shard") as bar:
                for part in map_shards(_convert_raster_shard, tasks, self.scheduler, progress=bar,
                                       announce=self.announce):
                    stats.merge(part)
            return

        rows, cols = store.shape
        st = store.tile_size * store.shard_size
        # Striped rasters (blocks as wide as the raster) are read a shard row at a time, so each strip
        # is decoded once; tiled rasters shard window by shard window.
        striped = self.ds.block_shapes[0][1] >= cols
        band_bytes = min(st, rows) * cols * np.dtype(self.ds.dtypes[0]).itemsize
        band_rows = st if striped and band_bytes <= SHARD_ROW_RAM else None
        bar = progress_bar(progress, rows * cols, f"convert {self.src.name}", unit="cell")
        try:
            for r0 in range(0, rows, st):
                r1 = min(r0 + st, rows)
                band = self._read(RioWindow(0, r0, cols, r1 - r0)) if band_rows else None
                for c0 in range(0, cols, st):
                    c1 = min(c0 + st, cols)
                    raw = band[:, c0:c1] if band is not None else self._read(RioWindow(c0, r0, c1 - c0, r1 - r0))
                    values = cast(raw)
                    stats.add(values, store.nodata)
                    store.elevation[r0:r1, c0:c1] = values
                    bar.update(values.size)
        finally:
            bar.close()


@dataclass(frozen=True)
class _RasterShard:
    src: str
    store: str
    window: Window
    cast: _Cast


def _convert_raster_shard(task: _RasterShard) -> Statistics:
    """One shard window of a raster into the store (a task: whole shard, rerunnable)."""
    import rasterio
    from rasterio.windows import Window as RioWindow

    win = task.window
    with rasterio.Env(GDAL_CACHEMAX=64 * 1024 * 1024), rasterio.open(task.src) as ds:
        raw = ds.read(1, window=RioWindow(win.c0, win.r0, win.c1 - win.c0, win.r1 - win.r0))
    return write_elevation_window(task.store, win, task.cast(raw), task.cast.nodata_out)


def aligned_raster(source, store: TerrainStore, scratch, what: str, dtype: str = "float64") -> tuple[TerrainStore, str]:
    """A raster given beside ``store`` and aligned with its DEM, as (store, array name) to read windows of.

    ``source``: the name of an array of ``store`` (not ``elevation``), or a GeoTIFF / ASCII grid /
    GDAL raster file with the DEM's shape and transform, converted into a scratch store beside
    ``store`` that ``scratch`` (a :class:`contextlib.ExitStack`) removes. ``what`` names the raster in
    errors (``"cost raster"``, ``"source raster"``).
    """
    from .atomic import scratch_directory

    if isinstance(source, str) and source in store.group and source != "elevation" and not Path(source).exists():
        arr = store.group[source]
        if not hasattr(arr, "dtype"):
            raise InputError(f"{what} {source!r}: a group of the store, not an array")
        if tuple(arr.shape) != store.shape:
            raise InputError(f"{what} array {source!r} has shape {tuple(arr.shape)}, the DEM {store.shape}")
        return store, source
    src = Path(source)
    if not src.exists():
        raise InputError(f"{what} {str(source)!r}: no such file and no such array in the store")
    label = what.split()[0]  # "cost", "source", ...: the scratch folder's name
    tmp = scratch.enter_context(scratch_directory(store.path, label)) / f"{label}.zarr"
    convert(src, tmp, tile=store.tile_size, shard=store.shard_size, dtype=dtype, progress=False, elevation=False)
    other = TerrainStore.open(tmp, mode="r")
    if other.shape != store.shape:
        raise InputError(f"{what} {src}: shape {other.shape} differs from the DEM's {store.shape}")
    if store.crs and other.crs and not _same_crs(store.crs, other.crs):
        raise InputError(f"{what} {src}: its CRS {crs_label(other.crs)} is not the DEM's {crs_label(store.crs)} "
                         "(reproject it onto the DEM's grid, e.g. gdalwarp)")
    st = store.transform
    if st and other.transform and not np.allclose(other.transform, st, rtol=0, atol=1e-9 * max(1.0, *map(abs, st))):
        raise InputError(f"{what} {src}: not aligned with the DEM (transform {other.transform} vs {st})")
    return other, "elevation"
