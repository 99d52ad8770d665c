"""The depression hierarchy of a DEM, out of core (``terrain depressions``).

The merge tree of the basins of every local minimum (Barnes, Callaghan & Wickert 2020, "Computing
water flow through complex landscapes, part 2: finding hierarchies in depressions and
morphological segmentations", ESurf 8): its leaves are the local minima, each internal node the
union of two groups of basins at the level where they first meet, and the roots spill into the
outside O -- the minimax structure of :mod:`.fill` (docs/ARCHITECTURE.md#depression-filling)
read basin by basin.

Definitions (``outlets`` as in :func:`.fill.fill`: outlet cells are joined to O)
    - A *plateau* is a maximal 8-connected set of valid cells of equal elevation (most are one
      cell). It drains to its lowest neighbouring valid cell that is lower than it (ties: the least
      cell id, row-major); a plateau holding an outlet drains to O (O is lower than every cell).
    - A plateau with neither is a *local minimum*: a leaf. Leaves are numbered 1, 2, ... by their
      plateau's least cell id; the *pit* of a leaf is that cell.
    - Every valid cell belongs to the leaf its plateau's chain of receivers reaches (the raster
      ``depressions/basin``, uint32); cells whose chain reaches O have 0 (nodata cells too).
    - The basins form a graph with O (basin 0, with every cell labelled 0): two basins touch where
      two 8-neighbours carry their labels, at weight max(h_i, h_j). Kruskal over it in the strict
      order (weight, least cell id, other cell id) builds the tree: when two groups meet, a merge
      node is made; when a group meets O, its top node is a root. Every spill value is the minimax
      (least, over paths, of the highest elevation) between the two groups, so the level at which
      a root spills out is the fill level F of its pits (:func:`.fill.fill`).

Table, one row per node (``id``: leaves 1..L, merges L+1.. in order of creation; a parent's id
is above its children's): ``parent`` (0: none -- it spills out, or never), ``kind`` (leaf / merge),
``spill_elevation`` (where its water first overflows: into ``spills_to``, the other group's top
node, or 0 for the outside; NaN for a group with no way out, islands walled in by nodata under
``outlets="edge"``), the spill cell (the higher cell of the least edge by which it overflows;
row, col, x, y), ``merge_elevation`` (a merge's: the level its two children met), the pit (its
lowest leaf's, then least id), ``cells`` / ``area`` / ``volume``: the depression at its spill
level -- the cells of its basins lower than the spill elevation (they are connected to its pits
below that level) and the sum of (spill - h) x the cell area (metric cell size, as fill; for a
group that never spills: all its cells, volume NaN).

Pipeline (kernels :mod:`._cpu`), tiles in Morton batches as :mod:`..fill`:

1. Chains -- each tile (with a one-cell halo) finds its plateau pieces and follows receivers
   inside itself; each perimeter cell hands up where its chain ends (a leaf, O, a plateau that goes
   on into another tile, or a cell of a neighbouring tile), plus the tile's own leaves.
2. Boundary solve -- the O(N/T) perimeter nodes: plateaus joined across tiles (union-find), each
   with its lowest receiver; every node's chain followed to its leaf; leaves numbered
   (:func:`._cpu.solve_chains`). Out of core, never over all the nodes at once: each batch's nodes
   are contracted up fill's quadtree of tile blocks as phase 1 hands them in, kept on each block's
   outer boundary (:class:`ChainTree`), and solved down again block by block into phase 3.
3. Labels -- each tile again: final leaf ids (``depressions/basin``) and the least spill edge of
   each pair of labels that touch in it (halo cells' labels are their nodes').
4. Tree -- Kruskal in memory over the tiles' pair edges (above).
5. Volumes -- each tile a third time: a cell in basin L counts (1, h) in the lowest ancestor of L
   whose spill elevation is above h (skew-binary jump pointers, O(log depth)); subtree sums then
   give every node's cells and volume.

Memory: the per-cell work is in batches of tiles within ``memory`` (when the DEM, its masks and
labels fit, the whole DEM is one batch read once), beside the boundary solve: all O(N / T) nodes
when held, else the quadtree's O(the DEM's side) (:func:`_plan`, :mod:`.tiling`); arrays of
O(number of basins) -- leaves, the basin graph's pairs (~40 bytes each, about three a basin), the
tree (~100 bytes a node) -- are counted against the rest of the budget as the leaves are found (:data:`BASIN_BYTES`), and a budget they outgrow is
refused before the tree is built.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numba
import numpy as np

from ...atomic import scratch_directory
from ...backend import resolve_device
from ...errors import DeviceError, InputError
from ...jit import SERIAL_BELOW
from ...memory import format_bytes, memory_budget, return_freed_memory_to_os
from ...pinned import write_held
from ...progress import progress_bar
from ...store import TerrainStore, read_window, write_window
from ...tables import Table, cell_columns, row_ids, write_csv
from ...timings import Timings
from . import _cpu as K
from ..fill._tiled import (
    OUTLETS,
    TABLE_IN_ATTRS,
    Geometry,
    read_block,
)
from ..fill._levels import BlockTree, LocalLevels, node_set
from ..tiling import Plan, check_side, plan, plan_batches, whole_side

RESULT = "depressions"
TABLE_COLUMNS = ("id", "parent", "kind", "spill_elevation", "spill_row", "spill_col", "spill_x", "spill_y",
                 "spills_to", "merge_elevation", "pit_row", "pit_col", "pit_x", "pit_y", "pit_elevation", "cells",
                 "area", "volume")


@dataclass
class Hierarchy:
    """The merge tree, one entry per node in id order (index 0 unused: the outside)."""

    n_leaves: int
    parent: np.ndarray
    spill: np.ndarray  # NaN: never spills
    spill_cell: np.ndarray  # cell id, -1 none
    spills_to: np.ndarray
    merge: np.ndarray  # NaN for leaves
    pit: np.ndarray  # cell id
    pit_elevation: np.ndarray
    cells: np.ndarray
    volume_cells: np.ndarray  # elevation units x cells; NaN: never spills

    def __len__(self) -> int:
        return len(self.parent) - 1

    def rows(self, store: TerrainStore) -> Table:
        """The table's columns (TABLE_COLUMNS), with map coordinates and areas of ``store``, derived a
        block of rows at a time where used (row i is node i + 1)."""
        dx, dy = store.metric_cell_size
        node = slice(1, None)  # (row i is node i + 1: index 0 is the outside)
        return Table(len(self), {
            "id": row_ids, "parent": self.parent[node],
            "kind": lambda s: np.where(row_ids(s) <= self.n_leaves, "leaf", "merge"),
            "spill_elevation": self.spill[node], **cell_columns(store, self.spill_cell[node], "spill"),
            "spills_to": self.spills_to[node], "merge_elevation": self.merge[node],
            **cell_columns(store, self.pit[node], "pit"), "pit_elevation": self.pit_elevation[node],
            "cells": self.cells[node], "area": lambda s: self.cells[node][s] * (dx * dy),
            "volume": lambda s: self.volume_cells[node][s] * (dx * dy)})


@dataclass
class DepressionsResult:
    """What ``depressions`` computed; the same numbers are the attributes of the result group."""

    outlets: str
    device: str
    method: str  # "held" (the DEM read once) or "tiled" (read three times)
    cells: int
    leaves: int
    merges: int
    roots: int  # groups that spill out
    volume: float  # m^3 of the roots' depressions: the filled volume
    seconds: float
    timings: dict = field(default_factory=dict)
    tile_size: int = 0
    batch_tiles: int = 0
    hierarchy: Hierarchy | None = None

    def summary(self) -> str:
        return (f"depressions: {self.cells:,} cells, {self.leaves:,} leaf basin{'s' if self.leaves != 1 else ''}, "
                f"{self.merges:,} merges, {self.roots:,} spilling out, filled volume {self.volume:.6g} m^3, "
                f"outlets {self.outlets}, {self.seconds:.2f} s, "
                f"{self.cells / max(self.seconds, 1e-9) / 1e6:.1f} Mcells/s ({self.device}, {self.method})")

    def attrs(self) -> dict:
        return {"outlets": self.outlets, "device": self.device, "method": self.method, "cells": self.cells,
                "leaves": self.leaves, "merges": self.merges, "roots": self.roots, "volume": self.volume,
                "seconds": self.seconds, "timings": self.timings, "tile_size": self.tile_size,
                "batch_tiles": self.batch_tiles,
                "basin_ids": "leaf 1, 2, ... in order of its pit's cell id (row-major); 0: drains out or nodata"}


def _block_bytes(cells: int, itemsize: int) -> int:
    """Host memory per block cell: values, masks, basin labels."""
    return cells * (itemsize + 2 + 4)


def _plan(store: TerrainStore, geo: Geometry, budget: int) -> tuple[Plan, int]:
    """Hold the whole DEM, or the batch side in tiles. Held: the boundary solve over every node
    (NODE_BYTES each). Out of core: the quadtree of contracted blocks (O(the DEM's side),
    SIDE_BYTES a cell of rows + cols) and one batch's nodes and those of the tiles around it. Both:
    each thread's tile scratch (TILE_SCRATCH); out of core, tiles run on as many threads as the
    budget holds scratch for (returned with the plan: 16 threads' scratch is 200 MB with 256^2 tiles)."""
    t = store.tile_size
    rows, cols = store.shape
    isz = store.dtype.itemsize

    def need(k, n):
        return (SIDE_BYTES * (rows + cols) + (k + 2) ** 2 * 4 * t * NODE_BYTES + n * TILE_SCRATCH * t * t
                + _block_bytes((k * t + 2) ** 2, isz))

    threads = numba.get_num_threads()
    held_need = geo.nodes * NODE_BYTES + threads * TILE_SCRATCH * t * t + _block_bytes((rows + 2) * (cols + 2), isz)
    if held_need > budget:
        threads = int(min(threads, max(1, (budget - need(1, 0)) // (TILE_SCRATCH * t * t))))
    return plan(store, budget, "depressions", lambda k: need(k, threads), held_need=held_need), threads


NODE_BYTES = 100  # a boundary node in the solve: its row, union-find, its end, compact ids (measured ~95)
SIDE_BYTES = 500  # the quadtree's waiting graphs, the solved ends on the way down, the top's solve (~350 measured)
TILE_SCRATCH = 190  # bytes a tile cell of a thread's scratch: ~60 for the pieces, ~64 an edge between labels (two)


BASIN_BYTES = 600  # host memory a leaf basin takes at the tree's peak: its keys, pairs, tree nodes (measured ~550)


def _basins_fit(leaves: int, budget: int, planned: int, done: int, total: int) -> None:
    """Refuse a budget whose room beside the plan (``planned`` bytes) the basins (O(leaves):
    their pairs, the tree) outgrow, as soon as the leaves found show it and before the tree is
    built; the least budget named is extrapolated from ``done`` of ``total`` batches."""
    if planned + leaves * BASIN_BYTES > budget:
        least = planned + leaves * BASIN_BYTES * total // max(done, 1)
        raise InputError(f"memory budget {format_bytes(budget)} too small for this store's basins: {leaves:,} "
                         f"local minima in {done:,} of {total:,} batches, about {format_bytes(least - planned)} "
                         f"beside the tiles' {format_bytes(planned)} (raise --memory to about "
                         f"{format_bytes(least)} or more)")


def depressions(store, *, outlets: str = "edge+nodata", device: str = "auto", memory=None, progress: bool = True,
                batch_tiles: int | None = None, held: bool | None = None) -> DepressionsResult:
    """The depression hierarchy of the DEM in ``store`` (Barnes, Callaghan & Wickert 2020; module
    docstring); writes ``depressions/basin`` (uint32 leaf id per cell, 0: none).

    Parameters
    ----------
    store : TerrainStore or path
        The DEM store.
    outlets : {"edge+nodata", "edge"}
        As :func:`.fill.fill`.
    device : {"auto", "cpu"}
        CPU only for now (``"gpu"`` is a DeviceError).
    memory : str or int, optional
        The budget for the per-cell work, such as ``"2GB"`` (default: half the free RAM).
    progress : bool
        Show progress bars.
    batch_tiles, held : optional
        Force the batch side / holding the DEM (tests, benchmarks).

    Returns
    -------
    DepressionsResult
        Leaves, merges, roots and filled volume of the tree, and phase times.

    Examples
    --------
    >>> from tempfile import mkdtemp
    >>> from terrain_io.store import TerrainStore
    >>> st = TerrainStore.from_array(mkdtemp() + "/pit.zarr", np.array([[3.0, 3, 3], [3, 1, 3], [3, 2, 3]]))
    >>> res = depressions(st, progress=False)
    >>> res.leaves, res.roots
    (1, 1)
    """
    timings = Timings()
    return_freed_memory_to_os()
    if outlets not in OUTLETS:
        raise InputError(f"outlets must be one of {', '.join(OUTLETS)}, got {outlets!r}")
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    if store.dtype.kind not in "iuf":
        raise InputError(f"cannot find the depressions of a DEM of dtype {store.dtype}")
    if (device or "auto").lower() == "auto":
        device = "cpu"
    if resolve_device(device) == "gpu":
        raise DeviceError("depressions has no GPU kernels yet: use --device cpu")
    device = "cpu"
    budget = memory_budget(memory)
    rows, cols = store.shape
    geo = Geometry(rows, cols, store.tile_size)
    chosen, threads = _plan(store, geo, budget)
    plan_held = chosen.held if held is None else held
    k = chosen.side if batch_tiles is None else check_side(store, batch_tiles)
    if plan_held:
        k = whole_side(store)
    batches = plan_batches(store, k)
    whole_shard = k == store.shard_size
    nodata_drains = outlets == "edge+nodata"
    pool = (concurrent.futures.ThreadPoolExecutor(threads)
            if rows * cols >= SERIAL_BELOW and threads > 1 else None)
    tmap = pool.map if pool is not None else map
    kept = None
    try:
        with store.write_result(RESULT, attrs={"outlets": outlets}) as writer, contextlib.ExitStack() as scratch:
            basin_arr = writer.create_array("basin", "uint32", 0)
            tree = ChainTree(geo, k, None if len(batches) == 1 else
                             scratch.enter_context(scratch_directory(store.path, "depressions-chains")))

            # 1: chains inside the tiles, each batch's boundary nodes contracted up the quadtree
            with timings.phase("chains"):
                leaves = Gathered((np.int64, np.float64))
                n_found = done = 0  # leaves found so far (those on tile edges come in the solve)
                with progress_bar(progress, len(batches), "depressions: chains", unit="batch") as bar:
                    for b in batches:
                        vals, ok, outl = read_block(store, b.window, nodata_drains)
                        if plan_held:
                            kept = (vals, ok, outl)
                        local = LocalLevels(geo, b.window, np.zeros(0, np.int64), np.zeros(0, np.int64), K.UNSET,
                                            K.UNSET)
                        tgt = np.full(len(local.G), K.UNSET, np.int64)
                        openf = np.zeros(len(local.G), np.bool_)
                        pieces, cross = [], []
                        for o, cu, cv, lk, lh in tmap(partial(_chains, (vals, ok, outl), b.window.r0, b.window.c0,
                                                              _args(geo, local), tgt, openf), b.tiles):
                            pieces.append(o)
                            cross.append((cu, cv))
                            leaves.add((lk, lh))
                            n_found += len(lk)
                        del vals, ok, outl
                        tree.add_batch(int(b.codes[0]) >> tree.shift0, _batch_chains(local, tgt, openf, pieces, cross))
                        del local, tgt, openf, pieces, cross
                        done += 1
                        _basins_fit(n_found, budget, chosen.bytes, done, len(batches))
                        bar.update(1)

            # 2: the boundary solve up to the root (down again batch by batch in 3), leaves numbered
            with timings.phase("solve"):
                tree.finish()
                levels = tree.batch_levels()
                levels = itertools.chain([next(levels)], levels)  # the root solved: its plateaus' leaves in
                leaves.add(tree.leaves.joined())
                keys, leaf_h = leaves.joined()
                del leaves
                order = np.argsort(keys, kind="stable")
                keys, leaf_h = keys[order], leaf_h[order]
                n_leaves = len(keys)
                if n_leaves >= 2**32 - 1:
                    raise InputError(f"{n_leaves:,} local minima: more than uint32 basin ids hold")
                _basins_fit(n_leaves, budget, chosen.bytes, 1, 1)

            # 3: labels and the least spill edge of each touching pair
            with timings.phase("basins"):
                pairs = Gathered((np.uint32, np.uint32, np.float64, np.int64, np.int64, np.int64))
                basins = []
                with progress_bar(progress, len(batches), "depressions: basins", unit="batch") as bar:
                    for b in batches:
                        local = LocalLevels(geo, b.window, *next(levels)[1:], K.UNSET, K.UNSET)
                        res_id = np.where(local.G >= 0, np.searchsorted(keys, np.maximum(local.G, 0)) + 1,
                                          0).astype(np.uint32)
                        vals, ok, outl = kept if plan_held else read_block(store, b.window, nodata_drains)
                        basin = np.zeros(b.window.shape, np.uint32)
                        for out in tmap(partial(_labels, (vals, ok, outl), b.window.r0, b.window.c0,
                                                _args(geo, local), keys, res_id, basin), b.tiles):
                            pairs.add(out)
                        if plan_held:
                            basins.append(basin)
                        else:
                            write_window(basin_arr, b.window, basin, whole_shard)
                        del vals, ok, outl, local, res_id
                        bar.update(1)
                del levels, tree

            # 4: the tree
            with timings.phase("tree"):
                ea, eb, ew, elo, ehi, es = pairs.joined()
                del pairs
                # Kruskal's strict order; a pair's edges from other tiles than its least one's are skipped
                # by Kruskal itself (the pair is joined by then)
                sel = np.lexsort((ehi, elo, ew))
                parent, spill, scell, sto, merge, pit, pit_h = K.build_tree(
                    n_leaves, ea[sel].astype(np.int64), eb[sel].astype(np.int64), ew[sel], es[sel], leaf_h, keys)
                del ea, eb, ew, elo, ehi, es, sel
                up, jump = K.jump_pointers(parent)
                level = np.where(np.isnan(spill), np.inf, spill)

            # 5: cells and volumes under each node's spill level
            with timings.phase("volumes"):
                nn = len(parent)
                c_all = np.zeros(nn, np.int64)
                h_hi = np.zeros(nn, np.float64)
                h_lo = np.zeros(nn, np.float64)
                with progress_bar(progress, len(batches), "depressions: volumes", unit="batch") as bar:
                    for b in batches:
                        if plan_held:
                            vals = kept[0][1:-1, 1:-1]
                            basin = basins[0]
                        else:
                            vals = store.read(b.window)
                            basin = read_window(basin_arr, b.window, whole_shard)
                        ok = store.valid(vals)
                        for out in tmap(partial(_volumes, vals, ok, basin, up, jump, level), b.tiles):
                            K.add_volumes(*out, c_all, h_hi, h_lo)
                        bar.update(1)
                volume = K.subtree_volumes(parent, spill, c_all, h_hi, h_lo)
                if plan_held:
                    kept = None
                    write_held(store, (basin_arr, lambda s: basins[0][s]))
                    del basins

            tree = Hierarchy(n_leaves=n_leaves, parent=parent, spill=spill, spill_cell=scell, spills_to=sto,
                             merge=merge, pit=pit, pit_elevation=pit_h, cells=c_all, volume_cells=volume)
            roots = (parent[1:] == 0) & ~np.isnan(spill[1:])
            dx, dy = store.metric_cell_size
            result = DepressionsResult(
                outlets=outlets, device=device, method="held" if plan_held else "tiled", cells=rows * cols,
                leaves=n_leaves, merges=len(tree) - n_leaves, roots=int(roots.sum()),
                volume=float(volume[1:][roots].sum() * dx * dy), seconds=timings.seconds(),
                timings=timings.rounded(4), tile_size=store.tile_size, batch_tiles=k,
                hierarchy=tree)
            writer.attrs.update(result.attrs())
            if len(tree) <= TABLE_IN_ATTRS:
                writer.attrs["depression_tree"] = {c: _json(v) for c, v in tree.rows(store).items()}
    finally:
        if pool is not None:
            pool.shutdown()
    return result


def _cat(parts: list, i: int, dtype) -> np.ndarray:
    """Field ``i`` of every tile's output, concatenated."""
    return np.concatenate([p[i] for p in parts]) if parts else np.empty(0, dtype)


class Chains(NamedTuple):
    """A block's boundary nodes for the phase-2 solve (global node ids; ends: leaf key >= 0, -1 O,
    ``-2 - n`` node n, UNSET none): a row per node (its end, open: in a plateau that goes on across
    tiles, its end then ``-2 -`` a node of the plateau), the cross-tile pairs of plateau nodes, and
    the open pieces (or, contracted, plateaus) with their least receiver (:func:`._cpu.solve_chains`)."""

    node: np.ndarray
    tgt: np.ndarray
    open: np.ndarray
    cu: np.ndarray
    cv: np.ndarray
    rep: np.ndarray
    rh: np.ndarray
    rid: np.ndarray
    rend: np.ndarray
    outl: np.ndarray
    least: np.ndarray
    h: np.ndarray


class ChainTree(BlockTree):
    """Phase 2 out of core: the chains of the boundary nodes up and down fill's quadtree of
    contracted blocks (:mod:`..fill._levels`, the same blocks, spills and terminals). Up, a block's
    :class:`Chains` are solved with each terminal its own end, and kept for its terminals only:
    each terminal's end followed inside the block (to a leaf, O or another terminal), each plateau
    holding terminals as one piece (its least receiver, outlet, least cell) with its terminals
    joined; plateaus closed inside the block give their leaves (:attr:`leaves`). Down, a block is
    solved with the known ends of the nodes around it: every node's leaf key or O."""

    value_dtype = np.int64

    def __init__(self, geo, batch_side: int, scratch):
        super().__init__(geo, batch_side, scratch)
        self.leaves = Gathered((np.int64, np.float64))  # (keys, elevations) of the plateau leaves

    def _contract(self, shift, code, g):
        nodes, args = _compact(_taken(g), np.zeros(0, np.int64))
        terminal = self._terminal(shift, code, nodes)
        res, lk, lh, plateaus, first = K.solve_chains(len(nodes), *args, terminal, -2 - np.arange(len(nodes)))
        self.leaves.add((lk, lh))
        tgt, openf = args[0], args[1]
        row = np.flatnonzero(terminal & (tgt != K.UNSET))
        ends = np.where(openf[row], -2 - first[row], _follow(tgt[row], res))
        joined = np.flatnonzero(terminal & (first >= 0) & (first != np.arange(len(nodes))))
        rep, rh, rid, rend, outl, least, h = plateaus
        return Chains(nodes[row], _map_ends(ends, nodes.__getitem__), openf[row], nodes[first[joined]],
                      nodes[joined], nodes[rep], rh, rid, _map_ends(rend, nodes.__getitem__), outl, least, h)

    def _solve(self, shift, code, g, known):
        kn, kv = known
        nodes, args = _compact(_taken(g), kn)
        at = np.searchsorted(nodes, kn)
        terminal = np.zeros(len(nodes), np.bool_)
        terminal[at] = True
        ends = np.full(len(nodes), K.UNSET, np.int64)
        ends[at] = kv
        res, lk, lh, _, _ = K.solve_chains(len(nodes), *args, terminal, ends)
        if shift >= self.root_shift:  # (below it, the plateaus closed here gave their leaves on the way up)
            self.leaves.add((lk, lh))
        return nodes, res


class Gathered:
    """Rows of arrays handed in part by part (per tile, per block), joined into one part every
    JOIN_EVERY parts: a small array costs ~100 bytes of its own, per tile O(N / T^2) beside its rows."""

    JOIN_EVERY = 64

    def __init__(self, dtypes: tuple):
        self.dtypes = dtypes
        self.parts: list[tuple] = []

    def add(self, part: tuple) -> None:
        if len(part[0]):
            self.parts.append(part)
        if len(self.parts) >= self.JOIN_EVERY:
            self.parts = [self.joined()]

    def joined(self) -> tuple:
        return tuple(_cat(self.parts, i, dt) for i, dt in enumerate(self.dtypes))


def _taken(g: list) -> Chains:
    """The block's graph (a list, :class:`..fill._levels.BlockTree`'s) as Chains, the list emptied:
    its node-id arrays are then freed once compacted (at the top blocks, ~60% of ~700 KB)."""
    chains = Chains(*g)
    g.clear()
    return chains


def _is_node(e: np.ndarray) -> np.ndarray:
    return (e <= -2) & (e != K.UNSET)


def _map_ends(e: np.ndarray, f) -> np.ndarray:
    """Ends with the nodes they name mapped by ``f``."""
    out = e.copy()
    n = _is_node(e)
    out[n] = -2 - f(-2 - e[n])
    return out


def _follow(e: np.ndarray, res: np.ndarray) -> np.ndarray:
    """Ends with the nodes they name replaced by those nodes' solved ends."""
    n = _is_node(e)
    return np.where(n, res[np.where(n, -2 - e, 0)], e)


def _compact(g: Chains, extra: np.ndarray):
    """The nodes ``g`` names (and ``extra``), sorted, and g in their indices as
    :func:`._cpu.solve_chains` takes it."""
    nodes = node_set(g.node, -2 - g.tgt[_is_node(g.tgt)], g.cu, g.cv, g.rep, -2 - g.rend[_is_node(g.rend)], extra)
    at = partial(np.searchsorted, nodes)
    tgt = np.full(len(nodes), K.UNSET, np.int64)
    openf = np.zeros(len(nodes), np.bool_)
    row = at(g.node)
    tgt[row] = _map_ends(g.tgt, at)
    openf[row] = g.open
    return nodes, (tgt, openf, at(g.cu), at(g.cv), at(g.rep), g.rh, g.rid, _map_ends(g.rend, at), g.outl, g.least,
                   g.h)


def _batch_chains(local: LocalLevels, tgt, openf, pieces, cross) -> Chains:
    """Phase 1's output for one batch (local node ids, :class:`..fill._levels.LocalLevels`) as
    :class:`Chains` in global ids."""
    row = np.flatnonzero(tgt != K.UNSET)
    o = [_cat(pieces, i, dt) for i, dt in enumerate((np.int64, np.float64, np.int64, np.int64, np.bool_, np.int64,
                                                    np.float64))]
    return Chains(local.to_global(row), _map_ends(tgt[row], local.to_global), openf[row],
                  local.to_global(_cat(cross, 0, np.int64)), local.to_global(_cat(cross, 1, np.int64)),
                  local.to_global(o[0]), o[1], o[2], _map_ends(o[3], local.to_global), *o[4:])


def _args(geo: Geometry, local: LocalLevels):
    """The kernels' geometry arguments in the batch's local node numbering."""
    return geo.rows, geo.cols, geo.tile, geo.ntc, local.offset


def _chains(block, r0, c0, args, tgt, openf, t):
    return K.tile_chains(*block, *t, r0, c0, *args, K.tile_pieces(*block, *t, r0, c0, *args), tgt, openf)


def _labels(block, r0, c0, args, keys, res_id, basin, t):
    return K.tile_labels(*block, *t, r0, c0, *args, K.tile_pieces(*block, *t, r0, c0, *args), keys, res_id,
                         basin[t[0]:t[0] + t[2], t[1]:t[1] + t[3]])


def _volumes(vals, ok, basin, up, jump, level, t):
    s = slice(t[0], t[0] + t[2]), slice(t[1], t[1] + t[3])
    return K.tile_volumes(vals[s], ok[s], basin[s], up, jump, level)


def _json(v: np.ndarray) -> list:
    """A column for the attributes: NaN as None (JSON has no NaN)."""
    if v.dtype.kind == "f":
        return [None if math.isnan(x) else x for x in v.tolist()]
    return v.tolist()


def write_table(result: DepressionsResult, store, path) -> Path:
    """The node table as CSV (:func:`terrain_io.tables.write_csv`: a block of rows at a time, under a
    temporary name renamed when complete)."""
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store), mode="r")
    return write_csv(result.hierarchy.rows(store), path)


def read_basins(store) -> np.ndarray:
    """The ``depressions/basin`` raster of ``store`` in memory (small stores, tests)."""
    if not isinstance(store, TerrainStore):
        store = TerrainStore.open(Path(store))
    return np.asarray(store.group[f"{RESULT}/basin"][...])
