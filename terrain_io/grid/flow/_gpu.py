"""CuPy side of flow routing in core (terrain_io/kernels/flow.cu): :func:`directions` (D8, then the
flats of Barnes, Lehman & Mulla 2014 by two multi-source BFS relaxed tile by tile over a work list)
and :func:`accumulation` (tiles alone, the exits' forest by an Euler tour + list ranking, tiles
again: Barnes 2017's three phases with O(log n) rounds across tiles). The definitions and the
codes are the CPU kernels' (:mod:`._cpu`, :mod:`.codes`): directions, counts and weighted sums
(the CPU's fixed-point integers, its scale from the same exponent range) are the same bytes.

Sizes: rows and columns below 2**31, cell ids 64-bit; the Euler tour uses int32 ids, so at most
2**30 tile exits (any DEM whose working set fits the GPU: :func:`device_bytes`). 64-bit integer
DEMs are compared as float64 (exact below 2**53)."""
from __future__ import annotations

import functools

import numpy as np

from ...backend import EXACT_OPTIONS, gpu_free_bytes, kernel_source
from ...errors import InputError
from ...worklist import ROWS_PER_PASS, TILE
from ...weights import steps_of
from ._cpu import UNRESOLVED

THREADS = 256
MAXE = 4 * TILE - 4  # exits a tile can have (flow.cu)
_ACC = {False: "unsigned long long", True: "u128"}  # counts; weighted sums (flow.cu: 128-bit fixed point)


@functools.cache
def _module(vtype: str):
    import cupy as cp

    names = [f"acc_tile<{a}, {int(wt)}, {f}>" for wt, a in _ACC.items() for f in (0, 1)]
    names += [f"reduce_links<{a}>" for a in _ACC.values()]
    names += [f"euler_links<{v}>" for v in ("int", "long long")]
    return cp.RawModule(code=kernel_source("flow.cu"), options=(*EXACT_OPTIONS, f"-DVAL={vtype}"),
                        name_expressions=names)


def device_bytes(rows: int, cols: int, dtype, weighted: bool = False, band_rows: int | None = None) -> int:
    """GPU memory (an upper bound) that :func:`directions` (a DEM of ``dtype``, with its mask) or
    :func:`accumulation_bands` (codes, with ``weighted`` float64 weights, bands of ``band_rows``
    rows; None: the whole result) holds at its peak, inputs included: directions the values (and
    their copy in the value type where it differs), the mask, two code arrays and two int32
    distances; accumulation the codes, int16 exit ranks, the exit slots (MAXE a tile), the result's
    band (weighted: the 128-bit sums and their float64 band). The exits' Euler tour (about 100
    bytes an exit, list ranking's working arrays included) is checked against the free memory once
    the exits are counted (:class:`GpuMemoryShort`)."""
    n = rows * cols
    ntiles = -(-rows // TILE) * -(-cols // TILE)
    vt = _value_type(dtype)
    direc = n * (np.dtype(dtype).itemsize + (vt.itemsize if vt != np.dtype(dtype) else 0) + 1 + 2 + 8)
    acc = n * (1 + 2 + (8 if weighted else 0)) + min(band_rows or rows, rows) * cols * (24 if weighted else 8) + \
        ntiles * MAXE * (18 if weighted else 10)
    return max(direc, acc) + (64 << 20)


TOUR_BYTES = 100  # GPU memory of the exits' Euler tour and its list ranking, an exit (device_bytes)


class GpuMemoryShort(InputError):
    """The exits' Euler tour does not fit the GPU's free memory (known once the exits are counted)."""


def weight_scale(code, wt) -> int:
    """The CPU's fixed-point scale (:func:`._cpu.weight_scale`, the same note) of weights ``wt`` at
    the valid cells of ``code`` (CuPy; flow.cu's weight_range)."""
    import cupy as cp

    from ._cpu import checked_scale

    out = cp.asarray(np.array([-100000, 100000], np.int64))
    _module("float").get_function("weight_range")(*_grid(code.size), (wt.view(np.uint64), code, np.int64(code.size),
                                                                      out))
    top, low = (int(v) for v in out.get())
    return checked_scale(code.size, top, low if low < 100000 else None)


def _grid(n: int) -> tuple:
    return (max(1, min(-(-n // THREADS), 65536)),), (THREADS,)


def _value_type(dtype) -> np.dtype:
    """float32 for float32 and integers of up to 16 bits (exact), else float64."""
    dtype = np.dtype(dtype)
    if dtype == np.float32 or (dtype.kind in "iub" and dtype.itemsize <= 2):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def directions(z, valid, dx: float, dy: float, outlets: str = "edge+nodata"):
    """D8 + flats codes (uint8 CuPy array, :mod:`.codes`) of the DEM ``z`` with mask ``valid``."""
    return routed(z, valid, dx, dy, outlets)[0]


def routed(z, valid, dx: float, dy: float, outlets: str = "edge+nodata"):
    """:func:`directions` and the number of cells without a lower valid neighbour that are not
    outlets (the flats' cells: routed by the flat rule or SINK), as :func:`._cpu.routed`."""
    import cupy as cp

    if outlets not in ("edge+nodata", "edge"):
        raise InputError(f"unknown outlets {outlets!r}: choose edge+nodata or edge")
    z = cp.asarray(z)
    if z.ndim != 2:
        raise InputError("the DEM must be 2-D")
    vt = _value_type(z.dtype)
    z = cp.ascontiguousarray(z.astype(vt, copy=False))
    ok = cp.ascontiguousarray(cp.asarray(valid, dtype=cp.bool_)).view(cp.uint8)
    if ok.shape != z.shape:
        raise InputError("valid must have the DEM's shape")
    h, w = z.shape
    mod = _module("float" if vt == np.float32 else "double")
    ntr, ntc = -(-h // TILE), -(-w // TILE)
    raw = cp.empty((h, w), cp.uint8)
    flag = cp.zeros(ntr * ntc, cp.int32)
    L = cp.asarray(steps_of(float(dx), float(dy)))
    grid = _grid(h * w)
    mod.get_function("d8")(*grid, (z, ok, np.int32(h), np.int32(w), L, np.int32(outlets == "edge+nodata"), raw, flag))
    first = cp.flatnonzero(flag).astype(cp.int32)
    del flag
    directions.rounds = (0, 0)
    if not first.size:
        return raw, 0
    unresolved = int(cp.count_nonzero(raw == UNRESOLVED))
    towards = cp.empty((h, w), cp.int32)
    away = cp.empty((h, w), cp.int32)
    mod.get_function("flat_edges")(*grid, (z, ok, raw, np.int32(h), np.int32(w), towards, away))
    relax = mod.get_function("relax_bfs")
    assert (TILE, ROWS_PER_PASS) == (32, 8)  # TS, BY of worklist.cuh
    directions.rounds = tuple(_bfs_rounds(relax, raw, dist, first, ntr * ntc) for dist in (towards, away))
    out = cp.empty((h, w), cp.uint8)
    mod.get_function("flat_codes")(*grid, (z, ok, raw, towards, away, np.int32(h), np.int32(w), out))
    return out, unresolved


ROUNDS_UNCHECKED = 16  # BFS rounds launched between two reads of the work list's length


def _bfs_rounds(relax, raw, dist, first, ntiles: int) -> int:
    """The multi-source BFS fixpoint of ``dist`` by rounds of ``relax_bfs`` over a work list of
    tiles, launched ROUNDS_UNCHECKED at a time before the host reads whether the list emptied
    (flow.cu: the rounds keep the list's lengths on the GPU). Returns the rounds launched."""
    import cupy as cp

    h, w = dist.shape
    flags = [cp.zeros(ntiles, cp.int32), cp.zeros(ntiles, cp.int32)]
    lists = [cp.empty(ntiles, cp.int32), cp.empty(ntiles, cp.int32)]
    counts = cp.zeros(3, cp.int32)
    lists[0][: first.size] = first
    flags[0][first] = 1
    counts[0] = first.size
    blocks = min(ntiles, 16 * cp.cuda.Device().attributes["MultiProcessorCount"])
    r = 0
    while True:
        for _ in range(ROUNDS_UNCHECKED):
            relax((blocks,), (TILE, ROWS_PER_PASS), (raw, dist, np.int32(h), np.int32(w), lists[r % 2], counts,
                                                     np.int32(r), flags[r % 2], flags[1 - r % 2], lists[1 - r % 2]))
            r += 1
        if not int(counts[r % 3].get()):
            return r


def accumulation(direction, weights=None, include_self: bool = True):
    """Cells (uint64) or the sum of ``weights`` (float64) draining through each cell, itself
    included unless ``include_self`` is False; 0 at nodata (module docstring of flow.cu)."""
    return next(accumulation_bands(direction, weights, include_self))[2]


def accumulation_bands(direction, weights=None, include_self: bool = True, band_rows: int | None = None):
    """:func:`accumulation` a band of ``band_rows`` rows (a multiple of TILE; None: all) at a time:
    yields (first row, end row, the band's CuPy array), each band's array reused for the next one,
    so that the GPU holds one band of the result (the store pipeline writes each band as it
    comes). Phases A and B run once, phase C once a band."""
    import cupy as cp

    code = cp.ascontiguousarray(cp.asarray(direction))
    if code.ndim != 2 or code.dtype != cp.uint8:
        raise InputError("direction must be a 2-D uint8 array of flow codes")
    weighted = weights is not None
    h, w = code.shape
    band_rows = band_rows or max(h, TILE)
    if band_rows % TILE and band_rows < h:
        raise ValueError(f"band_rows {band_rows}: a multiple of {TILE}")
    if weighted:
        wt = cp.ascontiguousarray(cp.asarray(weights, dtype=cp.float64))
        if wt.shape != code.shape:
            raise InputError(f"weights of shape {wt.shape} for directions of shape {code.shape}")
    else:
        wt = cp.empty(1, cp.float64)
    acc_t, words = cp.uint64, ((2,) if weighted else ())  # a 128-bit sum: two words (flow.cu's u128)
    A = _ACC[weighted]
    scale = weight_scale(code, wt) if weighted else 0
    mod = _module("float")
    ntr, ntc = -(-h // TILE), -(-w // TILE)
    ntiles = ntr * ntc
    i32 = np.int32
    term_rank = cp.empty((h, w), cp.int16)
    exit_val = cp.empty((ntiles * MAXE, *words), acc_t)
    exit_loc = cp.empty(ntiles * MAXE, cp.int16)
    exit_count = cp.empty(ntiles, cp.int32)
    err = cp.zeros(1, cp.uint64)
    none_i, none_a = cp.empty(1, cp.int32), cp.empty((1, *words), acc_t)
    block = (TILE, ROWS_PER_PASS)
    marks = [_mark()]
    mod.get_function(f"acc_tile<{A}, {int(weighted)}, 0>")(
        (ntiles,), block, (code, wt, i32(h), i32(w), term_rank, none_i, none_a, exit_val, exit_loc, exit_count,
                           none_a, i32(1), err, i32(0), i32(0), i32(scale)))
    marks.append(_mark())
    offset = cp.cumsum(exit_count, dtype=cp.int64) - exit_count
    m = int(offset[-1] + exit_count[-1])
    if 2 * m + 2 >= 2**31:
        raise InputError(f"{m} tile exits: too many for the in-core GPU accumulation")
    offset = offset.astype(cp.int32)
    if m * TOUR_BYTES > gpu_free_bytes():
        raise GpuMemoryShort(f"the {m:,} tile exits' Euler tour needs about {m * TOUR_BYTES / 2**30:.1f} GiB of GPU "
                             f"memory, {gpu_free_bytes() / 2**30:.1f} GiB free")
    parent = cp.empty(m, cp.int32)
    val = cp.empty((m, *words), acc_t)
    slots = ntiles * MAXE
    mod.get_function(f"reduce_links<{A}>")(*_grid(slots), (code, i32(h), i32(w), term_rank, offset, exit_count,
                                                          exit_val, exit_loc, np.int64(slots), parent, val))
    del exit_val, exit_loc
    marks.append(_mark())
    try:
        total = _subtree_sums(mod, parent, val, h * w, weighted) if m else val
    except InputError:  # the list ranking found the tour's cycle: codes on a loop across tiles
        raise InputError("the flow directions have a cycle: some cells never drain") from None
    del parent, val
    marks.append(_mark())
    out = cp.empty((min(band_rows, h), w, *words), acc_t)
    band_f = cp.empty((min(band_rows, h), w), cp.float64) if weighted else None
    final = mod.get_function(f"acc_tile<{A}, {int(weighted)}, 1>")
    accumulation.exits = m
    for r0 in range(0, h, band_rows):
        r1 = min(h, r0 + band_rows)
        tr0, tr1 = r0 // TILE, -(-r1 // TILE)
        final(((tr1 - tr0) * ntc,), block, (code, wt, i32(h), i32(w), term_rank, offset, total, none_a,
                                            cp.empty(1, cp.int16), exit_count, out, i32(include_self), err,
                                            i32(tr0 * ntc), i32(r0), i32(scale)))
        if weighted:
            n = (r1 - r0) * w
            mod.get_function("band_to_double")(*_grid(n), (out, np.int64(n), i32(scale), band_f))
        if r0 == 0:
            marks.append(_mark())
        if int(err.get()[0]):
            raise InputError("the flow directions have a cycle: some cells never drain")
        if r0 == 0:
            marks[-1].synchronize()  # an event's time is read once it has happened
            accumulation.timings = {k: cp.cuda.get_elapsed_time(a, b) for k, a, b in
                                    zip(("tiles", "links", "tour", "finish"), marks, marks[1:])}  # ms, benchmarks
            if m:
                sub = _subtree_sums.marks
                accumulation.timings.update(tour_build=cp.cuda.get_elapsed_time(sub[0], sub[1]),
                                            tour_scan=cp.cuda.get_elapsed_time(sub[1], sub[2]))
        yield r0, r1, (band_f if weighted else out)[: r1 - r0]


def _mark():
    import cupy as cp

    e = cp.cuda.Event()
    e.record()
    return e


def _subtree_sums(mod, parent, val, cells: int, weighted: bool):
    """Sum of ``val`` over every subtree of the forest ``parent`` (-1 at roots): an Euler tour (the
    children of a node, and the roots, in the order of a stable sort by parent; the trees' tours
    chained into one list, which the recursive Helman-JaJa ranking needs: every head of a list is a
    splitter, so a forest of many small trees would never reduce) ranked by list scan, then
    prefix(up) - prefix(down) + val. Weighted sums (128-bit, ``val`` (m, 2) words) by four scans of
    their 32-bit limbs in int64 (a subtree's sum of one limb < 2^31 * 2^32: exact, also across the
    prefixes' wrap-around), joined again."""
    import cupy as cp

    from ...graph.listrank import list_scan

    m = parent.size
    marks = [_mark()]
    order = cp.argsort(parent).astype(cp.int32)
    sp = parent[order]
    first_child = cp.full(m, -1, cp.int32)
    next_sib = cp.full(m, -1, cp.int32)
    same = sp[1:] == sp[:-1]
    next_sib[order[:-1][same]] = order[1:][same]  # the roots (parent -1) too: one list for the forest
    starts = cp.flatnonzero(cp.concatenate([cp.ones(1, cp.bool_), ~same]) & (sp >= 0))
    first_child[sp[starts]] = order[starts]
    del sp, same, starts, order
    # counts: int32 values while every sum fits (one packed 64-bit word per element in the walks)
    vt = np.int64 if weighted or cells >= 2**31 else np.int32
    if weighted:
        parts = cp.empty((4, m), cp.int64)
        mod.get_function("to_limbs")(*_grid(m), (val, np.int32(m), parts))
    else:
        parts = val.astype(vt, copy=False)[None]
    succ = cp.empty(2 * m, cp.int32)
    tour_val = cp.empty(2 * m, vt)
    V = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}[np.dtype(vt)]
    sums = []
    for tv in parts:
        mod.get_function(f"euler_links<{V}>")(*_grid(m), (parent, first_child, next_sib, tv, np.int32(m), succ,
                                                          tour_val))
        if not sums:
            marks.append(_mark())
        prefix = list_scan(succ, tour_val, check=False)
        sums.append(prefix[1::2] - prefix[0::2] + tv)
        del prefix
    del first_child, next_sib
    marks.append(_mark())
    _subtree_sums.marks = marks
    if not weighted:
        return sums[0].astype(val.dtype, copy=False)
    total = cp.empty_like(val)
    mod.get_function("from_limbs")(*_grid(m), (cp.stack(sums), np.int32(m), total))
    return total
