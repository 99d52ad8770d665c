"""The tiled plan of the out-of-core grid pipelines (``mst``, ``fill``, ``depressions``) and its one
budget planner.

A store's tiles are visited in Morton (Z) order, in *batches*: a batch is a quadtree block of
k x k tiles (k a power of two) read and processed together -- a whole shard when k is the shard
side, a part of one under a smaller budget, the whole DEM when it is held in memory. A batch's
tiles stay in Morton order inside it, so the batches' concatenation is the global tile order
(the MST's streaming merge relies on it, docs/ARCHITECTURE.md#mst-pipeline).

The planner takes what a pipeline needs with batches of k x k tiles (``need(k)``, bytes of host
memory: its fixed state plus the batches in flight) and gives the largest k that fits the budget,
or refuses with one line that states the least budget that works.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError
from ..memory import format_bytes
from ..store import TerrainStore, Window
from ..zorder import morton_decode, morton_encode, morton_order


@dataclass
class Batch:
    """A quadtree block of tiles processed together (a shard, a part of one, or the whole DEM)."""

    window: Window
    codes: np.ndarray  # Morton codes of its tiles, in order
    tiles: np.ndarray  # (n, 4): i0, j0, h, w inside the window


@dataclass(frozen=True)
class Plan:
    """A pipeline's choice: ``side`` (batch side in tiles), ``held`` (the whole DEM is one batch
    whose per-cell state stays in memory between the phases) and ``bytes`` (what the planner
    counted for it: the rest of the budget is room for state that grows with the output, such as
    a table of depressions, which the pipeline counts as it grows)."""

    side: int
    held: bool = False
    bytes: int = 0


class Batches(Sequence):
    """The store's batches in Morton order, each :class:`Batch` made when asked for: held as a list
    they took ~540 bytes a batch (a window, three small arrays), 1.1 MB for 2048 batches of one 64^2
    tile -- a fifth of a 4 MiB budget; here three int64s a tile."""

    def __init__(self, store: TerrainStore, side: int):
        self.tile = store.tile_size
        self.shape = store.shape
        self.side = side
        self.order = morton_order(*store.tile_grid)
        self.codes = morton_encode(self.order[:, 0], self.order[:, 1]).astype(np.int64)
        self.shift = 2 * int(math.log2(side))  # a batch: the tiles of one code >> shift
        block = self.codes >> self.shift  # (where each batch's run of tiles starts)
        self.starts = np.append(np.flatnonzero(np.diff(block, prepend=-1)), len(block))

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        start, stop = int(self.starts[i]), int(self.starts[i + 1])
        t, side = self.tile, self.side
        rows, cols = self.shape
        br, bc = morton_decode(np.uint64(self.codes[start] >> self.shift))
        win = Window(br * side * t, min((br + 1) * side * t, rows), bc * side * t, min((bc + 1) * side * t, cols))
        tr, tc = self.order[start:stop, 0], self.order[start:stop, 1]
        i0 = tr * t - win.r0
        j0 = tc * t - win.c0
        h = np.minimum(t, rows - tr * t)
        w = np.minimum(t, cols - tc * t)
        return Batch(win, self.codes[start:stop], np.stack([i0, j0, h, w], axis=1).astype(np.int64))


def plan_batches(store: TerrainStore, side: int) -> Batches:
    """The store's tiles in Morton order, cut into batches of ``side`` x ``side`` tiles (a power of
    two; the DEM's edge cuts the last ones): a sequence of :class:`Batch`, each made when read."""
    return Batches(store, side)


def whole_side(store: TerrainStore) -> int:
    """The batch side (in tiles) whose one batch covers the whole DEM."""
    return 1 << max(0, math.ceil(math.log2(max(store.tile_grid))))


def check_side(store: TerrainStore, side: int) -> int:
    """A batch side forced by a caller (tests, benchmarks): a power of two up to the shard side."""
    if side < 1 or side & (side - 1) or side > store.shard_size:
        raise InputError(f"batch size must be a power of two <= the shard size {store.shard_size}, got {side}")
    return side


def plan(store: TerrainStore, budget: int, what: str, need: Callable[[int], int],
         held_need: int | None = None) -> Plan:
    """The budget planner: the whole DEM held when ``held_need`` (bytes) fits ``budget``; else the
    largest power-of-two batch side k (in tiles, at most the shard side) with ``need(k)`` within
    ``budget``. A budget that not even one-tile batches fit is refused with one line naming the
    least that works (``need(1)``); ``what`` names the pipeline in it."""
    if held_need is not None and held_need <= budget:
        return Plan(whole_side(store), held=True, bytes=held_need)
    k = store.shard_size
    while k > 1 and need(k) > budget:
        k //= 2
    if need(k) > budget:
        t = store.tile_size
        raise InputError(f"memory budget {format_bytes(budget)} too small for this store: {what} needs at least "
                         f"{format_bytes(need(1))} with {t} x {t} tiles (raise --memory, or convert with "
                         "another --tile)")
    return Plan(k, bytes=need(k))
