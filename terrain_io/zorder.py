"""Morton (z-order) encoding of 2-D tile coordinates.

The key interleaves the bits of ``row`` (even positions, the lower bit of each pair) and ``col``
(odd positions), so sorting by key visits a quadtree depth first: NW, SW, NE, SE quadrant,
recursively. This is exactly the order in which zarr's sharding codec lays the chunks of a shard
on disk (``zarr.core.indexing.morton_order_iter``: the first axis varies fastest), and the order in
which every pipeline visits tiles, so a pass over the tiles reads each shard file front to back
(Gerritsen 2012, part II: the quadtree of Haverkort's hierarchy; docs/ARCHITECTURE.md#the-store).
"""
from __future__ import annotations

import numpy as np


def _spread(v):
    """Insert a zero bit above every bit of the low 32 bits of ``v`` (uint64 arithmetic)."""
    v = np.asarray(v, dtype=np.uint64) & np.uint64(0x00000000FFFFFFFF)
    v = (v | (v << np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    v = (v | (v << np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    v = (v | (v << np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    v = (v | (v << np.uint64(2))) & np.uint64(0x3333333333333333)
    v = (v | (v << np.uint64(1))) & np.uint64(0x5555555555555555)
    return v


def _compact(v):
    """Inverse of :func:`_spread`: keep the even bits of ``v`` and pack them into the low 32 bits."""
    v = np.asarray(v, dtype=np.uint64) & np.uint64(0x5555555555555555)
    v = (v | (v >> np.uint64(1))) & np.uint64(0x3333333333333333)
    v = (v | (v >> np.uint64(2))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    v = (v | (v >> np.uint64(4))) & np.uint64(0x00FF00FF00FF00FF)
    v = (v | (v >> np.uint64(8))) & np.uint64(0x0000FFFF0000FFFF)
    v = (v | (v >> np.uint64(16))) & np.uint64(0x00000000FFFFFFFF)
    return v


def morton_encode(row, col):
    """Morton key (uint64) of ``(row, col)``; scalars or arrays, each coordinate < 2**32."""
    row = np.asarray(row)
    col = np.asarray(col)
    if (row < 0).any() or (col < 0).any():
        raise ValueError("Morton coordinates must be non-negative")
    key = _spread(row) | (_spread(col) << np.uint64(1))
    return key if key.ndim else np.uint64(key)


def morton_decode(key):
    """``(row, col)`` of Morton key(s) ``key``: the inverse of :func:`morton_encode`."""
    key = np.asarray(key, dtype=np.uint64)
    row = _compact(key).astype(np.int64)
    col = _compact(key >> np.uint64(1)).astype(np.int64)
    if key.ndim == 0:
        return int(row), int(col)
    return row, col


def morton_order(n_rows: int, n_cols: int) -> np.ndarray:
    """All ``(row, col)`` of an ``n_rows x n_cols`` grid sorted by Morton key, as an (n, 2) int64 array.

    Works for any grid shape (not only powers of two): cells outside the grid are simply absent.
    """
    rows, cols = np.divmod(np.arange(n_rows * n_cols, dtype=np.int64), n_cols)
    order = np.argsort(morton_encode(rows, cols), kind="stable")
    return np.stack([rows[order], cols[order]], axis=1)
