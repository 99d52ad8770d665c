"""Pieces of the tiled fill that the passes built on it (``depressions``, ``flow``, ``hydro``) share: the outlet
conventions, the boundary-graph geometry of a store's tiles, blocks read with a one-cell halo and
their outlets, and table cells."""
from __future__ import annotations

import numpy as np

from ...jit import SERIAL_BELOW
from ...store import TerrainStore, Window

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
    from . import _cpu as _fill_cpu  # (here: the GPU routes that import OUTLETS need no numba)

    # a block smaller than a parallel job (terrain_io.jit) takes the serial entry: no thread pool for it
    outlets = _fill_cpu.outlets_serial if vals.size < SERIAL_BELOW else _fill_cpu.outlets
    return vals, ok, outlets(ok, win.r0, win.c0, rows, cols, nodata_drains)
