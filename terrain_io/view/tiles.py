"""Web map tiles of a store's arrays, rendered on demand from their overviews.

A tile is the XYZ tile (z, x, y) of Web Mercator (EPSG:3857, 256 x 256 pixels, the tiling of
OpenStreetMap and MapLibre). Its pixel centres are taken to the store's CRS through pyproj -- at a
17 x 17 grid of points, bilinear between them (under a hundredth of a pixel off at any zoom a DEM of
a few hundred kilometres shows) -- and each pixel takes the value of the cell it falls in, from the
finest overview level whose cells are no larger than the pixel (:mod:`terrain_io.overviews`; the
array itself when zoomed in). Only the window of that level under the tile is read. Colours are
those of ``terrain export -o x.png`` (:func:`terrain_io.export.paint`) with one colour span per
layer, from its coarsest level; elevations are hillshaded on the level's own cells. A store without
a CRS is drawn with its map units taken as metres of Web Mercator (on the equator at 0, 0 for a
store without a transform).

Tiles are cached (PNG bytes, least recently used, a bounded number); the levels' arrays stay open.
"""
from __future__ import annotations

import collections
import math
import struct
import threading
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, TerrainError
from ..export import hillshade, paint
from ..overviews import arrays_of, current_levels, level_shapes, missing_value
from ..store import TerrainStore, Window

TILE = 256
MAX_ZOOM = 24
HALF = math.pi * 6378137.0  # half the side of the Web Mercator square, metres
_GRID = 17  # pixel-centre positions transformed exactly a tile side (bilinear between them)


def png_bytes(rgba: np.ndarray) -> bytes:
    """An 8-bit RGBA PNG of ``rgba`` (h, w, 4 uint8), by the format's definition (zlib level 1)."""
    h, w, _ = rgba.shape
    raw = np.empty((h, 1 + 4 * w), np.uint8)
    raw[:, 0] = 0  # filter: none
    raw[:, 1:] = rgba.reshape(h, 4 * w)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw.tobytes(), 1)) + chunk(b"IEND", b""))


EMPTY_TILE = png_bytes(np.zeros((TILE, TILE, 4), np.uint8))


@dataclass
class Layer:
    """One array of the store and its pyramid: ``levels[k]`` is the array path of level k."""

    name: str
    levels: list[str]
    span: tuple[float, float] = (0.0, 1.0)
    current: bool = True  # False: the overviews are older than the array (not used)
    legend: object = None
    meta: dict = field(default_factory=dict)


class TileSource:
    """The layers of a store and their tiles. Thread-safe: the HTTP server's threads share one."""

    def __init__(self, store_path, *, cache_tiles: int = 1024, geojson_crs=None):
        self.store = TerrainStore.open(store_path, mode="r")
        self._to_store, self._to_lonlat = _transformers(self.store.crs)
        self.layers: dict[str, Layer] = {}
        for name in arrays_of(self.store):
            self.layers[name] = self._layer(name)
        if not self.layers:
            raise InputError(f"{self.store.path}: holds no arrays to show")
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cache_tiles = cache_tiles
        self._lock = threading.Lock()

    # -- layers -------------------------------------------------------------------------------------------
    def _layer(self, name: str) -> Layer:
        st = self.store
        leaf = name.rsplit("/", 1)[-1]
        pyramid = current_levels(st, name)
        current = pyramid is not None or not level_shapes(st.group[name].shape, st.tile_size)  # one tile: needs none
        layer = Layer(name, [name, *(pyramid or [])], current=current)
        arr = st.group[layer.levels[-1]]
        if arr.size <= 4096 * 4096:
            z = np.asarray(arr[...], np.float64)
        else:  # a large array without overviews: the colour span of its central 2048^2 cells (one read)
            r0, c0 = max(0, arr.shape[0] // 2 - 1024), max(0, arr.shape[1] // 2 - 1024)
            z = np.asarray(arr[r0 : r0 + 2048, c0 : c0 + 2048], np.float64)
        painted = paint(st, name, st.group[name], z)
        layer.span, layer.legend = painted.span, painted.legend
        layer.meta = {"name": name, "levels": len(layer.levels) - 1, "overviews_current": current,
                      "dtype": str(arr.dtype), "hillshade": leaf == "elevation"}
        return layer

    def bounds_lonlat(self) -> list[float]:
        """[west, south, east, north] of the DEM in degrees (its outline sampled along the edges)."""
        rows, cols = self.store.shape
        t = np.linspace(0, 1, 33)
        r = np.concatenate([t * rows, np.full(33, rows), t[::-1] * rows, np.zeros(33)])
        c = np.concatenate([np.zeros(33), t * cols, np.full(33, cols), t[::-1] * cols])
        x, y = self._cell_corner_to_map(r, c)
        lon, lat = self._to_lonlat(x, y)
        return [float(np.min(lon)), float(np.min(lat)), float(np.max(lon)), float(np.max(lat))]

    def native_zoom(self) -> int:
        """The zoom at which a pixel is about a cell of the array (the map's zoom-in limit + 2)."""
        w, s, e, n = self.bounds_lonlat()
        lat = math.radians((s + n) / 2)
        metres = self.store.metric_cell_size[0]
        if not self.store.crs:  # a store without a CRS: its units as metres of Web Mercator
            metres = self.store.cell_size[0]
        z = math.log2(2 * HALF * max(math.cos(lat), 1e-6) / (TILE * max(metres, 1e-9)))
        return int(min(MAX_ZOOM, max(0, math.ceil(z))))

    def _cell_corner_to_map(self, r, c):
        x0, dx, rx, y0, ry, dy = self.store.geotransform
        return x0 + c * dx + r * rx, y0 + c * ry + r * dy

    # -- tiles --------------------------------------------------------------------------------------------
    def tile(self, name: str, z: int, x: int, y: int) -> bytes:
        """The PNG of tile (z, x, y) of layer ``name`` (cached); KeyError for an unknown layer."""
        layer = self.layers[name]
        key = (name, z, x, y)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        data = self._render(layer, z, x, y)
        with self._lock:
            self._cache[key] = data
            while len(self._cache) > self._cache_tiles:
                self._cache.popitem(last=False)
        return data

    def pixel_cells(self, z: int, x: int, y: int, n: int = TILE):
        """(row, col) as floats, in cells of the array, of the centres of the tile's n x n pixels."""
        size = 2 * HALF / 2**z
        at = (np.arange(_GRID) * (n / (_GRID - 1)))  # grid positions in pixels, 0 .. n
        mx = -HALF + (x + at / n) * size
        my = HALF - (y + at / n) * size
        gx, gy = np.meshgrid(mx, my)
        sx, sy = self._to_store(gx.ravel(), gy.ravel())
        rows, cols = self._map_to_fcell(np.asarray(sx), np.asarray(sy))
        rows, cols = rows.reshape(_GRID, _GRID), cols.reshape(_GRID, _GRID)
        p = (np.arange(n) + 0.5) * ((_GRID - 1) / n)  # pixel centres in grid units
        return _bilinear(rows, p), _bilinear(cols, p)

    def _map_to_fcell(self, x, y):
        x0, dx, rx, y0, ry, dy = self.store.geotransform
        det = dx * dy - rx * ry
        with np.errstate(invalid="ignore"):
            col = ((x - x0) * dy - (y - y0) * rx) / det
            row = ((y - y0) * dx - (x - x0) * ry) / det
        return row, col

    def _render(self, layer: Layer, z: int, x: int, y: int) -> bytes:
        rows, cols = self.pixel_cells(z, x, y)
        shape = self.store.shape
        inside = (rows >= 0) & (rows < shape[0]) & (cols >= 0) & (cols < shape[1])
        if not inside.any():
            return EMPTY_TILE
        # cells a pixel spans: the finest level whose cells are no larger than a pixel
        step = max(float(np.nanmedian(np.hypot(np.diff(cols, axis=1), np.diff(rows, axis=1)))), 1e-9)
        k = int(min(len(layer.levels) - 1, max(0, math.floor(math.log2(step)))))
        arr = self.store.group[layer.levels[k]]
        f = 2.0**k
        ri = np.floor(rows / f).astype(np.int64)
        ci = np.floor(cols / f).astype(np.int64)
        inside &= (ri >= 0) & (ri < arr.shape[0]) & (ci >= 0) & (ci < arr.shape[1])
        if not inside.any():
            return EMPTY_TILE
        halo = 1 if layer.meta["hillshade"] else 0
        r0, r1 = int(ri[inside].min()) - halo, int(ri[inside].max()) + 1 + halo
        c0, c1 = int(ci[inside].min()) - halo, int(ci[inside].max()) + 1 + halo
        if (r1 - r0) * (c1 - c0) > 16 * TILE * TILE * 16:  # no overview this coarse: would read too much
            return EMPTY_TILE
        window = self.store.read(Window(max(r0, 0), min(r1, arr.shape[0]), max(c0, 0), min(c1, arr.shape[1])),
                                 layer.levels[k])
        block = np.full((r1 - r0, c1 - c0), np.nan)
        block[max(r0, 0) - r0 : max(r0, 0) - r0 + window.shape[0],
              max(c0, 0) - c0 : max(c0, 0) - c0 + window.shape[1]] = window
        ii, jj = np.clip(ri - r0, 0, block.shape[0] - 1), np.clip(ci - c0, 0, block.shape[1] - 1)
        source = self.store.group[layer.name]
        missing = missing_value(self.store, layer.name, source)
        if missing is not None:  # integer nodata: NaN, as a float array's
            block[block == missing] = np.nan
        values = np.where(inside, block[ii, jj], np.nan)
        shade = None
        if layer.meta["hillshade"]:
            dx, dy = self.store.metric_cell_size
            shade = hillshade(block, dx * f, dy * f)[ii, jj]
        painted = paint(self.store, layer.name, source, values, span=layer.span, shade=shade)
        rgba = np.zeros((TILE, TILE, 4), np.uint8)
        rgba[..., :3] = np.clip(painted.rgb.round(), 0, 255)
        rgba[..., 3] = np.where(painted.ok & inside, 255, 0)
        return png_bytes(rgba)

    # -- a cell's values ----------------------------------------------------------------------------------
    def values_at(self, lon: float, lat: float) -> dict:
        """The cell under (lon, lat) and every layer's value there (full resolution), or no cell."""
        x, y = self._from_lonlat(lon, lat)
        row, col = self._map_to_fcell(np.float64(x), np.float64(y))
        if not (np.isfinite(row) and np.isfinite(col)):
            return {"cell": None}
        row, col = int(math.floor(row)), int(math.floor(col))
        if not (0 <= row < self.store.shape[0] and 0 <= col < self.store.shape[1]):
            return {"cell": None}
        out = {}
        for name in self.layers:
            v = self.store.read(Window(row, row + 1, col, col + 1), name)[0, 0]
            if v.dtype.kind == "f":  # the shortest text that reads back as the stored float32 / float64
                out[name] = float(str(v)) if np.isfinite(v) else None
            else:
                out[name] = v.item()
        cx, cy = self.store.cell_to_map(row, col)
        return {"cell": [row, col], "x": float(cx), "y": float(cy), "values": out}

    def _from_lonlat(self, lon, lat):
        return self._to_store(*_lonlat_to_mercator(lon, lat))

    def lonlat(self, x, y):
        """Map coordinates of the store to (lon, lat) (for GeoJSON overlays in the store's CRS)."""
        return self._to_lonlat(x, y)


def _identity(x, y):
    return x, y


def _lonlat_to_mercator(lon, lat):
    lat = np.clip(lat, -85.05112878, 85.05112878)
    return np.radians(lon) * 6378137.0, np.log(np.tan(np.pi / 4 + np.radians(lat) / 2)) * 6378137.0


def _mercator_to_lonlat(x, y):
    lat = 2 * np.arctan(np.exp(np.asarray(y) / 6378137.0)) - np.pi / 2
    return np.degrees(np.asarray(x) / 6378137.0), np.degrees(lat)


def _transformers(crs):
    """(Web Mercator -> store CRS, store CRS -> lon/lat) through pyproj; a store without a CRS: its
    map units are Web Mercator metres."""
    if not crs:
        return _identity, lambda x, y: _mercator_to_lonlat(x, y)
    try:
        from pyproj import CRS, Transformer
    except ImportError:
        raise TerrainError("terrain view reprojects through pyproj: pip install 'terrain-io[view]'") from None

    target = CRS.from_user_input(crs)
    to_store = Transformer.from_crs("EPSG:3857", target, always_xy=True).transform
    to_lonlat = Transformer.from_crs(target, "EPSG:4326", always_xy=True).transform
    return to_store, to_lonlat


def _bilinear(grid: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``grid`` (g x g, values at integer positions) at positions p x p (rows, cols), bilinear."""
    i = np.minimum(p.astype(np.int64), grid.shape[0] - 2)
    t = p - i
    top = grid[i][:, i] * (1 - t)[None, :] + grid[i][:, i + 1] * t[None, :]
    bottom = grid[i + 1][:, i] * (1 - t)[None, :] + grid[i + 1][:, i + 1] * t[None, :]
    return top * (1 - t)[:, None] + bottom * t[:, None]
