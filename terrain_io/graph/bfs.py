"""Breadth-first search: depths and parents from one source (NumPy + numba, or CuPy kernels).

``bfs(graph, source)`` returns ``(depth, parent)``: ``depth[v]`` = number of edges on a shortest
path from ``source`` (int32, -1 when unreachable), ``parent[v]`` = the vertex before ``v`` on one
such path (index dtype, -1 for the source and unreachable vertices). Parents are not unique; every
method returns a valid BFS tree (``depth[parent[v]] == depth[v] - 1`` and the edge exists).

Methods, after the BFS section of Padamata & Raveendran 2013 (docs/ARCHITECTURE.md#references):

- ``"naive"``: the project's baseline (BFSNaiveKernel): every level inspects every edge.
  O(depth * m) work.
- ``"frontier"``: linear work, level-synchronous: the frontier vertices' degrees are prefix-summed
  (cooperative allocation), each neighbour slot is gathered (binary search of its frontier vertex,
  as getNextFrontierBS; when the frontier's mean degree is 32 or more and its degrees are even, a
  warp per frontier vertex reads its neighbour list coalesced instead), and visited vertices and duplicates are filtered by claiming each vertex
  once (atomicCAS on its depth, which replaces the project's mask + scan culling) and compacted
  into the next frontier. On the CPU: the sequential FIFO-queue BFS (cpuBFS), which is the same
  linear-work traversal.
- ``"auto"``: ``"frontier"`` plus direction optimisation (Beamer, Asanovic, Patterson, SC'12) on
  undirected (symmetric) graphs: when the frontier's edges exceed 1/14 of the unexplored edges the
  step goes bottom-up (every unvisited vertex looks for any parent in the frontier and stops at
  the first), and back top-down once the frontier is below n/24 vertices. Directed graphs stay
  top-down (bottom-up steps need in-edges).

``directed=True`` (scipy's default) follows stored edges ``u -> v`` only; ``directed=False``
treats the graph as undirected (EdgeLists are stored both ways; matrices are symmetrised).
"""
from __future__ import annotations


import numpy as np
from numba import njit, prange

from ..backend import kernel_source
from ..errors import InputError
from ._csr import CSRGraph, result_device, to_csr

METHODS = ("auto", "frontier", "naive")
ALPHA, BETA = 14, 24   # Beamer et al.'s switching thresholds
WARP_DEGREE = 32       # GPU top-down: a warp per frontier vertex when their mean degree reaches this
                       # and no vertex has more than 4x the mean (skewed frontiers, e.g. R-MAT, would
                       # leave one warp with a huge list: slower there, benchmarks/RESULTS.md "BFS")


# ---------------------------------------------------------------------------------------------- CPU


@njit(cache=True)
def _cpu_bfs(indptr, indices, source, direction_opt, alpha, beta, depth, parent):
    """Level-synchronous BFS with a FIFO queue; bottom-up levels when ``direction_opt``.

    Returns (levels, bottom-up levels, edges inspected)."""
    n = indptr.shape[0] - 1
    m = indices.shape[0]
    queue = np.empty(n, dtype=indices.dtype)
    queue[0] = source
    depth[source] = 0
    lo, hi = 0, 1
    level = 0
    explored = 0
    bottom_up = False
    bu_levels = 0
    inspected = 0
    while hi > lo:
        m_f = 0
        for k in range(lo, hi):
            v = queue[k]
            m_f += indptr[v + 1] - indptr[v]
        if direction_opt:
            if not bottom_up and m_f * alpha > m - explored:
                bottom_up = True
            elif bottom_up and (hi - lo) * beta < n:
                bottom_up = False
        explored += m_f
        tail = hi
        if bottom_up:
            bu_levels += 1
            for v in range(n):
                if depth[v] == -1:
                    for e in range(indptr[v], indptr[v + 1]):
                        inspected += 1
                        w = indices[e]
                        if depth[w] == level:
                            depth[v] = level + 1
                            parent[v] = w
                            queue[tail] = v
                            tail += 1
                            break
        else:
            inspected += m_f
            for k in range(lo, hi):
                v = queue[k]
                for e in range(indptr[v], indptr[v + 1]):
                    w = indices[e]
                    if depth[w] == -1:
                        depth[w] = level + 1
                        parent[w] = v
                        queue[tail] = w
                        tail += 1
        lo, hi = hi, tail
        level += 1
    return level, bu_levels, inspected


@njit(cache=True, parallel=True)
def _cpu_naive_level(u, v, level, depth, parent):
    """One level of the every-edge baseline: each edge (a, b) from the level to an unvisited b
    claims b (a race between edges to b leaves one of them its parent); returns the claims."""
    changed = 0
    for e in prange(u.shape[0]):
        a, b = u[e], v[e]
        if depth[a] == level and depth[b] == -1:
            depth[b] = level + 1
            parent[b] = a
            changed += 1
    return changed


# ---------------------------------------------------------------------------------------------- GPU

_module = None


def _kernel(name, dtype):
    global _module
    import cupy

    if _module is None:
        names = [f"{k}<{t}>" for k in ("bfs_naive", "bfs_expand", "bfs_expand_warp", "bfs_bottom_up")
                 for t in ("int", "long long")]
        src = kernel_source("graph_bfs.cu")
        _module = cupy.RawModule(code=src, options=("-std=c++17",), name_expressions=names)
    t = "int" if np.dtype(dtype) == np.int32 else "long long"
    return _module.get_function(f"{name}<{t}>")


def _gpu_frontier(g: CSRGraph, source, direction_opt, depth, parent):
    import cupy as cp

    n, m = g.n, g.m
    it = g.indices.dtype.type
    bufs = [cp.empty(n, dtype=g.indices.dtype), cp.empty(n, dtype=g.indices.dtype)]
    frontier = cp.asarray([source], dtype=g.indices.dtype)
    count = cp.zeros(1, dtype=cp.uint64)
    level = bu_levels = 0
    explored = inspected = 0
    bottom_up = False
    indptr_lo, indptr_hi = g.indptr[:-1], g.indptr[1:]
    while len(frontier):
        f = len(frontier)
        deg = (indptr_hi[frontier] - indptr_lo[frontier]).astype(cp.int64)
        offs = cp.cumsum(deg)
        m_f = int(offs[-1])
        if direction_opt:
            if not bottom_up and m_f * ALPHA > m - explored:
                bottom_up = True
            elif bottom_up and f * BETA < n:
                bottom_up = False
        explored += m_f
        count.fill(0)
        nxt = bufs[level % 2]
        if bottom_up:
            bu_levels += 1
            _kernel("bfs_bottom_up", it)(((n + 255) // 256,), (256,),
                                         (g.indptr, g.indices, np.int64(n), depth, parent, np.int32(level),
                                          nxt, count))
        elif f >= 64 and m_f >= WARP_DEGREE * f and int(deg.max()) * f <= 4 * m_f:
            inspected += m_f
            blocks = int(min((32 * f + 255) // 256, 132 * 64))
            _kernel("bfs_expand_warp", it)((blocks,), (256,), (g.indptr, g.indices, frontier, np.int64(f), depth,
                                                               parent, np.int32(level), nxt, count))
        elif m_f:
            inspected += m_f
            _kernel("bfs_expand", it)(((m_f + 255) // 256,), (256,),
                                      (g.indptr, g.indices, frontier, offs, np.int64(f), np.int64(m_f), depth,
                                       parent, np.int32(level), nxt, count))
        frontier = nxt[:int(count.get()[0])]
        level += 1
    return level, bu_levels, inspected


def _gpu_naive(u, v, source, depth, parent):
    import cupy as cp

    flag = cp.zeros(1, dtype=cp.int32)
    level = 0
    m = len(u)
    blocks = int(min(max((m + 255) // 256, 1), 132 * 32))
    while True:
        flag.fill(0)
        if m:
            _kernel("bfs_naive", u.dtype)((blocks,), (256,), (u, v, np.int64(m), depth, parent, np.int32(level), flag))
        level += 1
        if not int(flag.get()[0]):
            return level


# ---------------------------------------------------------------------------------------------- API


def bfs(graph, source: int, *, method: str = "auto", directed: bool = True, device: str | None = None,
        return_info: bool = False):
    """Breadth-first search from ``source`` (module docstring).

    Parameters
    ----------
    graph : EdgeList, (indptr, indices), CSR graph or sparse matrix
        NumPy or CuPy.
    source : int
        The start vertex.
    method : {"auto", "frontier", "naive"}
        Direction-optimising frontier BFS (``auto``), top-down frontier only, or the every-edge
        baseline.
    directed : bool
        Follow edges u -> v only (as scipy.sparse.csgraph); False: both ways.
    device : {"cpu", "gpu"}, optional
        Default: the input's.
    return_info : bool
        Also return a dict: levels, bottom-up levels, adjacency entries inspected, method.

    Returns
    -------
    depth : 1-D array
        Edges from ``source``; -1 unreached.
    parent : 1-D array
        The vertex each was reached from; -1 at the source and unreached vertices.

    Examples
    --------
    >>> import numpy as np
    >>> from terrain_io.graph.io import EdgeList
    >>> cycle = EdgeList(np.array([0, 1, 2]), np.array([1, 2, 0]), None, 3)  # 0 -> 1 -> 2 -> 0
    >>> depth, parent = bfs(cycle, 1)
    >>> depth.tolist(), parent.tolist()
    ([2, 0, 1], [2, -1, 1])
    """
    if method not in METHODS:
        raise InputError(f"unknown BFS method {method!r}: choose one of {', '.join(METHODS)}")
    dev = result_device([graph], device)
    g = to_csr(graph, symmetric=not directed, device=dev)
    n = g.n
    if not 0 <= int(source) < n:
        raise InputError(f"source vertex {source} out of range for {n} vertices")
    source = int(source)
    xp = np if dev == "cpu" else __import__("cupy")
    depth = xp.full(n, -1, dtype=np.int32)
    parent = xp.full(n, -1, dtype=g.indices.dtype)
    direction_opt = method == "auto" and g.symmetric
    bu_levels = 0
    inspected = None
    if method == "naive":
        u, v = g.rows(), g.indices
        depth[source] = 0
        if dev == "cpu":
            level = 0
            while _cpu_naive_level(u, v, level, depth, parent):
                level += 1
            level += 1
        else:
            level = _gpu_naive(u, v, source, depth, parent)
        inspected = level * g.m
    elif dev == "cpu":
        level, bu_levels, inspected = _cpu_bfs(g.indptr, g.indices, source, direction_opt, ALPHA, BETA, depth, parent)
    else:
        depth[source] = 0
        level, bu_levels, inspected = _gpu_frontier(g, source, direction_opt, depth, parent)
    if return_info:
        return depth, parent, {"method": method, "levels": int(level), "bottom_up_levels": int(bu_levels),
                               "inspected": int(inspected), "direction_optimizing": bool(direction_opt)}
    return depth, parent
