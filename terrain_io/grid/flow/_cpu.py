"""numba kernels of flow routing (``terrain flow``): D8 directions, flats, accumulation.

Blocks
    The kernels work on a *block*: a window with a one-cell halo. ``vals``, ``ok`` (vertex mask,
    False outside the DEM) and ``outlet`` (cells that drain out of the DEM: ``fill._cpu.outlets``,
    the outlet definition of ``terrain fill``) have the block's shape (h + 2, w + 2); the direction
    codes they write have the interior's shape (h, w). In core the block is the whole DEM with a
    ring of non-vertices.

Directions (the contract in :mod:`.codes`)
    D8 steepest descent: over valid lower neighbours, slope = (z[c] - z[n]) / L[d] in float64
    (float64(z[c]) - float64(z[n]), no fast-math); the largest wins, ties the smallest code. A cell
    without a lower valid neighbour is OUTLET on an outlet cell, else *unresolved*.
    Flats: Barnes, Lehman & Mulla 2014, "An efficient assignment of drainage direction over flat
    surfaces" (Computers & Geosciences 62), with its two breadth-first searches as plain
    multi-source BFS over the unresolved cells (8-connected): ``towards`` from the low edges
    (unresolved cells beside a resolved cell of equal elevation), ``away`` from the high edges
    (unresolved cells beside a higher cell), 1 at the sources, 0 where unreached. The combined
    mask 2 * towards - away orders each flat as Barnes' 2 * towards + (FlatHeight - away) does,
    without flat labels. A flat cell drains to its equal neighbour of least mask (resolved cells
    count as -infinity; ties: least code); a flat with no low edge is SINK.

Accumulation
    s(c), the sum over c's donors n (neighbours whose code points at c) of v(n); v(n) = s(n) + w(n)
    (w = 1 for counts). The kernel stores s for counts (the ESRI convention, ``include_self=False``;
    the caller adds 1 for v, TauDEM's) and v for weights (:func:`finish_weights` takes w off for s).
    Sums are integers, so every order of adding gives the same
    bits (in core, tile by tile, on the GPU): counts in uint64, weights as exact fixed-point
    integers (:func:`weight_scale`): each weight w is q(w) = w * 2^S, an integer for the common
    scale S chosen from the weights' exponent range, summed in two 64-bit words (lo, hi: 128 bits,
    ``_add``), converted once at the end to the float64 nearest the sum (:func:`to_float`) times
    2^-S. O(n) without a queue (as Barnes 2017 describes for a tile):
    count each cell's donors, then from every cell without donors walk downstream, finishing a cell
    when its last donor is done (its donor count reaches 0). Halo cells of a block are not visited:
    the halo of ``acc`` holds their v, given (0 where they do not drain into the block).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ...errors import InputError
from ...jit import SERIAL_BELOW, serial_twin
from ...weights import DC, DR
from .codes import NODATA, OUTLET, SINK

UNRESOLVED = 254  # internal: no lower neighbour, not an outlet (a flat cell); never written out
DONE = 255  # donor count of a finished cell


@numba.njit(parallel=True, nogil=True, cache=True)
def d8(vals, ok, outlet, L, code):
    """D8 codes of the block's interior into ``code`` (h, w): 0..7, OUTLET, NODATA or UNRESOLVED;
    ``L``: the 8 step lengths (float64). Returns the number of unresolved cells."""
    h, w = code.shape
    unresolved = np.zeros(h, np.int64)
    for a in prange(h):
        for b in range(w):
            i, j = a + 1, b + 1
            if not ok[i, j]:
                code[a, b] = NODATA
                continue
            zc = vals[i, j]
            best = -1
            top = 0.0
            for d in range(8):
                ii, jj = i + DR[d], j + DC[d]
                if ok[ii, jj] and vals[ii, jj] < zc:
                    s = (np.float64(zc) - np.float64(vals[ii, jj])) / L[d]
                    if best < 0 or s > top:
                        best, top = d, s
            if best >= 0:
                code[a, b] = best
            elif outlet[i, j]:
                code[a, b] = OUTLET
            else:
                code[a, b] = UNRESOLVED
                unresolved[a] += 1
    return unresolved.sum()


@numba.njit(nogil=True, cache=True)
def _bfs(queue, n, dist, code):
    """Multi-source BFS over unresolved cells from ``queue[:n]`` (their dist already 1)."""
    h, w = code.shape
    head, tail = 0, n
    while head < tail:
        c = queue[head]
        head += 1
        a, b = c // w, c % w
        nxt = dist[a, b] + 1
        for d in range(8):
            a2, b2 = a + DR[d], b + DC[d]
            if 0 <= a2 < h and 0 <= b2 < w and code[a2, b2] == UNRESOLVED and dist[a2, b2] == 0:
                dist[a2, b2] = nxt
                queue[tail] = a2 * w + b2
                tail += 1


@numba.njit(nogil=True, cache=True)
def flats(vals, ok, code, towards, away, queue):
    """Barnes 2014 on the unresolved cells of ``code`` (module docstring): writes their codes.
    ``towards``/``away``: zeroed (h, w) integer scratch; ``queue``: int64 of at least the number
    of unresolved cells."""
    h, w = code.shape
    n = np.int64(0)  # (not a literal 0: _bfs would compile for Literal[int](0) too)
    for a in range(h):  # high edges
        for b in range(w):
            if code[a, b] != UNRESOLVED:
                continue
            z = vals[a + 1, b + 1]
            for d in range(8):
                i, j = a + 1 + DR[d], b + 1 + DC[d]
                if ok[i, j] and vals[i, j] > z:
                    away[a, b] = 1
                    queue[n] = a * w + b
                    n += 1
                    break
    _bfs(queue, n, away, code)
    n = np.int64(0)
    for a in range(h):  # low edges
        for b in range(w):
            if code[a, b] != UNRESOLVED:
                continue
            z = vals[a + 1, b + 1]
            for d in range(8):
                a2, b2 = a + DR[d], b + DC[d]
                if ok[a2 + 1, b2 + 1] and vals[a2 + 1, b2 + 1] == z and code[a2, b2] != UNRESOLVED:
                    towards[a, b] = 1
                    queue[n] = a * w + b
                    n += 1
                    break
    _bfs(queue, n, towards, code)
    for a in range(h):  # directions: towards > 0 marks the drainable flat cells (resolved cells have 0)
        for b in range(w):
            if code[a, b] != UNRESOLVED:
                continue
            if towards[a, b] == 0:
                code[a, b] = SINK
                continue
            z = vals[a + 1, b + 1]
            m = 2 * np.int64(towards[a, b]) - np.int64(away[a, b])
            best = -1
            low = m
            for d in range(8):
                a2, b2 = a + DR[d], b + DC[d]
                if not (ok[a2 + 1, b2 + 1] and vals[a2 + 1, b2 + 1] == z):
                    continue
                if towards[a2, b2] == 0:  # resolved: mask -infinity
                    best = d
                    break
                mn = 2 * np.int64(towards[a2, b2]) - np.int64(away[a2, b2])
                if mn < low:
                    best, low = d, mn
            code[a, b] = best


# --- exact weighted sums: fixed-point integers of 128 bits in two uint64 words -----------------------------------

_U0, _U1 = np.uint64(0), np.uint64(1)
_MANT = np.uint64((1 << 52) - 1)


def weight_scale(cells: int, top: int, low: int) -> tuple[int, bool]:
    """The scale S of the weights' fixed-point sums and whether they are exact: ``top`` the largest
    binary exponent of the valid cells' weights (w < 2^(top + 1)), ``low`` the exponent of the
    lowest set bit of any of them (:func:`weight_range`; None for all zero), ``cells`` the grid's
    cells (a bound on the number of terms). Every q(w) = w * 2^S is an integer when S >= -low (exact);
    the sum of all q stays below 2^127 (no carry out of the high word) when S <= 125 - ceil(log2
    cells) - top. Beyond that range the weights are rounded to multiples of 2^-S (not exact)."""
    if low is None:
        return 0, True
    most = 125 - max(int(cells) - 1, 1).bit_length() - int(top)
    return min(-int(low), most), -int(low) <= most


@numba.njit(parallel=True, nogil=True, cache=True)
def weight_range(wbits, code):
    """(top, low) of :func:`weight_scale` over the cells of ``wbits`` (the weights' float64 bits,
    (h, w)) whose ``code`` ((h, w)) is not NODATA, and whether any weight there is > 0."""
    h, w = wbits.shape
    tops = np.full(h, -100000, np.int64)
    lows = np.full(h, 100000, np.int64)
    for a in prange(h):
        for b in range(w):
            x = wbits[a, b] & np.uint64(0x7FFFFFFFFFFFFFFF)
            if code[a, b] == NODATA or x == _U0:
                continue
            e = np.int64(x >> np.uint64(52))
            m = x & _MANT
            if e == 0:  # subnormal: m * 2^-1074
                e = np.int64(-1074)
                t = e - 1
                y = m
                while y:
                    t += 1
                    y >>= _U1
            else:
                m |= _MANT + _U1
                e -= 1075
                t = e + 52
            low = m & (~m + _U1)  # the lowest set bit, a power of two <= 2^52: exact as a float64
            tops[a] = max(tops[a], t)
            lows[a] = min(lows[a], e + math.frexp(np.float64(low))[1] - 1)
    return tops.max(), lows.min(), lows.min() < 100000


def scale_of(wbits, code, cells: int, note: bool = True) -> int:
    """:func:`weight_scale` of the weights' bits at the valid cells of ``code``; one note when the
    sums cannot be exact."""
    top, low, any_ = weight_range(wbits, code)
    return checked_scale(cells, int(top), int(low) if any_ else None, note)


def checked_scale(cells: int, top: int, low, note: bool = True) -> int:
    import warnings

    from ...errors import TerrainNote

    scale, exact = weight_scale(cells, top, low)
    if not exact and note:
        warnings.warn(f"flow: the weights span 2^{low} .. 2^{top + 1}, too wide for exact 128-bit sums over "
                      f"{cells:,} cells: each weight is rounded to a multiple of 2^{-scale} first", TerrainNote,
                      stacklevel=3)
    return scale


@numba.njit(nogil=True, inline="always")
def _q(bits, scale):
    """(lo, hi) of q(w) = w * 2^scale for the float64 w of ``bits`` (finite, >= 0), rounded half up
    to an integer when w * 2^scale is not one."""
    x = bits & np.uint64(0x7FFFFFFFFFFFFFFF)
    if x == _U0:
        return _U0, _U0
    e = np.int64(x >> np.uint64(52))
    m = x & _MANT
    if e == 0:
        e = np.int64(-1074)
    else:
        m |= _MANT + _U1
        e -= 1075
    sh = e + scale
    if sh >= 64:
        return _U0, m << np.uint64(sh - 64)
    if sh > 0:
        return m << np.uint64(sh), m >> np.uint64(64 - sh)
    if sh == 0:
        return m, _U0
    if sh < -53:
        return _U0, _U0
    k = np.uint64(-sh)
    return (m + (_U1 << (k - _U1))) >> k, _U0


@numba.njit(nogil=True, inline="always")
def _add(alo, ahi, blo, bhi):
    lo = alo + blo
    return lo, ahi + bhi + (_U1 if lo < alo else _U0)


@numba.njit(nogil=True, cache=True)
def to_float(lo, hi, scale):
    """The float64 nearest (lo + hi * 2^64) * 2^-scale (ties to even; a result below 2^-1022 is
    rounded twice)."""
    if hi == _U0:
        return math.ldexp(np.float64(lo), -scale)
    n = 0
    t = hi
    while not t >> np.uint64(63):
        t <<= _U1
        n += 1
    rest = lo
    if n:
        t |= lo >> np.uint64(64 - n)
        rest = lo << np.uint64(n)
    if rest:
        t |= _U1  # sticky: the bits below t's round bit are not all zero
    return math.ldexp(np.float64(t), 64 - n - scale)


@numba.njit(parallel=True, nogil=True, cache=True)
def finish_weights(code, wbits, scale, include_self, lo, hi, out):
    """The float64 sums of the block's interior (``out`` (h, w), which may be ``lo``'s own words
    viewed as float64) from v (:func:`accumulate`'s weighted words): v, or s = v - q(w) without
    the cell; 0 at nodata."""
    h, w = out.shape
    for a in prange(h):
        for b in range(w):
            if code[a + 1, b + 1] == NODATA:
                out[a, b] = 0.0
                continue
            vl, vh = lo[a + 1, b + 1], hi[a + 1, b + 1]
            if not include_self:
                ql, qh = _q(wbits[a, b], scale)
                vh = vh - qh - (_U1 if vl < ql else _U0)
                vl = vl - ql
            out[a, b] = to_float(vl, vh, scale)


@numba.njit(nogil=True, cache=True)
def _pull(code, weighted, lo, hi, a, b):
    """s of interior cell (a, b): the sum of its donors' v (module docstring), as (lo, hi); the
    weighted words hold v, the counts s inside the block (and v in the halo)."""
    h, w = code.shape[0] - 2, code.shape[1] - 2
    sl, sh = _U0, _U0
    for d in range(8):
        i, j = a + 1 + DR[d], b + 1 + DC[d]
        if code[i, j] != (d ^ 4):
            continue
        if weighted:
            sl, sh = _add(sl, sh, lo[i, j], hi[i, j])
        else:
            sl += lo[i, j] + (_U1 if 1 <= i <= h and 1 <= j <= w else _U0)
    return sl, sh


@numba.njit(nogil=True, cache=True)
def accumulate(code, wbits, weighted, scale, lo, hi, donors):
    """s of every interior cell of the block (module docstring) into ``lo`` -- for weights v = s +
    q(w) into ``lo`` and ``hi`` (:func:`finish_weights` takes q off again for s) -- (h + 2, w + 2)
    uint64: their halo holds the given v of outside donors, their interior any values;
    ``code``: the block's codes (halo included); ``wbits``: (h, w) the float64 bits of the weights
    when ``weighted`` (``scale``: :func:`weight_scale`), else counts (``hi`` unused, any uint64
    array); ``donors``: (h, w) uint8 scratch. Returns the number of valid interior cells left
    unfinished (on a cycle: 0 for codes from :func:`d8` and :func:`flats`)."""
    h, w = donors.shape
    left = 0
    for a in range(h):
        for b in range(w):
            n = 0
            for d in range(8):
                i, j = a + 1 + DR[d], b + 1 + DC[d]
                if 1 <= i <= h and 1 <= j <= w and code[i, j] == (d ^ 4):
                    n += 1
            donors[a, b] = n
            if code[a + 1, b + 1] != NODATA:
                left += 1
            else:
                lo[a + 1, b + 1] = _U0
                if weighted:
                    hi[a + 1, b + 1] = _U0
    for a0 in range(h):
        for b0 in range(w):
            if donors[a0, b0] != 0 or code[a0 + 1, b0 + 1] == NODATA:
                continue
            a, b = a0, b0
            while True:
                sl, sh = _pull(code, weighted, lo, hi, a, b)
                if weighted:
                    ql, qh = _q(wbits[a, b], scale)
                    sl, sh = _add(sl, sh, ql, qh)
                    hi[a + 1, b + 1] = sh
                lo[a + 1, b + 1] = sl
                donors[a, b] = DONE
                left -= 1
                d = code[a + 1, b + 1]
                if d >= 8:
                    break
                a2, b2 = a + DR[d], b + DC[d]
                if not (0 <= a2 < h and 0 <= b2 < w) or code[a2 + 1, b2 + 1] == NODATA:
                    break
                donors[a2, b2] -= 1
                if donors[a2, b2] != 0:
                    break
                a, b = a2, b2
    return left


d8_serial = serial_twin(d8)


def ringed(values: np.ndarray, fill) -> np.ndarray:
    """``values`` inside a one-cell ring of ``fill`` (the in-core block)."""
    out = np.empty((values.shape[0] + 2, values.shape[1] + 2), values.dtype)
    out[0], out[-1], out[:, 0], out[:, -1] = fill, fill, fill, fill
    out[1:-1, 1:-1] = values
    return out


def solve_flats(vals: np.ndarray, ok: np.ndarray, code: np.ndarray, unresolved: int) -> None:
    """:func:`flats` with its scratch: BFS distances in int32 (a flat has fewer cells than the
    block), int64 for blocks of 2^31 cells or more."""
    if not unresolved:
        return
    dist = np.int32 if code.size < 2**31 else np.int64
    towards, away = np.zeros(code.shape, dist), np.zeros(code.shape, dist)
    flats(vals, ok, code, towards, away, np.empty(unresolved, np.int64))


def directions(z, valid, dx, dy, outlets: str = "edge+nodata") -> np.ndarray:
    """D8 + flats codes (uint8, :mod:`.codes`) of an in-memory DEM ``z`` with vertex mask ``valid``
    and cell size ``dx`` (column step) x ``dy`` (row step); ``outlets``: ``edge+nodata`` or ``edge``."""
    return routed(z, valid, dx, dy, outlets)[0]


def routed(z, valid, dx, dy, outlets: str = "edge+nodata") -> tuple[np.ndarray, int]:
    """:func:`directions` and the number of flat cells (no lower neighbour, not an outlet: routed by
    the flat rule, or SINK)."""
    from ..fill._cpu import outlets as outlet_cells, outlets_serial
    from ...weights import steps_of

    z = np.asarray(z)
    rows, cols = z.shape
    small = rows * cols < SERIAL_BELOW
    vals = ringed(z, 0)
    ok = ringed(np.asarray(valid, bool), False)
    outl = (outlets_serial if small else outlet_cells)(ok, 0, 0, rows, cols, outlets == "edge+nodata")
    code = np.empty((rows, cols), np.uint8)
    unresolved = (d8_serial if small else d8)(vals, ok, outl, steps_of(float(dx), float(dy)), code)
    del outl
    solve_flats(vals, ok, code, int(unresolved))
    return code, int(unresolved)


def accumulation(direction, weights=None, include_self: bool = True) -> np.ndarray:
    """Flow accumulation of direction codes (module docstring): uint64 counts, or float64 sums of
    ``weights`` (finite, >= 0 at valid cells; exact fixed-point sums, :func:`weight_scale`); 0 at
    nodata. Raises InputError on a cycle."""
    direction = np.asarray(direction, np.uint8)
    code = ringed(direction, NODATA)
    rows, cols = direction.shape
    lo = np.zeros((rows + 2, cols + 2), np.uint64)
    if weights is None:
        wbits, hi, scale = np.ones((1, 1), np.uint64), lo, 0
    else:
        wbits = np.ascontiguousarray(weights, np.float64).view(np.uint64)
        hi, scale = np.zeros_like(lo), scale_of(wbits, direction, rows * cols)
    left = accumulate(code, wbits, weights is not None, scale, lo, hi, np.empty((rows, cols), np.uint8))
    if left:
        raise InputError(f"the flow directions have cycles: {left:,} cells never drain")
    if weights is not None:  # the float64 sums over the low words (no second array of 8 bytes a cell)
        out = lo.view(np.float64)[1:-1, 1:-1]
        finish_weights(code, wbits, scale, include_self, lo, hi, out)
        return out
    out = lo[1:-1, 1:-1]  # a view: no copy of 8 bytes a cell at the peak
    if include_self:
        for r in range(0, rows, 256):  # v = s + 1, a band at a time (no full-size temporaries)
            out[r : r + 256][code[1:-1, 1:-1][r : r + 256] != NODATA] += _U1
    return out


# --- out of core: flats from a compact list of their cells, accumulation tile by tile --------------------------

@numba.njit(nogil=True, cache=True)
def flat_cells(vals, ok, code, r0, c0, cols, gid, high, lowdir):
    """The unresolved cells of a window (out of core): global ids (row-major, in row order of the
    window), high-edge flags and ``lowdir``, the least code of a resolved valid neighbour of equal
    elevation (255: none; such a cell is a low edge and drains there). ``vals``/``ok``: the window
    with a two-cell halo; ``code``: :func:`d8` of the window with a one-cell ring (h + 2, w + 2)."""
    h, w = code.shape[0] - 2, code.shape[1] - 2
    n = 0
    for a in range(1, h + 1):
        for b in range(1, w + 1):
            if code[a, b] != UNRESOLVED:
                continue
            z = vals[a + 1, b + 1]
            up = False
            low = 255
            for d in range(8):
                i, j = a + 1 + DR[d], b + 1 + DC[d]
                if not ok[i, j]:
                    continue
                if vals[i, j] > z:
                    up = True
                elif vals[i, j] == z and low == 255 and code[a + DR[d], b + DC[d]] != UNRESOLVED:
                    low = d
            gid[n] = (r0 + a - 1) * cols + c0 + b - 1
            high[n] = up
            lowdir[n] = low
            n += 1
    return n


@numba.njit(nogil=True, cache=True)
def find_id(ids, x):
    k = np.searchsorted(ids, x)
    if k < len(ids) and ids[k] == x:
        return k
    return -1


@numba.njit(nogil=True, cache=True)
def _compact_bfs(ids, rows, cols, dist, queue, n):
    head, tail = 0, n
    while head < tail:
        k = queue[head]
        head += 1
        r, c = ids[k] // cols, ids[k] % cols
        for d in range(8):
            r2, c2 = r + DR[d], c + DC[d]
            if 0 <= r2 < rows and 0 <= c2 < cols:
                k2 = find_id(ids, r2 * cols + c2)
                if k2 >= 0 and dist[k2] == 0:
                    dist[k2] = dist[k] + 1
                    queue[tail] = k2
                    tail += 1


@numba.njit(nogil=True, cache=True)
def flats_compact(ids, high, lowdir, rows, cols, out):
    """:func:`flats` over the sorted global ids of all unresolved cells (two unresolved cells are
    neighbours when their ids are 8-adjacent: they have equal elevation), their high-edge flags and
    low-edge directions (:func:`flat_cells`): their codes into ``out``. Same BFS, same mask, same
    tie rule as :func:`flats`, so the same codes."""
    u = len(ids)
    towards, away = np.zeros(u, np.int64), np.zeros(u, np.int64)
    queue = np.empty(u, np.int64)
    n = 0
    for k in range(u):
        if high[k]:
            away[k] = 1
            queue[n] = k
            n += 1
    _compact_bfs(ids, rows, cols, away, queue, n)
    n = 0
    for k in range(u):
        if lowdir[k] != 255:
            towards[k] = 1
            queue[n] = k
            n += 1
    _compact_bfs(ids, rows, cols, towards, queue, n)
    for k in range(u):
        if towards[k] == 0:
            out[k] = SINK
        elif lowdir[k] != 255:
            out[k] = lowdir[k]
        else:
            m = 2 * towards[k] - away[k]
            r, c = ids[k] // cols, ids[k] % cols
            best = -1
            for d in range(8):
                r2, c2 = r + DR[d], c + DC[d]
                if 0 <= r2 < rows and 0 <= c2 < cols:
                    k2 = find_id(ids, r2 * cols + c2)
                    if k2 >= 0 and 2 * towards[k2] - away[k2] < m:
                        best, m = d, 2 * towards[k2] - away[k2]
            out[k] = best


@numba.njit(nogil=True, cache=True)
def set_codes(code, r0, c0, cols, ids, codes):
    """Write ``codes`` of global cells ``ids`` (sorted) that lie in the window at (r0, c0)."""
    h, w = code.shape
    lo = np.searchsorted(ids, r0 * cols)
    for k in range(lo, len(ids)):
        r, c = ids[k] // cols - r0, ids[k] % cols - c0
        if r >= h:
            break
        if 0 <= c < w:
            code[r, c] = codes[k]


@numba.njit(nogil=True, cache=True)
def tile_links(code, wbits, weighted, scale, lo, hi, r0, c0, cols):
    """Tile phase of Barnes 2017 ("Parallel non-divergent flow accumulation for trillion cell
    digital elevation models") on one window: ``lo``/``hi`` (halo zero) get the in-tile s
    (:func:`accumulate`); returns its *exits* (cells draining into another window: global id, the
    receiving cell's id, in-tile v as rows (lo, hi) of weighted sums, (count,) of counts) and its
    *entries* (cells with a donor in the halo: global id, the exit its in-tile flow path leaves by,
    -1 when the path ends inside)."""
    h, w = code.shape[0] - 2, code.shape[1] - 2
    accumulate(code, wbits, weighted, scale, lo, hi, np.empty((h, w), np.uint8))
    n_exit = 0
    n_entry = 0
    for a in range(1, h + 1):
        for b in range(1, w + 1):
            d = code[a, b]
            if d < 8:
                i, j = a + DR[d], b + DC[d]
                if not (1 <= i <= h and 1 <= j <= w) and code[i, j] != NODATA:
                    n_exit += 1
            if d != NODATA:
                for e in range(8):
                    i, j = a + DR[e], b + DC[e]
                    if not (1 <= i <= h and 1 <= j <= w) and code[i, j] == (e ^ 4):
                        n_entry += 1
                        break
    exit_id = np.empty(n_exit, np.int64)
    exit_to = np.empty(n_exit, np.int64)
    exit_v = np.empty((n_exit, 2 if weighted else 1), np.uint64)
    entry_id = np.empty(n_entry, np.int64)
    entry_link = np.empty(n_entry, np.int64)
    leaves = np.full((h, w), -2, np.int64)  # the exit a cell's path leaves by; -1 none, -2 not known yet
    path = np.empty(h * w, np.int64)
    n_exit = 0
    n_entry = 0
    for a in range(1, h + 1):
        for b in range(1, w + 1):
            d = code[a, b]
            if d < 8:
                i, j = a + DR[d], b + DC[d]
                if not (1 <= i <= h and 1 <= j <= w) and code[i, j] != NODATA:
                    exit_id[n_exit] = (r0 + a - 1) * cols + c0 + b - 1
                    exit_to[n_exit] = (r0 + i - 1) * cols + c0 + j - 1
                    if weighted:  # the words hold v
                        exit_v[n_exit, 0], exit_v[n_exit, 1] = lo[a, b], hi[a, b]
                    else:
                        exit_v[n_exit, 0] = lo[a, b] + _U1
                    n_exit += 1
            if d == NODATA:
                continue
            entry = False
            for e in range(8):
                i, j = a + DR[e], b + DC[e]
                if not (1 <= i <= h and 1 <= j <= w) and code[i, j] == (e ^ 4):
                    entry = True
                    break
            if not entry:
                continue
            m = 0  # walk down to a cell of known exit, then name it along the path
            i, j = a, b
            found = -1
            while True:
                if leaves[i - 1, j - 1] != -2:
                    found = leaves[i - 1, j - 1]
                    break
                path[m] = (i - 1) * w + j - 1
                m += 1
                d = code[i, j]
                if d >= 8:
                    break
                i2, j2 = i + DR[d], j + DC[d]
                if not (1 <= i2 <= h and 1 <= j2 <= w):
                    found = -1 if code[i2, j2] == NODATA else (r0 + i - 1) * cols + c0 + j - 1
                    break
                if code[i2, j2] == NODATA:
                    break
                i, j = i2, j2
            for q in range(m):
                leaves[path[q] // w, path[q] % w] = found
            entry_id[n_entry] = (r0 + a - 1) * cols + c0 + b - 1
            entry_link[n_entry] = found
            n_entry += 1
    return exit_id, exit_to, exit_v, entry_id, entry_link


@numba.njit(nogil=True, cache=True)
def solve_exits(exit_id, exit_to, exit_v, entry_id, entry_link):
    """Boundary solve of Barnes 2017: the final v of every exit (``exit_id`` sorted, ``entry_id``
    sorted; values as rows (lo, hi), or (count,)): each exit adds its v to the exit its receiver's path leaves
    by, in topological order (Kahn); returns the v, or raises on a cycle."""
    n = len(exit_id)
    down = np.full(n, -1, np.int64)
    indeg = np.zeros(n, np.int64)
    for k in range(n):
        x = find_id(entry_id, exit_to[k])
        if x >= 0 and entry_link[x] >= 0:
            down[k] = find_id(exit_id, entry_link[x])
            indeg[down[k]] += 1
    v = exit_v.copy()
    queue = np.empty(n, np.int64)
    tail = 0
    for k in range(n):
        if indeg[k] == 0:
            queue[tail] = k
            tail += 1
    head = 0
    while head < tail:
        k = queue[head]
        head += 1
        j = down[k]
        if j >= 0:
            if v.shape[1] == 2:
                v[j, 0], v[j, 1] = _add(v[j, 0], v[j, 1], v[k, 0], v[k, 1])
            else:
                v[j, 0] += v[k, 0]
            indeg[j] -= 1
            if indeg[j] == 0:
                queue[tail] = j
                tail += 1
    if tail != n:
        raise ValueError("the flow directions have cycles")
    return v


@numba.njit(nogil=True, cache=True)
def set_inflows(code, weighted, lo, hi, r0, c0, cols, exit_id, v):
    """The halo of a window's ``lo``/``hi`` (zeroed): the final v of every halo cell that drains
    into the window."""
    H, W = code.shape
    for a in range(H):
        for b in range(W):
            if 1 <= a <= H - 2 and 1 <= b <= W - 2:
                continue
            d = code[a, b]
            if d >= 8:
                continue
            i, j = a + DR[d], b + DC[d]
            if 1 <= i <= H - 2 and 1 <= j <= W - 2:
                k = find_id(exit_id, (r0 + a - 1) * cols + c0 + b - 1)
                lo[a, b] = v[k, 0]
                if weighted:
                    hi[a, b] = v[k, 1]


# --- out of core: flats by window sweeps (the flat cells of the DEM do not fit the memory budget) -------------

@numba.njit(nogil=True, cache=True)
def _halo_flat(pid, r0, c0, cols, i, j):
    """Index in ``pid`` of halo cell (i, j) of the window at (r0, c0) when it is a flat cell, else -1."""
    return find_id(pid, (r0 + i - 1) * cols + c0 + j - 1)


@numba.njit(nogil=True, cache=True)
def window_bfs(code, vals, ok, r0, c0, cols, pid, pval, towards, dist, queue, inq):
    """One BFS of Barnes 2014 (``towards``: from the low edges, else from the high edges) inside a
    window, seeded also from its halo: a halo flat cell k (in the sorted perimeter list ``pid``) at
    distance ``pval[k]`` > 0 offers pval[k] + 1 to its flat neighbours inside. ``code``, ``vals``,
    ``ok``: the window with a one-cell halo (UNRESOLVED marks inside); ``dist`` (h, w): 0 unreached.
    Label-correcting FIFO (seeds differ in distance), each cell queued at most once at a time."""
    H, W = code.shape
    h, w = H - 2, W - 2
    cap = h * w
    head = 0
    size = 0
    for a in range(1, h + 1):
        for b in range(1, w + 1):
            dist[a - 1, b - 1] = 0
            inq[a - 1, b - 1] = False
    for a in range(1, h + 1):
        for b in range(1, w + 1):
            if code[a, b] != UNRESOLVED:
                continue
            z = vals[a, b]
            best = 0
            for d in range(8):
                i, j = a + DR[d], b + DC[d]
                if not ok[i, j]:
                    continue
                inside = 1 <= i <= h and 1 <= j <= w
                if not towards and vals[i, j] > z:
                    best = 1
                    break
                if vals[i, j] != z:
                    continue
                k = -1 if inside else _halo_flat(pid, r0, c0, cols, i, j)
                if towards and (code[i, j] != UNRESOLVED if inside else k < 0):
                    best = 1  # a resolved neighbour of equal elevation: a low edge
                    break
                if k >= 0 and pval[k] > 0 and (best == 0 or pval[k] + 1 < best):
                    best = pval[k] + 1
            if best:
                dist[a - 1, b - 1] = best
                queue[(head + size) % cap] = (a - 1) * w + b - 1
                size += 1
                inq[a - 1, b - 1] = True
    while size:
        c = queue[head]
        head = (head + 1) % cap
        size -= 1
        a, b = c // w, c % w
        inq[a, b] = False
        nxt = dist[a, b] + 1
        for d in range(8):
            a2, b2 = a + DR[d], b + DC[d]
            if 0 <= a2 < h and 0 <= b2 < w and code[a2 + 1, b2 + 1] == UNRESOLVED and \
                    (dist[a2, b2] == 0 or nxt < dist[a2, b2]):
                dist[a2, b2] = nxt
                if not inq[a2, b2]:
                    queue[(head + size) % cap] = a2 * w + b2
                    size += 1
                    inq[a2, b2] = True


@numba.njit(nogil=True, cache=True)
def window_flat_codes(code, vals, ok, r0, c0, cols, pid, p_tow, p_away, towards, away, out):
    """The codes of a window's flat cells (the rule of :func:`flats`) into ``out`` (h, w), from the
    window's converged ``towards``/``away`` and its halo's (the perimeter list)."""
    H, W = code.shape
    h, w = H - 2, W - 2
    for a in range(1, h + 1):
        for b in range(1, w + 1):
            if code[a, b] != UNRESOLVED:
                continue
            if towards[a - 1, b - 1] == 0:
                out[a - 1, b - 1] = SINK
                continue
            z = vals[a, b]
            m = 2 * towards[a - 1, b - 1] - away[a - 1, b - 1]
            best = -1
            for d in range(8):
                i, j = a + DR[d], b + DC[d]
                if not (ok[i, j] and vals[i, j] == z):
                    continue
                if 1 <= i <= h and 1 <= j <= w:
                    if code[i, j] != UNRESOLVED:
                        best = d
                        break
                    mn = 2 * towards[i - 1, j - 1] - away[i - 1, j - 1]
                else:
                    k = _halo_flat(pid, r0, c0, cols, i, j)
                    if k < 0:
                        best = d
                        break
                    mn = 2 * p_tow[k] - p_away[k]
                if mn < m:
                    best, m = d, mn
            out[a - 1, b - 1] = best


@numba.njit(nogil=True, cache=True)
def perimeter_flats(code, r0, c0, cols):
    """Global ids of the flat (UNRESOLVED) cells on a window's perimeter, from its codes (h, w)."""
    h, w = code.shape
    n = 0
    out = np.empty(2 * (h + w), np.int64)
    for a in range(h):
        for b in range(w):
            if (a == 0 or b == 0 or a == h - 1 or b == w - 1) and code[a, b] == UNRESOLVED:
                out[n] = (r0 + a) * cols + c0 + b
                n += 1
    return out[:n]


@numba.njit(nogil=True, cache=True)
def update_perimeter(pid, pval, ids, dist, r0, c0, cols):
    """Write a window's perimeter distances into the list; returns whether any changed."""
    changed = False
    for q in range(len(ids)):
        k = find_id(pid, ids[q])
        v = dist[ids[q] // cols - r0, ids[q] % cols - c0]
        if pval[k] != v:
            pval[k] = v
            changed = True
    return changed
