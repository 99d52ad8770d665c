"""Connected components of undirected graphs (weak components of directed inputs).

``connected_components(graph)`` returns ``(n_components, labels)`` like
scipy.sparse.csgraph.connected_components, with one difference that makes results comparable
across backends and methods: ``labels[v]`` is the smallest vertex id of ``v``'s component (so the
labels are not 0..k-1; ``np.unique(labels, return_inverse=True)`` gives those).

Methods (both keep ``parent[x] <= x`` at all times, so the parent pointers never form a cycle and
the root of each final tree *is* the smallest id of its component: no relabelling pass):

- ``"sv"``: Shiloach-Vishkin hooking + pointer jumping, as in Yogaratnam 2010 (sec. 4.2.4, kernels
  SV1-SV5; docs/ARCHITECTURE.md#references): every round hooks, for each edge joining two different stars,
  the root with the
  larger label under the smaller label (conditional hooking), then short-cuts every tree to a
  star; rounds repeat until no edge hooks. Yogaratnam's (and Shiloach & Vishkin 1982's) extra
  "stagnant root" hooking step only
  serves the PRAM O(log n) round bound; hooking by label order alone also terminates (each round
  hooks at least the largest root adjacent to a smaller one) and took as few or fewer rounds on the
  Yogaratnam 2010's graph types (the round count is returned in ``info`` when ``return_info=True``).
- ``"union_find"`` (``"auto"``): asynchronous union-find. GPU: ECL-CC-style lock-free hooking by
  atomicCAS with path halving in one pass over the edges, then one compression pass
  (Jaiganesh & Burtscher, HPDC'18). CPU: the same in a sequential numba loop (union by smaller
  id, path halving), which on few cores beats any parallel variant.

Inputs: anything :func:`~terrain_io.graph._csr.edge_arrays` accepts (EdgeList, CSRGraph, scipy or
cupyx sparse matrices, ``(indptr, indices)``). Self-loops, duplicate edges and isolated vertices
are fine. Results come back on the input's device unless ``device=`` says otherwise.
"""
from __future__ import annotations


import numpy as np
from numba import njit, prange

from ..backend import kernel_source
from ..errors import InputError
from ..unionfind import find
from ._csr import edge_arrays, result_device

METHODS = ("auto", "union_find", "sv")


# ---------------------------------------------------------------------------------------------- CPU


@njit(cache=True)
def _cpu_union_find(u, v, parent):
    for e in range(u.shape[0]):
        a = find(parent, u[e])
        b = find(parent, v[e])
        if a < b:
            parent[b] = a
        elif b < a:
            parent[a] = b
    for i in range(parent.shape[0]):     # parent[i] <= i: ascending order compresses in one pass
        parent[i] = parent[parent[i]]


@njit(cache=True, parallel=True)
def _cpu_sv_hook(u, v, parent):
    changed = 0
    for e in prange(u.shape[0]):
        pu = parent[u[e]]
        pv = parent[v[e]]
        if pu != pv:
            hi = max(pu, pv)
            if parent[hi] == hi:
                parent[hi] = min(pu, pv)
                changed += 1
    return changed


@njit(cache=True, parallel=True)
def _cpu_compress(parent):
    for i in prange(parent.shape[0]):
        r = parent[i]
        while parent[r] != r:
            r = parent[r]
        parent[i] = r


# ---------------------------------------------------------------------------------------------- GPU

_module = None


def _kernel(name):
    global _module
    import cupy

    if _module is None:
        names = [f"{k}<{t}>" for k in ("sv_hook", "compress", "uf_hook") for t in ("int", "long long")]
        src = kernel_source("graph_components.cu")
        _module = cupy.RawModule(code=src, options=("-std=c++17",), name_expressions=names)
    return _module.get_function(name)


def _launch(name, dtype, count, args):
    t = "int" if np.dtype(dtype) == np.int32 else "long long"
    blocks = int(min(max((count + 255) // 256, 1), 132 * 32))
    _kernel(f"{name}<{t}>")((blocks,), (256,), args)


# ---------------------------------------------------------------------------------------------- API


def connected_components(graph, method: str = "auto", device: str | None = None, return_info: bool = False):
    """``(n_components, labels)`` of ``graph`` (module docstring); labels = smallest id per component.

    ``return_info=True`` adds a dict with the method used and the SV round count.
    """
    if method not in METHODS:
        raise InputError(f"unknown components method {method!r}: choose one of {', '.join(METHODS)}")
    dev = result_device([graph], device)
    u, v, n, dev = edge_arrays(graph, device=dev)
    xp = np if dev == "cpu" else __import__("cupy")
    parent = xp.arange(n, dtype=u.dtype)
    rounds = 0
    if method == "sv":
        while True:
            rounds += 1
            if dev == "cpu":
                changed = _cpu_sv_hook(u, v, parent)
                _cpu_compress(parent)
            else:
                flag = xp.zeros(1, dtype=xp.int32)
                _launch("sv_hook", u.dtype, len(u), (u, v, np.int64(len(u)), parent, flag))
                _launch("compress", u.dtype, n, (parent, np.int64(n)))
                changed = int(flag.get()[0])
            if not changed or len(u) == 0:
                break
    else:
        if dev == "cpu":
            _cpu_union_find(u, v, parent)
        else:
            _launch("uf_hook", u.dtype, len(u), (u, v, np.int64(len(u)), parent))
            _launch("compress", u.dtype, n, (parent, np.int64(n)))
    count = int(xp.count_nonzero(parent == xp.arange(n, dtype=parent.dtype)))
    if return_info:
        return count, parent, {"method": "union_find" if method == "auto" else method, "rounds": rounds}
    return count, parent
