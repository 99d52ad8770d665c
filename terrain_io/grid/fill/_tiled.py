"""Pieces of the tiled fill that the passes built on it (``depressions``, ``flow``, ``hydro``) share: the outlet
conventions, the boundary-graph geometry of a store's tiles, blocks read with a one-cell halo and
their outlets, whole in-memory results written shard by shard in parallel threads, and table cells."""
from __future__ import annotations

import concurrent.futures
import os

import numpy as np

from ...jit import SERIAL_BELOW
from ...store import TerrainStore, Window, write_window

OUTLETS = ("edge+nodata", "edge")
TABLE_IN_ATTRS = 1000  # a result's table goes into its attributes up to this many rows


class Geometry:
    """Tiles and boundary-graph nodes of a store: node 0 = O, then each tile's perimeter cells."""

    def __init__(self, rows: int, cols: int, tile: int):
        self.rows, self.cols, self.tile = rows, cols, tile
        self.ntr, self.ntc = -(-rows // tile), -(-cols // tile)
        th = np.minimum(tile, rows - np.arange(self.ntr) * tile)[:, None]
        tw = np.minimum(tile, cols - np.arange(self.ntc) * tile)[None, :]
        count = np.where(th == 1, tw, np.where(tw == 1, th, 2 * tw + 2 * (th - 2))).astype(np.int64).ravel()
        self.offset = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        self.nodes = 1 + int(count.sum())

    def args(self, win: Window):
        return win.r0, win.c0, self.rows, self.cols, self.tile, self.ntc, self.offset


def read_block(store: TerrainStore, win: Window, nodata_drains: bool):
    """A window with a one-cell halo: values, vertex mask (False outside the DEM), outlets (the
    DEM's edge, and next to nodata when ``nodata_drains``)."""
    vals = store.read(win, halo=1)
    ok = store.valid(vals)
    rows, cols = store.shape
    if win.r0 == 0:
        ok[0] = False
    if win.c0 == 0:
        ok[:, 0] = False
    if win.r1 == rows:
        ok[-1] = False
    if win.c1 == cols:
        ok[:, -1] = False
    from . import _cpu as _fill_cpu  # (here: the GPU routes that write through write_held need no numba)

    # a block smaller than a parallel job (terrain_io.jit) takes the serial entry: no thread pool for it
    outlets = _fill_cpu.outlets_serial if vals.size < SERIAL_BELOW else _fill_cpu.outlets
    return vals, ok, outlets(ok, win.r0, win.c0, rows, cols, nodata_drains)


def write_held(store: TerrainStore, *pairs) -> None:
    """Write whole results held in memory shard by shard: ``pairs`` of (array, values), the values a
    NumPy or CuPy array of the whole result, a raster whose row slices are CuPy arrays (``on_gpu``:
    hydrology's per-link rasters) or a function of a shard's slices giving its block. Those on the GPU
    leave it the one way results there do (:func:`terrain_io.pinned.write_device`: through pinned
    buffers, compressed on the GPU where nvCOMP is installed); the rest is encoded by threads, shards
    in parallel."""
    from ...backend import is_cupy

    def on_gpu(v):
        return is_cupy(v) or getattr(v, "on_gpu", False)

    held = [(arr, v) for arr, v in pairs if on_gpu(v)]
    if held:
        from ...pinned import write_device

        write_device(store, [arr for arr, _ in held], lambda r0, r1: [v[r0:r1] for _, v in held])
    pairs = [(arr, v if callable(v) else v.__getitem__) for arr, v in pairs if not on_gpu(v)]
    wins = list(store.shards())
    with concurrent.futures.ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, len(wins) * len(pairs)))) as pool:
        list(pool.map(lambda job: write_window(job[0], job[1], job[2](job[1].slices), True),
                      [(arr, win, block) for arr, block in pairs for win in wins]))


def table_cell(v):
    """A table value for CSV and attributes: a Python scalar, floats to their shortest repr."""
    v = v.item() if hasattr(v, "item") else v
    return repr(v) if isinstance(v, float) else v
