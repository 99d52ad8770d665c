"""``sssp()``: shortest paths over a store's grid graph by one of three methods, the same bytes from each.

DESIGN.md "SSSP engines": ``incore`` solves the whole grid in memory (:mod:`.incore`; the GPU's
memory with ``device="gpu"``); ``shards`` solves it out of core, unit by unit of whole shards in
a Dijkstra over units, with no boundary graph (:mod:`.shards`); ``index`` runs the terrain
thesis's three phases over the stored boundary graph G' (:mod:`.pipeline`), cheap for every
further source once the index exists; ``auto`` takes ``index`` when a usable index is stored,
else ``incore`` when the grid fits the budget (and no Dask scheduler is asked for), else
``shards``. ``incore`` and ``shards`` give the same bytes (distances, and predecessors by the tie
rule of :mod:`.incore`) whatever the device, tiling, unit or budget; ``index`` the same distances
but where shortest paths of different kinds tie exactly (the last bit), and on exact ties parents
by its own rule (README, "Grid pipelines").
"""
from __future__ import annotations

from dataclasses import dataclass, field as dc_field

import numpy as np

from ... import weights as weight_models
from ...backend import resolve_device
from ...errors import InputError
from ...memory import memory_budget
from ...store import TerrainStore, Window
from .index import Field, open_index

DISTANCE_DTYPE = "float32"
METHODS = ("auto", "incore", "shards", "index")


@dataclass
class SSSPResult:
    """What :func:`sssp` computed; the same facts are the attributes of ``sssp/NAME``."""

    name: str
    weight: str
    sources: list  # (row, col) cells
    method: str  # "incore", "shards" or "index"
    reached: int
    max_distance: float
    timings: dict = dc_field(default_factory=dict)
    device: str = "cpu"
    cluster: int | None = None  # the index method's cluster size
    index_reused: bool = False
    merge_stats: dict = dc_field(default_factory=dict)  # the index merge's rounds and stages; the shard schedule's

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())

    def phases(self) -> str:
        """The method and its phase times, for a summary line."""
        t = self.timings
        if self.method == "index":
            return (f"index method: boundary {t['boundary']:.2f} s{' (index reused)' if self.index_reused else ''}, "
                    f"merge {t['merge']:.2f} s, final {t['final']:.2f} s")
        if self.method == "shards":
            m = self.merge_stats
            return (f"shard method on the {self.device.upper()}: {m['units']} units of {m['unit']}^2, "
                    f"{m['solves']} solves ({m['solves_per_unit']:.2f} a reached unit), {t['solve']:.2f} s")
        return f"in-core on the {self.device.upper()}: read {t['read']:.2f} s, solve {t['solve']:.2f} s, write {t['write']:.2f} s"


def parse_sources(store: TerrainStore, sources, cell: bool = False) -> list[tuple[int, int]]:
    """Source cells from (x, y) map coordinates, or (row, col) with ``cell``; clear errors when off the DEM."""
    if isinstance(sources, tuple) and len(sources) == 2 and np.isscalar(sources[0]):
        sources = [sources]
    rows, cols = store.shape
    cells = []
    for src in sources:
        if len(src) != 2:
            raise InputError(f"a source is two numbers, got {src!r}")
        if cell:
            r, c = int(src[0]), int(src[1])
            what = f"cell {r},{c}"
        else:
            r, c = store.map_to_cell(float(src[0]), float(src[1]))
            what = f"point {src[0]},{src[1]}"
        if not (0 <= r < rows and 0 <= c < cols):
            raise InputError(f"source {what} lies outside the DEM ({rows} x {cols} cells)")
        v = store.read(Window(r, r + 1, c, c + 1))
        if not store.valid(v)[0, 0]:
            raise InputError(f"source {what} lies on a nodata cell")
        cells.append((r, c))
    if not cells:
        raise InputError("no source given")
    return cells


def default_name(cells) -> str:
    r, c = cells[0]
    return f"r{r}c{c}" + (f"+{len(cells) - 1}" if len(cells) > 1 else "")


def choose_method(method: str, store: TerrainStore, field: Field, device: str, budget: int,
                  cluster: int | None = None, scheduler: str | None = "local") -> str:
    """The method to run for ``method`` (``auto``: a stored index first, then in-core if it fits
    and no Dask scheduler is asked for, else the shard method)."""
    from .incore import fits_in_core

    method = (method or "auto").lower()
    if method not in METHODS:
        raise InputError(f"unknown SSSP method {method!r}: choose one of {', '.join(METHODS)}")
    if method != "auto":
        return method
    if open_index(store, field, cluster) is not None:
        return "index"
    if (scheduler or "local") == "local" and fits_in_core(store, field, device, budget):
        return "incore"
    return "shards"


def sssp(store, sources, weight: str = "absdiff", name: str | None = None, device: str = "auto",
         memory=None, progress: bool = True, cost=None, cell: bool = False, cluster: int | None = None,
         rebuild_index: bool = False, scheduler: str | None = "local", announce=None,
         method: str = "auto", unit: int | None = None, max_cost: float | None = None,
         allocation: bool = False) -> SSSPResult:
    """Shortest paths from ``sources`` over the DEM's grid graph; writes ``sssp/NAME/{distance,predecessor}``.

    ``sources``: (x, y) map coordinates, or (row, col) cells with ``cell=True``; one pair or a list
    (several sources give the distance to the nearest). ``weight``: ``absdiff`` (default),
    ``surface`` or ``cell`` (with ``cost``: a store array name or a raster file aligned with the
    DEM). ``memory``: budget such as ``"2GB"`` (default: half the free RAM). ``method``:
    ``auto|incore|shards|index`` (module docstring); ``scheduler`` runs the shard method's unit
    solves or the index method's tile phases as Dask tasks (terrain_io.parallel); ``unit`` sets the
    shard method's unit side in cells (default: from the budget); ``cluster`` and
    ``rebuild_index`` apply to the index method (``auto`` takes it when they are asked for).
    ``max_cost``: cells farther than it stay unreached (+inf), the others get the values of a run
    without it; the in-core and shard methods then only do the work of the area reached.
    ``allocation``: also write ``sssp/NAME/source``, the nearest source's number (1, 2, ... in
    the order given; 0 unreached) -- the root of each cell's predecessor chain (:mod:`.allocation`).
    """
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store)
    model = weight_models.sssp_model(weight)
    dev = resolve_device(device)
    cells = parse_sources(store, sources, cell)
    name = name or default_name(cells)
    budget = memory_budget(memory)
    limit = np.inf if max_cost is None else float(max_cost)
    if not limit >= 0:
        raise InputError(f"--max-cost must be a number >= 0, got {max_cost!r}")
    options = {"limit": limit, "allocation": bool(allocation)}
    field = Field(store, model, cost)
    try:
        if (method or "auto") == "auto" and (rebuild_index or cluster is not None):
            method = "index"  # what only the index method does: (re)build G' for a cluster size
        chosen = choose_method(method, store, field, dev, budget, cluster, scheduler)
        attrs = result_attrs(store, field, cells, chosen, limit)
        if chosen == "incore":
            from .incore import run_incore

            result = run_incore(store, field, cells, name, dev, budget, progress, attrs, **options)
        elif chosen == "shards":
            from .shards import run_shards

            result = run_shards(store, field, cells, name, dev, budget, progress, attrs, scheduler, unit, announce,
                                **options)
        else:
            from .pipeline import run_index

            result = run_index(store, field, cells, name, dev, budget, progress, attrs, cluster, rebuild_index,
                               scheduler, announce, **options)
    finally:
        field.close()
    store.group[f"sssp/{name}"].attrs.update({"timings": result.timings})
    return result


def result_attrs(store: TerrainStore, field: Field, cells, method: str, limit: float = np.inf) -> dict:
    """The attributes every SSSP result group carries (a method adds its own)."""
    return {
        "max_cost": None if limit == np.inf else limit,
        "weight": field.model.name,
        "method": method,
        "source_cells": [list(map(int, rc)) for rc in cells],
        "source_xy": [list(map(float, store.cell_to_map(r, q))) for r, q in cells],
        "distance_dtype": DISTANCE_DTYPE,
        "cost": field.cost_id,
        "unreached": "distance +inf (also beyond max_cost), predecessor 255, source 0; nodata cells: distance NaN",
        "source_codes": "the number of the source (1, 2, ... in the order of source_cells) at the root of the "
                        "cell's predecessor chain; 0 none",
        "predecessor_codes": "direction from a cell to its parent: 0=E,1=SE,2=S,3=SW,4=W,5=NW,6=N,7=NE; 255 none",
        "predecessor_rule": "the tight parent with the least key (0 if strictly nearer, else its plateau level + 1), "
                            "then the least direction code",
    }
