"""Seeded generators of linked lists and graphs for tests and benchmarks, on NumPy or CuPy.

Lists come back as successor arrays (``succ[i]`` = next element, ``-1`` at a tail); graphs as
:class:`~terrain_io.graph.io.EdgeList` (``u``, ``v``, ``n``; ``w`` is None). Arrays use
:func:`~terrain_io.graph._csr.index_dtype`. The same seed gives the same output on one device;
NumPy and CuPy draw different streams.

Graph families follow the sources in docs/ARCHITECTURE.md#general-graphs:
- ``list_graph`` / ``kary_tree`` / ``random_graph``: the list, tree and random graphs
  of Yogaratnam 2010, sec. 6.2 (docs/ARCHITECTURE.md#references);
- ``bfs_project_graph``: the BFS project's partially random adjacency matrix with density,
  degree cap, self-loops and guaranteed reachability (Padamata & Raveendran 2013, "initGraph");
- ``rmat``: R-MAT with the Graph500 parameters (a, b, c) = (0.57, 0.19, 0.19), edge factor 16,
  randomly permuted vertex labels;
- ``grid_2d``: 4- or 8-neighbour grid graphs.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import resolve_device
from ..errors import InputError
from ._csr import index_dtype, xp_of
from .io import EdgeList


class _Rng:
    """One seeded stream with the few draws the generators need, on either backend."""

    def __init__(self, seed: int, device: str):
        self.device = device
        if device == "gpu":
            import cupy

            self.xp = cupy
            self.rs = cupy.random.RandomState(seed)
        else:
            self.xp = np
            self.rs = np.random.default_rng(seed)

    def random(self, n: int, dtype=np.float64):
        if self.device == "gpu":
            return self.rs.random_sample(n, dtype=dtype)
        return self.rs.random(n, dtype=dtype)

    def integers(self, high: int, n: int, dtype):
        if self.device == "gpu":
            return self.rs.randint(0, high, size=n, dtype=np.int64).astype(dtype)
        return self.rs.integers(0, high, size=n, dtype=np.int64).astype(dtype)

    def permutation(self, n: int, dtype):
        if self.device == "gpu":
            return self.xp.argsort(self.rs.random_sample(n, dtype=np.float64)).astype(dtype)
        return self.rs.permutation(n).astype(dtype)

    def choice(self, high: int, k: int):
        """``k`` distinct sorted integers from ``1 .. high-1`` (k < high), drawn on the host."""
        if k <= 0:
            return np.empty(0, np.int64)
        rng = np.random.default_rng(int(self.random(1)[0] * 2**62))
        return np.sort(rng.choice(high - 1, size=k, replace=False)) + 1


def _setup(n: int, seed: int, device: str):
    if n < 0:
        raise InputError(f"size must be non-negative, got {n}")
    device = resolve_device(device)
    return _Rng(seed, device), xp_of(device), index_dtype(n + 1)


def _order(n: int, ordered: bool, rng: _Rng, xp, idt):
    return xp.arange(n, dtype=idt) if ordered else rng.permutation(n, idt)


def _cuts(n: int, pieces: int, rng: _Rng):
    """Start positions (ascending, first 0) of ``pieces`` non-empty runs of ``0 .. n-1``."""
    if not 1 <= pieces <= max(n, 1):
        raise InputError(f"cannot cut {n} elements into {pieces} non-empty lists")
    return np.concatenate([[0], rng.choice(n, pieces - 1)]).astype(np.int64)


def random_list(n: int, n_lists: int = 1, *, seed: int = 0, ordered: bool = False, device: str = "cpu"):
    """Successor array of ``n_lists`` linked lists covering ``0 .. n-1`` (``-1`` marks each tail).

    Random lists visit the elements in a random permutation (the paper's "random list", figure 1b);
    ``ordered=True`` gives ``succ[i] = i + 1`` inside each list (figure 1a).
    """
    rng, xp, idt = _setup(n, seed, device)
    order = _order(n, ordered, rng, xp, idt)
    succ = xp.empty(n, dtype=idt)
    if n == 0:
        return succ
    succ[order[:-1]] = order[1:]
    ends = _cuts(n, n_lists, rng)[1:] - 1
    succ[order[xp.asarray(np.append(ends, n - 1))]] = -1
    return succ


def ordered_list(n: int, n_lists: int = 1, *, seed: int = 0, device: str = "cpu"):
    """``random_list(..., ordered=True)``: element ``i`` is followed by ``i + 1``."""
    return random_list(n, n_lists, seed=seed, ordered=True, device=device)


def list_graph(n: int, n_lists: int = 1, *, seed: int = 0, device: str = "cpu") -> EdgeList:
    """Undirected graph of ``n_lists`` random paths over ``n`` vertices (``n - n_lists`` edges)."""
    rng, xp, idt = _setup(n, seed, device)
    order = rng.permutation(n, idt)
    keep = xp.ones(max(n - 1, 0), dtype=bool)
    if n:
        keep[xp.asarray(_cuts(n, n_lists, rng)[1:] - 1)] = False
    return EdgeList(order[:-1][keep], order[1:][keep], None, n)


def kary_tree(n: int, k: int = 2, n_trees: int = 1, *, seed: int = 0, device: str = "cpu") -> EdgeList:
    """``n_trees`` complete ``k``-ary trees over ``n`` randomly labelled vertices (edges child-parent)."""
    if k < 1:
        raise InputError(f"tree degree k must be >= 1, got {k}")
    rng, xp, idt = _setup(n, seed, device)
    order = rng.permutation(n, idt)
    starts = _cuts(n, n_trees, rng) if n else np.zeros(1, np.int64)
    pos = xp.arange(n, dtype=np.int64)
    start_of = xp.asarray(starts)[xp.searchsorted(xp.asarray(starts), pos, side="right") - 1]
    local = pos - start_of
    child = local > 0
    parent_pos = start_of + (local - 1) // k
    return EdgeList(order[child], order[parent_pos[child]], None, n)


def random_graph(n: int, m: int | None = None, *, density: float | None = None, seed: int = 0,
                 device: str = "cpu") -> EdgeList:
    """Uniform random graph: ``m`` edges with independent uniform endpoints (self-loops and
    duplicates possible, as in Yogaratnam 2010's generator). ``density`` instead of ``m``: its
    edge density, ``m = 2 * density * n**2`` (its ``n = sqrt(m / (2 delta))``)."""
    if (m is None) == (density is None):
        raise InputError("give exactly one of m and density")
    if m is None:
        m = int(round(2 * density * n * n))
    if n == 0 and m:
        raise InputError("edges need at least one vertex")
    rng, xp, idt = _setup(max(n, m), seed, device)
    return EdgeList(rng.integers(n, m, idt), rng.integers(n, m, idt), None, n)


def thesis_graph_vertices(m: int, density: float) -> int:
    """Vertex count of Yogaratnam 2010's random graph with ``m`` edges: ``sqrt(m / (2 delta))``."""
    return max(1, int(round(math.sqrt(m / (2 * density)))))


def rmat(scale: int, edge_factor: int = 16, *, a: float = 0.57, b: float = 0.19, c: float = 0.19,
         seed: int = 0, permute: bool = True, device: str = "cpu") -> EdgeList:
    """R-MAT graph (Chakrabarti et al.) with ``2**scale`` vertices and ``edge_factor * 2**scale`` edges.

    Each edge picks one quadrant of the adjacency matrix per bit level with probabilities
    a, b, c, d = 1 - a - b - c (Graph500 defaults); vertex labels are then randomly permuted so
    that high degree does not correlate with small ids (Graph500 kernel-1 input).
    """
    if not 0 <= scale <= 40:
        raise InputError(f"R-MAT scale must be in 0..40, got {scale}")
    if min(a, b, c) < 0 or a + b + c > 1:
        raise InputError("R-MAT probabilities must be non-negative with a + b + c <= 1")
    n, m = 1 << scale, edge_factor << scale
    rng, xp, idt = _setup(max(n, m), seed, device)
    u = xp.zeros(m, dtype=idt)
    v = xp.zeros(m, dtype=idt)
    for level in range(scale):
        r = rng.random(m, np.float32)
        down = r >= a + b                      # lower half: quadrants c, d
        right = ((r >= a) & ~down) | (r >= a + b + c)  # right half: quadrants b, d
        u |= down.astype(idt) << level
        v |= right.astype(idt) << level
        del r, down, right
    if permute:
        perm = rng.permutation(n, idt)
        u, v = perm[u], perm[v]
    return EdgeList(u, v, None, n)


def grid_2d(rows: int, cols: int, *, diagonals: bool = False, device: str = "cpu") -> EdgeList:
    """Grid graph of ``rows x cols`` vertices (id = row * cols + col), 4- or 8-neighbour edges."""
    if rows < 0 or cols < 0:
        raise InputError("grid dimensions must be non-negative")
    device = resolve_device(device)
    xp = xp_of(device)
    n = rows * cols
    idt = index_dtype(n + 1)
    ids = xp.arange(n, dtype=idt).reshape(rows, cols)
    pairs = [(ids[:, :-1], ids[:, 1:]), (ids[:-1, :], ids[1:, :])]
    if diagonals:
        pairs += [(ids[:-1, :-1], ids[1:, 1:]), (ids[:-1, 1:], ids[1:, :-1])]
    u = xp.concatenate([p.ravel() for p, _ in pairs])
    v = xp.concatenate([q.ravel() for _, q in pairs])
    return EdgeList(u, v, None, n)


def bfs_project_graph(n: int, *, density: float = 0.25, max_degree: float = 1.0, seed: int = 0,
                      device: str = "cpu", rows_per_chunk: int | None = None) -> EdgeList:
    """Directed graph of the BFS project's ``initGraph`` (Padamata & Raveendran 2013, "Breadth First Search").

    Every entry ``(i, j)`` of the adjacency matrix is 1 with probability ``density``; self-edges
    ``(i, i)`` are set; each row keeps at most ``max_degree * n`` random entries (the first ones,
    in column order: the project's culling) plus its self-edge and cycle edge; a random Hamiltonian cycle is added so that every vertex
    is reachable from every other ("ensures that the graph is connected"). Edges are sorted by
    source, so ``u`` is already CSR order.
    """
    if not 0 <= density <= 1 or not 0 < max_degree <= 1:
        raise InputError("density must be in [0, 1] and max_degree in (0, 1]")
    rng, xp, idt = _setup(n * n + n, seed, device)
    cap = max(1, int(max_degree * n))
    cycle = rng.permutation(n, idt)
    nxt = xp.empty(n, dtype=idt)
    if n:
        nxt[cycle] = xp.roll(cycle, -1)
    chunk = rows_per_chunk or max(1, (1 << 26) // max(n, 1))
    us, vs = [], []
    cols = xp.arange(n, dtype=idt)
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        a = rng.random((r1 - r0) * n, np.float32).reshape(r1 - r0, n) < density
        rows = xp.arange(r0, r1)
        a[rows - r0, rows] = True                    # self-edges
        a[rows - r0, nxt[r0:r1]] = True              # reachability cycle
        if cap < n:
            a &= xp.cumsum(a, axis=1, dtype=np.int32) <= cap
            a[rows - r0, rows] = True                # self-edge and cycle edge survive the cap
            a[rows - r0, nxt[r0:r1]] = True
        i, j = xp.nonzero(a)
        us.append((i + r0).astype(idt))
        vs.append(cols[j])
        del a
    if not us:
        return EdgeList(xp.empty(0, idt), xp.empty(0, idt), None, n)
    return EdgeList(xp.concatenate(us), xp.concatenate(vs), None, n)
