"""CuPy side of the hydrology in core (terrain_io/kernels/hydro.cu): watershed and basin labels,
stream links with Strahler and Shreve, HAND, each by pointer jumping along a forest of cells to
its roots (the kernels' header). The definitions are the CPU kernels' (:mod:`._cpu`): labels, link
ids, orders and the drainage links are integers, HAND the same float64 difference rounded to
float32, so the same bytes. Strahler and Shreve of the links come from :func:`._cpu.link_orders` on
the host (one row a link)."""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ...backend import EXACT_OPTIONS, kernel_source
from ...errors import InputError

THREADS = 256


@functools.cache
def _module():
    import cupy as cp

    return cp.RawModule(code=kernel_source("hydro.cu"), options=EXACT_OPTIONS)


def _launch(name: str, n: int, *args) -> None:
    _module().get_function(name)((max(1, min(-(-n // THREADS), 65536)),), (THREADS,), args)


def device_bytes(rows: int, cols: int) -> int:
    """GPU memory (an upper bound) of the largest route (HAND): codes, stream mask, seeds, parents
    (int64), elevations in float64 and their drainage's, height, two uint32 rasters, the
    accumulation (uint64)."""
    return rows * cols * (1 + 1 + 1 + 8 + 8 + 8 + 4 + 8 + 8 + 8) + (64 << 20)


def _roots(par) -> None:
    """Jump every pointer of ``par`` (int64, -1 none) to its root."""
    import cupy as cp

    moved = cp.zeros(1, np.int32)
    n = par.size
    for _ in range(64):  # 2^64 > any chain
        moved[0] = 0
        _launch("jump", n, par, np.int64(n), moved)
        if not int(moved.get()[0]):
            return
    raise InputError("the flow directions have cycles")


def _flow_forest(code, seed=None):
    import cupy as cp

    h, w = code.shape
    par = cp.empty(code.size, np.int64)
    if seed is None:
        seed = cp.zeros(code.size, np.uint8)
    _launch("flow_parents", code.size, code, seed, np.int64(h), np.int64(w), par)
    _roots(par)
    return par


def _root_ranks(par):
    """The roots of the jumped forest ``par`` numbered 1, 2, ... in row-major order: (the running
    count of roots, uint32: at a root its id, the basin's or link's; the root mask; the count)."""
    import cupy as cp

    root = cp.empty(par.size, cp.bool_)
    _launch("is_root", par.size, par, np.int64(par.size), root)
    rank = cp.cumsum(root, dtype=np.uint32 if par.size < 2**32 else np.int64)  # (ids are uint32: < 2^32 roots)
    n = int(rank[-1]) if par.size else 0
    return rank.astype(np.uint32, copy=False), root, n


def _gather(values, par):
    """``values[par]`` (uint32) where par >= 0, else 0."""
    import cupy as cp

    out = cp.empty(par.size, np.uint32)
    _launch("gather_u32", par.size, par, values, np.int64(par.size), out)
    return out


def label_outlets(code, cells: np.ndarray):
    """:func:`._cpu.label_outlets` of CuPy codes (2-D uint8) and outlet cells (flat indices)."""
    import cupy as cp

    tag = cp.zeros(code.size, np.uint32)
    tag[cp.asarray(cells)] = cp.arange(1, len(cells) + 1, dtype=np.uint32)
    seed = (tag > 0).view(np.uint8)
    par = _flow_forest(code, seed)
    del seed
    return _gather(tag, par).reshape(code.shape)


def label_basins(code):
    """:func:`._cpu.label_basins` of CuPy codes: labels (CuPy), terminal cells and counts (NumPy)."""
    import cupy as cp

    par = _flow_forest(code)
    rank, root, n = _root_ranks(par)
    label = _gather(rank, par)
    del par, rank
    outlet = cp.flatnonzero(root).get()
    del root
    counts = cp.bincount(label, minlength=n + 1)[1:].get().astype(np.int64)
    return label.reshape(code.shape), outlet, counts


class Drainage(NamedTuple):
    """What HAND needs of a stream network (CuPy, flat): the ``stream`` mask and the ``link`` ids."""

    stream: object
    link: object


def _stream_links(code, acc, threshold: float, reached):
    """The stream mask, link ids (uint32, 0 off), link heads' mask and link count of the cells
    whose accumulation reaches ``threshold`` (or ``reached``, that mask already made)."""
    import cupy as cp

    h, w = code.shape
    if reached is None:
        reached = acc >= threshold
    stream = reached.reshape(-1) & (code.reshape(-1) != 255)
    del reached
    par = cp.empty(code.size, np.int64)
    _launch("link_parents", code.size, code, stream, np.int64(h), np.int64(w), par)
    _roots(par)
    rank, head, n = _root_ranks(par)
    link = _gather(rank, par)
    return stream, link, head, n


def drainage(code, reached) -> Drainage:
    """The stream mask and link ids of :func:`stream_network` alone (HAND: no link table, no
    orders), from the mask ``reached`` = accumulation >= threshold."""
    stream, link, _, _ = _stream_links(code, None, 0.0, reached)
    return Drainage(stream, link)


def stream_network(code, acc, threshold: float, reached=None):
    """:func:`._cpu.stream_network` of CuPy codes and accumulation: the rasters stay on the GPU (a
    Network of CuPy arrays), the link table comes back to the host. ``reached``: ``acc >=
    threshold`` already made (bool, the codes' shape; ``acc`` is then not used)."""
    import cupy as cp

    from . import _cpu  # the links' orders on the host

    h, w = code.shape
    stream, link, head, n = _stream_links(code, acc, threshold, reached)
    heads = cp.flatnonzero(head).get()
    del head
    tail, down = cp.zeros(n, np.int64), cp.zeros(n, np.uint32)
    _launch("link_ends", code.size, code, stream, link, np.int64(h), np.int64(w), tail, down)
    cells = cp.bincount(link, minlength=n + 1)[1:].astype(np.int64)
    downstream = down.get()
    lorder = np.zeros(n, np.uint8)
    magnitude = np.zeros(n, np.uint32 if code.size < 2**32 else np.uint64)
    if not _cpu.link_orders(downstream, lorder, magnitude):
        raise InputError("the flow directions have cycles")
    strahler = cp.asarray(np.append(np.uint8(0), lorder))[link]  # entry 0: off the network
    shreve = cp.asarray(np.append(magnitude.dtype.type(0), magnitude))[link]
    links = _cpu.Links(heads, tail.get(), downstream, cells.get(), lorder, magnitude)
    return _cpu.Network(stream.reshape(h, w), strahler.reshape(h, w), shreve.reshape(h, w), link.reshape(h, w), links)


def height_above_drainage(code, z, net):
    """:func:`._cpu.height_above_drainage` of CuPy codes and elevations, ``net`` from
    :func:`stream_network` or :func:`drainage`: (height float32, drainage uint32), CuPy; NaN where
    the path meets no stream has the host's bits (CUDA's arithmetic NaN has others)."""
    import cupy as cp

    stream = net.stream.reshape(-1)
    par = _flow_forest(code, stream.view(np.uint8))
    z64 = z.reshape(-1).astype(np.float64)
    height, drainage = cp.empty(code.size, np.float32), cp.empty(code.size, np.uint32)
    _launch("hand_values", code.size, par, z64, stream, net.link.reshape(-1), np.int64(code.size), height, drainage)
    return height.reshape(code.shape), drainage.reshape(code.shape)
