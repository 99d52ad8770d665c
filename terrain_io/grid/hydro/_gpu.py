"""CuPy side of the hydrology in core (terrain_io/kernels/hydro.cu): watershed and basin labels,
stream links with Strahler and Shreve, HAND, each by pointer jumping along a forest of cells to
its roots (the kernels' header). The definitions are the CPU kernels' (:mod:`._cpu`): labels, link
ids, orders and the drainage links are integers, HAND the same float64 difference rounded to
float32, so the same bytes. Strahler and Shreve of the links come from :func:`._cpu.link_orders` on
the host (one row a link).

Memory (issue 30 at 2^32 cells on an 80 GB card): the forest's pointers are 32-bit up to 2^32
cells, and the labels, link ids, HAND's heights and drainage overwrite them in place; the roots
are numbered a band of cells at a time; per-cell Strahler and Shreve are gathered from the link
table a slice at a time as they are written (:class:`PerLink`). Peak bytes a cell:
:func:`device_bytes`."""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ...backend import EXACT_OPTIONS, kernel_source
from ...errors import InputError

THREADS = 256
BAND = 1 << 28  # cells a band when the roots are numbered (a bool flag each, and CuPy's nonzero over them)
_P = {np.dtype(np.uint32): "unsigned int", np.dtype(np.int64): "long long"}
_Z = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


@functools.cache
def _module():
    import cupy as cp

    names = [f"{k}<{t}>" for k in ("flow_parents", "link_parents", "jump", "roots_in", "resolve") for t in _P.values()]
    names += [f"hand_values<{z}, {t}>" for z in _Z.values() for t in _P.values()]
    return cp.RawModule(code=kernel_source("hydro.cu"), options=EXACT_OPTIONS, name_expressions=names)


def _launch(name: str, n: int, *args) -> None:
    _module().get_function(name)((max(1, min(-(-n // THREADS), 65536)),), (THREADS,), args)


def _pointer(n: int) -> np.dtype:
    """The forest's pointer type: 32-bit cell ids up to 2^32 cells."""
    return np.dtype(np.uint32 if n <= 2**32 else np.int64)


# GPU bytes a cell at each command's peak, its inputs included (P: the pointer, 4 bytes up to 2^32 cells):
# basins codes + P; watershed codes + seeds + P; streams codes + the accumulation (8: the links' tails are
# gathered from it) + stream mask + P; HAND codes + the mask read as the accumulation's + P (links) + P
# (HAND's forest, then its heights) + the elevations (z)
_PEAK = {"basins": (1, 1), "watershed": (2, 1), "streams": (10, 1), "streams+vectors": (10, 1), "hand": (2, 2)}


def device_bytes(rows: int, cols: int, what: str = "hand", dtype=np.float64) -> int:
    """GPU memory (an upper bound) of ``what``'s route (``_PEAK``; HAND with elevations of ``dtype``,
    copied to float64 unless float32 or float64), with the band of root flags and CuPy's nonzero
    over it, and 64 MiB."""
    n = rows * cols
    fixed, pointers = _PEAK[what]
    dtype = np.dtype(dtype)
    z = dtype.itemsize + (0 if dtype in _Z else 8) if what == "hand" else 0
    p = _pointer(n).itemsize
    p += 4 if p == 8 else 0  # 64-bit pointers: the uint32 values beside them, not over them
    return n * (fixed + pointers * p + z) + 9 * min(n, BAND) + (64 << 20)


def _roots(par) -> None:
    """Jump every pointer of ``par`` to its root."""
    import cupy as cp

    moved = cp.zeros(1, np.int32)
    n = par.size
    name = f"jump<{_P[par.dtype]}>"
    for _ in range(64):  # 2^64 > any chain
        moved[0] = 0
        _launch(name, n, par, np.int64(n), moved)
        if not int(moved.get()[0]):
            return
    raise InputError("the flow directions have cycles")


def _flow_forest(code, seed=None):
    """The flow forest of ``code`` (seeded cells are roots too), jumped to its roots."""
    import cupy as cp

    h, w = code.shape
    par = cp.empty(code.size, _pointer(code.size))
    _launch(f"flow_parents<{_P[par.dtype]}>", code.size, code, seed if seed is not None else _null(), np.int64(h),
            np.int64(w), par)
    _roots(par)
    return par


def _null():
    """A null pointer argument (a kernel's optional array)."""
    return np.uint64(0)


def _number_roots(par, member, absent: int):
    """The roots of the jumped forest ``par`` (members: ``member`` != ``absent``) numbered 1, 2, ...
    in row-major order, each number written over its root's pointer; their cells (int64, CuPy)."""
    import cupy as cp

    n = par.size
    flags = cp.empty(min(n, BAND), cp.bool_)
    heads, count = [], 0
    for a in range(0, n, BAND):
        m = min(BAND, n - a)
        _launch(f"roots_in<{_P[par.dtype]}>", m, par, member, np.uint8(absent), np.int64(a), np.int64(m), flags)
        ids = cp.flatnonzero(flags[:m]) + a
        par[ids] = cp.arange(count + 1, count + 1 + ids.size, dtype=par.dtype)
        count += int(ids.size)
        heads.append(ids)
    if count >= 2**32:
        raise InputError(f"{count:,} basins or links: ids are uint32")
    return cp.concatenate(heads) if heads else cp.empty(0, cp.int64)


def _resolve(par, code, mark, link: bool):
    """Every cell's value from its root's (:func:`_number_roots`, or values written at the roots),
    uint32, in place where the pointers are 32-bit (0 off the forest)."""
    import cupy as cp

    h, w = code.shape
    out = par.view(cp.uint32) if par.dtype == cp.uint32 else cp.empty(par.size, cp.uint32)
    _launch(f"resolve<{_P[par.dtype]}>", par.size, par, code, mark if mark is not None else _null(), np.int32(link),
            np.int64(h), np.int64(w), out)
    return out


def label_outlets(code, cells: np.ndarray):
    """:func:`._cpu.label_outlets` of CuPy codes (2-D uint8) and outlet cells (flat indices)."""
    import cupy as cp

    seed = cp.zeros(code.size, cp.uint8)
    at = cp.asarray(cells, cp.int64)
    seed[at] = 1
    par = _flow_forest(code, seed)
    par[at] = cp.arange(1, len(cells) + 1, dtype=par.dtype)  # the seeds are roots: their labels over their pointers
    return _resolve(par, code, seed, False).reshape(code.shape)


def label_basins(code):
    """:func:`._cpu.label_basins` of CuPy codes: labels, terminal cells and counts (int64), all CuPy (the
    caller knows the table's size before the host holds it)."""
    import cupy as cp

    par = _flow_forest(code)
    outlet = _number_roots(par, code.reshape(-1), 255)
    label = _resolve(par, code, None, False)
    del par
    counts = cp.bincount(label, minlength=outlet.size + 1)[1:].astype(np.int64, copy=False)
    return label.reshape(code.shape), outlet, counts


class PerLink:
    """A per-cell raster of a link table's values (index = link id - 1; 0 off the network),
    gathered from the link ids a slice at a time (``x[slices]``: a CuPy array; ``x[...]`` the
    whole raster), so that the GPU holds only the link ids."""

    on_gpu = True  # its slices are CuPy arrays: write_held sends them through the GPU's way out

    def __init__(self, table: np.ndarray, link):
        import cupy as cp

        self.table = cp.asarray(np.append(table.dtype.type(0), table))
        self.link, self.dtype, self.shape, self.ndim = link, self.table.dtype, link.shape, link.ndim

    def __getitem__(self, key):
        return self.table[self.link[key]]


class Drainage(NamedTuple):
    """What HAND needs of a stream network (CuPy, flat): the ``stream`` mask and the ``link`` ids."""

    stream: object
    link: object


def _stream_links(code, acc, threshold: float, reached):
    """The stream mask, link ids (0 off) and link heads' cells (CuPy) of the cells whose
    accumulation reaches ``threshold`` (or ``reached``, that mask already made; it becomes the
    stream mask, in place)."""
    import cupy as cp

    h, w = code.shape
    if reached is None:
        reached = acc >= threshold
    stream = reached.reshape(-1)
    _launch("on_network", code.size, code, stream, np.int64(code.size))
    del reached
    par = cp.empty(code.size, _pointer(code.size))
    _launch(f"link_parents<{_P[par.dtype]}>", code.size, code, stream, np.int64(h), np.int64(w), par)
    _roots(par)
    heads = _number_roots(par, stream.view(cp.uint8), 0)
    link = _resolve(par, code, stream.view(cp.uint8), True)
    return stream, link, heads


def drainage(code, reached) -> Drainage:
    """The stream mask and link ids of :func:`stream_network` alone (HAND: no link table, no
    orders), from the mask ``reached`` = accumulation >= threshold."""
    stream, link, _ = _stream_links(code, None, 0.0, reached)
    return Drainage(stream, link)


def stream_network(code, acc, threshold: float, reached=None):
    """:func:`._cpu.stream_network` of CuPy codes and accumulation: the rasters stay on the GPU (a
    Network of CuPy arrays; Strahler and Shreve as :class:`PerLink`), the link table comes back to
    the host. ``reached``: ``acc >= threshold`` already made (bool, the codes' shape; ``acc`` is
    then not used; it becomes the stream mask, in place)."""
    from . import _cpu  # the links' orders on the host

    h, w = code.shape
    stream, link, heads, tail, downstream, cells = _link_table(code, acc, threshold, reached)
    n = len(heads)
    lorder = np.zeros(n, np.uint8)
    magnitude = np.zeros(n, np.uint32 if code.size < 2**32 else np.uint64)
    if not _cpu.link_orders(downstream, lorder, magnitude):
        raise InputError("the flow directions have cycles")
    link = link.reshape(h, w)
    links = _cpu.Links(heads, tail, downstream, cells, lorder, magnitude)
    return _cpu.Network(stream.reshape(h, w), PerLink(lorder, link), PerLink(magnitude, link), link, links)


def _link_table(code, acc, threshold: float, reached):
    """:func:`stream_network`'s rasters on the GPU (stream mask, link ids) and its link table on
    the host but the orders: heads, tails, downstream ids, cells."""
    import cupy as cp

    h, w = code.shape
    stream, link, heads = _stream_links(code, acc, threshold, reached)
    heads = heads.get()
    n = len(heads)
    tail, down = cp.zeros(n, np.int64), cp.zeros(n, np.uint32)
    _launch("link_ends", code.size, code, stream, link, np.int64(h), np.int64(w), tail, down)
    cells = cp.bincount(link, minlength=n + 1)[1:].astype(np.int64)
    return stream, link, heads, tail.get(), down.get(), cells.get()


def warm_up() -> None:
    """:func:`stream_network`'s first use of the GPU -- CuPy's lazy imports, this module's kernels and
    CuPy's own (the comparison, scans, nonzero, bincount, the per-link gathers) loaded from their
    caches -- on a 3 x 3 grid whose cells all drain out (8), so that a command's own network finds
    them loaded: ``terrain streams`` runs it in the CUDA context's thread as soon as the context is
    made, beside the store's opening and the reads (H100, 16384^2, fresh process: 0.4-0.8 s of the
    GPU phase was that first use). The link orders (numba) are left to ``start_link_kernels``."""
    import cupy as cp

    code = cp.full((3, 3), 8, cp.uint8)
    _, link, heads, _, _, _ = _link_table(code, cp.ones((3, 3), cp.uint32), 0.5, None)
    link = link.reshape(3, 3)
    for values in (np.zeros(len(heads), np.uint8), np.zeros(len(heads), np.uint32)):
        PerLink(values, link)[0:1]


def height_above_drainage(code, z, net):
    """:func:`._cpu.height_above_drainage` of CuPy codes and elevations, ``net`` from
    :func:`stream_network` or :func:`drainage`: (height float32, drainage uint32), CuPy; NaN where
    the path meets no stream has the host's bits (CUDA's arithmetic NaN has others). The network's
    link raster becomes the drainage (in place), and the heights take the words of HAND's forest."""
    import cupy as cp

    stream = net.stream.reshape(-1)
    par = _flow_forest(code, stream.view(np.uint8))
    z = z.reshape(-1)
    if z.dtype not in _Z:
        z = z.astype(np.float64)
    height = par.view(cp.float32) if par.dtype == cp.uint32 else cp.empty(code.size, np.float32)
    drainage = net.link.reshape(-1)
    _launch(f"hand_values<{_Z[z.dtype]}, {_P[par.dtype]}>", code.size, par, z, drainage, np.int64(code.size), height,
            drainage)
    return height.reshape(code.shape), drainage.reshape(code.shape)
