"""Synthetic fractal terrain, generated shard by shard in bounded memory.

Every cell's elevation is a pure function of (seed, row, col): hashed lattice gradient noise summed
over octaves (fBm), with a ridged-multifractal component for mountain ridges and valleys, terraces
(exact ties: plateaus), a sea level below which the ground is flat (large tie regions), and, if
asked, nodata regions where a low-frequency noise field crosses a threshold. Because no state
crosses tile borders the result does not depend on the tile or shard size, and any size (65536^2
and beyond) is made one shard at a time.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np

from .errors import TerrainError
from .atomic import atomic_directory
from .progress import progress_bar
from .parallel import check_scheduler, map_shards
from .store import DEFAULT_SHARD, DEFAULT_TILE, Statistics, TerrainStore, Window, write_elevation_window


@nb.njit(cache=True, inline="always")
def _hash(ix, iy, seed):
    h = (np.uint64(ix) * np.uint64(0x9E3779B97F4A7C15)) ^ (np.uint64(iy) * np.uint64(0xC2B2AE3D27D4EB4F)) \
        ^ (np.uint64(seed) * np.uint64(0x165667B19E3779F9))
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return h


@nb.njit(cache=True, inline="always")
def _grad(ix, iy, seed, dx, dy):
    h = _hash(ix, iy, seed)
    angle = (h >> np.uint64(11)) * (2.0 * math.pi / 9007199254740992.0)
    return math.cos(angle) * dx + math.sin(angle) * dy


@nb.njit(cache=True, inline="always")
def _fade(t):
    return t * t * t * (t * (t * 6.0 - 15.0) + 10.0)


@nb.njit(cache=True)
def _noise(x, y, seed):
    """Gradient (Perlin-style) noise in about [-1, 1] at point (x, y)."""
    x0 = math.floor(x)
    y0 = math.floor(y)
    fx = x - x0
    fy = y - y0
    ix = np.int64(x0)
    iy = np.int64(y0)
    n00 = _grad(ix, iy, seed, fx, fy)
    n10 = _grad(ix + 1, iy, seed, fx - 1.0, fy)
    n01 = _grad(ix, iy + 1, seed, fx, fy - 1.0)
    n11 = _grad(ix + 1, iy + 1, seed, fx - 1.0, fy - 1.0)
    u = _fade(fx)
    v = _fade(fy)
    a = n00 + u * (n10 - n00)
    b = n01 + u * (n11 - n01)
    return 1.4142 * (a + v * (b - a))


@nb.njit(cache=True)
def _hole_field(x, y, seed):
    """Low-frequency field whose sublevel sets are the nodata regions."""
    return _noise(x * 2.5 + 31.7, y * 2.5 - 12.9, seed + 401) + 0.5 * _noise(x * 5.0, y * 5.0, seed + 402)


@nb.njit(cache=True)
def _hole_threshold(seed, fraction, samples):
    """Level below which ``fraction`` of the hole field lies (quantile of a fixed pseudo-random sample)."""
    vals = np.empty(samples)
    for k in range(samples):
        h = _hash(k, 7, seed + 999)
        x = (h & np.uint64(0xFFFFFF)) / 16777216.0 * 997.0
        y = ((h >> np.uint64(24)) & np.uint64(0xFFFFFF)) / 16777216.0 * 991.0
        vals[k] = _hole_field(x, y, seed)
    vals.sort()
    return vals[min(int(fraction * samples), samples - 1)]


@nb.njit(cache=True, parallel=True)
def _synth_block(r0, c0, h, w, seed, base_period, octaves, hole_threshold, out):
    """Elevations of rows r0..r0+h, cols c0..c0+w (float32, NaN = nodata) into ``out``."""
    for i in nb.prange(h):
        y = (r0 + i) / base_period
        for j in range(w):
            x = (c0 + j) / base_period
            # fBm: rolling hills
            amp = 1.0
            freq = 1.0
            fbm = 0.0
            for o in range(octaves):
                fbm += amp * _noise(x * freq, y * freq, seed + o)
                amp *= 0.5
                freq *= 2.0
            # ridged multifractal: sharp ridges and valleys
            ridge = 0.0
            amp = 0.5
            freq = 1.0
            weight = 1.0
            for o in range(min(octaves, 6)):
                s = 1.0 - abs(_noise(x * freq + 17.3, y * freq - 5.1, seed + 101 + o))
                s *= s * weight
                weight = min(max(s * 2.0, 0.0), 1.0)
                ridge += s * amp
                amp *= 0.5
                freq *= 2.1
            mountains = 0.5 + 0.5 * _noise(x * 0.35 + 3.7, y * 0.35 + 1.3, seed + 211)
            z = 300.0 * fbm + 1800.0 * ridge * mountains * mountains + 30.0
            # terraces (plateaus with exact ties) where a slow field says so
            if _noise(x * 1.5 - 9.1, y * 1.5 + 4.4, seed + 307) > 0.3:
                z = math.floor(z / 40.0) * 40.0
            if z < 0.0:  # sea level: flat
                z = 0.0
            if _hole_field(x, y, seed) < hole_threshold:
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
               announce=None) -> TerrainStore:
    """Write a ``size x cols`` synthetic DEM store at ``out`` (cell size in metres, local CRS).

    One task per shard on ``scheduler`` (see :func:`terrain_io.parallel.map_shards`); the result
    is the same bytes on every scheduler.
    """
    rows, cols = int(size), int(cols or size)
    if rows <= 0 or cols <= 0:
        raise TerrainError(f"size must be positive, got {rows} x {cols}")
    if not 0.0 <= nodata_fraction < 1.0:
        raise TerrainError("--nodata-fraction must be in [0, 1)")
    scheduler = check_scheduler(scheduler)
    out = Path(out)
    if out.exists() and not overwrite:
        raise TerrainError(f"{out}: already exists (use --overwrite to replace it)")
    t0 = time.perf_counter()
    attrs = {"transform": [0.0, cell_size, 0.0, rows * cell_size, 0.0, -cell_size],
             "cell_size": [cell_size, cell_size], "crs": None, "source": f"terrain synth seed={seed}",
             "source_format": "synthetic", "synth": {"seed": seed, "nodata_fraction": nodata_fraction}}
    with atomic_directory(out) as tmp:
        store = TerrainStore.create(tmp, (rows, cols), "float32", tile=tile, shard=shard, attrs=attrs)
        tasks = [_SynthShard(str(tmp), win, seed, nodata_fraction) for win in store.shards()]
        with progress_bar(progress, len(tasks), "synth", unit="shard") as bar:
            parts = map_shards(_synth_shard, tasks, scheduler, progress=bar, announce=announce)
        stats = Statistics()
        for part in parts:
            stats.merge(part)
        store.update_attrs(**stats.as_attrs(), seconds=round(time.perf_counter() - t0, 3))
    return TerrainStore.open(out)


@dataclass(frozen=True)
class _SynthShard:
    store: str
    window: Window
    seed: int
    nodata_fraction: float


def _synth_shard(task: _SynthShard) -> Statistics:
    """Generate and write one shard (a task: whole shard, so a rerun writes the same bytes)."""
    win = task.window
    block = synth_array(*win.shape, task.seed, task.nodata_fraction, r0=win.r0, c0=win.c0)
    return write_elevation_window(task.store, win, block)
