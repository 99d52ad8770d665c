"""Flow directions and accumulation of a store's DEM, in core or out of core (``terrain flow``).

Definitions: :mod:`.codes` and :mod:`._cpu` (D8 steepest descent; flats by Barnes, Lehman & Mulla
2014; accumulation counting the cell itself, or weights summed exactly as fixed-point integers).
The source is ``fill/elevation`` (``condition="fill"``: the stored fill when it was made with the
same outlets from this elevation, else ``terrain fill`` runs first) or ``elevation`` (``"none"``).

In core (the DEM and its scratch fit the memory budget): the whole DEM read, routed and
accumulated in memory, written shard by shard in parallel threads.

Out of core: windows of k x k tiles (a shard or a quadtree part of one) in Morton order.

1. Directions, tile phase -- each window read with a two-cell halo: D8 of the window and its ring
   (the ring's codes say which neighbours are resolved), written; the window's flat cells kept as
   a compact list: global id, high-edge flag, low-edge direction (:func:`._cpu.flat_cells`).
2. Flats -- the two BFS of Barnes 2014 over the compact list of all flat cells of the DEM
   (:func:`._cpu.flats_compact`: the same mask and tie rule as in core) when it fits half the budget
   (35 bytes a flat cell), and the windows holding flat cells rewritten; otherwise window sweeps
   (:func:`_sweep_flats`): each window's BFS seeded from its halo's distances, kept only for the flat
   cells on the windows' edges (tile-local distances, a boundary solve by relaxation, a final pass).
3. Accumulation (Barnes 2017, "Parallel non-divergent flow accumulation for trillion cell digital
   elevation models"): each window accumulated alone (halo inflow 0), handing up its *exits*
   (cells draining into another window, with their in-window total) and *entries* (cells fed from
   the halo, with the exit their in-window path leaves by); the exits' totals solved together in
   topological order (:func:`._cpu.solve_exits`); each window accumulated again with its halo's
   final totals flowing in, and written.

On the GPU (:func:`_flow_gpu`): the whole DEM on the GPU, read into it and written from it shard by
shard in threads (:mod:`._gpu`: D8, the flats' BFS, the accumulation finished a band at a time).
With a Dask scheduler the out-of-core windows run as tasks of whole shards (:class:`_Task`).

Counts are integers, and so are weighted sums (fixed-point, :func:`._cpu.weight_scale`, its scale
from the whole raster's weights): the same bytes in core and out of core, for every tile size and
budget, on the CPU and the GPU.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...backend import gpu_free_bytes, resolve_device
from ...errors import InputError, TerrainNote
from ...memory import format_bytes, memory_budget, return_freed_memory_to_os
from ...parallel import check_scheduler, imap_shards, run_on_worker
from ...pinned import host_bytes as pinned_host_bytes, write_device, write_held
from ...progress import progress_bar
from ...store import TerrainStore, Window, read_window, write_window
from ...timings import Timings
from ..fill._cpu import outlets as outlet_cells
from ..fill._tiled import OUTLETS
from ..tiling import check_side, plan, plan_batches
from ...weights import steps_of
from . import _cpu as K
from .array import DIRECTION_CODES, check_weights
from .codes import NODATA, OUTLET, SINK
from .upload import threads, upload_held

RESULT = "flow"
CONDITIONS = ("fill", "none")
FLAT_BYTES = 35  # compact flat solve, a flat cell: id, flags, towards, away, queue, code


@dataclass
class FlowResult:
    """What ``flow`` computed; the same numbers are the attributes of the ``flow`` result group."""

    condition: str
    outlets: str
    device: str
    method: str  # "incore" or "tiled"
    cells: int
    valid: int
    outlet_cells: int
    sinks: int
    flat_cells: int
    max_accumulation: float
    weighted: bool
    include_self: bool
    seconds: float
    filled_now: bool = False
    timings: dict = field(default_factory=dict)
    window_tiles: int = 0

    def summary(self) -> str:
        what = "weight" if self.weighted else "cells"
        peak = f"{self.max_accumulation:.6g}" if self.weighted else f"{int(self.max_accumulation):,}"
        return (f"flow: {self.cells:,} cells ({self.valid:,} valid), {self.flat_cells:,} flat cells routed, "
                f"{self.outlet_cells:,} outlet cells, {self.sinks:,} sinks, largest accumulation {peak} {what}"
                f"{' (fill run first)' if self.filled_now else ''}, outlets {self.outlets}, {self.seconds:.2f} s, "
                f"{self.cells / max(self.seconds, 1e-9) / 1e6:.1f} Mcells/s ({self.device}, {self.method})")

    def attrs(self) -> dict:
        return {"condition": self.condition, "outlets": self.outlets, "device": self.device, "method": self.method,
                "cells": self.cells, "valid": self.valid, "outlet_cells": self.outlet_cells, "sinks": self.sinks,
                "flat_cells": self.flat_cells, "max_accumulation": self.max_accumulation,
                "weighted": self.weighted, "include_self": self.include_self, "seconds": self.seconds,
                "timings": self.timings, "window_tiles": self.window_tiles, "direction_codes": DIRECTION_CODES}


class _Weights:
    """The ``weights`` raster: a NumPy array, a raster file (GDAL) or an array of the store, read a
    window at a time, float64 (a file's nodata as NaN)."""

    def __init__(self, spec, store: TerrainStore):
        self.array = self.file = None
        if isinstance(spec, np.ndarray):
            self.array, shape = spec, spec.shape
        elif Path(str(spec)).is_file():
            import rasterio

            self.file = rasterio.open(str(spec))
            shape = (self.file.height, self.file.width)
        elif str(spec) in store.group and hasattr(store.group[str(spec)], "shape"):
            self.array = store.group[str(spec)]
            shape = self.array.shape
        else:
            raise InputError(f"weights {spec}: no such file, nor an array of {store.path}")
        if tuple(shape) != tuple(store.shape):
            raise InputError(f"the weights raster {spec} has shape {tuple(shape)}, the DEM {tuple(store.shape)}")
        self.spec = spec

    def read(self, win: Window) -> np.ndarray:
        if self.file is not None:
            from rasterio.windows import Window as RWindow

            out = self.file.read(1, window=RWindow(win.c0, win.r0, win.c1 - win.c0, win.r1 - win.r0), masked=True)
            return np.ma.filled(out.astype(np.float64), np.nan)
        return np.asarray(self.array[win.slices], np.float64)

    def close(self):
        if self.file is not None:
            self.file.close()


def _flow_on_worker(args) -> FlowResult:
    """:func:`flow` as a Dask task, on the worker's own GPU."""
    path, options = args
    return flow(path, device="gpu", progress=False, **options)


def flow(store, *, condition: str = "fill", outlets: str = "edge+nodata", weights=None, include_self: bool = True,
         device: str = "auto", memory=None, progress: bool = True, scheduler: str | None = "local",
         window_tiles: int | None = None, flat_sweeps: bool | None = None, announce=None) -> FlowResult:
    """Route the DEM of ``store``: writes ``flow/direction`` (uint8 codes, :mod:`.codes`) and
    ``flow/accumulation`` (uint64 cells, or float64 sums of ``weights``; 0 at nodata).

    ``condition``: ``fill`` (route the filled DEM; fill first when needed) or ``none``;
    ``outlets``: ``edge+nodata`` or ``edge``; ``weights``: a raster file, an array of the store or a
    NumPy array of the DEM's shape (finite, >= 0 at valid cells); ``include_self``: count the cell
    itself; ``device``: ``auto|cpu|gpu`` (the GPU holds the DEM, the host a shard a thread:
    :func:`_flow_gpu`); ``memory``: the budget (default half the free RAM); ``scheduler``: ``local``,
    or Dask's (``threads``, ``processes``, a ``dask.distributed`` address, ``local-cuda``): on the CPU
    the out-of-core windows run as tasks of whole shards (:class:`_Task`; the same bytes), with
    ``device="gpu"`` a worker runs the whole in-core GPU route as one task (on one of its GPUs);
    ``window_tiles``: force the out-of-core pipeline with windows of this many tiles a side (a power
    of two <= the shard size; tests, benchmarks); ``flat_sweeps``: out of core, solve the
    flats by window sweeps (True) or over the compact list (False; default: the list when it fits).
    """
    t_start = Timings()  # the run's clock: t_start.seconds() when the result is made
    return_freed_memory_to_os()
    if condition not in CONDITIONS:
        raise InputError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    if outlets not in OUTLETS:
        raise InputError(f"outlets must be one of {', '.join(OUTLETS)}, got {outlets!r}")
    scheduler = check_scheduler(scheduler)
    if scheduler != "local" and (device or "auto").lower() == "gpu":
        # the GPU routes in core: the whole run as one task on a worker's GPU (local-cuda: one of the host's)
        return run_on_worker(_flow_on_worker, (str(store.path if isinstance(store, TerrainStore) else store),
                                               dict(condition=condition, outlets=outlets, weights=weights,
                                                    include_self=include_self, memory=memory)), scheduler, announce)
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    if store.dtype.kind not in "iuf":
        raise InputError(f"cannot route a DEM of dtype {store.dtype}")
    if store.attrs.get("valid_count") == 0:
        raise InputError(f"{store.path}: the DEM holds no data (every cell is nodata): nothing to route")
    if window_tiles is not None:
        check_side(store, window_tiles)
    budget = memory_budget(memory)
    wsrc = _Weights(weights, store) if weights is not None else None
    try:
        source, filled_now = _source(store, condition, outlets, device, memory, progress, announce)
        if filled_now:
            store = TerrainStore.open(store.path)
        dev = resolve_device(device) if scheduler == "local" else "cpu"
        if dev == "gpu" and window_tiles is None:
            why = _gpu_misfit(store, wsrc is not None, budget)
            if why is None:
                try:
                    return _flow_gpu(store, source, condition, outlets, wsrc, include_self, progress, t_start,
                                     filled_now)
                except Exception as e:  # the GPU's memory short of the exits' tour, or of any allocation
                    why = _gpu_short(e)
                _free_gpu_pool()
            if (device or "auto").lower() == "gpu":
                warnings.warn(f"flow: {why}: routed on the CPU instead", TerrainNote, stacklevel=2)
        rows, cols = store.shape
        isz = store.dtype.itemsize
        incore_need = rows * cols * (max(isz, 8 if wsrc else 0) + 27 + (8 if wsrc else 0))  # + the sums' high words
        if window_tiles is None:  # a window and the boundary lists; the flats' lists get what is left
            side = store.tile_size * store.shard_size
            chosen = plan(store, budget, "flow", lambda k: _tiled_bytes(rows, cols, k * store.tile_size, isz, side,
                                                                         wsrc is not None),
                          incore_need if scheduler == "local" else None)
            if chosen.held:
                return _flow_incore(store, source, condition, outlets, wsrc, include_self, progress, t_start,
                                    filled_now)
            if scheduler != "local" and chosen.side != store.shard_size:
                raise InputError(f"with --scheduler every task is a whole shard, which needs more than the memory "
                                 f"budget {format_bytes(budget)} (raise --memory)")
        k = window_tiles or chosen.side
        if scheduler != "local" and k != store.shard_size:
            raise InputError("with --scheduler every task is a whole shard: windows of the shard's side only")
        return _flow_tiled(store, source, condition, outlets, wsrc, include_self, progress, t_start, filled_now, k,
                           budget, flat_sweeps, scheduler, announce)
    finally:
        if wsrc is not None:
            wsrc.close()


def _tiled_bytes(rows: int, cols: int, side: int, isz: int, shard_side: int, weighted: bool = False) -> int:
    """The out-of-core pipeline with windows of ``side`` cells: one window, and the exits (24 bytes;
    32 with weights: their sums' two words) and entries (16 bytes) of every window's edge cells,
    twice while they are gathered and sorted; a window that is part of a shard is written through
    zarr, which rewrites the shard: count the shard of both results (1 + 8 bytes a cell; measured
    +9.8 MiB writing the codes of 256^2 windows into a 2048^2 shard)."""
    edge_cells = 2 * (rows * -(-cols // side) + cols * -(-rows // side))
    rewrite = 0 if side >= shard_side else min(shard_side, rows) * min(shard_side, cols) * 9
    return _window_bytes(side, isz, weighted) + edge_cells * (96 if weighted else 80) + rewrite


def _window_bytes(side: int, isz: int, weighted: bool = False) -> int:
    """Host memory of one window: its values with a two-cell halo, masks, codes, accumulation (two
    words of weighted sums), weights, the in-window path scratch."""
    return (side + 4) ** 2 * (isz + 2) + (side + 2) ** 2 * (17 if weighted else 9) + side * side * 26


def _source(store, condition, outlets, device, memory, progress, announce) -> tuple[str, bool]:
    """The array to route and whether fill ran now for it."""
    if condition == "none":
        return "elevation", False
    attrs = store.results().get("fill/elevation") or {}
    fill_attrs = store.results().get("fill") or {}
    if attrs and fill_attrs.get("outlets") == outlets and fill_attrs.get("generation") == store.attrs.get("generation"):
        return "fill/elevation", False
    from ..fill import fill

    fill(store, outlets=outlets, device=device, memory=memory, progress=progress, announce=announce)
    return "fill/elevation", True


def _result(store, condition, outlets, wsrc, include_self, method, device, t_start, filled_now, valid, code_stats,
            peak, timings, k=0) -> FlowResult:
    outlets_n, sinks, flat = code_stats
    return FlowResult(condition=condition, outlets=outlets, device=device, method=method,
                      cells=store.shape[0] * store.shape[1], valid=valid, outlet_cells=outlets_n, sinks=sinks,
                      flat_cells=flat, max_accumulation=float(peak), weighted=wsrc is not None,
                      include_self=include_self, seconds=t_start.seconds(), filled_now=filled_now,
                      timings={n: round(v, 4) for n, v in timings.items()}, window_tiles=k)


def _create(writer, weighted: bool):
    direction = writer.create_array("direction", "uint8", NODATA, attrs={"codes": DIRECTION_CODES})
    acc = writer.create_array("accumulation", "float64" if weighted else "uint64", 0,
                              attrs={"units": "sum of weights" if weighted else "cells"})
    return direction, acc


def _checked_weights(wsrc, win, valid) -> np.ndarray:
    w = wsrc.read(win)
    check_weights(w, valid, valid.shape)
    return w


def _flow_incore(store, source, condition, outlets, wsrc, include_self, progress, t_start, filled_now) -> FlowResult:
    rows, cols = store.shape
    timings = Timings()
    with timings.phase("read"):
        whole = Window(0, rows, 0, cols)
        with progress_bar(progress, 1, "flow: read", unit="DEM") as bar:
            vals = store.read(whole, source)
            bar.update(1)
        valid = store.valid(vals)
    with timings.phase("directions"):
        dx, dy = store.metric_cell_size
        code, unresolved = K.routed(vals, valid, dx, dy, outlets)
        del vals
    with timings.phase("accumulation"):
        w = _checked_weights(wsrc, whole, valid) if wsrc is not None else None
        n_valid = int(np.count_nonzero(valid))
        del valid
        try:
            inner = K.accumulation(code, w, include_self)
        except InputError:
            raise InputError("the flow directions have cycles") from None  # not for our codes
        del w
    return _write_incore(store, source, condition, outlets, wsrc, include_self, "cpu", t_start, filled_now, n_valid,
                         lambda s: code[s], lambda s: inner[s], _code_stats(code, unresolved), timings,
                         inner.max(initial=0))


def _code_stats(code, unresolved: int) -> tuple[int, int, int]:
    """(outlet cells, sinks, flat cells routed: the flat cells that are not SINK)."""
    counts = np.bincount(code.ravel(), minlength=256)
    return int(counts[OUTLET]), int(counts[SINK]), unresolved - int(counts[SINK])


def read_halo(arr, win: Window, halo: int, fill, shape) -> np.ndarray:
    """Cells of ``win`` grown by ``halo`` from a zarr array; outside it ``fill``."""
    rows, cols = shape
    r0, r1, c0, c1 = win.r0 - halo, win.r1 + halo, win.c0 - halo, win.c1 + halo
    out = np.full((r1 - r0, c1 - c0), fill, arr.dtype)
    rr0, rr1, cc0, cc1 = max(r0, 0), min(r1, rows), max(c0, 0), min(c1, cols)
    out[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0] = arr[rr0:rr1, cc0:cc1]
    return out


@dataclass
class _Task:
    """One window of the out-of-core pipeline, run here or as a Dask task (the store and the result
    arrays by path; what the window needs of the boundary solves carried along)."""

    store: str | TerrainStore  # the open store in this process, its path for Dask
    source: str
    window: Window
    arrays: tuple  # flow/direction, flow/accumulation: the open arrays here, their temporary paths for Dask
    whole_shard: bool
    outlets: str = "edge+nodata"
    flat_lists: bool = True  # directions: list the window's flat cells for the compact solve
    flats: tuple | None = None  # compact flats: (ids, codes) of the flat cells of the window
    weights: np.ndarray | None = None  # accumulation: the window's weights (checked)
    scale: int = 0  # accumulation: the weights' fixed-point scale (:func:`._cpu.weight_scale`)
    inflow: tuple | None = None  # final accumulation: (exit ids, totals) of the window's rows and halo
    include_self: bool = True


def _opened(t: _Task):
    """The task's store and result arrays, opened where the task carries paths."""
    import zarr

    store = t.store if isinstance(t.store, TerrainStore) else TerrainStore.open(t.store, mode="r")
    return store, tuple(zarr.open_array(a, mode="r+") if isinstance(a, str) else a for a in t.arrays)


def _directions_task(t: _Task):
    """Phase 1 of a window: D8 of the window and its ring, codes written; (flat cells, the flat
    cells on the window's edges, the compact list of its flat cells or None)."""
    store, (d_arr, _) = _opened(t)
    rows, cols = store.shape
    win = t.window
    block = store.read(win, t.source, halo=2)
    ok = store.valid(block)
    _outside_false(ok, win, rows, cols, 2)
    outl = outlet_cells(ok, win.r0 - 1, win.c0 - 1, rows, cols, t.outlets == "edge+nodata")
    h, w = win.shape
    ring = np.empty((h + 2, w + 2), np.uint8)
    K.d8(block, ok, outl, steps_of(*map(float, store.metric_cell_size)), ring)
    inner = ring[1:-1, 1:-1]
    n = int(np.count_nonzero(inner == K.UNRESOLVED))
    perimeter = lists = None
    if n:
        perimeter = K.perimeter_flats(inner, win.r0, win.c0, cols)
        if t.flat_lists:
            lists = np.empty(n, np.int64), np.empty(n, np.bool_), np.empty(n, np.uint8)
            K.flat_cells(block, ok, ring, win.r0, win.c0, cols, *lists)
    write_window(d_arr, win, inner, t.whole_shard)
    return n, perimeter, lists


def _flat_codes_task(t: _Task) -> None:
    """Phase 2 (compact): the window's flat cells get their codes."""
    _, (d_arr, _) = _opened(t)
    code = read_window(d_arr, t.window, t.whole_shard)
    K.set_codes(code, t.window.r0, t.window.c0, d_arr.shape[1], *t.flats)
    write_window(d_arr, t.window, code, t.whole_shard)


def _sums(t: _Task, shape):
    """A window's accumulation words (lo, hi: :func:`._cpu.accumulate`) and weights' bits."""
    lo = np.zeros(shape, np.uint64)
    if t.weights is None:
        return lo, lo, np.ones((1, 1), np.uint64)
    return lo, np.zeros(shape, np.uint64), np.ascontiguousarray(t.weights, np.float64).view(np.uint64)


def _links_task(t: _Task):
    """Phase 3a of a window: accumulated alone; its exits (id, target, value) and entries (id, link)."""
    _, (d_arr, _) = _opened(t)
    code = read_halo(d_arr, t.window, 1, NODATA, d_arr.shape)
    lo, hi, wbits = _sums(t, code.shape)
    return K.tile_links(code, wbits, t.weights is not None, t.scale, lo, hi, t.window.r0, t.window.c0, d_arr.shape[1])


def _final_task(t: _Task):
    """Phase 3c of a window: accumulated again with its halo's final totals flowing in, written;
    (its largest value, [valid, outlet cells, sinks])."""
    _, (d_arr, a_arr) = _opened(t)
    win = t.window
    code = read_halo(d_arr, win, 1, NODATA, d_arr.shape)
    inner_code = code[1:-1, 1:-1]
    weighted = t.weights is not None
    lo, hi, wbits = _sums(t, code.shape)
    K.set_inflows(code, weighted, lo, hi, win.r0, win.c0, d_arr.shape[1], *t.inflow)
    K.accumulate(code, wbits, weighted, t.scale, lo, hi, np.empty(win.shape, np.uint8))
    if weighted:
        inner = np.empty(win.shape, np.float64)
        K.finish_weights(code, wbits, t.scale, t.include_self, lo, hi, inner)
    else:
        inner = np.ascontiguousarray(lo[1:-1, 1:-1])
        if t.include_self:
            inner[inner_code != NODATA] += np.uint64(1)
    counts = np.bincount(inner_code.ravel(), minlength=256)
    write_window(a_arr, win, inner, t.whole_shard)
    return inner.max(initial=0), (int(inner_code.size - counts[NODATA]), int(counts[OUTLET]), int(counts[SINK]))


def _flow_tiled(store, source, condition, outlets, wsrc, include_self, progress, t_start, filled_now, k,
                budget, flat_sweeps=None, scheduler="local", announce=None) -> FlowResult:
    rows, cols = store.shape
    batches = plan_batches(store, k)
    whole_shard = k == store.shard_size
    weighted = wsrc is not None
    timings = Timings()
    stats = np.zeros(3, np.int64)  # valid, outlet cells, sinks
    flat_total = 0
    with store.write_result(RESULT, attrs={"condition": condition, "outlets": outlets, "source": source}) as writer:
        d_arr, a_arr = _create(writer, weighted)
        here = scheduler == "local"
        arrays = (d_arr, a_arr) if here else tuple(f"{a.store.root}/{a.path}" for a in (d_arr, a_arr))

        def task(b, **kw) -> _Task:
            return _Task(store if here else str(store.path), source, b.window, arrays, whole_shard, outlets, **kw)

        def run(func, items, what):
            with progress_bar(progress, len(batches), f"flow: {what}", unit="batch") as bar:
                yield from imap_shards(func, items, scheduler, progress=bar, announce=announce)

        # 1. directions of each window, its flat cells listed (while the lists fit the budget)
        with timings.phase("directions"):
            parts, holding, perimeter = [], [], []
            compact = not flat_sweeps
            room = max(0, budget - _tiled_bytes(rows, cols, k * store.tile_size, store.dtype.itemsize,
                                                store.tile_size * store.shard_size, weighted))
            items = (task(b, flat_lists=compact) for b in batches)  # lazy: ``compact`` as it stands
            for b, (n, perim, lists) in zip(batches, run(_directions_task, items, "directions")):
                if not n:
                    continue
                holding.append(b)
                flat_total += n
                perimeter.append(perim)
                if compact and flat_total * FLAT_BYTES > room and flat_sweeps is None:
                    compact, parts = False, []  # too many flat cells for the list: window sweeps
                if compact:
                    parts.append(lists)

        # 2. flats: Barnes 2014 over the compact list, windows holding flat cells rewritten
        with timings.phase("flats"):
            n_flat_routed = 0
            if holding and not compact:  # the sweeps run here (one window after another by nature)
                pid = np.sort(np.concatenate(perimeter))
                if len(pid) * 24 > room:
                    raise InputError(f"the flats' window edges hold {len(pid):,} cells: {format_bytes(len(pid) * 24)}, "
                                     f"more than the memory budget {format_bytes(budget)} leaves beside its windows "
                                     f"({format_bytes(room)}; raise --memory)")
                del perimeter
                n_flat_routed = _sweep_flats(store, source, d_arr, holding, pid, whole_shard, progress, timings)
            elif parts:
                ids = np.concatenate([p[0] for p in parts])
                order = np.argsort(ids, kind="stable")
                ids = ids[order]
                high = np.concatenate([p[1] for p in parts])[order]
                low = np.concatenate([p[2] for p in parts])[order]
                del parts, order
                codes = np.empty(len(ids), np.uint8)
                K.flats_compact(ids, high, low, rows, cols, codes)
                n_flat_routed = int(np.count_nonzero(codes < 8))
                del high, low
                items = (task(b, flats=_rows_of(ids, codes, b.window, cols, 0)) for b in holding)
                for _ in run(_flat_codes_task, items, "flats"):
                    pass
                del ids, codes

        # 3. accumulation: windows alone, the exits solved together, windows again
        weights_of = (lambda b: _checked_weights(wsrc, b.window, _codes_valid(d_arr, b.window))) if weighted \
            else (lambda b: None)
        scale = _tiled_scale(wsrc, d_arr, batches, rows * cols) if weighted else 0
        with timings.phase("boundary"):
            links = list(run(_links_task, (task(b, weights=weights_of(b), scale=scale) for b in batches),
                             "accumulation (tiles)"))
            exit_id, exit_to, exit_v, entry_id, entry_link = (np.concatenate([p[i] for p in links]) for i in range(5))
            del links
            o = np.argsort(exit_id, kind="stable")
            exit_id, exit_to, exit_v = exit_id[o], exit_to[o], exit_v[o]
            o = np.argsort(entry_id, kind="stable")
            entry_id, entry_link = entry_id[o], entry_link[o]
            v = K.solve_exits(exit_id, exit_to, exit_v, entry_id, entry_link)
            del exit_to, exit_v, entry_id, entry_link
        with timings.phase("accumulation"):
            peak = np.float64(0) if weighted else np.uint64(0)
            items = (task(b, weights=weights_of(b), scale=scale, inflow=_rows_of(exit_id, v, b.window, cols, 1),
                          include_self=include_self) for b in batches)
            for top, counts in run(_final_task, items, "accumulation (final)"):
                peak = max(peak, top)
                stats += counts
        result = _result(store, condition, outlets, wsrc, include_self, "tiled", "cpu", t_start, filled_now,
                         int(stats[0]), (int(stats[1]), int(stats[2]), n_flat_routed), peak, timings, k)
        writer.attrs.update(result.attrs())
    return result


def _tiled_scale(wsrc, d_arr, batches, cells: int) -> int:
    """The weights' fixed-point scale (:func:`._cpu.weight_scale`) of the whole raster: a pass over
    the windows' weights at their valid cells (the same scale for every tiling)."""
    top, low = -100000, None
    for b in batches:
        code = read_window(d_arr, b.window, False)
        w = _checked_weights(wsrc, b.window, code != NODATA)
        t, lw, any_ = K.weight_range(np.ascontiguousarray(w).view(np.uint64), code)
        if any_:
            top, low = max(top, int(t)), int(lw) if low is None else min(low, int(lw))
    return K.checked_scale(cells, top, low)


def _rows_of(ids: np.ndarray, values: np.ndarray, win: Window, cols: int, halo: int) -> tuple:
    """The entries of the sorted cell ids ``ids`` (and their ``values``) in the rows of ``win``
    grown by ``halo``: views, what a window's task needs of a boundary solve."""
    lo, hi = np.searchsorted(ids, [(win.r0 - halo) * cols, (win.r1 + halo) * cols])
    return ids[lo:hi], values[lo:hi]


def _codes_valid(d_arr, win: Window) -> np.ndarray:
    """The valid cells of ``win`` by its codes (written in phase 1)."""
    return read_window(d_arr, win, False) != NODATA


def _sweep_flats(store, source, d_arr, holding, pid, whole_shard, progress, timings) -> int:
    """Barnes 2014 out of core: both BFS solved window by window from their halos' distances (the
    flat cells on the windows' edges, ``pid``), sweeping the windows forward and backward until no
    edge distance changes (each sweep carries every distance at least one window further, so the
    sweeps end; the fixpoint is the BFS distance), then each window's flat codes written. Returns
    the number of flat cells routed (not SINK)."""
    rows, cols = store.shape
    p_tow, p_away = np.zeros(len(pid), np.int64), np.zeros(len(pid), np.int64)

    def window(b):
        win = b.window
        code = read_halo(d_arr, win, 1, NODATA, store.shape)
        vals = store.read(win, source, halo=1)
        ok = store.valid(vals)
        _outside_false(ok, win, rows, cols, 1)
        return win, code, vals, ok

    def solve(win, code, vals, ok):
        shape = win.shape
        tow, away = np.empty(shape, np.int64), np.empty(shape, np.int64)
        queue, inq = np.empty(shape[0] * shape[1], np.int64), np.empty(shape, np.bool_)
        K.window_bfs(code, vals, ok, win.r0, win.c0, cols, pid, p_tow, True, tow, queue, inq)
        K.window_bfs(code, vals, ok, win.r0, win.c0, cols, pid, p_away, False, away, queue, inq)
        return tow, away

    sweeps = 0
    changed = True
    with progress_bar(progress, len(holding), "flow: flats (sweeps)", unit="batch") as bar:
        while changed:
            changed = False
            for b in (holding if sweeps % 2 == 0 else holding[::-1]):
                win, code, vals, ok = window(b)
                tow, away = solve(win, code, vals, ok)
                ids = K.perimeter_flats(code[1:-1, 1:-1], win.r0, win.c0, cols)
                changed |= K.update_perimeter(pid, p_tow, ids, tow, win.r0, win.c0, cols)
                changed |= K.update_perimeter(pid, p_away, ids, away, win.r0, win.c0, cols)
            sweeps += 1
            bar.total = len(holding) * (sweeps + 1)
            bar.update(len(holding))
    routed = 0
    with progress_bar(progress, len(holding), "flow: flats (write)", unit="batch") as bar:
        for b in holding:
            win, code, vals, ok = window(b)
            tow, away = solve(win, code, vals, ok)
            out = np.ascontiguousarray(code[1:-1, 1:-1])
            K.window_flat_codes(code, vals, ok, win.r0, win.c0, cols, pid, p_tow, p_away, tow, away, out)
            routed += int(np.count_nonzero((code[1:-1, 1:-1] == K.UNRESOLVED) & (out < 8)))
            write_window(d_arr, win, out, whole_shard)
            bar.update(1)
    timings["flat_sweeps"] = sweeps
    return routed


def _outside_false(ok, win: Window, rows: int, cols: int, halo: int) -> None:
    """No vertex outside the DEM (a read's fill value may be a valid integer)."""
    if win.r0 - halo < 0:
        ok[: halo - win.r0] = False
    if win.c0 - halo < 0:
        ok[:, : halo - win.c0] = False
    if win.r1 + halo > rows:
        ok[ok.shape[0] - (win.r1 + halo - rows):] = False
    if win.c1 + halo > cols:
        ok[:, ok.shape[1] - (win.c1 + halo - cols):] = False


def _gpu_host_bytes(store, weighted: bool) -> int:
    """Host memory of the GPU route: every reader and writer thread holds one shard -- its values as
    read and decoded, its weights, the codes and counts brought back and their encoding (the DEM
    itself never lies whole on the host: :func:`upload_held`, ``write_held`` by bands)."""
    side = store.tile_size * store.shard_size
    cells = min(side, store.shape[0]) * min(side, store.shape[1])
    return (threads(store) * cells * (2 * store.dtype.itemsize + (16 if weighted else 0) + 18)
            + pinned_host_bytes(store, (1, 8)))  # the pinned bands of codes and accumulation on their way out


def _gpu_misfit(store, weighted: bool, budget: int) -> str | None:
    """Why the GPU routing cannot take ``store`` (None: it can): GPU memory, or the host buffers it
    needs beyond the budget (issue 34: ``--memory`` holds on every device)."""
    try:
        from . import _gpu
    except ImportError as e:
        return f"the GPU kernels are not available ({e})"
    rows, cols = store.shape
    host = _gpu_host_bytes(store, weighted)
    if host > budget:
        return f"its host buffers need about {format_bytes(host)}, beyond the budget of {format_bytes(budget)}"
    need = _gpu.device_bytes(rows, cols, store.dtype, weighted, _gpu_band(store))
    free = gpu_free_bytes()
    if need > free:
        return f"it needs about {format_bytes(need)} of GPU memory, {format_bytes(free)} free"
    return None


def _gpu_short(e: Exception) -> str:
    """Why the GPU route stopped, if for its memory (nothing written: the result is staged); any
    other error raised again."""
    import cupy

    from ._gpu import GpuMemoryShort

    if isinstance(e, GpuMemoryShort):
        return str(e)
    if isinstance(e, cupy.cuda.memory.OutOfMemoryError):
        return "the GPU ran out of memory"
    raise e


def _free_gpu_pool() -> None:
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()


def _flow_gpu(store, source, condition, outlets, wsrc, include_self, progress, t_start, filled_now) -> FlowResult:
    """The whole DEM routed on the GPU (:mod:`._gpu`): read into it shard by shard, the accumulation
    finished a band of shard rows at a time, each band's shards written from it in threads (the GPU
    holds one band of the result, the host a shard a thread)."""
    import cupy

    from . import _gpu

    rows, cols = store.shape
    timings = Timings()
    with timings.phase("read"):
        with progress_bar(progress, 1, "flow: read", unit="DEM") as bar:
            z_d, w_d = upload_held(store, source, wsrc, timings=timings)
            bar.update(1)
    with timings.phase("gpu"):
        dx, dy = store.metric_cell_size
        code_d, unresolved = _gpu.routed(z_d, store.valid(z_d), float(dx), float(dy), outlets)
        del z_d
        cupy.get_default_memory_pool().free_all_blocks()  # the directions' scratch, before the accumulation's
        counts = cupy.bincount(code_d.ravel(), minlength=256).get()
    n_valid = rows * cols - int(counts[NODATA])
    code_stats = (int(counts[OUTLET]), int(counts[SINK]), unresolved - int(counts[SINK]))
    band = _gpu_band(store)
    peak = np.float64(0) if wsrc is not None else np.uint64(0)
    with store.write_result(RESULT, attrs={"condition": condition, "outlets": outlets, "source": source}) as writer:
        d_arr, a_arr = _create(writer, wsrc is not None)
        bands, held = _gpu.accumulation_bands(code_d, w_d, include_self, band), [0, 0, None]

        def outputs(r0, r1):  # a shard row's codes and accumulation, the next band accumulated when reached
            nonlocal peak
            if r1 > held[1]:
                with timings.phase("gpu"):
                    held[:] = next(bands)
                    peak = max(peak, held[2].max().get())
            return [code_d[r0:r1], held[2][r0 - held[0] : r1 - held[0]]]

        with progress_bar(progress, 2 * len(list(store.shards())), "flow: accumulation and write", unit="shard") as bar:
            gpu_before, t0 = timings.get("gpu", 0.0), time.perf_counter()
            write_device(store, [d_arr, a_arr], outputs, bar.update, timings)
            timings.add("write", time.perf_counter() - t0 - (timings["gpu"] - gpu_before))  # the bands' own
        del w_d
        result = _result(store, condition, outlets, wsrc, include_self, "incore", "gpu", t_start, filled_now, n_valid,
                         code_stats, peak, timings)
        writer.attrs.update(result.attrs())
    return result


def _gpu_band(store) -> int:
    """Rows of the GPU's accumulation bands: a shard's side (each band writes whole shards), at
    least a GPU tile's (:data:`._gpu.TILE`; both powers of two)."""
    from ._gpu import TILE

    return max(store.tile_size * store.shard_size, TILE)


def _write_incore(store, source, condition, outlets, wsrc, include_self, device, t_start, filled_now, n_valid, code,
                  acc, code_stats, timings, peak) -> FlowResult:
    """Write the codes and accumulation held in memory (``code``, ``acc``: a shard's slices -> its
    block) as the ``flow`` result, with its attributes."""
    with store.write_result(RESULT, attrs={"condition": condition, "outlets": outlets, "source": source}) as writer:
        with timings.phase("write"):
            d_arr, a_arr = _create(writer, wsrc is not None)
            write_held(store, (d_arr, code), (a_arr, acc))
        result = _result(store, condition, outlets, wsrc, include_self, "incore", device, t_start, filled_now, n_valid,
                         code_stats, peak, timings)
        writer.attrs.update(result.attrs())
    return result


def read_flow(store) -> dict[str, np.ndarray]:
    """The ``flow`` result arrays of ``store`` in memory (small stores, tests)."""
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    return {n: np.asarray(store.group[f"{RESULT}/{n}"][...]) for n in ("direction", "accumulation")}

