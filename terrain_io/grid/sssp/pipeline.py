"""Single-source shortest paths on a DEM's 8-connected grid graph, out of core (``terrain sssp``).

The three-phase I/O-efficient algorithm of Gerritsen 2012, part III (ch. 4-5), after
Haverkort and Arge et al.; docs/ARCHITECTURE.md#sssp-index-pipeline:

1. Boundary phase (:mod:`.index`) -- per c x c cluster, the shortest distances between all pairs
   of its boundary cells: the boundary graph G', stored in the store as ``index/<weight>`` and
   reused by every later source (same weight model, cluster size and cost raster). When G' fits
   in the budget, the blocks of a first build also go straight into the merge's memory.
2. Merge phase -- shortest distances over G' from the sources (seeded with the distances from
   each source to its own cluster's boundary). When G' fits in the budget: the parallel
   label-correcting merge of :mod:`._merge` on all cores. Otherwise Gerritsen 2012's Dijkstra with
   the cluster priority queue, G' paged in tile-sized chunks through a bounded number of memory
   slots (``memory``), the evicted merge state in a scratch file, so G' may be many times larger
   than memory. Both give the same distances, bit for bit.
3. Final phase -- per cluster, Dijkstra seeded with its settled boundary distances and its
   sources; distance and predecessor are written shard by shard as ``sssp/NAME/distance``
   (float32: +inf where unreachable, NaN on nodata) and ``sssp/NAME/predecessor`` (uint8
   direction code from a cell to its parent, 255 at the sources and unreached cells).

Several sources give the multi-source distance (to the nearest source).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numba
import numpy as np

from ...backend import Dispatch
from ...errors import InputError
from ...atomic import scratch_directory
from ...memory import format_bytes, return_freed_memory_to_os
from ...parallel import check_task_memory, imap_shards
from ...progress import progress_bar
from ...integrity import MANIFEST_ENTRY_BYTES
from ...store import TerrainStore, Window, read_plain_chunk
from ...timings import Timings
from . import _pipeline_cpu as K
from ._pipeline_gpu import MAX_CLUSTER as MAX_GPU_CLUSTER
from ._merge import Seeds, merge_parallel
from .index import Field, cluster_size, ensure_index
from .result import NO_PRED, SSSPResult, write_result

class MergeState:
    """Phase 2's data: the cluster heap (in RAM) and G' chunks with their vertex state in slots.

    A chunk is a g x g group of clusters (a whole store tile when everything fits). When the
    budget holds fewer slots than there are chunks, the index is first copied into a flat scratch
    file, one record per chunk, and chunks are paged: the least recently used one not next to the
    current cluster is evicted, its vertex state written to the scratch file, its G' block read
    again when next needed. ``g`` is the largest group size whose slots still cover an estimated
    Dijkstra frontier (a few rings of chunks), so paging stays rare.

    ``index`` may come later (:meth:`attach`, with ``cluster`` given here): then phase 1 can hand
    its blocks straight to the slots (:meth:`keep_blocks`) and G' is never read back.
    """

    def __init__(self, store: TerrainStore, index, budget: int, scratch_dir, cluster: int | None = None):
        self.store = store
        self.index = None
        c = self.c = index.cluster if index is not None else cluster
        self.B = B = 4 * c - 4
        rows, cols = store.shape
        self.ncr, self.ncc = ncr, ncc = -(-rows // c), -(-cols // c)
        self.mt = store.tile_size // c  # clusters per tile side (the index's chunks)
        ncl = ncr * ncc
        # per cluster state, and the manifests of the index's two arrays (a chunk file a tile)
        fixed = ncl * (8 + 8 + 8 + 8 + 8) + 2 * -(-ncr // self.mt) * -(-ncc // self.mt) * MANIFEST_ENTRY_BYTES
        # G' block, values, merge state, and the parallel merge's work arrays (_merge)
        per_cluster = B * B * 4 + B * 8 + B * (8 + 8 + 1 + 1) + B * (1 + 4) + 49
        g = self.mt
        while True:
            nchunks = -(-ncr // g) * -(-ncc // g)
            slots = int((budget - fixed - nchunks * 24) // (g * g * per_cluster))
            frontier = 4 * (-(-ncr // g) + -(-ncc // g))
            if slots >= nchunks or slots >= frontier or g == 1:
                break
            g //= 2
        self.m = m = g
        self.TR, self.TC = -(-ncr // g), -(-ncc // g)
        nchunks = self.TR * self.TC
        def least(g):  # chunk table + 9 slots (a chunk and its neighbours) of g x g clusters
            n = -(-ncr // g) * -(-ncc // g)
            return n * 24 + min(9, n) * g * g * per_cluster

        # the least that must fit: the per-cluster state, the best chunking's slots, and one tile of
        # the final phase (values, distances, ranks, codes: ~32 bytes a cell)
        need = fixed + min(least(1 << k) for k in range(self.mt.bit_length())) + 32 * store.tile_size ** 2
        if budget < need:
            raise InputError(f"memory budget {format_bytes(budget)} too small for this store: the SSSP needs at least "
                             f"{format_bytes(need)} with {store.tile_size} x {store.tile_size} tiles and {c} x {c} "
                             "clusters (raise --memory)")
        self.S = S = min(nchunks, max(min(9, nchunks), slots))
        self.state_bytes = m * m * B * (8 + 8 + 1 + 1)
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
        self.cbest = np.full(ncl, -1, np.int64)
        self.tab, self.tcnt = K.crossing_table(c)
        self.heap = np.zeros(ncl, np.int64)
        self.hkey = np.zeros(ncl)
        self.hpos = np.full(ncl + 1, -1, np.int64)
        self.hpos[-1] = 0
        self.counters = np.zeros(3, np.int64)
        self.loads = 0
        self.budget = budget
        # clusters emitting per round of the parallel merge: enough work for every thread (tuned
        # on 2 and 16 cores, 2048^2 to 8192^2: larger batches cost re-emissions, smaller ones rounds)
        self.batch = 1024 * numba.get_num_threads()
        self.scratch = self.flat = None
        self.scratch_dir = scratch_dir
        self.kept = np.zeros(nchunks, np.bool_)  # chunks whose blocks phase 1 handed over
        if index is not None:
            self.attach(index)

    @property
    def resident(self) -> bool:
        """All of G' fits in the slots (one chunk = one store tile each): no paging."""
        return self.S >= self.TR * self.TC

    def keep_blocks(self, a: int, b: int, out_d: np.ndarray, out_v: np.ndarray) -> None:
        """Phase 1's blocks of the clusters from (a, b) on (whole tiles), copied into their slots."""
        m = self.m
        for i in range(0, out_d.shape[0], m):
            for j in range(0, out_d.shape[1], m):
                ch = ((a + i) // m) * self.TC + (b + j) // m
                d, v = out_d[i : i + m, j : j + m], out_v[i : i + m, j : j + m]
                if d.shape[:2] != (m, m):  # a tile at the DEM's edge: pad
                    self.sD[ch] = np.inf
                    self.sV[ch] = np.nan
                self.sD[ch, : d.shape[0], : d.shape[1]] = d
                self.sV[ch, : d.shape[0], : d.shape[1]] = v
                self.kept[ch] = True

    def attach(self, index) -> None:
        """Phase 2 gets its G': the chunks phase 1 did not hand over are read from ``index``
        (all of them into memory when they fit, else the paging files are set up)."""
        self.index = index
        if not self.resident:
            self.scratch = self._tempfile(self.scratch_dir)
            self.flat = self._tempfile(self.scratch_dir)
            self._copy_index()
        else:
            self._preload()

    def _preload(self) -> None:
        """Everything fits: every chunk into the slot of its own number, chunks in parallel
        threads (zarr and NumPy release the GIL)."""
        from concurrent.futures import ThreadPoolExecutor

        def load(ch: int) -> None:
            if not self.kept[ch]:
                self._read_index_block(ch, ch)
            self._clear_state(ch)
            self.slot_of[ch] = ch
            self.chunk_in[ch] = ch

        with ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1))) as pool:
            list(pool.map(load, range(self.TR * self.TC)))

    def _read_index_block(self, ch: int, s: int) -> None:
        """Chunk ``ch``'s G' blocks and values from the index into slot ``s``: read as plain bytes
        (:func:`read_plain_chunk`; a chunk at the DEM's edge is stored padded with inf distances and
        NaN values), else decoded by zarr straight into the slot (no intermediate copy) or padded."""
        from zarr.core.buffer import default_buffer_prototype

        m = self.m
        tr, tc = divmod(ch, self.TC)
        a0, b0 = tr * m, tc * m
        a1, b1 = min(a0 + m, self.ncr), min(b0 + m, self.ncc)
        sel = (slice(a0, a1), slice(b0, b1))
        whole = a1 - a0 == m and b1 - b0 == m
        if read_plain_chunk(self.index.d, (tr, tc, 0, 0), self.sD[s]) and read_plain_chunk(
                self.index.v, (tr, tc, 0), self.sV[s]):  # stored whole, padded at the edge
            return
        if whole:
            wrap = default_buffer_prototype().nd_buffer.from_numpy_array
            self.index.d.get_basic_selection(sel, out=wrap(self.sD[s]))
            self.index.v.get_basic_selection(sel, out=wrap(self.sV[s]))
        else:
            self.sD[s] = np.inf
            self.sD[s, : a1 - a0, : b1 - b0] = self.index.d[sel]
            self.sV[s] = np.nan
            self.sV[s, : a1 - a0, : b1 - b0] = self.index.v[sel]

    def _clear_state(self, s: int) -> None:
        """Slot ``s`` holds clusters nobody has reached yet."""
        self.sDist[s] = np.inf
        self.sRank[s] = -1
        self.sHow[s] = K.HOW_NONE
        self.sSet[s] = False

    @staticmethod
    def _tempfile(folder):
        fd, path = tempfile.mkstemp(prefix=".sssp-merge-", dir=folder)
        os.unlink(path)
        return os.fdopen(fd, "w+b")

    @property
    def record_bytes(self) -> int:
        return self.m * self.m * self.B * (self.B * 4 + 8)

    def _copy_index(self) -> None:
        """The index, tile chunk by tile chunk, as one flat record (G' block, values) per group."""
        m, mt = self.m, self.mt
        for a0 in range(0, self.ncr, mt):
            for b0 in range(0, self.ncc, mt):
                d = self.index.d[a0 : a0 + mt, b0 : b0 + mt]
                v = self.index.v[a0 : a0 + mt, b0 : b0 + mt]
                for ga in range(0, d.shape[0], m):
                    for gb in range(0, d.shape[1], m):
                        bd = np.full((m, m, self.B, self.B), np.inf, np.float32)
                        bv = np.full((m, m, self.B), np.nan)
                        dd = d[ga : ga + m, gb : gb + m]
                        bd[: dd.shape[0], : dd.shape[1]] = dd
                        bv[: dd.shape[0], : dd.shape[1]] = v[ga : ga + m, gb : gb + m]
                        ch = ((a0 + ga) // m) * self.TC + (b0 + gb) // m
                        os.pwrite(self.flat.fileno(), bd.tobytes() + bv.tobytes(), ch * self.record_bytes)

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
        if self.flat is not None:
            raw = os.pread(self.flat.fileno(), self.record_bytes, ch * self.record_bytes)
            nd = m * m * B * B * 4
            self.sD[s] = np.frombuffer(raw[:nd], np.float32).reshape(m, m, B, B)
            self.sV[s] = np.frombuffer(raw[nd:], np.float64).reshape(m, m, B)
        else:
            self._read_index_block(ch, s)
        if self.saved[ch]:
            dist, rank, how, settled = self._read_state(ch)
            self.sDist[s], self.sRank[s], self.sHow[s], self.sSet[s] = dist, rank, how, settled
        else:
            self._clear_state(s)
        self.slot_of[ch] = s
        self.chunk_in[s] = ch
        self.last_use[s] = self.counters[1]
        self.loads += 1
        return s

    def _save(self, s: int) -> None:
        ch = int(self.chunk_in[s])
        data = b"".join(np.ascontiguousarray(a[s]).tobytes() for a in (self.sDist, self.sRank, self.sHow, self.sSet))
        os.pwrite(self.scratch.fileno(), data, ch * self.state_bytes)
        self.saved[ch] = True
        self.slot_of[ch] = -1
        self.chunk_in[s] = -1

    def _read_state(self, ch: int):
        m, B = self.m, self.B
        raw = os.pread(self.scratch.fileno(), self.state_bytes, ch * self.state_bytes)
        n = m * m * B
        return (np.frombuffer(raw[: 8 * n], np.float64).reshape(m, m, B),
                np.frombuffer(raw[8 * n : 16 * n], np.int64).reshape(m, m, B),
                np.frombuffer(raw[16 * n : 17 * n], np.uint8).reshape(m, m, B),
                np.frombuffer(raw[17 * n :], np.bool_).reshape(m, m, B))

    def state(self, ch: int):
        """(dist, rank, how, settled) of chunk ``ch`` (views or read-only arrays)."""
        s = self.slot_of[ch]
        if s >= 0:
            return self.sDist[s], self.sRank[s], self.sHow[s], self.sSet[s]
        if self.saved[ch]:
            return self._read_state(ch)
        shape = (self.m, self.m, self.B)
        return (np.full(shape, np.inf), np.full(shape, -1, np.int64), np.full(shape, K.HOW_NONE, np.uint8),
                np.zeros(shape, np.bool_))

    def tile_state(self, tr: int, tc: int):
        """The merge's results for the clusters of store tile (tr, tc), shaped (mt, mt, B)."""
        m, mt, B = self.m, self.mt, self.B
        if m == mt:
            return tuple(np.ascontiguousarray(a) for a in self.state(tr * self.TC + tc))
        out = (np.full((mt, mt, B), np.inf), np.full((mt, mt, B), -1, np.int64),
               np.full((mt, mt, B), K.HOW_NONE, np.uint8), np.zeros((mt, mt, B), np.bool_))
        for ga in range(0, mt, m):
            for gb in range(0, mt, m):
                cr, cc = tr * mt + ga, tc * mt + gb
                if cr >= self.ncr or cc >= self.ncc:
                    continue
                for o, a in zip(out, self.state(self.chunk_of_cluster(cr, cc))):
                    o[ga : ga + m, gb : gb + m] = a
        return out

    def seed(self, field: Field, cells) -> None:
        """Distances from the sources to the boundary of their clusters: G' starts there."""
        c = self.c
        rows, cols = self.store.shape
        by_cluster: dict[tuple[int, int], list] = {}
        self.seeds = []  # (cluster, boundary number, distance, is a source)
        for r, col in cells:
            by_cluster.setdefault((r // c, col // c), []).append((r, col))
        # the clusters' values tile by tile, each tile read once (many sources: one read per cluster
        # would be one per source), their boundary distances kept (B numbers a cluster)
        t = self.store.tile_size
        solved = {}
        tile, tile_vals = None, None
        for cr, cc in sorted(by_cluster, key=lambda k: (k[0] * c // t, k[1] * c // t)):
            if (cr * c // t, cc * c // t) != tile:
                tile = (cr * c // t, cc * c // t)
                tile_win = Window(tile[0] * t, min(tile[0] * t + t, rows), tile[1] * t, min(tile[1] * t + t, cols))
                tile_vals = field.read(tile_win)
            r0, c0 = cr * c, cc * c
            vals = np.ascontiguousarray(tile_vals[r0 - tile_win.r0 : r0 - tile_win.r0 + c,
                                                  c0 - tile_win.c0 : c0 - tile_win.c0 + c])
            si = np.array([r - r0 for r, _ in by_cluster[cr, cc]], np.int64)
            sj = np.array([q - c0 for _, q in by_cluster[cr, cc]], np.int64)
            solved[cr, cc] = (vals.shape, si, sj, K.source_boundary(vals, field.model.kind, field.steps(), si, sj))
        del tile_vals
        for cr, cc in by_cluster:  # in the order of the sources, as before
            shape, si, sj, dist = solved.pop((cr, cc))
            ch = self.chunk_of_cluster(cr, cc)
            s = self.load(ch)
            a, b = cr - (cr // self.m) * self.m, cc - (cc // self.m) * self.m
            bi, bj = K.boundary_cells(*shape)
            srcs = set(zip(si.tolist(), sj.tolist()))
            for t in range(bi.size):
                d = dist[bi[t], bj[t]]
                if d < np.inf:
                    self.seeds.append((cr * self.ncc + cc, t, d, (int(bi[t]), int(bj[t])) in srcs))
                if d < self.sDist[s, a, b, t]:
                    self.sDist[s, a, b, t] = d
                    self.sHow[s, a, b, t] = K.HOW_SOURCE if (int(bi[t]), int(bj[t])) in srcs else K.HOW_INTRA
            free = np.where(self.sSet[s, a, b, : bi.size], np.inf, self.sDist[s, a, b, : bi.size])
            self.cbest[cr * self.ncc + cc] = int(np.argmin(free))
            K.heap_set(self.heap, self.hkey, self.hpos, self.ckey, cr * self.ncc + cc, float(free.min()))

    def run(self, field: Field, sequential: bool = False) -> None:
        """Phase 2: the parallel merge when G' is resident (unless ``sequential``), else the
        Gerritsen 2012's sequential Dijkstra with the cluster priority queue, paging G' if needed."""
        rows, cols = self.store.shape
        grid = K.ClusterGrid(self.c, self.m, rows, cols, field.model.kind, field.steps(), self.tab, self.tcnt)
        slots = K.Slots(self.sD, self.sV, self.sDist, self.sRank, self.sHow, self.sSet)
        if self.flat is None and self.S >= self.TR * self.TC and not sequential:
            seeds = self.seeds
            self.stats = merge_parallel(grid, slots, Seeds(np.array([x[0] for x in seeds], np.int64),
                                                           np.array([x[1] for x in seeds], np.int64),
                                                           np.array([x[2] for x in seeds], np.float64),
                                                           np.array([x[3] for x in seeds], np.bool_)), self.batch)
            return
        queue = K.ClusterQueue(self.ckey, self.cbest, self.heap, self.hkey, self.hpos)
        paging = K.Paging(self.slot_of, self.chunk_in, self.last_use, self.saved, self.counters)
        if self.flat is not None:
            for f in (self.flat, self.scratch):
                f.flush()
            self.scratch.truncate(self.TR * self.TC * self.state_bytes)
            if K.merge_run_paged(grid, slots, queue, paging, self.flat.fileno(), self.scratch.fileno()) < 0:
                raise OSError("sssp merge: reading or writing its scratch files failed (disk full?)")
            return
        while True:
            need = K.merge_run(grid, slots, queue, paging)
            if need < 0:
                return
            self.load(int(need), center=int(self.counters[2]))

    def close(self) -> None:
        for f in (self.scratch, self.flat):
            if f is not None:
                f.close()


def run_index(store: TerrainStore, field: Field, cells, name: str, device: str, budget: int, progress: bool,
              attrs: dict, cluster: int | None = None, rebuild_index: bool = False, scheduler: str | None = "local",
              announce=None, limit: float = np.inf, allocation: bool = False, predecessor: bool = True) -> SSSPResult:
    """The index method: phases 1-3 above (phase 1 skipped when a stored index fits); writes
    ``sssp/NAME`` with ``attrs`` added (cells beyond ``limit`` cleared from the final phase's
    output; ``source`` by a pass over the written predecessors when ``allocation``). The boundary index is built on first use and reused
    afterwards; ``scheduler`` runs phases 1 and 3 as Dask tasks, one per shard (terrain_io.parallel)."""
    model = field.model
    if (scheduler or "local") != "local":  # before any work (phase 1 checks its own tasks)
        check_task_memory(_final_task_bytes(store, cluster_size(store, cluster)), budget, "final phase")
    return_freed_memory_to_os()
    timings = Timings()
    with scratch_directory(store.path, "sssp") as scratch_dir:
        made = []

        def keep(c: int):
            """Phase 1 is about to run: when G' will fit in memory, it goes straight to the merge."""
            made.append(MergeState(store, None, budget, scratch_dir, cluster=c))
            return made[0].keep_blocks if made[0].resident else None

        with timings.phase("boundary"):
            index, reused = ensure_index(store, field, cluster, device, progress, rebuild=rebuild_index,
                                         scheduler=scheduler, announce=announce, keep=keep, memory=budget)
        with timings.phase("load"):  # G' into memory (or the paging set-up)
            merge = made[0] if made else MergeState(store, index, budget, scratch_dir)
            if made:
                merge.attach(index)
        try:
            with timings.phase("merge"):
                merge.seed(field, cells)
                merge.run(field)
            with timings.phase("final"):
                attrs = dict(attrs, cluster=index.cluster, index=index.name, index_reused=reused)
                reached, dmax = _final(store, field, merge, cells, name, attrs, progress, scheduler,
                                       device=device, limit=limit, allocation=allocation,
                                       predecessor=predecessor)
            merge_stats = getattr(merge, "stats", {})
        finally:
            merge.close()
    return SSSPResult(name, model.name, cells, "index", reached, dmax, timings.rounded(), device,
                      index.cluster, reused, merge_stats)


def _final(store, field, merge, cells, name, attrs, progress, scheduler="local", announce=None, device="cpu",
           limit=np.inf, allocation=False, predecessor=True):
    """Phase 3, shard by shard: here (on the GPU with ``device="gpu"``: the same bytes), or with a
    Dask ``scheduler`` as one task per shard that gets its tiles' merge results and writes its
    shard of ``distance`` and ``predecessor`` itself."""
    c = merge.c
    t = store.tile_size
    steps = field.steps()
    kind = field.model.kind
    src = np.array(cells, np.int64).reshape(-1, 2)
    bar = progress_bar(progress, store.tile_grid[0] * store.tile_grid[1], "sssp final")
    with write_result(store, name, attrs, allocation, predecessor) as arrays:
        dist_arr, pred_arr = arrays.distance, arrays.predecessor
        if (scheduler or "local") != "local":
            reached, dmax = _final_on_dask(store, field, merge, src, dist_arr, pred_arr, scheduler, announce, bar,
                                           device, limit)
        else:
            wins = list(store.shards())

            def compute(win, vals):
                states = (merge.tile_state(r0 // t, c0 // t) for r0, c0 in _shard_tiles(win, t))
                return _final_tiles(vals, win, t, c, kind, steps, states, src, bar, device, limit)

            def write(win, out_d, out_p):
                dist_arr[win.slices] = out_d
                pred_arr[win.slices] = out_p
                return _reach(out_d)

            # when G' was paged (a tight budget) one shard at a time; else up to ``lanes`` shards are
            # read ahead and as many compressed and written behind the one being computed, in
            # threads (zarr, numcodecs and NumPy release the GIL; ~21 bytes a cell per shard in flight)
            room = merge.budget - merge.sD.nbytes - 3 * merge.sDist.nbytes
            lanes = int(min(max(1, (os.cpu_count() or 2) // 2), room // (2 * 21 * wins[0].shape[0] * wins[0].shape[1])))
            if merge.flat is not None or lanes < 1:
                done = [write(win, *compute(win, field.read(win))) for win in wins]
            else:
                from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

                with ThreadPoolExecutor(2 * lanes) as pool:
                    reads = {i: pool.submit(field.read, wins[i]) for i in range(min(lanes, len(wins)))}
                    writes = []
                    for i, win in enumerate(wins):
                        vals = reads.pop(i).result()
                        if i + lanes < len(wins):
                            reads[i + lanes] = pool.submit(field.read, wins[i + lanes])
                        out = compute(win, vals)
                        del vals
                        pending = [f for f in writes if not f.done()]
                        if len(pending) >= lanes:
                            wait(pending, return_when=FIRST_COMPLETED)
                        writes.append(pool.submit(write, win, *out))
                        del out
                    done = [f.result() for f in writes]
            reached = sum(n for n, _ in done)
            dmax = max((d for _, d in done), default=0.0)
        if allocation:
            from .allocation import allocation_threads, write_allocation

            write_allocation(pred_arr, arrays.source, store.shards(), cells,
                             store.shape, allocation_threads(store, merge.budget, os.cpu_count() or 1))
        arrays.finish(reached, dmax)
    bar.close()
    return reached, dmax


def _shard_tiles(win: Window, t: int):
    """Top-left cells of the store tiles of shard window ``win``, row by row."""
    return [(r0, c0) for r0 in range(win.r0, win.r1, t) for c0 in range(win.c0, win.c1, t)]


def _sources_in(src: np.ndarray, win: Window) -> np.ndarray:
    """The rows (row, col) of ``src`` inside window ``win``."""
    inside = (src[:, 0] >= win.r0) & (src[:, 0] < win.r1) & (src[:, 1] >= win.c0) & (src[:, 1] < win.c1)
    return np.ascontiguousarray(src[inside])


def _final_tiles(vals_shard, win: Window, t: int, c: int, kind: int, steps, states, src, bar=None, device="cpu",
                 limit=np.inf):
    """Phase 3 for the tiles of one shard, all its clusters in one parallel numba call (or one
    CUDA launch with ``device="gpu"``); ``states``: each tile's (dist, rank, how, settled) from the
    merge, in the order of :func:`_shard_tiles`. Returns the shard's distance and predecessor,
    with the cells farther than ``limit`` unreached (their parents are all nearer, so no chain of
    a kept cell is cut)."""
    tiles = _shard_tiles(win, t)
    states = list(states)
    mt = states[0][0].shape[0]  # clusters per tile side
    ntr, ntc = -(-win.shape[0] // t), -(-win.shape[1] // t)
    merged = [np.empty((ntr * mt, ntc * mt) + a.shape[2:], a.dtype) for a in states[0]]
    for (r0, c0), tile in zip(tiles, states):
        i, j = (r0 - win.r0) // t * mt, (c0 - win.c0) // t * mt
        for whole, part in zip(merged, tile):
            whole[i : i + mt, j : j + mt] = part
    inside = _sources_in(src, win)
    src_r = np.ascontiguousarray(inside[:, 0] - win.r0)
    src_c = np.ascontiguousarray(inside[:, 1] - win.c0)
    on = device if c <= MAX_GPU_CLUSTER else "cpu"  # larger clusters than the GPU kernel's: the CPU's
    out_d, out_p = FINAL_PHASE[on](vals_shard, c, kind, steps, *merged, src_r, src_c)
    if limit < np.inf:
        beyond = out_d > np.float32(limit)
        out_d[beyond] = np.inf
        out_p[beyond] = NO_PRED
    if bar is not None:
        bar.update(len(tiles))
    return out_d, out_p


def _final_phase_cpu(vals, c: int, kind: int, steps, m_dist, m_rank, m_how, m_set, src_r, src_c):
    """Phase 3 of a shard on the CPU (all its clusters in one parallel numba call): distances
    (float32) and predecessor codes (uint8), as :func:`._pipeline_gpu.final_phase_gpu`."""
    out_d = np.empty(vals.shape, np.float32)
    out_p = np.empty(vals.shape, np.uint8)
    K.final_phase(np.ascontiguousarray(vals), c, kind, steps, m_dist, m_rank, m_how, m_set, src_r, src_c, out_d, out_p)
    return out_d, out_p


FINAL_PHASE = Dispatch("the SSSP index method's final phase", cpu=_final_phase_cpu,
                       gpu="terrain_io.grid.sssp._pipeline_gpu:final_phase_gpu")


def _reach(out_d) -> tuple[int, float]:
    """(cells reached, their largest distance) of a block of distances."""
    finite = np.isfinite(out_d)
    return int(finite.sum()), float(out_d[finite].max()) if finite.any() else 0.0


@dataclass(frozen=True, eq=False)
class _FinalShard:
    """One shard of phase 3 as a Dask task: the merge results of its tiles travel with it (about
    18 bytes per boundary cell), the values are read and the outputs written by the worker."""

    field: Field
    distance: str  # paths of the result arrays (in the result group being written)
    predecessor: str
    window: Window
    cluster: int
    steps: np.ndarray
    sources: np.ndarray  # (n, 2) source cells in this shard
    states: tuple  # per tile of the shard (see _shard_tiles): (dist, rank, how, settled)
    device: str = "cpu"  # "gpu": the worker's GPU
    limit: float = np.inf


def _final_shard(task: _FinalShard) -> tuple[int, float]:
    import zarr

    win, t = task.window, task.field.store.tile_size
    out_d, out_p = _final_tiles(task.field.read(win), win, t, task.cluster, task.field.model.kind, task.steps,
                                task.states, task.sources, device=task.device, limit=task.limit)
    zarr.open_array(task.distance, mode="r+")[win.slices] = out_d
    zarr.open_array(task.predecessor, mode="r+")[win.slices] = out_p
    return _reach(out_d)


FINAL_IN_FLIGHT_BYTES = 512 * 1024 * 1024  # merge results shipped in tasks not yet finished, about


def _shard_state_bytes(store: TerrainStore, c: int) -> int:
    """The merge results a final-phase task ships for one shard: per cluster boundary cell a distance,
    a rank (float64, int64), a how and a settled byte."""
    B = 4 * c - 4
    return store.shard_size ** 2 * (store.tile_size // c) ** 2 * B * (8 + 8 + 1 + 1)


def _final_task_bytes(store: TerrainStore, c: int) -> int:
    """Memory of one final-phase task: the shipped merge results and the shard's copy of them, its
    values (float64), distances and predecessors, and their compressed copies."""
    return 2 * _shard_state_bytes(store, c) + 21 * (store.tile_size * store.shard_size) ** 2


def _final_on_dask(store, field, merge, src, dist_arr, pred_arr, scheduler, announce, bar, device="cpu",
                   limit=np.inf):
    """One task per shard; tile states are gathered lazily, a bounded number of shards' worth at a time."""
    t = store.tile_size
    wins = list(store.shards())
    paths = [f"{a.store.root}/{a.path}" for a in (dist_arr, pred_arr)]
    steps = field.steps()

    def tasks():
        for win in wins:
            states = tuple(tuple(merge.tile_state(r0 // t, c0 // t)) for r0, c0 in _shard_tiles(win, t))
            yield _FinalShard(field, *paths, win, merge.c, steps, _sources_in(src, win), states, device, limit)

    shard_bytes = _shard_state_bytes(store, merge.c)
    reached, dmax = 0, 0.0
    results = imap_shards(_final_shard, tasks(), scheduler, in_flight=max(1, FINAL_IN_FLIGHT_BYTES // shard_bytes),
                          announce=announce)
    for (n, d), win in zip(results, wins):
        reached += n
        dmax = max(dmax, d)
        bar.update(len(_shard_tiles(win, t)))
    return reached, dmax
