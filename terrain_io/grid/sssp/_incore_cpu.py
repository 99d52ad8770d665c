"""numba kernels of the in-core SSSP engine (docs/ARCHITECTURE.md#sssp-engines): one block of cells solved
whole in memory. The rules they compute are in :mod:`.incore`; this module only follows them.

A block is an (h + 2) x (w + 2) array with a one-cell ring around its h x w interior, flattened
row-major. Ring cells are not solved: their values (a neighbouring block's cells, or NaN outside
the DEM) and their distances and plateau levels are given, fixed, and only flow inwards.

* :func:`solve_distances` -- Dijkstra over the interior, seeded from the sources and from every ring
  cell with a finite distance: on Dial's buckets where every weight has a positive lower bound
  (cell, surface and walk models, when the window of buckets is small enough), else on a radix heap
  keyed by the distances' bits (absdiff, costs with zeros) or the 4-ary heap of ``_heap_cpu`` (walk),
  with a FIFO for zero weights. The 4-ary heap also holds the seeds, and is the tests' reference.
  The three queues' loops each spell out the relaxation of a popped cell's neighbours: the same
  lines as an inlined helper (it takes the arrays) made each loop slower (benchmarks/RESULTS.md, "Measurements behind decisions in the code").
* :func:`plateau_levels` -- the plateau level of every interior cell: 0 where a tight parent is
  strictly nearer (or at a source), else 1 + the least level of its tight parents (which all
  lie at the same distance): a breadth-first search over equal-distance plateaus.
* :func:`predecessors` -- the parent codes of the plateau cells from distances and levels (the
  other cells' codes come out of the levels' first pass).
* :func:`affected_cells` -- after a warm re-solve (a ring whose distances only fell), the cells
  whose level or code can have changed: the two kernels above then run on those alone.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

from ...jit import serial_twin
from .._heap_cpu import heap_pop, heap_push, heap_replace
from ..._weights_cpu import edge_weight, float64_bits, walk_time
from ...weights import ABSDIFF, CELL, DC, DR, SURFACE, WALK
from .._radix_cpu import radix_sort32_in
from .result import NO_LEVEL, NO_PRED


@numba.njit(cache=True)
def _offsets(W2):
    off = np.empty(8, np.int64)
    for k in range(8):
        off[k] = DR[k] * W2 + DC[k]
    return off


def solve_distances(vals, h, w, kind, steps, dist, warm=False, limit=np.inf, mark=None, buckets=True):
    """Distances of the interior cells, in place in ``dist`` (float64, the block's shape, flat).

    On entry ``dist`` holds the seeds: 0 at the sources, the fixed distances of ring cells, +inf
    elsewhere. On return every interior cell holds the least left-to-right float64 sum over paths
    from a seed (the fixpoint of d[v] = min_u d[u] + w(u, v)). Returns the number of pops.
    ``warm``: the interior already holds the fixpoint for a ring that has since only fallen; only
    the cells the new ring improves start the heap (label-correcting from a valid upper bound
    reaches the same unique fixpoint), so the work follows the change, not the block.
    ``limit``: no distance above it is kept (such cells stay +inf): every path to a cell within the
    limit stays within it (weights are not negative), so those cells get their full-run values,
    and the work follows the area reached.
    ``mark`` (uint8, the block's shape, flat; warm only): set to 1 at every cell whose distance falls
    (:func:`affected_cells` starts from them).
    ``buckets``: Dial's buckets where the weight model allows (:func:`_bucket_width`; the fastest
    queue), else for absdiff and costs with no positive floor a radix heap (faster than the 4-ary
    heap there; walk's weights span so many binades that its entries move through many buckets, and
    the 4-ary heap is faster for it): benchmarks/RESULTS.md, "2-core VM, first source: Dial's
    buckets, a radix heap, ..."; False: the 4-ary heap. The same distances either way (each is
    label-correcting: a cell improved after its pop is pushed again).

    A Python function in front of one compiled entry point per queue, so that a run compiles only
    the queue it uses (each is seconds of numba compilation). ``mark`` stays None or an array: with
    None numba drops the marking from the loops (an empty array and a test in the loop instead made
    the bucket queue's loop slower (benchmarks/RESULTS.md, "Measurements behind decisions in the code")), at the price of a second build of a queue for the warm
    re-solves of the shard method.
    """
    warm, limit = bool(warm), float(limit)
    hk, hv, n, ring, saved = _seed_queue(vals, h, w, kind, steps, dist, warm, limit, mark)
    # the ring is hidden behind -inf while the queue runs (see _seed_queue)
    try:
        width, slots = _bucket_width(vals, h, w, kind, steps) if buckets and kind in _BUCKET_KINDS else (0.0, 0)
        if slots:
            return _run_buckets(vals, kind, steps, dist, _offsets(w + 2), limit, warm, mark, hk, hv, n, width, slots)
        if buckets and (kind == ABSDIFF or kind == CELL):
            return _run_radix(vals, kind, steps, dist, _offsets(w + 2), limit, warm, mark, hk, hv, n)
        return _run_heap(vals, kind, steps, dist, _offsets(w + 2), limit, warm, mark, hk, hv, n)
    finally:
        dist[ring] = saved


_BUCKET_KINDS = (CELL, SURFACE, WALK)  # the models whose weights have a positive floor (see _bucket_width)


@numba.njit(cache=True)
def _seed_queue(vals, h, w, kind, steps, dist, warm, limit, mark):
    """The start of :func:`solve_distances`: the ring's relaxations of its interior neighbours, then
    the 4-ary heap (hk, hv) of the n seeds (cold: every interior cell with a finite distance; warm:
    the cells the ring improved, marked in ``mark`` unless it is None). Hides the ring behind -inf
    (the queues' test ``dist <= du`` then skips it, so that popped cells need no bounds checks) and
    returns (hk, hv, n, ring, saved): the ring's flat indices and distances, to restore."""
    W2 = w + 2
    off = _offsets(W2)
    hk = np.empty(1024, np.float64)
    hv = np.empty(1024, np.int64)
    n = np.int64(0)
    # the ring flows inwards once: each ring cell relaxes its interior neighbours
    for r in range(h + 2):
        step_c = 1 if (r == 0 or r == h + 1) else w + 1
        for c in range(0, w + 2, step_c):
            u = r * W2 + c
            du = dist[u]
            if not du < np.inf or np.isnan(vals[u]):
                continue
            for k in range(8):
                rr, cc = r + DR[k], c + DC[k]
                if rr < 1 or rr > h or cc < 1 or cc > w:
                    continue
                v = u + off[k]
                if np.isnan(vals[v]):
                    continue
                nd = du + edge_weight(kind, vals[u], vals[v], steps[k])
                if nd < dist[v] and nd <= limit:
                    dist[v] = nd
                    if warm:
                        if mark is not None:
                            mark[v] = 1
                        if n == hk.size:
                            hk, hv = _doubled(hk), _doubled(hv)
                        heap_push(hk, hv, n, nd, v)
                        n += 1
    for r in range(1, h + 1):
        if warm:
            break
        for c in range(1, w + 1):
            v = r * W2 + c
            if dist[v] < np.inf and not np.isnan(vals[v]):
                if n == hk.size:
                    hk, hv = _doubled(hk), _doubled(hv)
                heap_push(hk, hv, n, dist[v], v)
                n += 1
    ring = _ring_cells(h, w)
    saved = np.empty(ring.shape[0], np.float64)
    for x in range(ring.shape[0]):  # (loops: an array assignment compiles numba's shape-error message)
        saved[x] = dist[ring[x]]
        dist[ring[x]] = -np.inf
    return hk, hv, n, ring, saved


@numba.njit(cache=True)
def _run_heap(vals, kind, steps, dist, off, limit, warm, mark, hk, hv, n):
    """Dijkstra from the heap (hk, hv) of n seeds, with the FIFO of :func:`_settle`; returns the pops."""
    pops = np.int64(0)  # (a literal 0 passed on would compile the callee once more for Literal[int](0))
    fifo = np.empty(1024, np.int64)
    fh = fc = np.int64(0)
    while True:
        n, fh, fc, pops = _settle(vals, kind, steps, dist, off, limit, warm, mark, hk, hv, n, fifo, fh, fc, pops)
        if n == 0 and fc == 0:
            break
        if n + 8 > hk.size:
            hk, hv = _doubled(hk), _doubled(hv)
        if fc + 8 > fifo.size:
            fifo, fh = _grow_ring(fifo, fh, fc)
    return pops


@numba.njit(inline="always", cache=True)
def _bucket_push(head, item, nxt, state, v, slot):
    """Put cell v in bucket ``slot`` of a bucket queue (Dial's, or the radix heap's) and return its
    entry: one from the free list (``state[0]``), else a fresh one (``state[1]``); ``state[2]``
    counts the live entries. (The queues' loops push inline.)"""
    f = state[0]
    if f >= 0:
        state[0] = nxt[f]
    else:
        f = state[1]
        state[1] += 1
    item[f] = v
    nxt[f] = head[slot]
    head[slot] = f
    state[2] += 1
    return f


@numba.njit(cache=True)
def _run_radix(vals, kind, steps, dist, off, limit, warm, mark, hk, hv, n):
    """Dijkstra on a radix heap from the heap (hk, hv) of n seeds, with a FIFO for zero weights;
    returns the pops. See :func:`_settle_radix`. (Faster than the 4-ary heap for absdiff: benchmarks/
    RESULTS.md, "2-core VM, first source: Dial's buckets, a radix heap, ...".)"""
    cap = 1024
    while cap < n + 16:
        cap *= 2
    ekey = np.empty(cap, np.int64)
    item = np.empty(cap, np.int64)
    nxt = np.empty(cap, np.int64)
    heads = np.full(65, -1, np.int64)
    fifo = np.empty(1024, np.int64)
    st = np.zeros(7, np.int64)  # free-list head, entries used, live, last key, occupied buckets, FIFO head, count
    st[0] = -1
    for x in range(n):  # the seeds (keys >= the last key, 0)
        key = float64_bits(hk[x] + 0.0)
        b = 64 - leading_zeros(key) if key else 0
        ekey[_bucket_push(heads, item, nxt, st, hv[x], b)] = key
        if b:
            st[4] |= np.int64(1) << (b - 1)
    pops = np.int64(0)  # (not a literal 0: see _run_heap)
    while True:
        pops = _settle_radix(vals, kind, steps, dist, off, limit, warm, mark, heads, ekey, item, nxt, fifo, st, pops)
        if st[2] == 0 and st[6] == 0:
            break
        if st[2] + 8 > item.size:
            ekey, item, nxt = _doubled(ekey), _doubled(item), _doubled(nxt)
        if st[6] + 8 > fifo.size:
            fifo, st[5] = _grow_ring(fifo, st[5], st[6])
    return pops


@numba.njit(cache=True)
def _settle_radix(vals, kind, steps, dist, off, limit, warm, mark, heads, ekey, item, nxt, fifo, st, pops):
    """Dijkstra's loop on a radix heap (Ahuja, Mehlhorn, Orlin & Tarjan 1990) keyed by the IEEE bits
    of the distances (monotone for numbers >= 0): bucket b >= 1 holds the keys whose highest bit
    differing from the last key taken is b - 1, bucket 0 the last key itself. A push costs a
    leading-zero count; when bucket 0 is empty the least non-empty bucket gives the next last key
    (its least live key) and its entries move to lower buckets -- each entry at most 64 times, in
    practice a few. Stale entries (the cell fell since) are dropped on the way. Zero-weight
    relaxations go to the FIFO (see :func:`_settle`). Runs until both are empty or may lack room
    for a cell's pushes; the state lives in ``st``."""
    cap = item.size
    fcap = fifo.size
    free, used, live, last, occ, fh, fc = st[0], st[1], st[2], st[3], st[4], st[5], st[6]
    while live + 8 <= cap and fc + 8 <= fcap:
        if fc > 0:
            u = fifo[fh]
            fh = fh + 1 if fh + 1 < fcap else 0
            fc -= 1
            du = dist[u]
        else:
            e = heads[0]
            if e < 0:
                if occ == 0:
                    break
                i = trailing_zeros(occ) + 1
                e = heads[i]
                heads[i] = -1
                occ &= ~(np.int64(1) << (i - 1))
                least = np.int64(2**63 - 1)
                keep = -1
                while e >= 0:  # drop the stale entries, find the least key
                    f = nxt[e]
                    if ekey[e] != float64_bits(dist[item[e]]):
                        nxt[e] = free
                        free = e
                        live -= 1
                    else:
                        nxt[e] = keep
                        keep = e
                        if ekey[e] < least:
                            least = ekey[e]
                    e = f
                if keep < 0:
                    continue
                last = least
                e = keep
                while e >= 0:  # each to a lower bucket, by its highest bit differing from the new last
                    f = nxt[e]
                    x = ekey[e] ^ last
                    b = 64 - leading_zeros(x) if x else 0
                    nxt[e] = heads[b]
                    heads[b] = e
                    if b:
                        occ |= np.int64(1) << (b - 1)
                    e = f
                continue
            heads[0] = nxt[e]
            nxt[e] = free
            free = e
            live -= 1
            u = item[e]
            du = dist[u]
            if float64_bits(du) != ekey[e]:
                continue  # a stale entry
        pops += 1
        a = vals[u]
        for k in range(8):
            v = u + off[k]
            dv = dist[v]
            if dv <= du:
                continue
            bv = vals[v]
            if np.isnan(bv):
                continue
            nd = du + edge_weight(kind, a, bv, steps[k])
            if nd < dv and nd <= limit:
                dist[v] = nd
                if warm and mark is not None:
                    mark[v] = 1
                if nd == du:
                    t = fh + fc
                    fifo[t if t < fcap else t - fcap] = v
                    fc += 1
                    continue
                key = float64_bits(nd)
                b = 64 - leading_zeros(key ^ last)  # (nd > du >= the last key taken)
                if free >= 0:
                    f = free
                    free = nxt[f]
                else:
                    f = used
                    used += 1
                ekey[f] = key
                item[f] = v
                nxt[f] = heads[b]
                heads[b] = f
                occ |= np.int64(1) << (b - 1)
                live += 1
    st[0], st[1], st[2], st[3], st[4], st[5], st[6] = free, used, live, last, occ, fh, fc
    return pops


MAX_SLOTS = 1 << 16  # Dial's buckets: at most this many (else the heap)


@numba.njit(cache=True)
def _bucket_width(vals, h, w, kind, steps):
    """Dial's buckets for the weights of ``kind`` on the block ``vals``: (width, slots), or (0.0, 0) for
    a heap.

    Buckets of a width no larger than every edge weight hold cells that cannot improve one another
    (Dial 1969; Delta-stepping with Delta at the least weight): the cell model's least cost times
    the shortest step, the surface model's shortest step, walk's 0.6 s a metre of the shortest step
    (Tobler's fastest slope). A relaxation lands at most hi / lo buckets ahead, so a circle of
    ``slots`` (a power of two above hi / lo + 2) holds the window; walk's hi is the steepest edge's
    time. absdiff (zero weights) and walk with friction, or a window over MAX_SLOTS: a heap."""
    if kind != CELL and kind != SURFACE and kind != WALK:
        return 0.0, 0
    lo_v, hi_v = np.inf, -np.inf
    for x in range(vals.size):  # (NaN compares false: skipped)
        a = vals[x]
        if a < lo_v:
            lo_v = a
        if a > hi_v:
            hi_v = a
    if not lo_v <= hi_v:
        return 0.0, 0
    s_lo, s_hi = np.inf, 0.0
    for k in range(8):
        s_lo = min(s_lo, steps[k])
        s_hi = max(s_hi, steps[k])
    if kind == CELL:
        lo, hi = lo_v * s_lo, hi_v * s_hi
    elif kind == SURFACE:
        lo, hi = s_lo, np.sqrt(s_hi * s_hi + (hi_v - lo_v) * (hi_v - lo_v))
    else:  # walk: the time rises with |slope + 0.05|; bound it by the steepest edge's |dh| / step
        steep = 0.0
        W2 = w + 2
        for r in range(h + 1):  # (each edge once: east, south-east, south, south-west)
            for c in range(W2):
                a = vals[r * W2 + c]
                for k in range(4):
                    cc = c + DC[k]
                    if 0 <= cc < W2:
                        t = abs(vals[(r + DR[k]) * W2 + cc] - a) / steps[k]
                        if t > steep:  # (NaN: no edge)
                            steep = t
        lo, hi = 0.6 * s_lo, walk_time(0.0, steep * s_hi, s_hi) * 1.0000001
    if not (lo > 0 and hi < np.inf) or hi / lo + 2 > MAX_SLOTS:
        return 0.0, 0
    slots = 2
    while slots < hi / lo + 2:
        slots *= 2
    return lo, slots


@numba.njit(cache=True)
def _run_buckets(vals, kind, steps, dist, off, limit, warm, mark, hk, hv, n, width, slots):
    """Dijkstra over Dial's buckets (:func:`_bucket_width`) from the heap (hk, hv) of n seeds; returns
    the pops. The seeds move from the heap into the circle of buckets as its window reaches them
    (a ring's distances may lie farther apart than the window); relaxations land inside it.

    Exact for any width: a popped cell whose distance now lies in another bucket is skipped (its
    entry there is live), and a cell improved after its pop is pushed and popped again -- the
    label-correcting search ends at the same unique fixpoint as the heap's. A cell improved within
    a bucket ahead, where it waits already, gets no second entry (cold solves: warm, a distance may
    be the earlier solve's). With the width at most every weight, second pops come only from float
    rounding and those duplicates."""
    inv = 1.0 / width
    mask = slots - 1
    head = np.full(slots, -1, np.int64)
    item = np.empty(1024, np.int64)
    nxt = np.empty(1024, np.int64)
    state = np.zeros(4, np.int64)  # free-list head, entries used, live entries, current bucket
    state[0] = -1
    pops = np.int64(0)  # (not a literal 0: see _run_heap)
    while True:
        while n > 0 and np.int64(dist[hv[0]] * inv) != np.int64(hk[0] * inv):
            heap_pop(hk, hv, n)  # a seed improved into another bucket since: its entry there is live
            n -= 1
        if state[2] == 0:
            if n == 0:
                break
            state[3] = np.int64(hk[0] * inv)  # the window jumps to the nearest seed
        while n > 0 and np.int64(hk[0] * inv) < state[3] + slots - 1 and state[2] + 8 <= item.size:
            b = np.int64(hk[0] * inv)
            if np.int64(dist[hv[0]] * inv) == b:  # (else improved into another bucket, entered there)
                _bucket_push(head, item, nxt, state, hv[0], b & mask)
            heap_pop(hk, hv, n)
            n -= 1
        stop = np.int64(hk[0] * inv) - slots + 2 if n > 0 else np.int64(2**62)
        pops = _settle_buckets(vals, kind, steps, dist, off, limit, warm, mark, head, item, nxt, state, inv, stop, pops)
        if state[2] + 8 > item.size:
            item, nxt = _doubled(item), _doubled(nxt)  # (entries keep their places: the free list holds)
    return pops


@numba.njit(cache=True)
def _settle_buckets(vals, kind, steps, dist, off, limit, warm, mark, head, item, nxt, state, inv, stop, pops):
    """The loop of :func:`_run_buckets`: pop the current bucket's cells and relax their neighbours,
    bucket after bucket, until no entry is live, the current bucket reaches ``stop`` (a seed in the
    heap may then enter the window), or the entries may lack room for a pop's pushes."""
    mask = head.size - 1
    cap = item.size
    free, used, live, k = state[0], state[1], state[2], state[3]
    while live > 0 and live + 8 <= cap and k < stop:
        s = k & mask
        e = head[s]
        if e < 0:
            k += 1
            continue
        head[s] = nxt[e]
        nxt[e] = free
        free = e
        live -= 1
        u = item[e]
        du = dist[u]
        if (np.int64(du * inv) & mask) != s:
            continue  # u has fallen to another bucket since: its entry there is live
        pops += 1
        a = vals[u]
        for kk in range(8):
            v = u + off[kk]
            dv = dist[v]
            if dv <= du:
                continue
            b = vals[v]
            if np.isnan(b):
                continue
            nd = du + edge_weight(kind, a, b, steps[kk])
            if nd < dv and nd <= limit:
                dist[v] = nd
                if warm and mark is not None:
                    mark[v] = 1
                nb = np.int64(nd * inv)
                if nb > k and np.int64(dv * inv) == nb and not warm:
                    continue  # v waits in that bucket already (not popped: the bucket is ahead; warm,
                    # dv may be the earlier solve's, in no bucket)
                if free >= 0:
                    f = free
                    free = nxt[f]
                else:
                    f = used
                    used += 1
                t = nb & mask
                item[f] = v
                nxt[f] = head[t]
                head[t] = f
                live += 1
    state[0], state[1], state[2], state[3] = free, used, live, k
    return pops


@numba.njit(cache=True)
def _settle(vals, kind, steps, dist, off, limit, warm, mark, hk, hv, n, fifo, fh, fc, pops):
    """Dijkstra's loop of :func:`solve_distances` on the heap (hk, hv) of n entries and the ring
    buffer ``fifo`` (fc cells from fh), until both are empty or one may lack room for a cell's
    pushes; returns (n, fh, fc, pops). The arrays are arguments, never replaced here: in a loop
    that may replace them (to grow) numba's code runs about twice as slowly.
    A cell reached over a zero-weight edge is final at once (no path can be shorter than the
    distance being settled): it goes to the FIFO, expanded before the heap's next pop. Flat areas
    (absdiff, zero costs) are then searched breadth-first, their frontier a line of cells; through
    the heap, whose equal keys come out last in first, it grew to every cell of the area."""
    cap = fifo.size
    while n + 8 <= hk.size and fc + 8 <= cap:
        if fc > 0:
            u = fifo[fh]
            fh = fh + 1 if fh + 1 < cap else 0
            fc -= 1
            du = dist[u]
            top = False
        elif n > 0:
            du = hk[0]
            u = hv[0]
            if du > dist[u]:
                heap_pop(hk, hv, n)  # a stale entry
                n -= 1
                continue
            top = True  # u's slot at the top is free until the first push takes it
        else:
            break
        pops += 1
        a = vals[u]
        for k in range(8):
            v = u + off[k]
            dv = dist[v]
            if dv <= du:  # settled, on the ring, or no weight can help it: skip the weight
                continue
            b = vals[v]
            if np.isnan(b):
                continue
            nd = du + edge_weight(kind, a, b, steps[k])
            if nd < dv and nd <= limit:
                dist[v] = nd
                if warm and mark is not None:
                    mark[v] = 1
                if nd == du:
                    t = fh + fc
                    fifo[t if t < cap else t - cap] = v
                    fc += 1
                elif top:
                    heap_replace(hk, hv, n, nd, v)
                    top = False
                else:
                    heap_push(hk, hv, n, nd, v)
                    n += 1
        if top:
            heap_pop(hk, hv, n)
            n -= 1
    return n, fh, fc, pops


@numba.njit(cache=True)
def _ring_cells(h, w):
    """Flat indices of the ring of an (h + 2) x (w + 2) block."""
    W2 = w + 2
    out = np.empty(2 * (w + 2) + 2 * h, np.int64)
    m = 0
    for c in range(W2):
        out[m] = c
        out[m + 1] = (h + 1) * W2 + c
        m += 2
    for r in range(1, h + 1):
        out[m] = r * W2
        out[m + 1] = r * W2 + w + 1
        m += 2
    return out


@numba.njit(cache=True)
def _doubled(a):
    """``a`` at twice the size (a heap's or the queues' entry arrays), its entries in place."""
    out = np.empty(2 * a.size, a.dtype)
    for x in range(a.size):  # (see solve_distances: no slice copy)
        out[x] = a[x]
    return out


@numba.njit(cache=True)
def _grow_ring(fifo, fh, fc):
    """The ring buffer of fc entries from fh at twice the size, its entries from 0; returns (ring, 0)."""
    out = np.empty(2 * fifo.size, np.int64)
    for x in range(fc):
        t = fh + x
        out[x] = fifo[t if t < fifo.size else t - fifo.size]
    return out, 0


@numba.njit(inline="always", cache=True)
def _tight(du, dv, a, b, kind, step):
    """Edge u -> v (values a, b; distances du, dv) lies on a shortest path: du + w == dv.
    (Scalars only: an inlined helper that takes arrays costs reference counting at every call in
    the serial builds, several times the work.)"""
    return du + edge_weight(kind, a, b, step) == dv


@numba.njit(parallel=True, cache=True)
def plateau_levels(vals, h, w, kind, steps, dist, level, sources, cells, every, out):
    """Plateau levels of the interior cells, in place in ``level`` (int32, the block's shape, flat;
    the ring's entries are given, NO_LEVEL where unknown). ``sources``: flat indices of interior
    sources. ``every``: all interior cells; else only the flat indices ``cells`` (int64), every
    other level known and final (a warm re-solve: :func:`affected_cells`). Returns the plateau
    cells (level > 0) among them, as flat indices (int64), their levels not yet known: the caller
    runs :func:`plateau_search` on them next (not called in here: a callee is optimized and compiled
    again in every kernel that calls it, in both builds of this one).
    Also writes the parent codes of the cells that need no plateau level into ``out`` (uint8,
    h x w): the first tight strictly nearer parent found, in direction order, is the least key
    (0) with the least code, so a level-0 cell's code is known here; NO_PRED at unreached cells and
    sources. :func:`predecessors` finds the codes of the plateau cells it returns."""
    W2 = w + 2
    off = _offsets(W2)
    n = h * w if every else cells.shape[0]
    # 1. level 0 where a tight parent is strictly nearer; NO_LEVEL (a plateau cell) elsewhere
    for m in prange(n):
        if every:
            r = m // w + 1
            v = r * W2 + m - (r - 1) * w + 1
        else:
            v = cells[m]
            r = v // W2
        level[v] = NO_LEVEL
        code = NO_PRED
        a, dv = vals[v], dist[v]
        if not np.isnan(a) and dv < np.inf:
            for k in range(8):
                u = v + off[k]
                du = dist[u]
                if du < dv and not np.isnan(vals[u]) and _tight(du, dv, vals[u], a, kind, steps[k]):
                    level[v] = 0
                    code = k
                    break
        out[r - 1, v - r * W2 - 1] = code
    for s in sources:
        level[s] = 0
        r = s // W2
        out[r - 1, s - r * W2 - 1] = NO_PRED
    count = 0
    for m in range(n):
        v = (m // w + 1) * W2 + m % w + 1 if every else cells[m]
        count += level[v] == NO_LEVEL and dist[v] < np.inf and not np.isnan(vals[v])
    todo = np.empty(count, np.int64)
    j = 0
    for m in range(n):
        v = (m // w + 1) * W2 + m % w + 1 if every else cells[m]
        if level[v] == NO_LEVEL and dist[v] < np.inf and not np.isnan(vals[v]):
            todo[j] = v
            j += 1
    return todo


@numba.njit(cache=True)
def _seed_level(vals, kind, steps, dist, level, off, v):
    """1 + the least known level of ``v``'s tight parents at its distance (NO_LEVEL: none known)."""
    best = np.int64(NO_LEVEL)
    for k in range(8):
        u = v + off[k]
        if np.isnan(vals[u]) or dist[u] != dist[v] or level[u] == NO_LEVEL:
            continue
        if _tight(dist[u], dist[v], vals[u], vals[v], kind, steps[k]) and level[u] + 1 < best:
            best = level[u] + 1
    return best


@numba.njit(cache=True)
def plateau_search(vals, h, w, kind, steps, dist, level, cells):
    """Steps 2 and 3 of :func:`plateau_levels` for ``cells`` (its result): the reached plateau cells
    (flat indices) whose level is NO_LEVEL; every other cell's level is known (final).
    Work memory, besides ``cells``: the seeds with their levels and their sort's scratch (24 bytes
    a seed, at most one a cell), then the seeds and the queue (8 bytes a cell): see SEARCH_BYTES."""
    W2 = w + 2
    off = _offsets(W2)
    count = cells.shape[0]
    # 2. a plateau cell's first level from parents already known: level-0 cells, the ring, cells
    # outside ``cells`` (plateau parents among ``cells`` are still NO_LEVEL: the search finds them).
    # Only the cells that get one seed the search; the others are reached by it, or stay unreached.
    # (Counted first, then filled: no array of every cell's seed level.)
    known = 0
    for m in range(count):
        known += _seed_level(vals, kind, steps, dist, level, off, cells[m]) < NO_LEVEL
    slevel = np.empty(known, np.uint32)
    seed = np.empty(known, np.int64)
    j = 0
    for m in range(count):
        lv = _seed_level(vals, kind, steps, dist, level, off, cells[m])
        if lv < NO_LEVEL:
            slevel[j] = lv
            seed[j] = cells[m]
            j += 1
    # stable, by level (ring levels vary)
    slevel, seed = radix_sort32_in(slevel, seed, np.empty_like(slevel), np.empty_like(seed))
    # 3. breadth-first over plateau cells, the seeds merged in by level. A queued cell is taken at
    # its current level: a seed may have lowered it since it was queued, and then the cell was
    # already expanded at that level (taking it again changes nothing). A cell is queued once.
    queue = np.empty(count, np.int64)
    head = tail = 0
    si = 0
    while True:
        if head < tail and (si >= known or level[queue[head]] <= slevel[si]):
            v = queue[head]
            lv = np.int64(level[v])
            head += 1
        elif si < known:
            v = seed[si]
            lv = np.int64(slevel[si])
            si += 1
            if lv >= level[v]:
                continue
            level[v] = lv
        else:
            break
        r = v // W2
        c = v - r * W2
        for k in range(8):
            rr, cc = r + DR[k], c + DC[k]
            if rr < 1 or rr > h or cc < 1 or cc > w:
                continue
            x = v + off[k]
            if np.isnan(vals[x]) or dist[x] != dist[v] or level[x] <= lv + 1:
                continue
            if _tight(dist[v], dist[x], vals[v], vals[x], kind, steps[k ^ 4]):
                level[x] = lv + 1
                queue[tail] = x
                tail += 1


@numba.njit(parallel=True, cache=True)
def predecessors(vals, h, w, kind, steps, dist, level, sources, out, cells):
    """Parent codes of the interior cells ``cells`` (flat indices, int64) into ``out`` (uint8,
    h x w): of the tight parents, the one with the least key (0 if strictly nearer, else its
    plateau level + 1), then the least direction code; NO_PRED at the sources (flat indices) and
    at unreached cells."""
    W2 = w + 2
    off = _offsets(W2)
    for m in prange(cells.shape[0]):
        v = cells[m]
        best = NO_PRED
        a, dv = vals[v], dist[v]
        if not np.isnan(a) and dv < np.inf:
            best_key = np.int64(2**62)
            for k in range(8):
                u = v + off[k]
                du = dist[u]
                if np.isnan(vals[u]) or not _tight(du, dv, vals[u], a, kind, steps[k]):
                    continue
                key = 0 if du < dv else np.int64(level[u]) + 1
                if key < best_key:
                    best_key = key
                    best = k
        r = v // W2
        out[r - 1, v - r * W2 - 1] = best
    for s in sources:
        r = s // W2
        out[r - 1, s - r * W2 - 1] = NO_PRED


@numba.njit(cache=True)
def affected_cells(vals, h, w, kind, steps, dist, mark):
    """After a warm :func:`solve_distances`: the interior cells whose plateau level may have changed
    (A) and those whose parent code may have (A and its interior neighbours), as flat indices.

    ``mark`` holds 1 at the cells whose distance fell and at the ring cells whose distance or level
    changed (D). A level or code depends only on the cell's and its neighbours' distances, levels
    and values, so A starts as D's interior cells and their interior neighbours (a parent's
    distance decides tightness and level 0), and grows along tight edges between cells of equal
    distance (a plateau level passes down them). Outside A nothing a level depends on changed, and
    every level there comes down a chain of cells outside A: those levels stand. ``mark`` is used
    as the work space (2: in A, 3: a code to find)."""
    W2 = w + 2
    off = _offsets(W2)
    n = (h + 2) * W2
    stack = np.empty(h * w, np.int32)  # (flat indices: the caller keeps blocks below 2^31 cells)
    top = 0
    for v in range(n):
        if mark[v] != 1:
            continue
        r = v // W2
        c = v - r * W2
        if 1 <= r <= h and 1 <= c <= w and mark[v] != 2:
            stack[top] = v
            top += 1
        for k in range(8):
            rr, cc = r + DR[k], c + DC[k]
            if rr < 1 or rr > h or cc < 1 or cc > w:
                continue
            x = v + off[k]
            if mark[x] == 0:
                mark[x] = 2
                stack[top] = x
                top += 1
    # the interior cells of D are marked 1 still: make every member of the stack a 2
    for m in range(top):
        mark[stack[m]] = 2
    # closure along tight equal-distance edges
    m = 0
    while m < top:
        v = np.int64(stack[m])
        m += 1
        if np.isnan(vals[v]) or not dist[v] < np.inf:
            continue
        r = v // W2
        c = v - r * W2
        for k in range(8):
            rr, cc = r + DR[k], c + DC[k]
            if rr < 1 or rr > h or cc < 1 or cc > w:
                continue
            x = v + off[k]
            if mark[x] == 2 or np.isnan(vals[x]) or dist[x] != dist[v]:
                continue
            if _tight(dist[v], dist[x], vals[v], vals[x], kind, steps[k ^ 4]):
                mark[x] = 2
                stack[top] = x
                top += 1
    plateau = stack[:top]
    # codes: A and its interior neighbours
    codes = np.empty(min(9 * top, h * w), np.int32)
    nc = 0
    for m in range(top):
        v = np.int64(plateau[m])
        if mark[v] == 2:
            mark[v] = 3
            codes[nc] = v
            nc += 1
        r = v // W2
        c = v - r * W2
        for k in range(8):
            rr, cc = r + DR[k], c + DC[k]
            if rr < 1 or rr > h or cc < 1 or cc > w:
                continue
            x = v + off[k]
            if mark[x] != 3 and mark[x] != 2:  # (a 2 is in A: its own turn comes)
                mark[x] = 3
                codes[nc] = x
                nc += 1
    return plateau, codes[:nc]


@numba.njit(cache=True)
def split_distances(dist, d32, out):
    """The float64 interior distances of a block as the stored float32 ``d32`` (h x w) plus
    ``out`` (int32, h x w): the float64's bit pattern less that of float64(d32), exact (a
    non-negative float64 and its nearest float32 lie at most 2^29 float64 steps apart; the bit
    patterns of non-negative floats count those steps). 0 where ``d32`` is NaN (no vertex) or not
    finite. False (``out`` unusable) when a difference does not fit, as below float32's normals."""
    h, w = d32.shape
    a = np.empty(1, np.float64)
    ai = a.view(np.int64)
    b = np.empty(1, np.float64)
    bi = b.view(np.int64)
    for r in range(h):
        for c in range(w):
            x = d32[r, c]
            if not np.isfinite(x):
                out[r, c] = 0
                continue
            a[0] = dist[r + 1, c + 1]
            b[0] = np.float64(x)
            diff = ai[0] - bi[0]
            if diff > 2**31 - 1 or diff < -(2**31):
                return False
            out[r, c] = diff
    return True


@numba.njit(cache=True)
def join_distances(d32, residual, vals, dist):
    """Inverse of :func:`split_distances`: the interior of ``dist`` (the block's shape) from the
    stored float32 distances and the residuals; +inf where ``vals`` is NaN (no vertex)."""
    h, w = d32.shape
    a = np.empty(1, np.float64)
    ai = a.view(np.int64)
    for r in range(h):
        for c in range(w):
            if np.isnan(vals[r + 1, c + 1]):
                dist[r + 1, c + 1] = np.inf
                continue
            a[0] = np.float64(d32[r, c])
            ai[0] += residual[r, c]
            dist[r + 1, c + 1] = a[0]


# Small grids (a shard method's units, small arrays) run the same functions compiled without threads.
plateau_levels_serial = serial_twin(plateau_levels)
predecessors_serial = serial_twin(predecessors)
