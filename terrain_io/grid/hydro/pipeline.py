"""Watersheds, basins, streams and HAND of a store routed by ``terrain flow``, in core or out of core.

In core (the arrays and scratch fit the memory budget, ``BYTES`` a cell): each command reads
``flow/direction`` (and ``flow/accumulation``, and for HAND the elevations the flow was routed on:
``flow``'s ``source`` attribute) whole, shard by shard in parallel threads, runs the kernels of
:mod:`._cpu`, and writes its result group atomically (``TerrainStore.write_result``), shard by
shard in parallel threads.

On the GPU (``device="gpu"``, the arrays fit its memory): the arrays are read straight into it shard
by shard in threads (``terrain flow``'s reader), computed by :mod:`._gpu`, counted there, and written
from it shard by shard in threads; the host holds a shard a thread (and, for vectors, the codes), so
the GPU route keeps to a ``--memory`` far below the DEM's size.

Out of core: windows of k x k tiles, the largest the budget holds (:func:`..tiling.plan`), values
carried along the flow forest tile by tile with a boundary solve between (:mod:`.tiled`): the same
bytes as in core. Polygons (``-o`` of watershed and basins) are traced by GDAL's polygonize on the
label raster in memory where it fits the budget, else on a GeoTIFF of it written shard by shard into a
scratch folder of the store (:func:`write_polygons`): the same features, each written as it is traced
(:mod:`.polygons`).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...backend import gpu_free_bytes, is_cupy, resolve_device, to_host
from ...errors import InputError, TerrainNote
from ...memory import format_bytes, memory_budget
from ...parallel import Prefetch, check_scheduler, run_on_worker
from ...pinned import host_bytes as pinned_host_bytes, write_held
from ...progress import progress_bar
from ...store import TerrainStore, Window, read_shard, shard_layout
from ...tables import Table, write_csv
from ...timings import Timings
from ...vectors import DRIVERS, check_output, feature_stream
from ..flow.codes import NODATA
from ..flow.upload import threads as _threads, upload_held
from ..tiling import check_side, plan
from . import start_link_kernels
from .table import BASIN_BYTES, basin_table

if TYPE_CHECKING:
    from collections.abc import Mapping

    from . import tiled
    from ._cpu import Links

# host bytes a cell at the peak: codes 1, accumulation 8, order 8, donor counts 1, labels 4 (basins: no
# accumulation, its 8 the table's 16 bytes a basin up to a basin every other cell, :func:`_table_room`;
# + the network's mask, donors, Strahler, Shreve, link, scratch 12; with vectors a second order 8 and the
# elevations 8; + HAND's elevation 8, drainage elevation 8, height 4, link 4)
BYTES = {"watershed": 22, "basins": 22, "streams": 42, "streams+vectors": 60, "hand": 66}
CPU_BASIN_BYTES = 14  # the CPU kernel's arrays a cell while it makes the basin table (BYTES less the accumulation)
# out of core, bytes a cell of the outputs written (a shard of them is rewritten by zarr)
OUT_BYTES = {"watershed": 4, "basins": 4, "streams": 9, "streams+vectors": 9, "hand": 8}
POLYGON_BYTES = 4  # the label raster traced in memory: the labels (GDAL reads them in place)
POLYGON_CACHE = 16 << 20  # GDAL's block cache while the label raster is written to disk and traced from there
# the GPU route's host: a shard a thread (read and decoded up to 8 bytes a cell, a result's shard copied
# off the GPU and encoded), and what it holds whole (the codes, for the links' walks)
GPU_SHARD_BYTES = 24
GPU_HELD_BYTES = {"streams+vectors": 1}
GPU_OUT_BYTES = 9  # a result group's cells on their way out of the GPU (pinned bands): streams' order, magnitude, link
UNITS = ("cells", "m2")


@dataclass
class HydroResult:
    """What a command computed: its one summary line, the result group's attributes and, for
    basins and streams, a table (column name -> 1-D array, one row per basin or link): basins' a
    :class:`terrain_io.tables.Table` holding 16 bytes a basin, its other columns derived on access."""

    line: str
    attrs: dict
    table: Mapping | None = None


def write_table(result: HydroResult, path, progress: bool = False) -> Path:
    """The result's table as CSV (:func:`terrain_io.tables.write_csv`: a block of rows at a time, under a
    temporary name renamed when complete)."""
    return write_csv(result.table, path, progress)


def _task(args) -> HydroResult:
    """One hydrology command run whole as a Dask task (:func:`_schedulable`); its table already
    written there, the result comes back without it."""
    name, path, positional, options = args
    return dataclasses.replace(globals()[name](path, *positional, **options), table=None)


def _schedulable(command):
    """``command`` with ``scheduler`` (``local``, ``threads``, ``processes``, ``local-cuda`` or an
    address, :mod:`terrain_io.parallel`), ``announce`` and ``table`` (a CSV path for the result's
    table, :func:`write_table`: basins and streams). On a Dask scheduler the whole command runs as one task on a worker
    -- with ``local-cuda`` on that worker's own GPU and within its ``memory``, as flow's GPU route
    does -- and writes its outputs there (the store's arrays, ``vectors``, the table): nothing large
    comes back, and the result comes without its table. The same bytes on every scheduler."""

    @functools.wraps(command)
    def run(store, *args, scheduler: str | None = "local", announce=None, table=None, progress: bool = True,
            **options) -> HydroResult:
        scheduler = check_scheduler(scheduler)
        if table is not None and command.__name__ not in ("basins", "streams"):
            raise InputError(f"{command.__name__} makes no table")
        if scheduler == "local":
            result = command(store, *args, progress=progress, **options)
            if table is not None:
                write_table(result, table, progress)
            return result
        if options.get("vectors") is not None:
            check_output(options["vectors"], options.get("overwrite", False))  # here, before a worker starts
            options["vectors"] = Path(options["vectors"]).absolute()
        path = store.path if isinstance(store, TerrainStore) else Path(store)
        options.update(table=None if table is None else Path(table).absolute(), progress=False)
        return run_on_worker(_task, (command.__name__, str(path.absolute()), args, options), scheduler, announce)

    return run


def _open(store, what: str, memory, window_tiles: int | None = None, device: str | None = "auto") -> tuple[TerrainStore, "tiled.Windows | None", "_Route"]:
    """The store, its windows out of core (None: in core) and the route of the kernels.
    ``device`` ``gpu`` (or ``auto`` with a usable GPU): in core on the GPU where its memory holds the
    arrays and the budget the host's shards (:func:`_gpu_misfit`), else the CPU (with one note when
    ``gpu`` was asked for). ``window_tiles`` forces out of core
    on the CPU with windows of that many tiles a side (tests, benchmarks)."""
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    if "flow/direction" not in store.results():
        raise InputError(f"{store.path}: no flow directions: run terrain flow {store.path} first")
    rows, cols = store.shape
    budget = memory_budget(memory)
    if resolve_device(device) == "gpu":
        why = "windows out of core are computed on the CPU" if window_tiles is not None else _gpu_misfit(
            store, what, budget)
        if why is None:
            return store, None, _Route("gpu")
        if (device or "auto").lower() == "gpu":
            warnings.warn(f"hydrology on the GPU: {why}: run on the CPU instead", TerrainNote, stacklevel=3)
    from . import tiled  # (the CPU's modules and numba: imported only for a run on the CPU)

    need = lambda k: tiled.window_need(store, k, OUT_BYTES[what])  # noqa: E731
    if window_tiles is None:
        chosen = plan(store, budget, what.replace("+", " with "), need, rows * cols * BYTES[what])
        if chosen.held:
            return store, None, _Route("cpu")
        window_tiles = chosen.side
    k = check_side(store, window_tiles)
    workers = tiled.workers_within(store, k, budget - need(k), os.cpu_count() or 1)
    return store, tiled.Windows(store, k, workers), _Route("cpu")


def _gpu_misfit(store: TerrainStore, what: str, budget: int) -> str | None:
    """Why the GPU route cannot take ``store`` (None: it can): its memory, or the host's shards
    beyond the budget (``--memory`` holds on every device)."""
    from . import _gpu

    rows, cols = store.shape
    host = _gpu_host_bytes(store, what)
    if host > budget:
        return f"its host buffers need about {format_bytes(host)}, beyond the memory budget {format_bytes(budget)}"
    need, free = _gpu.device_bytes(rows, cols, what, store.dtype), gpu_free_bytes()
    if need > free:
        return f"it needs about {format_bytes(need)} of GPU memory, {format_bytes(free)} free"
    return None


def _gpu_host_bytes(store: TerrainStore, what: str) -> int:
    """The GPU route's host buffers: a shard a reading or writing thread, the pinned bands of the
    results on their way out, what it holds whole."""
    rows, cols = store.shape
    side = store.tile_size * store.shard_size
    return _threads(store) * min(side, rows) * min(side, cols) * GPU_SHARD_BYTES + rows * cols * GPU_HELD_BYTES.get(
        what, 0) + pinned_host_bytes(store, (GPU_OUT_BYTES,))


def _method(wins) -> str:
    return "incore" if wins is None else f"tiled, windows of {wins.side} tiles"


class _Route:
    """The kernels of an in-core run and where its arrays live: :mod:`._gpu` (CuPy arrays, read
    straight into the GPU) or :mod:`._cpu` (NumPy); out of core runs on the CPU."""

    def __init__(self, device: str):
        self.device = device
        if device == "gpu":
            from . import _gpu

            self.K = _gpu
        else:
            from . import _cpu

            self.K = _cpu

    def up(self, x):
        """``x`` on the route's device."""
        if self.device == "cpu":
            return x
        import cupy

        return cupy.asarray(x)

    def load(self, store: TerrainStore, name: str, progress: bool, convert=None, timer: Timings | None = None):
        """The whole array ``name`` on the route's device, read shard by shard in threads;
        ``convert`` (dtype, function of a shard's block) applied to each shard as read (GPU);
        ``timer``: the GPU read's parts (:func:`...pinned.read_device`)."""
        if self.device == "cpu":
            return _read(store, name, progress)
        with progress_bar(progress, 1, f"read {name}", unit="array") as bar:
            out, _ = upload_held(store, name, None, convert, timer)
            bar.update(1)
        return out

    def ahead(self, pool, store: TerrainStore, name: str, progress: bool, timer: Timings):
        """:meth:`load` of ``name``: on the GPU in ``pool`` (a Future: read beside the command's next
        read, the disk's, the host's threads and the GPU's decode overlapping), on the CPU at once."""
        if self.device == "gpu":
            return pool.submit(self.load, store, name, progress, timer=timer)
        with timer.phase("read"):
            return self.load(store, name, progress)

    def network(self, store: TerrainStore, code, cells: float, progress: bool, timer: Timings, tails: bool = True,
                then=None):
        """The stream network of accumulation >= ``cells`` (``code``: the codes, or a Future of them:
        :meth:`ahead`) and (``tails``) each link's accumulation
        at its last cell. Without ``tails`` the GPU gets only the mask ``accumulation >= cells``,
        made as each shard is read (HAND: an eighth of the bytes to copy); with them, the whole
        accumulation, gathered there (reading the links' cells from the store again instead decodes
        most of its tiles twice: 32768^2 on the H100, streams' reads 11.3 s against 3.9 s) -- as
        uint32 where it counts cells of a DEM below 2^32 cells (half the bytes to copy and hold; the
        same values, given back in the stored type). ``then()``: called once the arrays are read,
        before the kernels run."""
        mask = self.device == "gpu" and not tails
        stored = store.array("flow/accumulation").dtype
        narrow = self.device == "gpu" and stored.kind == "u" and store.shape[0] * store.shape[1] < 2**32
        convert = None
        if mask:
            convert = (np.bool_, lambda b: b >= cells)
        elif narrow:
            convert = (np.uint32, lambda b: b.astype(np.uint32))
        with timer.phase("read"):
            acc = self.load(store, "flow/accumulation", progress, convert, timer)
            code = _result(code)
        if then is not None:
            then()
        with timer.phase(self.device):
            if mask:  # HAND on the GPU: the stream mask and link ids alone (no link table, no numba)
                return self.K.drainage(code, acc), None
            net = self.K.stream_network(code, acc, cells)
            return net, to_host(acc.reshape(-1)[self.up(net.links.tail)]).astype(stored) if tails else None


def _result(value):
    """``value``, or a Future's result (:meth:`_Route.ahead`)."""
    return value.result() if isinstance(value, concurrent.futures.Future) else value


def _read(store: TerrainStore, name: str, progress: bool) -> np.ndarray:
    """The whole array ``name``, its shards decoded in parallel threads into one array."""
    arr = store.array(name)
    out = np.empty(store.shape, arr.dtype)
    with progress_bar(progress, 1, f"read {name}", unit="array") as bar:
        with concurrent.futures.ThreadPoolExecutor(_threads(store)) as pool:
            list(pool.map(lambda w: store.read(w, name, out=out[w.slices]), store.shards()))
        bar.update(1)
    return out


def _threshold_cells(store: TerrainStore, threshold: float, units: str) -> float:
    if units not in UNITS:
        raise InputError(f"units must be one of {', '.join(UNITS)}, got {units!r}")
    if not np.isfinite(threshold) or not threshold > 0:
        raise InputError(f"the threshold must be a number > 0, got {threshold}")
    if units == "m2":
        dx, dy = store.metric_cell_size
        return threshold / (dx * dy)
    return threshold


def _write(store: TerrainStore, group: str, arrays: dict, attrs: dict, timer: Timings, beside=None) -> None:
    """The result group ``group`` with ``arrays`` (name -> (values, fill, attrs); NumPy, or CuPy
    written from the GPU through pinned bands: ``write_held``), atomically; its attributes get
    the run's ``timings`` (seconds by phase) so far, or, with ``beside`` (an event: the work run
    beside the write), once that is done."""
    with store.write_result(group, attrs=attrs) as writer:
        with timer.phase("write"):
            pairs = []
            for name, (values, fill, a) in arrays.items():
                arr = writer.create_array(name, values.dtype, fill, attrs=a)
                pairs.append((arr, values))
            write_held(store, *pairs, timings=timer)
        if beside is not None:
            pairs.clear()
            arrays.clear()  # (the caller holds them no longer: freed while the work beside goes on)
            beside.wait()
        writer.attrs.update(timings=timer.rounded())


def _drained(height) -> tuple[int, float]:
    """HAND's summary, counted where ``height`` lies (NumPy or CuPy): cells with a height, the highest."""
    xp = __import__("cupy") if is_cupy(height) else np
    ok = ~xp.isnan(height)
    n = int(ok.sum())
    return n, float(xp.where(ok, height, -np.inf).max()) if n else float("nan")


def snap_outlets(store: TerrainStore, cells, dist: float) -> np.ndarray:
    """ESRI Snap Pour Point: each outlet moved to the valid cell of largest accumulation whose centre
    lies within ``dist`` map units of its own; ties to the nearest, then the first in row-major
    order. Reads only each outlet's neighbourhood."""
    dx, dy = store.cell_size
    rows, cols = store.shape
    rr, rc = int(dist // dy), int(dist // dx)
    out = []
    for r, c in cells:
        r0, r1, c0, c1 = max(r - rr, 0), min(r + rr + 1, rows), max(c - rc, 0), min(c + rc + 1, cols)
        win = Window(r0, r1, c0, c1)
        code, acc = store.read(win, "flow/direction"), store.read(win, "flow/accumulation")
        gr, gc = np.mgrid[r0:r1, c0:c1]
        d2 = ((gr - r) * dy) ** 2 + ((gc - c) * dx) ** 2
        ok = (d2 <= dist * dist) & (code != NODATA)
        a = acc.astype(np.float64)
        pick = np.lexsort((gc[ok], gr[ok], d2[ok], -a[ok]))[0]
        out.append((int(gr[ok][pick]), int(gc[ok][pick])))
    return np.asarray(out, np.int64).reshape(-1, 2)


def _cell(store: TerrainStore, name: str, r: int, c: int):
    return store.read(Window(r, r + 1, c, c + 1), name)[0, 0]


@_schedulable
def watershed(store, cells, *, name: str = "default", snap: float | None = None, memory=None,
              progress: bool = True, vectors=None, overwrite: bool = False,
              window_tiles: int | None = None, device: str | None = "auto") -> HydroResult:
    """``watershed/NAME/label`` (uint32: i + 1 where a cell drains to ``cells[i]`` = (row, col)
    first); with ``snap`` (map units), the outlets are moved first (:func:`snap_outlets`) and the
    result's attributes record where to (``snapped``); ``vectors``: a polygon file of the
    watersheds (:func:`write_polygons`: outlet id, cells, area_m2, outlet row/col);
    ``window_tiles``: out of core with windows of that many tiles a side."""
    timer = Timings()
    if vectors is not None:
        check_output(vectors, overwrite)
    store, wins, route = _open(store, "watershed", memory, window_tiles, device)
    rows, cols = store.shape
    cells = np.asarray(cells, np.int64).reshape(-1, 2)
    for i, (r, c) in enumerate(cells, 1):
        if not (0 <= r < rows and 0 <= c < cols):
            raise InputError(f"outlet {i} lies outside the DEM (cell {r}, {c} of {rows:,} x {cols:,})")
        if _cell(store, "flow/direction", r, c) == NODATA:
            raise InputError(f"outlet {i} lies on nodata (cell {r}, {c})")
    given = cells
    attrs = {"outlets": given.tolist()}
    if snap is not None:
        if not np.isfinite(snap) or snap < 0:
            raise InputError(f"--snap must be a distance >= 0, got {snap}")
        cells = snap_outlets(store, cells, snap)
        for i, (r, c) in enumerate(cells, 1):
            if not _cell(store, "flow/accumulation", r, c) > 0:
                raise InputError(f"outlet {i} snapped to cell ({r}, {c}), which has no accumulation")
        attrs.update(snap=snap, snapped=cells.tolist())
    flat = cells[:, 0] * cols + cells[:, 1]
    if len(np.unique(flat)) != len(flat):
        raise InputError("two outlets lie in the same cell" + (" after snapping" if snap is not None else ""))
    dx, dy = store.metric_cell_size
    label_attrs = {"outlet_ids": "1.. in the order given; 0 none"}
    label = None
    if wins is None:
        with timer.phase("read"):
            code = route.load(store, "flow/direction", progress, timer=timer)
        with timer.phase(route.device):
            label = route.K.label_outlets(code, flat)
            del code
            xp = __import__("cupy") if is_cupy(label) else np
            counts = to_host(xp.bincount(label.ravel(), minlength=len(flat) + 1)[1:]).astype(np.int64)
        attrs.update(cells=counts.tolist(), area_m2=(counts * dx * dy).tolist())  # one entry an outlet: small
        _write(store, f"watershed/{name}", {"label": (label, 0, label_attrs)}, attrs, timer)
    else:
        with store.write_result(f"watershed/{name}", attrs=attrs) as writer:
            arr = writer.create_array("label", np.uint32, 0, attrs=label_attrs)
            from . import tiled

            counts = tiled.watershed(wins, flat, arr, progress)
            attrs.update(cells=counts.tolist(), area_m2=(counts * dx * dy).tolist())
            writer.attrs.update(attrs)
    if vectors is not None:
        with timer.phase("vectors"):
            label = _polygon_labels(store, f"watershed/{name}/label", label, memory, progress)
            write_polygons(store, label, {"cells": counts, "area_m2": counts * dx * dy, "outlet_row": cells[:, 0],
                                          "outlet_col": cells[:, 1]}, vectors, overwrite, progress)
    sec = timer.seconds()
    moved = int((cells != given).any(axis=1).sum())
    note = f" ({moved} moved by --snap)" if snap is not None else ""
    return HydroResult(f"watershed {name}: {len(flat)} outlets{note}"
                       f", {int(counts.sum()):,} cells drain to them, largest {int(counts.max()):,} cells, {sec:.2f} s "
                       f"({route.device}, {_method(wins)})", attrs)


@_schedulable
def basins(store, *, memory=None, progress: bool = True, vectors=None, overwrite: bool = False,
           window_tiles: int | None = None, device: str | None = "auto") -> HydroResult:
    """``basins/label`` (uint32, 1.. in row-major order of the basins' terminal cells) and the table
    (id, outlet row/col and centre, cells, area_m2: :func:`.table.basin_table`, 16 bytes a basin held,
    counted against the budget once the basins are known: :func:`_table_room`); ``vectors``: a polygon
    file of the basins."""
    timer = Timings()
    if vectors is not None:
        check_output(vectors, overwrite)
    store, wins, route = _open(store, "basins", memory, window_tiles, device)
    budget, cells = memory_budget(memory), store.shape[0] * store.shape[1]
    label_attrs = {"ids": "1.. in row-major order of the outlet cells; 0 nodata"}
    label = None
    if wins is None:
        with timer.phase("read"):
            code = route.load(store, "flow/direction", progress, timer=timer)
        with timer.phase(route.device):
            label, outlet, counts = route.K.label_basins(code)
            del code
        if route.device == "gpu":  # the table still on the GPU: held on the host beside the write's buffers
            _table_room(len(outlet), budget, _gpu_host_bytes(store, "basins"), "the GPU route's host buffers")
            outlet, counts = to_host(outlet), to_host(counts)
        else:  # made beside the kernel's arrays
            _table_room(len(outlet), budget, cells * CPU_BASIN_BYTES, "the basins' arrays in core")
        _write(store, "basins", {"label": (label, 0, label_attrs)}, {"basins": len(outlet)}, timer)
    else:
        with store.write_result("basins") as writer:
            arr = writer.create_array("label", np.uint32, 0, attrs=label_attrs)
            from . import tiled

            def fit(n: int) -> None:  # the final phase's windows in flight: those the table leaves room for
                need = tiled.window_need(store, wins.side, OUT_BYTES["basins"])
                room = _table_room(n, budget, need, f"windows of {wins.side} tiles")
                wins.workers = tiled.workers_within(store, wins.side, room, wins.workers)

            outlet, counts = tiled.basins(wins, arr, progress, fit)
            writer.attrs.update({"basins": len(outlet)})
    attrs = {"basins": len(outlet)}
    table = basin_table(store, outlet, counts)
    if vectors is not None:
        with timer.phase("vectors"):
            label = _polygon_labels(store, "basins/label", label, memory, progress, len(outlet) * BASIN_BYTES)
            write_polygons(store, label, table.without("id"), vectors, overwrite, progress)
    sec = timer.seconds()
    return HydroResult(f"basins: {len(outlet):,} basins, largest {int(counts.max(initial=0)):,} cells, {sec:.2f} s "
                       f"({route.device}, {_method(wins)})", attrs, table)


def _table_room(n: int, budget: int, beside: int, what: str) -> int:
    """What the budget leaves beside ``beside`` bytes (``what``) and the basin table of ``n`` basins
    (``BASIN_BYTES`` each); InputError, one line naming the least budget, where they do not fit."""
    table = n * BASIN_BYTES
    if beside + table > budget:
        raise InputError(f"memory budget {format_bytes(budget)} too small for this store's basins: their table "
                         f"({n:,} basins, {BASIN_BYTES} bytes each: {format_bytes(table)}) beside {what} "
                         f"({format_bytes(beside)}) needs --memory {format_bytes(beside + table)} or more")
    return budget - beside - table


def _network(store, what, threshold, units, memory, window_tiles, device):
    store, wins, route = _open(store, what, memory, window_tiles, device=device)
    cells = _threshold_cells(store, threshold, units)
    if store.array("flow/accumulation").attrs.get("units") != "cells" and units == "m2":
        raise InputError("--units m2 needs an accumulation of cells (this flow summed weights)")
    return store, wins, route, cells


@_schedulable
def streams(store, threshold: float, *, units: str = "cells", memory=None, progress: bool = True, vectors=None,
            overwrite: bool = False, window_tiles: int | None = None, device: str | None = "auto") -> HydroResult:
    """``streams/order`` (Strahler, uint8), ``streams/magnitude`` (Shreve), ``streams/link`` (uint32)
    of the cells whose accumulation >= ``threshold`` (cells, or m^2 with ``units="m2"``); with
    ``vectors`` (a .gpkg, .geojson, .shp or .fgb path), one LineString a link (:func:`write_links`)."""
    timer = Timings()
    if vectors is not None:
        check_output(vectors, overwrite)
    what = "streams" if vectors is None else "streams+vectors"
    store, wins, route, cells = _network(store, what, threshold, units, memory, window_tiles, device)
    attrs = {"threshold": threshold, "units": units, "threshold_cells": cells}
    rows, cols = store.shape
    if route.device == "gpu":
        start_link_kernels(rows * cols >= 2**32)
    order_attrs, magnitude_attrs = {"method": "strahler"}, {"method": "shreve"}
    link_attrs = {"ids": "1.. in row-major order of the link heads; 0 off"}
    if wins is None:
        ends = _EndsAhead(store, route, what, timer)
        with concurrent.futures.ThreadPoolExecutor(1) as beside:
            code = route.ahead(beside, store, "flow/direction", progress, timer)
            net, upstream = route.network(store, code, cells, progress, timer, then=ends.start)
            code = _result(code)
        links = net.links._replace(upstream=upstream)
        with timer.phase(route.device):
            n_stream = int(net.stream.sum())
        attrs["links"] = len(links.head)
        arrays = {"order": (net.strahler, 0, order_attrs), "magnitude": (net.shreve, 0, magnitude_attrs),
                  "link": (net.link, 0, link_attrs)}
        if vectors is None:
            del code
            _write(store, "streams", arrays, attrs, timer)
        else:  # the rasters written in a thread of their own while the links are walked and written
            pending, vectors_done = concurrent.futures.ThreadPoolExecutor(1), threading.Event()
            written = pending.submit(_write, store, "streams", arrays, attrs, timer, vectors_done)
        del net, arrays
    else:
        with store.write_result("streams", attrs=attrs) as writer:
            shreve_dtype = np.uint32 if rows * cols < 2**32 else np.uint64
            order_arr = writer.create_array("order", np.uint8, 0, attrs=order_attrs)
            magnitude_arr = writer.create_array("magnitude", shreve_dtype, 0, attrs=magnitude_attrs)
            link_arr = writer.create_array("link", np.uint32, 0, attrs=link_attrs)
            from . import tiled

            t = tiled.Streams(wins, cells).links(link_arr, progress, "streams")
            strahler, shreve = tiled.orders(t.downstream, rows * cols)
            tiled.per_cell(wins, link_arr, strahler, shreve, order_arr, magnitude_arr, progress)
            links = tiled._cpu.Links(t.head, t.tail, t.downstream, t.cells, strahler, shreve, t.upstream)
            n_stream = int(t.cells.sum())
            attrs["links"] = len(t.head)
            writer.attrs.update(attrs)
        reader = CellReader(store, wins.side * store.tile_size)
    if vectors is not None:
        try:  # (the rasters' writer waits for vectors_done: set whatever happens)
            if wins is None:
                reader = CellReader.held(store, to_host(code))
                del code
            with timer.phase("vectors"):
                write_links(store, reader, links, vectors, overwrite, memory_budget(memory) // VECTOR_HOLD, timer,
                            gpu=route.device == "gpu", ahead=ends if wins is None else None)
        finally:
            if wins is None:
                vectors_done.set()
                pending.shutdown()  # the rasters' write done (its error, if any, raised below)
        if wins is None:
            written.result()
    hr, hc = np.divmod(links.head, cols)
    tr, tc = np.divmod(links.tail, cols)
    table = {"id": np.arange(1, len(links.head) + 1), "downstream": links.downstream, "strahler": links.strahler,
             "shreve": links.shreve, "cells": links.cells, "head_row": hr, "head_col": hc, "tail_row": tr,
             "tail_col": tc, "upstream_cells": links.upstream}
    sec = timer.seconds()
    return HydroResult(f"streams: {n_stream:,} stream cells (accumulation >= {cells:g} cells), {len(links.head):,} "
                       f"links, highest Strahler order {int(links.strahler.max(initial=0))}, {sec:.2f} s "
                       f"({route.device}, {_method(wins)})", attrs, table)


class _EndsAhead:
    """The elevations the links' ends need, read onto the GPU while its kernels run (``streams -o`` on
    the GPU, where they fit its memory beside the route's arrays): :meth:`start` once the route's
    arrays are read; :meth:`take` the CuPy array (None: not read ahead), held no longer, so
    that the ends are gathered at once when the vectors start instead of reading the elevations
    beside the walks and the rasters' write (H100, 16384^2: ``vector_ends`` 0.78-0.84 s, the
    vectors' critical path; the same read in a warm process alone 0.18-0.24 s)."""

    def __init__(self, store: TerrainStore, route: "_Route", what: str, timer: Timings):
        self._future = None
        self.source = store.group["flow"].attrs.get("source", "elevation")
        self.store, self.route, self.timer = store, route, timer
        self.ahead = False
        if route.device == "gpu" and what == "streams+vectors":
            from . import _gpu

            rows, cols = store.shape
            arr = store.array(self.source)
            need = _gpu.device_bytes(rows, cols, what, arr.dtype) + rows * cols * np.dtype(arr.dtype).itemsize
            self.ahead = need <= gpu_free_bytes()

    def start(self) -> None:
        if not self.ahead:
            return
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ends-ahead")

        def read():
            with self.timer.phase("vector_ends_read"):
                return self.route.load(self.store, self.source, False)

        self._future = pool.submit(read)
        pool.shutdown(wait=False)

    def take(self):
        """The elevations on the GPU, or None: not read ahead, or the read failed (GPU memory taken by the
        network's kernels meanwhile, a damaged shard) -- the caller then reads them its own way, which
        reports damage as every read does."""
        future, self._future = self._future, None
        try:
            return None if future is None else future.result()
        except Exception:  # noqa: BLE001 -- the caller's own read follows
            return None


@_schedulable
def hand(store, threshold: float, *, units: str = "cells", memory=None, progress: bool = True,
         window_tiles: int | None = None, device: str | None = "auto") -> HydroResult:
    """``hand/height`` (float32, NaN where the flow path meets no stream) and ``hand/drainage``
    (uint32 link id of the stream cell reached, 0 none) for streams of accumulation >= ``threshold``."""
    timer = Timings()
    store, wins, route, cells = _network(store, "hand", threshold, units, memory, window_tiles, device)
    source = store.group["flow"].attrs.get("source", "elevation")
    attrs = {"threshold": threshold, "units": units, "threshold_cells": cells, "elevation": source}
    height_attrs = {"units": "elevation units above the drainage"}
    drainage_attrs = {"ids": "streams' link ids; 0 none"}
    if wins is None:
        with concurrent.futures.ThreadPoolExecutor(2) as beside:
            code = route.ahead(beside, store, "flow/direction", progress, timer)
            z = route.ahead(beside, store, source, progress, timer) if route.device == "gpu" else None
            net, _ = route.network(store, code, cells, progress, timer, tails=False)
            code = _result(code)
            with timer.phase("read"):
                z = route.load(store, source, progress) if z is None else z.result()
        with timer.phase(route.device):
            height, drainage = route.K.height_above_drainage(code, z, net)
            del z, code, net
            drained, top = _drained(height)
        _write(store, "hand", {"height": (height, float("nan"), height_attrs),
                               "drainage": (drainage, 0, drainage_attrs)}, attrs, timer)
    else:
        with store.write_result("hand", attrs=attrs) as writer:
            h_arr = writer.create_array("height", np.float32, float("nan"), attrs=height_attrs)
            d_arr = writer.create_array("drainage", np.uint32, 0, attrs=drainage_attrs)
            from . import tiled

            drained, top = tiled.hand(wins, tiled.Streams(wins, cells), source, h_arr, d_arr, progress)
    sec = timer.seconds()
    return HydroResult(f"hand: {drained:,} cells drain to a stream (accumulation >= {cells:g} cells), highest "
                       f"{top:.6g}, {sec:.2f} s ({route.device}, {_method(wins)})", attrs)


class CellReader:
    """Blocks of a store's arrays around given cells: the arrays ``held`` in memory whole, the rest
    read as square blocks of ``side`` cells on demand, the last few kept (a link walk stays near);
    :meth:`values` with ``threads`` gathers its cells a shard at a time in that many threads."""

    KEEP = 4

    def __init__(self, store: TerrainStore, side: int, held: dict | None = None, threads: int = 1):
        self.store, self.side, self.held, self.cache, self.threads = store, side, held or {}, {}, threads

    @classmethod
    def held(cls, store: TerrainStore, code: np.ndarray) -> "CellReader":
        """The codes held; other arrays read by tiles in parallel threads."""
        return cls(store, store.tile_size, {"flow/direction": code}, _threads(store))

    def _read(self, name: str, gid: int) -> tuple[np.ndarray, int, int]:
        """The block of ``side`` cells holding ``gid`` (inside one shard: ``side`` divides the shard's)."""
        rows, cols = self.store.shape
        r0, c0 = (gid // cols) // self.side * self.side, (gid % cols) // self.side * self.side
        arr = self.store.array(name)
        sh0, sh1 = arr.shards
        win = Window(r0, min(r0 + self.side, rows), c0, min(c0 + self.side, cols))
        return read_shard(arr, r0 // sh0, c0 // sh1, win), r0, c0

    def block(self, name: str, gid: int) -> tuple[np.ndarray, int, int]:
        """The block holding cell ``gid`` of array ``name`` and its first row and column."""
        if name in self.held:
            return self.held[name], 0, 0
        cols = self.store.shape[1]
        key = (name, (gid // cols) // self.side, (gid % cols) // self.side)
        if key not in self.cache:
            if len(self.cache) >= self.KEEP:
                self.cache.pop(next(iter(self.cache)))
            self.cache[key] = self._read(name, gid)
        return self.cache[key]

    def values(self, name: str, gids: np.ndarray) -> np.ndarray:
        """The values of ``name`` at cells ``gids``: with ``threads``, gathered shard by shard in
        that many threads (:meth:`_gather`), else block by block."""
        if self.threads > 1 and name not in self.held and shard_layout(self.store.array(name)) is not None:
            return self._gather(self.store.array(name), np.asarray(gids, np.int64))
        cols = self.store.shape[1]
        keys = (gids // cols) // self.side * (cols // self.side + 1) + (gids % cols) // self.side
        order = np.argsort(keys, kind="stable")
        cut = np.flatnonzero(np.diff(keys[order])) + 1
        groups = np.split(order, cut) if len(order) else []

        def one(at):
            block, r0, c0 = self.block(name, int(gids[at[0]]))
            return at, block[gids[at] // cols - r0, gids[at] % cols - c0]

        parts = [one(at) for at in groups]
        if not parts:
            return np.empty(0)
        out = np.empty(len(gids), parts[0][1].dtype)
        for at, v in parts:
            out[at] = v
        return out

    def _gather(self, arr, gids: np.ndarray) -> np.ndarray:
        """``arr`` at cells ``gids``, a shard's cells in one :func:`..store.read_shard` (its file and
        index opened once, its chunks taken as they are decoded: no window assembled), over the
        chunks that hold one of them -- the box around them where they fill at least half of it,
        else each chunk alone -- in ``threads`` threads. (A read a tile, as :meth:`block`, opened
        the shard and checked its index 4096 times for the 280 k link ends of 16384^2: H100, 2.1-2.4 s
        beside the walks.)"""
        rows, cols = arr.shape
        (t0, t1), (s0, s1) = arr.chunks, arr.shards
        tiles_across = -(-cols // t1)
        r, c = np.divmod(gids, cols)
        tr, tc = r // t0, c // t1
        tile = tr * tiles_across + tc
        shard = (r // s0) * -(-cols // s1) + c // s1
        order = np.lexsort((tile, shard))
        shard_cut = np.flatnonzero(np.diff(shard[order])) + 1
        out = np.full(len(gids), arr.fill_value, arr.dtype)  # (chunks never written: not taken)

        def gather(at):  # the cells ``at`` (sorted by tile) of one shard
            tiles, first = np.unique(tile[at], return_index=True)
            by_tile = dict(zip(tiles.tolist(), np.split(at, first[1:])))

            def take(r0, c0, cells):  # a decoded chunk's part (its first cell r0, c0): its cells asked for
                mine = by_tile.get((r0 // t0) * tiles_across + c0 // t1)
                if mine is not None:
                    out[mine] = cells[r[mine] - r0, c[mine] - c0]

            sr, sc = int(r[at[0]] // s0), int(c[at[0]] // s1)
            a0, a1, b0, b1 = int(tr[at].min()), int(tr[at].max()) + 1, int(tc[at].min()), int(tc[at].max()) + 1
            if 2 * len(tiles) >= (a1 - a0) * (b1 - b0):
                boxes = [(a0, a1, b0, b1)]
            else:
                boxes = [(i, i + 1, j, j + 1) for i, j in zip(*np.divmod(tiles, tiles_across))]
            whole = Window(sr * s0, min(sr * s0 + s0, rows), sc * s1, min(sc * s1 + s1, cols))
            for i0, i1, j0, j1 in boxes:
                part = Window(i0 * t0, min(i1 * t0, rows), j0 * t1, min(j1 * t1, cols))
                read_shard(arr, sr, sc, None if part == whole else part, each=take)  # (whole: read ahead)

        if len(gids):
            with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:
                list(pool.map(gather, np.split(order, shard_cut)))
        return out


def _values_on_gpu(store: TerrainStore, name: str, gids: np.ndarray, threads: int) -> np.ndarray | None:
    """``name`` at cells ``gids``, gathered on the GPU from each band of its rows as nvCOMP decodes it
    there (:func:`...pinned.read_device`: only the frames cross the bus, the host's threads read and
    checksum them, no band held after its gather); None where that cannot be (no nvCOMP). (The CPU's
    gather, :meth:`CellReader._gather`, decodes nearly every tile of the elevations for the 280 k link
    ends of 16384^2, its threads beside the walks' Python.)"""
    import cupy as cp

    from ...pinned import read_device

    cols = store.shape[1]
    order = np.argsort(gids, kind="stable")
    ranked = gids[order]
    arr = store.array(name)
    out = np.empty(len(gids), arr.dtype)

    def gather(r0, r1, cells):
        a, b = np.searchsorted(ranked, [r0 * cols, r1 * cols])
        if a < b:
            out[order[a:b]] = cells.reshape(-1)[cp.asarray(ranked[a:b] - r0 * cols)].get()

    return out if read_device(store, name, threads, each=gather) else None


LINK_BATCH = 16384  # links a batch of vertices: its walks' arrays (~80 bytes a vertex) in memory at a time
LINE_THREADS = 4  # batches walked at once where the codes are held (numba's walks and NumPy release the GIL)
VECTOR_HOLD = 8  # the links' features held for one GDAL write: up to 1/VECTOR_HOLD of the memory budget
LINK_FIELDS = {"link": np.int64, "downstream": np.int64, "strahler": np.int32, "shreve": np.int64, "cells": np.int64,
               "length_m": np.float64, "upstream": np.float64, "upstream_m2": np.float64, "drop": np.float64}


def write_links(store: TerrainStore, reader: CellReader, links: Links, out, overwrite: bool = False,
                hold: int = 0, timer: Timings | None = None, gpu: bool = False, ahead=None) -> Path:
    """One LineString a stream link, in the store's CRS, made a batch of links at a time (in
    ``LINE_THREADS`` threads where ``reader`` holds the codes, their WKB in one buffer a batch:
    :func:`._cpu.link_points`) and written in order -- to a GeoPackage by GDAL's Arrow interface
    (:mod:`.arrow`: each batch as it comes, without the GIL), else through
    :func:`..vectors.feature_stream` (features held up to ``hold`` bytes of geometry a GDAL
    write): vertices at the centres of its cells in flow
    order (its head's flow path of ``cells`` cells, :func:`._cpu.walk_links`), then the head of its
    downstream link (links meet at junctions; a lone cell with no downstream link is a line of two
    equal points). Fields: ``link``, ``downstream`` (0: the flow path ends), ``strahler``,
    ``shreve``, ``cells``, ``length_m`` (the vertices' steps in metres), ``upstream``
    (accumulation at the link's last cell: cells, or the flow's weights), ``upstream_m2`` (that
    many cells' area; NaN for weights), ``drop`` (first vertex's elevation minus the last's).
    ``timer``: its phases ``vector_ends`` (the end elevations, read in a thread of their own while
    the links are walked; ``gpu``: gathered on the GPU as the elevations' bands are decoded there,
    :func:`_values_on_gpu`, where nvCOMP is installed; ``ahead``: the elevations read onto the GPU
    before, :class:`_EndsAhead`), ``vector_lines`` (walks, vertices, WKB; summed over the threads)
    and ``vector_gdal``."""
    from . import _cpu, arrow

    timer = Timings() if timer is None else timer
    rows, cols = store.shape
    dx, dy = store.metric_cell_size
    counted = store.array("flow/accumulation").attrs.get("units") == "cells"
    source = store.group["flow"].attrs.get("source", "elevation")
    n = len(links.head)
    transform = np.asarray(store.geotransform, np.float64)
    hyp = np.hypot(np.array([[0.0, 0.0], [dy, dy]]), np.array([[0.0, dx], [0.0, dx]]))  # [|dr|, |dc|]

    def end_drops():
        """Each link's first vertex (its head) and last (the downstream link's head, else its last
        cell): their elevations read once for all links (a reader of their own: the walks' keeps
        its cache; with threads, a shard at a time, :meth:`CellReader._gather`), the drops between
        them."""
        with timer.phase("vector_ends"):
            last = np.where(links.downstream > 0, links.head[np.maximum(links.downstream.astype(np.int64) - 1, 0)],
                            links.tail)
            gids = np.concatenate([links.head, last])
            values = None
            held = ahead.take() if ahead is not None else None
            if held is not None:  # read ahead onto the GPU
                import cupy as cp

                values = held.reshape(-1)[cp.asarray(gids)].get()
                del held
            elif gpu:
                values = _values_on_gpu(store, source, gids, reader.threads)
            if values is None:
                values = CellReader(store, reader.side, reader.held, reader.threads).values(source, gids)
            zf = values.astype(np.float64)
            return zf[:n] - zf[n:]

    def lines(s: int) -> tuple[np.ndarray, dict]:
        """The features of links s.. (a batch) but their drops: WKB and fields."""
        with timer.phase("vector_lines"):
            sl = slice(s, min(s + LINK_BATCH, n))
            ids = np.arange(sl.start + 1, sl.stop + 1, dtype=np.int64)
            cells, down = links.cells[sl].astype(np.int64), links.downstream[sl]
            extra = (down > 0) | (cells == 1)  # the downstream head, or the lone cell again
            starts = np.concatenate([[0], np.cumsum(cells + extra)])
            verts = np.empty(starts[-1], np.int64)
            cur, left, pos = links.head[sl].copy(), cells.copy(), starts[:-1].copy()
            while True:
                todo = np.flatnonzero(left)
                if not len(todo):
                    break
                block, r0, c0 = reader.block("flow/direction", int(cur[todo[0]]))
                _cpu.walk_links(block, r0, c0, cols, cur, left, verts, pos)
            last = starts[1:] - 1
            verts[last[extra]] = np.where(down[extra] > 0, links.head[np.maximum(down[extra].astype(np.int64) - 1, 0)],
                                          verts[last[extra] - 1])
            offsets = 9 * np.arange(len(starts), dtype=np.int64) + 16 * starts  # line i's WKB from offsets[i]
            wkb, step = np.empty(offsets[-1], np.uint8), np.empty(len(verts))
            _cpu.link_points(verts, starts, cols, transform, hyp, wkb, step)
            length = np.add.reduceat(step, starts[:-1]) if len(ids) else np.zeros(0)
            upstream = links.upstream[sl].astype(np.float64)
            fields = {"link": ids, "downstream": down, "strahler": links.strahler[sl], "shreve": links.shreve[sl],
                      "cells": cells, "length_m": length, "upstream": upstream,
                      "upstream_m2": upstream * dx * dy if counted else np.full(len(ids), np.nan)}
            return wkb, offsets, {k: np.asarray(v, LINK_FIELDS[k]) for k, v in fields.items()}  # (the layer's types)

    walkers = LINE_THREADS if "flow/direction" in reader.held else 1  # (a reader's cache is not shared)
    with concurrent.futures.ThreadPoolExecutor(1) as pool, concurrent.futures.ThreadPoolExecutor(walkers) as walk, \
            contextlib.ExitStack() as stack:
        drops = pool.submit(end_drops)
        if arrow.usable(DRIVERS[Path(out).suffix.lower()]):  # each batch written by GDAL as it comes, without the GIL
            write = stack.enter_context(arrow.link_stream(out, store.crs, LINK_FIELDS, overwrite))
        else:  # pyogrio's writer: a bytes object a line, held up to ``hold``
            features = stack.enter_context(feature_stream(out, "LineString", store.crs, overwrite, hold))

            def write(wkb, offsets, fields):
                cut = offsets.tolist()
                features([wkb[a:b].tobytes() for a, b in zip(cut[:-1], cut[1:])], fields)
        firsts = range(0, max(n, 1), LINK_BATCH)
        # (two batches a walker ahead of the writer: a slow GDAL write never lets the walked batches pile up)
        batches = stack.enter_context(contextlib.closing(Prefetch(lines, firsts, 2 * walkers, walk)))
        for s, (wkb, offsets, fields) in zip(firsts, batches):
            fields["drop"] = drops.result()[s:s + LINK_BATCH]
            with timer.phase("vector_gdal"):
                write(wkb, offsets, fields)
        with timer.phase("vector_gdal"):
            stack.close()  # the features still held written, the file renamed into place
    return Path(out)


def _polygon_labels(store: TerrainStore, name: str, held, memory, progress: bool, beside: int = 0):
    """The labels to trace for polygons: in memory (``held``, or read whole) where ``POLYGON_BYTES`` a
    cell fit the budget beside ``beside`` bytes (the basin table), else the array's name
    (:func:`write_polygons` traces it from disk)."""
    rows, cols = store.shape
    if rows * cols * POLYGON_BYTES + beside > memory_budget(memory):
        return name
    return _read(store, name, progress) if held is None else to_host(held)


def _label_tiffs(store: TerrainStore, name: str, folder: Path) -> Path:
    """The label array ``name`` as a tiled GeoTIFF (uint32, nodata 0: GDAL's polygonize takes its
    nodata mask as the mask), written shard by shard."""
    import rasterio
    from affine import Affine
    from rasterio.windows import Window as RioWindow

    rows, cols = store.shape
    profile = dict(driver="GTiff", width=cols, height=rows, count=1, tiled=True, blockxsize=256, blockysize=256,
                   compress="zstd", zstd_level=1, BIGTIFF="IF_SAFER", nodata=0,
                   transform=Affine.from_gdal(*store.geotransform))
    path = folder / "label.tif"
    with rasterio.Env(GDAL_CACHEMAX=POLYGON_CACHE), rasterio.open(path, "w", dtype="uint32", **profile) as lab:
        for win in store.shards():
            lab.write(store.read(win, name), 1, window=RioWindow(win.c0, win.r0, win.c1 - win.c0, win.r1 - win.r0))
    return path


def write_polygons(store: TerrainStore, label, fields: Mapping, out, overwrite: bool = False,
                   progress: bool = False) -> Path:
    """The regions of ``label`` (uint32, 0 none) as polygons in the store's CRS (GDAL's polygonize,
    8-connected: one polygon a region, a region whose cells touch only at corners one feature a
    part), with the ``id`` and ``fields`` (name -> array indexed by id - 1, or a ``Table``),
    written as GDAL traces them (:mod:`.polygons`: the polygons never all in memory). ``label``: the
    raster in memory, or the name of the store's label array: then written to a GeoTIFF in a scratch
    folder of the store, shard by shard, which GDAL's polygonize reads a block row at a time."""
    import rasterio

    from ...atomic import scratch_directory
    from . import polygons

    regions = Table.of(fields).rows
    if regions >= 2**31:
        raise InputError(f"{out}: more than 2^31 regions: GDAL's polygonize takes int32 labels")
    with scratch_directory(store.path, "polygons") as tmp, rasterio.Env(GDAL_CACHEMAX=POLYGON_CACHE):
        source = _label_tiffs(store, label, tmp) if isinstance(label, str) else label
        return polygons.write(source, store.geotransform, store.crs, fields, out,
                              overwrite, tmp, progress)
