"""Pieces of the tiled fill that the passes built on it (``depressions``, ``flow``, ``hydro``) share: the outlet
conventions, the boundary-graph geometry of a store's tiles, blocks read with a one-cell halo and
their outlets, whole in-memory results written shard by shard in parallel threads, and table cells."""
from __future__ import annotations

import concurrent.futures
import os

import numpy as np

from ...jit import SERIAL_BELOW
from ...store import TerrainStore, Window, write_window
from . import _cpu as _fill_cpu

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
    # a block smaller than a parallel job (terrain_io.jit) runs the serial build: a tiled run of
    # small batches never compiles the parallel one
    outlets = _fill_cpu.outlets_serial if vals.size < SERIAL_BELOW else _fill_cpu.outlets
    return vals, ok, outlets(ok, win.r0, win.c0, rows, cols, nodata_drains)


def write_held(store: TerrainStore, *pairs, rows: tuple[int, int] | None = None) -> None:
    """Write whole in-memory results shard by shard, shards in parallel threads: ``pairs`` of
    (array, the block of a shard's slices); with ``rows`` (r0, r1), only the shards of that band."""
    wins = [w for w in store.shards() if rows is None or rows[0] <= w.r0 < rows[1]]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, len(wins) * len(pairs)))) as pool:
        list(pool.map(lambda job: write_window(job[0], job[1], job[2](job[1].slices), True),
                      [(arr, win, block) for arr, block in pairs for win in wins]))


def table_cell(v):
    """A table value for CSV and attributes: a Python scalar, floats to their shortest repr."""
    v = v.item() if hasattr(v, "item") else v
    return repr(v) if isinstance(v, float) else v
