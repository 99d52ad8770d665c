"""Allocation: which source each cell's shortest path comes from (``sssp/NAME/source``).

GRASS r.cost's ``nearest=`` and ArcGIS Cost Allocation: the number (1, 2, ... the point's place in
its input, whatever was left out or repeated before it; :class:`SourceCells`) of the source at the
root of the cell's predecessor chain; 0 where no source reaches a cell and on nodata. Points that
share a cell are one source: the first one's number. Following the predecessors makes ties of
distance take the tie rule's side, so the allocation is the same bytes on every method that gives the same predecessors (in-core, shards).

* In memory (the in-core method): every chain is followed once, memoised
  (:func:`allocate_block`); on the GPU by pointer jumping -- each cell's pointer replaced by its
  pointer's pointer until every one points at a root, O(log depth) rounds (Wyllie's list
  ranking, as in :mod:`terrain_io.graph.listrank`).
* Out of core (the shard and index methods): two passes over the written predecessors, block by
  block (:func:`write_allocation`). Pass 1 follows the chains inside each block; a chain that
  leaves it ends at a frame cell whose parent lies in the next block. Only the frames' answers
  are kept -- 4 numbers per block side, O(N / S) for blocks of side S -- and the pointers between
  frames are then resolved in memory. Pass 2 follows the chains again and writes the labels.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...weights import DC, DR
from .result import NO_PRED


class SourceCells(list):
    """Distinct source cells ``(row, col)`` in the order given, and ``labels``: each one's number in
    the allocation -- its first point's place in the input, from 1 -- so that the numbers follow the
    input even when points were repeated or left out (``--skip-invalid``)."""

    def __init__(self, cells, labels):
        super().__init__(cells)
        self.labels = [int(x) for x in labels]
        if len(self.labels) != len(self):
            raise ValueError("one label a cell")


def _source_labels(cells, win_r0, win_c0, h, w) -> np.ndarray:
    """The labels of the sources in a block (:class:`SourceCells`' own, else 1-based places with the
    first of equal cells winning), 0 elsewhere."""
    labels = np.asarray(cells.labels if isinstance(cells, SourceCells) else np.arange(1, len(cells) + 1), np.int64)
    cells = np.asarray(cells, np.int64).reshape(-1, 2)
    r, c = cells[:, 0] - win_r0, cells[:, 1] - win_c0
    inside = np.nonzero((r >= 0) & (r < h) & (c >= 0) & (c < w))[0][::-1]
    lab = np.zeros((h, w), np.uint32)
    for n in inside:  # backwards: the first of equal cells is written last
        lab[r[n], c[n]] = labels[n]
    return lab


def allocate_block(pred: np.ndarray, cells) -> np.ndarray:
    """The allocation of a whole grid from its predecessor codes (NumPy, h x w) and its sources."""
    from ._allocation_cpu import chase

    h, w = pred.shape
    roots = np.empty((h, w), np.int64)
    chase(np.ascontiguousarray(pred), _source_labels(cells, 0, 0, h, w), 0, 0, h, w, roots)
    np.negative(roots, out=roots)  # no chain leaves the whole grid: every root is -1 - label
    roots -= 1
    return roots.astype(np.uint32)


def allocate_gpu(pred, cells):
    """:func:`allocate_block` on the GPU (CuPy in and out) by pointer jumping."""
    import cupy as cp

    h, w = pred.shape
    index = cp.int32 if h * w < 2**31 else cp.int64
    parent = cp.ElementwiseKernel(
        "uint8 p, int32 w, raw int32 dr, raw int32 dc", "T nxt",
        f"const long long r = i / w, c = i % w; nxt = p == {NO_PRED} ? (T)i : (T)((r + dr[p]) * w + c + dc[p]);",
        "terrain_parent_pointer")
    nxt = cp.empty(h * w, index)
    parent(pred.reshape(-1), np.int32(w), cp.asarray(DR, cp.int32), cp.asarray(DC, cp.int32), nxt)
    while True:
        jumped = nxt[nxt]
        if bool((jumped == nxt).all()):
            break
        nxt = jumped
    labels = cp.asarray(_source_labels(cells, 0, 0, h, w).reshape(-1))
    return labels[nxt].reshape(h, w)


def allocation_threads(store, budget: int, most: int) -> int:
    """Threads of :func:`write_allocation` within ``budget``: each holds a shard's codes, roots,
    flags, stack and labels (22 bytes a cell) with their compressed copies."""
    side = store.tile_size * store.shard_size
    return int(max(1, min(most, budget // (2 * 27 * side * side))))


def write_allocation(pred_arr, source_arr, windows, cells, shape, threads: int = 8, bar=None) -> None:
    """The out-of-core allocation (module docstring): reads ``pred_arr`` (zarr) window by window
    twice and writes ``source_arr``; ``windows``: the blocks (store shards) covering ``shape``."""
    from ._allocation_cpu import chase, resolve_frames

    H, W = shape
    windows = list(windows)

    def roots(win):
        pred = np.ascontiguousarray(pred_arr[win.slices])
        h, w = pred.shape
        out = np.empty((h, w), np.int64)
        chase(pred, _source_labels(cells, win.r0, win.c0, h, w), win.r0, win.c0, H, W, out)
        return out

    def frame(win):
        out = roots(win)
        h, w = out.shape
        rr = np.r_[np.zeros(w, np.int64), np.full(w, h - 1), np.arange(h), np.arange(h)]
        cc = np.r_[np.arange(w), np.arange(w), np.zeros(h, np.int64), np.full(h, w - 1)]
        return (rr + win.r0) * W + cc + win.c0, out[rr, cc]

    with ThreadPoolExecutor(threads) as pool:
        ids, values = zip(*pool.map(frame, windows))
    ids, values = np.concatenate(ids), np.concatenate(values)
    ids, first = np.unique(ids, return_index=True)
    resolved = resolve_frames(ids, values[first])

    def label(win):
        out = roots(win)
        inside = out < 0
        labels = np.empty(out.shape, np.uint32)
        labels[inside] = -1 - out[inside]
        labels[~inside] = resolved[np.searchsorted(ids, out[~inside])]
        source_arr[win.slices] = labels
        if bar is not None:
            bar.update(1)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(label, windows))
