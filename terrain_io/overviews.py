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

Out of core in one pass: each block of the base array -- a shard, or a quarter, a sixteenth... of one when
the array has few shards for the threads (:func:`_block_side`) -- is read once, as a task (Morton order, on the
``scheduler``; once the staged pyramid group and the levels' nodes are written), and reduced level
after level in memory -- the first halving chunk by chunk as the chunks are decoded
(:func:`read_halved`: the block's cells are never put together). Its piece of level k is whole chunks of a
level-k shard while 2^k divides the tiles of a block side: those chunks are encoded in the task
(:func:`~terrain_io.store.encode_chunks`), and this process writes them into the level's shard file
as they come (:class:`_ShardStream`: Morton order). The task's raw piece of
the next level is put together here with the others into that level's shards, each written as
soon as it is complete and halved for the level above, and so on. Morton order completes a
parent's children one after another, so at most a few shards of each level are held. The levels'
metadata and coordinates are written as files in one go (zarr's event loop costs more than a
level's cells), and the coordinates sealed then (:func:`~terrain_io.integrity.seal_ahead`). Each stored
cell is read once: the cost is one read of the array, the reductions,
and writing a third of it again -- not compressed (:data:`LEVEL_ZSTD`: each level's zarr.json names
its codecs, bytes and crc32c, so plain zarr and xarray read the levels); each level shard is written
piece by piece as the blocks come (:class:`_ShardStream`), so little is left after the last read
(benchmarks/bench_view.py; benchmarks/RESULTS.md, issue 32).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass

import numba as nb
import numpy as np

from .errors import InputError, StoreError
from .memory import format_bytes, memory_budget
from .parallel import Prefetch, check_scheduler, imap_shards
from .progress import progress_bar
from . import integrity
from .store import (ELEVATION, NO_CHUNK, TerrainStore, Window, array_handle, codec_pool, encode_chunks,
                    group_metadata, pwrite_all, read_shard, shard_chunks, shard_layout, tiled_array_metadata,
                    write_coordinate_files, write_node)
from .zorder import morton_order

GROUP = "overviews"
# The levels' zstd level, None: stored as their bytes (+ crc32c), not compressed -- the levels hold a
# third as many cells as the array, and compressing them (zstd -5: ~0.2 of a read's CPU; the store's
# level 1: ~0.5) kept the pyramid above 1.2x one read; raw costs +30% of the levels' bytes (22 MB
# against 17 at 4096^2) and the viewer's tiles decode nothing (benchmarks/RESULTS.md, issue 32)
LEVEL_ZSTD = None
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
    """A block of the base array to read and cascade (workers open the store by path): block (br, bc) of
    ``size`` x ``size`` cells -- a shard, or a 2^-q part of one when the array has too few shards to keep
    every thread busy to the end (:func:`_block_side`) -- its pieces of levels 1..len(levels), encoded as
    the chunks of those levels' shards, and its raw piece of level len(levels) + 1 when there is one
    (``raw``)."""

    store: str
    name: str
    block: tuple[int, int]
    size: int
    method: str
    missing: object
    digest: str
    levels: tuple[tuple[str, str], ...]  # (path, zarr.json) of each level whose pieces are whole chunks
    raw: bool


def _cascade(task: _Task):
    """Read the block once and reduce it level after level in memory: {level: its chunks' stored bytes}
    for the levels whose piece of this block is whole chunks, and the raw piece of the level above."""
    arr = _opened(task.store, task.name, task.digest)
    per_shard = arr.shards[0] // task.size  # blocks along a shard's side
    br, bc = task.block
    part = None if per_shard == 1 else Window(br * task.size, min((br + 1) * task.size, arr.shape[0]),
                                              bc * task.size, min((bc + 1) * task.size, arr.shape[1]))
    block = read_halved(arr, br // per_shard, bc // per_shard, task.method, task.missing, part)
    encoded = []
    for k, (path, meta) in enumerate(task.levels, start=1):
        if k > 1:
            block = reduce2x2(block, task.method, task.missing)
        level = _level_array(task.store, path, meta)
        per = 2**k * per_shard  # blocks along a side of a level-k shard; this one's piece starts at chunk first:
        n = level.shards[0] // level.chunks[0] // per
        encoded.append(encode_chunks(level, block, ((br % per) * n, (bc % per) * n)))
    raw = (reduce2x2(block, task.method, task.missing) if task.levels else block) if task.raw else None
    return encoded, raw


def _block_side(grid, shard_side: int, tile: int, threads: int) -> int:
    """The side of a base task: a shard, halved while the array has fewer than 8 tasks a thread (and a
    half keeps 2 tiles a side; shards of a power of two tiles) -- a 4096^2 array of 4 shards on 2 cores
    is 16 tasks of 1024^2, so both threads work until the last read ends, and the last task leaves a
    sixteenth of the levels to encode after it (benchmarks/RESULTS.md, issue 32)."""
    side, count = shard_side, grid[0] * grid[1]
    tiles = shard_side // tile
    while count < 8 * threads and side >= 4 * tile and tiles & (tiles - 1) == 0:
        side, count = side // 2, count * 4
    return side


def read_halved(arr, sr: int, sc: int, method: str, missing, part: Window | None = None) -> np.ndarray:
    """Shard (sr, sc) of ``arr`` -- or ``part`` of it, a window from an even cell -- reduced once
    (:func:`reduce2x2`), each chunk halved as it is decoded (in the decoding threads, while it is in
    cache: the shard's cells are never put together); the chunks not stored are all fill value, and so
    is their half (the reduction of fill values is the fill value, or ``missing`` where the fill value is
    not valid -- as for any all-fill block)."""
    tile = arr.chunks
    if shard_layout(arr) is None or tile[0] % 2 or tile[1] % 2:  # (odd chunks: blocks would straddle them)
        return reduce2x2(read_shard(arr, sr, sc, part), method, missing)
    r0, c0 = (sr * arr.shards[0], sc * arr.shards[1]) if part is None else (part.r0, part.c0)
    rows, cols = ((min(arr.shards[0], arr.shape[0] - r0), min(arr.shards[1], arr.shape[1] - c0)) if part is None
                  else part.shape)
    half = np.empty((-(-rows // 2), -(-cols // 2)), arr.dtype)
    i0, j0 = r0 // tile[0], c0 // tile[1]  # the window's first chunk
    stored = np.zeros((-(-(r0 + rows) // tile[0]) - i0, -(-(c0 + cols) // tile[1]) - j0), bool)

    def each(r, c, cells):
        part = reduce2x2(cells, method, missing)
        half[(r - r0) // 2 : (r - r0) // 2 + part.shape[0], (c - c0) // 2 : (c - c0) // 2 + part.shape[1]] = part
        stored[r // tile[0] - i0, c // tile[1] - j0] = True

    read_shard(arr, sr, sc, part, each=each)
    if not stored.all():  # only the halves of the chunks not stored are filled (not the whole block first:
        # 16 MB of a 4096^2 pyramid's blocks written twice)
        fill = reduce2x2(np.full((2, 2), arr.fill_value, arr.dtype), method, missing)[0, 0]
        for i, j in zip(*np.nonzero(~stored)):
            a, b = max((i0 + i) * tile[0] - r0, 0) // 2, max((j0 + j) * tile[1] - c0, 0) // 2
            half[a : ((i0 + i + 1) * tile[0] - r0) // 2, b : ((j0 + j + 1) * tile[1] - c0) // 2] = fill
    return half


@functools.lru_cache(maxsize=64)
def _level_array(store: str, path: str, meta: str):
    """A handle on a level's metadata that its chunks are encoded with (nothing is read or written
    through it: in a worker process its folder is the store's, not the staged pyramid's)."""
    known = _OPEN.get((store, path, meta))  # (a zarr handle costs ~0.3 ms: this process's are made once)
    return known if known is not None else array_handle(store, path, json.loads(meta))


# In the process that writes the pyramid: (store, array, digest) -> the array, (store, level path, its
# zarr.json) -> the level's metadata handle
_OPEN: dict = {}


@functools.lru_cache(maxsize=8)
def _opened(store: str, name: str, digest: str):
    """The array, opened once per process for the tasks of one pyramid (``digest``: its manifest's, so a
    worker that lives on never reads another array's bytes through an old handle)."""
    known = _OPEN.get((store, name, digest))
    return known if known is not None else TerrainStore.open(store, mode="r").group[name]


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


def current_levels(store: TerrainStore, name: str) -> list[str] | None:
    """The paths of levels 1.. of ``name``'s pyramid when it is current (made from the array's bytes as
    they are now), else None (no pyramid, or one older than the array)."""
    group = f"{GROUP}/{name}"
    try:
        pyramid = store.group[group]
    except KeyError:
        return None
    if pyramid.attrs.get("source_manifest_sha256") != source_digest(store, name):
        return None
    leaf = name.rsplit("/", 1)[-1]
    count = len(level_shapes(store.group[name].shape, store.tile_size))
    return [f"{group}/{k}/{leaf}" for k in range(1, count + 1) if f"{k}/{leaf}" in pyramid]


def level_transform(t, k: int) -> list[float]:
    """GDAL geotransform of level k: the same origin, cells 2^k times as large."""
    x0, dx, rx, y0, ry, dy = t
    f = float(2**k)
    return [x0, dx * f, rx * f, y0, ry * f, dy * f]


def arrays_of(store: TerrainStore) -> list[str]:
    """The arrays that take overviews: elevation and every 2-D result of the store's shape (not the
    SSSP index's internals, not the overviews)."""
    names = [ELEVATION]
    for name, attrs in store.results().items():
        if (attrs.get("shape") == tuple(store.shape) and not name.startswith(("index/", GROUP + "/"))):
            names.append(name)
    return names


def array_digests(store_path) -> dict[str, str]:
    """:func:`source_digest` of each array that takes overviews (:func:`arrays_of`): what a command
    wrote is what changed."""
    store = TerrainStore.open(store_path, mode="r")
    return {name: source_digest(store, name) for name in arrays_of(store)}


def write_overviews(store_path, arrays=None, *, memory=None, scheduler: str | None = "local",
                    progress: bool = False, announce=None) -> dict[str, int]:
    """Write the pyramid of each of ``arrays`` (default :func:`arrays_of`) into the store; returns
    ``{array: levels}``. ``memory``: the budget (checked before any work); ``scheduler``: where the
    base shards are read and halved (the same bytes on every scheduler, tiling and budget)."""
    scheduler = check_scheduler(scheduler)
    store = TerrainStore.open(store_path)
    names = list(arrays) if arrays else arrays_of(store)
    opened = {}
    for name in names:
        if name.startswith(GROUP + "/") or name.startswith("index/"):
            raise InputError(f"{name}: takes no overviews")
        try:
            opened[name] = arr = store.array(name)
        except KeyError:
            raise StoreError(f"{store.path}: no array {name!r} (see 'terrain info')") from None
        if not hasattr(arr, "shards") or len(arr.shape) != 2:
            raise StoreError(f"{store.path}: {name!r} is not a 2-D array")
    side = store.tile_size * store.shard_size
    itemsize = max(a.dtype.itemsize for a in opened.values())
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
    for name in names:  # (after each pyramid's commit the store's group is opened again when used)
        done[name] = _pyramid(store, name, opened[name], scheduler, in_flight, progress, announce)
    return done


def _pyramid(store: TerrainStore, name: str, arr, scheduler: str, in_flight: int, progress: bool, announce) -> int:
    shapes = level_shapes(arr.shape, store.tile_size)
    if not shapes:
        return 0
    method = resampling_for(name, arr.dtype)
    missing = missing_value(store, name, arr)
    fill = arr.fill_value
    leaf = name.rsplit("/", 1)[-1]
    t = store.geotransform
    attrs = {"source": name, "resampling_method": method, "source_manifest_sha256": source_digest(store, name),
             "zarr_conventions": [CONVENTION]}
    layout = []
    for k, shape in enumerate(shapes, start=1):
        entry = {"asset": str(k), "transform": {"scale": [2.0, 2.0], "translation": [0.0, 0.0]},
                 "resampling_method": method, "proj:shape": list(shape), "proj:transform": level_transform(t, k)}
        if k > 1:
            entry["derived_from"] = str(k - 1)
        layout.append(entry)
    attrs["multiscales"] = {"version": "0.1.0", "layout": layout, "resampling_method": method}
    side = store.tile_size * store.shard_size
    size = _block_side([-(-n // side) for n in arr.shape], side, store.tile_size, os.cpu_count() or 1)
    grid0 = tuple(-(-n // size) for n in arr.shape)  # the base tasks' blocks
    # a block's piece of level k is whole chunks of a level-k shard while 2^k <= the tiles of a block's
    # side: those are encoded where the block is read; the levels above are put together here
    whole = min(len(shapes), int(math.log2(size // store.tile_size)))
    metas = [tiled_array_metadata(shape, arr.dtype, store.tile_size, store.shard_size, fill,
                                  {"level": k, **_source_attrs(arr)}, LEVEL_ZSTD)
             for k, shape in enumerate(shapes, start=1)]
    levels = tuple((f"{k}/{leaf}", json.dumps(m)) for k, m in enumerate(metas[:whole], start=1))
    digest = attrs["source_manifest_sha256"]
    where = str(store.path)
    tasks = [_Task(where, name, (int(r), int(c)), size, method, missing, digest, levels, whole < len(shapes))
             for r, c in morton_order(*grid0)]
    handles = {(where, name, digest): arr}  # this process's readers use the open array
    _OPEN.update(handles)
    _opened.cache_clear()
    # (in_flight counts shards: as many bytes of blocks -- all 16 of a 4096^2 array, so the readers never
    # wait for the main thread)
    in_flight *= (side // size) ** 2
    writes = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="terrain-overviews")
    try:
        with store.write_result(f"{GROUP}/{name}", attrs=attrs) as writer, writes:
            root = str(writer.group.store.root)  # the staged result group's folder
            level_arrays = [array_handle(root, f"{k}/{leaf}", m) for k, m in enumerate(metas, start=1)]
            # (the readers encode with the same handles: only their metadata is used, ~0.3 ms a handle)
            handles.update({(where, path, js): a for (path, js), a in zip(levels, level_arrays)})
            _OPEN.update(handles)
            # every level's nodes as files, and the coordinates' manifests, before the first block is read: zarr's
            # event loop would cost more than the pyramid's data, the seal is what remains after the last read,
            # and written beside the reads (a writer thread, as before) they cost the 2 cores ~10 ms of CPU
            # more than here, where they add ~5 ms of one thread (benchmarks/RESULTS.md, issue 32, fifth round)
            sealed = _write_level_nodes(root, leaf, shapes, metas, t, store.crs)
            pieces = (Prefetch(_cascade, tasks, in_flight, codec_pool()) if scheduler == "local"
                      else imap_shards(_cascade, tasks, scheduler, in_flight=in_flight, announce=announce))
            assembler = _Assembler(grid0, side // size, level_arrays, whole, side, method, missing, writes)
            try:
                with contextlib.closing(pieces), progress_bar(progress, len(tasks), f"overviews {name}",
                                                              unit="block") as bar:
                    for task, (encoded, raw) in zip(tasks, pieces):
                        for k, chunks in enumerate(encoded, start=1):
                            assembler.put_encoded(k, task.block, chunks)
                        if raw is not None:
                            assembler.put(whole + 1, task.block, raw, 2 ** (whole + 1) * (side // size), grid0)
                        bar.update(1)
                    assembler.flush()
            except BaseException:
                writes.shutdown(wait=True, cancel_futures=True)  # (no write left on a file closed here)
                assembler.discard()
                raise
            writer.sealed = sealed
    finally:
        for key in handles:
            _OPEN.pop(key, None)
    return len(shapes)


def _write_level_nodes(root, leaf: str, shapes, metas, transform, crs) -> integrity.SealedAhead:
    """Level k's group ``k``, its array's zarr.json and its coordinates, for each level; then the seal of
    all but the levels' arrays (:func:`~terrain_io.integrity.seal_ahead`: every node is written)."""
    written = {}
    for k, (shape, meta) in enumerate(zip(shapes, metas), start=1):
        folder = os.path.join(root, str(k))
        written[str(k)] = group_metadata()
        write_node(folder, written[str(k)])
        written[f"{k}/{leaf}"] = meta
        write_node(os.path.join(folder, leaf), meta)
        for name, coordinate in write_coordinate_files(folder, shape, level_transform(transform, k), crs).items():
            written[f"{k}/{name}"] = coordinate
    levels = {f"{k}/{leaf}" for k in range(1, len(shapes) + 1)}
    return integrity.seal_ahead(root, lambda rel: rel not in levels, written)


def _source_attrs(arr) -> dict:
    return {k: v for k, v in dict(arr.attrs).items() if k in ("units", "nodata", "method", "long_name")}


class _Assembler:
    """Puts a level's shards together -- from the encoded chunks of the base shards' pieces (levels
    1..``whole``) or from raw pieces (the levels above) -- writes each shard when its pieces are all
    in, and passes a raw shard's half up."""

    def __init__(self, base_grid, per_shard: int, arrays, whole: int, side: int, method: str, missing, writes):
        self.arrays, self.whole, self.side, self.method, self.missing = arrays, whole, side, method, missing
        self.per_shard = per_shard  # base blocks along a side of a base shard
        self.writes = writes
        self.grids = [tuple(base_grid), *(tuple(-(-n // side) for n in a.shape) for a in arrays)]
        self.pending: dict[tuple[int, int, int], _Pending] = {}  # (level, row, col) -> the shard put together
        self.written: list = []

    def _pieces(self, src_grid, r: int, c: int, per: int) -> int:
        """How many cells of ``src_grid`` fall in the per x per block (r, c)."""
        return min(per, src_grid[0] - r * per) * min(per, src_grid[1] - c * per)

    def _entry(self, level: int, r: int, c: int, per: int, src_grid, new) -> tuple[tuple, "_Pending"]:
        """Shard (r, c) of ``level`` being put together, ``new()`` when first met."""
        key = (level, r, c)
        if key not in self.pending:
            entry = self.pending[key] = new()
            entry.pieces = self._pieces(src_grid, r, c, per)
        return key, self.pending[key]

    def put_encoded(self, level: int, base, chunks: dict) -> None:
        """The chunks of base block ``base``'s piece of ``level`` (<= whole): written at once, in the
        order of the shard file (:class:`_ShardStream`), while the next base blocks are read."""
        per = 2**level * self.per_shard
        r, c = base[0] // per, base[1] // per
        key, entry = self._entry(level, r, c, per, self.grids[0],
                                 lambda: _Pending(_ShardStream(self.arrays[level - 1], r, c)))
        stream = entry.stream
        entry.pieces -= 1
        self._write(stream.add, chunks)
        if entry.pieces == 0:
            del self.pending[key]
            self._write(stream.close)

    def put(self, level: int, src, piece: np.ndarray, per: int, src_grid) -> None:
        """``piece``: cell ``src`` of ``src_grid`` reduced to ``level``, a 1 / per of a level shard's side;
        each chunk of the level shard is encoded and written as soon as its pieces are in (the last
        block leaves one chunk of the level above its own, not the whole shard)."""
        r, c = src[0] // per, src[1] // per
        arr = self.arrays[level - 1]
        p = self.side // per  # a piece's side
        key, entry = self._entry(level, r, c, per, src_grid, lambda: self._raw_shard(arr, r, c, per, src_grid))
        block, stream, left = entry.block, entry.stream, entry.chunk_waits
        a0, b0 = (src[0] % per) * p, (src[1] % per) * p
        block[a0 : a0 + piece.shape[0], b0 : b0 + piece.shape[1]] = piece
        t0, t1 = arr.chunks
        ready = {}
        for i in range(a0 // t0, (a0 + piece.shape[0] - 1) // t0 + 1):
            for j in range(b0 // t1, (b0 + piece.shape[1] - 1) // t1 + 1):
                left[i, j] -= 1
                if left[i, j] == 0:
                    ready.update(encode_chunks(arr, block[i * t0 : (i + 1) * t0, j * t1 : (j + 1) * t1], (i, j)))
        if ready:
            self._write(stream.add, ready)
        entry.pieces -= 1
        if entry.pieces == 0:
            del self.pending[key]
            self._write(stream.close)
            if level < len(self.arrays):
                self.put(level + 1, (r, c), reduce2x2(block, self.method, self.missing), 2, self.grids[level])

    def _raw_shard(self, arr, r: int, c: int, per: int, src_grid) -> "_Pending":
        """The :meth:`_entry` of a level shard put together from raw pieces."""
        h = min(self.side, arr.shape[0] - r * self.side)
        w = min(self.side, arr.shape[1] - c * self.side)
        p = self.side // per
        rows, cols = min(per, src_grid[0] - r * per), min(per, src_grid[1] - c * per)  # pieces of this shard

        def waits(n, t, count):  # pieces along a side that overlap each chunk along it
            return np.array([min(-(-(i + 1) * t // p), count) - i * t // p for i in range(-(-n // t))])

        left = np.outer(waits(h, arr.chunks[0], rows), waits(w, arr.chunks[1], cols))
        return _Pending(_ShardStream(arr, r, c), np.empty((h, w), arr.dtype), left)

    def _write(self, fn, *args) -> None:
        self.written.append(self.writes.submit(fn, *args))
        while len(self.written) > 2:  # a bounded number of shards queued for writing
            self.written.pop(0).result()

    def flush(self) -> None:
        if self.pending:  # (cannot happen: every shard's pieces are counted)
            raise AssertionError(f"overviews: shards left incomplete: {sorted(self.pending)}")
        for f in self.written:
            f.result()

    def discard(self) -> None:
        """Close the files of the shards left incomplete (a failed or interrupted pyramid)."""
        for entry in self.pending.values():
            entry.stream.discard()


@dataclass
class _Pending:
    """A level shard being put together: its :class:`_ShardStream`, how many pieces it still waits for,
    and for a level made from raw pieces its cells and how many pieces each of its chunks waits for."""

    stream: "_ShardStream"
    block: np.ndarray | None = None
    chunk_waits: np.ndarray | None = None
    pieces: int = 0


class _ShardStream:
    """Shard (sr, sc) of a level written as its pieces come (from :func:`encode_chunks`, any order): the
    chunks are laid out in the file's order (Morton order, :func:`~terrain_io.store.shard_chunks`) as
    soon as all chunks before them are in, the index and its crc32c at the end on :meth:`close` -- the
    bytes :func:`~terrain_io.store.write_encoded_shard` writes of all the pieces at once. Base shards come
    in Morton order, so each piece is written when it comes, while the next base shards are read (no
    serial tail of level files after the last read)."""

    def __init__(self, arr, sr: int, sc: int):
        self.order = shard_chunks(arr, sr, sc)
        self.known: dict = {}
        self.next = 0  # chunks order[:next] are written (or left out)
        self.index = np.full((arr.shards[0] // arr.chunks[0], arr.shards[1] // arr.chunks[1], 2), NO_CHUNK, "<u8")
        self.offset, self.fd = 0, None
        self.path = os.path.join(arr.store.root, arr.path, arr.metadata.encode_chunk_key((sr, sc)))

    def add(self, chunks: dict) -> None:
        self.known.update(chunks)
        parts, at = [], self.offset
        while self.next < len(self.order) and self.order[self.next] in self.known:
            ij = self.order[self.next]
            data = self.known.pop(ij)
            self.next += 1
            if data is not None:  # (None: all fill value, left out)
                size = sum(memoryview(d).nbytes for d in data)
                self.index[ij] = at, size
                parts.extend(data)
                at += size
        self._append(parts)

    def _append(self, parts) -> None:
        views = [memoryview(p).cast("B") for p in parts]
        if views and self.fd is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        if views:
            self.offset += pwrite_all(self.fd, views, self.offset)

    def close(self) -> None:
        if self.next < len(self.order):  # chunks never given: all fill value
            self.known.update({ij: None for ij in self.order[self.next:] if ij not in self.known})
            self.add({})
        if self.fd is None:  # every chunk left out: zarr keeps no file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return
        index_bytes = self.index.tobytes()
        self._append([index_bytes, integrity.crc32c(index_bytes)])
        os.ftruncate(self.fd, self.offset)
        self.discard()

    def discard(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
