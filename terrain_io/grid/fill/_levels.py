"""Fill levels of the boundary graph's nodes out of core: a quadtree of contracted blocks (fill's phase 2).

The boundary graph of :mod:`.fill` (node 0 = the outside O, then every tile's perimeter cells) has
O(N / T) nodes; solved whole (:func:`._cpu.solve_levels`) it takes ~112 bytes a node -- 1.75
bytes a cell with 256^2 tiles, more than a float32 store 8x the budget leaves. Here it is solved
without ever holding it, by the hierarchical merge of tile groups that keeps only each group's
outer boundary (Barnes 2016, "Parallel Priority-Flood depression filling for trillion cell
digital elevation models on desktops or clusters", Computers & Geosciences 96, its "merging the
perimeters" step applied recursively; the contraction of the terrain thesis): the blocks of a
quadtree over the tiles, in Morton order.

A block's *terminals* are O, its nodes on the block's outer edge, and the nodes outside it that
its edges reach (cross-tile edges go E, SE, S, SW).

1. Up, as phase 1 hands in the batches (the quadtree's leaves): a block's edges -- the batch's
   own, or its children's contracted edges -- are spilled to scratch and *contracted*: Kruskal
   in weight order, every component carrying one of its terminals; when two components that
   both carry one join at weight w, the edge (their terminals, w) is kept. Two terminals become
   connected in the kept forest at exactly the weight at which they do in the block's graph, so
   it has the same minimax distance between any two terminals, in at most (terminals - 1) edges.
   Four siblings done, their contracted edges are their parent's edges.
2. At the root (the whole DEM) the minimax distance to O of each node is solved (Kruskal).
3. Down, depth first in Morton order: a block's spilled edges, plus an edge (O, t, G(t)) for each
   node t near it whose level the block above solved, solved again. That is exact: a path from a
   node to O either stays in the block (its contracted children keep those minimax distances) or
   leaves it through a node t whose G(t) bounds the rest of the path. At a batch it gives G at
   its tiles' perimeter nodes and their forward neighbours, which is all phase 3 reads.

The quadtree itself (:class:`BlockTree`) knows only Morton blocks, spills and terminals: the
graph, its contraction and its solve are the caller's (fill's :class:`LevelTree` here; the
depression chains of ``grid/depressions/pipeline.py`` up and down the same tree).

Host memory: one batch's edges, and per quadtree level the waiting siblings' contracted edges and
the levels along one path down -- O(the DEM's side), ~LEVEL_BYTES a cell of side; scratch on disk
about the boundary graph's edges once over (each level's contracted edges are geometrically fewer).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numba
import numpy as np

from ...unionfind import find
from ...zorder import morton_decode
from ._cpu import solve_levels
from .._radix_cpu import argsort_float

LEVEL_BYTES = 300  # host memory of the quadtree's waiting edges and levels, a cell of the DEM's side (rows + cols)


def node_set(*parts: np.ndarray) -> np.ndarray:
    """The distinct node ids of ``parts``, sorted (a sort and a compare: numpy's ``unique`` hashes
    first, ~8x slower on the millions of nodes of a held DEM)."""
    a = np.concatenate(parts)
    a.sort()  # in place: np.sort's copy was the quadtree's peak (depressions' top blocks, ~40k ids)
    first = np.empty(len(a), np.bool_)
    first[:1] = True
    np.not_equal(a[1:], a[:-1], out=first[1:])
    return a[first]


@numba.njit(nogil=True, cache=True)
def contract(eu, ev, ew, terminal):
    """The edges of a graph (compact node ids) contracted onto its ``terminal`` nodes (module
    docstring, step 1): (u, v, w) arrays with the same minimax distance between any two terminals."""
    n = terminal.shape[0]
    parent = np.empty(n, np.int64)
    carried = np.empty(n, np.int64)  # a terminal of the component (at its root), -1: none
    for x in range(n):
        parent[x] = x
        carried[x] = x if terminal[x] else -1
    ou = np.empty(n, np.int64)
    ov = np.empty(n, np.int64)
    ow = np.empty(n, ew.dtype)
    k = 0
    for q in argsort_float(ew):
        ra, rb = find(parent, eu[q]), find(parent, ev[q])
        if ra == rb:
            continue
        ta, tb = carried[ra], carried[rb]
        if ta >= 0 and tb >= 0:
            ou[k] = ta
            ov[k] = tb
            ow[k] = ew[q]
            k += 1
        parent[ra] = rb
        if tb < 0:
            carried[rb] = ta
    return ou[:k], ov[:k], ow[:k]


@numba.njit(nogil=True, cache=True)
def node_cells(nodes, offset, rows, cols, T, ntc):
    """Global (row, col) of boundary-graph nodes (node 0, O: -1, -1): the tile whose offset range
    holds the node, then the inverse of :func:`._cpu.perimeter_id`."""
    m = nodes.shape[0]
    gr = np.empty(m, np.int64)
    gc = np.empty(m, np.int64)
    for k in range(m):
        n = nodes[k]
        if n == 0:
            gr[k] = -1
            gc[k] = -1
            continue
        p = n - 1
        lo, hi = 0, offset.shape[0] - 1  # the last tile with offset <= p
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if offset[mid] <= p:
                lo = mid
            else:
                hi = mid - 1
        tr, tc = lo // ntc, lo % ntc
        h, w = min(T, rows - tr * T), min(T, cols - tc * T)
        p -= offset[lo]
        if p < w:
            i, j = 0, p
        elif p < 2 * w:
            i, j = h - 1, p - w
        elif p < 2 * w + h - 2:
            i, j = p - 2 * w + 1, 0
        else:
            i, j = p - (2 * w + h - 2) + 1, w - 1
        gr[k] = tr * T + i
        gc[k] = tc * T + j
    return gr, gc


class BlockTree:
    """The quadtree of contracted blocks over the batches of a tiled pass (``batch_side`` tiles a
    side), its spilled graphs in the folder ``scratch``: steps 1-3 of the module docstring with the
    graph's own :meth:`_contract` (a block's graph onto its terminals) and :meth:`_solve` (a block's
    graph with the values of the known nodes near it). A graph is a tuple of arrays whose rows the
    blocks' graphs concatenate (:meth:`_merge`); :class:`LevelTree` is fill's, and
    ``grid/depressions/pipeline.py`` holds the depression chains'."""

    value_dtype = np.float64  # of the solved values

    def __init__(self, geo, batch_side: int, scratch: Path | None):
        self.geo = geo
        self.shift0 = 2 * int(math.log2(batch_side))  # a batch's Morton code: its tiles' >> shift0
        self.root_shift = 2 * max(0, math.ceil(math.log2(max(geo.ntr, geo.ntc))))
        self.scratch = scratch
        self.waiting: dict[int, tuple[int, list]] = {}  # shift -> (parent code, contracted children)
        self.children: dict[tuple[int, int], list[int]] = {}
        self.root = None

    def _contract(self, shift: int, code: int, edges) -> tuple:
        raise NotImplementedError

    def _solve(self, shift: int, code: int, edges, known) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    # -- step 1 -----------------------------------------------------------------------------------
    def add_batch(self, code: int, edges) -> None:
        """A batch's graph, batches in Morton order."""
        self._block(self.shift0, code, list(edges))

    def _block(self, shift: int, code: int, edges) -> None:
        if shift >= self.root_shift:
            self.root = edges
            return
        np.savez(self._file(shift, code), *edges)
        kept = self._contract(shift, code, edges)
        del edges
        waiting = self.waiting.get(shift)
        if waiting is not None and waiting[0] != code >> 2:
            self._merge(shift)
        self.waiting.setdefault(shift, (code >> 2, []))[1].append((code, kept))

    def _merge(self, shift: int) -> None:
        """The waiting children at ``shift``: their contracted graphs are their parent's graph."""
        parent, parts = self.waiting.pop(shift)
        self.children[(shift + 2, parent)] = [c for c, _ in parts]
        self._block(shift + 2, parent, _joined(parts))  # (not kept in this frame: the block above frees it)

    def finish(self) -> None:
        """All batches in: merge up to the root."""
        shift = self.shift0
        while self.root is None:
            if shift in self.waiting:
                self._merge(shift)
            shift += 2

    def _terminal(self, shift: int, code: int, nodes: np.ndarray) -> np.ndarray:
        """Which ``nodes`` are the block's terminals: O, its outer edge's, those outside it."""
        r0, r1, c0, c1 = self._window(shift, code)
        gr, gc = node_cells(nodes, self.geo.offset, self.geo.rows, self.geo.cols, self.geo.tile, self.geo.ntc)
        return (nodes == 0) | (gr <= r0) | (gr >= r1 - 1) | (gc <= c0) | (gc >= c1 - 1)

    # -- steps 2 and 3 ----------------------------------------------------------------------------
    def batch_levels(self):
        """(batch code, nodes, values) for every batch in Morton order: the solved values at the
        batch's nodes and the nodes next to it."""
        empty = (np.zeros(0, np.int64), np.zeros(0, self.value_dtype))
        root, self.root = self.root, None  # (freed once solved)
        yield from self._down(self.root_shift, 0, root, empty)

    def _down(self, shift: int, code: int, edges, known):
        nodes, G = self._solve(shift, code, edges, self._near(shift, code, known))
        edges.clear()  # (a list: the caller's name for it -- batch_levels' for the root -- holds no arrays)
        del edges, known
        if shift <= self.shift0:
            yield code, nodes, G
            return
        for child in self.children.pop((shift, code)):
            # (loaded as the argument, not into this frame, where it would be held under the child's)
            yield from self._down(shift - 2, child, self._load(shift - 2, child), (nodes, G))

    def _load(self, shift: int, code: int) -> tuple:
        """A block's spilled graph, read back once."""
        with np.load(self._file(shift, code)) as f:
            edges = [f[f"arr_{i}"] for i in range(len(f.files))]
        os.unlink(self._file(shift, code))
        return edges

    def _near(self, shift: int, code: int, known):
        """The known (nodes, values) within a cell of the block (O left out)."""
        kn, kg = known
        if len(kn):
            r0, r1, c0, c1 = self._window(shift, code)
            gr, gc = node_cells(kn, self.geo.offset, self.geo.rows, self.geo.cols, self.geo.tile, self.geo.ntc)
            near = (kn > 0) & (gr >= r0 - 1) & (gr <= r1) & (gc >= c0 - 1) & (gc <= c1)
            kn, kg = kn[near], kg[near]
        return kn, kg

    def _window(self, shift: int, code: int) -> tuple[int, int, int, int]:
        side = 1 << (shift // 2)
        tr, tc = morton_decode(np.uint64(code))
        t = self.geo.tile
        return (tr * side * t, min((tr + 1) * side * t, self.geo.rows),
                tc * side * t, min((tc + 1) * side * t, self.geo.cols))

    def _file(self, shift: int, code: int) -> str:
        # a str, not a Path: pathlib interns each name it parses, and the thousands of unique names
        # grew the interpreter's table of interned strings by ~1 MB (2048 batches of a 64^2 tile)
        return os.path.join(self.scratch, f"{shift}-{code}.npz")


def _joined(parts: list) -> list:
    """The graphs of ``parts`` ((code, graph) pairs) concatenated; ``parts`` emptied."""
    edges = [np.concatenate([p[i] for _, p in parts]) for i in range(len(parts[0][1]))]
    parts.clear()
    return edges


class LevelTree(BlockTree):
    """Fill's boundary graph (edges u, v, w; node 0 = O) up and down the quadtree: contracted by
    Kruskal onto the terminals (:func:`contract`), solved as minimax distances to O (G, float64,
    NaN: no way to O)."""

    def __init__(self, geo, batch_side: int, scratch: Path | None, wdtype):
        super().__init__(geo, batch_side, scratch)
        self.wdtype = np.dtype(wdtype)

    def _contract(self, shift, code, edges):
        nodes = node_set(edges[0], edges[1])
        terminal = self._terminal(shift, code, nodes)
        u, v, w = contract(np.searchsorted(nodes, edges[0]), np.searchsorted(nodes, edges[1]), edges[2], terminal)
        return nodes[u], nodes[v], w

    def _solve(self, shift, code, edges, known):
        """G at the block's nodes and at the known nodes near it: its edges solved with an edge
        (O, t, G(t)) from each such known t."""
        kn, kg = known
        nodes = node_set(np.zeros(1, np.int64), edges[0], edges[1], kn)
        seeded = ~np.isnan(kg)
        u = np.concatenate([np.searchsorted(nodes, edges[0]), np.zeros(int(seeded.sum()), np.int64)])
        v = np.concatenate([np.searchsorted(nodes, edges[1]), np.searchsorted(nodes, kn[seeded])])
        w = np.concatenate([edges[2], kg[seeded].astype(self.wdtype)])  # G is one of the weights: exact
        return nodes, solve_levels(len(nodes), u, v, w)


class LocalLevels:
    """G of one batch for the phase-3 kernels: the nodes of its tiles and the tiles around it
    numbered 1, 2, ... (``offset``, a copy of the store's with those tiles' entries renumbered),
    so that ``G`` need not span the whole boundary graph; :meth:`to_global` maps kernel node ids back.
    ``missing``: G of the nodes not given; ``outside``: G[0] (fill's O). Any values: depressions
    gives its chains' ends."""

    def __init__(self, geo, window, nodes: np.ndarray, G: np.ndarray, missing=np.nan, outside=-np.inf):
        T = geo.tile
        tr0, tr1 = max(window.r0 // T - 1, 0), min(-(-window.r1 // T) + 1, geo.ntr)
        tc0, tc1 = max(window.c0 // T - 1, 0), min(-(-window.c1 // T) + 1, geo.ntc)
        self.tiles = (np.arange(tr0, tr1)[:, None] * geo.ntc + np.arange(tc0, tc1)[None, :]).ravel()
        count = np.diff(np.append(geo.offset, geo.nodes - 1))[self.tiles]
        self.local = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        self.global_offset = geo.offset
        self.offset = geo.offset.copy()
        self.offset[self.tiles] = self.local
        self.G = np.full(1 + int(count.sum()), missing, G.dtype)
        self.G[0] = outside
        keep = nodes > 0
        tile = np.searchsorted(geo.offset, nodes[keep] - 1, side="right") - 1
        inside = np.isin(tile, self.tiles)
        nodes, tile, G = nodes[keep][inside], tile[inside], G[keep][inside]
        self.G[1 + self.offset[tile] + (nodes - 1 - geo.offset[tile])] = G

    def to_global(self, n: np.ndarray) -> np.ndarray:
        """Global node ids of local ones (node 0 stays 0)."""
        if len(self.tiles) == len(self.global_offset):  # every tile: the local numbering is the global one
            return n
        k = np.searchsorted(self.local, n - 1, side="right") - 1
        return np.where(n > 0, 1 + self.global_offset[self.tiles[k]] + (n - 1 - self.local[k]), 0)
