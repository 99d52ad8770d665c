"""The in-core SSSP engine: a block of the grid solved whole in memory (docs/ARCHITECTURE.md#sssp-engines).

The in-core and shard methods give these answers, byte for byte (the index method its own
predecessors on exact ties):

* **Distance**: the fixpoint of d(v) = min over neighbours u of fl(d(u) + w(u, v)) in float64,
  d = 0 at the sources -- the least left-to-right float64 sum over all paths. Rounding is
  monotone, so the fixpoint is unique and every label-correcting order (Dijkstra on the CPU,
  tile relaxation on the GPU, shard by shard out of core) reaches the same bits. Stored as float32.
* **Plateau level** L(v) (the tie rule's helper): an edge u -> v is *tight* when
  fl(d(u) + w(u, v)) == d(v). L(v) = 0 at a source or where a tight parent is strictly nearer;
  otherwise all tight parents lie at the same distance (zero-weight edges, flat ground) and
  L(v) = 1 + min L(u) over them: the hop count across the plateau from where it was entered.
* **Predecessor**: among v's tight parents, the one with the least key -- 0 when it is strictly
  nearer, else L(u) + 1 -- and of those the least direction code (0=E ... 7=NE). Keys fall along
  every chain ((d, L) decreases lexicographically), so chains never cycle and end at a source.

A block is an (h + 2) x (w + 2) array with a one-cell ring: NaN outside the DEM for a whole-grid
solve, a neighbouring shard's cells (with their distances and levels fixed) for a shard solve.
CPU: :mod:`._incore_cpu` (numba); GPU: :mod:`._incore_gpu` (CuPy, tiles relaxed in shared memory).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ...backend import Dispatch, gpu_free_bytes, resolve_device
from ...errors import TerrainNote
from ...jit import SERIAL_BELOW
from ...timings import Timings
from .result import NO_LEVEL, SSSPResult, write_result

_NO_CELLS = np.empty(0, np.int64)  # the levels kernel's cell list when it runs on every cell


SEARCH_BYTES = 32  # a CPU solve's work memory at its largest, bytes an interior cell: see block_bytes


def block_bytes(h: int, w: int, value_itemsize: int = 8, device: str = "cpu") -> int:
    """Memory of one block solve: the ringed block's values, distances (float64) and levels (int32),
    and the interior's codes, then the float32 output with its NaN mask (the levels freed) or, on
    the CPU, the work of the solve (SEARCH_BYTES a cell, at most one of them at a time):
    - the plateau search: its list of plateau cells (8 bytes each), with the seeds and their sort
      (24 bytes a seed, one a cell at most) or the queue and the sorted seeds (8 + 12);
    - Dijkstra's heap (16 bytes an entry) and FIFO (8), or its buckets (16 bytes an entry), which
      hold its frontier: lines of cells on terrain, flat areas included (the FIFO searches them
      breadth-first); measured on 2048^2 random, synthetic, quantised and flat DEMs: at most 0.016
      heap entries a cell (0.25 bytes).
    On the GPU the solve's work is a few lists of tiles: 8 bytes a cell cover the output and its mask."""
    work = SEARCH_BYTES if device == "cpu" else 8
    return (h + 2) * (w + 2) * (value_itemsize + 8 + 4) + h * w * (1 + work)


def solve_block(vals: np.ndarray, kind: int, steps: np.ndarray, sources, dist: np.ndarray | None = None,
                level: np.ndarray | None = None, device: str = "cpu", warm: bool = False, limit: float = np.inf,
                pred: np.ndarray | None = None, changed: np.ndarray | None = None, parallel: bool | None = None):
    """Solve the interior of a ringed block.

    ``vals``: (h + 2, w + 2) float32/float64 values, NaN where a cell is not a vertex; ``sources``:
    (n, 2) interior cells as (row, col) of the interior (0-based); ``dist``/``level``: the ring's
    fixed distances (float64) and plateau levels (int32, NO_LEVEL unknown) in arrays of the block's
    shape (their interior is overwritten), or None for an all-NaN ring. Returns ``(dist, level,
    pred)``: the block's float64 distances and int32 levels (ring unchanged) and the interior's
    uint8 parent codes. ``device="gpu"`` solves on the GPU (the same bytes; arrays come back as
    CuPy arrays). ``warm``: ``dist`` already holds this block's solution for a ring whose
    distances have only fallen since; only what the ring's change reaches is solved again (the
    levels and codes are found anew).
    CPU, warm, with ``pred`` (the earlier solve's codes, h x w, updated in place and returned) and
    ``changed`` (uint8, the block's shape: 1 at the ring cells whose distance or level differs
    from the earlier solve's ring; used as work space): ``level`` too holds the earlier solve's
    levels, and levels and codes are found again only where the change reaches
    (:func:`._incore_cpu.affected_cells`) -- the same bytes for the work of the change.
    ``limit`` (``--max-cost``): cells farther than it stay unreached; the rest get the values of a
    run without it, and the work follows the area reached. ``parallel``: the CPU's threaded
    kernels (default: for blocks of SERIAL_BELOW cells or more)."""
    H2, W2 = vals.shape
    device = resolve_device(device)
    xp = np
    if device == "gpu":
        import cupy as xp
    if dist is None:
        dist = xp.full((H2, W2), np.inf)
    if level is None:
        level = xp.full((H2, W2), NO_LEVEL, np.int32)
    src = np.asarray(sources, np.int64).reshape(-1, 2)
    flat_src = (src[:, 0] + 1) * W2 + src[:, 1] + 1
    return SOLVE_BLOCK[device](vals, kind, steps, flat_src, dist, level, warm, limit, pred, changed, parallel)


def _solve_block_cpu(vals, kind, steps, flat_src, dist, level, warm=False, limit=np.inf, pred=None, changed=None,
                     parallel=None):
    """:func:`solve_block` on the CPU (numba, :mod:`._incore_cpu`), ``flat_src`` the sources' flat
    indices in the ringed block."""
    from . import _incore_cpu as K  # (not at the top: the GPU's route imports no numba)

    H2, W2 = vals.shape
    h, w = H2 - 2, W2 - 2
    if not warm:
        dist[1:-1, 1:-1] = np.inf
    fd, fl, fv = dist.reshape(-1), level.reshape(-1), vals.reshape(-1)
    fd[flat_src] = 0.0
    serial = h * w < SERIAL_BELOW if parallel is None else not parallel
    levels, codes = (K.plateau_levels_serial, K.predecessors_serial) if serial else (K.plateau_levels, K.predecessors)
    if warm and pred is not None and H2 * W2 < 2**31:  # (the change's cells as int32 flat indices)
        mark = changed.reshape(-1)
        K.solve_distances(fv, h, w, kind, steps, fd, True, float(limit), mark)
        plateau, near = K.affected_cells(fv, h, w, kind, steps, fd, mark)
        todo = levels(fv, h, w, kind, steps, fd, fl, flat_src, plateau.astype(np.int64), False, pred)
        K.plateau_search(fv, h, w, kind, steps, fd, fl, todo)
        codes(fv, h, w, kind, steps, fd, fl, flat_src, pred, near.astype(np.int64))  # (near holds the plateau)
        return dist, level, pred
    K.solve_distances(fv, h, w, kind, steps, fd, warm, float(limit))
    pred = np.empty((h, w), np.uint8)
    plateau = levels(fv, h, w, kind, steps, fd, fl, flat_src, _NO_CELLS, True, pred)
    K.plateau_search(fv, h, w, kind, steps, fd, fl, plateau)
    codes(fv, h, w, kind, steps, fd, fl, flat_src, pred, plateau)
    return dist, level, pred


SOLVE_BLOCK = Dispatch("the in-core SSSP", cpu=_solve_block_cpu,
                       gpu="terrain_io.grid.sssp._incore_gpu:solve_block_gpu")


def ringed(values: np.ndarray, dtype=None) -> np.ndarray:
    """``values`` (h x w, NaN = not a vertex) inside a NaN ring: the block of a whole-grid solve."""
    h, w = values.shape
    out = np.full((h + 2, w + 2), np.nan, dtype or (values.dtype if values.dtype.kind == "f" else np.float64))
    out[1:-1, 1:-1] = values
    return out


def output_distance(dist, vals):
    """The stored distances of a block's interior: float32, +inf unreached, NaN where no vertex
    (NumPy or CuPy arrays, the result on theirs). A finite distance beyond float32's range (walking
    times over cliffs steeper than about 24:1) is stored as +inf, with one note."""
    inner = dist[1:-1, 1:-1]
    with np.errstate(over="ignore"):
        out = inner.astype(np.float32)
    if bool((np.isinf(out) & np.isfinite(inner)).any()):
        warnings.warn(TerrainNote(f"some distances exceed float32's range ({np.finfo(np.float32).max:.3g}; walking "
                                  "times over cliffs steeper than about 24:1): those cells are stored as "
                                  "unreached (+inf)"), stacklevel=2)
    out[np.isnan(vals[1:-1, 1:-1])] = np.nan
    return out


def value_dtype(field) -> np.dtype:
    """float32 when every value of ``field`` is exactly a float32 (a float32 or small-integer DEM,
    no cost raster), else float64: the block then takes half the memory and the same weights."""
    dt = field.store.dtype
    small = dt == np.float32 or (dt.kind in "iu" and dt.itemsize <= 2)
    return np.dtype(np.float32 if small and field.cost_array is None else np.float64)


def incore_bytes(store, field, device: str, allocation: bool = False) -> int:
    """Memory of the in-core method: the block solve, and the allocation's work arrays (GPU: the
    jumping pointers, two of 4 bytes a cell, and the labels; CPU: the roots, 8 bytes, a flag and a
    stack of 8, and the labels)."""
    h, w = store.shape
    extra = (12 if device == "gpu" else 21) * h * w if allocation else 0
    return block_bytes(h, w, value_dtype(field).itemsize, device) + extra


def _io_threads(store) -> int:
    """The reader and writer threads of :func:`run_incore` (one band of shard rows at a time)."""
    import os

    return max(1, min(os.cpu_count() or 1, store.shard_grid[0] * store.shard_grid[1]))


def host_bytes(store, field, device: str, allocation: bool = False) -> int:
    """Host memory of the in-core method, what ``--memory`` bounds. CPU: the block solve
    (:func:`incore_bytes`) and the writers' copies (a shard of outputs and its compressed form a
    thread). GPU (the block in GPU memory): the host buffers alone -- the band of shard rows read,
    with a decoded shard a reader thread, then while results come back: up to three bands of
    outputs (float32 distances, codes, sources), a shard of them and its compressed form a writer
    thread (measured at 16384^2 under ``--memory 128MB``, before this count: 1.9 GB of host RSS)."""
    h, w = store.shape
    side = store.tile_size * store.shard_size
    shard_cells = min(side, h) * min(side, w)
    writers = _writers_bytes(store, allocation)
    if device != "gpu":
        return incore_bytes(store, field, device, allocation) + writers
    band = min(side, h) * w
    itemsize = value_dtype(field).itemsize
    read = band * itemsize + min(_io_threads(store), store.shard_grid[1]) * shard_cells * itemsize
    return max(read, 3 * band * _out_bytes(allocation) + writers)


def _out_bytes(allocation: bool) -> int:
    """Bytes a cell of the outputs, counted for memory: float32 distance, uint8 code, float32 source."""
    return 4 + 1 + (4 if allocation else 0)


def _writers_bytes(store, allocation: bool) -> int:
    """The writer threads' host memory: a shard of outputs and its compressed form a thread."""
    h, w = store.shape
    side = store.tile_size * store.shard_size
    return _io_threads(store) * min(side, h) * min(side, w) * _out_bytes(allocation) * 2


def fits_in_core(store, field, device: str, budget: int, allocation: bool = False) -> bool:
    """The whole grid fits: its host buffers in ``budget`` bytes (:func:`host_bytes`), and on the
    GPU its block in the GPU's free memory too."""
    if host_bytes(store, field, device, allocation) > budget:
        return False
    return device != "gpu" or incore_bytes(store, field, device, allocation) <= gpu_free_bytes()


def run_incore(store, field, cells, name: str, device: str, budget: int, progress: bool, attrs: dict,
               limit: float = np.inf, allocation: bool = False, predecessor: bool = True):
    """The in-core method on a store: read every shard into one ringed block (host or GPU), solve
    it (no farther than ``limit``), write ``sssp/NAME`` (with ``source`` when ``allocation``). Shards are decoded and encoded in parallel threads (zstd releases the
    GIL); on the GPU they travel one band of shard rows at a time, one copy each way, so the
    threads never touch the device and host memory stays at a band or two."""
    from concurrent.futures import ThreadPoolExecutor

    from ...progress import progress_bar
    from ...pinned import write_bands
    from ...store import write_shard

    if not fits_in_core(store, field, device, budget, allocation):
        raise _too_large(store, field, device, budget, allocation)
    h, w = store.shape
    nsr, nsc = store.shard_grid
    bands = [[store.shard_window(sr, sc) for sc in range(nsc)] for sr in range(nsr)]
    timings = Timings()
    gpu = device == "gpu"
    xp = np
    if gpu:
        import cupy as xp
    vdtype = value_dtype(field)
    threads = _io_threads(store)
    pinned, per_call = None, 1
    if gpu:  # the bands cross the bus from and to pinned buffers; up to three bands in flight when written by
        from ... import nvzstd  # the CPU's encoders, two as frames (the writers only write them: fewer to pin)
        from ...pinned import PinnedBands, frame_plan

        framed = nvzstd.encoder() is not None
        pinned = PinnedBands(sets=2 if framed else 3)
        if framed:
            itemsizes = [4] + [1] * predecessor + [4] * allocation
            per_call = frame_plan(store, itemsizes, budget - _writers_bytes(store, allocation))
    with timings.phase("read"):
        vals = xp.full((h + 2, w + 2), np.nan, vdtype)
        on_host = not (gpu and _read_device(field, vals, threads, timings))  # (else decoded on the GPU)
        with ThreadPoolExecutor(threads) as pool:
            for band in bands if on_host else []:
                r0, r1 = band[0].r0, band[0].r1
                host = pinned.buffer(0, "read", (r1 - r0, w), vdtype) if gpu else vals[r0 + 1 : r1 + 1, 1 : w + 1]

                def read(win, host=host):
                    host[:, win.c0 : win.c1] = field.read(win)

                list(pool.map(read, band))
                if gpu:
                    vals[r0 + 1 : r1 + 1, 1 : w + 1] = xp.asarray(host)
                    pinned.uploaded()  # (the next band is read into the same buffer)
    with timings.phase("solve"):
        solving = progress_bar(progress, 1, "sssp solve", unit="grid")  # one kernel call: a bar that says so
        dist, level, pred = solve_block(vals, field.model.kind, field.steps(), cells, device=device, limit=limit)
        solving.close()
        del level
        source = None
        if allocation:
            from .allocation import allocate_block, allocate_gpu

            source = allocate_gpu(pred, cells) if gpu else allocate_block(pred, cells)
    with timings.phase("write"):
        with timings.phase("write_prepare"):  # (the float32 distances and their figures)
            d32 = output_distance(dist, vals)
            del dist, vals  # the write holds the float32 distances and the codes alone (12-16 bytes a cell less)
            finite = xp.isfinite(d32)
            reached = int(finite.sum())
            dmax = float(xp.max(xp.where(finite, d32, 0.0))) if reached else 0.0
            del finite
        bar = progress_bar(progress, nsr * nsc * (1 + predecessor + allocation), "sssp write")
        with write_result(store, name, attrs, allocation, predecessor) as arrays:
            outputs = [(arrays.distance, d32)] + ([(arrays.predecessor, pred)] if predecessor else [])
            if allocation:
                outputs.append((arrays.source, source))

            with ThreadPoolExecutor(threads) as pool:
                if gpu:  # (sets: a band coming back, and one or two still written)
                    write_bands([arr for arr, _ in outputs], bands,
                                lambda r0, r1: [a[r0:r1] for _, a in outputs], pinned, pool, bar.update, timings,
                                per_call)
                else:
                    side = store.tile_size * store.shard_size
                    list(pool.map(lambda job: (write_shard(job[0], job[1].r0 // side, job[1].c0 // side,
                                                           job[2][job[1].slices]), bar.update(1)),
                                  [(arr, win, a) for band in bands for win in band for arr, a in outputs]))
            arrays.finish(reached, dmax)
            sealed = time.perf_counter()
        timings.add("write_seal", time.perf_counter() - sealed)  # (the result's manifests, its rename)
        bar.close()
    return SSSPResult(name, field.model.name, cells, "incore", reached, dmax,
                      timings.rounded(), device)


def _read_device(field, vals, threads: int, timings) -> bool:
    """The ringed block's interior decoded on the GPU from the elevation's zstd frames
    (:func:`terrain_io.pinned.read_device`: only the frames cross the bus, the host's threads read
    and check them), where the values are the elevations themselves (no cost raster): the cells
    ``Field.read`` gives, converted to the block's type on the GPU (an integer DEM's nodata NaN).
    False where the GPU cannot decode them: the caller reads the host's way."""
    from ...pinned import read_device
    from ...store import ELEVATION

    if field.cost_array is not None:
        return False
    store, dtype = field.store, vals.dtype
    convert = None
    if store.dtype != dtype:
        import cupy as cp

        convert = (dtype, lambda b: cp.where(store.valid(b), b.astype(dtype), np.nan).astype(dtype, copy=False))
    w = vals.shape[1] - 2

    def place(r0, r1, cells):
        vals[r0 + 1 : r1 + 1, 1 : w + 1] = cells

    return read_device(store, ELEVATION, threads, convert, each=place, timings=timings) is not None


def _too_large(store, field, device, budget, allocation=False):
    from ...errors import InputError
    from ...memory import format_bytes

    h, w = store.shape
    host = host_bytes(store, field, device, allocation)
    if host > budget:
        what, need, where = "", host, f"the memory budget {format_bytes(budget)}"
        if device == "gpu":
            what = " of host memory (its bands of shards)"
    else:
        what, need, where = "", incore_bytes(store, field, device, allocation), "the GPU's free memory"
    return InputError(f"the in-core SSSP needs {format_bytes(need)}{what} for {h} x {w} cells, more than {where} "
                      "(raise --memory, or use --method shards)")
