"""Parallel merge phase of the grid SSSP (phase 2 over the boundary graph G', all of it in memory).

The merge of Gerritsen 2012 (part III ch. 4; docs/ARCHITECTURE.md#sssp-index-pipeline) is one Dijkstra over
G' with a cluster priority queue: one
vertex settled at a time, a heap update for every grid edge it relaxes -- inherently sequential,
and on a 8192^2 DEM (28M vertices, 0.8G edges) about 45 s of a single core. Here the same
distances come from a bucketed label-correcting search (Meyer & Sanders' Delta-stepping, with
the bucket bound chosen per round as the ``batch``-th smallest cluster minimum, as in
"radius stepping"), run on all cores:

1. distances -- each round, the clusters whose smallest pending distance is within the bound
   *emit* their pending vertices below it; then every emitting cluster and its 8 neighbours
   *pull* in parallel: grid edges from the neighbours' emitters, the dense G' block rows of their
   own emitters. A cluster only writes its own vertices, so no locks are needed (a neighbour may
   read a value while it decreases: both are lengths of real paths). Any vertex that decreases
   is pending again, so the rounds stop at the one fixpoint of the relaxation equations: the
   same float64 distances the sequential Dijkstra settles (both are the minimum over all paths
   of the left-to-right sums of their edge weights).
2. labels -- the tie-breaking label of a vertex: 0 for a source, 1 for a vertex with a *tight*
   parent (d(u) + w(u, v) == d(v) exactly) at a strictly smaller distance, else its hop count
   over tight edges inside its plateau of equal distance (a level-synchronous BFS that only
   walks the plateaus, so its levels are the plateaus' depths, not the whole tree's): unique
   given the distances, so it does not depend on the order of the work. The final phase uses it
   where the sequential merge used the settle rank: along a predecessor chain (distance, label)
   strictly decreases, so chains cannot cycle across cluster borders on flat ground.
3. parents -- a vertex whose tight parent one step before it in that order (at a smaller distance
   for label 1, at label - 1 on its plateau) is across a grid edge records that edge (the
   smallest direction code when several tie), otherwise it was reached inside its cluster.

The results fill the same arrays as the sequential :func:`._pipeline_cpu.merge_run` (distance,
label in place of the rank, parent code, reached flag), which stays in use when G' must be
paged through a small memory budget.
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba import prange

from ...timings import Timings
from ..._weights_cpu import edge_weight
from ._pipeline_cpu import HOW_INTRA, HOW_NONE, HOW_SOURCE, boundary_count, crossings

NO_LABEL = np.iinfo(np.int64).max


class Seeds(NamedTuple):
    """Where the merge starts: boundary number ``t`` of cluster ``k`` at distance ``d`` (from the
    sources inside that cluster); ``src`` when the cell is a source itself."""

    k: np.ndarray
    t: np.ndarray
    d: np.ndarray
    src: np.ndarray


class Work(NamedTuple):
    """The rounds' state over the ncl clusters of B boundary cells: ``pend`` (ncl, B) bool, the
    vertex is pending (to emit); ``stamp`` (ncl, B) int32, the round (labels: the level) in which it
    last emitted; ``ckey`` (ncl) float64, the cluster's smallest pending distance (labels: 0 while
    one is pending); ``inlist`` (ncl) bool, the cluster is in the work list ``lst``; ``mark``
    (ncl) int64, the round in which it last joined ``P``; ``E``, the round's emitting clusters;
    ``P``, those and their 8 neighbours (:func:`_neighbourhood`)."""

    pend: np.ndarray
    stamp: np.ndarray
    ckey: np.ndarray
    inlist: np.ndarray
    mark: np.ndarray
    lst: np.ndarray
    E: np.ndarray
    P: np.ndarray


class Layout(NamedTuple):
    """Derived from a :class:`ClusterGrid` (:func:`_geometry`): ``ncr`` x ``ncc`` clusters, of which
    rows < ``full_r`` and columns < ``full_c`` are full c x c squares; ``TC`` chunks a row; chunks
    of 2**``lm`` clusters a side."""

    ncr: int
    ncc: int
    full_r: int
    full_c: int
    TC: int
    lm: int


class Cluster(NamedTuple):
    """One cluster (:func:`_cluster`): its row ``cr`` and column ``cc``, its place in the slots
    ``[s, a, b]``, its shape ``h`` x ``w`` and its number of boundary cells ``nb``."""

    cr: int
    cc: int
    s: int
    a: int
    b: int
    h: int
    w: int
    nb: int


@numba.njit(inline="always", cache=True)
def _via_grid(dp, xp, xv, kind, step):
    """Distance to a vertex of value xv over the grid edge from a vertex at distance dp, value xp."""
    return dp + edge_weight(kind, xp, xv, step)


@numba.njit(inline="always", cache=True)
def _via_block(du, row, t):
    """Distance to boundary cell t over the G' block row ``row`` of a vertex at distance du."""
    return du + np.float64(row[t])


@numba.njit(inline="always", cache=True)
def _earlier_parents(grid, layout, slots, cluster, t, cross):
    """The tight parents of boundary vertex t of ``cluster`` (:class:`Cluster`) that come before it:
    at a smaller distance, or sources (label 0) at its distance. Returns (the smallest such distance
    over a grid edge, its direction code -- the smallest on a tie --, the smallest over a G' block
    row of its own cluster); inf / HOW_INTRA where there is none. ``cross``: scratch of
    :func:`crossings`."""
    c, _, rows, cols, kind, steps, tab, tcnt = grid
    _, ncc, full_r, full_c, TC, lm = layout
    sD, sV, sDist, sRank, _, _ = slots
    cr, cc, s, a, b, h, w, nb = cluster
    d = sDist[s, a, b, t]
    xv = sV[s, a, b, t]
    intra = np.inf
    for u in range(nb):
        du = sDist[s, a, b, u]
        if du < intra and (du < d or sRank[s, a, b, u] == 0) and _via_block(du, sD[s, a, b, u], t) == d:
            intra = du
    grid = np.inf
    direction = HOW_INTRA
    for e in range(crossings(c, rows, cols, full_r, full_c, tab, tcnt, cr, cc, h, w, t, cross)):
        s2, a2, b2 = _slot(cross[e, 1] * ncc + cross[e, 2], ncc, lm, TC)
        t2 = cross[e, 3]
        du = sDist[s2, a2, b2, t2]
        if (du < d or sRank[s2, a2, b2, t2] == 0) and (du < grid or (du == grid and cross[e, 0] < direction)) \
                and _via_grid(du, sV[s2, a2, b2, t2], xv, kind, steps[cross[e, 0]]) == d:
            grid = du
            direction = cross[e, 0]
    return grid, direction, intra


@numba.njit(cache=True)
def _neighbourhood(E, ne, ncr, ncc, mark, rnd, P):
    """The emitting clusters and their 8 neighbours, each once, into P; returns the count."""
    n = 0
    for i in range(ne):
        k = E[i]
        cr = k // ncc
        cc = k - cr * ncc
        for y in range(max(0, cr - 1), min(ncr, cr + 2)):
            for x in range(max(0, cc - 1), min(ncc, cc + 2)):
                k2 = y * ncc + x
                if mark[k2] != rnd:
                    mark[k2] = rnd
                    P[n] = k2
                    n += 1
    return n


@numba.njit(cache=True)
def _drop_finished(lst, n, ckey, inlist):
    """Keep in the work list only the clusters that still hold pending vertices; the new count."""
    m = 0
    for i in range(n):
        k = lst[i]
        if ckey[k] < np.inf:
            lst[m] = k
            m += 1
        else:
            inlist[k] = False
    return m


@numba.njit(cache=True)
def _add_pending(lst, n, P, np_, ckey, inlist):
    """Append the clusters of P that hold pending vertices and are not listed yet; the new count."""
    for i in range(np_):
        k = P[i]
        if ckey[k] < np.inf and not inlist[k]:
            inlist[k] = True
            lst[n] = k
            n += 1
    return n


def merge_parallel(grid, slots, seeds, batch=256):
    """Phase 2 on all cores over resident G' slots (``grid``: :class:`._pipeline_cpu.ClusterGrid`;
    ``slots``: :class:`._pipeline_cpu.Slots`, slot of chunk = chunk number), from ``seeds``
    (:class:`Seeds`). Fills sDist (distance), sRank (label), sHow (parent code), sSet (reached);
    returns counters and seconds of the three stages."""
    c, rows, cols = grid.c, grid.rows, grid.cols
    B = 4 * c - 4
    ncl = -(-rows // c) * -(-cols // c)
    work = Work(np.zeros((ncl, B), np.bool_), np.full((ncl, B), -1, np.int32), np.full(ncl, np.inf),
                np.zeros(ncl, np.bool_), np.full(ncl, -1, np.int64), np.empty(ncl, np.int64),
                np.empty(ncl, np.int64), np.empty(ncl, np.int64))
    stats = {}
    timings = Timings()
    with timings.phase("distances"):
        stats["rounds"], stats["emissions"] = _distances(grid, slots, seeds, batch, work)
    with timings.phase("labels"):
        stats["levels"] = _labels(grid, slots, seeds, work)
    with timings.phase("parents"):
        stats["unlabelled"] = _parents(grid, slots)
    stats["seconds"] = tuple(timings.rounded().values())  # (distances, labels, parents)
    if stats["unlabelled"]:
        raise AssertionError(f"sssp merge: {stats['unlabelled']} reached vertices without a label")
    return stats


@numba.njit(inline="always", cache=True)
def _geometry(c, m, rows, cols):
    ncr = (rows + c - 1) // c
    ncc = (cols + c - 1) // c
    TC = (cols + c * m - 1) // (c * m)
    lm = 0
    while (1 << lm) < m:
        lm += 1
    return Layout(ncr, ncc, rows // c, cols // c, TC, lm)


@numba.njit(inline="always", cache=True)
def _slot(k, ncc, lm, TC):
    """Cluster number -> (slot, row, col in the slot's chunk), slot = chunk number."""
    cr = k // ncc
    cc = k - cr * ncc
    tr = cr >> lm
    tc = cc >> lm
    return tr * TC + tc, cr - (tr << lm), cc - (tc << lm)


@numba.njit(inline="always", cache=True)
def _emitter(cross, e, stamp, now, ncc, lm, TC):
    """The far end of crossing e (a row of :func:`crossings`) if it emitted in round (or level)
    ``now``: its slot position and boundary number (s2, a2, b2, t2); s2 = -1 if it did not."""
    k2 = cross[e, 1] * ncc + cross[e, 2]
    t2 = cross[e, 3]
    if stamp[k2, t2] != now:
        return -1, 0, 0, t2
    s2, a2, b2 = _slot(k2, ncc, lm, TC)
    return s2, a2, b2, t2


@numba.njit(inline="always", cache=True)
def _cluster(k, c, rows, cols, ncc, lm, TC):
    """Cluster k: its :class:`Cluster` (row and column, slot position, shape, boundary cells)."""
    cr = k // ncc
    cc = k - cr * ncc
    s, a, b = _slot(k, ncc, lm, TC)
    h = min(c, rows - cr * c)
    w = min(c, cols - cc * c)
    return Cluster(cr, cc, s, a, b, h, w, boundary_count(h, w))


@numba.njit(parallel=True, cache=True)
def _distances(grid, slots, seeds, batch, work):
    """Stage 1: distances by bucketed label-correcting rounds. Returns (rounds, emissions)."""
    c, m, rows, cols, kind, steps, tab, tcnt = grid
    sD, sV, sDist = slots.sD, slots.sV, slots.sDist
    seed_k, seed_t, seed_d = seeds.k, seeds.t, seeds.d
    pend, stamp, ckey, inlist, mark, lst, E, P = work
    B = 4 * c - 4
    ncr, ncc, full_r, full_c, TC, lm = _geometry(c, m, rows, cols)
    n = 0
    for i in range(seed_k.shape[0]):
        k = seed_k[i]
        s, a, b = _slot(k, ncc, lm, TC)
        if seed_d[i] < sDist[s, a, b, seed_t[i]]:
            sDist[s, a, b, seed_t[i]] = seed_d[i]
        pend[k, seed_t[i]] = True
        ckey[k] = min(ckey[k], sDist[s, a, b, seed_t[i]])
        if not inlist[k]:
            inlist[k] = True
            lst[n] = k
            n += 1

    # Delta-stepping phases: the bound theta is set from the work list (the batch-th smallest
    # cluster key); the rounds under it touch only the clusters around the emitting ones.
    rnd = 0
    emissions = 0
    while n > 0:
        n = _drop_finished(lst, n, ckey, inlist)
        if n == 0:
            break
        keys = ckey[lst[:n]]
        theta = np.partition(keys, batch)[batch] if n > batch else keys.max()
        ne = 0
        for i in range(n):
            if ckey[lst[i]] <= theta:
                E[ne] = lst[i]
                ne += 1
        while ne > 0:
            rnd += 1
            for i in prange(ne):
                k = E[i]
                s, a, b = _slot(k, ncc, lm, TC)
                for t in range(B):
                    if pend[k, t] and sDist[s, a, b, t] <= theta:
                        pend[k, t] = False
                        stamp[k, t] = rnd
            np_ = _neighbourhood(E, ne, ncr, ncc, mark, rnd, P)
            emitted = 0
            for i in prange(np_):
                k = P[i]
                cr, cc, s, a, b, h, w, nb = _cluster(k, c, rows, cols, ncc, lm, TC)
                dv = sDist[s, a, b]
                cross = np.empty((8, 4), np.int64)
                own = 0
                for t in range(nb):
                    if stamp[k, t] == rnd:
                        own += 1
                    xv = sV[s, a, b, t]
                    if np.isnan(xv):
                        continue
                    for e in range(crossings(c, rows, cols, full_r, full_c, tab, tcnt, cr, cc, h, w, t, cross)):
                        s2, a2, b2, t2 = _emitter(cross, e, stamp, rnd, ncc, lm, TC)
                        if s2 < 0:
                            continue
                        nd = _via_grid(sDist[s2, a2, b2, t2], sV[s2, a2, b2, t2], xv, kind, steps[cross[e, 0]])
                        if nd < dv[t]:
                            dv[t] = nd
                            pend[k, t] = True
                if own:
                    emitted += own
                    for u in range(nb):
                        if stamp[k, u] != rnd:
                            continue
                        du = dv[u]
                        row = sD[s, a, b, u]
                        for t in range(nb):
                            nd = _via_block(du, row, t)
                            if nd < dv[t]:
                                dv[t] = nd
                                pend[k, t] = True
                key = np.inf
                for t in range(nb):
                    if pend[k, t] and dv[t] < key:
                        key = dv[t]
                ckey[k] = key
            emissions += emitted
            n = _add_pending(lst, n, P, np_, ckey, inlist)
            ne = 0
            for i in range(np_):
                k = P[i]
                if ckey[k] <= theta and ckey[k] < np.inf:
                    E[ne] = k
                    ne += 1
    return rnd, emissions


@numba.njit(parallel=True, cache=True)
def _labels(grid, slots, seeds, work):
    """Stage 2: labels (sources 0; 1 with a tight parent at a smaller distance; else hop levels of
    a BFS over the tight edges of equal-distance plateaus). Returns the levels. A label-1 vertex gets
    its parent code here, as the sequential Dijkstra settles it: intra-cluster when a source inside
    its own cluster reaches it first, else the tight parent at the smallest distance (a source
    counting as smaller), a grid edge on a tie with a block edge."""
    c, m, rows, cols, kind, steps, tab, tcnt = grid
    sD, sV, sDist, sRank, sHow, _ = slots
    seed_k, seed_t, seed_d, seed_src = seeds
    pend, stamp, ckey, inlist, mark, lst, E, P = work
    layout = _geometry(c, m, rows, cols)
    ncr, ncc, full_r, full_c, TC, lm = layout
    B = 4 * c - 4
    stamp[:] = -1
    pend[:] = False
    inlist[:] = False
    mark[:] = -1
    ckey[:] = np.inf
    sRank[:] = NO_LABEL
    for i in range(seed_k.shape[0]):
        k = seed_k[i]
        s, a, b = _slot(k, ncc, lm, TC)
        t = seed_t[i]
        if seed_src[i]:
            sRank[s, a, b, t] = 0
        elif sDist[s, a, b, t] == seed_d[i]:  # reached first inside the source's cluster
            sRank[s, a, b, t] = min(sRank[s, a, b, t], 1)
            sHow[s, a, b, t] = HOW_INTRA
        else:
            continue
        pend[k, t] = True
        ckey[k] = 0.0
    # label 1: a tight parent at a strictly smaller distance (or a source at the same), over a grid
    # edge or a G' block row (labels written here are 1, never the 0 that _earlier_parents reads,
    # so the parents found do not depend on the order)
    for k in prange(ncr * ncc):
        cluster = _cluster(k, c, rows, cols, ncc, lm, TC)
        s, a, b, nb = cluster.s, cluster.a, cluster.b, cluster.nb
        lab = sRank[s, a, b]
        cross = np.empty((8, 4), np.int64)
        for t in range(nb):
            if sDist[s, a, b, t] == np.inf or lab[t] <= 1:
                continue
            over_grid, direction, intra = _earlier_parents(grid, layout, slots, cluster, t, cross)
            if min(over_grid, intra) < np.inf:
                lab[t] = 1
                sHow[s, a, b, t] = direction if over_grid <= intra else HOW_INTRA
                pend[k, t] = True
                ckey[k] = 0.0
    n = 0
    for k in range(ncr * ncc):
        if ckey[k] == 0.0:
            inlist[k] = True
            lst[n] = k
            n += 1
    level = 0
    while n > 0:
        for i in prange(n):
            k = lst[i]
            s, a, b = _slot(k, ncc, lm, TC)
            emits = False
            for t in range(B):
                if pend[k, t] and sRank[s, a, b, t] == level:
                    pend[k, t] = False
                    stamp[k, t] = level
                    emits = True
            E[i] = k if emits else -1
        ne = 0
        for i in range(n):
            if E[i] >= 0:
                E[ne] = E[i]
                ne += 1
        np_ = _neighbourhood(E, ne, ncr, ncc, mark, level, P)
        for i in prange(np_):
            k = P[i]
            cr, cc, s, a, b, h, w, nb = _cluster(k, c, rows, cols, ncc, lm, TC)
            dv = sDist[s, a, b]
            lab = sRank[s, a, b]
            cross = np.empty((8, 4), np.int64)
            for t in range(nb):
                if lab[t] <= level + 1 or dv[t] == np.inf:
                    continue
                xv = sV[s, a, b, t]
                for e in range(crossings(c, rows, cols, full_r, full_c, tab, tcnt, cr, cc, h, w, t, cross)):
                    s2, a2, b2, t2 = _emitter(cross, e, stamp, level, ncc, lm, TC)
                    if s2 < 0:
                        continue
                    du = sDist[s2, a2, b2, t2]
                    if du == dv[t] and _via_grid(du, sV[s2, a2, b2, t2], xv, kind, steps[cross[e, 0]]) == dv[t]:
                        lab[t] = level + 1
                        pend[k, t] = True
                        break
            for u in range(nb):
                if stamp[k, u] != level:
                    continue
                row = sD[s, a, b, u]
                for t in range(nb):
                    if lab[t] > level + 1 and dv[t] == dv[u] and _via_block(dv[u], row, t) == dv[t]:
                        lab[t] = level + 1
                        pend[k, t] = True
            key = np.inf
            for t in range(nb):
                if pend[k, t]:
                    key = 0.0
            ckey[k] = key
        n = _add_pending(lst, _drop_finished(lst, n, ckey, inlist), P, np_, ckey, inlist)
        level += 1
    return level


@numba.njit(parallel=True, cache=True)
def _parents(grid, slots):
    """Stage 3: parent codes and reached flags; labels of unreached vertices become -1.
    Returns the number of reached vertices without a label (0 unless there is a bug).

    A label-1 vertex keeps the parent code that :func:`_labels` chose as the sequential Dijkstra
    settles it, so both merges pick the same seeds for the final phase (and give the same final
    distances) unless two parents of different kinds lie at exactly the same distance."""
    c, m, rows, cols, kind, steps, tab, tcnt = grid
    _, sV, sDist, sRank, sHow, sSet = slots
    ncr, ncc, full_r, full_c, TC, lm = _geometry(c, m, rows, cols)
    B = 4 * c - 4
    ncl = ncr * ncc
    bad = 0
    for k in prange(ncl):
        cr, cc, s, a, b, h, w, nb = _cluster(k, c, rows, cols, ncc, lm, TC)
        cross = np.empty((8, 4), np.int64)
        for t in range(B):
            lab = sRank[s, a, b, t]
            if t >= nb or lab == NO_LABEL:
                sSet[s, a, b, t] = False
                sHow[s, a, b, t] = HOW_NONE
                sRank[s, a, b, t] = -1
                if t < nb and sDist[s, a, b, t] < np.inf:  # cannot happen: every reached vertex has a label
                    bad += 1
                continue
            sSet[s, a, b, t] = True
            if lab == 0:
                sHow[s, a, b, t] = HOW_SOURCE
                continue
            if lab == 1:  # its parent code is the labels stage's
                continue
            # on a plateau: a grid parent at the same distance labelled one less
            best = HOW_INTRA
            xv = sV[s, a, b, t]
            d = sDist[s, a, b, t]
            for e in range(crossings(c, rows, cols, full_r, full_c, tab, tcnt, cr, cc, h, w, t, cross)):
                s2, a2, b2 = _slot(cross[e, 1] * ncc + cross[e, 2], ncc, lm, TC)
                t2 = cross[e, 3]
                du = sDist[s2, a2, b2, t2]
                if du == d and sRank[s2, a2, b2, t2] == lab - 1 and cross[e, 0] < best and _via_grid(
                        du, sV[s2, a2, b2, t2], xv, kind, steps[cross[e, 0]]) == d:
                    best = cross[e, 0]
            sHow[s, a, b, t] = best
    return bad
