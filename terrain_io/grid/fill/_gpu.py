"""CuPy side of the in-core GPU fill (terrain_io/kernels/fill.cu): the fill levels by rounds of
tile relaxation over a work list, the lakes by union-find, their table by atomics; the same bytes
as the numba pipeline of :mod:`._cpu` (see :mod:`.pipeline`).

The DEM lives on the GPU as one ringed array in the *value type* (float32, or float64 where
float32 does not hold every value: :func:`value_dtype`), with its stored values (nodata
included), beside the levels F (the same type) and a cell id a cell for the lakes' union-find:
uint32 up to 2^32 cells (65536^2), uint64 beyond (:func:`cell_dtype`)."""
from __future__ import annotations

import functools

import numpy as np

from ...backend import EXACT_OPTIONS, kernel_source
from ...worklist import ROWS_PER_PASS, TILE, WorkLists

THREADS = 256
NARROW_CELLS = 2**32  # the most cells whose ids 0 .. n - 1 fit the lakes' uint32 words


def value_dtype(dtype) -> np.dtype | None:
    """The type the GPU computes in for a DEM of ``dtype``: float32 for float32 and integers of up to
    16 bits, float64 for float64 and 32-bit integers; None for 64-bit integers (not all exact)."""
    dtype = np.dtype(dtype)
    if dtype == np.float32 or (dtype.kind in "iu" and dtype.itemsize <= 2):
        return np.dtype(np.float32)
    if dtype == np.float64 or (dtype.kind in "iu" and dtype.itemsize == 4):
        return np.dtype(np.float64)
    return None


def cell_dtype(cells: int) -> np.dtype:
    """The lakes' cell ids: uint32 while every id of ``cells`` fits (0 marks a dry cell: cell 0
    lies on the edge, never in a lake), uint64 beyond."""
    return np.dtype(np.uint32 if cells <= NARROW_CELLS else np.uint64)


def device_bytes(rows: int, cols: int, dtype, band_rows: int) -> int:
    """GPU memory of the in-core fill: the ringed values and levels, the lake words and a root
    flag a cell (with 64-bit ids, their uint32 lake ids next to them instead of the flag), and
    the outputs of a band of ``band_rows`` rows on their way back (plus some slack)."""
    vsz = value_dtype(dtype).itemsize
    ring = (rows + 2) * (cols + 2)
    band = min(rows, band_rows) * cols * (np.dtype(dtype).itemsize + 8)
    ids = cell_dtype(rows * cols).itemsize
    lakes = rows * cols * (ids + (1 if ids == 4 else 4))
    return ring * 2 * vsz + lakes + band + (64 << 20)


@functools.cache
def _module(vtype: str, ctype: str):
    import cupy as cp

    return cp.RawModule(code=kernel_source("fill.cu"), options=EXACT_OPTIONS + (f"-DVAL={vtype}", f"-DCELL={ctype}"))


@functools.cache
def _outputs_kernel():
    """Filled elevation (the DEM's dtype: ``out`` casts) and float32 depth of a band: the stored
    value at a non-vertex (filled) and NaN (depth), as the CPU writes them."""
    import cupy as cp

    return cp.ElementwiseKernel(
        "T x, T f, T nd", "O filled, float32 depth",
        "const bool ok = !isnan(x) && x != nd;"
        "filled = (O)(ok ? f : x);"
        "depth = ok ? (float)((double)f - (double)x) : __int_as_float(0x7fc00000);",
        "terrain_fill_outputs")


class GpuFill:
    """The whole DEM on the GPU: ``load`` it band by band, ``levels``, ``lakes``, then ``band``."""

    def __init__(self, rows: int, cols: int, dtype, nodata):
        import cupy as cp

        self.rows, self.cols, self.dtype = rows, cols, np.dtype(dtype)
        self.vdtype = value_dtype(dtype)
        self.cdtype = cell_dtype(rows * cols)
        self.mod = _module("float" if self.vdtype == np.float32 else "double",
                           "unsigned" if self.cdtype == np.uint32 else "unsigned long long")
        # a float DEM's non-vertices are NaN; NaN here matches no value (no nodata)
        self.nd = self.vdtype.type(np.nan if nodata is None or self.dtype.kind == "f" else nodata)
        self.vals = cp.full((rows + 2, cols + 2), np.nan, self.vdtype)
        self.F = None
        self.parent = None
        self.rounds = 0

    def load(self, r0: int, block: np.ndarray) -> None:
        """Rows ``r0 ..`` of the DEM (a host array of the DEM's dtype, full width)."""
        import cupy as cp

        self.vals[r0 + 1 : r0 + 1 + block.shape[0], 1:-1] = cp.asarray(block).astype(self.vdtype, copy=False)

    def _grid(self, n: int) -> tuple:
        return (max(1, min(-(-n // THREADS), 65536)),), (THREADS,)

    def levels(self, nodata_drains: bool) -> None:
        """The fill levels F (ringed, the value type): the fixpoint from the outlets (fill.cu)."""
        import cupy as cp

        h, w = self.rows, self.cols
        self.F = cp.empty_like(self.vals)
        args = (self.vals, self.F, np.int32(h), np.int32(w), self.nd)
        self.mod.get_function("init_levels")(*self._grid(self.vals.size), args + (np.int32(nodata_drains),))
        ntr, ntc = -(-h // TILE), -(-w // TILE)
        lists = WorkLists(ntr * ntc)
        self.rounds = lists.run(self.mod.get_function("relax_levels"), args, cp.arange(ntr * ntc, dtype=cp.int32))
        assert (TILE, ROWS_PER_PASS) == (32, 8)  # TS, BY of worklist.cuh

    def lakes(self):
        """The lake raster (uint32 ids in place of the union-find words) and the table's columns:
        (least, cells, pit, spill, level, volume hi, volume lo, max depth, pit elevation,
        spills_to) as NumPy arrays, ids 1, 2, ... in order of each lake's least cell id."""
        import cupy as cp

        h, w = self.rows, self.cols
        n = h * w
        parent = cp.empty((h, w), self.cdtype)
        grid = self._grid(n)
        self.mod.get_function("init_lakes")(*grid, (self.vals, self.F, parent, np.int32(h), np.int32(w), self.nd))
        self.mod.get_function("unite_lakes")(*grid, (parent, np.int32(h), np.int32(w)))
        root = cp.empty((h, w), cp.bool_)  # bool: CuPy's nonzero scans it without a copy
        self.mod.get_function("flatten_lakes")(*grid, (parent, root, np.int32(h), np.int32(w)))
        roots = cp.flatnonzero(root)  # ascending cell ids: the lakes in id order
        k = int(roots.size)
        parent.reshape(-1)[roots] = cp.arange(1, k + 1, dtype=self.cdtype)
        self.mod.get_function("number_lakes")(*grid, (parent, root, np.int64(n)))
        del root
        dep = parent if self.cdtype == np.uint32 else parent.astype(cp.uint32)
        del parent
        self.parent = dep
        u64max = np.iinfo(np.uint64).max
        cells = cp.zeros(k, cp.uint64)
        hi, lo = cp.zeros(k, cp.float64), cp.zeros(k, cp.float64)
        max_depth = cp.zeros(k, cp.uint64)
        pit_key, spill, pit = (cp.full(k, u64max, cp.uint64) for _ in range(3))
        if k:
            runs = -(-n // 16)
            self.mod.get_function("lake_stats")(*self._grid(runs), (self.vals, self.F, dep, np.int32(h), np.int32(w),
                                                                   self.nd, cells, hi, lo, max_depth, pit_key, spill))
            self.mod.get_function("lake_pits")(*grid, (self.vals, dep, np.int32(h), np.int32(w), pit_key, pit))
        spill = cp.where(spill == u64max, -1, spill.astype(cp.int64))
        spills_to = cp.zeros(k, cp.uint32)
        if k:
            self.mod.get_function("spill_targets")(*self._grid(k), (self.F, dep, np.int32(h), np.int32(w), spill,
                                                                    np.int64(k), spills_to))
        pit = pit.astype(cp.int64)
        level = self.F.reshape(-1)[self._ringed(roots)].astype(cp.float64)
        pit_elevation = self.vals.reshape(-1)[self._ringed(pit)].astype(cp.float64) if k else cp.zeros(0)
        return tuple(a.get() for a in (roots.astype(cp.int64), cells.astype(cp.int64), pit, spill, level, hi, lo,
                                       max_depth.view(cp.float64), pit_elevation, spills_to))

    def _ringed(self, cell):
        """Index in the ringed arrays of row-major cell ids."""
        return (cell // self.cols + 1) * (self.cols + 2) + cell % self.cols + 1

    def band(self, r0: int, r1: int, outputs=("elevation", "depth", "depression")) -> tuple:
        """Rows r0 .. r1 of the ``outputs`` on the GPU, in that order: ``elevation`` (filled, the
        DEM's dtype), ``depth``, ``depression`` (lake ids); only those are made."""
        import cupy as cp

        sl = (slice(r0 + 1, r1 + 1), slice(1, self.cols + 1))
        filled = cp.empty((r1 - r0, self.cols), self.dtype)
        depth = cp.empty((r1 - r0, self.cols), cp.float32)
        _outputs_kernel()(self.vals[sl], self.F[sl], self.nd, filled, depth)
        got = {"elevation": filled, "depth": depth, "depression": self.parent[r0:r1]}
        return tuple(got[n] for n in outputs)

    def close(self) -> None:
        import cupy as cp

        self.vals = self.F = self.parent = None
        cp.get_default_memory_pool().free_all_blocks()
