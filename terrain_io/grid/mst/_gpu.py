"""GPU tile phase of the grid MST: forests and their contraction for all tiles of a batch (CuPy RawModules).

Forests: Harish et al.'s data-parallel Boruvka as used by Gerritsen 2012 (part II ch. 3;
docs/ARCHITECTURE.md#references),
with the strict edge order packed into 64-bit atomicMin keys (a float32 weight and a 22-bit edge
code instead of Gerritsen 2012's 32-bit key with 10-bit weights), or, for float64 weights, two atomic
passes (weight, then code). Kernels: ``terrain_io/kernels/mst_tile.cu``. The result is the tiles'
spanning forests as a bitmask, bit for bit what the numba Kruskal computes.

Contraction (Gerritsen 2012, part II ch. 2-3, after Haverkort 2012): dead ends stripped by parallel leaf-pruning
rounds, then one walk per (kept vertex, direction) replacing each degree-2 path by its maximum
edge, one thread block per tile. Kernel: ``terrain_io/kernels/mst_contract.cu``. It returns what
the numba reference ``_cpu.contract_tile`` returns -- the same vertex and super-edge arrays in
the same order, and the same exact weight sum -- so the CPU only merges.

In core (``mst --method incore``, :class:`GpuGridForest`): the same Boruvka rounds over the whole DEM on
the GPU, compiled with ``INCORE``: no tiles, global edge codes (smaller cell id * 4 + rank, 32 bits up to
2**30 cells), the new roots found by pointer jumping among the roots of the round, and the rounds after
the first over a list of their roots (the last round's pair winners); the first state made by one kernel
(``init``: no CuPy kernel over the grid, whose 64-bit-indexed variants each machine compiled on its first
large DEM); the forest's edge count and exact weight sum computed there too (``forest_totals``). Every
mode skips the vertices whose neighbours are all of their component (interior: ``find_min`` marks them).

Overlap: the pipeline calls :meth:`tile_phase` from worker threads; each call takes one of two
*lanes* (a non-blocking CUDA stream with its own pinned host buffers), so one batch's transfers
and host synchronisations overlap the other's kernels, while the CPU reads the next batch from the
store and merges earlier ones.
"""
from __future__ import annotations

import contextlib
import functools
import queue
import threading

import numpy as np

from ...backend import kernel_source, kernel_struct
from .shared import N_EXP, TileGraphs

_CTYPES = {"float32": "float", "float64": "double", "int8": "signed char", "uint8": "unsigned char",
           "int16": "short", "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int"}
_BLOCK = 256
_CONTRACT_BLOCK = 1024  # BLOCK in mst_contract.cu: one block per tile


class _Lane:
    """A CUDA stream and its pinned host buffers; one batch at a time."""

    def __init__(self, cp):
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pinned: dict = {}

    def pin(self, name, shape, dtype):
        from ...pinned import empty_pinned

        key = (name, tuple(shape), np.dtype(dtype).str)
        buf = self.pinned.get(key)
        if buf is None:
            buf = self.pinned[key] = empty_pinned(tuple(shape), dtype)
        return buf


class GpuTileForest:
    """Spanning forests of every T x T tile of a batch, and their contraction, on the GPU."""

    def __init__(self, tile: int, model, dtype, lanes: int = 2, incore: bool = False):
        import cupy as cp

        dtype = np.dtype(dtype)
        if dtype.name not in _CTYPES:
            from ...errors import InputError

            raise InputError(f"GPU MST: unsupported elevation type {dtype}")
        self.cp = cp
        self.tile = int(tile)
        self.kind = model.kind
        self.incore = incore
        self.packed = model.fits_float32(dtype)
        self.k = _kernels(dtype.name, model.kind, self.packed, incore)
        self._lanes: queue.Queue = queue.Queue()
        for _ in range(max(1, lanes)):
            self._lanes.put(_Lane(cp))
        self._stats = threading.Lock()
        self.kernel_seconds = 0.0  # GPU time of the Boruvka loops (CUDA events)
        self.contract_seconds = 0.0  # GPU time of the contraction kernels (CUDA events)
        self.rounds = 0

    @contextlib.contextmanager
    def _lane(self):
        lane = self._lanes.get()
        try:
            with lane.stream:
                yield lane
        finally:
            self._lanes.put(lane)

    def _timed(self, lane, attr, fn, *args):
        """Run ``fn`` on the lane's stream; add its GPU time (CUDA events) to ``self.<attr>``."""
        cp = self.cp
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(lane.stream)
        out = fn(*args)
        stop.record(lane.stream)
        stop.synchronize()
        with self._stats:
            setattr(self, attr, getattr(self, attr) + cp.cuda.get_elapsed_time(start, stop) / 1000.0)
        return out

    def _upload(self, lane, name, a: np.ndarray):
        h = lane.pin(name, a.shape, a.dtype)
        h[...] = a
        d = self.cp.empty(a.shape, a.dtype)
        d.set(h, stream=lane.stream)
        return d

    def _download(self, lane, arrays: dict) -> dict:
        """Device arrays to new host arrays (through the lane's pinned buffers, one synchronisation)."""
        pinned = {}
        for name, d in arrays.items():
            pinned[name] = lane.pin(name, d.shape, d.dtype)
            d.get(out=pinned[name], stream=lane.stream)
        lane.stream.synchronize()
        return {name: np.array(h) for name, h in pinned.items()}

    # -- Boruvka ---------------------------------------------------------------------------------
    def _start(self, d_valid):
        """A tile batch's first state: (comp, parent, best, best_code), every vertex its own component,
        every other cell -1; no proposals (all ones)."""
        cp = self.cp
        n = d_valid.size
        comp = cp.where(d_valid.ravel(), cp.arange(n, dtype=cp.int32), cp.int32(-1))
        best = cp.empty(n, dtype=cp.uint64)
        best_code = cp.empty(n if not self.packed else 1, dtype=cp.uint32)
        for a in (best, best_code):
            a.data.memset_async(0xFF, a.nbytes)
        return comp, comp.copy(), best, best_code

    def _boruvka(self, lane, d_vals, comp, parent, best, best_code):
        """The tiles' forests (in core: the DEM's) as a device uint8 bitmask (bit d: forward direction d),
        from the first state (:meth:`_start`)."""
        cp = self.cp
        H, W = d_vals.shape
        n = H * W
        grid = ((n + _BLOCK - 1) // _BLOCK,)
        bits = cp.zeros(-(-n // 4) * 4, dtype=cp.uint8)  # set a byte at a time in 32-bit words
        changed = cp.zeros(1, dtype=cp.int32)
        h_changed = lane.pin("changed", (1,), np.int32)
        args_dim = (np.int32(H), np.int32(W), np.int32(self.tile))

        def any_changed(kernel, blocks, args) -> bool:
            changed.fill(0)
            self.k[kernel](blocks, (_BLOCK,), args)
            changed.get(out=h_changed, stream=lane.stream)
            lane.stream.synchronize()
            return bool(h_changed[0])

        interior = cp.zeros(n, dtype=cp.uint8)  # (find_min's: vertices no edge leaves any more)
        # The rounds' roots: every cell in the first round (and in a tile batch, whose cells are few); in
        # core after it, the list of the last round's pair winners (break_pairs), at most half the round's
        # roots: the hooks, pairs and jumps then follow the roots, not the 2**30 cells.
        listed, roots, m = 0, changed, n
        if self.incore:
            lists = (cp.empty(n // 2 + 1, cp.int32), cp.empty(n // 4 + 1, cp.int32))
            count = cp.zeros(1, cp.uint32)
        rounds = 0
        while True:  # (hook leaves best, and best_code, all ones again for the next round)
            self.k["find_min"](grid, (_BLOCK,), (d_vals, comp, interior, best) + args_dim)
            if not self.packed:
                self.k["find_min_code"](grid, (_BLOCK,), (d_vals, comp, interior, best, best_code) + args_dim)
            of_roots = (roots, np.int32(listed), np.int64(m))
            on_roots = ((m + _BLOCK - 1) // _BLOCK,)
            if not any_changed("hook", on_roots, of_roots + (comp, best, best_code, parent, bits, changed) + args_dim):
                break
            rounds += 1
            if self.incore:
                winners = lists[(rounds - 1) % 2]  # (round 1's: n / 2 at most, round 2's n / 4, ...)
                count.fill(0)
                self.k["break_pairs"](on_roots, (_BLOCK,), of_roots + (comp, parent, np.int32(1), winners, count))
                for _ in range(64):  # 8 dependent hops a launch: chains shrink ~9x a launch
                    if not any_changed("jump", on_roots, of_roots + (comp, parent, changed)):
                        break
                else:
                    raise RuntimeError("GPU MST: pointer jumping did not converge (a cycle of hooks)")
                self.k["relabel"](grid, (_BLOCK,), (comp, parent, np.int64(n)))
                listed, roots, m = 1, winners, int(count.get()[0])
                if m == 0:  # (no pair: nothing hooked -- not reached, hook found a change)
                    break
            else:
                self.k["break_pairs"](on_roots, (_BLOCK,), of_roots + (comp, parent, np.int32(0), changed, changed))
                self.k["find_roots"](grid, (_BLOCK,), (parent, np.int64(n)))
                comp[...] = parent
        with self._stats:
            self.rounds += rounds
        return bits[:n].reshape(H, W)

    # -- contraction -------------------------------------------------------------------------------
    def _contract(self, d_vals, d_valid, d_bits, tiles: np.ndarray, gr0, gc0, rows, cols, cap) -> dict:
        """Launch ``contract_tiles``: one block per tile; returns the device output arrays."""
        cp = self.cp
        H, W = d_vals.shape
        T = self.tile
        tiles = np.ascontiguousarray(tiles, dtype=np.int64)
        n = len(tiles)
        if H * W >= 2**31 or n * T * T >= 2**31:
            raise ValueError("GPU MST contraction: batch too large for 32-bit cell indices")
        if n and (tiles[:, 2].max() > T or tiles[:, 3].max() > T):
            raise ValueError("GPU MST contraction: a tile larger than the tile size")
        out = {"nv": cp.empty(n, cp.int64), "vid": cp.empty((n, cap), cp.int64), "vh": cp.empty((n, cap), cp.float64),
               "vmask": cp.empty((n, cap), cp.uint8), "ne": cp.empty(n, cp.int64),
               "eu": cp.empty((n, cap), cp.int64), "ev": cp.empty((n, cap), cp.int64),
               "ew": cp.empty((n, cap), cp.float64), "ecode": cp.empty((n, cap), cp.int64),
               "buckets": cp.zeros((2, N_EXP), cp.int64)}
        if n == 0:
            out["nv"].fill(0)
            out["ne"].fill(0)
            return out
        alive = cp.empty(H * W, cp.uint32)
        outm = cp.empty(H * W, cp.uint8)
        q = cp.empty(n * T * T, cp.int32)
        vcell = cp.empty(n * cap, cp.int32)
        slots = n * cap * 8
        sflag, sother = cp.empty(slots, cp.uint8), cp.empty(slots, cp.int64)
        sw, scode = cp.empty(slots, cp.float64), cp.empty(slots, cp.int64)
        d_tiles = cp.asarray(tiles)  # held until the launch: the struct keeps only its address
        batch = kernel_struct(d_vals, d_valid, d_bits, d_tiles, gr0, gc0, rows, cols, T, H, W, cap)
        scratch = kernel_struct(alive, outm, q, vcell, sflag, sother, sw, scode)
        outputs = kernel_struct(*(out[k] for k in TileGraphs._fields))
        self.k["contract_tiles"]((n,), (_CONTRACT_BLOCK,), (batch, scratch, outputs))
        return out

    @staticmethod
    def _as_tuple(h: dict) -> TileGraphs:
        """The host arrays as ``_cpu.tile_phase_batch``'s result."""
        return TileGraphs(**h)

    # -- public ------------------------------------------------------------------------------------
    def forest(self, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """uint8 bitmask (bit d: forward direction d) of the tiles' minimum spanning forests."""
        with self._lane() as lane:
            d_vals, d_valid = self._upload(lane, "vals", values), self._upload(lane, "valid", valid)
            bits = self._timed(lane, "kernel_seconds", self._boruvka, lane, d_vals, *self._start(d_valid))
            return self._download(lane, {"bits": bits})["bits"]

    def contract(self, values: np.ndarray, valid: np.ndarray, bits: np.ndarray, tiles: np.ndarray,
                 gr0: int, gc0: int, rows: int, cols: int, cap: int) -> tuple:
        """Contract given forests (``bits``, e.g. the CPU's): ``tile_phase_batch``'s result tuple."""
        with self._lane() as lane:
            d_vals, d_valid = self._upload(lane, "vals", values), self._upload(lane, "valid", valid)
            d_bits = self._upload(lane, "bits_in", bits.astype(np.uint8, copy=False))
            out = self._timed(lane, "contract_seconds", self._contract, d_vals, d_valid, d_bits, tiles,
                              gr0, gc0, rows, cols, cap)
            return self._as_tuple(self._download(lane, out))

    def tile_phase(self, values: np.ndarray, valid: np.ndarray, tiles: np.ndarray,
                   gr0: int, gc0: int, rows: int, cols: int, cap: int) -> tuple[np.ndarray, tuple]:
        """The whole tile phase of a batch: (forest bitmask, ``tile_phase_batch``'s result tuple).

        ``tiles`` (n, 4): i0, j0, h, w of each tile in the batch; ``gr0, gc0``: the global cell of
        batch cell (0, 0); ``rows, cols``: the DEM's shape; ``cap``: entries per tile row.
        """
        with self._lane() as lane:
            d_vals, d_valid = self._upload(lane, "vals", values), self._upload(lane, "valid", valid)
            d_bits = self._timed(lane, "kernel_seconds", self._boruvka, lane, d_vals, *self._start(d_valid))
            out = self._timed(lane, "contract_seconds", self._contract, d_vals, d_valid, d_bits, tiles,
                              gr0, gc0, rows, cols, cap)
            out["bits"] = d_bits
            h = self._download(lane, out)
            return h.pop("bits"), self._as_tuple(h)


class GpuGridForest(GpuTileForest):
    """The minimum spanning forest of a whole DEM held on the GPU (``mst --method incore``): the tile
    phase's Boruvka compiled ``INCORE`` (see the module's text), up to :data:`MAX_CELLS` cells."""

    MAX_CELLS = 1 << 30  # edge codes (cell id * 4 + rank) in 32 bits

    def __init__(self, model, dtype):
        super().__init__(0, model, dtype, lanes=1, incore=True)

    @staticmethod
    def device_bytes(cells: int, model, dtype) -> int:
        """GPU memory :meth:`forest` takes at most for ``cells`` cells of ``dtype``, the elevations
        included: comp, parent and the best keys (8 bytes, + 4 for the codes of float64 weights), the
        bits, the interior flags, the lists of the rounds' roots (n / 2 + n / 4 cells of 4 bytes), and a
        byte a cell to spare (the reader's frames, freed before)."""
        return cells * (np.dtype(dtype).itemsize + 4 + 4 + 8 + 1 + 1 + 3 + 1 + (0 if model.fits_float32(dtype) else 4))

    def forest(self, d_vals, nodata=None):
        """(bits (H, W) uint8 on the GPU, ``totals``) of the forest of ``d_vals`` (H, W), whose vertices are
        its cells that are not NaN or ``nodata`` (:func:`terrain_io.store.valid_mask`'s). ``totals()`` gives
        (edge count, exact weight sum as ``_cpu.exact_buckets``'s buckets, vertex count), summed on the GPU
        (``forest_totals``) on this forest's stream meanwhile: the bits may be written in between, the
        two sharing the GPU (they only read the bits)."""
        cp = self.cp
        cp.cuda.Device().synchronize()  # the elevations' copies (other streams) are done
        with self._lane() as lane:
            bits, cells = self._timed(lane, "kernel_seconds", self._forest, lane, d_vals, nodata)
            buckets, edges = cp.zeros((2, N_EXP), cp.uint64), cp.zeros(1, cp.uint64)
            blocks = 4 * cp.cuda.Device().attributes["MultiProcessorCount"]
            self.k["forest_totals"]((blocks,), (1024,), (d_vals, bits, np.int64(bits.size), np.int32(bits.shape[1]),
                                                         buckets, edges))
            summed = cp.cuda.Event()
            summed.record(lane.stream)

        def totals(_held=d_vals):  # (the elevations held until the sums are done)
            summed.synchronize()
            return int(edges.get()[0]), buckets.get().view(np.int64), int(cells.get()[0])

        return bits, totals

    def _forest(self, lane, d_vals, nodata):
        """(:meth:`_boruvka`'s bits, the vertex count on the GPU) from the state ``init`` makes (no CuPy
        kernel over the whole grid)."""
        cp = self.cp
        n = d_vals.size
        comp, parent = cp.empty(n, cp.int32), cp.empty(n, cp.int32)
        best, best_code = cp.empty(n, cp.uint64), cp.empty(n if not self.packed else 1, cp.uint32)
        cells = cp.zeros(1, cp.uint64)
        blocks = min((n + _BLOCK - 1) // _BLOCK, 8 * cp.cuda.Device().attributes["MultiProcessorCount"])
        self.k["init"]((blocks,), (_BLOCK,),
                       (d_vals, np.int32(nodata is not None), np.float64(0 if nodata is None else nodata),
                        comp, parent, best, best_code, cells, np.int64(n)))
        return self._boruvka(lane, d_vals, comp, parent, best, best_code), cells


_LOADING = threading.Lock()


def _kernels(dtype: str, kind: int, packed: bool, incore: bool) -> dict:
    """The kernels of :class:`GpuTileForest` (``incore``: of :class:`GpuGridForest`) for elevations of
    ``dtype``, weight model ``kind``: compiled (CuPy caches them on disk) and loaded once a process --
    by :func:`warm`'s thread, or by whichever comes first (the other waits)."""
    with _LOADING:
        return _load_kernels(dtype, kind, packed, incore)


@functools.cache
def _load_kernels(dtype: str, kind: int, packed: bool, incore: bool) -> dict:
    import cupy as cp

    options = (f"-DVAL_T={_CTYPES[dtype]}", f"-DKIND={kind}", f"-DPACKED={int(packed)}", f"-DINCORE={int(incore)}")
    module = cp.RawModule(code=kernel_source("mst_tile.cu"), options=options)
    names = ("init", "jump", "relabel", "forest_totals") if incore else ("find_roots",)
    k = {name: module.get_function(name) for name in ("find_min", "find_min_code", "hook", "break_pairs") + names}
    if not incore:
        contract = cp.RawModule(code=kernel_source("mst_contract.cu"), options=options[:2])
        k["contract_tiles"] = contract.get_function("contract_tiles")
    return k


def warm(store, weight: str) -> None:
    """What ``terrain mst STORE --device gpu`` uses of the GPU first, made ready ahead (``start_gpu``'s
    ``then``, in its thread once the CUDA context is made, beside the imports and the store's opening):
    the in-core kernels for the store's elevations loaded, nvCOMP's library and codecs set up. Each is
    what the command would load itself, once (:func:`_kernels`); errors are left to the command."""
    from ... import nvzstd, weights
    from ...store import TerrainStore

    dtype = np.dtype(TerrainStore.open(store, mode="r").dtype)
    model = weights.get(weight)
    if dtype.name in _CTYPES and model.kind in (weights.MAX, weights.ABSDIFF):
        _kernels(dtype.name, model.kind, model.fits_float32(dtype), True)
    nvzstd.decoder(), nvzstd.encoder()


@functools.cache
def worker_tile_forest(tile: int, weight: str, dtype: str, lanes: int = 1) -> GpuTileForest:
    """One compiled :class:`GpuTileForest` per Dask worker process and store layout: one lane for a
    shard task (one at a time), two for a run of the pipeline (batches read ahead)."""
    from ... import weights

    return GpuTileForest(tile, weights.get(weight), np.dtype(dtype), lanes=lanes)


def worker_tile_phase(store, task, values, valid):
    """The tile phase of a Dask task's batch (:class:`.mst._TileTask`) on the worker's GPU: (edge bits,
    the contraction's output), as :func:`.mst._tile_phase_cpu`."""
    gpu = worker_tile_forest(store.tile_size, task.weight, store.dtype.str)
    win = task.window
    return gpu.tile_phase(values, valid, task.tiles, win.r0, win.c0, *store.shape, task.cap)
