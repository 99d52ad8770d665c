"""Depression filling of a DEM from its minimax structure, out of core (``terrain fill``).

Definition (docs/ARCHITECTURE.md#depression-filling): an outside vertex O joins every
valid cell on the DEM's edge or (``outlets="edge+nodata"``, the default) next to a nodata cell,
with weight h(cell); cell edges weigh max(h_i, h_j). The fill level F(v) is the largest weight on
v's path to O in the minimum spanning forest -- the least, over paths to O, of the highest
elevation on the path: exactly Priority-Flood without epsilon (Barnes, Lehman & Mulla 2014).
Cells with no path to O (islands walled by nodata under ``outlets="edge"``) keep F = h.

The pipeline is Barnes' "Parallel Priority-Flood" (2016, arXiv 1606.06204) in minimax terms,
three numbered phases over tiles in Morton order (kernels and proof in :mod:`._cpu`):

1. Tile phase -- each tile flooded alone from its perimeter (Priority-Flood+), which gives every
   cell its in-tile level ``fl`` and the perimeter cell (or inner outlet) it drains through; the
   tile hands up the minimum spanning forest of its drainage labels' graph: O(T) edges between
   perimeter cells that keep their in-tile minimax distances, plus its cross-tile edges.
2. Boundary solve (CPU) -- G(b), the fill level of every perimeter cell b (its minimax distance
   to O) over those O(N/T) edges, without holding them: contracted up a quadtree of tile blocks
   as the batches come, solved at the root, and again block by block on the way down, each
   batch's levels handed to phase 3 (:mod:`._levels`; held: one block, one Kruskal).
3. Final phase -- each tile again: F = max(fl, G(label)), exact; F, depth F - h and the tile's
   lakes (8-connected F > h) are written; lakes are joined across tile edges through the
   perimeter and numbered 1, 2, ... by their least cell id (row-major), then renumbered in place.

When the whole DEM and its floods fit the memory budget, phase 1's floods are held for phase 3
(one read, one write); otherwise phase 3 floods each tile again and the store is read twice and
the lake raster rewritten once -- the same bytes either way, for every tile size and budget.
The quadtree's waiting edges and levels (O(the DEM's side)) and the tile scratch of as many threads
as the budget holds are counted in the plan (:func:`_plan`, :mod:`.tiling`); the lakes
(O(depressions): the table and the join's state) are counted against the rest of the budget as
phase 3 finds them (:class:`_Lakes`), and a budget they outgrow is refused before the join.

On the GPU (``device="gpu"``, or ``auto`` where CuPy sees a GPU) the fill is in core
(:mod:`._gpu`, kernels in ``kernels/fill.cu``): the whole DEM is held on the GPU, read and
written a band of shard rows at a time (host memory: two bands, within ``memory``); F is the
fixpoint of F(v) = max(h(v), min over valid neighbours u of F(u)) from F = h at the outlets and
+inf elsewhere, relaxed tile by tile in shared memory over a work list of active tiles; the
lakes are the components of a union-find and the table is summed by atomics. min and max never
round, so F -- and the depths, ids and table -- are the CPU's bytes (volumes: double-double sums
in another order, equal but for a rounding tie, as across tilings); the lakes' cell ids are
uint32 up to 2^32 cells (65536^2) and uint64 beyond. A DEM the GPU cannot hold (more GPU memory
than is free: about 13 bytes a float32 cell, 54 GiB at 65536^2; 64-bit integers) or whose bands
exceed the budget is filled by the CPU pipeline below: silently under ``auto``, with a one-line
note under ``gpu``.

Depression table, one row per lake: its id, pit cell (the lowest, then least id), spill cell
(the least cell id among the cells next to the lake at its level: where it overflows), spill
elevation (= the lake level), ``spills_to`` (the lake holding the spill cell's neighbour of least
(level, cell id) among its neighbours in other lakes; 0: onto dry land or out of the DEM), area
(cells and m^2), volume (sum of depths x cell area; double-double sums, so equal across
tilings to the last bit but for a rounding tie), maximum depth.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np

from ...atomic import scratch_directory
from ...backend import Dispatch, gpu_free_bytes, resolve_device
from ...errors import InputError, TerrainNote
from ...jit import SERIAL_BELOW
from ...memory import format_bytes, memory_budget, return_freed_memory_to_os
from ...parallel import check_scheduler, imap_shards, run_on_worker
from ...pinned import PinnedBands, read_device, write_bands, write_held
from ...progress import progress_bar
from ...store import ELEVATION, TerrainStore, Window, read_window, write_window
from ...tables import Table, cell_columns, row_ids, write_csv
from ...timings import Timings
from . import _cpu as K
from ._tiled import (
    OUTLETS,
    TABLE_IN_ATTRS,
    Geometry,
    read_block,
)
from ._levels import LEVEL_BYTES, LevelTree, LocalLevels
from ..tiling import Batch, Plan, check_side, plan, plan_batches, whole_side

RESULT = "fill"
OUTPUTS = ("elevation", "depth", "depression")  # the result's arrays, written unless ``outputs`` leaves one out
TABLE_COLUMNS = ("id", "pit_row", "pit_col", "pit_x", "pit_y", "pit_elevation", "spill_row", "spill_col",
                 "spill_x", "spill_y", "spill_elevation", "spills_to", "cells", "area", "volume", "max_depth")


@dataclass
class Depressions:
    """The depression table: one entry per lake, in id order (id = index + 1)."""

    least: np.ndarray  # least cell id
    cells: np.ndarray
    pit: np.ndarray  # cell id
    spill: np.ndarray  # cell id
    level: np.ndarray  # spill elevation = lake level
    volume_cells: np.ndarray  # sum of depths (elevation units x cells)
    max_depth: np.ndarray
    pit_elevation: np.ndarray
    spills_to: np.ndarray

    def __len__(self) -> int:
        return len(self.least)

    def rows(self, store: TerrainStore) -> Table:
        """The table's columns (TABLE_COLUMNS), with map coordinates and areas of ``store``: all but
        the held ones derived a block of rows at a time where used (16 columns of 8 bytes built whole
        would double the table)."""
        dx, dy = store.metric_cell_size  # m^2 and m^3, also for a geographic CRS
        return Table(len(self), {
            "id": row_ids, **cell_columns(store, self.pit, "pit"), "pit_elevation": self.pit_elevation,
            **cell_columns(store, self.spill, "spill"), "spill_elevation": self.level, "spills_to": self.spills_to,
            "cells": self.cells, "area": lambda s: self.cells[s] * (dx * dy),
            "volume": lambda s: self.volume_cells[s] * (dx * dy), "max_depth": self.max_depth})


@dataclass
class FillResult:
    """What ``fill`` computed; the same numbers are the attributes of the ``fill`` result group."""

    outlets: str
    device: str
    method: str  # "held" (floods kept in memory), "tiled" (re-flooded out of core) or "incore" (GPU)
    cells: int
    depressions: int
    filled_cells: int
    volume: float  # m^3 (metres of the metric cell size x elevation units)
    seconds: float
    timings: dict = field(default_factory=dict)
    tile_size: int = 0
    batch_tiles: int = 0
    table: Depressions | None = None

    def summary(self) -> str:
        return (f"fill: {self.cells:,} cells, {self.depressions:,} depression{'s' if self.depressions != 1 else ''} "
                f"({self.filled_cells:,} cells raised), filled volume {self.volume:.6g} m^3, outlets {self.outlets}, "
                f"{self.seconds:.2f} s, {self.cells / max(self.seconds, 1e-9) / 1e6:.1f} Mcells/s "
                f"({self.device}, {self.method})")

    def attrs(self) -> dict:
        return {"outlets": self.outlets, "device": self.device, "method": self.method, "cells": self.cells,
                "depressions": self.depressions, "filled_cells": self.filled_cells, "volume": self.volume,
                "seconds": self.seconds, "timings": self.timings, "tile_size": self.tile_size,
                "batch_tiles": self.batch_tiles,
                "depression_ids": "1, 2, ... in order of each depression's least cell id (row-major); 0: none"}


@dataclass
class _Task:
    """One batch of the tiled plan, run here or as a Dask task (the store and arrays by path)."""

    store: str
    window: Window
    tiles: np.ndarray
    nodata_drains: bool
    arrays: tuple[str | None, ...] = ()  # phase 3: the result arrays (elevation, depth or None, depression)
    levels: tuple | None = None  # phase 3: (nodes, G) of the batch (:meth:`._levels.LevelTree.batch_levels`)
    whole_shard: bool = False  # the batch is a whole shard (else part of one, written in order)


def _tile_phase_task(task: _Task):
    """Phase 1 of a batch: its tiles flooded, their boundary-graph edges (compact)."""
    store = TerrainStore.open(task.store, mode="r")
    rows, cols = store.shape
    vals, ok, outl = read_block(store, task.window, task.nodata_drains)
    graph_batch = _kernel("graph_batch", rows * cols)
    out = graph_batch(vals, ok, outl, task.tiles, *Geometry(rows, cols, store.tile_size).args(task.window),
                      np.empty((1, 1), store.dtype), np.empty((1, 1), K.LABEL), False)
    return _edges(out, len(task.tiles), _weight_dtype(store.dtype))


def _final_phase_task(task: _Task):
    """Phase 3 of a batch: its tiles flooded again, F, depth and tile-local lakes written (whole
    shards, or parts of one in order: rerunnable); returns (the lakes' statistics, lake cells)."""
    import zarr

    store = TerrainStore.open(task.store, mode="r")
    rows, cols = store.shape
    vals, ok, outl = read_block(store, task.window, task.nodata_drains)
    shape = task.window.shape
    fl, lab = np.empty(shape, store.dtype), np.empty(shape, K.LABEL)
    depth, dep = np.empty(shape, np.float32), np.empty(shape, np.uint32)
    geo = Geometry(rows, cols, store.tile_size)
    levels = LocalLevels(geo, task.window, *task.levels)
    final_batch = _kernel("final_batch", rows * cols)
    out = final_batch(vals, ok, outl, task.tiles, *_local_args(geo, task.window, levels), levels.G, fl, lab, False,
                      fl, depth, dep)
    for path, block in zip(task.arrays, (fl, depth, dep)):
        if path is not None:  # (depth left out of the outputs)
            write_window(zarr.open_array(path, mode="r+"), task.window, block, task.whole_shard)
    return _global_links(out, levels), int(np.count_nonzero(dep))


def _local_args(geo: Geometry, window: Window, levels: LocalLevels):
    """The kernels' geometry arguments with the batch's local node numbering (:class:`LocalLevels`)."""
    *args, _ = geo.args(window)
    return (*args, levels.offset)


def _global_links(out, levels: LocalLevels):
    """Phase 3's lake statistics with their links (node, lake row; -1 - node: a lake cell across
    the tile edge) gathered over the tiles and in global node ids."""
    nl, st_i, st_f, links, nlinks = out
    got = [links[t, : nlinks[t]] for t in range(len(nl))]
    got = np.concatenate(got).astype(np.int64, copy=False) if got else np.empty((0, 2), np.int64)
    across = got[:, 0] < 0
    node = np.where(across, -1 - got[:, 0], got[:, 0])
    node = levels.to_global(node)
    got[:, 0] = np.where(across, -1 - node, node)
    return nl, st_i, st_f, got


def _block_bytes(cells: int, itemsize: int) -> int:
    """Host memory per block cell: values, masks, floods (levels, labels), depth, lake labels."""
    return cells * (2 * itemsize + 2 + 4 + 4 + 4)


def _plan(store: TerrainStore, geo: Geometry, budget: int) -> tuple[Plan, int]:
    """Hold the floods of the whole DEM, or the batch side in tiles. Held: the whole boundary graph
    (about 2.5 edges of 12 bytes, twice while gathered, and their sort order, per node; 28 bytes of
    solve and lake state per node). Out of core: the quadtree of contracted blocks (O(side),
    :mod:`._levels`), two batches at once, and a batch's edges and phase 3's links (per tile:
    the kernels' rows of 24 and 20 x T, contraction and solve ~200 bytes a node). Both: each
    thread's tile scratch (heap, queue, labels, union-find): fewer threads flood tiles at once
    where the budget does not hold one scratch a thread (returned with the plan: 16 threads' scratch
    is 42 MB with 256^2 tiles, more than an eighth of an 8192^2 store)."""
    t = store.tile_size
    rows, cols = store.shape
    isz = store.dtype.itemsize

    def need(k, n=1):
        tiles, nodes = k * k, k * k * 4 * t
        graph = max(tiles * (24 * t + 8) * 24, tiles * (20 * t + 8) * 16 + (k + 2) ** 2 * 4 * t * 8) + nodes * 200
        return n * TILE_SCRATCH * t * t + LEVEL_BYTES * (rows + cols) + graph + 2 * _block_bytes((k * t + 2) ** 2, isz)

    threads = numba.get_num_threads()
    held_need = geo.nodes * 112 + threads * TILE_SCRATCH * t * t + _block_bytes((rows + 2) * (cols + 2), isz)
    if held_need > budget:
        threads = int(min(threads, max(1, (budget - need(1, 0)) // (TILE_SCRATCH * t * t))))
    return plan(store, budget, "fill", lambda k: need(k, threads), held_need=held_need), threads


TILE_SCRATCH = 40  # bytes a tile cell of each thread's flood scratch (heap, queue, labels, union-find)


@contextlib.contextmanager
def _numba_threads(n: int):
    """numba's parallel kernels on at most ``n`` threads inside the block (this thread's setting)."""
    old = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n, old)))
    try:
        yield
    finally:
        numba.set_num_threads(old)


def _edges(out, ntiles, wdtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's boundary-graph edges, compact: int32 nodes, weights in ``wdtype``."""
    ne, eu, ev, ew = out
    keep = [slice(0, int(ne[t])) for t in range(ntiles)]
    return (np.concatenate([eu[t, s] for t, s in enumerate(keep)]).astype(np.int32),
            np.concatenate([ev[t, s] for t, s in enumerate(keep)]).astype(np.int32),
            np.concatenate([ew[t, s] for t, s in enumerate(keep)]).astype(wdtype))


def _weight_dtype(dtype) -> np.dtype:
    """float32 where it holds every elevation exactly (float32, integers of up to 16 bits)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32 if dtype == np.float32 or (dtype.kind in "iu" and dtype.itemsize <= 2)
                    else np.float64)


class _Lakes:
    """Phase 3's tile-local lakes, gathered in tile order, then joined and numbered.

    They grow with the DEM's depressions, not with a batch, so they are counted against the budget
    as they come (:meth:`bytes`): each local lake costs ~LAKE_BYTES at the join's peak (its rows
    here, the join's union-find, copies and ranks, the table) and each link 16 bytes."""

    LAKE_BYTES = 260

    def __init__(self):
        self.counts, self.st_i, self.st_f, self.links = [], [], [], []
        self.lakes = self.n_links = 0

    def add(self, out) -> np.ndarray:
        """Keep a batch's lakes; returns each of its tiles' first row in the global lake list."""
        nl, st_i, st_f, got = out  # (:func:`_global_links`)
        first = self.lakes
        self.st_i.append(st_i.astype(np.int64, copy=False))
        self.st_f.append(st_f.astype(np.float64, copy=False))
        got[:, 1] += first  # rows of this batch -> rows of the whole list
        self.links.append(got)
        self.lakes += len(st_i)
        self.n_links += len(got)
        return first + np.concatenate([[0], np.cumsum(nl)[:-1]]).astype(np.int64)

    def bytes(self) -> int:
        """Host memory the lakes gathered so far take at the join's peak."""
        return self.lakes * self.LAKE_BYTES + self.n_links * 16

    def join(self):
        def cat(parts, w, dtype):  # one array, the parts let go as they are joined
            out = np.concatenate(parts) if parts else np.empty((0, w), dtype)
            parts.clear()
            return out

        st_i, st_f, links = cat(self.st_i, 4, np.int64), cat(self.st_f, 5, np.float64), cat(self.links, 2, np.int64)
        # a lake cell across a tile edge -> the lake of that perimeter node (its own link), by a sort:
        # no array over the boundary graph's nodes
        own = links[links[:, 0] >= 0]
        own = own[np.argsort(own[:, 0], kind="stable")]
        across = links[links[:, 0] < 0]
        del links
        other = own[np.searchsorted(own[:, 0], -1 - across[:, 0]), 1]
        return K.join_lakes(st_i, st_f, np.stack([across[:, 1], other], axis=1))


def _lakes_fit(lakes: _Lakes, budget: int, planned: int, done: int, total: int) -> None:
    """Refuse, before it is passed, a budget whose room beside the plan (``planned`` bytes) the
    depressions found in ``done`` of ``total`` batches outgrow; the least budget named is
    extrapolated from the batches done."""
    if planned + lakes.bytes() > budget:
        least = planned + lakes.bytes() * total // max(done, 1)
        raise InputError(f"memory budget {format_bytes(budget)} too small for this store's depressions: "
                         f"{lakes.lakes:,} in {done:,} of {total:,} batches already need "
                         f"{format_bytes(lakes.bytes())} beside the tiles' {format_bytes(planned)} "
                         f"(raise --memory to about {format_bytes(least)} or more)")


def fill(store, *, outlets: str = "edge+nodata", device: str = "auto", memory=None, progress: bool = True,
         scheduler: str | None = "local", batch_tiles: int | None = None, held: bool | None = None,
         announce=None, outputs=OUTPUTS) -> FillResult:
    """Fill the depressions of the DEM in ``store``: exact Priority-Flood levels, out of core.

    Writes ``fill/elevation`` (the DEM's dtype), ``fill/depth`` (F - h, float32) and
    ``fill/depression`` (uint32 lake id, 0 outside lakes).

    Parameters
    ----------
    store : TerrainStore or path
        The DEM store.
    outlets : {"edge+nodata", "edge"}
        Cells on the DEM's edge or next to nodata drain out, or only the DEM's edge (nodata cells
        are then walls).
    device : {"auto", "cpu", "gpu"}
    memory : str or int, optional
        The budget, such as ``"2GB"`` (default: half the free RAM).
    progress : bool
        Show progress bars.
    scheduler : str
        Where the CPU pipeline's tiled plan runs its batches (:func:`terrain_io.parallel.map_shards`:
        ``local``, Dask ``threads`` / ``processes`` or a dask.distributed address; tasks of whole
        shards, phases 1 and 3, the floods not held); with ``device="gpu"`` the in-core GPU fill
        runs whole as one task on a worker's GPU (``local-cuda``: one GPU of the host's).
    batch_tiles, held : optional
        Force the CPU pipeline's batch side / holding the floods (tests, benchmarks).
    announce : callable, optional
        Gets a cluster's dashboard address.
    outputs : sequence of str or str
        The arrays to write, of ``elevation``, ``depth``, ``depression`` (a list, or names joined
        by commas; default all three). Those written are the same bytes as in a full run; the
        depression table is made either way.

    Returns
    -------
    FillResult
        Depressions, filled cells and volume, phase times, and the depression table (``.table``).

    Examples
    --------
    >>> import tempfile
    >>> from terrain_io.store import TerrainStore
    >>> dem = np.array([[5, 5, 5, 5], [5, 1, 2, 5], [5, 5, 3, 5], [5, 5, 4, 5]], dtype=np.float32)
    >>> st = TerrainStore.from_array(tempfile.mkdtemp() + "/dem.zarr", dem)
    >>> res = fill(st, progress=False)
    >>> res.depressions, res.filled_cells
    (1, 3)
    >>> st.group["fill/depth"][1:4, 1:3].tolist()  # spilling over the edge cell of elevation 4
    [[3.0, 2.0], [0.0, 1.0], [0.0, 0.0]]
    """
    timings = Timings()
    return_freed_memory_to_os()
    outputs = check_outputs(outputs)
    if outlets not in OUTLETS:
        raise InputError(f"outlets must be one of {', '.join(OUTLETS)}, got {outlets!r}")
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    if store.dtype.kind not in "iuf":
        raise InputError(f"cannot fill a DEM of dtype {store.dtype}")
    lo, hi = store.attrs.get("min"), store.attrs.get("max")
    if lo is not None and hi is not None and not float(hi) - float(lo) <= float(np.finfo(np.float32).max):
        raise InputError(f"{store.path}: the elevations span {lo:.6g} .. {hi:.6g}: depths up to {hi - lo:.6g} would "
                         "pass float32's range (3.4e38)")
    scheduler = check_scheduler(scheduler)
    budget = memory_budget(memory)
    if held is not None or batch_tiles is not None or scheduler != "local":  # of the CPU pipeline: auto takes it
        if (device or "auto").lower() == "gpu" and scheduler != "local":  # in core: whole, on one worker's GPU
            return run_on_worker(_fill_on_worker, (str(store.path), outlets, budget, outputs), scheduler, announce)
        device = device if (device or "auto").lower() != "auto" else "cpu"
    device = _choose_device(store, device, budget)
    return FILL[device](store, outlets, budget, progress, timings, scheduler, batch_tiles, held, announce, outputs)


def check_outputs(outputs) -> tuple[str, ...]:
    """The result arrays named by ``outputs`` (names, or one text of names joined by commas), in
    :data:`OUTPUTS` order; an unknown name, or none, is an InputError."""
    names = outputs.split(",") if isinstance(outputs, str) else list(outputs)
    names = [str(n).strip() for n in names if str(n).strip()]
    unknown = [n for n in names if n not in OUTPUTS]
    if unknown or not names:
        raise InputError(f"fill outputs are {', '.join(OUTPUTS)} (one or more, joined by commas), got "
                         f"{','.join(unknown) if unknown else repr(outputs)}")
    return tuple(n for n in OUTPUTS if n in names)


def _fill_on_worker(args) -> FillResult:
    """The GPU fill as a Dask task: in core on the worker's own GPU, within the same ``--memory``."""
    path, outlets, budget, outputs = args
    return fill(path, outlets=outlets, device="gpu", memory=budget, progress=False, outputs=outputs)


def _fill_tiled(store: TerrainStore, outlets: str, budget: int, progress: bool, timings: Timings, scheduler: str,
                batch_tiles: int | None, held: bool | None, announce, outputs=OUTPUTS) -> FillResult:
    """The CPU pipeline (module docstring): the tiled plan, here or as Dask tasks (:func:`fill`'s options),
    on as many threads as the budget holds tile scratch for. Of the arrays not in ``outputs``: ``depth``
    is not written; ``elevation`` and ``depression``, which the lake numbering reads back when the
    floods are not held, are written then and left out of the result before it is sealed."""
    geo = Geometry(*store.shape, store.tile_size)
    chosen, threads = _plan(store, geo, budget)
    with _numba_threads(threads):
        return _fill_planned(store, geo, chosen, outlets, budget, progress, timings, scheduler, batch_tiles, held,
                             announce, outputs)


def _fill_planned(store: TerrainStore, geo: Geometry, chosen: Plan, outlets: str, budget: int, progress: bool,
                  timings: Timings, scheduler: str, batch_tiles: int | None, held: bool | None,
                  announce, outputs=OUTPUTS) -> FillResult:
    rows, cols = store.shape
    plan_held = chosen.held if held is None else held
    k = chosen.side if batch_tiles is None else check_side(store, batch_tiles)
    if scheduler != "local":  # Dask tasks of whole shards, floods not held
        if not batch_tiles and k != store.shard_size and not plan_held:
            raise InputError(f"with --scheduler every task is a whole shard, which needs more than the memory "
                             f"budget {format_bytes(budget)} (raise --memory)")
        plan_held, k = False, batch_tiles or store.shard_size
    if plan_held:
        k = whole_side(store)
    batches = plan_batches(store, k)
    graph_batch, final_batch, relabel = (_kernel(n, rows * cols) for n in ("graph_batch", "final_batch", "relabel"))
    nodata_drains = outlets == "edge+nodata"
    whole_shard = k == store.shard_size
    with store.write_result(RESULT, attrs={"outlets": outlets, "outputs": list(outputs)}) as writer:
        filled_arr = writer.create_array("elevation", store.dtype, store.elevation.fill_value)
        depth_arr = writer.create_array("depth", "float32", float("nan")) if "depth" in outputs else None
        dep_arr = writer.create_array("depression", "uint32", 0)

        with contextlib.ExitStack() as scratch:
            # phase 1: floods and the boundary graph, contracted up the quadtree as the batches come
            tree = LevelTree(geo, k, None if len(batches) == 1 else
                             scratch.enter_context(scratch_directory(store.path, "fill-graph")),
                             _weight_dtype(store.dtype))
            shift0 = tree.shift0
            with timings.phase("tile_phase"):
                kept = None
                with progress_bar(progress, len(batches), "fill: tile phase", unit="batch") as bar:
                    if plan_held:
                        b = batches[0]
                        vals, ok, outl = read_block(store, b.window, nodata_drains)
                        h, w = b.window.shape
                        kept = (vals, ok, np.empty((h, w), store.dtype), np.empty((h, w), K.LABEL))
                        out = graph_batch(vals, ok, outl, b.tiles, *geo.args(b.window), kept[2], kept[3], True)
                        tree.add_batch(int(b.codes[0]) >> shift0, _edges(out, len(b.tiles), _weight_dtype(store.dtype)))
                        del out, outl  # held floods need no outlets again
                        bar.update(1)
                    else:
                        tasks = (_Task(str(store.path), b.window, b.tiles, nodata_drains) for b in batches)
                        for b, edges in zip(batches, imap_shards(_tile_phase_task, tasks, scheduler, progress=bar,
                                                                 announce=announce)):
                            tree.add_batch(int(b.codes[0]) >> shift0, edges)

            # phase 2: the boundary solve, up to the root (down again batch by batch in phase 3)
            with timings.phase("solve"):
                tree.finish()
            levels = tree.batch_levels()

            # phase 3: final levels, depths, lakes
            with timings.phase("final_phase"):
                lakes = _Lakes()
                starts = []
                filled_cells = 0
                with progress_bar(progress, len(batches), "fill: final phase", unit="batch") as bar:
                    if plan_held:  # no outlets (no flood again), no depth yet: 5 bytes a cell less at the peak
                        b = batches[0]
                        vals, ok, fl, lab = kept
                        dep = np.empty(b.window.shape, np.uint32)
                        local = LocalLevels(geo, b.window, *next(levels)[1:])
                        out = final_batch(vals, ok, ok, b.tiles, *_local_args(geo, b.window, local), local.G, fl,
                                          lab, True, fl, np.empty((0, 0), np.float32), dep)
                        starts.append(lakes.add(_global_links(out, local)))
                        _lakes_fit(lakes, budget, chosen.bytes, 1, 1)
                        filled_cells += int(np.count_nonzero(dep))
                        kept = (fl, vals, dep)
                        del ok, lab, out, local
                        bar.update(1)
                    else:
                        arrays = tuple(a and f"{a.store.root}/{a.path}" for a in (filled_arr, depth_arr, dep_arr))
                        # each task gets its batch's levels as the quadtree comes down to it
                        tasks = (_Task(str(store.path), b.window, b.tiles, nodata_drains, arrays, (nodes, G),
                                       whole_shard)
                                 for b, (_, nodes, G) in zip(batches, levels))
                        # one batch's lakes at a time, counted as they come (map_shards would gather all)
                        for out, n_filled in imap_shards(_final_phase_task, tasks, scheduler, progress=bar,
                                                         announce=announce):
                            starts.append(lakes.add(out))
                            _lakes_fit(lakes, budget, chosen.bytes, len(starts), len(batches))
                            filled_cells += n_filled
                del levels, tree
            final, acc_i, acc_f = lakes.join()
            del lakes

        # lake ids and spill targets
        with timings.phase("lakes"):
            spills_to = np.zeros(len(acc_i), np.uint32)
            spill = acc_i[:, 3]
            if plan_held:
                fl, vals, dep = kept
                b = batches[0]
                relabel(dep, b.tiles, starts[0], final)
                K.spill_targets(fl, dep, 0, 0, cols, spill, np.arange(1, len(spill) + 1, dtype=np.uint32), spills_to)
                held_out = {"elevation": (filled_arr, lambda s: fl[s]), "depression": (dep_arr, lambda s: dep[s]),
                            "depth": (depth_arr, lambda s: _depth(store, fl[s], vals[1:-1, 1:-1][s]))}
                write_held(store, *(held_out[n] for n in outputs))
                del kept, fl, vals, dep
            else:
                _relabel_and_spill(store, batches, starts, final, spill, dep_arr, filled_arr, whole_shard, spills_to,
                                   progress)
        table = Depressions(least=acc_i[:, 0], cells=acc_i[:, 1], pit=acc_i[:, 2], spill=spill, level=acc_f[:, 0],
                            volume_cells=acc_f[:, 1] + acc_f[:, 2], max_depth=acc_f[:, 3],
                            pit_elevation=acc_f[:, 4], spills_to=spills_to)
        dx, dy = store.metric_cell_size  # m^2 and m^3, also for a geographic CRS
        result = FillResult(outlets=outlets, device="cpu", method="held" if plan_held else "tiled",
                            cells=rows * cols, depressions=len(table), filled_cells=filled_cells,
                            volume=float(table.volume_cells.sum() * dx * dy), seconds=timings.seconds(),
                            timings=timings.rounded(4), tile_size=store.tile_size,
                            batch_tiles=k, table=table)
        writer.attrs.update(result.attrs())
        if len(table) <= TABLE_IN_ATTRS:
            writer.attrs["depression_table"] = {c: v.tolist() for c, v in table.rows(store).items()}
        for name in set(OUTPUTS) - set(outputs):  # scratch of the lake numbering (never written when held)
            if name in writer.group:
                del writer.group[name]
    return result


def _depth(store: TerrainStore, filled: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """F - h as :func:`._cpu.final_tile` computes it (float64 difference rounded to float32),
    NaN on nodata."""
    depth = np.subtract(filled, vals, dtype=np.float64, out=np.empty(filled.shape, np.float32))  # buffered: no
    depth[~store.valid(vals)] = np.nan  # float64 temporaries of the shard's size
    return depth


def _choose_device(store: TerrainStore, device: str | None, budget: int) -> str:
    """``cpu`` or ``gpu``: ``auto`` takes the GPU when one is usable and the store fits the in-core
    GPU fill (:func:`_gpu_misfit`); ``gpu`` on a store that does not fit runs the CPU pipeline
    with a one-line note (a warning)."""
    asked = (device or "auto").lower()
    if resolve_device(asked) == "cpu":
        return "cpu"
    why = _gpu_misfit(store, budget)
    if why is None:
        return "gpu"
    if asked == "gpu":
        warnings.warn(f"fill: {why}: filled on the CPU (tiled pipeline) instead", TerrainNote, stacklevel=3)
    return "cpu"


def _gpu_host_bytes(store: TerrainStore) -> int:
    """Host memory of the in-core GPU fill: a band of shard rows of input with a decoded shard a
    reader thread; then two bands of the outputs at once (one being written while the next comes
    back from the GPU), with three shards a writer thread: the shard's contiguous copy, the codec's
    output and zarr's buffer of it (two, as counted before, fell ~9% short: +1406 MiB measured on
    the H100 at 16384^2 against 1280 counted; now 1536)."""
    side = store.tile_size * store.shard_size
    rows, cols = store.shape
    band, shard = min(side, rows) * cols, min(side, rows) * min(side, cols)
    isz, nsc = store.dtype.itemsize, store.shard_grid[1]
    cores = os.cpu_count() or 1
    read = band * isz + min(cores, nsc) * shard * isz
    return max(read, 2 * band * (isz + 8) + min(cores, 3 * nsc) * shard * max(isz, 4) * 3)


def _gpu_misfit(store: TerrainStore, budget: int) -> str | None:
    """Why the in-core GPU fill cannot take ``store`` (None: it can)."""
    from ._gpu import device_bytes, value_dtype

    rows, cols = store.shape
    if value_dtype(store.dtype) is None:
        return f"the GPU computes in float64 at most, which does not hold every {store.dtype} value"
    need, free = device_bytes(rows, cols, store.dtype, store.tile_size * store.shard_size), gpu_free_bytes()
    if need > free:
        return f"it needs {format_bytes(need)} of GPU memory, {format_bytes(free)} free"
    if _gpu_host_bytes(store) > budget:
        return (f"its bands of shards need {format_bytes(_gpu_host_bytes(store))} of host memory, more than the "
                f"budget {format_bytes(budget)}")
    return None


def _fill_gpu_incore(store: TerrainStore, outlets: str, budget: int, progress: bool, timings: Timings,
                     scheduler, batch_tiles, held, announce, outputs=OUTPUTS) -> FillResult:
    """The in-core GPU fill (:mod:`._gpu`): the DEM read band by band (a band of shard rows,
    its shards decoded in parallel threads) into one GPU array, levels and lakes solved there, the
    outputs brought back a band at a time while the threads encode the band before; only the arrays
    named in ``outputs`` leave the GPU. The CPU pipeline's options (scheduler, batch, held, announce)
    are not used here."""
    from ._gpu import GpuFill

    rows, cols = store.shape
    nsr, nsc = store.shard_grid
    bands = [[store.shard_window(sr, sc) for sc in range(nsc)] for sr in range(nsr)]
    threads = max(1, min(os.cpu_count() or 1, nsc))
    gpu = GpuFill(rows, cols, store.dtype, store.nodata)
    pinned = PinnedBands(sets=2)  # the bands cross the bus from and to pinned buffers (terrain_io/pinned.py)
    try:
        with timings.phase("read"):
            with concurrent.futures.ThreadPoolExecutor(threads) as pool, \
                    progress_bar(progress, nsr * nsc, "fill: read", unit="shard") as bar:

                def loaded(r0, r1, cells):  # a band decoded on the GPU from the shards' zstd frames
                    gpu.load(r0, cells)
                    bar.update(nsc * -(-(r1 - r0) // (store.tile_size * store.shard_size)))

                on_gpu = read_device(store, ELEVATION, threads, each=loaded, timings=timings) is not None
                for band in [] if on_gpu else bands:
                    r0 = band[0].r0
                    host = pinned.buffer(0, "read", (band[0].r1 - r0, cols), store.dtype)

                    def read(win, host=host, r0=r0):  # each shard decoded straight into the band
                        store.read(win, out=host[win.r0 - r0 : win.r1 - r0, win.c0 : win.c1])
                        bar.update(1)

                    list(pool.map(read, band))
                    gpu.load(r0, host)
                    pinned.uploaded()  # (the next band is decoded into the same buffer)
                    del host
                pinned.close()
        with timings.phase("levels"):
            gpu.levels(outlets == "edge+nodata")
            _sync()
        with timings.phase("lakes"):
            least, cells, pit, spill, level, hi, lo, max_depth, pit_elevation, spills_to = gpu.lakes()
        table = Depressions(least=least, cells=cells, pit=pit, spill=spill, level=level, volume_cells=hi + lo,
                            max_depth=max_depth, pit_elevation=pit_elevation, spills_to=spills_to)
        with store.write_result(RESULT, attrs={"outlets": outlets, "outputs": list(outputs)}) as writer:
            with timings.phase("write"):
                made = {"elevation": (store.dtype, store.elevation.fill_value), "depth": ("float32", float("nan")),
                        "depression": ("uint32", 0)}
                arrays = tuple(writer.create_array(n, *made[n]) for n in outputs)
                # every shard of every output its own task: three times the band's shards to encode at once
                lanes = max(1, min(os.cpu_count() or 1, len(arrays) * nsc))
                with concurrent.futures.ThreadPoolExecutor(lanes) as pool, \
                        progress_bar(progress, nsr * nsc * len(arrays), "fill: write", unit="shard") as bar:
                    write_bands(arrays, bands, lambda r0, r1: gpu.band(r0, r1, outputs), pinned, pool, bar.update,
                                timings)
            dx, dy = store.metric_cell_size
            result = FillResult(outlets=outlets, device="gpu", method="incore", cells=rows * cols,
                                depressions=len(table), filled_cells=int(cells.sum()),
                                volume=float(table.volume_cells.sum() * dx * dy),
                                seconds=timings.seconds(), timings={**timings.rounded(4), "rounds": gpu.rounds},
                                tile_size=store.tile_size, table=table)
            writer.attrs.update(result.attrs())
            if len(table) <= TABLE_IN_ATTRS:
                writer.attrs["depression_table"] = {c: v.tolist() for c, v in table.rows(store).items()}
    finally:
        pinned.close()
        gpu.close()
    return result


FILL = Dispatch("fill", cpu=_fill_tiled, gpu=_fill_gpu_incore)


def _sync() -> None:
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def _relabel_and_spill(store, batches: Sequence[Batch], starts, final, spill, dep_arr, filled_arr, whole_shard: bool,
                       spills_to, progress) -> None:
    """Out of core: tile-local lake numbers -> final ids, batch by batch; then the spill targets,
    reading a one-cell halo around each batch that holds spill cells."""
    rows, cols = store.shape
    relabel = _kernel("relabel", rows * cols)
    with progress_bar(progress, 2 * len(batches), "fill: lakes", unit="batch") as bar:
        for b, start in zip(batches, starts):
            dep = read_window(dep_arr, b.window, whole_shard)
            relabel(dep, b.tiles, start, final)
            write_window(dep_arr, b.window, dep, whole_shard)
            bar.update(1)
        ids = np.arange(1, len(spill) + 1, dtype=np.uint32)
        sr, sc = spill // cols, spill % cols
        for b in batches:
            w = b.window
            sel = np.nonzero((sr >= w.r0) & (sr < w.r1) & (sc >= w.c0) & (sc < w.c1))[0]
            bar.update(1)
            if not len(sel):
                continue
            r0, r1, c0, c1 = max(w.r0 - 1, 0), min(w.r1 + 1, rows), max(w.c0 - 1, 0), min(w.c1 + 1, cols)
            dep = np.asarray(dep_arr[r0:r1, c0:c1])
            lev = np.asarray(filled_arr[r0:r1, c0:c1])
            got = np.zeros(len(sel), np.uint32)
            K.spill_targets(lev, dep, r0, c0, cols, spill[sel], ids[sel], got)
            spills_to[sel] = got


def fill_array(values: np.ndarray, *, outlets: str = "edge+nodata", nodata=None, tile: int = 64,
               workdir=None) -> tuple[np.ndarray, FillResult]:
    """Fill an in-memory DEM (NaN or ``nodata`` = no vertex): the filled array and the result (a
    temporary store under ``workdir``; for tests and small arrays)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        st = TerrainStore.from_array(Path(tmp) / "a.zarr", np.asarray(values), tile=tile, shard=4, nodata=nodata)
        res = fill(st, outlets=outlets, device="cpu", progress=False)
        return np.asarray(TerrainStore.open(st.path).group[f"{RESULT}/elevation"][...]), res


def write_table(result: FillResult, store, path) -> Path:
    """The depression table as CSV (:func:`terrain_io.tables.write_csv`: a block of rows at a time, under
    a temporary name renamed when complete)."""
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store), mode="r")
    return write_csv(result.table.rows(store), path)


def read_fill(store) -> dict[str, np.ndarray]:
    """The ``fill`` result arrays of ``store`` in memory (small stores, tests)."""
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    return {n: np.asarray(store.group[f"{RESULT}/{n}"][...]) for n in ("elevation", "depth", "depression")}


def _kernel(name: str, cells: int):
    """The threaded entry ``name`` of :mod:`._cpu` (a batch's tiles in chunks on numba's thread
    count, :func:`terrain_io.jit.in_threads`, which takes one thread for one tile or where numba has
    one), or its serial twin (the same kernels, one thread) for a DEM of fewer than SERIAL_BELOW
    cells (terrain_io.jit): a small job starts no thread pool."""
    return getattr(K, name if cells >= SERIAL_BELOW else name + "_serial")
