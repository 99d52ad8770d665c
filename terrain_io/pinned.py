"""Page-locked (pinned) host buffers for the in-core GPU pipelines' bands of shard rows (``fill``,
``sssp --method incore``), made once a run and reused for every band.

A band copied to or from a fresh NumPy array crosses the bus twice slower or worse: the driver stages
a pageable copy through its own pinned buffer, and the new array's pages fault in on first touch.
Into a pinned buffer the copy is one DMA; the shard threads decode into it and encode from views of
it directly. Kept sets: a band's writers still read set k while the next band comes back into set
k + 1 (``sets`` = bands in flight + 1); a buffer copied to the GPU is refilled only after
:meth:`PinnedBands.uploaded`. :func:`write_bands` is the one way results on the GPU are stored
(:func:`write_device` for a pipeline that has no pinned sets of its own: flow, hydrology), and
:func:`write_held` writes a pipeline's whole results, on the GPU or the host, the way each belongs.
The way in, where nvCOMP is installed: :func:`read_device` (whole arrays decoded on the GPU from their
zstd frames, read by the reader threads into pinned buffers lent by :class:`PinnedSlots`: ~50 GB/s to the
GPU on the H100, where plain memory crossed at ~7). All pinned memory is made by :func:`empty_pinned`.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import math
import mmap
import os
import sys
import time
import warnings

import numpy as np


class PinnedBands:
    """Pinned host buffers by (set, name), grown on demand: :meth:`buffer` and :meth:`download`."""

    def __init__(self, sets: int = 2):
        self.sets = max(1, int(sets))
        self._buffers: dict = {}
        self.pin_seconds = 0.0  # spent pinning new buffers (each locks its pages anew)

    def buffer(self, band: int, name, shape, dtype) -> np.ndarray:
        """A pinned array of ``shape`` and ``dtype`` for ``band`` (its set: band % sets), reused: a
        view of the set's buffer for ``name``, which holds what it held before."""
        dtype, n = np.dtype(dtype), math.prod(shape)
        key = (band % self.sets, name)
        buf = self._buffers.get(key)
        if buf is None or buf.dtype != dtype or buf.size < n:
            self._buffers.pop(key, None)  # (freed before its successor is pinned)
            t0 = time.perf_counter()
            buf = self._buffers[key] = empty_pinned(n, dtype)
            self.pin_seconds += time.perf_counter() - t0
        return buf[:n].reshape(shape)

    def download(self, band: int, arrays) -> list[np.ndarray]:
        """Device arrays -> their pinned host copies (views valid until band + sets reuses the set);
        every copy is complete when this returns."""
        import cupy

        out = []
        for i, a in enumerate(arrays):
            host = self.buffer(band, i, a.shape, a.dtype)
            a.get(out=host)
            out.append(host)
        cupy.cuda.Device().synchronize()
        return out

    @staticmethod
    def uploaded() -> None:
        """Wait until every copy queued to the GPU is done: CuPy copies from a pinned array
        asynchronously, straight from it, so a band's buffer is refilled only after this (measured: a
        32768^2 fill whose next band was decoded into the buffer under the copy read other values)."""
        import cupy

        cupy.cuda.Device().synchronize()

    def close(self) -> None:
        self._buffers.clear()


def empty_pinned(shape, dtype) -> np.ndarray:
    """A page-locked (pinned) NumPy array, the one way this tool pins host memory: anonymous memory in
    transparent huge pages where the kernel gives them (madvise), its pages touched by threads, then
    registered with the driver (cudaHostRegister); unregistered and unmapped when its last view goes.
    On the H100 host a GB cost 0.39-0.72 s through cudaHostAlloc (CuPy's empty_pinned: the driver
    faults and locks 4 KiB pages one by one, and holds its lock meanwhile) and 0.21-0.27 s touched in
    one thread + 0.02-0.03 s registered so; copies to and from either run at 52-55 GB/s, from plain
    memory at 7-14 (benchmarks/probe_pinning.py, session 21). Where registering fails (a memlock
    limit): CuPy's pinned memory."""
    import cupy

    dtype = np.dtype(dtype)
    count = math.prod(shape) if isinstance(shape, tuple) else int(shape)
    nbytes = max(1, count * dtype.itemsize)
    memory = _RegisteredMemory(nbytes)
    _touch(np.frombuffer(memory, np.uint8))
    try:
        memory.register()
    except cupy.cuda.runtime.CUDARuntimeError:
        import cupyx

        return cupyx.empty_pinned(shape, dtype)
    return np.frombuffer(memory, dtype, count).reshape(shape)


class _RegisteredMemory(mmap.mmap):
    """Anonymous memory (huge pages asked for) that :func:`empty_pinned` registers with the driver;
    unregistered before it is unmapped."""

    def __new__(cls, nbytes: int):
        self = super().__new__(cls, -1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):
                self.madvise(mmap.MADV_HUGEPAGE)
        self.pointer = None
        return self

    def register(self) -> None:
        import cupy

        pointer = np.frombuffer(self, np.uint8).ctypes.data
        cupy.cuda.runtime.hostRegister(pointer, len(self), 0)
        self.pointer = pointer

    def __del__(self):
        if self.pointer is not None and not sys.is_finalizing():
            with contextlib.suppress(Exception):  # (the CUDA context gone first: nothing left to undo)
                import cupy

                cupy.cuda.runtime.hostUnregister(self.pointer)


def _touch(buf: np.ndarray) -> None:
    """Fault in every page of ``buf`` (a byte each 4 KiB), in threads for a large one: the kernel's
    page faults, not the driver, and in parallel."""
    step, part = 4096, 64 << 20
    if len(buf) <= part:
        buf[::step] = 0
        return
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1, -(-len(buf) // part))) as pool:
        list(pool.map(lambda a: buf[a : a + part : step].fill(0), range(0, len(buf), part)))


def write_bands(arrays, bands, band_outputs, pinned: PinnedBands, pool, done=None, timings=None,
                bands_per_call: int = 1) -> None:
    """Store results that sit on the GPU, one band of shard rows at a time: ``arrays`` (zarr
    arrays, sharded alike), ``bands`` (lists of the shard windows of one shard row each),
    ``band_outputs(r0, r1)`` (the device arrays of rows r0 .. r1, every column, one an array, in
    order; called once a band, in order); ``pool``: the writers' threads; ``done(n)``: n shards written.

    With nvCOMP (:mod:`terrain_io.nvzstd`) a band's chunks are compressed on the GPU and only their
    frames come back, with their crc32c, for the threads to write (:func:`terrain_io.store.write_frames`);
    ``bands_per_call`` consecutive bands then go to the GPU's encoder as one (more chunks a call:
    :func:`frame_plan`), and each call is started before the frames of the call before are fetched
    (where the GPU has room for both), so that the GPU compresses the one while the other's frames
    cross the bus. Else the band comes back raw and the threads encode it
    (:func:`terrain_io.store.write_shard`). Either way into this run's sets of pinned host buffers:
    ``pinned.sets - 1`` bands (or calls' bands) are written while the next comes back, and a set is
    filled again only once the writers of the band that used it last are done."""
    from . import nvzstd
    from .errors import TerrainNote
    from .store import shard_layout, write_frames, write_shard

    # nvCOMP's frames for arrays stored as this tool writes them, zstd-compressed (not the raw overview levels)
    enc = nvzstd.encoder() if all((lay := shard_layout(a)) is not None and lay[1] is not None for a in arrays) else None
    if enc is not None and bands_per_call > 1:  # (each group of bands one band of several shard rows)
        bands = [[w for band in bands[i : i + bands_per_call] for w in band]
                 for i in range(0, len(bands), bands_per_call)]
    phase = timings.phase if timings is not None else (lambda _name: contextlib.nullcontext())
    pending: list = []  # (band, its writer's future), in the order submitted
    pinned_before = pinned.pin_seconds
    ahead = None  # (band k + 1's outputs, its encoder call started or None), made during band k
    # (a row's raw bytes: a call in flight holds ~3x its rows' on the GPU)
    raw_row = sum(a.shape[1] * np.dtype(a.dtype).itemsize for a in arrays) if enc is not None else 0

    def write(fn, arr, win, *data):
        fn(arr, win.r0 // arr.shards[0], win.c0 // arr.shards[1], *data)
        if done is not None:
            done(1)

    def shards(band):
        return [(w.r0 // arrays[0].shards[0], w.c0 // arrays[0].shards[1]) for w in band]

    for k, band in enumerate(bands):
        with phase("write_wait"):  # the set band k comes into was band k - sets's: its writers done first
            while pending and pending[0][0] <= k - pinned.sets:
                pending.pop(0)[1].result()
        for _, f in pending:
            if f.done():
                f.result()  # raises a failed write's error here
        r0, r1 = band[0].r0, band[-1].r1
        (outputs, started), ahead = ahead or (band_outputs(r0, r1), None), None
        jobs = None
        if enc is not None:
            try:
                with phase("write_gpu_encode"):  # (every output's chunks in one batched call)
                    started = started or enc.start(outputs, arrays, shards(band))
                    nxt = bands[k + 1] if k + 1 < len(bands) else None
                    if nxt is not None and enc.has_room(4 * (nxt[-1].r1 - nxt[0].r0) * raw_row):
                        # the next call compressed while this one's frames come back
                        ahead = (band_outputs(nxt[0].r0, nxt[-1].r1), None)  # (kept should the start fail)
                        ahead = (ahead[0], enc.start(ahead[0], arrays, shards(nxt)))
                with phase("write_frames_copy"):
                    framed, sums = enc.fetch(started, lambda n: pinned.buffer(k, "frames", (_headroom(n),), np.uint8))
                jobs = [(write_frames, arr, win, f, s) for arr, frames, crcs in zip(arrays, framed, sums)
                        for win, f, s in zip(band, frames, crcs)]
            except Exception as exc:  # noqa: BLE001 -- no GPU codec: the CPU's way, which writes the same cells
                warnings.warn(f"the GPU's zstd failed ({exc}); the results are compressed on the CPU", TerrainNote,
                              stacklevel=2)
                enc, jobs, ahead = None, None, ahead and (ahead[0], None)  # (the next band's outputs kept)
        started = None
        if jobs is None:
            with phase("write_copy"):
                parts = pinned.download(k, outputs)
            jobs = [(write_shard, arr, win, part[win.r0 - r0 : win.r1 - r0, win.c0 : win.c1])
                    for arr, part in zip(arrays, parts) for win in band]
        # (each writer known by its band: a count of those pending would let a slow writer of an older
        # band stay behind while later ones finish, and its set be refilled under it)
        pending += [(k, pool.submit(write, *job)) for job in jobs]
    with phase("write_wait"):  # (the last bands' writers)
        for _, f in pending:
            f.result()
    if timings is not None:
        timings.add("write_pin", pinned.pin_seconds - pinned_before)  # (within write_frames_copy / write_copy)


def frame_plan(store, itemsizes, budget: int) -> int:
    """How many bands of shard rows :func:`write_bands` gives the GPU's encoder a call for a whole
    grid's outputs (``itemsizes``: bytes a cell of each): enough for
    :data:`terrain_io.nvzstd.BATCH_CHUNKS` chunks of an array a call, as many as two sets of their
    frames in ``budget`` bytes of host memory hold (one at least; sized sure to hold the frames:
    zstd's frames of incompressible chunks are a little more than their cells)."""
    from .nvzstd import BATCH_CHUNKS

    rows, cols = store.shape
    side = store.tile_size * store.shard_size
    chunks = -(-min(side, rows) // store.tile_size) * -(-cols // store.tile_size)  # (a band of one array)
    raw = min(side, rows) * cols * sum(itemsizes)
    per_call = max(1, min(-(-BATCH_CHUNKS // chunks), store.shard_grid[0]))
    while per_call > 1 and 2 * _headroom(per_call * raw) > budget:
        per_call -= 1
    return per_call


def write_device(store, arrays, band_outputs, done=None, timings=None, bands_per_call: int = 1) -> None:
    """:func:`write_bands` for a pipeline without pinned sets of its own (flow, hydrology): every
    shard row of ``store`` a band (``bands_per_call`` of them a call of the GPU's encoder), two
    pinned sets, a writer thread a shard of the band's outputs (up to one a core). ``band_outputs(r0,
    r1)`` is called for the shard rows in order, once each."""
    nsr, nsc = store.shard_grid
    bands = [[store.shard_window(sr, sc) for sc in range(nsc)] for sr in range(nsr)]
    pinned = PinnedBands(sets=2)
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, len(arrays) * nsc))) as pool:
            write_bands(arrays, bands, band_outputs, pinned, pool, done, timings, bands_per_call)
    finally:
        pinned.close()


def write_held(store, *pairs, timings=None, bands_per_call: int = 1) -> None:
    """Write whole results held in memory shard by shard: ``pairs`` of (array, values), the values a
    NumPy or CuPy array of the whole result, a raster whose row slices are CuPy arrays (``on_gpu``:
    hydrology's per-link rasters) or a function of a shard's slices giving its block. Those on the GPU
    leave it the one way results there do (:func:`write_device`: through pinned
    buffers, compressed on the GPU where nvCOMP is installed; ``timings``: its phases); the rest is
    encoded by threads, shards in parallel. ``bands_per_call``: :func:`write_device`'s."""
    from .backend import is_cupy
    from .store import write_window

    def on_gpu(v):
        return is_cupy(v) or getattr(v, "on_gpu", False)

    held = [(arr, v) for arr, v in pairs if on_gpu(v)]
    if held:
        write_device(store, [arr for arr, _ in held], lambda r0, r1: [v[r0:r1] for _, v in held], timings=timings,
                     bands_per_call=bands_per_call)
    pairs = [(arr, v if callable(v) else v.__getitem__) for arr, v in pairs if not on_gpu(v)]
    wins = list(store.shards())
    with concurrent.futures.ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, len(wins) * len(pairs)))) as pool:
        list(pool.map(lambda job: write_window(job[0], job[1], job[2](job[1].slices), True),
                      [(arr, win, block) for arr, block in pairs for win in wins]))


def read_device(store, name: str, threads: int, convert=None, each=None, timings=None):
    """The whole array ``name`` of ``store`` on the GPU, its chunks' zstd frames decoded there (nvCOMP:
    :class:`terrain_io.nvzstd.BandDecoder`), or None where that cannot be -- nvCOMP not usable, or an
    array not stored as this tool's zstd chunks with their crc32c (the GPU's decoder trusts its input):
    the caller reads it the CPU's way. A band of shard rows at a time (about ``threads`` shards): its
    shard files read and checked by ``threads`` threads (:func:`terrain_io.store.shard_frames`) while
    the band before decodes, its frames copied to the GPU as they are (the accumulation's uint64
    cells compress ~9x) and decoded straight into the array's rows. ``convert`` (dtype, function of a
    CuPy block): each band converted on the GPU (the same function the CPU's reader applies to NumPy
    blocks). ``each(r0, r1, cells)``: each band's rows r0 .. r1 given to it as they are decoded (a CuPy
    array, valid during the call) instead of one array held whole, and True returned. The same cells
    as :func:`terrain_io.store.read_shard` (chunks never stored: the fill value); damage raises
    DamagedStoreError; a failure of the GPU's decoder itself is a note, and None (the CPU's way).
    ``timings``: its parts ``read_wait`` (for the shards' frames), ``read_stage`` (the frames
    copied to the GPU) and ``read_decode`` (the GPU's decode and placing, the band converted)."""
    from . import nvzstd
    from .errors import TerrainError, TerrainNote
    from .store import shard_layout

    arr = store.array(name)
    layout = shard_layout(arr)
    if layout is None or layout[1] is None or not layout[2]:
        return None
    dec = nvzstd.decoder()
    if dec is None:
        return None
    try:
        return _decode_bands(arr, layout[0], dec, threads, convert, each, timings)
    except TerrainError:
        raise
    except Exception as exc:  # noqa: BLE001 -- no GPU decoder: the CPU's way, which reads the same cells
        warnings.warn(f"the GPU's zstd decoder failed ({exc}); {name} is decoded on the CPU", TerrainNote,
                      stacklevel=2)
        return None


def _decode_bands(arr, chunk_shape, dec, threads: int, convert, each, timings):
    """:func:`read_device`'s bands of ``arr`` (chunks of ``chunk_shape``) through ``dec``."""
    import cupy as cp

    from .parallel import Prefetch
    from .store import shard_frames

    t0, t1 = chunk_shape
    phase = timings.phase if timings is not None else (lambda _name: contextlib.nullcontext())
    rows, cols = arr.shape
    (s0, s1), dtype = arr.shards, np.dtype(arr.dtype)
    nsr, nsc = -(-rows // s0), -(-cols // s1)
    out = cp.empty((rows, cols), dtype if convert is None else convert[0]) if each is None else None
    step = max(1, threads // nsc)  # shard rows a band
    bands = [range(a, min(a + step, nsr)) for a in range(0, nsr, step)]
    shards = [(sr, sc) for band in bands for sr in band for sc in range(nsc)]
    slots = PinnedSlots()  # (each shard's frames read into pinned memory: one DMA each to the GPU)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool, contextlib.ExitStack() as leaving, contextlib.closing(
            Prefetch(lambda sh: shard_frames(arr, *sh, dec.input_align, slots.take), shards, 2 * step * nsc,
                     pool)) as ahead:
        # (however this ends, no copy queued from the slots still reads them when they are freed)
        leaving.callback(cp.cuda.get_current_stream().synchronize)
        read = iter(ahead)
        for band in bands:
            r0, r1 = band[0] * s0, min((band[-1] + 1) * s0, rows)
            parts, at = [], 0  # (where its frames go, frames, the decoder's table, their chunks in the array)
            for sr in band:
                for sc in range(nsc):
                    with phase("read_wait"):
                        got = next(read)
                    if got is None or not len(got[1]):
                        if got is not None:
                            slots.give(got[0])
                        continue
                    frames, chunks = got
                    table = np.stack([chunks[:, 2] + at, chunks[:, 3], sr * s0 - r0 + chunks[:, 0] * t0,
                                      sc * s1 + chunks[:, 1] * t1], axis=1)
                    parts.append((at, frames, table, chunks[:, :2] + (sr * (s0 // t0), sc * (s1 // t1))))
                    at += -(-len(frames) // dec.input_align) * dec.input_align  # (the next part aligned too)
            cells = out[r0:r1] if convert is None and out is not None else cp.empty((r1 - r0, cols), dtype)
            if sum(len(p[2]) for p in parts) < -(-(r1 - r0) // t0) * -(-cols // t1):  # chunks never stored: fill
                cells.fill(arr.fill_value)
            if parts:
                with phase("read_stage"):  # (from pinned memory, ~50 GB/s on the H100: queued, not waited for)
                    frames = cp.empty(at, cp.uint8)
                    for first, part, _, _ in parts:
                        frames[first : first + len(part)].set(part)
                with phase("read_decode"):  # (after the copies, on the same stream; done when it returns)
                    failed = dec.decode(frames, np.concatenate([p[2] for p in parts]), cells, (t0, t1))
                for _, part, _, _ in parts:
                    slots.give(part)
                if len(failed):  # (every frame's crc32c held: the decoder's failure, not the store's)
                    where = tuple(int(i) for i in np.concatenate([p[3] for p in parts])[failed[0]])
                    raise RuntimeError(f"nvCOMP did not decode chunk {where} of {arr.path}, whose crc32c holds")
            if convert is not None:
                with phase("read_decode"):
                    cells = convert[1](cells)
            if each is not None:
                each(r0, r1, cells)
            elif convert is not None:
                out[r0:r1] = cells
    return out if each is None else True


class PinnedSlots:
    """Pinned buffers lent out and given back, for :func:`read_device`'s shard frames (the reader threads
    take them, the decoding thread gives them back once their copy to the GPU is done): a buffer given
    back is lent again to the next shard it holds; a new one is made (:func:`empty_pinned`) when none
    free is large enough, a free one too small for it dropped then. At most the shards in flight are
    held: those read ahead and those of the band being decoded. ``allocate(nbytes)``: how a buffer is
    made (tests: plain NumPy)."""

    def __init__(self, allocate=None):
        import threading

        self.allocate = allocate or (lambda nbytes: empty_pinned(nbytes, np.uint8))
        self._free: list = []
        self._lent: dict = {}  # address -> the whole buffer
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A pinned uint8 buffer of ``nbytes`` (a view of a free buffer, or of a new one)."""
        with self._lock:  # (by index: list.remove would compare the arrays' cells)
            fits = [i for i, b in enumerate(self._free) if len(b) >= nbytes]
            buf = self._free.pop(min(fits, key=lambda i: len(self._free[i]))) if fits else None
            if buf is None and self._free:  # (none large enough: the smallest free one goes, for the new one)
                self._free.pop(min(range(len(self._free)), key=lambda i: len(self._free[i])))
        if buf is None:
            buf = self.allocate(max(nbytes + nbytes // 8, 1 << 20))  # (a little room: the next shard's frames)
        view = buf[:nbytes]
        with self._lock:
            self._lent[view.ctypes.data] = buf
        return view

    def give(self, view: np.ndarray) -> None:
        """Give back a buffer :meth:`take` lent (its copies done)."""
        with self._lock:
            buf = self._lent.pop(view.ctypes.data, None)
            if buf is not None:
                self._free.append(buf)


def host_bytes(store, itemsizes) -> int:
    """Host memory :func:`write_device` pins at most: two sets of a band of shard rows of each output
    (``itemsizes``: bytes a cell of each), raw (the CPU's encoders) or as frames with their headroom."""
    rows, cols = store.shape
    band = min(store.tile_size * store.shard_size, rows) * cols
    return 2 * max(sum(_headroom(band * size) for size in itemsizes), _headroom(band * sum(itemsizes)))


def _headroom(nbytes: int) -> int:
    """A frames buffer's size for ``nbytes``: a quarter more, in steps of up to 16 MiB (4 KiB for a small
    band), so that later bands, which compress a little worse or better, seldom pin a new one (each pinned
    allocation locks its pages anew)."""
    step = 1 << max(12, min(24, (nbytes // 4).bit_length()))
    return -(-(nbytes + nbytes // 4) // step) * step
