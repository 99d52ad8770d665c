"""Minimum spanning forest of a DEM's 8-connected grid graph, out of core (``terrain mst``).

The I/O-efficient hierarchical pipeline of Gerritsen 2012, part II (ch. 2-3), after
Haverkort 2012; docs/ARCHITECTURE.md#mst-pipeline:

1. Tile phase -- for every tile, the minimum spanning forest of its induced subgraph (numba
   Kruskal on the CPU, Boruvka after Harish et al. on the GPU), written to ``mst/edges``, then
   contracted to a graph on the tile's boundary cells and branch vertices (dead ends removed,
   degree-2 paths replaced by their maximum edge; on the GPU by leaf-pruning rounds and path
   walks, one thread block per tile, see ``_gpu``). For the ``max`` model the CPU's Kruskal
   contracts as it unions: a super-edge between boundary cells whenever it joins two components
   that hold some (``_cpu.tile_forest_max``; the same forest, a smaller graph).
2. Merge phase -- streaming with the tile phase: whenever the tiles of a quadtree block are all
   done, the graphs of its (up to 4) children plus the separator edges between them are merged
   (Kruskal) and contracted against the block's own boundary as they unite (super-edges between
   the components' boundary vertices, every other forest edge final). The levels inside a batch are
   merged in one call per batch (``_cpu.merge_batch``), batches in parallel threads;
   the levels above, in Morton order as batches complete. Only the blocks on the current Morton
   path and the decisions (O(N/T) codes) are held in memory.
3. Expand -- one pass over ``mst/edges``, shards in parallel threads, each read and written once:
   clear the representatives that a merge dropped, set the separator edges that made it into the
   tree.

In core (``method="incore"``, chosen by ``auto`` where it fits; :func:`choose_method`) the phases are
skipped: on the GPU the whole DEM is read into GPU memory and one data-parallel Boruvka runs over the
whole grid graph (``_gpu.GpuGridForest``), its bits written from there (:func:`_mst_gpu_incore`); on the
CPU (a small DEM, :data:`IN_MEMORY_BELOW` cells, by default) one Kruskal over all its edges in memory
(``_cpu.grid_forest``). The same forest, written the same way.

Edges obey one strict order (weight, smaller cell id, larger cell id), so the forest is unique
and identical for every backend, tile size and batch size. Nodata cells are not vertices: the
result is a forest, one tree per connected island of valid cells.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import math
import os
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ... import weights as weight_models
from ...backend import Dispatch, gpu_free_bytes, resolve_device
from ...errors import InputError
from ...jit import SERIAL_BELOW
from ...memory import format_bytes, memory_budget, return_freed_memory_to_os
from ...parallel import check_scheduler, imap_shards, map_shards, scheduler_workers
from ...pinned import frame_plan, host_bytes, write_held
from ...progress import progress_bar
from ...store import TerrainStore, Window, read_window, write_window
from ...timings import Timings
from ...zorder import morton_decode
from ...weights import DC, DR
from .shared import FOREST_CELLS, FOREST_EDGES, FOREST_GIVEN, N_EXP, cells_sortable, exact_total
from ..tiling import Batch, check_side, plan, plan_batches

RESULT = "mst"


def _kernels():
    """The numba kernels (:mod:`._cpu`), imported on first use: the GPU's in-core route runs none, and
    numba's import is ~0.3-0.6 s of a command's start."""
    from . import _cpu

    return _cpu


@dataclass
class MSTResult:
    """What ``mst`` computed; the same numbers are the attributes of the ``mst`` result group."""

    weight: str
    device: str
    cells: int
    valid_cells: int
    edges: int
    trees: int
    total_weight: float
    total_weight_exact: str  # the exact sum as a fraction "p/q" (or an integer)
    seconds: float
    timings: dict = field(default_factory=dict)
    tile_size: int = 0
    batch_tiles: int = 0
    merge_decisions: int = 0  # removed + kept codes held for the expand pass: O(N/T)

    @property
    def mcells_per_s(self) -> float:
        return self.cells / self.seconds / 1e6 if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        return (f"mst: {self.cells:,} cells ({self.valid_cells:,} valid), {self.edges:,} edge{'s' if self.edges != 1 else ''}, "
                f"{self.trees:,} tree{'s' if self.trees != 1 else ''}, total weight {self.total_weight:.10g} m "
                f"[{self.weight}], {self.seconds:.2f} s, {self.mcells_per_s:.1f} Mcells/s ({self.device})")

    def attrs(self) -> dict:
        return {"weight_model": self.weight, "device": self.device, "cells": self.cells,
                "valid_cells": self.valid_cells, "edge_count": self.edges, "trees": self.trees,
                "total_weight": self.total_weight, "total_weight_exact": self.total_weight_exact,
                "seconds": self.seconds, "timings": self.timings, "tile_size": self.tile_size,
                "batch_tiles": self.batch_tiles, "merge_decisions": self.merge_decisions,
                "edges_encoding": "bit k set: edge to the neighbour in direction k (0=E, 1=SE, 2=S, 3=SW)"}


@dataclass
class _Block:
    """A quadtree block's contracted graph (see _cpu): vertices and super-edges."""

    level: int
    code: int
    vid: np.ndarray
    vh: np.ndarray
    vmask: np.ndarray
    eu: np.ndarray
    ev: np.ndarray
    ew: np.ndarray
    ecode: np.ndarray


class _Merged(NamedTuple):
    """A merge's result: the new ``block`` and its decisions (:func:`_mst_cpu.merge_blocks`): the
    codes and weights of the edges it ``removed`` (tile-internal representatives dropped) and of the
    separator edges it ``kept``."""

    block: _Block
    removed: np.ndarray
    removed_weights: np.ndarray
    kept: np.ndarray
    kept_weights: np.ndarray

    @classmethod
    def of(cls, level: int, code: int, merged: tuple) -> "_Merged":
        """From the kernels' 11-tuple: the block's 7 arrays (as :class:`_Block`), then the decisions."""
        return cls(_Block(level, code, *merged[:7]), *merged[7:])


class _Merger:
    """Phase 2, streaming: merges each quadtree block as soon as its last tile is done."""

    def __init__(self, store: TerrainStore, kind: int, batched: bool = True, first: int = 0):
        """``batched``: merge a full batch's levels in one call (``merge_batch``) in the pool; else
        block by block in the merging thread like a batch cut by the DEM's edge -- the same merges
        (see :data:`terrain_io.jit.SERIAL_BELOW`). ``first``: the Morton code of the first tile this
        merger is given (a worker's run of the tiles): blocks that begin before it are left on the
        stack for the client, whose merger takes every run's stack in order (:meth:`adopt`) -- the
        same merges as one merger over all the tiles."""
        self.batched = batched
        self.first = first
        self.rows, self.cols = store.shape
        self.tile = store.tile_size
        ntr, ntc = store.tile_grid
        self.top = max(math.ceil(math.log2(ntr)) if ntr > 1 else 0, math.ceil(math.log2(ntc)) if ntc > 1 else 0)
        self.kind = kind
        self.stack: list[_Block] = []
        self.removed = _CodeLog()  # codes of tile-forest edges dropped by a merge
        self.kept = _CodeLog()  # codes of separator edges in the final forest
        self.buckets = np.zeros((2, N_EXP), dtype=np.int64)  # exact weight: - removed + kept
        self.timings = Timings(merge=0.0)  # the merges' seconds, summed over the threads that ran them
        self.merges = 0
        self._lock = threading.Lock()

    def push(self, block: _Block, next_code: int | None) -> None:
        """Add a complete block (a tile, or a whole batch) and merge every block it completes.

        ``next_code``: Morton code of the next tile in the global order (None after the last).
        """
        with self.timings.phase("merge"):
            self.stack.append(block)
            m = block.code << (2 * block.level)  # the block's first tile
            for level in range(block.level + 1, self.top + 1):
                parent = m >> (2 * level)
                if next_code is not None and next_code >> (2 * level) == parent:
                    break  # the block goes on after this one
                if parent << (2 * level) < self.first:
                    break  # the block began before this merger's run: the client's merge
                children = []
                while (self.stack and self.stack[-1].level < level
                       and self.stack[-1].code >> (2 * (level - self.stack[-1].level)) == parent):
                    children.append(self.stack.pop())
                self.stack.append(self._record(self._merge(children, level, parent)))
            if next_code is None and not self.first:  # the root: everything decided
                assert len(self.stack) == 1 and len(self.stack[0].eu) == 0, "merge did not reach the root"

    def _merge_batch(self, b: Batch, out, side: int):
        """All merges inside a full batch of ``side`` x ``side`` tiles, in one call (``merge_batch``,
        whose kernels release the GIL: batches merge in parallel threads); returns ``_record``'s input."""
        with self.timings.phase("merge"):
            levels = int(math.log2(side))
            tr, tc = morton_decode(b.codes.astype(np.uint64))
            merged = _Merged.of(levels, int(b.codes[0]) >> (2 * levels), _kernels().merge_batch(
                *out[:-1], tr.astype(np.int64), tc.astype(np.int64), levels, self.rows, self.cols, self.tile,
                self.kind))
        with self._lock:
            self.merges += len(b.codes) // 3  # (4**L - 1) / 3 merges
        return merged

    # -- running in a thread beside the tile phase (the merge kernels release the GIL) -----------
    def start(self, depth: int = 2, workers: int = 1) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(max(1, workers))
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mst-merge", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    work, next_code = item
                    if isinstance(work, concurrent.futures.Future):  # a full batch, merged in the pool
                        merged = work.result()
                        self.push(self._record(merged), next_code)
                    else:  # a batch cut by the DEM's edge: tile by tile
                        for i, block in enumerate(work):
                            self.push(block, work[i + 1].code if i + 1 < len(work) else next_code)
                except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
                    self._error = exc

    def submit(self, b: Batch, out, side: int, next_code: int | None) -> None:
        """Queue one batch's tile-phase output (``tile_phase_batch``'s; ``side``: the batch side in
        tiles) for merging; a full batch starts merging inside at once, in the pool."""
        if self._error is not None:
            raise self._error
        if self.batched and len(b.codes) == side * side and side > 1:
            work = self.pool.submit(self._merge_batch, b, out, side)
        else:
            work = _blocks(b, out)
        self._queue.put((work, next_code))

    def finish(self) -> None:
        """Wait until every queued block is merged."""
        self.stop()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.pool.shutdown()

    def _merge(self, children: list[_Block], level: int, code: int):
        """Merge sibling blocks into block ``code`` of ``level`` (thread-safe: records nothing)."""
        br, bc = morton_decode(np.uint64(code))
        span = self.tile << level
        cat = [np.concatenate([getattr(c, f) for c in children]) for f in
               ("vid", "vh", "vmask", "eu", "ev", "ew", "ecode")]
        return _Merged.of(level, code, _kernels().merge_blocks(*cat, br * span, (br + 1) * span, bc * span,
                                                               (bc + 1) * span, self.rows, self.cols, self.tile,
                                                               self.kind))

    def _record(self, merged: _Merged) -> _Block:
        """Keep a merge's decisions (one thread at a time) and return its block."""
        add_exact_many = _kernels().add_exact_many
        add_exact_many(self.buckets, merged.removed_weights, -1)
        add_exact_many(self.buckets, merged.kept_weights, 1)
        self.removed.append(merged.removed)
        self.kept.append(merged.kept)
        self.merges += 1
        return merged.block

    def adopt(self, runs: list["_RunResult"]) -> None:
        """Take the workers' runs, in the Morton order of their tiles: their exact weights, then
        their stacks' blocks, merged where a block's parent spans runs (their decisions stay with
        each run's shards, :func:`_decided_by_shard`)."""
        blocks = []
        for run in runs:
            self.buckets += run.merge_buckets
            self.merges += run.merges
            self.timings.add("merge", run.timings.get("merge", 0.0))
            blocks += run.blocks
        for i, block in enumerate(blocks):
            self.push(block, blocks[i + 1].code << (2 * blocks[i + 1].level) if i + 1 < len(blocks) else None)

    def decisions(self) -> tuple["_CodeLog", "_CodeLog"]:
        """(removed codes, kept codes); the merge stack is let go."""
        self.stack.clear()
        return self.removed, self.kept


class _CodeLog:
    """Append-only int64 codes (the merge decisions) in blocks of 1 MiB, then grouped by unit.

    Blocks at glibc's mmap threshold (:func:`terrain_io.memory.return_freed_memory_to_os`) are
    given back whole when freed: a small copy per merge left the heap fragmented, and joining the
    copies into one array held the decisions twice (measured at 4096 x 8192 under 16 MiB: +5.8 MiB).
    """

    BLOCK = 1 << 17

    def __init__(self):
        self.blocks: list[np.ndarray] = []
        self.used = 0  # codes in the last block

    def __len__(self) -> int:
        return max(0, len(self.blocks) - 1) * self.BLOCK + self.used

    def append(self, codes: np.ndarray) -> None:
        i = 0
        while i < len(codes):
            if not self.blocks or self.used == self.BLOCK:
                self.blocks.append(np.empty(self.BLOCK, np.int64))
                self.used = 0
            take = min(self.BLOCK - self.used, len(codes) - i)
            self.blocks[-1][self.used : self.used + take] = codes[i : i + take]
            self.used += take
            i += take

    def grouped(self, unit_of, n_units: int) -> tuple[np.ndarray, np.ndarray]:
        """The codes grouped by ``unit_of(codes)`` (unit ids 0 .. n_units - 1; inside a unit in the
        order appended) and where each unit starts: a counting sort into one array, a block at a time,
        each block freed once moved (at the peak the codes and one block). Within a block: a stable
        sort by unit (radix, on 16-bit unit ids), each code's place its unit's next free slot plus its
        rank in the unit -- no loop over the units (32768^2: ~2.5x less CPU than a loop a unit)."""
        counts = np.zeros(n_units, np.int64)
        last = len(self.blocks) - 1
        for bi, b in enumerate(self.blocks):
            counts += np.bincount(unit_of(b[: self.used if bi == last else self.BLOCK]), minlength=n_units)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        out = np.empty(int(starts[-1]), np.int64)
        pos = starts[:-1].copy()
        unit_type = np.uint16 if n_units <= 1 << 16 else np.int64
        while self.blocks:
            b = self.blocks.pop(0)
            c = b[: self.used if not self.blocks else self.BLOCK]
            u = unit_of(c).astype(unit_type)
            order = np.argsort(u, kind="stable")
            su = u[order]
            n = np.bincount(su, minlength=n_units)
            out[pos[su] + np.arange(len(c)) - (np.cumsum(n) - n)[su]] = c[order]
            pos += n
            del b, c
        self.used = 0
        return out, starts


def _blocks(b: Batch, out) -> list[_Block]:
    """The contracted graphs of a batch's tiles, from ``tile_phase_batch``'s output, as merge blocks."""
    nv, ne = out.nv, out.ne
    return [_Block(0, int(b.codes[ti]), out.vid[ti, :nv[ti]], out.vh[ti, :nv[ti]], out.vmask[ti, :nv[ti]],
                   out.eu[ti, :ne[ti]], out.ev[ti, :ne[ti]], out.ew[ti, :ne[ti]], out.ecode[ti, :ne[ti]])
            for ti in range(len(b.codes))]


@dataclass(frozen=True, eq=False)
class _TileTask:
    """One shard of the tile phase as a Dask task: read it, forests + contraction, write its bits."""

    store: str
    edges: str  # the temporary ``mst/edges`` array
    window: Window
    tiles: np.ndarray
    weight: str
    forest: int
    cap: int
    device: str = "cpu"  # "gpu": the worker's GPU (dask-cuda gives each worker its own)


def _tile_phase_cpu(store: TerrainStore, task: _TileTask, values, valid):
    """The tile phase of a task's batch on the CPU (numba): (edge bits, tile_phase_batch output)."""
    rows, cols = store.shape
    win = task.window
    bits = np.zeros(values.shape, dtype=np.uint8)
    K = _kernels()
    hkey, float_bits = K.key_source(values)
    out = K.tile_phase_batch(values, valid, hkey, float_bits, bits, task.tiles, win.r0, win.c0, rows, cols,
                             weight_models.get(task.weight).kind, task.cap, task.forest,
                             parallel=rows * cols >= SERIAL_BELOW)
    return bits, out


TILE_PHASE = Dispatch("the grid MST's tile phase", cpu=_tile_phase_cpu,
                      gpu="terrain_io.grid.mst._gpu:worker_tile_phase")


def _tile_task(task: _TileTask):
    """Runs on a worker; returns (valid cells, tile_phase_batch output) -- the small merge data."""
    import zarr

    store = TerrainStore.open(task.store, mode="r")
    values = store.read(task.window)
    valid = store.valid(values)
    bits, out = TILE_PHASE[task.device](store, task, values, valid)
    # a whole shard (rerunnable), encoded in the codec pool: a local-cuda worker has one thread
    write_window(zarr.open_array(task.edges, mode="r+"), task.window, bits, whole_shard=True)
    return int(np.count_nonzero(valid)), out


def _tile_phase(store: TerrainStore, edges, batches: Sequence[Batch], next_code: int | None, k: int, merger: _Merger,
                timings: Timings, *, kind: int, forest: int, cap: int, gpu=None, gpu_contract: bool = True,
                held: dict | None = None, bar=None) -> tuple[int, np.ndarray]:
    """Phase 1 over ``batches`` of ``k`` x ``k`` tiles -- all of them, or a worker's run of the Morton
    order (``next_code``: the first tile after the run; None at the end) -- as one process runs it:
    batches read ahead in threads (on the GPU, ``gpu``'s tile phase in those threads too), the bits
    written by threads (or kept in ``held`` for the expand pass), each batch's graphs handed to the
    started ``merger``. Returns (valid cells, the exact weight buckets of the tile forests)."""
    rows, cols = store.shape
    lookahead = _readers("cpu" if gpu is None else "gpu")  # batches read ahead (on the GPU: its two lanes busy too)
    whole_shards = k == store.shard_size
    buckets = np.zeros((2, N_EXP), dtype=np.int64)
    valid_cells = 0

    def prepare(b: Batch):
        """Read a batch (worker thread) and, on the GPU, run its tile phase: forests (and contraction)."""
        with timings.phase("read"):
            values = store.read(b.window)
            valid = store.valid(values)
        with timings.phase("gpu"):
            out = None
            if gpu is None:
                bits = np.zeros(values.shape, dtype=np.uint8)
            elif gpu_contract:
                bits, out = gpu.tile_phase(values, valid, b.tiles, b.window.r0, b.window.c0, rows, cols, cap)
            else:
                bits = gpu.forest(values, valid)
        return values, valid, bits, out

    writes: collections.deque = collections.deque()
    # whole shards are written in parallel; parts of a shard in order (zarr rewrites the shard)
    writers = max(2, lookahead) if whole_shards else 1
    with concurrent.futures.ThreadPoolExecutor(lookahead) as pool, \
            concurrent.futures.ThreadPoolExecutor(writers) as io_pool:
        pending = collections.deque(pool.submit(prepare, b) for b in batches[:lookahead])
        parallel = rows * cols >= SERIAL_BELOW
        K = _kernels()
        work = K.tile_work(forest, store.tile_size, parallel)  # the threads' scratch, for every batch
        for bi, b in enumerate(batches):
            with timings.phase("wait"):
                values, valid, bits, out = pending.popleft().result()
            if bi + lookahead < len(batches):
                pending.append(pool.submit(prepare, batches[bi + lookahead]))
            valid_cells += int(np.count_nonzero(valid))
            if out is None:  # CPU tile phase, or the CPU contracts the GPU's forests
                with timings.phase("tile"):
                    hkey, float_bits = K.key_source(values)
                    out = K.tile_phase_batch(values, valid, hkey, float_bits, bits, b.tiles, b.window.r0, b.window.c0,
                                             rows, cols, kind, cap, forest, parallel, work)
            buckets += out.buckets
            with timings.phase("write"):
                if held is not None:  # written once, by the expand pass
                    held[b.window.r0, b.window.c0] = bits
                else:
                    while len(writes) > writers:
                        writes.popleft().result()
                    writes.append(io_pool.submit(write_window, edges, b.window, bits, whole_shards))
            merger.submit(b, out, k, int(batches[bi + 1].codes[0]) if bi + 1 < len(batches) else next_code)
            if bar is not None:
                bar.update(len(b.codes))
        for f in writes:
            f.result()
    return valid_cells, buckets


@dataclass(frozen=True)
class _RunTask:
    """A worker's run of the tile phase (the multi-GPU route): batches ``start`` .. ``stop`` - 1 of
    the Morton order, through :func:`_tile_phase` on the worker's device, merged as far as the run
    completes quadtree blocks."""

    store: str
    edges: str  # the temporary ``mst/edges`` array
    k: int  # the batch side in tiles
    start: int
    stop: int
    weight: str
    forest: int
    cap: int
    device: str
    batched: bool
    gpu_contract: bool = True


class _RunResult(NamedTuple):
    """What a run sends back (:func:`_run_task`): counts, exact weights, the merge decisions (O(N/T)
    codes, grouped by shard there) and the blocks its merges could not complete -- no per-tile graphs."""

    valid_cells: int
    tile_buckets: np.ndarray
    merge_buckets: np.ndarray
    blocks: list
    decided: list  # (removed, kept) codes of each shard of the run, in its order
    merges: int
    timings: dict


def _run_task(task: _RunTask) -> _RunResult:
    """Runs on a worker: its run of the tile phase, bits written to the store, merged in its process."""
    import zarr

    store = TerrainStore.open(task.store, mode="r")
    kind = weight_models.get(task.weight).kind
    batches = plan_batches(store, task.k)
    next_code = int(batches[task.stop].codes[0]) if task.stop < len(batches) else None
    batches = batches[task.start : task.stop]
    gpu, forest = None, task.forest
    if task.device == "gpu":
        from ._gpu import worker_tile_forest

        gpu, forest = worker_tile_forest(store.tile_size, task.weight, store.dtype.str, lanes=2), FOREST_GIVEN
    timings = Timings(read=0.0, gpu=0.0, wait=0.0, tile=0.0, write=0.0)
    merger = _Merger(store, kind, task.batched, first=int(batches[0].codes[0]))
    merger.start(workers=os.cpu_count() or 1)
    try:
        with timings.phase("run"):
            valid, buckets = _tile_phase(store, zarr.open_array(task.edges, mode="r+"), batches, next_code, task.k,
                                         merger, timings, kind=kind, forest=forest, cap=task.cap, gpu=gpu,
                                         gpu_contract=task.gpu_contract)
            with timings.phase("merge_wait"):
                merger.finish()
    finally:
        merger.stop()
    timings["merge"] = merger.timings["merge"]
    if gpu is not None:  # (the worker's kernel is kept for its later runs: its totals so far)
        timings["gpu_kernel"], timings["gpu_contract"] = gpu.kernel_seconds, gpu.contract_seconds
    blocks = list(merger.stack)
    with timings.phase("group"):
        decided = _decided_by_shard(store, *merger.decisions(), [b.window for b in batches])
    return _RunResult(valid, buckets, merger.buckets, blocks, decided, merger.merges, dict(timings))


def _readers(device: str) -> int:
    """Threads reading (and decoding) batches ahead of the tile phase: half the cores, at least the
    GPU's two lanes, at most 8."""
    return max(2 if device == "gpu" else 1, min(8, (os.cpu_count() or 1) // 2))


def _plan_bytes(store: TerrainStore, device: str, sorts_edges: bool, k: int) -> int:
    """Host memory of the tile phase with batches of k x k tiles.

    Held at once: the merge data, O(N/T) (decisions, ~ 1.5 codes per tile side cell); per worker
    thread one tile's Kruskal and contraction arrays (40 or 140 bytes per cell); the
    batches in flight (values, masks, bits: one per reader thread, the one in the tile phase, on
    the GPU one more) and the current batch's temporaries.
    """
    t = store.tile_size
    ntr, ntc = store.tile_grid
    import numba  # (here: the GPU's in-core route imports no numba)

    threads = numba.get_num_threads() if device == "cpu" else numba.get_num_threads() // 2 + 1
    per_tile_cell = 140 if sorts_edges else 40  # Kruskal's keys, union-find, contraction arrays
    fixed = ntr * ntc * 4 * t * 12 + threads * per_tile_cell * t * t
    in_flight = _readers(device) + (2 if device == "gpu" else 1)
    per_cell = in_flight * (store.dtype.itemsize + 2) + 16  # + bits, order keys, temporaries
    return fixed + per_cell * (k * t) ** 2


def _batch_tiles(store: TerrainStore, budget: int, device: str, sorts_edges: bool) -> int:
    """The largest power-of-two batch side (in tiles, at most the shard) that fits ``budget``."""
    return plan(store, budget, "the MST", lambda k: _plan_bytes(store, device, sorts_edges, k)).side


def _holds_bits(store: TerrainStore, budget: int, device: str, sorts_edges: bool, k: int) -> bool:
    """Whether the tile phase keeps every shard's bits in memory for the expand pass (a byte a
    cell beside its plan), so that ``mst/edges`` is encoded and written once and never read back."""
    rows, cols = store.shape
    return k == store.shard_size and _plan_bytes(store, device, sorts_edges, k) + rows * cols <= budget


def _expand_by_shards(store: TerrainStore, k: int, budget: int, workers: int) -> bool:
    """Whether the expand pass takes whole shards: the tile phase did, or one shard's bits (and their
    new encoding) per thread fit half the budget."""
    span = store.shard_size * store.tile_size
    shard_cells = min(span, store.shape[0]) * min(span, store.shape[1])
    return k == store.shard_size or workers * 2 * shard_cells <= budget // 2


def _decided_by_unit(removed: "_CodeLog", kept: "_CodeLog", shape: tuple[int, int], span: int,
                     windows: list[Window]) -> list:
    """The decisions grouped by unit, the DEM cut in ``span`` x ``span`` cells (a shard, or a batch;
    the logs emptied): (removed, kept) codes of each unit in ``windows``; a code belongs to the unit
    of its cell (the edge's smaller end)."""
    rows, cols = shape
    across = -(-cols // span)

    def unit_of(codes):
        """The unit (row-major) of each code's cell."""
        lo = codes >> 2
        return (lo // cols // span) * across + lo % cols // span

    n_units = -(-rows // span) * across
    rem, rem_starts = removed.grouped(unit_of, n_units)
    kep, kept_starts = kept.grouped(unit_of, n_units)
    keys = [w.r0 // span * across + w.c0 // span for w in windows]
    return [(rem[rem_starts[u] : rem_starts[u + 1]], kep[kept_starts[u] : kept_starts[u + 1]]) for u in keys]


def _decided_by_shard(store: TerrainStore, removed: "_CodeLog", kept: "_CodeLog", windows: list[Window]) -> list:
    """:func:`_decided_by_unit` with the store's shards as the units."""
    return _decided_by_unit(removed, kept, store.shape, store.shard_size * store.tile_size, windows)


def _expand_unit(edges, win: Window, cols: int, removed: np.ndarray, kept: np.ndarray, whole_shard: bool,
                 bits: np.ndarray | None = None) -> int:
    """One unit of phase 3: its decisions applied to its bits (``bits``: held by the tile phase, not
    written yet; else read from ``edges``), written back, its edges counted. Clearing and setting
    bits: run twice (a task run again), the same bytes."""
    held = bits is not None
    if bits is None:
        bits = read_window(edges, win, whole_shard)
    if held or len(removed) or len(kept):
        _kernels().apply_decisions(bits, win.r0, win.c0, cols, removed, kept)
        write_window(edges, win, bits, whole_shard)
    return int(_kernels().count_edges(bits))


@dataclass(frozen=True, eq=False)
class _ExpandTask:
    """A worker's share of phase 3 (the multi-GPU route): the shards of its run, each with its decisions."""

    edges: str  # the temporary ``mst/edges`` array
    cols: int
    windows: list
    removed: list  # per window, its codes
    kept: list
    threads: int


def _expand_task(task: _ExpandTask) -> int:
    """Runs on a worker: its shards expanded in ``task.threads`` threads; returns their edge count."""
    import zarr

    edges = zarr.open_array(task.edges, mode="r+")
    with concurrent.futures.ThreadPoolExecutor(task.threads) as ex:
        return sum(ex.map(lambda i: _expand_unit(edges, task.windows[i], task.cols, task.removed[i], task.kept[i],
                                                 True), range(len(task.windows))))


def _expand(store: TerrainStore, edges, batches: Sequence[Batch], k: int, budget: int, decided: list,
            progress: bool, held: dict | None = None, runs: list | None = None, scheduler: str | None = None,
            announce=None) -> int:
    """Phase 3: apply the merge decisions (``decided``: [removed, kept] code logs, emptied here) to
    ``mst/edges``, each shard read and written once, shards in
    parallel threads (decoding and encoding release the GIL); returns the edge count. ``held``: the
    tile phase's bits of every shard by its first cell (not written yet): each is written once here.
    ``runs``: on ``scheduler``'s workers, the tile phase's runs (:class:`_RunResult`, batches
    ``start``..``stop`` - 1: whole shards): each worker expands its run's shards with their
    decisions, its own merges' and the client's (``decided``).

    The unit is the shard when the bits of one shard per thread fit ``budget`` (always when the
    tile phase ran whole shards), else the tile phase's batches, one after another (zarr rewrites
    the whole shard on a partial write).
    """
    rows, cols = store.shape
    span_shard = store.shard_size * store.tile_size
    # Whole-shard writes are fastest at 4 threads, slower with more (benchmarks/RESULTS.md, "Issue #16: the tile
    # Kruskal of the max model", its writer-threads table); decoding, deciding, counting are cheaper. As many
    # as the budget holds beside the decisions (int64 codes): a shard's bits, their chunks encoded and the
    # shard file joined, ~8 bytes a cell a thread (benchmarks/RESULTS.md, "Measurements behind decisions in
    # the code").
    workers = max(1, min(4, os.cpu_count() or 1))
    shard_cells = min(span_shard, rows) * min(span_shard, cols)
    decisions = 8 * sum(len(c) for c in decided)
    workers = int(max(1, min(workers, (budget - decisions) // (8 * shard_cells))))
    if runs is not None:
        windows = list(store.shards())  # the Morton order of the batches
        mine = _decided_by_shard(store, *decided, windows)
        tasks = []
        for (start, stop, theirs) in runs:
            both = [tuple(map(np.concatenate, zip(t, m))) for t, m in zip(theirs, mine[start:stop])]
            tasks.append(_ExpandTask(f"{edges.store.root}/{edges.path}", cols, windows[start:stop],
                                     [r for r, _ in both], [kp for _, kp in both], workers))
        with progress_bar(progress, len(tasks), "expand", unit="run") as bar:
            return sum(map_shards(_expand_task, tasks, scheduler, progress=bar, announce=announce))
    if held is not None or _expand_by_shards(store, k, budget, workers):
        span = span_shard
        units = list(store.shards())
    else:
        span, workers = k * store.tile_size, 1
        units = [b.window for b in batches]

    removed_log, kept_log = decided.pop(0), decided.pop(0)
    units = list(zip(units, _decided_by_unit(removed_log, kept_log, store.shape, span, units)))

    def expand(unit) -> int:
        win, (removed, kept) = unit
        bits = held.pop((win.r0, win.c0)) if held is not None else None
        return _expand_unit(edges, win, cols, removed, kept, span == span_shard, bits)

    n_edges = 0
    with progress_bar(progress, len(units), "expand", unit="shard" if span == span_shard else "batch") as bar, \
            concurrent.futures.ThreadPoolExecutor(workers) as ex:
        for count in ex.map(expand, units):
            n_edges += count
            bar.update(1)
    return n_edges


# A DEM below this many cells (and within the budget at IN_MEMORY_BYTES a cell) gets its forest in memory
# on the CPU: one Kruskal (``_cpu.grid_forest``) instead of the tile and merge phases, the same forest.
# Its first run compiles one small kernel (~0.5 s of CPU) instead of ~8 s of them; warm, numpy's sort
# makes it 2-3x slower than the tiled serial route, at most ~0.1 s below this size
# (benchmarks/RESULTS.md, "First run: issue 27, session 15").
IN_MEMORY_BELOW = 1 << 18
IN_MEMORY_BYTES = 160


def _in_memory(store: TerrainStore, budget: int) -> bool:
    rows, cols = store.shape
    return rows * cols < IN_MEMORY_BELOW and IN_MEMORY_BYTES * rows * cols <= budget


METHODS = ("auto", "incore", "tiled")


def _gpu_incore_misfit(store: TerrainStore, model, budget: int, gpu_free: float) -> str | None:
    """Why the in-core GPU MST cannot take ``store`` (None: it can): more cells than the 32-bit edge
    codes number, more GPU memory than ``gpu_free`` (bytes), or host buffers over ``budget``."""
    from ._gpu import GpuGridForest

    rows, cols = store.shape
    if rows * cols > GpuGridForest.MAX_CELLS:
        return f"{rows * cols:,} cells, more than the {GpuGridForest.MAX_CELLS:,} its 32-bit edge codes number"
    need = GpuGridForest.device_bytes(rows * cols, model, store.dtype)
    if need > gpu_free:
        return f"it needs {format_bytes(need)} of GPU memory, {format_bytes(gpu_free)} free"
    host = _incore_host_bytes(store)
    if host > budget:
        return f"its shards and bands need {format_bytes(host)} of host memory, more than the budget {format_bytes(budget)}"
    return None


def _incore_host_bytes(store: TerrainStore) -> int:
    """Host memory of the in-core GPU route: the shards its reader threads hold (two a thread) or the
    written bands' buffers (:func:`~terrain_io.pinned.host_bytes`), whichever is more."""
    from ..flow.upload import threads

    rows, cols = store.shape
    span = store.tile_size * store.shard_size
    shard = min(span, rows) * min(span, cols) * store.dtype.itemsize
    return max(host_bytes(store, [1]), threads(store) * 2 * shard)


def choose_method(store: TerrainStore, model, method: str, device: str, budget: int, scheduler: str,
                  batch_tiles: int | None, gpu_free=gpu_free_bytes) -> str:
    """``incore`` or ``tiled`` for :func:`mst` (``device`` resolved: cpu or gpu). ``auto``: in core on
    the GPU wherever it fits (:func:`_gpu_incore_misfit`, ``gpu_free()`` bytes free), on the CPU below
    :data:`IN_MEMORY_BELOW` cells (:func:`_in_memory`); tiled with a scheduler or a forced batch. An
    ``incore`` that cannot be is an error naming why."""
    if method not in METHODS:
        raise InputError(f"unknown MST method {method!r}: use one of {', '.join(METHODS)}")
    if method == "tiled":
        return "tiled"
    rows, cols = store.shape
    if scheduler != "local" or batch_tiles is not None:
        why = "a scheduler runs the tiled pipeline" if scheduler != "local" else "a batch size is the tiled pipeline's"
    elif device == "gpu":
        why = _gpu_incore_misfit(store, model, budget, gpu_free())
    elif method == "auto":
        why = None if _in_memory(store, budget) else "large"
    else:
        need = IN_MEMORY_BYTES * rows * cols
        why = (None if need <= budget else
               f"it needs {format_bytes(need)} of memory, more than the budget {format_bytes(budget)}")
    if why is None:
        return "incore"
    if method == "incore":
        raise InputError(f"mst --method incore: {why} (use --method tiled or auto)")
    return "tiled"


def _mst_in_memory(store: TerrainStore, model, timings: Timings) -> MSTResult:
    """:func:`mst` in memory on the CPU (by default below :data:`IN_MEMORY_BELOW` cells): read whole, one
    Kruskal, the bits written shard by shard (:func:`~terrain_io.pinned.write_held`); the result as the
    tiled pipeline gives it."""
    rows, cols = store.shape
    with timings.phase("read"):
        values = store.read(Window(0, rows, 0, cols))
        valid = store.valid(values)
    with timings.phase("tile"):
        bits, n_edges, buckets = _kernels().grid_forest(values, valid, model.kind)
    valid_cells = int(np.count_nonzero(valid))
    return _write_whole(store, model, "cpu", bits, lambda: (n_edges, buckets, valid_cells), timings)


def _mst_gpu_incore(store: TerrainStore, model, timings: Timings) -> MSTResult:
    """:func:`mst` in GPU memory: the elevations read onto the GPU (:func:`~terrain_io.grid.flow.upload.upload_held`:
    decoded there where nvCOMP is installed, else shards in threads), one Boruvka over the whole grid graph there
    (:class:`._gpu.GpuGridForest`), the bits written from the GPU (:func:`~terrain_io.pinned.write_held`:
    through pinned bands, compressed there where nvCOMP is installed)."""
    from ..flow.upload import upload_held
    from ._gpu import GpuGridForest

    gpu = GpuGridForest(model, store.dtype)
    with timings.phase("read"):
        d_vals, _ = upload_held(store, "elevation", None, timings=timings)
    with timings.phase("gpu"):  # (the vertices are found there: store.valid's cells)
        bits, totals = gpu.forest(d_vals, store.nodata)  # (totals summed on the GPU while the bits are written)
        del d_vals
    timings["gpu_kernel"], timings["gpu_rounds"] = gpu.kernel_seconds, gpu.rounds
    return _write_whole(store, model, "gpu", bits, totals, timings)


def _write_whole(store: TerrainStore, model, device: str, bits, totals, timings: Timings) -> MSTResult:
    """Write an in-core forest's ``bits`` (the whole DEM's, NumPy or CuPy) as ``mst/edges`` with the
    result's attributes, as the tiled pipeline writes them (no batches, no merge decisions); ``totals()``:
    the forest's (edge count, exact weight buckets, vertex count), asked for once the bits are written."""
    rows, cols = store.shape
    with store.write_result(RESULT, attrs={"weight_model": model.name}) as writer:
        edges = writer.create_array("edges", "uint8", 0)
        with timings.phase("write"):  # (on the GPU: bands a call of nvCOMP's encoder within the route's host bytes)
            per_call = frame_plan(store, [1], _incore_host_bytes(store)) if device == "gpu" else 1
            write_held(store, (edges, bits), timings=timings, bands_per_call=per_call)
        with timings.phase("totals_wait"):
            n_edges, buckets, valid_cells = totals()
        exact = exact_total(buckets)
        result = MSTResult(weight=model.name, device=device, cells=rows * cols, valid_cells=valid_cells,
                           edges=n_edges, trees=valid_cells - n_edges, total_weight=float(exact),
                           total_weight_exact=str(exact), seconds=timings.seconds(), timings=timings.rounded(4),
                           tile_size=store.tile_size, batch_tiles=0, merge_decisions=0)
        writer.attrs.update(result.attrs())
    return result


def mst(store, *, weight: str = "max", device: str = "auto", memory=None, progress: bool = True,
        batch_tiles: int | None = None, scheduler: str | None = "local", announce=None,
        gpu_contract: bool = True, method: str = "auto") -> MSTResult:
    """Minimum spanning forest of the DEM in ``store``; writes ``mst/edges``.

    Parameters
    ----------
    store : TerrainStore or path
        The DEM store.
    weight : {"max", "absdiff"}
        The edge-weight model (terrain_io.weights): max(h_i, h_j) or |h_i - h_j|.
    device : {"auto", "cpu", "gpu"}
    memory : str or int, optional
        The budget, such as ``"2GB"`` (default: half the free RAM).
    progress : bool
        Show progress bars.
    batch_tiles : int, optional
        Force the batch side in tiles (a power of two <= the shard size); the tiled pipeline then
        runs on a small DEM too.
    scheduler : str
        Where the batches run (terrain_io.parallel): ``local``, Dask ``threads``/``processes`` or a
        scheduler address.
    announce : callable, optional
        Gets one-line notes (a Dask dashboard's address).
    gpu_contract : bool
        On the GPU, contract the tile forests there too (default; False: the numba contraction on
        the CPU -- for benchmarks and tests, same result).
    method : {"auto", "incore", "tiled"}
        ``incore``: the whole DEM in memory (GPU memory on the GPU: one Boruvka over the whole grid);
        ``tiled``: the out-of-core pipeline; ``auto`` (default): in core where it fits (on the GPU: up
        to 2**30 cells within its free memory; on the CPU: a small DEM), else tiled (:func:`choose_method`).

    Returns
    -------
    MSTResult
        Edges, trees and total weight (exact as a fraction too) of the forest, and phase times. The
        store holds ``mst/edges``: a uint8 bitmask per cell (bit k: the edge to the neighbour in
        direction k = 0 E, 1 SE, 2 S, 3 SW); nodata cells are not vertices.

    Examples
    --------
    >>> import tempfile
    >>> from terrain_io.store import TerrainStore
    >>> st = TerrainStore.from_array(tempfile.mkdtemp() + "/dem.zarr", np.arange(16.0).reshape(4, 4))
    >>> res = mst(st, progress=False)
    >>> res.edges, res.trees
    (15, 1)
    """
    timings = Timings(read=0.0, gpu=0.0, wait=0.0, tile=0.0, write=0.0)
    return_freed_memory_to_os()
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    store.require_finite()
    model = weight_models.get(weight)
    if model.kind not in (weight_models.MAX, weight_models.ABSDIFF):
        raise InputError(f"weight model {model.name!r} is not an MST model: use max or absdiff")
    device = resolve_device(device)
    budget = memory_budget(memory)
    forest = FOREST_CELLS if model.kind == weight_models.MAX and cells_sortable(store.dtype) else FOREST_EDGES
    scheduler = check_scheduler(scheduler)
    if choose_method(store, model, method, device, budget, scheduler, batch_tiles) == "incore":
        return (_mst_gpu_incore if device == "gpu" else _mst_in_memory)(store, model, timings)
    k = batch_tiles or _batch_tiles(store, budget, device, forest == FOREST_EDGES)
    if scheduler != "local" and k != store.shard_size:
        raise InputError(f"with --scheduler every task is a whole shard, which needs more than the memory budget "
                         f"{format_bytes(budget)} (raise --memory)")
    check_side(store, k)
    batches = plan_batches(store, k)
    rows, cols = store.shape
    held = {} if scheduler == "local" and _holds_bits(store, budget, device, forest == FOREST_EDGES, k) else None
    cap = 8 * store.tile_size + 8
    merger = _Merger(store, model.kind, batched=rows * cols >= SERIAL_BELOW)
    buckets = np.zeros((2, N_EXP), dtype=np.int64)
    valid_cells = 0
    runs = None  # on a cluster: each worker's run of batches, (start, stop[, its decisions by shard])
    on_workers = 0  # the decisions the workers' merges made
    gpu = None  # the GPU tile kernel, when device == 'gpu' (on Dask: the workers' GPUs)
    if device == "gpu" and scheduler == "local":
        forest = FOREST_GIVEN
        from ._gpu import GpuTileForest

        gpu = GpuTileForest(store.tile_size, model, store.dtype)

    with store.write_result(RESULT, attrs={"weight_model": model.name}) as writer:
        edges = writer.create_array("edges", "uint8", 0)
        if scheduler in ("threads", "processes"):  # Dask's local schedulers: a task a shard, merges here
            tasks = [_TileTask(str(store.path), f"{edges.store.root}/{edges.path}", b.window, b.tiles, model.name,
                               forest, cap, device) for b in batches]
            with contextlib.ExitStack() as cleanup:
                merger.start(workers=os.cpu_count() or 1)
                cleanup.callback(merger.stop)
                with timings.phase("tile_phase"):
                    bar = cleanup.enter_context(progress_bar(progress, len(batches), "tile phase", unit="shard"))
                    # results streamed in order: the client's merges run while the workers compute
                    outs = imap_shards(_tile_task, tasks, scheduler, progress=bar, announce=announce)
                    with timings.phase("tile"):
                        for bi, (b, (n_valid, out)) in enumerate(zip(batches, outs)):
                            valid_cells += n_valid
                            buckets += out.buckets
                            merger.submit(b, out, k, int(batches[bi + 1].codes[0]) if bi + 1 < len(batches) else None)
                with timings.phase("merge_wait"):
                    merger.finish()
        elif scheduler != "local":  # a cluster (local-cuda, an address): each worker runs this pipeline on a run
            with timings.phase("tile_phase"):
                cuts = np.linspace(0, len(batches), min(len(batches), scheduler_workers(scheduler, announce)) + 1)
                cuts = cuts.round().astype(int).tolist()
                runs = list(zip(cuts, cuts[1:]))
                tasks = [_RunTask(str(store.path), f"{edges.store.root}/{edges.path}", k, a, b, model.name, forest,
                                  cap, device, merger.batched, gpu_contract) for a, b in runs]
                with progress_bar(progress, len(tasks), "tile phase", unit="run") as bar:
                    done = map_shards(_run_task, tasks, scheduler, progress=bar, announce=announce)
            with timings.phase("merge_top"):  # the merges of blocks that span runs, on the client
                merger.adopt(done)
            runs = [(a, b, run.decided) for (a, b), run in zip(runs, done)]
            on_workers = sum(len(r) + len(kp) for *_, decided in runs for r, kp in decided)
            for run in done:
                valid_cells += run.valid_cells
                buckets += run.tile_buckets
                for name, seconds in run.timings.items():
                    if name != "merge":
                        timings.add(name, seconds)
            del done
        else:
            with contextlib.ExitStack() as cleanup:
                merger.start(workers=os.cpu_count() or 1)
                cleanup.callback(merger.stop)
                with timings.phase("tile_phase"):
                    bar = cleanup.enter_context(progress_bar(progress, sum(len(b.codes) for b in batches),
                                                             "tile phase"))
                    valid_cells, tile_buckets = _tile_phase(
                        store, edges, batches, None, k, merger, timings, kind=model.kind, forest=forest, cap=cap,
                        gpu=gpu, gpu_contract=gpu_contract, held=held, bar=bar)
                    buckets += tile_buckets
                with timings.phase("merge_wait"):
                    merger.finish()
        timings["merge"] = merger.timings["merge"]
        if gpu is not None:
            timings["gpu_kernel"] = gpu.kernel_seconds
            timings["gpu_contract"] = gpu.contract_seconds
            timings["gpu_rounds"] = gpu.rounds

        # expand
        with timings.phase("expand"):
            rem_c, kept_c = merger.decisions()
            buckets += merger.buckets
            decisions = len(rem_c) + len(kept_c) + on_workers
            decided = [rem_c, kept_c]
            del rem_c, kept_c  # (_expand empties each as it groups it)
            n_edges = _expand(store, edges, batches, k, budget, decided, progress, held, runs, scheduler, announce)
        exact = exact_total(buckets)
        seconds = timings.seconds()
        timings = timings.rounded(4)
        result = MSTResult(weight=model.name, device=device, cells=rows * cols, valid_cells=valid_cells,
                           edges=n_edges, trees=valid_cells - n_edges, total_weight=float(exact),
                           total_weight_exact=str(exact), seconds=seconds, timings=timings,
                           tile_size=store.tile_size, batch_tiles=k, merge_decisions=decisions)
        writer.attrs.update(result.attrs())
    return result


def read_edges(store) -> np.ndarray:
    """The ``mst/edges`` bitmask of ``store`` as one in-memory array (small stores, tests)."""
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    return np.asarray(store.group[f"{RESULT}/edges"][...])


def edge_list(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u, v) cell ids, u < v, of the edges in an ``mst/edges`` bitmask."""
    rows, cols = bits.shape
    us, vs = [], []
    for d in range(4):
        r, c = np.nonzero(bits & (1 << d))
        us.append(r * cols + c)
        vs.append((r + DR[d]) * cols + c + DC[d])
    return np.concatenate(us).astype(np.int64), np.concatenate(vs).astype(np.int64)
