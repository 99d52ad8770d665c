"""Overviews: a pyramid of ever coarser copies of a store's arrays, for looking at any size at once.

Level k of an array holds ceil(rows / 2^k) x ceil(cols / 2^k) cells; each cell reduces the 2 x 2
cells of level k - 1 it covers (fewer at an odd edge), as GDAL's overviews and the web map's zoom
levels do. The reduction follows what the values mean (:func:`resampling_for`):

- ``average`` -- continuous values (elevations, depths, distances, HAND): the mean of the valid
  cells, summed in float64 in row-major order of the block (NaN: none valid; +inf stays +inf);
- ``max`` -- flow accumulation and stream order/magnitude: a river stays as wide as one cell;
- ``mode`` -- codes and ids (directions, edge masks, depression/basin/stream ids): the most frequent
  valid value of the block, ties to the smallest; the array's nodata value counts as not valid.

Levels are added until one tile holds the level (both sides <= the store's tile size).

Layout, after the Zarr multiscales convention that GeoZarr adopts
(https://github.com/zarr-conventions/multiscales, v0.1): the pyramid of array ``A`` (``fill/depth``)
is the result group ``overviews/A``; its level k is the child group ``k`` holding the array under
A's own leaf name (``depth``) with its ``x``, ``y`` and ``spatial_ref`` (cell centres, CRS and
GeoTransform of that level), so ``xr.open_zarr(store, group="overviews/fill/depth/3")`` and
``xr.open_datatree(store + "/overviews/fill/depth", engine="zarr")`` open each level with its
coordinates. The group's ``multiscales.layout`` lists levels 1..n (``derived_from`` the level below,
``transform.scale`` [2, 2], ``proj:transform`` and ``proj:shape``); level 0, the array itself, lives
outside the group, which the convention's relative paths cannot reach: its name is in ``source``.
Levels are tiled, sharded, checksummed and sealed like every result (:meth:`TerrainStore.write_result`).

Out of core in one pass: the base array's shards are read and halved as tasks (Morton order, on the
``scheduler``, each a shard in memory); this process puts the halves together into level-1 shards,
writes each shard of a level as soon as its four children are in, halves it for the level above,
and so on. Morton order completes a parent's children one after another, so at most a few shards
of each level are held. Each stored cell is read once: the cost is one read of the array, the
reductions, and writing a third of it again (benchmarks/bench_view.py).
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import math
import os
from dataclasses import dataclass

import numba as nb
import numpy as np

from .errors import InputError, StoreError
from .memory import format_bytes, memory_budget
from .parallel import check_scheduler, imap_shards
from .progress import progress_bar
from .store import (ELEVATION, TerrainStore, create_tiled_array, read_shard, write_coordinates, write_shard)
from .zorder import morton_order

GROUP = "overviews"
METHODS = ("average", "mode", "max")
_MAX_LEAVES = ("accumulation", "order", "magnitude")  # counts and stream orders: the channel stays visible
CONVENTION = {  # zarr_conventions entry of the multiscales convention
    "schema_url": "https://raw.githubusercontent.com/zarr-conventions/multiscales/refs/tags/v0.1/schema.json",
    "spec_url": "https://github.com/zarr-conventions/multiscales/blob/v0.1/README.md",
    "uuid": "d35379db-88df-4056-af3a-620245f8e347",
    "name": "multiscales",
    "description": "Multiscale layout of zarr datasets",
}


def resampling_for(name: str, dtype) -> str:
    """The reduction of array ``name``: ``max`` for accumulation and stream orders, ``mode`` for integer
    codes and ids, ``average`` for continuous values (floats, and the elevation whatever its type)."""
    leaf = name.rsplit("/", 1)[-1]
    if leaf in _MAX_LEAVES:
        return "max"
    if np.dtype(dtype).kind in "iub" and leaf != ELEVATION:
        return "mode"
    return "average"


def level_shapes(shape, tile: int) -> list[tuple[int, int]]:
    """Shapes of levels 1.. until a level fits one tile (none for an array that fits one already)."""
    rows, cols = shape
    out = []
    while rows > tile or cols > tile:
        rows, cols = -(-rows // 2), -(-cols // 2)
        out.append((rows, cols))
    return out


# -- the 2 x 2 reductions (numba, GIL released: read-ahead threads overlap them) -------------------
@nb.njit(cache=True, nogil=True)
def _average(src, out, missing, has_missing, rounding):
    rows, cols = src.shape
    if not has_missing and not rounding:  # floats: whole blocks without bounds (the same sums, in the same order)
        for i in range(rows // 2):
            for j in range(cols // 2):
                total = 0.0
                n = 0
                for v in (src[2 * i, 2 * j], src[2 * i, 2 * j + 1], src[2 * i + 1, 2 * j], src[2 * i + 1, 2 * j + 1]):
                    if v == v:
                        total += np.float64(v)
                        n += 1
                out[i, j] = total / n if n else missing
        _average_edges(src, out, missing, has_missing, rounding, rows // 2, cols // 2)
        return
    _average_edges(src, out, missing, has_missing, rounding, 0, out.shape[1])


@nb.njit(cache=True, nogil=True)
def _average_edges(src, out, missing, has_missing, rounding, whole_rows, whole_cols):
    """The cells of ``out`` in rows >= whole_rows or columns >= whole_cols (all of them: 0, width)."""
    rows, cols = src.shape
    for i in range(out.shape[0]):
        for j in range(whole_cols if i < whole_rows else 0, out.shape[1]):
            total = 0.0
            n = 0
            for a in range(2 * i, min(2 * i + 2, rows)):
                for b in range(2 * j, min(2 * j + 2, cols)):
                    v = src[a, b]
                    if v != v or (has_missing and v == missing):
                        continue
                    total += np.float64(v)
                    n += 1
            if n == 0:
                out[i, j] = missing
            elif rounding:  # integer elevations: the mean rounded half up
                out[i, j] = math.floor(total / n + 0.5)
            else:
                out[i, j] = total / n


@nb.njit(cache=True, nogil=True)
def _max(src, out, missing, has_missing, rounding):
    rows, cols = src.shape
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            best = src[0, 0]
            n = 0
            for a in range(2 * i, min(2 * i + 2, rows)):
                for b in range(2 * j, min(2 * j + 2, cols)):
                    v = src[a, b]
                    if v != v or (has_missing and v == missing):
                        continue
                    if n == 0 or v > best:
                        best = v
                    n += 1
            out[i, j] = best if n else missing


@nb.njit(cache=True, nogil=True)
def _mode(src, out, missing, has_missing, rounding):
    rows, cols = src.shape
    vals = np.empty(4, src.dtype)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            n = 0
            for a in range(2 * i, min(2 * i + 2, rows)):
                for b in range(2 * j, min(2 * j + 2, cols)):
                    v = src[a, b]
                    if v != v or (has_missing and v == missing):
                        continue
                    vals[n] = v
                    n += 1
            if n == 0:
                out[i, j] = missing
                continue
            best = vals[0]
            count = 0
            for p in range(n):
                c = 0
                for q in range(n):
                    if vals[q] == vals[p]:
                        c += 1
                if c > count or (c == count and vals[p] < best):
                    best, count = vals[p], c
            out[i, j] = best


_KERNELS = {"average": _average, "max": _max, "mode": _mode}


def reduce2x2(block: np.ndarray, method: str, missing) -> np.ndarray:
    """Half of ``block`` (ceil of each side) by ``method``; ``missing``: the value of no valid cell
    (None: NaN for floats; an integer array's nodata value, which does not count as valid)."""
    out = np.empty((-(-block.shape[0] // 2), -(-block.shape[1] // 2)), block.dtype)
    if out.size:
        has = missing is not None
        value = block.dtype.type(missing if has else (np.nan if block.dtype.kind == "f" else 0))
        _KERNELS[method](np.ascontiguousarray(block), out, value, has, block.dtype.kind != "f")
    return out


# -- the pyramid of one array -------------------------------------------------------------------
@dataclass(frozen=True)
class _Task:
    """A shard of the base array to read and halve (workers open the store by path)."""

    store: str
    name: str
    shard: tuple[int, int]
    method: str
    missing: object
    digest: str


def _halve_shard(task: _Task) -> np.ndarray:
    return reduce2x2(read_shard(_opened(task.store, task.name, task.digest), *task.shard), task.method, task.missing)


@functools.lru_cache(maxsize=8)
def _opened(store: str, name: str, digest: str):
    """The array, opened once per process for the tasks of one pyramid (``digest``: its manifest's, so a
    worker that lives on never reads another array's bytes through an old handle)."""
    return TerrainStore.open(store, mode="r").group[name]


def missing_value(store: TerrainStore, name: str, arr):
    """The value that marks no data in ``name`` (None: NaN, for floats): elevation's nodata, or an
    integer result's ``nodata`` attribute, else its fill value."""
    if arr.dtype.kind == "f":
        return None
    if name == ELEVATION:
        return store.nodata
    return arr.attrs.get("nodata", arr.fill_value)


def source_digest(store: TerrainStore, name: str) -> str:
    """The sha256 of the array's manifest: which bytes a pyramid was made from (a new run of its
    command writes another manifest, and the pyramid is stale); of its ``zarr.json`` in a store of
    format 1, which has no manifests."""
    folder = store.path / name
    path = folder / "terrain-manifest.json"
    with open(path if path.exists() else folder / "zarr.json", "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def arrays_of(store: TerrainStore) -> list[str]:
    """The arrays that take overviews: elevation and every 2-D result of the store's shape (not the
    SSSP index's internals, not the overviews)."""
    names = [ELEVATION]
    for name, attrs in store.results().items():
        if (attrs.get("shape") == tuple(store.shape) and not name.startswith(("index/", GROUP + "/"))):
            names.append(name)
    return names


def write_overviews(store_path, arrays=None, *, memory=None, scheduler: str | None = "local",
                    progress: bool = False, announce=None) -> dict[str, int]:
    """Write the pyramid of each of ``arrays`` (default :func:`arrays_of`) into the store; returns
    ``{array: levels}``. ``memory``: the budget (checked before any work); ``scheduler``: where the
    base shards are read and halved (the same bytes on every scheduler, tiling and budget)."""
    scheduler = check_scheduler(scheduler)
    store = TerrainStore.open(store_path)
    names = list(arrays) if arrays else arrays_of(store)
    for name in names:
        if name.startswith(GROUP + "/") or name.startswith("index/"):
            raise InputError(f"{name}: takes no overviews")
        try:
            arr = store.group[name]
        except KeyError:
            raise StoreError(f"{store.path}: no array {name!r} (see 'terrain info')") from None
        if not hasattr(arr, "shards") or len(arr.shape) != 2:
            raise StoreError(f"{store.path}: {name!r} is not a 2-D array")
    side = store.tile_size * store.shard_size
    itemsize = max(store.group[n].dtype.itemsize for n in names)
    levels = len(level_shapes(store.shape, store.tile_size))
    in_flight = 2 * (os.cpu_count() or 1)
    shard_bytes = side * side * itemsize
    budget = memory_budget(memory)  # shards being halved (each with its half), pending and queued for writing
    in_flight = max(1, min(in_flight, int((budget / shard_bytes - levels - 3) / 1.25)))
    need = int(shard_bytes * (in_flight * 1.25 + levels + 3))
    if need > budget:
        raise InputError(f"--memory {format_bytes(budget)} cannot hold the overviews' working set "
                         f"({format_bytes(need)}: {levels + 4} shards of {side}^2 cells); give more memory "
                         "or convert with smaller shards")
    done = {}
    for name in names:
        done[name] = _pyramid(store, name, scheduler, in_flight, progress, announce)
        store = TerrainStore.open(store_path)
    return done


def _pyramid(store: TerrainStore, name: str, scheduler: str, in_flight: int, progress: bool, announce) -> int:
    arr = store.group[name]
    shapes = level_shapes(arr.shape, store.tile_size)
    if not shapes:
        return 0
    method = resampling_for(name, arr.dtype)
    missing = missing_value(store, name, arr)
    fill = arr.fill_value
    leaf = name.rsplit("/", 1)[-1]
    t = store.transform or (0.0, 1.0, 0.0, 0.0, 0.0, 1.0)
    attrs = {"source": name, "resampling_method": method, "source_manifest_sha256": source_digest(store, name),
             "zarr_conventions": [CONVENTION]}
    layout = []
    for k, shape in enumerate(shapes, start=1):
        entry = {"asset": str(k), "transform": {"scale": [2.0, 2.0], "translation": [0.0, 0.0]},
                 "resampling_method": method, "proj:shape": list(shape), "proj:transform": _level_transform(t, k)}
        if k > 1:
            entry["derived_from"] = str(k - 1)
        layout.append(entry)
    attrs["multiscales"] = {"version": "0.1.0", "layout": layout, "resampling_method": method}
    side = store.tile_size * store.shard_size
    grid0 = tuple(-(-n // side) for n in arr.shape)
    tasks = [_Task(str(store.path), name, (int(r), int(c)), method, missing, attrs["source_manifest_sha256"])
             for r, c in morton_order(*grid0)]
    writes = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="terrain-overviews")
    with store.write_result(f"{GROUP}/{name}", attrs=attrs) as writer, writes:
        level_arrays, coordinates = [], []
        for k, shape in enumerate(shapes, start=1):
            group = writer.group.create_group(str(k))
            level_arrays.append(create_tiled_array(group, leaf, shape, arr.dtype, store.tile_size,
                                                   store.shard_size, fill, {"level": k, **_source_attrs(arr)}))
            # the coordinates in the writer thread, while the first shards are read
            coordinates.append(writes.submit(write_coordinates, group, shape, _level_transform(t, k), store.crs))
        assembler = _Assembler(arr.shape, level_arrays, side, method, missing)
        with progress_bar(progress, len(tasks), f"overviews {name}", unit="shard") as bar:
            halves = (_prefetched(_halve_shard, tasks, in_flight) if scheduler == "local"
                      else imap_shards(_halve_shard, tasks, scheduler, in_flight=in_flight, announce=announce))
            for task, half in zip(tasks, halves):
                assembler.put(0, task.shard, half, writes)
                bar.update(1)
            assembler.flush(writes)
        for f in coordinates:
            f.result()
    return len(shapes)


def _source_attrs(arr) -> dict:
    return {k: v for k, v in dict(arr.attrs).items() if k in ("units", "nodata", "method", "long_name")}


def _level_transform(t, k: int) -> list[float]:
    """GDAL geotransform of level k: the same origin, cells 2^k times as large."""
    x0, dx, rx, y0, ry, dy = t
    f = float(2**k)
    return [x0, dx * f, rx * f, y0, ry * f, dy * f]


def _prefetched(func, tasks, ahead: int):
    """``func(task)`` for each task in order, up to ``ahead`` running in threads (decoding and the
    numba reductions release the GIL)."""
    with concurrent.futures.ThreadPoolExecutor(max(1, min(ahead, os.cpu_count() or 1)),
                                               thread_name_prefix="terrain-overviews-read") as pool:
        pending = [pool.submit(func, t) for t in tasks[:ahead]]
        for i in range(len(tasks)):
            if i + ahead < len(tasks):
                pending.append(pool.submit(func, tasks[i + ahead]))
            yield pending[i].result()
            pending[i] = None


class _Assembler:
    """Puts the halves of level k - 1's shards together into level k's shards; writes each shard
    when its children are all in, and passes its own half up."""

    def __init__(self, base_shape, arrays, side: int, method: str, missing):
        self.arrays, self.side, self.method, self.missing = arrays, side, method, missing
        self.pending: dict[tuple[int, int, int], list] = {}  # (level, row, col) -> [block, children left]
        self.grids = [tuple(-(-n // side) for n in shape) for shape in (base_shape, *(a.shape for a in arrays))]
        self.written: list = []

    def _children(self, level: int, r: int, c: int) -> int:
        """How many shards of the level below (level 0: the base array) make shard (r, c) of ``level``."""
        below = self.grids[level - 1]
        return sum(1 for a in (0, 1) for b in (0, 1) if 2 * r + a < below[0] and 2 * c + b < below[1])

    def put(self, below: int, shard, half: np.ndarray, writes) -> None:
        level = below + 1  # ``half``: shard ``shard`` of level ``below``, halved
        r, c = shard[0] // 2, shard[1] // 2
        arr = self.arrays[level - 1]
        key = (level, r, c)
        if key not in self.pending:
            h = min(self.side, arr.shape[0] - r * self.side)
            w = min(self.side, arr.shape[1] - c * self.side)
            self.pending[key] = [np.empty((h, w), arr.dtype), self._children(level, r, c)]
        entry = self.pending[key]
        a0, b0 = (shard[0] % 2) * (self.side // 2), (shard[1] % 2) * (self.side // 2)
        entry[0][a0 : a0 + half.shape[0], b0 : b0 + half.shape[1]] = half
        entry[1] -= 1
        if entry[1] == 0:
            del self.pending[key]
            self._finish(level, (r, c), entry[0], writes)

    def _finish(self, level: int, shard, block: np.ndarray, writes) -> None:
        self.written.append(writes.submit(write_shard, self.arrays[level - 1], shard[0], shard[1], block))
        while len(self.written) > 2:  # a bounded number of shards queued for writing
            self.written.pop(0).result()
        if level < len(self.arrays):
            self.put(level, shard, reduce2x2(block, self.method, self.missing), writes)

    def flush(self, writes) -> None:
        if self.pending:  # (cannot happen: every shard's children are counted)
            raise AssertionError(f"overviews: shards left incomplete: {sorted(self.pending)}")
        for f in self.written:
            f.result()
