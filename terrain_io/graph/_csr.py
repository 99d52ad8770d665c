"""Input normalisation for the general-graph algorithms: everything becomes a :class:`CSRGraph`.

Accepted graph inputs (``as_graph``):

- :class:`CSRGraph` (returned by :func:`to_csr` and the generators' ``.to_csr()`` helpers);
- :class:`~terrain_io.graph.io.EdgeList` (edges ``u[i] -> v[i]``, NumPy or CuPy arrays);
- a scipy.sparse or cupyx.scipy.sparse matrix (its stored entries are the edges; values ignored);
- a tuple ``(indptr, indices)`` of CSR arrays.

Index dtype: vertex ids, ranks, labels and parents are ``int32`` while the element count is below
``2**31`` (half the memory traffic of int64 on the GPU) and ``int64`` from there on
(:func:`index_dtype`); both paths share one kernel source.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import device_of, is_cupy, to_device
from ..errors import InputError
from .io import EdgeList

#: element counts at or above this use int64 indices (tests lower it to exercise the int64 path)
INT32_LIMIT = 2**31 - 1


def index_dtype(n: int):
    """``np.int32`` for fewer than 2**31 - 1 elements, else ``np.int64``."""
    return np.dtype(np.int32) if n < INT32_LIMIT else np.dtype(np.int64)


def xp_of(device: str):
    if device == "gpu":
        import cupy

        return cupy
    return np


@dataclass
class CSRGraph:
    """Adjacency in CSR form on one device: out-neighbours of ``v`` are ``indices[indptr[v]:indptr[v+1]]``.

    ``symmetric`` is True when every edge is stored in both directions (an undirected graph); the
    algorithms then use shortcuts that need it (bottom-up BFS steps). ``src`` optionally holds the
    source vertex of every stored edge (the COO row array), built on demand by :meth:`rows`.
    """

    indptr: object
    indices: object
    n: int
    symmetric: bool = False
    device: str = "cpu"
    _rows: object = None

    @property
    def m(self) -> int:
        """Number of stored (directed) edges."""
        return int(self.indices.shape[0])

    def rows(self):
        """Source vertex of every stored edge (length m), cached."""
        if self._rows is None:
            xp = xp_of(self.device)
            if xp is np:
                self._rows = np.repeat(np.arange(self.n, dtype=self.indices.dtype), np.diff(self.indptr))
            else:  # cupy.repeat takes no array of counts: find each edge's row by binary search
                edge = xp.arange(self.m, dtype=self.indptr.dtype)
                self._rows = (xp.searchsorted(self.indptr, edge, side="right") - 1).astype(self.indices.dtype)
        return self._rows

    def to(self, device: str) -> "CSRGraph":
        if device == self.device:
            return self
        return CSRGraph(to_device(self.indptr, device), to_device(self.indices, device), self.n,
                        self.symmetric, device)


def csr_from_edges(u, v, n: int, symmetric: bool = False, device: str | None = None) -> CSRGraph:
    """CSR of edges ``u -> v`` on ``n`` vertices; ``symmetric=True`` stores each edge both ways.

    Edges are sorted by (source, target) with one 64-bit key sort (skipped when the sources are
    already in order and ``symmetric`` is False). Duplicates and self-loops are
    kept: every algorithm here tolerates them.
    """
    device = device_of(u, v, device=device)
    xp = xp_of(device)
    u, v = to_device(u, device), to_device(v, device)
    if u.shape != v.shape or u.ndim != 1:
        raise InputError("edge arrays u and v must be 1-D of equal length")
    if symmetric:
        u, v = xp.concatenate([u, v]), xp.concatenate([v, u])
    idt = index_dtype(max(n, len(u)) + 1)
    if len(u):
        lo = min(int(u.min()), int(v.min()))
        hi = max(int(u.max()), int(v.max()))
        if lo < 0:
            raise InputError("negative vertex id in edge list")
        if hi >= n:
            raise InputError(f"vertex id {hi} out of range for {n} vertices")
    if not symmetric and (len(u) < 2 or bool(xp.all(u[1:] >= u[:-1]))):
        src, indices = u.astype(idt, copy=False), v.astype(idt, copy=False)   # already CSR order
    else:
        key = u.astype(np.int64) * n + v.astype(np.int64)
        key.sort()
        src = (key // n).astype(idt)
        indices = (key % n).astype(idt)
        del key
    counts = xp.bincount(src, minlength=n) if len(src) else xp.zeros(n, dtype=np.int64)
    indptr = xp.zeros(n + 1, dtype=np.int64 if idt == np.int64 else idt)
    indptr[1:] = xp.cumsum(counts)
    g = CSRGraph(indptr, indices, n, symmetric, device)
    g._rows = src
    return g


def to_csr(graph, n: int | None = None, symmetric: bool = False, device: str | None = None) -> CSRGraph:
    """Normalise any accepted graph input (module docstring) to a :class:`CSRGraph` on ``device``.

    ``symmetric=True`` asks for an undirected graph: EdgeList inputs are stored in both directions;
    matrix / CSR inputs are symmetrised (A + A^T pattern) unless already marked symmetric.
    """
    if isinstance(graph, CSRGraph):
        g = graph.to(device_of(graph.indptr, device=device))
        if symmetric and not g.symmetric:
            u, v = g.rows(), g.indices
            g = csr_from_edges(u, v, g.n, symmetric=True, device=g.device)
        return g
    if isinstance(graph, EdgeList):
        nn = graph.n if n is None else n
        return csr_from_edges(graph.u, graph.v, nn, symmetric=symmetric, device=device)
    if hasattr(graph, "tocsr") and hasattr(graph, "shape"):  # scipy / cupyx sparse matrix
        if graph.shape[0] != graph.shape[1]:
            raise InputError(f"adjacency matrix must be square, got shape {graph.shape}")
        mat = graph.tocsr()
        indptr, indices = mat.indptr, mat.indices
    elif isinstance(graph, tuple) and len(graph) == 2:
        indptr, indices = graph
    else:
        raise InputError(f"unsupported graph input {type(graph).__name__}: give a CSRGraph, EdgeList, "
                         "sparse matrix or (indptr, indices)")
    dev = device_of(indptr, indices, device=device)
    xp = xp_of(dev)
    indptr, indices = to_device(indptr, dev), to_device(indices, dev)
    nn = len(indptr) - 1
    if nn < 0:
        raise InputError("empty indptr")
    if len(indices):
        if int(indices.min()) < 0:
            raise InputError("negative vertex id in CSR indices")
        if int(indices.max()) >= nn:
            raise InputError(f"vertex id {int(indices.max())} out of range for {nn} vertices")
    if int(indptr[0]) != 0 or int(indptr[-1]) != len(indices) or bool(xp.any(xp.diff(indptr) < 0)):
        raise InputError("malformed CSR indptr")
    idt = index_dtype(max(nn, len(indices)) + 1)
    g = CSRGraph(indptr.astype(np.int64 if idt == np.int64 else idt, copy=False),
                 indices.astype(idt, copy=False), nn, False, dev)
    if symmetric:
        g = csr_from_edges(g.rows(), g.indices, nn, symmetric=True, device=dev)
    return g


def edge_arrays(graph, device: str | None = None):
    """``(u, v, n, device)`` edge arrays of any accepted input, without building a CSR when not needed."""
    if isinstance(graph, EdgeList):
        dev = device_of(graph.u, graph.v, device=device)
        u, v = to_device(graph.u, dev), to_device(graph.v, dev)
        n = graph.n
        if len(u):
            if min(int(u.min()), int(v.min())) < 0:
                raise InputError("negative vertex id in edge list")
            if max(int(u.max()), int(v.max())) >= n:
                raise InputError(f"vertex id {max(int(u.max()), int(v.max()))} out of range for {n} vertices")
        idt = index_dtype(max(n, len(u)) + 1)
        return u.astype(idt, copy=False), v.astype(idt, copy=False), n, dev
    g = to_csr(graph, device=device)
    return g.rows(), g.indices, g.n, g.device


def result_device(inputs, device: str | None) -> str:
    """Device of the computation: ``device`` when given, else the inputs' device."""
    arrays = []
    for x in inputs:
        if isinstance(x, CSRGraph):
            arrays.append(x.indptr)
        elif isinstance(x, EdgeList):
            arrays.append(x.u)
        elif hasattr(x, "tocsr"):
            arrays.append(x.indptr if hasattr(x, "indptr") else getattr(x, "row", np.empty(0)))
        elif isinstance(x, tuple):
            arrays.extend(x)
        else:
            arrays.append(x)
    return device_of(*arrays, device=device)


__all__ = ["CSRGraph", "to_csr", "csr_from_edges", "edge_arrays", "index_dtype", "is_cupy"]
