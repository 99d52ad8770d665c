"""numba kernels of the second half of the hydrology workflow on flow directions (``terrain flow``'s
codes, :mod:`..flow.codes`): watershed and basin labels, stream order and links, HAND. In core.

Cells are flat (row-major) indices k = r * w + c of the direction raster ``code`` (uint8, 1-D view).
A cell's *downstream* cell is the neighbour its code 0..7 points at (:func:`down`); OUTLET, SINK, a
code that points off the DEM or at nodata end the flow path (a *terminal* cell).

Order
    Every kernel walks the flow forest in a topological order built once, O(n) without a queue
    (as :func:`..flow._cpu.accumulate` does): count each cell's donors, then from every cell without
    donors walk downstream, appending a cell when its last donor is appended. ``order`` lists every
    valid cell after all its donors (*upstream first*); read backwards it lists every cell after its
    downstream cell (*downstream first*).

Labels (watersheds, basins)
    Downstream first, an unlabelled cell takes its downstream cell's label; seeded cells keep theirs,
    so a nested outlet splits its parent's area (ESRI Watershed, Whitebox Watershed).

Streams
    A stream cell: accumulation >= threshold. Strahler (1957) order is 1 at a cell with no stream
    donor, else the largest order among its stream donors, plus one where two or more donors hold
    it; Shreve (1966) magnitude is 1 at a cell with no stream donor, else the sum of its stream
    donors'. A *link* runs from a head (a stream cell whose stream donors are not exactly one: a
    source or a junction) down to the cell above the next head or the path's end; links are
    numbered 1, 2, ... in row-major order of their heads. Both numbers are constant along a link
    (its cells after the head have one stream donor, of the same link), so they are computed on
    the links alone (:func:`link_orders`) after one walk down each link from its head
    (:func:`walk_network`): no order of the whole grid.

HAND (Nobre et al. 2011, height above the nearest drainage)
    Downstream first, a stream cell's drainage is itself; any other cell takes its downstream cell's
    drainage elevation and link; a path that ends without meeting a stream has none (NaN, link 0).
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from ...errors import InputError
from ...weights import DC, DR
from ..flow.codes import NODATA

DONE = 255  # donor count of a cell already placed in the order


@numba.njit(nogil=True, cache=True)
def down(code, h, w, k):
    """The downstream cell of valid cell ``k`` or -1 for a terminal cell (module docstring)."""
    d = code[k]
    if d >= 8:
        return np.int64(-1)
    r = k // w
    c = k - r * w
    r2, c2 = r + DR[d], c + DC[d]
    if r2 < 0 or r2 >= h or c2 < 0 or c2 >= w:
        return np.int64(-1)
    k2 = r2 * w + c2
    if code[k2] == NODATA:
        return np.int64(-1)
    return k2


@numba.njit(nogil=True, cache=True)
def upstream_first(code, h, w, order):
    """Fill ``order`` (int64, at least the number of valid cells) with the valid cells, each after
    all its donors (module docstring); returns how many were placed (fewer than the valid cells
    where the codes hold a cycle)."""
    n = code.size
    donors = np.zeros(n, np.uint8)
    for k in range(n):
        if code[k] != NODATA:
            t = down(code, h, w, k)
            if t >= 0:
                donors[t] += 1
    m = 0
    for k0 in range(n):
        if donors[k0] != 0 or code[k0] == NODATA:
            continue
        k = k0
        while True:
            order[m] = k
            m += 1
            donors[k] = DONE
            t = down(code, h, w, k)
            if t < 0:
                break
            donors[t] -= 1
            if donors[t] != 0:
                break
            k = t
    return m


@numba.njit(nogil=True, cache=True)
def spread_labels(code, h, w, order, m, label):
    """Downstream first, every unlabelled (0) cell takes its downstream cell's label."""
    for i in range(m - 1, -1, -1):
        k = order[i]
        if label[k] == 0:
            t = down(code, h, w, k)
            if t >= 0:
                label[k] = label[t]


@numba.njit(nogil=True, cache=True)
def terminals(code, h, w, label):
    """Number the terminal valid cells 1, 2, ... in row-major order into ``label``; returns their count."""
    n = np.uint32(0)
    for k in range(code.size):
        if code[k] != NODATA and down(code, h, w, k) < 0:
            n += np.uint32(1)
            label[k] = n
    return n


@numba.njit(nogil=True, cache=True)
def count_labels(label, counts):
    """``counts[i]`` += the number of cells labelled i."""
    for k in range(label.size):
        counts[label[k]] += 1


@numba.njit(nogil=True, cache=True)
def stream_cells(code, acc, threshold, stream):
    """``stream`` (bool): valid cells of accumulation >= ``threshold``; returns their flat indices
    (row-major)."""
    n = 0
    for k in range(code.size):
        s = code[k] != NODATA and acc[k] >= threshold
        stream[k] = s
        n += s
    out = np.empty(n, np.int64)
    n = 0
    for k in range(code.size):
        if stream[k]:
            out[n] = k
            n += 1
    return out


@numba.njit(nogil=True, cache=True)
def walk_network(code, h, w, cells, stream, link):
    """The links of the stream cells ``cells`` (row-major): heads numbered 1.. in that order into
    ``link``, then each link walked down from its head while the next cell has exactly one stream
    donor (O(stream cells), no topological order). Returns per link its head, last cell,
    downstream link id and cell count."""
    sdon = np.zeros(code.size, np.uint8)
    for k in cells:
        t = down(code, h, w, k)
        if t >= 0 and stream[t]:
            sdon[t] += 1
    n = 0
    for k in cells:
        n += sdon[k] != 1
    head = np.empty(n, np.int64)
    n = 0
    for k in cells:
        if sdon[k] != 1:
            head[n] = k
            n += 1
            link[k] = n
    tail = np.empty(n, np.int64)
    downstream = np.zeros(n, np.uint32)
    count = np.zeros(n, np.int64)
    for i in range(n):
        k = head[i]
        while True:
            link[k] = i + 1
            count[i] += 1
            t = down(code, h, w, k)
            if t < 0 or not stream[t] or sdon[t] != 1:
                tail[i] = k
                if t >= 0 and stream[t]:
                    downstream[i] = link[t]
                break
            k = t
    return head, tail, downstream, count


@numba.njit(nogil=True, cache=True)
def link_orders(downstream, strahler, shreve):
    """Strahler (1957) order and Shreve (1966) magnitude of every link from the links' downstream
    ids alone (a link with no upstream link is a source: 1; at a junction, the largest upstream
    order, plus one where two or more hold it; the sum of the magnitudes): Kahn's order over the
    links. Returns False on a cycle."""
    n = len(downstream)
    ups = np.zeros(n, np.int64)
    for i in range(n):
        if downstream[i] > 0:
            ups[downstream[i] - 1] += 1
    top = np.zeros(n, np.uint8)
    ntop = np.zeros(n, np.int64)
    queue = np.empty(n, np.int64)
    tail = 0
    for i in range(n):
        if ups[i] == 0:
            queue[tail] = i
            tail += 1
    head = 0
    while head < tail:
        i = queue[head]
        head += 1
        if ntop[i] == 0:
            strahler[i] = 1
            shreve[i] = 1
        else:
            strahler[i] = top[i] + (1 if ntop[i] >= 2 else 0)
        j = downstream[i] - 1
        if j >= 0:
            s = strahler[i]
            if s > top[j]:
                top[j] = s
                ntop[j] = 1
            elif s == top[j]:
                ntop[j] += 1
            shreve[j] += shreve[i]
            ups[j] -= 1
            if ups[j] == 0:
                queue[tail] = j
                tail += 1
    return tail == n


@numba.njit(nogil=True, cache=True)
def hand(code, h, w, order, m, stream, z, link, height, drainage):
    """Downstream first: ``height`` (float32) = z minus the elevation of the first stream cell on
    the flow path (computed in float64), ``drainage`` its link; NaN and 0 where the path meets no
    stream (``height`` and ``drainage`` come in as NaN and 0)."""
    dz = np.empty(code.size, np.float64)  # the drainage elevation of each placed cell
    for i in range(m - 1, -1, -1):
        k = order[i]
        if stream[k]:
            dz[k] = np.float64(z[k])
            drainage[k] = link[k]
        else:
            t = down(code, h, w, k)
            if t >= 0:
                dz[k] = dz[t]
                drainage[k] = drainage[t]
            else:
                dz[k] = np.nan
        height[k] = np.float32(np.float64(z[k]) - dz[k])


# --- in-core entry points on NumPy arrays (2-D codes; the array API and the store commands call these) ---------

class Links(NamedTuple):
    """The stream links, index i = link id i + 1 (module docstring): flat indices of the ``head`` and
    last (``tail``) cell, the ``downstream`` link id (0: the path ends), ``cells``, ``strahler``
    order and ``shreve`` magnitude; ``upstream``, the accumulation at the last cell, where the
    store's ``streams`` gives it (its vectors' table)."""

    head: np.ndarray
    tail: np.ndarray
    downstream: np.ndarray
    cells: np.ndarray
    strahler: np.ndarray
    shreve: np.ndarray
    upstream: np.ndarray | None = None


class Network(NamedTuple):
    """Rasters of a stream network (2-D): ``stream`` mask, ``strahler`` (uint8), ``shreve`` (uint32,
    uint64 from 2^32 cells), ``link`` (uint32), and the :class:`Links` table."""

    stream: np.ndarray
    strahler: np.ndarray
    shreve: np.ndarray
    link: np.ndarray
    links: Links


def flow_order(code: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The flat codes, the upstream-first order and its length; InputError on a cycle."""
    flat = np.ascontiguousarray(code, np.uint8).reshape(-1)
    h, w = code.shape
    valid = int(np.count_nonzero(flat != NODATA))
    order = np.empty(valid, np.int64)
    m = upstream_first(flat, h, w, order)
    if m < valid:
        raise InputError(f"the flow directions have cycles: {valid - m:,} cells never drain")
    return flat, order, m


def label_outlets(code: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """uint32 labels: i + 1 for the cells that drain to flat cell ``cells[i]`` first (nested outlets
    split their parent's area), 0 for the others and nodata."""
    flat, order, m = flow_order(code)
    label = np.zeros(flat.size, np.uint32)
    label[cells] = np.arange(1, len(cells) + 1, dtype=np.uint32)
    spread_labels(flat, *code.shape, order, m, label)
    return label.reshape(code.shape)


def label_basins(code: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every drainage basin: uint32 labels (1, 2, ... in row-major order of the basins' terminal
    cells, 0 at nodata), the terminal cells (flat indices, index = id - 1) and each basin's cell count."""
    flat, order, m = flow_order(code)
    label = np.zeros(flat.size, np.uint32)
    n = int(terminals(flat, *code.shape, label))
    outlet = np.flatnonzero(label)
    spread_labels(flat, *code.shape, order, m, label)
    counts = np.zeros(n + 1, np.int64)
    count_labels(label, counts)
    return label.reshape(code.shape), outlet, counts[1:]


def stream_network(code: np.ndarray, accumulation: np.ndarray, threshold: float) -> Network:
    """The stream network of the cells whose ``accumulation`` >= ``threshold`` (module docstring)."""
    flat = np.ascontiguousarray(code, np.uint8).reshape(-1)
    h, w = code.shape
    stream = np.empty(flat.size, np.bool_)
    cells = stream_cells(flat, np.ascontiguousarray(accumulation).reshape(-1), threshold, stream)
    link = np.zeros(flat.size, np.uint32)
    head, tail, downstream, count = walk_network(flat, h, w, cells, stream, link)
    n = len(head)
    lorder = np.zeros(n, np.uint8)
    magnitude = np.zeros(n, np.uint32 if flat.size < 2**32 else np.uint64)
    if not link_orders(downstream, lorder, magnitude):
        raise InputError("the flow directions have cycles")
    strahler = np.zeros(flat.size, np.uint8)
    shreve = np.zeros(flat.size, magnitude.dtype)
    at = link[cells] - 1
    strahler[cells] = lorder[at]
    shreve[cells] = magnitude[at]
    links = Links(head, tail, downstream, count, lorder, magnitude)
    return Network(stream.reshape(h, w), strahler.reshape(h, w), shreve.reshape(h, w), link.reshape(h, w), links)


def height_above_drainage(code: np.ndarray, z: np.ndarray, network: Network) -> tuple[np.ndarray, np.ndarray]:
    """HAND (float32, NaN where the flow path meets no stream and at nodata) and the drainage link
    (uint32, 0 there) of every cell (module docstring)."""
    flat, order, m = flow_order(code)
    height = np.full(flat.size, np.nan, np.float32)
    drainage = np.zeros(flat.size, np.uint32)
    hand(flat, *code.shape, order, m, network.stream.reshape(-1), np.ascontiguousarray(z).reshape(-1),
         network.link.reshape(-1), height, drainage)
    return height.reshape(code.shape), drainage.reshape(code.shape)


@numba.njit(nogil=True, cache=True)
def link_points(verts, starts, cols, t, hyp, wkb, step):
    """The lines of vertices ``verts`` (global cell ids; link i's are ``starts[i]:starts[i + 1]``) as
    ISO WKB LineStrings end to end in ``wkb`` (uint8, line i from byte 9 i + 16 starts[i]: byte order
    1, type 2, the point count, x y doubles), each vertex the map coordinates of its cell's centre
    (the geotransform ``t`` = x0, dx, rx, y0, ry, dy, as :meth:`...store.TerrainStore.cell_to_map`
    applies it, operation for operation), and each vertex's step to the next of its link into
    ``step`` (0 after a link's last): ``hyp[|dr|, |dc|]``, the metres of a step of dr rows and dc
    columns (vertices are neighbours or the same cell). One pass without the GIL (the points: 5 CPU
    ms a batch of 16,384 links against 15 for NumPy's divmod, transform, diff, hypot and
    column_stack; the WKB: no Python bytes object a line, 0.3 s of the GIL for 140 k lines, 2-core VM)."""
    x0, tx, rx, y0, ry, ty = t[0], t[1], t[2], t[3], t[4], t[5]
    point = np.empty(2, np.float64)
    point_bytes = point.view(np.uint8)
    head = np.empty(2, np.uint32)
    head_bytes = head.view(np.uint8)
    for i in range(len(starts) - 1):
        at = 9 * i + 16 * starts[i]
        head[0], head[1] = 2, starts[i + 1] - starts[i]  # (little-endian: numba's targets are)
        wkb[at] = 1
        wkb[at + 1:at + 9] = head_bytes
        at += 9
        for k in range(starts[i], starts[i + 1]):
            r, c = verts[k] // cols, verts[k] % cols
            rf, cf = r + 0.5, c + 0.5
            point[0] = x0 + cf * tx + rf * rx
            point[1] = y0 + cf * ry + rf * ty
            wkb[at:at + 16] = point_bytes
            at += 16
            if k + 1 < starts[i + 1]:
                step[k] = hyp[abs(verts[k + 1] // cols - r), abs(verts[k + 1] % cols - c)]
            else:
                step[k] = 0.0


@numba.njit(nogil=True, cache=True)
def walk_links(code, r0, c0, cols, cur, left, out, pos):
    """Advance every link walk whose current cell (global id ``cur[i]``) lies in the block ``code``
    (directions of rows r0.., columns c0..): record cells into ``out`` at ``pos[i]`` and step down
    the flow until the walk leaves the block or has taken its cells (``left[i]`` reaches 0; a
    link's cells are its head's flow path of ``cells`` cells). Returns the cells recorded."""
    bh, bw = code.shape
    moved = 0
    for i in range(len(cur)):
        if left[i] == 0:
            continue
        g = cur[i]
        r, c = g // cols - r0, g % cols - c0
        while 0 <= r < bh and 0 <= c < bw:
            out[pos[i]] = g
            pos[i] += 1
            left[i] -= 1
            moved += 1
            if left[i] == 0:
                break
            d = code[r, c]
            r += DR[d]
            c += DC[d]
            g = (r + r0) * cols + c + c0
        cur[i] = g
    return moved
