"""numba kernels of the grid SSSP pipeline (Gerritsen 2012, part III, ch. 4; docs/ARCHITECTURE.md#sssp-index-pipeline).

Clusters are c x c squares of cells (Gerritsen 2012's blocks; several per store tile). A cluster's
boundary cells are numbered clockwise from its top-left corner (:func:`local_index`); a partial
cluster at the DEM's edge (h x w < c x c) uses the first ``boundary_count(h, w)`` numbers of the
``B = 4c - 4`` slots. Values are float64 with NaN for cells that are not vertices (nodata, or an
unusable cost); edge weights come from :func:`terrain_io._weights_cpu.edge_weight`.

* :func:`boundary_phase` -- phase 1: the shortest distances inside each cluster from every
  boundary cell to every other (vectorised label-correcting sweeps), the cluster's dense B x B
  block of the boundary graph G'.
* :func:`merge_run` -- phase 2: Dijkstra over G' with the cluster priority queue of Gerritsen 2012, ch. 4 (a heap
  of clusters keyed by their smallest tentative boundary distance; the cluster on top settles
  that vertex, relaxes its row of the block and its grid edges into neighbouring clusters).
  Cluster blocks live in "slots" (tile-sized chunks of the index); the kernel returns to Python
  whenever it needs a chunk that is not resident, so G' can be far larger than memory. (When G' is
  resident the pipeline uses the parallel merge of :mod:`._merge` instead.)
* :func:`final_phase` -- phase 3: per cluster, Dijkstra seeded with the settled boundary cells
  that were reached over a grid edge from a neighbouring cluster (their predecessor is that edge)
  and with the sources. Keys are (distance, merge rank of the seed the cell descends from), so
  on ties (zero-weight plateaus) predecessor chains still lead to ever earlier settled seeds and
  cannot form cycles across cluster borders.
"""
from __future__ import annotations

import ctypes
from typing import NamedTuple

import numba
import numpy as np
from numba import prange

from ..._weights_cpu import edge_weight
from ...weights import DC, DR
from .result import NO_PRED
HOW_INTRA = 254   # settled in the merge over a path inside its own cluster
HOW_SOURCE = 253  # a source
HOW_NONE = 255    # never reached


class ClusterGrid(NamedTuple):
    """What every merge kernel reads of the cluster grid: clusters of ``c`` x ``c`` cells grouped in
    chunks of ``m`` x ``m`` clusters (a chunk is one slot of :class:`Slots`), the DEM's ``rows`` x
    ``cols``, the weight model's ``kind`` and the ``steps`` of the 8 directions (:func:`terrain_io.weights.steps_of`),
    and the grid edges between clusters (``tab, tcnt``: :func:`crossing_table`)."""

    c: int
    m: int
    rows: int
    cols: int
    kind: int
    steps: np.ndarray
    tab: np.ndarray
    tcnt: np.ndarray


class Slots(NamedTuple):
    """The chunks of G' held in memory: S slots of m x m clusters of ``B = 4c - 4`` boundary cells
    each, indexed ``[slot, cluster row, cluster col in the chunk, boundary number]``.

    ``sD`` (S, m, m, B, B) float32: each cluster's dense block of G' (phase 1's distance inside it
    from one boundary cell to another); ``sV`` (float64): the boundary cells' values (NaN: not a
    vertex); ``sDist`` (float64): tentative distance; ``sRank`` (int64): settle rank of the
    sequential merge, or the parallel merge's tie-breaking label; ``sHow`` (uint8): how the cell was
    reached (the direction code of a grid edge into it, or HOW_INTRA / HOW_SOURCE / HOW_NONE);
    ``sSet`` (bool): settled / reached."""

    sD: np.ndarray
    sV: np.ndarray
    sDist: np.ndarray
    sRank: np.ndarray
    sHow: np.ndarray
    sSet: np.ndarray


class ClusterQueue(NamedTuple):
    """The cluster priority queue of the sequential merge (Gerritsen 2012, ch. 4): ``ckey[k]`` /
    ``cbest[k]``, the smallest tentative distance among cluster k's unsettled boundary cells and its
    boundary number; a binary min-heap of clusters on those keys (``heap``, its keys ``hkey``, each
    cluster's position ``hpos``, the heap's size in ``hpos[-1]``; :func:`heap_set`)."""

    ckey: np.ndarray
    cbest: np.ndarray
    heap: np.ndarray
    hkey: np.ndarray
    hpos: np.ndarray


class Paging(NamedTuple):
    """Which chunk of G' is in which slot: ``slot_of[chunk]`` (-1: not resident), ``chunk_in[slot]``
    (-1: free), ``last_use[slot]`` (the use clock when it was last needed: eviction takes the
    oldest), ``saved[chunk]`` (its vertex state was evicted to the scratch file), and ``counters``:
    [0] the next settle rank, [1] the use clock, [2] the chunk of the cluster on top of the queue."""

    slot_of: np.ndarray
    chunk_in: np.ndarray
    last_use: np.ndarray
    saved: np.ndarray
    counters: np.ndarray


@numba.njit(inline="always", cache=True)
def boundary_count(h, w):
    if h <= 2 or w <= 2:
        return h * w
    return 2 * (h + w) - 4


@numba.njit(inline="always", cache=True)
def local_index(i, j, h, w):
    """Clockwise number of boundary cell (i, j) of an h x w cluster, -1 for inner cells."""
    if i == 0:
        return j
    if j == w - 1:
        return w - 1 + i
    if i == h - 1:
        return w - 1 + h - 1 + (w - 1 - j)
    if j == 0:
        return 2 * (w - 1) + h - 1 + (h - 1 - i)
    return -1


@numba.njit(inline="always", cache=True)
def cluster_window(q, mc, c, H, W):
    """Cluster q of an H x W block cut into c x c clusters, mc a row: its row a and column b, its
    top-left cell (r0, c0) and its shape h x w (smaller at the block's bottom and right edges)."""
    a = q // mc
    b = q - a * mc
    r0 = a * c
    c0 = b * c
    return a, b, r0, c0, min(c, H - r0), min(c, W - c0)


@numba.njit(cache=True)
def boundary_cells(h, w):
    """Row and column of each boundary number of an h x w cluster."""
    n = boundary_count(h, w)
    bi = np.empty(n, np.int64)
    bj = np.empty(n, np.int64)
    for i in range(h):
        for j in range(w):
            t = local_index(i, j, h, w)
            if t >= 0:
                bi[t] = i
                bj[t] = j
    return bi, bj


# -- binary heaps (lazy deletion) -------------------------------------------------------------
@numba.njit(inline="always", cache=True)
def _less(ka, ra, kb, rb):
    return ka < kb or (ka == kb and ra < rb)


@numba.njit(cache=True)
def _push(hk, hr, hv, n, k, r, v):
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if not _less(k, r, hk[p], hr[p]):
            break
        hk[i] = hk[p]
        hr[i] = hr[p]
        hv[i] = hv[p]
        i = p
    hk[i] = k
    hr[i] = r
    hv[i] = v
    return n + 1


@numba.njit(cache=True)
def _pop(hk, hr, hv, n):
    """Remove the top entry (read it first); returns the new size."""
    n -= 1
    k = hk[n]
    r = hr[n]
    v = hv[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(hk[c + 1], hr[c + 1], hk[c], hr[c]):
            c += 1
        if not _less(hk[c], hr[c], k, r):
            break
        hk[i] = hk[c]
        hr[i] = hr[c]
        hv[i] = hv[c]
        i = c
    if n > 0:
        hk[i] = k
        hr[i] = r
        hv[i] = v
    return n


@numba.njit(cache=True)
def cluster_dijkstra(vals, kind, steps, dist, root, pred, fixed, hk, hr, hv):
    """Lexicographic Dijkstra on one cluster (vals: h x w, NaN = not a vertex).

    On entry ``dist``/``root``/``pred`` hold the seeds (other cells: inf / max / 255) and ``fixed``
    marks seeds whose values must not change. Keys are (distance, root rank).
    """
    h, w = vals.shape
    n = 0
    for i in range(h):
        for j in range(w):
            if dist[i, j] < np.inf:
                n = _push(hk, hr, hv, n, dist[i, j], root[i, j], i * w + j)
    while n > 0:
        d = hk[0]
        r = hr[0]
        q = hv[0]
        n = _pop(hk, hr, hv, n)
        i = q // w
        j = q - i * w
        if d != dist[i, j] or r != root[i, j]:
            continue  # stale entry
        a = vals[i, j]
        for k in range(8):
            ii = i + DR[k]
            jj = j + DC[k]
            if ii < 0 or ii >= h or jj < 0 or jj >= w or fixed[ii, jj]:
                continue
            b = vals[ii, jj]
            if np.isnan(b):
                continue
            nd = d + edge_weight(kind, a, b, steps[k])
            if _less(nd, r, dist[ii, jj], root[ii, jj]):
                dist[ii, jj] = nd
                root[ii, jj] = r
                pred[ii, jj] = (k + 4) & 7
                n = _push(hk, hr, hv, n, nd, r, ii * w + jj)


# -- phase 1 ----------------------------------------------------------------------------------
@numba.njit(cache=True)
def cluster_weights(sub, kind, steps):
    """Weights of the 8 edges into every cell of a cluster: ``wts[p, k]`` is w(q -> p) for p's
    neighbour q in direction k (inf where the edge is not in the graph; the walk model is directed)."""
    h, w = sub.shape
    wts = np.full((h * w, 8), np.inf)
    for i in range(h):
        for j in range(w):
            x = sub[i, j]
            if np.isnan(x):
                continue
            for k in range(8):
                ii = i + DR[k]
                jj = j + DC[k]
                if 0 <= ii < h and 0 <= jj < w and not np.isnan(sub[ii, jj]):
                    wts[i * w + j, k] = edge_weight(kind, sub[ii, jj], x, steps[k])
    return wts


SWEEP_BLOCK = 32  # boundary sources per sweep block: 8 AVX2 vectors of float64 per cell


@numba.njit(inline="always", cache=True)
def _pull(D, wts, p, w, mark, stamp):
    """D[p] = min(D[p], D[q] + w(q, p)) over the neighbours q of cell p whose rows changed in this
    or the previous half-sweep, all sources at once (vectorised over the row); True if D[p] fell."""
    i = p // w
    j = p - i * w
    fell = False
    for k in range(8):
        wk = wts[p, k]
        if wk == np.inf:  # also every neighbour outside the cluster
            continue
        q = (i + DR[k]) * w + j + DC[k]
        if mark[q] < stamp - 1:
            continue
        lower = False
        for s in range(D.shape[1]):
            x = D[q, s] + wk
            cur = D[p, s]
            lower |= x < cur
            D[p, s] = min(cur, x)
        fell |= lower
    if fell:
        mark[p] = stamp
    return fell


@numba.njit(parallel=True, cache=True)
def boundary_phase(vals, c, kind, steps, out_d, out_v):
    """G' blocks of every cluster of ``vals`` (a tile, its origin on the cluster grid).

    ``out_d[a, b, s, t]``: float32 shortest distance inside cluster (a, b) from boundary cell s to
    boundary cell t (inf if unreachable or not vertices); ``out_v[a, b, t]``: the value of cell t.

    Label-correcting Gauss-Seidel sweeps (Bellman-Ford in alternating row-major / reverse order,
    only rows next to a changed row revisited) for a block of ``SWEEP_BLOCK`` boundary sources at
    once: each cell holds one distance per source, so every relaxation is a SIMD min-plus over
    the block -- 3-4x faster on the CPU than one heap Dijkstra per source. The fixpoint is the
    minimum over paths of the left-to-right float64 sums of their weights (rounding is monotone),
    which is exactly what Dijkstra from s settles: the blocks are bit-identical to a Dijkstra per
    source, and to the GPU kernel (kernels/sssp_pipeline.cu).
    """
    H, W = vals.shape
    mr, mc = (H + c - 1) // c, (W + c - 1) // c
    for q in prange(mr * mc):
        a, b, r0, c0, h, w = cluster_window(q, mc, c, H, W)
        n = h * w
        sub = vals[r0 : r0 + h, c0 : c0 + w]
        bi, bj = boundary_cells(h, w)
        nb = bi.shape[0]
        for t in range(nb):
            out_v[a, b, t] = sub[bi[t], bj[t]]
        wts = cluster_weights(sub, kind, steps)
        D = np.empty((n, min(SWEEP_BLOCK, (nb + 15) // 16 * 16)))
        mark = np.empty(n, np.int64)
        for s0 in range(0, nb, D.shape[1]):
            D[:] = np.inf
            mark[:] = 0
            for s in range(s0, min(nb, s0 + D.shape[1])):
                if not np.isnan(sub[bi[s], bj[s]]):
                    D[bi[s] * w + bj[s], s - s0] = 0.0
                    mark[bi[s] * w + bj[s]] = 1
            stamp = 2
            fell = True
            while fell:
                fell = False
                if stamp % 2 == 0:
                    for p in range(n):
                        fell |= _pull(D, wts, p, w, mark, stamp)
                else:
                    for p in range(n - 1, -1, -1):
                        fell |= _pull(D, wts, p, w, mark, stamp)
                stamp += 1
            for s in range(s0, min(nb, s0 + D.shape[1])):
                if np.isnan(sub[bi[s], bj[s]]):
                    continue
                for t in range(nb):
                    out_d[a, b, s, t] = D[bi[t] * w + bj[t], s - s0]


# -- phase 2 ----------------------------------------------------------------------------------
@numba.njit(cache=True)
def _heap_sift(heap, hkey, hpos, i):
    """Restore the indexed 4-ary cluster heap around position i (up, then down). Keys are kept
    inline (``hkey[i]`` is the key of ``heap[i]``; a node's 4 children share a cache line): half
    the levels of a binary heap, one memory access per level."""
    n = hpos[-1]
    k = heap[i]
    kk = hkey[i]
    while i > 0:
        p = (i - 1) >> 2
        if hkey[p] <= kk:
            break
        heap[i] = heap[p]
        hkey[i] = hkey[p]
        hpos[heap[i]] = i
        i = p
    while True:
        first = 4 * i + 1
        if first >= n:
            break
        ch = first
        for q in range(first + 1, min(first + 4, n)):
            if hkey[q] < hkey[ch]:
                ch = q
        if hkey[ch] >= kk:
            break
        heap[i] = heap[ch]
        hkey[i] = hkey[ch]
        hpos[heap[i]] = i
        i = ch
    heap[i] = k
    hkey[i] = kk
    hpos[k] = i


@numba.njit(cache=True)
def heap_set(heap, hkey, hpos, key, k, value):
    """Set cluster k's key; insert it if absent, remove it when the key becomes inf."""
    key[k] = value
    i = hpos[k]
    if i < 0:
        if value == np.inf:
            return
        i = hpos[-1]
        hpos[-1] = i + 1
        heap[i] = k
        hkey[i] = value
        hpos[k] = i
        _heap_sift(heap, hkey, hpos, i)
        return
    if value == np.inf:
        n = hpos[-1] - 1
        hpos[-1] = n
        hpos[k] = -1
        if i < n:
            heap[i] = heap[n]
            hkey[i] = hkey[n]
            hpos[heap[i]] = i
            _heap_sift(heap, hkey, hpos, i)
        return
    hkey[i] = value
    _heap_sift(heap, hkey, hpos, i)


@numba.njit(cache=True)
def crossing_table(c):
    """Grid edges leaving a full c x c cluster: per boundary number t, up to 5 entries of
    (direction, cluster row offset, cluster col offset, boundary number in that neighbour)."""
    B = 4 * c - 4
    tab = np.full((B, 5, 4), -1, np.int64)
    cnt = np.zeros(B, np.int64)
    bi, bj = boundary_cells(c, c)
    for t in range(B):
        for k in range(8):
            ii = bi[t] + DR[k]
            jj = bj[t] + DC[k]
            if 0 <= ii < c and 0 <= jj < c:
                continue
            dy = -1 if ii < 0 else (1 if ii >= c else 0)
            dx = -1 if jj < 0 else (1 if jj >= c else 0)
            e = cnt[t]
            tab[t, e, 0] = k
            tab[t, e, 1] = dy
            tab[t, e, 2] = dx
            tab[t, e, 3] = local_index(ii - dy * c, jj - dx * c, c, c)
            cnt[t] = e + 1
    return tab, cnt


@numba.njit(inline="always", cache=True)
def crossings(c, rows, cols, full_r, full_c, tab, tcnt, cr, cc, h, w, t, out):
    """Grid edges from boundary cell t of cluster (cr, cc) (h x w cells) into neighbouring clusters,
    in direction order, as rows of ``out`` (8 x 4): (direction from t, neighbour cluster row, col,
    its boundary number). Returns the count. Interior clusters read them from ``tab, tcnt``
    (:func:`crossing_table`)."""
    n = 0
    if h == c and w == c and cr + 1 < full_r and cc + 1 < full_c and cr > 0 and cc > 0:
        for e in range(tcnt[t]):
            out[n, 0] = tab[t, e, 0]
            out[n, 1] = cr + tab[t, e, 1]
            out[n, 2] = cc + tab[t, e, 2]
            out[n, 3] = tab[t, e, 3]
            n += 1
        return n
    bi, bj = _position(t, h, w)
    gi = cr * c + bi
    gj = cc * c + bj
    for dd in range(8):
        ni = gi + DR[dd]
        nj = gj + DC[dd]
        if ni < 0 or ni >= rows or nj < 0 or nj >= cols:
            continue
        cr2 = ni // c
        cc2 = nj // c
        if cr2 == cr and cc2 == cc:
            continue
        out[n, 0] = dd
        out[n, 1] = cr2
        out[n, 2] = cc2
        out[n, 3] = local_index(ni - cr2 * c, nj - cc2 * c, min(c, rows - cr2 * c), min(c, cols - cc2 * c))
        n += 1
    return n


@numba.njit(cache=True)
def merge_run(grid, slots, queue, paging):
    """Dijkstra over G' with the cluster priority queue until done (-1) or a chunk is missing.

    ``grid``: :class:`ClusterGrid` (m a power of two); ``slots``: :class:`Slots`; ``queue``:
    :class:`ClusterQueue`; ``paging``: :class:`Paging`. When some chunk is not resident, the kernel
    returns the id of the first missing one among the top cluster's chunk and those its settling
    cell's grid edges reach, and leaves the top cluster's chunk id in ``counters[2]`` (the 3 x 3
    chunks around it must stay).
    """
    c, m, rows, cols, kind, steps, tab, tcnt = grid
    sD, sV, sDist, sRank, sHow, sSet = slots
    ckey, cbest, heap, hkey, hpos = queue
    slot_of, _, last_use, _, counters = paging
    ncc = (cols + c - 1) // c
    full_r = rows // c  # clusters in rows < full_r (cols < full_c) are full c x c squares
    full_c = cols // c
    TC = (cols + c * m - 1) // (c * m)
    paged = np.any(slot_of < 0)  # else every chunk is resident: no checks per settle
    lm = 0
    while (1 << lm) < m:
        lm += 1
    lcm = lm
    while (1 << lcm) < c * m:
        lcm += 1
    cross = np.empty((8, 4), np.int64)
    while hpos[-1] > 0:
        k = heap[0]
        cr = k // ncc
        cc = k - cr * ncc
        tr = cr >> lm
        tc = cc >> lm
        h = min(c, rows - cr * c)
        w = min(c, cols - cc * c)
        best = cbest[k]
        if paged:
            counters[1] += 1
            counters[2] = tr * TC + tc
            if slot_of[tr * TC + tc] < 0:
                return tr * TC + tc
            # the chunks that the settled cell's grid edges reach must be resident too
            bi, bj = _position(best, h, w)
            for dd in range(8):
                ni = cr * c + bi + DR[dd]
                nj = cc * c + bj + DC[dd]
                if 0 <= ni < rows and 0 <= nj < cols:
                    ch = (ni >> lcm) * TC + (nj >> lcm)
                    if slot_of[ch] < 0:
                        return ch
                    last_use[slot_of[ch]] = counters[1]
        s = slot_of[tr * TC + tc]
        a = cr - tr * m
        b = cc - tc * m
        nb = boundary_count(h, w)
        dv = sDist[s, a, b]
        sv = sSet[s, a, b]
        hv = sHow[s, a, b]
        bd = ckey[k]
        sv[best] = True
        sRank[s, a, b, best] = counters[0]
        counters[0] += 1
        # intra-cluster edges of G' (the row of the block), tracking the cluster's new minimum
        row = sD[s, a, b, best]
        newkey = np.inf
        newbest = -1
        for t in range(nb):
            if sv[t]:
                continue
            nd = bd + row[t]
            if nd < dv[t]:
                dv[t] = nd
                hv[t] = HOW_INTRA
            if dv[t] < newkey:
                newkey = dv[t]
                newbest = t
        # grid edges into neighbouring clusters
        x = sV[s, a, b, best]
        for e in range(crossings(c, rows, cols, full_r, full_c, tab, tcnt, cr, cc, h, w, best, cross)):
            _relax_cross(lm, ncc, TC, slot_of, kind, steps, slots, queue,
                         x, bd, cross[e, 0], cross[e, 1], cross[e, 2], cross[e, 3])
        cbest[k] = newbest
        heap_set(heap, hkey, hpos, ckey, k, newkey)
    return -1


@numba.njit(inline="always", cache=True)
def _position(t, h, w):
    """(row, col) of boundary number t of an h x w cluster (inverse of :func:`local_index`)."""
    if t < w:
        return 0, t
    if t < w + h - 1:
        return t - (w - 1), w - 1
    if t < 2 * (w - 1) + h:
        return h - 1, (w - 1) - (t - (w - 1) - (h - 1))
    return (h - 1) - (t - 2 * (w - 1) - (h - 1)), 0


@numba.njit(inline="always", cache=True)
def _relax_cross(lm, ncc, TC, slot_of, kind, steps, slots, queue, x, bd, dd, cr2, cc2, t2):
    """Relax the grid edge in direction dd from a settled cell (value x, distance bd) into
    boundary number t2 of cluster (cr2, cc2) (a row of :func:`crossings`)."""
    _, sV, sDist, _, sHow, sSet = slots
    ckey, cbest, heap, hkey, hpos = queue
    tr2 = cr2 >> lm
    tc2 = cc2 >> lm
    s2 = slot_of[tr2 * TC + tc2]
    a2 = cr2 - (tr2 << lm)
    b2 = cc2 - (tc2 << lm)
    if sSet[s2, a2, b2, t2]:
        return
    y = sV[s2, a2, b2, t2]
    if np.isnan(y):
        return
    nd = bd + edge_weight(kind, x, y, steps[dd])
    if nd < sDist[s2, a2, b2, t2]:
        sDist[s2, a2, b2, t2] = nd
        sHow[s2, a2, b2, t2] = (dd + 4) & 7
        k2 = cr2 * ncc + cc2
        if nd < ckey[k2]:
            cbest[k2] = t2
            heap_set(heap, hkey, hpos, ckey, k2, nd)


# -- phase 3 ----------------------------------------------------------------------------------
@numba.njit(parallel=True, cache=True)
def final_phase(vals, c, kind, steps, mDist, mRank, mHow, mSet, src_r, src_c, out_d, out_p):
    """Distances and predecessors of every cell of ``vals`` (a tile or shard, its origin on the cluster grid).

    ``mDist, mRank, mHow, mSet`` (m x m x B): the merge's results for the tile's clusters;
    ``src_r, src_c``: sources inside this tile (tile coordinates).
    """
    H, W = vals.shape
    mr, mc = (H + c - 1) // c, (W + c - 1) // c
    big = np.iinfo(np.int64).max
    for q in prange(mr * mc):
        a, b, r0, c0, h, w = cluster_window(q, mc, c, H, W)
        sub = vals[r0 : r0 + h, c0 : c0 + w]
        dist = np.full((h, w), np.inf)
        root = np.full((h, w), big, np.int64)
        pred = np.full((h, w), NO_PRED, np.uint8)
        fixed = np.zeros((h, w), np.bool_)
        any_seed = False
        bi, bj = boundary_cells(h, w)
        for t in range(bi.shape[0]):
            hw = mHow[a, b, t]
            if mSet[a, b, t] and hw < 8:
                i = bi[t]
                j = bj[t]
                dist[i, j] = mDist[a, b, t]
                root[i, j] = mRank[a, b, t]
                pred[i, j] = hw
                fixed[i, j] = True
                any_seed = True
        for k in range(src_r.shape[0]):
            i = src_r[k] - r0
            j = src_c[k] - c0
            if 0 <= i < h and 0 <= j < w:
                dist[i, j] = 0.0
                root[i, j] = -1
                pred[i, j] = NO_PRED
                fixed[i, j] = True
                any_seed = True
        if any_seed:
            cap = 8 * h * w + 8
            cluster_dijkstra(sub, kind, steps, dist, root, pred, fixed, np.empty(cap, np.float64),
                             np.empty(cap, np.int64), np.empty(cap, np.int64))
        for i in range(h):
            for j in range(w):
                out_d[r0 + i, c0 + j] = np.nan if np.isnan(sub[i, j]) else dist[i, j]
                out_p[r0 + i, c0 + j] = pred[i, j]


@numba.njit(cache=True)
def source_boundary(vals, kind, steps, src_i, src_j):
    """Distances from the sources (cluster coordinates) to every cell of one cluster (seeding G')."""
    h, w = vals.shape
    dist = np.full((h, w), np.inf)
    root = np.full((h, w), np.iinfo(np.int64).max, np.int64)
    pred = np.full((h, w), NO_PRED, np.uint8)
    fixed = np.zeros((h, w), np.bool_)
    for k in range(src_i.shape[0]):
        dist[src_i[k], src_j[k]] = 0.0
        root[src_i[k], src_j[k]] = -1
        fixed[src_i[k], src_j[k]] = True
    cap = 8 * h * w + 8
    cluster_dijkstra(vals, kind, steps, dist, root, pred, fixed, np.empty(cap, np.float64),
                     np.empty(cap, np.int64), np.empty(cap, np.int64))
    return dist


# -- paging of G' chunks inside compiled code (no return to Python per chunk) ----------------
_libc = ctypes.CDLL(None, use_errno=True)
_pread = _libc.pread
_pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
_pread.restype = ctypes.c_ssize_t
_pwrite = _libc.pwrite
_pwrite.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
_pwrite.restype = ctypes.c_ssize_t


@numba.njit
def merge_run_paged(grid, slots, queue, paging, fd_flat, fd_state):
    """:func:`merge_run` with chunks paged in and out by pread/pwrite on two scratch files: the
    flat index (``fd_flat``; per chunk: its G' blocks, then its values) and the evicted vertex
    state (``fd_state``). Returns 0, or -1 on an I/O error. (Not cached: it calls libc through ctypes.)"""
    c, m, cols = grid.c, grid.m, grid.cols
    sD, sV, sDist, sRank, sHow, sSet = slots
    slot_of, chunk_in, last_use, saved, counters = paging
    TC = (cols + c * m - 1) // (c * m)
    S = chunk_in.shape[0]
    n = sDist[0].size
    nd = sD[0].size * 4
    rec = nd + n * 8
    st = n * 18
    while True:
        ch = merge_run(grid, slots, queue, paging)
        if ch < 0:
            return 0
        cy = counters[2] // TC
        cx = counters[2] - cy * TC
        s = -1
        oldest = np.iinfo(np.int64).max
        for q in range(S):
            held = chunk_in[q]
            if held < 0:
                s = q
                break
            hy = held // TC
            hx = held - hy * TC
            if abs(hy - cy) <= 1 and abs(hx - cx) <= 1:
                continue
            if last_use[q] < oldest:
                oldest = last_use[q]
                s = q
        held = chunk_in[s]
        if held >= 0:
            off = held * st
            ok = _pwrite(fd_state, sDist[s].ctypes.data, 8 * n, off) == 8 * n
            ok &= _pwrite(fd_state, sRank[s].ctypes.data, 8 * n, off + 8 * n) == 8 * n
            ok &= _pwrite(fd_state, sHow[s].ctypes.data, n, off + 16 * n) == n
            ok &= _pwrite(fd_state, sSet[s].ctypes.data, n, off + 17 * n) == n
            if not ok:
                return -1
            saved[held] = True
            slot_of[held] = -1
        if _pread(fd_flat, sD[s].ctypes.data, nd, ch * rec) != nd:
            return -1
        if _pread(fd_flat, sV[s].ctypes.data, 8 * n, ch * rec + nd) != 8 * n:
            return -1
        if saved[ch]:
            off = ch * st
            ok = _pread(fd_state, sDist[s].ctypes.data, 8 * n, off) == 8 * n
            ok &= _pread(fd_state, sRank[s].ctypes.data, 8 * n, off + 8 * n) == 8 * n
            ok &= _pread(fd_state, sHow[s].ctypes.data, n, off + 16 * n) == n
            ok &= _pread(fd_state, sSet[s].ctypes.data, n, off + 17 * n) == n
            if not ok:
                return -1
        else:
            sDist[s].ravel()[:] = np.inf
            sRank[s].ravel()[:] = -1
            sHow[s].ravel()[:] = HOW_NONE
            sSet[s].ravel()[:] = False
        slot_of[ch] = s
        chunk_in[s] = ch
        last_use[s] = counters[1]
