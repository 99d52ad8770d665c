"""numba kernels of the grid MST pipeline: tile spanning forests, contraction, block merges.

Gerritsen 2012, part II (ch. 2-3), after Haverkort's hierarchy; docs/ARCHITECTURE.md#mst-pipeline.

Edges and their strict order
    An edge is named by its *code* ``lo * 4 + rank``: ``lo`` the smaller cell id (row * cols +
    col) and ``rank`` 0..3 for the forward directions E, SW, S, SE -- the order of their larger
    endpoints ``lo + 1 < lo + cols - 1 < lo + cols < lo + cols + 1``. So ordering edges by
    ``(weight, code)`` is exactly the strict order (weight, smaller id, larger id) of the design,
    every MST is unique, and all backends and tile sizes agree bit for bit.

Graphs that leave a block
    A block (a tile, or a quadtree block of tiles) hands up its contracted spanning forest:
    vertices ``(cell id, elevation, outmask)`` where ``outmask`` bit d says that the neighbour in
    direction d lies outside the block (and may be a vertex), and super-edges ``(u, v, w, code)``
    whose key is that of their *representative*, the maximum original edge on the contracted
    path. Separator edges between sibling blocks are rebuilt at the merge from the outmasks.

Decisions
    The tile phase writes each tile's spanning forest into ``mst/edges``. Later decisions are
    recorded only where they change that bitmask: a tile-internal representative that a merge
    drops (``removed``) and a separator edge that becomes final (``kept``).
"""
from __future__ import annotations

import math

import numba
import numpy as np

from ...jit import in_threads
from ...unionfind import find, find_sized, union_sized
from ..._weights_cpu import float64_bits
from ...weights import DC, DR, MAX
from .._radix_cpu import argsort_float, argsort_int, radix_argsort, radix_sort32_in
from .shared import EXP_OFFSET, FOREST_CELLS, FOREST_EDGES, LO_BITS, N_EXP, TileGraphs, cells_sortable

DIR_TO_RANK = np.array([0, 3, 2, 1], dtype=np.int64)  # forward direction -> rank in the edge code
RANK_TO_DIR = np.array([0, 3, 2, 1], dtype=np.int64)  # (the map is its own inverse)

@numba.njit(inline="always", cache=True)
def _key_less(w1, c1, w2, c2):
    return w1 < w2 or (w1 == w2 and c1 < c2)


@numba.njit(inline="always", cache=True)
def _edge_weight(kind, h_a, h_b):
    """An edge's weight in the two MST models (:func:`terrain_io._weights_cpu.edge_weight`'s formulas for
    ``max`` and ``absdiff``, the models ``mst`` accepts): the other models' code (the walk's exp, the
    friction unpacking) is not compiled into every MST kernel."""
    a = np.float64(h_a)
    b = np.float64(h_b)
    if kind == MAX:
        return a if a >= b else b
    return abs(a - b)


@numba.njit(inline="always", cache=True)
def _add_exact(buckets, w, sign):
    """Add ``sign * w`` to the superaccumulator ``buckets`` (shape (2, N_EXP)) without rounding.

    ``w = m * 2**e`` as ``math.frexp`` splits it (0.5 <= |m| < 1) and ``m * 2**53`` is an exact
    integer; for normal numbers both come straight from the IEEE bits (``2**52 + fraction``, biased
    exponent - 1022), zeros add nothing, the rest (subnormals, inf) go through ``frexp``.
    """
    b = float64_bits(w)
    biased = (b >> 52) & 0x7FF
    if biased == 0 and (b & 0xFFFFFFFFFFFFF) == 0:
        return  # +-0.0
    if biased == 0 or biased == 0x7FF:
        m, e = math.frexp(w)
        mant = np.int64(m * 9007199254740992.0) * sign  # m * 2**53: exact
    else:
        mant = (b & 0xFFFFFFFFFFFFF) | 0x10000000000000
        if b < 0:
            mant = -mant
        mant *= sign
        e = biased - 1022
    hi = mant >> LO_BITS
    buckets[0, e + EXP_OFFSET] += hi
    buckets[1, e + EXP_OFFSET] += mant - (hi << LO_BITS)


@numba.njit(cache=True, nogil=True)
def add_exact_many(buckets, weights, sign):
    for i in range(weights.shape[0]):
        _add_exact(buckets, weights[i], sign)


# ---------------------------------------------------------------------------------------------
# A small DEM in memory: one Kruskal over all its edges (no tiles, no merges)
# ---------------------------------------------------------------------------------------------
# By rank (E, SW, S, SE): the slices of the smaller and of the larger endpoints of the DEM's edges.
_RANK_SLICES = ((0, (slice(None), slice(None, -1)), (slice(None), slice(1, None))),
                (1, (slice(None, -1), slice(1, None)), (slice(1, None), slice(None, -1))),
                (2, (slice(None, -1), slice(None)), (slice(1, None), slice(None))),
                (3, (slice(None, -1), slice(None, -1)), (slice(1, None), slice(1, None))))


def grid_forest(values: np.ndarray, valid: np.ndarray, kind: int) -> tuple[np.ndarray, int, np.ndarray]:
    """The minimum spanning forest of a whole (small) DEM in memory: every edge between valid cells
    with its code, sorted by the strict order (weight, code) in numpy, and Kruskal over them
    (:func:`kruskal_codes`). For the ``max`` model on elevations of at most 32 bits one uint64 sort
    key per edge (the order key of its higher endpoint, :func:`_order_key`'s, above the code: unique,
    so numpy's unstable sort is exact); else numpy's lexsort of (weight, code). The same forest as
    the tiled pipeline (the order is strict, so the forest is unique), with one small kernel to
    compile instead of the tile and merge kernels; ~150 bytes a cell. Returns (bits as ``mst/edges``
    holds them, edge count, the exact weight sum as :func:`exact_total`'s buckets)."""
    rows, cols = values.shape
    ids = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    keyed = kind == MAX and cells_sortable(values.dtype) and rows * cols < 1 << 30  # (codes below 2**32)
    if keyed:
        hkey, float_bits = key_source(values)
        if float_bits:
            k = np.where(hkey == 0x80000000, np.uint32(0), hkey)  # -0.0 is 0.0
            k = np.where(k >> 31 != 0, ~k, k | np.uint32(0x80000000)).astype(np.uint64)
        else:
            k = (hkey.astype(np.int64) + 2147483648).astype(np.uint64)
    else:
        v = values.astype(np.float64, copy=False)
    codes, weights = [], []
    for rank, lo, hi in _RANK_SLICES:
        both = valid[lo] & valid[hi]
        code = ids[lo][both] * 4 + rank
        if keyed:
            codes.append(np.maximum(k[lo][both], k[hi][both]) << np.uint64(32) | code.astype(np.uint64))
        else:
            a, b = v[lo][both], v[hi][both]
            codes.append(code)
            weights.append(np.where(a >= b, a, b) if kind == MAX else np.abs(a - b))
    codes = np.concatenate(codes)
    if keyed:
        codes.sort()
        codes = (codes & np.uint64(0xFFFFFFFF)).astype(np.int64)
    else:
        order = np.lexsort((codes, np.concatenate(weights)))  # (-0.0 == 0.0: one weight, as in the kernels)
        codes = codes[order]
        del order
    codes = codes[kruskal_codes(codes, rows * cols, cols, np.int64(np.count_nonzero(valid)) - 1)]
    lo = codes >> 2
    d = RANK_TO_DIR[codes & 3]
    flat = values.reshape(-1)
    a, b = flat[lo].astype(np.float64), flat[lo + DR[d] * cols + DC[d]].astype(np.float64)
    bits = np.zeros(rows * cols, np.uint8)
    np.bitwise_or.at(bits, lo, np.left_shift(1, d).astype(np.uint8))
    weights = np.where(a >= b, a, b) if kind == MAX else np.abs(a - b)
    return bits.reshape(rows, cols), int(codes.shape[0]), exact_buckets(weights)


@numba.njit(cache=True, nogil=True)
def kruskal_codes(codes, n, cols, most):
    """Kruskal over edge ``codes`` in the strict order on ``n`` cells (row-major, ``cols`` a row), up
    to ``most`` edges (a forest has fewer: no early end then); union-find whose roots are the least
    member. Returns which edges joined two trees."""
    parent = np.empty(n, np.int64)
    for x in range(n):
        parent[x] = x
    chosen = np.zeros(codes.shape[0], np.bool_)
    joined = 0
    for k in range(codes.shape[0]):
        if joined == most:
            break
        lo = codes[k] >> 2
        rank = codes[k] & 3
        hi = lo + 1 if rank == 0 else lo + cols - 2 + rank  # SW, S, SE: + cols - 1, + cols, + cols + 1
        ra = find(parent, lo)
        rb = find(parent, hi)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
            chosen[k] = True
            joined += 1
    return chosen


def exact_buckets(weights: np.ndarray) -> np.ndarray:
    """The superaccumulator of :func:`_add_exact` holding the sum of ``weights`` (finite float64),
    in numpy: each weight ``m * 2**e`` (``np.frexp``) as the exact integer ``m * 2**53`` split
    into two int64 buckets at ``e``."""
    mant, exp = np.frexp(weights)
    mant = (mant * 9007199254740992.0).astype(np.int64)  # m * 2**53: exact
    idx = exp.astype(np.int64) + EXP_OFFSET
    hi = mant >> LO_BITS
    buckets = np.zeros((2, N_EXP), dtype=np.int64)
    np.add.at(buckets[0], idx, hi)
    np.add.at(buckets[1], idx, mant - (hi << LO_BITS))
    return buckets


# ---------------------------------------------------------------------------------------------
# Tile phase, CPU: Kruskal on the tile's induced subgraph.
# ---------------------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def tile_forest(vals, valid, i0, j0, h, w, kind, bits):
    """Minimum spanning forest of one tile (Kruskal, strict order); sets ``bits`` of its edges.

    ``vals``/``valid`` hold the batch; the tile is ``[i0:i0+h, j0:j0+w]`` of it. Edges are
    generated in code order (cell by cell, ranks E, SW, S, SE), so a stable sort by weight gives
    the strict order (weight, code).
    """
    n = h * w
    ew = np.empty(4 * n, dtype=np.float64)
    ea = np.empty(4 * n, dtype=np.int32)
    eb = np.empty(4 * n, dtype=np.int32)
    ed = np.empty(4 * n, dtype=np.uint8)
    m = 0
    for i in range(h):
        for j in range(w):
            if not valid[i0 + i, j0 + j]:
                continue
            ha = vals[i0 + i, j0 + j]
            for rank in range(4):
                d = RANK_TO_DIR[rank]
                ii = i + DR[d]
                jj = j + DC[d]
                if ii < 0 or ii >= h or jj < 0 or jj >= w or not valid[i0 + ii, j0 + jj]:
                    continue
                ew[m] = _edge_weight(kind, ha, vals[i0 + ii, j0 + jj])
                ea[m] = i * w + j
                eb[m] = ii * w + jj
                ed[m] = d
                m += 1
    order = argsort_float(ew[:m])  # stable: codes stay in order within a weight
    parent = np.full(n, -1, dtype=np.int32)
    joined = 0
    for k in order:
        ra = find_sized(parent, np.int64(ea[k]))
        rb = find_sized(parent, np.int64(eb[k]))
        if ra != rb:
            union_sized(parent, ra, rb)
            a = ea[k]
            bits[i0 + a // w, j0 + a % w] |= np.uint8(1 << ed[k])
            joined += 1
            if joined == n - 1:
                break


@numba.njit(inline="always", cache=True)
def _outmask(valid, i, j, i0, j0, h, w, bh, bw, gr0, gc0, rows, cols):
    """Directions from tile cell (i, j) to neighbours outside the tile that may be vertices: valid
    cells inside the batch ``[0:bh, 0:bw]``, or any cell of the DEM outside the batch (checked at
    the merge). Nonzero: a boundary vertex (a terminal of the tile's contraction)."""
    outm = np.uint8(0)
    for d in range(8):
        ii = i + DR[d]
        jj = j + DC[d]
        if 0 <= ii < h and 0 <= jj < w:
            continue  # inside the tile
        bi = i0 + ii
        bj = j0 + jj
        if 0 <= bi < bh and 0 <= bj < bw:
            if valid[bi, bj]:
                outm |= np.uint8(1 << d)
        elif 0 <= gr0 + bi < rows and 0 <= gc0 + bj < cols:
            outm |= np.uint8(1 << d)
    return outm


# A cell's edges in the order of their codes: to its smaller-id neighbours (NW, N, NE, W: codes
# lo * 4 + rank with lo the neighbour, ascending), then its own codes by rank (E, SW, S, SE).
_CODE_ORDER = np.array([5, 6, 7, 4, 0, 3, 2, 1], dtype=np.int64)


def _ring_groups() -> np.ndarray:
    """For each mask of a cell's lower neighbours (bit d: direction d), the count and the directions, in
    code order, of the first neighbour of each group of mutually adjacent ones (8-adjacency).

    Below a cell that no neighbour ties, two adjacent lower neighbours are joined already (their edge
    is lighter), so Kruskal's edges from it to one group go to one component: only the first (in
    code order) can join, the others are cycles without a find.
    """
    table = np.zeros((256, 5), dtype=np.int64)
    for mask in range(256):
        lower = [d for d in range(8) if mask >> d & 1]
        group = {d: d for d in lower}

        def root(d):
            while group[d] != d:
                d = group[d]
            return d

        for a in lower:
            for b in lower:
                if max(abs(DR[a] - DR[b]), abs(DC[a] - DC[b])) <= 1:
                    group[root(a)] = root(b)
        seen = set()
        for d in _CODE_ORDER:
            if mask >> d & 1 and root(d) not in seen:
                seen.add(root(d))
                table[mask, 1 + len(seen) - 1] = d
        table[mask, 0] = len(seen)
    return table


_RING_GROUPS = _ring_groups()


@numba.njit(cache=True, nogil=True)
def tile_forest_max(vals, hkey, float_bits, valid, i0, j0, h, w, bh, bw, gr0, gc0, rows, cols, bits,
                    vid, vh, vmask, eu, ev, ew, ecode, buckets, work):
    """Kruskal for the ``max`` model over cells rather than edges, contracting the tile's forest as
    it grows; the CPU tile phase of that model, in place of ``tile_forest`` + :func:`contract_tile`.

    Forest: an edge weighs the elevation of its higher endpoint, so the edges of weight h are those
    from each cell of elevation h to its neighbours that are lower, or equal and of smaller id: with
    cells in the strict order (h, id) -- order-preserving 32-bit images of the elevations
    (``_order_key`` of ``hkey``, see ``key_source``) -- Kruskal takes cell after cell, each with its
    edges to the cells before it, in code order; that is exactly the strict edge order (weight,
    smaller id, larger id). A plateau (cells of one key) has its edges sorted by code. Below a cell
    that no neighbour ties, adjacent lower neighbours are joined already (their edge is lighter), so
    one edge per group of them is tried (``_ring_groups``), and a cell with a single group, no
    terminal, joins just that group: it is linked in a local pass over the tile, and only the other
    cells (saddles, terminals, plateaus; about a tenth of a terrain tile) are radix-sorted. Cells are
    numbered in a copy of the tile with a one-cell border (no vertex there): no bounds checks, and
    neighbours share cache lines in the union-find.

    Contraction: the tile's terminals are its boundary vertices (those with an outmask, as in
    :func:`contract_tile`). A union of two components that both hold a terminal adds the super-edge
    between one terminal of each, labelled by the joining edge -- the maximum of the forest path
    between those terminals. The tree so built on the terminals has the forest's minimax between
    every two of them, which is all a merge reads (the cycle property), and no more vertices and
    edges than Gerritsen 2012's contraction (part II ch. 2; no branch vertices). The forest's weights go
    to ``buckets`` exactly (``_weight_part``). ``work``: one thread's scratch (:func:`max_tile_work`),
    reused tile after tile. Returns (vertex count, edge count).
    """
    W = w + 2
    B = (h + 2) * W
    order, parent, term, out = work[0][:B], work[1][:B], work[2][:B], work[3][:B]
    # the strict order of the bordered tile's cells as one int64, key << 31 | cell: a neighbour u of v
    # is an edge of v's class exactly when order[u] < order[v]; no vertex: above all
    none = np.int64(9223372036854775807)
    order[:] = none
    m = 0
    for i in range(h):
        for j in range(w):
            if valid[i0 + i, j0 + j]:
                order[(i + 1) * W + j + 1] = np.int64(_order_key(hkey[i0 + i, j0 + j], float_bits)) << 31 | (
                    (i + 1) * W + j + 1)
                m += 1
    off = np.empty(8, dtype=np.int64)
    for d in range(8):
        off[d] = DR[d] * W + DC[d]
    # union-find on bordered cells: parent >= 0, or a root holding -(its size); term: a terminal's
    # bordered cell in a root's component, or -1
    parent[:] = -1
    term[:] = -1
    nv = 0  # terminals, in order of id (a tile's vertices are one sorted run for the merge phase)
    for i in range(h):
        step = 1 if i == 0 or i == h - 1 or w == 1 else w - 1  # the tile's border cells only
        for j in range(0, w, step):
            if valid[i0 + i, j0 + j]:
                outm = _outmask(valid, i, j, i0, j0, h, w, bh, bw, gr0, gc0, rows, cols)
                if outm != 0:
                    vid[nv] = (gr0 + i0 + i) * cols + (gc0 + j0 + j)
                    vh[nv] = vals[i0 + i, j0 + j]
                    vmask[nv] = outm
                    nv += 1
                    term[(i + 1) * W + j + 1] = (i + 1) * W + j + 1
    out[:] = 0
    wsum = np.zeros(258, dtype=np.int64)  # the weights (see _weight_part)
    # Local pass: a lone cell (no neighbour of its key) that is no terminal and whose lower neighbours
    # form one group (see _ring_groups) joins, when its turn comes, exactly its first lower neighbour's
    # component, and nothing else (only it and cells above it hang under it): link it now, in place,
    # and sort only the other cells -- saddles, terminals, plateaus (~a tenth on terrain).
    keys = work[4]
    ids = work[5]  # cells as i << 16 | j (tiles <= 8192): ascending with the id
    nl = 0
    joined = 0
    for i in range(h):
        for j in range(w):
            v = (i + 1) * W + j + 1
            ov = order[v]
            if ov == none:
                continue
            low = 0
            tie = False
            for d in range(8):
                ou = order[v + off[d]]
                low |= (ou < ov) << d
                tie |= (ou >> 31) == (ov >> 31)
            if tie or term[v] >= 0 or _RING_GROUPS[low, 0] > 1:
                keys[nl] = np.uint32(ov >> 31)
                ids[nl] = i << 16 | j
                nl += 1
            elif low != 0:
                d = _RING_GROUPS[low, 1]
                parent[v] = v + off[d]  # (its root's size goes stale: a heuristic only)
                out[v if d < 4 else v + off[d]] |= np.uint8(1 << (d & 3))
                e, part = _weight_part(np.uint32(ov >> 31), float_bits)
                wsum[e] += part
                joined += 1
    keys, ids = radix_sort32_in(keys[:nl], ids[:nl], work[6][:nl], work[7][:nl])  # stable: ids ascending in a key
    base = (gr0 + i0 - 1) * cols + gc0 + j0 - 1  # global id of bordered cell c: base + (c // W) * cols + c % W
    buf = np.empty(64, dtype=np.int64)  # the class's edges as bordered codes lo * 4 + rank
    ne = 0
    g = 0
    while g < nl and joined < m - 1:
        ge = g + 1
        while ge < nl and keys[ge] == keys[g]:
            ge += 1
        nb = np.int64(0)  # (not a literal 0: _sort_codes would compile for Literal[int](0) too)
        joins = 0
        if ge == g + 1:  # one cell (no neighbour of its key)
            v = ((ids[g] >> 16) + 1) * W + (ids[g] & 0xFFFF) + 1
            ov = order[v]
            low = 0
            for d in range(8):
                low |= (order[v + off[d]] < ov) << d
            nb = _RING_GROUPS[low, 0]
            for x in range(nb):  # one edge per group of adjacent lower neighbours (see _ring_groups)
                d = _RING_GROUPS[low, 1 + x]
                buf[x] = v * 4 + DIR_TO_RANK[d] if d < 4 else (v + off[d]) * 4 + DIR_TO_RANK[d - 4]
            if nb > 0 and term[v] < 0:  # v's first edge joins it, and nothing to contract: hang v under
                d = _RING_GROUPS[low, 1]   # that neighbour, no find
                parent[v] = v + off[d]
                out[v if d < 4 else v + off[d]] |= np.uint8(1 << (d & 3))
                joins = 1
        else:  # a plateau: its edges, sorted by code
            if 8 * (ge - g) > buf.shape[0]:
                buf = np.empty(16 * (ge - g), dtype=np.int64)
            for x in range(g, ge):
                v = ((ids[x] >> 16) + 1) * W + (ids[x] & 0xFFFF) + 1
                for d in range(8):
                    u = v + off[d]
                    if order[u] < order[v]:
                        buf[nb] = v * 4 + DIR_TO_RANK[d] if d < 4 else u * 4 + DIR_TO_RANK[d - 4]
                        nb += 1
            _sort_codes(buf, nb)
        for x in range(joins, nb):
            a = buf[x] >> 2
            da = RANK_TO_DIR[buf[x] & 3]
            ra = find_sized(parent, a)
            rb = find_sized(parent, a + off[da])
            if ra == rb:
                continue
            ra, rb = union_sized(parent, ra, rb)
            ta = term[ra]
            tb = term[rb]
            if ta >= 0 and tb >= 0:
                eu[ne] = base + (min(ta, tb) // W) * cols + min(ta, tb) % W
                ev[ne] = base + (max(ta, tb) // W) * cols + max(ta, tb) % W
                ew[ne] = vals[i0 + (ids[g] >> 16), j0 + (ids[g] & 0xFFFF)]  # the class's weight
                ecode[ne] = (base + (a // W) * cols + a % W) * 4 + (buf[x] & 3)
                ne += 1
            elif ta < 0:
                term[ra] = tb
            out[a] |= np.uint8(1 << da)
            joins += 1
        joined += joins
        e, part = _weight_part(keys[g], float_bits)
        wsum[e] += part * joins
        g = ge
    for i in range(h):
        for j in range(w):
            bits[i0 + i, j0 + j] |= out[(i + 1) * W + j + 1]
    for e in range(255):  # the tile's sums into the superaccumulator: wsum[e] * 2**(max(e, 1) - 150)
        if wsum[e] != 0:
            idx = EXP_OFFSET + 53 + ((e if e > 0 else 1) - 150 if float_bits else 0)
            hi = wsum[e] >> LO_BITS
            buckets[0, idx] += hi
            buckets[1, idx] += wsum[e] - (hi << LO_BITS)
    for _ in range(wsum[255]):  # infinite weights (NaN is nodata)
        _add_exact(buckets, np.inf, 1)
    for _ in range(wsum[256]):
        _add_exact(buckets, -np.inf, 1)
    return nv, ne


@numba.njit(inline="always", cache=True)
def _weight_part(key, float_bits):
    """An edge weight from its order key (``_order_key``), as (index, integer) for a tile's exact
    int64 sums (a tile has < 2**26 edges): a float32 as its signed 24-bit mantissa at its biased
    exponent (0-254; +inf counted at 255, -inf at 256), an integer as itself at 0."""
    if not float_bits:
        return 0, np.int64(key) - 2147483648
    u = key ^ np.uint32(0x80000000) if key >> np.uint32(31) else ~key  # the float32 bits again
    e = np.int64((u >> np.uint32(23)) & np.uint32(0xFF))
    if e == 255:
        return 256 if u >> np.uint32(31) else 255, np.int64(1)
    mant = np.int64(u & np.uint32(0x7FFFFF)) | (np.int64(0x800000) if e > 0 else np.int64(0))
    return e, -mant if u >> np.uint32(31) else mant


def max_tile_work(threads, side):
    """Scratch of :func:`tile_forest_max` for ``threads`` threads and tiles up to ``side`` square, as a
    tuple of arrays with a row per thread (~33 bytes a cell): order, parent, term, out on the bordered
    tile, then keys, ids and the radix sort's two. Reused tile after tile: fresh pages for every tile
    cost page faults that doubled the tile phase (benchmarks/RESULTS.md, "Issue #16: the tile Kruskal of
    the max model"); numpy rather than a kernel for
    eight allocations, which would add to a first run's compile time)."""
    b = (side + 2) * (side + 2)
    n = side * side
    return (np.empty((threads, b), dtype=np.int64), np.empty((threads, b), dtype=np.int32),
            np.empty((threads, b), dtype=np.int32), np.empty((threads, b), dtype=np.uint8),
            np.empty((threads, n), dtype=np.uint32), np.empty((threads, n), dtype=np.int32),
            np.empty((threads, n), dtype=np.uint32), np.empty((threads, n), dtype=np.int32))


@numba.njit(cache=True)
def _sort_codes(buf, nb):
    """Sort ``buf[:nb]`` in place (codes of a plateau's edges, < 2**32 for tiles <= 8192)."""
    if nb > 32:
        ck = np.empty(nb, dtype=np.uint32)
        for x in range(nb):
            ck[x] = np.uint32(buf[x])
        ck, _ = radix_sort32_in(ck, np.empty(nb, dtype=np.int32), np.empty(nb, dtype=np.uint32),
                                np.empty(nb, dtype=np.int32))  # nothing to carry
        for x in range(nb):
            buf[x] = np.int64(ck[x])
    else:  # a few edges: insertion sort, no allocation
        for x in range(1, nb):
            y = buf[x]
            z = x - 1
            while z >= 0 and buf[z] > y:
                buf[z + 1] = buf[z]
                z -= 1
            buf[z + 1] = y


# ---------------------------------------------------------------------------------------------
# Contraction of a tile's forest (from its bitmask)
# ---------------------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def contract_tile(vals, valid, bits, i0, j0, h, w, bh, bw, gr0, gc0, rows, cols, kind,
                  vid, vh, vmask, eu, ev, ew, ecode, buckets):
    """Contract one tile's spanning forest to the graph it hands to the merge phase.

    Gerritsen 2012, part II ch. 2: dead ends (leaves not on the tile boundary) are removed repeatedly --
    their edges are final; each path of non-boundary degree-2 vertices becomes one super-edge
    keyed by its maximum edge. Boundary vertices are valid cells with a neighbour outside the
    tile that may be a vertex: a valid neighbour inside the batch ``[0:bh, 0:bw]``, or any cell of
    the DEM outside the batch (its validity is checked at the merge). ``gr0, gc0``: the global
    cell of batch cell (0, 0). Adds the weights of the tile's forest to ``buckets``; returns
    (vertex count, edge count).
    """
    alive = np.zeros((h, w), dtype=np.uint8)  # the forest as 8-direction adjacency bits
    deg = np.zeros((h, w), dtype=np.int32)
    outm = np.zeros((h, w), dtype=np.uint8)
    for i in range(h):
        for j in range(w):
            b = bits[i0 + i, j0 + j]
            if b == 0:
                continue
            for d in range(4):
                if (b >> d) & 1:
                    ii = i + DR[d]
                    jj = j + DC[d]
                    alive[i, j] |= np.uint8(1 << d)
                    alive[ii, jj] |= np.uint8(1 << (d + 4))
                    deg[i, j] += 1
                    deg[ii, jj] += 1
                    _add_exact(buckets, _edge_weight(kind, vals[i0 + i, j0 + j], vals[i0 + ii, j0 + jj]), 1)
    for i in range(h):
        step = 1 if i == 0 or i == h - 1 or w == 1 else w - 1  # the tile's border cells only
        for j in range(0, w, step):
            if valid[i0 + i, j0 + j]:
                outm[i, j] = _outmask(valid, i, j, i0, j0, h, w, bh, bw, gr0, gc0, rows, cols)
    # strip dead ends
    stack = np.empty(h * w, dtype=np.int32)
    top = 0
    for i in range(h):
        for j in range(w):
            if deg[i, j] == 1 and outm[i, j] == 0:
                stack[top] = i * w + j
                top += 1
    while top > 0:
        top -= 1
        c = stack[top]
        i = c // w
        j = c % w
        if deg[i, j] != 1:
            continue
        for d in range(8):
            if (alive[i, j] >> d) & 1:
                break
        ii = i + DR[d]
        jj = j + DC[d]
        alive[i, j] &= np.uint8(~(1 << d) & 0xFF)
        alive[ii, jj] &= np.uint8(~(1 << ((d + 4) & 7)) & 0xFF)
        deg[i, j] = 0
        deg[ii, jj] -= 1
        if deg[ii, jj] == 1 and outm[ii, jj] == 0:
            stack[top] = ii * w + jj
            top += 1
    # kept vertices and the super-edges between them
    nv = 0
    ne = 0
    for i in range(h):
        for j in range(w):
            if not valid[i0 + i, j0 + j] or not (outm[i, j] != 0 or deg[i, j] >= 3):
                continue
            gid = (gr0 + i0 + i) * cols + (gc0 + j0 + j)
            vid[nv] = gid
            vh[nv] = vals[i0 + i, j0 + j]
            vmask[nv] = outm[i, j]
            nv += 1
            for d0 in range(8):
                if not (alive[i, j] >> d0) & 1:
                    continue
                pi = i
                pj = j
                ci = i + DR[d0]
                cj = j + DC[d0]
                d = d0
                best_w = np.inf
                best_c = np.int64(-1)
                while True:
                    # the edge (pi, pj) -> (ci, cj) in direction d
                    wgt = _edge_weight(kind, vals[i0 + pi, j0 + pj], vals[i0 + ci, j0 + cj])
                    if d < 4:
                        code = ((gr0 + i0 + pi) * cols + (gc0 + j0 + pj)) * 4 + DIR_TO_RANK[d]
                    else:
                        code = ((gr0 + i0 + ci) * cols + (gc0 + j0 + cj)) * 4 + DIR_TO_RANK[d - 4]
                    if best_c < 0 or _key_less(best_w, best_c, wgt, code):
                        best_w = wgt
                        best_c = code
                    if outm[ci, cj] != 0 or deg[ci, cj] >= 3:
                        break
                    back = (d + 4) & 7
                    for d2 in range(8):
                        if d2 != back and (alive[ci, cj] >> d2) & 1:
                            break
                    pi = ci
                    pj = cj
                    ci = ci + DR[d2]
                    cj = cj + DC[d2]
                    d = d2
                other = (gr0 + i0 + ci) * cols + (gc0 + j0 + cj)
                if gid < other:
                    eu[ne] = gid
                    ev[ne] = other
                    ew[ne] = best_w
                    ecode[ne] = best_c
                    ne += 1
    return nv, ne


def key_source(values: np.ndarray) -> tuple[np.ndarray, bool]:
    """What FOREST_CELLS reads its order keys from: float32 bits (a view, no copy), or the integers."""
    if values.dtype == np.float32:
        return values.view(np.uint32), True
    return values, False


@numba.njit(inline="always", cache=True)
def _order_key(x, float_bits):
    """An order-preserving uint32 image of an elevation of at most 32 bits.

    Float bits: the IEEE trick (flip all bits of negatives, the sign bit of positives), with -0.0
    taken as 0.0 (equal weights, one key). Integers: shifted by 2**31.
    """
    if float_bits:
        u = np.uint32(x)
        if u == np.uint32(0x80000000):
            u = np.uint32(0)
        if u >> np.uint32(31):
            return np.uint32(0xFFFFFFFF) ^ u
        return u | np.uint32(0x80000000)
    return np.uint32(np.int64(x) + 2147483648)


def tile_phase_batch(vals, valid, hkey, float_bits, bits, tiles, gr0, gc0, rows, cols, kind, cap, forest,
                     parallel=True, work=None):
    """Tile phase of one batch (a quadtree block of tiles), the tiles in parallel threads (``parallel=False``:
    one thread, for small DEMs; see :data:`terrain_io.jit.SERIAL_BELOW`), each a Python loop over its
    chunk of tiles calling the tile kernels (:func:`terrain_io.jit.in_threads`: no parallel build to
    compile; the kernels release the GIL).

    ``tiles`` (n, 4): i0, j0, h, w of each tile in the batch arrays, in Morton order.
    ``forest``: FOREST_EDGES / FOREST_CELLS run Kruskal here (CPU backend); FOREST_GIVEN: ``bits``
    already holds the forests (GPU backend). Returns :class:`TileGraphs`. ``work``: the threads' scratch
    (:func:`tile_work`, a row per thread), made once per run by callers with many batches.
    """
    if work is None:
        work = tile_work(forest, int(tiles[:, 2:].max(initial=0)), parallel)
    out = _tile_outputs(tiles.shape[0], cap)

    def chunk(c, lo, hi):
        _tile_loop(vals, valid, hkey, float_bits, bits, tiles, gr0, gc0, rows, cols, kind, forest,
                   tuple(a[c] for a in work), out, lo, hi)

    in_threads(tiles.shape[0], chunk, work[0].shape[0])
    return out._replace(buckets=out.buckets.sum(axis=0))


def _tile_outputs(n: int, cap: int) -> TileGraphs:
    """The tile phase's result arrays for ``n`` tiles of at most ``cap`` vertices and edges, ``buckets``
    one per tile (n, 2, N_EXP): each tile adds its forest's weights to its own, the caller sums them."""
    return TileGraphs(np.zeros(n, np.int64), np.empty((n, cap), np.int64), np.empty((n, cap), np.float64),
                      np.empty((n, cap), np.uint8), np.zeros(n, np.int64), np.empty((n, cap), np.int64),
                      np.empty((n, cap), np.int64), np.empty((n, cap), np.float64), np.empty((n, cap), np.int64),
                      np.zeros((n, 2, N_EXP), np.int64))


def _tile_loop(vals, valid, hkey, float_bits, bits, tiles, gr0, gc0, rows, cols, kind, forest, scratch, out, lo, hi):
    """Tiles ``lo:hi`` of the batch into their rows of ``out``, one kernel call a tile (microseconds),
    with one thread's ``scratch``."""
    bh, bw = vals.shape
    for t in range(lo, hi):
        i0, j0, h, w = tiles[t, 0], tiles[t, 1], tiles[t, 2], tiles[t, 3]
        if forest == FOREST_CELLS:
            out.nv[t], out.ne[t] = tile_forest_max(vals, hkey, float_bits, valid, i0, j0, h, w, bh, bw, gr0, gc0, rows,
                                                   cols, bits, out.vid[t], out.vh[t], out.vmask[t], out.eu[t],
                                                   out.ev[t], out.ew[t], out.ecode[t], out.buckets[t], scratch)
        else:
            if forest == FOREST_EDGES:
                tile_forest(vals, valid, i0, j0, h, w, kind, bits)
            out.nv[t], out.ne[t] = contract_tile(vals, valid, bits, i0, j0, h, w, bh, bw, gr0, gc0, rows, cols, kind,
                                                 out.vid[t], out.vh[t], out.vmask[t], out.eu[t], out.ev[t], out.ew[t],
                                                 out.ecode[t], out.buckets[t])


def tile_work(forest: int, tile: int, parallel: bool = True) -> tuple:
    """The tile phase's scratch for tiles up to ``tile`` square: a row per thread (one without threads);
    only FOREST_CELLS uses it (the others get rows of nothing, which still count the threads)."""
    return max_tile_work(numba.get_num_threads() if parallel else 1, tile if forest == FOREST_CELLS else 0)


# ---------------------------------------------------------------------------------------------
# Merge phase: Kruskal on sibling blocks' graphs + separator edges, then contraction.
# ---------------------------------------------------------------------------------------------
@numba.njit(inline="always", cache=True)
def _is_separator(code, cols, tile):
    lo = code >> 2
    d = RANK_TO_DIR[code & 3]
    r = lo // cols
    c = lo % cols
    return (r // tile != (r + DR[d]) // tile) or (c // tile != (c + DC[d]) // tile)


@numba.njit(cache=True, nogil=True)
def _argsort_runs(a):
    """``np.argsort(a)`` for distinct keys that come as a few ascending runs (the children's sorted
    vertex lists, concatenated): the runs merged pairwise, O(n log runs); more than 16 runs: an empty
    array, and the caller radix-sorts (:func:`_vertex_order`: the four children of a merge never give
    more, so a first run does not compile that sort in here). (Run bounds in fixed arrays: numba's
    typed lists cost a second of compilation.)"""
    n = a.shape[0]
    bounds = np.empty(18, dtype=np.int64)
    bounds[0] = 0
    nb = 1
    for i in range(1, n):
        if a[i] < a[i - 1]:
            bounds[nb] = i
            nb += 1
            if nb > 16:
                return np.empty(0, dtype=np.int64)
    bounds[nb] = n
    nb += 1
    idx = np.empty(n, dtype=np.int64)
    for x in range(n):
        idx[x] = x
    tmp = np.empty(n, dtype=np.int64)
    merged = np.empty(18, dtype=np.int64)
    while nb > 2:
        merged[0] = 0
        nm = 1
        for r in range(0, nb - 1, 2):
            lo = bounds[r]
            if r + 2 >= nb:  # an odd run left over
                for x in range(lo, bounds[r + 1]):
                    tmp[x] = idx[x]
                merged[nm] = bounds[r + 1]
                nm += 1
                continue
            mid = bounds[r + 1]
            hi = bounds[r + 2]
            x, y, o = lo, mid, lo
            while x < mid and y < hi:
                if a[idx[y]] < a[idx[x]]:
                    tmp[o] = idx[y]
                    y += 1
                else:
                    tmp[o] = idx[x]
                    x += 1
                o += 1
            while x < mid:
                tmp[o] = idx[x]
                x += 1
                o += 1
            while y < hi:
                tmp[o] = idx[y]
                y += 1
                o += 1
            merged[nm] = hi
            nm += 1
        idx, tmp = tmp, idx
        bounds, merged = merged, bounds
        nb = nm
    return idx


@numba.njit(cache=True, nogil=True)
def _argsort_strict(w, code):
    """Indices of the edges in the strict order (weight, code): radix sorts by code, then (stable)
    by an order-preserving uint64 image of the weight (IEEE bits, signs folded; -0.0 as 0.0, equal
    weights, one key). Codes are distinct, so the order is total."""
    m = w.shape[0]
    wk = np.empty(m, dtype=np.uint64)
    ck = np.empty(m, dtype=np.uint64)
    top = np.uint64(1) << np.uint64(63)
    for x in range(m):
        u = np.uint64(float64_bits(w[x] + 0.0))  # (-0.0 + 0.0 is +0.0; a bitcast: no copy, no view)
        wk[x] = ~u if u & top else u | top
        ck[x] = np.uint64(code[x])
    idx = np.empty(m, dtype=np.int64)
    for x in range(m):
        idx[x] = x
    tmp = np.empty(m, dtype=np.int64)
    idx, tmp = radix_argsort(ck, idx, tmp)
    idx, tmp = radix_argsort(wk, idx, tmp)
    return idx


def merge_blocks(vid, vh, vmask, eu, ev, ew, ecode, R0, R1, C0, C1, rows, cols, tile, kind):
    """Merge sibling blocks into the block of cells ``[R0:R1, C0:C1]`` (Gerritsen 2012, part II ch. 2-3).

    Inputs: the children's vertices and super-edges, concatenated. Separator edges between the
    children come from the outmasks. Kruskal in the strict order keeps the spanning forest of the
    union and contracts it as it unites, as :func:`tile_forest_max` does for a tile: the new block's
    terminals are the vertices with an outmask left; an edge joining two components that both hold
    one is carried up as a super-edge between them, any other forest edge is final (Gerritsen 2012's
    dead ends and non-maximal path edges, part II ch. 2-3). Returns the new block graph and the
    decisions: ``removed`` codes (tile-internal representatives dropped) and ``kept`` separator codes
    (final), with weights.

    Three kernels and two sorts, called in turn here (in Python: a merge of a small DEM compiles no
    kernel that links the sorts in again)."""
    block = merge_candidates(vid, vh, vmask, eu, ev, ew, ecode, _vertex_order(vid), R0, R1, C0, C1, rows, cols,
                             kind)
    return merge_kruskal(*block, _argsort_strict(block[5], block[6]), cols, tile)


def _vertex_order(vid):
    """``np.argsort(vid)`` of the children's concatenated vertex ids: :func:`_argsort_runs`, else (many
    runs) a radix sort, compiled only when a merge needs it."""
    order = _argsort_runs(vid)
    return order if order.shape[0] == vid.shape[0] else argsort_int(vid)


@numba.njit(cache=True, nogil=True)
def _lower_bound(a, x):
    """``np.searchsorted(a, x)`` (the first index whose key is >= x) of sorted int64 ``a``: a binary
    search, not numba's generic searchsorted (its comparisons for every dtype: ~0.4 s to compile)."""
    lo = np.int64(0)
    hi = np.int64(a.shape[0])
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True)
def merge_candidates(vid, vh, vmask, eu, ev, ew, ecode, order, R0, R1, C0, C1, rows, cols, kind):
    """Step 1 of :func:`merge_blocks`: the children's vertices in id order (``order``), their outmasks
    against the new block, and every candidate edge (the children's super-edges, then the separator
    edges between them) as vertex indices: (vid, vh, vmask, au, av, aw, ac)."""
    nv = order.shape[0]
    vid_s = np.empty(nv, dtype=np.int64)  # (a loop: numba's fancy indexing compiles per dtype, ~1 s)
    vh_s = np.empty(nv, dtype=np.float64)
    vm_s = np.empty(nv, dtype=np.uint8)
    for k in range(nv):
        vid_s[k] = vid[order[k]]
        vh_s[k] = vh[order[k]]
        vm_s[k] = vmask[order[k]]
    vid, vh, vmask = vid_s, vh_s, vm_s
    # separator edges of this level, and the outmasks against the new block
    nsep = 0
    for k in range(nv):  # separator edges start at their smaller end: forward directions
        m = vmask[k]
        nsep += (m & 1) + ((m >> 1) & 1) + ((m >> 2) & 1) + ((m >> 3) & 1)
    su = np.empty(nsep, dtype=np.int64)
    sv = np.empty(nsep, dtype=np.int64)
    sw = np.empty(nsep, dtype=np.float64)
    sc = np.empty(nsep, dtype=np.int64)
    ns = 0
    for k in range(nv):
        m = vmask[k]
        if m == 0:
            continue
        r = vid[k] // cols
        c = vid[k] % cols
        for d in range(8):
            if not (m >> d) & 1:
                continue
            rr = r + DR[d]
            cc = c + DC[d]
            if R0 <= rr < R1 and C0 <= cc < C1:
                m &= np.uint8(~(1 << d) & 0xFF)
                if d < 4:
                    other = rr * cols + cc
                    x = _lower_bound(vid, other)
                    if x < nv and vid[x] == other:  # else a nodata cell
                        su[ns] = k
                        sv[ns] = x
                        sw[ns] = _edge_weight(kind, vh[k], vh[x])
                        sc[ns] = vid[k] * 4 + DIR_TO_RANK[d]
                        ns += 1
        vmask[k] = m
    # all candidate edges, in strict order
    nold = eu.shape[0]
    m_all = nold + ns
    au = np.empty(m_all, dtype=np.int64)
    av = np.empty(m_all, dtype=np.int64)
    aw = np.empty(m_all, dtype=np.float64)
    ac = np.empty(m_all, dtype=np.int64)
    for k in range(nold):
        au[k] = _lower_bound(vid, eu[k])
        av[k] = _lower_bound(vid, ev[k])
        aw[k] = ew[k]
        ac[k] = ecode[k]
    for k in range(ns):  # (loops, here and below: a slice copy compiles numba's shape-error message)
        au[nold + k] = su[k]
        av[nold + k] = sv[k]
        aw[nold + k] = sw[k]
        ac[nold + k] = sc[k]
    return vid, vh, vmask, au, av, aw, ac


@numba.njit(cache=True, nogil=True)
def merge_kruskal(vid, vh, vmask, au, av, aw, ac, order, cols, tile):
    """Step 2 of :func:`merge_blocks`: Kruskal over the candidate edges in the strict order
    (``order``), contracting as it unites; returns the new block graph and the decisions."""
    m_all = au.shape[0]
    nv = vid.shape[0]
    removed_c = np.empty(m_all, dtype=np.int64)
    removed_w = np.empty(m_all, dtype=np.float64)
    kept_c = np.empty(m_all, dtype=np.int64)
    kept_w = np.empty(m_all, dtype=np.float64)
    nrem = 0
    nkept = 0
    # the new block's graph: its terminals (vertices with an outmask left) and the super-edges that
    # Kruskal adds between their components
    term = np.full(nv, -1, dtype=np.int64)  # by root: a terminal of its component (vertices sorted by id)
    nout = 0
    for k in range(nv):
        if vmask[k] != 0:
            term[k] = k
            nout += 1
    ovid = np.empty(nout, dtype=np.int64)
    ovh = np.empty(nout, dtype=np.float64)
    ovm = np.empty(nout, dtype=np.uint8)
    on = 0
    for k in range(nv):
        if vmask[k] != 0:
            ovid[on] = vid[k]
            ovh[on] = vh[k]
            ovm[on] = vmask[k]
            on += 1
    oeu = np.empty(nout, dtype=np.int64)
    oev = np.empty(nout, dtype=np.int64)
    oew = np.empty(nout, dtype=np.float64)
    oec = np.empty(nout, dtype=np.int64)
    oe = 0
    parent = np.full(nv, -1, dtype=np.int64)
    for k in order:
        ra = find_sized(parent, au[k])
        rb = find_sized(parent, av[k])
        if ra != rb:
            ra, rb = union_sized(parent, ra, rb)
            ta = term[ra]
            tb = term[rb]
            if ta >= 0 and tb >= 0:  # open: carried up as a super-edge between the two terminals
                oeu[oe] = vid[min(ta, tb)]
                oev[oe] = vid[max(ta, tb)]
                oew[oe] = aw[k]
                oec[oe] = ac[k]
                oe += 1
            else:  # a side with no way out of the block: the edge is final
                if ta < 0:
                    term[ra] = tb
                if _is_separator(ac[k], cols, tile):
                    kept_c[nkept] = ac[k]
                    kept_w[nkept] = aw[k]
                    nkept += 1
        elif not _is_separator(ac[k], cols, tile):
            removed_c[nrem] = ac[k]
            removed_w[nrem] = aw[k]
            nrem += 1
    return (ovid, ovh, ovm, oeu[:oe], oev[:oe], oew[:oe], oec[:oe],
            removed_c[:nrem], removed_w[:nrem], kept_c[:nkept], kept_w[:nkept])


# ---------------------------------------------------------------------------------------------
# Expand: apply the decisions to a window of the bitmask
# ---------------------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def apply_decisions(bits, r0, c0, cols, removed, kept):
    """Clear the bits of ``removed`` codes and set those of ``kept`` codes in the window at (r0, c0)."""
    for k in range(removed.shape[0]):
        lo = removed[k] >> 2
        d = RANK_TO_DIR[removed[k] & 3]
        bits[lo // cols - r0, lo % cols - c0] &= np.uint8(~(1 << d) & 0xFF)
    for k in range(kept.shape[0]):
        lo = kept[k] >> 2
        d = RANK_TO_DIR[kept[k] & 3]
        bits[lo // cols - r0, lo % cols - c0] |= np.uint8(1 << d)


@numba.njit(cache=True, nogil=True)
def count_edges(bits):
    """Number of edges in a bitmask window (serial: the expand pass runs windows in threads)."""
    total = 0
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            b = bits[i, j]
            total += (b & 1) + ((b >> 1) & 1) + ((b >> 2) & 1) + ((b >> 3) & 1)
    return total


# ---------------------------------------------------------------------------------------------
# Merge phase inside a batch: every level of its quadtree in one call
# ---------------------------------------------------------------------------------------------
def merge_batch(nv, vid, vh, vmask, ne, eu, ev, ew, ecode, tr, tc, levels, rows, cols, tile, kind):
    """All merges inside a full batch of ``4**levels`` tiles, bottom-up: every 4 consecutive blocks
    (siblings, by the Morton order) of a level merged by :func:`merge_blocks` -- the children's vertices
    and edges lie next to each other in flat arrays, so their concatenation is a slice.

    Input: ``tile_phase_batch``'s per-tile rows (padded to ``cap``, counts ``nv``/``ne``), the tiles
    in Morton order with their tile rows/columns ``tr``/``tc``. Returns the batch's block graph and all
    decisions, as ``merge_blocks`` does for one merge. A Python loop calling the merge's kernels (which
    release the GIL): a kernel of the whole loop compiled for ~10 s on a large DEM's first run, the
    kernels it linked in again; a merge is milliseconds, its call microseconds.
    """
    n = nv.shape[0]
    flat = [np.concatenate([rows_[t, :count[t]] for t in range(n)])
            for rows_, count in ((vid, nv), (vh, nv), (vmask, nv), (eu, ne), (ev, ne), (ew, ne), (ecode, ne))]
    voff = np.zeros(n + 1, np.int64)
    eoff = np.zeros(n + 1, np.int64)
    np.cumsum(nv, out=voff[1:])
    np.cumsum(ne, out=eoff[1:])
    decisions: list[list[np.ndarray]] = [[], [], [], []]  # removed codes, weights; kept codes, weights
    blocks = n
    for level in range(1, levels + 1):
        span = tile << level
        groups = blocks // 4
        merged = []
        for g in range(groups):
            first = g * 4 ** level  # the group's first tile
            br = tr[first] >> level
            bc = tc[first] >> level
            v0, v1 = voff[4 * g], voff[4 * g + 4]
            e0, e1 = eoff[4 * g], eoff[4 * g + 4]
            out = merge_blocks(*(a[v0:v1] for a in flat[:3]), *(a[e0:e1] for a in flat[3:]),
                               br * span, (br + 1) * span, bc * span, (bc + 1) * span, rows, cols, tile, kind)
            merged.append(out[:7])
            for log, part in zip(decisions, out[7:]):
                log.append(part)
        flat = [np.concatenate(arrays) for arrays in zip(*merged)]
        voff = np.zeros(groups + 1, np.int64)
        eoff = np.zeros(groups + 1, np.int64)
        np.cumsum([m[0].shape[0] for m in merged], out=voff[1:])
        np.cumsum([m[3].shape[0] for m in merged], out=eoff[1:])
        blocks = groups
    empty = (np.empty(0, np.int64), np.empty(0, np.float64))
    return (*flat, *(np.concatenate(log) if log else empty[k % 2] for k, log in enumerate(decisions)))
