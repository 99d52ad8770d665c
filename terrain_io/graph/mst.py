"""Minimum spanning forests of edge lists: Kruskal, Filter-Kruskal and Borůvka, on CPU or GPU.

After Hiti et al. 2022 (the Kruskal report; docs/ARCHITECTURE.md#references) (Kruskal with union-find and path
compression; Filter-Kruskal of Osipov, Sanders & Singler, ALENEX 2009: partition around a pivot,
recurse on the light part, *filter* the heavy part by the union-find, recurse on what is left) and
Borůvka for large sparse graphs on the GPU (in the manner of Vineet et al., HPG 2009).

Every method compares edges in one strict total order: (weight, smaller end, larger end, edge id).
The forest is then unique, and every method and device returns the same edge ids.

- CPU: ``filter_kruskal`` partitions the edge arrays in place (numba, Hoare partition in the
  strict order), filters each part against the union-find (path halving, union by size), sorts the
  small parts with NumPy's SIMD sort and scans them; ``kruskal`` is the same without the filter (a
  lazily sorted Kruskal that stops once the forest is complete); ``boruvka`` (numba) scans the
  remaining edges per round and contracts.
- GPU (CuPy, terrain_io/kernels/graph_mst.cu): ``boruvka`` sorts the edges once into the strict order
  (two stable radix sorts), then each round takes the lightest edge per component by atomicMin on
  its 32-bit position, hooks, pointer-jumps and compacts the crossing edges. ``kruskal`` and
  ``filter_kruskal`` follow the report's hybrid: sort, partition and filter kernels on the GPU,
  the union-find scan on the host.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba as nb
import numpy as np

from ..backend import device_of, is_cupy, kernel_source, to_host
from ..errors import InputError
from ..unionfind import find
from .io import EdgeList

METHODS = ("auto", "kruskal", "filter_kruskal", "boruvka")
_DENSE_DEGREE = 256  # GPU auto: Filter-Kruskal above this many edges per vertex


@dataclass
class SpanningForest:
    """Result of :func:`minimum_spanning_forest`: ``edges`` = ids (ascending) of the forest's edges
    in the input edge list (on the input's device), ``weight`` = their total, ``trees`` = number of
    trees (isolated vertices count as trees), ``n`` = vertices."""

    edges: object
    weight: float | int
    trees: int
    n: int


def minimum_spanning_forest(edges, n: int | None = None, method: str = "auto", device: str | None = None,
                            threshold: int | None = None) -> SpanningForest:
    """Minimum spanning forest of an undirected edge list.

    ``edges``: an :class:`EdgeList` or a tuple ``(u, v, w)`` of 1-D arrays (NumPy or CuPy; ``w``
    may be None = unit weights). ``n``: vertex count (default: largest id + 1). ``method``:
    ``auto`` (GPU: boruvka, or filter_kruskal past 256 edges per vertex; CPU: filter_kruskal),
    ``kruskal``, ``filter_kruskal`` or ``boruvka``.
    ``threshold``: Filter-Kruskal's size below which a part goes to plain Kruskal.
    Self-loops never enter the forest; parallel edges are fine.
    """
    if method not in METHODS:
        raise InputError(f"unknown MST method {method!r}: choose one of {', '.join(METHODS)}")
    if isinstance(edges, EdgeList):
        u, v, w = edges.u, edges.v, edges.w
        n = edges.n if n is None else n
    else:
        try:
            u, v, w = edges
        except (TypeError, ValueError):
            raise InputError("edges must be an EdgeList or a tuple (u, v, w)") from None
    device = device_of(u, v, device=device)
    if device == "gpu":
        import cupy as xp
    else:
        xp = np
    u, v, w, n = _normalize(xp.asarray(u), xp.asarray(v), None if w is None else xp.asarray(w), n, xp)
    if method == "auto":  # measured on an H100: Borůvka wins on sparse graphs, Filter-Kruskal on dense ones
        method = "boruvka" if device == "gpu" and len(u) <= _DENSE_DEGREE * max(n, 1) else "filter_kruskal"
    lo, hi = xp.minimum(u, v), xp.maximum(u, v)
    if device == "gpu":
        ids = _GPU[method](w, lo, hi, n, threshold)
        total = w[ids].sum().item() if len(ids) else w.dtype.type(0).item()
    else:
        ids = _CPU[method](w, lo, hi, n, threshold)
        total = w[ids].sum().item() if len(ids) else w.dtype.type(0).item()
    return SpanningForest(edges=ids, weight=total, trees=int(n - len(ids)), n=int(n))


def _normalize(u, v, w, n, xp):
    """Check ids and weights; ids int32 (int64 past 2^31 vertices), weights float64 or int64."""
    if u.ndim != 1 or u.shape != v.shape or (w is not None and w.shape != u.shape):
        raise InputError("edge arrays u, v, w must be 1-D of equal length")
    for name, x in (("u", u), ("v", v)):
        if x.dtype.kind not in "iu":
            raise InputError(f"vertex ids ({name}) must be integers, got {x.dtype}")
    m = len(u)
    if m and (int(u.min()) < 0 or int(v.min()) < 0):
        raise InputError("negative vertex id")
    top = max(int(u.max()), int(v.max())) + 1 if m else 0
    if n is None:
        n = top
    elif top > n:
        raise InputError(f"vertex id {top - 1} out of range for {n} vertices")
    idt = np.int32 if n < 2**31 else np.int64
    if w is None:
        w = xp.ones(m, np.int64)
    elif w.dtype.kind == "f":
        if bool(xp.isnan(w).any()):
            raise InputError("NaN edge weight")
        w = w.astype(np.float64) + 0.0  # +0.0 folds -0.0 into 0.0 for the order
    elif w.dtype.kind in "iub":
        w = w.astype(np.int64)
    else:
        raise InputError(f"edge weights must be numbers, got {w.dtype}")
    return u.astype(idt), v.astype(idt), w, int(n)


# --------------------------------------------------------------------------------------------
# CPU (numba): union-find, strict order, Filter-Kruskal, Borůvka
# --------------------------------------------------------------------------------------------

@nb.njit(inline="always")
def _less(w, lo, hi, ids, i, pw, plo, phi, pid):
    """Edge at position i before the pivot (pw, plo, phi, pid) in the strict order."""
    if w[i] != pw:
        return w[i] < pw
    if lo[i] != plo:
        return lo[i] < plo
    if hi[i] != phi:
        return hi[i] < phi
    return ids[i] < pid


@nb.njit(inline="always")
def _swap(w, lo, hi, ids, i, j):
    w[i], w[j] = w[j], w[i]
    lo[i], lo[j] = lo[j], lo[i]
    hi[i], hi[j] = hi[j], hi[i]
    ids[i], ids[j] = ids[j], ids[i]


@nb.njit(cache=True)
def _kruskal_scan(lo, hi, ids, l, r, parent, size, out, count):
    """Kruskal over positions l..r-1 (already in strict order): union-find, union by size."""
    for i in range(l, r):
        a, b = find(parent, lo[i]), find(parent, hi[i])
        if a != b:
            if size[a] < size[b]:
                a, b = b, a
            parent[b] = a
            size[a] += size[b]
            out[count] = ids[i]
            count += 1
    return count


@nb.njit(cache=True)
def _partition(w, lo, hi, ids, l, r):
    """Hoare partition of positions l..r-1 around a median-of-three pivot in the strict order;
    returns mid with [l, mid) <= pivot < [mid, r) (keys are distinct, so both parts are non-empty)."""
    a, b, c = l, (l + r) // 2, r - 1
    if _less(w, lo, hi, ids, b, w[a], lo[a], hi[a], ids[a]):
        a, b = b, a
    if _less(w, lo, hi, ids, c, w[b], lo[b], hi[b], ids[b]):
        b = c
        if _less(w, lo, hi, ids, b, w[a], lo[a], hi[a], ids[a]):
            b = a
    pw, plo, phi, pid = w[b], lo[b], hi[b], ids[b]
    i, j = l - 1, r
    while True:
        i += 1
        while _less(w, lo, hi, ids, i, pw, plo, phi, pid):
            i += 1
        j -= 1
        while not (w[j] == pw and lo[j] == plo and hi[j] == phi and ids[j] == pid) and \
                not _less(w, lo, hi, ids, j, pw, plo, phi, pid):
            j -= 1
        if i >= j:
            return j + 1
        _swap(w, lo, hi, ids, i, j)


@nb.njit(cache=True)
def _filter(w, lo, hi, ids, l, r, parent):
    """Filter-Kruskal's filter: keep (compacted to the front) the edges of l..r-1 whose ends lie in
    different trees; returns the new end."""
    j = l
    for i in range(l, r):
        if find(parent, lo[i]) != find(parent, hi[i]):
            if i != j:
                w[j], lo[j], hi[j], ids[j] = w[i], lo[i], hi[i], ids[i]
            j += 1
    return j


@nb.njit(cache=True)
def _boruvka_cpu(w, lo, hi, n):
    """Borůvka: per round every component takes its lightest edge (strict order), then contract."""
    m = len(w)
    comp = np.arange(n, dtype=np.int64)
    best = np.full(n, -1, dtype=np.int64)
    active = np.arange(m, dtype=np.int64)
    na = 0
    for e in range(m):
        if lo[e] != hi[e]:
            active[na] = e
            na += 1
    in_forest = np.zeros(m, dtype=np.bool_)
    while na > 0:
        for i in range(na):
            e = active[i]
            for c in (comp[lo[e]], comp[hi[e]]):
                b = best[c]
                if b < 0 or w[e] < w[b] or (w[e] == w[b] and (lo[e] < lo[b] or (lo[e] == lo[b] and (
                        hi[e] < hi[b] or (hi[e] == hi[b] and e < b))))):
                    best[c] = e
        parent = np.arange(n, dtype=np.int64)
        for c in range(n):
            e = best[c]
            if e < 0:
                continue
            in_forest[e] = True
            other = comp[lo[e]] if comp[lo[e]] != c else comp[hi[e]]
            if not (best[other] == e and c < other):
                parent[c] = other
        best[:] = -1
        for c in range(n):  # roots of the hook forest (its only cycles were the broken 2-cycles)
            r = c
            while parent[r] != r:
                r = parent[r]
            x = c
            while parent[x] != r and x != r:
                nx = parent[x]
                parent[x] = r
                x = nx
        for v in range(n):
            comp[v] = parent[comp[v]]
        k = 0
        for i in range(na):
            e = active[i]
            if comp[lo[e]] != comp[hi[e]]:
                active[k] = e
                k += 1
        na = k
    return np.flatnonzero(in_forest)


def _strict_argsort(w, lo, hi, ids, xp=np):
    """Positions that sort edges in the strict order: one fast sort by weight (SIMD quicksort in
    NumPy, radix sort in CuPy), a full lexicographic sort only when weights tie."""
    order = xp.argsort(w)
    sw = w[order]
    if len(sw) > 1 and bool((sw[1:] == sw[:-1]).any()):
        order = xp.lexsort(xp.stack([ids, hi, lo, w])) if xp is not np else np.lexsort((ids, hi, lo, w))
    return order


def _cpu_filter_kruskal(w, lo, hi, n, threshold, filtering=True):
    """Filter-Kruskal (Osipov et al.; the report's figure 1): parts above ``threshold`` edges are
    partitioned around a pivot (numba, in place), the light part first; every part is filtered
    against the union-find before use; small parts are sorted (NumPy) and scanned (Kruskal).
    Without filtering this is Kruskal over a lazily sorted edge list (it stops once the forest is
    complete)."""
    ids = np.flatnonzero(lo != hi)
    w, lo, hi = w[ids], lo[ids], hi[ids]
    leaf = threshold or max(1 << 16, n // 2)  # measured: n/2..n best on sparse graphs (2 cores)
    parent = np.arange(n, dtype=lo.dtype)
    size = np.ones(n, dtype=np.int64)
    out = np.empty(max(n - 1, 0), dtype=np.int64)
    count = 0
    parts = [(0, len(w))]
    while parts and count < n - 1:
        l, r = parts.pop()
        if filtering and count > 0:
            r = _filter(w, lo, hi, ids, l, r, parent)
        if r - l > leaf:
            mid = _partition(w, lo, hi, ids, l, r)
            parts += [(mid, r), (l, mid)]
            continue
        order = _strict_argsort(w[l:r], lo[l:r], hi[l:r], ids[l:r])
        count = _kruskal_scan(lo[l:r][order], hi[l:r][order], ids[l:r][order], 0, r - l, parent, size, out, count)
    return np.sort(out[:count])


def _cpu_kruskal(w, lo, hi, n, threshold):
    return _cpu_filter_kruskal(w, lo, hi, n, threshold, filtering=False)


def _cpu_boruvka(w, lo, hi, n, threshold):
    return _boruvka_cpu(w, lo, hi, n)


_CPU = {"kruskal": _cpu_kruskal, "filter_kruskal": _cpu_filter_kruskal, "boruvka": _cpu_boruvka}


@nb.njit(parallel=True, cache=True)
def _all_roots(parent):
    roots = np.empty(len(parent), dtype=np.int32)
    for v in nb.prange(len(parent)):
        x = np.int64(v)
        p = np.int64(parent[x])
        while p != x:
            x = p
            p = np.int64(parent[x])
        roots[v] = x
    return roots


# --------------------------------------------------------------------------------------------
# GPU (CuPy)
# --------------------------------------------------------------------------------------------

@functools.cache
def _module():
    import cupy

    src = kernel_source("graph_mst.cu")
    return cupy.RawModule(code=src, options=("-std=c++17",))


def _order_key(w):
    """Unsigned integers that sort like the weights (float64: sign-flip trick; int64: offset)."""
    import cupy

    bits = w.view(cupy.uint64)
    if w.dtype.kind == "f":
        return cupy.where(bits >> 63 != 0, ~bits, bits | cupy.uint64(1 << 63))
    return bits ^ cupy.uint64(1 << 63)


def _gpu_strict_order(w, lo, hi):
    """Positions that sort the edges by (weight, lo, hi, id): stable radix sorts (LSD), the
    (lo, hi) pass only when weights tie."""
    import cupy

    key = _order_key(w)
    order = cupy.argsort(key)  # stable: equal weights stay in id order
    sk = key[order]
    if len(sk) > 1 and bool((sk[1:] == sk[:-1]).any()):
        pair = (lo.astype(cupy.uint64) << cupy.uint64(32)) | hi.astype(cupy.uint64)
        order = cupy.argsort(pair)
        order = order[cupy.argsort(key[order])]
    return order


def _grid(m):
    return (max(1, min(-(-m // 256), 132 * 32)),)


def _gpu_boruvka(w, lo, hi, n, threshold):
    import cupy

    mod = _module()
    lightest, hook = mod.get_function("boruvka_lightest"), mod.get_function("boruvka_hook")
    jump, relabel, crossing = mod.get_function("pointer_jump"), mod.get_function("relabel"), mod.get_function("crossing")
    m = len(w)
    if m >= 2**32 - 1:
        raise InputError("GPU Borůvka handles fewer than 2^32 - 1 edges")
    order = _gpu_strict_order(w, lo, hi)
    su, sv = lo[order].astype(cupy.int32), hi[order].astype(cupy.int32)
    act = cupy.flatnonzero(su != sv).astype(cupy.uint32)
    comp = cupy.arange(n, dtype=cupy.int32)
    best = cupy.empty(n, dtype=cupy.uint32)
    in_forest = cupy.zeros(m, dtype=cupy.uint8)
    changed = cupy.zeros(1, dtype=cupy.int32)
    keep = cupy.empty(len(act), dtype=cupy.uint8)
    nb_ = (-(-n // 256),)
    while len(act):
        ma = np.int64(len(act))
        best.fill(0xFFFFFFFF)
        lightest(_grid(len(act)), (256,), (act, ma, su, sv, comp, best))
        parent = comp.copy()
        hook(nb_, (256,), (np.int32(n), su, sv, comp, best, parent, in_forest))
        while True:
            changed.fill(0)
            jump(nb_, (256,), (np.int32(n), parent, changed))
            if not int(changed.get()[0]):
                break
        relabel(nb_, (256,), (np.int32(n), comp, parent))
        crossing(_grid(len(act)), (256,), (act, ma, su, sv, comp, keep))
        act = act[keep[:len(act)].view(cupy.bool_)]
    return cupy.sort(order[cupy.flatnonzero(in_forest)])


def _gpu_filter_kruskal(w, lo, hi, n, threshold, filtering=True):
    """The report's hybrid: pivot partition and filter on the GPU, sort on the GPU, union-find
    scan on the host. Parts are split by weight only (ties stay together), which keeps the strict
    order: every edge of the light part precedes every edge of the heavy part."""
    import cupy

    filt = _module().get_function("filter_crossing")
    leaf = threshold or max(n, 1 << 20)
    parent = np.arange(n, dtype=np.int32)
    size = np.ones(n, dtype=np.int64)
    out = np.empty(max(n - 1, 0), dtype=np.int64)
    count = 0
    ids = cupy.flatnonzero(lo != hi)
    parts = [(w[ids], lo[ids].astype(cupy.int32), hi[ids].astype(cupy.int32), ids)]
    rng = np.random.default_rng(0)
    while parts and count < n - 1:
        pw, plo, phi, pid = parts.pop()
        if filtering and count > 0 and len(pw):
            root = cupy.asarray(_all_roots(parent))
            keep = cupy.empty(len(pw), dtype=cupy.uint8)
            filt(_grid(len(pw)), (256,), (np.int64(len(pw)), plo, phi, root, keep))
            k = keep.view(cupy.bool_)
            pw, plo, phi, pid = pw[k], plo[k], phi[k], pid[k]
        if len(pw) > leaf and filtering:
            pivot = cupy.median(pw[cupy.asarray(rng.integers(0, len(pw), 101))])
            light = pw <= pivot
            nl = int(light.sum())
            if 0 < nl < len(pw):
                heavy = ~light
                parts.append((pw[heavy], plo[heavy], phi[heavy], pid[heavy]))
                parts.append((pw[light], plo[light], phi[light], pid[light]))
                continue
        order = _gpu_strict_order(pw, plo, phi)
        slo, shi, sid = (to_host(x[order]) for x in (plo, phi, pid))
        count = _kruskal_scan(slo, shi, sid.astype(np.int64), 0, len(slo), parent, size, out, count)
    return cupy.asarray(np.sort(out[:count]))


def _gpu_kruskal(w, lo, hi, n, threshold):
    return _gpu_filter_kruskal(w, lo, hi, n, threshold, filtering=False)


_GPU = {"kruskal": _gpu_kruskal, "filter_kruskal": _gpu_filter_kruskal, "boruvka": _gpu_boruvka}


def forest_edges(edges: EdgeList, forest: SpanningForest) -> EdgeList:
    """The forest as an EdgeList (host arrays) on the same vertices, for writing or checking."""
    ids = to_host(forest.edges) if is_cupy(forest.edges) else np.asarray(forest.edges)
    u, v = to_host(edges.u)[ids], to_host(edges.v)[ids]
    w = to_host(edges.w)[ids] if edges.w is not None else None
    return EdgeList(u, v, w, edges.n)
