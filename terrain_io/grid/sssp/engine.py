"""``sssp()``: shortest paths over a store's grid graph by one of three methods, the same bytes from each.

docs/ARCHITECTURE.md#sssp-engines: ``incore`` solves the whole grid in memory (:mod:`.incore`; the GPU's
memory with ``device="gpu"``); ``shards`` solves it out of core, unit by unit of whole shards in
a Dijkstra over units, with no boundary graph (:mod:`.shards`); ``index`` runs the three
phases of Gerritsen 2012 over the stored boundary graph G' (:mod:`.pipeline`), cheap for every
further source once the index exists; ``auto`` takes ``index`` when a usable index is stored,
else ``incore`` when the grid fits the budget (and no Dask scheduler is asked for), else
``shards``. ``incore`` and ``shards`` give the same bytes (distances, and predecessors by the tie
rule of :mod:`.incore`) whatever the device, tiling, unit or budget; ``index`` the same distances
but where shortest paths of different kinds tie exactly (the last bit), and on exact ties parents
by its own rule (README, "Grid pipelines").
"""
from __future__ import annotations

import math
import os

import numpy as np

from ... import weights as weight_models
from ...backend import resolve_device
from ...errors import InputError
from ...memory import memory_budget
from ...store import TerrainStore
from ...units import cli_weight
from .index import Field, open_index
from .result import SSSPResult, result_attrs

METHODS = ("auto", "incore", "shards", "index")


def parse_sources(store: TerrainStore, sources, cell: bool = False, crs=None,
                  skip_invalid: bool = False) -> list[tuple[int, int]]:
    """Source cells, distinct, in the order given, with their numbers (:class:`.allocation.SourceCells`;
    a note names points that repeat a cell): from (x, y) map coordinates, (row, col) cells with
    ``cell``, or a file of points / raster / store array name (:func:`terrain_io.points.read_points`,
    ``crs`` and ``skip_invalid`` as there; ``crs`` also names the CRS of map coordinates). One clear error for a source off the DEM or on nodata;
    every tile the sources touch is read once (:func:`terrain_io.points.vertex_mask`)."""
    from ...points import Points, from_coordinates, read_points
    from .allocation import SourceCells  # (here: its module's numba kernels are not for the GPU's route)

    if isinstance(sources, Points):
        pts = sources
    elif isinstance(sources, (str, os.PathLike)):
        if cell:
            raise InputError("cell=True applies to coordinate pairs, not to a file of sources")
        pts = read_points(sources, store, crs=crs, skip_invalid=skip_invalid, what="source")
    else:
        pts = from_coordinates(store, sources, cell=cell, skip_invalid=skip_invalid, what="source", crs=crs)
    if len(pts) == 0:
        raise InputError(f"no source lies on the DEM's data ({pts.skipped} left out)")
    ids = pts.cells[:, 0] * store.shape[1] + pts.cells[:, 1]
    _, first = np.unique(ids, return_index=True)
    first = np.sort(first)
    if len(first) < len(ids):
        import warnings

        from ...errors import TerrainNote

        repeated = np.setdiff1d(np.arange(len(ids)), first)
        numbers = ", ".join(str(int(pts.index[i]) + 1) for i in repeated[:5]) + (", ..." if len(repeated) > 5 else "")
        k = len(repeated)
        warnings.warn(f"source{'s' if k > 1 else ''} {numbers} share{'' if k > 1 else 's'} a cell with an earlier "
                      "source: the cell keeps the earlier number (--allocation)", TerrainNote, stacklevel=3)
    return SourceCells([(int(r), int(c)) for r, c in pts.cells[first]], pts.index[first] + 1)


def default_name(cells) -> str:
    r, c = cells[0]
    return f"r{r}c{c}" + (f"+{len(cells) - 1}" if len(cells) > 1 else "")


def choose_method(method: str, store: TerrainStore, field: Field, device: str, budget: int,
                  cluster: int | None = None, scheduler: str | None = "local", allocation: bool = False) -> str:
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
    if (scheduler or "local") == "local" and fits_in_core(store, field, device, budget, allocation):
        return "incore"
    return "shards"


def sssp(store, sources, *, weight: str = "absdiff", name: str | None = None, device: str = "auto",
         memory=None, progress: bool = True, cost=None, cell: bool = False, cluster: int | None = None,
         rebuild_index: bool = False, scheduler: str | None = "local", announce=None,
         method: str = "auto", unit: int | None = None, sources_crs=None, skip_invalid: bool = False,
         max_cost: float | None = None, allocation: bool = False, predecessor: bool = True) -> SSSPResult:
    """Shortest paths from ``sources`` over the DEM's grid graph; writes ``sssp/NAME/{distance,predecessor}``.

    Parameters
    ----------
    store : TerrainStore or path
        The DEM store.
    sources : pair, list of pairs, path or str
        (x, y) map coordinates, or (row, col) cells with ``cell=True``; one pair or a list (several
        sources give the distance to the nearest); or a file of points (GeoJSON, GeoPackage,
        Shapefile, CSV), a raster aligned with the DEM or the name of a store array (non-zero cells);
        see :mod:`terrain_io.points`.
    weight : {"absdiff", "surface", "cell", "walk"}
        The edge-weight model (terrain_io.weights); ``cell`` and a friction for ``walk`` read ``cost``.
    name : str, optional
        The result's name, ``sssp/NAME`` (default: from the first source's cell).
    device : {"auto", "cpu", "gpu"}
    memory : str or int, optional
        The budget, such as ``"2GB"`` (default: half the free RAM).
    progress : bool
        Show progress bars.
    cost : str or path, optional
        A store array name or a raster file aligned with the DEM.
    cell : bool
        ``sources`` pairs are (row, col) cells.
    cluster : int, optional
        The index method's cluster side in cells.
    rebuild_index : bool
        Rebuild the stored boundary index (``method="auto"`` then takes the index method, as with
        ``cluster``).
    scheduler : str
        Where the shard method's unit solves or the index method's tile phases run
        (terrain_io.parallel): ``local``, Dask ``threads``/``processes`` or a scheduler address.
    announce : callable, optional
        Gets one-line notes (a Dask dashboard's address).
    method : {"auto", "incore", "shards", "index"}
        See the module docstring; every method gives the same result.
    unit : int, optional
        The shard method's unit side in cells (default: from the budget).
    sources_crs : str, optional
        The CRS of the source points (default: a file's own, else the DEM's).
    skip_invalid : bool
        Leave out sources off the DEM or on nodata instead of refusing them.
    max_cost : float, optional
        Cells farther stay unreached (+inf); the others get the values of a run without it, and the
        in-core and shard methods only do the work of the area reached.
    allocation : bool
        Also write ``sssp/NAME/source``: the nearest source's number (1, 2, ... in the order given; 0
        unreached), the root of each cell's predecessor chain (:mod:`.allocation`).
    predecessor : bool
        False writes the distances only (no ``sssp/NAME/predecessor``: no paths traced from this
        result); the distances are the same bytes.

    Returns
    -------
    SSSPResult
        The result's name, sources (cells), method, cells reached, largest distance and phase times.
        The store holds ``sssp/NAME/distance`` (float32; +inf unreached, NaN nodata) and
        ``sssp/NAME/predecessor`` (uint8 direction code of the parent; 255 at sources and unreached).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from terrain_io.store import TerrainStore
    >>> dem = np.array([[5, 5, 5, 5], [5, 1, 2, 5], [5, 5, 3, 5], [5, 5, 4, 5]], dtype=np.float32)
    >>> st = TerrainStore.from_array(pathlib.Path(tempfile.mkdtemp()) / "dem.zarr", dem)
    >>> res = sssp(st, (1, 1), cell=True, name="pit", progress=False)
    >>> res.reached, float(res.max_distance)
    (16, 4.0)
    >>> st.group["sssp/pit/distance"][1, :].tolist()
    [4.0, 0.0, 1.0, 4.0]
    """
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store)
    model = weight_models.sssp_model(weight)
    dev = resolve_device(device)
    cells = parse_sources(store, sources, cell, sources_crs, skip_invalid)
    name = name or default_name(cells)
    budget = memory_budget(memory)
    limit = np.inf if max_cost is None else float(max_cost)
    if not limit >= 0:
        raise InputError(f"--max-cost must be a number >= 0, got {max_cost!r}")
    options = {"limit": limit, "allocation": bool(allocation), "predecessor": bool(predecessor)}
    _note_units(store, model)
    _check_distance_range(store, model)
    field = Field(store, model, cost)
    try:
        _check_cost_range(store, field)
        if (method or "auto") == "auto" and (rebuild_index or cluster is not None):
            method = "index"  # what only the index method does: (re)build G' for a cluster size
        chosen = choose_method(method, store, field, dev, budget, cluster, scheduler, options["allocation"])
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


def _check_distance_range(store: TerrainStore, model) -> None:
    """Refuse elevations so large that a distance of ``absdiff``/``surface`` could pass float32's
    largest value (3.4e38) -- it would be stored as +inf, "unreached": a path steps each cell at most
    once, each step weighs at most the value span plus a diagonal."""
    if model.kind not in (weight_models.ABSDIFF, weight_models.SURFACE):
        return
    a = store.attrs
    lo, hi, n = a.get("min"), a.get("max"), a.get("valid_count")
    if lo is None or hi is None or not n:
        return
    step = math.hypot(*store.metric_cell_size) if model.uses_step else 0.0
    if not (float(hi) - float(lo) + step) * n < float(np.finfo(np.float32).max):
        raise InputError(f"{store.path}: the elevations span {lo:.6g} .. {hi:.6g} over {n:,} cells: distances "
                         f"could pass float32's range (3.4e38); rescale the DEM's values")


def _check_cost_range(store: TerrainStore, field: Field) -> None:
    """Refuse cost rasters so large that a ``cell`` or ``walk --cost`` distance could pass float32's
    largest value (it would be stored as +inf, "unreached"), as :func:`_check_distance_range` does
    for elevations: a path takes at most one edge a cell, each weighs at most ``field.max_edge``."""
    if field.max_edge is None:
        return
    n = store.attrs.get("valid_count") or store.shape[0] * store.shape[1]
    if not field.max_edge * n < float(np.finfo(np.float32).max):
        raise InputError(f"{store.path}: costs up to {field.max_cost_value:.6g} over {n:,} cells: "
                         f"{cli_weight(field.model.name)!r} distances could pass float32's range (3.4e38); "
                         "rescale the cost raster")


def _note_units(store: TerrainStore, model) -> None:
    """A model that reads step lengths in metres (surface, cell, walk) on a DEM with no CRS whose
    cells are a small fraction of a map unit (likely degrees): say so, once, before the run."""
    dx, dy = store.cell_size
    if model.uses_step and not store.crs and store.transform and max(dx, dy) < 0.01:
        import warnings

        from ...errors import TerrainNote

        warnings.warn(f"the DEM has no CRS and cells of {dx:.3g} x {dy:.3g} map units, taken as metres by the "
                      f"{model.name!r} model (degrees? convert the DEM again with its CRS: --crs EPSG:4326, or a "
                      f".prj)", TerrainNote, stacklevel=3)
