"""numba kernels of the depression hierarchy (``terrain depressions``): descent, basins, the merge tree.

Blocks, tiles and boundary nodes are those of :mod:`..fill._cpu` (a block read with a one-cell halo,
tile ``t`` at ``[1 + i0 : 1 + i0 + th, 1 + j0 : 1 + j0 + tw]``, node ``1 + offset[tile] + perimeter
id`` of every perimeter cell). Every kernel here works on one tile and releases the GIL: a batch's
tiles run in a thread pool and each returns arrays of its own size.

Pieces and chains (both tile passes)
    A *piece* is the part inside one tile of a plateau (8-connected equal-elevation valid cells),
    found by union-find with the least cell as root (the least cell id: row-major inside a tile is
    row-major in the DEM). Per piece: its lowest strictly lower neighbour (elevation, then cell id;
    halo cells count), whether it holds an outlet, and whether it is *open* (an equal-elevation
    neighbour in the halo: the plateau goes on in another tile, so only the boundary solve knows its
    receiver). A piece's *end* follows receivers inside the tile and is encoded as an int64:
    ``-1`` the outside O; ``k >= 0`` a leaf, ``k`` its plateau's least cell id; ``-2 - n`` boundary
    node ``n`` (an open piece's perimeter cell, or a halo cell the chain steps into), which the
    boundary solve (:func:`solve_nodes`) resolves to a leaf or O.

Spill edges
    Every cell edge (forward directions E, SE, S, SW, so each once) between cells of different
    labels (0: drains to O) weighs max(h_i, h_j); per tile the least edge of each label pair in the
    strict order (weight, least cell id, other cell id) is kept (:func:`tile_labels`).
"""
from __future__ import annotations

import numba
import numpy as np

from ...weights import DC, DR
from ...unionfind import find
from ..fill._cpu import boundary_node, perimeter_id, two_sum
from .._radix_cpu import radix_argsort, radix_sort32_in

UNSET = np.int64(-(2**62))
OUTLET = np.uint8(1)
OPEN = np.uint8(2)


@numba.njit(nogil=True, cache=True)
def _pieces(vals, ok, outlet, i0, j0, th, tw, gr0, gc0, cols, par, rh, rid, rloc, flags, first):
    """Union-find of the tile's plateau pieces (``par``; -1 for non-vertices) and, at each root, the
    lowest lower neighbour (``rh`` elevation, ``rid`` cell id or -1, ``rloc`` its tile index or -1),
    ``flags`` (OUTLET, OPEN) and ``first``: the tile index of its first perimeter cell (-1 none)."""
    for i in range(th):
        for j in range(tw):
            x = i * tw + j
            a, b = 1 + i0 + i, 1 + j0 + j
            if not ok[a, b]:
                par[x] = -1
                continue
            par[x] = x
            v = vals[a, b]
            for d in range(4, 8):  # W, NW, N, NE: already scanned
                ni, nj = i + DR[d], j + DC[d]
                if ni < 0 or nj < 0 or nj >= tw or par[ni * tw + nj] < 0 or vals[a + DR[d], b + DC[d]] != v:
                    continue
                ry, rx = find(par, ni * tw + nj), find(par, x)
                if ry < rx:
                    par[rx] = ry
                elif rx < ry:
                    par[ry] = rx
    for x in range(th * tw):
        rid[x] = -1
        rloc[x] = -1
        flags[x] = 0
        first[x] = -1
    for i in range(th):
        for j in range(tw):
            x = i * tw + j
            if par[x] < 0:
                continue
            r = find(par, x)
            a, b = 1 + i0 + i, 1 + j0 + j
            v = vals[a, b]
            if outlet[a, b]:
                flags[r] |= OUTLET
            if first[r] < 0 and perimeter_id(i, j, th, tw) >= 0:
                first[r] = x
            for d in range(8):
                if not ok[a + DR[d], b + DC[d]]:
                    continue
                ni, nj = i + DR[d], j + DC[d]
                inside = 0 <= ni < th and 0 <= nj < tw
                u = vals[a + DR[d], b + DC[d]]
                if u == v:
                    if not inside:
                        flags[r] |= OPEN
                    continue
                if u > v:
                    continue
                g = np.int64(gr0 + i0 + ni) * cols + gc0 + j0 + nj
                uh = np.float64(u)
                if rid[r] < 0 or uh < rh[r] or (uh == rh[r] and g < rid[r]):
                    rh[r] = uh
                    rid[r] = g
                    rloc[r] = ni * tw + nj if inside else -1


@numba.njit(nogil=True, cache=True)
def _ends(i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, par, rid, rloc, flags, first, end):
    """Each piece root's end (module docstring), into ``end`` at the root."""
    base = 1 + offset[((gr0 + i0) // T) * ntc + (gc0 + j0) // T]
    n = th * tw
    for x in range(n):
        end[x] = UNSET
    stack = np.empty(n, np.int64)
    for x in range(n):
        if par[x] != x or end[x] != UNSET:
            continue
        top = 0
        cur = x
        while True:
            if end[cur] != UNSET:
                val = end[cur]
                break
            stack[top] = cur
            top += 1
            f = flags[cur]
            if f & OPEN:
                fi = first[cur] // tw
                val = -2 - (base + perimeter_id(fi, first[cur] - fi * tw, th, tw))
                break
            if f & OUTLET:
                val = np.int64(-1)
                break
            if rid[cur] < 0:  # a local minimum: the leaf of its least cell
                ci = cur // tw
                val = np.int64(gr0 + i0 + ci) * cols + gc0 + j0 + cur - ci * tw
                break
            if rloc[cur] >= 0:
                cur = find(par, rloc[cur])
                continue
            g = rid[cur]
            val = -2 - boundary_node(g // cols, g - (g // cols) * cols, rows, cols, T, ntc, offset)
            break
        for k in range(top):
            end[stack[k]] = val


@numba.njit(nogil=True, cache=True)
def _receiver_end(r, tw, rows, cols, T, ntc, offset, par, rid, rloc, end):
    """The end of an open piece's receiver (UNSET: none)."""
    if rid[r] < 0:
        return UNSET
    if rloc[r] >= 0:
        return end[find(par, rloc[r])]
    g = rid[r]
    return -2 - boundary_node(g // cols, g - (g // cols) * cols, rows, cols, T, ntc, offset)


def tile_pieces(vals, ok, outlet, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset):
    """A tile's plateau pieces and their receivers (:func:`_pieces`) and where each chain ends
    (:func:`_ends`), as both passes start: the tuple ``pieces`` (par, rh, rid, rloc, flags, first,
    end) that :func:`tile_chains` and :func:`tile_labels` take (each a fresh one: they compress
    ``par``). Called by the caller, not inside them: a callee is optimized and compiled again in
    every kernel that calls it, and this one is most of both (~1 s of a first run); and Python here
    (two kernel calls, microseconds), not a kernel that links both in again (~0.6 s)."""
    n = th * tw
    par = np.empty(n, np.int64)
    rh = np.empty(n, np.float64)
    rid = np.empty(n, np.int64)
    rloc = np.empty(n, np.int64)
    flags = np.empty(n, np.uint8)
    first = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    _pieces(vals, ok, outlet, i0, j0, th, tw, gr0, gc0, cols, par, rh, rid, rloc, flags, first)
    _ends(i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, par, rid, rloc, flags, first, end)
    return par, rh, rid, rloc, flags, first, end


@numba.njit(nogil=True, cache=True)
def tile_chains(vals, ok, outlet, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, pieces, tgt,
                openf):
    """Pass 1 of one tile (``pieces``: :func:`tile_pieces`): each perimeter cell's end into
    ``tgt[node]`` (``openf[node]``: in an open piece); returns the open pieces (rep node, receiver
    elevation, receiver id, receiver end, outlet, least cell id, elevation), the cross-tile
    equal-elevation edges of their cells (node pairs), and the tile's own leaves (least cell id,
    elevation)."""
    n = th * tw
    par, rh, rid, rloc, flags, first, end = pieces
    base = 1 + offset[((gr0 + i0) // T) * ntc + (gc0 + j0) // T]
    nleaf = 0
    nopen = 0
    for x in range(n):
        if par[x] == x:
            if flags[x] & OPEN:
                nopen += 1
            elif not flags[x] & OUTLET and rid[x] < 0:
                nleaf += 1
    leaf_key = np.empty(nleaf, np.int64)
    leaf_h = np.empty(nleaf, np.float64)
    o_rep = np.empty(nopen, np.int64)
    o_rh = np.empty(nopen, np.float64)
    o_rid = np.empty(nopen, np.int64)
    o_rend = np.empty(nopen, np.int64)
    o_outl = np.empty(nopen, np.bool_)
    o_least = np.empty(nopen, np.int64)
    o_h = np.empty(nopen, np.float64)
    nleaf = 0
    nopen = 0
    for x in range(n):
        if par[x] != x:
            continue
        xi = x // tw
        a, b = 1 + i0 + xi, 1 + j0 + x - xi * tw
        gid = np.int64(gr0 + i0 + xi) * cols + gc0 + j0 + x - xi * tw
        if flags[x] & OPEN:
            o_rep[nopen] = -2 - end[x]
            o_rh[nopen] = rh[x]
            o_rid[nopen] = rid[x]
            o_rend[nopen] = _receiver_end(x, tw, rows, cols, T, ntc, offset, par, rid, rloc, end)
            o_outl[nopen] = (flags[x] & OUTLET) != 0
            o_least[nopen] = gid
            o_h[nopen] = vals[a, b]
            nopen += 1
        elif not flags[x] & OUTLET and rid[x] < 0:
            leaf_key[nleaf] = gid
            leaf_h[nleaf] = vals[a, b]
            nleaf += 1
    cap = 4 * (2 * th + 2 * tw) + 4
    cu = np.empty(cap, np.int64)
    cv = np.empty(cap, np.int64)
    m = 0
    for i in range(th):
        for j in range(tw):
            p = perimeter_id(i, j, th, tw)
            x = i * tw + j
            if p < 0 or par[x] < 0:
                continue
            r = find(par, x)
            tgt[base + p] = end[r]
            is_open = (flags[r] & OPEN) != 0
            openf[base + p] = is_open
            if not is_open:
                continue
            a, b = 1 + i0 + i, 1 + j0 + j
            for d in range(4):
                ni, nj = i + DR[d], j + DC[d]
                if (0 <= ni < th and 0 <= nj < tw) or not ok[a + DR[d], b + DC[d]]:
                    continue
                if vals[a + DR[d], b + DC[d]] == vals[a, b]:
                    cu[m] = base + p
                    cv[m] = boundary_node(gr0 + i0 + ni, gc0 + j0 + nj, rows, cols, T, ntc, offset)
                    m += 1
    return (o_rep, o_rh, o_rid, o_rend, o_outl, o_least, o_h), cu[:m].copy(), cv[:m].copy(), leaf_key, leaf_h


def solve_chains(n_nodes, tgt, openf, cu, cv, o_rep, o_rh, o_rid, o_rend, o_outl, o_least, o_h, terminal, known):
    """The boundary solve of a block of boundary nodes (compact ids; ends ``-2 - n`` name them): the
    whole DEM's with no terminals, a quadtree block's (``grid/depressions/pipeline.py``) with them.
    Plateaus joined across tiles (union-find over nodes: an open node and its piece's rep ``-2 -
    tgt``, the cross-tile pairs ``cu, cv``), each plateau's receiver = the least (elevation, cell id)
    of its pieces' receivers (O if it holds an outlet; a leaf of its least cell if it has none), then
    every node's chain followed to a leaf, O, or a ``terminal`` node t, where it ends at ``known[t]``
    (a plateau holding terminals: where its first terminal does -- its receiver may lie outside).
    Returns (res: per node, leaf key >= 0, -1 for O or a known end; the keys and elevations of the
    leaves of the plateaus without terminals; per plateau with terminals and pieces here: its first
    terminal, least receiver (elevation, id, end followed), outlet, least cell id and elevation; per
    node, its plateau's first terminal, -1 none). The kernel is :func:`_solve_chains`; the gathers of
    the plateaus' rows are numpy's here (fancy indexing in a kernel compiles numba's generic gathers)."""
    res, leaf_key, leaf_h, o_term, o_end, idx, p_rh, p_rid, p_outl, p_least, p_h, first = _solve_chains(
        n_nodes, tgt, openf, cu, cv, o_rep, o_rh, o_rid, o_rend, o_outl, o_least, o_h, terminal, known)
    return res, leaf_key, leaf_h, (o_term, p_rh[idx], p_rid[idx], o_end, p_outl[idx], p_least[idx], p_h[idx]), first


@numba.njit(nogil=True, cache=True)
def _solve_chains(n_nodes, tgt, openf, cu, cv, o_rep, o_rh, o_rid, o_rend, o_outl, o_least, o_h, terminal, known):
    """:func:`solve_chains`' kernel: its results, the plateaus' rows whole with the index ``idx`` of
    those with terminals."""
    par = np.empty(n_nodes, np.int64)
    for x in range(n_nodes):
        par[x] = x
    for x in range(n_nodes):  # the open pieces' perimeter cells join their piece's rep
        if openf[x]:
            ra, rb = find(par, x), find(par, -2 - tgt[x])
            if ra != rb:
                par[max(ra, rb)] = min(ra, rb)
    for k in range(cu.shape[0]):
        ra, rb = find(par, cu[k]), find(par, cv[k])
        if ra != rb:
            par[max(ra, rb)] = min(ra, rb)
    # per plateau with pieces (slot[root]): receiver, outlet, least id, first terminal
    slot = np.full(n_nodes, -1, np.int64)
    n_pl = 0
    for k in range(o_rep.shape[0]):
        r = find(par, o_rep[k])
        if slot[r] < 0:
            slot[r] = n_pl
            n_pl += 1
    p_rh = np.full(n_pl, np.inf)
    p_rid = np.full(n_pl, -1, np.int64)
    p_rend = np.full(n_pl, UNSET, np.int64)
    p_outl = np.zeros(n_pl, np.bool_)
    p_least = np.full(n_pl, -1, np.int64)
    p_h = np.zeros(n_pl, np.float64)
    p_term = np.full(n_pl, -1, np.int64)
    for k in range(o_rep.shape[0]):
        r = slot[find(par, o_rep[k])]
        if o_outl[k]:
            p_outl[r] = True
        if p_least[r] < 0 or o_least[k] < p_least[r]:
            p_least[r] = o_least[k]
            p_h[r] = o_h[k]
        if o_rid[k] >= 0 and (p_rid[r] < 0 or o_rh[k] < p_rh[r] or (o_rh[k] == p_rh[r] and o_rid[k] < p_rid[r])):
            p_rh[r] = o_rh[k]
            p_rid[r] = o_rid[k]
            p_rend[r] = o_rend[k]
    n_open = 0
    for x in range(n_nodes):
        if terminal[x]:
            r = slot[find(par, x)]
            if r >= 0 and p_term[r] < 0:
                p_term[r] = x
                n_open += 1
    nleaf = 0
    for r in range(n_pl):
        if p_term[r] < 0 and not p_outl[r] and p_rid[r] < 0:
            nleaf += 1
    leaf_key = np.empty(nleaf, np.int64)
    leaf_h = np.empty(nleaf, np.float64)
    nleaf = 0
    for r in range(n_pl):
        if p_term[r] >= 0:
            continue
        if p_outl[r]:
            p_rend[r] = -1
        elif p_rid[r] < 0:
            p_rend[r] = p_least[r]
            leaf_key[nleaf] = p_least[r]
            leaf_h[nleaf] = p_h[r]
            nleaf += 1
    res = np.full(n_nodes, UNSET, np.int64)
    stack = np.empty(n_nodes, np.int64)
    for x in range(n_nodes):
        if res[x] != UNSET:
            continue
        top = 0
        cur = x
        while True:
            if res[cur] != UNSET:
                val = res[cur]
                break
            stack[top] = cur
            top += 1
            if terminal[cur]:
                val = known[cur]
                break
            if openf[cur]:
                r = slot[find(par, cur)]
                if p_term[r] >= 0:
                    val = known[p_term[r]]
                    break
                e = p_rend[r]
            else:
                e = tgt[cur]
            if e <= -2 and e != UNSET:
                cur = -2 - e
                continue
            val = e
            break
        for k in range(top):
            res[stack[k]] = val
    o_term = np.empty(n_open, np.int64)
    o_end = np.empty(n_open, np.int64)
    idx = np.empty(n_open, np.int64)
    n_open = 0
    for r in range(n_pl):
        if p_term[r] >= 0:
            e = p_rend[r]
            o_term[n_open] = p_term[r]
            o_end[n_open] = res[-2 - e] if e <= -2 and e != UNSET else e
            idx[n_open] = r
            n_open += 1
    for x in range(n_nodes):  # now each node's plateau's first terminal (-1: none)
        r = slot[find(par, x)]
        stack[x] = p_term[r] if r >= 0 else -1
    return res, leaf_key, leaf_h, o_term, o_end, idx, p_rh, p_rid, p_outl, p_least, p_h, stack


@numba.njit(inline="always", cache=True)
def _leaf_id(keys, k):
    """1 + the index of leaf key ``k`` in the sorted ``keys``."""
    lo, hi = 0, keys.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < k:
            lo = mid + 1
        else:
            hi = mid
    return np.uint32(lo + 1)


@numba.njit(nogil=True, cache=True)
def _label_edges(vals, ok, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, res_id, basin, emit, ka, ew, elo,
                 ehi, esad):
    """The tile's cell edges (forward directions) between different labels: counted, or (``emit``)
    written as pair key, weight, least and other cell id, saddle (the higher cell; the least id of
    two equal ones). Halo cells' labels are their nodes'."""
    m = 0
    for i in range(th):
        for j in range(tw):
            a, b = 1 + i0 + i, 1 + j0 + j
            if not ok[a, b]:
                continue
            la = basin[i, j]
            for d in range(4):
                if not ok[a + DR[d], b + DC[d]]:
                    continue
                ni, nj = i + DR[d], j + DC[d]
                gr, gc = gr0 + i0 + ni, gc0 + j0 + nj
                if 0 <= ni < th and 0 <= nj < tw:
                    lb = basin[ni, nj]
                else:
                    lb = res_id[boundary_node(gr, gc, rows, cols, T, ntc, offset)]
                if la == lb:
                    continue
                if emit:
                    lo, hi = (la, lb) if la < lb else (lb, la)
                    ka[m] = (np.uint64(lo) << np.uint64(32)) | np.uint64(hi)
                    h0, h1 = np.float64(vals[a, b]), np.float64(vals[a + DR[d], b + DC[d]])
                    g0 = np.int64(gr0 + i0 + i) * cols + gc0 + j0 + j
                    g1 = np.int64(gr) * cols + gc
                    ew[m] = max(h0, h1)
                    elo[m] = min(g0, g1)
                    ehi[m] = max(g0, g1)
                    esad[m] = g0 if h0 > h1 else (g1 if h1 > h0 else min(g0, g1))
                m += 1
    return m


def tile_labels(vals, ok, outlet, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, pieces, keys, res_id,
                basin):
    """Pass 2 of one tile (``pieces``: :func:`tile_pieces`): every cell's leaf id into ``basin`` (the
    tile's slice; 0: drains to O or a non-vertex) and the least spill edge of every label pair it
    holds (module docstring).
    ``keys``: the sorted leaf keys (id = index + 1); ``res_id``: each node's leaf id.
    Returns (a < b labels, weight, least cell id, other cell id, saddle cell) per pair.
    Four kernels called in turn (in Python: none links another in, to be compiled again there)."""
    tile_basins(th, tw, pieces, keys, res_id, basin)
    geo = (vals, ok, i0, j0, th, tw, gr0, gc0, rows, cols, T, ntc, offset, res_id, basin)
    m = _label_edges(*geo, np.bool_(False), np.empty(0, np.uint64), np.empty(0), np.empty(0, np.int64),
                     np.empty(0, np.int64), np.empty(0, np.int64))
    edges = (np.empty(m, np.uint64), np.empty(m, np.float64), np.empty(m, np.int64), np.empty(m, np.int64),
             np.empty(m, np.int64))
    _label_edges(*geo, np.bool_(True), *edges)
    idx, _ = radix_argsort(edges[0], np.arange(m, dtype=np.int64), np.empty(m, np.int64))
    return least_pair_edges(edges, idx)


@numba.njit(nogil=True, cache=True)
def tile_basins(th, tw, pieces, keys, res_id, basin):
    """Step 1 of :func:`tile_labels`: every cell's leaf id into ``basin``."""
    n = th * tw
    par, rh, rid, rloc, flags, first, end = pieces
    lab = np.empty(n, np.uint32)
    last_key, last_id = np.int64(-1), np.uint32(0)  # neighbouring roots mostly reach the same leaf
    for x in range(n):  # ends -> leaf ids, at the roots
        if par[x] != x:
            continue
        e = end[x]
        if e >= 0:
            if e != last_key:
                last_key, last_id = e, _leaf_id(keys, e)
            lab[x] = last_id
        else:
            lab[x] = 0 if e == -1 else res_id[-2 - e]
    for i in range(th):
        for j in range(tw):
            x = i * tw + j
            basin[i, j] = 0 if par[x] < 0 else lab[find(par, x)]


@numba.njit(nogil=True, cache=True)
def least_pair_edges(edges, idx):
    """Step 3 of :func:`tile_labels`: the least spill edge of each label pair, from the tile's label
    edges ``edges`` (pair key, weight, least cell id, other cell id, saddle) in pair-key order ``idx``."""
    ka, ew, elo, ehi, esad = edges
    m = idx.shape[0]
    npair = 0
    for q in range(m):
        if q == 0 or ka[idx[q]] != ka[idx[q - 1]]:
            npair += 1
    pa = np.empty(npair, np.uint32)
    pb = np.empty(npair, np.uint32)
    pw = np.empty(npair, np.float64)
    plo = np.empty(npair, np.int64)
    phi = np.empty(npair, np.int64)
    psad = np.empty(npair, np.int64)
    k = -1
    for q in range(m):
        e = idx[q]
        if q == 0 or ka[e] != ka[idx[q - 1]]:
            k += 1
            pa[k] = np.uint32(ka[e] >> np.uint64(32))
            pb[k] = np.uint32(ka[e] & np.uint64(0xFFFFFFFF))
        elif not (ew[e] < pw[k] or (ew[e] == pw[k] and (elo[e] < plo[k] or (elo[e] == plo[k] and ehi[e] < phi[k])))):
            continue
        pw[k] = ew[e]
        plo[k] = elo[e]
        phi[k] = ehi[e]
        psad[k] = esad[e]
    return pa, pb, pw, plo, phi, psad


@numba.njit(nogil=True, cache=True)
def build_tree(n_leaves, ea, eb, ew, es, leaf_h, leaf_key):
    """Kruskal over the basin graph (basin 0 = the outside), edges in strict order: the merge tree.
    Nodes 1..n_leaves are the leaves, later ones merges in order of creation (a parent's id is above
    its children's). Returns, per node (index 0 unused): parent (0: the outside or none), spill
    elevation (NaN: never spills), spill cell (-1), spills_to (0: the outside), merge elevation of a
    merge node (NaN for leaves), pit cell and its elevation (the lowest leaf's, then least id)."""
    cap = 2 * n_leaves + 1
    parent = np.zeros(cap, np.int64)
    spill = np.full(cap, np.nan)
    scell = np.full(cap, -1, np.int64)
    sto = np.zeros(cap, np.int64)
    merge = np.full(cap, np.nan)
    pit = np.full(cap, -1, np.int64)
    pit_h = np.full(cap, np.nan)
    uf = np.arange(n_leaves + 1, dtype=np.int64)
    top = np.arange(n_leaves + 1, dtype=np.int64)
    for v in range(1, n_leaves + 1):
        pit[v] = leaf_key[v - 1]
        pit_h[v] = leaf_h[v - 1]
    nn = n_leaves
    for q in range(ea.shape[0]):
        ra, rb = find(uf, ea[q]), find(uf, eb[q])
        if ra == rb:
            continue
        ro = find(uf, 0)
        if ra == ro or rb == ro:
            t = top[rb] if ra == ro else top[ra]
            spill[t] = ew[q]
            scell[t] = es[q]
            uf[rb if ra == ro else ra] = ro
            continue
        ta, tb = top[ra], top[rb]
        nn += 1
        parent[ta] = nn
        parent[tb] = nn
        spill[ta] = ew[q]
        spill[tb] = ew[q]
        scell[ta] = es[q]
        scell[tb] = es[q]
        sto[ta] = tb
        sto[tb] = ta
        merge[nn] = ew[q]
        if pit_h[ta] < pit_h[tb] or (pit_h[ta] == pit_h[tb] and pit[ta] < pit[tb]):
            pit[nn], pit_h[nn] = pit[ta], pit_h[ta]
        else:
            pit[nn], pit_h[nn] = pit[tb], pit_h[tb]
        uf[rb] = ra
        top[ra] = nn
    nn += 1
    return parent[:nn], spill[:nn], scell[:nn], sto[:nn], merge[:nn], pit[:nn], pit_h[:nn]


@numba.njit(nogil=True, cache=True)
def jump_pointers(parent):
    """Skew-binary jump pointers (Myers 1983): with them the lowest ancestor meeting a monotone test
    is found in O(log depth) steps, in O(nodes) memory. Returns (up: parent or self at a root, jump)."""
    nn = parent.shape[0]
    up = np.arange(nn, dtype=np.int64)
    jump = np.arange(nn, dtype=np.int64)
    depth = np.zeros(nn, np.int64)
    for v in range(nn - 1, 0, -1):  # parents before children
        p = parent[v]
        if p == 0:
            continue
        up[v] = p
        jp = jump[p]
        if depth[p] - depth[jp] == depth[jp] - depth[jump[jp]]:
            jump[v] = jump[jp]
        else:
            jump[v] = p
        depth[v] = depth[p] + 1
    return up, jump


@numba.njit(nogil=True, cache=True)
def tile_volumes(vals, ok, basin, up, jump, level):
    """Pass 3 of one tile (no halo: ``vals``/``ok``/``basin`` are the tile): each cell in a leaf basin
    counts in the lowest ancestor of its leaf whose spill level (``level``, +inf: never) is above its
    elevation -- the depression it lies under. Returns (node, cells, sum of h as double-double)."""
    th, tw = basin.shape
    keys = np.empty(th * tw, np.uint32)
    hs = np.empty(th * tw, np.float64)
    m = 0
    for i in range(th):
        for j in range(tw):
            u = np.int64(basin[i, j])
            if u == 0 or not ok[i, j]:
                continue
            h = np.float64(vals[i, j])
            while not level[u] > h:
                if up[u] == u:
                    u = 0
                    break
                u = jump[u] if not level[jump[u]] > h else up[u]
            if u == 0:
                continue
            keys[m] = np.uint32(u)
            hs[m] = h
            m += 1
    keys, hs = radix_sort32_in(keys[:m], hs[:m], np.empty(m, np.uint32), np.empty(m, np.float64))
    n = 0
    for q in range(m):
        if q == 0 or keys[q] != keys[q - 1]:
            n += 1
    node = np.empty(n, np.int64)
    cnt = np.zeros(n, np.int64)
    shi = np.zeros(n, np.float64)
    slo = np.zeros(n, np.float64)
    k = -1
    for q in range(m):
        if q == 0 or keys[q] != keys[q - 1]:
            k += 1
            node[k] = keys[q]
        cnt[k] += 1
        s, e = two_sum(shi[k], hs[q])
        shi[k] = s
        slo[k] += e
    return node, cnt, shi, slo


@numba.njit(nogil=True, cache=True)
def add_volumes(node, cnt, shi, slo, c_all, h_hi, h_lo):
    """Fold a tile's (node, cells, sum h) into the per-node totals (double-double)."""
    for k in range(node.shape[0]):
        u = node[k]
        c_all[u] += cnt[k]
        s, e = two_sum(h_hi[u], shi[k])
        h_hi[u] = s
        h_lo[u] += e + slo[k]


@numba.njit(cache=True)
def _split(a):
    c = 134217729.0 * a  # Veltkamp: 2**27 + 1
    hi = c - (c - a)
    return hi, a - hi


@numba.njit(nogil=True, cache=True)
def subtree_volumes(parent, spill, c_all, h_hi, h_lo):
    """Subtree sums (children before parents: ids ascending), then volume (elevation units x cells)
    = spill x cells - sum h, the product exact (Dekker) and the difference in double-double.
    NaN volume where the node never spills."""
    nn = parent.shape[0]
    for v in range(1, nn):
        p = parent[v]
        if p > 0:
            c_all[p] += c_all[v]
            s, e = two_sum(h_hi[p], h_hi[v])
            h_hi[p] = s
            h_lo[p] += e + h_lo[v]
    vol = np.full(nn, np.nan)
    for v in range(1, nn):
        s = spill[v]
        if np.isnan(s):
            continue
        c = np.float64(c_all[v])
        p = s * c
        sh, sl = _split(s)
        ch, cl = _split(c)
        pe = ((sh * ch - p) + sh * cl + sl * ch) + sl * cl  # s * c = p + pe exactly
        d, e = two_sum(p, -h_hi[v])
        vol[v] = d + ((e + pe) - h_lo[v])
    return vol
