"""The shard method: shortest paths out of core with no boundary graph G' (docs/ARCHITECTURE.md#sssp-engines).

The grid is cut into *units* of whole store shards (k x k of them, the largest that the memory
budget holds; tile-aligned blocks when even one shard does not fit). A unit is solved in core by
the engine of :mod:`.incore` (CPU or GPU, :func:`.incore.solve_block`) from its *ring*: the values,
distances and plateau levels of the cells just outside it, which are boundary cells of the
neighbouring units. Between solves only these *lines* stay in memory -- the outer rows and
columns of every unit, O(N / U) numbers for N cells and units of side U; each solve reads its
unit from the store and writes its result. A unit solved again is solved *warm*, from its last
solve: only the cells its ring's change improves start the heap (the old solution is an upper
bound of the new fixpoint), and on the CPU levels and codes are found again only where the
change reaches (:func:`._incore_cpu.affected_cells`). Run in this process, recently solved units
stay in memory (the GPU's on the GPU): no read, written once when they leave (:class:`UnitCache`).
On the CPU every other re-solve is warm from disk: its written result plus a scratch file of
about 4 bytes a cell (:class:`UnitScratch`; winding paths on zero-weight plateaus re-solve units
~5 times, and a budget 8x below the store keeps none in memory).

Schedule: a Dijkstra over units, after the cluster priority queue of Gerritsen 2012 (part
III, the merge phase) with units for clusters. A unit waits with the least (distance, plateau
level) among its ring cells that changed since its last solve (levels order the flats); the least waiting unit is read, solved, written, and
its boundary compared with what its neighbours last saw; each neighbour whose ring changed waits
again. Boundary (distance, level) pairs only ever fall (lexicographically), so this ends; when no
unit waits, every unit's last solve saw its final ring, so every written unit is final, and the
answers are the in-core method's byte for byte: both are the unique fixpoint of :mod:`.incore`
(least float64 sums; least plateau levels; the same tie rule). Units no source reaches are
written once as unreached at the end.

With a Dask ``scheduler`` the waiting units are solved in rounds, each a batch of tasks (the
least waiting units, no two of them neighbours), every task reading and writing its own shards.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import heapq
import os
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...atomic import scratch_directory
from ...errors import InputError
from ...memory import format_bytes, return_freed_memory_to_os
from ...progress import progress_bar
from ...backend import gpu_free_bytes, to_host
from ...store import TerrainStore, Window, overwrite_file, read_shard, write_shard
from ...timings import Timings
from ..._weights_cpu import edge_weights
from ...weights import DC, DR
from . import _incore_cpu as K
from .incore import block_bytes, output_distance, solve_block, value_dtype
from .result import NO_LEVEL, NO_PRED, SSSPResult, write_result

# (di, dj) of a neighbouring unit -> which of this unit's boundary cells lie on its ring
# ("top"/"bottom"/"left"/"right": a whole side; a corner: one end of a side)
_NEIGHBOURS = {(-1, 0): ("top", None), (1, 0): ("bottom", None), (0, -1): ("left", None), (0, 1): ("right", None),
               (-1, -1): ("top", 0), (-1, 1): ("top", -1), (1, -1): ("bottom", 0), (1, 1): ("bottom", -1)}


def unit_bytes(side: int, value_itemsize: int, device: str) -> int:
    """Host memory of one unit solve. CPU: the in-core block with its work (:func:`.incore.block_bytes`),
    the cells read, the float32 and code outputs with their compressed copies, and what a re-solve
    reads and writes in its :class:`UnitScratch` (residuals and levels, 8 bytes a cell). GPU: only
    the values read, the ring, the outputs (the block lives in GPU memory)."""
    cells = side * side
    if device == "gpu":
        return (side + 2) ** 2 * value_itemsize * 2 + cells * (4 + 1 + 5)
    return block_bytes(side, side, value_itemsize) + cells * (value_itemsize + 4 + 1 + 5 + 8)


PROCESS_BYTES = 1 << 20  # the run's own: reader/writer threads and their malloc arenas, result arrays, schedule


def lines_bytes(shape, side: int, value_itemsize: int) -> int:
    """Memory of the lines (:class:`Lines`) for units of ``side``: two rows of the DEM's width per
    unit row, two columns per unit column, a value, distance, level and code a cell."""
    h, w = shape
    return 2 * (w * -(-h // side) + h * -(-w // side)) * (value_itemsize + 8 + 4 + 1)


def run_bytes(shape, side: int, value_itemsize: int, device: str) -> int:
    """Memory of a run with units of ``side``: one unit solve, the lines, the run's own."""
    return unit_bytes(side, value_itemsize, device) + lines_bytes(shape, side, value_itemsize) + PROCESS_BYTES


UNIT_MMAP_THRESHOLD = 128 << 10  # the units' blocks by mmap, given back (terrain_io.memory.return_freed_memory_to_os)

WARM_UNITS = 4  # solved units kept for warm re-solves when the unit size is chosen (CPU)


def cached_bytes(side: int, value_itemsize: int) -> int:
    """Memory of one unit kept in a :class:`UnitCache`: its ringed values, distances and levels,
    and its parent codes."""
    return (side + 2) ** 2 * (value_itemsize + 8 + 4 + 1)


def stages(side: int, shard_side: int, device: str) -> bool:
    """Whether units of ``side`` stage their results (:class:`UnitStage`) and the result's shards are
    put together once at the end: units smaller than a shard, and every unit on the CPU -- there a
    unit is solved ~5 times, and writing each solve through zarr (encoded, whole shards) was the
    largest cost after the solves (4096^2 under 10 MB, 256^2 units of 128^2 shards: 6.3 of 32 s)."""
    return side % shard_side != 0 or device == "cpu"


def choose_unit(store: TerrainStore, itemsize: int, device: str, budget: int) -> int:
    """The side of a unit: the largest tile-aligned power of two (whole shards when one fits) for
    which one solve and the lines fit ``budget`` -- and, on the GPU, the block its memory -- no
    larger than the grid needs. Bigger units mean fewer lines and fewer re-solves. On the CPU the
    largest that also leaves room for WARM_UNITS solved units (warm re-solves cost a fraction of a
    cold one, and winding paths bounce between neighbours), else the largest that fits."""
    t = store.tile_size
    h, w = store.shape
    gpu_free = gpu_free_bytes() if device == "gpu" else None

    shard = t * store.shard_size

    def need(side):  # staged units (:func:`stages`): their shards are put together at the end too
        staged = assemble_bytes(store, side) + PROCESS_BYTES if stages(side, shard, device) else 0
        return max(run_bytes((h, w), side, itemsize, device), staged)

    top = max(t, 1 << max(0, (max(h, w) - 1).bit_length()))
    sides = [s for s in (t << k for k in range(32)) if s <= top]
    fits = [s for s in sides
            if need(s) <= budget and (gpu_free is None or block_bytes(s, s, itemsize, device) <= gpu_free)]
    if not fits:
        least = min(sides, key=need)
        raise InputError(f"the shard method needs at least {format_bytes(need(least))} for this store "
                         f"({least} x {least} units), more than the memory budget {format_bytes(budget)}")
    if device == "cpu":
        warm = [s for s in fits if need(s) + 3 * WARM_UNITS * cached_bytes(s, itemsize) <= budget]
        if warm and warm[-1] < top:
            return warm[-1]
    return fits[-1]


class Lines:
    """The outer rows and columns of every unit, four fields each: values (NaN until read),
    distances (float64, +inf), plateau levels (int32, NO_LEVEL) and parent codes (uint8).
    ``rows[f][i, 0]`` is field f of unit row i's top grid row and ``rows[f][i, 1]`` of its bottom
    one, the DEM's whole width; ``cols[f][j, 0|1]`` likewise for unit column j."""

    FIELDS = ("v", "d", "l", "p")

    def __init__(self, shape, side: int, vdtype, kind: int, steps):
        h, w = shape
        self.shape, self.side = (h, w), side
        self.kind, self.steps = kind, np.asarray(steps, np.float64)
        self.nur, self.nuc = -(-h // side), -(-w // side)
        self.init = {"v": (np.nan, vdtype), "d": (np.inf, np.float64), "l": (NO_LEVEL, np.int32),
                     "p": (NO_PRED, np.uint8)}
        self.rows = {f: np.full((self.nur, 2, w), *self.init[f]) for f in self.FIELDS}
        self.cols = {f: np.full((self.nuc, 2, h), *self.init[f]) for f in self.FIELDS}
        self.solved = np.zeros((self.nur, self.nuc), bool)  # its boundary is in the lines

    def window(self, i: int, j: int) -> Window:
        s, (h, w) = self.side, self.shape
        return Window(i * s, min((i + 1) * s, h), j * s, min((j + 1) * s, w))

    def ring(self, i: int, j: int) -> dict:
        """Unit (i, j)'s ring from the neighbours' lines: field (v, d, l) -> (top, bottom, left,
        right), the ring rows with their corners (w + 2 cells) and the ring columns (h cells);
        NaN / +inf / NO_LEVEL beyond the DEM. O(h + w): a task carries this, not a block."""
        win = self.window(i, j)
        h, w = win.shape
        a, b = max(win.c0 - 1, 0), min(win.c1 + 1, self.shape[1])  # grid columns of the top/bottom ring rows
        out = {}
        for f in ("v", "d", "l"):
            top, bottom = np.full(w + 2, *self.init[f]), np.full(w + 2, *self.init[f])
            left, right = np.full(h, *self.init[f]), np.full(h, *self.init[f])
            for line, band, end in ((top, i - 1, 1), (bottom, i + 1, 0)):
                if 0 <= band < self.nur:
                    line[a - win.c0 + 1 : b - win.c0 + 1] = self.rows[f][band, end, a:b]
            for line, band, end in ((left, j - 1, 1), (right, j + 1, 0)):
                if 0 <= band < self.nuc:
                    line[:] = self.cols[f][band, end, win.r0 : win.r1]
            out[f] = (top, bottom, left, right)
        return out

    def _side(self, i: int, j: int, name: str):
        """(lines, band, end, cells slice, grid rows, grid cols) of one side of unit (i, j)."""
        win = self.window(i, j)
        rows, cols = np.arange(win.r0, win.r1), np.arange(win.c0, win.c1)
        if name in ("top", "bottom"):
            r = win.r0 if name == "top" else win.r1 - 1
            return self.rows, i, int(name == "bottom"), slice(win.c0, win.c1), np.full(cols.size, r), cols
        c = win.c0 if name == "left" else win.c1 - 1
        return self.cols, j, int(name == "right"), slice(win.r0, win.r1), rows, np.full(rows.size, c)

    def update(self, i: int, j: int, sides: dict) -> dict:
        """Store unit (i, j)'s new boundary ``sides`` (name -> fields v, d, l, p); return the
        neighbours whose solution the change can alter, each with its key: the least changed
        (distance, plateau level)."""
        changed, where = {}, {}
        for name, new in sides.items():
            lines, band, end, part, r, c = self._side(i, j, name)
            old = {f: lines[f][band, end, part] for f in self.FIELDS}
            changed[name] = (new["d"] != old["d"]) | (new["l"] != old["l"]) | (new["p"] != old["p"])
            for f in self.FIELDS:
                old[f][...] = new[f]
            where[name] = (r, c)
        self.solved[i, j] = True
        out = {}
        for (di, dj), (name, end) in _NEIGHBOURS.items():
            ni, nj = i + di, j + dj
            if not (0 <= ni < self.nur and 0 <= nj < self.nuc):
                continue
            part = slice(None) if end is None else slice(end, (end + 1) or None)
            mask = changed[name][part]
            if not mask.any():
                continue
            u = {f: sides[name][f][part][mask] for f in ("v", "d", "l")}
            r, c = (x[part][mask] for x in where[name])
            if not self.solved[ni, nj] or self._matters(ni, nj, r, c, u):
                dmin = u["d"].min()
                out[(ni, nj)] = (float(dmin), int(u["l"][u["d"] == dmin].min()))
        return out

    def _matters(self, i: int, j: int, r, c, u) -> bool:
        """Whether ring cells (r, c) of unit (i, j), now with fields ``u``, can alter its solution.

        Only through an edge into one of its boundary cells x: when it gives x a smaller distance,
        or the same distance through a parent that the tie rule prefers to x's present one (a
        smaller key -- 0 strictly nearer, else level + 1 -- or the same key and a smaller direction
        code). The same float64 operations as the kernels, so the test is exact. (A unit not
        solved yet has no boundary in the lines: any reached cell matters, the caller's test.)"""
        win = self.window(i, j)
        for k in range(8):
            xr, xc = r + DR[k], c + DC[k]
            inside = (xr >= win.r0) & (xr < win.r1) & (xc >= win.c0) & (xc < win.c1)
            if not inside.any():
                continue
            xr, xc = xr[inside], xc[inside]
            du, lu, vu = u["d"][inside], u["l"][inside], u["v"][inside].astype(np.float64)
            x = self._cells(i, j, xr, xc)
            nd = du + edge_weights(self.kind, vu, x["v"].astype(np.float64), self.steps[k])
            if np.any(nd < x["d"]):
                return True
            # a tie: the parent direction from x to u is k ^ 4; x's present key is 0 or its level
            key_u = np.where(du < x["d"], 0, lu.astype(np.int64) + 1)
            key_x = x["l"].astype(np.int64)
            tie = (nd == x["d"]) & (x["p"] != NO_PRED)
            if np.any(tie & ((key_u < key_x) | ((key_u == key_x) & ((k ^ 4) < x["p"])))):
                return True
        return False

    def _cells(self, i: int, j: int, r, c) -> dict:
        """Fields of boundary cells (r, c) of unit (i, j)."""
        win = self.window(i, j)
        top, bottom, left = r == win.r0, r == win.r1 - 1, c == win.c0
        return {f: np.where(top, self.rows[f][i, 0, c], np.where(bottom, self.rows[f][i, 1, c], np.where(
            left, self.cols[f][j, 0, r], self.cols[f][j, 1, r]))) for f in self.FIELDS}


def boundary_sides(vals, dist, level, pred) -> dict:
    """A solved block's outer interior rows and columns: name -> fields v, d, l (ringed blocks) and
    p (the interior's parent codes)."""
    h, w = vals.shape[0] - 2, vals.shape[1] - 2
    cut = {"top": (1, slice(1, w + 1)), "bottom": (h, slice(1, w + 1)),
           "left": (slice(1, h + 1), 1), "right": (slice(1, h + 1), w)}
    out = {}
    for name, (a, b) in cut.items():
        pa = a - 1 if isinstance(a, int) else slice(0, h)
        pb = b - 1 if isinstance(b, int) else slice(0, w)
        out[name] = {"v": vals[a, b], "d": dist[a, b], "l": level[a, b], "p": pred[pa, pb]}
    return out


@dataclass
class UnitResult:
    """What one unit solve hands back to the schedule (small: its boundary and counts)."""

    i: int
    j: int
    sides: dict
    reached: int
    max_distance: float
    warm: bool = False  # solved from its earlier solve (kept in memory or on disk)


@dataclass
class UnitTask:
    """One unit solve, self-contained (pickled to a Dask worker with its ring)."""

    field: object  # index.Field (pickles by paths)
    distance: str  # paths of the result arrays (in the result group being written)
    predecessor: str
    i: int
    j: int
    window: Window
    ring: dict  # field (v, d, l) -> the ring's four sides (:meth:`Lines.ring`), or None: unreached
    sources: np.ndarray  # (n, 2) interior cells of the unit
    device: str
    threads: int
    cache: object = None  # a UnitCache (the local schedule), else None
    limit: float = np.inf  # --max-cost
    every_cell_valid: bool = False  # an unreached unit is then written without being read
    scratch: str | None = None  # the run's UnitScratch folder (CPU solves)
    stage: str | None = None  # the run's UnitStage folder (:func:`stages`: units smaller than a shard, every CPU unit)


class UnitCache:
    """The solved blocks (values, distances, levels, parent codes) of recently solved units, least
    recently used first out, within ``capacity`` bytes. A unit found here is solved again warm: no
    read, and only what its ring's change reaches (:func:`.incore.solve_block`), the same bytes as
    a cold solve. Worth most where shortest paths wind back and forth across unit edges.

    Write-back: a kept unit's result is written only when it leaves (``put``'s ``write``, called
    on eviction, or by :meth:`flush` at the end), so a unit solved again meanwhile is written once."""

    def __init__(self, capacity: int):
        self.capacity, self.used, self.items = max(0, int(capacity)), 0, collections.OrderedDict()
        self.hits = 0

    def get(self, key):
        item = self.items.get(key)
        if item is None:
            return None
        self.items.move_to_end(key)
        self.hits += 1
        return item[0]

    def holds(self, blocks) -> bool:
        """Whether ``blocks`` fit the cache at all (:meth:`put` writes them at once otherwise)."""
        return sum(b.nbytes for b in blocks) <= self.capacity

    def put(self, key, blocks, write) -> None:
        """Keep ``blocks`` for ``key`` (replacing its older solve, unwritten), ``write()`` pending;
        units pushed out are written, and so is this one at once if it cannot be kept."""
        size = sum(b.nbytes for b in blocks)
        old = self.items.pop(key, None)
        if old is not None:
            self.used -= sum(b.nbytes for b in old[0])
        while self.items and self.used + size > self.capacity:
            self._evict()
        if size <= self.capacity:
            self.items[key] = (blocks, write)
            self.used += size
        else:
            write()

    def _evict(self, final: bool = False) -> None:
        _, (gone, write) = self.items.popitem(last=False)
        self.used -= sum(b.nbytes for b in gone)
        write(final=final)

    def flush(self) -> None:
        """Write every kept unit (its result only: no solve follows) and forget them."""
        while self.items:
            self._evict(final=True)


class UnitScratch:
    """What a CPU re-solve of a unit needs beyond its written result, on disk: a re-solve is then
    warm whether or not the unit was kept in memory (:class:`UnitCache`), at the cost of a read of
    a few bytes a cell instead of a whole Dijkstra.

    A unit's float64 distances are its written float32 ones plus an int32 residual a cell
    (:func:`._incore_cpu.split_distances`, exact); its codes are the written ones. Kept here, per
    unit, in one file: the residuals (raw), the plateau levels of the ringed block (the ring's, as
    its last solve saw them, included; zstd: mostly 0) and the ring's distances -- about 4.2 bytes
    a cell, 1.5-1.7x the store on disk. The folder is a :func:`.atomic.scratch_directory` (removed
    after the run; a killed run's by the next)."""

    def __init__(self, path):
        self.path = str(path)

    def file(self, i: int, j: int) -> str:
        # a str, not a Path: Python 3.11's pathlib interns every name it parses, and a few hundred
        # new ones can resize the interpreter's interned table (~1.9 MB: past a 3.5 MiB budget)
        return os.path.join(self.path, f"{i}_{j}.zst")

    def save(self, i: int, j: int, dist: np.ndarray, level: np.ndarray, d32: np.ndarray) -> None:
        """Keep unit (i, j)'s ringed distances and levels (``d32``: the float32 distances written)."""
        from numcodecs import Zstd

        residual = np.empty(d32.shape, np.int32)
        f = self.file(i, j)
        if not K.split_distances(dist, d32, residual):  # (distances below float32's normals) cold next time
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f)
            return
        parts = [memoryview(residual).cast("B"), Zstd(level=1).encode(level), _perimeter(dist).tobytes()]
        overwrite_file(f, [np.array([len(p) for p in parts], np.int64).tobytes(), *parts])

    def load(self, i: int, j: int, d32: np.ndarray, vals: np.ndarray, dist: np.ndarray, level: np.ndarray):
        """Unit (i, j)'s earlier ringed distances and levels into ``dist`` and ``level`` (``vals``:
        its ringed values, ``d32``: its written float32 distances); the old ring's distances
        returned, or None when nothing is kept."""
        from numcodecs import Zstd

        residual = np.empty(d32.shape, np.int32)
        try:
            with open(self.file(i, j), "rb") as f:
                sizes = np.frombuffer(f.read(24), np.int64)
                f.readinto(memoryview(residual).cast("B"))
                levels, ring = f.read(int(sizes[1])), f.read(int(sizes[2]))
        except FileNotFoundError:
            return None
        K.join_distances(d32, residual, vals, dist)
        del residual
        level[...] = np.frombuffer(Zstd().decode(levels), np.int32).reshape(level.shape)
        return np.frombuffer(ring, np.float64)


class UnitStage:
    """The results of staged units (:func:`stages`), on disk until the run ends; then each shard
    of the result is put together from its units and written once (:func:`_assemble`).

    zarr writes a part of a shard by reading, and writing back, the whole shard file through its
    event loop: with 128^2 units of 512^2 shards (16 units a shard, ~4.4 solves a unit) that was
    9/10 of the run (4096^2 under 16 MiB: 134 s of which the solves took 7). Here a unit's float32
    distances (raw) and codes (zstd, level 1) are one file, read back by a re-solve from disk."""

    def __init__(self, path):
        self.path = str(path)

    def file(self, i: int, j: int) -> str:  # (a str: see UnitScratch.file)
        return os.path.join(self.path, f"{i}_{j}.out")

    def save(self, i: int, j: int, d32: np.ndarray, pred: np.ndarray) -> None:
        from numcodecs import Zstd

        parts = [memoryview(np.ascontiguousarray(d32, np.float32)).cast("B"),  # raw: zstd saves ~10% of them
                 Zstd(level=1).encode(np.ascontiguousarray(pred))]
        overwrite_file(self.file(i, j), [np.array([len(p) for p in parts], np.int64).tobytes(), *parts])

    def load(self, i: int, j: int, shape) -> tuple[np.ndarray, np.ndarray]:
        """Unit (i, j)'s float32 distances and parent codes, of ``shape``. The distances are read
        into a writable array: a read-only one (``np.frombuffer`` of bytes) is another numba type,
        and ``join_distances`` would compile or load a second build of itself in the middle of the
        run (+12-14 MiB of peak RSS at 4096 x 8192 under 16 MiB, past the budget)."""
        from numcodecs import Zstd

        d32 = np.empty(shape, np.float32)
        with open(self.file(i, j), "rb") as f:
            sizes = np.frombuffer(f.read(16), np.int64)
            f.readinto(memoryview(d32).cast("B"))
            p = f.read(int(sizes[1]))
        return d32, np.frombuffer(Zstd().decode(p), np.uint8).reshape(shape)


def assemble_bytes(store: TerrainStore, side: int) -> int:
    """Memory of one lane of :func:`_assemble`: a shard of float32 distances and codes, their
    compressed chunks and those joined into the shard file (up to 5 bytes a cell each), and a
    unit's file decoded (measured: 3 lanes of 2048^2 shards took +170 MiB at 16384^2 under 128 MB
    when counted at 10 bytes a cell)."""
    s = store.tile_size * store.shard_size
    return 15 * min(s, store.shape[0]) * min(s, store.shape[1]) + 10 * side * side


def _assemble(stage: UnitStage, dist_arr, pred_arr, lines, lanes: int, progress: bool) -> None:
    """Write every shard of the result from the staged units: a shard's units put together (a
    shard's float32 distances and codes, and their encoding, in memory per lane), or a unit of
    whole shards read once and cut into them."""
    sh0, sh1 = dist_arr.shards
    h, w = dist_arr.shape
    side = lines.side

    def write(job):
        sr, sc = job
        r0, r1, c0, c1 = sr * sh0, min((sr + 1) * sh0, h), sc * sh1, min((sc + 1) * sh1, w)
        d32 = np.empty((r1 - r0, c1 - c0), np.float32)
        pred = np.empty((r1 - r0, c1 - c0), np.uint8)
        for i in range(r0 // side, -(-r1 // side)):
            for j in range(c0 // side, -(-c1 // side)):
                win = lines.window(i, j)
                part = (slice(win.r0 - r0, win.r1 - r0), slice(win.c0 - c0, win.c1 - c0))
                d32[part], pred[part] = stage.load(i, j, win.shape)
        write_shard(dist_arr, sr, sc, d32)
        write_shard(pred_arr, sr, sc, pred)

    def write_unit(job):  # a unit of whole shards: read once, each of its shards written from it
        i, j = job
        win = lines.window(i, j)
        d32, pred = stage.load(i, j, win.shape)
        for r0 in range(win.r0, win.r1, sh0):
            for c0 in range(win.c0, win.c1, sh1):
                part = (slice(r0 - win.r0, min(r0 + sh0, h) - win.r0), slice(c0 - win.c0, min(c0 + sh1, w) - win.c0))
                write_shard(dist_arr, r0 // sh0, c0 // sh1, d32[part])
                write_shard(pred_arr, r0 // sh0, c0 // sh1, pred[part])

    if side % sh0 == 0 and side % sh1 == 0:
        work, jobs = write_unit, [(i, j) for i in range(lines.nur) for j in range(lines.nuc)]
    else:
        work, jobs = write, [(sr, sc) for sr in range(-(-h // sh0)) for sc in range(-(-w // sh1))]
    with ThreadPoolExecutor(lanes) as pool, progress_bar(progress, len(jobs), "sssp write", unit="part") as bar:
        for _ in pool.map(work, jobs):
            bar.update(1)


def _perimeter(block):
    """The ring cells of a ringed block: top and bottom rows, then left and right columns."""
    return np.concatenate([block[0], block[-1], block[1:-1, 0], block[1:-1, -1]])


@functools.lru_cache(maxsize=2)
def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool of reader/writer threads for every unit of this process: new threads for each
    unit would each grow a malloc arena of their own."""
    return ThreadPoolExecutor(threads, thread_name_prefix="sssp-units")


def _read_values(field, win: Window, vdtype, threads: int, out: np.ndarray | None = None) -> np.ndarray:
    """The unit's cells (NaN where not a vertex), its store shards decoded in parallel threads
    (into ``out`` when given)."""
    st = field.store
    out = np.empty(win.shape, vdtype) if out is None else out
    s = st.tile_size * st.shard_size
    parts = [Window(r, min(r + s, win.r1), c, min(c + s, win.c1))
             for r in range(win.r0, win.r1, s) for c in range(win.c0, win.c1, s)]

    def read(p):
        out[p.r0 - win.r0 : p.r1 - win.r0, p.c0 - win.c0 : p.c1 - win.c0] = field.read(p, vdtype)

    _each(read, parts, threads)
    return out


def _each(fn, jobs: list, threads: int) -> None:
    """``fn(job)`` for every job, in the pool's threads when several (zstd releases the GIL)."""
    if len(jobs) == 1 or threads == 1:
        for job in jobs:
            fn(job)
    else:
        list(_pool(threads).map(fn, jobs))


def _whole_shards(arr, win: Window) -> list | None:
    """The shards (sr, sc) of ``arr`` that make up window ``win``, or None when it is not whole
    shards (then zarr reads and writes it)."""
    sh0, sh1 = arr.shards
    if win.r0 % sh0 or win.c0 % sh1 or (win.r1 % sh0 and win.r1 != arr.shape[0]) or (
            win.c1 % sh1 and win.c1 != arr.shape[1]):
        return None
    return [(sr, sc) for sr in range(win.r0 // sh0, -(-win.r1 // sh0))
            for sc in range(win.c0 // sh1, -(-win.c1 // sh1))]


def _write_unit(dist_arr, pred_arr, win: Window, d32: np.ndarray, pred: np.ndarray, threads: int) -> None:
    """Write a unit's result: whole shards by :func:`write_shard` in parallel threads, else by zarr."""
    jobs = _whole_shards(dist_arr, win)
    if jobs is None:
        dist_arr[win.slices] = d32
        pred_arr[win.slices] = pred
        return
    sh0, sh1 = dist_arr.shards

    def write(job):
        sr, sc = job
        r0, c0 = sr * sh0 - win.r0, sc * sh1 - win.c0
        part = (slice(r0, r0 + sh0), slice(c0, c0 + sh1))
        write_shard(dist_arr, sr, sc, np.ascontiguousarray(d32[part]))
        write_shard(pred_arr, sr, sc, np.ascontiguousarray(pred[part]))

    _each(write, jobs, threads)


def _read_unit(arr, win: Window, threads: int) -> np.ndarray:
    """A unit's cells of a result array being written: whole shards by :func:`read_shard` in
    parallel threads, else by zarr."""
    jobs = _whole_shards(arr, win)
    if jobs is None:
        return arr[win.slices]
    out = np.empty(win.shape, arr.dtype)
    sh0, sh1 = arr.shards

    def read(job):
        sr, sc = job
        r0, c0 = sr * sh0 - win.r0, sc * sh1 - win.c0
        part = read_shard(arr, sr, sc)
        out[r0 : r0 + part.shape[0], c0 : c0 + part.shape[1]] = part

    _each(read, jobs, threads)
    return out


@functools.lru_cache(maxsize=4)
def _result_array(path: str):
    """A result array being written, opened once per process (paths are unique to a run)."""
    import zarr

    return zarr.open_array(path, mode="r+")


def solve_unit(task: UnitTask) -> UnitResult:
    """Read a unit, solve it from its ring (in core, CPU or GPU), write its result; its boundary back.

    A unit solved before is solved warm: from its kept blocks when in the task's cache (host or
    GPU), else on the CPU from what its last solve left on disk (its written result and its
    :class:`UnitScratch`) -- the new ring put in, and on the CPU levels and codes found again only
    where the ring's change reaches. Every way gives the same bytes as a cold solve."""
    field = task.field
    dist_arr, pred_arr = _result_array(task.distance), _result_array(task.predecessor)
    win = task.window
    h, w = win.shape
    vdtype = value_dtype(field)
    stage = UnitStage(task.stage) if task.stage is not None else None

    def put(d32, pred):  # the unit's result: into the stage, or straight into the result's shards
        if stage is not None:
            stage.save(task.i, task.j, d32, pred)
        else:
            _write_unit(dist_arr, pred_arr, win, d32, pred, task.threads)

    if task.ring is None:  # never reached: +inf on its vertices, no parents
        if task.every_cell_valid:
            d32 = np.full((h, w), np.inf, np.float32)
        else:
            interior = _read_values(field, win, vdtype, task.threads)
            d32 = np.where(np.isnan(interior), np.float32(np.nan), np.float32(np.inf))
        put(d32, np.full((h, w), NO_PRED, np.uint8))
        return UnitResult(task.i, task.j, {}, 0, 0.0)
    xp = np
    if task.device == "gpu":
        import cupy as xp
    scratch = UnitScratch(task.scratch) if task.scratch is not None and task.device == "cpu" else None
    cached = task.cache.get((task.i, task.j)) if task.cache is not None else None
    old_ring = pred = None
    if cached is not None:  # warm: no read
        vals, dist, level, pred = cached
        if xp is np:
            old_ring = (_perimeter(dist), _perimeter(level))
    else:  # the interior read straight into the block (on the GPU: one copy over)
        vals = xp.empty((h + 2, w + 2), vdtype)
        if xp is np:
            _read_values(field, win, vdtype, task.threads, out=vals[1:-1, 1:-1])
        else:
            vals[1:-1, 1:-1] = xp.asarray(_read_values(field, win, vdtype, task.threads))
        dist = xp.empty((h + 2, w + 2), np.float64)  # a cold solve sets the interior to +inf
        level = xp.full((h + 2, w + 2), NO_LEVEL, np.int32)
        if scratch is not None and os.path.exists(scratch.file(task.i, task.j)):  # warm from disk
            if stage is not None:
                d32, pred = stage.load(task.i, task.j, (h, w))
                pred = pred.copy()  # (updated in place by the solve)
            else:
                d32 = _read_unit(dist_arr, win, task.threads)
            ring_d = scratch.load(task.i, task.j, d32, vals, dist, level)
            del d32
            if ring_d is None:
                pred = None
            else:
                old_ring = (ring_d, _perimeter(level))
                if pred is None:
                    pred = _read_unit(pred_arr, win, task.threads)
    for block, f in ((vals, "v"), (dist, "d"), (level, "l")):
        top, bottom, left, right = (xp.asarray(a) for a in task.ring[f])
        block[0], block[-1], block[1:-1, 0], block[1:-1, -1] = top, bottom, left, right
    changed = None
    if old_ring is not None:  # the ring cells whose distance or level moved since the last solve
        changed = np.zeros((h + 2, w + 2), np.uint8)
        moved = ((old_ring[0] != _perimeter(dist)) | (old_ring[1] != _perimeter(level))).astype(np.uint8)
        changed[0], changed[-1] = moved[: w + 2], moved[w + 2 : 2 * w + 4]
        changed[1:-1, 0], changed[1:-1, -1] = moved[2 * w + 4 : 2 * w + 4 + h], moved[2 * w + 4 + h :]
        del old_ring, moved
    warm = cached is not None or changed is not None
    d, lv, pred = solve_block(vals, field.model.kind, field.steps(), task.sources, dist, level, device=task.device,
                              warm=warm, limit=task.limit, pred=pred if changed is not None else None,
                              changed=changed)
    del changed
    host = to_host if task.device == "gpu" else np.array  # copies: the sides outlive the blocks
    sides = {k: {f: host(a) for f, a in v.items()} for k, v in boundary_sides(vals, d, lv, pred).items()}
    d32 = output_distance(d, vals)
    finite = xp.isfinite(d32)
    reached = int(finite.sum())
    if xp is np:
        dmax = float(np.max(d32, where=finite, initial=0.0))
    else:
        dmax = float(xp.max(xp.where(finite, d32, np.float32(0)))) if reached else 0.0
    del finite

    def write(d32=None, final=False):
        d32 = output_distance(d, vals) if d32 is None else d32
        put(to_host(d32), to_host(pred))
        if scratch is not None and not final:
            scratch.save(task.i, task.j, d, lv, d32)

    blocks = (vals, d, lv, pred)
    if task.cache is not None and task.cache.holds(blocks):  # written when it leaves (the float32 copy made then)
        del d32
        task.cache.put((task.i, task.j), blocks, write)
    else:  # (a budget 8x below the store keeps none: the float32 copy made once)
        write(d32)
    return UnitResult(task.i, task.j, sides, reached, dmax, warm)


@functools.lru_cache(maxsize=4)
def load_warm_kernels(vdtype, kind: int) -> None:
    """Compile or load the kernels of a CPU re-solve from disk (warm distances, levels and codes;
    the residuals) on a tiny block, once a process: at the start of a run, with the process's
    fixed costs, not in the middle of its working set."""
    vals = np.zeros((5, 5), vdtype)
    steps, src = np.ones(8), np.array([[1, 1]])
    dist, level, pred = solve_block(vals, kind, steps, src)
    d32 = output_distance(dist, vals)
    residual = np.empty(d32.shape, np.int32)
    K.split_distances(dist, d32, residual)
    K.join_distances(d32, residual, vals, dist)
    solve_block(vals, kind, steps, src, dist, level, warm=True, pred=pred, changed=np.ones(vals.shape, np.uint8))


def _io_bytes() -> tuple[int, int]:
    """Bytes this process read and wrote through system calls (Linux /proc/self/io), for the
    bytes-per-cell figures (Dask workers' own are not counted); zeros where unavailable."""
    try:
        with open("/proc/self/io") as f:
            kv = dict(line.split(": ") for line in f.read().splitlines())
        return int(kv["rchar"]), int(kv["wchar"])
    except (OSError, KeyError, ValueError):
        return 0, 0


def run_shards(store: TerrainStore, field, cells, name: str, device: str, budget: int, progress: bool, attrs: dict,
               scheduler: str | None = "local", unit: int | None = None, announce=None, limit: float = np.inf,
               allocation: bool = False, predecessor: bool = True):
    """The shard method on a store; writes ``sssp/NAME`` with ``attrs`` and the schedule's figures.
    ``unit``: the unit side in cells (a multiple of the tile size; default from the budget).
    ``limit``: no cell farther is reached, and a unit whose ring changed only beyond it is not
    solved again (nor at all when never within it). ``allocation``: ``source`` too, by a pass over
    the written predecessors (:func:`.allocation.write_allocation`)."""
    from ...parallel import check_scheduler, map_shards, scheduler_threads

    return_freed_memory_to_os(UNIT_MMAP_THRESHOLD)
    scheduler = check_scheduler(scheduler)
    vdtype = value_dtype(field)
    side = int(unit) if unit else choose_unit(store, vdtype.itemsize, device, budget)
    # solved units kept for warm re-solves: on the CPU in a third of what the budget leaves spare (a
    # kept unit saves only its reads and writes, re-solves being warm from the scratch on disk
    # too; the rest: the slack of the estimates -- the heaps of reader and writer threads creep
    # by ~1.5 MiB over a few hundred solves; choose_unit leaves room for WARM_UNITS of them), on
    # the GPU in its free memory less two solves' blocks (the host budget is not touched)
    if device == "gpu":
        spare = gpu_free_bytes() - 2 * block_bytes(side, side, vdtype.itemsize, device)
    else:
        spare = (budget - run_bytes(store.shape, side, vdtype.itemsize, device)) // 3
    cache = UnitCache(spare) if scheduler == "local" else None
    if side % store.tile_size:
        raise InputError(f"a unit of the shard method is whole tiles: {side} is no multiple of {store.tile_size}")
    lines = Lines(store.shape, side, vdtype, field.model.kind, field.steps())
    every_cell_valid = field.every_cell_valid()
    nur, nuc = lines.nur, lines.nuc
    threads = max(1, min(os.cpu_count() or 1, 16))
    src = np.asarray(cells, np.int64).reshape(-1, 2)
    waiting = {}  # (i, j) -> key of a unit to solve: the least changed (distance, level) of its ring
    heap = []
    for r, c in src:
        ij = (int(r) // side, int(c) // side)
        if ij not in waiting:
            waiting[ij] = (0.0, 0)
            heapq.heappush(heap, ((0.0, 0), ij))
    solves = np.zeros((nur, nuc), np.int32)
    warm = np.zeros((nur, nuc), np.int32)  # of them warm
    reach = {}
    io0 = _io_bytes()
    timings = Timings()
    bar = progress_bar(progress, nur * nuc, "sssp units", unit="unit")
    shard_side = store.tile_size * store.shard_size
    staged = stages(side, shard_side, device)  # results staged (UnitStage), each shard written once
    with contextlib.ExitStack() as stack:
        stack.enter_context(timings.phase("solve"))  # the whole run, the result's commit included
        scratch = stage = None
        if device == "cpu" or staged:
            folder = stack.enter_context(scratch_directory(store.path, "sssp-shards"))
            scratch = UnitScratch(folder) if device == "cpu" else None
            stage = UnitStage(folder) if staged else None
        if device == "cpu":
            load_warm_kernels(vdtype, field.model.kind)
        arrays = stack.enter_context(write_result(store, name, attrs, allocation, predecessor))
        dist_arr, pred_arr = arrays.distance, arrays.predecessor
        paths = [f"{a.store.root}/{a.path}" for a in (dist_arr, pred_arr)]

        def task(i, j, reached=True):
            win = lines.window(i, j)
            ring = lines.ring(i, j) if reached else None
            inside = src[(src[:, 0] >= win.r0) & (src[:, 0] < win.r1) & (src[:, 1] >= win.c0) & (src[:, 1] < win.c1)]
            return UnitTask(field, *paths, i, j, win, ring, inside - (win.r0, win.c0), device,
                            threads if scheduler == "local" else 1, cache if reached else None, limit,
                            every_cell_valid, scratch.path if scratch is not None and reached else None,
                            stage.path if stage is not None else None)

        def absorb(res: UnitResult):
            if solves[res.i, res.j] == 0:
                bar.update(1)
            solves[res.i, res.j] += 1
            warm[res.i, res.j] += res.warm
            reach[(res.i, res.j)] = (res.reached, res.max_distance)
            for ij, key in lines.update(res.i, res.j, res.sides).items():
                if key[0] > limit:
                    continue  # changes beyond the limit reach nothing
                if ij not in waiting or key < waiting[ij]:
                    waiting[ij] = key
                    heapq.heappush(heap, (key, ij))

        rounds = 0
        per_round = 1 if scheduler == "local" else scheduler_threads(scheduler)  # a Dask round
        while heap:
            batch = _next_batch(heap, waiting, per_round)
            rounds += 1
            for ij in batch:
                del waiting[ij]
            results = map_shards(solve_unit, [task(i, j) for i, j in batch], scheduler, announce=announce)
            for res in results:
                absorb(res)
        if cache is not None:
            cache.flush()
        scratch_bytes = sum(f.stat().st_size for f in Path(folder).iterdir()) if device == "cpu" or staged else 0
        unreached = [(i, j) for i in range(nur) for j in range(nuc) if solves[i, j] == 0]
        unreached_tasks = [task(i, j, reached=False) for i, j in unreached]
        if scheduler == "local" and len(unreached) > 1:
            # only constant blocks to write (and, with nodata, the values to read): a unit a thread,
            # as many as the budget holds
            host_spare = budget - run_bytes(store.shape, side, vdtype.itemsize, device)
            lanes = int(max(1, min(threads, host_spare // max(1, unit_bytes(side, vdtype.itemsize, "cpu")))))
            unreached_tasks = [dataclasses.replace(t, threads=1) for t in unreached_tasks]
            with ThreadPoolExecutor(lanes) as pool:
                for _ in pool.map(solve_unit, unreached_tasks):
                    bar.update(1)
        else:
            map_shards(solve_unit, unreached_tasks, scheduler, progress=bar, announce=announce)
        if stage is not None:  # every shard put together from its units, once
            del lines.rows, lines.cols  # (the lines are done with)
            # (beside what the solves leave in the heap: with two lanes at 4096^2 under 10 MB the
            # assembly took the run to +13.5 MiB)
            lanes = (budget - run_bytes(store.shape, side, vdtype.itemsize, device)) // assemble_bytes(store, side)
            _assemble(stage, dist_arr, pred_arr, lines, int(max(1, min(threads, lanes))), progress)
        if allocation:
            from .allocation import allocation_threads, write_allocation

            write_allocation(pred_arr, arrays.source, store.shards(), cells,
                             store.shape, allocation_threads(store, budget, threads))
        reached = sum(n for n, _ in reach.values())
        dmax = max((m for _, m in reach.values()), default=0.0)
        io1 = _io_bytes()
        n_cells = store.shape[0] * store.shape[1]
        stats = {"unit": side, "units": nur * nuc, "solves": int(solves.sum()), "rounds": rounds,
                 "solves_per_unit": round(float(solves[solves > 0].mean()) if (solves > 0).any() else 0.0, 3),
                 "max_solves": int(solves.max()), "unreached_units": len(unreached),
                 "warm_solves": int(warm.sum()), "kept_solves": cache.hits if cache is not None else 0,
                 "scratch_bytes": scratch_bytes,
                 "read_bytes_per_cell": round((io1[0] - io0[0]) / n_cells, 3),
                 "written_bytes_per_cell": round((io1[1] - io0[1]) / n_cells, 3)}
        arrays.finish(reached, dmax, shards=stats)
    bar.close()
    return SSSPResult(name, field.model.name, cells, "shards", reached, dmax, timings.rounded(), device,
                      merge_stats=stats)


def _next_batch(heap, waiting: dict, size: int) -> list:
    """The least waiting units, at most ``size`` of them and no two neighbours (a neighbour of a
    unit in the batch would be solved from a ring about to change)."""
    batch, skipped = [], []
    while heap and len(batch) < size:
        key, (i, j) = heapq.heappop(heap)
        if waiting.get((i, j)) != key:
            continue  # stale entry
        if any(abs(i - a) <= 1 and abs(j - b) <= 1 for a, b in batch):
            skipped.append((key, (i, j)))
            continue
        batch.append((i, j))
    for item in skipped:
        heapq.heappush(heap, item)
    return batch
