"""numba kernels of depression filling (``terrain fill``): tile floods, the boundary solve, lakes.

Blocks and tiles
    A *block* is a window of whole tiles read with a one-cell halo: ``vals``, ``ok`` (vertex
    mask, False outside the DEM) and ``outlet`` (cells joined to the outside vertex O) all have the
    block's shape (h + 2, w + 2); tile ``t`` covers ``[1 + i0 : 1 + i0 + th, 1 + j0 : 1 + j0 + tw]``
    of them (``tiles[t] = i0, j0, th, tw``). A tile's *perimeter* cells are numbered by
    :func:`perimeter_id`; its B perimeter cells are nodes ``1 + offset[tile] + id`` of the
    boundary graph, node 0 is O.

Tile flood (phases 1 and 3)
    Priority-Flood (Barnes, Lehman & Mulla 2014, with the plain queue for cells at or below the
    current level, their "Priority-Flood+") inside the tile alone, seeded with every perimeter
    cell at its own elevation (label = its perimeter id) and every outlet cell inside (label B,
    the tile's share of O). It gives each cell ``fl`` = the least, over seeds, of the highest
    elevation on a path inside the tile to that seed, and ``lab`` = the seed reached.

Exactness (Barnes 2016, "Parallel Priority-Flood", in minimax terms)
    With G(b) the fill level of perimeter cell b, F(v) = max(fl(v), G(lab(v))) exactly: F(v) <=
    max(fl(v), G(lab)) along the flood's path, and for any seed b, G(lab) <= max(fl(v), m(v, b),
    G(b)) where fl(v) <= m(v, b) (m: the in-tile minimax), so max(fl, G(lab)) <= F(v).
    G comes from the boundary graph: per tile the minimum spanning forest of its labels' graph
    (edge between touching labels weighing max(fl(x), fl(y)): it keeps the in-tile minimax between
    perimeter cells), cross-tile cell edges max(h_i, h_j), and perimeter outlets joined to O with
    h. Minimax distances to O over that graph (Kruskal, :func:`solve_levels`) are the G(b).

Lakes
    Cells with F > h (8-connected) form depressions; tile-local components are joined across tile
    edges through the perimeter nodes and numbered 1, 2, ... by their least cell id (row-major):
    the same ids for every tile size, budget and device.
"""
from __future__ import annotations

import numba
import numpy as np

from ...jit import in_threads
from ...unionfind import find
from ...weights import DC, DR
from .._heap_cpu import heap_pop, heap_push

LABEL = np.int16  # a flood label: a perimeter id (< 4 x 8192, the largest tile), B or -1


@numba.njit(inline="always", cache=True)
def perimeter_count(h, w):
    if h == 1:
        return w
    if w == 1:
        return h
    return 2 * w + 2 * (h - 2)


@numba.njit(inline="always", cache=True)
def perimeter_id(i, j, h, w):
    """Index of tile cell (i, j) among the tile's perimeter cells (top row, bottom row, left column,
    right column), -1 inside."""
    if i == 0:
        return j
    if i == h - 1:
        return w + j
    if j == 0:
        return 2 * w + i - 1
    if j == w - 1:
        return 2 * w + h - 2 + i - 1
    return -1


@numba.njit(nogil=True, cache=True)
def outlets_serial(ok, gr0, gc0, rows, cols, nodata_drains):
    """Cells joined to O: valid cells on the DEM's edge, or (``nodata_drains``) next to a non-vertex.
    ``gr0, gc0``: global cell of the block's [1, 1]. One thread; :func:`outlets` in threads."""
    H, W = ok.shape
    out = np.zeros((H, W), np.bool_)
    for a in range(1, H - 1):
        r = gr0 + a - 1
        for b in range(1, W - 1):
            if not ok[a, b]:
                continue
            c = gc0 + b - 1
            if r == 0 or c == 0 or r == rows - 1 or c == cols - 1:
                out[a, b] = True
            elif nodata_drains:
                for d in range(8):
                    if not ok[a + DR[d], b + DC[d]]:
                        out[a, b] = True
                        break
    return out


def outlets(ok, gr0, gc0, rows, cols, nodata_drains):
    """:func:`outlets_serial` in threads, each on a band of rows (with a row of halo either side)."""
    H, W = ok.shape
    out = np.zeros((H, W), np.bool_)

    def band(c, lo, hi):  # the block's rows 1 + lo .. hi
        out[1 + lo : 1 + hi] = outlets_serial(ok[lo : hi + 2], gr0 + lo, gc0, rows, cols, nodata_drains)[1:-1]

    in_threads(max(H - 2, 0), band)
    return out


@numba.njit(nogil=True, cache=True)
def flood_tile(vals, ok, outlet, i0, j0, th, tw, fl, lab):
    """Priority-Flood+ of one tile from its perimeter and outlets (module docstring); fills ``fl``
    (the block's dtype) and ``lab`` (LABEL: perimeter id, B for an outlet inside, -1 unreached)."""
    B = perimeter_count(th, tw)
    n = th * tw
    hv = np.empty(n, vals.dtype)
    hi = np.empty(n, np.int32)
    pit = np.empty(n, np.int32)
    size = 0
    for i in range(th):
        for j in range(tw):
            lab[i, j] = -1
            a, b = 1 + i0 + i, 1 + j0 + j
            if not ok[a, b]:
                continue
            p = perimeter_id(i, j, th, tw)
            if p >= 0 or outlet[a, b]:
                lab[i, j] = p if p >= 0 else B
                fl[i, j] = vals[a, b]
                heap_push(hv, hi, size, vals[a, b], i * tw + j)
                size += 1
    head = 0
    tail = 0
    while True:
        if head < tail:
            c = pit[head]
            head += 1
        elif size > 0:
            c = hi[0]
            heap_pop(hv, hi, size)
            size -= 1
        else:
            break
        ci = c // tw
        cj = c - ci * tw
        lev = fl[ci, cj]
        lc = lab[ci, cj]
        for d in range(8):
            ni = ci + DR[d]
            nj = cj + DC[d]
            if ni < 0 or nj < 0 or ni >= th or nj >= tw or lab[ni, nj] >= 0:
                continue
            a, b = 1 + i0 + ni, 1 + j0 + nj
            if not ok[a, b]:
                continue
            lab[ni, nj] = lc
            v = vals[a, b]
            if v <= lev:
                fl[ni, nj] = lev
                pit[tail] = ni * tw + nj
                tail += 1
            else:
                fl[ni, nj] = v
                heap_push(hv, hi, size, v, ni * tw + nj)
                size += 1


@numba.njit(nogil=True, cache=True)
def boundary_node(gr, gc, rows, cols, T, ntc, offset):
    """Boundary-graph node of global perimeter cell (gr, gc)."""
    tr, tc = gr // T, gc // T
    th = min(T, rows - tr * T)
    tw = min(T, cols - tc * T)
    return 1 + offset[tr * ntc + tc] + perimeter_id(gr - tr * T, gc - tc * T, th, tw)


@numba.njit(nogil=True, cache=True)
def tile_pairs(fl, lab):
    """The touching label pairs of a flooded tile (:func:`flood_tile`'s ``fl``/``lab``), forward
    directions: (weights in the DEM's type -- the higher flood level of the two cells --, label a,
    label b), for :func:`tile_graph`'s Kruskal."""
    th, tw = lab.shape
    cw, ca, cb = np.empty(0, fl.dtype), np.empty(0, np.int32), np.empty(0, np.int32)
    m = 0
    for collect in range(2):  # count the touching label pairs, then collect them: scratch of their size only
        if collect:
            cw, ca, cb, m = np.empty(m, fl.dtype), np.empty(m, np.int32), np.empty(m, np.int32), 0
        for i in range(th):
            for j in range(tw):
                la = lab[i, j]
                if la < 0:
                    continue
                for d in range(4):
                    ni, nj = i + DR[d], j + DC[d]
                    if ni < 0 or nj < 0 or ni >= th or nj >= tw:
                        continue
                    lb = lab[ni, nj]
                    if lb < 0 or lb == la:
                        continue
                    if collect:
                        cw[m] = max(fl[i, j], fl[ni, nj])
                        ca[m] = la
                        cb[m] = lb
                    m += 1
    return cw, ca, cb


@numba.njit(nogil=True, cache=True)
def tile_graph(vals, ok, outlet, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, cw, ca, cb, order, eu, ev,
               ew):
    """The tile's edges of the boundary graph (module docstring), from its label pairs
    (:func:`tile_pairs`) in ``order`` (a stable argsort of their weights ``cw``: numpy's, in the
    Python caller -- a sort in here compiles a radix sort into the kernel); returns their count.
    Edges: the minimum spanning forest of its labels' graph (Kruskal), perimeter outlets to O, and
    cross-tile edges in the forward directions E, SE, S, SW."""
    B = perimeter_count(th, tw)
    tr, tc = (gr0 + i0) // T, (gc0 + j0) // T
    base = 1 + offset[tr * ntc + tc]
    parent = np.empty(B + 1, np.int32)  # (loops, not np.arange: three signatures of it cost ~0.4 s to compile)
    for x in range(B + 1):
        parent[x] = x
    k = 0
    for q in order:
        ra, rb = find(parent, ca[q]), find(parent, cb[q])
        if ra == rb:
            continue
        parent[ra] = rb
        eu[k] = 0 if ca[q] == B else base + ca[q]
        ev[k] = 0 if cb[q] == B else base + cb[q]
        ew[k] = cw[q]
        k += 1
    for i in range(th):
        for j in range(tw):
            p = perimeter_id(i, j, th, tw)
            a, b = 1 + i0 + i, 1 + j0 + j
            if p < 0 or not ok[a, b]:
                continue
            if outlet[a, b]:
                eu[k] = base + p
                ev[k] = 0
                ew[k] = vals[a, b]
                k += 1
            for d in range(4):
                ni, nj = i + DR[d], j + DC[d]
                if 0 <= ni < th and 0 <= nj < tw:
                    continue
                if not ok[a + DR[d], b + DC[d]]:
                    continue
                eu[k] = base + p
                ev[k] = boundary_node(gr0 + i0 + ni, gc0 + j0 + nj, rows, cols, T, ntc, offset)
                ew[k] = max(vals[a, b], vals[a + DR[d], b + DC[d]])
                k += 1
    return k


def graph_batch(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, fl, lab, keep, threads=None):
    """Phase 1 of a block: flood every tile (in threads, chunks of tiles: :func:`_graph_tiles`) and emit
    its boundary-graph edges. ``keep``: write the floods into the block-shaped ``fl``/``lab`` (held for
    phase 3), else they are scratch. Returns (counts, eu, ev, ew) with one row of edges per tile."""
    out = _graph_outputs(tiles.shape[0], T)
    in_threads(tiles.shape[0], lambda c, lo, hi: _graph_tiles(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc,
                                                              offset, fl, lab, keep, out, lo, hi), threads)
    return out


def _graph_outputs(n, T):
    """:func:`graph_batch`'s result arrays for ``n`` tiles of side ``T``: (counts, eu, ev, ew)."""
    cap = 6 * 4 * T + 8
    return (np.zeros(n, np.int64), np.empty((n, cap), np.int64), np.empty((n, cap), np.int64),
            np.empty((n, cap), np.float64))


def solve_levels(n_nodes, eu, ev, ew):
    """G: the minimax distance of every node to O (node 0) -- Kruskal with member lists: when a
    component joins O's at weight w, each of its nodes gets w. NaN: no path to O. The edges in the
    order of a stable argsort of ``ew`` (numpy's: no sort compiled into the kernel), then
    :func:`_solve_levels`."""
    return _solve_levels(n_nodes, eu, ev, ew, np.argsort(ew, kind="stable"))


@numba.njit(nogil=True, cache=True)
def _solve_levels(n_nodes, eu, ev, ew, order):
    """:func:`solve_levels`' Kruskal, the edges taken in ``order``."""
    G = np.full(n_nodes, np.nan)
    G[0] = -np.inf
    parent = np.empty(n_nodes, eu.dtype)
    nxt = np.full(n_nodes, -1, eu.dtype)
    tail = np.empty(n_nodes, eu.dtype)
    for x in range(n_nodes):
        parent[x] = x
        tail[x] = x
    for q in order:
        ra, rb = find(parent, eu[q]), find(parent, ev[q])
        if ra == rb:
            continue
        oa, ob = ra == find(parent, 0), rb == find(parent, 0)
        if oa or ob:
            x = rb if oa else ra
            while x >= 0:
                G[x] = ew[q]
                x = nxt[x]
        if ob:
            ra, rb = rb, ra
        # rb survives; ra's list hangs after it (for O's component the lists are not needed)
        parent[ra] = rb
        if not (oa or ob):
            nxt[tail[rb]] = ra
            tail[rb] = tail[ra]
    return G


# -- phase 3 -------------------------------------------------------------------------------------
@numba.njit(inline="always", cache=True)
def two_sum(a, b):
    """``a + b`` rounded and its rounding error, exactly (Knuth's TwoSum)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@numba.njit(nogil=True, cache=True)
def final_tile(vals, ok, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, G, fl, lab, filled, depth, dep):
    """F = max(fl, G(lab)) of one tile into ``fl`` (and ``filled``, and ``depth`` unless it is
    empty: the caller then derives it from ``fl`` and ``vals``), its lakes labelled 1..n in ``dep`` by first cell in
    row-major order (union-find on W, NW, N, NE); returns n."""
    B = perimeter_count(th, tw)
    with_depth = depth.shape[0] > 0
    tr, tc = (gr0 + i0) // T, (gc0 + j0) // T
    base = 1 + offset[tr * ntc + tc]
    parent = np.empty(th * tw, np.int64)
    for i in range(th):
        for j in range(tw):
            a, b = 1 + i0 + i, 1 + j0 + j
            dep[i, j] = 0
            if not ok[a, b]:
                filled[i, j] = vals[a, b]
                if with_depth:
                    depth[i, j] = np.nan
                continue
            la = lab[i, j]
            h = vals[a, b]
            f = fl[i, j]
            if la < 0:
                f = h
            elif la < B:
                g = G[base + la]
                if g != g:  # an island with no way to O: left as it is
                    f = h
                elif g > f:
                    fl[i, j] = g  # exact: G is an elevation of the DEM
                    f = fl[i, j]
            fl[i, j] = f
            filled[i, j] = f
            if with_depth:
                depth[i, j] = np.float32(np.float64(f) - np.float64(h))
            if f > h:
                x = i * tw + j
                parent[x] = x
                for d in range(4, 8):  # W, NW, N, NE: already scanned
                    ni, nj = i + DR[d], j + DC[d]
                    if ni < 0 or nj < 0 or nj >= tw or dep[ni, nj] == 0:
                        continue
                    ry, rx = find(parent, ni * tw + nj), find(parent, x)
                    if ry != rx:
                        if ry < rx:
                            parent[rx] = ry
                        else:
                            parent[ry] = rx
                dep[i, j] = 1
    n = 0
    for i in range(th):
        for j in range(tw):
            if dep[i, j] == 0:
                continue
            x = i * tw + j
            r = find(parent, x)
            if r == x:
                n += 1
                dep[i, j] = n
            else:
                dep[i, j] = dep[r // tw, r - (r // tw) * tw]
    return n


@numba.njit(nogil=True, cache=True)
def lake_stats(vals, ok, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, G, fl, dep, c0, st_i, st_f,
               links, nlinks):
    """Statistics of a tile's lakes (``dep`` 1..n) into rows ``c0 + k - 1`` of ``st_i`` (least cell
    id, cells, pit cell, spill cell) and ``st_f`` (level, volume hi/lo in depth x cells, max depth,
    pit elevation); and ``links``: (node, lake row) for each perimeter lake cell, (-1 - node of the
    neighbour, lake row) for a lake cell across the tile edge (forward directions)."""
    tr, tc = (gr0 + i0) // T, (gc0 + j0) // T
    base = 1 + offset[tr * ntc + tc]
    k = 0
    for i in range(th):
        for j in range(tw):
            lk = dep[i, j]
            if lk == 0:
                continue
            row = c0 + lk - 1
            a, b = 1 + i0 + i, 1 + j0 + j
            gid = np.int64(gr0 + i0 + i) * cols + gc0 + j0 + j
            h = vals[a, b]
            f = fl[i, j]
            if st_i[row, 1] == 0:
                st_i[row, 0] = gid
                st_i[row, 2] = gid
                st_i[row, 3] = -1
                st_f[row, 0] = f
                st_f[row, 1] = 0.0
                st_f[row, 2] = 0.0
                st_f[row, 3] = 0.0
                st_f[row, 4] = h
            st_i[row, 1] += 1
            dd = np.float64(f) - np.float64(h)
            s, e = two_sum(st_f[row, 1], dd)
            st_f[row, 1] = s
            st_f[row, 2] += e
            if dd > st_f[row, 3]:
                st_f[row, 3] = dd
            if h < st_f[row, 4]:
                st_f[row, 4] = h
                st_i[row, 2] = gid
            for d in range(8):  # spill candidates: neighbours at the lake's level (never in the lake)
                if ok[a + DR[d], b + DC[d]] and vals[a + DR[d], b + DC[d]] == f:
                    sid = np.int64(gr0 + i0 + i + DR[d]) * cols + gc0 + j0 + j + DC[d]
                    if st_i[row, 3] < 0 or sid < st_i[row, 3]:
                        st_i[row, 3] = sid
            p = perimeter_id(i, j, th, tw)
            if p < 0:
                continue
            links[k, 0] = base + p
            links[k, 1] = row
            k += 1
            for d in range(4):
                ni, nj = i + DR[d], j + DC[d]
                if (0 <= ni < th and 0 <= nj < tw) or not ok[a + DR[d], b + DC[d]]:
                    continue
                q = boundary_node(gr0 + i0 + ni, gc0 + j0 + nj, rows, cols, T, ntc, offset)
                if G[q] == G[q] and G[q] > vals[a + DR[d], b + DC[d]]:
                    links[k, 0] = -1 - q
                    links[k, 1] = row
                    k += 1
    nlinks[0] = k


def final_batch(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, G, fl, lab, held, filled, depth,
                dep, threads=None):
    """Phase 3 of a block: per tile (in threads, chunks of tiles) the flood again unless ``held``
    (``fl``/``lab`` hold phase 1's), then F, depth, local lakes (``dep``) and their statistics. Returns
    (lakes per tile, st_i, st_f, links, link counts)."""
    n = tiles.shape[0]
    nl = np.zeros(n, np.int64)
    in_threads(n, lambda c, lo, hi: _final_tiles(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, G,
                                                 fl, lab, held, filled, depth, dep, nl, lo, hi), threads)
    start = np.zeros(n + 1, np.int64)
    np.cumsum(nl, out=start[1:])
    st_i = np.zeros((start[n], 4), np.int64)
    st_f = np.zeros((start[n], 5), np.float64)
    cap = 5 * 4 * T + 8
    links = np.empty((n, cap, 2), np.int64)
    nlinks = np.zeros((n, 1), np.int64)
    in_threads(n, lambda c, lo, hi: _lake_tiles(vals, ok, tiles, gr0, gc0, rows, cols, T, ntc, offset, G, fl, dep,
                                                start, st_i, st_f, links, nlinks, lo, hi), threads)
    return nl, st_i, st_f, links, nlinks[:, 0]


def join_lakes(st_i, st_f, pairs):
    """Join tile-local lakes across tile edges (``pairs`` of their rows that touch); returns (final
    id per local lake, merged rows of the roots in id order: st_i, st_f). Ids 1, 2, ... in order of
    each lake's least cell id. The union-find in :func:`_fold_lakes`; the ids, a sort of the roots,
    in numpy (no argsort and no fancy indexing to compile)."""
    root, acc_i, acc_f = _fold_lakes(st_i, st_f, pairs)
    roots = np.flatnonzero(root == np.arange(root.shape[0]))
    roots = roots[np.argsort(acc_i[roots, 0], kind="stable")]
    rank = np.zeros(root.shape[0], np.int64)
    rank[roots] = np.arange(1, roots.shape[0] + 1)
    return rank[root].astype(np.uint32), acc_i[roots], acc_f[roots]


@numba.njit(nogil=True, cache=True)
def _fold_lakes(st_i, st_f, pairs):
    """:func:`join_lakes`' union-find: (each lake's root, the rows with each lake folded into its root)."""
    m = st_i.shape[0]
    parent = np.empty(m, np.int64)
    for x in range(m):
        parent[x] = x
    for k in range(pairs.shape[0]):
        ra, rb = find(parent, pairs[k, 0]), find(parent, pairs[k, 1])
        if ra != rb:
            if st_i[ra, 0] < st_i[rb, 0]:
                parent[rb] = ra
            else:
                parent[ra] = rb
    acc_i = st_i.copy()
    acc_f = st_f.copy()
    for x in range(m):  # fold each lake into its root (the root's own row counted once)
        r = find(parent, x)
        if r == x:
            continue
        acc_i[r, 1] += st_i[x, 1]
        s, e = two_sum(acc_f[r, 1], st_f[x, 1])
        acc_f[r, 1] = s
        acc_f[r, 2] += e + st_f[x, 2]
        acc_f[r, 3] = max(acc_f[r, 3], st_f[x, 3])
        if st_f[x, 4] < acc_f[r, 4] or (st_f[x, 4] == acc_f[r, 4] and st_i[x, 2] < acc_i[r, 2]):
            acc_f[r, 4] = st_f[x, 4]
            acc_i[r, 2] = st_i[x, 2]
        if st_i[x, 3] >= 0 and (acc_i[r, 3] < 0 or st_i[x, 3] < acc_i[r, 3]):
            acc_i[r, 3] = st_i[x, 3]
    root = np.empty(m, np.int64)
    for x in range(m):
        root[x] = find(parent, x)
    return root, acc_i, acc_f


def relabel(dep, tiles, lake_start, final):
    """Tile-local lake numbers -> final ids, in place (:func:`relabel_serial` on chunks of tiles in threads)."""
    in_threads(tiles.shape[0], lambda c, lo, hi: relabel_serial(dep, tiles[lo:hi], lake_start[lo:hi], final))


@numba.njit(nogil=True, cache=True)
def spill_targets(filled, dep, r0, c0, cols, spill, ids, out):
    """For each lake ``ids[k]`` whose spill cell ``spill[k]`` and its neighbours lie in the block
    (``filled``, ``dep``; block cell [0, 0] = global (r0, c0)): the lake holding the spill cell's
    neighbour of least (level, cell id) among its neighbours in other lakes, else 0 (it spills onto
    dry land or out of the DEM)."""
    H, W = dep.shape
    for k in range(spill.shape[0]):
        s = spill[k]
        a = s // cols - r0
        b = s - (s // cols) * cols - c0
        best = np.uint32(0)
        bl = 0.0
        bid = np.int64(-1)
        for d in range(8):
            x, y = a + DR[d], b + DC[d]
            if x < 0 or y < 0 or x >= H or y >= W or dep[x, y] == 0 or dep[x, y] == ids[k]:
                continue
            lv = np.float64(filled[x, y])
            nid = np.int64(r0 + x) * cols + c0 + y
            if best == 0 or lv < bl or (lv == bl and nid < bid):
                best, bl, bid = dep[x, y], lv, nid
        out[k] = best


# The batch loops run in Python (small DEMs, fewer than SERIAL_BELOW cells, in this thread; larger ones
# on chunks of tiles in threads, terrain_io.jit.in_threads): each tile's kernels are called with the
# same argument types (one build of each), and no build of a loop over tiles is compiled (a parallel
# one cost ~10 s of a large DEM's first fill; a call costs microseconds).


def _window(a, i0, j0, th, tw):
    """``a[i0:i0+th, j0:j0+tw]`` typed as the batch kernels slice it (numba's layout "A"): a window
    that numpy sees contiguous (a block one tile wide) is given as a strided copy, to be written
    back by :func:`_put_back`; returns (window, the view it copies or None)."""
    view = a[i0 : i0 + th, j0 : j0 + tw]
    if not view.flags.c_contiguous or th < 2:  # (a 1-row window is contiguous however it is cut)
        return view, None
    copy = _strided(view.shape, view.dtype)
    copy[...] = view
    return copy, view


def _put_back(pairs):
    for window, view in pairs:
        if view is not None:
            view[...] = window


def _strided(shape, dtype):
    """A new array of ``shape`` that numpy sees strided (numba's layout "A"), rows of 2 and more."""
    return np.empty((shape[0], shape[1] + 1), dtype)[:, : shape[1]]


def graph_batch_serial(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, fl, lab, keep):
    """:func:`graph_batch` without threads."""
    return graph_batch(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, fl, lab, keep, threads=1)


def _graph_tiles(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, fl, lab, keep, out, lo, hi):
    """:func:`graph_batch` on tiles ``lo:hi``, into their rows of ``out`` (:func:`_graph_outputs`)."""
    ne, eu, ev, ew = out
    for t in range(lo, hi):
        i0, j0, th, tw = tiles[t]
        if keep:
            pairs = [_window(fl, i0, j0, th, tw), _window(lab, i0, j0, th, tw)]
            tfl, tlab = pairs[0][0], pairs[1][0]
        else:
            pairs = []
            tfl, tlab = _strided((th, tw), vals.dtype), _strided((th, tw), LABEL)
        flood_tile(vals, ok, outlet, i0, j0, th, tw, tfl, tlab)
        cw, ca, cb = tile_pairs(tfl, tlab)
        ne[t] = tile_graph(vals, ok, outlet, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, cw, ca, cb,
                           np.argsort(cw, kind="stable"), eu[t], ev[t], ew[t])
        _put_back(pairs)


def final_batch_serial(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, G, fl, lab, held, filled, depth,
                       dep):
    """:func:`final_batch` without threads."""
    return final_batch(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, G, fl, lab, held, filled, depth,
                       dep, threads=1)


def _final_tiles(vals, ok, outlet, tiles, gr0, gc0, rows, cols, T, ntc, offset, G, fl, lab, held, filled, depth, dep,
                 nl, lo, hi):
    """:func:`final_batch`'s first loop on tiles ``lo:hi``: floods (unless held), F, depth, local lakes."""
    for t in range(lo, hi):
        i0, j0, th, tw = tiles[t]
        windows = {}  # one window per array: ``filled`` may be ``fl``, written where it is read
        for a in (fl, lab, filled, depth, dep):
            windows.setdefault(id(a), _window(a, i0, j0, th, tw))
        tfl, tlab, tfilled, tdepth, tdep = (windows[id(a)][0] for a in (fl, lab, filled, depth, dep))
        if not held:
            flood_tile(vals, ok, outlet, i0, j0, th, tw, tfl, tlab)
        nl[t] = final_tile(vals, ok, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, G, tfl, tlab, tfilled,
                           tdepth, tdep)
        _put_back(windows.values())


def _lake_tiles(vals, ok, tiles, gr0, gc0, rows, cols, T, ntc, offset, G, fl, dep, start, st_i, st_f, links, nlinks,
                lo, hi):
    """:func:`final_batch`'s second loop on tiles ``lo:hi``: each tile's lake statistics at its rows."""
    for t in range(lo, hi):
        i0, j0, th, tw = tiles[t]
        tfl, _ = _window(fl, i0, j0, th, tw)
        tdep, _ = _window(dep, i0, j0, th, tw)
        lake_stats(vals, ok, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, G, tfl, tdep, start[t], st_i, st_f,
                   links[t], nlinks[t])


def relabel_serial(dep, tiles, lake_start, final):
    """:func:`relabel` without threads (numpy, one tile at a time)."""
    for i0, j0, th, tw, s in zip(tiles[:, 0], tiles[:, 1], tiles[:, 2], tiles[:, 3], lake_start):
        d = dep[i0 : i0 + th, j0 : j0 + tw]
        lake = d != 0
        d[lake] = final[s + d[lake].astype(np.int64) - 1]
