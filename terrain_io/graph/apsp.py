"""All-pairs shortest paths on dense weight matrices, on NumPy (numba) or CuPy arrays.

Three algorithms from Padamata & Raveendran 2013 (after Cormen et al. 2009, ch. 25; docs/ARCHITECTURE.md#references):

- ``minplus``: repeated squaring of the min-plus product L(2m) = L(m) (x) L(m) ("FAST-ALL-PAIRS-
  SHORTEST-PATHS"), stopping early once a squaring changes nothing; Theta(n^3 log n) at worst.
- ``floyd_warshall``: one pass (one GPU kernel) per intermediate vertex k; Theta(n^3).
- ``blocked``: the three-phase tiled Floyd-Warshall of Venkataraman, Sahni & Mukhopadhyaya (2003):
  for each diagonal tile, (1) Floyd-Warshall inside it, (2) its row and column panels, (3) every
  other tile. On the GPU phases 2 and 3 are min-plus products (the panel closure is D* (x) panel),
  run by the same register-tiled kernel as :func:`minplus` (terrain_io/kernels/graph_apsp.cu; integer
  weights use Hopper's DPX ``__viaddmin_s32``).

Conventions: ``W[i, j]`` is the weight of the edge i -> j, ``inf`` (for integer matrices the dtype's
maximum) means no edge; the diagonal counts as 0 unless it is negative (a negative self-loop is a
negative cycle). Negative edges are allowed; a negative cycle raises :class:`NegativeCycleError`.
Distances come back in the input's dtype (int32 stays int32, its maximum = unreachable) on the
input's device; :func:`as_float_distances` gives them as float64 with ``inf`` = unreachable, the
convention of every written result (``terrain graph apsp -o``) and of scipy.sparse.csgraph.
``pred[i, j]`` is the vertex before j on a shortest path from i (-1: none).
"""
from __future__ import annotations

import functools

import numba as nb
import numpy as np

from ..backend import device_of, is_cupy, kernel_source, to_device
from ..errors import InputError
from ..memory import available_memory, format_bytes

METHODS = ("auto", "minplus", "floyd_warshall", "blocked")
# Saturating infinity for integer matrices (also in kernels/graph_apsp.cu): a + b stays inside int32.
INT_INF = 2**30 - 1
_INT_LIMIT = 2**28  # n * max|w| must stay below this, so that INT_INF minus any path is still "no path"


class NegativeCycleError(InputError):
    """The graph has a negative cycle: shortest distances are undefined. ``vertices``: some on it."""

    def __init__(self, vertices):
        self.vertices = np.asarray(vertices)
        shown = ", ".join(str(v) for v in self.vertices[:10]) + (" ..." if len(self.vertices) > 10 else "")
        super().__init__(f"negative cycle through vertex {shown}: shortest paths are undefined")


# --------------------------------------------------------------------------------------------
# Input preparation (device-agnostic: xp is numpy or cupy)
# --------------------------------------------------------------------------------------------

def _working_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype in (np.float32, np.float64, np.int32):
        return dtype
    if dtype.kind == "f":
        return np.dtype(np.float64)
    if dtype.kind in "iub":
        return np.dtype(np.int32)
    raise InputError(f"weights must be numbers, got {dtype}")


def _to_internal(M, xp, dtype, where: str):
    """Copy ``M`` in the working dtype with integer 'no edge' mapped to INT_INF; checks NaN and range."""
    src = M
    if src.dtype.kind == "f" and bool(xp.isnan(src).any()):
        raise InputError(f"{where}: NaN weight")
    if dtype.kind == "f":
        return src.astype(dtype, copy=True)
    if src.dtype.kind == "f":
        raise InputError(f"{where}: float weights for an integer computation")
    none = np.iinfo(src.dtype).max if src.dtype.kind in "iu" else None
    big = src == none if none is not None else xp.zeros(src.shape, bool)
    finite = xp.where(big, 0, src).astype(np.int64)
    top = int(xp.abs(finite).max()) if finite.size else 0
    if top * max(src.shape) >= _INT_LIMIT:
        raise InputError(f"{where}: integer weights too large for int32 path sums (|w| up to {top}); "
                         "pass a float64 matrix")
    return xp.where(big, INT_INF, finite).astype(np.int32)


def _from_internal(D, dtype, xp):
    if dtype.kind == "f":
        return D
    return xp.where(D >= INT_INF // 2, np.iinfo(np.int32).max, D).astype(np.int32)


def _prepare(W, device):
    """Validate ``W`` and return (xp, device, D working copy, original dtype)."""
    device = device_of(W, device=device)
    W = to_device(W, device)
    xp = np if device == "cpu" else __import__("cupy")
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise InputError(f"weight matrix must be square, got shape {tuple(W.shape)}")
    dtype = _working_dtype(W.dtype)
    D = _to_internal(W, xp, dtype, "weight matrix")
    n = D.shape[0]
    diag = xp.arange(n)
    D[diag, diag] = xp.minimum(D[diag, diag], 0)
    return xp, device, D, dtype


def _initial_predecessors(D, xp):
    n = D.shape[0]
    inf = INT_INF if D.dtype.kind == "i" else np.inf
    P = xp.where(D < inf, xp.arange(n, dtype=np.int32)[:, None], -1).astype(np.int32)
    P[xp.arange(n), xp.arange(n)] = -1
    return P


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def apsp(W, method: str = "auto", return_predecessors: bool = False, device: str | None = None,
         tile: int | None = None):
    """All-pairs shortest distances of the dense weight matrix ``W`` (n x n).

    ``method``: ``auto`` (blocked), ``minplus``, ``floyd_warshall`` or ``blocked``; ``tile``: the
    blocked method's tile size (default: tuned by size and device). Returns ``D`` or ``(D, pred)``
    with ``return_predecessors``. Raises NegativeCycleError, InputError (non-square, NaN, ...).
    """
    if method not in METHODS:
        raise InputError(f"unknown APSP method {method!r}: choose one of {', '.join(METHODS)}")
    xp, device, D, dtype = _prepare(W, device)
    n = D.shape[0]
    P = _initial_predecessors(D, xp) if return_predecessors else None
    if method == "auto":
        method = "blocked"
    if n:
        run = (_GPU if device == "gpu" else _CPU)[method]
        D, P = run(D, P, tile)
        diag = xp.diagonal(D)
        if bool((diag < 0).any()):
            raise NegativeCycleError(np.flatnonzero(to_device(diag < 0, "cpu")))
    D = _from_internal(D, dtype, xp)
    return (D, P) if return_predecessors else D


def minplus(A, B, device: str | None = None):
    """Min-plus product ``C[i, j] = min_k A[i, k] + B[k, j]`` (A: m x k, B: k x n; inf = no path).

    Both inputs in one dtype family; integer inputs use the dtype's maximum as infinity and give
    int32. The terrain SSSP index composes boundary-distance matrices with it.
    """
    device = device_of(A, B, device=device)
    A, B = to_device(A, device), to_device(B, device)
    xp = np if device == "cpu" else __import__("cupy")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise InputError(f"min-plus product of shapes {tuple(A.shape)} and {tuple(B.shape)}: inner sizes differ")
    dtype = _working_dtype(np.promote_types(A.dtype, B.dtype))
    Ai, Bi = _to_internal(A, xp, dtype, "matrix A"), _to_internal(B, xp, dtype, "matrix B")
    inf = INT_INF if dtype.kind == "i" else np.inf
    C = xp.full((A.shape[0], B.shape[1]), inf, dtype=dtype)
    if A.shape[1]:
        (_gpu_minplus_update if device == "gpu" else _cpu_minplus_update)(C, Ai, Bi)
    return _from_internal(C, dtype, xp)


def reconstruct_path(pred, i: int, j: int) -> list[int]:
    """Vertices of the shortest path i -> j from a predecessor matrix ([] if j is unreachable)."""
    pred = pred.get() if is_cupy(pred) else np.asarray(pred)
    n = pred.shape[0]
    if not (0 <= i < n and 0 <= j < n):
        raise InputError(f"vertex out of range for {n} vertices")
    if i == j:
        return [i]
    path = [j]
    while path[-1] != i:
        p = int(pred[i, path[-1]])
        if p < 0 or len(path) > n:
            return [] if len(path) == 1 else _broken(i, j)
        path.append(p)
    return path[::-1]


def as_float_distances(D):
    """``D`` as :func:`apsp` returns it, in the one convention of written results: float64 with
    ``inf`` for unreachable pairs (an integer result's dtype maximum), as scipy.sparse.csgraph
    returns them. Integer distances are exact in float64 (|d| < 2**28, see ``_INT_LIMIT``)."""
    if D.dtype.kind == "f":
        return D.astype(np.float64, copy=False)
    out = D.astype(np.float64)
    out[D == np.iinfo(D.dtype).max] = np.inf
    return out


def _broken(i, j):
    raise InputError(f"predecessor matrix holds no consistent path {i} -> {j}")


def dense_from_edges(u, v, w, n: int, directed: bool = True, dtype=None):
    """Dense weight matrix of an edge list (parallel edges: the lightest; no edge: inf / int max).

    ``dtype`` None: int32 for integer weights whose path sums fit (unit weights when ``w`` is None),
    else float64."""
    u, v = np.asarray(u, np.int64), np.asarray(v, np.int64)
    w = np.ones(len(u), np.int32) if w is None else np.asarray(w)
    if dtype is None:
        small = w.dtype.kind in "iub" and (not len(w) or int(np.abs(w).max()) * max(n, 1) < _INT_LIMIT)
        dtype = np.int32 if small else np.float64
    dtype = np.dtype(dtype)
    need = 3 * n * n * dtype.itemsize  # matrix, working copy, result
    if need > available_memory():
        raise InputError(f"{n} vertices: a dense APSP needs about {format_bytes(need)}, more than the "
                         f"{format_bytes(available_memory())} of free memory")
    none = np.inf if dtype.kind == "f" else np.iinfo(dtype).max
    W = np.full((n, n), none, dtype=dtype)
    if not directed:
        u, v, w = np.concatenate([u, v]), np.concatenate([v, u]), np.concatenate([w, w])
    np.minimum.at(W, (u, v), w.astype(dtype))
    return W


# --------------------------------------------------------------------------------------------
# CPU kernels (numba). Each step reads rows/columns that the step itself does not change, so the
# row loops run in parallel without races.
# --------------------------------------------------------------------------------------------

@nb.njit(parallel=True, cache=True)
def _cpu_minplus_kernel(C, A, B, PC, PB, pred):
    """C = min(C, A (x) B). Without predecessors: tasks of 32 rows, each sweeping 128 x 512 blocks of
    B (L2-resident) with vectorized row updates, one parallel region; with predecessors row by row."""
    m, kk = A.shape
    nn = C.shape[1]
    if pred:
        for i in nb.prange(m):
            for k in range(kk):
                _relax_row(C, PC, B, PB, pred, i, k, A[i, k], 0, nn)
        return
    for ib in nb.prange((m + 31) // 32):  # 32 rows per task share each block of B
        for j0 in range(0, nn, 512):
            for k0 in range(0, kk, 128):
                for i in range(ib * 32, min(m, ib * 32 + 32)):
                    _relax_rows(C, i, A[i], k0, B, k0, min(kk, k0 + 128), j0, min(nn, j0 + 512))


def _cpu_minplus_update(C, A, B, PC=None, PB=None):
    """C = min(C, A (x) B) in place (with predecessors PC[i, j] = PB[k*, j])."""
    dummy = np.zeros((1, 1), np.int32)
    _cpu_minplus_kernel(C, A, B, dummy if PC is None else PC, dummy if PB is None else PB, PC is not None)


@nb.njit(parallel=True, cache=True)
def _cpu_fw_kernel(D, P, pred):
    """Plain Floyd-Warshall: one parallel pass over the rows per k (row k does not change in step k)."""
    n = D.shape[0]
    for k in range(n):
        for i in nb.prange(n):
            _relax_row(D, P, D, P, pred, i, k, D[i, k], 0, n)


@nb.njit(cache=True)
def _relax_row(D, P, S, PS, pred, i, k, a, lo, hi):
    """D[i, lo:hi] = min(D[i, lo:hi], a + S[k, lo:hi]) (predecessors from PS); the branch-free form
    without predecessors vectorizes."""
    if pred:
        for j in range(lo, hi):
            s = a + S[k, j]
            if s < D[i, j]:
                D[i, j] = s
                P[i, j] = PS[k, j]
    else:
        for j in range(lo, hi):
            D[i, j] = min(D[i, j], a + S[k, j])


@nb.njit(cache=True, fastmath={"nnan", "nsz"})
def _relax_rows(D, i, arow, acol, S, s0, s1, lo, hi):
    """D[i, lo:hi] = min(D[i, lo:hi], min over t of arow[acol + t] + S[s0 + t, lo:hi]), t < s1 - s0.

    Works on a private copy of the row segment (so the compiler sees no aliasing and vectorizes,
    about 7x a direct in-place loop) and folds four source rows per sweep; the a-values are read
    before the row is written back, so the result is the plain min-plus product of the old row."""
    if hi <= lo:
        return
    row = D[i, lo:hi].copy()
    m = hi - lo
    k = s0
    while k + 4 <= s1:
        c = acol + k - s0
        a0, a1, a2, a3 = arow[c], arow[c + 1], arow[c + 2], arow[c + 3]
        r0, r1, r2, r3 = S[k, lo:hi], S[k + 1, lo:hi], S[k + 2, lo:hi], S[k + 3, lo:hi]
        for j in range(m):
            row[j] = min(row[j], min(min(a0 + r0[j], a1 + r1[j]), min(a2 + r2[j], a3 + r3[j])))
        k += 4
    while k < s1:
        a0 = arow[acol + k - s0]
        r0 = S[k, lo:hi]
        for j in range(m):
            row[j] = min(row[j], a0 + r0[j])
        k += 1
    D[i, lo:hi] = row


@nb.njit(parallel=True, cache=True, fastmath={"nnan", "nsz"})
def _cpu_blocked_round(D, P, pred, k0, k1):
    """One diagonal tile k0..k1-1 of blocked Floyd-Warshall, with two parallel passes (two barriers):
    (1) Floyd-Warshall inside the tile (small, sequential); (2) the tile's row panel = D* (x) panel,
    reading a copy of the panel; (3) every other row: its column-panel part = row (x) D*, then the
    rest = column panel (x) row panel. Without predecessors the passes use :func:`_relax_rows`."""
    n = D.shape[0]
    for k in range(k0, k1):
        for i in range(k0, k1):
            _relax_row(D, P, D, P, pred, i, k, D[i, k], k0, k1)
    R = D[k0:k1, :].copy()
    PR = P[k0:k1, :].copy() if pred else P
    for i in nb.prange(k0, k1):
        if pred:
            for k in range(k0, k1):
                a = D[i, k]
                _relax_row(D, P, R, PR, pred, i, k - k0, a, 0, k0)
                _relax_row(D, P, R, PR, pred, i, k - k0, a, k1, n)
        else:
            _relax_rows(D, i, D[i], k0, R, 0, k1 - k0, 0, k0)
            _relax_rows(D, i, D[i], k0, R, 0, k1 - k0, k1, n)
    for i in nb.prange(n):
        if k0 <= i < k1:
            continue
        if pred:
            for k in range(k0, k1):
                _relax_row(D, P, D, P, pred, i, k, D[i, k], k0, k1)
            for k in range(k0, k1):
                a = D[i, k]
                _relax_row(D, P, D, P, pred, i, k, a, 0, k0)
                _relax_row(D, P, D, P, pred, i, k, a, k1, n)
        else:
            _relax_rows(D, i, D[i], k0, D, k0, k1, k0, k1)
            _relax_rows(D, i, D[i], k0, D, k0, k1, 0, k0)
            _relax_rows(D, i, D[i], k0, D, k0, k1, k1, n)


def _cpu_tile(n: int) -> int:
    """128 (measured best on 2 cores at n = 1024..2048 for float32 and float64), smaller for tiny n."""
    return min(128, max(32, n))


def _cpu_blocked(D, P, tile):
    n = D.shape[0]
    b = tile or _cpu_tile(n)
    Pk = P if P is not None else np.zeros((1, 1), np.int32)
    for k0 in range(0, n, b):
        _cpu_blocked_round(D, Pk, P is not None, k0, min(n, k0 + b))
    return D, P


def _cpu_floyd_warshall(D, P, tile):
    _cpu_fw_kernel(D, P if P is not None else np.zeros((1, 1), np.int32), P is not None)
    return D, P


def _squarings(D, P, update, xp):
    """Repeated min-plus squaring until nothing changes (or walks of n edges are covered)."""
    n, m = D.shape[0], 1
    while m < n:
        D2, P2 = D.copy(), (P.copy() if P is not None else None)
        update(D2, D, D, P2, P)
        m *= 2
        if bool((D2 == D).all()):
            return D2, P2
        D, P = D2, P2
    return D, P


def _cpu_minplus_apsp(D, P, tile):
    return _squarings(D, P, _cpu_minplus_update, np)


_CPU = {"minplus": _cpu_minplus_apsp, "floyd_warshall": _cpu_floyd_warshall, "blocked": _cpu_blocked}


# --------------------------------------------------------------------------------------------
# GPU (CuPy RawModule over kernels/graph_apsp.cu)
# --------------------------------------------------------------------------------------------

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64", np.dtype(np.int32): "i32"}
_BK = {"f32": 32, "i32": 32, "f64": 16}


@functools.cache
def _module():
    import cupy

    src = kernel_source("graph_apsp.cu")
    return cupy.RawModule(code=src, options=("-std=c++17",))


def _gpu_tile(dtype, pred: bool, n: int, tile: int | None) -> int:
    """128 x 128 register tiles for float32/int32 distances on large matrices, else 64 x 64."""
    if tile is not None:
        if tile not in (64, 128) or (tile == 128 and (pred or dtype == np.float64)):
            raise InputError("GPU tile must be 64, or 128 for float32/int32 without predecessors")
        return tile
    return 128 if (n >= 2048 and not pred and dtype != np.float64) else 64


def _kernel(dtype, tile: int, pred: bool):
    return _module().get_function(f"minplus_{_SUFFIX[np.dtype(dtype)]}_{tile}{'p' if pred else ''}")


def _launch_minplus(C, A, B, PC, PB, tile, skip_r=-1, skip_c=-1):
    """C = min(C, A (x) B) for views whose sizes are multiples of the tile (K of BK)."""
    import cupy

    m, n = C.shape
    k = A.shape[1]
    pred = PC is not None
    dummy = cupy.zeros(1, np.int32)
    kern = _kernel(C.dtype, tile, pred)
    kern((n // tile, m // tile), (256,),
         (C, PC if pred else dummy, A, B, PB if pred else dummy, np.int32(k), np.int32(A.strides[0] // A.itemsize),
          np.int32(B.strides[0] // B.itemsize), np.int32(C.strides[0] // C.itemsize), np.int32(skip_r), np.int32(skip_c)))


def _pad(M, rows, cols, fill, xp):
    if M.shape == (rows, cols):
        return xp.ascontiguousarray(M)
    out = xp.full((rows, cols), fill, dtype=M.dtype)
    out[:M.shape[0], :M.shape[1]] = M
    return out


def _inf(dtype):
    return INT_INF if np.dtype(dtype).kind == "i" else np.inf


def _gpu_minplus_update(C, A, B, PC=None, PB=None):
    """C = min(C, A (x) B) on the GPU for any sizes (padded to the kernel's tiles with inf)."""
    import cupy

    pred = PC is not None
    tile = _gpu_tile(C.dtype, pred, min(C.shape), None)
    bk = _BK[_SUFFIX[C.dtype]]
    up = lambda x, t: -(-x // t) * t  # noqa: E731
    m, n, k = up(C.shape[0], tile), up(C.shape[1], tile), up(A.shape[1], bk)
    inf = _inf(C.dtype)
    Cp, Ap, Bp = _pad(C, m, n, inf, cupy), _pad(A, m, k, inf, cupy), _pad(B, k, n, inf, cupy)
    PCp = _pad(PC, m, n, -1, cupy) if pred else None
    PBp = _pad(PB, k, n, -1, cupy) if pred else None
    _launch_minplus(Cp, Ap, Bp, PCp, PBp, tile)
    if Cp is not C:
        C[...] = Cp[:C.shape[0], :C.shape[1]]
        if pred:
            PC[...] = PCp[:C.shape[0], :C.shape[1]]


def _pad_square(D, P, b):
    """Pad to a multiple of b with isolated vertices (inf off the diagonal, 0 on it)."""
    import cupy

    n = D.shape[0]
    N = -(-n // b) * b
    if N == n:
        return D, P
    Dp = _pad(D, N, N, _inf(D.dtype), cupy)
    Dp[cupy.arange(n, N), cupy.arange(n, N)] = 0
    return Dp, (_pad(P, N, N, -1, cupy) if P is not None else None)


def _gpu_blocked(D, P, tile):
    import cupy

    n = D.shape[0]
    pred = P is not None
    b = _gpu_tile(D.dtype, pred, n, tile)
    Dp, Pp = _pad_square(D, P, b)
    N = Dp.shape[0]
    fw = _module().get_function(f"fw_tile_{_SUFFIX[D.dtype]}")
    smem = b * b * (D.itemsize + (4 if pred else 0))
    fw.max_dynamic_shared_size_bytes = smem
    dummy = cupy.zeros(1, np.int32)
    for t in range(N // b):
        s = slice(t * b, (t + 1) * b)
        diag, pdiag = Dp[s, s], (Pp[s, s] if pred else None)
        fw((1,), (1024,), (diag, pdiag if pred else dummy, np.int32(b), np.int32(N), np.int32(pred)),
           shared_mem=smem)
        # phase 2: row panel = D* (x) row panel, column panel = column panel (x) D*
        row, col = Dp[s, :], Dp[:, s]
        prow, pcol = (Pp[s, :], Pp[:, s]) if pred else (None, None)
        _launch_minplus(row, diag, row, prow, prow, b, skip_c=t)
        _launch_minplus(col, col, diag, pcol, pdiag, b, skip_r=t)
        # phase 3: every other tile = min(tile, column panel (x) row panel)
        _launch_minplus(Dp, col, row, Pp, prow, b, skip_r=t, skip_c=t)
    if N != n:
        return Dp[:n, :n].copy(), (Pp[:n, :n].copy() if pred else None)
    return Dp, Pp


def _gpu_floyd_warshall(D, P, tile):
    import cupy

    n = D.shape[0]
    pred = P is not None
    step = _module().get_function(f"fw_step_{_SUFFIX[D.dtype]}")
    Pk = P if pred else cupy.zeros(1, np.int32)
    grid = (-(-n // 32), -(-n // 8))
    for k in range(n):
        step(grid, (32, 8), (D, Pk, np.int32(n), np.int32(k), np.int32(pred)))
    return D, P


def _gpu_minplus_apsp(D, P, tile):
    import cupy

    return _squarings(D, P, _gpu_minplus_update, cupy)


_GPU = {"minplus": _gpu_minplus_apsp, "floyd_warshall": _gpu_floyd_warshall, "blocked": _gpu_blocked}
