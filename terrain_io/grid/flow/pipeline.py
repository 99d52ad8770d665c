"""Flow directions and accumulation of a store's DEM, in core or out of core (``terrain flow``).

Definitions: :mod:`.codes` and :mod:`._cpu` (D8 steepest descent; flats by Barnes, Lehman & Mulla
2014; accumulation counting the cell itself, or weights summed in a fixed donor order). The source
is ``fill/elevation`` (``condition="fill"``: the stored fill when it was made with the same outlets
from this elevation, else ``terrain fill`` runs first) or ``elevation`` (``"none"``).

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

Counts are integers: the same bytes in core and out of core, for every tile size and budget.
Weighted sums are the same bits in core for every tiling; out of core the exits' totals are added
in another order (relative differences of a few ulp, ~1e-15).
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
from ...parallel import check_scheduler
from ...progress import progress_bar
from ...store import TerrainStore, Window, read_window, write_window
from ...timings import Timings
from ..fill._cpu import outlets as outlet_cells
from ..fill._tiled import OUTLETS, write_held
from ..tiling import check_side, plan, plan_batches
from ..sssp._pipeline_cpu import steps_of
from . import _cpu as K
from .array import DIRECTION_CODES, check_weights
from .codes import NODATA, OUTLET, SINK

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


def flow(store, *, condition: str = "fill", outlets: str = "edge+nodata", weights=None, include_self: bool = True,
         device: str = "auto", memory=None, progress: bool = True, scheduler: str | None = "local",
         window_tiles: int | None = None, flat_sweeps: bool | None = None, announce=None) -> FlowResult:
    """Route the DEM of ``store``: writes ``flow/direction`` (uint8 codes, :mod:`.codes`) and
    ``flow/accumulation`` (uint64 cells, or float64 sums of ``weights``; 0 at nodata).

    ``condition``: ``fill`` (route the filled DEM; fill first when needed) or ``none``;
    ``outlets``: ``edge+nodata`` or ``edge``; ``weights``: a raster file, an array of the store or a
    NumPy array of the DEM's shape (finite, >= 0 at valid cells); ``include_self``: count the cell
    itself; ``device``: ``auto|cpu|gpu`` (the GPU routes in core); ``memory``: the budget (default
    half the free RAM); ``scheduler``: ``local`` (shard tasks elsewhere are not implemented for
    flow); ``window_tiles``: force the out-of-core pipeline with windows of this many tiles a side
    (a power of two <= the shard size; tests, benchmarks); ``flat_sweeps``: out of core, solve the
    flats by window sweeps (True) or over the compact list (False; default: the list when it fits).
    """
    t_start = time.perf_counter()
    return_freed_memory_to_os()
    if condition not in CONDITIONS:
        raise InputError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    if outlets not in OUTLETS:
        raise InputError(f"outlets must be one of {', '.join(OUTLETS)}, got {outlets!r}")
    if check_scheduler(scheduler) != "local":
        raise InputError("flow runs in this process: use --scheduler local")
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
        dev = resolve_device(device)
        if dev == "gpu" and window_tiles is None:
            why = _gpu_misfit(store, wsrc is not None, budget)
            if why is None:
                return _flow_gpu(store, source, condition, outlets, wsrc, include_self, progress, t_start, filled_now)
            if (device or "auto").lower() == "gpu":
                warnings.warn(f"flow: {why}: routed on the CPU instead", TerrainNote, stacklevel=2)
        rows, cols = store.shape
        isz = store.dtype.itemsize
        incore_need = rows * cols * (max(isz, 8 if wsrc else 0) + 27)
        if window_tiles is None:  # a window and the boundary lists; the flats' lists get what is left
            side = store.tile_size * store.shard_size
            chosen = plan(store, budget, "flow", lambda k: _tiled_bytes(rows, cols, k * store.tile_size, isz, side),
                          incore_need)
            if chosen.held:
                return _flow_incore(store, source, condition, outlets, wsrc, include_self, progress, t_start,
                                    filled_now)
        k = window_tiles or chosen.side
        return _flow_tiled(store, source, condition, outlets, wsrc, include_self, progress, t_start, filled_now, k,
                           budget, flat_sweeps)
    finally:
        if wsrc is not None:
            wsrc.close()


def _tiled_bytes(rows: int, cols: int, side: int, isz: int, shard_side: int) -> int:
    """The out-of-core pipeline with windows of ``side`` cells: one window, and the exits (24 bytes)
    and entries (16 bytes) of every window's edge cells, twice while they are gathered and sorted;
    a window that is part of a shard is written through zarr, which rewrites the shard: count the
    shard of both results (1 + 8 bytes a cell; measured +9.8 MiB writing the codes of 256^2 windows
    into a 2048^2 shard)."""
    edge_cells = 2 * (rows * -(-cols // side) + cols * -(-rows // side))
    rewrite = 0 if side >= shard_side else min(shard_side, rows) * min(shard_side, cols) * 9
    return _window_bytes(side, isz) + edge_cells * 80 + rewrite


def _window_bytes(side: int, isz: int) -> int:
    """Host memory of one window: its values with a two-cell halo, masks, codes, accumulation,
    weights, the in-window path scratch."""
    return (side + 4) ** 2 * (isz + 2) + (side + 2) ** 2 * 9 + side * side * 26


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
                      include_self=include_self, seconds=time.perf_counter() - t_start, filled_now=filled_now,
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
        ring = K.ringed(code, NODATA)
        wts, zero = (np.ones((1, 1), np.uint64), np.uint64(0)) if w is None else (w, np.float64(0))
        acc = np.zeros((rows + 2, cols + 2), wts.dtype)
        left = K.accumulate(ring, wts, w is not None, acc, zero, np.empty((rows, cols), np.uint8))
        del ring
        if left:
            raise InputError(f"the flow directions have cycles: {left:,} cells never drain")  # not for our codes
        inner = acc[1:-1, 1:-1]
        if include_self:
            _add_self(inner, code, wts, w is not None)
    return _write_incore(store, source, condition, outlets, wsrc, include_self, "cpu", t_start, filled_now, n_valid,
                         code, inner, _code_stats(code, unresolved), timings)


def _add_self(inner, code, wts, weighted) -> None:
    """v = s + w at valid cells, in place, a band of rows at a time (no full-size temporaries)."""
    for r in range(0, inner.shape[0], 256):
        sl = slice(r, r + 256)
        ok = code[sl] != NODATA
        if weighted:
            inner[sl][ok] += wts[sl][ok]
        else:
            inner[sl][ok] += np.uint64(1)


def _flat_cells(vals, valid, code) -> np.ndarray:
    """Cells routed by the flat rule: valid, no lower valid neighbour, not OUTLET (their codes 0..7
    point at an equal neighbour): counted for the summary."""
    rows, cols = code.shape
    pad = np.pad(vals, 1, mode="edge") if vals.size else vals
    okp = np.pad(valid, 1)
    lower = np.zeros(code.shape, bool)
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if dr or dc:
                nb = pad[1 + dr : 1 + dr + rows, 1 + dc : 1 + dc + cols]
                lower |= okp[1 + dr : 1 + dr + rows, 1 + dc : 1 + dc + cols] & (nb < vals)
    return valid & ~lower & (code < 8)


def _code_stats(code, unresolved: int) -> tuple[int, int, int]:
    """(outlet cells, sinks, flat cells routed: the flat cells that are not SINK)."""
    counts = np.bincount(code.ravel(), minlength=256)
    return int(counts[OUTLET]), int(counts[SINK]), unresolved - int(counts[SINK])


def _read_halo(arr, win: Window, halo: int, fill, shape) -> np.ndarray:
    """Cells of ``win`` grown by ``halo`` from a zarr array; outside it ``fill``."""
    rows, cols = shape
    r0, r1, c0, c1 = win.r0 - halo, win.r1 + halo, win.c0 - halo, win.c1 + halo
    out = np.full((r1 - r0, c1 - c0), fill, arr.dtype)
    rr0, rr1, cc0, cc1 = max(r0, 0), min(r1, rows), max(c0, 0), min(c1, cols)
    out[rr0 - r0 : rr1 - r0, cc0 - c0 : cc1 - c0] = arr[rr0:rr1, cc0:cc1]
    return out


def _flow_tiled(store, source, condition, outlets, wsrc, include_self, progress, t_start, filled_now, k,
                budget, flat_sweeps=None) -> FlowResult:
    rows, cols = store.shape
    batches = plan_batches(store, k)
    whole_shard = k == store.shard_size
    steps = steps_of(*map(float, store.metric_cell_size))
    drains = outlets == "edge+nodata"
    weighted = wsrc is not None
    timings = Timings()
    stats = np.zeros(3, np.int64)  # valid, outlet cells, sinks
    flat_total = 0
    with store.write_result(RESULT, attrs={"condition": condition, "outlets": outlets, "source": source}) as writer:
        d_arr, a_arr = _create(writer, weighted)

        # 1. directions of each window, its flat cells listed
        with timings.phase("directions"):
            parts, holding, perimeter = [], [], []
            compact = not flat_sweeps
            room = max(0, budget - _tiled_bytes(rows, cols, k * store.tile_size, store.dtype.itemsize,
                                                store.tile_size * store.shard_size))
            with progress_bar(progress, len(batches), "flow: directions", unit="batch") as bar:
                for b in batches:
                    win = b.window
                    block = store.read(win, source, halo=2)
                    ok = store.valid(block)
                    _outside_false(ok, win, rows, cols, 2)
                    outl = outlet_cells(ok, win.r0 - 1, win.c0 - 1, rows, cols, drains)
                    h, w = win.shape
                    ring = np.empty((h + 2, w + 2), np.uint8)
                    K.d8(block, ok, outl, steps, ring)
                    inner = ring[1:-1, 1:-1]
                    n = int(np.count_nonzero(inner == K.UNRESOLVED))
                    if n:
                        holding.append(b)
                        flat_total += n
                        perimeter.append(K.perimeter_flats(inner, win.r0, win.c0, cols))
                        if compact and flat_total * FLAT_BYTES > room and flat_sweeps is None:
                            compact, parts = False, []  # too many flat cells for the list: window sweeps
                        if compact:
                            gid, high, low = np.empty(n, np.int64), np.empty(n, np.bool_), np.empty(n, np.uint8)
                            K.flat_cells(block, ok, ring, win.r0, win.c0, cols, gid, high, low)
                            parts.append((gid, high, low))
                    write_window(d_arr, win, inner, whole_shard)
                    bar.update(1)

        # 2. flats: Barnes 2014 over the compact list, windows holding flat cells rewritten
        with timings.phase("flats"):
            n_flat_routed = 0
            if holding and not compact:
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
                with progress_bar(progress, len(holding), "flow: flats", unit="batch") as bar:
                    for b in holding:
                        code = read_window(d_arr, b.window, whole_shard)
                        K.set_codes(code, b.window.r0, b.window.c0, cols, ids, codes)
                        write_window(d_arr, b.window, code, whole_shard)
                        bar.update(1)
                del ids, codes

        # 3. accumulation: windows alone, the exits solved together, windows again
        with timings.phase("boundary"):
            zero = np.float64(0) if weighted else np.uint64(0)
            unit = np.ones((1, 1), np.uint64)
            exits, entries = [], []
            with progress_bar(progress, len(batches), "flow: accumulation (tiles)", unit="batch") as bar:
                for b in batches:
                    code = _read_halo(d_arr, b.window, 1, NODATA, store.shape)
                    wts = _checked_weights(wsrc, b.window, code[1:-1, 1:-1] != NODATA) if weighted else unit
                    acc = np.zeros(code.shape, np.float64 if weighted else np.uint64)
                    ei, et, ev, ni, nl = K.tile_links(code, wts, weighted, acc, zero, b.window.r0, b.window.c0, cols)
                    exits.append((ei, et, ev))
                    entries.append((ni, nl))
                    bar.update(1)
            cat = lambda parts, i: np.concatenate([p[i] for p in parts])
            exit_id, exit_to, exit_v = cat(exits, 0), cat(exits, 1), cat(exits, 2)
            entry_id, entry_link = cat(entries, 0), cat(entries, 1)
            del exits, entries
            o = np.argsort(exit_id, kind="stable")
            exit_id, exit_to, exit_v = exit_id[o], exit_to[o], exit_v[o]
            o = np.argsort(entry_id, kind="stable")
            entry_id, entry_link = entry_id[o], entry_link[o]
            v = K.solve_exits(exit_id, exit_to, exit_v, entry_id, entry_link)
            del exit_to, exit_v, entry_id, entry_link
        with timings.phase("accumulation"):
            peak = zero
            with progress_bar(progress, len(batches), "flow: accumulation (final)", unit="batch") as bar:
                for b in batches:
                    win = b.window
                    code = _read_halo(d_arr, win, 1, NODATA, store.shape)
                    inner_code = code[1:-1, 1:-1]
                    wts = _checked_weights(wsrc, win, inner_code != NODATA) if weighted else unit
                    acc = np.zeros(code.shape, np.float64 if weighted else np.uint64)
                    K.set_inflows(code, acc, win.r0, win.c0, cols, exit_id, v)
                    K.accumulate(code, wts, weighted, acc, zero, np.empty(win.shape, np.uint8))
                    inner = np.ascontiguousarray(acc[1:-1, 1:-1])
                    if include_self:
                        _add_self(inner, inner_code, wts, weighted)
                    peak = max(peak, inner.max(initial=zero))
                    counts = np.bincount(inner_code.ravel(), minlength=256)
                    stats += (int(inner_code.size - counts[NODATA]), int(counts[OUTLET]), int(counts[SINK]))
                    write_window(a_arr, win, inner, whole_shard)
                    bar.update(1)
        result = _result(store, condition, outlets, wsrc, include_self, "tiled", "cpu", t_start, filled_now,
                         int(stats[0]), (int(stats[1]), int(stats[2]), n_flat_routed), peak, timings, k)
        writer.attrs.update(result.attrs())
    return result


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
        code = _read_halo(d_arr, win, 1, NODATA, store.shape)
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


def _gpu_host_bytes(rows: int, cols: int, itemsize: int, weighted: bool) -> int:
    """Host memory of the in-core GPU route: the DEM and its mask, the codes and counts brought back,
    the flat count's scratch, the write (26 bytes a float32 cell measured at 16384^2 above the CUDA
    context: 7.6 GB peak RSS, benchmarks/RESULTS.md "terrain flow --device gpu on the H100"), and the
    weights."""
    return rows * cols * (itemsize + 22 + (16 if weighted else 0))


def _gpu_misfit(store, weighted: bool, budget: int) -> str | None:
    """Why the in-core GPU routing cannot take ``store`` (None: it can): GPU memory, or the host
    buffers it needs beyond the budget (issue 34: ``--memory`` holds on every device)."""
    try:
        from . import _gpu
    except ImportError as e:
        return f"the GPU kernels are not available ({e})"
    rows, cols = store.shape
    host = _gpu_host_bytes(rows, cols, store.dtype.itemsize, weighted)
    if host > budget:
        return f"its host buffers need about {format_bytes(host)}, beyond the budget of {format_bytes(budget)}"
    need = _gpu.device_bytes(rows, cols, store.dtype, weighted)
    free = gpu_free_bytes()
    if need > free:
        return f"it needs about {format_bytes(need)} of GPU memory, {format_bytes(free)} free"
    return None


def _flow_gpu(store, source, condition, outlets, wsrc, include_self, progress, t_start, filled_now) -> FlowResult:
    """The whole DEM routed on the GPU (:mod:`._gpu`), read and written on the host."""
    import cupy

    from . import _gpu

    rows, cols = store.shape
    whole = Window(0, rows, 0, cols)
    timings = Timings()
    with timings.phase("read"):
        vals = store.read(whole, source)
        valid = store.valid(vals)
    with timings.phase("gpu"):
        dx, dy = store.metric_cell_size
        code_d = _gpu.directions(cupy.asarray(vals), cupy.asarray(valid), float(dx), float(dy), outlets)
        w = _checked_weights(wsrc, whole, valid) if wsrc is not None else None
        acc_d = _gpu.accumulation(code_d, None if w is None else cupy.asarray(w), include_self)
        code, acc = code_d.get(), acc_d.get()
        del code_d, acc_d
        flat = int(np.count_nonzero(_flat_cells(vals, valid, code))) + int(np.count_nonzero(code == SINK))
        n_valid = int(np.count_nonzero(valid))
        del vals, valid
    return _write_incore(store, source, condition, outlets, wsrc, include_self, "gpu", t_start, filled_now, n_valid,
                         code, acc, _code_stats(code, flat), timings)


def _write_incore(store, source, condition, outlets, wsrc, include_self, device, t_start, filled_now, n_valid, code,
                  acc, code_stats, timings) -> FlowResult:
    """Write the codes and accumulation held in memory as the ``flow`` result, with its attributes."""
    with store.write_result(RESULT, attrs={"condition": condition, "outlets": outlets, "source": source}) as writer:
        with timings.phase("write"):
            d_arr, a_arr = _create(writer, wsrc is not None)
            write_held(store, (d_arr, lambda s: code[s]), (a_arr, lambda s: acc[s]))
        result = _result(store, condition, outlets, wsrc, include_self, "incore", device, t_start, filled_now, n_valid,
                         code_stats, acc.max(initial=0), timings)
        writer.attrs.update(result.attrs())
    return result


def read_flow(store) -> dict[str, np.ndarray]:
    """The ``flow`` result arrays of ``store`` in memory (small stores, tests)."""
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    return {n: np.asarray(store.group[f"{RESULT}/{n}"][...]) for n in ("direction", "accumulation")}

