"""The reusable SSSP boundary index G' of a store (Gerritsen 2012, ch. 4, phase 1;
docs/ARCHITECTURE.md#sssp-index-pipeline).

For every c x c cluster of cells, the shortest distances inside the cluster between all pairs of
its B = 4c - 4 boundary cells: a dense B x B float32 block. Together with the grid edges between
neighbouring clusters these blocks form the boundary graph G' on which the merge phase runs
Dijkstra. The index depends only on the DEM and the weight model (and the cost raster for
``cell``), so it is built once and kept in the store as the result group ``index/<weight>``:

* ``d``: shape (cluster rows, cluster cols, B, B), float32, one chunk per store tile;
* ``v``: shape (cluster rows, cluster cols, B), float64, the values of the boundary cells
  (elevation, or cost for ``cell``), NaN where a cell is not a vertex -- enough to weigh the
  grid edges between clusters without reading the DEM again.

Its attributes (weight, cluster size, cost raster, cell size) say what it was built for; a later
SSSP with the same settings skips phase 1.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import weights as weight_models
from ...backend import Dispatch
from ...errors import InputError
from ...memory import memory_budget
from ...parallel import check_task_memory, map_shards
from ...progress import progress_bar
from ...store import TerrainStore, Window, write_block
from ...timings import Timings
from ._pipeline_gpu import MAX_CLUSTER as MAX_GPU_CLUSTER

DEFAULT_CLUSTER = 8
INDEX_VERSION = 1


def index_name(model) -> str:
    return f"index/{weight_models.get(model).name}"


class Field:
    """The per-cell values a weight model reads (float64, NaN where a cell is not a vertex).

    ``absdiff``/``surface``/``walk``: the elevation. ``walk`` with ``cost``: the model
    ``walk_friction``, the elevation and the friction packed into one float64 (weights.py).
    ``cell``: the cost raster ``cost`` -- the name of an
    array of the store, or a GeoTIFF/ASCII file aligned with the DEM (same shape and transform);
    cells with nodata elevation or a cost that is NaN, negative or infinite are not vertices.
    """

    def __init__(self, store: TerrainStore, model, cost=None):
        self.store = store
        self.model = weight_models.get(model)
        self._tmp = None
        self.cost_array = None
        self.cost_id = None
        self.max_edge = None  # with a cost raster: an upper bound of an edge's weight (_note_barriers)
        if self.model.kind == weight_models.WALK and cost is not None:
            self.model = weight_models.get("walk_friction")  # walk's time times a friction raster
        if self.model.kind in (weight_models.CELL, weight_models.WALK_FRICTION):
            if cost is None:
                raise InputError(f"weight model {self.model.name!r} needs a cost raster (--cost FILE or the name of a "
                                 "store array)")
            self._open_cost(cost)
        elif cost is not None:
            raise InputError(f"--cost applies to the weight models 'cell' and 'walk', not {self.model.name!r}")

    def _open_cost(self, cost) -> None:
        from ...convert import aligned_raster

        self._tmp = contextlib.ExitStack()  # a scratch folder beside the store, cleaned even after a kill
        self.cost_store, self.cost_array = aligned_raster(cost, self.store, self._tmp, "cost raster")
        if self.cost_store is self.store:
            self.cost_id = f"array:{cost}"
        else:
            stat = Path(cost).stat()
            self.cost_id = f"file:{Path(cost).resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
        self._note_barriers(cost)

    def _note_barriers(self, cost) -> None:
        """One note counting the cells with data whose cost makes them barriers
        (:func:`terrain_io.weights.unusable_costs`), and ``max_edge``, an upper bound of an edge's
        weight (the largest usable cost times the longest step, or times the longest walk time of an
        edge for walk_friction) for the float32 range check: one pass, shard by shard."""
        counts = dict.fromkeys(weight_models.unusable_costs(np.zeros(0)), 0)
        walk = self.model.kind == weight_models.WALK_FRICTION
        most, longest = 0.0, 0.0  # the largest usable cost; the longest step or walk time
        for win in self.store.shards():
            if walk:  # edges to the next row and columns too: a halo of one cell
                elev = self.store.read(win, halo=1)
                ok_halo = self.store.valid(elev)
                longest = max(longest, self._longest_walk(np.where(ok_halo, elev, np.nan)))
                ok = ok_halo[1:-1, 1:-1]
            else:
                ok = self.store.valid(self.store.read(win))
            c = self.cost_store.read(win, self.cost_array).astype(np.float64)
            if self.cost_store is not self.store:
                c[~self.cost_store.valid(c)] = np.nan
            for k, v in weight_models.unusable_costs(c[ok]).items():
                counts[k] += v
            usable = c[ok & np.isfinite(c) & (c >= 0)]
            most = max(most, float(usable.max())) if usable.size else most
        weight_models.note_barriers(counts, f"cost raster {cost}", stacklevel=4)
        self.max_cost_value = most
        self.max_edge = most * (longest if walk else float(np.hypot(*self.store.metric_cell_size)))

    def _longest_walk(self, h: np.ndarray) -> float:
        """The longest walk time (s) of an edge, either way, between the valid cells of ``h`` (NaN: none):
        Tobler's time grows with |dh / step + 0.05|, whose largest value either way is |dh|max / step + 0.05."""
        from ..._weights_cpu import walk_time

        dx, dy = self.store.metric_cell_size
        rows, cols = h.shape
        longest = 0.0
        for dr, dc, step in ((0, 1, dx), (1, 0, dy), (1, 1, math.hypot(dx, dy)), (1, -1, math.hypot(dx, dy))):
            dh = np.abs(h[: rows - dr, max(0, -dc) : cols - max(0, dc)] - h[dr:, max(0, dc) : cols - max(0, -dc)])
            dh = dh[~np.isnan(dh)]
            if dh.size:
                longest = max(longest, walk_time(0.0, float(dh.max()), step))
        return longest

    def read(self, window: Window, dtype=np.float64) -> np.ndarray:
        """The cells of ``window``, NaN where not a vertex: float64, or ``dtype`` float32 where the
        values are exact in it (:func:`.incore.value_dtype`; a float store's NaN already marks
        its nodata: no copy, no mask then)."""
        st = self.store
        elev = st.read(window)
        if self.cost_array is None and elev.dtype.kind == "f":
            return elev.astype(dtype, copy=False)
        ok = st.valid(elev)
        if self.cost_array is None:
            vals = elev.astype(dtype)
        else:
            vals = self.cost_store.read(window, self.cost_array).astype(np.float64)
            ok &= self.cost_store.valid(vals) if self.cost_store is not st else np.isfinite(vals)
            ok &= np.isfinite(vals) & (vals >= 0)
            if self.model.kind == weight_models.WALK_FRICTION:
                vals = weight_models.pack_walk_friction(elev, vals)
        vals[~ok] = np.nan
        return vals

    def steps(self) -> np.ndarray:
        return weight_models.steps_of(*self.store.metric_cell_size)

    def every_cell_valid(self) -> bool:
        """True when the store's statistics say every cell is a vertex (no nodata, no cost raster),
        so that an unreached block's output is known without reading it."""
        a = self.store.attrs
        return self.cost_array is None and a.get("valid_count") is not None and a.get("valid_count") == a.get(
            "cell_count") == self.store.shape[0] * self.store.shape[1]

    # pickled by paths, so that Dask workers (same file system) reopen the stores themselves
    def __getstate__(self) -> dict:
        cost = None if self.cost_array is None else str(self.cost_store.path)
        return {"store": str(self.store.path), "model": self.model.name, "cost_store": cost,
                "cost_array": self.cost_array, "cost_id": self.cost_id}

    def __setstate__(self, state: dict) -> None:
        self.store = TerrainStore.open(state["store"], mode="r")
        self.model = weight_models.get(state["model"])
        self._tmp = None
        self.cost_array, self.cost_id = state["cost_array"], state["cost_id"]
        same = state["cost_store"] == state["store"]
        self.cost_store = self.store if same else (
            TerrainStore.open(state["cost_store"], mode="r") if state["cost_store"] else None)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.close()
            self._tmp = None


@dataclass
class Index:
    """An opened boundary index: its arrays and the cluster geometry."""

    name: str
    cluster: int
    d: object  # zarr array (ncr, ncc, B, B)
    v: object  # zarr array (ncr, ncc, B)
    attrs: dict

    @property
    def per_tile(self) -> int:
        return int(self.d.chunks[0])


def cluster_size(store: TerrainStore, cluster: int | None) -> int:
    c = int(cluster or DEFAULT_CLUSTER)
    if c < 2 or c & (c - 1):
        raise InputError(f"cluster size must be a power of two >= 2, got {c}")
    return min(c, store.tile_size)


def _wanted_attrs(store: TerrainStore, field: Field, c: int) -> dict:
    return {"kind": "sssp-boundary-index", "version": INDEX_VERSION, "weight": field.model.name,
            "cluster": c, "tile_size": store.tile_size, "shape": list(store.shape),
            "cell_size": list(store.metric_cell_size), "cost": field.cost_id}


def ensure_index(store: TerrainStore, field: Field, cluster: int | None = None, device: str = "cpu",
                 progress: bool = False, rebuild: bool = False, scheduler: str | None = "local",
                 announce=None, keep=None, memory: int | None = None) -> tuple[Index, bool]:
    """The stored index for these settings, built first when missing (or when ``rebuild``): (index, reused).

    Under an inter-process lock per (store, weight model), so a run that wants an index another
    run is building waits for it and reuses it instead of building it a second time. ``keep``:
    called with the cluster size just before a build; it may return a ``keep(a, b, d, v)`` that
    receives every block as it is computed (see :func:`build_index`); ``memory``: the run's budget
    in bytes (a quarter of it may hold blocks waiting to be written).
    """
    with store.lock(index_name(field.model)):
        index = None if rebuild else open_index(store, field, cluster)
        if index is not None:
            return index, True
        sink = keep(cluster_size(store, cluster)) if keep is not None else None
        return build_index(store, field, cluster, progress=progress, device=device, scheduler=scheduler,
                           announce=announce, keep=sink, memory=memory), False


def open_index(store: TerrainStore, field: Field, cluster: int | None = None) -> Index | None:
    """The stored index for these settings, or None when there is none (or it was built for others)."""
    name = index_name(field.model)
    try:
        group = store.group[name]
    except KeyError:
        return None
    attrs = dict(group.attrs)
    c = cluster_size(store, cluster if cluster is not None else attrs.get("cluster"))  # None: any stored size
    want = _wanted_attrs(store, field, c)
    if any(attrs.get(k) != v for k, v in want.items()) or "d" not in group or "v" not in group:
        return None
    return Index(name, c, group["d"], group["v"], attrs)


class _BackgroundWriter:
    """``sink(a, b, out_d, out_v)``: writes the G' blocks of the clusters from (a, b) on into the
    index arrays from two background threads while the next blocks are computed (plain file writes
    release the GIL; written in line they cost a third of phase 1 on two cores). At most ``limit``
    bytes of blocks wait; :meth:`close` waits for all and raises the first error. ``keep`` also gets
    every block, in the caller's thread."""

    def __init__(self, d, v, keep=None, limit: int = 64 << 20):
        from concurrent.futures import ThreadPoolExecutor

        self.d, self.v, self.keep, self.limit = d, v, keep, limit
        self.pool = ThreadPoolExecutor(2)
        self.pending = []

    def write(self, a: int, b: int, out_d, out_v) -> None:
        write_block(self.d, (a, b, 0, 0), out_d)
        write_block(self.v, (a, b, 0), out_v)

    def __call__(self, a: int, b: int, out_d, out_v) -> None:
        if self.keep is not None:
            self.keep(a, b, out_d, out_v)
        self.pending.append((self.pool.submit(self.write, a, b, out_d, out_v), out_d.nbytes + out_v.nbytes))
        while sum(n for _, n in self.pending) > self.limit:
            self.pending.pop(0)[0].result()

    def close(self) -> None:
        try:
            for f, _ in self.pending:
                f.result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _boundary_shard(vals, win: Window, t: int, c: int, kind: int, steps, device: str, sink, bar=None) -> None:
    """Phase 1 for one shard; every block of clusters (a.., b..) goes to ``sink(a, b, out_d, out_v)``.
    GPU: the whole shard in one launch (:func:`._pipeline_gpu.boundary_shard_gpu`). CPU: tile by
    tile, each tile's clusters in parallel (numba)."""
    BOUNDARY_SHARD[device](vals, win, t, c, kind, steps, sink, bar)


def _boundary_shard_cpu(vals, win: Window, t: int, c: int, kind: int, steps, sink, bar=None) -> None:
    from . import _pipeline_cpu as K  # (not at the top: the GPU's routes import no numba)

    B = 4 * c - 4
    for r0 in range(win.r0, win.r1, t):
        for c0 in range(win.c0, win.c1, t):
            tile = vals[r0 - win.r0 : r0 - win.r0 + t, c0 - win.c0 : c0 - win.c0 + t]
            mr, mc = -(-tile.shape[0] // c), -(-tile.shape[1] // c)
            out_d = np.full((mr, mc, B, B), np.inf, np.float32)
            out_v = np.full((mr, mc, B), np.nan)
            K.boundary_phase(np.ascontiguousarray(tile), c, kind, steps, out_d, out_v)
            sink(r0 // c, c0 // c, out_d, out_v)
            if bar is not None:
                bar.update(1)


BOUNDARY_SHARD = Dispatch("the SSSP index's phase 1", cpu=_boundary_shard_cpu,
                          gpu="terrain_io.grid.sssp._pipeline_gpu:boundary_shard_gpu")


def _index_task_bytes(store: TerrainStore, c: int, gpu: bool) -> int:
    """Host memory of one phase-1 shard task before its write queue: the shard's values (float64,
    and the store's read) and the G' blocks in hand -- a tile's and the one just handed to the
    writer on the CPU, the whole shard's on the GPU."""
    B = 4 * c - 4
    per_cluster = B * B * 4 + B * 8
    cells = (store.tile_size * store.shard_size) ** 2
    blocks = cells if gpu else 2 * store.tile_size ** 2
    return 16 * cells + blocks // (c * c) * per_cluster


@dataclass(frozen=True, eq=False)
class _IndexShard:
    """One shard of phase 1 as a Dask task (it writes only its own tiles' index chunks)."""

    field: Field
    d: str
    v: str
    window: Window
    cluster: int
    steps: np.ndarray
    device: str = "cpu"  # "gpu": the worker's GPU (dask-cuda gives each worker its own)
    write_limit: int = 64 << 20  # bytes of blocks waiting to be written


def _index_shard(task: _IndexShard) -> None:
    import zarr

    sink = _BackgroundWriter(zarr.open_array(task.d, mode="r+"), zarr.open_array(task.v, mode="r+"),
                             limit=task.write_limit)
    try:  # a tile's blocks are written while the next tile's are computed
        _boundary_shard(task.field.read(task.window), task.window, task.field.store.tile_size, task.cluster,
                        task.field.model.kind, task.steps, task.device, sink)
    finally:
        sink.close()


def build_index(store: TerrainStore, field: Field, cluster: int | None = None, progress: bool = False,
                device: str = "cpu", scheduler: str | None = "local", announce=None, keep=None,
                memory: int | None = None) -> Index:
    """Phase 1: the G' blocks of every cluster, written as ``index/<weight>``; with ``keep``, every
    block of clusters (a.., b..) computed here also goes to ``keep(a, b, out_d, out_v)`` (the
    merge's memory, so that a first source does not read G' back; not with a Dask scheduler).

    CPU: numba, tile by tile (clusters of a tile in parallel). GPU (clusters up to
    MAX_GPU_CLUSTER^2): the CuPy kernel of :mod:`._pipeline_gpu`, a whole shard of clusters per launch.
    With a Dask ``scheduler``: one task per shard, on the workers' CPUs or GPUs (``device``), each
    within ``memory`` (default: half the free RAM here).
    """
    c = cluster_size(store, cluster)
    budget = memory if memory is not None else memory_budget()
    gpu = device == "gpu" and c <= MAX_GPU_CLUSTER
    local = (scheduler or "local") == "local"
    if not local:  # a quarter of the budget for the write queue
        check_task_memory(_index_task_bytes(store, c, gpu) * 4 // 3, budget, "phase 1")
    timings = Timings()
    rows, cols = store.shape
    ncr, ncc = -(-rows // c), -(-cols // c)
    m = store.tile_size // c
    B = 4 * c - 4
    steps = field.steps()
    attrs = _wanted_attrs(store, field, c)
    bar = progress_bar(progress, store.tile_grid[0] * store.tile_grid[1], "sssp index")
    with store.write_result(index_name(field.model), attrs=attrs) as w:
        d = w.group.create_array("d", shape=(ncr, ncc, B, B), chunks=(m, m, B, B), dtype="float32",
                                 fill_value=float("inf"), compressors=None)
        v = w.group.create_array("v", shape=(ncr, ncc, B), chunks=(m, m, B), dtype="float64",
                                 fill_value=float("nan"), compressors=None)
        attrs["device"] = "gpu" if gpu else "cpu"
        w.attrs["device"] = attrs["device"]
        t = store.tile_size
        if not local:
            tasks = [_IndexShard(field, f"{d.store.root}/{d.path}", f"{v.store.root}/{v.path}", win, c, steps,
                                 "gpu" if gpu else "cpu", budget // 4) for win in store.shards()]
            bar.total = len(tasks)
            map_shards(_index_shard, tasks, scheduler, progress=bar, announce=announce)
        else:
            sink = _BackgroundWriter(d, v, keep, limit=budget // 4)
            try:
                for win in store.shards():
                    _boundary_shard(field.read(win), win, t, c, field.model.kind, steps, "gpu" if gpu else "cpu",
                                    sink, bar)
            finally:
                sink.close()
        w.attrs["seconds"] = round(timings.seconds(), 3)
    bar.close()
    group = store.group[index_name(field.model)]
    return Index(index_name(field.model), c, group["d"], group["v"], dict(group.attrs))


