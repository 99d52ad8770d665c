"""Watersheds, basins, streams and HAND of a store routed by ``terrain flow``, in core.

Each command reads ``flow/direction`` (and ``flow/accumulation``, and for HAND the elevations the
flow was routed on: ``flow``'s ``source`` attribute) whole, runs the kernels of :mod:`._cpu`, and
writes its result group atomically (``TerrainStore.write_result``), shard by shard in parallel
threads. A DEM whose arrays and scratch do not fit the memory budget is refused with one line (out
of core: not written yet).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...memory import format_bytes, memory_budget
from ...progress import progress_bar
from ...store import TerrainStore, Window
from ...timings import Timings
from ...vectors import check_output, wkb_linestring, wkb_polygon, write_features
from .._tiled import table_cell, write_held
from ..flow.codes import NODATA
from . import _cpu

# host bytes a cell at the peak: codes 1, accumulation 8, order 8, donor counts 1, labels 4 (+ the
# network's mask, donors, Strahler, Shreve, link, scratch 12; with vectors a second order 8 and the
# elevations 8; + HAND's elevation 8, drainage elevation 8, height 4, link 4)
BYTES = {"watershed": 22, "basins": 22, "streams": 42, "streams+vectors": 60, "hand": 66}
UNITS = ("cells", "m2")


@dataclass
class HydroResult:
    """What a command computed: its one summary line, the result group's attributes and, for
    basins and streams, a table (column name -> 1-D array, one row per basin or link)."""

    line: str
    attrs: dict
    table: dict | None = None
    timings: dict | None = None  # seconds by phase (read, solve, write, vectors)


def write_table(result: HydroResult, path) -> Path:
    """The result's table as CSV (written under a temporary name, renamed when complete)."""
    from ...atomic import atomic_file

    path = Path(path)
    names = list(result.table)
    with atomic_file(path) as tmp, open(tmp, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(names)
        for row in zip(*(result.table[n] for n in names)):
            out.writerow([table_cell(v) for v in row])
    return path


def _open(store, what: str, memory) -> TerrainStore:
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    if "flow/direction" not in store.results():
        raise InputError(f"{store.path}: no flow directions: run terrain flow {store.path} first")
    rows, cols = store.shape
    need, budget = rows * cols * BYTES[what], memory_budget(memory)
    if need > budget:
        raise InputError(f"{what.replace('+', ' with ')} runs in core and needs about {format_bytes(need)} for this "
                         f"{rows:,} x {cols:,} DEM, "
                         f"more than the memory budget {format_bytes(budget)} (raise --memory; out of core is not "
                         f"implemented yet)")
    return store


def _read(store: TerrainStore, name: str, progress: bool, timings: Timings | None = None) -> np.ndarray:
    """The whole array ``name``; its seconds added to phase "read" of ``timings``."""
    rows, cols = store.shape
    with progress_bar(progress, 1, f"read {name}", unit="array") as bar, (timings or Timings()).phase("read"):
        out = store.read(Window(0, rows, 0, cols), name)
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


def _write(store: TerrainStore, group: str, arrays: dict, attrs: dict) -> None:
    """The result group ``group`` with ``arrays`` (name -> (values, fill, attrs)), atomically."""
    with store.write_result(group, attrs=attrs) as writer:
        pairs = []
        for name, (values, fill, a) in arrays.items():
            arr = writer.create_array(name, values.dtype, fill, attrs=a)
            pairs.append((arr, lambda s, v=values: v[s]))
        write_held(store, *pairs)


def snap_outlets(code, acc, cells, dist: float, cell_size) -> np.ndarray:
    """ESRI Snap Pour Point: each outlet moved to the valid cell of largest accumulation whose centre
    lies within ``dist`` map units of its own (``cell_size``: dx, dy in map units); ties to the
    nearest, then the first in row-major order."""
    dx, dy = cell_size
    rows, cols = code.shape
    rr, rc = int(dist // dy), int(dist // dx)
    out = []
    for r, c in cells:
        r0, r1, c0, c1 = max(r - rr, 0), min(r + rr + 1, rows), max(c - rc, 0), min(c + rc + 1, cols)
        gr, gc = np.mgrid[r0:r1, c0:c1]
        d2 = ((gr - r) * dy) ** 2 + ((gc - c) * dx) ** 2
        ok = (d2 <= dist * dist) & (code[r0:r1, c0:c1] != NODATA)
        a = acc[r0:r1, c0:c1].astype(np.float64)
        pick = np.lexsort((gc[ok], gr[ok], d2[ok], -a[ok]))[0]
        out.append((int(gr[ok][pick]), int(gc[ok][pick])))
    return np.asarray(out, np.int64).reshape(-1, 2)


def watershed(store, cells, *, name: str = "default", snap: float | None = None, memory=None,
              progress: bool = True, vectors=None, overwrite: bool = False) -> HydroResult:
    """``watershed/NAME/label`` (uint32: i + 1 where a cell drains to ``cells[i]`` = (row, col)
    first); with ``snap`` (map units), the outlets are moved first (:func:`snap_outlets`) and the
    result's attributes record where to (``snapped``); ``vectors``: a polygon file of the
    watersheds (:func:`write_polygons`: outlet id, cells, area_m2, outlet row/col)."""
    timings = Timings()
    if vectors is not None:
        check_output(vectors, overwrite)
    store = _open(store, "watershed", memory)
    code = _read(store, "flow/direction", progress, timings)
    rows, cols = code.shape
    cells = np.asarray(cells, np.int64).reshape(-1, 2)
    for i, (r, c) in enumerate(cells, 1):
        if not (0 <= r < rows and 0 <= c < cols):
            raise InputError(f"outlet {i} lies outside the DEM (cell {r}, {c} of {rows:,} x {cols:,})")
        if code[r, c] == NODATA:
            raise InputError(f"outlet {i} lies on nodata (cell {r}, {c})")
    given = cells
    attrs = {"outlets": given.tolist()}
    if snap is not None:
        if not np.isfinite(snap) or snap < 0:
            raise InputError(f"--snap must be a distance >= 0, got {snap}")
        acc = _read(store, "flow/accumulation", progress, timings)
        cells = snap_outlets(code, acc, cells, snap, store.cell_size)
        for i, (r, c) in enumerate(cells, 1):
            if not acc[r, c] > 0:
                raise InputError(f"outlet {i} snapped to cell ({r}, {c}), which has no accumulation")
        del acc
        attrs.update(snap=snap, snapped=cells.tolist())
    flat = cells[:, 0] * cols + cells[:, 1]
    if len(np.unique(flat)) != len(flat):
        raise InputError("two outlets lie in the same cell" + (" after snapping" if snap is not None else ""))
    with timings.phase("solve"):
        label = _cpu.label_outlets(code, flat)
        counts = np.bincount(label.ravel(), minlength=len(flat) + 1)[1:]
    dx, dy = store.metric_cell_size
    attrs.update(cells=counts.tolist(), area_m2=(counts * dx * dy).tolist())  # one entry an outlet: small
    with timings.phase("write"):
        _write(store, f"watershed/{name}", {"label": (label, 0, {"outlet_ids": "1.. in the order given; 0 none"})},
               attrs)
    if vectors is not None:
        with timings.phase("vectors"):
            write_polygons(store, label, {"cells": counts, "area_m2": counts * dx * dy, "outlet_row": cells[:, 0],
                                          "outlet_col": cells[:, 1]}, vectors, overwrite)
    sec = timings.seconds()
    moved = int((cells != given).any(axis=1).sum())
    note = f" ({moved} moved by --snap)" if snap is not None else ""
    return HydroResult(f"watershed {name}: {len(flat)} outlets{note}"
                       f", {int(counts.sum()):,} cells drain to them, largest {int(counts.max()):,} cells, {sec:.2f} s "
                       f"(cpu, incore)", attrs, timings=timings.rounded())


def basins(store, *, memory=None, progress: bool = True, vectors=None, overwrite: bool = False) -> HydroResult:
    """``basins/label`` (uint32, 1.. in row-major order of the basins' terminal cells) and the table
    (id, outlet row/col and centre, cells, area_m2); ``vectors``: a polygon file of the basins."""
    timings = Timings()
    if vectors is not None:
        check_output(vectors, overwrite)
    store = _open(store, "basins", memory)
    code = _read(store, "flow/direction", progress, timings)
    with timings.phase("solve"):
        label, outlet, counts = _cpu.label_basins(code)
    row, col = np.divmod(outlet, code.shape[1])
    dx, dy = store.metric_cell_size
    attrs = {"basins": len(outlet)}
    x, y = store.cell_to_map(row, col)
    table = {"id": np.arange(1, len(outlet) + 1), "outlet_row": row, "outlet_col": col, "outlet_x": x, "outlet_y": y,
             "cells": counts, "area_m2": counts * dx * dy}
    with timings.phase("write"):
        _write(store, "basins", {"label": (label, 0, {"ids": "1.. in row-major order of the outlet cells; 0 nodata"})},
               attrs)
    if vectors is not None:
        with timings.phase("vectors"):
            write_polygons(store, label, {k: v for k, v in table.items() if k != "id"}, vectors, overwrite)
    sec = timings.seconds()
    return HydroResult(f"basins: {len(outlet):,} basins, largest {int(counts.max(initial=0)):,} cells, {sec:.2f} s "
                       f"(cpu, incore)", attrs, table, timings.rounded())


def _network(store, what, threshold, units, memory, progress, timings):
    store = _open(store, what, memory)
    cells = _threshold_cells(store, threshold, units)
    code = _read(store, "flow/direction", progress, timings)
    acc = _read(store, "flow/accumulation", progress, timings)
    if store.group["flow/accumulation"].attrs.get("units") != "cells" and units == "m2":
        raise InputError("--units m2 needs an accumulation of cells (this flow summed weights)")
    return store, code, acc, cells


def streams(store, threshold: float, *, units: str = "cells", memory=None, progress: bool = True, vectors=None,
            overwrite: bool = False) -> HydroResult:
    """``streams/order`` (Strahler, uint8), ``streams/magnitude`` (Shreve), ``streams/link`` (uint32)
    of the cells whose accumulation >= ``threshold`` (cells, or m^2 with ``units="m2"``); with
    ``vectors`` (a .gpkg, .geojson, .shp or .fgb path), one LineString a link (:func:`write_links`)."""
    timings = Timings()
    if vectors is not None:
        check_output(vectors, overwrite)
    what = "streams" if vectors is None else "streams+vectors"
    store, code, acc, cells = _network(store, what, threshold, units, memory, progress, timings)
    with timings.phase("solve"):
        net = _cpu.stream_network(code, acc, cells)
    t = net.links
    attrs = {"threshold": threshold, "units": units, "threshold_cells": cells, "links": len(t.head)}
    w = code.shape[1]
    hr, hc = np.divmod(t.head, w)
    tr, tc = np.divmod(t.tail, w)
    table = {"id": np.arange(1, len(t.head) + 1), "downstream": t.downstream, "strahler": t.strahler,
             "shreve": t.shreve, "cells": t.cells, "head_row": hr, "head_col": hc, "tail_row": tr, "tail_col": tc,
             "upstream_cells": acc.reshape(-1)[t.tail]}
    with timings.phase("write"):
        _write(store, "streams", {"order": (net.strahler, 0, {"method": "strahler"}),
                                  "magnitude": (net.shreve, 0, {"method": "shreve"}),
                                  "link": (net.link, 0, {"ids": "1.. in row-major order of the link heads; 0 off"})},
               attrs)
    if vectors is not None:
        with timings.phase("vectors"):
            z = _read(store, store.group["flow"].attrs.get("source", "elevation"), progress)
            write_links(store, code, acc, z, net, vectors, overwrite)
    sec = timings.seconds()
    n = int(np.count_nonzero(net.stream))
    return HydroResult(f"streams: {n:,} stream cells (accumulation >= {cells:g} cells), {len(t.head):,} links, highest "
                       f"Strahler order {int(t.strahler.max(initial=0))}, {sec:.2f} s (cpu, incore)", attrs, table,
                       timings.rounded())


def hand(store, threshold: float, *, units: str = "cells", memory=None, progress: bool = True) -> HydroResult:
    """``hand/height`` (float32, NaN where the flow path meets no stream) and ``hand/drainage``
    (uint32 link id of the stream cell reached, 0 none) for streams of accumulation >= ``threshold``."""
    timings = Timings()
    store, code, acc, cells = _network(store, "hand", threshold, units, memory, progress, timings)
    with timings.phase("solve"):
        net = _cpu.stream_network(code, acc, cells)
    del acc
    source = store.group["flow"].attrs.get("source", "elevation")
    z = _read(store, source, progress, timings)
    with timings.phase("solve"):
        height, drainage = _cpu.height_above_drainage(code, z, net)
    del z
    attrs = {"threshold": threshold, "units": units, "threshold_cells": cells, "elevation": source}
    with timings.phase("write"):
        _write(store, "hand", {"height": (height, float("nan"), {"units": "elevation units above the drainage"}),
                               "drainage": (drainage, 0, {"ids": "streams' link ids; 0 none"})}, attrs)
    sec = timings.seconds()
    ok = ~np.isnan(height)
    top = float(height[ok].max()) if ok.any() else float("nan")
    return HydroResult(f"hand: {int(ok.sum()):,} cells drain to a stream (accumulation >= {cells:g} cells), highest "
                       f"{top:.6g}, {sec:.2f} s (cpu, incore)", attrs, timings=timings.rounded())


def write_links(store: TerrainStore, code, acc, z, net: "_cpu.Network", out, overwrite: bool = False) -> Path:
    """One LineString a stream link, in the store's CRS: vertices at the centres of its cells in
    flow order, then the head of its downstream link (links meet at junctions; a lone cell with no
    downstream link is a line of two equal points). Fields: ``link``, ``downstream`` (0: the flow
    path ends), ``strahler``, ``shreve``, ``cells``, ``length_m`` (the vertices' steps in metres),
    ``upstream`` (accumulation at the link's last cell: cells, or the flow's weights),
    ``upstream_m2`` (that many cells' area; NaN for weights), ``drop`` (first vertex's elevation
    minus the last's)."""
    flat, order, m = _cpu.flow_order(code)
    stream, link, t = net.stream.reshape(-1), net.link.reshape(-1), net.links
    seq = order[:m][stream[order[:m]]]  # stream cells, each after its donors
    seq = seq[np.argsort(link[seq], kind="stable")]  # grouped by link, in flow order within each
    ends = np.cumsum(t.cells)
    w = code.shape[1]
    dx, dy = store.metric_cell_size
    zf, accf = np.asarray(z).reshape(-1), np.asarray(acc).reshape(-1)
    n = len(t.head)
    geometry = np.empty(n, object)
    length, drop = np.zeros(n), np.zeros(n)
    for i in range(n):
        cells = seq[ends[i] - t.cells[i] : ends[i]]
        if t.downstream[i]:
            cells = np.append(cells, t.head[t.downstream[i] - 1])
        elif len(cells) == 1:
            cells = np.append(cells, cells)
        r, c = np.divmod(cells, w)
        x, y = store.cell_to_map(r, c)
        geometry[i] = wkb_linestring(np.column_stack([x, y]))
        length[i] = np.hypot(np.diff(r) * dy, np.diff(c) * dx).sum()
        drop[i] = float(zf[cells[0]]) - float(zf[cells[-1]])
    upstream = accf[t.tail].astype(np.float64)
    counted = store.group["flow/accumulation"].attrs.get("units") == "cells"
    fields = {"link": np.arange(1, n + 1, dtype=np.int64), "downstream": t.downstream.astype(np.int64),
              "strahler": t.strahler.astype(np.int32), "shreve": t.shreve.astype(np.int64),
              "cells": t.cells, "length_m": length, "upstream": upstream,
              "upstream_m2": upstream * dx * dy if counted else np.full(n, np.nan), "drop": drop}
    return write_features(out, geometry, fields, "LineString", store.crs, overwrite)


def write_polygons(store: TerrainStore, label: np.ndarray, fields: dict, out, overwrite: bool = False) -> Path:
    """The regions of ``label`` (uint32, 0 none) as polygons in the store's CRS (GDAL's polygonize,
    8-connected: one polygon a region, a region whose cells touch only at corners one feature a
    part), with ``fields`` (name -> array indexed by id - 1) and the ``id``."""
    from affine import Affine
    from rasterio import features

    t = store.transform or (0.0, 1.0, 0.0, 0.0, 0.0, 1.0)
    geoms, ids = [], []
    if int(label.max(initial=0)) >= 2**31:
        raise InputError(f"{out}: more than 2^31 regions: GDAL's polygonize takes int32 labels")
    as_int = label.astype(np.int32)  # the widest integer type rasterio's shapes reads
    for geom, value in features.shapes(as_int, mask=label > 0, connectivity=8, transform=Affine.from_gdal(*t)):
        geoms.append(wkb_polygon(geom["coordinates"]))
        ids.append(int(value))
    order = np.argsort(np.asarray(ids, np.int64), kind="stable")
    ids = np.asarray(ids, np.int64)[order]
    geometry = np.array([geoms[i] for i in order], object)
    values = {"id": ids, **{k: np.asarray(v)[ids - 1] for k, v in fields.items()}}
    return write_features(out, geometry, values, "Polygon", store.crs, overwrite)
