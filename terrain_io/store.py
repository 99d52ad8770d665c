"""TerrainStore: one DEM as a Zarr v3 group, tiled and sharded, visited in z-order.

Layout (see docs/ARCHITECTURE.md#the-store): the 2-D array ``elevation`` is chunked by tile (T x T) and
sharded by super-block (S x S tiles). zarr's sharding codec writes the chunks of a shard in
Morton order, so a quadtree super-block lies contiguously on disk, and the pipelines visit tiles
in global Morton order of (tile_row, tile_col) -- for power-of-two S that is shard after shard in
Morton order, tile after tile in Morton order inside each shard.

Results (``mst/edges``, ``sssp/NAME/distance``, ...) are arrays of the same group, chunked and
sharded like ``elevation``; each is written under a hidden temporary directory inside the store and
renamed into place when complete, so no reader ever sees a half-written result.

Integrity (format_version 2, :mod:`terrain_io.integrity`): every chunk ends in a crc32c (zarr's
codec) and every array holds a manifest of its shard files, written just before the store or result
is renamed into place; every read here checks them and raises DamagedStoreError on damage.
"""
from __future__ import annotations

import math

import collections
import concurrent.futures
import contextlib
import datetime as _dt
import functools
import itertools
import json
import os
import queue
import sys
import threading
import uuid
import warnings
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_string
from pathlib import Path
from typing import Iterator

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from . import integrity
from .atomic import atomic_directory, before_commit, folder_lock, locked, refuse_existing
from .errors import DamagedStoreError, InputError, OutputError, StoreError, UnverifiedStoreWarning
from .parallel import owns_cores
from .tiling import DEFAULT_SHARD, DEFAULT_TILE, check_tiling  # noqa: F401 -- this module's API too
from .zorder import morton_order

FORMAT_VERSION = 2  # 2: chunk checksums (crc32c) and shard manifests; 1: neither (still read)
ELEVATION = "elevation"
CELL_TRANSFORM = (0.0, 1.0, 0.0, 0.0, 0.0, 1.0)  # a store without a geotransform: map units are cell indices
_COMPRESSOR = ZstdCodec(level=1)  # ~1 GB/s decode per core: cheaper than re-reading raw bytes
_CHECKSUM = Crc32cCodec()  # last codec of every chunk: damage is an error, not different numbers


def fill_value_for(dtype, nodata) -> float | int:
    """The zarr fill value: NaN for floats (nodata is NaN there), the declared nodata for integers."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return float("nan")
    if nodata is None:
        return 0
    return int(nodata)


def valid_mask(values: np.ndarray, nodata) -> np.ndarray:
    """Cells that are vertices of the grid graph: not NaN, and not equal to an integer nodata."""
    if values.dtype.kind == "f":
        return ~np.isnan(values)
    if nodata is None:
        return np.ones_like(values, dtype=bool)  # (a CuPy array's on the GPU: NumPy dispatches to CuPy)
    return values != nodata


@dataclass
class Tile:
    """One tile of a store, with a halo of ``halo`` cells on every side.

    ``data`` has shape ``(h + 2*halo, w + 2*halo)``; halo cells outside the DEM hold nodata.
    ``row, col`` are tile indices; ``r0, c0`` the global cell of ``data[halo, halo]``.
    """

    row: int
    col: int
    r0: int
    c0: int
    h: int
    w: int
    halo: int
    data: np.ndarray

    @property
    def interior(self) -> np.ndarray:
        """The tile's own cells, without the halo."""
        k = self.halo
        return self.data[k : k + self.h, k : k + self.w]


@dataclass(frozen=True)
class Window:
    """A rectangle of cells: rows ``r0:r1``, cols ``c0:c1``."""

    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def slices(self) -> tuple[slice, slice]:
        return slice(self.r0, self.r1), slice(self.c0, self.c1)

    @property
    def shape(self) -> tuple[int, int]:
        return self.r1 - self.r0, self.c1 - self.c0


class TerrainStore:
    """A DEM store: open with :meth:`open`, make with :meth:`create`."""

    def __init__(self, group: zarr.Group, path: Path):
        self.group = group
        self.path = Path(path)
        self.attrs = dict(group.attrs)
        try:  # (one lookup: each reads zarr.json through zarr's event loop, ~0.5 ms)
            self.elevation = _node(group, ELEVATION, path)
        except KeyError:
            raise StoreError(f"{path}: not a terrain store (no '{ELEVATION}' array)") from None

    @property
    def group(self) -> zarr.Group:
        if self._group is None:  # opened again on first use after a result was committed (write_result)
            self._group = self._open_group(self.path, "r+")
        return self._group

    @group.setter
    def group(self, group: zarr.Group | None) -> None:
        self._group, self._elevation, self._arrays = group, None, {}

    def array(self, name: str) -> zarr.Array:
        """The array ``name`` of the group (``elevation`` or a result's path), looked up once, by one
        thread (a lookup reads its zarr.json
        through zarr's event loop, one at a time: 16 parallel readers of a result's shards, each looking
        it up, waited up to 33 ms on the H100 machine) -- and again once its zarr.json is another file
        (a result written again, by this handle or another process, comes under a new name)."""
        if name == ELEVATION:
            return self.elevation
        try:
            st = os.stat(self.path / name / "zarr.json")
            stamp = (st.st_ino, st.st_mtime_ns)
        except OSError:
            stamp = None  # (the lookup below says what is missing)
        got = self._arrays.get(name)
        if got is None or got[1] != stamp:
            with _LOOKUP_LOCK:
                got = self._arrays.get(name)
                if got is None or got[1] != stamp:
                    got = self._arrays[name] = (_node(self.group, name, self.path), stamp)
        return got[0]

    @property
    def elevation(self) -> zarr.Array:
        if self._elevation is None:
            self._elevation = _node(self.group, ELEVATION, self.path)
        return self._elevation

    @elevation.setter
    def elevation(self, arr: zarr.Array) -> None:
        self._elevation = arr

    @property
    def format_version(self) -> int:
        return int(self.attrs.get("format_version", 1))

    @staticmethod
    def _open_group(path: Path, mode: str) -> zarr.Group:
        """The store's group on a :class:`~terrain_io.integrity.CheckedStore`: every chunk zarr reads
        is checked against its array's manifest and checksums first."""
        with open(path / "zarr.json") as f:
            version = int(json.load(f).get("attributes", {}).get("format_version", 1))
        checked = integrity.CheckedStore(path, read_only=mode == "r",
                                         integrity=integrity.Integrity(path, strict=version >= 2))
        return zarr.open_group(store=checked, mode=mode)

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def open(cls, path, mode: str = "r+") -> "TerrainStore":
        path = Path(path)
        if not (path / "zarr.json").is_file():
            raise StoreError(f"{path}: no such store (expected a Zarr v3 group made by 'terrain convert')")
        try:
            group = cls._open_group(path, mode)
        except Exception as exc:  # corrupt metadata
            raise StoreError(f"{path}: cannot open store: {exc}") from exc
        store = cls(group, path)
        if store.format_version < 2 and str(path.resolve()) not in _WARNED:
            _WARNED.add(str(path.resolve()))
            warnings.warn(f"{path}: format_version {store.format_version}: its chunks carry no checksums, so "
                          "damage inside one cannot be detected (convert it again to add them)",
                          UnverifiedStoreWarning, stacklevel=2)
        return store

    @classmethod
    def create(
        cls,
        path,
        shape: tuple[int, int],
        dtype="float32",
        *,
        tile: int = DEFAULT_TILE,
        shard: int = DEFAULT_SHARD,
        nodata=None,
        attrs: dict | None = None,
    ) -> "TerrainStore":
        """Make a new store at ``path`` (which must not exist) with an empty ``elevation`` array."""
        check_tiling(tile, shard)
        rows, cols = (int(s) for s in shape)
        if rows <= 0 or cols <= 0:
            raise StoreError(f"DEM shape must be positive, got {rows} x {cols}")
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            nodata = None if nodata is None or np.isnan(nodata) else nodata
        meta = {
            "format": "terrain",
            "format_version": FORMAT_VERSION,
            "tile_size": tile,
            "shard_size": shard,
            "nodata": None if dtype.kind == "f" else nodata,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            # Which elevation this is: each result records it, and is refused once the store holds another.
            "generation": uuid.uuid4().hex,
        }
        meta.update(attrs or {})
        if os.path.lexists(path) and (not os.path.isdir(path) or os.listdir(path)):
            raise StoreError(f"{path}: exists already (a new store needs a new folder)")
        group = _new_group(path, meta)  # (zarr's bytes, files written directly: one way for every array we make)
        write_node(os.path.join(path, ELEVATION),
                   tiled_array_metadata((rows, cols), dtype, tile, shard, fill_value_for(dtype, meta["nodata"])))
        write_coordinate_files(path, (rows, cols), meta.get("transform"), meta.get("crs"))
        store = cls(group, Path(path))
        before_commit(path, store.seal)  # made under an atomic temporary (convert, synth): sealed when complete
        return store

    def seal(self) -> None:
        """Write the manifest of every array of the store (:func:`terrain_io.integrity.seal`): call it
        once the arrays are written. Stores made by :func:`terrain_io.convert.convert`,
        :func:`terrain_io.synth.synthesize` and :meth:`from_array` are sealed already."""
        integrity.seal(self.path)
        self.group = None  # (opened again when next used)

    @classmethod
    def from_array(cls, path, values: np.ndarray, *, tile: int = DEFAULT_TILE, shard: int = DEFAULT_SHARD,
                   nodata=None, attrs: dict | None = None) -> "TerrainStore":
        """A store holding the in-memory 2-D array ``values`` (tests, small DEMs), with statistics."""
        values = np.asarray(values)
        if values.ndim != 2:
            raise StoreError(f"a DEM is 2-D, got shape {values.shape}")
        store = cls.create(path, values.shape, values.dtype, tile=tile, shard=shard, nodata=nodata, attrs=attrs)
        store.elevation[...] = values
        store.update_attrs(**statistics(values, store.nodata).as_attrs())
        if not before_commit(path, store.seal):
            store.seal()
        return store

    # -- geometry -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.elevation.shape)

    @property
    def tile_size(self) -> int:
        return int(self.attrs["tile_size"])

    @property
    def shard_size(self) -> int:
        return int(self.attrs["shard_size"])

    @property
    def dtype(self) -> np.dtype:
        return self.elevation.dtype

    @property
    def nodata(self):
        return self.attrs.get("nodata")

    @property
    def transform(self) -> tuple[float, ...] | None:
        """GDAL geotransform (x0, dx, rx, y0, ry, dy) or None."""
        t = self.attrs.get("transform")
        return tuple(t) if t else None

    @property
    def geotransform(self) -> tuple[float, ...]:
        """The geotransform, or :data:`CELL_TRANSFORM` (cell indices) where the store has none."""
        return self.transform or CELL_TRANSFORM

    @property
    def crs(self) -> str | None:
        return self.attrs.get("crs")

    @property
    def cell_size(self) -> tuple[float, float]:
        """(dx, dy) in map units, positive; (1, 1) when the store has no transform."""
        cs = self.attrs.get("cell_size")
        return (float(cs[0]), float(cs[1])) if cs else (1.0, 1.0)

    @property
    def metric_cell_size(self) -> tuple[float, float]:
        """Cell size (dx, dy) in metres: the map units', or for a geographic CRS degrees scaled at the
        DEM's mid latitude (a local approximation, good for DEMs a few degrees across). Step lengths,
        areas and volumes use it."""
        dx, dy = self.cell_size
        if self.crs and self.transform:
            try:
                from rasterio.crs import CRS

                if CRS.from_user_input(self.crs).is_geographic:
                    _, lat = self.cell_to_map(self.shape[0] / 2, self.shape[1] / 2)
                    return dx * 111_320.0 * float(np.cos(np.radians(lat))), dy * 110_574.0
            except Exception:  # an unreadable CRS: keep map units
                pass
        return dx, dy

    @property
    def tile_grid(self) -> tuple[int, int]:
        """Number of tile rows and columns (the last ones may be partial)."""
        t = self.tile_size
        return -(-self.shape[0] // t), -(-self.shape[1] // t)

    @property
    def shard_grid(self) -> tuple[int, int]:
        s = self.tile_size * self.shard_size
        return -(-self.shape[0] // s), -(-self.shape[1] // s)

    def tile_window(self, tr: int, tc: int) -> Window:
        t = self.tile_size
        rows, cols = self.shape
        return Window(tr * t, min((tr + 1) * t, rows), tc * t, min((tc + 1) * t, cols))

    def shard_window(self, sr: int, sc: int) -> Window:
        s = self.tile_size * self.shard_size
        rows, cols = self.shape
        return Window(sr * s, min((sr + 1) * s, rows), sc * s, min((sc + 1) * s, cols))

    def shards(self) -> Iterator[Window]:
        """Shard windows in Morton order (the unit of parallel, non-overlapping writes)."""
        for sr, sc in morton_order(*self.shard_grid):
            yield self.shard_window(int(sr), int(sc))

    def map_to_cell(self, x, y):
        """(row, col) of the cell containing map coordinates (x, y); cell coordinates without a transform.

        Arrays give int64 arrays, with -1 (outside any DEM) where a coordinate is not finite or too far off.
        """
        t = self.transform
        if t is None:
            row, col = np.floor(y), np.floor(x)
        else:
            x0, dx, rx, y0, ry, dy = t
            det = dx * dy - rx * ry
            with np.errstate(invalid="ignore", over="ignore"):  # inf (a failed reprojection): -1 below
                col = np.floor(((x - x0) * dy - (y - y0) * rx) / det)
                row = np.floor(((y - y0) * dx - (x - x0) * ry) / det)
        if np.ndim(row) == 0 and np.ndim(col) == 0:
            return int(row), int(col)
        row, col = np.broadcast_arrays(np.asarray(row, np.float64), np.asarray(col, np.float64))
        ok = (np.abs(row) < 2.0**62) & (np.abs(col) < 2.0**62)  # NaN and inf fail too
        return np.where(ok, row, -1).astype(np.int64), np.where(ok, col, -1).astype(np.int64)

    def cell_to_map(self, row, col):
        """Map coordinates of cell centres (arrays allowed)."""
        x0, dx, rx, y0, ry, dy = self.geotransform
        r = np.asarray(row, dtype=np.float64) + 0.5
        c = np.asarray(col, dtype=np.float64) + 0.5
        return x0 + c * dx + r * rx, y0 + c * ry + r * dy

    # -- reading --------------------------------------------------------------------------
    def read(self, window: Window, array: str = ELEVATION, halo: int = 0, out: np.ndarray | None = None
             ) -> np.ndarray:
        """Cells of ``window`` grown by ``halo``; cells outside the DEM hold the array's fill value.
        A window inside one shard is decoded here (:func:`read_shard`, parallel threads scale; into
        ``out`` when given), the rest by zarr (then copied into ``out``)."""
        arr = self.array(array)
        rows, cols = arr.shape
        sh = arr.shards
        if (halo == 0 and sh is not None and 0 <= window.r0 < window.r1 <= rows and 0 <= window.c0 < window.c1 <= cols
                and (window.r1 - 1) // sh[0] == window.r0 // sh[0] and (window.c1 - 1) // sh[1] == window.c0 // sh[1]):
            whole = window.r0 % sh[0] == 0 and window.c0 % sh[1] == 0 and window.r1 == min(window.r0 + sh[0], rows) \
                and window.c1 == min(window.c0 + sh[1], cols)
            return read_shard(arr, window.r0 // sh[0], window.c0 // sh[1], None if whole else window, out)
        if out is not None:
            out[...] = self.read(window, array, halo)
            return out
        r0, r1, c0, c1 = window.r0 - halo, window.r1 + halo, window.c0 - halo, window.c1 + halo
        out = np.full((r1 - r0, c1 - c0), arr.fill_value, dtype=arr.dtype)
        rr0, rr1, cc0, cc1 = max(r0, 0), min(r1, rows), max(c0, 0), min(c1, cols)
        if rr0 < rr1 and cc0 < cc1:
            out[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0] = arr[rr0:rr1, cc0:cc1]
        return out

    def tiles(self, halo: int = 1, array: str = ELEVATION) -> Iterator[Tile]:
        """Every tile in global Morton order, each with a ``halo``-cell border of its neighbours.

        Reads one shard (plus its halo) at a time, so memory stays O(shard) whatever the DEM size.
        """
        t, s = self.tile_size, self.shard_size
        inner = morton_order(s, s)
        for win in self.shards():
            block = self.read(win, array, halo)
            tr0, tc0 = win.r0 // t, win.c0 // t
            for ir, ic in inner:
                tw = self.tile_window(tr0 + int(ir), tc0 + int(ic))
                if tw.r0 >= win.r1 or tw.c0 >= win.c1 or tw.r1 <= tw.r0 or tw.c1 <= tw.c0:
                    continue  # past the DEM's edge in a partial shard
                lr, lc = tw.r0 - win.r0, tw.c0 - win.c0
                h, w = tw.shape
                yield Tile(tr0 + int(ir), tc0 + int(ic), tw.r0, tw.c0, h, w, halo,
                           block[lr : lr + h + 2 * halo, lc : lc + w + 2 * halo])

    def require_finite(self) -> None:
        """Refuse elevations of +-inf (its statistics say; convert refuses them, a store written
        otherwise may hold them): no weight of them is a number (inf - inf)."""
        lo, hi = self.attrs.get("min"), self.attrs.get("max")
        if lo is not None and hi is not None and not (math.isfinite(lo) and math.isfinite(hi)):
            raise InputError(f"{self.path}: holds infinite elevations ({lo} .. {hi}): make them nodata")

    def valid(self, values: np.ndarray) -> np.ndarray:
        """Vertex mask of elevation values read from this store."""
        return valid_mask(values, self.nodata)

    # -- results --------------------------------------------------------------------------
    def results(self) -> dict[str, dict]:
        """Every array of the store other than ``elevation``: path -> attributes (with shape, dtype)."""
        found = {}
        for name, node in self.group.members(max_depth=None):
            if name.startswith("overviews/"):  # pyramids of the arrays (terrain_io.overviews), not results
                continue
            if isinstance(node, zarr.Array) and name != ELEVATION and name.rsplit("/", 1)[-1] not in COORDINATES:
                found[name] = {"shape": tuple(node.shape), "dtype": str(node.dtype), **dict(node.attrs)}
        for name, node in self.group.members(max_depth=None):
            if isinstance(node, zarr.Group) and node.attrs and not name.startswith("overviews/"):
                found.setdefault(name, {}).update(dict(node.attrs))
        return dict(sorted(found.items()))

    @contextlib.contextmanager
    def write_result(self, name: str, attrs: dict | None = None):
        """Write the result group ``name`` (e.g. ``"mst"``, ``"sssp/a"``) atomically.

        Yields a :class:`ResultWriter` on a temporary group staged inside the store (hidden: see
        :meth:`~terrain_io.integrity.CheckedStore.list_dir`; so a writable store in a read-only folder
        takes results); on normal exit it is renamed into place (replacing an older result of that
        name), its parent groups made just before; on any exception (Ctrl-C included) it is removed
        and the store keeps exactly what it had.
        """
        parts = check_result_name(name)
        generation = self.attrs.get("generation")
        attrs = dict(attrs or {}, **({"generation": generation} if generation is not None else {}))
        made: list[Path] = []
        try:
            with contextlib.ExitStack() as commit:
                with atomic_directory(self.path.joinpath(*parts), tmp_parent=self.path) as tmp:
                    group = _ChecksumGroup(_new_group(tmp, attrs)._async_group)
                    writer = ResultWriter(self, group)
                    yield writer
                    writer.write_attributes()
                    # complete: the manifest of each of its arrays, then renamed into place
                    integrity.seal(tmp, staged=True, ahead=writer.sealed)
                    commit.enter_context(self._unchanged(name))
                    made = self._require_parents(parts)
        except BaseException:
            for folder in reversed(made):  # parent groups made for this result, still empty
                with contextlib.suppress(OSError), folder_lock(folder):  # a concurrent result moves in under it
                    if os.listdir(folder) == ["zarr.json"]:
                        os.unlink(folder / "zarr.json")
                        os.rmdir(folder)
            raise
        self.group = None  # the store's group opened again when next used (not by every command: ~1 ms)

    def _require_parents(self, parts: list[str]) -> list[Path]:
        """Make the groups above the result ``parts`` (zarr v3 needs their zarr.json); the folders made."""
        made = []
        for i in range(1, len(parts)):
            folder = self.path.joinpath(*parts[:i])
            if not (folder / "zarr.json").exists():
                with contextlib.suppress(FileExistsError):  # (made meanwhile by a concurrent result)
                    _new_group(folder)
                    made.append(folder)
        return made

    @contextlib.contextmanager
    def _unchanged(self, name: str):
        """Hold the lock under which a store is replaced (:func:`terrain_io.atomic.replace` locks the
        store's folder) while a result is renamed into it, after checking that the store still holds
        the elevation the result was computed from: a ``convert --overwrite`` that replaced it meanwhile
        makes the result stale, and it is not written."""
        with folder_lock(self.path.resolve().parent):  # (the store given as '.': its real parent, not '.')
            now = integrity.node_attrs(self.path).get("generation")
            if now != self.attrs.get("generation"):
                raise StoreError(f"{self.path}: the store was replaced while {name} was computed (another "
                                 f"elevation now): {name} is not written; run the command again")
            yield

    def lock(self, name: str = "store", shared: bool = False, wait: bool = True):
        """An advisory inter-process lock named ``name`` on this store (a hidden lock file inside it: a
        store in a read-only folder can be locked)."""
        return locked(self.path / f".{name.replace('/', '_')}.lock", shared=shared, wait=wait)

    def update_attrs(self, **attrs) -> None:
        self.group.attrs.update(attrs)
        self.attrs.update(attrs)


@dataclass
class Statistics:
    """Running value range and vertex count of a DEM, accumulated block by block."""

    minimum: float = float("inf")
    maximum: float = float("-inf")
    valid: int = 0
    cells: int = 0

    def add(self, values: np.ndarray, nodata) -> None:
        values = np.asarray(values)
        if values.dtype.kind not in "iuf":
            raise StoreError(f"DEM values must be numbers, got {values.dtype}")
        self.cells += values.size
        if values.dtype.kind == "f":  # NaN-aware reductions: no masked copy of the band
            n = values.size - int(np.count_nonzero(np.isnan(values)))
            if n:
                lo, hi = np.nanmin(values), np.nanmax(values)
        else:
            ok = valid_mask(values, nodata)
            n = int(np.count_nonzero(ok))
            if n:
                info = np.iinfo(values.dtype)
                lo, hi = values.min(where=ok, initial=info.max), values.max(where=ok, initial=info.min)
        if n:
            self.minimum = min(self.minimum, float(lo))
            self.maximum = max(self.maximum, float(hi))
            self.valid += n

    def merge(self, other: "Statistics") -> None:
        """Fold in the statistics of another part of the DEM."""
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)
        self.valid += other.valid
        self.cells += other.cells

    def as_attrs(self) -> dict:
        has = self.valid > 0
        return {"min": self.minimum if has else None, "max": self.maximum if has else None,
                "valid_count": self.valid, "cell_count": self.cells}


def write_elevation_window(store_path, window: Window, values: np.ndarray, nodata=None) -> Statistics:
    """Write ``values`` to ``window`` of the store's elevation (opened by path: usable in a Dask task)
    and return their statistics."""
    zarr.open_array(f"{store_path}/{ELEVATION}", mode="r+")[window.slices] = values
    return statistics(values, nodata)


def statistics(values: np.ndarray, nodata) -> Statistics:
    stats = Statistics()
    stats.add(values, nodata)
    return stats


_WARNED: set[str] = set()
_LOOKUP_LOCK = threading.Lock()  # (TerrainStore.array)


def with_checksum(compressors):
    """``compressors`` (zarr's argument: None, a codec, a list, or "auto") with the crc32c codec last."""
    if compressors is None:
        compressors = ()
    elif compressors == "auto":
        compressors = (ZstdCodec(level=0),)  # zarr's own default for numbers
    elif not isinstance(compressors, (list, tuple)):
        compressors = (compressors,)
    compressors = tuple(compressors)
    return compressors if compressors and isinstance(compressors[-1], Crc32cCodec) else compressors + (_CHECKSUM,)


def _node(group: zarr.Group, name: str, path) -> zarr.Array | zarr.Group:
    """``group[name]``; a zarr.json that is JSON but not zarr's metadata (edited: a shape without its
    chunks' dimensions, a codec unknown) is DamagedStoreError, as one that is not JSON is
    (:class:`~terrain_io.integrity.CheckedStore`), not zarr's ValueError (a bug's line to the user)."""
    try:
        return group[name]
    except (ValueError, TypeError) as exc:
        if any(part in (".", "..") for part in name.split("/")):  # (a path zarr refuses: no such node)
            raise KeyError(name) from None
        raise DamagedStoreError(path, name, None, f"its zarr.json is not valid metadata ({exc})") from None


def _new_group(folder, attrs: dict | None = None) -> zarr.Group:
    """The group ``folder`` made as ``zarr.open_group(folder, mode="w-", attributes=attrs)`` makes it
    (zarr's own bytes of its zarr.json; an existing one is FileExistsError), without zarr's event loop:
    every result pays it (~1 ms of a 2-core machine's CPU a call)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.group import AsyncGroup, GroupMetadata
    from zarr.storage import LocalStore, StorePath

    meta = GroupMetadata(attributes=dict(attrs or {}))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "zarr.json"), "xb") as f:
        f.write(meta.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes())
    return zarr.Group(AsyncGroup(meta, StorePath(LocalStore(str(folder)))))


class _ChecksumGroup(zarr.Group):
    """The group of a result being written: every array created in it carries chunk checksums, whatever
    compressors its caller asked for (so the SSSP index's plain chunks end in a crc32c too)."""

    def create_array(self, name, **kwargs):
        kwargs["compressors"] = with_checksum(kwargs.get("compressors", "auto"))
        return super().create_array(name, **kwargs)


class ResultWriter:
    """Creates result arrays tiled and sharded like ``elevation`` inside a temporary result group."""

    def __init__(self, store: TerrainStore, group: zarr.Group):
        self.store = store
        self.group = group
        self._coordinates = False
        self.sealed: integrity.SealedAhead | None = None  # (integrity.seal_ahead: part of the seal done early)
        # The group's attributes, written into its zarr.json once, when the result is complete
        # (write_attributes): zarr's attrs.update replaces the file by a rename, which ext4 makes wait
        # for the result's shard data still being written out (auto_da_alloc): 0.40 s after the GPU
        # SSSP's 2.6 GB at 32768^2 (benchmarks/RESULTS.md, session 20), each update again.
        self.attrs: dict = dict(group.attrs)
        self._written_attrs = dict(self.attrs)

    def create_array(self, name: str, dtype, fill_value, attrs: dict | None = None) -> zarr.Array:
        """The array ``name`` tiled and sharded as ``elevation`` (:func:`tiled_array_metadata`), its
        zarr.json (and the coordinates') written as files, the bytes zarr writes, without zarr's event
        loop (~8 ms of a result's fixed cost on a 2-core machine, where a 8192^2 array's write to the
        floor takes 0.2 s)."""
        root = str(self.group.store.root)
        if not self._coordinates:  # each result group carries x, y, spatial_ref: it opens alone in xarray
            write_coordinate_files(root, self.store.shape, self.store.transform, self.store.crs)
            self._coordinates = True
        meta = tiled_array_metadata(self.store.shape, np.dtype(dtype), self.store.tile_size, self.store.shard_size,
                                    fill_value, attrs)
        if os.path.exists(os.path.join(root, name, "zarr.json")):
            raise StoreError(f"{name}: the result already has an array of that name")
        write_node(os.path.join(root, name), meta)
        return array_handle(root, name, meta)

    def write_attributes(self) -> None:
        """The group's zarr.json with :attr:`attrs`, where they changed: zarr's bytes
        (:func:`write_node`), in a new file in place of the old one (no rename over it, no
        truncation: neither waits for the data being written out)."""
        if self.attrs == self._written_attrs:
            return
        if self.sealed is not None:  # (its nodes' digests were taken: verify would call the result damaged)
            raise RuntimeError("a result sealed ahead (integrity.seal_ahead) cannot take new attributes")
        root = str(self.group.store.root)
        os.unlink(os.path.join(root, "zarr.json"))
        write_node(root, group_metadata(self.attrs))
        self._written_attrs = dict(self.attrs)


def _plain_checksum(arr: zarr.Array) -> bool | None:
    """Whether the plain chunks of ``arr`` end in a crc32c; None when they are not plain (see below)."""
    from zarr.codecs import BytesCodec
    from zarr.storage import LocalStore

    codecs = tuple(getattr(arr.metadata, "codecs", ()))
    crc = len(codecs) == 2 and isinstance(codecs[1], Crc32cCodec)
    if not (isinstance(arr.store, LocalStore) and len(codecs) == 1 + crc and isinstance(codecs[0], BytesCodec)
            and (codecs[0].endian is None or codecs[0].endian.value == "little") and sys.byteorder == "little"):
        return None
    return crc


def plain_chunk_file(arr: zarr.Array, coords) -> str | None:
    """The file of chunk ``coords`` of ``arr`` when its chunks are stored as plain little-endian bytes
    on local disk (no compression, no sharding: the SSSP index), followed by their crc32c (format 2)
    or not (format 1), else None.

    zarr funnels every chunk read and write through one event-loop thread (benchmarks/RESULTS.md,
    "Measurements behind decisions in the code"); such chunks are read and written as files directly
    instead, at disk speed from parallel threads.
    """
    if _plain_checksum(arr) is None:
        return None
    return os.path.join(arr.store.root, arr.path, arr.metadata.encode_chunk_key(tuple(coords)))


def _integrity_of(arr: zarr.Array):
    """The :class:`~terrain_io.integrity.Integrity` of the store ``arr`` was opened from (a
    TerrainStore), else None (an array being written, or opened by plain zarr)."""
    return getattr(arr.store, "integrity", None)


def _damaged(arr: zarr.Array, chunk, problem: str, unit: str = "chunk"):
    root = getattr(arr.store, "root", "store")
    return DamagedStoreError(root, arr.path, chunk, problem, unit=unit)


def read_plain_chunk(arr: zarr.Array, coords, out: np.ndarray) -> bool:
    """Read chunk ``coords`` (stored whole, edge chunks padded with the fill value) straight into
    ``out``; False when it is not a plain chunk file (see :func:`plain_chunk_file`): use zarr."""
    path = plain_chunk_file(arr, coords)
    if path is None or not out.flags.c_contiguous or out.dtype != arr.dtype or tuple(arr.chunks) != out.shape:
        return False
    crc = _plain_checksum(arr)
    key = arr.metadata.encode_chunk_key(tuple(coords))
    check = _integrity_of(arr)
    try:
        with open(path, "rb", buffering=0) as f:
            got = f.readinto(memoryview(out).cast("B"))
            stored = f.read(integrity.CRC_BYTES + 1) if crc else b""
    except FileNotFoundError:  # never written: all fill value (unless the manifest lists it)
        if check is not None:
            check.check_entry(arr.path, key, None)
        out[...] = arr.fill_value
        return True
    size = got + len(stored)
    if check is not None:
        check.check_entry(arr.path, key, size)
    if got != out.nbytes or len(stored) != (integrity.CRC_BYTES if crc else 0):
        raise _damaged(arr, coords, f"chunk file {key} is {size} bytes, not {out.nbytes + (4 if crc else 0)}")
    if crc and integrity.crc32c(out) != stored:
        raise _damaged(arr, coords, "chunk fails its checksum")
    return True


def write_block(arr: zarr.Array, start, block: np.ndarray) -> None:
    """``arr[start : start + block.shape] = block``. When the chunks are plain files (see
    :func:`plain_chunk_file`), every chunk the block covers whole is written straight into its file
    (one at the array's edge padded with the fill value, as zarr stores it), any other through zarr."""
    stop = [s + n for s, n in zip(start, block.shape)]
    if plain_chunk_file(arr, (0,) * arr.ndim) is None:
        arr[tuple(slice(a, b) for a, b in zip(start, stop))] = block
        return
    chunks = tuple(arr.chunks)
    for idx in itertools.product(*(range(a // c, -(-b // c)) for a, b, c in zip(start, stop, chunks))):
        lo = [i * c for i, c in zip(idx, chunks)]
        hi = [min(a + c, n) for a, c, n in zip(lo, chunks, arr.shape)]
        got_lo = [max(a, s) for a, s in zip(lo, start)]
        got_hi = [min(b, e) for b, e in zip(hi, stop)]
        part = block[tuple(slice(a - s, b - s) for a, b, s in zip(got_lo, got_hi, start))]
        if got_lo != lo or got_hi != hi:  # part of a chunk: zarr reads, merges and rewrites it
            arr[tuple(slice(a, b) for a, b in zip(got_lo, got_hi))] = part
            continue
        if part.shape != chunks:
            whole = np.full(chunks, arr.fill_value, dtype=arr.dtype)
            whole[tuple(slice(0, n) for n in part.shape)] = part
            part = whole
        path = plain_chunk_file(arr, idx)
        part = np.ascontiguousarray(part, dtype=arr.dtype)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb", buffering=0) as f:
            f.write(memoryview(part).cast("B"))
            if _plain_checksum(arr):
                f.write(integrity.crc32c(part))


def shard_layout(arr: zarr.Array):
    """(chunk shape, zstd level, chunk crc32c) when ``arr`` is stored as this tool writes its tiled
    arrays -- on local disk, sharded, each chunk little-endian bytes + zstd (+ crc32c from format 2
    on), the shard index (bytes + crc32c) at the end -- else None: then :func:`read_shard` and
    :func:`write_shard` leave it to zarr. Level None: chunks stored as their bytes (+ crc32c), not
    compressed (the overviews' levels: terrain_io.overviews.LEVEL_ZSTD)."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
    from zarr.storage import LocalStore

    codecs = getattr(arr.metadata, "codecs", ())
    if not (isinstance(arr.store, LocalStore) and len(codecs) == 1 and isinstance(codecs[0], ShardingCodec)
            and sys.byteorder == "little"):
        return None
    sh = codecs[0]
    inner, index = tuple(sh.codecs), tuple(sh.index_codecs)
    little = lambda c: isinstance(c, BytesCodec) and (c.endian is None or c.endian.value == "little")  # noqa: E731
    crc = len(inner) > 1 and isinstance(inner[-1], Crc32cCodec)
    zstd = inner[1] if len(inner) == 2 + crc else None
    if (len(inner) - crc - (zstd is not None) != 1 or not little(inner[0])
            or (zstd is not None and (not isinstance(zstd, ZstdCodec) or zstd.checksum))
            or len(index) != 2 or not little(index[0]) or not isinstance(index[1], Crc32cCodec)
            or sh.index_location.value != "end"):
        return None
    return tuple(sh.chunk_shape), None if zstd is None else zstd.level, crc


NO_CHUNK = np.uint64(integrity.NO_CHUNK)  # a shard index entry of a chunk not stored


def _shard_region(arr: zarr.Array, sr: int, sc: int):
    sh0, sh1 = arr.shards
    return sr * sh0, min((sr + 1) * sh0, arr.shape[0]), sc * sh1, min((sc + 1) * sh1, arr.shape[1])


def write_window(arr: zarr.Array, win: Window, block: np.ndarray, whole_shard: bool) -> None:
    """Write the cells of ``win``: a whole shard encoded here (:func:`write_shard`, parallel threads
    scale), a part of one through zarr (which rewrites the shard: parts of a shard in order)."""
    if whole_shard:
        sh0, sh1 = arr.shards
        write_shard(arr, win.r0 // sh0, win.c0 // sh1, block)  # (any strides: each chunk is copied out)
    else:
        arr[win.slices] = block


def read_window(arr: zarr.Array, win: Window, whole_shard: bool) -> np.ndarray:
    """The cells of ``win``: a whole shard decoded here (:func:`read_shard`), a part through zarr."""
    if whole_shard:
        sh0, sh1 = arr.shards
        return read_shard(arr, win.r0 // sh0, win.c0 // sh1)
    return np.asarray(arr[win.slices])


def read_shard(arr: zarr.Array, sr: int, sc: int, part: Window | None = None, out: np.ndarray | None = None,
               each=None) -> np.ndarray | None:
    """The cells of shard (sr, sc) of a 2-D sharded array (clipped at the array's edge), or of
    ``part`` of it (a window of the array inside that shard: only the chunks it touches are read
    and decoded, each from its offset in the file); decoded into ``out`` when given (an array of
    that shape and the array's dtype, any strides: a view of a band buffer), which is returned.
    With ``each``, no array: ``each(r, c, cells)`` takes every stored chunk as it is decoded (in
    whichever thread decodes it) -- ``cells`` its part inside the window, (r, c) the array cell of
    cells[0, 0] -- and the chunks not stored are all fill value (a reader that reduces the chunks
    as they come: terrain_io.overviews; only for this tool's layout, :func:`shard_layout`).

    zarr decodes every chunk in one event-loop thread and reads a part of a shard through its event
    loop too (benchmarks/RESULTS.md, "Measurements behind decisions in the code"); this reads the shard file
    into one buffer -- the kernel asked to read it all ahead, the bytes taken in pieces of 1 MiB, each
    chunk decoded as soon as its bytes are in (a cold read overlaps the decoding) -- and decodes its
    chunks here, straight from views of it: in runs a GIL-free call, queued for whichever thread is
    free (:class:`_ReadyRuns`: the codec pool's on idle cores, the readers' own once their bytes are
    in), so that one reader uses every core and parallel readers share them; chunk by chunk where
    the kernels cannot run (:func:`_run_chunks`: in the pool from the main thread, else in the
    reader's own thread). The shard index's crc32c is checked,
    as zarr does, and each chunk's (format 2), and the file against the array's manifest: damage
    raises DamagedStoreError. Other layouts: through zarr."""
    r0, r1, c0, c1 = _shard_region(arr, sr, sc)
    if part is not None:
        if not (r0 <= part.r0 <= part.r1 <= r1 and c0 <= part.c0 <= part.c1 <= c1):
            raise ValueError(f"{part} is not inside shard ({sr}, {sc})")
        r0, r1, c0, c1 = part.r0, part.r1, part.c0, part.c1
    if each is not None:
        out = None
    elif out is None:
        out = np.empty((r1 - r0, c1 - c0), dtype=arr.dtype)
    elif out.shape != (r1 - r0, c1 - c0) or out.dtype != arr.dtype:
        raise ValueError(f"out is {out.shape} {out.dtype}, the cells are {(r1 - r0, c1 - c0)} {arr.dtype}")
    fmt = shard_layout(arr)
    if fmt is None:
        if each is not None:
            raise ValueError(f"{arr.path}: not stored as this tool's shards")
        out[...] = arr[r0:r1, c0:c1]
        return out
    from numcodecs import Zstd

    (t0, t1), level, crc = fmt
    s0, s1 = sr * arr.shards[0], sc * arr.shards[1]  # the shard's first cell
    whole = part is None

    def absent(i, j):  # all fill value: only these cells are filled, not the whole window first
        if out is not None:
            a0, b0 = s0 + i * t0, s1 + j * t1
            out[max(a0, r0) - r0 : min(a0 + t0, r1) - r0, max(b0, c0) - c0 : min(b0 + t1, c1) - c0] = arr.fill_value

    with _shard_file(arr, sr, sc, ahead=whole) as opened:
        if opened is None:  # never written: all fill value
            if out is not None:
                out[...] = arr.fill_value
            return out
        fd, index, body = opened
        jobs = _chunk_jobs(arr, sr, sc, index, body, crc, range((r0 - s0) // t0, -(-(r1 - s0) // t0)),
                           range((c0 - s1) // t1, -(-(c1 - s1) // t1)), absent)
        if whole:  # the body into one buffer (its chunks numpy views: no copies), piece by piece ahead of use
            jobs.sort(key=lambda job: job[2])
            raw = np.empty(body, np.uint8)
            arriving = _read_ahead(fd, raw, jobs, arr, (sr, sc))
        else:  # the chunks the window touches: one read where they lie together (a quadrant, in Morton order)
            raw, jobs = _read_chunks(fd, jobs, arr, (sr, sc))
            arriving = [jobs]
        cells_bytes = (r1 - r0) * (c1 - c0) * arr.dtype.itemsize
        chunkcodec = _codec_runs(cells_bytes)
        if each is None and chunkcodec is not None and chunkcodec.as_bits(out) is not None and out.flags.writeable:
            def decode_run(run):
                """Check, decode and place a run of chunks in one call that releases the GIL."""
                status = chunkcodec.decode_run(raw, np.array(run, np.int64), (t0, t1), (r0 - s0, c0 - s1), out,
                                               level, crc)
                for (i, j, _, _), problem in zip(run, status.tolist()):
                    if problem:
                        raise _damaged(arr, (sr * index.shape[0] + i, sc * index.shape[1] + j),
                                       chunkcodec.PROBLEMS[problem])

            # (each piece's chunks, as its bytes come in, in runs of _READ_RUN_BYTES of cells to the
            # process's queue of ready runs: decoded by whichever thread is free, this one once all is read)
            per = max(1, _READ_RUN_BYTES // (t0 * t1 * arr.dtype.itemsize))
            _READY_RUNS.decode(decode_run, ([piece[k : k + per] for k in range(0, len(piece), per)]
                                            for piece in arriving))
            return out
        # A reader in the main thread (tiles(), export, path) or in a cluster task (a local-cuda worker's
        # one thread) has the cores to itself: its chunks go to the pool. A pipeline's reader threads
        # already fill the cores with a shard each, and decode in their own thread (H100, 32768^2 MST:
        # 8.34 s so, 8.64 s through the pool; 2-core VM: no gain either).
        nbytes = cells_bytes if owns_cores() else 0
        zstd = Zstd()

        def decode(job):
            """Check, decode and place one chunk (zstd and crc32c release the GIL: threads scale)."""
            i, j, off, nb = job
            where = (sr * index.shape[0] + i, sc * index.shape[1] + j)
            data = _checked(arr, where, raw[off : off + nb], crc)
            if level is None:  # stored as its bytes: the chunk is a view of the buffer
                if len(data) != t0 * t1 * arr.dtype.itemsize:
                    raise _damaged(arr, where, f"chunk holds {len(data)} bytes")
                chunk = data.view(arr.dtype).reshape(t0, t1)
                if chunk.ctypes.data % arr.dtype.itemsize:  # (after a 4-byte crc32c: not aligned for 8-byte types)
                    chunk = chunk.copy()
            else:
                chunk = np.empty((t0, t1), arr.dtype)
                try:
                    got = zstd.decode(data, out=chunk)
                except Exception as exc:  # noqa: BLE001 -- a format-1 chunk (no checksum) that does not decode
                    raise _damaged(arr, where, f"chunk does not decode ({exc})") from None
                if memoryview(got).nbytes != chunk.nbytes:
                    raise _damaged(arr, where, f"chunk decodes to {memoryview(got).nbytes} bytes")
            a0, b0 = s0 + i * t0, s1 + j * t1  # the chunk's first cell; its overlap with the window:
            lo0, hi0, lo1, hi1 = max(a0, r0), min(a0 + t0, r1), max(b0, c0), min(b0 + t1, c1)
            if each is not None:
                each(lo0, lo1, chunk[lo0 - a0 : hi0 - a0, lo1 - b0 : hi1 - b0])
            else:
                out[lo0 - r0 : hi0 - r0, lo1 - c0 : hi1 - c0] = chunk[lo0 - a0 : hi0 - a0, lo1 - b0 : hi1 - b0]

        _run_chunks(decode, itertools.chain.from_iterable(arriving), nbytes, len(jobs))
    return out


@contextlib.contextmanager
def _shard_file(arr: zarr.Array, sr: int, sc: int, ahead: bool = False):
    """Shard (sr, sc)'s file of an array in this tool's layout (:func:`shard_layout`), open:
    (fd, index (n0, n1, 2): each chunk's offset and bytes, the body's length) once the file's length
    is checked against the array's manifest and its index against its crc32c; None where it was
    never written (all fill value, unless the manifest lists it). ``ahead``: the kernel asked to read
    the whole file ahead (a whole shard is read)."""
    (t0, t1), _, _ = shard_layout(arr)
    key = arr.metadata.encode_chunk_key((sr, sc))
    check = _integrity_of(arr)
    n0, n1 = arr.shards[0] // t0, arr.shards[1] // t1
    size = n0 * n1 * 16
    try:
        fd = os.open(os.path.join(arr.store.root, arr.path, key), os.O_RDONLY)
    except FileNotFoundError:
        if check is not None:
            check.check_entry(arr.path, key, None)
        yield None
        return
    ahead = ahead and hasattr(os, "posix_fadvise")
    try:
        length = os.fstat(fd).st_size
        if ahead and length >= size + 4:  # the index on its way while the store's metadata is checked
            os.posix_fadvise(fd, length - size - 4, size + 4, os.POSIX_FADV_WILLNEED)
        if check is not None:
            check.check_entry(arr.path, key, length)
        if length < size + 4:
            raise _damaged(arr, (sr, sc), f"shard file {key} truncated ({length} bytes)", unit="shard")
        tail = np.frombuffer(os.pread(fd, size + 4, length - size - 4), np.uint8)
        if ahead:  # the kernel reads the body ahead while its chunks decode (asked for with the index,
            # the index waited behind the whole file; asked for before the first read's metadata check
            # ended, other readers' indexes waited behind it: H100, 8192^2, 16 readers, 0.18-0.24 s against
            # 0.16-0.18 s, benchmarks/RESULTS.md, "The store's read on fast hosts, session 21")
            os.posix_fadvise(fd, 0, length - size - 4, os.POSIX_FADV_WILLNEED)
        index_bytes = tail[:-4]
        if integrity.crc32c(index_bytes) != tail[-4:].tobytes():
            raise _damaged(arr, (sr, sc), "the shard index fails its checksum", unit="shard")
        yield fd, index_bytes.view("<u8").reshape(n0, n1, 2), length - size - 4
    finally:
        os.close(fd)


def _chunk_jobs(arr: zarr.Array, sr: int, sc: int, index, body: int, crc: bool, rows, cols, absent=None) -> list:
    """(i, j, offset, bytes) of the stored chunks of a shard's chunk rows ``rows`` and columns
    ``cols`` (ranges), each checked to lie inside the file's ``body``; ``absent(i, j)`` called for
    those not stored (all fill value)."""
    n0, n1 = index.shape[:2]
    jobs = []
    for i in rows:
        for j in cols:
            off, nb = (int(v) for v in index[i, j])
            if off == NO_CHUNK:
                if absent is not None:
                    absent(i, j)
                continue
            if off + nb > body or nb < 4 * crc:
                raise _damaged(arr, (sr * n0 + i, sc * n1 + j), "chunk lies outside its shard file (bad index)")
            jobs.append((i, j, off, nb))
    return jobs


def _checked(arr: zarr.Array, where, data: np.ndarray, crc: bool) -> np.ndarray:
    """A stored chunk's bytes without their crc32c (``crc``: format 2), checked against it."""
    if not crc:
        return data
    data, stored = data[:-4], data[-4:]
    if integrity.crc32c(data) != stored.tobytes():
        raise _damaged(arr, where, "chunk fails its checksum")
    return data


def shard_frames(arr: zarr.Array, sr: int, sc: int, align: int = 1, out=None):
    """The zstd frames of shard (sr, sc) of an array in this tool's compressed layout, for a decoder
    elsewhere (:mod:`terrain_io.nvzstd`: on the GPU): the file read whole, its index and each chunk's
    crc32c checked as :func:`read_shard` does, the frames where each lies at a multiple of ``align``
    bytes: in the file's body as read, or else copied end to end into a new buffer. (frames (uint8),
    chunks (int64 rows i, j, offset, bytes: the stored chunks, i and j the chunk's row and column in
    the shard)), or None where the file was never written (all fill value). ``out(nbytes)``: the
    uint8 buffer the frames are given in (the body read straight into it where its frames lie
    aligned; e.g. pinned memory, from which they cross the bus at once), else a new array."""
    (t0, t1), level, crc = shard_layout(arr)
    if level is None:
        raise ValueError(f"{arr.path}: chunks stored as their bytes, not zstd frames")
    out = out or (lambda nbytes: np.empty(nbytes, np.uint8))
    with _shard_file(arr, sr, sc, ahead=True) as opened:
        if opened is None:
            return None
        fd, index, body = opened
        n0, n1 = index.shape[:2]
        jobs = _chunk_jobs(arr, sr, sc, index, body, crc, range(n0), range(n1))
        # (the stored bytes of each chunk: its frame, then 4 bytes of crc32c where the layout has them)
        in_place = not any(off % align for _, _, off, _ in jobs)
        raw = out(body) if in_place else np.empty(body, np.uint8)
        _read_span(fd, raw, 0, arr, (sr, sc))
    chunks = np.zeros((len(jobs), 4), np.int64)
    frames = []
    for k, (i, j, off, nb) in enumerate(jobs):
        frames.append(_checked(arr, (sr * n0 + i, sc * n1 + j), raw[off : off + nb], crc))
        chunks[k] = i, j, off, len(frames[-1])
    if in_place:  # (an alignment of 1: the file's body as it is)
        return raw, chunks
    sizes = -(-chunks[:, 3] // align) * align
    chunks[:, 2] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    packed = out(int(sizes.sum()))
    for (_, _, at, nb), frame in zip(chunks.tolist(), frames):
        packed[at : at + nb] = frame
    return packed, chunks


_READ_PIECE = 1 << 20  # bytes read at once, their chunks then queued to decode (_ReadyRuns; 4 MiB: more left at the end)


def _read_span(fd: int, buf: np.ndarray, at: int, arr: zarr.Array, shard) -> None:
    """Fill ``buf`` from offset ``at`` of the file (a file that shrank is damage)."""
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], at + done)
        if n == 0:
            raise _damaged(arr, shard, f"shard file cut while read ({at + done} bytes)", unit="shard")
        done += n


def _read_ahead(fd: int, buf: np.ndarray, jobs: list, arr: zarr.Array, shard):
    """The ``jobs`` (sorted by offset) in runs, each run once its bytes are in ``buf`` (the file
    from its start), read in pieces of at least :data:`_READ_PIECE` ahead of them: a run decodes
    while the kernel brings the next piece (with the readahead asked for). A file that shrank is
    damage."""
    done, k = 0, 0
    while k < len(jobs):
        stop = min(len(buf), max(jobs[k][2] + jobs[k][3], done + _READ_PIECE))
        while done < stop:
            n = os.preadv(fd, [buf[done:stop]], done)
            if n == 0:
                raise _damaged(arr, shard, f"shard file cut while read ({done} of {len(buf)} bytes)", unit="shard")
            done += n
        first = k
        while k < len(jobs) and jobs[k][2] + jobs[k][3] <= done:
            k += 1
        yield jobs[first:k]


def _read_chunks(fd: int, jobs: list, arr: zarr.Array, shard) -> tuple[np.ndarray, list]:
    """The bytes of the chunks ``jobs`` of a shard file, in one buffer: (buffer, the jobs with their
    offsets in it) -- one read of the span they lie in where they lie together (a quadrant, in Morton
    order), else a read each."""
    lo, hi = min((j[2] for j in jobs), default=0), max((j[2] + j[3] for j in jobs), default=0)
    if hi - lo <= 2 * sum(j[3] for j in jobs):
        raw = np.empty(hi - lo, np.uint8)
        _read_span(fd, raw, lo, arr, shard)
        return raw, [(i, j, off - lo, nb) for i, j, off, nb in jobs]
    raw = np.empty(sum(j[3] for j in jobs), np.uint8)
    placed, at = [], 0
    for i, j, off, nb in jobs:
        _read_span(fd, raw[at : at + nb], off, arr, shard)
        placed.append((i, j, at, nb))
        at += nb
    return raw, placed


_READ_RUN_BYTES = 1 << 20  # raw bytes of a run of chunks decoded in one call as a shard is read: small, so
# that the last pieces are decoded on every idle core, not one each (a 4 MiB run: ~12 ms on one core)


class _ReadyRuns:
    """The process's runs of chunks whose bytes are read and not yet decoded, from every reader,
    taken first come first served by the pool's threads on idle cores and by the readers themselves
    once their own bytes are all in.

    A reader thread that decoded its own shard in 4 MiB runs took each piece of 4 MiB only once its last
    byte was in: 16 readers' bytes come interleaved, each shard's last near the disk's end, so every
    reader had up to a piece left to decode on its one core once the disk was done (the tail, ~15 ms at
    8192^2 float32 on the H100 host), and a reader whose shard came early idled while the others
    decoded. Here pieces and runs are of 1 MiB and a run is decoded as soon as a core is free, the last
    ones on all of them (benchmarks/RESULTS.md, "The store's read on fast hosts, session 21"). Small
    runs need cheap calls: numba's dispatcher took ~150 us under the GIL a call
    (:func:`terrain_io.chunkcodec._call` takes ~4). Threads counted as busy: the pool's helpers and
    the readers waiting on their runs (a reader waiting on the disk is not).
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.ready: collections.deque = collections.deque()  # (fn, run, future)
        self.busy = 0

    def decode(self, fn, pieces) -> None:
        """``fn(run)`` of every run of ``pieces`` (an iterable of lists of runs, whose next item may
        wait on the disk), each list queued as it comes; returns once all are done, helping with any
        queued run meanwhile. The first exception is raised (the runs of this call not yet begun are
        dropped)."""
        futures = []
        try:
            for runs in pieces:
                futures.extend(self._post(fn, runs))
            with self.lock:
                self.busy += 1
            try:
                for future in futures:
                    while not future.done() and self._take_one():
                        pass
                    future.result()
            finally:
                with self.lock:
                    self.busy -= 1
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def _post(self, fn, runs) -> list:
        futures = [concurrent.futures.Future() for _ in runs]
        with self.lock:
            self.ready.extend(zip(itertools.repeat(fn), runs, futures))
            helpers = max(0, min(len(self.ready), (os.cpu_count() or 1) - self.busy))
            self.busy += helpers
        pool = codec_pool()
        for _ in range(helpers):
            pool.submit(self._help)
        return futures

    def _take_one(self, helper: bool = False) -> bool:
        """Decode the oldest queued run; False where none is queued (a ``helper`` then counted idle at
        once, so that a run queued next wakes another)."""
        while True:
            with self.lock:
                if not self.ready:
                    self.busy -= helper
                    return False
                fn, run, future = self.ready.popleft()
            if future.set_running_or_notify_cancel():  # (else dropped by its reader's error)
                break
        try:
            future.set_result(fn(run))
        except BaseException as exc:  # noqa: BLE001 -- raised in its reader
            future.set_exception(exc)
        return True

    def _help(self) -> None:
        while self._take_one(helper=True):
            pass


_READY_RUNS = _ReadyRuns()
os.register_at_fork(after_in_child=_READY_RUNS.__init__)  # (a child has none of its parent's threads)


def write_shard(arr: zarr.Array, sr: int, sc: int, block: np.ndarray) -> None:
    """Write the cells of shard (sr, sc) (``block``: the shard clipped at the array's edge, any
    strides) as zarr would -- chunks padded with the fill value, left out when all fill value, in
    Morton order, the index with its crc32c at the end -- but compressed here, its chunks in a pool
    of threads (:func:`_run_chunks`: zstd and crc32c release the GIL), each run of frames written
    as soon as it is encoded, in order, and sent on to the disk (:class:`_ShardFile`: the disk works
    while the later chunks are encoded). Other layouts: through zarr."""
    r0, r1, c0, c1 = _shard_region(arr, sr, sc)
    if block.shape != (r1 - r0, c1 - c0):
        raise ValueError(f"shard ({sr}, {sc}) is {(r1 - r0, c1 - c0)}, got a block of {block.shape}")
    if shard_layout(arr) is None:
        arr[r0:r1, c0:c1] = block
        return
    _write_shard_file(arr, sr, sc, _encoded(arr, block, block.nbytes))


def encode_chunks(arr: zarr.Array, block: np.ndarray, first=(0, 0)) -> dict[tuple[int, int], tuple | None]:
    """The stored bytes of the chunks ``block`` covers, as :func:`write_shard` encodes them: chunk
    (i, j) of a shard of ``arr`` -> (zstd frame, crc32c), or None when all fill value. ``block``:
    whole chunks of one shard from its chunk ``first`` on (clipped at the array's edge), so that a
    writer encodes the parts of a shard where they are made (terrain_io.overviews) and
    :func:`write_encoded_shard` puts them together."""
    # (in a pipeline's own thread, here: its threads fill the cores already, and the pool's hand-offs
    # cost more -- 4096^2 pyramid: ~1 ms of 5 in its pieces' encodes)
    encoded = _encoded(arr, block, block.nbytes if owns_cores() else 0)
    return {(first[0] + i, first[1] + j): data for (i, j), data in encoded}


def _encoded(arr: zarr.Array, block: np.ndarray, nbytes: int):
    """((i, j), stored bytes or None) of each chunk ``block`` (whole chunks of a shard from its first,
    clipped at the array's edge) covers, in the shard file's (Morton) order, each as soon as it and
    those before it are encoded: runs of chunks a GIL-free call each (:func:`chunkcodec.encode_run`),
    shared with the codec pool when ``nbytes`` is large enough (:func:`_shared_runs`); chunk by chunk
    in Python where the codecs' C functions cannot be called so."""
    fmt = shard_layout(arr)
    if fmt is None:
        raise ValueError(f"{arr.path}: not stored as this tool's shards")
    chunkcodec = _codec_runs(block.nbytes)
    # (the runs code the block's own bits: a block of another dtype is cast chunk by chunk, as zarr casts)
    if chunkcodec is None or block.dtype != arr.dtype or chunkcodec.as_bits(block) is None:
        cells, encode = _chunk_encoder(arr, block)
        yield from zip(cells, _run_chunks(encode, cells, nbytes, ordered=True))
        return
    (t0, t1), level, crc = fmt
    cells = _morton_cells(-(-block.shape[0] // t0), -(-block.shape[1] // t1))
    per = _chunks_a_run(arr)  # (the first run written while the rest encode)
    runs = [cells[k : k + per] for k in range(0, len(cells), per)]

    def encode(run):
        return chunkcodec.encode_run(block, (t0, t1), arr.fill_value, np.array(run, np.int64), level, crc)

    encoded = _shared_runs(encode, runs) if _in_pool(nbytes, len(runs)) else map(encode, runs)
    for run, (data, entries) in zip(runs, encoded):
        for ij, (off, nb) in zip(run, entries.tolist()):
            yield ij, None if off == NO_CHUNK else (data[off : off + nb],)


_CODEC_RUN_BYTES = 4 << 20  # raw bytes of a run of chunks encoded in one call (H100, 8192^2: 1 MiB 0.30 s, 4 MiB 0.16-0.18 s)


def _chunks_a_run(arr: zarr.Array) -> int:
    """Chunks of ``arr`` in a run coded in one call: :data:`_CODEC_RUN_BYTES` of cells."""
    (t0, t1), _, _ = shard_layout(arr)
    return max(1, _CODEC_RUN_BYTES // (t0 * t1 * arr.dtype.itemsize))


def _shared_runs(fn, runs: list):
    """``fn(run)`` of each run, in order, each given as soon as it and those before it are done: the
    caller takes the next run not yet taken whenever the one it waits for is not done, and threads of
    the codec pool take runs beside it, as many as leave each writer encoding at once its share of
    the cores. So a lone writer has the pool's cores, and writers that fill the cores already (a
    pipeline's writer threads, a shard each) encode their own runs without hand-offs (H100, 8192^2
    float32, 16 writers: every run through the pool 0.19-0.23 s, the writers' own 0.16-0.18 s)."""
    futures = [concurrent.futures.Future() for _ in runs]
    order = iter(range(len(runs)))
    lock = threading.Lock()

    def take_one() -> bool:
        with lock:
            k = next(order, None)
            if k is None:
                return False
            future = futures[k]  # (taken with its run: the caller drops it from the list once done)
        try:
            future.set_result(fn(runs[k]))
        except BaseException as exc:  # noqa: BLE001 -- raised where the caller takes it
            future.set_exception(exc)
        return True

    def take_all() -> None:
        while take_one():
            pass

    with _WRITERS_LOCK:
        _WRITERS[0] += 1
        share = (os.cpu_count() or 1) // _WRITERS[0]
    try:
        pool = codec_pool()
        for _ in range(min(len(runs) - 1, share - 1)):
            pool.submit(take_all)
        for k, future in enumerate(futures):
            while not future.done() and take_one():
                pass
            futures[k] = None  # (a run's bytes freed once the caller is done with them, not at the shard's end)
            yield future.result()
    finally:
        with lock:  # a caller that stops early (an error, an abandoned write) leaves the pool no runs to encode
            for _ in order:
                pass
        with _WRITERS_LOCK:
            _WRITERS[0] -= 1


_WRITERS = [0]  # shards being encoded by _shared_runs now
_WRITERS_LOCK = threading.Lock()


def _codec_runs(nbytes: int, start: bool = True):
    """:mod:`terrain_io.chunkcodec` for a shard (or a shard's frames) of ``nbytes`` where its kernels
    can run now, else None (chunk by chunk in Python).

    Not for less than :data:`_PARALLEL_SHARD_BYTES`: chunk by chunk costs no more there, and a small
    job (the demo's DEM) compiles no kernel for it on a first run (four, ~2 s of CPU). Else once
    numba has made its CPU target in this process: the first kernel a process runs pays ~0.2-0.3 s
    for it (once; then ~12 ms a kernel from the cache), which a GPU pipeline that runs no other numba
    kernel would pay for its few host reads and its frames' checksums. So where no kernel has run,
    the shard (with ``start``) starts their load in the background (once) and is coded chunk by chunk
    meanwhile."""
    if nbytes < _PARALLEL_SHARD_BYTES:
        return None
    # (numba's registry module can be there half made: another thread importing numba, as the loader
    # below or a CPU pipeline's first kernel does beside the readers)
    target = getattr(sys.modules.get("numba.core.registry"), "cpu_target", None)
    if target is None or "_toplevel_target_context" not in vars(target):
        if start:
            _load_codec_runs()
        return None
    from . import chunkcodec

    return chunkcodec if chunkcodec.usable() else None


@functools.cache
def _load_codec_runs() -> None:
    def load():
        from . import chunkcodec

        chunkcodec.load()

    threading.Thread(target=load, name="terrain-codec-load").start()


def _chunk_encoder(arr: zarr.Array, block: np.ndarray):
    """The chunks (i, j) that ``block`` (whole chunks of a shard from its first, clipped at the
    array's edge) covers, in the shard file's (Morton) order, and the function giving a chunk's stored
    bytes: (zstd frame, crc32c), or None when it is all fill value."""
    fmt = shard_layout(arr)
    if fmt is None:
        raise ValueError(f"{arr.path}: not stored as this tool's shards")
    from numcodecs import Zstd

    (t0, t1), level, crc = fmt
    zstd = Zstd(level=level)
    fill = np.array(arr.fill_value, dtype=arr.dtype)
    cells = _morton_cells(-(-block.shape[0] // t0), -(-block.shape[1] // t1))

    def encode(ij):
        a0, b0 = ij[0] * t0, ij[1] * t1
        part = block[a0 : a0 + t0, b0 : b0 + t1]
        if part.shape != (t0, t1):
            whole = np.full((t0, t1), fill, dtype=arr.dtype)
            whole[: part.shape[0], : part.shape[1]] = part
            part = whole
        if _all_fill(part, fill):
            return None
        data = np.ascontiguousarray(part, dtype=arr.dtype)
        if level is not None:
            data = zstd.encode(data)
        return (data, integrity.crc32c(data)) if crc else (data,)

    return cells, encode


def shard_chunks(arr: zarr.Array, sr: int, sc: int) -> list[tuple[int, int]]:
    """The chunks (i, j) of shard (sr, sc) that lie inside the array, in the order zarr lays them
    out in the shard file (Morton order): the order of :func:`write_frames`' frames."""
    (t0, t1), _, _ = shard_layout(arr)
    r0, r1, c0, c1 = _shard_region(arr, sr, sc)
    n0, n1 = arr.shards[0] // t0, arr.shards[1] // t1
    return [(i, j) for i, j in _morton_cells(n0, n1) if i * t0 < r1 - r0 and j * t1 < c1 - c0]


@functools.lru_cache(maxsize=64)
def _morton_cells(n0: int, n1: int) -> tuple[tuple[int, int], ...]:
    """The (i, j) of an n0 x n1 grid of chunks in Morton order, made once a grid (every shard of a
    write has the same: ~50 us a call, 32 calls of a 4096^2 pyramid)."""
    return tuple((int(i), int(j)) for i, j in morton_order(n0, n1))


def write_frames(arr: zarr.Array, sr: int, sc: int, frames: list, sums: list | None = None) -> None:
    """Write shard (sr, sc) of ``arr`` (a layout :func:`shard_layout` knows) from the zstd frames
    of its chunks, made elsewhere (on the GPU: :mod:`terrain_io.nvzstd`): ``frames[k]`` of chunk
    ``shard_chunks(arr, sr, sc)[k]`` (bytes-like), None for a chunk all of fill value (left out, as
    zarr leaves it out). Each frame gets its crc32c here, or ``sums[k]`` where given (4 bytes as
    zarr's codec stores them, made with the frames: on the GPU); the file is the one
    :func:`write_shard` writes, with these frames."""
    crc = shard_layout(arr)[2]
    cells = shard_chunks(arr, sr, sc)
    if len(frames) != len(cells):
        raise ValueError(f"shard ({sr}, {sc}) has {len(cells)} chunks, got {len(frames)} frames")
    if crc and sums is None:
        made = iter(_checksums([f for f in frames if f is not None]))
        sums = [None if f is None else next(made) for f in frames]
    write_encoded_shard(arr, sr, sc, {ij: None if f is None else (f, s) if crc else (f,)
                                      for ij, f, s in zip(cells, frames, sums or frames)})


def _checksums(frames: list) -> list:
    """The crc32c (4 bytes) of each frame: in one GIL-free call for numpy frames
    (:func:`chunkcodec.checksums`), else one by one."""
    # (the kernels' load not started for them: on the GPU SSSP's write it cost 0.3 s more than it saved)
    chunkcodec = _codec_runs(sum(memoryview(f).nbytes for f in frames), start=False)
    if chunkcodec is not None and all(isinstance(f, np.ndarray) and f.dtype == np.uint8 and f.ndim == 1
                                                  and f.flags.c_contiguous for f in frames):
        return list(chunkcodec.checksums(frames))
    return [integrity.crc32c(f) for f in frames]


def write_encoded_shard(arr: zarr.Array, sr: int, sc: int, encoded: dict) -> None:
    """Write shard (sr, sc) of ``arr`` from its chunks' stored bytes (:func:`encode_chunks`; a chunk
    missing or None is left out, as all fill value): in Morton order, the index and its crc32c at the
    end (none when every chunk is left out)."""
    (t0, t1), _, _ = shard_layout(arr)
    cells = _morton_cells(arr.shards[0] // t0, arr.shards[1] // t1)
    _write_shard_file(arr, sr, sc, ((ij, encoded.get(ij)) for ij in cells))


def _write_shard_file(arr: zarr.Array, sr: int, sc: int, chunks) -> None:
    """Write shard (sr, sc) from ``chunks``: ((i, j), stored bytes or None) in the file's Morton order,
    each written as it comes (:class:`_ShardFile`), the index and its crc32c last; no file (an old
    one removed) when every chunk is left out, as zarr keeps none."""
    (t0, t1), _, _ = shard_layout(arr)
    index = np.full((arr.shards[0] // t0, arr.shards[1] // t1, 2), NO_CHUNK, "<u8")
    path = os.path.join(arr.store.root, arr.path, arr.metadata.encode_chunk_key((sr, sc)))
    out = None
    try:
        for (i, j), data in chunks:
            if data is None:
                continue
            if out is None:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                out = _ShardFile(path)
            index[i, j] = out.offset, sum(memoryview(d).nbytes for d in data)
            out.add(data)
        if out is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        index_bytes = index.tobytes()
        out.add((index_bytes, integrity.crc32c(index_bytes)))
        out.close()
    finally:
        if out is not None:
            out.release()


class _ShardFile:
    """A shard file written from the front in runs of at least :data:`_RUN_BYTES` (pwritev, no copy
    into one buffer), over an old file in place and cut to its length at the end; each run is sent
    on to the disk as it is written (:func:`_start_writeback`)."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.views: list = []
        self.written = self.pending = 0

    @property
    def offset(self) -> int:
        return self.written + self.pending

    def add(self, parts) -> None:
        for p in parts:
            v = memoryview(p).cast("B")
            self.views.append(v)
            self.pending += len(v)
        if self.pending >= _RUN_BYTES:
            self._flush()

    def _flush(self) -> None:
        pwrite_all(self.fd, self.views, self.written)
        _start_writeback(self.fd, self.written, self.pending)
        self.written += self.pending
        self.views, self.pending = [], 0

    def close(self) -> None:
        self._flush()
        os.ftruncate(self.fd, self.written)

    def release(self) -> None:
        os.close(self.fd)


_RUN_BYTES = 2 << 20


_PARALLEL_SHARD_BYTES = 1 << 20  # a smaller shard is encoded in its caller's thread: the pool's hand-offs cost more
_POOL: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None


def codec_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's pool of chunk encoders and decoders, one thread a core (made again in a forked
    child, which has none of its parent's threads)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1,
                                                                     thread_name_prefix=_POOL_THREADS))
    return _POOL[1]


_POOL_THREADS = "terrain-codec"


def _run_chunks(fn, jobs, nbytes: int, count: int | None = None, ordered: bool = False):
    """``[fn(job) for job in jobs]``: in the codec pool when the shard is large enough (``nbytes``)
    to pay for the hand-offs, else -- and inside the pool's own threads, which must not wait on it --
    here. ``jobs``: a list, or an iterable of ``count`` jobs (taken in this thread, each handed on
    as it comes). The first exception is raised, as a loop would. ``ordered``: an iterator of the
    results instead, each given as soon as it and those before it are done."""
    if _in_pool(nbytes, len(jobs) if count is None else count):
        results = codec_pool().map(fn, jobs)
    else:
        results = (fn(job) for job in jobs)
    return results if ordered else list(results)


def _in_pool(nbytes: int, count: int) -> bool:
    """Whether :func:`_run_chunks` hands ``count`` jobs of a shard of ``nbytes`` to the codec pool."""
    return (nbytes >= _PARALLEL_SHARD_BYTES and count > 1 and (os.cpu_count() or 1) > 1
            and not threading.current_thread().name.startswith(_POOL_THREADS))


def overwrite_file(path, parts, writeback: bool = False) -> None:
    """Write the bytes ``parts`` (bytes-like, in order) as the file ``path`` -- gathered by the
    kernel (pwritev: no copy into one buffer here) -- over an existing file in place, then cut to
    the new length; ``writeback``: start its write-out to the disk now (:func:`_start_writeback`: a
    stored shard, not scratch that is written again). (A file written again -- the shard method's
    re-solves -- costs ~30x more when first truncated to nothing: its blocks are freed and taken back,
    more so on ext4 mounted with discard.)"""
    views = [memoryview(p).cast("B") for p in parts]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        total = pwrite_all(fd, views, 0)
        os.ftruncate(fd, total)
        if writeback:
            _start_writeback(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, views: list, at: int) -> int:
    """Write ``views`` (byte memoryviews, in order; the list is consumed) at offset ``at`` of ``fd``,
    gathered by the kernel (pwritev), short writes resumed; returns the bytes written."""
    done = 0
    while views:
        n = os.pwritev(fd, views[:_IOV_MAX], at + done)
        done += n
        while views and n >= len(views[0]):  # drop what was written; a short write resumes mid-buffer
            n -= len(views.pop(0))
        if n:
            views[0] = views[0][n:]
    return done


def _start_writeback(fd: int, offset: int = 0, nbytes: int = 0) -> None:
    """Have the file's dirty pages (``nbytes`` from ``offset``; 0: to its end) written to the disk
    soon, without waiting for it (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, called by one
    background thread on a duplicate of ``fd``: the call blocks while the disk's queue is full, which
    held the writers up on a busy disk -- 2-core VM, 4096^2 fill: +2.5 s wall; elsewhere nothing), so
    that a command leaves no backlog of dirty pages behind: the kernel flushes pages left dirty once they
    are 30 s old, and that flush held up the command after (H100, 32768^2: a ``fill`` right after
    ``synth`` took 11.5 s with synth's 2.5 GB still dirty, 7.1 s with them written out as synth wrote
    them; benchmarks/RESULTS.md)."""
    if _sync_file_range() is None:
        return
    global _WRITEBACK
    with _WRITEBACK_LOCK:
        if _WRITEBACK is None or _WRITEBACK[0] != os.getpid():
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_writeback_loop, args=(jobs,), name="terrain-writeback", daemon=True).start()
            _WRITEBACK = (os.getpid(), jobs)
    _WRITEBACK[1].put((os.dup(fd), offset, nbytes))


_WRITEBACK: tuple | None = None  # (pid, the queue of the process's writeback thread)
_WRITEBACK_LOCK = threading.Lock()


def _writeback_loop(jobs) -> None:
    while True:
        job = jobs.get()
        if isinstance(job, threading.Event):  # (_writeback_done)
            job.set()
            continue
        fd, offset, nbytes = job
        try:
            _sync_file_range()(fd, offset, nbytes, 2)  # SYNC_FILE_RANGE_WRITE; a failure (a file system without
        finally:  # it) changes nothing
            os.close(fd)


def _writeback_done(timeout: float = 10) -> None:
    """Wait until the writeback thread has made every call asked for so far (tests)."""
    if _WRITEBACK is not None and _WRITEBACK[0] == os.getpid():
        done = threading.Event()
        _WRITEBACK[1].put(done)
        done.wait(timeout)


@functools.cache
def _sync_file_range():
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint], ctypes.c_int
    return fn


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") and "SC_IOV_MAX" in os.sysconf_names else 16


def _all_fill(part: np.ndarray, fill: np.ndarray) -> bool:
    first = part.flat[0]  # most chunks differ at once: no pass over them
    if fill.dtype.kind == "f" and np.isnan(fill):
        if not np.isnan(first):
            return False
        return bool(np.isnan(part).all())
    return bool(first == fill) and bool((part == fill).all())


COORDINATES = ("x", "y", "spatial_ref")


def coordinate_arrays(shape, transform, crs) -> list[tuple[str, np.ndarray | None, dict]]:
    """The CF / rioxarray georeferencing of a group's 2-D arrays: ``(name, values, attributes)``.

    ``x`` and ``y``: cell-centre map coordinates (cell indices + 0.5 without a transform);
    ``spatial_ref``: a scalar (values None: never written, its fill value) whose attributes carry
    ``crs_wkt`` / ``spatial_ref`` (WKT) and ``GeoTransform`` (GDAL order), the convention rioxarray
    and GDAL read.
    """
    rows, cols = (int(v) for v in shape)
    x0, dx, rx, y0, ry, dy = transform or CELL_TRANSFORM
    units = "cell" if transform is None else "map units"
    out = [(name, origin + (np.arange(n) + 0.5) * step, {"axis": name.upper(), "units": units})
           for name, n, origin, step in (("x", cols, x0, dx), ("y", rows, y0, dy))]
    ref = {"GeoTransform": " ".join(repr(float(v)) for v in (x0, dx, rx, y0, ry, dy))}
    if crs:
        ref.update({"crs_wkt": crs, "spatial_ref": crs})
    return out + [("spatial_ref", None, ref)]


_COORDINATE_CHUNK = 1 << 20


# -- metadata and small arrays written as files (zarr's layout, without its event loop) ----------------
# Every node this tool makes is written so: a new store's, a result's, an overview level's. A writer of
# many small nodes (terrain_io.overviews: a group, its array and three coordinates a level) spends more in
# zarr's event loop than in its data; these write the same bytes zarr writes (tests compare them with
# zarr-python's create_array and coordinate arrays, file for file: tests/references.py's zarr_* functions).
def _bytes_codec(dtype) -> dict:
    return ({"name": "bytes"} if np.dtype(dtype).itemsize == 1  # zarr drops the byte order of one-byte types
            else {"name": "bytes", "configuration": {"endian": "little"}})


def _fill_json(dtype, value):
    """A fill value as zarr v3's JSON writes it (NaN and infinities as strings)."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        v = float(value)
        return "NaN" if v != v else ("Infinity" if v == math.inf else "-Infinity" if v == -math.inf else v)
    return bool(value) if kind == "b" else int(value)


def array_metadata(shape, dtype, chunks, codecs: list, fill_value, attrs: dict, dimension_names=None) -> dict:
    """The zarr.json of a zarr v3 array, key for key as zarr 3 writes it."""
    meta = {"shape": [int(n) for n in shape], "data_type": np.dtype(dtype).name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [int(n) for n in chunks]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": _fill_json(dtype, fill_value), "codecs": codecs, "attributes": attrs}
    if dimension_names is not None:
        meta["dimension_names"] = list(dimension_names)
    meta.update(zarr_format=3, node_type="array", storage_transformers=[])
    return meta


def tiled_array_metadata(shape, dtype, tile: int, shard: int, fill_value, attrs: dict | None = None,
                         zstd_level: int = _COMPRESSOR.level) -> dict:
    """The zarr.json of a 2-D array chunked T x T and sharded (S*T) x (S*T), zstd-compressed (at
    ``zstd_level``: zarr's zstd codec takes -131072..22, and :func:`encode_chunks` uses the level the
    metadata names), each chunk ending in its crc32c, dims named (y, x), with the attributes ``attrs``;
    they point xarray/rioxarray at the group's ``spatial_ref`` (CRS and transform), and the group's 1-D
    ``x`` and ``y`` arrays (cell centres, :func:`write_coordinate_files`) become its coordinates."""
    zstd = [] if zstd_level is None else [{"name": "zstd", "configuration": {"level": zstd_level, "checksum": False}}]
    inner = [_bytes_codec(dtype), *zstd, {"name": "crc32c"}]  # (level None: chunks not compressed)
    index = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
    codecs = [{"name": "sharding_indexed", "configuration": {"chunk_shape": [tile, tile], "codecs": inner,
                                                             "index_codecs": index, "index_location": "end"}}]
    return array_metadata(shape, dtype, (tile * shard, tile * shard), codecs, fill_value,
                          {"grid_mapping": "spatial_ref", "coordinates": "spatial_ref", **(attrs or {})}, ("y", "x"))


def write_node(folder, meta: dict) -> None:
    """Write ``meta`` as the zarr.json of the node in ``folder`` (made if missing), as zarr formats it."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "zarr.json"), "wb") as f:
        f.write(_indented_json(meta).encode())


def _indented_json(value, indent: str = "\n") -> str:
    """``json.dumps(value, allow_nan=True, indent=2)`` (zarr's zarr.json), 2.3x as fast: the standard
    library indents in pure-Python generators (60 us a level's zarr.json, 26 here; a pyramid writes 20
    nodes in the thread beside its readers, which wait for the GIL between their chunks)."""
    if isinstance(value, str):
        return _json_string(value)
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return (float.__repr__(value) if math.isfinite(value) else
                "NaN" if value != value else "Infinity" if value > 0 else "-Infinity")
    inner = indent + "  "
    if isinstance(value, dict):
        items = [inner + _json_string(_json_key(k)) + ": " + _indented_json(v, inner) for k, v in value.items()]
        return "{" + ",".join(items) + indent + "}" if items else "{}"
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    items = [inner + _indented_json(v, inner) for v in value]
    return "[" + ",".join(items) + indent + "]" if items else "[]"


def _json_key(key) -> str:
    """A dict key as ``json.dumps`` writes it (str, int, float, bool, None)."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (int, float)):  # (bool is an int) spelled as the value is
        return _indented_json(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def group_metadata(attrs: dict | None = None) -> dict:
    return {"attributes": dict(attrs or {}), "zarr_format": 3, "node_type": "group"}


def write_coordinate_files(folder, shape, transform, crs) -> dict[str, dict]:
    """The georeferencing of a group's 2-D arrays (:func:`coordinate_arrays`) into the group folder
    ``folder`` as files (zarr's bytes); returns each coordinate's metadata (name -> zarr.json as a dict)."""
    from numcodecs import Zstd

    zstd = Zstd(level=0)  # with_checksum("auto"): zarr's default compressor
    written = {}
    for name, values, attrs in coordinate_arrays(shape, transform, crs):
        node = os.path.join(folder, name)
        if values is None:
            written[name] = array_metadata((), "int32", (), [_bytes_codec("int32"), {"name": "crc32c"}], 0, attrs)
            write_node(node, written[name])
            continue
        n, step = len(values), min(len(values), _COORDINATE_CHUNK)
        codecs = [_bytes_codec("float64"), {"name": "zstd", "configuration": {"level": 0, "checksum": False}},
                  {"name": "crc32c"}]
        written[name] = array_metadata((n,), "float64", (step,), codecs, 0.0, attrs, (name,))
        write_node(node, written[name])
        os.makedirs(os.path.join(node, "c"), exist_ok=True)
        for i in range(0, n, step):
            part = np.zeros(step)  # (the last chunk padded with the fill value, as zarr stores it)
            part[: min(step, n - i)] = values[i : i + step]
            if not part.any():  # all fill value: zarr keeps no file
                continue
            data = zstd.encode(part)
            overwrite_file(os.path.join(node, "c", str(i // step)), [data, integrity.crc32c(data)])
    return written


def array_handle(root, path: str, meta: dict) -> zarr.Array:
    """A zarr.Array of store folder ``root`` at ``path`` over metadata written with :func:`write_node`
    (nothing read back: for :func:`write_shard`, which writes its files directly)."""
    from zarr.core.array import AsyncArray
    from zarr.storage import LocalStore, StorePath

    return zarr.Array(AsyncArray(meta, StorePath(LocalStore(str(root)), path)))


def is_terrain_store(path) -> bool:
    """Whether ``path`` is a folder this tool made as a store: a Zarr group whose attributes say
    ``format: terrain`` (what :meth:`TerrainStore.create` writes)."""
    try:
        with open(Path(path) / "zarr.json") as f:
            meta = json.load(f)
        return meta.get("node_type") == "group" and meta.get("attributes", {}).get("format") == "terrain"
    except (OSError, ValueError, AttributeError):
        return False


def check_store_output(out, overwrite: bool, source=None) -> None:
    """Refuse to write a store at ``out`` over anything but a store of this tool, and over that
    without ``overwrite`` (the tool removes only what it made); ``source``: the input, never replaced."""
    out = Path(out)
    if not os.path.lexists(out):
        return
    refuse_existing(out, overwrite)
    if source is not None and out.resolve() == Path(source).resolve():
        raise OutputError(f"{out}: output would overwrite the input")
    if out.is_symlink() or not is_terrain_store(out):
        raise OutputError(f"{out}: exists and is not a terrain store; refusing to replace it (remove it yourself "
                          "or choose another output)")


def check_result_name(name: str) -> list[str]:
    """Split a result name into path parts, refusing anything that could leave the store."""
    parts = [p for p in str(name).split("/") if p]
    if not parts or any(p in (".", "..") or p.startswith(".") or "\\" in p or "%" in p or p.startswith("__")
                        for p in parts):
        raise StoreError(f"invalid result name {name!r}")
    if parts[0] == ELEVATION:
        raise StoreError("the name 'elevation' is reserved for the DEM itself")
    return parts
