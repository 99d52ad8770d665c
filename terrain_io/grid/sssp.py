"""Single-source shortest paths on a DEM's 8-connected grid graph, out of core (``terrain sssp``).

The three-phase I/O-efficient algorithm of the terrain thesis, part III (ch. 4-5), after
Haverkort and Arge et al.; DESIGN.md "SSSP pipeline":

1. Boundary phase (:mod:`.index`) -- per c x c cluster, the shortest distances between all pairs
   of its boundary cells: the boundary graph G', stored in the store as ``index/<weight>`` and
   reused by every later source (same weight model, cluster size and cost raster).
2. Merge phase -- Dijkstra over G' from the sources (seeded with the distances from each source
   to its own cluster's boundary), with the thesis's cluster priority queue. G' is paged in
   tile-sized chunks through a bounded number of memory slots (``memory``), the evicted merge
   state goes to a scratch file, so G' may be many times larger than memory.
3. Final phase -- per cluster, Dijkstra seeded with its settled boundary distances and its
   sources; distance and predecessor are written shard by shard as ``sssp/NAME/distance``
   (float32: +inf where unreachable, NaN on nodata) and ``sssp/NAME/predecessor`` (uint8
   direction code from a cell to its parent, 255 at the sources and unreached cells).

Several sources give the multi-source distance (to the nearest source).
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field as dc_field
from pathlib import Path

import numpy as np

from .. import weights as weight_models
from ..backend import resolve_device
from ..errors import InputError
from ..memory import memory_budget
from ..store import TerrainStore, Window
from . import _sssp_cpu as K
from .index import Field, build_index, cluster_size, open_index

DISTANCE_DTYPE = "float32"


@dataclass
class SSSPResult:
    """What :func:`sssp` computed; the same facts are the attributes of ``sssp/NAME``."""

    name: str
    weight: str
    sources: list  # (row, col) cells
    cluster: int
    index_reused: bool
    reached: int
    max_distance: float
    timings: dict = dc_field(default_factory=dict)
    device: str = "cpu"

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())


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


class MergeState:
    """Phase 2's data: the cluster heap (in RAM) and G' chunks with their vertex state in slots.

    A chunk is one store tile's m x m clusters. When more chunks are needed than the slots hold,
    the least recently used one not near the current cluster is evicted: its vertex state goes
    to a scratch file, its G' block is read again from the index when next needed.
    """

    def __init__(self, store: TerrainStore, index, budget: int, scratch_dir):
        self.store = store
        self.index = index
        c = self.c = index.cluster
        self.m = m = store.tile_size // c
        self.B = B = 4 * c - 4
        rows, cols = store.shape
        self.ncr, self.ncc = -(-rows // c), -(-cols // c)
        self.TR, self.TC = store.tile_grid
        nchunks = self.TR * self.TC
        self.state_bytes = m * m * B * (8 + 8 + 1 + 1)
        slot_bytes = m * m * B * B * 4 + m * m * B * 8 + self.state_bytes
        ncl = self.ncr * self.ncc
        fixed = ncl * (8 + 8 + 8) + nchunks * 16
        nslots = max(min(9, nchunks), int((budget - fixed) // slot_bytes))
        self.S = S = min(nchunks, nslots)
        self.sD = np.empty((S, m, m, B, B), np.float32)
        self.sV = np.empty((S, m, m, B))
        self.sDist = np.empty((S, m, m, B))
        self.sRank = np.empty((S, m, m, B), np.int64)
        self.sHow = np.empty((S, m, m, B), np.uint8)
        self.sSet = np.empty((S, m, m, B), np.bool_)
        self.slot_of = np.full(nchunks, -1, np.int64)
        self.chunk_in = np.full(S, -1, np.int64)
        self.last_use = np.zeros(S, np.int64)
        self.saved = np.zeros(nchunks, np.bool_)
        self.ckey = np.full(ncl, np.inf)
        self.heap = np.zeros(ncl, np.int64)
        self.hpos = np.full(ncl + 1, -1, np.int64)
        self.hpos[-1] = 0
        self.counters = np.zeros(3, np.int64)
        self.loads = 0
        self.scratch = None
        if S < nchunks:
            fd, path = tempfile.mkstemp(prefix=".sssp-merge-", dir=scratch_dir)
            self.scratch = os.fdopen(fd, "w+b")
            os.unlink(path)

    def chunk_of_cluster(self, cr: int, cc: int) -> int:
        return (cr // self.m) * self.TC + cc // self.m

    def _keep(self, center: int) -> set:
        tr, tc = divmod(center, self.TC)
        return {y * self.TC + x for y in range(tr - 1, tr + 2) for x in range(tc - 1, tc + 2)
                if 0 <= y < self.TR and 0 <= x < self.TC}

    def load(self, ch: int, center: int | None = None) -> int:
        """Make chunk ``ch`` resident; returns its slot."""
        if self.slot_of[ch] >= 0:
            return int(self.slot_of[ch])
        free = np.flatnonzero(self.chunk_in < 0)
        if free.size:
            s = int(free[0])
        else:
            keep = self._keep(center if center is not None else ch) | {ch}
            order = np.argsort(self.last_use)
            s = next(int(x) for x in order if int(self.chunk_in[x]) not in keep)
            self._save(s)
        m, B = self.m, self.B
        tr, tc = divmod(ch, self.TC)
        a0, b0 = tr * m, tc * m
        a1, b1 = min(a0 + m, self.ncr), min(b0 + m, self.ncc)
        self.sD[s] = np.inf
        self.sD[s, : a1 - a0, : b1 - b0] = self.index.d[a0:a1, b0:b1]
        self.sV[s] = np.nan
        self.sV[s, : a1 - a0, : b1 - b0] = self.index.v[a0:a1, b0:b1]
        if self.saved[ch]:
            self.scratch.seek(ch * self.state_bytes)
            raw = np.frombuffer(bytearray(self.scratch.read(self.state_bytes)), np.uint8)
            n = m * m * B
            self.sDist[s].reshape(-1)[:] = raw[: 8 * n].view(np.float64)
            self.sRank[s].reshape(-1)[:] = raw[8 * n : 16 * n].view(np.int64)
            self.sHow[s].reshape(-1)[:] = raw[16 * n : 17 * n]
            self.sSet[s].reshape(-1)[:] = raw[17 * n :].view(np.bool_)
        else:
            self._init_state(s)
        self.slot_of[ch] = s
        self.chunk_in[s] = ch
        self.last_use[s] = self.counters[1]
        self.loads += 1
        return s

    def _init_state(self, s) -> None:
        self.sDist[s] = np.inf
        self.sRank[s] = -1
        self.sHow[s] = K.HOW_NONE
        self.sSet[s] = False

    def _save(self, s: int) -> None:
        ch = int(self.chunk_in[s])
        self.scratch.seek(ch * self.state_bytes)
        for arr in (self.sDist, self.sRank, self.sHow, self.sSet):
            self.scratch.write(np.ascontiguousarray(arr[s]).tobytes())
        self.saved[ch] = True
        self.slot_of[ch] = -1
        self.chunk_in[s] = -1

    def state(self, ch: int):
        """(dist, rank, how, settled) of chunk ``ch`` for the final phase (copies)."""
        s = self.slot_of[ch]
        if s >= 0:
            return self.sDist[s].copy(), self.sRank[s].copy(), self.sHow[s].copy(), self.sSet[s].copy()
        m, B = self.m, self.B
        if not self.saved[ch]:
            shape = (m, m, B)
            return (np.full(shape, np.inf), np.full(shape, -1, np.int64), np.full(shape, K.HOW_NONE, np.uint8),
                    np.zeros(shape, np.bool_))
        self.scratch.seek(ch * self.state_bytes)
        raw = np.frombuffer(bytearray(self.scratch.read(self.state_bytes)), np.uint8)
        n = m * m * B
        return (raw[: 8 * n].view(np.float64).reshape(m, m, B), raw[8 * n : 16 * n].view(np.int64).reshape(m, m, B),
                raw[16 * n : 17 * n].reshape(m, m, B), raw[17 * n :].view(np.bool_).reshape(m, m, B))

    def seed(self, field: Field, cells) -> None:
        """Distances from the sources to the boundary of their clusters: G' starts there."""
        c = self.c
        rows, cols = self.store.shape
        by_cluster: dict[tuple[int, int], list] = {}
        for r, col in cells:
            by_cluster.setdefault((r // c, col // c), []).append((r, col))
        for (cr, cc), members in by_cluster.items():
            r0, c0 = cr * c, cc * c
            win = Window(r0, min(r0 + c, rows), c0, min(c0 + c, cols))
            vals = np.ascontiguousarray(field.read(win))
            si = np.array([r - r0 for r, _ in members], np.int64)
            sj = np.array([q - c0 for _, q in members], np.int64)
            dist = K.source_boundary(vals, field.model.kind, field.steps(), si, sj)
            ch = self.chunk_of_cluster(cr, cc)
            s = self.load(ch)
            a, b = cr - (cr // self.m) * self.m, cc - (cc // self.m) * self.m
            bi, bj = K.boundary_cells(*vals.shape)
            srcs = set(zip(si.tolist(), sj.tolist()))
            for t in range(bi.size):
                d = dist[bi[t], bj[t]]
                if d < self.sDist[s, a, b, t]:
                    self.sDist[s, a, b, t] = d
                    self.sHow[s, a, b, t] = K.HOW_SOURCE if (int(bi[t]), int(bj[t])) in srcs else K.HOW_INTRA
            key = float(self.sDist[s, a, b][~self.sSet[s, a, b]].min())
            K.heap_set(self.heap, self.hpos, self.ckey, cr * self.ncc + cc, key)

    def run(self, field: Field) -> None:
        rows, cols = self.store.shape
        steps = field.steps()
        while True:
            need = K.merge_run(self.c, self.m, rows, cols, field.model.kind, steps, self.sD, self.sV, self.sDist,
                               self.sRank, self.sHow, self.sSet, self.slot_of, self.last_use, self.ckey,
                               self.heap, self.hpos, self.counters)
            if need < 0:
                return
            self.load(int(need), center=int(self.counters[2]))

    def close(self) -> None:
        if self.scratch is not None:
            self.scratch.close()


def sssp(store, sources, weight: str = "absdiff", name: str | None = None, device: str = "auto",
         memory=None, progress: bool = True, cost=None, cell: bool = False, cluster: int | None = None,
         rebuild_index: bool = False) -> SSSPResult:
    """Shortest paths from ``sources`` over the DEM's grid graph; writes ``sssp/NAME/{distance,predecessor}``.

    ``sources``: (x, y) map coordinates, or (row, col) cells with ``cell=True``; one pair or a list.
    ``weight``: ``absdiff`` (default), ``surface`` or ``cell`` (with ``cost``: a store array name or
    a raster file aligned with the DEM). ``memory``: budget such as ``"2GB"`` (default: half the
    free RAM). The boundary index is built on first use and reused afterwards.
    """
    store = store if isinstance(store, TerrainStore) else TerrainStore.open(store)
    model = weight_models.get(weight)
    if model.kind not in (weight_models.ABSDIFF, weight_models.SURFACE, weight_models.CELL):
        raise InputError(f"weight model {model.name!r} is not an SSSP model: use absdiff, surface or cell")
    dev = resolve_device(device)
    cells = parse_sources(store, sources, cell)
    name = name or default_name(cells)
    budget = memory_budget(memory)
    timings = {}
    field = Field(store, model, cost)
    try:
        t0 = time.perf_counter()
        index = None if rebuild_index else open_index(store, field, cluster)
        reused = index is not None
        if index is None:
            index = build_gpu_or_cpu(store, field, cluster, dev, progress)
        timings["boundary"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=".sssp-", dir=store.path.parent) as scratch_dir:
            merge = MergeState(store, index, budget, scratch_dir)
            try:
                merge.seed(field, cells)
                merge.run(field)
                timings["merge"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                reached, dmax = _final(store, field, merge, cells, name, model, index, timings, progress, reused)
                timings["final"] = time.perf_counter() - t0
            finally:
                merge.close()
    finally:
        field.close()
    result = SSSPResult(name, model.name, cells, index.cluster, reused, reached, dmax,
                        {k: round(v, 3) for k, v in timings.items()}, dev)
    store.group[f"sssp/{name}"].attrs.update({"timings": result.timings})
    return result


def build_gpu_or_cpu(store, field, cluster, device, progress):
    """Phase 1 on the chosen device (the CPU kernels serve both until a GPU kernel is present)."""
    return build_index(store, field, cluster, progress=progress)


def _final(store, field, merge, cells, name, model, index, timings, progress, reused):
    c, m = merge.c, merge.m
    t = store.tile_size
    steps = field.steps()
    src = np.array(cells, np.int64).reshape(-1, 2)
    attrs = {
        "weight": model.name,
        "source_cells": [list(map(int, rc)) for rc in cells],
        "source_xy": [list(map(float, store.cell_to_map(r, q))) for r, q in cells],
        "cluster": c,
        "index": index.name,
        "index_reused": reused,
        "distance_dtype": DISTANCE_DTYPE,
        "cost": field.cost_id,
        "unreached": "distance +inf, predecessor 255; nodata cells: distance NaN",
        "predecessor_codes": "direction from a cell to its parent: 0=E,1=SE,2=S,3=SW,4=W,5=NW,6=N,7=NE; 255 none",
    }
    reached = 0
    dmax = 0.0
    from tqdm import tqdm

    bar = tqdm(total=store.tile_grid[0] * store.tile_grid[1], desc="sssp final", unit="tile",
               disable=not progress, leave=False)
    with store.write_result(f"sssp/{name}", attrs=attrs) as w:
        dist_arr = w.create_array("distance", DISTANCE_DTYPE, float("nan"))
        pred_arr = w.create_array("predecessor", "uint8", K.NO_PRED)
        for win in store.shards():
            vals_shard = field.read(win)
            out_d = np.empty(win.shape, np.float32)
            out_p = np.empty(win.shape, np.uint8)
            for r0 in range(win.r0, win.r1, t):
                for c0 in range(win.c0, win.c1, t):
                    lr, lc = r0 - win.r0, c0 - win.c0
                    vals = np.ascontiguousarray(vals_shard[lr : lr + t, lc : lc + t])
                    ch = (r0 // t) * merge.TC + c0 // t
                    dist, rank, how, settled = merge.state(ch)
                    inside = (src[:, 0] >= r0) & (src[:, 0] < r0 + t) & (src[:, 1] >= c0) & (src[:, 1] < c0 + t)
                    h, wd = vals.shape
                    K.final_phase(vals, c, model.kind, steps, dist, rank, how, settled,
                                  np.ascontiguousarray(src[inside, 0] - r0), np.ascontiguousarray(src[inside, 1] - c0),
                                  out_d[lr : lr + h, lc : lc + wd], out_p[lr : lr + h, lc : lc + wd])
                    bar.update(1)
            finite = np.isfinite(out_d)
            reached += int(finite.sum())
            if finite.any():
                dmax = max(dmax, float(out_d[finite].max()))
            dist_arr[win.slices] = out_d
            pred_arr[win.slices] = out_p
        w.attrs.update({"reached": reached, "max_distance": dmax})
    bar.close()
    return reached, dmax
