"""Points given against a store's DEM -- SSSP sources, path targets -- as cells of its grid.

Inputs (:func:`read_points`):

* vector files -- GeoJSON, GeoPackage, Shapefile, FlatGeobuf, anything OGR reads -- through pyogrio
  (the optional ``vector`` extra). Points and multi-points (one point per part); lines or polygons
  are refused. The layer's CRS is reprojected to the DEM's (pyproj, ``always_xy``); a layer
  without a CRS on a DEM with one needs ``crs``.
* CSV (read here, no GDAL): a header row with an x and a y column -- ``x/y``, ``lon/lat``,
  ``lng/lat``, ``long/lat``, ``longitude/latitude`` or ``easting/northing``, any case; the first
  pair of that list present is taken. A CSV has no CRS: its coordinates are the DEM's unless
  ``crs`` names theirs.
* rasters aligned with the DEM (a GeoTIFF / ASCII grid with its shape and transform, or the name
  of an array of the store): every non-zero, non-nodata cell is a point, in row-major order.
* coordinate pairs (:func:`from_coordinates`): map (x, y), or (row, col) cells.

A DEM without a CRS takes every point's coordinates as its own. Each point lands on the cell that
contains it (:meth:`TerrainStore.map_to_cell`); a point outside the DEM or on a nodata cell is an
error naming it (its number in the input, counting from 0, and its coordinates), or with
``skip_invalid`` it is left out and a :class:`~terrain_io.errors.SkippedPointsNote` says how many.
Whether cells are vertices is read tile by tile, each tile (or each shard holding many of the
points) once, so 100,000 points cost one pass over the tiles they touch, not a read each.
"""
from __future__ import annotations

import contextlib
import csv
import io
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InputError, SkippedPointsNote, TerrainNote
from .vectors import VECTOR_EXTRA
from .store import TerrainStore
from .units import coordinate, crs_label, map_unit

VECTOR_SUFFIXES = {".geojson", ".json", ".gpkg", ".shp", ".fgb", ".gml", ".kml", ".sqlite", ".geojsonl",
                   ".geojsons", ".zip", ".dbf"}
RASTER_SUFFIXES = {".tif", ".tiff", ".asc", ".grd", ".ascii", ".img", ".vrt", ".nc", ".bil", ".flt", ".dem", ".hgt"}
CSV_SUFFIXES = {".csv", ".tsv", ".txt"}
# x and y column names of a CSV, in order of preference (matched without regard to case)
XY_COLUMNS = (("x", "y"), ("lon", "lat"), ("lng", "lat"), ("long", "lat"), ("longitude", "latitude"),
              ("easting", "northing"))


@dataclass
class Points:
    """Points on a store's DEM: cells that are vertices of its grid graph, in input order.

    ``index`` numbers each point in its input from 0 (the feature of a vector file, so the parts of
    a multi-point share it; the data row of a CSV; the order of coordinate pairs; the row-major
    order of a raster's non-zero cells); ``xy`` are the input's coordinates in the DEM's CRS (cell
    centres for a raster). ``read``: points read; ``skipped``: left out with ``skip_invalid``.
    """

    cells: np.ndarray  # (n, 2) int64 (row, col)
    xy: np.ndarray  # (n, 2) float64
    index: np.ndarray  # (n,) int64
    source: str
    read: int
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.cells)

    def then(self, other: "Points") -> "Points":
        """These points followed by ``other``'s, numbered on from this input's last point."""
        return Points(np.concatenate([self.cells, other.cells]), np.concatenate([self.xy, other.xy]),
                      np.concatenate([self.index, other.index + self.read]), f"{self.source} + {other.source}",
                      self.read + other.read, self.skipped + other.skipped)


def read_points(source, store, crs=None, skip_invalid: bool = False, what: str = "point") -> Points:
    """The points of ``source`` (a vector, CSV or raster file, or an array of ``store``) on its DEM.

    ``crs``: the CRS of the coordinates (``"EPSG:4326"``, WKT, ...), overriding the file's own;
    ``what`` names a point in errors (``"source"``, ``"target"``). Raises InputError with one line
    for an unreadable or empty file, geometries that are not points, a missing CRS, and (without
    ``skip_invalid``) a point outside the DEM or on nodata; with it, the result may hold no point.
    Module docstring: formats and rules.

    >>> pts = read_points("wells.gpkg", TerrainStore.open("dem.zarr"), what="source")  # doctest: +SKIP
    >>> pts.cells[:2]                                                                  # doctest: +SKIP
    array([[120,  48], [311, 907]])
    """
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store, mode="r")
    if isinstance(source, str) and source in store.group and not Path(source).exists():
        return _raster_points(source, store, skip_invalid, what, f"array {source!r}")
    path = Path(source)
    if not path.exists():
        raise InputError(f"{what}s {str(source)!r}: no such file and no such array in the store")
    if path.is_dir() and path.suffix.lower() != ".gdb":
        raise InputError(f"{what}s {path}: is a directory, not a file of points")
    kind = _kind(path)
    if kind == "raster":
        if crs is not None:
            raise InputError(f"{what}s {path}: a raster of {what}s lies on the DEM's grid; it takes no CRS")
        return _raster_points(path, store, skip_invalid, what, str(path))
    if kind == "csv":
        (xy, index), file_crs = _read_csv(path, what), None
    else:
        xy, index, file_crs = _read_vector(path, what)
    if len(xy) == 0:
        raise InputError(f"{what}s {path}: no points")
    given = xy  # in the points' CRS: what errors show
    xy = _to_dem_crs(xy, crs, file_crs, kind == "vector", store, path, what)
    rows, cols = store.map_to_cell(xy[:, 0], xy[:, 1])
    points_crs = crs if crs is not None else file_crs
    return _check(store, np.column_stack([rows, cols]), xy, index, str(path), skip_invalid, what,
                  lambda i: f"{what} {index[i]} ({coordinate(given[i, 0])},{coordinate(given[i, 1])}) of {path}",
                  outside=lambda: _extent_hint(store, points_crs, given, f"--{what}s-crs", crs is None))


def from_coordinates(store, pairs, cell: bool = False, skip_invalid: bool = False, what: str = "point",
                     crs=None) -> Points:
    """Points from (x, y) map coordinates, or (row, col) cells with ``cell`` (one pair or a list).
    ``crs``: the CRS of the map coordinates (``"EPSG:4326"`` for lon/lat, ...) [default: the DEM's]."""
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store, mode="r")
    if isinstance(pairs, tuple) and len(pairs) == 2 and np.isscalar(pairs[0]):
        pairs = [pairs]
    for p in pairs:
        if len(p) != 2:
            raise InputError(f"a {what} is two numbers, got {p!r}")
    a = np.asarray(pairs, np.float64).reshape(-1, 2)
    if len(a) == 0:
        raise InputError(f"no {what} given")
    index = np.arange(len(a), dtype=np.int64)
    flag = {"source": "--source-crs", "target": "--to-crs"}.get(what, "crs")
    if cell and crs is not None:
        raise InputError(f"{flag} applies to map coordinates, not to cells")
    if cell:
        whole = np.isfinite(a) & (a == np.round(a))
        if not whole.all():
            i = int(np.flatnonzero(~whole.all(axis=1))[0])
            raise InputError(f"{what} cell {a[i, 0]:.10g},{a[i, 1]:.10g}: a cell is ROW,COL, two whole numbers "
                             "(without --cell: map coordinates X,Y)")
        cells = np.where(np.abs(a) < 2.0**62, a, -1).astype(np.int64)
        xy = np.column_stack(store.cell_to_map(cells[:, 0], cells[:, 1]))
    else:
        xy = _to_dem_crs(a, crs, None, False, store, None, what)
        cells = np.column_stack(store.map_to_cell(xy[:, 0], xy[:, 1]))
    return _check(store, cells, xy, index, "", skip_invalid, what,
                  lambda i: f"{what} {'cell' if cell else 'point'} {coordinate(a[i, 0])},{coordinate(a[i, 1])}",
                  outside=None if cell else lambda: _extent_hint(store, crs, a, flag))


def vertex_mask(store: TerrainStore, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Whether each cell (rows, cols: inside the DEM) is a vertex, i.e. holds data.

    The cells are grouped by shard: a shard holding points in more than a quarter of its tiles is
    read whole (its tiles decoded in parallel), otherwise each tile holding a point is read once.
    """
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    ok = np.zeros(rows.shape, bool)
    if rows.size == 0:
        return ok
    t, s = store.tile_size, store.shard_size
    span = t * s
    nsc, ntc = store.shard_grid[1], store.tile_grid[1]
    shard = (rows // span) * nsc + cols // span
    order = np.argsort(shard, kind="stable")
    bounds = np.flatnonzero(np.diff(shard[order])) + 1
    for group in np.split(order, bounds):
        r, c = rows[group], cols[group]
        win = store.shard_window(int(r[0] // span), int(c[0] // span))
        tile = (r // t) * ntc + c // t
        tiles = np.unique(tile)
        if tiles.size * 4 > s * s:
            ok[group] = store.valid(store.read(win)[r - win.r0, c - win.c0])
            continue
        for key in tiles:
            sel = tile == key
            tw = store.tile_window(int(r[sel][0] // t), int(c[sel][0] // t))
            ok[group[sel]] = store.valid(store.read(tw)[r[sel] - tw.r0, c[sel] - tw.c0])
    return ok


# -- where the points come from -------------------------------------------------------------
def _kind(path: Path) -> str:
    """``raster``, ``csv`` or ``vector``: by an ASCII grid's header, else by suffix, else by trying GDAL."""
    from .convert import is_ascii_grid

    suffix = path.suffix.lower()
    if path.is_file() and is_ascii_grid(path):
        return "raster"
    if suffix in CSV_SUFFIXES:
        return "csv"
    if suffix in RASTER_SUFFIXES:
        return "raster"
    if suffix in VECTOR_SUFFIXES or path.is_dir():
        return "vector"
    try:  # an unknown suffix: a raster if GDAL's raster drivers open it with a band
        import rasterio

        with rasterio.Env(CPL_LOG="/dev/null"), rasterio.open(path) as ds:
            return "raster" if ds.count else "vector"
    except Exception:  # noqa: BLE001 -- not a raster: let the vector reader say what it is
        return "vector"


def _read_vector(path: Path, what: str):
    """(xy, feature numbers, CRS or None) of the points of a vector file's first layer."""
    from .vectors import pyogrio

    try:
        raw = pyogrio()
    except ImportError:
        raise InputError(f"{what}s {path}: reading vector files needs pyogrio ({VECTOR_EXTRA}); "
                         f"or give the points as CSV") from None
    try:
        meta, _, geometry, _ = raw.read(path, columns=[], read_geometry=True, force_2d=True)
    except Exception as exc:  # noqa: BLE001 -- pyogrio/GDAL errors: one line naming the file
        raise InputError(f"{what}s {path}: cannot read it as a vector file ({_first_line(exc)})") from None
    gtype = (meta.get("geometry_type") or "").lower()
    if not gtype and len(geometry) == 0:
        raise InputError(f"{what}s {path}: no geometries (a table without points)")
    if any(k in gtype for k in ("line", "polygon", "curve", "surface", "tin")):
        raise InputError(f"{what}s {path}: holds {meta['geometry_type']} geometries, not points "
                         f"(rasterise polygons or lines into a raster of {what}s)")
    xy, index = [], []
    for i, wkb in enumerate(geometry):
        if wkb is None:
            raise InputError(f"{what}s {path}: feature {i} has no geometry")
        try:
            pts, _ = _wkb_points(memoryview(wkb), 0)
        except _NotPoints as exc:
            raise InputError(f"{what}s {path}: feature {i} is a {exc}, not a point "
                             f"(rasterise polygons or lines into a raster of {what}s)") from None
        except (struct.error, IndexError, ValueError):
            raise InputError(f"{what}s {path}: feature {i}: malformed geometry") from None
        pts = [p for p in pts if not (np.isnan(p[0]) and np.isnan(p[1]))]  # empty points
        if not pts:
            raise InputError(f"{what}s {path}: feature {i} is an empty geometry")
        xy.extend(pts)
        index.extend([i] * len(pts))
    return np.asarray(xy, np.float64).reshape(-1, 2), np.asarray(index, np.int64), meta.get("crs")


class _NotPoints(Exception):
    pass


_WKB_NAMES = {2: "LineString", 3: "Polygon", 5: "MultiLineString", 6: "MultiPolygon", 8: "CircularString",
              9: "CompoundCurve", 10: "CurvePolygon", 11: "MultiCurve", 12: "MultiSurface", 15: "PolyhedralSurface",
              16: "TIN", 17: "Triangle"}


def _wkb_points(buf, off: int):
    """(list of (x, y), next offset) of the WKB geometry at ``off``: Point, MultiPoint or a
    GeometryCollection of them (ISO and extended WKB; Z and M ordinates skipped)."""
    order = "<" if buf[off] == 1 else ">"
    (code,) = struct.unpack_from(order + "I", buf, off + 1)
    off += 5
    if code & 0x20000000:  # extended WKB: an SRID follows
        off += 4
    extra = bool(code & 0x80000000) + bool(code & 0x40000000)
    code &= 0x0FFFFFFF
    extra += {0: 0, 1: 1, 2: 1, 3: 2}.get(code // 1000, 0)
    kind = code % 1000
    if kind == 1:
        x, y = struct.unpack_from(order + "2d", buf, off)
        return [(x, y)], off + 8 * (2 + extra)
    if kind in (4, 7):
        (n,) = struct.unpack_from(order + "I", buf, off)
        off += 4
        pts = []
        for _ in range(n):
            p, off = _wkb_points(buf, off)
            pts.extend(p)
        return pts, off
    raise _NotPoints(_WKB_NAMES.get(kind, f"geometry of WKB type {kind}"))


def _read_csv(path: Path, what: str):
    """(xy, row numbers) of a CSV's x and y columns (module docstring: the names); comma,
    semicolon or tab separated."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{what}s {path}: not a UTF-8 text file") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise InputError(f"{what}s {path}: empty file")
    header_line = next(line for line in lines if line.strip())
    delimiter = max(",;\t", key=header_line.count) if any(d in header_line for d in ",;\t") else ","
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    header = [h.strip().lower() for h in next(r for r in reader if any(f.strip() for f in r))]
    for xname, yname in XY_COLUMNS:
        if xname in header and yname in header:
            ix, iy = header.index(xname), header.index(yname)
            break
    else:
        raise InputError(f"{what}s {path}: no x and y columns in the header {header_line.strip()!r} "
                         f"(expected one of {', '.join('/'.join(p) for p in XY_COLUMNS)})")
    xy = []
    for fields in reader:
        if not any(f.strip() for f in fields):
            continue
        try:
            xy.append((float(fields[ix]), float(fields[iy])))
        except (ValueError, IndexError):
            got = ",".join(fields)
            raise InputError(f"{what}s {path} line {reader.line_num}: expected numbers in columns "
                             f"{header[ix]!r} and {header[iy]!r}, got {got!r}") from None
    return np.asarray(xy, np.float64).reshape(-1, 2), np.arange(len(xy), dtype=np.int64)


def _raster_points(source, store: TerrainStore, skip_invalid: bool, what: str, label: str) -> Points:
    """The non-zero, non-nodata cells of a raster aligned with the DEM, shard by shard."""
    from .convert import aligned_raster

    with contextlib.ExitStack() as scratch:
        mask_store, array = aligned_raster(source, store, scratch, f"{what} raster")
        found = []
        for win in store.shards():
            vals = mask_store.read(win, array)
            # a converted file knows its nodata; a store array has none beyond NaN
            on = (vals != 0) & (mask_store.valid(vals) if mask_store is not store else vals == vals)
            r, c = np.nonzero(on)
            if r.size:
                found.append(np.column_stack([r + win.r0, c + win.c0]))
    cells = np.concatenate(found) if found else np.zeros((0, 2), np.int64)
    if len(cells) == 0:
        raise InputError(f"{what}s {label}: no non-zero cells")
    cells = cells[np.argsort(cells[:, 0] * store.shape[1] + cells[:, 1], kind="stable")].astype(np.int64)
    xy = np.column_stack(store.cell_to_map(cells[:, 0], cells[:, 1]))
    return _check(store, cells, xy, np.arange(len(cells), dtype=np.int64), label, skip_invalid, what,
                  lambda i: f"{what} {i} (cell {cells[i, 0]},{cells[i, 1]}) of {label}")


# -- coordinates to cells --------------------------------------------------------------------
def _to_dem_crs(xy: np.ndarray, crs, file_crs, is_vector: bool, store: TerrainStore, path: Path, what: str):
    """``xy`` reprojected from ``crs`` (or the file's CRS) to the DEM's; unchanged when they agree,
    when the DEM has no CRS, or for a CSV (or coordinate pairs, ``path`` None) without ``crs``."""
    src = crs if crs is not None else file_crs
    label = f"{what}s {path}" if path is not None else f"{what}s"
    if src is None:
        if is_vector and store.crs:
            raise InputError(f"{what}s {path}: the file has no CRS and the DEM has one: name the points' CRS "
                             f"(--{what}s-crs EPSG:xxxx)")
        return xy
    if not store.crs:
        if crs is not None:
            warnings.warn(f"{label}: the DEM has no CRS, so their CRS {str(crs)[:40]} is not used: their coordinates "
                          "are taken as the DEM's (give the DEM its CRS: terrain convert --crs)", TerrainNote,
                          stacklevel=4)
        return xy
    try:
        from pyproj import CRS, Transformer
        from pyproj.exceptions import CRSError
    except ImportError:
        raise InputError(f"{label}: reprojecting points needs pyproj ({VECTOR_EXTRA})") from None
    try:
        src_crs = CRS.from_user_input(src)
    except CRSError:
        raise InputError(f"{label}: unknown CRS {str(src)[:80]!r}") from None
    dem_crs = CRS.from_user_input(store.crs)
    if src_crs == dem_crs:
        return xy
    tr = Transformer.from_crs(src_crs, dem_crs, always_xy=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # points outside the projection's area come back as inf
        x, y = tr.transform(xy[:, 0], xy[:, 1], errcheck=False)
    return np.column_stack([np.asarray(x, np.float64), np.asarray(y, np.float64)])


def _check(store: TerrainStore, cells, xy, index, label: str, skip_invalid: bool, what: str, name,
           outside=None) -> Points:
    """Keep the points on vertices of the DEM; the first other one (``name(i)`` says which) is an
    error unless ``skip_invalid``; ``outside()`` (the DEM's extent, :func:`_extent_hint`) follows
    "lies outside the DEM"."""
    nrows, ncols = store.shape
    inside = (cells[:, 0] >= 0) & (cells[:, 0] < nrows) & (cells[:, 1] >= 0) & (cells[:, 1] < ncols)
    ok = inside.copy()
    ok[inside] = vertex_mask(store, cells[inside, 0], cells[inside, 1])
    bad = np.flatnonzero(~ok)
    of = f" of {label}" if label else ""
    if bad.size and not skip_invalid:
        i = int(bad[0])
        where = (f"lies outside the DEM ({nrows} x {ncols} cells){outside() if outside else ''}" if not inside[i]
                 else "lies on a nodata cell")
        n = bad.size - 1
        more = f" ({n} more {what}{'s' if n > 1 else ''} off the data; --skip-invalid leaves them out)" if n else ""
        raise InputError(f"{name(i)} {where}{more}")
    if bad.size:
        warnings.warn(f"{bad.size} of {len(cells)} {what}s{of} left out: outside the DEM or on nodata",
                      SkippedPointsNote, stacklevel=3)
    return Points(cells[ok].astype(np.int64), xy[ok], index[ok], label, len(cells), int(bad.size))


def _extent_hint(store: TerrainStore, crs, xy: np.ndarray, flag: str, files_crs: bool = False) -> str:
    """``", which spans x A .. B, y C .. D (CRS)"``: the DEM's extent in the points' CRS (``crs``; None:
    the DEM's), and a hint when the numbers do not fit that CRS: lon/lat given on a projected DEM
    without a CRS, or projected numbers in a geographic CRS (``files_crs``: the file's own, e.g. EPSG:4326,
    which GDAL gives every GeoJSON that names none)."""
    rows, cols = store.shape
    t = store.transform
    if t is None:
        return f", which spans x 0 .. {cols}, y 0 .. {rows} (cells: the DEM has no transform)"
    xs, ys = store.cell_to_map(np.array([0, 0, rows, rows]) - 0.5, np.array([0, cols, 0, cols]) - 0.5)
    bounds = (xs.min(), ys.min(), xs.max(), ys.max())
    shown, unit = bounds, map_unit(store.crs)
    if crs is not None and store.crs:
        try:
            from pyproj import CRS, Transformer

            pts_crs = CRS.from_user_input(crs)
            shown = Transformer.from_crs(CRS.from_user_input(store.crs), pts_crs,
                                         always_xy=True).transform_bounds(*bounds, densify_pts=21)
            unit, crs_name = map_unit(pts_crs.to_wkt()), crs_label(pts_crs.to_wkt())
        except Exception:  # noqa: BLE001 -- no pyproj or no transformation: the DEM's own extent
            shown, crs_name = bounds, f"{crs_label(store.crs)}, the DEM's"
    else:
        crs_name = f"{crs_label(store.crs)}, the DEM's" if store.crs else "the DEM has no CRS"
    x0, y0, x1, y1 = (coordinate(v) for v in shown)
    text = f", which spans x {x0} .. {x1}, y {y0} .. {y1} ({unit}, {crs_name})"
    finite = xy[np.isfinite(xy).all(axis=1)]
    lonlat = len(finite) > 0 and bool((np.abs(finite[:, 0]) <= 180).all() and (np.abs(finite[:, 1]) <= 90).all())
    geographic_dem = unit == "deg"
    if crs is None and store.crs and not geographic_dem and lonlat:
        text += f"; longitude/latitude? name their CRS: {flag} EPSG:4326"
    elif crs is not None and unit == "deg" and not lonlat and len(finite):
        whose = " (the file's; a GeoJSON that names none is EPSG:4326)" if files_crs else ""
        text += (f"; these numbers are no longitude/latitude, yet their CRS is {crs_name}{whose}: name theirs "
                 f"with {flag} EPSG:xxxx")
    return text


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
