"""numba kernels of the out-of-core hydrology (:mod:`.tiled`): a value carried from the roots of a
forest of cells to every cell of its trees, one window at a time.

Forests
    Each cell has at most one *parent*, an 8-neighbour. The *flow forest*: a cell's parent is its
    downstream cell (:func:`.._cpu.down`); its roots are the terminal cells and the seeded cells
    (watershed outlets, HAND's stream cells), so a cell takes the value of the first root its flow
    path meets. The *link forest* of a stream network: a stream cell's parent is its one stream
    donor; cells with no or several stream donors (the links' heads) are its roots, so a stream
    cell takes its link's head.

Windows (the plan of Barnes 2017 for accumulation, run the other way: values flow from roots)
    Within a window every cell's parent chain ends at a root or at an *exit* (a cell whose parent
    lies outside the window, :func:`chain_ends`). The tile phase hands up each exit (its id and its
    parent's) and each perimeter cell's chain end (a parent outside a window is on that window's
    perimeter); :func:`solve_exits` follows exit -> parent's chain end -> exit ... to a root, for
    every exit; the final phase gives each cell its chain end's value.

Parent codes (``par``, one a window cell, row-major in the window): >= 0 the window index of the
parent, ROOT, OUT (the parent's global id in ``out_gid``), NONE (nodata, off the network).
"""
from __future__ import annotations

import numba
import numpy as np

from ...weights import DC, DR
from ..flow._cpu import find_id
from ..flow.codes import NODATA

ROOT, OUT, NONE = -1, -2, -3
UNKNOWN = -4


@numba.njit(nogil=True, cache=True)
def flow_parents(code, seed, r0, c0, cols, par, out_gid):
    """The flow forest of a window: ``code`` its directions with a one-cell halo (NODATA outside the
    DEM), ``seed`` (h, w) non-zero at seeded cells (roots)."""
    H, W = code.shape
    h, w = H - 2, W - 2
    for a in range(h):
        for b in range(w):
            i = a * w + b
            d = code[a + 1, b + 1]
            if d == NODATA:
                par[i] = NONE
                continue
            if seed[a, b] or d >= 8:
                par[i] = ROOT
                continue
            a2, b2 = a + DR[d], b + DC[d]
            if code[a2 + 1, b2 + 1] == NODATA:
                par[i] = ROOT
            elif 0 <= a2 < h and 0 <= b2 < w:
                par[i] = a2 * w + b2
            else:
                par[i] = OUT
                out_gid[i] = (r0 + a2) * cols + c0 + b2


@numba.njit(nogil=True, cache=True)
def link_parents(code, stream, r0, c0, cols, par, out_gid):
    """The link forest of a window: ``code`` and ``stream`` (bool) with a one-cell halo."""
    H, W = code.shape
    h, w = H - 2, W - 2
    for a in range(h):
        for b in range(w):
            i = a * w + b
            if not stream[a + 1, b + 1]:
                par[i] = NONE
                continue
            n = 0
            da, db = 0, 0
            for e in range(8):
                i2, j2 = a + 1 + DR[e], b + 1 + DC[e]
                if stream[i2, j2] and code[i2, j2] == (e ^ 4):
                    n += 1
                    da, db = DR[e], DC[e]
            if n != 1:
                par[i] = ROOT
                continue
            a2, b2 = a + da, b + db
            if 0 <= a2 < h and 0 <= b2 < w:
                par[i] = a2 * w + b2
            else:
                par[i] = OUT
                out_gid[i] = (r0 + a2) * cols + c0 + b2


@numba.njit(nogil=True, cache=True)
def chain_ends(par, end):
    """``end[i]``: the window index of the last cell of i's parent chain inside the window (a ROOT
    or an OUT cell), -1 for NONE; path compression, O(window). Returns False on a cycle."""
    n = par.size
    for i in range(n):
        end[i] = UNKNOWN
    path = np.empty(n, np.int64)
    for i in range(n):
        if end[i] != UNKNOWN:
            continue
        if par[i] == NONE:
            end[i] = -1
            continue
        m = 0
        j = i
        while True:
            if end[j] != UNKNOWN:
                e = end[j]
                break
            if m == n:
                return False
            path[m] = j
            m += 1
            if par[j] < 0:
                e = j
                break
            j = par[j]
        for q in range(m):
            end[path[q]] = e
    return True


@numba.njit(nogil=True, cache=True)
def tile_records(par, out_gid, end, h, w, r0, c0, cols):
    """The tile phase's hand-up: the exits (own global id, parent's global id) and the perimeter
    cells' chain ends (own global id, the end's window index)."""
    n_exit = 0
    n_rec = 0
    for i in range(h * w):
        if par[i] == OUT:
            n_exit += 1
        a, b = i // w, i % w
        if (a == 0 or b == 0 or a == h - 1 or b == w - 1) and end[i] >= 0:
            n_rec += 1
    exit_gid = np.empty(n_exit, np.int64)
    exit_par = np.empty(n_exit, np.int64)
    rec_gid = np.empty(n_rec, np.int64)
    rec_end = np.empty(n_rec, np.int64)
    n_exit = 0
    n_rec = 0
    for i in range(h * w):  # row-major: both lists come out sorted by global id
        a, b = i // w, i % w
        g = (r0 + a) * cols + c0 + b
        if par[i] == OUT:
            exit_gid[n_exit] = g
            exit_par[n_exit] = out_gid[i]
            n_exit += 1
        if (a == 0 or b == 0 or a == h - 1 or b == w - 1) and end[i] >= 0:
            rec_gid[n_rec] = g
            rec_end[n_rec] = end[i]
            n_rec += 1
    return exit_gid, exit_par, rec_gid, rec_end


@numba.njit(nogil=True, cache=True)
def solve_exits(exit_gid, exit_par, rec_gid, rec_exit, rec_tag, rec_z, tag, z):
    """Boundary solve: the value (``tag``, ``z``) of every exit (``exit_gid`` sorted): its parent's
    perimeter record (``rec_gid`` sorted) ends at a root of value (``rec_tag``, ``rec_z``) or at
    the exit ``rec_exit`` (global id; -1 for a root), followed to a root with path compression.
    Returns False on a cycle."""
    n = len(exit_gid)
    state = np.zeros(n, np.uint8)  # 0 unsolved, 1 on the current path, 2 solved
    path = np.empty(n, np.int64)
    for k0 in range(n):
        if state[k0] == 2:
            continue
        m = 0
        k = k0
        while True:
            if state[k] == 2:
                t, v = tag[k], z[k]
                break
            if state[k] == 1:
                return False
            state[k] = 1
            path[m] = k
            m += 1
            r = find_id(rec_gid, exit_par[k])
            if rec_exit[r] < 0:
                t, v = rec_tag[r], rec_z[r]
                break
            k = find_id(exit_gid, rec_exit[r])
        for q in range(m):
            tag[path[q]] = t
            z[path[q]] = v
            state[path[q]] = 2
    return True


@numba.njit(nogil=True, cache=True)
def cell_values(par, end, h, w, r0, c0, cols, root_tag, root_z, exit_gid, exit_tag, exit_z, tag, z):
    """The final phase: every cell's value, its chain end's (a root's own, an exit's solved);
    NONE cells keep what ``tag``/``z`` hold."""
    for i in range(h * w):
        e = end[i]
        if e < 0:
            continue
        if par[e] == ROOT:
            tag[i] = root_tag[e]
            z[i] = root_z[e]
        else:
            k = find_id(exit_gid, (r0 + e // w) * cols + c0 + e % w)
            tag[i] = exit_tag[k]
            z[i] = exit_z[k]


@numba.njit(nogil=True, cache=True)
def link_ends(code, stream, acc, link, r0, c0, cols, heads, tail, downstream, cells, upstream):
    """Per link (index = id - 1) of a window's stream cells: ``cells`` counted, and at its last
    cell (whose downstream cell is off the network, a head, or none) ``tail`` (global id),
    ``downstream`` (the link of that head, 0 none) and ``upstream`` (its accumulation).
    ``code``/``stream``/``acc`` with a one-cell halo,
    ``link`` (h, w); ``heads``: the heads' global ids, sorted (link id = index + 1)."""
    H, W = code.shape
    h, w = H - 2, W - 2
    for a in range(h):
        for b in range(w):
            if not stream[a + 1, b + 1]:
                continue
            i = link[a, b] - 1
            cells[i] += 1
            d = code[a + 1, b + 1]
            nxt = -1
            if d < 8:
                a2, b2 = a + DR[d], b + DC[d]
                if stream[a2 + 1, b2 + 1]:
                    nxt = find_id(heads, (r0 + a2) * cols + c0 + b2)
                    if nxt < 0:
                        continue  # the link goes on
            tail[i] = (r0 + a) * cols + c0 + b
            downstream[i] = nxt + 1
            upstream[i] = acc[a + 1, b + 1]
