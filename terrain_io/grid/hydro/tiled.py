"""Watersheds, basins, streams and HAND out of core: windows of k x k tiles in Morton order (the
batches of :func:`..tiling.plan_batches`, read with a one-cell halo by the flow pipeline's
:func:`..flow.pipeline.read_halo`), values carried along a forest of cells (:mod:`._forest`).

Each propagation runs in three phases, the plan of Barnes 2017 for flow accumulation run from the
roots down the chains:

1. Tile phase -- each window's parent chains followed to their ends (a root, or an exit whose
   parent lies in another window); its exits and the chain ends of its perimeter cells handed up.
2. Boundary solve -- every exit's value, following exit -> parent's chain end -> exit to a root
   (:func:`._forest.solve_exits`; memory: the windows' edge cells, as for accumulation).
3. Final phase -- each window's cells take their chain end's value and are written.

basins and watershed: one propagation on the flow forest (roots: the terminal cells, the outlets).
streams: one on the link forest (roots: the link heads; a cell's value is its head, so its link id
is the head's rank), then the link table (:func:`._forest.link_ends`), Strahler and Shreve per link
(:func:`._cpu.link_orders`, in memory: one row a link) and a pass writing them per cell.
HAND: the streams' links, then one propagation on the flow forest seeded at the stream cells
carrying (link, elevation). Every value is an integer or copied bits: the same bytes as in core,
for every window size.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Callable, Iterator, NamedTuple

import numpy as np

from ...errors import InputError
from ...progress import progress_bar
from ...store import TerrainStore, Window, read_window, write_window
from ..flow.codes import NODATA
from ..flow.pipeline import read_halo
from ..tiling import plan_batches
from . import _cpu, _forest as F

# host bytes of a window cell at the peak: codes, accumulation and mask with their halo, seeds, the
# parent codes and ids, chain ends and their scratch, the roots' values, the cells' values, outputs
WINDOW_BYTES = 100
# an edge cell of a window: an exit (2 ids) or a perimeter record (id, end, exit, tag, z), its solved
# value, twice while the lists are gathered and sorted
EDGE_BYTES = 150


def window_bytes(store: TerrainStore, side_tiles: int) -> int:
    """Host memory of one window of ``side_tiles`` tiles a side in flight."""
    return (side_tiles * store.tile_size + 2) ** 2 * WINDOW_BYTES


def window_need(store: TerrainStore, side_tiles: int, out_bytes: int) -> int:
    """Host memory with windows of ``side_tiles`` tiles a side: one window, every window's edge
    cells, and a shard of the outputs (``out_bytes`` a cell) that zarr rewrites when a window is
    part of one."""
    rows, cols = store.shape
    side = side_tiles * store.tile_size
    shard_side = store.tile_size * store.shard_size
    edge_cells = 2 * (rows * -(-cols // side) + cols * -(-rows // side))
    rewrite = 0 if side >= shard_side else min(shard_side, rows) * min(shard_side, cols) * out_bytes
    return window_bytes(store, side_tiles) + edge_cells * EDGE_BYTES + rewrite


def workers_within(store: TerrainStore, side_tiles: int, room: int, cores: int) -> int:
    """Windows computed at once: up to ``cores``, while each one more beside the window being
    written fits ``room`` (bytes of the budget beyond :func:`window_need`)."""
    return max(1, min(cores, room // window_bytes(store, side_tiles)))


class Forest(NamedTuple):
    """One window's forest: parent codes and the OUT cells' parent ids (:mod:`._forest`), and the
    value of each root (``tag``, ``z``; read at ROOT cells only)."""

    par: np.ndarray
    out_gid: np.ndarray
    tag: np.ndarray
    z: np.ndarray


class Solved(NamedTuple):
    """The boundary solve: every exit's global id (sorted) and value; the roots' global ids
    (sorted) when asked for."""

    exit_gid: np.ndarray
    tag: np.ndarray
    z: np.ndarray
    roots: np.ndarray | None


class Windows:
    """The batches of a store at one window size, and the readers of its arrays with a halo."""

    def __init__(self, store: TerrainStore, side: int, workers: int = 1):
        self.store = store
        self.batches = plan_batches(store, side)
        self.whole_shard = side == store.shard_size
        self.cols = store.shape[1]
        self.side = side
        self.workers = workers
        self.output_lock = threading.Lock()  # a worker may read an output array (HAND's links) while it is written

    def halo(self, name: str, win: Window, fill) -> np.ndarray:
        return read_halo(self.store.array(name), win, 1, fill, self.store.shape)

    def each(self, fn: Callable) -> Iterator:
        """``fn(batch)`` of every batch, in order; with several workers up to that many computed at
        once in threads (the kernels release the GIL; reads decode in zarr's threads), the caller
        consuming each result in order (writes stay in this thread, in order)."""
        if self.workers <= 1:
            for b in self.batches:
                yield fn(b)
            return
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
            ahead = iter(self.batches)
            pending = collections.deque(pool.submit(fn, b) for _, b in zip(range(self.workers), ahead))
            while pending:
                out = pending.popleft().result()
                b = next(ahead, None)
                if b is not None:
                    pending.append(pool.submit(fn, b))
                yield out

    def gids(self, win: Window) -> np.ndarray:
        """The global ids of a window's cells, row-major (int64)."""
        r = np.arange(win.r0, win.r1, dtype=np.int64)[:, None] * self.cols
        return (r + np.arange(win.c0, win.c1, dtype=np.int64)[None, :]).reshape(-1)

    def write(self, arr, win: Window, block) -> None:
        """Write an output array's window (zarr rewrites the shard of a part of one)."""
        with self.output_lock:
            write_window(arr, win, block, self.whole_shard)

    def read(self, arr, win: Window) -> np.ndarray:
        """Read back an output array's window."""
        with self.output_lock:
            return read_window(arr, win, self.whole_shard)


def _ends(forest: Forest) -> np.ndarray:
    end = np.empty(forest.par.size, np.int64)
    if not F.chain_ends(forest.par, end):
        raise InputError("the flow directions have cycles")
    return end


def solve(wins: Windows, forest: Callable[[Window], Forest], progress: bool, what: str,
          roots: bool = False) -> Solved:
    """Phases 1 and 2 (module docstring): ``forest(win)`` builds a window's forest; ``roots``:
    gather the ROOT cells' global ids."""
    cols = wins.cols
    exits, recs, found = [], [], []

    def tile(b):
        win = b.window
        h, w = win.shape
        f = forest(win)
        end = _ends(f)
        eg, ep, rg, re = F.tile_records(f.par, f.out_gid, end, h, w, win.r0, win.c0, cols)
        rexit = np.where(f.par[re] == F.OUT, (win.r0 + re // w) * cols + win.c0 + re % w, -1)
        return (eg, ep), (rg, rexit, f.tag[re], f.z[re]), wins.gids(win)[f.par == F.ROOT] if roots else None

    with progress_bar(progress, len(wins.batches), f"{what} (tiles)", unit="batch") as bar:
        for e, r, o in wins.each(tile):
            exits.append(e)
            recs.append(r)
            found.append(o)
            bar.update(1)
    cat = lambda parts, i: np.concatenate([p[i] for p in parts])  # noqa: E731
    exit_gid, exit_par = cat(exits, 0), cat(exits, 1)
    o = np.argsort(exit_gid, kind="stable")
    exit_gid, exit_par = exit_gid[o], exit_par[o]
    del exits
    rec_gid, rec_exit, rec_tag, rec_z = (cat(recs, i) for i in range(4))
    o = np.argsort(rec_gid, kind="stable")
    rec_gid, rec_exit, rec_tag, rec_z = rec_gid[o], rec_exit[o], rec_tag[o], rec_z[o]
    del recs, o
    tag, z = np.zeros(len(exit_gid), np.int64), np.zeros(len(exit_gid), np.float64)
    if not F.solve_exits(exit_gid, exit_par, rec_gid, rec_exit, rec_tag, rec_z, tag, z):
        raise InputError("the flow directions have cycles")
    if roots:
        found = np.concatenate(found)
        found.sort()  # in place: no second copy of the roots (8 bytes a basin)
    return Solved(exit_gid, tag, z, found if roots else None)


def finish(wins: Windows, forest: Callable[[Window], Forest], solved: Solved, emit: Callable, progress: bool,
           what: str) -> None:
    """Phase 3: ``emit(win, forest, tag, z)`` takes each window's cell values (2-D; tag int64, 0
    where no chain; z float64, NaN there)."""
    cols = wins.cols

    def values(b):
        win = b.window
        h, w = win.shape
        f = forest(win)
        end = _ends(f)
        tag, z = np.zeros(h * w, np.int64), np.full(h * w, np.nan)
        F.cell_values(f.par, end, h, w, win.r0, win.c0, cols, f.tag, f.z, solved.exit_gid, solved.tag, solved.z, tag, z)
        return win, f, tag.reshape(h, w), z.reshape(h, w)

    with progress_bar(progress, len(wins.batches), f"{what} (final)", unit="batch") as bar:
        for out in wins.each(values):
            emit(*out)
            bar.update(1)


def _flow_forest(wins: Windows, win: Window, seed: np.ndarray, tag: np.ndarray, z: np.ndarray) -> Forest:
    h, w = win.shape
    code = wins.halo("flow/direction", win, NODATA)
    par, out_gid = np.empty(h * w, np.int64), np.empty(h * w, np.int64)
    F.flow_parents(code, seed, win.r0, win.c0, wins.cols, par, out_gid)
    return Forest(par, out_gid, tag, z)


def _zeros(win: Window) -> np.ndarray:
    """Root values of a propagation that carries only tags."""
    return np.zeros(win.shape[0] * win.shape[1])


def _valid(f: Forest, win: Window) -> np.ndarray:
    return f.par.reshape(win.shape) != F.NONE


def _counts(label: np.ndarray, total: np.ndarray) -> None:
    """``total[i]`` += the cells of ``label`` labelled i (in place: no count array a window)."""
    _cpu.count_labels(label.reshape(-1), total)


def basins(wins: Windows, label_arr, progress: bool, found: Callable[[int], None] | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """``label_arr`` written (a basin's id: the rank of its terminal cell, 1..); returns the
    terminal cells' global ids (sorted) and each basin's cell count. ``found(n)`` is called with the
    number of basins once the boundary solve has found them, before the final phase (the caller
    fits the windows in flight to what the table leaves of the budget, or refuses)."""
    def forest(win):
        return _flow_forest(wins, win, np.zeros(win.shape, np.uint8), wins.gids(win), _zeros(win))

    solved = solve(wins, forest, progress, "basins", roots=True)
    terminals = solved.roots
    if found is not None:
        found(len(terminals))
    total = np.zeros(len(terminals) + 1, np.int64)

    def emit(win, f, tag, z):
        label = np.where(_valid(f, win), np.searchsorted(terminals, tag) + 1, 0).astype(np.uint32)
        _counts(label, total)
        wins.write(label_arr, win, label)

    finish(wins, forest, solved, emit, progress, "basins")
    return terminals, total[1:]


def watershed(wins: Windows, outlets: np.ndarray, label_arr, progress: bool) -> np.ndarray:
    """``label_arr`` written (i + 1 where a cell drains to ``outlets[i]`` (global ids) first);
    returns each outlet's cell count."""
    order = np.argsort(outlets)
    sorted_ids = outlets[order]

    def forest(win):
        gid = wins.gids(win)
        k = np.minimum(np.searchsorted(sorted_ids, gid), len(sorted_ids) - 1)
        hit = sorted_ids[k] == gid
        tag = np.where(hit, order[k] + 1, 0)
        return _flow_forest(wins, win, hit.reshape(win.shape).view(np.uint8), tag, _zeros(win))

    total = np.zeros(len(outlets) + 1, np.int64)

    def emit(win, f, tag, z):
        label = tag.astype(np.uint32)
        _counts(label, total)
        wins.write(label_arr, win, label)

    finish(wins, forest, solve(wins, forest, progress, "watershed"), emit, progress, "watershed")
    return total[1:]


class LinkTable(NamedTuple):
    """Per link (index = id - 1): its head's and last cell's global ids, the downstream link id (0
    none), its cells, the accumulation at its last cell."""

    head: np.ndarray
    tail: np.ndarray
    downstream: np.ndarray
    cells: np.ndarray
    upstream: np.ndarray


class Streams:
    """The stream cells (accumulation >= ``threshold``, valid) and their link forest."""

    def __init__(self, wins: Windows, threshold: float):
        self.wins, self.threshold = wins, threshold

    def mask(self, win: Window, with_acc: bool = False) -> tuple:
        """A window's codes and stream mask (and accumulation) with a one-cell halo."""
        code = self.wins.halo("flow/direction", win, NODATA)
        acc = self.wins.halo("flow/accumulation", win, 0)
        stream = (acc >= self.threshold) & (code != NODATA)
        return (code, acc, stream) if with_acc else (code, stream)

    def forest(self, win: Window) -> Forest:
        h, w = win.shape
        code, stream = self.mask(win)
        par, out_gid = np.empty(h * w, np.int64), np.empty(h * w, np.int64)
        F.link_parents(code, stream, win.r0, win.c0, self.wins.cols, par, out_gid)
        return Forest(par, out_gid, self.wins.gids(win), _zeros(win))

    def links(self, link_arr, progress: bool, what: str, table: bool = True):
        """``link_arr`` written (uint32 link ids: the rank of the link's head, 0 off the network);
        returns the heads' global ids (sorted) and, with ``table``, the link table: tail (global
        id), downstream link id, cells."""
        solved = solve(self.wins, self.forest, progress, what, roots=True)
        heads = solved.roots
        n = len(heads)
        tail, downstream, cells = np.zeros(n, np.int64), np.zeros(n, np.uint32), np.zeros(n, np.int64)
        upstream = np.zeros(n, self.wins.store.group["flow/accumulation"].dtype)

        def emit(win, f, tag, z):
            link = np.where(_valid(f, win), np.searchsorted(heads, tag) + 1, 0).astype(np.uint32)
            if table:
                code, acc, stream = self.mask(win, with_acc=True)
                F.link_ends(code, stream, acc, link, win.r0, win.c0, self.wins.cols, heads, tail, downstream, cells,
                            upstream)
            self.wins.write(link_arr, win, link)

        finish(self.wins, self.forest, solved, emit, progress, what)
        return LinkTable(heads, tail, downstream, cells, upstream)


def orders(downstream: np.ndarray, cells_total: int) -> tuple[np.ndarray, np.ndarray]:
    """Strahler (uint8) and Shreve (uint32; uint64 from 2^32 cells) of every link."""
    n = len(downstream)
    strahler = np.zeros(n, np.uint8)
    shreve = np.zeros(n, np.uint32 if cells_total < 2**32 else np.uint64)
    if not _cpu.link_orders(downstream, strahler, shreve):
        raise InputError("the stream links have cycles")
    return strahler, shreve


def per_cell(wins: Windows, link_arr, strahler, shreve, order_arr, magnitude_arr, progress: bool) -> None:
    """``order_arr`` and ``magnitude_arr`` written from each stream cell's link."""
    s = np.concatenate([[0], strahler]).astype(np.uint8)
    m = np.concatenate([[0], shreve]).astype(shreve.dtype)
    with progress_bar(progress, len(wins.batches), "streams (orders)", unit="batch") as bar:
        for b in wins.batches:
            link = wins.read(link_arr, b.window)
            wins.write(order_arr, b.window, s[link])
            wins.write(magnitude_arr, b.window, m[link])
            bar.update(1)


def hand(wins: Windows, streams: Streams, source: str, height_arr, drainage_arr, progress: bool) -> tuple[int, float]:
    """``drainage_arr`` first holds the stream cells' links, then every cell's drainage link;
    ``height_arr`` the HAND (float32; NaN where the flow path meets no stream). Returns how many
    cells drain to a stream and the highest HAND (NaN: none)."""
    streams.links(drainage_arr, progress, "hand: links", table=False)
    store = wins.store

    def forest(win):
        _, stream = streams.mask(win)
        seed = np.ascontiguousarray(stream[1:-1, 1:-1])
        link = wins.read(drainage_arr, win).astype(np.int64).reshape(-1)
        z = np.where(seed.reshape(-1), store.read(win, source).astype(np.float64).reshape(-1), np.nan)
        return _flow_forest(wins, win, seed.view(np.uint8), link, z)

    drained, top = [0], [np.nan]

    def emit(win, f, tag, dz):
        z = store.read(win, source).astype(np.float64)
        height = (z - dz).astype(np.float32)  # NaN where no stream (dz NaN) and at nodata
        ok = ~np.isnan(height)
        drained[0] += int(np.count_nonzero(ok))
        if ok.any():
            top[0] = float(np.fmax(top[0], height[ok].max()))
        wins.write(height_arr, win, height)
        wins.write(drainage_arr, win, tag.astype(np.uint32))

    finish(wins, forest, solve(wins, forest, progress, "hand"), emit, progress, "hand")
    return drained[0], top[0]
