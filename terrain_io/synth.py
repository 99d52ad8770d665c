"""Synthetic fractal terrain, generated shard by shard in bounded memory.

Every cell's elevation is a pure function of (seed, row, col): hashed lattice gradient noise summed
over octaves (fBm), with a ridged-multifractal component for mountain ridges and valleys, terraces
(exact ties: plateaus), a sea level below which the ground is flat (large tie regions), and, if
asked, nodata regions where a low-frequency noise field crosses a threshold. Because no state
crosses tile borders the result does not depend on the tile or shard size, and any size (65536^2
and beyond) is made one shard at a time.

Speed: each row keeps the (cos, sin) gradients of the lattice cell its last point of every octave
fell in, so the transcendental calls -- nearly all of the cost -- are made once per lattice cell
crossed, not four times per octave and cell (the arithmetic is untouched: the same doubles). Rows
run on all cores (numba threads) while other threads compress and write the finished shards.
"""
from __future__ import annotations

import collections
import concurrent.futures
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np

from .errors import TerrainError
from .atomic import atomic_directory
from .progress import progress_bar
from .parallel import check_scheduler, map_shards
from .store import (DEFAULT_SHARD, DEFAULT_TILE, ELEVATION, Statistics, TerrainStore, Window, statistics,
                    check_store_output, write_shard)


BYTES_PER_CELL = 4  # a float32 cell on disk, at most (zstd does not grow it)


@nb.njit(cache=True, inline="always")
def _hash(ix, iy, seed):
    h = (np.uint64(ix) * np.uint64(0x9E3779B97F4A7C15)) ^ (np.uint64(iy) * np.uint64(0xC2B2AE3D27D4EB4F)) \
        ^ (np.uint64(seed) * np.uint64(0x165667B19E3779F9))
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return h


@nb.njit(cache=True, inline="always")
def _fade(t):
    return t * t * t * (t * (t * 6.0 - 15.0) + 10.0)


@nb.njit(cache=True, inline="always")
def _corner_gradients(ix, iy, seed, grads, slot):
    """(cos, sin) of the hashed gradient angles at the 4 lattice corners of cell (ix, iy) into ``grads[slot]``."""
    for k in range(4):
        h = _hash(ix + (k & 1), iy + (k >> 1), seed)
        angle = (h >> np.uint64(11)) * (2.0 * math.pi / 9007199254740992.0)
        grads[slot, 2 * k] = math.cos(angle)
        grads[slot, 2 * k + 1] = math.sin(angle)


@nb.njit(cache=True, inline="always")
def _noise(x, y, seed, keys, grads, slot):
    """Gradient (Perlin-style) noise in about [-1, 1] at point (x, y).

    The corner gradients (two transcendental calls each, nearly all of the cost) are kept per
    ``slot`` -- one slot per octave/field -- and recomputed only when the point leaves the lattice
    cell of the previous call: neighbouring cells of a row share them (an octave of period p cells
    recomputes once every p cells). The arithmetic on them is unchanged, so every value is the same
    double as computing the gradients afresh.
    """
    x0 = math.floor(x)
    y0 = math.floor(y)
    fx = x - x0
    fy = y - y0
    ix = np.int64(x0)
    iy = np.int64(y0)
    if keys[slot, 2] == 0 or keys[slot, 0] != ix or keys[slot, 1] != iy:
        _corner_gradients(ix, iy, seed, grads, slot)
        keys[slot, 0] = ix
        keys[slot, 1] = iy
        keys[slot, 2] = 1
    n00 = grads[slot, 0] * fx + grads[slot, 1] * fy
    n10 = grads[slot, 2] * (fx - 1.0) + grads[slot, 3] * fy
    n01 = grads[slot, 4] * fx + grads[slot, 5] * (fy - 1.0)
    n11 = grads[slot, 6] * (fx - 1.0) + grads[slot, 7] * (fy - 1.0)
    u = _fade(fx)
    v = _fade(fy)
    a = n00 + u * (n10 - n00)
    b = n01 + u * (n11 - n01)
    return 1.4142 * (a + v * (b - a))


@nb.njit(cache=True)
def _hole_field(x, y, seed, keys, grads, slot):
    """Low-frequency field whose sublevel sets are the nodata regions (cache slots ``slot``, ``slot + 1``)."""
    return (_noise(x * 2.5 + 31.7, y * 2.5 - 12.9, seed + 401, keys, grads, slot)
            + 0.5 * _noise(x * 5.0, y * 5.0, seed + 402, keys, grads, slot + 1))


@nb.njit(cache=True)
def _hole_threshold(seed, fraction, samples):
    """Level below which ``fraction`` of the hole field lies (quantile of a fixed pseudo-random sample)."""
    vals = np.empty(samples)
    keys = np.zeros((2, 3), dtype=np.int64)
    grads = np.empty((2, 8))
    for k in range(samples):
        h = _hash(k, 7, seed + 999)
        x = (h & np.uint64(0xFFFFFF)) / 16777216.0 * 997.0
        y = ((h >> np.uint64(24)) & np.uint64(0xFFFFFF)) / 16777216.0 * 991.0
        vals[k] = _hole_field(x, y, seed, keys, grads, 0)
    vals.sort()
    return vals[min(int(fraction * samples), samples - 1)]


@nb.njit(cache=True, parallel=True, nogil=True)
def _synth_block(r0, c0, h, w, seed, base_period, octaves, hole_threshold, out):
    """Elevations of rows r0..r0+h, cols c0..c0+w (float32, NaN = nodata) into ``out``; rows in parallel."""
    ridge_octaves = min(octaves, 6)
    mslot = octaves + ridge_octaves
    for i in nb.prange(h):
        keys = np.zeros((mslot + 4, 3), dtype=np.int64)  # this row's gradient cache (see _noise)
        grads = np.empty((mslot + 4, 8))
        y = (r0 + i) / base_period
        for j in range(w):
            x = (c0 + j) / base_period
            # fBm: rolling hills
            amp = 1.0
            freq = 1.0
            fbm = 0.0
            for o in range(octaves):
                fbm += amp * _noise(x * freq, y * freq, seed + o, keys, grads, o)
                amp *= 0.5
                freq *= 2.0
            # ridged multifractal: sharp ridges and valleys
            ridge = 0.0
            amp = 0.5
            freq = 1.0
            weight = 1.0
            for o in range(ridge_octaves):
                s = 1.0 - abs(_noise(x * freq + 17.3, y * freq - 5.1, seed + 101 + o, keys, grads, octaves + o))
                s *= s * weight
                weight = min(max(s * 2.0, 0.0), 1.0)
                ridge += s * amp
                amp *= 0.5
                freq *= 2.1
            mountains = 0.5 + 0.5 * _noise(x * 0.35 + 3.7, y * 0.35 + 1.3, seed + 211, keys, grads, mslot)
            z = 300.0 * fbm + 1800.0 * ridge * mountains * mountains + 30.0
            # terraces (plateaus with exact ties) where a slow field says so
            if _noise(x * 1.5 - 9.1, y * 1.5 + 4.4, seed + 307, keys, grads, mslot + 1) > 0.3:
                z = math.floor(z / 40.0) * 40.0
            if z < 0.0:  # sea level: flat
                z = 0.0
            # no nodata asked (threshold -inf): the field is not needed, no value lies below -inf
            if hole_threshold > -np.inf and _hole_field(x, y, seed, keys, grads, mslot + 2) < hole_threshold:
                z = np.nan
            out[i, j] = np.float32(z)


def synth_array(rows: int, cols: int, seed: int = 0, nodata_fraction: float = 0.0, *, r0: int = 0, c0: int = 0,
                period: float = 1024.0) -> np.ndarray:
    """The synthetic terrain of cells [r0, r0+rows) x [c0, c0+cols) as a float32 array."""
    out = np.empty((rows, cols), dtype=np.float32)
    threshold = _hole_threshold(seed, nodata_fraction, 1 << 16) if nodata_fraction > 0 else -np.inf
    _synth_block(r0, c0, rows, cols, seed, float(period), 9, threshold, out)
    return out


def synthesize(out, size: int, *, cols: int | None = None, seed: int = 0, nodata_fraction: float = 0.0,
               tile: int = DEFAULT_TILE, shard: int = DEFAULT_SHARD, cell_size: float = 10.0,
               overwrite: bool = False, progress: bool = False, scheduler: str | None = "local",
               announce=None, writers: int | None = None) -> TerrainStore:
    """Write a ``size x cols`` synthetic DEM store at ``out`` (cell size in metres, local CRS).

    ``scheduler="local"``: shards are generated one after another on all cores (numba threads over
    rows) while ``writers`` threads (default: the cores) compress and write the earlier ones
    (zstd releases the GIL). Other schedulers: one task per shard (see
    :func:`terrain_io.parallel.map_shards`). The result is the same bytes on every scheduler.
    """
    rows, cols = int(size), int(cols or size)
    if rows <= 0 or cols <= 0:
        raise TerrainError(f"size must be positive, got {rows} x {cols}")
    if not 0.0 <= nodata_fraction < 1.0:
        raise TerrainError("--nodata-fraction must be in [0, 1)")
    if not (math.isfinite(cell_size) and cell_size > 0):
        raise TerrainError(f"--cell-size must be a positive number of metres, got {cell_size!r}")
    scheduler = check_scheduler(scheduler)
    out = Path(out)
    check_store_output(out, overwrite)  # only a store of this tool is replaced
    _check_disk(out, rows, cols)
    t0 = time.perf_counter()
    attrs = {"transform": [0.0, cell_size, 0.0, rows * cell_size, 0.0, -cell_size],
             "cell_size": [cell_size, cell_size], "crs": None, "source": f"terrain synth seed={seed}",
             "source_format": "synthetic", "synth": {"seed": seed, "nodata_fraction": nodata_fraction}}
    with atomic_directory(out) as tmp:
        store = TerrainStore.create(tmp, (rows, cols), "float32", tile=tile, shard=shard, attrs=attrs)
        tasks = [_SynthShard(str(tmp), win, seed, nodata_fraction) for win in store.shards()]
        with progress_bar(progress, len(tasks), "synth", unit="shard") as bar:
            if scheduler == "local":
                parts = _generate_and_write(tasks, store.group["elevation"], writers or os.cpu_count() or 1, bar)
            else:
                parts = map_shards(_synth_shard, tasks, scheduler, progress=bar, announce=announce)
        stats = Statistics()
        for part in parts:
            stats.merge(part)
        store.update_attrs(**stats.as_attrs(), seconds=round(time.perf_counter() - t0, 3))
    return TerrainStore.open(out)


def _check_disk(out: Path, rows: int, cols: int) -> None:
    """Refuse a DEM whose store cannot fit the free space of ``out``'s disk: float32 cells take up to
    BYTES_PER_CELL there (zstd saves ~25% on this terrain: 3.0 bytes a cell measured at 2048^2)."""
    from .memory import format_bytes

    need = rows * cols * BYTES_PER_CELL
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    free = shutil.disk_usage(parent).free
    if need > free:
        raise TerrainError(f"{out}: a {rows:,} x {cols:,} DEM takes up to {format_bytes(need)}; "
                           f"{parent} has {format_bytes(free)} free")


@dataclass(frozen=True)
class _SynthShard:
    store: str
    window: Window
    seed: int
    nodata_fraction: float

    def generate(self) -> np.ndarray:
        win = self.window
        return synth_array(*win.shape, self.seed, self.nodata_fraction, r0=win.r0, c0=win.c0)

    def write(self, elevation, block: np.ndarray) -> Statistics:
        """Write the whole shard (so a rerun writes the same bytes) and return its statistics."""
        sh0, sh1 = elevation.shards
        write_shard(elevation, self.window.r0 // sh0, self.window.c0 // sh1, block)
        return statistics(block, None)


def _synth_shard(task: _SynthShard) -> Statistics:
    """Generate and write one shard: a task on a Dask worker."""
    import zarr

    return task.write(zarr.open_array(f"{task.store}/{ELEVATION}", mode="r+"), task.generate())


def _generate_and_write(tasks: list[_SynthShard], elevation, writers: int, bar) -> list[Statistics]:
    """Generate shard after shard here (all cores) while a pool of threads writes the earlier ones;
    at most ``writers + 1`` shards in memory."""
    parts: list = [None] * len(tasks)
    with concurrent.futures.ThreadPoolExecutor(max(1, writers)) as pool:
        pending: collections.deque = collections.deque()
        for i, task in enumerate(tasks):
            block = task.generate()
            while len(pending) >= max(1, writers):
                j, fut = pending.popleft()
                parts[j] = fut.result()
                bar.update(1)
            pending.append((i, pool.submit(task.write, elevation, block)))
        for j, fut in pending:
            parts[j] = fut.result()
            bar.update(1)
    return parts
